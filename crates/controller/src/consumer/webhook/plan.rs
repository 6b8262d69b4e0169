//! What the pod-placement webhook decides, pure, with the clock passed in: which webhook a call
//! is for ([`Hook`]); the answer to an AdmissionReview ([`triage`], [`Placing`]: an
//! [`Admission`], allowing the object as it is for an [`Untouched`] reason, or [`Refusal`]);
//! when the serving certificate is replaced ([`Rotations`]: a [`Rotation`], or a request
//! [`Ignored`]), its validity ([`validity`]) and the annotations recording it
//! ([`certificate_annotations`]); and the MutatingWebhookConfiguration pointing at the server
//! ([`configuration`]).

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use serde::Deserialize;
use serde_json::{Value, json};
use tandem_api::{NamespaceOffloading, PodOffloadingStrategy, names};
use tandem_core::offloading::{
    PodPlacement, SelectorTerm, eviction_tolerations, placement_patch, tolerates_virtual_nodes,
};
use tokio::time::Instant;

use crate::consumer::daemonset;
use crate::consumer::offloading::{
    OFFLOADING_ENABLED, OFFLOADING_LABEL, placement, selector_terms,
};
use crate::input::FieldError;
use crate::node_marks::MARKS;
use crate::provider::peer_writes;

pub use tandem_api::names::PLACEMENT_WEBHOOK as WEBHOOK_CONFIGURATION;
/// Annotation of the MutatingWebhookConfiguration asking for a new serving certificate: any
/// new value (`tandem rotate webhook-certificate` writes the time) is one request.
pub const ROTATE_ANNOTATION: &str = "tandem.dev/rotate-certificate";
/// Annotation the controller sets to the request it last fulfilled (the value of
/// [`ROTATE_ANNOTATION`]) once the new certificate serves.
pub const ROTATED_ANNOTATION: &str = "tandem.dev/certificate-rotated";
/// Annotation the controller sets to when the serving certificate expires (RFC 3339).
pub const NOT_AFTER_ANNOTATION: &str = "tandem.dev/certificate-not-after";
/// The longest serving certificate issued (a longer lifetime is cut to it).
pub const MAX_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// After a failed rotation, when to try again (the old certificate still serves).
pub(super) const ROTATION_RETRY: Duration = Duration::from_secs(30);

/// Path of the pod-placement webhook.
const MUTATE_PATH: &str = "/mutate-pods";

/// Path suffix of the webhook keeping pods of non-offloaded namespaces off virtual nodes.
const LOCAL_ONLY_SUFFIX: &str = "-local";

/// Where the API server calls the webhook.
#[derive(Clone, Debug)]
pub enum WebhookTarget {
    /// An address it reaches directly (`https://127.0.0.1:port`, in-process lab controllers).
    Url(String),
    /// A Service in front of the controller's pod (namespace, name), port 443.
    Service(String, String),
}

impl WebhookTarget {
    /// The `clientConfig` calling `path` on this target.
    pub(super) fn client_config(&self, path: &str, ca_pem: &str) -> Value {
        match self {
            WebhookTarget::Url(base) => {
                json!({"url": format!("{base}{path}"), "caBundle": STANDARD.encode(ca_pem)})
            }
            WebhookTarget::Service(namespace, name) => json!({
                "service": {"namespace": namespace, "name": name, "path": path, "port": 443},
                "caBundle": STANDARD.encode(ca_pem)}),
        }
    }

    /// Names the serving certificate must carry.
    pub(super) fn names(&self) -> Vec<String> {
        let mut names = vec!["127.0.0.1".to_string(), "localhost".to_string()];
        if let WebhookTarget::Service(ns, name) = self {
            names.push(format!("{name}.{ns}.svc"));
            names.push(format!("{name}.{ns}.svc.cluster.local"));
        }
        names
    }
}

