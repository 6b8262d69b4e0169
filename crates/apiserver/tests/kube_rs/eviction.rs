//! `Api::evict` against PodDisruptionBudgets: the status a client sees on refusal, dry runs
//! that change nothing, and concurrent evictions that never spend more than the budget.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, EvictParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::common::{Cluster, api_status};

async fn running_pod(pods: &Api<Pod>, name: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "web", "image": "nginx"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let status = json!({"status": {"phase": "Running",
                                   "conditions": [{"type": "Ready", "status": "True"}]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
}

/// Sets budget `web`'s status as its controller would, having observed its current spec.
async fn allow(budgets: &Api<PodDisruptionBudget>, allowed: i32) {
    let generation = budgets.get("web").await.unwrap().metadata.generation;
    let status = json!({"status": {"observedGeneration": generation, "disruptionsAllowed": allowed,
                                   "currentHealthy": 3, "desiredHealthy": 1, "expectedPods": 3}});
    budgets
        .patch_status("web", &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
}

/// An admin client that returns a 429 at once: kube-rs by default retries 429s (15 times,
/// backing off up to 1000 s), and a refused eviction is the answer under test here.
async fn client_without_retries(c: &Cluster) -> kube::Client {
    let yaml = c.server.admin_kubeconfig().unwrap();
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    config.default_retry = false;
    kube::Client::try_from(config).unwrap()
}

#[tokio::test]
async fn evict_spends_the_budget_once_per_pod_and_refuses_past_it() {
    let c = Cluster::start().await;
    let client = client_without_retries(&c).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client, "default");
    for name in ["web-0", "web-1", "web-2"] {
        running_pod(&pods, name).await;
    }
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}},
    }))
    .unwrap();
    budgets.create(&PostParams::default(), &pdb).await.unwrap();

    // Not yet observed by its controller: refused, "still being processed".
    let status = api_status(pods.evict("web-0", &EvictParams::default()).await);
    assert_eq!(
        (status.code, status.reason.as_str()),
        (429, "TooManyRequests")
    );
    let causes = status.details.expect("details").causes;
    assert_eq!(causes[0].reason, "DisruptionBudget");
    assert_eq!(
        causes[0].message,
        "The disruption budget web is still being processed by the server."
    );

    allow(&budgets, 0).await;
    let status = api_status(pods.evict("web-0", &EvictParams::default()).await);
    assert_eq!(
        status.message,
        "Cannot evict pod as it would violate the pod's disruption budget."
    );
    assert_eq!(
        status.details.expect("details").causes[0].message,
        "The disruption budget web needs 1 healthy pods and has 3 currently"
    );

    // A running pod that is not ready does not count as healthy: while the budget has its
    // healthy pods, evicting it spends nothing.
    running_pod(&pods, "web-3").await;
    let unready = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}});
    pods.patch_status(
        "web-3",
        &PatchParams::default(),
        &Patch::Merge(unready.clone()),
    )
    .await
    .unwrap();
    pods.evict("web-3", &EvictParams::default())
        .await
        .expect("an unready pod is evicted");
    assert!(pods.get_opt("web-3").await.unwrap().is_none());
    assert_eq!(
        budgets
            .get("web")
            .await
            .unwrap()
            .status
            .unwrap()
            .disruptions_allowed,
        0
    );

    // When the budget lacks healthy pods, an unready pod is protected too, unless the
    // budget's unhealthyPodEvictionPolicy is AlwaysAllow.
    let lacking = json!({"status": {"currentHealthy": 0}});
    budgets
        .patch_status("web", &PatchParams::default(), &Patch::Merge(lacking))
        .await
        .unwrap();
    running_pod(&pods, "web-4").await;
    pods.patch_status(
        "web-4",
        &PatchParams::default(),
        &Patch::Merge(unready.clone()),
    )
    .await
    .unwrap();
    let status = api_status(pods.evict("web-4", &EvictParams::default()).await);
    assert_eq!(status.code, 429);
    let always = json!({"spec": {"unhealthyPodEvictionPolicy": "AlwaysAllow"}});
    budgets
        .patch("web", &PatchParams::default(), &Patch::Merge(always))
        .await
        .unwrap();
    pods.evict("web-4", &EvictParams::default())
        .await
        .expect("AlwaysAllow lets an unready pod go");
    assert!(pods.get_opt("web-4").await.unwrap().is_none());

    // A dry run is allowed but spends nothing and deletes nothing.
    allow(&budgets, 1).await;
    let dry = EvictParams {
        post_options: PostParams {
            dry_run: true,
            ..Default::default()
        },
        ..Default::default()
    };
    pods.evict("web-0", &dry).await.expect("dry-run eviction");
    assert!(pods.get_opt("web-0").await.unwrap().is_some());
    let budget = budgets.get("web").await.unwrap().status.unwrap();
    assert_eq!(budget.disruptions_allowed, 1);
    assert!(budget.disrupted_pods.is_none_or(|p| p.is_empty()));

    // Two evictions at once against a budget of one: exactly one goes through.
    let plain = EvictParams::default();
    let (a, b) = tokio::join!(pods.evict("web-1", &plain), pods.evict("web-2", &plain));
    let codes: Vec<u16> = [a, b]
        .into_iter()
        .map(|r| r.map_or_else(|e| api_status::<()>(Err(e)).code, |_| 201))
        .collect();
    assert_eq!(
        codes.iter().filter(|c| **c == 201).count(),
        1,
        "one eviction fits the budget: {codes:?}"
    );
    assert!(codes.contains(&429), "{codes:?}");
    let budget = budgets.get("web").await.unwrap().status.unwrap();
    assert_eq!(budget.disruptions_allowed, 0);
    let disrupted = budget.disrupted_pods.unwrap_or_default();
    assert_eq!(disrupted.len(), 1, "{disrupted:?}");
    let evicted = disrupted.keys().next().unwrap();
    assert!(
        pods.get_opt(evicted).await.unwrap().is_none(),
        "{evicted} is deleted"
    );
}
