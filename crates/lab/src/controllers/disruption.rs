//! The disruption controller: the status of each PodDisruptionBudget as kube's computes it
//! (expected, healthy and desired pods, the disruptions allowed, and the DisruptionAllowed
//! condition), which the Eviction API reads to refuse evictions that would break a budget.
//! Observe and write in `reconcile`, decide in the pure functions below.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Pod, ReplicationController};
use k8s_openapi::api::policy::v1::{
    PodDisruptionBudget, PodDisruptionBudgetSpec, PodDisruptionBudgetStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    Condition, LabelSelector, OwnerReference, Time,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ListParams, PostParams};
use kube::core::{DynamicObject, GroupVersionKind, Selector, SelectorExt};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tandem_api::client::{is_conflict, is_not_found};

use super::availability::is_ready;
use super::context::Context;
use super::deployment::plan::{InvalidField, resolve};
use super::error::{Error, StepExt, drain, key, retry_after_error};
use super::owners::controller_of;

/// How long a pod the Eviction API admitted stays counted as disrupted while it has no
/// deletionTimestamp yet (kube's DeletionTimeout).
pub const DELETION_TIMEOUT: Duration = Duration::from_secs(120);
/// The condition kube reports on every budget.
pub const DISRUPTION_ALLOWED: &str = "DisruptionAllowed";

/// Runs the disruption controller until its watches end.
pub async fn run(client: Client) {
    let controller = Controller::new(
        Api::<PodDisruptionBudget>::all(client.clone()),
        watcher::Config::default(),
    );
    let store = controller.store();
    let in_namespace = move |ns: Option<String>| {
        let ns = ns.unwrap_or_default();
        store
            .state()
            .iter()
            .filter(|pdb| pdb.namespace().as_deref() == Some(ns.as_str()))
            .map(|pdb| ObjectRef::from_obj(pdb.as_ref()))
            .collect::<Vec<_>>()
    };
    // Budgets of the namespace are recomputed when a pod changes, and when a workload is
    // rescaled (its scale is the expected pod count of percentage budgets).
    let (pods, deployments, replicasets, statefulsets) = (
        in_namespace.clone(),
        in_namespace.clone(),
        in_namespace.clone(),
        in_namespace,
    );
    let controller = controller
        .watches(
            Api::<Pod>::all(client.clone()),
            watcher::Config::default(),
            move |o: Pod| pods(o.namespace()),
        )
        .watches(
            Api::<Deployment>::all(client.clone()),
            watcher::Config::default(),
            move |o: Deployment| deployments(o.namespace()),
        )
        .watches(
            Api::<ReplicaSet>::all(client.clone()),
            watcher::Config::default(),
            move |o: ReplicaSet| replicasets(o.namespace()),
        )
        .watches(
            Api::<StatefulSet>::all(client.clone()),
            watcher::Config::default(),
            move |o: StatefulSet| statefulsets(o.namespace()),
        );
    drain(
        "disruption",
        controller.run(
            reconcile,
            retry_after_error("disruption"),
            Arc::new(Context::new(client, "disruption-controller")),
        ),
    )
    .await;
}

/// Whether a policy/v1 budget selector selects `pod`: a missing selector selects nothing,
/// an empty one every pod of the namespace.
pub fn selects_pod(selector: Option<&LabelSelector>, pod: &Pod) -> bool {
    let Some(selector) = selector else {
        return false;
    };
    let Ok(selector) = Selector::try_from(selector.clone()) else {
        return false;
    };
    selector.matches(pod.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()))
}

/// Whether the expected pod count comes from the pods' controllers' scale (maxUnavailable,
/// or minAvailable as a percentage) rather than from the number of pods.
pub fn needs_scale(spec: &PodDisruptionBudgetSpec) -> bool {
    spec.max_unavailable.is_some() || matches!(spec.min_available, Some(IntOrString::String(_)))
}

