//! Provider side of the invite flow. A consumer files a `PeeringRequest` (named after the invite's
//! token ID) with the invite's bootstrap token; this reconciler checks it (token known, unexpired,
//! unused, proof of the whole token, a CSR signed by the consumer's key for exactly the peer
//! user and group), creates the consumer's tenant namespace, `Tenant` and RoleBinding, gets the
//! CSR signed through the CSR API and answers Approved with the certificate — or Denied with the
//! reason. A janitor removes used requests once the consumer authenticated and expired invites.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Namespace, Node, Secret};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;
use tandem_api::client;
use tandem_api::{PeeringRequest, Tenant, names};

use crate::context::Ctx;
use crate::invite::{INVITE_USED_ANNOTATION, invite_role_name, invite_rules, token_secret_name};
use crate::rbac;

mod plan;

pub use plan::{CsrError, check_csr};
use plan::{CsrProgress, Verdict};
pub(crate) use plan::{DENIED_GRACE_SECS, csr_name};

/// Name of the RoleBinding giving a consumer's identity its tenant namespace.
pub const PEER_ROLE_BINDING: &str = "tandem:peer";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("PeeringRequest {request}: {step}")]
    Api {
        request: String,
        step: String,
        #[source]
        source: kube::Error,
    },
}

/// Runs the reconciler and the invite janitor.
pub async fn run(ctx: Ctx) {
    let janitor = tokio::spawn(janitor(ctx.clone()));
    requests_controller(&ctx, names::SYSTEM_NAMESPACE)
        .run(
            crate::metrics::timed(ctx.metrics.clone(), "peeringrequest", reconcile),
            error_policy,
            ctx,
        )
        .for_each(|_| async {})
        .await;
    janitor.abort();
}

/// The controller of the PeeringRequests in `ns`, woken also when the CSR of one of them is
/// signed: with only a timer, each approval waited on it after the signer was done.
///
/// The CSR watch is its own stream, its errors logged and left out: in the controller's
/// trigger streams (`watches`) an error would back off the requests' own watch too (say, a
/// role not yet updated to let it watch CSRs). A signed CSR wakes every request here (few: the
/// pending ones are capped); an answered one returns at once.
pub(crate) fn requests_controller(ctx: &Ctx, ns: &'static str) -> Controller<PeeringRequest> {
    use kube::runtime::WatchStreamExt as _;
    let requests: Api<PeeringRequest> = Api::namespaced(ctx.client.clone(), ns);
    let csrs: Api<CertificateSigningRequest> = Api::all(ctx.client.clone());
    let ours = format!("{}={}", names::MANAGED_BY_LABEL, names::MANAGED_BY);
    let signed = watcher(csrs, watcher::Config::default().labels(&ours))
        .default_backoff()
        .applied_objects()
        .filter_map(move |csr| async move {
            match csr {
                Ok(csr) => plan::wakes(&csr, ns).then_some(()),
                Err(e) => {
                    tracing::debug!(error = %e, "watching peering requests' CSRs");
                    None
                }
            }
        });
    Controller::new(requests, watcher::Config::default()).reconcile_all_on(signed)
}

pub(crate) fn error_policy(_r: Arc<PeeringRequest>, e: &Error, _ctx: Ctx) -> Action {
    tracing::warn!(error = %crate::error::chain(e), "peering request");
    Action::requeue(Duration::from_secs(1))
}

