//! What every reconciler shares: the local client, this cluster's identity and the options.

use std::sync::Arc;
use std::time::Duration;

use kube::Client;

use crate::identity::ClusterIdentity;

/// Tunables of the controller; defaults suit production, tests shorten the timings.
#[derive(Clone, Debug)]
pub struct Options {
    /// Address the pod-placement admission webhook listens on (port 0 picks one).
    pub webhook_addr: std::net::SocketAddr,
    /// The Service (namespace, name) the API server calls the webhook through, when the
    /// controller runs as a pod behind it; None: the API server calls `webhook_addr` directly.
    pub webhook_service: Option<(String, String)>,
    /// How often virtual nodes renew their Lease and probe their provider, unless their
    /// Peering's `nodeHealth.probePeriod` says otherwise.
    pub heartbeat: Duration,
    /// How long a provider may stay unreachable before its virtual node turns NotReady, unless
    /// its Peering's `nodeHealth.notReadyAfter` says otherwise.
    pub provider_grace: Duration,
    /// The address virtual kubelets serve their kubelet API on (a port per virtual node) and
    /// publish as their node's InternalIP: one the API server can reach.
    pub kubelet_address: std::net::IpAddr,
    /// Where to serve `clusterset.local` (UDP and TCP), if anywhere.
    pub dns_addr: Option<std::net::SocketAddr>,
    /// Fencing: how long a provider may take, once a pod's fence deadline passed, to notice
    /// and stop the pod; the consumer adds it to `fenceAfter` before it replaces the pod.
    pub fence_margin: Duration,
    /// Where to serve `/metrics`, `/healthz` and `/readyz`, if anywhere (port 0 picks one:
    /// [`Controller::metrics_addr`](crate::Controller::metrics_addr) tells which).
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Run the reconcilers only while holding the leader Lease (several replicas); None: run
    /// them at once (one replica).
    pub leader_election: Option<crate::leader::LeaderElection>,
    /// Provider: the lifetime of the peer certificates it issues (the CSR's
    /// expirationSeconds); None: the signer's default.
    pub peer_certificate_lifetime: Option<Duration>,
    /// Consumer: the share of its peer certificate's lifetime after which it asks the
    /// provider for a new one (0.8: with a year's certificate, about 73 days before expiry).
    pub identity_renewal_after: f64,
    /// Consumer: how often it looks at its peer certificates' expiry.
    pub identity_renewal_check: Duration,
    /// The lifetime of the pod-placement webhook's serving certificate (and of the CA that
    /// signs it); a new one replaces it after two thirds of it.
    pub webhook_certificate_lifetime: Duration,
    /// How long the API server is given to see a new CA in the webhook's caBundle before the
    /// server presents the certificate it signs (kube-apiserver's webhook configuration cache
    /// follows a watch, each replica on its own).
    pub webhook_ca_propagation: Duration,
    /// Makes the mDNS socket (None: `mdns::socket` in the controller's own network, on the
    /// interface the kernel routes 224.0.0.251 through). Tests make it inside an isolated
    /// network namespace, as nothing of a lab may reach the host's LAN.
    pub mdns_socket: Option<MdnsSocket>,
    /// mDNS: the TTL of this cluster's announcement and how often it is repeated.
    pub mdns: crate::mdns::Config,
}

/// A maker of the mDNS socket (see [`Options::mdns_socket`]).
#[derive(Clone)]
pub struct MdnsSocket(
    pub std::sync::Arc<dyn Fn() -> std::io::Result<tokio::net::UdpSocket> + Send + Sync>,
);

