//! The kubelet's resource metrics in network mode: `GET /metrics/resource` on each node's
//! endpoint, in the Prometheus text format kubelet writes there (its `resource_metrics.go`
//! collector), which the API server scrapes for `metrics.k8s.io` as metrics-server does.
//!
//! Families, each sample stamped with the time it was read (ms since the epoch), as kubelet
//! stamps them; a family with no sample is left out, as Prometheus' gatherer leaves it out:
//!
//! - `container_cpu_usage_seconds_total{container,namespace,pod}` (counter, core-seconds),
//!   `container_memory_working_set_bytes{container,namespace,pod}` (gauge, bytes),
//!   `container_start_time_seconds{container,namespace,pod}` (gauge, seconds since the epoch,
//!   no sample time);
//! - `pod_cpu_usage_seconds_total{namespace,pod}`, `pod_memory_working_set_bytes{namespace,pod}`:
//!   the sums of the pod's containers;
//! - `node_cpu_usage_seconds_total`, `node_memory_working_set_bytes`;
//! - `resource_scrape_error` and `scrape_error`: 0, or 1 when the lab's own usage could not be
//!   read (the node's families are then left out, as kubelet leaves out what it cannot read).
//!
//! What a lab container and node use is read by [`super::usage`].

use std::convert::Infallible;

use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use std::fmt::Write as _;

use super::cluster_network::ClusterNetwork;
pub use super::usage::{BUILTIN_CPU_SECONDS, BUILTIN_WORKING_SET, ContainerUsage, PodUsage};
use super::usage::{clock_ticks, process_usage};

/// One container's sample.
#[derive(Clone, Debug, PartialEq)]
pub struct ContainerSample {
    /// Container name.
    pub name: String,
    /// Cumulative CPU, core-seconds.
    pub cpu_seconds: f64,
    /// Working set, bytes.
    pub memory_bytes: u64,
    /// When the container (its current process) started, seconds since the epoch.
    pub start_seconds: f64,
}

/// One pod's samples.
#[derive(Clone, Debug, PartialEq)]
pub struct PodSample {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Containers with a sample.
    pub containers: Vec<ContainerSample>,
}

/// What a node's endpoint reports at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeSample {
    /// When it was read, ms since the epoch.
    pub at_ms: i64,
    /// The node's cumulative CPU (core-seconds) and working set (bytes), if read.
    pub node: Option<(f64, u64)>,
    /// Pods with at least one container sample.
    pub pods: Vec<PodSample>,
}

/// Renders `sample` as kubelet's `/metrics/resource` does (families sorted by name).
pub fn render(sample: &NodeSample) -> String {
    let at = sample.at_ms;
    let mut out = String::new();
    let mut family = |name: &str, help: &str, kind: &str, lines: Vec<String>| {
        if lines.is_empty() {
            return;
        }
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for line in lines {
            let _ = writeln!(out, "{name}{line}");
        }
    };
    let containers = || {
        sample.pods.iter().flat_map(|p| {
            p.containers.iter().map(move |c| {
                let labels = format!(
                    "{{container=\"{}\",namespace=\"{}\",pod=\"{}\"}}",
                    escape(&c.name),
                    escape(&p.namespace),
                    escape(&p.name)
                );
                (labels, c)
            })
        })
    };
    let pods = || {
        sample.pods.iter().map(|p| {
            let labels = format!(
                "{{namespace=\"{}\",pod=\"{}\"}}",
                escape(&p.namespace),
                escape(&p.name)
            );
            (labels, p)
        })
    };
    family(
        "container_cpu_usage_seconds_total",
        "[STABLE] Cumulative cpu time consumed by the container in core-seconds",
        "counter",
        containers()
            .map(|(l, c)| format!("{l} {} {at}", c.cpu_seconds))
            .collect(),
    );
    family(
        "container_memory_working_set_bytes",
        "[STABLE] Current working set of the container in bytes",
        "gauge",
        containers()
            .map(|(l, c)| format!("{l} {} {at}", c.memory_bytes))
            .collect(),
    );
    family(
        "container_start_time_seconds",
        "[STABLE] Start time of the container since unix epoch in seconds",
        "gauge",
        containers()
            .map(|(l, c)| format!("{l} {}", c.start_seconds))
            .collect(),
    );
    let node = sample.node.iter();
    family(
        "node_cpu_usage_seconds_total",
        "[STABLE] Cumulative cpu time consumed by the node in core-seconds",
        "counter",
        node.clone()
            .map(|(cpu, _)| format!(" {cpu} {at}"))
            .collect(),
    );
    family(
        "node_memory_working_set_bytes",
        "[STABLE] Current working set of the node in bytes",
        "gauge",
        node.map(|(_, memory)| format!(" {memory} {at}")).collect(),
    );
    family(
        "pod_cpu_usage_seconds_total",
        "[STABLE] Cumulative cpu time consumed by the pod in core-seconds",
        "counter",
        pods()
            .map(|(l, p)| {
                let cpu: f64 = p.containers.iter().map(|c| c.cpu_seconds).sum();
                format!("{l} {cpu} {at}")
            })
            .collect(),
    );
    family(
        "pod_memory_working_set_bytes",
        "[STABLE] Current working set of the pod in bytes",
        "gauge",
        pods()
            .map(|(l, p)| {
                let memory: u64 = p.containers.iter().map(|c| c.memory_bytes).sum();
                format!("{l} {memory} {at}")
            })
            .collect(),
    );
    let error = if sample.node.is_some() { 0 } else { 1 };
    family(
        "resource_scrape_error",
        "[STABLE] 1 if there was an error while getting container metrics, 0 otherwise",
        "gauge",
        vec![format!(" {error}")],
    );
    family(
        "scrape_error",
        "[ALPHA] 1 if there was an error while getting container metrics, 0 otherwise",
        "gauge",
        vec![format!(" {error}")],
    );
    out
}

