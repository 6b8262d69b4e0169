//! Consumer side of a peering: the `Peering` reconciler. With the invite token it files a
//! `PeeringRequest` on the provider (CSR signed with this cluster's key, proof of the whole
//! token), turns the approval into the peer identity (a kubeconfig Secret), then negotiates with
//! that identity: the grant from the provider's `Tenant`, the network parameters both sides
//! publish, and the IPAM remaps. Re-converges every few seconds. Its finalizer unpeers.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use ipnet::IpNet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;
use tandem_api::client;
use tandem_api::conditions;
use tandem_api::kubeconfig::Credentials;
use tandem_api::{
    NetworkParameters, Peering, PeeringRequest, PeeringStatus, RemoteNamespace, Tenant, names,
};

use crate::consumer::link::Links;
use crate::consumer::link::{
    IDENTITY_KUBECONFIG_KEY, client_from_kubeconfig, identity_client, identity_secret_name,
};
use crate::context::Ctx;
use crate::error::request;

mod errors;
mod plan;

use crate::credentials::{EXPIRES_KEY, FORCE_UNPEER_ANNOTATION, TOKEN_KEY};
use crate::rbac::{CONSUMER_NETWORK_PARAMETERS, PROVIDER_NETWORK_PARAMETERS};
pub use errors::{Error, NegotiationError, UnpeerCause, UnpeerError, UnpeerStep};
use errors::{kube_step, unpeer_step};
pub use plan::AuthFailureReason;
use plan::{AuthFailure, Existing, Step, TenantAnswer, Verdict, set};

/// How often an established peering re-reads the grant and the network parameters.
const RESYNC: Duration = Duration::from_secs(2);

/// How soon negotiation looks again while the provider has not remapped our network
/// parameters yet (it does as soon as it sees them), during the first [`NETWORK_WAIT_FOR`] of
/// waiting; [`RESYNC`] after that. With only `RESYNC`, every peering took two seconds more to
/// be Established than its provider needed.
const NETWORK_WAIT: Duration = Duration::from_millis(250);
const NETWORK_WAIT_FOR: Duration = Duration::from_secs(10);

/// What the reconciler needs: the controller's context and the links registry (to know when the
/// per-provider tasks stopped before removing the virtual node).
pub struct PeeringContext {
    ctx: Ctx,
    links: Links,
}

pub async fn run(ctx: Ctx, links: Links) {
    let api: Api<Peering> = Api::all(ctx.client.clone());
    Controller::new(api, watcher::Config::default())
        .run(
            crate::metrics::timed(ctx.metrics.clone(), "peering", reconcile),
            error_policy,
            Arc::new(PeeringContext { ctx, links }),
        )
        .for_each(|_| async {})
        .await;
}

fn error_policy(_p: Arc<Peering>, e: &Error, _ctx: Arc<PeeringContext>) -> Action {
    tracing::warn!(error = %crate::error::chain(e), "peering");
    Action::requeue(Duration::from_secs(1))
}

/// A kubeconfig for the provider at `endpoint` (trusting `ca_pem`) with `credentials`.
pub fn kubeconfig(endpoint: &str, ca_pem: &str, credentials: Credentials<'_>) -> String {
    tandem_api::kubeconfig::to_yaml(&tandem_api::kubeconfig::single(
        "provider",
        endpoint,
        ca_pem,
        "peer",
        credentials,
        None,
    ))
}

async fn reconcile(peering: Arc<Peering>, pctx: Arc<PeeringContext>) -> Result<Action, Error> {
    let ctx = &pctx.ctx;
    let provider = peering.name_any();
    let api: Api<Peering> = Api::all(ctx.client.clone());
    let link_running = pctx.links.snapshot().contains_key(&provider);
    let old = peering.status.clone().unwrap_or_default();
    let mut status = old.clone();
    let action = match plan::next_step(&peering, link_running) {
        Step::WaitForLinkToStop => return Ok(Action::requeue(Duration::from_millis(100))),
        Step::Unpeer => {
            if let Err(e) = unpeer(ctx, &peering).await {
                report_stuck_unpeer(&api, &peering, &e).await;
                return Err(Error::Unpeer {
                    provider,
                    source: e,
                });
            }
            crate::install::remove_finalizer(&api, &*peering)
                .await
                .map_err(kube_step(&provider, "removing the finalizer"))?;
            return Ok(Action::await_change());
        }
        Step::Gone | Step::StayFailed => return Ok(Action::await_change()),
        Step::AddFinalizer => {
            crate::install::add_finalizer(&api, &*peering)
                .await
                .map_err(kube_step(&provider, "adding the finalizer"))?;
            return Ok(Action::await_change());
        }
        Step::Negotiate => negotiate(ctx, &peering, &mut status).await,
        Step::Authenticate => {
            let now = k8s_openapi::jiff::Timestamp::now().as_second();
            authenticate(ctx, &peering, &mut status, now).await
        }
    };
    if status != old {
        // Replace the whole status: a merge patch would keep resources the provider no longer
        // grants and fields that became empty.
        // (A PUT of the status subresource, guarded by the resourceVersion we read.)
        let mut updated = (*peering).clone();
        updated.status = Some(status);
        api.replace_status(&provider, &PostParams::default(), &updated)
            .await
            .map_err(kube_step(&provider, "writing status"))?;
    }
    Ok(action)
}

