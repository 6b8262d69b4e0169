//! Validation of writes: structural schemas of custom resources (with pruning and the
//! fieldValidation modes) and the built-in rules clients most often run into.

use std::sync::Arc;

use serde_json::{Map, Value, json};
use tandem_apimachinery::quantity::Quantity;
use tandem_apimachinery::schema;
use tandem_apimachinery::selector::LabelSelector;
use tandem_apimachinery::validation::{validate_dns1123_label, validate_label_key};

use crate::error::{ApiError, ApiResult};
use crate::registry::ResourceInfo;
use crate::request::Call;
use crate::state::State;

type Cause = (String, String, String);

fn cause(field: &str, kind: &str, message: String) -> Cause {
    (kind.to_string(), field.to_string(), message)
}

fn invalid(field: &str, value: &Value, message: &str) -> Cause {
    cause(
        field,
        "FieldValueInvalid",
        format!("{field}: Invalid value: {value}: {message}"),
    )
}

/// `field.NotSupported`: the value and the values kube accepts there.
fn not_supported(field: &str, value: &Value, supported: &[&str]) -> Cause {
    let supported: Vec<String> = supported.iter().map(|s| json!(s).to_string()).collect();
    cause(
        field,
        "FieldValueNotSupported",
        format!(
            "{field}: Unsupported value: {value}: supported values: {}",
            supported.join(", ")
        ),
    )
}

fn required(field: &str) -> Cause {
    cause(
        field,
        "FieldValueRequired",
        format!("{field}: Required value"),
    )
}

/// Validates `obj` (the object about to be stored); `old` is the stored one on updates.
pub fn validate(
    _state: &State,
    call: &Call,
    res: &Arc<ResourceInfo>,
    old: Option<&Value>,
    obj: &mut Value,
) -> ApiResult<()> {
    if res.custom.is_none() {
        // kube-apiserver refuses these while decoding the body, before any other check.
        decode_quantities(res, obj)?;
    }
    let name = obj["metadata"]["name"].as_str().unwrap_or("").to_string();
    let mut causes = metadata(obj);
    if let Some(custom) = &res.custom {
        if let Some(schema) = &custom.schema {
            let pruned = schema::prune(obj, schema);
            if !pruned.is_empty() {
                let mode = call
                    .query
                    .get("fieldValidation")
                    .map(String::as_str)
                    .unwrap_or("Warn");
                if mode == "Strict" {
                    let list: Vec<String> = pruned
                        .iter()
                        .map(|p| format!("unknown field {p:?}"))
                        .collect();
                    return Err(ApiError::bad_request(format!(
                        "strict decoding error: {}",
                        list.join(", ")
                    )));
                }
                tracing::debug!(resource = %res.resource, %name, ?pruned, "pruned unknown fields");
            }
            for err in schema::validate(obj, schema) {
                causes.push((
                    err.kind.reason().to_string(),
                    err.field.clone(),
                    err.to_string(),
                ));
            }
        }
    } else {
        // Only fields this write brings are refused: kube would never have stored one that
        // is already there (written without Strict), and a patch elsewhere must not fail on it.
        let brought = || {
            let mut unknown = crate::strict::unknown_fields(res, obj)?;
            if let Some(stored) = old.and_then(|old| crate::strict::unknown_fields(res, old)) {
                unknown.retain(|p| !stored.contains(p));
            }
            Some(unknown)
        };
        if call.query.get("fieldValidation").map(String::as_str) == Some("Strict")
            && let Some(unknown) = brought()
            && !unknown.is_empty()
        {
            let list: Vec<String> = unknown
                .iter()
                .map(|p| format!("unknown field {p:?}"))
                .collect();
            let (kind, version) = (&res.kind, &res.version);
            return Err(ApiError::bad_request(format!(
                "{kind} in version {version:?} cannot be handled as a {kind}: strict decoding error: {}",
                list.join(", ")
            )));
        }
        causes.extend(builtin(res, old, obj));
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(&res.group, &res.kind, &name, causes))
    }
}

fn metadata(obj: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    for (field, value) in [
        ("metadata.labels", &obj["metadata"]["labels"]),
        ("metadata.annotations", &obj["metadata"]["annotations"]),
    ] {
        if let Some(map) = value.as_object() {
            for (k, v) in map {
                if !v.is_string() {
                    causes.push(cause(
                        field,
                        "FieldValueTypeInvalid",
                        format!("{field}: Invalid value: {v}: {k} must be a string"),
                    ));
                }
            }
        }
    }
    if let Some(labels) = obj["metadata"]["labels"].as_object() {
        let pairs: Vec<String> = labels
            .iter()
            .filter_map(|(k, v)| v.as_str().map(|v| format!("{k}={v}")))
            .collect();
        for pair in pairs {
            if let Err(e) = LabelSelector::parse(&pair) {
                causes.push(cause(
                    "metadata.labels",
                    "FieldValueInvalid",
                    format!("metadata.labels: Invalid value: {:?}: {e}", pair),
                ));
            }
        }
    }
    causes
}

