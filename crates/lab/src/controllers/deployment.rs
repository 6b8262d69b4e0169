//! The Deployment controller: one ReplicaSet per pod template (`<deploy>-<pod-template-hash>`),
//! rolled by the RollingUpdate or Recreate strategy, old ones pruned to
//! revisionHistoryLimit, and the status `kubectl rollout status` reads.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentCondition, DeploymentStatus, ReplicaSet, ReplicaSetSpec,
};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

use super::{
    Context, Error, StepExt, controller_of, drain, is_conflict, is_not_found, key,
    retry_after_error, selects,
};

/// Label (and RS name suffix) naming the pod template a ReplicaSet runs.
pub const HASH_LABEL: &str = "pod-template-hash";
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

/// One ReplicaSet of a Deployment, as the planner sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RsState {
    /// spec.replicas.
    pub replicas: i32,
    /// status.availableReplicas.
    pub available: i32,
}

/// Resolves maxSurge/maxUnavailable against `total`: ints as they are, percentages of
/// `total` rounded up (surge) or down (unavailable), as kube's intstr helper does.
pub fn resolve(
    value: Option<&IntOrString>,
    default: &str,
    total: i32,
    round_up: bool,
) -> Result<i32, String> {
    let value = value
        .cloned()
        .unwrap_or_else(|| IntOrString::String(default.into()));
    match value {
        IntOrString::Int(i) => Ok(i.max(0)),
        IntOrString::String(s) => {
            let percent: i64 = s
                .strip_suffix('%')
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| {
                    format!("invalid value {s:?}: must be an integer or a percentage")
                })?;
            let scaled = percent * i64::from(total);
            let v = if round_up {
                (scaled + 99).div_euclid(100)
            } else {
                scaled.div_euclid(100)
            };
            Ok(i32::try_from(v.max(0)).unwrap_or(i32::MAX))
        }
    }
}

/// kube's ResolveFenceposts: (maxSurge, maxUnavailable) for `desired` replicas; both zero
/// would deadlock a rollout, so maxUnavailable becomes 1 then.
pub fn fenceposts(
    surge: Option<&IntOrString>,
    unavailable: Option<&IntOrString>,
    desired: i32,
) -> Result<(i32, i32), String> {
    let surge = resolve(surge, "25%", desired, true).map_err(|e| format!("maxSurge: {e}"))?;
    let unavailable =
        resolve(unavailable, "25%", desired, false).map_err(|e| format!("maxUnavailable: {e}"))?;
    Ok(if surge == 0 && unavailable == 0 {
        (0, 1)
    } else {
        (surge, unavailable)
    })
}

/// kube's NewRSNewReplicas: how big the new ReplicaSet may grow now without exceeding
/// desired + maxSurge pods in total (`total` counts spec.replicas of every ReplicaSet).
pub fn new_rs_size(desired: i32, max_surge: i32, new: i32, total: i32) -> i32 {
    if new >= desired {
        return desired;
    }
    let max_total = desired + max_surge;
    if total >= max_total {
        return new;
    }
    new + (max_total - total).min(desired - new)
}

/// kube's reconcileOldReplicaSets: new sizes of the old ReplicaSets (oldest first) so that
/// at least desired - maxUnavailable pods stay available. Unhealthy old pods go first;
/// healthy ones only as far as availability allows. An RS never counts more available pods
/// than its spec keeps, so a status not yet updated after a scale-down cannot make the
/// controller scale down twice.
pub fn old_rs_sizes(
    desired: i32,
    max_unavailable: i32,
    new: &RsState,
    olds: &[RsState],
) -> Vec<i32> {
    let mut sizes: Vec<i32> = olds.iter().map(|r| r.replicas).collect();
    let all: i32 = new.replicas + sizes.iter().sum::<i32>();
    let min_available = desired - max_unavailable.min(desired);
    let new_unavailable = (new.replicas - new.available).max(0);
    let mut budget = all - min_available - new_unavailable;
    if budget <= 0 {
        return sizes;
    }
    for (size, rs) in sizes.iter_mut().zip(olds) {
        let unhealthy = *size - rs.available.min(*size);
        let cut = unhealthy.min(budget);
        if cut > 0 {
            *size -= cut;
            budget -= cut;
        }
    }
    let available: i32 = new.available.min(new.replicas)
        + sizes
            .iter()
            .zip(olds)
            .map(|(s, r)| r.available.min(*s))
            .sum::<i32>();
    let mut excess = (available - min_available).min(budget);
    for size in sizes.iter_mut() {
        if excess <= 0 {
            break;
        }
        let cut = (*size).min(excess);
        *size -= cut;
        excess -= cut;
    }
    sizes
}

