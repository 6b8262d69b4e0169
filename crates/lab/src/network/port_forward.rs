//! The kubelet's side of `kubectl port-forward` (`portforward.k8s.io` over SPDY/3.1), as
//! kubelet's `portforward/httpstream.go` speaks it.
//!
//! Each forwarded connection is a pair of streams with the same `requestID` header: an error
//! stream and a data stream, both naming the pod's `port`. Once both are open the kubelet
//! connects to that port inside the pod and copies bytes both ways over the data stream; the
//! error stream ends empty, or carries the message of what went wrong.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use futures::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::spdy::{self, RstStatus, Stream, StreamReader, StreamWriter};

/// The stream protocol served (`X-Stream-Protocol-Version`).
pub const PROTOCOL: &str = "portforward.k8s.io";

/// How long the first stream of a pair waits for the second (kubelet's
/// `streamCreationTimeout`).
pub const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);

/// How much is read from the pod's socket at a time.
const CHUNK: usize = 32 * 1024;

/// The protocol to answer an upgrade offering `offered` (the `X-Stream-Protocol-Version`
/// values, each possibly comma-separated), or the 403 message kubelet gives when none fits.
/// A client offering none at all (Kubernetes 1.0's) is served [`PROTOCOL`].
pub fn negotiate(offered: &[&str]) -> Result<&'static str, ProtocolMismatch> {
    let protocols: Vec<&str> = offered
        .iter()
        .flat_map(|v| v.split(','))
        .map(|p| p.trim_matches(' '))
        .filter(|p| !p.is_empty())
        .collect();
    if protocols.is_empty() || protocols.contains(&PROTOCOL) {
        return Ok(PROTOCOL);
    }
    Err(ProtocolMismatch {
        offered: protocols.into_iter().map(str::to_string).collect(),
    })
}

/// A port-forward upgrade offering no protocol the kubelet speaks; the message is kubelet's
/// 403.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unable to upgrade: unable to negotiate protocol: client supports [{}], server accepts [{}]",
    .offered.join(" "),
    PROTOCOL
)]
pub struct ProtocolMismatch {
    /// The protocols the client offered.
    pub offered: Vec<String>,
}

/// Which stream of a pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamType {
    /// Carries the failure message, if any.
    Error,
    /// Carries the forwarded bytes.
    Data,
}

/// What a stream's headers ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
struct StreamRequest {
    kind: StreamType,
    port: u16,
    /// The pair it belongs to.
    request: String,
}

/// Why a stream is refused (reset): kubelet's messages for its headers.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
enum Refusal {
    #[error("\"port\" header is required")]
    MissingPort,
    #[error("unable to parse {0:?} as a port")]
    BadPort(String),
    #[error("port {0:?} must be > 0")]
    ZeroPort(String),
    #[error("\"streamType\" header is required")]
    MissingStreamType,
    #[error("invalid stream type {0:?}")]
    BadStreamType(String),
}

/// Reads a stream's `port`, `streamType` and `requestID` headers (names in any case). A
/// stream without `requestID` (from a client before Kubernetes 1.6) is paired as kubelet does:
/// the error stream's id names the request, and the data stream is the one opened next (id + 2).
fn classify(stream: u32, headers: &[(String, String)]) -> Result<StreamRequest, Refusal> {
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    };
    let port = header("port").ok_or(Refusal::MissingPort)?;
    let port = match port.parse::<u16>() {
        Ok(0) => return Err(Refusal::ZeroPort(port.to_string())),
        Ok(p) => p,
        Err(_) => return Err(Refusal::BadPort(port.to_string())),
    };
    let kind = match header("streamType").ok_or(Refusal::MissingStreamType)? {
        "error" => StreamType::Error,
        "data" => StreamType::Data,
        other => return Err(Refusal::BadStreamType(other.to_string())),
    };
    let request = match (header("requestID"), kind) {
        (Some(id), _) => id.to_string(),
        (None, StreamType::Error) => stream.to_string(),
        (None, StreamType::Data) => (i64::from(stream) - 2).to_string(),
    };
    Ok(StreamRequest {
        kind,
        port,
        request,
    })
}

