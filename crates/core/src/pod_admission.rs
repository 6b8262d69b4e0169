//! What a provider lets a consumer's pod be, pure: the spec a peer asks for (a ShadowPod's pod)
//! is checked against an allow-list and rewritten into the real pod's spec, or refused with the
//! rule that refuses it.
//!
//! The check runs on the provider, where the real pod is made, never on the consumer: the
//! consumer is the party defended against, and a peer identity can write ShadowPods directly.
//! It follows the Pod Security Standards (`baseline` by default, `restricted` where the
//! provider's admin chooses it; never `privileged` through a peering), then takes from the peer
//! what only the provider may decide: the ServiceAccount, the node, node placement,
//! tolerations, priority, runtime class and scheduler.

use serde_json::{Map, Value, json};
use tandem_apimachinery::pod_security;

use crate::offloading::{Requirement, SelectorTerm, and_terms, own_terms};

/// The Pod Security Standards level a provider holds a consumer's pods to (`baseline` by
/// default; a peering is never `privileged`).
pub use tandem_apimachinery::pod_security::Level as PodSecurityLevel;

/// What the provider decides for every pod of a consumer.
#[derive(Clone, Debug, Default)]
pub struct ProviderPodPolicy {
    pub level: PodSecurityLevel,
    /// The PriorityClass of every real pod (None: the cluster's default class).
    pub priority_class: Option<String>,
    /// The RuntimeClass of every real pod (None: the node's default runtime).
    pub runtime_class: Option<String>,
    /// How its pods are charged against its grant (see `pod_resources`).
    pub charge: crate::pod_resources::ChargePolicy,
}

/// A refused pod: the rule (a Pod Security Standards check, as kube names it, or one of
/// Tandem's own) and what in the spec broke it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub rule: &'static str,
    pub detail: String,
    /// The level whose check refused it (None: a rule of Tandem's own).
    pub pod_security: Option<PodSecurityLevel>,
}

impl std::fmt::Display for Refusal {
    /// As kube-apiserver's Pod Security admission says it, for the standards' checks.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.pod_security {
            Some(level) => write!(
                f,
                "violates PodSecurity \"{}:latest\": {} ({})",
                level.as_str(),
                self.rule,
                self.detail
            ),
            None => write!(f, "refused by rule {}: {}", self.rule, self.detail),
        }
    }
}

/// Labels a node carries when it runs the control plane. Not every control-plane node is
/// tainted (k3s servers are not), so a peer's pod is kept off them by affinity, not by taint.
pub const CONTROL_PLANE_LABELS: [&str; 2] = [
    "node-role.kubernetes.io/control-plane",
    "node-role.kubernetes.io/master",
];

/// The tolerations honest translation produces, which are kept (by key): the node-failure
/// taints the consumer bounds with its eviction seconds, and those the DaemonSet controller
/// gives its pods. Any other toleration is dropped, not refused: it only widens where the
/// pod may run, and that is the provider's to say.
pub const KEPT_TOLERATIONS: [&str; 7] = [
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
    "node.kubernetes.io/disk-pressure",
    "node.kubernetes.io/memory-pressure",
    "node.kubernetes.io/pid-pressure",
    "node.kubernetes.io/unschedulable",
    "node.kubernetes.io/network-unavailable",
];

/// Annotations a real pod keeps (prefixes end in `/`); every other one is dropped: an
/// annotation can steer the provider's own machinery (AppArmor, autoscalers, meshes).
/// `lab.tandem.dev/` is read by the lab's hollow kubelets alone (what a hollow container does).
pub const KEPT_ANNOTATIONS: [&str; 4] = [
    "tandem.dev/",
    "lab.tandem.dev/",
    "kubectl.kubernetes.io/default-container",
    "kubectl.kubernetes.io/restartedAt",
];

/// Volume types a peer's pod may use. No token projection, no host or network storage, no
/// inline CSI or generic ephemeral volume (those make claims of any storage class); claims are
/// checked where the peer creates them.
const VOLUME_TYPES: [&str; 6] = [
    "configMap",
    "secret",
    "emptyDir",
    "downwardAPI",
    "projected",
    "persistentVolumeClaim",
];

/// Projected sources a peer's pod may use (no `serviceAccountToken`, no `podCertificate`).
const PROJECTED_SOURCES: [&str; 4] = ["configMap", "secret", "downwardAPI", "clusterTrustBundle"];

