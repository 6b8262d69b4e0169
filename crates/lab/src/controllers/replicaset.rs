//! The ReplicaSet controller: keeps `spec.replicas` active pods owned by each ReplicaSet,
//! adopting matching orphans, and reports what it sees in the status.

use std::cmp::Reverse;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetCondition, ReplicaSetStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tandem_api::client::is_not_found;

use super::availability::{Availability, availability, is_active, is_ready, ready_since};
use super::context::Context;
use super::error::{Error, StepExt, drain, key, retry_after_error};
use super::owners::{controller_of, pod_controllers, pod_from_template, selects};

/// At most this many pods are created or deleted in one reconcile (kube's burstReplicas).
const BURST: usize = 500;

/// Runs the ReplicaSet controller until its watches end.
pub async fn run(client: Client) {
    let controller = Controller::new(
        Api::<ReplicaSet>::all(client.clone()),
        watcher::Config::default(),
    );
    let store = controller.store();
    // One pod watch serves both owned pods and orphans a ReplicaSet may adopt.
    let controller = controller.watches(
        Api::<Pod>::all(client.clone()),
        watcher::Config::default(),
        move |pod: Pod| {
            pod_controllers(&store, &pod, |rs: &ReplicaSet| {
                rs.spec.as_ref().map(|s| &s.selector)
            })
        },
    );
    drain(
        "replicaset",
        controller.run(
            reconcile,
            retry_after_error("replicaset"),
            Arc::new(Context::new(client, "replicaset-controller")),
        ),
    )
    .await;
}

