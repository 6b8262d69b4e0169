//! The provider's admission of a consumer as the consumer and the admin see it: the Denied
//! message in the request's status (or its removal), the key a cluster ID is bound to, the CSR
//! filed and approved for it, the Approved answer, the grant offered, and what the invite
//! janitor deletes.

use super::*;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequestCondition, CertificateSigningRequestStatus,
};
use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tandem_api::PeeringRequestSpec;

/// The invite's token ID: the request's name.
const TOKEN_ID: &str = "abc123";
/// The invite's secret half.
const SECRET: &str = "0123456789abcdef";
/// This provider's cluster ID.
const PROVIDER: &str = "milan";

/// (case, the Tenant of the cluster ID, the request's key, denial, the message).
type KeyCase<'a> = (&'a str, Option<Tenant>, &'a str, Option<Denial>, &'a str);
/// (case, request, invite expiry, consumer authenticated, cleanup, request deleted, invite
/// deleted).
type CleanupCase<'a> = (
    &'a str,
    Option<PeeringRequest>,
    i64,
    bool,
    Cleanup,
    bool,
    bool,
);

/// A CSR for `cn` in group `org`; `KEY` stands for the group of the key it is signed with.
fn csr(cn: &str, org: &str) -> String {
    use rcgen::PublicKeyData;
    let key = rcgen::KeyPair::generate().unwrap();
    let own = names::peer_key_group(&crate::enroll::key_fingerprint_der(
        &key.subject_public_key_info(),
    ));
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::CommonName, cn);
    dn.push(
        rcgen::DnType::OrganizationName,
        if org == "KEY" { own } else { org.to_string() },
    );
    params.distinguished_name = dn;
    params.serialize_request(&key).unwrap().pem().unwrap()
}

/// The group of the key a CSR is signed with.
fn key_group(pem: &str) -> String {
    names::peer_key_group(&crate::enroll::csr_key_fingerprint(pem).unwrap())
}

fn at(rfc3339: &str) -> Timestamp {
    rfc3339.parse().unwrap()
}

/// The checks' clock.
fn now() -> Timestamp {
    at("2030-01-01T12:00:00Z")
}

/// A request filed with the invite, its proof made with the whole token unless said otherwise.
#[derive(Clone)]
struct RequestFixture {
    cluster_id: String,
    token_id: String,
    csr: String,
    proof: Option<String>,
    version: Option<u32>,
}

impl RequestFixture {
    /// A well-formed request of `consumer`, its CSR for its peer user in its key's group.
    fn of(consumer: &str) -> Self {
        RequestFixture {
            cluster_id: consumer.into(),
            token_id: TOKEN_ID.into(),
            csr: csr(&names::peer_user(consumer), "KEY"),
            proof: None,
            version: None,
        }
    }
    fn csr(mut self, pem: String) -> Self {
        self.csr = pem;
        self
    }
    fn token_id(mut self, id: &str) -> Self {
        self.token_id = id.into();
        self
    }
    fn proof(mut self, proof: &str) -> Self {
        self.proof = Some(proof.into());
        self
    }
    fn version(mut self, v: u32) -> Self {
        self.version = Some(v);
        self
    }
    fn build(&self) -> PeeringRequest {
        let proof = self.proof.clone().unwrap_or_else(|| {
            tandem_core::invite::token_proof(SECRET, &self.cluster_id, &self.token_id, &self.csr)
        });
        let mut req = PeeringRequest::new(
            TOKEN_ID,
            PeeringRequestSpec {
                cluster_id: self.cluster_id.clone(),
                token_id: self.token_id.clone(),
                token_proof: proof,
                csr: self.csr.clone(),
                protocol_version: self.version,
                source: None,
            },
        );
        req.metadata.namespace = Some(names::SYSTEM_NAMESPACE.into());
        req
    }
}

/// The invite's bootstrap token Secret, expiring an hour after [`now`].
struct TokenFixture(Secret);

impl TokenFixture {
    fn new() -> Self {
        let data = [
            ("token-id", TOKEN_ID),
            ("token-secret", SECRET),
            ("expiration", "2030-01-01T13:00:00Z"),
        ]
        .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())));
        TokenFixture(Secret {
            data: Some(data.into()),
            ..Default::default()
        })
    }
    fn expires(mut self, rfc3339: &str) -> Self {
        self.0
            .data
            .as_mut()
            .unwrap()
            .insert("expiration".into(), ByteString(rfc3339.as_bytes().to_vec()));
        self
    }
    fn used_by(mut self, consumer: &str) -> Self {
        self.0.metadata.annotations =
            Some([(INVITE_USED_ANNOTATION.to_string(), consumer.to_string())].into());
        self
    }
}

