//! Watches that retry, and how fresh what they delivered is ([`WatchTracker`]).

use std::time::{Duration, Instant};

/// The events of a watch that retries with backoff; errors are logged (at debug level: a watch
/// that fails is retried, and the outage it reflects shows in the objects' conditions).
pub(crate) fn watch_events<K>(
    what: &'static str,
    api: kube::Api<K>,
    config: kube::runtime::watcher::Config,
) -> impl futures::Stream<Item = kube::runtime::watcher::Event<K>> + Send
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    use futures::StreamExt;
    use kube::runtime::WatchStreamExt;
    kube::runtime::watcher(api, config)
        .default_backoff()
        .filter_map(
            move |e| async move { e.map_err(|e| tracing::debug!("{what} watch: {e}")).ok() },
        )
}

/// Failures (each after kube's default backoff: 0.8 s, then doubling) after which a watch's
/// cache is taken for stale, until the watch delivers again.
pub(crate) const STALE_AFTER_FAILURES: u32 = 3;

/// How long after its last failure a watch stays stale without delivering anything. kube's
/// watcher reports no event when a retried watch succeeds, so a quiet watch back after a blip
/// shows only as failures that stop; one that keeps failing fails at least every minute (its
/// backoff stops growing at 30 s, jitter added).
pub(crate) const STALE_FOR: Duration = Duration::from_secs(90);

/// Whether what a watch has delivered can still be read as the cluster's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WatchHealth {
    /// Not listed yet.
    Listing,
    /// Listed, and the watch has not kept failing since.
    Fresh,
    /// [`STALE_AFTER_FAILURES`] failures since the watch last delivered anything, the last
    /// within [`STALE_FOR`]: its cache may be a snapshot of the past. Readers go to the API.
    Stale,
}

/// Follows one watch's health from its events (see [`WatchHealth`]). A watch that lists but
/// then fails for good (RBAC granting `list` but not `watch`, say) would otherwise go on
/// answering from its first snapshot, and say so only at debug level.
pub(crate) struct WatchTracker {
    what: &'static str,
    /// Failures since the watch last delivered something, counted afresh after a quiet
    /// [`STALE_FOR`].
    failures: u32,
    last_failure: Option<Instant>,
    ever_listed: bool,
}

impl WatchTracker {
    pub(crate) fn new(what: &'static str) -> WatchTracker {
        WatchTracker {
            what,
            failures: 0,
            last_failure: None,
            ever_listed: false,
        }
    }

    /// Notes one of the watch's events; returns its health after it. The failure that makes
    /// it stale is logged as a warning, the others at debug level.
    pub(crate) fn note<K>(
        &mut self,
        event: &Result<kube::runtime::watcher::Event<K>, kube::runtime::watcher::Error>,
    ) -> WatchHealth {
        self.note_at(event, Instant::now())
    }

    fn note_at<K>(
        &mut self,
        event: &Result<kube::runtime::watcher::Event<K>, kube::runtime::watcher::Error>,
        now: Instant,
    ) -> WatchHealth {
        use kube::runtime::watcher::Event;
        match event {
            // A new listing, or (once listed) a resumed watch delivering what it missed: the
            // cache is whole again. (During a new listing a reflector's store keeps its last
            // snapshot until InitDone.)
            Ok(Event::InitDone) => self.delivered(true, now),
            Ok(Event::Apply(_) | Event::Delete(_)) if self.ever_listed => {
                self.delivered(false, now)
            }
            Ok(_) => {}
            Err(e) => {
                if self
                    .last_failure
                    .is_some_and(|t| now.duration_since(t) >= STALE_FOR)
                {
                    self.failures = 0;
                }
                self.failures += 1;
                self.last_failure = Some(now);
                if self.failures == STALE_AFTER_FAILURES {
                    tracing::warn!(error = %e, "watching {} keeps failing: reading them from the API until it recovers", self.what);
                } else {
                    tracing::debug!(error = %e, "watching {}", self.what);
                }
            }
        }
        self.health_at(now)
    }