async fn reconcile(req: Arc<PeeringRequest>, ctx: Ctx) -> Result<Action, Error> {
    let name = req.name_any();
    if plan::answered(&req) {
        return Ok(Action::await_change());
    }
    let client = &ctx.client;
    let step = |step: &str| {
        let request = name.clone();
        let step = step.to_string();
        move |source| Error::Api {
            request,
            step,
            source,
        }
    };
    let token = Api::<Secret>::namespaced(client.clone(), "kube-system")
        .get_opt(&token_secret_name(&name))
        .await
        .map_err(step("reading the invite token"))?;
    let now = k8s_openapi::jiff::Timestamp::now();
    match plan::check(&req, token.as_ref(), &ctx.identity.cluster_id, now) {
        Verdict::NoInvite => {
            tracing::info!(request = %name, "peering request without an invite token removed");
            Api::<PeeringRequest>::namespaced(client.clone(), names::SYSTEM_NAMESPACE)
                .delete(&name, &DeleteParams::default())
                .await
                .map(|_| ())
                .or_else(ignore_missing)
                .map_err(step("removing the request"))?;
            return Ok(Action::await_change());
        }
        Verdict::Deny(why) => {
            deny(client, &name, &req.spec.cluster_id, &why)
                .await
                .map_err(step("writing status"))?;
            return Ok(Action::await_change());
        }
        Verdict::Accept => {}
    }
    let consumer = req.spec.cluster_id.clone();
    // An identity is bound to the key it was first issued for: an invite names no key, so
    // whoever holds one could otherwise claim a peered consumer's cluster ID and inherit its
    // Tenant, twins, tunnel and fence lease.
    let fingerprint = crate::enroll::csr_key_fingerprint(&req.spec.csr).unwrap_or_default();
    let tenants = Api::<Tenant>::namespaced(client.clone(), &names::tenant_namespace(&consumer));
    // Checked before the invite is spent, and again as stored once the Tenant exists: of two
    // requests for one ID at once, the Tenant's first key wins.
    for ensured in [false, true] {
        let tenant = tenants
            .get_opt(&consumer)
            .await
            .map_err(step("reading the consumer's Tenant"))?;
        if let Some(why) = plan::key_refusal(tenant.as_ref(), &consumer, &fingerprint) {
            deny(client, &name, &consumer, &why)
                .await
                .map_err(step("writing status"))?;
            return Ok(Action::await_change());
        }
        if !ensured {
            // Single use: from now on this token may only read its request back.
            mark_used(client, &name, &consumer)
                .await
                .map_err(step("marking the invite used"))?;
            ensure_tenant_with(
                &ctx,
                &consumer,
                json!({names::KEY_FINGERPRINT_ANNOTATION: fingerprint}),
            )
            .await
            .map_err(step("creating the tenant"))?;
        }
    }
    approve(&ctx, &req, names::SYSTEM_NAMESPACE, json!({})).await
}

/// Answers request `name` of `consumer` Denied, saying why.
async fn deny(
    client: &Client,
    name: &str,
    consumer: &str,
    why: &plan::Denial,
) -> Result<(), kube::Error> {
    let message = why.to_string();
    tracing::info!(request = %name, %consumer, %message, "peering request denied");
    set_status(client, name, json!({"phase": "Denied", "message": message})).await
}

/// Approves a checked request (in namespace `ns`) whose consumer's tenant the caller made sure
/// of (recording the key): its identity signed through the CSR API, and the answer (with
/// `extra` status fields).
pub(crate) async fn approve(
    ctx: &Ctx,
    req: &PeeringRequest,
    ns: &str,
    extra: serde_json::Value,
) -> Result<Action, Error> {
    let client = &ctx.client;
    let name = req.name_any();
    let step = |step: &str| {
        let request = format!("{ns}/{name}");
        let step = step.to_string();
        move |source| Error::Api {
            request,
            step,
            source,
        }
    };
    // The request as stored, not as cached: woken by another request's CSR, the cache may not
    // have this one's answer yet, and its CSR (removed once answered) would be filed again.
    let stored = Api::<PeeringRequest>::namespaced(client.clone(), ns)
        .get_opt(&name)
        .await
        .map_err(step("reading the request"))?;
    if stored.as_ref().is_none_or(plan::answered) {
        return Ok(Action::await_change());
    }
    let consumer = req.spec.cluster_id.clone();
    let Some(cert) = signed_certificate(client, req, ctx.options.peer_certificate_lifetime)
        .await
        .map_err(step("getting the CSR signed"))?
    else {
        // The CSR's signing wakes this; the timer is for a missed event.
        return Ok(Action::requeue(Duration::from_secs(1)));
    };
    let status = plan::approved_status(&consumer, &cert, &ctx.identity.cluster_id, &extra);
    set_status_in(client, ns, &name, status)
        .await
        .map_err(step("writing status"))?;
    let _ = Api::<CertificateSigningRequest>::all(client.clone())
        .delete(&csr_name(req), &DeleteParams::default())
        .await;
    tracing::info!(request = %name, %consumer, "peering request approved");
    Ok(Action::await_change())
}

async fn set_status(
    client: &Client,
    name: &str,
    status: serde_json::Value,
) -> Result<(), kube::Error> {
    set_status_in(client, names::SYSTEM_NAMESPACE, name, status).await
}

