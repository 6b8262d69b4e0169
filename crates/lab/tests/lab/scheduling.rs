//! The scheduler against a live cluster: placement, addresses, spreading, taints.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use super::support::{cluster, condition, create, node_of, pod, pods, running, until};

fn in_cidr(ip: &str, cidr: &str) -> bool {
    let (net, len) = cidr.split_once('/').expect("CIDR");
    let (ip, net): (Ipv4Addr, Ipv4Addr) = (ip.parse().expect("IP"), net.parse().expect("net"));
    let mask = u32::MAX << (32 - len.parse::<u32>().expect("prefix"));
    u32::from(ip) & mask == u32::from(net) & mask
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bare_pod_runs_with_an_address_from_its_nodes_pod_cidr() {
    let lab = cluster().await;
    create(&lab.client, &pod("web", json!({}))).await;
    let p = running(&lab.client, "web").await;
    let node = Api::<Node>::all(lab.client.clone())
        .get(&node_of(&p))
        .await
        .expect("the pod's node exists");
    let cidr = node.spec.and_then(|s| s.pod_cidr).expect("podCIDR");
    for kind in [
        "PodReadyToStartContainers",
        "Initialized",
        "ContainersReady",
        "Ready",
        "PodScheduled",
    ] {
        assert_eq!(condition(&p, kind).as_deref(), Some("True"), "{kind}");
    }
    let status = p.status.expect("status");
    let ip = status.pod_ip.expect("podIP");
    assert!(in_cidr(&ip, &cidr), "{ip} not in {cidr}");
    assert_eq!(
        status
            .pod_ips
            .unwrap_or_default()
            .first()
            .map(|i| i.ip.clone()),
        Some(ip)
    );
    assert!(status.host_ip.is_some() && status.start_time.is_some());
    let c = &status.container_statuses.expect("container statuses")[0];
    assert!(c.ready && c.started == Some(true));
    assert!(
        c.container_id
            .as_deref()
            .is_some_and(|id| id.starts_with("hollow://"))
    );
    assert!(c.state.as_ref().and_then(|s| s.running.as_ref()).is_some());
    lab.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_pods_with_one_label_spread_over_three_nodes() {
    let lab = cluster().await;
    for i in 0..20 {
        let mut p = pod(&format!("replica-{i}"), json!({}));
        p.metadata.labels = Some(BTreeMap::from([("app".into(), "spread".into())]));
        create(&lab.client, &p).await;
    }
    let api = pods(&lab.client);
    let per_node = until("20 pods Running", Duration::from_secs(30), || {
        let api = api.clone();
        async move {
            let list = api
                .list(&ListParams::default().labels("app=spread"))
                .await
                .ok()?;
            let running: Vec<&Pod> = list
                .items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .collect();
            (running.len() == 20).then(|| {
                let mut per_node = BTreeMap::<String, usize>::new();
                for p in running {
                    *per_node.entry(node_of(p)).or_default() += 1;
                }
                per_node
            })
        }
    })
    .await;
    assert_eq!(per_node.len(), 3, "{per_node:?}");
    assert!(
        per_node.values().all(|n| (6..=7).contains(n)),
        "{per_node:?}"
    );
    lab.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untolerated_taints_keep_pods_off_and_are_reported() {
    let lab = cluster().await;
    let nodes = Api::<Node>::all(lab.client.clone());
    let names = lab.node_names();
    let taint = |on: bool| {
        json!({"spec": {"taints": if on {
            json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}])
        } else { json!(null) }}})
    };
    for name in &names {
        until(&format!("node {name}"), Duration::from_secs(10), || {
            let nodes = nodes.clone();
            async move { nodes.get(name).await.ok().map(|_| ()) }
        })
        .await;
        let tainted = nodes
            .patch(name, &PatchParams::default(), &Patch::Merge(&taint(true)))
            .await
            .expect("taint node");
        // The scheduler's cache is eventually consistent, as kube-scheduler's is: a pod that
        // reached it before the taints would rightly land on a node.
        let rv = tainted.metadata.resource_version.expect("resourceVersion");
        lab.scheduler_sees_nodes_at(&rv).await;
    }
    create(&lab.client, &pod("picky", json!({}))).await;
    let events = Api::<Event>::namespaced(lab.client.clone(), "default");
    let message = until("a FailedScheduling event", Duration::from_secs(15), || {
        let events = events.clone();
        async move {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some("FailedScheduling")
                        && e.involved_object.name.as_deref() == Some("picky")
                })
                .map(|e| (e.type_, e.message))
        }
    })
    .await;
    assert_eq!(message.0.as_deref(), Some("Warning"));
    assert_eq!(
        message.1.as_deref(),
        Some(
            "0/3 nodes are available: 3 node(s) had untolerated taint {dedicated: gpu}. \
             preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
        )
    );
    let p = pods(&lab.client).get("picky").await.expect("pod");
    assert_eq!(node_of(&p), "");
    let cond = p
        .status
        .and_then(|s| s.conditions)
        .and_then(|c| c.into_iter().find(|c| c.type_ == "PodScheduled"))
        .expect("PodScheduled condition");
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_deref()),
        ("False", Some("Unschedulable"))
    );

    // Untainting one node lets the pending pod land there, and only there.
    nodes
        .patch(
            &names[2],
            &PatchParams::default(),
            &Patch::Merge(&taint(false)),
        )
        .await
        .expect("untaint node");
    assert_eq!(node_of(&running(&lab.client, "picky").await), names[2]);
    for i in 0..5 {
        create(&lab.client, &pod(&format!("more-{i}"), json!({}))).await;
    }
    for i in 0..5 {
        assert_eq!(
            node_of(&running(&lab.client, &format!("more-{i}")).await),
            names[2]
        );
    }
    // A pod that tolerates the taint may use the tainted nodes.
    create(
        &lab.client,
        &pod(
            "tolerant",
            json!({"spec": {
                "nodeSelector": {"kubernetes.io/hostname": names[0]},
                "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu",
                                 "effect": "NoSchedule"}]}}),
        ),
    )
    .await;
    assert_eq!(node_of(&running(&lab.client, "tolerant").await), names[0]);
    lab.shutdown();
}
