//! Malformed values in every field of every Tandem CRD: an API server refuses each with 422 and a
//! message naming the field, and the stored object stays as it was. The objects as the
//! controller writes them, and the variants admins and other clusters write, are accepted.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, Resource};
use serde_json::{Value, json};
use tandem_api::{
    NamespaceOffloading, NetworkParameters, Peering, PeeringRequest, RemoteNamespace, ShadowPod,
    Tenant, names,
};
use tandem_apiserver::{ApiServer, Config};

const NS: &str = "tandem-tenant-rome";
const WG_KEY: &str = "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=";
const CSR: &str = "-----BEGIN CERTIFICATE REQUEST-----\nMIIBADCBpwIBADBFMQswCQYDVQQGEwJJVDEO\n-----END CERTIFICATE REQUEST-----\n";

/// One Tandem kind in the test: how to reach it and the valid object stored before the cases.
struct Kind {
    name: &'static str,
    resource: ApiResource,
    namespaced: bool,
    object: Value,
    status: Value,
}

impl Kind {
    fn new<K: Resource<DynamicType = ()>>(namespaced: bool, object: Value, status: Value) -> Kind {
        Kind {
            name: K::kind(&()).into_owned().leak(),
            resource: ApiResource::erase::<K>(&()),
            namespaced,
            object,
            status,
        }
    }

    fn api(&self, client: &Client) -> Api<DynamicObject> {
        if self.namespaced {
            Api::namespaced_with(client.clone(), NS, &self.resource)
        } else {
            Api::all_with(client.clone(), &self.resource)
        }
    }

    fn object_name(&self) -> &str {
        self.object["metadata"]["name"].as_str().unwrap()
    }
}

/// A condition as `tandem_api::set_condition` writes it.
fn condition(type_: &str) -> Value {
    let mut conditions = Vec::new();
    tandem_api::set_condition(
        &mut conditions,
        type_,
        tandem_api::ConditionStatus::True,
        "Offloaded",
        "twin namespace ready on 1 provider(s)",
        Some(1),
    );
    serde_json::to_value(&conditions[0]).unwrap()
}

