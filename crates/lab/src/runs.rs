//! The kubelets' own record of when each pod's containers ran: every hollow kubelet of every
//! lab cluster in this process writes to one record, stamped with one monotonic host clock, so
//! that whether two instances of a pod (a StatefulSet's ordinal offloaded to a provider and
//! its replacement elsewhere) ever ran at the same moment is decided by comparing intervals,
//! not by sampling statuses.
//!
//! An interval opens when the kubelet starts a pod's containers and closes when it stops them:
//! for deletion, when the pod ends (Succeeded or Failed), when the pod is gone from the API, or
//! when the node is powered off (a node that crashes takes its containers with it). A hollow
//! container's restarts in a crash loop stay within one interval (the pod's sandbox runs on).

use std::collections::{HashMap, VecDeque};
use std::sync::{LazyLock, Mutex};

use tokio::time::Instant;

/// One run of a pod's containers on one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRun {
    /// The lab cluster (its name) and node the pod ran on.
    pub cluster: String,
    pub node: String,
    pub namespace: String,
    pub pod: String,
    pub uid: String,
    /// The containers' names.
    pub containers: Vec<String>,
    pub started: Instant,
    /// None while the containers run.
    pub stopped: Option<Instant>,
}

impl PodRun {
    /// Whether this run and `other` were both running at some instant (a run still going is
    /// open-ended).
    pub fn overlaps(&self, other: &PodRun) -> bool {
        let ends_after = |run: &PodRun, t: Instant| run.stopped.is_none_or(|s| s > t);
        ends_after(self, other.started) && ends_after(other, self.started)
    }
}

/// Closed runs kept: the oldest go first beyond it (a long-running lab's pods come and go).
const CLOSED_KEPT: usize = 100_000;

#[derive(Default)]
struct Record {
    /// Runs still going, by pod UID.
    open: HashMap<String, PodRun>,
    /// Runs that ended, oldest first.
    closed: VecDeque<PodRun>,
}

impl Record {
    fn close(&mut self, uid: &str, at: Instant) {
        if let Some(mut run) = self.open.remove(uid) {
            run.stopped = Some(at);
            if self.closed.len() == CLOSED_KEPT {
                self.closed.pop_front();
            }
            self.closed.push_back(run);
        }
    }
}

static RECORD: LazyLock<Mutex<Record>> = LazyLock::new(|| Mutex::new(Record::default()));

fn record() -> std::sync::MutexGuard<'static, Record> {
    // A panic elsewhere while holding the lock leaves the record whole (inserts and moves
    // only): keep using it.
    RECORD.lock().unwrap_or_else(|e| e.into_inner())
}

/// Every run so far (but the oldest beyond [`CLOSED_KEPT`]), of every lab cluster in this
/// process, in the order they started.
pub fn all() -> Vec<PodRun> {
    let record = record();
    let mut runs: Vec<PodRun> = record
        .closed
        .iter()
        .chain(record.open.values())
        .cloned()
        .collect();
    runs.sort_by_key(|r| r.started);
    runs
}

/// The runs of pods named `pod` (in any namespace, any cluster).
pub fn of_pod(pod: &str) -> Vec<PodRun> {
    all().into_iter().filter(|r| r.pod == pod).collect()
}

/// Pairs of runs of pods named `pod` in different clusters that overlapped in time.
pub fn overlaps_across_clusters(pod: &str) -> Vec<(PodRun, PodRun)> {
    let runs = of_pod(pod);
    let mut found = Vec::new();
    for (i, a) in runs.iter().enumerate() {
        for b in &runs[i + 1..] {
            if a.cluster != b.cluster && a.overlaps(b) {
                found.push((a.clone(), b.clone()));
            }
        }
    }
    found
}

/// The kubelet runs the containers of `pod`: opens a run unless one is open.
pub(crate) fn started(cluster: &str, node: &str, pod: &k8s_openapi::api::core::v1::Pod) {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let mut record = record();
    if record.open.contains_key(&uid) {
        return;
    }
    let run = PodRun {
        cluster: cluster.to_string(),
        node: node.to_string(),
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        pod: pod.metadata.name.clone().unwrap_or_default(),
        uid: uid.clone(),
        containers: pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter().map(|c| c.name.clone()))
            .collect(),
        started: Instant::now(),
        stopped: None,
    };
    record.open.insert(uid, run);
}

/// The kubelet stopped the containers of pod `uid` (no-op when none run).
pub(crate) fn stopped(uid: &str) {
    record().close(uid, Instant::now());
}

/// Node `node` of `cluster` went down: every run on it stops.
pub(crate) fn node_down(cluster: &str, node: &str) {
    let now = Instant::now();
    let mut record = record();
    let on_node: Vec<String> = record
        .open
        .values()
        .filter(|r| r.cluster == cluster && r.node == node)
        .map(|r| r.uid.clone())
        .collect();
    for uid in on_node {
        record.close(&uid, now);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn run(cluster: &str, from: u64, to: Option<u64>) -> PodRun {
        static BASE: LazyLock<Instant> = LazyLock::new(Instant::now);
        let base = *BASE;
        PodRun {
            cluster: cluster.into(),
            node: "n".into(),
            namespace: "ns".into(),
            pod: "db-0".into(),
            uid: format!("{cluster}-{from}"),
            containers: vec!["main".into()],
            started: base + Duration::from_secs(from),
            stopped: to.map(|t| base + Duration::from_secs(t)),
        }
    }

    #[test]
    fn intervals_overlap_only_when_both_ran_at_one_instant() {
        assert!(
            !run("a", 0, Some(5)).overlaps(&run("b", 5, Some(9))),
            "back to back"
        );
        assert!(!run("a", 6, Some(9)).overlaps(&run("b", 0, Some(5))));
        assert!(run("a", 0, Some(6)).overlaps(&run("b", 5, Some(9))));
        assert!(
            run("a", 0, None).overlaps(&run("b", 5, Some(9))),
            "still running"
        );
        assert!(run("a", 3, Some(4)).overlaps(&run("b", 0, None)));
        assert!(!run("a", 0, Some(3)).overlaps(&run("b", 4, None)));
    }
}
