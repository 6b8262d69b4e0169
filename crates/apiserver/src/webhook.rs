//! The HTTPS side of admission webhooks: pooled clients per caBundle, parsed webhook
//! configurations, and the POST of an AdmissionReview.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::Value;

use crate::store::Doc;

/// An HTTPS client that verifies servers against one caBundle.
pub type HttpsClient = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Full<Bytes>,
>;

/// Sends AdmissionReviews, verified against the caBundle of the webhook called. Keeps one
/// pooled HTTPS client per caBundle: a pod webhook is called for every pod created, and a TLS
/// handshake per call cost more than the call itself. Also keeps the webhook configurations
/// parsed: every write of a resource with webhooks consults all of them.
#[derive(Default)]
pub struct WebhookClient {
    clients: std::sync::Mutex<std::collections::HashMap<Option<Vec<u8>>, HttpsClient>>,
    configs: std::sync::Mutex<std::collections::HashMap<Box<str>, ParsedConfig>>,
}

/// A configuration's resourceVersion and its parsed content, by its uid.
type ParsedConfig = (u64, Arc<Value>);

/// Distinct caBundles kept at most (rotations leave old ones behind).
const MAX_CLIENTS: usize = 64;

/// Parsed configurations kept at most (deleted ones leave theirs behind until the next sweep).
const MAX_CONFIGS: usize = 256;

impl WebhookClient {
    /// The pooled client that verifies servers against `ca_pem`.
    pub fn client(&self, ca_pem: Option<&[u8]>) -> Result<HttpsClient, String> {
        let key = ca_pem.map(<[u8]>::to_vec);
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = clients.get(&key) {
            return Ok(c.clone());
        }
        let client = https_client(ca_pem)?;
        if clients.len() >= MAX_CLIENTS {
            clients.clear();
        }
        clients.insert(key, client.clone());
        Ok(client)
    }

    /// The configuration stored as `doc`, parsed once per resourceVersion.
    pub fn parsed(&self, doc: &Doc) -> Arc<Value> {
        let mut configs = self.configs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((rv, v)) = configs.get(&doc.uid)
            && *rv == doc.rv
        {
            return v.clone();
        }
        let v = Arc::new(doc.value());
        if configs.len() >= MAX_CONFIGS {
            configs.clear();
        }
        configs.insert(doc.uid.clone(), (doc.rv, v.clone()));
        v
    }
}

fn https_client(ca_pem: Option<&[u8]>) -> Result<HttpsClient, String> {
    let tls = tls_config(ca_pem)?;
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .build();
    Ok(
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(connector),
    )
}

/// A webhook Service reference (`clientConfig.service`).
pub struct ServiceRef {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub name: String,
    /// The Service port (default 443).
    pub port: u16,
    /// The URL path (default `/`).
    pub path: String,
}

impl ServiceRef {
    /// The reference in a webhook's `clientConfig.service`, with kube's defaults.
    pub fn of(svc: &Value) -> ServiceRef {
        let path = svc["path"].as_str().unwrap_or("/");
        ServiceRef {
            namespace: svc["namespace"].as_str().unwrap_or("").to_string(),
            name: svc["name"].as_str().unwrap_or("").to_string(),
            port: svc["port"]
                .as_u64()
                .and_then(|p| u16::try_from(p).ok())
                .unwrap_or(443),
            path: if path.starts_with('/') {
                path.to_string()
            } else {
                format!("/{path}")
            },
        }
    }

    /// The name the webhook's serving certificate must carry, as kube-apiserver verifies it.
    pub fn host(&self) -> String {
        format!("{}.{}.svc", self.name, self.namespace)
    }

    /// The URL kube-apiserver names the webhook by.
    pub fn url(&self) -> String {
        format!("https://{}:{}{}", self.host(), self.port, self.path)
    }
}

/// Verifies webhook servers against `ca_pem` (nothing trusted without one, as kube-apiserver
/// trusts only the caBundle or its own system roots, which a lab does not have).
fn tls_config(ca_pem: Option<&[u8]>) -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    if let Some(pem) = ca_pem {
        for cert in rustls_pemfile::certs(&mut &pem[..]).flatten() {
            roots.add(cert).map_err(|e| format!("caBundle: {e}"))?;
        }
    }
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// POSTs a review to a webhook Service's endpoint `addr` (dialed through `dialer` when the
/// cluster's network is not this process's), verifying its certificate for
/// `<name>.<namespace>.svc`. One connection per call: only lab network mode calls webhooks
/// through Services, and not at the pod-creation rates `clientConfig.url` webhooks see.
pub async fn post_to_service(
    svc: &ServiceRef,
    addr: std::net::SocketAddr,
    dialer: Option<crate::kubelet_access::Dialer>,
    ca_pem: Option<&[u8]>,
    body: String,
) -> Result<Bytes, String> {
    let (host, url) = (svc.host(), svc.url());
    let fail = |e: &dyn std::fmt::Display| format!("Post {url:?}: {e}");
    let tcp = match dialer {
        Some(dial) => dial(addr).await,
        None => tokio::net::TcpStream::connect(addr).await,
    }
    .map_err(|e| fail(&format!("dial tcp {addr}: {e}")))?;
    let name = rustls::pki_types::ServerName::try_from(host.clone()).map_err(|e| fail(&e))?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(tls_config(ca_pem)?))
        .connect(name, tcp)
        .await
        .map_err(|e| fail(&format!("tls: {e}")))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| fail(&e))?;
    tokio::spawn(connection);
    let request = http::Request::post(svc.path.as_str())
        .header(http::header::HOST, format!("{host}:{}", svc.port))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| fail(&e))?;
    let response = sender.send_request(request).await.map_err(|e| fail(&e))?;
    answer(&url, response).await
}

/// POSTs a JSON body and returns the body of a 2xx answer; errors start `Post "url": `.
pub async fn post(client: &HttpsClient, url: &str, body: String) -> Result<Bytes, String> {
    let request = http::Request::post(url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| format!("Post {url:?}: {e}"))?;
    let response = client.request(request).await.map_err(|e| {
        let mut msg = format!("Post {url:?}: {e}");
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            msg.push_str(&format!(": {s}"));
            source = s.source();
        }
        msg
    })?;
    answer(url, response).await
}

/// The body of a webhook's 2xx answer to a POST to `url`; errors start `Post "url": `.
async fn answer(
    url: &str,
    response: http::Response<hyper::body::Incoming>,
) -> Result<Bytes, String> {
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("Post {url:?}: {e}"))?
        .to_bytes();
    if !status.is_success() {
        return Err(format!("Post {url:?}: HTTP {status}"));
    }
    Ok(body)
}
