//! The persistent volume controller and the lab provisioner: the default class, binding to
//! volumes made by hand, provisioning for the lab's classes (and not for others), claims held
//! while a pod uses them, and reclaim policies.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::common::{Cluster, eventually};

async fn create<K>(api: &Api<K>, manifest: Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(manifest).expect("valid manifest");
    api.create(&PostParams::default(), &obj)
        .await
        .expect("object created")
}

fn claim(name: &str, class: Option<&str>, size: &str) -> Value {
    let mut c = json!({
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem",
                 "resources": {"requests": {"storage": size}}},
    });
    if let Some(class) = class {
        c["spec"]["storageClassName"] = json!(class);
    }
    c
}

fn class(name: &str, provisioner: &str, mode: &str, reclaim: &str) -> Value {
    json!({"metadata": {"name": name}, "provisioner": provisioner,
           "volumeBindingMode": mode, "reclaimPolicy": reclaim})
}

async fn bound(api: &Api<PersistentVolumeClaim>, name: &str) -> PersistentVolumeClaim {
    eventually(&format!("claim {name} Bound"), || async {
        let c = api.get(name).await.ok()?;
        (c.status.as_ref()?.phase.as_deref() == Some("Bound")).then_some(c)
    })
    .await
}

async fn reasons(client: &kube::Client, ns: &str, name: &str) -> Vec<(String, String)> {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_class_is_created_once_and_claims_without_a_class_get_it() {
    let mut cluster = Cluster::start().await;
    let client = cluster.client.clone();
    let classes = Api::<StorageClass>::all(client.clone());
    let standard = eventually("the default class", || async {
        classes.get_opt("standard").await.ok().flatten()
    })
    .await;
    assert_eq!(standard.provisioner, "lab.tandem.dev/hollow");
    assert_eq!(
        standard.volume_binding_mode.as_deref(),
        Some("WaitForFirstConsumer")
    );
    assert_eq!(standard.reclaim_policy.as_deref(), Some("Delete"));
    assert_eq!(
        standard
            .annotations()
            .get("storageclass.kubernetes.io/is-default-class")
            .map(String::as_str),
        Some("true")
    );
    // A restarted controller-manager finds it there and neither fails nor duplicates it.
    cluster.stop_controllers().await;
    cluster.start_controllers();

    cluster.namespace("vol").await;
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), "vol");
    create(&claims, claim("data", None, "1Gi")).await;
    let waiting = eventually(
        "the default class assigned, waiting for a consumer",
        || async {
            let c = claims.get("data").await.ok()?;
            let has_class = c.spec.as_ref()?.storage_class_name.as_deref() == Some("standard");
            let events = reasons(&client, "vol", "data").await;
            let waits = events.iter().any(|(r, n)| {
                r == "WaitForFirstConsumer"
                    && n == "waiting for first consumer to be created before binding"
            });
            (has_class && waits).then_some(c)
        },
    )
    .await;
    assert_eq!(
        waiting.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Pending")
    );
    assert!(
        waiting
            .finalizers()
            .iter()
            .any(|f| f == "kubernetes.io/pvc-protection")
    );
    assert_eq!(
        classes
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );

    // The scheduler's choice of node provisions a volume there.
    claims
        .patch(
            "data",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": "node-7"}}})),
        )
        .await
        .unwrap();
    let c = bound(&claims, "data").await;
    let volume = c.spec.as_ref().unwrap().volume_name.clone().unwrap();
    assert_eq!(volume, format!("pvc-{}", c.uid().unwrap()));
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get(&volume)
        .await
        .unwrap();
    let spec = pv.spec.as_ref().unwrap();
    let term = &spec
        .node_affinity
        .as_ref()
        .unwrap()
        .required
        .as_ref()
        .unwrap()
        .node_selector_terms[0];
    let expr = &term.match_expressions.as_ref().unwrap()[0];
    assert_eq!(
        (expr.key.as_str(), expr.operator.as_str()),
        ("kubernetes.io/hostname", "In")
    );
    assert_eq!(expr.values.as_deref(), Some(&["node-7".to_string()][..]));
    assert_eq!(
        pv.annotations()
            .get("pv.kubernetes.io/provisioned-by")
            .map(String::as_str),
        Some("lab.tandem.dev/hollow")
    );
    assert_eq!(spec.storage_class_name.as_deref(), Some("standard"));
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Delete")
    );
    let events = reasons(&client, "vol", "data").await;
    assert!(
        events.iter().any(|(r, n)| r == "ProvisioningSucceeded"
            && n == &format!("Successfully provisioned volume {volume}")),
        "{events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_bind_to_matching_volumes_and_are_held_while_a_pod_uses_them() {
    let cluster = Cluster::start().await;
    let client = cluster.client.clone();
    cluster.namespace("vol").await;
    let volumes = Api::<PersistentVolume>::all(client.clone());
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), "vol");
    let pv = |name: &str, size: &str, reclaim: &str| {
        json!({"metadata": {"name": name, "labels": {"tier": "gold"}},
               "spec": {"storageClassName": "manual", "capacity": {"storage": size},
                        "accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem",
                        "persistentVolumeReclaimPolicy": reclaim,
                        "hostPath": {"path": format!("/data/{name}")}}})
    };
    create(&volumes, pv("small", "1Gi", "Retain")).await;
    create(&volumes, pv("big", "10Gi", "Retain")).await;
    create(&volumes, pv("right", "3Gi", "Retain")).await;
    eventually("volumes Available and protected", || async {
        let listed = volumes.list(&ListParams::default()).await.ok()?.items;
        listed
            .iter()
            .all(|v| {
                v.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Available")
                    && v.finalizers()
                        .iter()
                        .any(|f| f == "kubernetes.io/pv-protection")
            })
            .then_some(())
    })
    .await;

    // The smallest volume that is big enough (class "manual" does not exist: static binding).
    create(&claims, claim("data", Some("manual"), "2Gi")).await;
    let c = bound(&claims, "data").await;
    assert_eq!(
        c.spec.as_ref().unwrap().volume_name.as_deref(),
        Some("right")
    );
    let status = c.status.as_ref().unwrap();
    assert_eq!(status.capacity.as_ref().unwrap()["storage"].0, "3Gi");
    assert_eq!(
        status.access_modes.as_deref(),
        Some(&["ReadWriteOnce".to_string()][..])
    );
    let ann = c.annotations();
    assert_eq!(
        ann.get("pv.kubernetes.io/bind-completed")
            .map(String::as_str),
        Some("yes")
    );
    assert_eq!(
        ann.get("pv.kubernetes.io/bound-by-controller")
            .map(String::as_str),
        Some("yes")
    );
    let right = eventually("volume right Bound", || async {
        let v = volumes.get("right").await.ok()?;
        (v.status.as_ref()?.phase.as_deref() == Some("Bound")).then_some(v)
    })
    .await;
    let claim_ref = right.spec.as_ref().unwrap().claim_ref.as_ref().unwrap();
    assert_eq!(
        (claim_ref.namespace.as_deref(), claim_ref.name.as_deref()),
        (Some("vol"), Some("data"))
    );
    assert_eq!(claim_ref.uid, c.uid());

    // A claim in use by a pod is not removed until the pod is gone.
    let pods = Api::<Pod>::namespaced(client.clone(), "vol");
    create(
        &pods,
        json!({"metadata": {"name": "user"},
        "spec": {"containers": [{"name": "c", "image": "app"}],
                 "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]}}),
    )
    .await;
    claims
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    let held = claims.get("data").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    // A correct controller keeps it for as long as the pod exists, so no amount of waiting
    // can make this flaky: the controller has had its pass on the deletion and a recheck.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let still = claims
        .get("data")
        .await
        .expect("held while the pod uses it");
    assert!(
        still
            .finalizers()
            .iter()
            .any(|f| f == "kubernetes.io/pvc-protection")
    );
    pods.delete(
        "user",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    eventually("the claim gone with its pod", || async {
        claims.get_opt("data").await.ok()?.is_none().then_some(())
    })
    .await;
    // Retain: the volume is Released and kept.
    eventually("volume right Released", || async {
        let v = volumes.get_opt("right").await.ok()??;
        (v.status.as_ref()?.phase.as_deref() == Some("Released")).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lab_provisions_its_own_classes_at_once_and_leaves_other_provisioners_alone() {
    let cluster = Cluster::start().await;
    let client = cluster.client.clone();
    cluster.namespace("vol").await;
    let classes = Api::<StorageClass>::all(client.clone());
    create(
        &classes,
        class("fast", "lab.tandem.dev/hollow", "Immediate", "Delete"),
    )
    .await;
    create(
        &classes,
        class("remote", "storage.tandem.dev/remote", "Immediate", "Delete"),
    )
    .await;
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), "vol");
    let volumes = Api::<PersistentVolume>::all(client.clone());

    create(&claims, claim("now", Some("fast"), "2Gi")).await;
    let c = bound(&claims, "now").await;
    let volume = c.spec.as_ref().unwrap().volume_name.clone().unwrap();
    let pv = volumes.get(&volume).await.unwrap();
    assert!(
        pv.spec.as_ref().unwrap().node_affinity.is_none(),
        "Immediate: on no particular node"
    );
    assert_eq!(
        pv.spec.as_ref().unwrap().capacity.as_ref().unwrap()["storage"].0,
        "2Gi"
    );
    assert_eq!(
        c.annotations()
            .get("volume.kubernetes.io/storage-provisioner")
            .map(String::as_str),
        Some("lab.tandem.dev/hollow")
    );

    create(&claims, claim("elsewhere", Some("remote"), "1Gi")).await;
    let waiting = eventually("ExternalProvisioning reported", || async {
        let events = reasons(&client, "vol", "elsewhere").await;
        events
            .iter()
            .find(|(r, _)| r == "ExternalProvisioning")
            .cloned()
    })
    .await;
    assert_eq!(
        waiting.1,
        "Waiting for a volume to be created either by the external provisioner \
         'storage.tandem.dev/remote' or manually by the system administrator. If volume \
         creation is delayed, please verify that the provisioner is running and correctly \
         registered."
    );
    let pending = claims.get("elsewhere").await.unwrap();
    assert_eq!(
        pending.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Pending")
    );
    assert_eq!(
        pending
            .annotations()
            .get("volume.kubernetes.io/storage-provisioner")
            .map(String::as_str),
        Some("storage.tandem.dev/remote")
    );
    let provisioned: Vec<String> = volumes
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|v| v.name_any())
        .collect();
    assert_eq!(
        provisioned,
        std::slice::from_ref(&volume),
        "nothing provisioned for the other provisioner"
    );

    // Reclaim policy Delete: the volume goes with its claim.
    claims
        .delete("now", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the provisioned volume deleted with its claim", || async {
        volumes.get_opt(&volume).await.ok()?.is_none().then_some(())
    })
    .await;
}
