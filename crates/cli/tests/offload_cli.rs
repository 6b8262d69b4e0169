//! `tandem offload namespace` / `tandem unoffload namespace` as a user runs them against the
//! consumer's kubeconfig: twin namespace on the selected provider, errors that name the step.

use crate::support;

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

    let (ok, _, err) = tandem(
        &["offload", "namespace", "shop", "--fence-after", "10s"],
        &kubeconfig,
    )
    .await;
    assert!(!ok);
    assert!(
        err.contains("--fence-after needs --partition-policy Fence"),
        "{err}"
    );

    let (ok, out, err) = tandem(
        &[
            "offload",
            "namespace",
            "shop",
            "--pod-offloading-strategy",
            "Remote",
            "--selector",
            "region=eu-west",
            "--evict-after",
            "1m30s",
            "--partition-policy",
            "Fence",
            "--fence-after",
            "12500ms",
        ],
        &kubeconfig,
    )
    .await;
    assert!(ok, "stdout: {out}\nstderr: {err}");
    let nso = Api::<tandem_api::NamespaceOffloading>::namespaced(consumer.client.clone(), "shop")
        .get(tandem_api::names::OFFLOADING_NAME)
        .await
        .unwrap();
    assert_eq!(nso.spec.evict_after.as_deref(), Some("90s"));
    assert_eq!(
        nso.spec.partition_policy,
        tandem_api::PartitionPolicy::Fence
    );
    assert_eq!(
        nso.spec.fence_after.as_deref(),
        Some("13s"),
        "whole seconds, rounded up"
    );
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
    let (consumer, provider, _dir, kubeconfig) = peered(json!({"cpu": "2", "pods": "10"})).await;
    namespace(&consumer.client, "web").await;
    namespace(&consumer.client, "shop").await;
    // Same names on the provider are its admin's to allow (the default is `<ns>-<consumer>`).
    support::allow_namespace_mappings(&provider, &consumer.id).await;
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