/// The MutatingWebhookConfiguration pointing at `target`, trusting the CAs of `ca_pem`.
pub fn configuration(
    target: &WebhookTarget,
    ca_pem: &str,
    annotations: &Value,
) -> MutatingWebhookConfiguration {
    serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK_CONFIGURATION,
                     "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY},
                     "annotations": annotations},
        "webhooks": [{
            "name": "pod-placement.tandem.dev",
            "clientConfig": target.client_config(MUTATE_PATH, ca_pem),
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]},
                      {"operations": ["CREATE", "UPDATE"], "apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["daemonsets"]}],
            "namespaceSelector": {"matchLabels": {OFFLOADING_LABEL: OFFLOADING_ENABLED}},
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 10,
        }, {
            // Pods of namespaces that are not offloaded never land on a virtual node, even if
            // they tolerate its taint (no virtual kubelet would run them). Ignore on failure:
            // this must never block pod creation in the rest of the cluster.
            "name": "pod-locality.tandem.dev",
            "clientConfig": target.client_config(&format!("{MUTATE_PATH}{LOCAL_ONLY_SUFFIX}"), ca_pem),
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]},
                      {"operations": ["CREATE", "UPDATE"], "apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["daemonsets"]}],
            // Twin namespaces are left out: the provider's controller gives the pods it creates
            // there this affinity itself (see `provider::shadowpod`), sparing the API server a
            // webhook call per offloaded pod.
            "namespaceSelector": {"matchExpressions": [
                {"key": OFFLOADING_LABEL, "operator": "NotIn", "values": [OFFLOADING_ENABLED]},
                {"key": names::TWIN_NAMESPACE_LABEL, "operator": "DoesNotExist"}]},
            "failurePolicy": "Ignore",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5,
        }],
    }))
    .expect("static manifest")
}

// ---- The serving certificate ----

/// The validity (not before, not after) of a certificate issued at `now` for `lifetime`: from
/// five minutes ago (clock skew), for at most [`MAX_LIFETIME`].
pub(super) fn validity(
    now: time::OffsetDateTime,
    lifetime: Duration,
) -> (time::OffsetDateTime, time::OffsetDateTime) {
    (
        now - time::Duration::minutes(5),
        now + lifetime.min(MAX_LIFETIME),
    )
}

/// The annotations recording a certificate valid until `not_after` and the last rotation
/// request fulfilled.
pub(super) fn certificate_annotations(
    not_after: time::OffsetDateTime,
    fulfilled: Option<&str>,
) -> Value {
    let not_after = not_after
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    let mut annotations = json!({NOT_AFTER_ANNOTATION: not_after});
    if let Some(request) = fulfilled {
        annotations[ROTATED_ANNOTATION] = json!(request);
    }
    annotations
}

/// When a certificate of `lifetime` is replaced: after two thirds of it, and early enough that
/// the new one serves (a rotation takes `propagation`) a while before the old one expires.
pub(super) fn renew_after(lifetime: Duration, propagation: Duration) -> Duration {
    (lifetime * 2 / 3)
        .min(lifetime.saturating_sub(propagation * 2))
        .max(lifetime / 2)
}

/// Why the serving certificate is replaced now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Rotation {
    /// The certificate is due ([`renew_after`] since it began serving), or a rotation that was
    /// due failed [`ROTATION_RETRY`] ago.
    Due,
    /// The configuration's [`ROTATE_ANNOTATION`] took a value not fulfilled yet.
    Requested(String),
    /// A request whose rotation failed, tried again [`ROTATION_RETRY`] later.
    Retry(String),
}

impl Rotation {
    /// The reason the log lines give.
    pub(super) fn reason(&self) -> &'static str {
        match self {
            Rotation::Due => "scheduled",
            Rotation::Requested(_) | Rotation::Retry(_) => "requested",
        }
    }

    /// The request this rotation fulfils.
    fn request(&self) -> Option<&str> {
        match self {
            Rotation::Due => None,
            Rotation::Requested(r) | Rotation::Retry(r) => Some(r),
        }
    }
}

/// Why a value of [`ROTATE_ANNOTATION`] starts no rotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ignored {
    /// It was fulfilled already (by this server's start, or by a rotation).
    Fulfilled,
    /// Its rotation failed; it is tried again when due.
    Pending,
}

/// The rotation request the annotations name before and after a rotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Fulfilled<'a> {
    /// While both CAs are trusted, the old certificate still serving.
    pub before: Option<&'a str>,
    /// Once the new certificate serves.
    pub after: Option<&'a str>,
}

/// The rotations of one server's certificate: when the next is due, and the requests fulfilled
/// and pending.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Rotations {
    /// How long a certificate serves before it is replaced.
    renew_after: Duration,
    /// The request the annotations name as fulfilled.
    fulfilled: Option<String>,
    /// A request whose rotation failed, tried again at `due`.
    pending: Option<String>,
    /// When the next rotation is due.
    pub due: Instant,
}

