//! Storage offloading: a claim of the `tandem` StorageClass placed on a virtual node is
//! provisioned in the provider's twin namespace and pinned to that virtual node by its PV (data
//! gravity); deleting it deletes the provider's copy; unoffloading keeps the copies unless asked.
//!
//! The first tests write `volume.kubernetes.io/selected-node` themselves, as the scheduler does
//! for a `WaitForFirstConsumer` claim, so they hold against any scheduler; the end-to-end ones
//! need the lab's PV binder, StatefulSet controller and volume-aware scheduler.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{
    Event, Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod, ResourceQuota,
};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use support::{Cluster, offload_remote, peer_with, until};
use tandem_api::{NamespaceOffloading, names};

const WAIT: Duration = Duration::from_secs(30);

fn grant() -> serde_json::Value {
    json!({"cpu": "16", "memory": "64Gi", "pods": "100",
           "requests.storage": "10Gi", "persistentvolumeclaims": "5"})
}

/// A claim of the `tandem` class; `node` is the scheduler's pick, if any.
fn claim(name: &str, node: Option<&str>) -> PersistentVolumeClaim {
    let mut c = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": names::STORAGE_CLASS,
                 "resources": {"requests": {"storage": "1Gi"}}},
    });
    if let Some(node) = node {
        c["metadata"]["annotations"] = json!({names::SELECTED_NODE_ANNOTATION: node});
    }
    serde_json::from_value(c).unwrap()
}

async fn get<K>(api: &Api<K>, name: &str) -> Option<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name).await.ok().flatten()
}

/// Two peered clusters, namespace `ns` offloaded Remote; returns them and the twin namespace.
async fn offloaded(ns: &str) -> (Cluster, Cluster, String) {
    let consumer = Cluster::start("rome", "eu-south", 1).await;
    let provider = Cluster::start("milan", "eu-north", 2).await;
    peer_with(&consumer, &provider, grant(), None).await;
    let twin = offload_remote(&consumer, &provider, ns).await;
    (consumer, provider, twin)
}

/// Creates `name` in `ns` selected onto milan's virtual node and waits until it is provisioned
/// there (the provider's copy and the consumer PV exist); returns the consumer claim's UID.
async fn provisioned(
    consumer: &Cluster,
    provider: &Cluster,
    ns: &str,
    twin: &str,
    name: &str,
) -> String {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(consumer.client.clone(), ns);
    let vn = names::virtual_node_name(&provider.id);
    let created = claims
        .create(&PostParams::default(), &claim(name, Some(&vn)))
        .await
        .expect("the claim");
    let uid = created.uid().unwrap();
    let remote: Api<PersistentVolumeClaim> = Api::namespaced(provider.client.clone(), twin);
    until("the provider's copy of the claim", WAIT, || async {
        let r = get(&remote, name).await?;
        (r.annotations().get("tandem.dev/origin-uid") == Some(&uid)).then_some(())
    })
    .await;
    let pvs: Api<PersistentVolume> = Api::all(consumer.client.clone());
    let pv_name = format!("tandem-{uid}");
    until("the consumer PV", WAIT, || get(&pvs, &pv_name)).await;
    uid
}

