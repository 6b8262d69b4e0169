//! Test support shared by every crate's tests (the lab's, the controller's, the CLI's, the
//! benches'): polling with a deadline that names what it waits for ([`until`], and
//! [`until_blocking`] for tests that drive processes without a runtime), registered while it
//! lasts so that a test the harness terminates prints its waits ([`waiting_for`]); the real
//! `kubectl`; root-only markers; HTTP and port forwards; isolated network namespaces.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

mod hang;

pub use hang::{Waiting, waiting_for};

/// Polls `check` every 100 ms until it returns Some, panicking with `what` after `timeout`.
pub async fn until<T, F, Fut>(what: &str, timeout: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    until_every(what, timeout, Duration::from_millis(100), check).await
}

/// Polls `check` every `interval` until it returns Some, panicking with `what` after `timeout`.
pub async fn until_every<T, F, Fut>(
    what: &str,
    timeout: Duration,
    interval: Duration,
    mut check: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let _waiting = waiting_for(format!("{what} (polled for up to {timeout:?})"));
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        // The check itself is bounded too: a request that never answers fails the wait
        // naming what it was for, instead of hanging the test until the harness kills it.
        let started = tokio::time::Instant::now();
        let Ok(found) = tokio::time::timeout_at(deadline, check()).await else {
            // A check cut short right after it started is a slow wait, not a hung request.
            panic!(
                "timed out after {timeout:?} waiting for {what} (the last check, started {:.1?} \
                 before the deadline, had not returned)",
                deadline.duration_since(started)
            );
        };
        if let Some(v) = found {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(interval).await;
    }
}

/// [`until`] for tests without a runtime (they drive `tandem` and `kubectl` as processes):
/// calls `check` every 250 ms until it returns Some, panicking with `what` after `timeout`.
pub fn until_blocking<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let _waiting = waiting_for(format!("{what} (polled for up to {timeout:?})"));
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Runs the real `kubectl --kubeconfig <kubeconfig> <args>` with `HOME` at `home` (so its
/// discovery cache stays in the test's directory), feeding it `stdin`; returns whether it
/// succeeded and what it printed (stdout, then stderr).
pub async fn kubectl(
    kubeconfig: &Path,
    home: &Path,
    args: &[&str],
    stdin: Option<&str>,
) -> (bool, String) {
    use tokio::io::AsyncWriteExt;
    let _waiting = waiting_for(format!("kubectl {}", args.join(" ")));
    let mut child = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env("HOME", home)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("kubectl is installed");
    let mut input = child.stdin.take().expect("kubectl's stdin");
    if let Some(s) = stdin {
        input
            .write_all(s.as_bytes())
            .await
            .expect("kubectl's stdin written");
    }
    drop(input);
    // kubectl waits for an answer forever by default: a request the server never answers
    // fails the test here, naming the command, instead of hanging it until the harness kills it.
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(120),
        child.wait_with_output(),
    )
    .await
    .unwrap_or_else(|_| panic!("kubectl {args:?} did not finish within 120 s"))
    .expect("kubectl ran");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The guard of a test that needs root (network namespaces, TUN, nftables), which also carries
/// `#[cfg_attr(not(tandem_root), ignore = "needs root")]`: a build without root lists it as
/// ignored. It panics, naming the fix, when a build made as root runs without it.
pub fn needs_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root: it was built as root (cfg tandem_root) and runs without it; \
         run it as root, or rebuild as this user to list it as ignored"
    );
}

/// One HTTP/1.1 request to 127.0.0.1:`port` with `body` (a connection of its own, closed after
/// the answer); the response's status line and body. Panics on a connection failure or an
/// answer that is not HTTP: for tests and benchmarks that port-forward to lab pods.
pub fn http(port: u16, method: &str, body: &[u8]) -> (String, Vec<u8>) {
    use std::io::{Read, Write};
    use std::time::Duration;
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connects");
    conn.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let head = format!(
        "{method} / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).unwrap();
    conn.write_all(body).unwrap();
    // Read up to the end of the body the headers announce: the connection itself may stay
    // open a moment longer (a port-forward ends its connections after the pod's).
    let mut response = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    let (split, length) = loop {
        let n = conn.read(&mut chunk).expect("reads the response");
        assert!(
            n > 0,
            "no HTTP response: {:?}",
            String::from_utf8_lossy(&response)
        );
        response.extend_from_slice(&chunk[..n]);
        if let Some(split) = response.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&response[..split]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .expect("a Content-Length");
            break (split, length);
        }
    };
    while response.len() < split + 4 + length {
        let n = conn.read(&mut chunk).expect("reads the response body");
        assert!(n > 0, "the response ended early");
        response.extend_from_slice(&chunk[..n]);
    }
    let status = String::from_utf8_lossy(&response[..split])
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    (status, response[split + 4..split + 4 + length].to_vec())
}

/// A running `kubectl port-forward`, stopped when dropped.
pub struct PortForward {
    child: std::process::Child,
    /// The local port it listens on.
    pub port: u16,
}