/// What one pass of a rollout changes: the new ReplicaSet's size and the old ones' sizes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// spec.replicas of the new ReplicaSet.
    pub new: i32,
    /// spec.replicas of each old ReplicaSet, in the order given.
    pub olds: Vec<i32>,
}

/// One RollingUpdate pass, as kube's rolloutRolling: grow the new RS if surge allows,
/// otherwise shrink old ones if availability allows.
pub fn rolling_step(
    desired: i32,
    max_surge: i32,
    max_unavailable: i32,
    new: &RsState,
    olds: &[RsState],
) -> Step {
    let total = new.replicas + olds.iter().map(|r| r.replicas).sum::<i32>();
    let grown = if new.replicas > desired {
        desired
    } else {
        new_rs_size(desired, max_surge, new.replicas, total)
    };
    if grown != new.replicas {
        return Step {
            new: grown,
            olds: olds.iter().map(|r| r.replicas).collect(),
        };
    }
    Step {
        new: new.replicas,
        olds: old_rs_sizes(desired, max_unavailable, new, olds),
    }
}

/// One ReplicaSet as kube's proportional scaling sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScalingRs {
    /// spec.replicas.
    pub replicas: i32,
    /// The max-replicas annotation: desired + maxSurge when it was last sized.
    pub max_replicas: Option<i32>,
}

/// kube's proportional scaling when spec.replicas changes while several ReplicaSets have
/// pods: each grows or shrinks in proportion to its share, within desired + maxSurge, the
/// rounding leftover going to the biggest. `rss` are ordered oldest first, the new one
/// last; `status_replicas` stands in for a missing annotation. Returns new sizes in order.
pub fn proportional_sizes(
    desired: i32,
    max_surge: i32,
    rss: &[ScalingRs],
    status_replicas: i32,
) -> Vec<i32> {
    let mut sizes: Vec<i32> = rss.iter().map(|r| r.replicas).collect();
    let allowed = if desired > 0 { desired + max_surge } else { 0 };
    let to_add = allowed - sizes.iter().sum::<i32>();
    if to_add == 0 {
        return sizes;
    }
    // Biggest first; among equals the newest when growing, the oldest when shrinking.
    let mut order: Vec<usize> = (0..rss.len()).collect();
    order.sort_by_key(|&i| {
        let age = if to_add > 0 { -(i as i64) } else { i as i64 };
        (-rss[i].replicas, age)
    });
    let mut added = 0;
    for &i in &order {
        let rs = &rss[i];
        if rs.replicas == 0 || added == to_add {
            continue;
        }
        let fraction = if desired == 0 {
            -rs.replicas
        } else {
            let annotated = rs.max_replicas.unwrap_or(status_replicas).max(1);
            let scaled = f64::from(rs.replicas) * f64::from(allowed) / f64::from(annotated);
            scaled.round() as i32 - rs.replicas
        };
        let allowed_now = to_add - added;
        let proportion = if to_add > 0 {
            fraction.min(allowed_now)
        } else {
            fraction.max(allowed_now)
        };
        sizes[i] += proportion;
        added += proportion;
    }
    if let Some(&biggest) = order.first() {
        sizes[biggest] = (sizes[biggest] + to_add - added).max(0);
    }
    sizes
}

/// One Recreate pass: every old pod goes before the new RS gets any. `old_pods` counts the
/// old ReplicaSets' pods still existing (their status.replicas).
pub fn recreate_step(desired: i32, new: &RsState, olds: &[RsState], old_pods: i32) -> Step {
    if olds.iter().any(|r| r.replicas > 0) || old_pods > 0 {
        return Step {
            new: new.replicas.min(0),
            olds: vec![0; olds.len()],
        };
    }
    Step {
        new: desired,
        olds: vec![0; olds.len()],
    }
}

