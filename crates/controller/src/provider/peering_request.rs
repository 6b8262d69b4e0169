//! Provider side of the invite flow. A consumer files a `PeeringRequest` (named after the invite's
//! token ID) with the invite's bootstrap token; this reconciler checks it (token known, unexpired,
//! unused, proof of the whole token, a CSR signed by the consumer's key for exactly the peer
//! user and group), creates the consumer's tenant namespace, `Tenant` and RoleBinding, gets the
//! CSR signed through the CSR API and answers Approved with the certificate — or Denied with the
//! reason. A janitor removes used requests once the consumer authenticated and expired invites.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::ByteString;
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

/// How long a denied request (and its spent invite) stays for the consumer to read the reason.
const DENIED_GRACE_SECS: i64 = 30;

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

/// Annotation on a peering request's CSR naming the request (`namespace/name`).
const REQUEST_ANNOTATION: &str = "tandem.dev/peering-request";

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
                Ok(csr) => {
                    let mine = csr
                        .annotations()
                        .get(REQUEST_ANNOTATION)
                        .and_then(|r| r.split_once('/'))
                        .is_some_and(|(request_ns, _)| request_ns == ns);
                    let issued = client::issued_certificate(&csr).is_some();
                    (mine && issued).then_some(())
                }
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

/// The outcome of checking a request against its invite.
enum Verdict {
    Deny(String),
    Accept,
}

