//! The HTTPS server: TLS with optional client certificates, then authentication,
//! impersonation, authorization and dispatch of every request.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http::{HeaderMap, Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tandem_apimachinery::rbac::{Attributes, UserInfo, forbidden_message};
use tokio::net::TcpListener;

use crate::authn::PeerIdentity;
use crate::authz::{allowed, authorize};
use crate::error::{ApiError, ApiResult};
use crate::pki::ClusterPki;
use crate::request::{self, Call};
use crate::response::{Body, error_response};
use crate::state::State;

/// Starts serving on `listener` until the process ends.
pub async fn serve(state: Arc<State>, listener: TcpListener) {
    let tls = match tls_config(&state.pki) {
        Ok(c) => tokio_rustls::TlsAcceptor::from(Arc::new(c)),
        Err(e) => {
            tracing::error!("TLS configuration: {e}");
            return;
        }
    };
    let mut stop = state.stopped.subscribe();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|s| *s) => return,
        };
        let (tcp, remote) = match accepted {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("accept: {e}");
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let state = state.clone();
        let state_stop = state.stopped.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let stream = match tls.accept(tcp).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(%remote, "TLS handshake: {e}");
                    return;
                }
            };
            tracing::debug!(%remote, "TLS accepted");
            let peer = PeerIdentity(
                stream
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|certs| certs.first())
                    .and_then(|c| crate::authn::user_from_certificate(c.as_ref())),
            );
            let service = hyper::service::service_fn(move |req| {
                let state = state.clone();
                let peer = peer.clone();
                async move { Ok::<_, Infallible>(handle(state, peer, remote, req).await) }
            });
            let builder =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
            let mut stopped = state_stop.subscribe();
            tokio::select! {
                served = builder
                    .serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(stream), service) => {
                    if let Err(e) = served {
                        tracing::debug!(%remote, "connection: {e}");
                    }
                }
                // The server stopped: the connection goes with it.
                _ = stopped.wait_for(|s| *s) => {}
            }
        });
    }
}

fn tls_config(pki: &ClusterPki) -> anyhow::Result<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let ca =
        rustls_pemfile::certs(&mut pki.ca.cert_pem.as_bytes()).collect::<Result<Vec<_>, _>>()?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in ca {
        roots.add(cert)?;
    }
    // Client certificates are optional: bearer tokens authenticate the rest.
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()?;
    let certs = rustls_pemfile::certs(&mut pki.serving.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()?;
    let key = rustls_pemfile::private_key(&mut pki.serving.key_pem.as_bytes())?
        .ok_or_else(|| anyhow::anyhow!("serving key missing"))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

async fn handle(
    state: Arc<State>,
    peer: PeerIdentity,
    remote: SocketAddr,
    mut req: Request<Incoming>,
) -> Response<Body> {
    let upgrade = hyper::upgrade::on(&mut req);
    let (parts, body) = req.into_parts();
    let query = request::parse_query(parts.uri.query());
    let mut info = request::parse(&parts.method, parts.uri.path(), &query);
    if crate::kubelet_proxy::is_stream_subresource(&info) {
        // exec/attach are authorised as create whatever verb carries the upgrade (kube's
        // AuthorizePodWebsocketUpgradeCreatePermission).
        info.verb = "create".into();
    }
    let user = match crate::authn::authenticate(&state, &peer, &parts.headers) {
        Some(user) => user,
        None => {
            tracing::debug!(%remote, path = %info.path, "credentials refused");
            return error_response(&ApiError::unauthorized());
        }
    };
    let user = match impersonate(&state, user, &parts.headers) {
        Ok(user) => user,
        Err(e) => return error_response(&e),
    };
    if let Err(e) = authorize(&state, &user, &info) {
        return error_response(&e);
    }
    if crate::kubelet_proxy::is_kubelet_subresource(&info) {
        return crate::kubelet_proxy::proxy(
            &state,
            &info,
            parts.uri.query(),
            &parts.headers,
            upgrade,
        )
        .await
        .unwrap_or_else(|e| error_response(&e));
    }
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return error_response(&ApiError::bad_request(format!("reading body: {e}"))),
    };
    let call = Call {
        info,
        query,
        headers: parts.headers,
        user,
        body,
    };
    let started = std::time::Instant::now();
    let result = if call.info.resource_request {
        crate::handlers::resource(&state, &call).await
    } else {
        crate::discovery::non_resource(&state, &call, &parts.method)
    };
    let response = result.unwrap_or_else(|e| error_response(&e));
    tracing::debug!(
        verb = %call.info.verb, path = %call.info.path, user = %call.user.name, %remote,
        code = response.status().as_u16(), elapsed = ?started.elapsed(), "request"
    );
    response
}

/// Applies `Impersonate-User` / `Impersonate-Group` headers if the caller may impersonate.
fn impersonate(state: &State, user: UserInfo, headers: &HeaderMap) -> ApiResult<UserInfo> {
    let Some(target) = headers
        .get("impersonate-user")
        .and_then(|v| v.to_str().ok())
    else {
        if headers.contains_key("impersonate-group") {
            return Err(ApiError::internal(
                "requested [{Group ...}] without impersonating a user",
            ));
        }
        return Ok(user);
    };
    let mut groups = Vec::new();
    let mut checks = vec![("users", target.to_string())];
    for g in headers.get_all("impersonate-group") {
        if let Ok(g) = g.to_str() {
            groups.push(g.to_string());
            checks.push(("groups", g.to_string()));
        }
    }
    for (resource, name) in checks {
        let attrs = Attributes {
            verb: "impersonate",
            namespace: "",
            api_group: "",
            resource,
            subresource: "",
            name: &name,
            path: "",
            resource_request: true,
        };
        if !allowed(state, &user, &attrs) {
            return Err(ApiError::forbidden(
                "",
                resource,
                &name,
                &forbidden_message(&user, &attrs),
            ));
        }
    }
    // As kube's impersonation filter: impersonating system:anonymous makes an unauthenticated
    // request, anyone else an authenticated one.
    let implied = if target == crate::authn::ANONYMOUS_USER {
        crate::authn::UNAUTHENTICATED_GROUP
    } else {
        "system:authenticated"
    };
    if !groups.iter().any(|g| g == implied) {
        groups.push(implied.into());
    }
    Ok(UserInfo {
        name: target.to_string(),
        groups,
    })
}
