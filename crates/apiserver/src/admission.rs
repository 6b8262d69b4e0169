//! Dynamic admission: mutating then validating webhooks from the *WebhookConfiguration
//! objects, called with AdmissionReview v1 over HTTPS verified with their caBundle.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};
use tandem_apimachinery::selector::LabelSelector;

use crate::error::{ApiError, ApiResult, with_causes};
use crate::registry::ResourceInfo;
use crate::request::Call;
use crate::state::State;
use crate::webhook::{ServiceRef, WebhookError, post, post_to_service};

const MUTATING: &str = "admissionregistration.k8s.io/mutatingwebhookconfigurations";
const VALIDATING: &str = "admissionregistration.k8s.io/validatingwebhookconfigurations";

struct Request<'a> {
    res: &'a ResourceInfo,
    call: &'a Call,
    operation: &'a str,
    namespace: &'a str,
    name: &'a str,
}

/// Runs the mutating webhooks that match; they may change `obj`.
pub async fn mutate(
    state: &State,
    call: &Call,
    res: &Arc<ResourceInfo>,
    old: Option<&Value>,
    obj: &mut Value,
    operation: &str,
) -> ApiResult<()> {
    run(
        state,
        MUTATING,
        call,
        res,
        old,
        Target::Mutable(obj),
        operation,
    )
    .await
}

/// Runs the validating webhooks that match (they cannot change `obj`).
pub async fn validate(
    state: &State,
    call: &Call,
    res: &Arc<ResourceInfo>,
    old: Option<&Value>,
    obj: &Value,
    operation: &str,
) -> ApiResult<()> {
    run(
        state,
        VALIDATING,
        call,
        res,
        old,
        Target::Fixed(obj),
        operation,
    )
    .await
}

/// Runs the validating webhooks for a DELETE.
pub async fn validate_delete(
    state: &State,
    call: &Call,
    res: &Arc<ResourceInfo>,
    old: &Value,
) -> ApiResult<()> {
    run(
        state,
        VALIDATING,
        call,
        res,
        Some(old),
        Target::Absent,
        "DELETE",
    )
    .await
}

/// The object under admission: one mutating webhooks may patch, one validating webhooks only
/// read, or none (a DELETE).
enum Target<'a> {
    Mutable(&'a mut Value),
    Fixed(&'a Value),
    Absent,
}

impl Target<'_> {
    fn get(&self) -> Option<&Value> {
        match self {
            Target::Mutable(v) => Some(v),
            Target::Fixed(v) => Some(v),
            Target::Absent => None,
        }
    }
}

fn exempt(res: &ResourceInfo) -> bool {
    // As in kube, webhooks never intercept their own configurations (so a broken webhook can
    // always be removed), nor reviews.
    res.group == "admissionregistration.k8s.io" || !res.stored
}

async fn run(
    state: &State,
    key: &str,
    call: &Call,
    res: &Arc<ResourceInfo>,
    old: Option<&Value>,
    mut obj: Target<'_>,
    operation: &str,
) -> ApiResult<()> {
    if exempt(res) {
        return Ok(());
    }
    let (_, configs) = state.store.list(key, None, None);
    if configs.is_empty() {
        return Ok(());
    }
    let meta = |field: &str| -> Option<String> {
        let source = obj.get().or(old)?;
        source["metadata"][field].as_str().map(str::to_string)
    };
    let namespace = meta("namespace").unwrap_or_default();
    let name = meta("name").unwrap_or_else(|| call.info.name.clone());
    let req = Request {
        res,
        call,
        operation,
        namespace: &namespace,
        name: &name,
    };
    for config in configs {
        let config = state.webhooks.parsed(&config);
        for hook in config["webhooks"].as_array().into_iter().flatten() {
            if !matches(state, &req, hook, old, obj.get()) {
                continue;
            }
            let hook_name = hook["name"].as_str().unwrap_or("");
            let ignore = hook["failurePolicy"] == "Ignore";
            match call_hook(state, &req, hook, old, obj.get()).await {
                Ok(response) => {
                    if response["allowed"] != true {
                        let status = &response["status"];
                        let message = status["message"].as_str().unwrap_or("");
                        let code = status["code"].as_u64().unwrap_or(400) as u16;
                        return Err(ApiError {
                            code,
                            reason: if code == 403 {
                                "Forbidden"
                            } else {
                                "BadRequest"
                            },
                            message: format!(
                                "admission webhook \"{hook_name}\" denied the request: {message}"
                            ),
                            details: None,
                        });
                    }
                    // As in kube, only mutating webhooks' patches are applied (only they get
                    // a Mutable target).
                    if let (Some(patch), Target::Mutable(target)) =
                        (response["patch"].as_str(), &mut obj)
                    {
                        let patch: Value = base64::engine::general_purpose::STANDARD
                            .decode(patch)
                            .ok()
                            .and_then(|b| serde_json::from_slice(&b).ok())
                            .ok_or_else(|| ApiError::internal(format!("admission webhook \"{hook_name}\" returned an undecodable patch")))?;
                        **target = tandem_apimachinery::patch::json_patch(target, &patch).map_err(|e| {
                            ApiError::internal(format!("admission webhook \"{hook_name}\" returned a patch that does not apply: {e}"))
                        })?;
                    }
                }
                Err(e) if ignore => {
                    tracing::warn!(
                        webhook = hook_name,
                        "failed calling webhook, failing open (failurePolicy Ignore): {}",
                        with_causes(&e)
                    );
                }
                Err(e) => {
                    return Err(ApiError::internal(format!(
                        "failed calling webhook \"{hook_name}\": {}",
                        with_causes(&e)
                    )));
                }
            }
        }
    }
    Ok(())
}

