//! The pure half of the DaemonSet controller (kube's daemon_controller.go, update.go and
//! util/daemonset_util.go): which nodes should run a daemon pod, which pods to create and
//! delete, one rolling-update step, and the status.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetStatus};
use k8s_openapi::api::core::v1::{
    Affinity, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod,
    PodSpec, PodTemplateSpec, Taint, Toleration,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;

use crate::controllers::availability::{Availability, availability, is_ready};
use crate::controllers::deployment::plan::{InvalidField, resolve};
use crate::scheduler::matching::{selects_node, tolerates};

/// Label naming the ControllerRevision a daemon pod was made from.
pub const HASH_LABEL: &str = "controller-revision-hash";
/// Label carrying the DaemonSet's template generation (kept by kube for old clients).
pub const GENERATION_LABEL: &str = "pod-template-generation";
/// Annotation where kube-apiserver keeps a DaemonSet's template generation.
pub const GENERATION_ANNOTATION: &str = "deprecated.daemonset.template.generation";

/// Whether a node should run a daemon pod (kube's NodeShouldRunDaemonPod).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fit {
    /// A daemon pod should be created here if there is none.
    pub should_run: bool,
    /// A daemon pod already here may stay (it tolerates every NoExecute taint).
    pub should_continue_running: bool,
}

/// Adds the tolerations kube gives every daemon pod (AddOrUpdateDaemonPodTolerations): node
/// problems never evict it, and cordoned or pressured nodes still run it.
pub fn add_daemon_tolerations(spec: &mut PodSpec) {
    let mut wanted = vec![
        ("node.kubernetes.io/not-ready", "NoExecute"),
        ("node.kubernetes.io/unreachable", "NoExecute"),
        ("node.kubernetes.io/disk-pressure", "NoSchedule"),
        ("node.kubernetes.io/memory-pressure", "NoSchedule"),
        ("node.kubernetes.io/pid-pressure", "NoSchedule"),
        ("node.kubernetes.io/unschedulable", "NoSchedule"),
    ];
    if spec.host_network == Some(true) {
        wanted.push(("node.kubernetes.io/network-unavailable", "NoSchedule"));
    }
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    for (key, effect) in wanted {
        let toleration = Toleration {
            key: Some(key.into()),
            operator: Some("Exists".into()),
            effect: Some(effect.into()),
            ..Default::default()
        };
        // kube's AddOrUpdateTolerationInPodSpec: an equal toleration is replaced in place.
        match tolerations.iter_mut().find(|t| **t == toleration) {
            Some(existing) => *existing = toleration,
            None => tolerations.push(toleration),
        }
    }
}

fn untolerated<'a>(
    taints: &'a [Taint],
    tolerations: &[Toleration],
    effects: &[&str],
) -> Option<&'a Taint> {
    taints
        .iter()
        .filter(|t| effects.contains(&t.effect.as_str()))
        .find(|taint| !tolerations.iter().any(|t| tolerates(t, taint)))
}

/// kube's NodeShouldRunDaemonPod for a DaemonSet's pod template (before the daemon
/// tolerations are added, which this adds): nodeName, nodeSelector, required node affinity,
/// and NoSchedule/NoExecute taints against the tolerations. A DaemonSet tolerating
/// everything runs on every node, tainted or not, as in kube.
pub fn node_should_run(template: &PodTemplateSpec, node: &Node) -> Fit {
    let no = Fit {
        should_run: false,
        should_continue_running: false,
    };
    let mut spec = template.spec.clone().unwrap_or_default();
    let name = node.metadata.name.as_deref().unwrap_or_default();
    if spec
        .node_name
        .as_deref()
        .is_some_and(|n| !n.is_empty() && n != name)
    {
        return no;
    }
    if !selects_node(&spec, node) {
        return no;
    }
    add_daemon_tolerations(&mut spec);
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default();
    if untolerated(taints, tolerations, &["NoSchedule", "NoExecute"]).is_some() {
        return Fit {
            should_run: false,
            should_continue_running: untolerated(taints, tolerations, &["NoExecute"]).is_none(),
        };
    }
    Fit {
        should_run: true,
        should_continue_running: true,
    }
}

