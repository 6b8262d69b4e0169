//! The node lifecycle controller: notices nodes whose Lease stops being renewed, marks them
//! NotReady and unreachable-tainted, marks their pods unready, and evicts pods according to
//! their NoExecute tolerations (the taint manager's job in kube-controller-manager).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::json;
use tokio::time::Instant;

use crate::kubelet::NODE_LEASE_NAMESPACE;
use crate::scheduler::matching::tolerates;

/// Taint key of nodes whose kubelet stopped renewing its Lease.
pub const TAINT_UNREACHABLE: &str = "node.kubernetes.io/unreachable";
/// Taint key (NoSchedule and NoExecute) of nodes that report themselves not Ready
/// (Ready=False) while their Lease is renewed: a virtual node whose provider does not answer,
/// for instance.
pub const TAINT_NOT_READY: &str = "node.kubernetes.io/not-ready";
/// Taint key (NoSchedule) of nodes whose NetworkUnavailable condition is True
/// (kube-controller-manager's TaintNodesByCondition).
pub const TAINT_NETWORK_UNAVAILABLE: &str = "node.kubernetes.io/network-unavailable";

/// What to do with a pod on a node with NoExecute taints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Eviction {
    /// The pod tolerates every NoExecute taint forever.
    Never,
    /// Evict now: some NoExecute taint is not tolerated.
    Now,
    /// Evict this long after the taints appeared.
    After(Duration),
}

/// How long `tolerations` let a pod stay on a node with `taints` (taint manager semantics:
/// the smallest `tolerationSeconds` among the tolerations in use; none set means forever).
pub fn eviction(taints: &[Taint], tolerations: &[Toleration]) -> Eviction {
    let no_execute: Vec<&Taint> = taints.iter().filter(|t| t.effect == "NoExecute").collect();
    if no_execute.is_empty() {
        return Eviction::Never;
    }
    let mut min: Option<i64> = None;
    for taint in no_execute {
        let used: Vec<&Toleration> = tolerations
            .iter()
            .filter(|t| {
                t.effect
                    .as_deref()
                    .is_none_or(|e| e.is_empty() || e == "NoExecute")
                    && tolerates(t, taint)
            })
            .collect();
        if used.is_empty() {
            return Eviction::Now;
        }
        for t in used {
            if let Some(secs) = t.toleration_seconds {
                min = Some(min.map_or(secs, |m| m.min(secs)));
            }
        }
    }
    match min {
        None => Eviction::Never,
        Some(s) if s <= 0 => Eviction::Now,
        Some(s) => Eviction::After(Duration::from_secs(s as u64)),
    }
}

/// `taints` with those of `key` replaced by one per effect in `effects` (none: removed).
/// `NoExecute` taints get `now` as their time added, which the taint manager counts from.
fn with_taint(taints: &[Taint], key: &str, effects: &[&str], now: Timestamp) -> Vec<Taint> {
    let mut out: Vec<Taint> = taints.iter().filter(|t| t.key != key).cloned().collect();
    out.extend(effects.iter().map(|effect| Taint {
        key: key.into(),
        effect: effect.to_string(),
        time_added: (*effect == "NoExecute").then_some(Time(now)),
        value: None,
    }));
    out
}

/// The taints with the unreachable ones added (NoSchedule and NoExecute), or removed.
pub fn with_unreachable(taints: &[Taint], unreachable: bool, now: Timestamp) -> Vec<Taint> {
    let effects: &[&str] = if unreachable {
        &["NoSchedule", "NoExecute"]
    } else {
        &[]
    };
    with_taint(taints, TAINT_UNREACHABLE, effects, now)
}

/// The taints with the network-unavailable NoSchedule taint added, or removed.
pub fn with_network_unavailable(taints: &[Taint], unavailable: bool) -> Vec<Taint> {
    let effects: &[&str] = if unavailable { &["NoSchedule"] } else { &[] };
    with_taint(taints, TAINT_NETWORK_UNAVAILABLE, effects, Timestamp::now())
}

/// Whether the node's NetworkUnavailable condition is True.
fn network_unavailable(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "NetworkUnavailable" && c.status == "True")
        })
}

