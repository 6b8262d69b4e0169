//! DaemonSets on a 3-node lab cluster (scheduler and hollow kubelets included), driven with
//! the real kubectl as an administrator would: one pod per node, taints and tolerations,
//! node labels, rolling updates and their ControllerRevisions.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use tandem_lab::{LabCluster, LabConfig};

use super::common::DEADLINE;

struct Lab {
    cluster: LabCluster,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
}

impl Lab {
    async fn start() -> Lab {
        let cluster = LabCluster::start(LabConfig {
            nodes: 3,
            node_monitor_grace_period: Duration::from_secs(2),
            ..Default::default()
        })
        .await
        .expect("lab starts");
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, cluster.server.admin_kubeconfig().unwrap()).unwrap();
        let lab = Lab {
            cluster,
            dir,
            kubeconfig,
        };
        lab.eventually("3 nodes", &["get", "nodes", "-o", "json"], |v| {
            v["items"].as_array().is_some_and(|i| i.len() == 3)
        })
        .await;
        lab
    }

    async fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> (bool, String) {
        tandem_testing::kubectl(&self.kubeconfig, self.dir.path(), args, stdin).await
    }

    async fn ok(&self, args: &[&str]) -> String {
        let (ok, out) = self.kubectl(args, None).await;
        assert!(ok, "kubectl {args:?}:\n{out}");
        out
    }

    async fn apply(&self, yaml: &str) {
        let (ok, out) = self.kubectl(&["apply", "-f", "-"], Some(yaml)).await;
        assert!(ok, "kubectl apply:\n{out}");
    }

    /// Polls `kubectl <args>` (JSON output) until `check` holds; returns that output.
    async fn eventually(&self, what: &str, args: &[&str], check: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let (ok, out) = self.kubectl(args, None).await;
            if ok
                && let Ok(v) = serde_json::from_str::<Value>(&out)
                && check(&v)
            {
                return v;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: kubectl {args:?} said:\n{out}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Live (not terminating) pods labelled `app=<app>`, by node.
    async fn pods_by_node(
        &self,
        what: &str,
        app: &str,
        check: impl Fn(&BTreeMap<String, Vec<Value>>) -> bool,
    ) -> BTreeMap<String, Vec<Value>> {
        let selector = format!("app={app}");
        let v = self
            .eventually(what, &["get", "pods", "-l", &selector, "-o", "json"], |v| {
                check(&by_node(v))
            })
            .await;
        by_node(&v)
    }
}

fn by_node(list: &Value) -> BTreeMap<String, Vec<Value>> {
    let mut map: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for pod in list["items"].as_array().into_iter().flatten() {
        if !pod["metadata"]["deletionTimestamp"].is_null() {
            continue;
        }
        let node = pod["spec"]["nodeName"].as_str().unwrap_or("").to_string();
        map.entry(node).or_default().push(pod.clone());
    }
    map
}

fn running_ready(pod: &Value) -> bool {
    pod["status"]["phase"] == "Running"
        && pod["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

/// One Running, Ready pod on each of `nodes`, and nowhere else.
fn one_ready_pod_on(map: &BTreeMap<String, Vec<Value>>, nodes: &[String]) -> bool {
    map.len() == nodes.len()
        && nodes.iter().all(|n| {
            map.get(n)
                .is_some_and(|p| p.len() == 1 && running_ready(&p[0]))
        })
}

fn daemonset(name: &str, image: &str, extra_spec: &str) -> String {
    format!(
        r#"
apiVersion: apps/v1
kind: DaemonSet
metadata: {{name: {name}}}
spec:
  selector: {{matchLabels: {{app: {name}}}}}
  updateStrategy: {{type: RollingUpdate, rollingUpdate: {{maxUnavailable: 1}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      containers: [{{name: main, image: {image}}}]
{extra_spec}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemonset_runs_one_pod_per_node_and_follows_taints() {
    let lab = Lab::start().await;
    let nodes = lab.cluster.node_names();
    lab.apply(&daemonset("agent", "agent:v1", "")).await;
    let pods = lab
        .pods_by_node("one Ready pod per node", "agent", |m| {
            one_ready_pod_on(m, &nodes)
        })
        .await;
    for (node, pods) in &pods {
        let pod = &pods[0];
        let name = pod["metadata"]["name"].as_str().unwrap();
        let suffix = name.strip_prefix("agent-").unwrap_or_default();
        assert_eq!(suffix.len(), 5, "named <ds>-<random5>: {name}");
        assert!(
            pod["metadata"]["labels"]["controller-revision-hash"].is_string(),
            "{name} carries its revision"
        );
        assert_eq!(
            pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                ["nodeSelectorTerms"][0]["matchFields"][0]["values"][0],
            node.as_str(),
            "{name} is pinned to its node"
        );
        assert_eq!(pod["metadata"]["ownerReferences"][0]["kind"], "DaemonSet");
    }
    lab.eventually(
        "status counts the 3 nodes",
        &["get", "ds", "agent", "-o", "json"],
        |v| {
            let s = &v["status"];
            s["desiredNumberScheduled"] == 3
                && s["currentNumberScheduled"] == 3
                && s["numberReady"] == 3
                && s["numberAvailable"] == 3
                && s["updatedNumberScheduled"] == 3
                && s["observedGeneration"] == v["metadata"]["generation"]
        },
    )
    .await;
    lab.eventually(
        "a SuccessfulCreate event per pod",
        &["get", "events.v1.events.k8s.io", "-o", "json"],
        |v| {
            let creates = v["items"].as_array().into_iter().flatten().filter(|e| {
                e["reason"] == "SuccessfulCreate"
                    && e["regarding"]["kind"] == "DaemonSet"
                    && e["regarding"]["name"] == "agent"
                    && e["note"]
                        .as_str()
                        .is_some_and(|n| n.starts_with("Created pod: agent-"))
            });
            creates.count() == 3
        },
    )
    .await;

    // A DaemonSet tolerating everything, beside it.
    lab.apply(&daemonset(
        "tolerant",
        "agent:v1",
        "      tolerations: [{operator: Exists}]",
    ))
    .await;
    lab.pods_by_node("the tolerant one too", "tolerant", |m| {
        one_ready_pod_on(m, &nodes)
    })
    .await;

    // NoExecute taint: the intolerant pod leaves, the tolerant one stays.
    let tainted = nodes[0].clone();
    lab.ok(&["taint", "node", &tainted, "dedicated=infra:NoExecute"])
        .await;
    let rest = nodes[1..].to_vec();
    lab.pods_by_node("the pod leaves the tainted node", "agent", |m| {
        one_ready_pod_on(m, &rest)
    })
    .await;
    lab.eventually("desired 2", &["get", "ds", "agent", "-o", "json"], |v| {
        v["status"]["desiredNumberScheduled"] == 2 && v["status"]["numberMisscheduled"] == 0
    })
    .await;
    let tolerant = lab
        .pods_by_node("the tolerant pod stays", "tolerant", |m| {
            one_ready_pod_on(m, &nodes)
        })
        .await;
    assert_eq!(tolerant.len(), 3);

    // The taint goes: the pod comes back.
    lab.ok(&["taint", "node", &tainted, "dedicated-"]).await;
    lab.pods_by_node("back on every node", "agent", |m| {
        one_ready_pod_on(m, &nodes)
    })
    .await;

    // NoSchedule: no new pod goes there, but the running one stays.
    lab.ok(&["taint", "node", &tainted, "dedicated=infra:NoSchedule"])
        .await;
    lab.eventually(
        "desired 2, one misscheduled",
        &["get", "ds", "agent", "-o", "json"],
        |v| v["status"]["desiredNumberScheduled"] == 2 && v["status"]["numberMisscheduled"] == 1,
    )
    .await;
    let pods = lab
        .pods_by_node("the running pod stays", "agent", |m| {
            one_ready_pod_on(m, &nodes)
        })
        .await;
    assert_eq!(pods.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_labels_select_nodes_and_a_rolling_update_replaces_every_pod() {
    let lab = Lab::start().await;
    let nodes = lab.cluster.node_names();
    lab.apply(&daemonset(
        "storage",
        "storage:v1",
        "      nodeSelector: {disk: ssd}",
    ))
    .await;
    lab.eventually(
        "no node has ssd",
        &["get", "ds", "storage", "-o", "json"],
        |v| v["status"]["desiredNumberScheduled"] == 0 && v["status"]["observedGeneration"] == 1,
    )
    .await;
    for node in &nodes[..2] {
        lab.ok(&["label", "node", node, "disk=ssd"]).await;
    }
    let two = nodes[..2].to_vec();
    lab.pods_by_node("a pod on each labelled node", "storage", |m| {
        one_ready_pod_on(m, &two)
    })
    .await;
    lab.ok(&["label", "node", &nodes[2], "disk=ssd"]).await;
    lab.pods_by_node("the third node joins", "storage", |m| {
        one_ready_pod_on(m, &nodes)
    })
    .await;
    lab.ok(&["label", "node", &nodes[0], "disk-"]).await;
    let rest = nodes[1..].to_vec();
    lab.pods_by_node("unlabelled: its pod goes", "storage", |m| {
        one_ready_pod_on(m, &rest)
    })
    .await;

    lab.ok(&["set", "image", "ds/storage", "main=storage:v2"])
        .await;
    let out = lab
        .ok(&["rollout", "status", "ds/storage", "--timeout=60s"])
        .await;
    assert!(out.contains("successfully rolled out"), "{out}");
    let pods = lab
        .pods_by_node("every pod on v2", "storage", |m| {
            one_ready_pod_on(m, &rest)
                && m.values()
                    .all(|p| p[0]["spec"]["containers"][0]["image"] == "storage:v2")
        })
        .await;
    let hashes: Vec<&str> = pods
        .values()
        .map(|p| {
            p[0]["metadata"]["labels"]["controller-revision-hash"]
                .as_str()
                .unwrap()
        })
        .collect();
    let revisions = lab
        .eventually(
            "a revision per template",
            &[
                "get",
                "controllerrevisions",
                "-l",
                "app=storage",
                "-o",
                "json",
            ],
            |v| v["items"].as_array().is_some_and(|i| i.len() == 2),
        )
        .await;
    let newest = revisions["items"]
        .as_array()
        .unwrap()
        .iter()
        .max_by_key(|r| r["revision"].as_i64())
        .unwrap();
    assert_eq!(newest["revision"], 2);
    assert!(
        hashes
            .iter()
            .all(|h| Some(*h) == newest["metadata"]["labels"]["controller-revision-hash"].as_str()),
        "pods carry the newest revision's hash: {hashes:?}"
    );
    let history = lab.ok(&["rollout", "history", "ds/storage"]).await;
    assert!(history.contains('1') && history.contains('2'), "{history}");

    // Undo: kubectl restores the template from revision 1, which becomes revision 3.
    lab.ok(&["rollout", "undo", "ds/storage"]).await;
    lab.ok(&["rollout", "status", "ds/storage", "--timeout=60s"])
        .await;
    lab.pods_by_node("every pod back on v1", "storage", |m| {
        one_ready_pod_on(m, &rest)
            && m.values()
                .all(|p| p[0]["spec"]["containers"][0]["image"] == "storage:v1")
    })
    .await;
    lab.eventually(
        "the old revision renumbered as the newest",
        &[
            "get",
            "controllerrevisions",
            "-l",
            "app=storage",
            "-o",
            "json",
        ],
        |v| {
            let revisions: Vec<i64> = v["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| r["revision"].as_i64())
                .collect();
            revisions.len() == 2 && revisions.contains(&2) && revisions.contains(&3)
        },
    )
    .await;
}
