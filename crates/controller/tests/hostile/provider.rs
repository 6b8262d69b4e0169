//! The hostile provider: its status reports are bounded on the consumer. A provider that
//! reports pod IPs outside the pod CIDR it was granted (the consumer's own nodes, its Service
//! range, loopback, the metadata address, garbage) must not steer the consumer's Services
//! there: the consumer ignores those IPs and says so in a pod condition.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tandem_api::names;

use super::support::{self, Cluster, until};

const WAIT: Duration = Duration::from_secs(60);
const CONDITION: &str = "tandem.dev/PodIPsInGrant";

fn pod_ip(p: &Pod) -> Option<String> {
    p.status.as_ref()?.pod_ip.clone()
}

fn pod_ips(p: &Pod) -> Vec<String> {
    p.status
        .as_ref()
        .and_then(|s| s.pod_ips.as_ref())
        .map(|ips| ips.iter().map(|i| i.ip.clone()).collect())
        .unwrap_or_default()
}

/// The message of the consumer pod's PodIPsInGrant=False condition, if it has one.
fn outside_grant(p: &Pod) -> Option<String> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == CONDITION && c.status == "False")
        .map(|c| c.message.clone().unwrap_or_default())
}

async fn create_pod(client: &Client, doc: Value) {
    let pod: Pod = serde_json::from_value(doc).unwrap();
    Api::<Pod>::namespaced(client.clone(), "shop")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("create pod {}: {e}", pod.name_any()));
}

