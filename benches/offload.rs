//! Liqo-style offloading burst: Deployments of 10, 100, 1,000 and 10,000 pods, time until all
//! are Ready — created directly on the provider (vanilla) vs created on a consumer in a namespace
//! offloaded to that provider — in one run, plus the consumer controller's memory per 1,000
//! offloaded pods.
//!
//! The lab clusters run in this process; the two Tandem controllers run as `tandem controller`
//! child processes (so their memory is measured alone), and peering goes through the real CLI
//! (`tandem install`, `invite`, `peer`, `offload`).
//! Run: `cargo build --release -p tandem-cli && cargo bench -p tandem-benches --bench offload`
//! (BENCH_SIZES=10,100 and BENCH_NODES to resize).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use tandem_lab::{LabCluster, LabConfig};

fn tandem_bin() -> PathBuf {
    std::env::var_os("TANDEM_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/tandem"))
}

/// Runs a tandem CLI command to completion; returns its stdout.
fn tandem(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(tandem_bin())
        .args(args)
        .stderr(Stdio::inherit())
        .output()?;
    anyhow::ensure!(out.status.success(), "tandem {} failed", args.join(" "));
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}

struct Controller(Child);

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Controller {
    fn rss_bytes(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.0.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
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

/// Creates the Deployment and returns the time until all its replicas are Ready.
async fn burst(client: &kube::Client, ns: &str, name: &str, n: usize) -> anyhow::Result<Duration> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let started = Instant::now();
    api.create(&PostParams::default(), &deployment(name, n)?)
        .await?;
    until(&format!("{ns}/{name} Ready"), async || {
        let d = api.get(name).await?;
        Ok(d.status.and_then(|s| s.ready_replicas).unwrap_or(0) as usize == n)
    })
    .await?;
    Ok(started.elapsed())
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

fn write_kubeconfig(dir: &Path, cluster: &LabCluster) -> anyhow::Result<String> {
    let path = dir.join(format!("{}.kubeconfig", cluster.config.name));
    std::fs::write(&path, cluster.server.admin_kubeconfig()?)?;
    Ok(path.display().to_string())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let sizes: Vec<usize> = std::env::var("BENCH_SIZES")
        .unwrap_or_else(|_| "10,100,1000,10000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let nodes: usize = std::env::var("BENCH_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    anyhow::ensure!(
        tandem_bin().exists(),
        "{} missing: run `cargo build --release -p tandem-cli` first",
        tandem_bin().display()
    );
    println!(
        "tandem offloading burst benchmark ({} cores, provider {nodes} nodes)",
        std::thread::available_parallelism()?.get()
    );

    let dir = tempfile::tempdir()?;
    let provider = LabCluster::start(LabConfig {
        name: "provider".into(),
        nodes,
        region: "us-east".into(),
        ..Default::default()
    })
    .await?;
    let consumer = LabCluster::start(LabConfig {
        name: "consumer".into(),
        nodes: 3,
        region: "eu-west".into(),
        ..Default::default()
    })
    .await?;
    let pk = write_kubeconfig(dir.path(), &provider)?;
    let ck = write_kubeconfig(dir.path(), &consumer)?;
    tandem(&[
        "install",
        "--kubeconfig",
        &pk,
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
        &ck,
        "--cluster-id",
        "consumer",
        "--pod-cidr",
        "10.244.0.0/16",
    ])?;
    let spawn = |kc: &str| -> anyhow::Result<Controller> {
        Ok(Controller(
            Command::new(tandem_bin())
                .args(["controller", "--kubeconfig", kc])
                .stderr(Stdio::null())
                .spawn()?,
        ))
    };
    let _provider_ctl = spawn(&pk)?;
    let consumer_ctl = spawn(&ck)?;
    let invite = tandem(&["invite", "--kubeconfig", &pk])?;
    tandem(&["peer", &invite, "--kubeconfig", &ck])?;
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
        "Remote",
        "--kubeconfig",
        &ck,
    ])?;
    let twin = "bench-consumer";
    let idle_rss = consumer_ctl.rss_bytes();

    println!("\n| pods | vanilla (s) | offloaded (s) | ratio | consumer controller RSS (MiB) |");
    println!("|---:|---:|---:|---:|---:|");
    for &n in &sizes {
        let vanilla = burst(&provider.client, "vanilla", &format!("v{n}"), n).await?;
        teardown(&provider.client, "vanilla", &format!("v{n}"), &[]).await?;
        let offloaded = burst(&consumer.client, "bench", &format!("o{n}"), n).await?;
        let rss = consumer_ctl.rss_bytes();
        teardown(
            &consumer.client,
            "bench",
            &format!("o{n}"),
            &[(&provider.client, twin)],
        )
        .await?;
        println!(
            "| {n} | {:.2} | {:.2} | {:.2} | {:.1} |",
            vanilla.as_secs_f64(),
            offloaded.as_secs_f64(),
            offloaded.as_secs_f64() / vanilla.as_secs_f64(),
            rss as f64 / (1024.0 * 1024.0)
        );
        if n >= 1000 {
            println!(
                "  consumer controller: {:.1} MiB idle, {:.2} MiB per 1,000 offloaded pods",
                idle_rss as f64 / (1024.0 * 1024.0),
                (rss.saturating_sub(idle_rss)) as f64 / (1024.0 * 1024.0) / (n as f64 / 1000.0)
            );
        }
    }
    Ok(())
}
