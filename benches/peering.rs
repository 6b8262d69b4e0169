//! Peering at scale through discovery: one consumer and 1, 8 and 32 providers, each with a
//! PeeringPolicy naming the consumer's key (auto-approve). Measured from the moment the
//! consumer's admin starts peering (the CA fetched and pinned, the request handed to its
//! controller, all providers at once) until every virtual node is Ready; and the consumer
//! controller's resident memory with 32 peers.
//!
//! Lab clusters run in this process (hollow nodes); every controller is a `tandem controller`
//! process with the default timings. Each provider advertises with `tandem advertise --domain`
//! (which sets up its enrollment credential), and the consumer's side is what `tandem peer
//! --endpoint URL --ca-fingerprint` runs.
//!
//! Run: `cargo build --release -p tandem-cli && cargo bench -p tandem-benches --bench peering`.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::sites;

pub fn main() -> anyhow::Result<()> {
    // `BENCH_API_LOG=FILE` logs every request the lab API servers answer (verb, path, user,
    // remote address) and every TLS connection they accept into FILE: to count what a peering
    // costs each side.
    if let Some(path) = std::env::var_os("BENCH_API_LOG") {
        let file = std::fs::File::create(path)?;
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                "tandem_apiserver::server=debug",
            ))
            .with_writer(std::sync::Mutex::new(file))
            .with_ansi(false)
            .init();
    }
    tokio::runtime::Runtime::new()?.block_on(run())
}

async fn run() -> anyhow::Result<()> {
    // `BENCH_PROVIDERS=1,32` runs only those sizes (the first is the baseline).
    let sizes: Vec<usize> = match std::env::var("BENCH_PROVIDERS") {
        Ok(v) => v
            .split(',')
            .map(|n| n.trim().parse())
            .collect::<Result<_, _>>()?,
        Err(_) => vec![1, 8, 32],
    };
    // `BENCH_RUNS=N` runs each size N times (default 5) and reports the median run by the time
    // until all virtual nodes are Ready, with the range: one run of 32 varies by about 20%
    // from one to the next on this machine.
    let runs: usize = match std::env::var("BENCH_RUNS") {
        Ok(v) => v.trim().parse::<usize>()?.max(1),
        Err(_) => 5,
    };
    // Each size's median run, with the fastest and slowest `ready` of its runs.
    let mut rows = Vec::new();
    for n in sizes {
        let mut all = Vec::new();
        for _ in 0..runs {
            all.push(once(n).await?);
        }
        all.sort_by_key(|r| r.ready);
        let range = (all[0].ready, all[all.len() - 1].ready);
        rows.push((all.swap_remove(all.len() / 2), range));
    }
    let (single, single_established) = (rows[0].0.ready, rows[0].0.established);
    println!();
    println!(
        "| providers | all virtual nodes Ready (median of {runs}, range) | vs one peering | per peering (Ready / providers) | all Peerings Established | vs one peering | consumer controller RSS | CPU until all Ready (busy, core-seconds) | idle load before |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (row, range) in &rows {
        println!(
            "| {} | {:.2} s ({:.2}–{:.2}) | {:.2}x | {:.3} s | {:.2} s | {:.2}x | {:.0} MiB | {:.0}%, {:.2} core-s | {:.0}% |",
            row.n,
            row.ready.as_secs_f64(),
            range.0.as_secs_f64(),
            range.1.as_secs_f64(),
            row.ready.as_secs_f64() / single.as_secs_f64(),
            row.ready.as_secs_f64() / row.n as f64,
            row.established.as_secs_f64(),
            row.established.as_secs_f64() / single_established.as_secs_f64(),
            row.rss as f64 / (1024.0 * 1024.0),
            row.cpu.busy * 100.0,
            row.cpu.core_seconds,
            row.idle.busy * 100.0,
        );
    }
    Ok(())
}

/// CPU ticks so far of this process, rome's controller and the providers' controllers.
fn cpu_split(sites: &[crate::Site]) -> (u64, u64, u64) {
    (
        crate::own_cpu_ticks(),
        sites[0].controller.cpu_ticks(),
        sites[1..].iter().map(|s| s.controller.cpu_ticks()).sum(),
    )
}

/// What one run measured.
struct Row {
    n: usize,
    ready: Duration,
    established: Duration,
    rss: u64,
    cpu: Cpu,
    /// The machine's load in the idle second before.
    idle: Cpu,
}

/// The machine's CPU time from /proc/stat's `cpu` line, in clock ticks: (busy, all).
fn cpu_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let all: u64 = fields.iter().take(8).sum();
    // idle and iowait
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    (all - idle, all)
}

/// How busy the machine was between two [`cpu_ticks`] readings.
struct Cpu {
    /// Busy share of all cores.
    busy: f64,
    /// Busy time summed over cores, in seconds (ticks are 1/100 s on Linux).
    core_seconds: f64,
}

