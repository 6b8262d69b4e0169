//! Item 5: what the server refuses, and with which code: stale writes (409), RBAC (403),
//! anonymous requests RBAC does not allow (403), expired or wrong tokens (401), schema
//! violations (422).

use std::collections::BTreeMap;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, Role, RoleBinding};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

use super::common::{Cluster, Widget, api_status, code_of, eventually, widget};

#[tokio::test]
async fn replace_with_a_stale_resource_version_is_a_conflict() {
    let cluster = Cluster::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), "default");
    let pp = PostParams::default();
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("cfg".into());
    let stale = cms.create(&pp, &cm).await.unwrap();
    let mut fresh = stale.clone();
    fresh.data = Some(BTreeMap::from([("by".into(), "first".into())]));
    cms.replace("cfg", &pp, &fresh)
        .await
        .expect("replace at the current version");

    let mut late = stale.clone();
    late.data = Some(BTreeMap::from([("by".into(), "second".into())]));
    let status = api_status(cms.replace("cfg", &pp, &late).await);
    assert_eq!(status.code, 409, "{status:?}");
    assert_eq!(status.reason, "Conflict");
    assert!(
        status.message.contains("cfg"),
        "the message names the object: {:?}",
        status.message
    );
    assert_eq!(
        cms.get("cfg").await.unwrap().data.unwrap()["by"],
        "first",
        "the stale write changed nothing"
    );
}

#[tokio::test]
async fn rbac_grants_only_what_the_role_says() {
    let cluster = Cluster::start().await;
    let admin = cluster.client.clone();
    let pp = PostParams::default();
    for ns in ["team-a", "team-b"] {
        let namespace: Namespace =
            serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        Api::<Namespace>::all(admin.clone())
            .create(&pp, &namespace)
            .await
            .unwrap();
        let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "cfg"}})).unwrap();
        Api::<ConfigMap>::namespaced(admin.clone(), ns)
            .create(&pp, &cm)
            .await
            .unwrap();
    }
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "cm-reader"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}],
    }))
    .unwrap();
    Api::<Role>::namespaced(admin.clone(), "team-a")
        .create(&pp, &role)
        .await
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "alice-reads"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-reader"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}],
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), "team-a")
        .create(&pp, &binding)
        .await
        .unwrap();

    let alice = cluster.client_for("alice", &["devs"]).await;
    let me = whoami(alice.clone())
        .await
        .expect("anyone may review themselves")
        .status
        .and_then(|s| s.user_info)
        .expect("userInfo");
    assert_eq!(me.username.as_deref(), Some("alice"));
    let groups = me.groups.unwrap_or_default();
    for want in ["devs", "system:authenticated"] {
        assert!(groups.iter().any(|g| g == want), "{want} in {groups:?}");
    }
    let team_a: Api<ConfigMap> = Api::namespaced(alice.clone(), "team-a");
    let team_b: Api<ConfigMap> = Api::namespaced(alice.clone(), "team-b");
    // Authorizers learn of new bindings asynchronously on a kube-apiserver too.
    eventually("alice may get configmaps in team-a", || {
        let team_a = team_a.clone();
        async move { (code_of(team_a.get("cfg").await) == 200).then_some(()) }
    })
    .await;
    let list = api_status(team_a.list(&Default::default()).await);
    assert_eq!(list.code, 403, "list is not granted: {list:?}");
    assert_eq!(list.reason, "Forbidden");
    assert!(
        list.message.contains(
            r#"User "alice" cannot list resource "configmaps" in API group "" in the namespace "team-a""#
        ),
        "the refusal names the user, verb, resource and namespace: {:?}",
        list.message
    );
    let other = api_status(team_b.get("cfg").await);
    assert_eq!(other.code, 403, "the Role is namespaced: {other:?}");
    assert!(
        other.message.contains(
            r#"User "alice" cannot get resource "configmaps" in API group "" in the namespace "team-b""#
        ),
        "{:?}",
        other.message
    );
    let write = api_status(
        team_a
            .patch(
                "cfg",
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"x": "y"}})),
            )
            .await,
    );
    assert_eq!(write.code, 403, "patch is not granted: {write:?}");

    // The certificate's organisation is a group: a ClusterRoleBinding to `devs` applies.
    let namespaces: Api<Namespace> = Api::all(alice);
    assert_eq!(code_of(namespaces.list(&Default::default()).await), 403);
    let reader: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "ns-reader"},
        "rules": [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list"]}],
    }))
    .unwrap();
    Api::<ClusterRole>::all(admin.clone())
        .create(&pp, &reader)
        .await
        .unwrap();
    cluster
        .bind_cluster_role("devs-read-ns", "ns-reader", "Group", "devs")
        .await;
    let listed = eventually("group devs may list namespaces", || {
        let namespaces = namespaces.clone();
        async move { namespaces.list(&Default::default()).await.ok() }
    })
    .await;
    assert!(
        listed
            .items
            .iter()
            .any(|n| n.metadata.name.as_deref() == Some("team-b"))
    );
}

