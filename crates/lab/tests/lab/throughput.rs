//! Scheduling throughput on 100 hollow nodes (ignored by default: run with
//! `cargo test --release -p tandem-lab --test lab -- --ignored throughput --nocapture`;
//! `LAB_PODS` sets the number of pods, 10,000 by default).

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tandem_lab::{LabCluster, LabConfig};

use crate::support::{pod, until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: 100 nodes, thousands of pods"]
async fn throughput_binds_pods_on_100_nodes() {
    let count: usize = std::env::var("LAB_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let lab = LabCluster::start(LabConfig {
        nodes: 100,
        ..Default::default()
    })
    .await
    .expect("lab cluster starts");
    let nodes = Api::<Node>::all(lab.client.clone());
    until("100 nodes", Duration::from_secs(60), || {
        let nodes = nodes.clone();
        async move { (nodes.list(&ListParams::default()).await.ok()?.items.len() == 100).then_some(()) }
    })
    .await;
    // Hold scheduling with a taint while the pods are created, so the measurement covers
    // scheduling and binding only.
    let hold = json!({"spec": {"taints": [{"key": "hold", "effect": "NoSchedule"}]}});
    let release = json!({"spec": {"taints": null}});
    for name in lab.node_names() {
        nodes
            .patch(&name, &PatchParams::default(), &Patch::Merge(&hold))
            .await
            .expect("hold node");
    }
    let api = Api::<Pod>::namespaced(lab.client.clone(), "default");
    let creating = Instant::now();
    futures::stream::iter(0..count)
        .for_each_concurrent(64, |i| {
            let api = api.clone();
            async move {
                let mut p = pod(
                    &format!("load-{i}"),
                    json!({"metadata": {"labels": {"app": "load"}}}),
                );
                p.spec.as_mut().expect("spec").containers[0].resources = None;
                api.create(&PostParams::default(), &p)
                    .await
                    .expect("pod created");
            }
        })
        .await;
    println!("created {count} pods in {:?}", creating.elapsed());
    // Let the FailedScheduling reports of the held pods drain before measuring.
    let events =
        Api::<k8s_openapi::api::core::v1::Event>::namespaced(lab.client.clone(), "default");
    // Polled once a second: listing thousands of events is itself load.
    let deadline = Instant::now() + Duration::from_secs(600);
    while events
        .list(&ListParams::default())
        .await
        .map_or(0, |l| l.items.len())
        < count
    {
        assert!(
            Instant::now() < deadline,
            "FailedScheduling reports within 10 minutes"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    println!("reports done after {:?}", creating.elapsed());
    let started = Instant::now();
    for name in lab.node_names() {
        nodes
            .patch(&name, &PatchParams::default(), &Patch::Merge(&release))
            .await
            .expect("release node");
    }
    until("all pods bound", Duration::from_secs(600), || {
        let api = api.clone();
        async move {
            let list = api
                .list(&ListParams::default().labels("app=load"))
                .await
                .ok()?;
            let bound = list
                .items
                .iter()
                .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
                .count();
            (bound == count).then_some(())
        }
    })
    .await;
    let elapsed = started.elapsed();
    println!(
        "bound {count} pods on 100 nodes in {elapsed:?}: {:.0} pods/s",
        count as f64 / elapsed.as_secs_f64()
    );
    lab.shutdown();
}