fn builtin(res: &ResourceInfo, old: Option<&Value>, obj: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    match (res.group.as_str(), res.kind.as_str()) {
        ("", "Pod") => {
            causes.extend(pod_spec("spec", &obj["spec"]));
            causes.extend(restart_policy(
                "spec.restartPolicy",
                &obj["spec"]["restartPolicy"],
                &["Always", "OnFailure", "Never"],
            ));
            if let Some(old) = old {
                causes.extend(pod_update(old, obj));
            }
        }
        ("apps", "Deployment" | "ReplicaSet" | "StatefulSet" | "DaemonSet") => {
            // kube's ReplicaSet validation words an empty selector as Deployment's does.
            let noun = match res.kind.as_str() {
                "StatefulSet" => "statefulset",
                "DaemonSet" => "daemonset",
                _ => "deployment",
            };
            causes.extend(workload_selector(
                "spec",
                &obj["spec"],
                old.map(|o| &o["spec"]),
                noun,
            ));
            if res.kind != "DaemonSet" {
                causes.extend(non_negative("spec.replicas", &obj["spec"]["replicas"]));
            }
            if res.kind == "StatefulSet" {
                causes.extend(stateful_set(obj, old));
            }
            causes.extend(pod_spec(
                "spec.template.spec",
                &obj["spec"]["template"]["spec"],
            ));
            // A workload's pods are restarted in place, never left to finish.
            causes.extend(restart_policy(
                "spec.template.spec.restartPolicy",
                &obj["spec"]["template"]["spec"]["restartPolicy"],
                &["Always"],
            ));
        }
        ("batch", "Job") => {
            causes.extend(job_spec("spec", &obj["spec"], true));
            if let Some(old) = old {
                causes.extend(job_update(&old["spec"], &obj["spec"]));
            }
        }
        ("batch", "CronJob") => causes.extend(cron_job(obj)),
        ("", "PersistentVolumeClaim") => {
            causes.extend(claim_spec("spec", &obj["spec"]));
            if let Some(old) = old {
                let bound = obj["status"]["phase"] == "Bound";
                causes.extend(claim_update(&old["spec"], &obj["spec"], bound));
            }
        }
        ("policy", "PodDisruptionBudget") => causes.extend(disruption_budget(&obj["spec"])),
        ("", "ResourceQuota") => {
            causes.extend(resource_values("spec.hard", &obj["spec"]["hard"], false));
        }
        ("", "Node") => {
            for field in ["capacity", "allocatable"] {
                // kube names these `status.capacity.cpu`, not `status.capacity[cpu]`.
                for (resource, value) in quantities(&obj["status"][field]) {
                    causes.extend(quantity_value(
                        &format!("status.{field}.{resource}"),
                        resource,
                        value,
                    ));
                }
            }
        }
        ("", "Service") => {
            for (i, p) in obj["spec"]["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
            {
                let port = p["port"].as_i64().unwrap_or(0);
                if !(1..=65535).contains(&port) {
                    causes.push(invalid(
                        &format!("spec.ports[{i}].port"),
                        &json!(port),
                        PORT_RANGE,
                    ));
                }
            }
            if obj["spec"]["type"] != "ExternalName"
                && obj["spec"]["clusterIP"] != "None"
                && obj["spec"]["ports"].as_array().is_none_or(Vec::is_empty)
            {
                causes.push(required("spec.ports"));
            }
        }
        ("apiextensions.k8s.io", "CustomResourceDefinition") => {
            causes.extend(crate::crd::validate(obj))
        }
        _ => {}
    }
    causes
}

fn pod_spec(path: &str, spec: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let containers = spec["containers"].as_array().cloned().unwrap_or_default();
    if containers.is_empty() {
        causes.push(required(&format!("{path}.containers")));
    }
    let mut names = std::collections::HashSet::new();
    for (i, c) in containers.iter().enumerate() {
        let name = c["name"].as_str().unwrap_or("");
        if name.is_empty() {
            causes.push(required(&format!("{path}.containers[{i}].name")));
        } else if !names.insert(name.to_string()) {
            causes.push(cause(
                &format!("{path}.containers[{i}].name"),
                "FieldValueDuplicate",
                format!(
                    "{path}.containers[{i}].name: Duplicate value: {}",
                    json!(name)
                ),
            ));
        }
        if c["image"].as_str().unwrap_or("").is_empty() {
            causes.push(required(&format!("{path}.containers[{i}].image")));
        }
    }
    for list in ["initContainers", "containers"] {
        for (i, c) in spec[list].as_array().into_iter().flatten().enumerate() {
            causes.extend(container(&format!("{path}.{list}[{i}]"), c));
        }
    }
    causes
}

/// The field formats kube checks on every container: its name, ports and resources.
fn container(path: &str, c: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    if let Some(name) = c["name"].as_str().filter(|n| !n.is_empty())
        && let Err(message) = validate_dns1123_label(name)
    {
        causes.push(invalid(
            &format!("{path}.name"),
            &c["name"],
            &message.to_string(),
        ));
    }
    for (i, port) in c["ports"].as_array().into_iter().flatten().enumerate() {
        let at = format!("{path}.ports[{i}]");
        match port["containerPort"].as_i64() {
            None | Some(0) => causes.push(required(&format!("{at}.containerPort"))),
            Some(n) if !(1..=65535).contains(&n) => causes.push(invalid(
                &format!("{at}.containerPort"),
                &port["containerPort"],
                PORT_RANGE,
            )),
            Some(_) => {}
        }
        if port["hostPort"]
            .as_i64()
            .is_some_and(|n| n != 0 && !(1..=65535).contains(&n))
        {
            causes.push(invalid(
                &format!("{at}.hostPort"),
                &port["hostPort"],
                PORT_RANGE,
            ));
        }
        if let Some(protocol) = port["protocol"].as_str()
            && !["SCTP", "TCP", "UDP"].contains(&protocol)
        {
            causes.push(not_supported(
                &format!("{at}.protocol"),
                &port["protocol"],
                &["SCTP", "TCP", "UDP"],
            ));
        }
    }
    causes.extend(resource_requirements(
        &format!("{path}.resources"),
        &c["resources"],
    ));
    causes
}

/// `validation.IsValidPortNum`'s message.
const PORT_RANGE: &str = "must be between 1 and 65535, inclusive";

fn restart_policy(path: &str, policy: &Value, supported: &[&str]) -> Vec<Cause> {
    match policy.as_str() {
        // Defaulted to Always before validation; absent only on objects that skip defaults.
        None => Vec::new(),
        Some(p) if supported.contains(&p) => Vec::new(),
        Some(_) => vec![not_supported(path, policy, supported)],
    }
}

/// The entries of a resource-name-to-quantity map (`requests`, `hard`, `capacity`).
fn quantities(map: &Value) -> impl Iterator<Item = (&String, &Value)> {
    map.as_object().into_iter().flat_map(Map::iter)
}

/// A quantity as kube's JSON decoder reads it: a string, or a bare JSON number.
fn quantity_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// `ValidateResourceQuantityValue`: zero or more, and whole for resources counted in units
/// (pods, extended resources). The value is known to parse: decoding checked it.
fn quantity_value(path: &str, resource: &str, value: &Value) -> Option<Cause> {
    let text = quantity_text(value)?;
    let quantity = Quantity::parse(&text).ok()?;
    let message = if quantity.is_negative() {
        "must be greater than or equal to 0"
    } else if integer_resource(resource) && quantity.milli_value() % 1000 != 0 {
        "must be an integer"
    } else {
        return None;
    };
    Some(invalid(path, &json!(text), message))
}

/// The values of a resource map, each named `path[resource]`; container resources must also
/// be resources a container can request.
fn resource_values(path: &str, map: &Value, for_container: bool) -> Vec<Cause> {
    let mut causes = Vec::new();
    for (resource, value) in quantities(map) {
        let at = format!("{path}[{resource}]");
        if for_container && let Some(message) = container_resource_name_error(resource) {
            causes.push(invalid(&at, &json!(resource), message));
        }
        causes.extend(quantity_value(&at, resource, value));
    }
    causes
}

/// `validateContainerResourceName`: `cpu`, `memory`, `ephemeral-storage`, `hugepages-*`, or a
/// domain-qualified (extended) resource; a typo such as `cpus` is refused.
fn container_resource_name_error(resource: &str) -> Option<&'static str> {
    if !resource.contains('/') {
        let standard = ["cpu", "memory", "ephemeral-storage"].contains(&resource)
            || resource.starts_with("hugepages-");
        return (!standard).then_some("must be a standard resource for containers");
    }
    (!native_resource(resource) && !extended_resource(resource))
        .then_some("doesn't follow extended resource name standard")
}

