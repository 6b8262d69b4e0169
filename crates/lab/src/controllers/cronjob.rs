//! The CronJob controller (upstream's cronjob_controllerv2): creates a Job per scheduled time
//! (`<cronjob>-<minutes since the epoch>`), honouring startingDeadlineSeconds, the
//! concurrency policy and suspend, keeps `status.active`/`lastScheduleTime`/
//! `lastSuccessfulTime`, and prunes finished Jobs beyond the history limits.
//!
//! Schedules are standard 5-field cron (and `@hourly`, `@daily`, ...) evaluated by `croner` in
//! `spec.timeZone` (from the system tz database), or UTC without one. The clock is an argument
//! of [`plan`] and of [`run_with_clock`], so schedules can be tested without waiting.

use std::sync::Arc;
use std::time::Duration;

use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use jiff::tz::TimeZone;
use k8s_openapi::api::batch::v1::{CronJob, CronJobStatus, Job};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tandem_api::client::{is_conflict, is_not_found};

use super::context::Context;
use super::error::{Error, StepExt, drain, key, retry_after_error};
use super::job::plan::Note;
use super::job::{finished_type, is_finished};
use super::owners::controller_of;

/// Annotation on a CronJob's Job: its scheduled time (RFC 3339, in the CronJob's time zone).
pub const SCHEDULED_TIMESTAMP: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";
/// How long after a scheduled time the controller looks again (upstream's nextScheduleDelta).
const NEXT_SCHEDULE_DELTA: Duration = Duration::from_millis(100);
/// More missed schedules than this are reported as TooManyMissedTimes.
const MANY_MISSED: i64 = 100;

/// Why a schedule cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// `TZ=` or `CRON_TZ=` in the schedule: kube rejects it in favour of spec.timeZone.
    #[error("cannot use TZ or CRON_TZ in schedule, use timeZone field instead")]
    TimeZoneInSchedule,
    /// spec.timeZone names no zone of the tz database.
    #[error("invalid timeZone: {zone:?}: {reason}")]
    UnknownTimeZone {
        /// The zone as written.
        zone: String,
        /// Why it was not found.
        reason: String,
    },
    /// Not a cron expression.
    #[error("unparseable schedule: {schedule:?} : {reason}")]
    Unparseable {
        /// The schedule as written.
        schedule: String,
        /// What the parser said.
        reason: String,
    },
}

/// A parsed schedule in its time zone.
#[derive(Debug, Clone)]
pub struct Schedule {
    cron: Cron,
    tz: TimeZone,
}

impl Schedule {
    /// Parses `schedule` (5 fields or a `@` macro) for `time_zone` (UTC when None).
    pub fn parse(schedule: &str, time_zone: Option<&str>) -> Result<Schedule, ScheduleError> {
        if schedule.contains("TZ") {
            return Err(ScheduleError::TimeZoneInSchedule);
        }
        let tz = match time_zone {
            None => TimeZone::UTC,
            Some(zone) => TimeZone::get(zone).map_err(|e| ScheduleError::UnknownTimeZone {
                zone: zone.to_string(),
                reason: e.to_string(),
            })?,
        };
        let text = match schedule.trim() {
            s if s.eq_ignore_ascii_case("@midnight") => "0 0 * * *",
            s => s,
        };
        let unparseable = |reason: String| ScheduleError::Unparseable {
            schedule: schedule.to_string(),
            reason,
        };
        if !text.starts_with('@') && text.split_whitespace().count() != 5 {
            return Err(unparseable(format!(
                "expected exactly 5 fields, found {}",
                text.split_whitespace().count()
            )));
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Disallowed)
            .year(Year::Disallowed)
            .build()
            .parse(text)
            .map_err(|e| unparseable(e.to_string()))?;
        Ok(Schedule { cron, tz })
    }

    /// The first scheduled time strictly after `t`.
    pub fn next(&self, t: Timestamp) -> Option<Timestamp> {
        self.cron
            .find_next_occurrence(&t.to_zoned(self.tz.clone()), false)
            .ok()
            .map(|z| z.timestamp())
    }
}

