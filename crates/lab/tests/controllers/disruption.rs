//! PodDisruptionBudget status as the Eviction API reads it: expected, healthy and desired
//! pods, disruptionsAllowed, the DisruptionAllowed condition, and disrupted pods pending
//! their deletion.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetStatus};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::common::{Cluster, eventually, next_ip, set_pod_status};

async fn status_where(
    api: &Api<PodDisruptionBudget>,
    name: &str,
    what: &str,
    check: impl Fn(&PodDisruptionBudgetStatus) -> bool,
) -> PodDisruptionBudgetStatus {
    eventually(what, || async {
        let pdb = api.get(name).await.unwrap();
        let status = pdb.status?;
        (status.observed_generation == pdb.metadata.generation && check(&status)).then_some(status)
    })
    .await
}

fn condition(status: &PodDisruptionBudgetStatus) -> (String, String) {
    let c = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "DisruptionAllowed")
        .expect("DisruptionAllowed condition");
    (c.status.clone(), c.reason.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_count_healthy_pods_against_the_workload_scale() {
    let cluster = Cluster::start().await;
    let client = &cluster.client;
    cluster.namespace("db").await;
    let deploy: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "db"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "db"}},
            "template": {
                "metadata": {"labels": {"app": "db"}},
                "spec": {"containers": [{"name": "db", "image": "db:1"}]},
            },
        },
    }))
    .unwrap();
    let deployments = Api::<Deployment>::namespaced(client.clone(), "db");
    deployments
        .create(&PostParams::default(), &deploy)
        .await
        .unwrap();
    let pods = Api::<Pod>::namespaced(client.clone(), "db");
    let listed = eventually("3 pods", || async {
        let l = pods.list(&ListParams::default()).await.unwrap().items;
        (l.len() == 3).then_some(l)
    })
    .await;
    for pod in &listed {
        set_pod_status(client, "db", &pod.name_any(), &next_ip(), true).await;
    }

    let pdbs = Api::<PodDisruptionBudget>::namespaced(client.clone(), "db");
    for (name, budget) in [
        ("min", json!({"minAvailable": 2})),
        ("max", json!({"maxUnavailable": "50%"})),
    ] {
        let mut spec = budget;
        spec["selector"] = json!({"matchLabels": {"app": "db"}});
        let pdb: PodDisruptionBudget =
            serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap();
        pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    }
    let min = status_where(&pdbs, "min", "minAvailable 2 of 3 healthy", |s| {
        s.current_healthy == 3
    })
    .await;
    assert_eq!(
        (
            min.expected_pods,
            min.desired_healthy,
            min.disruptions_allowed
        ),
        (3, 2, 1)
    );
    assert_eq!(condition(&min), ("True".into(), "SufficientPods".into()));
    // 50% of 3 rounds up to 2 unavailable: 1 must stay healthy.
    let max = status_where(&pdbs, "max", "maxUnavailable 50% of 3", |s| {
        s.current_healthy == 3
    })
    .await;
    assert_eq!(
        (
            max.expected_pods,
            max.desired_healthy,
            max.disruptions_allowed
        ),
        (3, 1, 2)
    );

    // A pod turns unready: the minAvailable budget has nothing to spare.
    set_pod_status(client, "db", &listed[0].name_any(), &next_ip(), false).await;
    let min = status_where(&pdbs, "min", "one unready", |s| s.current_healthy == 2).await;
    assert_eq!(min.disruptions_allowed, 0);
    assert_eq!(condition(&min), ("False".into(), "InsufficientPods".into()));

    // The Eviction API records an admitted eviction: that pod no longer counts as healthy
    // while its deletion is pending, then its entry goes with the pod.
    let victim = listed[1].name_any();
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    pdbs.patch_status(
        "max",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"disruptedPods": {victim.clone(): now}}})),
    )
    .await
    .unwrap();
    let max = status_where(&pdbs, "max", "the evicted pod is not healthy", |s| {
        s.current_healthy == 1
            && s.disrupted_pods
                .as_ref()
                .is_some_and(|d| d.contains_key(&victim))
    })
    .await;
    assert_eq!(max.disruptions_allowed, 0);
    pods.delete(&victim, &DeleteParams::default())
        .await
        .unwrap();
    status_where(&pdbs, "max", "the entry goes with the pod", |s| {
        s.disrupted_pods
            .as_ref()
            .is_none_or(|d| !d.contains_key(&victim))
    })
    .await;

    // Scaling the Deployment changes what a percentage budget expects at once.
    deployments
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 6}})),
        )
        .await
        .unwrap();
    let max = status_where(&pdbs, "max", "expects the new scale", |s| {
        s.expected_pods == 6
    })
    .await;
    assert_eq!(max.desired_healthy, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_over_pods_without_a_scale_fails_safe() {
    let cluster = Cluster::start().await;
    let client = &cluster.client;
    cluster.namespace("batch").await;
    // A pod controlled by a Job: jobs have no scale, so a percentage cannot be computed.
    let job: k8s_openapi::api::batch::v1::Job = serde_json::from_value(json!({
        "metadata": {"name": "work"},
        "spec": {
            "manualSelector": true,
            "selector": {"matchLabels": {"app": "work"}},
            "template": {
                "metadata": {"labels": {"app": "work"}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "w", "image": "w:1"}]},
            },
        },
    }))
    .unwrap();
    let job = Api::<k8s_openapi::api::batch::v1::Job>::namespaced(client.clone(), "batch")
        .create(&PostParams::default(), &job)
        .await
        .unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "work-1", "labels": {"app": "work"}, "ownerReferences": [{
            "apiVersion": "batch/v1", "kind": "Job", "name": "work",
            "uid": job.metadata.uid, "controller": true,
        }]},
        "spec": {"containers": [{"name": "w", "image": "w:1"}]},
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), "batch")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    set_pod_status(client, "batch", "work-1", &next_ip(), true).await;
    let pdbs = Api::<PodDisruptionBudget>::namespaced(client.clone(), "batch");
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "work"},
        "spec": {"maxUnavailable": "10%", "selector": {"matchLabels": {"app": "work"}}},
    }))
    .unwrap();
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    let status = eventually("SyncFailed", || async {
        let s = pdbs.get("work").await.unwrap().status?;
        let c = s
            .conditions
            .iter()
            .flatten()
            .find(|c| c.reason == "SyncFailed")?
            .clone();
        Some((s, c))
    })
    .await;
    assert_eq!(status.0.disruptions_allowed, 0);
    assert_eq!(status.1.status, "False");
    assert!(
        status
            .1
            .message
            .contains("jobs.batch does not implement the scale subresource"),
        "{}",
        status.1.message
    );
}
