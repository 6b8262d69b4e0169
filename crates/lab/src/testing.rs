//! Helpers for tests that drive lab clusters (this crate's, the controller's, the CLI's).

use std::future::Future;
use std::time::Duration;

/// Polls `check` every 100 ms until it returns Some, panicking with `what` after `timeout`.
pub async fn until<T, F, Fut>(what: &str, timeout: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    until_every(what, timeout, Duration::from_millis(100), check).await
}

/// Polls `check` every `interval` until it returns Some, panicking with `what` after `timeout`.
pub async fn until_every<T, F, Fut>(
    what: &str,
    timeout: Duration,
    interval: Duration,
    mut check: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(interval).await;
    }
}