    fn delivered(&mut self, listing: bool, now: Instant) {
        if self.health_at(now) == WatchHealth::Stale {
            tracing::info!("watching {} works again", self.what);
        }
        self.failures = 0;
        self.ever_listed |= listing;
    }

    /// The watch's health now.
    pub(crate) fn health(&self) -> WatchHealth {
        self.health_at(Instant::now())
    }

    fn health_at(&self, now: Instant) -> WatchHealth {
        let failing = self.failures >= STALE_AFTER_FAILURES
            && self
                .last_failure
                .is_some_and(|t| now.duration_since(t) < STALE_FOR);
        match (failing, self.ever_listed) {
            (true, _) => WatchHealth::Stale,
            (false, true) => WatchHealth::Fresh,
            (false, false) => WatchHealth::Listing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::watcher::{Error, Event};

    #[test]
    fn a_watch_is_stale_after_failing_repeatedly_and_fresh_when_it_delivers_again() {
        let mut tracker = WatchTracker::new("test objects");
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let fail = || Err::<Event<()>, _>(Error::NoResourceVersion);
        // Failures before the first listing never make it fresh, and an event is no listing.
        assert_eq!(tracker.note_at(&fail(), at(0)), WatchHealth::Listing);
        assert_eq!(
            tracker.note_at(&Ok(Event::Apply(())), at(0)),
            WatchHealth::Listing
        );
        assert_eq!(
            tracker.note_at(&Ok(Event::<()>::Init), at(0)),
            WatchHealth::Listing
        );
        assert_eq!(
            tracker.note_at(&Ok(Event::<()>::InitDone), at(0)),
            WatchHealth::Fresh
        );
        for _ in 1..STALE_AFTER_FAILURES {
            assert_eq!(tracker.note_at(&fail(), at(1)), WatchHealth::Fresh);
        }
        assert_eq!(tracker.note_at(&fail(), at(2)), WatchHealth::Stale);
        assert_eq!(tracker.note_at(&fail(), at(3)), WatchHealth::Stale);
        // A resumed watch's event: whole again.
        assert_eq!(
            tracker.note_at(&Ok(Event::Delete(())), at(4)),
            WatchHealth::Fresh
        );
        // Delivering resets the count: it takes as many failures again.
        for _ in 1..STALE_AFTER_FAILURES {
            assert_eq!(tracker.note_at(&fail(), at(5)), WatchHealth::Fresh);
        }
        assert_eq!(
            tracker.note_at(&Ok(Event::Apply(())), at(5)),
            WatchHealth::Fresh
        );
        // A new listing after going stale: fresh at its end, not before.
        for _ in 0..STALE_AFTER_FAILURES {
            tracker.note_at(&fail(), at(6));
        }
        assert_eq!(
            tracker.note_at(&Ok(Event::<()>::Init), at(6)),
            WatchHealth::Stale
        );
        assert_eq!(
            tracker.note_at(&Ok(Event::InitApply(())), at(6)),
            WatchHealth::Stale
        );
        assert_eq!(
            tracker.note_at(&Ok(Event::<()>::InitDone), at(6)),
            WatchHealth::Fresh
        );
        // A quiet watch back after a blip (it resumes without an event): fresh once the
        // failures stop for long enough, and a later failure starts the count again.
        for _ in 0..STALE_AFTER_FAILURES {
            tracker.note_at(&fail(), at(10));
        }
        assert_eq!(
            tracker.health_at(at(10) + STALE_FOR / 2),
            WatchHealth::Stale
        );
        assert_eq!(tracker.health_at(at(10) + STALE_FOR), WatchHealth::Fresh);
        assert_eq!(
            tracker.note_at(&fail(), at(10) + STALE_FOR * 2),
            WatchHealth::Fresh
        );
    }
}