/// A request answered `phase`, filed at `created` (unix seconds).
fn answered_request(phase: &str, created: i64) -> PeeringRequest {
    let mut req = RequestFixture::of("rome").build();
    req.status = Some(tandem_api::provider::PeeringRequestStatus {
        phase: Some(phase.into()),
        ..Default::default()
    });
    req.metadata.creation_timestamp = Some(Time(Timestamp::from_second(created).unwrap()));
    req
}

#[test]
fn verdict_table() {
    let rome = RequestFixture::of("rome");
    let other_csr = csr("tandem:peer:milan-2", "KEY");
    let other_group = key_group(&other_csr);
    // (case, request, its token, verdict, the status message the consumer reads).
    let cases: Vec<(&str, RequestFixture, Option<TokenFixture>, Verdict, String)> = vec![
        (
            "Accept: a well-formed request",
            rome.clone(),
            Some(TokenFixture::new()),
            Verdict::Accept,
            String::new(),
        ),
        (
            "Accept: a retry by the consumer that spent the invite",
            rome.clone(),
            Some(TokenFixture::new().used_by("rome")),
            Verdict::Accept,
            String::new(),
        ),
        (
            "Accept: an unreadable expiration is no expiry",
            rome.clone(),
            Some(TokenFixture::new().expires("soon")),
            Verdict::Accept,
            String::new(),
        ),
        (
            "NoInvite: no token named like the request",
            rome.clone(),
            None,
            Verdict::NoInvite,
            String::new(),
        ),
        (
            "Deny Protocol: a consumer speaking v99",
            rome.clone().version(99),
            Some(TokenFixture::new()),
            Verdict::Deny(Denial::Protocol(Unsupported {
                peer: "consumer",
                theirs: 99,
            })),
            format!(
                "the consumer speaks peering protocol v99, and this tandem speaks {}; upgrade the older side",
                tandem_core::protocol::speaks()
            ),
        ),
        (
            "Deny Protocol: judged before an expired, spent invite",
            rome.clone().version(99),
            Some(
                TokenFixture::new()
                    .expires("2030-01-01T11:00:00Z")
                    .used_by("paris"),
            ),
            Verdict::Deny(Denial::Protocol(Unsupported {
                peer: "consumer",
                theirs: 99,
            })),
            format!(
                "the consumer speaks peering protocol v99, and this tandem speaks {}; upgrade the older side",
                tandem_core::protocol::speaks()
            ),
        ),
        (
            "Deny Expired: a second too late",
            rome.clone(),
            Some(TokenFixture::new().expires("2030-01-01T11:59:59Z")),
            Verdict::Deny(Denial::Expired),
            "the invite expired".into(),
        ),
        (
            "Deny TokenUsed: spent by another consumer",
            rome.clone(),
            Some(TokenFixture::new().used_by("paris")),
            Verdict::Deny(Denial::TokenUsed),
            "the invite token was already used".into(),
        ),
        (
            "Deny TokenIdMismatch: spec.tokenID names another request",
            rome.clone().token_id("zzz999"),
            Some(TokenFixture::new()),
            Verdict::Deny(Denial::TokenIdMismatch("zzz999".into())),
            r#"spec.tokenID "zzz999" does not name this request"#.into(),
        ),
        (
            "Deny BadProof: a proof made without the token's secret",
            rome.clone().proof(&tandem_core::invite::token_proof(
                "guessed",
                "rome",
                TOKEN_ID,
                &rome.csr,
            )),
            Some(TokenFixture::new()),
            Verdict::Deny(Denial::BadProof),
            "spec.tokenProof does not match the invite token".into(),
        ),
        (
            "Deny ClusterId: not a DNS label",
            RequestFixture::of("Rome"),
            Some(TokenFixture::new()),
            Verdict::Deny(Denial::ClusterId(ClusterIdError::Characters("Rome".into()))),
            r#"cluster ID "Rome" must consist of lower-case letters, digits and '-', and start and end with a letter or digit"#.into(),
        ),
        (
            "Deny SelfPeering: the provider's own cluster ID",
            RequestFixture::of(PROVIDER),
            Some(TokenFixture::new()),
            Verdict::Deny(Denial::SelfPeering),
            "a cluster cannot peer with itself".into(),
        ),
        (
            "Deny Csr: a CSR for another consumer's identity",
            rome.clone().csr(other_csr),
            Some(TokenFixture::new()),
            Verdict::Deny(Denial::Csr(CsrError::WrongSubject {
                user: "tandem:peer:rome".into(),
                group: other_group.clone(),
                common_names: vec!["tandem:peer:milan-2".into()],
                organizations: vec![other_group.clone()],
            })),
            format!(
                "spec.csr: subject must be CN=tandem:peer:rome, O={other_group}, the group of the key the request is signed with (got CN=[\"tandem:peer:milan-2\"], O=[\"{other_group}\"]; a consumer older than this provider files no key group: upgrade it)"
            ),
        ),
    ];
    for (case, request, token, want, message) in cases {
        let got = check(
            &request.build(),
            token.as_ref().map(|t| &t.0),
            PROVIDER,
            now(),
        );
        assert_eq!(got, want, "{case}");
        if let Verdict::Deny(why) = &got {
            assert_eq!(why.to_string(), message, "{case}");
        }
    }
}

