//! The built-in programs network-mode pods run, chosen by image, and nothing else: the lab
//! never starts a host command from a pod spec. `tandem.dev/echo` answers HTTP on each
//! declared port; `tandem.dev/probe` fetches URLs and resolves names through the pod's own
//! resolver configuration. Any other image stays hollow.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, Pod};
use parking_lot::Mutex;
use serde_json::json;

use super::netns;

/// The built-in program an image names, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Program {
    /// `tandem.dev/echo`: an HTTP server answering who it is and who asked.
    Echo,
    /// `tandem.dev/probe`: a client that fetches URLs and resolves names.
    Probe,
}

impl Program {
    /// The program for `image` (`tandem.dev/echo`, `tandem.dev/probe:v1`, …); None for any
    /// other image, whose container stays hollow.
    pub fn of_image(image: &str) -> Option<Program> {
        let repo = match image.rsplit_once(':') {
            Some((repo, tag)) if !tag.contains('/') => repo,
            _ => image,
        };
        let repo = repo.split('@').next().unwrap_or(repo);
        match repo {
            "tandem.dev/echo" => Some(Program::Echo),
            "tandem.dev/probe" => Some(Program::Probe),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Program::Echo => "echo",
            Program::Probe => "probe",
        }
    }
}

/// What starting a container's program came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Start {
    /// A built-in program runs.
    Runs(Program),
    /// Not a built-in image: no process, the container is hollow.
    Hollow,
    /// The container's command names something the image does not have: it fails as runc
    /// fails it (exit code 128, reason StartError), and nothing runs.
    Refused(String),
}

/// Decides what `container` runs: a built-in image accepts no command or its own name as
/// the command (`echo`, `/echo`, `/usr/bin/echo`); anything else is refused with runc's
/// message. Arguments are the program's own (a probe's `fetch URL…`), never a command line.
pub fn start_of(container: &Container) -> Start {
    let Some(program) = container.image.as_deref().and_then(Program::of_image) else {
        return Start::Hollow;
    };
    match container.command.as_deref() {
        None | Some([]) => Start::Runs(program),
        Some([first, ..]) if first.rsplit('/').next() == Some(program.name()) => {
            Start::Runs(program)
        }
        Some([first, ..]) => Start::Refused(format!(
            "failed to create containerd task: failed to create shim task: OCI runtime create \
             failed: runc create failed: unable to start container process: exec: \"{first}\": \
             stat {first}: no such file or directory: unknown"
        )),
    }
}

/// Lines a container's log keeps (older ones are dropped, as log rotation would).
const LOG_LINES: usize = 10_000;

/// A container's log: timestamped lines, and a notification for followers.
#[derive(Clone, Default)]
pub struct Log(Arc<LogInner>);

#[derive(Default)]
struct LogInner {
    lines: Mutex<VecDeque<(k8s_openapi::jiff::Timestamp, String)>>,
    changed: tokio::sync::Notify,
    closed: std::sync::atomic::AtomicBool,
}

impl Log {
    /// Appends a line.
    pub fn line(&self, text: impl Into<String>) {
        let mut lines = self.0.lines.lock();
        if lines.len() == LOG_LINES {
            lines.pop_front();
        }
        lines.push_back((k8s_openapi::jiff::Timestamp::now(), text.into()));
        drop(lines);
        self.0.changed.notify_waiters();
    }

    /// Every line now, as text (one `\n`-terminated line each).
    pub fn text(&self) -> String {
        self.0
            .lines
            .lock()
            .iter()
            .map(|(_, l)| format!("{l}\n"))
            .collect()
    }

    /// The lines with their times.
    pub fn lines(&self) -> Vec<(k8s_openapi::jiff::Timestamp, String)> {
        self.0.lines.lock().iter().cloned().collect()
    }

    /// Marks the log finished (the container stopped): followers end.
    pub fn close(&self) {
        self.0
            .closed
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }

    /// Whether the container has stopped writing.
    pub fn is_closed(&self) -> bool {
        self.0.closed.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Waits until a line is added or the log closes.
    pub async fn changed(&self) {
        let notified = self.0.changed.notified();
        if self.is_closed() {
            return;
        }
        notified.await;
    }
}

/// Who a pod is, as its programs tell it.
#[derive(Clone, Debug)]
pub struct PodIdentity {
    /// Pod name.
    pub pod: String,
    /// Pod namespace.
    pub namespace: String,
    /// The cluster's name.
    pub cluster: String,
    /// The pod's network namespace.
    pub netns: String,
    /// The pod's resolver configuration (what kubelet writes to /etc/resolv.conf).
    pub resolv_conf: String,
}

/// Why a probe (`fetch`, `resolve`) from inside a pod failed. What the probe prints is
/// [`ProbeError::message`].
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The pod has no running programs in this cluster's network mode.
    #[error("pod {namespace}/{pod} has no running programs here")]
    NotRunning {
        /// Pod namespace.
        namespace: String,
        /// Pod name.
        pod: String,
    },
    /// The pod's network namespace could not be entered.
    #[error(transparent)]
    Netns(#[from] std::io::Error),
    /// `fetch --count N` with N not a number from 1 to 10000.
    #[error("--count {0}: want a number from 1 to 10000")]
    Count(String),
    /// One request of `fetch --count N` failed.
    #[error("request {index} of {count}")]
    Request {
        /// Which request (1-based).
        index: u32,
        /// Of how many.
        count: u32,
        /// Why it failed.
        #[source]
        source: Box<ProbeError>,
    },
    /// The pod's resolv.conf names no nameserver.
    #[error("resolving {name}: no nameserver configured")]
    NoNameserver {
        /// The name looked up.
        name: String,
    },
    /// The resolver's socket could not be opened.
    #[error("resolving {name}")]
    Socket {
        /// The name looked up.
        name: String,
        /// The socket's error.
        #[source]
        source: std::io::Error,
    },
    /// The query could not be encoded.
    #[error("resolving {name}")]
    Query {
        /// The name looked up.
        name: String,
        /// The encoder's error.
        #[source]
        source: hickory_proto::ProtoError,
    },
    /// Sending the query or receiving its answer failed.
    #[error("resolving {name} via {server}")]
    Exchange {
        /// The name looked up.
        name: String,
        /// The nameserver asked.
        server: IpAddr,
        /// The socket's error.
        #[source]
        source: std::io::Error,
    },
    /// The nameserver did not answer.
    #[error("resolving {name}: no answer from {server}")]
    NoAnswer {
        /// The name looked up.
        name: String,
        /// The nameserver asked.
        server: IpAddr,
    },
    /// No candidate name has an address.
    #[error("resolving {name}: no such host")]
    NoSuchHost {
        /// The name looked up.
        name: String,
    },
    /// The URL does not parse.
    #[error("fetching {url}")]
    Url {
        /// The URL.
        url: String,
        /// Why it does not parse.
        #[source]
        source: http::uri::InvalidUri,
    },
    /// The URL is not `http://`.
    #[error("fetching {url}: only http:// URLs are supported")]
    NotHttp {
        /// The URL.
        url: String,
    },
    /// The URL has no host.
    #[error("fetching {url}: no host")]
    NoHost {
        /// The URL.
        url: String,
    },
    /// The connection was not established within 3 seconds.
    #[error("fetching {url}: connecting to {addr}: timed out")]
    ConnectTimeout {
        /// The URL.
        url: String,
        /// The address dialled.
        addr: SocketAddr,
    },
    /// The connection failed.
    #[error("fetching {url}: connecting to {addr}")]
    Connect {
        /// The URL.
        url: String,
        /// The address dialled.
        addr: SocketAddr,
        /// The socket's error.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP exchange failed.
    #[error("fetching {url}")]
    Http {
        /// The URL.
        url: String,
        /// hyper's error.
        #[source]
        source: hyper::Error,
    },
    /// The request could not be built.
    #[error("fetching {url}")]
    Build {
        /// The URL.
        url: String,
        /// http's error.
        #[source]
        source: http::Error,
    },
    /// No response within 5 seconds.
    #[error("fetching {url}: timed out")]
    Timeout {
        /// The URL.
        url: String,
    },
}

impl ProbeError {
    /// What the probe prints: its steps, then the cause from outside the lab as that words
    /// itself (each once).
    pub fn message(&self) -> String {
        use std::error::Error as _;
        match self {
            ProbeError::Request { source, .. } => format!("{self}: {}", source.message()),
            // Transparent: the cause is the message.
            ProbeError::Netns(_) => self.to_string(),
            _ => match self.source() {
                Some(cause) => format!("{self}: {cause}"),
                None => self.to_string(),
            },
        }
    }
}

/// The ports an echo container serves: its declared TCP containerPorts, 8080 if none.
pub fn echo_ports(container: &Container) -> Vec<u16> {
    let ports: Vec<u16> = container
        .ports
        .iter()
        .flatten()
        .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
        .filter_map(|p| u16::try_from(p.container_port).ok())
        .collect();
    if ports.is_empty() { vec![8080] } else { ports }
}

/// Starts the echo server for `container` of the pod: listeners bound inside the pod's
/// namespace, served on the runtime. Returns the serving tasks.
pub async fn start_echo(
    who: &PodIdentity,
    container: &Container,
    log: Log,
) -> std::io::Result<Vec<tokio::task::JoinHandle<()>>> {
    let mut tasks = Vec::new();
    for port in echo_ports(container) {
        let listener = netns::tcp_listener(
            &who.netns,
            SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, port)),
        )
        .await?;
        log.line(format!("echo: listening on :{port}"));
        let (who, log) = (who.clone(), log.clone());
        tasks.push(tokio::spawn(serve_echo(listener, who, log)));
    }
    Ok(tasks)
}