impl std::fmt::Debug for MdnsSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MdnsSocket(..)")
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            mdns_socket: None,
            mdns: crate::mdns::Config::default(),
            webhook_addr: ([127, 0, 0, 1], 0).into(),
            webhook_service: None,
            heartbeat: Duration::from_secs(2),
            provider_grace: Duration::from_secs(6),
            kubelet_address: std::net::Ipv4Addr::LOCALHOST.into(),
            dns_addr: None,
            fence_margin: Duration::from_secs(5),
            metrics_addr: None,
            leader_election: None,
            peer_certificate_lifetime: None,
            identity_renewal_after: 0.8,
            identity_renewal_check: Duration::from_secs(60),
            webhook_certificate_lifetime: Duration::from_secs(90 * 24 * 3600),
            webhook_ca_propagation: Duration::from_secs(10),
        }
    }
}

/// Shared by every reconciler of one controller process.
pub struct Context {
    /// The local cluster.
    pub client: Client,
    /// This cluster's ID and key pair.
    pub identity: ClusterIdentity,
    pub options: Options,
    /// What `/metrics` reports; `client` and every provider's client count their requests here.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Clients to providers, kept while their credentials stay the same.
    pub peer_clients: crate::clients::PeerClients,
    /// The IPAM ConfigMap as last seen, and the lock this process's IPAM changes take.
    pub ipam: crate::ipam_cache::IpamCache,
    /// The `tandem-config` ConfigMap as a watch keeps it (see [`Context::settings`]).
    pub settings: SettingsCache,
    /// This cluster's gateway key Secrets and gateway Services as a watch keeps them.
    pub gateways: GatewayCache,
    /// What the virtual kubelets watch together.
    pub shared: crate::shared_watches::SharedWatches,
}

pub type Ctx = Arc<Context>;

impl Context {
    /// The cluster's settings. Reconcilers read them on every pass (each negotiation, each
    /// sweep): from the watched ConfigMap, or from the API until the watch has listed it.
    pub async fn settings(
        &self,
    ) -> Result<crate::settings::ClusterSettings, crate::settings::InstallError> {
        self.settings.get(&self.client).await
    }
}

/// The `tandem-config` ConfigMap, kept by [`SettingsCache::watch`]; with whether the watch is
/// fresh (see [`WatchHealth`](crate::watches::WatchHealth)).
#[derive(Clone)]
pub struct SettingsCache {
    store: kube::runtime::reflector::Store<k8s_openapi::api::core::v1::ConfigMap>,
    health: Health,
    /// Whether this is a hollow lab cluster (read once: a cluster does not change its kind).
    hollow: Arc<tokio::sync::OnceCell<bool>>,
}

impl SettingsCache {
    /// The cache, and the watch that fills it (to be run for as long as the cache is read).
    /// A watch that fails (a role without `watch` on ConfigMaps, say) leaves the cache empty,
    /// or, failing after it has listed, stops it answering; [`Context::settings`] then reads
    /// from the API.
    pub fn watch(
        client: &Client,
    ) -> (SettingsCache, impl std::future::Future<Output = ()> + use<>) {
        let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
            kube::Api::namespaced(client.clone(), tandem_api::names::SYSTEM_NAMESPACE);
        let config = kube::runtime::watcher::Config::default()
            .fields(&format!("metadata.name={}", tandem_api::names::CONFIG_MAP));
        let (store, health, run) = tracked_reflector(api, config, "the cluster's settings");
        let hollow = Arc::default();
        (
            SettingsCache {
                store,
                health,
                hollow,
            },
            run,
        )
    }

    /// The settings as watched, or read through `client` until the watch has listed them.
    pub async fn get(
        &self,
        client: &Client,
    ) -> Result<crate::settings::ClusterSettings, crate::settings::InstallError> {
        let mut settings = match self.watched() {
            Some(settings) => settings,
            None => crate::settings::load_settings(client).await,
        }?;
        if settings.network_fabric {
            settings.hollow_cluster = self.hollow(client).await;
        }
        Ok(settings)
    }

