//! Review resources computed per request and never stored: access reviews (`kubectl auth
//! can-i`), rules reviews (`can-i --list`), SelfSubjectReview (`auth whoami`), TokenReview.

use std::sync::Arc;

use http::Response;
use serde_json::{Value, json};
use tandem_apimachinery::rbac::{Attributes, Decision, UserInfo};

use crate::error::{ApiError, ApiResult};
use crate::registry::ResourceInfo;
use crate::request::Call;
use crate::response::{Body, json_response};
use crate::state::State;

fn decide(state: &State, user: &UserInfo, spec: &Value, namespace_override: Option<&str>) -> Value {
    let (ra, nra) = (&spec["resourceAttributes"], &spec["nonResourceAttributes"]);
    let text = |v: &Value| v.as_str().unwrap_or("").to_string();
    let (verb, ns, group, resource, sub, name, path, resource_request) = if ra.is_object() {
        (
            text(&ra["verb"]),
            namespace_override
                .map(str::to_string)
                .unwrap_or_else(|| text(&ra["namespace"])),
            text(&ra["group"]),
            text(&ra["resource"]),
            text(&ra["subresource"]),
            text(&ra["name"]),
            String::new(),
            true,
        )
    } else {
        (
            text(&nra["verb"]),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            text(&nra["path"]),
            false,
        )
    };
    let attrs = Attributes {
        verb: &verb,
        namespace: &ns,
        api_group: &group,
        resource: &resource,
        subresource: &sub,
        name: &name,
        path: &path,
        resource_request,
    };
    if user.groups.iter().any(|g| g == "system:masters") {
        return json!({"allowed": true, "reason": "system:masters"});
    }
    match state.rbac.read().authorize(user, &attrs) {
        Decision::Allow(reason) => json!({"allowed": true, "reason": reason}),
        Decision::Deny => json!({"allowed": false}),
    }
}

/// Answers a review create.
pub async fn create(
    state: &Arc<State>,
    call: &Call,
    res: &Arc<ResourceInfo>,
) -> ApiResult<Response<Body>> {
    if call.info.verb != "create" {
        return Err(ApiError::method_not_allowed(&call.info.verb, &res.resource));
    }
    let mut obj: Value = crate::objects::parse_body(&call.body, call.content_type())?;
    crate::objects::check_type(res, &mut obj)?;
    let spec = obj["spec"].clone();
    let status = match res.kind.as_str() {
        "SelfSubjectAccessReview" => decide(state, &call.user, &spec, None),
        "LocalSubjectAccessReview" => {
            decide(state, &subject(&spec), &spec, Some(&call.info.namespace))
        }
        "SubjectAccessReview" => decide(state, &subject(&spec), &spec, None),
        "SelfSubjectRulesReview" => {
            let ns = spec["namespace"].as_str().unwrap_or("");
            let rules = if call.user.groups.iter().any(|g| g == "system:masters") {
                vec![
                    json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}),
                    json!({"verbs": ["*"], "nonResourceURLs": ["*"]}),
                ]
            } else {
                state.rbac.read().rules_for(&call.user, ns)
            };
            let (resource_rules, non_resource): (Vec<Value>, Vec<Value>) = rules
                .into_iter()
                .partition(|r| r.get("nonResourceURLs").is_none());
            json!({"resourceRules": resource_rules, "nonResourceRules": non_resource, "incomplete": false})
        }
        "SelfSubjectReview" => {
            json!({"userInfo": {"username": call.user.name, "groups": call.user.groups}})
        }
        "TokenReview" => {
            match crate::authn::authenticate_token(state, spec["token"].as_str().unwrap_or("")) {
                Some(mut user) => {
                    user.groups.push("system:authenticated".into());
                    json!({"authenticated": true, "user": {"username": user.name, "groups": user.groups}})
                }
                None => json!({"authenticated": false, "error": "invalid bearer token"}),
            }
        }
        other => return Err(ApiError::internal(format!("no review handler for {other}"))),
    };
    obj["status"] = status;
    Ok(json_response(201, &obj))
}

fn subject(spec: &Value) -> UserInfo {
    UserInfo {
        name: spec["user"].as_str().unwrap_or("").to_string(),
        groups: spec["groups"]
            .as_array()
            .map(|g| {
                g.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default(),
    }
}