/// The largest body the echo program sends back.
const ECHO_BODY_LIMIT: usize = 16 * 1024 * 1024;

/// Serves HTTP on `listener`: a GET answers who served it (pod, namespace, cluster, client
/// address) as JSON; a POST answers its own body, byte for byte (up to 16 MiB, else 413).
async fn serve_echo(listener: tokio::net::TcpListener, who: PodIdentity, log: Log) {
    use http_body_util::{BodyExt, Full, Limited};
    use hyper::body::Bytes;
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            continue;
        };
        let (who, log) = (who.clone(), log.clone());
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let (who, log) = (who.clone(), log.clone());
                    async move {
                        let (method, uri) = (req.method().clone(), req.uri().clone());
                        let (status, content_type, body) = if method == http::Method::POST {
                            match Limited::new(req.into_body(), ECHO_BODY_LIMIT)
                                .collect()
                                .await
                            {
                                Ok(body) => (200, "application/octet-stream", body.to_bytes()),
                                Err(_) => (413, "text/plain", Bytes::from("body too large\n")),
                            }
                        } else {
                            let body = json!({
                                "pod": who.pod, "namespace": who.namespace, "cluster": who.cluster,
                                "client": peer.ip().to_string(),
                            });
                            (200, "application/json", Bytes::from(format!("{body}\n")))
                        };
                        log.line(format!("{method} {uri} {status} from {}", peer.ip()));
                        Ok::<_, std::convert::Infallible>(
                            http::Response::builder()
                                .status(status)
                                .header("content-type", content_type)
                                .body(Full::new(body))
                                .expect("static response"),
                        )
                    }
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

/// The parts of a resolv.conf a stub resolver uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResolvConf {
    /// `nameserver` lines.
    pub nameservers: Vec<IpAddr>,
    /// The `search` list.
    pub search: Vec<String>,
    /// `options ndots:N` (glibc's default 1).
    pub ndots: usize,
}

impl ResolvConf {
    /// Reads resolv.conf text as glibc does (the last `search` wins; unknown lines ignored).
    pub fn parse(text: &str) -> ResolvConf {
        let mut conf = ResolvConf {
            ndots: 1,
            ..Default::default()
        };
        for line in text.lines() {
            let mut words = line.split_whitespace();
            match words.next() {
                Some("nameserver") => conf
                    .nameservers
                    .extend(words.next().and_then(|w| w.parse::<IpAddr>().ok())),
                Some("search") => conf.search = words.map(str::to_string).collect(),
                Some("options") => {
                    for o in words {
                        if let Some(n) = o.strip_prefix("ndots:").and_then(|n| n.parse().ok()) {
                            conf.ndots = n;
                        }
                    }
                }
                _ => {}
            }
        }
        conf
    }

