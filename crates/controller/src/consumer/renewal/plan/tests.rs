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

/// When the certificates below were issued (Unix seconds).
const ISSUED: i64 = 1_700_000_000;
const HOUR: i64 = 3600;

/// A client certificate of rome's peer identity, as kube's signers issue it (backdated 5
/// minutes).
struct Cert<'a> {
    key: &'a rcgen::KeyPair,
    not_before: i64,
    not_after: i64,
    key_group: bool,
}

impl<'a> Cert<'a> {
    /// Issued at [`ISSUED`] for `lifetime` seconds, carrying its key's group.
    fn issued(key: &'a rcgen::KeyPair, lifetime: i64) -> Self {
        Cert {
            key,
            not_before: ISSUED - 300,
            not_after: ISSUED + lifetime,
            key_group: true,
        }
    }

    /// Made before peer certificates carried their key's group.
    fn keyless(mut self) -> Self {
        self.key_group = false;
        self
    }

    fn pem(&self) -> String {
        let at = |s| time::OffsetDateTime::from_unix_timestamp(s).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.not_before = at(self.not_before);
        params.not_after = at(self.not_after);
        let mut dn = rcgen::DistinguishedName::new();
        dn.push(rcgen::DnType::CommonName, names::peer_user("rome"));
        if self.key_group {
            let spki = rcgen::PublicKeyData::subject_public_key_info(self.key);
            dn.push(
                rcgen::DnType::OrganizationName,
                names::peer_key_group(&crate::credentials::key_fingerprint_der(&spki)),
            );
        }
        params.distinguished_name = dn;
        // Who signed it does not matter here: only its key and validity are read.
        params.self_signed(self.key).unwrap().pem()
    }

    /// The identity Secret's kubeconfig holding it.
    fn kubeconfig(&self) -> String {
        kubeconfig_with(&base64::engine::general_purpose::STANDARD.encode(self.pem()))
    }
}

/// A kubeconfig whose user's client-certificate-data is `data`.
fn kubeconfig_with(data: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nusers:\n- name: rome\n  user:\n    client-certificate-data: {data}\n"
    )
}

fn held_for(cert: &Cert) -> Held {
    Held {
        not_before: cert.not_before,
        not_after: cert.not_after,
        keyless: !cert.key_group,
    }
}

#[test]
fn identity_table() {
    let peering = |secret: Option<&str>, remote: Option<&str>, status: bool| {
        let mut p = Peering::new("milan", Default::default());
        p.status = status.then(|| tandem_api::PeeringStatus {
            identity_secret: secret.map(str::to_string),
            remote_tenant_namespace: remote.map(str::to_string),
            ..Default::default()
        });
        p
    };
    let cases = [
        (
            "NotPeered: no status yet",
            peering(None, None, false),
            Err(Idle::NotPeered),
        ),
        (
            "NotPeered: no identity Secret yet",
            peering(None, Some("tandem-tenant-rome"), true),
            Err(Idle::NotPeered),
        ),
        (
            "NotPeered: no remote tenant namespace yet",
            peering(Some("tandem-identity"), None, true),
            Err(Idle::NotPeered),
        ),
        (
            "peered",
            peering(Some("tandem-identity"), Some("tandem-tenant-rome"), true),
            Ok(("tandem-identity", "tandem-tenant-rome")),
        ),
    ];
    for (case, peering, want) in cases {
        assert_eq!(identity(&peering), want, "{case}");
    }
}

#[test]
fn held_table() {
    let key = rcgen::KeyPair::generate().unwrap();
    let keyed = Cert::issued(&key, HOUR);
    let keyless = Cert::issued(&key, HOUR).keyless();
    let cases = [
        (
            "NoCertificate: no kubeconfig",
            String::new(),
            Err(Idle::NoCertificate),
        ),
        (
            "NoCertificate: the data is not base64",
            kubeconfig_with("%%%"),
            Err(Idle::NoCertificate),
        ),
        (
            "NoCertificate: the data is no certificate",
            kubeconfig_with(&base64::engine::general_purpose::STANDARD.encode("junk")),
            Err(Idle::NoCertificate),
        ),
        (
            "a certificate carrying its key's group",
            keyed.kubeconfig(),
            Ok(Held {
                not_before: ISSUED - 300,
                not_after: ISSUED + HOUR,
                keyless: false,
            }),
        ),
        (
            "a keyless certificate",
            keyless.kubeconfig(),
            Ok(Held {
                not_before: ISSUED - 300,
                not_after: ISSUED + HOUR,
                keyless: true,
            }),
        ),
    ];
    for (case, kubeconfig, want) in cases {
        assert_eq!(held(&kubeconfig), want, "{case}");
    }
}

