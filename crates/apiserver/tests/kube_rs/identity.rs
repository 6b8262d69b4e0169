//! Client certificates authenticate as kube-apiserver reads them: the CN is the user and
//! every Organization value is a group, so RBAC bound to any of them applies. The CAs of
//! those certificates are published for the cluster's components, as kube-apiserver does,
//! in `kube-system/extension-apiserver-authentication`.

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::{ClusterRole, Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tandem_apiserver::{ApiServer, Config};

use super::common::{Cluster, code_of, eventually};

#[tokio::test]
async fn a_certificate_with_several_groups_authenticates_in_all_of_them() {
    let cluster = Cluster::start().await;
    let cases: [&[&str]; 3] = [&[], &["g1"], &["g1", "g2"]];
    for groups in cases {
        let client = cluster.client_for("dana", groups).await;
        let review = Api::<SelfSubjectReview>::all(client)
            .create(&PostParams::default(), &SelfSubjectReview::default())
            .await
            .unwrap_or_else(|e| panic!("{groups:?}: SelfSubjectReview: {e}"));
        let info = review.status.and_then(|s| s.user_info).expect("userInfo");
        assert_eq!(info.username.as_deref(), Some("dana"), "{groups:?}");
        let mut want: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
        want.push("system:authenticated".into());
        assert_eq!(info.groups.unwrap_or_default(), want);
    }
}

#[tokio::test]
async fn rbac_bound_to_a_group_in_the_middle_applies() {
    let cluster = Cluster::start().await;
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "configmap-reader"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}],
    }))
    .unwrap();
    Api::<ClusterRole>::all(cluster.client.clone())
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    cluster
        .bind_cluster_role("g2-reads-configmaps", "configmap-reader", "Group", "g2")
        .await;
    // (groups in the certificate, expected HTTP code)
    // g2 neither first nor last, so a certificate keeping only one O cannot pass.
    let cases: [(&[&str], u16); 3] = [
        (&["g1", "g3"], 403),
        (&["g1", "g2", "g3"], 200),
        (&["g2"], 200),
    ];
    for (groups, want) in cases {
        let client = cluster.client_for("dana", groups).await;
        let list = Api::<ConfigMap>::namespaced(client, "default")
            .list(&ListParams::default())
            .await;
        assert_eq!(
            code_of(list),
            want,
            "listing configmaps as dana in {groups:?}"
        );
    }
}

/// The `client-ca-file` bundle `server` must publish: its cluster CA, then its
/// kubelet-client CA.
fn client_ca_bundle(server: &ApiServer) -> String {
    format!(
        "{}\n{}\n",
        server.ca_pem().trim_end(),
        server.kubelet_client_ca_pem().trim_end()
    )
}

async fn client_ca_file(client: &kube::Client) -> Option<String> {
    Api::<ConfigMap>::namespaced(client.clone(), "kube-system")
        .get_opt("extension-apiserver-authentication")
        .await
        .unwrap()?
        .data?
        .remove("client-ca-file")
}

