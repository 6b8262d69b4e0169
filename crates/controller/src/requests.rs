//! Requests to a cluster whose answer is not wanted, or not wanted late.

use kube::Client;

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
