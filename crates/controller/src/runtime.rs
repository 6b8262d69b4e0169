//! Starting and stopping a controller: load the identity, then run the provider-side and
//! consumer-side reconcilers until shut down.

use std::sync::Arc;

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
    tasks.spawn(crate::coredns::run(ctx.clone()));
    tracing::info!(cluster_id = %ctx.identity.cluster_id, "controller started");
}
