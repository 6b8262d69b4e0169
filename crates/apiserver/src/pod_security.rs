//! Pod Security admission, as kube-apiserver's built-in plugin enforces it: a pod created in a
//! namespace labelled `pod-security.kubernetes.io/enforce: baseline|restricted` is refused
//! (403) when it violates that level of the Pod Security Standards
//! (`tandem_apimachinery::pod_security`). Only `enforce` is modelled: `audit` and `warn` change
//! nothing a client relies on. Pod updates cannot change the fields the standards check (they
//! are immutable), so only creates are checked.

use serde_json::Value;
use tandem_apimachinery::pod_security::{ENFORCE_LABEL, Level, check};

use crate::error::{ApiError, ApiResult};
use crate::registry::ResourceInfo;
use crate::state::State;

/// Refuses a pod its namespace's enforced level does not admit.
pub fn admit(state: &State, res: &ResourceInfo, obj: &Value, operation: &str) -> ApiResult<()> {
    if operation != "CREATE" || !res.group.is_empty() || res.resource != "pods" {
        return Ok(());
    }
    let namespace = obj["metadata"]["namespace"].as_str().unwrap_or_default();
    let Some(level) = state
        .store
        .get("/namespaces", "", namespace)
        .and_then(|ns| ns.label(ENFORCE_LABEL).and_then(Level::parse))
    else {
        return Ok(());
    };
    check(&obj["metadata"]["annotations"], &obj["spec"], level).map_err(|v| {
        ApiError::forbidden(
            "",
            "pods",
            obj["metadata"]["name"].as_str().unwrap_or_default(),
            &format!("violates PodSecurity \"{}:latest\": {v}", level.as_str()),
        )
    })
}