/// A label value as the text format quotes it.
fn escape(value: &str) -> String {
    value
        .replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

/// Reads what `node`'s pods and its share of the lab process use now.
pub fn sample(network: &ClusterNetwork, node: &str) -> NodeSample {
    let ticks = clock_ticks();
    let nodes = network.net.node_namespaces().len().max(1);
    let mut pods = Vec::new();
    let (mut cpu, mut memory) = (0.0, 0u64);
    {
        let running = network.pods.lock();
        for pod in running.values().filter(|p| p.usage.node == node) {
            let containers: Vec<ContainerSample> = pod
                .usage
                .containers
                .iter()
                .filter_map(|(name, usage)| {
                    let (cpu_seconds, memory_bytes, start_seconds) = usage.read(ticks)?;
                    // Built-in programs are already in the lab process's share.
                    if usage.is_process() {
                        cpu += cpu_seconds;
                        memory += memory_bytes;
                    }
                    Some(ContainerSample {
                        name: name.clone(),
                        cpu_seconds,
                        memory_bytes,
                        start_seconds,
                    })
                })
                .collect();
            if containers.is_empty() {
                continue;
            }
            pods.push(PodSample {
                namespace: pod.identity.namespace.clone(),
                name: pod.identity.pod.clone(),
                containers,
            });
        }
    }
    pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let node = process_usage("self", ticks).map(|(lab_cpu, lab_memory)| {
        (
            lab_cpu / nodes as f64 + cpu,
            lab_memory / nodes as u64 + memory,
        )
    });
    NodeSample {
        at_ms: k8s_openapi::jiff::Timestamp::now().as_millisecond(),
        node,
        pods,
    }
}

/// Answers `GET /metrics/resource` for the node whose address the request was sent to (its
/// `Host`: each node's endpoint listens on that node's InternalIP only).
pub fn resource(
    network: &ClusterNetwork,
    headers: &HeaderMap,
) -> Response<http_body_util::combinators::BoxBody<Bytes, Infallible>> {
    let host = headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    let ip = host
        .parse::<std::net::SocketAddr>()
        .map(|a| a.ip())
        .or_else(|_| host.parse::<std::net::IpAddr>())
        .ok();
    let node = network
        .net
        .node_namespaces()
        .into_iter()
        .find(|(n, _)| ip == Some(std::net::IpAddr::V4(n.ip)))
        .map(|(n, _)| n.name);
    let (status, content_type, body) = match node {
        Some(node) => (
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            render(&sample(network, &node)),
        ),
        None => (
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            format!("no node of this cluster has the address {host:?}"),
        ),
    };
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, content_type)
        .body(Full::new(Bytes::from(body)).boxed())
        .expect("valid response")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_what_kubelet_writes_for_a_node_and_its_pods() {
        let sample = NodeSample {
            at_ms: 1_700_000_000_123,
            node: Some((12.5, 104_857_600)),
            pods: vec![PodSample {
                namespace: "demo".into(),
                name: "echo".into(),
                containers: vec![ContainerSample {
                    name: "echo".into(),
                    cpu_seconds: 0.01,
                    memory_bytes: 2_097_152,
                    start_seconds: 1_699_999_999.5,
                }],
            }],
        };
        let text = render(&sample);
        let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            samples,
            vec![
                r#"container_cpu_usage_seconds_total{container="echo",namespace="demo",pod="echo"} 0.01 1700000000123"#,
                r#"container_memory_working_set_bytes{container="echo",namespace="demo",pod="echo"} 2097152 1700000000123"#,
                r#"container_start_time_seconds{container="echo",namespace="demo",pod="echo"} 1699999999.5"#,
                "node_cpu_usage_seconds_total 12.5 1700000000123",
                "node_memory_working_set_bytes 104857600 1700000000123",
                r#"pod_cpu_usage_seconds_total{namespace="demo",pod="echo"} 0.01 1700000000123"#,
                r#"pod_memory_working_set_bytes{namespace="demo",pod="echo"} 2097152 1700000000123"#,
                "resource_scrape_error 0",
                "scrape_error 0",
            ]
        );
        assert!(text.contains("# TYPE container_cpu_usage_seconds_total counter\n"));
        assert!(text.contains("# TYPE node_memory_working_set_bytes gauge\n"));
    }

    #[test]
    fn a_node_without_its_own_usage_reports_a_scrape_error_and_no_empty_families() {
        let text = render(&NodeSample {
            at_ms: 1,
            node: None,
            pods: Vec::new(),
        });
        let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(samples, vec!["resource_scrape_error 1", "scrape_error 1"]);
    }

    #[test]
    fn label_values_are_quoted_as_the_text_format_wants() {
        assert_eq!(escape(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(escape("a\nb"), r"a\nb");
    }
}
