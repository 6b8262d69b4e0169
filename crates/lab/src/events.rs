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
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let now = k8s_openapi::jiff::Timestamp::now();
    let object = CoreEvent {
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
        reporting_instance: Some(event.component.into()),
        source: Some(EventSource {
            component: Some(event.component.into()),
            host: None,
        }),
        ..Default::default()
    };
    if let Err(e) = Api::<CoreEvent>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &object)
        .await
    {
        tracing::debug!(pod = %name, reason = event.reason, "recording an event: {e}");
    }
}
