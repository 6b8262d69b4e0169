//! The Job controller: runs a Job's pods to completion (parallelism, completions, Indexed
//! mode, backoffLimit, activeDeadlineSeconds, podFailurePolicy, suspend), tracking finished
//! pods with the `batch.kubernetes.io/job-tracking` finalizer; plus the two small loops that
//! go with it upstream: finalizer removal from pods whose Job is gone, and the
//! ttl-after-finished controller.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::future::join_all;
use k8s_openapi::api::batch::v1::{Job, JobStatus};
use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tandem_api::client::{is_conflict, is_not_found};

pub mod plan;

pub use plan::{
    COMPLETION_INDEX, COMPLETION_INDEX_ENV, Invalid, Plan, TRACKING_FINALIZER, finished_type,
    is_finished,
};

use super::availability::is_active;
use super::context::Context;
use super::error::{Error, StepExt, drain, key, retry_after_error};
use super::owners::{controller_of, selects};

/// Runs the Job controller, the orphan-finalizer cleanup and the ttl-after-finished
/// controller until one of them stops.
pub async fn run(client: Client) {
    tokio::select! {
        () = run_jobs(client.clone()) => {}
        () = release_orphans(client.clone()) => {}
        () = run_ttl(client) => {}
    }
}

async fn run_jobs(client: Client) {
    let controller = Controller::new(Api::<Job>::all(client.clone()), watcher::Config::default())
        .with_config(Config::default().debounce(Duration::from_millis(50)));
    let controller = controller.watches(
        Api::<Pod>::all(client.clone()),
        watcher::Config::default(),
        |pod: Pod| {
            let ns = pod.namespace().unwrap_or_default();
            match controller_of(&pod.metadata) {
                Some(owner) if owner.kind == "Job" => {
                    vec![ObjectRef::<Job>::new(&owner.name).within(&ns)]
                }
                _ => Vec::new(),
            }
        },
    );
    drain(
        "job",
        controller.run(
            reconcile,
            retry_after_error("job"),
            Arc::new(Context::new(client, "job-controller")),
        ),
    )
    .await;
}

