//! Action subresources: pods/binding (the scheduler's bind), pods/eviction, and
//! serviceaccounts/token (TokenRequest).

use std::sync::Arc;

use http::Response;
use serde_json::{Value, json};
use tandem_apimachinery::selector::LabelSelector;

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

/// POST pods/{name}/eviction: deletes the pod with the eviction's DeleteOptions, unless that
/// would break the PodDisruptionBudget covering it, as kube-apiserver's eviction REST does:
/// pods already terminal, pending or being deleted go without a check; a pod under more than
/// one budget cannot be evicted (500); a budget not yet observed at its generation, or
/// allowing no disruption, refuses with 429 TooManyRequests; otherwise the budget's
/// `disruptionsAllowed` is taken down by one and the pod listed in `disruptedPods` (retried
/// on conflicts) before the pod is deleted.
pub async fn evict(
    state: &State,
    call: &Call,
    res: &Arc<ResourceInfo>,
) -> ApiResult<Response<Body>> {
    let eviction: Value = crate::objects::parse_body(&call.body, call.content_type())?;
    if let Some(named) = eviction["metadata"]["name"].as_str()
        && named != call.info.name
    {
        return Err(ApiError::bad_request(
            "name in URL does not match name in Eviction object",
        ));
    }
    let opts = &eviction["deleteOptions"];
    let query_dry_run = call.query.get("dryRun").is_some_and(|d| d == "All");
    let mut delete = DeleteOptions {
        grace: opts["gracePeriodSeconds"].as_i64(),
        propagation: opts["propagationPolicy"].as_str().map(str::to_string),
        uid: opts["preconditions"]["uid"].as_str().map(str::to_string),
        rv: opts["preconditions"]["resourceVersion"]
            .as_str()
            .and_then(|r| r.parse().ok()),
        dry_run: query_dry_run
            || opts["dryRun"]
                .as_array()
                .is_some_and(|d| d.iter().any(|v| v == "All")),
    };
    let (ns, name) = (call.info.namespace.as_str(), call.info.name.as_str());
    let mut attempts = 0;
    let (pod_doc, pod) = loop {
        let pod_doc = fetch(state, res, ns, name)?;
        let pod = pod_doc.value();
        if !can_ignore_budget(&pod) {
            break (pod_doc, pod);
        }
        let mut guarded = delete.clone();
        if guarded.rv.is_none() && enforce_resource_version(&pod) {
            guarded.rv = Some(pod_doc.rv);
        }
        match delete_one(state, call, res, ns, name, &guarded).await {
            Ok(_) => return Ok(json_response(201, &success())),
            // The pod changed since it was read: look again, unless the client asked for
            // that exact version.
            Err(e) if e.code == 409 && delete.rv.is_none() && attempts < 20 => attempts += 1,
            Err(e) => return Err(e),
        }
    };
    let pdb_res = state
        .registry
        .read()
        .by_kind("policy", "PodDisruptionBudget")
        .ok_or_else(|| ApiError::internal("the poddisruptionbudgets resource is not served"))?;
    let budgets = budgets_of(state, &pdb_res, &pod);
    if budgets.len() > 1 {
        return Err(ApiError {
            code: 500,
            reason: "",
            message: "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.".into(),
            details: None,
        });
    }
    let mut guard_unready = false;
    if let Some(budget) = budgets.first() {
        let budget_name = budget["metadata"]["name"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let status = &budget["status"];
        let (current, desired) = (
            status["currentHealthy"].as_i64().unwrap_or(0),
            status["desiredHealthy"].as_i64().unwrap_or(0),
        );
        let always_allow = budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow";
        if !pod_ready(&pod) && (always_allow || (current >= desired && desired > 0)) {
            // An unready pod does not count as healthy: evicting it costs the budget
            // nothing (with `AlwaysAllow`, even when the budget lacks healthy pods), as long
            // as the pod has not become ready meanwhile.
            guard_unready = true;
        } else {
            take_from_budget(state, &pdb_res, ns, &budget_name, name, delete.dry_run)?;
        }
        if guard_unready {
            let original_rv = delete.rv;
            if original_rv.is_none() {
                delete.rv = Some(pod_doc.rv);
            }
            return match delete_one(state, call, res, ns, name, &delete).await {
                Ok(_) => Ok(json_response(201, &success())),
                Err(e) if e.code == 409 && original_rv.is_none() => {
                    Err(budget_refusal(&budget_name, None, 10))
                }
                Err(e) => Err(e),
            };
        }
    }
    delete_one(state, call, res, ns, name, &delete).await?;
    Ok(json_response(201, &success()))
}

/// `canIgnorePDB`: a pod that is done, not yet running, or already going costs no budget.
fn can_ignore_budget(pod: &Value) -> bool {
    matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed" | "Pending")
    ) || crate::objects::is_deleting(pod)
}