/// The node a daemon pod is for (kube's GetTargetNodeName): its nodeName once bound, else
/// the `metadata.name` its node affinity pins it to.
pub fn target_node(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if let Some(n) = spec.node_name.as_ref().filter(|n| !n.is_empty()) {
        return Some(n.clone());
    }
    let terms = &spec
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    terms
        .iter()
        .flat_map(|t| t.match_fields.iter().flatten())
        .find(|r| r.key == "metadata.name" && r.operator == "In")
        .and_then(|r| match r.values.as_deref() {
            Some([one]) => Some(one.clone()),
            _ => None,
        })
}

/// The template generation kube-apiserver keeps in an annotation, if any.
pub fn template_generation(ds: &DaemonSet) -> Option<i64> {
    ds.metadata
        .annotations
        .as_ref()?
        .get(GENERATION_ANNOTATION)?
        .parse()
        .ok()
}

/// The pod template a daemon pod is made from (kube's CreatePodTemplate plus
/// ReplaceDaemonSetPodNodeNameNodeAffinity): the daemon tolerations, the revision and
/// generation labels, and a required node affinity that pins it to `node` for the scheduler.
pub fn pod_template(
    template: &PodTemplateSpec,
    generation: Option<i64>,
    hash: &str,
    node: &str,
) -> PodTemplateSpec {
    let mut template = template.clone();
    let meta = template.metadata.get_or_insert_with(Default::default);
    let labels = meta.labels.get_or_insert_with(Default::default);
    if let Some(generation) = generation {
        labels.insert(GENERATION_LABEL.into(), generation.to_string());
    }
    if !hash.is_empty() {
        labels.insert(HASH_LABEL.into(), hash.into());
    }
    let spec = template.spec.get_or_insert_with(Default::default);
    add_daemon_tolerations(spec);
    let pinned = NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_fields: Some(vec![NodeSelectorRequirement {
                key: "metadata.name".into(),
                operator: "In".into(),
                values: Some(vec![node.into()]),
            }]),
            match_expressions: None,
        }],
    };
    // The pin replaces the template's required terms: the DaemonSet already chose the node
    // by them.
    spec.affinity
        .get_or_insert_with(Affinity::default)
        .node_affinity
        .get_or_insert_with(NodeAffinity::default)
        .required_during_scheduling_ignored_during_execution = Some(pinned);
    template
}

/// kube's IsPodUpdated: the pod carries the current revision hash or template generation.
pub fn is_updated(pod: &Pod, hash: &str, generation: Option<i64>) -> bool {
    let labels = pod.metadata.labels.as_ref();
    let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    let by_generation = generation.is_some_and(|g| label(GENERATION_LABEL) == Some(&g.to_string()));
    let by_hash = !hash.is_empty() && label(HASH_LABEL) == Some(hash);
    by_hash || by_generation
}

fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref().and_then(|s| s.phase.as_deref())
}

fn available(pod: &Pod, min_ready: i32, now: Timestamp) -> bool {
    availability(pod, min_ready, now) == Availability::Available
}

/// kube's podByCreationTimestampAndPhase: scheduled first, then oldest, then by name.
fn sort_oldest_first(pods: &mut [&Pod]) {
    pods.sort_by_key(|p| {
        (
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_ref())
                .is_none_or(|n| n.is_empty()),
            p.metadata.creation_timestamp.as_ref().map(|t| t.0),
            p.metadata.name.clone(),
        )
    });
}

/// What the rolling update allows: maxSurge and maxUnavailable resolved against the number
/// of nodes that should run a pod (both rounded up, as kube), and the strategy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Extra pods a node may run during an update (0: replace in place).
    pub max_surge: i32,
    /// Nodes that may be without an available pod during an update.
    pub max_unavailable: i32,
    /// `OnDelete`: pods are only replaced when someone deletes them.
    pub on_delete: bool,
}

