//! Install and start: the controller runs against a fresh lab cluster with Tandem installed.

use crate::support;

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use tandem_api::names;

#[tokio::test]
async fn install_is_idempotent_and_keeps_the_identity() {
    let cluster = support::Cluster::start("smoke", "eu-west", 1).await;
    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), names::SYSTEM_NAMESPACE);
    let before = secrets.get(names::IDENTITY_SECRET).await.unwrap();
    // A second install with the same ID changes nothing; another ID is refused by name.
    let opts = |id: &str| tandem_admin::install::InstallOptions {
        cluster_id: Some(id.to_string()),
        ..Default::default()
    };
    tandem_admin::install::install(&cluster.client, &opts("smoke"), &mut |_| {})
        .await
        .unwrap();
    let after = secrets.get(names::IDENTITY_SECRET).await.unwrap();
    assert_eq!(
        before.data, after.data,
        "the key pair survives a re-install"
    );
    let err = tandem_admin::install::install(&cluster.client, &opts("other"), &mut |_| {})
        .await
        .unwrap_err();
    // The step, then its cause, as `tandem install` prints them.
    let err = tandem_controller::error::chain(&err);
    assert!(err.contains("already installed as \"smoke\""), "{err}");
    let settings = tandem_admin::install::load_settings(&cluster.client)
        .await
        .unwrap();
    assert_eq!(
        settings.pod_cidr, "10.244.0.0/16",
        "the pod CIDR given at the first install is kept"
    );
}

/// The settings every reconciler reads on each pass come from a watch of `tandem-config`: a
/// change reaches them without a restart, and they are read from the API until the watch has
/// listed them.
#[tokio::test]
async fn watched_settings_follow_the_config_map() {
    use kube::api::{Patch, PatchParams};
    let cluster = support::Cluster::start("watched", "eu-west", 1).await;
    let (cache, watch) = tandem_controller::context::SettingsCache::watch(&cluster.client);
    // Not listed yet: read from the API.
    assert!(cache.watched().is_none());
    let before = cache.get(&cluster.client).await.unwrap();
    assert_eq!(before.pod_cidr, "10.244.0.0/16");
    let watching = tokio::spawn(watch);
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(cluster.client.clone(), names::SYSTEM_NAMESPACE);
    let share = (before.share_percent % 90 + 5).to_string();
    maps.patch(
        names::CONFIG_MAP,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"data": {"sharePercent": share}})),
    )
    .await
    .unwrap();
    support::until(
        "the watched settings follow the change",
        std::time::Duration::from_secs(30),
        || async {
            cache
                .watched()?
                .ok()
                .filter(|s| s.share_percent.to_string() == share)
        },
    )
    .await;
    watching.abort();
}
