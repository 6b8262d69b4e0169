//! The cluster's certificate authority: serving certificate, admin client certificate,
//! and the key that signs ServiceAccount tokens.

use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, SystemTime};

use p256::pkcs8::DecodePrivateKey;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose, PublicKeyData,
};
use x509_cert::Certificate;
use x509_cert::attr::AttributeTypeAndValue;
use x509_cert::builder::{Builder, CertificateBuilder, Profile};
use x509_cert::der::asn1::{Any, GeneralizedTime, Ia5String, OctetString, SetOfVec, Utf8StringRef};
use x509_cert::der::oid::AssociatedOid;
use x509_cert::der::oid::db::{rfc4519, rfc5280};
use x509_cert::der::pem::LineEnding;
use x509_cert::der::{self, DateTime, Decode, DecodePem, Encode, EncodePem};
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::{
    AuthorityKeyIdentifier, BasicConstraints as LeafBasicConstraints, ExtendedKeyUsage, KeyUsage,
    KeyUsages, SubjectAltName, SubjectKeyIdentifier,
};
use x509_cert::name::{Name, RdnSequence, RelativeDistinguishedName};
use x509_cert::request::{CertReq, ExtensionReq};
use x509_cert::serial_number::SerialNumber;
use x509_cert::spki::SubjectPublicKeyInfoOwned;
use x509_cert::time::{Time, Validity};
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::prelude::FromDer;

