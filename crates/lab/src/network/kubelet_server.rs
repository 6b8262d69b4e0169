//! The kubelet's HTTPS endpoint in network mode (port 10250 on each node's InternalIP). It
//! serves:
//!
//! - `/containerLogs/{namespace}/{pod}/{container}`, for the API server's `pods/log`
//!   (`kubectl logs`, with `follow`, `tailLines`, `sinceSeconds`, `timestamps`, `limitBytes`);
//! - `/exec/{namespace}/{pod}/{container}`, for `pods/exec` (`kubectl exec`);
//! - `/attach/{namespace}/{pod}/{container}`, for `pods/attach` (`kubectl attach`);
//! - `/portForward/{namespace}/{pod}[/{uid}]`, for `pods/portforward` (`kubectl port-forward`):
//!   a SPDY/3.1 upgrade speaking `portforward.k8s.io` (see [`super::port_forward`]), each
//!   forwarded connection dialled to the port on 127.0.0.1 inside the pod's network namespace;
//! - `/metrics/resource`, the resource metrics a metrics server scrapes.
//!
//! Callers authenticate as kubelet's `--client-ca-file` makes them: only a client certificate
//! from the API server's kubelet-client CA is accepted; anyone else — a pod calling the node
//! directly — gets 401. Exec and attach speak the WebSocket remote-command protocol kubectl
//! speaks (`v5.channel.k8s.io`, `v4.channel.k8s.io`): one byte of channel (1 stdout,
//! 2 stderr, 3 status) before each message's data.

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