/// How many schedules were missed since the last one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missed {
    /// None, or only the most recent.
    None,
    /// A few.
    Few,
    /// More than 100: probably a clock problem.
    Many,
}

/// A schedule that fires more than once a second (upstream refuses it the same way).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("time difference between two schedules is less than 1 second")]
pub struct TooFrequent;

/// The latest scheduled time in (earliest, now], with how many were missed, as upstream's
/// mostRecentScheduleTime: `earliest` is the last schedule (or the creation) time, raised to
/// now − startingDeadlineSeconds when `with_deadline`.
pub fn most_recent(
    cj: &CronJob,
    schedule: &Schedule,
    now: Timestamp,
    with_deadline: bool,
) -> Result<(Timestamp, Option<Timestamp>, Missed), TooFrequent> {
    let mut earliest = cj
        .status
        .as_ref()
        .and_then(|s| s.last_schedule_time.as_ref())
        .or(cj.metadata.creation_timestamp.as_ref())
        .map(|t| t.0)
        .unwrap_or(now);
    if with_deadline && let Some(secs) = cj.spec.as_ref().and_then(|s| s.starting_deadline_seconds)
    {
        let deadline = now - SignedDuration::from_secs(secs);
        if deadline > earliest {
            earliest = deadline;
        }
    }
    let Some(t1) = schedule.next(earliest) else {
        return Ok((earliest, None, Missed::None));
    };
    if now < t1 {
        return Ok((earliest, None, Missed::None));
    }
    let Some(t2) = schedule.next(t1) else {
        return Ok((earliest, Some(t1), Missed::None));
    };
    if now < t2 {
        return Ok((earliest, Some(t1), Missed::None));
    }
    let between = t2.duration_since(t1).as_secs();
    if between < 1 {
        return Err(TooFrequent);
    }
    let missed = now.duration_since(t1).as_secs() / between + 1;
    // Jump close to now, then let the schedule find the exact latest time (schedules are not
    // always evenly spaced, e.g. `30 6-16/4 * * 1-5`).
    let mut t = t1 + SignedDuration::from_secs((missed - 2).max(0) * between);
    let mut latest = None;
    while let Some(next) = schedule.next(t).filter(|n| *n <= now) {
        latest = Some(next);
        t = next;
    }
    let kind = if missed > MANY_MISSED {
        Missed::Many
    } else {
        Missed::Few
    };
    Ok((earliest, latest, kind))
}

/// How long until the controller should look at `cj` again (upstream's
/// nextScheduleTimeDuration).
pub fn next_wait(cj: &CronJob, schedule: &Schedule, now: Timestamp) -> Duration {
    let base = match most_recent(cj, schedule, now, false) {
        Err(_) => now,
        Ok((_, Some(t), _)) => t,
        Ok((earliest, None, Missed::None)) => earliest,
        Ok((_, None, _)) => now,
    };
    let next = schedule
        .next(base)
        .unwrap_or(now + SignedDuration::from_secs(3600));
    Duration::try_from(next.duration_since(now)).unwrap_or_default() + NEXT_SCHEDULE_DELTA
}

/// The name of the Job for a scheduled time: `<cronjob>-<minutes since the epoch>`.
pub fn job_name(cj: &CronJob, scheduled: Timestamp) -> String {
    format!("{}-{}", cj.name_any(), scheduled.as_second().div_euclid(60))
}

/// RFC 3339 as Go writes it: `Z` for a zero offset.
fn rfc3339(t: Timestamp, tz: &TimeZone) -> String {
    let zoned = t.to_zoned(tz.clone());
    if zoned.offset().seconds() == 0 {
        zoned.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
    } else {
        zoned.strftime("%Y-%m-%dT%H:%M:%S%:z").to_string()
    }
}

