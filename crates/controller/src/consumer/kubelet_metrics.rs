//! `/metrics/resource` of a virtual node: what metrics-server scrapes from every kubelet, here
//! for the pods offloaded through the node, read from the provider's `metrics.k8s.io` API (its
//! metrics-server, or a lab cluster's built-in one) with the peer identity. So `kubectl top
//! pods` and `kubectl top nodes` in the consumer show offloaded pods and the virtual node, on
//! any cluster that runs metrics-server.
//!
//! The provider reports CPU as a rate over a window; a kubelet reports cumulative CPU seconds,
//! from which metrics-server derives the rate between two scrapes. Each container's counter
//! therefore integrates the provider's rate over the time between scrapes: its slope is the
//! provider's rate, which is all metrics-server reads from it. Memory is the working set the
//! provider reports. The node's counters integrate the sum of its pods' (so they never go
//! back when a pod leaves). Every counter starts at [`START_SECONDS`], not zero: metrics-server
//! takes a zero counter for a missing one and drops the pod (or node).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use parking_lot::Mutex;
use serde_json::Value;
use tandem_api::NamespaceOffloading;
use tokio::time::Instant;

use crate::consumer::link::ProviderLink;
use crate::context::Ctx;

/// Where a new CPU counter starts (core-seconds): a microsecond, never zero.
const START_SECONDS: f64 = 1e-6;

/// (namespace, pod, container) in the consumer.
type Key = (String, String, String);

/// The counters of one virtual node, shared by its scrapes.
#[derive(Clone, Default)]
pub struct ResourceMetrics(Arc<Mutex<Counters>>);

#[derive(Default)]
struct Counters {
    /// CPU seconds so far and when they were last advanced, per container.
    containers: HashMap<Key, (f64, Instant)>,
    /// The node's CPU seconds and when last advanced.
    node: Option<(f64, Instant)>,
}

/// One container's usage as the provider reports it.
#[derive(Debug, PartialEq)]
struct Usage {
    cores: f64,
    memory_bytes: f64,
}

impl ResourceMetrics {
    /// The text a kubelet's `/metrics/resource` serves, for the pods on `link`'s virtual node.
    pub async fn render(&self, ctx: &Ctx, link: &ProviderLink) -> String {
        let (usage, failed) = match usages(ctx, link).await {
            Ok(u) => (u, false),
            Err(e) => {
                tracing::warn!(node = %link.virtual_node, error = %e, "virtual kubelet: resource metrics");
                (Vec::new(), true)
            }
        };
        let now = Instant::now();
        let stamp = k8s_openapi::jiff::Timestamp::now().as_millisecond();
        let mut counters = self.0.lock();
        let mut containers = Vec::new();
        let mut node_rate = 0.0;
        let mut node_memory = 0.0;
        for (key, started, u) in usage {
            let entry = counters
                .containers
                .entry(key.clone())
                .or_insert((START_SECONDS, now));
            entry.0 += u.cores * now.duration_since(entry.1).as_secs_f64();
            entry.1 = now;
            node_rate += u.cores;
            node_memory += u.memory_bytes;
            containers.push((key, started, entry.0, u.memory_bytes));
        }
        // Containers no longer reported are forgotten (a pod back later starts from zero, as
        // a restarted container's counter does; its start time tells metrics-server).
        let seen: std::collections::HashSet<&Key> = containers.iter().map(|c| &c.0).collect();
        counters.containers.retain(|k, _| seen.contains(k));
        let node = counters.node.get_or_insert((START_SECONDS, now));
        node.0 += node_rate * now.duration_since(node.1).as_secs_f64();
        node.1 = now;
        let node_cpu = node.0;
        drop(counters);
        exposition(&containers, node_cpu, node_memory, failed, stamp)
    }
}

