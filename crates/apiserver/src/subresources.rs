//! Action subresources: pods/binding (the scheduler's bind), pods/eviction, and
//! serviceaccounts/token (TokenRequest).

use std::sync::Arc;

use http::Response;
use serde_json::{Value, json};

use crate::deletion::{DeleteOptions, delete_one};
use crate::error::{ApiError, ApiResult};
use crate::registry::ResourceInfo;
use crate::request::Call;
use crate::response::{Body, json_response};
use crate::state::{State, fetch};

fn success() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})
}

/// POST pods/{name}/binding: assigns the pod to a node, once.
pub async fn bind(
    state: &State,
    call: &Call,
    res: &Arc<ResourceInfo>,
) -> ApiResult<Response<Body>> {
    let binding: Value = crate::objects::parse_body(&call.body, call.content_type())?;
    let node = binding["target"]["name"].as_str().unwrap_or("").to_string();
    if node.is_empty() {
        return Err(ApiError::invalid_field(
            "",
            "Binding",
            &call.info.name,
            "target.name",
            "Required value",
        ));
    }
    let (ns, name) = (call.info.namespace.as_str(), call.info.name.as_str());
    for _ in 0..16 {
        let doc = fetch(state, res, ns, name)?;
        let mut pod = doc.value();
        if crate::objects::is_deleting(&pod) {
            return Err(ApiError::conflict(
                "",
                "pods",
                name,
                &format!("pod {name} is being deleted, cannot be assigned to a host"),
            ));
        }
        if let Some(current) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) {
            return Err(ApiError::conflict(
                "",
                "pods",
                name,
                &format!("pod {name} is already assigned to node {current:?}"),
            ));
        }
        pod["spec"]["nodeName"] = json!(node);
        let condition = json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null,
                               "lastTransitionTime": crate::objects::now()});
        let conditions = pod["status"]["conditions"].as_array_mut();
        match conditions {
            Some(list) => {
                list.retain(|c| c["type"] != "PodScheduled");
                list.push(condition);
            }
            None => pod["status"]["conditions"] = json!([condition]),
        }
        let generation = pod["metadata"]["generation"].as_i64().unwrap_or(1);
        pod["metadata"]["generation"] = json!(generation + 1);
        match state.update_object(res, ns, name, doc.rv, &mut pod) {
            Ok(_) => return Ok(json_response(201, &success())),
            Err(e) if e.code == 409 => continue,
            Err(e) => return Err(e),
        }
    }
    Err(ApiError::too_many_writers("", "pods", name))
}

/// POST pods/{name}/eviction: deletes the pod with the eviction's DeleteOptions.
pub async fn evict(
    state: &State,
    call: &Call,
    res: &Arc<ResourceInfo>,
) -> ApiResult<Response<Body>> {
    let eviction: Value = crate::objects::parse_body(&call.body, call.content_type())?;
    let opts = &eviction["deleteOptions"];
    let delete = DeleteOptions {
        grace: opts["gracePeriodSeconds"].as_i64(),
        propagation: opts["propagationPolicy"].as_str().map(str::to_string),
        uid: opts["preconditions"]["uid"].as_str().map(str::to_string),
        rv: opts["preconditions"]["resourceVersion"]
            .as_str()
            .and_then(|r| r.parse().ok()),
        dry_run: opts["dryRun"]
            .as_array()
            .is_some_and(|d| d.iter().any(|v| v == "All")),
    };
    delete_one(
        state,
        call,
        res,
        &call.info.namespace,
        &call.info.name,
        &delete,
    )
    .await?;
    Ok(json_response(201, &success()))
}

/// POST serviceaccounts/{name}/token: a signed token for the ServiceAccount.
pub fn token_request(
    state: &State,
    call: &Call,
    res: &Arc<ResourceInfo>,
) -> ApiResult<Response<Body>> {
    let sa = fetch(state, res, &call.info.namespace, &call.info.name)?;
    let mut request: Value = crate::objects::parse_body(&call.body, call.content_type())?;
    let seconds = request["spec"]["expirationSeconds"]
        .as_i64()
        .unwrap_or(3600);
    if seconds < 600 {
        return Err(ApiError::invalid_field(
            "authentication.k8s.io",
            "TokenRequest",
            &call.info.name,
            "spec.expirationSeconds",
            &format!("Invalid value: {seconds}: may not specify a duration less than 10 minutes"),
        ));
    }
    let audiences: Vec<String> = request["spec"]["audiences"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .filter(|a: &Vec<String>| !a.is_empty())
        .unwrap_or_else(|| vec!["https://kubernetes.default.svc".into()]);
    let (token, exp) = crate::authn::issue_service_account_token(
        state,
        &call.info.namespace,
        &call.info.name,
        &sa.uid,
        &audiences,
        seconds,
    );
    request["apiVersion"] = json!("authentication.k8s.io/v1");
    request["kind"] = json!("TokenRequest");
    request["metadata"]["name"] = json!(call.info.name);
    request["metadata"]["namespace"] = json!(call.info.namespace);
    request["metadata"]["creationTimestamp"] = Value::Null;
    request["spec"]["audiences"] = json!(audiences);
    request["spec"]["expirationSeconds"] = json!(seconds);
    request["status"] = json!({"token": token, "expirationTimestamp": exp.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)});
    Ok(json_response(201, &request))
}
