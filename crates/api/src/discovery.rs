//! `DiscoveredCluster`: a cluster this one found advertising itself for peering (DNS-SD over
//! multicast DNS on the LAN, or under a DNS domain across the WAN), cluster-scoped and named
//! after the cluster ID it claims. Discovery writes it; `tandem discover` reads it. Nothing in
//! it is trusted: the ID is self-asserted, and the CA fingerprint is for an administrator to
//! confirm out of band before peering.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a cluster was found.
pub const SOURCE_DNS: &str = "DNS";
pub const SOURCE_MDNS: &str = "mDNS";

/// At most this many DiscoveredClusters exist: discovery records no more (a LAN full of
/// answers cannot fill the API server), and says so.
pub const MAX_DISCOVERED: usize = 256;

/// What was last heard from one advertising cluster. Every field is observed, none is
/// desired: the object is an observation record (like an EndpointSlice), rewritten whole at
/// each sighting.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "tandem.dev",
    version = "v1alpha1",
    kind = "DiscoveredCluster",
    printcolumn = r#"{"name":"Endpoint","type":"string","jsonPath":".spec.endpoint"}"#,
    printcolumn = r#"{"name":"Source","type":"string","jsonPath":".spec.source"}"#,
    printcolumn = r#"{"name":"Region","type":"string","jsonPath":".spec.region"}"#,
    printcolumn = r#"{"name":"Last seen","type":"date","jsonPath":".spec.lastSeen"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveredClusterSpec {
    /// The cluster ID it advertises (also this object's name). Self-asserted.
    #[serde(rename = "clusterID")]
    #[schemars(transform = crate::schema::cluster_id)]
    pub cluster_id: String,
    /// Its API endpoint (https://host:port).
    #[schemars(transform = crate::schema::https_url)]
    pub endpoint: String,
    /// SHA-256 of its API CA certificate's DER: `sha256:` and 64 lower-case hex digits.
    #[schemars(transform = crate::schema::ca_fingerprint)]
    pub ca_fingerprint: String,
    /// The peering protocol version it speaks.
    pub protocol_version: u32,
    /// `topology.kubernetes.io/region` of its nodes, when they agree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::label_value)]
    pub region: Option<String>,
    /// `topology.kubernetes.io/zone` of its nodes, when they agree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::label_value)]
    pub zone: Option<String>,
    /// How it was found: `DNS` (under `domain`) or `mDNS`.
    #[schemars(regex(pattern = "^(DNS|mDNS)$"))]
    pub source: String,
    /// The DNS domain it was found under (source DNS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub domain: Option<String>,
    /// When it was last seen (RFC 3339).
    pub last_seen: String,
    /// How long a sighting holds (the records' TTL): not seen again within it, the cluster
    /// counts as gone.
    pub ttl_seconds: u32,
    /// The enrollment credential it advertises (`<id>.<secret>`), with which `tandem peer
    /// --discovered` files a peering request. Public by design: it can file a bounded number
    /// of requests that wait for approval, and nothing else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = "^[a-z0-9]{6}\\.[a-z0-9]{16}$"))]
    pub enrollment_token: Option<String>,
}