use super::cluster_network::ClusterNetwork;
use super::error::NetworkError;
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
) -> Result<rustls::ServerConfig, NetworkError> {
    let tls = |step: &'static str| {
        move |e: rustls::Error| NetworkError::KubeletTls {
            step,
            source: Box::new(e),
        }
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in pem_certificates(client_ca_pem, "reading the client CA")? {
        roots.add(cert).map_err(tls("adding the client CA"))?;
    }
    // No certificate still connects, so that the answer is kubelet's 401 rather than a TLS
    // failure; a certificate from any other CA fails the handshake.
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()
    .map_err(|e| NetworkError::KubeletTls {
        step: "building the client certificate verifier",
        source: Box::new(e),
    })?;
    use rustls::pki_types::pem::PemObject;
    let key =
        rustls::pki_types::PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| {
            NetworkError::KubeletTls {
                step: "reading the serving key",
                source: Box::new(e),
            }
        })?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(tls("choosing the protocol versions"))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            pem_certificates(cert_pem, "reading the serving certificate")?,
            key,
        )
        .map_err(tls("using the serving certificate and key"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The certificates of a PEM bundle; `step` names it in the error.
fn pem_certificates(
    pem: &str,
    step: &'static str,
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, NetworkError> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| NetworkError::KubeletTls {
            step,
            source: Box::new(e),
        })
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
        // Streams (exec, port-forward) carry small writes that must not wait for an ACK.
        let _ = tcp.set_nodelay(true);
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
        [kind, ns, pod, container] if kind == "attach" => attach(&network, ns, pod, container, req),
        [kind, ns, pod] | [kind, ns, pod, _] if kind == "portForward" => {
            port_forward(&network, ns, pod, req)
        }
        [m, r] if m == "metrics" && r == "resource" => {
            super::kubelet_metrics::resource(&network, req.headers())
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
    let render = move |lines: &[LogLine]| -> String {
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
    // Follow on from the last line read, whatever `tailLines` left out of `first`.
    let follower = Follower::after(log, lines.last().cloned());
    tokio::spawn(follow(follower, first, render, tx));
    let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    Response::builder()
        .header(http::header::CONTENT_TYPE, "text/plain")
        .body(BodyExt::boxed(body))
        .expect("valid response")
}

/// Sends `first`, then the log's lines as they come, until the container stops or the reader
/// goes.
async fn follow(
    mut follower: Follower,
    first: String,
    render: impl Fn(&[LogLine]) -> String,
    tx: tokio::sync::mpsc::Sender<Result<Frame<Bytes>, Infallible>>,
) {
    if !first.is_empty() && tx.send(Ok(Frame::data(Bytes::from(first)))).await.is_err() {
        return;
    }
    loop {
        let lines = tokio::select! {
            lines = follower.next() => lines,
            _ = tx.closed() => return,
        };
        let Some(lines) = lines else { return };
        let chunk = render(&lines);
        if !chunk.is_empty() && tx.send(Ok(Frame::data(Bytes::from(chunk)))).await.is_err() {
            return;
        }
    }
}

fn exec(
    network: Arc<ClusterNetwork>,
    ns: &str,
    pod: &str,
    container: &str,
    params: &[(String, String)],
    req: Request<Incoming>,
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
    let (ns, pod, container) = (ns.to_string(), pod.to_string(), container.to_string());
    remote_command(req, move |mut ws| async move {
        let (stdout, stderr, code) = network.exec(&ns, &pod, &container, &command).await;
        for (channel, data) in [(1u8, stdout), (2u8, stderr)] {
            if data.is_empty() {
                continue;
            }
            if send_on(&mut ws, channel, data.as_bytes()).await.is_err() {
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
        finish(ws, status).await;
    })
}

/// `kubectl port-forward`: the SPDY upgrade, as kubelet's httpstream handshake answers it
/// (`Upgrade: SPDY/3.1`, the stream protocol chosen among `X-Stream-Protocol-Version`), then
/// the port-forward session on the upgraded connection.
fn port_forward(
    network: &ClusterNetwork,
    ns: &str,
    pod: &str,
    mut req: Request<Incoming>,
) -> Response<Body> {
    let headers = req.headers();
    let spdy = headers
        .get(http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("SPDY/3.1"));
    // As apimachinery's upgrader: some `Connection` value must name the upgrade.
    let connection_upgrade = headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.to_ascii_lowercase().contains("upgrade"));
    if !(spdy && connection_upgrade) {
        return text(
            StatusCode::BAD_REQUEST,
            "unable to upgrade: missing upgrade headers in request: a SPDY/3.1 upgrade is expected",
        );
    }
    let offered: Vec<&str> = headers
        .get_all("x-stream-protocol-version")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    let protocol = match super::port_forward::negotiate(&offered) {
        Ok(p) => p,
        Err(mismatch) => return text(StatusCode::FORBIDDEN, mismatch.to_string()),
    };
    let Some((uid, who)) = network.running(ns, pod) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("pod {pod:?} in namespace {ns:?} is not running on this node"),
        );
    };
    let target = super::port_forward::Target {
        pod: pod.to_string(),
        uid,
        dial: super::port_forward::dial_in_netns(who.netns),
        pair_timeout: super::port_forward::STREAM_CREATION_TIMEOUT,
    };
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(upgraded) = upgrade.await else { return };
        super::port_forward::serve(hyper_util::rt::TokioIo::new(upgraded), target).await;
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(http::header::CONNECTION, "Upgrade")
        .header(http::header::UPGRADE, "SPDY/3.1")
        .header("x-stream-protocol-version", protocol)
        .body(Full::new(Bytes::new()).boxed())
        .expect("valid response")
}

/// The server side of a remote-command WebSocket, once the connection has switched.
type RemoteCommandSocket =
    tokio_tungstenite::WebSocketStream<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>>;

/// Answers a remote-command upgrade request: negotiates the subprotocol and, once hyper has
/// switched the connection, runs `session` on the WebSocket. A request offering none of
/// [`PROTOCOLS`], or no WebSocket upgrade at all, gets 400.
fn remote_command<F, Fut>(mut req: Request<Incoming>, session: F) -> Response<Body>
where
    F: FnOnce(RemoteCommandSocket) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
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
    tokio::spawn(async move {
        let Ok(upgraded) = upgrade.await else { return };
        let ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
            hyper_util::rt::TokioIo::new(upgraded),
            Role::Server,
            None,
        )
        .await;
        session(ws).await;
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

/// Sends `data` on remote-command channel `channel` (1 stdout, 2 stderr, 3 status).
async fn send_on(
    ws: &mut RemoteCommandSocket,
    channel: u8,
    data: &[u8],
) -> Result<(), tokio_tungstenite::tungstenite::Error> {
    let mut frame = Vec::with_capacity(data.len() + 1);
    frame.push(channel);
    frame.extend_from_slice(data);
    ws.send(Message::binary(frame)).await
}

/// Ends a remote-command session: `status` on channel 3, then a normal closure.
async fn finish(mut ws: RemoteCommandSocket, status: serde_json::Value) {
    let _ = send_on(&mut ws, 3, status.to_string().as_bytes()).await;
    // A normal closure (1000): kubectl reads the end of each stream from it.
    let _ = ws
        .close(Some(tokio_tungstenite::tungstenite::protocol::CloseFrame {
            code: tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode::Normal,
            reason: "".into(),
        }))
        .await;
    // Drain what the client still sends (stdin close, resize) until it closes too.
    while let Some(Ok(_)) = ws.next().await {}
}

/// `kubectl attach`: streams the container's output from now on — each new log line on
/// stdout — until the client goes or the container stops.
fn attach(
    network: &ClusterNetwork,
    ns: &str,
    pod: &str,
    container: &str,
    req: Request<Incoming>,
) -> Response<Body> {
    let Some(log) = network.log_of(ns, pod, container) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("container {container:?} in pod {pod:?} is not running on this node"),
        );
    };
    remote_command(req, move |ws| stream_output(log, ws))
}

/// A log line with the time it was written.
type LogLine = (k8s_openapi::jiff::Timestamp, String);

/// The lines of `lines` that come after `last` (the last line already sent). The log drops its
/// oldest lines once full, so its length says nothing: a line is known by its time and text.
/// If `last` is gone from the log, every line in it is new.
fn lines_after<'a>(lines: &'a [LogLine], last: Option<&LogLine>) -> &'a [LogLine] {
    let start = last
        .and_then(|last| lines.iter().rposition(|l| l == last))
        .map_or(0, |i| i + 1);
    &lines[start..]
}

