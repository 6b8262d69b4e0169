//! Provider side of offloaded pods: for every ShadowPod a consumer creates in one of its twin
//! namespaces, create and keep the real Pod (same namespace and name, owned by the ShadowPod so
//! garbage collection removes it), under the consumer's quota (its Tenant's grant) and the
//! provider's pod admission (`tandem_core::pod_admission`: Pod Security at the Tenant's level,
//! and the ServiceAccount, node, placement, tolerations and priority decided here, never taken
//! from the peer).
//!
//! The real pods live on without the consumer: that is what makes offloading survive a
//! partition. One task watches ShadowPods, the pods they own, twin namespaces and Tenants, keeps
//! small indexes and sends the writes each pass decides, in parallel.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tandem_api::client;
use tandem_api::{ShadowPod, Tenant, names};
use tandem_core::offloading::keep_off_virtual_nodes;
use tandem_core::pod_admission::{self, PodSecurityLevel, ProviderPodPolicy};
use tandem_core::pod_resources::{self, ChargePolicy, WithoutRequests};
use tandem_core::shadow::{self, Resources};

use crate::batch::IndexLoop;
use crate::context::Ctx;
use crate::lean::{LeanShadowPod, PodRequestsView};
use crate::requests::create_unread;
use crate::watches::watch_events;

/// Phase of a ShadowPod whose real pod exists.
pub const PHASE_CREATED: &str = "Created";
/// Phase of a ShadowPod the provider refuses (quota or policy).
pub const PHASE_REJECTED: &str = "Rejected";
/// Phase of a ShadowPod whose real pod the provider's fence stopped (see `provider::fence`):
/// it is never run again; the consumer replaces its pod and deletes it.
pub const PHASE_FENCED: &str = "Fenced";

/// Events applied before a pass runs, at most, and writes in flight at once.
const LOOP: IndexLoop = IndexLoop {
    batch: 2000,
    parallel: 32,
};
/// Full pass period.
const RESYNC: std::time::Duration = std::time::Duration::from_secs(5);

type Key = (String, String);

/// A real pod, as far as quota and ownership go.
struct PodRecord {
    uid: String,
    owner_uid: Option<String>,
    consumer: String,
    requests: Resources,
    /// Succeeded or Failed: no longer counts against the quota, and is not recreated.
    terminal: bool,
}

#[derive(Default)]
struct State {
    shadows: HashMap<Key, Arc<LeanShadowPod>>,
    pods: HashMap<Key, PodRecord>,
    /// Pods created by this task that the watch has not shown yet.
    pending: HashMap<Key, (String, Resources)>,
    /// Consumer → requests of its live pods, those in `pending` included (kept as `pods` and
    /// `pending` change: summing them on every pass made bursts quadratic).
    used: HashMap<String, Resources>,
    /// Shadow pods whose status is Rejected.
    rejected: HashSet<Key>,
    /// Shadow pods whose real pod the API server refused as malformed or invalid (400, 422):
    /// the version of the shadow pod (see `version_of`) and the API server's message. Not
    /// retried until the shadow pod's spec changes, as the same spec would be refused again.
    refused: HashMap<Key, (String, String)>,
    /// Twin namespace → consumer cluster ID.
    twins: HashMap<String, String>,
    /// Twin namespace → the pod offloading strategy it was created for (its label).
    twin_strategies: HashMap<String, String>,
    /// Consumer → the pod offloading strategies its Tenant allows, and who set the limit.
    pod_limits: HashMap<String, (Vec<String>, String)>,
    /// Consumer → granted resources.
    grants: HashMap<String, Resources>,
    /// Consumer → what its Tenant says of its pods (absent: the defaults, `baseline`).
    pod_policies: HashMap<String, ProviderPodPolicy>,
    dirty: HashSet<Key>,
    /// The watches (by [`Ev::kind`]) listing now: until each has listed, its store does not
    /// speak for the cluster — a shadow pod whose real pod is not listed yet would be created
    /// again, over a pod the fence may be deleting (see `run`).
    listing: [bool; 4],
}

#[allow(clippy::large_enum_variant)] // one event at a time, straight from a watch
enum Ev {
    Shadow(watcher::Event<LeanShadowPod>),
    Pod(watcher::Event<PodRequestsView>),
    Ns(watcher::Event<Namespace>),
    Tenant(watcher::Event<Tenant>),
    /// Periodic full pass (retries failed writes).
    Tick,
}

impl Ev {
    /// Which watch the event is from, and whether it starts (true) or ends (false) a listing.
    fn listing(&self) -> Option<(usize, bool)> {
        fn of<K>(kind: usize, e: &watcher::Event<K>) -> Option<(usize, bool)> {
            match e {
                watcher::Event::Init => Some((kind, true)),
                watcher::Event::InitDone => Some((kind, false)),
                _ => None,
            }
        }
        match self {
            Ev::Shadow(e) => of(0, e),
            Ev::Pod(e) => of(1, e),
            Ev::Ns(e) => of(2, e),
            Ev::Tenant(e) => of(3, e),
            Ev::Tick => None,
        }
    }
}

