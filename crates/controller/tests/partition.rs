//! Split-brain tolerance: the provider's API endpoint unreachable from the consumer for 60 s.
//! Offloaded pods keep running on the provider; the consumer shows the virtual node NotReady
//! and the pods not Ready; after the heal everything re-converges without duplicates.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use support::{Cluster, offload_remote, offloaded_deployment, peer_with, remote_pod_cidrs, until};
use tandem_api::{ShadowPod, names};

fn condition(p: &Pod, type_: &str) -> Option<String> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.clone())
}

fn node_ready(n: &Node) -> Option<(String, String)> {
    n.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
}

async fn list(client: &kube::Client, ns: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels("app=web"))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

fn restarts(p: &Pod) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .map(|c| c.restart_count)
        .sum()
}

#[tokio::test]
async fn partition_of_60s_keeps_provider_pods_and_reconverges() {
    let consumer = Cluster::start("paris", "eu-west", 1).await;
    let provider = Cluster::start("lyon", "eu-west", 2).await;
    let gate = support::api_gate(&provider).await;
    let peering = peer_with(
        &consumer,
        &provider,
        json!({"cpu": "16", "memory": "64Gi", "pods": "500"}),
        Some(gate.url()),
    )
    .await;
    let twin = offload_remote(&consumer, &provider, "shop").await;
    Api::<Deployment>::namespaced(consumer.client.clone(), "shop")
        .create(
            &PostParams::default(),
            &serde_json::from_value(offloaded_deployment("web", 10)).unwrap(),
        )
        .await
        .unwrap();
    let ready = |p: &Pod| condition(p, "Ready").as_deref() == Some("True");
    until(
        "10 Ready consumer pods",
        Duration::from_secs(40),
        || async {
            let p = list(&consumer.client, "shop").await;
            (p.len() == 10 && p.iter().all(ready)).then_some(())
        },
    )
    .await;
    let uids = |pods: &[Pod]| -> Vec<String> {
        let mut u: Vec<String> = pods.iter().filter_map(|p| p.metadata.uid.clone()).collect();
        u.sort();
        u
    };
    let provider_before = uids(&list(&provider.client, &twin).await);
    let consumer_before = uids(&list(&consumer.client, "shop").await);
    assert_eq!(provider_before.len(), 10);

    gate.close();
    let closed_at = tokio::time::Instant::now();
    let nodes: Api<Node> = Api::all(consumer.client.clone());
    let vn = names::virtual_node_name("lyon");
    until("virtual node NotReady", Duration::from_secs(20), || async {
        let n = nodes.get(&vn).await.ok()?;
        (node_ready(&n)? == ("False".into(), "ProviderUnreachable".into())).then_some(())
    })
    .await;
    until(
        "consumer pods not Ready",
        Duration::from_secs(20),
        || async {
            let p = list(&consumer.client, "shop").await;
            (p.len() == 10 && p.iter().all(|p| !ready(p))).then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(60).saturating_sub(closed_at.elapsed())).await;
    let during = list(&provider.client, &twin).await;
    assert_eq!(uids(&during), provider_before, "provider pods untouched");
    for p in &during {
        assert_eq!(
            p.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Running")
        );
        assert_eq!(restarts(p), 0, "{:?} restarted", p.metadata.name);
    }

    gate.open();
    until(
        "virtual node Ready again",
        Duration::from_secs(20),
        || async {
            let n = nodes.get(&vn).await.ok()?;
            (node_ready(&n)?.0 == "True").then_some(())
        },
    )
    .await;
    until(
        "consumer pods Ready again",
        Duration::from_secs(40),
        || async {
            let p = list(&consumer.client, "shop").await;
            (p.len() == 10 && p.iter().all(ready)).then_some(())
        },
    )
    .await;
    // No duplicates, nothing replaced, and statuses match (IPs in the consumer's view).
    let consumer_pods = list(&consumer.client, "shop").await;
    let provider_pods = list(&provider.client, &twin).await;
    assert_eq!(uids(&consumer_pods), consumer_before);
    assert_eq!(uids(&provider_pods), provider_before);
    let shadows = Api::<ShadowPod>::namespaced(provider.client.clone(), &twin)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert_eq!(shadows.len(), 10);
    let remote: BTreeMap<String, &Pod> = provider_pods
        .iter()
        .map(|p| (p.metadata.name.clone().unwrap(), p))
        .collect();
    for p in &consumer_pods {
        let name = p.metadata.name.clone().unwrap();
        let r = remote[&name];
        let (s, rs) = (p.status.as_ref().unwrap(), r.status.as_ref().unwrap());
        assert_eq!(s.phase, rs.phase, "{name}");
        assert_eq!(
            s.pod_ip.as_deref().map(|ip| {
                let (here, there) = remote_pod_cidrs(&peering);
                support::translate(ip, here, there)
            }),
            rs.pod_ip,
            "{name}"
        );
        assert_eq!(restarts(p), 0, "{name}");
    }
}

/// A Peering's own health timing and a NamespaceOffloading's `evictAfter`: the provider lost,
/// its virtual node turns NotReady (and not-ready tainted), and after `evictAfter` the pods
/// there are evicted and replaced locally; after the heal the evicted ones are gone from both
/// clusters and nothing runs twice.
/// Peers `consumer` with `provider` through `gate`, with a provider lost after 1 s, and offloads
/// namespace `shop` with `spec`; returns the twin namespace and the offloadings' API.
async fn lose_fast(
    consumer: &Cluster,
    provider: &Cluster,
    gate: &tandem_lab::TcpGate,
    spec: serde_json::Value,
) -> (String, Api<tandem_api::NamespaceOffloading>) {
    peer_with(
        consumer,
        provider,
        json!({"cpu": "4", "memory": "8Gi", "pods": "20"}),
        Some(gate.url()),
    )
    .await;
    Api::<tandem_api::Peering>::all(consumer.client.clone())
        .patch(
            &provider.id,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"nodeHealth":
                {"probePeriod": "500ms", "notReadyAfter": "1s"}}})),
        )
        .await
        .unwrap();
    let twin = support::offload(consumer, provider, "shop", "LocalAndRemote").await;
    let nsos: Api<tandem_api::NamespaceOffloading> =
        Api::namespaced(consumer.client.clone(), "shop");
    nsos.patch(
        names::OFFLOADING_NAME,
        &kube::api::PatchParams::apply("test").force(),
        &kube::api::Patch::Apply(json!({
            "apiVersion": "tandem.dev/v1alpha1", "kind": "NamespaceOffloading",
            "metadata": {"name": names::OFFLOADING_NAME},
            "spec": spec,
        })),
    )
    .await
    .unwrap();
    (twin, nsos)
}