/// One sync of a Job. The Job is read again from the API server and its pods listed from it,
/// so what the previous sync wrote is always seen (this stands in for upstream's
/// expectations); status writes carry the resourceVersion, so a stale view fails instead of
/// miscounting.
async fn reconcile(job: Arc<Job>, ctx: Arc<Context>) -> Result<Action, Error> {
    let client = &ctx.client;
    let object = key(&job.metadata);
    let (Some(ns), Some(uid)) = (job.namespace(), job.uid()) else {
        return Ok(Action::await_change());
    };
    let jobs = Api::<Job>::namespaced(client.clone(), &ns);
    let job = match jobs.get(&job.name_any()).await {
        Ok(j) if j.uid().as_deref() == Some(uid.as_str()) => j,
        Ok(_) => return Ok(Action::await_change()),
        Err(e) if is_not_found(&e) => return Ok(Action::await_change()),
        Err(e) => return Err(e).step(&object, "reading the job"),
    };
    let pods_api = Api::<Pod>::namespaced(client.clone(), &ns);
    let listed = pods_api
        .list(&ListParams::default())
        .await
        .step(&object, "listing pods")?
        .items;
    let owned: Vec<Pod> = listed
        .into_iter()
        .filter(|p| controller_of(&p.metadata).is_some_and(|r| r.uid == uid))
        .collect();

    if is_finished(&job) {
        // Upstream's orphan queue does this for a finished Job's pods.
        untrack(&pods_api, &object, owned.iter().map(|p| p.name_any())).await?;
        return Ok(Action::await_change());
    }
    let spec = job.spec.clone().unwrap_or_default();
    if let Some(selector) = &spec.selector {
        adopt_orphans(&ctx, &job, selector, &object).await?;
    }
    let now = Timestamp::now();
    let plan = match plan::plan(&job, &owned, now) {
        Ok(plan) => plan,
        Err(reason) => {
            // Nothing can be done until the Job changes: say so once, do not retry.
            tracing::warn!("job controller: {object}: not run: {reason}");
            return Ok(Action::await_change());
        }
    };

    let mut status = plan.status.clone();
    let mut failure: Option<Error> = None;
    // Deletions first: a finished or suspended Job's pods, or surplus ones.
    let deleted = join_all(plan.delete.iter().map(|d| {
        let api = pods_api.clone();
        let object = object.clone();
        async move {
            if d.untrack {
                untrack(&api, &object, [d.name.clone()]).await?;
            }
            match api.delete(&d.name, &DeleteParams::default()).await {
                Ok(_) => Ok(true),
                Err(e) if is_not_found(&e) => Ok(false),
                Err(e) => Err(e).step(&object, format!("deleting pod {}", d.name)),
            }
        }
    }))
    .await;
    for (d, result) in plan.delete.iter().zip(deleted) {
        match result {
            Ok(true) => {
                let note = format!("Deleted pod: {}", d.name);
                ctx.event(&job, "SuccessfulDelete", note).await;
            }
            Ok(false) => {}
            Err(e) => {
                status.active = status.active.map(|a| a + 1);
                if d.ready {
                    status.ready = status.ready.map(|r| r + 1);
                }
                failure.get_or_insert(e);
            }
        }
    }
    let created = create_pods(&ctx, &job, &plan.create, &object).await;
    if let Err((missing, e)) = created {
        status.active = status.active.map(|a| a - missing);
        failure.get_or_insert(e);
    }
    for note in &plan.notes {
        ctx.event(&job, note.reason, note.message.clone()).await;
    }

    // Record the finished pods, let their finalizers go, then count them.
    let mut job = job;
    if plan::normalized(&status) != plan::normalized(&job.status.clone().unwrap_or_default()) {
        job = write_status(&jobs, job, status.clone(), &object).await?;
    }
    let mut tracked = plan.tracked.clone();
    let (names, uids): (Vec<String>, Vec<String>) = plan.untrack.iter().cloned().unzip();
    let removed = untrack_each(&pods_api, &names).await;
    for (uid, ok) in uids.iter().zip(&removed) {
        if *ok {
            tracked.remove(uid);
        }
    }
    let (settled, finished) = plan::settle(
        status,
        &tracked,
        plan.finished.as_ref(),
        plan.terminating,
        Timestamp::now(),
    );
    if plan::normalized(&settled) != plan::normalized(&job.status.clone().unwrap_or_default()) {
        job = write_status(&jobs, job, settled, &object).await?;
    }
    if let (true, Some(c)) = (finished, plan.finished.as_ref()) {
        if c.type_ == "Complete" {
            ctx.event(&job, "Completed", "Job completed".into()).await;
        } else {
            let reason = c.reason.clone().unwrap_or_default();
            ctx.warning(&job, &reason, c.message.clone().unwrap_or_default())
                .await;
        }
    }
    if let Some(e) = failure {
        return Err(e);
    }
    if removed.iter().any(|ok| !ok) {
        return Err(Error::Invalid {
            object,
            reason: "removing tracking finalizers: some pods refused; retrying".into(),
        });
    }
    Ok(match plan.requeue {
        Some(after) => Action::requeue(after + Duration::from_millis(50)),
        None => Action::await_change(),
    })
}

async fn write_status(
    jobs: &Api<Job>,
    mut job: Job,
    status: JobStatus,
    object: &str,
) -> Result<Job, Error> {
    job.status = Some(status);
    jobs.replace_status(&job.name_any(), &PostParams::default(), &job)
        .await
        .step(object, "updating status")
}

/// Adopts active orphans the selector matches, adding the tracking finalizer as upstream.
async fn adopt_orphans(
    ctx: &Context,
    job: &Job,
    selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    object: &str,
) -> Result<(), Error> {
    let ns = job.namespace().unwrap_or_default();
    let api = Api::<Pod>::namespaced(ctx.client.clone(), &ns);
    let owner = job
        .controller_owner_ref(&())
        .expect("Job has a name and uid");
    let pods = api
        .list(&ListParams::default())
        .await
        .step(object, "listing pods for adoption")?;
    for pod in pods.items {
        if controller_of(&pod.metadata).is_some()
            || !is_active(&pod)
            || !selects(selector, pod.metadata.labels.as_ref())
        {
            continue;
        }
        let mut refs = pod.owner_references().to_vec();
        refs.push(owner.clone());
        let mut finalizers = pod.finalizers().to_vec();
        if !finalizers.iter().any(|f| f == TRACKING_FINALIZER) {
            finalizers.push(TRACKING_FINALIZER.into());
        }
        let name = pod.name_any();
        let patch = json!({"metadata": {
            "ownerReferences": refs,
            "finalizers": finalizers,
            "resourceVersion": pod.metadata.resource_version,
        }});
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => {}
            Err(e) if is_not_found(&e) || is_conflict(&e) => {}
            Err(e) => return Err(e).step(object, format!("adopting pod {name}")),
        }
    }
    Ok(())
}