    /// The names a lookup of `name` tries, in order, as glibc's resolver does: names with at
    /// least `ndots` dots (or a trailing dot) first as given, then with each search domain.
    pub fn candidates(&self, name: &str) -> Vec<String> {
        if let Some(absolute) = name.strip_suffix('.') {
            return vec![absolute.to_string()];
        }
        let searched = self.search.iter().map(|d| format!("{name}.{d}"));
        if name.matches('.').count() >= self.ndots {
            std::iter::once(name.to_string()).chain(searched).collect()
        } else {
            searched.chain(std::iter::once(name.to_string())).collect()
        }
    }
}

/// Runs `f` on a thread inside the pod's namespace with its own runtime, so every socket
/// the probe opens (DNS, HTTP) is the pod's.
pub async fn in_pod<T, F, Fut>(netns_name: &str, f: F) -> std::io::Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T>,
{
    netns::run_in_async(netns_name, move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        Ok(rt.block_on(f()))
    })
    .await
}

/// Resolves `name` through `conf`, trying the search list as glibc does; the addresses of
/// the first candidate that has any.
async fn resolve_in_pod(conf: &ResolvConf, name: &str) -> Result<Vec<IpAddr>, ProbeError> {
    use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
    use hickory_proto::rr::{Name, RData, RecordType};
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Ok(vec![ip]);
    }
    let Some(server) = conf.nameservers.first().copied() else {
        return Err(ProbeError::NoNameserver {
            name: name.to_string(),
        });
    };
    let socket = tokio::net::UdpSocket::bind(SocketAddr::from(([0, 0, 0, 0], 0)))
        .await
        .map_err(|source| ProbeError::Socket {
            name: name.to_string(),
            source,
        })?;
    let exchange = |source| ProbeError::Exchange {
        name: name.to_string(),
        server,
        source,
    };
    for candidate in conf.candidates(name) {
        let Ok(qname) = Name::from_ascii(format!("{candidate}.")) else {
            continue;
        };
        let mut query = Message::new();
        query
            .set_id(rand_id())
            .set_message_type(MessageType::Query)
            .set_op_code(OpCode::Query)
            .set_recursion_desired(true)
            .add_query(Query::query(qname, RecordType::A));
        let bytes = query.to_vec().map_err(|source| ProbeError::Query {
            name: name.to_string(),
            source,
        })?;
        let mut answer = None;
        for _ in 0..3 {
            socket
                .send_to(&bytes, SocketAddr::new(server, 53))
                .await
                .map_err(exchange)?;
            let mut buf = vec![0u8; 4096];
            match tokio::time::timeout(
                std::time::Duration::from_secs(2),
                socket.recv_from(&mut buf),
            )
            .await
            {
                Ok(Ok((n, _))) => {
                    answer = Message::from_vec(&buf[..n]).ok();
                    if answer.as_ref().is_some_and(|a| a.id() == query.id()) {
                        break;
                    }
                }
                Ok(Err(e)) => return Err(exchange(e)),
                Err(_) => {}
            }
        }
        let Some(answer) = answer else {
            return Err(ProbeError::NoAnswer {
                name: name.to_string(),
                server,
            });
        };
        if answer.response_code() != ResponseCode::NoError {
            continue;
        }
        let ips: Vec<IpAddr> = answer
            .answers()
            .iter()
            .filter_map(|r| match r.data() {
                RData::A(a) => Some(IpAddr::V4(a.0)),
                _ => None,
            })
            .collect();
        if !ips.is_empty() {
            return Ok(ips);
        }
    }
    Err(ProbeError::NoSuchHost {
        name: name.to_string(),
    })
}

fn rand_id() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0),
    );
    h.finish() as u16
}

/// The probe's `resolve NAME`: the addresses, one per line.
pub async fn probe_resolve(who: &PodIdentity, name: &str) -> Result<String, ProbeError> {
    let conf = ResolvConf::parse(&who.resolv_conf);
    let name = name.to_string();
    in_pod(&who.netns, move || async move {
        resolve_in_pod(&conf, &name).await.map(|ips| {
            ips.iter()
                .map(|ip| format!("{name} has address {ip}\n"))
                .collect()
        })
    })
    .await?
}

