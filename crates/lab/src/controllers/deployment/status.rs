//! The Deployment status: counters summed from its ReplicaSets and the Available and
//! Progressing conditions with kube's reasons, which `kubectl rollout status` reads.

use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus, ReplicaSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::controllers::error::{Error, StepExt, key};

pub(super) fn condition(
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
) -> DeploymentCondition {
    condition_at(Timestamp::now(), type_, status, reason, message)
}

pub(super) fn condition_at(
    now: Timestamp,
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
) -> DeploymentCondition {
    let now = Time(now);
    DeploymentCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message),
        last_update_time: Some(now.clone()),
        last_transition_time: Some(now),
    }
}

/// Sets `cond` in `conditions` as kube's SetDeploymentCondition: nothing changes if status
/// and reason are the same; the transition time is kept if only the reason changes.
pub(super) fn set_condition(
    conditions: &mut Vec<DeploymentCondition>,
    mut cond: DeploymentCondition,
) {
    if let Some(current) = conditions.iter_mut().find(|c| c.type_ == cond.type_) {
        if current.status == cond.status && current.reason == cond.reason {
            return;
        }
        if current.status == cond.status {
            cond.last_transition_time = current.last_transition_time.clone();
        }
        *current = cond;
    } else {
        conditions.push(cond);
    }
}

/// What the Progressing condition depends on besides the status.
pub struct Rollout<'a> {
    /// spec.replicas.
    pub desired: i32,
    /// Name of the new ReplicaSet.
    pub new_rs: &'a str,
    /// spec.paused.
    pub paused: bool,
    /// spec.progressDeadlineSeconds.
    pub deadline_seconds: Option<i32>,
}

/// kube's syncRolloutStatus for the Progressing condition: the condition to write (None
/// keeps the current one) and when to look again for the progress deadline. `old` is the
/// status written last time, `new` the one about to be written.
pub fn progressing_condition(
    rollout: &Rollout<'_>,
    current: Option<&DeploymentCondition>,
    old: &DeploymentStatus,
    new: &DeploymentStatus,
    now: Timestamp,
) -> (Option<DeploymentCondition>, Option<Duration>) {
    let rs = rollout.new_rs;
    let make = |status: &str, reason: &str, message: String| {
        let mut c = condition_at(now, "Progressing", status, reason, message);
        // The transition time moves only when the status does.
        if let Some(cur) = current.filter(|cur| cur.status == status) {
            c.last_transition_time = cur.last_transition_time.clone();
        }
        c
    };
    let reason_is = |r: &str| current.is_some_and(|c| c.reason.as_deref() == Some(r));
    if rollout.paused {
        return (
            (!reason_is("DeploymentPaused"))
                .then(|| make("Unknown", "DeploymentPaused", "Deployment is paused".into())),
            None,
        );
    }
    // A finished rollout stays finished until a new template rolls (pods turning unready
    // show in the counters, not here), as kube's isCompleteDeployment.
    if reason_is("NewReplicaSetAvailable") && new.replicas == new.updated_replicas {
        return (None, None);
    }
    let complete = new.updated_replicas == Some(rollout.desired)
        && new.replicas == Some(rollout.desired)
        && new.available_replicas == Some(rollout.desired);
    if complete {
        let message = format!("ReplicaSet \"{rs}\" has successfully progressed.");
        return (Some(make("True", "NewReplicaSetAvailable", message)), None);
    }
    let progressed = new.updated_replicas > old.updated_replicas
        || new.replicas < old.replicas
        || new.ready_replicas > old.ready_replicas
        || new.available_replicas > old.available_replicas;
    if progressed || current.is_none() || reason_is("NewReplicaSetAvailable") {
        let message = format!("ReplicaSet \"{rs}\" is progressing.");
        return (Some(make("True", "ReplicaSetUpdated", message)), None);
    }
    let (Some(deadline), Some(since)) = (
        rollout.deadline_seconds,
        current
            .and_then(|c| c.last_update_time.as_ref())
            .map(|t| t.0),
    ) else {
        return (None, None);
    };
    if reason_is("ProgressDeadlineExceeded") {
        return (None, None);
    }
    let at = since + SignedDuration::from_secs(i64::from(deadline));
    if at <= now {
        let message = format!("ReplicaSet \"{rs}\" has timed out progressing.");
        (
            Some(make("False", "ProgressDeadlineExceeded", message)),
            None,
        )
    } else {
        (None, Duration::try_from(at.duration_since(now)).ok())
    }
}

