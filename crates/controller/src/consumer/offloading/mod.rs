//! Namespace offloading: for the `NamespaceOffloading` named `offloading` in a namespace, asks
//! every selected provider for a twin namespace (a `RemoteNamespace` in our tenant namespace
//! there), reports them in its status, and labels the namespace so the placement webhook sees
//! its pods. Re-converges when providers come and go; on deletion removes the twins first.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event as CoreEvent, Namespace};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{Event, finalizer};
use kube::runtime::watcher;
use serde_json::json;
use tandem_api::client;
use tandem_api::conditions::{self, ConditionStatus};
use tandem_api::{
    NamespaceOffloading, PodOffloadingStrategy, RemoteNamespace, RemoteNamespaceStatus, names,
};

use crate::consumer::link::{Links, ProviderLink};
use crate::context::Ctx;
use crate::install::apply;

mod plan;

pub use plan::{
    OFFLOADING_ENABLED, OFFLOADING_LABEL, placement, selector_terms, virtual_node_labels,
};
use plan::{Removal, Status, Step};

struct State {
    ctx: Ctx,
    links: Links,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("NamespaceOffloading {0}: {1}")]
    Kube(String, &'static str, #[source] kube::Error),
    #[error("NamespaceOffloading {0}: waiting for twin namespaces to go on {1}")]
    Waiting(String, String),
    #[error("NamespaceOffloading {0}: finalizer")]
    Finalizer(
        String,
        #[source] Box<kube::runtime::finalizer::Error<Error>>,
    ),
}

/// Runs the reconciler; every change of the provider links re-reconciles every offloading.
pub async fn run(ctx: Ctx, links: Links) {
    let api: Api<NamespaceOffloading> = Api::all(ctx.client.clone());
    let link_changes = links.changes();
    Controller::new(api, watcher::Config::default())
        .reconcile_all_on(link_changes)
        .run(
            crate::metrics::timed(ctx.metrics.clone(), "namespaceoffloading", reconcile),
            error_policy,
            Arc::new(State { ctx, links }),
        )
        .for_each(|_| async {})
        .await;
}

fn error_policy(_o: Arc<NamespaceOffloading>, error: &Error, _s: Arc<State>) -> Action {
    match error {
        Error::Waiting(..) => tracing::debug!(%error),
        _ => tracing::warn!(error = %crate::error::chain(error), "reconciling"),
    }
    Action::requeue(Duration::from_secs(1))
}

fn key(o: &NamespaceOffloading) -> String {
    format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any())
}

async fn reconcile(o: Arc<NamespaceOffloading>, state: Arc<State>) -> Result<Action, Error> {
    let k = key(&o);
    let ns = o.namespace().unwrap_or_default();
    let api: Api<NamespaceOffloading> = Api::namespaced(state.ctx.client.clone(), &ns);
    if let Err(refusal) = plan::heeded(&o) {
        write_status(&api, &o, refusal.status(&o)).await?;
        return Ok(Action::await_change());
    }
    finalizer(&api, names::FINALIZER, o, |event| async {
        match event {
            Event::Apply(o) => converge(&state, &api, &o).await,
            Event::Cleanup(o) => cleanup(&state, &api, &o).await,
        }
    })
    .await
    .map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        other => Error::Finalizer(k, Box::new(other)),
    })
}

async fn set_namespace_label(
    state: &State,
    o: &NamespaceOffloading,
    value: Option<&str>,
) -> Result<(), Error> {
    let namespaces: Api<Namespace> = Api::all(state.ctx.client.clone());
    let ns = o.namespace().unwrap_or_default();
    match namespaces
        .patch(
            &ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {OFFLOADING_LABEL: value}}})),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if client::is_not_found(&e) && value.is_none() => Ok(()),
        Err(e) => Err(Error::Kube(key(o), "labelling its namespace", e)),
    }
}

