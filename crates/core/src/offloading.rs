//! Namespace offloading rules: how twin namespaces are named, which virtual nodes a cluster
//! selector picks, where a pod of an offloaded namespace may be placed (the admission
//! webhook's JSON patch), and how endpoint addresses translate into a provider's view.
//!
//! Node selectors are the Kubernetes `NodeSelectorTerm` JSON shape, deserialized into plain
//! structs so this module needs no kube types.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tandem_apimachinery::validation::is_dns1123_label;

/// How a twin namespace is named on a provider (mirrors the CRD's enum).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NamespaceMapping {
    DefaultName,
    EnforceSameName,
    SelectedName,
}

/// Where an offloaded namespace's pods may run (mirrors the CRD's enum).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodPlacement {
    Local,
    Remote,
    LocalAndRemote,
}

/// Why a twin namespace name cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TwinNameError {
    #[error("namespace mapping SelectedName needs spec.remoteNamespaceName")]
    MissingSelectedName,
    #[error(
        "twin namespace name {0:?} is not a DNS-1123 label (lower-case letters, digits, '-', at most 63 characters)"
    )]
    Invalid(String),
}

/// The twin namespace of consumer namespace `namespace` on a provider.
pub fn twin_namespace_name(
    mapping: NamespaceMapping,
    namespace: &str,
    consumer_id: &str,
    selected: Option<&str>,
) -> Result<String, TwinNameError> {
    let name = match mapping {
        NamespaceMapping::DefaultName => format!("{namespace}-{consumer_id}"),
        NamespaceMapping::EnforceSameName => namespace.to_string(),
        NamespaceMapping::SelectedName => selected
            .filter(|s| !s.is_empty())
            .ok_or(TwinNameError::MissingSelectedName)?
            .to_string(),
    };
    if is_dns1123_label(&name) {
        Ok(name)
    } else {
        Err(TwinNameError::Invalid(name))
    }
}

/// One requirement of a node selector term (`key`, `operator`, `values`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Requirement {
    pub key: String,
    pub operator: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

impl Requirement {
    pub(crate) fn new(key: &str, operator: &str, values: &[&str]) -> Requirement {
        Requirement {
            key: key.to_string(),
            operator: operator.to_string(),
            values: values.iter().map(|v| v.to_string()).collect(),
        }
    }

    /// Whether a node with `labels` satisfies the requirement (NodeSelector semantics).
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        let as_int = |s: &str| s.parse::<i64>().ok();
        match self.operator.as_str() {
            "In" => value.is_some_and(|v| self.values.contains(v)),
            "NotIn" => value.is_none_or(|v| !self.values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            "Gt" | "Lt" => {
                let (Some(v), Some(bound)) = (
                    value.and_then(|v| as_int(v)),
                    self.values.first().and_then(|b| as_int(b)),
                ) else {
                    return false;
                };
                if self.operator == "Gt" {
                    v > bound
                } else {
                    v < bound
                }
            }
            _ => false,
        }
    }
}

/// A node selector term: all requirements must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SelectorTerm {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<Requirement>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_fields: Vec<Requirement>,
}

impl SelectorTerm {
    fn of(reqs: Vec<Requirement>) -> SelectorTerm {
        SelectorTerm {
            match_expressions: reqs,
            match_fields: Vec::new(),
        }
    }

    /// Whether `labels` satisfy every expression (fields are not labels: a term with
    /// matchFields never selects a cluster).
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_fields.is_empty() && self.match_expressions.iter().all(|r| r.matches(labels))
    }

    /// The conjunction of two terms.
    fn and(&self, other: &SelectorTerm) -> SelectorTerm {
        let mut out = self.clone();
        out.match_expressions
            .extend(other.match_expressions.iter().cloned());
        out.match_fields.extend(other.match_fields.iter().cloned());
        out
    }
}

/// Whether a cluster selector (OR of terms) selects a virtual node with `labels`. No selector
/// (or no terms) selects every cluster.
pub fn cluster_selected(terms: &[SelectorTerm], labels: &BTreeMap<String, String>) -> bool {
    terms.is_empty() || terms.iter().any(|t| t.matches(labels))
}