/// Tries 7 distinct attacks by a provider on what it reports of a consumer's pod: its pod IP
/// set to the consumer's node, to the consumer's `kubernetes` Service, to loopback, to the
/// cloud metadata address, to garbage, to the consumer's own pod (which the prefix NAT moves
/// out of the consumer's range), and a second pod IP outside its range beside an honest one.
/// After each, the consumer's Service lists neither the forged address nor anything outside
/// its own pods and the provider's granted range, and its own pod is as it was.
#[tokio::test]
async fn a_hostile_providers_pod_ips_outside_its_grant_are_ignored() {
    let provider = Cluster::start("odda", "eu-north", 1).await;
    let consumer = Cluster::start("alta", "eu-north", 1).await;
    let peering = support::peer(&consumer, &provider).await;
    let (view, real_cidr) = support::remote_pod_cidrs(&peering);
    let ours: ipnet::IpNet = consumer.lab.config.pod_cidr.parse().unwrap();
    let twin = support::offload(&consumer, &provider, "shop", "LocalAndRemote").await;

    let local_node = Api::<Node>::all(consumer.client.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|n| !n.name_any().starts_with("tandem-"))
        .expect("the consumer's own node");
    let node_ip = local_node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"))
        .map(|a| a.address.clone())
        .expect("the node's InternalIP");
    let api_ip = Api::<Service>::namespaced(consumer.client.clone(), "default")
        .get("kubernetes")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("the kubernetes Service's cluster IP");

    // One pod of the consumer's own, one offloaded, behind one Service.
    let container = json!([{"name": "main", "image": "nginx", "ports": [{"containerPort": 8080}],
                            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]);
    create_pod(
        &consumer.client,
        json!({"metadata": {"name": "web-local", "labels": {"app": "web"}},
        "spec": {"containers": container,
                 "nodeSelector": {"kubernetes.io/hostname": local_node.name_any()}}}),
    )
    .await;
    create_pod(
        &consumer.client,
        json!({"metadata": {"name": "web-remote", "labels": {"app": "web"}},
        "spec": {"containers": container,
                 "tolerations": [{"key": names::VIRTUAL_NODE_TAINT, "operator": "Exists",
                                  "effect": "NoExecute"}],
                 "nodeSelector": {names::NODE_TYPE_LABEL: names::VIRTUAL_NODE_TYPE}}}),
    )
    .await;
    Api::<Service>::namespaced(consumer.client.clone(), "shop")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": {
                "selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(consumer.client.clone(), "shop");
    let (local_ip, remote_ip) = until("both pods running with their IPs", WAIT, || async {
        let local = pod_ip(&pods.get("web-local").await.ok()?)?;
        let remote = pod_ip(&pods.get("web-remote").await.ok()?)?;
        (ours.contains(&local.parse::<std::net::IpAddr>().ok()?)
            && view.contains(&remote.parse::<std::net::IpAddr>().ok()?))
        .then_some((local, remote))
    })
    .await;
    let honest: BTreeSet<String> = [local_ip.clone(), remote_ip.clone()].into();
    until("the Service lists both pods", WAIT, || async {
        (support::endpoint_addresses(&consumer.client, "shop", "web").await == honest).then_some(())
    })
    .await;

    // The provider turns hostile: its kubelet stops correcting the real pod's status (the node
    // is switched off), and its admin writes what it likes there.
    let real_pods: Api<Pod> = Api::namespaced(provider.client.clone(), &twin);
    let real = real_pods.get("web-remote").await.expect("the real pod");
    let real_ip = pod_ip(&real).expect("the real pod's IP");
    let real_node = real
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap();
    provider.lab.power.power_off(&real_node);
    // The kubelet notices between two of its steps: let a step under way end.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let forge = |ips: Vec<&str>| {
        json!({"status": {"podIP": ips[0], "podIPs": ips.iter().map(|ip| json!({"ip": ip}))
                                                          .collect::<Vec<_>>()}})
    };
    let outside: [(&str, &str); 5] = [
        ("the consumer's node", node_ip.as_str()),
        ("the consumer's kubernetes Service", api_ip.as_str()),
        ("loopback", "127.0.0.1"),
        ("the metadata address", "169.254.169.254"),
        ("garbage", "not-an-ip"),
    ];
    for (what, forged) in outside {
        real_pods
            .patch_status(
                "web-remote",
                &PatchParams::default(),
                &Patch::Merge(forge(vec![forged])),
            )
            .await
            .unwrap();
        // The condition and the addresses are written together: one snapshot shows both.
        let (message, p) = until(
            &format!("the consumer ignoring a pod IP at {what}"),
            WAIT,
            || async {
                let p = pods.get("web-remote").await.ok()?;
                outside_grant(&p).map(|m| (m, p))
            },
        )
        .await;
        assert!(
            message.contains(forged) && message.contains(&real_cidr.to_string()),
            "the condition names the forged IP and the granted range ({what}): {message}"
        );
        assert_eq!(
            pod_ip(&p),
            None,
            "{what}: no pod IP rather than a forged one"
        );
        assert!(pod_ips(&p).is_empty(), "{what}: {:?}", pod_ips(&p));
        // The Service keeps the consumer's own pod and drops the one without an address.
        let want: BTreeSet<String> = [local_ip.clone()].into();
        until(&format!("the Service without {what}"), WAIT, || async {
            (support::endpoint_addresses(&consumer.client, "shop", "web").await == want)
                .then_some(())
        })
        .await;
        let own = pods.get("web-local").await.unwrap();
        assert_eq!(pod_ip(&own).as_deref(), Some(local_ip.as_str()), "{what}");

        // Honest again: the pod is back in the Service under its translated address.
        real_pods
            .patch_status(
                "web-remote",
                &PatchParams::default(),
                &Patch::Merge(forge(vec![&real_ip])),
            )
            .await
            .unwrap();
        until(
            &format!("the honest IP back after {what}"),
            WAIT,
            || async {
                let p = pods.get("web-remote").await.ok()?;
                (outside_grant(&p).is_none() && pod_ip(&p).as_deref() == Some(remote_ip.as_str()))
                    .then_some(())
            },
        )
        .await;
    }

    // The consumer's own pod's address: inside the range the provider was granted (the two
    // clusters' pod CIDRs overlap), so the prefix NAT moves it into the consumer's view of the
    // provider — never onto the consumer's own pod.
    assert!(
        real_cidr.contains(&local_ip.parse::<std::net::IpAddr>().unwrap()),
        "the lab's pod CIDRs no longer overlap ({ours} and {real_cidr}): this attack needs another"
    );
    real_pods
        .patch_status(
            "web-remote",
            &PatchParams::default(),
            &Patch::Merge(forge(vec![&local_ip])),
        )
        .await
        .unwrap();
    let moved = support::translate(&local_ip, real_cidr, view);
    until(
        "the consumer's own pod IP seen as the provider's",
        WAIT,
        || async {
            let p = pods.get("web-remote").await.ok()?;
            (pod_ip(&p).as_deref() == Some(moved.as_str())).then_some(())
        },
    )
    .await;
    let want: BTreeSet<String> = [local_ip.clone(), moved.clone()].into();
    until(
        "the Service with the translated address, not the own pod's twice",
        WAIT,
        || async {
            (support::endpoint_addresses(&consumer.client, "shop", "web").await == want)
                .then_some(())
        },
    )
    .await;

    // An honest IP beside a forged one: the forged one is dropped, the honest one kept.
    real_pods
        .patch_status(
            "web-remote",
            &PatchParams::default(),
            &Patch::Merge(forge(vec![&real_ip, &node_ip])),
        )
        .await
        .unwrap();
    let p = until("the second pod IP ignored", WAIT, || async {
        let p = pods.get("web-remote").await.ok()?;
        outside_grant(&p).is_some().then_some(p)
    })
    .await;
    assert_eq!(pod_ip(&p).as_deref(), Some(remote_ip.as_str()));
    assert_eq!(pod_ips(&p), vec![remote_ip.clone()]);
    until("the Service with the honest address only", WAIT, || async {
        (support::endpoint_addresses(&consumer.client, "shop", "web").await == honest).then_some(())
    })
    .await;
    provider.lab.power.power_on(&real_node);
}