/// Pod-spec fields the provider decides and a peer's value of which is dropped.
const PROVIDER_FIELDS: [&str; 11] = [
    "nodeName",
    "serviceAccountName",
    "serviceAccount",
    "priority",
    "priorityClassName",
    "preemptionPolicy",
    "runtimeClassName",
    "overhead",
    "schedulerName",
    "ephemeralContainers",
    "schedulingGates",
];

const CONTAINER_FIELDS: [&str; 2] = ["containers", "initContainers"];

fn refuse<T>(rule: &'static str, detail: String) -> Result<T, Refusal> {
    Err(Refusal {
        rule,
        detail,
        pod_security: None,
    })
}

fn name_of(v: &Value) -> &str {
    v["name"].as_str().unwrap_or_default()
}

/// Checks a pod spec a peer asks for and rewrites it into the real pod's spec: what only the
/// provider decides is replaced, the hardening forced, and the result checked against the
/// Pod Security Standards at the policy's level (what a real kube-apiserver would check of
/// the twin namespace's label) and Tandem's own rules.
pub fn admit(spec: Value, policy: &ProviderPodPolicy) -> Result<Value, Refusal> {
    let Value::Object(mut spec) = spec else {
        return refuse("pod-spec", "the pod spec is not an object".into());
    };
    for field in PROVIDER_FIELDS {
        spec.remove(field);
    }
    spec.insert("automountServiceAccountToken".into(), Value::Bool(false));
    if let Some(class) = &policy.priority_class {
        spec.insert("priorityClassName".into(), class.clone().into());
    }
    if let Some(class) = &policy.runtime_class {
        spec.insert("runtimeClassName".into(), class.clone().into());
    }
    keep_tolerations(&mut spec);
    keep_off_control_plane(&mut spec);
    harden(&mut spec, policy.level);
    let spec = Value::Object(spec);
    pod_security::check(&Value::Null, &spec, policy.level).map_err(|v| Refusal {
        rule: v.check,
        detail: v.detail,
        pod_security: Some(policy.level),
    })?;
    check_tandem_rules(&spec)?;
    Ok(spec)
}

/// The annotations a real pod keeps of those a peer asks for (see [`KEPT_ANNOTATIONS`]).
pub fn kept_annotations<'a>(
    annotations: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> impl Iterator<Item = (&'a String, &'a String)> {
    annotations.into_iter().filter(|(k, _)| {
        KEPT_ANNOTATIONS.iter().any(|kept| {
            if kept.ends_with('/') {
                k.starts_with(kept)
            } else {
                k.as_str() == *kept
            }
        })
    })
}

/// The annotation key prefix of a container's AppArmor profile (the pre-1.30 form).
const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";

/// Refuses an AppArmor annotation that unconfines a container (the annotation form of
/// `appArmorProfile`, still honoured by kubelets): checked before annotations are dropped,
/// so that the refusal is said rather than the pod run differently than asked.
pub fn check_annotations<'a>(
    annotations: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Result<(), Refusal> {
    // Only the AppArmor annotations matter to the standards: the rest is not copied (this
    // runs for every real pod made).
    let annotations: serde_json::Map<String, Value> = annotations
        .into_iter()
        .filter(|(k, _)| k.starts_with(APPARMOR_ANNOTATION_PREFIX))
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    if annotations.is_empty() {
        return Ok(());
    }
    pod_security::check(
        &Value::Object(annotations),
        &json!({}),
        PodSecurityLevel::Baseline,
    )
    .map_err(|v| Refusal {
        rule: v.check,
        detail: v.detail,
        pod_security: Some(PodSecurityLevel::Baseline),
    })
}