/// The consumer a namespace is a twin namespace of, from its labels.
fn twin_consumer(ns: &Namespace) -> Option<String> {
    let labels = ns.metadata.labels.as_ref()?;
    if labels.contains_key(names::TENANT_NAMESPACE_LABEL) {
        return None;
    }
    labels
        .get(names::ORIGIN_CLUSTER_LABEL)
        .or_else(|| {
            labels
                .contains_key(names::TWIN_NAMESPACE_LABEL)
                .then(|| labels.get(names::REMOTE_CLUSTER_LABEL))
                .flatten()
        })
        .cloned()
}

/// The record of `pod`; `known` is its current record, whose requests are reused when it is the
/// same pod (a pod's requests do not change, and parsing its spec on every status update
/// would be most of what a burst costs here).
fn pod_record(pod: &PodRequestsView, known: Option<&PodRecord>) -> PodRecord {
    let uid = pod.uid().unwrap_or_default();
    let requests = match known {
        Some(k) if k.uid == uid => k.requests.clone(),
        _ => shadow::pod_requests(&pod.requests_spec()),
    };
    let phase = pod.phase();
    PodRecord {
        uid,
        owner_uid: pod
            .owner_references()
            .iter()
            .find(|o| o.kind == "ShadowPod")
            .map(|o| o.uid.clone()),
        consumer: pod
            .labels()
            .get(names::ORIGIN_CLUSTER_LABEL)
            .cloned()
            .unwrap_or_default(),
        requests,
        terminal: matches!(phase.as_deref(), Some("Succeeded" | "Failed")),
    }
}

/// Which spec of a shadow pod a refusal was for: its UID and generation (which changes with
/// the spec, not with the status).
fn version_of(sp: &LeanShadowPod) -> String {
    format!(
        "{}/{}",
        sp.metadata.uid.as_deref().unwrap_or_default(),
        sp.metadata.generation.unwrap_or_default()
    )
}

fn key_of<K: kube::Resource>(o: &K) -> Key {
    (
        o.meta().namespace.clone().unwrap_or_default(),
        o.meta().name.clone().unwrap_or_default(),
    )
}

impl State {
    fn count(&mut self, consumer: &str, requests: &Resources, add: bool) {
        let used = self.used.entry(consumer.to_string()).or_default();
        if add {
            shadow::add(used, requests);
        } else {
            shadow::sub(used, requests);
        }
    }

    fn insert_pod(&mut self, key: Key, rec: PodRecord) {
        if !rec.terminal {
            self.count(&rec.consumer, &rec.requests, true);
        }
        if let Some(old) = self.pods.insert(key, rec)
            && !old.terminal
        {
            self.count(&old.consumer, &old.requests, false);
        }
    }

    fn remove_pod(&mut self, key: &Key) -> Option<PodRecord> {
        let old = self.pods.remove(key)?;
        if !old.terminal {
            self.count(&old.consumer, &old.requests, false);
        }
        Some(old)
    }

    fn insert_pending(&mut self, key: Key, consumer: String, requests: Resources) {
        self.count(&consumer, &requests, true);
        if let Some((c, r)) = self.pending.insert(key, (consumer, requests)) {
            self.count(&c, &r, false);
        }
    }

    fn remove_pending(&mut self, key: &Key) {
        if let Some((c, r)) = self.pending.remove(key) {
            self.count(&c, &r, false);
        }
    }