/// One pass over a ReplicaSet. Pods are listed from the API server rather than from a
/// watch cache, so the pods created or deleted by the previous pass are always seen: this
/// replaces kube's creation/deletion expectations (no burst can over-create), and the
/// controller never reconciles the same ReplicaSet twice at once.
async fn reconcile(rs: Arc<ReplicaSet>, ctx: Arc<Context>) -> Result<Action, Error> {
    let client = &ctx.client;
    let object = key(&rs.metadata);
    let (Some(ns), Some(uid), Some(spec)) = (rs.namespace(), rs.uid(), rs.spec.as_ref()) else {
        return Ok(Action::await_change());
    };
    if rs.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let pods_api = Api::<Pod>::namespaced(client.clone(), &ns);
    let listed = pods_api
        .list(&ListParams::default())
        .await
        .step(&object, "listing pods")?;
    let owner = rs
        .controller_owner_ref(&())
        .expect("ReplicaSet has a name and uid");

    let mut owned = Vec::new();
    for pod in listed.items {
        let matches = selects(&spec.selector, pod.metadata.labels.as_ref());
        match controller_of(&pod.metadata) {
            Some(r) if r.uid == uid && matches => owned.push(pod),
            Some(r) if r.uid == uid => {
                // The pod's labels changed: release it, as kube does.
                let refs: Vec<_> = pod
                    .owner_references()
                    .iter()
                    .filter(|r| r.uid != uid)
                    .cloned()
                    .collect();
                let name = pod.name_any();
                pods_api
                    .patch(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {
                            "ownerReferences": refs,
                            "resourceVersion": pod.metadata.resource_version,
                        }})),
                    )
                    .await
                    .or_else(|e| if is_not_found(&e) { Ok(pod) } else { Err(e) })
                    .step(&object, format!("releasing pod {name}"))?;
            }
            None if matches && is_active(&pod) => {
                let name = pod.name_any();
                let mut refs = pod.owner_references().to_vec();
                refs.push(owner.clone());
                // The resourceVersion makes this a compare-and-swap: of two controllers
                // racing for an orphan, one gets a conflict and looks again.
                let patch = json!({"metadata": {
                    "ownerReferences": refs,
                    "resourceVersion": pod.metadata.resource_version,
                }});
                match pods_api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                    .await
                {
                    Ok(adopted) => owned.push(adopted),
                    Err(e) if is_not_found(&e) => {}
                    Err(e) => return Err(e).step(&object, format!("adopting pod {name}")),
                }
            }
            _ => {}
        }
    }
    owned.retain(is_active);

    let want = usize::try_from(spec.replicas.unwrap_or(1).max(0)).unwrap_or(0);
    let mut failure: Option<kube::Error> = None;
    if owned.len() < want {
        let count = (want - owned.len()).min(BURST);
        let template = spec.template.clone().unwrap_or_default();
        let pod = pod_from_template(template, &rs.name_any(), &ns, owner.clone());
        // Slow start, as kube: a batch of 1, then 2, 4, ... so a template the API server
        // rejects costs one failed request, not hundreds.
        let mut created = 0;
        let mut batch = 1;
        while created < count && failure.is_none() {
            let n = batch.min(count - created);
            let params = PostParams::default();
            let results = join_all((0..n).map(|_| pods_api.create(&params, &pod))).await;
            for result in results {
                match result {
                    Ok(pod) => {
                        let note = format!("Created pod: {}", pod.name_any());
                        ctx.event(rs.as_ref(), "SuccessfulCreate", note).await;
                    }
                    Err(e) => failure = Some(e),
                }
            }
            created += n;
            batch *= 2;
        }
    } else if owned.len() > want {
        let surplus = (owned.len() - want).min(BURST);
        let mut victims: Vec<&Pod> = owned.iter().collect();
        victims.sort_by_key(|p| deletion_rank(p));
        let results = join_all(victims[..surplus].iter().map(|p| {
            let name = p.name_any();
            let api = pods_api.clone();
            async move { (api.delete(&name, &DeleteParams::default()).await, name) }
        }))
        .await;
        for (r, name) in results {
            match r {
                Err(e) if !is_not_found(&e) => {
                    return Err(e).step(&object, format!("deleting pod {name}"));
                }
                Err(_) => {}
                Ok(_) => {
                    let note = format!("Deleted pod: {name}");
                    ctx.event(rs.as_ref(), "SuccessfulDelete", note).await;
                }
            }
        }
    }

    let failed_create = failure.as_ref().map(|e| e.to_string());
    let (status, recheck) = status_of(&rs, &owned, failed_create, Timestamp::now());
    if !same_status(rs.status.as_ref(), &status) {
        Api::<ReplicaSet>::namespaced(client.clone(), &ns)
            .patch_status(
                &rs.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
            .step(&object, "updating status")?;
    }
    if let Some(e) = failure {
        return Err(e).step(&object, "creating pod");
    }
    Ok(match recheck {
        // A pod becomes available once minReadySeconds pass, with no event to say so.
        Some(after) => Action::requeue(after + Duration::from_millis(100)),
        None => Action::await_change(),
    })
}

/// The order kube deletes surplus pods in (first = deleted first): unscheduled before
/// scheduled, Pending before Unknown before Running, not Ready before Ready, Ready for less
/// time first, more restarts first, newer first.
pub fn deletion_rank(pod: &Pod) -> impl Ord {
    let status = pod.status.as_ref();
    let assigned = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_ref())
        .is_some();
    let phase = match status.and_then(|s| s.phase.as_deref()) {
        Some("Pending") | None => 0,
        Some("Unknown") => 1,
        Some("Running") => 2,
        Some(_) => 3,
    };
    let ready_at = ready_since(pod);
    let restarts = status
        .and_then(|s| s.container_statuses.as_ref())
        .map(|cs| cs.iter().map(|c| c.restart_count).max().unwrap_or(0))
        .unwrap_or(0);
    let created: Option<Timestamp> = pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
    (
        assigned,
        phase,
        ready_at.is_some(),
        Reverse(ready_at.flatten()),
        Reverse(restarts),
        Reverse(created),
    )
}

