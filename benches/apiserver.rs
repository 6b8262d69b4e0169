//! API server benchmark: create throughput with concurrent clients, list, watch fan-out,
//! and memory per stored object. Run: `cargo bench -p tandem-benches --bench apiserver`.
//! Sizes can be changed with BENCH_CREATES, BENCH_WATCHERS, BENCH_WATCH_EVENTS, BENCH_OBJECTS.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use tandem_apiserver::{ApiServer, Config};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"bench": "true"}},
        "data": {"payload": "x".repeat(256)},
    }))
    .expect("valid ConfigMap")
}

/// Creates `total` ConfigMaps named `{prefix}-{i}` from `clients.len()` concurrent clients.
async fn create_all(clients: &[kube::Client], prefix: &str, total: usize) -> anyhow::Result<()> {
    let per = total / clients.len();
    let tasks: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(c, client)| {
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
            let prefix = prefix.to_string();
            tokio::spawn(async move {
                for i in 0..per {
                    api.create(
                        &PostParams::default(),
                        &config_map(&format!("{prefix}-{c}-{i}")),
                    )
                    .await?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for t in futures::future::join_all(tasks).await {
        t??;
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
pub async fn main() -> anyhow::Result<()> {
    let creates = env("BENCH_CREATES", 20_000);
    let watchers = env("BENCH_WATCHERS", 100);
    let watch_events = env("BENCH_WATCH_EVENTS", 1_000);
    let objects = env("BENCH_OBJECTS", 100_000);
    println!(
        "tandem-apiserver benchmark ({} cores)",
        std::thread::available_parallelism()?.get()
    );

    let server = ApiServer::start(Config {
        watch_window: 200_000,
        ..Default::default()
    })
    .await?;
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(server.client().await?);
    }

    // 1. Creates from 8 concurrent clients.
    let started = Instant::now();
    create_all(&clients, "c", creates).await?;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "create: {creates} ConfigMaps, 8 clients: {secs:.2} s = {:.0} creates/s",
        creates as f64 / secs
    );

    // 2. Lists of everything.
    let api: Api<ConfigMap> = Api::namespaced(clients[0].clone(), "default");
    let started = Instant::now();
    let rounds = 5;
    let mut listed = 0;
    for _ in 0..rounds {
        listed = api.list(&ListParams::default()).await?.items.len();
    }
    let per_list = started.elapsed().as_secs_f64() / rounds as f64;
    println!(
        "list: {listed} objects in {:.0} ms = {:.0} objects/s (client decoding included)",
        per_list * 1e3,
        listed as f64 / per_list
    );

    // 3. Watch fan-out: `watchers` streams each receive every one of `watch_events` creates.
    let rv = api
        .list(&ListParams::default().limit(1))
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let received = Arc::new(AtomicUsize::new(0));
    let mut streams = Vec::new();
    for w in 0..watchers {
        let client = match clients.get(w) {
            Some(c) => c.clone(),
            None => server.client().await?,
        };
        let api: Api<ConfigMap> = Api::namespaced(client, "default");
        let received = received.clone();
        let rv = rv.clone();
        let stream = api
            .watch(
                &WatchParams::default().labels("bench=true").timeout(290),
                &rv,
            )
            .await?;
        streams.push(tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            let mut mine = 0;
            while mine < watch_events {
                match stream.try_next().await {
                    Ok(Some(WatchEvent::Added(_))) => {
                        mine += 1;
                        received.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(Some(_)) => {}
                    _ => break,
                }
            }
            mine
        }));
    }
    let started = Instant::now();
    create_all(&clients, "w", watch_events).await?;
    let mut delivered = 0;
    for s in streams {
        delivered += s.await?;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "watch fan-out: {watchers} watchers x {watch_events} events = {delivered} delivered in {secs:.2} s = {:.0} events/s",
        delivered as f64 / secs
    );
    assert_eq!(
        delivered,
        watchers * watch_events,
        "every watcher saw every event"
    );
    drop(clients);
    server.shutdown();

    // 4. Memory per stored object, measured on a fresh store in this process.
    let server = ApiServer::start(Config::default()).await?;
    let store = &server.state().store;
    let sample = serde_json::to_vec(&serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "m-000000", "namespace": "default", "uid": "00000000-0000-0000-0000-000000000000",
                     "labels": {"app": "bench", "tier": "x"}, "creationTimestamp": "2026-01-01T00:00:00Z", "resourceVersion": "1000000"},
        "data": {"payload": "x".repeat(700)},
    }))?;
    let before = crate::rss_bytes();
    for i in 0..objects {
        let mut obj = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": format!("m-{i:06}"), "namespace": "default", "uid": format!("{i:08}-0000-0000-0000-000000000000"),
                         "labels": {"app": "bench", "tier": "x"}, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "data": {"payload": "x".repeat(700)},
        });
        store
            .create("/configmaps", "default", &format!("m-{i:06}"), &mut obj)
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    }
    let after = crate::rss_bytes();
    let per_object = (after.saturating_sub(before)) as f64 / objects as f64;
    println!(
        "memory: {objects} objects of {} B JSON: {:.0} B each in RSS = {:.0} B overhead per object",
        sample.len(),
        per_object,
        per_object - sample.len() as f64
    );
    server.shutdown();
    Ok(())
}