#[tokio::test]
async fn a_claim_placed_on_the_virtual_node_is_provisioned_there_and_deleted_with_it() {
    let (consumer, provider, twin) = offloaded("db").await;
    let vn = names::virtual_node_name(&provider.id);

    // A claim no pod uses yet waits: nothing on the provider, but the finalizer is there.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(consumer.client.clone(), "db");
    claims
        .create(&PostParams::default(), &claim("idle", None))
        .await
        .unwrap();
    until("the finalizer on an unplaced claim", WAIT, || async {
        let c = get(&claims, "idle").await?;
        c.finalizers()
            .iter()
            .any(|f| f == names::REMOTE_VOLUME_FINALIZER)
            .then_some(())
    })
    .await;
    let remote: Api<PersistentVolumeClaim> = Api::namespaced(provider.client.clone(), &twin);
    assert!(
        get(&remote, "idle").await.is_none(),
        "not provisioned before a pod is placed"
    );

    let uid = provisioned(&consumer, &provider, "db", &twin, "data").await;
    let copy = remote.get("data").await.unwrap();
    let spec = copy.spec.clone().unwrap();
    assert_eq!(
        spec.resources.unwrap().requests.unwrap()["storage"].0,
        "1Gi",
        "same size"
    );
    assert_eq!(
        spec.access_modes.unwrap(),
        vec!["ReadWriteOnce".to_string()]
    );
    assert_ne!(
        spec.storage_class_name.as_deref(),
        Some(names::STORAGE_CLASS),
        "the provider's class, not the consumer's"
    );

    // The PV pins the claim to the virtual node: every pod using it goes there.
    let pv = Api::<PersistentVolume>::all(consumer.client.clone())
        .get(&format!("tandem-{uid}"))
        .await
        .unwrap();
    let pv_spec = pv.spec.clone().unwrap();
    let claim_ref = pv_spec.claim_ref.unwrap();
    assert_eq!(
        (
            claim_ref.namespace.as_deref(),
            claim_ref.name.as_deref(),
            claim_ref.uid.as_deref()
        ),
        (Some("db"), Some("data"), Some(uid.as_str()))
    );
    assert_eq!(
        pv_spec.storage_class_name.as_deref(),
        Some(names::STORAGE_CLASS)
    );
    let term = &pv_spec
        .node_affinity
        .unwrap()
        .required
        .unwrap()
        .node_selector_terms[0];
    let req = &term.match_expressions.as_ref().unwrap()[0];
    assert_eq!(
        (req.key.as_str(), req.values.clone().unwrap()),
        ("kubernetes.io/hostname", vec![vn.clone()])
    );
    let node = Api::<Node>::all(consumer.client.clone())
        .get(&vn)
        .await
        .unwrap();
    assert_eq!(
        node.labels()["kubernetes.io/hostname"],
        vn,
        "the PV's affinity selects the virtual node"
    );
    let capacity = node.status.unwrap().capacity.unwrap();
    assert!(
        !capacity.contains_key("requests.storage"),
        "the storage grant is a quota, not node capacity: {capacity:?}"
    );

    // The provider bounds the consumer's claims by the storage part of the grant.
    let quota = Api::<ResourceQuota>::namespaced(provider.client.clone(), &twin)
        .get(names::GRANT_QUOTA)
        .await
        .expect("the grant's quota in the twin namespace");
    let hard = quota.spec.unwrap().hard.unwrap();
    assert_eq!(hard["requests.storage"].0, "10Gi");
    assert_eq!(hard["persistentvolumeclaims"].0, "5");

    // Deleting the claim deletes the provider's copy, then the PV, then the claim.
    claims
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    until("the provider's copy deleted", WAIT, || async {
        get(&remote, "data").await.is_none().then_some(())
    })
    .await;
    until("the consumer claim gone", WAIT, || async {
        get(&claims, "data").await.is_none().then_some(())
    })
    .await;
    let pvs: Api<PersistentVolume> = Api::all(consumer.client.clone());
    until("the consumer PV deleted", WAIT, || async {
        let gone = get(&pvs, &format!("tandem-{uid}"))
            .await
            .is_none_or(|p| p.metadata.deletion_timestamp.is_some());
        gone.then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_claim_selected_onto_a_local_node_is_refused_with_an_event() {
    let (consumer, provider, twin) = offloaded("db").await;
    let local = Api::<Node>::all(consumer.client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|n| !n.name_any().starts_with("tandem-"))
        .expect("a local node")
        .name_any();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(consumer.client.clone(), "db");
    claims
        .create(&PostParams::default(), &claim("data", Some(&local)))
        .await
        .unwrap();
    let events: Api<Event> = Api::namespaced(consumer.client.clone(), "db");
    let event = until("a ProvisioningFailed event", WAIT, || async {
        events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("ProvisioningFailed")
                    && e.involved_object.name.as_deref() == Some("data")
            })
    })
    .await;
    assert!(
        event.message.unwrap_or_default().contains(&local),
        "names the node"
    );
    let remote: Api<PersistentVolumeClaim> = Api::namespaced(provider.client.clone(), &twin);
    assert!(get(&remote, "data").await.is_none());
}

/// Events in `ns` with `reason`, their messages.
async fn messages(client: &Client, ns: &str, reason: &str) -> Vec<String> {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.message)
        .collect()
}