/// The status a ReplicaSet should report for its active owned pods at `now`, and when to
/// look again because a Ready pod will become available. `failed_create` is why the last
/// pod creation failed: it shows as the ReplicaFailure condition (reason FailedCreate), as
/// kube reports quota or admission refusals.
pub fn status_of(
    rs: &ReplicaSet,
    pods: &[Pod],
    failed_create: Option<String>,
    now: Timestamp,
) -> (ReplicaSetStatus, Option<Duration>) {
    let spec = rs.spec.as_ref();
    let min_ready = spec.and_then(|s| s.min_ready_seconds).unwrap_or(0);
    let template_labels = spec
        .and_then(|s| s.template.as_ref())
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let mut status = ReplicaSetStatus {
        observed_generation: rs.metadata.generation,
        conditions: {
            let mut conditions: Vec<ReplicaSetCondition> = rs
                .status
                .as_ref()
                .and_then(|s| s.conditions.clone())
                .unwrap_or_default();
            conditions.retain(|c| c.type_ != "ReplicaFailure");
            if let Some(message) = failed_create {
                conditions.push(ReplicaSetCondition {
                    type_: "ReplicaFailure".into(),
                    status: "True".into(),
                    reason: Some("FailedCreate".into()),
                    message: Some(message),
                    last_transition_time: Some(Time(now)),
                });
            }
            (!conditions.is_empty()).then_some(conditions)
        },
        ..Default::default()
    };
    let (mut ready, mut available, mut labeled) = (0, 0, 0);
    let mut recheck: Option<Duration> = None;
    for pod in pods {
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        if template_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
        {
            labeled += 1;
        }
        if is_ready(pod) {
            ready += 1;
        }
        match availability(pod, min_ready, now) {
            Availability::Available => available += 1,
            Availability::ReadyFor(d) => recheck = Some(recheck.map_or(d, |r| r.min(d))),
            Availability::Unavailable => {}
        }
    }
    status.replicas = i32::try_from(pods.len()).unwrap_or(i32::MAX);
    status.ready_replicas = Some(ready);
    status.available_replicas = Some(available);
    status.fully_labeled_replicas = Some(labeled);
    (status, recheck)
}

fn same_status(old: Option<&ReplicaSetStatus>, new: &ReplicaSetStatus) -> bool {
    let Some(old) = old else { return false };
    old.replicas == new.replicas
        && old.ready_replicas.unwrap_or(0) == new.ready_replicas.unwrap_or(0)
        && old.available_replicas.unwrap_or(0) == new.available_replicas.unwrap_or(0)
        && old.fully_labeled_replicas.unwrap_or(0) == new.fully_labeled_replicas.unwrap_or(0)
        && old.observed_generation == new.observed_generation
        && conditions_key(old) == conditions_key(new)
}