fn cpu_between(before: (u64, u64), after: (u64, u64)) -> Cpu {
    let busy = after.0.saturating_sub(before.0) as f64;
    let all = after.1.saturating_sub(before.1).max(1) as f64;
    Cpu {
        busy: busy / all,
        core_seconds: busy / 100.0,
    }
}

/// One consumer and `n` providers: the time until every virtual node is Ready, and the
/// consumer controller's RSS then.
async fn once(n: usize) -> anyhow::Result<Row> {
    let dir = tempfile::tempdir()?;
    let mut specs: Vec<(String, String, usize)> = vec![("rome".into(), "eu-west".into(), 1)];
    specs.extend((1..=n).map(|i| (format!("p{i}"), "eu-south".into(), 1)));
    let spec_refs: Vec<(&str, &str, usize)> = specs
        .iter()
        .map(|(a, b, c)| (a.as_str(), b.as_str(), *c))
        .collect();
    eprintln!("starting 1 consumer and {n} providers");
    let sites = sites(dir.path(), &spec_refs).await?;
    let consumer = &sites[0];
    let rome = consumer.cluster.server.client().await?;
    let identity = tandem_controller::identity::ClusterIdentity::load(&rome).await?;
    let key = tandem_admin::enroll::own_key_fingerprint(&identity.private_key_pem)?;
    let mut targets = Vec::new();
    for site in &sites[1..] {
        // `tandem advertise --domain` sets up the enrollment credential and prints the CA's
        // fingerprint on stderr; the endpoint is the kubeconfig's server.
        let out = std::process::Command::new(crate::tandem_bin())
            .args([
                "advertise",
                "--domain",
                "bench.example",
                "--kubeconfig",
                &site.kubeconfig,
            ])
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "advertise: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let said = String::from_utf8_lossy(&out.stderr);
        let fingerprint = said
            .split_whitespace()
            .find(|w| w.starts_with("sha256:"))
            .ok_or_else(|| anyhow::anyhow!("no fingerprint in {said}"))?
            .to_string();
        let printed = String::from_utf8_lossy(&out.stdout);
        let endpoint = printed
            .split("endpoint=")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .ok_or_else(|| anyhow::anyhow!("no endpoint in {printed}"))?
            .to_string();
        let client = site.cluster.server.client().await?;
        Api::<tandem_api::PeeringPolicy>::all(client)
            .patch(
                "bench",
                &PatchParams::apply("bench").force(),
                &Patch::Apply(json!({
                    "apiVersion": "tandem.dev/v1alpha1", "kind": "PeeringPolicy",
                    "metadata": {"name": "bench"},
                    "spec": {"consumers": [{"keyFingerprint": key}]},
                })),
            )
            .await?;
        targets.push((endpoint, fingerprint));
    }

    // The machine's load with every cluster and controller up but idle, for comparison.
    let idle0 = cpu_ticks();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = cpu_between(idle0, cpu_ticks());

    // Where the time goes: the moment every Peering is Authenticated (identity issued),
    // Established (negotiated), and every virtual node Ready. Watched, not polled: listing
    // 32 Peerings and 33 Nodes every few milliseconds would itself load the machine.
    let t0 = Instant::now();
    // `BENCH_START_MARK=FILE`: FILE is written now (for a profiler to start on).
    if let Ok(mark) = std::env::var("BENCH_START_MARK") {
        std::fs::write(mark, n.to_string())?;
    }
    let cpu0 = cpu_ticks();
    let split0 = cpu_split(&sites);
    let watch = tokio::spawn(watch_progress(rome.clone(), n, t0, cpu0));
    let requests = targets.iter().map(|(endpoint, fingerprint)| {
        let rome = rome.clone();
        async move {
            let provider = tandem_admin::enroll::fetch_provider(endpoint, fingerprint).await?;
            tandem_admin::enroll::request(&rome, endpoint, &provider, "endpoint").await?;
            anyhow::Ok(())
        }
    });
    for r in futures::future::join_all(requests).await {
        r?;
    }
    let handed = t0.elapsed();
    let Progress {
        authenticated_at,
        established_at,
        ready_at,
        cpu_ready,
    } = tokio::time::timeout(Duration::from_secs(300), watch)
        .await
        .map_err(|_| anyhow::anyhow!("not all {n} virtual nodes Ready after 300 s"))???;
    eprintln!(
        "{n} providers: requests handed over {:.2} s, all authenticated {:.2} s, all virtual nodes Ready {:.2} s, all established {:.2} s",
        handed.as_secs_f64(),
        authenticated_at.as_secs_f64(),
        ready_at.as_secs_f64(),
        established_at.as_secs_f64()
    );
    let split = cpu_split(&sites);
    eprintln!(
        "{n} providers: CPU from the start to the last Established: this process (every API server, scheduler and hollow node, and the bench) {:.2} s, rome's controller {:.2} s, the providers' controllers {:.2} s",
        split.0.saturating_sub(split0.0) as f64 / 100.0,
        split.1.saturating_sub(split0.1) as f64 / 100.0,
        split.2.saturating_sub(split0.2) as f64 / 100.0,
    );
    let total = ready_at;
    let established = established_at;
    let rss = consumer.controller.rss_bytes();
    eprintln!(
        "{n} providers: all virtual nodes Ready in {:.2} s; consumer controller RSS {} MiB",
        total.as_secs_f64(),
        rss / (1024 * 1024)
    );
    let cpu = cpu_ready;
    eprintln!(
        "{n} providers: the machine was {:.0}% busy until all Ready ({:.2} core-seconds, {:.3} per provider); {:.0}% in the idle second before",
        cpu.busy * 100.0,
        cpu.core_seconds,
        cpu.core_seconds / n as f64,
        idle.busy * 100.0,
    );
    // Stop every cluster: a dropped LabCluster keeps its API server, scheduler, hollow nodes
    // and their connections (about a hundred sockets each) running in this process, loading
    // every later run and, over many runs, running out of file descriptors.
    for crate::Site {
        cluster,
        controller,
        ..
    } in sites
    {
        drop(controller);
        cluster.shutdown();
    }
    Ok(Row {
        n,
        ready: total,
        established,
        rss,
        cpu,
        idle,
    })
}

