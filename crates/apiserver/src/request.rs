//! What a request asks for, parsed from its method, path and query like kube-apiserver's
//! RequestInfoFactory does, and the authenticated call the handlers receive.

use std::collections::HashMap;

use bytes::Bytes;
use http::HeaderMap;
use tandem_apimachinery::rbac::UserInfo;

/// A parsed API request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestInfo {
    /// Whether the path names a resource (as opposed to /version, /api, /openapi/…).
    pub resource_request: bool,
    /// The raw path.
    pub path: String,
    /// Kubernetes verb: get, list, watch, create, update, patch, delete, deletecollection.
    pub verb: String,
    /// API group ("" for core).
    pub group: String,
    /// API version.
    pub version: String,
    /// Namespace from the path ("" for cluster scope).
    pub namespace: String,
    /// Resource (plural).
    pub resource: String,
    /// Object name, if the path names one.
    pub name: String,
    /// Subresource, if any.
    pub subresource: String,
    /// Number of path segments after the group/version (to tell collection from object).
    pub parts: usize,
}

/// Decoded query parameters.
pub type Query = HashMap<String, String>;

/// Decodes a query string.
pub fn parse_query(query: Option<&str>) -> Query {
    query
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default()
}

/// Parses method + path + query into a RequestInfo.
pub fn parse(method: &http::Method, path: &str, query: &Query) -> RequestInfo {
    let mut info = RequestInfo {
        path: path.to_string(),
        verb: method.as_str().to_lowercase(),
        ..Default::default()
    };
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest: &[&str] = match segments.as_slice() {
        ["api", version, rest @ ..] if !rest.is_empty() => {
            info.version = version.to_string();
            rest
        }
        ["apis", group, version, rest @ ..] if !rest.is_empty() => {
            info.group = group.to_string();
            info.version = version.to_string();
            rest
        }
        _ => return info,
    };
    info.resource_request = true;
    let mut parts: Vec<&str> = rest.to_vec();
    let mut legacy_watch = false;
    if parts.first() == Some(&"watch") {
        legacy_watch = true;
        parts.remove(0);
    }
    if parts.first() == Some(&"namespaces") && parts.len() > 1 {
        info.namespace = parts[1].to_string();
        if parts.len() > 2 && !matches!(parts[2], "status" | "finalize") {
            parts.drain(..2);
        }
    }
    info.parts = parts.len();
    info.resource = parts.first().copied().unwrap_or_default().to_string();
    info.name = parts.get(1).copied().unwrap_or_default().to_string();
    info.subresource = parts.get(2).copied().unwrap_or_default().to_string();
    info.verb = match (method.as_str(), info.name.is_empty()) {
        ("GET" | "HEAD", true) => {
            if legacy_watch || is_true(query.get("watch")) {
                "watch"
            } else {
                "list"
            }
        }
        ("GET" | "HEAD", false) => {
            if legacy_watch || is_true(query.get("watch")) {
                "watch"
            } else {
                "get"
            }
        }
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "deletecollection",
        ("DELETE", false) => "delete",
        (other, _) => {
            return RequestInfo {
                verb: other.to_lowercase(),
                ..info
            };
        }
    }
    .to_string();
    // A list or watch of one object by a name field selector is authorised by its name, as
    // kube-apiserver's RequestInfoFactory does: RBAC rules with resourceNames then allow it.
    if info.name.is_empty()
        && matches!(info.verb.as_str(), "list" | "watch")
        && let Some(name) = query.get("fieldSelector").and_then(|f| exact_name(f))
    {
        info.name = name;
    }
    info
}

/// The name a field selector requires (an `=`/`==` term on `metadata.name`), read by the same
/// parser the list filter uses (escapes, sorted terms), as kube-apiserver's `RequiresExactMatch`
/// does; none when it does not parse or the name is not a valid path segment.
fn exact_name(selector: &str) -> Option<String> {
    use tandem_apimachinery::selector::{FieldOp, FieldSelector};
    let parsed = FieldSelector::parse(selector).ok()?;
    let name = parsed
        .requirements()
        .iter()
        .find(|r| r.field == "metadata.name" && r.op == FieldOp::Equals)?
        .value
        .clone();
    let valid = !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '%']);
    valid.then_some(name)
}

/// "true" or "1".
pub fn is_true(v: Option<&String>) -> bool {
    matches!(v.map(String::as_str), Some("true" | "1"))
}

/// One request in flight, after authentication.
pub struct Call {
    /// The parsed request.
    pub info: RequestInfo,
    /// Query parameters.
    pub query: Query,
    /// Headers.
    pub headers: HeaderMap,
    /// The authenticated (and possibly impersonated) user.
    pub user: UserInfo,
    /// The request body.
    pub body: Bytes,
}

impl Call {
    /// The request's Content-Type (JSON when absent).
    pub fn content_type(&self) -> &str {
        self.headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/json")
    }
}

