//! Starting and stopping a controller: load the identity, then run the provider-side and
//! consumer-side reconcilers until shut down.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::Client;
use tokio::sync::oneshot;
use tokio::task::JoinSet;

use crate::context::{Context, Options};
use crate::install::InstallError;
use crate::metrics::Metrics;

/// A running controller; dropping it (or [`Controller::shutdown`]) stops every task.
pub struct Controller {
    tasks: JoinSet<()>,
    metrics: Arc<Metrics>,
    metrics_addr: Option<std::net::SocketAddr>,
    /// With leader election: how to ask for the Lease to be given up, and the answer that it
    /// was (see [`Controller::stop`]).
    release: Option<(oneshot::Sender<()>, oneshot::Receiver<()>)>,
}

/// Sends a write whose answer (the whole object written) is not needed: it is not decoded.
/// The virtual kubelet and the shadow-pod controller send such writes for every offloaded pod;
/// decoding each answer into a typed object (managedFields included) cost more than the write.
pub(crate) async fn send_unread(
    client: &Client,
    request: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
) -> kube::Result<()> {
    let request = request.map_err(kube::Error::BuildRequest)?;
    client.request_text(request).await.map(drop)
}

/// Creates the object `body` (JSON) of kind `K` in `namespace`; see [`send_unread`].
pub(crate) async fn create_unread<K>(
    client: &Client,
    namespace: &str,
    body: &impl serde::Serialize,
) -> kube::Result<()>
where
    K: kube::Resource<DynamicType = ()>,
{
    let body = serde_json::to_vec(body).map_err(kube::Error::SerdeError)?;
    let request = kube::core::Request::new(K::url_path(&(), Some(namespace)))
        .create(&kube::api::PostParams::default(), body);
    send_unread(client, request).await
}

/// `request`, failing as unanswered once `limit` has passed (a peer behind a partition that
/// drops packets would otherwise hold the caller for the client's read timeout).
pub(crate) async fn within<T>(
    limit: std::time::Duration,
    request: impl std::future::Future<Output = kube::Result<T>>,
) -> kube::Result<T> {
    match tokio::time::timeout(limit, request).await {
        Ok(answer) => answer,
        Err(_) => Err(kube::Error::Service(
            format!("no answer within {}s", limit.as_secs_f64()).into(),
        )),
    }
}

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

impl Controller {
    /// Starts this cluster's controller. Tandem's manifests must be applied; on the first
    /// start it completes what they leave to it ([`bootstrap`]). With leader election, the
    /// reconcilers (and the bootstrap) wait until this replica holds the Lease, and stop when
    /// it loses it ([`Controller::wait`] returns then); `/metrics` and `/healthz` are served
    /// from the start.
    ///
    /// [`bootstrap`]: crate::install::bootstrap
    pub async fn start(client: Client, options: Options) -> Result<Controller, InstallError> {
        let metrics = Arc::new(Metrics::new());
        let client = metrics.counted(client, "local");
        let mut tasks = JoinSet::new();
        let metrics_addr = match options.metrics_addr {
            Some(addr) => {
                let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
                    InstallError::Settings(format!("listening on {addr} for /metrics: {e}"))
                })?;
                let bound = listener.local_addr().ok();
                tasks.spawn(crate::metrics::serve(
                    listener,
                    metrics.clone(),
                    client.clone(),
                ));
                bound
            }
            None => None,
        };
        let release = match options.leader_election.clone() {
            None => {
                let identity = crate::install::bootstrap(&client).await?;
                run_reconcilers(client, identity, options, metrics.clone(), &mut tasks);
                None
            }
            Some(election) => {
                let (release, released_rx) = oneshot::channel();
                let (released_tx, released) = oneshot::channel();
                let metrics = metrics.clone();
                tasks.spawn(async move {
                    let mut elector = crate::leader::Elector::new(client.clone(), election);
                    elector.acquire().await;
                    let mut released_rx = released_rx;
                    let bootstrap = async {
                        loop {
                            match crate::install::bootstrap(&client).await {
                                Ok(identity) => return identity,
                                Err(e) => {
                                    tracing::warn!(error = %crate::error::chain(&e), "starting");
                                    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
                                }
                            }
                        }
                    };
                    let mut reconcilers = JoinSet::new();
                    let release = tokio::select! {
                        identity = bootstrap => {
                            run_reconcilers(client.clone(), identity, options, metrics, &mut reconcilers);
                            tokio::select! {
                                () = elector.keep() => false,
                                _ = reconcilers.join_next() => false,
                                _ = &mut released_rx => true,
                            }
                        }
                        () = elector.keep() => false,
                        _ = &mut released_rx => true,
                    };
                    // Nothing writes once the Lease may be someone else's.
                    reconcilers.abort_all();
                    while reconcilers.join_next().await.is_some() {}
                    if release {
                        elector.release().await;
                    }
                    let _ = released_tx.send(());
                });
                Some((release, released))
            }
        };
        Ok(Controller {
            tasks,
            metrics,
            metrics_addr,
            release,
        })
    }

    /// What this controller counts (what `/metrics` shows).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Where `/metrics` is served, if it is.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics_addr
    }

    /// Runs until one of the tasks ends (they only end on a fatal error, or when this replica
    /// lost the leader Lease).
    pub async fn wait(&mut self) {
        if let Some(Err(e)) = self.tasks.join_next().await {
            tracing::error!(error = %e, "controller task failed");
        }
    }

    /// Stops gracefully (SIGTERM): the reconcilers stop, then the leader Lease is given up so
    /// that another replica takes over at once.
    pub async fn stop(mut self) {
        if let Some((release, released)) = self.release.take()
            && release.send(()).is_ok()
        {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), released).await;
        }
        self.tasks.abort_all();
    }

    /// Stops every task (like SIGKILL for the controller: nothing is cleaned up).
    pub fn shutdown(mut self) {
        self.tasks.abort_all();
    }
}

/// Spawns every reconciler into `tasks`.
fn run_reconcilers(
    client: Client,
    identity: crate::identity::ClusterIdentity,
    options: Options,
    metrics: Arc<Metrics>,
    tasks: &mut JoinSet<()>,
) {
    metrics.set_started();
    let (settings, watch_settings) = crate::context::SettingsCache::watch(&client);
    tasks.spawn(watch_settings);
    let (gateways, watch_gateways) = crate::context::GatewayCache::watch(&client);
    tasks.spawn(watch_gateways);
    let (shared, watch_shared) = crate::consumer::vk::SharedWatches::watch(&client);
    tasks.spawn(watch_shared);
    let ctx = Arc::new(Context {
        settings,
        gateways,
        shared,
        client,
        identity,
        options,
        metrics,
        peer_clients: Default::default(),
        ipam: Default::default(),
    });
    crate::provider::spawn(&ctx, tasks);
    crate::consumer::spawn(&ctx, tasks);
    tasks.spawn(crate::fabric::gateway::run(ctx.clone()));
    tasks.spawn(crate::discovery::run(ctx.clone()));
    tracing::info!(cluster_id = %ctx.identity.cluster_id, "controller started");
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