/// Reads a log as it grows: each call to [`Follower::next`] gives the lines written since the
/// last ones it gave. Shared by `logs -f` and `attach`.
struct Follower {
    log: Log,
    /// The last line given (or already known when following began).
    last: Option<LogLine>,
}

impl Follower {
    /// Follows `log` from the line after `last` (from its first line if `last` is `None`).
    fn after(log: Log, last: Option<LogLine>) -> Self {
        Follower { log, last }
    }

    /// Follows `log` from the lines written from now on.
    fn from_now(log: Log) -> Self {
        let last = log.lines().last().cloned();
        Follower::after(log, last)
    }

    /// The lines written since the last ones given, waiting until there are some; `None` once
    /// the log has closed (the container stopped) and every line has been given.
    ///
    /// Cancel-safe: nothing is given up unless the lines are returned, so a caller may race it
    /// against something else (the reader going) and call it again.
    async fn next(&mut self) -> Option<Vec<LogLine>> {
        loop {
            // Wait for a change registered before reading the lines, so that a line written in
            // between still wakes this loop.
            let mut changed = std::pin::pin!(self.log.changed());
            let woken = futures::poll!(changed.as_mut()).is_ready();
            // Read before the lines: once closed, the lines read are the last there will be.
            let closed = self.log.is_closed();
            let lines = self.log.lines();
            let new = lines_after(&lines, self.last.as_ref());
            if let Some(newest) = new.last() {
                self.last = Some(newest.clone());
                return Some(new.to_vec());
            }
            if closed {
                return None;
            }
            // If already woken, it is done: awaiting it again would poll a finished future.
            if !woken {
                changed.await;
            }
        }
    }
}

