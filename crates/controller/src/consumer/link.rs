//! Links to providers: what the consumer needs to work in one provider (a client with the peer
//! identity, the namespaces, the grant and the network view), derived level-based from the
//! `Peering` objects' status, and the supervisor running the per-provider tasks (virtual node,
//! virtual kubelet, reflection) while a link exists.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::Api;
use kube::{Client, ResourceExt};
use tandem_api::{Peering, conditions, names};
use tokio::sync::watch;

pub use crate::clients::{
    ClientError, PeerClients, client_from_kubeconfig, streaming_client_from_kubeconfig,
};
use crate::context::Ctx;

/// Key of the identity Secret holding the kubeconfig for the provider.
pub const IDENTITY_KUBECONFIG_KEY: &str = "kubeconfig";

/// Name of the Secret (in the consumer's `tandem-tenant-<provider>`) holding the peer identity.
pub fn identity_secret_name(provider_id: &str) -> String {
    format!("tandem-identity-{provider_id}")
}

/// How the two pod CIDRs translate between the clusters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkView {
    /// The provider's pod CIDR as the provider sees it, and as the consumer sees it.
    pub remote_pod_cidr: IpNet,
    pub remote_pod_cidr_here: IpNet,
    /// The consumer's pod CIDR, and as the provider sees it.
    pub local_pod_cidr: Option<IpNet>,
    pub local_pod_cidr_there: Option<IpNet>,
}

/// Everything a per-provider task needs about one provider.
#[derive(Clone)]
pub struct ProviderLink {
    pub provider_id: String,
    pub consumer_id: String,
    /// The provider, as our peer identity.
    pub client: Client,
    /// The same identity without a read timeout, for streams that may idle (`logs -f`, exec).
    pub stream_client: Client,
    /// `tandem-tenant-<consumer>` on the provider.
    pub remote_tenant_namespace: String,
    /// `tandem-tenant-<provider>` here.
    pub local_tenant_namespace: String,
    /// Name of the virtual node standing for the provider.
    pub virtual_node: String,
    /// Resources the provider granted.
    pub grant: BTreeMap<String, Quantity>,
    /// Labels the provider suggests for the virtual node.
    pub node_labels: BTreeMap<String, String>,
    pub network: Option<NetworkView>,
    /// `host:port` of the status API of our gateway to this provider, if networking is managed.
    pub gateway_status: Option<String>,
    /// Changes when the identity changes (tasks holding `client` must restart).
    pub identity_version: String,
    /// How often the virtual node probes the provider, and how long the provider may leave
    /// probes unanswered before the node turns NotReady: the Peering's `nodeHealth`, else the
    /// controller's options.
    pub probe_period: Duration,
    pub not_ready_after: Duration,
}

impl ProviderLink {
    /// The link of the consumer `rome` to `provider`, with a client never used to connect
    /// (made in a Tokio runtime).
    #[cfg(test)]
    pub(crate) fn for_tests(provider: &str) -> ProviderLink {
        let client = Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap()))
            .expect("a client");
        ProviderLink {
            provider_id: provider.into(),
            consumer_id: "rome".into(),
            client: client.clone(),
            stream_client: client,
            remote_tenant_namespace: "tandem-tenant-rome".into(),
            local_tenant_namespace: format!("tandem-tenant-{provider}"),
            virtual_node: format!("tandem-{provider}"),
            grant: BTreeMap::new(),
            node_labels: BTreeMap::new(),
            network: None,
            gateway_status: None,
            identity_version: "1".into(),
            probe_period: Duration::from_secs(2),
            not_ready_after: Duration::from_secs(10),
        }
    }
}

impl std::fmt::Debug for ProviderLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderLink")
            .field("provider_id", &self.provider_id)
            .field("virtual_node", &self.virtual_node)
            .field("grant", &self.grant)
            .field("network", &self.network)
            .finish()
    }
}

/// The established links, by provider ID. Cloning shares the same registry.
#[derive(Clone)]
pub struct Links(Arc<watch::Sender<BTreeMap<String, ProviderLink>>>);

impl Default for Links {
    fn default() -> Self {
        Links(Arc::new(watch::Sender::new(BTreeMap::new())))
    }
}

