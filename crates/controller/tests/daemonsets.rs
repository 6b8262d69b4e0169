//! DaemonSets in an offloaded namespace (Liqo #1398): the lab's DaemonSet controller is
//! faithful to kube and would put a pod tolerating everything on the virtual node too; Tandem
//! keeps it off unless the DaemonSet opts in, and then the pod runs once in the provider.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use support::{Cluster, offload, peer_with, until};
use tandem_api::{ShadowPod, names};

const WAIT: Duration = Duration::from_secs(60);

/// A DaemonSet whose pods tolerate every taint, as kube-proxy's do.
fn tolerant_daemonset(name: &str, annotations: Value) -> DaemonSet {
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "agent", "image": "agent:1",
                        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}],
                },
            },
        },
    }))
    .unwrap()
}

fn running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// Live pods labelled `app=<app>` in `ns`, by the node they are bound to ("" if none).
async fn pods_by_node(client: &Client, ns: &str, app: &str) -> BTreeMap<String, Vec<Pod>> {
    let list = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let mut map: BTreeMap<String, Vec<Pod>> = BTreeMap::new();
    for pod in list
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
    {
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        map.entry(node).or_default().push(pod);
    }
    map
}

#[tokio::test]
async fn daemonsets_stay_off_virtual_nodes_unless_they_opt_in() {
    let consumer = Cluster::start("rome", "eu-south", 2).await;
    let provider = Cluster::start("milan", "eu-north", 2).await;
    let grant = json!({"cpu": "16", "memory": "64Gi", "pods": "500"});
    peer_with(&consumer, &provider, grant, None).await;
    let vn = names::virtual_node_name("milan");
    let twin = offload(&consumer, &provider, "agents", "LocalAndRemote").await;
    let local_nodes = consumer.lab.node_names();
    let daemonsets: Api<DaemonSet> = Api::namespaced(consumer.client.clone(), "agents");
    let shadows: Api<ShadowPod> = Api::namespaced(provider.client.clone(), &twin);

    // Tolerating everything, not opted in: a pod on each local node, none on the virtual node.
    daemonsets
        .create(
            &PostParams::default(),
            &tolerant_daemonset("proxy", Value::Null),
        )
        .await
        .expect("daemonset created");
    let placed = until("a Running pod on each local node", WAIT, || async {
        let m = pods_by_node(&consumer.client, "agents", "proxy").await;
        let ok = m.len() == local_nodes.len()
            && local_nodes
                .iter()
                .all(|n| m.get(n).is_some_and(|p| p.len() == 1 && running(&p[0])));
        ok.then_some(m)
    })
    .await;
    assert!(
        !placed.contains_key(&vn),
        "no pod on the virtual node: {placed:?}"
    );
    let ds = until("the DaemonSet counts only local nodes", WAIT, || async {
        let ds = daemonsets.get("proxy").await.ok()?;
        let s = ds.status.as_ref()?;
        (s.desired_number_scheduled == 2 && s.number_ready == 2).then_some(ds)
    })
    .await;
    let template = serde_json::to_value(&ds.spec.as_ref().unwrap().template).unwrap();
    let terms = &template["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    assert_eq!(
        terms[0]["matchExpressions"][0],
        json!({"key": names::NODE_TYPE_LABEL, "operator": "NotIn", "values": [names::VIRTUAL_NODE_TYPE]}),
        "the webhook excluded virtual nodes: {template}"
    );

    // Opted in: exactly one pod on the virtual node, running once in the provider.
    let opt_in = json!({names::DAEMONSET_ON_VIRTUAL_NODES_ANNOTATION: "true"});
    daemonsets
        .create(
            &PostParams::default(),
            &tolerant_daemonset("collector", opt_in),
        )
        .await
        .expect("daemonset created");
    let mut everywhere = local_nodes.clone();
    everywhere.push(vn.clone());
    let placed = until(
        "a Running pod on every node, the virtual one too",
        WAIT,
        || async {
            let m = pods_by_node(&consumer.client, "agents", "collector").await;
            let ok = m.len() == everywhere.len()
                && everywhere
                    .iter()
                    .all(|n| m.get(n).is_some_and(|p| p.len() == 1 && running(&p[0])));
            ok.then_some(m)
        },
    )
    .await;
    let offloaded = placed[&vn][0].name_any();
    let remote = until("one real pod in the provider, Running", WAIT, || async {
        let m = pods_by_node(&provider.client, &twin, "collector").await;
        let pods: Vec<&Pod> = m.values().flatten().collect();
        (pods.len() == 1 && running(pods[0])).then(|| pods[0].clone())
    })
    .await;
    assert_eq!(
        remote.name_any(),
        offloaded,
        "the provider runs the consumer's pod"
    );
    assert!(
        provider
            .lab
            .node_names()
            .contains(remote.spec.as_ref().unwrap().node_name.as_ref().unwrap()),
        "scheduled on a provider node"
    );
    until("the DaemonSet counts the virtual node", WAIT, || async {
        let s = daemonsets.get("collector").await.ok()?.status?;
        (s.desired_number_scheduled == 3 && s.number_ready == 3).then_some(())
    })
    .await;
    // Still exactly one in the provider (one per virtual node, not per provider node).
    let pods = pods_by_node(&provider.client, &twin, "collector").await;
    assert_eq!(pods.values().flatten().count(), 1, "{pods:?}");
    let no_proxy = shadows
        .list(&ListParams::default().labels("app=proxy"))
        .await
        .unwrap()
        .items;
    assert!(
        no_proxy.is_empty(),
        "nothing of the non-opted-in DaemonSet reached the provider"
    );
}

