//! Table tests of the DaemonSet plan: which nodes run a pod, what manage and one rolling
//! update pass change, and the status counters.

use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde_json::json;
use std::collections::BTreeSet;

fn node(name: &str, labels: serde_json::Value, taints: serde_json::Value) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": taints},
    }))
    .unwrap()
}

fn ds(spec_extra: serde_json::Value, pod_spec: serde_json::Value) -> DaemonSet {
    let mut spec = json!({
        "selector": {"matchLabels": {"app": "agent"}},
        "template": {
            "metadata": {"labels": {"app": "agent"}},
            "spec": pod_spec,
        },
    });
    for (k, v) in spec_extra.as_object().cloned().unwrap_or_default() {
        spec[k] = v;
    }
    serde_json::from_value(json!({
        "metadata": {"name": "agent", "namespace": "kube-system", "uid": "u1", "generation": 2},
        "spec": spec,
    }))
    .unwrap()
}

fn template(pod_spec: serde_json::Value) -> PodTemplateSpec {
    ds(json!({}), pod_spec).spec.unwrap().template
}

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + secs).unwrap()
}

/// A daemon pod for `node` made from revision `hash`, created at `created`, Ready since
/// `ready` (None: not Ready).
fn pod(name: &str, node: &str, hash: &str, created: i64, ready: Option<i64>) -> Pod {
    let mut p: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "kube-system", "labels": {"app": "agent", HASH_LABEL: hash}},
        "spec": {"nodeName": node, "containers": [{"name": "a", "image": "x"}]},
        "status": {"phase": "Running"},
    }))
    .unwrap();
    p.metadata.creation_timestamp = Some(Time(at(created)));
    if let Some(since) = ready {
        p.status.as_mut().unwrap().conditions = Some(vec![
            serde_json::from_value(json!({"type": "Ready", "status": "True"})).unwrap(),
        ]);
        p.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].last_transition_time =
            Some(Time(at(since)));
    }
    p
}

fn phase(mut p: Pod, phase: &str) -> Pod {
    p.status.as_mut().unwrap().phase = Some(phase.into());
    p
}

fn terminating(mut p: Pod) -> Pod {
    p.metadata.deletion_timestamp = Some(Time(at(50)));
    p
}

fn fit(run: bool, stay: bool) -> Fit {
    Fit {
        should_run: run,
        should_continue_running: stay,
    }
}

