//! Namespace offloading: twin namespaces on the selected providers (per mapping strategy, with
//! the peer identity's RoleBinding), their removal on unoffload, the provider's refusal to take
//! over namespaces, and the pod-placement webhook.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tandem_api::{NamespaceOffloading, RemoteNamespace, names};
use tandem_controller::consumer::offloading::OFFLOADING_LABEL;

use support::{Cluster, until};

const WAIT: Duration = Duration::from_secs(20);

async fn create_namespace(client: &Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    api.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
    )
    .await
    .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
}

async fn offload(client: &Client, ns: &str, name: &str, spec: Value) {
    let api: Api<NamespaceOffloading> = Api::namespaced(client.clone(), ns);
    api.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "apiVersion": "tandem.dev/v1alpha1", "kind": "NamespaceOffloading",
            "metadata": {"name": name}, "spec": spec,
        }))
        .unwrap(),
    )
    .await
    .unwrap_or_else(|e| panic!("creating NamespaceOffloading {ns}/{name}: {e}"));
}

/// Waits until the offloading of `ns` is Ready and returns its (clusterID, namespace) entries.
async fn ready_entries(client: &Client, ns: &str) -> Vec<(String, String)> {
    let api: Api<NamespaceOffloading> = Api::namespaced(client.clone(), ns);
    until(&format!("NamespaceOffloading {ns} Ready"), WAIT, || async {
        let o = api.get(names::OFFLOADING_NAME).await.ok()?;
        let status = o.status?;
        (status.phase.as_deref() == Some("Ready")).then(|| {
            status
                .remote_namespaces
                .iter()
                .map(|r| (r.cluster_id.clone(), r.namespace.clone()))
                .collect()
        })
    })
    .await
}

