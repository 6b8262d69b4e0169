//! What one sync of a Job decides, as kube-controller-manager's job controller does: which
//! pods to create (with which completion index) or delete, the status to write before the
//! tracking finalizers are removed, and the terminal condition to add after.
//!
//! Pods carry the `batch.kubernetes.io/job-tracking` finalizer from their creation. A finished
//! pod is first recorded by UID in `status.uncountedTerminatedPods`, then its finalizer is
//! removed, then it moves into the `succeeded`/`failed` counters ([`settle`]). A pod deleted by
//! anyone (a provider, an eviction) is therefore counted exactly once, and a crash between any
//! two steps loses or double-counts nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::batch::v1::{
    Job, JobCondition, JobSpec, JobStatus, PodFailurePolicy, UncountedTerminatedPods,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::controllers::availability::{is_active, is_ready};
use crate::controllers::replicaset::deletion_rank;

/// Finalizer the controller puts on every pod it creates, removed once the pod is counted.
pub const TRACKING_FINALIZER: &str = "batch.kubernetes.io/job-tracking";
/// Annotation and label carrying an Indexed Job pod's completion index.
pub const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";
/// Environment variable an Indexed Job pod reads its index from.
pub const COMPLETION_INDEX_ENV: &str = "JOB_COMPLETION_INDEX";
/// At most this many pods are created or deleted in one sync (upstream's
/// MaxPodCreateDeletePerSync).
pub const MAX_CREATE_DELETE: usize = 500;
/// At most this many pods wait in `uncountedTerminatedPods` (upstream's MaxUncountedPods).
pub const MAX_UNCOUNTED: usize = 500;
/// Delay before replacing the first failed pod, doubling per consecutive failure. Upstream
/// waits 10 s to 10 min; the lab scales it down tenfold, as the hollow kubelet does its
/// restart back-off.
pub const POD_FAILURE_BACKOFF: Duration = Duration::from_secs(1);
/// The longest pod-failure delay (see [`POD_FAILURE_BACKOFF`]).
pub const MAX_POD_FAILURE_BACKOFF: Duration = Duration::from_secs(60);

/// Why a Job cannot be run as it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    /// No `spec.selector`: the API server generates one; without it no pod can be told apart.
    #[error("spec.selector is missing (the API server generates it unless manualSelector is set)")]
    NoSelector,
    /// An Indexed Job needs `spec.completions`.
    #[error("spec.completions is required for completionMode Indexed")]
    IndexedWithoutCompletions,
    /// Neither NonIndexed nor Indexed.
    #[error("spec.completionMode {0:?} is not NonIndexed or Indexed")]
    UnknownCompletionMode(String),
}

/// A pod to delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deletion {
    /// Pod name.
    pub name: String,
    /// Whether its tracking finalizer goes first, so it is never counted (surplus or
    /// suspended pods); pods of a finished Job keep it and are counted as failed.
    pub untrack: bool,
    /// Whether it was Ready (for the `ready` count if the deletion fails).
    pub ready: bool,
}

impl Deletion {
    fn of(pod: &Pod, untrack: bool) -> Deletion {
        Deletion {
            name: pod.metadata.name.clone().unwrap_or_default(),
            untrack,
            ready: is_ready(pod),
        }
    }
}

/// An event to publish about the Job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// Warning (true) or Normal.
    pub warning: bool,
    /// Event reason.
    pub reason: &'static str,
    /// Event message.
    pub message: String,
}

/// The outcome of [`plan`].
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// One entry per pod to create: its completion index (Indexed Jobs) or None.
    pub create: Vec<Option<i32>>,
    /// Pods to delete.
    pub delete: Vec<Deletion>,
    /// The status to write before finalizers are removed (new uncounted pods, interim
    /// FailureTarget/SuccessCriteriaMet conditions, active/ready/terminating).
    pub status: JobStatus,
    /// Pods (name, uid) whose tracking finalizer can go once `status` is written.
    pub untrack: Vec<(String, String)>,
    /// UIDs of pods that carry the tracking finalizer now.
    pub tracked: BTreeSet<String>,
    /// The terminal condition (Complete or Failed) to add once nothing is uncounted and no
    /// pod is terminating.
    pub finished: Option<JobCondition>,
    /// Pods being deleted that have not reached a terminal phase.
    pub terminating: i32,
    /// Events other than pod creation/deletion (Suspended, Resumed).
    pub notes: Vec<Note>,
    /// When to look again (activeDeadlineSeconds, pod-failure back-off).
    pub requeue: Option<Duration>,
}

/// The spec values a sync works with, defaulted as the API server would.
#[derive(Debug, Clone)]
struct Shape<'a> {
    completions: Option<i32>,
    parallelism: i32,
    backoff_limit: i32,
    indexed: bool,
    suspended: bool,
    policy: Option<&'a PodFailurePolicy>,
    only_replace_failed: bool,
}

fn shape(spec: &JobSpec) -> Result<Shape<'_>, Invalid> {
    if spec.selector.is_none() {
        return Err(Invalid::NoSelector);
    }
    let indexed = match spec.completion_mode.as_deref() {
        None | Some("NonIndexed") => false,
        Some("Indexed") => true,
        Some(other) => return Err(Invalid::UnknownCompletionMode(other.to_string())),
    };
    // The API server defaults both to 1 when neither is set.
    let completions = match (spec.completions, spec.parallelism) {
        (None, None) => Some(1),
        (c, _) => c,
    };
    if indexed && completions.is_none() {
        return Err(Invalid::IndexedWithoutCompletions);
    }
    Ok(Shape {
        completions,
        parallelism: spec.parallelism.unwrap_or(1).max(0),
        backoff_limit: spec.backoff_limit.unwrap_or(6),
        indexed,
        suspended: spec.suspend == Some(true),
        policy: spec.pod_failure_policy.as_ref(),
        only_replace_failed: spec.pod_failure_policy.is_some()
            || spec.pod_replacement_policy.as_deref() == Some("Failed"),
    })
}

fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref().and_then(|s| s.phase.as_deref())
}

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

