//! Twin namespaces: for each `RemoteNamespace` a consumer files in its tenant namespace, the
//! provider creates the twin Namespace and lets the consumer's peer identity work in it (a
//! RoleBinding to `tandem:peer-twin`). It never takes over a namespace it did not create for
//! that consumer, and deleting the request deletes the namespace — unless it holds
//! PersistentVolumeClaims and the request was not annotated `tandem.dev/delete-data`: then the
//! namespace is retained for its data (see [`retain_if_holding_data`]). The storage part of the
//! consumer's grant becomes the twin's ResourceQuota `tandem-grant`, and the pod access its
//! Tenant allows (`spec.podAccess`: exec, attach, port-forward) one RoleBinding per capability.
//! A Tenant's change re-reconciles the consumer's requests, so both follow it.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{Event, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;
use tandem_api::client;
use tandem_api::{RemoteNamespace, ShadowPod, Tenant, names};

use crate::context::{Context, Ctx};
use crate::objects::apply;

mod plan;

pub(crate) use plan::peer_bindings;
pub use plan::{
    ATTACH_ROLE_BINDING, EXEC_ROLE_BINDING, POD_SECURITY_ENFORCE_LABEL, PORTFORWARD_ROLE_BINDING,
    RESERVED_NAMESPACES, TWIN_ROLE_BINDING, pod_access_binding,
};
use plan::{Outcome, Step, Teardown};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("RemoteNamespace {0}: {1}")]
    Kube(String, &'static str, #[source] kube::Error),
    #[error("RemoteNamespace {0}: waiting for twin namespace {1} to terminate")]
    Terminating(String, String),
    #[error("RemoteNamespace {0}: finalizer")]
    Finalizer(
        String,
        #[source] Box<kube::runtime::finalizer::Error<Error>>,
    ),
}

/// Runs the reconciler until the controller stops.
pub async fn run(ctx: Ctx) {
    let api: Api<RemoteNamespace> = Api::all(ctx.client.clone());
    let controller = Controller::new(api, watcher::Config::default());
    // A Tenant's grant and pod access shape every twin namespace of its consumer: a change to
    // it re-reconciles the requests in its tenant namespace (rather than the Tenant reconciler
    // writing into twin namespaces too), so one reconciler owns what a twin holds.
    let requests = controller.store();
    controller
        .watches(
            Api::<Tenant>::all(ctx.client.clone()),
            watcher::Config::default(),
            move |tenant| {
                let tenant_namespace = tenant.namespace();
                requests
                    .state()
                    .into_iter()
                    .filter(|rn| rn.namespace() == tenant_namespace)
                    .map(|rn| ObjectRef::from_obj(&*rn))
                    .collect::<Vec<_>>()
            },
        )
        .run(
            crate::metrics::timed(ctx.metrics.clone(), "remotenamespace", reconcile),
            error_policy,
            ctx,
        )
        .for_each(|_| async {})
        .await;
}

fn error_policy(_rn: Arc<RemoteNamespace>, error: &Error, _ctx: Arc<Context>) -> Action {
    match error {
        Error::Terminating(..) => tracing::debug!(%error),
        _ => tracing::warn!(error = %crate::error::chain(error), "reconciling"),
    }
    Action::requeue(Duration::from_secs(1))
}

fn key(rn: &RemoteNamespace) -> String {
    format!("{}/{}", rn.namespace().unwrap_or_default(), rn.name_any())
}

async fn reconcile(rn: Arc<RemoteNamespace>, ctx: Arc<Context>) -> Result<Action, Error> {
    let k = key(&rn);
    let api: Api<RemoteNamespace> =
        Api::namespaced(ctx.client.clone(), &rn.namespace().unwrap_or_default());
    finalizer(&api, names::FINALIZER, rn, |event| async {
        match event {
            Event::Apply(rn) => ensure(&ctx.client, &rn).await,
            Event::Cleanup(rn) => cleanup(&ctx.client, &rn).await,
        }
    })
    .await
    .map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        other => Error::Finalizer(k, Box::new(other)),
    })
}

