//! Embedded Kubernetes-compatible API server.
//!
//! It serves the Kubernetes REST API over HTTPS on 127.0.0.1 from a generic JSON object
//! store, so that kube-rs and the real `kubectl` can drive it like a kube-apiserver: discovery,
//! CRUD, watch, patches and server-side apply, RBAC, admission webhooks, CRDs, garbage
//! collection, and durable storage in a data directory.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! let server = tandem_apiserver::ApiServer::start(Default::default()).await?;
//! let client = server.client().await?;
//! # Ok(()) }
//! ```

mod admission;
mod authn;
mod authz;
pub mod cluster_authentication;
mod crd;
mod cron;
mod defaults;
mod deletion;
mod discovery;
pub mod error;
pub mod fsutil;
mod gc;
mod handlers;
pub mod kubelet_access;
mod kubelet_proxy;
mod metrics_api;
mod objects;
mod openapi;
pub mod pki;
mod pod_security;
mod protobuf;
mod quota;
mod rbac_escalation;
pub mod registry;
mod request;
mod resource_metrics;
mod response;
mod reviews;
mod scale;
mod selectors;
mod server;
pub mod start_error;
mod state;
pub mod store;
mod strict;
mod subresources;
mod table;
mod validation;
mod version;
mod wal;
mod watch;
mod webhook;

pub use start_error::{BootstrapError, ClientError, StartError};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use base64::Engine;
use kube::config::Kubeconfig;
use parking_lot::RwLock;
use serde_json::{Value, json};
use tandem_api::kubeconfig::{self, Credentials, to_yaml};
use tandem_apimachinery::rbac::RbacIndex;

pub use state::{Config, State};

/// A running API server.
pub struct ApiServer {
    state: Arc<State>,
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

/// Namespaces every cluster starts with.
const SYSTEM_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

impl ApiServer {
    /// Opens the store, bootstraps the cluster's built-in objects and starts serving.
    pub async fn start(config: Config) -> Result<ApiServer, StartError> {
        let store = store::Store::open(config.data_dir.as_deref(), config.watch_window).map_err(
            |source| StartError::Store {
                dir: config.data_dir.clone(),
                source,
            },
        )?;
        let mut sans = vec![first_service_ip(&config.service_cidr)];
        sans.extend(config.extra_sans.iter().cloned());
        let pki = pki::ClusterPki::load_or_create(config.data_dir.as_deref(), &config.name, &sans)?;
        let admin_token = match &config.data_dir {
            Some(dir) => load_or_create_token(dir)?,
            None => random_token(),
        };
        let listen = |source| StartError::Listen {
            port: config.port,
            source,
        };
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", config.port))
            .await
            .map_err(listen)?;
        let config_name = config.name.clone();
        let addr = listener.local_addr().map_err(listen)?;
        let mut registry = registry::Registry::builtin();
        metrics_api::register(&mut registry);
        let state = Arc::new(State {
            config,
            store,
            registry: RwLock::new(registry),
            rbac: RwLock::new(RbacIndex::default()),
            pki,
            admin_token,
            webhooks: webhook::WebhookClient::default(),
            kubelets: kubelet_access::KubeletAccess::new(&config_name)?,
            metrics: Default::default(),
            quota_lock: parking_lot::Mutex::new(()),
            stopped: tokio::sync::watch::Sender::new(false),
        });
        bootstrap(&state)?;
        let gc_state = state.clone();
        let serve_state = state.clone();
        let trust_state = state.clone();
        let metrics_state = state.clone();
        let task = tokio::spawn(async move {
            tokio::select! {
                _ = server::serve(serve_state, listener) => {}
                _ = gc::run(gc_state) => {}
                _ = cluster_authentication::run(trust_state) => {}
                _ = metrics_api::run(metrics_state) => {}
            }
        });
        tracing::info!(url = %format!("https://{addr}"), "API server ready");
        Ok(ApiServer { state, addr, task })
    }

    /// Serves the API on another, already bound listener too (a lab cluster's addresses in
    /// its network namespaces); the task ends when the listener fails.
    pub fn serve_also(&self, listener: tokio::net::TcpListener) -> tokio::task::JoinHandle<()> {
        tokio::spawn(server::serve(self.state.clone(), listener))
    }