/// Resolves the update strategy against `desired` nodes (kube's updatedDesiredNodeCounts),
/// with the API server's defaults (RollingUpdate, maxUnavailable 1, maxSurge 0) for what is
/// unset. Zero surge and zero unavailability would never progress: maxUnavailable is 1 then.
pub fn budget(ds: &DaemonSet, desired: i32) -> Result<Budget, InvalidField> {
    let strategy = ds.spec.as_ref().and_then(|s| s.update_strategy.as_ref());
    if strategy.and_then(|s| s.type_.as_deref()) == Some("OnDelete") {
        return Ok(Budget {
            max_surge: 0,
            max_unavailable: 0,
            on_delete: true,
        });
    }
    let rolling = strategy.and_then(|s| s.rolling_update.as_ref());
    let one = IntOrString::Int(1);
    let unavailable = rolling
        .and_then(|r| r.max_unavailable.as_ref())
        .unwrap_or(&one);
    let max_unavailable = resolve(Some(unavailable), "0%", desired, true).map_err(
        InvalidField::at("spec.updateStrategy.rollingUpdate.maxUnavailable"),
    )?;
    let max_surge = resolve(
        rolling.and_then(|r| r.max_surge.as_ref()),
        "0%",
        desired,
        true,
    )
    .map_err(InvalidField::at(
        "spec.updateStrategy.rollingUpdate.maxSurge",
    ))?;
    let max_unavailable = if desired > 0 && max_unavailable == 0 && max_surge == 0 {
        1
    } else {
        max_unavailable
    };
    Ok(Budget {
        max_surge,
        max_unavailable,
        on_delete: false,
    })
}

/// Whether the strategy allows two pods on a node during an update (kube's AllowsSurge).
pub fn allows_surge(ds: &DaemonSet) -> bool {
    budget(ds, 1).is_ok_and(|b| !b.on_delete && b.max_surge > 0)
}

/// Pods to delete and nodes to create a pod on, with the events kube emits on the way.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Nodes that get a new daemon pod.
    pub create_on: Vec<String>,
    /// Names of pods to delete.
    pub delete: Vec<String>,
    /// (reason, message) of events about the DaemonSet.
    pub events: Vec<(String, String)>,
    /// Nodes whose failed pod this pass deletes (the caller backs off deleting the next).
    pub failed_on: Vec<String>,
    /// A failed pod is left alone for now, its node in back-off: look again later.
    pub backing_off: bool,
}

impl Changes {
    /// Whether the pass changes nothing.
    pub fn is_empty(&self) -> bool {
        self.create_on.is_empty() && self.delete.is_empty()
    }
}

/// What the DaemonSet sees of the cluster: every node, and its pods (terminating ones
/// included) by the node they are for.
pub struct View<'a> {
    /// The DaemonSet.
    pub ds: &'a DaemonSet,
    /// Every node of the cluster.
    pub nodes: &'a [Node],
    /// The DaemonSet's pods by target node.
    pub pods: &'a BTreeMap<String, Vec<Pod>>,
    /// Hash of the current revision.
    pub hash: &'a str,
    /// Now, for minReadySeconds.
    pub now: Timestamp,
    /// Nodes where deleting a failed pod again must wait (kube's failedPodsBackoff).
    pub failed_backoff: &'a BTreeSet<String>,
}

impl View<'_> {
    fn template(&self) -> PodTemplateSpec {
        self.ds
            .spec
            .as_ref()
            .map(|s| s.template.clone())
            .unwrap_or_default()
    }

    fn min_ready(&self) -> i32 {
        self.ds
            .spec
            .as_ref()
            .and_then(|s| s.min_ready_seconds)
            .unwrap_or(0)
    }

    fn pods_on(&self, node: &str) -> &[Pod] {
        self.pods.get(node).map(Vec::as_slice).unwrap_or_default()
    }

    fn fits(&self) -> BTreeMap<String, Fit> {
        let template = self.template();
        self.nodes
            .iter()
            .map(|n| {
                (
                    n.metadata.name.clone().unwrap_or_default(),
                    node_should_run(&template, n),
                )
            })
            .collect()
    }
}

