//! Built-in defaulting that clients rely on (pods, services, workloads, namespaces, secrets),
//! ClusterIP allocation, and schema defaulting of custom resources.

use std::net::Ipv4Addr;

use base64::Engine;
use serde_json::{Map, Value, json};

use crate::error::{ApiError, ApiResult};
use crate::registry::ResourceInfo;
use crate::state::State;

fn default(obj: &mut Map<String, Value>, key: &str, value: Value) {
    if obj.get(key).is_none_or(Value::is_null) {
        obj.insert(key.to_string(), value);
    }
}

fn object_at<'a>(v: &'a mut Value, key: &str) -> &'a mut Map<String, Value> {
    if !v[key].is_object() {
        v[key] = json!({});
    }
    v[key].as_object_mut().expect("just made an object")
}

/// Defaults of a PodSpec (also inside workload templates).
pub fn pod_spec(spec: &mut Value) {
    let Some(map) = spec.as_object_mut() else {
        return;
    };
    default(map, "restartPolicy", json!("Always"));
    default(map, "terminationGracePeriodSeconds", json!(30));
    default(map, "dnsPolicy", json!("ClusterFirst"));
    default(map, "securityContext", json!({}));
    default(map, "schedulerName", json!("default-scheduler"));
    default(map, "enableServiceLinks", json!(true));
    default(map, "preemptionPolicy", json!("PreemptLowerPriority"));
    for key in ["containers", "initContainers"] {
        for c in map
            .get_mut(key)
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            let Some(c) = c.as_object_mut() else { continue };
            let image = c.get("image").and_then(Value::as_str).unwrap_or("");
            let last = image.rsplit('/').next().unwrap_or(image);
            let latest = !last.contains(':') || last.ends_with(":latest");
            let untagged_digest = image.contains('@');
            default(
                c,
                "imagePullPolicy",
                json!(if latest && !untagged_digest {
                    "Always"
                } else {
                    "IfNotPresent"
                }),
            );
            default(c, "terminationMessagePath", json!("/dev/termination-log"));
            default(c, "terminationMessagePolicy", json!("File"));
            default(c, "resources", json!({}));
            for p in c
                .get_mut("ports")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                if let Some(p) = p.as_object_mut() {
                    default(p, "protocol", json!("TCP"));
                }
            }
        }
    }
}

fn pod_template(obj: &mut Value) {
    if obj["spec"]["template"]["spec"].is_object() {
        pod_spec(&mut obj["spec"]["template"]["spec"]);
    }
}

/// Fills defaults for `obj` of resource `res`; `old` is the stored object on updates.
pub fn apply(
    state: &State,
    res: &ResourceInfo,
    obj: &mut Value,
    old: Option<&Value>,
) -> ApiResult<()> {
    if let Some(custom) = &res.custom {
        if let Some(schema) = &custom.schema {
            tandem_apimachinery::schema::apply_defaults(obj, schema);
        }
        return Ok(());
    }
    match (res.group.as_str(), res.kind.as_str()) {
        ("", "Service") => service(state, obj, old)?,
        ("", "PersistentVolumeClaim") => {
            builtin(res, obj, old);
            if old.is_none() {
                default_storage_class(state, obj);
            }
        }
        _ => builtin(res, obj, old),
    }
    Ok(())
}