fn taints(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or(&[])
}

fn is_unreachable(node: &Node) -> bool {
    let t = taints(node);
    ["NoSchedule", "NoExecute"].iter().all(|e| {
        t.iter()
            .any(|x| x.key == TAINT_UNREACHABLE && x.effect == *e)
    })
}

/// The controller's view: when each node last renewed its lease, and its pods.
#[derive(Default)]
struct View {
    nodes: HashMap<String, Node>,
    /// Node → (last renewTime seen, when this controller saw it change).
    renewals: HashMap<String, (Option<String>, Instant)>,
    /// Node → uid → pod.
    pods: HashMap<String, HashMap<String, Pod>>,
    pod_node: HashMap<String, String>,
    /// Pods (by UID) whose node's NoExecute taints they tolerate only for a while, and since
    /// when: the taint manager's scheduled evictions, which count from when the pod first
    /// became due for one (a virtual node's own taint, tolerated for ever, schedules nothing).
    due_since: HashMap<String, Instant>,
    /// Nodes whose pods were already marked unready for the current outage.
    pods_marked: HashSet<String>,
    /// Pods already deleted by eviction.
    evicted: HashSet<String>,
}

impl View {
    fn on_node(&mut self, event: Event<Node>) {
        match event {
            Event::InitApply(node) | Event::Apply(node) => {
                let name = node.metadata.name.clone().unwrap_or_default();
                self.renewals
                    .entry(name.clone())
                    .or_insert_with(|| (None, Instant::now()));
                if !is_unreachable(&node) {
                    self.pods_marked.remove(&name);
                }
                self.nodes.insert(name, node);
            }
            Event::Delete(node) => {
                let name = node.metadata.name.unwrap_or_default();
                self.nodes.remove(&name);
                self.renewals.remove(&name);
            }
            Event::Init | Event::InitDone => {}
        }
    }

    fn on_lease(&mut self, event: Event<Lease>) {
        if let Event::InitApply(lease) | Event::Apply(lease) = event {
            let name = lease.metadata.name.clone().unwrap_or_default();
            let renew = lease
                .spec
                .and_then(|s| s.renew_time)
                .map(|t| t.0.to_string());
            let entry = self
                .renewals
                .entry(name)
                .or_insert_with(|| (None, Instant::now()));
            if entry.0 != renew {
                *entry = (renew, Instant::now());
            }
        }
    }

    fn remove_pod(&mut self, uid: &str) {
        if let Some(node) = self.pod_node.remove(uid)
            && let Some(pods) = self.pods.get_mut(&node)
        {
            pods.remove(uid);
        }
    }

    fn on_pod(&mut self, event: Event<Pod>) {
        match event {
            Event::InitApply(pod) | Event::Apply(pod) => {
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                let node = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .unwrap_or_default();
                self.remove_pod(&uid);
                if !node.is_empty() {
                    self.pod_node.insert(uid.clone(), node.clone());
                    self.pods.entry(node).or_default().insert(uid, pod);
                }
            }
            Event::Delete(pod) => {
                let uid = pod.metadata.uid.unwrap_or_default();
                self.remove_pod(&uid);
                self.evicted.remove(&uid);
                self.due_since.remove(&uid);
            }
            Event::Init | Event::InitDone => {}
        }
    }
}

fn stream<K>(api: Api<K>) -> impl futures::Stream<Item = Event<K>> + Send
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .filter_map(|ev| async move {
            ev.map_err(|e| tracing::warn!("node lifecycle watch: {e}"))
                .ok()
        })
}

