//! Validation of writes: structural schemas of custom resources (with pruning and the
//! fieldValidation modes) and the built-in rules clients most often run into.

use std::sync::Arc;

use serde_json::{Value, json};
use tandem_apimachinery::schema;
use tandem_apimachinery::selector::LabelSelector;

use crate::error::{ApiError, ApiResult};
use crate::registry::ResourceInfo;
use crate::request::Call;
use crate::state::State;

type Cause = (String, String, String);

fn cause(field: &str, kind: &str, message: String) -> Cause {
    (kind.to_string(), field.to_string(), message)
}

fn required(field: &str) -> Cause {
    cause(
        field,
        "FieldValueRequired",
        format!("{field}: Required value"),
    )
}

/// Validates `obj` (the object about to be stored); `old` is the stored one on updates.
pub fn validate(
    state: &State,
    call: &Call,
    res: &Arc<ResourceInfo>,
    old: Option<&Value>,
    obj: &mut Value,
) -> ApiResult<()> {
    let name = obj["metadata"]["name"].as_str().unwrap_or("").to_string();
    let mut causes = metadata(obj);
    if let Some(custom) = &res.custom {
        if let Some(schema) = &custom.schema {
            let pruned = schema::prune(obj, schema);
            if !pruned.is_empty() {
                let mode = call
                    .query
                    .get("fieldValidation")
                    .map(String::as_str)
                    .unwrap_or("Warn");
                if mode == "Strict" {
                    let list: Vec<String> = pruned
                        .iter()
                        .map(|p| format!("unknown field {p:?}"))
                        .collect();
                    return Err(ApiError::bad_request(format!(
                        "strict decoding error: {}",
                        list.join(", ")
                    )));
                }
                tracing::debug!(resource = %res.resource, %name, ?pruned, "pruned unknown fields");
            }
            for err in schema::validate(obj, schema) {
                causes.push((
                    err.kind.reason().to_string(),
                    err.field.clone(),
                    err.to_string(),
                ));
            }
        }
    } else {
        causes.extend(builtin(state, res, old, obj));
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(&res.group, &res.kind, &name, causes))
    }
}

fn metadata(obj: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    for (field, value) in [
        ("metadata.labels", &obj["metadata"]["labels"]),
        ("metadata.annotations", &obj["metadata"]["annotations"]),
    ] {
        if let Some(map) = value.as_object() {
            for (k, v) in map {
                if !v.is_string() {
                    causes.push(cause(
                        field,
                        "FieldValueTypeInvalid",
                        format!("{field}: Invalid value: {v}: {k} must be a string"),
                    ));
                }
            }
        }
    }
    if let Some(labels) = obj["metadata"]["labels"].as_object() {
        let pairs: Vec<String> = labels
            .iter()
            .filter_map(|(k, v)| v.as_str().map(|v| format!("{k}={v}")))
            .collect();
        for pair in pairs {
            if let Err(e) = LabelSelector::parse(&pair) {
                causes.push(cause(
                    "metadata.labels",
                    "FieldValueInvalid",
                    format!("metadata.labels: Invalid value: {:?}: {e}", pair),
                ));
            }
        }
    }
    causes
}

