//! Fencing across a partition: the arithmetic by which a provider and a consumer agree on when
//! the provider's copies of the consumer's pods are certainly stopped, without trusting each
//! other's clocks or the delay of any message. `docs/fencing.md` has the argument; in short:
//!
//! - the provider publishes a random *nonce* and notes when it issued it, on its own monotonic
//!   clock;
//! - the consumer reads the nonce, notes when it received it, on its own monotonic clock, and
//!   hands it back (a Lease in its tenant namespace on the provider);
//! - a handed-back nonce that is one of the provider's latest is *accepted*: the provider's
//!   fence deadline becomes that nonce's issue time plus `fenceAfter`, and it issues the next
//!   nonce (it also issues one every few seconds when none comes back);
//! - a nonce is received after it was issued, so the provider's latest deadline is never later
//!   than the consumer's newest receipt plus `fenceAfter` (each measured on its own clock): the
//!   consumer may confirm the pods stopped once `fenceAfter`, stretched for clock-rate drift,
//!   plus the time the provider takes to stop a pod, has passed since its newest receipt.

use std::time::{Duration, Instant};

/// The largest difference in rate between the two sides' monotonic clocks that the bound
/// allows for (1 %; quartz clocks differ by a few parts per million).
pub const DRIFT: f64 = 0.01;

/// A duration as NamespaceOffloadings write them (`10s`, `1m30s`, `500ms`).
pub fn parse(duration: &str) -> Option<Duration> {
    humantime::parse_duration(duration.trim()).ok()
}

/// `duration` in whole seconds, rounded up (Kubernetes counts tolerations in seconds).
pub fn whole_seconds(duration: Duration) -> u64 {
    duration.as_secs() + u64::from(duration.subsec_nanos() > 0)
}

/// How long after its newest receipt of a nonce the consumer must wait before it may take a
/// pod fenced after `fence_after` as stopped: `fence_after` as the provider's clock may run
/// slower than ours by [`DRIFT`], plus `margin` for the provider to notice its deadline and
/// stop the pod.
pub fn consumer_wait(fence_after: Duration, margin: Duration) -> Duration {
    fence_after.mul_f64((1.0 + DRIFT) / (1.0 - DRIFT)) + margin
}

/// How many of its latest nonces a provider accepts back: a consumer that read one just before
/// the next was issued still renews with it.
pub const RECENT_NONCES: usize = 4;

/// The provider's side of one consumer's fence lease.
#[derive(Clone, Debug)]
pub struct ProviderLease {
    /// The latest nonces issued, newest last, each with its issue time.
    recent: std::collections::VecDeque<(String, Instant)>,
    /// The issue time of the newest nonce the consumer handed back (None: so long ago that
    /// every deadline has passed).
    base: Option<Instant>,
}

impl ProviderLease {
    /// A lease whose newest accepted nonce was issued at `base` (see [`base_from_wall`]); the
    /// current nonce `nonce` is issued `now`.
    pub fn new(nonce: String, now: Instant, base: Option<Instant>) -> Self {
        ProviderLease {
            recent: [(nonce, now)].into(),
            base,
        }
    }

    /// The nonce the consumer should hand back next (the newest).
    pub fn nonce(&self) -> &str {
        self.recent.back().map_or("", |(n, _)| n.as_str())
    }

    /// When the newest nonce was issued.
    pub fn issued(&self) -> Option<Instant> {
        self.recent.back().map(|(_, t)| *t)
    }

    /// The consumer handed back `returned`: if it is one of the [`RECENT_NONCES`] latest, the
    /// deadline moves (never back) to its issue time plus each pod's `fenceAfter`, and the
    /// caller issues the next nonce ([`Self::reissue`]). Anything else (an older nonce, a
    /// guess) changes nothing.
    pub fn accept(&mut self, returned: &str) -> bool {
        let Some(issued) = self
            .recent
            .iter()
            .find(|(n, _)| !n.is_empty() && n == returned)
            .map(|(_, t)| *t)
        else {
            return false;
        };
        self.base = Some(self.base.map_or(issued, |b| b.max(issued)));
        true
    }

    /// Issues `nonce` at `now` (before it is published, so its issue time is never later than
    /// its receipt). A nonce read long ago is worth less: a provider issues a new one from
    /// time to time even when none comes back, so a consumer that returns (a restarted
    /// controller) renews with a fresh one.
    pub fn reissue(&mut self, nonce: String, now: Instant) {
        self.recent.push_back((nonce, now));
        while self.recent.len() > RECENT_NONCES {
            self.recent.pop_front();
        }
    }

    /// The issue time of the newest accepted nonce.
    pub fn base(&self) -> Option<Instant> {
        self.base
    }

    /// Whether the pods fenced after `fence_after` must be stopped at `now`.
    pub fn due(&self, fence_after: Duration, now: Instant) -> bool {
        self.base
            .is_none_or(|b| now.saturating_duration_since(b) >= fence_after)
    }
}

/// The monotonic instant of a base the provider persisted as wall-clock time
/// (`accepted_at_ms`, Unix milliseconds), read back after a restart at `now` (wall clock
/// `wall_now_ms`): as long before `now` as the wall clock says. None when that is before this
/// process's clock began (every deadline has passed). A wall clock that went back reads as no
/// time passed.
pub fn base_from_wall(accepted_at_ms: i64, wall_now_ms: i64, now: Instant) -> Option<Instant> {
    let elapsed = u64::try_from(wall_now_ms.saturating_sub(accepted_at_ms)).unwrap_or(0);
    now.checked_sub(Duration::from_millis(elapsed))
}