/// kube's getExpectedPodCount: (expectedPods, desiredHealthy) from the spec, the number of
/// selected pods and the summed scale of their controllers (used when `needs_scale`).
/// Percentages round up, so minAvailable 50% of 3 is 2 and maxUnavailable 50% of 3 is 2.
pub fn expected_and_desired(
    spec: &PodDisruptionBudgetSpec,
    pods: usize,
    scale: i32,
) -> Result<(i32, i32), InvalidField> {
    let pods = i32::try_from(pods).unwrap_or(i32::MAX);
    if let Some(max) = &spec.max_unavailable {
        let max = resolve(Some(max), "0%", scale, true)
            .map_err(InvalidField::at("spec.maxUnavailable"))?;
        return Ok((scale, (scale - max).max(0)));
    }
    match &spec.min_available {
        Some(IntOrString::Int(min)) => Ok((pods, *min)),
        Some(min) => {
            let min = resolve(Some(min), "0%", scale, true)
                .map_err(InvalidField::at("spec.minAvailable"))?;
            Ok((scale, min))
        }
        None => Ok((0, 0)),
    }
}

/// kube's buildDisruptedPodMap: the disrupted pods still pending their deletion (those
/// gone, being deleted, or past DELETION_TIMEOUT are dropped), and when the next of them
/// times out.
pub fn pending_disruptions(
    recorded: Option<&BTreeMap<String, Time>>,
    pods: &[Pod],
    now: Timestamp,
) -> (BTreeMap<String, Time>, Option<Timestamp>) {
    let mut kept = BTreeMap::new();
    let mut recheck: Option<Timestamp> = None;
    let Some(recorded) = recorded else {
        return (kept, None);
    };
    let timeout = SignedDuration::try_from(DELETION_TIMEOUT).unwrap_or_default();
    for pod in pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
    {
        let name = pod.name_any();
        let Some(at) = recorded.get(&name) else {
            continue;
        };
        let expires = at.0 + timeout;
        if expires < now {
            tracing::info!(
                "pod {} was expected to be deleted but it wasn't",
                key(&pod.metadata)
            );
            continue;
        }
        recheck = Some(recheck.map_or(expires, |r| r.min(expires)));
        kept.insert(name, at.clone());
    }
    (kept, recheck)
}

/// kube's countHealthyPods: Ready pods neither being deleted nor pending a disruption.
pub fn current_healthy(pods: &[Pod], disrupted: &BTreeMap<String, Time>) -> i32 {
    let healthy = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| !disrupted.contains_key(&p.name_any()))
        .filter(|p| is_ready(p))
        .count();
    i32::try_from(healthy).unwrap_or(i32::MAX)
}

/// Sets `cond` among `conditions` as apimachinery's SetStatusCondition: the transition time
/// moves only when the status does.
fn set_condition(conditions: &mut Vec<Condition>, mut cond: Condition) {
    match conditions.iter_mut().find(|c| c.type_ == cond.type_) {
        Some(current) => {
            if current.status == cond.status {
                cond.last_transition_time = current.last_transition_time.clone();
            }
            *current = cond;
        }
        None => conditions.push(cond),
    }
}

/// The numbers a budget's status is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    /// Ready pods not being disrupted.
    pub current_healthy: i32,
    /// Pods that must stay healthy.
    pub desired_healthy: i32,
    /// Pods the budget expects.
    pub expected: i32,
}

/// kube's updatePdbStatus: disruptionsAllowed is currentHealthy - desiredHealthy, never
/// negative, and 0 while no pod is expected (a budget whose pods are still coming is safe);
/// the DisruptionAllowed condition says SufficientPods or InsufficientPods.
pub fn status_of(
    pdb: &PodDisruptionBudget,
    counts: Counts,
    disrupted: BTreeMap<String, Time>,
    now: Timestamp,
) -> PodDisruptionBudgetStatus {
    let mut allowed = counts.current_healthy - counts.desired_healthy;
    if counts.expected <= 0 || allowed <= 0 {
        allowed = 0;
    }
    let old = pdb.status.clone().unwrap_or_default();
    let mut conditions = old.conditions.unwrap_or_default();
    let (status, reason) = if allowed > 0 {
        ("True", "SufficientPods")
    } else {
        ("False", "InsufficientPods")
    };
    set_condition(
        &mut conditions,
        Condition {
            type_: DISRUPTION_ALLOWED.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            observed_generation: pdb.metadata.generation,
            last_transition_time: Time(now),
        },
    );
    PodDisruptionBudgetStatus {
        current_healthy: counts.current_healthy,
        desired_healthy: counts.desired_healthy,
        expected_pods: counts.expected,
        disruptions_allowed: allowed,
        disrupted_pods: (!disrupted.is_empty()).then_some(disrupted),
        observed_generation: pdb.metadata.generation,
        conditions: Some(conditions),
    }
}

