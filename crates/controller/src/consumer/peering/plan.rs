//! The Peering reconciler's decisions, pure: what to do next with a Peering, what the
//! provider's answers mean as of a given time, and the status they lead to. The parent module
//! reads the objects, asks the provider and writes what these functions decide.

use tandem_api::conditions::{self, ConditionStatus};
use tandem_api::provider::PeeringRequestStatus;
use tandem_api::{Peering, PeeringRequest, PeeringStatus, Tenant, names};
use tandem_core::invite::human_duration;

/// The reconciler's next step for a Peering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// Deleted, but its virtual kubelet still runs and would recreate the node: wait for the
    /// supervisor to stop it (it drops the links of deleted Peerings).
    WaitForLinkToStop,
    /// Deleted: undo the peering, then remove the finalizer.
    Unpeer,
    /// Deleted and already undone: nothing left to do.
    Gone,
    /// New: add the finalizer before anything else, so that unpeering always runs.
    AddFinalizer,
    /// Refused: stays refused (`tandem peer` reports it and cleans up).
    StayFailed,
    /// Not authenticated yet: file or read the peering request.
    Authenticate,
    /// Authenticated: keep the grant and the network parameters current.
    Negotiate,
}

/// What to do next with `peering`; `link_running` tells whether its virtual kubelet runs.
pub(super) fn next_step(peering: &Peering, link_running: bool) -> Step {
    let has_finalizer = peering
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == names::FINALIZER);
    let status = peering.status.clone().unwrap_or_default();
    match (peering.metadata.deletion_timestamp.is_some(), has_finalizer) {
        (true, false) => Step::Gone,
        (true, true) if link_running => Step::WaitForLinkToStop,
        (true, true) => Step::Unpeer,
        (false, false) => Step::AddFinalizer,
        (false, true) if conditions::is_true(&status.conditions, conditions::AUTHENTICATED) => {
            Step::Negotiate
        }
        (false, true) if status.phase.as_deref() == Some("Failed") => Step::StayFailed,
        (false, true) => Step::Authenticate,
    }
}

/// Why authenticating with the provider failed: the reason of the `Authenticated` condition,
/// which `tandem peer` reads back to choose its hint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthFailureReason {
    /// This cluster's API failed us (transient).
    LocalError,
    /// The Secret holding the invite's token is gone.
    InviteMissing,
    /// The invite's token, endpoint or CA is malformed.
    InviteInvalid,
    /// The provider no longer accepts the token because the invite expired.
    InviteExpired,
    /// The provider does not know the token (wrong or revoked).
    TokenRejected,
    /// The token was already used (by this or another cluster).
    TokenUsed,
    /// The provider answered the request with an unexpected error (transient).
    RequestFailed,
    /// The provider did not answer (transient).
    ProviderUnreachable,
    /// This cluster could not make its certificate request.
    Csr,
    /// The provider's controller denied the request.
    Denied,
    /// The endpoint answered as another cluster than the invite names.
    WrongProvider,
    /// The peer identity Secret is gone or unusable.
    IdentityMissing,
    /// The provider's queue of pending requests (filed without an invite) is full (transient).
    QueueFull,
    /// The provider removed the filed request before this cluster read an answer: denied,
    /// expired unapproved, or approved and left unused past the provider's grace. Which of
    /// them, this cluster cannot tell.
    RequestRemoved,
}

impl AuthFailureReason {
    const ALL: [AuthFailureReason; 14] = [
        AuthFailureReason::LocalError,
        AuthFailureReason::InviteMissing,
        AuthFailureReason::InviteInvalid,
        AuthFailureReason::InviteExpired,
        AuthFailureReason::TokenRejected,
        AuthFailureReason::TokenUsed,
        AuthFailureReason::RequestFailed,
        AuthFailureReason::ProviderUnreachable,
        AuthFailureReason::Csr,
        AuthFailureReason::Denied,
        AuthFailureReason::WrongProvider,
        AuthFailureReason::IdentityMissing,
        AuthFailureReason::QueueFull,
        AuthFailureReason::RequestRemoved,
    ];