impl Rotations {
    /// The rotations of a certificate of `lifetime`, serving since `now`, a rotation taking
    /// `propagation`; `fulfilled`: the request its issue fulfilled.
    pub(super) fn new(
        lifetime: Duration,
        propagation: Duration,
        fulfilled: Option<String>,
        now: Instant,
    ) -> Self {
        let renew_after = renew_after(lifetime, propagation);
        Rotations {
            renew_after,
            fulfilled,
            pending: None,
            due: now + renew_after,
        }
    }

    /// The rotation made once `due` has passed: the pending request's, or the scheduled one.
    pub(super) fn when_due(&mut self) -> Rotation {
        match self.pending.take() {
            Some(request) => Rotation::Retry(request),
            None => Rotation::Due,
        }
    }

    /// The rotation `request` (a value of [`ROTATE_ANNOTATION`] seen) asks for, if any.
    pub(super) fn when_requested(&self, request: String) -> Result<Rotation, Ignored> {
        if self.fulfilled.as_ref() == Some(&request) {
            Err(Ignored::Fulfilled)
        } else if self.pending.as_ref() == Some(&request) {
            Err(Ignored::Pending)
        } else {
            Ok(Rotation::Requested(request))
        }
    }

    /// The requests the annotations name as fulfilled during `rotation`: the one already
    /// fulfilled, then this rotation's (only once the new certificate serves).
    pub(super) fn annotated<'a>(&'a self, rotation: &'a Rotation) -> Fulfilled<'a> {
        Fulfilled {
            before: self.fulfilled.as_deref(),
            after: rotation.request().or(self.fulfilled.as_deref()),
        }
    }

    /// After `rotation` succeeded at `now`: its request is fulfilled, the next is due in
    /// `renew_after`.
    pub(super) fn rotated(&mut self, rotation: Rotation, now: Instant) {
        if let Some(request) = rotation.request() {
            self.fulfilled = Some(request.to_string());
            self.pending = None;
        }
        self.due = now + self.renew_after;
    }

    /// After `rotation` failed at `now`: tried again in [`ROTATION_RETRY`] (its request
    /// pending, if it had one).
    pub(super) fn failed(&mut self, rotation: Rotation, now: Instant) {
        self.pending = rotation.request().map(String::from);
        self.due = now + ROTATION_RETRY;
    }
}

// ---- Admission ----

/// Which of the webhooks this server serves a call is for, by its path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Hook {
    /// The provider's check of what peers write in twin namespaces (`provider::peer_writes`).
    PeerWrites,
    /// `pod-locality.tandem.dev`: namespaces that are not offloaded.
    LocalOnly,
    /// `pod-placement.tandem.dev`: offloaded namespaces.
    Placement,
}

impl Hook {
    /// The webhook called at `path`.
    pub(super) fn of(path: &str) -> Hook {
        if path == peer_writes::PATH {
            Hook::PeerWrites
        } else if path.ends_with(LOCAL_ONLY_SUFFIX) {
            Hook::LocalOnly
        } else {
            Hook::Placement
        }
    }
}

/// The AdmissionReview answering with `response`.
pub(super) fn answer(response: Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    })
}

/// The parts of an AdmissionReview the webhook reads. Decoding only these skips the rest of
/// the pod (its metadata, containers, volumes...): the webhook is called for every pod created.
#[derive(Default, Deserialize)]
#[serde(default)]
pub(super) struct Review {
    pub request: ReviewRequest,
}

/// The `request` of an AdmissionReview, as far as the webhook reads it.
#[derive(Default, Deserialize)]
#[serde(default)]
pub(super) struct ReviewRequest {
    pub uid: Value,
    kind: ReviewKind,
    namespace: Option<String>,
    object: Option<PlacementFields>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct ReviewKind {
    kind: String,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct PlacementFields {
    metadata: PlacementMetadata,
    spec: PlacementSpec,
}

/// Whether the pod has annotations, which the fence's bound is added to rather than replacing
/// them; their contents are skipped, not decoded.
#[derive(Default, Deserialize)]
#[serde(default)]
struct PlacementMetadata {
    annotations: Option<serde::de::IgnoredAny>,
}

/// What `placement_patch`, `tolerates_virtual_nodes` and `local_claims` read of a pod.
#[derive(Default, Deserialize)]
#[serde(default)]
struct PlacementSpec {
    tolerations: Value,
    affinity: Value,
    volumes: Value,
}

impl ReviewRequest {
    /// Whether the pod under review has annotations.
    fn has_annotations(&self) -> bool {
        self.object
            .as_ref()
            .is_some_and(|o| o.metadata.annotations.is_some())
    }