async fn authenticate(
    ctx: &Ctx,
    peering: &Peering,
    status: &mut PeeringStatus,
    now: i64,
) -> Action {
    match try_authenticate(ctx, peering, status, now).await {
        Ok(Some(())) => {
            // The enrollment credential or invite token has served its purpose.
            ctx.peer_clients
                .forget_one(&peering.spec.cluster_id, "token");
            status.phase = Some("Authenticating".into());
            Action::requeue(Duration::from_millis(50))
        }
        Ok(None) => {
            if status.phase.is_none() {
                status.phase = Some("Authenticating".into());
            }
            // Waiting for a provider's admin can take hours: poll quickly at first (a policy
            // answers at once), then every few seconds.
            let awaiting_since = conditions::find(&status.conditions, conditions::AUTHENTICATED)
                .filter(|c| c.reason == plan::AWAITING_APPROVAL)
                .map(|c| c.last_transition_time.0.as_second());
            // (A GET over a kept connection: cheap, and it is most of a peering's time.)
            match awaiting_since {
                Some(t) if now - t > 10 => Action::requeue(Duration::from_secs(5)),
                _ => Action::requeue(Duration::from_millis(100)),
            }
        }
        Err(f) => {
            set(
                status,
                conditions::AUTHENTICATED,
                false,
                f.reason.as_str(),
                &f.message,
            );
            if f.permanent {
                status.phase = Some("Failed".into());
                Action::await_change()
            } else {
                status.phase = Some("Authenticating".into());
                Action::requeue(Duration::from_secs(2))
            }
        }
    }
}

