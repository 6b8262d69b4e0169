//! Liqo-style offloading burst: Deployments of 10, 100, 1,000 and 10,000 pods, time until all
//! are Ready — created directly on the provider (vanilla) vs created on a consumer in a namespace
//! offloaded to that provider — in one run, plus the consumer controller's memory per 1,000
//! offloaded pods.
//!
//! By default (BENCH_PLACEMENT=pinned) each lab cluster runs in a child process of this
//! benchmark pinned to a core of its own, with its Tandem controller (`tandem controller`, a
//! process of its own so that its memory and CPU are measured alone) on the same core, as on
//! two machines; BENCH_PLACEMENT=shared runs both clusters in this process on every core.
//! Peering goes through the real CLI (`tandem install`, `invite`, `peer`, `offload`).
//! Run: `cargo build --release -p tandem-cli && cargo bench -p tandem-benches --bench offload`
//! (BENCH_SIZES=10,100 and BENCH_NODES to resize; BENCH_REPEAT=3 runs each size three times
//! and prints the median ratio; BENCH_STAGES=1 prints when the pods reached each stage, see
//! `stages`).
//!
//! BENCH_WORKLOAD=job runs the batch-bursting comparison instead: a consumer with 2 nodes whose
//! 400m pods fit 40 at a time, a 300-completion Job (parallelism 100) run first in a namespace
//! that is not offloaded (local only), then in one offloaded with `LocalAndRemote` (bursting),
//! timed from the create until the Job is Complete with 300 succeeded.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use tandem_lab::{LabCluster, LabConfig};

use crate::stages::{Place, Stages, Watched};
use crate::{Controller, tandem, tandem_bin};

/// CPU seconds (user + system) used so far by process `pid`.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command name (which may contain spaces) come state (field 3) … utime (14), stime (15).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let ticks: f64 = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse::<f64>().ok())
        .sum();
    // USER_HZ is 100 on Linux.
    ticks / 100.0
}

/// CPU seconds used so far by each of `pids`.
fn cpu(pids: &[u32]) -> Vec<f64> {
    pids.iter().map(|&p| cpu_seconds(p)).collect()
}

fn cpu_delta(before: &[f64], after: &[f64]) -> String {
    before
        .iter()
        .zip(after)
        .map(|(b, a)| format!("{:.1}", a - b))
        .collect::<Vec<_>>()
        .join(" / ")
}

/// Waits until the processes are quiet (together under 10 % of a core for a second), so that
/// no run pays for the previous one's aftermath: a teardown is done for the API (no pods
/// listed) before every controller has worked through its thousands of DELETED events.
async fn settle(pids: &[u32]) {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(120);
    let mut before = cpu(pids).iter().sum::<f64>();
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = cpu(pids).iter().sum::<f64>();
        if now - before < 0.1 {
            if started.elapsed() > Duration::from_secs(2) {
                eprintln!(
                    "  (the clusters went quiet {:.0} s after the previous step)",
                    started.elapsed().as_secs_f64()
                );
            }
            return;
        }
        before = now;
    }
}

fn deployment(name: &str, replicas: usize) -> anyhow::Result<Deployment> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "pause",
                    "resources": {"requests": {"cpu": "1m", "memory": "1Mi"}}}]},
            },
        },
    }))?)
}

