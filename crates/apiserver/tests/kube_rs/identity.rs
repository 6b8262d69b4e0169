//! Client certificates authenticate as kube-apiserver reads them: the CN is the user and
//! every Organization value is a group, so RBAC bound to any of them applies.

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

use crate::common::{Cluster, code_of};

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
