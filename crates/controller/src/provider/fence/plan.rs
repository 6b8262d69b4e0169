//! What the provider's fence decides, from what it observed: pure, with the clock passed in.
//!
//! Each tick, for each consumer: whether its handed-back nonce renews its lease and whether a
//! new nonce is due ([`next_nonce`]); which of its shadow pods to mark Fenced
//! ([`shadow_pod`]) and which real pods to delete ([`real_pod`]), each object either a
//! [`Step`] or the reason it is [`Spared`]; and what the Tenant's `Fenced` condition says
//! ([`condition`]).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::{Resource, ResourceExt};
use tandem_api::conditions::ConditionStatus;
use tandem_api::{ShadowPod, names};
use tandem_core::fence::{self, ProviderLease};

use crate::provider::shadowpod::PHASE_FENCED;

/// How often a new nonce is issued when none comes back: a consumer that reads one (a
/// restarted controller) renews from an issue time at most this old.
pub(super) const REISSUE: Duration = Duration::from_secs(2);

/// What becomes of the consumer's nonce this tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum NonceStep {
    /// The consumer handed back one of the latest nonces: its deadlines move on, the pods
    /// fenced before count no more, and the next nonce is issued.
    Renewed,
    /// Nothing new came back and the newest nonce is [`REISSUE`] old: issue another.
    Reissue,
    /// Nothing to do: the newest nonce is recent, or what came back was seen already or is not
    /// one of ours.
    Keep,
}

/// Reads the nonce the consumer's fence Lease holds (`returned`) against the `last_seen` one
/// (each is accepted once) and moves the lease's deadline when it renews.
pub(super) fn next_nonce(
    lease: &mut ProviderLease,
    last_seen: &mut Option<String>,
    returned: Option<&str>,
    now: Instant,
) -> NonceStep {
    let mut renewed = false;
    if let Some(returned) = returned
        && last_seen.as_deref() != Some(returned)
    {
        renewed = lease.accept(returned);
        *last_seen = Some(returned.to_string());
    }
    if renewed {
        NonceStep::Renewed
    } else if lease
        .issued()
        .is_none_or(|t| now.saturating_duration_since(t) >= REISSUE)
    {
        NonceStep::Reissue
    } else {
        NonceStep::Keep
    }
}

/// A write the fence makes to stop one of the consumer's pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// Mark the shadow pod `Fenced`, first: neither the shadow pod controller nor a later pass
    /// starts it again.
    MarkFenced {
        namespace: String,
        name: String,
        uid: String,
        /// Its `fence-after` label, for the message.
        fence_after: String,
    },
    /// Delete the real pod with grace 0 (preconditioned on `uid`).
    DeletePod {
        namespace: String,
        name: String,
        uid: String,
    },
}

/// Why the fence leaves a pod or shadow pod alone this tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Spared {
    /// It has no `fence-after` label the fence can read.
    NoBound,
    /// Its namespace is not a twin namespace of this consumer.
    NotThisConsumer,
    /// The consumer renewed its lease within the pod's `fenceAfter`.
    NotDue,
    /// The shadow pod stands fenced already.
    AlreadyFenced,
    /// The shadow pod is being deleted (its real pod is handled on its own).
    Deleting,
    /// The real pod has finished (Succeeded or Failed).
    Finished,
    /// This process marked or deleted it already; its watch does not show it yet.
    AlreadyDone,
    /// Its shadow pod is due but not marked yet (the mark failed): nothing may start the pod
    /// again once it is stopped, so it waits for the mark.
    AwaitingMark,
}

/// `namespace/name`.
pub(super) fn key_of<K: Resource>(o: &K) -> String {
    format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any())
}

fn shadow_phase(sp: &ShadowPod) -> Option<&str> {
    sp.status.as_ref().and_then(|s| s.phase.as_deref())
}

