//! Hollow kubelets running pods: deletion through kubectl and behaviour annotations.

use std::process::Command;
use std::time::Duration;

use serde_json::json;

use super::support::{cluster, condition, create, pod, pods, running, until};

/// Runs kubectl with `args` against the cluster; returns (success, stdout, stderr).
async fn kubectl(lab: &tandem_lab::LabCluster, args: &[&str]) -> (bool, String, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    lab.server
        .write_admin_kubeconfig(&kubeconfig)
        .expect("kubeconfig written");
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(&args)
            .output()
            .expect("kubectl runs")
    })
    .await
    .expect("kubectl task");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_sees_ready_nodes_and_running_pods_and_delete_completes() {
    let lab = cluster().await;
    create(&lab.client, &pod("doomed", json!({}))).await;
    let running_pod = running(&lab.client, "doomed").await;
    let ip = running_pod.status.and_then(|s| s.pod_ip).expect("podIP");

    let (ok, out, err) = kubectl(&lab, &["get", "nodes", "--no-headers"]).await;
    assert!(ok, "kubectl get nodes: {err}");
    let lines: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines.len(), 3, "{out}");
    for cols in &lines {
        // NAME STATUS ROLES AGE VERSION
        assert_eq!(cols.get(1), Some(&"Ready"), "{out}");
        assert_eq!(cols.last(), Some(&"v1.33.0-tandem"), "{out}");
    }

    let (ok, out, err) = kubectl(
        &lab,
        &["get", "pod", "doomed", "-o", "wide", "--no-headers"],
    )
    .await;
    assert!(ok, "kubectl get pod: {err}");
    let cols: Vec<&str> = out.split_whitespace().collect();
    // NAME READY STATUS RESTARTS AGE IP NODE ...
    assert_eq!(&cols[..3], ["doomed", "1/1", "Running"], "{out}");
    assert_eq!(cols.get(5), Some(&ip.as_str()), "{out}");

    let (ok, out, err) = kubectl(&lab, &["delete", "pod", "doomed", "--timeout=20s"]).await;
    assert!(ok, "kubectl delete failed: {err}");
    assert_eq!(out.trim(), "pod \"doomed\" deleted");
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

/// The scheduler and the kubelet record what they did to a pod, as kube's do, so that
/// `kubectl describe pod` tells its story: Scheduled, Pulled, Created, Started, and Killing
/// once it is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pods_events_tell_its_scheduling_start_and_stop() {
    use k8s_openapi::api::core::v1::Event;
    let lab = cluster().await;
    let started = create(&lab.client, &pod("told", json!({}))).await;
    let node = super::support::node_of(&running(&lab.client, "told").await);
    let events = kube::Api::<Event>::namespaced(lab.client.clone(), "default");
    let reasons = |want: &'static [&'static str]| {
        let events = events.clone();
        let uid = started.metadata.uid.clone();
        async move {
            let list = events.list(&Default::default()).await.ok()?;
            let mine: Vec<Event> = list
                .items
                .into_iter()
                .filter(|e| e.involved_object.uid == uid)
                .collect();
            want.iter()
                .all(|r| mine.iter().any(|e| e.reason.as_deref() == Some(*r)))
                .then_some(mine)
        }
    };
    let mine = until(
        "Scheduled, Pulled, Created and Started events",
        Duration::from_secs(30),
        || reasons(&["Scheduled", "Pulled", "Created", "Started"]),
    )
    .await;
    let scheduled = mine
        .iter()
        .find(|e| e.reason.as_deref() == Some("Scheduled"))
        .unwrap();
    assert_eq!(
        scheduled.message.as_deref(),
        Some(format!("Successfully assigned default/told to {node}").as_str())
    );
    let created = mine
        .iter()
        .find(|e| e.reason.as_deref() == Some("Created"))
        .unwrap();
    assert_eq!(
        created.involved_object.field_path.as_deref(),
        Some("spec.containers{app}"),
        "container events name the container"
    );
    assert_eq!(
        created.source.as_ref().and_then(|s| s.host.as_deref()),
        Some(node.as_str()),
        "kubelet events name their node"
    );

    let described = super::support::kubectl_ok(&lab, &["describe", "pod", "told"], None).await;
    for line in [
        "Successfully assigned default/told to",
        "Created container: app",
        "Started container app",
    ] {
        assert!(
            described.contains(line),
            "describe shows {line:?}:\n{described}"
        );
    }

    pods(&lab.client)
        .delete("told", &Default::default())
        .await
        .expect("delete told");
    until("a Killing event", Duration::from_secs(30), || {
        reasons(&["Killing"])
    })
    .await;
    lab.shutdown();
}