fn tenant(key: Option<&str>) -> Tenant {
    let mut t = Tenant::new(
        "rome",
        serde_json::from_value(json!({"clusterID": "rome"})).unwrap(),
    );
    if let Some(k) = key {
        t.metadata.annotations =
            Some([(names::KEY_FINGERPRINT_ANNOTATION.to_string(), k.to_string())].into());
    }
    t
}

#[test]
fn an_identity_is_bound_to_its_first_key() {
    assert_eq!(
        key_refusal(None, "rome", "sha256:aa"),
        None,
        "first peering"
    );
    assert_eq!(
        key_refusal(Some(&tenant(Some("sha256:aa"))), "rome", "sha256:aa"),
        None,
        "the same key again (a re-peer)"
    );
    let other = key_refusal(Some(&tenant(Some("sha256:aa"))), "rome", "sha256:bb")
        .unwrap()
        .to_string();
    assert!(
        other.contains("under key sha256:aa") && other.contains("request's key is sha256:bb"),
        "{other}"
    );
    let unrecorded = key_refusal(Some(&tenant(None)), "rome", "sha256:bb")
        .unwrap()
        .to_string();
    assert!(unrecorded.contains("no key is recorded"), "{unrecorded}");
}

#[test]
fn key_refusal_table() {
    let cases: Vec<KeyCase> = vec![
        ("first peering: no Tenant yet", None, "sha256:aa", None, ""),
        (
            "a re-peer under the recorded key",
            Some(tenant(Some("sha256:aa"))),
            "sha256:aa",
            None,
            "",
        ),
        (
            "OtherKey: an impostor claiming a peered cluster ID",
            Some(tenant(Some("sha256:aa"))),
            "sha256:bb",
            Some(Denial::OtherKey {
                consumer: "rome".into(),
                recorded: "sha256:aa".into(),
                fingerprint: "sha256:bb".into(),
            }),
            "cluster ID rome already peers with this cluster under key sha256:aa (Tenant tandem-tenant-rome/rome); this request's key is sha256:bb. Cluster IDs are self-asserted, so it is refused; if the consumer really changed its key, its identity is re-keyed by this cluster's admin: `kubectl -n tandem-tenant-rome annotate tenant rome --overwrite tandem.dev/key-fingerprint=sha256:bb`",
        ),
        (
            "NoKeyRecorded: a Tenant older than recorded keys",
            Some(tenant(None)),
            "sha256:aa",
            Some(Denial::NoKeyRecorded {
                consumer: "rome".into(),
                fingerprint: "sha256:aa".into(),
            }),
            "cluster ID rome already peers with this cluster (Tenant tandem-tenant-rome/rome) and no key is recorded for it; this request's key is sha256:aa. The key is an admin's to record: `kubectl -n tandem-tenant-rome annotate tenant rome tandem.dev/key-fingerprint=sha256:aa`",
        ),
    ];
    for (case, tenant, key, want, message) in cases {
        let got = key_refusal(tenant.as_ref(), "rome", key);
        assert_eq!(got, want, "{case}");
        assert_eq!(
            got.map(|d| d.to_string()).unwrap_or_default(),
            message,
            "{case}"
        );
    }
}

