//! `NamespaceOffloading`: makes a consumer namespace offloaded — which providers get a twin
//! namespace, how it is named, and where the namespace's pods may be scheduled.

use k8s_openapi::api::core::v1::NodeSelector;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Offloading of the namespace it lives in; must be named `offloading`.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "tandem.dev",
    version = "v1alpha1",
    kind = "NamespaceOffloading",
    namespaced,
    status = "NamespaceOffloadingStatus",
    shortname = "nso",
    printcolumn = r#"{"name":"Pods","type":"string","jsonPath":".spec.podOffloadingStrategy"}"#,
    printcolumn = r#"{"name":"Mapping","type":"string","jsonPath":".spec.namespaceMappingStrategy"}"#,
    printcolumn = r#"{"name":"Partition","type":"string","jsonPath":".spec.partitionPolicy"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceOffloadingSpec {
    /// How the twin namespace is named on providers.
    #[serde(default)]
    pub namespace_mapping_strategy: NamespaceMappingStrategy,
    /// The twin namespace's name with `SelectedName`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::namespace)]
    pub remote_namespace_name: Option<String>,
    /// Where the namespace's pods may run.
    #[serde(default)]
    pub pod_offloading_strategy: PodOffloadingStrategy,
    /// Which virtual nodes (by their labels) are eligible; none means all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::node_selector")]
    pub cluster_selector: Option<NodeSelector>,
    /// How long the namespace's pods stay bound to a node that failed (NotReady, or its
    /// provider unreachable) before they are evicted and replaced elsewhere: the
    /// `tolerationSeconds` of their `node.kubernetes.io/not-ready` and `unreachable`
    /// tolerations, set when each pod is created — before its node is known, so it holds on
    /// local nodes too. A bound the pod's author set is kept. Absent: Kubernetes' 300 s.
    /// Pods created before a change keep theirs. A duration: `30s`, `2m`, `1m30s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::duration)]
    pub evict_after: Option<String>,
    /// What happens to the namespace's pods on a provider this cluster loses: `Keep` (they run
    /// on there, and the provider keeps them alive) or `Fence` (the provider stops them once
    /// this cluster has not renewed its fence lease for `fenceAfter`, and this cluster, knowing
    /// that bound, then deletes them here so that their controllers replace them elsewhere:
    /// never two copies at once). Set on pods as they are created.
    #[serde(default)]
    pub partition_policy: PartitionPolicy,
    /// With `Fence`: how long the provider keeps the pods running without word from this
    /// cluster. This cluster replaces them about `fenceAfter` + 1 % + 5 s after it last heard
    /// from the provider. Keep it well above the providers' probe period (a renewal takes up
    /// to two of them: 2 s each by default) and above the time a controller takes to restart
    /// (a provider controller down longer fences the pods). A duration: `10s`, `1m`; default
    /// 30s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::duration)]
    pub fence_after: Option<String>,
}

/// `fenceAfter` when a `Fence` offloading does not say.
pub const DEFAULT_FENCE_AFTER: &str = "30s";

/// What a partition does to the pods of an offloaded namespace running on the lost provider.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub enum PartitionPolicy {
    /// They keep running there; their replacements here may run at the same time.
    #[default]
    Keep,
    /// They are stopped there after `fenceAfter`, and only then replaced.
    Fence,
}

/// The twin namespace on `provider` of an offloaded namespace, once Ready.
pub fn twin_of(nso: &NamespaceOffloading, provider: &str) -> Option<String> {
    nso.status
        .as_ref()?
        .remote_namespaces
        .iter()
        .find(|r| r.cluster_id == provider && r.phase == "Ready")
        .map(|r| r.namespace.clone())
}

impl NamespaceOffloadingSpec {
    /// The `fenceAfter` of a `Fence` offloading (None with `Keep`).
    pub fn fence_after(&self) -> Option<&str> {
        (self.partition_policy == PartitionPolicy::Fence)
            .then(|| self.fence_after.as_deref().unwrap_or(DEFAULT_FENCE_AFTER))
    }
}

/// Naming of twin namespaces.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub enum NamespaceMappingStrategy {
    /// `<namespace>-<consumer cluster ID>`.
    #[default]
    DefaultName,
    /// The same name as in the consumer. Needed for StatefulSets: their pods keep their names
    /// on providers, and `<pod>.<service>.<namespace>.svc` resolves there only if the twin
    /// namespace has the namespace's name (the reflected headless Service selects them).
    EnforceSameName,
    /// `spec.remoteNamespaceName`.
    SelectedName,
}

/// Placement of an offloaded namespace's pods.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub enum PodOffloadingStrategy {
    /// Only on local nodes.
    Local,
    /// Only on (selected) virtual nodes.
    Remote,
    /// On local nodes and selected virtual nodes.
    #[default]
    LocalAndRemote,
}

/// Where the namespace is offloaded.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceOffloadingStatus {
    /// Ready when every selected provider has its twin namespace; Pending, Failed, Terminating.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// One entry per selected provider.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remote_namespaces: Vec<RemoteNamespaceStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Vec<Condition>,
}

/// The twin namespace on one provider.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RemoteNamespaceStatus {
    #[serde(rename = "clusterID")]
    #[schemars(transform = crate::schema::cluster_id)]
    pub cluster_id: String,
    #[schemars(transform = crate::schema::namespace)]
    pub namespace: String,
    /// Pending, Ready or Failed.
    pub phase: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
