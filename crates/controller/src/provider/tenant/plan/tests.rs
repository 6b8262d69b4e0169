use super::*;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use tandem_api::provider::{PeeringRequestSpec, PeeringRequestStatus, RenewedIdentity};
use tandem_api::{TenantSpec, TenantStatus};

const TENANT_NS: &str = "tandem-tenant-rome";

fn at(second: i64) -> Time {
    Time(Timestamp::from_second(second).unwrap())
}

/// Rome's Tenant, as the reconciler meets it.
struct TenantFixture(Tenant);

impl TenantFixture {
    /// Just made: no finalizer, no annotation, no status.
    fn new() -> Self {
        let mut t = Tenant::new(
            "rome",
            TenantSpec {
                cluster_id: "rome".into(),
                ..Default::default()
            },
        );
        t.metadata.namespace = Some(TENANT_NS.into());
        t.metadata.generation = Some(1);
        TenantFixture(t)
    }

    fn finalized(mut self) -> Self {
        self.0.finalizers_mut().push(names::FINALIZER.into());
        self
    }

    /// Served: finalized and bound to a key.
    fn served() -> Self {
        Self::new()
            .finalized()
            .annotate(names::KEY_BOUND_ANNOTATION, "true")
    }

    fn deleting(mut self) -> Self {
        self.0.metadata.deletion_timestamp = Some(at(0));
        self
    }

    fn annotate(mut self, key: &str, value: &str) -> Self {
        self.0.annotations_mut().insert(key.into(), value.into());
        self
    }

    fn grant(mut self, resource: &str, value: &str) -> Self {
        self.0
            .spec
            .grant
            .insert(resource.into(), Quantity(value.into()));
        self
    }

    fn generation(mut self, generation: i64) -> Self {
        self.0.metadata.generation = Some(generation);
        self
    }

    /// Its `Ready` condition as last written, at second 1 for generation 1.
    fn ready(mut self, status: &str, reason: &str, message: &str) -> Self {
        self.0
            .status
            .get_or_insert_default()
            .conditions
            .push(Condition {
                type_: conditions::READY.into(),
                status: status.into(),
                reason: reason.into(),
                message: message.into(),
                observed_generation: Some(1),
                last_transition_time: at(1),
            });
        self
    }

    /// The certificate handed back at its last renewal.
    fn renewed(mut self, certificate: String) -> Self {
        self.0
            .status
            .get_or_insert_with(TenantStatus::default)
            .renewed_identity = Some(RenewedIdentity {
            request: "tandem-peer-renewal-rome-1".into(),
            certificate,
        });
        self
    }
}

/// A certificate issued to rome for `key`, expiring at `not_after`, with or without the
/// group of its key.
fn certificate(key: &rcgen::KeyPair, not_after: i64, key_group: bool) -> String {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.not_before = time::OffsetDateTime::from_unix_timestamp(not_after - 3600).unwrap();
    params.not_after = time::OffsetDateTime::from_unix_timestamp(not_after).unwrap();
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::CommonName, names::peer_user("rome"));
    if key_group {
        dn.push(
            rcgen::DnType::OrganizationName,
            names::peer_key_group(&fingerprint(key)),
        );
    }
    params.distinguished_name = dn;
    // Who signed it does not matter here: only its key, groups and expiry are read.
    params.self_signed(key).unwrap().pem()
}

fn fingerprint(key: &rcgen::KeyPair) -> String {
    crate::credentials::key_fingerprint_der(&rcgen::PublicKeyData::subject_public_key_info(key))
}

/// A peering request of `consumer`, answered with `certificate`.
fn request(consumer: &str, certificate: Option<String>) -> PeeringRequest {
    let mut r = PeeringRequest::new(
        "abcdef",
        PeeringRequestSpec {
            cluster_id: consumer.into(),
            ..Default::default()
        },
    );
    r.status = Some(PeeringRequestStatus {
        certificate,
        ..Default::default()
    });
    r
}

fn namespace(name: &str, deleting: bool) -> Namespace {
    let mut ns = Namespace::default();
    ns.metadata.name = Some(name.into());
    if deleting {
        ns.metadata.deletion_timestamp = Some(at(0));
    }
    ns
}

