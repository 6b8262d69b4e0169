//! Objects that live in a provider: the request a consumer files with an invite token, the
//! per-consumer tenant record with its resource grant, the network parameters both sides exchange,
//! and the consumer's requests for twin namespaces.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A consumer's request to peer, filed in `tandem-system` with an invite's bootstrap token.
/// Named after the invite's token ID, the only name the token may read back.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "tandem.dev",
    version = "v1alpha1",
    kind = "PeeringRequest",
    namespaced,
    status = "PeeringRequestStatus",
    printcolumn = r#"{"name":"Consumer","type":"string","jsonPath":".spec.clusterID"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct PeeringRequestSpec {
    /// The consumer's cluster ID.
    #[serde(rename = "clusterID")]
    #[schemars(transform = crate::schema::cluster_id)]
    pub cluster_id: String,
    /// ID (public half) of the invite token used.
    #[serde(rename = "tokenID")]
    #[schemars(transform = crate::schema::token_id)]
    pub token_id: String,
    /// hex HMAC-SHA256, keyed with the token secret, over clusterID, tokenID and the CSR: proves
    /// the filer holds the whole token, not just its ID.
    #[schemars(transform = crate::schema::token_proof)]
    pub token_proof: String,
    /// PEM PKCS#10 request signed with the consumer's cluster key (proof of possession).
    #[schemars(transform = crate::schema::pem_csr)]
    pub csr: String,
    /// The peering protocol version the consumer speaks; absent: 1. A provider that cannot
    /// speak it denies the request, naming both versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<u32>,
    /// How the consumer found this provider (`mDNS`, `DNS example.org`, `endpoint`), for the
    /// provider's admin; requests filed with the enrollment credential only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 300))]
    pub source: Option<String>,
}

/// The provider's answer.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PeeringRequestStatus {
    /// Pending, Approved or Denied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Why it was denied, or what is pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// PEM client certificate of the peer identity, once approved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::pem_certificate)]
    pub certificate: Option<String>,
    /// The tenant namespace created for the consumer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::namespace)]
    pub tenant_namespace: Option<String>,
    /// The provider's cluster ID (so the consumer can check it matches the invite).
    #[serde(
        default,
        rename = "providerClusterID",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(transform = crate::schema::cluster_id)]
    pub provider_cluster_id: Option<String>,
    /// A request filed with the enrollment credential: SHA-256 of the consumer's public key
    /// (`sha256:HEX`), as the provider computed it from the CSR.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::ca_fingerprint)]
    pub key_fingerprint: Option<String>,
    /// A request filed with the enrollment credential: the provider admin's decision
    /// (`Approve` or `Deny`, written by `tandem approve` / `tandem deny`), which the controller
    /// carries out. The filer cannot write it: status is dropped on create.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = "^(Approve|Deny)$"))]
    pub decision: Option<String>,
    /// When it was approved or denied (RFC 3339): the cleanup's grace runs from then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub decided_at: Option<String>,
    /// Who approved it: `admin` or `PeeringPolicy/<name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 300))]
    pub approved_by: Option<String>,
}