fn list_has(list: &Value, want: &str) -> bool {
    list.as_array()
        .is_some_and(|l| l.iter().any(|v| v == "*" || v == want))
}

fn resource_matches(patterns: &Value, resource: &str, sub: &str) -> bool {
    patterns.as_array().is_some_and(|l| {
        l.iter().filter_map(Value::as_str).any(|p| {
            let (pr, ps) = p.split_once('/').unwrap_or((p, ""));
            (pr == "*" || pr == resource) && (ps == "*" || ps == sub)
        })
    })
}

fn matches(
    state: &State,
    req: &Request,
    hook: &Value,
    old: Option<&Value>,
    obj: Option<&Value>,
) -> bool {
    let res = req.res;
    let rule_match = hook["rules"].as_array().is_some_and(|rules| {
        rules.iter().any(|r| {
            let scope = r["scope"].as_str().unwrap_or("*");
            let scope_ok = scope == "*" || (scope == "Namespaced") == res.namespaced;
            list_has(&r["operations"], req.operation)
                && list_has(&r["apiGroups"], &res.group)
                && list_has(&r["apiVersions"], &res.version)
                && resource_matches(&r["resources"], &res.resource, &req.call.info.subresource)
                && scope_ok
        })
    });
    if !rule_match {
        return false;
    }
    let object_selector =
        LabelSelector::from_metav1(Some(hook.get("objectSelector").unwrap_or(&json!({}))))
            .unwrap_or_else(|_| LabelSelector::nothing());
    if !object_selector.is_everything()
        && !obj.is_some_and(|o| object_selector.matches_object(o))
        && !old.is_some_and(|o| object_selector.matches_object(o))
    {
        return false;
    }
    let ns_selector =
        LabelSelector::from_metav1(Some(hook.get("namespaceSelector").unwrap_or(&json!({}))))
            .unwrap_or_else(|_| LabelSelector::nothing());
    if ns_selector.is_everything() {
        return true;
    }
    if res.group.is_empty() && res.resource == "namespaces" {
        return obj.or(old).is_some_and(|o| ns_selector.matches_object(o));
    }
    if !res.namespaced {
        return true;
    }
    match state.store.get("/namespaces", "", req.namespace) {
        Some(ns) => ns_selector.matches(|k| ns.label(k)),
        None => false,
    }
}