/// Streams waiting for the other of their pair.
struct Pairing<T> {
    waiting: HashMap<String, Waiting<T>>,
    serial: u64,
}

struct Waiting<T> {
    serial: u64,
    kind: StreamType,
    stream: T,
}

/// What adding a stream to the pairing makes.
#[derive(Debug, PartialEq, Eq)]
enum Added<T> {
    /// The first of its pair; `serial` names it for [`Pairing::expire`].
    Waiting { serial: u64 },
    /// The pair is whole.
    Complete { error: T, data: T },
    /// The pair already has a stream of this type: the new one is not used.
    Duplicate(T),
}

impl<T> Default for Pairing<T> {
    fn default() -> Self {
        Pairing {
            waiting: HashMap::new(),
            serial: 0,
        }
    }
}

impl<T> Pairing<T> {
    fn add(&mut self, request: &str, kind: StreamType, stream: T) -> Added<T> {
        match self.waiting.remove(request) {
            None => {
                self.serial += 1;
                let serial = self.serial;
                let waiting = Waiting {
                    serial,
                    kind,
                    stream,
                };
                self.waiting.insert(request.to_string(), waiting);
                Added::Waiting { serial }
            }
            Some(first) if first.kind == kind => {
                self.waiting.insert(request.to_string(), first);
                Added::Duplicate(stream)
            }
            Some(first) => match kind {
                StreamType::Data => Added::Complete {
                    error: first.stream,
                    data: stream,
                },
                StreamType::Error => Added::Complete {
                    error: stream,
                    data: first.stream,
                },
            },
        }
    }

    /// The stream `serial` of `request` if it still waits: its time is up.
    fn expire(&mut self, request: &str, serial: u64) -> Option<(StreamType, T)> {
        if self.waiting.get(request)?.serial != serial {
            return None;
        }
        let waiting = self.waiting.remove(request)?;
        Some((waiting.kind, waiting.stream))
    }
}

/// Connects to an address inside the pod (its network namespace, in a real lab).
pub type Dial =
    Arc<dyn Fn(SocketAddr) -> BoxFuture<'static, std::io::Result<TcpStream>> + Send + Sync>;

/// Dials from inside network namespace `netns`.
pub fn dial_in_netns(netns: String) -> Dial {
    Arc::new(move |addr| {
        let netns = netns.clone();
        Box::pin(async move {
            let socket = super::netns::tcp_connect(&netns, addr).await?;
            // What the client writes reaches the pod as it comes, not after an ACK.
            socket.set_nodelay(true)?;
            Ok(socket)
        })
    })
}

/// The pod whose ports are forwarded.
pub struct Target {
    /// Its name (for messages).
    pub pod: String,
    /// Its uid (for messages).
    pub uid: String,
    /// How to reach its ports.
    pub dial: Dial,
    /// How long the first stream of a pair waits for the second: kubelet's
    /// [`STREAM_CREATION_TIMEOUT`] when served, shorter in tests (which then need no paused
    /// clock, and so no tokio `test-util` that the demo's build would lack).
    pub pair_timeout: Duration,
}

