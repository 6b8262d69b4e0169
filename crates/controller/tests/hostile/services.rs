//! Services, EndpointSlices and claims a hostile consumer writes in its twin namespaces with
//! its peer identity: the provider's `peer-writes.tandem.dev` webhook refuses each one that
//! would turn the provider's ports, network or storage against it, naming the rule; what honest
//! reflection writes still passes, and the provider's admin is not held to the peer's rules.
//!
//! Attacks (18): Services of type NodePort, LoadBalancer and ExternalName, `externalIPs`;
//! EndpointSlices pointing at the provider's own pod, a node, the metadata
//! address, loopback, and by FQDN; claims with `storageClassName: ""`, a class not offered,
//! a chosen `volumeName`, a `selector`, a `dataSource`, and storage beyond the grant summed
//! over two twins; a Service in a namespace that is not its twin; `deletecollection` on the
//! twin's Secrets; and an ExternalName Service reflected by the consumer itself.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tandem_api::{Tenant, names};

use crate::support::{self, Cluster, until};

/// Creates `doc` (kind from its `kind`) in `ns` as `client`: Err(message) when refused.
async fn create(client: &Client, ns: &str, doc: Value) -> Result<(), String> {
    let pp = PostParams::default();
    let result = match doc["kind"].as_str().unwrap() {
        "Service" => Api::<Service>::namespaced(client.clone(), ns)
            .create(&pp, &serde_json::from_value(doc).unwrap())
            .await
            .map(drop),
        "EndpointSlice" => Api::<EndpointSlice>::namespaced(client.clone(), ns)
            .create(&pp, &serde_json::from_value(doc).unwrap())
            .await
            .map(drop),
        "PersistentVolumeClaim" => Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
            .create(&pp, &serde_json::from_value(doc).unwrap())
            .await
            .map(drop),
        other => panic!("no {other} here"),
    };
    result.map_err(|e| e.to_string())
}

fn service(name: &str, spec: Value) -> Value {
    let mut spec = spec;
    spec["ports"] = json!([{"name": "http", "port": 80, "protocol": "TCP"}]);
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec})
}

fn slice(name: &str, address_type: &str, addresses: &[&str]) -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": name, "labels": {"kubernetes.io/service-name": "web"}},
           "addressType": address_type,
           "endpoints": [{"addresses": addresses, "conditions": {"ready": true}}],
           "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]})
}

fn claim(name: &str, size: &str, extra: Value) -> Value {
    let mut spec = json!({"accessModes": ["ReadWriteOnce"],
                          "resources": {"requests": {"storage": size}}});
    for (k, v) in extra.as_object().into_iter().flatten() {
        spec[k] = v.clone();
    }
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"name": name}, "spec": spec})
}

#[track_caller]
fn assert_refused(result: Result<(), String>, rule: &str, what: &str) {
    match result {
        Err(m) if m.contains(&format!("refused by rule {rule}:")) => {}
        other => panic!("{what}: want a refusal by rule {rule}, got {other:?}"),
    }
}

