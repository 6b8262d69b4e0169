//! Two "clusters" built from network namespaces, each with a gateway namespace, two
//! node namespaces and one pod namespace per node behind a node bridge; a WAN link joins
//! the gateways. Both clusters use pod CIDR 10.244.0.0/16 and external CIDR 10.70.0.0/16,
//! so every address has to be remapped. Everything is torn down on drop, even on failure.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use ipnet::IpNet;
use tandem_core::ipam::{Ipam, IpamConfig};
use tandem_core::nat::{ClusterPrefixes, NatPlanInput};
use tandem_net::{GatewayArgs, generate_private_key, public_key};

/// The guard of every test here, which also carries
/// `#[cfg_attr(not(tandem_root), ignore = "needs root")]`: panics, naming the fix, when a build
/// made as root runs without it.
pub fn needs_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root: it was built as root (cfg tandem_root) and runs without it; \
         run it as root, or rebuild as this user to list it as ignored"
    );
}

/// Runs `ip` with `args`, panicking with its stderr on failure.
pub fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs a command inside namespace `ns`, returning whether it succeeded and its output.
pub fn exec(ns: &str, cmd: &[&str]) -> (bool, String) {
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(cmd)
        .output()
        .expect("run ip netns exec");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Runs `f` on a thread that has entered network namespace `ns`.
pub fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).expect("open netns");
        nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        f()
    })
    .join()
    .expect("netns thread panicked")
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

/// Index of a cluster in the pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// Cluster A.
    A,
    /// Cluster B.
    B,
}

impl Side {
    fn idx(self) -> usize {
        match self {
            Side::A => 0,
            Side::B => 1,
        }
    }
    fn letter(self) -> &'static str {
        match self {
            Side::A => "a",
            Side::B => "b",
        }
    }
}

/// One side's gateway configuration and process.
struct Gateway {
    args: GatewayArgs,
    config_path: PathBuf,
    log_path: PathBuf,
    child: Option<Child>,
}

/// The two-cluster topology.
pub struct Pair {
    prefix: String,
    namespaces: Vec<String>,
    gateways: [Gateway; 2],
    /// Holds configs and logs until the pair is dropped.
    _dir: tempfile::TempDir,
    /// How each side names the other's prefixes (pod, external).
    pub names: [ClusterPrefixes; 2],
}

/// Status API port inside each gateway namespace.
pub const STATUS_PORT: u16 = 9100;
/// WireGuard port.
pub const WG_PORT: u16 = 51820;
/// Real pod CIDR of both clusters.
pub const POD_CIDR: &str = "10.244.0.0/16";
/// Real external CIDR of both clusters.
pub const EXTERNAL_CIDR: &str = "10.70.0.0/16";

static COUNTER: AtomicU32 = AtomicU32::new(0);