/// Merges `status` into the status of request `ns/name`.
pub(crate) async fn set_status_in(
    client: &Client,
    ns: &str,
    name: &str,
    status: serde_json::Value,
) -> Result<(), kube::Error> {
    Api::<PeeringRequest>::namespaced(client.clone(), ns)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .map(|_| ())
}

async fn mark_used(client: &Client, token_id: &str, consumer: &str) -> Result<(), kube::Error> {
    let role = invite_role_name(token_id);
    Api::<Role>::namespaced(client.clone(), names::SYSTEM_NAMESPACE)
        .patch(
            &role,
            &PatchParams::default(),
            &Patch::Merge(json!({"rules": invite_rules(token_id, false)})),
        )
        .await
        .or_else(ignore_missing)?;
    Api::<Secret>::namespaced(client.clone(), "kube-system")
        .patch(
            &token_secret_name(token_id),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {INVITE_USED_ANNOTATION: consumer}}})),
        )
        .await
        .map(|_| ())
}

pub(crate) fn ignore_missing<K: Default>(e: kube::Error) -> Result<K, kube::Error> {
    if client::is_not_found(&e) {
        Ok(K::default())
    } else {
        Err(e)
    }
}

/// Creates (or converges) the consumer's tenant namespace, `Tenant`, RoleBinding and the
/// provider's `NetworkParameters`. The grant and `annotations` (the consumer's key, which
/// binds its identity) are only set when the Tenant is new: afterwards the grant belongs to
/// the provider's admin, and the key is never taken from a later request.
pub async fn ensure_tenant_with(
    ctx: &Ctx,
    consumer: &str,
    annotations: serde_json::Value,
) -> Result<(), kube::Error> {
    let client = &ctx.client;
    let ns = names::tenant_namespace(consumer);
    let pp = PatchParams::apply(names::FIELD_MANAGER).force();
    Api::<Namespace>::all(client.clone())
        .patch(
            &ns,
            &pp,
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": ns, "labels": {
                    names::MANAGED_BY_LABEL: names::MANAGED_BY,
                    names::TENANT_NAMESPACE_LABEL: "true",
                    names::REMOTE_CLUSTER_LABEL: consumer,
                    names::ORIGIN_CLUSTER_LABEL: consumer,
                }},
            })),
        )
        .await?;
    let tenants: Api<Tenant> = Api::namespaced(client.clone(), &ns);
    let mut tenant = tenants.get_opt(consumer).await?;
    if tenant.is_none() {
        let plan::Offer { grant, node_labels } = read_offer(ctx).await?;
        // Made now, its certificates carry their key's group.
        let mut annotations = annotations;
        annotations[names::KEY_BOUND_ANNOTATION] = json!("true");
        let new: Tenant = serde_json::from_value(json!({
            "apiVersion": "tandem.dev/v1alpha1", "kind": "Tenant",
            "metadata": {"name": consumer, "namespace": ns, "labels": {
                names::MANAGED_BY_LABEL: names::MANAGED_BY, names::ORIGIN_CLUSTER_LABEL: consumer},
                "annotations": annotations},
            "spec": {"clusterID": consumer, "grant": grant, "nodeLabels": node_labels},
        }))
        .expect("static manifest");
        tenant = Some(match tenants.create(&PostParams::default(), &new).await {
            Ok(t) => t,
            Err(e) if client::is_conflict(&e) => tenants.get(consumer).await?,
            Err(e) => return Err(e),
        });
    }
    if let Some(tenant) = &tenant {
        bind_peer(client, tenant).await?;
    }
    // The controller's own rights here (its fence nonce Lease).
    Api::<RoleBinding>::namespaced(client.clone(), &ns)
        .patch(
            rbac::CONTROLLER_TENANT_ROLE,
            &pp,
            &Patch::Apply(json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": rbac::CONTROLLER_TENANT_ROLE, "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY}},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": rbac::CONTROLLER_TENANT_ROLE},
                "subjects": [{"kind": "ServiceAccount", "name": names::CONTROLLER_NAME,
                              "namespace": names::SYSTEM_NAMESPACE}],
            })),
        )
        .await?;
    crate::provider::network::ensure_provider_parameters(ctx, consumer)
        .await
        .map_err(|e| kube::Error::Service(crate::error::chain(&e).into()))?;
    Ok(())
}

