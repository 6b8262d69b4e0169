//! The controller's Prometheus metrics (`/metrics`) and health endpoints (`/healthz`,
//! `/readyz`), served on `--metrics-addr`.
//!
//! Counted as they happen: API requests to each cluster (this one is `local`, a provider is
//! its cluster ID) by HTTP method, reconciles, their errors and durations per controller, the
//! reflection lag of offloaded pods' status and the pod-placement webhook's latency. Read from
//! the API at each scrape: peerings by phase, consumers served, virtual nodes' readiness and
//! offloaded pods per provider (a scrape every 15–60 s costs a handful of lists; keeping them
//! current between scrapes would cost a watch of every pod).

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tandem_api::{Peering, Tenant, names};

/// Requests to one cluster with one HTTP method.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `local`, or the provider's cluster ID.
    pub cluster: String,
    pub method: String,
}

/// Requests to one cluster with one HTTP method on one resource (`pods`, `pods/status`, …):
/// counted for the request budget of a burst (issue 54's guard), not exported (the exported
/// series stay by cluster and method).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct ResourceRequest {
    cluster: String,
    method: String,
    resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    pub controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderLabels {
    pub provider: String,
}

/// The reconcilers counted under `tandem_reconciles_total` (see [`timed`]).
pub const CONTROLLERS: [&str; 6] = [
    "peeringrequest",
    "tenant",
    "remotenamespace",
    "peering",
    "namespaceoffloading",
    "storage",
];