/// The defaults of built-in kinds that need nothing but the object.
fn builtin(res: &ResourceInfo, obj: &mut Value, old: Option<&Value>) {
    match (res.group.as_str(), res.kind.as_str()) {
        ("", "Pod") => {
            let Some(spec) = obj.get_mut("spec") else {
                return;
            };
            pod_spec(spec);
            let spec = object_at(obj, "spec");
            default(spec, "serviceAccountName", json!("default"));
            default(spec, "priority", json!(0));
            // The DefaultTolerationSeconds admission plugin: evict after 5 minutes.
            let tolerations = spec.entry("tolerations").or_insert_with(|| json!([]));
            if let Some(list) = tolerations.as_array_mut() {
                for key in [
                    "node.kubernetes.io/not-ready",
                    "node.kubernetes.io/unreachable",
                ] {
                    if !list.iter().any(|t| {
                        t["key"] == key && (t["effect"] == "NoExecute" || t["effect"].is_null())
                    }) {
                        list.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
                    }
                }
            }
            if old.is_none() {
                let status = object_at(obj, "status");
                default(status, "phase", json!("Pending"));
                default(status, "qosClass", json!("BestEffort"));
            }
        }
        ("", "Namespace") => {
            let name = obj["metadata"]["name"].as_str().unwrap_or("").to_string();
            let meta = object_at(obj, "metadata");
            let labels = meta.entry("labels").or_insert_with(|| json!({}));
            if let Some(labels) = labels.as_object_mut() {
                labels.insert("kubernetes.io/metadata.name".into(), json!(name));
            }
            if old.is_none() {
                default(object_at(obj, "spec"), "finalizers", json!(["kubernetes"]));
                default(object_at(obj, "status"), "phase", json!("Active"));
            }
        }
        ("", "Secret") => {
            let map = obj.as_object_mut().expect("objects are maps");
            default(map, "type", json!("Opaque"));
            // stringData is write-only: it is merged into data, base64 encoded.
            if let Some(Value::Object(string_data)) = map.remove("stringData") {
                let data = map.entry("data").or_insert_with(|| json!({}));
                for (k, v) in string_data {
                    let text = v.as_str().unwrap_or_default().to_string();
                    data[k.as_str()] =
                        json!(base64::engine::general_purpose::STANDARD.encode(text));
                }
            }
        }
        ("apps", "Deployment") => {
            let spec = object_at(obj, "spec");
            default(spec, "replicas", json!(1));
            default(spec, "revisionHistoryLimit", json!(10));
            default(spec, "progressDeadlineSeconds", json!(600));
            default(spec, "strategy", json!({"type": "RollingUpdate"}));
            if spec["strategy"]["type"] == "RollingUpdate" {
                let ru = object_at(&mut spec["strategy"], "rollingUpdate");
                default(ru, "maxUnavailable", json!("25%"));
                default(ru, "maxSurge", json!("25%"));
            }
            pod_template(obj);
        }
        ("apps", "ReplicaSet") => {
            default(object_at(obj, "spec"), "replicas", json!(1));
            pod_template(obj);
        }
        ("apps", "StatefulSet") => {
            stateful_set(obj);
            if old.is_none() {
                zero_status(obj, &["replicas", "availableReplicas"]);
            }
        }
        ("policy", "PodDisruptionBudget") if old.is_none() => zero_status(
            obj,
            &[
                "disruptionsAllowed",
                "currentHealthy",
                "desiredHealthy",
                "expectedPods",
            ],
        ),
        ("apps", "DaemonSet") => {
            let spec = object_at(obj, "spec");
            default(spec, "revisionHistoryLimit", json!(10));
            default(spec, "updateStrategy", json!({"type": "RollingUpdate"}));
            if spec["updateStrategy"]["type"] == "RollingUpdate" {
                let ru = object_at(&mut spec["updateStrategy"], "rollingUpdate");
                default(ru, "maxUnavailable", json!(1));
                default(ru, "maxSurge", json!(0));
            }
            pod_template(obj);
            if old.is_none() {
                zero_status(
                    obj,
                    &[
                        "currentNumberScheduled",
                        "numberMisscheduled",
                        "desiredNumberScheduled",
                        "numberReady",
                    ],
                );
            }
        }
        ("batch", "Job") => job(obj, old.is_none()),
        ("batch", "CronJob") => {
            let spec = object_at(obj, "spec");
            default(spec, "concurrencyPolicy", json!("Allow"));
            default(spec, "suspend", json!(false));
            default(spec, "successfulJobsHistoryLimit", json!(3));
            default(spec, "failedJobsHistoryLimit", json!(1));
            if obj["spec"]["jobTemplate"]["spec"].is_object() {
                failure_policy_defaults(&mut obj["spec"]["jobTemplate"]["spec"]);
            }
            let template = &mut obj["spec"]["jobTemplate"]["spec"]["template"]["spec"];
            if template.is_object() {
                pod_spec(template);
            }
        }
        ("", "PersistentVolumeClaim") => persistent_volume_claim(obj),
        ("", "PersistentVolume") => {
            let spec = object_at(obj, "spec");
            default(spec, "persistentVolumeReclaimPolicy", json!("Retain"));
            default(spec, "volumeMode", json!("Filesystem"));
            if old.is_none() {
                default(object_at(obj, "status"), "phase", json!("Pending"));
            }
        }
        ("storage.k8s.io", "StorageClass") => {
            let map = obj.as_object_mut().expect("objects are maps");
            default(map, "reclaimPolicy", json!("Delete"));
            default(map, "volumeBindingMode", json!("Immediate"));
        }
        _ => {}
    }
}

