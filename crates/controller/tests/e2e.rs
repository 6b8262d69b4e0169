//! End-to-end scenarios of issue 5 on lab clusters, asserting what a user would check with
//! kubectl: the virtual node is Ready seconds after `tandem peer`; pods go where their
//! namespace's offloading strategy and cluster selector say; a Service has endpoints in both
//! clusters, each in its own address view; unpeer leaves nothing Tandem-owned behind.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Secret, Service};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use support::{Cluster, peer_with, remote_pod_cidrs, tandem_owned, translate, until, until_owned};
use tandem_api::{NamespaceOffloading, Peering, names};

const WAIT: Duration = Duration::from_secs(30);

fn grant() -> Value {
    json!({"cpu": "16", "memory": "64Gi", "pods": "500"})
}

/// Creates namespace `ns` and its NamespaceOffloading with `spec`; waits for phase Ready and
/// returns the twin namespaces by provider.
async fn offload(client: &Client, ns: &str, spec: Value) -> BTreeMap<String, String> {
    create_namespace(client, ns).await;
    let api: Api<NamespaceOffloading> = Api::namespaced(client.clone(), ns);
    api.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "apiVersion": "tandem.dev/v1alpha1", "kind": "NamespaceOffloading",
            "metadata": {"name": names::OFFLOADING_NAME}, "spec": spec,
        }))
        .unwrap(),
    )
    .await
    .unwrap_or_else(|e| panic!("creating NamespaceOffloading {ns}: {e}"));
    until(&format!("NamespaceOffloading {ns} Ready"), WAIT, || async {
        let status = api.get(names::OFFLOADING_NAME).await.ok()?.status?;
        (status.phase.as_deref() == Some("Ready")).then(|| {
            status
                .remote_namespaces
                .into_iter()
                .map(|r| (r.cluster_id, r.namespace))
                .collect()
        })
    })
    .await
}

async fn create_namespace(client: &Client, ns: &str) {
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .unwrap_or_else(|e| panic!("creating namespace {ns}: {e}"));
}

/// Creates [`support::deployment`] `name` in `ns`.
async fn deploy(client: &Client, ns: &str, name: &str, replicas: i32) {
    let deployment: Deployment =
        serde_json::from_value(support::deployment(name, replicas)).unwrap();
    Api::<Deployment>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap_or_else(|e| panic!("creating Deployment {ns}/{name}: {e}"));
}

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

fn node_of(p: &Pod) -> Option<&str> {
    p.spec.as_ref()?.node_name.as_deref()
}

fn ip_of(p: &Pod) -> Option<&str> {
    p.status.as_ref()?.pod_ip.as_deref()
}

