//! The scheduler's Filter plugins on one node, kube-scheduler's defaults: NodeUnschedulable,
//! TaintToleration, NodeAffinity, NodeResourcesFit, VolumeBinding and InterPodAffinity (its
//! required anti-affinity).

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{PodAffinityTerm, Taint};

use super::fit_error::Failure;
use super::matching::{label_selector_matches, node_affinity_matches, tolerates, tolerations};
use super::pod_info::PodInfo;
use super::snapshot::{NodeState, Snapshot};
use super::volumes::{VolumeNeeds, volumes_fit};

/// Whether an affinity term of `owner` (a pod in `owner_ns`) selects `target`.
fn affinity_term_selects(term: &PodAffinityTerm, owner_ns: &str, target: &PodInfo) -> bool {
    let ns_ok = match (&term.namespaces, &term.namespace_selector) {
        (_, Some(sel))
            if sel.match_labels.as_ref().is_none_or(|m| m.is_empty())
                && sel.match_expressions.as_ref().is_none_or(|m| m.is_empty()) =>
        {
            true
        }
        (Some(list), _) if !list.is_empty() => list.iter().any(|n| n == target.namespace()),
        _ => owner_ns == target.namespace(),
    };
    ns_ok
        && label_selector_matches(
            term.label_selector.as_ref(),
            target.pod.metadata.labels.as_ref(),
        )
}

fn topology_value<'a>(state: &'a NodeState, key: &str) -> Option<&'a str> {
    state.labels()?.get(key).map(String::as_str)
}

/// The Filter plugins on one node: unschedulable, taints, node affinity, pod count and
/// resources, volumes, then pod anti-affinity (the incoming pod's and that of pods already
/// placed).
pub(super) fn filter(
    snap: &Snapshot,
    pod: &PodInfo,
    state: &NodeState,
    anti: &AntiAffinity,
    volumes: Option<&VolumeNeeds<'_>>,
) -> Result<(), Failure> {
    let Some(node) = state.node.as_deref() else {
        return Err(Failure::unresolvable("node(s) not found"));
    };
    let tols = tolerations(&pod.pod);
    let spec = node.spec.as_ref();
    if spec.and_then(|s| s.unschedulable).unwrap_or(false) {
        let taint = Taint {
            key: "node.kubernetes.io/unschedulable".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        };
        if !tols.iter().any(|t| tolerates(t, &taint)) {
            return Err(Failure::unresolvable("node(s) were unschedulable"));
        }
    }
    if let Some(taint) = spec
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .find(|taint| !tols.iter().any(|t| tolerates(t, taint)))
    {
        return Err(Failure::unresolvable(format!(
            "node(s) had untolerated taint {{{}: {}}}",
            taint.key,
            taint.value.as_deref().unwrap_or("")
        )));
    }
    if !node_affinity_matches(&pod.pod, node) {
        return Err(Failure::unresolvable(
            "node(s) didn't match Pod's node affinity/selector",
        ));
    }
    let mut reasons = Vec::new();
    if state.pods.len() as i64 + 1 > state.max_pods {
        reasons.push("Too many pods".to_string());
    }
    if pod.requests.cpu_milli > 0
        && pod.requests.cpu_milli > state.allocatable.cpu_milli - state.requested.cpu_milli
    {
        reasons.push("Insufficient cpu".to_string());
    }
    if pod.requests.memory > 0
        && pod.requests.memory > state.allocatable.memory - state.requested.memory
    {
        reasons.push("Insufficient memory".to_string());
    }
    if !reasons.is_empty() {
        return Err(Failure {
            reasons,
            resolvable: true,
        });
    }
    if let Some(needs) = volumes {
        volumes_fit(&snap.volumes, needs, node)?;
    }
    if anti
        .own
        .iter()
        .any(|(key, value)| topology_value(state, key) == Some(value.as_str()))
    {
        return Err(Failure {
            reasons: vec!["node(s) didn't match pod anti-affinity rules".into()],
            resolvable: true,
        });
    }
    if anti
        .existing
        .iter()
        .any(|(key, value)| topology_value(state, key) == Some(value.as_str()))
    {
        return Err(Failure {
            reasons: vec!["node(s) didn't satisfy existing pods anti-affinity rules".into()],
            resolvable: true,
        });
    }
    Ok(())
}

/// Topology domains (label key, value) the pod may not join.
#[derive(Default)]
pub(super) struct AntiAffinity {
    /// Domains of placed pods whose anti-affinity selects the incoming pod.
    existing: HashSet<(String, String)>,
    /// Domains holding pods the incoming pod's anti-affinity selects.
    own: HashSet<(String, String)>,
}

impl AntiAffinity {
    pub(super) fn of(snap: &Snapshot, pod: &PodInfo) -> AntiAffinity {
        let mut out = AntiAffinity::default();
        for other in snap.anti.values() {
            let Some(state) = snap.node_of(&other.uid).and_then(|n| snap.nodes.get(n)) else {
                continue;
            };
            for term in other.anti_affinity_terms() {
                if affinity_term_selects(term, other.namespace(), pod)
                    && let Some(v) = topology_value(state, &term.topology_key)
                {
                    out.existing
                        .insert((term.topology_key.clone(), v.to_string()));
                }
            }
        }
        let terms = pod.anti_affinity_terms();
        if !terms.is_empty() {
            // One pass over placed pods, only for pods that carry anti-affinity.
            for state in snap.nodes.values() {
                for other in state.pods.values() {
                    for term in terms {
                        if affinity_term_selects(term, pod.namespace(), other)
                            && let Some(v) = topology_value(state, &term.topology_key)
                        {
                            out.own.insert((term.topology_key.clone(), v.to_string()));
                        }
                    }
                }
            }
        }
        out
    }
}
