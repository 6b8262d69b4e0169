//! Hollow nodes: registration, leases, and the node lifecycle controller.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use serde_json::json;

use super::support::{cluster, create, node_of, pod, pods, running, until};

fn ready(node: &Node) -> Option<String> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.clone())
}

fn has_taint(node: &Node, key: &str, effect: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == key && t.effect == effect))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_register_ready_with_labels_cidr_and_renewing_leases() {
    let lab = cluster().await;
    let nodes = Api::<Node>::all(lab.client.clone());
    for (i, name) in lab.node_names().iter().enumerate() {
        let node = until(
            &format!("node {name} Ready"),
            Duration::from_secs(10),
            || {
                let nodes = nodes.clone();
                async move {
                    let n = nodes.get(name).await.ok()?;
                    (ready(&n).as_deref() == Some("True")).then_some(n)
                }
            },
        )
        .await;
        let labels = node.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get("kubernetes.io/hostname"), Some(name));
        assert_eq!(
            labels
                .get("topology.kubernetes.io/region")
                .map(String::as_str),
            Some("region-1")
        );
        let spec = node.spec.clone().unwrap_or_default();
        let cidr = format!("10.244.{}.0/24", i + 1);
        assert_eq!(spec.pod_cidr.as_deref(), Some(cidr.as_str()));
        assert_eq!(spec.pod_cidrs, Some(vec![cidr]));
        let status = node.status.clone().unwrap_or_default();
        let alloc = status.allocatable.unwrap_or_default();
        assert_eq!(alloc.get("cpu").map(|q| q.0.as_str()), Some("8"));
        assert_eq!(alloc.get("pods").map(|q| q.0.as_str()), Some("110"));
        assert!(alloc.contains_key("ephemeral-storage"));
        let info = status.node_info.unwrap_or_default();
        assert_eq!(info.kubelet_version, "v1.33.0-tandem");
        assert_eq!(info.container_runtime_version, "hollow://1.0");
        let kinds: Vec<String> = status
            .addresses
            .unwrap_or_default()
            .into_iter()
            .map(|a| a.type_)
            .collect();
        assert_eq!(kinds, ["InternalIP", "Hostname"]);
    }
    let leases = Api::<Lease>::namespaced(lab.client.clone(), "kube-node-lease");
    let name = lab.node_names()[0].clone();
    let first = until("a node lease", Duration::from_secs(10), || {
        let leases = leases.clone();
        let name = name.clone();
        async move { leases.get(&name).await.ok()?.spec?.renew_time }
    })
    .await;
    let holder = leases
        .get(&name)
        .await
        .expect("lease")
        .spec
        .unwrap_or_default();
    assert_eq!(holder.holder_identity.as_ref(), Some(&name));
    until("the lease to be renewed", Duration::from_secs(10), || {
        let leases = leases.clone();
        let name = name.clone();
        let first = first.clone();
        async move {
            let renewed = leases.get(&name).await.ok()?.spec?.renew_time?;
            (renewed.0 > first.0).then_some(())
        }
    })
    .await;
    lab.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn powered_off_node_goes_unreachable_evicts_pods_and_recovers() {
    let lab = cluster().await;
    let victim = lab.node_names()[1].clone();
    let nodes = Api::<Node>::all(lab.client.clone());
    // Pinned to the victim; tolerates unreachability for 1 s instead of the default 300 s.
    let short = pod(
        "short",
        json!({"spec": {
            "nodeSelector": {"kubernetes.io/hostname": victim},
            "tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                             "effect": "NoExecute", "tolerationSeconds": 1}],
        }}),
    );
    // Tolerates it for an hour: stays bound (unready) through a short outage.
    let patient = pod(
        "patient",
        json!({"spec": {
            "nodeSelector": {"kubernetes.io/hostname": victim},
            "tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                             "effect": "NoExecute", "tolerationSeconds": 3600}],
        }}),
    );
    create(&lab.client, &short).await;
    create(&lab.client, &patient).await;
    assert_eq!(node_of(&running(&lab.client, "short").await), victim);
    assert_eq!(node_of(&running(&lab.client, "patient").await), victim);

    lab.power.power_off(&victim);
    let started = tokio::time::Instant::now();
    let node = until(
        "the node to be NotReady and tainted",
        Duration::from_secs(15),
        || {
            let nodes = nodes.clone();
            let victim = victim.clone();
            async move {
                let n = nodes.get(&victim).await.ok()?;
                (ready(&n).as_deref() == Some("Unknown")
                    && has_taint(&n, "node.kubernetes.io/unreachable", "NoExecute")
                    && has_taint(&n, "node.kubernetes.io/unreachable", "NoSchedule"))
                .then_some(n)
            }
        },
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "grace period is 2 s; took {:?}",
        started.elapsed()
    );
    let conditions = node
        .status
        .and_then(|s| s.conditions)
        .expect("node conditions");
    let ready_condition = conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready condition");
    assert_eq!(ready_condition.reason.as_deref(), Some("NodeStatusUnknown"));
    let api = pods(&lab.client);
    until(
        "the short-tolerating pod to be deleted",
        Duration::from_secs(15),
        || {
            let api = api.clone();
            async move {
                match api.get_opt("short").await.ok()? {
                    None => Some(()),
                    Some(p) => p.metadata.deletion_timestamp.map(|_| ()),
                }
            }
        },
    )
    .await;
    let events =
        Api::<k8s_openapi::api::core::v1::Event>::namespaced(lab.client.clone(), "default");
    let eviction = until(
        "a TaintManagerEviction event",
        Duration::from_secs(10),
        || {
            let events = events.clone();
            async move {
                events
                    .list(&Default::default())
                    .await
                    .ok()?
                    .items
                    .into_iter()
                    .find(|e| e.reason.as_deref() == Some("TaintManagerEviction"))
            }
        },
    )
    .await;
    assert_eq!(eviction.involved_object.name.as_deref(), Some("short"));
    assert_eq!(
        eviction.message.as_deref(),
        Some("Marking for deletion Pod default/short")
    );
    let patient_now = until(
        "the patient pod to be marked unready",
        Duration::from_secs(10),
        || {
            let api = api.clone();
            async move {
                let p = api.get("patient").await.ok()?;
                (super::support::condition(&p, "Ready").as_deref() == Some("False")).then_some(p)
            }
        },
    )
    .await;
    assert!(
        patient_now.metadata.deletion_timestamp.is_none(),
        "a pod tolerating unreachability for an hour is not evicted after seconds"
    );
    // Nothing new lands on the unreachable node.
    create(
        &lab.client,
        &pod(
            "newcomer",
            json!({"spec": {"nodeSelector": {"kubernetes.io/hostname": victim}}}),
        ),
    )
    .await;

    lab.power.power_on(&victim);
    until(
        "the node to be Ready and untainted",
        Duration::from_secs(15),
        || {
            let nodes = nodes.clone();
            let victim = victim.clone();
            async move {
                let n = nodes.get(&victim).await.ok()?;
                (ready(&n).as_deref() == Some("True")
                    && !has_taint(&n, "node.kubernetes.io/unreachable", "NoExecute"))
                .then_some(())
            }
        },
    )
    .await;
    // The kubelet is back: it finishes the eviction and the patient pod is Ready again.
    until(
        "the evicted pod to be gone",
        Duration::from_secs(15),
        || {
            let api = api.clone();
            async move { api.get_opt("short").await.ok()?.is_none().then_some(()) }
        },
    )
    .await;
    until(
        "the patient pod to be Ready again",
        Duration::from_secs(15),
        || {
            let api = api.clone();
            async move {
                let p = api.get("patient").await.ok()?;
                (super::support::condition(&p, "Ready").as_deref() == Some("True")).then_some(())
            }
        },
    )
    .await;
    assert_eq!(node_of(&running(&lab.client, "newcomer").await), victim);
    lab.shutdown();
}

