//! What the consumer's fence decides, from what it observed: pure, with the clock passed in.
//!
//! Each probe of a provider: what its answer tells ([`note_answer`]), whether the newest nonce
//! is handed back ([`hand_back`], written as [`fence_lease`]), whether the pods on the virtual
//! node are looked at ([`list_pods`]) and which of them are certainly stopped there, so deleted
//! here ([`pod`]): each a [`Step`], or the reason nothing is done ([`Skip`], [`Spared`]).

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::ResourceExt;
use serde_json::{Value, json};
use tandem_api::names;
use tandem_core::fence::{self, Receipt};

/// A request the fence sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// Write the provider's newest nonce into our fence Lease there.
    HandBack { nonce: String },
    /// List the pods on the virtual node, to find those certainly stopped on the provider.
    ListPods,
    /// Delete the pod here with grace 0 (preconditioned on `uid`), so that its controller
    /// replaces it elsewhere; `message` is what the warning and the `FenceConfirmed` Event say.
    DeletePod {
        namespace: String,
        name: String,
        uid: Option<String>,
        message: String,
    },
}

/// Why the fence sends nothing to hand back or list this probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Skip {
    /// No nonce has arrived since this process started.
    NoNonce,
    /// The newest nonce is in our fence Lease already.
    HandedBack,
    /// No nonce has arrived since this process started: it cannot know when its predecessor
    /// last heard from the provider, so nothing is confirmed.
    NoReceipt,
    /// The newest nonce arrived less than the fence margin ago: no pod waits less.
    FreshReceipt,
    /// The provider answered within the fence margin: what it shows is the truth.
    ProviderAnswers,
}

/// Why a pod on the virtual node is left alone this probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Spared {
    /// It has no `fence-after` annotation the fence can read.
    NoBound,
    /// The newest nonce arrived less than its bound (stretched for drift, plus the margin)
    /// ago: the provider may not have stopped it yet.
    NotConfirmed,
    /// The provider answered within its bound (with no new nonce: its fence is down), so
    /// nothing confirms it stopped there.
    HeardFrom,
}

/// Notes the provider's answer read at `now` (None: it did not answer; `Some(None)`: it has no
/// nonce for us yet) in the `receipt` and in `last_answer`, when it last answered at all.
pub(super) fn note_answer(
    receipt: &mut Receipt,
    last_answer: &mut Option<Instant>,
    answer: Option<Option<String>>,
    now: Instant,
) {
    if let Some(answer) = answer {
        *last_answer = Some(now);
        if let Some(nonce) = answer {
            receipt.receive(&nonce, now);
        }
    }
}

/// The nonce the provider's nonce Lease holds (None: no Lease or no nonce).
pub(super) fn nonce_of(lease: Option<&Lease>) -> Option<String> {
    lease.and_then(|l| l.annotations().get(names::FENCE_NONCE_ANNOTATION).cloned())
}

/// Whether the newest nonce received is handed back (`handed_back`: the last one written).
pub(super) fn hand_back(receipt: &Receipt, handed_back: Option<&str>) -> Result<Step, Skip> {
    let nonce = receipt.nonce().ok_or(Skip::NoNonce)?;
    if handed_back == Some(nonce) {
        return Err(Skip::HandedBack);
    }
    Ok(Step::HandBack {
        nonce: nonce.to_string(),
    })
}

/// Our fence Lease on the provider, holding `nonce`, renewed at `now`.
pub(super) fn fence_lease(
    consumer_id: &str,
    nonce: &str,
    now: k8s_openapi::jiff::Timestamp,
) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": names::FENCE_LEASE,
                     "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY,
                                names::FENCE_LEASE_LABEL: "consumer"},
                     "annotations": {names::FENCE_NONCE_ANNOTATION: nonce}},
        "spec": {"holderIdentity": consumer_id, "renewTime": MicroTime(now)},
    })
}

/// Whether `now` the pods on the virtual node are listed: once the newest nonce is older than
/// the least any pod waits (`margin`), and the provider has not answered for as long — one
/// that answers but issues no nonce has no fence running (its controller is down), so nothing
/// is confirmed stopped there.
pub(super) fn list_pods(
    receipt: &Receipt,
    last_answer: Option<Instant>,
    margin: Duration,
    now: Instant,
) -> Result<Step, Skip> {
    let age = receipt.age(now).ok_or(Skip::NoReceipt)?;
    if age < margin {
        return Err(Skip::FreshReceipt);
    }
    if !silent_for(last_answer, margin, now) {
        return Err(Skip::ProviderAnswers);
    }
    Ok(Step::ListPods)
}

