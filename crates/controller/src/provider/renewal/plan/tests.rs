use super::*;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::CertificateSigningRequestCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;

/// A renewal request of `consumer` made with `key`, asking for `seconds`.
fn request(
    consumer: &str,
    key: &rcgen::KeyPair,
    seconds: Option<i32>,
) -> CertificateSigningRequest {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::CommonName, names::peer_user(consumer));
    dn.push(
        rcgen::DnType::OrganizationName,
        names::peer_key_group(&crate::enroll::key_fingerprint_der(
            &rcgen::PublicKeyData::subject_public_key_info(key),
        )),
    );
    params.distinguished_name = dn;
    let pem = params.serialize_request(key).unwrap().pem().unwrap();
    serde_json::from_value(json!({
        "metadata": {"name": format!("{RENEWAL_CSR_PREFIX}{consumer}-1")},
        "spec": {"request": k8s_openapi::ByteString(pem.into_bytes()), "signerName": PEER_CSR_SIGNER,
                 "usages": ["client auth"], "username": names::peer_user(consumer),
                 "expirationSeconds": seconds},
    }))
    .unwrap()
}

#[test]
fn a_renewal_keeps_the_key_on_record_and_the_lifetime_issued() {
    let key = rcgen::KeyPair::generate().unwrap();
    let other = rcgen::KeyPair::generate().unwrap();
    let recorded =
        crate::enroll::key_fingerprint_der(&rcgen::PublicKeyData::subject_public_key_info(&key));
    let day = Duration::from_secs(86400);
    let approve = |j: Judgement| matches!(j, Judgement::Approve { .. });
    let reason = |j: Judgement| match j {
        Judgement::Deny { reason } => reason,
        other => panic!("{other:?}"),
    };
    let ok = request("rome", &key, Some(3600));
    assert!(approve(judge(&ok)));
    assert!(approve(judge_for(&ok, "rome", Some(&recorded), day)));
    let rekeyed = request("rome", &other, Some(3600));
    assert!(
        approve(judge(&rekeyed)),
        "well-formed: only the Tenant tells"
    );
    let why = reason(judge_for(&rekeyed, "rome", Some(&recorded), day));
    assert!(
        why.contains("bound to key") && why.contains(&recorded),
        "{why}"
    );
    let why = reason(judge_for(&ok, "rome", None, day));
    assert!(why.contains("no key is recorded"), "{why}");
    let why = reason(judge_for(
        &request("rome", &key, Some(2 * 86400)),
        "rome",
        Some(&recorded),
        day,
    ));
    assert!(why.contains("172800s") && why.contains("86400s"), "{why}");
    let why = reason(judge_for(
        &request("rome", &key, None),
        "rome",
        Some(&recorded),
        day,
    ));
    assert!(why.contains("longest lifetime"), "{why}");
}

const NOW: i64 = 1_000_000;
const DAY: Duration = Duration::from_secs(86400);

/// A request as the consumer files it, then as the API server and this controller change it.
struct Csr(CertificateSigningRequest);

impl Csr {
    /// Rome's well-formed renewal request for an hour, made with `key`.
    fn renewal(key: &rcgen::KeyPair) -> Self {
        Csr(request("rome", key, Some(3600)))
    }

    fn seconds(mut self, seconds: Option<i32>) -> Self {
        self.0.spec.expiration_seconds = seconds;
        self
    }

    fn named(mut self, name: &str) -> Self {
        self.0.metadata.name = Some(name.into());
        self
    }

    fn signer(mut self, signer: &str) -> Self {
        self.0.spec.signer_name = signer.into();
        self
    }

    /// Filed through `username`, as the API server records it.
    fn filed_by(mut self, username: &str) -> Self {
        self.0.spec.username = Some(username.into());
        self
    }

    /// Filed with no user name recorded.
    fn filed_by_nobody(mut self) -> Self {
        self.0.spec.username = None;
        self
    }

    /// Made `ago` seconds before [`NOW`].
    fn made_ago(mut self, ago: i64) -> Self {
        self.0.metadata.creation_timestamp = Some(Time(Timestamp::from_second(NOW - ago).unwrap()));
        self
    }