/// The consumer of the request's tenant namespace ([`plan::consumer`]), as read.
async fn consumer_of(
    client: &Client,
    rn: &RemoteNamespace,
) -> Result<Result<String, plan::Refusal>, Error> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let tenant = rn.namespace().unwrap_or_default();
    let ns = namespaces
        .get_opt(&tenant)
        .await
        .map_err(|e| Error::Kube(key(rn), "reading its tenant namespace", e))?;
    Ok(plan::consumer(ns.as_ref()))
}

async fn ensure(client: &Client, rn: &RemoteNamespace) -> Result<Action, Error> {
    let outcome = converge(client, rn).await?;
    set_status(client, rn, &outcome).await?;
    Ok(match outcome.requeue() {
        Some(after) => Action::requeue(after),
        None => Action::await_change(),
    })
}

/// Checks the request step by step ([`plan`]), reading only what the next check needs, and
/// makes its twin hold what the Tenant allows once every check passed.
async fn converge(client: &Client, rn: &RemoteNamespace) -> Result<Outcome, Error> {
    let k = key(rn);
    let twin = rn.spec.namespace.as_str();
    let origin = rn.spec.origin_namespace.as_str();
    let consumer = match consumer_of(client, rn).await? {
        Ok(consumer) => consumer,
        Err(refused) => return Ok(refused.into()),
    };
    if let Err(refused) = plan::twin_name(twin) {
        return Ok(refused.into());
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let existing = namespaces
        .get_opt(twin)
        .await
        .map_err(|e| Error::Kube(k.clone(), "reading the twin namespace", e))?;
    if let Err(refused) = plan::claim(existing.as_ref(), twin, &consumer, origin) {
        return Ok(refused.into());
    }
    // What a twin namespace holds follows the consumer's Tenant. The Tenant's watch requeues
    // this request when that changes.
    let tenant = Api::<Tenant>::namespaced(client.clone(), &rn.namespace().unwrap_or_default())
        .get_opt(&consumer)
        .await
        .map_err(|e| Error::Kube(k.clone(), "reading the consumer's Tenant", e))?;
    let tenant = match plan::tenant_in_force(tenant, &consumer) {
        Ok(tenant) => tenant,
        Err(held) => return Ok(held.into()),
    };
    if let Err(refused) = plan::strategies(&tenant, rn, &consumer) {
        return Ok(refused.into());
    }
    match &existing {
        None => {
            let twins = namespaces
                .list(&ListParams::default().labels(&plan::twins_selector(&consumer)))
                .await
                .map_err(|e| {
                    Error::Kube(k.clone(), "counting the consumer's twin namespaces", e)
                })?;
            if let Err(refused) = plan::room(&tenant, &consumer, twin, &twins.items) {
                return Ok(refused.into());
            }
        }
        Some(existing) => {
            match plan::adopt(existing, &tenant, twin, &consumer) {
                Ok(Some(step)) => act(client, &k, twin, step).await?,
                Ok(None) => {}
                Err(refused) => return Ok(refused.into()),
            }
            if let Err(held) = plan::settled(existing, twin) {
                return Ok(held.into());
            }
        }
    }
    let subjects = crate::rbac::peer_subjects(&tenant);
    for step in plan::twin(rn, &consumer, &tenant, &subjects) {
        act(client, &k, twin, step).await?;
    }
    Ok(Outcome::Ready)
}

/// Sends one step for the twin namespace `twin` of request `k`.
async fn act(client: &Client, k: &str, twin: &str, step: Step) -> Result<(), Error> {
    let doing = step.doing();
    let failed = |e| Error::Kube(k.to_string(), doing, e);
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), twin);
    match step {
        Step::ReclaimRetained => namespaces
            .patch(
                twin,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {names::RETAINED_DATA_LABEL: null}}})),
            )
            .await
            .map(|_| ()),
        Step::ApplyNamespace(ns) => apply(&namespaces, &*ns).await.map(|_| ()),
        Step::BindPeer(binding) | Step::GrantPodAccess(binding) => {
            apply(&bindings, &*binding).await.map(|_| ())
        }
        Step::RevokePodAccess(name) => {
            client::ok_if_not_found(bindings.delete(name, &DeleteParams::default()).await)
                .map(|_| ())
        }
        Step::ApplyQuota(quota) => apply(&Api::namespaced(client.clone(), twin), &*quota)
            .await
            .map(|_| ()),
    }
    .map_err(failed)
}

