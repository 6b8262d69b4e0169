//! StatefulSets down to pods and ControllerRevisions, with the test playing the kubelet:
//! OnDelete updates, revision history within revisionHistoryLimit, and a restarted controller
//! that picks up where the last one stopped.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::common::{Cluster, eventually, next_ip, set_pod_status};

const NS: &str = "sts";

/// Pods of the set by name, with the revision each runs.
async fn pods(client: &kube::Client) -> BTreeMap<String, (String, String)> {
    Api::<Pod>::namespaced(client.clone(), NS)
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            let revision = p
                .labels()
                .get("controller-revision-hash")
                .cloned()
                .unwrap_or_default();
            (p.name_any(), (revision, p.uid().unwrap_or_default()))
        })
        .collect()
}

async fn run_all(client: &kube::Client, names: &[&str]) {
    for name in names {
        set_pod_status(client, NS, name, &next_ip(), true).await;
    }
}

async fn revisions(client: &kube::Client) -> Vec<String> {
    Api::<ControllerRevision>::namespaced(client.clone(), NS)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|r| r.name_any())
        .collect()
}

async fn set_image(sets: &Api<StatefulSet>, image: &str) {
    sets.patch(
        "web",
        &PatchParams::default(),
        &Patch::Strategic(json!({"spec": {"template": {"spec": {"containers": [{"name": "main", "image": image}]}}}})),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_delete_updates_a_pod_only_when_it_is_deleted() {
    let cluster = Cluster::start().await;
    let client = cluster.client.clone();
    cluster.namespace(NS).await;
    let sets = Api::<StatefulSet>::namespaced(client.clone(), NS);
    let set: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2, "serviceName": "web", "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "OnDelete"}, "revisionHistoryLimit": 10,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                         "spec": {"containers": [{"name": "main", "image": "web:1"}]}},
        },
    }))
    .unwrap();
    sets.create(&PostParams::default(), &set).await.unwrap();
    let first = eventually("both pods created at once (Parallel)", || async {
        let p = pods(&client).await;
        (p.len() == 2).then_some(p)
    })
    .await;
    run_all(&client, &["web-0", "web-1"]).await;
    let old = first["web-0"].0.clone();

    set_image(&sets, "web:2").await;
    let new = eventually("a new update revision", || async {
        let s = sets.get("web").await.ok()?.status?;
        s.update_revision.filter(|u| *u != old)
    })
    .await;
    assert_eq!(
        pods(&client).await,
        first,
        "OnDelete: running pods are left alone"
    );

    Api::<Pod>::namespaced(client.clone(), NS)
        .delete("web-1", &DeleteParams::default())
        .await
        .unwrap();
    let after = eventually("web-1 recreated at the update revision", || async {
        let p = pods(&client).await;
        (p.get("web-1")?.0 == new).then_some(p)
    })
    .await;
    assert_eq!(after["web-0"], first["web-0"], "web-0 untouched");
    run_all(&client, &["web-1"]).await;
    let status = eventually("status counts both revisions", || async {
        let s = sets.get("web").await.ok()?.status?;
        (s.ready_replicas == Some(2) && s.updated_replicas == Some(1)).then_some(s)
    })
    .await;
    assert_eq!(status.current_revision.as_deref(), Some(old.as_str()));
    assert_eq!(status.current_replicas, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_is_trimmed_and_a_restarted_controller_creates_nothing_twice() {
    let mut cluster = Cluster::start().await;
    let client = cluster.client.clone();
    cluster.namespace(NS).await;
    let sets = Api::<StatefulSet>::namespaced(client.clone(), NS);
    let set: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2, "serviceName": "web", "podManagementPolicy": "OrderedReady",
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}},
            "revisionHistoryLimit": 0,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                         "spec": {"containers": [{"name": "main", "image": "web:1"}]}},
        },
    }))
    .unwrap();
    sets.create(&PostParams::default(), &set).await.unwrap();
    eventually("web-0", || async {
        pods(&client).await.contains_key("web-0").then_some(())
    })
    .await;
    run_all(&client, &["web-0"]).await;
    eventually("web-1", || async {
        pods(&client).await.contains_key("web-1").then_some(())
    })
    .await;
    run_all(&client, &["web-1"]).await;
    let old = eventually("2 ready", || async {
        let s = sets.get("web").await.ok()?.status?;
        (s.ready_replicas == Some(2)).then_some(s.current_revision?)
    })
    .await;
    assert_eq!(revisions(&client).await, std::slice::from_ref(&old));

    // Roll to a new template, playing the kubelet for each recreated pod.
    set_image(&sets, "web:2").await;
    // Each pod recreated at the new revision is started by the "kubelet" (this test) until the
    // update revision becomes the current one; two pods need at most two rounds.
    let all_pods = Api::<Pod>::namespaced(client.clone(), NS);
    let mut new = None;
    for _ in 0..3 {
        let (status, starting) = eventually("a pod to start or the rollout done", || async {
            let s = sets.get("web").await.ok()?.status?;
            let listed = all_pods
                .list(&ListParams::default().labels("app=web"))
                .await
                .ok()?;
            let starting: Vec<String> = listed
                .items
                .iter()
                .filter(|p| {
                    p.labels().get("controller-revision-hash") == s.update_revision.as_ref()
                })
                .filter(|p| p.status.as_ref().and_then(|st| st.phase.as_deref()) != Some("Running"))
                .map(|p| p.name_any())
                .collect();
            let done = s.current_revision.as_deref() != Some(old.as_str());
            (done || !starting.is_empty()).then_some((s, starting))
        })
        .await;
        if status.current_revision.as_deref() != Some(old.as_str()) {
            new = status.current_revision;
            break;
        }
        for name in &starting {
            run_all(&client, &[name.as_str()]).await;
        }
    }
    let new = new.expect("the rollout completes");
    assert_ne!(new, old);
    // revisionHistoryLimit 0: the old revision goes once nothing runs it.
    eventually("only the live revision kept", || async {
        (revisions(&client).await == [new.clone()]).then_some(())
    })
    .await;

    // A controller-manager restart finds everything in place: same pods, same revisions.
    let before = pods(&client).await;
    cluster.stop_controllers().await;
    cluster.start_controllers();
    // The restarted controller reports the status again once it has had its pass.
    sets.patch_status(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"observedGeneration": 0}})),
    )
    .await
    .unwrap();
    eventually("the restarted controller's pass", || async {
        let s = sets.get("web").await.ok()?;
        (s.status?.observed_generation == s.metadata.generation).then_some(())
    })
    .await;
    assert_eq!(pods(&client).await, before);
    assert_eq!(revisions(&client).await, [new]);
}
