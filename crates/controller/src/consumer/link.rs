//! Links to providers: what the consumer needs to work in one provider (a client with the peer
//! identity, the namespaces, the grant and the network view), derived level-based from the
//! `Peering` objects' status, and the supervisor running the per-provider tasks (virtual node,
//! virtual kubelet, reflection) while a link exists.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tandem_api::{Peering, conditions, names};
use tokio::sync::watch;
use tokio::task::JoinSet;

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
    fn set(&self, links: BTreeMap<String, ProviderLink>) {
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
/// kube's Client speaks HTTP/1.1 and owns its connection pool, so a Client built afresh for
/// each reconcile opened a new TLS connection each time: a handshake with certificates on both
/// sides, which with many providers peering at once was most of the CPU of both controllers
/// and the API servers. A kept Client reuses its idle connections.
#[derive(Default)]
pub struct PeerClients(std::sync::Mutex<KeptClients>);

/// By provider and purpose: the kubeconfig each client was built from, and the client.
type KeptClients = HashMap<(String, &'static str), (String, Client)>;

impl PeerClients {
    /// The client kept for `provider` and `purpose` if it was built from `kubeconfig`; else
    /// the one `build` makes, kept from now on.
    pub async fn get<F, Fut>(
        &self,
        provider: &str,
        purpose: &'static str,
        kubeconfig: &str,
        build: F,
    ) -> Result<Client, ClientError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Client, ClientError>>,
    {
        let key = (provider.to_string(), purpose);
        if let Some((from, client)) = self.lock().get(&key)
            && from == kubeconfig
        {
            return Ok(client.clone());
        }
        let client = build().await?;
        self.lock()
            .insert(key, (kubeconfig.to_string(), client.clone()));
        Ok(client)
    }

    /// Drops every client kept for `provider` (its Peering is gone).
    pub fn forget(&self, provider: &str) {
        self.lock().retain(|(p, _), _| p != provider);
    }

    /// Drops the client kept for `provider` and `purpose` (no longer needed).
    pub fn forget_one(&self, provider: &str, purpose: &'static str) {
        self.lock().remove(&(provider.to_string(), purpose));
    }

    /// Drops the clients of providers not in `live` (Peerings gone without unpeering).
    pub fn keep_only(&self, live: &std::collections::BTreeSet<String>) {
        self.lock().retain(|(p, _), _| live.contains(p));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, KeptClients> {
        // Nothing panics while holding it; a poisoned map is still a valid cache.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Why a client for a provider could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid kubeconfig")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
    #[error("building a client")]
    Build(#[source] kube::Error),
}

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

/// A client from a kubeconfig document (its current context).
pub async fn client_from_kubeconfig(yaml: &str) -> Result<Client, ClientError> {
    let mut config = config_from_kubeconfig(yaml).await?;
    // Fail fast on an unreachable provider instead of hanging reconcilers.
    config.connect_timeout = Some(Duration::from_secs(3));
    config.read_timeout = Some(Duration::from_secs(30));
    Client::try_from(config).map_err(ClientError::Build)
}

/// A client from a kubeconfig document whose responses may idle as long as they like: a
/// followed log or an exec session is silent for minutes (its connect timeout stays short).
///
/// Its connections set TCP_NODELAY (kube's own connector does not): a port-forward or exec
/// carries small writes each way, which Nagle's algorithm would hold until the last is
/// acknowledged — tens of milliseconds per exchange against a delayed ACK.
pub async fn streaming_client_from_kubeconfig(yaml: &str) -> Result<Client, ClientError> {
    use kube::client::ConfigExt;
    let config = config_from_kubeconfig(yaml).await?;
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(Duration::from_secs(3)));
    let https = config
        .rustls_https_connector_with_connector(http)
        .map_err(ClientError::Build)?;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build(https);
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer().map_err(ClientError::Build)?)
        .map_err(Box::<dyn std::error::Error + Send + Sync>::from)
        .service(client);
    Ok(Client::new(service, config.default_namespace))
}

async fn config_from_kubeconfig(yaml: &str) -> Result<kube::Config, ClientError> {
    let kubeconfig = Kubeconfig::from_yaml(yaml).map_err(ClientError::Kubeconfig)?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(ClientError::Kubeconfig)
}

/// Keeps `links` equal to the authenticated Peerings, and runs the per-provider tasks of each
/// link (restarting them when its identity changes, stopping them when it goes).
pub async fn supervise(ctx: Ctx, links: Links) {
    let publisher = tokio::spawn(publish(ctx.clone(), links.clone()));
    let mut rx = links.subscribe();
    let mut running: BTreeMap<String, (String, JoinSet<()>)> = BTreeMap::new();
    // The kubelet API of each virtual node outlives restarts of the other tasks: its address
    // (in the node's status) stays the one the API server dials. It reads the link per request.
    let mut kubelets: BTreeMap<String, (JoinSet<()>, watch::Receiver<Option<SocketAddr>>)> =
        BTreeMap::new();
    loop {
        let current = rx.borrow_and_update().clone();
        running.retain(|id, (key, _)| current.get(id).is_some_and(|l| &restart_key(l) == key));
        kubelets.retain(|id, _| current.contains_key(id));
        for (id, link) in &current {
            if running.contains_key(id) {
                continue;
            }
            tracing::info!(provider = %id, "starting virtual node, virtual kubelet, fence and reflection");
            let (_, kubelet_endpoint) = kubelets.entry(id.clone()).or_insert_with(|| {
                let (endpoint, published) = watch::channel(None);
                let mut task = JoinSet::new();
                task.spawn(crate::consumer::kubelet_api::run(
                    ctx.clone(),
                    links.watch(id),
                    endpoint,
                ));
                (task, published)
            });
            let mut tasks = JoinSet::new();
            tasks.spawn(crate::consumer::virtual_node::run(
                ctx.clone(),
                links.watch(id),
                kubelet_endpoint.clone(),
            ));
            tasks.spawn(crate::consumer::vk::run(ctx.clone(), links.watch(id)));
            tasks.spawn(crate::consumer::fence::run(ctx.clone(), links.watch(id)));
            tasks.spawn(crate::consumer::reflection::run(
                ctx.clone(),
                links.watch(id),
            ));
            running.insert(id.clone(), (restart_key(link), tasks));
        }
        if rx.changed().await.is_err() {
            break;
        }
    }
    publisher.abort();
}

/// What the per-provider tasks of a link depend on without re-reading it: the identity (their
/// clients). The rest (grant, labels, the network once negotiated) they follow on the link.
fn restart_key(link: &ProviderLink) -> String {
    link.identity_version.clone()
}

/// Watches Peerings and publishes the link of each authenticated one.
///
/// A link is worked out again only for a Peering that changed since (or at the resync, every
/// 30 s, when an identity renewed in its Secret is picked up): working one out reads the
/// identity Secret and builds two clients, and redoing that for every Peering on every event
/// made peering with many providers at once quadratic (32 at once spent about a second here).
async fn publish(ctx: Ctx, links: Links) {
    use futures::FutureExt as _;
    let api: Api<Peering> = Api::all(ctx.client.clone());
    let mut stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut peerings: BTreeMap<String, Peering> = BTreeMap::new();
    let mut relisted: Option<BTreeMap<String, Peering>> = None;
    // Per Peering: the resourceVersion its link was worked out from, and the link.
    let mut worked_out: BTreeMap<String, (String, Option<ProviderLink>)> = BTreeMap::new();
    let mut resync = tokio::time::interval(Duration::from_secs(30));
    loop {
        let mut event = tokio::select! {
            event = stream.next() => Some(event),
            _ = resync.tick() => {
                worked_out.clear();
                None
            }
        };
        // Every event already here, then one look at the result.
        while let Some(next) = event {
            match next {
                Some(Ok(watcher::Event::Apply(p))) => {
                    peerings.insert(p.name_any(), p);
                }
                Some(Ok(watcher::Event::Delete(p))) => {
                    peerings.remove(&p.name_any());
                }
                // A (re)list: what was known stands until it is complete, so that no link
                // (and no task of it) goes for a Peering not listed again yet.
                Some(Ok(watcher::Event::Init)) => relisted = Some(BTreeMap::new()),
                Some(Ok(watcher::Event::InitApply(p))) => {
                    if let Some(relisted) = relisted.as_mut() {
                        relisted.insert(p.name_any(), p);
                    }
                }
                Some(Ok(watcher::Event::InitDone)) => {
                    if let Some(relisted) = relisted.take() {
                        peerings = relisted;
                    }
                }
                Some(Err(e)) => tracing::warn!(error = %e, "watching Peerings"),
                None => return,
            }
            event = stream.next().now_or_never();
        }
        let live: Vec<&Peering> = peerings
            .values()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        worked_out.retain(|name, _| {
            peerings
                .get(name)
                .is_some_and(|p| p.metadata.deletion_timestamp.is_none())
        });
        // Clients of providers with no Peering left (one removed without unpeering). A
        // Peering being deleted keeps them: its unpeering still reaches the provider.
        ctx.peer_clients.keep_only(
            &peerings
                .values()
                .map(|p| p.spec.cluster_id.clone())
                .collect(),
        );
        let changed: Vec<&Peering> = live
            .iter()
            .copied()
            .filter(|p| {
                worked_out.get(&p.name_any()).map(|(v, _)| v.as_str())
                    != Some(p.resource_version().unwrap_or_default().as_str())
            })
            .collect();
        // Side by side: each waits on the API server for its Secret.
        let results = futures::future::join_all(changed.iter().map(|p| link_for(&ctx, p))).await;
        for (peering, result) in changed.iter().zip(results) {
            let name = peering.name_any();
            match result {
                Ok(link) => {
                    let version = peering.resource_version().unwrap_or_default();
                    worked_out.insert(name, (version, link));
                }
                Err(e) => {
                    // Not remembered: tried again at the next event or resync.
                    worked_out.remove(&name);
                    tracing::warn!(peering = %name, error = %crate::error::chain(&e), "no link");
                }
            }
        }
        // The clients are the kept ones (`PeerClients`) while the identity is the same.
        let next: BTreeMap<String, ProviderLink> = worked_out
            .values()
            .filter_map(|(_, link)| link.clone())
            .map(|link| (link.provider_id.clone(), link))
            .collect();
        links.set(next);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(provider: &str, grant_cpu: &str) -> ProviderLink {
        // Never used to connect.
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
            grant: [("cpu".to_string(), Quantity(grant_cpu.into()))].into(),
            node_labels: BTreeMap::new(),
            network: None,
            gateway_status: None,
            identity_version: "1".into(),
            probe_period: Duration::from_secs(2),
            not_ready_after: Duration::from_secs(10),
        }
    }

    fn registry(links: &[ProviderLink]) -> BTreeMap<String, ProviderLink> {
        links
            .iter()
            .map(|l| (l.provider_id.clone(), l.clone()))
            .collect()
    }

    /// A provider's tasks wake for their own link's changes, not for every other provider's
    /// (with many providers that woke, and probed, every link on each peering).
    #[tokio::test]
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