fn running_and_ready(p: &Pod) -> bool {
    let Some(s) = p.status.as_ref() else {
        return false;
    };
    s.phase.as_deref() == Some("Running")
        && ip_of(p).is_some()
        && s.conditions
            .as_ref()
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn in_cidr(ip: &str, cidr: ipnet::IpNet) -> bool {
    ip.parse::<IpAddr>().is_ok_and(|ip| cidr.contains(&ip))
}

/// Waits until the Deployment's `replicas` pods all run and are Ready; returns them.
async fn running(client: &Client, ns: &str, app: &str, replicas: usize) -> Vec<Pod> {
    until(
        &format!("{replicas} pods of {ns}/{app} Running and Ready"),
        WAIT,
        || async {
            let p = pods(client, ns, &format!("app={app}")).await;
            (p.len() == replicas && p.iter().all(running_and_ready)).then_some(p)
        },
    )
    .await
}

fn node_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[tokio::test]
async fn virtual_node_ready_within_5s_of_peering() {
    let consumer = Cluster::start("rome", "eu-south", 1).await;
    let provider = Cluster::start("milan", "eu-west", 1).await;
    let invite = support::invite(&provider, Duration::from_secs(3600)).await;
    let nodes: Api<Node> = Api::all(consumer.client.clone());
    let vn = names::virtual_node_name("milan");

    let start = tokio::time::Instant::now();
    tandem_admin::invite::accept(&consumer.client, &invite)
        .await
        .expect("accept invite");
    let deadline = Duration::from_secs(5).saturating_sub(start.elapsed());
    let node = until("virtual node tandem-milan Ready", deadline, || async {
        nodes.get_opt(&vn).await.ok().flatten().filter(node_ready)
    })
    .await;
    eprintln!("virtual node Ready {:?} after accept", start.elapsed());
    assert_eq!(
        node.labels()
            .get(names::NODE_TYPE_LABEL)
            .map(String::as_str),
        Some(names::VIRTUAL_NODE_TYPE)
    );
    // Its allocatable is what the provider grants (its default share), from the start.
    let allocatable = node.status.and_then(|s| s.allocatable).unwrap_or_default();
    let tenant = Api::<tandem_api::Tenant>::namespaced(
        provider.client.clone(),
        &names::tenant_namespace("rome"),
    )
    .get("rome")
    .await
    .expect("the consumer's Tenant on the provider");
    assert!(
        tenant.spec.grant.contains_key("cpu"),
        "{:?}",
        tenant.spec.grant
    );
    for (resource, quantity) in &tenant.spec.grant {
        assert_eq!(
            allocatable.get(resource),
            Some(quantity),
            "allocatable {resource} of the virtual node: {allocatable:?}"
        );
    }
}

/// An administrator who strips the virtual node of its type label and its NoExecute taint (by
/// mistake, or with a tool that rewrites labels) gets them back: the virtual kubelet finds its
/// node by the label, and the taint keeps pods that do not tolerate it off the provider. One who
/// deletes it gets it registered again, as a kubelet's node is.
#[tokio::test]
async fn a_virtual_node_stripped_or_deleted_by_hand_comes_back() {
    let consumer = Cluster::start("rome", "eu-south", 1).await;
    let provider = Cluster::start("milan", "eu-west", 1).await;
    peer_with(&consumer, &provider, grant(), None).await;
    let nodes: Api<Node> = Api::all(consumer.client.clone());
    let vn = names::virtual_node_name("milan");
    let ready = until("virtual node tandem-milan Ready", WAIT, || async {
        nodes.get_opt(&vn).await.ok().flatten().filter(node_ready)
    })
    .await;
    let ready_since = |n: &Node| {
        n.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
            .and_then(|c| c.last_transition_time.clone())
    };
    let marked = |n: &Node| {
        let labelled = n.labels().get(names::NODE_TYPE_LABEL).map(String::as_str)
            == Some(names::VIRTUAL_NODE_TYPE);
        let tainted = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|ts| {
                ts.iter()
                    .any(|t| t.key == names::VIRTUAL_NODE_TAINT && t.effect == "NoExecute")
            });
        labelled && tainted
    };
    let stripped = nodes
        .patch(
            &vn,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {names::NODE_TYPE_LABEL: null}},
                                 "spec": {"taints": null}}),
            ),
        )
        .await
        .expect("stripping the virtual node's label and taint");
    assert!(!marked(&stripped), "the premise: both are gone");
    let restored = until(
        "the label and the taint back, the node Ready",
        WAIT,
        || async {
            nodes
                .get_opt(&vn)
                .await
                .ok()
                .flatten()
                .filter(|n| marked(n) && node_ready(n))
        },
    )
    .await;
    // Put back, not made anew: Ready since the same time (a later one would read as an outage
    // to the virtual kubelet).
    assert_eq!(ready_since(&restored), ready_since(&ready));

    // Deleted by hand (`kubectl delete node`), it is registered again while the Peering stays.
    nodes
        .delete(&vn, &DeleteParams::default())
        .await
        .expect("deleting the virtual node");
    let old_uid = restored.metadata.uid.clone();
    let again = until("the virtual node registered again, Ready", WAIT, || async {
        nodes
            .get_opt(&vn)
            .await
            .ok()
            .flatten()
            .filter(|n| n.metadata.uid != old_uid && marked(n) && node_ready(n))
    })
    .await;
    assert!(again.metadata.deletion_timestamp.is_none());

    // Deleted by hand with its Peering deleted right after: the unpeering wins, and neither the
    // node nor its lease comes back.
    nodes
        .delete(&vn, &DeleteParams::default())
        .await
        .expect("deleting the virtual node again");
    let peerings: Api<Peering> = Api::all(consumer.client.clone());
    peerings
        .delete("milan", &DeleteParams::default())
        .await
        .expect("deleting the Peering");
    until("the Peering gone", WAIT, || async {
        peerings
            .get_opt("milan")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(consumer.client.clone(), "kube-node-lease");
    until("the virtual node's lease gone", WAIT, || async {
        leases.get_opt(&vn).await.ok()?.is_none().then_some(())
    })
    .await;
    // A task that made it again would do so within its next pass (the probe period, 0.5 s here).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        nodes.get_opt(&vn).await.unwrap().is_none(),
        "the virtual node came back after unpeering"
    );
}