/// The kubelet's resource metrics text (`resource_metrics.go`): containers, pods, the node.
fn exposition(
    containers: &[(Key, Option<f64>, f64, f64)],
    node_cpu: f64,
    node_memory: f64,
    failed: bool,
    stamp: i64,
) -> String {
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, samples: Vec<(String, f64)>| {
        let _ = writeln!(out, "# HELP {name} [STABLE] {help}\n# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(out, "{name}{labels} {value} {stamp}");
        }
    };
    let labels = |(ns, pod, container): &Key| {
        format!(
            "{{container=\"{}\",namespace=\"{}\",pod=\"{}\"}}",
            escape(container),
            escape(ns),
            escape(pod)
        )
    };
    let pod_labels =
        |ns: &str, pod: &str| format!("{{namespace=\"{}\",pod=\"{}\"}}", escape(ns), escape(pod));
    let mut pods: BTreeMap<(String, String), (f64, f64)> = BTreeMap::new();
    for ((ns, pod, _), _, cpu, memory) in containers {
        let p = pods.entry((ns.clone(), pod.clone())).or_default();
        p.0 += cpu;
        p.1 += memory;
    }
    family(
        "container_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the container in core-seconds",
        containers
            .iter()
            .map(|(k, _, cpu, _)| (labels(k), *cpu))
            .collect(),
    );
    family(
        "container_memory_working_set_bytes",
        "gauge",
        "Current working set of the container in bytes",
        containers
            .iter()
            .map(|(k, _, _, m)| (labels(k), *m))
            .collect(),
    );
    family(
        "container_start_time_seconds",
        "gauge",
        "Start time of the container since unix epoch in seconds",
        containers
            .iter()
            .filter_map(|(k, started, _, _)| Some((labels(k), (*started)?)))
            .collect(),
    );
    family(
        "node_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the node in core-seconds",
        vec![(String::new(), node_cpu)],
    );
    family(
        "node_memory_working_set_bytes",
        "gauge",
        "Current working set of the node in bytes",
        vec![(String::new(), node_memory)],
    );
    family(
        "pod_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the pod in core-seconds",
        pods.iter()
            .map(|((ns, pod), (cpu, _))| (pod_labels(ns, pod), *cpu))
            .collect(),
    );
    family(
        "pod_memory_working_set_bytes",
        "gauge",
        "Current working set of the pod in bytes",
        pods.iter()
            .map(|((ns, pod), (_, m))| (pod_labels(ns, pod), *m))
            .collect(),
    );
    let _ = writeln!(
        out,
        "# HELP scrape_error [ALPHA] 1 if there was an error while getting container metrics, 0 otherwise\n# TYPE scrape_error gauge\nscrape_error {}",
        u8::from(failed)
    );
    out
}

