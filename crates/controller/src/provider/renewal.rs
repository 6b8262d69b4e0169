//! Provider side of peer identity renewal: a consumer files a CertificateSigningRequest for
//! its own peer identity (with its cluster key, through the identity it is renewing) before
//! its certificate expires; this controller approves it only when the API server says the
//! requester is that very identity and the request names it and nothing more, then hands the
//! certificate back in the consumer's Tenant status and removes the request.

use std::time::Duration;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;
use tandem_api::{Tenant, names};

use crate::context::Ctx;
use crate::rbac::{PEER_CSR_SIGNER, RENEWAL_CSR_PREFIX};

/// How long a refused renewal request is kept.
const DENIED_KEPT: Duration = Duration::from_secs(3600);

/// Looks for renewal requests every 2 s.
pub async fn run(ctx: Ctx) {
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    loop {
        tick.tick().await;
        if let Err(e) = pass(&ctx).await {
            tracing::warn!("peer identity renewal: {e}");
        }
    }
}

/// What to do with a renewal request, judged from the request alone.
#[derive(Debug, PartialEq)]
pub enum Judgement {
    /// Not a renewal request, or already decided.
    Skip,
    Approve {
        consumer: String,
    },
    Deny {
        reason: String,
    },
}

/// The longest certificate a renewal may ask for when this cluster sets no peer certificate
/// lifetime: kube-controller-manager's default signing duration (one year).
pub const DEFAULT_MAX_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);

/// Judges `csr` (see the module documentation) by the request alone; [`judge_for`] then
/// holds an approvable one to its consumer's Tenant.
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

async fn pass(ctx: &Ctx) -> Result<(), kube::Error> {
    let csrs: Api<CertificateSigningRequest> = Api::all(ctx.client.clone());
    let client_certificates =
        ListParams::default().fields(&format!("spec.signerName={PEER_CSR_SIGNER}"));
    let now = k8s_openapi::jiff::Timestamp::now();
    for csr in csrs.list(&client_certificates).await?.items {
        let name = csr.name_any();
        if !name.starts_with(RENEWAL_CSR_PREFIX) {
            continue;
        }
        // A refused request stays an hour for its filer (and an admin) to see, then goes.
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
            csrs.delete(&name, &DeleteParams::default()).await?;
            continue;
        }
        let consumer = csr
            .spec
            .username
            .as_deref()
            .and_then(|u| u.strip_prefix("tandem:peer:"))
            .unwrap_or_default()
            .to_string();
        let issued = csr
            .status
            .as_ref()
            .and_then(|s| s.certificate.as_ref())
            .filter(|c| !c.0.is_empty());
        if let Some(certificate) = issued {
            // Handed back where the consumer reads it, then the request goes.
            let tenants: Api<Tenant> =
                Api::namespaced(ctx.client.clone(), &names::tenant_namespace(&consumer));
            tenants
                .patch_status(
                    &consumer,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"renewedIdentity": {
                        "request": name,
                        "certificate": String::from_utf8_lossy(&certificate.0),
                    }}})),
                )
                .await?;
            csrs.delete(&name, &DeleteParams::default()).await?;
            tracing::info!(consumer = %consumer, request = %name, "peer identity renewed");
            continue;
        }
        let (condition, message) = match judge(&csr) {
            Judgement::Skip => continue,
            Judgement::Approve { consumer } => {
                // Only a consumer this cluster serves, under the key on record.
                let tenants: Api<Tenant> =
                    Api::namespaced(ctx.client.clone(), &names::tenant_namespace(&consumer));
                match tenants.get_opt(&consumer).await? {
                    Some(t) if t.metadata.deletion_timestamp.is_none() => {
                        let max = ctx
                            .options
                            .peer_certificate_lifetime
                            .unwrap_or(DEFAULT_MAX_LIFETIME);
                        let recorded = t.annotations().get(names::KEY_FINGERPRINT_ANNOTATION);
                        match judge_for(&csr, &consumer, recorded.map(String::as_str), max) {
                            Judgement::Deny { reason } => ("Denied", reason),
                            _ => (
                                "Approved",
                                format!("renews the peer identity of {consumer}"),
                            ),
                        }
                    }
                    _ => (
                        "Denied",
                        format!("{consumer} is not a consumer of this cluster"),
                    ),
                }
            }
            Judgement::Deny { reason } => ("Denied", reason),
        };
        if condition == "Denied" {
            tracing::warn!(request = %name, "peer identity renewal refused: {message}");
        }
        csrs.patch_subresource(
            "approval",
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [{
                "type": condition, "status": "True", "reason": "TandemIdentityRenewal",
                "message": message,
            }]}})),
        )
        .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A renewal request of `consumer` made with `key`, asking for `seconds`.
    fn request(
        consumer: &str,
        key: &rcgen::KeyPair,
        seconds: Option<i32>,
    ) -> CertificateSigningRequest {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        let mut dn = rcgen::DistinguishedName::new();
        dn.push(rcgen::DnType::CommonName, names::peer_user(consumer));
        dn.push(
            rcgen::DnType::OrganizationName,
            names::peer_key_group(&crate::enroll::key_fingerprint_der(
                &rcgen::PublicKeyData::subject_public_key_info(key),
            )),
        );
        params.distinguished_name = dn;
        let pem = params.serialize_request(key).unwrap().pem().unwrap();
        serde_json::from_value(json!({
            "metadata": {"name": format!("{RENEWAL_CSR_PREFIX}{consumer}-1")},
            "spec": {"request": k8s_openapi::ByteString(pem.into_bytes()), "signerName": PEER_CSR_SIGNER,
                     "usages": ["client auth"], "username": names::peer_user(consumer),
                     "expirationSeconds": seconds},
        }))
        .unwrap()
    }

    #[test]
    fn a_renewal_keeps_the_key_on_record_and_the_lifetime_issued() {
        let key = rcgen::KeyPair::generate().unwrap();
        let other = rcgen::KeyPair::generate().unwrap();
        let recorded = crate::enroll::key_fingerprint_der(
            &rcgen::PublicKeyData::subject_public_key_info(&key),
        );
        let day = Duration::from_secs(86400);
        let approve = |j: Judgement| matches!(j, Judgement::Approve { .. });
        let reason = |j: Judgement| match j {
            Judgement::Deny { reason } => reason,
            other => panic!("{other:?}"),
        };
        let ok = request("rome", &key, Some(3600));
        assert!(approve(judge(&ok)));
        assert!(approve(judge_for(&ok, "rome", Some(&recorded), day)));
        let rekeyed = request("rome", &other, Some(3600));
        assert!(
            approve(judge(&rekeyed)),
            "well-formed: only the Tenant tells"
        );
        let why = reason(judge_for(&rekeyed, "rome", Some(&recorded), day));
        assert!(
            why.contains("bound to key") && why.contains(&recorded),
            "{why}"
        );
        let why = reason(judge_for(&ok, "rome", None, day));
        assert!(why.contains("no key is recorded"), "{why}");
        let why = reason(judge_for(
            &request("rome", &key, Some(2 * 86400)),
            "rome",
            Some(&recorded),
            day,
        ));
        assert!(why.contains("172800s") && why.contains("86400s"), "{why}");
        let why = reason(judge_for(
            &request("rome", &key, None),
            "rome",
            Some(&recorded),
            day,
        ));
        assert!(why.contains("longest lifetime"), "{why}");
    }
}