#[test]
fn due_table() {
    let keyed = Held {
        not_before: ISSUED - 300,
        not_after: ISSUED + HOUR,
        keyless: false,
    };
    let keyless = Held {
        keyless: true,
        ..keyed
    };
    let filed = Filed {
        request: "tandem-peer-renewal-rome-1".into(),
        at: ISSUED,
    };
    // 80 % of the hour it was issued for: due at 48 minutes.
    let due_at = ISSUED + 48 * 60;
    let cases = [
        (
            "NotDue: before its share",
            keyed,
            None,
            due_at - 1,
            Err(Idle::NotDue),
        ),
        ("due: at its share", keyed, None, due_at, Ok(())),
        (
            "due: keyless, renewed at once",
            keyless,
            None,
            ISSUED,
            Ok(()),
        ),
        (
            "due: filed, its answer is read",
            keyed,
            Some(&filed),
            ISSUED,
            Ok(()),
        ),
    ];
    for (case, held, filed, now, want) in cases {
        assert_eq!(due(&held, filed, now, 0.8), want, "{case}");
    }
}

#[test]
fn answered_table() {
    let key = rcgen::KeyPair::generate().unwrap();
    let other = rcgen::KeyPair::generate().unwrap();
    let current = Cert::issued(&key, HOUR);
    let held = held_for(&current);
    let filed = Filed {
        request: "tandem-peer-renewal-rome-1700002000".into(),
        at: ISSUED + 2000,
    };
    let answer = |request: &str, certificate: String| RenewedIdentity {
        request: request.into(),
        certificate,
    };
    let renewed = Cert {
        not_after: ISSUED + 2 * HOUR,
        ..Cert::issued(&key, HOUR)
    }
    .pem();
    let cases = [
        (
            "Swap: a newer certificate of this key",
            Some(answer(&filed.request, renewed.clone())),
            ISSUED + 2001,
            Ok(Step::Swap {
                certificate: renewed.clone(),
            }),
        ),
        (
            "Discard(NotNewer): it expires with the one held",
            Some(answer(&filed.request, current.pem())),
            ISSUED + 2001,
            Ok(Step::Discard(Unusable::NotNewer)),
        ),
        (
            "Discard(NotNewer): not a certificate",
            Some(answer(&filed.request, "junk".into())),
            ISSUED + 2001,
            Ok(Step::Discard(Unusable::NotNewer)),
        ),
        (
            "Discard(OtherKey): newer, for another key",
            Some(answer(
                &filed.request,
                Cert {
                    not_after: ISSUED + 2 * HOUR,
                    ..Cert::issued(&other, HOUR)
                }
                .pem(),
            )),
            ISSUED + 2001,
            Ok(Step::Discard(Unusable::OtherKey)),
        ),
        (
            "Unanswered: nothing yet",
            None,
            ISSUED + 2000 + 119,
            Err(Idle::Unanswered),
        ),
        (
            "Unanswered: the answer is to an earlier request",
            Some(answer("tandem-peer-renewal-rome-1", renewed.clone())),
            ISSUED + 2000 + 119,
            Err(Idle::Unanswered),
        ),
        (
            "File: unanswered for two minutes, filed again",
            None,
            ISSUED + 2000 + 120,
            Ok(Step::File {
                request: format!("tandem-peer-renewal-rome-{}", ISSUED + 2120),
                expiration_seconds: HOUR,
            }),
        ),
    ];
    for (case, renewed, now, want) in cases {
        let got = answered(
            &filed,
            renewed.as_ref(),
            &held,
            &key.public_key_pem(),
            "rome",
            now,
        );
        assert_eq!(got, want, "{case}");
    }
}

#[test]
fn a_request_asks_for_the_lifetime_it_was_issued_for() {
    let cases = [
        ("an hour, backdated", ISSUED - 300, ISSUED + HOUR, HOUR),
        ("kube's shortest", ISSUED, ISSUED + 100, 600),
    ];
    for (case, not_before, not_after, asked) in cases {
        let held = Held {
            not_before,
            not_after,
            keyless: false,
        };
        assert_eq!(
            file("rome", &held, ISSUED + 7),
            Step::File {
                request: format!("tandem-peer-renewal-rome-{}", ISSUED + 7),
                expiration_seconds: asked,
            },
            "{case}"
        );
    }
}
