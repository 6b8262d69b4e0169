//! The hostile peer: a consumer that writes what an honest Tandem never would, straight to its
//! provider with its peer identity (or through its own pods), and a provider that reports what
//! an honest one never would. Every attack must be refused by the side it could harm, with a
//! message naming the rule, and leave the provider's own workloads as they were.

mod services;

#[path = "../support/mod.rs"]
mod support;

// One module per attack surface; the pod, identity, namespace and route attacks are here.
// `names` is taken by `tandem_api::names` below.
#[path = "names.rs"]
mod colliding_names;
mod credentials;
mod grants;
mod mcs;
mod provider;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use support::{Cluster, until};
use tandem_api::{ShadowPod, Tenant, names};

/// A ShadowPod named `name` asking for a pod `spec` (a plain container plus `extra` fields),
/// with `annotations`.
fn shadow_pod(name: &str, pod_extra: Value, container_extra: Value, annotations: Value) -> Value {
    let mut container = json!({"name": "app", "image": "nginx"});
    for (k, v) in container_extra.as_object().into_iter().flatten() {
        container[k] = v.clone();
    }
    let mut pod = json!({"containers": [container]});
    for (k, v) in pod_extra.as_object().into_iter().flatten() {
        pod[k] = v.clone();
    }
    json!({"apiVersion": "tandem.dev/v1alpha1", "kind": "ShadowPod",
           "metadata": {"name": name},
           "spec": {"labels": {"app": name}, "annotations": annotations, "pod": pod}})
}

/// Creates `doc` as the peer and waits for the provider's verdict: Err(message) when
/// Rejected, Ok(real pod) when the real pod exists.
async fn verdict(peer: &Client, admin: &Client, twin: &str, doc: Value) -> Result<Pod, String> {
    let name = doc["metadata"]["name"].as_str().unwrap().to_string();
    let shadows: Api<ShadowPod> = Api::namespaced(peer.clone(), twin);
    let sp: ShadowPod = serde_json::from_value(doc).unwrap();
    shadows
        .create(&PostParams::default(), &sp)
        .await
        .unwrap_or_else(|e| panic!("the peer may create ShadowPod {name}: {e}"));
    let pods: Api<Pod> = Api::namespaced(admin.clone(), twin);
    let admin_shadows: Api<ShadowPod> = Api::namespaced(admin.clone(), twin);
    until(
        &format!("a verdict on ShadowPod {name}"),
        Duration::from_secs(30),
        || async {
            if let Ok(Some(p)) = pods.get_opt(&name).await {
                return Some(Ok(p));
            }
            let sp = admin_shadows.get(&name).await.ok()?;
            let st = sp.status?;
            (st.phase.as_deref() == Some("Rejected")).then(|| Err(st.message.unwrap_or_default()))
        },
    )
    .await
}

