//! Least privilege: what the real peer identity (issued through the invite flow) may and may
//! not do in its provider. Each forbidden operation must get 403 from the provider's RBAC.

use crate::support;

use kube::Client;
use kube::api::Api;
use kube::client::Body;
use serde_json::json;
use support::Cluster;
use tandem_api::names;

/// Sends one request and returns its HTTP status.
async fn status_of(
    client: &Client,
    method: &str,
    path: &str,
    body: Option<serde_json::Value>,
    headers: &[(&str, &str)],
) -> u16 {
    let content_type = match method {
        "PATCH" => "application/merge-patch+json",
        _ => "application/json",
    };
    let mut req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("Content-Type", content_type);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let bytes = body
        .map(|b| serde_json::to_vec(&b).unwrap())
        .unwrap_or_default();
    let req = req.body(Body::from(bytes)).unwrap();
    client.send(req).await.unwrap().status().as_u16()
}

/// (what, method, path, body, extra headers)
type Operation = (
    &'static str,
    &'static str,
    String,
    Option<serde_json::Value>,
    Vec<(&'static str, &'static str)>,
);

/// Listing namespaces as the administrator, through impersonation.
fn impersonate_admin() -> Operation {
    (
        "impersonate the administrator",
        "GET",
        "/api/v1/namespaces".into(),
        None,
        vec![
            ("Impersonate-User", "admin"),
            ("Impersonate-Group", "system:masters"),
        ],
    )
}

