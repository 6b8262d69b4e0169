//! The kubelet API of a virtual node: what the consumer's API server calls for `pods/log`,
//! `pods/exec`, `pods/attach` and `pods/portforward` of a pod bound to the node, carried to the
//! real pod in the provider through the peer identity.
//!
//! The hops, and what each speaks:
//! - kubectl → consumer's API server: the pod subresource (a plain GET for logs; a WebSocket
//!   upgrade, `v5.channel.k8s.io`, for exec and attach). The API server authorises it with the
//!   consumer's RBAC (`pods/log` get, `pods/exec` create) before anything else happens;
//! - API server → this server: the kubelet paths (`/containerLogs/…`, `/exec/…`, `/attach/…`)
//!   over TLS, at the node's InternalIP and `daemonEndpoints.kubeletEndpoint.Port`; the upgrade
//!   is the client's, forwarded as it came;
//! - this server → provider's API server: the same subresource of the real pod in its twin
//!   namespace, as the peer identity (`kube::Client`), a WebSocket of its own for exec/attach;
//!   WebSocket messages are relayed one by one (same subprotocol on both sides, so the channel
//!   byte and v5's close signal mean the same).
//!
//! Port-forward is one SPDY/3.1 session (`portforward.k8s.io`) from kubectl to the provider's
//! kubelet, carried at each hop: kubectl ≥ 1.31 tunnels it in a WebSocket
//! (`SPDY/3.1+portforward.k8s.io`) to the consumer's API server, or asks for the SPDY upgrade
//! itself; the API server asks this server for a SPDY upgrade on `/portForward/…`; this server
//! asks the provider's API server for the same upgrade on the real pod's `pods/portforward`
//! (which asks its kubelet), and splices the two upgraded connections.
//!
//! Who may call: as a kubelet with `--client-ca-file` and `--authorization-mode=Webhook`, a
//! caller must present a client certificate from the CAs the API server publishes in
//! `kube-system/extension-apiserver-authentication` (`client-ca-file`), and a
//! SubjectAccessReview must allow its user `nodes/proxy` on this node. That is the API server's
//! own kubelet-client identity; a user would need `nodes/proxy` on the virtual node — which, as
//! on any node, opens every pod on it, so grant it to nobody. The provider has the last word:
//! its RBAC for the peer identity (the Tenant's `spec.podAccess`) decides whether exec and
//! attach reach its pods, and its refusal comes back as a 403 naming that policy.
//!
//! The serving certificate is obtained the way kubelets get theirs: a CSR for signer
//! `kubernetes.io/kubelet-serving` (CN `system:node:<node>`, O `system:nodes`, the IP as SAN),
//! approved by this controller (a kubelet's would be approved by an admin or an approver),
//! renewed at 80% of its life.
//!
//! `/metrics/resource` (`nodes/metrics`) answers metrics-server's scrape for the offloaded
//! pods, from the provider's metrics API (see [`crate::consumer::kubelet_metrics`]).

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use k8s_openapi::ByteString;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tandem_api::{NamespaceOffloading, names};
use tokio::sync::watch;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;

use crate::consumer::kubelet_metrics::ResourceMetrics;
use crate::consumer::link::{LinkWatch, ProviderLink};
use crate::context::Ctx;

mod plan;

use plan::{Refusal, Route, Subresource};

pub use tandem_api::names::{CLIENT_CA_NAMESPACE, CLIENT_CA_READER_ROLE, KUBELET_SERVING_SIGNER};
pub const CLIENT_CA_CONFIGMAP: &str = "extension-apiserver-authentication";
const CLIENT_CA_KEY: &str = "client-ca-file";
/// Lifetime asked for the serving certificate; renewed at 80% of what the signer gave.
const CERT_SECONDS: i32 = 24 * 3600;
/// How long the signer may take.
const SIGN_WAIT: Duration = Duration::from_secs(60);
/// Wait before retrying after a failure to get a certificate.
const RETRY: Duration = Duration::from_secs(5);
type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error>;

