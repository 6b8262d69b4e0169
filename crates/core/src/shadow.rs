//! Offloaded pods, pure: the translation of a consumer pod into the spec of its shadow pod, the
//! translation of the real pod's status back into the consumer's view (pod IPs remapped) and the
//! resource accounting of the provider's quota (its pod admission is `pod_admission`).
//!
//! Pods are `serde_json::Value`s in their Kubernetes JSON form, so this module needs no kube.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::{Map, Value, json};
use tandem_apimachinery::quantity::Quantity;

/// Annotation on a shadow pod (and its real pod): the UID of the consumer pod it stands for.
pub const ORIGIN_UID_ANNOTATION: &str = "tandem.dev/origin-uid";

/// Node label keys that only make sense in the consumer (they select virtual nodes).
pub struct VirtualNodeKeys<'a> {
    /// Label keys whose node-affinity requirements and nodeSelector entries are dropped.
    pub label_keys: &'a [&'a str],
    /// Taint keys whose tolerations are dropped.
    pub taint_keys: &'a [&'a str],
}

/// The `ShadowPodSpec` JSON (`labels`, `annotations`, `pod`) for a consumer pod.
///
/// Stripped: `nodeName`; tolerations of virtual-node taints; node-affinity requirements and
/// nodeSelector entries on virtual-node labels (terms left empty are dropped).
///
/// Service-account tokens: an offloaded pod gets **no consumer API token**. The consumer's
/// token would let code in another cluster act in the consumer, and the provider's token for
/// the twin namespace's `default` ServiceAccount would point at the wrong cluster. So
/// `automountServiceAccountToken` is false, `serviceAccountName` is dropped, and projected
/// token volumes (`kube-api-access-*`) and their mounts are removed.
///
/// Takes the pod by value: its labels, annotations and spec move into the result (called once
/// per offloaded pod).
pub fn shadow_spec(pod: Value, keys: &VirtualNodeKeys<'_>) -> Value {
    let Value::Object(mut pod) = pod else {
        return shadow_spec(json!({}), keys);
    };
    let mut meta = match pod.remove("metadata") {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    let labels = meta.remove("labels").unwrap_or(Value::Null);
    let mut annotations = match meta.remove("annotations") {
        Some(Value::Object(a)) => a,
        _ => Map::new(),
    };
    annotations.insert(
        ORIGIN_UID_ANNOTATION.into(),
        meta.remove("uid").unwrap_or(Value::Null),
    );
    let mut spec = match pod.remove("spec") {
        Some(Value::Object(s)) => s,
        _ => Map::new(),
    };
    spec.remove("nodeName");
    spec.remove("serviceAccountName");
    spec.remove("serviceAccount");
    spec.insert("automountServiceAccountToken".into(), Value::Bool(false));
    strip_tolerations(&mut spec, keys.taint_keys);
    strip_node_selector(&mut spec, keys.label_keys);
    strip_node_affinity(&mut spec, keys.label_keys);
    strip_token_volumes(&mut spec);
    let mut out = Map::new();
    if labels.as_object().is_some_and(|l| !l.is_empty()) {
        out.insert("labels".into(), labels);
    }
    out.insert("annotations".into(), Value::Object(annotations));
    out.insert("pod".into(), Value::Object(spec));
    Value::Object(out)
}

fn strip_tolerations(spec: &mut Map<String, Value>, taint_keys: &[&str]) {
    if let Some(Value::Array(tols)) = spec.get_mut("tolerations") {
        tols.retain(|t| !t["key"].as_str().is_some_and(|k| taint_keys.contains(&k)));
        if tols.is_empty() {
            spec.remove("tolerations");
        }
    }
}

fn strip_node_selector(spec: &mut Map<String, Value>, label_keys: &[&str]) {
    if let Some(Value::Object(sel)) = spec.get_mut("nodeSelector") {
        sel.retain(|k, _| !label_keys.contains(&k.as_str()));
        if sel.is_empty() {
            spec.remove("nodeSelector");
        }
    }
}

/// Drops requirements on virtual-node labels from a NodeSelectorTerm; whether anything is left.
fn strip_term(term: &mut Value, label_keys: &[&str]) -> bool {
    let mut left = false;
    for field in ["matchExpressions", "matchFields"] {
        if let Some(Value::Array(reqs)) = term.get_mut(field) {
            reqs.retain(|r| !r["key"].as_str().is_some_and(|k| label_keys.contains(&k)));
            left |= !reqs.is_empty();
        }
    }
    left
}

fn strip_node_affinity(spec: &mut Map<String, Value>, label_keys: &[&str]) {
    let Some(affinity) = spec.get_mut("affinity").and_then(Value::as_object_mut) else {
        return;
    };
    if let Some(na) = affinity
        .get_mut("nodeAffinity")
        .and_then(Value::as_object_mut)
    {
        let required = "requiredDuringSchedulingIgnoredDuringExecution";
        if let Some(req) = na.get_mut(required) {
            let mut keep = Vec::new();
            let mut emptied = false;
            if let Some(Value::Array(terms)) = req.get_mut("nodeSelectorTerms") {
                for mut term in terms.drain(..) {
                    if strip_term(&mut term, label_keys) {
                        keep.push(term);
                    } else {
                        emptied = true;
                    }
                }
            }
            // Terms are ORed: a term that only selected virtual nodes matches any provider
            // node once stripped, so the whole requirement goes.
            if keep.is_empty() || emptied {
                na.remove(required);
            } else {
                req["nodeSelectorTerms"] = Value::Array(keep);
            }
        }
        let preferred = "preferredDuringSchedulingIgnoredDuringExecution";
        if let Some(Value::Array(prefs)) = na.get_mut(preferred) {
            prefs.retain_mut(|p| strip_term(&mut p["preference"], label_keys));
            if prefs.is_empty() {
                na.remove(preferred);
            }
        }
        if na.is_empty() {
            affinity.remove("nodeAffinity");
        }
    }
    if affinity.is_empty() {
        spec.remove("affinity");
    }
}

fn strip_token_volumes(spec: &mut Map<String, Value>) {
    let mut dropped: Vec<String> = Vec::new();
    if let Some(Value::Array(vols)) = spec.get_mut("volumes") {
        vols.retain(|v| {
            let is_token = v["projected"]["sources"]
                .as_array()
                .is_some_and(|s| s.iter().any(|src| src.get("serviceAccountToken").is_some()));
            if is_token {
                dropped.push(v["name"].as_str().unwrap_or_default().to_string());
            }
            !is_token
        });
        if vols.is_empty() {
            spec.remove("volumes");
        }
    }
    if dropped.is_empty() {
        return;
    }
    for field in ["containers", "initContainers", "ephemeralContainers"] {
        if let Some(Value::Array(cs)) = spec.get_mut(field) {
            for c in cs {
                if let Some(Value::Array(mounts)) = c.get_mut("volumeMounts") {
                    mounts.retain(|m| {
                        !m["name"]
                            .as_str()
                            .is_some_and(|n| dropped.iter().any(|d| d == n))
                    });
                }
            }
        }
    }
}

/// How pod IPs translate from the provider's view to the consumer's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IpRemap {
    pub from: IpNet,
    pub to: IpNet,
}