impl Links {
    /// The current links.
    pub fn snapshot(&self) -> BTreeMap<String, ProviderLink> {
        self.0.borrow().clone()
    }
    /// A receiver that wakes on every change.
    pub fn subscribe(&self) -> watch::Receiver<BTreeMap<String, ProviderLink>> {
        self.0.subscribe()
    }
    /// A stream that yields once per change of the links (for `reconcile_all_on`).
    pub fn changes(&self) -> impl futures::Stream<Item = ()> + Send + 'static {
        futures::stream::unfold(self.subscribe(), |mut rx| async move {
            rx.changed().await.ok()?;
            Some(((), rx))
        })
    }
    /// A watch on one provider's link.
    pub fn watch(&self, provider_id: &str) -> LinkWatch {
        let rx = self.0.subscribe();
        let seen = rx.borrow().get(provider_id).cloned();
        LinkWatch {
            provider_id: provider_id.to_string(),
            rx,
            seen: std::sync::Mutex::new(seen),
        }
    }
    pub(crate) fn set(&self, links: BTreeMap<String, ProviderLink>) {
        self.0.send_if_modified(|current| {
            let same = current.len() == links.len()
                && current
                    .iter()
                    .zip(links.iter())
                    .all(|((a, la), (b, lb))| a == b && same_link(la, lb));
            if !same {
                *current = links;
            }
            !same
        });
    }
}

/// Whether two links of one provider are the same for its tasks (the clients are the same
/// while the identity is).
fn same_link(a: &ProviderLink, b: &ProviderLink) -> bool {
    a.identity_version == b.identity_version
        && a.grant == b.grant
        && a.node_labels == b.node_labels
        && a.network == b.network
        && a.gateway_status == b.gateway_status
        && a.probe_period == b.probe_period
        && a.not_ready_after == b.not_ready_after
}

/// One provider's link as it changes (grant, labels) while its tasks run.
pub struct LinkWatch {
    pub provider_id: String,
    rx: watch::Receiver<BTreeMap<String, ProviderLink>>,
    /// The link as this watch last handed it out (by `get`).
    seen: std::sync::Mutex<Option<ProviderLink>>,
}

impl Clone for LinkWatch {
    fn clone(&self) -> Self {
        LinkWatch {
            provider_id: self.provider_id.clone(),
            rx: self.rx.clone(),
            seen: std::sync::Mutex::new(self.seen().clone()),
        }
    }
}

impl LinkWatch {
    /// The link now, if the provider is still linked.
    pub fn get(&self) -> Option<ProviderLink> {
        let now = self.rx.borrow().get(&self.provider_id).cloned();
        *self.seen() = now.clone();
        now
    }

