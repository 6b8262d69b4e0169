//! Through the virtual node (root): how `kubectl logs`, `logs -f` and `exec` on an offloaded
//! pod compare with the same commands on a local pod. Two network-mode lab clusters
//! (`tandem lab up --network`), Tandem installed on both (controllers as their pods), rome
//! peered with milan, an echo pod offloaded to milan and one on rome's own node; then, with the
//! real kubectl, the wall time of `kubectl exec POD -- hostname` and `kubectl logs POD`, and
//! the delay from a line being written in the pod (its kubelet's timestamp, same machine clock)
//! to its arrival on `kubectl logs -f --timestamps`.
//! Run: `cargo build --release -p tandem-cli && cargo bench -p tandem-benches --bench
//! virtual_kubelet` (TANDEM_BIN to use another binary, BENCH_ROUNDS to resize).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

struct Lab(Child);

impl Drop for Lab {
    /// Stops the lab as Ctrl-C does, so that it removes its namespaces; SIGKILL only if it has
    /// not stopped within 20 s.
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.0.try_wait() {
            return;
        }
        let _ = Command::new("kill")
            .args(["-INT", &self.0.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn run(cmd: &mut Command, what: &str) -> anyhow::Result<String> {
    let out: Output = cmd.output()?;
    anyhow::ensure!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn wait(what: &str, limit: Duration, mut check: impl FnMut() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    while !check() {
        anyhow::ensure!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

pub fn main() -> anyhow::Result<()> {
    anyhow::ensure!(
        std::fs::read_to_string("/proc/self/status")?
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")),
        "the virtual kubelet benchmark needs root (network-mode labs)"
    );
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let bin: PathBuf = std::env::var_os("TANDEM_BIN").map_or_else(
        || {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../target/x86_64-unknown-linux-gnu/release/tandem")
        },
        PathBuf::from,
    );
    anyhow::ensure!(
        bin.exists(),
        "{} is missing: cargo build --release -p tandem-cli",
        bin.display()
    );
    let home = tempfile::tempdir()?;
    let dir = home.path().join("lab");
    let kubeconfig = dir.join("kubeconfig");
    let _lab = Lab(Command::new(&bin)
        .args([
            "lab",
            "up",
            "--network",
            "--clusters",
            "2",
            "--nodes",
            "1",
            "--dir",
        ])
        .arg(&dir)
        .env("HOME", home.path())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?);
    wait("the lab's kubeconfig", Duration::from_secs(60), || {
        kubeconfig.exists()
    })?;
    let kc = kubeconfig.to_string_lossy().into_owned();
    let tandem = |args: &[&str], ctx: &str| {
        let mut c = Command::new(&bin);
        c.args(args)
            .args(["--kubeconfig", &kc, "--context", ctx])
            .env("HOME", home.path());
        c
    };
    let kubectl = |args: &[&str]| {
        let mut c = Command::new("kubectl");
        c.args(["--kubeconfig", &kc, "--context", "lab-1", "-n", "demo"])
            .args(args);
        c
    };
    for (ctx, id) in [("lab-1", "rome"), ("lab-2", "milan")] {
        run(
            &mut tandem(&["install", "--cluster-id", id], ctx),
            "install",
        )?;
    }
    let invite = run(
        &mut tandem(
            &["invite", "--endpoint", "https://198.18.2.2:6443"],
            "lab-2",
        ),
        "invite",
    )?;
    run(&mut tandem(&["peer", invite.trim()], "lab-1"), "peer")?;
    run(
        Command::new("kubectl").args([
            "--kubeconfig",
            &kc,
            "--context",
            "lab-1",
            "create",
            "namespace",
            "demo",
        ]),
        "namespace",
    )?;
    run(
        &mut tandem(&["offload", "namespace", "demo"], "lab-1"),
        "offload",
    )?;
    for (pod, node) in [("offloaded", "tandem-milan"), ("local", "lab-1-node-1")] {
        let overrides =
            format!(r#"{{"spec":{{"nodeSelector":{{"kubernetes.io/hostname":"{node}"}}}}}}"#);
        run(
            &mut kubectl(&[
                "run",
                pod,
                "--image=tandem.dev/echo",
                "--overrides",
                &overrides,
            ]),
            "kubectl run",
        )?;
    }
    for pod in ["offloaded", "local"] {
        wait(
            &format!("{pod} answering kubectl exec"),
            Duration::from_secs(90),
            || {
                kubectl(&["exec", pod, "--", "hostname"])
                    .output()
                    .is_ok_and(|o| o.status.success())
            },
        )?;
    }
    println!(
        "virtual kubelet benchmark ({} cores, {rounds} rounds, kubectl {})",
        std::thread::available_parallelism()?.get(),
        run(
            Command::new("kubectl").args(["version", "--client", "-o", "json"]),
            "kubectl version"
        )
        .ok()
        .and_then(|v| serde_json::from_str::<serde_json::Value>(&v).ok())
        .and_then(|v| v["clientVersion"]["gitVersion"]
            .as_str()
            .map(str::to_string))
        .unwrap_or_default()
    );
    println!("| measure | local pod | offloaded pod |\n|---|---:|---:|");
    let mut rows: Vec<(String, [String; 2])> = Vec::new();
    let timed = |args: &[&str]| -> anyhow::Result<Duration> {
        let start = Instant::now();
        run(&mut kubectl(args), "kubectl")?;
        Ok(start.elapsed())
    };
    for (what, args) in [
        (
            "kubectl exec POD -- hostname (median)",
            &["exec", "POD", "--", "hostname"][..],
        ),
        ("kubectl logs POD (median)", &["logs", "POD"][..]),
    ] {
        let mut cells = [String::new(), String::new()];
        for (i, pod) in ["local", "offloaded"].into_iter().enumerate() {
            let args: Vec<&str> = args
                .iter()
                .map(|a| if *a == "POD" { pod } else { *a })
                .collect();
            let times = (0..rounds)
                .map(|_| timed(&args))
                .collect::<anyhow::Result<Vec<_>>>()?;
            cells[i] = ms(median(times));
        }
        rows.push((what.into(), cells));
    }
    // logs -f: each round makes the pod's echo program serve one request (from inside the pod,
    // by exec on the local pod's side) and times the line from its timestamp to its arrival.
    let mut median_cells = [String::new(), String::new()];
    let mut max_cells = [String::new(), String::new()];
    for (i, pod) in ["local", "offloaded"].iter().enumerate() {
        let mut follow = kubectl(&["logs", "-f", "--timestamps", "--tail=0", pod])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let stdout = follow.stdout.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send((k8s_openapi::jiff::Timestamp::now(), line));
            }
        });
        let mut delays = Vec::new();
        let mut round = 0;
        let deadline = Instant::now() + Duration::from_secs(120);
        while delays.len() < rounds {
            anyhow::ensure!(Instant::now() < deadline, "logs -f of {pod}: too few lines");
            round += 1;
            let url = format!("http://127.0.0.1:8080/round-{round}");
            let _ = kubectl(&["exec", pod, "--", "probe", "fetch", &url]).output();
            while let Ok((arrived, line)) = rx.recv_timeout(Duration::from_secs(2)) {
                let Some((stamp, text)) = line.split_once(' ') else {
                    continue;
                };
                let Ok(written) = stamp.parse::<k8s_openapi::jiff::Timestamp>() else {
                    continue;
                };
                if text.contains(&format!("/round-{round}")) {
                    let delay = arrived.duration_since(written);
                    delays.push(Duration::try_from(delay).unwrap_or_default());
                    break;
                }
            }
        }
        let _ = follow.kill();
        let _ = follow.wait();
        max_cells[i] = ms(*delays.iter().max().expect("rounds > 0"));
        median_cells[i] = ms(median(delays));
    }
    rows.push((
        "logs -f: line written → shown (median)".into(),
        median_cells,
    ));
    rows.push(("logs -f: line written → shown (max)".into(), max_cells));
    // port-forward: one kubectl port-forward per pod (WebSocket tunnel to the API server, as
    // kubectl 1.32 does by default); a request on a new connection each round (a new SPDY
    // stream pair each time), then one 8 MiB body echoed by the pod.
    let mut request_cells = [String::new(), String::new()];
    let mut throughput_cells = [String::new(), String::new()];
    let body: Vec<u8> = (0..8 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    for (i, pod) in ["local", "offloaded"].into_iter().enumerate() {
        let forward = tandem_testing::port_forward(&kc, "lab-1", "demo", pod, 8080, true, &[])
            .map_err(|e| anyhow::anyhow!("port-forward to {pod}: {e}"))?;
        let times: Vec<Duration> = (0..rounds)
            .map(|_| {
                let start = Instant::now();
                let (status, _) = tandem_testing::http(forward.port, "GET", b"");
                anyhow::ensure!(status.contains(" 200 "), "port-forward to {pod}: {status}");
                Ok(start.elapsed())
            })
            .collect::<anyhow::Result<_>>()?;
        request_cells[i] = format!("{:.1} ms", median(times).as_secs_f64() * 1e3);
        let start = Instant::now();
        let (_, echoed) = tandem_testing::http(forward.port, "POST", &body);
        let took = start.elapsed();
        anyhow::ensure!(
            echoed == body,
            "port-forward to {pod}: the body came back changed"
        );
        // Both ways: 8 MiB up, 8 MiB back.
        throughput_cells[i] = format!(
            "{:.0} MB/s",
            2.0 * body.len() as f64 / took.as_secs_f64() / 1e6
        );
    }
    rows.push((
        "port-forward: GET on a new connection (median)".into(),
        request_cells,
    ));
    rows.push((
        "port-forward: 8 MiB echoed (up + down)".into(),
        throughput_cells,
    ));
    for (what, [local, offloaded]) in rows {
        println!("| {what} | {local} | {offloaded} |");
    }
    Ok(())
}