/// Serves port-forward on an upgraded connection until the client closes it.
pub async fn serve<IO>(io: IO, target: Target)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let pair_timeout = target.pair_timeout;
    let target = Arc::new(target);
    let mut incoming = spdy::serve(io);
    let mut pairing: Pairing<(StreamRequest, Stream)> = Pairing::default();
    let mut deadlines = futures::stream::FuturesUnordered::new();
    loop {
        tokio::select! {
            offered = incoming.recv() => {
                let Some(offered) = offered else { break };
                let request = match classify(offered.id(), offered.headers()) {
                    Ok(request) => request,
                    Err(refusal) => {
                        tracing::debug!(pod = %target.pod, stream = offered.id(), %refusal, "port-forward: stream refused");
                        offered.refuse(RstStatus::CANCEL).await;
                        continue;
                    }
                };
                // Kubelet replies at once: the client opens the data stream only once the
                // error stream is answered.
                let Ok(stream) = offered.accept().await else { break };
                let (id, kind) = (request.request.clone(), request.kind);
                match pairing.add(&id, kind, (request, stream)) {
                    Added::Waiting { serial } => deadlines.push(async move {
                        tokio::time::sleep(pair_timeout).await;
                        (id, serial)
                    }),
                    Added::Complete { error, data } => {
                        tokio::spawn(forward(error.1, data, target.clone()));
                    }
                    Added::Duplicate((_, mut stream)) => {
                        tracing::debug!(pod = %target.pod, request = %id, ?kind, "port-forward: a second stream of one type");
                        stream.writer.reset(RstStatus::PROTOCOL_ERROR).await;
                    }
                }
            }
            Some((id, serial)) = deadlines.next(), if !deadlines.is_empty() => {
                if let Some((kind, (_, mut stream))) = pairing.expire(&id, serial) {
                    if kind == StreamType::Error {
                        let message = format!("timed out waiting for streams of request {id}");
                        let _ = stream.writer.send(Bytes::from(message)).await;
                    }
                    stream.writer.reset(RstStatus::CANCEL).await;
                }
            }
        }
    }
}

/// Forwards one connection: dials the data stream's port in the pod and copies both ways, then
/// ends both streams — the error stream empty on success, with kubelet's message otherwise.
async fn forward(error: Stream, data: (StreamRequest, Stream), target: Arc<Target>) {
    let (request, data) = data;
    let port = request.port;
    let Stream {
        reader: mut error_in,
        writer: mut error_out,
        ..
    } = error;
    let Stream {
        reader: data_in,
        writer: mut data_out,
        ..
    } = data;
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let socket = tokio::select! {
        socket = (target.dial)(addr) => socket,
        () = until_reset(&mut error_in) => return,
    };
    let failure = match socket {
        Ok(socket) => {
            tokio::select! {
                () = splice(socket, data_in, &mut data_out) => {}
                () = until_reset(&mut error_in) => {}
            }
            None
        }
        Err(e) => Some(format!("failed to connect to {addr} inside the pod: {e}")),
    };
    if let Some(err) = failure {
        let message = format!(
            "error forwarding port {port} to pod {}, uid {}: {err}",
            target.pod, target.uid
        );
        tracing::debug!(%message, "port-forward");
        let _ = error_out.send(Bytes::from(message)).await;
    }
    for out in [&mut error_out, &mut data_out] {
        if !out.is_finished() && !out.is_reset() {
            let _ = out.finish().await;
        }
    }
}

/// Reads (and drops) what comes on the error stream until the client resets it or the session
/// ends. The client finishes its half at once: that is not an end.
async fn until_reset(error_in: &mut StreamReader) {
    loop {
        match error_in.read().await {
            Ok(Some(_)) => {}
            Ok(None) => std::future::pending::<()>().await,
            Err(_) => return,
        }
    }
}