    /// How the API server connects to kubelets (by default a plain TCP connection to the
    /// node's address; a lab in network mode connects from inside its node network).
    pub fn set_kubelet_dialer(&self, dialer: kubelet_access::Dialer) {
        *self.state.kubelets.dialer.write() = Some(dialer);
    }

    /// How often kubelets are scraped for `metrics.k8s.io` (metrics-server's
    /// `--metric-resolution`, 15 s by default); takes effect at once.
    pub fn set_metric_resolution(&self, every: std::time::Duration) {
        self.state.metrics.resolution.send_replace(every);
    }

    /// The CA kubelets must trust for the API server's client certificate, PEM.
    pub fn kubelet_client_ca_pem(&self) -> &str {
        &self.state.kubelets.ca.cert_pem
    }

    /// The server's URL.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Shared state (store, registry), for in-process tests and benchmarks.
    pub fn state(&self) -> &Arc<State> {
        &self.state
    }

    /// The cluster CA certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.state.pki.ca.cert_pem
    }

    /// A kubeconfig for the admin (a client certificate in group system:masters).
    pub fn admin_kubeconfig(&self) -> Result<String, ClientError> {
        self.kubeconfig_for("admin", &["system:masters"])
    }

    /// The admin kubeconfig as kube's typed `Kubeconfig`: cluster and context named after the
    /// server, user `<name>-admin`.
    pub fn admin_config(&self) -> Result<Kubeconfig, ClientError> {
        self.config_for("admin", &["system:masters"])
    }

    /// Writes the admin kubeconfig to `path` atomically (a reader never sees half a file).
    pub fn write_admin_kubeconfig(&self, path: &Path) -> Result<(), ClientError> {
        fsutil::write_atomic(path, self.admin_kubeconfig()?.as_bytes()).map_err(|source| {
            ClientError::Write {
                path: path.to_path_buf(),
                source,
            }
        })
    }

    /// A kubeconfig whose client certificate names `user` with `groups`.
    pub fn kubeconfig_for(&self, user: &str, groups: &[&str]) -> Result<String, ClientError> {
        Ok(to_yaml(&self.config_for(user, groups)?))
    }

    fn config_for(&self, user: &str, groups: &[&str]) -> Result<Kubeconfig, ClientError> {
        let cert = self
            .state
            .pki
            .ca
            .issue(user, groups, &[], false)
            .map_err(ClientError::Certificate)?;
        Ok(self.config_with(
            user,
            Credentials::ClientCertificate {
                cert_pem: &cert.cert_pem,
                key_pem: &cert.key_pem,
            },
        ))
    }

    /// A kubeconfig that authenticates with a bearer token.
    pub fn kubeconfig_with_token(&self, user: &str, token: &str) -> String {
        to_yaml(&self.config_with(user, Credentials::Token(token)))
    }

    /// Cluster and context named after the server, user `<name>-<user>`, namespace `default`.
    fn config_with(&self, user: &str, credentials: Credentials<'_>) -> Kubeconfig {
        let name = &self.state.config.name;
        kubeconfig::single(
            name,
            &self.url(),
            self.ca_pem(),
            &format!("{name}-{user}"),
            credentials,
            Some("default"),
        )
    }

    /// A kube client for the admin.
    pub async fn client(&self) -> Result<kube::Client, ClientError> {
        client_from_kubeconfig(&self.admin_kubeconfig()?).await
    }

    /// Stops serving (the store stays on disk).
    /// Stops serving: the listener and every open connection close, as when the process
    /// stops (the store, if it has a data directory, keeps every acknowledged write).
    pub fn shutdown(self) {
        self.stop();
    }

    /// What `shutdown` does, for a server about to be replaced in place.
    pub fn stop(&self) {
        self.state.stopped.send_replace(true);
        self.task.abort();
    }
}

