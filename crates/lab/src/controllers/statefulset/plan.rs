//! What a StatefulSet needs next, decided from what is observed (`stateful_set_control.go`'s
//! `updateStatefulSet`): pods `<set>-<ordinal>` and their claims, created in ordinal order and
//! deleted in reverse, one at a time under OrderedReady (each waits for its predecessors to be
//! Running and Ready) or all at once under Parallel; rolling updates from the highest ordinal
//! down to the partition; claim owner references that implement the retention policy.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec, StatefulSetStatus};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, Pod, PodTemplateSpec, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;

use crate::controllers::availability::{Availability, availability, is_ready};
use crate::controllers::history::POD_REVISION_LABEL;

/// Label holding a StatefulSet pod's own name.
pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
/// Label holding a StatefulSet pod's ordinal.
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";

/// A revision of the set: its name and the pod template it holds.
#[derive(Clone, Copy, Debug)]
pub struct Revision<'a> {
    /// The ControllerRevision's name (pods carry it in `controller-revision-hash`).
    pub name: &'a str,
    /// The pod template of that revision.
    pub template: &'a PodTemplateSpec,
}

/// What the controller observed for one StatefulSet.
pub struct Observed<'a> {
    /// The set.
    pub set: &'a StatefulSet,
    /// The pods it controls.
    pub pods: &'a [Pod],
    /// The namespace's claims, by name.
    pub claims: &'a BTreeMap<String, PersistentVolumeClaim>,
    /// The revision most pods are at.
    pub current: Revision<'a>,
    /// The revision of the set's template now.
    pub update: Revision<'a>,
    /// The set's collisionCount after revisions were written.
    pub collision_count: i32,
    /// The time availability is judged at.
    pub now: Timestamp,
}

/// One thing to do, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Create this claim (before its pod).
    CreateClaim(Box<PersistentVolumeClaim>),
    /// Create this pod.
    CreatePod(Box<Pod>),
    /// Delete the pod of this name.
    DeletePod(String),
    /// Replace the claim's owner references (the retention policy changed or the pod was
    /// scaled away).
    SetClaimOwners {
        /// The claim.
        claim: String,
        /// Its owner references from now on.
        owners: Vec<OwnerReference>,
    },
}

/// The decision for one pass.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// What to do, in order.
    pub steps: Vec<Step>,
    /// The status to report.
    pub status: StatefulSetStatus,
    /// When to look again without an event (a pod becomes available after minReadySeconds).
    pub recheck: Option<Duration>,
}

/// The parent name and ordinal encoded in a pod name `<parent>-<ordinal>`.
pub fn parent_and_ordinal(pod_name: &str) -> Option<(&str, i32)> {
    let (parent, ordinal) = pod_name.rsplit_once('-')?;
    if ordinal.is_empty() || !ordinal.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((parent, ordinal.parse().ok()?))
}

/// The ordinal of `pod` if it is a member of the set named `set`.
pub fn ordinal_of(set: &str, pod: &Pod) -> Option<i32> {
    let (parent, ordinal) = parent_and_ordinal(pod.metadata.name.as_deref()?)?;
    (parent == set).then_some(ordinal)
}

/// `<template>-<set>-<ordinal>`: the claim of one pod for one volumeClaimTemplate.
pub fn claim_name(template: &str, set: &str, ordinal: i32) -> String {
    format!("{template}-{set}-{ordinal}")
}

fn spec(set: &StatefulSet) -> StatefulSetSpec {
    set.spec.clone().unwrap_or_default()
}

fn name(set: &StatefulSet) -> &str {
    set.metadata.name.as_deref().unwrap_or("")
}

fn start_ordinal(spec: &StatefulSetSpec) -> i32 {
    spec.ordinals.as_ref().and_then(|o| o.start).unwrap_or(0)
}