/// Runs the node lifecycle controller until the process ends; a node whose Lease is not
/// renewed for `grace` becomes NotReady and unreachable.
pub async fn run(client: kube::Client, grace: Duration) {
    let nodes = stream(Api::<Node>::all(client.clone()));
    let leases = stream(Api::<Lease>::namespaced(
        client.clone(),
        NODE_LEASE_NAMESPACE,
    ));
    let pods = stream(Api::<Pod>::all(client.clone()));
    futures::pin_mut!(nodes, leases, pods);
    let mut view = View::default();
    let period = (grace / 8).clamp(Duration::from_millis(50), Duration::from_secs(1));
    let mut tick = tokio::time::interval(period);
    loop {
        tokio::select! {
            Some(ev) = nodes.next() => view.on_node(ev),
            Some(ev) = leases.next() => view.on_lease(ev),
            Some(ev) = pods.next() => view.on_pod(ev),
            _ = tick.tick() => monitor(&client, &mut view, grace).await,
        }
    }
}

/// One pass: mark expired nodes, clear recovered ones, evict pods whose toleration ran out.
async fn monitor(client: &kube::Client, view: &mut View, grace: Duration) {
    let now = Instant::now();
    let names: Vec<String> = view.nodes.keys().cloned().collect();
    for name in names {
        let Some(node) = view.nodes.get(&name) else {
            continue;
        };
        let expired = view
            .renewals
            .get(&name)
            .is_some_and(|(_, seen)| now.duration_since(*seen) > grace);
        let unreachable = is_unreachable(node);
        if expired != unreachable {
            if let Err(e) = mark_node(client, node, expired).await {
                tracing::warn!(node = %name, expired, "updating unreachable taints: {e}");
            }
        } else if let Some(wanted) = condition_taints(node, expired)
            && let Err(e) =
                set_taints(client, node, node.metadata.resource_version.clone(), wanted).await
        {
            tracing::warn!(node = %name, "updating the not-ready and network-unavailable taints: {e}");
        }
        if expired && !view.pods_marked.contains(&name) {
            view.pods_marked.insert(name.clone());
            for pod in view.pods.get(&name).into_iter().flat_map(|p| p.values()) {
                mark_pod_unready(client, pod).await;
            }
        }
        evict(client, view, &name, now).await;
    }
}

/// The node's taints as its conditions want them, if that changes them (kube's
/// TaintNodesByCondition and the NoExecute tainting pass): network-unavailable (NoSchedule)
/// while NetworkUnavailable is True; not-ready (NoExecute, from which the taint manager counts
/// the pods' `tolerationSeconds`, with NoSchedule so that no new pod is placed there) while the
/// node reports Ready=False — not once its Lease expired, when the unreachable taints stand
/// for it instead.
fn condition_taints(node: &Node, expired: bool) -> Option<Vec<Taint>> {
    let mut wanted = taints(node).to_vec();
    let mut changed = false;
    if let Some(want) = network_taint_change(node) {
        wanted = with_network_unavailable(&wanted, want);
        changed = true;
    }
    let want = !expired && ready_status(node) == Some("False");
    let has = taints(node)
        .iter()
        .any(|t| t.key == TAINT_NOT_READY && t.effect == "NoExecute");
    if want != has {
        let effects: &[&str] = if want {
            &["NoSchedule", "NoExecute"]
        } else {
            &[]
        };
        wanted = with_taint(&wanted, TAINT_NOT_READY, effects, Timestamp::now());
        changed = true;
    }
    changed.then_some(wanted)
}

/// The status of the node's Ready condition.
fn ready_status(node: &Node) -> Option<&str> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.as_str())
}

/// Whether the network-unavailable taint must be added (true) or removed (false), if either.
fn network_taint_change(node: &Node) -> Option<bool> {
    let want = network_unavailable(node);
    let has = taints(node)
        .iter()
        .any(|t| t.key == TAINT_NETWORK_UNAVAILABLE && t.effect == "NoSchedule");
    (want != has).then_some(want)
}

/// Writes `taints` as the node's taints if the node is still at `rv`, the version they were
/// computed from (a conflict leaves the decision to the next pass).
async fn set_taints(
    client: &kube::Client,
    node: &Node,
    rv: Option<String>,
    taints: Vec<Taint>,
) -> Result<(), kube::Error> {
    Api::<Node>::all(client.clone())
        .patch(
            node.metadata.name.as_deref().unwrap_or_default(),
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"resourceVersion": rv},
                "spec": {"taints": taints},
            })),
        )
        .await
        .map(drop)
}