/// Whether a fence-labelled object in a namespace of `owner` belongs to `consumer` and is past
/// its bound at `now`.
fn due(
    meta: &impl Resource,
    owner: Option<&str>,
    consumer: &str,
    lease: &ProviderLease,
    now: Instant,
) -> Result<(), Spared> {
    let after = meta
        .meta()
        .labels
        .as_ref()
        .and_then(|l| l.get(names::FENCE_AFTER))
        .and_then(|d| fence::parse(d))
        .ok_or(Spared::NoBound)?;
    if owner != Some(consumer) {
        return Err(Spared::NotThisConsumer);
    }
    if !lease.due(after, now) {
        return Err(Spared::NotDue);
    }
    Ok(())
}

/// Whether to mark shadow pod `sp` (in a namespace of `owner`) Fenced.
pub(super) fn shadow_pod(
    sp: &ShadowPod,
    owner: Option<&str>,
    consumer: &str,
    lease: &ProviderLease,
    done: &BTreeSet<String>,
    now: Instant,
) -> Result<Step, Spared> {
    let uid = sp.uid().unwrap_or_default();
    if shadow_phase(sp) == Some(PHASE_FENCED) {
        return Err(Spared::AlreadyFenced);
    }
    if sp.metadata.deletion_timestamp.is_some() {
        return Err(Spared::Deleting);
    }
    if done.contains(&uid) {
        return Err(Spared::AlreadyDone);
    }
    due(sp, owner, consumer, lease, now)?;
    Ok(Step::MarkFenced {
        namespace: sp.namespace().unwrap_or_default(),
        name: sp.name_any(),
        uid,
        fence_after: sp
            .labels()
            .get(names::FENCE_AFTER)
            .cloned()
            .unwrap_or_default(),
    })
}

/// Whether to delete real pod `pod` (in a namespace of `owner`): those of the shadow pods just
/// marked, and any other past its bound — a shadow pod marked earlier, or gone while its pod
/// shuts down gracefully. `unmarked` holds the `namespace/name` of due shadow pods whose mark
/// failed.
pub(super) fn real_pod(
    pod: &Pod,
    owner: Option<&str>,
    consumer: &str,
    lease: &ProviderLease,
    done: &BTreeSet<String>,
    unmarked: &BTreeSet<String>,
    now: Instant,
) -> Result<Step, Spared> {
    let uid = pod.uid().unwrap_or_default();
    if matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    ) {
        return Err(Spared::Finished);
    }
    if done.contains(&uid) {
        return Err(Spared::AlreadyDone);
    }
    if unmarked.contains(&key_of(pod)) {
        return Err(Spared::AwaitingMark);
    }
    due(pod, owner, consumer, lease, now)?;
    Ok(Step::DeletePod {
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
        uid,
    })
}

/// Keeps in `done` only the UIDs the watches do not show settled yet: a shadow pod still shown
/// unfenced, or a real pod still shown at all.
pub(super) fn forget_settled(
    done: &mut BTreeSet<String>,
    shadows: &[impl AsRef<ShadowPod>],
    pods: &[impl AsRef<Pod>],
) {
    done.retain(|uid| {
        shadows.iter().map(AsRef::as_ref).any(|sp| {
            sp.uid().as_deref() == Some(uid.as_str()) && shadow_phase(sp) != Some(PHASE_FENCED)
        }) || pods
            .iter()
            .any(|p| p.as_ref().uid().as_deref() == Some(uid.as_str()))
    });
}

/// What the Tenant's `Fenced` condition should say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Condition {
    pub status: ConditionStatus,
    pub reason: &'static str,
    pub message: String,
}