    fn apply(&mut self, ev: Ev) {
        if let Some((kind, starts)) = ev.listing() {
            self.listing[kind] = starts;
        }
        match ev {
            Ev::Shadow(e) => match e {
                watcher::Event::Apply(s) | watcher::Event::InitApply(s) => {
                    let k = key_of(&s);
                    self.dirty.insert(k.clone());
                    if s.status.as_ref().and_then(|st| st.phase.as_deref()) == Some(PHASE_REJECTED)
                    {
                        self.rejected.insert(k.clone());
                    } else {
                        self.rejected.remove(&k);
                    }
                    self.shadows.insert(k, Arc::new(s));
                }
                watcher::Event::Delete(s) => {
                    let k = key_of(&s);
                    self.rejected.remove(&k);
                    self.refused.remove(&k);
                    self.shadows.remove(&k);
                }
                watcher::Event::Init => {
                    self.shadows.clear();
                    self.rejected.clear();
                }
                watcher::Event::InitDone => {
                    // Refusals of shadow pods deleted while the watch was down go with them.
                    let shadows = &self.shadows;
                    self.refused.retain(|k, _| shadows.contains_key(k));
                    self.dirty.extend(self.shadows.keys().cloned());
                }
            },
            Ev::Pod(e) => match e {
                watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                    let k = key_of(&p);
                    self.remove_pending(&k);
                    let rec = pod_record(&p, self.pods.get(&k));
                    let newly_terminal =
                        rec.terminal && !self.pods.get(&k).is_some_and(|old| old.terminal);
                    let consumer = rec.consumer.clone();
                    self.insert_pod(k.clone(), rec);
                    if newly_terminal {
                        self.free_quota_of(&consumer);
                    }
                    self.dirty.insert(k);
                }
                watcher::Event::Delete(p) => {
                    let k = key_of(&p);
                    if let Some(rec) = self.remove_pod(&k) {
                        self.free_quota_of(&rec.consumer);
                    }
                    self.dirty.insert(k);
                }
                watcher::Event::Init => {
                    let keys: Vec<Key> = self.pods.keys().cloned().collect();
                    for k in keys {
                        self.remove_pod(&k);
                    }
                }
                watcher::Event::InitDone => self.dirty.extend(self.shadows.keys().cloned()),
            },
            Ev::Ns(e) => match e {
                watcher::Event::Apply(n) | watcher::Event::InitApply(n) => {
                    if let Some(c) = twin_consumer(&n) {
                        self.twins.insert(n.name_any(), c);
                    }
                    match n.labels().get(names::POD_OFFLOADING_LABEL) {
                        Some(s) => self.twin_strategies.insert(n.name_any(), s.clone()),
                        None => self.twin_strategies.remove(&n.name_any()),
                    };
                    self.dirty_namespace(&n.name_any());
                }
                watcher::Event::Delete(n) => {
                    self.twins.remove(&n.name_any());
                    self.twin_strategies.remove(&n.name_any());
                }
                watcher::Event::Init => {
                    self.twins.clear();
                    self.twin_strategies.clear();
                }
                watcher::Event::InitDone => self.dirty.extend(self.shadows.keys().cloned()),
            },
            Ev::Tick => self.dirty.extend(self.shadows.keys().cloned()),
            Ev::Tenant(e) => match e {
                watcher::Event::Apply(t) | watcher::Event::InitApply(t) => {
                    // Only the tenant namespace of a consumer speaks for its grant.
                    // An invalid grant (reported on the Tenant) leaves the last valid one in force.
                    if t.namespace().as_deref()
                        == Some(names::tenant_namespace(&t.spec.cluster_id).as_str())
                        && crate::input::grant(&t.spec.grant).is_ok()
                    {
                        let grant = t
                            .spec
                            .grant
                            .iter()
                            .filter_map(|(k, v)| Some((k.clone(), shadow::parse_quantity(&v.0)?)))
                            .collect();
                        self.grants.insert(t.spec.cluster_id.clone(), grant);
                        self.free_quota_of(&t.spec.cluster_id);
                    }
                    if t.namespace().as_deref()
                        == Some(names::tenant_namespace(&t.spec.cluster_id).as_str())
                    {
                        let consumer = t.spec.cluster_id.clone();
                        match &t.spec.allowed_pod_offloading_strategies {
                            Some(allowed) => {
                                let by = match t.annotations().get(names::POLICY_ANNOTATION) {
                                    Some(p) => format!("PeeringPolicy {p}"),
                                    None => format!(
                                        "Tenant {}/{consumer}",
                                        names::tenant_namespace(&consumer)
                                    ),
                                };
                                let allowed = allowed
                                    .iter()
                                    .map(|s| {
                                        serde_json::to_value(s)
                                            .ok()
                                            .and_then(|v| v.as_str().map(str::to_string))
                                            .unwrap_or_default()
                                    })
                                    .collect();
                                self.pod_limits.insert(consumer.clone(), (allowed, by));
                            }
                            None => {
                                self.pod_limits.remove(&consumer);
                            }
                        }
                        self.pod_policies
                            .insert(consumer.clone(), pod_policy_of(&t.spec));
                        // Rejected shadow pods may be allowed now, and admitted ones are
                        // checked again at their next pass.
                        self.free_quota_of(&consumer);
                    }
                }
                watcher::Event::Delete(t) => {
                    self.grants.remove(&t.spec.cluster_id);
                    self.pod_limits.remove(&t.spec.cluster_id);
                    self.pod_policies.remove(&t.spec.cluster_id);
                }
                watcher::Event::Init => {
                    self.grants.clear();
                    self.pod_limits.clear();
                    self.pod_policies.clear();
                }
                watcher::Event::InitDone => self.dirty.extend(self.shadows.keys().cloned()),
            },
        }
    }

    /// Rejected shadow pods of `consumer` may fit now.
    fn free_quota_of(&mut self, consumer: &str) {
        let rejected: Vec<Key> = self
            .rejected
            .iter()
            .filter(|k| self.twins.get(&k.0).map(String::as_str) == Some(consumer))
            .cloned()
            .collect();
        self.dirty.extend(rejected);
    }

    fn dirty_namespace(&mut self, ns: &str) {
        let keys: Vec<Key> = self.shadows.keys().filter(|k| k.0 == ns).cloned().collect();
        self.dirty.extend(keys);
    }

    /// Decides the writes for the dirty shadow pods, in order (quota is first come, first served).
    fn decide(&mut self) -> Vec<Action> {
        let mut dirty: Vec<Key> = self.dirty.drain().collect();
        dirty.sort();
        let mut actions = Vec::new();
        for key in dirty {
            let Some(sp) = self.shadows.get(&key).cloned() else {
                continue;
            };
            if sp.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let uid = sp.uid().unwrap_or_default();
            let status_is = |phase: &str, message: &str| {
                sp.status.as_ref().is_some_and(|s| {
                    s.phase.as_deref() == Some(phase)
                        && s.message.as_deref().unwrap_or("") == message
                })
            };
            if sp.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(PHASE_FENCED) {
                // Fenced: never (re)started; a real pod still there goes at once.
                if self
                    .pods
                    .get(&key)
                    .is_some_and(|p| p.owner_uid.as_deref() == Some(uid.as_str()))
                {
                    actions.push(Action::DeletePod {
                        key: key.clone(),
                        grace: Some(0),
                    });
                }
                continue;
            }
            let mut set_status = |phase: &str, message: String| {
                if !status_is(phase, &message) {
                    actions.push(Action::Status {
                        key: key.clone(),
                        phase: phase.to_string(),
                        message,
                    });
                }
            };
            if let Some(pod) = self.pods.get(&key) {
                if pod.owner_uid.as_deref() == Some(uid.as_str()) {
                    // Only a shadow pod rejected earlier gets a status saying it now runs: the
                    // real pod's own status is the truth, and a write per pod would cost a burst
                    // one more write (and two watch events) per pod.
                    if self.rejected.contains(&key) {
                        set_status(PHASE_CREATED, format!("pod {}/{} created", key.0, key.1));
                    }
                } else if pod.owner_uid.is_some() {
                    // The pod of an earlier shadow pod of the same name: make way.
                    actions.push(Action::DeletePod {
                        key: key.clone(),
                        grace: None,
                    });
                } else {
                    set_status(
                        PHASE_REJECTED,
                        format!(
                            "a pod {}/{} not owned by Tandem already exists",
                            key.0, key.1
                        ),
                    );
                }
                continue;
            }
            if self.pending.contains_key(&key) {
                continue;
            }
            match self.refused.get(&key) {
                Some((version, why)) if *version == version_of(&sp) => {
                    set_status(PHASE_REJECTED, why.clone());
                    continue;
                }
                Some(_) => {
                    self.refused.remove(&key);
                }
                None => {}
            }
            let Some(consumer) = self.twins.get(&key.0).cloned() else {
                set_status(
                    PHASE_REJECTED,
                    format!(
                        "namespace {} is not a twin namespace of any consumer",
                        key.0
                    ),
                );
                continue;
            };
            if let (Some((allowed, by)), Some(strategy)) = (
                self.pod_limits.get(&consumer),
                self.twin_strategies.get(&key.0),
            ) && !allowed.contains(strategy)
            {
                set_status(
                    PHASE_REJECTED,
                    format!(
                        "pod offloading strategy {strategy} of namespace {} is not allowed for consumer {consumer} by {by} (allowed: {})",
                        key.0,
                        allowed.join(", ")
                    ),
                );
                continue;
            }
            let policy = self
                .pod_policies
                .get(&consumer)
                .unwrap_or(&DEFAULT_POD_POLICY);
            // Admitted, then charged: the defaults and bounded limits go on the real pod.
            let admitted = pod_admission::check_annotations(&sp.spec.annotations)
                .and_then(|()| pod_admission::admit(sp.pod_value(), policy))
                .and_then(|mut spec| {
                    let charge = pod_resources::charge(&mut spec, &policy.charge)?;
                    Ok((spec, charge))
                });
            let (spec, charge) = match admitted {
                Ok(admitted) => admitted,
                Err(refusal) => {
                    set_status(
                        PHASE_REJECTED,
                        format!(
                            "{refusal} (Tenant {}/{consumer})",
                            names::tenant_namespace(&consumer)
                        ),
                    );
                    continue;
                }
            };
            let requests = charge.requests;
            let grant = self.grants.get(&consumer).cloned().unwrap_or_default();
            if grant.is_empty() {
                set_status(
                    PHASE_REJECTED,
                    format!(
                        "consumer {consumer} has no resources granted (Tenant {}/{consumer})",
                        names::tenant_namespace(&consumer)
                    ),
                );
                continue;
            }
            let consumer_used = self.used.get(&consumer).cloned().unwrap_or_default();
            if let Err(why) = shadow::fits(&consumer_used, &requests, &grant) {
                // A pod that asked for none of the resource it exceeds is told what it was
                // charged, and by which rule.
                let defaulted = match charge.defaulted.iter().find(|k| **k == why.resource) {
                    Some(k) => format!(
                        "; containers requesting no {k} are charged the provider's default (podResources.defaultRequests)"
                    ),
                    None => String::new(),
                };
                set_status(
                    PHASE_REJECTED,
                    format!(
                        "{why} (grant of Tenant {}/{consumer}{defaulted})",
                        names::tenant_namespace(&consumer)
                    ),
                );
                continue;
            }
            self.insert_pending(key.clone(), consumer.clone(), requests);
            actions.push(Action::CreatePod {
                key: key.clone(),
                pod: real_pod(&sp, spec, &consumer),
            });
        }
        actions
    }
}

