//! The StatefulSet controller: stable pods `<set>-<ordinal>` with their own claims, ordered or
//! parallel, rolled by revision (ControllerRevisions) from the highest ordinal down to the
//! partition. Observe here, decide in [`plan`], and report the status kube-controller-manager
//! reports.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet, StatefulSetStatus};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, PodTemplateSpec};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use tandem_api::client::{is_conflict, is_not_found};

pub mod plan;

pub use plan::{Observed, Plan, Revision, Step, claim_name, claims_of, new_pod, ordinal_of};

use super::context::Context;
use super::error::{Error, StepExt, drain, key, retry_after_error};
use super::history;
use super::owners::controller_of;

/// Runs the StatefulSet controller until its watches end.
pub async fn run(client: Client) {
    // Only StatefulSet pods carry the pod-name label: the watch stays quiet for every other pod.
    let pods = watcher::Config::default().labels(plan::POD_NAME_LABEL);
    let controller = Controller::new(
        Api::<StatefulSet>::all(client.clone()),
        watcher::Config::default(),
    )
    .owns(Api::<Pod>::all(client.clone()), pods);
    drain(
        "statefulset",
        controller.run(
            reconcile,
            retry_after_error("statefulset"),
            Arc::new(Context::new(client, "statefulset-controller")),
        ),
    )
    .await;
}

/// The snapshot a revision stores (`getPatch`): the pod template, to be replaced whole.
pub fn revision_data(set: &StatefulSet) -> Value {
    let template = set.spec.as_ref().map(|s| &s.template);
    let mut template = serde_json::to_value(template).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut template {
        map.insert("$patch".into(), json!("replace"));
    }
    json!({"spec": {"template": template}})
}

/// The pod template a revision holds.
pub fn template_of(revision: &ControllerRevision) -> PodTemplateSpec {
    let mut template = revision
        .data
        .as_ref()
        .map(|d| d.0["spec"]["template"].clone())
        .unwrap_or(Value::Null);
    if let Value::Object(map) = &mut template {
        map.remove("$patch");
    }
    serde_json::from_value(template).unwrap_or_default()
}

async fn reconcile(set: Arc<StatefulSet>, ctx: Arc<Context>) -> Result<Action, Error> {
    let client = &ctx.client;
    let object = key(&set.metadata);
    let (Some(ns), Some(uid), Some(spec)) = (set.namespace(), set.uid(), set.spec.as_ref()) else {
        return Ok(Action::await_change());
    };
    let set_name = set.name_any();
    let pods_api = Api::<Pod>::namespaced(client.clone(), &ns);
    let listed = pods_api
        .list(&ListParams::default().labels(plan::POD_NAME_LABEL))
        .await
        .step(&object, "listing pods")?;
    let pods = controlled_by(listed.items, &uid);

    // Revisions: the set's template now is the update revision; the status names the current.
    let revisions_api = Api::<ControllerRevision>::namespaced(client.clone(), &ns);
    let listed = revisions_api
        .list(&ListParams::default())
        .await
        .step(&object, "listing controllerrevisions")?;
    let mut revisions = controlled_by(listed.items, &uid);
    history::sort(&mut revisions);
    let old_status = set.status.clone().unwrap_or_default();
    let mut collision_count = old_status.collision_count.unwrap_or(0);
    let data = revision_data(&set);
    let next = history::next_number(&revisions);
    let template_labels = spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let candidate = history::new_revision(
        &set_name,
        &ns,
        plan::set_owner(&set),
        &template_labels,
        data.clone(),
        next,
        None,
    );
    let equal: Vec<&ControllerRevision> = revisions
        .iter()
        .filter(|r| history::equal(r, &candidate))
        .collect();
    let update = match (equal.last(), revisions.last()) {
        (Some(e), Some(latest)) if e.metadata.name == latest.metadata.name => (*e).clone(),
        (Some(e), _) => {
            // Back to an earlier template: that revision becomes the newest again.
            let name = e.name_any();
            revisions_api
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"revision": next})),
                )
                .await
                .step(&object, format!("renumbering controllerrevision {name}"))?
        }
        (None, _) => {
            let created = history::create(&revisions_api, collision_count, |probe| {
                history::new_revision(
                    &set_name,
                    &ns,
                    plan::set_owner(&set),
                    &template_labels,
                    data.clone(),
                    next,
                    probe,
                )
            })
            .await
            .step(&object, "creating controllerrevision")?;
            collision_count = created.collision_count;
            revisions.push(created.revision.clone());
            created.revision
        }
    };
    let current = old_status
        .current_revision
        .as_deref()
        .and_then(|c| {
            revisions
                .iter()
                .find(|r| r.metadata.name.as_deref() == Some(c))
        })
        .cloned()
        .unwrap_or_else(|| update.clone());
    let (current_template, update_template) = (template_of(&current), template_of(&update));
    let (current_name, update_name) = (current.name_any(), update.name_any());

    let claims_api = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns);
    let claims: BTreeMap<String, PersistentVolumeClaim> = if spec
        .volume_claim_templates
        .as_ref()
        .is_some_and(|t| !t.is_empty())
    {
        claims_api
            .list(&ListParams::default())
            .await
            .step(&object, "listing persistentvolumeclaims")?
            .items
            .into_iter()
            .map(|c| (c.name_any(), c))
            .collect()
    } else {
        BTreeMap::new()
    };

    let decided = plan::plan(&Observed {
        set: &set,
        pods: &pods,
        claims: &claims,
        current: Revision {
            name: &current_name,
            template: &current_template,
        },
        update: Revision {
            name: &update_name,
            template: &update_template,
        },
        collision_count,
        now: k8s_openapi::jiff::Timestamp::now(),
    });

    let mut failure = None;
    for step in decided.steps {
        if let Err(e) = apply(&ctx, &set, &object, step).await {
            failure = Some(e);
            break;
        }
    }

    if status_changed(&old_status, &decided.status) {
        Api::<StatefulSet>::namespaced(client.clone(), &ns)
            .patch_status(
                &set_name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": decided.status})),
            )
            .await
            .step(&object, "updating status")?;
    }

    // Keep revisionHistoryLimit revisions besides those in use.
    let mut live: HashSet<&str> = [current_name.as_str(), update_name.as_str()].into();
    for pod in &pods {
        if let Some(r) = pod.labels().get(history::POD_REVISION_LABEL) {
            live.insert(r);
        }
    }
    history::sort(&mut revisions);
    for name in history::to_truncate(&revisions, &live, spec.revision_history_limit.unwrap_or(10)) {
        match revisions_api.delete(&name, &DeleteParams::default()).await {
            Err(e) if !is_not_found(&e) => {
                return Err(e).step(&object, format!("deleting controllerrevision {name}"));
            }
            _ => {}
        }
    }

    if let Some(e) = failure {
        return Err(e);
    }
    Ok(match decided.recheck {
        Some(after) => Action::requeue(after + Duration::from_millis(100)),
        None => Action::await_change(),
    })
}