async fn namespace_gone(client: &Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    until(&format!("namespace {name} gone"), WAIT, || async {
        api.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await
}

/// The provider, as the consumer's peer identity (in the group of the key its Tenant records).
async fn peer_client(consumer: &Cluster, provider: &Cluster) -> Client {
    let tenant = Api::<tandem_api::Tenant>::namespaced(
        provider.client.clone(),
        &names::tenant_namespace(&consumer.id),
    )
    .get(&consumer.id)
    .await
    .expect("the consumer's Tenant");
    let key =
        tenant.metadata.annotations.unwrap_or_default()[names::KEY_FINGERPRINT_ANNOTATION].clone();
    let kubeconfig = provider
        .lab
        .server
        .kubeconfig_for(
            &names::peer_user(&consumer.id),
            &[names::peer_key_group(&key).as_str()],
        )
        .unwrap();
    tandem_controller::consumer::link::client_from_kubeconfig(&kubeconfig)
        .await
        .unwrap()
}

fn grant() -> Value {
    json!({"cpu": "4", "memory": "8Gi", "pods": "110"})
}

#[tokio::test]
async fn offloading_creates_twin_namespaces_and_unoffload_removes_them() {
    let consumer = Cluster::start("rome", "eu-south", 1).await;
    let provider = Cluster::start("milan", "eu-west", 1).await;
    support::peer_with(&consumer, &provider, grant(), None).await;
    create_namespace(&consumer.client, "app").await;
    offload(&consumer.client, "app", names::OFFLOADING_NAME, json!({})).await;

    // DefaultName: app-rome on the provider, bound to the peer identity.
    assert_eq!(
        ready_entries(&consumer.client, "app").await,
        vec![("milan".to_string(), "app-rome".to_string())]
    );
    let pns: Api<Namespace> = Api::all(provider.client.clone());
    let twin = pns.get("app-rome").await.expect("twin namespace");
    assert_eq!(
        twin.labels()
            .get(names::ORIGIN_CLUSTER_LABEL)
            .map(String::as_str),
        Some("rome")
    );
    assert_eq!(
        twin.labels()
            .get(names::MANAGED_BY_LABEL)
            .map(String::as_str),
        Some(names::MANAGED_BY)
    );
    let rb: Api<RoleBinding> = Api::namespaced(provider.client.clone(), "app-rome");
    let binding = rb.get("tandem:peer-twin").await.expect("twin RoleBinding");
    assert_eq!(
        binding.role_ref.name,
        tandem_controller::rbac::PEER_TWIN_ROLE
    );
    let cns: Api<Namespace> = Api::all(consumer.client.clone());
    assert_eq!(
        cns.get("app")
            .await
            .unwrap()
            .labels()
            .get(OFFLOADING_LABEL)
            .map(String::as_str),
        Some("enabled")
    );

    // The peer identity may now work in the twin namespace, and only there.
    let peer = peer_client(&consumer, &provider).await;
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "hello"}, "data": {"a": "b"}})).unwrap();
    Api::<ConfigMap>::namespaced(peer.clone(), "app-rome")
        .create(&PostParams::default(), &cm)
        .await
        .expect("peer identity creates a ConfigMap in its twin namespace");
    let denied = Api::<ConfigMap>::namespaced(peer.clone(), "default")
        .create(&PostParams::default(), &cm)
        .await
        .unwrap_err();
    assert!(
        matches!(denied, kube::Error::Api(ref s) if s.code == 403),
        "{denied:?}"
    );

    // A second NamespaceOffloading in the namespace is ignored and says so.
    offload(&consumer.client, "app", "extra", json!({})).await;
    let nso: Api<NamespaceOffloading> = Api::namespaced(consumer.client.clone(), "app");
    until("extra NamespaceOffloading flagged", WAIT, || async {
        let o = nso.get("extra").await.ok()?;
        let c = tandem_api::conditions::find(&o.status?.conditions, "Ready")?.clone();
        (c.status == "False" && c.reason == "WrongName").then_some(())
    })
    .await;

    // Switching to EnforceSameName (which the provider's admin allows) moves the twin to `app`.
    support::allow_namespace_mappings(&provider, "rome").await;
    nso.patch(
        names::OFFLOADING_NAME,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"namespaceMappingStrategy": "EnforceSameName"}})),
    )
    .await
    .unwrap();
    namespace_gone(&provider.client, "app-rome").await;
    until("twin renamed to app", WAIT, || async {
        let entries = ready_entries(&consumer.client, "app").await;
        (entries == vec![("milan".to_string(), "app".to_string())]).then_some(())
    })
    .await;
    assert!(pns.get("app").await.is_ok());

    // Unoffload: the twin goes, then the NamespaceOffloading, then the label.
    nso.delete(names::OFFLOADING_NAME, &DeleteParams::default())
        .await
        .unwrap();
    namespace_gone(&provider.client, "app").await;
    until("NamespaceOffloading gone", WAIT, || async {
        nso.get_opt(names::OFFLOADING_NAME)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    let labels = cns.get("app").await.unwrap().labels().clone();
    assert!(!labels.contains_key(OFFLOADING_LABEL), "{labels:?}");
    let rns: Api<RemoteNamespace> =
        Api::namespaced(provider.client.clone(), &names::tenant_namespace("rome"));
    assert!(
        rns.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

#[tokio::test]
async fn remote_namespace_never_takes_over_a_foreign_namespace() {
    let provider = Cluster::start("turin", "eu-west", 1).await;
    let ns: Api<Namespace> = Api::all(provider.client.clone());
    let pp = PatchParams::apply("test");
    for (name, labels) in [
        (
            "tandem-tenant-rome",
            json!({names::TENANT_NAMESPACE_LABEL: "true", names::REMOTE_CLUSTER_LABEL: "rome"}),
        ),
        (
            "tandem-tenant-other",
            json!({names::TENANT_NAMESPACE_LABEL: "true", names::REMOTE_CLUSTER_LABEL: "other"}),
        ),
        (
            "web-other",
            json!({names::TWIN_NAMESPACE_LABEL: "true", names::ORIGIN_CLUSTER_LABEL: "other",
                   names::ORIGIN_NAMESPACE_LABEL: "web"}),
        ),
    ] {
        ns.patch(
            name,
            &pp,
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "Namespace",
                                 "metadata": {"name": name, "labels": labels}})),
        )
        .await
        .unwrap();
    }
    let rns: Api<RemoteNamespace> = Api::namespaced(provider.client.clone(), "tandem-tenant-rome");
    for target in ["kube-system", "tandem-tenant-other", "web-other"] {
        let rn: RemoteNamespace = serde_json::from_value(json!({
            "apiVersion": "tandem.dev/v1alpha1", "kind": "RemoteNamespace",
            "metadata": {"name": format!("grab-{target}")},
            "spec": {"namespace": target, "originNamespace": "web"},
        }))
        .unwrap();
        rns.create(&PostParams::default(), &rn).await.unwrap();
        let message = until(
            &format!("RemoteNamespace for {target} refused"),
            WAIT,
            || async {
                let s = rns.get(&format!("grab-{target}")).await.ok()?.status?;
                (s.phase.as_deref() == Some("Failed")).then_some(s.message.unwrap_or_default())
            },
        )
        .await;
        assert!(message.contains(target), "{message}");
        let owner = ns.get(target).await.unwrap();
        assert!(
            owner
                .labels()
                .get(names::ORIGIN_CLUSTER_LABEL)
                .map(String::as_str)
                != Some("rome"),
            "{target} was not relabelled"
        );
        // Deleting the refused request leaves the namespace alone.
        rns.delete(&format!("grab-{target}"), &DeleteParams::default())
            .await
            .unwrap();
        until("refused request gone", WAIT, || async {
            rns.get_opt(&format!("grab-{target}"))
                .await
                .ok()?
                .is_none()
                .then_some(())
        })
        .await;
        let still = ns.get(target).await.unwrap();
        assert!(
            still.metadata.deletion_timestamp.is_none(),
            "{target} survives"
        );
    }
    // Reserved names are refused even when they do not exist yet.
    let rn: RemoteNamespace = serde_json::from_value(json!({
        "apiVersion": "tandem.dev/v1alpha1", "kind": "RemoteNamespace",
        "metadata": {"name": "reserved"},
        "spec": {"namespace": "kube-extra", "originNamespace": "web"},
    }))
    .unwrap();
    rns.create(&PostParams::default(), &rn).await.unwrap();
    let message = until("reserved name refused", WAIT, || async {
        let s = rns.get("reserved").await.ok()?.status?;
        (s.phase.as_deref() == Some("Failed")).then_some(s.message.unwrap_or_default())
    })
    .await;
    assert!(message.contains("reserved for the system"), "{message}");
    assert!(ns.get_opt("kube-extra").await.unwrap().is_none());
}

