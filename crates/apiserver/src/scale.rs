//! The scale subresource: an autoscaling/v1 Scale view of a workload's replica count.

use std::sync::Arc;

use http::Response;
use serde_json::{Value, json};
use tandem_apimachinery::patchmeta::PatchSchema;

use crate::error::{ApiError, ApiResult};
use crate::registry::ResourceInfo;
use crate::request::Call;
use crate::response::{Body, json_response};
use crate::state::{State, fetch, store_error};

/// Where the replica counts live: (spec replicas, status replicas, label selector) paths.
fn paths(res: &ResourceInfo) -> (String, String, Option<String>) {
    match res.custom.as_ref().and_then(|c| c.scale.as_ref()) {
        Some(scale) => (
            scale["specReplicasPath"]
                .as_str()
                .unwrap_or(".spec.replicas")
                .to_string(),
            scale["statusReplicasPath"]
                .as_str()
                .unwrap_or(".status.replicas")
                .to_string(),
            scale["labelSelectorPath"].as_str().map(str::to_string),
        ),
        None => (".spec.replicas".into(), ".status.replicas".into(), None),
    }
}

fn at<'a>(obj: &'a Value, path: &str) -> &'a Value {
    path.trim_start_matches('.')
        .split('.')
        .fold(obj, |v, p| v.get(p).unwrap_or(&Value::Null))
}

fn set(obj: &mut Value, path: &str, value: Value) {
    let mut cur = obj;
    let parts: Vec<&str> = path.trim_start_matches('.').split('.').collect();
    for p in &parts[..parts.len() - 1] {
        if !cur[*p].is_object() {
            cur[*p] = json!({});
        }
        cur = &mut cur[*p];
    }
    cur[parts[parts.len() - 1]] = value;
}

/// The label selector of a workload in string form (matchLabels and matchExpressions).
fn selector_string(sel: &Value) -> String {
    let mut parts: Vec<String> = sel["matchLabels"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect()
        })
        .unwrap_or_default();
    for e in sel["matchExpressions"].as_array().into_iter().flatten() {
        let key = e["key"].as_str().unwrap_or("");
        let values: Vec<&str> = e["values"]
            .as_array()
            .map(|v| v.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        parts.push(match e["operator"].as_str().unwrap_or("") {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.to_string(),
            _ => format!("!{key}"),
        });
    }
    parts.join(",")
}

fn scale_of(res: &ResourceInfo, obj: &Value) -> Value {
    let (spec_path, status_path, selector_path) = paths(res);
    let selector = match selector_path {
        Some(p) => at(obj, &p).clone(),
        None => json!(selector_string(&obj["spec"]["selector"])),
    };
    let meta = &obj["metadata"];
    json!({
        "kind": "Scale", "apiVersion": "autoscaling/v1",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"],
                     "resourceVersion": meta["resourceVersion"], "creationTimestamp": meta["creationTimestamp"]},
        "spec": {"replicas": at(obj, &spec_path).as_i64().unwrap_or(0)},
        "status": {"replicas": at(obj, &status_path).as_i64().unwrap_or(0), "selector": selector},
    })
}

/// GET …/scale.
pub fn get(state: &State, call: &Call, res: &Arc<ResourceInfo>) -> ApiResult<Response<Body>> {
    let doc = fetch(state, res, &call.info.namespace, &call.info.name)?;
    Ok(json_response(200, &scale_of(res, &doc.value())))
}

/// PUT or PATCH …/scale: changes the workload's replica count.
pub async fn write(
    state: &State,
    call: &Call,
    res: &Arc<ResourceInfo>,
) -> ApiResult<Response<Body>> {
    let ns = call.info.namespace.as_str();
    let name = call.info.name.as_str();
    for _ in 0..16 {
        let doc = fetch(state, res, ns, name)?;
        let obj = doc.value();
        let current = scale_of(res, &obj);
        let content_type = call
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/json");
        let body = crate::objects::parse_body(&call.body, content_type)?;
        let wanted = if call.info.verb == "update" {
            body
        } else {
            let patched = match content_type.split(';').next().unwrap_or("") {
                "application/json-patch+json" => {
                    tandem_apimachinery::patch::json_patch(&current, &body)
                }
                "application/strategic-merge-patch+json" => {
                    tandem_apimachinery::patch::strategic_merge_patch(
                        &current,
                        &body,
                        &PatchSchema::empty(),
                    )
                }
                _ => tandem_apimachinery::patch::merge_patch(&current, &body),
            };
            patched.map_err(|e| ApiError::bad_request(e.to_string()))?
        };
        if let Some(rv) = wanted["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|r| r.parse::<u64>().ok())
            && rv != doc.rv
        {
            return Err(store_error(res, name, crate::store::StoreError::Conflict));
        }
        let Some(replicas) = wanted["spec"]["replicas"].as_i64() else {
            return Err(ApiError::invalid_field(
                "autoscaling",
                "Scale",
                name,
                "spec.replicas",
                "Required value",
            ));
        };
        if replicas < 0 {
            return Err(ApiError::invalid_field(
                "autoscaling",
                "Scale",
                name,
                "spec.replicas",
                &format!("Invalid value: {replicas}: must be greater than or equal to 0"),
            ));
        }
        let mut updated = obj.clone();
        let (spec_path, _, _) = paths(res);
        set(&mut updated, &spec_path, json!(replicas));
        crate::objects::prepare_update(res, &obj, &mut updated, "");
        if crate::objects::same_object(&obj, &updated) {
            return Ok(json_response(200, &current));
        }
        match state.update_object(res, ns, name, doc.rv, &mut updated) {
            Ok(_) => return Ok(json_response(200, &scale_of(res, &updated))),
            Err(e) if e.code == 409 => continue,
            Err(e) => return Err(e),
        }
    }
    Err(ApiError::too_many_writers(&res.group, &res.resource, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selector_strings() {
        let sel = json!({"matchLabels": {"app": "web"}, "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["a", "b"]},
            {"key": "x", "operator": "Exists"}, {"key": "y", "operator": "DoesNotExist"}]});
        assert_eq!(selector_string(&sel), "app=web,tier in (a,b),x,!y");
    }
}