    /// The condition reason.
    pub fn as_str(self) -> &'static str {
        match self {
            AuthFailureReason::LocalError => "LocalError",
            AuthFailureReason::InviteMissing => "InviteMissing",
            AuthFailureReason::InviteInvalid => "InviteInvalid",
            AuthFailureReason::InviteExpired => "InviteExpired",
            AuthFailureReason::TokenRejected => "TokenRejected",
            AuthFailureReason::TokenUsed => "TokenUsed",
            AuthFailureReason::RequestFailed => "RequestFailed",
            AuthFailureReason::ProviderUnreachable => "ProviderUnreachable",
            AuthFailureReason::Csr => "CSR",
            AuthFailureReason::Denied => "Denied",
            AuthFailureReason::WrongProvider => "WrongProvider",
            AuthFailureReason::IdentityMissing => "IdentityMissing",
            AuthFailureReason::QueueFull => "QueueFull",
            AuthFailureReason::RequestRemoved => "RequestRemoved",
        }
    }

    /// The reason a condition's reason stands for.
    pub fn from_reason(reason: &str) -> Option<AuthFailureReason> {
        Self::ALL.into_iter().find(|r| r.as_str() == reason)
    }
}

/// The step of the invite flow that failed, and whether retrying may help.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct AuthFailure {
    pub reason: AuthFailureReason,
    pub message: String,
    pub permanent: bool,
}

impl AuthFailure {
    pub fn permanent(reason: AuthFailureReason, message: impl Into<String>) -> Self {
        AuthFailure {
            reason,
            message: message.into(),
            permanent: true,
        }
    }
    pub fn transient(reason: AuthFailureReason, message: impl Into<String>) -> Self {
        AuthFailure {
            reason,
            message: message.into(),
            permanent: false,
        }
    }
}

/// The invite's token as the provider's answers are judged against it.
pub(super) struct Token<'a> {
    pub id: &'a str,
    pub endpoint: &'a str,
    /// When the invite expires (Unix seconds), if the token Secret says.
    pub expires: Option<i64>,
}

/// What the provider's answer to the token at `step` ("reading", "filing") means at `now`
/// (Unix seconds): `code` is the HTTP status (none when it did not answer), `error` the
/// client's error, `used` what a 403 means at this step.
pub(super) fn token_refusal(
    code: Option<u16>,
    error: &str,
    step: &str,
    used: &str,
    token: &Token,
    now: i64,
) -> AuthFailure {
    match code {
        Some(401) => match token.expires {
            Some(exp) if exp <= now => AuthFailure::permanent(
                AuthFailureReason::InviteExpired,
                format!(
                    "provider rejected the token: the invite expired {} ago",
                    human_duration(now - exp)
                ),
            ),
            _ => AuthFailure::permanent(
                AuthFailureReason::TokenRejected,
                "provider rejected the token (401 Unauthorized): the provider does not know this token (wrong or revoked)",
            ),
        },
        Some(403) => AuthFailure::permanent(
            AuthFailureReason::TokenUsed,
            format!("provider rejected the token: {used}; ask the provider for a new invite"),
        ),
        Some(_) => AuthFailure::transient(
            AuthFailureReason::RequestFailed,
            format!("{step} PeeringRequest {}: {error}", token.id),
        ),
        None => AuthFailure::transient(
            AuthFailureReason::ProviderUnreachable,
            format!("provider unreachable at {}: {error}", token.endpoint),
        ),
    }
}

/// The condition reason of a request filed with the enrollment credential that waits for the
/// provider's approval.
pub(super) const AWAITING_APPROVAL: &str = "AwaitingApproval";

/// What the provider's answer to the enrollment credential at `step` ("reading", "filing")
/// means: `code` is the HTTP status (none when it did not answer).
pub(super) fn enrollment_refusal(
    code: Option<u16>,
    error: &str,
    step: &str,
    request: &str,
    endpoint: &str,
) -> AuthFailure {
    match code {
        Some(401) => AuthFailure::permanent(
            AuthFailureReason::TokenRejected,
            "provider rejected the enrollment credential (401 Unauthorized): it no longer takes requests without an invite, or replaced its credential; run `tandem discover` again",
        ),
        Some(403) if error.contains("exceeded quota") => AuthFailure::transient(
            AuthFailureReason::QueueFull,
            format!("the provider's queue of pending peering requests is full ({error}); retrying"),
        ),
        Some(403) => AuthFailure::permanent(
            AuthFailureReason::TokenRejected,
            format!(
                "provider refused the enrollment credential at {step} PeeringRequest {request}: {error}"
            ),
        ),
        Some(_) => AuthFailure::transient(
            AuthFailureReason::RequestFailed,
            format!("{step} PeeringRequest {request}: {error}"),
        ),
        None => AuthFailure::transient(
            AuthFailureReason::ProviderUnreachable,
            format!("provider unreachable at {endpoint}: {error}"),
        ),
    }
}

