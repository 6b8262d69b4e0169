//! The kubelet's HTTPS endpoint in network mode (port 10250 on each node's InternalIP):
//! `/containerLogs` and `/exec`, for the API server's `pods/log` and `pods/exec`.
//!
//! Callers authenticate as kubelet's `--client-ca-file` makes them: only a client certificate
//! from the API server's kubelet-client CA is accepted; anyone else — a pod calling the node
//! directly — gets 401. Exec speaks the WebSocket remote-command protocol kubectl speaks
//! (`v5.channel.k8s.io`, `v4.channel.k8s.io`): one byte of channel (1 stdout, 2 stderr,
//! 3 status) before each message's data.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;

use super::ClusterNetwork;
use super::programs::Log;

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// The remote-command subprotocols served, preferred first.
const PROTOCOLS: &[&str] = &["v5.channel.k8s.io", "v4.channel.k8s.io"];

/// TLS for a node's endpoint: its serving certificate and key (PEM), and the CA whose client
/// certificates are accepted (the API server's kubelet-client CA).
pub fn tls_config(
    cert_pem: &str,
    key_pem: &str,
    client_ca_pem: &str,
) -> anyhow::Result<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile_certs(client_ca_pem)? {
        roots.add(cert)?;
    }
    // No certificate still connects, so that the answer is kubelet's 401 rather than a TLS
    // failure; a certificate from any other CA fails the handshake.
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()?;
    use rustls::pki_types::pem::PemObject;
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|e| anyhow::anyhow!("kubelet serving key: {e}"))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(rustls_pemfile_certs(cert_pem)?, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

fn rustls_pemfile_certs(
    pem: &str,
) -> anyhow::Result<Vec<rustls::pki_types::CertificateDer<'static>>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("certificate PEM: {e}"))
}

/// Serves the endpoint on `listener` (bound in the node's namespace) until it fails.
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    network: Arc<ClusterNetwork>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let (acceptor, network) = (acceptor.clone(), network.clone());
        tokio::spawn(async move {
            let Ok(stream) = acceptor.accept(tcp).await else {
                return;
            };
            let authenticated = stream
                .get_ref()
                .1
                .peer_certificates()
                .is_some_and(|c| !c.is_empty());
            let service = hyper::service::service_fn(move |req| {
                let network = network.clone();
                async move { Ok::<_, Infallible>(handle(network, authenticated, req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .with_upgrades()
                .await;
        });
    }
}

fn text(code: StatusCode, message: impl Into<String>) -> Response<Body> {
    Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from(message.into())).boxed())
        .expect("valid response")
}

async fn handle(
    network: Arc<ClusterNetwork>,
    authenticated: bool,
    req: Request<Incoming>,
) -> Response<Body> {
    if !authenticated {
        return text(StatusCode::UNAUTHORIZED, "Unauthorized");
    }
    let path: Vec<String> = req
        .uri()
        .path()
        .trim_start_matches('/')
        .split('/')
        .map(str::to_string)
        .collect();
    let params: Vec<(String, String)> =
        form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
            .into_owned()
            .collect();
    match path.as_slice() {
        [kind, ns, pod, container] if kind == "containerLogs" => {
            logs(&network, ns, pod, container, &params).await
        }
        [kind, ns, pod, container] if kind == "exec" => {
            exec(network.clone(), ns, pod, container, &params, req)
        }
        _ => text(StatusCode::NOT_FOUND, "404 page not found"),
    }
}

fn param<'a>(params: &'a [(String, String)], key: &str) -> Option<&'a str> {
    params
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

fn flag(params: &[(String, String)], key: &str) -> bool {
    matches!(param(params, key), Some("true" | "1"))
}

async fn logs(
    network: &ClusterNetwork,
    ns: &str,
    pod: &str,
    container: &str,
    params: &[(String, String)],
) -> Response<Body> {
    let Some(log) = network.log_of(ns, pod, container) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("container {container:?} in pod {pod:?} is not running on this node"),
        );
    };
    if flag(params, "previous") {
        return text(
            StatusCode::BAD_REQUEST,
            format!("previous terminated container {container:?} in pod {pod:?} not found"),
        );
    }
    let timestamps = flag(params, "timestamps");
    let tail: Option<usize> = param(params, "tailLines").and_then(|t| t.parse().ok());
    let since = param(params, "sinceSeconds")
        .and_then(|s| s.parse::<i64>().ok())
        .map(|s| {
            k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(s)
        });
    let limit: Option<usize> = param(params, "limitBytes").and_then(|l| l.parse().ok());
    let render = move |lines: &[(k8s_openapi::jiff::Timestamp, String)]| -> String {
        lines
            .iter()
            .filter(|(t, _)| since.is_none_or(|s| *t >= s))
            .map(|(t, l)| {
                if timestamps {
                    format!("{t} {l}\n")
                } else {
                    format!("{l}\n")
                }
            })
            .collect()
    };
    let lines = log.lines();
    let skip = tail.map(|t| lines.len().saturating_sub(t)).unwrap_or(0);
    let mut first = render(&lines[skip..]);
    if let Some(limit) = limit {
        first.truncate(limit);
    }
    if !flag(params, "follow") {
        return Response::builder()
            .header(http::header::CONTENT_TYPE, "text/plain")
            .body(Full::new(Bytes::from(first)).boxed())
            .expect("valid response");
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(16);
    let sent = lines.len();
    tokio::spawn(follow(log, sent, first, render, tx));
    let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    Response::builder()
        .header(http::header::CONTENT_TYPE, "text/plain")
        .body(BodyExt::boxed(body))
        .expect("valid response")
}

