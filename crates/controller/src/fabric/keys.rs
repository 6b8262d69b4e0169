//! This cluster's WireGuard key for each peer, in the Secret `tandem-system/tandem-gateway-<peer>`:
//! generated on first need, rotated on request, never sent anywhere (only its public key
//! travels); and whether a peer still needs it.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, PostParams};
use tandem_api::{Peering, Tenant, client, names};

pub use tandem_api::names::{GATEWAY_CONFIG, GATEWAY_PRIVATE_KEY as PRIVATE_KEY, gateway_secret};

/// Why the gateway key for a peer could not be had.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("Secret {ns}/{name}", ns = names::SYSTEM_NAMESPACE)]
    Api {
        name: String,
        #[source]
        source: kube::Error,
    },
    /// The Secret exists but holds no valid key: it is left as it is (an admin may have put
    /// it there); deleting it makes a new key.
    #[error(
        "Secret {ns}/{name} has no valid WireGuard private key under {PRIVATE_KEY:?} ({reason}); \
         delete it to have a new key generated",
        ns = names::SYSTEM_NAMESPACE
    )]
    Invalid { name: String, reason: String },
}

/// This cluster's WireGuard key pair for one peer (base64).
#[derive(Clone)]
pub struct GatewayKey {
    pub private_key: String,
    pub public_key: String,
}

impl std::fmt::Debug for GatewayKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The private key is deliberately left out.
        f.debug_struct("GatewayKey")
            .field("public_key", &self.public_key)
            .finish_non_exhaustive()
    }
}

/// This cluster's gateway key for `peer`, generating and storing it on first use. Idempotent;
/// concurrent callers end with the same key.
pub async fn ensure_gateway_key(client: &kube::Client, peer: &str) -> Result<GatewayKey, KeyError> {
    let name = gateway_secret(peer);
    let api: Api<Secret> = Api::namespaced(client.clone(), names::SYSTEM_NAMESPACE);
    let api_err = |source| KeyError::Api {
        name: name.clone(),
        source,
    };
    let secret = match api.get_opt(&name).await.map_err(api_err)? {
        Some(s) => s,
        None => {
            let private = tandem_netspec::generate_private_key();
            let secret = Secret {
                metadata: kube::api::ObjectMeta {
                    name: Some(name.clone()),
                    labels: Some(BTreeMap::from([
                        (names::MANAGED_BY_LABEL.into(), names::MANAGED_BY.into()),
                        (names::REMOTE_CLUSTER_LABEL.into(), peer.into()),
                    ])),
                    ..Default::default()
                },
                type_: Some("Opaque".into()),
                data: Some(BTreeMap::from([(
                    PRIVATE_KEY.into(),
                    ByteString(private.into_bytes()),
                )])),
                ..Default::default()
            };
            match api.create(&PostParams::default(), &secret).await {
                Ok(s) => s,
                // Another reconciler made it first: use theirs.
                Err(e) if client::is_conflict(&e) => api.get(&name).await.map_err(api_err)?,
                Err(e) => return Err(api_err(e)),
            }
        }
    };
    key_of(&secret, &name)
}

/// This cluster's gateway key for `peer`, from the watched Secret when there is one (the
/// provider's network sweep asks for every Tenant every second), else as
/// [`ensure_gateway_key`] makes it.
pub async fn gateway_key(ctx: &crate::context::Ctx, peer: &str) -> Result<GatewayKey, KeyError> {
    match ctx.gateways.secrets.get(&gateway_secret(peer)) {
        Some(Some(secret)) => key_of(&secret, &gateway_secret(peer)),
        _ => ensure_gateway_key(&ctx.client, peer).await,
    }
}

/// The key pair in the gateway key Secret `name`.
fn key_of(secret: &Secret, name: &str) -> Result<GatewayKey, KeyError> {
    let invalid = |reason: String| KeyError::Invalid {
        name: name.to_string(),
        reason,
    };
    let private = secret
        .data
        .as_ref()
        .and_then(|d| d.get(PRIVATE_KEY))
        .ok_or_else(|| invalid("missing".into()))?;
    let private = std::str::from_utf8(&private.0)
        .map_err(|e| invalid(e.to_string()))?
        .trim();
    let public_key = tandem_netspec::public_key(private).map_err(|e| invalid(e.to_string()))?;
    Ok(GatewayKey {
        private_key: private.to_string(),
        public_key,
    })
}

/// Replaces this cluster's gateway key for `peer` with a new one (`tandem rotate
/// wireguard-keys`). The rest follows from the Secret: the next sweeps publish the new public
/// key to the peer (this side's `NetworkParameters`) and write the gateway's configuration,
/// and each gateway restarts its data path when its configuration changes; offloaded pods
/// keep running, and the tunnel is down only between the two gateways' restarts (seconds).
/// Fails with a conflict if the Secret changed since it was read (no key is lost to a race).
pub async fn rotate_gateway_key(client: &kube::Client, peer: &str) -> Result<GatewayKey, KeyError> {
    let name = gateway_secret(peer);
    let api: Api<Secret> = Api::namespaced(client.clone(), names::SYSTEM_NAMESPACE);
    let api_err = |source| KeyError::Api {
        name: name.clone(),
        source,
    };
    let mut secret = api.get(&name).await.map_err(api_err)?;
    let private = tandem_netspec::generate_private_key();
    let public_key = tandem_netspec::public_key(&private).map_err(|e| KeyError::Invalid {
        name: name.clone(),
        reason: e.to_string(),
    })?;
    secret
        .data
        .get_or_insert_with(BTreeMap::new)
        .insert(PRIVATE_KEY.into(), ByteString(private.clone().into_bytes()));
    // A replace carries the resourceVersion read: a concurrent change makes it fail.
    api.replace(&name, &PostParams::default(), &secret)
        .await
        .map_err(api_err)?;
    Ok(GatewayKey {
        private_key: private,
        public_key,
    })
}

/// Whether a peering with `peer` is left in either direction (a Peering to it, or a Tenant
/// of it, not being deleted); with `peer` None, whether any peering is left.
pub(crate) async fn live_relation(
    client: &kube::Client,
    peer: Option<&str>,
) -> Result<bool, kube::Error> {
    let live_peering = Api::<Peering>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .any(|p| {
            p.metadata.deletion_timestamp.is_none()
                && peer.is_none_or(|peer| p.spec.cluster_id == peer)
        });
    let live_tenant = Api::<Tenant>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .any(|t| {
            t.metadata.deletion_timestamp.is_none()
                && peer.is_none_or(|peer| t.spec.cluster_id == peer)
        });
    Ok(live_peering || live_tenant)
}
