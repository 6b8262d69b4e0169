//! The scheduling queue and cache, fed by watch events: the pods to decide (by priority, then
//! arrival), those parked as unschedulable until the cluster changes, and those assumed on a
//! node while their binding is in flight.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::runtime::watcher::Event;
use tokio::time::Instant;

use super::bind::Bound;
use super::decide::decide;
use super::pod_info::{PodInfo, is_terminal, responsible_for};
use super::snapshot::Snapshot;

/// Unschedulable pods are retried at least this often when nothing changes.
const RETRY_PERIOD: Duration = Duration::from_secs(10);
/// ...and at most this often when nodes or pods change.
const RETRY_MIN: Duration = Duration::from_millis(500);

/// What the scheduling loop does next for one pod.
pub(super) enum Step {
    /// Nothing (the pod went away, or its failure was already reported).
    Skip,
    /// Bind the pod, already assumed on `node`, once `claims` (WaitForFirstConsumer) name
    /// that node and are bound.
    Bind {
        uid: String,
        pod: Arc<Pod>,
        node: String,
        claims: Vec<String>,
    },
    /// Report why the pod fits nowhere.
    Report { pod: Arc<Pod>, message: String },
}

/// The scheduling queue and cache, fed by watch events.
pub(super) struct Queue {
    snap: Snapshot,
    /// Unbound pods this scheduler is responsible for, by uid.
    pending: HashMap<String, Arc<Pod>>,
    /// Pods to decide, highest `spec.priority` first, then in arrival order. Entries whose
    /// uid is no longer in `in_active` are stale and skipped (removal is lazy, O(1)).
    active: BinaryHeap<(i32, Reverse<u64>, String)>,
    in_active: HashSet<String>,
    arrivals: u64,
    unschedulable: HashSet<String>,
    /// Pods assumed on a node while their binding is in flight.
    assumed: HashMap<String, String>,
    /// Last failure message reported per pod (reported again only when it changes).
    reported: HashMap<String, String>,
    changed: bool,
    last_retry: Instant,
    pub(super) nodes_synced: bool,
    pub(super) pods_synced: bool,
    /// Claims, volumes and classes listed (pods with claims wait for all three).
    volumes_synced: [bool; 3],
    init_nodes: HashSet<String>,
    init_pods: HashSet<String>,
}

impl Queue {
    pub(super) fn new() -> Queue {
        Queue {
            snap: Snapshot::default(),
            pending: HashMap::new(),
            active: BinaryHeap::new(),
            in_active: HashSet::new(),
            arrivals: 0,
            unschedulable: HashSet::new(),
            assumed: HashMap::new(),
            reported: HashMap::new(),
            changed: false,
            last_retry: Instant::now(),
            nodes_synced: false,
            pods_synced: false,
            volumes_synced: [false; 3],
            init_nodes: HashSet::new(),
            init_pods: HashSet::new(),
        }
    }

    pub(super) fn on_node(&mut self, event: Event<Node>) {
        match event {
            Event::Init => self.init_nodes.clear(),
            Event::InitApply(node) | Event::Apply(node) => {
                self.init_nodes
                    .insert(node.metadata.name.clone().unwrap_or_default());
                self.changed |= self.snap.apply_node(node);
            }
            Event::Delete(node) => {
                self.snap
                    .delete_node(node.metadata.name.as_deref().unwrap_or(""));
                self.changed = true;
            }
            Event::InitDone => {
                let gone: Vec<String> = self
                    .snap
                    .node_names()
                    .filter(|n| !self.init_nodes.contains(*n))
                    .map(str::to_string)
                    .collect();
                for n in gone {
                    self.snap.delete_node(&n);
                }
                self.nodes_synced = true;
                self.changed = true;
            }
        }
    }

    pub(super) fn on_claim(&mut self, event: Event<PersistentVolumeClaim>) {
        let vols = self.snap.volumes_mut();
        match event {
            Event::Init => vols.claims.clear(),
            Event::InitApply(c) | Event::Apply(c) => vols.apply_claim(c),
            Event::Delete(c) => vols.delete_claim(
                c.metadata.namespace.as_deref().unwrap_or(""),
                c.metadata.name.as_deref().unwrap_or(""),
            ),
            Event::InitDone => self.volumes_synced[0] = true,
        }
        self.changed = true;
    }

