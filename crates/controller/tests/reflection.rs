//! Reflection into a twin namespace: ConfigMap and Secret edits and deletions, Services without
//! cluster IPs or selectors, EndpointSlices with addresses in the provider's view, and Events of
//! the provider's pods back onto the consumer's pods; a restart resyncs with no orphans.

use crate::support;

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tandem_api::{NamespaceOffloading, names};

use support::{Cluster, until};

const WAIT: Duration = Duration::from_secs(20);

async fn create<K>(client: &Client, ns: &str, obj: Value) -> K
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    api.create(
        &PostParams::default(),
        &serde_json::from_value(obj.clone()).unwrap(),
    )
    .await
    .unwrap_or_else(|e| panic!("creating {obj}: {e}"))
}

/// Consumer `rome` with `app` offloaded to provider `milan` (twin `app-rome`).
async fn offloaded() -> (Cluster, Cluster) {
    let consumer = Cluster::start("rome", "eu-south", 1).await;
    let provider = Cluster::start("milan", "eu-west", 1).await;
    support::peer_with(
        &consumer,
        &provider,
        json!({"cpu": "4", "memory": "8Gi", "pods": "110"}),
        None,
    )
    .await;
    let ns: Api<Namespace> = Api::all(consumer.client.clone());
    ns.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "app"}})).unwrap(),
    )
    .await
    .unwrap();
    let _: NamespaceOffloading = create(
        &consumer.client,
        "app",
        json!({"apiVersion": "tandem.dev/v1alpha1", "kind": "NamespaceOffloading",
               "metadata": {"name": "offloading"}, "spec": {}}),
    )
    .await;
    let nso: Api<NamespaceOffloading> = Api::namespaced(consumer.client.clone(), "app");
    until("offloading Ready", WAIT, || async {
        let s = nso.get("offloading").await.ok()?.status?;
        (s.phase.as_deref() == Some("Ready") && !s.remote_namespaces.is_empty()).then_some(())
    })
    .await;
    (consumer, provider)
}