/// The Job a CronJob creates for `scheduled` (upstream's getJobFromTemplate2).
pub fn job_for(cj: &CronJob, schedule: &Schedule, scheduled: Timestamp) -> Job {
    let template = cj
        .spec
        .as_ref()
        .map(|s| s.job_template.clone())
        .unwrap_or_default();
    let meta = template.metadata.unwrap_or_default();
    let mut annotations = meta.annotations.unwrap_or_default();
    annotations.insert(SCHEDULED_TIMESTAMP.into(), rfc3339(scheduled, &schedule.tz));
    Job {
        metadata: ObjectMeta {
            name: Some(job_name(cj, scheduled)),
            namespace: cj.namespace(),
            labels: meta.labels,
            annotations: Some(annotations),
            owner_references: cj.controller_owner_ref(&()).map(|r| vec![r]),
            ..Default::default()
        },
        spec: template.spec,
        status: None,
    }
}

/// A Job to delete, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removal {
    /// Job name.
    pub name: String,
    /// Job UID.
    pub uid: String,
}

/// What one sync of a CronJob decides.
#[derive(Debug, Clone, Default)]
pub struct CronPlan {
    /// The status before any Job is created.
    pub status: CronJobStatus,
    /// Finished Jobs beyond the history limits, and (policy Replace) running ones.
    pub delete: Vec<Removal>,
    /// The Job to create and its scheduled time.
    pub create: Option<(Job, Timestamp)>,
    /// Events to publish.
    pub notes: Vec<Note>,
    /// When to look again.
    pub requeue: Option<Duration>,
}

fn note(warning: bool, reason: &'static str, message: String) -> Note {
    Note {
        warning,
        reason,
        message,
    }
}

fn job_ref(job: &Job) -> ObjectReference {
    ObjectReference {
        api_version: Some("batch/v1".into()),
        kind: Some("Job".into()),
        name: job.metadata.name.clone(),
        namespace: job.metadata.namespace.clone(),
        uid: job.metadata.uid.clone(),
        resource_version: job.metadata.resource_version.clone(),
        ..Default::default()
    }
}

/// Finished Jobs beyond `limit`, oldest start first (unstarted last, then by name).
fn beyond_limit(mut jobs: Vec<&Job>, limit: Option<i32>) -> Vec<&Job> {
    let Some(limit) = limit else {
        return Vec::new();
    };
    let excess = jobs
        .len()
        .saturating_sub(usize::try_from(limit.max(0)).unwrap_or(0));
    jobs.sort_by_key(|j| {
        let start = j
            .status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .map(|t| t.0);
        (start.is_none(), start, j.name_any())
    });
    jobs.truncate(excess);
    jobs
}

