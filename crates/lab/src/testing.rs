//! Helpers for tests that drive lab clusters (this crate's, the controller's, the CLI's).

use std::future::Future;
use std::path::Path;
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

/// Runs the real `kubectl --kubeconfig <kubeconfig> <args>` with `HOME` at `home` (so its
/// discovery cache stays in the test's directory), feeding it `stdin`; returns whether it
/// succeeded and what it printed (stdout, then stderr).
pub async fn kubectl(
    kubeconfig: &Path,
    home: &Path,
    args: &[&str],
    stdin: Option<&str>,
) -> (bool, String) {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env("HOME", home)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("kubectl is installed");
    let mut input = child.stdin.take().expect("kubectl's stdin");
    if let Some(s) = stdin {
        input
            .write_all(s.as_bytes())
            .await
            .expect("kubectl's stdin written");
    }
    drop(input);
    // kubectl waits for an answer forever by default: a request the server never answers
    // fails the test here, naming the command, instead of hanging it until the harness kills it.
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(120),
        child.wait_with_output(),
    )
    .await
    .unwrap_or_else(|_| panic!("kubectl {args:?} did not finish within 120 s"))
    .expect("kubectl ran");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Whether a network-mode test can run: true as root; otherwise it skips with a message,
/// except under `CI=true`, where a missing root fails the test instead of skipping it.
pub fn network_tests_can_run() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "network-mode tests need root and CI=true: refusing to skip"
    );
    eprintln!("skipped: network-mode tests need root");
    false
}
