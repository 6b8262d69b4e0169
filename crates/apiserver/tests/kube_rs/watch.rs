//! Item 2: `watcher` and `reflector` converge, also across a cut watch whose
//! resourceVersion fell out of the server's window (the 410 relist path).

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{
    Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams, WatchEvent,
    WatchParams,
};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use parking_lot::Mutex;
use serde_json::json;
use tandem_apiserver::Config;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch as signal;

use super::common::Cluster;

fn labelled(name: &str, set: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([("set".to_string(), set.to_string())])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("v".to_string(), "0".to_string())])),
        ..Default::default()
    }
}

/// name → resourceVersion of what the server holds with `set=<set>`.
async fn live(api: &Api<ConfigMap>, set: &str) -> BTreeMap<String, String> {
    api.list(&ListParams::default().labels(&format!("set={set}")))
        .await
        .expect("list")
        .items
        .iter()
        .map(|o| (o.name_any(), o.resource_version().unwrap_or_default()))
        .collect()
}

fn cached(store: &Store<ConfigMap>) -> BTreeMap<String, String> {
    store
        .state()
        .iter()
        .map(|o| (o.name_any(), o.resource_version().unwrap_or_default()))
        .collect()
}

/// Polls until the reflector's store holds exactly the live objects at their live versions.
async fn converge(api: &Api<ConfigMap>, store: &Store<ConfigMap>, set: &str, what: &str) {
    let mut last = (BTreeMap::new(), BTreeMap::new());
    let ok = tokio::time::timeout(super::common::DEADLINE, async {
        loop {
            let (want, have) = (live(api, set).await, cached(store));
            if want == have {
                return;
            }
            last = (want, have);
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
    })
    .await;
    assert!(
        ok.is_ok(),
        "{what}: store never matched the server\n live:  {:?}\n store: {:?}",
        last.0,
        last.1
    );
}

/// Runs a reflector on `api` (labels `set=<set>`), recording the watcher's errors.
fn spawn_reflector(
    api: Api<ConfigMap>,
    set: &str,
) -> (
    Store<ConfigMap>,
    Arc<Mutex<Vec<String>>>,
    tokio::task::JoinHandle<()>,
) {
    let (reader, writer) = reflector::store();
    let errors = Arc::new(Mutex::new(Vec::new()));
    let seen = errors.clone();
    // No backoff: a failed watch is retried at once, which the cut proxy holds until resumed.
    let stream = reflector::reflector(
        writer,
        watcher(
            api,
            watcher::Config::default().labels(&format!("set={set}")),
        ),
    );
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            if let Err(e) = item {
                let code = match &e {
                    watcher::Error::WatchError(status) => {
                        format!("{}: {}", status.code, status.message)
                    }
                    other => format!("transport: {other}"),
                };
                seen.lock().push(code);
            }
        }
    });
    (reader, errors, task)
}

#[tokio::test]
async fn reflector_converges_on_creates_updates_and_deletes() {
    let cluster = Cluster::start().await;
    let api: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), "default");
    let pp = PostParams::default();
    for i in 0..5 {
        api.create(&pp, &labelled(&format!("cm-{i}"), "a"))
            .await
            .unwrap();
    }
    api.create(&pp, &labelled("other", "b")).await.unwrap();
    let (store, errors, task) = spawn_reflector(api.clone(), "a");
    converge(&api, &store, "a", "initial list").await;
    assert_eq!(store.state().len(), 5, "the label selector excludes set=b");

    api.create(&pp, &labelled("cm-new", "a")).await.unwrap();
    api.delete("cm-0", &DeleteParams::default()).await.unwrap();
    api.patch(
        "cm-1",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"v": "1"}})),
    )
    .await
    .unwrap();
    // Relabelling moves an object out of the selection: the watch reports it deleted.
    api.patch(
        "cm-2",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"set": "b"}}})),
    )
    .await
    .unwrap();
    converge(&api, &store, "a", "after create/delete/update/relabel").await;
    let names: Vec<String> = cached(&store).into_keys().collect();
    assert_eq!(names, vec!["cm-1", "cm-3", "cm-4", "cm-new"]);
    assert_eq!(
        store
            .find(|o| o.name_any() == "cm-1")
            .and_then(|o| o.data.clone())
            .unwrap()["v"],
        "1"
    );
    assert!(
        errors.lock().is_empty(),
        "no watch errors: {:?}",
        errors.lock()
    );
    task.abort();
}

/// A TCP proxy that can cut every connection and hold new ones until resumed.
struct CuttableProxy {
    port: u16,
    open: signal::Sender<bool>,
    cuts: signal::Sender<u64>,
}

