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
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    if let Some(pem) = ca_pem {
        for cert in rustls_pemfile::certs(&mut &pem[..]).flatten() {
            roots.add(cert).map_err(|e| format!("caBundle: {e}"))?;
        }
    }
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
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