/// The refusal of a token whose peering request another cluster filed.
pub(super) fn used_by_another_cluster() -> AuthFailure {
    AuthFailure::permanent(
        AuthFailureReason::TokenUsed,
        "provider rejected the token: token already used by another cluster; ask the provider for a new invite",
    )
}

/// What the peering request found under this cluster's request name is.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Existing {
    /// This cluster's.
    Ours,
    /// Under the name this cluster's key owns, but not this cluster's: for another key (or one
    /// its CSR does not prove), or our CSR filed again with another claim or a bad proof. Filed
    /// by another holder of the public enrollment credential; the provider removes it (at once
    /// when the key does not match its name, after denying it otherwise).
    Decoy,
    /// The invite's request, filed by another cluster: the token is used.
    OtherCluster,
}

/// This cluster's filing through discovery: the name its key owns, the enrollment credential
/// it files with, and the UID of the request it recorded as filed.
pub(super) struct Enrolled<'a> {
    pub name: &'a str,
    pub token_id: &'a str,
    pub token_secret: &'a str,
    pub filed: Option<&'a str>,
}

/// Classifies `request`, found on the provider under this cluster's request name; `enrolled`
/// when peering through discovery.
pub(super) fn existing_request(
    request: &PeeringRequest,
    consumer: &str,
    enrolled: Option<&Enrolled<'_>>,
) -> Existing {
    // Through discovery every request under this name that is not ours is a decoy, whatever it
    // claims: one read before the provider removed or denied it must not fail this peering for
    // good. Ours is the one recorded as filed, or one as this cluster files it: its key (the CSR
    // proves it), its cluster ID, and a token and protocol the provider takes from it — not our
    // CSR, readable under our name, filed again with a claim or a proof the provider denies.
    if let Some(own) = enrolled {
        let spec = &request.spec;
        let recorded = own
            .filed
            .is_some_and(|uid| request.metadata.uid.as_deref() == Some(uid));
        // Only when not recorded: it verifies the CSR's signature and the proof, and the
        // recorded request is read on every poll for the provider's answer.
        let as_filed = || {
            crate::credentials::csr_key_fingerprint(&spec.csr)
                .is_some_and(|fp| crate::credentials::request_name(&fp) == own.name)
                && spec.cluster_id == consumer
                && spec.token_id == own.token_id
                && tandem_core::invite::verify_token_proof(
                    own.token_secret,
                    consumer,
                    own.token_id,
                    &spec.csr,
                    &spec.token_proof,
                )
                && spec.protocol_version == Some(tandem_core::protocol::VERSION)
        };
        return if recorded || as_filed() {
            Existing::Ours
        } else {
            Existing::Decoy
        };
    }
    if request.spec.cluster_id == consumer {
        Existing::Ours
    } else {
        Existing::OtherCluster
    }
}

/// What the provider's answer to the peering request means.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    Pending,
    Approved,
    Refused(AuthFailure),
}

/// Judges the status of our peering request on `provider`.
pub(super) fn request_verdict(answer: &PeeringRequestStatus, provider: &str) -> Verdict {
    match answer.phase.as_deref() {
        Some("Denied") => Verdict::Refused(AuthFailure::permanent(
            AuthFailureReason::Denied,
            format!(
                "provider denied the peering request: {}",
                answer.message.clone().unwrap_or_default()
            ),
        )),
        Some("Approved") if answer.provider_cluster_id.as_deref() != Some(provider) => {
            Verdict::Refused(AuthFailure::permanent(
                AuthFailureReason::WrongProvider,
                format!(
                    "the endpoint answered as cluster {:?}, not {provider:?}: the invite does not match its endpoint",
                    answer.provider_cluster_id.clone().unwrap_or_default()
                ),
            ))
        }
        Some("Approved") => Verdict::Approved,
        _ => Verdict::Pending,
    }
}

