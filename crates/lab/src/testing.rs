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
        // The check itself is bounded too: a request that never answers fails the wait
        // naming what it was for, instead of hanging the test until the harness kills it.
        let Ok(found) = tokio::time::timeout_at(deadline, check()).await else {
            panic!("timed out after {timeout:?} waiting for {what} (a check did not return)");
        };
        if let Some(v) = found {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(interval).await;
    }
}
