//! The consumer's controller killed (as SIGKILL would) in the middle of a 500-pod burst and
//! restarted: exactly one shadow pod per consumer pod, no orphans, every pod Ready.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use support::{Cluster, offload_remote, offloaded_deployment, peer_with, until};
use tandem_api::ShadowPod;
use tandem_core::shadow::ORIGIN_UID_ANNOTATION;

const REPLICAS: usize = 500;

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[tokio::test]
async fn killed_mid_burst_no_duplicate_or_orphan_shadow_pods() {
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
    let shadows: Api<ShadowPod> = Api::namespaced(provider.client.clone(), &twin);
    let consumer_pods: Api<Pod> = Api::namespaced(consumer.client.clone(), "burst");
    Api::<Deployment>::namespaced(consumer.client.clone(), "burst")
        .create(
            &PostParams::default(),
            &serde_json::from_value(offloaded_deployment("web", REPLICAS as i32)).unwrap(),
        )
        .await
        .unwrap();
    until("the burst under way", Duration::from_secs(40), || async {
        let n = shadows.list(&ListParams::default()).await.ok()?.items.len();
        (n >= 50).then_some(())
    })
    .await;
    consumer.kill_controller();
    tokio::time::sleep(Duration::from_secs(1)).await;
    consumer.restart_controller().await;

    until(
        &format!("{REPLICAS} Ready consumer pods"),
        // 500 pods through two debug-build lab clusters on a shared 2-core machine, with the
        // pods the placement webhook refused while the controller was down retried (within
        // the 600 s nextest allows this test, .config/nextest.toml).
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
