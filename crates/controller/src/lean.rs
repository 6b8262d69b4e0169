//! Pods (and shadow pods) as the controllers watch them: metadata without `managedFields`,
//! spec and status kept as raw JSON and parsed only where a decision needs them.
//!
//! Decoding a watch event into k8s-openapi's `Pod` builds a serde_json tree for every
//! `managedFields` entry (`fieldsV1`) and a typed copy of the whole spec and status. No
//! controller of ours reads managedFields, and most events only need a few fields: in a
//! 10,000-pod burst that decoding was over a quarter of the consumer controller's CPU.
//! k8s-openapi's types cannot skip a field, hence this type; kube's metadata-only watches
//! (`PartialObjectMetadata`) would drop the status the virtual kubelet mirrors.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

/// A Pod read from a watch or a list (see the module documentation), with its spec as `S`:
/// kept as raw JSON ([`LeanPod`]) or skipped without being built ([`PodStatusRef`]).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PodView<S> {
    #[serde(default, deserialize_with = "meta_without_managed_fields")]
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<S>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Box<RawValue>>,
}

/// A Pod with its spec and status as raw JSON.
pub type LeanPod = PodView<Box<RawValue>>;

/// A Pod without its spec: what the virtual kubelet reads of the real pods it mirrors.
pub type PodStatusRef = PodView<serde::de::IgnoredAny>;

impl LeanPod {
    /// The spec as a JSON tree (`null` when absent or unreadable).
    pub fn spec_value(&self) -> Value {
        parse_raw(self.spec.as_deref())
    }
}

/// A Pod with only what its effective requests are computed from read of its spec (each
/// container's and init container's requests and restart policy, the overhead): what the
/// provider's controller watches of real pods. Kept as raw JSON, each real pod's spec was
/// copied on every event and then built into a tree once: a tenth of that controller's CPU in
/// a burst.
pub type PodRequestsView = PodView<RequestsSpec>;

impl PodRequestsView {
    /// The spec's requests as a JSON tree of the spec's shape (`null` when absent).
    pub fn requests_spec(&self) -> Value {
        self.spec
            .as_ref()
            .and_then(|spec| serde_json::to_value(spec).ok())
            .unwrap_or(Value::Null)
    }
}

/// See [`PodRequestsView`]. Every field is optional and may be `null`, as in a spec read as a
/// tree.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestsSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    containers: Option<Vec<RequestsContainer>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    init_containers: Option<Vec<RequestsContainer>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    overhead: Option<Value>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RequestsContainer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    resources: Option<RequestsOnly>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    restart_policy: Option<Value>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct RequestsOnly {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    requests: Option<Value>,
}

impl<S> PodView<S> {
    /// The status as a JSON tree (`null` when absent or unreadable).
    pub fn status_value(&self) -> Value {
        parse_raw(self.status.as_deref())
    }

    /// Whether `status.startTime` is set (the pod has run on its node).
    pub fn started(&self) -> bool {
        self.status_fields().is_some_and(|s| s.start_time.is_some())
    }

    /// `status.phase`.
    pub fn phase(&self) -> Option<String> {
        self.status_fields().and_then(|s| s.phase)
    }

    /// Whether `status.startTime` is set, and the status of the Ready condition (None when
    /// there is none): read in one pass.
    pub fn started_and_ready(&self) -> (bool, Option<bool>) {
        let Some(s) = self.status_fields() else {
            return (false, None);
        };
        let ready = s
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.status == "True");
        (s.start_time.is_some(), ready)
    }

    fn status_fields(&self) -> Option<StatusFields> {
        serde_json::from_str(self.status.as_deref()?.get()).ok()
    }
}

/// The status fields read without building the rest.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StatusFields {
    #[serde(default)]
    start_time: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    phase: Option<String>,
    #[serde(default)]
    conditions: Vec<ConditionFields>,
}

/// A condition's type and status.
#[derive(Deserialize)]
struct ConditionFields {
    #[serde(rename = "type")]
    type_: String,
    status: String,
}

fn parse_raw(raw: Option<&RawValue>) -> Value {
    raw.and_then(|r| serde_json::from_str(r.get()).ok())
        .unwrap_or(Value::Null)
}

/// Makes `$lean` the same API resource as `$full` (kind, group, version, plural, namespaced),
/// so that `Api<$lean>` lists and watches what `Api<$full>` would.
macro_rules! same_resource_as {
    ($lean:ty, $full:ty) => {
        impl kube::Resource for $lean {
            type DynamicType = ();
            type Scope = NamespaceResourceScope;

            fn kind(dt: &()) -> Cow<'_, str> {
                <$full as kube::Resource>::kind(dt)
            }
            fn group(dt: &()) -> Cow<'_, str> {
                <$full as kube::Resource>::group(dt)
            }
            fn version(dt: &()) -> Cow<'_, str> {
                <$full as kube::Resource>::version(dt)
            }
            fn plural(dt: &()) -> Cow<'_, str> {
                <$full as kube::Resource>::plural(dt)
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

same_resource_as!(LeanPod, Pod);
same_resource_as!(PodStatusRef, Pod);
same_resource_as!(PodRequestsView, Pod);