    pub(super) fn on_volume(&mut self, event: Event<PersistentVolume>) {
        let vols = self.snap.volumes_mut();
        match event {
            Event::Init => vols.volumes.clear(),
            Event::InitApply(v) | Event::Apply(v) => vols.apply_volume(v),
            Event::Delete(v) => vols.delete_volume(v.metadata.name.as_deref().unwrap_or("")),
            Event::InitDone => self.volumes_synced[1] = true,
        }
        self.changed = true;
    }

    pub(super) fn on_class(&mut self, event: Event<StorageClass>) {
        let vols = self.snap.volumes_mut();
        match event {
            Event::Init => vols.classes.clear(),
            Event::InitApply(c) | Event::Apply(c) => vols.apply_class(c),
            Event::Delete(c) => vols.delete_class(c.metadata.name.as_deref().unwrap_or("")),
            Event::InitDone => self.volumes_synced[2] = true,
        }
        self.changed = true;
    }

    fn drop_pod(&mut self, uid: &str) {
        self.pending.remove(uid);
        self.unschedulable.remove(uid);
        self.reported.remove(uid);
        self.in_active.remove(uid);
    }

    pub(super) fn on_pod(&mut self, event: Event<Pod>) {
        match event {
            Event::Init => self.init_pods.clear(),
            Event::InitApply(pod) | Event::Apply(pod) => {
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                self.init_pods.insert(uid.clone());
                let node = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .filter(|n| !n.is_empty());
                if let Some(node) = node {
                    self.drop_pod(&uid);
                    self.assumed.remove(&uid);
                    if is_terminal(&pod) {
                        self.changed |= self.snap.forget(&uid);
                    } else if self.snap.node_of(&uid) != Some(node.as_str()) {
                        self.snap
                            .place(Arc::new(PodInfo::new(Arc::new(pod))), &node);
                    }
                } else if responsible_for(&pod)
                    && pod.metadata.deletion_timestamp.is_none()
                    && !is_terminal(&pod)
                {
                    if self.assumed.contains_key(&uid) {
                        return;
                    }
                    self.pending.insert(uid.clone(), Arc::new(pod));
                    if !self.unschedulable.contains(&uid) {
                        self.enqueue(uid);
                    }
                } else {
                    self.drop_pod(&uid);
                }
            }
            Event::Delete(pod) => {
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                self.drop_pod(&uid);
                self.assumed.remove(&uid);
                self.changed |= self.snap.forget(&uid);
            }
            Event::InitDone => {
                let gone: Vec<String> = self
                    .snap
                    .placed_uids()
                    .chain(self.pending.keys())
                    .filter(|u| !self.init_pods.contains(*u) && !self.assumed.contains_key(*u))
                    .cloned()
                    .collect();
                for uid in gone {
                    self.drop_pod(&uid);
                    self.snap.forget(&uid);
                }
                self.pods_synced = true;
                self.changed = true;
            }
        }
    }

    pub(super) fn on_bound(&mut self, bound: Bound) {
        let Err(e) = bound.result else { return };
        if self.assumed.get(&bound.uid) != Some(&bound.node) {
            return;
        }
        tracing::warn!(uid = %bound.uid, node = %bound.node, "binding failed: {e}");
        self.assumed.remove(&bound.uid);
        self.snap.forget(&bound.uid);
        if self.pending.contains_key(&bound.uid) {
            self.unschedulable.insert(bound.uid);
        }
        self.changed = true;
    }

    /// Adds a pending pod to the active queue (once).
    fn enqueue(&mut self, uid: String) {
        if self.in_active.insert(uid.clone()) {
            let priority = self
                .pending
                .get(&uid)
                .and_then(|p| p.spec.as_ref()?.priority)
                .unwrap_or(0);
            self.arrivals += 1;
            self.active.push((priority, Reverse(self.arrivals), uid));
        }
    }