/// `shouldEnforceResourceVersion`: a pending pod is deleted only as it was seen, so that it
/// cannot have become ready (and counted) in between.
fn enforce_resource_version(pod: &Value) -> bool {
    !matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    ) && !crate::objects::is_deleting(pod)
}

fn pod_ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// The budgets in the pod's namespace whose selector matches it; a budget with an empty or
/// unreadable selector matches nothing.
fn budgets_of(state: &State, pdb_res: &ResourceInfo, pod: &Value) -> Vec<Value> {
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or("");
    let (_, docs) = state.store.list(&pdb_res.storage_key(), Some(ns), None);
    docs.iter()
        .map(|d| d.value())
        .filter(|pdb| {
            LabelSelector::from_metav1(Some(&pdb["spec"]["selector"]))
                .is_ok_and(|sel| !sel.is_everything() && sel.matches_object(pod))
        })
        .collect()
}

/// kube's 429 for an eviction its budget does not allow, with the DisruptionBudget cause.
fn budget_refusal(budget: &str, health: Option<(i64, i64)>, retry_after: u64) -> ApiError {
    let cause = match health {
        Some((desired, current)) => format!(
            "The disruption budget {budget} needs {desired} healthy pods and has {current} currently"
        ),
        None => format!("The disruption budget {budget} is still being processed by the server."),
    };
    let mut e = ApiError::too_many_requests(
        "Cannot evict pod as it would violate the pod's disruption budget.",
    );
    let mut details = json!({"causes": [{"reason": "DisruptionBudget", "message": cause}]});
    if retry_after > 0 {
        details["retryAfterSeconds"] = json!(retry_after);
    }
    e.details = Some(details);
    e
}

/// `checkAndDecrement`, retried on conflicts with a fresh copy of the budget.
fn take_from_budget(
    state: &State,
    pdb_res: &ResourceInfo,
    ns: &str,
    budget: &str,
    pod: &str,
    dry_run: bool,
) -> ApiResult<()> {
    for _ in 0..20 {
        let doc = fetch(state, pdb_res, ns, budget)?;
        let mut pdb = doc.value();
        let status = &pdb["status"];
        let generation = pdb["metadata"]["generation"].as_i64().unwrap_or(0);
        if status["observedGeneration"].as_i64().unwrap_or(0) < generation {
            return Err(budget_refusal(budget, None, 10));
        }
        let allowed = status["disruptionsAllowed"].as_i64().unwrap_or(0);
        if allowed < 0 {
            return Err(ApiError::forbidden(
                "policy",
                "poddisruptionbudget",
                budget,
                "pdb disruptions allowed is negative",
            ));
        }
        let disrupted = status["disruptedPods"].as_object().map_or(0, |m| m.len());
        if disrupted > MAX_DISRUPTED_PODS {
            return Err(ApiError::forbidden(
                "policy",
                "poddisruptionbudget",
                budget,
                "DisruptedPods map too big - too many evictions not confirmed by PDB controller",
            ));
        }
        if allowed == 0 {
            let health = (
                status["desiredHealthy"].as_i64().unwrap_or(0),
                status["currentHealthy"].as_i64().unwrap_or(0),
            );
            return Err(budget_refusal(budget, Some(health), 0));
        }
        if dry_run {
            return Ok(());
        }
        let now = crate::objects::now();
        pdb["status"]["disruptionsAllowed"] = json!(allowed - 1);
        if allowed - 1 == 0 {
            insufficient_pods(&mut pdb, &now);
        }
        if !pdb["status"]["disruptedPods"].is_object() {
            pdb["status"]["disruptedPods"] = json!({});
        }
        pdb["status"]["disruptedPods"][pod] = json!(now);
        match state.update_object(pdb_res, ns, budget, doc.rv, &mut pdb) {
            Ok(_) => return Ok(()),
            Err(e) if e.code == 409 => continue,
            Err(e) => return Err(e),
        }
    }
    Err(ApiError::timeout(format!(
        "couldn't update PodDisruptionBudget {budget:?} due to conflicts"
    )))
}