/// `helper.IsNativeResource`: unqualified, or in the `kubernetes.io/` domain.
fn native_resource(resource: &str) -> bool {
    !resource.contains('/') || resource.contains("kubernetes.io/")
}

/// `helper.IsExtendedResourceName`: a qualified name outside `kubernetes.io/`, not a quota's
/// `requests.` form.
fn extended_resource(resource: &str) -> bool {
    !native_resource(resource)
        && !resource.starts_with("requests.")
        && validate_label_key(resource).is_ok()
}

/// `helper.IsIntegerResourceName`: object counts and extended resources.
fn integer_resource(resource: &str) -> bool {
    const COUNTED: &[&str] = &[
        "pods",
        "services",
        "replicationcontrollers",
        "resourcequotas",
        "secrets",
        "configmaps",
        "persistentvolumeclaims",
        "services.nodeports",
        "services.loadbalancers",
    ];
    COUNTED.contains(&resource) || extended_resource(resource)
}

/// `ValidateResourceRequirements`: no negative quantity, no request above its limit, and
/// requests equal to limits for resources that cannot be overcommitted (extended resources,
/// hugepages).
fn resource_requirements(path: &str, resources: &Value) -> Vec<Cause> {
    let mut causes = resource_values(&format!("{path}.limits"), &resources["limits"], true);
    causes.extend(resource_values(
        &format!("{path}.requests"),
        &resources["requests"],
        true,
    ));
    let parse = |v: &Value| quantity_text(v).and_then(|t| Quantity::parse(&t).ok().map(|q| (t, q)));
    for (resource, request) in quantities(&resources["requests"]) {
        let (Some((request_text, request)), Some((limit_text, limit))) =
            (parse(request), parse(&resources["limits"][resource]))
        else {
            continue;
        };
        // Compared in nano units: exact for every quantity kube can express.
        let (r, l) = (request.scaled(9), limit.scaled(9));
        let message = if !overcommit_allowed(resource) && r != l {
            format!("must be equal to {resource} limit of {limit_text}")
        } else if r > l {
            format!("must be less than or equal to {resource} limit of {limit_text}")
        } else {
            continue;
        };
        causes.push(invalid(
            &format!("{path}.requests"),
            &json!(request_text),
            &message,
        ));
    }
    causes
}

/// `v1helper.IsOvercommitAllowed`: native resources but hugepages.
fn overcommit_allowed(resource: &str) -> bool {
    let native = !resource.contains('/') || resource.starts_with("kubernetes.io/");
    native && !resource.starts_with("hugepages-")
}