/// Sends each line the log gains on stdout until the client closes the WebSocket, or the log
/// closes (the container stopped) — then a Success status and a normal closure.
async fn stream_output(log: Log, mut ws: RemoteCommandSocket) {
    let mut follower = Follower::from_now(log);
    loop {
        tokio::select! {
            lines = follower.next() => {
                let Some(lines) = lines else {
                    return finish(ws, json!({"metadata": {}, "status": "Success"})).await;
                };
                let chunk: String = lines.iter().map(|(_, l)| format!("{l}\n")).collect();
                if send_on(&mut ws, 1, chunk.as_bytes()).await.is_err() {
                    return;
                }
            }
            message = ws.next() => match message {
                // Built-in programs read no input: stdin (channel 0) is accepted and dropped,
                // and so are terminal resizes (channel 4) that kubectl sends with a TTY.
                // A Close from the client is answered by tungstenite as the stream is read on.
                Some(Ok(_)) => {}
                None | Some(Err(_)) => return,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A log of one line per letter, each written at a second of its own.
    fn log(letters: &str) -> Vec<LogLine> {
        letters.chars().map(line).collect()
    }

    fn line(letter: char) -> LogLine {
        let second = i64::from(u32::from(letter));
        let at = k8s_openapi::jiff::Timestamp::from_second(second).unwrap();
        (at, letter.to_string())
    }

    #[test]
    fn lines_after_the_last_sent_are_new_even_once_the_log_drops_old_ones() {
        // (log now, last line sent, new lines)
        let cases = [
            ("", None, ""),
            ("ab", None, "ab"),
            ("ab", Some('b'), ""),
            ("abc", Some('a'), "bc"),
            // A full log: `a` dropped as `d` came, the same length with one new line.
            ("bcd", Some('c'), "d"),
            // Everything sent has been dropped since.
            ("cd", Some('a'), "cd"),
        ];
        for (now, last, want) in cases {
            let lines = log(now);
            let last = last.map(line);
            assert_eq!(
                lines_after(&lines, last.as_ref()),
                log(want),
                "{now:?} after {last:?}"
            );
        }
    }

    /// The lines a container's log keeps (`LOG_LINES` in `programs`).
    const FULL: usize = 10_000;

    /// The text of each frame `follow` sends, until it ends.
    async fn frames(
        mut rx: tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, Infallible>>,
    ) -> Vec<String> {
        let mut texts = Vec::new();
        while let Some(Ok(frame)) = rx.recv().await {
            let data = frame.into_data().expect("a data frame");
            texts.push(String::from_utf8(data.to_vec()).unwrap());
        }
        texts
    }

    #[tokio::test]
    async fn a_follower_keeps_getting_lines_once_the_log_drops_old_ones() {
        let log = Log::default();
        for i in 0..FULL {
            log.line(format!("old {i}"));
        }
        let mut follower = Follower::from_now(log.clone());
        for i in 0..3 {
            // Each line drops the oldest: the log's length stays the same.
            log.line(format!("new {i}"));
            assert_eq!(log.lines().len(), FULL);
            let got = follower.next().await.unwrap();
            assert_eq!(
                got.iter().map(|(_, l)| l.as_str()).collect::<Vec<_>>(),
                [format!("new {i}")]
            );
        }
        // A line written while the follower waits wakes it.
        let writer = {
            let log = log.clone();
            tokio::spawn(async move {
                tokio::task::yield_now().await;
                log.line("late");
            })
        };
        let got = follower.next().await.unwrap();
        assert_eq!(got[0].1, "late");
        writer.await.unwrap();
        log.close();
        assert_eq!(follower.next().await, None);
    }

    #[tokio::test]
    async fn logs_follow_streams_past_a_full_log_until_it_closes() {
        let log = Log::default();
        for i in 0..FULL {
            log.line(format!("old {i}"));
        }
        let lines = log.lines();
        let first = format!("{}\n", lines.last().unwrap().1);
        let follower = Follower::after(log.clone(), lines.last().cloned());
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let render =
            |lines: &[LogLine]| -> String { lines.iter().map(|(_, l)| format!("{l}\n")).collect() };
        let following = tokio::spawn(follow(follower, first, render, tx));
        let reading = tokio::spawn(frames(rx));
        for i in 0..5 {
            log.line(format!("new {i}"));
            tokio::task::yield_now().await;
        }
        log.close();
        following.await.unwrap();
        let text: String = reading.await.unwrap().concat();
        assert_eq!(text, "old 9999\nnew 0\nnew 1\nnew 2\nnew 3\nnew 4\n");
    }
}