/// Errors while creating or loading key material.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// rcgen refused the parameters or the key.
    #[error("certificate generation: {0}")]
    Rcgen(#[from] rcgen::Error),
    /// The CA's private key is not a PKCS#8 ECDSA P-256 key.
    #[error("CA private key: {0}")]
    CaKey(String),
    /// A certificate signing request was malformed or its signature did not verify.
    #[error("certificate signing request: {0}")]
    Csr(String),
    /// Encoding or decoding a part of a certificate failed.
    #[error("{0}: {1}")]
    Encoding(&'static str, der::Error),
    /// Assembling or signing a certificate failed.
    #[error("signing certificate: {0}")]
    Sign(#[from] x509_cert::builder::Error),
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
    pub fn load_or_create(
        dir: Option<&Path>,
        name: &str,
        extra_sans: &[String],
    ) -> Result<Self, PkiError> {
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
        // The names kube-apiserver's certificate carries for in-cluster clients, plus the
        // addresses it also listens on (a network-mode lab's node network and WAN, and the
        // `kubernetes` Service's ClusterIP).
        let mut sans: Vec<&str> = vec![
            "localhost",
            "127.0.0.1",
            "::1",
            "kubernetes.default.svc",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc.cluster.local",
        ];
        sans.extend(extra_sans.iter().map(String::as_str));
        let serving = ca.issue("kube-apiserver", &[], &sans, true)?;
        Ok(ClusterPki {
            ca,
            serving,
            token_key,
        })
    }
}

/// A CA of its own for the API server's connections to kubelets, and the client certificate
/// it issues (kube-apiserver's `--kubelet-client-certificate`). Kubelets trust only this CA,
/// so no certificate the cluster CA signs (for example through the CSR API) can pass for the
/// API server at a kubelet. Made fresh by each API server process.
pub fn kubelet_client(name: &str) -> Result<(CertPair, CertPair), PkiError> {
    let ca = new_ca(&format!("{name}-kubelet-client-ca"))?;
    let client = ca.issue(
        "kube-apiserver-kubelet-client",
        &["system:masters"],
        &[],
        false,
    )?;
    Ok((ca, client))
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
        let key = KeyPair::generate()?;
        let spki = SubjectPublicKeyInfoOwned::from_der(&key.subject_public_key_info())
            .map_err(|e| PkiError::Encoding("new key's public key", e))?;
        let subject =
            subject_name(cn, orgs).map_err(|e| PkiError::Encoding("certificate subject", e))?;
        let sans = (!sans.is_empty())
            .then(|| alt_names(sans))
            .transpose()
            .map_err(|e| PkiError::Encoding("subjectAltName", e))?;
        let cert_pem = self.sign_leaf(Leaf {
            subject,
            spki,
            sans,
            server,
            valid_seconds: None,
        })?;
        Ok(CertPair {
            cert_pem,
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
        // x509-cert gives the subject as the exact Name the requester encoded.
        let request = CertReq::from_der(&verified_request(csr_pem)?)
            .map_err(|e| PkiError::Csr(format!("not PKCS#10: {e}")))?;
        let sans = requested_alt_names(&request)
            .map_err(|e| PkiError::Csr(format!("extensionRequest: {e}")))?;
        self.sign_leaf(Leaf {
            subject: request.info.subject,
            spki: request.info.public_key,
            sans,
            server,
            valid_seconds: valid_seconds.map(|s| s.max(MIN_VALID_SECONDS)),
        })
    }

    /// Signs `leaf` with this CA, with the extensions kube's signer gives a leaf: not a CA,
    /// digitalSignature + keyEncipherment, one extended usage, the key id of the CA.
    ///
    /// Built with x509-cert rather than rcgen: rcgen's `DistinguishedName` keeps one value
    /// per attribute type, so a subject with several O values (several groups) lost all but
    /// one; x509-cert takes a `Name` as an ordered list of RDNs and so keeps a CSR's subject
    /// byte for byte. `Profile::Manual` (feature `hazmat`) lets the authority key id be
    /// copied from the CA's own subject key id: rcgen derives that id with SHA-256 while
    /// x509-cert's leaf profile recomputes it with SHA-1, and OpenSSL refuses a chain whose
    /// ids disagree.
    fn sign_leaf(&self, leaf: Leaf) -> Result<String, PkiError> {
        let ca_key = p256::ecdsa::SigningKey::from_pkcs8_pem(&self.key_pem)
            .map_err(|e| PkiError::CaKey(e.to_string()))?;
        let ca_cert = Certificate::from_pem(self.cert_pem.as_bytes())
            .map_err(|e| PkiError::Encoding("CA certificate", e))?;
        let ca_key_id = ca_cert
            .tbs_certificate
            .extensions
            .iter()
            .flatten()
            .find(|ext| ext.extn_id == SubjectKeyIdentifier::OID)
            .map(|ext| SubjectKeyIdentifier::from_der(ext.extn_value.as_bytes()))
            .transpose()
            .map_err(|e| PkiError::Encoding("CA subjectKeyIdentifier", e))?;
        let now = SystemTime::now();
        // Backdated a little, as kube's signer does, to tolerate clock skew.
        let not_before = Time::try_from(now - Duration::from_secs(300))
            .map_err(|e| PkiError::Encoding("notBefore", e))?;
        let not_after = match leaf.valid_seconds {
            Some(seconds) => Time::try_from(now + Duration::from_secs(seconds.unsigned_abs())),
            // rcgen's default end of validity, which certificates issued so far carry.
            None => DateTime::new(4096, 1, 1, 0, 0, 0)
                .map(GeneralizedTime::from_date_time)
                .map(Time::from),
        }
        .map_err(|e| PkiError::Encoding("notAfter", e))?;
        let mut builder = CertificateBuilder::new(
            Profile::Manual {
                issuer: Some(ca_cert.tbs_certificate.subject.clone()),
            },
            random_serial()?,
            Validity {
                not_before,
                not_after,
            },
            leaf.subject,
            leaf.spki,
            &ca_key,
        )?;
        builder.add_extension(&LeafBasicConstraints {
            ca: false,
            path_len_constraint: None,
        })?;
        builder.add_extension(&KeyUsage(
            KeyUsages::DigitalSignature | KeyUsages::KeyEncipherment,
        ))?;
        builder.add_extension(&ExtendedKeyUsage(vec![if leaf.server {
            rfc5280::ID_KP_SERVER_AUTH
        } else {
            rfc5280::ID_KP_CLIENT_AUTH
        }]))?;
        if let Some(SubjectKeyIdentifier(key_id)) = ca_key_id {
            builder.add_extension(&AuthorityKeyIdentifier {
                key_identifier: Some(key_id),
                authority_cert_issuer: None,
                authority_cert_serial_number: None,
            })?;
        }
        if let Some(sans) = &leaf.sans {
            builder.add_extension(sans)?;
        }
        let cert = builder.build::<p256::ecdsa::DerSignature>()?;
        cert.to_pem(LineEnding::LF)
            .map_err(|e| PkiError::Encoding("signed certificate", e))
    }
}

/// What a certificate signing request asks to have certified, for a signer's policy checks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestedIdentity {
    /// The subject's common names, in order (a well-formed request has one).
    pub common_names: Vec<String>,
    /// The subject's organizations, in order (the groups of a client certificate).
    pub organizations: Vec<String>,
    /// The subjectAltName entries the signed certificate would carry.
    pub alt_names: Vec<RequestedAltName>,
}

/// One requested subjectAltName entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestedAltName {
    /// A DNS name.
    Dns(String),
    /// An IP address.
    Ip(IpAddr),
    /// An email address (rfc822Name).
    Email(String),
    /// A URI.
    Uri(String),
    /// Any other kind of name (otherName, directoryName, ...), by its kind.
    Other(&'static str),
}

/// Reads what a PEM certificate signing request asks for: the subject as kube's
/// authenticator reads it and the subjectAltName [`CertPair::sign_csr_for`] copies. Fails
/// as signing would on a request that is not a signed PKCS#10 request.
pub fn requested_identity(csr_pem: &str) -> Result<RequestedIdentity, PkiError> {
    let der = verified_request(csr_pem)?;
    let (_, parsed) = X509CertificationRequest::from_der(&der)
        .map_err(|e| PkiError::Csr(format!("not PKCS#10: {e}")))?;
    let subject = &parsed.certification_request_info.subject;
    let text = |what: &str, attr: &x509_parser::x509::AttributeTypeAndValue<'_>| {
        attr.as_str()
            .map(str::to_string)
            .map_err(|e| PkiError::Csr(format!("subject {what} is not a string: {e}")))
    };
    let common_names = subject
        .iter_common_name()
        .map(|cn| text("common name", cn))
        .collect::<Result<_, _>>()?;
    let organizations = subject
        .iter_organization()
        .map(|o| text("organization", o))
        .collect::<Result<_, _>>()?;
    let request =
        CertReq::from_der(&der).map_err(|e| PkiError::Csr(format!("not PKCS#10: {e}")))?;
    let alt_names = requested_alt_names(&request)
        .map_err(|e| PkiError::Csr(format!("extensionRequest: {e}")))?
        .map(|SubjectAltName(names)| names.iter().map(requested_alt_name).collect())
        .unwrap_or_default();
    Ok(RequestedIdentity {
        common_names,
        organizations,
        alt_names,
    })
}

fn requested_alt_name(name: &GeneralName) -> RequestedAltName {
    match name {
        GeneralName::DnsName(dns) => RequestedAltName::Dns(dns.to_string()),
        GeneralName::Rfc822Name(email) => RequestedAltName::Email(email.to_string()),
        GeneralName::UniformResourceIdentifier(uri) => RequestedAltName::Uri(uri.to_string()),
        GeneralName::IpAddress(ip) => match ip.as_bytes().len() {
            4 => RequestedAltName::Ip(IpAddr::from(
                <[u8; 4]>::try_from(ip.as_bytes()).expect("four octets"),
            )),
            16 => RequestedAltName::Ip(IpAddr::from(
                <[u8; 16]>::try_from(ip.as_bytes()).expect("sixteen octets"),
            )),
            _ => RequestedAltName::Other("malformed iPAddress"),
        },
        GeneralName::OtherName(_) => RequestedAltName::Other("otherName"),
        GeneralName::DirectoryName(_) => RequestedAltName::Other("directoryName"),
        GeneralName::EdiPartyName(_) => RequestedAltName::Other("ediPartyName"),
        GeneralName::RegisteredId(_) => RequestedAltName::Other("registeredID"),
    }
}

/// The DER of a PEM certificate signing request whose proof of possession verifies
/// (x509-parser checks RSA, ECDSA and Ed25519 signatures, like kube).
fn verified_request(csr_pem: &str) -> Result<Vec<u8>, PkiError> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(csr_pem.as_bytes())
        .map_err(|e| PkiError::Csr(format!("not PEM: {e}")))?;
    if pem.label != "CERTIFICATE REQUEST" {
        return Err(PkiError::Csr(format!(
            "PEM block is {:?}, want \"CERTIFICATE REQUEST\"",
            pem.label
        )));
    }
    let (_, parsed) = X509CertificationRequest::from_der(&pem.contents)
        .map_err(|e| PkiError::Csr(format!("not PKCS#10: {e}")))?;
    parsed
        .verify_signature()
        .map_err(|e| PkiError::Csr(format!("signature does not verify: {e}")))?;
    Ok(pem.contents)
}