/// The placement a pod got: (tolerates the virtual-node taint, required node selector terms).
fn placement_of(pod: &Pod) -> (bool, Value) {
    let spec = pod.spec.clone().unwrap_or_default();
    let tolerates = spec
        .tolerations
        .unwrap_or_default()
        .iter()
        .any(|t| t.key.as_deref() == Some(names::VIRTUAL_NODE_TAINT));
    let terms = json!(
        spec.affinity
            .and_then(|a| a.node_affinity)
            .and_then(|n| n.required_during_scheduling_ignored_during_execution)
            .map(|r| r.node_selector_terms)
    );
    (tolerates, terms)
}

#[tokio::test]
async fn webhook_places_pods_per_strategy() {
    let consumer = Cluster::start("naples", "eu-south", 1).await;
    let hooks: Api<MutatingWebhookConfiguration> = Api::all(consumer.client.clone());
    until("webhook configuration", WAIT, || async {
        hooks.get_opt("tandem-pod-placement").await.ok()?
    })
    .await;
    let eu = json!({"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "topology.kubernetes.io/region", "operator": "In", "values": ["eu"]}]}]});
    for (ns, spec) in [
        (
            "remote",
            json!({"podOffloadingStrategy": "Remote", "clusterSelector": eu}),
        ),
        ("local", json!({"podOffloadingStrategy": "Local"})),
        ("both", json!({"podOffloadingStrategy": "LocalAndRemote"})),
    ] {
        create_namespace(&consumer.client, ns).await;
        offload(&consumer.client, ns, names::OFFLOADING_NAME, spec).await;
        ready_entries(&consumer.client, ns).await;
    }
    create_namespace(&consumer.client, "plain").await;

    let vn_in = json!({"key": names::NODE_TYPE_LABEL, "operator": "In", "values": [names::VIRTUAL_NODE_TYPE]});
    let vn_not_in = json!({"key": names::NODE_TYPE_LABEL, "operator": "NotIn", "values": [names::VIRTUAL_NODE_TYPE]});
    let region =
        json!({"key": "topology.kubernetes.io/region", "operator": "In", "values": ["eu"]});
    let ssd = json!({"key": "disk", "operator": "In", "values": ["ssd"]});
    let cases = [
        (
            "remote",
            false,
            true,
            json!([{"matchExpressions": [vn_in, region]}]),
        ),
        (
            "local",
            false,
            false,
            json!([{"matchExpressions": [vn_not_in]}]),
        ),
        (
            "both",
            false,
            true,
            json!([{"matchExpressions": [vn_not_in]}, {"matchExpressions": [vn_in]}]),
        ),
        // The pod's own required affinity is ANDed with the strategy's.
        (
            "both",
            true,
            true,
            json!([{"matchExpressions": [ssd, vn_not_in]}, {"matchExpressions": [ssd, vn_in]}]),
        ),
        ("plain", false, false, Value::Null),
        ("plain", true, false, json!([{"matchExpressions": [ssd]}])),
    ];
    for (i, (ns, own_affinity, tolerates, terms)) in cases.into_iter().enumerate() {
        let mut pod = json!({"metadata": {"name": format!("p{i}")},
                             "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
        if own_affinity {
            pod["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchExpressions": [ssd]}]}}});
        }
        let pods: Api<Pod> = Api::namespaced(consumer.client.clone(), ns);
        let created = pods
            .create(
                &PostParams::default(),
                &serde_json::from_value(pod).unwrap(),
            )
            .await
            .unwrap_or_else(|e| panic!("creating a pod in {ns}: {e}"));
        let read = pods.get(&created.name_any()).await.unwrap();
        assert_eq!(placement_of(&read), (tolerates, terms), "pod {i} in {ns}");
    }
}

