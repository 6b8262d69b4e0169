//! Deployments through their ReplicaSets down to pods: creation, status, scaling, rolling
//! and recreate updates, revision history.

use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, watcher};
use serde_json::{Value, json};

use super::common::{
    Cluster, DEADLINE, eventually, kubectl, next_ip, ready_and_active, set_pod_status,
};

const HASH: &str = "pod-template-hash";

async fn create_deployment(
    client: &kube::Client,
    ns: &str,
    name: &str,
    replicas: i32,
    strategy: Value,
) {
    let deploy: Deployment = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "strategy": strategy,
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "main", "image": "nginx:1"}]},
            },
        },
    }))
    .unwrap();
    Api::<Deployment>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &deploy)
        .await
        .expect("deployment created");
}

async fn set_image(client: &kube::Client, ns: &str, name: &str, image: &str) {
    let patch =
        json!({"spec": {"template": {"spec": {"containers": [{"name": "main", "image": image}]}}}});
    Api::<Deployment>::namespaced(client.clone(), ns)
        .patch(name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .expect("image changed");
}

async fn active_pods(client: &kube::Client, ns: &str) -> Vec<Pod> {
    let mut pods: Vec<Pod> = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    pods.sort_by_key(|p| p.name_any());
    pods
}

async fn replicasets(client: &kube::Client, ns: &str) -> Vec<ReplicaSet> {
    Api::<ReplicaSet>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
}

/// Marks every active pod that is not Ready yet as Ready.
async fn make_all_ready(client: &kube::Client, ns: &str) {
    for pod in active_pods(client, ns).await {
        if !ready_and_active(&pod) {
            set_pod_status(client, ns, &pod.name_any(), &next_ip(), true).await;
        }
    }
}

/// Waits until the Deployment reports a finished rollout of `replicas` pods.
async fn rolled_out(client: &kube::Client, ns: &str, name: &str, replicas: i32) -> Deployment {
    let api = Api::<Deployment>::namespaced(client.clone(), ns);
    eventually(
        &format!("deployment {name} rolled out to {replicas}"),
        || async {
            let d = api.get(name).await.unwrap();
            let s = d.status.clone()?;
            let cond = |t: &str| {
                s.conditions
                    .as_ref()?
                    .iter()
                    .find(|c| c.type_ == t)
                    .cloned()
            };
            let done = s.observed_generation == d.metadata.generation
                && s.replicas == Some(replicas)
                && s.updated_replicas == Some(replicas)
                && s.ready_replicas == Some(replicas)
                && s.available_replicas == Some(replicas)
                && s.unavailable_replicas.unwrap_or(0) == 0
                && cond("Available").is_some_and(|c| {
                    c.status == "True" && c.reason.as_deref() == Some("MinimumReplicasAvailable")
                })
                && cond("Progressing").is_some_and(|c| {
                    c.status == "True" && c.reason.as_deref() == Some("NewReplicaSetAvailable")
                });
            done.then_some(d)
        },
    )
    .await
}

/// `kubectl rollout status` against the cluster, as a user would run it.
async fn kubectl_rollout_status(cluster: &Cluster, ns: &str, name: &str) -> (bool, String) {
    let deployment = format!("deployment/{name}");
    kubectl(
        cluster,
        &["-n", ns, "rollout", "status", &deployment, "--timeout=20s"],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_replicas_converge_then_scale_down_to_five() {
    let cluster = Cluster::start().await;
    let client = &cluster.client;
    cluster.namespace("web20").await;
    let history = PodHistory::watch(client, "web20");
    create_deployment(client, "web20", "web", 20, json!({"type": "RollingUpdate"})).await;

    let rs = eventually("one replicaset with 20 pods", || async {
        let rss = replicasets(client, "web20").await;
        let [rs] = rss.as_slice() else { return None };
        let pods = active_pods(client, "web20").await;
        let owned = pods
            .iter()
            .filter(|p| {
                p.owner_references()
                    .iter()
                    .any(|o| Some(&o.uid) == rs.metadata.uid.as_ref() && o.controller == Some(true))
            })
            .count();
        (pods.len() == 20 && owned == 20).then(|| rs.clone())
    })
    .await;
    let hash = rs
        .labels()
        .get(HASH)
        .expect("replicaset has a pod-template-hash label")
        .clone();
    assert_eq!(rs.name_any(), format!("web-{hash}"));
    assert_eq!(
        rs.annotations()
            .get("deployment.kubernetes.io/revision")
            .map(String::as_str),
        Some("1")
    );
    for pod in active_pods(client, "web20").await {
        assert_eq!(
            pod.labels().get(HASH),
            Some(&hash),
            "pod {} carries the template hash",
            pod.name_any()
        );
        assert!(
            pod.name_any().starts_with(&format!("web-{hash}-")),
            "pod {} named after its replicaset",
            pod.name_any()
        );
    }

    make_all_ready(client, "web20").await;
    let d = rolled_out(client, "web20", "web", 20).await;
    assert_eq!(
        d.annotations()
            .get("deployment.kubernetes.io/revision")
            .map(String::as_str),
        Some("1")
    );
    let (ok, out) = kubectl_rollout_status(&cluster, "web20", "web").await;
    assert!(
        ok && out.contains("successfully rolled out"),
        "kubectl rollout status: {out}"
    );

    Api::<Deployment>::namespaced(client.clone(), "web20")
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 5}})),
        )
        .await
        .unwrap();
    eventually("five pods left", || async {
        let pods = Api::<Pod>::namespaced(client.clone(), "web20")
            .list(&ListParams::default())
            .await
            .unwrap();
        (pods.items.len() == 5).then_some(())
    })
    .await;
    rolled_out(client, "web20", "web", 5).await;
    let rss = replicasets(client, "web20").await;
    assert_eq!(rss.len(), 1, "scaling creates no replicaset");
    assert_eq!(rss[0].spec.as_ref().and_then(|s| s.replicas), Some(5));
    assert_eq!(rss[0].status.as_ref().map(|s| s.replicas), Some(5));
    // What `kubectl describe deployment` shows under Events.
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), "web20");
    let want = [
        format!("Scaled up replica set web-{hash} from 0 to 20"),
        format!("Scaled down replica set web-{hash} from 20 to 5"),
    ];
    eventually("ScalingReplicaSet events on the deployment", || async {
        let notes: Vec<String> = events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("ScalingReplicaSet"))
            .filter(|e| e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("Deployment"))
            .filter_map(|e| e.note)
            .collect();
        want.iter().all(|w| notes.contains(w)).then_some(())
    })
    .await;
    // Deletions are watched after the creations they follow: once 15 are seen, every pod
    // ever created has been seen too.
    eventually("15 deletions watched", || async {
        (history.deleted() >= 15).then_some(())
    })
    .await;
    assert_eq!(
        history.created(),
        20,
        "pods created in all (a burst must not over-create)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_controllers_pick_up_where_they_left_off() {
    let mut cluster = Cluster::start().await;
    let client = cluster.client.clone();
    cluster.namespace("restart").await;
    let history = PodHistory::watch(&client, "restart");
    create_deployment(
        &client,
        "restart",
        "app",
        4,
        json!({"type": "RollingUpdate"}),
    )
    .await;
    eventually("four pods", || async {
        (active_pods(&client, "restart").await.len() == 4).then_some(())
    })
    .await;
    make_all_ready(&client, "restart").await;
    rolled_out(&client, "restart", "app", 4).await;

    // Scaled while no controller runs; the restarted ones converge with no duplicates.
    cluster.stop_controllers().await;
    Api::<Deployment>::namespaced(client.clone(), "restart")
        .patch(
            "app",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 6}})),
        )
        .await
        .unwrap();
    cluster.start_controllers();
    eventually("six pods", || async {
        (active_pods(&client, "restart").await.len() == 6).then_some(())
    })
    .await;
    make_all_ready(&client, "restart").await;
    rolled_out(&client, "restart", "app", 6).await;
    assert_eq!(replicasets(&client, "restart").await.len(), 1);
    Api::<Deployment>::namespaced(client.clone(), "restart")
        .patch(
            "app",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await
        .unwrap();
    eventually("six deletions watched", || async {
        (history.deleted() >= 6).then_some(())
    })
    .await;
    assert_eq!(history.created(), 6, "pods created in all across restarts");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_a_stalled_rollout_resizes_replicasets_proportionally() {
    let cluster = Cluster::start().await;
    let client = &cluster.client;
    cluster.namespace("prop").await;
    let strategy =
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 3, "maxUnavailable": 2}});
    create_deployment(client, "prop", "svc", 10, strategy).await;
    eventually("ten pods", || async {
        (active_pods(client, "prop").await.len() == 10).then_some(())
    })
    .await;
    make_all_ready(client, "prop").await;
    rolled_out(client, "prop", "svc", 10).await;
    let old_hash = replicasets(client, "prop").await[0].labels()[HASH].clone();

    // New pods never become Ready: the rollout stalls at 8 old + 5 new (kube's example).
    set_image(client, "prop", "svc", "nginx:broken").await;
    let sizes = || async {
        let mut old_new = (0, 0);
        for rs in replicasets(client, "prop").await {
            let n = rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
            if rs.labels()[HASH] == old_hash {
                old_new.0 = n
            } else {
                old_new.1 = n
            }
        }
        old_new
    };
    eventually("rollout stalled at 8 old, 5 new", || async {
        (sizes().await == (8, 5)).then_some(())
    })
    .await;

    Api::<Deployment>::namespaced(client.clone(), "prop")
        .patch(
            "svc",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 15}})),
        )
        .await
        .unwrap();
    eventually("old grows by 3 and new by 2", || async {
        (sizes().await == (11, 7)).then_some(())
    })
    .await;
    eventually("18 pods", || async {
        (active_pods(client, "prop").await.len() == 18).then_some(())
    })
    .await;
}