#[tokio::test]
async fn the_peer_identity_is_confined_to_its_tenant() {
    let provider = Cluster::start("zurich", "eu-central", 1).await;
    let consumer = Cluster::start("basel", "eu-central", 1).await;
    support::peer(&consumer, &provider).await;
    // Another consumer's tenant on the same provider, and a CSR to (not) approve.
    let admin = provider.client.clone();
    let tenant_ns = names::tenant_namespace("basel");
    let other_ns = names::tenant_namespace("geneva");
    tandem_admin::install::apply(
        &Api::all(admin.clone()),
        &serde_json::from_value::<k8s_openapi::api::core::v1::Namespace>(
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": other_ns}}),
        )
        .unwrap(),
    )
    .await
    .unwrap();
    let other_tenant: tandem_api::Tenant = serde_json::from_value(json!({
        "apiVersion": "tandem.dev/v1alpha1", "kind": "Tenant",
        "metadata": {"name": "geneva", "namespace": other_ns},
        "spec": {"clusterID": "geneva", "grant": {"cpu": "1"}},
    }))
    .unwrap();
    tandem_admin::install::apply(&Api::namespaced(admin.clone(), &other_ns), &other_tenant)
        .await
        .unwrap();

    let peer = support::peer_client(&consumer, &provider).await;
    let t = &tenant_ns;
    let o = &other_ns;
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"},
                     "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
    let forbidden: Vec<Operation> = vec![
        (
            "list Secrets in default",
            "GET",
            "/api/v1/namespaces/default/secrets".into(),
            None,
            vec![],
        ),
        (
            "read the provider's cluster identity",
            "GET",
            format!(
                "/api/v1/namespaces/{}/secrets/{}",
                names::SYSTEM_NAMESPACE,
                names::IDENTITY_SECRET
            ),
            None,
            vec![],
        ),
        (
            "list bootstrap tokens",
            "GET",
            "/api/v1/namespaces/kube-system/secrets".into(),
            None,
            vec![],
        ),
        (
            "list Secrets in its tenant namespace",
            "GET",
            format!("/api/v1/namespaces/{t}/secrets"),
            None,
            vec![],
        ),
        (
            "list pods in default",
            "GET",
            "/api/v1/namespaces/default/pods".into(),
            None,
            vec![],
        ),
        (
            "list pods cluster-wide",
            "GET",
            "/api/v1/pods".into(),
            None,
            vec![],
        ),
        (
            "create a pod in default",
            "POST",
            "/api/v1/namespaces/default/pods".into(),
            Some(pod.clone()),
            vec![],
        ),
        (
            "create a pod in its tenant namespace",
            "POST",
            format!("/api/v1/namespaces/{t}/pods"),
            Some(pod),
            vec![],
        ),
        ("list Nodes", "GET", "/api/v1/nodes".into(), None, vec![]),
        (
            "create a Node",
            "POST",
            "/api/v1/nodes".into(),
            Some(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "evil"}})),
            vec![],
        ),
        (
            "list ClusterRoles",
            "GET",
            "/apis/rbac.authorization.k8s.io/v1/clusterroles".into(),
            None,
            vec![],
        ),
        (
            "create a ClusterRoleBinding",
            "POST",
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings".into(),
            Some(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "evil"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "tandem:peer:basel"}]})),
            vec![],
        ),
        (
            "bind itself more in its tenant namespace",
            "POST",
            format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{t}/rolebindings"),
            Some(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "evil"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "tandem:peer:basel"}]})),
            vec![],
        ),
        (
            "read its own RoleBindings",
            "GET",
            format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{t}/rolebindings"),
            None,
            vec![],
        ),
        (
            "list CRDs",
            "GET",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions".into(),
            None,
            vec![],
        ),
        (
            "delete the Tenant CRD",
            "DELETE",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/tenants.tandem.dev".into(),
            None,
            vec![],
        ),
        (
            "list namespaces",
            "GET",
            "/api/v1/namespaces".into(),
            None,
            vec![],
        ),
        (
            "create a namespace",
            "POST",
            "/api/v1/namespaces".into(),
            Some(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "evil"}})),
            vec![],
        ),
        (
            "delete its tenant namespace",
            "DELETE",
            format!("/api/v1/namespaces/{t}"),
            None,
            vec![],
        ),
        (
            "read another tenant's namespace",
            "GET",
            format!("/api/v1/namespaces/{o}"),
            None,
            vec![],
        ),
        (
            "read another consumer's Tenant",
            "GET",
            format!("/apis/tandem.dev/v1alpha1/namespaces/{o}/tenants/geneva"),
            None,
            vec![],
        ),
        (
            "delete another consumer's Tenant",
            "DELETE",
            format!("/apis/tandem.dev/v1alpha1/namespaces/{o}/tenants/geneva"),
            None,
            vec![],
        ),
        (
            "list Tenants cluster-wide",
            "GET",
            "/apis/tandem.dev/v1alpha1/tenants".into(),
            None,
            vec![],
        ),
        (
            "grow its own grant",
            "PATCH",
            format!("/apis/tandem.dev/v1alpha1/namespaces/{t}/tenants/basel"),
            Some(json!({"spec": {"grant": {"cpu": "1000"}}})),
            vec![],
        ),
        (
            "create a second Tenant",
            "POST",
            format!("/apis/tandem.dev/v1alpha1/namespaces/{t}/tenants"),
            Some(json!({
            "apiVersion": "tandem.dev/v1alpha1", "kind": "Tenant", "metadata": {"name": "more"},
            "spec": {"clusterID": "more", "grant": {"cpu": "1000"}}})),
            vec![],
        ),
        (
            "rewrite the provider's network parameters",
            "PATCH",
            format!("/apis/tandem.dev/v1alpha1/namespaces/{t}/networkparameters/provider"),
            Some(json!({"spec": {"podCIDR": "10.9.0.0/16"}})),
            vec![],
        ),
        (
            "write the provider's remap of its own CIDRs",
            "PATCH",
            format!("/apis/tandem.dev/v1alpha1/namespaces/{t}/networkparameters/consumer/status"),
            Some(json!({"status": {"remappedPodCIDR": "10.9.0.0/16"}})),
            vec![],
        ),
        (
            "list PeeringRequests",
            "GET",
            format!(
                "/apis/tandem.dev/v1alpha1/namespaces/{}/peeringrequests",
                names::SYSTEM_NAMESPACE
            ),
            None,
            vec![],
        ),
        (
            "file a PeeringRequest",
            "POST",
            format!(
                "/apis/tandem.dev/v1alpha1/namespaces/{}/peeringrequests",
                names::SYSTEM_NAMESPACE
            ),
            Some(json!({
            "apiVersion": "tandem.dev/v1alpha1", "kind": "PeeringRequest", "metadata": {"name": "abcdef"},
            "spec": {"clusterID": "basel", "tokenID": "abcdef", "tokenProof": "", "csr": ""}})),
            vec![],
        ),
        (
            "read the provider's settings",
            "GET",
            format!(
                "/api/v1/namespaces/{}/configmaps/{}",
                names::SYSTEM_NAMESPACE,
                names::CONFIG_MAP
            ),
            None,
            vec![],
        ),
        impersonate_admin(),
        (
            "list CSRs",
            "GET",
            "/apis/certificates.k8s.io/v1/certificatesigningrequests".into(),
            None,
            vec![],
        ),
        // Filing a CSR is allowed (a peer renews its own certificate that way); a request
        // for any other identity is denied by the provider (tests/renewal.rs).
        (
            "approve a CSR",
            "PUT",
            "/apis/certificates.k8s.io/v1/certificatesigningrequests/evil/approval".into(),
            Some(json!({
            "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest", "metadata": {"name": "evil"},
            "spec": {"request": "", "signerName": "kubernetes.io/kube-apiserver-client"}})),
            vec![],
        ),
        (
            "create a webhook",
            "POST",
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations".into(),
            Some(json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration", "metadata": {"name": "evil"}})),
            vec![],
        ),
        (
            "read leases",
            "GET",
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases".into(),
            None,
            vec![],
        ),
        (
            "create shadow pods outside twin namespaces",
            "POST",
            "/apis/tandem.dev/v1alpha1/namespaces/default/shadowpods".into(),
            Some(json!({
            "apiVersion": "tandem.dev/v1alpha1", "kind": "ShadowPod", "metadata": {"name": "x"}, "spec": {}})),
            vec![],
        ),
    ];
    let mut failures = Vec::new();
    for (what, method, path, body, headers) in &forbidden {
        let code = status_of(&peer, method, path, body.clone(), headers).await;
        if code != 403 {
            failures.push(format!("{what}: {method} {path} → {code}, want 403"));
        }
    }
    assert!(forbidden.len() >= 20);
    assert!(
        failures.is_empty(),
        "the peer identity may do too much:\n{}",
        failures.join("\n")
    );

    // What it must be able to do.
    let allowed: Vec<(&str, &str, String, Option<serde_json::Value>)> = vec![
        (
            "read its Tenant",
            "GET",
            format!("/apis/tandem.dev/v1alpha1/namespaces/{t}/tenants/basel"),
            None,
        ),
        (
            "read the provider's network parameters",
            "GET",
            format!("/apis/tandem.dev/v1alpha1/namespaces/{t}/networkparameters/provider"),
            None,
        ),
        (
            "update its network parameters",
            "PATCH",
            format!("/apis/tandem.dev/v1alpha1/namespaces/{t}/networkparameters/consumer"),
            Some(json!({"metadata": {"annotations": {"x": "y"}}})),
        ),
        (
            "write its remap of the provider's CIDRs",
            "PATCH",
            format!("/apis/tandem.dev/v1alpha1/namespaces/{t}/networkparameters/provider/status"),
            Some(json!({"metadata": {"annotations": {"x": "y"}}})),
        ),
        (
            "ask for a twin namespace",
            "POST",
            format!("/apis/tandem.dev/v1alpha1/namespaces/{t}/remotenamespaces"),
            Some(json!({
            "apiVersion": "tandem.dev/v1alpha1", "kind": "RemoteNamespace", "metadata": {"name": "web"},
            "spec": {"namespace": "web-basel", "originNamespace": "web"}})),
        ),
        (
            "list its twin namespace requests",
            "GET",
            format!("/apis/tandem.dev/v1alpha1/namespaces/{t}/remotenamespaces"),
            None,
        ),
    ];
    for (what, method, path, body) in &allowed {
        let code = status_of(&peer, method, path, body.clone(), &[]).await;
        if !(200..300).contains(&code) {
            failures.push(format!("{what}: {method} {path} → {code}, want 2xx"));
        }
    }
    assert!(
        failures.is_empty(),
        "the peer identity cannot do its job:\n{}",
        failures.join("\n")
    );
}

