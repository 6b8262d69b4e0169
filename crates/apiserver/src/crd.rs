//! CustomResourceDefinitions: validating them and the resources each one serves. Keeping the
//! registry and a CRD's status in step with the stored CRD is a write of the shared state
//! (`state::sync_crd`).

use std::sync::Arc;

use serde_json::{Value, json};

use crate::registry::{CustomInfo, FULL_VERBS, ResourceInfo};

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

/// The resources a CRD serves, one per served version.
pub fn resource_infos(crd: &Value) -> Vec<ResourceInfo> {
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