#[tokio::test]
async fn a_daemonset_from_before_tandem_is_refused_on_the_virtual_node_until_updated() {
    let mut consumer = Cluster::start("rome", "eu-south", 1).await;
    let provider = Cluster::start("milan", "eu-north", 2).await;
    let grant = json!({"cpu": "16", "memory": "64Gi", "pods": "500"});
    peer_with(&consumer, &provider, grant, None).await;
    let vn = names::virtual_node_name("milan");
    let twin = offload(&consumer, &provider, "legacy", "LocalAndRemote").await;

    // As if the DaemonSet had been created before Tandem's webhook existed.
    let hooks: Api<MutatingWebhookConfiguration> = Api::all(consumer.client.clone());
    hooks
        .delete(
            tandem_controller::consumer::webhook::WEBHOOK_CONFIGURATION,
            &DeleteParams::default(),
        )
        .await
        .expect("webhook configuration deleted");
    let daemonsets: Api<DaemonSet> = Api::namespaced(consumer.client.clone(), "legacy");
    daemonsets
        .create(
            &PostParams::default(),
            &tolerant_daemonset("proxy", Value::Null),
        )
        .await
        .expect("daemonset created");
    let refused = until(
        "the pod on the virtual node refused, with the reason",
        WAIT,
        || async {
            let m = pods_by_node(&consumer.client, "legacy", "proxy").await;
            let pod = m.get(&vn)?.first()?.clone();
            let status = pod.status.as_ref()?;
            (status.reason.as_deref() == Some("DaemonSetNotOptedIn")).then_some(pod)
        },
    )
    .await;
    let message = refused
        .status
        .as_ref()
        .unwrap()
        .message
        .clone()
        .unwrap_or_default();
    assert!(
        message.contains(names::DAEMONSET_ON_VIRTUAL_NODES_ANNOTATION),
        "the message says how to opt in: {message}"
    );
    let shadows: Api<ShadowPod> = Api::namespaced(provider.client.clone(), &twin);
    assert!(
        shadows
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "nothing offloaded"
    );

    // Tandem's webhook back (the controller re-registers it), and the DaemonSet updated: its
    // template now excludes virtual nodes and its pod there goes.
    consumer.restart_controller().await;
    until("the webhook registered again", WAIT, || async {
        hooks
            .get_opt(tandem_controller::consumer::webhook::WEBHOOK_CONFIGURATION)
            .await
            .ok()
            .flatten()
    })
    .await;
    until("the update goes through the webhook", WAIT, || async {
        daemonsets
            .patch(
                "proxy",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
            )
            .await
            .ok()?;
        let ds = daemonsets.get("proxy").await.ok()?;
        let template = serde_json::to_value(&ds.spec?.template).ok()?;
        template["spec"]["affinity"]["nodeAffinity"]
            .is_object()
            .then_some(())
    })
    .await;
    until("no pod left on the virtual node", WAIT, || async {
        let m = pods_by_node(&consumer.client, "legacy", "proxy").await;
        (!m.contains_key(&vn) && m.len() == 1).then_some(())
    })
    .await;
}
