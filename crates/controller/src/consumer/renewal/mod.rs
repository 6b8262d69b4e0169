//! Consumer side of peer identity renewal: once a share of its peer certificate's lifetime
//! has passed (`identity_renewal_after`), the consumer files a CertificateSigningRequest for
//! the same identity with its cluster key, through that identity, on the provider; the
//! provider hands the certificate back in the Tenant's status, and the consumer swaps it into
//! the identity Secret. The old certificate stays valid until it expires, so the link — and
//! the virtual node — never go without one: the Secret's change only rebuilds the client.

mod plan;

use std::collections::HashMap;

use base64::Engine as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tandem_api::kubeconfig::Credentials;
use tandem_api::{Peering, Tenant, names};

use crate::consumer::link::{IDENTITY_KUBECONFIG_KEY, identity_client};
use crate::context::Ctx;
use crate::rbac::PEER_CSR_SIGNER;
use plan::{Filed, Step};
pub use plan::{client_certificate, issued_lifetime, renewal_due, validity};

/// Checks every Peering's certificate every `identity_renewal_check`.
pub async fn run(ctx: Ctx) {
    // The request filed for each provider and not answered yet.
    let mut pending: HashMap<String, Filed> = HashMap::new();
    loop {
        tokio::time::sleep(ctx.options.identity_renewal_check).await;
        let peerings = match Api::<Peering>::all(ctx.client.clone())
            .list(&ListParams::default())
            .await
        {
            Ok(list) => list.items,
            Err(e) => {
                tracing::debug!("identity renewal: listing Peerings: {e}");
                continue;
            }
        };
        for peering in peerings {
            if let Err(e) = renew(&ctx, &peering, &mut pending).await {
                tracing::warn!(provider = %peering.name_any(), "renewing the peer identity: {e}");
            }
        }
    }
}

/// Reads the identity Secret of `peering` and, when the plan says so, the provider's answer;
/// then swaps the renewed certificate in, forgets the request, or files one.
async fn renew(
    ctx: &Ctx,
    peering: &Peering,
    pending: &mut HashMap<String, Filed>,
) -> Result<(), kube::Error> {
    let Ok((secret_name, remote_tenant)) = plan::identity(peering) else {
        return Ok(());
    };
    let provider = peering.name_any();
    let secrets: Api<Secret> =
        Api::namespaced(ctx.client.clone(), &names::tenant_namespace(&provider));
    let Some(secret) = secrets.get_opt(secret_name).await? else {
        return Ok(());
    };
    let kubeconfig = secret
        .data
        .as_ref()
        .and_then(|d| d.get(IDENTITY_KUBECONFIG_KEY))
        .map(|v| String::from_utf8_lossy(&v.0).into_owned())
        .unwrap_or_default();
    let Ok(held) = plan::held(&kubeconfig) else {
        return Ok(());
    };
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let filed = pending.get(&provider).cloned();
    if plan::due(
        &held,
        filed.as_ref(),
        now,
        ctx.options.identity_renewal_after,
    )
    .is_err()
    {
        return Ok(());
    }
    let Ok((client, _)) = identity_client(ctx, &provider, secret_name).await else {
        return Ok(());
    };
    let step = match &filed {
        Some(filed) => {
            // Answered?
            let tenant = Api::<Tenant>::namespaced(client.clone(), remote_tenant)
                .get_opt(&ctx.identity.cluster_id)
                .await?;
            let renewed = tenant.and_then(|t| t.status?.renewed_identity);
            match plan::answered(
                filed,
                renewed.as_ref(),
                &held,
                &ctx.identity.public_key_pem,
                &ctx.identity.cluster_id,
                now,
            ) {
                Ok(step) => step,
                Err(_) => return Ok(()),
            }
        }
        None => plan::file(&ctx.identity.cluster_id, &held, now),
    };
    match step {
        Step::Swap { certificate } => {
            let identity_kc = crate::consumer::peering::kubeconfig(
                &peering.spec.endpoint,
                &peering.spec.ca_data,
                Credentials::ClientCertificate {
                    cert_pem: &certificate,
                    key_pem: &ctx.identity.private_key_pem,
                },
            );
            secrets
                .patch(
                    secret_name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({
                        "metadata": {"resourceVersion": secret.resource_version()},
                        "data": {IDENTITY_KUBECONFIG_KEY:
                            base64::engine::general_purpose::STANDARD.encode(identity_kc)},
                    })),
                )
                .await?;
            tracing::info!(provider = %provider, "peer identity renewed");
            pending.remove(&provider);
        }
        Step::Discard(_) => {
            pending.remove(&provider);
        }
        Step::File {
            request,
            expiration_seconds,
        } => {
            let csr_pem = crate::consumer::peering::make_csr(ctx).map_err(|e| {
                kube::Error::Service(format!("making the renewal request: {e}").into())
            })?;
            let csr: CertificateSigningRequest = serde_json::from_value(json!({
                "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
                "metadata": {"name": request},
                "spec": {
                    "request": ByteString(csr_pem.into_bytes()),
                    "signerName": PEER_CSR_SIGNER,
                    "usages": ["client auth", "digital signature"],
                    "expirationSeconds": expiration_seconds,
                },
            }))
            .expect("static manifest");
            Api::<CertificateSigningRequest>::all(client)
                .create(&PostParams::default(), &csr)
                .await?;
            tracing::info!(provider = %provider, request = %request, "peer identity renewal requested");
            pending.insert(provider, Filed { request, at: now });
        }
    }
    Ok(())
}
