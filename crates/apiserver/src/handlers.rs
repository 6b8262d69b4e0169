//! Resource requests: which handler serves each verb and subresource, and get, list, create,
//! update, patch, delete and deletecollection themselves (status, approval and finalize
//! included); watch, scale, binding, eviction, token and reviews have modules of their own.

use std::sync::Arc;

use bytes::Bytes;
use http::Response;
use serde_json::{Value, json};
use tandem_apimachinery::managed::{self, ManagedContext};
use tandem_apimachinery::patchmeta::PatchSchema;

use crate::deletion::{DeleteOptions, delete_one};
use crate::error::{ApiError, ApiResult};
use crate::objects::{self, meta_mut};
use crate::registry::ResourceInfo;
use crate::request::{Call, is_dry_run, is_true};
use crate::response::{Body, bytes_response, for_version, json_response};
use crate::selectors::Selectors;
use crate::state::{State, fetch, store_error};
use crate::store::{Doc, StoreError};

/// Dispatches a resource request.
pub async fn resource(state: &Arc<State>, call: &Call) -> ApiResult<Response<Body>> {
    let info = &call.info;
    let res = state
        .registry
        .read()
        .get(&info.group, &info.version, &info.resource)
        .ok_or_else(ApiError::no_route)?;
    if !res.namespaced && !info.namespace.is_empty() && res.resource != "namespaces" {
        return Err(ApiError::no_route());
    }
    if !info.subresource.is_empty() && !res.has_subresource(&info.subresource) {
        return Err(ApiError::no_route());
    }
    if res.group == crate::metrics_api::GROUP {
        return crate::metrics_api::serve(state, call, &res).await;
    }
    if !res.stored {
        return crate::reviews::create(state, call, &res).await;
    }
    match (info.verb.as_str(), info.subresource.as_str()) {
        ("get", "scale") => crate::scale::get(state, call, &res),
        ("update" | "patch", "scale") => crate::scale::write(state, call, &res).await,
        ("create", "binding") => crate::subresources::bind(state, call, &res).await,
        ("create", "eviction") => crate::subresources::evict(state, call, &res).await,
        ("create", "token") => crate::subresources::token_request(state, call, &res),
        ("get", _) => get(state, call, &res),
        ("list", "") => list(state, call, &res),
        ("watch", "") => crate::watch::watch(state.clone(), call, res),
        ("create", "") => create(state, call, &res).await,
        ("update", _) => update(state, call, &res).await,
        ("patch", _) => patch(state, call, &res).await,
        ("delete", "") => delete(state, call, &res).await,
        ("deletecollection", "") => delete_collection(state, call, &res).await,
        (verb, _) => Err(ApiError::method_not_allowed(verb, &res.resource)),
    }
}

/// The namespace objects of `res` live in for this request ("" for cluster scope).
fn namespace_of(call: &Call, res: &ResourceInfo) -> String {
    if res.namespaced {
        call.info.namespace.clone()
    } else {
        String::new()
    }
}

fn wants_table(call: &Call) -> bool {
    call.headers
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=Table"))
}

fn get(state: &State, call: &Call, res: &Arc<ResourceInfo>) -> ApiResult<Response<Body>> {
    let ns = namespace_of(call, res);
    let doc = fetch(state, res, &ns, &call.info.name)?;
    if wants_table(call) && call.info.subresource.is_empty() {
        let table = crate::table::render(res, &[doc], &call.query, state.store.current_rv(), None);
        return Ok(json_response(200, &table));
    }
    Ok(bytes_response(200, for_version(res, &doc)))
}

#[derive(serde::Serialize, serde::Deserialize)]
struct ContinueToken {
    rv: u64,
    ns: String,
    name: String,
}