#[tokio::test]
async fn client_cas_are_published_readable_through_the_reader_role_and_restored() {
    let cluster = Cluster::start().await;
    let admin = &cluster.client;
    let bundle = client_ca_bundle(&cluster.server);
    assert_eq!(
        bundle.matches("-----BEGIN CERTIFICATE-----").count(),
        2,
        "{bundle}"
    );
    assert_ne!(
        cluster.server.ca_pem(),
        cluster.server.kubelet_client_ca_pem()
    );
    assert_eq!(
        client_ca_file(admin).await.as_deref(),
        Some(bundle.as_str()),
        "published from startup: the cluster CA, then the kubelet-client CA"
    );

    // The Role kube-apiserver bootstraps, bound to no one.
    let role = Api::<Role>::namespaced(admin.clone(), "kube-system")
        .get("extension-apiserver-authentication-reader")
        .await
        .expect("the reader Role is bootstrapped");
    assert_eq!(
        serde_json::to_value(&role.rules).unwrap(),
        json!([{"apiGroups": [""], "resources": ["configmaps"],
                "resourceNames": ["extension-apiserver-authentication"],
                "verbs": ["get", "list", "watch"]}])
    );
    let dana = cluster.client_for("dana", &[]).await;
    let configmaps = Api::<ConfigMap>::namespaced(dana, "kube-system");
    assert_eq!(
        code_of(configmaps.get("extension-apiserver-authentication").await),
        403,
        "not readable by every user"
    );
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "dana-reads-client-cas", "namespace": "kube-system"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": "extension-apiserver-authentication-reader"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "dana"}],
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), "kube-system")
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let read = configmaps
        .get("extension-apiserver-authentication")
        .await
        .expect("readable through the reader Role");
    assert_eq!(read.data.unwrap()["client-ca-file"], bundle);
    let other = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("other".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(admin.clone(), "kube-system")
        .create(&PostParams::default(), &other)
        .await
        .unwrap();
    assert_eq!(
        code_of(configmaps.get("other").await),
        403,
        "the Role names one ConfigMap only"
    );

    // Edited or deleted, it comes back as it was; keys of its own are kept.
    let admin_configmaps = Api::<ConfigMap>::namespaced(admin.clone(), "kube-system");
    admin_configmaps
        .patch(
            "extension-apiserver-authentication",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"client-ca-file": "forged", "extra": "kept"}})),
        )
        .await
        .unwrap();
    eventually("client-ca-file restored after an edit", || async {
        let cm = admin_configmaps
            .get("extension-apiserver-authentication")
            .await
            .unwrap();
        let data = cm.data.unwrap_or_default();
        (data.get("client-ca-file") == Some(&bundle)).then_some(())
    })
    .await;
    let data = admin_configmaps
        .get("extension-apiserver-authentication")
        .await
        .unwrap()
        .data
        .unwrap();
    assert_eq!(data.get("extra").map(String::as_str), Some("kept"));
    admin_configmaps
        .delete(
            "extension-apiserver-authentication",
            &DeleteParams::default(),
        )
        .await
        .unwrap();
    eventually("the ConfigMap restored after a delete", || async {
        (client_ca_file(admin).await.as_ref() == Some(&bundle)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_restarted_server_publishes_its_new_kubelet_client_ca_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        data_dir: Some(dir.path().to_path_buf()),
        ..Config::default()
    };
    let first = Cluster::start_with(config.clone()).await;
    let first_bundle = client_ca_bundle(&first.server);
    assert_eq!(
        client_ca_file(&first.client).await.as_deref(),
        Some(first_bundle.as_str())
    );
    let cluster_ca = first.server.ca_pem().to_string();
    first.server.shutdown();

    let second = Cluster::start_with(config).await;
    assert_eq!(second.server.ca_pem(), cluster_ca, "the cluster CA is kept");
    let bundle = client_ca_bundle(&second.server);
    assert_ne!(
        bundle, first_bundle,
        "each process has a kubelet-client CA of its own"
    );
    assert_eq!(
        client_ca_file(&second.client).await.as_deref(),
        Some(bundle.as_str()),
        "the stored ConfigMap is brought up to date at startup"
    );
    let named = |name: &str| format!("metadata.name={name}");
    let configmaps = Api::<ConfigMap>::namespaced(second.client.clone(), "kube-system")
        .list(&ListParams::default().fields(&named("extension-apiserver-authentication")))
        .await
        .unwrap();
    assert_eq!(configmaps.items.len(), 1);
    let roles = Api::<Role>::namespaced(second.client.clone(), "kube-system")
        .list(&ListParams::default().fields(&named("extension-apiserver-authentication-reader")))
        .await
        .unwrap();
    assert_eq!(roles.items.len(), 1);
}

/// RBAC's escalation check: a user allowed to write bindings may bind only a role it may
/// `bind`, or one granting nothing it does not hold itself — never `cluster-admin`.
#[tokio::test]
async fn writing_bindings_does_not_grant_more_than_the_writer_holds() {
    let cluster = Cluster::start().await;
    let admin = cluster.client.clone();
    let role = |name: &str, rules: serde_json::Value| -> ClusterRole {
        serde_json::from_value(json!({"metadata": {"name": name}, "rules": rules})).unwrap()
    };
    let roles: Api<ClusterRole> = Api::all(admin.clone());
    let cm = json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]);
    for r in [
        role(
            "binder",
            json!([
                {"apiGroups": ["rbac.authorization.k8s.io"],
                 "resources": ["rolebindings", "clusterrolebindings"], "verbs": ["create", "update", "patch"]},
                {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"],
                 "verbs": ["bind"], "resourceNames": ["bindable"]},
                {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]},
            ]),
        ),
        role("held", cm.clone()),
        role(
            "bindable",
            json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]),
        ),
        role(
            "more",
            json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["delete"]}]),
        ),
    ] {
        roles.create(&PostParams::default(), &r).await.unwrap();
    }
    cluster
        .bind_cluster_role("dana-binds", "binder", "User", "dana")
        .await;
    let dana = cluster.client_for("dana", &[]).await;
    let binding = |role: &str| -> RoleBinding {
        serde_json::from_value(json!({
            "metadata": {"name": format!("to-{role}")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "eve"}],
        }))
        .unwrap()
    };
    let bindings: Api<RoleBinding> = Api::namespaced(dana.clone(), "default");
    for (role, want) in [
        ("cluster-admin", 403),
        ("more", 403),
        ("held", 201),
        ("bindable", 201),
    ] {
        let got = match bindings
            .create(&PostParams::default(), &binding(role))
            .await
        {
            Ok(_) => 201,
            Err(kube::Error::Api(e)) => {
                if want == 403 {
                    assert!(
                        e.message.contains("not currently held"),
                        "{role}: {}",
                        e.message
                    );
                }
                e.code
            }
            Err(e) => panic!("{role}: {e}"),
        };
        assert_eq!(got, want, "dana binding {role}");
    }
    // Cluster-wide too, and by changing the role a binding names (a new binding: roleRef
    // cannot change).
    let crb: k8s_openapi::api::rbac::v1::ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "eve-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "dana"}],
    }))
    .unwrap();
    let refused = Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(dana)
        .create(&PostParams::default(), &crb)
        .await;
    assert_eq!(code_of(refused), 403, "dana binding herself cluster-admin");
}