/// A new object's status as kube renders its empty Go struct: counters without `omitempty`
/// are written as 0.
fn zero_status(obj: &mut Value, counters: &[&str]) {
    let status = object_at(obj, "status");
    for counter in counters {
        default(status, counter, json!(0));
    }
}

/// `SetDefaults_PersistentVolumeClaim` (also applied to StatefulSet volumeClaimTemplates).
fn persistent_volume_claim(obj: &mut Value) {
    default(object_at(obj, "spec"), "volumeMode", json!("Filesystem"));
    default(object_at(obj, "status"), "phase", json!("Pending"));
}

/// `SetDefaults_StatefulSet` and the PVC defaults of its volumeClaimTemplates.
fn stateful_set(obj: &mut Value) {
    let spec = object_at(obj, "spec");
    default(spec, "replicas", json!(1));
    default(spec, "podManagementPolicy", json!("OrderedReady"));
    default(spec, "revisionHistoryLimit", json!(10));
    default(spec, "updateStrategy", json!({"type": "RollingUpdate"}));
    if spec["updateStrategy"]["type"] == "RollingUpdate" {
        default(
            object_at(&mut spec["updateStrategy"], "rollingUpdate"),
            "partition",
            json!(0),
        );
    }
    default(spec, "persistentVolumeClaimRetentionPolicy", json!({}));
    if let Some(retention) = spec["persistentVolumeClaimRetentionPolicy"].as_object_mut() {
        default(retention, "whenDeleted", json!("Retain"));
        default(retention, "whenScaled", json!("Retain"));
    }
    for claim in spec
        .get_mut("volumeClaimTemplates")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        if claim.is_object() {
            persistent_volume_claim(claim);
        }
    }
    pod_template(obj);
}

/// `SetDefaults_Job`, and on create the selector kube's job strategy generates
/// (`generateSelector`): the template is labelled with the job's name and uid, and the
/// selector picks the uid, so that the job's pods are its alone.
fn job(obj: &mut Value, create: bool) {
    let spec = object_at(obj, "spec");
    if spec.get("completions").is_none_or(Value::is_null)
        && spec.get("parallelism").is_none_or(Value::is_null)
    {
        spec.insert("completions".into(), json!(1));
    }
    default(spec, "parallelism", json!(1));
    // With a backoff limit per index, the job-wide one stops counting.
    let per_index = spec
        .get("backoffLimitPerIndex")
        .is_some_and(|b| !b.is_null());
    default(
        spec,
        "backoffLimit",
        json!(if per_index { i32::MAX } else { 6 }),
    );
    default(spec, "completionMode", json!("NonIndexed"));
    default(spec, "suspend", json!(false));
    default(spec, "manualSelector", json!(false));
    let replacement = if spec.get("podFailurePolicy").is_some_and(|p| !p.is_null()) {
        "Failed"
    } else {
        "TerminatingOrFailed"
    };
    default(spec, "podReplacementPolicy", json!(replacement));
    if create && spec["manualSelector"] != true {
        let name = obj["metadata"]["name"].clone();
        let uid = obj["metadata"]["uid"].clone();
        let template_meta = object_at(&mut obj["spec"]["template"], "metadata");
        let labels = template_meta.entry("labels").or_insert_with(|| json!({}));
        if let Some(labels) = labels.as_object_mut() {
            for key in [LEGACY_JOB_NAME, JOB_NAME] {
                default(labels, key, name.clone());
            }
            for key in [LEGACY_CONTROLLER_UID, CONTROLLER_UID] {
                default(labels, key, uid.clone());
            }
        }
        let selector = object_at(&mut obj["spec"], "selector");
        let match_labels = selector.entry("matchLabels").or_insert_with(|| json!({}));
        if let Some(match_labels) = match_labels.as_object_mut() {
            default(match_labels, CONTROLLER_UID, uid);
        }
    }
    // A job without labels of its own takes its template's.
    let template_labels = obj["spec"]["template"]["metadata"]["labels"].clone();
    if template_labels.is_object()
        && obj["metadata"]["labels"]
            .as_object()
            .is_none_or(Map::is_empty)
    {
        object_at(obj, "metadata").insert("labels".into(), template_labels);
    }
    failure_policy_defaults(&mut obj["spec"]);
    pod_template(obj);
}