fn list(state: &State, call: &Call, res: &Arc<ResourceInfo>) -> ApiResult<Response<Body>> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let ns = namespace_of(call, res);
    let key = res.storage_key();
    let selectors = Selectors::parse(call, res)?;
    let limit: usize = call
        .query
        .get("limit")
        .and_then(|l| l.parse().ok())
        .unwrap_or(0);
    let token: Option<ContinueToken> = match call.query.get("continue").filter(|c| !c.is_empty()) {
        Some(c) => Some(
            b64.decode(c)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .ok_or_else(|| ApiError::bad_request("continue key is not valid"))?,
        ),
        None => None,
    };
    let after = token.as_ref().map(|t| (t.ns.as_str(), t.name.as_str()));
    let ns_filter = (!ns.is_empty()).then_some(ns.as_str());
    let (now_rv, docs) = state.store.list(&key, ns_filter, after);
    // Pages after the first report the first page's version, so a watch started from it
    // misses nothing.
    let rv = token.as_ref().map_or(now_rv, |t| t.rv);
    let mut items: Vec<Arc<Doc>> = Vec::new();
    let mut remaining = 0usize;
    let mut next = None;
    for doc in docs {
        if !selectors.matches(&key, &doc) {
            continue;
        }
        if limit > 0 && items.len() == limit {
            remaining += 1;
            if next.is_none() {
                let last = items.last().expect("limit > 0");
                next = Some(ContinueToken {
                    rv,
                    ns: last.namespace.to_string(),
                    name: last.name.to_string(),
                });
            }
            continue;
        }
        items.push(doc);
    }
    let continue_token = next.map(|t| b64.encode(serde_json::to_vec(&t).expect("serializes")));
    if wants_table(call) {
        let mut table =
            crate::table::render(res, &items, &call.query, rv, continue_token.as_deref());
        if remaining > 0 {
            table["metadata"]["remainingItemCount"] = json!(remaining);
        }
        return Ok(json_response(200, &table));
    }
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = continue_token {
        meta["continue"] = json!(c);
        meta["remainingItemCount"] = json!(remaining);
    }
    let head = json!({"kind": format!("{}List", res.kind), "apiVersion": res.api_version(), "metadata": meta});
    let head = serde_json::to_string(&head).expect("serializes");
    let mut out =
        Vec::with_capacity(head.len() + items.iter().map(|d| d.json.len() + 1).sum::<usize>() + 16);
    out.extend_from_slice(&head.as_bytes()[..head.len() - 1]);
    out.extend_from_slice(b",\"items\":[");
    for (i, doc) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(&for_version(res, doc));
    }
    out.extend_from_slice(b"]}");
    Ok(bytes_response(200, Bytes::from(out)))
}

/// The field manager of a write: `fieldManager`, else the User-Agent's program name.
pub fn field_manager(call: &Call) -> String {
    if let Some(m) = call.query.get("fieldManager").filter(|m| !m.is_empty()) {
        return m.clone();
    }
    call.headers
        .get(http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .map(|ua| ua.split('/').next().unwrap_or(ua).to_string())
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// Merge rules of a resource's objects, for strategic merge patch and apply.
pub fn patch_schema(res: &ResourceInfo) -> PatchSchema {
    match res.custom.as_ref().and_then(|c| c.schema.as_ref()) {
        Some(schema) => PatchSchema::from_openapi(schema),
        None if res.custom.is_some() => PatchSchema::empty(),
        None => PatchSchema::builtin(&res.group, &res.kind),
    }
}

/// Top-level fields an endpoint does not own, for managedFields.
fn ignored_fields(res: &ResourceInfo, subresource: &str) -> &'static [&'static str] {
    match (res.has_status(), subresource) {
        (true, "status") => &["spec", "data", "metadata", "rules", "subjects"],
        (true, _) => &["status"],
        _ => &[],
    }
}

/// Everything a write must do between the client's object and the store: defaulting,
/// admission, validation, managedFields. `old` is None for creates.
pub async fn admit(
    state: &State,
    call: &Call,
    res: &Arc<ResourceInfo>,
    old: Option<&Value>,
    obj: &mut Value,
    operation: &str,
) -> ApiResult<()> {
    objects::normalize_metadata(obj);
    crate::defaults::apply(state, res, obj, old)?;
    crate::admission::mutate(state, call, res, old, obj, operation).await?;
    crate::defaults::apply(state, res, obj, old)?;
    crate::validation::validate(state, call, res, old, obj)?;
    crate::pod_security::admit(state, res, obj, operation)?;
    crate::rbac_escalation::admit(state, call, res, obj)?;
    crate::admission::validate(state, call, res, old, obj, operation).await?;
    Ok(())
}

/// What managedFields bookkeeping needs to know about a write, owned so the retry loop can
/// build a `ManagedContext` on each attempt.
struct FieldOwnership {
    manager: String,
    api_version: String,
    schema: PatchSchema,
    subresource: String,
    ignored: &'static [&'static str],
}

