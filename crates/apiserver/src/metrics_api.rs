//! `metrics.k8s.io/v1beta1`, served as metrics-server serves it (what `kubectl top` and
//! autoscalers read): NodeMetrics (`nodes`, cluster-scoped) and PodMetrics (`pods`,
//! namespaced), get and list, label and field selectors on lists, authorised by RBAC like any
//! resource (`get`/`list` on `nodes.metrics.k8s.io`, `pods.metrics.k8s.io`).
//!
//! The values come from each kubelet's `GET /metrics/resource`, scraped through the API
//! server's kubelet client (its client certificate, the cluster CA for the kubelet's): at the
//! first metrics request, then every resolution (15 s, metrics-server's
//! `--metric-resolution`) in the background. metrics-server scrapes from its start; here a
//! cluster nobody asks for metrics — most test clusters, whose hollow nodes have no kubelet
//! to answer — scrapes nothing. Every node with an InternalIP and a kubelet port is scraped,
//! concurrently, each with a timeout: a node whose kubelet does not answer (a hollow node
//! without an endpoint) is absent, and so are its pods. From the samples read:
//!
//! - `node_cpu_usage_seconds_total` and `node_memory_working_set_bytes`: the node;
//! - `container_cpu_usage_seconds_total`, `container_memory_working_set_bytes` and
//!   `container_start_time_seconds`, labelled `container`, `namespace` and `pod`: its pods;
//!
//! each with its timestamp in ms (the scrape's time when there is none). As in metrics-server,
//! a zero or missing CPU or memory drops the node, or the whole pod; CPU is the rate between
//! the last two samples (`window` apart, `timestamp` the last), memory the last working set;
//! and a node or pod appears once it has two samples.
//!
//! This module scrapes and serves; decoding and the sample window are `resource_metrics`'s.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty, Limited};
use serde_json::{Map, Value, json};

use crate::error::{ApiError, ApiResult};
use crate::registry::{Registry, ResourceInfo};
use crate::request::Call;
use crate::resource_metrics::decode;
use crate::response::{Body, json_response};
use crate::selectors::Selectors;
use crate::state::State;
use crate::store::Doc;

/// The API group.
pub const GROUP: &str = "metrics.k8s.io";
/// Its only version.
pub const VERSION: &str = "v1beta1";

/// The largest `/metrics/resource` body read (a kubelet with 110 pods writes some 100 KiB).
const MAX_BODY: usize = 16 << 20;

/// Adds NodeMetrics and PodMetrics to the served resources (discovery, RBAC).
pub fn register(registry: &mut Registry) {
    for (resource, kind, namespaced) in [
        ("nodes", "NodeMetrics", false),
        ("pods", "PodMetrics", true),
    ] {
        registry.insert(ResourceInfo {
            group: GROUP.into(),
            version: VERSION.into(),
            resource: resource.into(),
            singular: String::new(),
            kind: kind.into(),
            namespaced,
            short_names: Vec::new(),
            categories: Vec::new(),
            subresources: Vec::new(),
            verbs: vec!["get".into(), "list".into()],
            selectable_fields: Vec::new(),
            stored: false,
            keeps_status_on_create: false,
            custom: None,
        });
    }
}

/// From the first metrics request on, scrapes every kubelet each resolution, until the
/// server stops.
pub async fn run(state: Arc<State>) {
    state.metrics.first_request.notified().await;
    let mut resolution = state.metrics.resolution.subscribe();
    loop {
        let every = *resolution.borrow_and_update();
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            // A new resolution takes effect at once.
            _ = resolution.changed() => continue,
        }
        round(&state).await;
    }
}

/// Serves a metrics request.
pub async fn serve(
    state: &Arc<State>,
    call: &Call,
    res: &ResourceInfo,
) -> ApiResult<Response<Body>> {
    if !state.metrics.asked.swap(true, Ordering::SeqCst) {
        round(state).await;
        state.metrics.first_request.notify_one();
    }
    let info = &call.info;
    let source = state
        .registry
        .read()
        .get("", "v1", &res.resource)
        .ok_or_else(ApiError::no_route)?;
    let now = now_ms();
    match info.verb.as_str() {
        "get" => {
            let ns = if res.namespaced {
                info.namespace.as_str()
            } else {
                ""
            };
            let not_found = || ApiError::not_found(GROUP, &res.resource, &info.name);
            let doc = state
                .store
                .get(&source.storage_key(), ns, &info.name)
                .ok_or_else(not_found)?;
            let item = metrics_of(state, res, &doc, now).ok_or_else(not_found)?;
            let mut out = Map::new();
            out.insert("kind".into(), json!(res.kind));
            out.insert("apiVersion".into(), json!(res.api_version()));
            out.extend(item);
            Ok(json_response(200, &Value::Object(out)))
        }
        "list" => {
            let selectors = Selectors::parse(call, &source)?;
            let ns =
                (res.namespaced && !info.namespace.is_empty()).then_some(info.namespace.as_str());
            let key = source.storage_key();
            let (_, docs) = state.store.list(&key, ns, None);
            let items: Vec<Value> = docs
                .iter()
                .filter(|d| selectors.matches(&key, d))
                .filter_map(|d| metrics_of(state, res, d, now).map(Value::Object))
                .collect();
            Ok(json_response(
                200,
                &json!({"kind": format!("{}List", res.kind), "apiVersion": res.api_version(),
                        "metadata": {}, "items": items}),
            ))
        }
        verb => Err(ApiError::method_not_allowed(verb, &res.resource)),
    }
}