async fn converge(
    state: &State,
    api: &Api<NamespaceOffloading>,
    o: &NamespaceOffloading,
) -> Result<Action, Error> {
    let ns = o.namespace().unwrap_or_default();
    let terms = selector_terms(o);
    // A selector the API server let through but that means nothing is reported, and changes
    // nothing: no twin namespace is added or removed on its account.
    if let Err(refusal) = plan::usable_selector(&terms) {
        write_status(api, o, refusal.status(o)).await?;
        return Ok(Action::await_change());
    }
    set_namespace_label(state, o, Some(OFFLOADING_ENABLED)).await?;
    let twin = match plan::twin_name(o, &ns, &state.ctx.identity.cluster_id) {
        Ok(t) => t,
        Err(refusal) => {
            write_status(api, o, refusal.status(o)).await?;
            return Ok(Action::await_change());
        }
    };
    let mut entries = Vec::new();
    for (id, link) in state.links.snapshot() {
        if plan::selection(o, &terms, &link.provider_id, &link.node_labels).is_err() {
            if let Err(e) = remove_twin(&link, &ns, false).await {
                tracing::warn!(offloading = %key(o), provider = %id, error = %e, "removing an unselected twin namespace");
            }
            continue;
        }
        let (phase, message) =
            match ensure_twin(&link, &ns, &twin, o.spec.pod_offloading_strategy).await {
                Ok(pm) => pm,
                Err(e) => plan::failed_answer(e),
            };
        entries.push(RemoteNamespaceStatus {
            cluster_id: id,
            namespace: twin.clone(),
            phase,
            message,
        });
    }
    let status = plan::converged(entries);
    let requeue = status.requeue();
    write_status(api, o, status).await?;
    Ok(Action::requeue(requeue))
}

/// Ensures the RemoteNamespace for `ns` on `link`'s provider asks for `twin`; returns the
/// provider's answer (phase, message).
async fn ensure_twin(
    link: &ProviderLink,
    ns: &str,
    twin: &str,
    pods: PodOffloadingStrategy,
) -> Result<plan::Answer, kube::Error> {
    let api: Api<RemoteNamespace> =
        Api::namespaced(link.client.clone(), &link.remote_tenant_namespace);
    let step = plan::twin_step(api.get_opt(ns).await?.as_ref(), twin);
    match &step {
        Step::AwaitTerminating => {}
        Step::DeletePrevious { .. } => {
            api.delete(ns, &DeleteParams::default()).await?;
        }
        Step::RequestTwin => {
            let applied = apply(&api, &plan::desired_twin(ns, twin, pods)).await?;
            return Ok(plan::applied_answer(applied.status));
        }
    }
    Ok(step.answer().unwrap_or_default())
}

/// Deletes the RemoteNamespace for `ns` on `link`'s provider; Ok(true) once it is gone. With
/// `delete_data` it is annotated first, so that the provider deletes a twin holding claims
/// instead of retaining it.
async fn remove_twin(
    link: &ProviderLink,
    ns: &str,
    delete_data: bool,
) -> Result<bool, kube::Error> {
    let api: Api<RemoteNamespace> =
        Api::namespaced(link.client.clone(), &link.remote_tenant_namespace);
    match plan::removal(api.get_opt(ns).await?.as_ref(), delete_data) {
        Removal::Gone => Ok(true),
        Removal::Remove { annotate, delete } => {
            if annotate {
                api.patch(
                    ns,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"annotations": {
                        names::DELETE_DATA_ANNOTATION: "true"}}})),
                )
                .await?;
            }
            if delete {
                match api.delete(ns, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(e) if client::is_not_found(&e) => return Ok(true),
                    Err(e) => return Err(e),
                }
            }
            Ok(false)
        }
    }
}

