//! OpenAPI documents, enough for kubectl's apply, diff and explain.
//!
//! What is served: `/openapi/v3` lists one document per group/version; each names every
//! kind with `x-kubernetes-group-version-kind`, and its paths declare the `fieldValidation`
//! parameter so kubectl leaves validation to the server. Custom resources carry their CRD
//! schema; built-in kinds an open object schema (apiVersion, kind, metadata, spec, status), so
//! `kubectl explain` describes their top level only. `/openapi/v2` carries the same
//! definitions in Swagger 2.0 form for older clients.

use serde_json::{Map, Value, json};

use crate::registry::{Registry, ResourceInfo};
use crate::version::KUBE_VERSION;

fn definition_name(res: &ResourceInfo) -> String {
    let group = if res.group.is_empty() {
        "io.k8s.api.core".to_string()
    } else if res.custom.is_some() {
        res.group.split('.').rev().collect::<Vec<_>>().join(".")
    } else {
        format!(
            "io.k8s.api.{}",
            res.group.split('.').next().unwrap_or(&res.group)
        )
    };
    format!("{group}.{}.{}", res.version, res.kind)
}

fn gvk(res: &ResourceInfo) -> Value {
    json!([{"group": res.group, "version": res.version, "kind": res.kind}])
}

fn schema_of(res: &ResourceInfo) -> Value {
    let mut schema = match res.custom.as_ref().and_then(|c| c.schema.clone()) {
        Some(s) => s,
        None => {
            let open = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
            json!({
                "type": "object",
                "description": format!("{} is a Kubernetes {} object.", res.kind, res.api_version()),
                "properties": {
                    "apiVersion": {"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."},
                    "kind": {"type": "string", "description": "Kind is a string value representing the REST resource this object represents."},
                    "metadata": {"type": "object", "description": "Standard object's metadata.", "x-kubernetes-preserve-unknown-fields": true},
                    "spec": open.clone(),
                    "status": open,
                },
            })
        }
    };
    schema["x-kubernetes-group-version-kind"] = gvk(res);
    schema
}

fn operations(res: &ResourceInfo) -> Value {
    let params = json!([
        {"name": "dryRun", "in": "query", "schema": {"type": "string"}},
        {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
        {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
    ]);
    let op = |action: &str| {
        json!({
            "operationId": format!("{action}{}", res.kind),
            "parameters": params,
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": gvk(res)[0],
            "responses": {"200": {"description": "OK"}},
        })
    };
    json!({"get": op("get"), "put": op("put"), "patch": op("patch"), "delete": op("delete"), "post": op("post")})
}

fn path_of(res: &ResourceInfo) -> String {
    let prefix = if res.group.is_empty() {
        "/api/v1".to_string()
    } else {
        format!("/apis/{}/{}", res.group, res.version)
    };
    if res.namespaced {
        format!(
            "{prefix}/namespaces/{{namespace}}/{}/{{name}}",
            res.resource
        )
    } else {
        format!("{prefix}/{}/{{name}}", res.resource)
    }
}

/// `/openapi/v3`: the index of group/version documents.
pub fn v3_index(registry: &Registry) -> Value {
    let mut paths = Map::new();
    for (group, versions) in registry.groups() {
        for version in versions {
            let gv = if group.is_empty() {
                format!("api/{version}")
            } else {
                format!("apis/{group}/{version}")
            };
            let url = format!("/openapi/v3/{gv}?hash={}", hash(registry, &group, &version));
            paths.insert(gv, json!({"serverRelativeURL": url}));
        }
    }
    json!({"paths": paths})
}

fn hash(registry: &Registry, group: &str, version: &str) -> String {
    use sha2::Digest;
    let doc = document(registry, group, version);
    let digest = sha2::Sha512::digest(doc.to_string().as_bytes());
    digest.iter().take(32).map(|b| format!("{b:02X}")).collect()
}

fn document(registry: &Registry, group: &str, version: &str) -> Value {
    let mut schemas = Map::new();
    let mut paths = Map::new();
    for res in registry.resources_at(group, version) {
        if !res.stored {
            continue;
        }
        schemas.insert(definition_name(&res), schema_of(&res));
        paths.insert(path_of(&res), operations(&res));
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": format!("v{}.{}.0", KUBE_VERSION.0, KUBE_VERSION.1)},
        "paths": paths,
        "components": {"schemas": schemas},
    })
}

/// `/openapi/v3/<api|apis/group>/<version>`.
pub fn v3_group_version(registry: &Registry, gv: &str) -> Option<Value> {
    let (group, version) = match gv.split('/').collect::<Vec<_>>().as_slice() {
        ["api", v] => (String::new(), v.to_string()),
        ["apis", g, v] => (g.to_string(), v.to_string()),
        _ => return None,
    };
    if registry.resources_at(&group, &version).is_empty() {
        return None;
    }
    Some(document(registry, &group, &version))
}

/// What kubectl's discovery client asks `/openapi/v2` for (client-go's `openAPIV2mimePb`).
const V2_PROTOBUF_ACCEPT: &str = "application/com.github.proto-openapi.spec.v2";

/// The content type kube-apiserver answers that request with.
pub const V2_PROTOBUF_CONTENT_TYPE: &str =
    "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

/// Whether the client asks for `/openapi/v2` in protobuf (gnostic's encoding) — kubectl does,
/// and only that: it reads the JSON form as invalid protobuf.
pub fn wants_v2_protobuf(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains(V2_PROTOBUF_ACCEPT))
}

/// gnostic's `openapi.v2.Document`, the fields written here (OpenAPIv2.proto in
/// google/gnostic-models). Only these two messages are needed, so they are declared with
/// prost's derive instead of pulling in a generated copy of the whole schema.
#[derive(Clone, PartialEq, prost::Message)]
struct V2Document {
    #[prost(string, tag = "1")]
    swagger: String,
    #[prost(message, optional, tag = "2")]
    info: Option<V2Info>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct V2Info {
    #[prost(string, tag = "1")]
    title: String,
    #[prost(string, tag = "2")]
    version: String,
}

/// `/openapi/v2` in protobuf. kubectl reads it for one thing: to validate on the client side
/// the items of a `List` it applies or creates (single objects it leaves to the server's
/// `fieldValidation`, which the v3 documents declare). The definitions are left out — the
/// built-in kinds' schemas here are open objects, which kubectl would read as "no field but
/// apiVersion, kind, metadata, spec and status" — so kubectl treats each item as schemaless
/// and this server validates it when it is written, as it does every other object.
pub fn v2_protobuf() -> Vec<u8> {
    use prost::Message;
    V2Document {
        swagger: "2.0".into(),
        info: Some(V2Info {
            title: "Kubernetes".into(),
            version: format!("v{}.{}.0", KUBE_VERSION.0, KUBE_VERSION.1),
        }),
    }
    .encode_to_vec()
}

/// `/openapi/v2`: every definition in Swagger 2.0 form.
pub fn v2(registry: &Registry) -> Value {
    let mut definitions = Map::new();
    let mut paths = Map::new();
    for (group, versions) in registry.groups() {
        for version in versions {
            for res in registry.resources_at(&group, &version) {
                if res.stored {
                    definitions.insert(definition_name(&res), schema_of(&res));
                    paths.insert(path_of(&res), operations(&res));
                }
            }
        }
    }
    json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": format!("v{}.{}.0", KUBE_VERSION.0, KUBE_VERSION.1)},
        "paths": paths,
        "definitions": definitions,
    })
}