    /// The pod as far as placement goes (absent fields read as null, as in the whole pod).
    fn pod(&self) -> Value {
        let spec = self.object.as_ref().map(|o| &o.spec);
        json!({"spec": {
            "tolerations": spec.map_or(&Value::Null, |s| &s.tolerations),
            "affinity": spec.map_or(&Value::Null, |s| &s.affinity),
            "volumes": spec.map_or(&Value::Null, |s| &s.volumes),
        }})
    }
}

/// What the webhook answers for one object.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Admission {
    /// Allowed as it is.
    Unchanged(Untouched),
    /// A pod of a namespace that is not offloaded, tolerating the virtual-node taint: allowed
    /// with the Local strategy's affinity (JSON patch), so that it still stays off virtual nodes.
    KeptLocal(Vec<Value>),
    /// A pod of an offloaded namespace: allowed with its namespace's eviction timing, fencing
    /// bound and placement on nodes `strategy` allows (JSON patch).
    Placed {
        strategy: PodPlacement,
        patch: Vec<Value>,
    },
    /// A DaemonSet, in any namespace: allowed, kept off virtual nodes unless it opts in (then
    /// its pods carry the opt-in), by the JSON patch (see `consumer::daemonset`).
    DaemonSet(Vec<Value>),
    /// Refused: the pod cannot be placed as its namespace asks.
    Refused(Refusal),
}

/// Why an object is allowed as it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Untouched {
    /// Not a pod (nor a DaemonSet); an unreadable review reads as such.
    NotAPod,
    /// A pod of no namespace.
    NoNamespace,
    /// Its namespace has no NamespaceOffloading, or it is being deleted.
    NotOffloaded,
    /// A pod of a namespace that is not offloaded, not tolerating the virtual-node taint: the
    /// taint keeps it off virtual nodes.
    TaintKeepsItOff,
    /// It carries already what would be added.
    NothingToAdd,
}

/// Why a pod is refused (the answer's status code and message).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// The namespace's NamespaceOffloading could not be read: failing closed, since a pod
    /// placed without its constraints could land anywhere.
    OffloadingUnreadable { namespace: String, error: String },
    /// The offloading's cluster selector means nothing (its status reports it too): a pod
    /// placed by it could land anywhere.
    InvalidSelector {
        namespace: String,
        problem: FieldError,
    },
    /// The namespace runs pods only in providers (Remote), but volumes of the pod live in this
    /// cluster (`claims`, see [`Placing::reads_claims`]) and cannot follow it there.
    LocalClaims {
        namespace: String,
        claims: Vec<String>,
    },
    /// The pod's claims could not be read.
    ClaimsUnreadable { namespace: String, error: String },
}

impl Refusal {
    /// The answer's status code.
    fn code(&self) -> u16 {
        match self {
            Refusal::OffloadingUnreadable { .. } | Refusal::ClaimsUnreadable { .. } => 500,
            Refusal::InvalidSelector { .. } | Refusal::LocalClaims { .. } => 422,
        }
    }

    /// The answer's message, which `kubectl` prints when the pod is refused.
    pub(super) fn message(&self) -> String {
        match self {
            Refusal::OffloadingUnreadable { namespace, error } => format!(
                "tandem pod placement: reading NamespaceOffloading {namespace}/{}: {error}",
                names::OFFLOADING_NAME
            ),
            Refusal::InvalidSelector { namespace, problem } => format!(
                "tandem pod placement: NamespaceOffloading {namespace}/{}: {problem}",
                names::OFFLOADING_NAME
            ),
            Refusal::LocalClaims { namespace, claims } => format!(
                "tandem pod placement: namespace {namespace} runs pods only in providers (Remote), \
                 but claim(s) {} are not of StorageClass {:?} and cannot follow the pod there; \
                 give them storageClassName {:?} or offload with LocalAndRemote",
                claims.join(", "),
                names::STORAGE_CLASS,
                names::STORAGE_CLASS
            ),
            Refusal::ClaimsUnreadable { namespace, error } => {
                format!("tandem pod placement: reading the pod's claims in {namespace}: {error}")
            }
        }
    }
}