/// The provider's record of one consumer, in `tandem-tenant-<consumer>`: what it grants it.
/// The provider's admin edits `spec.grant` to grow, shrink or revoke what is shared.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "tandem.dev",
    version = "v1alpha1",
    kind = "Tenant",
    namespaced,
    status = "TenantStatus",
    printcolumn = r#"{"name":"Consumer","type":"string","jsonPath":".spec.clusterID"}"#,
    printcolumn = r#"{"name":"CPU","type":"string","jsonPath":".spec.grant.cpu"}"#,
    printcolumn = r#"{"name":"Memory","type":"string","jsonPath":".spec.grant.memory"}"#,
    printcolumn = r#"{"name":"Pods","type":"string","jsonPath":".spec.grant.pods"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct TenantSpec {
    /// The consumer's cluster ID.
    #[serde(rename = "clusterID")]
    #[schemars(transform = crate::schema::cluster_id)]
    pub cluster_id: String,
    /// Resources granted to the consumer (cpu, memory, pods, optional others); also the quota the
    /// provider enforces on the consumer's pods. Empty revokes the grant.
    #[serde(default)]
    #[schemars(schema_with = "crate::schema::resource_quantities")]
    pub grant: BTreeMap<String, Quantity>,
    /// Labels the provider suggests for the consumer's virtual node (region, zone, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "crate::schema::labels")]
    pub node_labels: BTreeMap<String, String>,
    /// What the consumer may do to its pods running here, besides reading them and their logs
    /// (`kubectl exec`, `attach`, `port-forward` on the consumer reach the real pods). Each is
    /// allowed unless set to false; absent, all are allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_access: Option<PodAccess>,
    /// The namespaces of this cluster its admin opts in for this peer's exported Services:
    /// there they become ServiceImports (the namespace must exist) and may join this
    /// cluster's own export of the same name. Besides these, a peer's exports are imported
    /// only in its own twin namespace of the same name (never joining an own export there),
    /// and in namespaces annotated `mcs.tandem.dev/import-from` with its cluster ID (or `*`).
    /// Tenant namespaces never receive imports. When this cluster both consumes from and
    /// provides to the peer, a namespace listed by its Peering or its Tenant is opted in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_import_namespaces: Option<Vec<String>>,
    /// The namespace mapping strategies the consumer may use for its twin namespaces (set from
    /// the PeeringPolicy that approved it). Absent: `DefaultName` only, whose twins
    /// (`<namespace>-<consumer>`) can never be a namespace this cluster's admin creates later;
    /// same or selected names must be allowed here, and never reach a reserved name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_namespace_mapping_strategies: Option<Vec<crate::NamespaceMappingStrategy>>,
    /// The pod offloading strategies the consumer may use (set from the PeeringPolicy that
    /// approved it). Absent: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_pod_offloading_strategies: Option<Vec<crate::PodOffloadingStrategy>>,
    /// The Pod Security Standards level the consumer's pods are held to here, enforced where
    /// the real pods are made and labelled on its twin namespaces
    /// (`pod-security.kubernetes.io/enforce`). Absent: `baseline`. A peering is never
    /// `privileged`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_security: Option<PodSecurity>,
    /// The most twin namespaces the consumer may have here. Absent: 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_twin_namespaces: Option<u32>,
    /// The Service types the consumer may create in its twin namespaces besides ClusterIP
    /// (headless included). Absent: none — a NodePort or LoadBalancer Service with a
    /// hand-written EndpointSlice would open this cluster's ports to any address inside it,
    /// and an ExternalName one answers any name in the twin. `externalIPs` are never allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_service_types: Option<Vec<GrantableServiceType>>,
    /// The StorageClasses of this cluster the consumer's claims may name. Absent: none, so its
    /// claims get this cluster's default StorageClass. A claim never names a volume, a selector
    /// or a data source, and the storage grant (`requests.storage`, `persistentvolumeclaims`)
    /// bounds the claims of all of its twin namespaces together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_classes: Option<Vec<String>>,
    /// How the consumer's pods are charged against `grant`, and how far their limits may reach
    /// beyond what they are charged. Absent: the defaults of each field (containers that
    /// request nothing are charged 100m cpu and 128Mi memory; limits at most 10 times the cpu
    /// request and 4 times the memory request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_resources: Option<PodResources>,
}