    /// Decided: `Approved` or `Denied`.
    fn decided(mut self, type_: &str) -> Self {
        let status = self.0.status.get_or_insert_default();
        status.conditions = Some(vec![CertificateSigningRequestCondition {
            type_: type_.into(),
            status: "True".into(),
            ..Default::default()
        }]);
        self
    }

    /// Issued by the signer.
    fn issued(mut self, certificate: &str) -> Self {
        self.0.status.get_or_insert_default().certificate =
            Some(ByteString(certificate.as_bytes().to_vec()));
        self
    }
}

/// The Tenant of rome, its key recorded (None: not), being deleted or not.
fn tenant(recorded: Option<&str>, deleting: bool) -> Tenant {
    let mut meta = json!({"name": "rome", "namespace": names::tenant_namespace("rome")});
    if let Some(key) = recorded {
        meta["annotations"] = json!({ names::KEY_FINGERPRINT_ANNOTATION: key });
    }
    if deleting {
        meta["deletionTimestamp"] = json!("2024-01-01T00:00:00Z");
    }
    serde_json::from_value(json!({
        "apiVersion": "tandem.dev/v1alpha1", "kind": "Tenant",
        "metadata": meta, "spec": {"clusterID": "rome"},
    }))
    .unwrap()
}

fn fingerprint(key: &rcgen::KeyPair) -> String {
    crate::enroll::key_fingerprint_der(&rcgen::PublicKeyData::subject_public_key_info(key))
}

fn deny(reason: &str) -> Judgement {
    Judgement::Deny {
        reason: reason.into(),
    }
}

fn rome() -> Judgement {
    Judgement::Approve {
        consumer: "rome".into(),
    }
}

