//! The Pod Security Standards (`baseline` and `restricted`, as of Kubernetes 1.33), as a pure
//! check of a pod spec: what the Pod Security admission plugin of kube-apiserver enforces for a
//! namespace labelled `pod-security.kubernetes.io/enforce`. Written here rather than taken from
//! a crate: no Rust crate implements the standards (they live in k8s.io/pod-security-admission).

use serde_json::Value;

/// The namespace label naming the level enforced on its pods.
pub const ENFORCE_LABEL: &str = "pod-security.kubernetes.io/enforce";

/// A Pod Security Standards level (`privileged` enforces nothing, so it is not one here).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Level {
    /// No known privilege escalation.
    #[default]
    Baseline,
    /// Hardened: baseline plus non-root, no privilege escalation, a seccomp profile, every
    /// capability dropped but NET_BIND_SERVICE, and only the volume types listed.
    Restricted,
}

impl Level {
    /// The level's name, as the label writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Baseline => "baseline",
            Level::Restricted => "restricted",
        }
    }

    /// The level an `enforce` label value names; None for `privileged` (or anything else).
    pub fn parse(s: &str) -> Option<Level> {
        match s {
            "baseline" => Some(Level::Baseline),
            "restricted" => Some(Level::Restricted),
            _ => None,
        }
    }
}

/// A pod the level does not admit: the check that fails (kube's name for it) and what in the
/// spec fails it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub check: &'static str,
    pub detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.check, self.detail)
    }
}

/// Capabilities `baseline` allows a container to add.
pub const BASELINE_CAPABILITIES: [&str; 13] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// Sysctls `baseline` allows (namespaced and isolated from the node).
pub const SAFE_SYSCTLS: [&str; 10] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];

