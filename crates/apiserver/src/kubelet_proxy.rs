//! `pods/log`, `pods/exec`, `pods/attach` and `pods/portforward`: carried to the kubelet of the
//! pod's node, as kube-apiserver does. Logs stream back as the kubelet sends them; exec and
//! attach forward the client's upgrade (WebSocket `v5.channel.k8s.io` from kubectl ≥ 1.30) to
//! the kubelet and splice the two connections once both sides have switched protocols
//! (kube-apiserver's UpgradeAwareHandler).
//!
//! Port-forward is SPDY/3.1 (`portforward.k8s.io`) between the client and the kubelet, which
//! this server only carries. kubectl ≥ 1.31 first asks for a WebSocket with subprotocol
//! `SPDY/3.1+portforward.k8s.io` and tunnels its SPDY session through it; the API server then
//! upgrades to plain SPDY towards the kubelet and relays the bytes, message boundaries
//! meaning nothing (kube-apiserver's `streamtunnel.go`). An older client (or
//! `KUBECTL_PORT_FORWARD_WEBSOCKETS=false`) asks for the SPDY upgrade itself, which is
//! forwarded and spliced like exec's.
//!
//! The API server authenticates to kubelets with a client certificate from a CA of its own,
//! and checks each kubelet's serving certificate against the cluster CA.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use serde_json::Value;

use crate::error::{ApiError, ApiResult};
use crate::request::RequestInfo;
use crate::response::Body;
use crate::state::State;

/// The subresources carried to the kubelet.
pub fn is_kubelet_subresource(info: &RequestInfo) -> bool {
    info.resource_request
        && info.group.is_empty()
        && info.resource == "pods"
        && matches!(
            info.subresource.as_str(),
            "log" | "exec" | "attach" | "portforward"
        )
}

/// The WebSocket subprotocol that tunnels a port-forward SPDY session (kubectl ≥ 1.31).
pub const PORT_FORWARD_TUNNEL: &str = "SPDY/3.1+portforward.k8s.io";

/// The port-forward stream protocol, as negotiated with the kubelet.
const PORT_FORWARD_PROTOCOL: &str = "portforward.k8s.io";

/// Whether the client asks for a WebSocket tunnel of port-forward's SPDY session.
fn wants_tunnel(headers: &http::HeaderMap) -> bool {
    let websocket = headers
        .get(http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    websocket
        && headers
            .get_all(http::header::SEC_WEBSOCKET_PROTOCOL)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|p| p.trim() == PORT_FORWARD_TUNNEL)
}

/// Whether the subresource opens a stream (authorised as `create` whatever the HTTP verb, as
/// kube does for upgrade requests).
pub fn is_stream_subresource(info: &RequestInfo) -> bool {
    is_kubelet_subresource(info) && info.subresource != "log"
}

fn pod_field<'a>(pod: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(pod, |v, k| v.get(*k))
}

/// Serves one log, exec or attach request.
pub async fn proxy(
    state: &Arc<State>,
    info: &RequestInfo,
    query: Option<&str>,
    headers: &http::HeaderMap,
    client_upgrade: hyper::upgrade::OnUpgrade,
) -> ApiResult<Response<Body>> {
    let pods = state
        .registry
        .read()
        .get("", "v1", "pods")
        .ok_or_else(ApiError::no_route)?;
    let pod = crate::state::fetch(state, &pods, &info.namespace, &info.name)?.value();
    let name = &info.name;
    let node = pod_field(&pod, &["spec", "nodeName"])
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ApiError::bad_request(format!("pod {name} does not have a host assigned")))?
        .to_string();
    let params: Vec<(String, String)> = form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .into_owned()
        .collect();
    let (ip, port) = kubelet_address(state, &node)?;
    if info.subresource == "portforward" {
        let path = format!("/portForward/{}/{name}", info.namespace);
        return port_forward(
            state,
            &node,
            SocketAddr::new(ip, port),
            path,
            headers,
            client_upgrade,
        )
        .await;
    }
    let containers: Vec<String> = pod_field(&pod, &["spec", "containers"])
        .and_then(Value::as_array)
        .map(|cs| {
            cs.iter()
                .filter_map(|c| c["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let container = match params.iter().find(|(k, _)| k == "container") {
        Some((_, c)) => c.clone(),
        None if containers.len() == 1 => containers[0].clone(),
        None => {
            return Err(ApiError::bad_request(format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                containers.join(" ")
            )));
        }
    };
    if !containers.contains(&container) {
        return Err(ApiError::bad_request(format!(
            "container {container} is not valid for pod {name}"
        )));
    }
    let forwarded: String = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(params.iter().filter(|(k, _)| k != "container"))
        .finish();
    let ns = &info.namespace;
    let path = match info.subresource.as_str() {
        "log" => format!("/containerLogs/{ns}/{name}/{container}?{forwarded}"),
        sub => format!("/{sub}/{ns}/{name}/{container}?{forwarded}"),
    };
    let mut request = Request::builder()
        .method("GET")
        .uri(&path)
        .header(http::header::HOST, format!("{ip}:{port}"));
    if info.subresource != "log" {
        // Forward the client's upgrade request as it came.
        for (k, v) in headers {
            let k = k.as_str();
            if k.starts_with("sec-websocket") || k == "connection" || k == "upgrade" {
                request = request.header(k, v);
            }
        }
    }
    let mut response = send(state, SocketAddr::new(ip, port), &node, request).await?;
    let status = response.status();
    if status == StatusCode::SWITCHING_PROTOCOLS {
        return Ok(splice(client_upgrade, &mut response));
    }
    if !status.is_success() {
        return Err(refusal(response).await);
    }
    let mut out = Response::builder().status(status);
    for (k, v) in response.headers() {
        if k == http::header::CONTENT_TYPE || k == http::header::TRANSFER_ENCODING {
            out = out.header(k, v);
        }
    }
    let body = response.into_body().map_err(std::io::Error::other).boxed();
    out.body(body)
        .map_err(|e| ApiError::internal(e.to_string()))
}

/// Sends `request` (without a body) to the kubelet at `addr` on a connection of its own, which
/// may switch protocols.
async fn send(
    state: &State,
    addr: SocketAddr,
    node: &str,
    request: http::request::Builder,
) -> ApiResult<Response<hyper::body::Incoming>> {
    let stream = connect(state, addr, node).await?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| {
                ApiError::internal(format!("talking to the kubelet of node {node}: {e}"))
            })?;
    tokio::spawn(conn.with_upgrades());
    let request = request
        .body(Empty::<Bytes>::new())
        .map_err(|e| ApiError::internal(e.to_string()))?;
    sender
        .send_request(request)
        .await
        .map_err(|e| ApiError::internal(format!("talking to the kubelet of node {node}: {e}")))
}

