//! The scheduler's Score plugins on one feasible node, before normalization: preferred node
//! affinity, PreferNoSchedule taints and least-allocated resources.

use k8s_openapi::api::core::v1::{Node, Pod};

use super::matching::{term_matches, tolerates, tolerations};
use super::pod_info::PodInfo;
use super::snapshot::NodeState;

/// NodeAffinity's score: the weights of the pod's preferred terms `node` matches.
pub(super) fn preferred_affinity(pod: &Pod, node: &Node) -> i64 {
    pod.spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.preferred_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .into_iter()
        .flatten()
        .filter(|p| term_matches(&p.preference, node))
        .map(|p| i64::from(p.weight))
        .sum()
}

/// TaintToleration's score (lower is better): PreferNoSchedule taints of `node` the pod
/// does not tolerate.
pub(super) fn intolerable_prefer_no_schedule(pod: &Pod, node: &Node) -> i64 {
    let tols = tolerations(pod);
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| t.effect == "PreferNoSchedule")
        .filter(|taint| {
            !tols.iter().any(|t| {
                (t.effect.as_deref().unwrap_or("").is_empty()
                    || t.effect.as_deref() == Some("PreferNoSchedule"))
                    && tolerates(t, taint)
            })
        })
        .count() as i64
}

/// NodeResourcesFit's LeastAllocated score (0 to 100) of the node with the pod on it.
pub(super) fn least_allocated(state: &NodeState, pod: &PodInfo) -> i64 {
    let score = |cap: i64, used: i64| {
        if cap <= 0 || used > cap {
            0
        } else {
            (cap - used) * 100 / cap
        }
    };
    (score(
        state.allocatable.cpu_milli,
        state.nonzero.cpu_milli + pod.nonzero.cpu_milli,
    ) + score(
        state.allocatable.memory,
        state.nonzero.memory + pod.nonzero.memory,
    )) / 2
}