#[test]
fn next_step_table() {
    let cases = [
        (
            "AddFinalizer: new",
            TenantFixture::new(),
            Step::AddFinalizer,
        ),
        (
            "AddFinalizer: bound, finalizer removed by hand",
            TenantFixture::new().annotate(names::KEY_BOUND_ANNOTATION, "true"),
            Step::AddFinalizer,
        ),
        (
            "BindToIssuedKey: made before keys",
            TenantFixture::new().finalized(),
            Step::BindToIssuedKey,
        ),
        (
            "Serve: bound to its key",
            TenantFixture::served(),
            Step::Serve,
        ),
        (
            "Unpeer: deleted",
            TenantFixture::served().deleting(),
            Step::Unpeer,
        ),
        (
            "Unpeer: deleted before it was bound",
            TenantFixture::new().finalized().deleting(),
            Step::Unpeer,
        ),
        (
            "Gone: deleted and undone",
            TenantFixture::new().deleting(),
            Step::Gone,
        ),
    ];
    for (case, tenant, want) in cases {
        assert_eq!(next_step(&tenant.0), want, "{case}");
    }
}

#[test]
fn key_binding_table() {
    let key = rcgen::KeyPair::generate().unwrap();
    let older = rcgen::KeyPair::generate().unwrap();
    let admins = rcgen::KeyPair::generate().unwrap();
    let fp = fingerprint(&key);
    // Its newest certificate expires at T; the user name stays bound until then.
    const T: i64 = 1_800_000_000;
    let until = Timestamp::from_second(T).unwrap().to_string();
    let keyless_newest = vec![
        request("rome", Some(certificate(&older, T - 3600, false))),
        request("rome", Some(certificate(&key, T, false))),
    ];
    let cases: Vec<(&str, TenantFixture, Vec<PeeringRequest>, Binding)> = vec![
        (
            "NoCertificate: nothing issued on record",
            TenantFixture::new().finalized(),
            vec![request("rome", None)],
            Binding::NoCertificate,
        ),
        (
            "NoCertificate: certificates of other consumers only",
            TenantFixture::new().finalized(),
            vec![request("milan", Some(certificate(&key, T, false)))],
            Binding::NoCertificate,
        ),
        (
            "NoCertificate: what is on record is no certificate",
            TenantFixture::new().finalized().renewed("junk".into()),
            vec![],
            Binding::NoCertificate,
        ),
        (
            "Key: the newest keyless certificate, its user name bound until it expires",
            TenantFixture::new().finalized(),
            keyless_newest.clone(),
            Binding::Key {
                key: fp.clone(),
                record: true,
                user_bound_until: Some(until.clone()),
            },
        ),
        (
            "Key: renewed to a certificate carrying its key's group",
            TenantFixture::new()
                .finalized()
                .renewed(certificate(&key, T + 60, true)),
            keyless_newest.clone(),
            Binding::Key {
                key: fp.clone(),
                record: true,
                user_bound_until: None,
            },
        ),
        (
            "Key: the key the admin recorded, not the certificate's",
            TenantFixture::new()
                .finalized()
                .annotate(names::KEY_FINGERPRINT_ANNOTATION, &fingerprint(&admins)),
            vec![request("rome", Some(certificate(&key, T, true)))],
            Binding::Key {
                key: fingerprint(&admins),
                record: false,
                user_bound_until: Some(until.clone()),
            },
        ),
    ];
    for (case, tenant, requests, want) in cases {
        assert_eq!(key_binding(&tenant.0, &requests), want, "{case}");
    }
}

#[test]
fn binding_annotations_table() {
    let bound = || (names::KEY_BOUND_ANNOTATION.to_string(), "true".to_string());
    let cases = [
        (
            "NoCertificate: marked bound only",
            Binding::NoCertificate,
            BTreeMap::from([bound()]),
        ),
        (
            "Key: recorded, user name bound for a while",
            Binding::Key {
                key: "sha256:ab".into(),
                record: true,
                user_bound_until: Some("2027-01-15T08:00:00Z".into()),
            },
            BTreeMap::from([
                bound(),
                (names::KEY_FINGERPRINT_ANNOTATION.into(), "sha256:ab".into()),
                (
                    names::USER_BOUND_UNTIL_ANNOTATION.into(),
                    "2027-01-15T08:00:00Z".into(),
                ),
            ]),
        ),
        (
            "Key: on record already, by key only",
            Binding::Key {
                key: "sha256:ab".into(),
                record: false,
                user_bound_until: None,
            },
            BTreeMap::from([bound()]),
        ),
    ];
    for (case, binding, want) in cases {
        assert_eq!(binding.annotations(), want, "{case}");
    }
}

