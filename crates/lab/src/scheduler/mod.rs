//! The scheduler: binds pending pods to nodes through the binding subresource.
//!
//! Decide is separate from act: [`Snapshot`] is a synchronous, incrementally maintained view
//! of nodes and the pods placed on them (bound or assumed), and [`fn@decide`] is a pure function
//! from a snapshot and a pod to a node name or a [`FitError`] worded like kube-scheduler's.
//! [`run`] only feeds watch events into the snapshot, binds and reports.
//!
//! The parts, each below the ones that use it: [`pod_info`] and [`matching`], [`volumes`] and
//! [`snapshot`], the Filter and Score plugins ([`filter`], [`score`]) and [`mod@decide`], then
//! the [`queue`] and [`mod@bind`]ing; this module only runs them.

pub mod bind;
pub mod decide;
pub mod filter;
pub mod fit_error;
#[cfg(test)]
mod fixtures;
pub mod matching;
pub mod pod_info;
pub mod queue;
pub mod score;
pub mod snapshot;
pub mod volumes;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::{mpsc, watch};

pub use decide::decide;
pub use fit_error::FitError;
pub use matching::{label_selector_matches, selects_node, term_matches, tolerates};
pub use pod_info::{PodClaim, PodInfo, Resources, SCHEDULER_NAME};
pub use snapshot::{NodeState, Snapshot};
pub use volumes::{Volumes, volume_matches, volume_reachable_from};

use bind::{Bound, bind, report};
use queue::{Queue, Step};

/// How many bindings may be in flight at once (more only queues in the API server).
const MAX_IN_FLIGHT: usize = 64;
/// How many failure reports (status patch and event) may be in flight at once.
const MAX_REPORTS: usize = 16;
/// How many pods one loop turn decides before it looks at events again.
const BATCH: usize = 512;

/// Runs the scheduler until the process ends. `nodes_seen` carries the resourceVersion of the
/// last node event its cache has applied (the lab's resourceVersions are one increasing
/// counter), so tests can wait until a node change is visible to scheduling decisions.
pub async fn run(client: kube::Client, nodes_seen: watch::Sender<u64>) {
    let nodes = watcher(Api::<Node>::all(client.clone()));
    let pods = watcher(Api::<Pod>::all(client.clone()));
    let claims = watcher(Api::<PersistentVolumeClaim>::all(client.clone()));
    let volumes = watcher(Api::<PersistentVolume>::all(client.clone()));
    let classes = watcher(Api::<StorageClass>::all(client.clone()));
    futures::pin_mut!(nodes, pods, claims, volumes, classes);
    let (tx, mut rx) = mpsc::unbounded_channel::<Bound>();
    let mut q = Queue::new();
    let mut in_flight = 0usize;
    let reports = Arc::new(tokio::sync::Semaphore::new(MAX_REPORTS));
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    let events = crate::events::Recorder::new(client.clone(), SCHEDULER_NAME);
    loop {
        tokio::select! {
            Some(ev) = nodes.next() => {
                let rv = node_event_version(&ev);
                q.on_node(ev);
                if let Some(rv) = rv {
                    nodes_seen.send_if_modified(|seen| {
                        let newer = rv > *seen;
                        if newer {
                            *seen = rv;
                        }
                        newer
                    });
                }
            }
            Some(ev) = pods.next() => q.on_pod(ev),
            Some(ev) = claims.next() => q.on_claim(ev),
            Some(ev) = volumes.next() => q.on_volume(ev),
            Some(ev) = classes.next() => q.on_class(ev),
            Some(b) = rx.recv() => { in_flight -= usize::from(b.counted); q.on_bound(b) },
            _ = tick.tick() => q.maybe_retry(),
        }
        if !(q.nodes_synced && q.pods_synced) {
            continue;
        }
        let mut budget = BATCH;
        while in_flight < MAX_IN_FLIGHT && budget > 0 {
            budget -= 1;
            match q.step() {
                None => break,
                Some(Step::Skip) => {}
                Some(Step::Bind {
                    uid,
                    pod,
                    node,
                    claims,
                }) => {
                    // Pods waiting for volumes may wait long: they do not hold up the others.
                    let counted = claims.is_empty();
                    in_flight += usize::from(counted);
                    tokio::spawn(bind(
                        client.clone(),
                        events.clone(),
                        pod,
                        uid,
                        node,
                        claims,
                        tx.clone(),
                    ));
                }
                Some(Step::Report { pod, message }) => {
                    let (client, reports) = (client.clone(), reports.clone());
                    tokio::spawn(async move {
                        let _permit = reports.acquire_owned().await;
                        report(client, pod, message).await;
                    });
                }
            }
        }
    }
}

/// The resourceVersion a node event carries, if it carries a node.
fn node_event_version(ev: &Event<Node>) -> Option<u64> {
    match ev {
        Event::InitApply(n) | Event::Apply(n) | Event::Delete(n) => {
            n.metadata.resource_version.as_deref()?.parse().ok()
        }
        Event::Init | Event::InitDone => None,
    }
}

/// A watch stream that logs and retries errors with backoff instead of ending.
fn watcher<K>(api: Api<K>) -> impl futures::Stream<Item = Event<K>> + Send
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + fmt::Debug + Send + 'static,
{
    watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .filter_map(|ev| async move { ev.map_err(|e| tracing::warn!("scheduler watch: {e}")).ok() })
}