#[test]
fn eligibility_follows_node_should_run_daemon_pod() {
    let plain = || node("n1", json!({"disk": "ssd"}), json!([]));
    let tainted = |key: &str, effect: &str| {
        node(
            "n1",
            json!({}),
            json!([{"key": key, "value": "v", "effect": effect}]),
        )
    };
    let containers = json!([{"name": "a", "image": "x"}]);
    // (what, pod spec, node, expected fit)
    let cases = [
        (
            "untainted node",
            json!({"containers": containers}),
            plain(),
            fit(true, true),
        ),
        (
            "nodeSelector matches",
            json!({"containers": containers, "nodeSelector": {"disk": "ssd"}}),
            plain(),
            fit(true, true),
        ),
        (
            "nodeSelector does not match",
            json!({"containers": containers, "nodeSelector": {"disk": "hdd"}}),
            plain(),
            fit(false, false),
        ),
        (
            "required node affinity does not match",
            json!({"containers": containers, "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "disk", "operator": "NotIn", "values": ["ssd"]}]}]}}}}),
            plain(),
            fit(false, false),
        ),
        (
            "one of the terms matches",
            json!({"containers": containers, "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["hdd"]}]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
            ]}}}}),
            plain(),
            fit(true, true),
        ),
        (
            "nodeName names another node",
            json!({"containers": containers, "nodeName": "n2"}),
            plain(),
            fit(false, false),
        ),
        (
            "untolerated NoSchedule: not here, but a pod already here stays",
            json!({"containers": containers}),
            tainted("dedicated", "NoSchedule"),
            fit(false, true),
        ),
        (
            "untolerated NoExecute: not here and evicted",
            json!({"containers": containers}),
            tainted("dedicated", "NoExecute"),
            fit(false, false),
        ),
        (
            "PreferNoSchedule is no obstacle",
            json!({"containers": containers}),
            tainted("dedicated", "PreferNoSchedule"),
            fit(true, true),
        ),
        (
            "tolerated by key and value",
            json!({"containers": containers, "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "v", "effect": "NoSchedule"}]}),
            tainted("dedicated", "NoSchedule"),
            fit(true, true),
        ),
        (
            "a toleration of everything lands everywhere (Liqo #1398)",
            json!({"containers": containers, "tolerations": [{"operator": "Exists"}]}),
            tainted("virtual-node.tandem.dev/not-allowed", "NoExecute"),
            fit(true, true),
        ),
        (
            "daemon pods tolerate cordoned nodes",
            json!({"containers": containers}),
            tainted("node.kubernetes.io/unschedulable", "NoSchedule"),
            fit(true, true),
        ),
        (
            "daemon pods tolerate not-ready nodes",
            json!({"containers": containers}),
            tainted("node.kubernetes.io/not-ready", "NoExecute"),
            fit(true, true),
        ),
        (
            "daemon pods tolerate unreachable nodes",
            json!({"containers": containers}),
            tainted("node.kubernetes.io/unreachable", "NoExecute"),
            fit(true, true),
        ),
        (
            "daemon pods tolerate memory pressure",
            json!({"containers": containers}),
            tainted("node.kubernetes.io/memory-pressure", "NoSchedule"),
            fit(true, true),
        ),
        (
            "network-unavailable only for hostNetwork pods",
            json!({"containers": containers}),
            tainted("node.kubernetes.io/network-unavailable", "NoSchedule"),
            fit(false, true),
        ),
        (
            "hostNetwork pods tolerate network-unavailable",
            json!({"containers": containers, "hostNetwork": true}),
            tainted("node.kubernetes.io/network-unavailable", "NoSchedule"),
            fit(true, true),
        ),
    ];
    for (what, spec, node, want) in cases {
        assert_eq!(node_should_run(&template(spec), &node), want, "{what}");
    }
}

#[test]
fn daemon_pods_are_pinned_labelled_and_tolerant() {
    let t = template(json!({
        "containers": [{"name": "a", "image": "x"}],
        "tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}]}}},
    }));
    let made = pod_template(&t, Some(3), "abc", "n7");
    let labels = made.metadata.as_ref().unwrap().labels.as_ref().unwrap();
    assert_eq!(labels.get(HASH_LABEL).map(String::as_str), Some("abc"));
    assert_eq!(labels.get(GENERATION_LABEL).map(String::as_str), Some("3"));
    assert_eq!(labels.get("app").map(String::as_str), Some("agent"));
    let spec = made.spec.as_ref().unwrap();
    let tolerations = spec.tolerations.as_ref().unwrap();
    assert_eq!(
        tolerations.len(),
        6,
        "the existing one kept once, five added: {tolerations:?}"
    );
    let pinned = serde_json::to_value(&spec.affinity).unwrap();
    assert_eq!(
        pinned["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"],
        json!({"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n7"]}]}]}),
        "the pin replaces the template's terms"
    );
    let p = Pod {
        metadata: ObjectMeta::default(),
        spec: made.spec.clone(),
        status: None,
    };
    assert_eq!(
        target_node(&p).as_deref(),
        Some("n7"),
        "unbound: from the pin"
    );
    let no_generation = pod_template(&t, None, "abc", "n7");
    assert!(
        !no_generation
            .metadata
            .unwrap()
            .labels
            .unwrap()
            .contains_key(GENERATION_LABEL),
        "no generation annotation, no label"
    );
}

