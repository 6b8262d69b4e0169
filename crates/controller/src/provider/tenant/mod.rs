//! Provider side: a `Tenant` holds everything of one consumer. Its finalizer undoes the peering
//! on the provider when it is deleted (by the consumer unpeering, or by `tandem unpeer` here):
//! twin namespaces, CSRs, the consumer's used invites, its IPAM grant and the tenant namespace.
//! Twin namespaces holding PersistentVolumeClaims are retained (their pods stopped) unless the
//! Tenant is annotated `tandem.dev/delete-data` (`tandem unpeer --delete-data` here).

mod plan;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use serde_json::json;
use tandem_api::client;
use tandem_api::{Tenant, names};

use crate::context::Ctx;
use plan::{Binding, Closing, Revocation, Step, TwinStep};

/// A step of the Tenant reconciler that failed.
#[derive(Debug, thiserror::Error)]
#[error("Tenant {tenant}: {step}")]
pub struct Error {
    tenant: String,
    step: &'static str,
    #[source]
    cause: Cause,
}

/// What stopped a step of the Tenant reconciler.
#[derive(Debug, thiserror::Error)]
enum Cause {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Invite(#[from] crate::invite::InviteError),
    #[error(transparent)]
    Ipam(#[from] crate::provider::network::IpamError),
}

/// Reconciles every Tenant.
pub async fn run(ctx: Ctx) {
    let api: Api<Tenant> = Api::all(ctx.client.clone());
    Controller::new(api, watcher::Config::default())
        .run(
            crate::metrics::timed(ctx.metrics.clone(), "tenant", reconcile),
            error_policy,
            ctx,
        )
        .for_each(|_| async {})
        .await;
}

fn error_policy(_t: Arc<Tenant>, e: &Error, _ctx: Ctx) -> Action {
    tracing::warn!(error = %crate::error::chain(e), "tenant");
    Action::requeue(Duration::from_secs(1))
}

async fn reconcile(tenant: Arc<Tenant>, ctx: Ctx) -> Result<Action, Error> {
    let ns = tenant.namespace().unwrap_or_default();
    let api: Api<Tenant> = Api::namespaced(ctx.client.clone(), &ns);
    let name = tenant.name_any();
    let err = |step: &'static str| {
        let tenant = format!("{ns}/{name}");
        move |e: kube::Error| Error {
            tenant,
            step,
            cause: e.into(),
        }
    };
    match plan::next_step(&tenant) {
        Step::AddFinalizer => {
            crate::install::add_finalizer(&api, &*tenant)
                .await
                .map_err(err("adding the finalizer"))?;
            // The write changed the resourceVersion the status write is guarded by: the
            // status follows from the next reconcile, which the write itself brings.
            return Ok(Action::await_change());
        }
        Step::BindToIssuedKey => {
            // Its next reconcile, brought by the write, binds it.
            return bind_to_issued_key(&ctx, &api, &tenant)
                .await
                .map_err(err("binding the identity to the key of its certificate"));
        }
        Step::Serve => {
            crate::provider::peering_request::bind_peer(&ctx.client, &tenant)
                .await
                .map_err(err("binding the peer identity"))?;
            report_grant(&api, &tenant)
                .await
                .map_err(err("writing status"))?;
            // Its roles lose the user name when the grace of a Tenant made before keys ends.
            let now = k8s_openapi::jiff::Timestamp::now();
            return Ok(plan::requeue_after(&tenant, now)
                .map_or_else(Action::await_change, Action::requeue));
        }
        Step::Gone => return Ok(Action::await_change()),
        Step::Unpeer => {}
    }
    let consumer = tenant.spec.cluster_id.clone();
    tracing::info!(%consumer, "tenant deleted: removing everything of the consumer");
    let selector = format!("{}={consumer}", names::ORIGIN_CLUSTER_LABEL);
    let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
    revoke_peer_access(&ctx, &consumer, &ns, &namespaces, &selector)
        .await
        .map_err(err("revoking the peer identity's rights"))?;
    for twin in namespaces
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(err("listing twin namespaces"))?
        .items
    {
        let step = match plan::twin(&tenant, &twin, &ns) {
            Ok(step) => step,
            Err(_spared) => continue,
        };
        if let TwinStep::DeleteUnlessHoldingData { key } = &step
            && crate::provider::remote_namespace::retain_if_holding_data(
                &ctx.client,
                &twin.name_any(),
                &consumer,
                key.as_deref(),
                true,
            )
            .await
            .map_err(err("retaining a twin namespace's claims"))?
        {
            continue;
        }
        namespaces
            .delete(&twin.name_any(), &DeleteParams::background())
            .await
            .map_err(err("deleting a twin namespace"))?;
    }
    let csrs: Api<CertificateSigningRequest> = Api::all(ctx.client.clone());
    csrs.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels(&selector),
    )
    .await
    .map_err(err("deleting CSRs"))?;
    if let Ok(invites) = crate::invite::list(&ctx.client).await {
        for token_id in plan::used_invites(&invites, &consumer) {
            crate::invite::remove_invite_objects(&ctx.client, token_id)
                .await
                .map_err(|e| Error {
                    tenant: format!("{ns}/{name}"),
                    step: "removing used invites",
                    cause: e.into(),
                })?;
        }
    }
    crate::provider::network::release_peer(&ctx, &consumer)
        .await
        .map_err(|e| Error {
            tenant: format!("{ns}/{name}"),
            step: "releasing the IPAM grant",
            cause: e.into(),
        })?;
    crate::fabric::forget_peer(&ctx.client, &consumer)
        .await
        .map_err(|e| Error {
            tenant: format!("{ns}/{name}"),
            step: "removing the gateway to the consumer and its key",
            cause: e.into(),
        })?;
    crate::install::remove_finalizer(&api, &*tenant)
        .await
        .map_err(err("removing the finalizer"))?;
    let consumes_from_peer = Api::<tandem_api::Peering>::all(ctx.client.clone())
        .get_opt(&consumer)
        .await
        .map_err(err("reading this cluster's Peering with the consumer"))?
        .is_some();
    for closing in plan::closing(consumes_from_peer) {
        close(&ctx, &namespaces, &ns, closing)
            .await
            .map_err(err(closing.step()))?;
    }
    Ok(Action::await_change())
}

