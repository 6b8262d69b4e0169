//! Background tasks bound to the scope that spawned them.

use tokio::task::JoinHandle;

/// Aborts its tasks when dropped: a watch or server spawned for a reconciler stops with it,
/// whichever way the reconciler ends (returned, failed, or aborted itself).
pub(crate) struct AbortOnDrop(Vec<JoinHandle<()>>);

impl AbortOnDrop {
    pub(crate) fn new(task: JoinHandle<()>) -> Self {
        AbortOnDrop(vec![task])
    }

    pub(crate) fn all(tasks: Vec<JoinHandle<()>>) -> Self {
        AbortOnDrop(tasks)
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}