/// kube's manage: on each node, create the missing daemon pod, delete failed and succeeded
/// ones, excess ones, and those on nodes that should no longer run one; and delete
/// unscheduled pods for nodes that no longer exist.
pub fn manage(view: &View<'_>) -> Changes {
    let mut changes = Changes::default();
    let surge = allows_surge(view.ds);
    let fits = view.fits();
    for (node, fit) in &fits {
        let pods = view.pods_on(node);
        let exists = !pods.is_empty();
        if fit.should_run && !exists {
            changes.create_on.push(node.clone());
        } else if fit.should_continue_running {
            let mut running: Vec<&Pod> = Vec::new();
            for pod in pods
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
            {
                let name = pod.metadata.name.clone().unwrap_or_default();
                let ns = pod.metadata.namespace.clone().unwrap_or_default();
                match phase(pod) {
                    Some("Failed") if view.failed_backoff.contains(node) => {
                        // kube backs off deleting failed pods on a node that keeps failing
                        // them, rather than fighting its kubelet in a hot loop.
                        changes.backing_off = true;
                    }
                    Some("Failed") => {
                        changes.failed_on.push(node.clone());
                        changes.events.push((
                            "FailedDaemonPod".into(),
                            format!("Found failed daemon pod {ns}/{name} on node {node}, will try to kill it"),
                        ));
                        changes.delete.push(name);
                    }
                    Some("Succeeded") => {
                        changes.events.push((
                            "SucceededDaemonPod".into(),
                            format!("Found succeeded daemon pod {ns}/{name} on node {node}, will try to delete it"),
                        ));
                        changes.delete.push(name);
                    }
                    _ => running.push(pod),
                }
            }
            sort_oldest_first(&mut running);
            if !surge {
                // One pod per node: all but the oldest go.
                changes.delete.extend(
                    running
                        .iter()
                        .skip(1)
                        .filter_map(|p| p.metadata.name.clone()),
                );
                continue;
            }
            if running.is_empty() {
                if fit.should_run {
                    changes.create_on.push(node.clone());
                }
                continue;
            }
            // Surging: keep the oldest new pod and the oldest old one; the old one goes
            // once it is not ready or the new one is available.
            let generation = template_generation(view.ds);
            let (mut oldest_new, mut oldest_old) = (None, None);
            for pod in running {
                let slot = if is_updated(pod, view.hash, generation) {
                    &mut oldest_new
                } else {
                    &mut oldest_old
                };
                if slot.is_none() {
                    *slot = Some(pod);
                } else {
                    changes.delete.extend(pod.metadata.name.clone());
                }
            }
            if let (Some(new), Some(old)) = (oldest_new, oldest_old)
                && (!is_ready(old) || available(new, view.min_ready(), view.now))
            {
                changes.delete.extend(old.metadata.name.clone());
            }
        } else if exists {
            changes.delete.extend(
                pods.iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .filter_map(|p| p.metadata.name.clone()),
            );
        }
    }
    // Unscheduled pods for nodes that are gone would never be bound nor collected.
    for (node, pods) in view.pods {
        if fits.contains_key(node) {
            continue;
        }
        changes.delete.extend(
            pods.iter()
                .filter(|p| {
                    p.spec
                        .as_ref()
                        .and_then(|s| s.node_name.as_ref())
                        .is_none_or(|n| n.is_empty())
                })
                .filter_map(|p| p.metadata.name.clone()),
        );
    }
    changes
}

/// kube's findUpdatedPodsOnNode: the node's one new and one old live pod, or None if it has
/// more of either (the manage pass prunes those first).
fn updated_and_old<'a>(
    pods: &'a [Pod],
    hash: &str,
    generation: Option<i64>,
) -> Option<(Option<&'a Pod>, Option<&'a Pod>)> {
    let (mut new, mut old) = (None, None);
    for pod in pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
    {
        let slot = if is_updated(pod, hash, generation) {
            &mut new
        } else {
            &mut old
        };
        if slot.is_some() {
            return None;
        }
        *slot = Some(pod);
    }
    Some((new, old))
}