/// Where a built-in kind holds resource-name-to-quantity maps, as (field, map).
fn quantity_maps<'a>(res: &ResourceInfo, obj: &'a Value) -> Vec<(String, &'a Value)> {
    let pod_spec = |path: &str, spec: &'a Value| {
        let mut maps = vec![
            (format!("{path}.overhead"), &spec["overhead"]),
            (
                format!("{path}.resources.limits"),
                &spec["resources"]["limits"],
            ),
            (
                format!("{path}.resources.requests"),
                &spec["resources"]["requests"],
            ),
        ];
        for list in ["initContainers", "containers", "ephemeralContainers"] {
            for (i, c) in spec[list].as_array().into_iter().flatten().enumerate() {
                for which in ["limits", "requests"] {
                    maps.push((
                        format!("{path}.{list}[{i}].resources.{which}"),
                        &c["resources"][which],
                    ));
                }
            }
        }
        maps
    };
    match (res.group.as_str(), res.kind.as_str()) {
        ("", "Pod") => pod_spec("spec", &obj["spec"]),
        ("apps", "Deployment" | "ReplicaSet" | "StatefulSet" | "DaemonSet") | ("batch", "Job") => {
            pod_spec("spec.template.spec", &obj["spec"]["template"]["spec"])
        }
        ("batch", "CronJob") => pod_spec(
            "spec.jobTemplate.spec.template.spec",
            &obj["spec"]["jobTemplate"]["spec"]["template"]["spec"],
        ),
        ("", "PersistentVolumeClaim") => vec![
            (
                "spec.resources.requests".into(),
                &obj["spec"]["resources"]["requests"],
            ),
            (
                "spec.resources.limits".into(),
                &obj["spec"]["resources"]["limits"],
            ),
        ],
        ("", "ResourceQuota") => vec![
            ("spec.hard".into(), &obj["spec"]["hard"]),
            ("status.hard".into(), &obj["status"]["hard"]),
            ("status.used".into(), &obj["status"]["used"]),
        ],
        ("", "Node") => vec![
            ("status.capacity".into(), &obj["status"]["capacity"]),
            ("status.allocatable".into(), &obj["status"]["allocatable"]),
        ],
        _ => Vec::new(),
    }
}

/// kube-apiserver cannot decode a built-in object whose quantity is not of the quantity
/// grammar: 400 `Pod in version "v1" cannot be handled as a Pod: quantities must match ...`.
/// Checked at the start of validation, so a mutating webhook may see such an object first.
fn decode_quantities(res: &ResourceInfo, obj: &Value) -> ApiResult<()> {
    for (field, map) in quantity_maps(res, obj) {
        for (resource, value) in quantities(map) {
            let parsed = quantity_text(value)
                .ok_or(tandem_apimachinery::quantity::QuantityError::Format)
                .and_then(|text| Quantity::parse(&text));
            // kube's message names no field; the field is added before the decoder's words,
            // where older kube-apiservers put the decoder's path.
            if let Err(e) = parsed {
                return Err(ApiError::bad_request(format!(
                    "{kind} in version {version:?} cannot be handled as a {kind}: {field}[{resource}]: {e}",
                    kind = res.kind,
                    version = res.version,
                )));
            }
        }
    }
    Ok(())
}

/// Pod specs are immutable but for images, activeDeadlineSeconds, added tolerations and
/// removed scheduling gates; nodeName changes only through binding.
fn pod_update(old: &Value, new: &Value) -> Vec<Cause> {
    let mutable = |spec: &Value| {
        let mut s = spec.clone();
        for list in ["containers", "initContainers"] {
            for c in s[list].as_array_mut().into_iter().flatten() {
                c["image"] = Value::Null;
            }
        }
        if let Some(m) = s.as_object_mut() {
            for k in [
                "activeDeadlineSeconds",
                "tolerations",
                "schedulingGates",
                "terminationGracePeriodSeconds",
            ] {
                m.remove(k);
            }
        }
        s
    };
    let (o, n) = (&old["spec"], &new["spec"]);
    if mutable(o) == mutable(n) {
        return Vec::new();
    }
    vec![cause("spec", "FieldValueForbidden",
        "spec: Forbidden: pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)".into())]
}

fn immutable(field: &str, value: &Value) -> Cause {
    invalid(field, value, "field is immutable")
}

fn non_negative(field: &str, value: &Value) -> Option<Cause> {
    value
        .as_i64()
        .filter(|n| *n < 0)
        .map(|_| invalid(field, value, "must be greater than or equal to 0"))
}

/// A selector that must be set, non-empty, match the template's labels and never change.
fn workload_selector(path: &str, spec: &Value, old: Option<&Value>, noun: &str) -> Vec<Cause> {
    let mut causes = Vec::new();
    let selector = &spec["selector"];
    let at = format!("{path}.selector");
    if !selector.is_object() {
        causes.push(required(&at));
        return causes;
    }
    match LabelSelector::from_metav1(Some(selector)) {
        Ok(sel) if sel.is_everything() => causes.push(invalid(
            &at,
            selector,
            &format!("empty selector is invalid for {noun}"),
        )),
        Ok(sel) => {
            if !sel.matches_object(&spec["template"]) {
                let field = format!("{path}.template.metadata.labels");
                causes.push(invalid(
                    &field,
                    &spec["template"]["metadata"]["labels"],
                    "`selector` does not match template `labels`",
                ));
            }
        }
        Err(e) => causes.push(invalid(&at, selector, &e.to_string())),
    }
    if let Some(old) = old
        && old["selector"] != *selector
    {
        causes.push(immutable(&at, selector));
    }
    causes
}