/// `MaxDisruptedPodSize`: evictions the budget's controller has yet to confirm.
const MAX_DISRUPTED_PODS: usize = 2000;

/// `UpdateDisruptionAllowedCondition` for a budget with no disruption left.
fn insufficient_pods(pdb: &mut Value, now: &str) {
    let observed = pdb["status"]["observedGeneration"].clone();
    let mut condition = json!({"type": "DisruptionAllowed", "status": "False",
        "reason": "InsufficientPods", "message": "", "observedGeneration": observed,
        "lastTransitionTime": now});
    if !pdb["status"]["conditions"].is_array() {
        pdb["status"]["conditions"] = json!([]);
    }
    let list = pdb["status"]["conditions"]
        .as_array_mut()
        .expect("just made a list");
    if let Some(old) = list.iter_mut().find(|c| c["type"] == "DisruptionAllowed") {
        if old["status"] == "False" {
            condition["lastTransitionTime"] = old["lastTransitionTime"].clone();
        }
        *old = condition;
    } else {
        list.push(condition);
    }
}

/// The pod a TokenRequest binds its token to (`spec.boundObjectRef`), checked as
/// kube-apiserver checks it: a Pod of the ServiceAccount's namespace that exists, has the
/// given uid and runs as that ServiceAccount. Only Pods can be bound here.
fn bound_pod(
    state: &State,
    call: &Call,
    reference: &Value,
) -> ApiResult<Option<crate::authn::BoundPod>> {
    if reference.is_null() {
        return Ok(None);
    }
    let invalid = |detail: String| {
        ApiError::invalid_field(
            "authentication.k8s.io",
            "TokenRequest",
            &call.info.name,
            "spec.boundObjectRef",
            &detail,
        )
    };
    let kind = reference["kind"].as_str().unwrap_or_default();
    if kind != "Pod" {
        return Err(invalid(format!(
            "Unsupported value: \"{kind}\": supported values: \"Pod\""
        )));
    }
    let name = reference["name"].as_str().unwrap_or_default();
    let ns = &call.info.namespace;
    let Some(pod) = state.store.get("/pods", ns, name) else {
        return Err(ApiError::not_found("", "pods", name));
    };
    if !reference["uid"].is_null() && !reference["uid"].is_string() {
        return Err(invalid("Invalid value: uid must be a string".into()));
    }
    if let Some(uid) = reference["uid"].as_str()
        && uid != &*pod.uid
    {
        return Err(ApiError::conflict_message(format!(
            "the UID in the bound object reference ({uid}) does not match the UID in record \
             ({}). The object might have been deleted and then recreated",
            pod.uid
        )));
    }
    let spec = pod.value();
    let account = spec["spec"]["serviceAccountName"]
        .as_str()
        .unwrap_or("default");
    if account != call.info.name {
        return Err(invalid(format!(
            "Invalid value: \"{name}\": pod {ns}/{name} runs as ServiceAccount {account}, not {}",
            call.info.name
        )));
    }
    Ok(Some(crate::authn::BoundPod {
        name: name.to_string(),
        uid: pod.uid.to_string(),
    }))
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
        .unwrap_or_else(|| vec![crate::authn::API_AUDIENCE.into()]);
    let pod = bound_pod(state, call, &request["spec"]["boundObjectRef"])?;
    let (token, exp) = crate::authn::issue_service_account_token(
        state,
        &call.info.namespace,
        &call.info.name,
        &sa.uid,
        &audiences,
        seconds,
        pod.as_ref(),
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