/// A cluster selector over `topology.kubernetes.io/region` with these values.
fn regions(values: &[&str]) -> Value {
    json!({"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "topology.kubernetes.io/region", "operator": "In", "values": values}]}]})
}

/// The offloading's entries once Ready and equal to `want` (provider, twin namespace).
async fn entries_become(client: &Client, ns: &str, want: &[(&str, &str)]) {
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    until(&format!("offloading of {ns} at {want:?}"), WAIT, || async {
        (ready_entries(client, ns).await == want).then_some(())
    })
    .await;
}

#[tokio::test]
async fn cluster_selector_picks_only_matching_providers() {
    let consumer = Cluster::start("genoa", "eu-south", 1).await;
    let eu = Cluster::start("paris", "eu", 1).await;
    let us = Cluster::start("boston", "us", 1).await;
    let on_eu: Api<Namespace> = Api::all(eu.client.clone());
    let on_us: Api<Namespace> = Api::all(us.client.clone());
    support::peer_with(&consumer, &eu, grant(), None).await;
    create_namespace(&consumer.client, "shop").await;
    offload(
        &consumer.client,
        "shop",
        names::OFFLOADING_NAME,
        json!({"podOffloadingStrategy": "Remote", "clusterSelector": regions(&["eu", "us"])}),
    )
    .await;
    entries_become(&consumer.client, "shop", &[("paris", "shop-genoa")]).await;

    // A provider peered later is picked up when it matches.
    support::peer_with(&consumer, &us, grant(), None).await;
    entries_become(
        &consumer.client,
        "shop",
        &[("boston", "shop-genoa"), ("paris", "shop-genoa")],
    )
    .await;
    assert!(on_us.get("shop-genoa").await.is_ok());

    // Selecting region eu only: the us twin goes, the eu one stays.
    let nso: Api<NamespaceOffloading> = Api::namespaced(consumer.client.clone(), "shop");
    nso.patch(
        names::OFFLOADING_NAME,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"clusterSelector": regions(&["eu"])}})),
    )
    .await
    .unwrap();
    namespace_gone(&us.client, "shop-genoa").await;
    entries_become(&consumer.client, "shop", &[("paris", "shop-genoa")]).await;
    assert!(on_eu.get("shop-genoa").await.is_ok());

    // Selecting by provider ID (a label every virtual node has) moves it to boston.
    nso.patch(
        names::OFFLOADING_NAME,
        &PatchParams::default(),
        &Patch::Merge(
            json!({"spec": {"clusterSelector": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": names::REMOTE_CLUSTER_LABEL, "operator": "In", "values": ["boston"]}]}]}}}),
        ),
    )
    .await
    .unwrap();
    namespace_gone(&eu.client, "shop-genoa").await;
    entries_become(&consumer.client, "shop", &[("boston", "shop-genoa")]).await;

    // Local: no provider at all.
    nso.patch(
        names::OFFLOADING_NAME,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"podOffloadingStrategy": "Local"}})),
    )
    .await
    .unwrap();
    namespace_gone(&us.client, "shop-genoa").await;
    entries_become(&consumer.client, "shop", &[]).await;
}