/// The virtual node's NetworkUnavailable condition, as (status, reason, message).
fn network_condition(n: &Node) -> Option<(String, String, String)> {
    n.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "NetworkUnavailable")
        .map(|c| {
            (
                c.status.clone(),
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        })
}

/// With the Peering naming its gateway's status API, NetworkUnavailable follows the tunnel as
/// the gateway reports it (here the real status server of `tandem gateway`, fed a state).
#[tokio::test]
async fn network_unavailable_follows_the_gateway_tunnel() {
    use std::sync::{Arc, Mutex};
    use tandem_net::health::TunnelState;
    use tandem_net::status::{GatewayStatus, Metrics};

    let consumer = Cluster::start("rome", "eu-south", 1).await;
    let provider = Cluster::start("milan", "eu-west", 1).await;
    support::peer(&consumer, &provider).await;
    let nodes: Api<Node> = Api::all(consumer.client.clone());
    let vn = names::virtual_node_name("milan");
    let node = until("virtual node Ready", Duration::from_secs(10), || async {
        nodes.get_opt(&vn).await.ok().flatten().filter(node_ready)
    })
    .await;
    assert_eq!(
        network_condition(&node),
        None,
        "no gateway configured: no NetworkUnavailable condition"
    );

    let state = Arc::new(Mutex::new(TunnelState::Connecting));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let shown = state.clone();
    let server = tokio::spawn(tandem_net::status::serve(
        listener,
        Metrics::default(),
        Arc::new(move || {
            let state = *shown.lock().unwrap();
            GatewayStatus {
                interface: "tdm-milan".into(),
                state,
                rtt_ms: (state == TunnelState::Connected).then_some(1.5),
                last_handshake_seconds_ago: None,
                peer_endpoint: None,
                rx_bytes: 0,
                tx_bytes: 0,
            }
        }),
    ));
    let peerings: Api<Peering> = Api::all(consumer.client.clone());
    let set_gateway = |status: Value| {
        let peerings = peerings.clone();
        async move {
            peerings
                .patch(
                    "milan",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"gatewayStatus": status}})),
                )
                .await
                .unwrap();
        }
    };
    set_gateway(json!(addr)).await;

    let becomes = |status: &'static str, reason: &'static str| {
        let nodes = nodes.clone();
        let vn = vn.clone();
        async move {
            until(
                &format!("NetworkUnavailable={status} ({reason})"),
                Duration::from_secs(10),
                || async {
                    let n = nodes.get_opt(&vn).await.ok().flatten()?;
                    network_condition(&n).filter(|(s, r, _)| s == status && r == reason)
                },
            )
            .await
        }
    };
    let (_, _, message) = becomes("True", "TunnelConnecting").await;
    assert!(message.contains("provider milan"), "{message}");
    *state.lock().unwrap() = TunnelState::Connected;
    let (_, _, message) = becomes("False", "TunnelConnected").await;
    assert!(message.contains("RTT 1.5 ms"), "{message}");
    *state.lock().unwrap() = TunnelState::Error;
    becomes("True", "TunnelDown").await;
    // As in kube, the node lifecycle taints a node whose network is unavailable: no new pods.
    let has_network_taint = |n: &Node| {
        n.spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|ts| {
                ts.iter().any(|t| {
                    t.key == "node.kubernetes.io/network-unavailable" && t.effect == "NoSchedule"
                })
            })
    };
    until(
        "network-unavailable taint",
        Duration::from_secs(10),
        || async {
            nodes
                .get_opt(&vn)
                .await
                .ok()
                .flatten()
                .filter(has_network_taint)
        },
    )
    .await;
    // The gateway gone: the status API does not answer.
    server.abort();
    let _ = server.await;
    let (_, _, message) = becomes("True", "GatewayUnreachable").await;
    assert!(message.contains(&addr), "{message}");
    // Readiness is the provider's API, not the tunnel: the node stays Ready.
    let node = nodes.get(&vn).await.unwrap();
    assert!(node_ready(&node), "{:?}", node.status);

    // Unset: the condition goes.
    set_gateway(Value::Null).await;
    until(
        "NetworkUnavailable and its taint gone",
        Duration::from_secs(10),
        || async {
            let n = nodes.get_opt(&vn).await.ok().flatten()?;
            (network_condition(&n).is_none() && !has_network_taint(&n)).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn placement_per_strategy() {
    let consumer = Cluster::start("rome", "eu-south", 2).await;
    let provider = Cluster::start("milan", "eu-west", 2).await;
    let peering = peer_with(&consumer, &provider, grant(), None).await;
    let vn = names::virtual_node_name("milan");
    let local_nodes: BTreeSet<String> = consumer.lab.node_names().into_iter().collect();
    let (remote_view, _) = remote_pod_cidrs(&peering);

    let remote = offload(
        &consumer.client,
        "remote",
        json!({"podOffloadingStrategy": "Remote"}),
    )
    .await;
    let local = offload(
        &consumer.client,
        "local",
        json!({"podOffloadingStrategy": "Local"}),
    )
    .await;
    let mixed = offload(
        &consumer.client,
        "mixed",
        json!({"podOffloadingStrategy": "LocalAndRemote"}),
    )
    .await;
    create_namespace(&consumer.client, "plain").await;
    deploy(&consumer.client, "remote", "web", 30).await;
    deploy(&consumer.client, "local", "web", 6).await;
    deploy(&consumer.client, "mixed", "web", 9).await;
    deploy(&consumer.client, "plain", "web", 6).await;
    // Even pods that tolerate the virtual node's taint stay local in a namespace that is not
    // offloaded (no virtual kubelet would run them there).
    let tolerant: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "tolerant"},
        "spec": {
            "replicas": 6,
            "selector": {"matchLabels": {"app": "tolerant"}},
            "template": {
                "metadata": {"labels": {"app": "tolerant"}},
                "spec": {"containers": [{"name": "main", "image": "nginx"}],
                         "tolerations": [{"operator": "Exists"}]},
            },
        },
    }))
    .unwrap();
    Api::<Deployment>::namespaced(consumer.client.clone(), "plain")
        .create(&PostParams::default(), &tolerant)
        .await
        .unwrap();

    // Remote: all 30 on the virtual node, Running+Ready, IPs in our view of the provider's pods;
    // 30 Running pods in the twin namespace.
    let twin = &remote["milan"];
    let on_provider = until("30 Running pods in the twin namespace", WAIT, || async {
        let p = pods(&provider.client, twin, "app=web").await;
        (p.len() == 30 && p.iter().all(running_and_ready)).then_some(p)
    })
    .await;
    let mut remote_pods = running(&consumer.client, "remote", "web", 30).await;
    // The status may lag the provider's a moment: wait for the consumer-view IPs.
    if !remote_pods
        .iter()
        .all(|p| ip_of(p).is_some_and(|ip| in_cidr(ip, remote_view)))
    {
        remote_pods = until("consumer-view IPs of remote pods", WAIT, || async {
            let p = pods(&consumer.client, "remote", "app=web").await;
            p.iter()
                .all(|p| running_and_ready(p) && in_cidr(ip_of(p).unwrap(), remote_view))
                .then_some(p)
        })
        .await;
    }
    for p in &remote_pods {
        assert_eq!(node_of(p), Some(vn.as_str()), "{}", p.name_any());
        let ip = ip_of(p).unwrap();
        assert!(
            in_cidr(ip, remote_view),
            "{}: {ip} not in {remote_view}",
            p.name_any()
        );
    }
    assert_eq!(on_provider.len(), 30);

    // Local: every pod on a local node, none on the provider.
    for p in running(&consumer.client, "local", "web", 6).await {
        let node = node_of(&p).unwrap_or_default();
        assert!(local_nodes.contains(node), "{} on {node}", p.name_any());
    }
    if let Some(twin) = local.get("milan") {
        assert!(pods(&provider.client, twin, "").await.is_empty());
    }

    // LocalAndRemote: on both local nodes and the virtual node.
    let mixed_pods = running(&consumer.client, "mixed", "web", 9).await;
    let used: BTreeSet<&str> = mixed_pods.iter().filter_map(node_of).collect();
    assert!(used.contains(vn.as_str()), "mixed pods on {used:?}");
    assert!(
        used.iter().any(|n| local_nodes.contains(*n)),
        "mixed pods on {used:?}"
    );
    let mixed_remote = mixed_pods
        .iter()
        .filter(|p| node_of(p) == Some(vn.as_str()))
        .count();
    until(
        "the mixed pods on the virtual node running in their twin namespace",
        WAIT,
        || async {
            let p = pods(&provider.client, &mixed["milan"], "app=web").await;
            (p.len() == mixed_remote && p.iter().all(running_and_ready)).then_some(())
        },
    )
    .await;

    // Not offloaded: never on the virtual node.
    for p in running(&consumer.client, "plain", "web", 6).await {
        let node = node_of(&p).unwrap_or_default();
        assert!(local_nodes.contains(node), "{} on {node}", p.name_any());
    }
    for p in running(&consumer.client, "plain", "tolerant", 6).await {
        let node = node_of(&p).unwrap_or_default();
        assert!(
            local_nodes.contains(node),
            "tolerating {} on {node}",
            p.name_any()
        );
    }

    // The provider runs exactly the offloaded pods.
    let all: Vec<Pod> = Api::<Pod>::all(provider.client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let mut per_ns: BTreeMap<String, usize> = BTreeMap::new();
    for p in all
        .iter()
        .filter(|p| p.namespace().as_deref() != Some(names::SYSTEM_NAMESPACE))
    {
        *per_ns.entry(p.namespace().unwrap_or_default()).or_default() += 1;
    }
    let want: BTreeMap<String, usize> =
        [(twin.clone(), 30), (mixed["milan"].clone(), mixed_remote)]
            .into_iter()
            .collect();
    assert_eq!(per_ns, want, "pods on the provider by namespace");
}

