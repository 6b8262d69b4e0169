//! Multi-cluster services: the upstream MCS API kinds (KEP-1645, `multicluster.x-k8s.io`
//! v1alpha1; KEP-2149's `ClusterProperty`), typed for clients, and `ExportedService`, the
//! record in which one cluster hands its exports to a peer through their tenant namespace.
//!
//! The upstream kinds' CRDs are not generated from these types: `tandem install` applies the
//! upstream project's own YAML (`deploy/mcs/`), so schema and printer columns are theirs.

use k8s_openapi::api::core::v1::SessionAffinityConfig;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of ServiceExport and ServiceImport.
pub const MCS_GROUP: &str = "multicluster.x-k8s.io";
/// The API group of ClusterProperty.
pub const ABOUT_GROUP: &str = "about.k8s.io";
/// The ClusterProperty holding the cluster's ID (KEP-2149).
pub const CLUSTER_ID_PROPERTY: &str = "cluster.clusterset.k8s.io";
/// The domain of multi-cluster names.
pub const CLUSTERSET_DOMAIN: &str = "clusterset.local";
/// Label of an import's EndpointSlices: the exported Service's name.
pub const SERVICE_NAME_LABEL: &str = "multicluster.kubernetes.io/service-name";
/// Label of an import's EndpointSlices: the cluster the endpoints are in.
pub const SOURCE_CLUSTER_LABEL: &str = "multicluster.kubernetes.io/source-cluster";

/// ServiceExport condition types and reasons (upstream `serviceexport.go`).
pub mod export_condition {
    pub const VALID: &str = "Valid";
    pub const READY: &str = "Ready";
    pub const CONFLICT: &str = "Conflict";
}

/// Declares that the Service of the same name and namespace is exported to the clusterset.
/// Written by hand rather than derived: a ServiceExport usually has no `spec` at all
/// (`kubectl create` of just its name), which the derived type would refuse to read.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ServiceExport {
    #[serde(default = "export_api_version")]
    pub api_version: String,
    #[serde(default = "export_kind")]
    pub kind: String,
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ServiceExportStatus>,
}

impl kube::Resource for ServiceExport {
    type DynamicType = ();
    type Scope = kube::core::NamespaceResourceScope;

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "ServiceExport".into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        MCS_GROUP.into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1alpha1".into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "serviceexports".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

fn export_api_version() -> String {
    format!("{MCS_GROUP}/v1alpha1")
}

fn export_kind() -> String {
    "ServiceExport".into()
}

impl ServiceExport {
    /// A ServiceExport of the Service `name` (its namespace is the API's).
    pub fn new(name: &str) -> ServiceExport {
        ServiceExport {
            api_version: export_api_version(),
            kind: export_kind(),
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..Default::default()
            },
            ..Default::default()
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ServiceExportStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A Service imported from the clusterset.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[kube(
    group = "multicluster.x-k8s.io",
    version = "v1alpha1",
    kind = "ServiceImport",
    namespaced,
    status = "ServiceImportStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct ServiceImportSpec {
    #[serde(default)]
    pub ports: Vec<ServicePort>,
    /// The import's IP (the derived Service's ClusterIP), for ClusterSetIP imports.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<String>,
    /// ClusterSetIP or Headless.
    #[serde(rename = "type")]
    pub type_: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_affinity: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_affinity_config: Option<SessionAffinityConfig>,
}

/// A port of a ServiceImport.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServicePort {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_protocol: Option<String>,
    pub port: i32,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ServiceImportStatus {
    /// The clusters the import's endpoints come from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<ClusterStatus>,
    /// `Ready` (reasons Ready, Pending).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ClusterStatus {
    pub cluster: String,
}

/// A property of this cluster (KEP-2149), cluster-scoped; `cluster.clusterset.k8s.io` holds
/// its ID.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[kube(
    group = "about.k8s.io",
    version = "v1alpha1",
    kind = "ClusterProperty",
    schema = "disabled"
)]
pub struct ClusterPropertySpec {
    pub value: String,
}

/// One cluster's export of a Service, handed to a peer: written by the exporting cluster in
/// the tenant namespace of the peering (the provider's `tandem-tenant-<consumer>`, by the
/// consumer with its peer identity or by the provider itself), read by the other side, which
/// alone decides what it imports. Named `<clusterID>.<namespace>.<service>`.
#[derive(CustomResource, Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "tandem.dev",
    version = "v1alpha1",
    kind = "ExportedService",
    namespaced,
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.clusterID"}"#,
    printcolumn = r#"{"name":"Namespace","type":"string","jsonPath":".spec.namespace"}"#,
    printcolumn = r#"{"name":"Service","type":"string","jsonPath":".spec.service"}"#,
    printcolumn = r#"{"name":"Type","type":"string","jsonPath":".spec.type"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ExportedServiceSpec {
    /// The exporting cluster.
    #[serde(rename = "clusterID")]
    #[schemars(transform = crate::schema::cluster_id)]
    pub cluster_id: String,
    #[schemars(transform = crate::schema::namespace)]
    pub namespace: String,
    #[schemars(transform = crate::schema::object_name)]
    pub service: String,
    /// When the ServiceExport was created: the oldest export wins conflicts.
    pub exported_at: Time,
    /// ClusterSetIP or Headless.
    #[serde(rename = "type")]
    #[schemars(transform = crate::schema::import_type)]
    pub type_: String,
    /// The Service's ports.
    #[serde(default)]
    pub ports: Vec<ServicePort>,
    /// None or ClientIP, and its timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_affinity: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_affinity_timeout_seconds: Option<i32>,
    /// The Service's endpoints, addressed in the exporting cluster's pod CIDR; the importer
    /// translates them into its own view of that CIDR and drops anything outside it.
    #[serde(default)]
    pub endpoint_slices: Vec<ExportedSlice>,
}

/// A group of endpoints sharing their ports, as in an EndpointSlice.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ExportedSlice {
    /// The endpoints' (target) ports, named as the Service's ports.
    #[serde(default)]
    pub ports: Vec<ServicePort>,
    #[serde(default)]
    pub endpoints: Vec<ExportedEndpoint>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ExportedEndpoint {
    pub addresses: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    pub ready: bool,
}

/// The name of `cluster`'s record of its export of `namespace/service`.
pub fn exported_service_name(cluster: &str, namespace: &str, service: &str) -> String {
    format!("{cluster}.{namespace}.{service}")
}
