//! Whether a pod counts for its controller: active (not deleted, not finished), Ready, and
//! available (Ready for minReadySeconds).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

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