/// A request with no credentials at all is `system:anonymous` in `system:unauthenticated`, as
/// on a kube-apiserver with its default `--anonymous-auth=true`: RBAC decides what it may do
/// (the bootstrap policy lets it read `/version`; a binding like kubeadm's for `cluster-info`
/// lets it read one ConfigMap), while a token that does not authenticate is still a 401.
#[tokio::test]
async fn requests_without_credentials_are_anonymous_and_rbac_decides() {
    let cluster = Cluster::start().await;
    let admin = cluster.client.clone();
    let anonymous = cluster.anonymous_client().await;

    let version = anonymous
        .apiserver_version()
        .await
        .expect("/version is public, as system:public-info-viewer grants");
    assert!(!version.git_version.is_empty(), "{version:?}");

    let listed = api_status(
        Api::<ConfigMap>::namespaced(anonymous.clone(), "default")
            .list(&Default::default())
            .await,
    );
    assert_eq!(listed.code, 403, "authenticated, then refused: {listed:?}");
    assert_eq!(listed.reason, "Forbidden");
    assert_eq!(
        listed.message,
        r#"configmaps is forbidden: User "system:anonymous" cannot list resource "configmaps" in API group "" in the namespace "default""#
    );

    let pp = PostParams::default();
    let public: Api<ConfigMap> = Api::namespaced(admin.clone(), "kube-public");
    for name in ["cluster-info", "private"] {
        let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        public.create(&pp, &cm).await.unwrap();
    }
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "cluster-info-reader"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                   "resourceNames": ["cluster-info"], "verbs": ["get"]}],
    }))
    .unwrap();
    Api::<Role>::namespaced(admin.clone(), "kube-public")
        .create(&pp, &role)
        .await
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "anonymous-reads-cluster-info"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": "cluster-info-reader"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                      "name": "system:anonymous"}],
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), "kube-public")
        .create(&pp, &binding)
        .await
        .unwrap();

    let as_anonymous: Api<ConfigMap> = Api::namespaced(anonymous.clone(), "kube-public");
    let read = eventually("system:anonymous may get cluster-info", || {
        let as_anonymous = as_anonymous.clone();
        async move { as_anonymous.get("cluster-info").await.ok() }
    })
    .await;
    assert_eq!(read.metadata.name.as_deref(), Some("cluster-info"));
    let other = api_status(as_anonymous.get("private").await);
    assert_eq!(other.code, 403, "only the named ConfigMap: {other:?}");
    assert!(
        other
            .message
            .contains(r#"User "system:anonymous" cannot get resource "configmaps""#),
        "{:?}",
        other.message
    );
    assert_eq!(
        code_of(as_anonymous.list(&Default::default()).await),
        403,
        "resourceNames never grant list"
    );

    let wrong = cluster.client_with_token("not-a-token").await;
    let refused = api_status(
        Api::<ConfigMap>::namespaced(wrong, "kube-public")
            .get("cluster-info")
            .await,
    );
    assert_eq!(
        refused.code, 401,
        "a token that does not authenticate is no anonymous request: {refused:?}"
    );
    assert_eq!(refused.reason, "Unauthorized");
}