/// Files the request (once), reads the answer; Ok(Some) when the identity was stored.
async fn try_authenticate(
    ctx: &Ctx,
    peering: &Peering,
    status: &mut PeeringStatus,
    now: i64,
) -> Result<Option<()>, AuthFailure> {
    let provider = peering.spec.cluster_id.clone();
    let tenant_ns = names::tenant_namespace(&provider);
    let consumer = ctx.identity.cluster_id.clone();
    let secret_name = peering
        .spec
        .invite_secret
        .clone()
        .unwrap_or_else(|| crate::credentials::consumer_token_secret_name(&provider));
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &tenant_ns);
    let token_secret = secrets
        .get_opt(&secret_name)
        .await
        .map_err(|e| AuthFailure::transient(AuthFailureReason::LocalError, format!("reading Secret {tenant_ns}/{secret_name}: {e}")))?
        .ok_or_else(|| {
            AuthFailure::permanent(
                AuthFailureReason::InviteMissing,
                format!("the invite token Secret {tenant_ns}/{secret_name} is missing; run `tandem peer` with a new invite"),
            )
        })?;
    // Set once the request is filed with the enrollment credential (see below).
    let filed = token_secret
        .annotations()
        .get(crate::credentials::FILED_ANNOTATION)
        .cloned();
    let data = token_secret.data.unwrap_or_default();
    let get = |k: &str| {
        data.get(k)
            .map(|v| String::from_utf8_lossy(&v.0).into_owned())
    };
    let token = get(TOKEN_KEY).unwrap_or_default();
    let expires: Option<i64> = get(EXPIRES_KEY).and_then(|e| e.parse().ok());
    let Some((token_id, token_secret_part)) = token.split_once('.') else {
        return Err(AuthFailure::permanent(
            AuthFailureReason::InviteInvalid,
            format!("Secret {tenant_ns}/{secret_name} holds no valid token"),
        ));
    };
    let kc = kubeconfig(
        &peering.spec.endpoint,
        &peering.spec.ca_data,
        Credentials::Token(&token),
    );
    let client = ctx
        .peer_clients
        .get(&peering.spec.cluster_id, "token", &kc, || {
            client_from_kubeconfig(&kc)
        })
        .await
        .map_err(|e| {
            AuthFailure::permanent(
                AuthFailureReason::InviteInvalid,
                format!("invite endpoint/CA: {}", crate::error::chain(&e)),
            )
        })?;
    // Filed with the enrollment credential (peering through discovery), the request lives in
    // the enrollment namespace under a name derived from this cluster's key.
    let enrolling =
        get(crate::credentials::MODE_KEY).as_deref() == Some(crate::credentials::MODE_ENROLL);
    let (request_ns, request_name) = if enrolling {
        let fp = crate::credentials::own_key_fingerprint(&ctx.identity.private_key_pem).map_err(
            |e| {
                AuthFailure::permanent(
                    AuthFailureReason::Csr,
                    format!("reading this cluster's key: {e}"),
                )
            },
        )?;
        (
            names::ENROLL_NAMESPACE,
            crate::credentials::request_name(&fp),
        )
    } else {
        (names::SYSTEM_NAMESPACE, token_id.to_string())
    };
    let requests: Api<PeeringRequest> = Api::namespaced(client, request_ns);
    let token = plan::Token {
        id: token_id,
        endpoint: &peering.spec.endpoint,
        expires,
    };
    // What the provider's answer to the token at `step` means; `used` explains a 403.
    let refused = |e: &kube::Error, step: &str, used: &str| {
        if enrolling {
            return plan::enrollment_refusal(
                client::status_code(e),
                &e.to_string(),
                step,
                &request_name,
                &peering.spec.endpoint,
            );
        }
        plan::token_refusal(
            client::status_code(e),
            &e.to_string(),
            step,
            used,
            &token,
            now,
        )
    };
    let existing = match requests.get_opt(&request_name).await {
        Ok(r) => r,
        Err(e) => {
            return Err(refused(
                &e,
                "reading",
                "it may not read its peering request (already used or cleaned up)",
            ));
        }
    };
    let enrolled = plan::Enrolled {
        name: &request_name,
        token_id,
        token_secret: token_secret_part,
        filed: filed.as_deref(),
    };
    let request = match existing {
        Some(r) => match plan::existing_request(&r, &consumer, enrolling.then_some(&enrolled)) {
            Existing::Decoy => {
                return Err(AuthFailure::transient(
                    AuthFailureReason::RequestFailed,
                    format!(
                        "a peering request {request_name} on {provider} is not this cluster's (another key, a CSR that does not prove it, or this cluster's CSR filed again by someone else); waiting for {provider} to remove it"
                    ),
                ));
            }
            Existing::OtherCluster => return Err(plan::used_by_another_cluster()),
            Existing::Ours => {
                if enrolling && filed.is_none() {
                    // Filed by an earlier pass that could not record it (its create met a
                    // conflict, or the record failed): recorded now, so that its removal is
                    // told as such.
                    record_filed(&secrets, &secret_name, &r).await?;
                }
                r
            }
        },
        // Filed, and gone before an answer reached us: denied, expired, or approved unused.
        None if enrolling && filed.is_some() => {
            let f = AuthFailure::permanent(
                AuthFailureReason::RequestRemoved,
                format!(
                    "{provider} removed peering request {request_name} before this cluster read an answer: denied, expired unapproved, or approved and left unused past the provider's grace (its request TTL, at most 10 minutes; this cluster may have been cut off from it); run `tandem peer` again"
                ),
            );
            give_up_enrollment(ctx, peering, "PeeringRequestRemoved", &f.message).await;
            return Err(f);
        }
        None => {
            let csr = make_csr(ctx).map_err(|e| {
                AuthFailure::permanent(AuthFailureReason::Csr, format!("creating the CSR: {e}"))
            })?;
            let proof =
                tandem_core::invite::token_proof(token_secret_part, &consumer, token_id, &csr);
            let req: PeeringRequest = serde_json::from_value(json!({
                "apiVersion": "tandem.dev/v1alpha1", "kind": "PeeringRequest",
                "metadata": {"name": request_name, "namespace": request_ns,
                             "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY}},
                "spec": {"clusterID": consumer, "tokenID": token_id, "tokenProof": proof, "csr": csr,
                         "protocolVersion": tandem_core::protocol::VERSION,
                         "source": get(crate::credentials::SOURCE_KEY).filter(|_| enrolling)},
            }))
            .expect("static manifest");
            let filed = match requests.create(&PostParams::default(), &req).await {
                Ok(r) => r,
                Err(e) if client::is_conflict(&e) => return Ok(None),
                Err(e) => return Err(refused(&e, "filing", "token already used")),
            };
            if enrolling {
                record_filed(&secrets, &secret_name, &filed).await?;
            }
            filed
        }
    };
    set(
        status,
        conditions::PROVIDER_REACHABLE,
        true,
        "Answered",
        "the provider answered the peering request",
    );
    let answer = request.status.unwrap_or_default();
    match plan::request_verdict(&answer, &provider) {
        Verdict::Refused(f) => {
            if enrolling && f.reason == AuthFailureReason::Denied {
                give_up_enrollment(ctx, peering, "PeeringDenied", &f.message).await;
            }
            Err(f)
        }
        Verdict::Approved => {
            let cert = answer.certificate.unwrap_or_default();
            let remote_tenant = answer
                .tenant_namespace
                .unwrap_or_else(|| names::tenant_namespace(&consumer));
            let identity_kc = kubeconfig(
                &peering.spec.endpoint,
                &peering.spec.ca_data,
                Credentials::ClientCertificate {
                    cert_pem: &cert,
                    key_pem: &ctx.identity.private_key_pem,
                },
            );
            let identity_name = identity_secret_name(&provider);
            secrets
                .patch(
                    &identity_name,
                    &PatchParams::apply(names::FIELD_MANAGER).force(),
                    &Patch::Apply(json!({
                        "apiVersion": "v1", "kind": "Secret",
                        "metadata": {"name": identity_name,
                                     "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY}},
                        "stringData": {IDENTITY_KUBECONFIG_KEY: identity_kc},
                    })),
                )
                .await
                .map_err(|e| {
                    AuthFailure::transient(
                        AuthFailureReason::LocalError,
                        format!("writing Secret {tenant_ns}/{identity_name}: {e}"),
                    )
                })?;
            let _ = secrets.delete(&secret_name, &DeleteParams::default()).await;
            status.identity_secret = Some(identity_name);
            status.remote_tenant_namespace = Some(remote_tenant);
            status.virtual_node = Some(names::virtual_node_name(&provider));
            set(
                status,
                conditions::AUTHENTICATED,
                true,
                "IdentityIssued",
                &format!(
                    "peer identity {} issued by {provider}",
                    names::peer_user(&consumer)
                ),
            );
            Ok(Some(()))
        }
        Verdict::Pending if enrolling => {
            let message = format!(
                "peering request {request_name} filed with {provider}, {}",
                answer
                    .message
                    .unwrap_or_else(|| "waiting for the provider to check it".into())
            );
            set(
                status,
                conditions::AUTHENTICATED,
                false,
                plan::AWAITING_APPROVAL,
                &message,
            );
            Ok(None)
        }
        Verdict::Pending => {
            set(
                status,
                conditions::AUTHENTICATED,
                false,
                "Pending",
                "waiting for the provider to answer the peering request",
            );
            Ok(None)
        }
    }
}

/// Records on the token Secret that `request` was filed, where a restart or a transient
/// failure cannot erase it: a request found gone afterwards was removed by the provider, not
/// yet filed.
async fn record_filed(
    secrets: &Api<Secret>,
    secret_name: &str,
    request: &PeeringRequest,
) -> Result<(), AuthFailure> {
    secrets
        .patch(
            secret_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                crate::credentials::FILED_ANNOTATION: request.uid().unwrap_or_default()}}})),
        )
        .await
        .map(|_| ())
        .map_err(|e| {
            AuthFailure::transient(
                AuthFailureReason::LocalError,
                format!(
                    "recording the filed request on Secret {}/{secret_name}: {e}",
                    secrets.namespace().unwrap_or_default()
                ),
            )
        })
}