/// The probe's `fetch URL` (plain HTTP GET): the response body, or why there is none.
pub async fn probe_fetch(who: &PodIdentity, url: &str) -> Result<String, ProbeError> {
    let conf = ResolvConf::parse(&who.resolv_conf);
    let url = url.to_string();
    in_pod(&who.netns, move || async move { fetch(&conf, &url).await }).await?
}

/// The probe's `fetch --count N URL`: N GETs one after the other, each on a new connection (so
/// that a Service's load balancing picks again), their bodies one per line. Stops at the first
/// failure and says which request failed.
pub async fn probe_fetch_many(
    who: &PodIdentity,
    count: &str,
    url: &str,
) -> Result<String, ProbeError> {
    let count: u32 = count
        .parse()
        .ok()
        .filter(|n| (1..=10_000).contains(n))
        .ok_or_else(|| ProbeError::Count(count.to_string()))?;
    let conf = ResolvConf::parse(&who.resolv_conf);
    let url = url.to_string();
    in_pod(&who.netns, move || async move {
        let mut out = String::new();
        for index in 1..=count {
            let body = fetch(&conf, &url)
                .await
                .map_err(|source| ProbeError::Request {
                    index,
                    count,
                    source: Box::new(source),
                })?;
            out.push_str(body.trim_end());
            out.push('\n');
        }
        Ok(out)
    })
    .await?
}

async fn fetch(conf: &ResolvConf, url: &str) -> Result<String, ProbeError> {
    use http_body_util::{BodyExt, Empty};
    let uri: http::Uri = url.parse().map_err(|source| ProbeError::Url {
        url: url.to_string(),
        source,
    })?;
    if uri.scheme_str().unwrap_or("http") != "http" {
        return Err(ProbeError::NotHttp {
            url: url.to_string(),
        });
    }
    let host = uri.host().ok_or_else(|| ProbeError::NoHost {
        url: url.to_string(),
    })?;
    let port = uri.port_u16().unwrap_or(80);
    let ips = resolve_in_pod(conf, host.trim_matches(['[', ']'])).await?;
    let addr = SocketAddr::new(ips[0], port);
    let stream = tokio::time::timeout(
        std::time::Duration::from_secs(3),
        tokio::net::TcpStream::connect(addr),
    )
    .await
    .map_err(|_| ProbeError::ConnectTimeout {
        url: url.to_string(),
        addr,
    })?
    .map_err(|source| ProbeError::Connect {
        url: url.to_string(),
        addr,
        source,
    })?;
    let http_failed = |source| ProbeError::Http {
        url: url.to_string(),
        source,
    };
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(http_failed)?;
    tokio::spawn(conn);
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let request = http::Request::get(path)
        .header("host", host)
        .header("user-agent", "tandem-probe")
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|source| ProbeError::Build {
            url: url.to_string(),
            source,
        })?;
    let response = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        let response = sender.send_request(request).await?;
        response.into_body().collect().await
    })
    .await
    .map_err(|_| ProbeError::Timeout {
        url: url.to_string(),
    })?
    .map_err(http_failed)?;
    Ok(String::from_utf8_lossy(&response.to_bytes()).into_owned())
}

/// Runs a probe container: with args `fetch URL…` or `resolve NAME…` it repeats them every
/// two seconds, logging what it got; with none it idles (for `exec`).
pub async fn run_probe(who: PodIdentity, args: Vec<String>, log: Log) {
    log.line("probe: started".to_string());
    let (verb, targets) = match args.split_first() {
        Some((verb, targets)) if verb == "fetch" || verb == "resolve" => {
            (verb.clone(), targets.to_vec())
        }
        Some((verb, _)) => {
            log.line(format!(
                "probe: unknown verb {verb:?} (want fetch or resolve)"
            ));
            return;
        }
        None => return,
    };
    loop {
        for target in &targets {
            let result = if verb == "fetch" {
                probe_fetch(&who, target).await
            } else {
                probe_resolve(&who, target).await
            };
            match result {
                Ok(text) => log.line(format!("{verb} {target}: {}", text.trim_end())),
                Err(e) => log.line(format!("{verb} {target}: error: {}", e.message())),
            }
        }
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    }
}