async fn until(
    what: &str,
    mut done: impl AsyncFnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(900);
    while !done().await? {
        anyhow::ensure!(
            Instant::now() < deadline,
            "{what}: not done after 15 minutes"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Creates the Deployment and returns the time until all its replicas are Ready, as a watch
/// of the Deployment sees it (a poll would add up to its period: at 100 pods a burst lasts
/// a few tenths of a second).
/// With `stages`, also when the pods reached each stage, as watches of those places saw it
/// (see [`crate::stages`]).
async fn burst(
    client: &kube::Client,
    ns: &str,
    name: &str,
    n: usize,
    stages: Option<Vec<Place>>,
) -> anyhow::Result<(Duration, Option<String>)> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let watches = match stages {
        Some(places) => Some(Stages::watch(places).await?),
        None => None,
    };
    let started = Instant::now();
    api.create(&PostParams::default(), &deployment(name, n)?)
        .await?;
    let ready = kube::runtime::wait::await_condition(api, name, move |d: Option<&Deployment>| {
        let ready = d.and_then(|d| d.status.as_ref()?.ready_replicas);
        ready.unwrap_or(0) as usize == n
    });
    tokio::time::timeout(Duration::from_secs(900), ready)
        .await
        .map_err(|_| anyhow::anyhow!("{ns}/{name} Ready: not done after 15 minutes"))??;
    let took = started.elapsed();
    let report = match watches {
        Some(w) => Some(w.report(started).await),
        None => None,
    };
    Ok((took, report))
}

/// The pods of `ns` in `client`'s cluster, for [`burst`]'s stages.
fn pods_of(label: &'static str, client: &kube::Client, ns: &str) -> Place {
    Place {
        label,
        client: client.clone(),
        namespace: ns.into(),
        what: Watched::Pods,
    }
}

/// Deletes the Deployment and waits until its pods are gone from every given cluster.
async fn teardown(
    client: &kube::Client,
    ns: &str,
    name: &str,
    also: &[(&kube::Client, &str)],
) -> anyhow::Result<()> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    api.delete(name, &DeleteParams::foreground()).await?;
    let mut places = vec![(client, ns)];
    places.extend_from_slice(also);
    for (c, ns) in places {
        let pods: Api<Pod> = Api::namespaced(c.clone(), ns);
        until("pods deleted", async || {
            Ok(pods
                .list_metadata(&ListParams::default())
                .await?
                .items
                .is_empty())
        })
        .await?;
    }
    Ok(())
}

/// One lab cluster of the benchmark and what reaches it.
struct Site {
    client: kube::Client,
    kubeconfig: String,
    /// The process it runs in.
    pid: u32,
    /// Keeps the cluster up: the cluster itself, or the child process serving it.
    _keep: Box<dyn std::any::Any>,
}

/// A child process serving one cluster (`BENCH_SERVE`); it exits when its stdin closes.
struct ChildCluster(Child);

impl Drop for ChildCluster {
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let _ = self.0.wait();
    }
}

fn lab_config(name: &str, nodes: usize, region: &str) -> LabConfig {
    LabConfig {
        name: name.into(),
        nodes,
        region: region.into(),
        ..Default::default()
    }
}

/// Starts a cluster in this process, or, with `core`, in a child process pinned to that core.
async fn site(dir: &Path, config: LabConfig, core: Option<usize>) -> anyhow::Result<Site> {
    let path = dir.join(format!("{}.kubeconfig", config.name));
    let Some(core) = core else {
        let cluster = LabCluster::start(config).await?;
        std::fs::write(&path, cluster.server.admin_kubeconfig()?)?;
        return Ok(Site {
            client: cluster.client.clone(),
            kubeconfig: path.display().to_string(),
            pid: std::process::id(),
            _keep: Box::new(cluster),
        });
    };
    let child = Command::new("taskset")
        .arg("-c")
        .arg(core.to_string())
        .arg(std::env::current_exe()?)
        .env(
            "BENCH_SERVE",
            format!(
                "{},{},{},{}",
                config.name,
                config.nodes,
                config.region,
                path.display()
            ),
        )
        .stdin(Stdio::piped())
        .spawn()?;
    let child = ChildCluster(child);
    until(&format!("cluster {} up", config.name), async || {
        Ok(path.exists())
    })
    .await?;
    let kubeconfig = kube::config::Kubeconfig::read_from(&path)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    Ok(Site {
        client: kube::Client::try_from(config)?,
        kubeconfig: path.display().to_string(),
        pid: child.0.id(),
        _keep: Box::new(child),
    })
}