fn tracked(pod: &Pod) -> bool {
    pod.metadata
        .finalizers
        .as_deref()
        .unwrap_or_default()
        .iter()
        .any(|f| f == TRACKING_FINALIZER)
}

/// The completion index a pod was created for, if it has a valid one.
pub fn completion_index(pod: &Pod) -> Option<i32> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(COMPLETION_INDEX)?
        .parse::<i32>()
        .ok()
        .filter(|i| *i >= 0)
}

/// Whether a pod counts as failed: Failed, or (unless only failed pods are replaced) being
/// deleted before it succeeded — an orphan that never gets to report.
fn is_failed(pod: &Pod, only_replace_failed: bool) -> bool {
    phase(pod) == Some("Failed")
        || (!only_replace_failed
            && pod.metadata.deletion_timestamp.is_some()
            && phase(pod) != Some("Succeeded"))
}

/// What the pod failure policy says of a failed pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyVerdict {
    /// No rule matched, or a Count rule: counts toward backoffLimit.
    Count,
    /// An Ignore rule matched: neither counted nor fatal.
    Ignore,
    /// A FailJob rule matched: the Job fails with this message.
    FailJob(String),
}

/// Matches a failed pod against the rules in order, as upstream's matchPodFailurePolicy.
pub fn match_failure_policy(policy: Option<&PodFailurePolicy>, pod: &Pod) -> PolicyVerdict {
    let Some(policy) = policy else {
        return PolicyVerdict::Count;
    };
    let status = pod.status.clone().unwrap_or_default();
    let ns = pod.metadata.namespace.as_deref().unwrap_or("");
    let name = pod.metadata.name.as_deref().unwrap_or("");
    for (index, rule) in policy.rules.iter().enumerate() {
        let matched = if let Some(req) = &rule.on_exit_codes {
            let containers = status.container_statuses.iter().flatten();
            let inits = status.init_container_statuses.iter().flatten();
            containers.chain(inits).find_map(|c| {
                let code = c.state.as_ref()?.terminated.as_ref()?.exit_code;
                let named = req.container_name.as_ref().is_none_or(|n| *n == c.name);
                let listed = req.values.contains(&code);
                let hit = match req.operator.as_str() {
                    "In" => listed,
                    "NotIn" => !listed,
                    _ => false,
                };
                (named && code != 0 && hit).then(|| {
                    format!(
                        "Container {} for pod {ns}/{name} failed with exit code {code} matching {} rule at index {index}",
                        c.name, rule.action
                    )
                })
            })
        } else if let Some(patterns) = &rule.on_pod_conditions {
            status.conditions.iter().flatten().find_map(|c| {
                patterns
                    .iter()
                    .any(|p| p.type_ == c.type_ && p.status == c.status)
                    .then(|| {
                        format!(
                            "Pod {ns}/{name} has condition {} matching {} rule at index {index}",
                            c.type_, rule.action
                        )
                    })
            })
        } else {
            None
        };
        if let Some(message) = matched {
            match rule.action.as_str() {
                "Ignore" => return PolicyVerdict::Ignore,
                "Count" => return PolicyVerdict::Count,
                "FailJob" => return PolicyVerdict::FailJob(message),
                // FailIndex needs backoffLimitPerIndex, which the lab does not run.
                _ => {}
            }
        }
    }
    PolicyVerdict::Count
}

/// Completed indexes as upstream writes them: `0-2,4,6,7` (two adjacent indexes are listed,
/// three or more become a range).
pub fn format_indexes(indexes: &BTreeSet<i32>) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut iter = indexes.iter().copied().peekable();
    while let Some(first) = iter.next() {
        let mut last = first;
        while iter.peek() == Some(&(last + 1)) {
            last = iter.next().unwrap_or(last);
        }
        parts.push(match last - first {
            0 => first.to_string(),
            1 => format!("{first},{last}"),
            _ => format!("{first}-{last}"),
        });
    }
    parts.join(",")
}

/// Parses `status.completedIndexes`, keeping indexes below `completions` (corrupt intervals
/// are skipped, as upstream does).
pub fn parse_indexes(text: &str, completions: i32) -> BTreeSet<i32> {
    let mut out = BTreeSet::new();
    for part in text.split(',').filter(|p| !p.is_empty()) {
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<i32>(), b.parse::<i32>()),
            None => (part.parse::<i32>(), part.parse::<i32>()),
        };
        if let (Ok(first), Ok(last)) = (first, last) {
            out.extend((first.max(0)..=last.min(completions - 1)).take(1_000_000));
        }
    }
    out
}

/// The first `count` indexes below `completions` neither succeeded nor held by an active pod.
pub fn pending_indexes(
    succeeded: &BTreeSet<i32>,
    active: &BTreeSet<i32>,
    count: usize,
    completions: i32,
) -> Vec<i32> {
    (0..completions)
        .filter(|i| !succeeded.contains(i) && !active.contains(i))
        .take(count)
        .collect()
}

fn condition(type_: &str, reason: &str, message: &str, now: Timestamp) -> JobCondition {
    JobCondition {
        type_: type_.into(),
        status: "True".into(),
        reason: (!reason.is_empty()).then(|| reason.to_string()),
        message: (!message.is_empty()).then(|| message.to_string()),
        last_probe_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    }
}

fn find<'a>(conditions: &'a [JobCondition], type_: &str) -> Option<&'a JobCondition> {
    conditions
        .iter()
        .find(|c| c.type_ == type_ && c.status == "True")
}

/// Whether the Job has its Complete or Failed condition.
pub fn is_finished(job: &Job) -> bool {
    finished_type(job).is_some()
}