#[tokio::test]
async fn unoffloading_retains_the_providers_claims_unless_asked_to_delete_data() {
    let (consumer, provider, twin) = offloaded("db").await;
    let uid = provisioned(&consumer, &provider, "db", &twin, "data").await;

    // Unoffloaded: the twin namespace stays for its claim, labelled, and both sides say so.
    let nsos: Api<NamespaceOffloading> = Api::namespaced(consumer.client.clone(), "db");
    nsos.delete(names::OFFLOADING_NAME, &DeleteParams::default())
        .await
        .unwrap();
    until("the NamespaceOffloading gone", WAIT, || async {
        get(&nsos, names::OFFLOADING_NAME)
            .await
            .is_none()
            .then_some(())
    })
    .await;
    let provider_namespaces: Api<Namespace> = Api::all(provider.client.clone());
    let kept = provider_namespaces
        .get(&twin)
        .await
        .expect("the twin namespace retained");
    assert!(kept.metadata.deletion_timestamp.is_none());
    assert_eq!(
        kept.labels()
            .get(names::RETAINED_DATA_LABEL)
            .map(String::as_str),
        Some("true")
    );
    let remote: Api<PersistentVolumeClaim> = Api::namespaced(provider.client.clone(), &twin);
    assert!(get(&remote, "data").await.is_some(), "the data is kept");
    let reported = until("the DataRetained event in the consumer", WAIT, || async {
        let m = messages(&consumer.client, "db", "DataRetained").await;
        (!m.is_empty()).then_some(m)
    })
    .await;
    assert!(
        reported[0].contains("data")
            && reported[0].contains(&twin)
            && reported[0].contains("milan"),
        "{reported:?}"
    );
    assert!(
        !messages(&provider.client, &twin, "DataRetained")
            .await
            .is_empty(),
        "the provider's admin is told too"
    );

    // The claim deleted later still deletes the retained copy.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(consumer.client.clone(), "db");
    claims
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    until("the retained copy deleted with the claim", WAIT, || async {
        get(&remote, "data").await.is_none().then_some(())
    })
    .await;
    let pvs: Api<PersistentVolume> = Api::all(consumer.client.clone());
    until("the consumer PV deleted", WAIT, || async {
        get(&pvs, &format!("tandem-{uid}"))
            .await
            .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
            .then_some(())
    })
    .await;

    // Offloaded again, provisioned again, then unoffloaded with delete-data: all gone.
    let twin = offload_remote(&consumer, &provider, "db").await;
    assert!(
        provider_namespaces
            .get(&twin)
            .await
            .unwrap()
            .labels()
            .get(names::RETAINED_DATA_LABEL)
            .is_none(),
        "a retained twin offloaded again is in use again"
    );
    provisioned(&consumer, &provider, "db", &twin, "data2").await;
    nsos.patch(
        names::OFFLOADING_NAME,
        &PatchParams::default(),
        &Patch::Merge(
            json!({"metadata": {"annotations": {names::DELETE_DATA_ANNOTATION: "true"}}}),
        ),
    )
    .await
    .unwrap();
    nsos.delete(names::OFFLOADING_NAME, &DeleteParams::default())
        .await
        .unwrap();
    until("the twin namespace deleted with its data", WAIT, || async {
        get(&provider_namespaces, &twin)
            .await
            .is_none()
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn unpeering_retains_the_providers_claims_unless_asked_to_delete_data() {
    let consumer = Cluster::start("rome", "eu-south", 1).await;
    let keep = Cluster::start("milan", "eu-north", 1).await;
    let drop = Cluster::start("turin", "eu-west", 1).await;
    peer_with(&consumer, &keep, grant(), None).await;
    peer_with(&consumer, &drop, grant(), None).await;
    let twin_keep = offload_remote(&consumer, &keep, "db").await;
    let twin_drop = offload_remote(&consumer, &drop, "db").await;
    provisioned(&consumer, &keep, "db", &twin_keep, "kept").await;
    provisioned(&consumer, &drop, "db", &twin_drop, "dropped").await;

    // Without --delete-data: reported before, retained after, the consumer's access revoked.
    let held = tandem_admin::invite::data_held_with(&consumer.client, "milan")
        .await
        .unwrap();
    assert_eq!(
        held,
        vec![format!(
            "PersistentVolumeClaim db/kept: its data stays on milan in namespace {twin_keep}"
        )]
    );
    tandem_admin::invite::unpeer(&consumer.client, "milan", false, WAIT, &mut |_| {})
        .await
        .expect("unpeered from milan");
    let on_keep: Api<Namespace> = Api::all(keep.client.clone());
    let kept = on_keep
        .get(&twin_keep)
        .await
        .expect("the twin namespace retained");
    assert!(kept.metadata.deletion_timestamp.is_none());
    assert!(
        get(
            &Api::<PersistentVolumeClaim>::namespaced(keep.client.clone(), &twin_keep),
            "kept"
        )
        .await
        .is_some()
    );
    let bindings: Api<k8s_openapi::api::rbac::v1::RoleBinding> =
        Api::namespaced(keep.client.clone(), &twin_keep);
    assert!(
        bindings
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "the unpeered consumer has no access left"
    );
    let on_provider = tandem_admin::invite::data_held_with(&keep.client, "rome")
        .await
        .unwrap();
    assert_eq!(
        on_provider,
        vec![format!(
            "namespace {twin_keep} keeps rome's PersistentVolumeClaims kept"
        )]
    );

    // With --delete-data: the twin namespace goes, data and all.
    tandem_admin::invite::mark_delete_data(&consumer.client, "turin")
        .await
        .unwrap();
    tandem_admin::invite::unpeer(&consumer.client, "turin", false, WAIT, &mut |_| {})
        .await
        .expect("unpeered from turin");
    let on_drop: Api<Namespace> = Api::all(drop.client.clone());
    until("the twin namespace deleted with its data", WAIT, || async {
        get(&on_drop, &twin_drop).await.is_none().then_some(())
    })
    .await;
}

// ---- End to end with the lab's volume binder, scheduler and StatefulSet controller ----

/// Pods in `ns` matching `selector`.
async fn pods(client: &Client, ns: &str, selector: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(selector))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

fn node_of(p: &Pod) -> Option<String> {
    p.spec.as_ref()?.node_name.clone()
}

fn phase(p: &Pod) -> Option<&str> {
    p.status.as_ref()?.phase.as_deref()
}

fn bound(c: &PersistentVolumeClaim) -> bool {
    c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
}

/// A pod of Deployment-like shape using claim `data`, as the placement webhook leaves it
/// (Remote strategy: it tolerates and must use virtual nodes).
fn pod_with_claim(name: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "db"}},
        "spec": {
            "containers": [{"name": "db", "image": "postgres",
                            "volumeMounts": [{"name": "data", "mountPath": "/var/lib/postgresql"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
        },
    }))
    .unwrap()
}

#[tokio::test]
async fn a_pod_on_the_virtual_node_binds_its_claim_there_and_its_replacement_follows() {
    let (consumer, provider, twin) = offloaded("db").await;
    let vn = names::virtual_node_name(&provider.id);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(consumer.client.clone(), "db");
    claims
        .create(&PostParams::default(), &claim("data", None))
        .await
        .unwrap();
    let pods_api: Api<Pod> = Api::namespaced(consumer.client.clone(), "db");
    pods_api
        .create(&PostParams::default(), &pod_with_claim("db-a"))
        .await
        .unwrap();
    until(
        "the pod Running on the virtual node",
        Duration::from_secs(60),
        || async {
            let p = get(&pods_api, "db-a").await?;
            (node_of(&p).as_deref() == Some(vn.as_str()) && phase(&p) == Some("Running"))
                .then_some(())
        },
    )
    .await;
    until("the claim Bound in the consumer", WAIT, || async {
        get(&claims, "data").await.filter(bound).map(|_| ())
    })
    .await;
    let remote: Api<PersistentVolumeClaim> = Api::namespaced(provider.client.clone(), &twin);
    until("the claim Bound in the provider", WAIT, || async {
        get(&remote, "data").await.filter(bound).map(|_| ())
    })
    .await;
    let real: Api<Pod> = Api::namespaced(provider.client.clone(), &twin);
    let real_pod = real.get("db-a").await.expect("the offloaded pod");
    let volumes = real_pod.spec.unwrap().volumes.unwrap();
    assert_eq!(
        volumes[0]
            .persistent_volume_claim
            .as_ref()
            .map(|c| c.claim_name.as_str()),
        Some("data"),
        "the offloaded pod mounts the provider's copy"
    );

    // Its replacement is kept where the data is.
    pods_api
        .delete("db-a", &DeleteParams::default())
        .await
        .unwrap();
    until("the first pod gone", WAIT, || async {
        get(&pods_api, "db-a").await.is_none().then_some(())
    })
    .await;
    pods_api
        .create(&PostParams::default(), &pod_with_claim("db-b"))
        .await
        .unwrap();
    until(
        "the replacement Running on the same virtual node",
        Duration::from_secs(60),
        || async {
            let p = get(&pods_api, "db-b").await?;
            (node_of(&p).as_deref() == Some(vn.as_str()) && phase(&p) == Some("Running"))
                .then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn a_pod_whose_claim_is_bound_locally_stays_local() {
    let consumer = Cluster::start("rome", "eu-south", 1).await;
    let provider = Cluster::start("milan", "eu-north", 1).await;
    peer_with(&consumer, &provider, grant(), None).await;
    let namespaces: Api<Namespace> = Api::all(consumer.client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "db"}})).unwrap(),
        )
        .await
        .unwrap();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(consumer.client.clone(), "db");
    let local: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }))
    .unwrap();
    claims.create(&PostParams::default(), &local).await.unwrap();
    let pods_api: Api<Pod> = Api::namespaced(consumer.client.clone(), "db");
    pods_api
        .create(&PostParams::default(), &pod_with_claim("db-a"))
        .await
        .unwrap();
    let first = until("the pod Running", Duration::from_secs(60), || async {
        let p = get(&pods_api, "db-a").await?;
        (phase(&p) == Some("Running"))
            .then(|| node_of(&p))
            .flatten()
    })
    .await;
    assert!(
        !first.starts_with("tandem-"),
        "a default-class claim binds locally: {first}"
    );
    // Offloaded once the claim is bound locally, LocalAndRemote: replacements could go
    // either way; the claim decides.
    Api::<NamespaceOffloading>::namespaced(consumer.client.clone(), "db")
        .patch(
            names::OFFLOADING_NAME,
            &PatchParams::apply("test").force(),
            &Patch::Apply(json!({
                "apiVersion": "tandem.dev/v1alpha1", "kind": "NamespaceOffloading",
                "metadata": {"name": names::OFFLOADING_NAME},
                "spec": {"podOffloadingStrategy": "LocalAndRemote"},
            })),
        )
        .await
        .unwrap();
    for i in 0..3 {
        let name = format!("db-r{i}");
        pods_api
            .delete(
                if i == 0 {
                    "db-a".to_string()
                } else {
                    format!("db-r{}", i - 1)
                }
                .as_str(),
                &DeleteParams::default(),
            )
            .await
            .unwrap();
        pods_api
            .create(&PostParams::default(), &pod_with_claim(&name))
            .await
            .unwrap();
        let node = until(
            "the replacement Running",
            Duration::from_secs(60),
            || async {
                let p = get(&pods_api, &name).await?;
                (phase(&p) == Some("Running"))
                    .then(|| node_of(&p))
                    .flatten()
            },
        )
        .await;
        assert_eq!(node, first, "kept where its data is");
    }
}

