//! Provider side of peer identity renewal: a consumer files a CertificateSigningRequest for
//! its own peer identity (with its cluster key, through the identity it is renewing) before
//! its certificate expires; this controller approves it only when the API server says the
//! requester is that very identity and the request names it and nothing more, then hands the
//! certificate back in the consumer's Tenant status and removes the request.

mod plan;

use std::time::Duration;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;
use tandem_api::{Tenant, names};

use crate::context::Ctx;
use crate::rbac::PEER_CSR_SIGNER;
use plan::Step;
pub use plan::{DEFAULT_MAX_LIFETIME, Judgement, judge, judge_for};

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

/// Lists the client-certificate requests and does with each what the plan says: deletes a
/// refusal kept long enough, hands an issued certificate back, or writes the answer.
async fn pass(ctx: &Ctx) -> Result<(), kube::Error> {
    let csrs: Api<CertificateSigningRequest> = Api::all(ctx.client.clone());
    let client_certificates =
        ListParams::default().fields(&format!("spec.signerName={PEER_CSR_SIGNER}"));
    let now = k8s_openapi::jiff::Timestamp::now();
    for csr in csrs.list(&client_certificates).await?.items {
        let name = csr.name_any();
        let judgement = match plan::next_step(&csr, now) {
            Step::Leave => continue,
            Step::DeleteRefused => {
                csrs.delete(&name, &DeleteParams::default()).await?;
                continue;
            }
            Step::HandBack {
                consumer,
                certificate,
            } => {
                let tenants: Api<Tenant> =
                    Api::namespaced(ctx.client.clone(), &names::tenant_namespace(&consumer));
                tenants
                    .patch_status(
                        &consumer,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"status": {"renewedIdentity": {
                            "request": name,
                            "certificate": certificate,
                        }}})),
                    )
                    .await?;
                csrs.delete(&name, &DeleteParams::default()).await?;
                tracing::info!(consumer = %consumer, request = %name, "peer identity renewed");
                continue;
            }
            Step::Judge(Judgement::Approve { consumer }) => {
                // Only a consumer this cluster serves, under the key on record.
                let tenants: Api<Tenant> =
                    Api::namespaced(ctx.client.clone(), &names::tenant_namespace(&consumer));
                let tenant = tenants.get_opt(&consumer).await?;
                let max = ctx
                    .options
                    .peer_certificate_lifetime
                    .unwrap_or(DEFAULT_MAX_LIFETIME);
                plan::judge_tenant(&csr, &consumer, tenant.as_ref(), max)
            }
            Step::Judge(judgement) => judgement,
        };
        let Some(answer) = judgement.answer() else {
            continue;
        };
        if answer.denied() {
            tracing::warn!(request = %name, "peer identity renewal refused: {}", answer.message);
        }
        csrs.patch_subresource(
            "approval",
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [{
                "type": answer.condition, "status": "True", "reason": "TandemIdentityRenewal",
                "message": answer.message,
            }]}})),
        )
        .await?;
    }
    Ok(())
}
