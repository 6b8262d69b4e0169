//! Why a reconcile failed (the object, the step, the cause), and what a controller does with a
//! failure: log it and retry.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::controller::Action;

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
