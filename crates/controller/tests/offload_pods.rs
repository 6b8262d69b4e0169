//! The virtual node and the virtual kubelet: a provider's grant appears as a Ready virtual node,
//! a Deployment scheduled on it runs on the provider, statuses come back with consumer-view IPs,
//! deletions flow both ways, and the provider enforces its quota and policy.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::{
    Cluster, fake_twin_namespace, offload_remote, offloaded_deployment, peer_with,
    remote_pod_cidrs, until,
};
use tandem_api::{ShadowPod, names};

fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn is_running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

fn live(pods: Vec<Pod>) -> Vec<Pod> {
    pods.into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

async fn pods(client: &kube::Client, ns: &str, selector: &str) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    api.list(&ListParams::default().labels(selector))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

#[tokio::test]
async fn deployment_runs_on_the_provider_through_the_virtual_node() {
    let consumer = Cluster::start("rome", "eu-south", 1).await;
    let provider = Cluster::start("milan", "eu-north", 2).await;
    let grant = json!({"cpu": "16", "memory": "64Gi", "pods": "500"});
    let peering = peer_with(&consumer, &provider, grant, None).await;

    // The virtual node: the grant (just changed by the provider) as capacity, labels, taint.
    let nodes: Api<Node> = Api::all(consumer.client.clone());
    let vn = names::virtual_node_name("milan");
    let node = until(
        "virtual node Ready with the new grant",
        Duration::from_secs(10),
        || async {
            let n = nodes.get_opt(&vn).await.ok().flatten()?;
            let ready = n
                .status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let cpu = n.status.as_ref()?.capacity.as_ref()?.get("cpu")?.0.clone();
            (ready && cpu == "16").then_some(n)
        },
    )
    .await;
    let status = node.status.clone().unwrap();
    let cap = status.capacity.unwrap();
    assert_eq!(cap["cpu"].0, "16");
    assert_eq!(cap["memory"].0, "64Gi");
    assert_eq!(cap["pods"].0, "500");
    assert_eq!(status.allocatable.unwrap()["cpu"].0, "16");
    let labels = node.metadata.labels.clone().unwrap();
    assert_eq!(labels[names::NODE_TYPE_LABEL], names::VIRTUAL_NODE_TYPE);
    assert_eq!(labels[names::REMOTE_CLUSTER_LABEL], "milan");
    assert_eq!(labels["topology.kubernetes.io/region"], "eu-north");
    assert_eq!(labels["kubernetes.io/hostname"], vn);
    let taints = node.spec.unwrap().taints.unwrap();
    assert!(
        taints.iter().any(|t| t.key == names::VIRTUAL_NODE_TAINT
            && t.effect == "NoExecute"
            && t.value.as_deref() == Some("true")),
        "{taints:?}"
    );

    // 30 replicas offloaded.
    let twin = offload_remote(&consumer, &provider, "shop").await;
    let deployments: Api<Deployment> = Api::namespaced(consumer.client.clone(), "shop");
    deployments
        .create(
            &PostParams::default(),
            &serde_json::from_value(offloaded_deployment("web", 30)).unwrap(),
        )
        .await
        .unwrap();
    until(
        "30 running pods on the provider",
        Duration::from_secs(40),
        || async {
            let p = live(pods(&provider.client, &twin, "app=web").await);
            (p.len() == 30 && p.iter().all(is_running)).then_some(())
        },
    )
    .await;
    let remote_cidr = remote_pod_cidrs(&peering).0;
    until(
        "30 consumer pods Running and Ready with consumer-view IPs",
        Duration::from_secs(30),
        || async {
            let p = live(pods(&consumer.client, "shop", "app=web").await);
            (p.len() == 30
                && p.iter().all(|p| {
                    is_running(p)
                        && is_ready(p)
                        && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(vn.as_str())
                        && p.status
                            .as_ref()
                            .and_then(|s| s.pod_ip.as_deref())
                            .and_then(|ip| ip.parse().ok())
                            .is_some_and(|ip: std::net::IpAddr| remote_cidr.contains(&ip))
                }))
            .then_some(())
        },
    )
    .await;
    let shadows: Api<ShadowPod> = Api::namespaced(provider.client.clone(), &twin);
    assert_eq!(
        shadows
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        30
    );

    // A real pod deleted on the provider is recreated; the consumer pod stays.
    let victim = live(pods(&provider.client, &twin, "app=web").await).remove(0);
    let victim_name = victim.metadata.name.clone().unwrap();
    let real: Api<Pod> = Api::namespaced(provider.client.clone(), &twin);
    real.delete(&victim_name, &Default::default())
        .await
        .unwrap();
    until(
        "the real pod recreated",
        Duration::from_secs(20),
        || async {
            let p = real.get_opt(&victim_name).await.ok().flatten()?;
            (p.metadata.uid != victim.metadata.uid && is_running(&p)).then_some(())
        },
    )
    .await;

    // A shadow pod deleted on the provider: the consumer pod goes and its ReplicaSet replaces it.
    let consumer_pods: Api<Pod> = Api::namespaced(consumer.client.clone(), "shop");
    let gone = live(pods(&consumer.client, "shop", "app=web").await).remove(0);
    let gone_name = gone.metadata.name.clone().unwrap();
    shadows
        .delete(&gone_name, &Default::default())
        .await
        .unwrap();
    until(
        "the consumer pod replaced",
        Duration::from_secs(30),
        || async {
            if consumer_pods
                .get_opt(&gone_name)
                .await
                .ok()
                .flatten()
                .is_some()
            {
                return None;
            }
            let p = live(pods(&consumer.client, "shop", "app=web").await);
            let r = live(pods(&provider.client, &twin, "app=web").await);
            (p.len() == 30 && p.iter().all(is_ready) && r.len() == 30).then_some(())
        },
    )
    .await;

    // Scale down: remote pods and shadow pods go too; consumer pods finish terminating.
    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 5}})),
        )
        .await
        .unwrap();
    until("5 pods on both sides", Duration::from_secs(30), || async {
        let p = pods(&consumer.client, "shop", "app=web").await;
        let r = pods(&provider.client, &twin, "app=web").await;
        let s = shadows.list(&ListParams::default()).await.ok()?.items;
        (p.len() == 5 && r.len() == 5 && s.len() == 5).then_some(())
    })
    .await;
    deployments
        .delete("web", &Default::default())
        .await
        .unwrap();
    until(
        "nothing left on either side",
        Duration::from_secs(30),
        || async {
            let p = pods(&consumer.client, "shop", "app=web").await;
            let r = pods(&provider.client, &twin, "app=web").await;
            let s = shadows.list(&ListParams::default()).await.ok()?.items;
            (p.is_empty() && r.is_empty() && s.is_empty()).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn provider_rejects_shadow_pods_over_quota_or_policy() {
    let consumer = Cluster::start("turin", "eu-south", 1).await;
    let provider = Cluster::start("genoa", "eu-north", 1).await;
    peer_with(
        &consumer,
        &provider,
        json!({"cpu": "1", "memory": "4Gi", "pods": "10"}),
        None,
    )
    .await;
    let twin = fake_twin_namespace(&consumer, &provider, "batch").await;
    let shadows: Api<ShadowPod> = Api::namespaced(provider.client.clone(), &twin);
    let shadow = |name: &str, spec: serde_json::Value| -> ShadowPod {
        serde_json::from_value(json!({
            "apiVersion": "tandem.dev/v1alpha1", "kind": "ShadowPod",
            "metadata": {"name": name},
            "spec": {"labels": {"app": name}, "pod": spec},
        }))
        .unwrap()
    };
    let cpu = |c: &str| json!({"containers": [{"name": "m", "image": "x", "resources": {"requests": {"cpu": c}}}]});
    for (name, spec) in [
        ("fits", cpu("600m")),
        ("too-big", cpu("600m")),
        (
            "host-net",
            json!({"hostNetwork": true, "containers": [{"name": "m", "image": "x"}]}),
        ),
        (
            "host-path",
            json!({"containers": [{"name": "m", "image": "x"}], "volumes": [{"name": "h", "hostPath": {"path": "/"}}]}),
        ),
        (
            "privileged",
            json!({"containers": [{"name": "m", "image": "x", "securityContext": {"privileged": true}}]}),
        ),
        // Passes the provider's policy, but its API server refuses the pod (no image).
        ("no-image", json!({"containers": [{"name": "m"}]})),
    ] {
        shadows
            .create(&PostParams::default(), &shadow(name, spec))
            .await
            .unwrap();
        // One at a time, so that "fits" is admitted first.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let status_of = |name: &'static str| {
        let shadows = shadows.clone();
        async move {
            let s = shadows.get(name).await.ok()?.status?;
            Some((s.phase?, s.message.unwrap_or_default()))
        }
    };
    let cases = [
        ("too-big", "Rejected", "quota exceeded for cpu"),
        ("host-net", "Rejected", "hostNetwork"),
        ("host-path", "Rejected", "hostPath"),
        ("privileged", "Rejected", "privileged"),
        (
            "no-image",
            "Rejected",
            "the real pod was refused: Pod \"no-image\" is invalid: spec.containers[0].image",
        ),
    ];
    for (name, phase, message) in cases {
        let (got_phase, got_message) = until(
            &format!("status of shadow pod {name}"),
            Duration::from_secs(15),
            || async { status_of(name).await.filter(|(p, _)| p == phase) },
        )
        .await;
        assert_eq!(got_phase, phase, "{name}");
        assert!(got_message.contains(message), "{name}: {got_message}");
    }
    let real: Api<Pod> = Api::namespaced(provider.client.clone(), &twin);
    let names: Vec<String> = real
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    assert_eq!(
        names,
        vec!["fits".to_string()],
        "only the admitted shadow pod runs"
    );
    assert_eq!(
        status_of("fits").await,
        None,
        "an admitted shadow pod gets no status write of its own (its pod has the status)"
    );

    // Freeing the quota admits the rejected pod.
    shadows.delete("fits", &Default::default()).await.unwrap();
    until(
        "too-big admitted once fits is gone",
        Duration::from_secs(20),
        || async { status_of("too-big").await.filter(|(p, _)| p == "Created") },
    )
    .await;
    // Free quota does not help a pod the API server refuses: it stays Rejected, and has no pod.
    let (phase, _) = status_of("no-image")
        .await
        .expect("no-image keeps its status");
    assert_eq!(phase, "Rejected");
    assert!(real.get_opt("no-image").await.unwrap().is_none());
}

/// What each controller may send per offloaded pod while [`BURST`] pods start (issue 54's
/// guard: a count, not a timing, so that it holds on any machine), by controller, cluster,
/// method and resource. Measured, then rounded up by less than one request per pod, so that a
/// change adding one request per pod fails here. Any other request sent more than
/// [`UNBUDGETED`] times per pod fails too. Raise a budget only with the reason in the commit
/// message and the burst's CPU figures in `benches/README.md` beside it.
const REQUEST_BUDGET: &[(&str, &str, &str, f64)] = &[
    // The pod's status, written back (Running and Ready arrive together here).
    ("consumer", "local", "PATCH pods/status", 1.5),
    // The ShadowPod, created (its answer unread).
    ("consumer", "milan", "POST shadowpods", 1.5),
    // The real pod, created.
    ("provider", "local", "POST pods", 1.5),
];

/// Per pod, the most any request not in [`REQUEST_BUDGET`] may be sent. (The consumer pod a
/// provider's Event is about is no longer read per pod: the virtual kubelet's watch of the
/// real pods knows it. Reads remain for Events that arrive before the real pod does, well
/// under this.)
const UNBUDGETED: f64 = 0.5;

/// Resources not counted: those the controllers write on their own clock (leases,
/// heartbeats, status posts, grant and enrollment polls), whose count depends on how long the
/// burst takes, and the provider's Events reflected (one apply per Event), whose number
/// depends on how many the provider's kubelets write and drop.
const NOT_COUNTED: &[&str] = &[
    "leases",
    "events",
    "nodes/status",
    "tenants",
    "secrets",
    "certificatesigningrequests",
    "peeringrequests",
    "peerings/status",
    "networkparameters",
    "namespaces",
];

/// Pods in the burst of [`REQUEST_BUDGET`].
const BURST: usize = 200;

#[tokio::test]
async fn a_burst_costs_each_controller_no_more_requests_per_pod_than_its_budget() {
    let consumer = Cluster::start("rome", "eu-south", 1).await;
    let provider = Cluster::start("milan", "eu-north", 2).await;
    let grant = json!({"cpu": "16", "memory": "64Gi", "pods": "500"});
    peer_with(&consumer, &provider, grant, None).await;
    let twin = offload_remote(&consumer, &provider, "shop").await;
    let metrics = [
        (
            "consumer",
            consumer.controller.as_ref().unwrap().metrics().clone(),
        ),
        (
            "provider",
            provider.controller.as_ref().unwrap().metrics().clone(),
        ),
    ];
    let counts = || -> std::collections::BTreeMap<(String, String, String), u64> {
        metrics
            .iter()
            .flat_map(|(side, m)| {
                m.requests_by_resource()
                    .into_iter()
                    .filter(|(_, _, resource, _)| !NOT_COUNTED.contains(&resource.as_str()))
                    .map(|(cluster, method, resource, n)| {
                        (
                            (side.to_string(), cluster, format!("{method} {resource}")),
                            n,
                        )
                    })
            })
            .collect()
    };

    let before = counts();
    Api::<Deployment>::namespaced(consumer.client.clone(), "shop")
        .create(
            &PostParams::default(),
            &serde_json::from_value(offloaded_deployment("web", BURST as i32)).unwrap(),
        )
        .await
        .unwrap();
    until(
        &format!("{BURST} consumer pods Running and Ready"),
        Duration::from_secs(240),
        || async {
            let p = live(pods(&consumer.client, "shop", "app=web").await);
            (p.len() == BURST && p.iter().all(|p| is_running(p) && is_ready(p))).then_some(())
        },
    )
    .await;
    assert_eq!(
        live(pods(&provider.client, &twin, "app=web").await).len(),
        BURST
    );
    // The last statuses written, and what they set off.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = counts();

    let mut over = Vec::new();
    let mut report = Vec::new();
    for ((side, cluster, request), n) in &after {
        let sent = n - before
            .get(&(side.clone(), cluster.clone(), request.clone()))
            .unwrap_or(&0);
        let per_pod = sent as f64 / BURST as f64;
        let budget = REQUEST_BUDGET
            .iter()
            .find(|(s, c, r, _)| s == side && c == cluster && r == request)
            .map(|b| b.3);
        let line = format!(
            "{side} controller → {cluster}: {request}: {per_pod:.2} per pod (budget {})",
            budget.map_or(format!("{UNBUDGETED}, unbudgeted"), |b| b.to_string())
        );
        if per_pod > budget.unwrap_or(UNBUDGETED) {
            over.push(line.clone());
        }
        if sent > 0 {
            report.push(line);
        }
    }
    eprintln!("{}", report.join("\n"));
    assert!(
        over.is_empty(),
        "over budget:\n{}\n\nall sent during the burst:\n{}",
        over.join("\n"),
        report.join("\n")
    );

    // Without the reads, the provider's Events still land on the right consumer pods (by
    // UID, as `kubectl describe pod` selects them).
    let by_uid: std::collections::BTreeMap<String, String> =
        live(pods(&consumer.client, "shop", "app=web").await)
            .into_iter()
            .map(|p| (p.uid().unwrap_or_default(), p.name_any()))
            .collect();
    let events =
        Api::<k8s_openapi::api::core::v1::Event>::namespaced(consumer.client.clone(), "shop")
            .list(&ListParams::default().labels(names::REFLECTED_LABEL))
            .await
            .unwrap()
            .items;
    assert!(!events.is_empty(), "the provider's Events are reflected");
    for e in &events {
        let o = &e.involved_object;
        let uid = o.uid.clone().unwrap_or_default();
        assert_eq!(
            by_uid.get(&uid),
            o.name.as_ref(),
            "Event {} ({:?}) names the consumer pod {:?} by its UID",
            e.name_any(),
            e.reason,
            o.name
        );
    }
}