/// `ValidateStatefulSetSpec`: the policies kube knows, a governing Service's name that is a
/// DNS label, and on update only the fields a StatefulSet may change.
fn stateful_set(obj: &Value, old: Option<&Value>) -> Vec<Cause> {
    let spec = &obj["spec"];
    let mut causes = Vec::new();
    if let Some(policy) = spec["podManagementPolicy"].as_str()
        && !["OrderedReady", "Parallel"].contains(&policy)
    {
        causes.push(not_supported(
            "spec.podManagementPolicy",
            &spec["podManagementPolicy"],
            &["OrderedReady", "Parallel"],
        ));
    }
    if let Some(strategy) = spec["updateStrategy"]["type"].as_str()
        && !["RollingUpdate", "OnDelete"].contains(&strategy)
    {
        causes.push(not_supported(
            "spec.updateStrategy.type",
            &spec["updateStrategy"]["type"],
            &["OnDelete", "RollingUpdate"],
        ));
    }
    if let Some(name) = spec["serviceName"].as_str().filter(|n| !n.is_empty())
        && let Err(message) = validate_dns1123_label(name)
    {
        causes.push(invalid(
            "spec.serviceName",
            &spec["serviceName"],
            &message.to_string(),
        ));
    }
    for field in ["revisionHistoryLimit", "minReadySeconds"] {
        causes.extend(non_negative(&format!("spec.{field}"), &spec[field]));
    }
    causes.extend(non_negative(
        "spec.updateStrategy.rollingUpdate.partition",
        &spec["updateStrategy"]["rollingUpdate"]["partition"],
    ));
    for which in ["whenDeleted", "whenScaled"] {
        let value = &spec["persistentVolumeClaimRetentionPolicy"][which];
        if let Some(policy) = value.as_str()
            && !["Retain", "Delete"].contains(&policy)
        {
            causes.push(not_supported(
                &format!("spec.persistentVolumeClaimRetentionPolicy.{which}"),
                value,
                &["Retain", "Delete"],
            ));
        }
    }
    if let Some(old) = old {
        // Only these may change on a StatefulSet; kube's words for anything else.
        let frozen = |spec: &Value| {
            let mut s = spec.clone();
            if let Some(m) = s.as_object_mut() {
                for k in [
                    "replicas",
                    "ordinals",
                    "template",
                    "updateStrategy",
                    "persistentVolumeClaimRetentionPolicy",
                    "minReadySeconds",
                    "revisionHistoryLimit",
                ] {
                    m.remove(k);
                }
            }
            s
        };
        if frozen(&old["spec"]) != frozen(spec) {
            causes.push(cause("spec", "FieldValueForbidden",
                "spec: Forbidden: updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'revisionHistoryLimit', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden".into()));
        }
    }
    causes
}

/// `ValidateJobSpec`: counts not negative, the pods' restart policy one that lets them
/// finish, and (for a Job, not a CronJob's template) a selector matching the template.
fn job_spec(path: &str, spec: &Value, with_selector: bool) -> Vec<Cause> {
    let mut causes = Vec::new();
    for field in [
        "parallelism",
        "completions",
        "backoffLimit",
        "activeDeadlineSeconds",
        "ttlSecondsAfterFinished",
    ] {
        causes.extend(non_negative(&format!("{path}.{field}"), &spec[field]));
    }
    if let Some(mode) = spec["completionMode"].as_str()
        && !["NonIndexed", "Indexed"].contains(&mode)
    {
        causes.push(not_supported(
            &format!("{path}.completionMode"),
            &spec["completionMode"],
            &["NonIndexed", "Indexed"],
        ));
    }
    if spec["completionMode"] == "Indexed" && spec["completions"].is_null() {
        causes.push(required(&format!("{path}.completions")));
    }
    if with_selector {
        causes.extend(workload_selector(path, spec, None, "job"));
    }
    let template_spec = &spec["template"]["spec"];
    let template_path = format!("{path}.template.spec");
    causes.extend(pod_spec(&template_path, template_spec));
    let policy_path = format!("{template_path}.restartPolicy");
    match template_spec["restartPolicy"].as_str() {
        None | Some("") => causes.push(required(&policy_path)),
        Some("OnFailure" | "Never") => {}
        Some(_) => causes.push(not_supported(
            &policy_path,
            &template_spec["restartPolicy"],
            &["OnFailure", "Never"],
        )),
    }
    causes
}

/// `ValidateJobSpecUpdate`: the selector, the pod template (but for a suspended job that
/// never started), the completion mode and, unless the job is Indexed with completions
/// following parallelism, the completions are fixed at creation.
fn job_update(old: &Value, new: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    if old["selector"] != new["selector"] {
        causes.push(immutable("spec.selector", &new["selector"]));
    }
    if old["template"] != new["template"] {
        // kube lets a suspended job that never started change its pods' scheduling and
        // labels; everything else about its template is frozen.
        let movable = |t: &Value| {
            let mut t = t.clone();
            if old["suspend"] == true
                && let Some(spec) = t["spec"].as_object_mut()
            {
                for k in ["nodeSelector", "affinity", "tolerations", "schedulingGates"] {
                    spec.remove(k);
                }
                if let Some(meta) = t["metadata"].as_object_mut() {
                    meta.remove("labels");
                    meta.remove("annotations");
                }
            }
            t
        };
        if movable(&old["template"]) != movable(&new["template"]) {
            causes.push(immutable("spec.template", &new["template"]));
        }
    }
    if old["completionMode"] != new["completionMode"] {
        causes.push(immutable("spec.completionMode", &new["completionMode"]));
    }
    let elastic = new["completionMode"] == "Indexed" && new["completions"] == new["parallelism"];
    if old["completions"] != new["completions"] && !elastic {
        causes.push(immutable("spec.completions", &new["completions"]));
    }
    causes
}