#[tokio::test]
async fn a_stateful_set_offloaded_remote_keeps_names_and_claims_on_the_provider() {
    let consumer = Cluster::start("rome", "eu-south", 1).await;
    let provider = Cluster::start("milan", "eu-north", 2).await;
    peer_with(&consumer, &provider, grant(), None).await;
    let namespaces: Api<Namespace> = Api::all(consumer.client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "shop"}})).unwrap(),
        )
        .await
        .unwrap();
    // EnforceSameName (allowed by the provider's admin): `db-0.db.shop.svc` means the same on
    // both sides.
    support::allow_namespace_mappings(&provider, "rome").await;
    let nsos: Api<NamespaceOffloading> = Api::namespaced(consumer.client.clone(), "shop");
    nsos.patch(
        names::OFFLOADING_NAME,
        &PatchParams::apply("test").force(),
        &Patch::Apply(json!({
            "apiVersion": "tandem.dev/v1alpha1", "kind": "NamespaceOffloading",
            "metadata": {"name": names::OFFLOADING_NAME},
            "spec": {"podOffloadingStrategy": "Remote", "namespaceMappingStrategy": "EnforceSameName"},
        })),
    )
    .await
    .unwrap();
    until("the twin namespace Ready", WAIT, || async {
        let o = get(&nsos, names::OFFLOADING_NAME).await?;
        (o.status?.phase.as_deref() == Some("Ready")).then_some(())
    })
    .await;
    let set: StatefulSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "db"},
        "spec": {
            "replicas": 3, "serviceName": "db",
            "selector": {"matchLabels": {"app": "db"}},
            "template": {
                "metadata": {"labels": {"app": "db"}},
                "spec": {"containers": [{"name": "db", "image": "postgres",
                    "volumeMounts": [{"name": "data", "mountPath": "/var/lib/postgresql"}]}]},
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": names::STORAGE_CLASS,
                         "resources": {"requests": {"storage": "1Gi"}}},
            }],
        },
    }))
    .unwrap();
    Api::<StatefulSet>::namespaced(consumer.client.clone(), "shop")
        .create(&PostParams::default(), &set)
        .await
        .unwrap();
    let vn = names::virtual_node_name(&provider.id);
    let remote_claims: Api<PersistentVolumeClaim> =
        Api::namespaced(provider.client.clone(), "shop");
    let remote_pods: Api<Pod> = Api::namespaced(provider.client.clone(), "shop");
    let all_running = || async {
        for i in 0..3 {
            let name = format!("db-{i}");
            let p = get(&remote_pods, &name).await?;
            if phase(&p) != Some("Running") {
                return None;
            }
            let spec = p.spec.as_ref()?;
            if spec.hostname.as_deref() != Some(name.as_str())
                || spec.subdomain.as_deref() != Some("db")
            {
                return None;
            }
            get(&remote_claims, &format!("data-db-{i}"))
                .await
                .filter(bound)?;
        }
        Some(())
    };
    until(
        "db-0..2 Running on the provider with their claims Bound",
        Duration::from_secs(120),
        all_running,
    )
    .await;
    let consumer_pods: Api<Pod> = Api::namespaced(consumer.client.clone(), "shop");
    for i in 0..3 {
        let p = consumer_pods.get(&format!("db-{i}")).await.unwrap();
        assert_eq!(node_of(&p).as_deref(), Some(vn.as_str()));
    }
    let claim_uid = remote_claims.get("data-db-1").await.unwrap().uid();

    // db-1 deleted: it comes back, same name, same provider, same claim.
    let old_uid = consumer_pods.get("db-1").await.unwrap().uid();
    consumer_pods
        .delete("db-1", &DeleteParams::default())
        .await
        .unwrap();
    let back = until(
        "db-1 back and Running",
        Duration::from_secs(120),
        || async {
            let p = get(&consumer_pods, "db-1").await?;
            (p.uid() != old_uid && phase(&p) == Some("Running")).then_some(p)
        },
    )
    .await;
    assert_eq!(
        node_of(&back).as_deref(),
        Some(vn.as_str()),
        "same provider"
    );
    let real = remote_pods.get("db-1").await.unwrap();
    assert_eq!(
        real.spec.unwrap().volumes.unwrap().iter().find_map(|v| v
            .persistent_volume_claim
            .as_ref()
            .map(|c| c.claim_name.clone())),
        Some("data-db-1".to_string())
    );
    assert_eq!(
        remote_claims.get("data-db-1").await.unwrap().uid(),
        claim_uid,
        "the same claim, data and all"
    );
    let live = pods(&consumer.client, "shop", "app=db").await;
    assert_eq!(live.len(), 3);
}

