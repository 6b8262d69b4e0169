//! The loop of the reconcilers that keep an index of what their watches deliver (the virtual
//! kubelet, the shadow pod controller): wait for one event, take every event ready since (up
//! to a batch), decide once for all of them, then make the writes with a bound on those in
//! flight and feed their outcomes back. Deciding once per batch rather than per event is what
//! keeps a burst of thousands of pods linear.

use std::future::Future;

use futures::StreamExt;

/// Bounds of one index loop.
#[derive(Clone, Copy, Debug)]
pub(crate) struct IndexLoop {
    /// Events taken at most after the first one, before deciding.
    pub batch: usize,
    /// Writes in flight at once.
    pub parallel: usize,
}

impl IndexLoop {
    /// Gives `apply` the events `ready` has without waiting, up to a batch. `ready` is a
    /// non-blocking receive (`try_recv`, `now_or_never`): it must not consume the task's
    /// cooperative budget, or a batch would end early.
    pub(crate) fn drain<T>(&self, mut ready: impl FnMut() -> Option<T>, mut apply: impl FnMut(T)) {
        for _ in 0..self.batch {
            match ready() {
                Some(event) => apply(event),
                None => break,
            }
        }
    }

    /// Makes the writes `actions`, at most `parallel` at once; their outcomes, in the order
    /// they finish.
    pub(crate) async fn act<A, O, F>(&self, actions: Vec<A>, act: impl FnMut(A) -> F) -> Vec<O>
    where
        F: Future<Output = O>,
    {
        futures::stream::iter(actions)
            .map(act)
            .buffer_unordered(self.parallel)
            .collect()
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_takes_what_is_ready_up_to_its_bound() {
        let bounds = IndexLoop {
            batch: 3,
            parallel: 1,
        };
        let mut queue: std::collections::VecDeque<u32> = (1..=5).collect();
        let mut got = Vec::new();
        bounds.drain(|| queue.pop_front(), |e| got.push(e));
        assert_eq!(got, [1, 2, 3]);
        got.clear();
        bounds.drain(|| queue.pop_front(), |e| got.push(e));
        assert_eq!(got, [4, 5], "a short batch ends where the ready events end");
    }

    #[tokio::test]
    async fn writes_run_at_most_parallel_at_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let bounds = IndexLoop {
            batch: 1,
            parallel: 2,
        };
        let (now, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let outcomes = bounds
            .act((0..6).collect(), |i: u32| {
                let (now, most) = (&now, &most);
                async move {
                    most.fetch_max(now.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    now.fetch_sub(1, Ordering::SeqCst);
                    i * 10
                }
            })
            .await;
        let mut sorted = outcomes.clone();
        sorted.sort();
        assert_eq!(sorted, [0, 10, 20, 30, 40, 50]);
        assert_eq!(most.load(Ordering::SeqCst), 2);
    }
}