async fn mark_node(
    client: &kube::Client,
    node: &Node,
    unreachable: bool,
) -> Result<(), kube::Error> {
    let api = Api::<Node>::all(client.clone());
    let name = node.metadata.name.clone().unwrap_or_default();
    let now = Timestamp::now();
    // Each write carries the resourceVersion it was computed from: if the kubelet posted a
    // status (or someone edited the taints) meanwhile, it fails and the next pass decides again.
    let mut rv = node.metadata.resource_version.clone();
    if unreachable {
        let conditions: Vec<serde_json::Value> = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|mut c| {
                if c.status != "Unknown" {
                    c.last_transition_time = Some(Time(now));
                }
                c.status = "Unknown".into();
                c.reason = Some("NodeStatusUnknown".into());
                c.message = Some("Kubelet stopped posting node status.".into());
                serde_json::to_value(c).unwrap_or_default()
            })
            .collect();
        let updated = api
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({
                    "metadata": {"resourceVersion": rv},
                    "status": {"conditions": conditions},
                })),
            )
            .await?;
        rv = updated.metadata.resource_version;
    }
    set_taints(
        client,
        node,
        rv,
        with_unreachable(taints(node), unreachable, now),
    )
    .await?;
    tracing::info!(node = %name, unreachable, "node lease {}", if unreachable { "expired" } else { "renewed" });
    Ok(())
}

async fn mark_pod_unready(client: &kube::Client, pod: &Pod) {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let patch = json!({"status": {"conditions": [{
        "type": "Ready", "status": "False", "reason": "NodeNotReady",
        "lastProbeTime": null, "lastTransitionTime": Time(Timestamp::now()),
    }]}});
    if let Err(e) = Api::<Pod>::namespaced(client.clone(), &ns)
        .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
    {
        tracing::debug!(pod = %name, "marking pod unready: {e}");
    }
}

/// The pods of `node` whose eviction is due at `now`: not tolerating its NoExecute taints, or
/// tolerating them for less time than they have been due for one.
fn due_pods(view: &mut View, node: &str, now: Instant) -> Vec<(String, Pod)> {
    let mut due = Vec::new();
    let Some(n) = view.nodes.get(node) else {
        return due;
    };
    let taints = taints(n);
    if !taints.iter().any(|t| t.effect == "NoExecute") {
        // Nothing to evict for: forget what was due (the node recovered).
        for uid in view.pods.get(node).into_iter().flat_map(|p| p.keys()) {
            view.due_since.remove(uid);
        }
        return due;
    }
    for (uid, pod) in view.pods.get(node).into_iter().flatten() {
        if pod.metadata.deletion_timestamp.is_some() || view.evicted.contains(uid) {
            continue;
        }
        let tols = pod
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.as_deref())
            .unwrap_or(&[]);
        let go = match eviction(taints, tols) {
            Eviction::Never => {
                view.due_since.remove(uid);
                false
            }
            Eviction::Now => true,
            Eviction::After(d) => {
                let since = *view.due_since.entry(uid.clone()).or_insert(now);
                now.duration_since(since) >= d
            }
        };
        if go {
            due.push((uid.clone(), pod.clone()));
        }
    }
    due
}

