//! DaemonSets and virtual nodes (Liqo #1398). A DaemonSet controller faithful to kube places a
//! pod on every node whose taints its pods tolerate, and agents such as kube-proxy tolerate
//! every taint: on a virtual node such a pod would run once per consumer, far from the nodes
//! it is meant to serve, or sit in back-off. So, unless the DaemonSet opts in, the placement
//! webhook adds to its pod template a required node affinity excluding virtual nodes: any
//! DaemonSet controller then never targets them. A DaemonSet opts in with the annotation
//! [`names::DAEMONSET_ON_VIRTUAL_NODES_ANNOTATION`] `"true"` or a node affinity naming virtual
//! nodes; its pod on a virtual node then runs once in the provider (as one shadow pod). As a
//! safety net, the virtual kubelet refuses to offload a DaemonSet pod that does not carry the
//! opt-in (one created before Tandem was installed, say), with the reason in its status.
//!
//! Objects are JSON here (as the webhook receives them); nothing is sent from this module: what
//! to do is decided in `plan`, and turned here into the JSON patch the webhook answers and the
//! message the virtual kubelet writes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};
use tandem_api::names;

mod plan;

use plan::{Missing, Step};
pub use plan::{REFUSED_REASON, names_virtual_nodes, opted_in};

/// The JSON patch (RFC 6902) the webhook answers for a DaemonSet being created or updated:
/// - opted in: the annotation on the pod template too, so that each pod carries its opt-in
///   to the virtual kubelet;
/// - else, if its pods tolerate the virtual-node taint: the requirement excluding virtual
///   nodes added to every required nodeSelectorTerm of the template (one term made if there
///   is none; an empty term, which matches no node, stays empty);
/// - else nothing (the taint already keeps its pods off).
pub fn admission_patch(ds: &Value) -> Vec<Value> {
    match plan::admission(ds) {
        Ok(step) => vec![patch(step)],
        Err(_) => Vec::new(),
    }
}

/// The one JSON patch operation that makes `step`.
fn patch(step: Step) -> Value {
    match step {
        Step::CarryOptIn(Missing::Annotation) => {
            let key = names::DAEMONSET_ON_VIRTUAL_NODES_ANNOTATION
                .replace('~', "~0")
                .replace('/', "~1");
            json!({"op": "add", "path": format!("/spec/template/metadata/annotations/{key}"), "value": "true"})
        }
        Step::CarryOptIn(Missing::Annotations) => {
            json!({"op": "add", "path": "/spec/template/metadata/annotations",
                   "value": {names::DAEMONSET_ON_VIRTUAL_NODES_ANNOTATION: "true"}})
        }
        Step::CarryOptIn(Missing::Metadata) => {
            json!({"op": "add", "path": "/spec/template/metadata",
                   "value": {"annotations": {names::DAEMONSET_ON_VIRTUAL_NODES_ANNOTATION: "true"}}})
        }
        Step::KeepOffVirtualNodes { affinity } => {
            json!({"op": "add", "path": "/spec/template/spec/affinity", "value": affinity})
        }
    }
}

/// Why the virtual kubelet must not offload a pod: it belongs to a DaemonSet and does not
/// carry the opt-in annotation. None for every other pod.
pub fn refusal(meta: &ObjectMeta) -> Option<String> {
    plan::pod(meta).err().map(plan::Refusal::message)
}

#[cfg(test)]
mod tests {
    use super::plan::off_virtual_nodes;
    use super::*;

