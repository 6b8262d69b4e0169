//! Network mode (root): two clusters on the same pod CIDR, echo Deployments behind Services,
//! probes that reach them by IP, ClusterIP and DNS name, isolation between the clusters,
//! an allow-list no pod spec gets around, and nothing left on the host.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tandem_lab::{Lab, LabCluster, LabSpec};
use tandem_testing::until;

/// The host's own addresses, routes and rules, to compare before, during and after.
fn host_network() -> String {
    let mut out = String::new();
    for args in [
        &["-4", "addr", "show"][..],
        &["-6", "addr", "show"],
        &["-4", "route", "show", "table", "all"],
        &["-6", "route", "show", "table", "all"],
        &["-4", "rule", "show"],
    ] {
        let o = Command::new("ip").args(args).output().expect("ip runs");
        out.push_str(&String::from_utf8_lossy(&o.stdout));
    }
    // Drop lines that change on their own (address lifetimes).
    out.lines()
        .filter(|l| !l.contains("valid_lft"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn namespaces() -> BTreeSet<String> {
    tandem_lab::network::topology::namespaces()
        .into_iter()
        .collect()
}

async fn apply(cluster: &LabCluster, objects: Value) {
    for obj in objects.as_array().expect("a list of objects") {
        let kind = obj["kind"].as_str().unwrap();
        let ns = obj["metadata"]["namespace"].as_str().unwrap_or("default");
        let name = obj["metadata"]["name"].as_str().unwrap();
        let pp = PatchParams::apply("test").force();
        let result = match kind {
            "Namespace" => {
                Api::<k8s_openapi::api::core::v1::Namespace>::all(cluster.client.clone())
                    .patch(name, &pp, &Patch::Apply(obj))
                    .await
                    .map(|_| ())
            }
            "Deployment" => Api::<Deployment>::namespaced(cluster.client.clone(), ns)
                .patch(name, &pp, &Patch::Apply(obj))
                .await
                .map(|_| ()),
            "Service" => Api::<Service>::namespaced(cluster.client.clone(), ns)
                .patch(name, &pp, &Patch::Apply(obj))
                .await
                .map(|_| ()),
            "Pod" => Api::<Pod>::namespaced(cluster.client.clone(), ns)
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(obj.clone()).unwrap(),
                )
                .await
                .map(|_| ()),
            other => panic!("unexpected kind {other}"),
        };
        result.unwrap_or_else(|e| panic!("applying {kind} {ns}/{name}: {e}"));
    }
}

fn demo(replicas: i32) -> Value {
    json!([
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo"}},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": "hello", "namespace": "demo"},
         "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "hello"}},
                  "template": {"metadata": {"labels": {"app": "hello"}},
                               "spec": {"containers": [{"name": "echo", "image": "tandem.dev/echo",
                                        "ports": [{"containerPort": 8080, "name": "http"}]}]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "hello", "namespace": "demo"},
         "spec": {"selector": {"app": "hello"},
                  "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}},
    ])
}

fn probe_pod(node: &str) -> Value {
    json!([{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", "namespace": "demo"},
            "spec": {"nodeName": node, "containers": [{"name": "probe", "image": "tandem.dev/probe"}]}}])
}

/// The echo pods of `demo/hello` that are Running, by name, with their IPs and nodes.
async fn echo_pods(cluster: &LabCluster) -> Vec<(String, String, String)> {
    let pods = Api::<Pod>::namespaced(cluster.client.clone(), "demo")
        .list(&kube::api::ListParams::default().labels("app=hello"))
        .await
        .expect("list pods");
    pods.items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let status = p.status?;
            (status.phase.as_deref() == Some("Running")).then_some(())?;
            Some((
                p.metadata.name?,
                status.pod_ip?,
                p.spec?.node_name.unwrap_or_default(),
            ))
        })
        .collect()
}

/// What the echo server answered, parsed.
fn reply(text: &str) -> Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("echo reply {text:?}: {e}"))
}

