//! The scheduler's volume binding on a lab cluster: a pod waits for its claim, and a pod whose
//! claim is bound to a volume with node affinity goes where the volume is (data gravity).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node, PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

use super::support::{cluster, create, node_of, pod, running, until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_waits_for_its_claim_then_follows_its_volume_to_its_node() {
    let lab = cluster().await;
    let client = lab.client.clone();
    // The FailedScheduling message counts the nodes: wait until the scheduler has all three.
    let nodes = Api::<Node>::all(client.clone());
    let newest = until("3 nodes registered", Duration::from_secs(20), || {
        let nodes = nodes.clone();
        async move {
            let list = nodes.list(&ListParams::default()).await.ok()?.items;
            (list.len() == 3).then(|| {
                list.iter()
                    .filter_map(|n| n.metadata.resource_version.as_deref()?.parse::<u64>().ok())
                    .max()
                    .unwrap_or(0)
            })
        }
    })
    .await;
    lab.scheduler_sees_nodes_at(&newest.to_string()).await;
    let volume =
        json!({"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]});
    create(&client, &pod("app", json!({"spec": volume}))).await;
    let events = Api::<Event>::namespaced(client.clone(), "default");
    let message = until(
        "FailedScheduling for the missing claim",
        Duration::from_secs(20),
        || {
            let events = events.clone();
            async move {
                let list = events.list(&ListParams::default()).await.ok()?;
                list.items
                    .into_iter()
                    .find(|e| {
                        e.reason.as_deref() == Some("FailedScheduling")
                            && e.involved_object.name.as_deref() == Some("app")
                    })
                    .and_then(|e| e.message)
            }
        },
    )
    .await;
    assert_eq!(
        message,
        "0/3 nodes are available: persistentvolumeclaim \"data\" not found. preemption: 0/3 \
         nodes are available: 3 Preemption is not helpful for scheduling."
    );

    // A volume that only the third node reaches, and a claim for it (static binding: the
    // class names no StorageClass).
    let node = lab.node_names()[2].clone();
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "pinned"},
        "spec": {
            "storageClassName": "manual", "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"], "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": "/data/pinned"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}},
        },
    }))
    .unwrap();
    Api::<PersistentVolume>::all(client.clone())
        .create(&PostParams::default(), &pv)
        .await
        .unwrap();
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "data"},
        "spec": {"storageClassName": "manual", "accessModes": ["ReadWriteOnce"],
                 "volumeMode": "Filesystem", "resources": {"requests": {"storage": "1Gi"}}},
    }))
    .unwrap();
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
    let app = running(&client, "app").await;
    assert_eq!(node_of(&app), node, "the pod went to its volume's node");
    lab.shutdown();
}
