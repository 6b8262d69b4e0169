//! What the peering and enrollment protocols name, shared by the admin commands (`tandem
//! invite`, `tandem enroll`) and the reconcilers: the keys and annotations of token Secrets,
//! the names derived from tokens and keys, and key fingerprints.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;

/// Key of the consumer's token Secret holding `<id>.<secret>`.
pub const TOKEN_KEY: &str = "token";
/// Key of the consumer's token Secret holding the invite's expiry (Unix seconds).
pub const EXPIRES_KEY: &str = "expires";
/// Annotation (on a Peering) asking the deletion to skip every step on the provider.
pub const FORCE_UNPEER_ANNOTATION: &str = "tandem.dev/force-unpeer";
/// Annotation on an invite's token Secret once a consumer filed its request.
pub const INVITE_USED_ANNOTATION: &str = "tandem.dev/invite-used-by";

/// Name of the Role and RoleBinding (in tandem-system) that let one invite file its request.
pub fn invite_role_name(token_id: &str) -> String {
    format!("tandem:invite-{token_id}")
}

/// Name of the bootstrap-token Secret of an invite (in kube-system).
pub fn token_secret_name(token_id: &str) -> String {
    format!("bootstrap-token-{token_id}")
}

/// Name of the consumer's Secret holding an invite's token (in `tandem-tenant-<provider>`).
pub fn consumer_token_secret_name(provider_id: &str) -> String {
    format!("tandem-invite-{provider_id}")
}

/// Key of a consumer's token Secret saying the token is an enrollment credential.
pub const MODE_KEY: &str = "mode";
/// Value of [`MODE_KEY`] for the enrollment credential.
pub const MODE_ENROLL: &str = "enroll";
/// Key of a consumer's token Secret: how the provider was found (the request's `source`).
pub const SOURCE_KEY: &str = "source";
/// Annotation on a consumer's token Secret once its request is filed: the request's UID.
pub const FILED_ANNOTATION: &str = "tandem.dev/request-filed";
/// Name of the ResourceQuota, Role and RoleBinding of the enrollment namespace.
pub const ENROLL_OBJECTS: &str = "tandem:enroll";
/// The ResourceQuota's name (a DNS subdomain: no colon).
pub const ENROLL_QUOTA: &str = "tandem-enroll";
/// The ConfigMap (kube-public) publishing the credential.
pub const ENROLLMENT_CONFIGMAP: &str = "tandem-enrollment";
/// kubeadm's ConfigMap (kube-public) publishing the cluster's CA and endpoint.
pub const CLUSTER_INFO: &str = "cluster-info";
/// Role and RoleBinding (kube-public) letting anyone read those two ConfigMaps.
pub const PUBLIC_INFO_ROLE: &str = "tandem:public-info";
/// Annotation on the enrollment namespace: how long a pending request lives (seconds).
pub const REQUEST_TTL_ANNOTATION: &str = "tandem.dev/request-ttl-seconds";
/// Pending requests at most, by default.
pub const DEFAULT_MAX_PENDING: u32 = 16;
/// How long a pending request lives, by default.
pub const DEFAULT_REQUEST_TTL: Duration = Duration::from_secs(3600);

/// Annotation on the enrollment credential's token Secret: the controller's judgement of its
/// reach, a condition of type [`CONFINED`] as JSON (see `provider::enrollment_guard`).
pub const CONDITION_ANNOTATION: &str = "tandem.dev/enrollment-condition";
/// The condition's type: True while the credential can do nothing but file peering requests;
/// False (and the token switched off) while a binding gives it more, named in the message.
pub const CONFINED: &str = "CredentialConfined";

/// The controller's [`CONFINED`] condition on the credential's token Secret, if it has judged.
pub fn condition_of(
    secret: &Secret,
) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    serde_json::from_str(secret.annotations().get(CONDITION_ANNOTATION)?).ok()
}

/// The quota key counting peering requests (kube's object-count syntax).
pub fn quota_key() -> String {
    format!("count/peeringrequests.{}", tandem_api::GROUP)
}

/// SHA-256 of a public key's SubjectPublicKeyInfo DER, as `sha256:HEX`.
pub fn key_fingerprint_der(spki: &[u8]) -> String {
    tandem_core::discovery::fingerprint(spki)
}

/// The fingerprint of the key a PEM CSR was made for, if the CSR proves it: signed with that
/// key. (A public key is no secret: a CSR naming someone else's, with a signature that does not
/// verify, could otherwise take the request name that key owns.)
pub fn csr_key_fingerprint(pem: &str) -> Option<String> {
    use x509_parser::certification_request::X509CertificationRequest;
    use x509_parser::prelude::FromDer;
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    let (_, csr) = X509CertificationRequest::from_der(&pem.contents).ok()?;
    csr.verify_signature().ok()?;
    Some(key_fingerprint_der(
        csr.certification_request_info.subject_pki.raw,
    ))
}

/// What a peer certificate says of its key: the key's fingerprint, the groups (organizations)
/// it carries and its expiry (Unix seconds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateKey {
    pub fingerprint: String,
    pub groups: Vec<String>,
    pub not_after: i64,
}

/// Reads [`CertificateKey`] off a PEM certificate (None if it is not one).
pub fn certificate_key(pem: &str) -> Option<CertificateKey> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    let cert = pem.parse_x509().ok()?;
    Some(CertificateKey {
        fingerprint: key_fingerprint_der(cert.public_key().raw),
        groups: cert
            .subject()
            .iter_organization()
            .filter_map(|o| o.as_str().ok())
            .map(str::to_string)
            .collect(),
        not_after: cert.validity().not_after.timestamp(),
    })
}

/// The fingerprint of this cluster's key (what a provider's PeeringPolicy names).
pub fn own_key_fingerprint(private_key_pem: &str) -> Result<String, rcgen::Error> {
    use rcgen::PublicKeyData;
    let key = rcgen::KeyPair::from_pem(private_key_pem)?;
    Ok(key_fingerprint_der(&key.subject_public_key_info()))
}

/// The name of the request a consumer key files: derived from the key, so that no other
/// filer can take it (the provider removes a request whose CSR is for another key).
pub fn request_name(key_fingerprint: &str) -> String {
    let hex = key_fingerprint
        .strip_prefix("sha256:")
        .unwrap_or(key_fingerprint);
    format!("enroll-{}", &hex[..32.min(hex.len())])
}

/// `pem`, a CSR, with its signature's last byte changed: still a well-formed CSR for the same
/// key (asserted), whose signature no longer verifies.
#[cfg(test)]
pub(crate) fn with_broken_signature(pem: &str) -> String {
    use base64::Engine;
    use x509_parser::certification_request::X509CertificationRequest;
    use x509_parser::prelude::FromDer;
    let (_, parsed) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).expect("a PEM CSR");
    let mut der = parsed.contents;
    // The last byte is the end of the ECDSA signature's `s`, inside an opaque BIT STRING.
    *der.last_mut().expect("not empty") ^= 1;
    let (_, csr) = X509CertificationRequest::from_der(&der).expect("still a CSR");
    assert!(
        csr.verify_signature().is_err(),
        "the signature still verifies"
    );
    format!(
        "-----BEGIN CERTIFICATE REQUEST-----\n{}\n-----END CERTIFICATE REQUEST-----\n",
        base64::engine::general_purpose::STANDARD.encode(&der)
    )
}
