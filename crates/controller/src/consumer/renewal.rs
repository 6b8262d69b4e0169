//! Consumer side of peer identity renewal: once a share of its peer certificate's lifetime
//! has passed (`identity_renewal_after`), the consumer files a CertificateSigningRequest for
//! the same identity with its cluster key, through that identity, on the provider; the
//! provider hands the certificate back in the Tenant's status, and the consumer swaps it into
//! the identity Secret. The old certificate stays valid until it expires, so the link — and
//! the virtual node — never go without one: the Secret's change only rebuilds the client.

use std::collections::HashMap;
use std::time::Duration;

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
use crate::rbac::{PEER_CSR_SIGNER, RENEWAL_CSR_PREFIX};

/// A request unanswered for this long is filed again (as is one a restarted controller no
/// longer remembers: the provider keeps only the latest answer).
const RETRY_AFTER: Duration = Duration::from_secs(120);

/// Checks every Peering's certificate every `identity_renewal_check`.
pub async fn run(ctx: Ctx) {
    // The request filed for each provider and not answered yet: (name, when filed).
    let mut pending: HashMap<String, (String, i64)> = HashMap::new();
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

/// The validity of a PEM certificate, in Unix seconds.
pub fn validity(cert_pem: &str) -> Option<(i64, i64)> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes()).ok()?;
    let cert = pem.parse_x509().ok()?;
    let v = cert.validity();
    Some((v.not_before.timestamp(), v.not_after.timestamp()))
}

/// The client certificate (PEM) of a kubeconfig's first user.
pub fn client_certificate(kubeconfig: &str) -> Option<String> {
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig).ok()?;
    let data = kc
        .auth_infos
        .first()?
        .auth_info
        .as_ref()?
        .client_certificate_data
        .clone()?;
    let pem = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .ok()?;
    String::from_utf8(pem).ok()
}

/// kube's signers backdate a certificate's notBefore by 5 minutes (for clock skew).
const SIGNER_BACKDATE: i64 = 300;

/// The lifetime a certificate valid from `not_before` to `not_after` was issued for: what a
/// renewal asks for again (kube's shortest is 600 s).
pub fn issued_lifetime(not_before: i64, not_after: i64) -> i64 {
    let seen = not_after - not_before;
    if seen >= 600 + SIGNER_BACKDATE {
        seen - SIGNER_BACKDATE
    } else {
        seen.max(600)
    }
}

/// When (Unix seconds) such a certificate is due for renewal: once the share `after` of its
/// issued lifetime has passed.
pub fn renewal_due(not_before: i64, not_after: i64, after: f64) -> i64 {
    let lifetime = issued_lifetime(not_before, not_after) as f64;
    not_after - (lifetime * (1.0 - after.clamp(0.0, 1.0))).round() as i64
}

async fn renew(
    ctx: &Ctx,
    peering: &Peering,
    pending: &mut HashMap<String, (String, i64)>,
) -> Result<(), kube::Error> {
    let Some(status) = &peering.status else {
        return Ok(());
    };
    let (Some(secret_name), Some(remote_tenant)) =
        (&status.identity_secret, &status.remote_tenant_namespace)
    else {
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
    let Some(cert) = client_certificate(&kubeconfig) else {
        return Ok(());
    };
    let Some((not_before, not_after)) = validity(&cert) else {
        return Ok(());
    };
    // A certificate issued before peer certificates carried their key's group is renewed at
    // once: the provider binds this identity's roles to that group.
    let keyless = crate::credentials::certificate_key(&cert).is_some_and(|c| {
        !c.groups
            .iter()
            .any(|g| g.starts_with(names::PEER_KEY_GROUP_PREFIX))
    });
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let filed = pending.get(&provider).cloned();
    if filed.is_none()
        && !keyless
        && now < renewal_due(not_before, not_after, ctx.options.identity_renewal_after)
    {
        return Ok(());
    }
    let Ok((client, _)) = identity_client(ctx, &provider, secret_name).await else {
        return Ok(());
    };
    if let Some((request, filed_at)) = &filed {
        // Answered?
        let tenant = Api::<Tenant>::namespaced(client.clone(), remote_tenant)
            .get_opt(&ctx.identity.cluster_id)
            .await?;
        let renewed = tenant
            .and_then(|t| t.status?.renewed_identity)
            .filter(|r| &r.request == request);
        if let Some(renewed) = renewed {
            let newer = validity(&renewed.certificate).is_some_and(|(_, end)| end > not_after);
            if newer && same_key(&renewed.certificate, &ctx.identity.public_key_pem) {
                let identity_kc = crate::consumer::peering::kubeconfig(
                    &peering.spec.endpoint,
                    &peering.spec.ca_data,
                    Credentials::ClientCertificate {
                        cert_pem: &renewed.certificate,
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
            }
            pending.remove(&provider);
            return Ok(());
        }
        if now - filed_at < RETRY_AFTER.as_secs() as i64 {
            return Ok(());
        }
    }
    // File a request for the same identity, as long-lived as the current certificate.
    let request = format!("{RENEWAL_CSR_PREFIX}{}-{now}", ctx.identity.cluster_id);
    let csr_pem = crate::consumer::peering::make_csr(ctx)
        .map_err(|e| kube::Error::Service(format!("making the renewal request: {e}").into()))?;
    let csr: CertificateSigningRequest = serde_json::from_value(json!({
        "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"name": request},
        "spec": {
            "request": ByteString(csr_pem.into_bytes()),
            "signerName": PEER_CSR_SIGNER,
            "usages": ["client auth", "digital signature"],
            "expirationSeconds": issued_lifetime(not_before, not_after),
        },
    }))
    .expect("static manifest");
    Api::<CertificateSigningRequest>::all(client)
        .create(&PostParams::default(), &csr)
        .await?;
    tracing::info!(provider = %provider, request = %request, "peer identity renewal requested");
    pending.insert(provider, (request, now));
    Ok(())
}

/// Whether `cert_pem` certifies the public key `public_key_pem`.
fn same_key(cert_pem: &str, public_key_pem: &str) -> bool {
    let Ok((_, pem)) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes()) else {
        return false;
    };
    let Ok(cert) = pem.parse_x509() else {
        return false;
    };
    let Ok((_, key)) = x509_parser::pem::parse_x509_pem(public_key_pem.as_bytes()) else {
        return false;
    };
    cert.public_key().raw == key.contents.as_slice()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_is_due_after_its_share_of_the_lifetime() {
        // Issued at 1 300 for 1 000 s, backdated 300 s.
        assert_eq!(issued_lifetime(1_000, 2_300), 1_000);
        assert_eq!(renewal_due(1_000, 2_300, 0.8), 2_100);
        assert_eq!(renewal_due(1_000, 2_300, 0.0), 1_300);
        assert_eq!(renewal_due(1_000, 2_300, 7.0), 2_300);
        // Not backdated, or short: as it is, never below kube's 600 s.
        assert_eq!(issued_lifetime(0, 800), 800);
        assert_eq!(issued_lifetime(0, 100), 600);
    }
}