/// `SetDefaults_PodFailurePolicyOnPodConditionsPattern`: a pod condition pattern without a
/// status matches the condition being True (in Jobs and CronJobs' job templates).
fn failure_policy_defaults(job_spec: &mut Value) {
    for rule in job_spec["podFailurePolicy"]["rules"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        for pattern in rule["onPodConditions"].as_array_mut().into_iter().flatten() {
            if let Some(pattern) = pattern.as_object_mut() {
                default(pattern, "status", json!("True"));
            }
        }
    }
}

/// Labels kube's job strategy puts on a job's pod template.
pub const CONTROLLER_UID: &str = "batch.kubernetes.io/controller-uid";
/// The job's name, on its pod template.
pub const JOB_NAME: &str = "batch.kubernetes.io/job-name";
const LEGACY_CONTROLLER_UID: &str = "controller-uid";
const LEGACY_JOB_NAME: &str = "job-name";

/// The annotation that makes a StorageClass the default one.
pub const DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";
const BETA_DEFAULT_CLASS: &str = "storageclass.beta.kubernetes.io/is-default-class";

/// The DefaultStorageClass admission plugin: a claim created without `storageClassName`
/// gets the default class (the newest, when several are marked). An explicit `""` asks for
/// no class and is kept.
fn default_storage_class(state: &State, obj: &mut Value) {
    if obj["spec"]
        .get("storageClassName")
        .is_some_and(|c| !c.is_null())
    {
        return;
    }
    let (_, classes) = state
        .store
        .list("storage.k8s.io/storageclasses", None, None);
    let default_class = classes
        .iter()
        .map(|d| d.value())
        .filter(|c| {
            [DEFAULT_CLASS, BETA_DEFAULT_CLASS]
                .iter()
                .any(|a| c["metadata"]["annotations"][a] == "true")
        })
        .max_by(|a, b| {
            let created = |c: &Value| {
                c["metadata"]["creationTimestamp"]
                    .as_str()
                    .map(str::to_string)
            };
            created(a).cmp(&created(b)).then_with(|| {
                b["metadata"]["name"]
                    .as_str()
                    .cmp(&a["metadata"]["name"].as_str())
            })
        });
    if let Some(class) = default_class {
        object_at(obj, "spec").insert("storageClassName".into(), class["metadata"]["name"].clone());
    }
}