/// The controller's own identity (its ServiceAccount, bound by `tandem install` to its
/// ClusterRole) runs every test of this crate; here, what it must not do in its own cluster
/// gets 403. It never touches CRDs, cluster RBAC, workloads, tokens or other webhooks.
#[tokio::test]
async fn the_controller_identity_is_confined_to_its_role() {
    let cluster = Cluster::start("lugano", "eu-central", 1).await;
    let ctl = &cluster.controller_client;
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                      "metadata": {"name": "x"}, "rules": []});
    let forbidden: Vec<Operation> = vec![
        (
            "list Deployments",
            "GET",
            "/apis/apps/v1/deployments".into(),
            None,
            vec![],
        ),
        (
            "create a ClusterRole",
            "POST",
            "/apis/rbac.authorization.k8s.io/v1/clusterroles".into(),
            Some(role),
            vec![],
        ),
        (
            "edit its own ClusterRole",
            "PATCH",
            format!(
                "/apis/rbac.authorization.k8s.io/v1/clusterroles/{}",
                names::CONTROLLER_NAME
            ),
            Some(json!({"rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]})),
            vec![],
        ),
        (
            "bind cluster-admin cluster-wide",
            "POST",
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings".into(),
            Some(json!({"metadata": {"name": "x"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"kind": "User", "name": "x"}]})),
            vec![],
        ),
        (
            "list Roles",
            "GET",
            "/apis/rbac.authorization.k8s.io/v1/roles".into(),
            None,
            vec![],
        ),
        (
            "delete the ShadowPod CRD",
            "DELETE",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/shadowpods.tandem.dev".into(),
            None,
            vec![],
        ),
        (
            "patch another mutating webhook",
            "PATCH",
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/other".into(),
            Some(json!({"metadata": {"labels": {"x": "y"}}})),
            vec![],
        ),
        (
            "list validating webhooks",
            "GET",
            "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations".into(),
            None,
            vec![],
        ),
        (
            "mint a ServiceAccount token",
            "POST",
            format!(
                "/api/v1/namespaces/{}/serviceaccounts/{}/token",
                names::SYSTEM_NAMESPACE,
                names::CONTROLLER_NAME
            ),
            Some(
                json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}),
            ),
            vec![],
        ),
        impersonate_admin(),
        (
            "create a Peering (the CLI's job)",
            "POST",
            "/apis/tandem.dev/v1alpha1/peerings".into(),
            Some(
                json!({"apiVersion": "tandem.dev/v1alpha1", "kind": "Peering", "metadata": {"name": "x"}}),
            ),
            vec![],
        ),
        (
            "delete a NamespaceOffloading (the CLI's job)",
            "DELETE",
            "/apis/tandem.dev/v1alpha1/namespaces/default/namespaceoffloadings/offloading".into(),
            None,
            vec![],
        ),
        (
            "create a ShadowPod (the consumer's job)",
            "POST",
            "/apis/tandem.dev/v1alpha1/namespaces/default/shadowpods".into(),
            Some(
                json!({"apiVersion": "tandem.dev/v1alpha1", "kind": "ShadowPod", "metadata": {"name": "x"},
                        "spec": {"pod": {"containers": [{"name": "c", "image": "x"}]}}}),
            ),
            vec![],
        ),
        (
            "edit a Role outside tandem-system",
            "PATCH",
            "/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles/x".into(),
            Some(json!({"rules": []})),
            vec![],
        ),
        (
            "delete a ConfigMap outside tandem-system",
            "DELETE",
            "/api/v1/namespaces/default/configmaps/x".into(),
            None,
            vec![],
        ),
        (
            "create a Lease outside kube-node-lease",
            "POST",
            "/apis/coordination.k8s.io/v1/namespaces/default/leases".into(),
            Some(
                json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "x"}}),
            ),
            vec![],
        ),
        (
            "replace a Node",
            "PUT",
            "/api/v1/nodes/lugano-worker-1".into(),
            Some(
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "lugano-worker-1"}}),
            ),
            vec![],
        ),
    ];
    let mut failures = Vec::new();
    for (what, method, path, body, headers) in &forbidden {
        let code = status_of(ctl, method, path, body.clone(), headers).await;
        if code != 403 {
            failures.push(format!("{what}: {method} {path} → {code}, want 403"));
        }
    }
    // Its job, for contrast: the same identity is not simply refused everything.
    for (what, path) in [
        ("list pods cluster-wide", "/api/v1/pods".to_string()),
        (
            "read its cluster identity",
            format!(
                "/api/v1/namespaces/{}/secrets/{}",
                names::SYSTEM_NAMESPACE,
                names::IDENTITY_SECRET
            ),
        ),
        (
            "list ShadowPods",
            "/apis/tandem.dev/v1alpha1/shadowpods".to_string(),
        ),
        (
            "read its settings",
            format!(
                "/api/v1/namespaces/{}/configmaps/{}",
                names::SYSTEM_NAMESPACE,
                names::CONFIG_MAP
            ),
        ),
    ] {
        let code = status_of(ctl, "GET", &path, None, &[]).await;
        if code != 200 {
            failures.push(format!("{what}: GET {path} → {code}, want 200"));
        }
    }
    assert!(
        failures.is_empty(),
        "the controller's identity:\n{}",
        failures.join("\n")
    );
}