/// The Secret behind token `abcdef.0123456789abcdef`; `extra` entries override the defaults.
fn bootstrap_secret(expiration: chrono::DateTime<chrono::Utc>, extra: &[(&str, &str)]) -> Secret {
    let mut data: BTreeMap<String, String> = [
        ("token-id", "abcdef".to_string()),
        ("token-secret", "0123456789abcdef".to_string()),
        ("usage-bootstrap-authentication", "true".to_string()),
        (
            "expiration",
            expiration.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        ),
    ]
    .map(|(k, v)| (k.to_string(), v))
    .into();
    data.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    Secret {
        metadata: ObjectMeta {
            name: Some("bootstrap-token-abcdef".into()),
            namespace: Some("kube-system".into()),
            ..Default::default()
        },
        type_: Some("bootstrap.kubernetes.io/token".into()),
        string_data: Some(data),
        ..Default::default()
    }
}

async fn whoami(client: kube::Client) -> kube::Result<SelfSubjectReview> {
    Api::<SelfSubjectReview>::all(client)
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
}

#[tokio::test]
async fn bootstrap_tokens_authenticate_until_they_expire() {
    let cluster = Cluster::start().await;
    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), "kube-system");
    let hour = chrono::Duration::hours(1);
    secrets
        .create(
            &PostParams::default(),
            &bootstrap_secret(chrono::Utc::now() - hour, &[]),
        )
        .await
        .unwrap();
    let token_client = cluster.client_with_token("abcdef.0123456789abcdef").await;
    let expired = api_status(whoami(token_client.clone()).await);
    assert_eq!(
        expired.code, 401,
        "an expired bootstrap token is refused: {expired:?}"
    );
    assert_eq!(expired.reason, "Unauthorized", "{expired:?}");

    let renew = |extra: &'static [(&'static str, &'static str)]| {
        let secrets = secrets.clone();
        async move {
            let mut renewed = secrets.get("bootstrap-token-abcdef").await.unwrap();
            renewed.data = None;
            renewed.string_data = bootstrap_secret(chrono::Utc::now() + hour, extra).string_data;
            secrets
                .replace("bootstrap-token-abcdef", &PostParams::default(), &renewed)
                .await
                .unwrap();
        }
    };
    renew(&[("usage-bootstrap-authentication", "false")]).await;
    assert_eq!(
        api_status(whoami(token_client.clone()).await).code,
        401,
        "a token not meant for authentication is refused"
    );

    renew(&[(
        "auth-extra-groups",
        "system:bootstrappers:kubeadm:default-node-token",
    )])
    .await;
    let review = whoami(token_client)
        .await
        .expect("a valid bootstrap token authenticates");
    let user = review.status.and_then(|s| s.user_info).expect("userInfo");
    assert_eq!(user.username.as_deref(), Some("system:bootstrap:abcdef"));
    let groups = user.groups.unwrap_or_default();
    for want in [
        "system:bootstrappers",
        "system:bootstrappers:kubeadm:default-node-token",
        "system:authenticated",
    ] {
        assert!(groups.iter().any(|g| g == want), "{want} in {groups:?}");
    }

    let wrong = cluster.client_with_token("abcdef.0000000000000000").await;
    assert_eq!(
        api_status(whoami(wrong).await).code,
        401,
        "a wrong secret is refused"
    );
}