/// The policy of a consumer whose Tenant is not known (parsed once, not per pod).
static DEFAULT_POD_POLICY: std::sync::LazyLock<ProviderPodPolicy> =
    std::sync::LazyLock::new(ProviderPodPolicy::default);

/// What a Tenant says of its consumer's pods (its quantities parsed here, once per Tenant
/// event, never per pod).
fn pod_policy_of(spec: &tandem_api::TenantSpec) -> ProviderPodPolicy {
    let resources = spec.pod_resources.clone().unwrap_or_default();
    let strings = |m: Option<
        std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >| {
        m.map(|m| {
            m.into_iter()
                .map(|(k, v)| (k, v.0))
                .collect::<std::collections::BTreeMap<String, String>>()
        })
    };
    let defaults = strings(resources.default_requests);
    let ratios = strings(resources.max_limit_request_ratio);
    ProviderPodPolicy {
        level: match spec.pod_security.unwrap_or_default() {
            tandem_api::PodSecurity::Baseline => PodSecurityLevel::Baseline,
            tandem_api::PodSecurity::Restricted => PodSecurityLevel::Restricted,
        },
        charge: ChargePolicy::from_settings(
            defaults.as_ref(),
            match resources.without_requests {
                tandem_api::WithoutRequests::Charge => WithoutRequests::Charge,
                tandem_api::WithoutRequests::Refuse => WithoutRequests::Refuse,
            },
            ratios.as_ref(),
        ),
        ..Default::default()
    }
}

