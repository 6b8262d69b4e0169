//! Shared fixtures: cluster start-up, pod builders, polling with deadlines.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tandem_lab::{LabCluster, LabConfig};

/// Starts a 3-node lab cluster with a short node-monitor grace period.
pub async fn cluster() -> LabCluster {
    LabCluster::start(LabConfig {
        nodes: 3,
        node_monitor_grace_period: Duration::from_secs(2),
        ..Default::default()
    })
    .await
    .expect("lab cluster starts")
}

pub use tandem_testing::until;

/// A bare pod in `default` with one container; `extra` is merged into the manifest.
pub fn pod(name: &str, extra: Value) -> Pod {
    let mut manifest = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
        "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]},
    });
    merge(&mut manifest, extra);
    serde_json::from_value(manifest).expect("valid pod manifest")
}

fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (slot, v) => *slot = v,
    }
}

/// Creates `pod` in `default`.
pub async fn create(client: &kube::Client, pod: &Pod) -> Pod {
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), pod)
        .await
        .expect("pod created")
}

/// The pods API of `default`.
pub fn pods(client: &kube::Client) -> Api<Pod> {
    Api::namespaced(client.clone(), "default")
}

/// Waits until pod `name` is Running and returns it.
pub async fn running(client: &kube::Client, name: &str) -> Pod {
    let api = pods(client);
    until(
        &format!("pod {name} Running"),
        Duration::from_secs(20),
        || {
            let api = api.clone();
            async move {
                let p = api.get(name).await.ok()?;
                (p.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(p)
            }
        },
    )
    .await
}

/// The pod's node.
pub fn node_of(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

/// Status of the pod's condition `kind`.
pub fn condition(pod: &Pod, kind: &str) -> Option<String> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind)
        .map(|c| c.status.clone())
}

/// Runs the real `kubectl` against `cluster` as its admin, with `stdin` as input; returns
/// whether it succeeded and what it printed.
pub async fn kubectl(cluster: &LabCluster, args: &[&str], stdin: Option<&str>) -> (bool, String) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        cluster.server.admin_kubeconfig().expect("kubeconfig"),
    )
    .expect("kubeconfig written");
    tandem_testing::kubectl(&kubeconfig, dir.path(), args, stdin).await
}

/// Runs `kubectl` and fails the test if it fails; returns its output.
pub async fn kubectl_ok(cluster: &LabCluster, args: &[&str], stdin: Option<&str>) -> String {
    let (ok, out) = kubectl(cluster, args, stdin).await;
    assert!(ok, "kubectl {args:?}:\n{out}");
    out
}
