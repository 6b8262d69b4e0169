//! kubelet's restart policy: whether a container that exited is started again. Shared by the
//! hollow kubelet and the supervisor of real processes (network mode).

use k8s_openapi::api::core::v1::Pod;

/// Whether a container that exited with `code` is restarted under `policy`.
pub fn restarts(policy: &str, code: i32) -> bool {
    match policy {
        "Never" => false,
        "OnFailure" => code != 0,
        _ => true,
    }
}

/// The pod's restartPolicy (kube-apiserver defaults it to Always).
pub fn restart_policy(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always")
}
