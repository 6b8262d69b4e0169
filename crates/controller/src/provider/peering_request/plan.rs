//! What the provider decides about a peering request, pure, with the clock passed in: whether
//! it stands against its invite token ([`check`]) and against the key its cluster ID is bound
//! to ([`key_refusal`]), whether its CSR asks for exactly the peer identity ([`check_csr`]),
//! how far its CSR got ([`csr_progress`]), what the approval says ([`approved_status`]), what a
//! new consumer is offered ([`offer`]) and what the invite janitor removes ([`cleanup`]). The
//! parent module reads the objects and sends what these decide.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use serde_json::json;
use tandem_api::names::ClusterIdError;
use tandem_api::{PeeringRequest, Tenant, client, names};
use tandem_core::protocol::Unsupported;

use crate::credentials::INVITE_USED_ANNOTATION;

/// How long a denied request (and its spent invite) stays for the consumer to read the reason.
pub(crate) const DENIED_GRACE_SECS: i64 = 30;

/// Annotation on a peering request's CSR naming the request (`namespace/name`).
pub(super) const REQUEST_ANNOTATION: &str = "tandem.dev/peering-request";

/// The outcome of checking a request against its invite.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// No invite token is named like the request: it is removed, since only that token may
    /// read the request back and nobody could read a denial.
    NoInvite,
    /// Refused, with the reason the consumer reads in the request's status.
    Deny(Denial),
    /// It stands: the invite is spent, the tenant made and the identity signed.
    Accept,
}

/// Why a request is denied; its text is the `message` of the Denied status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Denial {
    /// The consumer speaks a protocol version this build cannot (judged before any field).
    Protocol(Unsupported),
    /// The invite's expiration passed.
    Expired,
    /// Another consumer spent the invite.
    TokenUsed,
    /// `spec.tokenID` is not the request's name (the name is what the token may read).
    TokenIdMismatch(String),
    /// `spec.tokenProof` does not prove the filer holds the whole token.
    BadProof,
    /// `spec.clusterID` is not a cluster ID.
    ClusterId(ClusterIdError),
    /// The consumer claims this cluster's own ID.
    SelfPeering,
    /// The CSR does not ask for exactly the peer identity of its key.
    Csr(CsrError),
    /// The cluster ID's Tenant records another key: cluster IDs are self-asserted.
    OtherKey {
        consumer: String,
        recorded: String,
        fingerprint: String,
    },
    /// The cluster ID's Tenant predates recorded keys: its key is an admin's to record.
    NoKeyRecorded {
        consumer: String,
        fingerprint: String,
    },
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let annotation = names::KEY_FINGERPRINT_ANNOTATION;
        match self {
            Denial::Protocol(e) => write!(f, "{e}"),
            Denial::Expired => f.write_str("the invite expired"),
            Denial::TokenUsed => f.write_str("the invite token was already used"),
            Denial::TokenIdMismatch(token_id) => {
                write!(f, "spec.tokenID {token_id:?} does not name this request")
            }
            Denial::BadProof => f.write_str("spec.tokenProof does not match the invite token"),
            Denial::ClusterId(e) => write!(f, "{e}"),
            Denial::SelfPeering => f.write_str("a cluster cannot peer with itself"),
            Denial::Csr(e) => write!(f, "spec.csr: {e}"),
            Denial::OtherKey {
                consumer,
                recorded,
                fingerprint,
            } => {
                let tenant_ns = names::tenant_namespace(consumer);
                write!(
                    f,
                    "cluster ID {consumer} already peers with this cluster under key {recorded} (Tenant {tenant_ns}/{consumer}); this request's key is {fingerprint}. Cluster IDs are self-asserted, so it is refused; if the consumer really changed its key, its identity is re-keyed by this cluster's admin: `kubectl -n {tenant_ns} annotate tenant {consumer} --overwrite {annotation}={fingerprint}`"
                )
            }
            Denial::NoKeyRecorded {
                consumer,
                fingerprint,
            } => {
                let tenant_ns = names::tenant_namespace(consumer);
                write!(
                    f,
                    "cluster ID {consumer} already peers with this cluster (Tenant {tenant_ns}/{consumer}) and no key is recorded for it; this request's key is {fingerprint}. The key is an admin's to record: `kubectl -n {tenant_ns} annotate tenant {consumer} {annotation}={fingerprint}`"
                )
            }
        }
    }
}