#[test]
fn grant_condition_table() {
    const VALID: &str = "the grant is in force";
    let negative = "spec.grant.cpu: Invalid value: \"-5\": must be greater than or equal to 0; \
                    the last valid grant stays in force";
    // (case, Tenant, Ready's (status, reason, message, transition) once written, or None)
    type Want<'a> = Option<(&'a str, &'a str, &'a str, i64)>;
    let cases: Vec<(&str, TenantFixture, Want)> = vec![
        (
            "first report: in force",
            TenantFixture::served()
                .grant("cpu", "4")
                .grant("pods", "110"),
            Some(("True", "GrantValid", VALID, 50)),
        ),
        (
            "an edit the API server let through is named",
            TenantFixture::served()
                .grant("cpu", "-5")
                .ready("True", "GrantValid", VALID),
            Some(("False", "InvalidGrant", negative, 50)),
        ),
        (
            "a new generation is recorded, no new transition",
            TenantFixture::served()
                .grant("cpu", "4")
                .generation(2)
                .ready("True", "GrantValid", VALID),
            Some(("True", "GrantValid", VALID, 1)),
        ),
        (
            "said already: nothing written",
            TenantFixture::served()
                .grant("cpu", "4")
                .ready("True", "GrantValid", VALID),
            None,
        ),
        (
            "still invalid: nothing written",
            TenantFixture::served()
                .grant("cpu", "-5")
                .ready("False", "InvalidGrant", negative),
            None,
        ),
    ];
    for (case, tenant, want) in cases {
        let got = grant_conditions(&tenant.0, &at(50));
        let ready = got.as_ref().map(|conds| {
            assert_eq!(conds.len(), 1, "{case}: one condition");
            let c = &conds[0];
            assert_eq!(c.type_, conditions::READY, "{case}");
            assert_eq!(
                c.observed_generation, tenant.0.metadata.generation,
                "{case}"
            );
            (
                c.status.as_str(),
                c.reason.as_str(),
                c.message.as_str(),
                c.last_transition_time.0.as_second(),
            )
        });
        assert_eq!(ready, want, "{case}");
    }
}

#[test]
fn requeue_table() {
    const NOW: i64 = 1_800_000_000;
    let until = |s: i64| Timestamp::from_second(s).unwrap().to_string();
    let cases = [
        ("no grace", TenantFixture::served(), None),
        (
            "grace ends in an hour: just after it",
            TenantFixture::served()
                .annotate(names::USER_BOUND_UNTIL_ANNOTATION, &until(NOW + 3600)),
            Some(Duration::from_secs(3601)),
        ),
        (
            "grace ends now",
            TenantFixture::served().annotate(names::USER_BOUND_UNTIL_ANNOTATION, &until(NOW)),
            None,
        ),
        (
            "grace ended",
            TenantFixture::served().annotate(names::USER_BOUND_UNTIL_ANNOTATION, &until(NOW - 5)),
            None,
        ),
        (
            "unreadable",
            TenantFixture::served().annotate(names::USER_BOUND_UNTIL_ANNOTATION, "tomorrow"),
            None,
        ),
    ];
    for (case, tenant, want) in cases {
        assert_eq!(
            requeue_after(&tenant.0, Timestamp::from_second(NOW).unwrap()),
            want,
            "{case}"
        );
    }
}