/// The pod-template-hash of a template: FNV-1a (32 bit) of its JSON form and the collision
/// count, written with kube's vowel-free alphabet so names never spell words.
pub fn template_hash(template: &PodTemplateSpec, collision_count: Option<i32>) -> String {
    let mut hash: u32 = 0x811c_9dc5;
    let mut feed = |bytes: &[u8]| {
        for b in bytes {
            hash ^= u32::from(*b);
            hash = hash.wrapping_mul(0x0100_0193);
        }
    };
    feed(&serde_json::to_vec(template).unwrap_or_default());
    if let Some(c) = collision_count {
        feed(&c.to_le_bytes());
    }
    const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    hash.to_string()
        .bytes()
        .map(|b| ALPHANUMS[usize::from(b) % ALPHANUMS.len()] as char)
        .collect()
}

/// Whether a ReplicaSet runs `template` (its pod-template-hash label aside).
pub fn runs_template(rs: &ReplicaSet, template: &PodTemplateSpec) -> bool {
    let Some(mut rs_template) = rs.spec.as_ref().and_then(|s| s.template.clone()) else {
        return false;
    };
    if let Some(labels) = rs_template
        .metadata
        .as_mut()
        .and_then(|m| m.labels.as_mut())
    {
        labels.remove(HASH_LABEL);
    }
    serde_json::to_value(&rs_template).ok() == serde_json::to_value(template).ok()
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

fn condition(type_: &str, status: &str, reason: &str, message: String) -> DeploymentCondition {
    condition_at(Timestamp::now(), type_, status, reason, message)
}

fn condition_at(
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
fn set_condition(conditions: &mut Vec<DeploymentCondition>, mut cond: DeploymentCondition) {
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

async fn write_status(
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

    fn rs(replicas: i32, available: i32) -> RsState {
        RsState {
            replicas,
            available,
        }
    }

    #[test]
    fn surge_rounds_up_and_unavailable_rounds_down() {
        let int = |i| Some(IntOrString::Int(i));
        let pct = |s: &str| Some(IntOrString::String(s.into()));
        // (surge, unavailable, desired, expected (surge, unavailable))
        let cases = [
            (pct("25%"), pct("25%"), 10, (3, 2)),
            (pct("25%"), pct("25%"), 4, (1, 1)),
            (pct("25%"), pct("25%"), 1, (1, 0)),
            (int(0), int(0), 5, (0, 1)),
            (int(2), pct("50%"), 5, (2, 2)),
            (None, None, 20, (5, 5)),
            (pct("0%"), pct("100%"), 3, (0, 3)),
        ];
        for (surge, unavailable, desired, want) in cases {
            assert_eq!(
                fenceposts(surge.as_ref(), unavailable.as_ref(), desired),
                Ok(want),
                "{surge:?} {unavailable:?} of {desired}"
            );
        }
        assert!(
            fenceposts(Some(&IntOrString::String("lots".into())), None, 3)
                .unwrap_err()
                .contains("maxSurge")
        );
    }

    #[test]
    fn rolling_steps_follow_kube() {
        // (what, desired, surge, unavailable, new, olds, expected step)
        let cases = [
            (
                "first rollout creates everything",
                20,
                5,
                5,
                rs(0, 0),
                vec![],
                Step {
                    new: 20,
                    olds: vec![],
                },
            ),
            (
                "new RS grows by the surge",
                4,
                1,
                1,
                rs(0, 0),
                vec![rs(4, 4)],
                Step {
                    new: 1,
                    olds: vec![4],
                },
            ),
            (
                "then old shrinks down to min available",
                4,
                1,
                1,
                rs(1, 0),
                vec![rs(4, 4)],
                Step {
                    new: 1,
                    olds: vec![3],
                },
            ),
            (
                "then new grows again",
                4,
                1,
                1,
                rs(1, 0),
                vec![rs(3, 3)],
                Step {
                    new: 2,
                    olds: vec![3],
                },
            ),
            (
                "nothing while new pods are unavailable",
                4,
                1,
                1,
                rs(2, 0),
                vec![rs(3, 3)],
                Step {
                    new: 2,
                    olds: vec![3],
                },
            ),
            (
                "one new available frees one old",
                4,
                1,
                1,
                rs(2, 1),
                vec![rs(3, 3)],
                Step {
                    new: 2,
                    olds: vec![2],
                },
            ),
            (
                "stale old status never double-counts",
                4,
                1,
                1,
                rs(3, 2),
                vec![rs(2, 3)],
                Step {
                    new: 3,
                    olds: vec![1],
                },
            ),
            (
                "unhealthy old pods go first",
                4,
                1,
                1,
                rs(1, 1),
                vec![rs(2, 0), rs(2, 2)],
                Step {
                    new: 1,
                    olds: vec![0, 2],
                },
            ),
            (
                "surge 0 scales old first",
                3,
                0,
                1,
                rs(0, 0),
                vec![rs(3, 3)],
                Step {
                    new: 0,
                    olds: vec![2],
                },
            ),
            (
                "scale down of a finished rollout",
                5,
                2,
                1,
                rs(20, 20),
                vec![],
                Step {
                    new: 5,
                    olds: vec![],
                },
            ),
            (
                "scale up of a finished rollout",
                20,
                5,
                5,
                rs(5, 5),
                vec![],
                Step {
                    new: 20,
                    olds: vec![],
                },
            ),
            (
                "done",
                4,
                1,
                1,
                rs(4, 4),
                vec![rs(0, 0)],
                Step {
                    new: 4,
                    olds: vec![0],
                },
            ),
        ];
        for (what, desired, surge, unavailable, new, olds, want) in cases {
            assert_eq!(
                rolling_step(desired, surge, unavailable, &new, &olds),
                want,
                "{what}"
            );
        }
    }

    #[test]
    fn recreate_waits_for_old_pods() {
        let cases = [
            (
                "old RS still sized",
                rs(0, 0),
                vec![rs(3, 3)],
                3,
                Step {
                    new: 0,
                    olds: vec![0],
                },
            ),
            (
                "old pods still terminating",
                rs(0, 0),
                vec![rs(0, 0)],
                2,
                Step {
                    new: 0,
                    olds: vec![0],
                },
            ),
            (
                "old pods gone",
                rs(0, 0),
                vec![rs(0, 0)],
                0,
                Step {
                    new: 3,
                    olds: vec![0],
                },
            ),
        ];
        for (what, new, olds, old_pods, want) in cases {
            assert_eq!(recreate_step(3, &new, &olds, old_pods), want, "{what}");
        }
    }

    #[test]
    fn template_hash_depends_on_template_and_collisions() {
        let mut a = PodTemplateSpec::default();
        let h = template_hash(&a, None);
        assert_eq!(h, template_hash(&a, None), "stable");
        assert!(
            h.bytes()
                .all(|b| b"bcdfghjklmnpqrstvwxz2456789".contains(&b)),
            "{h}"
        );
        assert_ne!(h, template_hash(&a, Some(1)));
        a.metadata = Some(ObjectMeta {
            labels: Some([("app".to_string(), "x".to_string())].into()),
            ..Default::default()
        });
        assert_ne!(h, template_hash(&a, None));
    }

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

    #[test]
    fn scaling_mid_rollout_is_proportional() {
        let rs = |replicas, max| ScalingRs {
            replicas,
            max_replicas: Some(max),
        };
        // (what, desired, surge, [old..., new], expected sizes)
        let cases = [
            // kube's documented example: 10 -> 15 replicas, maxSurge 3, RSs of 8 and 5.
            ("scale up", 15, 3, vec![rs(8, 13), rs(5, 13)], vec![11, 7]),
            ("scale down", 5, 1, vec![rs(8, 13), rs(5, 13)], vec![4, 2]),
            ("to zero", 0, 3, vec![rs(8, 13), rs(5, 13)], vec![0, 0]),
            (
                "nothing to add",
                10,
                3,
                vec![rs(8, 13), rs(5, 13)],
                vec![8, 5],
            ),
            (
                "equals: the newest grows first",
                20,
                0,
                vec![rs(1, 3), rs(1, 3), rs(1, 3)],
                vec![6, 7, 7],
            ),
            (
                "leftover goes to the biggest",
                10,
                0,
                vec![rs(1, 3), rs(1, 3)],
                vec![3, 7],
            ),
        ];
        for (what, desired, surge, rss, want) in cases {
            let got = proportional_sizes(desired, surge, &rss, 0);
            assert_eq!(got, want, "{what}");
            let total: i32 = got.iter().sum();
            let allowed = if desired > 0 { desired + surge } else { 0 };
            assert_eq!(total, allowed, "{what}: sizes add up to desired + maxSurge");
        }
    }
}
