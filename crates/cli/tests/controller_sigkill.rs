//! The consumer's `tandem controller` *process* killed with SIGKILL in the middle of a 500-pod
//! burst and started again: exactly one shadow pod per consumer pod, no orphans, every pod
//! Ready.

use crate::support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use support::{Cluster, offload_remote, offloaded_deployment, peer_with, until};
use tandem_api::ShadowPod;
use tandem_core::shadow::ORIGIN_UID_ANNOTATION;

const REPLICAS: usize = 500;

/// A `tandem controller` process; killed with SIGKILL when dropped.
struct ControllerProcess(Child);

impl ControllerProcess {
    fn spawn(kubeconfig: &Path) -> ControllerProcess {
        ControllerProcess(
            Command::new(env!("CARGO_BIN_EXE_tandem"))
                .args(["controller", "--heartbeat-seconds", "1", "--kubeconfig"])
                .arg(kubeconfig)
                .env("RUST_LOG", "warn")
                .stdout(Stdio::null())
                .spawn()
                .expect("tandem controller starts"),
        )
    }

    /// SIGKILL (std's `Child::kill` on Unix), then reap.
    fn sigkill(mut self) {
        self.0.kill().expect("SIGKILL");
        self.0.wait().expect("reaped");
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The URL the pod-placement webhook currently points at.
async fn webhook_url(client: &kube::Client) -> Option<String> {
    let hooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let hook = hooks.get_opt("tandem-pod-placement").await.ok()??;
    hook.webhooks?.first()?.client_config.url.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_mid_burst_no_duplicate_or_orphan_shadow_pods() {
    let mut consumer = Cluster::start("oslo", "eu-north", 1).await;
    let provider = Cluster::start("bergen", "eu-north", 6).await;
    peer_with(
        &consumer,
        &provider,
        json!({"cpu": "32", "memory": "128Gi", "pods": "600"}),
        None,
    )
    .await;
    let twin = offload_remote(&consumer, &provider, "burst").await;

    // From here on the consumer's controller is a process of its own.
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("oslo.kubeconfig");
    consumer
        .lab
        .server
        .write_admin_kubeconfig(&kubeconfig)
        .unwrap();
    let in_process_url = webhook_url(&consumer.client).await;
    consumer.kill_controller();
    let first = ControllerProcess::spawn(&kubeconfig);
    until(
        "the controller process serving the webhook",
        Duration::from_secs(60),
        || async {
            let url = webhook_url(&consumer.client).await?;
            (Some(&url) != in_process_url.as_ref()).then_some(())
        },
    )
    .await;

    let shadows: Api<ShadowPod> = Api::namespaced(provider.client.clone(), &twin);
    let consumer_pods: Api<Pod> = Api::namespaced(consumer.client.clone(), "burst");
    Api::<Deployment>::namespaced(consumer.client.clone(), "burst")
        .create(
            &PostParams::default(),
            &serde_json::from_value(offloaded_deployment("web", REPLICAS as i32)).unwrap(),
        )
        .await
        .unwrap();
    until("the burst under way", Duration::from_secs(120), || async {
        let n = shadows.list(&ListParams::default()).await.ok()?.items.len();
        (n >= 50).then_some(())
    })
    .await;
    let before = shadows
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .len();
    first.sigkill();
    let _second = ControllerProcess::spawn(&kubeconfig);
    assert!(
        before < REPLICAS,
        "the kill came mid-burst ({before} shadow pods of {REPLICAS})"
    );

    until(
        &format!("{REPLICAS} Ready consumer pods"),
        // Two debug-build lab clusters on a shared 2-core machine (within the 10 minutes
        // nextest allows this test, .config/nextest.toml).
        Duration::from_secs(540),
        || async {
            let p = consumer_pods.list(&ListParams::default()).await.ok()?.items;
            (p.len() == REPLICAS && p.iter().all(ready)).then_some(())
        },
    )
    .await;
    let pods = consumer_pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let by_uid: BTreeMap<String, String> = pods
        .iter()
        .map(|p| {
            (
                p.metadata.uid.clone().unwrap(),
                p.metadata.name.clone().unwrap(),
            )
        })
        .collect();
    let list = shadows.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(list.len(), REPLICAS, "one shadow pod per consumer pod");
    for s in &list {
        let origin = s
            .spec
            .annotations
            .get(ORIGIN_UID_ANNOTATION)
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            by_uid.get(&origin),
            s.metadata.name.as_ref(),
            "shadow pod {:?} matches its consumer pod",
            s.metadata.name
        );
    }
    let real = Api::<Pod>::namespaced(provider.client.clone(), &twin)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert_eq!(real.len(), REPLICAS, "one real pod per shadow pod");
}
