//! Watch: a chunked stream of `{"type": …, "object": …}` lines per change, with kube's
//! resourceVersion semantics, bookmarks, timeouts and 410 for versions no longer retained.
//!
//! Each watch runs as its own task reading the store's event log from its own cursor, so a
//! slow client only delays itself; if it falls behind the retained window it gets the same
//! "too old resource version" error a real API server sends, and relists.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde_json::json;
use tokio::sync::mpsc;

use crate::error::{ApiError, ApiResult};
use crate::registry::ResourceInfo;
use crate::request::{Call, Query, is_true};
use crate::response::{Body, for_version};
use crate::selectors::Selectors;
use crate::state::State;
use crate::store::{Doc, EventType, StoreError};

/// How often an idle watch that asked for bookmarks gets one.
const BOOKMARK_EVERY: Duration = Duration::from_secs(15);

struct WatchSpec {
    key: String,
    namespace: String,
    name: String,
    selectors: Selectors,
    table: bool,
    query: Query,
    bookmarks: bool,
}

/// Starts a watch and returns the streaming response.
pub fn watch(state: Arc<State>, call: &Call, res: Arc<ResourceInfo>) -> ApiResult<Response<Body>> {
    let selectors = Selectors::parse(call, &res)?;
    let rv_param = call
        .query
        .get("resourceVersion")
        .map(String::as_str)
        .unwrap_or("");
    let start: Option<u64> = match rv_param {
        "" | "0" => None,
        v => Some(v.parse().map_err(|_| {
            ApiError::bad_request(format!(
                "resourceVersion: Invalid value: {v:?}: must be a number"
            ))
        })?),
    };
    let send_initial = match call.query.get("sendInitialEvents") {
        Some(v) => v == "true",
        None => start.is_none(),
    };
    let timeout = call
        .query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(1800));
    let spec = WatchSpec {
        key: res.storage_key(),
        namespace: if res.namespaced {
            call.info.namespace.clone()
        } else {
            String::new()
        },
        name: call.info.name.clone(),
        selectors,
        table: call
            .headers
            .get(http::header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|a| a.contains("as=Table")),
        query: call.query.clone(),
        bookmarks: is_true(call.query.get("allowWatchBookmarks")),
    };
    let explicit_initial = call.query.contains_key("sendInitialEvents");
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(256);
    tokio::spawn(async move {
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        tokio::select! {
            _ = run(&state, &res, &spec, start, send_initial, explicit_initial, &tx) => {}
            _ = &mut deadline => {}
            _ = tx.closed() => {}
        }
    });
    let stream = tokio_stream_from(rx);
    Ok(Response::builder()
        .status(200)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::CACHE_CONTROL, "no-cache, private")
        .body(BodyExt::boxed(StreamBody::new(stream)))
        .expect("valid response"))
}

fn tokio_stream_from(
    mut rx: mpsc::Receiver<Result<Frame<Bytes>, std::io::Error>>,
) -> impl futures::Stream<Item = Result<Frame<Bytes>, std::io::Error>> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

type Tx = mpsc::Sender<Result<Frame<Bytes>, std::io::Error>>;

async fn send_line(tx: &Tx, kind: &str, object: &[u8]) -> bool {
    let mut line = Vec::with_capacity(object.len() + 32);
    line.extend_from_slice(b"{\"type\":\"");
    line.extend_from_slice(kind.as_bytes());
    line.extend_from_slice(b"\",\"object\":");
    line.extend_from_slice(object);
    line.extend_from_slice(b"}\n");
    tx.send(Ok(Frame::data(Bytes::from(line)))).await.is_ok()
}

async fn send_doc(
    tx: &Tx,
    res: &ResourceInfo,
    spec: &WatchSpec,
    kind: &str,
    doc: &Arc<Doc>,
) -> bool {
    if spec.table {
        let table = crate::table::render(res, std::slice::from_ref(doc), &spec.query, doc.rv, None);
        send_line(tx, kind, &serde_json::to_vec(&table).expect("serializes")).await
    } else {
        send_line(tx, kind, &for_version(res, doc)).await
    }
}

fn bookmark(res: &ResourceInfo, rv: u64, initial_end: bool) -> Vec<u8> {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    serde_json::to_vec(
        &json!({"kind": res.kind, "apiVersion": res.api_version(), "metadata": meta}),
    )
    .expect("serializes")
}

fn in_scope(spec: &WatchSpec, doc: &Doc) -> bool {
    (spec.namespace.is_empty() || *doc.namespace == *spec.namespace)
        && (spec.name.is_empty() || *doc.name == *spec.name)
}

async fn run(
    state: &State,
    res: &ResourceInfo,
    spec: &WatchSpec,
    start: Option<u64>,
    send_initial: bool,
    explicit_initial: bool,
    tx: &Tx,
) {
    let mut changes = state.store.subscribe(&spec.key);
    let mut cursor = match start {
        Some(rv) => rv,
        None => {
            let ns = (!spec.namespace.is_empty()).then_some(spec.namespace.as_str());
            let (rv, docs) = state.store.list(&spec.key, ns, None);
            if send_initial {
                for doc in docs
                    .iter()
                    .filter(|d| in_scope(spec, d) && spec.selectors.matches(&spec.key, d))
                {
                    if !send_doc(tx, res, spec, "ADDED", doc).await {
                        return;
                    }
                }
            }
            if explicit_initial
                && send_initial
                && !send_line(tx, "BOOKMARK", &bookmark(res, rv, true)).await
            {
                return;
            }
            rv
        }
    };
    let mut ticker = tokio::time::interval(BOOKMARK_EVERY);
    ticker.tick().await;
    let mut bookmark_due = false;
    loop {
        // Read before the log: every event of this resource up to here is in `events`.
        let snapshot_rv = state.store.current_rv();
        let events = match state.store.events_since(&spec.key, cursor) {
            Ok(events) => events,
            Err(StoreError::TooOld { oldest }) => {
                let status =
                    ApiError::gone(format!("too old resource version: {cursor} ({oldest})"))
                        .to_status();
                let _ = send_line(
                    tx,
                    "ERROR",
                    &serde_json::to_vec(&status).expect("serializes"),
                )
                .await;
                return;
            }
            Err(_) => return,
        };
        for event in events {
            cursor = event.doc.rv;
            if !in_scope(spec, &event.doc) {
                continue;
            }
            let now = spec.selectors.matches(&spec.key, &event.doc);
            let before = event
                .prev
                .as_ref()
                .is_some_and(|p| spec.selectors.matches(&spec.key, p));
            let kind = match (event.kind, before, now) {
                (EventType::Added, _, true) => "ADDED",
                (EventType::Modified, true, true) => "MODIFIED",
                (EventType::Modified, false, true) => "ADDED",
                (EventType::Modified, true, false) => "DELETED",
                (EventType::Deleted, true, _) => "DELETED",
                _ => continue,
            };
            if !send_doc(tx, res, spec, kind, &event.doc).await {
                return;
            }
        }
        if bookmark_due {
            bookmark_due = false;
            cursor = cursor.max(snapshot_rv);
            if !send_line(tx, "BOOKMARK", &bookmark(res, cursor, false)).await {
                return;
            }
        }
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            _ = ticker.tick(), if spec.bookmarks => bookmark_due = true,
        }
    }
}