#[tokio::test]
async fn a_consumer_cannot_open_the_providers_ports_or_reach_inside_it_through_services_and_claims()
{
    let provider = Cluster::start("chur", "eu-central", 1).await;
    let mut consumer = Cluster::start("thun", "eu-central", 1).await;
    support::peer(&consumer, &provider).await;
    let twin = support::offload_remote(&consumer, &provider, "shop").await;
    let blog = support::offload_remote(&consumer, &provider, "blog").await;
    let admin = provider.client.clone();

    // Honest reflection meets the provider's refusal: the consumer's own ExternalName Service
    // is not reflected, and the consumer is told so on it.
    let local: Api<Service> = Api::namespaced(consumer.client.clone(), "shop");
    local
        .create(
            &PostParams::default(),
            &serde_json::from_value(service(
                "upstream",
                json!({"type": "ExternalName", "externalName": "db.example.com"}),
            ))
            .unwrap(),
        )
        .await
        .unwrap();
    let events: Api<Event> = Api::namespaced(consumer.client.clone(), "shop");
    let said = until(
        "the consumer told that its ExternalName Service is not reflected",
        Duration::from_secs(60),
        || async {
            events
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some("NotReflected")
                        && e.involved_object.name.as_deref() == Some("upstream")
                })
                .and_then(|e| e.message)
        },
    )
    .await;
    assert!(
        said.contains("refused by rule services: type ExternalName"),
        "{said}"
    );
    let reflected: Api<Service> = Api::namespaced(admin.clone(), &twin);
    assert!(reflected.get_opt("upstream").await.unwrap().is_none());

    let peer = support::peer_client(&consumer, &provider).await;
    consumer.kill_controller();

    // The provider's own workload, and what a peer could want to reach.
    let own: Api<Pod> = Api::namespaced(admin.clone(), "default");
    own.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "provider-own"},
            "spec": {"containers": [{"name": "db", "image": "postgres"}]}}))
        .unwrap(),
    )
    .await
    .unwrap();
    let own_ip = until(
        "the provider's pod has an IP",
        Duration::from_secs(30),
        || async { own.get("provider-own").await.ok()?.status?.pod_ip },
    )
    .await;
    let node_ip = Api::<Node>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .flat_map(|n| {
            n.status
                .clone()
                .unwrap_or_default()
                .addresses
                .unwrap_or_default()
        })
        .find(|a| a.type_ == "InternalIP")
        .map(|a| a.address)
        .expect("a node address");

    // Services: ClusterIP only.
    for (name, spec, what) in [
        ("np", json!({"type": "NodePort"}), "a NodePort Service"),
        (
            "lb",
            json!({"type": "LoadBalancer"}),
            "a LoadBalancer Service",
        ),
        (
            "en",
            json!({"type": "ExternalName", "externalName": "kubernetes.default.svc"}),
            "an ExternalName Service",
        ),
        (
            "eip",
            json!({"externalIPs": ["203.0.113.7"]}),
            "externalIPs",
        ),
    ] {
        assert_refused(
            create(&peer, &twin, service(name, spec)).await,
            "services",
            what,
        );
    }
    create(&peer, &twin, service("web", json!({})))
        .await
        .expect("a ClusterIP Service, as reflection writes it");

    // EndpointSlices: the consumer's ranges and its own pods only.
    for (name, address_type, address, what) in [
        ("to-own", "IPv4", own_ip.as_str(), "the provider's own pod"),
        (
            "to-node",
            "IPv4",
            node_ip.as_str(),
            "a node of the provider",
        ),
        (
            "to-metadata",
            "IPv4",
            "169.254.169.254",
            "the metadata address",
        ),
        ("to-loopback", "IPv4", "127.0.0.1", "loopback"),
        (
            "to-name",
            "FQDN",
            "kubernetes.default.svc.cluster.local",
            "a name",
        ),
    ] {
        assert_refused(
            create(&peer, &twin, slice(name, address_type, &[address])).await,
            "endpoint-slices",
            what,
        );
    }
    // Its own pod, made from its ShadowPod, may be an endpoint.
    let shadows: Api<tandem_api::ShadowPod> = Api::namespaced(peer.clone(), &twin);
    shadows
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"apiVersion": "tandem.dev/v1alpha1", "kind": "ShadowPod",
                "metadata": {"name": "web-1"},
                "spec": {"labels": {"app": "web"}, "pod": {"containers": [{"name": "app", "image": "nginx"}]}}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let twin_pods: Api<Pod> = Api::namespaced(admin.clone(), &twin);
    let web_ip = until(
        "the real pod of web-1 has an IP",
        Duration::from_secs(30),
        || async { twin_pods.get("web-1").await.ok()?.status?.pod_ip },
    )
    .await;
    create(&peer, &twin, slice("web-own", "IPv4", &[&web_ip]))
        .await
        .expect("an endpoint that is its own pod");

    // Claims: new volumes of an offered class, within the grant summed over its twins.
    let tenants: Api<Tenant> = Api::namespaced(admin.clone(), &names::tenant_namespace("thun"));
    tenants
        .patch(
            "thun",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"grant": {"requests.storage": "2Gi",
                                                    "persistentvolumeclaims": "10"}}})),
        )
        .await
        .unwrap();
    for (name, extra, what) in [
        (
            "no-class",
            json!({"storageClassName": ""}),
            "a pre-provisioned volume",
        ),
        (
            "fast",
            json!({"storageClassName": "fast"}),
            "a class not offered",
        ),
        (
            "steal",
            json!({"volumeName": "pv-of-another-tenant"}),
            "a chosen volume",
        ),
        (
            "pick",
            json!({"selector": {"matchLabels": {"tenant": "other"}}}),
            "a selector",
        ),
        (
            "clone",
            json!({"dataSource": {"kind": "PersistentVolumeClaim", "name": "data"}}),
            "a data source",
        ),
    ] {
        assert_refused(
            create(&peer, &twin, claim(name, "1Gi", extra)).await,
            "claims",
            what,
        );
    }
    create(&peer, &twin, claim("data", "1Gi", json!({})))
        .await
        .expect("within the grant");
    create(&peer, &blog, claim("data", "1Gi", json!({})))
        .await
        .expect("within the grant, in its other twin");
    // Each twin's ResourceQuota alone would let this one in: only the sum refuses it.
    let over = create(&peer, &twin, claim("more", "1Gi", json!({}))).await;
    assert_refused(over.clone(), "storage-grant", "storage beyond the grant");
    assert!(over.unwrap_err().contains("all of its namespaces"));

    // Not its twin: RBAC, and the check, keep it out of the provider's namespaces.
    assert!(
        create(&peer, "default", service("web", json!({})))
            .await
            .is_err(),
        "a Service in the provider's own namespace"
    );
    // What reflection needs, no more: no bulk delete.
    let err = Api::<Secret>::namespaced(peer.clone(), &twin)
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .expect_err("deletecollection on the twin's Secrets");
    assert!(err.to_string().contains("forbidden"), "{err}");

    // Nothing refused was made; the provider's own pod is as it was; and the provider's admin
    // is not held to the peer's rules.
    let services: Api<Service> = Api::namespaced(admin.clone(), &twin);
    for name in ["np", "lb", "en", "eip"] {
        assert!(services.get_opt(name).await.unwrap().is_none(), "{name}");
    }
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), &twin);
    assert_eq!(
        claims
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|c| c.name_any())
            .collect::<Vec<_>>(),
        vec!["data".to_string()]
    );
    let own_pod = own.get("provider-own").await.unwrap();
    assert_eq!(own_pod.status.and_then(|s| s.pod_ip), Some(own_ip));
    create(
        &admin,
        &twin,
        service("admin-np", json!({"type": "NodePort"})),
    )
    .await
    .expect("the provider's admin may make a NodePort Service in a twin");
}
