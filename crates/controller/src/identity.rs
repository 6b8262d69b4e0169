//! The cluster identity: this cluster's ID and ECDSA P-256 key pair, kept in the Secret
//! `tandem-system/tandem-cluster-identity`. The key signs the CSR of every peer identity the
//! cluster asks a provider for, so a consumer proves it holds it.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use tandem_api::client;
use tandem_api::names;

/// This cluster's ID and key pair.
#[derive(Clone)]
pub struct ClusterIdentity {
    pub cluster_id: String,
    pub private_key_pem: String,
    pub public_key_pem: String,
}

impl std::fmt::Debug for ClusterIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the private key.
        f.debug_struct("ClusterIdentity")
            .field("cluster_id", &self.cluster_id)
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error(
        "reading Secret {ns}/{name} (is Tandem installed? run `tandem install`)",
        ns = names::SYSTEM_NAMESPACE,
        name = names::IDENTITY_SECRET
    )]
    Read {
        #[source]
        source: kube::Error,
    },
    #[error("Secret {ns}/{name} lacks key {key:?}", ns = names::SYSTEM_NAMESPACE, name = names::IDENTITY_SECRET)]
    Missing { key: &'static str },
    #[error("invalid cluster ID: {0}")]
    InvalidId(String),
    #[error("generating the cluster key")]
    Key(#[source] rcgen::Error),
    #[error("creating Secret {ns}/{name}", ns = names::SYSTEM_NAMESPACE, name = names::IDENTITY_SECRET)]
    Create {
        #[source]
        source: kube::Error,
    },
    #[error(
        "this cluster is already installed as {existing:?}; a cluster's ID cannot change (uninstall first)"
    )]
    IdMismatch { existing: String },
}

impl ClusterIdentity {
    /// Reads the identity Secret.
    pub async fn load(client: &Client) -> Result<ClusterIdentity, IdentityError> {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), names::SYSTEM_NAMESPACE);
        let secret = secrets
            .get(names::IDENTITY_SECRET)
            .await
            .map_err(|source| IdentityError::Read { source })?;
        Self::from_secret(&secret)
    }

    fn from_secret(secret: &Secret) -> Result<ClusterIdentity, IdentityError> {
        let data = secret.data.clone().unwrap_or_default();
        let get = |key: &'static str| {
            data.get(key)
                .map(|v| String::from_utf8_lossy(&v.0).into_owned())
                .ok_or(IdentityError::Missing { key })
        };
        Ok(ClusterIdentity {
            cluster_id: get(names::IDENTITY_KEY_CLUSTER_ID)?,
            private_key_pem: get(names::IDENTITY_KEY_PRIVATE_KEY)?,
            public_key_pem: get(names::IDENTITY_KEY_PUBLIC_KEY)?,
        })
    }

    /// Loads the identity, creating it with `cluster_id` (or a generated ID) if there is none.
    /// Idempotent; refuses to change the ID of an installed cluster.
    pub async fn ensure(
        client: &Client,
        cluster_id: Option<&str>,
    ) -> Result<ClusterIdentity, IdentityError> {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), names::SYSTEM_NAMESPACE);
        if let Some(existing) = secrets
            .get_opt(names::IDENTITY_SECRET)
            .await
            .map_err(|source| IdentityError::Read { source })?
        {
            let identity = Self::from_secret(&existing)?;
            if let Some(id) = cluster_id
                && id != identity.cluster_id
            {
                return Err(IdentityError::IdMismatch {
                    existing: identity.cluster_id,
                });
            }
            return Ok(identity);
        }
        let cluster_id = match cluster_id {
            Some(id) => id.to_string(),
            None => generated_id(),
        };
        names::validate_cluster_id(&cluster_id)
            .map_err(|e| IdentityError::InvalidId(e.to_string()))?;
        let key = rcgen::KeyPair::generate().map_err(IdentityError::Key)?;
        let identity = ClusterIdentity {
            cluster_id,
            private_key_pem: key.serialize_pem(),
            public_key_pem: key.public_key_pem(),
        };
        let data: BTreeMap<String, ByteString> = [
            (names::IDENTITY_KEY_CLUSTER_ID, &identity.cluster_id),
            (names::IDENTITY_KEY_PRIVATE_KEY, &identity.private_key_pem),
            (names::IDENTITY_KEY_PUBLIC_KEY, &identity.public_key_pem),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
        .collect();
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(names::IDENTITY_SECRET.into()),
                namespace: Some(names::SYSTEM_NAMESPACE.into()),
                labels: Some(
                    [(
                        names::MANAGED_BY_LABEL.to_string(),
                        names::MANAGED_BY.to_string(),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
            data: Some(data),
            ..Default::default()
        };
        match secrets.create(&PostParams::default(), &secret).await {
            Ok(created) => Self::from_secret(&created),
            // Another installer won the race: use what it stored.
            Err(e) if client::is_conflict(&e) => Self::load(client).await,
            Err(source) => Err(IdentityError::Create { source }),
        }
        .inspect(|id| tracing::info!(cluster_id = %id.cluster_id, secret = %secret.name_any(), "cluster identity created"))
    }
}

/// A readable random ID such as `cluster-7f3a9c`.
fn generated_id() -> String {
    use rand::Rng;
    let n: u32 = rand::rng().random_range(0..0x100_0000);
    format!("cluster-{n:06x}")
}