/// The phase of a request's answer, if it has one.
pub(super) fn phase(req: &PeeringRequest) -> Option<&str> {
    req.status.as_ref().and_then(|s| s.phase.as_deref())
}

/// Whether the request was answered (Approved or Denied): it is never judged again.
pub(super) fn answered(req: &PeeringRequest) -> bool {
    matches!(phase(req), Some("Approved" | "Denied"))
}

/// Checks a request against the invite token named like it (`token`), for the provider
/// `provider` (its cluster ID), at `now`.
pub(super) fn check(
    req: &PeeringRequest,
    token: Option<&Secret>,
    provider: &str,
    now: Timestamp,
) -> Verdict {
    let Some(token) = token else {
        return Verdict::NoInvite;
    };
    match denial(req, token, provider, now) {
        Some(why) => Verdict::Deny(why),
        None => Verdict::Accept,
    }
}

fn denial(req: &PeeringRequest, token: &Secret, provider: &str, now: Timestamp) -> Option<Denial> {
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
        return Some(Denial::Protocol(e));
    }
    if let Some(exp) = get("expiration").and_then(|e| e.parse::<Timestamp>().ok())
        && exp < now
    {
        return Some(Denial::Expired);
    }
    if let Some(user) = token.annotations().get(INVITE_USED_ANNOTATION)
        && user != &spec.cluster_id
    {
        return Some(Denial::TokenUsed);
    }
    if spec.token_id != req.name_any() {
        return Some(Denial::TokenIdMismatch(spec.token_id.clone()));
    }
    let secret = get("token-secret").unwrap_or_default();
    if !tandem_core::invite::verify_token_proof(
        &secret,
        &spec.cluster_id,
        &spec.token_id,
        &spec.csr,
        &spec.token_proof,
    ) {
        return Some(Denial::BadProof);
    }
    if let Err(e) = names::validate_cluster_id(&spec.cluster_id) {
        return Some(Denial::ClusterId(e));
    }
    if spec.cluster_id == provider {
        return Some(Denial::SelfPeering);
    }
    check_csr(&spec.csr, &spec.cluster_id)
        .err()
        .map(Denial::Csr)
}

