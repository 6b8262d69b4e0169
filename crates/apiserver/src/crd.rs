//! CustomResourceDefinitions: validating them, serving their resources, keeping their
//! status (NamesAccepted, Established, storedVersions) and cleaning up on deletion.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::registry::{CustomInfo, FULL_VERBS, ResourceInfo};
use crate::state::State;

const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

/// Validation causes for a CRD object.
pub fn validate(crd: &Value) -> Vec<(String, String, String)> {
    let mut causes = Vec::new();
    let mut req = |field: &str| {
        causes.push((
            "FieldValueRequired".to_string(),
            field.to_string(),
            format!("{field}: Required value"),
        ));
    };
    let spec = &crd["spec"];
    let group = spec["group"].as_str().unwrap_or("");
    let plural = spec["names"]["plural"].as_str().unwrap_or("");
    if group.is_empty() {
        req("spec.group");
    }
    if plural.is_empty() {
        req("spec.names.plural");
    }
    if spec["names"]["kind"].as_str().unwrap_or("").is_empty() {
        req("spec.names.kind");
    }
    if !matches!(spec["scope"].as_str(), Some("Namespaced" | "Cluster")) {
        causes.push((
            "FieldValueNotSupported".into(),
            "spec.scope".into(),
            format!(
                "spec.scope: Unsupported value: {}: supported values: \"Cluster\", \"Namespaced\"",
                spec["scope"]
            ),
        ));
    }
    let name = crd["metadata"]["name"].as_str().unwrap_or("");
    if !group.is_empty() && !plural.is_empty() && name != format!("{plural}.{group}") {
        causes.push((
            "FieldValueInvalid".into(),
            "metadata.name".into(),
            format!(
                "metadata.name: Invalid value: {}: must be spec.names.plural+\".\"+spec.group",
                json!(name)
            ),
        ));
    }
    let versions = spec["versions"].as_array().cloned().unwrap_or_default();
    if versions.is_empty() {
        causes.push(("FieldValueRequired".into(), "spec.versions".into(), "spec.versions: Invalid value: null: must have exactly one version marked as storage version".into()));
    } else if versions.iter().filter(|v| v["storage"] == true).count() != 1 {
        causes.push(("FieldValueInvalid".into(), "spec.versions".into(),
            "spec.versions: Invalid value: []apiextensions.CustomResourceDefinitionVersion{...}: must have exactly one version marked as storage version".into()));
    }
    for (i, v) in versions.iter().enumerate() {
        if let Some(schema) = v["schema"]["openAPIV3Schema"].as_object() {
            for e in tandem_apimachinery::schema::structural_errors(&Value::Object(schema.clone()))
            {
                causes.push((
                    "FieldValueInvalid".into(),
                    format!("spec.versions[{i}].schema.openAPIV3Schema"),
                    format!("spec.versions[{i}].schema.openAPIV3Schema: {e}"),
                ));
            }
        }
    }
    causes
}

