//! Authorization: whether RBAC lets a user make a request, and the 403 when it does not.

use tandem_apimachinery::rbac::{Attributes, Decision, UserInfo, forbidden_message};

use crate::error::{ApiError, ApiResult};
use crate::request::RequestInfo;
use crate::state::State;

/// Whether RBAC allows `attrs` for `user` (members of system:masters always may).
pub fn allowed(state: &State, user: &UserInfo, attrs: &Attributes) -> bool {
    user.groups.iter().any(|g| g == "system:masters")
        || matches!(state.rbac.read().authorize(user, attrs), Decision::Allow(_))
}

/// Refuses a request RBAC does not allow, with the 403 kube-apiserver sends.
pub fn authorize(state: &State, user: &UserInfo, info: &RequestInfo) -> ApiResult<()> {
    let attrs = Attributes {
        verb: &info.verb,
        namespace: &info.namespace,
        api_group: &info.group,
        resource: &info.resource,
        subresource: &info.subresource,
        name: &info.name,
        path: &info.path,
        resource_request: info.resource_request,
    };
    if allowed(state, user, &attrs) {
        return Ok(());
    }
    let why = forbidden_message(user, &attrs);
    Err(if info.resource_request {
        let resource = if info.subresource.is_empty() {
            info.resource.clone()
        } else {
            format!("{}/{}", info.resource, info.subresource)
        };
        ApiError::forbidden(&info.group, &resource, &info.name, &why)
    } else {
        ApiError::forbidden_path(&why)
    })
}