/// Decides one sync of `cj` over the Jobs it controls, at `now`.
pub fn plan(cj: &CronJob, jobs: &[Job], now: Timestamp) -> CronPlan {
    let mut out = CronPlan::default();
    let spec = cj.spec.clone().unwrap_or_default();
    let mut status = cj.status.clone().unwrap_or_default();
    let mut active = status.active.take().unwrap_or_default();
    let uid_of = |j: &Job| j.metadata.uid.clone().unwrap_or_default();

    // History: the oldest finished Jobs beyond each limit go.
    let done = |kind: &str| -> Vec<&Job> {
        jobs.iter()
            .filter(|j| finished_type(j) == Some(kind))
            .collect()
    };
    let old = beyond_limit(done("Complete"), spec.successful_jobs_history_limit)
        .into_iter()
        .chain(beyond_limit(done("Failed"), spec.failed_jobs_history_limit));
    for j in old {
        out.delete.push(Removal {
            name: j.name_any(),
            uid: uid_of(j),
        });
        active.retain(|r| r.uid.as_deref() != Some(uid_of(j).as_str()));
    }

    for j in jobs {
        let uid = uid_of(j);
        let listed = active
            .iter()
            .any(|r| r.uid.as_deref() == Some(uid.as_str()));
        if !listed && !is_finished(j) {
            out.notes.push(note(
                true,
                "UnexpectedJob",
                format!(
                    "Saw a job that the controller did not create or forgot: {}",
                    j.name_any()
                ),
            ));
        } else if let Some(kind) = finished_type(j) {
            if listed {
                active.retain(|r| r.uid.as_deref() != Some(uid.as_str()));
                out.notes.push(note(
                    false,
                    "SawCompletedJob",
                    format!("Saw completed job: {}, condition: {kind}", j.name_any()),
                ));
            }
            let completed = j.status.as_ref().and_then(|s| s.completion_time.clone());
            if kind == "Complete"
                && let Some(t) = completed
                && status
                    .last_successful_time
                    .as_ref()
                    .is_none_or(|l| t.0 > l.0)
            {
                status.last_successful_time = Some(t);
            }
        }
    }
    active.retain(|r| {
        let present = jobs.iter().any(|j| j.metadata.uid == r.uid);
        if !present {
            out.notes.push(note(
                false,
                "MissingJob",
                format!(
                    "Active job went missing: {}",
                    r.name.as_deref().unwrap_or("")
                ),
            ));
        }
        present
    });
    status.active = Some(active);
    let finish = |mut out: CronPlan, status: CronJobStatus| {
        out.status = status;
        out
    };

    if cj.metadata.deletion_timestamp.is_some() {
        return finish(out, status);
    }
    let schedule = match Schedule::parse(&spec.schedule, spec.time_zone.as_deref()) {
        Ok(s) => s,
        Err(e) => {
            let reason = match e {
                ScheduleError::UnknownTimeZone { .. } => "UnknownTimeZone",
                ScheduleError::TimeZoneInSchedule => "UnsupportedSchedule",
                ScheduleError::Unparseable { .. } => "UnparseableSchedule",
            };
            out.notes.push(note(true, reason, e.to_string()));
            return finish(out, status);
        }
    };
    if spec.suspend == Some(true) {
        return finish(out, status);
    }
    let mut current = cj.clone();
    current.status = Some(status.clone());
    let scheduled = match most_recent(&current, &schedule, now, true) {
        Err(e) => {
            out.notes.push(note(
                true,
                "InvalidSchedule",
                format!("invalid schedule: {} : {e}", spec.schedule),
            ));
            return finish(out, status);
        }
        Ok((_, None, _)) => {
            out.requeue = Some(next_wait(&current, &schedule, now));
            return finish(out, status);
        }
        Ok((_, Some(t), missed)) => {
            if missed == Missed::Many {
                out.notes.push(note(
                    true,
                    "TooManyMissedTimes",
                    "too many missed start times. Set or decrease .spec.startingDeadlineSeconds or check clock skew".into(),
                ));
            }
            t
        }
    };
    out.requeue = Some(next_wait(&current, &schedule, now));
    let too_late = spec
        .starting_deadline_seconds
        .is_some_and(|secs| scheduled + SignedDuration::from_secs(secs) < now);
    if too_late {
        let when = scheduled.to_zoned(TimeZone::UTC);
        out.notes.push(note(
            true,
            "MissSchedule",
            format!(
                "Missed scheduled time to start a job: {}",
                when.strftime("%a, %d %b %Y %H:%M:%S %z")
            ),
        ));
        return finish(out, status);
    }
    let name = job_name(cj, scheduled);
    let listed = status.active.iter().flatten();
    let processed = listed
        .clone()
        .any(|r| r.name.as_deref() == Some(name.as_str()))
        || status.last_schedule_time.as_ref().map(|t| t.0) == Some(scheduled);
    if processed {
        return finish(out, status);
    }
    let running = status.active.as_deref().unwrap_or_default();
    match spec.concurrency_policy.as_deref() {
        Some("Forbid") if !running.is_empty() => {
            out.notes.push(note(
                false,
                "JobAlreadyActive",
                "Not starting job because prior execution is running and concurrency policy is Forbid".into(),
            ));
            return finish(out, status);
        }
        Some("Replace") => {
            for r in running {
                if !out.delete.iter().any(|d| Some(&d.uid) == r.uid.as_ref()) {
                    out.delete.push(Removal {
                        name: r.name.clone().unwrap_or_default(),
                        uid: r.uid.clone().unwrap_or_default(),
                    });
                }
            }
            status.active = Some(Vec::new());
        }
        _ => {}
    }
    out.create = Some((job_for(cj, &schedule, scheduled), scheduled));
    current.status = Some(CronJobStatus {
        last_schedule_time: Some(Time(scheduled)),
        ..status.clone()
    });
    out.requeue = Some(next_wait(&current, &schedule, now));
    finish(out, status)
}