/// SELinux types `baseline` allows.
const SELINUX_TYPES: [&str; 4] = [
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

/// Volume types `restricted` allows.
const RESTRICTED_VOLUMES: [&str; 8] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

const CONTAINER_FIELDS: [&str; 3] = ["containers", "initContainers", "ephemeralContainers"];

fn violation<T>(check: &'static str, detail: String) -> Result<T, Violation> {
    Err(Violation { check, detail })
}

fn containers(spec: &Value) -> impl Iterator<Item = &Value> {
    CONTAINER_FIELDS
        .iter()
        .flat_map(|f| spec[*f].as_array().into_iter().flatten())
}

fn name_of(c: &Value) -> &str {
    c["name"].as_str().unwrap_or_default()
}

/// Checks a pod (its `metadata.annotations` and `spec`) against `level`; the first violation.
pub fn check(annotations: &Value, spec: &Value, level: Level) -> Result<(), Violation> {
    check_baseline(annotations, spec)?;
    if level == Level::Restricted {
        check_restricted(spec)?;
    }
    Ok(())
}

fn check_baseline(annotations: &Value, spec: &Value) -> Result<(), Violation> {
    let pod_sc = &spec["securityContext"];
    if pod_sc["windowsOptions"]["hostProcess"] == true
        || containers(spec).any(|c| c["securityContext"]["windowsOptions"]["hostProcess"] == true)
    {
        return violation("hostProcess", "a Windows host process".into());
    }
    for field in ["hostNetwork", "hostPID", "hostIPC"] {
        if spec[field] == true {
            return violation("host namespaces", format!("{field}=true"));
        }
    }
    for c in containers(spec) {
        let who = format!("container {:?}", name_of(c));
        let sc = &c["securityContext"];
        if sc["privileged"] == true {
            return violation(
                "privileged",
                format!("{who} must not set securityContext.privileged=true"),
            );
        }
        for cap in sc["capabilities"]["add"].as_array().into_iter().flatten() {
            let cap = cap.as_str().unwrap_or_default();
            if !BASELINE_CAPABILITIES.contains(&cap) {
                return violation(
                    "capabilities",
                    format!("{who} must not include {cap:?} in securityContext.capabilities.add"),
                );
            }
        }
        for port in c["ports"].as_array().into_iter().flatten() {
            if port["hostPort"].as_i64().is_some_and(|p| p != 0) {
                return violation(
                    "hostPort",
                    format!("{who} uses hostPort {}", port["hostPort"]),
                );
            }
        }
        if let Some(mount) = sc["procMount"].as_str()
            && mount != "Default"
        {
            return violation("procMount", format!("{who} must not set procMount={mount}"));
        }
    }
    for v in spec["volumes"].as_array().into_iter().flatten() {
        if v.get("hostPath").is_some() {
            return violation(
                "hostPath volumes",
                format!("volume {:?} is a hostPath", name_of(v)),
            );
        }
    }
    for (key, value) in annotations.as_object().into_iter().flatten() {
        if let Some(container) = key.strip_prefix("container.apparmor.security.beta.kubernetes.io/")
        {
            let value = value.as_str().unwrap_or_default();
            if value != "runtime/default" && !value.starts_with("localhost/") {
                return violation(
                    "AppArmor",
                    format!("container {container:?} must not use AppArmor profile {value:?}"),
                );
            }
        }
    }
    let contexts = std::iter::once(("the pod".to_string(), pod_sc)).chain(
        containers(spec).map(|c| (format!("container {:?}", name_of(c)), &c["securityContext"])),
    );
    for (who, sc) in contexts {
        if sc["appArmorProfile"]["type"] == "Unconfined" {
            return violation(
                "AppArmor",
                format!("{who} must not set appArmorProfile Unconfined"),
            );
        }
        let se = &sc["seLinuxOptions"];
        if let Some(t) = se["type"].as_str()
            && !t.is_empty()
            && !SELINUX_TYPES.contains(&t)
        {
            return violation("seLinuxOptions", format!("{who} must not set type {t:?}"));
        }
        for field in ["user", "role"] {
            if se[field].as_str().is_some_and(|s| !s.is_empty()) {
                return violation("seLinuxOptions", format!("{who} must not set {field}"));
            }
        }
        if sc["seccompProfile"]["type"] == "Unconfined" {
            return violation(
                "seccompProfile",
                format!("{who} must not set type Unconfined"),
            );
        }
    }
    for sysctl in pod_sc["sysctls"].as_array().into_iter().flatten() {
        let name = sysctl["name"].as_str().unwrap_or_default();
        if !SAFE_SYSCTLS.contains(&name) {
            return violation("forbidden sysctls", format!("{name:?}"));
        }
    }
    Ok(())
}

fn check_restricted(spec: &Value) -> Result<(), Violation> {
    for v in spec["volumes"].as_array().into_iter().flatten() {
        let kind = v
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, _)| k.as_str())
            .find(|k| *k != "name")
            .unwrap_or_default();
        if !RESTRICTED_VOLUMES.contains(&kind) {
            return violation(
                "restricted volume types",
                format!("volume {:?} uses {kind}", name_of(v)),
            );
        }
    }
    let pod_sc = &spec["securityContext"];
    let pod_seccomp = seccomp_set(pod_sc);
    for c in containers(spec) {
        let who = format!("container {:?}", name_of(c));
        let sc = &c["securityContext"];
        if sc["allowPrivilegeEscalation"] != false {
            return violation(
                "allowPrivilegeEscalation != false",
                format!("{who} must set securityContext.allowPrivilegeEscalation=false"),
            );
        }
        let non_root = sc["runAsNonRoot"]
            .as_bool()
            .or(pod_sc["runAsNonRoot"].as_bool());
        if non_root != Some(true) {
            return violation(
                "runAsNonRoot != true",
                format!("{who} must set securityContext.runAsNonRoot=true"),
            );
        }
        if sc["runAsUser"] == 0 || (sc["runAsUser"].is_null() && pod_sc["runAsUser"] == 0) {
            return violation("runAsUser=0", format!("{who} must not run as user 0"));
        }
        if !pod_seccomp && !seccomp_set(sc) {
            return violation(
                "seccompProfile",
                format!(
                    "{who} must set securityContext.seccompProfile.type to RuntimeDefault or Localhost"
                ),
            );
        }
        let drops_all = sc["capabilities"]["drop"]
            .as_array()
            .is_some_and(|d| d.iter().any(|c| c == "ALL"));
        if !drops_all {
            return violation(
                "unrestricted capabilities",
                format!("{who} must set securityContext.capabilities.drop=[\"ALL\"]"),
            );
        }
        for cap in sc["capabilities"]["add"].as_array().into_iter().flatten() {
            if cap != "NET_BIND_SERVICE" {
                return violation(
                    "unrestricted capabilities",
                    format!("{who} must not include {cap} in securityContext.capabilities.add"),
                );
            }
        }
    }
    if pod_sc["runAsUser"] == 0 {
        return violation("runAsUser=0", "the pod must not run as user 0".into());
    }
    Ok(())
}