/// The pod a Job creates for completion index `index` (None for NonIndexed Jobs).
pub fn pod_for(job: &Job, index: Option<i32>) -> Pod {
    let name = job.name_any();
    let template = job
        .spec
        .as_ref()
        .map(|s| s.template.clone())
        .unwrap_or_default();
    let meta = template.metadata.unwrap_or_default();
    let mut spec = template.spec.unwrap_or_default();
    let mut labels = meta.labels.unwrap_or_default();
    let mut annotations = meta.annotations.unwrap_or_default();
    let mut finalizers = meta.finalizers.unwrap_or_default();
    if !finalizers.iter().any(|f| f == TRACKING_FINALIZER) {
        finalizers.push(TRACKING_FINALIZER.into());
    }
    let mut generate_name = format!("{name}-");
    if let Some(i) = index {
        annotations.insert(COMPLETION_INDEX.into(), i.to_string());
        labels.insert(COMPLETION_INDEX.into(), i.to_string());
        spec.hostname = Some(format!("{name}-{i}"));
        generate_name = format!("{name}-{i}-");
        let env = EnvVar {
            name: COMPLETION_INDEX_ENV.into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: format!("metadata.labels['{COMPLETION_INDEX}']"),
                    api_version: None,
                }),
                ..Default::default()
            }),
            value: None,
        };
        let containers = spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten());
        for c in containers {
            let vars = c.env.get_or_insert_with(Vec::new);
            if !vars.iter().any(|v| v.name == COMPLETION_INDEX_ENV) {
                vars.push(env.clone());
            }
        }
    }
    // Upstream truncates long prefixes so the generated name stays within 63 characters.
    if generate_name.len() > 58 {
        let suffix = index
            .map(|i| format!("-{i}-"))
            .unwrap_or_else(|| "-".into());
        let keep = 58usize.saturating_sub(suffix.len());
        generate_name = format!("{}{suffix}", &name[..keep.min(name.len())]);
    }
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(generate_name),
            namespace: job.namespace(),
            labels: Some(labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            finalizers: Some(finalizers),
            owner_references: Some(vec![
                job.controller_owner_ref(&())
                    .expect("Job has a name and uid"),
            ]),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// Creates the planned pods in slow-start batches (1, 2, 4, ...), as upstream: a template
/// the API server refuses costs one request, not hundreds. On failure, returns how many
/// planned pods were not created and the first error.
async fn create_pods(
    ctx: &Context,
    job: &Job,
    indexes: &[Option<i32>],
    object: &str,
) -> Result<(), (i32, Error)> {
    let ns = job.namespace().unwrap_or_default();
    let api = Api::<Pod>::namespaced(ctx.client.clone(), &ns);
    let mut rest = indexes;
    let mut batch = 1;
    while !rest.is_empty() {
        let n = batch.min(rest.len());
        let (now, later) = rest.split_at(n);
        let params = PostParams::default();
        let pods: Vec<Pod> = now.iter().map(|i| pod_for(job, *i)).collect();
        let results = join_all(pods.iter().map(|p| api.create(&params, p))).await;
        let mut first_error = None;
        let mut failed = 0;
        let mut notes = Vec::new();
        for result in results {
            match result {
                Ok(pod) => notes.push(format!("Created pod: {}", pod.name_any())),
                Err(e) => {
                    failed += 1;
                    first_error.get_or_insert(e);
                }
            }
        }
        join_all(
            notes
                .into_iter()
                .map(|note| ctx.event(job, "SuccessfulCreate", note)),
        )
        .await;
        if let Some(e) = first_error {
            let missing = failed + i32::try_from(later.len()).unwrap_or(i32::MAX);
            return Err((
                missing,
                Error::Api {
                    object: object.to_string(),
                    step: "creating pod".into(),
                    source: e,
                },
            ));
        }
        rest = later;
        batch *= 2;
    }
    Ok(())
}

/// The JSON patch that removes the tracking finalizer at its position, guarded by a test so
/// a concurrent change to the list is refused rather than removing the wrong entry.
fn untrack_patch(pod: &Pod) -> Option<serde_json::Value> {
    let at = pod
        .finalizers()
        .iter()
        .position(|f| f == TRACKING_FINALIZER)?;
    Some(json!([
        {"op": "test", "path": format!("/metadata/finalizers/{at}"), "value": TRACKING_FINALIZER},
        {"op": "remove", "path": format!("/metadata/finalizers/{at}")},
    ]))
}

/// Removes the tracking finalizer from one pod; true when it is gone (or the pod is).
async fn untrack_one(api: &Api<Pod>, name: &str) -> Result<bool, kube::Error> {
    for _ in 0..5 {
        let pod = match api.get(name).await {
            Ok(p) => p,
            Err(e) if is_not_found(&e) => return Ok(true),
            Err(e) => return Err(e),
        };
        let Some(ops) = untrack_patch(&pod) else {
            return Ok(true);
        };
        let patch: json_patch::Patch =
            serde_json::from_value(ops).map_err(kube::Error::SerdeError)?;
        match api
            .patch(name, &PatchParams::default(), &Patch::<()>::Json(patch))
            .await
        {
            Ok(_) => return Ok(true),
            Err(e) if is_not_found(&e) => return Ok(true),
            // The finalizer list moved under us: read it again.
            Err(e) if is_conflict(&e) || is_invalid(&e) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}

fn is_invalid(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 422)
}

/// Removes the tracking finalizer from each named pod; one flag per pod.
async fn untrack_each(api: &Api<Pod>, names: &[String]) -> Vec<bool> {
    join_all(names.iter().map(|n| async move {
        match untrack_one(api, n).await {
            Ok(ok) => ok,
            Err(e) => {
                tracing::warn!("job controller: pod {n}: removing tracking finalizer: {e}");
                false
            }
        }
    }))
    .await
}

/// Removes the tracking finalizer from the named pods, failing on the first refusal.
async fn untrack(
    api: &Api<Pod>,
    object: &str,
    names: impl IntoIterator<Item = String>,
) -> Result<(), Error> {
    let names: Vec<String> = names.into_iter().collect();
    let done = untrack_each(api, &names).await;
    match names.iter().zip(done).find(|(_, ok)| !ok) {
        None => Ok(()),
        Some((name, _)) => Err(Error::Invalid {
            object: object.to_string(),
            reason: format!("pod {name}: the tracking finalizer could not be removed"),
        }),
    }
}

/// Removes the tracking finalizer from pods whose Job no longer exists (deleted, or replaced
/// by another of the same name), so their deletion completes: upstream's orphan queue.
async fn release_orphans(client: Client) {
    // A cache of Jobs answers "does the owner exist" for most events; only a miss is checked
    // with the API server (the cache may lag behind a new Job).
    let (jobs_seen, writer) = kube::runtime::reflector::store::<Job>();
    let job_watch = kube::runtime::reflector(
        writer,
        watcher::watcher(Api::<Job>::all(client.clone()), watcher::Config::default()),
    )
    .default_backoff()
    .for_each(|event| {
        let client = client.clone();
        async move {
            // A pod event may have been judged against the cache before the Job's deletion
            // reached it: the deletion itself releases the Job's pods (upstream's deleteJob).
            if let Ok(watcher::Event::Delete(job)) = event {
                release_pods_of(&client, &job).await;
            }
        }
    });
    tokio::select! {
        () = job_watch => {}
        () = release_orphaned_pods(client.clone(), jobs_seen) => {}
    }
}

/// Removes the tracking finalizer from every pod the deleted `job` controlled.
async fn release_pods_of(client: &Client, job: &Job) {
    let (Some(ns), Some(uid)) = (job.namespace(), job.uid()) else {
        return;
    };
    let api = Api::<Pod>::namespaced(client.clone(), &ns);
    let pods = match api.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(e) => {
            tracing::warn!(
                "job controller: {ns}/{}: listing pods to release: {e}",
                job.name_any()
            );
            return;
        }
    };
    let names: Vec<String> = pods
        .iter()
        .filter(|p| controller_of(&p.metadata).is_some_and(|r| r.uid == uid))
        .filter(|p| p.finalizers().iter().any(|f| f == TRACKING_FINALIZER))
        .map(|p| p.name_any())
        .collect();
    untrack_each(&api, &names).await;
}

async fn release_orphaned_pods(client: Client, jobs_seen: kube::runtime::reflector::Store<Job>) {
    let pods = Api::<Pod>::all(client.clone());
    let stream = watcher::watcher(pods, watcher::Config::default())
        .default_backoff()
        .touched_objects();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        let Ok(pod) = event else { continue };
        let Some(owner) = controller_of(&pod.metadata)
            .filter(|r| r.kind == "Job")
            .cloned()
        else {
            continue;
        };
        if !pod.finalizers().iter().any(|f| f == TRACKING_FINALIZER) {
            continue;
        }
        let ns = pod.namespace().unwrap_or_default();
        let cached = jobs_seen.get(&ObjectRef::<Job>::new(&owner.name).within(&ns));
        if cached.is_some_and(|j| j.uid().as_deref() == Some(owner.uid.as_str())) {
            continue;
        }
        let jobs = Api::<Job>::namespaced(client.clone(), &ns);
        let orphaned = match jobs.get(&owner.name).await {
            Ok(j) => j.uid().as_deref() != Some(owner.uid.as_str()),
            Err(e) if is_not_found(&e) => true,
            Err(e) => {
                tracing::debug!("job controller: pod {ns}/{}: {e}", pod.name_any());
                false
            }
        };
        if orphaned {
            let api = Api::<Pod>::namespaced(client.clone(), &ns);
            let name = pod.name_any();
            if let Err(e) = untrack_one(&api, &name).await {
                tracing::warn!(
                    "job controller: orphan pod {ns}/{name}: removing tracking finalizer: {e}"
                );
            }
        }
    }
}

