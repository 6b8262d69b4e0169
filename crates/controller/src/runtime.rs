//! Starting and stopping a controller: load the identity, then run the provider-side and
//! consumer-side reconcilers until shut down.

use std::sync::Arc;

use kube::Client;
use tokio::task::JoinSet;

use crate::context::{Context, Options};
use crate::install::InstallError;

/// A running controller; dropping it (or [`Controller::shutdown`]) stops every task.
pub struct Controller {
    pub ctx: Arc<Context>,
    tasks: JoinSet<()>,
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

impl Controller {
    /// Starts every reconciler of this cluster's controller. Tandem's manifests must be
    /// applied; on the first start it completes what they leave to it ([`bootstrap`]).
    ///
    /// [`bootstrap`]: crate::install::bootstrap
    pub async fn start(client: Client, options: Options) -> Result<Controller, InstallError> {
        let identity = crate::install::bootstrap(&client).await?;
        let ctx = Arc::new(Context {
            client,
            identity,
            options,
        });
        let mut tasks = JoinSet::new();
        crate::provider::spawn(&ctx, &mut tasks);
        crate::consumer::spawn(&ctx, &mut tasks);
        tasks.spawn(crate::fabric::gateway::run(ctx.clone()));
        tracing::info!(cluster_id = %ctx.identity.cluster_id, "controller started");
        Ok(Controller { ctx, tasks })
    }

    /// Runs until one of the tasks ends (they only end on a fatal error).
    pub async fn wait(mut self) {
        if let Some(Err(e)) = self.tasks.join_next().await {
            tracing::error!(error = %e, "controller task failed");
        }
    }

    /// Stops every task (like SIGKILL for the controller: nothing is cleaned up).
    pub fn shutdown(mut self) {
        self.tasks.abort_all();
    }
}