#[test]
fn csr_checks() {
    let good = csr("tandem:peer:rome", "KEY");
    // The group of another key: a request cannot ask for the roles bound to another key.
    let other_key = names::peer_key_group(&crate::enroll::csr_key_fingerprint(&good).unwrap());
    // Flip a byte inside the base64 body: the signature no longer verifies (or the DER breaks).
    let mut tampered = good.clone().into_bytes();
    let i = tampered.len() / 2;
    tampered[i] = if tampered[i] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).unwrap();
    let cases: Vec<(&str, String, &str, Option<&str>)> = vec![
        ("valid", good.clone(), "rome", None),
        (
            "another consumer's name",
            good,
            "milan",
            Some("subject must be"),
        ),
        (
            "wrong group",
            csr("tandem:peer:rome", "system:masters"),
            "rome",
            Some("subject must be"),
        ),
        (
            "another key's group",
            csr("tandem:peer:rome", &other_key),
            "rome",
            Some("subject must be"),
        ),
        (
            "the group of an older consumer",
            csr("tandem:peer:rome", "tandem:peers"),
            "rome",
            Some("upgrade it"),
        ),
        (
            "admin name",
            csr("admin", "KEY"),
            "rome",
            Some("subject must be"),
        ),
        ("not PEM", "hello".into(), "rome", Some("not PEM")),
        ("tampered", tampered, "rome", Some("")),
    ];
    for (name, pem, consumer, want) in cases {
        match (check_csr(&pem, consumer), want) {
            (Ok(()), None) => {}
            (Err(e), Some(w)) => assert!(e.to_string().contains(w), "{name}: {e}"),
            (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn answered_requests_are_not_judged_again() {
    let pending = RequestFixture::of("rome").build();
    let cases = [
        ("new", pending.clone(), false),
        ("Approved", answered_request("Approved", 0), true),
        ("Denied", answered_request("Denied", 0), true),
        ("another phase", answered_request("Pending", 0), false),
    ];
    for (case, req, want) in cases {
        assert_eq!(answered(&req), want, "{case}");
    }
}

/// A CSR of the request in `ns`, with `conditions` and the `certificate` the signer issued.
fn filed_csr(
    ns: &str,
    conditions: &[&str],
    certificate: Option<&str>,
) -> CertificateSigningRequest {
    let mut req = RequestFixture::of("rome").build();
    req.metadata.namespace = Some(ns.into());
    let mut csr = csr_manifest(&req, None);
    csr.status = Some(CertificateSigningRequestStatus {
        conditions: Some(
            conditions
                .iter()
                .map(|t| CertificateSigningRequestCondition {
                    type_: t.to_string(),
                    status: "True".into(),
                    ..Default::default()
                })
                .collect(),
        ),
        certificate: certificate.map(|c| ByteString(c.as_bytes().to_vec())),
    });
    csr
}

#[test]
fn csr_progress_table() {
    let mut unfiled = filed_csr("tandem-system", &[], None);
    unfiled.status = None;
    let cases = [
        ("Approve: just filed", unfiled, CsrProgress::Approve),
        (
            "Approve: not approved yet",
            filed_csr("tandem-system", &[], None),
            CsrProgress::Approve,
        ),
        (
            "AwaitSigner: approved, not signed",
            filed_csr("tandem-system", &["Approved"], None),
            CsrProgress::AwaitSigner,
        ),
        (
            "AwaitSigner: an empty certificate is none",
            filed_csr("tandem-system", &["Approved"], Some("")),
            CsrProgress::AwaitSigner,
        ),
        (
            "Issued: the signer's certificate",
            filed_csr("tandem-system", &["Approved"], Some("PEM")),
            CsrProgress::Issued("PEM".into()),
        ),
    ];
    for (case, csr, want) in cases {
        assert_eq!(csr_progress(&csr), want, "{case}");
    }
}

#[test]
fn a_signed_csr_wakes_the_requests_of_its_namespace() {
    let mut unannotated = filed_csr("tandem-system", &["Approved"], Some("PEM"));
    unannotated.metadata.annotations = None;
    let cases = [
        (
            "signed, of this namespace",
            filed_csr("tandem-system", &["Approved"], Some("PEM")),
            true,
        ),
        (
            "approved, not signed",
            filed_csr("tandem-system", &["Approved"], None),
            false,
        ),
        (
            "signed, of the enrollment namespace",
            filed_csr("tandem-enroll", &["Approved"], Some("PEM")),
            false,
        ),
        ("signed, not a peering request's", unannotated, false),
    ];
    for (case, csr, want) in cases {
        assert_eq!(wakes(&csr, "tandem-system"), want, "{case}");
    }
}

#[test]
fn the_csr_asks_the_peer_signer_for_a_client_certificate() {
    let req = RequestFixture::of("rome").build();
    let csr = csr_manifest(&req, Some(Duration::from_secs(86400)));
    assert_eq!(
        csr.metadata.name.as_deref(),
        Some("tandem-peer-rome-abc123")
    );
    assert_eq!(
        csr.labels()
            .get(names::ORIGIN_CLUSTER_LABEL)
            .map(String::as_str),
        Some("rome")
    );
    assert_eq!(
        csr.annotations()
            .get(REQUEST_ANNOTATION)
            .map(String::as_str),
        Some("tandem-system/abc123")
    );
    assert_eq!(csr.spec.signer_name, crate::rbac::PEER_CSR_SIGNER);
    assert_eq!(csr.spec.request.0, req.spec.csr.as_bytes());
    assert_eq!(
        csr.spec.usages,
        Some(vec!["client auth".into(), "digital signature".into()])
    );
    assert_eq!(csr.spec.expiration_seconds, Some(86400));
    assert_eq!(
        csr_manifest(&req, None).spec.expiration_seconds,
        None,
        "the signer's default lifetime"
    );
    assert_eq!(
        approval(&req)["status"]["conditions"][0],
        json!({"type": "Approved", "status": "True", "reason": "TandemPeeringRequest",
               "message": "approved for peering request abc123"})
    );
}

#[test]
fn the_approval_names_the_identity_and_where_it_works() {
    let plain = approved_status("rome", "PEM", PROVIDER, &json!({}));
    assert_eq!(
        plain,
        json!({
            "phase": "Approved",
            "message": "peer identity tandem:peer:rome issued",
            "certificate": "PEM",
            "tenantNamespace": "tandem-tenant-rome",
            "providerClusterID": "milan",
        })
    );
    let extra = approved_status("rome", "PEM", PROVIDER, &json!({"policy": "open"}));
    assert_eq!(extra["policy"], "open", "the caller's fields are added");
    assert_eq!(extra["phase"], "Approved");
}

/// A node, Ready or not, with 4 CPUs, 8Gi and 110 pods, in `region`/`zone`.
fn node(name: &str, ready: bool, virtual_node: bool, zone: &str) -> Node {
    let mut labels = BTreeMap::from([
        (
            "topology.kubernetes.io/region".to_string(),
            "eu".to_string(),
        ),
        ("topology.kubernetes.io/zone".to_string(), zone.to_string()),
    ]);
    if virtual_node {
        labels.insert(
            names::NODE_TYPE_LABEL.into(),
            names::VIRTUAL_NODE_TYPE.into(),
        );
    }
    Node {
        metadata: kube::core::ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels),
            ..Default::default()
        },
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            allocatable: Some(
                [("cpu", "4"), ("memory", "8Gi"), ("pods", "110")]
                    .map(|(k, v)| (k.to_string(), Quantity(v.into())))
                    .into(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn a_new_consumer_is_offered_a_share_of_the_ready_real_nodes() {
    let grant = |pairs: [(&str, &str); 3]| -> BTreeMap<String, String> {
        pairs.map(|(k, v)| (k.to_string(), v.to_string())).into()
    };
    let eu = |zone: Option<&str>| -> BTreeMap<String, String> {
        let mut l = BTreeMap::from([(
            "topology.kubernetes.io/region".to_string(),
            "eu".to_string(),
        )]);
        if let Some(z) = zone {
            l.insert("topology.kubernetes.io/zone".into(), z.into());
        }
        l
    };
    // (case, nodes, share, grant, node labels).
    let cases = vec![
        (
            "half of two Ready nodes in one zone",
            vec![
                node("a", true, false, "eu-1"),
                node("b", true, false, "eu-1"),
            ],
            50,
            grant([("cpu", "4"), ("memory", "8192Mi"), ("pods", "110")]),
            eu(Some("eu-1")),
        ),
        (
            "nodes in two zones: only the region they agree on",
            vec![
                node("a", true, false, "eu-1"),
                node("b", true, false, "eu-2"),
            ],
            50,
            grant([("cpu", "4"), ("memory", "8192Mi"), ("pods", "110")]),
            eu(None),
        ),
        (
            "a node not Ready and a virtual node count for nothing",
            vec![
                node("a", true, false, "eu-1"),
                node("down", false, false, "eu-2"),
                node("tandem-rome", true, true, "eu-3"),
            ],
            25,
            grant([("cpu", "1"), ("memory", "2048Mi"), ("pods", "27")]),
            eu(Some("eu-1")),
        ),
        (
            "no Ready node: nothing granted, no labels",
            vec![node("down", false, false, "eu-1")],
            50,
            grant([("cpu", "0"), ("memory", "0Mi"), ("pods", "0")]),
            BTreeMap::new(),
        ),
    ];
    for (case, nodes, share, grant, labels) in cases {
        assert_eq!(
            offer(&nodes, share),
            Offer {
                grant,
                node_labels: labels
            },
            "{case}"
        );
    }
}

#[test]
fn cleanup_table() {
    const NOW: i64 = 1_000_000;
    let later = NOW + 60;
    let pending = RequestFixture::of("rome").build();
    let approved = answered_request("Approved", NOW - 120);
    let cases: Vec<CleanupCase> = vec![
        (
            "Keep: pending, unexpired",
            Some(pending.clone()),
            later,
            false,
            Cleanup::Keep,
            false,
            false,
        ),
        (
            "Keep: approved, not authenticated yet",
            Some(approved.clone()),
            later,
            false,
            Cleanup::Keep,
            false,
            false,
        ),
        (
            "Keep: an unused invite",
            None,
            later,
            false,
            Cleanup::Keep,
            false,
            false,
        ),
        (
            "Keep: denied within the grace",
            Some(answered_request("Denied", NOW - DENIED_GRACE_SECS)),
            later,
            false,
            Cleanup::Keep,
            false,
            false,
        ),
        (
            "RemoveAuthenticated: the consumer uses its identity",
            Some(approved.clone()),
            later,
            true,
            Cleanup::RemoveAuthenticated,
            true,
            false,
        ),
        (
            "RemoveExpired: with its request",
            Some(pending),
            NOW,
            false,
            Cleanup::RemoveExpired { request: true },
            true,
            true,
        ),
        (
            "RemoveExpired: authenticated, and expired",
            Some(approved),
            NOW - 1,
            true,
            Cleanup::RemoveExpired { request: true },
            true,
            true,
        ),
        (
            "RemoveExpired: never used",
            None,
            NOW - 1,
            false,
            Cleanup::RemoveExpired { request: false },
            false,
            true,
        ),
        (
            "RemoveDenied: denied past the grace, unexpired",
            Some(answered_request("Denied", NOW - DENIED_GRACE_SECS - 1)),
            later,
            false,
            Cleanup::RemoveDenied,
            true,
            true,
        ),
    ];
    for (case, request, expires, authenticated, want, request_gone, invite_gone) in cases {
        let got = cleanup(request.as_ref(), expires, authenticated, NOW);
        assert_eq!(got, want, "{case}");
        assert_eq!(
            (got.removes_request(), got.removes_invite()),
            (request_gone, invite_gone),
            "{case}"
        );
    }
}

#[test]
fn only_an_approved_requests_consumer_is_asked_about() {
    let approved = answered_request("Approved", 0);
    let denied = answered_request("Denied", 0);
    let pending = RequestFixture::of("rome").build();
    let cases = [
        (
            "approved, invite spent",
            Some(&approved),
            Some("rome"),
            Some("rome"),
        ),
        ("approved, invite not spent", Some(&approved), None, None),
        ("pending", Some(&pending), Some("rome"), None),
        ("denied", Some(&denied), Some("rome"), None),
        ("no request", None, Some("rome"), None),
    ];
    for (case, request, used_by, want) in cases {
        assert_eq!(to_authenticate(request, used_by), want, "{case}");
    }
}