#[test]
fn manage_creates_prunes_and_evicts_per_node() {
    let nodes = vec![
        node("a", json!({}), json!([])),
        node("b", json!({}), json!([])),
        node("c", json!({}), json!([{"key": "k", "effect": "NoExecute"}])),
        node(
            "d",
            json!({}),
            json!([{"key": "k", "effect": "NoSchedule"}]),
        ),
    ];
    let d = ds(
        json!({}),
        json!({"containers": [{"name": "a", "image": "x"}]}),
    );
    let surge = ds(
        json!({"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}}),
        json!({"containers": [{"name": "a", "image": "x"}]}),
    );
    type Case<'a> = (&'a str, &'a DaemonSet, Vec<Pod>, Vec<&'a str>, Vec<&'a str>);
    // (what, ds, pods, nodes to create on, pods to delete)
    let cases: Vec<Case> = vec![
        (
            "empty cluster state: a pod per eligible node",
            &d,
            vec![],
            vec!["a", "b"],
            vec![],
        ),
        (
            "NoExecute evicts, NoSchedule keeps what runs",
            &d,
            vec![
                pod("pa", "a", "h", 0, Some(0)),
                pod("pb", "b", "h", 0, Some(0)),
                pod("pc", "c", "h", 0, Some(0)),
                pod("pd", "d", "h", 0, Some(0)),
            ],
            vec![],
            vec!["pc"],
        ),
        (
            "failed and succeeded pods are deleted, not yet replaced",
            &d,
            vec![
                phase(pod("pa", "a", "h", 0, None), "Failed"),
                phase(pod("pb", "b", "h", 0, None), "Succeeded"),
            ],
            vec![],
            vec!["pa", "pb"],
        ),
        (
            "a terminating pod holds its node until it is gone",
            &d,
            vec![
                terminating(pod("pa", "a", "h", 0, None)),
                pod("pb", "b", "h", 0, None),
            ],
            vec![],
            vec![],
        ),
        (
            "extra pods on a node: all but the oldest go",
            &d,
            vec![
                pod("new", "a", "h", 20, None),
                pod("old", "a", "h", 10, None),
                pod("pb", "b", "h", 0, None),
            ],
            vec![],
            vec!["new"],
        ),
        (
            "unscheduled pod for a node that is gone",
            &d,
            vec![
                pod("pa", "a", "h", 0, None),
                pod("pb", "b", "h", 0, None),
                {
                    let mut p = pod("ghost", "", "h", 0, None);
                    p.spec.as_mut().unwrap().node_name = None;
                    p.spec.as_mut().unwrap().affinity =
                        pod_template(&template(json!({})), None, "h", "gone")
                            .spec
                            .unwrap()
                            .affinity;
                    p
                },
            ],
            vec![],
            vec!["ghost"],
        ),
        (
            "surging: a terminating pod is replaced at once",
            &surge,
            vec![
                terminating(pod("pa", "a", "old", 0, Some(0))),
                pod("pb", "b", "h", 0, Some(0)),
            ],
            vec!["a"],
            vec![],
        ),
        (
            "surging: the old pod goes once the new one is available",
            &surge,
            vec![
                pod("old", "a", "old", 0, Some(0)),
                pod("new", "a", "h", 10, Some(10)),
                pod("pb", "b", "h", 0, Some(0)),
            ],
            vec![],
            vec!["old"],
        ),
        (
            "surging: both stay while the new one is not ready",
            &surge,
            vec![
                pod("old", "a", "old", 0, Some(0)),
                pod("new", "a", "h", 10, None),
                pod("pb", "b", "h", 0, Some(0)),
            ],
            vec![],
            vec![],
        ),
    ];
    for (what, ds, pods, create, delete) in cases {
        let mut by_node: BTreeMap<String, Vec<Pod>> = BTreeMap::new();
        for p in pods {
            by_node.entry(target_node(&p).unwrap()).or_default().push(p);
        }
        let view = View {
            ds,
            nodes: &nodes,
            pods: &by_node,
            hash: "h",
            now: at(100),
            failed_backoff: &BTreeSet::new(),
        };
        let changes = manage(&view);
        assert_eq!(changes.create_on, create, "{what}: created");
        let mut deleted = changes.delete.clone();
        deleted.sort();
        assert_eq!(deleted, delete, "{what}: deleted");
    }
}

#[test]
fn failed_pods_are_deleted_unless_their_node_is_in_back_off() {
    let nodes = vec![
        node("a", json!({}), json!([])),
        node("b", json!({}), json!([])),
    ];
    let d = ds(json!({}), json!({}));
    let mut by_node: BTreeMap<String, Vec<Pod>> = BTreeMap::new();
    by_node.insert(
        "a".into(),
        vec![phase(pod("pa", "a", "h", 0, None), "Failed")],
    );
    by_node.insert(
        "b".into(),
        vec![phase(pod("pb", "b", "h", 0, None), "Failed")],
    );
    let backoff: BTreeSet<String> = ["b".to_string()].into();
    let view = View {
        ds: &d,
        nodes: &nodes,
        pods: &by_node,
        hash: "h",
        now: at(100),
        failed_backoff: &backoff,
    };
    let changes = manage(&view);
    assert_eq!(changes.delete, vec!["pa"]);
    assert_eq!(changes.failed_on, vec!["a"]);
    assert!(changes.backing_off, "b is looked at again later");
    assert_eq!(changes.events.len(), 1);
    assert_eq!(changes.events[0].0, "FailedDaemonPod");
}

#[test]
fn budgets_round_up_and_never_deadlock() {
    let with = |ru: serde_json::Value| {
        ds(
            json!({"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": ru}}),
            json!({}),
        )
    };
    let b = |surge, unavailable| Budget {
        max_surge: surge,
        max_unavailable: unavailable,
        on_delete: false,
    };
    // (what, ds, desired nodes, expected)
    let cases = [
        ("defaults", ds(json!({}), json!({})), 10, b(0, 1)),
        (
            "25% of 10 rounds up",
            with(json!({"maxUnavailable": "25%"})),
            10,
            b(0, 3),
        ),
        (
            "surge 10% of 5 rounds up",
            with(json!({"maxSurge": "10%", "maxUnavailable": 0})),
            5,
            b(1, 0),
        ),
        (
            "zero and zero: one unavailable",
            with(json!({"maxSurge": 0, "maxUnavailable": 0})),
            4,
            b(0, 1),
        ),
        (
            "no nodes",
            with(json!({"maxSurge": 0, "maxUnavailable": 0})),
            0,
            b(0, 0),
        ),
    ];
    for (what, d, desired, want) in cases {
        assert_eq!(budget(&d, desired), Ok(want), "{what}");
    }
    let on_delete = ds(json!({"updateStrategy": {"type": "OnDelete"}}), json!({}));
    assert!(budget(&on_delete, 3).unwrap().on_delete);
    assert!(
        budget(&with(json!({"maxUnavailable": "lots"})), 3)
            .unwrap_err()
            .to_string()
            .contains("maxUnavailable")
    );
}

#[test]
fn rolling_update_steps_follow_kube() {
    let nodes: Vec<Node> = ["a", "b", "c", "d"]
        .iter()
        .map(|n| node(n, json!({}), json!([])))
        .collect();
    let d = ds(json!({}), json!({}));
    let b = |surge, unavailable| Budget {
        max_surge: surge,
        max_unavailable: unavailable,
        on_delete: false,
    };
    let old = |n: &str| pod(&format!("old-{n}"), n, "v1", 0, Some(0));
    let new_ready = |n: &str| pod(&format!("new-{n}"), n, "v2", 50, Some(50));
    let new_unready = |n: &str| pod(&format!("new-{n}"), n, "v2", 50, None);
    type Case<'a> = (&'a str, Budget, Vec<Pod>, Vec<&'a str>, Vec<&'a str>);
    // (what, budget, pods, nodes to create on, pods to delete)
    let cases: Vec<Case> = vec![
        (
            "maxUnavailable 1: one old pod goes",
            b(0, 1),
            vec![old("a"), old("b"), old("c"), old("d")],
            vec![],
            vec!["old-a"],
        ),
        (
            "maxUnavailable 2: two go",
            b(0, 2),
            vec![old("a"), old("b"), old("c"), old("d")],
            vec![],
            vec!["old-a", "old-b"],
        ),
        (
            "a node without a pod counts as unavailable",
            b(0, 2),
            vec![old("b"), old("c"), old("d")],
            vec![],
            vec!["old-b"],
        ),
        (
            "an unavailable new pod holds the budget",
            b(0, 1),
            vec![new_unready("a"), old("b"), old("c"), old("d")],
            vec![],
            vec![],
        ),
        (
            "once it is available the next old pod goes",
            b(0, 1),
            vec![new_ready("a"), old("b"), old("c"), old("d")],
            vec![],
            vec!["old-b"],
        ),
        (
            "unavailable old pods are replaced regardless of the budget",
            b(0, 1),
            vec![
                new_unready("a"),
                pod("old-b", "b", "v1", 0, None),
                pod("old-c", "c", "v1", 0, None),
                old("d"),
            ],
            vec![],
            vec!["old-b", "old-c"],
        ),
        (
            "done",
            b(0, 1),
            vec![
                new_ready("a"),
                new_ready("b"),
                new_ready("c"),
                new_ready("d"),
            ],
            vec![],
            vec![],
        ),
        (
            "maxSurge 1: a new pod beside one old",
            b(1, 0),
            vec![old("a"), old("b"), old("c"), old("d")],
            vec!["a"],
            vec![],
        ),
        (
            "surging: wait while the new pod is not available",
            b(1, 0),
            vec![old("a"), new_unready("a"), old("b"), old("c"), old("d")],
            vec![],
            vec![],
        ),
        (
            "surging: the old pod goes and the next node surges",
            b(1, 0),
            vec![old("a"), new_ready("a"), old("b"), old("c"), old("d")],
            vec!["b"],
            vec!["old-a"],
        ),
        (
            "surging: an unavailable old pod is replaced beyond the surge",
            b(1, 0),
            vec![
                old("a"),
                new_unready("a"),
                pod("old-b", "b", "v1", 0, None),
                old("c"),
                old("d"),
            ],
            vec!["b"],
            vec![],
        ),
    ];
    for (what, budget, pods, create, delete) in cases {
        let mut by_node: BTreeMap<String, Vec<Pod>> = BTreeMap::new();
        for p in pods {
            by_node.entry(target_node(&p).unwrap()).or_default().push(p);
        }
        let view = View {
            ds: &d,
            nodes: &nodes,
            pods: &by_node,
            hash: "v2",
            now: at(100),
            failed_backoff: &BTreeSet::new(),
        };
        let changes = rolling_update(&view, budget);
        assert_eq!(changes.create_on, create, "{what}: created");
        assert_eq!(changes.delete, delete, "{what}: deleted");
    }
    let mut by_node: BTreeMap<String, Vec<Pod>> = BTreeMap::new();
    by_node.insert("a".into(), vec![old("a")]);
    let on_delete = Budget {
        max_surge: 0,
        max_unavailable: 0,
        on_delete: true,
    };
    let view = View {
        ds: &d,
        nodes: &nodes,
        pods: &by_node,
        hash: "v2",
        now: at(100),
        failed_backoff: &BTreeSet::new(),
    };
    assert!(
        rolling_update(&view, on_delete).is_empty(),
        "OnDelete never replaces"
    );
}