/// How a provider charges a consumer's pods against its grant (a LimitRange for all of the
/// consumer's twin namespaces, enforced where the real pods are made). Requests are counted as
/// kube's ResourceQuota counts them: the containers' sum (sidecars included), at least the
/// largest init container, plus the pod's overhead; `ephemeral-storage` requests count when
/// the grant names `ephemeral-storage`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodResources {
    /// What a container (or init container) requesting none, or zero, of a resource is
    /// charged for it; the amount is written on the real pod as its request, so the
    /// provider's scheduler reserves what the grant is charged. A limit without a request
    /// stands for its request, as in Kubernetes. Absent: `cpu: 100m, memory: 128Mi`; empty:
    /// nothing is charged for a container that requests nothing (only its `pods`). Add
    /// `ephemeral-storage` to charge scratch space too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::resource_quantities")]
    pub default_requests: Option<BTreeMap<String, Quantity>>,
    /// What becomes of a container that requests none of a resource named in
    /// `defaultRequests`: `Charge` (the default) charges it that amount, `Refuse` refuses the
    /// pod, naming the container and the resource.
    #[serde(default)]
    pub without_requests: WithoutRequests,
    /// The most a container's limit may be of its request, per resource (as a LimitRange's
    /// `maxLimitRequestRatio`): a pod whose limit exceeds it is refused, naming the rule, and
    /// a container without a limit gets its request times the ratio as its limit, so that
    /// what a pod can use stays bounded by what it is charged. Ratios below 1 count as 1.
    /// Absent: `cpu: 10, memory: 4`; empty: limits are not bounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::resource_quantities")]
    pub max_limit_request_ratio: Option<BTreeMap<String, Quantity>>,
}

/// What becomes of a container without a request for a resource the provider charges.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub enum WithoutRequests {
    /// Charged the provider's default request.
    #[default]
    Charge,
    /// The pod is refused.
    Refuse,
}

/// The Service types a Tenant may allow besides ClusterIP.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub enum GrantableServiceType {
    NodePort,
    LoadBalancer,
    ExternalName,
}

impl GrantableServiceType {
    /// As a Service's `spec.type` says it.
    pub fn as_str(self) -> &'static str {
        match self {
            GrantableServiceType::NodePort => "NodePort",
            GrantableServiceType::LoadBalancer => "LoadBalancer",
            GrantableServiceType::ExternalName => "ExternalName",
        }
    }
}

impl TenantSpec {
    /// Twin namespaces a consumer may have when its Tenant does not say.
    pub const DEFAULT_MAX_TWIN_NAMESPACES: u32 = 100;
}

/// The Pod Security Standards levels a provider may hold a consumer's pods to.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PodSecurity {
    /// No known privilege escalation (no host namespaces, privileged containers, added
    /// capabilities beyond the runtime's defaults, host paths or ports).
    #[default]
    Baseline,
    /// Hardened: also non-root, every capability dropped but NET_BIND_SERVICE.
    Restricted,
}

/// The interactive access a provider gives a consumer to the real pods of its twin namespaces,
/// each one allowed unless refused here (`false`).
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PodAccess {
    /// `kubectl exec` (pods/exec): run commands in the consumer's pods. Default true.
    #[serde(default = "allowed")]
    pub exec: bool,
    /// `kubectl attach` (pods/attach): attach to their running containers. Default true.
    #[serde(default = "allowed")]
    pub attach: bool,
    /// `kubectl port-forward` (pods/portforward): open connections to their ports. Default true.
    #[serde(default = "allowed")]
    pub port_forward: bool,
}

fn allowed() -> bool {
    true
}

/// Everything allowed, as when `podAccess` (or one of its fields) is absent.
impl Default for PodAccess {
    fn default() -> Self {
        PodAccess {
            exec: true,
            attach: true,
            port_forward: true,
        }
    }
}

impl TenantSpec {
    /// The pod access in force: `podAccess`, or everything allowed when it is absent.
    pub fn pod_access(&self) -> PodAccess {
        self.pod_access.clone().unwrap_or_default()
    }
}