/// The labels and taint that mark virtual nodes (passed in: core does not know the API crate).
#[derive(Clone, Copy, Debug)]
pub struct VirtualNodeMarks<'a> {
    pub type_label: &'a str,
    pub type_value: &'a str,
    pub taint_key: &'a str,
}

/// What a pod of an offloaded namespace needs to be placed per the strategy: whether it must
/// tolerate the virtual-node taint, and the required node affinity terms (OR) the strategy
/// adds, before combining with the pod's own.
pub fn placement_terms(
    strategy: PodPlacement,
    cluster_selector: &[SelectorTerm],
    marks: VirtualNodeMarks<'_>,
) -> (bool, Vec<SelectorTerm>) {
    let local = SelectorTerm::of(vec![Requirement::new(
        marks.type_label,
        "NotIn",
        &[marks.type_value],
    )]);
    let virtual_node = SelectorTerm::of(vec![Requirement::new(
        marks.type_label,
        "In",
        &[marks.type_value],
    )]);
    let remote: Vec<SelectorTerm> = if cluster_selector.is_empty() {
        vec![virtual_node]
    } else {
        cluster_selector
            .iter()
            .map(|t| virtual_node.and(t))
            .collect()
    };
    match strategy {
        PodPlacement::Local => (false, vec![local]),
        PodPlacement::Remote => (true, remote),
        PodPlacement::LocalAndRemote => {
            let mut terms = vec![local];
            terms.extend(remote);
            (true, terms)
        }
    }
}

/// The AND of two ORs of terms: the cross product. An empty side means "no constraint".
pub fn and_terms(a: &[SelectorTerm], b: &[SelectorTerm]) -> Vec<SelectorTerm> {
    if a.is_empty() {
        return b.to_vec();
    }
    if b.is_empty() {
        return a.to_vec();
    }
    a.iter()
        .flat_map(|x| b.iter().map(move |y| x.and(y)))
        .collect()
}

/// The JSON patch (RFC 6902) the placement webhook answers for `pod` (a Pod as JSON): the
/// toleration of the virtual-node taint (unless present) and the required node affinity of
/// the strategy ANDed with the pod's own.
pub fn placement_patch(
    pod: &Value,
    strategy: PodPlacement,
    cluster_selector: &[SelectorTerm],
    marks: VirtualNodeMarks<'_>,
) -> Vec<Value> {
    let (tolerate, ours) = placement_terms(strategy, cluster_selector, marks);
    let spec = &pod["spec"];
    let mut patch = Vec::new();
    if tolerate {
        let toleration =
            json!({"key": marks.taint_key, "operator": "Exists", "effect": "NoExecute"});
        match spec["tolerations"].as_array() {
            Some(list) if list.iter().any(|t| t == &toleration) => {}
            Some(_) => {
                patch.push(json!({"op": "add", "path": "/spec/tolerations/-", "value": toleration}))
            }
            None => {
                patch.push(json!({"op": "add", "path": "/spec/tolerations", "value": [toleration]}))
            }
        }
    }
    let required =
        &spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
    let own = own_terms(required);
    let terms = and_terms(&own, &ours);
    let selector = json!({"nodeSelectorTerms": terms});
    if !required.is_null() {
        patch.push(json!({"op": "replace", "path": "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution", "value": selector}));
    } else if spec["affinity"]["nodeAffinity"].is_object() {
        patch.push(json!({"op": "add", "path": "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution", "value": selector}));
    } else if spec["affinity"].is_object() {
        patch.push(json!({"op": "add", "path": "/spec/affinity/nodeAffinity", "value": {"requiredDuringSchedulingIgnoredDuringExecution": selector}}));
    } else {
        patch.push(json!({"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": selector}}}));
    }
    patch
}

/// Whether `pod` (a Pod as JSON) tolerates the virtual-node taint: by its key, or by a
/// toleration of every taint (empty key, operator Exists), for NoExecute or every effect.
pub fn tolerates_virtual_nodes(pod: &Value, marks: VirtualNodeMarks<'_>) -> bool {
    pod["spec"]["tolerations"].as_array().is_some_and(|ts| {
        ts.iter().any(|t| {
            let key = t["key"].as_str().unwrap_or_default();
            let effect = t["effect"].as_str().unwrap_or_default();
            (key == marks.taint_key || (key.is_empty() && t["operator"] == "Exists"))
                && (effect.is_empty() || effect == "NoExecute")
        })
    })
}