impl Admission {
    /// Allowed, changed by `patch` by `changed`, or as it is when there is nothing to add.
    fn patched(patch: Vec<Value>, changed: impl FnOnce(Vec<Value>) -> Admission) -> Admission {
        if patch.is_empty() {
            Admission::Unchanged(Untouched::NothingToAdd)
        } else {
            changed(patch)
        }
    }

    /// The AdmissionReview's `response` for the object `uid`.
    pub(super) fn response(self, uid: &Value) -> Value {
        match self {
            Admission::Unchanged(_) => json!({"uid": uid, "allowed": true}),
            Admission::KeptLocal(patch)
            | Admission::Placed { patch, .. }
            | Admission::DaemonSet(patch) => allowed_with(uid, patch),
            Admission::Refused(refusal) => json!({"uid": uid, "allowed": false, "status": {
                "code": refusal.code(),
                "message": refusal.message(),
            }}),
        }
    }
}

/// An admission that allows the object, changed by `patch` (JSON patch) unless it is empty.
fn allowed_with(uid: &Value, patch: Vec<Value>) -> Value {
    if patch.is_empty() {
        return json!({"uid": uid, "allowed": true});
    }
    json!({
        "uid": uid,
        "allowed": true,
        "patchType": "JSONPatch",
        "patch": STANDARD.encode(Value::Array(patch).to_string()),
    })
}

/// How a review for `hook` is answered: from the review alone, or from the NamespaceOffloading
/// of the pod's namespace (a [`Placing`]). `body`: the whole review, which a DaemonSet's
/// answer reads.
pub(super) fn triage<'a>(hook: Hook, request: &'a ReviewRequest, body: &[u8]) -> Triage<'a> {
    if request.kind.kind == "DaemonSet" {
        // Rare (DaemonSets change seldom): the whole object is decoded.
        return Triage::Answer(keep_daemonset_off_virtual_nodes(body));
    }
    if hook == Hook::LocalOnly {
        return Triage::Answer(keep_local(request));
    }
    let namespace = request.namespace.as_deref().unwrap_or_default();
    if request.kind.kind != "Pod" {
        Triage::Answer(Admission::Unchanged(Untouched::NotAPod))
    } else if namespace.is_empty() {
        Triage::Answer(Admission::Unchanged(Untouched::NoNamespace))
    } else {
        Triage::Offloaded(namespace)
    }
}

/// How a review is answered.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Triage<'a> {
    /// From the review alone.
    Answer(Admission),
    /// A pod of this namespace, offloaded: from its NamespaceOffloading.
    Offloaded(&'a str),
}

/// A pod of a namespace that is not offloaded: if it tolerates the virtual-node taint, add the
/// Local strategy's affinity so that it still stays off virtual nodes. Other pods are untouched.
pub(super) fn keep_local(request: &ReviewRequest) -> Admission {
    let pod = request.pod();
    if request.kind.kind != "Pod" {
        return Admission::Unchanged(Untouched::NotAPod);
    }
    if !tolerates_virtual_nodes(&pod, MARKS) {
        return Admission::Unchanged(Untouched::TaintKeepsItOff);
    }
    let patch = placement_patch(&pod, placement(PodOffloadingStrategy::Local), &[], MARKS);
    Admission::patched(patch, Admission::KeptLocal)
}

/// A DaemonSet, in any namespace: kept off virtual nodes unless it opts in (see
/// `consumer::daemonset`).
fn keep_daemonset_off_virtual_nodes(body: &[u8]) -> Admission {
    let review: Value = serde_json::from_slice(body).unwrap_or_default();
    Admission::patched(
        daemonset::admission_patch(&review["request"]["object"]),
        Admission::DaemonSet,
    )
}

/// The offloading's `evictAfter` in whole seconds (rounded up), when set and readable (its
/// schema's pattern makes it so).
pub(super) fn evict_after_seconds(offloading: &NamespaceOffloading) -> Option<i64> {
    let d = tandem_core::fence::parse(offloading.spec.evict_after.as_deref()?)?;
    i64::try_from(tandem_core::fence::whole_seconds(d)).ok()
}

