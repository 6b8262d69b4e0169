//! The HTTPS side of admission webhooks: pooled clients per caBundle, parsed webhook
//! configurations, and the POST of an AdmissionReview.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::Value;

use crate::store::Doc;

/// Why an AdmissionReview could not be sent or answered. Each message reads as
/// kube-apiserver's once its causes are appended (`error::with_causes`).
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// A certificate of the webhook's caBundle that rustls refuses.
    #[error("caBundle")]
    CaBundle(#[source] rustls::Error),
    /// The crypto provider offers no safe TLS protocol version.
    #[error(transparent)]
    TlsVersions(rustls::Error),
    /// A step of the POST to the webhook at `url` failed.
    #[error("Post {url:?}")]
    Post {
        /// The URL the webhook is named by.
        url: String,
        /// The step that failed.
        #[source]
        source: PostError,
    },
}

/// The step of a POST to a webhook that failed.
///
/// hyper's errors print only their own description, without their cause: the messages of
/// these steps never carried it (only a pooled client's failure lists its causes).
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    /// Dialing the Service endpoint `addr`.
    #[error("dial tcp {addr}")]
    Dial {
        /// The endpoint dialed.
        addr: std::net::SocketAddr,
        /// Why it could not be reached.
        #[source]
        source: std::io::Error,
    },
    /// The Service's host name is not a valid TLS server name.
    #[error(transparent)]
    ServerName(rustls::pki_types::InvalidDnsNameError),
    /// The TLS handshake with the endpoint.
    #[error("tls")]
    Tls(#[source] std::io::Error),
    /// The HTTP/1 handshake over the TLS connection.
    #[error("{0}")]
    Handshake(hyper::Error),
    /// Building the POST request.
    #[error(transparent)]
    Request(http::Error),
    /// Sending the request over a Service connection.
    #[error("{0}")]
    Send(hyper::Error),
    /// Sending the request through the pooled client.
    #[error(transparent)]
    Client(hyper_util::client::legacy::Error),
    /// Reading the answer's body.
    #[error("{0}")]
    Body(hyper::Error),
    /// The webhook answered with a status other than 2xx.
    #[error("HTTP {0}")]
    Status(http::StatusCode),
}

impl PostError {
    /// This failure, named by the webhook's `url`.
    fn at(self, url: &str) -> WebhookError {
        WebhookError::Post {
            url: url.to_string(),
            source: self,
        }
    }
}

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
    pub fn client(&self, ca_pem: Option<&[u8]>) -> Result<HttpsClient, WebhookError> {
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

fn https_client(ca_pem: Option<&[u8]>) -> Result<HttpsClient, WebhookError> {
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
fn tls_config(ca_pem: Option<&[u8]>) -> Result<rustls::ClientConfig, WebhookError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    if let Some(pem) = ca_pem {
        for cert in rustls_pemfile::certs(&mut &pem[..]).flatten() {
            roots.add(cert).map_err(WebhookError::CaBundle)?;
        }
    }
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(WebhookError::TlsVersions)?
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
) -> Result<Bytes, WebhookError> {
    let (host, url) = (svc.host(), svc.url());
    let tcp = match dialer {
        Some(dial) => dial(addr).await,
        None => tokio::net::TcpStream::connect(addr).await,
    }
    .map_err(|source| PostError::Dial { addr, source }.at(&url))?;
    let name = rustls::pki_types::ServerName::try_from(host.clone())
        .map_err(|e| PostError::ServerName(e).at(&url))?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(tls_config(ca_pem)?))
        .connect(name, tcp)
        .await
        .map_err(|e| PostError::Tls(e).at(&url))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| PostError::Handshake(e).at(&url))?;
    tokio::spawn(connection);
    let request = http::Request::post(svc.path.as_str())
        .header(http::header::HOST, format!("{host}:{}", svc.port))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| PostError::Request(e).at(&url))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| PostError::Send(e).at(&url))?;
    answer(&url, response).await
}

/// POSTs a JSON body and returns the body of a 2xx answer; errors are `Post "url"`.
pub async fn post(client: &HttpsClient, url: &str, body: String) -> Result<Bytes, WebhookError> {
    let request = http::Request::post(url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| PostError::Request(e).at(url))?;
    let response = client
        .request(request)
        .await
        .map_err(|e| PostError::Client(e).at(url))?;
    answer(url, response).await
}

/// The body of a webhook's 2xx answer to a POST to `url`; errors are `Post "url"`.
async fn answer(
    url: &str,
    response: http::Response<hyper::body::Incoming>,
) -> Result<Bytes, WebhookError> {
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| PostError::Body(e).at(url))?
        .to_bytes();
    if !status.is_success() {
        return Err(PostError::Status(status).at(url));
    }
    Ok(body)
}