/// One RollingUpdate pass (kube's rollingUpdate), run when the manage pass had nothing to
/// do. Without surge, old pods are deleted while no more than maxUnavailable nodes lack an
/// available pod (the manage pass then creates their replacements); with surge, new pods
/// are created beside old available ones up to maxSurge, and old ones deleted once their
/// replacement is available.
pub fn rolling_update(view: &View<'_>, budget: Budget) -> Changes {
    let mut changes = Changes::default();
    if budget.on_delete {
        return changes;
    }
    let generation = template_generation(view.ds);
    let min_ready = view.min_ready();
    let fits = view.fits();
    // Every node that should run a pod, and every node that has one.
    let mut nodes: BTreeMap<&str, &[Pod]> = view
        .pods
        .iter()
        .map(|(n, p)| (n.as_str(), p.as_slice()))
        .collect();
    for (node, fit) in &fits {
        if fit.should_run {
            nodes.entry(node.as_str()).or_insert(&[]);
        }
    }
    let is_available = |p: &Pod| available(p, min_ready, view.now);
    let name = |p: &Pod| p.metadata.name.clone().unwrap_or_default();

    if budget.max_surge == 0 {
        let mut unavailable = 0;
        let mut replacements = Vec::new();
        let mut candidates = Vec::new();
        for pods in nodes.values() {
            let Some((new, old)) = updated_and_old(pods, view.hash, generation) else {
                unavailable += 1;
                continue;
            };
            match (new, old) {
                (None, None) | (Some(_), Some(_)) => unavailable += 1,
                (Some(new), None) => {
                    if !is_available(new) {
                        unavailable += 1;
                    }
                }
                (None, Some(old)) => {
                    if !is_available(old) {
                        replacements.push(name(old));
                        unavailable += 1;
                    } else if unavailable < budget.max_unavailable {
                        candidates.push(name(old));
                    }
                }
            }
        }
        let room = usize::try_from((budget.max_unavailable - unavailable).max(0)).unwrap_or(0);
        changes.delete = replacements;
        changes.delete.extend(candidates.into_iter().take(room));
        return changes;
    }

    let desired = i32::try_from(fits.values().filter(|f| f.should_run).count()).unwrap_or(i32::MAX);
    let should_run = |node: &str| fits.get(node).is_some_and(|f| f.should_run);
    let mut surging = 0;
    let mut available_nodes = 0;
    let mut allowed_new = Vec::new();
    let mut candidate_new = Vec::new();
    let mut misplaced_old = Vec::new();
    for (node, pods) in &nodes {
        let Some((new, old)) = updated_and_old(pods, view.hash, generation) else {
            surging += 1;
            continue;
        };
        if old.or(new).is_some_and(is_available) {
            available_nodes += 1;
        }
        match (new, old) {
            (_, None) => {}
            (None, Some(old)) => {
                if !is_available(old) {
                    if should_run(node) {
                        allowed_new.push(node.to_string());
                    } else {
                        changes.delete.push(name(old));
                    }
                } else if !should_run(node) {
                    misplaced_old.push(name(old));
                } else if surging < budget.max_surge {
                    candidate_new.push(node.to_string());
                }
            }
            (Some(new), Some(old)) => {
                if is_available(new) {
                    changes.delete.push(name(old));
                } else {
                    surging += 1;
                }
            }
        }
    }
    // An old pod on a node it no longer belongs on goes only once another node has an
    // available pod in its place: surge promises full availability.
    let deletable = usize::try_from((available_nodes - desired).max(0)).unwrap_or(0);
    changes
        .delete
        .extend(misplaced_old.into_iter().take(deletable));
    let room = usize::try_from((budget.max_surge - surging).max(0)).unwrap_or(0);
    changes.create_on = allowed_new;
    changes
        .create_on
        .extend(candidate_new.into_iter().take(room));
    changes
}

/// The status kube's updateDaemonSetStatus reports (counters and observedGeneration; the
/// collision count and conditions are carried over by the caller), and whether some Ready
/// pod is not yet available (so the caller looks again after minReadySeconds).
pub fn status_of(view: &View<'_>) -> (DaemonSetStatus, bool) {
    let generation = template_generation(view.ds);
    let min_ready = view.min_ready();
    let mut status = DaemonSetStatus {
        observed_generation: view.ds.metadata.generation,
        ..Default::default()
    };
    let (mut available_count, mut ready_count, mut updated) = (0, 0, 0);
    for (node, fit) in view.fits() {
        let mut pods: Vec<&Pod> = view.pods_on(&node).iter().collect();
        if !fit.should_run {
            if !pods.is_empty() {
                status.number_misscheduled += 1;
            }
            continue;
        }
        status.desired_number_scheduled += 1;
        if pods.is_empty() {
            continue;
        }
        status.current_number_scheduled += 1;
        sort_oldest_first(&mut pods);
        let pod = pods[0];
        if is_ready(pod) {
            ready_count += 1;
            if available(pod, min_ready, view.now) {
                available_count += 1;
            }
        }
        if is_updated(pod, view.hash, generation) {
            updated += 1;
        }
    }
    status.number_ready = ready_count;
    status.number_available = Some(available_count);
    status.number_unavailable = Some(status.desired_number_scheduled - available_count);
    status.updated_number_scheduled = Some(updated);
    (status, ready_count != available_count && min_ready > 0)
}

#[cfg(test)]
mod tests;