    fn ds(annotations: Value, template_annotations: Value, spec: Value) -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "agent", "annotations": annotations},
            "spec": {
                "selector": {"matchLabels": {"app": "agent"}},
                "template": {
                    "metadata": {"labels": {"app": "agent"}, "annotations": template_annotations},
                    "spec": spec,
                },
            },
        })
    }

    /// Applies a JSON patch the way the API server would (only `add`, which the module emits).
    fn apply(mut doc: Value, patch: &[Value]) -> Value {
        for op in patch {
            assert_eq!(op["op"], "add");
            let path = op["path"].as_str().unwrap();
            let parts: Vec<String> = path
                .split('/')
                .skip(1)
                .map(|p| p.replace("~1", "/").replace("~0", "~"))
                .collect();
            let (last, parents) = parts.split_last().unwrap();
            let mut at = &mut doc;
            for p in parents {
                at = &mut at[p.as_str()];
            }
            at[last.as_str()] = op["value"].clone();
        }
        doc
    }

    fn required_terms(ds: &Value) -> Value {
        ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
            ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            .clone()
    }

    #[test]
    fn daemonsets_tolerating_everything_are_kept_off_virtual_nodes() {
        let off = off_virtual_nodes();
        let all = json!([{"operator": "Exists"}]);
        let containers = json!([{"name": "a", "image": "x"}]);
        // (what, pod spec, expected required terms after the patch; Null: no patch)
        let cases = [
            (
                "no affinity: one term",
                json!({"containers": containers, "tolerations": all}),
                json!([{"matchExpressions": [off]}]),
            ),
            (
                "every term gets it",
                json!({"containers": containers, "tolerations": all, "affinity": {
                "podAntiAffinity": {"x": 1},
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
                    {},
                ]}}}}),
                json!([
                    {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}, off]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}], "matchExpressions": [off]},
                    {},
                ]),
            ),
            (
                "already there: nothing to do",
                json!({"containers": containers, "tolerations": all, "affinity": {"nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [off]}]}}}}),
                Value::Null,
            ),
            (
                "tolerating the virtual-node taint by key",
                json!({"containers": containers, "tolerations": [{"key": names::VIRTUAL_NODE_TAINT, "operator": "Exists"}]}),
                json!([{"matchExpressions": [off]}]),
            ),
            (
                "tolerating only NoSchedule taints: the taint keeps it off",
                json!({"containers": containers, "tolerations": [{"operator": "Exists", "effect": "NoSchedule"}]}),
                Value::Null,
            ),
            (
                "no tolerations",
                json!({"containers": containers}),
                Value::Null,
            ),
        ];
        for (what, spec, want) in cases {
            let d = ds(Value::Null, Value::Null, spec);
            let patch = admission_patch(&d);
            if want.is_null() {
                assert!(patch.is_empty(), "{what}: {patch:?}");
                continue;
            }
            let patched = apply(d.clone(), &patch);
            assert_eq!(required_terms(&patched), want, "{what}");
            assert_eq!(
                patched["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"],
                d["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"],
                "{what}: the rest of the affinity is kept"
            );
            assert!(
                admission_patch(&patched).is_empty(),
                "{what}: idempotent on update"
            );
        }
    }

    #[test]
    fn opted_in_daemonsets_carry_the_opt_in_to_their_pods() {
        let all = json!([{"operator": "Exists"}]);
        let annotation = json!({names::DAEMONSET_ON_VIRTUAL_NODES_ANNOTATION: "true"});
        let cases = [
            (
                "annotated",
                ds(annotation.clone(), Value::Null, json!({"tolerations": all})),
            ),
            (
                "annotated, template with other annotations",
                ds(
                    annotation.clone(),
                    json!({"other": "x"}),
                    json!({"tolerations": all}),
                ),
            ),
            (
                "node affinity naming virtual nodes",
                ds(
                    Value::Null,
                    Value::Null,
                    json!({"tolerations": all, "affinity": {"nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": names::NODE_TYPE_LABEL, "operator": "In", "values": [names::VIRTUAL_NODE_TYPE]}]}]}}}}),
                ),
            ),
            (
                "nodeSelector on a provider",
                ds(
                    Value::Null,
                    Value::Null,
                    json!({"tolerations": all, "nodeSelector": {names::REMOTE_CLUSTER_LABEL: "milan"}}),
                ),
            ),
        ];
        for (what, d) in cases {
            assert!(opted_in(&d), "{what}");
            let patched = apply(d.clone(), &admission_patch(&d));
            let template = &patched["spec"]["template"];
            assert_eq!(
                template["metadata"]["annotations"][names::DAEMONSET_ON_VIRTUAL_NODES_ANNOTATION],
                "true",
                "{what}"
            );
            assert_eq!(
                template["spec"], d["spec"]["template"]["spec"],
                "{what}: spec untouched"
            );
            assert!(admission_patch(&patched).is_empty(), "{what}: idempotent");
        }
        let not_in = ds(
            Value::Null,
            Value::Null,
            json!({"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": names::NODE_TYPE_LABEL, "operator": "NotIn", "values": [names::VIRTUAL_NODE_TYPE]}]}]}}}}),
        );
        assert!(!opted_in(&not_in), "excluding virtual nodes is no opt-in");
        let off = ds(
            json!({names::DAEMONSET_ON_VIRTUAL_NODES_ANNOTATION: "false"}),
            Value::Null,
            json!({}),
        );
        assert!(!opted_in(&off));
    }

    #[test]
    fn the_virtual_kubelet_refuses_daemonset_pods_without_the_opt_in() {
        let meta = |kind: &str, annotation: Option<&str>| -> ObjectMeta {
            serde_json::from_value(json!({
                "name": "agent-x2kd9",
                "annotations": annotation.map(|v| json!({names::DAEMONSET_ON_VIRTUAL_NODES_ANNOTATION: v})),
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": kind, "name": "agent",
                                     "uid": "u1", "controller": true}],
            }))
            .unwrap()
        };
        let why = refusal(&meta("DaemonSet", None)).expect("refused");
        assert!(
            why.contains("DaemonSet agent")
                && why.contains(names::DAEMONSET_ON_VIRTUAL_NODES_ANNOTATION),
            "{why}"
        );
        assert_eq!(refusal(&meta("DaemonSet", Some("true"))), None);
        assert!(refusal(&meta("DaemonSet", Some("yes"))).is_some());
        assert_eq!(refusal(&meta("ReplicaSet", None)), None);
        assert_eq!(refusal(&ObjectMeta::default()), None);
    }
}