/// An API server restart, as a crash of its process: open watches end, every acknowledged
/// write is still there, the same clients carry on, and the cluster keeps running pods (its
/// kubelets and controllers reconnect by themselves).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_api_server_keeps_every_acknowledged_write_and_its_clients_reconnect() {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{PostParams, WatchParams};
    let dir = tempfile::tempdir().unwrap();
    let mut lab = tandem_lab::LabCluster::start(tandem_lab::LabConfig {
        nodes: 1,
        node_monitor_grace_period: Duration::from_secs(2),
        data_dir: Some(dir.path().to_path_buf()),
        ..Default::default()
    })
    .await
    .expect("lab cluster starts");
    let client = lab.client.clone();
    let before = running(
        &client,
        &create(&client, &pod("before", json!({})))
            .await
            .metadata
            .name
            .unwrap(),
    )
    .await;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let mut acknowledged = Vec::new();
    for i in 0..20 {
        let cm: ConfigMap = serde_json::from_value(
            json!({"metadata": {"name": format!("w-{i}")}, "data": {"i": i.to_string()}}),
        )
        .unwrap();
        configmaps
            .create(&PostParams::default(), &cm)
            .await
            .unwrap();
        acknowledged.push(format!("w-{i}"));
    }
    let mut watch = configmaps
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    let url = lab.server.url();

    lab.restart_api_server().await.unwrap();
    assert_eq!(lab.server.url(), url, "same address");
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(_)) = watch.next().await {}
    })
    .await;
    assert!(ended.is_ok(), "the open watch ended with the old server");
    for name in &acknowledged {
        assert!(
            configmaps.get_opt(name).await.unwrap().is_some(),
            "{name} kept"
        );
    }
    assert_eq!(
        pods(&client).get("before").await.unwrap().metadata.uid,
        before.metadata.uid
    );
    // Kubelets, scheduler and controllers are back: a new pod runs.
    create(&client, &pod("after", json!({}))).await;
    running(&client, "after").await;
    lab.shutdown();
}