#[test]
fn status_counts_per_node_like_kube() {
    let nodes = vec![
        node("a", json!({}), json!([])),
        node("b", json!({}), json!([])),
        node("c", json!({}), json!([])),
        node(
            "x",
            json!({}),
            json!([{"key": "k", "effect": "NoSchedule"}]),
        ),
    ];
    let mut d = ds(json!({"minReadySeconds": 30}), json!({}));
    d.metadata.generation = Some(7);
    let mut by_node: BTreeMap<String, Vec<Pod>> = BTreeMap::new();
    by_node.insert("a".into(), vec![pod("pa", "a", "v2", 0, Some(0))]); // available, updated
    by_node.insert("b".into(), vec![pod("pb", "b", "v1", 0, Some(90))]); // ready 10 s of 30
    by_node.insert("x".into(), vec![pod("px", "x", "v2", 0, Some(0))]); // misscheduled
    let view = View {
        ds: &d,
        nodes: &nodes,
        pods: &by_node,
        hash: "v2",
        now: at(100),
        failed_backoff: &BTreeSet::new(),
    };
    let (status, recheck) = status_of(&view);
    assert_eq!(status.desired_number_scheduled, 3);
    assert_eq!(status.current_number_scheduled, 2);
    assert_eq!(status.number_misscheduled, 1);
    assert_eq!(status.number_ready, 2);
    assert_eq!(status.number_available, Some(1));
    assert_eq!(status.number_unavailable, Some(2));
    assert_eq!(status.updated_number_scheduled, Some(1));
    assert_eq!(status.observed_generation, Some(7));
    assert!(recheck, "a Ready pod becomes available later");
}