/// Why a request for `consumer`'s identity with the key `fingerprint` is refused, if it is: a
/// Tenant of that cluster ID records another key, or none (a Tenant made before keys were
/// recorded: its key cannot be learned from a request, which an impostor could race).
pub(super) fn key_refusal(
    tenant: Option<&Tenant>,
    consumer: &str,
    fingerprint: &str,
) -> Option<Denial> {
    let tenant = tenant?;
    match tenant.annotations().get(names::KEY_FINGERPRINT_ANNOTATION) {
        Some(key) if key == fingerprint => None,
        Some(key) => Some(Denial::OtherKey {
            consumer: consumer.to_string(),
            recorded: key.clone(),
            fingerprint: fingerprint.to_string(),
        }),
        None => Some(Denial::NoKeyRecorded {
            consumer: consumer.to_string(),
            fingerprint: fingerprint.to_string(),
        }),
    }
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
    let group = names::peer_key_group(&crate::credentials::key_fingerprint_der(
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

/// The name of a request's CSR: one per consumer and request.
pub(crate) fn csr_name(req: &PeeringRequest) -> String {
    format!("tandem-peer-{}-{}", req.spec.cluster_id, req.name_any())
}

/// Whether a CSR change wakes the requests of namespace `ns`: the CSR of one of them, signed.
pub(super) fn wakes(csr: &CertificateSigningRequest, ns: &str) -> bool {
    let mine = csr
        .annotations()
        .get(REQUEST_ANNOTATION)
        .and_then(|r| r.split_once('/'))
        .is_some_and(|(request_ns, _)| request_ns == ns);
    mine && client::issued_certificate(csr).is_some()
}

/// The CSR filed for a request, for the peer identity it asks; `lifetime` None leaves it to
/// the signer's default.
pub(super) fn csr_manifest(
    req: &PeeringRequest,
    lifetime: Option<Duration>,
) -> CertificateSigningRequest {
    serde_json::from_value(json!({
        "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"name": csr_name(req), "labels": {
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
    .expect("static manifest")
}

/// How far a request's CSR got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum CsrProgress {
    /// The signer issued the certificate (PEM).
    Issued(String),
    /// Not approved yet: approve it (the request was checked).
    Approve,
    /// Approved, waiting for the signer.
    AwaitSigner,
}

/// How far `csr` got.
pub(super) fn csr_progress(csr: &CertificateSigningRequest) -> CsrProgress {
    if let Some(cert) = client::issued_certificate(csr) {
        return CsrProgress::Issued(String::from_utf8_lossy(&cert.0).into_owned());
    }
    let approved = csr
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Approved"));
    if approved {
        CsrProgress::AwaitSigner
    } else {
        CsrProgress::Approve
    }
}

/// The approval patch of a request's CSR, naming the request.
pub(super) fn approval(req: &PeeringRequest) -> serde_json::Value {
    json!({"status": {"conditions": [{
        "type": "Approved", "status": "True", "reason": "TandemPeeringRequest",
        "message": format!("approved for peering request {}", req.name_any()),
    }]}})
}

/// The status of an approved request of `consumer`: its certificate, where it works and who
/// answered, with the caller's `extra` fields.
pub(super) fn approved_status(
    consumer: &str,
    cert: &str,
    provider: &str,
    extra: &serde_json::Value,
) -> serde_json::Value {
    let mut status = json!({
        "phase": "Approved",
        "message": format!("peer identity {} issued", names::peer_user(consumer)),
        "certificate": cert,
        "tenantNamespace": names::tenant_namespace(consumer),
        "providerClusterID": provider,
    });
    if let (Some(s), Some(e)) = (status.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    status
}

/// What a new consumer is offered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Offer {
    /// `share`% of the Ready real nodes' allocatable.
    pub grant: BTreeMap<String, String>,
    /// The region and zone labels those nodes agree on.
    pub node_labels: BTreeMap<String, String>,
}

/// What a new consumer is offered out of `nodes`, `share` percent.
pub(super) fn offer(nodes: &[Node], share: u32) -> Offer {
    let real: Vec<&Node> = nodes
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
    let mut node_labels = BTreeMap::new();
    for key in [
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
    ] {
        let values: BTreeSet<&String> = real.iter().filter_map(|n| n.labels().get(key)).collect();
        if let [value] = values.into_iter().collect::<Vec<_>>()[..] {
            node_labels.insert(key.to_string(), value.clone());
        }
    }
    Offer { grant, node_labels }
}

/// The consumer whose authentication the janitor asks about, if any: the one that spent the
/// invite (`used_by`) of an approved request.
pub(super) fn to_authenticate<'a>(
    request: Option<&PeeringRequest>,
    used_by: Option<&'a str>,
) -> Option<&'a str> {
    used_by.filter(|_| request.is_some_and(|r| phase(r) == Some("Approved")))
}

/// What the janitor removes of an invite and its request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Cleanup {
    /// Denied more than [`DENIED_GRACE_SECS`] ago (the consumer had time to read why): the
    /// request and the spent invite.
    RemoveDenied,
    /// The invite expired: it goes, with its request if there is one.
    RemoveExpired { request: bool },
    /// The consumer authenticated with its new identity: its request goes; the spent invite
    /// stays until it expires.
    RemoveAuthenticated,
    /// Nothing yet.
    Keep,
}

impl Cleanup {
    /// Whether the request is deleted.
    pub(super) fn removes_request(self) -> bool {
        match self {
            Cleanup::RemoveDenied | Cleanup::RemoveAuthenticated => true,
            Cleanup::RemoveExpired { request } => request,
            Cleanup::Keep => false,
        }
    }

    /// Whether the invite's objects (token, Role, RoleBinding) are removed, after the request.
    pub(super) fn removes_invite(self) -> bool {
        matches!(self, Cleanup::RemoveDenied | Cleanup::RemoveExpired { .. })
    }
}

/// What becomes of an invite expiring at `expires` (unix seconds) and its `request`;
/// `authenticated` tells whether its consumer published with its new identity.
pub(super) fn cleanup(
    request: Option<&PeeringRequest>,
    expires: i64,
    authenticated: bool,
    now: i64,
) -> Cleanup {
    let denied_long_ago = request.is_some_and(|r| {
        phase(r) == Some("Denied")
            && r.metadata
                .creation_timestamp
                .as_ref()
                .is_some_and(|t| t.0.as_second() + DENIED_GRACE_SECS < now)
    });
    if denied_long_ago {
        Cleanup::RemoveDenied
    } else if expires <= now {
        Cleanup::RemoveExpired {
            request: request.is_some(),
        }
    } else if authenticated && request.is_some() {
        Cleanup::RemoveAuthenticated
    } else {
        Cleanup::Keep
    }
}

#[cfg(test)]
mod tests;
