//! Why a pod fits no node, worded like kube-scheduler's `FitError`, and why one node failed
//! a filter.

use std::collections::BTreeMap;
use std::fmt;

/// Why a pod fits no node, counted per reason like kube-scheduler's `FitError`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FitError {
    /// Number of nodes considered.
    pub nodes: usize,
    /// Filter reason → number of nodes that failed with it.
    pub reasons: BTreeMap<String, usize>,
    /// Preemption verdict → number of nodes.
    pub preemption: BTreeMap<String, usize>,
    /// Set when the pod may not preempt at all.
    pub preemption_never: bool,
    /// Why the pod fits no node before any node was looked at (a PreFilter's reason).
    pub prefilter: Option<String>,
}

fn histogram(map: &BTreeMap<String, usize>) -> String {
    let mut parts: Vec<String> = map.iter().map(|(r, n)| format!("{n} {r}")).collect();
    parts.sort();
    parts.join(", ")
}

impl fmt::Display for FitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nodes == 0 {
            return write!(f, "no nodes available to schedule pods");
        }
        match &self.prefilter {
            Some(reason) => write!(f, "0/{} nodes are available: {reason}.", self.nodes)?,
            None => write!(
                f,
                "0/{} nodes are available: {}.",
                self.nodes,
                histogram(&self.reasons)
            )?,
        }
        if self.preemption_never {
            write!(
                f,
                " preemption: not eligible due to preemptionPolicy=Never."
            )
        } else {
            write!(
                f,
                " preemption: 0/{} nodes are available: {}.",
                self.nodes,
                histogram(&self.preemption)
            )
        }
    }
}

impl std::error::Error for FitError {}

/// A filter failure: its reason and whether evicting pods could resolve it.
pub(super) struct Failure {
    pub(super) reasons: Vec<String>,
    pub(super) resolvable: bool,
}

impl Failure {
    pub(super) fn unresolvable(reason: impl Into<String>) -> Failure {
        Failure {
            reasons: vec![reason.into()],
            resolvable: false,
        }
    }
}
