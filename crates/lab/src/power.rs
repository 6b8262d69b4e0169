//! Node power switches: which hollow nodes are switched off, shared by a cluster and its
//! kubelets.

use std::collections::HashSet;
use std::sync::Arc;

use parking_lot::RwLock;

/// Which hollow nodes are switched off (their kubelet stops heartbeating and updating pods).
#[derive(Clone, Default, Debug)]
pub struct NodePower(Arc<RwLock<HashSet<String>>>);

impl NodePower {
    /// Whether `node` is running.
    pub fn is_on(&self, node: &str) -> bool {
        !self.0.read().contains(node)
    }

    /// Stops `node`'s kubelet from doing anything, as if the machine lost power.
    pub fn power_off(&self, node: &str) {
        self.0.write().insert(node.to_string());
    }

    /// Lets `node`'s kubelet resume.
    pub fn power_on(&self, node: &str) {
        self.0.write().remove(node);
    }
}