    /// Waits until this provider's link differs from the one `get` last returned (linked or
    /// unlinked, or changed). Changes of other providers' links do not wake it: with many
    /// providers peering at once, every task of every link woke (and probed its provider) on
    /// each of them.
    pub async fn changed(&mut self) {
        loop {
            if self.rx.changed().await.is_err() {
                std::future::pending::<()>().await
            }
            let now = self.rx.borrow_and_update().get(&self.provider_id).cloned();
            let differs = match (self.seen().as_ref(), now.as_ref()) {
                (Some(a), Some(b)) => !same_link(a, b),
                (None, None) => false,
                _ => true,
            };
            if differs {
                return;
            }
        }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Option<ProviderLink>> {
        // Nothing panics while holding it.
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Clients to providers, kept while the credential each was built from stays the same.
///
/// Why the peer identity (the kubeconfig Secret the provider's answer became) is not usable.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("reading identity Secret {namespace}/{name}")]
    Read {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("identity Secret {namespace}/{name} has no kubeconfig")]
    NoKubeconfig { namespace: String, name: String },
    #[error("identity Secret {namespace}/{name}")]
    Client {
        namespace: String,
        name: String,
        #[source]
        source: ClientError,
    },
}

/// A client for `provider` with the peer identity in Secret `name` of its local tenant
/// namespace, and that Secret (its resourceVersion tells when the identity changed).
pub async fn identity_client(
    ctx: &Ctx,
    provider: &str,
    name: &str,
) -> Result<(Client, Secret), IdentityError> {
    let namespace = names::tenant_namespace(provider);
    let secret = Api::<Secret>::namespaced(ctx.client.clone(), &namespace)
        .get(name)
        .await
        .map_err(|source| IdentityError::Read {
            namespace: namespace.clone(),
            name: name.to_string(),
            source,
        })?;
    let Some(kubeconfig) = secret
        .data
        .as_ref()
        .and_then(|d| d.get(IDENTITY_KUBECONFIG_KEY))
    else {
        return Err(IdentityError::NoKubeconfig {
            namespace,
            name: name.to_string(),
        });
    };
    let yaml = String::from_utf8_lossy(&kubeconfig.0).into_owned();
    let client = ctx
        .peer_clients
        .get(provider, "identity", &yaml, || async {
            Ok(ctx
                .metrics
                .counted(client_from_kubeconfig(&yaml).await?, provider))
        })
        .await
        .map_err(|source| IdentityError::Client {
            namespace,
            name: name.to_string(),
            source,
        })?;
    Ok((client, secret))
}

/// Builds the link of an authenticated Peering: reads its identity Secret and makes a client.
pub async fn link_for(ctx: &Ctx, peering: &Peering) -> Result<Option<ProviderLink>, IdentityError> {
    let Some(status) = &peering.status else {
        return Ok(None);
    };
    if !conditions::is_true(&status.conditions, conditions::AUTHENTICATED) {
        return Ok(None);
    }
    // Right after authentication the status does not carry the grant yet: a virtual node made
    // then would be Ready with no capacity but `pods`. Wait until the grant was read once.
    if conditions::find(&status.conditions, conditions::RESOURCES_GRANTED).is_none() {
        return Ok(None);
    }
    let (Some(secret_name), Some(remote_tenant)) =
        (&status.identity_secret, &status.remote_tenant_namespace)
    else {
        return Ok(None);
    };
    let provider_id = peering.spec.cluster_id.clone();
    let local_tenant = names::tenant_namespace(&provider_id);
    let (client, secret) = identity_client(ctx, &provider_id, secret_name).await?;
    let stream_client = secret
        .data
        .as_ref()
        .and_then(|d| d.get(IDENTITY_KUBECONFIG_KEY))
        .map(|kc| String::from_utf8_lossy(&kc.0).into_owned())
        .unwrap_or_default();
    let stream_client = ctx
        .peer_clients
        .get(&provider_id, "stream", &stream_client, || {
            streaming_client_from_kubeconfig(&stream_client)
        })
        .await
        .map_err(|source| IdentityError::Client {
            namespace: local_tenant.clone(),
            name: secret_name.clone(),
            source,
        })?;
    let network = status.network.as_ref().and_then(|n| {
        Some(NetworkView {
            remote_pod_cidr: n.remote_pod_cidr.parse().ok()?,
            remote_pod_cidr_here: n.remapped_remote_pod_cidr.parse().ok()?,
            local_pod_cidr: None,
            local_pod_cidr_there: n
                .local_pod_cidr_in_remote
                .as_ref()
                .and_then(|c| c.parse().ok()),
        })
    });
    let health = peering.spec.node_health.clone().unwrap_or_default();
    let probe_period = setting(health.probe_period.as_deref(), ctx.options.heartbeat)
        // A tick of zero would spin; the API server's schema lets `0s` through.
        .max(Duration::from_millis(100));
    let not_ready_after = setting(
        health.not_ready_after.as_deref(),
        ctx.options.provider_grace,
    );
    Ok(Some(ProviderLink {
        probe_period,
        not_ready_after,
        virtual_node: status
            .virtual_node
            .clone()
            .unwrap_or_else(|| names::virtual_node_name(&provider_id)),
        consumer_id: ctx.identity.cluster_id.clone(),
        client,
        stream_client,
        remote_tenant_namespace: remote_tenant.clone(),
        local_tenant_namespace: local_tenant,
        grant: status.granted.clone(),
        node_labels: status.node_labels.clone(),
        network,
        gateway_status: peering.spec.gateway_status.clone(),
        identity_version: secret.resource_version().unwrap_or_default(),
        provider_id,
    }))
}

/// A duration setting of a Peering (its schema's pattern, `1m30s`), or `default` when absent
/// or (written past the schema) unreadable.
fn setting(value: Option<&str>, default: Duration) -> Duration {
    value
        .and_then(|v| humantime::parse_duration(v).ok())
        .unwrap_or(default)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(provider: &str, grant_cpu: &str) -> ProviderLink {
        ProviderLink {
            grant: [("cpu".to_string(), Quantity(grant_cpu.into()))].into(),
            ..ProviderLink::for_tests(provider)
        }
    }

    fn registry(links: &[ProviderLink]) -> BTreeMap<String, ProviderLink> {
        links
            .iter()
            .map(|l| (l.provider_id.clone(), l.clone()))
            .collect()
    }

    /// A provider's tasks wake for their own link's changes, not for every other provider's
    /// (with many providers that woke, and probed, every link on each peering). The clock is
    /// paused: the wait that must not end is over as soon as nothing else can happen.
    #[tokio::test(start_paused = true)]
    async fn a_link_watch_wakes_only_for_its_own_provider() {
        let links = Links::default();
        links.set(registry(&[link("milan", "1"), link("turin", "1")]));
        let mut milan = links.watch("milan");
        assert_eq!(milan.get().unwrap().grant["cpu"].0, "1");

        links.set(registry(&[link("milan", "1"), link("turin", "2")]));
        links.set(registry(&[link("milan", "1")]));
        let woke = tokio::time::timeout(Duration::from_millis(200), milan.changed()).await;
        assert!(woke.is_err(), "woke for turin's changes");

        links.set(registry(&[link("milan", "4")]));
        tokio::time::timeout(Duration::from_secs(10), milan.changed())
            .await
            .expect("woke for milan's new grant");
        assert_eq!(milan.get().unwrap().grant["cpu"].0, "4");

        links.set(BTreeMap::new());
        tokio::time::timeout(Duration::from_secs(10), milan.changed())
            .await
            .expect("woke when milan's link went");
        assert!(milan.get().is_none());
    }
}