#[tokio::test]
async fn a_hostile_consumer_cannot_widen_its_pods() {
    let provider = Cluster::start("zurich", "eu-central", 2).await;
    let mut consumer = Cluster::start("basel", "eu-central", 1).await;
    support::peer(&consumer, &provider).await;
    let twin = support::offload_remote(&consumer, &provider, "shop").await;
    let admin = provider.client.clone();
    let peer = support::peer_client(&consumer, &provider).await;
    // From here on the consumer runs code of its own: its identity, not Tandem's controller
    // (which would remove the ShadowPods no pod of its own stands for).
    consumer.kill_controller();

    // The provider's own workload, and a control-plane node that carries no taint (as k3s
    // servers do not): neither may be reached by a peer's pod.
    let nodes: Api<Node> = Api::all(admin.clone());
    let mut node_names: Vec<String> = nodes
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|n| n.name_any())
        .filter(|n| !n.starts_with("tandem-"))
        .collect();
    node_names.sort();
    let control_plane = node_names[0].clone();
    nodes
        .patch(
            &control_plane,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}),
            ),
        )
        .await
        .unwrap();
    let own: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let own_pod: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "provider-own"},
        "spec": {"containers": [{"name": "db", "image": "postgres"}]}}))
    .unwrap();
    let own_uid = own
        .create(&PostParams::default(), &own_pod)
        .await
        .unwrap()
        .uid()
        .unwrap();

    let none = json!({});
    let sc = |v: Value| json!({"securityContext": v});
    // (ShadowPod name, pod fields, container fields, annotations, the rule that refuses it)
    let refused: Vec<(&str, Value, Value, Value, &str)> = vec![
        (
            "cap-sys-admin",
            none.clone(),
            sc(json!({"capabilities": {"add": ["SYS_ADMIN"]}})),
            none.clone(),
            "capabilities",
        ),
        (
            "cap-net-admin",
            none.clone(),
            sc(json!({"capabilities": {"add": ["NET_ADMIN"]}})),
            none.clone(),
            "capabilities",
        ),
        (
            "seccomp-container",
            none.clone(),
            sc(json!({"seccompProfile": {"type": "Unconfined"}})),
            none.clone(),
            "seccompProfile",
        ),
        (
            "seccomp-pod",
            json!({"securityContext": {"seccompProfile": {"type": "Unconfined"}}}),
            none.clone(),
            none.clone(),
            "seccompProfile",
        ),
        (
            "apparmor-annotation",
            none.clone(),
            none.clone(),
            json!({"container.apparmor.security.beta.kubernetes.io/app": "unconfined"}),
            "AppArmor",
        ),
        (
            "apparmor-field",
            none.clone(),
            sc(json!({"appArmorProfile": {"type": "Unconfined"}})),
            none.clone(),
            "AppArmor",
        ),
        (
            "proc-mount",
            none.clone(),
            sc(json!({"procMount": "Unmasked"})),
            none.clone(),
            "procMount",
        ),
        (
            "selinux",
            none.clone(),
            sc(json!({"seLinuxOptions": {"type": "spc_t"}})),
            none.clone(),
            "seLinuxOptions",
        ),
        (
            "host-process",
            none.clone(),
            sc(json!({"windowsOptions": {"hostProcess": true}})),
            none.clone(),
            "hostProcess",
        ),
        (
            "privileged",
            none.clone(),
            sc(json!({"privileged": true})),
            none.clone(),
            "privileged",
        ),
        (
            "host-port",
            none.clone(),
            json!({"ports": [{"containerPort": 80, "hostPort": 80}]}),
            none.clone(),
            "hostPort",
        ),
        (
            "host-network",
            json!({"hostNetwork": true}),
            none.clone(),
            none.clone(),
            "host namespaces",
        ),
        (
            "host-pid",
            json!({"hostPID": true}),
            none.clone(),
            none.clone(),
            "host namespaces",
        ),
        (
            "host-ipc",
            json!({"hostIPC": true}),
            none.clone(),
            none.clone(),
            "host namespaces",
        ),
        (
            "host-path",
            json!({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}),
            none.clone(),
            none.clone(),
            "hostPath volumes",
        ),
        (
            "nfs",
            json!({"volumes": [{"name": "n", "nfs": {"server": "192.0.2.1", "path": "/"}}]}),
            none.clone(),
            none.clone(),
            "volumes",
        ),
        (
            "iscsi",
            json!({"volumes": [{"name": "i", "iscsi": {"targetPortal": "192.0.2.1:3260", "iqn": "iqn.2001-04.com.example:x", "lun": 0}}]}),
            none.clone(),
            none.clone(),
            "volumes",
        ),
        (
            "inline-csi",
            json!({"volumes": [{"name": "c", "csi": {"driver": "secrets-store.csi.k8s.io"}}]}),
            none.clone(),
            none.clone(),
            "volumes",
        ),
        (
            "token",
            json!({"volumes": [{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}]}),
            none.clone(),
            none.clone(),
            "volumes",
        ),
        (
            "sysctl",
            json!({"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}}),
            none.clone(),
            none.clone(),
            "forbidden sysctls",
        ),
        (
            "resource-claims",
            json!({"resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu"}]}),
            none.clone(),
            none.clone(),
            "resource-claims",
        ),
    ];
    for (name, pod, container, annotations, rule) in refused {
        match verdict(
            &peer,
            &admin,
            &twin,
            shadow_pod(name, pod, container, annotations),
        )
        .await
        {
            Err(message) => {
                // The Pod Security Standards' checks say it as kube-apiserver does; Tandem's
                // own rules (volume types, resource claims) name themselves.
                let said = if ["volumes", "resource-claims"].contains(&rule) {
                    format!("refused by rule {rule}:")
                } else {
                    format!("violates PodSecurity \"baseline:latest\": {rule} (")
                };
                assert!(
                    message.contains(&said),
                    "{name}: refused, but not saying {said:?}: {message}"
                );
            }
            Ok(p) => panic!("{name}: the provider made the real pod {:?}", p.spec),
        }
    }

    // What only the provider decides is taken from the peer: the pod runs, as the provider says.
    let widened = shadow_pod(
        "widened",
        json!({
            "nodeName": control_plane,
            "serviceAccountName": "tandem-controller", "automountServiceAccountToken": true,
            "priorityClassName": "system-node-critical", "priority": 2_000_001_000,
            "runtimeClassName": "unsandboxed", "schedulerName": "peer-scheduler",
            "tolerations": [{"operator": "Exists"}],
        }),
        none.clone(),
        json!({"cluster-autoscaler.kubernetes.io/safe-to-evict": "false", "tandem.dev/origin-uid": "u-1"}),
    );
    let real = verdict(&peer, &admin, &twin, widened)
        .await
        .expect("a pod asking for what the provider decides still runs");
    let spec = real.spec.clone().unwrap();
    assert_eq!(
        spec.service_account_name.as_deref().unwrap_or("default"),
        "default"
    );
    assert_eq!(spec.automount_service_account_token, Some(false));
    assert_eq!(spec.priority_class_name, None);
    assert_eq!(spec.runtime_class_name, None);
    assert_eq!(
        spec.scheduler_name
            .as_deref()
            .unwrap_or("default-scheduler"),
        "default-scheduler"
    );
    // Only what the API server's DefaultTolerationSeconds gives every pod: no toleration of
    // every taint.
    for t in spec.tolerations.unwrap_or_default() {
        let key = t.key.clone().unwrap_or_default();
        assert!(
            key == "node.kubernetes.io/not-ready" || key == "node.kubernetes.io/unreachable",
            "{t:?}"
        );
    }
    assert_eq!(
        real.annotations().keys().collect::<Vec<_>>(),
        ["tandem.dev/origin-uid"]
    );
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &twin);
    let placed = until(
        "the widened pod scheduled",
        Duration::from_secs(30),
        || async { pods.get("widened").await.ok()?.spec?.node_name },
    )
    .await;
    assert_ne!(
        placed, control_plane,
        "a peer's pod landed on a control-plane node"
    );
    assert!(
        !placed.starts_with("tandem-"),
        "a peer's pod was offloaded again: {placed}"
    );

    // A provider that holds this consumer to `restricted`: a pod that may run as root is
    // refused, a hardened one runs with every capability dropped.
    let tenants: Api<Tenant> = Api::namespaced(admin.clone(), &names::tenant_namespace("basel"));
    tenants
        .patch(
            "basel",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"podSecurity": "restricted"}})),
        )
        .await
        .unwrap();
    let root = verdict(
        &peer,
        &admin,
        &twin,
        shadow_pod("root", none.clone(), none.clone(), none.clone()),
    )
    .await;
    assert!(
        root.as_ref().is_err_and(
            |m| m.contains("violates PodSecurity \"restricted:latest\": runAsNonRoot != true")
        ),
        "{root:?}"
    );
    let hardened = verdict(
        &peer,
        &admin,
        &twin,
        shadow_pod(
            "hardened",
            json!({"securityContext": {"runAsNonRoot": true, "runAsUser": 1000}}),
            none.clone(),
            none.clone(),
        ),
    )
    .await
    .expect("a restricted pod runs");
    let c = &hardened.spec.unwrap().containers[0];
    let csc = c.security_context.clone().unwrap();
    assert_eq!(csc.allow_privilege_escalation, Some(false));
    assert_eq!(
        csc.capabilities.unwrap().drop,
        Some(vec!["ALL".to_string()])
    );

    // The provider's own workload is as it was.
    let after = own.get("provider-own").await.unwrap();
    assert_eq!(after.uid().unwrap(), own_uid);
    assert!(
        after.spec.unwrap().node_name.is_some(),
        "the provider's own pod was not scheduled"
    );
}