impl Pair {
    /// Builds both clusters and the WAN link; gateways are not started yet.
    pub fn new() -> Pair {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let prefix = format!("td{}x{n}", std::process::id());
        let dir = tempfile::tempdir().expect("tempdir");
        // Each side's IPAM, with its own pool, so the two sides' names differ and a test
        // can tell which translation happened.
        let local = ClusterPrefixes {
            pod_cidr: net(POD_CIDR),
            external_cidr: net(EXTERNAL_CIDR),
        };
        let reserved = vec![
            net(POD_CIDR),
            net(EXTERNAL_CIDR),
            net("10.96.0.0/12"),
            net("172.16.0.0/24"),
        ];
        let mut names = Vec::new();
        for pool in ["10.0.0.0/9", "10.128.0.0/9"] {
            let mut ipam = Ipam::new(IpamConfig {
                reserved: reserved.clone(),
                pools: vec![net(pool)],
                allowed_public: Vec::new(),
            })
            .unwrap();
            let grants = ipam
                .map_peer("peer", &[local.pod_cidr, local.external_cidr])
                .unwrap();
            names.push(ClusterPrefixes {
                pod_cidr: grants[0].granted,
                external_cidr: grants[1].granted,
            });
        }
        let names: [ClusterPrefixes; 2] = [names[0], names[1]];

        let keys = [generate_private_key(), generate_private_key()];
        let mut pair = Pair {
            namespaces: Vec::new(),
            gateways: [0, 1].map(|i| {
                let me = i;
                let peer = 1 - i;
                Gateway {
                    args: GatewayArgs {
                        interface: "tandem0".into(),
                        listen: format!("0.0.0.0:{WG_PORT}").parse().unwrap(),
                        private_key: keys[me].clone(),
                        peer_public_key: public_key(&keys[peer]).unwrap(),
                        peer_endpoint: Some(
                            format!("192.0.2.{}:{WG_PORT}", peer + 1).parse().unwrap(),
                        ),
                        persistent_keepalive_secs: 5,
                        mtu: 1420,
                        nat: NatPlanInput {
                            local,
                            local_as_seen_by_peer: names[peer],
                            peer_as_seen_locally: names[me],
                        },
                        status_listen: Some(format!("127.0.0.1:{STATUS_PORT}").parse().unwrap()),
                        probe_interval_ms: 300,
                        probe_timeout_ms: 1200,
                        nft_table: None,
                        allowed_destinations: None,
                        legacy_interfaces: Vec::new(),
                        legacy_nft_tables: Vec::new(),
                    },
                    config_path: dir.path().join(format!("gw{i}.json")),
                    log_path: dir.path().join(format!("gw{i}.log")),
                    child: None,
                }
            }),
            prefix,
            _dir: dir,
            names,
        };
        pair.build();
        pair
    }

    fn add_ns(&mut self, name: String) -> String {
        ip(&["netns", "add", &name]);
        self.namespaces.push(name.clone());
        ip(&["-n", &name, "link", "set", "lo", "up"]);
        name
    }

    /// Gateway namespace of a side.
    pub fn gw(&self, side: Side) -> String {
        format!("{}{}gw", self.prefix, side.letter())
    }

    /// Node namespace `node` (1 or 2) of a side.
    pub fn node(&self, side: Side, node: u8) -> String {
        format!("{}{}n{node}", self.prefix, side.letter())
    }

    /// Pod namespace on `node` of a side.
    pub fn pod(&self, side: Side, node: u8) -> String {
        format!("{}{}n{node}p", self.prefix, side.letter())
    }

    /// Real IP of the pod on `node`.
    pub fn pod_ip(node: u8) -> String {
        format!("10.244.{node}.10")
    }

    /// The address `viewer` uses to reach (or sees as source) the pod on `node` of `owner`.
    pub fn pod_ip_seen_by(&self, viewer: Side, node: u8) -> String {
        let p = self.names[viewer.idx()].pod_cidr.network();
        match p {
            std::net::IpAddr::V4(v4) => {
                let o = v4.octets();
                format!("{}.{}.{node}.10", o[0], o[1])
            }
            std::net::IpAddr::V6(_) => unreachable!("IPv4 topology"),
        }
    }

    /// The address `viewer` sees for any non-pod source of the other side.
    pub fn external_source_seen_by(&self, viewer: Side) -> String {
        self.names[viewer.idx()].external_cidr.network().to_string()
    }