/// A peering through discovery that the provider denied, or whose request it removed, leaves
/// nothing behind: why goes into an Event with `reason` (`kubectl get events`), and the
/// Peering is deleted without any step on the provider, which holds nothing for it any more.
/// Best effort: a failure leaves it Failed.
async fn give_up_enrollment(ctx: &Ctx, peering: &Peering, reason: &str, message: &str) {
    let provider = peering.name_any();
    crate::events::record(
        &ctx.client,
        "default",
        json!({"apiVersion": "tandem.dev/v1alpha1", "kind": "Peering", "name": provider,
               "uid": peering.metadata.uid}),
        reason,
        message,
        true,
    )
    .await;
    let api: Api<Peering> = Api::all(ctx.client.clone());
    let marked = api
        .patch(
            &provider,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {FORCE_UNPEER_ANNOTATION: "true"}}})),
        )
        .await;
    if marked.is_ok() {
        let _ = api.delete(&provider, &DeleteParams::default()).await;
    }
    tracing::info!(%provider, %reason, %message, "peering through discovery given up; removed");
}

/// A PKCS#10 request for the peer user in the group of this cluster's key, signed with it.
pub(crate) fn make_csr(ctx: &Ctx) -> Result<String, rcgen::Error> {
    let key = rcgen::KeyPair::from_pem(&ctx.identity.private_key_pem)?;
    let fingerprint = crate::credentials::own_key_fingerprint(&ctx.identity.private_key_pem)?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(
        rcgen::DnType::CommonName,
        names::peer_user(&ctx.identity.cluster_id),
    );
    dn.push(
        rcgen::DnType::OrganizationName,
        names::peer_key_group(&fingerprint),
    );
    params.distinguished_name = dn;
    params.serialize_request(&key)?.pem()
}

