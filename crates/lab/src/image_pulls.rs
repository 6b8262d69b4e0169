//! What a hollow kubelet reports while a pod's images fail to pull (the kind profile, see
//! [`crate::images`]): kubelet's `ErrImagePull`, then `ImagePullBackOff`, the pod Pending.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::images::PullFailure;

/// A pod whose containers' images are not all on the node: what kubelet reports and when it
/// tries again.
#[derive(Clone, Debug)]
pub struct Pulling {
    /// The failing containers (init containers included), by name.
    pub failures: BTreeMap<String, PullFailure>,
    /// Pull attempts so far.
    pub attempts: i32,
    /// When the last attempt failed.
    pub failed_at: Instant,
    /// When the next attempt is due.
    pub next: Instant,
    /// Whether the back-off was reported (status ImagePullBackOff, event BackOff).
    pub backing_off: bool,
}

/// How long a failed pull shows as `ErrImagePull` before kubelet reports the back-off.
pub const PULL_ERROR_SHOWN: Duration = Duration::from_secs(1);

/// The status kubelet reports while a pod's images fail to pull: Pending, the failing
/// containers waiting with `ErrImagePull` (just after an attempt) or `ImagePullBackOff`, the
/// others with `ContainerCreating`.
pub fn pulling_status(pod: &Pod, pulling: &Pulling, host_ip: &str) -> Value {
    let now = Time(Timestamp::now());
    let spec = pod.spec.as_ref();
    let waiting = |c: &k8s_openapi::api::core::v1::Container| {
        let image = c.image.clone().unwrap_or_default();
        let state = match pulling.failures.get(&c.name) {
            Some(f) if pulling.backing_off && f.reason == "ErrImagePull" => json!({
                "reason": "ImagePullBackOff",
                "message": format!("Back-off pulling image \"{}\": {}: {}", f.image, f.reason,
                                   f.message)}),
            Some(f) => json!({"reason": f.reason, "message": f.message}),
            None => json!({"reason": "ContainerCreating"}),
        };
        json!({"name": c.name, "image": image, "imageID": "", "ready": false,
               "restartCount": 0, "started": false, "state": {"waiting": state},
               "lastState": {}})
    };
    let statuses = |cs: Option<&[k8s_openapi::api::core::v1::Container]>| -> Vec<Value> {
        cs.unwrap_or_default().iter().map(waiting).collect()
    };
    let names = |cs: &[Value]| {
        cs.iter()
            .filter_map(|c| c["name"].as_str())
            .collect::<Vec<_>>()
            .join(" ")
    };
    let init = statuses(spec.and_then(|s| s.init_containers.as_deref()));
    let regular = statuses(spec.map(|s| s.containers.as_slice()));
    let condition = |kind: &str, ok: bool, reason: Option<&str>, message: Option<String>| {
        let mut c = json!({"type": kind, "status": if ok { "True" } else { "False" },
                           "lastProbeTime": null, "lastTransitionTime": now});
        if let (Some(r), Some(m)) = (reason, message) {
            c["reason"] = json!(r);
            c["message"] = json!(m);
        }
        c
    };
    let unready = format!("containers with unready status: [{}]", names(&regular));
    let mut status = json!({
        "phase": "Pending",
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": pod.status.as_ref().and_then(|s| s.start_time.clone()).unwrap_or_else(|| now.clone()),
        "qosClass": pod.status.as_ref().and_then(|s| s.qos_class.clone())
            .unwrap_or_else(|| "BestEffort".into()),
        "conditions": [
            condition("PodReadyToStartContainers", true, None, None),
            condition("Initialized", init.is_empty(), Some("ContainersNotInitialized"),
                      Some(format!("containers with incomplete status: [{}]", names(&init)))),
            condition("ContainersReady", false, Some("ContainersNotReady"), Some(unready.clone())),
            condition("Ready", false, Some("ContainersNotReady"), Some(unready)),
            condition("PodScheduled", true, None, None),
        ],
        "containerStatuses": regular,
    });
    if !init.is_empty() {
        status["initContainerStatuses"] = json!(init);
    }
    status
}