/// What a CronJob's reconciles share: the context and the clock.
struct CronContext {
    ctx: Context,
    now: Arc<dyn Fn() -> Timestamp + Send + Sync>,
}

/// Runs the CronJob controller on the real clock.
pub async fn run(client: Client) {
    run_with_clock(client, Arc::new(Timestamp::now)).await;
}

/// Runs the CronJob controller with `now` as its clock.
pub async fn run_with_clock(client: Client, now: Arc<dyn Fn() -> Timestamp + Send + Sync>) {
    let controller = Controller::new(
        Api::<CronJob>::all(client.clone()),
        watcher::Config::default(),
    )
    .owns(Api::<Job>::all(client.clone()), watcher::Config::default());
    let ctx = CronContext {
        ctx: Context::new(client, "cronjob-controller"),
        now,
    };
    drain(
        "cronjob",
        controller.run(reconcile, retry_after_error("cronjob"), Arc::new(ctx)),
    )
    .await;
}

async fn reconcile(cj: Arc<CronJob>, cx: Arc<CronContext>) -> Result<Action, Error> {
    let ctx = &cx.ctx;
    let object = key(&cj.metadata);
    let Some(ns) = cj.namespace() else {
        return Ok(Action::await_change());
    };
    let cj_api = Api::<CronJob>::namespaced(ctx.client.clone(), &ns);
    let cj = match cj_api.get(&cj.name_any()).await {
        Ok(c) if c.uid() == cj.uid() => c,
        Ok(_) => return Ok(Action::await_change()),
        Err(e) if is_not_found(&e) => return Ok(Action::await_change()),
        Err(e) => return Err(e).step(&object, "reading the cronjob"),
    };
    let job_api = Api::<Job>::namespaced(ctx.client.clone(), &ns);
    let jobs: Vec<Job> = job_api
        .list(&ListParams::default())
        .await
        .step(&object, "listing jobs")?
        .items
        .into_iter()
        .filter(|j| {
            controller_of(&j.metadata)
                .is_some_and(|r| r.kind == "CronJob" && r.name == cj.name_any())
        })
        .collect();
    let plan = plan(&cj, &jobs, (cx.now)());
    let mut status = plan.status.clone();
    for n in &plan.notes {
        if n.warning {
            ctx.warning(&cj, n.reason, n.message.clone()).await;
        } else {
            ctx.event(&cj, n.reason, n.message.clone()).await;
        }
    }
    let background = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        ..Default::default()
    };
    for r in &plan.delete {
        match job_api.delete(&r.name, &background).await {
            Ok(_) => {
                let note = format!("Deleted job {}", r.name);
                ctx.event(&cj, "SuccessfulDelete", note).await;
            }
            Err(e) if is_not_found(&e) => {}
            Err(e) => {
                ctx.warning(&cj, "FailedDelete", format!("Deleted job: {e}"))
                    .await;
                tracing::warn!("cronjob controller: {object}: deleting job {}: {e}", r.name);
            }
        }
    }
    let mut failure = None;
    if let Some((job, scheduled)) = &plan.create {
        let name = job.name_any();
        let made = match job_api.create(&PostParams::default(), job).await {
            Ok(made) => {
                ctx.event(&cj, "SuccessfulCreate", format!("Created job {name}"))
                    .await;
                Some(made)
            }
            Err(e) if is_conflict(&e) => {
                // Created by an earlier sync that did not get to record it: record it now.
                let existing = job_api.get(&name).await.step(&object, "reading job")?;
                let ours = controller_of(&existing.metadata)
                    .is_some_and(|r| Some(&r.uid) == cj.metadata.uid.as_ref());
                let listed = status
                    .active
                    .iter()
                    .flatten()
                    .any(|r| r.uid == existing.metadata.uid);
                (ours && !listed).then_some(existing)
            }
            Err(e) => {
                ctx.warning(&cj, "FailedCreate", format!("Error creating job: {e}"))
                    .await;
                failure = Some(Error::Api {
                    object: object.clone(),
                    step: format!("creating job {name}"),
                    source: e,
                });
                None
            }
        };
        if let Some(made) = made {
            status
                .active
                .get_or_insert_with(Vec::new)
                .push(job_ref(&made));
            status.last_schedule_time = Some(Time(*scheduled));
        }
    }
    let current = cj.status.clone().unwrap_or_default();
    if serde_json::to_value(&status).ok() != serde_json::to_value(&current).ok() {
        cj_api
            .patch_status(
                &cj.name_any(),
                &PatchParams::default(),
                // Guarded by the resourceVersion read, as upstream's UpdateStatus is: a status
                // written since (another lastScheduleTime) is never overwritten with what this
                // reconcile computed from the older one; the conflict runs it again.
                &Patch::Merge(
                    json!({"metadata": {"resourceVersion": cj.resource_version()},
                                         "status": {
                        "active": status.active,
                        "lastScheduleTime": status.last_schedule_time,
                        "lastSuccessfulTime": status.last_successful_time,
                    }}),
                ),
            )
            .await
            .step(&object, "updating status")?;
    }
    if let Some(e) = failure {
        return Err(e);
    }
    Ok(match plan.requeue {
        Some(after) => Action::requeue(after),
        None => Action::await_change(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().expect("timestamp")
    }

    fn cronjob(schedule: &str, extra: serde_json::Value) -> CronJob {
        let mut spec = json!({
            "schedule": schedule,
            "jobTemplate": {"metadata": {"labels": {"app": "report"}},
                            "spec": {"template": {"spec": {"containers": []}}}},
        });
        for (k, v) in extra.as_object().cloned().unwrap_or_default() {
            spec[k] = v;
        }
        serde_json::from_value(json!({
            "metadata": {"name": "report", "namespace": "ns", "uid": "cj-1",
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": spec,
        }))
        .expect("cronjob")
    }

    fn with_last(mut cj: CronJob, last: &str, active: &[(&str, &str)]) -> CronJob {
        cj.status = Some(CronJobStatus {
            last_schedule_time: Some(Time(at(last))),
            active: Some(
                active
                    .iter()
                    .map(|(name, uid)| ObjectReference {
                        name: Some(name.to_string()),
                        uid: Some(uid.to_string()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            last_successful_time: None,
        });
        cj
    }

    fn job(name: &str, uid: &str, finished: Option<&str>, started: &str) -> Job {
        let conditions: Vec<serde_json::Value> = finished
            .map(|kind| vec![json!({"type": kind, "status": "True"})])
            .unwrap_or_default();
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": uid},
            "status": {"startTime": started, "conditions": conditions,
                       "completionTime": finished.filter(|k| *k == "Complete").map(|_| started)},
        }))
        .expect("job")
    }

    #[test]
    fn schedules_give_the_next_times_of_standard_cron() {
        // (schedule, timeZone, after, next)
        let cases = [
            (
                "* * * * *",
                None,
                "2026-03-01T10:00:30Z",
                "2026-03-01T10:01:00Z",
            ),
            (
                "*/15 * * * *",
                None,
                "2026-03-01T10:16:00Z",
                "2026-03-01T10:30:00Z",
            ),
            (
                "0 0 * * *",
                None,
                "2026-03-01T10:00:00Z",
                "2026-03-02T00:00:00Z",
            ),
            (
                "@hourly",
                None,
                "2026-03-01T10:00:00Z",
                "2026-03-01T11:00:00Z",
            ),
            (
                "@daily",
                None,
                "2026-03-01T10:00:00Z",
                "2026-03-02T00:00:00Z",
            ),
            (
                "@midnight",
                None,
                "2026-03-01T10:00:00Z",
                "2026-03-02T00:00:00Z",
            ),
            (
                "@weekly",
                None,
                "2026-03-02T10:00:00Z",
                "2026-03-08T00:00:00Z",
            ),
            (
                "@monthly",
                None,
                "2026-03-02T10:00:00Z",
                "2026-04-01T00:00:00Z",
            ),
            (
                "@yearly",
                None,
                "2026-03-02T10:00:00Z",
                "2027-01-01T00:00:00Z",
            ),
            (
                "30 6-16/4 * * 1-5",
                None,
                "2026-03-02T07:00:00Z",
                "2026-03-02T10:30:00Z",
            ),
            (
                "0 9 * * MON",
                None,
                "2026-03-03T00:00:00Z",
                "2026-03-09T09:00:00Z",
            ),
            // Day of month OR day of week when both are restricted (Vixie cron).
            (
                "0 0 13 * FRI",
                None,
                "2026-03-01T00:00:00Z",
                "2026-03-06T00:00:00Z",
            ),
            // 09:00 in Paris is 08:00 UTC in winter.
            (
                "0 9 * * *",
                Some("Europe/Paris"),
                "2026-01-10T12:00:00Z",
                "2026-01-11T08:00:00Z",
            ),
        ];
        for (schedule, tz, after, next) in cases {
            let parsed =
                Schedule::parse(schedule, tz).unwrap_or_else(|e| panic!("{schedule}: {e}"));
            assert_eq!(
                parsed.next(at(after)),
                Some(at(next)),
                "{schedule} after {after}"
            );
        }
    }

    #[test]
    fn bad_schedules_and_zones_are_refused() {
        let cases = [
            ("TZ=UTC 0 * * * *", None, ScheduleError::TimeZoneInSchedule),
            (
                "CRON_TZ=UTC 0 * * * *",
                None,
                ScheduleError::TimeZoneInSchedule,
            ),
        ];
        for (schedule, tz, want) in cases {
            assert_eq!(
                Schedule::parse(schedule, tz).unwrap_err(),
                want,
                "{schedule}"
            );
        }
        for (schedule, tz) in [
            ("61 * * * *", None),
            ("* * * *", None),
            ("0 0 * * * *", None),
            ("not a schedule", None),
            ("0 * * * *", Some("Mars/Olympus_Mons")),
        ] {
            assert!(
                Schedule::parse(schedule, tz).is_err(),
                "{schedule} in {tz:?}"
            );
        }
    }

    #[test]
    fn the_most_recent_missed_time_is_run_once() {
        // (last schedule, startingDeadlineSeconds, now, job created for)
        let cases = [
            ("2026-03-01T10:00:00Z", None, "2026-03-01T10:00:30Z", None),
            (
                "2026-03-01T10:00:00Z",
                None,
                "2026-03-01T10:01:05Z",
                Some("2026-03-01T10:01:00Z"),
            ),
            // Several missed: only the latest runs.
            (
                "2026-03-01T10:00:00Z",
                None,
                "2026-03-01T10:07:30Z",
                Some("2026-03-01T10:07:00Z"),
            ),
            // Within the starting deadline.
            (
                "2026-03-01T10:00:00Z",
                Some(60),
                "2026-03-01T10:07:30Z",
                Some("2026-03-01T10:07:00Z"),
            ),
            // Past it: nothing (the deadline raises the earliest time considered).
            (
                "2026-03-01T10:00:00Z",
                Some(10),
                "2026-03-01T10:07:30Z",
                None,
            ),
        ];
        for (last, deadline, now, want) in cases {
            let extra = json!({"startingDeadlineSeconds": deadline});
            let cj = with_last(cronjob("* * * * *", extra), last, &[]);
            let plan = plan(&cj, &[], at(now));
            let got = plan.create.as_ref().map(|(_, t)| *t);
            assert_eq!(
                got,
                want.map(at),
                "last {last}, deadline {deadline:?}, now {now}"
            );
            assert!(plan.requeue.is_some(), "always looks again");
            if let Some((job, t)) = plan.create {
                assert_eq!(job.name_any(), format!("report-{}", t.as_second() / 60));
                assert_eq!(
                    job.annotations()[SCHEDULED_TIMESTAMP],
                    want.unwrap().to_string()
                );
                assert_eq!(job.labels()["app"], "report");
                let owner = &job.owner_references()[0];
                assert_eq!(
                    (owner.kind.as_str(), owner.controller),
                    ("CronJob", Some(true))
                );
            }
        }
    }

    #[test]
    fn concurrency_policies_decide_what_happens_to_a_running_job() {
        // (policy, creates, deletes the running job, event)
        let cases = [
            (None, true, false, None),
            (Some("Allow"), true, false, None),
            (Some("Forbid"), false, false, Some("JobAlreadyActive")),
            (Some("Replace"), true, true, None),
        ];
        let running = job("report-100", "j-100", None, "2026-03-01T10:00:00Z");
        for (policy, creates, deletes, event) in cases {
            let extra = json!({"concurrencyPolicy": policy});
            let cj = with_last(
                cronjob("* * * * *", extra),
                "2026-03-01T10:00:00Z",
                &[("report-100", "j-100")],
            );
            let plan = plan(
                &cj,
                std::slice::from_ref(&running),
                at("2026-03-01T10:01:10Z"),
            );
            assert_eq!(plan.create.is_some(), creates, "{policy:?}");
            assert_eq!(
                plan.delete.iter().any(|d| d.uid == "j-100"),
                deletes,
                "{policy:?}"
            );
            if let Some(reason) = event {
                assert!(plan.notes.iter().any(|n| n.reason == reason), "{policy:?}");
            }
        }
    }

    #[test]
    fn history_limits_delete_the_oldest_finished_jobs() {
        let jobs = [
            job("a", "1", Some("Complete"), "2026-03-01T10:00:00Z"),
            job("b", "2", Some("Complete"), "2026-03-01T10:01:00Z"),
            job("c", "3", Some("Complete"), "2026-03-01T10:02:00Z"),
            job("d", "4", Some("Failed"), "2026-03-01T10:03:00Z"),
            job("e", "5", Some("Failed"), "2026-03-01T10:04:00Z"),
            job("f", "6", None, "2026-03-01T10:05:00Z"),
        ];
        // (successful limit, failed limit, deleted)
        let cases = [
            (None, None, vec![]),
            (Some(3), Some(1), vec!["d"]),
            (Some(1), Some(1), vec!["a", "b", "d"]),
            (Some(0), Some(0), vec!["a", "b", "c", "d", "e"]),
        ];
        for (ok, failed, want) in cases {
            let extra = json!({"successfulJobsHistoryLimit": ok, "failedJobsHistoryLimit": failed,
                               "suspend": true});
            let cj = with_last(
                cronjob("* * * * *", extra),
                "2026-03-01T10:05:00Z",
                &[("f", "6")],
            );
            let plan = plan(&cj, &jobs, at("2026-03-01T10:05:30Z"));
            let mut got: Vec<&str> = plan.delete.iter().map(|d| d.name.as_str()).collect();
            got.sort();
            assert_eq!(got, want, "limits {ok:?}/{failed:?}");
            assert!(plan.create.is_none(), "suspended");
        }
    }

    #[test]
    fn finished_jobs_leave_the_active_list_and_set_last_successful_time() {
        let jobs = [
            job("done", "1", Some("Complete"), "2026-03-01T10:00:00Z"),
            job("stray", "2", None, "2026-03-01T10:00:00Z"),
        ];
        let cj = with_last(
            cronjob("0 0 1 1 *", json!({})),
            "2026-03-01T10:00:00Z",
            &[("done", "1"), ("gone", "9")],
        );
        let plan = plan(&cj, &jobs, at("2026-03-01T10:00:30Z"));
        assert_eq!(plan.status.active, Some(vec![]));
        assert_eq!(
            plan.status.last_successful_time,
            Some(Time(at("2026-03-01T10:00:00Z")))
        );
        let reasons: Vec<&str> = plan.notes.iter().map(|n| n.reason).collect();
        assert_eq!(reasons, ["SawCompletedJob", "UnexpectedJob", "MissingJob"]);
    }
}