    /// Decides the next pod of the active queue: assumes it on its node (to be bound), or
    /// parks it as unschedulable (to be reported if the reason changed). None when the active
    /// queue is empty.
    pub(super) fn step(&mut self) -> Option<Step> {
        let uid = loop {
            let (_, _, uid) = self.active.pop()?;
            if self.in_active.remove(&uid) {
                break uid;
            }
        };
        let Some(pod) = self.pending.get(&uid).cloned() else {
            return Some(Step::Skip);
        };
        let info = Arc::new(PodInfo::new(pod.clone()));
        if !info.claims.is_empty() && self.volumes_synced.contains(&false) {
            // Judged once the claims, volumes and classes are listed.
            self.unschedulable.insert(uid);
            return Some(Step::Skip);
        }
        Some(match decide(&self.snap, &info) {
            Ok(node) => {
                let claims = if info.claims.is_empty() {
                    Vec::new()
                } else {
                    self.snap.claims_to_select(&info)
                };
                self.snap.place(info, &node);
                self.assumed.insert(uid.clone(), node.clone());
                Step::Bind {
                    uid,
                    pod,
                    node,
                    claims,
                }
            }
            Err(fit) => {
                let message = fit.to_string();
                self.unschedulable.insert(uid.clone());
                if self.reported.get(&uid) == Some(&message) {
                    Step::Skip
                } else {
                    self.reported.insert(uid, message.clone());
                    Step::Report { pod, message }
                }
            }
        })
    }

    /// Moves unschedulable pods back to the active queue when the cluster changed (or
    /// periodically).
    pub(super) fn maybe_retry(&mut self) {
        self.retry_if(false);
    }

    #[cfg(test)]
    fn maybe_retry_now(&mut self) {
        self.retry_if(true);
    }