/// Negotiation with the peer identity: grant, network parameters, remaps.
async fn negotiate(ctx: &Ctx, peering: &Peering, status: &mut PeeringStatus) -> Action {
    let provider = peering.spec.cluster_id.clone();
    let consumer = ctx.identity.cluster_id.clone();
    let identity = status
        .identity_secret
        .clone()
        .unwrap_or_else(|| identity_secret_name(&provider));
    let client = match identity_client(ctx, &provider, &identity).await {
        Ok((c, _)) => c,
        Err(e) => {
            set(
                status,
                conditions::AUTHENTICATED,
                false,
                AuthFailureReason::IdentityMissing.as_str(),
                &crate::error::chain(&e),
            );
            status.phase = Some("Failed".into());
            return Action::requeue(RESYNC);
        }
    };
    let remote_ns = status
        .remote_tenant_namespace
        .clone()
        .unwrap_or_else(|| names::tenant_namespace(&consumer));
    // Grant.
    let tenants: Api<Tenant> = Api::namespaced(client.clone(), &remote_ns);
    let answer = match tenants.get(&consumer).await {
        Ok(t) => TenantAnswer::Found(Box::new(t)),
        Err(e) if client::is_gone_or_forbidden(&e) => TenantAnswer::Gone(e.to_string()),
        Err(e) => TenantAnswer::Unreachable(e.to_string()),
    };
    let place = plan::Place {
        provider: &provider,
        consumer: &consumer,
        remote_namespace: &remote_ns,
        endpoint: &peering.spec.endpoint,
    };
    if !plan::apply_tenant_answer(status, &answer, &place) {
        return Action::requeue(RESYNC);
    }
    // Network: where the provider reaches our gateway, then the parameters.
    let settings = ctx.settings().await;
    if let Ok(settings) = &settings {
        match settings.fabric_off() {
            None => set(
                status,
                conditions::NETWORK_FABRIC,
                true,
                "On",
                "this cluster's network fabric runs: a gateway per peer, routes from every node",
            ),
            Some(why) => {
                let reason = if settings.network_fabric {
                    "HollowCluster"
                } else {
                    "Disabled"
                };
                set(status, conditions::NETWORK_FABRIC, false, reason, why);
            }
        }
    }
    let endpoint = match settings {
        Ok(settings) if settings.fabric_off().is_none() => {
            let exposed = settings.gateway_service_type;
            match crate::fabric::gateway::exposure(ctx, &provider, exposed).await {
                Ok(crate::fabric::gateway::plan::Exposure::At { endpoint, how }) => {
                    let msg =
                        format!("provider {provider} reaches our gateway at {endpoint}: {how}");
                    set(status, conditions::GATEWAY_EXPOSED, true, "Exposed", &msg);
                    Some(endpoint)
                }
                Ok(crate::fabric::gateway::plan::Exposure::Pending(why)) => {
                    set(status, conditions::GATEWAY_EXPOSED, false, "Pending", &why);
                    None
                }
                Err(e) => {
                    let msg = format!("reading this side's gateway Service: {e}");
                    set(status, conditions::GATEWAY_EXPOSED, false, "Failed", &msg);
                    None
                }
            }
        }
        _ => None,
    };
    match negotiate_network(ctx, &client, &remote_ns, &provider, endpoint).await {
        Ok(Some(network)) => {
            let msg = format!(
                "provider pods {} are {} here; our pods are {} there",
                network.remote_pod_cidr,
                network.remapped_remote_pod_cidr,
                network.local_pod_cidr_in_remote.clone().unwrap_or_default()
            );
            status.network = Some(network);
            set(
                status,
                conditions::NETWORK_NEGOTIATED,
                true,
                "Negotiated",
                &msg,
            );
        }
        Ok(None) => {
            set(
                status,
                conditions::NETWORK_NEGOTIATED,
                false,
                "Waiting",
                "waiting for the provider's network parameters",
            );
        }
        Err(e) => {
            set(
                status,
                conditions::NETWORK_NEGOTIATED,
                false,
                "Failed",
                &crate::error::chain(&e),
            );
        }
    }
    status.phase = Some(plan::negotiated_phase(status).into());
    let waiting_since = conditions::find(&status.conditions, conditions::NETWORK_NEGOTIATED)
        .filter(|c| c.status == "False" && c.reason == "Waiting")
        .map(|c| c.last_transition_time.0);
    let now = k8s_openapi::jiff::Timestamp::now();
    match waiting_since {
        Some(t)
            if now.as_millisecond() - t.as_millisecond() < NETWORK_WAIT_FOR.as_millis() as i64 =>
        {
            Action::requeue(NETWORK_WAIT)
        }
        _ => Action::requeue(RESYNC),
    }
}