/// The `Fenced` condition of consumer `consumer`: True with the pods fenced since it last
/// renewed its lease (`fenced`); False once it renews again after a fencing (`was_fenced`),
/// with the `standing` count of pods fenced earlier; None (unchanged, absent before any
/// fencing) otherwise.
pub(super) fn condition(
    consumer: &str,
    fenced: &[String],
    was_fenced: bool,
    standing: usize,
) -> Option<Condition> {
    if !fenced.is_empty() {
        return Some(Condition {
            status: ConditionStatus::True,
            reason: "LeaseExpired",
            message: format!(
                "consumer {consumer} renewed no fence lease: {} pod(s) stopped ({})",
                fenced.len(),
                fenced.join(", ")
            ),
        });
    }
    was_fenced.then(|| Condition {
        status: ConditionStatus::False,
        reason: "LeaseRenewed",
        message: format!(
            "consumer {consumer} renews its fence lease; {standing} pod(s) fenced earlier stay \
             stopped until it replaces them"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use std::collections::BTreeMap;
    use std::sync::Arc;

    const CONSUMER: &str = "consumer-a";

    /// (what the consumer's Lease holds, the nonce last seen there, time since the newest
    /// nonce was issued, the step wanted, whether the deadline moved).
    type NonceCase<'a> = (Option<&'a str>, Option<&'a str>, Duration, NonceStep, bool);
    /// (case, object, owner of its namespace, time since the lease was renewed, decision).
    type Case<'a, T> = (
        &'a str,
        T,
        Option<&'a str>,
        Option<Duration>,
        Result<(), Spared>,
    );

    fn meta(ns: &str, name: &str, uid: &str, fence_after: Option<&str>) -> kube::core::ObjectMeta {
        kube::core::ObjectMeta {
            namespace: Some(ns.into()),
            name: Some(name.into()),
            uid: Some(uid.into()),
            labels: fence_after
                .map(|f| BTreeMap::from([(names::FENCE_AFTER.to_string(), f.to_string())])),
            ..Default::default()
        }
    }

    /// A shadow pod labelled `fence-after` (None: unlabelled).
    struct Shadow(ShadowPod);

    impl Shadow {
        fn new(name: &str, fence_after: Option<&str>) -> Self {
            let mut sp = ShadowPod::new(name, Default::default());
            sp.metadata = meta("twin", name, &format!("uid-{name}"), fence_after);
            Shadow(sp)
        }
        fn phase(mut self, phase: &str) -> Self {
            self.0.status = Some(tandem_api::ShadowPodStatus {
                phase: Some(phase.into()),
                ..Default::default()
            });
            self
        }
        fn deleting(mut self) -> Self {
            self.0.metadata.deletion_timestamp =
                Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
            self
        }
    }

    fn real(name: &str, fence_after: Option<&str>, phase: Option<&str>) -> Pod {
        Pod {
            metadata: meta("twin", name, &format!("pod-{name}"), fence_after),
            status: phase.map(|p| k8s_openapi::api::core::v1::PodStatus {
                phase: Some(p.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// A lease last renewed `renewed_ago` before `now` (None: never, so every bound passed).
    fn lease(now: Instant, renewed_ago: Option<Duration>) -> ProviderLease {
        ProviderLease::new("n0".into(), now, renewed_ago.map(|ago| now - ago))
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn nonce_table() {
        let t0 = Instant::now();
        let cases: &[NonceCase] = &[
            (None, None, secs(0), NonceStep::Keep, false),
            (None, None, REISSUE, NonceStep::Reissue, false),
            (Some("n0"), None, secs(1), NonceStep::Renewed, true),
            // Renewing is once per nonce: the same one again renews nothing.
            (Some("n0"), Some("n0"), secs(0), NonceStep::Keep, false),
            (Some("n0"), Some("n0"), secs(5), NonceStep::Reissue, false),
            // A guess is not one of ours.
            (Some("guess"), None, secs(0), NonceStep::Keep, false),
            (
                Some("guess"),
                Some("n0"),
                secs(3),
                NonceStep::Reissue,
                false,
            ),
        ];
        for &(returned, seen, age, want, moved) in cases {
            let mut l = ProviderLease::new("n0".into(), t0, None);
            let mut last = seen.map(str::to_string);
            let got = next_nonce(&mut l, &mut last, returned, t0 + age);
            assert_eq!(
                got, want,
                "returned {returned:?}, seen {seen:?}, age {age:?}"
            );
            assert_eq!(l.base().is_some(), moved, "returned {returned:?}");
            if let Some(r) = returned {
                assert_eq!(last.as_deref(), Some(r), "each returned nonce is seen once");
            }
        }
    }

    #[test]
    fn shadow_pod_table() {
        let now = Instant::now() + secs(3600);
        let done_uid = BTreeSet::from(["uid-done".to_string()]);
        let mine = Some(CONSUMER);
        let cases: Vec<Case<Shadow>> = vec![
            (
                "past its bound",
                Shadow::new("a", Some("10s")),
                mine,
                Some(secs(11)),
                Ok(()),
            ),
            (
                "never renewed",
                Shadow::new("a", Some("10s")),
                mine,
                None,
                Ok(()),
            ),
            (
                "within its bound",
                Shadow::new("a", Some("10s")),
                mine,
                Some(secs(9)),
                Err(Spared::NotDue),
            ),
            (
                "no label",
                Shadow::new("a", None),
                mine,
                None,
                Err(Spared::NoBound),
            ),
            (
                "unreadable label",
                Shadow::new("a", Some("soon")),
                mine,
                None,
                Err(Spared::NoBound),
            ),
            (
                "another consumer's",
                Shadow::new("a", Some("10s")),
                Some("consumer-b"),
                None,
                Err(Spared::NotThisConsumer),
            ),
            (
                "no twin namespace",
                Shadow::new("a", Some("10s")),
                None,
                None,
                Err(Spared::NotThisConsumer),
            ),
            (
                "fenced",
                Shadow::new("a", Some("10s")).phase(PHASE_FENCED),
                mine,
                None,
                Err(Spared::AlreadyFenced),
            ),
            (
                "deleting",
                Shadow::new("a", Some("10s")).deleting(),
                mine,
                None,
                Err(Spared::Deleting),
            ),
            (
                "marked already",
                Shadow::new("done", Some("10s")),
                mine,
                None,
                Err(Spared::AlreadyDone),
            ),
            (
                "running",
                Shadow::new("a", Some("1s")).phase("Running"),
                mine,
                Some(secs(2)),
                Ok(()),
            ),
        ];
        for (what, sp, owner, renewed_ago, want) in cases {
            let got = shadow_pod(
                &sp.0,
                owner,
                CONSUMER,
                &lease(now, renewed_ago),
                &done_uid,
                now,
            );
            match want {
                Ok(()) => assert_eq!(
                    got,
                    Ok(Step::MarkFenced {
                        namespace: "twin".into(),
                        name: sp.0.name_any(),
                        uid: sp.0.uid().unwrap(),
                        fence_after: sp.0.labels()[names::FENCE_AFTER].clone(),
                    }),
                    "{what}"
                ),
                Err(spared) => assert_eq!(got, Err(spared), "{what}"),
            }
        }
    }

    #[test]
    fn real_pod_table() {
        let now = Instant::now() + secs(3600);
        let done = BTreeSet::from(["pod-done".to_string()]);
        let unmarked = BTreeSet::from(["twin/unmarked".to_string()]);
        let mine = Some(CONSUMER);
        let cases: Vec<Case<Pod>> = vec![
            (
                "running past its bound",
                real("a", Some("10s"), Some("Running")),
                mine,
                Some(secs(10)),
                Ok(()),
            ),
            (
                "pending past its bound",
                real("a", Some("10s"), Some("Pending")),
                mine,
                None,
                Ok(()),
            ),
            (
                "shutting down, no status",
                real("a", Some("10s"), None),
                mine,
                None,
                Ok(()),
            ),
            (
                "within its bound",
                real("a", Some("10s"), Some("Running")),
                mine,
                Some(secs(2)),
                Err(Spared::NotDue),
            ),
            (
                "no label",
                real("a", None, Some("Running")),
                mine,
                None,
                Err(Spared::NoBound),
            ),
            (
                "another consumer's",
                real("a", Some("10s"), Some("Running")),
                Some("consumer-b"),
                None,
                Err(Spared::NotThisConsumer),
            ),
            (
                "succeeded",
                real("a", Some("10s"), Some("Succeeded")),
                mine,
                None,
                Err(Spared::Finished),
            ),
            (
                "failed",
                real("a", Some("10s"), Some("Failed")),
                mine,
                None,
                Err(Spared::Finished),
            ),
            (
                "deleted already",
                real("done", Some("10s"), Some("Running")),
                mine,
                None,
                Err(Spared::AlreadyDone),
            ),
            (
                "its mark failed",
                real("unmarked", Some("10s"), Some("Running")),
                mine,
                None,
                Err(Spared::AwaitingMark),
            ),
        ];
        for (what, pod, owner, renewed_ago, want) in cases {
            let got = real_pod(
                &pod,
                owner,
                CONSUMER,
                &lease(now, renewed_ago),
                &done,
                &unmarked,
                now,
            );
            match want {
                Ok(()) => assert_eq!(
                    got,
                    Ok(Step::DeletePod {
                        namespace: "twin".into(),
                        name: pod.name_any(),
                        uid: pod.uid().unwrap(),
                    }),
                    "{what}"
                ),
                Err(spared) => assert_eq!(got, Err(spared), "{what}"),
            }
        }
    }

    #[test]
    fn a_renewal_moves_every_deadline_on() {
        let t0 = Instant::now();
        let mut l = ProviderLease::new("n0".into(), t0, Some(t0));
        let mut seen = None;
        let sp = Shadow::new("a", Some("10s")).0;
        let none = BTreeSet::new();
        let at = |s| t0 + secs(s);
        assert_eq!(
            shadow_pod(&sp, Some(CONSUMER), CONSUMER, &l, &none, at(9)),
            Err(Spared::NotDue)
        );
        // The consumer hands back a nonce issued at 5 s: the pod is safe until 15 s.
        l.reissue("n1".into(), at(5));
        assert_eq!(
            next_nonce(&mut l, &mut seen, Some("n1"), at(9)),
            NonceStep::Renewed
        );
        assert_eq!(
            shadow_pod(&sp, Some(CONSUMER), CONSUMER, &l, &none, at(14)),
            Err(Spared::NotDue)
        );
        assert!(shadow_pod(&sp, Some(CONSUMER), CONSUMER, &l, &none, at(15)).is_ok());
    }

    #[test]
    fn done_forgets_what_the_watches_show_settled() {
        let fenced = Shadow::new("fenced", Some("1s")).phase(PHASE_FENCED).0;
        let unfenced = Shadow::new("unfenced", Some("1s")).0;
        let pod = real("live", Some("1s"), Some("Running"));
        let mut done: BTreeSet<String> = ["uid-fenced", "uid-unfenced", "pod-live", "pod-gone"]
            .map(String::from)
            .into();
        forget_settled(
            &mut done,
            &[Arc::new(fenced), Arc::new(unfenced)],
            &[Arc::new(pod)],
        );
        // The mark shows (fenced), the deleted pod is gone: only the others are remembered.
        assert_eq!(
            done,
            BTreeSet::from(["uid-unfenced".to_string(), "pod-live".to_string()])
        );
    }

    #[test]
    fn condition_table() {
        let two = ["t/a".to_string(), "t/b".to_string()];
        let got = condition("c", &two, false, 2).unwrap();
        assert_eq!(
            (got.status, got.reason),
            (ConditionStatus::True, "LeaseExpired")
        );
        assert_eq!(
            got.message,
            "consumer c renewed no fence lease: 2 pod(s) stopped (t/a, t/b)"
        );
        // Still fenced now, whatever it said before.
        assert_eq!(
            condition("c", &two, true, 2).unwrap().reason,
            "LeaseExpired"
        );
        let renewed = condition("c", &[], true, 2).unwrap();
        assert_eq!(
            (renewed.status, renewed.reason),
            (ConditionStatus::False, "LeaseRenewed")
        );
        assert!(
            renewed
                .message
                .contains("2 pod(s) fenced earlier stay stopped"),
            "{}",
            renewed.message
        );
        // Never fenced: no condition at all.
        assert_eq!(condition("c", &[], false, 0), None);
    }
}