/// What differs between the certificates the CA signs.
struct Leaf {
    subject: Name,
    spki: SubjectPublicKeyInfoOwned,
    sans: Option<SubjectAltName>,
    server: bool,
    /// None: valid until rcgen's far-future default.
    valid_seconds: Option<i64>,
}

/// CN=`cn`, then one O RDN per group, in order.
fn subject_name(cn: &str, orgs: &[&str]) -> Result<Name, der::Error> {
    let rdn = |oid, value: &str| -> Result<RelativeDistinguishedName, der::Error> {
        let value = Any::encode_from(&Utf8StringRef::new(value)?)?;
        Ok(RelativeDistinguishedName(SetOfVec::try_from(vec![
            AttributeTypeAndValue { oid, value },
        ])?))
    };
    let mut rdns = vec![rdn(rfc4519::CN, cn)?];
    for org in orgs {
        rdns.push(rdn(rfc4519::O, org)?);
    }
    Ok(RdnSequence(rdns))
}

/// Each of `sans` as an IP address when it parses as one, else as a DNS name.
fn alt_names(sans: &[&str]) -> Result<SubjectAltName, der::Error> {
    let names = sans
        .iter()
        .map(|san| match san.parse::<IpAddr>() {
            Ok(IpAddr::V4(ip)) => OctetString::new(ip.octets()).map(GeneralName::IpAddress),
            Ok(IpAddr::V6(ip)) => OctetString::new(ip.octets()).map(GeneralName::IpAddress),
            Err(_) => Ia5String::new(san).map(GeneralName::DnsName),
        })
        .collect::<Result<_, _>>()?;
    Ok(SubjectAltName(names))
}