/// Why the server has no certificate yet.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("reading {CLIENT_CA_NAMESPACE}/{CLIENT_CA_CONFIGMAP} (the API server's client CAs)")]
    ClientCa(#[source] kube::Error),
    #[error("{CLIENT_CA_NAMESPACE}/{CLIENT_CA_CONFIGMAP} has no {CLIENT_CA_KEY}")]
    NoClientCa,
    #[error("generating the serving key or request")]
    Key(#[source] rcgen::Error),
    #[error("{step} CertificateSigningRequest {name}")]
    Csr {
        step: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("CertificateSigningRequest {name} was {verdict}: {message}")]
    Refused {
        name: String,
        verdict: String,
        message: String,
    },
    #[error(
        "CertificateSigningRequest {0} was not signed within {SIGN_WAIT:?} (is a signer for kubernetes.io/kubelet-serving running?)"
    )]
    NotSigned(String),
    #[error("the signed certificate of CertificateSigningRequest {0} is not a PEM certificate")]
    BadCertificate(String),
    #[error("TLS configuration")]
    Tls(#[source] rustls::Error),
    #[error("client CA bundle")]
    ClientCaBundle(#[source] rustls::server::VerifierBuilderError),
}

/// Serves the kubelet API of `link`'s virtual node until aborted, and publishes its address
/// into `endpoint` once it has a certificate (the virtual node's status carries it).
pub async fn run(ctx: Ctx, mut link: LinkWatch, endpoint: watch::Sender<Option<SocketAddr>>) {
    let node = loop {
        if let Some(l) = link.get() {
            break l.virtual_node;
        }
        link.changed().await;
    };
    let ip = ctx.options.kubelet_address;
    let listener = loop {
        match tokio::net::TcpListener::bind((ip, 0)).await {
            Ok(l) => break l,
            Err(e) => {
                tracing::warn!(%node, %ip, error = %e, "virtual kubelet: cannot listen");
                tokio::time::sleep(RETRY).await;
            }
        }
    };
    let Ok(addr) = listener.local_addr() else {
        return;
    };
    let tls: watch::Sender<Option<Arc<rustls::ServerConfig>>> = watch::Sender::new(None);
    let server = tokio::spawn(serve(
        listener,
        tls.subscribe(),
        ctx.clone(),
        link.clone(),
        node.clone(),
    ));
    let _server = crate::tasks::AbortOnDrop::new(server);
    loop {
        match credentials(&ctx, &node, ip).await {
            Ok((config, valid_for)) => {
                tls.send_replace(Some(Arc::new(config)));
                endpoint.send_replace(Some(addr));
                tracing::info!(%node, %addr, "virtual kubelet API serving");
                tokio::time::sleep(valid_for.mul_f64(0.8)).await;
            }
            Err(e) => {
                tracing::warn!(%node, error = %crate::error::chain(&e), "virtual kubelet: serving certificate");
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

/// A fresh serving certificate (through the CSR API) and the TLS configuration that uses it,
/// with how long it is valid.
async fn credentials(
    ctx: &Ctx,
    node: &str,
    ip: IpAddr,
) -> Result<(rustls::ServerConfig, Duration), CertError> {
    let client_ca = Api::<ConfigMap>::namespaced(ctx.client.clone(), CLIENT_CA_NAMESPACE)
        .get(CLIENT_CA_CONFIGMAP)
        .await
        .map_err(CertError::ClientCa)?
        .data
        .and_then(|d| d.get(CLIENT_CA_KEY).cloned())
        .filter(|pem| !pem.trim().is_empty())
        .ok_or(CertError::NoClientCa)?;

    let key = rcgen::KeyPair::generate().map_err(CertError::Key)?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(CertError::Key)?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("system:node:{node}"));
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:nodes");
    params.subject_alt_names = vec![rcgen::SanType::IpAddress(ip)];
    let request = params
        .serialize_request(&key)
        .and_then(|r| r.pem())
        .map_err(CertError::Key)?;
    let cert_pem = signed(ctx, node, &request).await?;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(pem_certs(&client_ca));
    if added == 0 {
        return Err(CertError::NoClientCa);
    }
    // No certificate still connects, so that the answer is a kubelet's 401 rather than a TLS
    // failure; a certificate from any other CA fails the handshake.
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()
    .map_err(CertError::ClientCaBundle)?;
    let chain = pem_certs(&cert_pem);
    let name = csr_name(node);
    let valid_for = chain
        .first()
        .and_then(|der| x509_parser::parse_x509_certificate(der).ok())
        .and_then(|(_, c)| c.validity().time_to_expiration())
        .and_then(|d| Duration::try_from(d).ok())
        .ok_or_else(|| CertError::BadCertificate(name.clone()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(CertError::Tls)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            chain,
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .map_err(CertError::Tls)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((config, valid_for))
}

fn csr_name(node: &str) -> String {
    format!("tandem-kubelet-serving-{node}")
}

fn pem_certs(pem: &str) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
        .filter_map(Result::ok)
        .collect()
}

/// Files the request (replacing one left by an earlier run: its key is gone), approves it,
/// waits for the signer and removes it; the certificate's PEM.
async fn signed(ctx: &Ctx, node: &str, request: &str) -> Result<String, CertError> {
    let api: Api<CertificateSigningRequest> = Api::all(ctx.client.clone());
    let name = csr_name(node);
    let err = |step: &'static str, name: &str| {
        let name = name.to_string();
        move |source| CertError::Csr { step, name, source }
    };
    match api.delete(&name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(e) if tandem_api::client::is_not_found(&e) => {}
        Err(e) => return Err(err("removing the previous", &name)(e)),
    }
    let csr: CertificateSigningRequest = serde_json::from_value(json!({
        "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"name": name, "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY}},
        "spec": {
            "request": ByteString(request.as_bytes().to_vec()),
            "signerName": KUBELET_SERVING_SIGNER,
            "expirationSeconds": CERT_SECONDS,
            "usages": ["digital signature", "server auth"],
        },
    }))
    .expect("static manifest");
    // The request goes when this does, also when the task is aborted half-way (the link
    // gone: unpeered): otherwise it would outlive the peering. Only this one (by UID): a task
    // started after would file its own under the same name.
    struct RemoveOnDrop(Api<CertificateSigningRequest>, String, Option<String>);
    impl Drop for RemoveOnDrop {
        fn drop(&mut self) {
            if let (Some(uid), Ok(runtime)) = (self.2.take(), tokio::runtime::Handle::try_current())
            {
                let (api, name) = (self.0.clone(), std::mem::take(&mut self.1));
                runtime.spawn(async move {
                    let _ = api.delete(&name, &only(uid)).await;
                });
            }
        }
    }
    fn only(uid: String) -> DeleteParams {
        DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::default()
        }
    }
    let mut remove = RemoveOnDrop(api.clone(), name.clone(), None);
    // The delete above may still be finishing: retry the create briefly on a conflict.
    let deadline = tokio::time::Instant::now() + SIGN_WAIT;
    loop {
        match api.create(&PostParams::default(), &csr).await {
            Ok(created) => {
                remove.2 = created.metadata.uid;
                break;
            }
            Err(e)
                if tandem_api::client::is_conflict(&e)
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(err("creating", &name)(e)),
        }
    }
    api.patch_subresource(
        "approval",
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"conditions": [{
            "type": "Approved", "status": "True", "reason": "TandemVirtualKubelet",
            "message": format!("serving certificate of virtual node {node}"),
        }]}})),
    )
    .await
    .map_err(err("approving", &name))?;
    let result = loop {
        let csr = api.get(&name).await.map_err(err("reading", &name))?;
        if let Some(cert) = tandem_api::client::issued_certificate(&csr) {
            break String::from_utf8(cert.0.clone())
                .map_err(|_| CertError::BadCertificate(name.clone()));
        }
        let status = csr.status.unwrap_or_default();
        if let Some(c) = status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| (c.type_ == "Denied" || c.type_ == "Failed") && c.status == "True")
        {
            break Err(CertError::Refused {
                name: name.clone(),
                verdict: c.type_.to_lowercase(),
                message: c.message.unwrap_or_default(),
            });
        }
        if tokio::time::Instant::now() >= deadline {
            break Err(CertError::NotSigned(name.clone()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Issued (or refused): the request has served its purpose.
    if let Some(uid) = remove.2.clone() {
        let _ = api.delete(&name, &only(uid)).await;
        remove.2 = None;
    }
    result
}

/// Accepts connections with the TLS configuration of the moment (none yet: refused).
async fn serve(
    listener: tokio::net::TcpListener,
    tls: watch::Receiver<Option<Arc<rustls::ServerConfig>>>,
    ctx: Ctx,
    link: LinkWatch,
    node: String,
) {
    let counters = ResourceMetrics::default();
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        // Streams (exec, port-forward) carry small writes that must not wait for an ACK.
        let _ = tcp.set_nodelay(true);
        let Some(config) = tls.borrow().clone() else {
            continue;
        };
        let (ctx, link, node, counters) =
            (ctx.clone(), link.clone(), node.clone(), counters.clone());
        tokio::spawn(async move {
            let Ok(stream) = tokio_rustls::TlsAcceptor::from(config).accept(tcp).await else {
                return;
            };
            let caller = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|der| caller_of(der));
            let service = hyper::service::service_fn(move |req| {
                let (ctx, link, node, caller, counters) = (
                    ctx.clone(),
                    link.clone(),
                    node.clone(),
                    caller.clone(),
                    counters.clone(),
                );
                async move {
                    Ok::<_, Infallible>(
                        handle(&ctx, &link, &node, caller.as_ref(), &counters, req).await,
                    )
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades()
                .await;
        });
    }
}

/// A caller authenticated by its client certificate: user (CN) and groups (O).
#[derive(Clone, Debug)]
struct Caller {
    user: String,
    groups: Vec<String>,
}

fn caller_of(der: &[u8]) -> Option<Caller> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let user = subject
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_string();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    Some(Caller { user, groups })
}

fn text(code: StatusCode, message: impl Into<String>) -> Response<Body> {
    Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(
            Full::new(Bytes::from(message.into()))
                .map_err(|never| match never {})
                .boxed_unsync(),
        )
        .expect("valid response")
}

/// The answer a kubelet gives for `refusal`.
fn refused(refusal: Refusal) -> Response<Body> {
    text(refusal.status(), refusal.to_string())
}

async fn handle(
    ctx: &Ctx,
    link: &LinkWatch,
    node: &str,
    caller: Option<&Caller>,
    counters: &ResourceMetrics,
    req: Request<Incoming>,
) -> Response<Body> {
    match answer(ctx, link, node, caller, counters, req).await {
        Ok(response) => response,
        Err(refusal) => refused(refusal),
    }
}

async fn answer(
    ctx: &Ctx,
    link: &LinkWatch,
    node: &str,
    caller: Option<&Caller>,
    counters: &ResourceMetrics,
    req: Request<Incoming>,
) -> Result<Response<Body>, Refusal> {
    let caller = caller.ok_or(Refusal::Unauthenticated)?;
    let path: Vec<String> = req
        .uri()
        .path()
        .trim_start_matches('/')
        .split('/')
        .map(str::to_string)
        .collect();
    let (verb, subresource) = plan::attributes(req.method(), &path);
    let allowed = authorized(ctx, caller, verb, subresource, node)
        .await
        .map_err(|e| Refusal::Failed {
            step: "authorizing the request (SubjectAccessReview)".into(),
            error: e.to_string(),
        })?;
    if !allowed {
        return Err(Refusal::Forbidden {
            user: caller.user.clone(),
            verb,
            subresource,
        });
    }
    let route = plan::route(&path)?;
    let not_established = || Refusal::NotEstablished { node: node.into() };
    let Route::Pod {
        subresource,
        namespace: ns,
        pod,
        container,
    } = route
    else {
        let link = link.get().ok_or_else(not_established)?;
        let body = counters.render(ctx, &link).await;
        return Ok(Response::builder()
            .header(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")
            .body(
                Full::new(Bytes::from(body))
                    .map_err(|never| match never {})
                    .boxed_unsync(),
            )
            .expect("valid response"));
    };
    let params: Vec<(String, String)> =
        form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
            .into_owned()
            .collect();
    let link = link.get().ok_or_else(not_established)?;
    let twin = twin_namespace(ctx, &link, &ns, &pod).await?;
    match (subresource, container) {
        (Subresource::Logs, Some(c)) => logs(&link, &twin, &pod, &c, &params).await,
        (Subresource::Exec | Subresource::Attach, Some(c)) => {
            stream(&link, subresource, &twin, &pod, &c, &params, req).await
        }
        _ => port_forward(&link, &twin, &pod, req).await,
    }
}

async fn authorized(
    ctx: &Ctx,
    caller: &Caller,
    verb: &str,
    subresource: &str,
    node: &str,
) -> Result<bool, kube::Error> {
    let mut groups = caller.groups.clone();
    groups.push("system:authenticated".into());
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(caller.user.clone()),
            groups: Some(groups),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.into()),
                resource: Some("nodes".into()),
                subresource: Some(subresource.into()),
                name: Some(node.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SubjectAccessReview>::all(ctx.client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// The twin namespace on the provider of the pod `ns/pod`, if the pod is bound to this virtual
/// node and its namespace is offloaded there; else the answer a kubelet would give.
async fn twin_namespace(
    ctx: &Ctx,
    link: &ProviderLink,
    ns: &str,
    pod: &str,
) -> Result<String, Refusal> {
    let found = Api::<Pod>::namespaced(ctx.client.clone(), ns)
        .get_opt(pod)
        .await
        .map_err(|e| Refusal::Failed {
            step: format!("reading pod {ns}/{pod}"),
            error: e.to_string(),
        })?;
    plan::on_node(found.as_ref(), ns, pod, &link.virtual_node)?;
    let offloadings = Api::<NamespaceOffloading>::namespaced(ctx.client.clone(), ns)
        .list(&Default::default())
        .await
        .map_err(|e| Refusal::Failed {
            step: format!("reading the NamespaceOffloading of {ns}"),
            error: e.to_string(),
        })?;
    plan::twin(&offloadings.items, ns, &link.provider_id)
}

/// Sends `request` (for `subresource` on pod `target`) to the provider on the streaming
/// client. A failure to get an answer, or an answer whose status `accepted` refuses, is
/// returned as the refusal the consumer's API server should get.
async fn send(
    link: &ProviderLink,
    request: Request<kube::client::Body>,
    subresource: Subresource,
    target: &str,
    accepted: impl Fn(StatusCode) -> bool,
) -> Result<Response<kube::client::Body>, Refusal> {
    let response = link
        .stream_client
        .send(request)
        .await
        .map_err(|e| Refusal::ProviderSilent {
            provider: link.provider_id.clone(),
            subresource,
            target: target.into(),
            error: crate::error::chain(&e),
        })?;
    let status = response.status();
    if accepted(status) {
        return Ok(response);
    }
    let body = response
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    Err(Refusal::ByProvider {
        provider: link.provider_id.clone(),
        subresource,
        code: status.as_u16(),
        message: plan::status_message(&body),
    })
}

async fn logs(
    link: &ProviderLink,
    twin: &str,
    pod: &str,
    container: &str,
    params: &[(String, String)],
) -> Result<Response<Body>, Refusal> {
    let path = plan::provider_path(Subresource::Logs, twin, pod, container, params);
    let request = Request::get(path)
        .body(kube::client::Body::empty())
        .expect("valid request");
    let target = format!("{twin}/{pod}");
    let response = send(link, request, Subresource::Logs, &target, |s| {
        s.is_success()
    })
    .await?;
    let status = response.status();
    let mut out = Response::builder().status(status);
    if let Some(t) = response.headers().get(http::header::CONTENT_TYPE) {
        out = out.header(http::header::CONTENT_TYPE, t);
    }
    Ok(out
        .body(
            response
                .into_body()
                .map_err(std::io::Error::other)
                .boxed_unsync(),
        )
        .expect("valid response"))
}

/// Exec or attach: opens the provider's WebSocket first (so that its refusal is this answer),
/// then switches the API server's connection to the same subprotocol and relays messages.
async fn stream(
    link: &ProviderLink,
    kind: Subresource,
    twin: &str,
    pod: &str,
    container: &str,
    params: &[(String, String)],
    mut req: Request<Incoming>,
) -> Result<Response<Body>, Refusal> {
    let Some(key) = req
        .headers()
        .get(http::header::SEC_WEBSOCKET_KEY)
        .map(|k| k.as_bytes().to_vec())
    else {
        // kubectl falls back to SPDY when the WebSocket upgrade fails (a refusal included):
        // tell it why the WebSocket was refused rather than that SPDY is not spoken here.
        let sub = kind.provider_subresource();
        if let Ok(false) = provider_allows(link, sub, twin).await {
            return Err(Refusal::ByProvider {
                provider: link.provider_id.clone(),
                subresource: kind,
                code: 403,
                message: format!("the peer identity may not create pods/{sub} in {twin}"),
            });
        }
        return Err(Refusal::NotWebSocket);
    };
    let offered: Vec<String> = req
        .headers()
        .get_all(http::header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_string())
        .collect();
    let path = plan::provider_path(kind, twin, pod, container, params);
    let (provider, protocol) = match open_websocket(&link.stream_client, &path).await {
        Ok(opened) => opened,
        Err(OpenError::Refused(code, message)) => {
            return Err(Refusal::ByProvider {
                provider: link.provider_id.clone(),
                subresource: kind,
                code,
                message,
            });
        }
        Err(OpenError::Failed(error)) => {
            return Err(Refusal::ProviderDidNotOpen {
                provider: link.provider_id.clone(),
                subresource: kind,
                target: format!("{twin}/{pod}"),
                error,
            });
        }
    };
    if !offered.iter().any(|p| p == protocol) {
        return Err(Refusal::ProtocolNotOffered { protocol, offered });
    }
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(upgraded) = upgrade.await else {
            return;
        };
        let client =
            WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        relay(client, provider).await;
    });
    Ok(Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(http::header::CONNECTION, "Upgrade")
        .header(http::header::UPGRADE, "websocket")
        .header(
            http::header::SEC_WEBSOCKET_ACCEPT,
            tokio_tungstenite::tungstenite::handshake::derive_accept_key(&key),
        )
        .header(http::header::SEC_WEBSOCKET_PROTOCOL, protocol)
        .body(
            http_body_util::Empty::new()
                .map_err(|never| match never {})
                .boxed_unsync(),
        )
        .expect("valid response"))
}

/// The stream protocol of port-forward's SPDY session.
const PORT_FORWARD_PROTOCOL: &str = "portforward.k8s.io";

/// Port-forward: the API server asks for a SPDY/3.1 upgrade (whether kubectl tunnels its SPDY
/// session through a WebSocket to the API server or not). The same upgrade is asked of the
/// provider's API server for the real pod (`pods/portforward`, as the peer identity); once it
/// has switched, the API server's connection switches too and the bytes are spliced: the SPDY
/// session runs from kubectl to the provider's kubelet, which opens the pod's ports. A refusal
/// by the provider is this answer.
async fn port_forward(
    link: &ProviderLink,
    twin: &str,
    pod: &str,
    mut req: Request<Incoming>,
) -> Result<Response<Body>, Refusal> {
    let spdy = req
        .headers()
        .get(http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("SPDY/3.1"));
    if !spdy {
        return Err(Refusal::NotSpdy);
    }
    let mut request = Request::post(format!("/api/v1/namespaces/{twin}/pods/{pod}/portforward"))
        .header(http::header::CONNECTION, "Upgrade")
        .header(http::header::UPGRADE, "SPDY/3.1");
    let offered = req.headers().get_all("x-stream-protocol-version");
    if offered.iter().next().is_none() {
        request = request.header("x-stream-protocol-version", PORT_FORWARD_PROTOCOL);
    }
    for v in offered {
        request = request.header("x-stream-protocol-version", v);
    }
    let request = request
        .body(kube::client::Body::empty())
        .expect("valid request");
    let target = format!("{twin}/{pod}");
    let accepted = |s| s == StatusCode::SWITCHING_PROTOCOLS;
    let response = send(link, request, Subresource::PortForward, &target, accepted).await?;
    let mut out = Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(http::header::CONNECTION, "Upgrade")
        .header(http::header::UPGRADE, "SPDY/3.1");
    if let Some(chosen) = response.headers().get("x-stream-protocol-version") {
        out = out.header("x-stream-protocol-version", chosen);
    }
    let client = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let (Ok(provider), Ok(client)) = (hyper::upgrade::on(response).await, client.await) else {
            return;
        };
        let _ =
            tokio::io::copy_bidirectional(&mut TokioIo::new(client), &mut TokioIo::new(provider))
                .await;
    });
    Ok(out
        .body(
            http_body_util::Empty::new()
                .map_err(|never| match never {})
                .boxed_unsync(),
        )
        .expect("valid response"))
}

/// The remote-command subprotocols asked of the provider, preferred first.
const PROTOCOLS: [&str; 2] = ["v5.channel.k8s.io", "v4.channel.k8s.io"];

/// Why the provider's WebSocket did not open.
enum OpenError {
    /// The provider answered with this status and message.
    Refused(u16, String),
    /// No answer, or not a WebSocket.
    Failed(String),
}

/// Opens a WebSocket to `path` on the provider through `client` (the peer identity): the
/// upgrade request kube-apiserver expects, then the upgraded connection (kube's `ws` feature
/// does the same, but pulls a second tungstenite into the tree).
async fn open_websocket(
    client: &kube::Client,
    path: &str,
) -> Result<
    (
        WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>,
        &'static str,
    ),
    OpenError,
> {
    use tokio_tungstenite::tungstenite::handshake::client::generate_key;
    let key = generate_key();
    let request = Request::get(path)
        .header(http::header::CONNECTION, "Upgrade")
        .header(http::header::UPGRADE, "websocket")
        .header(http::header::SEC_WEBSOCKET_VERSION, "13")
        .header(http::header::SEC_WEBSOCKET_KEY, &key)
        .header(http::header::SEC_WEBSOCKET_PROTOCOL, PROTOCOLS.join(", "))
        .body(kube::client::Body::empty())
        .expect("valid request");
    let response = client
        .send(request)
        .await
        .map_err(|e| OpenError::Failed(crate::error::chain(&e)))?;
    let status = response.status();
    if status != StatusCode::SWITCHING_PROTOCOLS {
        let body = response
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        return Err(OpenError::Refused(
            status.as_u16(),
            plan::status_message(&body),
        ));
    }
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let headers = response.headers();
    if headers
        .get(http::header::SEC_WEBSOCKET_ACCEPT)
        .map(|v| v.as_bytes())
        != Some(accept.as_bytes())
    {
        return Err(OpenError::Failed(
            "the WebSocket accept key does not match".into(),
        ));
    }
    let protocol = headers
        .get(http::header::SEC_WEBSOCKET_PROTOCOL)
        .and_then(|v| v.to_str().ok())
        .and_then(|p| PROTOCOLS.into_iter().find(|known| *known == p.trim()))
        .ok_or_else(|| OpenError::Failed("no remote-command subprotocol was chosen".into()))?;
    let upgraded = hyper::upgrade::on(response)
        .await
        .map_err(|e| OpenError::Failed(format!("upgrading the connection: {e}")))?;
    let stream = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Client, None).await;
    Ok((stream, protocol))
}