/// Every kind with an object shaped as the controller writes it (crates/controller: invite.rs,
/// consumer/peering.rs, provider/peering_request.rs, provider/network.rs, ...).
fn kinds(ca_pem: &str) -> Vec<Kind> {
    let meta =
        |name: &str| json!({"name": name, "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY}});
    vec![
        Kind::new::<Peering>(
            false,
            json!({"metadata": meta("milan"), "spec": {
                "clusterID": "milan", "endpoint": "https://127.0.0.1:34567", "caData": ca_pem,
                "inviteSecret": "tandem-invite-milan", "gatewayStatus": "127.0.0.1:9100"}}),
            json!({
                "phase": "Established",
                "conditions": [condition(tandem_api::conditions::RESOURCES_GRANTED)],
                "identitySecret": "tandem-identity-milan",
                "remoteTenantNamespace": names::tenant_namespace("rome"),
                "granted": {"cpu": "2", "memory": "4096Mi", "pods": "55"},
                "nodeLabels": {"topology.kubernetes.io/region": "eu-south"},
                "virtualNode": names::virtual_node_name("milan"),
                "network": {
                    "remotePodCidr": "10.244.0.0/16", "remappedRemotePodCidr": "10.71.0.0/16",
                    "remoteExternalCidr": "10.250.0.0/16", "remappedRemoteExternalCidr": "10.72.0.0/16",
                    "localPodCidrInRemote": "10.73.0.0/16",
                    "remoteGatewayEndpoint": "192.0.2.7:51820", "remotePublicKey": WG_KEY,
                },
            }),
        ),
        Kind::new::<PeeringRequest>(
            true,
            json!({"metadata": meta("abc123"), "spec": {
                "clusterID": "rome", "tokenID": "abc123", "tokenProof": "0f".repeat(32), "csr": CSR}}),
            json!({"phase": "Approved", "message": "peer identity tandem:peer:rome issued",
                   "certificate": ca_pem, "tenantNamespace": names::tenant_namespace("rome"),
                   "providerClusterID": "milan"}),
        ),
        Kind::new::<Tenant>(
            true,
            json!({"metadata": meta("rome"), "spec": {
                "clusterID": "rome", "grant": {"cpu": "2", "memory": "4096Mi", "pods": "55"},
                "nodeLabels": {"topology.kubernetes.io/zone": "eu-south-1a"}}}),
            json!({"used": {"cpu": "500m", "memory": "128Mi"},
                   "conditions": [condition(tandem_api::conditions::READY)]}),
        ),
        Kind::new::<NetworkParameters>(
            true,
            json!({"metadata": meta("consumer"), "spec": {
                "clusterID": "rome", "podCIDR": "10.244.0.0/16", "externalCIDR": "10.250.0.0/16",
                "gatewayEndpoint": "192.0.2.8:51820", "publicKey": WG_KEY}}),
            json!({"remappedPodCIDR": "10.71.0.0/16", "remappedExternalCIDR": "10.72.0.0/16",
                   "conditions": [condition(tandem_api::conditions::READY)]}),
        ),
        Kind::new::<RemoteNamespace>(
            true,
            json!({"metadata": meta("shop"), "spec": {"namespace": "shop-rome", "originNamespace": "shop"}}),
            json!({"phase": "Ready", "message": "twin namespace shop-rome ready"}),
        ),
        Kind::new::<NamespaceOffloading>(
            true,
            json!({"metadata": meta(names::OFFLOADING_NAME), "spec": {
                "namespaceMappingStrategy": "DefaultName", "podOffloadingStrategy": "Remote",
                "clusterSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "topology.kubernetes.io/region", "operator": "In", "values": ["eu-south"]}]}]}}}),
            json!({"phase": "Ready",
                   "remoteNamespaces": [{"clusterID": "milan", "namespace": "shop-rome", "phase": "Ready"}],
                   "conditions": [condition(tandem_api::conditions::READY)]}),
        ),
        Kind::new::<ShadowPod>(
            true,
            json!({"metadata": meta("web-1"), "spec": {
                "labels": {"app": "web"}, "annotations": {"tandem.dev/origin": "shop/web-1"},
                "pod": {"containers": [{"name": "web", "image": "nginx"}], "nodeName": "ignored-by-schema"}}}),
            json!({"phase": "Running", "message": ""}),
        ),
    ]
}

/// (kind, merge patch, the field the refusal must name). A patch under `status` goes to the
/// status subresource.
fn refusals() -> Vec<(&'static str, Value, &'static str)> {
    let sel = |req: Value| json!({"spec": {"clusterSelector": {"nodeSelectorTerms": [{"matchExpressions": [req]}]}}});
    let fields = |req: Value| json!({"spec": {"clusterSelector": {"nodeSelectorTerms": [{"matchFields": [req]}]}}});
    let bad_condition = |key: &str, value: Value| {
        let mut c = condition("Ready");
        c[key] = value;
        json!({"status": {"conditions": [c]}})
    };
    let mut cases = vec![
        // Peering
        (
            "Peering",
            json!({"spec": {"clusterID": "Milan"}}),
            "spec.clusterID",
        ),
        (
            "Peering",
            json!({"spec": {"clusterID": "-milan"}}),
            "spec.clusterID",
        ),
        (
            "Peering",
            json!({"spec": {"clusterID": "m".repeat(41)}}),
            "spec.clusterID",
        ),
        (
            "Peering",
            json!({"spec": {"endpoint": "http://127.0.0.1:6443"}}),
            "spec.endpoint",
        ),
        (
            "Peering",
            json!({"spec": {"endpoint": "127.0.0.1:6443"}}),
            "spec.endpoint",
        ),
        (
            "Peering",
            json!({"spec": {"endpoint": "https://127.0.0.1:99999"}}),
            "spec.endpoint",
        ),
        (
            "Peering",
            json!({"spec": {"caData": "not a certificate"}}),
            "spec.caData",
        ),
        (
            "Peering",
            json!({"spec": {"inviteSecret": "Invite_Secret"}}),
            "spec.inviteSecret",
        ),
        (
            "Peering",
            json!({"spec": {"gatewayStatus": "127.0.0.1"}}),
            "spec.gatewayStatus",
        ),
        (
            "Peering",
            json!({"spec": {"gatewayStatus": "http://127.0.0.1:9100/status"}}),
            "spec.gatewayStatus",
        ),
        (
            "Peering",
            json!({"status": {"identitySecret": "a b"}}),
            "status.identitySecret",
        ),
        (
            "Peering",
            json!({"status": {"remoteTenantNamespace": "tandem.tenant"}}),
            "status.remoteTenantNamespace",
        ),
        (
            "Peering",
            json!({"status": {"granted": {"cpu": "abc"}}}),
            "status.granted.cpu",
        ),
        (
            "Peering",
            json!({"status": {"granted": {"memory": "-5Gi"}}}),
            "status.granted.memory",
        ),
        (
            "Peering",
            json!({"status": {"nodeLabels": {"zone": "not a label value"}}}),
            "status.nodeLabels.zone",
        ),
        (
            "Peering",
            json!({"status": {"virtualNode": "Tandem_Milan"}}),
            "status.virtualNode",
        ),
        (
            "Peering",
            json!({"status": {"network": {"remotePodCidr": "10.244.0.0"}}}),
            "status.network.remotePodCidr",
        ),
        (
            "Peering",
            json!({"status": {"network": {"remappedRemotePodCidr": "10.71.0.0/33"}}}),
            "status.network.remappedRemotePodCidr",
        ),
        (
            "Peering",
            json!({"status": {"network": {"remoteExternalCidr": "ten/8"}}}),
            "status.network.remoteExternalCidr",
        ),
        (
            "Peering",
            json!({"status": {"network": {"remappedRemoteExternalCidr": "300.0.0.0/8"}}}),
            "status.network.remappedRemoteExternalCidr",
        ),
        (
            "Peering",
            json!({"status": {"network": {"localPodCidrInRemote": ""}}}),
            "status.network.localPodCidrInRemote",
        ),
        (
            "Peering",
            json!({"status": {"network": {"remoteGatewayEndpoint": "192.0.2.7"}}}),
            "status.network.remoteGatewayEndpoint",
        ),
        (
            "Peering",
            json!({"status": {"network": {"remotePublicKey": "c2hvcnQ="}}}),
            "status.network.remotePublicKey",
        ),
        // PeeringRequest
        (
            "PeeringRequest",
            json!({"spec": {"clusterID": "rome.eu"}}),
            "spec.clusterID",
        ),
        (
            "PeeringRequest",
            json!({"spec": {"tokenID": "ABC123"}}),
            "spec.tokenID",
        ),
        (
            "PeeringRequest",
            json!({"spec": {"tokenID": "abc1234"}}),
            "spec.tokenID",
        ),
        (
            "PeeringRequest",
            json!({"spec": {"tokenProof": "not hex"}}),
            "spec.tokenProof",
        ),
        (
            "PeeringRequest",
            json!({"spec": {"csr": "not a request"}}),
            "spec.csr",
        ),
        (
            "PeeringRequest",
            json!({"status": {"certificate": CSR}}),
            "status.certificate",
        ),
        (
            "PeeringRequest",
            json!({"status": {"tenantNamespace": "Tenant"}}),
            "status.tenantNamespace",
        ),
        (
            "PeeringRequest",
            json!({"status": {"providerClusterID": "milan_1"}}),
            "status.providerClusterID",
        ),
        // Tenant: the bad inputs of issue 12 first
        (
            "Tenant",
            json!({"spec": {"grant": {"cpu": "abc"}}}),
            "spec.grant.cpu",
        ),
        (
            "Tenant",
            json!({"spec": {"grant": {"cpu": "-5"}}}),
            "spec.grant.cpu",
        ),
        (
            "Tenant",
            json!({"spec": {"grant": {"cpu": -5}}}),
            "spec.grant.cpu",
        ),
        (
            "Tenant",
            json!({"spec": {"grant": {"cpu": 1.5}}}),
            "spec.grant.cpu",
        ),
        (
            "Tenant",
            json!({"spec": {"grant": {"memory": "8 Gi"}}}),
            "spec.grant.memory",
        ),
        (
            "Tenant",
            json!({"spec": {"grant": {"pods": "1.2.3"}}}),
            "spec.grant.pods",
        ),
        (
            "Tenant",
            json!({"spec": {"clusterID": "Rome"}}),
            "spec.clusterID",
        ),
        (
            "Tenant",
            json!({"spec": {"nodeLabels": {"topology.kubernetes.io/zone": "-a-"}}}),
            "spec.nodeLabels.topology.kubernetes.io/zone",
        ),
        (
            "Tenant",
            json!({"spec": {"podAccess": {"exec": "no"}}}),
            "spec.podAccess.exec",
        ),
        (
            "Tenant",
            json!({"spec": {"podAccess": {"portForward": 0}}}),
            "spec.podAccess.portForward",
        ),
        (
            "Tenant",
            json!({"spec": {"podResources": {"defaultRequests": {"cpu": "lots"}}}}),
            "spec.podResources.defaultRequests.cpu",
        ),
        (
            "Tenant",
            json!({"spec": {"podResources": {"withoutRequests": "Sometimes"}}}),
            "spec.podResources.withoutRequests",
        ),
        (
            "Tenant",
            json!({"spec": {"podResources": {"maxLimitRequestRatio": {"memory": "-2"}}}}),
            "spec.podResources.maxLimitRequestRatio.memory",
        ),
        (
            "Tenant",
            json!({"status": {"used": {"cpu": "lots"}}}),
            "status.used.cpu",
        ),
        // NetworkParameters
        (
            "NetworkParameters",
            json!({"spec": {"clusterID": ""}}),
            "spec.clusterID",
        ),
        (
            "NetworkParameters",
            json!({"spec": {"podCIDR": "10.244.0.0"}}),
            "spec.podCIDR",
        ),
        (
            "NetworkParameters",
            json!({"spec": {"externalCIDR": "any"}}),
            "spec.externalCIDR",
        ),
        (
            "NetworkParameters",
            json!({"spec": {"gatewayEndpoint": "gw:port"}}),
            "spec.gatewayEndpoint",
        ),
        (
            "NetworkParameters",
            json!({"spec": {"publicKey": "not base64!"}}),
            "spec.publicKey",
        ),
        (
            "NetworkParameters",
            json!({"status": {"remappedPodCIDR": "10.71.0.0/16/1"}}),
            "status.remappedPodCIDR",
        ),
        (
            "NetworkParameters",
            json!({"status": {"remappedExternalCIDR": "10.72.0.0"}}),
            "status.remappedExternalCIDR",
        ),
        // RemoteNamespace
        (
            "RemoteNamespace",
            json!({"spec": {"namespace": "Shop_Rome"}}),
            "spec.namespace",
        ),
        (
            "RemoteNamespace",
            json!({"spec": {"originNamespace": "s".repeat(64)}}),
            "spec.originNamespace",
        ),
        // NamespaceOffloading: the bad operator of issue 12 first
        (
            "NamespaceOffloading",
            sel(json!({"key": "region", "operator": "Bogus", "values": ["eu"]})),
            "spec.clusterSelector.nodeSelectorTerms[0].matchExpressions[0].operator",
        ),
        (
            "NamespaceOffloading",
            sel(json!({"key": "not a key", "operator": "Exists"})),
            "spec.clusterSelector.nodeSelectorTerms[0].matchExpressions[0].key",
        ),
        (
            "NamespaceOffloading",
            sel(json!({"key": "region"})),
            "spec.clusterSelector.nodeSelectorTerms[0].matchExpressions[0].operator",
        ),
        (
            "NamespaceOffloading",
            fields(json!({"key": "metadata.labels", "operator": "In", "values": ["x"]})),
            "spec.clusterSelector.nodeSelectorTerms[0].matchFields[0].key",
        ),
        (
            "NamespaceOffloading",
            fields(json!({"key": "metadata.name", "operator": "Exists"})),
            "spec.clusterSelector.nodeSelectorTerms[0].matchFields[0].operator",
        ),
        (
            "NamespaceOffloading",
            fields(json!({"key": "metadata.name", "operator": "In", "values": ["a", "b"]})),
            "spec.clusterSelector.nodeSelectorTerms[0].matchFields[0].values",
        ),
        (
            "NamespaceOffloading",
            json!({"spec": {"clusterSelector": {"nodeSelectorTerms": []}}}),
            "spec.clusterSelector.nodeSelectorTerms",
        ),
        (
            "NamespaceOffloading",
            json!({"spec": {"namespaceMappingStrategy": "Whatever"}}),
            "spec.namespaceMappingStrategy",
        ),
        (
            "NamespaceOffloading",
            json!({"spec": {"podOffloadingStrategy": "Everywhere"}}),
            "spec.podOffloadingStrategy",
        ),
        (
            "NamespaceOffloading",
            json!({"spec": {"remoteNamespaceName": "Shop"}}),
            "spec.remoteNamespaceName",
        ),
        (
            "NamespaceOffloading",
            json!({"status": {"remoteNamespaces": [{"clusterID": "Milan", "namespace": "shop-rome", "phase": "Ready"}]}}),
            "status.remoteNamespaces[0].clusterID",
        ),
        (
            "NamespaceOffloading",
            json!({"status": {"remoteNamespaces": [{"clusterID": "milan", "namespace": "shop.rome", "phase": "Ready"}]}}),
            "status.remoteNamespaces[0].namespace",
        ),
        // ShadowPod
        (
            "ShadowPod",
            json!({"spec": {"labels": {"app": "web app"}}}),
            "spec.labels.app",
        ),
        (
            "ShadowPod",
            json!({"spec": {"pod": {"containers": []}}}),
            "spec.pod.containers",
        ),
        (
            "ShadowPod",
            json!({"spec": {"pod": {"containers": null}}}),
            "spec.pod.containers",
        ),
    ];
    // Conditions carry metav1.Condition's rules wherever they appear.
    for kind in [
        "Peering",
        "Tenant",
        "NetworkParameters",
        "NamespaceOffloading",
    ] {
        cases.push((
            kind,
            bad_condition("status", json!("Maybe")),
            "status.conditions[0].status",
        ));
        cases.push((
            kind,
            bad_condition("reason", json!("not a reason")),
            "status.conditions[0].reason",
        ));
        cases.push((
            kind,
            bad_condition("type", json!("Ready?")),
            "status.conditions[0].type",
        ));
        cases.push((
            kind,
            bad_condition("observedGeneration", json!(-1)),
            "status.conditions[0].observedGeneration",
        ));
    }
    cases
}

/// (kind, merge patch) that must be accepted: what admins, the CLI and other clusters write.
fn acceptances() -> Vec<(&'static str, Value)> {
    let sel = |req: Value| json!({"spec": {"clusterSelector": {"nodeSelectorTerms": [{"matchExpressions": [req]}]}}});
    vec![
        (
            "Tenant",
            json!({"spec": {"grant": {"cpu": 4, "memory": "1.5Gi", "pods": "1e2", "nvidia.com/gpu": "1"}}}),
        ),
        (
            "Tenant",
            json!({"spec": {"grant": {"cpu": "500m", "memory": "0", "pods": "+3"}}}),
        ),
        ("Tenant", json!({"spec": {"grant": null}})),
        (
            "Tenant",
            json!({"spec": {"podAccess": {"exec": false, "attach": true, "portForward": false}}}),
        ),
        ("Tenant", json!({"spec": {"podAccess": {"exec": false}}})),
        ("Tenant", json!({"spec": {"podAccess": {}}})),
        ("Tenant", json!({"spec": {"podAccess": null}})),
        (
            "Tenant",
            json!({"spec": {"podResources": {"defaultRequests": {"cpu": "50m", "ephemeral-storage": "1Gi"},
                "withoutRequests": "Refuse", "maxLimitRequestRatio": {"cpu": "2.5"}}}}),
        ),
        (
            "Tenant",
            json!({"spec": {"podResources": {"defaultRequests": {}}}}),
        ),
        (
            "Peering",
            json!({"spec": {"endpoint": "https://api.milan.example.com", "gatewayStatus": "[::1]:9100"}}),
        ),
        (
            "Peering",
            json!({"spec": {"endpoint": "https://[fd00::1]:6443/k8s/clusters/c-1", "gatewayStatus": null}}),
        ),
        (
            "NetworkParameters",
            json!({"spec": {"podCIDR": "fd00:10:244::/56", "gatewayEndpoint": "gw.milan.example.com:51820"}}),
        ),
        (
            "NamespaceOffloading",
            sel(
                json!({"key": "tandem.dev/remote-cluster-id", "operator": "NotIn", "values": ["paris"]}),
            ),
        ),
        (
            "NamespaceOffloading",
            sel(json!({"key": "gpu", "operator": "Exists"})),
        ),
        (
            "NamespaceOffloading",
            sel(json!({"key": "cores", "operator": "Gt", "values": ["8"]})),
        ),
        (
            "NamespaceOffloading",
            json!({"spec": {"clusterSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["tandem-milan"]}]}]}}}),
        ),
        (
            "NamespaceOffloading",
            json!({"spec": {"clusterSelector": null, "namespaceMappingStrategy": "SelectedName",
            "remoteNamespaceName": "shop-in-milan", "podOffloadingStrategy": "LocalAndRemote"}}),
        ),
        (
            "ShadowPod",
            json!({"spec": {"labels": {"app.kubernetes.io/name": "", "tier": "front_end.v1"}}}),
        ),
    ]
}

async fn install_crds(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in tandem_api::crds::all() {
        let name = crd.metadata.name.clone().unwrap();
        crds.create(&PostParams::default(), &crd)
            .await
            .unwrap_or_else(|e| panic!("creating CRD {name}: {e}"));
        let established = await_condition(crds.clone(), &name, conditions::is_crd_established());
        tokio::time::timeout(Duration::from_secs(30), established)
            .await
            .unwrap_or_else(|_| panic!("CRD {name} not established within 30s"))
            .unwrap();
    }
}

/// Sends `patch` to the object of `kind` (to its status subresource when the patch is under
/// `status`).
async fn send(api: &Api<DynamicObject>, name: &str, patch: &Value) -> kube::Result<DynamicObject> {
    let pp = PatchParams::default();
    if patch.get("status").is_some() {
        api.patch_status(name, &pp, &Patch::Merge(patch)).await
    } else {
        api.patch(name, &pp, &Patch::Merge(patch)).await
    }
}

#[tokio::test]
async fn every_malformed_field_is_refused_and_nothing_stored_changes() {
    let server = ApiServer::start(Config::default())
        .await
        .expect("API server starts");
    let client = server.client().await.expect("admin client");
    install_crds(&client).await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap(),
        )
        .await
        .expect("tenant namespace");

    let kinds = kinds(server.ca_pem());
    for kind in &kinds {
        let api = kind.api(&client);
        let mut object = kind.object.clone();
        object["apiVersion"] = json!(kind.resource.api_version);
        object["kind"] = json!(kind.name);
        let object: DynamicObject = serde_json::from_value(object).unwrap();
        api.create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| {
                panic!("{} as the controller writes it is accepted: {e}", kind.name)
            });
        send(&api, kind.object_name(), &json!({"status": kind.status}))
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "{} status as the controller writes it is accepted: {e}",
                    kind.name
                )
            });
    }

    let mut failures = Vec::new();
    for (kind_name, patch, field) in refusals() {
        let kind = kinds.iter().find(|k| k.name == kind_name).unwrap();
        let api = kind.api(&client);
        let before = api.get(kind.object_name()).await.unwrap();
        match send(&api, kind.object_name(), &patch).await {
            Err(kube::Error::Api(status))
                if status.code == 422 && status.message.contains(&format!("{field}:")) => {}
            Err(kube::Error::Api(status)) => failures.push(format!(
                "{kind_name} {patch}: refused with {} {:?}, not 422 naming {field}",
                status.code, status.message
            )),
            other => failures.push(format!(
                "{kind_name} {patch}: not refused ({:?})",
                other.map(|_| ())
            )),
        }
        let after = api.get(kind.object_name()).await.unwrap();
        if serde_json::to_value(&after).unwrap() != serde_json::to_value(&before).unwrap() {
            failures.push(format!("{kind_name} {patch}: the stored object changed"));
        }
    }
    for (kind_name, patch) in acceptances() {
        let kind = kinds.iter().find(|k| k.name == kind_name).unwrap();
        if let Err(e) = send(&kind.api(&client), kind.object_name(), &patch).await {
            failures.push(format!("{kind_name} {patch}: refused: {e}"));
        }
    }
    // The controller reads what the schema let in through the Rust types.
    for kind in &kinds {
        let stored =
            serde_json::to_value(kind.api(&client).get(kind.object_name()).await.unwrap()).unwrap();
        if let Err(e) = read_back(kind.name, stored) {
            failures.push(format!(
                "{}: the stored object does not read back as the Rust type: {e}",
                kind.name
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} case(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Reads a stored object as its Rust type.
fn read_back(kind: &str, v: Value) -> serde_json::Result<()> {
    match kind {
        "Peering" => serde_json::from_value::<Peering>(v).map(drop),
        "PeeringRequest" => serde_json::from_value::<PeeringRequest>(v).map(drop),
        "Tenant" => serde_json::from_value::<Tenant>(v).map(drop),
        "NetworkParameters" => serde_json::from_value::<NetworkParameters>(v).map(drop),
        "RemoteNamespace" => serde_json::from_value::<RemoteNamespace>(v).map(drop),
        "NamespaceOffloading" => serde_json::from_value::<NamespaceOffloading>(v).map(drop),
        "ShadowPod" => serde_json::from_value::<ShadowPod>(v).map(drop),
        other => panic!("unknown kind {other}"),
    }
}