    /// Whether the cluster's `kube-system` Namespace carries the label of a hollow lab cluster,
    /// whose pods have no network (see [`names::HOLLOW_CLUSTER_LABEL`]). A failed read counts as
    /// not hollow, and is tried again next time.
    ///
    /// [`names::HOLLOW_CLUSTER_LABEL`]: tandem_api::names::HOLLOW_CLUSTER_LABEL
    async fn hollow(&self, client: &Client) -> bool {
        let read = self
            .hollow
            .get_or_try_init(|| crate::settings::is_hollow_cluster(client))
            .await;
        match read {
            Ok(hollow) => *hollow,
            Err(e) => {
                tracing::debug!("reading kube-system's labels: {e}");
                false
            }
        }
    }

    /// The settings as watched; None until the watch has listed the ConfigMap, and while it
    /// keeps failing.
    pub fn watched(
        &self,
    ) -> Option<Result<crate::settings::ClusterSettings, crate::settings::InstallError>> {
        use kube::runtime::reflector::ObjectRef;
        if !self.health.fresh() {
            return None;
        }
        let map = self.store.get(
            &ObjectRef::new(tandem_api::names::CONFIG_MAP)
                .within(tandem_api::names::SYSTEM_NAMESPACE),
        )?;
        Some(crate::settings::settings_from(&map))
    }
}

/// A watch's health as its readers see it (see [`WatchTracker`](crate::watches::WatchTracker)).
#[derive(Clone)]
struct Health(Arc<std::sync::Mutex<crate::watches::WatchTracker>>);

impl Health {
    fn fresh(&self) -> bool {
        // (A panic elsewhere while holding the lock leaves the tracker itself whole.)
        let tracker = self.0.lock().unwrap_or_else(|e| e.into_inner());
        tracker.health() == crate::watches::WatchHealth::Fresh
    }
}

/// A reflector over `api` with its [`Health`]; the future runs the watch.
fn tracked_reflector<K>(
    api: kube::Api<K>,
    config: kube::runtime::watcher::Config,
    what: &'static str,
) -> (
    kube::runtime::reflector::Store<K>,
    Health,
    impl std::future::Future<Output = ()> + use<K>,
)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    use futures::StreamExt as _;
    use kube::runtime::{WatchStreamExt as _, reflector, watcher};
    let (store, writer) = reflector::store();
    let health = Health(Arc::new(std::sync::Mutex::new(
        crate::watches::WatchTracker::new(what),
    )));
    let tracker = health.0.clone();
    let run = reflector(writer, watcher(api, config))
        .default_backoff()
        .for_each(move |event| {
            tracker
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .note(&event);
            async {}
        });
    (store, health, run)
}

/// One kind of object in `tandem-system` labelled with its peer, kept by a watch; `None` until
/// the watch has listed them, and again while it keeps failing (then the API is read).
#[derive(Clone)]
pub struct Watched<K: kube::Resource<DynamicType = ()> + Clone + 'static> {
    store: kube::runtime::reflector::Store<K>,
    health: Health,
}

impl<K> Watched<K>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    fn watch(
        client: &Client,
        what: &'static str,
    ) -> (Self, impl std::future::Future<Output = ()> + use<K>) {
        let api: kube::Api<K> =
            kube::Api::namespaced(client.clone(), tandem_api::names::SYSTEM_NAMESPACE);
        let config = kube::runtime::watcher::Config::default()
            .labels(tandem_api::names::REMOTE_CLUSTER_LABEL);
        let (store, health, run) = tracked_reflector(api, config, what);
        (Watched { store, health }, run)
    }

    /// `tandem-system/name` as watched (`Some(None)`: it does not exist, or lacks the peer
    /// label); `None` until the watch has listed.
    pub fn get(&self, name: &str) -> Option<Option<Arc<K>>> {
        use kube::runtime::reflector::ObjectRef;
        if !self.health.fresh() {
            return None;
        }
        Some(
            self.store
                .get(&ObjectRef::new(name).within(tandem_api::names::SYSTEM_NAMESPACE)),
        )
    }
}