async fn reconcile(req: Arc<PeeringRequest>, ctx: Ctx) -> Result<Action, Error> {
    let name = req.name_any();
    let phase = req.status.as_ref().and_then(|s| s.phase.clone());
    if matches!(phase.as_deref(), Some("Approved" | "Denied")) {
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
    let verdict = match &token {
        // Only the token named like the request may read it back: nobody could read a denial.
        None => {
            tracing::info!(request = %name, "peering request without an invite token removed");
            Api::<PeeringRequest>::namespaced(client.clone(), names::SYSTEM_NAMESPACE)
                .delete(&name, &DeleteParams::default())
                .await
                .map(|_| ())
                .or_else(ignore_missing)
                .map_err(step("removing the request"))?;
            return Ok(Action::await_change());
        }
        Some(secret) => check(&ctx, &req, secret),
    };
    if let Verdict::Deny(message) = verdict {
        tracing::info!(request = %name, consumer = %req.spec.cluster_id, %message, "peering request denied");
        set_status(
            client,
            &name,
            json!({"phase": "Denied", "message": message}),
        )
        .await
        .map_err(step("writing status"))?;
        return Ok(Action::await_change());
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
        if let Some(why) = key_refusal(tenant.as_ref(), &consumer, &fingerprint) {
            tracing::info!(request = %name, %consumer, message = %why, "peering request denied");
            set_status(client, &name, json!({"phase": "Denied", "message": why}))
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

/// Why a request for `consumer`'s identity with the key `fingerprint` is refused, if it is: a
/// Tenant of that cluster ID records another key, or none (a Tenant made before keys were
/// recorded: its key cannot be learned from a request, which an impostor could race).
fn key_refusal(tenant: Option<&Tenant>, consumer: &str, fingerprint: &str) -> Option<String> {
    let tenant = tenant?;
    let tenant_ns = names::tenant_namespace(consumer);
    match tenant.annotations().get(names::KEY_FINGERPRINT_ANNOTATION) {
        Some(key) if key == fingerprint => None,
        Some(key) => Some(format!(
            "cluster ID {consumer} already peers with this cluster under key {key} (Tenant {tenant_ns}/{consumer}); this request's key is {fingerprint}. Cluster IDs are self-asserted, so it is refused; if the consumer really changed its key, its identity is re-keyed by this cluster's admin: `kubectl -n {tenant_ns} annotate tenant {consumer} --overwrite {}={fingerprint}`",
            names::KEY_FINGERPRINT_ANNOTATION
        )),
        None => Some(format!(
            "cluster ID {consumer} already peers with this cluster (Tenant {tenant_ns}/{consumer}) and no key is recorded for it; this request's key is {fingerprint}. The key is an admin's to record: `kubectl -n {tenant_ns} annotate tenant {consumer} {}={fingerprint}`",
            names::KEY_FINGERPRINT_ANNOTATION
        )),
    }
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
    let answered = stored.as_ref().is_none_or(|r| {
        matches!(
            r.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Approved" | "Denied")
        )
    });
    if answered {
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
    let mut status = json!({
        "phase": "Approved",
        "message": format!("peer identity {} issued", names::peer_user(&consumer)),
        "certificate": cert,
        "tenantNamespace": names::tenant_namespace(&consumer),
        "providerClusterID": ctx.identity.cluster_id,
    });
    if let (Some(s), Some(e)) = (status.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    set_status_in(client, ns, &name, status)
        .await
        .map_err(step("writing status"))?;
    let _ = Api::<CertificateSigningRequest>::all(client.clone())
        .delete(&csr_name(req), &DeleteParams::default())
        .await;
    tracing::info!(request = %name, %consumer, "peering request approved");
    Ok(Action::await_change())
}

/// Checks a request against its invite token (pure apart from the clock).
fn check(ctx: &Ctx, req: &PeeringRequest, token: &Secret) -> Verdict {
    let data = token.data.clone().unwrap_or_default();
    let get = |k: &str| {
        data.get(k)
            .map(|v| String::from_utf8_lossy(&v.0).into_owned())
    };
    let spec = &req.spec;
    // First: a request in a protocol this build cannot read is not judged by its fields.
    let version = spec
        .protocol_version
        .unwrap_or_else(tandem_core::protocol::unversioned);
    if let Err(e) = tandem_core::protocol::check("consumer", version) {
        return Verdict::Deny(e.to_string());
    }
    if let Some(exp) =
        get("expiration").and_then(|e| e.parse::<k8s_openapi::jiff::Timestamp>().ok())
        && exp < k8s_openapi::jiff::Timestamp::now()
    {
        return Verdict::Deny("the invite expired".into());
    }
    if let Some(user) = token.annotations().get(INVITE_USED_ANNOTATION)
        && user != &spec.cluster_id
    {
        return Verdict::Deny("the invite token was already used".into());
    }
    if spec.token_id != req.name_any() {
        return Verdict::Deny(format!(
            "spec.tokenID {:?} does not name this request",
            spec.token_id
        ));
    }
    let secret = get("token-secret").unwrap_or_default();
    if !tandem_core::invite::verify_token_proof(
        &secret,
        &spec.cluster_id,
        &spec.token_id,
        &spec.csr,
        &spec.token_proof,
    ) {
        return Verdict::Deny("spec.tokenProof does not match the invite token".into());
    }
    if let Err(e) = names::validate_cluster_id(&spec.cluster_id) {
        return Verdict::Deny(e.to_string());
    }
    if spec.cluster_id == ctx.identity.cluster_id {
        return Verdict::Deny("a cluster cannot peer with itself".into());
    }
    if let Err(e) = check_csr(&spec.csr, &spec.cluster_id) {
        return Verdict::Deny(format!("spec.csr: {e}"));
    }
    Verdict::Accept
}

/// Why a peering request's CSR is refused (x509-parser's errors borrow the input, so their
/// text is kept).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CsrError {
    #[error("not PEM: {0}")]
    NotPem(String),
    #[error("not a PKCS#10 request: {0}")]
    NotPkcs10(String),
    #[error("bad signature: {0}")]
    BadSignature(String),
    #[error(
        "subject must be CN={user}, O={group}, the group of the key the request is signed with (got CN={common_names:?}, O={organizations:?}; a consumer older than this provider files no key group: upgrade it)"
    )]
    WrongSubject {
        user: String,
        group: String,
        common_names: Vec<String>,
        organizations: Vec<String>,
    },
}

/// The CSR must be validly self-signed and ask for exactly the peer user in the group of the
/// key it is signed with ([`names::peer_key_group`]).
pub fn check_csr(pem: &str, consumer: &str) -> Result<(), CsrError> {
    use x509_parser::certification_request::X509CertificationRequest;
    use x509_parser::prelude::FromDer;
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes())
        .map_err(|e| CsrError::NotPem(e.to_string()))?;
    let (_, csr) = X509CertificationRequest::from_der(&pem.contents)
        .map_err(|e| CsrError::NotPkcs10(e.to_string()))?;
    csr.verify_signature()
        .map_err(|e| CsrError::BadSignature(e.to_string()))?;
    let subject = &csr.certification_request_info.subject;
    let cns: Vec<&str> = subject
        .iter_common_name()
        .filter_map(|a| a.as_str().ok())
        .collect();
    let orgs: Vec<&str> = subject
        .iter_organization()
        .filter_map(|a| a.as_str().ok())
        .collect();
    let user = names::peer_user(consumer);
    let group = names::peer_key_group(&crate::enroll::key_fingerprint_der(
        csr.certification_request_info.subject_pki.raw,
    ));
    if cns != [user.as_str()] || orgs != [group.as_str()] {
        return Err(CsrError::WrongSubject {
            user,
            group,
            common_names: cns.iter().map(|s| s.to_string()).collect(),
            organizations: orgs.iter().map(|s| s.to_string()).collect(),
        });
    }
    Ok(())
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
        let (grant, node_labels) = offer(ctx).await?;
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

/// What a new consumer is offered: share% of the Ready real nodes' allocatable, and the
/// region/zone labels the nodes agree on.
async fn offer(
    ctx: &Ctx,
) -> Result<
    (
        std::collections::BTreeMap<String, String>,
        std::collections::BTreeMap<String, String>,
    ),
    kube::Error,
> {
    let share = ctx
        .settings()
        .await
        .map(|s| s.share_percent)
        .unwrap_or(crate::install::DEFAULT_SHARE_PERCENT);
    let nodes = Api::<Node>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await?;
    let real: Vec<&Node> = nodes
        .items
        .iter()
        .filter(|n| {
            n.labels().get(names::NODE_TYPE_LABEL).map(String::as_str)
                != Some(names::VIRTUAL_NODE_TYPE)
        })
        .filter(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .collect();
    let allocatable: Vec<_> = real
        .iter()
        .filter_map(|n| n.status.as_ref()?.allocatable.as_ref())
        .map(|a| a.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect())
        .collect();
    let grant = tandem_core::grant::share(&allocatable, share);
    let mut labels = std::collections::BTreeMap::new();
    for key in [
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
    ] {
        let values: std::collections::BTreeSet<&String> =
            real.iter().filter_map(|n| n.labels().get(key)).collect();
        if values.len() == 1 {
            labels.insert(key.to_string(), values.into_iter().next().unwrap().clone());
        }
    }
    Ok((grant, labels))
}

pub(crate) fn csr_name(req: &PeeringRequest) -> String {
    format!("tandem-peer-{}-{}", req.spec.cluster_id, req.name_any())
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
        None => {
            let csr: CertificateSigningRequest = serde_json::from_value(json!({
                "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
                "metadata": {"name": name, "labels": {
                    names::MANAGED_BY_LABEL: names::MANAGED_BY,
                    names::ORIGIN_CLUSTER_LABEL: req.spec.cluster_id},
                    "annotations": {REQUEST_ANNOTATION: format!(
                        "{}/{}", req.namespace().unwrap_or_default(), req.name_any())}},
                "spec": {
                    "request": ByteString(req.spec.csr.as_bytes().to_vec()),
                    "signerName": crate::rbac::PEER_CSR_SIGNER,
                    "usages": ["client auth", "digital signature"],
                    // None: the signer's default (kube-controller-manager's
                    // --cluster-signing-duration, a year). The consumer renews before expiry.
                    "expirationSeconds": lifetime.map(|l| l.as_secs()),
                },
            }))
            .expect("static manifest");
            match api.create(&PostParams::default(), &csr).await {
                Ok(c) => c,
                Err(e) if client::is_conflict(&e) => api.get(&name).await?,
                Err(e) => return Err(e),
            }
        }
    };
    if let Some(cert) = client::issued_certificate(&csr) {
        return Ok(Some(String::from_utf8_lossy(&cert.0).into_owned()));
    }
    let status = csr.status.clone().unwrap_or_default();
    let approved = status
        .conditions
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "Approved");
    if !approved {
        api.patch_subresource(
            "approval",
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [{
                "type": "Approved", "status": "True", "reason": "TandemPeeringRequest",
                "message": format!("approved for peering request {}", req.name_any()),
            }]}})),
        )
        .await?;
    }
    Ok(None)
}