/// The NodeMetrics or PodMetrics of the node or pod `doc`, if it has usage (without kind and
/// apiVersion, as list items are written).
fn metrics_of(
    state: &State,
    res: &ResourceInfo,
    doc: &Doc,
    now: i64,
) -> Option<Map<String, Value>> {
    let labels: Map<String, Value> = doc
        .labels
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let mut meta = json!({"name": doc.name, "creationTimestamp": time(now)});
    if res.namespaced {
        meta["namespace"] = json!(doc.namespace);
    }
    if !labels.is_empty() {
        meta["labels"] = Value::Object(labels);
    }
    let window = state.metrics.window.lock();
    let out = if res.namespaced {
        let pod = window.pod(&doc.namespace, &doc.name)?;
        json!({
            "metadata": meta, "timestamp": time(pod.at_ms), "window": go_duration(pod.window_ms),
            "containers": pod.containers.iter().map(|(name, u)| json!({
                "name": name,
                "usage": {"cpu": cpu_quantity(u.nanocores), "memory": memory_quantity(u.memory)},
            })).collect::<Vec<_>>(),
        })
    } else {
        let node = window.node(&doc.name)?;
        json!({
            "metadata": meta, "timestamp": time(node.at_ms), "window": go_duration(node.window_ms),
            "usage": {"cpu": cpu_quantity(node.nanocores), "memory": memory_quantity(node.memory)},
        })
    };
    match out {
        Value::Object(map) => Some(map),
        _ => None,
    }
}

/// One round of scrapes, stored as one.
async fn round(state: &State) {
    let _round = state.metrics.round.lock().await;
    // metrics-server gives a scrape 90% of the resolution.
    let timeout = state
        .metrics
        .resolution
        .borrow()
        .mul_f64(0.9)
        .min(Duration::from_secs(10));
    let scrapes = scrapable_nodes(state).into_iter().map(|node| async move {
        match tokio::time::timeout(timeout, scrape(state, &node)).await {
            Ok(Ok(batch)) => Some((node, batch)),
            Ok(Err(e)) => {
                tracing::debug!(%node, "scraping the kubelet's resource metrics: {}", e.message);
                None
            }
            Err(_) => {
                tracing::debug!(%node, "scraping the kubelet's resource metrics: timed out after {timeout:?}");
                None
            }
        }
    });
    let round = futures::future::join_all(scrapes).await;
    state
        .metrics
        .window
        .lock()
        .store(round.into_iter().flatten().collect());
}

/// Nodes with an InternalIP and a kubelet port.
fn scrapable_nodes(state: &State) -> Vec<String> {
    let Some(nodes) = state.registry.read().get("", "v1", "nodes") else {
        return Vec::new();
    };
    let (_, docs) = state.store.list(&nodes.storage_key(), None, None);
    docs.iter()
        .filter(|d| {
            let node = d.value();
            let status = &node["status"];
            let has_ip = status["addresses"]
                .as_array()
                .is_some_and(|a| a.iter().any(|a| a["type"] == "InternalIP"));
            let port = status["daemonEndpoints"]["kubeletEndpoint"]["Port"]
                .as_u64()
                .unwrap_or(0);
            has_ip && port > 0
        })
        .map(|d| d.name.to_string())
        .collect()
}