/// The pod's identity as its programs see it.
pub fn identity(pod: &Pod, cluster: &str, netns: &str, resolv_conf: String) -> PodIdentity {
    PodIdentity {
        pod: pod.metadata.name.clone().unwrap_or_default(),
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        cluster: cluster.to_string(),
        netns: netns.to_string(),
        resolv_conf,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(image: &str, command: Option<&[&str]>) -> Container {
        Container {
            name: "c".into(),
            image: Some(image.into()),
            command: command.map(|c| c.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        }
    }

    #[test]
    fn only_built_in_images_run_and_only_as_themselves() {
        let cases: &[(&str, Option<&[&str]>, &str)] = &[
            ("tandem.dev/echo", None, "echo"),
            ("tandem.dev/echo:v2", None, "echo"),
            ("tandem.dev/probe", Some(&["probe"]), "probe"),
            (
                "tandem.dev/probe:latest",
                Some(&["/usr/bin/probe"]),
                "probe",
            ),
            ("nginx", None, "hollow"),
            ("registry.example/tandem.dev/echo", None, "hollow"),
            (
                "localhost:5000/evil",
                Some(&["/bin/sh", "-c", "id"]),
                "hollow",
            ),
            (
                "tandem.dev/echo",
                Some(&["/bin/sh", "-c", "touch /tmp/x"]),
                "refused",
            ),
            ("tandem.dev/probe", Some(&["sh"]), "refused"),
        ];
        for (image, command, want) in cases {
            let got = match start_of(&container(image, *command)) {
                Start::Runs(p) => p.name(),
                Start::Hollow => "hollow",
                Start::Refused(m) => {
                    assert!(m.contains("no such file or directory"), "{m}");
                    "refused"
                }
            };
            assert_eq!(got, *want, "{image} {command:?}");
        }
    }

    #[test]
    fn names_are_searched_as_glibc_does() {
        let conf = ResolvConf::parse(
            "search demo.svc.cluster.local svc.cluster.local cluster.local\n\
             nameserver 10.96.0.10\noptions ndots:5\n",
        );
        assert_eq!(
            conf.nameservers,
            vec!["10.96.0.10".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(conf.ndots, 5);
        assert_eq!(
            conf.candidates("hello"),
            vec![
                "hello.demo.svc.cluster.local",
                "hello.svc.cluster.local",
                "hello.cluster.local",
                "hello"
            ]
        );
        assert_eq!(
            conf.candidates("hello.demo.svc.cluster.local.")[0],
            "hello.demo.svc.cluster.local"
        );
        let one = ResolvConf::parse("search a.b\nnameserver 1.2.3.4\n");
        assert_eq!(one.candidates("x.y"), vec!["x.y", "x.y.a.b"]);
    }

    #[test]
    fn probe_messages_say_each_step_and_cause_once() {
        let refused = ProbeError::Connect {
            url: "http://echo/".into(),
            addr: "10.0.0.1:80".parse().unwrap(),
            source: std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "connection refused",
            ),
        };
        assert_eq!(
            refused.to_string(),
            "fetching http://echo/: connecting to 10.0.0.1:80"
        );
        let second = ProbeError::Request {
            index: 2,
            count: 5,
            source: Box::new(refused),
        };
        assert_eq!(
            second.message(),
            "request 2 of 5: fetching http://echo/: connecting to 10.0.0.1:80: connection refused"
        );
        let netns = ProbeError::from(std::io::Error::other("entering lab-1-pod: ENOENT"));
        assert_eq!(netns.message(), "entering lab-1-pod: ENOENT");
        let missing = ProbeError::NoSuchHost {
            name: "hello".into(),
        };
        assert_eq!(missing.message(), "resolving hello: no such host");
    }

    #[test]
    fn logs_keep_lines_and_wake_followers() {
        let log = Log::default();
        log.line("one");
        log.line("two");
        assert_eq!(log.text(), "one\ntwo\n");
        assert!(!log.is_closed());
        log.close();
        assert!(log.is_closed());
    }
}
