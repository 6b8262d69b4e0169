//! Lab cluster benchmark: scheduler throughput, a 10,000-pod Deployment on 100 hollow nodes,
//! and the memory of a lab cluster holding 10,000 pods.
//! Run: `cargo bench -p tandem-benches --bench lab` (BENCH_PODS, BENCH_NODES to resize).

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use tandem_lab::{LabCluster, LabConfig};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn config(nodes: usize) -> LabConfig {
    LabConfig {
        name: "bench".into(),
        nodes,
        ..Default::default()
    }
}

/// Polls `done` every 100 ms until it holds; returns how long that took from `since`.
async fn until(
    since: Instant,
    what: &str,
    mut done: impl AsyncFnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<Duration> {
    let deadline = since + Duration::from_secs(600);
    loop {
        if done().await? {
            return Ok(since.elapsed());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{what}: not done after 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
pub async fn main() -> anyhow::Result<()> {
    let pods = env("BENCH_PODS", 10_000);
    let nodes = env("BENCH_NODES", 100);
    let sched_pods = env("BENCH_SCHED_PODS", 5_000);
    println!(
        "tandem-lab benchmark ({} cores)",
        std::thread::available_parallelism()?.get()
    );
    let baseline = crate::rss_bytes();

    // 1. Scheduler throughput: bare pods created as fast as 8 clients can, until all bound.
    let cluster = LabCluster::start(config(nodes)).await?;
    let node_api: Api<k8s_openapi::api::core::v1::Node> = Api::all(cluster.client.clone());
    until(Instant::now(), "nodes registered", async || {
        Ok(node_api.list(&ListParams::default()).await?.items.len() == nodes)
    })
    .await?;
    let pod_api: Api<Pod> = Api::namespaced(cluster.client.clone(), "default");
    let started = Instant::now();
    let creators: Vec<_> = (0..8)
        .map(|c| {
            let api = pod_api.clone();
            tokio::spawn(async move {
                for i in 0..sched_pods / 8 {
                    let pod: Pod = serde_json::from_value(serde_json::json!({
                        "metadata": {"name": format!("p-{c}-{i}"), "labels": {"bench": "sched"}},
                        "spec": {"containers": [{"name": "c", "image": "pause"}]},
                    }))?;
                    api.create(&PostParams::default(), &pod).await?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for c in futures::future::join_all(creators).await {
        c??;
    }
    let created = started.elapsed();
    let total = sched_pods / 8 * 8;
    let bound = until(started, "all pods bound", async || {
        let list = pod_api
            .list(&ListParams::default().labels("bench=sched"))
            .await?;
        Ok(list
            .items
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
            .count()
            == total)
    })
    .await?;
    println!(
        "scheduler: {total} pods on {nodes} nodes: created in {:.2} s, all bound after {:.2} s = {:.0} pods/s",
        created.as_secs_f64(),
        bound.as_secs_f64(),
        total as f64 / bound.as_secs_f64()
    );
    cluster.shutdown();

    // 2. A Deployment of `pods` replicas until every pod is Running and Ready.
    let cluster = LabCluster::start(config(nodes)).await?;
    let node_api: Api<k8s_openapi::api::core::v1::Node> = Api::all(cluster.client.clone());
    until(Instant::now(), "nodes registered", async || {
        Ok(node_api.list(&ListParams::default()).await?.items.len() == nodes)
    })
    .await?;
    let deploy_api: Api<Deployment> = Api::namespaced(cluster.client.clone(), "default");
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "burst"},
        "spec": {"replicas": pods, "selector": {"matchLabels": {"app": "burst"}},
                 "template": {"metadata": {"labels": {"app": "burst"}},
                              "spec": {"containers": [{"name": "c", "image": "pause"}]}}},
    }))?;
    let started = Instant::now();
    deploy_api
        .create(&PostParams::default(), &deployment)
        .await?;
    let ready = until(started, "deployment ready", async || {
        let d = deploy_api.get("burst").await?;
        Ok(d.status.and_then(|s| s.ready_replicas).unwrap_or(0) as usize == pods)
    })
    .await?;
    println!(
        "deployment: {pods} replicas on {nodes} hollow nodes all Ready after {:.2} s",
        ready.as_secs_f64()
    );

    // 3. Memory of this process, which now holds one lab cluster with `pods` pods.
    let rss = crate::rss_bytes();
    println!(
        "memory: lab cluster with {nodes} nodes and {pods} pods: {:.0} MiB RSS ({:.0} MiB above the process baseline)",
        rss as f64 / (1 << 20) as f64,
        rss.saturating_sub(baseline) as f64 / (1 << 20) as f64
    );
    cluster.shutdown();
    Ok(())
}