/// The counters of a Deployment's status from its ReplicaSets.
pub fn counters(desired: i32, owned: &[ReplicaSet], new_index: Option<usize>) -> DeploymentStatus {
    let sum = |f: &dyn Fn(&ReplicaSet) -> i32| owned.iter().map(f).sum::<i32>();
    let status = |rs: &ReplicaSet| rs.status.clone().unwrap_or_default();
    let available = sum(&|rs| status(rs).available_replicas.unwrap_or(0));
    DeploymentStatus {
        replicas: Some(sum(&|rs| status(rs).replicas)),
        updated_replicas: Some(new_index.map_or(0, |i| status(&owned[i]).replicas)),
        ready_replicas: Some(sum(&|rs| status(rs).ready_replicas.unwrap_or(0))),
        available_replicas: Some(available),
        unavailable_replicas: Some((desired - available).max(0)),
        ..Default::default()
    }
}

pub(super) async fn write_status(
    client: &Client,
    deploy: &Deployment,
    owned: &[ReplicaSet],
    new_index: Option<usize>,
    max_unavailable: i32,
    progressing: Option<DeploymentCondition>,
) -> Result<Action, Error> {
    let object = key(&deploy.metadata);
    let spec = deploy.spec.as_ref().expect("checked by the caller");
    let desired = spec.replicas.unwrap_or(1).max(0);
    let old = deploy.status.clone().unwrap_or_default();
    let mut status = counters(desired, owned, new_index);
    status.observed_generation = deploy.metadata.generation;
    status.collision_count = old.collision_count;
    let mut conditions = old.conditions.clone().unwrap_or_default();
    let min_available = desired - max_unavailable.min(desired);
    set_condition(
        &mut conditions,
        if status.available_replicas.unwrap_or(0) >= min_available {
            condition(
                "Available",
                "True",
                "MinimumReplicasAvailable",
                "Deployment has minimum availability.".into(),
            )
        } else {
            condition(
                "Available",
                "False",
                "MinimumReplicasUnavailable",
                "Deployment does not have minimum availability.".into(),
            )
        },
    );
    let mut recheck = None;
    if let Some(cond) = progressing {
        set_condition(&mut conditions, cond);
    } else if let Some(i) = new_index {
        let current = conditions.iter().find(|c| c.type_ == "Progressing");
        let rollout = Rollout {
            desired,
            new_rs: &owned[i].name_any(),
            paused: spec.paused == Some(true),
            deadline_seconds: spec.progress_deadline_seconds,
        };
        let (cond, after) =
            progressing_condition(&rollout, current, &old, &status, Timestamp::now());
        recheck = after;
        if let Some(cond) = cond {
            conditions.retain(|c| c.type_ != "Progressing");
            conditions.push(cond);
        }
    }
    status.conditions = Some(conditions);
    let unchanged = serde_json::to_value(&status).ok() == serde_json::to_value(&old).ok();
    if !unchanged {
        Api::<Deployment>::namespaced(
            client.clone(),
            deploy.namespace().as_deref().unwrap_or_default(),
        )
        .patch_status(
            &deploy.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
        .step(&object, "updating status")?;
    }
    Ok(match recheck {
        Some(after) => Action::requeue(after),
        None => Action::await_change(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(replicas: i32, updated: i32, ready: i32, available: i32) -> DeploymentStatus {
        DeploymentStatus {
            replicas: Some(replicas),
            updated_replicas: Some(updated),
            ready_replicas: Some(ready),
            available_replicas: Some(available),
            ..Default::default()
        }
    }

    fn cond(status: &str, reason: &str, updated_secs_ago: i64) -> DeploymentCondition {
        let at = Timestamp::from_second(1_700_000_000 - updated_secs_ago).unwrap();
        condition_at(at, "Progressing", status, reason, String::new())
    }

    #[test]
    fn progressing_condition_follows_kube_reasons() {
        let now = Timestamp::from_second(1_700_000_000).unwrap();
        // (what, paused, current, old counters, new counters,
        //  expected (status, reason) or None to keep, expected recheck seconds)
        let cases = [
            (
                "first pass",
                false,
                None,
                counts(0, 0, 0, 0),
                counts(0, 0, 0, 0),
                Some(("True", "ReplicaSetUpdated")),
                None,
            ),
            (
                "pods got ready",
                false,
                Some(cond("True", "ReplicaSetUpdated", 5)),
                counts(4, 4, 2, 2),
                counts(4, 4, 3, 3),
                Some(("True", "ReplicaSetUpdated")),
                None,
            ),
            (
                "rollout complete",
                false,
                Some(cond("True", "ReplicaSetUpdated", 5)),
                counts(4, 4, 3, 3),
                counts(4, 4, 4, 4),
                Some(("True", "NewReplicaSetAvailable")),
                None,
            ),
            (
                "complete stays complete",
                false,
                Some(cond("True", "NewReplicaSetAvailable", 5)),
                counts(4, 4, 4, 4),
                counts(4, 4, 4, 4),
                None,
                None,
            ),
            (
                "a pod turning unready is no new rollout",
                false,
                Some(cond("True", "NewReplicaSetAvailable", 5)),
                counts(4, 4, 4, 4),
                counts(4, 4, 3, 3),
                None,
                None,
            ),
            (
                "new template rolls",
                false,
                Some(cond("True", "NewReplicaSetAvailable", 5)),
                counts(4, 4, 4, 4),
                counts(5, 1, 4, 4),
                Some(("True", "ReplicaSetUpdated")),
                None,
            ),
            (
                "stuck within the deadline",
                false,
                Some(cond("True", "ReplicaSetUpdated", 100)),
                counts(5, 1, 4, 4),
                counts(5, 1, 4, 4),
                None,
                Some(500),
            ),
            (
                "stuck past the deadline",
                false,
                Some(cond("True", "ReplicaSetUpdated", 700)),
                counts(5, 1, 4, 4),
                counts(5, 1, 4, 4),
                Some(("False", "ProgressDeadlineExceeded")),
                None,
            ),
            (
                "timed out stays timed out",
                false,
                Some(cond("False", "ProgressDeadlineExceeded", 700)),
                counts(5, 1, 4, 4),
                counts(5, 1, 4, 4),
                None,
                None,
            ),
            (
                "progress after the deadline",
                false,
                Some(cond("False", "ProgressDeadlineExceeded", 700)),
                counts(5, 1, 4, 4),
                counts(5, 2, 4, 4),
                Some(("True", "ReplicaSetUpdated")),
                None,
            ),
            (
                "paused",
                true,
                Some(cond("True", "ReplicaSetUpdated", 5)),
                counts(5, 1, 4, 4),
                counts(5, 1, 4, 4),
                Some(("Unknown", "DeploymentPaused")),
                None,
            ),
        ];
        for (what, paused, current, old, new, want, recheck) in cases {
            let rollout = Rollout {
                desired: 4,
                new_rs: "web-abc",
                paused,
                deadline_seconds: Some(600),
            };
            let (got, after) = progressing_condition(&rollout, current.as_ref(), &old, &new, now);
            let got_pair = got
                .as_ref()
                .map(|c| (c.status.as_str(), c.reason.as_deref().unwrap_or_default()));
            assert_eq!(got_pair, want, "{what}");
            assert_eq!(after.map(|d| d.as_secs()), recheck, "{what}: recheck");
            if let (Some(got), Some(cur)) = (&got, &current) {
                let kept = got.last_transition_time == cur.last_transition_time;
                assert_eq!(
                    kept,
                    got.status == cur.status,
                    "{what}: transition time moves only with the status"
                );
                assert_eq!(got.last_update_time, Some(Time(now)), "{what}: update time");
            }
        }
        let rollout = Rollout {
            desired: 4,
            new_rs: "web-abc",
            paused: false,
            deadline_seconds: Some(600),
        };
        let (done, _) = progressing_condition(
            &rollout,
            None,
            &counts(4, 4, 4, 4),
            &counts(4, 4, 4, 4),
            now,
        );
        assert_eq!(
            done.unwrap().message.as_deref(),
            Some("ReplicaSet \"web-abc\" has successfully progressed.")
        );
    }
}