/// A ShadowPod as a controller reads it: metadata without managedFields, the spec's labels and
/// annotations, the status, and the pod spec inside as `P` — skipped ([`ShadowPodRef`]) or kept
/// as raw JSON ([`LeanShadowPod`]). A typed `ShadowPod` decodes a whole PodSpec into typed
/// structs for every event.
#[derive(Clone, Debug, Deserialize)]
pub struct ShadowPodView<P> {
    #[serde(default, deserialize_with = "meta_without_managed_fields")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ShadowPodViewSpec<P>,
    #[serde(default)]
    pub status: Option<tandem_api::ShadowPodStatus>,
}

/// The part of a ShadowPod's spec a [`ShadowPodView`] keeps.
#[derive(Clone, Debug, Deserialize)]
pub struct ShadowPodViewSpec<P> {
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    pub pod: Option<P>,
}

// Not derived: that would want `P: Default`.
impl<P> Default for ShadowPodViewSpec<P> {
    fn default() -> Self {
        Self {
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            pod: None,
        }
    }
}

/// What the virtual kubelet reads of a shadow pod: its origin UID (an annotation), deletion and
/// status; the pod spec is skipped without being built.
pub type ShadowPodRef = ShadowPodView<serde::de::IgnoredAny>;

/// What the provider's shadow-pod controller keeps of a shadow pod: the pod spec as raw JSON,
/// parsed once, when the real pod is made from it ([`LeanShadowPod::pod_value`]).
pub type LeanShadowPod = ShadowPodView<Box<RawValue>>;

impl LeanShadowPod {
    /// The pod spec as a JSON tree (`null` when absent or unreadable).
    pub fn pod_value(&self) -> Value {
        parse_raw(self.spec.pod.as_deref())
    }
}

same_resource_as!(ShadowPodRef, tandem_api::ShadowPod);
same_resource_as!(LeanShadowPod, tandem_api::ShadowPod);

/// ObjectMeta's fields but `managedFields` (and the deprecated `selfLink`), which serde skips
/// without building anything.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    annotations: Option<BTreeMap<String, String>>,
    creation_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
    generate_name: Option<String>,
    generation: Option<i64>,
    labels: Option<BTreeMap<String, String>>,
    name: Option<String>,
    namespace: Option<String>,
    owner_references: Option<Vec<OwnerReference>>,
    resource_version: Option<String>,
    uid: Option<String>,
}