/// The real Pod of a shadow pod, whose spec (as JSON) is `spec` (admitted by the provider's
/// pod admission).
fn real_pod(sp: &LeanShadowPod, spec: Value, consumer: &str) -> Value {
    let mut labels = sp.spec.labels.clone();
    labels.insert(names::ORIGIN_CLUSTER_LABEL.into(), consumer.into());
    labels.insert(names::MANAGED_BY_LABEL.into(), names::MANAGED_BY.into());
    // The fence's bound, as on the shadow pod: the fence stops the real pod itself, even
    // after its shadow pod is gone (a pod still shutting down).
    if let Some(bound) = sp.labels().get(names::FENCE_AFTER) {
        labels.insert(names::FENCE_AFTER.into(), bound.clone());
    }
    let annotations: serde_json::Map<String, Value> =
        pod_admission::kept_annotations(&sp.spec.annotations)
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": sp.name_any(), "namespace": sp.namespace(),
            "labels": labels, "annotations": annotations,
            "ownerReferences": [{"apiVersion": "tandem.dev/v1alpha1", "kind": "ShadowPod",
                "name": sp.name_any(), "uid": sp.uid(), "controller": true, "blockOwnerDeletion": true}],
        },
    });
    // Moved in, not through `json!` (which would copy it).
    pod["spec"] = spec;
    // This cluster may have virtual nodes of its own: a real pod must not be offloaded again.
    // (The pod-locality webhook does this for other namespaces; it skips twin namespaces.)
    keep_off_virtual_nodes(&mut pod, crate::node_marks::MARKS);
    pod
}

/// How long the first (or a new) listing of the watches may take before it is said.
const LISTING_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

enum Action {
    CreatePod {
        key: Key,
        pod: Value,
    },
    DeletePod {
        key: Key,
        /// The grace period (None: the pod's own).
        grace: Option<u32>,
    },
    Status {
        key: Key,
        phase: String,
        message: String,
    },
}

/// What a write came to: a failed create frees its place in the quota.
enum Outcome {
    Done,
    /// Failed for a reason that may pass (unreachable API server, conflict, quota): retried.
    CreateFailed(Key),
    /// The API server refused the pod itself (400, 422): the shadow pod is Rejected with its
    /// message.
    CreateRefused(Key, String),
    /// Decide again (a write met a newer version).
    Retry(Key),
}

async fn act(client: Client, action: Action) -> Outcome {
    match action {
        Action::CreatePod { key, pod } => {
            // A shadow pod under a fence is read afresh: fencing marks it before it deletes
            // the real pod, and this pass may have seen the deletion but not the mark.
            if pod["metadata"]["labels"][names::FENCE_AFTER].is_string()
                && is_fenced(&client, &key).await != Some(false)
            {
                return Outcome::CreateFailed(key);
            }
            // The created pod in the answer is not decoded.
            match create_unread::<Pod>(&client, &key.0, &pod).await {
                Ok(()) => Outcome::Done,
                // A pod of that name exists. Tandem's own: this pass's view is behind (the
                // watch will show it, or its deletion), and it is decided again rather than
                // left pending, as a pod deleted before the watch showed it would block the
                // name for good. Another's: the watch (of Tandem's pods) never shows it, so
                // it is said here.
                Err(e) if client::is_conflict(&e) => {
                    let existing = Api::<Pod>::namespaced(client.clone(), &key.0)
                        .get_opt(&key.1)
                        .await;
                    match existing {
                        Ok(Some(p))
                            if !p
                                .owner_references()
                                .iter()
                                .any(|o| o.kind == "ShadowPod" && o.controller == Some(true)) =>
                        {
                            Outcome::CreateRefused(
                                key.clone(),
                                format!(
                                    "a pod {}/{} not owned by Tandem already exists",
                                    key.0, key.1
                                ),
                            )
                        }
                        _ => Outcome::CreateFailed(key),
                    }
                }
                Err(kube::Error::Api(s)) if s.is_invalid() || s.code == 400 => {
                    Outcome::CreateRefused(key, format!("the real pod was refused: {}", s.message))
                }
                Err(e) => {
                    tracing::warn!(pod = %format!("{}/{}", key.0, key.1), "creating the real pod of the shadow pod: {e}");
                    Outcome::CreateFailed(key)
                }
            }
        }
        Action::DeletePod { key, grace } => {
            let api: Api<Pod> = Api::namespaced(client, &key.0);
            let dp = kube::api::DeleteParams {
                grace_period_seconds: grace,
                ..Default::default()
            };
            if let Err(e) = api.delete(&key.1, &dp).await
                && !client::is_not_found(&e)
            {
                tracing::warn!(pod = %format!("{}/{}", key.0, key.1), "deleting a stale real pod: {e}");
            }
            Outcome::Done
        }
        Action::Status {
            key,
            phase,
            message,
        } => {
            // Never over a fence's mark: written only to the version read as not fenced (this
            // pass's view may predate the mark, and the mark may land after the read).
            let Some((false, version)) = fenced_at(&client, &key).await else {
                return Outcome::Done;
            };
            let api: Api<ShadowPod> = Api::namespaced(client, &key.0);
            let patch = json!({"metadata": {"resourceVersion": version},
                               "status": {"phase": phase, "message": message}});
            match api
                .patch_status(&key.1, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => Outcome::Done,
                Err(e) if client::is_not_found(&e) => Outcome::Done,
                // Changed since the read: decided again on the newer version.
                Err(e) if client::is_conflict(&e) => Outcome::Retry(key),
                Err(e) => {
                    tracing::warn!(shadowpod = %format!("{}/{}", key.0, key.1), "setting status {phase}: {e}");
                    Outcome::Done
                }
            }
        }
    }
}