    fn retry_if(&mut self, force: bool) {
        let since = self.last_retry.elapsed();
        if force || (self.changed && since >= RETRY_MIN) || since >= RETRY_PERIOD {
            self.changed = false;
            self.last_retry = Instant::now();
            let parked: Vec<String> = self.unschedulable.drain().collect();
            for uid in parked {
                self.enqueue(uid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::fixtures::{NodeFixture, PodFixture, claim_volume, nodes, snapshot};
    use serde_json::json;

    #[test]
    fn pods_without_claims_never_look_at_volumes() {
        // No claim, no class, not even the storage caches: the pod schedules as before.
        let snap = snapshot(nodes(&["a"]), vec![]);
        let pod = PodFixture::new("web").info();
        assert!(pod.claims.is_empty());
        assert_eq!(decide(&snap, &pod), Ok("a".to_string()));
        let mut q = synced_queue(nodes(&["a"]));
        q.on_pod(pod_event(PodFixture::new("web")));
        assert!(
            matches!(q.step(), Some(Step::Bind { claims, .. }) if claims.is_empty()),
            "bound although the storage watches have not listed yet"
        );
        // A pod with a claim waits for them.
        q.on_pod(pod_event(claim_volume(PodFixture::new("db"), "data")));
        assert!(matches!(q.step(), Some(Step::Skip)));
        assert!(q.unschedulable.contains("db"));
    }

    fn node_event(n: NodeFixture) -> Event<Node> {
        Event::Apply(n.build())
    }

    fn pod_event(p: PodFixture) -> Event<Pod> {
        Event::Apply(serde_json::from_value(p.0).expect("valid pod fixture"))
    }

    fn synced_queue(nodes: Vec<NodeFixture>) -> Queue {
        let mut q = Queue::new();
        q.on_node(Event::Init);
        for n in nodes {
            q.on_node(Event::InitApply(n.build()));
        }
        q.on_node(Event::InitDone);
        q.on_pod(Event::Init);
        q.on_pod(Event::InitDone);
        q
    }

    #[test]
    fn queue_assumes_binds_and_accounts_bound_pods() {
        let mut q = synced_queue(vec![NodeFixture::new("a").alloc("1", "1Gi")]);
        q.on_pod(pod_event(PodFixture::new("web").requests("600m", "64Mi")));
        q.on_pod(pod_event(PodFixture::new("api").requests("600m", "64Mi")));
        let Some(Step::Bind { uid, node, .. }) = q.step() else {
            panic!("web is bound first");
        };
        assert_eq!((uid.as_str(), node.as_str()), ("web", "a"));
        // web is assumed: api no longer fits, and the failure is reported once.
        let Some(Step::Report { message, .. }) = q.step() else {
            panic!("api does not fit");
        };
        assert!(message.contains("1 Insufficient cpu"), "{message}");
        assert!(q.step().is_none());
        q.maybe_retry_now();
        assert!(
            matches!(q.step(), Some(Step::Skip)),
            "same reason, not reported twice"
        );
        // web's binding failed: it is forgotten, and api fits after the next retry.
        q.on_bound(Bound {
            uid: "web".into(),
            node: "a".into(),
            result: Err(kube::Error::LinesCodecMaxLineLengthExceeded.into()),
            counted: true,
        });
        q.maybe_retry_now();
        let bound: Vec<String> = std::iter::from_fn(|| q.step())
            .filter_map(|s| match s {
                Step::Bind { uid, .. } => Some(uid),
                _ => None,
            })
            .collect();
        assert_eq!(bound.len(), 1, "one of the two fits: {bound:?}");
        // A pod bound by someone else counts against its node; deleting it frees the node.
        q.on_pod(pod_event({
            let mut p = PodFixture::new("other").requests("100m", "1Mi");
            p.0["spec"]["nodeName"] = json!("a");
            p
        }));
        assert_eq!(q.snap.node_of("other"), Some("a"));
        q.on_pod(Event::Delete(
            serde_json::from_value(PodFixture::new("other").0).expect("pod"),
        ));
        assert_eq!(q.snap.node_of("other"), None);
    }

    #[test]
    fn queue_decides_higher_priority_first_then_in_arrival_order() {
        let mut q = synced_queue(nodes(&["a"]));
        for (name, priority) in [("low", 0), ("high", 1000), ("low-2", 0), ("mid", 10)] {
            let mut p = PodFixture::new(name);
            p.0["spec"]["priority"] = json!(priority);
            q.on_pod(pod_event(p));
        }
        // Deleted while queued: skipped.
        q.on_pod(Event::Delete(
            serde_json::from_value(PodFixture::new("mid").0).expect("pod"),
        ));
        let order: Vec<String> = std::iter::from_fn(|| q.step())
            .filter_map(|s| match s {
                Step::Bind { uid, .. } => Some(uid),
                _ => None,
            })
            .collect();
        assert_eq!(order, ["high", "low", "low-2"]);
    }

    #[test]
    fn queue_ignores_other_schedulers_and_waits_for_sync() {
        let mut q = Queue::new();
        q.on_pod(pod_event(PodFixture::new("early")));
        assert!(!q.nodes_synced, "no decisions before the node list is in");
        let mut q = synced_queue(nodes(&["a"]));
        let mut custom = PodFixture::new("custom");
        custom.0["spec"]["schedulerName"] = json!("my-scheduler");
        q.on_pod(pod_event(custom));
        assert!(
            q.step().is_none(),
            "pods of other schedulers are not queued"
        );
        q.on_pod(pod_event(PodFixture::new("mine")));
        assert!(matches!(q.step(), Some(Step::Bind { .. })));
    }

    #[test]
    fn unschedulable_pods_retry_when_a_node_changes() {
        let mut q = synced_queue(vec![NodeFixture::new("a").taint("k", "v", "NoSchedule")]);
        q.on_pod(pod_event(PodFixture::new("web")));
        assert!(matches!(q.step(), Some(Step::Report { .. })));
        q.last_retry = Instant::now() - RETRY_MIN;
        q.on_node(node_event(NodeFixture::new("a").label("unrelated", "yes")));
        q.maybe_retry();
        let Some(Step::Bind { node, .. }) = q.step() else {
            panic!("retried and bound once the taint is gone");
        };
        assert_eq!(node, "a");
    }
}