async fn fetch(cluster: &LabCluster, url: &str) -> Result<Value, String> {
    let network = cluster.network.as_ref().expect("network mode");
    network
        .probe_fetch("demo", "probe", url)
        .await
        .map(|t| reply(&t))
        .map_err(|e| e.message())
}

/// Who answers `url` over `n` requests, or the first failure.
async fn try_answerers(
    cluster: &LabCluster,
    url: &str,
    n: usize,
) -> Result<BTreeSet<String>, String> {
    let mut who = BTreeSet::new();
    for _ in 0..n {
        let r = fetch(cluster, url).await?;
        assert_eq!(
            r["cluster"], cluster.config.name,
            "a reply through {url} comes from the probe's own cluster: {r}"
        );
        who.insert(r["pod"].as_str().unwrap().to_string());
    }
    Ok(who)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
async fn two_clusters_on_one_pod_cidr_route_pods_services_and_names_each_on_its_own() {
    tandem_testing::needs_root();
    let _ = tracing_subscriber::fmt()
        .with_env_filter("tandem_lab=info")
        .with_test_writer()
        .try_init();
    let host_before = host_network();
    let before = namespaces();
    let lab = Lab::start(
        &LabSpec {
            clusters: 2,
            nodes: 2,
            dir: None,
            network: true,
            tandem_binary: None,
            profile: Default::default(),
        },
        |_| {},
    )
    .await
    .expect("network-mode lab starts");
    let created: BTreeSet<String> = namespaces().difference(&before).cloned().collect();
    let instance = created
        .iter()
        .find_map(|n| n.strip_suffix("-wan"))
        .expect("a WAN namespace")
        .to_string();
    for want in ["-1-net", "-1-node-1", "-1-node-2", "-2-net", "-2-node-2"] {
        assert!(
            created.contains(&format!("{instance}{want}")),
            "{instance}{want} among {created:?}"
        );
    }

    for cluster in &lab.clusters {
        apply(cluster, demo(3)).await;
        let node = cluster.node_names()[0].clone();
        apply(cluster, probe_pod(&node)).await;
    }
    for cluster in &lab.clusters {
        until(
            &format!("3 running echo pods and a probe in {}", cluster.config.name),
            Duration::from_secs(60),
            || async {
                let probe = Api::<Pod>::namespaced(cluster.client.clone(), "demo")
                    .get("probe")
                    .await
                    .ok()?;
                let running = probe.status?.phase.as_deref() == Some("Running");
                (running && echo_pods(cluster).await.len() == 3).then_some(())
            },
        )
        .await;
    }
    assert_eq!(
        host_network(),
        host_before,
        "the host's network is untouched while the lab runs"
    );

    for cluster in &lab.clusters {
        let name = &cluster.config.name;
        let pods = echo_pods(cluster).await;
        let names: BTreeSet<String> = pods.iter().map(|p| p.0.clone()).collect();
        // By pod IP, every pod (one of them on the probe's own node).
        for (pod, ip, _) in &pods {
            let r = fetch(cluster, &format!("http://{ip}:8080/"))
                .await
                .unwrap_or_else(|e| panic!("{name}: pod {pod} at {ip}: {e}"));
            assert_eq!(r["pod"], pod.as_str(), "{r}");
            assert_eq!(r["cluster"], name.as_str(), "{r}");
        }
        let probe_node = cluster.node_names()[0].clone();
        assert!(
            pods.iter().any(|p| p.2 == probe_node),
            "the test covers a same-node endpoint: {pods:?}"
        );
        // By ClusterIP, by full name, and by short name through the search path: every
        // endpoint answers (allow for the proxy to catch up with the endpoints).
        let svc = Api::<Service>::namespaced(cluster.client.clone(), "demo")
            .get("hello")
            .await
            .expect("Service");
        let cluster_ip = svc.spec.unwrap().cluster_ip.unwrap();
        for url in [
            format!("http://{cluster_ip}/"),
            "http://hello.demo.svc.cluster.local/".to_string(),
            "http://hello/".to_string(),
        ] {
            // Until the proxy has the endpoints, the Service refuses connections (as
            // kube-proxy rejects a Service without endpoints): a refusal is not yet a failure.
            until(
                &format!("every endpoint of hello answering {url} in {name}"),
                Duration::from_secs(30),
                || async {
                    let answered = try_answerers(cluster, &url, 30).await.ok()?;
                    (answered == names).then_some(())
                },
            )
            .await;
        }
    }

    // An address allocated only in lab-2 does not answer from lab-1.
    let (one, two) = (&lab.clusters[0], &lab.clusters[1]);
    let taken: BTreeSet<String> = echo_pods(one).await.into_iter().map(|p| p.1).collect();
    let mut extra = 0;
    let only_in_two = loop {
        let ips: Vec<String> = echo_pods(two).await.into_iter().map(|p| p.1).collect();
        if let Some(ip) = ips.into_iter().find(|ip| !taken.contains(ip)) {
            break ip;
        }
        extra += 2;
        Api::<Deployment>::namespaced(two.client.clone(), "demo")
            .patch(
                "hello",
                &PatchParams::apply("test").force(),
                &Patch::Apply(&demo(3 + extra)[1]),
            )
            .await
            .expect("scale lab-2");
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let crossed = fetch(one, &format!("http://{only_in_two}:8080/")).await;
    assert!(
        crossed.is_err(),
        "{only_in_two} exists only in lab-2, yet lab-1's probe got {crossed:?}"
    );

    // Scaling down changes who answers.
    Api::<Deployment>::namespaced(one.client.clone(), "demo")
        .patch(
            "hello",
            &PatchParams::apply("test").force(),
            &Patch::Apply(&demo(1)[1]),
        )
        .await
        .expect("scale lab-1 to one");
    until(
        "only the remaining echo pod answering after scaling to one",
        Duration::from_secs(60),
        || async {
            let left: BTreeSet<String> = echo_pods(one).await.into_iter().map(|p| p.0).collect();
            // Hollow deletion stops a pod at once, before kube-proxy has dropped it from the
            // Service: connections may fail until the rules catch up.
            let now = try_answerers(one, "http://hello/", 10).await.ok()?;
            (left.len() == 1 && now == left).then_some(())
        },
    )
    .await;

    // A hostNetwork pod runs in its node's namespace: the node's address is its own, and
    // deleting it leaves the node's network as it was.
    let node_two = one.node_names()[1].clone();
    let node_ip = tandem_lab::cluster::nodes_of(&one.config)[1]
        .internal_ip
        .clone();
    apply(
        one,
        json!([{"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "host-echo", "namespace": "demo"},
                "spec": {"nodeName": node_two, "hostNetwork": true,
                         "containers": [{"name": "echo", "image": "tandem.dev/echo",
                                         "ports": [{"containerPort": 9090}]}]}}]),
    )
    .await;
    let pods_one = Api::<Pod>::namespaced(one.client.clone(), "demo");
    until(
        "the hostNetwork pod Running with its node's address",
        Duration::from_secs(30),
        || async {
            let status = pods_one.get("host-echo").await.ok()?.status?;
            (status.phase.as_deref() == Some("Running")
                && status.pod_ip.as_deref() == Some(node_ip.as_str())
                && status.host_ip.as_deref() == Some(node_ip.as_str()))
            .then_some(())
        },
    )
    .await;
    let r = fetch(one, &format!("http://{node_ip}:9090/"))
        .await
        .unwrap_or_else(|e| panic!("the hostNetwork pod at {node_ip}:9090: {e}"));
    assert_eq!(r["pod"], "host-echo", "{r}");
    let node_ns = one.network.as_ref().unwrap().net().node_namespaces()[1]
        .1
        .clone();
    pods_one
        .delete("host-echo", &Default::default())
        .await
        .expect("delete the hostNetwork pod");
    until(
        "the hostNetwork pod gone and its port closed",
        Duration::from_secs(60),
        || async {
            let gone = pods_one.get_opt("host-echo").await.ok()?.is_none();
            (gone
                && fetch(one, &format!("http://{node_ip}:9090/"))
                    .await
                    .is_err())
            .then_some(())
        },
    )
    .await;
    assert!(
        namespaces().contains(&node_ns),
        "the node's namespace {node_ns} outlives its hostNetwork pod"
    );
    let r = fetch(one, "http://hello/")
        .await
        .expect("the cluster still routes");
    assert_eq!(r["cluster"], "lab-1", "{r}");

    // Pods reach their API server through the `kubernetes` Service and another cluster's on
    // its WAN address, each verifying the server's certificate for the address it dialled.
    let dir = tempfile::tempdir().unwrap();
    for (from, to, url) in [
        (one, one, "https://10.96.0.1:443/version".to_string()),
        (one, two, format!("{}/version", two.wan_url().unwrap())),
    ] {
        let ca = dir.path().join(format!("{}-ca.crt", to.config.name));
        std::fs::write(&ca, to.server.ca_pem()).unwrap();
        let pod_ns = from.network.as_ref().unwrap().net().pod_ns("demo", "probe");
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &pod_ns,
                "curl",
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
            ])
            .arg("--cacert")
            .arg(&ca)
            .arg(&url)
            .output()
            .unwrap();
        // 200: TLS verified and the request reached the server, which answers /version to
        // anonymous callers as kube-apiserver does (system:public-info-viewer).
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "200",
            "{url} from {}: {}",
            from.config.name,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // A LoadBalancer Service of lab-2 gets lab-2's WAN address as its ingress, and a pod of
    // lab-1 reaches it there over the WAN; the echo pod sees lab-1's public address (lab-1's
    // edge masquerades what leaves it, lab-2's load balancer keeps the source).
    let wan_two = two.network.as_ref().unwrap().wan_ip().to_string();
    let services = Api::<Service>::namespaced(two.client.clone(), "demo");
    let mut lb = demo(1)[2].clone();
    lb["spec"]["type"] = json!("LoadBalancer");
    services
        .patch(
            "hello",
            &PatchParams::apply("test").force(),
            &Patch::Apply(&lb),
        )
        .await
        .expect("make lab-2's hello a LoadBalancer Service");
    until(
        "lab-2's LoadBalancer Service getting its WAN address as ingress",
        Duration::from_secs(30),
        || async {
            let svc = services.get("hello").await.ok()?;
            let ingress = svc.status?.load_balancer?.ingress?;
            (ingress.len() == 1 && ingress[0].ip.as_deref() == Some(wan_two.as_str())).then_some(())
        },
    )
    .await;
    let pods_two: BTreeSet<String> = echo_pods(two).await.into_iter().map(|p| p.0).collect();
    let r = until(
        "lab-1's probe reaching lab-2's load balancer over the WAN",
        Duration::from_secs(30),
        || async { fetch(one, &format!("http://{wan_two}/")).await.ok() },
    )
    .await;
    assert_eq!(r["cluster"], "lab-2", "{r}");
    assert!(pods_two.contains(r["pod"].as_str().unwrap()), "{r}");
    assert_eq!(
        r["client"],
        one.network.as_ref().unwrap().wan_ip().to_string(),
        "the load balancer keeps the client's (masqueraded) address: {r}"
    );
    // Back to ClusterIP: the ingress goes, and so does the WAN path.
    services
        .patch(
            "hello",
            &PatchParams::apply("test").force(),
            &Patch::Apply(&demo(1)[2]),
        )
        .await
        .expect("make lab-2's hello a ClusterIP Service again");
    until(
        "the ingress removed and the WAN path closed",
        Duration::from_secs(30),
        || async {
            let svc = services.get("hello").await.ok()?;
            let none = svc
                .status
                .and_then(|s| s.load_balancer)
                .and_then(|l| l.ingress)
                .is_none_or(|i| i.is_empty());
            (none && fetch(one, &format!("http://{wan_two}/")).await.is_err()).then_some(())
        },
    )
    .await;

    lab.shutdown();
    let left: Vec<String> = namespaces()
        .into_iter()
        .filter(|n| n.starts_with(&format!("{instance}-")) || n == &format!("{instance}-wan"))
        .collect();
    assert!(left.is_empty(), "namespaces left after shutdown: {left:?}");
    assert_eq!(
        host_network(),
        host_before,
        "the host's network is as it was"
    );
}

/// The kind profile: no load balancer answers (a LoadBalancer Service keeps no ingress), and
/// the clusters' nodes share one network, so a pod of lab-1 reaches a NodePort of lab-2 at
/// lab-2's node address; the k3s profile keeps nodes behind each cluster's NAT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
async fn a_kind_lab_has_no_load_balancer_and_its_clusters_share_the_node_network() {
    tandem_testing::needs_root();
    let host_before = host_network();
    let before = namespaces();
    let lab = Lab::start(
        &LabSpec {
            clusters: 2,
            nodes: 1,
            dir: None,
            network: true,
            tandem_binary: None,
            profile: tandem_lab::LabProfile::Kind,
        },
        |_| {},
    )
    .await
    .expect("a kind-profile lab starts");
    let (one, two) = (&lab.clusters[0], &lab.clusters[1]);
    let mut objects = demo(1);
    objects[2]["spec"]["type"] = json!("LoadBalancer");
    apply(two, objects).await;
    apply(one, demo(0)).await;
    apply(one, probe_pod(&one.node_names()[0])).await;
    let services = Api::<Service>::namespaced(two.client.clone(), "demo");
    let node_port = until(
        "lab-2's Service with a node port",
        Duration::from_secs(30),
        || async {
            let svc = services.get("hello").await.ok()?;
            svc.spec?.ports?.first()?.node_port
        },
    )
    .await;
    let node_ip = tandem_lab::network::topology::node_ip(two.config.index, 1);
    let url = format!("http://{node_ip}:{node_port}/");
    let r = until(
        "lab-1's probe reaching lab-2's NodePort at lab-2's node address",
        Duration::from_secs(60),
        || async { fetch(one, &url).await.ok() },
    )
    .await;
    assert_eq!(r["cluster"], "lab-2", "{r}");
    // By now ServiceLB (the k3s profile) would long have given it lab-2's WAN address.
    let svc = services.get("hello").await.unwrap();
    let ingress = svc
        .status
        .and_then(|s| s.load_balancer)
        .and_then(|l| l.ingress)
        .unwrap_or_default();
    assert!(ingress.is_empty(), "no load balancer on kind: {ingress:?}");

    let instance_of = |n: &String| n.strip_suffix("-wan").map(str::to_string);
    let instance = namespaces()
        .difference(&before)
        .find_map(instance_of)
        .expect("a WAN namespace");
    lab.shutdown();
    let left: Vec<String> = namespaces()
        .into_iter()
        .filter(|n| n.starts_with(&format!("{instance}-")))
        .collect();
    assert!(left.is_empty(), "namespaces left after shutdown: {left:?}");
    assert_eq!(
        host_network(),
        host_before,
        "the host's network is as it was"
    );
}

/// Nothing a pod spec says makes the lab run a host command: a built-in image with another
/// command fails to start as runc fails it, and any other image stays hollow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
async fn pod_specs_cannot_run_anything_outside_the_allow_list() {
    tandem_testing::needs_root();
    let marker = std::env::temp_dir().join(format!("tandem-allow-list-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    let cluster = LabCluster::start(tandem_lab::LabConfig {
        network: true,
        nodes: 1,
        ..Default::default()
    })
    .await
    .expect("network-mode cluster starts");
    let touch = format!("touch {}", marker.display());
    apply(
        &cluster,
        json!([
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo"}},
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sneaky", "namespace": "demo"},
             "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "tandem.dev/echo",
                      "command": ["/bin/sh", "-c", touch]}]}},
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "busy", "namespace": "demo"},
             "spec": {"containers": [{"name": "c", "image": "busybox",
                      "command": ["/bin/sh", "-c", touch], "args": [touch]}]}},
        ]),
    )
    .await;
    let pods = Api::<Pod>::namespaced(cluster.client.clone(), "demo");
    let sneaky = until(
        "sneaky's container refused",
        Duration::from_secs(30),
        || async {
            let pod = pods.get("sneaky").await.ok()?;
            let terminated = pod
                .status?
                .container_statuses?
                .first()?
                .state
                .clone()?
                .terminated?;
            Some(terminated)
        },
    )
    .await;
    assert_eq!(sneaky.exit_code, 128);
    assert_eq!(sneaky.reason.as_deref(), Some("StartError"));
    assert!(
        sneaky
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("/bin/sh"),
        "{sneaky:?}"
    );
    until("busy running (hollow)", Duration::from_secs(30), || async {
        let pod = pods.get("busy").await.ok()?;
        (pod.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
    let network = cluster.network.clone().expect("network mode");
    let log = network.log("demo", "busy", "c").expect("busy has a log");
    assert!(log.contains("hollow"), "{log}");
    // Give a command every chance to have run, then check it did not.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!marker.exists(), "a pod spec ran a host command");
    cluster.shutdown();
}

/// A lab instance whose process died (SIGKILL: no cleanup ran) is removed by the next start;
/// one whose process lives is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
async fn the_next_start_removes_instances_of_dead_processes_only() {
    tandem_testing::needs_root();
    use tandem_lab::network::topology::{REGISTRY, cleanup_stale, namespaces};
    let mut dead = Command::new("true").spawn().expect("spawn true");
    let dead_pid = dead.id();
    dead.wait().expect("true exits");
    let mut alive = Command::new("sleep")
        .arg("60")
        .spawn()
        .expect("spawn sleep");
    let id = |n: u32| format!("t{:03x}", (std::process::id() + n) & 0xfff);
    let (dead_id, live_id) = (id(1), id(2));
    for (instance, pid) in [(&dead_id, dead_pid), (&live_id, alive.id())] {
        let dir = std::path::Path::new(REGISTRY).join(instance);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("owner"), format!("{pid} 0\n")).unwrap();
        let ns = format!("lab-{instance}-1-net");
        let ok = Command::new("ip")
            .args(["netns", "add", &ns])
            .status()
            .unwrap();
        assert!(ok.success(), "ip netns add {ns}");
    }
    cleanup_stale();
    let now = namespaces();
    assert!(
        !now.contains(&format!("lab-{dead_id}-1-net")),
        "the dead instance's namespace is gone"
    );
    assert!(!std::path::Path::new(REGISTRY).join(&dead_id).exists());
    assert!(
        now.contains(&format!("lab-{live_id}-1-net")),
        "the live instance's namespace is kept"
    );
    alive.kill().unwrap();
    alive.wait().unwrap();
    cleanup_stale();
    assert!(
        !namespaces().contains(&format!("lab-{live_id}-1-net")),
        "once its process is gone, it goes too"
    );
}

/// `kubectl logs` and `kubectl exec` reach a network-mode pod through the API server and its
/// node's kubelet endpoint; RBAC on `pods/log` and `pods/exec` decides who may; a pod calling
/// the kubelet endpoint directly is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
async fn kubectl_logs_and_exec_reach_pods_through_the_api_server_and_rbac_decides() {
    tandem_testing::needs_root();
    let cluster = LabCluster::start(tandem_lab::LabConfig {
        network: true,
        nodes: 1,
        ..Default::default()
    })
    .await
    .expect("network-mode cluster starts");
    apply(
        &cluster,
        json!([
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo"}},
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "echo", "namespace": "demo"},
             "spec": {"containers": [{"name": "echo", "image": "tandem.dev/echo"}]}},
        ]),
    )
    .await;
    let pods = Api::<Pod>::namespaced(cluster.client.clone(), "demo");
    let pod = until("echo running", Duration::from_secs(30), || async {
        let pod = pods.get("echo").await.ok()?;
        (pod.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(pod)
    })
    .await;
    let ip = pod.status.unwrap().pod_ip.unwrap();
    // One request so the log has a request line.
    let network = cluster.network.clone().unwrap();
    let node_ns = network.net().node_ns(1);
    let ok = Command::new("ip")
        .args([
            "netns",
            "exec",
            &node_ns,
            "curl",
            "-s",
            &format!("http://{ip}:8080/hi"),
        ])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&ok.stdout).contains("\"pod\":\"echo\""));

    let dir = tempfile::tempdir().unwrap();
    let admin = dir.path().join("admin");
    std::fs::write(&admin, cluster.server.admin_kubeconfig().unwrap()).unwrap();
    let kubectl = |config: std::path::PathBuf, args: Vec<&'static str>| {
        let home = dir.path().to_path_buf();
        async move {
            let out = tokio::process::Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(&config)
                .args(&args)
                .env("HOME", &home)
                .output()
                .await
                .expect("kubectl runs");
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        }
    };
    let (code, out, err) = kubectl(admin.clone(), vec!["logs", "-n", "demo", "echo"]).await;
    assert_eq!(code, Some(0), "kubectl logs: {err}");
    assert!(out.contains("echo: listening on :8080"), "{out}");
    assert!(out.contains("GET /hi 200"), "{out}");
    let (code, out, _) = kubectl(
        admin.clone(),
        vec!["logs", "-n", "demo", "echo", "--tail", "1"],
    )
    .await;
    assert_eq!(code, Some(0));
    assert_eq!(out.lines().count(), 1, "--tail 1: {out:?}");

    let (code, out, err) = kubectl(
        admin.clone(),
        vec!["exec", "-n", "demo", "echo", "--", "hostname"],
    )
    .await;
    assert_eq!(code, Some(0), "kubectl exec hostname: {err}");
    assert_eq!(out.trim(), "echo");
    let (code, _, err) = kubectl(
        admin.clone(),
        vec!["exec", "-n", "demo", "echo", "--", "/bin/sh", "-c", "id"],
    )
    .await;
    assert_eq!(code, Some(127), "a missing executable exits 127: {err}");
    assert!(err.contains("executable file not found"), "{err}");

    // A user who may read pods but not their logs or exec into them.
    let viewer = dir.path().join("viewer");
    std::fs::write(&viewer, cluster.server.kubeconfig_for("vera", &[]).unwrap()).unwrap();
    let rbac = json!([
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "pod-reader", "namespace": "demo"},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "vera", "namespace": "demo"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
         "subjects": [{"kind": "User", "name": "vera", "apiGroup": "rbac.authorization.k8s.io"}]},
    ]);
    for obj in rbac.as_array().unwrap() {
        let kind = obj["kind"].as_str().unwrap();
        let gvk = kube::api::GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", kind);
        let resource = kube::api::ApiResource::from_gvk(&gvk);
        kube::Api::<kube::api::DynamicObject>::namespaced_with(
            cluster.client.clone(),
            "demo",
            &resource,
        )
        .create(
            &PostParams::default(),
            &serde_json::from_value(obj.clone()).unwrap(),
        )
        .await
        .unwrap_or_else(|e| panic!("creating {kind}: {e}"));
    }
    let (code, _, err) = kubectl(viewer.clone(), vec!["logs", "-n", "demo", "echo"]).await;
    assert_ne!(code, Some(0));
    assert!(
        err.contains("forbidden") && err.contains("pods/log"),
        "{err}"
    );
    let (code, _, err) = kubectl(
        viewer.clone(),
        vec!["exec", "-n", "demo", "echo", "--", "hostname"],
    )
    .await;
    assert_ne!(code, Some(0));
    assert!(
        err.contains("forbidden") && err.contains("pods/exec"),
        "{err}"
    );

    // The kubelet endpoint itself, called from a pod: 401.
    let pod_ns = network.net().pod_ns("demo", "echo");
    let node_ip = tandem_lab::network::topology::node_ip(1, 1);
    let direct = Command::new("ip")
        .args([
            "netns",
            "exec",
            &pod_ns,
            "curl",
            "-sk",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &format!("https://{node_ip}:10250/exec/demo/echo/echo?command=hostname"),
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&direct.stdout), "401", "{direct:?}");
    cluster.shutdown();
}