#[tokio::test]
async fn a_cluster_selector_with_an_unknown_operator_is_reported_not_offloaded() {
    let consumer = Cluster::start("siena", "eu-south", 1).await;
    let provider = Cluster::start("pisa", "eu-west", 1).await;
    support::peer_with(&consumer, &provider, grant(), None).await;
    support::accept_any_spec(&consumer.client, "namespaceoffloadings.tandem.dev").await;
    create_namespace(&consumer.client, "bogus").await;
    offload(
        &consumer.client,
        "bogus",
        names::OFFLOADING_NAME,
        json!({"clusterSelector": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "topology.kubernetes.io/region", "operator": "Bogus", "values": ["eu-west"]},
        ]}]}}),
    )
    .await;
    let api: Api<NamespaceOffloading> = Api::namespaced(consumer.client.clone(), "bogus");
    let status = until("the offloading to report its selector", WAIT, || async {
        let status = api.get(names::OFFLOADING_NAME).await.ok()?.status?;
        status.phase.is_some().then_some(status)
    })
    .await;
    assert_eq!(status.phase.as_deref(), Some("Failed"), "{status:?}");
    let ready = tandem_api::conditions::find(&status.conditions, "Ready").expect("Ready");
    assert_eq!(ready.status, "False");
    assert_eq!(ready.reason, "InvalidClusterSelector");
    assert!(
        ready
            .message
            .contains("spec.clusterSelector.nodeSelectorTerms[0].matchExpressions[0].operator")
            && ready.message.contains("Bogus"),
        "{}",
        ready.message
    );
    // Nothing was offloaded on its account.
    assert!(status.remote_namespaces.is_empty(), "{status:?}");
    let twins: Api<RemoteNamespace> = Api::namespaced(
        provider.client.clone(),
        &names::tenant_namespace(&consumer.id),
    );
    assert!(twins.get_opt("bogus").await.unwrap().is_none());
    let cns: Api<Namespace> = Api::all(consumer.client.clone());
    let ns = cns.get("bogus").await.unwrap();
    assert!(
        !ns.labels().contains_key(OFFLOADING_LABEL),
        "{:?}",
        ns.labels()
    );
}

// ---- What the consumer may do to its pods on the provider (Tenant `spec.podAccess`) ----

/// Whether `client`'s user may `verb` pods/`sub` in `namespace`, as the API server answers a
/// SelfSubjectAccessReview (`kubectl auth can-i`).
async fn can_i(client: &Client, verb: &str, namespace: &str, sub: &str) -> bool {
    use k8s_openapi::api::authorization::v1::SelfSubjectAccessReview;
    let review: SelfSubjectAccessReview = serde_json::from_value(json!({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"verb": verb, "namespace": namespace,
                                        "resource": "pods", "subresource": sub, "name": "web-0"}},
    }))
    .unwrap();
    Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap_or_else(|e| panic!("can-i {verb} pods/{sub} in {namespace}: {e}"))
        .status
        .is_some_and(|s| s.allowed)
}

/// The HTTP status the API server answers `method` on pods/`sub` of a pod that does not exist:
/// 404 once authorised (the pod is looked up), 403 when RBAC refuses.
async fn probe(client: &Client, method: &str, namespace: &str, sub: &str) -> u16 {
    let req = http::Request::builder()
        .method(method)
        .uri(format!(
            "/api/v1/namespaces/{namespace}/pods/web-0/{sub}?command=true&stdout=true"
        ))
        .body(kube::client::Body::from(Vec::new()))
        .unwrap();
    client.send(req).await.unwrap().status().as_u16()
}

