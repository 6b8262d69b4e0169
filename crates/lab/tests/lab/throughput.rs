//! Scheduling throughput on 100 hollow nodes (ignored by default: run with
//! `cargo test --release -p tandem-lab --test lab -- --ignored throughput --nocapture`;
//! `LAB_PODS` sets the number of pods, 10,000 by default).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::watcher::{self, Event};
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
        async move {
            (nodes.list(&ListParams::default()).await.ok()?.items.len() == 100).then_some(())
        }
    })
    .await;
    let api = Api::<Pod>::namespaced(lab.client.clone(), "default");
    // Bindings are counted from a watch: listing thousands of pods repeatedly would load the
    // API server more than the scheduler does.
    let counter = {
        let api = api.clone();
        tokio::spawn(async move {
            let stream = watcher::watcher(api, watcher::Config::default().labels("app=load"));
            futures::pin_mut!(stream);
            let mut bound = HashSet::new();
            while bound.len() < count {
                match stream.next().await {
                    Some(Ok(Event::Apply(p) | Event::InitApply(p)))
                        if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some() =>
                    {
                        bound.insert(p.metadata.name.unwrap_or_default());
                    }
                    Some(_) => {}
                    None => break,
                }
            }
            Instant::now()
        })
    };
    // Pods are created as fast as the API server takes them (64 at a time) while the
    // scheduler binds them; the rate is pods over the time until the last one is bound.
    let started = Instant::now();
    futures::stream::iter(0..count)
        .for_each_concurrent(64, |i| {
            let api = api.clone();
            async move {
                let p = pod(
                    &format!("load-{i}"),
                    json!({"metadata": {"labels": {"app": "load"}}}),
                );
                api.create(&PostParams::default(), &p)
                    .await
                    .expect("pod created");
            }
        })
        .await;
    let created = started.elapsed();
    let done = tokio::time::timeout(Duration::from_secs(600), counter)
        .await
        .expect("all pods bound within 10 minutes")
        .expect("counter task");
    let elapsed = done - started;
    println!(
        "created {count} pods in {created:?}; all bound after {elapsed:?}: {:.0} pods/s",
        count as f64 / elapsed.as_secs_f64()
    );
    lab.shutdown();
}