/// Removes what unpeering removes last from the tenant namespace `ns` (or the namespace).
async fn close(
    ctx: &Ctx,
    namespaces: &Api<Namespace>,
    ns: &str,
    closing: Closing,
) -> Result<(), kube::Error> {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::rbac::v1::RoleBinding;
    let gone = DeleteParams::default();
    match closing {
        Closing::PeerRoleBinding => {
            client::delete_if_exists(
                &Api::<RoleBinding>::namespaced(ctx.client.clone(), ns),
                crate::provider::peering_request::PEER_ROLE_BINDING,
                &gone,
            )
            .await
        }
        Closing::NetworkParameters(name) => {
            let params = Api::<tandem_api::NetworkParameters>::namespaced(ctx.client.clone(), ns);
            client::delete_if_exists(&params, name, &gone).await
        }
        Closing::FenceLease(name) => {
            let leases = Api::<Lease>::namespaced(ctx.client.clone(), ns);
            client::delete_if_exists(&leases, name, &gone).await
        }
        Closing::ControllerRoleBinding => {
            client::delete_if_exists(
                &Api::<RoleBinding>::namespaced(ctx.client.clone(), ns),
                crate::rbac::CONTROLLER_TENANT_ROLE,
                &gone,
            )
            .await
        }
        Closing::TenantNamespace => {
            match namespaces.delete(ns, &DeleteParams::background()).await {
                Ok(_) => Ok(()),
                Err(e) if client::is_not_found(&e) => Ok(()),
                Err(e) => Err(e),
            }
        }
    }
}

/// Moves a Tenant made before peer certificates carried their key's group to binding by key
/// (see [`plan::key_binding`]): reads the peering requests filed for it, then writes the
/// annotations.
async fn bind_to_issued_key(
    ctx: &Ctx,
    api: &Api<Tenant>,
    tenant: &Tenant,
) -> Result<Action, kube::Error> {
    let consumer = tenant.spec.cluster_id.as_str();
    let mut requests = Vec::new();
    for ns in [names::SYSTEM_NAMESPACE, names::ENROLL_NAMESPACE] {
        requests.extend(
            Api::<tandem_api::PeeringRequest>::namespaced(ctx.client.clone(), ns)
                .list(&ListParams::default())
                .await?
                .items,
        );
    }
    let binding = plan::key_binding(tenant, &requests);
    if let Binding::Key { key, .. } = &binding {
        tracing::info!(%consumer, key = %key, "identity bound to the key of its issued certificate");
    }
    api.patch(
        &tenant.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": binding.annotations()}})),
    )
    .await?;
    Ok(Action::await_change())
}

/// Removes, first thing at unpeering, every right the consumer's certificate has here (see
/// [`plan::Revocation`]): its right to renew, its RoleBinding in the tenant namespace and in
/// every twin namespace.
async fn revoke_peer_access(
    ctx: &Ctx,
    consumer: &str,
    tenant_ns: &str,
    namespaces: &Api<Namespace>,
    selector: &str,
) -> Result<(), kube::Error> {
    for revocation in plan::revocations(consumer, tenant_ns) {
        revoke(ctx, &revocation).await?;
    }
    for twin in namespaces
        .list(&ListParams::default().labels(selector))
        .await?
        .items
    {
        for revocation in plan::twin_revocations(&twin.name_any(), tenant_ns) {
            revoke(ctx, &revocation).await?;
        }
    }
    Ok(())
}

async fn revoke(ctx: &Ctx, revocation: &Revocation) -> Result<(), kube::Error> {
    use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
    match revocation {
        Revocation::RenewalBinding { name } => {
            client::delete_if_exists(
                &Api::<ClusterRoleBinding>::all(ctx.client.clone()),
                name,
                &DeleteParams::default(),
            )
            .await
        }
        Revocation::RoleBinding { namespace, name } => {
            client::delete_if_exists(
                &Api::<RoleBinding>::namespaced(ctx.client.clone(), namespace),
                name,
                &DeleteParams::default(),
            )
            .await
        }
    }
}

/// Says in the Tenant's `Ready` condition whether its grant is usable (see
/// [`plan::grant_conditions`]), when that changes.
async fn report_grant(api: &Api<Tenant>, tenant: &Tenant) -> Result<(), kube::Error> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    if let Some(conditions) = plan::grant_conditions(tenant, &now) {
        api.patch_status(
            &tenant.name_any(),
            &PatchParams::default(),
            // Guarded by the resource version: the fence writes its own condition.
            &Patch::Merge(
                json!({"metadata": {"resourceVersion": tenant.resource_version()},
                                 "status": {"conditions": conditions}}),
            ),
        )
        .await?;
    }
    Ok(())
}