/// The kubelet switched protocols: answers the client with the kubelet's 101 and, once both
/// connections have switched, copies bytes between them until either ends.
fn splice(
    client_upgrade: hyper::upgrade::OnUpgrade,
    response: &mut Response<hyper::body::Incoming>,
) -> Response<Body> {
    let kubelet_upgrade = hyper::upgrade::on(&mut *response);
    let mut out = Response::builder().status(StatusCode::SWITCHING_PROTOCOLS);
    for (k, v) in response.headers() {
        out = out.header(k, v);
    }
    tokio::spawn(async move {
        let (Ok(client), Ok(kubelet)) = (client_upgrade.await, kubelet_upgrade.await) else {
            return;
        };
        let mut client = hyper_util::rt::TokioIo::new(client);
        let mut kubelet = hyper_util::rt::TokioIo::new(kubelet);
        let _ = tokio::io::copy_bidirectional(&mut client, &mut kubelet).await;
    });
    out.body(crate::response::empty_body())
        .expect("headers copied from a valid response")
}

/// The body of a refusal, as text.
async fn refusal(response: Response<hyper::body::Incoming>) -> ApiError {
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).trim().to_string())
        .unwrap_or_default();
    ApiError::from_kubelet(status.as_u16(), body)
}

/// `pods/portforward`: the kubelet always gets a SPDY upgrade. A client asking for the
/// WebSocket tunnel gets its 101 once the kubelet has switched, and its binary messages are
/// relayed to the kubelet as bytes (and the kubelet's bytes back as binary messages); a
/// client asking for SPDY itself is spliced to the kubelet.
async fn port_forward(
    state: &State,
    node: &str,
    addr: SocketAddr,
    path: String,
    headers: &http::HeaderMap,
    client_upgrade: hyper::upgrade::OnUpgrade,
) -> ApiResult<Response<Body>> {
    let tunnel = wants_tunnel(headers);
    let mut request = Request::builder()
        .method("POST")
        .uri(&path)
        .header(http::header::HOST, addr.to_string())
        .header(http::header::CONNECTION, "Upgrade")
        .header(http::header::UPGRADE, "SPDY/3.1");
    if tunnel {
        request = request.header("x-stream-protocol-version", PORT_FORWARD_PROTOCOL);
    } else {
        for v in headers.get_all("x-stream-protocol-version") {
            request = request.header("x-stream-protocol-version", v);
        }
    }
    let key = headers.get(http::header::SEC_WEBSOCKET_KEY).cloned();
    if tunnel && key.is_none() {
        return Err(ApiError::bad_request(
            "unable to upgrade: missing Sec-WebSocket-Key",
        ));
    }
    let mut response = send(state, addr, node, request).await?;
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Err(refusal(response).await);
    }
    let Some(key) = key.filter(|_| tunnel) else {
        return Ok(splice(client_upgrade, &mut response));
    };
    let kubelet_upgrade = hyper::upgrade::on(&mut response);
    tokio::spawn(async move {
        let (Ok(client), Ok(kubelet)) = (client_upgrade.await, kubelet_upgrade.await) else {
            return;
        };
        let ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
            hyper_util::rt::TokioIo::new(client),
            tokio_tungstenite::tungstenite::protocol::Role::Server,
            None,
        )
        .await;
        tunnel_bytes(ws, hyper_util::rt::TokioIo::new(kubelet)).await;
    });
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(http::header::CONNECTION, "Upgrade")
        .header(http::header::UPGRADE, "websocket")
        .header(http::header::SEC_WEBSOCKET_ACCEPT, accept)
        .header(http::header::SEC_WEBSOCKET_PROTOCOL, PORT_FORWARD_TUNNEL)
        .body(crate::response::empty_body())
        .map_err(|e| ApiError::internal(e.to_string()))
}

