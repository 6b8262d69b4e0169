//! `tandem offload namespace` / `tandem unoffload namespace` as a user runs them against the
//! consumer's kubeconfig: twin namespace on the selected provider, errors that name the step.

#[path = "../../controller/tests/support/mod.rs"]
mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use serde_json::json;

async fn tandem(args: &[&str], kubeconfig: &std::path::Path) -> (bool, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env("RUST_LOG", "warn")
        .output()
        .await
        .expect("tandem runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// rome (consumer) peered with milan (provider) under `grant`; the admin kubeconfig of rome a
/// user would pass to `tandem`, in a directory that lives as long as the returned guard.
async fn peered(
    grant: serde_json::Value,
) -> (
    support::Cluster,
    support::Cluster,
    tempfile::TempDir,
    std::path::PathBuf,
) {
    let consumer = support::Cluster::start("rome", "eu-south", 1).await;
    let provider = support::Cluster::start("milan", "eu-west", 1).await;
    support::peer_with(&consumer, &provider, grant, None).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("rome.kubeconfig");
    consumer
        .lab
        .server
        .write_admin_kubeconfig(&kubeconfig)
        .unwrap();
    (consumer, provider, dir, kubeconfig)
}

#[tokio::test]
async fn offload_and_unoffload_a_namespace() {
    let (consumer, provider, _dir, kubeconfig) = peered(json!({"cpu": "2", "pods": "10"})).await;
    namespace(&consumer.client, "shop").await;

    let (ok, _, err) = tandem(&["offload", "namespace", "nowhere"], &kubeconfig).await;
    assert!(!ok);
    assert!(err.contains("namespace nowhere does not exist"), "{err}");

    let (ok, out, err) = tandem(
        &[
            "offload",
            "namespace",
            "shop",
            "--pod-offloading-strategy",
            "Remote",
            "--selector",
            "region=eu-west",
        ],
        &kubeconfig,
    )
    .await;
    assert!(ok, "stdout: {out}\nstderr: {err}");
    assert!(
        out.contains("offloaded to milan: twin namespace shop-rome"),
        "{out}"
    );
    let on_provider: Api<Namespace> = Api::all(provider.client.clone());
    assert!(on_provider.get("shop-rome").await.is_ok());

    // The namespace may also come as kubectl's -n, before the verb.
    let (ok, out, err) = tandem(&["-n", "shop", "unoffload", "namespace"], &kubeconfig).await;
    assert!(ok, "stdout: {out}\nstderr: {err}");
    support::until("twin namespace gone", Duration::from_secs(10), || async {
        on_provider
            .get_opt("shop-rome")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;

    let (ok, _, err) = tandem(&["unoffload", "namespace", "shop"], &kubeconfig).await;
    assert!(!ok);
    assert!(err.contains("namespace shop is not offloaded"), "{err}");
}

/// Creates namespace `name` on `client`.
async fn namespace(client: &kube::Client, name: &str) {
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn offload_warns_when_the_mapping_breaks_stateful_set_dns_names() {
    let (consumer, _provider, _dir, kubeconfig) = peered(json!({"cpu": "2", "pods": "10"})).await;
    namespace(&consumer.client, "web").await;
    namespace(&consumer.client, "shop").await;
    let set: k8s_openapi::api::apps::v1::StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "db"},
        "spec": {"serviceName": "db", "replicas": 0,
                 "selector": {"matchLabels": {"app": "db"}},
                 "template": {"metadata": {"labels": {"app": "db"}},
                              "spec": {"containers": [{"name": "db", "image": "postgres"}]}}},
    }))
    .unwrap();
    Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(consumer.client.clone(), "shop")
        .create(&PostParams::default(), &set)
        .await
        .unwrap();

    // No StatefulSet: no warning.
    let (ok, out, err) = tandem(&["offload", "namespace", "web"], &kubeconfig).await;
    assert!(ok, "stdout: {out}\nstderr: {err}");
    assert!(!err.contains("warning"), "{err}");

    // A StatefulSet and the default mapping (shop-rome on providers): one line says what to do.
    let (ok, out, err) = tandem(&["offload", "namespace", "shop"], &kubeconfig).await;
    assert!(ok, "stdout: {out}\nstderr: {err}");
    let warnings: Vec<&str> = err.lines().filter(|l| l.starts_with("warning:")).collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(
        warnings[0].contains("namespace shop")
            && warnings[0].contains("db")
            && warnings[0].contains("--namespace-mapping-strategy EnforceSameName"),
        "{err}"
    );

    // The same name on providers keeps `db-0.db.shop.svc` meaningful: no warning.
    let (ok, out, err) = tandem(
        &[
            "offload",
            "namespace",
            "shop",
            "--namespace-mapping-strategy",
            "EnforceSameName",
        ],
        &kubeconfig,
    )
    .await;
    assert!(ok, "stdout: {out}\nstderr: {err}");
    assert!(!err.contains("warning"), "{err}");
    assert!(
        out.contains("offloaded to milan: twin namespace shop"),
        "{out}"
    );
}

#[tokio::test]
async fn unoffload_reports_retained_claims_and_delete_data_removes_them() {
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    let (consumer, provider, _dir, kubeconfig) =
        peered(json!({"cpu": "2", "pods": "10", "requests.storage": "5Gi"})).await;
    let on_provider: Api<Namespace> = Api::all(provider.client.clone());
    // A claim provisioned on milan (the scheduler's pick written by hand).
    let provision = |ns: &'static str| {
        let client = consumer.client.clone();
        let remote = provider.client.clone();
        async move {
            let claim: PersistentVolumeClaim = serde_json::from_value(json!({
                "metadata": {"name": "data", "annotations": {
                    tandem_api::names::SELECTED_NODE_ANNOTATION: "tandem-milan"}},
                "spec": {"accessModes": ["ReadWriteOnce"],
                         "storageClassName": tandem_api::names::STORAGE_CLASS,
                         "resources": {"requests": {"storage": "1Gi"}}},
            }))
            .unwrap();
            Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
                .create(&PostParams::default(), &claim)
                .await
                .unwrap();
            let twin = format!("{ns}-rome");
            let copies: Api<PersistentVolumeClaim> = Api::namespaced(remote, &twin);
            support::until(
                "the claim provisioned on milan",
                Duration::from_secs(30),
                || async { copies.get_opt("data").await.ok()?.map(|_| ()) },
            )
            .await;
            let pvs: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(client);
            support::until("its PV", Duration::from_secs(30), || async {
                let l = pvs.list(&Default::default()).await.ok()?;
                l.items
                    .iter()
                    .any(|p| {
                        p.spec
                            .as_ref()
                            .and_then(|s| s.claim_ref.as_ref())
                            .and_then(|c| c.namespace.as_deref())
                            == Some(ns)
                    })
                    .then_some(())
            })
            .await;
        }
    };
    for ns in ["keep", "drop"] {
        namespace(&consumer.client, ns).await;
        let (ok, out, err) = tandem(
            &[
                "offload",
                "namespace",
                ns,
                "--pod-offloading-strategy",
                "Remote",
            ],
            &kubeconfig,
        )
        .await;
        assert!(ok, "stdout: {out}\nstderr: {err}");
        provision(ns).await;
    }

    let (ok, out, err) = tandem(&["unoffload", "namespace", "keep"], &kubeconfig).await;
    assert!(ok, "stdout: {out}\nstderr: {err}");
    assert!(
        out.contains("retained: PersistentVolumeClaim keep/data on milan in namespace keep-rome"),
        "{out}"
    );
    assert!(
        on_provider.get("keep-rome").await.is_ok(),
        "kept for its data"
    );

    let (ok, out, err) = tandem(
        &["unoffload", "namespace", "drop", "--delete-data"],
        &kubeconfig,
    )
    .await;
    assert!(ok, "stdout: {out}\nstderr: {err}");
    assert!(!out.contains("retained"), "{out}");
    support::until(
        "the twin namespace deleted with its data",
        Duration::from_secs(30),
        || async {
            on_provider
                .get_opt("drop-rome")
                .await
                .ok()?
                .is_none()
                .then_some(())
        },
    )
    .await;
}
