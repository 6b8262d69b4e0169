//! Losing a provider: how long until the consumer notices, and until a Deployment's replicas
//! that ran there are Ready elsewhere.
//!
//! Two lab clusters in this process (hollow nodes): milan provides, rome consumes through a TCP
//! gate in front of milan's API server (closing the gate is the partition). Their controllers
//! are `tandem controller` processes with the default timings; peering goes through the real
//! CLI. Measured, each from the moment the gate closes:
//! - the virtual node's NotReady detection (several partitions, healed in between);
//! - a 30-replica Deployment placed on the virtual node, until 30 replicas are Ready on rome's
//!   own nodes, with Kubernetes' default eviction (300 s) and with `--evict-after 10s`;
//! - the same with `--partition-policy Fence --fence-after 10s` (eviction left at 300 s: the
//!   fence alone moves them), plus a 1-replica StatefulSet, until db-0 is Ready on rome too —
//!   which no eviction achieves without fencing (the evicted db-0 waits for its provider).
//!
//! Run: `cargo build --release -p tandem-cli && cargo bench -p tandem-benches --bench failover`.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tandem_lab::TcpGate;

use crate::{sites, tandem};

const VIRTUAL_NODE: &str = "tandem-milan";
const REPLICAS: usize = 30;
/// Partitions for the detection time.
const DETECTIONS: usize = 5;

pub fn main() -> anyhow::Result<()> {
    tokio::runtime::Runtime::new()?.block_on(run())
}

/// The status of the virtual node's Ready condition.
async fn node_ready(client: &kube::Client) -> Option<String> {
    let node = Api::<Node>::all(client.clone())
        .get(VIRTUAL_NODE)
        .await
        .ok()?;
    node.status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status)
}

/// Polls every 20 ms until `check` holds; the time since `t0`.
async fn until<F, Fut>(what: &str, limit: Duration, t0: Instant, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    loop {
        if check().await {
            return t0.elapsed();
        }
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn pod_ready(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn on_virtual_node(p: &Pod) -> bool {
    p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(VIRTUAL_NODE)
}

/// Sets `spec.unschedulable` on every node of `client` that is not a virtual node.
async fn cordon_local(client: &kube::Client, on: bool) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    for n in nodes
        .list(&ListParams::default().labels(&format!("!{}", tandem_api::names::NODE_TYPE_LABEL)))
        .await?
        .items
    {
        nodes
            .patch(
                n.metadata.name.as_deref().unwrap_or_default(),
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"unschedulable": on}})),
            )
            .await?;
    }
    Ok(())
}

/// A Deployment of `REPLICAS` (and with `stateful`, a 1-replica StatefulSet) placed on the
/// virtual node, then the partition: the time until they are all Ready on rome's own nodes.
/// `flags` go to `tandem offload namespace`.
async fn failover(
    rome: &kube::Client,
    gate: &TcpGate,
    ns: &str,
    kubeconfig: &str,
    flags: &[&str],
    stateful: bool,
) -> anyhow::Result<Duration> {
    Api::<Namespace>::all(rome.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
        )
        .await?;
    let mut offload = vec![
        "offload",
        "namespace",
        ns,
        "--pod-offloading-strategy",
        "LocalAndRemote",
        "--kubeconfig",
        kubeconfig,
    ];
    offload.extend(flags);
    tandem(&offload)?;
    cordon_local(rome, true).await?;
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"replicas": REPLICAS, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "main", "image": "nginx"}]}}},
    }))?;
    Api::<Deployment>::namespaced(rome.clone(), ns)
        .create(&PostParams::default(), &deployment)
        .await?;
    if stateful {
        let db: StatefulSet = serde_json::from_value(json!({
            "metadata": {"name": "db"},
            "spec": {"replicas": 1, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                "template": {"metadata": {"labels": {"app": "db"}},
                    "spec": {"containers": [{"name": "main", "image": "postgres"}]}}},
        }))?;
        Api::<StatefulSet>::namespaced(rome.clone(), ns)
            .create(&PostParams::default(), &db)
            .await?;
    }
    let pods: Api<Pod> = Api::namespaced(rome.clone(), ns);
    let db_ready = |on_milan: bool| {
        let pods = pods.clone();
        async move {
            !stateful
                || pods
                    .get_opt("db-0")
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|p| pod_ready(&p) && on_virtual_node(&p) == on_milan)
        }
    };
    let list = || async {
        pods.list(&ListParams::default().labels("app=web"))
            .await
            .map(|l| l.items)
            .unwrap_or_default()
    };
    until(
        "the replicas Ready on milan",
        Duration::from_secs(120),
        Instant::now(),
        || async {
            let p = list().await;
            p.iter()
                .filter(|p| pod_ready(p) && on_virtual_node(p))
                .count()
                == REPLICAS
                && db_ready(true).await
        },
    )
    .await;
    cordon_local(rome, false).await?;

    gate.close();
    let t0 = Instant::now();
    let took = until(
        "the replicas Ready on rome's nodes",
        Duration::from_secs(600),
        t0,
        || async {
            let p = list().await;
            p.iter()
                .filter(|p| pod_ready(p) && !on_virtual_node(p))
                .count()
                == REPLICAS
                && db_ready(false).await
        },
    )
    .await;
    gate.open();
    // Back to a healthy, empty cluster for the next measure.
    until(
        "the virtual node Ready again",
        Duration::from_secs(60),
        Instant::now(),
        || async { node_ready(rome).await.as_deref() == Some("True") },
    )
    .await;
    tandem(&["unoffload", "namespace", ns, "--kubeconfig", kubeconfig])?;
    Api::<Namespace>::all(rome.clone())
        .delete(ns, &DeleteParams::default())
        .await?;
    Ok(took)
}

