//! Object semantics shared by every write: metadata kube-apiserver owns (uid, timestamps,
//! generation), status-subresource separation, names, and the no-op check.

use serde_json::{Map, Value, json};
use tandem_apimachinery::validation::{is_dns1123_label, is_dns1123_subdomain};

use crate::error::{ApiError, ApiResult};
use crate::registry::ResourceInfo;

/// Now, as Kubernetes writes timestamps (RFC 3339, seconds).
pub fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Parses a request body: JSON, or YAML for apply patches and YAML content types.
pub fn parse_body(body: &[u8], content_type: &str) -> ApiResult<Value> {
    if body.is_empty() {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    // kubectl's typed clients send protobuf and do not fall back to JSON, so it is decoded;
    // a kind without a mapping gets 415 with a hint, a malformed body 400.
    if content_type.contains("protobuf") {
        return crate::protobuf::decode(body).map_err(|e| {
            let message = e.to_string();
            if e.is_unsupported() {
                ApiError {
                    code: 415,
                    reason: "UnsupportedMediaType",
                    message,
                    details: None,
                }
            } else {
                ApiError::bad_request(message)
            }
        });
    }
    // CBOR is not decoded; 415 makes client-go fall back to JSON.
    if content_type.contains("cbor") {
        return Err(ApiError::unsupported_media_type(content_type));
    }
    if content_type.contains("yaml") {
        serde_saphyr::from_slice::<Value>(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
    } else {
        serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!(
                "Object 'Kind' is missing in '{}': {e}",
                String::from_utf8_lossy(&body[..body.len().min(200)])
            ))
        })
    }
}

/// `metadata` of an object, created if absent.
pub fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj["metadata"].is_object() {
        obj["metadata"] = json!({});
    }
    obj["metadata"]
        .as_object_mut()
        .expect("just made an object")
}

/// Checks the body's apiVersion and kind against the endpoint, filling them when absent.
pub fn check_type(info: &ResourceInfo, obj: &mut Value) -> ApiResult<()> {
    if !obj.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    let api_version = info.api_version();
    match obj["apiVersion"].as_str() {
        None | Some("") => obj["apiVersion"] = json!(api_version),
        Some(v) if v == api_version => {}
        Some(v) => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({api_version})"
            )));
        }
    }
    match obj["kind"].as_str() {
        None | Some("") => obj["kind"] = json!(info.kind),
        Some(k) if k == info.kind => {}
        Some(k) => {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                info.kind
            )));
        }
    }
    Ok(())
}

const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

/// Validates metadata.name (and namespace) the way kube-apiserver does for the kind.
pub fn validate_name(info: &ResourceInfo, name: &str) -> ApiResult<()> {
    let label_only = matches!(info.kind.as_str(), "Namespace" | "Service");
    // RBAC objects and some others allow any path segment name.
    let path_segment = matches!(
        info.kind.as_str(),
        "Role" | "ClusterRole" | "RoleBinding" | "ClusterRoleBinding" | "Node" | "Event"
    ) || info.custom.is_none() && info.group == "certificates.k8s.io";
    let ok = if path_segment {
        !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '%'])
    } else if label_only {
        is_dns1123_label(name)
    } else {
        is_dns1123_subdomain(name)
    };
    if ok {
        return Ok(());
    }
    if name.is_empty() {
        return Err(ApiError::invalid(
            &info.group,
            &info.kind,
            name,
            vec![(
                "FieldValueRequired".into(),
                "metadata.name".into(),
                "metadata.name: Required value: name or generateName is required".into(),
            )],
        ));
    }
    let detail = if label_only {
        DNS1123_LABEL_MSG
    } else {
        DNS1123_SUBDOMAIN_MSG
    };
    Err(ApiError::invalid_field(
        &info.group,
        &info.kind,
        name,
        "metadata.name",
        &format!("Invalid value: {}: {detail}", json!(name)),
    ))
}