#[test]
fn next_step_table() {
    let key = rcgen::KeyPair::generate().unwrap();
    let milan = request("milan", &key, Some(3600));
    let not_rome = crate::provider::peering_request::check_csr(
        &String::from_utf8_lossy(&milan.spec.request.0),
        "rome",
    )
    .unwrap_err();
    let cases: Vec<(&str, Csr, Step)> = vec![
        (
            "Leave: not a renewal request",
            Csr::renewal(&key).named("csr-x7k2p"),
            Step::Leave,
        ),
        (
            "Leave: a refused request that is not a renewal stays",
            Csr::renewal(&key)
                .named("csr-x7k2p")
                .decided("Denied")
                .made_ago(7200),
            Step::Leave,
        ),
        (
            "DeleteRefused: refused over an hour ago",
            Csr::renewal(&key).decided("Denied").made_ago(3601),
            Step::DeleteRefused,
        ),
        (
            "Judge(Skip): refused within the hour, kept for its filer to see",
            Csr::renewal(&key).decided("Denied").made_ago(3600),
            Step::Judge(Judgement::Skip),
        ),
        (
            "Judge(Skip): refused, of no known age",
            Csr::renewal(&key).decided("Denied"),
            Step::Judge(Judgement::Skip),
        ),
        (
            "HandBack: issued",
            Csr::renewal(&key)
                .decided("Approved")
                .issued("-----BEGIN CERTIFICATE-----"),
            Step::HandBack {
                consumer: "rome".into(),
                certificate: "-----BEGIN CERTIFICATE-----".into(),
            },
        ),
        (
            "HandBack: issued, an old approval is not a refusal",
            Csr::renewal(&key)
                .decided("Approved")
                .made_ago(7200)
                .issued("PEM"),
            Step::HandBack {
                consumer: "rome".into(),
                certificate: "PEM".into(),
            },
        ),
        (
            "Judge(Skip): approved, not issued yet",
            Csr::renewal(&key).decided("Approved"),
            Step::Judge(Judgement::Skip),
        ),
        (
            "Judge(Skip): an empty certificate is not one",
            Csr::renewal(&key).decided("Approved").issued(""),
            Step::Judge(Judgement::Skip),
        ),
        (
            "Judge(Skip): for another signer",
            Csr::renewal(&key).signer("kubernetes.io/kubelet-serving"),
            Step::Judge(Judgement::Skip),
        ),
        (
            "Judge(Approve): undecided and well-formed",
            Csr::renewal(&key),
            Step::Judge(rome()),
        ),
        (
            "Judge(Deny): filed by an identity that is not a peer's",
            Csr::renewal(&key).filed_by("system:admin"),
            Step::Judge(deny(r#"filed by "system:admin", not a peer identity"#)),
        ),
        (
            "Judge(Deny): filed by no one the API server names",
            Csr::renewal(&key).filed_by_nobody(),
            Step::Judge(deny(r#"filed by "", not a peer identity"#)),
        ),
        (
            "Judge(Deny): a peer asks for another peer's identity",
            Csr(milan.clone()).filed_by(&names::peer_user("rome")),
            Step::Judge(deny(&format!(
                "the request does not name the requester's own identity: {not_rome}"
            ))),
        ),
    ];
    let now = Timestamp::from_second(NOW).unwrap();
    for (case, csr, want) in cases {
        assert_eq!(next_step(&csr.0, now), want, "{case}");
    }
}

#[test]
fn judge_tenant_table() {
    let key = rcgen::KeyPair::generate().unwrap();
    let other = rcgen::KeyPair::generate().unwrap();
    let recorded = fingerprint(&key);
    let ok = Csr::renewal(&key);
    let no_key = format!(
        "no key is recorded for rome (Tenant tandem-tenant-rome/rome, annotation {}): its \
         identity is renewed only for the key on record",
        names::KEY_FINGERPRINT_ANNOTATION
    );
    let cases: Vec<(&str, Csr, Option<Tenant>, Judgement)> = vec![
        (
            "Approve: the key on record, for an hour",
            Csr::renewal(&key),
            Some(tenant(Some(&recorded), false)),
            rome(),
        ),
        (
            "Approve: exactly the lifetime this cluster issues",
            Csr::renewal(&key).seconds(Some(86400)),
            Some(tenant(Some(&recorded), false)),
            rome(),
        ),
        (
            "Deny: no Tenant for the consumer",
            Csr::renewal(&key),
            None,
            deny("rome is not a consumer of this cluster"),
        ),
        (
            "Deny: its Tenant is being deleted",
            Csr::renewal(&key),
            Some(tenant(Some(&recorded), true)),
            deny("rome is not a consumer of this cluster"),
        ),
        (
            "Deny: a key other than the one on record",
            Csr::renewal(&other),
            Some(tenant(Some(&recorded), false)),
            deny(&format!(
                "the request is for key {}, but the identity of rome is bound to key {recorded}",
                fingerprint(&other)
            )),
        ),
        (
            "Deny: no key on record",
            Csr::renewal(&key),
            Some(tenant(None, false)),
            deny(&no_key),
        ),
        (
            "Deny: longer than this cluster issues",
            Csr::renewal(&key).seconds(Some(86401)),
            Some(tenant(Some(&recorded), false)),
            deny(
                "the request asks for a certificate of 86401s, more than this cluster issues \
                 (86400s)",
            ),
        ),
        (
            "Deny: no lifetime asked, so the signer's longest",
            Csr::renewal(&key).seconds(None),
            Some(tenant(Some(&recorded), false)),
            deny(
                "the request asks for a certificate of the signer's longest lifetime, more than \
                 this cluster issues (86400s)",
            ),
        ),
    ];
    for (case, csr, tenant, want) in cases {
        assert_eq!(
            judge_tenant(&csr.0, "rome", tenant.as_ref(), DAY),
            want,
            "{case}"
        );
    }
    assert_eq!(judge(&ok.0), rome(), "each row is well-formed by itself");
}

/// What an answer writes: (condition type, message, whether it refuses).
type Written<'a> = Option<(&'a str, &'a str, bool)>;

#[test]
fn answer_table() {
    let cases: Vec<(&str, Judgement, Written)> = vec![
        ("Skip: no answer written", Judgement::Skip, None),
        (
            "Approve: renews the identity",
            rome(),
            Some(("Approved", "renews the peer identity of rome", false)),
        ),
        (
            "Deny: the reason is the message",
            deny("rome is not a consumer of this cluster"),
            Some(("Denied", "rome is not a consumer of this cluster", true)),
        ),
    ];
    for (case, judgement, want) in cases {
        let got = judgement.answer();
        assert_eq!(
            got.as_ref()
                .map(|a| (a.condition, a.message.as_str(), a.denied())),
            want,
            "{case}"
        );
    }
}
