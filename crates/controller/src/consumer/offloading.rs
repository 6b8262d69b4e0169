//! Namespace offloading: for the `NamespaceOffloading` named `offloading` in a namespace, asks
//! every selected provider for a twin namespace (a `RemoteNamespace` in our tenant namespace
//! there), reports them in its status, and labels the namespace so the placement webhook sees
//! its pods. Re-converges when providers come and go; on deletion removes the twins first.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event as CoreEvent, Namespace};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{Event, finalizer};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tandem_api::client;
use tandem_api::conditions::{self, ConditionStatus};
use tandem_api::{
    NamespaceMappingStrategy, NamespaceOffloading, PodOffloadingStrategy, RemoteNamespace,
    RemoteNamespaceSpec, RemoteNamespaceStatus, names,
};
use tandem_core::offloading::{self as rules, NamespaceMapping, PodPlacement, SelectorTerm};

use crate::consumer::link::{Links, ProviderLink};
use crate::context::Ctx;
use crate::install::apply;

/// Label on offloaded namespaces (value `enabled`); the placement webhook selects on it.
pub const OFFLOADING_LABEL: &str = "tandem.dev/offloading";
pub const OFFLOADING_ENABLED: &str = "enabled";

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
    if o.name_any() != names::OFFLOADING_NAME {
        let message = format!(
            "ignored: only the NamespaceOffloading named {:?} offloads a namespace",
            names::OFFLOADING_NAME
        );
        write_status(&api, &o, "Ignored", Vec::new(), "WrongName", &message).await?;
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

/// The labels a provider's virtual node carries, which the cluster selector matches.
pub fn virtual_node_labels(link: &ProviderLink) -> BTreeMap<String, String> {
    let mut labels = link.node_labels.clone();
    labels.insert(
        names::NODE_TYPE_LABEL.to_string(),
        names::VIRTUAL_NODE_TYPE.to_string(),
    );
    labels.insert(
        names::REMOTE_CLUSTER_LABEL.to_string(),
        link.provider_id.clone(),
    );
    labels
}

/// The cluster selector's terms in core's shape.
pub fn selector_terms(o: &NamespaceOffloading) -> Vec<SelectorTerm> {
    o.spec
        .cluster_selector
        .as_ref()
        .map(|s| serde_json::from_value(json!(s.node_selector_terms)).unwrap_or_default())
        .unwrap_or_default()
}

pub fn placement(s: PodOffloadingStrategy) -> PodPlacement {
    match s {
        PodOffloadingStrategy::Local => PodPlacement::Local,
        PodOffloadingStrategy::Remote => PodPlacement::Remote,
        PodOffloadingStrategy::LocalAndRemote => PodPlacement::LocalAndRemote,
    }
}

fn mapping(s: NamespaceMappingStrategy) -> NamespaceMapping {
    match s {
        NamespaceMappingStrategy::DefaultName => NamespaceMapping::DefaultName,
        NamespaceMappingStrategy::EnforceSameName => NamespaceMapping::EnforceSameName,
        NamespaceMappingStrategy::SelectedName => NamespaceMapping::SelectedName,
    }
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
    if let Err(problem) = crate::input::cluster_selector(&terms) {
        let current = o.status.clone().unwrap_or_default().remote_namespaces;
        write_status(
            api,
            o,
            "Failed",
            current,
            "InvalidClusterSelector",
            &problem.to_string(),
        )
        .await?;
        return Ok(Action::await_change());
    }
    set_namespace_label(state, o, Some(OFFLOADING_ENABLED)).await?;
    let twin = rules::twin_namespace_name(
        mapping(o.spec.namespace_mapping_strategy),
        &ns,
        &state.ctx.identity.cluster_id,
        o.spec.remote_namespace_name.as_deref(),
    );
    let twin = match twin {
        Ok(t) => t,
        Err(e) => {
            write_status(api, o, "Failed", Vec::new(), "InvalidName", &e.to_string()).await?;
            return Ok(Action::await_change());
        }
    };
    let mut entries = Vec::new();
    for (id, link) in state.links.snapshot() {
        let selected = o.spec.pod_offloading_strategy != PodOffloadingStrategy::Local
            && rules::cluster_selected(&terms, &virtual_node_labels(&link));
        if !selected {
            if let Err(e) = remove_twin(&link, &ns, false).await {
                tracing::warn!(offloading = %key(o), provider = %id, error = %e, "removing an unselected twin namespace");
            }
            continue;
        }
        let (phase, message) =
            match ensure_twin(&link, &ns, &twin, o.spec.pod_offloading_strategy).await {
                Ok(pm) => pm,
                Err(e) => (
                    "Pending".to_string(),
                    Some(format!("requesting the twin namespace: {e}")),
                ),
            };
        entries.push(RemoteNamespaceStatus {
            cluster_id: id,
            namespace: twin.clone(),
            phase,
            message,
        });
    }
    let phase = if entries.iter().all(|e| e.phase == "Ready") {
        "Ready"
    } else if entries.iter().any(|e| e.phase == "Failed") {
        "Failed"
    } else {
        "Pending"
    };
    let (reason, message) = match phase {
        "Ready" => (
            "Offloaded",
            format!("twin namespace ready on {} provider(s)", entries.len()),
        ),
        _ => {
            let waiting: Vec<String> = entries
                .iter()
                .filter(|e| e.phase != "Ready")
                .map(|e| {
                    format!(
                        "{} ({}{})",
                        e.cluster_id,
                        e.phase,
                        e.message
                            .as_ref()
                            .map(|m| format!(": {m}"))
                            .unwrap_or_default()
                    )
                })
                .collect();
            ("TwinNamespacesNotReady", waiting.join("; "))
        }
    };
    write_status(api, o, phase, entries, reason, &message).await?;
    Ok(Action::requeue(if phase == "Ready" {
        Duration::from_secs(30)
    } else {
        Duration::from_secs(1)
    }))
}

/// Ensures the RemoteNamespace for `ns` on `link`'s provider asks for `twin`; returns the
/// provider's answer (phase, message).
async fn ensure_twin(
    link: &ProviderLink,
    ns: &str,
    twin: &str,
    pods: PodOffloadingStrategy,
) -> Result<(String, Option<String>), kube::Error> {
    let api: Api<RemoteNamespace> =
        Api::namespaced(link.client.clone(), &link.remote_tenant_namespace);
    if let Some(existing) = api.get_opt(ns).await? {
        if existing.metadata.deletion_timestamp.is_some() {
            return Ok((
                "Pending".into(),
                Some("previous twin namespace terminating".into()),
            ));
        }
        if existing.spec.namespace != twin {
            // A renamed twin: the old namespace goes first, then the new one is requested.
            api.delete(ns, &DeleteParams::default()).await?;
            return Ok((
                "Pending".into(),
                Some(format!(
                    "removing previous twin namespace {}",
                    existing.spec.namespace
                )),
            ));
        }
    }
    let mut rn = RemoteNamespace::new(
        ns,
        RemoteNamespaceSpec {
            namespace: twin.to_string(),
            origin_namespace: ns.to_string(),
            pod_offloading_strategy: Some(pods),
        },
    );
    rn.meta_mut().labels = Some(
        [
            (
                names::MANAGED_BY_LABEL.to_string(),
                names::MANAGED_BY.to_string(),
            ),
            (names::ORIGIN_NAMESPACE_LABEL.to_string(), ns.to_string()),
        ]
        .into(),
    );
    let applied = apply(&api, &rn).await?;
    let status = applied.status.unwrap_or_default();
    Ok((
        status.phase.unwrap_or_else(|| "Pending".into()),
        status.message,
    ))
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
    match api.get_opt(ns).await? {
        None => Ok(true),
        Some(existing) => {
            if delete_data
                && !existing
                    .annotations()
                    .contains_key(names::DELETE_DATA_ANNOTATION)
            {
                api.patch(
                    ns,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"annotations": {
                        names::DELETE_DATA_ANNOTATION: "true"}}})),
                )
                .await?;
            }
            if existing.metadata.deletion_timestamp.is_none() {
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
    let current = o.status.clone().unwrap_or_default();
    if current.phase.as_deref() != Some("Terminating") {
        write_status(
            api,
            o,
            "Terminating",
            current.remote_namespaces.clone(),
            "Unoffloading",
            "removing twin namespaces",
        )
        .await?;
    }
    let delete_data = o.annotations().contains_key(names::DELETE_DATA_ANNOTATION);
    let mut waiting = Vec::new();
    for (id, link) in state.links.snapshot() {
        let twin = current
            .remote_namespaces
            .iter()
            .find(|r| r.cluster_id == id)
            .map(|r| r.namespace.clone());
        if let Some(twin) = &twin {
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
    if delete_data {
        return Ok(true);
    }
    let claims = crate::consumer::storage::remote_claims(link, twin).await?;
    if claims.is_empty() {
        return Ok(true);
    }
    let ns = o.namespace().unwrap_or_default();
    let message = format!(
        "retained on provider {} in namespace {twin}: PersistentVolumeClaims {} (unoffload with --delete-data, or delete the claims here, to delete them)",
        link.provider_id,
        claims.join(", ")
    );
    tracing::info!(offloading = %key(o), provider = %link.provider_id, %twin, claims = %claims.join(","), "claims retained");
    let name = format!("{ns}.tandem-dataretained-{}", link.provider_id);
    let event = json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": name, "namespace": ns,
                     "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY}},
        "involvedObject": {"apiVersion": "v1", "kind": "Namespace", "name": ns},
        "reason": "DataRetained", "message": message, "type": "Warning",
        "source": {"component": names::CONTROLLER_NAME},
    });
    if let Err(e) = Api::<CoreEvent>::namespaced(state.ctx.client.clone(), &ns)
        .patch(
            &name,
            &PatchParams::apply(names::FIELD_MANAGER).force(),
            &Patch::Apply(&event),
        )
        .await
    {
        tracing::debug!(offloading = %key(o), error = %e, "writing the DataRetained Event");
    }
    Ok(true)
}

async fn write_status(
    api: &Api<NamespaceOffloading>,
    o: &NamespaceOffloading,
    phase: &str,
    remote_namespaces: Vec<RemoteNamespaceStatus>,
    reason: &str,
    message: &str,
) -> Result<(), Error> {
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
        message,
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