/// The consumer's side: the newest nonce received, and when.
#[derive(Clone, Debug, Default)]
pub struct Receipt {
    nonce: Option<String>,
    at: Option<Instant>,
}

impl Receipt {
    /// The provider's current nonce read at `now`; true when it is new (to be handed back).
    pub fn receive(&mut self, nonce: &str, now: Instant) -> bool {
        if self.nonce.as_deref() == Some(nonce) {
            return false;
        }
        self.nonce = Some(nonce.to_string());
        self.at = Some(now);
        true
    }

    /// The newest nonce received.
    pub fn nonce(&self) -> Option<&str> {
        self.nonce.as_deref()
    }

    /// How long ago the newest nonce was received (None: none since this process started —
    /// whatever an earlier process received, it cannot say when, so nothing is confirmed).
    pub fn age(&self, now: Instant) -> Option<Duration> {
        self.at.map(|t| now.saturating_duration_since(t))
    }

    /// Whether a pod fenced after `fence_after` is certainly stopped on the provider at `now`.
    pub fn confirms_stopped(&self, fence_after: Duration, margin: Duration, now: Instant) -> bool {
        self.age(now)
            .is_some_and(|age| age >= consumer_wait(fence_after, margin))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn durations_read_as_offloadings_write_them() {
        assert_eq!(parse("10s"), Some(S(10)));
        assert_eq!(parse("1m30s"), Some(S(90)));
        assert_eq!(parse("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse("ten"), None);
        assert_eq!(whole_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(whole_seconds(S(4)), 4);
    }

    /// The provider's deadline never passes after the consumer's confirmation, whatever the
    /// message delays: nonces issued at 0 and 2 s, the second one received late, handed back
    /// late, then the partition.
    #[test]
    fn the_consumer_confirms_no_earlier_than_the_provider_fences() {
        let t0 = Instant::now();
        let fence_after = S(10);
        let margin = S(3);
        let mut provider = ProviderLease::new("n1".into(), t0, Some(t0));
        let mut consumer = Receipt::default();
        // n1 reaches the consumer 1.5 s after it was issued, and is handed back at 1.9 s.
        assert!(consumer.receive("n1", t0 + Duration::from_millis(1500)));
        assert!(provider.accept("n1"));
        provider.reissue("n2".into(), t0 + Duration::from_millis(1900));
        // n2 is received 4 s after its issue; the hand-back is lost in the partition.
        assert!(consumer.receive("n2", t0 + Duration::from_millis(5900)));
        assert!(!consumer.receive("n2", t0 + S(7)));
        // The provider's deadline counts from n1's issue (0 s): due at 10 s.
        assert!(!provider.due(fence_after, t0 + Duration::from_millis(9999)));
        assert!(provider.due(fence_after, t0 + S(10)));
        // The consumer counts from n2's receipt (5.9 s): nothing before 5.9 + 10.2 + 3.
        let wait = consumer_wait(fence_after, margin);
        assert!(wait > S(13) && wait < S(14));
        assert!(!consumer.confirms_stopped(fence_after, margin, t0 + S(18)));
        assert!(consumer.confirms_stopped(fence_after, margin, t0 + S(20)));
    }

    #[test]
    fn only_a_recent_nonce_renews_the_lease_and_never_moves_it_back() {
        let t0 = Instant::now();
        let mut provider = ProviderLease::new("n1".into(), t0, Some(t0));
        assert!(provider.accept("n1"));
        for (i, nonce) in ["n2", "n3", "n4", "n5"].iter().enumerate() {
            provider.reissue(nonce.to_string(), t0 + S(i as u64 + 1));
        }
        assert_eq!(provider.nonce(), "n5");
        // n1 is out of the window: a replay (or a guess) does not move the deadline.
        assert!(!provider.accept("n1"));
        assert!(!provider.accept(""));
        assert_eq!(provider.base(), Some(t0));
        assert!(provider.due(S(10), t0 + S(10)));
        // n4 was read just before n5 was issued: it still renews, from its own issue time.
        assert!(provider.accept("n4"));
        assert_eq!(provider.base(), Some(t0 + S(3)));
        // n2, handed back late, does not move the deadline back.
        assert!(provider.accept("n2"));
        assert_eq!(provider.base(), Some(t0 + S(3)));
        assert!(!provider.due(S(10), t0 + S(10)));
    }

    #[test]
    fn a_consumer_that_received_nothing_confirms_nothing() {
        let receipt = Receipt::default();
        assert!(!receipt.confirms_stopped(S(0), S(0), Instant::now() + S(3600)));
        assert_eq!(receipt.age(Instant::now()), None);
    }

    #[test]
    fn a_restarted_provider_counts_from_the_persisted_base() {
        let now = Instant::now() + S(100);
        let base = base_from_wall(1_000_000, 1_004_000, now);
        assert_eq!(base, Some(now - S(4)));
        // A wall clock that went back counts as no time passed.
        assert_eq!(base_from_wall(1_004_000, 1_000_000, now), Some(now));
        // A base older than this process's clock: every deadline has passed.
        let lease = ProviderLease::new("n".into(), now, base_from_wall(0, i64::MAX, now));
        assert!(lease.due(S(3600), now));
    }
}
