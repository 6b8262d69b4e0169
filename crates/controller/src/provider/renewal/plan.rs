//! What the provider decides of a peer identity renewal request, pure, with the clock passed
//! in: what a pass does with each request ([`next_step`]), how it [`judge`]s one by the request
//! alone and then [`judge_tenant`] by its consumer's Tenant, and the approval condition a
//! [`Judgement`] writes ([`Judgement::answer`]).

use std::time::Duration;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use tandem_api::{Tenant, names};

use crate::rbac::{PEER_CSR_SIGNER, RENEWAL_CSR_PREFIX};

/// How long a refused renewal request is kept.
pub(super) const DENIED_KEPT: Duration = Duration::from_secs(3600);

/// The longest certificate a renewal may ask for when this cluster sets no peer certificate
/// lifetime: kube-controller-manager's default signing duration (one year).
pub const DEFAULT_MAX_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);

/// What to do with a renewal request, judged from the request alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Judgement {
    /// Not a renewal request, or already decided.
    Skip,
    /// Renews the peer identity of `consumer`.
    Approve { consumer: String },
    /// Refused, for `reason` (the Denied condition's message).
    Deny { reason: String },
}

/// The approval condition a [`Judgement`] writes on the request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Answer {
    /// `Approved` or `Denied`.
    pub condition: &'static str,
    /// What the condition says.
    pub message: String,
}

impl Answer {
    /// Whether it refuses the request.
    pub(super) fn denied(&self) -> bool {
        self.condition == "Denied"
    }
}

impl Judgement {
    /// The condition it writes on the request; none for [`Judgement::Skip`].
    pub(super) fn answer(self) -> Option<Answer> {
        match self {
            Judgement::Skip => None,
            Judgement::Approve { consumer } => Some(Answer {
                condition: "Approved",
                message: format!("renews the peer identity of {consumer}"),
            }),
            Judgement::Deny { reason } => Some(Answer {
                condition: "Denied",
                message: reason,
            }),
        }
    }
}

/// What a pass does with one client-certificate request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// Not a renewal request: leave it to whoever filed it.
    Leave,
    /// Refused more than [`DENIED_KEPT`] ago (kept that long for its filer and an admin to
    /// see): delete it.
    DeleteRefused,
    /// Issued: hand the certificate back in the consumer's Tenant status, where the consumer
    /// reads it, then delete the request.
    HandBack {
        /// Whose identity it renews (from the requester's user name).
        consumer: String,
        /// The certificate, PEM.
        certificate: String,
    },
    /// Not issued: as [`judge`] says; one it would approve is then held to its consumer's
    /// Tenant ([`judge_tenant`]).
    Judge(Judgement),
}

/// What to do with `csr` at `now`.
pub(super) fn next_step(csr: &CertificateSigningRequest, now: Timestamp) -> Step {
    if !csr.name_any().starts_with(RENEWAL_CSR_PREFIX) {
        return Step::Leave;
    }
    let denied = csr
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Denied"));
    let age = csr
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| now.as_second() - t.0.as_second())
        .unwrap_or(0);
    if denied && age > DENIED_KEPT.as_secs() as i64 {
        return Step::DeleteRefused;
    }
    let issued = csr
        .status
        .as_ref()
        .and_then(|s| s.certificate.as_ref())
        .filter(|c| !c.0.is_empty());
    if let Some(certificate) = issued {
        let consumer = csr
            .spec
            .username
            .as_deref()
            .and_then(|u| u.strip_prefix("tandem:peer:"))
            .unwrap_or_default()
            .to_string();
        return Step::HandBack {
            consumer,
            certificate: String::from_utf8_lossy(&certificate.0).into_owned(),
        };
    }
    Step::Judge(judge(csr))
}

/// Judges `csr` by the request alone: approvable only when the API server says the requester
/// is a peer identity and the request names that identity and nothing more; [`judge_for`]
/// then holds an approvable one to its consumer's Tenant.
pub fn judge(csr: &CertificateSigningRequest) -> Judgement {
    let name = csr.name_any();
    if !name.starts_with(RENEWAL_CSR_PREFIX) || csr.spec.signer_name != PEER_CSR_SIGNER {
        return Judgement::Skip;
    }
    let decided = csr
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| !c.is_empty());
    if decided {
        return Judgement::Skip;
    }
    let username = csr.spec.username.clone().unwrap_or_default();
    let Some(consumer) = username.strip_prefix("tandem:peer:") else {
        return Judgement::Deny {
            reason: format!("filed by {username:?}, not a peer identity"),
        };
    };
    if username != names::peer_user(consumer) {
        return Judgement::Deny {
            reason: format!("filed by {username:?}, not a peer identity"),
        };
    }
    let pem = String::from_utf8_lossy(&csr.spec.request.0);
    if let Err(e) = crate::provider::peering_request::check_csr(&pem, consumer) {
        return Judgement::Deny {
            reason: format!("the request does not name the requester's own identity: {e}"),
        };
    }
    Judgement::Approve {
        consumer: consumer.to_string(),
    }
}

/// Holds a request [`judge`] approves for `consumer` to that consumer's Tenant (`tenant`, as
/// read): only a consumer this cluster serves, and not one being unpeered, has it renewed,
/// as [`judge_for`] says.
pub(super) fn judge_tenant(
    csr: &CertificateSigningRequest,
    consumer: &str,
    tenant: Option<&Tenant>,
    max_lifetime: Duration,
) -> Judgement {
    match tenant {
        Some(t) if t.metadata.deletion_timestamp.is_none() => {
            let recorded = t.annotations().get(names::KEY_FINGERPRINT_ANNOTATION);
            judge_for(csr, consumer, recorded.map(String::as_str), max_lifetime)
        }
        _ => Judgement::Deny {
            reason: format!("{consumer} is not a consumer of this cluster"),
        },
    }
}

/// Holds a request [`judge`] would approve to what the consumer's Tenant records: the key its
/// identity is bound to (a renewal never moves an identity to another key, which a stolen
/// certificate could otherwise do for good) and, at most, the lifetime this cluster issues.
pub fn judge_for(
    csr: &CertificateSigningRequest,
    consumer: &str,
    recorded_key: Option<&str>,
    max_lifetime: Duration,
) -> Judgement {
    let pem = String::from_utf8_lossy(&csr.spec.request.0);
    let key = crate::enroll::csr_key_fingerprint(&pem).unwrap_or_default();
    match recorded_key {
        Some(recorded) if recorded == key => {}
        Some(recorded) => {
            return Judgement::Deny {
                reason: format!(
                    "the request is for key {key}, but the identity of {consumer} is bound to key {recorded}"
                ),
            };
        }
        None => {
            return Judgement::Deny {
                reason: format!(
                    "no key is recorded for {consumer} (Tenant {}/{consumer}, annotation {}): its identity is renewed only for the key on record",
                    names::tenant_namespace(consumer),
                    names::KEY_FINGERPRINT_ANNOTATION
                ),
            };
        }
    }
    let asked = csr.spec.expiration_seconds.map(|s| s.max(0) as u64);
    if asked.is_none_or(|s| s > max_lifetime.as_secs()) {
        return Judgement::Deny {
            reason: format!(
                "the request asks for a certificate of {}, more than this cluster issues ({}s)",
                asked.map_or("the signer's longest lifetime".to_string(), |s| format!(
                    "{s}s"
                )),
                max_lifetime.as_secs()
            ),
        };
    }
    Judgement::Approve {
        consumer: consumer.to_string(),
    }
}

#[cfg(test)]
mod tests;