/// `kubectl attach` to a network-mode echo pod streams what the container writes from then on
/// — each request the echo server logs shows on attach's stdout, its earlier lines do not —
/// and ends cleanly when the container stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
async fn kubectl_attach_streams_new_output_until_the_container_stops() {
    tandem_testing::needs_root();
    use tokio::io::AsyncBufReadExt;
    let cluster = LabCluster::start(tandem_lab::LabConfig {
        network: true,
        nodes: 1,
        ..Default::default()
    })
    .await
    .expect("network-mode cluster starts");
    apply(
        &cluster,
        json!([
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo"}},
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "echo", "namespace": "demo"},
             "spec": {"containers": [{"name": "echo", "image": "tandem.dev/echo"}]}},
        ]),
    )
    .await;
    let pods = Api::<Pod>::namespaced(cluster.client.clone(), "demo");
    until("echo running", Duration::from_secs(30), || async {
        let pod = pods.get("echo").await.ok()?;
        (pod.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
    let network = cluster.network.clone().unwrap();
    let before = network
        .probe_fetch("demo", "echo", "http://127.0.0.1:8080/before")
        .await
        .expect("echo answers before attach");
    assert!(before.contains("\"pod\":\"echo\""), "{before}");

    let dir = tempfile::tempdir().unwrap();
    let admin = dir.path().join("admin");
    std::fs::write(&admin, cluster.server.admin_kubeconfig().unwrap()).unwrap();
    let mut attach = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&admin)
        .args(["attach", "-n", "demo", "echo"])
        .env("HOME", dir.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("kubectl runs");
    let mut stdout = tokio::io::BufReader::new(attach.stdout.take().unwrap()).lines();

    // Attach streams from the moment it is connected, which kubectl does not announce: ask
    // until a request's line shows up.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let first = loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no request's log line on kubectl attach's stdout within 60s"
        );
        network
            .probe_fetch("demo", "echo", "http://127.0.0.1:8080/attached")
            .await
            .expect("echo answers");
        // `next_line` is cancel-safe: a line half read is kept for the next call.
        match tokio::time::timeout(Duration::from_secs(1), stdout.next_line()).await {
            Ok(line) => break line.unwrap().expect("kubectl attach's stdout stays open"),
            Err(_) => continue,
        }
    };
    assert!(
        first.starts_with("GET /attached 200"),
        "only lines written after attaching, the first being a request: {first:?}"
    );
    // A later request is streamed too.
    network
        .probe_fetch("demo", "echo", "http://127.0.0.1:8080/again")
        .await
        .expect("echo answers");
    let again = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let line = stdout
                .next_line()
                .await
                .unwrap()
                .expect("attach still open");
            if line.contains("/again") {
                return line;
            }
            assert!(line.contains("GET /attached 200"), "unexpected {line:?}");
        }
    })
    .await
    .expect("the second request's line within 30s");
    assert!(again.starts_with("GET /again 200"), "{again:?}");

    // The container stops (its pod is deleted): attach ends as a finished stream does.
    pods.delete(
        "echo",
        &kube::api::DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .expect("delete echo");
    let status = tokio::time::timeout(Duration::from_secs(60), attach.wait())
        .await
        .expect("kubectl attach exits once the container stops")
        .unwrap();
    let mut err = String::new();
    use tokio::io::AsyncReadExt;
    attach
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .await
        .unwrap();
    assert!(status.success(), "kubectl attach: {status}: {err}");
    cluster.shutdown();
}
