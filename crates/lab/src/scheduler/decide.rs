//! The decision, pure: from a snapshot and a pod to a node name, or a [`FitError`] worded like
//! kube-scheduler's.

use std::collections::BTreeMap;

use super::filter::{AntiAffinity, filter};
use super::fit_error::FitError;
use super::pod_info::PodInfo;
use super::score::{intolerable_prefer_no_schedule, least_allocated, preferred_affinity};
use super::snapshot::{NodeState, Snapshot};
use super::volumes::volume_needs;

/// Picks the node for `pod`: filters like kube-scheduler's default plugins, then scores by
/// preferred node affinity (weight 2), PreferNoSchedule taints (3), least-allocated
/// resources (1) and spreading of the pod's replicas (2); ties go to the node with fewer
/// replicas, then fewer pods, then the first name.
pub fn decide(snap: &Snapshot, pod: &PodInfo) -> Result<String, FitError> {
    let mut error = FitError {
        nodes: 0,
        reasons: BTreeMap::new(),
        preemption: BTreeMap::new(),
        preemption_never: pod
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.preemption_policy.as_deref())
            == Some("Never"),
        prefilter: None,
    };
    // Only pods with claims look at volumes.
    let volumes = if pod.claims.is_empty() {
        None
    } else {
        match volume_needs(&snap.volumes, pod) {
            Ok(needs) => Some(needs),
            Err(reason) => {
                error.nodes = snap.node_names().count();
                error.prefilter = Some(reason.to_string());
                error.preemption.insert(
                    "Preemption is not helpful for scheduling".to_string(),
                    error.nodes,
                );
                return Err(error);
            }
        }
    };
    let anti = AntiAffinity::of(snap, pod);
    let mut feasible: Vec<(&str, &NodeState)> = Vec::new();
    for (name, state) in &snap.nodes {
        if state.node.is_none() {
            continue;
        }
        error.nodes += 1;
        match filter(snap, pod, state, &anti, volumes.as_ref()) {
            Ok(()) => feasible.push((name, state)),
            Err(failure) => {
                for r in failure.reasons {
                    *error.reasons.entry(r).or_default() += 1;
                }
                let verdict = if failure.resolvable {
                    "No preemption victims found for incoming pod"
                } else {
                    "Preemption is not helpful for scheduling"
                };
                *error.preemption.entry(verdict.to_string()).or_default() += 1;
            }
        }
    }
    if feasible.is_empty() {
        return Err(error);
    }
    let raw: Vec<(i64, i64, i64, u32)> = feasible
        .iter()
        .map(|(_, s)| {
            let node = s.node.as_deref().expect("feasible nodes exist");
            (
                preferred_affinity(&pod.pod, node),
                intolerable_prefer_no_schedule(&pod.pod, node),
                least_allocated(s, pod),
                s.spread.get(&pod.spread_key).copied().unwrap_or(0),
            )
        })
        .collect();
    let max_aff = raw.iter().map(|r| r.0).max().unwrap_or(0);
    let max_taint = raw.iter().map(|r| r.1).max().unwrap_or(0);
    let max_spread = raw.iter().map(|r| r.3).max().unwrap_or(0);
    let best = feasible
        .iter()
        .zip(&raw)
        .map(|((name, state), &(aff, taints, alloc, spread))| {
            let aff = if max_aff > 0 { aff * 100 / max_aff } else { 0 };
            let taints = if max_taint > 0 {
                100 - taints * 100 / max_taint
            } else {
                100
            };
            let spread_score = if max_spread > 0 {
                i64::from(max_spread - spread) * 100 / i64::from(max_spread)
            } else {
                100
            };
            let score = 2 * aff + 3 * taints + alloc + 2 * spread_score;
            (
                score,
                std::cmp::Reverse(spread),
                std::cmp::Reverse(state.pods.len()),
                std::cmp::Reverse(*name),
            )
        })
        .max()
        .expect("at least one feasible node");
    Ok(best.3.0.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::fixtures::{NodeFixture, PodFixture, claim_volume, nodes, snapshot};
    use crate::scheduler::pod_info::Resources;
    use serde_json::{Value, json};

    /// (case, nodes, placed pods, pod, expected node or FailedScheduling message)
    type Case = (
        &'static str,
        Vec<NodeFixture>,
        Vec<(PodFixture, &'static str)>,
        PodFixture,
        Result<&'static str, &'static str>,
    );

    fn run_cases(cases: Vec<Case>) {
        for (name, nodes, placed, pod, want) in cases {
            let snap = snapshot(nodes, placed);
            let got = decide(&snap, &pod.info()).map_err(|e| e.to_string());
            let want = want.map(str::to_string).map_err(str::to_string);
            assert_eq!(got, want, "case: {name}");
        }
    }

    #[test]
    fn resource_fit() {
        run_cases(vec![
            (
                "requests count against what is already placed",
                vec![
                    NodeFixture::new("a").alloc("1", "1Gi"),
                    NodeFixture::new("b").alloc("1", "1Gi"),
                ],
                vec![(PodFixture::new("big").requests("800m", "100Mi"), "b")],
                PodFixture::new("web").requests("500m", "64Mi"),
                Ok("a"),
            ),
            (
                "cpu fits nowhere",
                vec![
                    NodeFixture::new("a").alloc("1", "1Gi"),
                    NodeFixture::new("b").alloc("1", "1Gi"),
                ],
                vec![],
                PodFixture::new("web").requests("1500m", "64Mi"),
                Err(
                    "0/2 nodes are available: 2 Insufficient cpu. preemption: 0/2 nodes are \
                     available: 2 No preemption victims found for incoming pod.",
                ),
            ),
            (
                "cpu and memory both reported",
                vec![NodeFixture::new("a").alloc("1", "1Gi")],
                vec![],
                PodFixture::new("web").requests("2", "2Gi"),
                Err(
                    "0/1 nodes are available: 1 Insufficient cpu, 1 Insufficient memory. \
                     preemption: 0/1 nodes are available: 1 No preemption victims found for \
                     incoming pod.",
                ),
            ),
            (
                "pods count",
                vec![
                    NodeFixture::new("a").max_pods(1),
                    NodeFixture::new("b").max_pods(2),
                ],
                vec![(PodFixture::new("x"), "a"), (PodFixture::new("y"), "b")],
                PodFixture::new("web"),
                Ok("b"),
            ),
            (
                "pods count exhausted",
                vec![NodeFixture::new("a").max_pods(1)],
                vec![(PodFixture::new("x"), "a")],
                PodFixture::new("web"),
                Err(
                    "0/1 nodes are available: 1 Too many pods. preemption: 0/1 nodes are \
                     available: 1 No preemption victims found for incoming pod.",
                ),
            ),
            (
                "no nodes at all",
                vec![],
                vec![],
                PodFixture::new("web"),
                Err("no nodes available to schedule pods"),
            ),
        ]);
    }

    #[test]
    fn node_selectors_and_affinity() {
        let zoned = || {
            vec![
                NodeFixture::new("a").label("zone", "z1").label("gen", "3"),
                NodeFixture::new("b").label("zone", "z2").label("gen", "5"),
                NodeFixture::new("c").label("gen", "7"),
            ]
        };
        let mismatch = "0/3 nodes are available: 3 node(s) didn't match Pod's node \
                        affinity/selector. preemption: 0/3 nodes are available: 3 Preemption \
                        is not helpful for scheduling.";
        let expr = |key: &str, op: &str, values: &[&str]| json!([{"matchExpressions": [{"key": key, "operator": op, "values": values}]}]);
        run_cases(vec![
            (
                "nodeSelector",
                zoned(),
                vec![],
                PodFixture::new("p").node_selector("zone", "z2"),
                Ok("b"),
            ),
            (
                "nodeSelector unmatched",
                zoned(),
                vec![],
                PodFixture::new("p").node_selector("zone", "z9"),
                Err(mismatch),
            ),
            (
                "In",
                zoned(),
                vec![],
                PodFixture::new("p").required_node_affinity(expr("zone", "In", &["z1"])),
                Ok("a"),
            ),
            (
                "NotIn (a missing label is not in)",
                zoned(),
                vec![],
                PodFixture::new("p").required_node_affinity(expr("zone", "NotIn", &["z1", "z2"])),
                Ok("c"),
            ),
            (
                "Exists",
                zoned(),
                vec![(PodFixture::new("x"), "a")],
                PodFixture::new("p").required_node_affinity(expr("zone", "Exists", &[])),
                Ok("b"),
            ),
            (
                "DoesNotExist",
                zoned(),
                vec![],
                PodFixture::new("p").required_node_affinity(expr("zone", "DoesNotExist", &[])),
                Ok("c"),
            ),
            (
                "Gt",
                zoned(),
                vec![],
                PodFixture::new("p").required_node_affinity(expr("gen", "Gt", &["6"])),
                Ok("c"),
            ),
            (
                "Lt",
                zoned(),
                vec![],
                PodFixture::new("p").required_node_affinity(expr("gen", "Lt", &["4"])),
                Ok("a"),
            ),
            (
                "Gt nothing",
                zoned(),
                vec![],
                PodFixture::new("p").required_node_affinity(expr("gen", "Gt", &["7"])),
                Err(mismatch),
            ),
            (
                "matchFields metadata.name",
                zoned(),
                vec![],
                PodFixture::new("p").required_node_affinity(json!([{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": ["b"]}]}])),
                Ok("b"),
            ),
            (
                "terms are ORed",
                zoned(),
                vec![(PodFixture::new("x"), "a")],
                PodFixture::new("p").required_node_affinity(json!([
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]},
                    {"matchExpressions": [{"key": "gen", "operator": "In", "values": ["5"]}]}])),
                Ok("b"),
            ),
            (
                "an empty term matches nothing",
                zoned(),
                vec![],
                PodFixture::new("p").required_node_affinity(json!([{}])),
                Err(mismatch),
            ),
            (
                "preferred affinity scores",
                zoned(),
                vec![],
                PodFixture::new("p").preferred_node_affinity(
                    50,
                    json!({"key": "zone", "operator": "In", "values": ["z2"]}),
                ),
                Ok("b"),
            ),
        ]);
    }

    #[test]
    fn taints_tolerations_and_unschedulable_nodes() {
        let cp = |n: &str| {
            NodeFixture::new(n).taint("node-role.kubernetes.io/control-plane", "", "NoSchedule")
        };
        run_cases(vec![
            (
                "control-plane taint everywhere",
                vec![cp("a"), cp("b"), cp("c")],
                vec![],
                PodFixture::new("p"),
                Err("0/3 nodes are available: 3 node(s) had untolerated taint \
                     {node-role.kubernetes.io/control-plane: }. preemption: 0/3 nodes are \
                     available: 3 Preemption is not helpful for scheduling."),
            ),
            ("only the untainted node", vec![cp("a"), NodeFixture::new("b"), cp("c")], vec![(PodFixture::new("x"), "b")], PodFixture::new("p"), Ok("b")),
            (
                "tolerated by Exists",
                vec![cp("a")],
                vec![],
                PodFixture::new("p").tolerate(json!({"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"})),
                Ok("a"),
            ),
            (
                "Equal needs the value",
                vec![NodeFixture::new("a").taint("dedicated", "gpu", "NoExecute")],
                vec![],
                PodFixture::new("p").tolerate(json!({"key": "dedicated", "operator": "Equal", "value": "cpu"})),
                Err("0/1 nodes are available: 1 node(s) had untolerated taint {dedicated: gpu}. \
                     preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."),
            ),
            (
                "a NotReady node takes tolerating pods",
                vec![NodeFixture::new("a").taint("node.kubernetes.io/not-ready", "", "NoSchedule").taint("node.kubernetes.io/not-ready", "", "NoExecute")],
                vec![],
                PodFixture::new("p").tolerate(json!({"key": "node.kubernetes.io/not-ready", "operator": "Exists"})),
                Ok("a"),
            ),
            (
                "PreferNoSchedule only scores",
                vec![NodeFixture::new("a").taint("soft", "", "PreferNoSchedule"), NodeFixture::new("b")],
                vec![(PodFixture::new("x").requests("1", "1Gi"), "b")],
                PodFixture::new("p"),
                Ok("b"),
            ),
            ("PreferNoSchedule everywhere still schedules", vec![NodeFixture::new("a").taint("soft", "", "PreferNoSchedule")], vec![], PodFixture::new("p"), Ok("a")),
            (
                "unschedulable, untolerated taint and full node, sorted like kube-scheduler",
                vec![
                    NodeFixture::new("a").unschedulable(),
                    NodeFixture::new("b").taint("k", "v", "NoSchedule"),
                    NodeFixture::new("c").alloc("1", "1Gi"),
                ],
                vec![],
                PodFixture::new("p").requests("2", "1Mi"),
                Err("0/3 nodes are available: 1 Insufficient cpu, 1 node(s) had untolerated taint \
                     {k: v}, 1 node(s) were unschedulable. preemption: 0/3 nodes are available: \
                     1 No preemption victims found for incoming pod, 2 Preemption is not helpful \
                     for scheduling."),
            ),
            (
                "unschedulable is tolerable",
                vec![NodeFixture::new("a").unschedulable()],
                vec![],
                PodFixture::new("p").tolerate(json!({"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"})),
                Ok("a"),
            ),
        ]);
    }

    #[test]
    fn pod_anti_affinity() {
        run_cases(vec![
            (
                "the pod avoids nodes with pods it repels",
                nodes(&["a", "b"]),
                vec![(PodFixture::new("w1").label("app", "web"), "a")],
                PodFixture::new("w2")
                    .label("app", "web")
                    .anti_affinity("web"),
                Ok("b"),
            ),
            (
                "existing pods repel the pod",
                nodes(&["a", "b"]),
                vec![
                    (
                        PodFixture::new("w1")
                            .label("app", "web")
                            .anti_affinity("web"),
                        "b",
                    ),
                    (PodFixture::new("x"), "a"),
                ],
                PodFixture::new("w2").label("app", "web"),
                Ok("a"),
            ),
            (
                "no node left",
                nodes(&["a", "b"]),
                vec![
                    (PodFixture::new("w1").label("app", "web"), "a"),
                    (
                        PodFixture::new("d1")
                            .label("app", "db")
                            .anti_affinity("web"),
                        "b",
                    ),
                ],
                PodFixture::new("w3")
                    .label("app", "web")
                    .anti_affinity("web"),
                Err(
                    "0/2 nodes are available: 1 node(s) didn't match pod anti-affinity rules, \
                     1 node(s) didn't satisfy existing pods anti-affinity rules. preemption: \
                     0/2 nodes are available: 2 No preemption victims found for incoming pod.",
                ),
            ),
            (
                "other namespaces do not count",
                nodes(&["a"]),
                vec![(PodFixture::new("w1").label("app", "web"), "a")],
                {
                    let mut p = PodFixture::new("w2").anti_affinity("web");
                    p.0["metadata"]["namespace"] = json!("other");
                    p
                },
                Ok("a"),
            ),
        ]);
    }

    /// Storage objects for the volume cases: classes `standard` (lab provisioner, waits for
    /// the first consumer), `fast` (Immediate) and `local` (no provisioner, waits), and claims
    /// and volumes as each case lists them.
    fn storage(snap: &mut Snapshot, objects: &[Value]) {
        let vols = snap.volumes_mut();
        for (name, provisioner, mode) in [
            ("standard", "lab.tandem.dev/hollow", "WaitForFirstConsumer"),
            ("fast", "lab.tandem.dev/hollow", "Immediate"),
            (
                "local",
                "kubernetes.io/no-provisioner",
                "WaitForFirstConsumer",
            ),
        ] {
            vols.apply_class(
                serde_json::from_value(json!({"metadata": {"name": name},
                "provisioner": provisioner, "volumeBindingMode": mode}))
                .unwrap(),
            );
        }
        for o in objects {
            if o["kind"] == "PersistentVolume" {
                vols.apply_volume(serde_json::from_value(o.clone()).unwrap());
            } else {
                vols.apply_claim(serde_json::from_value(o.clone()).unwrap());
            }
        }
    }

    fn pvc(name: &str, class: &str, volume: Option<&str>) -> Value {
        json!({"kind": "PersistentVolumeClaim",
               "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
               "spec": {"storageClassName": class, "volumeName": volume,
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "1Gi"}}}})
    }

    fn pv(name: &str, class: &str, host: &str) -> Value {
        json!({"kind": "PersistentVolume", "metadata": {"name": name},
               "spec": {"storageClassName": class, "capacity": {"storage": "5Gi"},
                        "accessModes": ["ReadWriteOnce"],
                        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "In", "values": [host]}]}]}}},
               "status": {"phase": "Available"}})
    }

    #[test]
    fn volume_binding_filters_nodes_by_claims_and_explains_refusals() {
        let unresolvable = |reason: &str| {
            format!(
                "0/3 nodes are available: {reason}. preemption: 0/3 nodes are available: \
                 3 Preemption is not helpful for scheduling."
            )
        };
        let mut deleting = pvc("data", "standard", Some("pv-1"));
        deleting["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:00:00Z");
        /// (case, claims and volumes, expected node or message, claims to select)
        type VolumeCase = (
            &'static str,
            Vec<Value>,
            Result<&'static str, String>,
            Vec<&'static str>,
        );
        let cases: Vec<VolumeCase> = vec![
            (
                "a missing claim",
                vec![],
                Err(unresolvable("persistentvolumeclaim \"data\" not found")),
                vec![],
            ),
            (
                "an unbound Immediate claim waits for the volume controller",
                vec![pvc("data", "fast", None)],
                Err(unresolvable(
                    "pod has unbound immediate PersistentVolumeClaims",
                )),
                vec![],
            ),
            (
                "a claim being deleted",
                vec![deleting],
                Err(unresolvable(
                    "persistentvolumeclaim \"data\" is being deleted",
                )),
                vec![],
            ),
            (
                "a bound volume pins the pod to its node (data gravity)",
                vec![
                    pvc("data", "standard", Some("pv-1")),
                    pv("pv-1", "standard", "b"),
                ],
                Ok("b"),
                vec![],
            ),
            (
                "a bound volume on no node the cluster has",
                vec![
                    pvc("data", "standard", Some("pv-1")),
                    pv("pv-1", "standard", "gone"),
                ],
                Err(
                    "0/3 nodes are available: 3 node(s) had volume node affinity conflict. \
                     preemption: 0/3 nodes are available: 3 Preemption is not helpful for \
                     scheduling."
                        .to_string(),
                ),
                vec![],
            ),
            (
                "a claim bound to a volume not yet seen",
                vec![pvc("data", "standard", Some("pv-1"))],
                Err(
                    "0/3 nodes are available: 3 node(s) unavailable due to one or more pvc(s) \
                     bound to non-existent pv(s). preemption: 0/3 nodes are available: 3 \
                     Preemption is not helpful for scheduling."
                        .to_string(),
                ),
                vec![],
            ),
            (
                "WaitForFirstConsumer with a provisioner: any node, and the claim is selected",
                vec![pvc("data", "standard", None)],
                Ok("a"),
                vec!["data"],
            ),
            (
                "WaitForFirstConsumer without one: only where a matching volume is",
                vec![
                    pvc("data", "local", None),
                    pv("pv-c", "local", "c"),
                    pv("pv-x", "standard", "a"),
                ],
                Ok("c"),
                vec!["data"],
            ),
            (
                "...and nowhere without one",
                vec![pvc("data", "local", None)],
                Err(
                    "0/3 nodes are available: 3 node(s) didn't find available persistent \
                     volumes to bind. preemption: 0/3 nodes are available: 3 Preemption is not \
                     helpful for scheduling."
                        .to_string(),
                ),
                vec![],
            ),
        ];
        for (what, objects, want, select) in cases {
            let mut snap = snapshot(nodes(&["a", "b", "c"]), vec![]);
            storage(&mut snap, &objects);
            let pod = claim_volume(PodFixture::new("db-0"), "data").info();
            let got = decide(&snap, &pod).map_err(|e| e.to_string());
            assert_eq!(got, want.map(str::to_string), "{what}");
            if got.is_ok() {
                assert_eq!(snap.claims_to_select(&pod), select, "{what}");
            }
        }
    }

    #[test]
    fn replicas_spread_across_nodes() {
        let mut snap = snapshot(nodes(&["a", "b", "c"]), vec![]);
        // Uneven background load that replicas should not simply pile onto the emptiest node.
        snap.place(PodFixture::new("bg").requests("100m", "64Mi").info(), "a");
        for i in 0..20 {
            let pod = PodFixture::new("web")
                .uid(&format!("web-{i}"))
                .owner("rs-1")
                .requests("100m", "64Mi")
                .info();
            let node = decide(&snap, &pod).expect("fits");
            snap.place(pod, &node);
        }
        let mut per_node: Vec<u32> = ["a", "b", "c"]
            .iter()
            .map(|n| {
                snap.nodes[*n]
                    .spread
                    .get("owner:rs-1")
                    .copied()
                    .unwrap_or(0)
            })
            .collect();
        per_node.sort();
        assert_eq!(per_node, [6, 7, 7]);
        // Forgetting releases the accounting.
        for i in 0..20 {
            snap.forget(&format!("web-{i}"));
        }
        assert!(
            snap.nodes
                .values()
                .all(|n| !n.spread.contains_key("owner:rs-1"))
        );
        assert_eq!(snap.nodes["b"].requested, Resources::default());
    }
}