impl CuttableProxy {
    async fn start(upstream: std::net::SocketAddr) -> CuttableProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (open, open_rx) = signal::channel(true);
        let (cuts, cuts_rx) = signal::channel(0u64);
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let mut open_rx = open_rx.clone();
                let mut cuts_rx = cuts_rx.clone();
                tokio::spawn(async move {
                    if open_rx.wait_for(|open| *open).await.is_err() {
                        return;
                    }
                    cuts_rx.mark_unchanged();
                    let Ok(mut outbound) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cuts_rx.changed() => {}
                    }
                });
            }
        });
        CuttableProxy { port, open, cuts }
    }

    /// Drops every connection and holds new ones.
    fn cut(&self) {
        self.open.send_replace(false);
        self.cuts.send_modify(|n| *n += 1);
    }

    /// Lets held and new connections through.
    fn resume(&self) {
        self.open.send_replace(true);
    }
}

#[tokio::test]
async fn reflector_recovers_after_its_version_left_the_watch_window() {
    let cluster = Cluster::start_with(Config {
        watch_window: 50,
        ..Default::default()
    })
    .await;
    let api: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), "default");
    let pp = PostParams::default();
    for i in 0..10 {
        api.create(&pp, &labelled(&format!("cm-{i}"), "cut"))
            .await
            .unwrap();
    }

    let proxy = CuttableProxy::start(cluster.server.addr()).await;
    let kubeconfig = cluster.server.admin_kubeconfig().unwrap().replace(
        &cluster.server.url(),
        &format!("https://127.0.0.1:{}", proxy.port),
    );
    let proxied = tandem_apiserver::client_from_kubeconfig(&kubeconfig)
        .await
        .unwrap();
    let (store, errors, task) = spawn_reflector(Api::namespaced(proxied, "default"), "cut");
    converge(&api, &store, "cut", "before the cut").await;

    proxy.cut();
    // While the watcher is disconnected: more than the window's 50 events.
    for i in 0..3 {
        api.delete(&format!("cm-{i}"), &DeleteParams::default())
            .await
            .unwrap();
        api.create(&pp, &labelled(&format!("late-{i}"), "cut"))
            .await
            .unwrap();
    }
    for round in 0..8 {
        for i in 3..10 {
            api.patch(
                &format!("cm-{i}"),
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"v": round.to_string()}})),
            )
            .await
            .unwrap();
        }
    }
    proxy.resume();

    converge(&api, &store, "cut", "after the watch window moved on").await;
    let names: Vec<String> = cached(&store).into_keys().collect();
    assert_eq!(
        names,
        vec![
            "cm-3", "cm-4", "cm-5", "cm-6", "cm-7", "cm-8", "cm-9", "late-0", "late-1", "late-2"
        ]
    );
    let errors = errors.lock().clone();
    assert!(
        errors.iter().any(|e| e.starts_with("410")),
        "the watcher resumed through a 410 Gone and a relist, errors seen: {errors:?}"
    );
    task.abort();
}

#[tokio::test]
async fn watch_from_a_compacted_version_yields_a_410_event() {
    let cluster = Cluster::start_with(Config {
        watch_window: 50,
        ..Default::default()
    })
    .await;
    let api: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), "default");
    let first = api
        .create(&PostParams::default(), &labelled("churn", "x"))
        .await
        .unwrap();
    let old_rv = first.resource_version().unwrap();
    for i in 0..60 {
        api.patch(
            "churn",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"v": i.to_string()}})),
        )
        .await
        .unwrap();
    }
    let stream = api
        .watch(&WatchParams::default().timeout(5), &old_rv)
        .await
        .expect("the watch request itself is accepted; the 410 comes as an event");
    let mut stream = std::pin::pin!(stream);
    let first_event = tokio::time::timeout(super::common::DEADLINE, stream.try_next())
        .await
        .expect("an event before the deadline")
        .expect("a decodable event")
        .expect("the stream is not empty");
    match first_event {
        WatchEvent::Error(status) => {
            assert_eq!(status.code, 410, "{status:?}");
            assert_eq!(status.reason, "Expired", "{status:?}");
        }
        other => panic!("expected a 410 error event, got {other:?}"),
    }

    // A recent version still resumes, with only the changes after it.
    let now = api.get("churn").await.unwrap().resource_version().unwrap();
    let stream = api
        .watch(&WatchParams::default().timeout(5), &now)
        .await
        .unwrap();
    api.patch(
        "churn",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"v": "last"}})),
    )
    .await
    .unwrap();
    let mut stream = std::pin::pin!(stream);
    let event = tokio::time::timeout(super::common::DEADLINE, async {
        loop {
            match stream.try_next().await {
                Ok(Some(WatchEvent::Modified(cm))) => return cm,
                Ok(Some(WatchEvent::Bookmark(_))) => continue,
                other => panic!("expected MODIFIED, got {other:?}"),
            }
        }
    })
    .await
    .expect("a MODIFIED event after the current version");
    assert_eq!(event.data.unwrap()["v"], "last");
}