async fn call_hook(
    state: &State,
    req: &Request<'_>,
    hook: &Value,
    old: Option<&Value>,
    obj: Option<&Value>,
) -> Result<Value, CallError> {
    let cc = &hook["clientConfig"];
    let target = match cc["url"].as_str() {
        Some(url) => HookTarget::Url(url.to_string()),
        None => HookTarget::Service(ServiceRef::of(&cc["service"])),
    };
    let url = target.url();
    let uid = uuid::Uuid::new_v4().to_string();
    let res = req.res;
    let gvk = json!({"group": res.group, "version": res.version, "kind": res.kind});
    let gvr = json!({"group": res.group, "version": res.version, "resource": res.resource});
    let subresource = &req.call.info.subresource;
    // Serialized from borrowed parts: the objects are not copied into a JSON tree first.
    let review = ReviewOut {
        api_version: "admission.k8s.io/v1",
        kind: "AdmissionReview",
        request: RequestOut {
            uid: &uid,
            kind: &gvk,
            resource: &gvr,
            request_kind: &gvk,
            request_resource: &gvr,
            sub_resource: (!subresource.is_empty()).then_some(subresource.as_str()),
            name: req.name,
            namespace: req.namespace,
            operation: req.operation,
            user_info: json!({"username": req.call.user.name, "groups": req.call.user.groups}),
            object: obj.unwrap_or(&Value::Null),
            old_object: old.unwrap_or(&Value::Null),
            dry_run: req.call.query.get("dryRun").is_some_and(|v| v == "All"),
        },
    };
    let review = serde_json::to_string(&review).map_err(CallError::Encode)?;
    let timeout = Duration::from_secs(hook["timeoutSeconds"].as_u64().unwrap_or(10).clamp(1, 30));
    let ca = cc["caBundle"]
        .as_str()
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok());
    let sent = async {
        let body = match &target {
            HookTarget::Url(url) => {
                post(&state.webhooks.client(ca.as_deref())?, url, review).await?
            }
            HookTarget::Service(svc) => {
                let addr = service_endpoint(state, svc).map_err(|source| CallError::Endpoint {
                    url: url.clone(),
                    source,
                })?;
                let dialer = state.kubelets.dialer.read().clone();
                post_to_service(svc, addr, dialer, ca.as_deref(), review).await?
            }
        };
        Ok::<_, CallError>(body)
    };
    let response = tokio::time::timeout(timeout, sent)
        .await
        .map_err(|_| CallError::Deadline { url: url.clone() })??;
    let review: Value =
        serde_json::from_slice(&response).map_err(|source| CallError::NotAReview {
            url: url.clone(),
            source,
        })?;
    let response = review["response"].clone();
    if response["uid"] != uid {
        return Err(CallError::Uid {
            url,
            expected: uid,
            got: response["uid"].clone(),
        });
    }
    Ok(response)
}