/// `ip` as the consumer sees it (unchanged when outside the remapped range or unparsable).
pub fn remap_ip(ip: &str, remap: Option<IpRemap>) -> String {
    match (ip.parse::<IpAddr>(), remap) {
        (Ok(addr), Some(r)) => crate::prefix::translate(addr, &r.from, &r.to)
            .map(|a| a.to_string())
            .unwrap_or_else(|| ip.to_string()),
        _ => ip.to_string(),
    }
}

/// Condition type on a consumer pod whose provider reported pod IPs outside the range granted
/// to it (its pod CIDR): those IPs are ignored, so that a hostile provider cannot point the
/// consumer's Services at the consumer's own nodes or anything else outside the peering.
pub const IPS_IN_GRANT_CONDITION: &str = "tandem.dev/PodIPsInGrant";

/// The provider-view IP `ip` as the consumer sees it, or None when it must be ignored: with a
/// remap, only addresses inside the provider's pod CIDR (`from`) are its pods' (unparsable
/// ones are never); without one (no network negotiated), the address is passed as reported.
fn granted_ip(ip: &str, remap: Option<IpRemap>) -> Option<String> {
    let Some(r) = remap else {
        return Some(ip.to_string());
    };
    let addr = ip.parse::<IpAddr>().ok()?;
    crate::prefix::translate(addr, &r.from, &r.to).map(|a| a.to_string())
}