/// The provider's answer to reading our Tenant.
#[derive(Debug)]
pub(super) enum TenantAnswer {
    Found(Box<Tenant>),
    /// The provider answered that it is gone or no longer ours to read (it unpeered us).
    Gone(String),
    /// The provider did not answer.
    Unreachable(String),
}

/// Where a peering's Tenant lives, for messages.
pub(super) struct Place<'a> {
    pub provider: &'a str,
    pub consumer: &'a str,
    pub remote_namespace: &'a str,
    pub endpoint: &'a str,
}

/// Takes the provider's answer about our Tenant into `status`: the grant (the last valid one
/// stays when the new one is invalid), its labels, and the conditions saying so. Returns
/// whether negotiation goes on (the provider answered).
pub(super) fn apply_tenant_answer(
    status: &mut PeeringStatus,
    answer: &TenantAnswer,
    place: &Place,
) -> bool {
    let Place {
        provider,
        consumer,
        remote_namespace,
        endpoint,
    } = place;
    let answered = |status: &mut PeeringStatus| {
        set(
            status,
            conditions::PROVIDER_REACHABLE,
            true,
            "Answered",
            "the provider's API answers",
        )
    };
    match answer {
        TenantAnswer::Found(t) => {
            answered(status);
            status.node_labels = t.spec.node_labels.clone();
            if let Err(problem) = crate::input::grant(&t.spec.grant) {
                // Keep the last valid grant: the virtual node never shows what is not a
                // quantity, and a typo on the provider does not take its capacity away.
                set(
                    status,
                    conditions::RESOURCES_GRANTED,
                    false,
                    "InvalidGrant",
                    &format!(
                        "Tenant {remote_namespace}/{consumer} on {provider}: {problem}; keeping the last valid grant"
                    ),
                );
            } else if t.spec.grant.is_empty() {
                status.granted.clear();
                set(
                    status,
                    conditions::RESOURCES_GRANTED,
                    false,
                    "Revoked",
                    "the provider grants nothing",
                );
            } else {
                status.granted = t.spec.grant.clone();
                let summary: Vec<String> = t
                    .spec
                    .grant
                    .iter()
                    .map(|(k, v)| format!("{k}={}", v.0))
                    .collect();
                set(
                    status,
                    conditions::RESOURCES_GRANTED,
                    true,
                    "Granted",
                    &summary.join(", "),
                );
            }
            true
        }
        TenantAnswer::Gone(error) => {
            answered(status);
            set(
                status,
                conditions::RESOURCES_GRANTED,
                false,
                "TenantGone",
                &format!(
                    "the provider no longer has our Tenant ({error}); it unpeered us — `tandem unpeer {provider}`"
                ),
            );
            status.granted.clear();
            true
        }
        TenantAnswer::Unreachable(error) => {
            set(
                status,
                conditions::PROVIDER_REACHABLE,
                false,
                "Unreachable",
                &format!("provider unreachable at {endpoint}: {error}"),
            );
            false
        }
    }
}

/// The phase of an authenticated Peering: Established once authenticated, granted and with
/// the network negotiated, else Negotiating.
pub(super) fn negotiated_phase(status: &PeeringStatus) -> &'static str {
    let established = [
        conditions::AUTHENTICATED,
        conditions::RESOURCES_GRANTED,
        conditions::NETWORK_NEGOTIATED,
    ]
    .iter()
    .all(|c| conditions::is_true(&status.conditions, c));
    if established {
        "Established"
    } else {
        "Negotiating"
    }
}