/// Every pod ever created and deleted in a namespace, from a watch.
struct PodHistory {
    seen: Arc<Mutex<(HashSet<String>, HashSet<String>)>>,
    task: tokio::task::JoinHandle<()>,
}

impl PodHistory {
    fn watch(client: &kube::Client, ns: &str) -> PodHistory {
        let seen = Arc::new(Mutex::new((HashSet::new(), HashSet::new())));
        let stream = watcher(
            Api::<Pod>::namespaced(client.clone(), ns),
            watcher::Config::default(),
        );
        let record = seen.clone();
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let mut seen = record.lock().unwrap();
                match event {
                    Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                        seen.0.insert(p.uid().unwrap_or_default());
                    }
                    Ok(watcher::Event::Delete(p)) => {
                        seen.0.insert(p.uid().unwrap_or_default());
                        seen.1.insert(p.uid().unwrap_or_default());
                    }
                    _ => {}
                }
            }
        });
        PodHistory { seen, task }
    }

    fn created(&self) -> usize {
        self.seen.lock().unwrap().0.len()
    }

    fn deleted(&self) -> usize {
        self.seen.lock().unwrap().1.len()
    }
}

impl Drop for PodHistory {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_update_keeps_minimum_availability_and_ends_on_the_new_template() {
    let cluster = Cluster::start().await;
    let client = &cluster.client;
    cluster.namespace("roll").await;
    let (replicas, max_unavailable) = (6, 1);
    create_deployment(
        client,
        "roll",
        "api",
        replicas,
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": max_unavailable}}),
    )
    .await;
    eventually("six pods", || async {
        (active_pods(client, "roll").await.len() == 6).then_some(())
    })
    .await;
    make_all_ready(client, "roll").await;
    rolled_out(client, "roll", "api", replicas).await;
    let old_hash = replicasets(client, "roll").await[0].labels()[HASH].clone();