/// `ValidateCronJob`: a name that leaves room for the jobs' suffix, a schedule that parses,
/// a known concurrency policy and a valid job template.
fn cron_job(obj: &Value) -> Vec<Cause> {
    let spec = &obj["spec"];
    let mut causes = Vec::new();
    if let Some(name) = obj["metadata"]["name"].as_str()
        && name.len() > 52
    {
        causes.push(invalid(
            "metadata.name",
            &obj["metadata"]["name"],
            "must be no more than 52 characters",
        ));
    }
    match spec["schedule"].as_str().unwrap_or("") {
        "" => causes.push(required("spec.schedule")),
        schedule if schedule.contains("TZ") => causes.push(invalid(
            "spec.schedule",
            &spec["schedule"],
            "cannot use TZ or CRON_TZ in schedule, use timeZone field instead",
        )),
        schedule => {
            if let Err(e) = crate::cron::check(schedule) {
                causes.push(invalid("spec.schedule", &spec["schedule"], &e.to_string()));
            }
        }
    }
    if let Some(policy) = spec["concurrencyPolicy"].as_str()
        && !["Allow", "Forbid", "Replace"].contains(&policy)
    {
        causes.push(not_supported(
            "spec.concurrencyPolicy",
            &spec["concurrencyPolicy"],
            &["Allow", "Forbid", "Replace"],
        ));
    }
    for field in [
        "startingDeadlineSeconds",
        "successfulJobsHistoryLimit",
        "failedJobsHistoryLimit",
    ] {
        causes.extend(non_negative(&format!("spec.{field}"), &spec[field]));
    }
    causes.extend(job_spec(
        "spec.jobTemplate.spec",
        &spec["jobTemplate"]["spec"],
        false,
    ));
    causes
}

/// `ValidatePersistentVolumeClaimSpec`: access modes and a storage request.
fn claim_spec(path: &str, spec: &Value) -> Vec<Cause> {
    const MODES: &[&str] = &[
        "ReadOnlyMany",
        "ReadWriteMany",
        "ReadWriteOnce",
        "ReadWriteOncePod",
    ];
    let mut causes = Vec::new();
    let modes = spec["accessModes"].as_array().cloned().unwrap_or_default();
    if modes.is_empty() && spec["dataSourceRef"].is_null() {
        causes.push(cause(
            &format!("{path}.accessModes"),
            "FieldValueRequired",
            format!("{path}.accessModes: Required value: at least 1 access mode is required"),
        ));
    }
    for mode in &modes {
        if !mode.as_str().is_some_and(|m| MODES.contains(&m)) {
            causes.push(not_supported(&format!("{path}.accessModes"), mode, MODES));
        }
    }
    if spec["resources"]["requests"]["storage"].is_null() {
        causes.push(required(&format!("{path}.resources[storage]")));
    }
    if let Some(mode) = spec["volumeMode"].as_str()
        && !["Block", "Filesystem"].contains(&mode)
    {
        causes.push(not_supported(
            &format!("{path}.volumeMode"),
            &spec["volumeMode"],
            &["Block", "Filesystem"],
        ));
    }
    causes
}

/// `ValidatePersistentVolumeClaimUpdate`: a claim's spec is fixed, but for its volume name
/// (set once, by the binder), its attributes class, and the storage it requests once it is
/// bound (to grow the volume; never below what it asked before).
fn claim_update(old: &Value, new: &Value, bound: bool) -> Vec<Cause> {
    let mut causes = Vec::new();
    let storage = |spec: &Value| {
        quantity_text(&spec["resources"]["requests"]["storage"])
            .and_then(|t| Quantity::parse(&t).ok())
            .map(|q| q.scaled(0))
    };
    if let (Some(before), Some(after)) = (storage(old), storage(new))
        && after < before
    {
        causes.push(cause(
            "spec.resources.requests.storage",
            "FieldValueForbidden",
            "spec.resources.requests.storage: Forbidden: field can not be less than status.capacity".into(),
        ));
    }
    let volume_set_once = old["volumeName"].as_str().unwrap_or("").is_empty();
    // An unbound claim without a class may be given the default one later (the volume
    // controller's retroactive default storage class).
    let class_set_once = volume_set_once && old["storageClassName"].is_null();
    let comparable = |spec: &Value| {
        let mut s = spec.clone();
        if let Some(m) = s.as_object_mut() {
            m.remove("volumeAttributesClassName");
            if volume_set_once {
                m.remove("volumeName");
            }
            if class_set_once {
                m.remove("storageClassName");
            }
        }
        if bound && let Some(r) = s["resources"]["requests"].as_object_mut() {
            r.remove("storage");
        }
        s
    };
    if comparable(old) != comparable(new) {
        causes.push(cause("spec", "FieldValueForbidden",
            "spec: Forbidden: spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims".into()));
    }
    causes
}