fn conditions_key(status: &ReplicaSetStatus) -> Vec<(String, String, Option<String>)> {
    let conditions = status.conditions.as_deref().unwrap_or_default();
    conditions
        .iter()
        .map(|c| (c.type_.clone(), c.status.clone(), c.message.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerStatus, PodCondition, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    /// A pod fixture: `PodFixture::new("a").on_node().running().ready_at(t)`.
    pub(crate) struct PodFixture(pub Pod);

    impl PodFixture {
        pub(crate) fn new(name: &str) -> Self {
            PodFixture(Pod {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    creation_timestamp: Some(Time(at(0))),
                    ..Default::default()
                },
                spec: Some(PodSpec::default()),
                status: Some(PodStatus {
                    phase: Some("Pending".into()),
                    ..Default::default()
                }),
            })
        }
        pub(crate) fn on_node(mut self) -> Self {
            self.0.spec.as_mut().unwrap().node_name = Some("n1".into());
            self
        }
        pub(crate) fn running(mut self) -> Self {
            self.0.status.as_mut().unwrap().phase = Some("Running".into());
            self
        }
        pub(crate) fn ready_at(mut self, secs: i64) -> Self {
            self.0.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                last_transition_time: Some(Time(at(secs))),
                ..Default::default()
            }]);
            self
        }
        pub(crate) fn created_at(mut self, secs: i64) -> Self {
            self.0.metadata.creation_timestamp = Some(Time(at(secs)));
            self
        }
        pub(crate) fn restarts(mut self, n: i32) -> Self {
            self.0.status.as_mut().unwrap().container_statuses = Some(vec![ContainerStatus {
                restart_count: n,
                ..Default::default()
            }]);
            self
        }
    }

    pub(crate) fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    #[test]
    fn surplus_pods_are_deleted_in_kube_order() {
        // (first, second): `first` must be deleted before `second`.
        let cases = [
            (
                "unscheduled before scheduled",
                PodFixture::new("a"),
                PodFixture::new("b").on_node(),
            ),
            (
                "pending before running",
                PodFixture::new("a").on_node(),
                PodFixture::new("b").on_node().running(),
            ),
            (
                "not ready before ready",
                PodFixture::new("a").on_node().running(),
                PodFixture::new("b").on_node().running().ready_at(0),
            ),
            (
                "ready for less time first",
                PodFixture::new("a").on_node().running().ready_at(50),
                PodFixture::new("b").on_node().running().ready_at(10),
            ),
            (
                "more restarts first",
                PodFixture::new("a").on_node().running().restarts(3),
                PodFixture::new("b").on_node().running().restarts(1),
            ),
            (
                "newer first",
                PodFixture::new("a").created_at(20),
                PodFixture::new("b").created_at(10),
            ),
        ];
        for (what, first, second) in cases {
            assert!(deletion_rank(&first.0) < deletion_rank(&second.0), "{what}");
            assert!(deletion_rank(&second.0) > deletion_rank(&first.0), "{what}");
        }
    }

    #[test]
    fn status_counts_ready_available_and_labeled_pods() {
        let rs = ReplicaSet {
            metadata: ObjectMeta {
                generation: Some(4),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::apps::v1::ReplicaSetSpec {
                min_ready_seconds: Some(30),
                template: Some(k8s_openapi::api::core::v1::PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some([("app".to_string(), "web".to_string())].into()),
                        ..Default::default()
                    }),
                    spec: None,
                }),
                ..Default::default()
            }),
            status: None,
        };
        let mut labeled = PodFixture::new("a").running().ready_at(0).0;
        labeled.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
        let pods = [
            labeled,                                       // ready 100 s: available
            PodFixture::new("b").running().ready_at(90).0, // ready 10 s: not yet
            PodFixture::new("c").running().0,              // not ready
        ];
        let (status, recheck) = status_of(&rs, &pods, None, at(100));
        assert_eq!(status.conditions, None);
        assert_eq!(status.replicas, 3);
        assert_eq!(status.ready_replicas, Some(2));
        assert_eq!(status.available_replicas, Some(1));
        assert_eq!(status.fully_labeled_replicas, Some(1));
        assert_eq!(status.observed_generation, Some(4));
        assert_eq!(recheck, Some(Duration::from_secs(20)));
    }

    #[test]
    fn failed_creations_show_as_replica_failure_until_one_succeeds() {
        let mut rs = ReplicaSet::default();
        let (failing, _) = status_of(
            &rs,
            &[],
            Some("pods \"web-x\" is forbidden: exceeded quota".into()),
            at(0),
        );
        let conditions = failing.conditions.clone().unwrap();
        assert_eq!(conditions.len(), 1);
        assert_eq!(
            (
                conditions[0].type_.as_str(),
                conditions[0].status.as_str(),
                conditions[0].reason.as_deref()
            ),
            ("ReplicaFailure", "True", Some("FailedCreate"))
        );
        assert!(
            conditions[0]
                .message
                .as_deref()
                .unwrap()
                .contains("exceeded quota")
        );
        assert!(
            !same_status(Some(&ReplicaSetStatus::default()), &failing),
            "a new failure is written"
        );
        rs.status = Some(failing);
        let (recovered, _) = status_of(&rs, &[], None, at(1));
        assert_eq!(
            recovered.conditions, None,
            "the condition goes once creation works"
        );
    }
}
