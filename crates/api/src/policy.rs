//! `PeeringPolicy`: a provider's standing answer to peering requests filed through discovery
//! (with the enrollment credential, not an invite). A request whose consumer key matches one of
//! a policy's entries is approved with the policy's terms; no policy matching means an
//! administrator approves or denies it (`tandem approve` / `tandem deny`). Invites are not
//! affected: an invite is an approval given in advance.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{NamespaceMappingStrategy, PodOffloadingStrategy};

/// Who is approved and on what terms. Cluster-scoped.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "tandem.dev",
    version = "v1alpha1",
    kind = "PeeringPolicy",
    printcolumn = r#"{"name":"Consumers","type":"string","jsonPath":".spec.consumers[*].keyFingerprint"}"#,
    printcolumn = r#"{"name":"Expires","type":"string","jsonPath":".spec.expires"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct PeeringPolicySpec {
    /// The consumers approved automatically. Cluster IDs are self-asserted: an entry matches
    /// by the consumer's key fingerprint, and an entry without one approves nothing.
    #[serde(default)]
    pub consumers: Vec<PolicyConsumer>,
    /// What an approved consumer is granted (cpu, memory, pods, ...). Absent: the cluster's
    /// share (`tandem install --share`), as for an invite.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::resource_quantities")]
    pub grant: Option<BTreeMap<String, Quantity>>,
    /// The namespace mapping strategies the consumer may use for its twin namespaces. Absent:
    /// all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_mapping_strategies: Option<Vec<NamespaceMappingStrategy>>,
    /// The pod offloading strategies the consumer may use. Absent: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_offloading_strategies: Option<Vec<PodOffloadingStrategy>>,
    /// How an approved consumer's pods are charged against its grant (copied to its Tenant's
    /// `podResources`). Absent: the Tenant's defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_resources: Option<crate::PodResources>,
    /// When the policy stops approving (RFC 3339). Peerings it approved stay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
}

/// One consumer a policy approves.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PolicyConsumer {
    /// SHA-256 of the consumer's cluster public key (its SubjectPublicKeyInfo DER), as
    /// `sha256:` and 64 lower-case hex digits; `tandem peer` prints it on the consumer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::ca_fingerprint)]
    pub key_fingerprint: Option<String>,
    /// The cluster ID it must also claim, if set. Never enough on its own.
    #[serde(default, rename = "clusterID", skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::cluster_id)]
    pub cluster_id: Option<String>,
}
