//! The Deployment controller: one ReplicaSet per pod template (`<deploy>-<pod-template-hash>`),
//! rolled by the RollingUpdate or Recreate strategy, old ones pruned to
//! revisionHistoryLimit, and the status `kubectl rollout status` reads.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, ReplicaSetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tandem_api::client::{is_conflict, is_not_found};

pub mod plan;
pub mod status;

pub use plan::{
    HASH_LABEL, RsState, ScalingRs, Step, fenceposts, new_rs_size, old_rs_sizes,
    proportional_sizes, recreate_step, resolve, rolling_step, runs_template, template_hash,
};
pub use status::{Rollout, counters, progressing_condition};
use status::{condition, write_status};

use super::context::Context;
use super::error::{Error, StepExt, drain, key, retry_after_error};
use super::owners::{controller_of, selects};

/// Annotation carrying the rollout revision on Deployments and ReplicaSets.
pub const REVISION: &str = "deployment.kubernetes.io/revision";
const DESIRED_REPLICAS: &str = "deployment.kubernetes.io/desired-replicas";
const MAX_REPLICAS: &str = "deployment.kubernetes.io/max-replicas";

/// Runs the Deployment controller until its watches end.
pub async fn run(client: Client) {
    let controller = Controller::new(
        Api::<Deployment>::all(client.clone()),
        watcher::Config::default(),
    )
    .owns(
        Api::<ReplicaSet>::all(client.clone()),
        watcher::Config::default(),
    );
    drain(
        "deployment",
        controller.run(
            reconcile,
            retry_after_error("deployment"),
            Arc::new(Context::new(client, "deployment-controller")),
        ),
    )
    .await;
}

fn revision_of(rs: &ReplicaSet) -> i64 {
    rs.annotations()
        .get(REVISION)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

fn state_of(rs: &ReplicaSet) -> RsState {
    RsState {
        replicas: rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0),
        available: rs
            .status
            .as_ref()
            .and_then(|s| s.available_replicas)
            .unwrap_or(0),
    }
}