/// Whether the request asks for a dry run (`dryRun=All`).
pub fn is_dry_run(call: &Call) -> bool {
    call.query.get("dryRun").is_some_and(|v| v == "All")
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    #[test]
    fn a_list_or_watch_by_name_field_selector_names_its_object() {
        let info = |query: &[(&str, &str)]| {
            let q: Query = query
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let info = parse(&Method::GET, "/api/v1/namespaces/a/configmaps", &q);
            (info.verb, info.name)
        };
        let named = |verb: &str, name: &str| (verb.to_string(), name.to_string());
        assert_eq!(
            info(&[("fieldSelector", "metadata.name=x")]),
            named("list", "x")
        );
        assert_eq!(
            info(&[
                ("fieldSelector", "metadata.name==x,metadata.namespace=a"),
                ("watch", "true")
            ]),
            named("watch", "x")
        );
        // Not an exact match of a valid name: the request stays unnamed (any name).
        assert_eq!(
            info(&[("fieldSelector", "metadata.name!=x")]),
            named("list", "")
        );
        assert_eq!(
            info(&[("fieldSelector", "metadata.name=a/b")]),
            named("list", "")
        );
        assert_eq!(
            info(&[("fieldSelector", "metadata.namespace=a")]),
            named("list", "")
        );
        // An escaped comma is part of a value, not a second term: this selects every object
        // but one, so it must not be authorised as a list of `x` alone.
        assert_eq!(
            info(&[("fieldSelector", r"metadata.name!=y\,metadata.name=x")]),
            named("list", "")
        );
    }

    #[test]
    fn parses_like_kube_apiserver() {
        let q = Query::new();
        let mut watch = Query::new();
        watch.insert("watch".into(), "true".into());
        // method, path, query => verb, group, namespace, resource, name, subresource
        type Case<'a> = (
            &'a Method,
            &'a str,
            &'a Query,
            &'a str,
            &'a str,
            &'a str,
            &'a str,
            &'a str,
            &'a str,
        );
        let cases: &[Case] = &[
            (
                &Method::GET,
                "/api/v1/pods",
                &q,
                "list",
                "",
                "",
                "pods",
                "",
                "",
            ),
            (
                &Method::GET,
                "/api/v1/pods",
                &watch,
                "watch",
                "",
                "",
                "pods",
                "",
                "",
            ),
            (
                &Method::GET,
                "/api/v1/watch/namespaces/a/pods",
                &q,
                "watch",
                "",
                "a",
                "pods",
                "",
                "",
            ),
            (
                &Method::GET,
                "/api/v1/namespaces/a/pods/p",
                &q,
                "get",
                "",
                "a",
                "pods",
                "p",
                "",
            ),
            (
                &Method::PUT,
                "/api/v1/namespaces/a/pods/p/status",
                &q,
                "update",
                "",
                "a",
                "pods",
                "p",
                "status",
            ),
            (
                &Method::GET,
                "/api/v1/namespaces",
                &q,
                "list",
                "",
                "",
                "namespaces",
                "",
                "",
            ),
            (
                &Method::GET,
                "/api/v1/namespaces/a",
                &q,
                "get",
                "",
                "a",
                "namespaces",
                "a",
                "",
            ),
            (
                &Method::PUT,
                "/api/v1/namespaces/a/finalize",
                &q,
                "update",
                "",
                "a",
                "namespaces",
                "a",
                "finalize",
            ),
            (
                &Method::DELETE,
                "/apis/apps/v1/namespaces/a/deployments",
                &q,
                "deletecollection",
                "apps",
                "a",
                "deployments",
                "",
                "",
            ),
            (
                &Method::DELETE,
                "/apis/apps/v1/namespaces/a/deployments/d",
                &q,
                "delete",
                "apps",
                "a",
                "deployments",
                "d",
                "",
            ),
            (
                &Method::PATCH,
                "/apis/apps/v1/namespaces/a/deployments/d/scale",
                &q,
                "patch",
                "apps",
                "a",
                "deployments",
                "d",
                "scale",
            ),
            (
                &Method::POST,
                "/apis/rbac.authorization.k8s.io/v1/clusterroles",
                &q,
                "create",
                "rbac.authorization.k8s.io",
                "",
                "clusterroles",
                "",
                "",
            ),
        ];
        for (method, path, query, verb, group, ns, resource, name, sub) in cases {
            let info = parse(method, path, query);
            assert!(info.resource_request, "{path}");
            assert_eq!(
                (
                    info.verb.as_str(),
                    info.group.as_str(),
                    info.namespace.as_str(),
                    info.resource.as_str(),
                    info.name.as_str(),
                    info.subresource.as_str()
                ),
                (*verb, *group, *ns, *resource, *name, *sub),
                "{method} {path}"
            );
        }
        for path in [
            "/version",
            "/api",
            "/apis",
            "/apis/apps",
            "/openapi/v2",
            "/healthz",
        ] {
            assert!(!parse(&Method::GET, path, &q).resource_request, "{path}");
        }
    }
}