/// Removes requests whose consumer authenticated, and expired invites with their requests.
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
        let expired = invite.expires <= now;
        let request = requests.get_opt(&invite.token_id).await.ok().flatten();
        let authenticated = match (&request, &invite.used_by) {
            (Some(r), Some(consumer))
                if r.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Approved") =>
            {
                // The consumer publishes its network parameters with its new identity.
                super::network::consumer_published(client, consumer)
                    .await
                    .unwrap_or(false)
            }
            _ => false,
        };
        // A denied request spends its invite; the consumer had time to read why.
        let denied_long_ago = request.as_ref().is_some_and(|r| {
            r.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Denied")
                && r.metadata
                    .creation_timestamp
                    .as_ref()
                    .is_some_and(|t| t.0.as_second() + DENIED_GRACE_SECS < now)
        });
        if denied_long_ago {
            let _ = requests
                .delete(&invite.token_id, &DeleteParams::default())
                .await;
            crate::invite::remove_invite_objects(client, &invite.token_id).await?;
            continue;
        }
        if (authenticated || expired) && request.is_some() {
            let _ = requests
                .delete(&invite.token_id, &DeleteParams::default())
                .await;
        }
        if expired {
            crate::invite::remove_invite_objects(client, &invite.token_id).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CSR for `cn` in group `org`; `KEY` stands for the group of the key it is signed with.
    fn csr(cn: &str, org: &str) -> String {
        use rcgen::PublicKeyData;
        let key = rcgen::KeyPair::generate().unwrap();
        let own = names::peer_key_group(&crate::enroll::key_fingerprint_der(
            &key.subject_public_key_info(),
        ));
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        let mut dn = rcgen::DistinguishedName::new();
        dn.push(rcgen::DnType::CommonName, cn);
        dn.push(
            rcgen::DnType::OrganizationName,
            if org == "KEY" { own } else { org.to_string() },
        );
        params.distinguished_name = dn;
        params.serialize_request(&key).unwrap().pem().unwrap()
    }

    #[test]
    fn an_identity_is_bound_to_its_first_key() {
        let tenant = |key: Option<&str>| {
            let mut t = Tenant::new(
                "rome",
                serde_json::from_value(json!({"clusterID": "rome"})).unwrap(),
            );
            if let Some(k) = key {
                t.metadata.annotations =
                    Some([(names::KEY_FINGERPRINT_ANNOTATION.to_string(), k.to_string())].into());
            }
            t
        };
        assert_eq!(
            key_refusal(None, "rome", "sha256:aa"),
            None,
            "first peering"
        );
        assert_eq!(
            key_refusal(Some(&tenant(Some("sha256:aa"))), "rome", "sha256:aa"),
            None,
            "the same key again (a re-peer)"
        );
        let other = key_refusal(Some(&tenant(Some("sha256:aa"))), "rome", "sha256:bb").unwrap();
        assert!(
            other.contains("under key sha256:aa") && other.contains("request's key is sha256:bb"),
            "{other}"
        );
        let unrecorded = key_refusal(Some(&tenant(None)), "rome", "sha256:bb").unwrap();
        assert!(unrecorded.contains("no key is recorded"), "{unrecorded}");
    }

    #[test]
    fn csr_checks() {
        let good = csr("tandem:peer:rome", "KEY");
        // The group of another key: a request cannot ask for the roles bound to another key.
        let other_key = names::peer_key_group(&crate::enroll::csr_key_fingerprint(&good).unwrap());
        // Flip a byte inside the base64 body: the signature no longer verifies (or the DER breaks).
        let mut tampered = good.clone().into_bytes();
        let i = tampered.len() / 2;
        tampered[i] = if tampered[i] == b'A' { b'B' } else { b'A' };
        let tampered = String::from_utf8(tampered).unwrap();
        let cases: Vec<(&str, String, &str, Option<&str>)> = vec![
            ("valid", good.clone(), "rome", None),
            (
                "another consumer's name",
                good,
                "milan",
                Some("subject must be"),
            ),
            (
                "wrong group",
                csr("tandem:peer:rome", "system:masters"),
                "rome",
                Some("subject must be"),
            ),
            (
                "another key's group",
                csr("tandem:peer:rome", &other_key),
                "rome",
                Some("subject must be"),
            ),
            (
                "the group of an older consumer",
                csr("tandem:peer:rome", "tandem:peers"),
                "rome",
                Some("upgrade it"),
            ),
            (
                "admin name",
                csr("admin", "KEY"),
                "rome",
                Some("subject must be"),
            ),
            ("not PEM", "hello".into(), "rome", Some("not PEM")),
            ("tampered", tampered, "rome", Some("")),
        ];
        for (name, pem, consumer, want) in cases {
            match (check_csr(&pem, consumer), want) {
                (Ok(()), None) => {}
                (Err(e), Some(w)) => assert!(e.to_string().contains(w), "{name}: {e}"),
                (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }
}