/// The node selector terms of a pod's required node affinity (`required`, which may be
/// `null`); none when it has none or they do not parse. (A pod without affinity is the common
/// case, on every pod admitted: it is not turned into a deserialization error first.)
pub fn own_terms(required: &Value) -> Vec<SelectorTerm> {
    match &required["nodeSelectorTerms"] {
        Value::Null => Vec::new(),
        terms => serde_json::from_value(terms.clone()).unwrap_or_default(),
    }
}

/// Keeps `pod` (a Pod as JSON, changed in place) off virtual nodes if it tolerates their taint:
/// the Local strategy's required node affinity, ANDed with the pod's own. Pods that do not
/// tolerate the taint are left as they are (the taint keeps them off).
pub fn keep_off_virtual_nodes(pod: &mut Value, marks: VirtualNodeMarks<'_>) {
    if !tolerates_virtual_nodes(pod, marks) {
        return;
    }
    let (_, ours) = placement_terms(PodPlacement::Local, &[], marks);
    let required = &mut pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
    let own = own_terms(required);
    *required = json!({"nodeSelectorTerms": and_terms(&own, &ours)});
}

/// How pod addresses translate when an EndpointSlice is reflected into one provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointView {
    /// The consumer's pod CIDR, and how the provider sees it.
    pub local_pod_cidr: Option<IpNet>,
    pub local_pod_cidr_there: Option<IpNet>,
    /// The provider's pod CIDR as the consumer sees it, and as the provider sees it.
    pub remote_pod_cidr_here: Option<IpNet>,
    pub remote_pod_cidr: Option<IpNet>,
}

/// The provider-view address of an endpoint of the consumer: a pod on this provider's virtual
/// node gets its real provider IP back; a consumer-local pod gets its remapped address; anything
/// else (pods on other providers, addresses outside the pod CIDR) is dropped.
pub fn endpoint_address_there(
    view: &EndpointView,
    address: IpAddr,
    on_this_provider: bool,
) -> Option<IpAddr> {
    let (from, to) = if on_this_provider {
        (view.remote_pod_cidr_here?, view.remote_pod_cidr?)
    } else {
        (view.local_pod_cidr?, view.local_pod_cidr_there?)
    };
    crate::prefix::translate(address, &from, &to)
}

/// The taints a node gets when it fails (`NotReady`, or its kubelet — for a virtual node, its
/// provider — not heard from): a pod tolerating them for N seconds is evicted N seconds after.
pub const NODE_FAILURE_TAINTS: [&str; 2] = [
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
];

/// What the DefaultTolerationSeconds admission plugin gives every pod for each of
/// [`NODE_FAILURE_TAINTS`].
pub const DEFAULT_TOLERATION_SECONDS: i64 = 300;