/// kube's failSafe: when the status cannot be computed, no disruption is allowed, and the
/// condition says why (reason SyncFailed). The rest of the old status stays.
pub fn fail_safe(
    pdb: &PodDisruptionBudget,
    message: String,
    now: Timestamp,
) -> PodDisruptionBudgetStatus {
    let mut status = pdb.status.clone().unwrap_or_default();
    status.disruptions_allowed = 0;
    let mut conditions = status.conditions.take().unwrap_or_default();
    set_condition(
        &mut conditions,
        Condition {
            type_: DISRUPTION_ALLOWED.into(),
            status: "False".into(),
            reason: "SyncFailed".into(),
            message,
            observed_generation: status.observed_generation,
            last_transition_time: Time(now),
        },
    );
    status.conditions = Some(conditions);
    status
}

/// Whether writing `new` over `old` would change anything but condition timestamps.
fn same_status(old: Option<&PodDisruptionBudgetStatus>, new: &PodDisruptionBudgetStatus) -> bool {
    let strip = |s: &PodDisruptionBudgetStatus| {
        let mut s = s.clone();
        for c in s.conditions.iter_mut().flatten() {
            c.last_transition_time = Time(Timestamp::UNIX_EPOCH);
        }
        if s.disrupted_pods.as_ref().is_some_and(|d| d.is_empty()) {
            s.disrupted_pods = None;
        }
        serde_json::to_value(s).ok()
    };
    old.is_some_and(|old| strip(old) == strip(new))
}

async fn reconcile(pdb: Arc<PodDisruptionBudget>, ctx: Arc<Context>) -> Result<Action, Error> {
    let object = key(&pdb.metadata);
    let Some(ns) = pdb.namespace() else {
        return Ok(Action::await_change());
    };
    if pdb.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let now = Timestamp::now();
    let (status, recheck) = match compute(&ctx, &pdb, &ns, now).await {
        Ok(computed) => computed,
        Err(e) => {
            tracing::warn!("disruption controller: {e}");
            (fail_safe(&pdb, e.to_string(), now), None)
        }
    };
    if !same_status(pdb.status.as_ref(), &status) {
        // A full replace at the budget's resourceVersion, as kube's UpdateStatus: the
        // Eviction API writes this status too, and a stale write must not undo its
        // decrement (a conflict retries from the fresh budget).
        let mut updated = (*pdb).clone();
        updated.status = Some(status);
        match Api::<PodDisruptionBudget>::namespaced(ctx.client.clone(), &ns)
            .replace_status(&pdb.name_any(), &PostParams::default(), &updated)
            .await
        {
            Err(e) if is_conflict(&e) => return Ok(Action::requeue(Duration::from_millis(100))),
            other => {
                other.step(&object, "updating status")?;
            }
        }
    }
    Ok(match recheck {
        Some(at) => Action::requeue(
            Duration::try_from(at.duration_since(now)).unwrap_or_default()
                + Duration::from_millis(100),
        ),
        None => Action::await_change(),
    })
}

/// kube's trySync: the new status and when to look again for a disruption timing out.
async fn compute(
    ctx: &Context,
    pdb: &PodDisruptionBudget,
    ns: &str,
    now: Timestamp,
) -> Result<(PodDisruptionBudgetStatus, Option<Timestamp>), Error> {
    let object = key(&pdb.metadata);
    let spec = pdb.spec.clone().unwrap_or_default();
    let pods: Vec<Pod> = Api::<Pod>::namespaced(ctx.client.clone(), ns)
        .list(&ListParams::default())
        .await
        .step(&object, "listing pods")?
        .items
        .into_iter()
        .filter(|p| selects_pod(spec.selector.as_ref(), p))
        .collect();
    let scale = if needs_scale(&spec) {
        expected_scale(ctx, &object, ns, &pods).await?
    } else {
        0
    };
    let (expected, desired) =
        expected_and_desired(&spec, pods.len(), scale).map_err(|reason| Error::Invalid {
            object: object.clone(),
            reason: reason.to_string(),
        })?;
    let (disrupted, recheck) = pending_disruptions(
        pdb.status.as_ref().and_then(|s| s.disrupted_pods.as_ref()),
        &pods,
        now,
    );
    let counts = Counts {
        current_healthy: current_healthy(&pods, &disrupted),
        desired_healthy: desired,
        expected,
    };
    Ok((status_of(pdb, counts, disrupted, now), recheck))
}