/// The child side of [`site`]: serves `name,nodes,region,kubeconfig` until stdin closes.
async fn serve(spec: &str) -> anyhow::Result<()> {
    let parts: Vec<&str> = spec.splitn(4, ',').collect();
    anyhow::ensure!(
        parts.len() == 4,
        "BENCH_SERVE={spec}: want name,nodes,region,kubeconfig"
    );
    let cluster = LabCluster::start(lab_config(parts[0], parts[1].parse()?, parts[2])).await?;
    let tmp = format!("{}.tmp", parts[3]);
    std::fs::write(&tmp, cluster.server.admin_kubeconfig()?)?;
    std::fs::rename(&tmp, parts[3])?;
    tokio::task::spawn_blocking(|| std::io::copy(&mut std::io::stdin(), &mut std::io::sink()))
        .await??;
    drop(cluster);
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
pub async fn main() -> anyhow::Result<()> {
    if let Ok(spec) = std::env::var("BENCH_SERVE") {
        return serve(&spec).await;
    }
    let sizes: Vec<usize> = std::env::var("BENCH_SIZES")
        .unwrap_or_else(|_| "10,100,1000,10000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    // Each size runs this many times (vanilla then offloaded, back to back), and the median
    // ratio is printed: on a shared 2-core VM one run's CPU seconds move by up to 30 %.
    let repeat: usize = std::env::var("BENCH_REPEAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1);
    let nodes: usize = std::env::var("BENCH_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    // pinned: each cluster (with its controller) on a core of its own, as on two machines;
    // shared: both clusters and controllers on every core.
    let pinned = match std::env::var("BENCH_PLACEMENT").as_deref() {
        Ok("shared") => false,
        Ok("pinned") | Err(_) => true,
        Ok(other) => anyhow::bail!("BENCH_PLACEMENT={other}: want pinned or shared"),
    };
    let job_mode = match std::env::var("BENCH_WORKLOAD").as_deref() {
        Ok("job") => true,
        Ok("deployment") | Err(_) => false,
        Ok(other) => anyhow::bail!("BENCH_WORKLOAD={other}: want deployment or job"),
    };
    anyhow::ensure!(
        tandem_bin().exists(),
        "{} missing: run `cargo build --release -p tandem-cli` first",
        tandem_bin().display()
    );
    let cores = std::thread::available_parallelism()?.get();
    anyhow::ensure!(
        !pinned || cores >= 2,
        "BENCH_PLACEMENT=pinned needs 2 cores; use BENCH_PLACEMENT=shared"
    );
    println!(
        "tandem offloading burst benchmark ({cores} cores, provider {nodes} nodes, {})",
        if pinned {
            "pinned: provider cluster + controller on core 0, consumer cluster + controller on core 1"
        } else {
            "shared: both clusters and controllers on every core"
        }
    );

    let dir = tempfile::tempdir()?;
    let provider = site(
        dir.path(),
        lab_config("provider", nodes, "us-east"),
        pinned.then_some(0),
    )
    .await?;
    let consumer = site(
        dir.path(),
        lab_config("consumer", if job_mode { 2 } else { 3 }, "eu-west"),
        pinned.then_some(1),
    )
    .await?;
    let (pk, ck) = (&provider.kubeconfig, &consumer.kubeconfig);
    tandem(&[
        "install",
        "--kubeconfig",
        pk,
        "--cluster-id",
        "provider",
        "--pod-cidr",
        "10.244.0.0/16",
        "--share-percent",
        "100",
    ])?;
    tandem(&[
        "install",
        "--kubeconfig",
        ck,
        "--cluster-id",
        "consumer",
        "--pod-cidr",
        "10.244.0.0/16",
    ])?;
    let spawn = |kc: &str, core: usize| -> anyhow::Result<Controller> {
        let mut cmd = if pinned {
            let mut c = Command::new("taskset");
            c.arg("-c").arg(core.to_string()).arg(tandem_bin());
            c
        } else {
            Command::new(tandem_bin())
        };
        Ok(Controller(
            cmd.args(["controller", "--kubeconfig", kc])
                .stderr(Stdio::null())
                .spawn()?,
        ))
    };
    let provider_ctl = spawn(pk, 0)?;
    let consumer_ctl = spawn(ck, 1)?;
    let invite = tandem(&["invite", "--kubeconfig", pk])?;
    tandem(&["peer", &invite, "--kubeconfig", ck])?;
    for (client, ns) in [(&consumer.client, "bench"), (&provider.client, "vanilla")] {
        let nss: Api<Namespace> = Api::all(client.clone());
        nss.create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": ns}}))?,
        )
        .await?;
    }
    tandem(&[
        "offload",
        "namespace",
        "bench",
        "--pod-offloading-strategy",
        if job_mode { "LocalAndRemote" } else { "Remote" },
        "--kubeconfig",
        ck,
    ])?;
    if job_mode {
        return job_bursting(&consumer.client).await;
    }
    let twin = "bench-consumer";
    let with_stages = std::env::var("BENCH_STAGES").is_ok_and(|v| v == "1");
    let idle_rss = consumer_ctl.rss_bytes();
    let pids = [
        provider.pid,
        consumer.pid,
        provider_ctl.0.id(),
        consumer_ctl.0.id(),
    ];
    let pids: &[u32] = if pinned { &pids } else { &pids[1..] };

    println!(
        "\nCPU seconds per run: {}\n",
        if pinned {
            "provider lab / consumer lab / provider controller / consumer controller"
        } else {
            "both labs / provider controller / consumer controller"
        }
    );
    println!(
        "| pods | vanilla (s) | offloaded (s) | ratio | consumer controller RSS (MiB) | CPU s, vanilla | CPU s, offloaded |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let mut ratios: std::collections::BTreeMap<usize, Vec<f64>> = Default::default();
    for n in sizes.iter().flat_map(|&n| std::iter::repeat_n(n, repeat)) {
        settle(pids).await;
        let c0 = cpu(pids);
        let watch = |places: Vec<Place>| with_stages.then_some(places);
        let (vanilla, vanilla_stages) = burst(
            &provider.client,
            "vanilla",
            &format!("v{n}"),
            n,
            watch(vec![pods_of("pods", &provider.client, "vanilla")]),
        )
        .await?;
        let c1 = cpu(pids);
        teardown(&provider.client, "vanilla", &format!("v{n}"), &[]).await?;
        settle(pids).await;
        let c2 = cpu(pids);
        let (offloaded, offloaded_stages) = burst(
            &consumer.client,
            "bench",
            &format!("o{n}"),
            n,
            watch(vec![
                pods_of("consumer pods", &consumer.client, "bench"),
                Place {
                    label: "shadow pods",
                    client: provider.client.clone(),
                    namespace: twin.into(),
                    what: Watched::ShadowPods,
                },
                pods_of("real pods", &provider.client, twin),
            ]),
        )
        .await?;
        let c3 = cpu(pids);
        let rss = consumer_ctl.rss_bytes();
        teardown(
            &consumer.client,
            "bench",
            &format!("o{n}"),
            &[(&provider.client, twin)],
        )
        .await?;
        let runs = ratios.entry(n).or_default();
        runs.push(offloaded.as_secs_f64() / vanilla.as_secs_f64());
        println!(
            "| {n} | {:.2} | {:.2} | {:.2} | {:.1} | {} | {} |",
            vanilla.as_secs_f64(),
            offloaded.as_secs_f64(),
            offloaded.as_secs_f64() / vanilla.as_secs_f64(),
            rss as f64 / (1024.0 * 1024.0),
            cpu_delta(&c0, &c1),
            cpu_delta(&c2, &c3),
        );
        for (which, stages) in [("vanilla", vanilla_stages), ("offloaded", offloaded_stages)] {
            if let Some(stages) = stages {
                println!("  {which} {}", stages.trim_start_matches(' '));
            }
        }
        if n >= 1000 {
            println!(
                "  consumer controller: {:.1} MiB idle, {:.2} MiB per 1,000 offloaded pods",
                idle_rss as f64 / (1024.0 * 1024.0),
                (rss.saturating_sub(idle_rss)) as f64 / (1024.0 * 1024.0) / (n as f64 / 1000.0)
            );
        }
        if repeat > 1 && runs.len() == repeat {
            let mut sorted = runs.clone();
            sorted.sort_by(f64::total_cmp);
            println!(
                "  {n} pods: median ratio {:.2} over {repeat} runs (min {:.2}, max {:.2})",
                sorted[repeat / 2],
                sorted[0],
                sorted[repeat - 1]
            );
        }
    }
    Ok(())
}

/// A Job of `completions` hollow pods (each runs a second, then exits 0), `parallelism` at a
/// time, each requesting 400m of CPU.
fn job(name: &str, completions: i32, parallelism: i32) -> anyhow::Result<Job> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "completions": completions,
            "parallelism": parallelism,
            "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "work", "image": "busybox",
                    "resources": {"requests": {"cpu": "400m", "memory": "64Mi"}}}],
            }},
        },
    }))?)
}