/// A random suffix for generateName, as kube draws it.
pub fn random_suffix() -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// Drops empty metadata lists and maps, as kube-apiserver's Go encoding (omitempty) does, so
/// clients see `finalizers` absent rather than `[]`.
pub fn normalize_metadata(obj: &mut Value) {
    if let Some(meta) = obj["metadata"].as_object_mut() {
        meta.retain(|k, v| {
            let empty = match v {
                Value::Array(a) => a.is_empty(),
                Value::Object(o) => o.is_empty(),
                Value::Null => true,
                _ => false,
            };
            !(empty
                && matches!(
                    k.as_str(),
                    "finalizers"
                        | "ownerReferences"
                        | "labels"
                        | "annotations"
                        | "managedFields"
                        | "deletionTimestamp"
                        | "generateName"
                ))
        });
    }
}

/// Sets the metadata a create owns: uid, creationTimestamp, generation; drops what clients
/// may not set; resets status where the kind does.
pub fn prepare_create(info: &ResourceInfo, obj: &mut Value) {
    let meta = meta_mut(obj);
    meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
    meta.insert("creationTimestamp".into(), json!(now()));
    for owned in [
        "resourceVersion",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "selfLink",
    ] {
        meta.remove(owned);
    }
    if info.has_status()
        && !info.keeps_status_on_create
        && let Some(map) = obj.as_object_mut()
    {
        map.remove("status");
    }
    // Kinds with a spec track generations (as do all custom resources); ConfigMaps and the
    // like have none.
    if info.custom.is_some()
        || obj.get("spec").is_some()
        || info.kind.ends_with("WebhookConfiguration")
    {
        meta_mut(obj).insert("generation".into(), json!(1));
    } else {
        meta_mut(obj).remove("generation");
    }
}

/// Fields outside metadata and status: what a generation counts.
fn spec_part(obj: &Value) -> Map<String, Value> {
    obj.as_object()
        .map(|m| {
            m.iter()
                .filter(|(k, _)| {
                    !matches!(k.as_str(), "metadata" | "status" | "apiVersion" | "kind")
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// Carries over from `old` what an update may not change and separates status: a write to
/// the main resource keeps the old status, a write to /status keeps everything else.
pub fn prepare_update(info: &ResourceInfo, old: &Value, new: &mut Value, subresource: &str) {
    if subresource == "status" {
        let status = new.get("status").cloned();
        let mut merged = old.clone();
        match status {
            Some(s) => merged["status"] = s,
            None => {
                if let Some(m) = merged.as_object_mut() {
                    m.remove("status");
                }
            }
        }
        // Like kube's status strategies, /status changes nothing but status.
        merged["metadata"]["managedFields"] = new["metadata"]["managedFields"].clone();
        *new = merged;
    } else if info.has_status() {
        match old.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => {
                if let Some(m) = new.as_object_mut() {
                    m.remove("status");
                }
            }
        }
    }
    let old_meta = &old["metadata"];
    let meta = meta_mut(new);
    for kept in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "name",
        "namespace",
    ] {
        match old_meta.get(kept) {
            Some(v) => meta.insert(kept.into(), v.clone()),
            None => meta.remove(kept),
        };
    }
    // deletionTimestamp is set by deletion only; finalizers may only shrink once it is set
    // (kube forbids adding finalizers to an object being deleted).
    match old_meta["generation"].as_i64() {
        Some(generation) => {
            meta.insert("generation".into(), json!(generation));
            if spec_part(old) != spec_part(new) {
                new["metadata"]["generation"] = json!(generation + 1);
            }
        }
        None => {
            meta.remove("generation");
        }
    }
}

/// Whether two versions of an object differ in anything but resourceVersion (a no-op
/// update is not written, as in kube). managedFields count: an apply that only takes
/// ownership is a change; their timestamps stay put when ownership does not move.
pub fn same_object(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(meta) = v["metadata"].as_object_mut() {
            meta.remove("resourceVersion");
        }
        v
    };
    strip(a) == strip(b)
}

/// A metav1.Status reporting success (deletes that completed immediately).
pub fn success_status(info: &ResourceInfo, name: &str, uid: &str) -> Value {
    let mut details = json!({"name": name, "kind": info.resource, "uid": uid});
    if !info.group.is_empty() {
        details["group"] = json!(info.group);
    }
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details})
}

/// Whether the object is being deleted.
pub fn is_deleting(obj: &Value) -> bool {
    !obj["metadata"]["deletionTimestamp"].is_null()
}

/// The object's finalizers.
pub fn finalizers(obj: &Value) -> Vec<String> {
    obj["metadata"]["finalizers"]
        .as_array()
        .map(|f| {
            f.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}