#[tokio::test]
async fn service_has_endpoints_in_both_clusters() {
    let consumer = Cluster::start("rome", "eu-south", 1).await;
    let provider = Cluster::start("milan", "eu-west", 1).await;
    let peering = peer_with(&consumer, &provider, grant(), None).await;
    let vn = names::virtual_node_name("milan");
    let (remote_view, remote_real) = remote_pod_cidrs(&peering);
    let ours: ipnet::IpNet = consumer.lab.config.pod_cidr.parse().unwrap();
    let ours_there: ipnet::IpNet = peering
        .status
        .as_ref()
        .and_then(|s| s.network.as_ref())
        .and_then(|n| n.local_pod_cidr_in_remote.as_deref())
        .expect("Peering.status.network.localPodCidrInRemote")
        .parse()
        .unwrap();

    let twin = offload(
        &consumer.client,
        "shop",
        json!({"podOffloadingStrategy": "LocalAndRemote"}),
    )
    .await["milan"]
        .clone();
    deploy(&consumer.client, "shop", "web", 6).await;
    Api::<Service>::namespaced(consumer.client.clone(), "shop")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": {
                "selector": {"app": "web"},
                "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let consumer_pods = running(&consumer.client, "shop", "web", 6).await;
    let (remote, local): (Vec<&Pod>, Vec<&Pod>) = consumer_pods
        .iter()
        .partition(|p| node_of(p) == Some(vn.as_str()));
    assert!(
        !remote.is_empty() && !local.is_empty(),
        "pods on both sides: {} remote, {} local",
        remote.len(),
        local.len()
    );
    let real_ips: BTreeMap<String, String> = until(
        "the offloaded pods running on the provider",
        WAIT,
        || async {
            let p = pods(&provider.client, &twin, "app=web").await;
            (p.len() == remote.len() && p.iter().all(running_and_ready)).then(|| {
                p.iter()
                    .map(|p| (p.name_any(), ip_of(p).unwrap().to_string()))
                    .collect()
            })
        },
    )
    .await;

    // The consumer's view: local pods' own IPs, offloaded pods' IPs in our view of the provider's.
    let want_here: BTreeSet<String> =
        until("consumer-view IPs of the offloaded pods", WAIT, || async {
            let p = pods(&consumer.client, "shop", "app=web").await;
            let ips: Option<BTreeSet<String>> =
                p.iter().map(|p| ip_of(p).map(str::to_string)).collect();
            let ips = ips?;
            let views_ok = p.iter().all(|p| {
                let ip = ip_of(p).unwrap();
                if node_of(p) == Some(vn.as_str()) {
                    real_ips
                        .get(&p.name_any())
                        .is_some_and(|real| translate(real, remote_real, remote_view) == ip)
                } else {
                    in_cidr(ip, ours)
                }
            });
            (p.len() == 6 && views_ok).then_some(ips)
        })
        .await;
    until(
        "the consumer's EndpointSlices list all 6 pods",
        WAIT,
        || async {
            (support::endpoint_addresses(&consumer.client, "shop", "web").await == want_here)
                .then_some(())
        },
    )
    .await;

    // The provider's view: offloaded pods' real IPs, local pods' IPs translated into the CIDR
    // the provider's IPAM maps our pod CIDR to.
    let want_there: BTreeSet<String> = real_ips
        .values()
        .cloned()
        .chain(
            local
                .iter()
                .map(|p| translate(ip_of(p).unwrap(), ours, ours_there)),
        )
        .collect();
    assert_eq!(want_there.len(), want_here.len());
    until(
        "the reflected Service's EndpointSlices in the provider's view",
        WAIT,
        || async {
            let svc = Api::<Service>::namespaced(provider.client.clone(), &twin)
                .get_opt("web")
                .await
                .ok()??;
            let got = support::endpoint_addresses(&provider.client, &twin, &svc.name_any()).await;
            (got == want_there).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn cluster_selector_sends_pods_only_to_the_selected_provider() {
    let consumer = Cluster::start("rome", "eu-south", 1).await;
    let dublin = Cluster::start("dublin", "eu-west", 1).await;
    let virginia = Cluster::start("virginia", "us-east", 1).await;
    peer_with(&consumer, &dublin, grant(), None).await;
    peer_with(&consumer, &virginia, grant(), None).await;
    // Both virtual nodes Ready, so that the selector really has a choice.
    let nodes: Api<Node> = Api::all(consumer.client.clone());
    for provider in ["dublin", "virginia"] {
        until(
            &format!("virtual node of {provider} Ready"),
            WAIT,
            || async {
                nodes
                    .get_opt(&names::virtual_node_name(provider))
                    .await
                    .ok()
                    .flatten()
                    .filter(node_ready)
            },
        )
        .await;
    }

    let twins = offload(
        &consumer.client,
        "geo",
        json!({"podOffloadingStrategy": "Remote", "clusterSelector": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "topology.kubernetes.io/region", "operator": "In", "values": ["us-east"]}]}]}}),
    )
    .await;
    assert_eq!(twins.keys().collect::<Vec<_>>(), ["virginia"], "{twins:?}");
    deploy(&consumer.client, "geo", "web", 10).await;
    let vn = names::virtual_node_name("virginia");
    for p in running(&consumer.client, "geo", "web", 10).await {
        assert_eq!(node_of(&p), Some(vn.as_str()), "{}", p.name_any());
    }
    until("10 pods running in virginia", WAIT, || async {
        let p = pods(&virginia.client, &twins["virginia"], "app=web").await;
        (p.len() == 10 && p.iter().all(running_and_ready)).then_some(())
    })
    .await;

    // Dublin: no twin namespace, no shadow pods, no pods of the consumer.
    let dublin_ns: Vec<String> = Api::<Namespace>::all(dublin.client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|n| n.name_any())
        .collect();
    assert!(
        !dublin_ns.contains(&"geo-rome".to_string()),
        "{dublin_ns:?}"
    );
    assert!(!dublin_ns.contains(&"geo".to_string()), "{dublin_ns:?}");
    let twin_namespaces = Api::<Namespace>::all(dublin.client.clone())
        .list(&ListParams::default().labels(names::TWIN_NAMESPACE_LABEL))
        .await
        .unwrap()
        .items;
    assert!(twin_namespaces.is_empty(), "{twin_namespaces:?}");
    let shadows = Api::<tandem_api::ShadowPod>::all(dublin.client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert!(shadows.is_empty(), "{shadows:?}");
    let dublin_pods: Vec<String> = Api::<Pod>::all(dublin.client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|p| p.namespace().as_deref() != Some(names::SYSTEM_NAMESPACE))
        .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
        .collect();
    assert!(dublin_pods.is_empty(), "{dublin_pods:?}");
}