/// Creates the Job and returns the time until it is Complete with every completion counted.
async fn run_job(client: &kube::Client, ns: &str, completions: i32) -> anyhow::Result<Duration> {
    let api: Api<Job> = Api::namespaced(client.clone(), ns);
    let started = Instant::now();
    api.create(&PostParams::default(), &job("render", completions, 100)?)
        .await?;
    until(&format!("{ns}/render Complete"), async || {
        let s = api.get("render").await?.status.unwrap_or_default();
        Ok(s.succeeded == Some(completions)
            && s.conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Complete" && c.status == "True"))
    })
    .await?;
    Ok(started.elapsed())
}

/// The batch-bursting comparison (BENCH_WORKLOAD=job): the same Job local only, then bursting.
async fn job_bursting(consumer: &kube::Client) -> anyhow::Result<()> {
    let nss: Api<Namespace> = Api::all(consumer.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(serde_json::json!({"metadata": {"name": "local"}}))?,
    )
    .await?;
    let completions = std::env::var("BENCH_COMPLETIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    println!(
        "\n| Job ({completions} completions, parallelism 100, 40 fit locally) | time to Complete (s) |"
    );
    println!("|---|---:|");
    let local = run_job(consumer, "local", completions).await?;
    println!("| local only | {:.2} |", local.as_secs_f64());
    let bursting = run_job(consumer, "bench", completions).await?;
    println!(
        "| bursting (`LocalAndRemote`) | {:.2} |",
        bursting.as_secs_f64()
    );
    println!(
        "  bursting / local only: {:.2}",
        bursting.as_secs_f64() / local.as_secs_f64()
    );
    Ok(())
}