/// Whether the provider lets the peer identity open `pods/<sub>` in `twin`
/// (SelfSubjectAccessReview, which any authenticated user may file).
async fn provider_allows(link: &ProviderLink, sub: &str, twin: &str) -> Result<bool, kube::Error> {
    use k8s_openapi::api::authorization::v1::{
        SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    };
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some("create".into()),
                resource: Some("pods".into()),
                subresource: Some(sub.into()),
                namespace: Some(twin.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SelfSubjectAccessReview>::all(link.client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// Relays messages both ways until both sides have closed (pings are answered by each side's
/// own WebSocket, not passed on).
async fn relay<A, B>(a: WebSocketStream<A>, b: WebSocketStream<B>)
where
    A: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    B: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut a_tx, mut a_rx) = a.split();
    let (mut b_tx, mut b_rx) = b.split();
    // Data messages pass; a close frame passes with its code (kubectl reads the end of each
    // stream from a normal closure, 1000), then that direction is done.
    let forward =
        |m: &Message| matches!(m, Message::Binary(_) | Message::Text(_) | Message::Close(_));
    let up = async {
        while let Some(Ok(m)) = a_rx.next().await {
            let close = m.is_close();
            if forward(&m) && b_tx.send(m).await.is_err() || close {
                break;
            }
        }
        let _ = b_tx.close().await;
    };
    let down = async {
        while let Some(Ok(m)) = b_rx.next().await {
            let close = m.is_close();
            if forward(&m) && a_tx.send(m).await.is_err() || close {
                break;
            }
        }
        let _ = a_tx.close().await;
    };
    // Once one side is done, the other gets a bounded time to finish (the exit status follows
    // the last output; a client gone without a close must not hold the provider's session).
    tokio::pin!(up, down);
    tokio::select! {
        () = &mut up => { let _ = tokio::time::timeout(Duration::from_secs(5), &mut down).await; }
        () = &mut down => { let _ = tokio::time::timeout(Duration::from_secs(5), &mut up).await; }
    }
}