/// Binds `tenant`'s consumer to its roles in its tenant namespace and to renewing its
/// certificate, for the subjects its Tenant says ([`rbac::peer_subjects`]): converged when the
/// Tenant changes (an admin re-keying it moves the bindings to the new key).
pub(crate) async fn bind_peer(client: &Client, tenant: &Tenant) -> Result<(), kube::Error> {
    let consumer = tenant.spec.cluster_id.as_str();
    let ns = names::tenant_namespace(consumer);
    let pp = PatchParams::apply(names::FIELD_MANAGER).force();
    let subjects = rbac::peer_subjects(tenant);
    Api::<RoleBinding>::namespaced(client.clone(), &ns)
        .patch(
            PEER_ROLE_BINDING,
            &pp,
            &Patch::Apply(json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": PEER_ROLE_BINDING, "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY}},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": rbac::PEER_TENANT_ROLE},
                "subjects": subjects,
            })),
        )
        .await?;
    // Its right to renew its certificate, for as long as this Tenant lives.
    Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(client.clone())
        .patch(
            &rbac::peer_renewal_binding(consumer),
            &pp,
            &Patch::Apply(json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": rbac::peer_renewal_binding(consumer), "labels": {
                    names::MANAGED_BY_LABEL: names::MANAGED_BY, names::ORIGIN_CLUSTER_LABEL: consumer}},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": rbac::PEER_RENEWAL_ROLE},
                "subjects": subjects,
            })),
        )
        .await?;
    Ok(())
}

/// What a new consumer is offered ([`plan::offer`]), by the share in the settings.
async fn read_offer(ctx: &Ctx) -> Result<plan::Offer, kube::Error> {
    let share = ctx
        .settings()
        .await
        .map(|s| s.share_percent)
        .unwrap_or(crate::install::DEFAULT_SHARE_PERCENT);
    let nodes = Api::<Node>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await?;
    Ok(plan::offer(&nodes.items, share))
}

/// Files (once) and approves the CSR of a request; the certificate once the signer issued it.
async fn signed_certificate(
    client: &Client,
    req: &PeeringRequest,
    lifetime: Option<Duration>,
) -> Result<Option<String>, kube::Error> {
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let name = csr_name(req);
    let csr = match api.get_opt(&name).await? {
        Some(csr) => csr,
        None => match api
            .create(&PostParams::default(), &plan::csr_manifest(req, lifetime))
            .await
        {
            Ok(c) => c,
            Err(e) if client::is_conflict(&e) => api.get(&name).await?,
            Err(e) => return Err(e),
        },
    };
    match plan::csr_progress(&csr) {
        CsrProgress::Issued(cert) => return Ok(Some(cert)),
        CsrProgress::Approve => {
            api.patch_subresource(
                "approval",
                &name,
                &PatchParams::default(),
                &Patch::Merge(plan::approval(req)),
            )
            .await?;
        }
        CsrProgress::AwaitSigner => {}
    }
    Ok(None)
}

/// Removes requests whose consumer authenticated, and expired invites with their requests
/// ([`plan::cleanup`]).
async fn janitor(ctx: Ctx) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        if let Err(e) = sweep(&ctx).await {
            tracing::warn!(error = %crate::error::chain(&e), "cleaning up invites");
        }
    }
}

async fn sweep(ctx: &Ctx) -> Result<(), crate::invite::InviteError> {
    let client = &ctx.client;
    let requests: Api<PeeringRequest> = Api::namespaced(client.clone(), names::SYSTEM_NAMESPACE);
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    for invite in crate::invite::list(client).await? {
        let request = requests.get_opt(&invite.token_id).await.ok().flatten();
        let authenticated = match plan::to_authenticate(request.as_ref(), invite.used_by.as_deref())
        {
            // The consumer publishes its network parameters with its new identity.
            Some(consumer) => super::network::consumer_published(client, consumer)
                .await
                .unwrap_or(false),
            None => false,
        };
        let cleanup = plan::cleanup(request.as_ref(), invite.expires, authenticated, now);
        if cleanup.removes_request() {
            let _ = requests
                .delete(&invite.token_id, &DeleteParams::default())
                .await;
        }
        if cleanup.removes_invite() {
            crate::invite::remove_invite_objects(client, &invite.token_id).await?;
        }
    }
    Ok(())
}