/// Sends the log's lines as they come, until the container stops or the reader goes.
async fn follow(
    log: Log,
    mut sent: usize,
    first: String,
    render: impl Fn(&[(k8s_openapi::jiff::Timestamp, String)]) -> String,
    tx: tokio::sync::mpsc::Sender<Result<Frame<Bytes>, Infallible>>,
) {
    if !first.is_empty() && tx.send(Ok(Frame::data(Bytes::from(first)))).await.is_err() {
        return;
    }
    loop {
        let changed = log.changed();
        let lines = log.lines();
        // The log keeps a bounded number of lines: count from what is there now.
        let new = lines.len().saturating_sub(sent.min(lines.len()));
        if new > 0 {
            let chunk = render(&lines[lines.len() - new..]);
            sent = lines.len();
            if tx.send(Ok(Frame::data(Bytes::from(chunk)))).await.is_err() {
                return;
            }
            continue;
        }
        if log.is_closed() {
            return;
        }
        tokio::select! {
            _ = changed => {}
            _ = tx.closed() => return,
        }
    }
}

fn exec(
    network: Arc<ClusterNetwork>,
    ns: &str,
    pod: &str,
    container: &str,
    params: &[(String, String)],
    mut req: Request<Incoming>,
) -> Response<Body> {
    let command: Vec<String> = params
        .iter()
        .filter(|(k, _)| k == "command")
        .map(|(_, v)| v.clone())
        .collect();
    if command.is_empty() {
        return text(
            StatusCode::BAD_REQUEST,
            "you must specify at least one command for the container",
        );
    }
    if network.log_of(ns, pod, container).is_none() {
        return text(
            StatusCode::NOT_FOUND,
            format!("container {container:?} in pod {pod:?} is not running on this node"),
        );
    }
    let headers = req.headers();
    let key = headers.get("sec-websocket-key").cloned();
    let offered: Vec<String> = headers
        .get_all("sec-websocket-protocol")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|p| p.trim().to_string()))
        .collect();
    let wants_websocket = headers
        .get(http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let Some(protocol) = PROTOCOLS.iter().find(|p| offered.iter().any(|o| o == *p)) else {
        return text(
            StatusCode::BAD_REQUEST,
            format!(
                "unable to upgrade: the WebSocket subprotocols {offered:?} are not among {PROTOCOLS:?}"
            ),
        );
    };
    let (true, Some(key)) = (wants_websocket, key) else {
        return text(
            StatusCode::BAD_REQUEST,
            "unable to upgrade: missing WebSocket upgrade headers",
        );
    };
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let upgrade = hyper::upgrade::on(&mut req);
    let (ns, pod, container) = (ns.to_string(), pod.to_string(), container.to_string());
    tokio::spawn(async move {
        let Ok(upgraded) = upgrade.await else { return };
        let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
            hyper_util::rt::TokioIo::new(upgraded),
            Role::Server,
            None,
        )
        .await;
        let (stdout, stderr, code) = network.exec(&ns, &pod, &container, &command).await;
        for (channel, data) in [(1u8, stdout), (2u8, stderr)] {
            if data.is_empty() {
                continue;
            }
            let mut frame = vec![channel];
            frame.extend_from_slice(data.as_bytes());
            if ws.send(Message::binary(frame)).await.is_err() {
                return;
            }
        }
        let status = if code == 0 {
            json!({"metadata": {}, "status": "Success"})
        } else {
            json!({"metadata": {}, "status": "Failure",
                "message": format!("command terminated with non-zero exit code: error executing command {command:?}, exit code {code}"),
                "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]}})
        };
        let mut frame = vec![3u8];
        frame.extend_from_slice(status.to_string().as_bytes());
        let _ = ws.send(Message::binary(frame)).await;
        // A normal closure (1000): kubectl reads the end of each stream from it.
        let _ = ws
            .close(Some(tokio_tungstenite::tungstenite::protocol::CloseFrame {
                code: tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode::Normal,
                reason: "".into(),
            }))
            .await;
        // Drain what the client still sends (stdin close, resize) until it closes too.
        while let Some(Ok(_)) = ws.next().await {}
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(http::header::CONNECTION, "Upgrade")
        .header(http::header::UPGRADE, "websocket")
        .header("sec-websocket-accept", accept)
        .header("sec-websocket-protocol", *protocol)
        .body(Full::new(Bytes::new()).boxed())
        .expect("valid response")
}