fn meta_without_managed_fields<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let m = Meta::deserialize(d)?;
    Ok(ObjectMeta {
        annotations: m.annotations,
        creation_timestamp: m.creation_timestamp,
        deletion_grace_period_seconds: m.deletion_grace_period_seconds,
        deletion_timestamp: m.deletion_timestamp,
        finalizers: m.finalizers,
        generate_name: m.generate_name,
        generation: m.generation,
        labels: m.labels,
        managed_fields: None,
        name: m.name,
        namespace: m.namespace,
        owner_references: m.owner_references,
        resource_version: m.resource_version,
        self_link: None,
        uid: m.uid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_what_controllers_use_and_drops_managed_fields() {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-1", "namespace": "app", "uid": "u-1",
                "resourceVersion": "42", "labels": {"app": "web"},
                "annotations": {"tandem.dev/origin-uid": "o-1"},
                "deletionTimestamp": "2026-11-22T10:00:00Z",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": "web", "uid": "rs-1", "controller": true}],
                "managedFields": [{"manager": "kubelet", "operation": "Update",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:phase": {}}}}]},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "pause"}]},
            "status": {"phase": "Running", "startTime": "2026-11-22T09:00:00Z",
                       "podIP": "10.244.0.5"},
        });
        let lean: LeanPod = serde_json::from_str(&pod.to_string()).expect("decodes");
        let m = &lean.metadata;
        assert_eq!(m.name.as_deref(), Some("web-1"));
        assert_eq!(m.namespace.as_deref(), Some("app"));
        assert_eq!(m.uid.as_deref(), Some("u-1"));
        assert_eq!(m.resource_version.as_deref(), Some("42"));
        assert_eq!(m.labels.as_ref().map(|l| l["app"].as_str()), Some("web"));
        assert!(m.deletion_timestamp.is_some());
        assert_eq!(m.owner_references.as_ref().map(Vec::len), Some(1));
        assert!(m.managed_fields.is_none());
        assert!(lean.started());
        assert_eq!(lean.phase().as_deref(), Some("Running"));
        assert_eq!(lean.status_value()["podIP"], "10.244.0.5");
        assert_eq!(lean.spec_value()["nodeName"], "n1");
        // As JSON it is the pod without managedFields.
        let back = serde_json::to_value(&lean).expect("encodes");
        assert_eq!(back["spec"], pod["spec"]);
        assert_eq!(back["status"], pod["status"]);
        assert!(back["metadata"].get("managedFields").is_none());
        // Without the spec: the same metadata and status.
        let slim: PodStatusRef = serde_json::from_str(&pod.to_string()).expect("decodes");
        assert_eq!(slim.metadata.uid.as_deref(), Some("u-1"));
        assert!(slim.metadata.managed_fields.is_none());
        assert_eq!(slim.phase().as_deref(), Some("Running"));
        assert_eq!(slim.status_value(), pod["status"]);

        let pending: LeanPod =
            serde_json::from_str(r#"{"metadata": {"name": "p"}, "status": {"phase": "Pending"}}"#)
                .expect("decodes");
        assert!(!pending.started());
        assert_eq!(pending.phase().as_deref(), Some("Pending"));
        assert_eq!(pending.spec_value(), Value::Null);
    }

    #[test]
    fn the_requests_spec_gives_the_requests_of_the_whole_spec() {
        use tandem_core::pod_resources::effective_requests;
        let specs = [
            json!({"containers": [
                      {"name": "a", "image": "x", "resources": {"requests": {"cpu": "250m", "memory": "64Mi"},
                                                                "limits": {"cpu": "1"}}},
                      {"name": "b", "image": "x", "resources": {"requests": {"cpu": "1", "ephemeral-storage": "1Gi"}}}],
                   "initContainers": [
                      {"name": "side", "image": "x", "restartPolicy": "Always",
                       "resources": {"requests": {"cpu": "100m"}}},
                      {"name": "init", "image": "x", "resources": {"requests": {"cpu": "2"}}}],
                   "overhead": {"cpu": "50m"},
                   "nodeName": "n1", "volumes": [{"name": "v", "emptyDir": {}}]}),
            json!({"containers": [{"name": "a", "image": "x", "resources": null,
                                   "restartPolicy": null}],
                   "initContainers": null, "overhead": null}),
            json!({"containers": [{"name": "a", "image": "x"}]}),
        ];
        for spec in specs {
            let pod = json!({"metadata": {"name": "p", "uid": "u"}, "spec": spec,
                             "status": {"phase": "Running"}});
            let lean: PodRequestsView = serde_json::from_value(pod.clone()).expect("decodes");
            assert_eq!(
                effective_requests(&lean.requests_spec()),
                effective_requests(&pod["spec"]),
                "{spec}"
            );
            assert_eq!(lean.metadata.uid.as_deref(), Some("u"));
            assert_eq!(lean.phase().as_deref(), Some("Running"));
        }
        let bare: PodRequestsView = serde_json::from_str(r#"{"metadata": {"name": "p"}}"#).unwrap();
        assert_eq!(bare.requests_spec(), Value::Null);
    }

    #[test]
    fn shadow_pod_ref_reads_origin_and_status_without_the_pod_spec() {
        let sp = json!({
            "apiVersion": "tandem.dev/v1alpha1", "kind": "ShadowPod",
            "metadata": {"name": "web-1", "namespace": "app-c1", "uid": "s-1",
                "managedFields": [{"manager": "m", "fieldsV1": {"f:spec": {}}}]},
            "spec": {"labels": {"app": "web"},
                     "annotations": {"tandem.dev/origin-uid": "o-1"},
                     "pod": {"containers": [{"name": "c", "image": "pause"}]}},
            "status": {"phase": "Rejected", "message": "quota"},
        });
        let r: ShadowPodRef = serde_json::from_str(&sp.to_string()).expect("decodes");
        assert_eq!(r.metadata.uid.as_deref(), Some("s-1"));
        assert!(r.metadata.managed_fields.is_none());
        assert_eq!(r.spec.annotations["tandem.dev/origin-uid"], "o-1");
        let status = r.status.expect("status");
        assert_eq!(status.phase.as_deref(), Some("Rejected"));
        assert_eq!(status.message.as_deref(), Some("quota"));
        assert_eq!(
            <ShadowPodRef as kube::Resource>::url_path(&(), Some("app-c1")),
            <tandem_api::ShadowPod as kube::Resource>::url_path(&(), Some("app-c1"))
        );
    }

    #[test]
    fn lean_shadow_pod_keeps_the_pod_spec_as_sent() {
        let pod = json!({"containers": [{"name": "c", "image": "pause",
                             "resources": {"requests": {"cpu": "100m"}}}],
                         "hostNetwork": false});
        let sp = json!({
            "apiVersion": "tandem.dev/v1alpha1", "kind": "ShadowPod",
            "metadata": {"name": "web-1", "namespace": "app-c1", "uid": "s-1",
                "managedFields": [{"manager": "m", "fieldsV1": {"f:spec": {}}}]},
            "spec": {"labels": {"app": "web"}, "annotations": {"a": "b"}, "pod": pod},
        });
        let lean: LeanShadowPod = serde_json::from_str(&sp.to_string()).expect("decodes");
        assert!(lean.metadata.managed_fields.is_none());
        assert_eq!(lean.spec.labels["app"], "web");
        assert_eq!(lean.spec.annotations["a"], "b");
        assert_eq!(lean.pod_value(), pod);
        assert!(lean.status.is_none());
        // A shadow pod without a pod spec (the schema requires one) reads as null.
        let bare: LeanShadowPod =
            serde_json::from_str(r#"{"metadata": {"name": "x"}}"#).expect("decodes");
        assert_eq!(bare.pod_value(), Value::Null);
        assert!(bare.spec.labels.is_empty());
    }
}