async fn cleanup(client: &Client, rn: &RemoteNamespace) -> Result<Action, Error> {
    let k = key(rn);
    let twin = &rn.spec.namespace;
    let Ok(consumer) = consumer_of(client, rn).await? else {
        return Ok(Action::await_change());
    };
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let Some(existing) = namespaces
        .get_opt(twin)
        .await
        .map_err(|e| Error::Kube(k.clone(), "reading the twin namespace", e))?
    else {
        return Ok(Action::await_change());
    };
    match plan::teardown(&existing, rn, &consumer) {
        Teardown::NotOurs => return Ok(Action::await_change()),
        Teardown::AwaitTermination => {}
        Teardown::Delete { keep_data } => {
            let key =
                Api::<Tenant>::namespaced(client.clone(), &names::tenant_namespace(&consumer))
                    .get_opt(&consumer)
                    .await
                    .map_err(|e| Error::Kube(k.clone(), "reading the consumer's Tenant", e))?
                    .and_then(|t| {
                        t.annotations()
                            .get(names::KEY_FINGERPRINT_ANNOTATION)
                            .cloned()
                    });
            if keep_data
                && retain_if_holding_data(client, twin, &consumer, key.as_deref(), false)
                    .await
                    .map_err(|e| {
                        Error::Kube(k.clone(), "retaining the twin namespace's claims", e)
                    })?
            {
                return Ok(Action::await_change());
            }
            match namespaces.delete(twin, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if client::is_not_found(&e) => return Ok(Action::await_change()),
                Err(e) => return Err(Error::Kube(k, "deleting the twin namespace", e)),
            }
        }
    }
    Err(Error::Terminating(k, twin.clone()))
}

/// If `twin` holds claims, keeps it (labelled `tandem.dev/retained-data`, with an Event naming
/// them) and deletes only its shadow pods, so nothing of the consumer runs on; Ok(true) if so.
/// `revoke` also removes the consumer's access to it (unpeering); after unoffloading the
/// consumer keeps it, so that deleting its claim still deletes the copy here.
pub async fn retain_if_holding_data(
    client: &Client,
    twin: &str,
    consumer: &str,
    key: Option<&str>,
    revoke: bool,
) -> Result<bool, kube::Error> {
    let claims: Vec<String> = Api::<PersistentVolumeClaim>::namespaced(client.clone(), twin)
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    if claims.is_empty() {
        return Ok(false);
    }
    Api::<ShadowPod>::namespaced(client.clone(), twin)
        .delete_collection(&DeleteParams::background(), &ListParams::default())
        .await?;
    if revoke {
        let bindings = Api::<RoleBinding>::namespaced(client.clone(), twin);
        for name in peer_bindings() {
            client::ok_if_not_found(bindings.delete(name, &DeleteParams::default()).await)?;
        }
    }
    Api::<Namespace>::all(client.clone())
        .patch(
            twin,
            &PatchParams::default(),
            &Patch::Merge(plan::retained_metadata(key)),
        )
        .await?;
    let message = plan::retained_message(consumer, &claims);
    tracing::info!(namespace = %twin, %consumer, claims = %claims.join(","), "twin namespace retained for its data");
    crate::events::record(
        client,
        twin,
        json!({"apiVersion": "v1", "kind": "Namespace", "name": twin}),
        "DataRetained",
        &message,
        true,
    )
    .await;
    Ok(true)
}

/// Writes what `outcome` says to the request's status, unless it says so already.
async fn set_status(client: &Client, rn: &RemoteNamespace, outcome: &Outcome) -> Result<(), Error> {
    let Some(patch) = plan::status_patch(rn.status.as_ref(), outcome) else {
        return Ok(());
    };
    if let Outcome::Failed(refusal) = outcome {
        tracing::warn!(remote_namespace = %key(rn), message = %refusal, "refused");
    }
    let api: Api<RemoteNamespace> =
        Api::namespaced(client.clone(), &rn.namespace().unwrap_or_default());
    api.patch_status(
        &rn.name_any(),
        &PatchParams::default(),
        &Patch::Merge(patch),
    )
    .await
    .map_err(|e| Error::Kube(key(rn), "writing its status", e))?;
    Ok(())
}