/// How long the client may still send once the pod has closed its side: containerd's
/// port-forward gives the other direction 1 s, as socat does. kubectl waits for the error
/// stream's end before it closes the local connection, so the forward must end on its own.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Copies between the pod's socket and the data stream: the client's FIN half-closes the
/// socket, the socket's end finishes the stream. Ends once both directions have ended, once
/// the pod's side has been closed for [`CLOSE_GRACE`], or at once when the client resets the
/// stream. (After the client's FIN the pod decides when its answer ends.) Errors on the socket
/// after it connected end the copy without a message: kubectl ends the whole port-forward on
/// any message.
async fn splice(socket: TcpStream, mut from_client: StreamReader, to_client: &mut StreamWriter) {
    let (mut socket_in, mut socket_out) = socket.into_split();
    let upstream = async move {
        loop {
            match from_client.read().await {
                Ok(Some(data)) => {
                    if socket_out.write_all(&data).await.is_err() {
                        // The pod stopped reading: drop what the client still sends.
                        return Ok(());
                    }
                }
                Ok(None) => {
                    let _ = socket_out.shutdown().await;
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
    };
    let downstream = async move {
        let mut buf = BytesMut::with_capacity(CHUNK);
        loop {
            buf.reserve(CHUNK);
            match socket_in.read_buf(&mut buf).await {
                Ok(0) | Err(_) => {
                    let _ = to_client.finish().await;
                    return;
                }
                Ok(_) => {
                    if to_client.send(buf.split().freeze()).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    tokio::pin!(upstream, downstream);
    tokio::select! {
        up = &mut upstream => {
            if up.is_ok() {
                downstream.await;
            }
        }
        () = &mut downstream => {
            let _ = tokio::time::timeout(CLOSE_GRACE, upstream).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::spdy::Frame;
    use crate::network::spdy::test_client::TestClient;

    fn headers(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn streams_are_classified_by_their_headers() {
        let ok = |kind, port: u16, request: &str| {
            Ok(StreamRequest {
                kind,
                port,
                request: request.to_string(),
            })
        };
        type Case<'a> = (
            u32,
            &'a [(&'a str, &'a str)],
            Result<StreamRequest, Refusal>,
        );
        let cases: Vec<Case> = vec![
            (
                1,
                &[("streamtype", "error"), ("port", "80"), ("requestid", "7")],
                ok(StreamType::Error, 80, "7"),
            ),
            (
                3,
                &[("streamType", "data"), ("Port", "8080"), ("requestID", "7")],
                ok(StreamType::Data, 8080, "7"),
            ),
            // Old clients: the pair is the error stream's id and the next one.
            (
                5,
                &[("streamtype", "error"), ("port", "80")],
                ok(StreamType::Error, 80, "5"),
            ),
            (
                7,
                &[("streamtype", "data"), ("port", "80")],
                ok(StreamType::Data, 80, "5"),
            ),
            (1, &[("streamtype", "data")], Err(Refusal::MissingPort)),
            (
                1,
                &[("streamtype", "data"), ("port", "http")],
                Err(Refusal::BadPort("http".into())),
            ),
            (
                1,
                &[("streamtype", "data"), ("port", "65536")],
                Err(Refusal::BadPort("65536".into())),
            ),
            (
                1,
                &[("streamtype", "data"), ("port", "0")],
                Err(Refusal::ZeroPort("0".into())),
            ),
            (1, &[("port", "80")], Err(Refusal::MissingStreamType)),
            (
                1,
                &[("streamtype", "resize"), ("port", "80")],
                Err(Refusal::BadStreamType("resize".into())),
            ),
        ];
        for (id, list, want) in cases {
            assert_eq!(classify(id, &headers(list)), want, "{list:?}");
        }
    }

    #[test]
    fn pairs_complete_in_either_order_and_expire_only_while_waiting() {
        let mut pairing = Pairing::default();
        assert_eq!(
            pairing.add("1", StreamType::Data, "d1"),
            Added::Waiting { serial: 1 }
        );
        assert_eq!(
            pairing.add("1", StreamType::Data, "again"),
            Added::Duplicate("again")
        );
        assert_eq!(
            pairing.add("1", StreamType::Error, "e1"),
            Added::Complete {
                error: "e1",
                data: "d1"
            }
        );
        // A deadline of a pair that completed finds nothing.
        assert_eq!(pairing.expire("1", 1), None);
        assert_eq!(
            pairing.add("2", StreamType::Error, "e2"),
            Added::Waiting { serial: 2 }
        );
        // Nor does one of an earlier pair with the same request id.
        assert_eq!(pairing.expire("2", 1), None);
        assert_eq!(pairing.expire("2", 2), Some((StreamType::Error, "e2")));
        assert_eq!(
            pairing.add("2", StreamType::Data, "d2"),
            Added::Waiting { serial: 3 }
        );
    }

    #[test]
    fn negotiation_picks_port_forward_or_says_what_was_offered() {
        assert_eq!(negotiate(&["portforward.k8s.io"]), Ok(PROTOCOL));
        assert_eq!(
            negotiate(&["v2.portforward.k8s.io, portforward.k8s.io"]),
            Ok(PROTOCOL)
        );
        assert_eq!(negotiate(&[]), Ok(PROTOCOL));
        assert_eq!(
            negotiate(&["v2.portforward.k8s.io", "v9"]).map_err(|e| e.to_string()),
            Err(
                "unable to upgrade: unable to negotiate protocol: client supports \
                 [v2.portforward.k8s.io v9], server accepts [portforward.k8s.io]"
                    .to_string()
            )
        );
    }

    /// An echo server on localhost: each connection gets back what it sends, until it
    /// half-closes.
    async fn echo_server() -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut rd, mut wr) = socket.into_split();
                    let _ = tokio::io::copy(&mut rd, &mut wr).await;
                    let _ = wr.shutdown().await;
                });
            }
        });
        addr
    }

    fn dial_localhost() -> Dial {
        Arc::new(|addr| Box::pin(TcpStream::connect(addr)))
    }

    fn target(dial: Dial) -> Target {
        Target {
            pod: "web".into(),
            uid: "uid-1".into(),
            dial,
            pair_timeout: STREAM_CREATION_TIMEOUT,
        }
    }

    /// Frames per stream, in order, until both streams have ended (FIN or RST).
    async fn collect(client: &mut TestClient, streams: &[u32]) -> HashMap<u32, Vec<Frame>> {
        let mut frames: HashMap<u32, Vec<Frame>> = HashMap::new();
        let mut ended = 0;
        while ended < streams.len() {
            let (frame, _) = client.next().await.expect("connection open");
            let stream = match &frame {
                Frame::SynReply { stream, .. } => *stream,
                Frame::Data { stream, fin, .. } => {
                    ended += usize::from(*fin);
                    *stream
                }
                Frame::RstStream { stream, .. } => {
                    ended += 1;
                    *stream
                }
                other => panic!("unexpected {other:?}"),
            };
            frames.entry(stream).or_default().push(frame);
        }
        frames
    }

    fn payload(frames: &[Frame]) -> Vec<u8> {
        frames
            .iter()
            .filter_map(|f| match f {
                Frame::Data { data, .. } => Some(data.to_vec()),
                _ => None,
            })
            .flatten()
            .collect()
    }

    #[tokio::test]
    async fn a_pair_forwards_300_kib_both_ways_and_ends_with_an_empty_error_stream() {
        let echo = echo_server().await;
        let port = echo.port().to_string();
        let (client, server) = tokio::io::duplex(64 * 1024);
        tokio::spawn(serve(server, target(dial_localhost())));
        let mut client = TestClient::new(client);
        let common = [("port", port.as_str()), ("requestid", "0")];
        client
            .open(1, &[&[("streamtype", "error")], &common[..]].concat())
            .await;
        client
            .open(3, &[&[("streamtype", "data")], &common[..]].concat())
            .await;
        // The client finishes its half of the error stream at once, as client-go does.
        client
            .send(&Frame::Data {
                stream: 1,
                fin: true,
                data: Bytes::new(),
            })
            .await;
        let sent: Vec<u8> = (0..300 * 1024).map(|i| (i % 251) as u8).collect();
        let (mut rd, mut wr) = tokio::io::split(client.io);
        let writer = {
            let sent = sent.clone();
            tokio::spawn(async move {
                for chunk in sent.chunks(40_000) {
                    let mut out = BytesMut::new();
                    spdy::encode(
                        &Frame::Data {
                            stream: 3,
                            fin: false,
                            data: Bytes::copy_from_slice(chunk),
                        },
                        &mut out,
                    );
                    wr.write_all(&out).await.unwrap();
                }
                let mut out = BytesMut::new();
                let fin = Frame::Data {
                    stream: 3,
                    fin: true,
                    data: Bytes::new(),
                };
                spdy::encode(&fin, &mut out);
                wr.write_all(&out).await.unwrap();
                wr
            })
        };
        // Read on the read half alone while the writer sends (the echo answers as it reads).
        let mut buf = BytesMut::new();
        let mut frames: HashMap<u32, Vec<Frame>> = HashMap::new();
        let mut ended = 0;
        while ended < 2 {
            let frame = loop {
                if let Some(frame) = spdy::decode(&mut buf).unwrap() {
                    break frame;
                }
                buf.reserve(64 * 1024);
                assert!(rd.read_buf(&mut buf).await.unwrap() > 0, "connection open");
            };
            let stream = match &frame {
                Frame::SynReply { stream, .. } => *stream,
                Frame::Data { stream, fin, .. } => {
                    ended += usize::from(*fin);
                    *stream
                }
                other => panic!("unexpected {other:?}"),
            };
            frames.entry(stream).or_default().push(frame);
        }
        writer.await.unwrap();
        for stream in [1, 3] {
            let got = &frames[&stream];
            assert!(
                matches!(got[0], Frame::SynReply { flags: 0, .. }),
                "stream {stream} is replied to before any data: {:?}",
                got[0]
            );
            assert!(matches!(got.last(), Some(Frame::Data { fin: true, .. })));
        }
        assert_eq!(payload(&frames[&1]), b"", "no error");
        let echoed = payload(&frames[&3]);
        assert_eq!(echoed.len(), sent.len());
        assert!(echoed == sent, "the bytes come back identical");
    }

    #[tokio::test]
    async fn a_refused_connection_is_reported_on_the_error_stream() {
        let dial: Dial = Arc::new(|_| {
            Box::pin(async { Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)) })
        });
        let (client, server) = tokio::io::duplex(64 * 1024);
        tokio::spawn(serve(server, target(dial)));
        let mut client = TestClient::new(client);
        client
            .open(
                1,
                &[
                    ("streamtype", "error"),
                    ("port", "8080"),
                    ("requestid", "4"),
                ],
            )
            .await;
        client
            .open(
                3,
                &[("streamtype", "data"), ("port", "8080"), ("requestid", "4")],
            )
            .await;
        let frames = collect(&mut client, &[1, 3]).await;
        let message = String::from_utf8(payload(&frames[&1])).unwrap();
        assert!(
            message.starts_with(
                "error forwarding port 8080 to pod web, uid uid-1: failed to connect to 127.0.0.1:8080"
            ),
            "{message}"
        );
        assert!(matches!(
            frames[&3].last(),
            Some(Frame::Data { fin: true, .. })
        ));
    }

    #[tokio::test]
    async fn streams_without_a_valid_port_or_type_are_reset() {
        let (client, server) = tokio::io::duplex(64 * 1024);
        tokio::spawn(serve(server, target(dial_localhost())));
        let mut client = TestClient::new(client);
        client
            .open(1, &[("streamtype", "data"), ("port", "x")])
            .await;
        client.open(3, &[("port", "80")]).await;
        let frames = collect(&mut client, &[1, 3]).await;
        for stream in [1, 3] {
            assert_eq!(
                frames[&stream],
                [Frame::RstStream {
                    stream,
                    status: RstStatus::CANCEL.0
                }]
            );
        }
    }

    #[tokio::test]
    async fn a_lone_stream_is_reset_once_its_pair_does_not_come() {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let target = Target {
            pair_timeout: Duration::from_millis(200),
            ..target(dial_localhost())
        };
        tokio::spawn(serve(server, target));
        let mut client = TestClient::new(client);
        client
            .open(
                1,
                &[("streamtype", "error"), ("port", "80"), ("requestid", "0")],
            )
            .await;
        let frames = collect(&mut client, &[1]).await;
        let message = String::from_utf8(payload(&frames[&1])).unwrap();
        assert_eq!(message, "timed out waiting for streams of request 0");
        assert!(matches!(frames[&1].last(), Some(Frame::RstStream { .. })));
    }
}
