//! StatefulSets with volumes on a lab cluster, driven with the real kubectl: ordered start,
//! claims bound to hollow volumes on the pods' nodes, a deleted pod back on its node with its
//! claim, scale-down in reverse order with the claim retention policy, and partitioned
//! rolling updates.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use tandem_lab::LabCluster;

use super::support::{cluster, condition, kubectl_ok, node_of, until};

const WAIT: Duration = Duration::from_secs(60);

/// A headless Service and a StatefulSet `name` of `replicas` pods, each with a 1Gi claim
/// `data` of the default class (fields set explicitly, so no defaulting is relied on).
fn manifest(
    name: &str,
    replicas: i32,
    policy: &str,
    retention: (&str, &str),
    image: &str,
) -> String {
    let (when_deleted, when_scaled) = retention;
    format!(
        r#"
apiVersion: v1
kind: Service
metadata: {{name: {name}}}
spec:
  clusterIP: None
  selector: {{app: {name}}}
  ports: [{{port: 5432, name: pg}}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: {name}}}
spec:
  serviceName: {name}
  replicas: {replicas}
  podManagementPolicy: {policy}
  revisionHistoryLimit: 10
  updateStrategy: {{type: RollingUpdate, rollingUpdate: {{partition: 0}}}}
  persistentVolumeClaimRetentionPolicy: {{whenDeleted: {when_deleted}, whenScaled: {when_scaled}}}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      containers:
      - name: db
        image: {image}
        volumeMounts: [{{name: data, mountPath: /var/lib/data}}]
  volumeClaimTemplates:
  - metadata: {{name: data}}
    spec:
      accessModes: [ReadWriteOnce]
      storageClassName: standard
      volumeMode: Filesystem
      resources: {{requests: {{storage: 1Gi}}}}
"#
    )
}

fn running_and_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        && condition(pod, "Ready").as_deref() == Some("True")
}

async fn pods_of(client: &kube::Client, app: &str) -> BTreeMap<String, Pod> {
    Api::<Pod>::namespaced(client.clone(), "default")
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .expect("pods listed")
        .items
        .into_iter()
        .map(|p| (p.name_any(), p))
        .collect()
}

fn claim_of(pod: &Pod) -> Option<String> {
    pod.spec
        .as_ref()?
        .volumes
        .as_ref()?
        .iter()
        .find_map(|v| v.persistent_volume_claim.as_ref())
        .map(|c| c.claim_name.clone())
}