#[tokio::test]
async fn a_consumer_pod_refused_by_the_provider_says_which_rule() {
    let provider = Cluster::start("bern", "eu-central", 1).await;
    let consumer = Cluster::start("thun", "eu-central", 1).await;
    support::peer(&consumer, &provider).await;
    support::offload_remote(&consumer, &provider, "lab").await;
    let pods: Api<Pod> = Api::namespaced(consumer.client.clone(), "lab");
    let pod: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "escape"},
        "spec": {"containers": [{"name": "app", "image": "nginx",
            "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]}}))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let message = until(
        "the consumer's pod to say it was refused",
        Duration::from_secs(30),
        || async {
            let st = pods.get("escape").await.ok()?.status?;
            (st.reason.as_deref() == Some("OffloadingRejected")).then_some(st.message?)
        },
    )
    .await;
    assert!(
        message.contains("provider bern rejected the pod")
            && message.contains("violates PodSecurity \"baseline:latest\": capabilities")
            && message.contains("SYS_ADMIN"),
        "{message}"
    );
}

#[tokio::test]
async fn an_invite_cannot_take_over_a_peered_consumers_identity() {
    let provider = Cluster::start("lugano", "eu-south", 1).await;
    let mut consumer = Cluster::start("chur", "eu-central", 1).await;
    support::peer(&consumer, &provider).await;
    let twin = support::offload_remote(&consumer, &provider, "shop").await;
    let tenants: Api<Tenant> =
        Api::namespaced(provider.client.clone(), &names::tenant_namespace("chur"));
    let before = tenants.get("chur").await.unwrap();
    let key = before
        .annotations()
        .get(names::KEY_FINGERPRINT_ANNOTATION)
        .cloned();
    assert!(
        key.as_deref().is_some_and(|k| k.starts_with("sha256:")),
        "the Tenant records the consumer's key: {key:?}"
    );

    // A third cluster claims the consumer's ID with a fresh invite of its own.
    let impostor = Cluster::start("chur", "eu-west", 1).await;
    let invite = support::invite(&provider, Duration::from_secs(3600)).await;
    tandem_admin::invite::accept(&impostor.client, &invite)
        .await
        .expect("the impostor files its request");
    let refused = tandem_admin::invite::wait_established(
        &impostor.client,
        &provider.id,
        Duration::from_secs(30),
        &mut |_| {},
    )
    .await
    .expect_err("an invite must not issue another key's identity");
    let message = refused.to_string();
    assert!(
        message.contains("already peers with this cluster under key")
            && message.contains(key.as_deref().unwrap()),
        "{message}"
    );
    // The real consumer's identity, Tenant and twin are untouched, and it still offloads.
    let after = tenants.get("chur").await.unwrap();
    assert_eq!(after.uid(), before.uid());
    assert_eq!(
        after.annotations().get(names::KEY_FINGERPRINT_ANNOTATION),
        key.as_ref()
    );
    let peer = support::peer_client(&consumer, &provider).await;
    consumer.kill_controller();
    let real = verdict(
        &peer,
        &provider.client,
        &twin,
        shadow_pod("still-mine", json!({}), json!({}), json!({})),
    )
    .await;
    assert!(real.is_ok(), "{real:?}");
}

/// Files a RemoteNamespace `name` for twin `twin` of origin `origin` as the peer, and returns
/// the provider's verdict: Ok(()) when Ready, Err(message) when Failed.
async fn twin_verdict(
    peer: &Client,
    consumer: &str,
    name: &str,
    twin: &str,
    origin: &str,
) -> Result<(), String> {
    let rns: Api<tandem_api::RemoteNamespace> =
        Api::namespaced(peer.clone(), &names::tenant_namespace(consumer));
    let rn: tandem_api::RemoteNamespace = serde_json::from_value(json!({
        "apiVersion": "tandem.dev/v1alpha1", "kind": "RemoteNamespace",
        "metadata": {"name": name},
        "spec": {"namespace": twin, "originNamespace": origin, "podOffloadingStrategy": "Remote"},
    }))
    .unwrap();
    rns.create(&PostParams::default(), &rn).await.unwrap();
    until(
        &format!("a verdict on twin namespace {twin}"),
        Duration::from_secs(30),
        || async {
            let s = rns.get(name).await.ok()?.status?;
            match s.phase.as_deref() {
                Some("Ready") => Some(Ok(())),
                Some("Failed") => Some(Err(s.message.unwrap_or_default())),
                _ => None,
            }
        },
    )
    .await
}

#[tokio::test]
async fn a_consumer_cannot_squat_the_providers_namespaces() {
    let provider = Cluster::start("sion", "eu-central", 1).await;
    let mut consumer = Cluster::start("aarau", "eu-central", 1).await;
    support::peer(&consumer, &provider).await;
    let peer = support::peer_client(&consumer, &provider).await;
    consumer.kill_controller();
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(provider.client.clone());

    // By default a twin is `<namespace>-<consumer>`: a name the provider's admin would only
    // ever create for this consumer.
    let refused = twin_verdict(&peer, "aarau", "same", "payments", "payments").await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|m| m.contains("EnforceSameName") && m.contains("the default of Tenant")),
        "{refused:?}"
    );
    let refused = twin_verdict(&peer, "aarau", "selected", "billing", "shop").await;
    assert!(
        refused.as_ref().is_err_and(|m| m.contains("SelectedName")),
        "{refused:?}"
    );
    for squatted in ["payments", "billing"] {
        assert!(
            namespaces.get_opt(squatted).await.unwrap().is_none(),
            "{squatted} was created"
        );
    }
    twin_verdict(&peer, "aarau", "shop", "shop-aarau", "shop")
        .await
        .expect("the default name");

    // Allowed every mapping, a consumer still never names an add-on's namespace before the
    // admin installs it, nor one that exists.
    support::allow_namespace_mappings(&provider, "aarau").await;
    let refused = twin_verdict(&peer, "aarau", "monitoring", "monitoring", "monitoring").await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|m| m.contains("reserved for an add-on")),
        "{refused:?}"
    );
    assert!(namespaces.get_opt("monitoring").await.unwrap().is_none());
    let refused = twin_verdict(&peer, "aarau", "tandem", "tandem-evil", "x").await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|m| m.contains("reserved for Tandem")),
        "{refused:?}"
    );

    // A cap on twins: the second one past it is refused, the first ones are kept.
    Api::<Tenant>::namespaced(provider.client.clone(), &names::tenant_namespace("aarau"))
        .patch(
            "aarau",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"maxTwinNamespaces": 1}})),
        )
        .await
        .unwrap();
    let refused = twin_verdict(&peer, "aarau", "web", "web-aarau", "web").await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|m| m.contains("maxTwinNamespaces: 1")),
        "{refused:?}"
    );
    assert!(namespaces.get_opt("web-aarau").await.unwrap().is_none());
    let shop = namespaces.get("shop-aarau").await.unwrap();
    assert!(shop.metadata.deletion_timestamp.is_none());
    assert_eq!(
        shop.labels()
            .get("pod-security.kubernetes.io/enforce")
            .map(String::as_str),
        Some("baseline"),
        "a twin says its Pod Security level to the API server"
    );
}