fn service(state: &State, obj: &mut Value, old: Option<&Value>) -> ApiResult<()> {
    let spec = object_at(obj, "spec");
    default(spec, "type", json!("ClusterIP"));
    default(spec, "sessionAffinity", json!("None"));
    default(spec, "internalTrafficPolicy", json!("Cluster"));
    for p in spec
        .get_mut("ports")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        if let Some(p) = p.as_object_mut() {
            default(p, "protocol", json!("TCP"));
            let port = p.get("port").cloned().unwrap_or(Value::Null);
            default(p, "targetPort", port);
        }
    }
    let kind = spec["type"].as_str().unwrap_or("ClusterIP").to_string();
    if kind == "ExternalName" {
        return Ok(());
    }
    let old_ip = old
        .and_then(|o| o["spec"]["clusterIP"].as_str())
        .map(str::to_string);
    let requested = spec
        .get("clusterIP")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let ip = match (old_ip, requested.as_str()) {
        (Some(ip), "") => ip,
        (Some(ip), r) if r == ip => ip,
        (Some(ip), _) => {
            return Err(ApiError::invalid_field(
                "",
                "Service",
                obj["metadata"]["name"].as_str().unwrap_or(""),
                "spec.clusterIPs[0]",
                &format!("Invalid value: []string{{{ip:?}}}: may not change once set"),
            ));
        }
        (None, "None") => "None".to_string(),
        (None, "") => allocate_cluster_ip(state)?,
        (None, r) => r.to_string(),
    };
    let spec = object_at(obj, "spec");
    spec.insert("clusterIP".into(), json!(ip));
    spec.insert("clusterIPs".into(), json!([ip]));
    default(spec, "ipFamilies", json!(["IPv4"]));
    default(spec, "ipFamilyPolicy", json!("SingleStack"));
    node_ports(state, obj, old)
}

/// kube-apiserver's `--service-node-port-range` default.
const NODE_PORTS: std::ops::RangeInclusive<i64> = 30000..=32767;

/// The node ports of a NodePort or LoadBalancer Service, as kube-apiserver allocates them: a
/// port that names none keeps the one it had (same port and protocol) or gets a free one from
/// [`NODE_PORTS`]; one named must be in the range and not another Service's. A
/// LoadBalancer Service with `externalTrafficPolicy: Local` gets a health check node port
/// too. Another type holds none.
fn node_ports(state: &State, obj: &mut Value, old: Option<&Value>) -> ApiResult<()> {
    let name = obj["metadata"]["name"].as_str().unwrap_or("").to_string();
    let namespace = obj["metadata"]["namespace"].as_str().unwrap_or("");
    let me = format!("{namespace}/{name}");
    let spec = object_at(obj, "spec");
    let kind = spec["type"].as_str().unwrap_or("ClusterIP").to_string();
    let balanced = kind == "LoadBalancer";
    if balanced {
        default(spec, "allocateLoadBalancerNodePorts", json!(true));
    }
    let wants =
        kind == "NodePort" || balanced && spec["allocateLoadBalancerNodePorts"] != json!(false);
    if kind == "NodePort" || balanced {
        default(spec, "externalTrafficPolicy", json!("Cluster"));
    } else {
        spec.remove("externalTrafficPolicy");
        spec.remove("healthCheckNodePort");
        for p in spec
            .get_mut("ports")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            if let Some(p) = p.as_object_mut() {
                p.remove("nodePort");
            }
        }
        return Ok(());
    }
    // Every node port another Service holds.
    let (_, services) = state.store.list("/services", None, None);
    let mut used: std::collections::HashSet<i64> = std::collections::HashSet::new();
    for d in &services {
        let v = d.value();
        let m = &v["metadata"];
        if format!(
            "{}/{}",
            m["namespace"].as_str().unwrap_or(""),
            m["name"].as_str().unwrap_or("")
        ) == me
        {
            continue;
        }
        let s = &v["spec"];
        used.extend(
            s["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p["nodePort"].as_i64()),
        );
        used.extend(s["healthCheckNodePort"].as_i64());
    }
    let old_ports: Vec<Value> = old
        .and_then(|o| o["spec"]["ports"].as_array().cloned())
        .unwrap_or_default();
    let invalid = |field: String, message: String| {
        ApiError::invalid_field("", "Service", &name, &field, &message)
    };
    let mut mine: std::collections::HashSet<i64> = std::collections::HashSet::new();
    let mut free = NODE_PORTS.filter(|p| !used.contains(p));
    let ports = spec.get_mut("ports").and_then(Value::as_array_mut);
    for (i, p) in ports.into_iter().flatten().enumerate() {
        let asked = p["nodePort"].as_i64().filter(|n| *n != 0);
        let kept = old_ports
            .iter()
            .find(|o| o["port"] == p["port"] && o["protocol"] == p["protocol"])
            .and_then(|o| o["nodePort"].as_i64());
        let port = match asked.or(kept) {
            Some(n) if !NODE_PORTS.contains(&n) => {
                return Err(invalid(
                    format!("spec.ports[{i}].nodePort"),
                    format!(
                        "Invalid value: {n}: provided port is not in the valid range. The range of valid ports is {}-{}",
                        NODE_PORTS.start(),
                        NODE_PORTS.end()
                    ),
                ));
            }
            Some(n) if used.contains(&n) => {
                return Err(invalid(
                    format!("spec.ports[{i}].nodePort"),
                    format!("Invalid value: {n}: provided port is already allocated"),
                ));
            }
            Some(n) => n,
            None if !wants => continue,
            // One port number may serve two protocols of the same Service (kube's allocator
            // allows that too); a new one is never one this Service already holds.
            None => free.by_ref().find(|n| !mine.contains(n)).ok_or_else(|| {
                ApiError::internal("failed to allocate a nodePort: range is full")
            })?,
        };
        mine.insert(port);
        p["nodePort"] = json!(port);
    }
    if balanced
        && spec["externalTrafficPolicy"] == "Local"
        && spec["healthCheckNodePort"].as_i64().is_none()
    {
        let kept = old.and_then(|o| o["spec"]["healthCheckNodePort"].as_i64());
        let port = match kept {
            Some(n) => n,
            None => free.find(|n| !mine.contains(n)).ok_or_else(|| {
                ApiError::internal("failed to allocate a nodePort: range is full")
            })?,
        };
        spec.insert("healthCheckNodePort".into(), json!(port));
    }
    Ok(())
}

