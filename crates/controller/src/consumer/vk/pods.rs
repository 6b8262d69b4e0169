//! What a virtual kubelet knows of each pod: the local pod, its shadow pod and real pod in the
//! provider (each reduced to what it acts on), the messages its watches send, and the pure
//! conversions between them.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tandem_api::{NamespaceOffloading, names};
use tandem_core::shadow::{self, IpRemap, VirtualNodeKeys};
use tokio::time::Instant;

use crate::lean::{LeanPod, PodStatusRef, ShadowPodRef};

/// What only makes sense in the consumer and is stripped from shadow pods.
pub const KEYS: VirtualNodeKeys<'static> = VirtualNodeKeys {
    label_keys: &[
        names::NODE_TYPE_LABEL,
        names::REMOTE_CLUSTER_LABEL,
        "kubernetes.io/hostname",
        // A pod on the virtual node can only name that node by `matchFields metadata.name`
        // (DaemonSet pods are pinned so): no provider node has that name.
        "metadata.name",
    ],
    taint_keys: &[names::VIRTUAL_NODE_TAINT],
};

/// (namespace, name) of a consumer pod.
pub(super) type Key = (String, String);

/// A consumer pod bound to the virtual node.
#[derive(Default)]
pub(super) struct LocalPod {
    pub(super) uid: String,
    pub(super) deleting: bool,
    /// The pod ran on the provider once (status.startTime is set).
    pub(super) started: bool,
    /// The translated ShadowPod spec, kept only until the shadow pod shows up.
    pub(super) shadow_spec: Option<Arc<Value>>,
    /// Hash of the status last written.
    pub(super) written: u64,
    /// The Ready condition of the status last written (None: none), and when it was written.
    pub(super) ready_written: Option<bool>,
    pub(super) written_at: Option<Instant>,
    /// The Ready condition as the pod's watch last showed it.
    pub(super) ready_seen: Option<bool>,
    /// Marked not Ready for an unreachable provider.
    pub(super) unready: bool,
    /// Why the pod must not be offloaded (a DaemonSet pod without the opt-in), if so.
    pub(super) refused: Option<Arc<str>>,
    /// When the last create or delete was sent (awaiting its watch event).
    pub(super) requested: Option<Instant>,
}

impl LocalPod {
    /// Whether the pod's readiness, as its watch shows it, has contradicted what this kubelet
    /// last wrote for longer than `lag`, what a watch takes to catch up: an event older than
    /// the write is not a contradiction.
    pub(super) fn contradicted(&self, now: Instant, lag: std::time::Duration) -> bool {
        !self.unready
            && self.written != 0
            && self.ready_written.is_some()
            && self.ready_seen.is_some()
            && self.ready_seen != self.ready_written
            && self
                .written_at
                .is_some_and(|t| now.saturating_duration_since(t) >= lag)
    }
}

/// A shadow pod on the provider.
#[derive(Clone, Debug)]
pub(super) struct RemoteShadow {
    pub(super) uid: String,
    pub(super) origin_uid: String,
    pub(super) deleting: bool,
    pub(super) rejected: Option<String>,
    /// The provider fenced it (its real pod is stopped and will not be restarted): since when,
    /// as this task first saw it.
    pub(super) fenced: Option<Instant>,
}

/// A real pod on the provider.
#[derive(Clone, Debug)]
pub(super) struct RemotePod {
    /// The real pod's own UID.
    pub(super) uid: String,
    pub(super) origin_uid: String,
    pub(super) hash: u64,
    /// The status tells the consumer something (see `shadow::status_is_news`); a real pod that
    /// is only created or scheduled gets no write.
    pub(super) news: bool,
    /// The consumer-view status to write, until written.
    pub(super) status: Option<Arc<Value>>,
    /// When this status arrived (the reflection lag is counted from here).
    pub(super) seen: Instant,
}

