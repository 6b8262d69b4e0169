//! What the consumer decides about renewing its peer identity with one provider, pure, with
//! the clock passed in: whether the certificate its identity Secret holds is due
//! ([`held`], [`due`]), what the provider's answer to a filed request means ([`answered`]),
//! and the request to file ([`file`]): each a [`Step`], or the reason it is [`Idle`].

use std::time::Duration;

use base64::Engine as _;
use tandem_api::provider::RenewedIdentity;
use tandem_api::{Peering, names};

use crate::rbac::RENEWAL_CSR_PREFIX;

/// A request unanswered for this long is filed again (as is one a restarted controller no
/// longer remembers: the provider keeps only the latest answer).
pub(super) const RETRY_AFTER: Duration = Duration::from_secs(120);

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

/// The peer certificate a Peering's identity Secret holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Held {
    /// When it became valid (backdated by its signer), in Unix seconds.
    pub not_before: i64,
    /// When it expires, in Unix seconds.
    pub not_after: i64,
    /// Issued before peer certificates carried their key's group: renewed at once, since the
    /// provider binds this identity's roles to that group.
    pub keyless: bool,
}

/// A renewal request filed with a provider and not answered yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Filed {
    /// The request's name.
    pub request: String,
    /// When it was filed, in Unix seconds.
    pub at: i64,
}

/// What the consumer does about its identity with one provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// File a renewal request (through the identity it renews) named `request`, asking for
    /// a certificate as long-lived as the current one.
    File {
        request: String,
        expiration_seconds: i64,
    },
    /// Swap the renewed certificate into the identity Secret, and forget the request.
    Swap { certificate: String },
    /// Forget the request: the provider answered it with a certificate of no use.
    Discard(Unusable),
}

/// Why a renewed certificate is not swapped in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Unusable {
    /// It expires no later than the one held.
    NotNewer,
    /// It certifies another key than this cluster's.
    OtherKey,
}

/// Why the consumer does nothing about its identity with a provider this round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Idle {
    /// The Peering names no identity Secret or remote tenant namespace yet.
    NotPeered,
    /// The identity Secret holds no client certificate that can be read.
    NoCertificate,
    /// Nothing is filed, and the certificate has not used up its share of its lifetime.
    NotDue,
    /// The request filed is unanswered, for less than [`RETRY_AFTER`].
    Unanswered,
}

/// The identity Secret and the remote tenant namespace of `peering`, once it has them.
pub(super) fn identity(peering: &Peering) -> Result<(&str, &str), Idle> {
    let status = peering.status.as_ref().ok_or(Idle::NotPeered)?;
    match (&status.identity_secret, &status.remote_tenant_namespace) {
        (Some(secret), Some(remote_tenant)) => Ok((secret, remote_tenant)),
        _ => Err(Idle::NotPeered),
    }
}

/// The certificate held in an identity Secret's `kubeconfig`.
pub(super) fn held(kubeconfig: &str) -> Result<Held, Idle> {
    let cert = client_certificate(kubeconfig).ok_or(Idle::NoCertificate)?;
    let (not_before, not_after) = validity(&cert).ok_or(Idle::NoCertificate)?;
    let keyless = crate::credentials::certificate_key(&cert).is_some_and(|c| {
        !c.groups
            .iter()
            .any(|g| g.starts_with(names::PEER_KEY_GROUP_PREFIX))
    });
    Ok(Held {
        not_before,
        not_after,
        keyless,
    })
}

/// Whether to go on at `now` (Unix seconds): with a request `filed`, to read its answer;
/// otherwise once the share `after` of the certificate's lifetime has passed, or at once for a
/// keyless one.
pub(super) fn due(held: &Held, filed: Option<&Filed>, now: i64, after: f64) -> Result<(), Idle> {
    if filed.is_none() && !held.keyless && now < renewal_due(held.not_before, held.not_after, after)
    {
        return Err(Idle::NotDue);
    }
    Ok(())
}

/// What the provider's answer (`renewed`, from the Tenant's status) means for the request
/// `filed` by `cluster_id`, whose key is `public_key_pem`, at `now`.
pub(super) fn answered(
    filed: &Filed,
    renewed: Option<&RenewedIdentity>,
    held: &Held,
    public_key_pem: &str,
    cluster_id: &str,
    now: i64,
) -> Result<Step, Idle> {
    if let Some(renewed) = renewed.filter(|r| r.request == filed.request) {
        let newer = validity(&renewed.certificate).is_some_and(|(_, end)| end > held.not_after);
        return Ok(if !newer {
            Step::Discard(Unusable::NotNewer)
        } else if !same_key(&renewed.certificate, public_key_pem) {
            Step::Discard(Unusable::OtherKey)
        } else {
            Step::Swap {
                certificate: renewed.certificate.clone(),
            }
        });
    }
    if now - filed.at < RETRY_AFTER.as_secs() as i64 {
        return Err(Idle::Unanswered);
    }
    Ok(file(cluster_id, held, now))
}

/// The request `cluster_id` files at `now`: for the same identity, as long-lived as the
/// certificate held.
pub(super) fn file(cluster_id: &str, held: &Held, now: i64) -> Step {
    Step::File {
        request: format!("{RENEWAL_CSR_PREFIX}{cluster_id}-{now}"),
        expiration_seconds: issued_lifetime(held.not_before, held.not_after),
    }
}

/// Whether `cert_pem` certifies the public key `public_key_pem`.
pub(super) fn same_key(cert_pem: &str, public_key_pem: &str) -> bool {
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
mod tests;
