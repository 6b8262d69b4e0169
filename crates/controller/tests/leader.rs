//! Two controller replicas on one cluster: only the holder of the leader Lease writes — during
//! a burst of 200 offloaded pods the follower sends not one write — and when the leader dies
//! the follower takes over and offloading goes on. The leader's `/metrics`, scraped during and
//! after the burst, shows what happened.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tandem_api::names;
use tandem_controller::Controller;
use tandem_controller::leader::{Elector, LeaderElection};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support;
use support::{Cluster, offload_remote, offloaded_deployment, peer, test_options, until};

/// `GET path` on `addr`: the status code and the body.
async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let code = answer[9..12].parse().unwrap();
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

/// The value of the sample `name` (with its labels, as exposed) in a scrape, if present.
fn sample(scrape: &str, name: &str) -> Option<f64> {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

fn replica(name: &str) -> tandem_controller::Options {
    tandem_controller::Options {
        metrics_addr: Some(([127, 0, 0, 1], 0).into()),
        // Deadlines a starved CI machine meets: with 2 s to renew, the one replica left lost
        // its Lease in a clean-clone run (both cores busy with another test) and, stopping as
        // a leader must, left nobody to finish the burst. Taking over still waits for the
        // Lease to run out (10 s), well inside the 30 s the test allows.
        leader_election: Some(LeaderElection {
            identity: name.to_string(),
            lease_duration: Duration::from_secs(10),
            renew_deadline: Duration::from_secs(8),
            retry_period: Duration::from_secs(1),
        }),
        ..test_options()
    }
}

async fn running_on(consumer: &Cluster, ns: &str, node: &str) -> usize {
    let pods: Api<Pod> = Api::namespaced(consumer.client.clone(), ns);
    pods.list(&ListParams::default())
        .await
        .map(|l| {
            l.items
                .iter()
                .filter(|p| {
                    p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
                        && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                })
                .count()
        })
        .unwrap_or(0)
}

/// `client` with each request held back by `delay` milliseconds (read per request).
fn slowed(client: kube::Client, delay: Arc<AtomicU64>) -> kube::Client {
    let namespace = client.default_namespace().to_string();
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let (client, delay) = (client.clone(), delay.clone());
        async move {
            tokio::time::sleep(Duration::from_millis(delay.load(Ordering::Relaxed))).await;
            client.send(request).await
        }
    });
    kube::Client::new(service, namespace)
}

