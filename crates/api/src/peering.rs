//! `Peering`: the consumer's record of one provider it offloads to (cluster-scoped, named after
//! the provider's cluster ID). `tandem peer INVITE` creates it; the consumer's controller carries
//! the invite flow, the negotiation and the virtual node from it.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What the consumer knows of a provider it peers with.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "tandem.dev",
    version = "v1alpha1",
    kind = "Peering",
    status = "PeeringStatus",
    shortname = "peer",
    printcolumn = r#"{"name":"Provider","type":"string","jsonPath":".spec.clusterID"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Virtual node","type":"string","jsonPath":".status.virtualNode"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct PeeringSpec {
    /// The provider's cluster ID (also this object's name).
    #[serde(rename = "clusterID")]
    #[schemars(transform = crate::schema::cluster_id)]
    pub cluster_id: String,
    /// The provider's API endpoint (https://host:port) from the invite.
    #[schemars(transform = crate::schema::https_url)]
    pub endpoint: String,
    /// PEM of the CA that signs the provider's API serving certificate, from the invite.
    #[schemars(transform = crate::schema::pem_certificate)]
    pub ca_data: String,
    /// Secret in the tenant namespace holding the invite token (removed once authenticated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::object_name)]
    pub invite_secret: Option<String>,
    /// `host:port` of the status API of this cluster's gateway to the provider (its
    /// `statusListen`). When set, the virtual node's NetworkUnavailable condition follows the
    /// tunnel's health as the gateway reports it on `/status`; when absent, networking is not
    /// managed by Tandem and the virtual node has no such condition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::host_port)]
    pub gateway_status: Option<String>,
    /// The namespaces of this cluster its admin opts in for this peer's exported Services:
    /// there they become ServiceImports (the namespace must exist) and may join this
    /// cluster's own export of the same name. Besides these, a peer's exports are imported
    /// only in its own twin namespace of the same name (never joining an own export there),
    /// and in namespaces annotated `mcs.tandem.dev/import-from` with its cluster ID (or `*`).
    /// Tenant namespaces never receive imports. When this cluster both consumes from and
    /// provides to the peer, a namespace listed by its Peering or its Tenant is opted in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_import_namespaces: Option<Vec<String>>,
    /// How the virtual node follows the provider's health (absent: the controller's defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_health: Option<NodeHealth>,
}

/// How often the provider is probed and when the virtual node gives up on it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeHealth {
    /// How often the provider's API is probed and the virtual node's Lease renewed
    /// [default: the controller's `--heartbeat-seconds`, 2]. A duration: `500ms`, `2s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::duration)]
    pub probe_period: Option<String>,
    /// How long the provider may leave probes unanswered before the virtual node turns
    /// NotReady [default: the controller's `--provider-grace-seconds`, 6]. Pods there are then evicted
    /// after their `tolerationSeconds` (see NamespaceOffloading `evictAfter`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::duration)]
    pub not_ready_after: Option<String>,
}

/// What the consumer's controller observed and negotiated.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PeeringStatus {
    /// Pending, Authenticating, Established, Failed or Unpeering.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Authenticated, ResourcesGranted, NetworkNegotiated, ProviderReachable, VirtualNodeReady.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Vec<Condition>,
    /// Secret (tenant namespace) with the peer identity: a kubeconfig for the provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::object_name)]
    pub identity_secret: Option<String>,
    /// The tenant namespace the provider created for us.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::namespace)]
    pub remote_tenant_namespace: Option<String>,
    /// Resources the provider granted (capacity of the virtual node).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "crate::schema::resource_quantities")]
    pub granted: BTreeMap<String, Quantity>,
    /// Labels the provider suggested for the virtual node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "crate::schema::labels")]
    pub node_labels: BTreeMap<String, String>,
    /// Name of the virtual node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::object_name)]
    pub virtual_node: Option<String>,
    /// The negotiated network parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<PeeringNetwork>,
}

/// The network view of a peering from the consumer's side.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PeeringNetwork {
    /// The provider's pod CIDR as the provider sees it.
    #[schemars(transform = crate::schema::cidr)]
    pub remote_pod_cidr: String,
    /// The CIDR the consumer uses for the provider's pods (remapped if it collided).
    #[schemars(transform = crate::schema::cidr)]
    pub remapped_remote_pod_cidr: String,
    /// The provider's external CIDR, and how the consumer maps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::cidr)]
    pub remote_external_cidr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::cidr)]
    pub remapped_remote_external_cidr: Option<String>,
    /// The CIDR the provider uses for our pods (its remap of our pod CIDR).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::cidr)]
    pub local_pod_cidr_in_remote: Option<String>,
    /// The CIDR the provider uses for our external CIDR (its remap of it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::cidr)]
    pub local_external_cidr_in_remote: Option<String>,
    /// The provider gateway's endpoint and WireGuard public key, when networking is enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::host_port)]
    pub remote_gateway_endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::wireguard_key)]
    pub remote_public_key: Option<String>,
}
