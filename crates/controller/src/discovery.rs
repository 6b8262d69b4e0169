//! What this cluster advertises for discovery (`tandem_core::discovery`): its identity, API
//! endpoint, CA fingerprint, protocol version, and the region and zone its nodes share.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;
use tandem_core::discovery::{Advertisement, fingerprint};

use crate::identity::ClusterIdentity;

/// The node labels a cluster's region and zone come from.
pub const REGION_LABEL: &str = "topology.kubernetes.io/region";
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// Why the advertisement could not be made.
#[derive(Debug, thiserror::Error)]
pub enum AdvertiseError {
    #[error("reading this cluster's identity (is Tandem installed? `tandem install`)")]
    Identity(#[source] crate::identity::IdentityError),
    #[error("listing Nodes for their region and zone")]
    Nodes(#[source] kube::Error),
    #[error("the API CA is not a PEM certificate")]
    Ca,
}

/// The fingerprint of the first certificate of `pem` (the CA consumers verify this cluster's
/// API with), as `openssl x509 -fingerprint -sha256` prints its digits.
pub fn ca_fingerprint(pem: &str) -> Option<String> {
    let der = CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()?
        .ok()?;
    Some(fingerprint(der.as_ref()))
}

/// The value of `label` on every Node (not virtual ones), if they all agree.
fn shared_label(nodes: &[Node], label: &str) -> Option<String> {
    let values: BTreeSet<Option<&String>> = nodes
        .iter()
        .filter(|n| {
            n.metadata
                .labels
                .as_ref()
                .is_none_or(|l| !l.contains_key(tandem_api::names::NODE_TYPE_LABEL))
        })
        .map(|n| n.metadata.labels.as_ref().and_then(|l| l.get(label)))
        .collect();
    match values.into_iter().collect::<Vec<_>>().as_slice() {
        [Some(v)] => Some((*v).clone()),
        _ => None,
    }
}

/// This cluster's advertisement, reached at `endpoint` and verified with `ca_pem`.
pub async fn advertisement(
    client: &kube::Client,
    endpoint: &str,
    ca_pem: &str,
) -> Result<Advertisement, AdvertiseError> {
    let identity = ClusterIdentity::load(client)
        .await
        .map_err(AdvertiseError::Identity)?;
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(AdvertiseError::Nodes)?
        .items;
    Ok(Advertisement {
        cluster_id: identity.cluster_id,
        endpoint: endpoint.trim_end_matches('/').to_string(),
        ca_fingerprint: ca_fingerprint(ca_pem).ok_or(AdvertiseError::Ca)?,
        protocol_version: tandem_core::protocol::VERSION,
        region: shared_label(&nodes, REGION_LABEL),
        zone: shared_label(&nodes, ZONE_LABEL),
    })
}
