//! A lab cluster driven with the real kubectl, as an administrator would: Deployments scale and
//! roll, Services get endpoints, taints are honoured, and a dead node's pods move elsewhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use parking_lot::Mutex;
use tandem_lab::{LabCluster, LabConfig};

struct Lab {
    cluster: LabCluster,
    _dir: tempfile::TempDir,
    kubeconfig: PathBuf,
}

impl Lab {
    async fn start(nodes: usize) -> Lab {
        let cluster = LabCluster::start(LabConfig {
            nodes,
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
            _dir: dir,
            kubeconfig,
        };
        lab.eventually(
            "all nodes Ready",
            &["get", "nodes", "--no-headers"],
            |out| {
                out.lines()
                    .filter(|l| l.split_whitespace().nth(1) == Some("Ready"))
                    .count()
                    == nodes
            },
        )
        .await;
        lab
    }

    async fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> (bool, String) {
        tandem_testing::kubectl(&self.kubeconfig, self._dir.path(), args, stdin).await
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

    async fn eventually(&self, what: &str, args: &[&str], check: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (ok, out) = self.kubectl(args, None).await;
            if ok && check(&out) {
                return out;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: kubectl {args:?} said:\n{out}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

fn deployment(replicas: usize, image: &str, extra_spec: &str) -> String {
    format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web}}
spec:
  replicas: {replicas}
  strategy: {{type: RollingUpdate, rollingUpdate: {{maxSurge: 2, maxUnavailable: 2}}}}
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      containers: [{{name: web, image: {image}, ports: [{{name: http, containerPort: 8080}}]}}]
{extra_spec}
"#
    )
}

/// Pod rows of `kubectl get pods -l app=web -o wide`: (name, ready, status, node).
fn pod_rows(out: &str) -> Vec<(String, String, String, String)> {
    out.lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .filter(|c| c.len() >= 7)
        .map(|c| (c[0].clone(), c[1].clone(), c[2].clone(), c[6].clone()))
        .collect()
}

const PODS: &[&str] = &["get", "pods", "-l", "app=web", "-o", "wide", "--no-headers"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployment_scales_spreads_and_rolls_within_its_availability_budget() {
    let lab = Lab::start(3).await;
    lab.apply(&deployment(20, "web:v1", "")).await;
    let out = lab
        .eventually("20 Running, Ready pods", PODS, |out| {
            let rows = pod_rows(out);
            rows.len() == 20
                && rows
                    .iter()
                    .all(|(_, ready, status, _)| ready == "1/1" && status == "Running")
        })
        .await;
    let per_node: BTreeMap<String, usize> =
        pod_rows(&out)
            .into_iter()
            .fold(BTreeMap::new(), |mut m, (_, _, _, node)| {
                *m.entry(node).or_default() += 1;
                m
            });
    assert_eq!(
        per_node.len(),
        3,
        "pods spread over every node: {per_node:?}"
    );
    assert!(
        per_node.values().all(|n| (5..=8).contains(n)),
        "evenly: {per_node:?}"
    );
    let rollout = lab
        .ok(&["rollout", "status", "deployment/web", "--timeout=30s"])
        .await;
    assert!(rollout.contains("successfully rolled out"), "{rollout}");

    // Scale down: 15 pods go through graceful deletion and disappear.
    lab.ok(&["scale", "deployment/web", "--replicas=5"]).await;
    lab.eventually("5 pods left", PODS, |out| pod_rows(out).len() == 5)
        .await;

    // Rolling update: track Ready pods continuously while kubectl drives the rollout.
    lab.ok(&["scale", "deployment/web", "--replicas=10"]).await;
    lab.eventually("10 Ready", PODS, |out| {
        pod_rows(out).iter().filter(|r| r.1 == "1/1").count() == 10
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(lab.cluster.client.clone(), "default");
    let (store, writer) = reflector::store();
    let min_ready = Arc::new(Mutex::new(usize::MAX));
    let watch = {
        let min_ready = min_ready.clone();
        let store = store.clone();
        tokio::spawn(
            reflector(
                writer,
                watcher(pods, watcher::Config::default().labels("app=web")),
            )
            .applied_objects()
            .for_each(move |_| {
                let ready = store
                    .state()
                    .iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .filter(|p| {
                        p.status
                            .as_ref()
                            .and_then(|s| s.conditions.as_ref())
                            .is_some_and(|c| {
                                c.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                            })
                    })
                    .count();
                let mut min = min_ready.lock();
                *min = (*min).min(ready);
                futures::future::ready(())
            }),
        )
    };
    store.wait_until_ready().await.unwrap();
    *min_ready.lock() = usize::MAX;
    lab.ok(&["set", "image", "deployment/web", "web=web:v2"])
        .await;
    lab.ok(&["rollout", "status", "deployment/web", "--timeout=60s"])
        .await;
    let out = lab
        .eventually(
            "every pod on the new template",
            &[
                "get",
                "pods",
                "-l",
                "app=web",
                "-o",
                "jsonpath={range .items[*]}{.spec.containers[0].image}{\"\\n\"}{end}",
            ],
            |out| out.lines().count() == 10 && out.lines().all(|l| l == "web:v2"),
        )
        .await;
    assert_eq!(out.lines().count(), 10);
    watch.abort();
    let min = *min_ready.lock();
    assert!(
        min >= 8,
        "Ready pods never drop below replicas - maxUnavailable (10 - 2): saw {min}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_endpoints_list_exactly_the_ready_pods() {
    let lab = Lab::start(2).await;
    lab.apply(&deployment(3, "web:v1", "")).await;
    lab.apply(
        r#"
apiVersion: v1
kind: Pod
metadata: {name: unready, labels: {app: web}, annotations: {lab.tandem.dev/behavior: never-ready}}
spec: {containers: [{name: web, image: web:v1, ports: [{name: http, containerPort: 8080}]}]}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec: {selector: {app: web}, ports: [{port: 80, targetPort: http}]}
"#,
    )
    .await;
    lab.eventually("4 pods Running", PODS, |out| {
        pod_rows(out).iter().filter(|r| r.2 == "Running").count() == 4
    })
    .await;
    let ready_ips: BTreeSet<String> = lab
        .ok(&[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            "jsonpath={range .items[?(@.metadata.name!=\"unready\")]}{.status.podIP}{\"\\n\"}{end}",
        ])
        .await
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(ready_ips.len(), 3);
    let slice = lab
        .eventually(
            "an EndpointSlice with the ready pods",
            &[
                "get",
                "endpointslices",
                "-l",
                "kubernetes.io/service-name=web",
                "-o",
                "json",
            ],
            |out| out.contains("\"ready\": true"),
        )
        .await;
    let slices: serde_json::Value = serde_json::from_str(&slice).unwrap();
    let mut ready = BTreeSet::new();
    let mut not_ready = BTreeSet::new();
    for item in slices["items"].as_array().unwrap() {
        assert_eq!(
            item["ports"][0]["port"], 8080,
            "targetPort resolved by name"
        );
        for ep in item["endpoints"].as_array().unwrap() {
            let ip = ep["addresses"][0].as_str().unwrap().to_string();
            if ep["conditions"]["ready"] == true {
                ready.insert(ip);
            } else {
                not_ready.insert(ip);
            }
        }
    }
    assert_eq!(
        ready, ready_ips,
        "ready endpoints are exactly the Ready pods"
    );
    assert_eq!(
        not_ready.len(),
        1,
        "the never-ready pod is listed as not ready"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_that_tolerate_nothing_never_land_on_tainted_nodes() {
    let lab = Lab::start(3).await;
    for node in lab.cluster.node_names() {
        lab.ok(&["taint", "node", &node, "dedicated=infra:NoSchedule"])
            .await;
    }
    lab.apply("apiVersion: v1\nkind: Pod\nmetadata: {name: picky}\nspec: {containers: [{name: c, image: x}]}\n").await;
    let events = lab
        .eventually(
            "a FailedScheduling event",
            &[
                "get",
                "events",
                "--field-selector",
                "involvedObject.name=picky,reason=FailedScheduling",
                "-o",
                "jsonpath={.items[*].message}",
            ],
            |out| !out.is_empty(),
        )
        .await;
    assert!(
        events.contains("0/3 nodes are available")
            && events.contains("untolerated taint")
            && events.contains("dedicated: infra"),
        "{events}"
    );
    let node = lab
        .ok(&["get", "pod", "picky", "-o", "jsonpath={.spec.nodeName}"])
        .await;
    assert!(node.is_empty(), "never bound: {node}");
    // Untainting one node lets it schedule there.
    let first = lab.cluster.node_names()[0].clone();
    lab.ok(&["taint", "node", &first, "dedicated-"]).await;
    lab.eventually(
        "bound to the untainted node",
        &["get", "pod", "picky", "-o", "jsonpath={.spec.nodeName}"],
        |out| out == first,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_powered_off_node_goes_not_ready_and_its_pods_move() {
    let lab = Lab::start(3).await;
    let tolerations = "      tolerations:\n      - {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 2}\n      - {key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: 2}";
    lab.apply(&deployment(6, "web:v1", tolerations)).await;
    let out = lab
        .eventually("6 Ready pods", PODS, |out| {
            pod_rows(out).iter().filter(|r| r.1 == "1/1").count() == 6
        })
        .await;
    let victim = pod_rows(&out)[0].3.clone();
    lab.cluster.power.power_off(&victim);
    lab.eventually(
        "the node is NotReady",
        &["get", "node", &victim, "--no-headers"],
        |out| out.split_whitespace().nth(1) == Some("NotReady"),
    )
    .await;
    let taints = lab
        .ok(&[
            "get",
            "node",
            &victim,
            "-o",
            "jsonpath={.spec.taints[*].key}",
        ])
        .await;
    assert!(
        taints.contains("node.kubernetes.io/unreachable"),
        "{taints}"
    );
    lab.eventually(
        "6 Ready pods, none on the dead node",
        &["get", "pods", "-l", "app=web", "-o", "json"],
        |out| {
            let pods: serde_json::Value = serde_json::from_str(out).unwrap();
            let live: Vec<&serde_json::Value> = pods["items"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
                .collect();
            live.len() == 6
                && live.iter().all(|p| {
                    p["spec"]["nodeName"] != victim.as_str()
                        && p["status"]["conditions"].as_array().is_some_and(|c| {
                            c.iter()
                                .any(|c| c["type"] == "Ready" && c["status"] == "True")
                        })
                })
        },
    )
    .await;
    lab.cluster.power.power_on(&victim);
    lab.eventually(
        "the node is Ready again",
        &["get", "node", &victim, "--no-headers"],
        |out| out.split_whitespace().nth(1) == Some("Ready"),
    )
    .await;
}

/// A Job manifest with the selector and labels the API server's Job defaults would add (so
/// the test holds whether or not they are there).
fn job_manifest(name: &str, spec: &str, annotations: &str) -> String {
    format!(
        r#"
apiVersion: batch/v1
kind: Job
metadata: {{name: {name}}}
spec:
{spec}
  manualSelector: true
  selector: {{matchLabels: {{batch.kubernetes.io/job-name: {name}}}}}
  template:
    metadata:
      labels: {{batch.kubernetes.io/job-name: {name}, job-name: {name}}}
      annotations: {{{annotations}}}
    spec:
      restartPolicy: Never
      containers: [{{name: main, image: busybox}}]
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_run_on_hollow_nodes_to_completion_or_to_their_backoff_limit() {
    let lab = Lab::start(2).await;
    // Hollow containers of Job pods run a second and exit 0.
    let manifest = job_manifest(
        "count",
        "  completions: 5\n  parallelism: 2\n  backoffLimit: 6",
        "",
    );
    let (ok, out) = lab.kubectl(&["create", "-f", "-"], Some(&manifest)).await;
    assert!(ok, "kubectl create:\n{out}");
    let manifest = job_manifest(
        "broken",
        "  completions: 1\n  backoffLimit: 1",
        "lab.tandem.dev/behavior: fail",
    );
    let (ok, out) = lab.kubectl(&["create", "-f", "-"], Some(&manifest)).await;
    assert!(ok, "kubectl create:\n{out}");
    lab.ok(&[
        "wait",
        "--for=condition=complete",
        "job/count",
        "--timeout=60s",
    ])
    .await;
    let succeeded = lab
        .ok(&["get", "job", "count", "-o", "jsonpath={.status.succeeded}"])
        .await;
    assert_eq!(succeeded.trim(), "5");
    let pods = lab
        .ok(&[
            "get",
            "pods",
            "-l",
            "batch.kubernetes.io/job-name=count",
            "-o",
            "jsonpath={range .items[*]}{.status.phase}{\"\\n\"}{end}",
        ])
        .await;
    assert_eq!(
        pods.lines().filter(|l| *l == "Succeeded").count(),
        5,
        "{pods}"
    );
    lab.ok(&[
        "wait",
        "--for=condition=failed",
        "job/broken",
        "--timeout=60s",
    ])
    .await;
    let reason = lab
        .ok(&[
            "get",
            "job",
            "broken",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Failed\")].reason} {.status.failed}",
        ])
        .await;
    assert_eq!(reason.trim(), "BackoffLimitExceeded 2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_create_job_and_cronjob_run_as_on_a_real_cluster() {
    let lab = Lab::start(2).await;
    lab.ok(&["create", "job", "pi", "--image=busybox"]).await;
    lab.ok(&[
        "wait",
        "--for=condition=complete",
        "job/pi",
        "--timeout=60s",
    ])
    .await;
    let out = lab
        .ok(&["get", "job", "pi", "-o", "jsonpath={.status.succeeded}"])
        .await;
    assert_eq!(out.trim(), "1");
    lab.ok(&[
        "create",
        "cronjob",
        "nightly",
        "--image=busybox",
        "--schedule=0 3 * * *",
    ])
    .await;
    lab.ok(&["create", "job", "now", "--from=cronjob/nightly"])
        .await;
    lab.ok(&[
        "wait",
        "--for=condition=complete",
        "job/now",
        "--timeout=60s",
    ])
    .await;
    let owner = lab
        .ok(&[
            "get",
            "job",
            "now",
            "-o",
            "jsonpath={.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name} {.status.succeeded}",
        ])
        .await;
    assert_eq!(owner.trim(), "CronJob/nightly 1");
    let (ok, out) = lab
        .kubectl(
            &[
                "create",
                "cronjob",
                "bad",
                "--image=busybox",
                "--schedule=TZ=UTC 0 3 * * *",
            ],
            None,
        )
        .await;
    assert!(!ok, "a TZ= schedule is refused:\n{out}");
}