/// `Complete` or `Failed` once the Job has finished.
pub fn finished_type(job: &Job) -> Option<&str> {
    let conditions = job.status.as_ref()?.conditions.as_deref()?;
    conditions
        .iter()
        .find(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        .map(|c| c.type_.as_str())
}

/// Upserts a condition as upstream's ensureJobConditionStatus: a False condition is never
/// added, only set. Returns whether the list changed.
fn ensure_condition(
    conditions: &mut Vec<JobCondition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> bool {
    let mut fresh = condition(type_, reason, message, now);
    fresh.status = status.into();
    if let Some(c) = conditions.iter_mut().find(|c| c.type_ == type_) {
        if c.status != status
            || c.reason.as_deref().unwrap_or("") != reason
            || c.message.as_deref().unwrap_or("") != message
        {
            *c = fresh;
            return true;
        }
        return false;
    }
    if status != "False" {
        conditions.push(fresh);
        return true;
    }
    false
}

/// When a finished pod finished: its containers' latest finish, else when it stopped being
/// Ready, else its deletion, else its creation (upstream's getFinishedTime).
fn finished_at(pod: &Pod) -> Option<Timestamp> {
    let status = pod.status.as_ref();
    let containers: Option<Vec<Timestamp>> = status
        .and_then(|s| s.container_statuses.as_ref())
        .filter(|cs| !cs.is_empty())
        .and_then(|cs| {
            cs.iter()
                .map(|c| {
                    c.state
                        .as_ref()?
                        .terminated
                        .as_ref()?
                        .finished_at
                        .as_ref()
                        .map(|t| t.0)
                })
                .collect()
        });
    if let Some(max) = containers.and_then(|ts| ts.into_iter().max()) {
        return Some(max);
    }
    let unready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.type_ == "Ready" && c.status == "False")
        })
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0);
    unready
        .or_else(|| pod.metadata.deletion_timestamp.as_ref().map(|t| t.0))
        .or_else(|| pod.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// How long to wait before creating a replacement, from the failures since the last success
/// among the pods still present (upstream keeps the same count in memory).
pub fn failure_backoff(pods: &[Pod], only_replace_failed: bool, now: Timestamp) -> Duration {
    let mut finished: Vec<(Timestamp, bool)> = pods
        .iter()
        .filter_map(|p| {
            let ok = phase(p) == Some("Succeeded");
            (ok || is_failed(p, only_replace_failed)).then(|| (finished_at(p), ok))
        })
        .filter_map(|(t, ok)| t.map(|t| (t, ok)))
        .collect();
    finished.sort();
    let failures: Vec<Timestamp> = finished
        .iter()
        .rev()
        .take_while(|(_, ok)| !ok)
        .map(|(t, _)| *t)
        .collect();
    let Some(last) = failures.first() else {
        return Duration::ZERO;
    };
    let mut delay = POD_FAILURE_BACKOFF;
    for _ in 1..failures.len() {
        delay = (delay * 2).min(MAX_POD_FAILURE_BACKOFF);
    }
    let elapsed = Duration::try_from(now.duration_since(*last)).unwrap_or_default();
    delay.saturating_sub(elapsed)
}

/// Whether the container restarts of running pods reach backoffLimit (OnFailure pods restart
/// in place, so their failures show only as restarts).
fn past_backoff_on_failure(spec: &JobSpec, pods: &[Pod], limit: i32) -> bool {
    let on_failure = spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        == Some("OnFailure");
    if !on_failure {
        return false;
    }
    let restarts: i32 = pods
        .iter()
        .filter(|p| matches!(phase(p), Some("Running" | "Pending")))
        .filter_map(|p| p.status.as_ref())
        .flat_map(|s| {
            s.container_statuses
                .iter()
                .flatten()
                .chain(s.init_container_statuses.iter().flatten())
        })
        .map(|c| c.restart_count)
        .sum();
    if limit == 0 {
        restarts > 0
    } else {
        restarts >= limit
    }
}

/// Decides one sync of `job` over the pods it owns (`pods`, deleted ones included), at `now`.
pub fn plan(job: &Job, pods: &[Pod], now: Timestamp) -> Result<Plan, Invalid> {
    let spec = job.spec.clone().unwrap_or_default();
    let shape = shape(&spec)?;
    let mut status = job.status.clone().unwrap_or_default();
    let mut out = Plan::default();
    let deleting = job.metadata.deletion_timestamp.is_some();

    let uncounted = status.uncounted_terminated_pods.clone().unwrap_or_default();
    let mut uncounted_ok: Vec<String> = uncounted.succeeded.unwrap_or_default();
    let mut uncounted_failed: Vec<String> = uncounted.failed.unwrap_or_default();
    out.tracked = pods.iter().filter(|p| tracked(p)).map(uid).collect();
    // Pods recorded in a previous sync whose finalizer is gone move into the counters.
    move_counted(
        &mut status,
        &mut uncounted_ok,
        &mut uncounted_failed,
        &out.tracked,
    );
    let was_ok: BTreeSet<String> = uncounted_ok.iter().cloned().collect();
    let was_failed: BTreeSet<String> = uncounted_failed.iter().cloned().collect();

    let in_range = |p: &Pod| {
        !shape.indexed || completion_index(p).is_some_and(|i| i < shape.completions.unwrap_or(0))
    };
    let fresh = |p: &&Pod| {
        let u = uid(p);
        tracked(p) && !was_ok.contains(&u) && !was_failed.contains(&u) && in_range(p)
    };
    let new_ok = pods
        .iter()
        .filter(fresh)
        .filter(|p| phase(p) == Some("Succeeded"))
        .count();
    let new_failed = pods
        .iter()
        .filter(fresh)
        .filter(|p| is_failed(p, shape.only_replace_failed))
        .filter(|p| match_failure_policy(shape.policy, p) != PolicyVerdict::Ignore)
        .count();
    let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    let mut succeeded = status.succeeded.unwrap_or(0) + count(new_ok) + count(uncounted_ok.len());
    let failed = status.failed.unwrap_or(0) + count(new_failed) + count(uncounted_failed.len());

    let active_pods: Vec<&Pod> = pods.iter().filter(|p| is_active(p)).collect();
    let mut active = count(active_pods.len());
    let mut ready = count(active_pods.iter().filter(|p| is_ready(p)).count());
    let mut terminating = count(
        pods.iter()
            .filter(|p| p.metadata.deletion_timestamp.is_some())
            .filter(|p| !matches!(phase(p), Some("Succeeded" | "Failed")))
            .count(),
    );

    if status.start_time.is_none() && !shape.suspended {
        status.start_time = Some(Time(now));
    }

    let mut conditions = status.conditions.clone().unwrap_or_default();
    let mut finished: Option<JobCondition> = find(&conditions, "SuccessCriteriaMet").cloned();
    if finished.is_none() {
        finished = find(&conditions, "FailureTarget").cloned().or_else(|| {
            pods.iter()
                .filter(|p| is_failed(p, shape.only_replace_failed))
                .find_map(|p| match match_failure_policy(shape.policy, p) {
                    PolicyVerdict::FailJob(m) => Some(m),
                    _ => None,
                })
                .map(|m| condition("FailureTarget", "PodFailurePolicy", &m, now))
        });
    }
    if finished.is_none() {
        let deadline = spec
            .active_deadline_seconds
            .filter(|_| !shape.suspended)
            .zip(status.start_time.as_ref())
            .map(|(secs, start)| start.0 + SignedDuration::from_secs(secs));
        if failed > shape.backoff_limit || past_backoff_on_failure(&spec, pods, shape.backoff_limit)
        {
            finished = Some(condition(
                "FailureTarget",
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit",
                now,
            ));
        } else if deadline.is_some_and(|d| d <= now) {
            finished = Some(condition(
                "FailureTarget",
                "DeadlineExceeded",
                "Job was active longer than specified deadline",
                now,
            ));
        } else if let Some(d) = deadline {
            out.requeue = Duration::try_from(d.duration_since(now)).ok();
        }
    }

    let completions = shape.completions.unwrap_or(0);
    let mut ok_indexes = BTreeSet::new();
    if shape.indexed {
        ok_indexes = parse_indexes(
            status.completed_indexes.as_deref().unwrap_or(""),
            completions,
        );
        let prev = ok_indexes.clone();
        ok_indexes.extend(
            pods.iter()
                .filter(|p| phase(p) == Some("Succeeded") && tracked(p))
                .filter_map(completion_index)
                .filter(|i| *i < completions),
        );
        succeeded = count(ok_indexes.len());
        // Only the previous ones are in the status yet; the pods' are added below.
        ok_indexes = prev;
    }

    if finished.is_some() {
        // Active pods of a finished Job go, keeping their finalizer: they are counted failed.
        out.delete
            .extend(active_pods.iter().map(|p| Deletion::of(p, false)));
        ready = 0;
        terminating += active;
        active = 0;
    } else {
        let manage = !deleting;
        if manage {
            if shape.suspended {
                out.delete
                    .extend(active_pods.iter().map(|p| Deletion::of(p, true)));
                ready = 0;
                terminating += active;
                active = 0;
            } else {
                let want = match shape.completions {
                    None if succeeded > 0 => active,
                    None => shape.parallelism,
                    Some(c) => (c - succeeded).clamp(0, shape.parallelism),
                };
                let surplus = usize::try_from(active - want).unwrap_or(0);
                let victims = removal_candidates(&shape, &active_pods, surplus);
                if !victims.is_empty() {
                    for p in victims.into_iter().take(MAX_CREATE_DELETE) {
                        active -= 1;
                        terminating += 1;
                        if is_ready(p) {
                            ready -= 1;
                        }
                        out.delete.push(Deletion::of(p, true));
                    }
                } else {
                    let held = if shape.only_replace_failed {
                        terminating
                    } else {
                        0
                    };
                    let diff = usize::try_from(want - held - active).unwrap_or(0);
                    if diff > 0 {
                        let wait = failure_backoff(pods, shape.only_replace_failed, now);
                        if wait > Duration::ZERO {
                            out.requeue = Some(out.requeue.map_or(wait, |r| r.min(wait)));
                        } else {
                            let diff = diff.min(MAX_CREATE_DELETE);
                            out.create = if shape.indexed {
                                let held: BTreeSet<i32> = active_pods
                                    .iter()
                                    .filter_map(|p| completion_index(p))
                                    .collect();
                                let mut done = ok_indexes.clone();
                                done.extend(
                                    pods.iter()
                                        .filter(|p| phase(p) == Some("Succeeded") && tracked(p))
                                        .filter_map(completion_index),
                                );
                                pending_indexes(&done, &held, diff, completions)
                                    .into_iter()
                                    .map(Some)
                                    .collect()
                            } else {
                                vec![None; diff]
                            };
                            active += count(out.create.len());
                        }
                    }
                }
            }
        }
        let complete = match shape.completions {
            None => succeeded > 0 && active == 0,
            Some(c) => succeeded >= c && active == 0,
        };
        if complete {
            finished = Some(condition("SuccessCriteriaMet", "", "", now));
        } else if manage && shape.suspended {
            if ensure_condition(
                &mut conditions,
                "Suspended",
                "True",
                "JobSuspended",
                "Job suspended",
                now,
            ) {
                out.notes.push(Note {
                    warning: false,
                    reason: "Suspended",
                    message: "Job suspended".into(),
                });
            }
        } else if manage
            && ensure_condition(
                &mut conditions,
                "Suspended",
                "False",
                "JobResumed",
                "Job resumed",
                now,
            )
        {
            out.notes.push(Note {
                warning: false,
                reason: "Resumed",
                message: "Job resumed".into(),
            });
            // activeDeadlineSeconds counts continuous activity: it restarts on resume.
            status.start_time = Some(Time(now));
        }
    }

    // Record finished pods by UID (or completed index), then let their finalizers go.
    let finishing_failed = finished
        .as_ref()
        .is_some_and(|c| c.type_ != "SuccessCriteriaMet");
    let mut new_indexes = Vec::new();
    let mut capped = false;
    for p in pods.iter().filter(|p| tracked(p)) {
        let u = uid(p);
        let failed_pod = is_failed(p, shape.only_replace_failed);
        let succeeded_pod = phase(p) == Some("Succeeded");
        if !(deleting || finished.is_some() || succeeded_pod || failed_pod) {
            continue;
        }
        out.untrack
            .push((p.metadata.name.clone().unwrap_or_default(), u.clone()));
        if succeeded_pod && !was_failed.contains(&u) {
            if shape.indexed {
                if let Some(i) = completion_index(p).filter(|i| *i < completions)
                    && !ok_indexes.contains(&i)
                {
                    new_indexes.push(i);
                }
            } else if !uncounted_ok.contains(&u) {
                uncounted_ok.push(u);
            }
        } else if (failed_pod || finishing_failed)
            && !uncounted_failed.contains(&u)
            && in_range(p)
            && match_failure_policy(shape.policy, p) != PolicyVerdict::Ignore
        {
            uncounted_failed.push(u);
        }
        if new_indexes.len() + uncounted_ok.len() + uncounted_failed.len() >= MAX_UNCOUNTED {
            capped = true;
            break;
        }
    }
    if shape.indexed {
        ok_indexes.extend(new_indexes);
        status.succeeded = Some(count(ok_indexes.len()));
        status.completed_indexes = Some(format_indexes(&ok_indexes));
    }
    match &finished {
        Some(c) if c.type_ == "FailureTarget" => {
            if find(&conditions, "FailureTarget").is_none() {
                conditions.push(c.clone());
            }
            let reason = c.reason.clone().unwrap_or_default();
            let message = c.message.clone().unwrap_or_default();
            out.finished = Some(condition("Failed", &reason, &message, now));
        }
        Some(c) if c.type_ == "SuccessCriteriaMet" => {
            if find(&conditions, "SuccessCriteriaMet").is_none() {
                conditions.push(c.clone());
            }
            let reason = c.reason.clone().unwrap_or_default();
            let message = c.message.clone().unwrap_or_default();
            out.finished = Some(condition("Complete", &reason, &message, now));
        }
        _ => {}
    }
    if capped {
        out.finished = None;
    }
    status.conditions = (!conditions.is_empty()).then_some(conditions);
    status.active = Some(active);
    status.ready = Some(ready.max(0));
    status.terminating = Some(terminating);
    status.uncounted_terminated_pods = Some(UncountedTerminatedPods {
        succeeded: (!uncounted_ok.is_empty()).then_some(uncounted_ok),
        failed: (!uncounted_failed.is_empty()).then_some(uncounted_failed),
    });
    out.terminating = terminating;
    out.status = status;
    Ok(out)
}

/// Pods to delete when `surplus` active pods are too many: for Indexed Jobs first those
/// with a repeated, missing or out-of-range index; then in the order kube deletes surplus
/// pods (unscheduled, pending, not ready first).
fn removal_candidates<'a>(shape: &Shape, active: &[&'a Pod], surplus: usize) -> Vec<&'a Pod> {
    let mut remove: Vec<&Pod> = Vec::new();
    let mut keep: Vec<&Pod> = Vec::new();
    if shape.indexed {
        let mut by_index: BTreeMap<i32, Vec<&Pod>> = BTreeMap::new();
        for p in active {
            match completion_index(p).filter(|i| *i < shape.completions.unwrap_or(0)) {
                Some(i) => by_index.entry(i).or_default().push(p),
                None => remove.push(p),
            }
        }
        for (_, mut same) in by_index {
            same.sort_by_key(|p| deletion_rank(p));
            let last = same.pop();
            remove.extend(same);
            keep.extend(last);
        }
    } else {
        keep = active.to_vec();
    }
    if remove.len() < surplus {
        keep.sort_by_key(|p| deletion_rank(p));
        let more = surplus - remove.len();
        remove.extend(keep.into_iter().take(more));
    }
    remove
}