/// A pod of an offloaded namespace, its NamespaceOffloading read: the patch so far (eviction
/// timing and fencing bound), and where it is placed, once its claims are known.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Placing {
    namespace: String,
    /// The pod as far as placement goes, with the patch so far applied.
    pod: Value,
    patch: Vec<Value>,
    strategy: PodPlacement,
    terms: Vec<SelectorTerm>,
}

impl Placing {
    /// A pod of `namespace` (`request`) whose NamespaceOffloading `lookup` found (from the
    /// cache, or the API server on a miss); else the answer already.
    pub(super) fn new(
        namespace: &str,
        request: &ReviewRequest,
        lookup: Result<Option<NamespaceOffloading>, impl std::fmt::Display>,
    ) -> Result<Placing, Admission> {
        let offloading = match lookup {
            Ok(Some(o)) if o.metadata.deletion_timestamp.is_none() => o,
            Ok(_) => return Err(Admission::Unchanged(Untouched::NotOffloaded)),
            Err(e) => {
                return Err(Admission::Refused(Refusal::OffloadingUnreadable {
                    namespace: namespace.to_string(),
                    error: e.to_string(),
                }));
            }
        };
        let terms = selector_terms(&offloading);
        if let Err(problem) = crate::input::cluster_selector(&terms) {
            return Err(Admission::Refused(Refusal::InvalidSelector {
                namespace: namespace.to_string(),
                problem,
            }));
        }
        let mut pod = request.pod();
        let mut patch = Vec::new();
        // The namespace's eviction timing first: the placement patch then appends to the
        // tolerations as they are after it.
        if let Some(seconds) = evict_after_seconds(&offloading)
            && let Some(tolerations) = eviction_tolerations(&pod, seconds)
        {
            patch.push(json!({"op": "add", "path": "/spec/tolerations", "value": tolerations}));
            pod["spec"]["tolerations"] = tolerations;
        }
        // Fencing: the pod carries its bound, which the virtual kubelet passes on to the provider
        // (as a label of its ShadowPod) and the consumer's fence reads back.
        if let Some(fence_after) = offloading.spec.fence_after() {
            patch.push(if request.has_annotations() {
                json!({"op": "add",
                    "path": format!("/metadata/annotations/{}", names::FENCE_AFTER.replace('/', "~1")),
                    "value": fence_after})
            } else {
                json!({"op": "add", "path": "/metadata/annotations",
                    "value": {names::FENCE_AFTER: fence_after}})
            });
        }
        Ok(Placing {
            namespace: namespace.to_string(),
            pod,
            patch,
            strategy: placement(offloading.spec.pod_offloading_strategy),
            terms,
        })
    }

    /// Whether the pod's claims are read before it is placed: only a pod that may run on a
    /// virtual node needs its volumes to follow it there.
    pub(super) fn reads_claims(&self) -> bool {
        self.strategy != PodPlacement::Local
    }

    /// The pod, whose volumes `local_claims` reads.
    pub(super) fn pod(&self) -> &Value {
        &self.pod
    }

    /// The answer, the pod's volumes that live in this cluster being `claims` (read only when
    /// [`Placing::reads_claims`]; none else).
    pub(super) fn admission(
        self,
        claims: Result<Vec<String>, impl std::fmt::Display>,
    ) -> Admission {
        let Placing {
            namespace,
            pod,
            mut patch,
            mut strategy,
            terms,
        } = self;
        if strategy != PodPlacement::Local {
            match claims {
                Ok(local) if local.is_empty() => {}
                // A volume of this cluster cannot follow the pod to a provider: the pod stays here.
                Ok(_) if strategy == PodPlacement::LocalAndRemote => {
                    strategy = PodPlacement::Local;
                }
                Ok(local) => {
                    return Admission::Refused(Refusal::LocalClaims {
                        namespace,
                        claims: local,
                    });
                }
                Err(e) => {
                    return Admission::Refused(Refusal::ClaimsUnreadable {
                        namespace,
                        error: e.to_string(),
                    });
                }
            }
        }
        patch.extend(placement_patch(&pod, strategy, &terms, MARKS));
        Admission::patched(patch, |patch| Admission::Placed { strategy, patch })
    }
}

#[cfg(test)]
mod tests;