/// A ServiceAccount token requested for a pod (as kubelet requests it) authenticates as the
/// account while that pod exists, and not after; a token for another audience, or bound to a
/// pod of another account, is no credential.
#[tokio::test]
async fn pod_bound_tokens_die_with_their_pod_and_other_audiences_are_refused() {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
    let cluster = Cluster::start().await;
    let accounts: Api<ServiceAccount> = Api::namespaced(cluster.client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "default");
    let pp = PostParams::default();
    for name in ["app", "other"] {
        accounts
            .create(
                &pp,
                &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
            )
            .await
            .unwrap();
    }
    let pod: Pod = pods
        .create(
            &pp,
            &serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": {
                "serviceAccountName": "app", "containers": [{"name": "c", "image": "nginx"}]}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let uid = pod.metadata.uid.clone().unwrap();
    let request = |account: &str, audiences: &[&str]| -> TokenRequest {
        serde_json::from_value(json!({"spec": {
            "audiences": audiences, "expirationSeconds": 3607,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": uid}}}))
        .unwrap_or_else(|e| panic!("{account}: {e}"))
    };
    let token = accounts
        .create_token_request("app", &pp, &request("app", &[]))
        .await
        .expect("a token bound to the pod")
        .status
        .unwrap()
        .token;
    let user = whoami(cluster.client_with_token(&token).await)
        .await
        .expect("the bound token authenticates")
        .status
        .unwrap()
        .user_info
        .unwrap();
    assert_eq!(
        user.username.as_deref(),
        Some("system:serviceaccount:default:app")
    );

    let vault = accounts
        .create_token_request("app", &pp, &request("app", &["vault"]))
        .await
        .unwrap()
        .status
        .unwrap()
        .token;
    assert_eq!(
        api_status(whoami(cluster.client_with_token(&vault).await).await).code,
        401,
        "a token for another audience is refused"
    );
    let status = api_status(
        accounts
            .create_token_request("other", &pp, &request("other", &[]))
            .await,
    );
    assert_eq!(
        status.code, 422,
        "bound to a pod of another account: {status:?}"
    );
    assert!(
        status.message.contains("runs as ServiceAccount app"),
        "{status:?}"
    );

    pods.delete(
        "web",
        &kube::api::DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    eventually("the pod gone", || async {
        pods.get_opt("web").await.unwrap().is_none().then_some(())
    })
    .await;
    assert_eq!(
        api_status(whoami(cluster.client_with_token(&token).await).await).code,
        401,
        "a token outlives its pod"
    );
}

#[tokio::test]
async fn custom_resources_violating_their_schema_are_refused_naming_the_field() {
    let cluster = Cluster::start().await;
    cluster.install_widget_crd().await;
    let widgets: Api<Widget> = Api::namespaced(cluster.client.clone(), "default");
    for (name, size) in [("zero", 0), ("huge", 11)] {
        let status = api_status(
            widgets
                .create(&PostParams::default(), &widget(name, size, "red"))
                .await,
        );
        assert_eq!(status.code, 422, "size {size}: {status:?}");
        assert_eq!(status.reason, "Invalid");
        let causes: Vec<String> = status
            .details
            .as_ref()
            .map(|d| d.causes.iter().map(|c| c.field.clone()).collect())
            .unwrap_or_default();
        assert!(
            status.message.contains("spec.size") && causes.iter().any(|f| f == "spec.size"),
            "size {size}: the message and the causes name spec.size: {:?} causes {causes:?}",
            status.message
        );
        assert!(
            status
                .message
                .contains(&format!(r#"Widget.tandem.test "{name}" is invalid"#)),
            "the message names the object: {:?}",
            status.message
        );
    }
    widgets
        .create(&PostParams::default(), &widget("ok", 10, "red"))
        .await
        .expect("size 10 is within bounds");
    let wrong_type = api_status(
        widgets
            .patch(
                "ok",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"size": "big"}})),
            )
            .await,
    );
    assert_eq!(wrong_type.code, 422, "{wrong_type:?}");
    assert!(
        wrong_type.message.contains("spec.size"),
        "{:?}",
        wrong_type.message
    );
    let missing = api_status(
        widgets
            .patch(
                "ok",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"color": null}})),
            )
            .await,
    );
    assert_eq!(missing.code, 422, "color is required: {missing:?}");
    assert!(
        missing.message.contains("spec.color"),
        "{:?}",
        missing.message
    );
    assert_eq!(
        widgets.get("ok").await.unwrap().spec.size,
        10,
        "refused patches change nothing"
    );
}