/// Three replicas of Deployment `web` and StatefulSet `db`'s one in `shop`, all Ready on the
/// provider's virtual node (the local node cordoned while they are placed).
async fn web_and_db_on_provider(consumer: &Cluster, provider: &Cluster) {
    support::cordon_local_nodes(consumer, true).await;
    Api::<Deployment>::namespaced(consumer.client.clone(), "shop")
        .create(
            &PostParams::default(),
            &serde_json::from_value(support::deployment("web", 3)).unwrap(),
        )
        .await
        .unwrap();
    let mut db = support::deployment("db", 1);
    db["apiVersion"] = json!("apps/v1");
    db["kind"] = json!("StatefulSet");
    db["spec"]["serviceName"] = json!("db");
    Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(consumer.client.clone(), "shop")
        .create(&PostParams::default(), &serde_json::from_value(db).unwrap())
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(consumer.client.clone(), "shop");
    let vn = names::virtual_node_name(&provider.id);
    let on_vn = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(vn.as_str());
    let ready = |p: &Pod| condition(p, "Ready").as_deref() == Some("True");
    until(
        "3 Ready web pods on the provider",
        Duration::from_secs(40),
        || async {
            let p = list(&consumer.client, "shop").await;
            (p.len() == 3 && p.iter().all(|p| ready(p) && on_vn(p))).then_some(())
        },
    )
    .await;
    until(
        "db-0 Ready on the provider",
        Duration::from_secs(40),
        || async {
            let p = pods.get("db-0").await.ok()?;
            (ready(&p) && on_vn(&p)).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn evict_after_replaces_the_pods_of_a_lost_provider_locally() {
    let consumer = Cluster::start("nice", "eu-west", 1).await;
    let provider = Cluster::start("genoa", "eu-south", 1).await;
    let gate = support::api_gate(&provider).await;
    let (twin, nsos) = lose_fast(
        &consumer,
        &provider,
        &gate,
        json!({"podOffloadingStrategy": "LocalAndRemote", "evictAfter": "4s"}),
    )
    .await;
    // A bad duration is refused by the schema, naming the field; the stored one is kept.
    let err = nsos
        .patch(
            names::OFFLOADING_NAME,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"evictAfter": "soon"}})),
        )
        .await
        .unwrap_err();
    assert!(format!("{err}").contains("spec.evictAfter"), "{err}");
    let pods: Api<Pod> = Api::namespaced(consumer.client.clone(), "shop");
    let vn = names::virtual_node_name(&provider.id);
    let on_vn = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(vn.as_str());
    let ready = |p: &Pod| condition(p, "Ready").as_deref() == Some("True");
    web_and_db_on_provider(&consumer, &provider).await;
    let first_db = pods.get("db-0").await.unwrap().metadata.uid;
    support::cordon_local_nodes(&consumer, false).await;
    let offloaded = list(&consumer.client, "shop").await;
    for p in &offloaded {
        let tolerations = p
            .spec
            .as_ref()
            .unwrap()
            .tolerations
            .clone()
            .unwrap_or_default();
        for key in [
            "node.kubernetes.io/not-ready",
            "node.kubernetes.io/unreachable",
        ] {
            assert!(
                tolerations
                    .iter()
                    .any(|t| t.key.as_deref() == Some(key) && t.toleration_seconds == Some(4)),
                "{key} tolerated for evictAfter: {tolerations:?}"
            );
        }
    }

    gate.close();
    let nodes: Api<Node> = Api::all(consumer.client.clone());
    until(
        "virtual node NotReady and not-ready tainted",
        Duration::from_secs(20),
        || async {
            let n = nodes.get(&vn).await.ok()?;
            let tainted = n
                .spec
                .as_ref()?
                .taints
                .as_ref()?
                .iter()
                .any(|t| t.key == "node.kubernetes.io/not-ready" && t.effect == "NoExecute");
            (node_ready(&n)?.0 == "False" && tainted).then_some(())
        },
    )
    .await;
    until(
        "3 Ready replacements on the local node",
        Duration::from_secs(60),
        || async {
            let p = list(&consumer.client, "shop").await;
            (p.iter()
                .filter(|p| ready(p) && !on_vn(p) && p.metadata.deletion_timestamp.is_none())
                .count()
                == 3)
                .then_some(())
        },
    )
    .await;
    // The evicted pods wait for their provider to confirm them gone.
    let evicted: Vec<Pod> = list(&consumer.client, "shop")
        .await
        .into_iter()
        .filter(|p| on_vn(p))
        .collect();
    assert!(
        evicted
            .iter()
            .all(|p| p.metadata.deletion_timestamp.is_some()),
        "evicted, not forgotten"
    );
    // db-0 too, so its StatefulSet cannot make another db-0 meanwhile.
    until("db-0 evicted", Duration::from_secs(20), || async {
        pods.get("db-0")
            .await
            .ok()?
            .metadata
            .deletion_timestamp
            .map(drop)
    })
    .await;
    assert_eq!(pods.get("db-0").await.unwrap().metadata.uid, first_db);

    gate.open();
    until(
        "the evicted pods gone from both clusters",
        Duration::from_secs(60),
        || async {
            let here = list(&consumer.client, "shop").await;
            let there = list(&provider.client, &twin).await;
            (here.len() == 3 && here.iter().all(|p| !on_vn(p) && ready(p)) && there.is_empty())
                .then_some(())
        },
    )
    .await;
    let shadows = Api::<ShadowPod>::namespaced(provider.client.clone(), &twin)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert!(
        shadows
            .iter()
            .all(|s| s.metadata.name.as_deref() == Some("db-0")),
        "no orphaned ShadowPod: {shadows:?}"
    );
    until("a new db-0 Ready", Duration::from_secs(60), || async {
        let p = pods.get("db-0").await.ok()?;
        (ready(&p) && p.metadata.uid != first_db).then_some(())
    })
    .await;
    // The kubelets' record: db-0 ran in genoa, then again, never in two clusters at once.
    let runs = tandem_lab::runs::of_pod("db-0");
    assert!(runs.len() >= 2, "{runs:?}");
    assert_eq!(runs[0].cluster, "genoa");
    assert!(
        runs[0].stopped.is_some(),
        "the first db-0 stopped: {runs:?}"
    );
    assert_eq!(tandem_lab::runs::overlaps_across_clusters("db-0"), vec![]);
}