/// The (can-i create exec, attach, portforward) answers for `client` in `namespace`.
async fn streams(client: &Client, namespace: &str) -> [bool; 3] {
    [
        can_i(client, "create", namespace, "exec").await,
        can_i(client, "create", namespace, "attach").await,
        can_i(client, "create", namespace, "portforward").await,
    ]
}

#[tokio::test]
async fn tenant_pod_access_grants_and_revokes_exec_in_twin_namespaces_only() {
    let consumer = Cluster::start("rome", "eu-south", 1).await;
    let provider = Cluster::start("milan", "eu-west", 1).await;
    support::peer_with(&consumer, &provider, grant(), None).await;
    create_namespace(&consumer.client, "app").await;
    offload(&consumer.client, "app", names::OFFLOADING_NAME, json!({})).await;
    assert_eq!(
        ready_entries(&consumer.client, "app").await,
        vec![("milan".to_string(), "app-rome".to_string())]
    );
    let twin = "app-rome";
    let peer = peer_client(&consumer, &provider).await;
    let bindings: Api<RoleBinding> = Api::namespaced(provider.client.clone(), twin);
    use tandem_controller::provider::remote_namespace::{
        ATTACH_ROLE_BINDING, EXEC_ROLE_BINDING, PORTFORWARD_ROLE_BINDING,
    };

    // The default Tenant (no podAccess) allows everything, in the twin namespace.
    until("exec, attach and port-forward granted", WAIT, || async {
        (streams(&peer, twin).await == [true; 3]).then_some(())
    })
    .await;
    for name in [
        EXEC_ROLE_BINDING,
        ATTACH_ROLE_BINDING,
        PORTFORWARD_ROLE_BINDING,
    ] {
        let b = bindings
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(b.role_ref.name, name, "binding and role share the name");
    }
    assert!(can_i(&peer, "get", twin, "log").await);
    assert!(
        !can_i(&peer, "delete", twin, "").await,
        "never writes real pods"
    );
    // Through the API server's own path (the upgrade verb authorised as create): past RBAC.
    assert_eq!(probe(&peer, "POST", twin, "exec").await, 404);
    assert_eq!(probe(&peer, "GET", twin, "exec").await, 404);
    assert_eq!(probe(&peer, "GET", twin, "log").await, 404);

    // Never outside its twin namespaces.
    let tenant_ns = names::tenant_namespace("rome");
    for elsewhere in [
        "kube-system",
        names::SYSTEM_NAMESPACE,
        "default",
        tenant_ns.as_str(),
    ] {
        assert_eq!(streams(&peer, elsewhere).await, [false; 3], "{elsewhere}");
        assert!(!can_i(&peer, "get", elsewhere, "log").await, "{elsewhere}");
        assert_eq!(
            probe(&peer, "POST", elsewhere, "exec").await,
            403,
            "{elsewhere}"
        );
    }

    // The provider's admin refuses exec: its binding goes, logs and the rest stay.
    let tenants: Api<tandem_api::Tenant> = Api::namespaced(provider.client.clone(), &tenant_ns);
    let set_access = |access: Value| {
        let tenants = tenants.clone();
        async move {
            tenants
                .patch(
                    "rome",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"podAccess": access}})),
                )
                .await
                .expect("patching the Tenant's podAccess")
        }
    };
    let patched = set_access(json!({"exec": false})).await;
    assert_eq!(
        patched.spec.pod_access(),
        tandem_api::PodAccess {
            exec: false,
            ..Default::default()
        }
    );
    until("the exec binding removed", WAIT, || async {
        bindings
            .get_opt(EXEC_ROLE_BINDING)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    until("exec refused", WAIT, || async {
        (streams(&peer, twin).await == [false, true, true]).then_some(())
    })
    .await;
    assert!(can_i(&peer, "get", twin, "log").await, "logs stay readable");
    assert_eq!(probe(&peer, "POST", twin, "exec").await, 403);
    assert_eq!(probe(&peer, "GET", twin, "log").await, 404);

    // Allowed again when the refusal is lifted.
    set_access(Value::Null).await;
    until("exec granted again", WAIT, || async {
        (streams(&peer, twin).await == [true; 3]).then_some(())
    })
    .await;
}