/// The objects among `items` whose controller has `uid`.
fn controlled_by<K: kube::Resource>(items: Vec<K>, uid: &str) -> Vec<K> {
    items
        .into_iter()
        .filter(|o| controller_of(o.meta()).is_some_and(|r| r.uid == uid))
        .collect()
}

/// Carries out one step, with the event kube-controller-manager records for it.
async fn apply(ctx: &Context, set: &StatefulSet, object: &str, step: Step) -> Result<(), Error> {
    let ns = set.namespace().unwrap_or_default();
    let set_name = set.name_any();
    let pods_api = Api::<Pod>::namespaced(ctx.client.clone(), &ns);
    let claims_api = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &ns);
    match step {
        Step::CreateClaim(claim) => {
            let name = claim.name_any();
            match claims_api.create(&PostParams::default(), &claim).await {
                Ok(_) => {
                    let pod = name
                        .strip_prefix(&format!(
                            "{}-",
                            claim_template_name(set, &name).unwrap_or_default()
                        ))
                        .unwrap_or(&name)
                        .to_string();
                    let note =
                        format!("create Claim {name} Pod {pod} in StatefulSet {set_name} success");
                    ctx.event(set, "SuccessfulCreate", note).await;
                }
                Err(e) if is_conflict(&e) => {}
                Err(e) => return Err(e).step(object, format!("creating claim {name}")),
            }
        }
        Step::CreatePod(pod) => {
            let name = pod.name_any();
            pods_api
                .create(&PostParams::default(), &pod)
                .await
                .step(object, format!("creating pod {name}"))?;
            let note = format!("create Pod {name} in StatefulSet {set_name} successful");
            ctx.event(set, "SuccessfulCreate", note).await;
        }
        Step::DeletePod(name) => match pods_api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {
                let note = format!("delete Pod {name} in StatefulSet {set_name} successful");
                ctx.event(set, "SuccessfulDelete", note).await;
            }
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(e).step(object, format!("deleting pod {name}")),
        },
        Step::SetClaimOwners { claim, owners } => {
            claims_api
                .patch(
                    &claim,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"ownerReferences": owners}})),
                )
                .await
                .or_else(|e| {
                    if is_not_found(&e) {
                        Ok(Default::default())
                    } else {
                        Err(e)
                    }
                })
                .step(object, format!("updating owners of claim {claim}"))?;
        }
    }
    Ok(())
}

/// The volumeClaimTemplate a claim name `<template>-<set>-<ordinal>` was made from.
fn claim_template_name(set: &StatefulSet, claim: &str) -> Option<String> {
    set.spec
        .as_ref()?
        .volume_claim_templates
        .iter()
        .flatten()
        .filter_map(|t| t.metadata.name.clone())
        .find(|t| claim.starts_with(&format!("{t}-{}-", set.name_any())))
}

fn status_changed(old: &StatefulSetStatus, new: &StatefulSetStatus) -> bool {
    let key = |s: &StatefulSetStatus| {
        (
            s.observed_generation,
            s.replicas,
            s.ready_replicas.unwrap_or(0),
            s.available_replicas.unwrap_or(0),
            s.current_replicas.unwrap_or(0),
            s.updated_replicas.unwrap_or(0),
            s.current_revision.clone(),
            s.update_revision.clone(),
            s.collision_count.unwrap_or(0),
        )
    };
    key(old) != key(new)
}