/// What the consumer uses of its grant.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TenantStatus {
    /// Sum of the requests of the consumer's running pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "crate::schema::resource_quantities")]
    pub used: BTreeMap<String, Quantity>,
    /// What the provider's fence stopped (see NamespaceOffloading `partitionPolicy: Fence`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<FenceStatus>,
    /// The certificate last issued to the consumer's peer identity on its renewal request
    /// (a CertificateSigningRequest it filed here before its certificate expires).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewed_identity: Option<RenewedIdentity>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Vec<Condition>,
}

/// A certificate the provider issued to renew the consumer's peer identity.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RenewedIdentity {
    /// The CertificateSigningRequest the consumer filed.
    pub request: String,
    /// The certificate, PEM.
    pub certificate: String,
}

/// What the provider's fence did to the consumer's pods (see NamespaceOffloading
/// `partitionPolicy: Fence`; the nonces themselves live in Leases `tandem-fence` and
/// `tandem-fence-nonce` of this namespace).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FenceStatus {
    /// The consumer's pods stopped by the last fencing (`namespace/name`), until they are gone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fenced_pods: Vec<String>,
}

/// One side's network parameters, in the provider's tenant namespace: `consumer` (written by the
/// consumer) and `provider` (written by the provider). Each side writes into the other's object's
/// status the CIDRs it remapped the other's ranges to.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "tandem.dev",
    version = "v1alpha1",
    kind = "NetworkParameters",
    plural = "networkparameters",
    namespaced,
    status = "NetworkParametersStatus",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.clusterID"}"#,
    printcolumn = r#"{"name":"Pod CIDR","type":"string","jsonPath":".spec.podCIDR"}"#,
    printcolumn = r#"{"name":"Remapped","type":"string","jsonPath":".status.remappedPodCIDR"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct NetworkParametersSpec {
    /// Whose parameters these are.
    #[serde(rename = "clusterID")]
    #[schemars(transform = crate::schema::cluster_id)]
    pub cluster_id: String,
    #[serde(rename = "podCIDR")]
    #[schemars(transform = crate::schema::cidr)]
    pub pod_cidr: String,
    #[serde(
        default,
        rename = "externalCIDR",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(transform = crate::schema::cidr)]
    pub external_cidr: Option<String>,
    /// host:port of this side's gateway, when networking is enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::host_port)]
    pub gateway_endpoint: Option<String>,
    /// Base64 WireGuard public key of this side's gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::wireguard_key)]
    pub public_key: Option<String>,
}

/// How the other side maps these ranges.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkParametersStatus {
    #[serde(
        default,
        rename = "remappedPodCIDR",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(transform = crate::schema::cidr)]
    pub remapped_pod_cidr: Option<String>,
    #[serde(
        default,
        rename = "remappedExternalCIDR",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(transform = crate::schema::cidr)]
    pub remapped_external_cidr: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Vec<Condition>,
}

/// A consumer's request for a twin namespace, in its tenant namespace on the provider. The
/// provider creates the namespace and lets the peer identity work in it; deleting the request
/// removes the namespace.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "tandem.dev",
    version = "v1alpha1",
    kind = "RemoteNamespace",
    namespaced,
    status = "RemoteNamespaceStatusFields",
    printcolumn = r#"{"name":"Namespace","type":"string","jsonPath":".spec.namespace"}"#,
    printcolumn = r#"{"name":"Origin","type":"string","jsonPath":".spec.originNamespace"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct RemoteNamespaceSpec {
    /// Name of the twin namespace to create on the provider.
    #[schemars(transform = crate::schema::namespace)]
    pub namespace: String,
    /// The consumer namespace it mirrors.
    #[schemars(transform = crate::schema::namespace)]
    pub origin_namespace: String,
    /// How the consumer places the namespace's pods (absent from older consumers: not
    /// checked against a Tenant's allowed strategies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_offloading_strategy: Option<crate::PodOffloadingStrategy>,
}

/// Whether the twin namespace is ready for the consumer.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RemoteNamespaceStatusFields {
    /// Pending, Ready or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