/// Relays a WebSocket tunnel and a byte stream: each binary message is written as it came,
/// each read is sent as one binary message. Either side's end ends both.
async fn tunnel_bytes<S, K>(ws: tokio_tungstenite::WebSocketStream<S>, kubelet: K)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    K: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use futures::{SinkExt, StreamExt};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_tungstenite::tungstenite::Message;
    let (mut ws_tx, mut ws_rx) = ws.split();
    let (mut k_rx, mut k_tx) = tokio::io::split(kubelet);
    let inbound = async {
        while let Some(Ok(message)) = ws_rx.next().await {
            match message {
                Message::Binary(data) if k_tx.write_all(&data).await.is_err() => break,
                Message::Close(_) => break,
                _ => {}
            }
        }
        let _ = k_tx.shutdown().await;
    };
    let outbound = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match k_rx.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let data = Bytes::copy_from_slice(&buf[..n]);
                    if ws_tx.send(Message::Binary(data)).await.is_err() {
                        return;
                    }
                }
            }
        }
        let _ = ws_tx.close().await;
    };
    // The session is over when either side is: kubectl closes the WebSocket when it stops,
    // the kubelet its connection.
    tokio::select! {
        _ = inbound => {}
        _ = outbound => {}
    }
}

/// The node's InternalIP and kubelet port.
pub fn kubelet_address(state: &State, node: &str) -> ApiResult<(std::net::IpAddr, u16)> {
    let nodes = state
        .registry
        .read()
        .get("", "v1", "nodes")
        .ok_or_else(ApiError::no_route)?;
    let doc = crate::state::fetch(state, &nodes, "", node)?.value();
    let ip = pod_field(&doc, &["status", "addresses"])
        .and_then(Value::as_array)
        .and_then(|addrs| {
            addrs
                .iter()
                .find(|a| a["type"] == "InternalIP")
                .and_then(|a| a["address"].as_str())
        })
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| ApiError::internal(format!("node {node} has no InternalIP")))?;
    let port = pod_field(
        &doc,
        &["status", "daemonEndpoints", "kubeletEndpoint", "Port"],
    )
    .and_then(Value::as_u64)
    .and_then(|p| u16::try_from(p).ok())
    .filter(|p| *p != 0)
    .unwrap_or(10250);
    Ok((ip, port))
}

/// A TLS connection to the kubelet at `addr`, authenticated both ways.
pub async fn connect(
    state: &State,
    addr: SocketAddr,
    node: &str,
) -> ApiResult<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let dialer = state.kubelets.dialer.read().clone();
    // kube-apiserver's kubelet dialer gives up after 30 s: a node whose address is gone (a
    // virtual kubelet's old pod) must not hold the request until the kernel's SYN retries end.
    let dial = async {
        match dialer {
            Some(dial) => dial(addr).await,
            None => tokio::net::TcpStream::connect(addr).await,
        }
    };
    let tcp = tokio::time::timeout(std::time::Duration::from_secs(30), dial)
        .await
        .unwrap_or_else(|_| {
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "i/o timeout",
            ))
        })
        .map_err(|e| {
            ApiError::internal(format!(
                "error dialing backend: dial tcp {addr}: {e} (node {node})"
            ))
        })?;
    // Streams (exec, port-forward) carry small writes that must not wait for an ACK.
    let _ = tcp.set_nodelay(true);
    let config = client_tls(state).map_err(|e| ApiError::internal(format!("kubelet TLS: {e}")))?;
    let server_name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(server_name, tcp)
        .await
        .map_err(|e| ApiError::internal(format!("TLS with the kubelet of node {node}: {e}")))
}

fn client_tls(state: &State) -> anyhow::Result<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut state.pki.ca.cert_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    let certs = rustls_pemfile::certs(&mut state.kubelets.client.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()?;
    let key = rustls_pemfile::private_key(&mut state.kubelets.client.key_pem.as_bytes())?
        .ok_or_else(|| anyhow::anyhow!("kubelet client key missing"))?;
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)?)
}