/// The consumer pod's `status` mirroring the real pod's `status`, pod IPs remapped; pod IPs
/// outside the provider's granted range are dropped and said in an
/// [`IPS_IN_GRANT_CONDITION`] condition.
/// `hostIP`s are dropped: they are provider node addresses, meaningless in the consumer.
/// Takes the real status by value: its fields move over rather than being copied (the virtual
/// kubelet calls this for every event of every real pod).
pub fn consumer_status(real_status: Value, remap: Option<IpRemap>) -> Value {
    let Value::Object(mut real) = real_status else {
        return Value::Object(Map::new());
    };
    let mut out = Map::new();
    for field in [
        "phase",
        "conditions",
        "containerStatuses",
        "initContainerStatuses",
        "startTime",
        "reason",
        "message",
        "qosClass",
    ] {
        if let Some(v) = real.remove(field) {
            out.insert(field.into(), v);
        }
    }
    let mut outside: Vec<String> = Vec::new();
    let mut granted = |ip: &str| {
        let g = granted_ip(ip, remap);
        if g.is_none() && !outside.iter().any(|o| o == ip) {
            outside.push(ip.to_string());
        }
        g
    };
    // An ignored IP is written as null, not left out: the status is merged into the consumer
    // pod's, where leaving it out would keep the address reported before (and a pod IP
    // that the pod's `podIPs` no longer lists).
    if let Some(ip) = real.get("podIP").and_then(Value::as_str) {
        out.insert(
            "podIP".into(),
            granted(ip).map_or(Value::Null, Value::String),
        );
    }
    if let Some(ips) = real.get("podIPs").and_then(Value::as_array) {
        let ips: Vec<Value> = ips
            .iter()
            .filter_map(|i| i["ip"].as_str())
            .filter_map(&mut granted)
            .map(|ip| json!({"ip": ip}))
            .collect();
        // `podIP` is `podIPs[0]`, as kubelet writes them: an ignored first one is replaced by
        // the first one kept.
        if out.get("podIP").is_some_and(Value::is_null)
            && let Some(first) = ips.first()
        {
            out.insert("podIP".into(), first["ip"].clone());
        }
        let ips = if ips.is_empty() {
            Value::Null
        } else {
            Value::Array(ips)
        };
        out.insert("podIPs".into(), ips);
    }
    if let (false, Some(r)) = (outside.is_empty(), remap) {
        let condition = json!({"type": IPS_IN_GRANT_CONDITION, "status": "False",
            "reason": "PodIPOutsideGrant",
            "message": format!("the provider reported pod IP {} outside its pod CIDR {}: ignored",
                               outside.join(", "), r.from)});
        match out.get_mut("conditions") {
            Some(Value::Array(cs)) => cs.push(condition),
            _ => {
                out.insert("conditions".into(), json!([condition]));
            }
        }
    }
    Value::Object(out)
}

/// Whether a mirrored status (from [`consumer_status`]) tells the consumer anything its own pod
/// does not show already. A real pod that is only created or scheduled (phase Pending, no
/// container statuses, no reason, every condition `PodScheduled=True`) does not: the consumer
/// pod is Pending and scheduled (to the virtual node) itself. Skipping those writes leaves one
/// status write per pod in the usual case (when it runs) instead of three.
pub fn status_is_news(status: &Value) -> bool {
    let pending = matches!(status["phase"].as_str(), None | Some("Pending"));
    let quiet_conditions = status["conditions"].as_array().is_none_or(|cs| {
        cs.iter()
            .all(|c| c["type"] == "PodScheduled" && c["status"] == "True")
    });
    let no_containers = ["containerStatuses", "initContainerStatuses"]
        .iter()
        .all(|f| status[*f].as_array().is_none_or(Vec::is_empty));
    let no_reason = status.get("reason").is_none() && status.get("message").is_none();
    !(pending && quiet_conditions && no_containers && no_reason)
}

/// Conditions to merge into a consumer pod whose provider cannot be reached.
pub fn unreachable_conditions(message: &str, now: &str) -> Value {
    let cond = |t: &str| {
        json!({"type": t, "status": "False", "reason": "ProviderUnreachable",
               "message": message, "lastTransitionTime": now})
    };
    Value::Array(vec![cond("Ready"), cond("ContainersReady")])
}