fn fence_condition(t: &tandem_api::Tenant) -> Option<(String, String)> {
    let c = tandem_api::conditions::find(&t.status.as_ref()?.conditions, "Fenced")?;
    Some((c.status.clone(), c.reason.clone()))
}

/// `partitionPolicy: Fence`, `fenceAfter: 10s`: the provider lost, its copies of the fenced
/// namespace's pods are stopped there (their ShadowPods marked Fenced, the Tenant says so), and
/// only then replaced here — the StatefulSet's db-0 never runs in two clusters at once. The
/// pods' tolerations keep Kubernetes' 300 s: the fence alone replaces them. After the heal
/// nothing fenced starts again and no ShadowPod is left behind.
#[tokio::test]
async fn fence_stops_a_lost_providers_pods_before_they_are_replaced() {
    let consumer = Cluster::start("turin", "eu-west", 1).await;
    let provider = Cluster::start("bern", "eu-central", 1).await;
    let gate = support::api_gate(&provider).await;
    let (twin, nsos) = lose_fast(
        &consumer,
        &provider,
        &gate,
        json!({"podOffloadingStrategy": "LocalAndRemote",
               "partitionPolicy": "Fence", "fenceAfter": "10s"}),
    )
    .await;
    // A policy the schema does not know is refused, naming the field.
    let err = nsos
        .patch(
            names::OFFLOADING_NAME,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"partitionPolicy": "Sometimes"}})),
        )
        .await
        .unwrap_err();
    assert!(format!("{err}").contains("spec.partitionPolicy"), "{err}");
    web_and_db_on_provider(&consumer, &provider).await;
    let pods: Api<Pod> = Api::namespaced(consumer.client.clone(), "shop");
    let vn = names::virtual_node_name("bern");
    let on_vn = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(vn.as_str());
    let ready = |p: &Pod| condition(p, "Ready").as_deref() == Some("True");
    let first_db = pods.get("db-0").await.unwrap();
    assert_eq!(
        first_db.metadata.annotations.as_ref().unwrap()[names::FENCE_AFTER],
        "10s",
        "the pod carries its bound"
    );
    // The consumer hands the provider's nonce back: the lease is live before the partition.
    let tenant_ns = names::tenant_namespace("turin");
    let tenants: Api<tandem_api::Tenant> = Api::namespaced(provider.client.clone(), &tenant_ns);
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(provider.client.clone(), &tenant_ns);
    let renewals = std::sync::Mutex::new(std::collections::BTreeSet::new());
    until(
        "the fence lease renewed twice",
        Duration::from_secs(30),
        || async {
            let lease = leases.get(names::FENCE_LEASE).await.ok()?;
            let nonce = lease.metadata.annotations?[names::FENCE_NONCE_ANNOTATION].clone();
            let issued = leases.get(names::FENCE_NONCE_LEASE).await.ok()?;
            issued
                .metadata
                .annotations?
                .get(names::FENCE_ACCEPTED_AT_ANNOTATION)?;
            let mut seen = renewals.lock().unwrap();
            seen.insert(nonce);
            (seen.len() >= 3).then_some(())
        },
    )
    .await;
    let shadows: Api<ShadowPod> = Api::namespaced(provider.client.clone(), &twin);
    let labelled = shadows
        .list(&ListParams::default().labels(&format!("{}=10s", names::FENCE_AFTER)))
        .await
        .unwrap();
    assert_eq!(labelled.items.len(), 4, "every ShadowPod carries the bound");
    support::cordon_local_nodes(&consumer, false).await;

    gate.close();
    // The provider stops its copies (the consumer cannot see it happen) ...
    let real_pods: Api<Pod> = Api::namespaced(provider.client.clone(), &twin);
    until(
        "the pods stopped in bern, their ShadowPods Fenced",
        Duration::from_secs(60),
        || async {
            let running = real_pods.list(&ListParams::default()).await.ok()?.items;
            let fenced = shadows
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .iter()
                .filter(|s| s.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Fenced"))
                .count();
            (running.is_empty() && fenced == 4).then_some(())
        },
    )
    .await;
    until(
        "the Tenant Fenced, listing the pods",
        Duration::from_secs(20),
        || async {
            let t = tenants.get("turin").await.ok()?;
            (fence_condition(&t) == Some(("True".into(), "LeaseExpired".into()))
                && t.status?.fence?.fenced_pods.len() == 4)
                .then_some(())
        },
    )
    .await;
    let events =
        Api::<k8s_openapi::api::core::v1::Event>::namespaced(provider.client.clone(), &tenant_ns)
            .list(&ListParams::default())
            .await
            .unwrap();
    assert!(
        events
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("PodsFenced")),
        "an Event says so"
    );
    // ... and the consumer, once the bound has passed, replaces them.
    until(
        "db-0 and 3 web pods Ready off the lost provider",
        Duration::from_secs(60),
        || async {
            let db = pods.get("db-0").await.ok()?;
            let web = list(&consumer.client, "shop").await;
            (ready(&db)
                && !on_vn(&db)
                && db.metadata.uid != first_db.metadata.uid
                && web.len() == 3
                && web.iter().all(|p| ready(p) && !on_vn(p)))
            .then_some(())
        },
    )
    .await;
    let confirmed =
        Api::<k8s_openapi::api::core::v1::Event>::namespaced(consumer.client.clone(), "shop")
            .list(&ListParams::default())
            .await
            .unwrap();
    assert!(
        confirmed
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("FenceConfirmed")),
        "the consumer says why it replaced them"
    );
    assert_eq!(tandem_lab::runs::overlaps_across_clusters("db-0"), vec![]);

    gate.open();
    until(
        "the fenced ShadowPods gone, the lease renewed",
        Duration::from_secs(60),
        || async {
            let left = shadows.list(&ListParams::default()).await.ok()?.items;
            let t = tenants.get("turin").await.ok()?;
            (left.is_empty()
                && fence_condition(&t) == Some(("False".into(), "LeaseRenewed".into()))
                && t.status?.fence?.fenced_pods.is_empty())
            .then_some(())
        },
    )
    .await;
    // Nothing fenced came back, nothing runs twice.
    assert!(
        real_pods
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    let here = list(&consumer.client, "shop").await;
    assert!(
        here.len() == 3 && here.iter().all(|p| ready(p) && !on_vn(p)),
        "{here:?}"
    );
    let runs = tandem_lab::runs::of_pod("db-0");
    assert_eq!(runs[0].cluster, "bern", "{runs:?}");
    assert!(runs[0].stopped.is_some(), "{runs:?}");
    assert!(runs.iter().any(|r| r.cluster == "turin"), "{runs:?}");
    assert_eq!(tandem_lab::runs::overlaps_across_clusters("db-0"), vec![]);
}