/// Why calling a webhook failed. Each message reads as kube-apiserver's once its causes are
/// appended (`error::with_causes`).
#[derive(Debug, thiserror::Error)]
enum CallError {
    /// The AdmissionReview could not be serialized.
    #[error("AdmissionReview")]
    Encode(#[source] serde_json::Error),
    /// The POST itself failed.
    #[error(transparent)]
    Webhook(#[from] WebhookError),
    /// The webhook's Service has no endpoint to POST to.
    #[error("Post {url:?}")]
    Endpoint {
        /// The URL the webhook is named by.
        url: String,
        /// Why no endpoint was found.
        #[source]
        source: EndpointError,
    },
    /// The webhook did not answer within its `timeoutSeconds`.
    #[error("Post {url:?}: context deadline exceeded")]
    Deadline {
        /// The URL the webhook is named by.
        url: String,
    },
    /// The answer is not an AdmissionReview.
    #[error("Post {url:?}: response is not an AdmissionReview")]
    NotAReview {
        /// The URL the webhook is named by.
        url: String,
        /// Why the answer does not parse.
        #[source]
        source: serde_json::Error,
    },
    /// The answer is for another request.
    #[error("Post {url:?}: expected response.uid={expected:?}, got {got}")]
    Uid {
        /// The URL the webhook is named by.
        url: String,
        /// The uid of the request sent.
        expected: String,
        /// The `response.uid` answered.
        got: Value,
    },
}

/// Why a webhook Service has no endpoint to call; messages read as kube-apiserver's.
#[derive(Debug, thiserror::Error)]
enum EndpointError {
    /// The Service does not exist.
    #[error("service \"{namespace}/{name}\" not found")]
    ServiceNotFound {
        /// The Service's namespace.
        namespace: String,
        /// The Service's name.
        name: String,
    },
    /// The Service has no port numbered as the webhook's.
    #[error("service \"{namespace}/{name}\" has no port {port}")]
    PortNotFound {
        /// The Service's namespace.
        namespace: String,
        /// The Service's name.
        name: String,
        /// The webhook's port.
        port: u16,
    },
    /// No EndpointSlice of the Service lists a ready address for the port.
    #[error("no endpoints available for service \"{name}\"")]
    NoEndpoints {
        /// The Service's name.
        name: String,
    },
}

/// An AdmissionReview v1 request, as sent.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct ReviewOut<'a> {
    api_version: &'static str,
    kind: &'static str,
    request: RequestOut<'a>,
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct RequestOut<'a> {
    uid: &'a str,
    kind: &'a Value,
    resource: &'a Value,
    request_kind: &'a Value,
    request_resource: &'a Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    sub_resource: Option<&'a str>,
    name: &'a str,
    namespace: &'a str,
    operation: &'a str,
    user_info: Value,
    object: &'a Value,
    old_object: &'a Value,
    dry_run: bool,
}

/// Where a webhook's `clientConfig` sends its reviews.
enum HookTarget {
    Url(String),
    Service(ServiceRef),
}

impl HookTarget {
    /// The URL errors name: the Service's as kube-apiserver names it
    /// (`https://<name>.<namespace>.svc:<port><path>`).
    fn url(&self) -> String {
        match self {
            HookTarget::Url(url) => url.clone(),
            HookTarget::Service(s) => s.url(),
        }
    }
}

/// A ready endpoint of Service `svc` for its port, from its EndpointSlices — as
/// kube-apiserver does with `--enable-aggregator-routing` (a lab's API server is not on a
/// node, so it does not go through the ClusterIP). Errors read as kube-apiserver's.
fn service_endpoint(
    state: &State,
    svc: &ServiceRef,
) -> Result<std::net::SocketAddr, EndpointError> {
    let (ns, name) = (svc.namespace.as_str(), svc.name.as_str());
    let Some(service) = state.store.get("/services", ns, name) else {
        return Err(EndpointError::ServiceNotFound {
            namespace: ns.to_string(),
            name: name.to_string(),
        });
    };
    let port_name = service.value()["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["port"].as_u64() == Some(u64::from(svc.port)))
        .map(|p| p["name"].as_str().unwrap_or("").to_string())
        .ok_or_else(|| EndpointError::PortNotFound {
            namespace: ns.to_string(),
            name: name.to_string(),
            port: svc.port,
        })?;
    let (_, slices) = state
        .store
        .list("discovery.k8s.io/endpointslices", Some(ns), None);
    let mut ready = Vec::new();
    for slice in slices
        .iter()
        .filter(|s| s.label("kubernetes.io/service-name") == Some(name))
    {
        let slice = slice.value();
        let Some(port) = slice["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"].as_str().unwrap_or("") == port_name)
            .and_then(|p| p["port"].as_u64())
            .and_then(|p| u16::try_from(p).ok())
        else {
            continue;
        };
        for endpoint in slice["endpoints"].as_array().into_iter().flatten() {
            // Ready unless said otherwise, as EndpointSlice consumers read it.
            if endpoint["conditions"]["ready"] == json!(false) {
                continue;
            }
            for address in endpoint["addresses"].as_array().into_iter().flatten() {
                if let Some(ip) = address.as_str().and_then(|a| a.parse().ok()) {
                    ready.push(std::net::SocketAddr::new(ip, port));
                }
            }
        }
    }
    use rand::seq::IndexedRandom;
    ready
        .choose(&mut rand::rng())
        .copied()
        .ok_or_else(|| EndpointError::NoEndpoints {
            name: name.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_patterns_like_kube() {
        let cases = [
            (json!(["pods"]), "pods", "", true),
            (json!(["pods"]), "pods", "status", false),
            (json!(["pods/status"]), "pods", "status", true),
            (json!(["pods/*"]), "pods", "status", true),
            (json!(["pods/*"]), "pods", "", true),
            (json!(["*"]), "deployments", "", true),
            (json!(["*"]), "deployments", "scale", false),
            (json!(["*/*"]), "deployments", "scale", true),
            (json!(["*/scale"]), "deployments", "scale", true),
            (json!(["services"]), "pods", "", false),
        ];
        for (patterns, resource, sub, want) in cases {
            assert_eq!(
                resource_matches(&patterns, resource, sub),
                want,
                "{patterns} {resource}/{sub}"
            );
        }
    }
}