/// The subjectAltName a CSR asks for in its extensionRequest attribute; kube's signer
/// copies the requested DNS names, IPs, emails and URIs into the certificate.
fn requested_alt_names(request: &CertReq) -> Result<Option<SubjectAltName>, der::Error> {
    for attr in request.info.attributes.iter() {
        if attr.oid != ExtensionReq::OID {
            continue;
        }
        for value in attr.values.iter() {
            let ExtensionReq(extensions) = ExtensionReq::from_der(&value.to_der()?)?;
            if let Some(ext) = extensions
                .iter()
                .find(|ext| ext.extn_id == SubjectAltName::OID)
            {
                return SubjectAltName::from_der(ext.extn_value.as_bytes()).map(Some);
            }
        }
    }
    Ok(None)
}

/// A positive random serial of 128 bits (RFC 5280 wants at most 20 octets, unpredictable).
fn random_serial() -> Result<SerialNumber, PkiError> {
    let mut bytes = uuid::Uuid::new_v4().into_bytes();
    // Positive and minimally encoded: no high bit, no leading zero octet.
    bytes[0] = (bytes[0] & 0x7f).max(1);
    SerialNumber::new(&bytes).map_err(|e| PkiError::Encoding("serial number", e))
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

    fn der(pem: &str) -> Vec<u8> {
        x509_parser::pem::parse_x509_pem(pem.as_bytes())
            .unwrap()
            .1
            .contents
    }

    fn organizations(cert: &x509_parser::certificate::X509Certificate<'_>) -> Vec<String> {
        cert.subject()
            .iter_organization()
            .map(|o| o.as_str().unwrap().to_string())
            .collect()
    }

    fn extended_usages(cert: &x509_parser::certificate::X509Certificate<'_>) -> (bool, bool) {
        let eku = cert
            .extended_key_usage()
            .unwrap()
            .expect("extendedKeyUsage");
        (eku.value.server_auth, eku.value.client_auth)
    }

    /// The subjectAltName entries as `dns:NAME` / `ip:ADDR`, in order; empty without one.
    fn alt_names_of(cert: &x509_parser::certificate::X509Certificate<'_>) -> Vec<String> {
        use x509_parser::extensions::GeneralName as N;
        let Some(ext) = cert.subject_alternative_name().unwrap() else {
            return vec![];
        };
        ext.value
            .general_names
            .iter()
            .map(|name| match name {
                N::DNSName(dns) => format!("dns:{dns}"),
                N::IPAddress(ip) => match <[u8; 4]>::try_from(*ip) {
                    Ok(v4) => format!("ip:{}", IpAddr::from(v4)),
                    Err(_) => {
                        let v6 = <[u8; 16]>::try_from(*ip).expect("IPv4 or IPv6 length");
                        format!("ip:{}", IpAddr::from(v6))
                    }
                },
                other => format!("unexpected {other}"),
            })
            .collect()
    }

    /// A CSR for `subject` (x509-cert, since rcgen cannot repeat an attribute type),
    /// optionally asking for `sans`.
    fn csr(subject: &Name, sans: &[&str]) -> String {
        csr_asking_for(
            subject,
            (!sans.is_empty()).then(|| alt_names(sans).unwrap()),
        )
    }

    /// A CSR for `subject` asking for exactly `sans`.
    fn csr_asking_for(subject: &Name, sans: Option<SubjectAltName>) -> String {
        let key = KeyPair::generate().unwrap();
        let signer = p256::ecdsa::SigningKey::from_pkcs8_pem(&key.serialize_pem()).unwrap();
        let mut builder =
            x509_cert::builder::RequestBuilder::new(subject.clone(), &signer).unwrap();
        if let Some(sans) = &sans {
            builder.add_extension(sans).unwrap();
        }
        builder
            .build::<p256::ecdsa::DerSignature>()
            .unwrap()
            .to_pem(LineEnding::LF)
            .unwrap()
    }

    #[test]
    fn issued_client_certificates_carry_every_group_in_order() {
        let ca = new_ca("test").unwrap();
        let ca_der = der(&ca.cert_pem);
        let (_, ca_cert) = x509_parser::parse_x509_certificate(&ca_der).unwrap();
        let cases: [&[&str]; 3] = [
            &[],
            &["system:masters"],
            &["team-b", "team-a", "system:nodes"],
        ];
        for orgs in cases {
            let pair = ca.issue("dana", orgs, &[], false).unwrap();
            let der = der(&pair.cert_pem);
            let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
            assert_eq!(organizations(&cert), orgs, "subject {}", cert.subject());
            let user = crate::authn::user_from_certificate(&der).expect("authenticates");
            assert_eq!(user.name, "dana");
            assert_eq!(user.groups, orgs);
            assert_eq!(
                extended_usages(&cert),
                (false, true),
                "{orgs:?}: client auth only"
            );
            assert_eq!(cert.issuer(), ca_cert.subject());
            cert.verify_signature(Some(ca_cert.public_key()))
                .unwrap_or_else(|e| panic!("{orgs:?}: not signed by the CA: {e:?}"));
            // The key handed out is the one certified.
            let key = KeyPair::from_pem(&pair.key_pem).unwrap();
            assert_eq!(cert.public_key().raw, key.subject_public_key_info());
        }
    }

    #[test]
    fn signed_csr_keeps_the_requested_subject_exactly() {
        let ca = new_ca("test").unwrap();
        let mut subject = subject_name("carol", &["team-a", "team-b"]).unwrap();
        // An attribute issue() never writes, to show the subject is copied, not rebuilt.
        subject.0.push(RelativeDistinguishedName(
            SetOfVec::try_from(vec![AttributeTypeAndValue {
                oid: rfc4519::OU,
                value: Any::encode_from(&Utf8StringRef::new("platform").unwrap()).unwrap(),
            }])
            .unwrap(),
        ));
        // (server, requested SANs)
        let cases: [(bool, &[&str]); 2] = [(false, &[]), (true, &["carol.example", "10.0.0.7"])];
        for (server, sans) in cases {
            let request = csr(&subject, sans);
            let der = der(&ca.sign_csr_for(&request, server, Some(3600)).unwrap());
            let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
            assert_eq!(
                cert.subject().as_raw(),
                subject.to_der().unwrap(),
                "server={server}"
            );
            assert_eq!(organizations(&cert), ["team-a", "team-b"]);
            let user = crate::authn::user_from_certificate(&der).expect("authenticates");
            assert_eq!(
                (user.name.as_str(), user.groups),
                ("carol", vec!["team-a".to_string(), "team-b".into()])
            );
            assert_eq!(extended_usages(&cert), (server, !server));
            let want: &[&str] = match sans {
                [] => &[],
                _ => &["dns:carol.example", "ip:10.0.0.7"],
            };
            assert_eq!(alt_names_of(&cert), want, "requested SANs are copied");
        }
    }

    #[test]
    fn requested_identity_reads_the_subject_and_every_alt_name_kind() {
        let subject = subject_name("system:node:vn-1", &["system:nodes", "extra"]).unwrap();
        let ia5 = |s: &str| Ia5String::new(s).unwrap();
        let sans = SubjectAltName(vec![
            GeneralName::DnsName(ia5("vn-1.lab")),
            GeneralName::IpAddress(OctetString::new([10, 0, 0, 7]).unwrap()),
            GeneralName::IpAddress(OctetString::new([0; 16]).unwrap()),
            GeneralName::Rfc822Name(ia5("node@lab")),
            GeneralName::UniformResourceIdentifier(ia5("spiffe://lab/vn-1")),
            GeneralName::DirectoryName(subject.clone()),
        ]);
        let identity = requested_identity(&csr_asking_for(&subject, Some(sans))).unwrap();
        assert_eq!(
            identity,
            RequestedIdentity {
                common_names: vec!["system:node:vn-1".into()],
                organizations: vec!["system:nodes".into(), "extra".into()],
                alt_names: vec![
                    RequestedAltName::Dns("vn-1.lab".into()),
                    RequestedAltName::Ip("10.0.0.7".parse().unwrap()),
                    RequestedAltName::Ip("::".parse().unwrap()),
                    RequestedAltName::Email("node@lab".into()),
                    RequestedAltName::Uri("spiffe://lab/vn-1".into()),
                    RequestedAltName::Other("directoryName"),
                ],
            }
        );
        let bare = requested_identity(&csr(&subject_name("carol", &[]).unwrap(), &[])).unwrap();
        assert_eq!(
            (bare.common_names, bare.organizations, bare.alt_names),
            (vec!["carol".to_string()], vec![], vec![])
        );
        let err = requested_identity("not a csr").unwrap_err().to_string();
        assert!(err.contains("not PEM"), "{err}");
    }

    #[test]
    fn csrs_that_are_not_signed_requests_are_refused() {
        let ca = new_ca("test").unwrap();
        let good = csr(&subject_name("carol", &["team-a"]).unwrap(), &[]);
        // Flip a bit in the signature: proof of possession fails.
        let mut tampered = der(&good);
        let last = tampered.len() - 1;
        tampered[last] ^= 1;
        let tampered =
            x509_cert::der::pem::encode_string("CERTIFICATE REQUEST", LineEnding::LF, &tampered)
                .unwrap();
        let cases = [
            ("garbage", "not a csr".to_string(), "not PEM"),
            ("a certificate", ca.cert_pem.clone(), "CERTIFICATE REQUEST"),
            ("bad signature", tampered, "signature does not verify"),
        ];
        for (what, pem, want) in cases {
            let err = ca.sign_csr(&pem, false).expect_err(what).to_string();
            assert!(err.contains(want), "{what}: {err}");
        }
    }

    #[test]
    fn serving_certificate_names_every_address() {
        let pki = ClusterPki::load_or_create(None, "test", &["10.96.0.1".into()]).unwrap();
        let der = der(&pki.serving.cert_pem);
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        assert_eq!(
            alt_names_of(&cert),
            [
                "dns:localhost",
                "ip:127.0.0.1",
                "ip:::1",
                "dns:kubernetes.default.svc",
                "dns:kubernetes",
                "dns:kubernetes.default",
                "dns:kubernetes.default.svc.cluster.local",
                "ip:10.96.0.1",
            ]
        );
        assert_eq!(extended_usages(&cert), (true, false));
        let usage = cert.key_usage().unwrap().expect("keyUsage").value;
        assert!(usage.digital_signature() && usage.key_encipherment() && !usage.key_cert_sign());
        assert!(!cert.is_ca());
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
