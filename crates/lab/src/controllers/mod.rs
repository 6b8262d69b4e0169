//! The controllers kube-controller-manager would run in a real cluster: ReplicaSet,
//! Deployment, DaemonSet, StatefulSet, Job, CronJob (with TTL-after-finished), disruption (PodDisruptionBudget status),
//! EndpointSlice/Endpoints, the persistent volume binder (with the lab's provisioner of
//! hollow volumes), the kube-apiserver-client and kubelet-serving CSR signers and the
//! ServiceAccount controller. Each one talks to the cluster only through its `kube::Client`,
//! is level-based (it recomputes from what it lists, so a restart loses nothing) and logs
//! failures with the object and the step.

pub mod cronjob;
pub mod csr;
pub mod daemonset;
pub mod deployment;
pub mod disruption;
pub mod endpoints;
pub mod history;
pub mod job;
pub mod replicaset;
pub mod serviceaccount;
pub mod statefulset;
pub mod volume;

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::time::Duration;
pub(crate) use tandem_api::client::{is_conflict, is_not_found};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Resource;
use kube::core::{Selector, SelectorExt};
use kube::runtime::controller::Action;
use tandem_apiserver::pki::CertPair;

/// Runs every controller until one of them stops (they only stop on a bug).
pub async fn run_all(client: kube::Client, ca: CertPair) -> anyhow::Result<()> {
    tokio::select! {
        () = replicaset::run(client.clone()) => anyhow::bail!("replicaset controller stopped"),
        () = deployment::run(client.clone()) => anyhow::bail!("deployment controller stopped"),
        () = daemonset::run(client.clone()) => anyhow::bail!("daemonset controller stopped"),
        () = disruption::run(client.clone()) => anyhow::bail!("disruption controller stopped"),
        () = endpoints::run(client.clone()) => anyhow::bail!("endpoints controller stopped"),
        () = statefulset::run(client.clone()) => anyhow::bail!("statefulset controller stopped"),
        () = volume::run(client.clone()) => anyhow::bail!("persistentvolume controller stopped"),
        () = job::run(client.clone()) => anyhow::bail!("job controller stopped"),
        () = cronjob::run(client.clone()) => anyhow::bail!("cronjob controller stopped"),
        () = csr::run(client.clone(), ca) => anyhow::bail!("csr signer stopped"),
        () = serviceaccount::run(client) => anyhow::bail!("serviceaccount controller stopped"),
    }
}

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

/// Why a reconcile failed: the object, the step, and the cause.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("{object}: {step}: {source}")]
    Api {
        /// `namespace/name` of the object being reconciled.
        object: String,
        /// What the controller was doing.
        step: String,
        /// The client error.
        source: kube::Error,
    },
    /// The object cannot be acted on as it is (the controller waits for it to change).
    #[error("{object}: {reason}")]
    Invalid {
        /// `namespace/name` of the object.
        object: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Attaches the object and step to a client error.
pub(crate) trait StepExt<T> {
    /// Names the object and the step that failed.
    fn step(self, object: &str, step: impl Into<String>) -> Result<T, Error>;
}

impl<T> StepExt<T> for Result<T, kube::Error> {
    fn step(self, object: &str, step: impl Into<String>) -> Result<T, Error> {
        self.map_err(|source| Error::Api {
            object: object.to_string(),
            step: step.into(),
            source,
        })
    }
}

/// `namespace/name` of an object, for logs and errors.
pub(crate) fn key(meta: &ObjectMeta) -> String {
    match &meta.namespace {
        Some(ns) => format!("{ns}/{}", meta.name.as_deref().unwrap_or("")),
        None => meta.name.clone().unwrap_or_default(),
    }
}

/// Logs a failed reconcile and retries later; the next reconcile starts again from the
/// listed state, so retrying is always safe.
pub(crate) fn retry_after_error<K, C>(
    controller: &'static str,
) -> impl Fn(std::sync::Arc<K>, &Error, std::sync::Arc<C>) -> Action {
    move |_, error, _| {
        tracing::warn!("{controller} controller: {error}");
        Action::requeue(Duration::from_secs(2))
    }
}

/// Drains a controller's result stream; reconcile errors are logged by the error policy,
/// watch errors here (the watcher retries on its own).
pub(crate) async fn drain<S, T, E>(controller: &'static str, stream: S)
where
    S: futures::Stream<Item = Result<T, E>>,
    E: std::fmt::Display,
{
    stream
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!("{controller} controller: {e}");
            }
        })
        .await;
}