#[tokio::test]
async fn a_consumer_cannot_route_the_providers_special_or_public_ranges_into_its_tunnel() {
    let provider = Cluster::start("zug", "eu-central", 1).await;
    let mut consumer = Cluster::start("olten", "eu-central", 1).await;
    support::peer(&consumer, &provider).await;
    let peer = support::peer_client(&consumer, &provider).await;
    consumer.kill_controller();
    let tenant_ns = names::tenant_namespace("olten");
    let parameters: Api<tandem_api::NetworkParameters> = Api::namespaced(peer.clone(), &tenant_ns);
    let consumer_parameters = tandem_controller::rbac::CONSUMER_NETWORK_PARAMETERS;
    let ipam: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(provider.client.clone(), names::SYSTEM_NAMESPACE);
    // (declared pod CIDR, the class the refusal names)
    for (cidr, class) in [
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local"),
        ("224.0.0.0/4", "multicast"),
        ("8.8.8.0/24", "public"),
    ] {
        parameters
            .patch(
                consumer_parameters,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"podCIDR": cidr}})),
            )
            .await
            .unwrap_or_else(|e| panic!("the peer may change its own parameters: {e}"));
        let message = until(
            &format!("the provider to refuse {cidr}"),
            Duration::from_secs(30),
            || async {
                let status = parameters.get(consumer_parameters).await.ok()?.status?;
                let c = tandem_api::conditions::find(
                    &status.conditions,
                    tandem_api::conditions::PREFIXES_GRANTED,
                )?;
                (c.status == "False" && c.message.contains(cidr)).then(|| c.message.clone())
            },
        )
        .await;
        assert!(
            message.contains(class) && message.contains("never granted"),
            "{cidr}: {message}"
        );
        let state = ipam
            .get(tandem_controller::provider::network::IPAM_CONFIG_MAP)
            .await
            .unwrap();
        let recorded = serde_json::to_string(&state.data).unwrap();
        assert!(
            !recorded.contains(cidr),
            "{cidr} is in the provider's IPAM: {recorded}"
        );
    }
}
