//! core/v1 Events about pods, recorded the way kube's components write them (so that
//! `kubectl describe pod` and `kubectl get events --field-selector involvedObject.name=…` show them).

use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, PostParams};

/// What happened to a pod, and who says so.
pub struct PodEvent<'a> {
    /// Machine-readable reason, e.g. `FailedScheduling`.
    pub reason: &'a str,
    /// `Normal` or `Warning`.
    pub type_: &'a str,
    /// Human-readable message.
    pub message: String,
    /// The reporting component, e.g. `default-scheduler`.
    pub component: &'a str,
    /// What the component was doing, e.g. `Scheduling`.
    pub action: &'a str,
}

/// Records `event` about `pod`; a failure to record is logged, never fatal.
pub async fn record(client: &kube::Client, pod: &Pod, event: PodEvent<'_>) {
    let reason = event.reason;
    let object = event_object(pod, event, None);
    let ns = object.metadata.namespace.clone().unwrap_or_default();
    if let Err(e) = Api::<CoreEvent>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &object)
        .await
    {
        tracing::debug!(
            pod = object.involved_object.name.as_deref().unwrap_or_default(),
            reason,
            "recording an event: {e}"
        );
    }
}

/// The core/v1 Event object for `event` about `pod`, named as client-go names them.
fn event_object(pod: &Pod, event: PodEvent<'_>, host: Option<String>) -> CoreEvent {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let now = k8s_openapi::jiff::Timestamp::now();
    CoreEvent {
        metadata: ObjectMeta {
            name: Some(format!("{name}.{:x}", now.as_nanosecond())),
            namespace: Some(ns.clone()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(name.clone()),
            namespace: Some(ns.clone()),
            uid: pod.metadata.uid.clone(),
            resource_version: pod.metadata.resource_version.clone(),
            ..Default::default()
        },
        reason: Some(event.reason.into()),
        message: Some(event.message),
        type_: Some(event.type_.into()),
        action: Some(event.action.into()),
        count: Some(1),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        event_time: Some(MicroTime(now)),
        reporting_component: Some(event.component.into()),
        reporting_instance: Some(host.clone().unwrap_or_else(|| event.component.into())),
        source: Some(EventSource {
            component: Some(event.component.into()),
            host,
        }),
        ..Default::default()
    }
}

/// Events a component may burst before its rate applies, and events per second after (the
/// kubelet's `--event-burst` and `--event-qps` defaults).
const BURST: f64 = 100.0;
const QPS: f64 = 50.0;
/// Events waiting to be written before new ones are dropped (client-go's broadcaster queue).
const QUEUE: usize = 1000;

/// A component's event recorder, as client-go's: recording never waits — events queue up to
/// [`QUEUE`] and are written in the background at most [`QPS`] per second after a burst of
/// [`BURST`]; when the queue is full, new events are dropped (and counted), so a busy
/// component never slows down for its events.
#[derive(Clone)]
pub struct Recorder {
    tx: tokio::sync::mpsc::Sender<CoreEvent>,
    component: &'static str,
    host: Option<String>,
    dropped: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Recorder {
    /// A recorder for `component`, writing through `client`.
    pub fn new(client: kube::Client, component: &'static str) -> Recorder {
        let (tx, rx) = tokio::sync::mpsc::channel(QUEUE);
        tokio::spawn(write_events(client, rx));
        Recorder {
            tx,
            component,
            host: None,
            dropped: Default::default(),
        }
    }

    /// The same recorder (same queue and rate) for the component's instance on node `host`.
    /// A lab cluster's hollow kubelets share one: they share one machine, and a real
    /// kubelet's event budget is per machine.
    pub fn for_host(&self, host: &str) -> Recorder {
        Recorder {
            host: Some(host.to_string()),
            ..self.clone()
        }
    }

    /// Records an event about `pod` (about one of its containers when `field_path` is
    /// `spec.containers{name}`).
    pub fn pod(&self, pod: &Pod, field_path: Option<String>, event: PodEvent<'_>) {
        let mut object = event_object(pod, event, self.host.clone());
        object.involved_object.field_path = field_path;
        object.reporting_component = Some(self.component.into());
        if self.tx.try_send(object).is_err() {
            let n = self
                .dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if n.is_power_of_two() {
                tracing::warn!(
                    component = self.component,
                    "event queue full: {} events dropped",
                    n + 1
                );
            }
        }
    }

    /// How many events were dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Writes queued events one at a time under a token bucket of [`BURST`] and [`QPS`].
async fn write_events(client: kube::Client, mut rx: tokio::sync::mpsc::Receiver<CoreEvent>) {
    let mut tokens = BURST;
    let mut last = tokio::time::Instant::now();
    while let Some(event) = rx.recv().await {
        let now = tokio::time::Instant::now();
        tokens = (tokens + now.duration_since(last).as_secs_f64() * QPS).min(BURST);
        last = now;
        if tokens < 1.0 {
            tokio::time::sleep(std::time::Duration::from_secs_f64((1.0 - tokens) / QPS)).await;
            tokens = 1.0;
            last = tokio::time::Instant::now();
        }
        tokens -= 1.0;
        let ns = event.metadata.namespace.clone().unwrap_or_default();
        if let Err(e) = Api::<CoreEvent>::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &event)
            .await
        {
            tracing::debug!(
                pod = event.involved_object.name.as_deref().unwrap_or_default(),
                reason = event.reason.as_deref().unwrap_or_default(),
                "recording an event: {e}"
            );
        }
    }
}
