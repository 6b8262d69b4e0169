//! Test fixtures for the scheduler: nodes and pods as small builders, and snapshots of them.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};

use super::pod_info::PodInfo;
use super::snapshot::Snapshot;

/// A node under construction: `NodeFixture::new("n1").alloc("2", "4Gi").label("k", "v")`.
pub(super) struct NodeFixture(pub(super) Value);

impl NodeFixture {
    pub(super) fn new(name: &str) -> Self {
        NodeFixture(json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {},
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}},
        }))
    }
    pub(super) fn alloc(mut self, cpu: &str, memory: &str) -> Self {
        self.0["status"]["allocatable"]["cpu"] = json!(cpu);
        self.0["status"]["allocatable"]["memory"] = json!(memory);
        self
    }
    pub(super) fn max_pods(mut self, n: u32) -> Self {
        self.0["status"]["allocatable"]["pods"] = json!(n.to_string());
        self
    }
    pub(super) fn label(mut self, k: &str, v: &str) -> Self {
        self.0["metadata"]["labels"][k] = json!(v);
        self
    }
    pub(super) fn taint(mut self, key: &str, value: &str, effect: &str) -> Self {
        let t = json!({"key": key, "value": value, "effect": effect});
        match self.0["spec"]["taints"].as_array_mut() {
            Some(list) => list.push(t),
            None => self.0["spec"]["taints"] = json!([t]),
        }
        self
    }
    pub(super) fn unschedulable(mut self) -> Self {
        self.0["spec"]["unschedulable"] = json!(true);
        self
    }
    pub(super) fn build(self) -> Node {
        serde_json::from_value(self.0).expect("valid node fixture")
    }
}

/// A pod under construction: `PodFixture::new("web").requests("100m", "64Mi")`.
pub(super) struct PodFixture(pub(super) Value);

impl PodFixture {
    pub(super) fn new(name: &str) -> Self {
        PodFixture(json!({
            "metadata": {"name": name, "namespace": "default", "uid": name,
                         "labels": {"app": name}},
            "spec": {"containers": [{"name": "app", "image": "nginx"}]},
        }))
    }
    pub(super) fn requests(mut self, cpu: &str, memory: &str) -> Self {
        self.0["spec"]["containers"][0]["resources"] =
            json!({"requests": {"cpu": cpu, "memory": memory}});
        self
    }
    pub(super) fn uid(mut self, uid: &str) -> Self {
        self.0["metadata"]["uid"] = json!(uid);
        self
    }
    pub(super) fn label(mut self, k: &str, v: &str) -> Self {
        self.0["metadata"]["labels"][k] = json!(v);
        self
    }
    pub(super) fn owner(mut self, uid: &str) -> Self {
        self.0["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1",
            "kind": "ReplicaSet", "name": "rs", "uid": uid, "controller": true}]);
        self
    }
    pub(super) fn node_selector(mut self, k: &str, v: &str) -> Self {
        self.0["spec"]["nodeSelector"][k] = json!(v);
        self
    }
    pub(super) fn required_node_affinity(mut self, terms: Value) -> Self {
        self.0["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] =
            json!({"nodeSelectorTerms": terms});
        self
    }
    pub(super) fn preferred_node_affinity(mut self, weight: i32, expr: Value) -> Self {
        self.0["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] =
            json!([{"weight": weight, "preference": {"matchExpressions": [expr]}}]);
        self
    }
    pub(super) fn tolerate(mut self, toleration: Value) -> Self {
        match self.0["spec"]["tolerations"].as_array_mut() {
            Some(list) => list.push(toleration),
            None => self.0["spec"]["tolerations"] = json!([toleration]),
        }
        self
    }
    pub(super) fn anti_affinity(mut self, app: &str) -> Self {
        self.0["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] = json!([{
                "labelSelector": {"matchLabels": {"app": app}},
                "topologyKey": "kubernetes.io/hostname"}]);
        self
    }
    pub(super) fn info(self) -> Arc<PodInfo> {
        Arc::new(PodInfo::new(Arc::new(
            serde_json::from_value(self.0).expect("valid pod fixture"),
        )))
    }
}

/// A snapshot of `nodes`, with each of `placed` on its node.
pub(super) fn snapshot(nodes: Vec<NodeFixture>, placed: Vec<(PodFixture, &str)>) -> Snapshot {
    let mut snap = Snapshot::default();
    for n in nodes {
        snap.apply_node(n.build());
    }
    for (p, node) in placed {
        snap.place(p.info(), node);
    }
    snap
}

/// Default nodes named `names`.
pub(super) fn nodes(names: &[&str]) -> Vec<NodeFixture> {
    names.iter().map(|n| NodeFixture::new(n)).collect()
}

/// `pod` with volume `data` from claim `claim`.
pub(super) fn claim_volume(mut pod: PodFixture, claim: &str) -> PodFixture {
    pod.0["spec"]["volumes"] =
        json!([{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]);
    pod
}