/// Reads and decodes `node`'s `/metrics/resource`.
async fn scrape(state: &State, node: &str) -> ApiResult<decode::Batch> {
    let (ip, port) = crate::kubelet_proxy::kubelet_address(state, node)?;
    let addr = SocketAddr::new(ip, port);
    let failed =
        |e: String| ApiError::internal(format!("talking to the kubelet of node {node}: {e}"));
    let stream = crate::kubelet_proxy::connect(state, addr, node).await?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| failed(e.to_string()))?;
    tokio::spawn(conn);
    let request = Request::get("/metrics/resource")
        .header(http::header::HOST, addr.to_string())
        .body(Empty::<Bytes>::new())
        .map_err(|e| failed(e.to_string()))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| failed(e.to_string()))?;
    let status = response.status();
    let body = Limited::new(response.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| failed(e.to_string()))?
        .to_bytes();
    let text = String::from_utf8_lossy(&body);
    if !status.is_success() {
        return Err(ApiError::from_kubelet(
            status.as_u16(),
            text.trim().to_string(),
        ));
    }
    decode::decode(&text, now_ms()).map_err(|e| failed(crate::error::with_causes(&e)))
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// A metav1.Time: RFC 3339 in whole seconds.
fn time(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// A metav1.Duration as Go writes a `time.Duration` (`15.012s`, `1m0s`, `500ms`).
fn go_duration(ms: i64) -> String {
    if ms == 0 {
        return "0s".into();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (h, m, s, frac) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
    let mut seconds = s.to_string();
    if frac > 0 {
        seconds.push_str(format!(".{frac:03}").trim_end_matches('0'));
    }
    match (h, m) {
        (0, 0) => format!("{seconds}s"),
        (0, m) => format!("{m}m{seconds}s"),
        (h, m) => format!("{h}h{m}m{seconds}s"),
    }
}

const DECIMAL_SUFFIXES: [&str; 10] = ["n", "u", "m", "", "k", "M", "G", "T", "P", "E"];

/// `value · 10^(3·(index − 3))` in the canonical form of a decimal-SI quantity: the largest
/// suffix that keeps the number whole.
fn decimal_quantity(mut value: u64, mut index: usize) -> String {
    if value == 0 {
        return "0".into();
    }
    while value.is_multiple_of(1000) && index + 1 < DECIMAL_SUFFIXES.len() {
        value /= 1000;
        index += 1;
    }
    format!("{value}{}", DECIMAL_SUFFIXES[index])
}

/// CPU in billionths of a core, as metrics-server writes it (`12345n`, `250m`, `0`).
fn cpu_quantity(nanocores: u64) -> String {
    decimal_quantity(nanocores, 0)
}

/// Bytes as a binary-SI quantity in canonical form (`1234Ki`, `2Mi`, `1234567`); below 1 KiB
/// kube writes decimal SI.
fn memory_quantity(bytes: u64) -> String {
    const SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if bytes < 1024 {
        return decimal_quantity(bytes, 3);
    }
    let (mut value, mut index) = (bytes, 0);
    while value.is_multiple_of(1024) && index + 1 < SUFFIXES.len() {
        value /= 1024;
        index += 1;
    }
    format!("{value}{}", SUFFIXES[index])
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_apimachinery::quantity::Quantity;

    #[test]
    fn quantities_are_written_in_kubes_canonical_form() {
        let cpu = [
            (0, "0"),
            (12_345, "12345n"),
            (1_500_000, "1500u"),
            (12_000_000, "12m"),
            (250_000_000, "250m"),
            (1_000_000_000, "1"),
            (2_000_000_000_000, "2k"),
        ];
        for (n, want) in cpu {
            assert_eq!(cpu_quantity(n), want);
            assert_eq!(Quantity::parse(want).unwrap().scaled(9), i128::from(n));
        }
        let memory = [
            (0, "0"),
            (512, "512"),
            (1000, "1k"),
            (1_263_616, "1234Ki"),
            (2_097_152, "2Mi"),
            (1_234_567, "1234567"),
            (3 << 30, "3Gi"),
        ];
        for (b, want) in memory {
            assert_eq!(memory_quantity(b), want);
            assert_eq!(Quantity::parse(want).unwrap().value(), i128::from(b));
        }
    }

    #[test]
    fn windows_are_written_as_go_durations() {
        let cases = [
            (0, "0s"),
            (500, "500ms"),
            (1_000, "1s"),
            (15_012, "15.012s"),
            (20_500, "20.5s"),
            (60_000, "1m0s"),
            (75_250, "1m15.25s"),
            (3_600_000, "1h0m0s"),
        ];
        for (ms, want) in cases {
            assert_eq!(go_duration(ms), want);
        }
        assert_eq!(time(1_700_000_000_999), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn serves_nodes_and_pods_as_namespaced_get_and_list_only() {
        let mut registry = Registry::builtin();
        register(&mut registry);
        let nodes = registry.get(GROUP, VERSION, "nodes").unwrap();
        let pods = registry.get(GROUP, VERSION, "pods").unwrap();
        assert_eq!(
            (nodes.kind.as_str(), nodes.namespaced),
            ("NodeMetrics", false)
        );
        assert_eq!((pods.kind.as_str(), pods.namespaced), ("PodMetrics", true));
        assert_eq!(pods.verbs, vec!["get", "list"]);
        assert!(!pods.stored && registry.stored_resources().iter().all(|r| r.group != GROUP));
    }
}