/// The controller reference a set puts on what it owns.
pub fn set_owner(set: &StatefulSet) -> OwnerReference {
    OwnerReference {
        api_version: "apps/v1".into(),
        kind: "StatefulSet".into(),
        name: name(set).to_string(),
        uid: set.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn pod_owner(pod: &Pod) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// `(whenDeleted, whenScaled)` of the retention policy: true means Delete.
fn retention(spec: &StatefulSetSpec) -> (bool, bool) {
    let policy = spec.persistent_volume_claim_retention_policy.as_ref();
    let delete = |v: Option<&String>| v.map(String::as_str) == Some("Delete");
    (
        delete(policy.and_then(|p| p.when_deleted.as_ref())),
        delete(policy.and_then(|p| p.when_scaled.as_ref())),
    )
}

/// The claims of ordinal `ordinal`, as `getPersistentVolumeClaims` builds them: the template
/// renamed, in the set's namespace, labelled with the selector's labels, owned as the
/// retention policy says for a pod in range.
pub fn claims_of(set: &StatefulSet, ordinal: i32) -> Vec<PersistentVolumeClaim> {
    let spec = spec(set);
    let selector_labels = spec.selector.match_labels.clone().unwrap_or_default();
    let (when_deleted, _) = retention(&spec);
    spec.volume_claim_templates
        .iter()
        .flatten()
        .map(|template| {
            let mut claim = template.clone();
            let template_name = template.metadata.name.clone().unwrap_or_default();
            let mut labels = claim.metadata.labels.take().unwrap_or_default();
            labels.extend(selector_labels.clone());
            claim.metadata = ObjectMeta {
                name: Some(claim_name(&template_name, name(set), ordinal)),
                namespace: set.metadata.namespace.clone(),
                labels: Some(labels),
                annotations: claim.metadata.annotations.take(),
                owner_references: when_deleted.then(|| vec![set_owner(set)]),
                ..Default::default()
            };
            claim.status = None;
            claim
        })
        .collect()
}

/// The pod of `ordinal` made from `revision` (`newVersionedStatefulSetPod` after the choice of
/// revision): identity labels, hostname and subdomain, and a volume per claim template.
pub fn new_pod(set: &StatefulSet, revision: Revision<'_>, ordinal: i32) -> Pod {
    let spec = spec(set);
    let pod_name = format!("{}-{ordinal}", name(set));
    let template = revision.template.clone();
    let meta = template.metadata.unwrap_or_default();
    let mut labels = meta.labels.unwrap_or_default();
    labels.insert(POD_NAME_LABEL.into(), pod_name.clone());
    labels.insert(POD_INDEX_LABEL.into(), ordinal.to_string());
    labels.insert(POD_REVISION_LABEL.into(), revision.name.to_string());
    let mut pod_spec = template.spec.unwrap_or_default();
    pod_spec.hostname = Some(pod_name.clone());
    pod_spec.subdomain =
        Some(spec.service_name.clone().unwrap_or_default()).filter(|s| !s.is_empty());
    let claims: Vec<(String, String)> = spec
        .volume_claim_templates
        .iter()
        .flatten()
        .map(|t| {
            let template_name = t.metadata.name.clone().unwrap_or_default();
            let claim = claim_name(&template_name, name(set), ordinal);
            (template_name, claim)
        })
        .collect();
    let mut volumes: Vec<Volume> = claims
        .iter()
        .map(|(volume, claim)| Volume {
            name: volume.clone(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.clone(),
                read_only: None,
            }),
            ..Default::default()
        })
        .collect();
    volumes.extend(
        pod_spec
            .volumes
            .take()
            .into_iter()
            .flatten()
            .filter(|v| !claims.iter().any(|(n, _)| *n == v.name)),
    );
    pod_spec.volumes = (!volumes.is_empty()).then_some(volumes);
    Pod {
        metadata: ObjectMeta {
            name: Some(pod_name),
            namespace: set.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: meta.annotations,
            finalizers: meta.finalizers,
            owner_references: Some(vec![set_owner(set)]),
            ..Default::default()
        },
        spec: Some(pod_spec),
        status: None,
    }
}

/// The owner references `claim` should have under the retention policy (`isClaimOwnerUpToDate`
/// and `updateClaimOwnerRefForSetAndPod`), or None if it has them already or must not be
/// touched (a reference to an earlier set or pod of the same name: the garbage collector's
/// business; another controller: left alone).
pub fn claim_owners(
    claim: &PersistentVolumeClaim,
    set: &StatefulSet,
    pod: Option<&Pod>,
    scaled_down: bool,
) -> Option<Vec<OwnerReference>> {
    let (when_deleted, when_scaled) = retention(&spec(set));
    let set_ref = set_owner(set);
    let pod_ref = pod.map(pod_owner);
    let current = claim.metadata.owner_references.clone().unwrap_or_default();
    let is_set = |r: &OwnerReference| r.kind == "StatefulSet" && r.name == set_ref.name;
    let is_pod =
        |r: &OwnerReference| r.kind == "Pod" && pod_ref.as_ref().is_some_and(|p| r.name == p.name);
    let stale = current.iter().any(|r| {
        (is_set(r) && r.uid != set_ref.uid)
            || (is_pod(r) && pod_ref.as_ref().is_some_and(|p| r.uid != p.uid))
    });
    if stale {
        return None;
    }
    let mut desired: Vec<OwnerReference> = current
        .iter()
        .filter(|r| !is_set(r) && !is_pod(r))
        .cloned()
        .collect();
    let other_controller = desired.iter().any(|r| r.controller == Some(true));
    if !(other_controller && (when_deleted || when_scaled)) {
        if when_deleted && !(when_scaled && scaled_down) {
            desired.push(set_ref.clone());
        }
        if when_scaled
            && scaled_down
            && let Some(p) = &pod_ref
        {
            desired.push(p.clone());
        }
    }
    let key = |refs: &[OwnerReference]| {
        let mut k: Vec<(String, Option<bool>)> =
            refs.iter().map(|r| (r.uid.clone(), r.controller)).collect();
        k.sort();
        k
    };
    (key(&desired) != key(&current)).then_some(desired)
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

fn running_and_ready(pod: &Pod) -> bool {
    phase(pod) == "Running" && is_ready(pod)
}

fn revision_of(pod: &Pod) -> &str {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(POD_REVISION_LABEL))
        .map(String::as_str)
        .unwrap_or("")
}

/// Decides the next steps and the status for one StatefulSet.
pub fn plan(o: &Observed<'_>) -> Plan {
    let set = o.set;
    let spec = spec(set);
    let set_name = name(set);
    let start = start_ordinal(&spec);
    let count = spec.replicas.unwrap_or(1).max(0);
    let min_ready = spec.min_ready_seconds.unwrap_or(0);
    let monotonic = spec.pod_management_policy.as_deref() != Some("Parallel");
    let strategy = spec.update_strategy.clone().unwrap_or_default();
    let on_delete = strategy.type_.as_deref() == Some("OnDelete");
    let rolling = strategy.rolling_update.as_ref();
    let partition = rolling.and_then(|r| r.partition).unwrap_or(0);
    let mut recheck: Option<Duration> = None;
    let mut available = |pod: &Pod| match availability(pod, min_ready, o.now) {
        Availability::Available => phase(pod) == "Running",
        Availability::ReadyFor(d) => {
            recheck = Some(recheck.map_or(d, |r| r.min(d)));
            false
        }
        Availability::Unavailable => false,
    };

    // Pods in range by index (ordinal - start), the others condemned, highest ordinal first.
    let mut replicas: Vec<Option<&Pod>> = vec![None; usize::try_from(count).unwrap_or(0)];
    let mut condemned: Vec<(i32, &Pod)> = Vec::new();
    for pod in o.pods {
        let Some(ordinal) = ordinal_of(set_name, pod) else {
            continue;
        };
        if (start..start + count).contains(&ordinal) {
            replicas[(ordinal - start) as usize] = Some(pod);
        } else {
            condemned.push((ordinal, pod));
        }
    }
    condemned.sort_by_key(|(ordinal, _)| std::cmp::Reverse(*ordinal));
    let mut status = status_of(o, min_ready);
    complete_rolling_update(&spec, &mut status);
    // Judge availability once per pod (it also collects when to look again).
    let replica_available: Vec<bool> = replicas
        .iter()
        .map(|p| p.is_some_and(&mut available))
        .collect();
    let condemned_available: Vec<bool> = condemned.iter().map(|(_, p)| available(p)).collect();
    let first_unavailable: Option<&str> = replicas
        .iter()
        .zip(&replica_available)
        .find(|(_, ok)| !**ok)
        .map(|(p, _)| p.and_then(|p| p.metadata.name.as_deref()).unwrap_or(""))
        .or_else(|| {
            condemned
                .iter()
                .zip(&condemned_available)
                .rev()
                .find(|(_, ok)| !**ok)
                .and_then(|((_, p), _)| p.metadata.name.as_deref())
        });

    let mut steps = Vec::new();
    let done = |steps: Vec<Step>, status: StatefulSetStatus, recheck| Plan {
        steps,
        status,
        recheck,
    };
    if set.metadata.deletion_timestamp.is_some() {
        return done(steps, status, recheck);
    }

    // Existing claims of an ordinal that need creating, or None while one is being deleted
    // (the pod waits for it to go, then gets a fresh one: `PodClaimIsStale`).
    let missing_claims = |ordinal: i32| -> Option<Vec<Step>> {
        let mut out = Vec::new();
        for claim in claims_of(set, ordinal) {
            let claim_name = claim.metadata.name.clone().unwrap_or_default();
            match o.claims.get(&claim_name) {
                Some(existing) if existing.metadata.deletion_timestamp.is_some() => return None,
                Some(_) => {}
                None => out.push(Step::CreateClaim(Box::new(claim))),
            }
        }
        Some(out)
    };
    let fix_claims = |ordinal: i32, pod: Option<&Pod>, scaled_down: bool| -> Vec<Step> {
        claims_of(set, ordinal)
            .into_iter()
            .filter_map(|c| {
                let claim_name = c.metadata.name.unwrap_or_default();
                let existing = o.claims.get(&claim_name)?;
                let owners = claim_owners(existing, set, pod, scaled_down)?;
                Some(Step::SetClaimOwners {
                    claim: claim_name,
                    owners,
                })
            })
            .collect()
    };

    // Replicas in ordinal order.
    for (i, pod) in replicas.iter().enumerate() {
        let ordinal = start + i as i32;
        let Some(pod) = pod else {
            let Some(claims) = missing_claims(ordinal) else {
                if monotonic {
                    return done(steps, status, recheck);
                }
                continue;
            };
            steps.extend(claims);
            // Below the partition (or the current replicas of a rolling update without one),
            // a recreated pod keeps the current revision.
            let below = if strategy.type_.as_deref() != Some("OnDelete") && rolling.is_none() {
                ordinal < start + status.current_replicas.unwrap_or(0)
            } else {
                rolling.is_some() && ordinal < start + partition
            };
            let revision = if below { o.current } else { o.update };
            steps.push(Step::CreatePod(Box::new(new_pod(set, revision, ordinal))));
            if monotonic {
                return done(steps, status, recheck);
            }
            continue;
        };
        if matches!(phase(pod), "Failed" | "Succeeded") {
            if !terminating(pod) {
                steps.push(Step::DeletePod(
                    pod.metadata.name.clone().unwrap_or_default(),
                ));
            }
            if monotonic {
                return done(steps, status, recheck);
            }
            continue;
        }
        if phase(pod) == "Pending"
            && let Some(claims) = missing_claims(ordinal)
        {
            steps.extend(claims);
        }
        if monotonic && (terminating(pod) || !running_and_ready(pod) || !replica_available[i]) {
            return done(steps, status, recheck);
        }
        steps.extend(fix_claims(ordinal, Some(pod), false));
    }

    // Condemned pods: their claims first get the owners the policy wants for scaled-down pods.
    for (ordinal, pod) in &condemned {
        steps.extend(fix_claims(*ordinal, Some(pod), true));
    }
    for (j, (_, pod)) in condemned.iter().enumerate() {
        let pod_name = pod.metadata.name.as_deref().unwrap_or("");
        if terminating(pod) {
            if monotonic {
                return done(steps, status, recheck);
            }
            continue;
        }
        let first = first_unavailable == Some(pod_name);
        if monotonic && !first && (!running_and_ready(pod) || !condemned_available[j]) {
            return done(steps, status, recheck);
        }
        steps.push(Step::DeletePod(pod_name.to_string()));
        if monotonic {
            return done(steps, status, recheck);
        }
    }

    if on_delete {
        return done(steps, status, recheck);
    }
    // Rolling update: the highest ordinal not at the update revision goes first, down to the
    // partition; wait while the one updated last is not available again.
    let lowest = usize::try_from(partition).unwrap_or(0);
    for target in (lowest..replicas.len()).rev() {
        let Some(pod) = replicas[target] else {
            return done(steps, status, recheck);
        };
        if revision_of(pod) != o.update.name && !terminating(pod) {
            steps.push(Step::DeletePod(
                pod.metadata.name.clone().unwrap_or_default(),
            ));
            return done(steps, status, recheck);
        }
        if !replica_available[target] {
            return done(steps, status, recheck);
        }
    }
    done(steps, status, recheck)
}

/// The counts of `updateStatus` over every pod the set owns.
fn status_of(o: &Observed<'_>, min_ready: i32) -> StatefulSetStatus {
    let mut status = StatefulSetStatus {
        observed_generation: o.set.metadata.generation,
        current_revision: Some(o.current.name.to_string()),
        update_revision: Some(o.update.name.to_string()),
        collision_count: Some(o.collision_count),
        ..Default::default()
    };
    let (mut replicas, mut ready, mut avail, mut current, mut updated) = (0, 0, 0, 0, 0);
    for pod in o.pods {
        if ordinal_of(name(o.set), pod).is_none() {
            continue;
        }
        replicas += 1;
        if running_and_ready(pod) {
            ready += 1;
            if availability(pod, min_ready, o.now) == Availability::Available {
                avail += 1;
            }
        }
        if !terminating(pod) {
            let revision = revision_of(pod);
            if revision == o.current.name {
                current += 1;
            }
            if revision == o.update.name {
                updated += 1;
            }
        }
    }
    status.replicas = replicas;
    status.ready_replicas = Some(ready);
    status.available_replicas = Some(avail);
    status.current_replicas = Some(current);
    status.updated_replicas = Some(updated);
    status
}

/// `completeRollingUpdate`: once every replica runs the update revision and is Ready, the
/// update revision becomes the current one.
fn complete_rolling_update(spec: &StatefulSetSpec, status: &mut StatefulSetStatus) {
    let rolling = spec
        .update_strategy
        .as_ref()
        .and_then(|s| s.type_.as_deref())
        .is_none_or(|t| t == "RollingUpdate");
    let want = spec.replicas.unwrap_or(1);
    if rolling
        && status.updated_replicas == Some(want)
        && status.ready_replicas == Some(want)
        && status.replicas == want
    {
        status.current_replicas = status.updated_replicas;
        status.current_revision = status.update_revision.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::{Value, json};

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    /// A StatefulSet `db` under construction.
    struct SetFixture(Value);

    impl SetFixture {
        fn new(replicas: i32) -> Self {
            SetFixture(json!({
                "metadata": {"name": "db", "namespace": "ns", "uid": "set-uid", "generation": 2},
                "spec": {
                    "replicas": replicas,
                    "serviceName": "db",
                    "selector": {"matchLabels": {"app": "db"}},
                    "podManagementPolicy": "OrderedReady",
                    "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}},
                    "template": {"metadata": {"labels": {"app": "db"}},
                                 "spec": {"containers": [{"name": "db", "image": "pg"}]}},
                },
            }))
        }
        fn parallel(mut self) -> Self {
            self.0["spec"]["podManagementPolicy"] = json!("Parallel");
            self
        }
        fn partition(mut self, p: i32) -> Self {
            self.0["spec"]["updateStrategy"]["rollingUpdate"]["partition"] = json!(p);
            self
        }
        fn on_delete(mut self) -> Self {
            self.0["spec"]["updateStrategy"] = json!({"type": "OnDelete"});
            self
        }
        fn start(mut self, start: i32) -> Self {
            self.0["spec"]["ordinals"] = json!({"start": start});
            self
        }
        fn claims(mut self) -> Self {
            self.0["spec"]["volumeClaimTemplates"] = json!([{"metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "standard",
                         "resources": {"requests": {"storage": "1Gi"}}}}]);
            self
        }
        fn retention(mut self, when_deleted: &str, when_scaled: &str) -> Self {
            self.0["spec"]["persistentVolumeClaimRetentionPolicy"] =
                json!({"whenDeleted": when_deleted, "whenScaled": when_scaled});
            self
        }
        fn build(self) -> StatefulSet {
            serde_json::from_value(self.0).expect("valid set fixture")
        }
    }

    /// A pod `db-<ordinal>` at a revision: `PodFixture::new(0, "r1").ready()`.
    struct PodFixture(Pod);

    impl PodFixture {
        fn new(ordinal: i32, revision: &str) -> Self {
            let mut pod = new_pod(
                &SetFixture::new(1).build(),
                Revision {
                    name: revision,
                    template: &PodTemplateSpec::default(),
                },
                ordinal,
            );
            pod.metadata.uid = Some(format!("pod-{ordinal}"));
            pod.status = Some(PodStatus {
                phase: Some("Pending".into()),
                ..Default::default()
            });
            PodFixture(pod)
        }
        fn running(mut self) -> Self {
            self.0.status.as_mut().unwrap().phase = Some("Running".into());
            self
        }
        fn ready(mut self) -> Self {
            self = self.running();
            self.0.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                last_transition_time: Some(Time(at(0))),
                ..Default::default()
            }]);
            self
        }
        fn phase(mut self, phase: &str) -> Self {
            self.0.status.as_mut().unwrap().phase = Some(phase.into());
            self
        }
        fn terminating(mut self) -> Self {
            self.0.metadata.deletion_timestamp = Some(Time(at(5)));
            self
        }
    }

    fn claim(name: &str, deleting: bool, owners: Value) -> (String, PersistentVolumeClaim) {
        let mut c: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "ownerReferences": owners},
            "spec": {},
        }))
        .unwrap();
        if deleting {
            c.metadata.deletion_timestamp = Some(Time(at(5)));
        }
        (name.to_string(), c)
    }

    /// Steps as short words: `claim data-db-0`, `create db-0@r2`, `delete db-2`,
    /// `owners data-db-2=Pod/db-2`.
    fn words(steps: &[Step]) -> Vec<String> {
        steps
            .iter()
            .map(|s| match s {
                Step::CreateClaim(c) => format!(
                    "claim {}={}",
                    c.metadata.name.as_deref().unwrap(),
                    owners_of(c.metadata.owner_references.as_deref().unwrap_or(&[]))
                ),
                Step::CreatePod(p) => format!(
                    "create {}@{}",
                    p.metadata.name.as_deref().unwrap(),
                    p.metadata.labels.as_ref().unwrap()[POD_REVISION_LABEL]
                ),
                Step::DeletePod(n) => format!("delete {n}"),
                Step::SetClaimOwners { claim, owners } => {
                    format!("owners {claim}={}", owners_of(owners))
                }
            })
            .collect()
    }

    fn owners_of(owners: &[OwnerReference]) -> String {
        owners
            .iter()
            .map(|o| format!("{}/{}", o.kind, o.name))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn decide(
        set: &StatefulSet,
        pods: Vec<PodFixture>,
        claims: Vec<(String, PersistentVolumeClaim)>,
    ) -> Plan {
        let pods: Vec<Pod> = pods.into_iter().map(|p| p.0).collect();
        let claims: BTreeMap<String, PersistentVolumeClaim> = claims.into_iter().collect();
        let template = PodTemplateSpec::default();
        plan(&Observed {
            set,
            pods: &pods,
            claims: &claims,
            current: Revision {
                name: "r1",
                template: &template,
            },
            update: Revision {
                name: "r2",
                template: &template,
            },
            collision_count: 0,
            now: at(100),
        })
    }

    #[test]
    fn pods_are_created_scaled_and_updated_in_upstream_order() {
        type Case = (
            &'static str,
            SetFixture,
            Vec<PodFixture>,
            Vec<(String, PersistentVolumeClaim)>,
            Vec<&'static str>,
        );
        let p = PodFixture::new;
        let cases: Vec<Case> = vec![
            (
                "OrderedReady creates the first pod only",
                SetFixture::new(3),
                vec![],
                vec![],
                vec!["create db-0@r2"],
            ),
            (
                "the next waits for its predecessor to be Ready",
                SetFixture::new(3),
                vec![p(0, "r2").running()],
                vec![],
                vec![],
            ),
            (
                "...and comes once it is",
                SetFixture::new(3),
                vec![p(0, "r2").ready()],
                vec![],
                vec!["create db-1@r2"],
            ),
            (
                "a gap is filled in order",
                SetFixture::new(3),
                vec![p(0, "r2").ready(), p(2, "r2").ready()],
                vec![],
                vec!["create db-1@r2"],
            ),
            (
                "Parallel creates every pod at once",
                SetFixture::new(3).parallel(),
                vec![],
                vec![],
                vec!["create db-0@r2", "create db-1@r2", "create db-2@r2"],
            ),
            (
                "spec.ordinals.start numbers from there",
                SetFixture::new(2).start(5),
                vec![],
                vec![],
                vec!["create db-5@r2"],
            ),
            (
                "...in order",
                SetFixture::new(2).start(5),
                vec![p(5, "r2").ready()],
                vec![],
                vec!["create db-6@r2"],
            ),
            (
                "claims come before their pod",
                SetFixture::new(1).claims(),
                vec![],
                vec![],
                vec!["claim data-db-0=", "create db-0@r2"],
            ),
            (
                "an existing claim is reused",
                SetFixture::new(1).claims(),
                vec![],
                vec![claim("data-db-0", false, json!([]))],
                vec!["create db-0@r2"],
            ),
            (
                "a claim being deleted holds its pod back",
                SetFixture::new(1).claims(),
                vec![],
                vec![claim("data-db-0", true, json!([]))],
                vec![],
            ),
            (
                "a pending pod whose claim went gets it back",
                SetFixture::new(1).claims(),
                vec![p(0, "r2")],
                vec![],
                vec!["claim data-db-0="],
            ),
            (
                "a failed pod is deleted to be recreated",
                SetFixture::new(2),
                vec![p(0, "r2").phase("Failed"), p(1, "r2").ready()],
                vec![],
                vec!["delete db-0"],
            ),
            (
                "scale down: the highest ordinal first, one at a time",
                SetFixture::new(1),
                vec![p(0, "r2").ready(), p(1, "r2").ready(), p(2, "r2").ready()],
                vec![],
                vec!["delete db-2"],
            ),
            (
                "scale down waits for the terminating pod",
                SetFixture::new(1),
                vec![
                    p(0, "r2").ready(),
                    p(1, "r2").ready(),
                    p(2, "r2").ready().terminating(),
                ],
                vec![],
                vec![],
            ),
            (
                "scale down waits while a pod in range is not Ready",
                SetFixture::new(1),
                vec![p(0, "r2").running(), p(1, "r2").ready()],
                vec![],
                vec![],
            ),
            (
                "Parallel scales down at once, highest first",
                SetFixture::new(1).parallel(),
                vec![p(0, "r2").ready(), p(1, "r2").ready(), p(2, "r2").ready()],
                vec![],
                vec!["delete db-2", "delete db-1"],
            ),
            (
                "rolling update: the highest ordinal first",
                SetFixture::new(3),
                vec![p(0, "r1").ready(), p(1, "r1").ready(), p(2, "r1").ready()],
                vec![],
                vec!["delete db-2"],
            ),
            (
                "...then the next once the updated one is Ready",
                SetFixture::new(3),
                vec![p(0, "r1").ready(), p(1, "r1").ready(), p(2, "r2").ready()],
                vec![],
                vec!["delete db-1"],
            ),
            (
                "...not while it is not",
                SetFixture::new(3),
                vec![p(0, "r1").ready(), p(1, "r1").ready(), p(2, "r2").running()],
                vec![],
                vec![],
            ),
            (
                "the partition stops the update",
                SetFixture::new(3).partition(2),
                vec![p(0, "r1").ready(), p(1, "r1").ready(), p(2, "r2").ready()],
                vec![],
                vec![],
            ),
            (
                "a pod below the partition comes back at the current revision",
                SetFixture::new(3).partition(2),
                vec![p(0, "r1").ready(), p(2, "r2").ready()],
                vec![],
                vec!["create db-1@r1"],
            ),
            (
                "a pod at or above it at the update revision",
                SetFixture::new(3).partition(1),
                vec![p(0, "r1").ready()],
                vec![],
                vec!["create db-1@r2"],
            ),
            (
                "OnDelete leaves old pods alone",
                SetFixture::new(2).on_delete(),
                vec![p(0, "r1").ready(), p(1, "r1").ready()],
                vec![],
                vec![],
            ),
            (
                "...and recreates deleted ones at the update revision",
                SetFixture::new(2).on_delete(),
                vec![p(0, "r1").ready()],
                vec![],
                vec!["create db-1@r2"],
            ),
        ];
        for (what, set, pods, claims, want) in cases {
            let got = decide(&set.build(), pods, claims);
            assert_eq!(words(&got.steps), want, "{what}");
        }
    }

    #[test]
    fn claim_owners_implement_the_retention_policy() {
        let set_ref = json!([{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db",
                              "uid": "set-uid", "controller": true}]);
        let pod_ref = json!([{"apiVersion": "v1", "kind": "Pod", "name": "db-1",
                              "uid": "pod-1", "controller": true}]);
        let stale = json!([{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db",
                            "uid": "old-set", "controller": true}]);
        let ready = |n| PodFixture::new(n, "r2").ready();
        type Case = (
            &'static str,
            SetFixture,
            Vec<(String, PersistentVolumeClaim)>,
            Vec<&'static str>,
        );
        let cases: Vec<Case> = vec![
            (
                "Retain/Retain: new claims have no owner",
                SetFixture::new(3).claims().retention("Retain", "Retain"),
                vec![
                    claim("data-db-0", false, json!([])),
                    claim("data-db-1", false, json!([])),
                ],
                vec!["claim data-db-2=", "create db-2@r2"],
            ),
            (
                "whenDeleted Delete: new claims are owned by the set",
                SetFixture::new(3).claims().retention("Delete", "Retain"),
                vec![
                    claim("data-db-0", false, set_ref.clone()),
                    claim("data-db-1", false, set_ref.clone()),
                ],
                vec!["claim data-db-2=StatefulSet/db", "create db-2@r2"],
            ),
            (
                "Retain/Retain: owners are removed",
                SetFixture::new(2).claims().retention("Retain", "Retain"),
                vec![
                    claim("data-db-0", false, json!([])),
                    claim("data-db-1", false, set_ref.clone()),
                ],
                vec!["owners data-db-1="],
            ),
            (
                "whenDeleted Delete: claims are owned by the set",
                SetFixture::new(2).claims().retention("Delete", "Retain"),
                vec![
                    claim("data-db-0", false, set_ref.clone()),
                    claim("data-db-1", false, json!([])),
                ],
                vec!["owners data-db-1=StatefulSet/db"],
            ),
            (
                "whenScaled Delete: a scaled-away pod owns its claim before it goes",
                SetFixture::new(1).claims().retention("Retain", "Delete"),
                vec![
                    claim("data-db-0", false, json!([])),
                    claim("data-db-1", false, json!([])),
                ],
                vec!["owners data-db-1=Pod/db-1", "delete db-1"],
            ),
            (
                "Delete/Delete: the set gives way to the pod on scale-down",
                SetFixture::new(1).claims().retention("Delete", "Delete"),
                vec![
                    claim("data-db-0", false, set_ref.clone()),
                    claim("data-db-1", false, set_ref.clone()),
                ],
                vec!["owners data-db-1=Pod/db-1", "delete db-1"],
            ),
            (
                "a claim already owned by the scaled-away pod is left as is",
                SetFixture::new(1).claims().retention("Retain", "Delete"),
                vec![
                    claim("data-db-0", false, json!([])),
                    claim("data-db-1", false, pod_ref),
                ],
                vec!["delete db-1"],
            ),
            (
                "a stale reference to an earlier set is not touched",
                SetFixture::new(2).claims().retention("Delete", "Retain"),
                vec![
                    claim("data-db-0", false, set_ref),
                    claim("data-db-1", false, stale),
                ],
                vec![],
            ),
        ];
        for (what, set, claims, want) in cases {
            let got = decide(&set.build(), vec![ready(0), ready(1)], claims);
            assert_eq!(words(&got.steps), want, "{what}");
        }
    }

    #[test]
    fn new_pods_carry_identity_revision_and_claims() {
        let set = SetFixture::new(3).claims().build();
        let template: PodTemplateSpec = serde_json::from_value(json!({
            "metadata": {"labels": {"app": "db"}},
            "spec": {"containers": [{"name": "db", "image": "pg"}],
                     "volumes": [{"name": "data", "emptyDir": {}}, {"name": "cfg", "emptyDir": {}}]},
        }))
        .unwrap();
        let pod = new_pod(
            &set,
            Revision {
                name: "db-abc",
                template: &template,
            },
            2,
        );
        assert_eq!(pod.metadata.name.as_deref(), Some("db-2"));
        let labels = pod.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[POD_NAME_LABEL], "db-2");
        assert_eq!(labels[POD_INDEX_LABEL], "2");
        assert_eq!(labels[POD_REVISION_LABEL], "db-abc");
        assert_eq!(labels["app"], "db");
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(
            (spec.hostname.as_deref(), spec.subdomain.as_deref()),
            (Some("db-2"), Some("db"))
        );
        let volumes: Vec<(String, Option<String>)> = spec
            .volumes
            .iter()
            .flatten()
            .map(|v| {
                (
                    v.name.clone(),
                    v.persistent_volume_claim
                        .as_ref()
                        .map(|c| c.claim_name.clone()),
                )
            })
            .collect();
        assert_eq!(
            volumes,
            [
                ("data".to_string(), Some("data-db-2".to_string())),
                ("cfg".to_string(), None)
            ],
            "the claim template replaces a template volume of its name"
        );
        let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("StatefulSet", "set-uid", Some(true))
        );
        let claims = claims_of(&set, 2);
        assert_eq!(claims[0].metadata.name.as_deref(), Some("data-db-2"));
        assert_eq!(
            claims[0].metadata.labels.as_ref().unwrap()["app"],
            "db",
            "selector labels"
        );
        assert_eq!(parent_and_ordinal("my-db-12"), Some(("my-db", 12)));
        assert_eq!(parent_and_ordinal("db-x"), None);
    }

    #[test]
    fn status_counts_revisions_and_completes_a_finished_update() {
        let set = SetFixture::new(3).build();
        let p = PodFixture::new;
        let mid = decide(
            &set,
            vec![p(0, "r1").ready(), p(1, "r1").ready(), p(2, "r2").running()],
            vec![],
        );
        let s = &mid.status;
        assert_eq!(
            (
                s.replicas,
                s.ready_replicas,
                s.available_replicas,
                s.current_replicas,
                s.updated_replicas
            ),
            (3, Some(2), Some(2), Some(2), Some(1))
        );
        assert_eq!(
            (s.current_revision.as_deref(), s.update_revision.as_deref()),
            (Some("r1"), Some("r2"))
        );
        assert_eq!(s.observed_generation, Some(2));
        let done = decide(
            &set,
            vec![p(0, "r2").ready(), p(1, "r2").ready(), p(2, "r2").ready()],
            vec![],
        );
        assert_eq!(
            done.status.current_revision.as_deref(),
            Some("r2"),
            "the update is complete"
        );
        assert_eq!(done.status.current_replicas, Some(3));
        let terminating = decide(&set, vec![p(0, "r1").ready().terminating()], vec![]);
        assert_eq!(terminating.status.replicas, 1);
        assert_eq!(
            terminating.status.current_replicas,
            Some(0),
            "terminating pods count for no revision"
        );
    }
}