/// Publishes this side's network parameters (with our gateway's `endpoint`, once it has one)
/// and reads the provider's.
async fn negotiate_network(
    ctx: &Ctx,
    client: &Client,
    remote_ns: &str,
    provider: &str,
    endpoint: Option<String>,
) -> Result<Option<tandem_api::peering::PeeringNetwork>, NegotiationError> {
    let settings = ctx.settings().await?;
    let key = crate::fabric::gateway_key(ctx, provider).await?;
    let api: Api<NetworkParameters> = Api::namespaced(client.clone(), remote_ns);
    let mut ours = json!({"clusterID": ctx.identity.cluster_id, "podCIDR": settings.pod_cidr,
                          "externalCIDR": settings.external_cidr, "publicKey": key.public_key});
    if let Some(endpoint) = endpoint {
        ours["gatewayEndpoint"] = json!(endpoint);
    }
    let published = api
        .get_opt(CONSUMER_NETWORK_PARAMETERS)
        .await
        .map_err(request(format!(
            "reading NetworkParameters {remote_ns}/consumer"
        )))?;
    let published = match published {
        None => {
            let np: NetworkParameters = serde_json::from_value(json!({
                "apiVersion": "tandem.dev/v1alpha1", "kind": "NetworkParameters",
                "metadata": {"name": CONSUMER_NETWORK_PARAMETERS,
                             "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY}},
                "spec": ours,
            }))
            .expect("static manifest");
            api.create(&PostParams::default(), &np)
                .await
                .map_err(request(format!(
                    "publishing NetworkParameters {remote_ns}/consumer"
                )))?
        }
        Some(p) if serde_json::to_value(&p.spec).ok().as_ref() != Some(&ours) => api
            .patch(
                CONSUMER_NETWORK_PARAMETERS,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": ours})),
            )
            .await
            .map_err(request(format!(
                "updating NetworkParameters {remote_ns}/consumer"
            )))?,
        Some(p) => p,
    };
    let Some(theirs) = api
        .get_opt(PROVIDER_NETWORK_PARAMETERS)
        .await
        .map_err(request(format!(
            "reading NetworkParameters {remote_ns}/provider"
        )))?
    else {
        return Ok(None);
    };
    let pod: IpNet = theirs
        .spec
        .pod_cidr
        .parse()
        .map_err(|source| NegotiationError::PodCidr {
            cidr: theirs.spec.pod_cidr.clone(),
            source,
        })?;
    let mut prefixes = vec![pod];
    let ext: Option<IpNet> = theirs
        .spec
        .external_cidr
        .as_ref()
        .and_then(|e| e.parse().ok());
    prefixes.extend(ext);
    let grants = crate::provider::network::map_peer(ctx, &settings, provider, &prefixes).await?;
    let remapped_pod = grants[0].granted.to_string();
    let remapped_ext = grants.get(1).map(|g| g.granted.to_string());
    let current = theirs.status.clone().unwrap_or_default();
    if current.remapped_pod_cidr.as_deref() != Some(remapped_pod.as_str())
        || current.remapped_external_cidr != remapped_ext
    {
        api.patch_status(
            PROVIDER_NETWORK_PARAMETERS,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"remappedPodCIDR": remapped_pod, "remappedExternalCIDR": remapped_ext}})),
        )
        .await
        .map_err(request(format!(
            "writing our remap into NetworkParameters {remote_ns}/provider"
        )))?;
    }
    // The provider refused a prefix this cluster declares (loopback, public, ...): said as
    // the negotiation's failure, which the admin fixes in this cluster's settings.
    if let Some(refused) = published.status.as_ref().and_then(|s| {
        conditions::find(&s.conditions, conditions::PREFIXES_GRANTED)
            .filter(|c| c.status == "False")
    }) {
        return Err(NegotiationError::Refused(refused.message.clone()));
    }
    let local_external_there = published
        .status
        .as_ref()
        .and_then(|s| s.remapped_external_cidr.clone());
    let Some(local_there) = published.status.and_then(|s| s.remapped_pod_cidr) else {
        return Ok(None);
    };
    Ok(Some(tandem_api::peering::PeeringNetwork {
        remote_pod_cidr: pod.to_string(),
        remapped_remote_pod_cidr: remapped_pod,
        remote_external_cidr: ext.map(|e| e.to_string()),
        remapped_remote_external_cidr: remapped_ext,
        local_pod_cidr_in_remote: Some(local_there),
        local_external_cidr_in_remote: local_external_there,
        remote_gateway_endpoint: theirs.spec.gateway_endpoint.clone(),
        remote_public_key: theirs.spec.public_key.clone(),
    }))
}

