//! Deleting one object as kube-apiserver does: preconditions, admission, finalizers, grace
//! periods and the propagation policy that tells the garbage collector what to do.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::error::{ApiError, ApiResult};
use crate::objects::{self, meta_mut};
use crate::registry::ResourceInfo;
use crate::request::{Call, is_dry_run};
use crate::state::{State, fetch};

/// DeleteOptions from the body and the query.
#[derive(Debug, Default, Clone)]
pub struct DeleteOptions {
    /// gracePeriodSeconds.
    pub grace: Option<i64>,
    /// propagationPolicy.
    pub propagation: Option<String>,
    /// preconditions.uid.
    pub uid: Option<String>,
    /// preconditions.resourceVersion.
    pub rv: Option<u64>,
    /// dryRun=All.
    pub dry_run: bool,
}

impl DeleteOptions {
    /// The options a delete request sends in its body (JSON or protobuf) and query.
    pub fn from_call(call: &Call) -> ApiResult<DeleteOptions> {
        // kubectl sends DeleteOptions as protobuf for typed deletes, JSON otherwise.
        let body: Value = if call.body.is_empty() {
            json!({})
        } else {
            objects::parse_body(&call.body, call.content_type())?
        };
        let q = &call.query;
        let mut propagation = body["propagationPolicy"]
            .as_str()
            .map(str::to_string)
            .or_else(|| q.get("propagationPolicy").cloned());
        if propagation.is_none() {
            let orphan = body["orphanDependents"]
                .as_bool()
                .or_else(|| q.get("orphanDependents").map(|v| v == "true"));
            if orphan == Some(true) {
                propagation = Some("Orphan".into());
            }
        }
        if let Some(p) = &propagation
            && !matches!(p.as_str(), "Orphan" | "Background" | "Foreground")
        {
            return Err(ApiError::invalid_field(
                "",
                "DeleteOptions",
                "",
                "propagationPolicy",
                &format!(
                    "Unsupported value: {}: supported values: \"Foreground\", \"Background\", \"Orphan\"",
                    json!(p)
                ),
            ));
        }
        Ok(DeleteOptions {
            grace: body["gracePeriodSeconds"]
                .as_i64()
                .or_else(|| q.get("gracePeriodSeconds").and_then(|g| g.parse().ok())),
            propagation,
            uid: body["preconditions"]["uid"].as_str().map(str::to_string),
            rv: body["preconditions"]["resourceVersion"]
                .as_str()
                .and_then(|r| r.parse().ok()),
            dry_run: body["dryRun"]
                .as_array()
                .is_some_and(|d| d.iter().any(|v| v == "All"))
                || is_dry_run(call),
        })
    }
}

/// What a delete did.
pub struct Deletion {
    /// The object: its last state if gone, its state with deletionTimestamp if pending.
    pub object: Value,
    /// Whether the object is gone (false while finalizers or a grace period hold it).
    pub gone: bool,
}