fn parse_cidr(cidr: &str) -> Option<(u32, u32)> {
    let (ip, len) = cidr.split_once('/')?;
    let ip: Ipv4Addr = ip.parse().ok()?;
    let len: u32 = len.parse().ok().filter(|l| *l <= 30)?;
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    Some((u32::from(ip) & mask, 1 << (32 - len)))
}

/// A free ClusterIP from the service CIDR (the first usable address is kept for `kubernetes`).
fn allocate_cluster_ip(state: &State) -> ApiResult<String> {
    let (base, size) = parse_cidr(&state.config.service_cidr).ok_or_else(|| {
        ApiError::internal(format!(
            "service CIDR {} is not a valid IPv4 CIDR",
            state.config.service_cidr
        ))
    })?;
    let (_, services) = state.store.list("/services", None, None);
    let used: std::collections::HashSet<String> = services
        .iter()
        .filter_map(|d| d.value()["spec"]["clusterIP"].as_str().map(str::to_string))
        .collect();
    use rand::Rng;
    let mut rng = rand::rng();
    for _ in 0..size.min(4096) {
        let offset = rng.random_range(10..size - 1);
        let ip = Ipv4Addr::from(base + offset).to_string();
        if !used.contains(&ip) {
            return Ok(ip);
        }
    }
    (2..size - 1)
        .map(|o| Ipv4Addr::from(base + o).to_string())
        .find(|ip| !used.contains(ip))
        .ok_or_else(|| ApiError::internal("failed to allocate a serviceIP: range is full"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_spec_defaults() {
        let mut spec = json!({"containers": [
            {"name": "a", "image": "nginx"}, {"name": "b", "image": "reg:5000/app:1.2", "ports": [{"containerPort": 80}]},
            {"name": "c", "image": "busybox:latest", "imagePullPolicy": "Never"}]});
        pod_spec(&mut spec);
        let c = &spec["containers"];
        assert_eq!(c[0]["imagePullPolicy"], "Always");
        assert_eq!(c[1]["imagePullPolicy"], "IfNotPresent");
        assert_eq!(c[2]["imagePullPolicy"], "Never");
        assert_eq!(c[1]["ports"][0]["protocol"], "TCP");
        assert_eq!(spec["restartPolicy"], "Always");
        assert_eq!(spec["terminationGracePeriodSeconds"], 30);
    }

    /// Fails unless every field of `want` is in `got` with the same value.
    fn assert_has(what: &str, path: &str, want: &Value, got: &Value) {
        match (want, got) {
            (Value::Object(w), Value::Object(g)) => {
                for (k, v) in w {
                    assert_has(
                        what,
                        &format!("{path}.{k}"),
                        v,
                        g.get(k).unwrap_or(&Value::Null),
                    );
                }
            }
            (Value::Array(w), Value::Array(g)) if w.len() == g.len() => {
                for (i, (v, x)) in w.iter().zip(g).enumerate() {
                    assert_has(what, &format!("{path}[{i}]"), v, x);
                }
            }
            _ => assert_eq!(want, got, "{what}: {path} in {got}"),
        }
    }

    #[test]
    fn workload_and_storage_defaults_as_kube_apiserver_sets_them() {
        let registry = crate::registry::Registry::builtin();
        let template = json!({"metadata": {"labels": {"app": "x"}},
                              "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
        let pod_defaults = json!({"dnsPolicy": "ClusterFirst", "schedulerName": "default-scheduler",
            "terminationGracePeriodSeconds": 30,
            "containers": [{"imagePullPolicy": "Always", "terminationMessagePolicy": "File"}]});
        // (group, kind, object as sent, create?, what the stored object holds)
        let cases: Vec<(&str, &str, Value, bool, Value)> = vec![
            (
                "batch",
                "Job",
                json!({"metadata": {"name": "j", "uid": "u1"}, "spec": {"template": template}}),
                true,
                json!({"metadata": {"labels": {"app": "x", "job-name": "j", "controller-uid": "u1",
                        "batch.kubernetes.io/job-name": "j", "batch.kubernetes.io/controller-uid": "u1"}},
                    "spec": {"parallelism": 1, "completions": 1, "backoffLimit": 6,
                        "completionMode": "NonIndexed", "suspend": false, "manualSelector": false,
                        "podReplacementPolicy": "TerminatingOrFailed",
                        "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "u1"}},
                        "template": {"metadata": {"labels": {"app": "x", "job-name": "j",
                            "controller-uid": "u1", "batch.kubernetes.io/job-name": "j",
                            "batch.kubernetes.io/controller-uid": "u1"}},
                            "spec": pod_defaults.clone()}}}),
            ),
            // Parallelism alone leaves completions unset (a work queue); a failure policy
            // makes replacements wait for pods to fail.
            (
                "batch",
                "Job",
                json!({"metadata": {"name": "q", "uid": "u2", "labels": {"team": "a"}},
                    "spec": {"parallelism": 5, "podFailurePolicy": {"rules": []}, "template": template}}),
                true,
                json!({"metadata": {"labels": {"team": "a"}},
                    "spec": {"parallelism": 5, "completions": null, "podReplacementPolicy": "Failed"}}),
            ),
            (
                "batch",
                "Job",
                json!({"metadata": {"name": "i", "uid": "u4"},
                    "spec": {"completions": 3, "completionMode": "Indexed", "backoffLimitPerIndex": 1,
                             "podFailurePolicy": {"rules": [{"action": "Ignore",
                                 "onPodConditions": [{"type": "DisruptionTarget"}]}]},
                             "template": template}}),
                true,
                json!({"spec": {"backoffLimit": i32::MAX, "parallelism": 1,
                    "podFailurePolicy": {"rules": [{"onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]}}}),
            ),
            // A manual selector is the user's: nothing generated.
            (
                "batch",
                "Job",
                json!({"metadata": {"name": "m", "uid": "u3"},
                    "spec": {"manualSelector": true, "selector": {"matchLabels": {"app": "x"}},
                             "template": template}}),
                true,
                json!({"spec": {"selector": {"matchLabels": {"app": "x"}},
                             "template": {"metadata": {"labels": {"app": "x", "job-name": null}}}}}),
            ),
            (
                "batch",
                "CronJob",
                json!({"spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": template}}}}),
                true,
                json!({"spec": {"concurrencyPolicy": "Allow", "suspend": false,
                    "successfulJobsHistoryLimit": 3, "failedJobsHistoryLimit": 1,
                    // The job template is not a Job: no job defaults, only pod ones.
                    "jobTemplate": {"spec": {"backoffLimit": null,
                        "template": {"spec": pod_defaults.clone()}}}}}),
            ),
            (
                "apps",
                "StatefulSet",
                json!({"spec": {"template": template,
                    "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {}}]}}),
                true,
                json!({"spec": {"replicas": 1, "podManagementPolicy": "OrderedReady",
                    "revisionHistoryLimit": 10,
                    "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}},
                    "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
                    "volumeClaimTemplates": [{"spec": {"volumeMode": "Filesystem"}, "status": {"phase": "Pending"}}],
                    "template": {"spec": pod_defaults.clone()}},
                    "status": {"replicas": 0, "availableReplicas": 0}}),
            ),
            (
                "apps",
                "StatefulSet",
                json!({"spec": {"updateStrategy": {"type": "OnDelete"}, "template": template}}),
                true,
                json!({"spec": {"updateStrategy": {"type": "OnDelete", "rollingUpdate": null}}}),
            ),
            (
                "apps",
                "DaemonSet",
                json!({"spec": {"template": template}}),
                true,
                json!({"spec": {"revisionHistoryLimit": 10,
                    "updateStrategy": {"type": "RollingUpdate",
                        "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}},
                    "template": {"spec": pod_defaults.clone()}},
                    "status": {"currentNumberScheduled": 0, "numberMisscheduled": 0,
                               "desiredNumberScheduled": 0, "numberReady": 0}}),
            ),
            (
                "",
                "PersistentVolumeClaim",
                json!({"spec": {"accessModes": ["ReadWriteOnce"]}}),
                true,
                json!({"spec": {"volumeMode": "Filesystem"}, "status": {"phase": "Pending"}}),
            ),
            (
                "",
                "PersistentVolume",
                json!({"spec": {"capacity": {"storage": "1Gi"}}}),
                true,
                json!({"spec": {"persistentVolumeReclaimPolicy": "Retain", "volumeMode": "Filesystem"},
                    "status": {"phase": "Pending"}}),
            ),
            // An update keeps the phase the binder set.
            (
                "",
                "PersistentVolume",
                json!({"spec": {"persistentVolumeReclaimPolicy": "Delete"}, "status": {"phase": "Bound"}}),
                false,
                json!({"spec": {"persistentVolumeReclaimPolicy": "Delete"}, "status": {"phase": "Bound"}}),
            ),
            (
                "storage.k8s.io",
                "StorageClass",
                json!({"provisioner": "lab"}),
                true,
                json!({"reclaimPolicy": "Delete", "volumeBindingMode": "Immediate"}),
            ),
            (
                "policy",
                "PodDisruptionBudget",
                json!({"spec": {"minAvailable": 1}}),
                true,
                json!({"status": {"disruptionsAllowed": 0, "currentHealthy": 0,
                               "desiredHealthy": 0, "expectedPods": 0}}),
            ),
        ];
        for (group, kind, mut obj, create, want) in cases {
            let res = registry.by_kind(group, kind).expect("served");
            let old = (!create).then(|| obj.clone());
            builtin(&res, &mut obj, old.as_ref());
            assert_has(kind, "", &want, &obj);
            // Defaults run twice around mutating admission: the second pass changes nothing.
            let once = obj.clone();
            builtin(&res, &mut obj, old.as_ref());
            assert_eq!(once, obj, "{kind}: defaulting twice changes the object");
        }
    }

    #[test]
    fn cidr_parsing() {
        assert_eq!(parse_cidr("10.96.0.0/12"), Some((0x0a60_0000, 1 << 20)));
        assert_eq!(parse_cidr("10.96.0.7/24"), Some((0x0a60_0000, 256)));
        assert_eq!(parse_cidr("nonsense"), None);
        assert_eq!(parse_cidr("10.0.0.0/31"), None);
    }
}
