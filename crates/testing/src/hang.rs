//! What a hung test was waiting for. The test harness ends a test that runs too long with
//! SIGTERM (nextest, after `slow-timeout`'s `terminate-after`), and a test killed that way
//! says nothing by itself. Each wait of these helpers registers itself while it lasts; on
//! SIGTERM the process prints the waits in progress, with how long each has lasted, then
//! exits as SIGTERM would have ended it.

use std::io::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The waits in progress: id, what, since when.
static WAITS: Mutex<Vec<(u64, String, Instant)>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// A wait in progress: registered until dropped.
#[must_use = "the wait is registered only while this lives"]
pub struct Waiting(u64);

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut waits = WAITS.lock().unwrap_or_else(|e| e.into_inner());
        waits.retain(|(id, _, _)| *id != self.0);
    }
}

/// Registers a wait for `what` until the guard is dropped (see the module's doc).
pub fn waiting_for(what: impl Into<String>) -> Waiting {
    install();
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    WAITS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((id, what.into(), Instant::now()));
    Waiting(id)
}

/// The waits in progress, oldest first, as printed on SIGTERM.
pub fn report() -> String {
    let waits = WAITS.lock().unwrap_or_else(|e| e.into_inner());
    if waits.is_empty() {
        return "terminated while no wait of tandem_testing was in progress".into();
    }
    let mut out = String::from("terminated while waiting for:");
    for (_, what, since) in waits.iter() {
        out.push_str(&format!("\n  - {what} (for {:.1?})", since.elapsed()));
    }
    out
}

/// Starts, once per process, the thread that prints the report on SIGTERM: a runtime of its
/// own, so that it outlives the tests' runtimes and handles the signal whichever test runs.
fn install() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("hang-report".into())
            .spawn(move || {
                let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    let _ = ready_tx.send(());
                    return;
                };
                runtime.block_on(async move {
                    use tokio::signal::unix::{SignalKind, signal};
                    let terminate = signal(SignalKind::terminate());
                    let _ = ready_tx.send(());
                    if let Ok(mut terminate) = terminate
                        && terminate.recv().await.is_some()
                    {
                        let _ = writeln!(std::io::stderr(), "{}", report());
                        // As the signal's default action would have ended it.
                        std::process::exit(128 + 15);
                    }
                });
            });
        if spawned.is_ok() {
            // The handler is in place before the first wait starts.
            let _ = ready_rx.recv();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_names_the_waits_in_progress_only() {
        let outer = waiting_for("pod demo/web Running");
        {
            let _inner = waiting_for("kubectl get pods");
            let now = report();
            assert!(now.contains("pod demo/web Running (for "), "{now}");
            assert!(now.contains("kubectl get pods"), "{now}");
        }
        let now = report();
        assert!(!now.contains("kubectl get pods"), "{now}");
        drop(outer);
        assert!(!report().contains("demo/web"));
    }
}