#[tokio::test]
async fn config_maps_and_secrets_follow_edits_and_deletions() {
    let (consumer, provider) = offloaded().await;
    let local_cm: Api<ConfigMap> = Api::namespaced(consumer.client.clone(), "app");
    let twin_cm: Api<ConfigMap> = Api::namespaced(provider.client.clone(), "app-rome");
    let twin_secret: Api<Secret> = Api::namespaced(provider.client.clone(), "app-rome");
    let local_secret: Api<Secret> = Api::namespaced(consumer.client.clone(), "app");

    let _: ConfigMap = create(
        &consumer.client,
        "app",
        json!({"metadata": {"name": "settings", "labels": {"tier": "web"}}, "data": {"color": "blue"}}),
    )
    .await;
    let _: Secret = create(
        &consumer.client,
        "app",
        json!({"metadata": {"name": "creds"}, "type": "Opaque", "stringData": {"password": "s3cret"}}),
    )
    .await;
    let cm = until("ConfigMap reflected", WAIT, || async {
        twin_cm.get("settings").await.ok()
    })
    .await;
    assert_eq!(cm.data.clone().unwrap()["color"], "blue");
    assert_eq!(cm.labels()["tier"], "web");
    assert_eq!(cm.labels()[names::REFLECTED_LABEL], "configmap");
    let secret = until("Secret reflected", WAIT, || async {
        twin_secret.get("creds").await.ok()
    })
    .await;
    assert_eq!(secret.data.unwrap()["password"].0, b"s3cret");
    assert_eq!(secret.type_.as_deref(), Some("Opaque"));

    // Edits follow (a removed key disappears too).
    local_cm
        .patch(
            "settings",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"color": null, "size": "xl"}})),
        )
        .await
        .unwrap();
    local_secret
        .patch(
            "creds",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"password": "n3w"}})),
        )
        .await
        .unwrap();
    until("ConfigMap edit reflected", WAIT, || async {
        let data = twin_cm.get("settings").await.ok()?.data?;
        (data.get("size").map(String::as_str) == Some("xl") && !data.contains_key("color"))
            .then_some(())
    })
    .await;
    until("Secret edit reflected", WAIT, || async {
        let data = twin_secret.get("creds").await.ok()?.data?;
        (data.get("password")?.0 == b"n3w").then_some(())
    })
    .await;

    // Deletions follow; what Tandem did not create is left alone.
    let peer_made = twin_cm
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "provider-own"}})).unwrap(),
        )
        .await
        .unwrap();
    local_cm
        .delete("settings", &DeleteParams::default())
        .await
        .unwrap();
    local_secret
        .delete("creds", &DeleteParams::default())
        .await
        .unwrap();
    until("reflections deleted", WAIT, || async {
        (twin_cm.get_opt("settings").await.ok()?.is_none()
            && twin_secret.get_opt("creds").await.ok()?.is_none())
        .then_some(())
    })
    .await;
    assert!(
        twin_cm
            .get_opt(&peer_made.name_any())
            .await
            .unwrap()
            .is_some()
    );
    // The consumer's own root CA bundle is never reflected over the provider's.
    if let Some(root) = twin_cm.get_opt("kube-root-ca.crt").await.unwrap() {
        assert!(!root.labels().contains_key(names::REFLECTED_LABEL));
    }

    // Level-based: an object created while the controller is down is reflected after restart,
    // and an object deleted meanwhile leaves no orphan.
    let _: ConfigMap = create(
        &consumer.client,
        "app",
        json!({"metadata": {"name": "before"}, "data": {"a": "1"}}),
    )
    .await;
    until("before reflected", WAIT, || async {
        twin_cm.get("before").await.ok()
    })
    .await;
    let mut consumer = consumer;
    consumer.kill_controller();
    local_cm
        .delete("before", &DeleteParams::default())
        .await
        .unwrap();
    let _: ConfigMap = create(
        &consumer.client,
        "app",
        json!({"metadata": {"name": "during"}, "data": {"a": "2"}}),
    )
    .await;
    consumer.restart_controller().await;
    until("resync after restart", WAIT, || async {
        let reflected: BTreeSet<String> = twin_cm
            .list(&ListParams::default().labels(names::REFLECTED_LABEL))
            .await
            .ok()?
            .items
            .iter()
            .map(|c| c.name_any())
            .collect();
        (reflected == BTreeSet::from(["during".to_string()])).then_some(())
    })
    .await;
}