    fn build(&mut self) {
        for side in [Side::A, Side::B] {
            let gw = self.add_ns(self.gw(side));
            ip(&["-n", &gw, "link", "add", "lan", "type", "bridge"]);
            ip(&["-n", &gw, "addr", "add", "172.16.0.1/24", "dev", "lan"]);
            ip(&["-n", &gw, "link", "set", "lan", "up"]);
            forwarding(&gw);
            for node in 1..=2u8 {
                let n = self.add_ns(self.node(side, node));
                let port = format!("n{node}");
                ip(&[
                    "-n", &gw, "link", "add", &port, "type", "veth", "peer", "name", "eth0",
                    "netns", &n,
                ]);
                ip(&["-n", &gw, "link", "set", &port, "master", "lan", "up"]);
                let node_ip = format!("172.16.0.{}", 10 + node);
                ip(&[
                    "-n",
                    &n,
                    "addr",
                    "add",
                    &format!("{node_ip}/24"),
                    "dev",
                    "eth0",
                ]);
                ip(&["-n", &n, "link", "set", "eth0", "up"]);
                ip(&["-n", &n, "link", "add", "cbr0", "type", "bridge"]);
                ip(&[
                    "-n",
                    &n,
                    "addr",
                    "add",
                    &format!("10.244.{node}.1/24"),
                    "dev",
                    "cbr0",
                ]);
                ip(&["-n", &n, "link", "set", "cbr0", "up"]);
                ip(&["-n", &n, "route", "add", "default", "via", "172.16.0.1"]);
                let other = 3 - node;
                ip(&[
                    "-n",
                    &n,
                    "route",
                    "add",
                    &format!("10.244.{other}.0/24"),
                    "via",
                    &format!("172.16.0.{}", 10 + other),
                ]);
                forwarding(&n);
                ip(&[
                    "-n",
                    &gw,
                    "route",
                    "add",
                    &format!("10.244.{node}.0/24"),
                    "via",
                    &node_ip,
                ]);

                let p = self.add_ns(self.pod(side, node));
                ip(&[
                    "-n", &n, "link", "add", "veth1", "type", "veth", "peer", "name", "eth0",
                    "netns", &p,
                ]);
                ip(&["-n", &n, "link", "set", "veth1", "master", "cbr0", "up"]);
                ip(&[
                    "-n",
                    &p,
                    "addr",
                    "add",
                    &format!("{}/24", Pair::pod_ip(node)),
                    "dev",
                    "eth0",
                ]);
                ip(&["-n", &p, "link", "set", "eth0", "up"]);
                ip(&[
                    "-n",
                    &p,
                    "route",
                    "add",
                    "default",
                    "via",
                    &format!("10.244.{node}.1"),
                ]);
            }
        }
        let (a, b) = (self.gw(Side::A), self.gw(Side::B));
        ip(&[
            "-n", &a, "link", "add", "wan0", "type", "veth", "peer", "name", "wan0", "netns", &b,
        ]);
        ip(&["-n", &a, "addr", "add", "192.0.2.1/24", "dev", "wan0"]);
        ip(&["-n", &b, "addr", "add", "192.0.2.2/24", "dev", "wan0"]);
        ip(&["-n", &a, "link", "set", "wan0", "up"]);
        ip(&["-n", &b, "link", "set", "wan0", "up"]);
    }

    /// Changes a side's gateway arguments before (re)starting it.
    pub fn args_mut(&mut self, side: Side) -> &mut GatewayArgs {
        &mut self.gateways[side.idx()].args
    }

    /// The gateway arguments of a side.
    pub fn args(&self, side: Side) -> &GatewayArgs {
        &self.gateways[side.idx()].args
    }