/// A loaded API server answers a renewal more slowly than the retry period but within the
/// renew deadline: the leader keeps the Lease (client-go's rule), rather than stopping every
/// reconciler and handing over. An API server that cannot answer within the deadline still
/// makes it stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_renewal_within_the_deadline_keeps_the_lease() {
    let turin = Cluster::start("turin", "eu-south", 1).await;
    let delay = Arc::new(AtomicU64::new(0));
    let mut elector = Elector::new(
        slowed(turin.controller_client.clone(), delay.clone()),
        LeaderElection {
            identity: "slow".into(),
            lease_duration: Duration::from_secs(3),
            renew_deadline: Duration::from_secs(2),
            retry_period: Duration::from_millis(500),
        },
    );
    tokio::time::timeout(Duration::from_secs(30), elector.acquire())
        .await
        .expect("the free Lease is acquired");
    // A renewal is a GET and a PUT: 2 x 450 ms, nearly twice the retry period.
    delay.store(450, Ordering::Relaxed);
    let lease: Api<Lease> = Api::namespaced(turin.client.clone(), names::SYSTEM_NAMESPACE);
    let written = lease.get("tandem-controller").await.unwrap();
    // The holder says which version and protocol it runs (what `tandem install` checks).
    let said = written.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        said.get(names::PEERING_PROTOCOL_ANNOTATION),
        Some(&tandem_core::protocol::VERSION.to_string()),
        "{said:?}"
    );
    assert_eq!(
        said.get(names::CONTROLLER_VERSION_ANNOTATION)
            .map(String::as_str),
        Some(env!("CARGO_PKG_VERSION"))
    );
    let before = written.spec.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_secs(8), elector.keep())
            .await
            .is_err(),
        "the leader gave the Lease up although every renewal succeeded"
    );
    let after = lease.get("tandem-controller").await.unwrap().spec.unwrap();
    assert_eq!(after.holder_identity.as_deref(), Some("slow"));
    assert!(after.renew_time > before.renew_time, "{after:?}");
    // No answer within the deadline: the leader stops.
    delay.store(60_000, Ordering::Relaxed);
    tokio::time::timeout(Duration::from_secs(30), elector.keep())
        .await
        .expect("a leader that cannot renew stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_the_leader_writes_during_a_burst_and_the_follower_takes_over() {
    let mut turin = Cluster::start("turin", "eu-south", 1).await;
    // 5 nodes of 110 pods, half shared: room for 275 pods on the virtual node.
    let bern = Cluster::start("bern", "eu-central", 5).await;
    // turin's controller becomes two replicas electing a leader.
    turin.kill_controller();
    let a = Controller::start(turin.controller_client.clone(), replica("a"))
        .await
        .unwrap();
    until("replica a leads", Duration::from_secs(30), || async {
        a.metrics().started().then_some(())
    })
    .await;
    let b = Controller::start(turin.controller_client.clone(), replica("b"))
        .await
        .unwrap();
    let (a_addr, b_addr) = (a.metrics_addr().unwrap(), b.metrics_addr().unwrap());
    let lease: Api<Lease> = Api::namespaced(turin.client.clone(), names::SYSTEM_NAMESPACE);
    let holder = lease.get("tandem-controller").await.unwrap();
    assert_eq!(
        holder.spec.unwrap().holder_identity.as_deref(),
        Some("a"),
        "the Lease names the leader"
    );
    // The follower is alive but not ready (so a Service sends it no webhook calls).
    assert_eq!(get(b_addr, "/healthz").await.0, 200);
    assert_eq!(get(b_addr, "/readyz").await.0, 503);
    assert_eq!(get(a_addr, "/readyz").await.0, 200);

    peer(&turin, &bern).await;
    offload_remote(&turin, &bern, "shop").await;
    let deployments: Api<Deployment> = Api::namespaced(turin.client.clone(), "shop");
    deployments
        .create(
            &PostParams::default(),
            &serde_json::from_value(offloaded_deployment("web", 200)).unwrap(),
        )
        .await
        .unwrap();
    // Scraped during the burst: some pods offloaded, not more than asked for.
    until("the burst under way", Duration::from_secs(120), || async {
        (running_on(&turin, "shop", "tandem-bern").await >= 20).then_some(())
    })
    .await;
    let (code, during) = get(a_addr, "/metrics").await;
    assert_eq!(code, 200);
    let offloaded = sample(&during, "tandem_offloaded_pods{provider=\"bern\"}").unwrap();
    assert!((1.0..=200.0).contains(&offloaded), "{during}");
    until(
        "200 pods Running on bern",
        Duration::from_secs(180),
        || async { (running_on(&turin, "shop", "tandem-bern").await == 200).then_some(()) },
    )
    .await;
    // The last status write is counted once its answer is back, just after the list above
    // may have seen it.
    let after = until(
        "every reflection counted",
        Duration::from_secs(30),
        || async {
            let after = get(a_addr, "/metrics").await.1;
            (sample(&after, "tandem_reflection_lag_seconds_count").unwrap_or(0.0) >= 200.0)
                .then_some(after)
        },
    )
    .await;
    let value = |name: &str| {
        sample(&after, name).unwrap_or_else(|| panic!("no sample {name} in:\n{after}"))
    };
    assert_eq!(value("tandem_leader"), 1.0);
    assert_eq!(value("tandem_offloaded_pods{provider=\"bern\"}"), 200.0);
    assert_eq!(value("tandem_virtual_node_ready{provider=\"bern\"}"), 1.0);
    assert_eq!(value("tandem_peerings{phase=\"Established\"}"), 1.0);
    // A ShadowPod created on bern for each pod: at least 200 POSTs to it.
    assert!(value("tandem_api_requests_total{cluster=\"bern\",method=\"POST\"}") >= 200.0);
    assert!(value("tandem_api_requests_total{cluster=\"local\",method=\"PATCH\"}") >= 200.0);
    // Every pod went through the webhook.
    assert!(
        value("tandem_webhook_duration_seconds_count") >= 200.0,
        "{after}"
    );
    assert!(value("tandem_reconciles_total{controller=\"peering\"}") >= 1.0);
    assert!(value("tandem_reconciles_total{controller=\"namespaceoffloading\"}") >= 1.0);
    assert!(value("tandem_reconcile_duration_seconds_count{controller=\"peering\"}") >= 1.0);
    for controller in tandem_controller::metrics::CONTROLLERS {
        let errors = format!("tandem_reconcile_errors_total{{controller=\"{controller}\"}}");
        assert!(value(&errors) >= 0.0);
    }

    // Every metric the Grafana dashboard in deploy/ plots is in the scrape.
    let dashboard = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/grafana/tandem.json"),
    )
    .unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&dashboard).unwrap();
    let mut plotted = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if word.starts_with("tandem_") {
                    plotted += 1;
                    assert!(
                        after.lines().any(|l| l.starts_with(word)),
                        "panel {:?} plots {word}, which /metrics lacks",
                        panel["title"]
                    );
                }
            }
        }
    }
    assert!(plotted >= 10);

    // The follower read, but wrote nothing.
    assert_eq!(b.metrics().local_writes(), 0, "the follower wrote");
    assert!(!b.metrics().started());
    let (_, follower) = get(b_addr, "/metrics").await;
    assert_eq!(sample(&follower, "tandem_leader"), Some(0.0), "{follower}");
    assert!(
        b.metrics().requests("local", "GET") > 0,
        "the follower watches the Lease"
    );

    // The leader dies without a word (its pod deleted, its node gone): once the Lease runs
    // out, the follower takes over, and offloading goes on.
    a.shutdown();
    until("replica b leads", Duration::from_secs(30), || async {
        b.metrics().started().then_some(())
    })
    .await;
    let holder = lease.get("tandem-controller").await.unwrap().spec.unwrap();
    assert_eq!(holder.holder_identity.as_deref(), Some("b"));
    assert_eq!(holder.lease_transitions, Some(1));
    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 220}})),
        )
        .await
        .unwrap();
    until(
        "220 pods Running on bern",
        Duration::from_secs(120),
        || async { (running_on(&turin, "shop", "tandem-bern").await == 220).then_some(()) },
    )
    .await;
    assert!(b.metrics().local_writes() > 0);

    // A graceful stop (SIGTERM) gives the Lease up: the next replica takes over without
    // waiting for the Lease to run out — with c's 60 s Lease, d could not otherwise lead
    // within the 20 s waited here.
    let long = |name: &str| {
        let mut options = replica(name);
        if let Some(e) = options.leader_election.as_mut() {
            e.lease_duration = Duration::from_secs(60);
            e.renew_deadline = Duration::from_secs(40);
        }
        options
    };
    let c = Controller::start(turin.controller_client.clone(), long("c"))
        .await
        .unwrap();
    b.stop().await;
    let holder = lease.get("tandem-controller").await.unwrap().spec.unwrap();
    assert_ne!(holder.holder_identity.as_deref(), Some("b"), "{holder:?}");
    until("replica c leads", Duration::from_secs(20), || async {
        c.metrics().started().then_some(())
    })
    .await;
    let d = Controller::start(turin.controller_client.clone(), long("d"))
        .await
        .unwrap();
    c.stop().await;
    until("replica d leads", Duration::from_secs(20), || async {
        d.metrics().started().then_some(())
    })
    .await;
    let holder = lease.get("tandem-controller").await.unwrap().spec.unwrap();
    assert_eq!(holder.holder_identity.as_deref(), Some("d"));
}
