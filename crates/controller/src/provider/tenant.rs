//! Provider side: a `Tenant` holds everything of one consumer. Its finalizer undoes the peering
//! on the provider when it is deleted (by the consumer unpeering, or by `tandem unpeer` here):
//! twin namespaces, CSRs, the consumer's used invites, its IPAM grant and the tenant namespace.
//! Twin namespaces holding PersistentVolumeClaims are retained (their pods stopped) unless the
//! Tenant is annotated `tandem.dev/delete-data` (`tandem unpeer --delete-data` here).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use serde_json::json;
use tandem_api::client;
use tandem_api::conditions::{self, ConditionStatus};
use tandem_api::{Tenant, names};

use crate::context::Ctx;

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
    let has_finalizer = tenant.finalizers().iter().any(|f| f == names::FINALIZER);
    if tenant.metadata.deletion_timestamp.is_none() {
        if !has_finalizer {
            crate::install::add_finalizer(&api, &*tenant)
                .await
                .map_err(err("adding the finalizer"))?;
            // The write changed the resourceVersion the status write is guarded by: the
            // status follows from the next reconcile, which the write itself brings.
            return Ok(Action::await_change());
        }
        if !tenant
            .annotations()
            .contains_key(names::KEY_BOUND_ANNOTATION)
        {
            // Its next reconcile, brought by the write, binds it.
            return bind_to_issued_key(&ctx, &api, &tenant)
                .await
                .map_err(err("binding the identity to the key of its certificate"));
        }
        crate::provider::peering_request::bind_peer(&ctx.client, &tenant)
            .await
            .map_err(err("binding the peer identity"))?;
        report_grant(&api, &tenant)
            .await
            .map_err(err("writing status"))?;
        // Its roles lose the user name when the grace of a Tenant made before keys ends.
        let grace = tenant
            .annotations()
            .get(names::USER_BOUND_UNTIL_ANNOTATION)
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .map(|until| until.as_second() - k8s_openapi::jiff::Timestamp::now().as_second())
            .filter(|left| *left > 0);
        return Ok(grace.map_or_else(Action::await_change, |left| {
            Action::requeue(Duration::from_secs(left as u64 + 1))
        }));
    }
    if !has_finalizer {
        return Ok(Action::await_change());
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
        if twin.name_any() != ns && twin.metadata.deletion_timestamp.is_none() {
            // Claims are data: kept unless the unpeering asked for them to go.
            if !tenant
                .annotations()
                .contains_key(names::DELETE_DATA_ANNOTATION)
                && crate::provider::remote_namespace::retain_if_holding_data(
                    &ctx.client,
                    &twin.name_any(),
                    &consumer,
                    tenant
                        .annotations()
                        .get(names::KEY_FINGERPRINT_ANNOTATION)
                        .map(String::as_str),
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
    }
    let csrs: Api<CertificateSigningRequest> = Api::all(ctx.client.clone());
    csrs.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels(&selector),
    )
    .await
    .map_err(err("deleting CSRs"))?;
    if let Ok(invites) = crate::invite::list(&ctx.client).await {
        for invite in invites
            .iter()
            .filter(|i| i.used_by.as_deref() == Some(consumer.as_str()))
        {
            crate::invite::remove_invite_objects(&ctx.client, &invite.token_id)
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
    // Peered both ways, the namespace also holds this cluster's identity for consuming from
    // the peer: only what the peer's Tenant was given goes (its RoleBinding and the network
    // negotiation), the namespace and our Secrets stay. A Peering being undone still needs
    // its identity to reach the peer; its unpeering deletes the namespace last.
    let consumes_from_peer = Api::<tandem_api::Peering>::all(ctx.client.clone())
        .get_opt(&consumer)
        .await
        .map_err(err("reading this cluster's Peering with the consumer"))?
        .is_some();
    if consumes_from_peer {
        client::delete_if_exists(
            &Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(ctx.client.clone(), &ns),
            crate::provider::peering_request::PEER_ROLE_BINDING,
            &DeleteParams::default(),
        )
        .await
        .map_err(err("deleting the peer's RoleBinding"))?;
        let params = Api::<tandem_api::NetworkParameters>::namespaced(ctx.client.clone(), &ns);
        for name in [
            crate::rbac::CONSUMER_NETWORK_PARAMETERS,
            crate::rbac::PROVIDER_NETWORK_PARAMETERS,
        ] {
            client::delete_if_exists(&params, name, &DeleteParams::default())
                .await
                .map_err(err("deleting the NetworkParameters"))?;
        }
        // The fence Leases, then the controller's own rights here (which that needed).
        let leases =
            Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(ctx.client.clone(), &ns);
        for name in [names::FENCE_LEASE, names::FENCE_NONCE_LEASE] {
            client::delete_if_exists(&leases, name, &DeleteParams::default())
                .await
                .map_err(err("deleting the fence Leases"))?;
        }
        client::delete_if_exists(
            &Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(ctx.client.clone(), &ns),
            crate::rbac::CONTROLLER_TENANT_ROLE,
            &DeleteParams::default(),
        )
        .await
        .map_err(err("deleting the controller's RoleBinding"))?;
        return Ok(Action::await_change());
    }
    match namespaces.delete(&ns, &DeleteParams::background()).await {
        Ok(_) => {}
        Err(e) if client::is_not_found(&e) => {}
        Err(e) => return Err(err("deleting the tenant namespace")(e)),
    }
    Ok(Action::await_change())
}

/// Removes, first thing at unpeering, every right the consumer's certificate has here: its
/// right to renew (so a former peer files no more requests), its RoleBinding in the tenant
/// namespace and in every twin namespace. The certificate itself lives on until it expires;
/// the namespaces' deletion, which takes a while (or never comes, for a twin kept for its
/// data), must not be what ends its access.
/// Moves a Tenant made before peer certificates carried their key's group to binding by key:
/// its key is taken from the newest certificate already issued to it (never from a later
/// request, which an impostor could race), and since that certificate carries no key group,
/// its user name stays bound until the certificate expires, long enough for the consumer to
/// renew to one that does. A Tenant with no certificate on record keeps its user-name bindings
/// until the provider's admin records a key.
async fn bind_to_issued_key(
    ctx: &Ctx,
    api: &Api<Tenant>,
    tenant: &Tenant,
) -> Result<Action, kube::Error> {
    let consumer = tenant.spec.cluster_id.as_str();
    let mut issued: Vec<String> = tenant
        .status
        .as_ref()
        .and_then(|s| s.renewed_identity.as_ref())
        .map(|r| r.certificate.clone())
        .into_iter()
        .collect();
    for ns in [names::SYSTEM_NAMESPACE, names::ENROLL_NAMESPACE] {
        let requests = Api::<tandem_api::PeeringRequest>::namespaced(ctx.client.clone(), ns)
            .list(&ListParams::default())
            .await?;
        issued.extend(
            requests
                .items
                .into_iter()
                .filter(|r| r.spec.cluster_id == consumer)
                .filter_map(|r| r.status?.certificate),
        );
    }
    let newest = issued
        .iter()
        .filter_map(|pem| crate::enroll::certificate_key(pem))
        .max_by_key(|c| c.not_after);
    let mut annotations = serde_json::Map::new();
    annotations.insert(names::KEY_BOUND_ANNOTATION.into(), json!("true"));
    if let Some(cert) = newest {
        let recorded = tenant.annotations().get(names::KEY_FINGERPRINT_ANNOTATION);
        if recorded.is_none() {
            annotations.insert(
                names::KEY_FINGERPRINT_ANNOTATION.into(),
                json!(cert.fingerprint),
            );
        }
        let key = recorded.unwrap_or(&cert.fingerprint);
        if !cert.groups.contains(&names::peer_key_group(key)) {
            let until = k8s_openapi::jiff::Timestamp::from_second(cert.not_after)
                .map(|t| t.to_string())
                .unwrap_or_default();
            annotations.insert(names::USER_BOUND_UNTIL_ANNOTATION.into(), json!(until));
        }
        tracing::info!(%consumer, key = %key, "identity bound to the key of its issued certificate");
    }
    api.patch(
        &tenant.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": annotations}})),
    )
    .await?;
    Ok(Action::await_change())
}

async fn revoke_peer_access(
    ctx: &Ctx,
    consumer: &str,
    tenant_ns: &str,
    namespaces: &Api<Namespace>,
    selector: &str,
) -> Result<(), kube::Error> {
    use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
    client::delete_if_exists(
        &Api::<ClusterRoleBinding>::all(ctx.client.clone()),
        &crate::rbac::peer_renewal_binding(consumer),
        &DeleteParams::default(),
    )
    .await?;
    client::delete_if_exists(
        &Api::<RoleBinding>::namespaced(ctx.client.clone(), tenant_ns),
        crate::provider::peering_request::PEER_ROLE_BINDING,
        &DeleteParams::default(),
    )
    .await?;
    for twin in namespaces
        .list(&ListParams::default().labels(selector))
        .await?
        .items
    {
        let twin = twin.name_any();
        if twin == tenant_ns {
            continue;
        }
        let bindings = Api::<RoleBinding>::namespaced(ctx.client.clone(), &twin);
        for name in crate::provider::remote_namespace::peer_bindings() {
            client::delete_if_exists(&bindings, name, &DeleteParams::default()).await?;
        }
    }
    Ok(())
}

/// Says in the Tenant's `Ready` condition whether its grant is usable: an edit the API server
/// let through (`cpu: abc`, `-5`) is named here, and neither the quota nor the consumer's
/// virtual node takes it.
async fn report_grant(api: &Api<Tenant>, tenant: &Tenant) -> Result<(), kube::Error> {
    let mut status = tenant.status.clone().unwrap_or_default();
    let changed = match crate::input::grant(&tenant.spec.grant) {
        Ok(()) => conditions::set_condition(
            &mut status.conditions,
            conditions::READY,
            ConditionStatus::True,
            "GrantValid",
            "the grant is in force",
            tenant.metadata.generation,
        ),
        Err(problem) => conditions::set_condition(
            &mut status.conditions,
            conditions::READY,
            ConditionStatus::False,
            "InvalidGrant",
            &format!("{problem}; the last valid grant stays in force"),
            tenant.metadata.generation,
        ),
    };
    if changed {
        api.patch_status(
            &tenant.name_any(),
            &PatchParams::default(),
            // Guarded by the resource version: the fence writes its own condition.
            &Patch::Merge(
                json!({"metadata": {"resourceVersion": tenant.resource_version()},
                                 "status": {"conditions": status.conditions}}),
            ),
        )
        .await?;
    }
    Ok(())
}