/// A protobuf body with a field the server cannot map is refused naming the field, and
/// nothing is stored: the field is never silently dropped.
#[tokio::test]
async fn protobuf_fields_the_server_cannot_map_are_refused_by_name() {
    use k8s_pb::api::{apps, core};
    use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
    use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
    use prost::Message;

    let cluster = Cluster::start().await;
    let labels = BTreeMap::from([("app".to_string(), "web".to_string())]);
    let deployment = apps::v1::Deployment {
        metadata: Some(meta::ObjectMeta {
            name: Some("web".into()),
            ..Default::default()
        }),
        spec: Some(apps::v1::DeploymentSpec {
            selector: Some(meta::LabelSelector {
                match_labels: labels.clone(),
                ..Default::default()
            }),
            template: Some(core::v1::PodTemplateSpec {
                metadata: Some(meta::ObjectMeta {
                    labels,
                    ..Default::default()
                }),
                spec: Some(core::v1::PodSpec {
                    containers: vec![core::v1::Container {
                        name: Some("nginx".into()),
                        image: Some("nginx".into()),
                        ..Default::default()
                    }],
                    volumes: vec![core::v1::Volume {
                        name: Some("data".into()),
                        volume_source: Some(Default::default()),
                    }],
                    ..Default::default()
                }),
            }),
            ..Default::default()
        }),
        status: None,
    };
    let envelope = Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some("apps/v1".into()),
            kind: Some("Deployment".into()),
        }),
        raw: Some(deployment.encode_to_vec()),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    let request = http::Request::post("/apis/apps/v1/namespaces/default/deployments")
        .header("content-type", "application/vnd.kubernetes.protobuf")
        .body([b"k8s\0".as_slice(), &envelope.encode_to_vec()].concat())
        .unwrap();
    let status = api_status(cluster.client.request_text(request).await);
    assert_eq!(status.code, 415, "{status:?}");
    assert!(
        status.message.contains("spec.template.spec.volumes[0]"),
        "the message names the field: {:?}",
        status.message
    );
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(cluster.client.clone(), "default");
    assert_eq!(code_of(deployments.get("web").await), 404, "nothing stored");
}

#[tokio::test]
async fn pod_security_admission_enforces_the_namespace_label() {
    use k8s_openapi::api::core::v1::Pod;
    let cluster = Cluster::start().await;
    let admin = cluster.client.clone();
    let pp = PostParams::default();
    for (ns, level) in [
        ("open", None),
        ("guarded", Some("baseline")),
        ("hardened", Some("restricted")),
    ] {
        let mut labels = json!({});
        if let Some(level) = level {
            labels["pod-security.kubernetes.io/enforce"] = json!(level);
        }
        let namespace: Namespace =
            serde_json::from_value(json!({"metadata": {"name": ns, "labels": labels}})).unwrap();
        Api::<Namespace>::all(admin.clone())
            .create(&pp, &namespace)
            .await
            .unwrap();
    }
    let pod = |name: &str, spec: serde_json::Value| -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
    };
    let privileged = json!({"containers": [{"name": "app", "image": "nginx",
        "securityContext": {"privileged": true}}]});
    let plain = json!({"containers": [{"name": "app", "image": "nginx"}]});
    let hardened = json!({"securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "app", "image": "nginx", "securityContext": {
            "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}]});

    // No label: anything goes, as on a cluster without Pod Security admission configured.
    Api::<Pod>::namespaced(admin.clone(), "open")
        .create(&pp, &pod("p", privileged.clone()))
        .await
        .expect("no level, no check");
    let guarded: Api<Pod> = Api::namespaced(admin.clone(), "guarded");
    let status = api_status(guarded.create(&pp, &pod("p", privileged.clone())).await);
    assert_eq!(status.code, 403, "{status:?}");
    assert!(
        status
            .message
            .contains("violates PodSecurity \"baseline:latest\": privileged")
            && status.message.contains("container \"app\""),
        "{}",
        status.message
    );
    guarded
        .create(&pp, &pod("plain", plain.clone()))
        .await
        .expect("baseline admits a plain pod");
    let restricted: Api<Pod> = Api::namespaced(admin.clone(), "hardened");
    let status = api_status(restricted.create(&pp, &pod("plain", plain)).await);
    assert_eq!(status.code, 403, "{status:?}");
    assert!(
        status.message.contains("restricted:latest"),
        "{}",
        status.message
    );
    restricted
        .create(&pp, &pod("hardened", hardened))
        .await
        .expect("restricted admits a hardened pod");
    assert!(
        guarded.get_opt("p").await.unwrap().is_none(),
        "a refused pod is not stored"
    );
}