/// Moves UIDs that no longer carry the finalizer out of `uncountedTerminatedPods` into the
/// counters.
fn move_counted(
    status: &mut JobStatus,
    ok: &mut Vec<String>,
    failed: &mut Vec<String>,
    tracked: &BTreeSet<String>,
) {
    let before = (ok.len(), failed.len());
    ok.retain(|u| tracked.contains(u));
    failed.retain(|u| tracked.contains(u));
    let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    if before.0 != ok.len() {
        status.succeeded = Some(status.succeeded.unwrap_or(0) + count(before.0 - ok.len()));
    }
    if before.1 != failed.len() {
        status.failed = Some(status.failed.unwrap_or(0) + count(before.1 - failed.len()));
    }
}

/// The status after the finalizers of the pods in `tracked` are all that remain: counted
/// pods leave `uncountedTerminatedPods`, and once none is left and no pod is terminating the
/// terminal condition is added. Returns the status and whether the Job finished now.
pub fn settle(
    mut status: JobStatus,
    tracked: &BTreeSet<String>,
    finished: Option<&JobCondition>,
    terminating: i32,
    now: Timestamp,
) -> (JobStatus, bool) {
    let uncounted = status.uncounted_terminated_pods.clone().unwrap_or_default();
    let mut ok = uncounted.succeeded.unwrap_or_default();
    let mut failed = uncounted.failed.unwrap_or_default();
    move_counted(&mut status, &mut ok, &mut failed, tracked);
    let done = finished.is_some() && ok.is_empty() && failed.is_empty() && terminating == 0;
    status.uncounted_terminated_pods = Some(UncountedTerminatedPods {
        succeeded: (!ok.is_empty()).then_some(ok),
        failed: (!failed.is_empty()).then_some(failed),
    });
    if let (true, Some(c)) = (done, finished) {
        let mut conditions = status.conditions.take().unwrap_or_default();
        ensure_condition(
            &mut conditions,
            &c.type_,
            "True",
            c.reason.as_deref().unwrap_or(""),
            c.message.as_deref().unwrap_or(""),
            now,
        );
        status.conditions = Some(conditions);
        if c.type_ == "Complete" {
            status.completion_time = Some(Time(now));
        }
    }
    (status, done)
}