/// Waits until claim `name` is Bound to a volume whose node affinity names exactly `node`.
async fn bound_on(cluster: &LabCluster, name: &str, node: &str) -> PersistentVolumeClaim {
    let claims = Api::<PersistentVolumeClaim>::namespaced(cluster.client.clone(), "default");
    let volumes = Api::<PersistentVolume>::all(cluster.client.clone());
    until(&format!("claim {name} Bound on {node}"), WAIT, || {
        let (claims, volumes) = (claims.clone(), volumes.clone());
        async move {
            let claim = claims.get(name).await.ok()?;
            if claim.status.as_ref()?.phase.as_deref() != Some("Bound") {
                return None;
            }
            let pv = volumes
                .get(claim.spec.as_ref()?.volume_name.as_deref()?)
                .await
                .ok()?;
            let terms = &pv
                .spec
                .as_ref()?
                .node_affinity
                .as_ref()?
                .required
                .as_ref()?
                .node_selector_terms;
            let values: Vec<&String> = terms
                .iter()
                .flat_map(|t| t.match_expressions.iter().flatten())
                .filter(|e| e.key == "kubernetes.io/hostname" && e.operator == "In")
                .flat_map(|e| e.values.iter().flatten())
                .collect();
            (values == [node]).then_some(claim)
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statefulset_starts_in_order_with_claims_on_its_nodes_and_a_deleted_pod_keeps_both() {
    let cluster = cluster().await;
    let client = cluster.client.clone();
    kubectl_ok(
        &cluster,
        &["apply", "-f", "-"],
        Some(&manifest(
            "db",
            3,
            "OrderedReady",
            ("Retain", "Retain"),
            "postgres:16",
        )),
    )
    .await;

    // OrderedReady: whenever db-k exists, db-(k-1) is Running and Ready, and was Ready no
    // later than db-k was created.
    let pods = until("db-0, db-1, db-2 Running and Ready", WAIT, || {
        let client = client.clone();
        async move {
            let pods = pods_of(&client, "db").await;
            for k in 1..3 {
                if let Some(later) = pods.get(&format!("db-{k}")) {
                    let earlier = pods
                        .get(&format!("db-{}", k - 1))
                        .unwrap_or_else(|| panic!("db-{k} exists without db-{}", k - 1));
                    assert!(
                        running_and_ready(earlier),
                        "db-{k} was created before db-{} was Ready",
                        k - 1
                    );
                    let ready_at = earlier
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
                        .and_then(|c| c.last_transition_time.as_ref())
                        .map(|t| t.0);
                    let created = later.metadata.creation_timestamp.as_ref().map(|t| t.0);
                    assert!(
                        ready_at <= created,
                        "db-{k} created before db-{} was Ready",
                        k - 1
                    );
                }
            }
            (pods.len() == 3 && pods.values().all(running_and_ready)).then_some(pods)
        }
    })
    .await;
    for (ordinal, (name, pod)) in pods.iter().enumerate() {
        assert_eq!(name, &format!("db-{ordinal}"));
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.hostname.as_deref(), Some(name.as_str()));
        assert_eq!(spec.subdomain.as_deref(), Some("db"));
        let labels = pod.labels();
        assert_eq!(labels.get("statefulset.kubernetes.io/pod-name"), Some(name));
        assert_eq!(
            labels.get("apps.kubernetes.io/pod-index"),
            Some(&ordinal.to_string())
        );
        assert!(
            labels
                .get("controller-revision-hash")
                .is_some_and(|h| h.starts_with("db-"))
        );
        let claim = format!("data-db-{ordinal}");
        assert_eq!(claim_of(pod).as_deref(), Some(claim.as_str()));
        let bound = bound_on(&cluster, &claim, &node_of(pod)).await;
        assert_eq!(bound.labels().get("app").map(String::as_str), Some("db"));
    }
    let out = kubectl_ok(
        &cluster,
        &[
            "get",
            "pvc",
            "-o",
            r#"jsonpath={range .items[*]}{.metadata.name}={.status.phase} {end}"#,
        ],
        None,
    )
    .await;
    assert_eq!(
        out.trim(),
        "data-db-0=Bound data-db-1=Bound data-db-2=Bound"
    );

    // A deleted pod comes back under its name, on its node (its volume lives there), with its claim.
    let before = pods["db-1"].clone();
    let claim_uid = Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default")
        .get("data-db-1")
        .await
        .unwrap()
        .uid();
    kubectl_ok(&cluster, &["delete", "pod", "db-1", "--wait=false"], None).await;
    let after = until("db-1 replaced and Running", WAIT, || {
        let client = client.clone();
        let old_uid = before.uid();
        async move {
            let pod = pods_of(&client, "db").await.remove("db-1")?;
            (pod.uid() != old_uid && running_and_ready(&pod)).then_some(pod)
        }
    })
    .await;
    assert_eq!(
        node_of(&after),
        node_of(&before),
        "db-1 back on its volume's node"
    );
    assert_eq!(claim_of(&after).as_deref(), Some("data-db-1"));
    let claim = Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default")
        .get("data-db-1")
        .await
        .unwrap();
    assert_eq!(claim.uid(), claim_uid, "the same claim");

    // Scale down: db-2 goes before db-1; with whenScaled: Retain the claims stay.
    kubectl_ok(
        &cluster,
        &["scale", "statefulset", "db", "--replicas=1"],
        None,
    )
    .await;
    until("only db-0 left", WAIT, || {
        let client = client.clone();
        async move {
            let pods = pods_of(&client, "db").await;
            if pods.contains_key("db-2") {
                let db1 = pods.get("db-1").expect("db-1 is deleted only after db-2");
                assert!(
                    db1.metadata.deletion_timestamp.is_none(),
                    "db-1 deleted before db-2 went"
                );
            }
            (pods.len() == 1 && pods.contains_key("db-0")).then_some(())
        }
    })
    .await;
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default");
    for k in 0..3 {
        let claim = claims.get(&format!("data-db-{k}")).await.unwrap();
        assert!(
            claim.metadata.deletion_timestamp.is_none(),
            "data-db-{k} retained"
        );
    }
    let set = Api::<StatefulSet>::namespaced(client.clone(), "default")
        .get("db")
        .await
        .unwrap();
    let status = until("status of 1 replica", WAIT, || {
        let api = Api::<StatefulSet>::namespaced(client.clone(), "default");
        async move {
            let s = api.get("db").await.ok()?.status?;
            (s.replicas == 1 && s.ready_replicas == Some(1)).then_some(s)
        }
    })
    .await;
    assert_eq!(status.observed_generation, set.metadata.generation);
    assert_eq!(status.current_revision, status.update_revision);
    assert_eq!(status.current_replicas, Some(1));

    // kube-controller-manager's events, as `kubectl describe statefulset` shows them.
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), "default");
    let notes: Vec<String> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("StatefulSet"))
        .filter_map(|e| Some(format!("{}: {}", e.reason?, e.note?)))
        .collect();
    for want in [
        "SuccessfulCreate: create Claim data-db-0 Pod db-0 in StatefulSet db success",
        "SuccessfulCreate: create Pod db-0 in StatefulSet db successful",
        "SuccessfulCreate: create Pod db-2 in StatefulSet db successful",
        "SuccessfulDelete: delete Pod db-2 in StatefulSet db successful",
        "SuccessfulDelete: delete Pod db-1 in StatefulSet db successful",
    ] {
        assert!(notes.iter().any(|n| n == want), "{want} in {notes:#?}");
    }
    cluster.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_and_their_volumes_go_on_scale_down_and_with_the_set_under_a_delete_policy() {
    let cluster = cluster().await;
    let client = cluster.client.clone();
    kubectl_ok(
        &cluster,
        &["apply", "-f", "-"],
        Some(&manifest(
            "web",
            2,
            "Parallel",
            ("Delete", "Delete"),
            "nginx:1",
        )),
    )
    .await;
    let pods = until("web-0 and web-1 Running", WAIT, || {
        let client = client.clone();
        async move {
            let pods = pods_of(&client, "web").await;
            (pods.len() == 2 && pods.values().all(running_and_ready)).then_some(pods)
        }
    })
    .await;
    let gone_volume = bound_on(&cluster, "data-web-1", &node_of(&pods["web-1"]))
        .await
        .spec
        .unwrap()
        .volume_name
        .unwrap();
    bound_on(&cluster, "data-web-0", &node_of(&pods["web-0"])).await;

    kubectl_ok(
        &cluster,
        &["scale", "statefulset", "web", "--replicas=1"],
        None,
    )
    .await;
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default");
    let volumes = Api::<PersistentVolume>::all(client.clone());
    until("data-web-1 and its volume deleted", WAIT, || {
        let (claims, volumes, gone_volume) = (claims.clone(), volumes.clone(), gone_volume.clone());
        async move {
            let claim_gone = claims.get_opt("data-web-1").await.ok()?.is_none();
            let volume_gone = volumes.get_opt(&gone_volume).await.ok()?.is_none();
            (claim_gone && volume_gone).then_some(())
        }
    })
    .await;
    let kept = claims.get("data-web-0").await.unwrap();
    assert!(
        kept.metadata.deletion_timestamp.is_none(),
        "the remaining pod's claim stays"
    );
    assert_eq!(pods_of(&client, "web").await.len(), 1);

    // whenDeleted: Delete: the claims go with the set.
    kubectl_ok(
        &cluster,
        &["delete", "statefulset", "web", "--wait=false"],
        None,
    )
    .await;
    until("data-web-0 deleted with its set", WAIT, || {
        let claims = claims.clone();
        async move {
            claims
                .get_opt("data-web-0")
                .await
                .ok()?
                .is_none()
                .then_some(())
        }
    })
    .await;
    cluster.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_rolling_update_updates_only_ordinals_at_or_above_the_partition() {
    let cluster = cluster().await;
    let client = cluster.client.clone();
    kubectl_ok(
        &cluster,
        &["apply", "-f", "-"],
        Some(&manifest(
            "kv",
            3,
            "OrderedReady",
            ("Retain", "Retain"),
            "kv:1",
        )),
    )
    .await;
    let sets = Api::<StatefulSet>::namespaced(client.clone(), "default");
    let first = until("3 ready replicas", WAIT, || {
        let sets = sets.clone();
        async move {
            let s = sets.get("kv").await.ok()?.status?;
            (s.ready_replicas == Some(3) && s.current_replicas == Some(3)).then_some(s)
        }
    })
    .await;
    let old_revision = first.current_revision.clone().unwrap();

    kubectl_ok(
        &cluster,
        &["patch", "statefulset", "kv", "-p",
          r#"{"spec":{"updateStrategy":{"type":"RollingUpdate","rollingUpdate":{"partition":2}},"template":{"spec":{"containers":[{"name":"db","image":"kv:2"}]}}}}"#],
        None,
    )
    .await;
    let status = until("kv-2 updated", WAIT, || {
        let (sets, client) = (sets.clone(), client.clone());
        async move {
            let s = sets.get("kv").await.ok()?.status?;
            let pods = pods_of(&client, "kv").await;
            let kv2 = pods.get("kv-2")?;
            let updated =
                kv2.labels().get("controller-revision-hash") == s.update_revision.as_ref();
            (s.updated_replicas == Some(1)
                && updated
                && running_and_ready(kv2)
                && s.ready_replicas == Some(3))
            .then_some(s)
        }
    })
    .await;
    let new_revision = status.update_revision.clone().unwrap();
    assert_ne!(new_revision, old_revision);
    assert_eq!(
        status.current_revision.as_deref(),
        Some(old_revision.as_str())
    );
    let pods = pods_of(&client, "kv").await;
    for (name, image, revision) in [
        ("kv-0", "kv:1", &old_revision),
        ("kv-1", "kv:1", &old_revision),
        ("kv-2", "kv:2", &new_revision),
    ] {
        let pod = &pods[name];
        assert_eq!(
            pod.labels().get("controller-revision-hash"),
            Some(revision),
            "{name}"
        );
        assert_eq!(
            pod.spec.as_ref().unwrap().containers[0].image.as_deref(),
            Some(image),
            "{name}"
        );
    }
    let revisions = kubectl_ok(
        &cluster,
        &["get", "controllerrevisions", "-o", "name"],
        None,
    )
    .await;
    assert!(
        revisions.contains(&old_revision) && revisions.contains(&new_revision),
        "{revisions}"
    );

    // Lowering the partition finishes the update; the update revision becomes current.
    kubectl_ok(
        &cluster,
        &[
            "patch",
            "statefulset",
            "kv",
            "-p",
            r#"{"spec":{"updateStrategy":{"rollingUpdate":{"partition":0}}}}"#,
        ],
        None,
    )
    .await;
    until("every pod at the new revision", WAIT, || {
        let sets = sets.clone();
        let new_revision = new_revision.clone();
        async move {
            let s = sets.get("kv").await.ok()?.status?;
            (s.current_revision.as_deref() == Some(new_revision.as_str())
                && s.updated_replicas == Some(3)
                && s.ready_replicas == Some(3))
            .then_some(())
        }
    })
    .await;
    for pod in pods_of(&client, "kv").await.values() {
        assert_eq!(
            pod.spec.as_ref().unwrap().containers[0].image.as_deref(),
            Some("kv:2")
        );
    }
    cluster.shutdown();
}
