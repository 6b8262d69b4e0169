//! The webhook's TLS: a serving certificate issued by a throw-away CA ([`issue`]), and the
//! server's configuration presenting whichever certificate serves now ([`CurrentCertificate`]).

use std::sync::Arc;

use super::errors::WebhookError;
use super::plan::{WebhookTarget, validity};

/// A serving certificate and the CA that signed it.
pub(super) struct Issued {
    /// The CA's PEM (what the caBundle carries).
    pub ca_pem: String,
    /// The certificate and its key, as the server presents them.
    pub key: Arc<rustls::sign::CertifiedKey>,
    /// The end of the certificate's validity.
    pub not_after: time::OffsetDateTime,
}

/// A new CA and serving certificate for `target`, issued at `now` for `lifetime` (see
/// [`validity`]).
pub(super) fn issue(
    target: &WebhookTarget,
    lifetime: std::time::Duration,
    now: time::OffsetDateTime,
) -> Result<Issued, WebhookError> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let e = |what: &'static str| move |err: rcgen::Error| WebhookError::Certificate(what, err);
    let (not_before, not_after) = validity(now, lifetime);
    let ca_key = KeyPair::generate().map_err(e("generating the CA key"))?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(e("CA params"))?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "tandem-pod-placement-ca");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.not_before = not_before;
    ca_params.not_after = not_after;
    let ca_cert = ca_params
        .self_signed(&ca_key)
        .map_err(e("self-signing the CA"))?;
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().map_err(e("generating the server key"))?;
    let mut params = CertificateParams::new(target.names()).map_err(e("server params"))?;
    params
        .distinguished_name
        .push(DnType::CommonName, "tandem-pod-placement");
    params.not_before = not_before;
    params.not_after = not_after;
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(e("signing the server certificate"))?;
    let signing = rustls::crypto::ring::sign::any_supported_type(
        &rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
    .map_err(WebhookError::Tls)?;
    Ok(Issued {
        ca_pem: ca_cert.pem(),
        key: Arc::new(rustls::sign::CertifiedKey::new(
            vec![cert.der().clone()],
            signing,
        )),
        not_after,
    })
}

/// The serving certificate, swapped in place on rotation: connections already open keep the
/// one they were made with.
#[derive(Debug)]
pub(super) struct CurrentCertificate(std::sync::RwLock<Arc<rustls::sign::CertifiedKey>>);

impl CurrentCertificate {
    /// Serving `key` first.
    pub(super) fn new(key: Arc<rustls::sign::CertifiedKey>) -> Self {
        CurrentCertificate(std::sync::RwLock::new(key))
    }

    /// Serves `key` from the next handshake on.
    pub(super) fn switch(&self, key: Arc<rustls::sign::CertifiedKey>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = key;
    }
}

impl rustls::server::ResolvesServerCert for CurrentCertificate {
    fn resolve(
        &self,
        _hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.read().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

/// The server's TLS configuration, presenting whatever `current` holds.
pub(super) fn server_config(
    current: Arc<CurrentCertificate>,
) -> Result<rustls::ServerConfig, WebhookError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(WebhookError::Tls)?
        .with_no_client_auth()
        .with_cert_resolver(current);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}