fn resource_infos(crd: &Value) -> Vec<ResourceInfo> {
    let spec = &crd["spec"];
    let names = &spec["names"];
    let text = |v: &Value| v.as_str().unwrap_or("").to_string();
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let kind = text(&names["kind"]);
    let singular = match text(&names["singular"]) {
        s if s.is_empty() => kind.to_lowercase(),
        s => s,
    };
    spec["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["served"] == true)
        .map(|v| {
            let subresources = &v["subresources"];
            let mut subs = Vec::new();
            if subresources["status"].is_object() {
                subs.push("status".to_string());
            }
            if subresources["scale"].is_object() {
                subs.push("scale".to_string());
            }
            ResourceInfo {
                group: text(&spec["group"]),
                version: text(&v["name"]),
                resource: text(&names["plural"]),
                singular: singular.clone(),
                kind: kind.clone(),
                namespaced: spec["scope"] == "Namespaced",
                short_names: strings(&names["shortNames"]),
                categories: strings(&names["categories"]),
                subresources: subs,
                verbs: FULL_VERBS.iter().map(|s| s.to_string()).collect(),
                selectable_fields: Vec::new(),
                stored: true,
                keeps_status_on_create: false,
                custom: Some(Arc::new(CustomInfo {
                    schema: v["schema"]["openAPIV3Schema"]
                        .as_object()
                        .map(|o| Value::Object(o.clone())),
                    printer_columns: v["additionalPrinterColumns"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default(),
                    scale: subresources["scale"]
                        .as_object()
                        .map(|o| Value::Object(o.clone())),
                    crd_name: crd["metadata"]["name"].as_str().unwrap_or("").to_string(),
                })),
            }
        })
        .collect()
}

/// Brings the registry and the CRD's status in line with a stored (or deleted) CRD.
pub fn sync(state: &State, crd: Option<&Value>, name: &str) {
    let Some(crd) = crd else {
        // The CRD is gone: stop serving whatever it defined.
        if let Some((plural, group)) = name.split_once('.') {
            state.registry.write().remove_resource(group, plural);
        }
        return;
    };
    let spec = &crd["spec"];
    let group = spec["group"].as_str().unwrap_or("").to_string();
    let plural = spec["names"]["plural"].as_str().unwrap_or("").to_string();
    if crate::objects::is_deleting(crd) {
        cleanup(state, crd, &group, &plural);
        return;
    }
    {
        let mut registry = state.registry.write();
        registry.remove_resource(&group, &plural);
        for info in resource_infos(crd) {
            registry.insert(info);
        }
    }
    update_status(state, crd);
}

fn update_status(state: &State, crd: &Value) {
    let name = crd["metadata"]["name"].as_str().unwrap_or("");
    let Some(crd_res) =
        state
            .registry
            .read()
            .get("apiextensions.k8s.io", "v1", "customresourcedefinitions")
    else {
        return;
    };
    let mut desired = crd.clone();
    let now = crate::objects::now();
    let keep_time = |t: &str| -> Value {
        crd["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == t && c["status"] == "True"))
            .map(|c| c["lastTransitionTime"].clone())
            .unwrap_or(json!(now))
    };
    let names = &crd["spec"]["names"];
    let mut accepted = names.clone();
    if accepted["singular"].as_str().unwrap_or("").is_empty() {
        accepted["singular"] = json!(names["kind"].as_str().unwrap_or("").to_lowercase());
    }
    if accepted["listKind"].as_str().unwrap_or("").is_empty() {
        accepted["listKind"] = json!(format!("{}List", names["kind"].as_str().unwrap_or("")));
    }
    let storage = crd["spec"]["versions"]
        .as_array()
        .and_then(|v| v.iter().find(|x| x["storage"] == true))
        .map(|v| v["name"].clone());
    let mut stored: Vec<Value> = crd["status"]["storedVersions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if let Some(s) = storage
        && !stored.contains(&s)
    {
        stored.push(s);
    }
    desired["status"] = json!({
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": keep_time("NamesAccepted")},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": keep_time("Established")},
        ],
        "acceptedNames": accepted,
        "storedVersions": stored,
    });
    let finalizers = crate::objects::finalizers(crd);
    if !finalizers.iter().any(|f| f == CLEANUP_FINALIZER) {
        let mut f = finalizers;
        f.push(CLEANUP_FINALIZER.into());
        desired["metadata"]["finalizers"] = json!(f);
    }
    if desired == *crd {
        return;
    }
    let rv = crd["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    if let Err(e) = state.update_object(&crd_res, "", name, rv, &mut desired) {
        // A concurrent write re-triggers sync with the newer object.
        tracing::debug!(crd = name, "status update raced: {e}");
    }
}

/// Deletes every custom resource of a CRD being deleted, then releases its finalizer.
fn cleanup(state: &State, crd: &Value, group: &str, plural: &str) {
    let name = crd["metadata"]["name"].as_str().unwrap_or("");
    let key = format!("{group}/{plural}");
    let (_, docs) = state.store.list(&key, None, None);
    for doc in docs {
        if let Err(e) = state.store.delete(&key, &doc.namespace, &doc.name, None) {
            tracing::warn!(crd = name, object = %doc.name, "deleting custom resource: {e:?}");
        }
    }
    let Some(crd_res) =
        state
            .registry
            .read()
            .get("apiextensions.k8s.io", "v1", "customresourcedefinitions")
    else {
        return;
    };
    let mut desired = crd.clone();
    let remaining: Vec<String> = crate::objects::finalizers(crd)
        .into_iter()
        .filter(|f| f != CLEANUP_FINALIZER)
        .collect();
    let rv = crd["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    let result = if remaining.is_empty() {
        state
            .remove_object(&crd_res, "", name, Some(rv))
            .map(|_| ())
    } else {
        desired["metadata"]["finalizers"] = json!(remaining);
        state
            .update_object(&crd_res, "", name, rv, &mut desired)
            .map(|_| ())
    };
    if let Err(e) = result {
        tracing::debug!(crd = name, "cleanup raced: {e}");
    }
}