fn seconds_histogram() -> Histogram {
    // 1 ms to about 65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// One controller's metrics (each controller of a process has its own: the lab hosts several).
pub struct Metrics {
    registry: Registry,
    api_requests: Family<RequestLabels, Counter>,
    by_resource: Arc<std::sync::Mutex<std::collections::HashMap<ResourceRequest, u64>>>,
    reconciles: Family<ControllerLabels, Counter>,
    reconcile_errors: Family<ControllerLabels, Counter>,
    reconcile_seconds: Family<ControllerLabels, Histogram, fn() -> Histogram>,
    reflection_lag: Histogram,
    webhook_seconds: Histogram,
    peerings: Family<PhaseLabels, Gauge>,
    tenants: Gauge,
    virtual_node_ready: Family<ProviderLabels, Gauge>,
    offloaded_pods: Family<ProviderLabels, Gauge>,
    leader: Gauge,
    /// Set once the reconcilers run (this replica leads, or there is no election).
    started: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("tandem");
        let api_requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "api_requests",
            "Requests sent to a cluster's API server (cluster: local, or a provider's ID)",
            api_requests.clone(),
        );
        let reconciles = Family::<ControllerLabels, Counter>::default();
        registry.register(
            "reconciles",
            "Reconciles run, per controller",
            reconciles.clone(),
        );
        let reconcile_errors = Family::<ControllerLabels, Counter>::default();
        registry.register(
            "reconcile_errors",
            "Reconciles that failed (retried), per controller",
            reconcile_errors.clone(),
        );
        let reconcile_seconds =
            Family::<ControllerLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                seconds_histogram,
            );
        registry.register(
            "reconcile_duration_seconds",
            "How long reconciles took, per controller",
            reconcile_seconds.clone(),
        );
        let reflection_lag = seconds_histogram();
        registry.register(
            "reflection_lag_seconds",
            "From a provider pod's status change reaching this controller to its offloaded \
             pod's status written here",
            reflection_lag.clone(),
        );
        let webhook_seconds = seconds_histogram();
        registry.register(
            "webhook_duration_seconds",
            "How long the pod-placement webhook took to answer",
            webhook_seconds.clone(),
        );
        let peerings = Family::<PhaseLabels, Gauge>::default();
        registry.register(
            "peerings",
            "Peerings with providers, by phase",
            peerings.clone(),
        );
        let tenants = Gauge::default();
        registry.register(
            "tenants",
            "Consumers this cluster provides for (Tenants)",
            tenants.clone(),
        );
        let virtual_node_ready = Family::<ProviderLabels, Gauge>::default();
        registry.register(
            "virtual_node_ready",
            "1 when a provider's virtual node is Ready",
            virtual_node_ready.clone(),
        );
        let offloaded_pods = Family::<ProviderLabels, Gauge>::default();
        registry.register(
            "offloaded_pods",
            "Pods bound to a provider's virtual node",
            offloaded_pods.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 when this replica runs the reconcilers (it holds the leader Lease, or leader \
             election is off)",
            leader.clone(),
        );
        // Every controller's series exist from the start (at 0), so that rates work at once.
        for controller in CONTROLLERS {
            let labels = ControllerLabels {
                controller: controller.to_string(),
            };
            let _ = reconciles.get_or_create(&labels);
            let _ = reconcile_errors.get_or_create(&labels);
        }
        Metrics {
            registry,
            api_requests,
            by_resource: Default::default(),
            reconciles,
            reconcile_errors,
            reconcile_seconds,
            reflection_lag,
            webhook_seconds,
            peerings,
            tenants,
            virtual_node_ready,
            offloaded_pods,
            leader,
            started: AtomicBool::new(false),
        }
    }

    /// `client` with every request it sends counted under `cluster`.
    pub fn counted(self: &Arc<Self>, client: Client, cluster: &str) -> Client {
        let namespace = client.default_namespace().to_string();
        let requests = self.api_requests.clone();
        let by_resource = self.by_resource.clone();
        let cluster = cluster.to_string();
        let service = tower::service_fn(move |request: Request<kube::client::Body>| {
            requests
                .get_or_create(&RequestLabels {
                    cluster: cluster.clone(),
                    method: request.method().as_str().to_string(),
                })
                .inc();
            *by_resource
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(ResourceRequest {
                    cluster: cluster.clone(),
                    method: request.method().as_str().to_string(),
                    resource: resource_of(request.uri().path()),
                })
                .or_default() += 1;
            let client = client.clone();
            async move { client.send(request).await }
        });
        Client::new(service, namespace)
    }

    /// Requests sent to `cluster` with `method` so far (reading makes no series).
    pub fn requests(&self, cluster: &str, method: &str) -> u64 {
        self.api_requests
            .get(&RequestLabels {
                cluster: cluster.to_string(),
                method: method.to_string(),
            })
            .map_or(0, |c| c.get())
    }

    /// Every (cluster, method, resource) requests were sent for, with how many so far.
    pub fn requests_by_resource(&self) -> Vec<(String, String, String, u64)> {
        let mut all: Vec<_> = self
            .by_resource
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(k, n)| (k.cluster.clone(), k.method.clone(), k.resource.clone(), *n))
            .collect();
        all.sort();
        all
    }

    /// Writes (every method but GET) sent to this cluster so far.
    pub fn local_writes(&self) -> u64 {
        ["POST", "PUT", "PATCH", "DELETE"]
            .iter()
            .map(|m| self.requests("local", m))
            .sum()
    }

    /// Runs `reconcile`, counting it (and its failure) and timing it under `controller`.
    pub async fn reconcile<T, E>(
        &self,
        controller: &'static str,
        reconcile: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let labels = ControllerLabels {
            controller: controller.to_string(),
        };
        let start = Instant::now();
        let result = reconcile.await;
        self.reconciles.get_or_create(&labels).inc();
        if result.is_err() {
            self.reconcile_errors.get_or_create(&labels).inc();
        }
        self.reconcile_seconds
            .get_or_create(&labels)
            .observe(start.elapsed().as_secs_f64());
        result
    }

    /// A provider pod's status reached the consumer pod `since` after its event arrived.
    pub fn reflected(&self, since: Instant) {
        self.reflection_lag.observe(since.elapsed().as_secs_f64());
    }

    /// The webhook answered a review that arrived at `since`.
    pub fn webhook_answered(&self, since: Instant) {
        self.webhook_seconds.observe(since.elapsed().as_secs_f64());
    }

    /// This replica runs the reconcilers from now on.
    pub fn set_started(&self) {
        self.leader.set(1);
        self.started.store(true, Ordering::Relaxed);
    }

    /// Whether this replica runs the reconcilers.
    pub fn started(&self) -> bool {
        self.started.load(Ordering::Relaxed)
    }

    /// Reads the gauges counted from the API (see the module's documentation).
    async fn refresh(&self, client: &Client) -> Result<(), kube::Error> {
        let peerings = Api::<Peering>::all(client.clone())
            .list(&ListParams::default())
            .await?;
        self.peerings.clear();
        for p in &peerings.items {
            let phase = p
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_else(|| "Pending".into());
            self.peerings.get_or_create(&PhaseLabels { phase }).inc();
        }
        let tenants = Api::<Tenant>::all(client.clone())
            .list_metadata(&ListParams::default())
            .await?;
        self.tenants.set(tenants.items.len() as i64);
        let nodes = Api::<Node>::all(client.clone())
            .list(&ListParams::default().labels(&format!(
                "{}={}",
                names::NODE_TYPE_LABEL,
                names::VIRTUAL_NODE_TYPE
            )))
            .await?;
        self.virtual_node_ready.clear();
        self.offloaded_pods.clear();
        let pods: Api<Pod> = Api::all(client.clone());
        for node in &nodes.items {
            let provider = ProviderLabels {
                provider: node
                    .labels()
                    .get(names::REMOTE_CLUSTER_LABEL)
                    .cloned()
                    .unwrap_or_else(|| node.name_any()),
            };
            let ready = node
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            self.virtual_node_ready
                .get_or_create(&provider)
                .set(i64::from(ready));
            let bound = pods
                .list_metadata(
                    &ListParams::default().fields(&format!("spec.nodeName={}", node.name_any())),
                )
                .await?;
            self.offloaded_pods
                .get_or_create(&provider)
                .set(bound.items.len() as i64);
        }
        Ok(())
    }

    /// The text exposition of every metric, the API-read gauges refreshed first.
    pub async fn render(&self, client: &Client) -> String {
        if let Err(e) = self.refresh(client).await {
            tracing::debug!("metrics: reading peerings and virtual nodes: {e}");
        }
        let mut text = String::new();
        encode(&mut text, &self.registry).expect("writing to a String");
        text
    }
}