/// `ValidatePodDisruptionBudgetSpec`: exactly one of minAvailable and maxUnavailable, each a
/// count or a percentage not above 100%, and a selector kube can read.
fn disruption_budget(spec: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let (min, max) = (&spec["minAvailable"], &spec["maxUnavailable"]);
    if !min.is_null() && !max.is_null() {
        causes.push(invalid(
            "spec",
            spec,
            "minAvailable and maxUnavailable cannot be both set",
        ));
    }
    for (field, value) in [("spec.minAvailable", min), ("spec.maxUnavailable", max)] {
        match value {
            Value::Null => {}
            Value::Number(n) if n.as_i64().is_some_and(|n| n < 0) => {
                causes.push(invalid(field, value, "must be greater than or equal to 0"))
            }
            Value::Number(_) => {}
            Value::String(text) => {
                let percent = text.strip_suffix('%').and_then(|p| p.parse::<i64>().ok());
                match percent {
                    None => causes.push(invalid(
                        field,
                        value,
                        "a valid percent string must be a numeric string followed by an ending '%' (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')",
                    )),
                    Some(p) if p > 100 => {
                        causes.push(invalid(field, value, "must not be greater than 100%"))
                    }
                    Some(_) => {}
                }
            }
            _ => causes.push(invalid(field, value, "must be an integer or percentage")),
        }
    }
    if spec["selector"].is_object()
        && let Err(e) = LabelSelector::from_metav1(Some(&spec["selector"]))
    {
        causes.push(invalid("spec.selector", &spec["selector"], &e.to_string()));
    }
    if let Some(policy) = spec["unhealthyPodEvictionPolicy"].as_str()
        && !["AlwaysAllow", "IfHealthyBudget"].contains(&policy)
    {
        causes.push(not_supported(
            "spec.unhealthyPodEvictionPolicy",
            &spec["unhealthyPodEvictionPolicy"],
            &["AlwaysAllow", "IfHealthyBudget"],
        ));
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(spec: Value) -> Value {
        let mut s = json!({
            "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "u"}},
            "template": {"metadata": {"labels": {"batch.kubernetes.io/controller-uid": "u"}},
                         "spec": {"restartPolicy": "Never",
                                  "containers": [{"name": "c", "image": "busybox"}]}}});
        merge(&mut s, spec);
        json!({"metadata": {"name": "j"}, "spec": s})
    }

    fn merge(into: &mut Value, from: Value) {
        match (into, from) {
            (Value::Object(into), Value::Object(from)) => {
                for (k, v) in from {
                    merge(into.entry(k).or_insert(Value::Null), v);
                }
            }
            (into, from) => *into = from,
        }
    }

    fn cron(schedule: &str) -> Value {
        json!({"metadata": {"name": "c"}, "spec": {"schedule": schedule,
            "jobTemplate": {"spec": {"template": {"spec": {"restartPolicy": "OnFailure",
                "containers": [{"name": "c", "image": "busybox"}]}}}}}})
    }

    fn stateful_set(spec: Value) -> Value {
        let mut s = json!({"serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
            "template": {"metadata": {"labels": {"app": "db"}},
                         "spec": {"restartPolicy": "Always", "containers": [{"name": "c", "image": "pg"}]}}});
        merge(&mut s, spec);
        json!({"metadata": {"name": "db"}, "spec": s})
    }

    fn claim(spec: Value) -> Value {
        let mut s = json!({"accessModes": ["ReadWriteOnce"],
                           "resources": {"requests": {"storage": "1Gi"}}});
        merge(&mut s, spec);
        json!({"metadata": {"name": "data"}, "spec": s})
    }

    fn bound(mut claim: Value) -> Value {
        claim["status"] = json!({"phase": "Bound"});
        claim
    }

    fn pdb(spec: Value) -> Value {
        let mut s = json!({"selector": {"matchLabels": {"app": "x"}}});
        merge(&mut s, spec);
        json!({"metadata": {"name": "p"}, "spec": s})
    }

    /// (group, kind, stored object on update, object written, kube's messages)
    type Case = (
        &'static str,
        &'static str,
        Option<Value>,
        Value,
        &'static [&'static str],
    );

    #[test]
    fn workload_storage_and_budget_rules_with_kubes_messages() {
        let registry = crate::registry::Registry::builtin();
        let none: &[&str] = &[];
        let cases: Vec<Case> = vec![
            ("batch", "Job", None, job(json!({})), none),
            (
                "batch",
                "Job",
                None,
                job(json!({"template": {"spec": {"restartPolicy": "Always"}}})),
                &[
                    r#"spec.template.spec.restartPolicy: Unsupported value: "Always": supported values: "OnFailure", "Never""#,
                ],
            ),
            (
                "batch",
                "Job",
                None,
                job(json!({"parallelism": -1, "completions": -2})),
                &[
                    "spec.parallelism: Invalid value: -1: must be greater than or equal to 0",
                    "spec.completions: Invalid value: -2: must be greater than or equal to 0",
                ],
            ),
            (
                "batch",
                "Job",
                None,
                job(
                    json!({"selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "other"}}}),
                ),
                &[
                    r#"spec.template.metadata.labels: Invalid value: {"batch.kubernetes.io/controller-uid":"u"}: `selector` does not match template `labels`"#,
                ],
            ),
            (
                "batch",
                "Job",
                Some(job(json!({}))),
                job(
                    json!({"template": {"spec": {"containers": [{"name": "c", "image": "nginx"}]}}}),
                ),
                &["spec.template: Invalid value: "],
            ),
            (
                "batch",
                "Job",
                Some(job(json!({}))),
                job(json!({"selector": {"matchExpressions": [
                 {"key": "batch.kubernetes.io/controller-uid", "operator": "Exists"}]}})),
                &["spec.selector: Invalid value: "],
            ),
            (
                "batch",
                "Job",
                Some(job(json!({"completions": 1}))),
                job(json!({"completions": 3})),
                &["spec.completions: Invalid value: 3: field is immutable"],
            ),
            // A suspended job's pods may still be rescheduled before it starts.
            (
                "batch",
                "Job",
                Some(job(json!({"suspend": true}))),
                job(
                    json!({"suspend": true, "template": {"spec": {"nodeSelector": {"zone": "a"}}}}),
                ),
                none,
            ),
            (
                "batch",
                "Job",
                Some(job(json!({"parallelism": 1}))),
                job(json!({"parallelism": 4})),
                none,
            ),
            ("batch", "CronJob", None, cron("*/5 * * * *"), none),
            (
                "batch",
                "CronJob",
                None,
                cron("bad"),
                &[
                    r#"spec.schedule: Invalid value: "bad": expected exactly 5 fields, found 1: [bad]"#,
                ],
            ),
            (
                "batch",
                "CronJob",
                None,
                cron(""),
                &["spec.schedule: Required value"],
            ),
            (
                "batch",
                "CronJob",
                None,
                cron("TZ=UTC 0 * * * *"),
                &[
                    r#"spec.schedule: Invalid value: "TZ=UTC 0 * * * *": cannot use TZ or CRON_TZ in schedule, use timeZone field instead"#,
                ],
            ),
            ("apps", "StatefulSet", None, stateful_set(json!({})), none),
            (
                "apps",
                "StatefulSet",
                None,
                stateful_set(json!({"template": {"metadata": {"labels": {"app": "web"}}}})),
                &[
                    r#"spec.template.metadata.labels: Invalid value: {"app":"web"}: `selector` does not match template `labels`"#,
                ],
            ),
            (
                "apps",
                "StatefulSet",
                None,
                stateful_set(json!({"serviceName": "DB_svc"})),
                &["spec.serviceName: Invalid value: \"DB_svc\": "],
            ),
            (
                "apps",
                "StatefulSet",
                None,
                stateful_set(json!({"podManagementPolicy": "Sometimes"})),
                &[
                    r#"spec.podManagementPolicy: Unsupported value: "Sometimes": supported values: "OrderedReady", "Parallel""#,
                ],
            ),
            (
                "apps",
                "StatefulSet",
                Some(stateful_set(json!({}))),
                stateful_set(json!({"replicas": 5})),
                none,
            ),
            (
                "apps",
                "StatefulSet",
                Some(stateful_set(json!({}))),
                stateful_set(json!({"serviceName": "other"})),
                &["spec: Forbidden: updates to statefulset spec for fields other than"],
            ),
            ("", "PersistentVolumeClaim", None, claim(json!({})), none),
            (
                "",
                "PersistentVolumeClaim",
                None,
                claim(json!({"accessModes": [], "resources": {"requests": {"storage": null}}})),
                &[
                    "spec.accessModes: Required value: at least 1 access mode is required",
                    "spec.resources[storage]: Required value",
                ],
            ),
            (
                "",
                "PersistentVolumeClaim",
                Some(claim(json!({}))),
                claim(json!({"resources": {"requests": {"storage": "2Gi"}}})),
                &["spec: Forbidden: spec is immutable after creation"],
            ),
            (
                "",
                "PersistentVolumeClaim",
                Some(bound(claim(json!({"volumeName": "pv-1"})))),
                bound(claim(
                    json!({"volumeName": "pv-1", "resources": {"requests": {"storage": "2Gi"}}}),
                )),
                none,
            ),
            (
                "",
                "PersistentVolumeClaim",
                Some(claim(json!({}))),
                claim(json!({"volumeName": "pv-1"})),
                none,
            ),
            (
                "",
                "PersistentVolumeClaim",
                Some(claim(json!({}))),
                claim(json!({"storageClassName": "standard"})),
                none,
            ),
            (
                "",
                "PersistentVolumeClaim",
                Some(claim(json!({"storageClassName": "standard"}))),
                claim(json!({"storageClassName": "fast"})),
                &["spec: Forbidden: spec is immutable after creation"],
            ),
            (
                "",
                "PersistentVolumeClaim",
                Some(claim(json!({"volumeName": "pv-1"}))),
                claim(json!({"volumeName": "pv-2"})),
                &["spec: Forbidden: spec is immutable after creation"],
            ),
            (
                "",
                "PersistentVolumeClaim",
                Some(claim(json!({}))),
                claim(json!({"accessModes": ["ReadWriteMany"]})),
                &["spec: Forbidden: spec is immutable after creation"],
            ),
            (
                "",
                "PersistentVolumeClaim",
                Some(bound(claim(
                    json!({"resources": {"requests": {"storage": "2Gi"}}}),
                ))),
                bound(claim(json!({}))),
                &[
                    "spec.resources.requests.storage: Forbidden: field can not be less than status.capacity",
                ],
            ),
            (
                "policy",
                "PodDisruptionBudget",
                None,
                pdb(json!({"minAvailable": 1})),
                none,
            ),
            (
                "policy",
                "PodDisruptionBudget",
                None,
                pdb(json!({"maxUnavailable": "50%"})),
                none,
            ),
            (
                "policy",
                "PodDisruptionBudget",
                None,
                pdb(json!({"minAvailable": 1, "maxUnavailable": 1})),
                &["spec: Invalid value: "],
            ),
            (
                "policy",
                "PodDisruptionBudget",
                None,
                pdb(json!({"minAvailable": "150%"})),
                &[r#"spec.minAvailable: Invalid value: "150%": must not be greater than 100%"#],
            ),
        ];
        for (group, kind, old, obj, want) in cases {
            let res = registry.by_kind(group, kind).expect("served");
            let got: Vec<String> = builtin(&res, old.as_ref(), &obj)
                .into_iter()
                .map(|(_, _, message)| message)
                .collect();
            assert_eq!(got.len(), want.len(), "{kind} {obj}: {got:#?}");
            for (message, start) in got.iter().zip(want) {
                assert!(
                    message.starts_with(start),
                    "{kind} {obj}: {message:?} is not {start:?}"
                );
            }
        }
    }
}
