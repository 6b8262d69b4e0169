//! Services and EndpointSlices as kube-proxy and cluster DNS see them: the caches network
//! mode's proxy, load balancer and DNS server read.

use super::error::NetworkError;

/// Services and EndpointSlices as kube-proxy and cluster DNS see them: two caches kept by
/// watches, and a counter that moves on every change.
#[derive(Clone)]
pub struct ServiceView {
    /// Every Service.
    pub services: kube::runtime::reflector::Store<k8s_openapi::api::core::v1::Service>,
    /// Every EndpointSlice.
    pub slices: kube::runtime::reflector::Store<k8s_openapi::api::discovery::v1::EndpointSlice>,
    /// Bumped on each change.
    pub changes: tokio::sync::watch::Receiver<u64>,
}

impl ServiceView {
    /// Starts the watches (stopped with the returned task) and waits for the first lists.
    pub async fn start(
        client: kube::Client,
    ) -> Result<(ServiceView, tokio::task::JoinHandle<()>), NetworkError> {
        use futures::StreamExt;
        use k8s_openapi::api::core::v1::Service;
        use k8s_openapi::api::discovery::v1::EndpointSlice;
        use kube::runtime::{WatchStreamExt, reflector, watcher};
        let (services, svc_writer) = reflector::store::<Service>();
        let (slices, slice_writer) = reflector::store::<EndpointSlice>();
        let svc = reflector::reflector(
            svc_writer,
            watcher(
                kube::Api::<Service>::all(client.clone()),
                Default::default(),
            ),
        )
        .default_backoff()
        .map(|_| ())
        .boxed();
        let eps = reflector::reflector(
            slice_writer,
            watcher(kube::Api::<EndpointSlice>::all(client), Default::default()),
        )
        .default_backoff()
        .map(|_| ())
        .boxed();
        let (tx, changes) = tokio::sync::watch::channel(0u64);
        let task = tokio::spawn(async move {
            let mut both = futures::stream::select(svc, eps);
            while both.next().await.is_some() {
                tx.send_modify(|n| *n += 1);
            }
        });
        let watch = |kind| move |source| NetworkError::Watch { kind, source };
        services
            .wait_until_ready()
            .await
            .map_err(watch("Services"))?;
        slices
            .wait_until_ready()
            .await
            .map_err(watch("EndpointSlices"))?;
        Ok((
            ServiceView {
                services,
                slices,
                changes,
            },
            task,
        ))
    }
}
