//! Hollow kubelets running pods: deletion through kubectl and behaviour annotations.

use std::process::Command;
use std::time::Duration;

use serde_json::json;

use crate::support::{cluster, condition, create, pod, pods, running, until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_delete_of_a_running_pod_completes() {
    let lab = cluster().await;
    create(&lab.client, &pod("doomed", json!({}))).await;
    running(&lab.client, "doomed").await;
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    lab.server
        .write_admin_kubeconfig(&kubeconfig)
        .expect("kubeconfig written");
    let out = tokio::task::spawn_blocking(move || {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["delete", "pod", "doomed", "--timeout=20s"])
            .output()
            .expect("kubectl runs")
    })
    .await
    .expect("kubectl task");
    assert!(
        out.status.success(),
        "kubectl delete failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "pod \"doomed\" deleted"
    );
    assert!(
        pods(&lab.client)
            .get_opt("doomed")
            .await
            .expect("get")
            .is_none()
    );
    lab.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pods_address_is_reused_on_its_node() {
    let lab = cluster().await;
    let node = lab.node_names()[0].clone();
    let pinned = |name: &str| {
        pod(
            name,
            json!({"spec": {"nodeSelector": {"kubernetes.io/hostname": node}}}),
        )
    };
    let ip = |p: &k8s_openapi::api::core::v1::Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .expect("podIP")
    };
    create(&lab.client, &pinned("first")).await;
    let first = ip(&running(&lab.client, "first").await);
    create(&lab.client, &pinned("second")).await;
    let second = ip(&running(&lab.client, "second").await);
    assert_ne!(first, second, "two running pods never share an address");
    let api = pods(&lab.client);
    api.delete("first", &Default::default())
        .await
        .expect("delete first");
    until("pod first gone", Duration::from_secs(15), || {
        let api = api.clone();
        async move { api.get_opt("first").await.ok()?.is_none().then_some(()) }
    })
    .await;
    create(&lab.client, &pinned("third")).await;
    assert_eq!(
        ip(&running(&lab.client, "third").await),
        first,
        "the freed address is handed out again"
    );
    lab.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behaviour_annotations_drive_container_state() {
    let lab = cluster().await;
    let annotated = |name: &str, behavior: &str, policy: &str| {
        pod(
            name,
            json!({"metadata": {"annotations": {"lab.tandem.dev/behavior": behavior}},
                   "spec": {"restartPolicy": policy}}),
        )
    };
    create(&lab.client, &annotated("crashy", "crashloop", "Always")).await;
    create(&lab.client, &annotated("shy", "never-ready", "Always")).await;
    create(&lab.client, &annotated("job", "exit", "Never")).await;
    create(&lab.client, &annotated("broken", "fail", "Never")).await;
    let api = pods(&lab.client);

    let crashy = until(
        "crashloop restarts to grow past 2",
        Duration::from_secs(20),
        || {
            let api = api.clone();
            async move {
                let p = api.get("crashy").await.ok()?;
                let c = p
                    .status
                    .as_ref()?
                    .container_statuses
                    .as_ref()?
                    .first()?
                    .clone();
                (c.restart_count >= 2).then_some((p, c))
            }
        },
    )
    .await;
    let waiting = crashy.1.state.and_then(|s| s.waiting).expect("waiting");
    assert_eq!(waiting.reason.as_deref(), Some("CrashLoopBackOff"));
    assert_eq!(condition(&crashy.0, "Ready").as_deref(), Some("False"));

    let shy = running(&lab.client, "shy").await;
    assert_eq!(condition(&shy, "Ready").as_deref(), Some("False"));
    assert_eq!(condition(&shy, "ContainersReady").as_deref(), Some("False"));

    for (name, phase) in [("job", "Succeeded"), ("broken", "Failed")] {
        until(&format!("{name} {phase}"), Duration::from_secs(20), || {
            let api = api.clone();
            async move {
                let p = api.get(name).await.ok()?;
                (p.status?.phase.as_deref() == Some(phase)).then_some(())
            }
        })
        .await;
    }
    lab.shutdown();
}