impl FieldOwnership {
    fn new(call: &Call, res: &ResourceInfo, manager: String) -> Self {
        FieldOwnership {
            manager,
            api_version: res.api_version(),
            schema: patch_schema(res),
            subresource: call.info.subresource.clone(),
            ignored: ignored_fields(res, &call.info.subresource),
        }
    }

    fn context<'a>(&'a self, time: &'a str) -> ManagedContext<'a> {
        ManagedContext {
            manager: &self.manager,
            api_version: &self.api_version,
            time,
            schema: &self.schema,
            subresource: (!self.subresource.is_empty()).then_some(self.subresource.as_str()),
            ignored: self.ignored,
        }
    }
}

fn record_update(call: &Call, res: &ResourceInfo, old: Option<&Value>, obj: &mut Value) {
    let ownership = FieldOwnership::new(call, res, field_manager(call));
    managed::record_update(old, obj, &ownership.context(&objects::now()));
}

/// The end of a create (a POST, or an apply that creates): stores the admitted object within
/// its namespace's quota, or under `dryRun=All` refuses what the create would refuse (a
/// missing or terminating namespace, a taken name, an exceeded quota) and stores nothing.
fn store_created(
    state: &State,
    call: &Call,
    res: &Arc<ResourceInfo>,
    ns: &str,
    name: &str,
    obj: &mut Value,
) -> ApiResult<Response<Body>> {
    if is_dry_run(call) {
        state.check_create(res, ns, name)?;
        crate::quota::check_create(state, res, ns, name, obj)?;
        return Ok(json_response(201, obj));
    }
    let doc = crate::quota::create_within_quota(state, res, ns, name, obj)?;
    Ok(bytes_response(201, for_version(res, &doc)))
}

