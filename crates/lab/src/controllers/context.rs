//! What a controller's reconciles share: its client, and the events it publishes under its
//! name.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;

use super::error::key;

/// What a controller's reconciles share: its client and the name it reports events under.
pub struct Context {
    /// The client everything goes through.
    pub client: kube::Client,
    /// The reporting controller of its events (e.g. `replicaset-controller`).
    pub reporter: String,
}

impl Context {
    /// A context for the controller named `reporter` (e.g. `deployment-controller`).
    pub fn new(client: kube::Client, reporter: &str) -> Context {
        Context {
            client,
            reporter: reporter.to_string(),
        }
    }

    /// Publishes a Normal event about `obj`. Events are best effort: a failure is logged
    /// and never fails the reconcile.
    ///
    /// Written here rather than with kube-runtime's `Recorder`: its `publish` sweeps its whole
    /// six-minute cache under one lock on every call, so a ReplicaSet creating 10,000 pods
    /// (one `SuccessfulCreate` each) spent most of its time there. These notes are unique per
    /// object anyway (kube-controller-manager does not aggregate them either).
    pub async fn event<K: Resource<DynamicType = ()>>(&self, obj: &K, reason: &str, note: String) {
        self.publish(obj, "Normal", reason, note).await;
    }

    /// Publishes a Warning event about `obj` (best effort, as [`Context::event`]).
    pub async fn warning<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        reason: &str,
        note: String,
    ) {
        self.publish(obj, "Warning", reason, note).await;
    }

    async fn publish<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        type_: &str,
        reason: &str,
        note: String,
    ) {
        use k8s_openapi::api::events::v1::Event;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
        let regarding = obj.object_ref(&());
        let ns = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_string());
        let now = Timestamp::now();
        let event = Event {
            metadata: ObjectMeta {
                name: Some(format!(
                    "{}.{:x}",
                    regarding.name.as_deref().unwrap_or("object"),
                    now.as_nanosecond()
                )),
                namespace: Some(ns.clone()),
                ..Default::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some(type_.into()),
            reason: Some(reason.into()),
            action: Some(reason.into()),
            note: Some(note),
            regarding: Some(regarding),
            reporting_controller: Some(self.reporter.clone()),
            reporting_instance: Some(self.reporter.clone()),
            ..Default::default()
        };
        if let Err(e) = kube::Api::<Event>::namespaced(self.client.clone(), &ns)
            .create(&Default::default(), &event)
            .await
        {
            tracing::debug!("event {reason} on {}: {e}", key(obj.meta()));
        }
    }
}