async fn reconcile(deploy: Arc<Deployment>, ctx: Arc<Context>) -> Result<Action, Error> {
    let client = &ctx.client;
    let object = key(&deploy.metadata);
    let (Some(ns), Some(uid), Some(spec)) =
        (deploy.namespace(), deploy.uid(), deploy.spec.as_ref())
    else {
        return Ok(Action::await_change());
    };
    if deploy.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let name = deploy.name_any();
    let desired = spec.replicas.unwrap_or(1).max(0);
    let rs_api = Api::<ReplicaSet>::namespaced(client.clone(), &ns);
    let listed = rs_api
        .list(&ListParams::default())
        .await
        .step(&object, "listing replicasets")?
        .items;
    let mut owned: Vec<ReplicaSet> = Vec::new();
    for rs in listed {
        if rs.metadata.deletion_timestamp.is_some() {
            continue;
        }
        match controller_of(&rs.metadata) {
            Some(r) if r.uid == uid => owned.push(rs),
            // An orphan the selector matches is adopted, as kube does.
            None if selects(&spec.selector, rs.metadata.labels.as_ref()) => {
                let rs_name = rs.name_any();
                let mut refs = rs.owner_references().to_vec();
                refs.push(
                    deploy
                        .controller_owner_ref(&())
                        .expect("Deployment has a name and uid"),
                );
                let patch = json!({"metadata": {
                    "ownerReferences": refs,
                    "resourceVersion": rs.metadata.resource_version,
                }});
                match rs_api
                    .patch(&rs_name, &PatchParams::default(), &Patch::Merge(patch))
                    .await
                {
                    Ok(adopted) => owned.push(adopted),
                    Err(e) if is_not_found(&e) => {}
                    Err(e) => {
                        return Err(e).step(&object, format!("adopting replicaset {rs_name}"));
                    }
                }
            }
            _ => {}
        }
    }
    owned.sort_by_key(|rs| {
        (
            rs.metadata.creation_timestamp.clone().map(|t| t.0),
            rs.name_any(),
        )
    });

    let (max_surge, max_unavailable) = match spec.strategy.as_ref().and_then(|s| s.type_.as_deref())
    {
        Some("Recreate") => (0, 0),
        _ => {
            let ru = spec
                .strategy
                .as_ref()
                .and_then(|s| s.rolling_update.as_ref());
            fenceposts(
                ru.and_then(|r| r.max_surge.as_ref()),
                ru.and_then(|r| r.max_unavailable.as_ref()),
                desired,
            )
            .map_err(|reason| Error::Invalid {
                object: object.clone(),
                reason: format!("spec.strategy.rollingUpdate.{reason}"),
            })?
        }
    };
    let recreate = matches!(
        spec.strategy.as_ref().and_then(|s| s.type_.as_deref()),
        Some("Recreate")
    );

    let new_index = owned
        .iter()
        .position(|rs| runs_template(rs, &spec.template));
    let max_old_revision = owned
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != new_index)
        .map(|(_, rs)| revision_of(rs))
        .max()
        .unwrap_or(0);
    let new_revision = max_old_revision + 1;

    let Some(new_index) = new_index else {
        if spec.paused == Some(true) {
            return write_status(client, &deploy, &owned, None, max_unavailable, None).await;
        }
        let olds: Vec<RsState> = owned.iter().map(state_of).collect();
        let old_pods = if recreate {
            running_pods(client, &ns, &object, &owned).await?
        } else {
            0
        };
        let empty = RsState {
            replicas: 0,
            available: 0,
        };
        let initial = if recreate {
            if old_pods > 0 || olds.iter().any(|r| r.replicas > 0) {
                0
            } else {
                desired
            }
        } else {
            rolling_step(desired, max_surge, max_unavailable, &empty, &olds).new
        };
        let collision = deploy.status.as_ref().and_then(|s| s.collision_count);
        let created = create_new_rs(
            &rs_api,
            &deploy,
            initial,
            new_revision,
            max_surge,
            collision,
        )
        .await;
        return match created {
            Ok(rs) => {
                let rs_name = rs.name_any();
                let note = format!("Scaled up replica set {rs_name} from 0 to {initial}");
                ctx.event(deploy.as_ref(), "ScalingReplicaSet", note).await;
                owned.push(rs);
                let progressing = condition(
                    "Progressing",
                    "True",
                    "NewReplicaSetCreated",
                    format!("Created new replica set \"{rs_name}\""),
                );
                write_status(
                    client,
                    &deploy,
                    &owned,
                    Some(owned.len() - 1),
                    max_unavailable,
                    Some(progressing),
                )
                .await
            }
            Err(e) if is_conflict(&e) => {
                // A ReplicaSet of that name exists but is not ours or runs another template:
                // a hash collision. Count it so the next hash differs, as kube does.
                let bumped = collision.unwrap_or(0).saturating_add(1);
                Api::<Deployment>::namespaced(client.clone(), &ns)
                    .patch_status(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"status": {"collisionCount": bumped}})),
                    )
                    .await
                    .step(&object, "recording a pod-template-hash collision")?;
                Ok(Action::requeue(Duration::from_millis(200)))
            }
            Err(e) => Err(e).step(&object, "creating the new replicaset"),
        };
    };

    // An old template rolled back to becomes the newest revision again, and the new
    // ReplicaSet follows the Deployment's minReadySeconds.
    let new_rs = &owned[new_index];
    let stale_revision = revision_of(new_rs) < new_revision;
    let min_ready = new_rs.spec.as_ref().and_then(|s| s.min_ready_seconds);
    // Unset and 0 are the same: comparing them raw would patch on every pass.
    if stale_revision || min_ready.unwrap_or(0) != spec.min_ready_seconds.unwrap_or(0) {
        let rs_name = new_rs.name_any();
        let revision = revision_of(new_rs).max(new_revision).to_string();
        let patch = json!({
            "metadata": {"annotations": {REVISION: revision}},
            "spec": {"minReadySeconds": spec.min_ready_seconds.unwrap_or(0)},
        });
        owned[new_index] = rs_api
            .patch(&rs_name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .step(&object, format!("updating replicaset {rs_name}"))?;
    }
    if deploy.annotations().get(REVISION) != Some(&revision_of(&owned[new_index]).to_string()) {
        Api::<Deployment>::namespaced(client.clone(), &ns)
            .patch(&name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"annotations": {REVISION: revision_of(&owned[new_index]).to_string()}}})))
            .await
            .step(&object, "setting the revision annotation")?;
    }

    let mut wait = None;
    // A scaling event (spec.replicas changed since the ReplicaSets were sized) while
    // several ReplicaSets have pods: resize them proportionally, roll on the next pass.
    let active: Vec<usize> = (0..owned.len())
        .filter(|&i| state_of(&owned[i]).replicas > 0)
        .collect();
    let scaling = active.iter().any(|&i| {
        owned[i]
            .annotations()
            .get(DESIRED_REPLICAS)
            .and_then(|d| d.parse::<i32>().ok())
            .is_some_and(|d| d != desired)
    });
    if scaling && !recreate && active.len() > 1 && !saturated(&owned[new_index], desired) {
        let mut order = active.clone();
        order.retain(|&i| i != new_index);
        order.push(new_index);
        let input: Vec<ScalingRs> = order
            .iter()
            .map(|&i| ScalingRs {
                replicas: state_of(&owned[i]).replicas,
                max_replicas: owned[i]
                    .annotations()
                    .get(MAX_REPLICAS)
                    .and_then(|m| m.parse().ok()),
            })
            .collect();
        let status_replicas = deploy.status.as_ref().and_then(|s| s.replicas).unwrap_or(0);
        let sizes = proportional_sizes(desired, max_surge, &input, status_replicas);
        for (&i, size) in order.iter().zip(sizes) {
            let rs_name = owned[i].name_any();
            owned[i] = scale(&ctx, &deploy, &owned[i], size, desired, max_surge)
                .await
                .step(&object, format!("scaling replicaset {rs_name} to {size}"))?;
        }
        return write_status(
            client,
            &deploy,
            &owned,
            Some(new_index),
            max_unavailable,
            None,
        )
        .await;
    }
    if spec.paused != Some(true) {
        let new = state_of(&owned[new_index]);
        let old_rs: Vec<ReplicaSet> = owned
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != new_index)
            .map(|(_, rs)| rs.clone())
            .collect();
        let olds: Vec<RsState> = old_rs.iter().map(state_of).collect();
        let step = if recreate {
            let old_pods = running_pods(client, &ns, &object, &old_rs).await?;
            if old_pods > 0 {
                // Pods going away change no ReplicaSet status: look again soon.
                wait = Some(Duration::from_millis(500));
            }
            recreate_step(desired, &new, &olds, old_pods)
        } else {
            rolling_step(desired, max_surge, max_unavailable, &new, &olds)
        };
        if step.new != new.replicas {
            let rs_name = owned[new_index].name_any();
            owned[new_index] = scale(
                &ctx,
                &deploy,
                &owned[new_index],
                step.new,
                desired,
                max_surge,
            )
            .await
            .step(
                &object,
                format!("scaling replicaset {rs_name} to {}", step.new),
            )?;
        }
        let mut scaled = Vec::new();
        for (rs, size) in old_rs.iter().zip(&step.olds) {
            if state_of(rs).replicas != *size {
                let rs_name = rs.name_any();
                scaled.push(
                    scale(&ctx, &deploy, rs, *size, desired, max_surge)
                        .await
                        .step(&object, format!("scaling replicaset {rs_name} to {size}"))?,
                );
            }
        }
        for rs in scaled {
            if let Some(slot) = owned.iter_mut().find(|o| o.uid() == rs.uid()) {
                *slot = rs;
            }
        }
        cleanup(
            &rs_api,
            &object,
            &owned,
            new_index,
            spec.revision_history_limit.unwrap_or(10),
        )
        .await?;
    }
    let action = write_status(
        client,
        &deploy,
        &owned,
        Some(new_index),
        max_unavailable,
        None,
    )
    .await?;
    Ok(wait.map_or(action, Action::requeue))
}