/// A status with zero counters written as absent, so a status read back compares equal to
/// the one computed.
pub fn normalized(status: &JobStatus) -> serde_json::Value {
    let mut s = status.clone();
    for field in [&mut s.active, &mut s.succeeded, &mut s.failed] {
        if *field == Some(0) {
            *field = None;
        }
    }
    if s.completed_indexes.as_deref() == Some("") {
        s.completed_indexes = None;
    }
    if s.uncounted_terminated_pods == Some(UncountedTerminatedPods::default()) {
        s.uncounted_terminated_pods = None;
    }
    serde_json::to_value(s).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// The terminal condition a case expects: (type, reason).
    type Finish = Option<(&'static str, &'static str)>;
    /// (what, spec, status, pods, pods created, terminal condition)
    type CreateCase = (&'static str, Value, Value, Vec<Pod>, usize, Finish);
    /// (what, spec, pods, now, terminal condition, pods deleted)
    type FailCase = (&'static str, Value, Vec<Pod>, i64, Finish, usize);

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    /// A Job with a selector, started at `at(0)`, and `spec` merged in.
    fn job(spec: Value, status: Value) -> Job {
        let mut full = json!({
            "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "j"}},
            "template": {"spec": {"restartPolicy": "Never", "containers": []}},
            "backoffLimit": 6,
        });
        for (k, v) in spec.as_object().cloned().unwrap_or_default() {
            full[k] = v;
        }
        let mut st = json!({"startTime": at(0).to_string()});
        for (k, v) in status.as_object().cloned().unwrap_or_default() {
            st[k] = v;
        }
        serde_json::from_value(
            json!({"metadata": {"name": "pi", "namespace": "ns", "uid": "j"},
                                      "spec": full, "status": st}),
        )
        .unwrap()
    }

    /// A tracked pod in `phase`, finished (if terminal) at `finished`, exiting with `code`.
    fn pod(name: &str, phase: &str, finished: i64, code: i32) -> Pod {
        let terminal = matches!(phase, "Succeeded" | "Failed");
        let state = if terminal {
            json!({"terminated": {"exitCode": code, "finishedAt": at(finished).to_string()}})
        } else {
            json!({"running": {}})
        };
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                         "finalizers": [TRACKING_FINALIZER],
                         "creationTimestamp": at(0).to_string()},
            "spec": {"containers": [{"name": "main"}]},
            "status": {"phase": phase, "containerStatuses": [
                {"name": "main", "image": "x", "imageID": "", "ready": !terminal,
                 "restartCount": 0, "state": state}]},
        }))
        .unwrap()
    }

    fn indexed(mut p: Pod, index: i32) -> Pod {
        p.metadata.annotations = Some([(COMPLETION_INDEX.to_string(), index.to_string())].into());
        p
    }

    fn untracked(mut p: Pod) -> Pod {
        p.metadata.finalizers = None;
        p
    }

    fn with_condition(mut p: Pod, type_: &str) -> Pod {
        let c = serde_json::from_value(json!({"type": type_, "status": "True"})).unwrap();
        p.status.as_mut().unwrap().conditions = Some(vec![c]);
        p
    }

    fn reason_of(plan: &Plan) -> Option<(String, String)> {
        plan.finished
            .as_ref()
            .map(|c| (c.type_.clone(), c.reason.clone().unwrap_or_default()))
    }

    #[test]
    fn pods_are_created_up_to_parallelism_and_remaining_completions() {
        // (what, spec, status, pods, pods created, terminal condition)
        let ok = |n: &str| pod(n, "Succeeded", 1, 0);
        let run = |n: &str| pod(n, "Running", 0, 0);
        let cases: Vec<CreateCase> = vec![
            (
                "fresh",
                json!({"completions": 5, "parallelism": 2}),
                json!({}),
                vec![],
                2,
                None,
            ),
            (
                "one completion left",
                json!({"completions": 5, "parallelism": 2}),
                json!({"succeeded": 4}),
                vec![],
                1,
                None,
            ),
            (
                "a finished pod is replaced",
                json!({"completions": 5, "parallelism": 2}),
                json!({}),
                vec![ok("a"), run("b")],
                1,
                None,
            ),
            (
                "all done",
                json!({"completions": 2, "parallelism": 2}),
                json!({"succeeded": 1}),
                vec![ok("a")],
                0,
                Some(("Complete", "")),
            ),
            (
                "neither set: one pod",
                json!({}),
                json!({}),
                vec![],
                1,
                None,
            ),
            (
                "work queue: parallelism pods",
                json!({"parallelism": 3}),
                json!({}),
                vec![],
                3,
                None,
            ),
            (
                "work queue: one success stops new pods, waits for the rest",
                json!({"parallelism": 3}),
                json!({}),
                vec![ok("a"), run("b")],
                0,
                None,
            ),
            (
                "work queue: one success and none running completes",
                json!({"parallelism": 3}),
                json!({}),
                vec![ok("a")],
                0,
                Some(("Complete", "")),
            ),
            (
                "parallelism 0 runs nothing",
                json!({"completions": 3, "parallelism": 0}),
                json!({}),
                vec![],
                0,
                None,
            ),
        ];
        for (what, spec, status, pods, creates, finished) in cases {
            let plan = plan(&job(spec, status), &pods, at(10)).unwrap();
            assert_eq!(plan.create.len(), creates, "{what}");
            let want = finished.map(|(t, r)| (t.to_string(), r.to_string()));
            assert_eq!(reason_of(&plan), want, "{what}");
        }
    }

    #[test]
    fn failures_beyond_backoff_limit_or_deadline_fail_the_job() {
        let failed = |n: &str| pod(n, "Failed", 1, 1);
        let run = |n: &str| pod(n, "Running", 0, 0);
        let mut restarted = run("r");
        restarted
            .status
            .as_mut()
            .unwrap()
            .container_statuses
            .as_mut()
            .unwrap()[0]
            .restart_count = 2;
        // (what, spec, pods, now, terminal condition, pods deleted)
        let cases: Vec<FailCase> = vec![
            (
                "within the limit",
                json!({"completions": 3, "backoffLimit": 2}),
                vec![failed("a"), failed("b")],
                100,
                None,
                0,
            ),
            (
                "over the limit",
                json!({"completions": 3, "parallelism": 2, "backoffLimit": 2}),
                vec![failed("a"), failed("b"), failed("c"), run("d")],
                100,
                Some(("Failed", "BackoffLimitExceeded")),
                1,
            ),
            (
                "limit zero",
                json!({"backoffLimit": 0}),
                vec![failed("a")],
                100,
                Some(("Failed", "BackoffLimitExceeded")),
                0,
            ),
            (
                "OnFailure restarts count",
                json!({"backoffLimit": 2,
                       "template": {"spec": {"restartPolicy": "OnFailure", "containers": []}}}),
                vec![restarted.clone()],
                100,
                Some(("Failed", "BackoffLimitExceeded")),
                1,
            ),
            (
                "restarts under Never do not",
                json!({"backoffLimit": 2}),
                vec![restarted],
                100,
                None,
                0,
            ),
            (
                "past activeDeadlineSeconds",
                json!({"activeDeadlineSeconds": 60}),
                vec![run("a")],
                61,
                Some(("Failed", "DeadlineExceeded")),
                1,
            ),
        ];
        for (what, spec, pods, now, finished, deleted) in cases {
            let plan = plan(&job(spec, json!({})), &pods, at(now)).unwrap();
            let want = finished.map(|(t, r)| (t.to_string(), r.to_string()));
            assert_eq!(reason_of(&plan), want, "{what}");
            assert_eq!(plan.delete.len(), deleted, "{what}");
            assert!(
                plan.delete.iter().all(|d| !d.untrack),
                "{what}: counted as failed"
            );
            if let Some((_, reason)) = finished {
                let target = plan.status.conditions.as_ref().unwrap();
                assert!(
                    target
                        .iter()
                        .any(|c| c.type_ == "FailureTarget" && c.reason.as_deref() == Some(reason)),
                    "{what}: FailureTarget first"
                );
                assert!(plan.create.is_empty(), "{what}");
            }
        }
    }

    #[test]
    fn deadlines_and_failure_back_off_ask_to_look_again() {
        let plan_at = |spec: Value, pods: Vec<Pod>, now: i64| {
            plan(&job(spec, json!({})), &pods, at(now)).unwrap()
        };
        let p = plan_at(json!({"activeDeadlineSeconds": 60}), vec![], 20);
        assert_eq!(p.requeue, Some(Duration::from_secs(40)));
        // One failure 0 s ago: wait 1 s; three consecutive failures: 4 s.
        let p = plan_at(
            json!({"completions": 3}),
            vec![pod("a", "Failed", 10, 1)],
            10,
        );
        assert!(p.create.is_empty());
        assert_eq!(p.requeue, Some(Duration::from_secs(1)));
        let three = vec![
            pod("a", "Failed", 8, 1),
            pod("b", "Failed", 9, 1),
            pod("c", "Failed", 10, 1),
        ];
        let p = plan_at(json!({"completions": 3}), three, 10);
        assert_eq!(p.requeue, Some(Duration::from_secs(4)));
        // A success after the failures resets the count.
        let mixed = vec![pod("a", "Failed", 8, 1), pod("b", "Succeeded", 9, 0)];
        let p = plan_at(json!({"completions": 3}), mixed, 9);
        assert_eq!(p.create.len(), 1);
    }

    #[test]
    fn indexed_jobs_create_the_lowest_pending_indexes() {
        let cases = [
            ("fresh", json!({}), vec![], vec![Some(0), Some(1)], ""),
            (
                "0 done, 1 running",
                json!({}),
                vec![
                    indexed(pod("a", "Succeeded", 1, 0), 0),
                    indexed(pod("b", "Running", 0, 0), 1),
                ],
                vec![Some(2)],
                "0",
            ),
            (
                "recorded indexes are not rerun",
                json!({"completedIndexes": "0,1", "succeeded": 2}),
                vec![],
                vec![Some(2), Some(3)],
                "0,1",
            ),
            (
                "a failed index is retried",
                json!({"completedIndexes": "0", "succeeded": 1}),
                vec![indexed(untracked(pod("b", "Failed", 0, 1)), 1)],
                vec![Some(1), Some(2)],
                "0",
            ),
        ];
        for (what, status, pods, creates, completed) in cases {
            let spec = json!({"completions": 4, "parallelism": 2, "completionMode": "Indexed"});
            let plan = plan(&job(spec, status), &pods, at(100)).unwrap();
            assert_eq!(plan.create, creates, "{what}");
            assert_eq!(
                plan.status.completed_indexes.as_deref(),
                Some(completed),
                "{what}"
            );
        }
        let mut idx = BTreeSet::new();
        assert_eq!(format_indexes(&idx), "");
        idx.extend([0, 1, 2, 4, 6, 7, 9]);
        assert_eq!(format_indexes(&idx), "0-2,4,6,7,9");
        assert_eq!(
            parse_indexes("0-2,4,6,7,9", 8),
            idx.into_iter().filter(|i| *i < 8).collect()
        );
        let dupes = vec![
            indexed(pod("a", "Running", 0, 0), 1),
            indexed(pod("b", "Running", 0, 0), 1),
            indexed(pod("c", "Running", 0, 0), 9),
        ];
        let spec = json!({"completions": 4, "parallelism": 4, "completionMode": "Indexed"});
        let plan = plan(&job(spec, json!({})), &dupes, at(100)).unwrap();
        assert_eq!(
            plan.delete.len(),
            2,
            "a repeated and an out-of-range index go"
        );
        assert!(plan.create.is_empty(), "deletions come first");
    }

    #[test]
    fn pod_failure_policy_fails_ignores_or_counts() {
        let policy = json!({"podFailurePolicy": {"rules": [
            {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}},
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            {"action": "Count", "onExitCodes": {"operator": "NotIn", "values": [42]}},
        ]}, "completions": 2, "backoffLimit": 0});
        // (what, pod, terminal condition, failed counted)
        let cases = [
            (
                "exit 42 fails the job",
                pod("a", "Failed", 0, 42),
                Some("PodFailurePolicy"),
                1,
            ),
            (
                "a disruption is ignored",
                with_condition(pod("a", "Failed", 0, 137), "DisruptionTarget"),
                None,
                0,
            ),
            (
                "exit 1 counts",
                pod("a", "Failed", 0, 1),
                Some("BackoffLimitExceeded"),
                1,
            ),
        ];
        for (what, p, reason, counted) in cases {
            let plan = plan(
                &job(policy.clone(), json!({})),
                std::slice::from_ref(&p),
                at(30),
            )
            .unwrap();
            assert_eq!(
                plan.finished.as_ref().and_then(|c| c.reason.as_deref()),
                reason,
                "{what}"
            );
            let uncounted = plan.status.uncounted_terminated_pods.clone().unwrap();
            assert_eq!(
                uncounted.failed.unwrap_or_default().len(),
                counted,
                "{what}"
            );
            assert_eq!(
                plan.untrack.len(),
                1,
                "{what}: the finalizer goes either way"
            );
        }
        let ignored = with_condition(pod("a", "Failed", 0, 137), "DisruptionTarget");
        let plan = plan(&job(policy, json!({})), &[ignored], at(30)).unwrap();
        assert_eq!(
            plan.create.len(),
            1,
            "an ignored failure is replaced at once"
        );
        assert_eq!(plan.requeue, None);
    }

    #[test]
    fn suspending_deletes_active_pods_untracked_and_resuming_restarts_the_clock() {
        let spec = json!({"completions": 3, "parallelism": 2, "suspend": true});
        let pods = [pod("a", "Running", 0, 0), pod("b", "Running", 0, 0)];
        let p = plan(&job(spec, json!({})), &pods, at(10)).unwrap();
        assert_eq!(p.delete.len(), 2);
        assert!(
            p.delete.iter().all(|d| d.untrack),
            "suspended pods are not failures"
        );
        assert!(p.create.is_empty());
        let suspended = p.status.conditions.clone().unwrap();
        assert!(
            suspended
                .iter()
                .any(|c| c.type_ == "Suspended" && c.status == "True")
        );
        assert_eq!(p.notes[0].reason, "Suspended");
        let spec = json!({"completions": 3, "parallelism": 2, "suspend": false});
        let status = json!({"conditions": [{"type": "Suspended", "status": "True"}]});
        let p = plan(&job(spec, status), &[], at(50)).unwrap();
        assert_eq!(p.create.len(), 2);
        assert_eq!(p.notes[0].reason, "Resumed");
        assert_eq!(p.status.start_time, Some(Time(at(50))));
    }

    #[test]
    fn finished_pods_are_counted_once_through_uncounted_uids() {
        let spec = json!({"completions": 3, "parallelism": 1});
        // Sync 1: a succeeded pod is recorded by UID and its finalizer may go.
        let ok = pod("a", "Succeeded", 1, 0);
        let p1 = plan(
            &job(spec.clone(), json!({})),
            std::slice::from_ref(&ok),
            at(5),
        )
        .unwrap();
        let uncounted = p1.status.uncounted_terminated_pods.clone().unwrap();
        assert_eq!(uncounted.succeeded, Some(vec!["uid-a".to_string()]));
        assert_eq!(
            p1.status.succeeded, None,
            "not counted before the finalizer goes"
        );
        assert_eq!(p1.untrack, vec![("a".to_string(), "uid-a".to_string())]);
        // The finalizer removal failed: settling keeps it uncounted.
        let (kept, _) = settle(p1.status.clone(), &p1.tracked, None, 0, at(5));
        assert_eq!(kept.succeeded, None);
        // It worked: counted.
        let (counted, _) = settle(p1.status.clone(), &BTreeSet::new(), None, 0, at(5));
        assert_eq!(counted.succeeded, Some(1));
        assert_eq!(counted.uncounted_terminated_pods, Some(Default::default()));
        // A crash after writing sync 1's status: the next sync neither loses nor repeats it.
        let recorded = serde_json::to_value(&p1.status).unwrap();
        let p2 = plan(
            &job(spec.clone(), recorded.clone()),
            std::slice::from_ref(&ok),
            at(6),
        )
        .unwrap();
        let again = p2.status.uncounted_terminated_pods.clone().unwrap();
        assert_eq!(again.succeeded, Some(vec!["uid-a".to_string()]));
        // The pod was deleted meanwhile (finalizer gone with it): counted at the next sync.
        let p3 = plan(&job(spec, recorded), &[], at(7)).unwrap();
        assert_eq!(p3.status.succeeded, Some(1));
        // A deleted pod that never finished counts as failed.
        let mut gone = pod("b", "Running", 0, 0);
        gone.metadata.deletion_timestamp = Some(Time(at(3)));
        let p4 = plan(&job(json!({"completions": 3}), json!({})), &[gone], at(8)).unwrap();
        let f = p4.status.uncounted_terminated_pods.clone().unwrap().failed;
        assert_eq!(f, Some(vec!["uid-b".to_string()]));
    }

    #[test]
    fn the_terminal_condition_waits_for_uncounted_and_terminating_pods() {
        let done = condition("Complete", "", "", at(1));
        let status: JobStatus = serde_json::from_value(json!({
            "uncountedTerminatedPods": {"succeeded": ["u1"]}, "succeeded": 2,
        }))
        .unwrap();
        let tracked: BTreeSet<String> = ["u1".to_string()].into();
        // (finalizer still on, terminating pods, finished now)
        let cases = [(true, 0, false), (false, 1, false), (false, 0, true)];
        for (still, terminating, want) in cases {
            let set = if still {
                tracked.clone()
            } else {
                BTreeSet::new()
            };
            let (s, finished) = settle(status.clone(), &set, Some(&done), terminating, at(2));
            assert_eq!(
                finished, want,
                "finalizer on {still}, terminating {terminating}"
            );
            assert_eq!(s.completion_time.is_some(), want);
            if want {
                assert_eq!(s.succeeded, Some(3));
            }
        }
    }

    #[test]
    fn jobs_without_a_selector_or_with_a_bad_mode_are_not_run() {
        let mut j = job(json!({}), json!({}));
        j.spec.as_mut().unwrap().selector = None;
        assert_eq!(plan(&j, &[], at(0)).unwrap_err(), Invalid::NoSelector);
        let j = job(
            json!({"completionMode": "Indexed", "parallelism": 2}),
            json!({}),
        );
        assert_eq!(
            plan(&j, &[], at(0)).unwrap_err(),
            Invalid::IndexedWithoutCompletions
        );
        let j = job(json!({"completionMode": "Sometimes"}), json!({}));
        assert!(matches!(
            plan(&j, &[], at(0)),
            Err(Invalid::UnknownCompletionMode(_))
        ));
    }
}