/// A kube client from kubeconfig YAML.
pub async fn client_from_kubeconfig(yaml: &str) -> Result<kube::Client, ClientError> {
    let kubeconfig = kube::config::Kubeconfig::from_yaml(yaml).map_err(ClientError::Kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(ClientError::Kubeconfig)?;
    kube::Client::try_from(config).map_err(ClientError::Build)
}

fn random_token() -> String {
    use rand::Rng;
    let bytes: [u8; 24] = rand::rng().random();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn load_or_create_token(dir: &Path) -> Result<String, StartError> {
    let path = dir.join("admin.token");
    if let Ok(token) = std::fs::read_to_string(&path) {
        return Ok(token.trim().to_string());
    }
    let token = random_token();
    fsutil::write_atomic(&path, token.as_bytes())
        .map_err(|source| StartError::Token { path, source })?;
    Ok(token)
}

/// Creates what a fresh cluster has (system namespaces, the default RBAC policy, the
/// `kubernetes` Service), publishes the client CAs in
/// `kube-system/extension-apiserver-authentication`, and loads stored RBAC objects and CRDs
/// into memory.
fn bootstrap(state: &State) -> Result<(), BootstrapError> {
    let registry = state.registry.read().stored_resources();
    let find = |group: &str, resource: &str| {
        registry
            .iter()
            .find(|r| r.group == group && r.resource == resource)
            .cloned()
            .ok_or_else(|| BootstrapError::MissingResource {
                group: group.into(),
                resource: resource.into(),
            })
    };
    // Stored CRDs and RBAC objects first, so they are served and enforced from the start.
    let (_, crds) = state
        .store
        .list("apiextensions.k8s.io/customresourcedefinitions", None, None);
    for doc in crds {
        state::sync_crd(state, Some(&doc.value()), &doc.name);
    }
    for kind in [
        "roles",
        "clusterroles",
        "rolebindings",
        "clusterrolebindings",
    ] {
        let res = find("rbac.authorization.k8s.io", kind)?;
        let (_, docs) = state.store.list(&res.storage_key(), None, None);
        for doc in docs {
            state.rbac.write().apply(&res.kind, &doc.value());
        }
    }
    let create_missing =
        |res: &registry::ResourceInfo, mut obj: Value| -> Result<(), BootstrapError> {
            let ns = obj["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_string();
            let name = obj["metadata"]["name"].as_str().unwrap_or("").to_string();
            if state.store.get(&res.storage_key(), &ns, &name).is_some() {
                return Ok(());
            }
            objects::prepare_create(res, &mut obj);
            let failed = |source: error::ApiError| BootstrapError::Create {
                resource: res.resource.clone(),
                name: name.clone(),
                source: Box::new(source),
            };
            defaults::apply(state, res, &mut obj, None).map_err(failed)?;
            state
                .create_object(res, &ns, &name, &mut obj)
                .map_err(failed)?;
            Ok(())
        };
    let namespaces = find("", "namespaces")?;
    for ns in SYSTEM_NAMESPACES {
        create_missing(
            &namespaces,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )?;
    }
    for obj in tandem_apimachinery::rbac::bootstrap_policy() {
        let kind = obj["kind"].as_str().unwrap_or("");
        let res = registry
            .iter()
            .find(|r| r.group == "rbac.authorization.k8s.io" && r.kind == kind)
            .cloned()
            .ok_or_else(|| BootstrapError::UnknownKind(kind.into()))?;
        create_missing(&res, obj)?;
    }
    create_missing(
        &*find("rbac.authorization.k8s.io", "roles")?,
        cluster_authentication::reader_role(),
    )?;
    // Rewritten at each start: the kubelet-client CA is new with every process.
    cluster_authentication::publish(state).map_err(|e| BootstrapError::ClientCas(Box::new(e)))?;
    let services = find("", "services")?;
    create_missing(
        &services,
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "kubernetes", "namespace": "default", "labels": {"component": "apiserver", "provider": "kubernetes"}},
            "spec": {"type": "ClusterIP", "clusterIP": first_service_ip(&state.config.service_cidr),
                     "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]},
        }),
    )?;
    Ok(())
}

fn first_service_ip(cidr: &str) -> String {
    let base = cidr.split('/').next().unwrap_or("10.96.0.0");
    match base.parse::<std::net::Ipv4Addr>() {
        Ok(ip) => std::net::Ipv4Addr::from(u32::from(ip) + 1).to_string(),
        Err(_) => "10.96.0.1".into(),
    }
}
