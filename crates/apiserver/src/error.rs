//! API errors, rendered as metav1.Status with the reason and code kube-apiserver uses.

use serde_json::{Value, json};

/// One failed request: HTTP code, Status reason, message and optional details.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// metav1.StatusReason, e.g. `NotFound`.
    pub reason: &'static str,
    /// Human readable message, worded like kube-apiserver's.
    pub message: String,
    /// metav1.StatusDetails, if any.
    pub details: Option<Value>,
}

/// Result type of request handlers.
pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, group: &str, kind: &str, name: &str) -> Self {
        let mut details = json!({"kind": kind});
        if !name.is_empty() {
            details["name"] = json!(name);
        }
        if !group.is_empty() {
            details["group"] = json!(group);
        }
        self.details = Some(details);
        self
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 401 Unauthorized.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// 403 Forbidden from the authorizer.
    pub fn forbidden(group: &str, resource: &str, name: &str, why: &str) -> Self {
        let what = qualified(group, resource);
        let message = if name.is_empty() {
            format!("{what} is forbidden: {why}")
        } else {
            format!("{what} \"{name}\" is forbidden: {why}")
        };
        Self::new(403, "Forbidden", message).with_details(group, resource, name)
    }

    /// 403 for a non-resource URL.
    pub fn forbidden_path(why: &str) -> Self {
        Self::new(403, "Forbidden", format!("forbidden: {why}"))
    }

    /// 404 NotFound for an object.
    pub fn not_found(group: &str, resource: &str, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(group, resource)),
        )
        .with_details(group, resource, name)
    }

    /// 404 for a path the server does not serve.
    pub fn no_route() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    /// 405 MethodNotAllowed.
    pub fn method_not_allowed(verb: &str, resource: &str) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!("{verb} is not supported on resources of kind \"{resource}\""),
        )
    }

    /// 409 AlreadyExists.
    pub fn already_exists(group: &str, resource: &str, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(group, resource)),
        )
        .with_details(group, resource, name)
    }

    /// 409 Conflict on a stale resourceVersion or failed precondition.
    pub fn conflict(group: &str, resource: &str, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                qualified(group, resource)
            ),
        )
        .with_details(group, resource, name)
    }

    /// 409 Conflict after a write lost its optimistic-concurrency race on every retry.
    pub fn too_many_writers(group: &str, resource: &str, name: &str) -> Self {
        Self::conflict(
            group,
            resource,
            name,
            "too many concurrent writers, try again",
        )
    }

    /// 409 Conflict with a free-form message (server-side apply conflicts).
    pub fn conflict_message(message: impl Into<String>) -> Self {
        Self::new(409, "Conflict", message)
    }

    /// 410 Expired: a resourceVersion or continue token older than the retained window.
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 415 UnsupportedMediaType.
    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml (got {content_type:?})"
            ),
        )
    }

    /// 422 Invalid, with one cause per field error: (reason, field, message). A message
    /// may start with its field (`spec.x: Required value`); causes carry it without, as kube's do.
    pub fn invalid(
        group: &str,
        kind: &str,
        name: &str,
        causes: Vec<(String, String, String)>,
    ) -> Self {
        let summary: Vec<&str> = causes.iter().map(|(_, _, m)| m.as_str()).collect();
        let what = qualified(group, kind);
        let message = match summary.as_slice() {
            [one] => format!("{what} \"{name}\" is invalid: {one}"),
            many => format!("{what} \"{name}\" is invalid: [{}]", many.join(", ")),
        };
        let mut err = Self::new(422, "Invalid", message).with_details(group, kind, name);
        if let Some(details) = err.details.as_mut() {
            details["causes"] = causes
                .iter()
                .map(|(reason, field, message)| {
                    let bare = message
                        .strip_prefix(field.as_str())
                        .and_then(|m| m.strip_prefix(": "))
                        .unwrap_or(message);
                    json!({"reason": reason, "message": bare, "field": field})
                })
                .collect();
        }
        err
    }

    /// 422 Invalid with one field error, the common case.
    pub fn invalid_field(group: &str, kind: &str, name: &str, field: &str, message: &str) -> Self {
        Self::invalid(
            group,
            kind,
            name,
            vec![(
                "FieldValueInvalid".into(),
                field.into(),
                format!("{field}: {message}"),
            )],
        )
    }

    /// 422 Invalid without field causes (a JSON patch that does not apply).
    pub fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }

    /// 429 TooManyRequests (an eviction blocked by a disruption budget, for instance).
    pub fn too_many_requests(message: impl Into<String>) -> Self {
        Self::new(429, "TooManyRequests", message)
    }

    /// 500 InternalError.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {}", message.into()),
        )
    }

    /// What a kubelet answered with `code` and `message` (its errors are plain text), as
    /// kube-apiserver passes them on.
    pub fn from_kubelet(code: u16, message: String) -> Self {
        match code {
            400 => Self::new(400, "BadRequest", message),
            401 | 403 => Self::new(code, "Forbidden", format!("the kubelet refused: {message}")),
            404 => Self::new(404, "NotFound", message),
            _ => Self::internal(message),
        }
    }

    /// 504 Timeout.
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(504, "Timeout", message)
    }

    /// The metav1.Status body.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

/// `resource.group`, or just `resource` for the core group: how kube names a resource in messages.
pub fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

/// `error` followed by each of its causes, joined by `: ` as Go's wrapped errors read.
pub(crate) fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