/// kube's getExpectedScale: the summed scale of the pods' controllers, each counted once.
/// Pods without a controller are skipped (kube warns: the budget cannot account for them);
/// a controller whose scale cannot be found fails the sync.
async fn expected_scale(ctx: &Context, object: &str, ns: &str, pods: &[Pod]) -> Result<i32, Error> {
    // Controller uid of each pod -> (uid of the scaled workload, its replicas): a
    // Deployment's pods sit under several ReplicaSets and its scale counts once.
    let mut scales: HashMap<String, (String, i32)> = HashMap::new();
    let mut unmanaged = Vec::new();
    for pod in pods {
        let Some(owner) = controller_of(&pod.metadata) else {
            unmanaged.push(pod.name_any());
            continue;
        };
        if scales.contains_key(&owner.uid) {
            continue;
        }
        let Some(scaled) = scale_of(ctx, object, ns, owner).await? else {
            return Err(Error::Invalid {
                object: object.to_string(),
                reason: format!("found no controllers for pod {:?}", pod.name_any()),
            });
        };
        scales.insert(owner.uid.clone(), scaled);
    }
    if !unmanaged.is_empty() {
        tracing::info!(
            "poddisruptionbudget {object}: pods {unmanaged:?} have no controller; set an integer spec.minAvailable to account for them"
        );
    }
    let distinct: HashMap<String, i32> = scales.into_values().collect();
    Ok(distinct.values().sum())
}