pub(super) enum Msg {
    LocalApply(Box<LeanPod>),
    LocalDelete(Key),
    LocalRelisted(Vec<LeanPod>),
    Offloading(Box<NamespaceOffloading>),
    OffloadingGone(String),
    NodeReady(bool),
    ShadowApply(String, String, RemoteShadow),
    ShadowDelete(String, String),
    ShadowsRelisted(String, Vec<(String, RemoteShadow)>),
    RealApply(String, String, RemotePod),
    RealDelete(String, String),
    RealRelisted(String, Vec<(String, RemotePod)>),
    Tick,
}

pub(super) fn hash_of(v: &Value) -> u64 {
    let mut h = DefaultHasher::new();
    v.to_string().hash(&mut h);
    h.finish().max(1)
}

pub(super) fn remote_shadow(sp: &ShadowPodRef) -> RemoteShadow {
    let st = sp.status.as_ref();
    RemoteShadow {
        uid: sp.uid().unwrap_or_default(),
        origin_uid: sp
            .spec
            .annotations
            .get(shadow::ORIGIN_UID_ANNOTATION)
            .cloned()
            .unwrap_or_default(),
        deleting: sp.metadata.deletion_timestamp.is_some(),
        rejected: st
            .filter(|s| s.phase.as_deref() == Some(crate::provider::shadowpod::PHASE_REJECTED))
            .map(|s| s.message.clone().unwrap_or_default()),
        fenced: st
            .is_some_and(|s| s.phase.as_deref() == Some(crate::provider::shadowpod::PHASE_FENCED))
            .then(Instant::now),
    }
}

pub(super) fn remote_pod(pod: &PodStatusRef, remap: Option<IpRemap>) -> RemotePod {
    // The mirrored status is a function of the real status and the remap alone, so their
    // hash stands for it without serializing the translated status again.
    let mut h = DefaultHasher::new();
    pod.status.as_deref().map(RawValue::get).hash(&mut h);
    remap.hash(&mut h);
    let status = shadow::consumer_status(pod.status_value(), remap);
    RemotePod {
        uid: pod.uid().unwrap_or_default(),
        origin_uid: pod
            .annotations()
            .get(shadow::ORIGIN_UID_ANNOTATION)
            .cloned()
            .unwrap_or_default(),
        hash: h.finish().max(1),
        news: shadow::status_is_news(&status),
        status: Some(Arc::new(status)),
        seen: Instant::now(),
    }
}

/// The ShadowPod spec of a consumer pod (see `shadow::shadow_spec`), labelled with the
/// consumer's cluster ID.
pub(super) fn shadow_spec_of(meta: &ObjectMeta, spec: Value, consumer_id: &str) -> Value {
    let mut pod = json!({"metadata": {"labels": meta.labels, "annotations": meta.annotations,
                                      "uid": meta.uid}});
    // Moved in, not through `json!` (which would copy it).
    pod["spec"] = spec;
    let mut out = shadow::shadow_spec(pod, &KEYS);
    if let Some(o) = out.as_object_mut() {
        let labels = o.entry("labels").or_insert_with(|| json!({}));
        if let Some(l) = labels.as_object_mut() {
            l.insert(names::ORIGIN_CLUSTER_LABEL.into(), consumer_id.into());
        }
    }
    out
}

/// A fenced shadow pod keeps the time it was first seen fenced (`known`: the same shadow pod as
/// last seen).
pub(super) fn keep_fenced_since(shadow: &mut RemoteShadow, known: Option<&RemoteShadow>) {
    if let (Some(_), Some(k)) = (shadow.fenced, known)
        && k.uid == shadow.uid
        && k.fenced.is_some()
    {
        shadow.fenced = k.fenced;
    }
}

/// Replaces the entries of `twin` in `map` with a fresh listing.
pub(super) fn replace_twin<R>(map: &mut HashMap<Key, R>, twin: &str, list: Vec<(String, R)>) {
    map.retain(|k, _| k.0 != twin);
    map.extend(
        list.into_iter()
            .map(|(name, r)| ((twin.to_string(), name), r)),
    );
}