    /// Starts a side's gateway process in its gateway namespace.
    pub fn start(&mut self, side: Side) {
        let gw_ns = self.gw(side);
        let g = &mut self.gateways[side.idx()];
        assert!(g.child.is_none(), "gateway {side:?} already running");
        std::fs::write(&g.config_path, serde_json::to_vec_pretty(&g.args).unwrap()).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&g.log_path)
            .unwrap();
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                &gw_ns,
                env!("CARGO_BIN_EXE_tandem-gateway"),
            ])
            .arg(&g.config_path)
            .env("RUST_LOG", "info,tandem_net=debug")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn tandem-gateway");
        g.child = Some(child);
    }

    /// Kills a side's gateway with SIGKILL, as a crash would.
    pub fn kill(&mut self, side: Side) {
        if let Some(mut child) = self.gateways[side.idx()].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops a side's gateway with SIGTERM, as on unpeer, and returns its exit status.
    pub fn terminate(&mut self, side: Side) -> std::process::ExitStatus {
        let mut child = self.gateways[side.idx()]
            .child
            .take()
            .expect("gateway running");
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("gateway {side:?} ignored SIGTERM for 5s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether a side's gateway process has exited (and its log, to explain why).
    pub fn exited(&mut self, side: Side) -> Option<String> {
        let g = &mut self.gateways[side.idx()];
        let child = g.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => Some(format!(
                "{status}: {}",
                std::fs::read_to_string(&g.log_path).unwrap_or_default()
            )),
            _ => None,
        }
    }

    /// The gateway log of a side.
    pub fn log(&self, side: Side) -> String {
        std::fs::read_to_string(&self.gateways[side.idx()].log_path).unwrap_or_default()
    }

    /// GET `path` from a side's status API (retried: under a parallel test run the gateway
    /// may be slow to answer).
    pub fn http_get(&self, side: Side, path: &str) -> Option<String> {
        for _ in 0..3 {
            let path = path.to_string();
            let body = in_ns(&self.gw(side), move || {
                let addr: SocketAddr = format!("127.0.0.1:{STATUS_PORT}").parse().unwrap();
                let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
                s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
                write!(
                    s,
                    "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                )
                .ok()?;
                let mut text = String::new();
                s.read_to_string(&mut text).ok()?;
                text.split_once("\r\n\r\n")
                    .map(|(_, body)| body.to_string())
            });
            if body.is_some() {
                return body;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    }

    /// A side's `/status` as JSON.
    pub fn status(&self, side: Side) -> Option<serde_json::Value> {
        serde_json::from_str(&self.http_get(side, "/status")?).ok()
    }

    /// A metric value from a side's `/metrics` (first sample whose name matches).
    pub fn metric(&self, side: Side, name: &str) -> f64 {
        let text = self.http_get(side, "/metrics").unwrap_or_default();
        text.lines()
            .find_map(|l| {
                let (n, v) = l.split_once(' ')?;
                (n == name).then(|| v.parse().ok()).flatten()
            })
            .unwrap_or_else(|| panic!("metric {name} not found in:\n{text}"))
    }

    /// Waits until a side reports `connected`, returning how long it took.
    pub fn wait_connected(&mut self, side: Side, within: Duration) -> Duration {
        let start = Instant::now();
        loop {
            if let Some(why) = self.exited(side) {
                panic!("gateway {side:?} exited: {why}");
            }
            let state = self.status(side).map(|s| s["state"].clone());
            if state.as_ref().and_then(|s| s.as_str()) == Some("connected") {
                return start.elapsed();
            }
            if start.elapsed() > within {
                panic!(
                    "gateway {side:?} not connected after {within:?} (state {state:?})\nA log:\n{}\nB log:\n{}",
                    self.log(Side::A),
                    self.log(Side::B)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The nftables ruleset of a side's gateway namespace.
    pub fn ruleset(&self, side: Side) -> String {
        let (ok, text) = exec(&self.gw(side), &["nft", "list", "ruleset"]);
        assert!(ok, "nft list ruleset: {text}");
        text
    }
}

fn forwarding(ns: &str) {
    let (ok, out) = exec(
        ns,
        &[
            "sh",
            "-c",
            "echo 1 > /proc/sys/net/ipv4/ip_forward && echo 0 > /proc/sys/net/ipv4/conf/all/rp_filter",
        ],
    );
    assert!(ok, "sysctl in {ns}: {out}");
}

impl Drop for Pair {
    fn drop(&mut self) {
        for side in [Side::A, Side::B] {
            self.kill(side);
        }
        if std::thread::panicking() {
            eprintln!("--- gateway A log ---\n{}", self.log(Side::A));
            eprintln!("--- gateway B log ---\n{}", self.log(Side::B));
        }
        for ns in self.namespaces.iter().rev() {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// One ICMP echo from `ns` to `addr`, waiting at most a second.
pub fn ping(ns: &str, addr: &str) -> bool {
    exec(ns, &["ping", "-c", "1", "-W", "1", addr]).0
}

/// Pings until one answers or `within` passes; returns the time it took.
pub fn ping_until(ns: &str, addr: &str, within: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < within {
        if exec(ns, &["ping", "-c", "1", "-W", "0.2", addr]).0 {
            return Some(start.elapsed());
        }
    }
    None
}

/// A TCP exchange: a server in `server_ns` on `port`, a client in `client_ns` connecting
/// to `dst`. Returns the client address the server saw, or why it failed.
pub fn tcp_exchange(
    server_ns: &str,
    port: u16,
    client_ns: &str,
    dst: &str,
) -> Result<String, String> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let server_ns = server_ns.to_string();
    let server = std::thread::spawn(move || {
        in_ns(&server_ns, move || -> Result<String, String> {
            let l = std::net::TcpListener::bind(("0.0.0.0", port)).map_err(|e| e.to_string())?;
            l.set_nonblocking(true).map_err(|e| e.to_string())?;
            ready_tx.send(()).ok();
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match l.accept() {
                    Ok((mut s, peer)) => {
                        s.set_nonblocking(false).ok();
                        s.set_read_timeout(Some(Duration::from_secs(3))).ok();
                        let mut buf = [0u8; 64];
                        let n = s.read(&mut buf).map_err(|e| e.to_string())?;
                        s.write_all(&buf[..n]).map_err(|e| e.to_string())?;
                        return Ok(peer.ip().to_string());
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if Instant::now() > deadline {
                            return Err("server: no connection within 5s".into());
                        }
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(e) => return Err(e.to_string()),
                }
            }
        })
    });
    ready_rx
        .recv_timeout(Duration::from_secs(5))
        .map_err(|_| "server did not start")?;
    let dst: SocketAddr = format!("{dst}:{port}").parse().unwrap();
    let client = in_ns(client_ns, move || -> Result<(), String> {
        let mut s = TcpStream::connect_timeout(&dst, Duration::from_secs(3))
            .map_err(|e| format!("client connect {dst}: {e}"))?;
        s.set_read_timeout(Some(Duration::from_secs(3))).ok();
        s.write_all(b"hello through the tunnel")
            .map_err(|e| e.to_string())?;
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).map_err(|e| e.to_string())?;
        if &buf[..n] != b"hello through the tunnel" {
            return Err(format!("echo mismatch: {:?}", &buf[..n]));
        }
        Ok(())
    });
    let seen = server.join().map_err(|_| "server panicked")?;
    client?;
    seen
}

/// A UDP exchange like [`tcp_exchange`].
pub fn udp_exchange(
    server_ns: &str,
    port: u16,
    client_ns: &str,
    dst: &str,
) -> Result<String, String> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let server_ns = server_ns.to_string();
    let server = std::thread::spawn(move || {
        in_ns(&server_ns, move || -> Result<String, String> {
            let s = UdpSocket::bind(("0.0.0.0", port)).map_err(|e| e.to_string())?;
            s.set_read_timeout(Some(Duration::from_secs(5))).ok();
            ready_tx.send(()).ok();
            let mut buf = [0u8; 64];
            let (n, peer) = s
                .recv_from(&mut buf)
                .map_err(|e| format!("server recv: {e}"))?;
            s.send_to(&buf[..n], peer).map_err(|e| e.to_string())?;
            Ok(peer.ip().to_string())
        })
    });
    ready_rx
        .recv_timeout(Duration::from_secs(5))
        .map_err(|_| "server did not start")?;
    let dst: SocketAddr = format!("{dst}:{port}").parse().unwrap();
    let client = in_ns(client_ns, move || -> Result<(), String> {
        let s = UdpSocket::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(3))).ok();
        s.send_to(b"datagram", dst).map_err(|e| e.to_string())?;
        let mut buf = [0u8; 64];
        let n = s.recv(&mut buf).map_err(|e| format!("client recv: {e}"))?;
        if &buf[..n] != b"datagram" {
            return Err("echo mismatch".into());
        }
        Ok(())
    });
    let seen = server.join().map_err(|_| "server panicked")?;
    client?;
    seen
}