impl Drop for PortForward {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `kubectl port-forward` stopped before it listened; the message is what it wrote on stderr.
#[derive(Debug, thiserror::Error)]
#[error("{stderr}")]
pub struct PortForwardFailed {
    /// kubectl's stderr.
    pub stderr: String,
}

/// Starts `kubectl port-forward pod/POD :REMOTE` in `namespace`; returns once it says where it
/// listens, or kubectl's error if it stops first. `websockets: false` makes kubectl speak SPDY
/// to the API server as kubectl before 1.31 did (`KUBECTL_PORT_FORWARD_WEBSOCKETS=false`).
#[allow(clippy::too_many_arguments)]
pub fn port_forward(
    kubeconfig: &str,
    context: &str,
    namespace: &str,
    pod: &str,
    remote: u16,
    websockets: bool,
    extra: &[&str],
) -> Result<PortForward, PortForwardFailed> {
    use std::io::{BufRead, BufReader, Read};
    use std::process::{Command, Stdio};
    let mut child = Command::new("kubectl")
        .args(["--kubeconfig", kubeconfig, "--context", context])
        .args(["-n", namespace, "port-forward", &format!("pod/{pod}")])
        .arg(format!(":{remote}"))
        .args(extra)
        .env(
            "KUBECTL_PORT_FORWARD_WEBSOCKETS",
            if websockets { "true" } else { "false" },
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    while let Some(Ok(line)) = lines.next() {
        // "Forwarding from 127.0.0.1:PORT -> REMOTE"
        if let Some(port) = line
            .strip_prefix("Forwarding from 127.0.0.1:")
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|p| p.parse().ok())
        {
            // kubectl goes on writing ("Handling connection for …"): a closed pipe would kill
            // it, a full one stop it.
            std::thread::spawn(move || lines.for_each(drop));
            if let Some(stderr) = child.stderr.take() {
                std::thread::spawn(move || BufReader::new(stderr).lines().for_each(drop));
            }
            return Ok(PortForward { child, port });
        }
    }
    let mut err = String::new();
    if let Some(mut stderr) = child.stderr.take() {
        let _ = stderr.read_to_string(&mut err);
    }
    let _ = child.wait();
    Err(PortForwardFailed { stderr: err })
}

/// A network namespace of its own for tests and benchmarks, unnamed: made by a thread's
/// `unshare` and alive while this handle's file is open. When the process ends — or is killed —
/// the kernel removes it with its links and addresses; nothing is registered or left behind, and
/// the host's own namespace gets nothing.
pub struct IsolatedNetns(std::fs::File);

impl IsolatedNetns {
    pub fn new() -> IsolatedNetns {
        std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare");
            IsolatedNetns(std::fs::File::open("/proc/thread-self/ns/net").expect("open the netns"))
        })
        .join()
        .expect("the unshare thread")
    }

    /// Runs `f` on a thread inside the namespace (sockets it makes and processes it spawns are
    /// inside too).
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        use std::os::fd::AsFd;
        let file = self.0.try_clone().expect("dup the netns file");
        std::thread::spawn(move || {
            nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            f()
        })
        .join()
        .expect("the netns thread")
    }

    /// `ip ARGS…` inside the namespace; panics with its stderr when it fails.
    pub fn ip(&self, args: &[&str]) {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        self.run(move || {
            let out = std::process::Command::new("ip")
                .args(&args)
                .output()
                .expect("run ip");
            assert!(
                out.status.success(),
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        });
    }

    /// A path other processes can name the namespace by (`ip link set … netns PATH`).
    pub fn path(&self) -> String {
        use std::os::fd::AsRawFd;
        format!("/proc/{}/fd/{}", std::process::id(), self.0.as_raw_fd())
    }
}

impl Default for IsolatedNetns {
    fn default() -> Self {
        Self::new()
    }
}

/// An isolated LAN: a bridge `br0` in a namespace of its own.
pub fn isolated_lan() -> IsolatedNetns {
    let lan = IsolatedNetns::new();
    lan.ip(&["link", "add", "br0", "type", "bridge"]);
    lan.ip(&["link", "set", "br0", "up"]);
    lan
}

/// Host `i` (0-based) of `lan`: a namespace whose `eth0`, on the bridge, holds
/// 10.99.0.<i+1>/24.
pub fn lan_host(lan: &IsolatedNetns, i: u8) -> (IsolatedNetns, std::net::Ipv4Addr) {
    let ns = IsolatedNetns::new();
    let ip = std::net::Ipv4Addr::new(10, 99, 0, i + 1);
    let port = format!("lan{i}");
    lan.ip(&[
        "link",
        "add",
        &port,
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        &ns.path(),
    ]);
    lan.ip(&["link", "set", &port, "master", "br0", "up"]);
    ns.ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"]);
    ns.ip(&["link", "set", "eth0", "up"]);
    ns.ip(&["link", "set", "lo", "up"]);
    (ns, ip)
}