/// Whether the provider last answered at least `wait` before `now` (or never did).
fn silent_for(last_answer: Option<Instant>, wait: Duration, now: Instant) -> bool {
    last_answer.is_none_or(|t| now.saturating_duration_since(t) >= wait)
}

/// Whether `pod`, on the virtual node of `provider`, is certainly stopped there at `now`
/// (its `fence-after` bound has passed since the newest nonce arrived and since the provider
/// last answered): then it is deleted here.
pub(super) fn pod(
    pod: &Pod,
    provider: &str,
    receipt: &Receipt,
    last_answer: Option<Instant>,
    margin: Duration,
    now: Instant,
) -> Result<Step, Spared> {
    let after = pod
        .annotations()
        .get(names::FENCE_AFTER)
        .and_then(|d| fence::parse(d))
        .ok_or(Spared::NoBound)?;
    if !receipt.confirms_stopped(after, margin, now) {
        return Err(Spared::NotConfirmed);
    }
    if !silent_for(last_answer, fence::consumer_wait(after, margin), now) {
        return Err(Spared::HeardFrom);
    }
    let silent = receipt.age(now).unwrap_or_default();
    Ok(Step::DeletePod {
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
        uid: pod.uid(),
        message: format!(
            "provider {provider} has not been heard from for {}s: its fence (fenceAfter {}s) has \
             stopped the pod there; deleted here so that its controller replaces it",
            silent.as_secs(),
            after.as_secs_f64()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    const PROVIDER: &str = "milan";
    const MARGIN: Duration = Duration::from_secs(5);

    /// (case, when the newest nonce was received, the nonce handed back, decision).
    type HandBackCase<'a> = (
        &'a str,
        Option<Instant>,
        Option<&'a str>,
        Result<Step, Skip>,
    );
    /// (case, when the newest nonce was received, when the provider last answered, decision).
    type ListCase<'a> = (
        &'a str,
        Option<Instant>,
        Option<Instant>,
        Result<Step, Skip>,
    );
    /// (case, pod, when the newest nonce was received, when the provider last answered, the
    /// seconds of silence the deletion's message says, or why it is spared).
    type PodCase<'a> = (
        &'a str,
        Pod,
        Option<Instant>,
        Option<Instant>,
        Result<u64, Spared>,
    );

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// A receipt of nonce `n1` at `at` (None: none received).
    fn receipt(at: Option<Instant>) -> Receipt {
        let mut r = Receipt::default();
        if let Some(at) = at {
            r.receive("n1", at);
        }
        r
    }

    /// A pod on the virtual node, annotated `fence-after` (None: not annotated).
    fn pod_fixture(name: &str, fence_after: Option<&str>) -> Pod {
        Pod {
            metadata: kube::core::ObjectMeta {
                namespace: Some("shop".into()),
                name: Some(name.into()),
                uid: Some(format!("uid-{name}")),
                annotations: fence_after
                    .map(|f| BTreeMap::from([(names::FENCE_AFTER.to_string(), f.to_string())])),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn the_provider_s_answers_are_noted() {
        let t0 = Instant::now();
        let mut r = Receipt::default();
        let mut last = None;
        // No answer: nothing heard.
        note_answer(&mut r, &mut last, None, t0);
        assert_eq!((r.nonce(), last), (None, None));
        // An answer without a nonce: heard from, nothing received.
        note_answer(&mut r, &mut last, Some(None), t0 + secs(1));
        assert_eq!((r.nonce(), last), (None, Some(t0 + secs(1))));
        // A nonce: received then, and the same one again later does not make it newer.
        note_answer(&mut r, &mut last, Some(Some("n1".into())), t0 + secs(2));
        note_answer(&mut r, &mut last, Some(Some("n1".into())), t0 + secs(4));
        assert_eq!(r.nonce(), Some("n1"));
        assert_eq!(r.age(t0 + secs(4)), Some(secs(2)));
        assert_eq!(last, Some(t0 + secs(4)));
    }

    #[test]
    fn the_nonce_is_read_from_the_provider_s_lease() {
        let mut lease = Lease::default();
        assert_eq!(nonce_of(None), None);
        assert_eq!(nonce_of(Some(&lease)), None);
        lease.metadata.annotations = Some(BTreeMap::from([(
            names::FENCE_NONCE_ANNOTATION.to_string(),
            "n7".to_string(),
        )]));
        assert_eq!(nonce_of(Some(&lease)).as_deref(), Some("n7"));
    }

    #[test]
    fn hand_back_table() {
        let t0 = Instant::now();
        let cases: &[HandBackCase] = &[
            (
                "HandBack: a new nonce",
                Some(t0),
                None,
                Ok(Step::HandBack { nonce: "n1".into() }),
            ),
            (
                "HandBack: newer than the one handed back",
                Some(t0),
                Some("n0"),
                Ok(Step::HandBack { nonce: "n1".into() }),
            ),
            ("NoNonce", None, None, Err(Skip::NoNonce)),
            ("HandedBack", Some(t0), Some("n1"), Err(Skip::HandedBack)),
        ];
        for (case, received, handed_back, want) in cases {
            assert_eq!(
                &hand_back(&receipt(*received), *handed_back),
                want,
                "{case}"
            );
        }
    }

    #[test]
    fn the_fence_lease_holds_the_nonce_and_names_the_consumer() {
        let now = k8s_openapi::jiff::Timestamp::UNIX_EPOCH;
        let lease: Lease = serde_json::from_value(fence_lease("rome", "n1", now)).unwrap();
        assert_eq!(lease.metadata.name.as_deref(), Some(names::FENCE_LEASE));
        assert_eq!(
            lease.metadata.labels.as_ref().unwrap()[names::FENCE_LEASE_LABEL],
            "consumer"
        );
        // The nonce handed back sits where the provider reads nonces.
        assert_eq!(nonce_of(Some(&lease)).as_deref(), Some("n1"));
        let spec = lease.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("rome"));
        assert_eq!(spec.renew_time, Some(MicroTime(now)));
    }

    #[test]
    fn list_pods_table() {
        let now = Instant::now() + secs(3600);
        let ago = |s| Some(now - secs(s));
        // (case, nonce received, provider last answered, decision)
        let cases: &[ListCase] = &[
            ("ListPods: silent since", ago(5), ago(5), Ok(Step::ListPods)),
            (
                "ListPods: never answered",
                ago(60),
                None,
                Ok(Step::ListPods),
            ),
            ("NoReceipt", None, None, Err(Skip::NoReceipt)),
            ("FreshReceipt", ago(4), ago(4), Err(Skip::FreshReceipt)),
            (
                "ProviderAnswers: with no new nonce",
                ago(60),
                ago(1),
                Err(Skip::ProviderAnswers),
            ),
        ];
        for (case, received, answered, want) in cases {
            assert_eq!(
                &list_pods(&receipt(*received), *answered, MARGIN, now),
                want,
                "{case}"
            );
        }
    }

    #[test]
    fn pod_table() {
        let now = Instant::now() + secs(3600);
        let ago = |s| Some(now - secs(s));
        // A 10 s bound waits 10.2 s (drift) plus the 5 s margin.
        let cases: &[PodCase] = &[
            (
                "DeletePod: silent past its bound",
                pod_fixture("web", Some("10s")),
                ago(16),
                ago(16),
                Ok(16),
            ),
            (
                "DeletePod: never answered",
                pod_fixture("web", Some("10s")),
                ago(30),
                None,
                Ok(30),
            ),
            (
                "NoBound: not annotated",
                pod_fixture("web", None),
                ago(600),
                None,
                Err(Spared::NoBound),
            ),
            (
                "NoBound: unreadable",
                pod_fixture("web", Some("soon")),
                ago(600),
                None,
                Err(Spared::NoBound),
            ),
            (
                "NotConfirmed: within its bound",
                pod_fixture("web", Some("10s")),
                ago(15),
                ago(15),
                Err(Spared::NotConfirmed),
            ),
            (
                "NotConfirmed: no nonce since the restart",
                pod_fixture("web", Some("10s")),
                None,
                None,
                Err(Spared::NotConfirmed),
            ),
            (
                "HeardFrom: answers with no nonce",
                pod_fixture("web", Some("10s")),
                ago(60),
                ago(10),
                Err(Spared::HeardFrom),
            ),
        ];
        for (case, p, received, answered, want) in cases {
            let got = pod(p, PROVIDER, &receipt(*received), *answered, MARGIN, now);
            let want = want.map(|silent| Step::DeletePod {
                namespace: "shop".into(),
                name: "web".into(),
                uid: Some("uid-web".into()),
                message: format!(
                    "provider milan has not been heard from for {silent}s: its fence \
                     (fenceAfter 10s) has stopped the pod there; deleted here so that its \
                     controller replaces it"
                ),
            });
            assert_eq!(got, want, "{case}");
        }
    }

    #[test]
    fn the_message_says_a_fractional_bound_as_it_is() {
        let now = Instant::now() + secs(3600);
        let got = pod(
            &pod_fixture("web", Some("1500ms")),
            PROVIDER,
            &receipt(Some(now - secs(9))),
            None,
            MARGIN,
            now,
        );
        let Ok(Step::DeletePod { message, .. }) = got else {
            panic!("{got:?}")
        };
        assert!(message.contains("(fenceAfter 1.5s)"), "{message}");
    }
}
