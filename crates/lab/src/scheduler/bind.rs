//! Acting on decisions: binding a pod (after VolumeBinding's PreBind for its claims) and
//! reporting one that fits nowhere (PodScheduled=False and a FailedScheduling event).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Binding, ObjectReference, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::pod_info::{SCHEDULER_NAME, is_bound};

/// How long a pod waits for its WaitForFirstConsumer claims to be bound once it has a node
/// (kube-scheduler's `bindTimeoutSeconds`).
const VOLUME_BIND_TIMEOUT: Duration = Duration::from_secs(600);

/// The outcome of one binding request.
pub(super) struct Bound {
    pub(super) uid: String,
    pub(super) node: String,
    pub(super) result: Result<(), BindError>,
    /// Whether it counted against MAX_IN_FLIGHT (pods waiting for volumes do not).
    pub(super) counted: bool,
}

/// Why a pod could not be bound.
#[derive(Debug, thiserror::Error)]
pub(super) enum BindError {
    /// The binding (or a claim's annotation) was refused.
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// A claim was not bound in time.
    #[error("binding volumes: timed out waiting for persistentvolumeclaim {0:?} to be bound")]
    VolumeTimeout(String),
}

/// Binds `pod` to `node` once its WaitForFirstConsumer `claims` are bound there, records the
/// Scheduled event, and sends the outcome to `done`.
pub(super) async fn bind(
    client: kube::Client,
    events: crate::events::Recorder,
    pod: Arc<Pod>,
    uid: String,
    node: String,
    claims: Vec<String>,
    done: mpsc::UnboundedSender<Bound>,
) {
    let counted = claims.is_empty();
    let result = bind_volumes(&client, &pod, &node, &claims).await;
    let result = match result {
        Ok(()) => bind_pod(client, &pod, &uid, &node)
            .await
            .map_err(BindError::from),
        Err(e) => Err(e),
    };
    if result.is_ok() {
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        events.pod(
            &pod,
            None,
            crate::events::PodEvent {
                reason: "Scheduled",
                type_: "Normal",
                message: format!("Successfully assigned {ns}/{name} to {node}"),
                component: SCHEDULER_NAME,
                action: "Binding",
            },
        );
    }
    let _ = done.send(Bound {
        uid,
        node,
        result,
        counted,
    });
}

/// VolumeBinding's PreBind: names the chosen node on each WaitForFirstConsumer claim, then
/// waits until the volume controller (or a provisioner) has bound every one of them.
async fn bind_volumes(
    client: &kube::Client,
    pod: &Pod,
    node: &str,
    claims: &[String],
) -> Result<(), BindError> {
    if claims.is_empty() {
        return Ok(());
    }
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let api = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns);
    for claim in claims {
        let patch = serde_json::json!({"metadata": {"annotations": {
            "volume.kubernetes.io/selected-node": node,
        }}});
        api.patch(claim, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
    }
    let deadline = Instant::now() + VOLUME_BIND_TIMEOUT;
    for claim in claims {
        loop {
            let current = api.get(claim).await?;
            let bound = current
                .spec
                .as_ref()
                .and_then(|s| s.volume_name.as_deref())
                .is_some_and(|v| !v.is_empty())
                && current.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
            if bound {
                break;
            }
            if Instant::now() >= deadline {
                return Err(BindError::VolumeTimeout(claim.clone()));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

async fn bind_pod(
    client: kube::Client,
    pod: &Pod,
    uid: &str,
    node: &str,
) -> Result<(), kube::Error> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let binding = Binding {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(ns.clone()),
            uid: Some(uid.to_string()),
            ..Default::default()
        },
        target: ObjectReference {
            kind: Some("Node".into()),
            api_version: Some("v1".into()),
            name: Some(node.to_string()),
            ..Default::default()
        },
    };
    Api::<Pod>::namespaced(client, &ns)
        .create_subresource::<_, serde_json::Value>(
            "binding",
            &name,
            &PostParams::default(),
            &binding,
        )
        .await
        .map(|_| ())
}

/// Sets PodScheduled=False (reason Unschedulable) and records a FailedScheduling event.
pub(super) async fn report(client: kube::Client, pod: Arc<Pod>, message: String) {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let now = k8s_openapi::jiff::Timestamp::now();
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    // The patch carries the pod's resourceVersion so that it cannot land after a binding
    // (which would leave a bound pod with PodScheduled=False); on conflict, look again.
    let mut rv = pod.metadata.resource_version.clone();
    for _ in 0..3 {
        let status = serde_json::json!({
            "metadata": {"resourceVersion": rv},
            "status": {"conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": message, "lastProbeTime": null, "lastTransitionTime": Time(now),
            }]},
        });
        match pods
            .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&status))
            .await
        {
            Ok(_) => break,
            Err(e) if tandem_api::client::is_conflict(&e) => match pods.get_opt(&name).await {
                Ok(Some(fresh)) if fresh.metadata.uid == pod.metadata.uid && !is_bound(&fresh) => {
                    rv = fresh.metadata.resource_version;
                }
                _ => return,
            },
            Err(e) => {
                tracing::debug!(pod = %name, "setting PodScheduled=False: {e}");
                return;
            }
        }
    }
    crate::events::record(
        &client,
        &pod,
        crate::events::PodEvent {
            reason: "FailedScheduling",
            type_: "Warning",
            message,
            component: SCHEDULER_NAME,
            action: "Scheduling",
        },
    )
    .await;
}