/// A claim of the lab's default class (`standard`): provisioned in this cluster.
fn local_claim(name: &str) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }))
    .unwrap()
}

#[tokio::test]
async fn a_claim_of_this_cluster_keeps_its_pod_local_or_is_refused_where_pods_only_run_remotely() {
    // LocalAndRemote: a pod whose (unbound) claim is of this cluster's class is placed with the
    // Local affinity from its first scheduling, and runs on a local node.
    let consumer = Cluster::start("rome", "eu-south", 1).await;
    let provider = Cluster::start("milan", "eu-north", 1).await;
    peer_with(&consumer, &provider, grant(), None).await;
    support::offload(&consumer, &provider, "mixed", "LocalAndRemote").await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(consumer.client.clone(), "mixed");
    claims
        .create(&PostParams::default(), &local_claim("data"))
        .await
        .unwrap();
    let pods_api: Api<Pod> = Api::namespaced(consumer.client.clone(), "mixed");
    let created = pods_api
        .create(&PostParams::default(), &pod_with_claim("db-a"))
        .await
        .unwrap();
    let affinity = serde_json::to_value(&created.spec.as_ref().unwrap().affinity).unwrap();
    let terms = &affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
    assert_eq!(
        terms,
        &json!([{"matchExpressions": [{"key": names::NODE_TYPE_LABEL, "operator": "NotIn",
            "values": [names::VIRTUAL_NODE_TYPE]}]}]),
        "the pod was given only the Local placement: {affinity}"
    );
    let node = until("the pod Running", Duration::from_secs(60), || async {
        let p = get(&pods_api, "db-a").await?;
        (phase(&p) == Some("Running"))
            .then(|| node_of(&p))
            .flatten()
    })
    .await;
    assert!(
        consumer.lab.node_names().contains(&node),
        "ran on a local node: {node}"
    );

    // Remote: such a pod could never mount its volume; its creation is refused naming the claim.
    let twin = offload_remote(&consumer, &provider, "remote-only").await;
    assert!(!twin.is_empty());
    let claims: Api<PersistentVolumeClaim> =
        Api::namespaced(consumer.client.clone(), "remote-only");
    claims
        .create(&PostParams::default(), &local_claim("data"))
        .await
        .unwrap();
    let refused = Api::<Pod>::namespaced(consumer.client.clone(), "remote-only")
        .create(&PostParams::default(), &pod_with_claim("db-b"))
        .await
        .expect_err("a Remote-only pod with a local claim is refused");
    let message = refused.to_string();
    assert!(
        message.contains("claim(s) data") && message.contains(names::STORAGE_CLASS),
        "{message}"
    );
}