/// Whether shadow pod `key` is Fenced, read from the API server (None: it could not be read,
/// or is gone).
async fn is_fenced(client: &Client, key: &Key) -> Option<bool> {
    fenced_at(client, key).await.map(|(fenced, _)| fenced)
}

/// Whether shadow pod `key` is Fenced, and the resourceVersion read (None: it could not be
/// read, or is gone).
async fn fenced_at(client: &Client, key: &Key) -> Option<(bool, String)> {
    let sp = Api::<ShadowPod>::namespaced(client.clone(), &key.0)
        .get_opt(&key.1)
        .await
        .ok()??;
    let version = sp.metadata.resource_version.clone()?;
    Some((
        sp.status.and_then(|s| s.phase).as_deref() == Some(PHASE_FENCED),
        version,
    ))
}

/// Runs the shadow pod controller until the task is aborted.
pub async fn run(ctx: Ctx) {
    let client = ctx.client.clone();
    let stream = futures::stream::select_all(vec![
        watch_events(
            "shadow pod controller",
            Api::<LeanShadowPod>::all(client.clone()),
            watcher::Config::default(),
        )
        .map(Ev::Shadow)
        .boxed(),
        watch_events(
            "shadow pod controller",
            Api::<PodRequestsView>::all(client.clone()),
            watcher::Config::default().labels(names::ORIGIN_CLUSTER_LABEL),
        )
        .map(Ev::Pod)
        .boxed(),
        watch_events(
            "shadow pod controller",
            Api::<Namespace>::all(client.clone()),
            watcher::Config::default(),
        )
        .map(Ev::Ns)
        .boxed(),
        watch_events(
            "shadow pod controller",
            Api::<Tenant>::all(client.clone()),
            watcher::Config::default(),
        )
        .map(Ev::Tenant)
        .boxed(),
        futures::stream::unfold((), |()| async {
            tokio::time::sleep(RESYNC).await;
            Some((Ev::Tick, ()))
        })
        .boxed(),
    ]);
    futures::pin_mut!(stream);
    // Nothing is decided before every watch has listed once (and while one lists again).
    let mut state = State {
        listing: [true; 4],
        ..State::default()
    };
    // Since when a listing has been awaited (reset while every watch has listed), and whether
    // that was said.
    let mut listing_since = std::time::Instant::now();
    let mut warned = false;
    while let Some(ev) = stream.next().await {
        state.apply(ev);
        LOOP.drain(
            || stream.next().now_or_never().flatten(),
            |ev| state.apply(ev),
        );
        if state.listing.iter().any(|l| *l) {
            if listing_since.elapsed() > LISTING_PATIENCE && !warned {
                let kinds: Vec<&str> = ["ShadowPods", "Pods", "Namespaces", "Tenants"]
                    .into_iter()
                    .zip(state.listing)
                    .filter_map(|(k, l)| l.then_some(k))
                    .collect();
                tracing::warn!(
                    "shadow pod controller: no real pod is created or checked while {} are not \
                     listed ({}s so far: is the API server reachable, and does the controller's \
                     RBAC allow it?)",
                    kinds.join(", "),
                    listing_since.elapsed().as_secs()
                );
                warned = true;
            }
            continue;
        }
        listing_since = std::time::Instant::now();
        warned = false;
        let actions = state.decide();
        if actions.is_empty() {
            continue;
        }
        let outcomes: Vec<Outcome> = LOOP.act(actions, |a| act(client.clone(), a)).await;
        for o in outcomes {
            match o {
                Outcome::Done => {}
                Outcome::CreateFailed(key) => {
                    state.remove_pending(&key);
                    state.dirty.insert(key);
                }
                Outcome::Retry(key) => {
                    state.dirty.insert(key);
                }
                Outcome::CreateRefused(key, why) => {
                    state.remove_pending(&key);
                    if let Some(sp) = state.shadows.get(&key) {
                        tracing::warn!(shadowpod = %format!("{}/{}", key.0, key.1), "{why}");
                        state.refused.insert(key.clone(), (version_of(sp), why));
                    }
                    state.dirty.insert(key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWIN: &str = "app-rome";

    /// A shadow pod `TWIN/name` with UID `uid`, requesting `cpu` (nothing when empty), with
    /// `extra` pod fields.
    fn shadow_pod(name: &str, uid: &str, cpu: &str, extra: Value) -> Arc<LeanShadowPod> {
        let mut pod = json!({"containers": [{"name": "c", "image": "nginx"}]});
        if !cpu.is_empty() {
            pod["containers"][0]["resources"] = json!({"requests": {"cpu": cpu}});
        }
        if let (Some(p), Some(e)) = (pod.as_object_mut(), extra.as_object()) {
            p.extend(e.clone());
        }
        let doc = json!({"metadata": {"name": name, "namespace": TWIN, "uid": uid, "generation": 1},
                         "spec": {"pod": pod}});
        Arc::new(serde_json::from_str(&doc.to_string()).expect("a shadow pod"))
    }

    /// A provider whose twin namespace `TWIN` belongs to consumer `rome`, granted 2 CPUs.
    fn world() -> State {
        let mut s = State::default();
        s.twins.insert(TWIN.into(), "rome".into());
        s.grants
            .insert("rome".into(), [("cpu".to_string(), 2000)].into());
        s
    }

    fn key(name: &str) -> Key {
        (TWIN.into(), name.into())
    }

    fn add(s: &mut State, sp: Arc<LeanShadowPod>) {
        let k = key_of(&*sp);
        s.shadows.insert(k.clone(), sp);
        s.dirty.insert(k);
    }

    fn record(owner_uid: Option<&str>) -> PodRecord {
        PodRecord {
            uid: "pod-1".into(),
            owner_uid: owner_uid.map(String::from),
            consumer: "rome".into(),
            requests: Resources::new(),
            terminal: false,
        }
    }

    fn summary(a: &Action) -> String {
        match a {
            Action::CreatePod { key, .. } => format!("create {}", key.1),
            Action::DeletePod { key, .. } => format!("delete {}", key.1),
            Action::Status {
                key,
                phase,
                message,
            } => format!("{phase} {}: {message}", key.1),
        }
    }

    #[test]
    fn decide_table() {
        type Setup = fn(&mut State);
        let cases: Vec<(&str, Setup, &[&str])> = vec![
            (
                "a shadow pod within the grant gets its pod",
                |s| {
                    add(s, shadow_pod("web", "s1", "1", json!({})));
                },
                &["create web"],
            ),
            (
                "a twin namespace's pod offloading strategy the Tenant does not allow",
                |s| {
                    s.twin_strategies
                        .insert(TWIN.into(), "LocalAndRemote".into());
                    s.pod_limits.insert(
                        "rome".into(),
                        (vec!["Remote".into()], "PeeringPolicy partners".into()),
                    );
                    add(s, shadow_pod("web", "s1", "1", json!({})));
                },
                &[
                    "Rejected web: pod offloading strategy LocalAndRemote of namespace app-rome is not allowed for consumer rome by PeeringPolicy partners (allowed: Remote)",
                ],
            ),
            (
                "a twin namespace's pod offloading strategy the Tenant allows",
                |s| {
                    s.twin_strategies.insert(TWIN.into(), "Remote".into());
                    s.pod_limits.insert(
                        "rome".into(),
                        (vec!["Remote".into()], "PeeringPolicy partners".into()),
                    );
                    add(s, shadow_pod("web", "s1", "1", json!({})));
                },
                &["create web"],
            ),
            (
                "first come, first served within the grant",
                |s| {
                    add(s, shadow_pod("a", "s1", "1500m", json!({})));
                    add(s, shadow_pod("b", "s2", "1", json!({})));
                },
                &[
                    "create a",
                    "Rejected b: quota exceeded for cpu: requested 1000m, used 1500m of 2000m (grant of Tenant tandem-tenant-rome/rome)",
                ],
            ),
            (
                "containers requesting nothing are charged the provider's default",
                |s| {
                    s.grants
                        .insert("rome".into(), [("cpu".to_string(), 150)].into());
                    add(s, shadow_pod("a", "s1", "", json!({})));
                    add(s, shadow_pod("b", "s2", "", json!({})));
                },
                &[
                    "create a",
                    "Rejected b: quota exceeded for cpu: requested 100m, used 100m of 150m (grant of Tenant tandem-tenant-rome/rome; containers requesting no cpu are charged the provider's default (podResources.defaultRequests))",
                ],
            ),
            (
                "a Tenant that refuses pods without requests",
                |s| {
                    s.pod_policies.insert(
                        "rome".into(),
                        ProviderPodPolicy {
                            charge: ChargePolicy {
                                without_requests: WithoutRequests::Refuse,
                                ..Default::default()
                            },
                            ..Default::default()
                        },
                    );
                    add(s, shadow_pod("web", "s1", "1", json!({})));
                },
                &[
                    "Rejected web: refused by rule pod-requests: container \"c\" requests no memory, and this provider charges every container for memory: set resources.requests.memory (Tenant tandem-tenant-rome/rome)",
                ],
            ),
            (
                "a limit beyond the ratio to its request",
                |s| {
                    add(
                        s,
                        shadow_pod(
                            "web",
                            "s1",
                            "",
                            json!({"containers": [{"name": "c", "image": "nginx",
                                "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "2"}}}]}),
                        ),
                    );
                },
                &[
                    "Rejected web: refused by rule limit-request-ratio: container \"c\" has a cpu limit of 2 for a request of 100m: a limit may be at most 10 times its request (Tenant tandem-tenant-rome/rome)",
                ],
            ),
            (
                "no grant, no pod",
                |s| {
                    s.grants.clear();
                    add(s, shadow_pod("web", "s1", "1", json!({})));
                },
                &[
                    "Rejected web: consumer rome has no resources granted (Tenant tandem-tenant-rome/rome)",
                ],
            ),
            (
                "a namespace of no consumer",
                |s| {
                    s.twins.clear();
                    add(s, shadow_pod("web", "s1", "1", json!({})));
                },
                &["Rejected web: namespace app-rome is not a twin namespace of any consumer"],
            ),
            (
                "host namespaces are refused",
                |s| {
                    add(
                        s,
                        shadow_pod("web", "s1", "1", json!({"hostNetwork": true})),
                    );
                },
                &[
                    "Rejected web: violates PodSecurity \"baseline:latest\": host namespaces (hostNetwork=true) (Tenant tandem-tenant-rome/rome)",
                ],
            ),
            (
                "a Tenant held to restricted: a pod that may run as root is refused",
                |s| {
                    s.pod_policies.insert(
                        "rome".into(),
                        ProviderPodPolicy {
                            level: PodSecurityLevel::Restricted,
                            ..Default::default()
                        },
                    );
                    add(s, shadow_pod("web", "s1", "1", json!({})));
                },
                &[
                    "Rejected web: violates PodSecurity \"restricted:latest\": runAsNonRoot != true (container \"c\" must set securityContext.runAsNonRoot=true) (Tenant tandem-tenant-rome/rome)",
                ],
            ),
            (
                "its own pod: nothing to do",
                |s| {
                    add(s, shadow_pod("web", "s1", "1", json!({})));
                    s.pods.insert(key("web"), record(Some("s1")));
                },
                &[],
            ),
            (
                "the pod of an earlier shadow pod makes way",
                |s| {
                    add(s, shadow_pod("web", "s2", "1", json!({})));
                    s.pods.insert(key("web"), record(Some("s1")));
                },
                &["delete web"],
            ),
            (
                "a pod Tandem did not make is never touched",
                |s| {
                    add(s, shadow_pod("web", "s1", "1", json!({})));
                    s.pods.insert(key("web"), record(None));
                },
                &["Rejected web: a pod app-rome/web not owned by Tandem already exists"],
            ),
            (
                "a create in flight is waited for",
                |s| {
                    add(s, shadow_pod("web", "s1", "1", json!({})));
                    s.insert_pending(key("web"), "rome".into(), Resources::new());
                },
                &[],
            ),
            (
                "a spec the API server refused stays refused",
                |s| {
                    add(s, shadow_pod("web", "s1", "1", json!({})));
                    s.refused
                        .insert(key("web"), ("s1/1".into(), "spec.x: Invalid".into()));
                },
                &["Rejected web: spec.x: Invalid"],
            ),
            (
                "a changed spec is tried again",
                |s| {
                    add(s, shadow_pod("web", "s1", "1", json!({})));
                    s.refused
                        .insert(key("web"), ("s1/0".into(), "spec.x: Invalid".into()));
                },
                &["create web"],
            ),
        ];
        for (name, setup, want) in cases {
            let mut s = world();
            setup(&mut s);
            let got: Vec<String> = s.decide().iter().map(summary).collect();
            assert_eq!(got, want.to_vec(), "{name}");
        }
    }

    #[test]
    fn the_real_pod_is_what_admission_made_of_the_shadow_pod() {
        let mut s = world();
        let doc = json!({"metadata": {"name": "web", "namespace": TWIN, "uid": "s1"},
            "spec": {"labels": {"app": "web"},
                     "annotations": {"tandem.dev/origin-uid": "u-1", "sidecar.istio.io/inject": "true"},
                     "pod": {"containers": [{"name": "c", "image": "nginx",
                                              "resources": {"requests": {"cpu": "1"}}}],
                             "nodeName": "cp-1", "priorityClassName": "system-node-critical",
                             "tolerations": [{"operator": "Exists"}]}}});
        add(
            &mut s,
            Arc::new(serde_json::from_str(&doc.to_string()).unwrap()),
        );
        let actions = s.decide();
        let [Action::CreatePod { pod, .. }] = actions.as_slice() else {
            panic!("{:?}", actions.iter().map(summary).collect::<Vec<_>>());
        };
        assert_eq!(
            pod["metadata"]["annotations"],
            json!({"tandem.dev/origin-uid": "u-1"})
        );
        assert_eq!(pod["metadata"]["labels"]["app"], "web");
        for field in ["nodeName", "priorityClassName", "tolerations"] {
            assert!(pod["spec"].get(field).is_none(), "{field}: {pod}");
        }
        assert_eq!(pod["spec"]["automountServiceAccountToken"], false);
        // The charge and the bound are on the real pod, where the provider's scheduler and
        // a restarted controller read them.
        assert_eq!(
            pod["spec"]["containers"][0]["resources"],
            json!({"requests": {"cpu": "1", "memory": "128Mi"},
                   "limits": {"cpu": "10", "memory": "512Mi"}})
        );
        assert_eq!(
            shadow::pod_requests(&pod["spec"]),
            s.pending[&key("web")].1,
            "what the grant is charged is what the real pod requests"
        );
    }

    #[test]
    fn a_rejection_already_reported_is_not_written_again() {
        let mut s = world();
        s.grants.clear();
        let message = "consumer rome has no resources granted (Tenant tandem-tenant-rome/rome)";
        let doc = json!({"metadata": {"name": "web", "namespace": TWIN, "uid": "s1"},
                         "spec": {"pod": {"containers": []}},
                         "status": {"phase": PHASE_REJECTED, "message": message}});
        add(
            &mut s,
            Arc::new(serde_json::from_str(&doc.to_string()).unwrap()),
        );
        assert!(s.decide().is_empty());
    }
}