/// The gateway objects every negotiation and the provider's one-second network sweep read
/// for each peer (its key Secret and its Service, both `tandem-gateway-<peer>`), from a watch
/// instead of a GET each.
#[derive(Clone)]
pub struct GatewayCache {
    pub secrets: Watched<k8s_openapi::api::core::v1::Secret>,
    pub services: Watched<k8s_openapi::api::core::v1::Service>,
}

impl GatewayCache {
    /// The cache, and the watches that fill it (to be run for as long as the cache is read).
    pub fn watch(client: &Client) -> (GatewayCache, impl std::future::Future<Output = ()> + use<>) {
        let (secrets, watch_secrets) = Watched::watch(client, "gateway key Secrets");
        let (services, watch_services) = Watched::watch(client, "gateway Services");
        let run = async move {
            futures::join!(watch_secrets, watch_services);
        };
        (GatewayCache { secrets, services }, run)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Secret;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    use kube::api::{Api, PostParams};

    /// Polls `f` every 50 ms until it holds, for at most 30 s.
    async fn until(what: &str, mut f: impl FnMut() -> bool) {
        let (limit, every) = (Duration::from_secs(30), Duration::from_millis(50));
        tandem_testing::until_every(what, limit, every, || std::future::ready(f().then_some(())))
            .await
    }

    /// A watch that lists but can never watch (RBAC grants `list` only) must not keep answering
    /// from its first snapshot: after a few failures the cache says "not listed", so that
    /// callers read the API, which still sees every change. Both caches: the gateway objects'
    /// and the settings'.
    #[tokio::test]
    async fn watches_that_keep_failing_stop_answering_from_their_snapshots() {
        let server = tandem_apiserver::ApiServer::start(Default::default())
            .await
            .unwrap();
        let admin = server.client().await.unwrap();
        let role: ClusterRole = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "list-secrets"},
            "rules": [{"apiGroups": [""], "resources": ["secrets", "configmaps"],
                       "verbs": ["list"]}],
        }))
        .unwrap();
        Api::<ClusterRole>::all(admin.clone())
            .create(&PostParams::default(), &role)
            .await
            .unwrap();
        let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "list-secrets"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "list-secrets"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                          "name": "lister"}],
        }))
        .unwrap();
        Api::<ClusterRoleBinding>::all(admin.clone())
            .create(&PostParams::default(), &binding)
            .await
            .unwrap();
        let lister = tandem_apiserver::client_from_kubeconfig(
            &server.kubeconfig_for("lister", &[]).unwrap(),
        )
        .await
        .unwrap();

        // The settings ConfigMap exists (its keys do not matter here).
        let ns: k8s_openapi::api::core::v1::Namespace = serde_json::from_value(
            serde_json::json!({"metadata": {"name": tandem_api::names::SYSTEM_NAMESPACE}}),
        )
        .unwrap();
        Api::all(admin.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        let map: k8s_openapi::api::core::v1::ConfigMap =
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": tandem_api::names::CONFIG_MAP},
            }))
            .unwrap();
        Api::namespaced(admin.clone(), tandem_api::names::SYSTEM_NAMESPACE)
            .create(&PostParams::default(), &map)
            .await
            .unwrap();

        let (secrets, run) = Watched::<Secret>::watch(&lister, "test Secrets");
        let (settings, run_settings) = SettingsCache::watch(&lister);
        let task = tokio::spawn(async move { futures::join!(run, run_settings) });
        until("the first listings", || {
            secrets.get("absent").is_some() && settings.watched().is_some()
        })
        .await;
        assert_eq!(
            secrets.get("absent").unwrap(),
            None,
            "listed, and it is absent"
        );
        until("the failing watches to be given up on", || {
            secrets.get("absent").is_none() && settings.watched().is_none()
        })
        .await;
        task.abort();
        server.shutdown();
    }
}
