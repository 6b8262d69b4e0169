//! A bare ReplicaSet: adoption of matching orphans, replacement of deleted pods, and the
//! availability it reports under minReadySeconds.

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

use super::common::{Cluster, eventually, next_ip, set_pod_status};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicaset_adopts_orphans_replaces_deleted_pods_and_waits_min_ready_seconds() {
    let cluster = Cluster::start().await;
    let client = &cluster.client;
    cluster.namespace("rs").await;
    let pods = Api::<Pod>::namespaced(client.clone(), "rs");
    for name in ["orphan-1", "orphan-2"] {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"app": "queue"}},
            "spec": {"containers": [{"name": "main", "image": "worker:1"}]},
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    let rs: ReplicaSet = serde_json::from_value(json!({
        "metadata": {"name": "queue"},
        "spec": {
            "replicas": 3,
            "minReadySeconds": 3,
            "selector": {"matchLabels": {"app": "queue"}},
            "template": {
                "metadata": {"labels": {"app": "queue", "tier": "backend"}},
                "spec": {"containers": [{"name": "main", "image": "worker:1"}]},
            },
        },
    }))
    .unwrap();
    let rs = Api::<ReplicaSet>::namespaced(client.clone(), "rs")
        .create(&PostParams::default(), &rs)
        .await
        .unwrap();
    let owned_by_rs = |p: &Pod| {
        p.owner_references()
            .iter()
            .any(|o| o.controller == Some(true) && Some(&o.uid) == rs.metadata.uid.as_ref())
    };
    let listed = eventually("two orphans adopted and one pod created", || async {
        let list = pods.list(&ListParams::default()).await.unwrap().items;
        (list.len() == 3 && list.iter().all(owned_by_rs)).then_some(list)
    })
    .await;
    let created: Vec<_> = listed
        .iter()
        .filter(|p| !p.name_any().starts_with("orphan-"))
        .collect();
    assert_eq!(created.len(), 1);
    assert!(
        created[0].name_any().starts_with("queue-"),
        "{}",
        created[0].name_any()
    );

    pods.delete("orphan-1", &DeleteParams::default())
        .await
        .unwrap();
    let listed = eventually("deleted pod replaced", || async {
        let list = pods.list(&ListParams::default()).await.unwrap().items;
        (list.len() == 3 && list.iter().all(|p| p.name_any() != "orphan-1")).then_some(list)
    })
    .await;

    for pod in &listed {
        set_pod_status(client, "rs", &pod.name_any(), &next_ip(), true).await;
    }
    let rs_api = Api::<ReplicaSet>::namespaced(client.clone(), "rs");
    // Ready at once, available only after minReadySeconds (with no further pod event).
    let status = eventually("3 ready", || async {
        let s = rs_api.get("queue").await.unwrap().status?;
        (s.ready_replicas == Some(3)).then_some(s)
    })
    .await;
    assert_eq!(status.replicas, 3);
    assert!(
        status.available_replicas.unwrap_or(0) < 3,
        "available before minReadySeconds: {status:?}"
    );
    assert_eq!(
        status.fully_labeled_replicas,
        Some(2),
        "the orphan lacks the template's tier label"
    );
    eventually("3 available after minReadySeconds", || async {
        let s = rs_api.get("queue").await.unwrap().status?;
        (s.available_replicas == Some(3) && s.observed_generation == Some(1)).then_some(())
    })
    .await;
}
