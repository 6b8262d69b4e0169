//! The cluster's certificate authority: serving certificate, admin client certificate,
//! and the key that signs ServiceAccount tokens.

use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

/// Errors while creating or loading key material.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// rcgen refused the parameters or the key.
    #[error("certificate generation: {0}")]
    Rcgen(#[from] rcgen::Error),
    /// Reading or writing the CA files failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What went wrong.
        source: std::io::Error,
    },
}

/// The shortest validity a signed CSR gets (kube's minimum spec.expirationSeconds).
pub const MIN_VALID_SECONDS: i64 = 600;

/// A certificate and its private key, PEM encoded.
#[derive(Clone, Debug)]
pub struct CertPair {
    /// Certificate, PEM.
    pub cert_pem: String,
    /// Private key, PEM (PKCS#8).
    pub key_pem: String,
}

/// The cluster CA with everything derived from it.
pub struct ClusterPki {
    /// The CA certificate and key.
    pub ca: CertPair,
    /// The API server's serving certificate (localhost, 127.0.0.1, ::1).
    pub serving: CertPair,
    /// Secret used to sign ServiceAccount tokens (HMAC-SHA256).
    pub token_key: Vec<u8>,
}

impl ClusterPki {
    /// Loads the CA from `dir` (creating and saving it on first use), then issues a fresh
    /// serving certificate. Without a dir everything is ephemeral.
    pub fn load_or_create(dir: Option<&Path>, name: &str) -> Result<Self, PkiError> {
        let ca = match dir {
            Some(dir) => {
                let cert_path = dir.join("ca.crt");
                let key_path = dir.join("ca.key");
                if cert_path.exists() && key_path.exists() {
                    CertPair {
                        cert_pem: read(&cert_path)?,
                        key_pem: read(&key_path)?,
                    }
                } else {
                    let ca = new_ca(name)?;
                    write(&cert_path, &ca.cert_pem)?;
                    write(&key_path, &ca.key_pem)?;
                    ca
                }
            }
            None => new_ca(name)?,
        };
        let token_key = {
            use sha2::Digest;
            // Derived from the CA key so tokens stay valid across restarts of the same cluster.
            sha2::Sha256::digest(format!("sa-token:{}", ca.key_pem).as_bytes()).to_vec()
        };
        let serving = ca.issue(
            "kube-apiserver",
            &[],
            &["localhost", "127.0.0.1", "::1", "kubernetes.default.svc"],
            true,
        )?;
        Ok(ClusterPki {
            ca,
            serving,
            token_key,
        })
    }
}

impl CertPair {
    /// Signs a new certificate: `cn` becomes the user name and `orgs` the groups when used
    /// as a client certificate; `sans` are DNS names or IP addresses for serving certificates.
    pub fn issue(
        &self,
        cn: &str,
        orgs: &[&str],
        sans: &[&str],
        server: bool,
    ) -> Result<CertPair, PkiError> {
        let ca_key = KeyPair::from_pem(&self.key_pem)?;
        let issuer = Issuer::from_ca_cert_pem(&self.cert_pem, ca_key)?;
        let key = KeyPair::generate()?;
        let mut params =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())?;
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, cn);
        for org in orgs {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *org);
        }
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![if server {
            ExtendedKeyUsagePurpose::ServerAuth
        } else {
            ExtendedKeyUsagePurpose::ClientAuth
        }];
        let cert = params.signed_by(&key, &issuer)?;
        Ok(CertPair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Signs the public key of a PEM certificate signing request (the CSR API's signer):
    /// the subject comes from the request, usages from `server`.
    pub fn sign_csr(&self, csr_pem: &str, server: bool) -> Result<String, PkiError> {
        self.sign_csr_for(csr_pem, server, None)
    }

    /// Like [`CertPair::sign_csr`], valid for `valid_seconds` from now when given (at least
    /// 600 s, as kube-apiserver's spec.expirationSeconds), so short-lived client
    /// certificates really expire.
    pub fn sign_csr_for(
        &self,
        csr_pem: &str,
        server: bool,
        valid_seconds: Option<i64>,
    ) -> Result<String, PkiError> {
        let ca_key = KeyPair::from_pem(&self.key_pem)?;
        let issuer = Issuer::from_ca_cert_pem(&self.cert_pem, ca_key)?;
        let mut csr = rcgen::CertificateSigningRequestParams::from_pem(csr_pem)?;
        if let Some(seconds) = valid_seconds {
            let now = time::OffsetDateTime::now_utc();
            // Backdated a little, as kube's signer does, to tolerate clock skew.
            csr.params.not_before = now - time::Duration::minutes(5);
            csr.params.not_after = now + time::Duration::seconds(seconds.max(MIN_VALID_SECONDS));
        }
        csr.params.is_ca = IsCa::ExplicitNoCa;
        csr.params.extended_key_usages = vec![if server {
            ExtendedKeyUsagePurpose::ServerAuth
        } else {
            ExtendedKeyUsagePurpose::ClientAuth
        }];
        Ok(csr.signed_by(&issuer)?.pem())
    }
}

fn new_ca(name: &str) -> Result<CertPair, PkiError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, format!("{name}-ca"));
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key)?;
    Ok(CertPair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

fn read(path: &Path) -> Result<String, PkiError> {
    std::fs::read_to_string(path).map_err(|source| PkiError::Io {
        path: path.display().to_string(),
        source,
    })
}

fn write(path: &Path, content: &str) -> Result<(), PkiError> {
    crate::fsutil::write_atomic(path, content.as_bytes()).map_err(|source| PkiError::Io {
        path: path.display().to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validity(pem: &str) -> i64 {
        let der = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap().1;
        let cert = der.parse_x509().unwrap();
        cert.validity().not_after.timestamp() - time::OffsetDateTime::now_utc().unix_timestamp()
    }

    #[test]
    fn csr_validity_honours_expiration_seconds_with_a_floor() {
        let ca = new_ca("test").unwrap();
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, "carol");
        let csr = params.serialize_request(&key).unwrap().pem().unwrap();
        // (requested seconds, expected remaining validity)
        let cases = [(Some(3600), 3600), (Some(60), MIN_VALID_SECONDS)];
        for (requested, want) in cases {
            let left = validity(&ca.sign_csr_for(&csr, false, requested).unwrap());
            assert!((want - 5..=want).contains(&left), "{requested:?}: {left}");
        }
        let unbounded = validity(&ca.sign_csr(&csr, false).unwrap());
        assert!(unbounded > 100 * 365 * 86400, "{unbounded}");
    }
}
