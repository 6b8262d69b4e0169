//! `ShadowPod`: what a consumer creates in a twin namespace instead of a bare Pod. The provider's
//! controller creates and keeps the real Pod, so it survives the loss of the consumer.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodSpec;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The pod a consumer wants run, already translated for the provider.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "tandem.dev",
    version = "v1alpha1",
    kind = "ShadowPod",
    namespaced,
    status = "ShadowPodStatus",
    shortname = "spod",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ShadowPodSpec {
    /// Labels of the real Pod.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "crate::schema::labels")]
    pub labels: BTreeMap<String, String>,
    /// Annotations of the real Pod.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Spec of the real Pod.
    #[schemars(schema_with = "crate::schema::pod_spec")]
    pub pod: PodSpec,
}

/// The provider's account of the shadow pod.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ShadowPodStatus {
    /// Created, Rejected (quota or policy) or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