/// What Tandem refuses beyond the Pod Security Standards: volumes outside its allow-list (no
/// host or network storage, no inline CSI or generic ephemeral volume, no token projection)
/// and claims on the provider's devices.
fn check_tandem_rules(spec: &Value) -> Result<(), Refusal> {
    if spec.get("resourceClaims").is_some_and(|c| !is_empty(c)) {
        return refuse(
            "resource-claims",
            "resourceClaims (dynamic resource allocation) claim the provider's devices".into(),
        );
    }
    for v in spec["volumes"].as_array().into_iter().flatten() {
        let name = name_of(v);
        let Some(source) = v.as_object() else {
            return refuse("volumes", format!("volume {name:?} is not an object"));
        };
        for (kind, def) in source {
            if kind == "name" {
                continue;
            }
            if !VOLUME_TYPES.contains(&kind.as_str()) {
                return refuse(
                    "volumes",
                    format!(
                        "volume {name:?} is of type {kind} (allowed: {})",
                        VOLUME_TYPES.join(", ")
                    ),
                );
            }
            if kind == "projected" {
                for src in def["sources"].as_array().into_iter().flatten() {
                    for sk in src.as_object().into_iter().flatten().map(|(k, _)| k) {
                        if !PROJECTED_SOURCES.contains(&sk.as_str()) {
                            return refuse(
                                "volumes",
                                format!(
                                    "volume {name:?} projects a {sk} (a peer's pod gets no token of this cluster)"
                                ),
                            );
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

fn keep_tolerations(spec: &mut Map<String, Value>) {
    if let Some(Value::Array(tols)) = spec.get_mut("tolerations") {
        tols.retain(|t| {
            t["key"]
                .as_str()
                .is_some_and(|k| KEPT_TOLERATIONS.contains(&k))
        });
        if tols.is_empty() {
            spec.remove("tolerations");
        }
    }
}

/// ANDs "not a control-plane node" into the pod's required node affinity.
fn keep_off_control_plane(spec: &mut Map<String, Value>) {
    let ours = vec![SelectorTerm {
        match_expressions: CONTROL_PLANE_LABELS
            .iter()
            .map(|k| Requirement::new(k, "DoesNotExist", &[]))
            .collect(),
        match_fields: Vec::new(),
    }];
    let affinity = spec.entry("affinity").or_insert_with(|| json!({}));
    if !affinity.is_object() {
        *affinity = json!({});
    }
    let required = &mut affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
    let own = own_terms(required);
    *required = json!({"nodeSelectorTerms": and_terms(&own, &ours)});
}

/// Forces what hardens a pod without changing what it can do: no privilege escalation and the
/// runtime's default seccomp profile; under `restricted`, every capability dropped.
fn harden(spec: &mut Map<String, Value>, level: PodSecurityLevel) {
    let pod_sc = spec.entry("securityContext").or_insert_with(|| json!({}));
    if !pod_sc.is_object() {
        *pod_sc = json!({});
    }
    if pod_sc["seccompProfile"].is_null() {
        pod_sc["seccompProfile"] = json!({"type": "RuntimeDefault"});
    }
    for field in CONTAINER_FIELDS {
        let Some(Value::Array(cs)) = spec.get_mut(field) else {
            continue;
        };
        for c in cs {
            if !c["securityContext"].is_object() {
                c["securityContext"] = json!({});
            }
            let sc = &mut c["securityContext"];
            sc["allowPrivilegeEscalation"] = Value::Bool(false);
            if level == PodSecurityLevel::Restricted {
                sc["capabilities"]["drop"] = json!(["ALL"]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(extra: Value) -> Value {
        let mut spec = json!({"containers": [{"name": "app", "image": "nginx"}]});
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        spec
    }

    fn container(extra: Value) -> Value {
        let mut c = json!({"name": "app", "image": "nginx"});
        for (k, v) in extra.as_object().unwrap() {
            c[k] = v.clone();
        }
        json!({"containers": [c]})
    }

    fn baseline() -> ProviderPodPolicy {
        ProviderPodPolicy::default()
    }

    fn restricted() -> ProviderPodPolicy {
        ProviderPodPolicy {
            level: PodSecurityLevel::Restricted,
            ..Default::default()
        }
    }

    #[test]
    fn refusals_name_their_rule() {
        let sc = |v: Value| container(json!({"securityContext": v}));
        let cases: Vec<(&str, Value, ProviderPodPolicy, &str)> = vec![
            (
                "hostNetwork",
                pod(json!({"hostNetwork": true})),
                baseline(),
                "host namespaces",
            ),
            (
                "hostPID",
                pod(json!({"hostPID": true})),
                baseline(),
                "host namespaces",
            ),
            (
                "hostIPC",
                pod(json!({"hostIPC": true})),
                baseline(),
                "host namespaces",
            ),
            (
                "privileged",
                sc(json!({"privileged": true})),
                baseline(),
                "privileged",
            ),
            (
                "privileged init container",
                json!({"containers": [{"name": "a"}], "initContainers": [{"name": "i", "securityContext": {"privileged": true}}]}),
                baseline(),
                "privileged",
            ),
            (
                "SYS_ADMIN",
                sc(json!({"capabilities": {"add": ["SYS_ADMIN"]}})),
                baseline(),
                "capabilities",
            ),
            (
                "CAP_NET_ADMIN",
                sc(json!({"capabilities": {"add": ["CAP_NET_ADMIN"]}})),
                baseline(),
                "capabilities",
            ),
            (
                "CHOWN under restricted",
                sc(json!({"runAsNonRoot": true, "capabilities": {"add": ["CHOWN"]}})),
                restricted(),
                "unrestricted capabilities",
            ),
            (
                "seccomp Unconfined (container)",
                sc(json!({"seccompProfile": {"type": "Unconfined"}})),
                baseline(),
                "seccompProfile",
            ),
            (
                "seccomp Unconfined (pod)",
                pod(json!({"securityContext": {"seccompProfile": {"type": "Unconfined"}}})),
                baseline(),
                "seccompProfile",
            ),
            (
                "AppArmor Unconfined",
                sc(json!({"appArmorProfile": {"type": "Unconfined"}})),
                baseline(),
                "AppArmor",
            ),
            (
                "procMount Unmasked",
                sc(json!({"procMount": "Unmasked"})),
                baseline(),
                "procMount",
            ),
            (
                "SELinux spc_t",
                sc(json!({"seLinuxOptions": {"type": "spc_t"}})),
                baseline(),
                "seLinuxOptions",
            ),
            (
                "SELinux user",
                pod(json!({"securityContext": {"seLinuxOptions": {"user": "system_u"}}})),
                baseline(),
                "seLinuxOptions",
            ),
            (
                "Windows host process",
                sc(json!({"windowsOptions": {"hostProcess": true}})),
                baseline(),
                "hostProcess",
            ),
            (
                "unsafe sysctl",
                pod(
                    json!({"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}}),
                ),
                baseline(),
                "forbidden sysctls",
            ),
            (
                "hostPort",
                container(json!({"ports": [{"containerPort": 80, "hostPort": 80}]})),
                baseline(),
                "hostPort",
            ),
            (
                "hostPath",
                pod(json!({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]})),
                baseline(),
                "hostPath volumes",
            ),
            (
                "nfs",
                pod(
                    json!({"volumes": [{"name": "n", "nfs": {"server": "10.0.0.1", "path": "/"}}]}),
                ),
                baseline(),
                "volumes",
            ),
            (
                "iscsi",
                pod(
                    json!({"volumes": [{"name": "i", "iscsi": {"targetPortal": "10.0.0.1:3260", "iqn": "x", "lun": 0}}]}),
                ),
                baseline(),
                "volumes",
            ),
            (
                "inline CSI",
                pod(
                    json!({"volumes": [{"name": "c", "csi": {"driver": "secrets-store.csi.k8s.io"}}]}),
                ),
                baseline(),
                "volumes",
            ),
            (
                "generic ephemeral",
                pod(
                    json!({"volumes": [{"name": "e", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]}),
                ),
                baseline(),
                "volumes",
            ),
            (
                "token projection",
                pod(
                    json!({"volumes": [{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}]}),
                ),
                baseline(),
                "volumes",
            ),
            (
                "resource claims",
                pod(json!({"resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu"}]})),
                baseline(),
                "resource-claims",
            ),
            (
                "root under restricted",
                pod(json!({})),
                restricted(),
                "runAsNonRoot != true",
            ),
            (
                "uid 0 under restricted",
                sc(json!({"runAsNonRoot": true, "runAsUser": 0})),
                restricted(),
                "runAsUser=0",
            ),
        ];
        for (name, spec, policy, rule) in cases {
            match admit(spec, &policy) {
                Err(r) => {
                    assert_eq!(r.rule, rule, "{name}: {r}");
                    assert!(!r.detail.is_empty(), "{name}");
                }
                Ok(got) => panic!("{name}: admitted as {got}"),
            }
        }
    }

    #[test]
    fn what_the_provider_decides_is_taken_from_the_peer() {
        let asked = json!({
            "containers": [{"name": "app", "image": "nginx",
                            "securityContext": {"allowPrivilegeEscalation": true}}],
            "nodeName": "control-plane-1",
            "serviceAccountName": "admin", "serviceAccount": "admin",
            "automountServiceAccountToken": true,
            "priority": 2000001000, "priorityClassName": "system-node-critical",
            "preemptionPolicy": "PreemptLowerPriority",
            "runtimeClassName": "unsandboxed", "schedulerName": "my-scheduler",
            "tolerations": [
                {"operator": "Exists"},
                {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
            ],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}]}}},
        });
        let got = admit(asked, &baseline()).unwrap();
        for field in [
            "nodeName",
            "serviceAccountName",
            "serviceAccount",
            "priority",
            "priorityClassName",
            "preemptionPolicy",
            "runtimeClassName",
            "schedulerName",
        ] {
            assert!(got.get(field).is_none(), "{field} kept: {got}");
        }
        assert_eq!(got["automountServiceAccountToken"], false);
        assert_eq!(
            got["tolerations"],
            json!([
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
            ])
        );
        let not_cp = json!([
            {"key": "node-role.kubernetes.io/control-plane", "operator": "DoesNotExist"},
            {"key": "node-role.kubernetes.io/master", "operator": "DoesNotExist"}]);
        let terms = &got["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"];
        assert_eq!(terms.as_array().unwrap().len(), 2, "{terms}");
        for (term, zone) in terms.as_array().unwrap().iter().zip(["a", "b"]) {
            let exprs = term["matchExpressions"].as_array().unwrap();
            assert_eq!(exprs[0]["values"], json!([zone]));
            assert_eq!(json!(exprs[1..]), not_cp);
        }
        assert_eq!(
            got["containers"][0]["securityContext"]["allowPrivilegeEscalation"],
            false
        );
        assert_eq!(
            got["securityContext"]["seccompProfile"],
            json!({"type": "RuntimeDefault"})
        );

        let set = ProviderPodPolicy {
            priority_class: Some("tandem-guests".into()),
            runtime_class: Some("gvisor".into()),
            ..restricted()
        };
        let got = admit(
            pod(json!({"securityContext": {"runAsNonRoot": true,
                        "seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"}},
                       "priorityClassName": "system-cluster-critical"})),
            &set,
        )
        .unwrap();
        assert_eq!(got["priorityClassName"], "tandem-guests");
        assert_eq!(got["runtimeClassName"], "gvisor");
        assert_eq!(
            got["securityContext"]["seccompProfile"]["type"],
            "Localhost"
        );
        assert_eq!(
            got["containers"][0]["securityContext"]["capabilities"]["drop"],
            json!(["ALL"])
        );
    }

    #[test]
    fn an_honest_pod_is_admitted() {
        let honest = json!({
            "containers": [{"name": "app", "image": "nginx",
                "ports": [{"containerPort": 80}],
                "securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]}},
                "volumeMounts": [{"name": "config", "mountPath": "/etc/app"}]}],
            "initContainers": [{"name": "init", "image": "busybox", "ports": [{"containerPort": 1, "hostPort": 0}]}],
            "volumes": [
                {"name": "config", "configMap": {"name": "app"}},
                {"name": "creds", "secret": {"secretName": "app"}},
                {"name": "scratch", "emptyDir": {"medium": "Memory"}},
                {"name": "info", "downwardAPI": {"items": []}},
                {"name": "bundle", "projected": {"sources": [{"configMap": {"name": "a"}}, {"secret": {"name": "b"}}]}},
                {"name": "data", "persistentVolumeClaim": {"claimName": "data-db-0"}}],
            "hostname": "db-0", "subdomain": "db",
            "securityContext": {"sysctls": [{"name": "net.ipv4.ip_local_port_range", "value": "1024 65535"}],
                                "seLinuxOptions": {"type": "container_t"}},
            "automountServiceAccountToken": false,
        });
        let got = admit(honest.clone(), &baseline()).unwrap();
        assert_eq!(got["volumes"], honest["volumes"]);
        assert_eq!(got["hostname"], "db-0");
        assert_eq!(
            got["containers"][0]["ports"],
            honest["containers"][0]["ports"]
        );
    }

    #[test]
    fn annotations_pass_an_allow_list() {
        let asked: std::collections::BTreeMap<String, String> = [
            ("tandem.dev/origin-uid", "u-1"),
            ("kubectl.kubernetes.io/default-container", "app"),
            (
                "container.apparmor.security.beta.kubernetes.io/app",
                "runtime/default",
            ),
            ("cluster-autoscaler.kubernetes.io/safe-to-evict", "false"),
            ("sidecar.istio.io/inject", "true"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(check_annotations(&asked), Ok(()));
        let kept: Vec<&str> = kept_annotations(&asked).map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            kept,
            [
                "kubectl.kubernetes.io/default-container",
                "tandem.dev/origin-uid"
            ]
        );
        let unconfined: std::collections::BTreeMap<String, String> = [(
            "container.apparmor.security.beta.kubernetes.io/app".to_string(),
            "unconfined".to_string(),
        )]
        .into();
        assert_eq!(check_annotations(&unconfined).unwrap_err().rule, "AppArmor");
    }
}