/// When a finished Job's ttlSecondsAfterFinished runs out: the time its Complete or Failed
/// condition was set, plus the TTL. None while it runs or has no TTL.
pub fn ttl_expiry(job: &Job) -> Option<Timestamp> {
    let ttl = job.spec.as_ref()?.ttl_seconds_after_finished?;
    let kind = finished_type(job)?;
    let finished = job
        .status
        .as_ref()?
        .conditions
        .as_deref()?
        .iter()
        .find(|c| c.type_ == kind)?
        .last_transition_time
        .as_ref()?
        .0;
    Some(finished + SignedDuration::from_secs(i64::from(ttl)))
}

async fn run_ttl(client: Client) {
    let controller = Controller::new(Api::<Job>::all(client.clone()), watcher::Config::default());
    drain(
        "ttl-after-finished",
        controller.run(
            reconcile_ttl,
            retry_after_error("ttl-after-finished"),
            Arc::new(Context::new(client, "ttl-after-finished-controller")),
        ),
    )
    .await;
}

/// Deletes a finished Job once its TTL is over, with its pods (propagation Background), as
/// upstream's ttl-after-finished controller; the UID precondition spares a newer Job of the
/// same name.
async fn reconcile_ttl(job: Arc<Job>, ctx: Arc<Context>) -> Result<Action, Error> {
    let Some(expiry) = ttl_expiry(&job) else {
        return Ok(Action::await_change());
    };
    if job.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let now = Timestamp::now();
    if expiry > now {
        let wait = Duration::try_from(expiry.duration_since(now)).unwrap_or_default();
        return Ok(Action::requeue(wait + Duration::from_millis(50)));
    }
    let object = key(&job.metadata);
    let ns = job.namespace().unwrap_or_default();
    let dp = DeleteParams {
        propagation_policy: Some(kube::api::PropagationPolicy::Background),
        preconditions: Some(Preconditions {
            uid: job.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match Api::<Job>::namespaced(ctx.client.clone(), &ns)
        .delete(&job.name_any(), &dp)
        .await
    {
        Ok(_) => Ok(Action::await_change()),
        Err(e) if is_not_found(&e) || is_conflict(&e) => Ok(Action::await_change()),
        Err(e) => Err(e).step(
            &object,
            "deleting the job after its ttlSecondsAfterFinished",
        ),
    }
}