/// When every Peering was Authenticated and Established, and every virtual node Ready (from
/// `t0`), and the machine's CPU until the last.
struct Progress {
    authenticated_at: Duration,
    established_at: Duration,
    ready_at: Duration,
    cpu_ready: Cpu,
}

/// Watches rome's Peerings and Nodes until all `n` are Established and Ready.
async fn watch_progress(
    rome: kube::Client,
    n: usize,
    t0: Instant,
    cpu0: (u64, u64),
) -> anyhow::Result<Progress> {
    use futures::StreamExt as _;
    use kube::runtime::watcher;
    use std::collections::BTreeMap;

    enum Seen {
        Peering(String, Option<(bool, bool)>),
        Node(String, Option<bool>),
    }
    let peerings = watcher(
        Api::<tandem_api::Peering>::all(rome.clone()),
        watcher::Config::default(),
    )
    .filter_map(|e| async move {
        let state = |p: &tandem_api::Peering| {
            let authenticated = p.status.as_ref().is_some_and(|s| {
                tandem_api::conditions::is_true(
                    &s.conditions,
                    tandem_api::conditions::AUTHENTICATED,
                )
            });
            (authenticated, tandem_admin::invite::is_established(p))
        };
        match e.ok()? {
            watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                Some(Seen::Peering(p.metadata.name.clone()?, Some(state(&p))))
            }
            watcher::Event::Delete(p) => Some(Seen::Peering(p.metadata.name?, None)),
            _ => None,
        }
    });
    let nodes =
        watcher(Api::<Node>::all(rome), watcher::Config::default()).filter_map(|e| async move {
            let ready = |node: &Node| {
                node.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            };
            match e.ok()? {
                watcher::Event::Apply(node) | watcher::Event::InitApply(node) => {
                    let name = node.metadata.name.clone()?;
                    name.starts_with("tandem-p")
                        .then(|| Seen::Node(name, Some(ready(&node))))
                }
                watcher::Event::Delete(node) => Some(Seen::Node(node.metadata.name?, None)),
                _ => None,
            }
        });
    let mut events = futures::stream::select(peerings.boxed(), nodes.boxed());
    let mut peering_state: BTreeMap<String, (bool, bool)> = BTreeMap::new();
    let mut node_ready: BTreeMap<String, bool> = BTreeMap::new();
    let (mut authenticated_at, mut established_at, mut ready_at) = (None, None, None);
    let mut cpu_ready = None;
    while let Some(seen) = events.next().await {
        match seen {
            Seen::Peering(name, Some(state)) => {
                peering_state.insert(name, state);
            }
            Seen::Peering(name, None) => {
                peering_state.remove(&name);
            }
            Seen::Node(name, Some(ready)) => {
                node_ready.insert(name, ready);
            }
            Seen::Node(name, None) => {
                node_ready.remove(&name);
            }
        }
        let authenticated = peering_state.values().filter(|s| s.0).count();
        let established = peering_state.values().filter(|s| s.1).count();
        let ready = node_ready.values().filter(|r| **r).count();
        if authenticated == n && authenticated_at.is_none() {
            authenticated_at = Some(t0.elapsed());
        }
        if established == n && established_at.is_none() {
            established_at = Some(t0.elapsed());
        }
        if ready == n && ready_at.is_none() {
            ready_at = Some(t0.elapsed());
            cpu_ready = Some(cpu_between(cpu0, cpu_ticks()));
        }
        if let (Some(a), Some(e), Some(r)) = (authenticated_at, established_at, ready_at) {
            return Ok(Progress {
                authenticated_at: a,
                established_at: e,
                ready_at: r,
                cpu_ready: cpu_ready.expect("measured with ready_at"),
            });
        }
    }
    anyhow::bail!("the watches of rome's Peerings and Nodes ended")
}