/// Whether a securityContext sets a seccomp profile `restricted` accepts.
fn seccomp_set(sc: &Value) -> bool {
    matches!(
        sc["seccompProfile"]["type"].as_str(),
        Some("RuntimeDefault" | "Localhost")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(extra: Value) -> Value {
        let mut spec = json!({"containers": [{"name": "app", "image": "nginx"}]});
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        spec
    }

    fn container_sc(sc: Value) -> Value {
        json!({"containers": [{"name": "app", "securityContext": sc}]})
    }

    /// What `restricted` admits.
    fn hardened() -> Value {
        json!({"securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
               "containers": [{"name": "app", "securityContext": {
                   "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}}]})
    }

    #[test]
    fn baseline_table() {
        let none = json!({});
        let cases: Vec<(&str, Value, Value, Option<&str>)> = vec![
            ("a plain pod", none.clone(), pod(json!({})), None),
            (
                "hostNetwork",
                none.clone(),
                pod(json!({"hostNetwork": true})),
                Some("host namespaces"),
            ),
            (
                "hostPID false",
                none.clone(),
                pod(json!({"hostPID": false})),
                None,
            ),
            (
                "privileged",
                none.clone(),
                container_sc(json!({"privileged": true})),
                Some("privileged"),
            ),
            (
                "SYS_ADMIN",
                none.clone(),
                container_sc(json!({"capabilities": {"add": ["SYS_ADMIN"]}})),
                Some("capabilities"),
            ),
            (
                "CHOWN",
                none.clone(),
                container_sc(json!({"capabilities": {"add": ["CHOWN"]}})),
                None,
            ),
            (
                "hostPort",
                none.clone(),
                json!({"containers": [{"name": "a", "ports": [{"containerPort": 80, "hostPort": 80}]}]}),
                Some("hostPort"),
            ),
            (
                "hostPath",
                none.clone(),
                pod(json!({"volumes": [{"name": "h", "hostPath": {"path": "/"}}]})),
                Some("hostPath volumes"),
            ),
            (
                "nfs is baseline",
                none.clone(),
                pod(json!({"volumes": [{"name": "n", "nfs": {"server": "x", "path": "/"}}]})),
                None,
            ),
            (
                "procMount",
                none.clone(),
                container_sc(json!({"procMount": "Unmasked"})),
                Some("procMount"),
            ),
            (
                "seccomp Unconfined",
                none.clone(),
                pod(json!({"securityContext": {"seccompProfile": {"type": "Unconfined"}}})),
                Some("seccompProfile"),
            ),
            (
                "AppArmor field",
                none.clone(),
                container_sc(json!({"appArmorProfile": {"type": "Unconfined"}})),
                Some("AppArmor"),
            ),
            (
                "AppArmor annotation",
                json!({"container.apparmor.security.beta.kubernetes.io/app": "unconfined"}),
                pod(json!({})),
                Some("AppArmor"),
            ),
            (
                "AppArmor localhost",
                json!({"container.apparmor.security.beta.kubernetes.io/app": "localhost/p"}),
                pod(json!({})),
                None,
            ),
            (
                "SELinux type",
                none.clone(),
                container_sc(json!({"seLinuxOptions": {"type": "spc_t"}})),
                Some("seLinuxOptions"),
            ),
            (
                "SELinux level",
                none.clone(),
                container_sc(json!({"seLinuxOptions": {"level": "s0:c1"}})),
                None,
            ),
            (
                "sysctl",
                none.clone(),
                pod(
                    json!({"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}}),
                ),
                Some("forbidden sysctls"),
            ),
            (
                "hostProcess",
                none.clone(),
                container_sc(json!({"windowsOptions": {"hostProcess": true}})),
                Some("hostProcess"),
            ),
            (
                "ephemeral containers too",
                none.clone(),
                json!({"containers": [{"name": "a"}], "ephemeralContainers": [{"name": "e", "securityContext": {"privileged": true}}]}),
                Some("privileged"),
            ),
        ];
        for (name, annotations, spec, want) in cases {
            let got = check(&annotations, &spec, Level::Baseline);
            assert_eq!(got.as_ref().err().map(|v| v.check), want, "{name}: {got:?}");
        }
    }

    #[test]
    fn restricted_table() {
        let edit = |f: fn(&mut Value)| {
            let mut p = hardened();
            f(&mut p);
            p
        };
        let cases: Vec<(&str, Value, Option<&str>)> = vec![
            ("hardened", hardened(), None),
            (
                "a baseline violation first",
                edit(|p| p["hostIPC"] = json!(true)),
                Some("host namespaces"),
            ),
            (
                "escalation",
                edit(|p| {
                    p["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = json!(true)
                }),
                Some("allowPrivilegeEscalation != false"),
            ),
            (
                "root",
                edit(|p| p["securityContext"]["runAsNonRoot"] = json!(false)),
                Some("runAsNonRoot != true"),
            ),
            (
                "uid 0",
                edit(|p| p["containers"][0]["securityContext"]["runAsUser"] = json!(0)),
                Some("runAsUser=0"),
            ),
            (
                "no seccomp",
                edit(|p| p["securityContext"]["seccompProfile"] = Value::Null),
                Some("seccompProfile"),
            ),
            (
                "container seccomp",
                edit(|p| {
                    p["securityContext"]["seccompProfile"] = Value::Null;
                    p["containers"][0]["securityContext"]["seccompProfile"] =
                        json!({"type": "Localhost", "localhostProfile": "x"});
                }),
                None,
            ),
            (
                "no drop",
                edit(|p| p["containers"][0]["securityContext"]["capabilities"]["drop"] = json!([])),
                Some("unrestricted capabilities"),
            ),
            (
                "CHOWN",
                edit(|p| {
                    p["containers"][0]["securityContext"]["capabilities"]["add"] = json!(["CHOWN"])
                }),
                Some("unrestricted capabilities"),
            ),
            (
                "nfs",
                edit(|p| {
                    p["volumes"] = json!([{"name": "n", "nfs": {"server": "x", "path": "/"}}])
                }),
                Some("restricted volume types"),
            ),
            (
                "csi",
                edit(|p| p["volumes"] = json!([{"name": "c", "csi": {"driver": "d"}}])),
                None,
            ),
        ];
        for (name, spec, want) in cases {
            let got = check(&json!({}), &spec, Level::Restricted);
            assert_eq!(got.as_ref().err().map(|v| v.check), want, "{name}: {got:?}");
        }
    }

    #[test]
    fn levels_parse_and_privileged_is_none() {
        for level in [Level::Baseline, Level::Restricted] {
            assert_eq!(Level::parse(level.as_str()), Some(level));
        }
        assert_eq!(Level::parse("privileged"), None);
    }
}
