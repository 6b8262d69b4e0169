//! The scheduler's view of the cluster, synchronous and maintained incrementally: nodes, the
//! pods bound or assumed on them, and storage.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;

use super::pod_info::{PodInfo, Resources, quantity};
use super::volumes::{Volumes, volume_needs};

/// One node and what is placed on it.
#[derive(Debug, Default)]
pub struct NodeState {
    pub(super) node: Option<Arc<Node>>,
    pub(super) allocatable: Resources,
    pub(super) max_pods: i64,
    pub(super) requested: Resources,
    pub(super) nonzero: Resources,
    pub(super) pods: HashMap<String, Arc<PodInfo>>,
    pub(super) spread: HashMap<String, u32>,
}

impl NodeState {
    pub(super) fn labels(&self) -> Option<&BTreeMap<String, String>> {
        self.node.as_ref()?.metadata.labels.as_ref()
    }
}

/// The scheduler's view of the cluster: nodes and the pods bound or assumed on them.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub(super) nodes: BTreeMap<String, NodeState>,
    placed: HashMap<String, String>,
    /// Placed pods with required anti-affinity terms (checked against incoming pods).
    pub(super) anti: HashMap<String, Arc<PodInfo>>,
    /// Claims, volumes and classes, for pods with claims.
    pub(super) volumes: Volumes,
}

impl Snapshot {
    /// Adds or updates a node; returns whether anything scheduling depends on changed.
    pub fn apply_node(&mut self, node: Node) -> bool {
        let name = node.metadata.name.clone().unwrap_or_default();
        let alloc = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
        let allocatable = Resources {
            cpu_milli: quantity(alloc, "cpu", 3).unwrap_or(0),
            memory: quantity(alloc, "memory", 0).unwrap_or(0),
        };
        let max_pods = quantity(alloc, "pods", 0).unwrap_or(0);
        let state = self.nodes.entry(name).or_default();
        let relevant = |n: &Node| {
            (
                n.metadata.labels.clone(),
                n.spec.as_ref().map(|s| (s.taints.clone(), s.unschedulable)),
            )
        };
        let changed = state.node.as_deref().map(relevant) != Some(relevant(&node))
            || state.allocatable != allocatable
            || state.max_pods != max_pods;
        state.node = Some(Arc::new(node));
        state.allocatable = allocatable;
        state.max_pods = max_pods;
        changed
    }

    /// Removes a node (pods still placed on it keep their accounting until they go).
    pub fn delete_node(&mut self, name: &str) {
        if let Some(state) = self.nodes.get_mut(name) {
            state.node = None;
            if state.pods.is_empty() {
                self.nodes.remove(name);
            }
        }
    }

    /// Names of the known nodes.
    pub fn node_names(&self) -> impl Iterator<Item = &str> {
        self.nodes
            .iter()
            .filter(|(_, s)| s.node.is_some())
            .map(|(n, _)| n.as_str())
    }

    /// Places `pod` on `node` (bound or assumed), replacing an earlier placement.
    pub fn place(&mut self, pod: Arc<PodInfo>, node: &str) {
        self.forget(&pod.uid);
        let state = self.nodes.entry(node.to_string()).or_default();
        state.requested.add(pod.requests);
        state.nonzero.add(pod.nonzero);
        *state.spread.entry(pod.spread_key.clone()).or_default() += 1;
        if !pod.anti_affinity_terms().is_empty() {
            self.anti.insert(pod.uid.clone(), pod.clone());
        }
        self.placed.insert(pod.uid.clone(), node.to_string());
        state.pods.insert(pod.uid.clone(), pod);
    }

    /// Removes a pod's placement; returns whether it was placed.
    pub fn forget(&mut self, uid: &str) -> bool {
        let Some(node) = self.placed.remove(uid) else {
            return false;
        };
        self.anti.remove(uid);
        if let Some(state) = self.nodes.get_mut(&node) {
            if let Some(pod) = state.pods.remove(uid) {
                state.requested.sub(pod.requests);
                state.nonzero.sub(pod.nonzero);
                if let Some(n) = state.spread.get_mut(&pod.spread_key) {
                    *n -= 1;
                    if *n == 0 {
                        state.spread.remove(&pod.spread_key);
                    }
                }
            }
            if state.node.is_none() && state.pods.is_empty() {
                self.nodes.remove(&node);
            }
        }
        true
    }

    /// The node a pod is placed on.
    pub fn node_of(&self, uid: &str) -> Option<&str> {
        self.placed.get(uid).map(String::as_str)
    }

    /// Uids of all placed pods.
    pub fn placed_uids(&self) -> impl Iterator<Item = &String> {
        self.placed.keys()
    }

    /// The storage view, to update from watches.
    pub fn volumes_mut(&mut self) -> &mut Volumes {
        &mut self.volumes
    }

    /// The claims of `pod` still waiting for a node (unbound, WaitForFirstConsumer): the ones
    /// to annotate with the chosen node before the pod is bound.
    pub fn claims_to_select(&self, pod: &PodInfo) -> Vec<String> {
        match volume_needs(&self.volumes, pod) {
            Ok(needs) => needs
                .delayed
                .iter()
                .filter_map(|(c, _)| c.metadata.name.clone())
                .collect(),
            Err(_) => Vec::new(),
        }
    }
}