/// The tolerations of `pod` (a Pod as JSON) with the node-failure ones bounded by `seconds`:
/// a NoExecute toleration of [`NODE_FAILURE_TAINTS`] the API server defaulted
/// ([`DEFAULT_TOLERATION_SECONDS`]) gets `seconds`, a missing one is added; one its author gave
/// another bound, or none (tolerate forever), is kept, as is a pod tolerating every NoExecute
/// taint for ever. None when nothing changes.
pub fn eviction_tolerations(pod: &Value, seconds: i64) -> Option<Value> {
    let mut list = pod["spec"]["tolerations"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let no_execute = |t: &Value| t["effect"] == "NoExecute" || t["effect"].is_null();
    let forever = |t: &Value| t["tolerationSeconds"].is_null();
    if list.iter().any(|t| {
        t["key"].as_str().unwrap_or_default().is_empty()
            && t["operator"] == "Exists"
            && no_execute(t)
            && forever(t)
    }) {
        return None;
    }
    let mut changed = false;
    for key in NODE_FAILURE_TAINTS {
        let mut found = false;
        for t in list.iter_mut().filter(|t| t["key"] == key && no_execute(t)) {
            found = true;
            if t["tolerationSeconds"] == DEFAULT_TOLERATION_SECONDS
                && seconds != DEFAULT_TOLERATION_SECONDS
            {
                t["tolerationSeconds"] = json!(seconds);
                changed = true;
            }
        }
        if !found {
            list.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds}));
            changed = true;
        }
    }
    changed.then(|| Value::Array(list))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MARKS: VirtualNodeMarks<'static> = VirtualNodeMarks {
        type_label: "tandem.dev/type",
        type_value: "virtual-node",
        taint_key: "virtual-node.tandem.dev/not-allowed",
    };

    fn term(v: Value) -> SelectorTerm {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn twin_names() {
        use NamespaceMapping::*;
        let long = "x".repeat(60);
        type Case<'a> = (
            NamespaceMapping,
            &'a str,
            Option<&'a str>,
            Result<String, TwinNameError>,
        );
        let cases: Vec<Case> = vec![
            (DefaultName, "app", None, Ok("app-rome".into())),
            (EnforceSameName, "app", None, Ok("app".into())),
            (SelectedName, "app", Some("web-eu"), Ok("web-eu".into())),
            (
                SelectedName,
                "app",
                None,
                Err(TwinNameError::MissingSelectedName),
            ),
            (
                SelectedName,
                "app",
                Some(""),
                Err(TwinNameError::MissingSelectedName),
            ),
            (
                SelectedName,
                "app",
                Some("Bad_Name"),
                Err(TwinNameError::Invalid("Bad_Name".into())),
            ),
            (
                DefaultName,
                &long,
                None,
                Err(TwinNameError::Invalid(format!("{long}-rome"))),
            ),
            (EnforceSameName, &long, None, Ok(long.clone())),
        ];
        for (mapping, ns, selected, want) in cases {
            assert_eq!(
                twin_namespace_name(mapping, ns, "rome", selected),
                want,
                "{mapping:?} {ns} {selected:?}"
            );
        }
    }

    #[test]
    fn selector_semantics() {
        let labels: BTreeMap<String, String> = [
            ("topology.kubernetes.io/region", "eu"),
            ("tandem.dev/type", "virtual-node"),
            ("size", "8"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let r = |k: &str, op: &str, vs: &[&str]| json!({"key": k, "operator": op, "values": vs});
        let cases = vec![
            (vec![], true),
            (
                vec![term(
                    json!({"matchExpressions": [r("topology.kubernetes.io/region", "In", &["eu", "us"])]}),
                )],
                true,
            ),
            (
                vec![term(
                    json!({"matchExpressions": [r("topology.kubernetes.io/region", "In", &["us"])]}),
                )],
                false,
            ),
            (
                vec![term(
                    json!({"matchExpressions": [r("topology.kubernetes.io/region", "NotIn", &["us"])]}),
                )],
                true,
            ),
            (
                vec![term(
                    json!({"matchExpressions": [r("zone", "NotIn", &["a"])]}),
                )],
                true,
            ),
            (
                vec![term(
                    json!({"matchExpressions": [r("zone", "Exists", &[])]}),
                )],
                false,
            ),
            (
                vec![term(
                    json!({"matchExpressions": [r("zone", "DoesNotExist", &[])]}),
                )],
                true,
            ),
            (
                vec![term(json!({"matchExpressions": [r("size", "Gt", &["4"])]}))],
                true,
            ),
            (
                vec![term(json!({"matchExpressions": [r("size", "Lt", &["4"])]}))],
                false,
            ),
            (
                vec![term(
                    json!({"matchExpressions": [r("size", "Bogus", &["4"])]}),
                )],
                false,
            ),
            // AND within a term, OR across terms.
            (
                vec![term(
                    json!({"matchExpressions": [r("size", "Gt", &["4"]), r("zone", "Exists", &[])]}),
                )],
                false,
            ),
            (
                vec![
                    term(json!({"matchExpressions": [r("zone", "Exists", &[])]})),
                    term(json!({"matchExpressions": [r("size", "In", &["8"])]})),
                ],
                true,
            ),
            (
                vec![term(
                    json!({"matchFields": [r("metadata.name", "In", &["n"])]}),
                )],
                false,
            ),
        ];
        for (terms, want) in cases {
            assert_eq!(cluster_selected(&terms, &labels), want, "{terms:?}");
        }
    }

    #[test]
    fn placement_patches() {
        let region_eu = term(
            json!({"matchExpressions": [{"key": "region", "operator": "In", "values": ["eu"]}]}),
        );
        let not_vn =
            json!({"key": "tandem.dev/type", "operator": "NotIn", "values": ["virtual-node"]});
        let vn = json!({"key": "tandem.dev/type", "operator": "In", "values": ["virtual-node"]});
        let eu = json!({"key": "region", "operator": "In", "values": ["eu"]});
        let ssd = json!({"key": "disk", "operator": "In", "values": ["ssd"]});
        let tol = json!({"key": "virtual-node.tandem.dev/not-allowed", "operator": "Exists", "effect": "NoExecute"});
        let bare = json!({"spec": {"containers": []}});
        let with_affinity = json!({"spec": {"tolerations": [{"key": "x", "operator": "Exists"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchExpressions": [ssd]}]}}}}});
        let already = json!({"spec": {"tolerations": [tol], "affinity": {"podAffinity": {}}}});
        let req = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution";
        type Case<'a> = (
            &'a str,
            &'a Value,
            PodPlacement,
            Vec<SelectorTerm>,
            Vec<Value>,
        );
        let cases: Vec<Case> = vec![
            (
                "local",
                &bare,
                PodPlacement::Local,
                vec![],
                vec![
                    json!({"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                    {"nodeSelectorTerms": [{"matchExpressions": [not_vn]}]}}}}),
                ],
            ),
            (
                "remote, no selector",
                &bare,
                PodPlacement::Remote,
                vec![],
                vec![
                    json!({"op": "add", "path": "/spec/tolerations", "value": [tol]}),
                    json!({"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                    {"nodeSelectorTerms": [{"matchExpressions": [vn]}]}}}}),
                ],
            ),
            (
                "remote, selector, own affinity",
                &with_affinity,
                PodPlacement::Remote,
                vec![region_eu.clone()],
                vec![
                    json!({"op": "add", "path": "/spec/tolerations/-", "value": tol}),
                    json!({"op": "replace", "path": req, "value": {"nodeSelectorTerms": [{"matchExpressions": [ssd, vn, eu]}]}}),
                ],
            ),
            (
                "both, selector, own affinity",
                &with_affinity,
                PodPlacement::LocalAndRemote,
                vec![region_eu.clone()],
                vec![
                    json!({"op": "add", "path": "/spec/tolerations/-", "value": tol}),
                    json!({"op": "replace", "path": req, "value": {"nodeSelectorTerms": [
                        {"matchExpressions": [ssd, not_vn]},
                        {"matchExpressions": [ssd, vn, eu]},
                    ]}}),
                ],
            ),
            (
                "already tolerates, other affinity",
                &already,
                PodPlacement::LocalAndRemote,
                vec![],
                vec![
                    json!({"op": "add", "path": "/spec/affinity/nodeAffinity", "value": {"requiredDuringSchedulingIgnoredDuringExecution":
                    {"nodeSelectorTerms": [{"matchExpressions": [not_vn]}, {"matchExpressions": [vn]}]}}}),
                ],
            ),
        ];
        for (what, pod, strategy, selector, want) in cases {
            assert_eq!(
                placement_patch(pod, strategy, &selector, MARKS),
                want,
                "{what}"
            );
        }
    }

    #[test]
    fn endpoint_addresses() {
        let p = |s: &str| s.parse::<IpNet>().ok();
        let view = EndpointView {
            local_pod_cidr: p("10.244.0.0/16"),
            local_pod_cidr_there: p("10.245.0.0/16"),
            remote_pod_cidr_here: p("10.246.0.0/16"),
            remote_pod_cidr: p("10.244.0.0/16"),
        };
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let cases = vec![
            ("10.244.1.5", false, Some("10.245.1.5")),
            ("10.246.3.9", true, Some("10.244.3.9")),
            ("10.246.3.9", false, None),
            ("10.244.1.5", true, None),
            ("192.168.1.1", false, None),
        ];
        for (addr, here, want) in cases {
            assert_eq!(
                endpoint_address_there(&view, ip(addr), here),
                want.map(ip),
                "{addr} {here}"
            );
        }
        let flat = EndpointView {
            local_pod_cidr: None,
            local_pod_cidr_there: None,
            remote_pod_cidr_here: None,
            remote_pod_cidr: None,
        };
        assert_eq!(endpoint_address_there(&flat, ip("10.244.1.5"), false), None);
    }

    #[test]
    fn pods_tolerating_the_taint_are_kept_off_virtual_nodes() {
        let local = json!([{"matchExpressions": [{"key": MARKS.type_label, "operator": "NotIn",
            "values": [MARKS.type_value]}]}]);
        // No toleration: the taint keeps the pod off; nothing is added.
        let mut plain = json!({"spec": {"containers": []}});
        keep_off_virtual_nodes(&mut plain, MARKS);
        assert_eq!(plain, json!({"spec": {"containers": []}}));
        // A toleration of every taint gets the Local affinity.
        let mut wildcard = json!({"spec": {"tolerations": [{"operator": "Exists"}]}});
        keep_off_virtual_nodes(&mut wildcard, MARKS);
        assert_eq!(
            wildcard["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                ["nodeSelectorTerms"],
            local
        );
        // The pod's own required terms are kept, ANDed with ours.
        let mut own = json!({"spec": {
            "tolerations": [{"key": MARKS.taint_key, "operator": "Exists", "effect": "NoExecute"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "zone", "operator": "In", "values": ["a"]}]}]}}}}});
        keep_off_virtual_nodes(&mut own, MARKS);
        let terms = &own["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"];
        assert_eq!(terms.as_array().map(Vec::len), Some(1));
        let exprs = terms[0]["matchExpressions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(exprs.contains(&json!({"key": "zone", "operator": "In", "values": ["a"]})));
        assert!(exprs.contains(&local[0]["matchExpressions"][0]));
        // A toleration of another effect does not count.
        let mut other = json!({"spec": {"tolerations": [{"key": MARKS.taint_key, "operator": "Exists", "effect": "NoSchedule"}]}});
        keep_off_virtual_nodes(&mut other, MARKS);
        assert!(other["spec"].get("affinity").is_none());
    }

    #[test]
    fn eviction_tolerations_bound_defaulted_and_missing_ones_only() {
        let defaulted = |key: &str| json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300});
        let pod = json!({"spec": {"tolerations": [
            defaulted("node.kubernetes.io/not-ready"),
            defaulted("node.kubernetes.io/unreachable"),
        ]}});
        let got = eviction_tolerations(&pod, 20).unwrap();
        assert_eq!(got.as_array().unwrap().len(), 2);
        assert!(
            got.as_array()
                .unwrap()
                .iter()
                .all(|t| t["tolerationSeconds"] == 20)
        );
        // Nothing to do the second time.
        assert_eq!(
            eviction_tolerations(&json!({"spec": {"tolerations": got}}), 20),
            None
        );

        // The author's own bound (or none) is theirs; the missing one is added.
        let own = json!({"spec": {"tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 3600},
            {"key": "other", "operator": "Exists"},
        ]}});
        let got = eviction_tolerations(&own, 20).unwrap();
        let got = got.as_array().unwrap();
        assert_eq!(got[0]["tolerationSeconds"], 3600);
        assert_eq!(got[1], json!({"key": "other", "operator": "Exists"}));
        assert_eq!(got[2]["key"], "node.kubernetes.io/unreachable");
        assert_eq!(got[2]["tolerationSeconds"], 20);

        // No tolerations at all.
        let got = eviction_tolerations(&json!({"spec": {}}), 0).unwrap();
        assert_eq!(got.as_array().unwrap().len(), 2);
        // Tolerating every taint for ever: never evicted, left so.
        let all = json!({"spec": {"tolerations": [{"operator": "Exists"}]}});
        assert_eq!(eviction_tolerations(&all, 20), None);
    }
}