/// Sets condition `type_` of a Peering (no observed generation: the status is not about the spec).
pub(super) fn set(status: &mut PeeringStatus, type_: &str, ok: bool, reason: &str, message: &str) {
    conditions::set_condition(
        &mut status.conditions,
        type_,
        ConditionStatus::from(ok),
        reason,
        message,
        None,
    );
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use tandem_api::TenantSpec;

    use super::*;

    /// A Peering with `milan`, built up by the cases below.
    struct PeeringFixture(Peering);

    impl PeeringFixture {
        fn new() -> Self {
            PeeringFixture(Peering::new("milan", Default::default()))
        }
        fn finalized(mut self) -> Self {
            self.0.metadata.finalizers = Some(vec![names::FINALIZER.into()]);
            self
        }
        fn deleted(mut self) -> Self {
            self.0.metadata.deletion_timestamp =
                Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
            self
        }
        fn phase(mut self, phase: &str) -> Self {
            self.0.status.get_or_insert_default().phase = Some(phase.into());
            self
        }
        fn authenticated(mut self) -> Self {
            set(
                self.0.status.get_or_insert_default(),
                conditions::AUTHENTICATED,
                true,
                "IdentityIssued",
                "",
            );
            self
        }
    }

    #[test]
    fn next_step_table() {
        let cases = [
            ("new", PeeringFixture::new(), false, Step::AddFinalizer),
            (
                "finalized",
                PeeringFixture::new().finalized(),
                false,
                Step::Authenticate,
            ),
            (
                "authenticating",
                PeeringFixture::new().finalized().phase("Authenticating"),
                false,
                Step::Authenticate,
            ),
            (
                "refused stays refused",
                PeeringFixture::new().finalized().phase("Failed"),
                false,
                Step::StayFailed,
            ),
            (
                "authenticated negotiates",
                PeeringFixture::new().finalized().authenticated(),
                true,
                Step::Negotiate,
            ),
            (
                "deleted while its kubelet runs",
                PeeringFixture::new().finalized().authenticated().deleted(),
                true,
                Step::WaitForLinkToStop,
            ),
            (
                "deleted",
                PeeringFixture::new().finalized().authenticated().deleted(),
                false,
                Step::Unpeer,
            ),
            (
                "a refused peering deleted is undone too",
                PeeringFixture::new().finalized().phase("Failed").deleted(),
                false,
                Step::Unpeer,
            ),
            ("undone", PeeringFixture::new().deleted(), false, Step::Gone),
        ];
        for (name, p, link_running, want) in cases {
            assert_eq!(next_step(&p.0, link_running), want, "{name}");
        }
    }

    #[test]
    fn token_refusals_read_the_clock_they_are_given() {
        const NOW: i64 = 1_000_000;
        let token = |expires| Token {
            id: "abc123",
            endpoint: "https://milan:6443",
            expires,
        };
        // (case, HTTP status, expiry, reason, permanent, the message says)
        type Case = (
            &'static str,
            Option<u16>,
            Option<i64>,
            AuthFailureReason,
            bool,
            &'static str,
        );
        let cases: [Case; 6] = [
            (
                "401, expired 3 minutes ago",
                Some(401),
                Some(NOW - 180),
                AuthFailureReason::InviteExpired,
                true,
                "expired 3m ago",
            ),
            (
                "401, expiring this very second",
                Some(401),
                Some(NOW),
                AuthFailureReason::InviteExpired,
                true,
                "expired",
            ),
            (
                "401, still valid",
                Some(401),
                Some(NOW + 60),
                AuthFailureReason::TokenRejected,
                true,
                "wrong or revoked",
            ),
            (
                "401, no expiry known",
                Some(401),
                None,
                AuthFailureReason::TokenRejected,
                true,
                "wrong or revoked",
            ),
            (
                "403",
                Some(403),
                Some(NOW + 60),
                AuthFailureReason::TokenUsed,
                true,
                "token already used",
            ),
            (
                "no answer",
                None,
                Some(NOW - 180),
                AuthFailureReason::ProviderUnreachable,
                false,
                "unreachable at https://milan:6443",
            ),
        ];
        for (name, code, expires, reason, permanent, says) in cases {
            let f = token_refusal(
                code,
                "the error",
                "filing",
                "token already used",
                &token(expires),
                NOW,
            );
            assert_eq!((f.reason, f.permanent), (reason, permanent), "{name}");
            assert!(f.message.contains(says), "{name}: {}", f.message);
        }
        let other = token_refusal(Some(500), "boom", "reading", "", &token(None), NOW);
        assert_eq!(other.reason, AuthFailureReason::RequestFailed);
        assert!(!other.permanent);
        assert_eq!(other.message, "reading PeeringRequest abc123: boom");
    }

    #[test]
    fn request_verdict_table() {
        let answer = |phase: Option<&str>, provider: Option<&str>| PeeringRequestStatus {
            phase: phase.map(String::from),
            provider_cluster_id: provider.map(String::from),
            message: Some("not on Sundays".into()),
            ..Default::default()
        };
        let reason = |v: Verdict| match v {
            Verdict::Refused(f) => Some(f.reason),
            _ => None,
        };
        assert_eq!(
            request_verdict(&answer(None, None), "milan"),
            Verdict::Pending
        );
        assert_eq!(
            request_verdict(&answer(Some("Approved"), Some("milan")), "milan"),
            Verdict::Approved
        );
        assert_eq!(
            reason(request_verdict(
                &answer(Some("Approved"), Some("turin")),
                "milan"
            )),
            Some(AuthFailureReason::WrongProvider)
        );
        let denied = request_verdict(&answer(Some("Denied"), Some("milan")), "milan");
        assert!(
            matches!(&denied, Verdict::Refused(f) if f.reason == AuthFailureReason::Denied
                && f.message.ends_with("not on Sundays")),
            "{denied:?}"
        );
    }

    #[test]
    fn a_decoy_under_our_name_is_waited_out_whatever_it_claims() {
        const TOKEN_ID: &str = "abcdef";
        const SECRET: &str = "0123456789abcdef";
        // A request as `cluster` files it (its CSR, under a fresh key; the proof; the protocol
        // version), with the name that key owns.
        let filed = |cluster: &str| {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, names::peer_user(cluster));
            let csr = params.serialize_request(&key).unwrap().pem().unwrap();
            let name = crate::credentials::request_name(
                &crate::credentials::csr_key_fingerprint(&csr).expect("a P-256 CSR"),
            );
            let proof = tandem_core::invite::token_proof(SECRET, cluster, TOKEN_ID, &csr);
            let request: PeeringRequest = serde_json::from_value(serde_json::json!({
                "apiVersion": "tandem.dev/v1alpha1", "kind": "PeeringRequest",
                "metadata": {"name": name, "namespace": names::ENROLL_NAMESPACE, "uid": "u-1"},
                "spec": {"clusterID": cluster, "tokenID": TOKEN_ID, "tokenProof": proof,
                         "csr": csr, "protocolVersion": tandem_core::protocol::VERSION},
            }))
            .unwrap();
            (request, name)
        };
        let (ours, our_name) = filed("rome");
        let (eves, _) = filed("eve");
        let (romes_other_key, _) = filed("rome");
        let enrolled = |filed: Option<&'static str>| Enrolled {
            name: "",
            token_id: TOKEN_ID,
            token_secret: SECRET,
            filed,
        };
        let own = Enrolled {
            name: &our_name,
            ..enrolled(None)
        };
        let own = Some(&own);
        assert_eq!(existing_request(&ours, "rome", own), Existing::Ours);
        // Another key under our name: waited out, whichever cluster it claims.
        assert_eq!(existing_request(&eves, "rome", own), Existing::Decoy);
        assert_eq!(
            existing_request(&romes_other_key, "rome", own),
            Existing::Decoy
        );
        // Our CSR (readable under our name) filed again: claiming another cluster, with a proof
        // or a protocol version the provider denies, or with a signature that does not verify.
        let changed = |change: &dyn Fn(&mut PeeringRequest)| {
            let mut r = ours.clone();
            change(&mut r);
            existing_request(&r, "rome", own)
        };
        assert_eq!(
            changed(&|r| r.spec.cluster_id = "eve".into()),
            Existing::Decoy
        );
        assert_eq!(
            changed(&|r| r.spec.token_proof = "00".repeat(32)),
            Existing::Decoy
        );
        assert_eq!(
            changed(&|r| r.spec.protocol_version = Some(999)),
            Existing::Decoy
        );
        assert_eq!(
            changed(&|r| r.spec.csr = crate::credentials::with_broken_signature(&r.spec.csr)),
            Existing::Decoy
        );
        assert_eq!(
            changed(&|r| r.spec.csr = "not a CSR".into()),
            Existing::Decoy
        );
        // The request recorded as filed is ours, whatever it says (filed by an older build).
        let recorded = Enrolled {
            name: &our_name,
            ..enrolled(Some("u-1"))
        };
        let mut older = ours.clone();
        older.spec.protocol_version = None;
        assert_eq!(
            existing_request(&older, "rome", Some(&recorded)),
            Existing::Ours
        );
        assert_eq!(existing_request(&older, "rome", own), Existing::Decoy);
        // An invite's request (its name is the token's ID): another cluster's means used.
        assert_eq!(
            existing_request(&eves, "rome", None),
            Existing::OtherCluster
        );
        assert_eq!(existing_request(&ours, "rome", None), Existing::Ours);
    }

    fn tenant(grant: &[(&str, &str)]) -> Tenant {
        Tenant::new(
            "rome",
            TenantSpec {
                cluster_id: "rome".into(),
                grant: grant
                    .iter()
                    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                    .collect(),
                node_labels: BTreeMap::new(),
                pod_access: None,
                service_import_namespaces: None,
                allowed_namespace_mapping_strategies: None,
                allowed_pod_offloading_strategies: None,
                pod_security: None,
                max_twin_namespaces: None,
                allowed_service_types: None,
                storage_classes: None,
                pod_resources: None,
            },
        )
    }

    fn condition(status: &PeeringStatus, type_: &str) -> Option<(String, String)> {
        conditions::find(&status.conditions, type_).map(|c| (c.status.clone(), c.reason.clone()))
    }

    #[test]
    fn tenant_answers_table() {
        let place = Place {
            provider: "milan",
            consumer: "rome",
            remote_namespace: "tandem-tenant-rome",
            endpoint: "https://milan:6443",
        };
        let granted_before: BTreeMap<String, Quantity> =
            [("cpu".to_string(), Quantity("2".into()))].into();
        // (case, answer, goes on, ResourcesGranted, ProviderReachable, granted cpu after)
        type Case = (
            &'static str,
            TenantAnswer,
            bool,
            Option<(&'static str, &'static str)>,
            (&'static str, &'static str),
            Option<&'static str>,
        );
        let cases: Vec<Case> = vec![
            (
                "a grant",
                TenantAnswer::Found(Box::new(tenant(&[("cpu", "4")]))),
                true,
                Some(("True", "Granted")),
                ("True", "Answered"),
                Some("4"),
            ),
            (
                "an invalid grant keeps the last valid one",
                TenantAnswer::Found(Box::new(tenant(&[("cpu", "abc")]))),
                true,
                Some(("False", "InvalidGrant")),
                ("True", "Answered"),
                Some("2"),
            ),
            (
                "a negative grant too",
                TenantAnswer::Found(Box::new(tenant(&[("cpu", "-5")]))),
                true,
                Some(("False", "InvalidGrant")),
                ("True", "Answered"),
                Some("2"),
            ),
            (
                "an empty grant revokes",
                TenantAnswer::Found(Box::new(tenant(&[]))),
                true,
                Some(("False", "Revoked")),
                ("True", "Answered"),
                None,
            ),
            (
                "the Tenant is gone",
                TenantAnswer::Gone("404".into()),
                true,
                Some(("False", "TenantGone")),
                ("True", "Answered"),
                None,
            ),
            (
                "no answer changes nothing granted",
                TenantAnswer::Unreachable("refused".into()),
                false,
                None,
                ("False", "Unreachable"),
                Some("2"),
            ),
        ];
        for (name, answer, goes_on, granted, reachable, cpu) in cases {
            let mut status = PeeringStatus {
                granted: granted_before.clone(),
                ..Default::default()
            };
            assert_eq!(
                apply_tenant_answer(&mut status, &answer, &place),
                goes_on,
                "{name}"
            );
            let own = |c: Option<(&str, &str)>| c.map(|(s, r)| (s.to_string(), r.to_string()));
            assert_eq!(
                condition(&status, conditions::RESOURCES_GRANTED),
                own(granted),
                "{name}"
            );
            assert_eq!(
                condition(&status, conditions::PROVIDER_REACHABLE),
                own(Some(reachable)),
                "{name}"
            );
            assert_eq!(
                status.granted.get("cpu").map(|q| q.0.as_str()),
                cpu,
                "{name}"
            );
        }
    }

    #[test]
    fn established_needs_all_three_conditions() {
        let mut status = PeeringStatus::default();
        for c in [conditions::AUTHENTICATED, conditions::RESOURCES_GRANTED] {
            set(&mut status, c, true, "Ok", "");
        }
        assert_eq!(negotiated_phase(&status), "Negotiating");
        set(&mut status, conditions::NETWORK_NEGOTIATED, true, "Ok", "");
        assert_eq!(negotiated_phase(&status), "Established");
        set(
            &mut status,
            conditions::RESOURCES_GRANTED,
            false,
            "Revoked",
            "",
        );
        assert_eq!(negotiated_phase(&status), "Negotiating");
    }
}