/// Whether a pod counts for a disruption budget: Ready and not being deleted.
fn healthy(p: &k8s_openapi::api::core::v1::Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[tokio::test]
async fn drain_moves_pods_off_a_provider_within_their_budget_and_uncordon_lets_them_back() {
    use futures::StreamExt;
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::{Node, Pod};
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use kube::runtime::watcher;

    let (consumer, _provider, _dir, kubeconfig) = peered(json!({"cpu": "2", "pods": "10"})).await;
    support::offload(&consumer, &_provider, "shop", "LocalAndRemote").await;
    let pods: Api<Pod> = Api::namespaced(consumer.client.clone(), "shop");
    let nodes: Api<Node> = Api::all(consumer.client.clone());

    let (ok, _, err) = tandem(&["drain", "nowhere"], &kubeconfig).await;
    assert!(!ok);
    assert!(
        err.contains("provider nowhere has no virtual node here (no node tandem-nowhere)"),
        "{err}"
    );

    Api::<PodDisruptionBudget>::namespaced(consumer.client.clone(), "shop")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "web"},
                "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    // Three replicas, all on milan: the local node is cordoned while they are placed.
    let cordon = |on: bool| support::cordon_local_nodes(&consumer, on);
    cordon(true).await;
    let web = support::deployment("web", 3);
    Api::<Deployment>::namespaced(consumer.client.clone(), "shop")
        .create(
            &PostParams::default(),
            &serde_json::from_value(web).unwrap(),
        )
        .await
        .unwrap();
    let web_pods = kube::api::ListParams::default().labels("app=web");
    support::until(
        "3 web pods Ready on milan",
        Duration::from_secs(60),
        || async {
            let l = pods.list(&web_pods).await.ok()?;
            (l.items.iter().filter(|p| healthy(p)).count() == 3
                && l.items.iter().all(|p| {
                    p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("tandem-milan")
                }))
            .then_some(())
        },
    )
    .await;

    // Every change to the web pods, as the API server orders them: the fewest healthy at once.
    let fewest = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(usize::MAX));
    let watch = {
        let fewest = fewest.clone();
        let stream = watcher(pods.clone(), watcher::Config::default().labels("app=web"));
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            let (mut seen, mut listing) = (std::collections::BTreeMap::new(), None);
            while let Some(event) = stream.next().await {
                match event {
                    Ok(watcher::Event::Init) => listing = Some(std::collections::BTreeMap::new()),
                    Ok(watcher::Event::InitApply(p)) => {
                        if let Some(l) = listing.as_mut() {
                            l.insert(p.metadata.name.clone().unwrap(), healthy(&p));
                        }
                    }
                    Ok(watcher::Event::InitDone) => seen = listing.take().unwrap_or_default(),
                    Ok(watcher::Event::Apply(p)) => {
                        seen.insert(p.metadata.name.clone().unwrap(), healthy(&p));
                    }
                    Ok(watcher::Event::Delete(p)) => {
                        seen.remove(&p.metadata.name.clone().unwrap());
                    }
                    Err(_) => continue,
                }
                if listing.is_none() {
                    let now = seen.values().filter(|h| **h).count();
                    fewest.fetch_min(now, std::sync::atomic::Ordering::SeqCst);
                }
            }
        })
    };
    support::until(
        "the watch has listed the pods",
        Duration::from_secs(10),
        || async { (fewest.load(std::sync::atomic::Ordering::SeqCst) == 3).then_some(()) },
    )
    .await;

    // The drain as a user runs it. The local node stays cordoned at first, so the first
    // eviction's replacement cannot be placed and the budget must hold the others back; once
    // the drain says so, the local node takes pods again.
    let mut drain = tokio::process::Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["drain", "milan", "--timeout", "120s", "--kubeconfig"])
        .arg(&kubeconfig)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("tandem runs");
    let stdout = drain.stdout.take().unwrap();
    let out = tokio::spawn(async move {
        let mut out = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut { stdout }, &mut out)
            .await
            .unwrap();
        out
    });
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(drain.stderr.take().unwrap()));
    let mut err = String::new();
    while let Some(line) = lines.next_line().await.unwrap() {
        if line.contains("waiting to evict pod") && !err.contains("waiting to evict pod") {
            cordon(false).await;
        }
        err.push_str(&line);
        err.push('\n');
    }
    let ok = drain.wait().await.unwrap().success();
    let out = out.await.unwrap();
    assert!(ok, "stdout: {out}\nstderr: {err}");
    assert!(
        err.contains("cordoned tandem-milan (provider milan)"),
        "{err}"
    );
    assert!(err.contains("evicted pod shop/web-"), "{err}");
    assert!(
        err.contains("waiting to evict pod shop/web-")
            && err.contains("would violate the pod's disruption budget"),
        "the budget held an eviction back and the drain said so: {err}"
    );
    assert!(err.contains("3 of 3 pod(s) evicted"), "{err}");
    assert!(
        out.contains("drained tandem-milan (provider milan): 3 pod(s) moved off it"),
        "{out}"
    );
    let l = pods.list(&web_pods).await.unwrap();
    assert!(
        l.items
            .iter()
            .all(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some("tandem-milan")),
        "no web pod left on milan"
    );
    support::until(
        "3 web pods Ready elsewhere",
        Duration::from_secs(60),
        || async {
            let l = pods.list(&web_pods).await.ok()?;
            (l.items.iter().filter(|p| healthy(p)).count() == 3).then_some(())
        },
    )
    .await;
    watch.abort();
    let fewest = fewest.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        fewest >= 2,
        "the budget kept 2 of 3 Ready throughout; at one point {fewest} were"
    );

    let (ok, out, _) = tandem(&["status"], &kubeconfig).await;
    assert!(ok && out.contains("True,SchedulingDisabled"), "{out}");
    // Cordoned: a pod that may only run on milan waits.
    let node = nodes.get("tandem-milan").await.unwrap();
    assert_eq!(node.spec.unwrap().unschedulable, Some(true));
    let pinned = |name: &str| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"nodeSelector": {tandem_api::names::REMOTE_CLUSTER_LABEL: "milan"},
                     "containers": [{"name": "main", "image": "nginx"}]},
        }))
        .unwrap()
    };
    pods.create(&PostParams::default(), &pinned("pinned"))
        .await
        .unwrap();
    support::until(
        "the pinned pod held back by the cordon",
        Duration::from_secs(30),
        || async {
            let p = pods.get("pinned").await.ok()?;
            p.status?.conditions?.into_iter().find(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.message
                        .as_deref()
                        .is_some_and(|m| m.contains("unschedulable"))
            })
        },
    )
    .await;
    let (ok, out, err) = tandem(&["uncordon", "milan"], &kubeconfig).await;
    assert!(ok, "stdout: {out}\nstderr: {err}");
    assert!(
        out.contains("uncordoned tandem-milan (provider milan)"),
        "{out}"
    );
    let (ok, out, _) = tandem(&["uncordon", "milan"], &kubeconfig).await;
    assert!(ok && out.contains("not cordoned"), "{out}");
    support::until(
        "the pinned pod placed on milan",
        Duration::from_secs(60),
        || async {
            let p = pods.get("pinned").await.ok()?;
            (p.spec?.node_name.as_deref() == Some("tandem-milan")).then_some(())
        },
    )
    .await;
}