async fn cleanup(
    state: &State,
    api: &Api<NamespaceOffloading>,
    o: &NamespaceOffloading,
) -> Result<Action, Error> {
    let ns = o.namespace().unwrap_or_default();
    if let Some(status) = plan::terminating(o) {
        write_status(api, o, status).await?;
    }
    let delete_data = o.annotations().contains_key(names::DELETE_DATA_ANNOTATION);
    let mut waiting = Vec::new();
    for (id, link) in state.links.snapshot() {
        if let Some(twin) = plan::known_twin(o, &id) {
            match settle_data(state, o, &link, twin, delete_data).await {
                Ok(true) => {}
                Ok(false) => {
                    waiting.push(format!("{id} (deleting claims)"));
                    continue;
                }
                Err(e) => {
                    tracing::warn!(offloading = %key(o), provider = %id, error = %e, "claims in the twin namespace");
                    waiting.push(id);
                    continue;
                }
            }
        }
        match remove_twin(&link, &ns, delete_data).await {
            Ok(true) => {}
            Ok(false) => waiting.push(id),
            Err(e) => {
                tracing::warn!(offloading = %key(o), provider = %id, error = %e, "removing twin namespace");
                waiting.push(id);
            }
        }
    }
    if !waiting.is_empty() {
        return Err(Error::Waiting(key(o), waiting.join(", ")));
    }
    set_namespace_label(state, o, None).await?;
    Ok(Action::await_change())
}

/// Before a twin namespace goes: without `delete_data`, reports the claims the provider will
/// retain, in an Event on the namespace (`DataRetained`, naming each) and the log. With it,
/// nothing: the RemoteNamespace's annotation has the provider delete the whole twin (deleting
/// claims one by one would wait on the pods still using them).
async fn settle_data(
    state: &State,
    o: &NamespaceOffloading,
    link: &ProviderLink,
    twin: &str,
    delete_data: bool,
) -> Result<bool, kube::Error> {
    if plan::lists_claims(delete_data).is_err() {
        return Ok(true);
    }
    let claims = crate::consumer::storage::remote_claims(link, twin).await?;
    let ns = o.namespace().unwrap_or_default();
    let Ok(report) = plan::data_retained(&ns, &link.provider_id, twin, &claims) else {
        return Ok(true);
    };
    tracing::info!(offloading = %key(o), provider = %link.provider_id, %twin, claims = %report.claims, "claims retained");
    if let Err(e) = Api::<CoreEvent>::namespaced(state.ctx.client.clone(), &ns)
        .patch(
            &report.name,
            &PatchParams::apply(names::FIELD_MANAGER).force(),
            &Patch::Apply(&report.event),
        )
        .await
    {
        tracing::debug!(offloading = %key(o), error = %e, "writing the DataRetained Event");
    }
    Ok(true)
}

/// Writes what the plan says the status of `o` is, unless it says so already.
async fn write_status(
    api: &Api<NamespaceOffloading>,
    o: &NamespaceOffloading,
    want: Status,
) -> Result<(), Error> {
    let Status {
        phase,
        remote_namespaces,
        reason,
        message,
    } = want;
    let mut status = o.status.clone().unwrap_or_default();
    let mut changed = status.phase.as_deref() != Some(phase);
    status.phase = Some(phase.to_string());
    if status.remote_namespaces != remote_namespaces {
        status.remote_namespaces = remote_namespaces;
        changed = true;
    }
    changed |= conditions::set_condition(
        &mut status.conditions,
        conditions::READY,
        ConditionStatus::from(phase == "Ready"),
        reason,
        &message,
        o.metadata.generation,
    );
    if !changed {
        return Ok(());
    }
    // Explicit, so that a merge patch empties a list that became empty.
    let mut body = json!({"status": status});
    body["status"]["remoteNamespaces"] = json!(status.remote_namespaces);
    api.patch_status(&o.name_any(), &PatchParams::default(), &Patch::Merge(body))
        .await
        .map_err(|e| Error::Kube(key(o), "writing its status", e))?;
    Ok(())
}