/// Resource amounts in thousandths of a unit (millicores, millibytes, millipods).
pub type Resources = BTreeMap<String, i128>;

/// A non-negative Kubernetes quantity ("100m", "1.5", "64Gi", "2e3") in thousandths of a unit;
/// `None` for anything else (a negative amount is no request).
pub fn parse_quantity(s: &str) -> Option<i128> {
    Quantity::parse(s)
        .ok()
        .filter(|q| !q.is_negative())
        .map(|q| q.milli_value())
}

/// A pod's effective requests, as kube's quota computes them (see
/// [`crate::pod_resources::effective_requests`]).
pub fn pod_requests(spec: &Value) -> Resources {
    crate::pod_resources::effective_requests(spec)
}

/// Adds `b` into `a`.
pub fn add(a: &mut Resources, b: &Resources) {
    for (k, v) in b {
        *a.entry(k.clone()).or_default() += v;
    }
}

/// Subtracts `b` from `a`.
pub fn sub(a: &mut Resources, b: &Resources) {
    for (k, v) in b {
        *a.entry(k.clone()).or_default() -= v;
    }
}

/// Whether `used + pod` stays within `grant`; resources the grant does not name are not limited
/// (except `requests.` prefixes, treated like their base name). Err names the first excess.
pub fn fits(used: &Resources, pod: &Resources, grant: &Resources) -> Result<(), QuotaExceeded> {
    for (k, need) in pod {
        let Some(limit) = grant.get(k) else { continue };
        let have = used.get(k).copied().unwrap_or(0);
        if have + need > *limit {
            return Err(QuotaExceeded {
                resource: k.clone(),
                requested: *need,
                used: have,
                limit: *limit,
            });
        }
    }
    Ok(())
}

/// A pod that does not fit its consumer's grant: the first resource it exceeds (amounts in
/// thousandths, as [`Resources`] holds them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaExceeded {
    /// The resource (`cpu`, `memory`, `pods`, …).
    pub resource: String,
    /// What the pod asks for.
    pub requested: i128,
    /// What the consumer's other pods use.
    pub used: i128,
    /// What the grant allows.
    pub limit: i128,
}

impl std::fmt::Display for QuotaExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let k = &self.resource;
        write!(
            f,
            "quota exceeded for {k}: requested {}, used {} of {}",
            show(k, self.requested),
            show(k, self.used),
            show(k, self.limit)
        )
    }
}

impl std::error::Error for QuotaExceeded {}

fn show(resource: &str, millis: i128) -> String {
    if resource == "cpu" {
        format!("{millis}m")
    } else if millis % 1000 == 0 {
        format!("{}", millis / 1000)
    } else {
        format!("{}m", millis)
    }
}

