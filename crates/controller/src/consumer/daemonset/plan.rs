//! What the DaemonSet rules decide, from the object alone: pure.
//!
//! What the placement webhook does to a DaemonSet being created or updated ([`admission`]: a
//! [`Step`], or why it is left [`Untouched`]), and whether the virtual kubelet may offload a pod
//! of a DaemonSet ([`pod`]: why it is [`Offloadable`], or its [`Refusal`]).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};
use tandem_api::names;
use tandem_core::offloading::tolerates_virtual_nodes;

use crate::node_marks::MARKS;

/// Reason in the status of a DaemonSet pod the virtual kubelet will not offload.
pub const REFUSED_REASON: &str = "DaemonSetNotOptedIn";

fn annotated(meta: &Value) -> bool {
    meta["annotations"][names::DAEMONSET_ON_VIRTUAL_NODES_ANNOTATION] == "true"
}

/// Whether a pod spec's nodeSelector or required node affinity names virtual nodes: the
/// virtual-node type label (In), or a provider's cluster-ID label.
pub fn names_virtual_nodes(pod_spec: &Value) -> bool {
    if pod_spec["nodeSelector"][MARKS.type_label] == MARKS.type_value
        || pod_spec["nodeSelector"][names::REMOTE_CLUSTER_LABEL].is_string()
    {
        return true;
    }
    let terms = &pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    terms.as_array().into_iter().flatten().any(|term| {
        term["matchExpressions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| {
                let values = r["values"].as_array();
                let has = |v: &str| values.is_some_and(|vs| vs.iter().any(|x| x == v));
                match (r["key"].as_str(), r["operator"].as_str()) {
                    (Some(k), Some("In")) if k == MARKS.type_label => has(MARKS.type_value),
                    (Some(k), Some("In" | "Exists")) => k == names::REMOTE_CLUSTER_LABEL,
                    _ => false,
                }
            })
    })
}

/// Whether a DaemonSet (JSON) opts into virtual nodes: the annotation on it or on its pod
/// template, or a pod template whose node affinity names virtual nodes.
pub fn opted_in(ds: &Value) -> bool {
    let template = &ds["spec"]["template"];
    annotated(&ds["metadata"])
        || annotated(&template["metadata"])
        || names_virtual_nodes(&template["spec"])
}

/// The requirement that keeps pods off virtual nodes.
pub(super) fn off_virtual_nodes() -> Value {
    json!({"key": MARKS.type_label, "operator": "NotIn", "values": [MARKS.type_value]})
}

/// What an opted-in DaemonSet's pod template lacks to carry the annotation: the patch adds
/// the deepest part that exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Missing {
    /// Its annotations lack the opt-in.
    Annotation,
    /// Its metadata has no annotations.
    Annotations,
    /// It has no metadata.
    Metadata,
}

/// What the webhook changes in a DaemonSet being created or updated.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Step {
    /// Opted in: the annotation added to its pod template, so that each pod carries its opt-in
    /// to the virtual kubelet.
    CarryOptIn(Missing),
    /// Its pods tolerate the virtual-node taint: the template's affinity becomes `affinity`,
    /// the requirement excluding virtual nodes added to every required nodeSelectorTerm (one
    /// term made if there is none; an empty term, which matches no node, stays empty).
    KeepOffVirtualNodes { affinity: Value },
}

/// Why the webhook leaves a DaemonSet as it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Untouched {
    /// It has no pod template spec to read.
    NoPodTemplate,
    /// Opted in, and its pod template carries the annotation already.
    OptInCarried,
    /// Its pods do not tolerate the virtual-node taint: the taint keeps them off already.
    TaintKeepsOff,
    /// Every required term excludes virtual nodes already (or is empty).
    AlreadyExcluded,
}

/// What the webhook does to DaemonSet `ds` (JSON, as the webhook receives it).
pub(super) fn admission(ds: &Value) -> Result<Step, Untouched> {
    let template = &ds["spec"]["template"];
    if !template["spec"].is_object() {
        return Err(Untouched::NoPodTemplate);
    }
    if opted_in(ds) {
        if annotated(&template["metadata"]) {
            return Err(Untouched::OptInCarried);
        }
        return Ok(Step::CarryOptIn(
            if template["metadata"]["annotations"].is_object() {
                Missing::Annotation
            } else if template["metadata"].is_object() {
                Missing::Annotations
            } else {
                Missing::Metadata
            },
        ));
    }
    if !tolerates_virtual_nodes(&json!({"spec": template["spec"]}), MARKS) {
        return Err(Untouched::TaintKeepsOff);
    }
    let mut affinity = match &template["spec"]["affinity"] {
        Value::Object(a) => Value::Object(a.clone()),
        _ => json!({}),
    };
    let required = &mut affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
    let requirement = off_virtual_nodes();
    let mut changed = false;
    match required["nodeSelectorTerms"].as_array_mut() {
        Some(terms) if !terms.is_empty() => {
            for term in terms {
                let exprs = term["matchExpressions"].as_array().map_or(0, Vec::len);
                let fields = term["matchFields"].as_array().map_or(0, Vec::len);
                if exprs + fields == 0 {
                    continue;
                }
                if term["matchExpressions"].is_null() {
                    term["matchExpressions"] = json!([]);
                }
                if let Some(list) = term["matchExpressions"].as_array_mut()
                    && !list.contains(&requirement)
                {
                    list.push(requirement.clone());
                    changed = true;
                }
            }
        }
        _ => {
            required["nodeSelectorTerms"] = json!([{"matchExpressions": [requirement]}]);
            changed = true;
        }
    }
    if !changed {
        return Err(Untouched::AlreadyExcluded);
    }
    Ok(Step::KeepOffVirtualNodes { affinity })
}

/// Why the virtual kubelet may offload a pod, as far as DaemonSets go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Offloadable {
    /// No DaemonSet (of `apps/`) controls it.
    NotDaemonSetPod,
    /// Its DaemonSet opted in: the pod carries the annotation.
    OptedIn,
}

/// Why the virtual kubelet must not offload a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Refusal<'a> {
    /// It belongs to DaemonSet `daemonset` and does not carry the opt-in annotation.
    NotOptedIn { daemonset: &'a str },
}

impl Refusal<'_> {
    /// What the pod's status says.
    pub(super) fn message(self) -> String {
        match self {
            Refusal::NotOptedIn { daemonset } => format!(
                "pod of DaemonSet {} not offloaded: DaemonSets run on virtual nodes only when they opt in \
                 (annotation {}: \"true\", or a node affinity naming virtual nodes)",
                daemonset,
                names::DAEMONSET_ON_VIRTUAL_NODES_ANNOTATION
            ),
        }
    }
}

/// Whether the virtual kubelet may offload the pod of metadata `meta`.
pub(super) fn pod(meta: &ObjectMeta) -> Result<Offloadable, Refusal<'_>> {
    let Some(owner) = meta
        .owner_references
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|r| r.controller == Some(true))
    else {
        return Ok(Offloadable::NotDaemonSetPod);
    };
    if owner.kind != "DaemonSet" || !owner.api_version.starts_with("apps/") {
        return Ok(Offloadable::NotDaemonSetPod);
    }
    let opted = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(names::DAEMONSET_ON_VIRTUAL_NODES_ANNOTATION))
        .is_some_and(|v| v == "true");
    if opted {
        Ok(Offloadable::OptedIn)
    } else {
        Err(Refusal::NotOptedIn {
            daemonset: &owner.name,
        })
    }
}

#[cfg(test)]
mod tests;
