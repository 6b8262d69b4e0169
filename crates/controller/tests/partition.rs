//! Split-brain tolerance: the provider's API endpoint unreachable from the consumer for 60 s.
//! Offloaded pods keep running on the provider; the consumer shows the virtual node NotReady
//! and the pods not Ready; after the heal everything re-converges without duplicates.

mod support;

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
#[tokio::test]
async fn evict_after_replaces_the_pods_of_a_lost_provider_locally() {
    let consumer = Cluster::start("nice", "eu-west", 1).await;
    let provider = Cluster::start("genoa", "eu-south", 1).await;
    let gate = support::api_gate(&provider).await;
    peer_with(
        &consumer,
        &provider,
        json!({"cpu": "4", "memory": "8Gi", "pods": "20"}),
        Some(gate.url()),
    )
    .await;
    let pp = kube::api::PatchParams::apply("test").force();
    Api::<tandem_api::Peering>::all(consumer.client.clone())
        .patch(
            "genoa",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"nodeHealth":
                {"probePeriod": "500ms", "notReadyAfter": "1s"}}})),
        )
        .await
        .unwrap();
    let twin = support::offload(&consumer, &provider, "shop", "LocalAndRemote").await;
    let nsos: Api<tandem_api::NamespaceOffloading> =
        Api::namespaced(consumer.client.clone(), "shop");
    nsos.patch(
        names::OFFLOADING_NAME,
        &pp,
        &kube::api::Patch::Apply(json!({
            "apiVersion": "tandem.dev/v1alpha1", "kind": "NamespaceOffloading",
            "metadata": {"name": names::OFFLOADING_NAME},
            "spec": {"podOffloadingStrategy": "LocalAndRemote", "evictAfter": "4s"},
        })),
    )
    .await
    .unwrap();
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

    // Three replicas and a StatefulSet's one, all on genoa (the local node cordoned while they
    // are placed).
    support::cordon_local_nodes(&consumer, true).await;
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
    let vn = names::virtual_node_name("genoa");
    let on_vn = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(vn.as_str());
    let ready = |p: &Pod| condition(p, "Ready").as_deref() == Some("True");
    until("3 Ready pods on genoa", Duration::from_secs(40), || async {
        let p = list(&consumer.client, "shop").await;
        (p.len() == 3 && p.iter().all(|p| ready(p) && on_vn(p))).then_some(())
    })
    .await;
    until("db-0 Ready on genoa", Duration::from_secs(40), || async {
        let p = pods.get("db-0").await.ok()?;
        (ready(&p) && on_vn(&p)).then_some(())
    })
    .await;
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