    set_image(client, "roll", "api", "nginx:2").await;
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let mut max_seen = 0;
    loop {
        let pods = active_pods(client, "roll").await;
        let available = pods.iter().filter(|p| ready_and_active(p)).count();
        assert!(
            available >= (replicas - max_unavailable) as usize,
            "only {available} available pods during the rollout: {:?}",
            pods.iter()
                .map(|p| (p.name_any(), ready_and_active(p)))
                .collect::<Vec<_>>()
        );
        max_seen = max_seen.max(pods.len());
        let new: Vec<&Pod> = pods
            .iter()
            .filter(|p| p.labels().get(HASH) != Some(&old_hash))
            .collect();
        if new.len() == pods.len()
            && pods.len() == replicas as usize
            && new.iter().all(|p| ready_and_active(p))
        {
            break;
        }
        // Play the kubelet slowly: one new pod becomes Ready at a time.
        if let Some(pod) = new.iter().find(|p| !ready_and_active(p)) {
            set_pod_status(client, "roll", &pod.name_any(), &next_ip(), true).await;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "rollout did not finish: {} pods, {} new",
            pods.len(),
            new.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        max_seen <= (replicas + 1) as usize,
        "at most maxSurge extra pods, saw {max_seen}"
    );
    let d = rolled_out(client, "roll", "api", replicas).await;
    assert_eq!(
        d.annotations()
            .get("deployment.kubernetes.io/revision")
            .map(String::as_str),
        Some("2")
    );
    let rss = replicasets(client, "roll").await;
    assert_eq!(rss.len(), 2, "the old replicaset is kept as history");
    for rs in &rss {
        let old = rs.labels()[HASH] == old_hash;
        let spec = rs.spec.as_ref().and_then(|s| s.replicas);
        assert_eq!(
            spec,
            Some(if old { 0 } else { replicas }),
            "{}",
            rs.name_any()
        );
        let revision = rs
            .annotations()
            .get("deployment.kubernetes.io/revision")
            .cloned();
        assert_eq!(
            revision.as_deref(),
            Some(if old { "1" } else { "2" }),
            "{}",
            rs.name_any()
        );
    }
    for pod in active_pods(client, "roll").await {
        let image = pod.spec.as_ref().unwrap().containers[0].image.clone();
        assert_eq!(image.as_deref(), Some("nginx:2"), "pod {}", pod.name_any());
    }
    let (ok, out) = kubectl_rollout_status(&cluster, "roll", "api").await;
    assert!(
        ok && out.contains("successfully rolled out"),
        "kubectl rollout status: {out}"
    );

    // kubectl reads the revisions from the ReplicaSets and rolls back to the first one,
    // which becomes revision 3.
    let (ok, out) = kubectl(
        &cluster,
        &["-n", "roll", "rollout", "history", "deployment/api"],
    )
    .await;
    assert!(
        ok && out.contains('1') && out.contains('2'),
        "kubectl rollout history: {out}"
    );
    let (ok, out) = kubectl(
        &cluster,
        &["-n", "roll", "rollout", "undo", "deployment/api"],
    )
    .await;
    assert!(ok, "kubectl rollout undo: {out}");
    eventually("rolled back to the first template", || async {
        make_all_ready(client, "roll").await;
        let pods = active_pods(client, "roll").await;
        let back = pods.len() == replicas as usize
            && pods
                .iter()
                .all(|p| p.labels().get(HASH) == Some(&old_hash) && ready_and_active(p));
        back.then_some(())
    })
    .await;
    let d = rolled_out(client, "roll", "api", replicas).await;
    assert_eq!(
        d.annotations()
            .get("deployment.kubernetes.io/revision")
            .map(String::as_str),
        Some("3")
    );
    let rss = replicasets(client, "roll").await;
    assert_eq!(rss.len(), 2, "the rollback reuses the first replicaset");
    let first = rss.iter().find(|rs| rs.labels()[HASH] == old_hash).unwrap();
    assert_eq!(
        first
            .annotations()
            .get("deployment.kubernetes.io/revision")
            .map(String::as_str),
        Some("3")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recreate_never_mixes_templates_and_history_is_pruned() {
    let cluster = Cluster::start().await;
    let client = &cluster.client;
    cluster.namespace("rec").await;
    create_deployment(client, "rec", "db", 3, json!({"type": "Recreate"})).await;
    // Pods bound to a node stay terminating until their kubelet (this test) removes them,
    // and revisionHistoryLimit 1 keeps a single old ReplicaSet.
    let patch =
        json!({"spec": {"revisionHistoryLimit": 1, "template": {"spec": {"nodeName": "node-1"}}}});
    Api::<Deployment>::namespaced(client.clone(), "rec")
        .patch("db", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
    let pods_api = Api::<Pod>::namespaced(client.clone(), "rec");
    let mut stopping = std::collections::HashMap::<String, u32>::new();
    for (round, image) in ["nginx:1", "nginx:2", "nginx:3"].into_iter().enumerate() {
        if round > 0 {
            set_image(client, "rec", "db", image).await;
        }
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let pods = pods_api.list(&ListParams::default()).await.unwrap().items;
            let images: BTreeSet<String> = pods
                .iter()
                .filter_map(|p| p.spec.as_ref()?.containers[0].image.clone())
                .collect();
            assert!(
                images.len() <= 1,
                "old and new pods (terminating included) at once: {images:?}"
            );
            let bound = pods
                .iter()
                .all(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("node-1"));
            if pods.len() == 3 && bound && images.iter().all(|i| i == image) {
                break;
            }
            // Play a slow kubelet: a terminating pod goes after ten polls (its containers
            // take a while to stop), which gives a controller that does not wait for it
            // every chance to start new pods meanwhile.
            for pod in pods
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_some())
            {
                let polls = stopping.entry(pod.name_any()).or_insert(0);
                *polls += 1;
                if *polls > 10 {
                    let _ = pods_api
                        .delete(&pod.name_any(), &DeleteParams::default().grace_period(0))
                        .await;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "recreate to {image} did not finish: {images:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        make_all_ready(client, "rec").await;
        rolled_out(client, "rec", "db", 3).await;
    }
    eventually("history pruned to one old replicaset", || async {
        (replicasets(client, "rec").await.len() == 2).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphan_replicaset_is_adopted_and_rolled_away() {
    let cluster = Cluster::start().await;
    let client = &cluster.client;
    cluster.namespace("adopt").await;
    let orphan: ReplicaSet = serde_json::from_value(json!({
        "metadata": {"name": "legacy", "labels": {"app": "web"}},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "main", "image": "nginx:0"}]},
            },
        },
    }))
    .unwrap();
    let rs_api = Api::<ReplicaSet>::namespaced(client.clone(), "adopt");
    rs_api
        .create(&PostParams::default(), &orphan)
        .await
        .unwrap();
    eventually("legacy pods", || async {
        (active_pods(client, "adopt").await.len() == 2).then_some(())
    })
    .await;
    make_all_ready(client, "adopt").await;

    let strategy =
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}});
    create_deployment(client, "adopt", "web", 2, strategy).await;
    let deploy = Api::<Deployment>::namespaced(client.clone(), "adopt")
        .get("web")
        .await
        .unwrap();
    eventually("rolled onto the deployment's template", || async {
        make_all_ready(client, "adopt").await;
        let pods = active_pods(client, "adopt").await;
        let new = pods
            .iter()
            .all(|p| p.spec.as_ref().unwrap().containers[0].image.as_deref() == Some("nginx:1"));
        (pods.len() == 2 && new).then_some(())
    })
    .await;
    rolled_out(client, "adopt", "web", 2).await;
    let legacy = rs_api.get("legacy").await.unwrap();
    let owner = legacy
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
        .cloned();
    assert_eq!(
        owner.map(|o| o.uid),
        deploy.metadata.uid,
        "legacy adopted by the deployment"
    );
    assert_eq!(legacy.spec.and_then(|s| s.replicas), Some(0));
}