/// The controller ownerReference of an object, if any.
pub(crate) fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|r| r.controller == Some(true))
}

/// The controllers of kind `K` a pod event concerns: its controller if it is a `K`, else (an
/// orphan) those of its namespace whose selector matches it, which may adopt it.
pub(crate) fn pod_controllers<K>(
    store: &kube::runtime::reflector::Store<K>,
    pod: &Pod,
    selector: impl Fn(&K) -> Option<&LabelSelector>,
) -> Vec<kube::runtime::reflector::ObjectRef<K>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    use kube::runtime::reflector::ObjectRef;
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    match controller_of(&pod.metadata) {
        Some(owner) if owner.kind == K::kind(&()) => {
            vec![ObjectRef::<K>::new(&owner.name).within(&ns)]
        }
        Some(_) => Vec::new(),
        None => store
            .state()
            .iter()
            .filter(|o| o.meta().namespace.as_deref() == Some(ns.as_str()))
            .filter(|o| selector(o).is_some_and(|s| selects(s, pod.metadata.labels.as_ref())))
            .map(|o| ObjectRef::from_obj(o.as_ref()))
            .collect(),
    }
}

/// The pod a workload controller creates from its pod template: `<owner>-<random>`, owned by it
/// (kube's GetPodFromTemplate).
pub(crate) fn pod_from_template(
    template: k8s_openapi::api::core::v1::PodTemplateSpec,
    owner_name: &str,
    ns: &str,
    owner: OwnerReference,
) -> Pod {
    let meta = template.metadata.unwrap_or_default();
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("{owner_name}-")),
            namespace: Some(ns.to_string()),
            labels: meta.labels,
            annotations: meta.annotations,
            finalizers: meta.finalizers,
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: template.spec,
        status: None,
    }
}

/// Whether `selector` selects `labels`. An empty or unparsable selector selects nothing,
/// as a workload controller must never grab every pod of a namespace.
pub(crate) fn selects(selector: &LabelSelector, labels: Option<&BTreeMap<String, String>>) -> bool {
    let Ok(selector) = Selector::try_from(selector.clone()) else {
        return false;
    };
    if selector.selects_all() {
        return false;
    }
    selector.matches(labels.unwrap_or(&BTreeMap::new()))
}

/// Whether a pod counts for its controller: not being deleted and not finished.
pub(crate) fn is_active(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    pod.metadata.deletion_timestamp.is_none() && !matches!(phase, Some("Succeeded" | "Failed"))
}

/// When the pod's Ready condition last became True, if it is True.
pub(crate) fn ready_since(pod: &Pod) -> Option<Option<Timestamp>> {
    let cond = pod
        .status
        .as_ref()?
        .conditions
        .as_deref()?
        .iter()
        .find(|c| c.type_ == "Ready")?;
    (cond.status == "True").then(|| cond.last_transition_time.as_ref().map(|t| t.0))
}

/// Whether the pod's Ready condition is True.
pub(crate) fn is_ready(pod: &Pod) -> bool {
    ready_since(pod).is_some()
}

/// Whether the pod has been Ready for `min_ready_seconds` at `now`; if not yet but it is
/// Ready, how long until it will be.
pub(crate) fn availability(pod: &Pod, min_ready_seconds: i32, now: Timestamp) -> Availability {
    match ready_since(pod) {
        None => Availability::Unavailable,
        Some(_) if min_ready_seconds <= 0 => Availability::Available,
        // Ready without a transition time: kube treats it as available.
        Some(None) => Availability::Available,
        Some(Some(since)) => {
            let at = since + SignedDuration::from_secs(i64::from(min_ready_seconds));
            if at <= now {
                Availability::Available
            } else {
                Availability::ReadyFor(
                    Duration::try_from(at.duration_since(now)).unwrap_or_default(),
                )
            }
        }
    }
}

/// Whether a pod counts as available.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Availability {
    /// Not Ready.
    Unavailable,
    /// Ready, but for less than minReadySeconds: available after this long.
    ReadyFor(Duration),
    /// Ready for at least minReadySeconds.
    Available,
}