fn builtin(_state: &State, res: &ResourceInfo, old: Option<&Value>, obj: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    match (res.group.as_str(), res.kind.as_str()) {
        ("", "Pod") => {
            causes.extend(pod_spec("spec", &obj["spec"]));
            if let Some(old) = old {
                causes.extend(pod_update(old, obj));
            }
        }
        ("apps", "Deployment" | "ReplicaSet") => {
            let selector = &obj["spec"]["selector"];
            if !selector.is_object() {
                causes.push(required("spec.selector"));
            } else {
                match LabelSelector::from_metav1(Some(selector)) {
                    Ok(sel) if sel.is_everything() => causes.push(cause("spec.selector", "FieldValueInvalid",
                        format!("spec.selector: Invalid value: {selector}: empty selector is invalid for deployment"))),
                    Ok(sel) => {
                        if !sel.matches_object(&obj["spec"]["template"]) {
                            let labels = &obj["spec"]["template"]["metadata"]["labels"];
                            causes.push(cause("spec.template.metadata.labels", "FieldValueInvalid",
                                format!("spec.template.metadata.labels: Invalid value: {labels}: `selector` does not match template `labels`")));
                        }
                    }
                    Err(e) => causes.push(cause("spec.selector", "FieldValueInvalid", format!("spec.selector: Invalid value: {selector}: {e}"))),
                }
                if let Some(old) = old
                    && old["spec"]["selector"] != *selector
                {
                    causes.push(cause(
                        "spec.selector",
                        "FieldValueInvalid",
                        format!("spec.selector: Invalid value: {selector}: field is immutable"),
                    ));
                }
            }
            if obj["spec"]["replicas"].as_i64().is_some_and(|r| r < 0) {
                causes.push(cause(
                    "spec.replicas",
                    "FieldValueInvalid",
                    format!(
                        "spec.replicas: Invalid value: {}: must be greater than or equal to 0",
                        obj["spec"]["replicas"]
                    ),
                ));
            }
            causes.extend(pod_spec(
                "spec.template.spec",
                &obj["spec"]["template"]["spec"],
            ));
        }
        ("", "Service") => {
            for (i, p) in obj["spec"]["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
            {
                let port = p["port"].as_i64().unwrap_or(0);
                if !(1..=65535).contains(&port) {
                    causes.push(cause(&format!("spec.ports[{i}].port"), "FieldValueInvalid",
                        format!("spec.ports[{i}].port: Invalid value: {port}: must be between 1 and 65535, inclusive")));
                }
            }
            if obj["spec"]["type"] != "ExternalName"
                && obj["spec"]["clusterIP"] != "None"
                && obj["spec"]["ports"].as_array().is_none_or(Vec::is_empty)
            {
                causes.push(required("spec.ports"));
            }
        }
        ("apiextensions.k8s.io", "CustomResourceDefinition") => {
            causes.extend(crate::crd::validate(obj))
        }
        _ => {}
    }
    causes
}

fn pod_spec(path: &str, spec: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let containers = spec["containers"].as_array().cloned().unwrap_or_default();
    if containers.is_empty() {
        causes.push(required(&format!("{path}.containers")));
    }
    let mut names = std::collections::HashSet::new();
    for (i, c) in containers.iter().enumerate() {
        let name = c["name"].as_str().unwrap_or("");
        if name.is_empty() {
            causes.push(required(&format!("{path}.containers[{i}].name")));
        } else if !names.insert(name.to_string()) {
            causes.push(cause(
                &format!("{path}.containers[{i}].name"),
                "FieldValueDuplicate",
                format!(
                    "{path}.containers[{i}].name: Duplicate value: {}",
                    json!(name)
                ),
            ));
        }
        if c["image"].as_str().unwrap_or("").is_empty() {
            causes.push(required(&format!("{path}.containers[{i}].image")));
        }
    }
    causes
}

/// Pod specs are immutable but for images, activeDeadlineSeconds, added tolerations and
/// removed scheduling gates; nodeName changes only through binding.
fn pod_update(old: &Value, new: &Value) -> Vec<Cause> {
    let mutable = |spec: &Value| {
        let mut s = spec.clone();
        for list in ["containers", "initContainers"] {
            for c in s[list].as_array_mut().into_iter().flatten() {
                c["image"] = Value::Null;
            }
        }
        if let Some(m) = s.as_object_mut() {
            for k in [
                "activeDeadlineSeconds",
                "tolerations",
                "schedulingGates",
                "terminationGracePeriodSeconds",
            ] {
                m.remove(k);
            }
        }
        s
    };
    let (o, n) = (&old["spec"], &new["spec"]);
    if mutable(o) == mutable(n) {
        return Vec::new();
    }
    vec![cause("spec", "FieldValueForbidden",
        "spec: Forbidden: pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)".into())]
}