#[test]
fn revocation_table() {
    let twin_bindings: Vec<Revocation> = crate::provider::remote_namespace::peer_bindings()
        .map(|name| Revocation::RoleBinding {
            namespace: "shop-rome".into(),
            name: name.into(),
        })
        .collect();
    assert!(
        twin_bindings.len() > 1,
        "the twin role and each pod capability"
    );
    let cases = [
        (
            "RenewalBinding and the tenant namespace's RoleBinding go first",
            revocations("rome", TENANT_NS),
            vec![
                Revocation::RenewalBinding {
                    name: crate::rbac::peer_renewal_binding("rome"),
                },
                Revocation::RoleBinding {
                    namespace: TENANT_NS.into(),
                    name: PEER_ROLE_BINDING.into(),
                },
            ],
        ),
        (
            "RoleBinding: every peer binding of a twin namespace",
            twin_revocations("shop-rome", TENANT_NS),
            twin_bindings,
        ),
        (
            "the tenant namespace among the twins: revoked first already",
            twin_revocations(TENANT_NS, TENANT_NS),
            vec![],
        ),
    ];
    for (case, got, want) in cases {
        assert_eq!(got, want, "{case}");
    }
}

#[test]
fn twin_table() {
    let fp = "sha256:0123";
    let cases = [
        (
            "DeleteUnlessHoldingData: claims are data",
            TenantFixture::served()
                .deleting()
                .annotate(names::KEY_FINGERPRINT_ANNOTATION, fp),
            namespace("shop-rome", false),
            Ok(TwinStep::DeleteUnlessHoldingData {
                key: Some(fp.into()),
            }),
        ),
        (
            "DeleteUnlessHoldingData: no key on record",
            TenantFixture::served().deleting(),
            namespace("shop-rome", false),
            Ok(TwinStep::DeleteUnlessHoldingData { key: None }),
        ),
        (
            "Delete: unpeered with --delete-data",
            TenantFixture::served()
                .deleting()
                .annotate(names::DELETE_DATA_ANNOTATION, "true")
                .annotate(names::KEY_FINGERPRINT_ANNOTATION, fp),
            namespace("shop-rome", false),
            Ok(TwinStep::Delete),
        ),
        (
            "TenantNamespace: goes last",
            TenantFixture::served()
                .deleting()
                .annotate(names::DELETE_DATA_ANNOTATION, "true"),
            namespace(TENANT_NS, false),
            Err(Spared::TenantNamespace),
        ),
        (
            "Deleting: already going",
            TenantFixture::served().deleting(),
            namespace("shop-rome", true),
            Err(Spared::Deleting),
        ),
    ];
    for (case, tenant, ns, want) in cases {
        assert_eq!(twin(&tenant.0, &ns, TENANT_NS), want, "{case}");
    }
}

#[test]
fn used_invites_are_the_consumers_own() {
    let invite = |token: &str, used_by: Option<&str>| InviteInfo {
        token_id: token.into(),
        expires: 0,
        used_by: used_by.map(str::to_string),
    };
    let invites = [
        invite("aaaaaa", Some("rome")),
        invite("bbbbbb", Some("milan")),
        invite("cccccc", None),
        invite("dddddd", Some("rome")),
    ];
    assert_eq!(used_invites(&invites, "rome"), ["aaaaaa", "dddddd"]);
    assert!(used_invites(&invites, "turin").is_empty());
}

#[test]
fn closing_table() {
    let cases = [
        (
            "consuming from the peer too: only what its Tenant was given goes",
            true,
            vec![
                (Closing::PeerRoleBinding, "deleting the peer's RoleBinding"),
                (
                    Closing::NetworkParameters("consumer"),
                    "deleting the NetworkParameters",
                ),
                (
                    Closing::NetworkParameters("provider"),
                    "deleting the NetworkParameters",
                ),
                (
                    Closing::FenceLease(names::FENCE_LEASE),
                    "deleting the fence Leases",
                ),
                (
                    Closing::FenceLease(names::FENCE_NONCE_LEASE),
                    "deleting the fence Leases",
                ),
                (
                    Closing::ControllerRoleBinding,
                    "deleting the controller's RoleBinding",
                ),
            ],
        ),
        (
            "provider only: the tenant namespace goes",
            false,
            vec![(Closing::TenantNamespace, "deleting the tenant namespace")],
        ),
    ];
    for (case, consumes_from_peer, want) in cases {
        let got: Vec<_> = closing(consumes_from_peer)
            .into_iter()
            .map(|c| (c, c.step()))
            .collect();
        assert_eq!(got, want, "{case}");
    }
}
