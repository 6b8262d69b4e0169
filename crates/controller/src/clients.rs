//! Clients for peer clusters, built from the kubeconfigs their answers carry and kept while
//! they are used.

use std::collections::HashMap;

use std::time::Duration;

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

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