/// A provider that names another consumer pod in a real pod's origin annotation (the UID the
/// consumer's virtual kubelet learns each real pod's consumer pod from) does not get that real
/// pod's Events put on the other pod: the Events of the real pod `web-a` land on the consumer's
/// `web-a`, under its own UID, never under `web-b`'s.
#[tokio::test]
async fn a_hostile_providers_origin_annotation_moves_no_event_to_another_pod() {
    let provider = Cluster::start("odda", "eu-north", 1).await;
    let consumer = Cluster::start("alta", "eu-north", 1).await;
    support::peer(&consumer, &provider).await;
    let twin = support::offload(&consumer, &provider, "shop", "LocalAndRemote").await;
    for name in ["web-a", "web-b"] {
        create_pod(
            &consumer.client,
            json!({"metadata": {"name": name},
            "spec": {"containers": [{"name": "main", "image": "nginx"}],
                     "tolerations": [{"key": names::VIRTUAL_NODE_TAINT, "operator": "Exists",
                                      "effect": "NoExecute"}],
                     "nodeSelector": {names::NODE_TYPE_LABEL: names::VIRTUAL_NODE_TYPE}}}),
        )
        .await;
    }
    let pods: Api<Pod> = Api::namespaced(consumer.client.clone(), "shop");
    let real_pods: Api<Pod> = Api::namespaced(provider.client.clone(), &twin);
    let running = |api: Api<Pod>, name: &'static str| async move {
        until(&format!("{name} Running"), WAIT, || async {
            let p = api.get(name).await.ok()?;
            let phase = p.status.as_ref()?.phase.clone();
            (phase.as_deref() == Some("Running")).then_some(p.uid()?)
        })
        .await
    };
    let uid_a = running(pods.clone(), "web-a").await;
    let uid_b = running(pods.clone(), "web-b").await;
    let real_a = running(real_pods.clone(), "web-a").await;

    // The provider's admin rewrites the real pod's origin to web-b's UID, then records an Event
    // of that real pod, named by its UID as kubelet does.
    let forged =
        json!({"metadata": {"annotations": {tandem_core::shadow::ORIGIN_UID_ANNOTATION: uid_b}}});
    real_pods
        .patch("web-a", &PatchParams::default(), &Patch::Merge(forged))
        .await
        .unwrap();
    // The consumer's watch of the real pods sees the change first (the Event comes later).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let event: k8s_openapi::api::core::v1::Event = serde_json::from_value(json!({
        "metadata": {"name": "web-a.forged"},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": "web-a",
                           "namespace": twin, "uid": real_a},
        "reason": "Forged", "message": "whose pod is this", "type": "Warning",
        "count": 1, "source": {"component": "kubelet"}}))
    .unwrap();
    Api::namespaced(provider.client.clone(), &twin)
        .create(&PostParams::default(), &event)
        .await
        .unwrap();

    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(consumer.client.clone(), "shop");
    let reflected = until("the forged Event reflected", WAIT, || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("Forged"))
    })
    .await;
    assert_eq!(
        reflected.involved_object.uid.as_deref(),
        Some(uid_a.as_str()),
        "the Event names web-a by its own UID, not web-b's ({uid_b}): {:?}",
        reflected.involved_object
    );
    assert_eq!(reflected.involved_object.name.as_deref(), Some("web-a"));
}