/// `reconcile` counted and timed under `controller`, for kube's `Controller::run`.
pub fn timed<K, C, F, Fut, T, E>(
    metrics: Arc<Metrics>,
    controller: &'static str,
    reconcile: F,
) -> impl FnMut(Arc<K>, C) -> futures::future::BoxFuture<'static, Result<T, E>>
where
    F: Fn(Arc<K>, C) -> Fut,
    Fut: Future<Output = Result<T, E>> + Send + 'static,
    T: Send + 'static,
    E: Send + 'static,
{
    move |object, ctx| {
        let metrics = metrics.clone();
        let run = reconcile(object, ctx);
        Box::pin(async move { metrics.reconcile(controller, run).await })
    }
}

/// Serves `/metrics`, `/healthz` (the process answers) and `/readyz` (the reconcilers run:
/// a follower waiting for the leader Lease is not ready) on `listener` until dropped.
pub async fn serve(listener: tokio::net::TcpListener, metrics: Arc<Metrics>, client: Client) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let metrics = metrics.clone();
        let client = client.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let metrics = metrics.clone();
                let client = client.clone();
                async move { Ok::<_, Infallible>(route(req.uri().path(), &metrics, &client).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn route(path: &str, metrics: &Metrics, client: &Client) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match path {
        "/metrics" => (
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.render(client).await,
        ),
        "/healthz" | "/livez" => (StatusCode::OK, "text/plain", "ok\n".to_string()),
        "/readyz" if metrics.started() => (StatusCode::OK, "text/plain", "ok\n".to_string()),
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "waiting for the leader Lease\n".to_string(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: /metrics, /healthz, /readyz\n".to_string(),
        ),
    };
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, content_type)
        .body(Full::new(Bytes::from(body)))
        .expect("static response")
}

/// The resource (and subresource) an API path names: `pods` for
/// `/api/v1/namespaces/ns/pods/web`, `pods/status` for its status, `shadowpods` for
/// `/apis/tandem.dev/v1alpha1/namespaces/ns/shadowpods`, `nodes` for `/api/v1/nodes/n`;
/// empty for anything else (discovery, `/version`).
fn resource_of(path: &str) -> String {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match segments.as_slice() {
        ["api", _version, rest @ ..] | ["apis", _, _version, rest @ ..] => rest,
        _ => return String::new(),
    };
    let rest = match rest {
        ["namespaces", _ns, rest @ ..] if !matches!(rest, [] | ["status" | "finalize"]) => rest,
        rest => rest,
    };
    match rest {
        [resource] | [resource, _] => (*resource).to_string(),
        [resource, _, sub, ..] => format!("{resource}/{sub}"),
        [] => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::resource_of;

    #[test]
    fn the_resource_a_path_names() {
        for (path, want) in [
            ("/api/v1/namespaces/shop/pods/web-1", "pods"),
            ("/api/v1/namespaces/shop/pods", "pods"),
            ("/api/v1/namespaces/shop/pods/web-1/status", "pods/status"),
            (
                "/apis/tandem.dev/v1alpha1/namespaces/shop-rome/shadowpods",
                "shadowpods",
            ),
            (
                "/apis/coordination.k8s.io/v1/namespaces/t/leases/l",
                "leases",
            ),
            ("/api/v1/nodes/tandem-milan/status", "nodes/status"),
            ("/api/v1/namespaces/shop", "namespaces"),
            ("/api/v1/namespaces", "namespaces"),
            ("/api/v1/namespaces/shop/finalize", "namespaces/finalize"),
            ("/api/v1/pods", "pods"),
            ("/apis/tandem.dev/v1alpha1/tenants", "tenants"),
            ("/version", ""),
            ("/apis", ""),
        ] {
            assert_eq!(resource_of(path), want, "{path}");
        }
    }
}