/// The (uid, replicas) of the workload that scales a pod's controller: a Deployment for its
/// ReplicaSets, else the ReplicaSet, StatefulSet or ReplicationController itself, else any
/// resource with a scale subresource. None when the controller is gone.
async fn scale_of(
    ctx: &Context,
    object: &str,
    ns: &str,
    owner: &OwnerReference,
) -> Result<Option<(String, i32)>, Error> {
    let client = ctx.client.clone();
    let group = owner.api_version.split_once('/').map_or("", |(g, _)| g);
    let found = |uid: Option<String>, replicas: Option<i32>| {
        uid.filter(|u| *u == owner.uid)
            .map(|u| (u, replicas.unwrap_or(1)))
    };
    let get_err = |what: &str| format!("reading {what} {}", owner.name);
    match (group, owner.kind.as_str()) {
        ("apps" | "extensions", "ReplicaSet") => {
            let Some(rs) = Api::<ReplicaSet>::namespaced(client.clone(), ns)
                .get_opt(&owner.name)
                .await
                .step(object, get_err("replicaset"))?
            else {
                return Ok(None);
            };
            if rs.uid().as_deref() != Some(&owner.uid) {
                return Ok(None);
            }
            if let Some(deploy_ref) = controller_of(&rs.metadata).filter(|r| r.kind == "Deployment")
            {
                let deploy = Api::<Deployment>::namespaced(client, ns)
                    .get_opt(&deploy_ref.name)
                    .await
                    .step(object, get_err("deployment"))?;
                return Ok(deploy.and_then(|d| {
                    d.uid()
                        .filter(|u| *u == deploy_ref.uid)
                        .map(|u| (u, d.spec.and_then(|s| s.replicas).unwrap_or(1)))
                }));
            }
            Ok(found(rs.uid(), rs.spec.and_then(|s| s.replicas)))
        }
        ("apps", "StatefulSet") => {
            let ss = Api::<StatefulSet>::namespaced(client, ns)
                .get_opt(&owner.name)
                .await
                .step(object, get_err("statefulset"))?;
            Ok(ss.and_then(|s| found(s.uid(), s.spec.and_then(|s| s.replicas))))
        }
        ("", "ReplicationController") => {
            let rc = Api::<ReplicationController>::namespaced(client, ns)
                .get_opt(&owner.name)
                .await
                .step(object, get_err("replicationcontroller"))?;
            Ok(rc.and_then(|r| found(r.uid(), r.spec.and_then(|s| s.replicas))))
        }
        _ => {
            let (version, group) = match owner.api_version.split_once('/') {
                Some((g, v)) => (v, g),
                None => (owner.api_version.as_str(), ""),
            };
            let gvk = GroupVersionKind::gvk(group, version, &owner.kind);
            let (resource, caps) = kube::discovery::pinned_kind(&client, &gvk)
                .await
                .step(object, format!("discovering {}", owner.kind))?;
            if !caps.subresources.iter().any(|(r, _)| r.plural == "scale") {
                let gr = if group.is_empty() {
                    resource.plural.clone()
                } else {
                    format!("{}.{group}", resource.plural)
                };
                return Err(Error::Invalid {
                    object: object.to_string(),
                    reason: format!("{gr} does not implement the scale subresource"),
                });
            }
            let api = Api::<DynamicObject>::namespaced_with(client, ns, &resource);
            match api.get_scale(&owner.name).await {
                Ok(scale) => Ok(found(
                    scale.metadata.uid,
                    scale.spec.and_then(|s| s.replicas),
                )),
                Err(e) if is_not_found(&e) => Ok(None),
                Err(e) => Err(e).step(object, format!("reading the scale of {}", owner.name)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> PodDisruptionBudgetSpec {
        serde_json::from_value(v).unwrap()
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    fn pod(name: &str, ready: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"app": "db"}},
            "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
        }))
        .unwrap()
    }

    #[test]
    fn expected_and_desired_follow_kube_rounding() {
        // (what, spec, selected pods, controllers' scale, expected (expectedPods, desiredHealthy))
        let cases = [
            (
                "minAvailable int counts pods",
                json!({"minAvailable": 2}),
                3,
                5,
                (3, 2),
            ),
            (
                "minAvailable 50% of 3 rounds up",
                json!({"minAvailable": "50%"}),
                3,
                3,
                (3, 2),
            ),
            (
                "minAvailable % uses the scale, not the pods",
                json!({"minAvailable": "50%"}),
                2,
                4,
                (4, 2),
            ),
            (
                "minAvailable 100%",
                json!({"minAvailable": "100%"}),
                3,
                3,
                (3, 3),
            ),
            (
                "maxUnavailable int",
                json!({"maxUnavailable": 1}),
                3,
                3,
                (3, 2),
            ),
            (
                "maxUnavailable 50% of 3 rounds up",
                json!({"maxUnavailable": "50%"}),
                3,
                3,
                (3, 1),
            ),
            (
                "maxUnavailable 30% of 10",
                json!({"maxUnavailable": "30%"}),
                10,
                10,
                (10, 7),
            ),
            (
                "maxUnavailable beyond the scale",
                json!({"maxUnavailable": 5}),
                3,
                3,
                (3, 0),
            ),
            (
                "maxUnavailable 0",
                json!({"maxUnavailable": 0}),
                3,
                3,
                (3, 3),
            ),
        ];
        for (what, s, pods, scale, want) in cases {
            let s = spec(s);
            assert_eq!(expected_and_desired(&s, pods, scale), Ok(want), "{what}");
        }
        assert!(needs_scale(&spec(json!({"minAvailable": "50%"}))));
        assert!(needs_scale(&spec(json!({"maxUnavailable": 1}))));
        assert!(!needs_scale(&spec(json!({"minAvailable": 1}))));
        assert!(
            expected_and_desired(&spec(json!({"maxUnavailable": "half"})), 3, 3)
                .unwrap_err()
                .to_string()
                .contains("maxUnavailable")
        );
    }

    #[test]
    fn disruptions_allowed_and_the_condition() {
        let pdb = PodDisruptionBudget {
            metadata: ObjectMeta {
                generation: Some(3),
                ..Default::default()
            },
            ..Default::default()
        };
        let c = |current_healthy, desired_healthy, expected| Counts {
            current_healthy,
            desired_healthy,
            expected,
        };
        // (what, counts, expected disruptionsAllowed, condition status and reason)
        let cases = [
            ("one to spare", c(3, 2, 3), 1, ("True", "SufficientPods")),
            (
                "exactly at the budget",
                c(2, 2, 3),
                0,
                ("False", "InsufficientPods"),
            ),
            (
                "below the budget, never negative",
                c(1, 2, 3),
                0,
                ("False", "InsufficientPods"),
            ),
            (
                "nothing expected yet",
                c(2, 0, 0),
                0,
                ("False", "InsufficientPods"),
            ),
        ];
        for (what, counts, allowed, (status, reason)) in cases {
            let s = status_of(&pdb, counts, BTreeMap::new(), at(0));
            assert_eq!(s.disruptions_allowed, allowed, "{what}");
            assert_eq!(s.observed_generation, Some(3), "{what}");
            let cond = &s.conditions.as_ref().unwrap()[0];
            assert_eq!(
                (
                    cond.type_.as_str(),
                    cond.status.as_str(),
                    cond.reason.as_str()
                ),
                (DISRUPTION_ALLOWED, status, reason),
                "{what}"
            );
        }
        let failed = fail_safe(&pdb, "found no controllers for pod \"x\"".into(), at(0));
        assert_eq!(failed.disruptions_allowed, 0);
        let cond = &failed.conditions.as_ref().unwrap()[0];
        assert_eq!(
            (cond.status.as_str(), cond.reason.as_str()),
            ("False", "SyncFailed")
        );
        assert!(cond.message.contains("found no controllers"));
    }

    #[test]
    fn the_transition_time_moves_only_with_the_status() {
        let mut pdb = PodDisruptionBudget::default();
        let counts = Counts {
            current_healthy: 3,
            desired_healthy: 2,
            expected: 3,
        };
        pdb.status = Some(status_of(&pdb, counts, BTreeMap::new(), at(0)));
        let again = status_of(&pdb, counts, BTreeMap::new(), at(50));
        assert_eq!(
            again.conditions.as_ref().unwrap()[0].last_transition_time,
            Time(at(0))
        );
        assert!(same_status(pdb.status.as_ref(), &again), "nothing to write");
        let fewer = Counts {
            current_healthy: 2,
            ..counts
        };
        let changed = status_of(&pdb, fewer, BTreeMap::new(), at(60));
        assert_eq!(
            changed.conditions.as_ref().unwrap()[0].last_transition_time,
            Time(at(60))
        );
        assert!(!same_status(pdb.status.as_ref(), &changed));
    }

    #[test]
    fn disrupted_pods_count_as_unhealthy_until_deleted_or_timed_out() {
        let mut deleting = pod("c", true);
        deleting.metadata.deletion_timestamp = Some(Time(at(10)));
        let pods = vec![
            pod("a", true),
            pod("b", true),
            deleting,
            pod("d", false),
            pod("e", true),
        ];
        let recorded: BTreeMap<String, Time> = [
            ("a".to_string(), Time(at(0))),    // evicted, not yet deleted: pending
            ("b".to_string(), Time(at(-200))), // never deleted: timed out, healthy again
            ("c".to_string(), Time(at(0))),    // being deleted: dropped
            ("gone".to_string(), Time(at(0))), // no such pod: dropped
        ]
        .into();
        let (pending, recheck) = pending_disruptions(Some(&recorded), &pods, at(30));
        assert_eq!(pending.keys().collect::<Vec<_>>(), vec!["a"]);
        assert_eq!(
            recheck,
            Some(at(120)),
            "looks again when a's disruption times out"
        );
        // b and e are healthy; a is pending, c is being deleted, d is not Ready.
        assert_eq!(current_healthy(&pods, &pending), 2);
        assert_eq!(
            pending_disruptions(None, &pods, at(30)),
            (BTreeMap::new(), None)
        );
    }

    #[test]
    fn policy_v1_selectors() {
        let p = pod("a", true);
        assert!(!selects_pod(None, &p), "no selector: no pods");
        assert!(
            selects_pod(Some(&LabelSelector::default()), &p),
            "empty: every pod"
        );
        let other: LabelSelector =
            serde_json::from_value(json!({"matchLabels": {"app": "web"}})).unwrap();
        assert!(!selects_pod(Some(&other), &p));
    }
}
