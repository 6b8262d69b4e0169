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

#[tokio::test]
async fn offload_and_unoffload_a_namespace() {
    let consumer = support::Cluster::start("rome", "eu-south", 1).await;
    let provider = support::Cluster::start("milan", "eu-west", 1).await;
    support::peer_with(
        &consumer,
        &provider,
        json!({"cpu": "2", "pods": "10"}),
        None,
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("rome.kubeconfig");
    consumer
        .lab
        .server
        .write_admin_kubeconfig(&kubeconfig)
        .unwrap();
    Api::<Namespace>::all(consumer.client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "shop"}})).unwrap(),
        )
        .await
        .unwrap();

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