/// A label value as the exposition format quotes it.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The usage of each container of the pods bound to the virtual node, with the container's
/// start time (seconds since the epoch) as the consumer's pod shows it.
async fn usages(
    ctx: &Ctx,
    link: &ProviderLink,
) -> Result<Vec<(Key, Option<f64>, Usage)>, kube::Error> {
    let pods = Api::<Pod>::all(ctx.client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={}", link.virtual_node)))
        .await?;
    if pods.items.is_empty() {
        return Ok(Vec::new());
    }
    let offloadings = Api::<NamespaceOffloading>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await?;
    let twins: HashMap<String, String> = offloadings
        .items
        .iter()
        .filter_map(|nso| {
            Some((
                nso.metadata.namespace.clone()?,
                tandem_api::offloading::twin_of(nso, &link.provider_id)?,
            ))
        })
        .collect();
    // One request per twin namespace that has pods here.
    let mut by_twin: BTreeMap<&str, Vec<&Pod>> = BTreeMap::new();
    for pod in &pods.items {
        if let Some(twin) = pod.metadata.namespace.as_ref().and_then(|ns| twins.get(ns)) {
            by_twin.entry(twin.as_str()).or_default().push(pod);
        }
    }
    let mut out = Vec::new();
    for (twin, pods) in by_twin {
        let request = http::Request::get(format!(
            "/apis/metrics.k8s.io/v1beta1/namespaces/{twin}/pods"
        ))
        .body(Vec::new())
        .expect("valid request");
        let list: Value = link.client.request(request).await?;
        let reported = pod_usages(&list);
        for pod in pods {
            let (Some(ns), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name) else {
                continue;
            };
            let Some(containers) = reported.get(name.as_str()) else {
                continue;
            };
            for (container, usage) in containers {
                let started = started_at(pod, container);
                out.push((
                    (ns.clone(), name.clone(), container.clone()),
                    started,
                    Usage { ..*usage },
                ));
            }
        }
    }
    Ok(out)
}

/// Pod name → container name → usage, from a PodMetricsList.
fn pod_usages(list: &Value) -> HashMap<&str, Vec<(String, Usage)>> {
    let quantity = |v: &Value, scale: i32| {
        v.as_str()
            .and_then(|s| tandem_apimachinery::quantity::Quantity::parse(s).ok())
            .map(|q| q.scaled(scale) as f64)
    };
    let mut out: HashMap<&str, Vec<(String, Usage)>> = HashMap::new();
    for item in list["items"].as_array().into_iter().flatten() {
        let Some(pod) = item["metadata"]["name"].as_str() else {
            continue;
        };
        for c in item["containers"].as_array().into_iter().flatten() {
            let (Some(name), Some(nanocores), Some(bytes)) = (
                c["name"].as_str(),
                quantity(&c["usage"]["cpu"], 9),
                quantity(&c["usage"]["memory"], 0),
            ) else {
                continue;
            };
            out.entry(pod).or_default().push((
                name.to_string(),
                Usage {
                    cores: nanocores / 1e9,
                    memory_bytes: bytes,
                },
            ));
        }
    }
    out
}

/// When the consumer's pod says `container` started (seconds since the epoch).
fn started_at(pod: &Pod, container: &str) -> Option<f64> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    let status = statuses.iter().find(|s| s.name == container)?;
    let started = status
        .state
        .as_ref()?
        .running
        .as_ref()?
        .started_at
        .as_ref()?;
    Some(started.0.as_millisecond() as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_pod_metrics_as_metrics_server_serves_them() {
        let list = json!({"kind": "PodMetricsList", "items": [
            {"metadata": {"name": "web"}, "containers": [
                {"name": "app", "usage": {"cpu": "250m", "memory": "64Mi"}},
                {"name": "side", "usage": {"cpu": "1500000n", "memory": "1024Ki"}}]},
            {"metadata": {"name": "broken"}, "containers": [
                {"name": "x", "usage": {"cpu": "lots"}}]}]});
        let usages = pod_usages(&list);
        assert_eq!(
            usages["web"],
            vec![
                (
                    "app".to_string(),
                    Usage {
                        cores: 0.25,
                        memory_bytes: 64.0 * 1024.0 * 1024.0
                    }
                ),
                (
                    "side".to_string(),
                    Usage {
                        cores: 0.0015,
                        memory_bytes: 1024.0 * 1024.0
                    }
                ),
            ]
        );
        assert!(
            !usages.contains_key("broken"),
            "unparsable usage is left out"
        );
    }

    #[test]
    fn exposition_has_kubelets_families_and_sums_pods() {
        let key = |c: &str| ("demo".to_string(), "web".to_string(), c.to_string());
        let text = exposition(
            &[
                (key("app"), Some(1700000000.0), 2.5, 1000.0),
                (key("side"), None, 0.5, 24.0),
            ],
            3.0,
            1024.0,
            false,
            1700000001000,
        );
        for line in [
            "container_cpu_usage_seconds_total{container=\"app\",namespace=\"demo\",pod=\"web\"} 2.5 1700000001000",
            "container_memory_working_set_bytes{container=\"side\",namespace=\"demo\",pod=\"web\"} 24 1700000001000",
            "container_start_time_seconds{container=\"app\",namespace=\"demo\",pod=\"web\"} 1700000000 1700000001000",
            "pod_cpu_usage_seconds_total{namespace=\"demo\",pod=\"web\"} 3 1700000001000",
            "pod_memory_working_set_bytes{namespace=\"demo\",pod=\"web\"} 1024 1700000001000",
            "node_cpu_usage_seconds_total 3 1700000001000",
            "node_memory_working_set_bytes 1024 1700000001000",
            "# TYPE container_cpu_usage_seconds_total counter",
            "scrape_error 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        assert!(
            !text.contains("container_start_time_seconds{container=\"side\""),
            "no start time is no sample"
        );
    }
}