async fn evict(client: &kube::Client, view: &mut View, node: &str, now: Instant) {
    for (uid, pod) in due_pods(view, node, now) {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        match Api::<Pod>::namespaced(client.clone(), &ns)
            .delete(&name, &DeleteParams::default())
            .await
        {
            Ok(_) => {
                tracing::info!(pod = %name, node, "taint manager: deleting pod");
                let message = format!(
                    "Marking for deletion Pod {}/{}",
                    pod.metadata.namespace.as_deref().unwrap_or_default(),
                    pod.metadata.name.as_deref().unwrap_or_default()
                );
                crate::events::record(
                    client,
                    &pod,
                    crate::events::PodEvent {
                        reason: "TaintManagerEviction",
                        type_: "Normal",
                        message,
                        component: "taint-eviction-controller",
                        action: "Evicting",
                    },
                )
                .await;
                view.evicted.insert(uid);
            }
            Err(e) if tandem_api::client::is_not_found(&e) => {
                view.evicted.insert(uid);
            }
            Err(e) => tracing::warn!(pod = %name, node, "evicting: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: effect.into(),
            ..Default::default()
        }
    }

    fn tol(key: &str, effect: Option<&str>, secs: Option<i64>) -> Toleration {
        Toleration {
            key: Some(key.into()),
            operator: Some("Exists".into()),
            effect: effect.map(str::to_string),
            toleration_seconds: secs,
            value: None,
        }
    }

    #[test]
    fn eviction_follows_the_smallest_toleration() {
        let unreachable = taint(TAINT_UNREACHABLE, "NoExecute");
        let cases = [
            (
                "no NoExecute taint",
                vec![taint("a", "NoSchedule")],
                vec![],
                Eviction::Never,
            ),
            (
                "untolerated",
                vec![unreachable.clone()],
                vec![],
                Eviction::Now,
            ),
            (
                "tolerated for 300 s (the API server default)",
                vec![unreachable.clone()],
                vec![tol(TAINT_UNREACHABLE, Some("NoExecute"), Some(300))],
                Eviction::After(Duration::from_secs(300)),
            ),
            (
                "smallest of two tolerations",
                vec![unreachable.clone()],
                vec![
                    tol(TAINT_UNREACHABLE, Some("NoExecute"), Some(300)),
                    tol(TAINT_UNREACHABLE, None, Some(2)),
                ],
                Eviction::After(Duration::from_secs(2)),
            ),
            (
                "tolerated forever",
                vec![unreachable.clone()],
                vec![tol(TAINT_UNREACHABLE, Some("NoExecute"), None)],
                Eviction::Never,
            ),
            (
                "a NoSchedule toleration does not count",
                vec![unreachable.clone()],
                vec![tol(TAINT_UNREACHABLE, Some("NoSchedule"), None)],
                Eviction::Now,
            ),
            (
                "second taint untolerated",
                vec![unreachable.clone(), taint("other", "NoExecute")],
                vec![tol(TAINT_UNREACHABLE, Some("NoExecute"), Some(5))],
                Eviction::Now,
            ),
        ];
        for (name, taints, tols, want) in cases {
            assert_eq!(eviction(&taints, &tols), want, "{name}");
        }
    }

    #[test]
    fn unreachable_taints_are_added_once_and_removed() {
        let now = Timestamp::now();
        let base = vec![taint("dedicated", "NoSchedule")];
        let on = with_unreachable(&base, true, now);
        assert_eq!(on.len(), 3);
        let again = with_unreachable(&on, true, now);
        assert_eq!(again.len(), 3, "adding twice keeps one pair");
        let off = with_unreachable(&again, false, now);
        assert_eq!(off, base);
    }

    #[test]
    fn network_unavailable_taint_follows_the_condition() {
        let base = vec![taint("dedicated", "NoSchedule")];
        let mut node = Node {
            spec: Some(k8s_openapi::api::core::v1::NodeSpec {
                taints: Some(base.clone()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(network_taint_change(&node), None, "no condition, no taint");
        let set = |node: &mut Node, status: &str| {
            node.status = Some(k8s_openapi::api::core::v1::NodeStatus {
                conditions: Some(vec![k8s_openapi::api::core::v1::NodeCondition {
                    type_: "NetworkUnavailable".into(),
                    status: status.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            });
        };
        set(&mut node, "True");
        assert_eq!(network_taint_change(&node), Some(true));
        let tainted = with_network_unavailable(&base, true);
        assert_eq!(tainted.len(), 2);
        assert_eq!(tainted[1].key, TAINT_NETWORK_UNAVAILABLE);
        assert_eq!(tainted[1].effect, "NoSchedule");
        node.spec.as_mut().unwrap().taints = Some(tainted.clone());
        assert_eq!(network_taint_change(&node), None, "already tainted");
        set(&mut node, "False");
        assert_eq!(network_taint_change(&node), Some(false));
        assert_eq!(with_network_unavailable(&tainted, false), base);
    }

    #[test]
    fn a_node_reporting_not_ready_gets_the_no_execute_taint_until_ready_or_expired() {
        let node = |ready: &str, taints: Vec<Taint>| Node {
            spec: Some(k8s_openapi::api::core::v1::NodeSpec {
                taints: Some(taints),
                ..Default::default()
            }),
            status: Some(k8s_openapi::api::core::v1::NodeStatus {
                conditions: Some(vec![k8s_openapi::api::core::v1::NodeCondition {
                    type_: "Ready".into(),
                    status: ready.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let base = vec![taint("dedicated", "NoSchedule")];
        assert_eq!(condition_taints(&node("True", base.clone()), false), None);
        let tainted = condition_taints(&node("False", base.clone()), false).unwrap();
        assert_eq!(tainted.len(), 3);
        assert_eq!(tainted[1].key, TAINT_NOT_READY);
        assert_eq!(tainted[1].effect, "NoSchedule");
        assert_eq!(tainted[2].key, TAINT_NOT_READY);
        assert_eq!(tainted[2].effect, "NoExecute");
        assert!(
            tainted[2].time_added.is_some(),
            "the taint manager counts from it"
        );
        assert_eq!(
            condition_taints(&node("False", tainted.clone()), false),
            None
        );
        assert_eq!(
            condition_taints(&node("True", tainted.clone()), false),
            Some(base.clone()),
            "Ready again"
        );
        assert_eq!(
            condition_taints(&node("False", tainted), true),
            Some(base),
            "an expired Lease: the unreachable taint stands for it"
        );
    }

    #[test]
    fn a_bounded_toleration_counts_from_when_the_pod_became_due_not_from_the_first_taint() {
        let mut view = View::default();
        let mut node = Node::default();
        node.metadata.name = Some("vn".into());
        let set_taints = |node: &mut Node, taints: Vec<Taint>| {
            node.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
                taints: Some(taints),
                ..Default::default()
            });
        };
        // A virtual node's own NoExecute taint, which its pods tolerate for ever.
        set_taints(&mut node, vec![taint("virtual", "NoExecute")]);
        view.on_node(Event::Apply(node.clone()));
        let mut pod = Pod::default();
        pod.metadata.name = Some("p".into());
        pod.metadata.uid = Some("u".into());
        pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            node_name: Some("vn".into()),
            tolerations: Some(vec![
                tol("virtual", Some("NoExecute"), None),
                tol(TAINT_NOT_READY, Some("NoExecute"), Some(10)),
            ]),
            ..Default::default()
        });
        view.on_pod(Event::Apply(pod));
        let t0 = Instant::now();
        assert!(due_pods(&mut view, "vn", t0).is_empty());
        // Long after, the node turns NotReady: ten seconds from then, not at once.
        let t1 = t0 + Duration::from_secs(1000);
        set_taints(
            &mut node,
            vec![
                taint("virtual", "NoExecute"),
                taint(TAINT_NOT_READY, "NoExecute"),
            ],
        );
        view.on_node(Event::Apply(node.clone()));
        assert!(due_pods(&mut view, "vn", t1).is_empty());
        assert!(due_pods(&mut view, "vn", t1 + Duration::from_secs(9)).is_empty());
        assert_eq!(
            due_pods(&mut view, "vn", t1 + Duration::from_secs(10)).len(),
            1
        );
        // Ready again before the time: the count starts over next time.
        set_taints(&mut node, vec![taint("virtual", "NoExecute")]);
        view.on_node(Event::Apply(node.clone()));
        assert!(due_pods(&mut view, "vn", t1 + Duration::from_secs(11)).is_empty());
        set_taints(
            &mut node,
            vec![
                taint("virtual", "NoExecute"),
                taint(TAINT_NOT_READY, "NoExecute"),
            ],
        );
        view.on_node(Event::Apply(node));
        let t2 = t1 + Duration::from_secs(20);
        assert!(due_pods(&mut view, "vn", t2).is_empty());
        assert_eq!(
            due_pods(&mut view, "vn", t2 + Duration::from_secs(10)).len(),
            1
        );
    }
}