/// Parses a grant (`{"cpu": "16", ...}`); unparsable quantities are skipped.
pub fn parse_resources<'a>(grant: impl IntoIterator<Item = (&'a String, &'a String)>) -> Resources {
    grant
        .into_iter()
        .filter_map(|(k, v)| Some((k.clone(), parse_quantity(v)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYS: VirtualNodeKeys<'static> = VirtualNodeKeys {
        label_keys: &["tandem.dev/type", "tandem.dev/remote-cluster-id"],
        taint_keys: &["virtual-node.tandem.dev/not-allowed"],
    };

    fn pod(spec: Value) -> Value {
        json!({"metadata": {"name": "web", "namespace": "app", "uid": "u-1",
                            "labels": {"app": "web"}}, "spec": spec})
    }

    #[test]
    fn translation_strips_what_only_makes_sense_in_the_consumer() {
        let vn_tol = json!({"key": "virtual-node.tandem.dev/not-allowed", "operator": "Exists", "effect": "NoExecute"});
        let other_tol = json!({"key": "gpu", "operator": "Exists"});
        let vn_term = json!({"matchExpressions": [{"key": "tandem.dev/type", "operator": "In", "values": ["virtual-node"]}]});
        let zone_req = json!({"key": "zone", "operator": "In", "values": ["a"]});
        let token_vol = json!({"name": "kube-api-access-x", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}});
        let data_vol = json!({"name": "data", "emptyDir": {}});
        let cases: Vec<(&str, Value, Value)> = vec![
            (
                "nodeName, SA and token volumes go",
                json!({"nodeName": "tandem-p", "serviceAccountName": "default",
                       "containers": [{"name": "c", "volumeMounts": [{"name": "kube-api-access-x"}, {"name": "data"}]}],
                       "volumes": [token_vol, data_vol]}),
                json!({"automountServiceAccountToken": false,
                       "containers": [{"name": "c", "volumeMounts": [{"name": "data"}]}],
                       "volumes": [data_vol]}),
            ),
            (
                "virtual-node tolerations go, others stay",
                json!({"containers": [], "tolerations": [vn_tol, other_tol]}),
                json!({"containers": [], "tolerations": [other_tol], "automountServiceAccountToken": false}),
            ),
            (
                "only virtual-node toleration: field removed",
                json!({"containers": [], "tolerations": [vn_tol]}),
                json!({"containers": [], "automountServiceAccountToken": false}),
            ),
            (
                "required affinity on virtual nodes only: removed",
                json!({"containers": [], "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [vn_term]}}}}),
                json!({"containers": [], "automountServiceAccountToken": false}),
            ),
            (
                "mixed term keeps the other requirement",
                json!({"containers": [], "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [vn_term["matchExpressions"][0], zone_req]}]}}}}),
                json!({"containers": [], "automountServiceAccountToken": false, "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [zone_req]}]}}}}),
            ),
            (
                "a StatefulSet pod keeps its hostname, subdomain and claims (same claim names: the provider has copies)",
                json!({"hostname": "db-0", "subdomain": "db",
                       "containers": [{"name": "c", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                       "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-db-0"}}]}),
                json!({"hostname": "db-0", "subdomain": "db", "automountServiceAccountToken": false,
                       "containers": [{"name": "c", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                       "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-db-0"}}]}),
            ),
            (
                "nodeSelector on virtual-node labels goes",
                json!({"containers": [], "nodeSelector": {"tandem.dev/type": "virtual-node", "disk": "ssd"}}),
                json!({"containers": [], "nodeSelector": {"disk": "ssd"}, "automountServiceAccountToken": false}),
            ),
        ];
        for (name, spec, want) in cases {
            let got = shadow_spec(pod(spec), &KEYS);
            assert_eq!(got["pod"], want, "{name}");
            assert_eq!(got["labels"], json!({"app": "web"}), "{name}");
            assert_eq!(got["annotations"][ORIGIN_UID_ANNOTATION], "u-1", "{name}");
        }
    }

    #[test]
    fn status_is_mirrored_with_remapped_ips() {
        let remap = Some(IpRemap {
            from: "10.244.0.0/16".parse().unwrap(),
            to: "10.245.0.0/16".parse().unwrap(),
        });
        let cases = vec![
            ("10.244.1.7", remap, "10.245.1.7"),
            ("10.244.1.7", None, "10.244.1.7"),
            ("192.168.0.1", remap, "192.168.0.1"),
            ("garbage", remap, "garbage"),
        ];
        for (ip, remap, want) in cases {
            assert_eq!(remap_ip(ip, remap), want, "{ip}");
        }
        let real = json!({"phase": "Running", "hostIP": "172.18.0.2", "podIP": "10.244.3.4",
            "podIPs": [{"ip": "10.244.3.4"}], "startTime": "2024-01-01T00:00:00Z",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "c", "restartCount": 2}]});
        let got = consumer_status(real, remap);
        assert_eq!(
            got,
            json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "c", "restartCount": 2}],
                "startTime": "2024-01-01T00:00:00Z", "podIP": "10.245.3.4",
                "podIPs": [{"ip": "10.245.3.4"}]})
        );
    }

    #[test]
    fn a_provider_cannot_report_addresses_outside_its_grant() {
        let remap = Some(IpRemap {
            from: "10.244.0.0/16".parse().unwrap(),
            to: "10.245.0.0/16".parse().unwrap(),
        });
        // The consumer's own node, its API server's loopback, a metadata service, garbage.
        for bad in ["172.18.0.2", "127.0.0.1", "169.254.169.254", "not-an-ip"] {
            let real = json!({"phase": "Running", "podIP": bad,
                "podIPs": [{"ip": bad}, {"ip": "10.244.3.4"}],
                "conditions": [{"type": "Ready", "status": "True"}]});
            let got = consumer_status(real, remap);
            assert_eq!(got["podIP"], "10.245.3.4", "{bad}: the first IP kept");
            assert_eq!(got["podIPs"], json!([{"ip": "10.245.3.4"}]), "{bad}");
            let cond = &got["conditions"][1];
            assert_eq!(cond["type"], IPS_IN_GRANT_CONDITION, "{bad}");
            assert_eq!(cond["status"], "False");
            assert!(
                cond["message"].as_str().unwrap().contains(bad),
                "{bad}: {cond}"
            );
            assert_eq!(got["conditions"][0]["type"], "Ready");
        }
        // Nothing inside the grant: null, so that merging it removes what was reported before.
        let got = consumer_status(
            json!({"podIP": "172.18.0.2", "podIPs": [{"ip": "172.18.0.2"}]}),
            remap,
        );
        assert_eq!(
            (got.get("podIP"), got.get("podIPs")),
            (Some(&Value::Null), Some(&Value::Null)),
            "{got}"
        );
        assert_eq!(got["conditions"][0]["type"], IPS_IN_GRANT_CONDITION);
        // Inside the grant: no condition.
        let got = consumer_status(json!({"podIP": "10.244.0.9"}), remap);
        assert_eq!(got["podIP"], "10.245.0.9");
        assert!(got.get("conditions").is_none(), "{got}");
    }

    #[test]
    fn quantities() {
        let cases = vec![
            ("1", Some(1000)),
            ("100m", Some(100)),
            ("1.5", Some(1500)),
            ("64Gi", Some(64 * 1024i128.pow(3) * 1000)),
            ("1k", Some(1_000_000)),
            ("2e3", Some(2_000_000)),
            ("", None),
            ("x", None),
            ("-1", None),
        ];
        for (q, want) in cases {
            assert_eq!(parse_quantity(q), want, "{q}");
        }
    }

    #[test]
    fn requests_and_quota() {
        let spec = json!({
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}},
                {"name": "b", "resources": {"requests": {"cpu": "200m"}}}],
            "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "1"}}}],
        });
        let r = pod_requests(&spec);
        assert_eq!(r["cpu"], 1000);
        assert_eq!(r["memory"], 64 * 1024 * 1024 * 1000);
        assert_eq!(r["pods"], 1000);
        let grant: Resources = [("cpu".to_string(), 2000), ("pods".to_string(), 2000)].into();
        let cases = vec![
            (Resources::new(), true),
            ([("cpu".to_string(), 1000)].into(), true),
            ([("cpu".to_string(), 1001)].into(), false),
            ([("pods".to_string(), 2000)].into(), false),
            ([("memory".to_string(), i128::MAX / 2)].into(), true),
        ];
        for (used, ok) in cases {
            let got = fits(&used, &r, &grant);
            assert_eq!(got.is_ok(), ok, "{used:?}: {got:?}");
        }
        let err = fits(&[("pods".to_string(), 2000)].into(), &r, &grant).unwrap_err();
        assert!(err.to_string().contains("pods"), "{err}");
    }

    #[test]
    fn created_or_scheduled_pending_status_is_not_news() {
        let scheduled = json!({"type": "PodScheduled", "status": "True"});
        assert!(!status_is_news(&json!({})));
        assert!(!status_is_news(
            &json!({"phase": "Pending", "qosClass": "BestEffort"})
        ));
        assert!(!status_is_news(
            &json!({"phase": "Pending", "conditions": [scheduled.clone()]})
        ));
        // What the consumer's own pod cannot show: running, unschedulable on the provider,
        // containers waiting (image pulls), a reason.
        assert!(status_is_news(
            &json!({"phase": "Running", "conditions": [scheduled.clone()]})
        ));
        assert!(status_is_news(&json!({"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]})));
        assert!(status_is_news(
            &json!({"phase": "Pending", "conditions": [scheduled],
            "containerStatuses": [{"name": "app", "state": {"waiting": {"reason": "ErrImagePull"}}}]})
        ));
        assert!(status_is_news(
            &json!({"phase": "Pending", "reason": "SomethingElse"})
        ));
        assert!(status_is_news(&json!({"phase": "Failed"})));
    }
}