async fn run() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    // The controllers run with their default timings (what is measured).
    let sites = sites(
        dir.path(),
        &[("milan", "eu-south", 1), ("rome", "eu-central", 2)],
    )
    .await?;
    let (milan, mk) = (&sites[0].cluster, sites[0].kubeconfig.clone());
    let (rome, rk) = (&sites[1].cluster, sites[1].kubeconfig.clone());
    // rome reaches milan through the gate.
    let gate = TcpGate::start(milan.server.url().trim_start_matches("https://").parse()?).await?;
    let invite = tandem(&["invite", "--kubeconfig", &mk, "--endpoint", &gate.url()])?;
    tandem(&["peer", &invite, "--kubeconfig", &rk])?;
    Api::<tandem_api::Tenant>::namespaced(
        milan.client.clone(),
        &tandem_api::names::tenant_namespace("rome"),
    )
    .patch(
        "rome",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"grant": {"cpu": "64", "memory": "256Gi", "pods": "200"}}})),
    )
    .await?;
    until(
        "the virtual node Ready",
        Duration::from_secs(60),
        Instant::now(),
        || async { node_ready(&rome.client).await.as_deref() == Some("True") },
    )
    .await;

    let mut detections = Vec::new();
    for i in 0..DETECTIONS {
        gate.close();
        let t0 = Instant::now();
        detections.push(
            until("NotReady", Duration::from_secs(60), t0, || async {
                node_ready(&rome.client).await.as_deref() == Some("False")
            })
            .await,
        );
        gate.open();
        until(
            "Ready again",
            Duration::from_secs(60),
            Instant::now(),
            || async { node_ready(&rome.client).await.as_deref() == Some("True") },
        )
        .await;
        // Partitions start at different points of the probe period (2 s).
        tokio::time::sleep(Duration::from_millis(400 * i as u64 + 100)).await;
    }
    detections.sort();
    let s = |d: Duration| d.as_secs_f64();
    println!(
        "\nvirtual node NotReady after the provider is lost (probe every 2 s, NotReady after 6 s; {DETECTIONS} partitions): median {:.1} s, max {:.1} s",
        s(detections[DETECTIONS / 2]),
        s(detections[DETECTIONS - 1]),
    );

    let fenced = failover(
        &rome.client,
        &gate,
        "fenced",
        &rk,
        &["--partition-policy", "Fence", "--fence-after", "10s"],
        true,
    )
    .await?;
    eprintln!(
        "--partition-policy Fence --fence-after 10s: {:.1} s",
        s(fenced)
    );
    let fast = failover(
        &rome.client,
        &gate,
        "fast",
        &rk,
        &["--evict-after", "10s"],
        false,
    )
    .await?;
    eprintln!("--evict-after 10s: {:.1} s", s(fast));
    let default = failover(&rome.client, &gate, "slow", &rk, &[], false).await?;
    println!("\n| {REPLICAS}-replica Deployment, provider lost → all Ready on rome | s |");
    println!("|---|---:|");
    println!(
        "| `--partition-policy Fence --fence-after 10s` (and a 1-replica StatefulSet's db-0) | {:.1} |",
        s(fenced)
    );
    println!("| `--evict-after 10s` | {:.1} |", s(fast));
    println!(
        "| Kubernetes' default eviction (300 s) | {:.1} |",
        s(default)
    );
    Ok(())
}
