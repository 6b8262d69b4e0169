//! Non-resource endpoints: /version, discovery (/api, /apis, group and group/version
//! resource lists), OpenAPI, and health checks.

use http::{Method, Response};
use serde_json::{Value, json};

use crate::error::{ApiError, ApiResult};
use crate::registry::{Registry, ResourceInfo};
use crate::request::Call;
use crate::response::{Body, json_response};
use crate::state::State;
use crate::version::KUBE_VERSION;

/// Serves a non-resource path.
pub fn non_resource(state: &State, call: &Call, method: &Method) -> ApiResult<Response<Body>> {
    if method != Method::GET && method != Method::HEAD {
        return Err(ApiError::method_not_allowed(
            method.as_str(),
            &call.info.path,
        ));
    }
    let path = call.info.path.trim_end_matches('/');
    let registry = state.registry.read();
    let body = match path {
        "/version" => json!({
            "major": KUBE_VERSION.0, "minor": KUBE_VERSION.1,
            "gitVersion": format!("v{}.{}.0-tandem.{}", KUBE_VERSION.0, KUBE_VERSION.1, env!("CARGO_PKG_VERSION")),
            "gitCommit": "", "gitTreeState": "clean", "buildDate": "1970-01-01T00:00:00Z",
            "goVersion": "n/a", "compiler": "rustc", "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
        }),
        "/healthz" | "/livez" | "/readyz" => {
            return Ok(Response::builder()
                .status(200)
                .header(http::header::CONTENT_TYPE, "text/plain")
                .body(http_body_util::BodyExt::boxed(
                    http_body_util::BodyExt::map_err(
                        http_body_util::Full::new(bytes::Bytes::from_static(b"ok")),
                        |e| match e {},
                    ),
                ))
                .expect("valid response"));
        }
        "/api" => json!({"kind": "APIVersions", "versions": ["v1"],
                         "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}),
        "/apis" => json!({"kind": "APIGroupList", "apiVersion": "v1",
                          "groups": registry.groups().iter().filter(|(g, _)| !g.is_empty()).map(|(g, v)| group_json(g, v)).collect::<Vec<_>>()}),
        "/openapi/v2" if crate::openapi::wants_v2_protobuf(&call.headers) => {
            let mut response = crate::response::bytes_response(
                200,
                bytes::Bytes::from(crate::openapi::v2_protobuf()),
            );
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static(crate::openapi::V2_PROTOBUF_CONTENT_TYPE),
            );
            return Ok(response);
        }
        "/openapi/v2" => crate::openapi::v2(&registry),
        "/openapi/v3" => crate::openapi::v3_index(&registry),
        p if p.starts_with("/openapi/v3/") => {
            let gv = p.trim_start_matches("/openapi/v3/");
            crate::openapi::v3_group_version(&registry, gv).ok_or_else(ApiError::no_route)?
        }
        p => {
            let parts: Vec<&str> = p.trim_start_matches('/').split('/').collect();
            match parts.as_slice() {
                ["api", "v1"] => resource_list(&registry, "", "v1"),
                ["apis", group] => {
                    let versions = registry
                        .groups()
                        .into_iter()
                        .find(|(g, _)| g == group)
                        .ok_or_else(ApiError::no_route)?;
                    let mut body = group_json(&versions.0, &versions.1);
                    body["apiVersion"] = json!("v1");
                    body
                }
                ["apis", group, version] => {
                    if registry.resources_at(group, version).is_empty() {
                        return Err(ApiError::no_route());
                    }
                    resource_list(&registry, group, version)
                }
                _ => return Err(ApiError::no_route()),
            }
        }
    };
    Ok(json_response(200, &body))
}

fn group_json(group: &str, versions: &[String]) -> Value {
    let gv = |v: &String| json!({"groupVersion": format!("{group}/{v}"), "version": v});
    json!({
        "kind": "APIGroup", "name": group,
        "versions": versions.iter().map(gv).collect::<Vec<_>>(),
        "preferredVersion": versions.first().map(gv).unwrap_or(Value::Null),
    })
}

/// The kind, group and version a subresource's endpoint takes and returns.
fn subresource_kind(
    res: &ResourceInfo,
    sub: &str,
) -> (String, &'static str, &'static str, &'static [&'static str]) {
    match sub {
        "status" => (res.kind.clone(), "", "", &["get", "patch", "update"]),
        "scale" => (
            "Scale".into(),
            "autoscaling",
            "v1",
            &["get", "patch", "update"],
        ),
        "binding" => ("Binding".into(), "", "", &["create"]),
        "eviction" => ("Eviction".into(), "policy", "v1", &["create"]),
        "token" => (
            "TokenRequest".into(),
            "authentication.k8s.io",
            "v1",
            &["create"],
        ),
        "approval" => (res.kind.clone(), "", "", &["get", "patch", "update"]),
        "finalize" => (res.kind.clone(), "", "", &["update"]),
        _ => (res.kind.clone(), "", "", &["get"]),
    }
}

fn resource_list(registry: &Registry, group: &str, version: &str) -> Value {
    let mut resources = Vec::new();
    for res in registry.resources_at(group, version) {
        let mut entry = json!({
            "name": res.resource, "singularName": res.singular, "namespaced": res.namespaced,
            "kind": res.kind, "verbs": res.verbs,
        });
        if !res.short_names.is_empty() {
            entry["shortNames"] = json!(res.short_names);
        }
        if !res.categories.is_empty() {
            entry["categories"] = json!(res.categories);
        }
        resources.push(entry);
        for sub in &res.subresources {
            let (kind, g, v, verbs) = subresource_kind(&res, sub);
            let mut entry = json!({"name": format!("{}/{sub}", res.resource), "singularName": "", "namespaced": res.namespaced, "kind": kind, "verbs": verbs});
            if !g.is_empty() || !v.is_empty() {
                entry["group"] = json!(g);
                entry["version"] = json!(v);
            }
            resources.push(entry);
        }
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources})
}
