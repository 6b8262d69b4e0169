//! `kubectl top` against a network-mode lab (root): each node's kubelet serves
//! `/metrics/resource`, the API server scrapes it into `metrics.k8s.io` as metrics-server does,
//! and RBAC decides who may read it.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};
use tandem_lab::{LabCluster, LabConfig};
use tandem_testing::{kubectl, needs_root, until, until_every};

async fn create(cluster: &LabCluster, objects: Value) {
    for obj in objects.as_array().expect("a list of objects") {
        let (api_version, kind) = (
            obj["apiVersion"].as_str().unwrap(),
            obj["kind"].as_str().unwrap(),
        );
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let resource =
            kube::api::ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
        let api = match obj["metadata"]["namespace"].as_str() {
            Some(ns) => {
                Api::<DynamicObject>::namespaced_with(cluster.client.clone(), ns, &resource)
            }
            None => Api::<DynamicObject>::all_with(cluster.client.clone(), &resource),
        };
        api.create(
            &PostParams::default(),
            &serde_json::from_value(obj.clone()).unwrap(),
        )
        .await
        .unwrap_or_else(|e| panic!("creating {kind}: {e}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
async fn kubectl_top_shows_nodes_and_pods_from_the_kubelets_resource_metrics() {
    needs_root();
    let cluster = LabCluster::start(LabConfig {
        network: true,
        nodes: 2,
        ..Default::default()
    })
    .await
    .expect("network-mode cluster starts");
    // Two samples are needed: scrape every 2 s rather than metrics-server's 15 s.
    cluster.server.set_metric_resolution(Duration::from_secs(2));
    create(
        &cluster,
        json!([
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo"}},
            {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": "echo", "namespace": "demo", "labels": {"app": "echo"}},
             "spec": {"containers": [{"name": "echo", "image": "tandem.dev/echo"}]}},
        ]),
    )
    .await;
    let pods = Api::<Pod>::namespaced(cluster.client.clone(), "demo");
    let node = until("echo running", Duration::from_secs(30), || async {
        let pod = pods.get("echo").await.ok()?;
        (pod.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(pod.spec?.node_name?)
    })
    .await;

    // The kubelet's own text: the pod's container, with the constant a built-in program reports.
    let network = cluster.network.clone().unwrap();
    let text = tandem_lab::network::kubelet_metrics::render(
        &tandem_lab::network::kubelet_metrics::sample(&network, &node),
    );
    assert!(
        text.contains(&format!(
            "container_memory_working_set_bytes{{container=\"echo\",namespace=\"demo\",pod=\"echo\"}} {} ",
            tandem_lab::network::kubelet_metrics::BUILTIN_WORKING_SET
        )),
        "{text}"
    );
    assert!(text.contains("\nnode_cpu_usage_seconds_total "), "{text}");

    let dir = tempfile::tempdir().unwrap();
    let admin = dir.path().join("admin");
    std::fs::write(&admin, cluster.server.admin_kubeconfig().unwrap()).unwrap();
    let home = dir.path();

    let (ok, out) = kubectl(
        &admin,
        home,
        &["api-resources", "--api-group=metrics.k8s.io"],
        None,
    )
    .await;
    assert!(ok, "{out}");
    assert!(
        out.contains("NodeMetrics") && out.contains("PodMetrics"),
        "{out}"
    );

    let nodes = until_every(
        "kubectl top nodes lists both nodes",
        Duration::from_secs(60),
        Duration::from_secs(1),
        || async {
            let (ok, out) = kubectl(&admin, home, &["top", "nodes"], None).await;
            let listed = ["lab-1-node-1", "lab-1-node-2"].iter().all(|n| {
                out.lines()
                    .any(|l| l.starts_with(n) && !l.contains("<unknown>"))
            });
            (ok && listed).then_some(out)
        },
    )
    .await;
    assert!(nodes.starts_with("NAME"), "{nodes}");

    let top = until_every(
        "kubectl top pods lists echo",
        Duration::from_secs(60),
        Duration::from_secs(1),
        || async {
            let (ok, out) = kubectl(&admin, home, &["top", "pods", "-n", "demo"], None).await;
            (ok && out.lines().any(|l| l.starts_with("echo "))).then_some(out)
        },
    )
    .await;
    let echo: Vec<&str> = top
        .lines()
        .find(|l| l.starts_with("echo "))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(echo, vec!["echo", "0m", "2Mi"], "{top}");

    // The label selector reaches the API server: no pod matches, and kubectl says so.
    let (ok, out) = kubectl(
        &admin,
        home,
        &["top", "pods", "-n", "demo", "-l", "app=other"],
        None,
    )
    .await;
    assert!(
        ok && out.contains("No resources found in demo namespace."),
        "{out}"
    );
    let (ok, out) = kubectl(
        &admin,
        home,
        &[
            "top",
            "pods",
            "-n",
            "demo",
            "-l",
            "app=echo",
            "--containers",
        ],
        None,
    )
    .await;
    assert!(
        ok && out
            .lines()
            .any(|l| l.starts_with("echo ") && l.contains(" echo ")),
        "{out}"
    );

    let (ok, raw) = kubectl(
        &admin,
        home,
        &[
            "get",
            "--raw",
            "/apis/metrics.k8s.io/v1beta1/namespaces/demo/pods",
        ],
        None,
    )
    .await;
    assert!(ok, "{raw}");
    let list: Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(list["kind"], "PodMetricsList");
    assert_eq!(list["apiVersion"], "metrics.k8s.io/v1beta1");
    let item = &list["items"][0];
    assert_eq!(item["metadata"]["name"], "echo");
    assert_eq!(item["metadata"]["namespace"], "demo");
    assert_eq!(item["metadata"]["labels"]["app"], "echo");
    assert!(item["window"].as_str().unwrap().ends_with('s'), "{item}");
    assert_eq!(
        item["containers"],
        json!([{"name": "echo", "usage": {"cpu": "0", "memory": "2Mi"}}])
    );
    let (ok, raw) = kubectl(
        &admin,
        home,
        &[
            "get",
            "--raw",
            &format!("/apis/metrics.k8s.io/v1beta1/nodes/{node}"),
        ],
        None,
    )
    .await;
    assert!(ok, "{raw}");
    let metrics: Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(metrics["kind"], "NodeMetrics");
    assert!(
        metrics["usage"]["memory"]
            .as_str()
            .is_some_and(|m| m != "0"),
        "{metrics}"
    );

    // RBAC: reading metrics takes get/list on pods.metrics.k8s.io, like any resource.
    let viewer = dir.path().join("viewer");
    std::fs::write(&viewer, cluster.server.kubeconfig_for("vera", &[]).unwrap()).unwrap();
    let (ok, out) = kubectl(&viewer, home, &["top", "pods", "-n", "demo"], None).await;
    assert!(
        !ok && out.contains("forbidden") && out.contains("pods.metrics.k8s.io"),
        "{out}"
    );
    create(
        &cluster,
        json!([
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": "metrics-reader", "namespace": "demo"},
             "rules": [{"apiGroups": ["metrics.k8s.io"], "resources": ["pods"], "verbs": ["get", "list"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "vera", "namespace": "demo"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "metrics-reader"},
             "subjects": [{"kind": "User", "name": "vera", "apiGroup": "rbac.authorization.k8s.io"}]},
        ]),
    )
    .await;
    let (ok, out) = kubectl(&viewer, home, &["top", "pods", "-n", "demo"], None).await;
    assert!(ok && out.lines().any(|l| l.starts_with("echo ")), "{out}");
    cluster.shutdown();
}