/// kube's IsSaturated: the new ReplicaSet alone runs every desired pod, all available.
fn saturated(rs: &ReplicaSet, desired: i32) -> bool {
    let annotated = rs
        .annotations()
        .get(DESIRED_REPLICAS)
        .and_then(|d| d.parse::<i32>().ok());
    let state = state_of(rs);
    state.replicas == desired && annotated == Some(desired) && state.available == desired
}

/// Pods of `replicasets` that still run or may run, terminating ones included: Recreate
/// starts new pods only once these are gone, as kube's oldPodsRunning.
async fn running_pods(
    client: &Client,
    ns: &str,
    object: &str,
    replicasets: &[ReplicaSet],
) -> Result<i32, Error> {
    let uids: Vec<String> = replicasets.iter().filter_map(|rs| rs.uid()).collect();
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .step(object, "listing pods of old replicasets")?;
    let running = pods
        .items
        .iter()
        .filter(|p| controller_of(&p.metadata).is_some_and(|r| uids.contains(&r.uid)))
        .filter(|p| {
            !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        })
        .count();
    Ok(i32::try_from(running).unwrap_or(i32::MAX))
}

async fn create_new_rs(
    api: &Api<ReplicaSet>,
    deploy: &Deployment,
    replicas: i32,
    revision: i64,
    max_surge: i32,
    collision: Option<i32>,
) -> Result<ReplicaSet, kube::Error> {
    let spec = deploy.spec.as_ref().expect("checked by the caller");
    let hash = template_hash(&spec.template, collision);
    let mut template = spec.template.clone();
    let meta = template.metadata.get_or_insert_with(Default::default);
    meta.labels
        .get_or_insert_with(Default::default)
        .insert(HASH_LABEL.into(), hash.clone());
    let mut selector = spec.selector.clone();
    selector
        .match_labels
        .get_or_insert_with(Default::default)
        .insert(HASH_LABEL.into(), hash.clone());
    let desired = spec.replicas.unwrap_or(1);
    let rs = ReplicaSet {
        metadata: ObjectMeta {
            name: Some(format!("{}-{hash}", deploy.name_any())),
            namespace: deploy.namespace(),
            labels: meta.labels.clone(),
            annotations: Some(
                [
                    (REVISION.to_string(), revision.to_string()),
                    (DESIRED_REPLICAS.to_string(), desired.to_string()),
                    (MAX_REPLICAS.to_string(), (desired + max_surge).to_string()),
                ]
                .into(),
            ),
            owner_references: Some(vec![
                deploy
                    .controller_owner_ref(&())
                    .expect("Deployment has a name and uid"),
            ]),
            ..Default::default()
        },
        spec: Some(ReplicaSetSpec {
            replicas: Some(replicas),
            min_ready_seconds: spec.min_ready_seconds,
            selector,
            template: Some(template),
        }),
        status: None,
    };
    match api.create(&PostParams::default(), &rs).await {
        Ok(rs) => Ok(rs),
        Err(e) if is_conflict(&e) => {
            // Ours from an earlier pass whose result we did not see: use it.
            let existing = api.get(&rs.name_any()).await?;
            let ours = controller_of(&existing.metadata)
                .is_some_and(|r| Some(&r.uid) == deploy.metadata.uid.as_ref());
            if ours && runs_template(&existing, &spec.template) {
                Ok(existing)
            } else {
                Err(e)
            }
        }
        Err(e) => Err(e),
    }
}

