//! The DaemonSet decisions as an administrator sees them: what the webhook changes in a
//! DaemonSet (`kubectl get ds -o yaml` after `apply`), and which DaemonSet pods the virtual
//! kubelet leaves Pending, with what message.

use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

const OPT_IN: &str = names::DAEMONSET_ON_VIRTUAL_NODES_ANNOTATION;

/// A DaemonSet as `kubectl apply` sends it: one container, no tolerations, no affinity.
struct DaemonSetFixture(Value);

impl DaemonSetFixture {
    fn new() -> Self {
        DaemonSetFixture(json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "agent"},
            "spec": {
                "selector": {"matchLabels": {"app": "agent"}},
                "template": {
                    "metadata": {"labels": {"app": "agent"}},
                    "spec": {"containers": [{"name": "a", "image": "x"}]},
                },
            },
        }))
    }
    /// The opt-in annotation (with `value`) on the DaemonSet itself.
    fn annotated(mut self, value: &str) -> Self {
        self.0["metadata"]["annotations"] = json!({OPT_IN: value});
        self
    }
    fn template_annotations(mut self, annotations: Value) -> Self {
        self.0["spec"]["template"]["metadata"]["annotations"] = annotations;
        self
    }
    fn without_template_metadata(mut self) -> Self {
        self.template().remove("metadata");
        self
    }
    fn without_template_spec(mut self) -> Self {
        self.template().remove("spec");
        self
    }
    fn pod_spec(mut self, key: &str, value: Value) -> Self {
        self.0["spec"]["template"]["spec"][key] = value;
        self
    }
    fn tolerating_everything(self) -> Self {
        self.pod_spec("tolerations", json!([{"operator": "Exists"}]))
    }
    /// Required node affinity with these nodeSelectorTerms.
    fn required_terms(self, terms: Value) -> Self {
        self.pod_spec(
            "affinity",
            json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": terms}}}),
        )
    }
    fn template(&mut self) -> &mut serde_json::Map<String, Value> {
        self.0["spec"]["template"].as_object_mut().unwrap()
    }
}

/// The affinity of a template whose required terms are `terms`.
fn with_terms(terms: Value) -> Value {
    json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": terms}}})
}

#[test]
fn admission_table() {
    let off = off_virtual_nodes();
    let disk = json!({"key": "disk", "operator": "In", "values": ["ssd"]});
    let by_name = json!({"key": "metadata.name", "operator": "In", "values": ["n1"]});
    let virtual_only = json!({"key": names::NODE_TYPE_LABEL, "operator": "In",
                              "values": [names::VIRTUAL_NODE_TYPE]});
    let cases: Vec<(&str, DaemonSetFixture, Result<Step, Untouched>)> = vec![
        (
            "no pod template spec: Untouched::NoPodTemplate",
            DaemonSetFixture::new().without_template_spec(),
            Err(Untouched::NoPodTemplate),
        ),
        (
            "opted in, template annotated otherwise: CarryOptIn(Missing::Annotation)",
            DaemonSetFixture::new()
                .annotated("true")
                .template_annotations(json!({"other": "x"})),
            Ok(Step::CarryOptIn(Missing::Annotation)),
        ),
        (
            "opted in, template without annotations: CarryOptIn(Missing::Annotations)",
            DaemonSetFixture::new().annotated("true"),
            Ok(Step::CarryOptIn(Missing::Annotations)),
        ),
        (
            "opted in, template without metadata: CarryOptIn(Missing::Metadata)",
            DaemonSetFixture::new()
                .annotated("true")
                .without_template_metadata(),
            Ok(Step::CarryOptIn(Missing::Metadata)),
        ),
        (
            "opted in by a nodeSelector on a provider, tolerating everything: CarryOptIn",
            DaemonSetFixture::new().tolerating_everything().pod_spec(
                "nodeSelector",
                json!({names::REMOTE_CLUSTER_LABEL: "milan"}),
            ),
            Ok(Step::CarryOptIn(Missing::Annotations)),
        ),
        (
            "opted in by an affinity for virtual nodes: CarryOptIn",
            DaemonSetFixture::new()
                .tolerating_everything()
                .required_terms(json!([{"matchExpressions": [virtual_only]}])),
            Ok(Step::CarryOptIn(Missing::Annotations)),
        ),
        (
            "the template carries the opt-in: Untouched::OptInCarried",
            DaemonSetFixture::new()
                .tolerating_everything()
                .template_annotations(json!({OPT_IN: "true"})),
            Err(Untouched::OptInCarried),
        ),
        (
            "no tolerations: Untouched::TaintKeepsOff",
            DaemonSetFixture::new(),
            Err(Untouched::TaintKeepsOff),
        ),
        (
            "tolerating only NoSchedule taints: Untouched::TaintKeepsOff",
            DaemonSetFixture::new().pod_spec(
                "tolerations",
                json!([{"operator": "Exists", "effect": "NoSchedule"}]),
            ),
            Err(Untouched::TaintKeepsOff),
        ),
        (
            "annotation false, tolerating everything, no affinity: KeepOffVirtualNodes, one term",
            DaemonSetFixture::new()
                .annotated("false")
                .tolerating_everything(),
            Ok(Step::KeepOffVirtualNodes {
                affinity: with_terms(json!([{"matchExpressions": [off]}])),
            }),
        ),
        (
            "tolerating the taint by key, other affinity kept: KeepOffVirtualNodes in every term",
            DaemonSetFixture::new()
                .pod_spec(
                    "tolerations",
                    json!([{"key": names::VIRTUAL_NODE_TAINT, "operator": "Exists"}]),
                )
                .pod_spec(
                    "affinity",
                    json!({"podAntiAffinity": {"x": 1}, "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                            {"matchExpressions": [disk]}, {"matchFields": [by_name]}, {}]}}}),
                ),
            Ok(Step::KeepOffVirtualNodes {
                affinity: json!({"podAntiAffinity": {"x": 1}, "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                        {"matchExpressions": [disk, off]},
                        {"matchFields": [by_name], "matchExpressions": [off]},
                        {}]}}}),
            }),
        ),
        (
            "an empty list of terms: KeepOffVirtualNodes, one term made",
            DaemonSetFixture::new()
                .tolerating_everything()
                .required_terms(json!([])),
            Ok(Step::KeepOffVirtualNodes {
                affinity: with_terms(json!([{"matchExpressions": [off]}])),
            }),
        ),
        (
            "every term excludes virtual nodes: Untouched::AlreadyExcluded",
            DaemonSetFixture::new()
                .tolerating_everything()
                .required_terms(json!([{"matchExpressions": [off]}])),
            Err(Untouched::AlreadyExcluded),
        ),
        (
            "only an empty term, which matches no node: Untouched::AlreadyExcluded",
            DaemonSetFixture::new()
                .tolerating_everything()
                .required_terms(json!([{}])),
            Err(Untouched::AlreadyExcluded),
        ),
    ];
    for (case, ds, want) in cases {
        assert_eq!(admission(&ds.0), want, "{case}");
    }
}

