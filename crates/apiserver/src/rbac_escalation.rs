//! RBAC's escalation check on bindings, as kube's RoleBinding and ClusterRoleBinding registry
//! strategies make it whatever the authorizer allowed: a user may write a binding only when it
//! may `bind` the role the binding references, or already holds every permission that role
//! grants where the binding applies (`ConfirmNoEscalation`). Without it, anyone allowed to
//! create RoleBindings could bind itself, or anyone, to `cluster-admin`.

use serde_json::Value;
use tandem_apimachinery::rbac::Attributes;

use crate::error::{ApiError, ApiResult};
use crate::registry::ResourceInfo;
use crate::request::Call;
use crate::state::State;

const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// Refuses a RoleBinding or ClusterRoleBinding `obj` that would grant `call`'s user more than
/// it holds, unless it may `bind` the role.
pub fn admit(state: &State, call: &Call, res: &ResourceInfo, obj: &Value) -> ApiResult<()> {
    let binding = matches!(
        res.resource.as_str(),
        "rolebindings" | "clusterrolebindings"
    );
    if res.group != RBAC_GROUP || !binding || !call.info.subresource.is_empty() {
        return Ok(());
    }
    let namespace = obj["metadata"]["namespace"].as_str().unwrap_or_default();
    let kind = obj["roleRef"]["kind"].as_str().unwrap_or_default();
    let role = obj["roleRef"]["name"].as_str().unwrap_or_default();
    let bind = Attributes {
        verb: "bind",
        namespace,
        api_group: RBAC_GROUP,
        resource: if kind == "Role" {
            "roles"
        } else {
            "clusterroles"
        },
        subresource: "",
        name: role,
        path: "",
        resource_request: true,
    };
    if crate::authz::allowed(state, &call.user, &bind) {
        return Ok(());
    }
    let missing = {
        let index = state.rbac.read();
        let rules = index.bound_rules(namespace, kind, role);
        index.missing_rules(&call.user, namespace, &rules)
    };
    if missing.is_empty() {
        return Ok(());
    }
    let held: Vec<String> = missing.iter().map(Value::to_string).collect();
    Err(ApiError::forbidden(
        RBAC_GROUP,
        &res.resource,
        obj["metadata"]["name"].as_str().unwrap_or_default(),
        &format!(
            "user {:?} (groups={:?}) is attempting to grant RBAC permissions not currently held:\n{}",
            call.user.name,
            call.user.groups,
            held.join("\n")
        ),
    ))
}
