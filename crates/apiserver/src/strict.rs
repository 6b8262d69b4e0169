//! Unknown fields of built-in kinds, found as kube-apiserver's strict decoding finds them when
//! a client asks for `fieldValidation=Strict` (kubectl does for create, apply, replace, edit
//! and patch): the object is decoded into its typed form — k8s-openapi's structs, which follow
//! the Go types' JSON tags — and encoded again; a field of the request that does not come back
//! is one the kind does not have. Without Strict nothing is checked here: kube would drop
//! such fields silently or with a warning, and the decode costs every controller write.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::registry::ResourceInfo;

/// The paths (`spec.template.spec.containers[0].imagee`) of `obj`'s fields that kind `res`
/// does not have, in the order they appear; None when the kind is not one checked here or the
/// object does not decode as it (its other validation reports why).
pub fn unknown_fields(res: &ResourceInfo, obj: &Value) -> Option<Vec<String>> {
    use k8s_openapi::api::{
        admissionregistration, apps, batch, certificates, coordination, core, discovery, events,
        node, policy, rbac, scheduling, storage,
    };
    let back = match (res.group.as_str(), res.version.as_str(), res.kind.as_str()) {
        ("", "v1", "Namespace") => roundtrip::<core::v1::Namespace>(obj),
        ("", "v1", "Pod") => roundtrip::<core::v1::Pod>(obj),
        ("", "v1", "Node") => roundtrip::<core::v1::Node>(obj),
        ("", "v1", "Service") => roundtrip::<core::v1::Service>(obj),
        ("", "v1", "Endpoints") => roundtrip::<core::v1::Endpoints>(obj),
        ("", "v1", "ConfigMap") => roundtrip::<core::v1::ConfigMap>(obj),
        ("", "v1", "Secret") => roundtrip::<core::v1::Secret>(obj),
        ("", "v1", "ServiceAccount") => roundtrip::<core::v1::ServiceAccount>(obj),
        ("", "v1", "Event") => roundtrip::<core::v1::Event>(obj),
        ("", "v1", "ResourceQuota") => roundtrip::<core::v1::ResourceQuota>(obj),
        ("", "v1", "PersistentVolumeClaim") => roundtrip::<core::v1::PersistentVolumeClaim>(obj),
        ("", "v1", "PersistentVolume") => roundtrip::<core::v1::PersistentVolume>(obj),
        ("apps", "v1", "Deployment") => roundtrip::<apps::v1::Deployment>(obj),
        ("apps", "v1", "ReplicaSet") => roundtrip::<apps::v1::ReplicaSet>(obj),
        ("apps", "v1", "StatefulSet") => roundtrip::<apps::v1::StatefulSet>(obj),
        ("apps", "v1", "DaemonSet") => roundtrip::<apps::v1::DaemonSet>(obj),
        ("apps", "v1", "ControllerRevision") => roundtrip::<apps::v1::ControllerRevision>(obj),
        ("batch", "v1", "Job") => roundtrip::<batch::v1::Job>(obj),
        ("batch", "v1", "CronJob") => roundtrip::<batch::v1::CronJob>(obj),
        ("storage.k8s.io", "v1", "StorageClass") => roundtrip::<storage::v1::StorageClass>(obj),
        ("policy", "v1", "PodDisruptionBudget") => {
            roundtrip::<policy::v1::PodDisruptionBudget>(obj)
        }
        ("coordination.k8s.io", "v1", "Lease") => roundtrip::<coordination::v1::Lease>(obj),
        ("discovery.k8s.io", "v1", "EndpointSlice") => {
            roundtrip::<discovery::v1::EndpointSlice>(obj)
        }
        ("events.k8s.io", "v1", "Event") => roundtrip::<events::v1::Event>(obj),
        ("rbac.authorization.k8s.io", "v1", "Role") => roundtrip::<rbac::v1::Role>(obj),
        ("rbac.authorization.k8s.io", "v1", "RoleBinding") => {
            roundtrip::<rbac::v1::RoleBinding>(obj)
        }
        ("rbac.authorization.k8s.io", "v1", "ClusterRole") => {
            roundtrip::<rbac::v1::ClusterRole>(obj)
        }
        ("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding") => {
            roundtrip::<rbac::v1::ClusterRoleBinding>(obj)
        }
        ("certificates.k8s.io", "v1", "CertificateSigningRequest") => {
            roundtrip::<certificates::v1::CertificateSigningRequest>(obj)
        }
        ("admissionregistration.k8s.io", "v1", "MutatingWebhookConfiguration") => {
            roundtrip::<admissionregistration::v1::MutatingWebhookConfiguration>(obj)
        }
        ("admissionregistration.k8s.io", "v1", "ValidatingWebhookConfiguration") => {
            roundtrip::<admissionregistration::v1::ValidatingWebhookConfiguration>(obj)
        }
        ("node.k8s.io", "v1", "RuntimeClass") => roundtrip::<node::v1::RuntimeClass>(obj),
        ("scheduling.k8s.io", "v1", "PriorityClass") => {
            roundtrip::<scheduling::v1::PriorityClass>(obj)
        }
        _ => None,
    }?;
    let mut unknown = Vec::new();
    missing("", obj, &back, &mut unknown);
    Some(unknown)
}

fn roundtrip<T: DeserializeOwned + Serialize>(obj: &Value) -> Option<Value> {
    let typed: T = serde_json::from_value(obj.clone()).ok()?;
    serde_json::to_value(typed).ok()
}

/// Adds to `out` the paths of `sent` that `back` lacks (nulls are no field).
fn missing(path: &str, sent: &Value, back: &Value, out: &mut Vec<String>) {
    match (sent, back) {
        (Value::Object(sent), Value::Object(back)) => {
            for (key, value) in sent {
                if value.is_null() {
                    continue;
                }
                let here = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match back.get(key) {
                    None => out.push(here),
                    Some(returned) => missing(&here, value, returned, out),
                }
            }
        }
        (Value::Array(sent), Value::Array(back)) => {
            for (i, (value, returned)) in sent.iter().zip(back).enumerate() {
                missing(&format!("{path}[{i}]"), value, returned, out);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::registry::Registry;

    fn res(group: &str, kind: &str) -> std::sync::Arc<ResourceInfo> {
        Registry::builtin()
            .resources_at(group, "v1")
            .into_iter()
            .find(|r| r.kind == kind)
            .expect("a built-in kind")
    }

    #[test]
    fn fields_the_kind_lacks_are_named_by_their_path() {
        let deployment = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "labels": {"any": "label"}},
            "spec": {
                "replicas": 2, "replica": 3,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [
                        {"name": "a", "image": "x"},
                        {"name": "b", "imagee": "y", "env": null},
                    ]},
                },
            },
        });
        assert_eq!(
            unknown_fields(&res("apps", "Deployment"), &deployment),
            Some(vec![
                "spec.replica".to_string(),
                "spec.template.spec.containers[1].imagee".to_string(),
            ])
        );
        let config_map = json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"},
            "data": {"any-key": "v"}, "binaryData": {}, "immutable": false,
        });
        assert_eq!(
            unknown_fields(&res("", "ConfigMap"), &config_map),
            Some(vec![])
        );
    }
}
