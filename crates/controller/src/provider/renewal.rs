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

/// Judges `csr` (see the module documentation).
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
                // Only a consumer this cluster serves.
                let tenants: Api<Tenant> =
                    Api::namespaced(ctx.client.clone(), &names::tenant_namespace(&consumer));
                if tenants.get_opt(&consumer).await?.is_some() {
                    (
                        "Approved",
                        format!("renews the peer identity of {consumer}"),
                    )
                } else {
                    (
                        "Denied",
                        format!("{consumer} is not a consumer of this cluster"),
                    )
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