/// Deletes one object honouring grace periods, finalizers and propagation.
pub async fn delete_one(
    state: &State,
    call: &Call,
    res: &Arc<ResourceInfo>,
    ns: &str,
    name: &str,
    opts: &DeleteOptions,
) -> ApiResult<Deletion> {
    for _attempt in 0..16 {
        let current = fetch(state, res, ns, name)?;
        let mut obj = current.value();
        if let Some(uid) = &opts.uid
            && *uid != *current.uid
        {
            return Err(ApiError::conflict(
                &res.group,
                &res.resource,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    current.uid
                ),
            ));
        }
        if let Some(rv) = opts.rv
            && rv != current.rv
        {
            return Err(ApiError::conflict(
                &res.group,
                &res.resource,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    current.rv
                ),
            ));
        }
        crate::admission::validate_delete(state, call, res, &obj).await?;
        let mut finalizers = objects::finalizers(&obj);
        // batch/v1 Jobs orphan their pods unless told otherwise (kube keeps that default for
        // compatibility: `kubectl delete` asks for Background itself); a deletion already
        // under way keeps the policy it started with.
        let policy = match opts.propagation.as_deref() {
            Some(policy) => policy,
            None if res.group == "batch"
                && res.resource == "jobs"
                && !finalizers
                    .iter()
                    .any(|f| f == "foregroundDeletion" || f == "orphan") =>
            {
                "Orphan"
            }
            None => "Background",
        };
        let special = match policy {
            "Foreground" => Some("foregroundDeletion"),
            "Orphan" => Some("orphan"),
            _ => None,
        };
        let already_deleting = objects::is_deleting(&obj);
        if let Some(f) = special
            && !finalizers.iter().any(|x| x == f)
        {
            finalizers.retain(|x| x != "foregroundDeletion" && x != "orphan");
            finalizers.push(f.to_string());
        }
        // Pods bound to a node wait for their kubelet, which deletes them with grace 0.
        let pod_grace =
            if res.group.is_empty() && res.resource == "pods" && !obj["spec"]["nodeName"].is_null()
            {
                let phase = obj["status"]["phase"].as_str().unwrap_or("");
                let grace = opts.grace.unwrap_or_else(|| {
                    obj["spec"]["terminationGracePeriodSeconds"]
                        .as_i64()
                        .unwrap_or(30)
                });
                if matches!(phase, "Succeeded" | "Failed") {
                    0
                } else {
                    grace.max(0)
                }
            } else {
                0
            };
        let namespace_lifecycle = res.group.is_empty() && res.resource == "namespaces";
        let pending = !finalizers.is_empty() || pod_grace > 0 || namespace_lifecycle;
        if !pending {
            if opts.dry_run {
                return Ok(Deletion {
                    object: obj,
                    gone: true,
                });
            }
            match state.remove_object(res, ns, name, Some(current.rv)) {
                Ok(doc) => {
                    return Ok(Deletion {
                        object: doc.value(),
                        gone: true,
                    });
                }
                Err(e) if e.code == 409 => continue,
                Err(e) => return Err(e),
            }
        }
        let meta = meta_mut(&mut obj);
        if !already_deleting {
            let when = chrono::Utc::now() + chrono::Duration::seconds(pod_grace);
            meta.insert(
                "deletionTimestamp".into(),
                json!(when.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
            );
            meta.insert("deletionGracePeriodSeconds".into(), json!(pod_grace));
            if let Some(generation) = meta.get("generation").and_then(Value::as_i64) {
                meta.insert("generation".into(), json!(generation + 1));
            }
        } else if pod_grace
            < meta
                .get("deletionGracePeriodSeconds")
                .and_then(Value::as_i64)
                .unwrap_or(0)
        {
            // A shorter grace period shortens a pending deletion.
            let when = chrono::Utc::now() + chrono::Duration::seconds(pod_grace);
            meta.insert(
                "deletionTimestamp".into(),
                json!(when.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
            );
            meta.insert("deletionGracePeriodSeconds".into(), json!(pod_grace));
        }
        if finalizers.is_empty() {
            meta.remove("finalizers");
        } else {
            meta.insert("finalizers".into(), json!(finalizers));
        }
        if namespace_lifecycle {
            obj["status"]["phase"] = json!("Terminating");
        }
        if opts.dry_run {
            return Ok(Deletion {
                object: obj,
                gone: false,
            });
        }
        if objects::same_object(&current.value(), &obj) {
            return Ok(Deletion {
                object: current.value(),
                gone: false,
            });
        }
        match state.update_object(res, ns, name, current.rv, &mut obj) {
            Ok(doc) => {
                return Ok(Deletion {
                    object: doc.value(),
                    gone: false,
                });
            }
            Err(e) if e.code == 409 => continue,
            Err(e) => return Err(e),
        }
    }
    Err(ApiError::too_many_writers(&res.group, &res.resource, name))
}
