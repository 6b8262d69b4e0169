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

use crate::controllers::history::POD_REVISION_LABEL;
use crate::controllers::{Availability, availability, is_ready};

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