/// The metadata of a pod controlled (or not) by an owner of `api_version`/`kind`.
fn pod_meta(owner: Option<(&str, &str, bool)>, opt_in: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some("agent-x2kd9".into()),
        annotations: opt_in.map(|v| [(OPT_IN.to_string(), v.to_string())].into()),
        owner_references: owner.map(|(api_version, kind, controller)| {
            vec![OwnerReference {
                api_version: api_version.into(),
                kind: kind.into(),
                name: "agent".into(),
                uid: "u1".into(),
                controller: Some(controller),
                ..Default::default()
            }]
        }),
        ..Default::default()
    }
}

#[test]
fn pod_table() {
    let ds = Some(("apps/v1", "DaemonSet", true));
    let refused = Err(Refusal::NotOptedIn { daemonset: "agent" });
    let cases: Vec<(&str, ObjectMeta, Result<Offloadable, Refusal>)> = vec![
        (
            "no owner: Offloadable::NotDaemonSetPod",
            pod_meta(None, None),
            Ok(Offloadable::NotDaemonSetPod),
        ),
        (
            "a ReplicaSet's: Offloadable::NotDaemonSetPod",
            pod_meta(Some(("apps/v1", "ReplicaSet", true)), None),
            Ok(Offloadable::NotDaemonSetPod),
        ),
        (
            "a DaemonSet owns it without controlling it: Offloadable::NotDaemonSetPod",
            pod_meta(Some(("apps/v1", "DaemonSet", false)), None),
            Ok(Offloadable::NotDaemonSetPod),
        ),
        (
            "a DaemonSet of another API group: Offloadable::NotDaemonSetPod",
            pod_meta(Some(("example.com/v1", "DaemonSet", true)), None),
            Ok(Offloadable::NotDaemonSetPod),
        ),
        (
            "carrying the opt-in: Offloadable::OptedIn",
            pod_meta(ds, Some("true")),
            Ok(Offloadable::OptedIn),
        ),
        (
            "no opt-in: Refusal::NotOptedIn",
            pod_meta(ds, None),
            refused,
        ),
        (
            "opt-in other than \"true\": Refusal::NotOptedIn",
            pod_meta(ds, Some("yes")),
            refused,
        ),
    ];
    for (case, meta, want) in cases {
        assert_eq!(pod(&meta), want, "{case}");
    }
}

#[test]
fn the_refusal_names_the_daemonset_and_the_opt_in() {
    assert_eq!(
        Refusal::NotOptedIn { daemonset: "agent" }.message(),
        "pod of DaemonSet agent not offloaded: DaemonSets run on virtual nodes only when they opt \
         in (annotation tandem.dev/daemonset-on-virtual-nodes: \"true\", or a node affinity \
         naming virtual nodes)"
    );
}