async fn create(state: &State, call: &Call, res: &Arc<ResourceInfo>) -> ApiResult<Response<Body>> {
    let content_type = call.content_type().to_string();
    let mut obj = objects::parse_body(&call.body, &content_type)?;
    objects::check_type(res, &mut obj)?;
    let ns = namespace_of(call, res);
    set_name_and_namespace(res, &ns, &mut obj)?;
    objects::prepare_create(res, &mut obj);
    if res.group == "certificates.k8s.io" && res.kind == "CertificateSigningRequest" {
        // The requester is whoever files the CSR, never what the body claims.
        obj["spec"]["username"] = json!(call.user.name);
        obj["spec"]["groups"] = json!(call.user.groups);
        if let Some(spec) = obj["spec"].as_object_mut() {
            spec.remove("uid");
            spec.remove("extra");
        }
    }
    admit(state, call, res, None, &mut obj, "CREATE").await?;
    record_update(call, res, None, &mut obj);
    let name = obj["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    store_created(state, call, res, &ns, &name, &mut obj)
}

/// Fills metadata.name (from generateName) and metadata.namespace, and checks them.
pub fn set_name_and_namespace(res: &ResourceInfo, ns: &str, obj: &mut Value) -> ApiResult<()> {
    let meta = meta_mut(obj);
    let name = meta
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if name.is_empty()
        && let Some(prefix) = meta.get("generateName").and_then(Value::as_str)
    {
        let generated = format!("{prefix}{}", objects::random_suffix());
        meta.insert("name".into(), json!(generated));
    }
    let name = meta
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if res.namespaced {
        match meta.get("namespace").and_then(Value::as_str) {
            Some(body_ns) if !body_ns.is_empty() && body_ns != ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => {
                meta.insert("namespace".into(), json!(ns));
            }
        }
    } else {
        meta.remove("namespace");
    }
    objects::validate_name(res, &name)
}

fn requested_rv(obj: &Value) -> Option<u64> {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .filter(|s| !s.is_empty())
        .and_then(|s| s.parse().ok())
}

async fn update(state: &State, call: &Call, res: &Arc<ResourceInfo>) -> ApiResult<Response<Body>> {
    let mut body = objects::parse_body(&call.body, call.content_type())?;
    objects::check_type(res, &mut body)?;
    let name = call.info.name.clone();
    match body["metadata"]["name"].as_str() {
        Some(n) if n == name => {}
        None => meta_mut(&mut body)
            .insert("name".into(), json!(name))
            .map(|_| ())
            .unwrap_or(()),
        Some(_) => {
            return Err(ApiError::bad_request(
                "the name of the object does not match the name on the URL",
            ));
        }
    }
    let want_rv = requested_rv(&body);
    let body = Arc::new(body);
    write_loop(state, call, res, want_rv, move |_old| Ok((*body).clone())).await
}

async fn patch(state: &State, call: &Call, res: &Arc<ResourceInfo>) -> ApiResult<Response<Body>> {
    let ct = call.content_type().to_string();
    let patch_type = ct.split(';').next().unwrap_or("").trim().to_string();
    let is_apply = patch_type == "application/apply-patch+yaml";
    let patch = objects::parse_body(&call.body, &ct)?;
    if patch_type == "application/strategic-merge-patch+json" && res.custom.is_some() {
        return Err(ApiError::unsupported_media_type(&patch_type));
    }
    if is_apply {
        return apply(state, call, res, patch).await;
    }
    let schema = patch_schema(res);
    let want_rv = requested_rv(&patch);
    write_loop(state, call, res, want_rv, move |old| {
        let old =
            old.ok_or_else(|| ApiError::not_found(&res.group, &res.resource, &call.info.name))?;
        let patched = match patch_type.as_str() {
            "application/json-patch+json" => tandem_apimachinery::patch::json_patch(old, &patch),
            "application/merge-patch+json" => tandem_apimachinery::patch::merge_patch(old, &patch),
            "application/strategic-merge-patch+json" => {
                tandem_apimachinery::patch::strategic_merge_patch(old, &patch, &schema)
            }
            other => return Err(ApiError::unsupported_media_type(other)),
        };
        // A malformed patch is 400; a well-formed one that does not apply (a failed test
        // op, a missing path) is 422, as in kube.
        patched.map_err(|e| match e.http_status() {
            422 => ApiError::unprocessable(e.to_string()),
            _ => ApiError::bad_request(e.to_string()),
        })
    })
    .await
}

async fn apply(
    state: &State,
    call: &Call,
    res: &Arc<ResourceInfo>,
    config: Value,
) -> ApiResult<Response<Body>> {
    let manager = call
        .query
        .get("fieldManager")
        .filter(|m| !m.is_empty())
        .cloned()
        .ok_or_else(|| {
            ApiError::invalid_field(
                "meta.k8s.io",
                "PatchOptions",
                "",
                "fieldManager",
                "Required value: is required for apply patch",
            )
        })?;
    let force = is_true(call.query.get("force"));
    let mut config = config;
    objects::check_type(res, &mut config)?;
    if let Some(n) = config["metadata"]["name"].as_str()
        && n != call.info.name
    {
        return Err(ApiError::bad_request(
            "the name of the object does not match the name on the URL",
        ));
    }
    let ownership = FieldOwnership::new(call, res, manager);
    let config = Arc::new(config);
    write_loop(state, call, res, None, move |old| {
        let time = objects::now();
        let ctx = ownership.context(&time);
        managed::apply(old, &config, force, &ctx).map_err(|e| match &e {
            managed::ManagedError::Conflicts(conflicts) => {
                let mut err = ApiError::conflict_message(e.to_string());
                let causes: Vec<Value> = conflicts
                    .iter()
                    .map(|c| json!({"reason": "FieldManagerConflict", "message": format!("conflict with {:?}", c.manager), "field": c.field}))
                    .collect();
                err.details = Some(json!({"causes": causes}));
                err
            }
            other => ApiError::bad_request(other.to_string()),
        })
    })
    .await
}

/// Read, compute, admit, write; retried on conflicts unless the client named a version.
/// `compute` gets the current object (None if absent) and returns the desired one.
async fn write_loop(
    state: &State,
    call: &Call,
    res: &Arc<ResourceInfo>,
    want_rv: Option<u64>,
    compute: impl Fn(Option<&Value>) -> ApiResult<Value>,
) -> ApiResult<Response<Body>> {
    let ns = namespace_of(call, res);
    let name = call.info.name.clone();
    let sub = call.info.subresource.as_str();
    let is_apply_create = call.info.verb == "patch"
        && call
            .content_type()
            .to_string()
            .starts_with("application/apply-patch");
    for _attempt in 0..16 {
        let current = state.store.get(&res.storage_key(), &ns, &name);
        let Some(current) = current else {
            if is_apply_create && sub.is_empty() {
                // Server-side apply creates what does not exist; as in kube-apiserver, that
                // takes the `create` permission besides `patch`.
                let as_create = crate::request::RequestInfo {
                    verb: "create".into(),
                    ..call.info.clone()
                };
                crate::authz::authorize(state, &call.user, &as_create)?;
                let mut obj = compute(None)?;
                set_name_and_namespace(res, &ns, &mut obj)?;
                objects::prepare_create(res, &mut obj);
                admit(state, call, res, None, &mut obj, "CREATE").await?;
                return store_created(state, call, res, &ns, &name, &mut obj);
            }
            return Err(ApiError::not_found(&res.group, &res.resource, &name));
        };
        if let Some(want) = want_rv
            && want != current.rv
        {
            return Err(store_error(res, &name, StoreError::Conflict));
        }
        let old = current.value();
        let mut obj = compute(Some(&old))?;
        objects::check_type(res, &mut obj)?;
        match sub {
            "approval" => {
                // Only the approval conditions change through /approval.
                let conditions = obj["status"]["conditions"].clone();
                obj = old.clone();
                obj["status"]["conditions"] = conditions;
            }
            "finalize" => {
                let finalizers = obj["spec"]["finalizers"].clone();
                obj = old.clone();
                obj["spec"]["finalizers"] = finalizers;
            }
            _ => objects::prepare_update(res, &old, &mut obj, sub),
        }
        if objects::is_deleting(&old) {
            let added: Vec<String> = objects::finalizers(&obj)
                .into_iter()
                .filter(|f| !objects::finalizers(&old).contains(f))
                .collect();
            if !added.is_empty() {
                return Err(ApiError::invalid_field(
                    &res.group,
                    &res.kind,
                    &name,
                    "metadata.finalizers",
                    &format!(
                        "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
                    ),
                ));
            }
        }
        admit(state, call, res, Some(&old), &mut obj, "UPDATE").await?;
        if !call
            .content_type()
            .to_string()
            .starts_with("application/apply-patch")
        {
            record_update(call, res, Some(&old), &mut obj);
        }
        if objects::same_object(&old, &obj) {
            return Ok(bytes_response(200, for_version(res, &current)));
        }
        if is_dry_run(call) {
            return Ok(json_response(200, &obj));
        }
        // The last finalizer removed from an object being deleted: it goes now.
        if objects::is_deleting(&obj) && objects::finalizers(&obj).is_empty() {
            match state.remove_object(res, &ns, &name, Some(current.rv)) {
                Ok(doc) => return Ok(bytes_response(200, for_version(res, &doc))),
                Err(e) if e.code == 409 && want_rv.is_none() => continue,
                Err(e) => return Err(e),
            }
        }
        match state.update_object(res, &ns, &name, current.rv, &mut obj) {
            Ok(doc) => return Ok(bytes_response(200, for_version(res, &doc))),
            Err(e) if e.code == 409 && want_rv.is_none() => continue,
            Err(e) => return Err(e),
        }
    }
    Err(ApiError::too_many_writers(&res.group, &res.resource, &name))
}

async fn delete(state: &State, call: &Call, res: &Arc<ResourceInfo>) -> ApiResult<Response<Body>> {
    let opts = DeleteOptions::from_call(call)?;
    let ns = namespace_of(call, res);
    let deletion = delete_one(state, call, res, &ns, &call.info.name, &opts).await?;
    let body = if deletion.gone {
        objects::success_status(
            res,
            &call.info.name,
            deletion.object["metadata"]["uid"].as_str().unwrap_or(""),
        )
    } else {
        deletion.object
    };
    Ok(json_response(200, &body))
}

async fn delete_collection(
    state: &State,
    call: &Call,
    res: &Arc<ResourceInfo>,
) -> ApiResult<Response<Body>> {
    let opts = DeleteOptions::from_call(call)?;
    let ns = namespace_of(call, res);
    let selectors = Selectors::parse(call, res)?;
    let key = res.storage_key();
    let (_, docs) = state
        .store
        .list(&key, (!ns.is_empty()).then_some(ns.as_str()), None);
    let mut deleted = Vec::new();
    for doc in docs.iter().filter(|d| selectors.matches(&key, d)) {
        match delete_one(state, call, res, &doc.namespace, &doc.name, &opts).await {
            Ok(deletion) => deleted.push(deletion.object),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(json_response(
        200,
        &json!({
            "kind": format!("{}List", res.kind), "apiVersion": res.api_version(),
            "metadata": {"resourceVersion": state.store.current_rv().to_string()}, "items": deleted,
        }),
    ))
}
