//! Network-mode lab benchmark (root): how long a 3-node network-mode cluster takes to start
//! (namespaces, kubelet endpoints, kube-proxy, DNS), and how long 100 echo pods take from
//! their Deployment's creation until every one is Ready and answers through its Service.
//! Run: `cargo bench -p tandem-benches --bench network` (BENCH_PODS, BENCH_NODES to resize).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, PostParams};
use tandem_lab::{LabCluster, LabConfig};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
pub async fn main() -> anyhow::Result<()> {
    anyhow::ensure!(
        nix_is_root(),
        "the network-mode benchmark needs root (it creates network namespaces)"
    );
    let pods = env("BENCH_PODS", 100);
    let nodes = env("BENCH_NODES", 3);
    println!(
        "tandem-lab network-mode benchmark ({} cores)",
        std::thread::available_parallelism()?.get()
    );
    let started = Instant::now();
    let cluster = LabCluster::start(LabConfig {
        name: "bench".into(),
        nodes,
        network: true,
        ..Default::default()
    })
    .await?;
    // Started: every node Ready and cluster DNS answering from a pod's namespace.
    let nodes_api = Api::<k8s_openapi::api::core::v1::Node>::all(cluster.client.clone());
    loop {
        let ready = nodes_api
            .list(&Default::default())
            .await?
            .items
            .iter()
            .filter(|n| {
                n.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .count();
        if ready == nodes {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(120),
            "nodes not Ready"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let start_time = started.elapsed();
    println!(
        "start: {nodes}-node network-mode cluster (namespaces, API server, every node Ready) in {start_time:.2?}"
    );

    let ns = "default";
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "echo"},
        "spec": {"replicas": pods, "selector": {"matchLabels": {"app": "echo"}},
                 "template": {"metadata": {"labels": {"app": "echo"}},
                              "spec": {"containers": [{"name": "echo", "image": "tandem.dev/echo"}]}}}
    }))?;
    let service: Service = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "echo"},
        "spec": {"selector": {"app": "echo"}, "ports": [{"port": 80, "targetPort": 8080}]}
    }))?;
    let probe: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
        "spec": {"containers": [{"name": "probe", "image": "tandem.dev/probe"}]}
    }))?;
    Api::<Service>::namespaced(cluster.client.clone(), ns)
        .create(&PostParams::default(), &service)
        .await?;
    Api::<Pod>::namespaced(cluster.client.clone(), ns)
        .create(&PostParams::default(), &probe)
        .await?;
    let network = cluster.network.clone().expect("network mode");
    let deployments = Api::<Deployment>::namespaced(cluster.client.clone(), ns);
    let t0 = Instant::now();
    deployments
        .create(&PostParams::default(), &deployment)
        .await?;
    let deadline = t0 + Duration::from_secs(600);
    loop {
        let ready = deployments
            .get("echo")
            .await?
            .status
            .and_then(|s| s.ready_replicas)
            .unwrap_or(0);
        if ready as usize == pods {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{ready}/{pods} ready after 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ready_time = t0.elapsed();
    // Every pod answering from the probe's namespace by its IP, then the Service answering.
    let ips: Vec<String> = Api::<Pod>::namespaced(cluster.client.clone(), ns)
        .list(&kube::api::ListParams::default().labels("app=echo"))
        .await?
        .items
        .into_iter()
        .filter_map(|p| p.status?.pod_ip)
        .collect();
    anyhow::ensure!(ips.len() == pods, "{} pod IPs for {pods} pods", ips.len());
    let mut answered = BTreeSet::new();
    let mut failures = Vec::new();
    while answered.len() < pods {
        anyhow::ensure!(
            Instant::now() < deadline,
            "{}/{pods} answered",
            answered.len()
        );
        for ip in &ips {
            if answered.contains(ip) {
                continue;
            }
            let tried = Instant::now();
            match network
                .probe_fetch(ns, "probe", &format!("http://{ip}:8080/"))
                .await
            {
                Ok(_) => {
                    answered.insert(ip.clone());
                }
                Err(e) => failures.push(format!(
                    "{:.2?} after the Deployment, {:.2?} lost: {}",
                    tried - t0,
                    tried.elapsed(),
                    e.message()
                )),
            }
        }
    }
    let answering_time = t0.elapsed();
    if !failures.is_empty() {
        println!("{} fetches by IP failed first, e.g.:", failures.len());
        for f in failures.iter().take(5) {
            println!("  {f}");
        }
    }
    while network
        .probe_fetch(ns, "probe", "http://echo/")
        .await
        .is_err()
    {
        anyhow::ensure!(Instant::now() < deadline, "the Service never answered");
    }
    let service_time = t0.elapsed();
    println!(
        "echo: {pods} pods on {nodes} nodes all Ready after {ready_time:.2?}, every one answering by IP after {answering_time:.2?}, the Service (by name) after {service_time:.2?}"
    );
    let shutdown = Instant::now();
    cluster.shutdown();
    println!("shutdown: namespaces removed in {:.2?}", shutdown.elapsed());
    Ok(())
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|e| e == "0"))
        })
        .unwrap_or(false)
}