/// Sets a ReplicaSet's size and the annotations recording what it was sized for, with the
/// ScalingReplicaSet event kube emits.
async fn scale(
    ctx: &Context,
    deploy: &Deployment,
    rs: &ReplicaSet,
    replicas: i32,
    desired: i32,
    max_surge: i32,
) -> Result<ReplicaSet, kube::Error> {
    let api = Api::<ReplicaSet>::namespaced(
        ctx.client.clone(),
        rs.namespace().as_deref().unwrap_or_default(),
    );
    let patch = json!({
        "metadata": {"annotations": {DESIRED_REPLICAS: desired.to_string(), MAX_REPLICAS: (desired + max_surge).to_string()}},
        "spec": {"replicas": replicas},
    });
    let scaled = api
        .patch(
            &rs.name_any(),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await?;
    let before = state_of(rs).replicas;
    if before != replicas {
        let direction = if replicas > before { "up" } else { "down" };
        let note = format!(
            "Scaled {direction} replica set {} from {before} to {replicas}",
            rs.name_any()
        );
        ctx.event(deploy, "ScalingReplicaSet", note).await;
    }
    Ok(scaled)
}

/// Deletes the oldest fully scaled-down old ReplicaSets beyond revisionHistoryLimit.
async fn cleanup(
    api: &Api<ReplicaSet>,
    object: &str,
    owned: &[ReplicaSet],
    new_index: usize,
    limit: i32,
) -> Result<(), Error> {
    let mut idle: Vec<&ReplicaSet> = owned
        .iter()
        .enumerate()
        .filter(|(i, rs)| {
            *i != new_index
                && state_of(rs).replicas == 0
                && rs.status.as_ref().is_none_or(|s| s.replicas == 0)
        })
        .map(|(_, rs)| rs)
        .collect();
    let limit = usize::try_from(limit.max(0)).unwrap_or(0);
    if idle.len() <= limit {
        return Ok(());
    }
    idle.sort_by_key(|rs| revision_of(rs));
    for rs in &idle[..idle.len() - limit] {
        let rs_name = rs.name_any();
        match api.delete(&rs_name, &DeleteParams::default()).await {
            Err(e) if !is_not_found(&e) => {
                return Err(e).step(object, format!("deleting old replicaset {rs_name}"));
            }
            _ => {}
        }
    }
    Ok(())
}
