//! Cloud bursting with a batch Job: a Job bigger than the consumer's own nodes overflows onto
//! the virtual node, its pods run to completion in the provider, and every completion is
//! counted once in the consumer's Job.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use support::{Cluster, offload, peer_with, until};
use tandem_api::names;

/// A Job of `completions` pods, `parallelism` at a time, each requesting `cpu`; its hollow
/// pods run for a second and exit 0 (the lab's default for Job pods).
fn job(name: &str, completions: i32, parallelism: i32, cpu: &str) -> Job {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "completions": completions,
            "parallelism": parallelism,
            "backoffLimit": 6,
            "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "work", "image": "busybox",
                    "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}],
            }},
        },
    }))
    .expect("job")
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

#[tokio::test]
async fn a_job_bigger_than_the_consumer_bursts_and_counts_every_completion_once() {
    // Two local nodes of 8 CPUs: 400m pods fit 40 at a time locally.
    let consumer = Cluster::start("rome", "eu-south", 2).await;
    let provider = Cluster::start("milan", "eu-north", 4).await;
    let grant = json!({"cpu": "24", "memory": "64Gi", "pods": "500"});
    peer_with(&consumer, &provider, grant, None).await;
    let vn = names::virtual_node_name("milan");
    let twin = offload(&consumer, &provider, "batch", "LocalAndRemote").await;

    let jobs: Api<Job> = Api::namespaced(consumer.client.clone(), "batch");
    jobs.create(&PostParams::default(), &job("render", 300, 100, "400m"))
        .await
        .expect("job created");
    let status = until(
        "the Job to report 300 succeeded and Complete",
        Duration::from_secs(600),
        || async {
            let s = jobs.get("render").await.ok()?.status?;
            let complete = s
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Complete" && c.status == "True");
            (complete && s.succeeded == Some(300)).then_some(s)
        },
    )
    .await;
    assert_eq!(status.failed.unwrap_or(0), 0, "no pod failed: {status:?}");

    // The Job keeps its finished pods: exactly 300 Succeeded, some on each side.
    let pods = Api::<Pod>::namespaced(consumer.client.clone(), "batch")
        .list(&ListParams::default().labels("batch.kubernetes.io/job-name=render"))
        .await
        .expect("pods listed")
        .items;
    let succeeded: Vec<&Pod> = pods.iter().filter(|p| phase(p) == "Succeeded").collect();
    assert_eq!(succeeded.len(), 300, "one Succeeded pod per completion");
    let node = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.clone());
    let remote = succeeded
        .iter()
        .filter(|p| node(p).as_deref() == Some(vn.as_str()))
        .count();
    let local = succeeded
        .iter()
        .filter(|p| node(p).is_some_and(|n| consumer.lab.node_names().contains(&n)))
        .count();
    assert!(
        remote > 0 && local > 0,
        "pods ran in both clusters: {local} local, {remote} on {vn}"
    );
    assert_eq!(local + remote, 300);

    // In the provider they ran as real pods of the twin namespace and finished there.
    let provider_done = Api::<Pod>::namespaced(provider.client.clone(), &twin)
        .list(&ListParams::default().labels("batch.kubernetes.io/job-name=render"))
        .await
        .expect("provider pods listed")
        .items
        .into_iter()
        .filter(|p| phase(p) == "Succeeded")
        .count();
    assert!(
        provider_done > 0 && provider_done <= remote,
        "{provider_done} pods Succeeded in the provider for {remote} offloaded"
    );
}