#[tokio::test]
async fn services_endpoints_and_events() {
    let (consumer, provider) = offloaded().await;
    let virtual_node = names::virtual_node_name("milan");
    let _: Service = create(
        &consumer.client,
        "app",
        json!({"metadata": {"name": "web"}, "spec": {"selector": {"app": "web"},
               "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}),
    )
    .await;
    // One pod runs locally (hollow node), one on the provider (bound to the virtual node, run
    // there by the virtual kubelet).
    let _: Pod = create(
        &consumer.client,
        "app",
        json!({"metadata": {"name": "web-local", "labels": {"app": "web"}},
               "spec": {"nodeName": consumer.lab.node_names()[0], "containers": [{"name": "c", "image": "nginx"}]}}),
    )
    .await;
    let _: Pod = create(
        &consumer.client,
        "app",
        json!({"metadata": {"name": "web-remote", "labels": {"app": "web"}},
               "spec": {"nodeName": virtual_node, "containers": [{"name": "c", "image": "nginx"}]}}),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(consumer.client.clone(), "app");
    let running_ip = |api: Api<Pod>, name: &'static str| async move {
        until(&format!("{name} Running with an IP"), WAIT, || async {
            let s = api.get(name).await.ok()?.status?;
            (s.phase.as_deref() == Some("Running")).then_some(s.pod_ip?)
        })
        .await
    };
    let local_ip = running_ip(pods.clone(), "web-local").await;
    assert!(local_ip.starts_with("10.244."), "{local_ip}");
    running_ip(pods.clone(), "web-remote").await;
    let remote_real_ip = running_ip(
        Api::namespaced(provider.client.clone(), "app-rome"),
        "web-remote",
    )
    .await;
    // The provider sees our pods in the CIDR its IPAM mapped our pod CIDR to.
    let peering = Api::<tandem_api::Peering>::all(consumer.client.clone())
        .get("milan")
        .await
        .unwrap();
    let ours_there: ipnet::IpNet = peering
        .status
        .unwrap()
        .network
        .unwrap()
        .local_pod_cidr_in_remote
        .expect("provider's remap of our pod CIDR")
        .parse()
        .unwrap();
    let local_there = support::translate(&local_ip, "10.244.0.0/16".parse().unwrap(), ours_there);

    let twin_svc: Api<Service> = Api::namespaced(provider.client.clone(), "app-rome");
    let svc = until("Service reflected", WAIT, || async {
        twin_svc.get("web").await.ok()
    })
    .await;
    let spec = svc.spec.unwrap();
    assert!(spec.selector.is_none(), "no selector: {:?}", spec.selector);
    assert_eq!(spec.ports.unwrap()[0].port, 80);
    let consumer_ip = Api::<Service>::namespaced(consumer.client.clone(), "app")
        .get("web")
        .await
        .unwrap()
        .spec
        .unwrap()
        .cluster_ip;
    assert!(
        consumer_ip.is_none() || spec.cluster_ip != consumer_ip,
        "the consumer's cluster IP is not copied"
    );

    let twin_slices: Api<EndpointSlice> = Api::namespaced(provider.client.clone(), "app-rome");
    let want: BTreeSet<String> = [local_there.clone(), remote_real_ip.clone()].into();
    until(
        "EndpointSlice reflected with translated addresses",
        WAIT,
        || async {
            let slices = twin_slices
                .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
                .await
                .ok()?;
            let addresses: BTreeSet<String> = slices
                .items
                .iter()
                .flat_map(|s| s.endpoints.iter().flat_map(|e| e.addresses.clone()))
                .collect();
            (addresses == want).then_some(())
        },
    )
    .await;

    // An Event of the provider's pod lands on the consumer's pod.
    let _: Event = create(
        &provider.client,
        "app-rome",
        json!({"metadata": {"name": "web-remote.17a0"},
               "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": "web-remote", "namespace": "app-rome"},
               "reason": "Pulled", "message": "Container image \"nginx\" already present", "type": "Normal",
               "count": 1, "source": {"component": "kubelet"}}),
    )
    .await;
    let remote_uid = pods.get("web-remote").await.unwrap().uid();
    let events: Api<Event> = Api::namespaced(consumer.client.clone(), "app");
    let event = reflected_event(&events, "web-remote", "Pulled").await;
    assert_eq!(event.involved_object.uid, remote_uid);
    assert_eq!(event.involved_object.namespace.as_deref(), Some("app"));
    // Events naming the provider's pod by UID too (as kubelet writes them): each lands on the
    // consumer's pod, its UID read once.
    for (name, reason) in [
        ("web-remote.17a1", "Created"),
        ("web-remote.17a2", "Started"),
    ] {
        let _: Event = create(
            &provider.client,
            "app-rome",
            json!({"metadata": {"name": name},
                   "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": "web-remote",
                                      "namespace": "app-rome", "uid": "uid-of-the-provider-pod"},
                   "reason": reason, "message": "container main", "type": "Normal",
                   "count": 1, "source": {"component": "kubelet"}}),
        )
        .await;
    }
    for reason in ["Created", "Started"] {
        let event = reflected_event(&events, "web-remote", reason).await;
        assert_eq!(event.involved_object.uid, remote_uid, "{reason}");
    }

    // Deleting the Service removes its reflection and slices.
    Api::<Service>::namespaced(consumer.client.clone(), "app")
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    until("Service and slices removed", WAIT, || async {
        let slices = twin_slices
            .list(&ListParams::default().labels(names::REFLECTED_LABEL))
            .await
            .ok()?;
        (twin_svc.get_opt("web").await.ok()?.is_none() && slices.items.is_empty()).then_some(())
    })
    .await;
}

/// The Event with `reason` of pod `pod` in `events`, once it is there.
async fn reflected_event(events: &Api<Event>, pod: &str, reason: &str) -> Event {
    until(
        &format!("Event {reason} of {pod} reflected"),
        WAIT,
        || async {
            events
                .list(&ListParams::default().fields(&format!("involvedObject.name={pod}")))
                .await
                .ok()?
                .items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some(reason))
        },
    )
    .await
}