/// Tells the admin, in the deleting Peering's status, which unpeering step fails and why:
/// phase `Unpeering`, condition `Unpeered` False with the step as reason, and
/// `ProviderReachable` False when the provider did not answer.
async fn report_stuck_unpeer(api: &Api<Peering>, peering: &Peering, e: &UnpeerError) {
    let old = peering.status.clone().unwrap_or_default();
    let mut status = old.clone();
    status.phase = Some("Unpeering".into());
    set(
        &mut status,
        conditions::UNPEERED,
        false,
        e.step.reason(),
        &crate::error::chain(&e.cause),
    );
    if e.provider_unreachable() {
        set(
            &mut status,
            conditions::PROVIDER_REACHABLE,
            false,
            "Unreachable",
            &format!("provider unreachable at {}", peering.spec.endpoint),
        );
    }
    if status == old {
        return;
    }
    let mut updated = peering.clone();
    updated.status = Some(status);
    // A conflict only means a newer version is on its way; the retry reports again.
    if let Err(e) = api
        .replace_status(&peering.name_any(), &PostParams::default(), &updated)
        .await
    {
        tracing::debug!(error = %e, "reporting the unpeering step");
    }
}

/// Deletes the pods bound to `node` (with grace 0: nothing runs them any more), again until a
/// listing finds none — a binding the scheduler sent before it saw the node go may land after
/// the first listing.
async fn drain(ctx: &Ctx, provider: &str, node: &str) -> Result<(), UnpeerError> {
    let pods: Api<Pod> = Api::all(ctx.client.clone());
    let on_node = ListParams::default().fields(&format!("spec.nodeName={node}"));
    for _ in 0..5 {
        let bound = pods
            .list(&on_node)
            .await
            .map_err(unpeer_step(UnpeerStep::DrainPods))?;
        // A pod with finalizers of its own stays, marked deleted, until they are done.
        let live: Vec<Pod> = bound
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        if live.is_empty() {
            return Ok(());
        }
        for pod in live {
            let ns = pod.namespace().unwrap_or_default();
            let deleted = Api::<Pod>::namespaced(ctx.client.clone(), &ns)
                .delete(
                    &pod.name_any(),
                    &DeleteParams {
                        grace_period_seconds: Some(0),
                        ..Default::default()
                    },
                )
                .await;
            ignore_missing(deleted).map_err(unpeer_step(UnpeerStep::DrainPods))?;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tracing::warn!(%provider, %node, "pods are still being bound to the deleted virtual node");
    Ok(())
}

/// Deletes the virtual node, then its lease, and drains the pods bound to it; with `always`
/// false, the lease and the pods only if the node was there. Whether it was.
async fn remove_virtual_node(
    ctx: &Ctx,
    provider: &str,
    node: &str,
    always: bool,
) -> Result<bool, UnpeerError> {
    let deleted = client::ok_if_not_found(
        Api::<Node>::all(ctx.client.clone())
            .delete(node, &DeleteParams::default())
            .await,
    )
    .map_err(unpeer_step(UnpeerStep::DeleteVirtualNode))?
    .is_some();
    if always || deleted {
        ignore_missing(
            Api::<Lease>::namespaced(ctx.client.clone(), crate::rbac::LEASE_NAMESPACE)
                .delete(node, &DeleteParams::default())
                .await,
        )
        .map_err(unpeer_step(UnpeerStep::DeleteLease))?;
        drain(ctx, provider, node).await?;
    }
    Ok(deleted)
}

/// Undoes a peering: the virtual node and its pods here, the twin namespaces and the Tenant on
/// the provider (unless forced), the IPAM grant and the tenant namespace here.
async fn unpeer(ctx: &Ctx, peering: &Peering) -> Result<(), UnpeerError> {
    let provider = peering.spec.cluster_id.clone();
    let consumer = ctx.identity.cluster_id.clone();
    let status = peering.status.clone().unwrap_or_default();
    let force = peering.annotations().contains_key(FORCE_UNPEER_ANNOTATION);
    let node = status
        .virtual_node
        .clone()
        .unwrap_or_else(|| names::virtual_node_name(&provider));
    tracing::info!(%provider, force, "unpeering");
    // The node goes first, so that the scheduler stops placing the replacements of the pods
    // drained below on it (a pod bound to a node that is gone would stay bound forever).
    remove_virtual_node(ctx, &provider, &node, true).await?;
    if !force && conditions::is_true(&status.conditions, conditions::AUTHENTICATED) {
        let identity = status
            .identity_secret
            .clone()
            .unwrap_or_else(|| identity_secret_name(&provider));
        let (client, _) = identity_client(ctx, &provider, &identity)
            .await
            .map_err(unpeer_step(UnpeerStep::ReadIdentity))?;
        let remote_ns = status
            .remote_tenant_namespace
            .clone()
            .unwrap_or_else(|| names::tenant_namespace(&consumer));
        let remote_namespaces: Api<RemoteNamespace> = Api::namespaced(client.clone(), &remote_ns);
        let delete_data = peering
            .annotations()
            .contains_key(names::DELETE_DATA_ANNOTATION);
        match remote_namespaces.list(&ListParams::default()).await {
            Ok(list) => {
                let left = list.items.len();
                for rn in list.items {
                    if delete_data && !rn.annotations().contains_key(names::DELETE_DATA_ANNOTATION)
                    {
                        ignore_gone(
                            remote_namespaces
                                .patch(
                                    &rn.name_any(),
                                    &PatchParams::default(),
                                    &Patch::Merge(json!({"metadata": {"annotations": {
                                        names::DELETE_DATA_ANNOTATION: "true"}}})),
                                )
                                .await,
                        )
                        .map_err(unpeer_step(UnpeerStep::DeleteTwinNamespaces))?;
                    }
                    ignore_gone(
                        remote_namespaces
                            .delete(&rn.name_any(), &DeleteParams::default())
                            .await,
                    )
                    .map_err(unpeer_step(UnpeerStep::DeleteTwinNamespaces))?;
                }
                if delete_data && left > 0 {
                    return Err(UnpeerError {
                        step: UnpeerStep::DeleteTwinNamespaces,
                        cause: UnpeerCause::TwinsWithData(left),
                    });
                }
            }
            Err(e) if client::is_gone_or_forbidden(&e) => {}
            Err(e) => return Err(unpeer_step(UnpeerStep::DeleteTwinNamespaces)(e)),
        }
        ignore_gone(
            Api::<Tenant>::namespaced(client, &remote_ns)
                .delete(&consumer, &DeleteParams::default())
                .await,
        )
        .map_err(unpeer_step(UnpeerStep::DeleteTenant))?;
    }
    // Once more: a virtual node task that saw the node deleted by hand just before unpeering
    // began may have made it again (its tasks stop with the link, by now). If it had, its
    // lease and any pod bound to it meanwhile go too.
    if remove_virtual_node(ctx, &provider, &node, false).await? {
        tracing::warn!(%provider, %node, "the virtual node was made again while unpeering; deleted again");
    }
    crate::provider::network::release_peer(ctx, &provider)
        .await
        .map_err(unpeer_step(UnpeerStep::ReleaseIpam))?;
    crate::fabric::forget_peer(&ctx.client, &provider)
        .await
        .map_err(unpeer_step(UnpeerStep::RemoveGatewayKey))?;
    ctx.peer_clients.forget(&provider);
    let tenant_ns = names::tenant_namespace(&provider);
    // Peered both ways, the namespace also holds the peer's Tenant of this cluster (it
    // consumes from us): only this relation's Secrets go, the namespace stays. (This Peering
    // is being deleted, so a live relation with the peer is that Tenant.)
    let serves_peer = crate::fabric::live_relation(&ctx.client, Some(&provider))
        .await
        .map_err(unpeer_step(UnpeerStep::DeleteTenantNamespace))?;
    if serves_peer {
        let secrets = Api::<Secret>::namespaced(ctx.client.clone(), &tenant_ns);
        let mut names: Vec<String> = vec![
            identity_secret_name(&provider),
            crate::credentials::consumer_token_secret_name(&provider),
        ];
        names.extend(status.identity_secret.clone());
        names.extend(peering.spec.invite_secret.clone());
        names.sort();
        names.dedup();
        for name in names {
            client::delete_if_exists(&secrets, &name, &DeleteParams::default())
                .await
                .map_err(unpeer_step(UnpeerStep::DeleteTenantNamespace))?;
        }
        return Ok(());
    }
    ignore_missing(
        Api::<Namespace>::all(ctx.client.clone())
            .delete(&tenant_ns, &DeleteParams::default())
            .await,
    )
    .map_err(unpeer_step(UnpeerStep::DeleteTenantNamespace))?;
    Ok(())
}

fn ignore_missing<T>(r: Result<T, kube::Error>) -> Result<(), kube::Error> {
    client::ok_if_not_found(r).map(|_| ())
}

/// Missing, or no longer ours to touch (the provider already removed our access).
fn ignore_gone<T>(r: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match r {
        Err(e) if !client::is_gone_or_forbidden(&e) => Err(e),
        _ => Ok(()),
    }
}