#[tokio::test]
async fn unpeer_leaves_nothing_tandem_owned() {
    let consumer = Cluster::start("rome", "eu-south", 1).await;
    let provider = Cluster::start("milan", "eu-west", 1).await;
    // The baseline is the install itself: wait for the controller's own objects first.
    for c in [&consumer, &provider] {
        let hooks: Api<MutatingWebhookConfiguration> = Api::all(c.client.clone());
        until("the pod-placement webhook registered", WAIT, || async {
            hooks
                .get_opt(tandem_controller::consumer::webhook::WEBHOOK_CONFIGURATION)
                .await
                .ok()
                .flatten()
        })
        .await;
    }
    let consumer_before = tandem_owned(&consumer.client).await;
    let provider_before = tandem_owned(&provider.client).await;

    // A full scenario: peer, offload, a Deployment + Service + ConfigMap + Secret reflected.
    peer_with(&consumer, &provider, grant(), None).await;
    let twin = offload(
        &consumer.client,
        "shop",
        json!({"podOffloadingStrategy": "Remote"}),
    )
    .await["milan"]
        .clone();
    deploy(&consumer.client, "shop", "web", 4).await;
    let objects: [(&str, Value); 3] = [
        (
            "services",
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
                   "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}}),
        ),
        (
            "configmaps",
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"},
                   "data": {"color": "blue"}}),
        ),
        (
            "secrets",
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
                   "stringData": {"password": "s3cret"}}),
        ),
    ];
    for (_, obj) in &objects {
        let ar = match obj["kind"].as_str().unwrap() {
            "Service" => ApiResource::erase::<Service>(&()),
            "ConfigMap" => ApiResource::erase::<ConfigMap>(&()),
            _ => ApiResource::erase::<Secret>(&()),
        };
        Api::<DynamicObject>::namespaced_with(consumer.client.clone(), "shop", &ar)
            .create(
                &PostParams::default(),
                &serde_json::from_value(obj.clone()).unwrap(),
            )
            .await
            .unwrap_or_else(|e| panic!("creating {obj}: {e}"));
    }
    let vn = names::virtual_node_name("milan");
    for p in running(&consumer.client, "shop", "web", 4).await {
        assert_eq!(node_of(&p), Some(vn.as_str()));
    }
    until(
        "everything reflected in the twin namespace",
        WAIT,
        || async {
            let ok = pods(&provider.client, &twin, "app=web").await.len() == 4
                && Api::<Service>::namespaced(provider.client.clone(), &twin)
                    .get_opt("web")
                    .await
                    .ok()??
                    .name_any()
                    == "web"
                && Api::<ConfigMap>::namespaced(provider.client.clone(), &twin)
                    .get_opt("settings")
                    .await
                    .ok()?
                    .is_some()
                && Api::<Secret>::namespaced(provider.client.clone(), &twin)
                    .get_opt("creds")
                    .await
                    .ok()?
                    .is_some()
                && !support::endpoint_addresses(&provider.client, &twin, "web")
                    .await
                    .is_empty();
            ok.then_some(())
        },
    )
    .await;

    // The listing sees what the peering made (so that finding nothing later means something).
    let consumer_during = tandem_owned(&consumer.client).await;
    let provider_during = tandem_owned(&provider.client).await;
    for o in [
        "Node /tandem-milan",
        "Lease kube-node-lease/tandem-milan",
        "Peering /milan",
        "Namespace /tandem-tenant-milan",
        "Secret tandem-tenant-milan/tandem-identity-milan",
    ] {
        assert!(consumer_during.contains(o), "{o} in {consumer_during:#?}");
    }
    for o in [
        format!("Namespace /{twin}"),
        "Namespace /tandem-tenant-rome".to_string(),
        "Tenant tandem-tenant-rome/rome".to_string(),
        "RemoteNamespace tandem-tenant-rome/shop".to_string(),
        format!("ConfigMap {twin}/settings"),
        format!("Secret {twin}/creds"),
        format!("Service {twin}/web"),
    ] {
        assert!(provider_during.contains(&o), "{o} in {provider_during:#?}");
    }
    for kind in ["ShadowPod", "Pod", "EndpointSlice"] {
        assert!(
            provider_during
                .iter()
                .any(|o| o.starts_with(&format!("{kind} {twin}/"))),
            "a {kind} in {provider_during:#?}"
        );
    }
    // Unpeer with the workload still there.
    tandem_admin::invite::unpeer(&consumer.client, "milan", false, WAIT, &mut |_| {})
        .await
        .expect("unpeer");

    // What the user made stays (the offloading of `shop`, which labels its namespace), with no
    // twin namespace left in its status; nothing else of the peering is left on either side.
    let user_made: BTreeSet<String> = [
        format!("NamespaceOffloading shop/{}", names::OFFLOADING_NAME),
        "Namespace /shop".to_string(),
    ]
    .into();
    let consumer_expected: BTreeSet<String> = consumer_before.union(&user_made).cloned().collect();
    until_owned(&consumer, &consumer_expected, "after unpeer", WAIT).await;
    until_owned(&provider, &provider_before, "after unpeer", WAIT).await;
    let nso = Api::<NamespaceOffloading>::namespaced(consumer.client.clone(), "shop")
        .get(names::OFFLOADING_NAME)
        .await
        .unwrap();
    let remote_namespaces = nso.status.map(|s| s.remote_namespaces).unwrap_or_default();
    assert!(remote_namespaces.is_empty(), "{remote_namespaces:?}");
    assert!(
        Api::<Node>::all(consumer.client.clone())
            .get_opt(&vn)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        Api::<Peering>::all(consumer.client.clone())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    // The offloaded pods are gone from the virtual node (their replacements may stay Pending).
    until("no pod left on the virtual node", WAIT, || async {
        let p = Api::<Pod>::all(consumer.client.clone())
            .list(&ListParams::default())
            .await
            .ok()?
            .items;
        p.iter()
            .all(|p| node_of(p) != Some(vn.as_str()))
            .then_some(())
    })
    .await;
}