/// A watch from the resourceVersion of a list taken while the resource was empty must
/// deliver the first object created afterwards (nothing was compacted).
#[tokio::test]
async fn watch_from_the_list_version_of_an_empty_resource_sees_the_first_create() {
    let cluster = Cluster::start().await;
    let api: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), "default");
    let list = api.list(&ListParams::default()).await.unwrap();
    assert!(list.items.is_empty());
    let rv = list
        .metadata
        .resource_version
        .expect("list resourceVersion");
    api.create(&PostParams::default(), &labelled("first", "x"))
        .await
        .unwrap();
    let stream = api
        .watch(&WatchParams::default().timeout(5), &rv)
        .await
        .unwrap();
    let mut stream = std::pin::pin!(stream);
    let event = tokio::time::timeout(super::common::DEADLINE, stream.try_next())
        .await
        .expect("an event before the deadline")
        .expect("a decodable event")
        .expect("the stream is not empty");
    match event {
        WatchEvent::Added(cm) => assert_eq!(cm.name_any(), "first"),
        other => panic!("expected ADDED first, got {other:?}"),
    }
}

/// A burst of writes between the watcher's list and its watch moves the window past the
/// listed version: the watch gets 410, the watcher relists, and the store still converges.
#[tokio::test]
async fn reflector_recovers_from_a_burst_between_list_and_watch() {
    let cluster = Cluster::start_with(Config {
        watch_window: 50,
        ..Default::default()
    })
    .await;
    let api: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), "default");
    let pp = PostParams::default();
    for i in 0..5 {
        api.create(&pp, &labelled(&format!("cm-{i}"), "burst"))
            .await
            .unwrap();
    }
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(
        writer,
        watcher(api.clone(), watcher::Config::default().labels("set=burst")),
    );
    let mut stream = Box::pin(stream);
    // The watcher is a lazy stream: after InitDone it starts watching only when polled again.
    tokio::time::timeout(super::common::DEADLINE, async {
        while let Some(event) = stream.next().await {
            if matches!(event, Ok(watcher::Event::InitDone)) {
                return;
            }
        }
    })
    .await
    .expect("initial list before the deadline");
    assert_eq!(cached(&store).len(), 5);

    for round in 0..12 {
        for i in 0..5 {
            api.patch(
                &format!("cm-{i}"),
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"v": round.to_string()}})),
            )
            .await
            .unwrap();
        }
    }
    api.delete("cm-0", &DeleteParams::default()).await.unwrap();

    let errors = Arc::new(Mutex::new(Vec::new()));
    let seen = errors.clone();
    let task = tokio::spawn(async move {
        while let Some(item) = stream.next().await {
            if let Err(watcher::Error::WatchError(status)) = item {
                seen.lock().push(status.code);
            }
        }
    });
    converge(&api, &store, "burst", "after the burst").await;
    assert_eq!(
        cached(&store).into_keys().collect::<Vec<_>>(),
        vec!["cm-1", "cm-2", "cm-3", "cm-4"]
    );
    assert!(
        errors.lock().contains(&410),
        "the watch from the listed version was refused with 410: {:?}",
        errors.lock()
    );
    task.abort();
}

/// Counts ADDED events on `stream` until `want` have arrived (or the stream ends).
async fn count_added(
    stream: impl futures::Stream<Item = kube::Result<WatchEvent<ConfigMap>>>,
    want: usize,
) -> usize {
    let mut stream = std::pin::pin!(stream);
    let mut seen = 0;
    while seen < want {
        match stream.try_next().await {
            Ok(Some(WatchEvent::Added(_))) => seen += 1,
            Ok(Some(_)) => {}
            _ => break,
        }
    }
    seen
}

#[tokio::test]
async fn a_stalled_watcher_blocks_neither_writers_nor_other_watchers() {
    let cluster = Cluster::start().await;
    let writer: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), "default");
    // Its own connection, so its stall is a TCP-level stall and not shared flow control.
    let stalled_client = cluster.client_for("stalled", &["system:masters"]).await;
    let stalled_api: Api<ConfigMap> = Api::namespaced(stalled_client, "default");
    let params = WatchParams::default().labels("set=big");
    let stalled = stalled_api.watch(&params, "0").await.unwrap();
    let live = writer.watch(&params, "0").await.unwrap();
    const N: usize = 400;
    let live_count = tokio::spawn(count_added(live, N));
    // ~6.5 MB of events: far more than socket buffers hold for a reader that never reads.
    let payload = "x".repeat(16 * 1024);
    let started = std::time::Instant::now();
    for i in 0..N {
        let mut cm = labelled(&format!("big-{i}"), "big");
        cm.data = Some(BTreeMap::from([("p".to_string(), payload.clone())]));
        writer.create(&PostParams::default(), &cm).await.unwrap();
    }
    let write_time = started.elapsed();
    let seen = tokio::time::timeout(super::common::DEADLINE, live_count)
        .await
        .expect("the live watcher is not held up by the stalled one")
        .unwrap();
    assert_eq!(seen, N, "the live watcher saw every create");
    // The stalled watcher, once it reads, still gets every event: nothing was dropped for it.
    let late = tokio::time::timeout(super::common::DEADLINE, count_added(stalled, N))
        .await
        .expect("the stalled watcher drains");
    assert_eq!(late, N, "writes took {write_time:?}");
}
