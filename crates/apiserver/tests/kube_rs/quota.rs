//! ResourceQuota object counts: a namespace holds no more objects of a resource than its
//! quota's `count/<resource>[.<group>]` allows, however many creates race, and the refusal is
//! kube-apiserver's 403.

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ResourceQuota};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

use super::common::{Cluster, Widget, api_status, widget};

async fn create_namespace(client: &kube::Client, name: &str) {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
}

async fn create_quota(client: &kube::Client, ns: &str, name: &str, hard: serde_json::Value) {
    let quota: ResourceQuota =
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"hard": hard}}))
            .unwrap();
    Api::<ResourceQuota>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &quota)
        .await
        .unwrap();
}

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_creates_leaves_exactly_the_quota_and_other_namespaces_are_free() {
    let cluster = Cluster::start().await;
    let admin = cluster.client.clone();
    for ns in ["team", "other"] {
        create_namespace(&admin, ns).await;
    }
    create_quota(&admin, "team", "small", json!({"count/configmaps": "3"})).await;
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "team");

    let mut flood = tokio::task::JoinSet::new();
    for i in 0..50 {
        let cms = cms.clone();
        flood.spawn(async move {
            let name = format!("cm-{i}");
            (
                name.clone(),
                cms.create(&PostParams::default(), &config_map(&name)).await,
            )
        });
    }
    let mut admitted = 0;
    let mut refused = 0;
    while let Some(joined) = flood.join_next().await {
        let (name, result) = joined.unwrap();
        match result {
            Ok(_) => admitted += 1,
            Err(e) => {
                let status = api_status::<ConfigMap>(Err(e));
                assert_eq!(status.code, 403, "{status:?}");
                assert_eq!(status.reason, "Forbidden", "{status:?}");
                assert_eq!(
                    status.message,
                    format!(
                        r#"configmaps "{name}" is forbidden: exceeded quota: small, requested: count/configmaps=1, used: count/configmaps=3, limited: count/configmaps=3"#
                    )
                );
                refused += 1;
            }
        }
    }
    assert_eq!((admitted, refused), (3, 47));
    let stored = cms.list(&Default::default()).await.unwrap().items;
    assert_eq!(stored.len(), 3, "{stored:?}");

    let gone = stored[0].metadata.name.clone().unwrap();
    cms.delete(&gone, &DeleteParams::default()).await.unwrap();
    cms.create(&PostParams::default(), &config_map("after-delete"))
        .await
        .expect("a deletion frees a place");
    let full = api_status(
        cms.create(&PostParams::default(), &config_map("one-too-many"))
            .await,
    );
    assert_eq!(full.code, 403, "{full:?}");
    // A server-side dry run (`kubectl create --dry-run=server`) is refused as the create
    // would be, and a dry run that fits stores nothing either.
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let dry_full = api_status(cms.create(&dry, &config_map("dry-too-many")).await);
    assert_eq!(dry_full.code, 403, "{dry_full:?}");
    assert!(
        dry_full.message.contains("exceeded quota: small"),
        "{dry_full:?}"
    );
    cms.delete("after-delete", &DeleteParams::default())
        .await
        .unwrap();
    cms.create(&dry, &config_map("dry-fits"))
        .await
        .expect("a dry run within the quota");
    assert_eq!(cms.list(&Default::default()).await.unwrap().items.len(), 2);

    let elsewhere: Api<ConfigMap> = Api::namespaced(admin, "other");
    for i in 0..5 {
        elsewhere
            .create(&PostParams::default(), &config_map(&format!("cm-{i}")))
            .await
            .expect("a namespace without a quota is not limited");
    }
}

#[tokio::test]
async fn custom_resources_and_legacy_names_are_counted_too() {
    let cluster = Cluster::start().await;
    cluster.install_widget_crd().await;
    let admin = cluster.client.clone();
    create_quota(
        &admin,
        "default",
        "widgets-and-configmaps",
        json!({"count/widgets.tandem.test": "1", "configmaps": "1"}),
    )
    .await;

    let widgets: Api<Widget> = Api::namespaced(admin.clone(), "default");
    let pp = PostParams::default();
    widgets
        .create(&pp, &widget("first", 1, "red"))
        .await
        .unwrap();
    let second = api_status(widgets.create(&pp, &widget("second", 1, "red")).await);
    assert_eq!(second.code, 403, "{second:?}");
    assert_eq!(
        second.message,
        r#"widgets.tandem.test "second" is forbidden: exceeded quota: widgets-and-configmaps, requested: count/widgets.tandem.test=1, used: count/widgets.tandem.test=1, limited: count/widgets.tandem.test=1"#
    );

    let cms: Api<ConfigMap> = Api::namespaced(admin, "default");
    cms.create(&pp, &config_map("first")).await.unwrap();
    let over = api_status(cms.create(&pp, &config_map("over")).await);
    assert_eq!(over.code, 403, "{over:?}");
    assert!(
        over.message
            .contains("exceeded quota: widgets-and-configmaps, requested: configmaps=1"),
        "{:?}",
        over.message
    );
}
