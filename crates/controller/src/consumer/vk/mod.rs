//! The virtual kubelet of one provider: runs the pods the scheduler binds to the virtual node
//! as shadow pods in their namespace's twin namespace on the provider, and mirrors the real
//! pods' status back (pod IPs rewritten into the consumer's view of the provider's pod CIDR;
//! a real pod that is only created or scheduled shows nothing its consumer pod does not, and
//! is not written).
//!
//! Decisions, level-based on what both sides show (never on what this task remembers doing):
//! - a consumer pod without a shadow pod gets one (same name, `tandem.dev/origin-uid`), unless it
//!   had already started: then its shadow pod was deleted or evicted on the provider, and the
//!   consumer pod is deleted so that its controller (ReplicaSet, ...) replaces it — the provider
//!   decided the pod should not run, so the consumer must not resurrect it;
//! - a shadow pod whose origin UID matches no consumer pod is an orphan and is deleted;
//! - a consumer pod being deleted loses its shadow pod; once the real pod is gone too, the
//!   consumer pod is deleted with grace 0 (the virtual kubelet's part of graceful deletion);
//! - while the virtual node is NotReady (provider unreachable) nothing is written to the provider
//!   and the consumer pods are marked not Ready; when it is Ready again the provider is re-listed,
//!   every pod's status is written again (the node lifecycle controller may have marked them
//!   NotReady too) and everything re-converges.
//!
//! Memory: per pod only a small record (UIDs, flags, a hash of the last status written); full
//! pod specs and statuses are held only until the write they feed is done.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tandem_api::client;
use tandem_api::{ShadowPod, ShadowPodSpec, names};
use tandem_core::shadow::{self, IpRemap};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::consumer::daemonset;
mod pods;
use crate::consumer::link::{LinkWatch, ProviderLink};
use crate::context::Ctx;
use crate::lean::{LeanPod, PodStatusRef, ShadowPodRef};
use crate::requests::{create_unread, send_unread};
pub use crate::shared_watches::{SharedMap, SharedWatches};
use crate::watches::watch_events;
pub use pods::KEYS;
use pods::*;
pub(crate) use tandem_api::offloading::twin_of;

use crate::batch::IndexLoop;

/// Messages applied before a pass runs, at most, and writes in flight at once.
const LOOP: IndexLoop = IndexLoop {
    batch: 4000,
    parallel: 64,
};
/// A write not confirmed by a watch within this time is retried.
const RETRY_AFTER: Duration = Duration::from_secs(5);
/// Full re-decision of every pod (catches failed writes).
const RESYNC: Duration = Duration::from_secs(2);

#[derive(Default)]
struct State {
    local: HashMap<Key, LocalPod>,
    local_synced: bool,
    /// Consumer namespace → twin namespace, and back.
    twins: HashMap<String, String>,
    origins: HashMap<String, String>,
    /// Keyed by (twin namespace, name).
    shadows: HashMap<Key, RemoteShadow>,
    reals: HashMap<Key, RemotePod>,
    shadows_synced: HashSet<String>,
    reals_synced: HashSet<String>,
    node_ready: bool,
    dirty: HashSet<Key>,
    /// How long a pod the provider fenced waits before it is replaced (the controller's
    /// `fence_margin`).
    fence_margin: Duration,
    /// Each real pod's consumer pod, kept for the reflectors as `reals` changes.
    real_origins: crate::shared_watches::RealPodOrigins,
    /// The provider's real pods must be listed again (a status to write again was dropped).
    relist: bool,
}

enum Action {
    CreateShadow {
        key: Key,
        twin: String,
        spec: Option<Arc<Value>>,
    },
    DeleteShadow {
        twin: String,
        name: String,
        uid: String,
    },
    DeleteLocal {
        key: Key,
        uid: String,
    },
    WriteStatus {
        key: Key,
        status: Arc<Value>,
        hash: u64,
        /// When the provider's status it reflects arrived, if it reflects one.
        seen: Option<Instant>,
    },
    MarkUnready {
        key: Key,
        message: String,
    },
}

enum Outcome {
    Done,
    /// Written: the hash and the Ready condition of the status written.
    Written(Key, u64, Option<bool>),
    MarkedUnready(Key),
    Failed(Key),
}

impl State {
    fn local_key_of(&self, twin: &str, name: &str) -> Option<Key> {
        self.origins
            .get(twin)
            .map(|ns| (ns.clone(), name.to_string()))
    }

    fn set_local(&mut self, pod: &LeanPod, link: &ProviderLink) {
        let key = (pod.namespace().unwrap_or_default(), pod.name_any());
        let uid = pod.uid().unwrap_or_default();
        let entry = self.local.entry(key.clone()).or_default();
        if entry.uid != uid {
            *entry = LocalPod {
                uid: uid.clone(),
                ..Default::default()
            };
            // A real pod seen before its consumer pod (both listed afresh) is vouched for now.
            let twin = self.twins.get(&key.0);
            let real = twin.and_then(|t| self.reals.get(&(t.clone(), key.1.clone())));
            if let Some(p) = real.filter(|p| p.origin_uid == uid) {
                self.real_origins.set(&p.uid, &key, &uid);
            }
        }
        entry.deleting = pod.metadata.deletion_timestamp.is_some();
        (entry.started, entry.ready_seen) = pod.started_and_ready();
        entry.refused = daemonset::refusal(&pod.metadata).map(Arc::from);
        let has_shadow = self
            .twins
            .get(&key.0)
            .and_then(|t| self.shadows.get(&(t.clone(), key.1.clone())))
            .is_some_and(|s| s.origin_uid == uid);
        if !has_shadow && !entry.deleting && entry.shadow_spec.is_none() {
            let spec = shadow_spec_of(&pod.metadata, pod.spec_value(), &link.consumer_id);
            entry.shadow_spec = Some(Arc::new(spec));
        }
        self.dirty.insert(key);
    }

    fn apply(&mut self, msg: Msg, link: &ProviderLink) -> Option<Change> {
        match msg {
            Msg::LocalApply(pod) => self.set_local(&pod, link),
            Msg::LocalDelete(key) => {
                self.local.remove(&key);
                self.dirty.insert(key);
            }
            Msg::LocalRelisted(pods) => {
                let mut old = std::mem::take(&mut self.local);
                for pod in &pods {
                    let key = (pod.namespace().unwrap_or_default(), pod.name_any());
                    if let Some(rec) = old.remove(&key) {
                        self.local.insert(key, rec);
                    }
                    self.set_local(pod, link);
                }
                self.dirty.extend(old.into_keys());
                self.local_synced = true;
            }
            Msg::Offloading(nso) => {
                let ns = nso.namespace().unwrap_or_default();
                let twin = twin_of(&nso, &link.provider_id);
                if self.twins.get(&ns) != twin.as_ref() {
                    let old = self.twins.remove(&ns);
                    if let Some(old) = &old {
                        self.origins.remove(old);
                    }
                    if let Some(t) = &twin {
                        self.twins.insert(ns.clone(), t.clone());
                        self.origins.insert(t.clone(), ns.clone());
                    }
                    self.dirty_all();
                    return Some(Change::Twin { old, new: twin });
                }
            }
            Msg::OffloadingGone(ns) => {
                if let Some(old) = self.twins.remove(&ns) {
                    self.origins.remove(&old);
                    self.dirty_all();
                    return Some(Change::Twin {
                        old: Some(old),
                        new: None,
                    });
                }
            }
            Msg::NodeReady(ready) => return self.set_node_ready(ready),
            Msg::ShadowApply(twin, name, mut s) => {
                self.mark(&twin, &name);
                let key = (twin, name);
                keep_fenced_since(&mut s, self.shadows.get(&key));
                self.shadows.insert(key, s);
            }
            Msg::ShadowDelete(twin, name) => {
                self.mark(&twin, &name);
                self.shadows.remove(&(twin, name));
            }
            Msg::ShadowsRelisted(twin, mut list) => {
                for (name, shadow) in &mut list {
                    keep_fenced_since(shadow, self.shadows.get(&(twin.clone(), name.clone())));
                }
                replace_twin(&mut self.shadows, &twin, list);
                self.shadows_synced.insert(twin);
                self.dirty_all();
            }
            Msg::RealApply(twin, name, p) => self.set_real(twin, name, p),
            Msg::RealDelete(twin, name) => self.remove_real(twin, name),
            Msg::RealRelisted(twin, list) => self.relist_reals(twin, list),
            Msg::Tick => self.dirty_all(),
        }
        None
    }

    /// The virtual node turned Ready or NotReady. Ready again, every consumer pod's status is
    /// written again once the provider is re-listed (`Change::Readiness(true)`): while the node
    /// was out, the node lifecycle controller may have marked the pods NotReady itself (kube's
    /// does once the node's Lease expires), which the record of what this kubelet wrote does
    /// not show — kubelet's status manager likewise reconciles with the API server's copy. An
    /// outage seen only by its end (NotReady and Ready again in one batch) is one too.
    fn set_node_ready(&mut self, ready: bool) -> Option<Change> {
        if ready == self.node_ready {
            return None;
        }
        self.node_ready = ready;
        if ready {
            for local in self.local.values_mut() {
                local.written = 0;
            }
        }
        self.dirty_all();
        Some(Change::Readiness(ready))
    }

    /// The consumer pod that `twin`/`name` mirrors, if its UID is the one the real pod's
    /// origin annotation names. The annotation is the provider's word: a hostile provider could
    /// name another consumer pod's UID, and the reflectors would then put this pod's Events on
    /// that one. Only a real pod vouched for by the consumer's own pod is recorded; for any
    /// other, the reflector reads the pod of that name itself.
    fn vouched(&self, twin: &str, name: &str, p: &RemotePod) -> Option<Key> {
        let key = self.local_key_of(twin, name)?;
        let local = self.local.get(&key)?;
        (!p.origin_uid.is_empty() && local.uid == p.origin_uid).then_some(key)
    }

    /// A real pod created or changed; its origin, if vouched for, is recorded for the
    /// reflectors.
    fn set_real(&mut self, twin: String, name: String, p: RemotePod) {
        self.mark(&twin, &name);
        let vouched = self.vouched(&twin, &name, &p);
        let key = (twin, name);
        let known = self.reals.get(&key);
        // A status update of a real pod already recorded takes no lock: recorded when it was
        // first vouched for, here or when its consumer pod was seen (`set_local`).
        let same = known.is_some_and(|k| k.uid == p.uid && k.origin_uid == p.origin_uid);
        if !(same && vouched.is_some()) {
            if let Some(k) = known {
                self.real_origins.forget([k.uid.as_str()]);
            }
            if let Some(local) = vouched {
                self.real_origins.set(&p.uid, &local, &p.origin_uid);
            }
        }
        self.reals.insert(key, p);
    }

    fn remove_real(&mut self, twin: String, name: String) {
        self.mark(&twin, &name);
        if let Some(p) = self.reals.remove(&(twin, name)) {
            self.real_origins.forget([p.uid.as_str()]);
        }
    }

    /// The real pods of `twin` listed afresh: they replace what was known of that twin.
    fn relist_reals(&mut self, twin: String, list: Vec<(String, RemotePod)>) {
        self.forget_origins_of(&twin);
        for (name, p) in &list {
            if let Some(local) = self.vouched(&twin, name, p) {
                self.real_origins.set(&p.uid, &local, &p.origin_uid);
            }
        }
        replace_twin(&mut self.reals, &twin, list);
        self.reals_synced.insert(twin);
        self.dirty_all();
    }

    fn mark(&mut self, twin: &str, name: &str) {
        if let Some(k) = self.local_key_of(twin, name) {
            self.dirty.insert(k);
        }
    }

    fn dirty_all(&mut self) {
        self.dirty.extend(self.local.keys().cloned());
        let remote: Vec<Key> = self
            .shadows
            .keys()
            .filter_map(|(t, n)| self.local_key_of(t, n))
            .collect();
        self.dirty.extend(remote);
    }

    /// Forgets the origins of the real pods of `twin` (about to be replaced or dropped).
    fn forget_origins_of(&self, twin: &str) {
        self.real_origins.forget(
            self.reals
                .iter()
                .filter(|(k, _)| k.0 == twin)
                .map(|(_, p)| p.uid.as_str()),
        );
    }

    fn forget_twin(&mut self, twin: &str) {
        self.forget_origins_of(twin);
        self.shadows.retain(|k, _| k.0 != twin);
        self.reals.retain(|k, _| k.0 != twin);
        self.shadows_synced.remove(twin);
        self.reals_synced.remove(twin);
    }

    /// The writes that bring the dirty pods closer to agreement, as of `now` (a create or delete
    /// sent less than [`RETRY_AFTER`] ago is waited for, not sent again).
    fn decide(&mut self, provider: &str, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        let keys: Vec<Key> = self.dirty.drain().collect();
        let (ready, local_synced) = (self.node_ready, self.local_synced);
        // The provider-side key, its strings reused: every RESYNC decides every pod again, and
        // copying keys and records per pod was most of what a pass cost.
        let mut rkey = Key::default();
        for key in keys {
            let Some(twin) = self.twins.get(&key.0) else {
                continue;
            };
            rkey.0.clone_from(twin);
            rkey.1.clone_from(&key.1);
            let synced = self.shadows_synced.contains(twin) && self.reals_synced.contains(twin);
            let shadow = self.shadows.get(&rkey);
            let real = self.reals.get(&rkey);
            let Some(local) = self.local.get_mut(&key) else {
                // No consumer pod: a shadow pod here is an orphan.
                if let Some(s) = shadow
                    && local_synced
                    && ready
                    && !s.deleting
                {
                    actions.push(Action::DeleteShadow {
                        twin: twin.clone(),
                        name: key.1.clone(),
                        uid: s.uid.clone(),
                    });
                }
                continue;
            };
            let recently = local
                .requested
                .is_some_and(|t| now.saturating_duration_since(t) < RETRY_AFTER);
            let own_shadow = shadow.filter(|s| s.origin_uid == local.uid);
            let own_real = real.filter(|p| p.origin_uid == local.uid);
            if own_shadow.is_some() {
                local.shadow_spec = None;
            }
            if !ready {
                if !local.deleting && !local.unready && (own_shadow.is_some() || local.started) {
                    actions.push(Action::MarkUnready {
                        key: key.clone(),
                        message: format!("provider {provider} is unreachable"),
                    });
                }
                continue;
            }
            if !synced {
                continue;
            }
            if local.deleting {
                match shadow {
                    Some(s) if !s.deleting && !recently => {
                        local.requested = Some(now);
                        actions.push(Action::DeleteShadow {
                            twin: twin.clone(),
                            name: key.1.clone(),
                            uid: s.uid.clone(),
                        });
                    }
                    Some(_) => {}
                    None if real.is_none() && !recently => {
                        local.requested = Some(now);
                        actions.push(Action::DeleteLocal {
                            key: key.clone(),
                            uid: local.uid.clone(),
                        });
                    }
                    None => {}
                }
                continue;
            }
            match (shadow, own_shadow) {
                (Some(s), None) => {
                    // The shadow pod of an earlier pod of the same name: make way.
                    if !s.deleting && !recently {
                        local.requested = Some(now);
                        actions.push(Action::DeleteShadow {
                            twin: twin.clone(),
                            name: key.1.clone(),
                            uid: s.uid.clone(),
                        });
                    }
                }
                (None, _) if local.started => {
                    // Deleted or evicted on the provider: let the owner replace the pod.
                    if !recently {
                        local.requested = Some(now);
                        actions.push(Action::DeleteLocal {
                            key: key.clone(),
                            uid: local.uid.clone(),
                        });
                    }
                }
                (None, _) if local.refused.is_some() => {
                    // Never run once per consumer in the provider: say why, and wait.
                    let why = local.refused.as_deref().unwrap_or_default();
                    let status = json!({"phase": "Pending", "reason": daemonset::REFUSED_REASON,
                        "message": why});
                    let hash = hash_of(&status);
                    if hash != local.written {
                        actions.push(Action::WriteStatus {
                            key: key.clone(),
                            status: Arc::new(status),
                            hash,
                            seen: None,
                        });
                    }
                }
                (None, _) => {
                    if !recently {
                        local.requested = Some(now);
                        actions.push(Action::CreateShadow {
                            key: key.clone(),
                            twin: twin.clone(),
                            spec: local.shadow_spec.clone(),
                        });
                    }
                }
                (Some(_), Some(s)) if s.fenced.is_some() => {
                    // Stopped by the provider's fence, for good: the owner replaces the pod —
                    // once the real pod is gone, and the provider's kubelet has had the fence
                    // margin to stop its containers (its watch may lag the deletion).
                    let stopped = own_real.is_none()
                        && s.fenced
                            .is_some_and(|t| now.saturating_duration_since(t) >= self.fence_margin);
                    if stopped && !recently {
                        local.requested = Some(now);
                        actions.push(Action::DeleteLocal {
                            key: key.clone(),
                            uid: local.uid.clone(),
                        });
                    }
                }
                (Some(_), Some(s)) => {
                    local.requested = None;
                    if let Some(p) = own_real {
                        // (A watch catches up well within the retry delay.)
                        if local.contradicted(now, RETRY_AFTER) {
                            // Someone else changed the pod's readiness since this kubelet wrote
                            // it (the node lifecycle controller marks a lost node's pods
                            // NotReady, and may do so just after this kubelet's writes of the
                            // node's return): written again, as kubelet's status manager
                            // reconciles with the API server's copy. The status is re-read
                            // from the provider when it was dropped after writing.
                            local.written = 0;
                            local.written_at = Some(now);
                            self.relist |= p.status.is_none();
                        }
                        if (local.unready || p.news && p.hash != local.written)
                            && let Some(status) = &p.status
                        {
                            actions.push(Action::WriteStatus {
                                key: key.clone(),
                                status: status.clone(),
                                hash: p.hash,
                                seen: Some(p.seen),
                            });
                        }
                    } else if let Some(why) = &s.rejected {
                        let status = json!({"phase": "Pending", "reason": "OffloadingRejected",
                            "message": format!("provider {provider} rejected the pod: {why}")});
                        let hash = hash_of(&status);
                        if hash != local.written {
                            actions.push(Action::WriteStatus {
                                key: key.clone(),
                                status: Arc::new(status),
                                hash,
                                seen: None,
                            });
                        }
                    }
                }
            }
        }
        actions
    }

    fn outcome(&mut self, o: Outcome) {
        match o {
            Outcome::Done => {}
            Outcome::Written(key, hash, ready) => {
                if let Some(l) = self.local.get_mut(&key) {
                    l.written = hash;
                    l.unready = false;
                    l.ready_written = ready;
                    l.written_at = Some(Instant::now());
                }
                if let Some(twin) = self.twins.get(&key.0)
                    && let Some(p) = self.reals.get_mut(&(twin.clone(), key.1.clone()))
                    && p.hash == hash
                {
                    p.status = None;
                }
            }
            Outcome::MarkedUnready(key) => {
                if let Some(l) = self.local.get_mut(&key) {
                    l.unready = true;
                    l.written = 0;
                }
            }
            Outcome::Failed(key) => {
                if let Some(l) = self.local.get_mut(&key) {
                    l.requested = None;
                }
            }
        }
    }
}

/// The Ready condition of a pod `status` (None: none).
fn ready_of(status: &Value) -> Option<bool> {
    let conditions = status["conditions"].as_array()?;
    let ready = conditions.iter().find(|c| c["type"] == "Ready")?;
    Some(ready["status"] == "True")
}

/// What the main loop must do besides writing.
enum Change {
    Twin {
        old: Option<String>,
        new: Option<String>,
    },
    Readiness(bool),
}

async fn act(
    local: Client,
    remote: Client,
    consumer_id: String,
    metrics: Arc<crate::metrics::Metrics>,
    action: Action,
) -> Outcome {
    match action {
        Action::CreateShadow { key, twin, spec } => {
            let spec = match spec {
                Some(s) => s,
                None => {
                    let pods: Api<Pod> = Api::namespaced(local, &key.0);
                    match pods.get_opt(&key.1).await {
                        Ok(Some(pod)) => {
                            let spec = serde_json::to_value(&pod.spec).unwrap_or(Value::Null);
                            Arc::new(shadow_spec_of(&pod.metadata, spec, &consumer_id))
                        }
                        _ => return Outcome::Failed(key),
                    }
                }
            };
            // Checked against the typed spec the provider's controller decodes (a shadow pod
            // it could not read would stall its watch), but sent as the JSON in hand, and the
            // created object in the answer is not decoded: one create per offloaded pod.
            if let Err(e) = ShadowPodSpec::deserialize(spec.as_ref()) {
                tracing::warn!(pod = %format!("{}/{}", key.0, key.1), "translating to a shadow pod: {e}");
                return Outcome::Failed(key);
            }
            let mut labels = json!({names::MANAGED_BY_LABEL: names::MANAGED_BY});
            // The pod's fence bound, where the provider's fence selects it.
            if let Some(fence_after) = spec["annotations"][names::FENCE_AFTER].as_str() {
                labels[names::FENCE_AFTER] = json!(fence_after);
            }
            let sp = NewShadowPod {
                api_version: "tandem.dev/v1alpha1",
                kind: "ShadowPod",
                metadata: json!({"name": key.1, "namespace": twin, "labels": labels}),
                spec: spec.as_ref(),
            };
            match create_unread::<ShadowPod>(&remote, &twin, &sp).await {
                Ok(()) => Outcome::Done,
                Err(e) if client::is_conflict(&e) => Outcome::Done,
                Err(e) => {
                    tracing::warn!(pod = %format!("{}/{}", key.0, key.1), twin = %twin, "creating the shadow pod: {e}");
                    Outcome::Failed(key)
                }
            }
        }
        Action::DeleteShadow { twin, name, uid } => {
            let api: Api<ShadowPod> = Api::namespaced(remote, &twin);
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match api.delete(&name, &dp).await {
                Ok(_) => {}
                Err(e) if client::is_not_found(&e) || client::is_conflict(&e) => {}
                Err(e) => {
                    tracing::warn!(shadowpod = %format!("{twin}/{name}"), "deleting the shadow pod: {e}")
                }
            }
            Outcome::Done
        }
        Action::DeleteLocal { key, uid } => {
            let api: Api<Pod> = Api::namespaced(local, &key.0);
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match api.delete(&key.1, &dp).await {
                Ok(_) => Outcome::Done,
                Err(e) if client::is_not_found(&e) || client::is_conflict(&e) => Outcome::Done,
                Err(e) => {
                    tracing::warn!(pod = %format!("{}/{}", key.0, key.1), "deleting the pod: {e}");
                    Outcome::Failed(key)
                }
            }
        }
        Action::WriteStatus {
            key,
            status,
            hash,
            seen,
        } => {
            let patch = StatusPatch {
                status: status.as_ref(),
            };
            match patch_status(&local, &key, &Patch::Merge(&patch)).await {
                Ok(()) => {
                    if let Some(seen) = seen {
                        metrics.reflected(seen.into_std());
                    }
                    Outcome::Written(key, hash, ready_of(&status))
                }
                Err(e) if client::is_not_found(&e) => Outcome::Done,
                Err(e) => {
                    tracing::warn!(pod = %format!("{}/{}", key.0, key.1), "writing the pod status: {e}");
                    Outcome::Done
                }
            }
        }
        Action::MarkUnready { key, message } => {
            let now = k8s_openapi::jiff::Timestamp::now()
                .strftime("%Y-%m-%dT%H:%M:%SZ")
                .to_string();
            let patch =
                json!({"status": {"conditions": shadow::unreachable_conditions(&message, &now)}});
            match patch_status(&local, &key, &Patch::Strategic(&patch)).await {
                Ok(()) => Outcome::MarkedUnready(key),
                Err(e) => {
                    tracing::warn!(pod = %format!("{}/{}", key.0, key.1), "marking the pod not Ready: {e}");
                    Outcome::Done
                }
            }
        }
    }
}

/// A ShadowPod to create, serialized from borrowed parts (the spec is not copied).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NewShadowPod<'a> {
    api_version: &'static str,
    kind: &'static str,
    metadata: Value,
    spec: &'a Value,
}

/// A merge patch of a pod's status.
#[derive(Serialize)]
struct StatusPatch<'a> {
    status: &'a Value,
}

/// Patches the status of the consumer pod `key`, without decoding the pod in the answer.
async fn patch_status<P: Serialize>(
    client: &Client,
    key: &Key,
    patch: &Patch<P>,
) -> kube::Result<()> {
    let pods = kube::core::Request::new(<Pod as kube::Resource>::url_path(&(), Some(&key.0)));
    let request = pods.patch_subresource("status", &key.1, &PatchParams::default(), patch);
    send_unread(client, request).await
}

/// Consumer pods bound to the virtual node.
async fn watch_local(client: Client, node: String, tx: mpsc::Sender<Msg>) {
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let stream = watch_events("virtual kubelet", Api::<LeanPod>::all(client), cfg);
    futures::pin_mut!(stream);
    let mut init: Option<Vec<LeanPod>> = None;
    while let Some(ev) = stream.next().await {
        let msg = match ev {
            watcher::Event::Init => {
                init = Some(Vec::new());
                continue;
            }
            watcher::Event::InitApply(p) => {
                init.get_or_insert_with(Vec::new).push(p);
                continue;
            }
            watcher::Event::InitDone => Msg::LocalRelisted(init.take().unwrap_or_default()),
            watcher::Event::Apply(p) => Msg::LocalApply(Box::new(p)),
            watcher::Event::Delete(p) => {
                Msg::LocalDelete((p.namespace().unwrap_or_default(), p.name_any()))
            }
        };
        if tx.send(msg).await.is_err() {
            return;
        }
    }
}

/// Feeds this virtual kubelet the changes of a [`SharedMap`] for the keys it `wants`: `gone`
/// for each key whose object went, then `changed` for each new or changed object (with the one
/// it replaces). Changes that come faster than the virtual kubelet reads them arrive merged.
async fn follow<K>(
    mut map: tokio::sync::watch::Receiver<SharedMap<K>>,
    tx: mpsc::Sender<Msg>,
    wants: impl Fn(&str) -> bool,
    changed: impl Fn(Option<&K>, &K) -> Vec<Msg>,
    gone: impl Fn(&str) -> Msg,
) {
    let mut seen = SharedMap::<K>::default();
    loop {
        let now = map.borrow_and_update().clone();
        // What went first: an object taking over what another held (a twin namespace, say)
        // must not be undone by the other's going.
        let mut msgs: Vec<Msg> = seen
            .keys()
            .filter(|key| !now.contains_key(*key) && wants(key))
            .map(|key| gone(key))
            .collect();
        for (key, o) in now.iter().filter(|(key, _)| wants(key)) {
            // An entry the map did not replace is the same Arc.
            let before = seen.get(key);
            if before.is_none_or(|before| !Arc::ptr_eq(before, o)) {
                msgs.extend(changed(before.map(|b| &**b), o));
            }
        }
        for msg in msgs {
            if tx.send(msg).await.is_err() {
                return;
            }
        }
        seen = now;
        if map.changed().await.is_err() {
            return;
        }
    }
}

/// The node's Ready condition: whether it is True, and since when.
fn node_ready(
    node: &Node,
) -> (
    bool,
    Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
) {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "Ready")
        .map_or((false, None), |c| {
            (c.status == "True", c.last_transition_time.as_ref())
        })
}

/// What a change of the virtual node means to its virtual kubelet. A node Ready before and
/// after, but since a later time, went NotReady and back in between (merged into one change):
/// the virtual kubelet sees both, so that it relists the provider as after any outage.
fn readiness_msgs(before: Option<&Node>, now: &Node) -> Vec<Msg> {
    let (ready, since) = node_ready(now);
    match before.map(node_ready) {
        Some((true, before_since)) if ready && before_since != since => {
            vec![Msg::NodeReady(false), Msg::NodeReady(true)]
        }
        _ => vec![Msg::NodeReady(ready)],
    }
}

/// The messages one kind of twin-namespace object becomes.
struct RemoteMsgs<R> {
    apply: fn(String, String, R) -> Msg,
    delete: fn(String, String) -> Msg,
    relisted: fn(String, Vec<(String, R)>) -> Msg,
}

/// Watches objects of `twin` on the provider, reduced to `record`s: each initial listing as one
/// message, then each change.
async fn watch_remote<K, R>(
    api: Api<K>,
    cfg: watcher::Config,
    twin: String,
    record: impl Fn(&K) -> R,
    msgs: RemoteMsgs<R>,
    tx: mpsc::Sender<Msg>,
) where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let stream = watch_events("virtual kubelet", api, cfg);
    futures::pin_mut!(stream);
    let mut init: Option<Vec<(String, R)>> = None;
    while let Some(ev) = stream.next().await {
        let msg = match ev {
            watcher::Event::Init => {
                init = Some(Vec::new());
                continue;
            }
            watcher::Event::InitApply(o) => {
                init.get_or_insert_with(Vec::new)
                    .push((o.name_any(), record(&o)));
                continue;
            }
            watcher::Event::InitDone => {
                (msgs.relisted)(twin.clone(), init.take().unwrap_or_default())
            }
            watcher::Event::Apply(o) => (msgs.apply)(twin.clone(), o.name_any(), record(&o)),
            watcher::Event::Delete(o) => (msgs.delete)(twin.clone(), o.name_any()),
        };
        if tx.send(msg).await.is_err() {
            return;
        }
    }
}

async fn watch_shadows(remote: Client, twin: String, tx: mpsc::Sender<Msg>) {
    let msgs = RemoteMsgs {
        apply: Msg::ShadowApply,
        delete: Msg::ShadowDelete,
        relisted: Msg::ShadowsRelisted,
    };
    let api = Api::<ShadowPodRef>::namespaced(remote, &twin);
    watch_remote(
        api,
        watcher::Config::default(),
        twin,
        remote_shadow,
        msgs,
        tx,
    )
    .await;
}

async fn watch_reals(
    remote: Client,
    twin: String,
    consumer_id: String,
    remap: Option<IpRemap>,
    tx: mpsc::Sender<Msg>,
) {
    let cfg = watcher::Config::default()
        .labels(&format!("{}={consumer_id}", names::ORIGIN_CLUSTER_LABEL));
    let msgs = RemoteMsgs {
        apply: Msg::RealApply,
        delete: Msg::RealDelete,
        relisted: Msg::RealRelisted,
    };
    let api = Api::<PodStatusRef>::namespaced(remote, &twin);
    watch_remote(api, cfg, twin, move |p| remote_pod(p, remap), msgs, tx).await;
}

/// The watches of one twin namespace on the provider.
struct TwinWatch(Vec<AbortHandle>);

impl Drop for TwinWatch {
    fn drop(&mut self) {
        for h in &self.0 {
            h.abort();
        }
    }
}

fn watch_twin(
    link: &ProviderLink,
    twin: &str,
    remap: Option<IpRemap>,
    tx: &mpsc::Sender<Msg>,
) -> TwinWatch {
    TwinWatch(vec![
        tokio::spawn(watch_shadows(
            link.client.clone(),
            twin.to_string(),
            tx.clone(),
        ))
        .abort_handle(),
        tokio::spawn(watch_reals(
            link.client.clone(),
            twin.to_string(),
            link.consumer_id.clone(),
            remap,
            tx.clone(),
        ))
        .abort_handle(),
    ])
}

/// Replaces the watches of every twin namespace (their pods listed again).
fn watch_twins_again(
    twins: &mut HashMap<String, TwinWatch>,
    link: &ProviderLink,
    remap: Option<IpRemap>,
    tx: &mpsc::Sender<Msg>,
) {
    for (twin, watch) in twins.iter_mut() {
        *watch = watch_twin(link, twin, remap, tx);
    }
}

/// Runs the virtual kubelet of `link`'s provider until the task is aborted.
pub async fn run(ctx: Ctx, mut link: LinkWatch) {
    let l = loop {
        if let Some(l) = link.get() {
            break l;
        }
        link.changed().await;
    };
    let remap_of = |l: &ProviderLink| {
        l.network.as_ref().map(|n| IpRemap {
            from: n.remote_pod_cidr,
            to: n.remote_pod_cidr_here,
        })
    };
    let mut remap = remap_of(&l);
    let (tx, mut rx) = mpsc::channel::<Msg>(LOOP.batch);
    let mut background = vec![
        tokio::spawn(watch_local(
            ctx.client.clone(),
            l.virtual_node.clone(),
            tx.clone(),
        ))
        .abort_handle(),
        tokio::spawn(follow(
            ctx.shared.offloadings.clone(),
            tx.clone(),
            |_| true,
            |_, o| vec![Msg::Offloading(Box::new(o.clone()))],
            |ns| Msg::OffloadingGone(ns.to_string()),
        ))
        .abort_handle(),
        tokio::spawn({
            let node = l.virtual_node.clone();
            follow(
                ctx.shared.nodes.clone(),
                tx.clone(),
                move |name| name == node,
                readiness_msgs,
                |_| Msg::NodeReady(false),
            )
        })
        .abort_handle(),
    ];
    let ticker = tx.clone();
    background.push(
        tokio::spawn(async move {
            let mut t = tokio::time::interval(RESYNC);
            loop {
                t.tick().await;
                if ticker.send(Msg::Tick).await.is_err() {
                    return;
                }
            }
        })
        .abort_handle(),
    );
    let _background = TwinWatch(background);
    let mut twins: HashMap<String, TwinWatch> = HashMap::new();
    let mut state = State {
        fence_margin: ctx.options.fence_margin,
        real_origins: ctx.shared.origins.clone(),
        ..State::default()
    };
    loop {
        let msg = tokio::select! {
            msg = rx.recv() => match msg {
                Some(msg) => msg,
                None => break,
            },
            () = link.changed() => {
                // The network is negotiated after the link exists (and may be again): the
                // provider's pods are listed again, their IPs remapped the new way. A new
                // identity restarts this task instead.
                if let Some(now) = link.get()
                    && now.identity_version == l.identity_version
                    && remap_of(&now) != remap
                {
                    remap = remap_of(&now);
                    watch_twins_again(&mut twins, &l, remap, &tx);
                }
                continue;
            }
        };
        let mut changes = Vec::new();
        changes.extend(state.apply(msg, &l));
        LOOP.drain(
            || rx.try_recv().ok(),
            |msg| changes.extend(state.apply(msg, &l)),
        );
        for change in changes {
            match change {
                Change::Twin { old, new } => {
                    if let Some(old) = old {
                        twins.remove(&old);
                        state.forget_twin(&old);
                    }
                    if let Some(new) = new {
                        twins.insert(new.clone(), watch_twin(&l, &new, remap, &tx));
                    }
                }
                Change::Readiness(true) => {
                    // Re-list the provider: the watches may be backing off after the outage.
                    watch_twins_again(&mut twins, &l, remap, &tx);
                }
                Change::Readiness(false) => {}
            }
        }
        let actions = state.decide(&l.provider_id, Instant::now());
        if std::mem::take(&mut state.relist) {
            watch_twins_again(&mut twins, &l, remap, &tx);
        }
        if actions.is_empty() {
            continue;
        }
        let outcomes: Vec<Outcome> = LOOP
            .act(actions, |a| {
                act(
                    ctx.client.clone(),
                    l.client.clone(),
                    l.consumer_id.clone(),
                    ctx.metrics.clone(),
                    a,
                )
            })
            .await;
        for o in outcomes {
            state.outcome(o);
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    const TWIN: &str = "app-rome";

    /// A virtual kubelet state with namespace `app` offloaded to `TWIN`, everything listed and
    /// the provider reachable.
    fn world() -> State {
        let mut s = State {
            local_synced: true,
            node_ready: true,
            fence_margin: Duration::from_secs(3),
            ..Default::default()
        };
        s.twins.insert("app".into(), TWIN.into());
        s.origins.insert(TWIN.into(), "app".into());
        s.shadows_synced.insert(TWIN.into());
        s.reals_synced.insert(TWIN.into());
        s
    }

    /// The consumer pod `app/web` with UID `uid`.
    fn local(uid: &str) -> LocalPod {
        LocalPod {
            uid: uid.into(),
            ..Default::default()
        }
    }

    fn shadow(origin_uid: &str) -> RemoteShadow {
        RemoteShadow {
            uid: format!("shadow-of-{origin_uid}"),
            origin_uid: origin_uid.into(),
            deleting: false,
            rejected: None,
            fenced: None,
        }
    }

    fn real(origin_uid: &str) -> RemotePod {
        RemotePod {
            uid: format!("real-of-{origin_uid}"),
            origin_uid: origin_uid.into(),
            hash: 7,
            news: true,
            status: Some(Arc::new(json!({"phase": "Running"}))),
            seen: Instant::now(),
        }
    }

    fn key() -> Key {
        ("app".into(), "web".into())
    }

    /// A pod running on the provider whose status (hash 7, the real pod's) is written.
    fn running_and_written(s: &mut State) {
        s.local.insert(
            key(),
            LocalPod {
                written: 7,
                ..local("u1")
            },
        );
        s.shadows.insert(rkey(), shadow("u1"));
        s.reals.insert(rkey(), real("u1"));
    }

    fn rkey() -> Key {
        (TWIN.into(), "web".into())
    }

    /// One word per action, to compare with a table.
    fn summary(a: &Action) -> String {
        match a {
            Action::CreateShadow { .. } => "create-shadow".into(),
            Action::DeleteShadow { uid, .. } => format!("delete-shadow {uid}"),
            Action::DeleteLocal { .. } => "delete-local".into(),
            Action::WriteStatus { status, .. } => format!(
                "status {}",
                status["reason"]
                    .as_str()
                    .or(status["phase"].as_str())
                    .unwrap_or("")
            ),
            Action::MarkUnready { .. } => "unready".into(),
        }
    }

    #[test]
    fn decide_table() {
        let now = Instant::now();
        let second_ago = now - Duration::from_secs(1);
        let long_ago = now - RETRY_AFTER - Duration::from_secs(1);
        type Setup = fn(&mut State, Instant, Instant);
        let cases: Vec<(&str, Setup, &[&str])> = vec![
            (
                "a new pod gets its shadow pod",
                |s, _, _| {
                    s.local.insert(key(), local("u1"));
                },
                &["create-shadow"],
            ),
            (
                "a create sent a second ago is waited for",
                |s, recent, _| {
                    s.local.insert(
                        key(),
                        LocalPod {
                            requested: Some(recent),
                            ..local("u1")
                        },
                    );
                },
                &[],
            ),
            (
                "a create unconfirmed for too long is sent again",
                |s, _, old| {
                    s.local.insert(
                        key(),
                        LocalPod {
                            requested: Some(old),
                            ..local("u1")
                        },
                    );
                },
                &["create-shadow"],
            ),
            (
                "a deleted pod deletes its shadow pod",
                |s, _, _| {
                    s.local.insert(
                        key(),
                        LocalPod {
                            deleting: true,
                            ..local("u1")
                        },
                    );
                    s.shadows.insert(rkey(), shadow("u1"));
                },
                &["delete-shadow shadow-of-u1"],
            ),
            (
                "a deleted pod with nothing left remotely goes",
                |s, _, _| {
                    s.local.insert(
                        key(),
                        LocalPod {
                            deleting: true,
                            ..local("u1")
                        },
                    );
                },
                &["delete-local"],
            ),
            (
                "a deleted pod waits for its real pod to go",
                |s, _, _| {
                    s.local.insert(
                        key(),
                        LocalPod {
                            deleting: true,
                            ..local("u1")
                        },
                    );
                    s.reals.insert(rkey(), real("u1"));
                },
                &[],
            ),
            (
                "a started pod whose shadow pod vanished is replaced by its owner",
                |s, _, _| {
                    s.local.insert(
                        key(),
                        LocalPod {
                            started: true,
                            ..local("u1")
                        },
                    );
                },
                &["delete-local"],
            ),
            (
                "the shadow pod of an earlier pod of that name makes way",
                |s, _, _| {
                    s.local.insert(key(), local("u2"));
                    s.shadows.insert(rkey(), shadow("u1"));
                },
                &["delete-shadow shadow-of-u1"],
            ),
            (
                "the real pod's status is mirrored",
                |s, _, _| {
                    s.local.insert(key(), local("u1"));
                    s.shadows.insert(rkey(), shadow("u1"));
                    s.reals.insert(rkey(), real("u1"));
                },
                &["status Running"],
            ),
            (
                "a status already written is not written again",
                |s, _, _| running_and_written(s),
                &[],
            ),
            (
                "a rejected shadow pod shows as a Pending pod",
                |s, _, _| {
                    s.local.insert(key(), local("u1"));
                    s.shadows.insert(
                        rkey(),
                        RemoteShadow {
                            rejected: Some("quota".into()),
                            ..shadow("u1")
                        },
                    );
                },
                &["status OffloadingRejected"],
            ),
            (
                "a pod the provider fenced is deleted, for its owner to replace it",
                |s, _, old| {
                    s.local.insert(
                        key(),
                        LocalPod {
                            started: true,
                            ..local("u1")
                        },
                    );
                    s.shadows.insert(
                        rkey(),
                        RemoteShadow {
                            fenced: Some(old),
                            ..shadow("u1")
                        },
                    );
                },
                &["delete-local"],
            ),
            (
                "a pod fenced less than the fence margin ago waits for the provider's kubelet",
                |s, recent, _| {
                    s.local.insert(key(), local("u1"));
                    s.shadows.insert(
                        rkey(),
                        RemoteShadow {
                            fenced: Some(recent),
                            ..shadow("u1")
                        },
                    );
                },
                &[],
            ),
            (
                "a fenced pod whose real pod is still there waits for it to go",
                |s, _, old| {
                    s.local.insert(key(), local("u1"));
                    s.shadows.insert(
                        rkey(),
                        RemoteShadow {
                            fenced: Some(old),
                            ..shadow("u1")
                        },
                    );
                    s.reals.insert(rkey(), real("u1"));
                },
                &[],
            ),
            (
                "an unreachable provider marks offloaded pods not ready",
                |s, _, _| {
                    s.node_ready = false;
                    s.local.insert(key(), local("u1"));
                    s.shadows.insert(rkey(), shadow("u1"));
                },
                &["unready"],
            ),
            (
                "an unreachable provider gets no writes",
                |s, _, _| {
                    s.node_ready = false;
                    s.local.insert(key(), local("u1"));
                },
                &[],
            ),
            (
                "an orphan shadow pod is deleted",
                |s, _, _| {
                    s.shadows.insert(rkey(), shadow("u1"));
                },
                &["delete-shadow shadow-of-u1"],
            ),
            (
                "nothing is an orphan before the consumer's pods are listed",
                |s, _, _| {
                    s.local_synced = false;
                    s.shadows.insert(rkey(), shadow("u1"));
                },
                &[],
            ),
            (
                "a DaemonSet pod without the opt-in is refused, with the reason",
                |s, _, _| {
                    s.local.insert(
                        key(),
                        LocalPod {
                            refused: Some("not opted in".into()),
                            ..local("u1")
                        },
                    );
                },
                &["status DaemonSetNotOptedIn"],
            ),
            (
                "the refusal is written once",
                |s, _, _| {
                    let status = json!({"phase": "Pending", "reason": daemonset::REFUSED_REASON,
                        "message": "not opted in"});
                    s.local.insert(
                        key(),
                        LocalPod {
                            refused: Some("not opted in".into()),
                            written: hash_of(&status),
                            ..local("u1")
                        },
                    );
                },
                &[],
            ),
            (
                "nothing is created before the twin namespace is listed",
                |s, _, _| {
                    s.reals_synced.clear();
                    s.local.insert(key(), local("u1"));
                },
                &[],
            ),
        ];
        for (name, setup, want) in cases {
            let mut s = world();
            setup(&mut s, second_ago, long_ago);
            s.dirty.insert(key());
            let got: Vec<String> = s.decide("milan", now).iter().map(summary).collect();
            assert_eq!(got, want.to_vec(), "{name}");
        }
    }

    #[test]
    fn a_daemonset_pod_runs_in_the_provider_without_its_pin_to_the_virtual_node() {
        let meta: ObjectMeta = serde_json::from_value(json!({
            "name": "agent-x2kd9", "uid": "u1", "labels": {"app": "agent"},
        }))
        .unwrap();
        let spec = json!({
            "containers": [{"name": "a", "image": "agent:1"}],
            "nodeName": "tandem-milan",
            "tolerations": [{"operator": "Exists"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": ["tandem-milan"]}]}]}}},
        });
        let out = shadow_spec_of(&meta, spec, "rome");
        let pod = &out["pod"];
        assert!(pod["affinity"].is_null(), "the pin is gone: {pod}");
        assert!(pod["nodeName"].is_null());
        assert_eq!(pod["tolerations"], json!([{"operator": "Exists"}]));
    }

    #[test]
    fn statuses_are_written_again_when_the_node_is_ready_again() {
        let mut s = world();
        running_and_written(&mut s);
        s.dirty.insert(key());
        assert!(
            s.decide("milan", Instant::now()).is_empty(),
            "already written"
        );
        // An outage seen only by its end, both in one batch: no MarkUnready went out, but the
        // node lifecycle controller may have marked the pod NotReady meanwhile.
        assert!(s.set_node_ready(false).is_some());
        assert!(s.set_node_ready(true).is_some());
        assert!(s.set_node_ready(true).is_none(), "no change, nothing to do");
        let actions: Vec<String> = s
            .decide("milan", Instant::now())
            .iter()
            .map(summary)
            .collect();
        assert_eq!(actions, ["status Running"]);
    }

    /// The node lifecycle controller marked the pod NotReady after this kubelet wrote it Ready
    /// (a lost node's pods, just after its return): once the watch has had time to catch up,
    /// the status is written again — from a fresh list of the provider when it was dropped.
    #[test]
    fn a_readiness_changed_behind_its_back_is_written_again() {
        let now = Instant::now();
        let mut s = world();
        running_and_written(&mut s);
        let written = |s: &mut State, ago: Duration, seen: Option<bool>| {
            let l = s.local.get_mut(&key()).unwrap();
            l.ready_written = Some(true);
            l.written_at = Some(now - ago);
            l.ready_seen = seen;
        };
        let decide = |s: &mut State| -> Vec<String> {
            s.dirty.insert(key());
            s.decide("milan", now).iter().map(summary).collect()
        };
        // As written, or seen before the write's own event: nothing to do.
        written(&mut s, Duration::from_secs(60), Some(true));
        assert!(decide(&mut s).is_empty(), "agrees");
        written(&mut s, Duration::from_secs(1), Some(false));
        assert!(
            decide(&mut s).is_empty(),
            "an older event, within the watch's lag"
        );
        written(&mut s, Duration::from_secs(60), None);
        assert!(
            decide(&mut s).is_empty(),
            "no Ready condition seen: nothing to contradict"
        );
        // Contradicted for longer: written again, the status still at hand.
        written(&mut s, RETRY_AFTER, Some(false));
        assert_eq!(decide(&mut s), ["status Running"]);
        assert!(!s.relist);
        // The status was dropped after writing: the provider is listed again first.
        running_and_written(&mut s);
        written(&mut s, RETRY_AFTER, Some(false));
        s.reals.get_mut(&rkey()).unwrap().status = None;
        assert!(decide(&mut s).is_empty());
        assert!(s.relist, "the provider is listed again");
        s.reals.insert(rkey(), real("u1"));
        assert_eq!(decide(&mut s), ["status Running"], "then written");
        // Marked unready by this kubelet itself: its own write, not a contradiction.
        running_and_written(&mut s);
        written(&mut s, RETRY_AFTER, Some(false));
        s.local.get_mut(&key()).unwrap().unready = true;
        assert_eq!(
            decide(&mut s),
            ["status Running"],
            "the usual rewrite, once"
        );
    }

    #[test]
    fn the_reflectors_learn_each_real_pods_consumer_pod_from_the_real_pods_seen() {
        let mut s = world();
        let origins = s.real_origins.clone();
        let at = |uid: &str, name: &str| origins.get(uid, "app", name);
        let pod = |s: &mut State, name: &str, uid: &str| {
            let key = ("app".to_string(), name.to_string());
            s.local.insert(key, local(uid));
        };
        pod(&mut s, "web", "u1");
        s.set_real(TWIN.into(), "web".into(), real("u1"));
        assert_eq!(at("real-of-u1", "web").as_deref(), Some("u1"));
        assert_eq!(at("real-of-u1", "db"), None, "an Event naming another pod");
        assert_eq!(origins.get("real-of-u1", "other", "web"), None);
        // A status update changes nothing; a real pod made again under the same name (for a
        // new consumer pod) replaces the old one's entry.
        s.set_real(TWIN.into(), "web".into(), real("u1"));
        pod(&mut s, "web", "u2");
        s.set_real(TWIN.into(), "web".into(), real("u2"));
        assert_eq!(at("real-of-u1", "web"), None);
        assert_eq!(at("real-of-u2", "web").as_deref(), Some("u2"));
        // Without an origin annotation, nothing is recorded (the reflector reads the pod).
        pod(&mut s, "bare", "u5");
        s.set_real(TWIN.into(), "bare".into(), real(""));
        assert_eq!(origins.len(), 1);
        s.remove_real(TWIN.into(), "web".into());
        assert!(origins.is_empty());
        // A relisting replaces the twin's entries, and leaves other twins' alone.
        s.origins.insert("other-twin".into(), "app".into());
        pod(&mut s, "db", "u9");
        s.set_real("other-twin".into(), "db".into(), real("u9"));
        pod(&mut s, "old", "u3");
        s.set_real(TWIN.into(), "old".into(), real("u3"));
        pod(&mut s, "new", "u4");
        s.relist_reals(TWIN.into(), vec![("new".into(), real("u4"))]);
        assert_eq!(at("real-of-u3", "old"), None);
        assert_eq!(at("real-of-u4", "new").as_deref(), Some("u4"));
        assert_eq!(at("real-of-u9", "db").as_deref(), Some("u9"));
        // A twin no longer watched takes its entries with it.
        s.forget_twin("other-twin");
        assert_eq!(at("real-of-u9", "db"), None);
        assert_eq!(origins.len(), 1);
    }

    #[test]
    fn a_real_pod_claiming_another_consumer_pod_is_not_believed() {
        let mut s = world();
        let origins = s.real_origins.clone();
        s.local.insert(key(), local("u1"));
        let db = ("app".to_string(), "db".to_string());
        s.local.insert(db, local("u2"));
        // The provider's real pod `web` says it runs `db` (UID u2); so does a real pod for a
        // consumer pod that does not exist, and one seen in a twin no namespace maps to.
        s.set_real(TWIN.into(), "web".into(), real("u2"));
        s.set_real(TWIN.into(), "ghost".into(), real("u2"));
        s.set_real("unknown-twin".into(), "db".into(), real("u2"));
        s.relist_reals(TWIN.into(), vec![("web".into(), real("u2"))]);
        assert!(origins.is_empty(), "none recorded");
        // A real pod that turns to claim another pod loses the entry it had.
        s.set_real(TWIN.into(), "web".into(), real("u1"));
        assert_eq!(
            origins.get("real-of-u1", "app", "web").as_deref(),
            Some("u1")
        );
        let mut turned = real("u2");
        turned.uid = "real-of-u1".into();
        s.set_real(TWIN.into(), "web".into(), turned);
        assert!(origins.is_empty(), "forgotten");
    }

    #[tokio::test]
    async fn a_real_pod_seen_before_its_consumer_pod_is_recorded_once_the_pod_is_seen() {
        let mut s = world();
        let origins = s.real_origins.clone();
        s.set_real(TWIN.into(), "web".into(), real("u1"));
        assert!(origins.is_empty());
        let pod: LeanPod = serde_json::from_value(json!({
            "metadata": {"namespace": "app", "name": "web", "uid": "u1"},
            "spec": {"containers": [{"name": "a", "image": "a:1"}]},
        }))
        .unwrap();
        let link = ProviderLink::for_tests("milan");
        s.set_local(&pod, &link);
        assert_eq!(
            origins.get("real-of-u1", "app", "web").as_deref(),
            Some("u1")
        );
    }

    #[test]
    fn a_create_is_retried_only_after_the_retry_delay() {
        let start = Instant::now();
        let mut s = world();
        s.local.insert(key(), local("u1"));
        s.dirty.insert(key());
        assert_eq!(s.decide("milan", start).len(), 1, "sent");
        s.dirty.insert(key());
        assert!(
            s.decide("milan", start + RETRY_AFTER / 2).is_empty(),
            "awaited"
        );
        s.dirty.insert(key());
        assert_eq!(s.decide("milan", start + RETRY_AFTER).len(), 1, "retried");
    }

    /// What `follow` sends, as text: `gone:KEY`, `changed:VALUE(was BEFORE)`, `ready:BOOL`.
    fn said(msg: Msg) -> String {
        match msg {
            Msg::OffloadingGone(s) => s,
            Msg::NodeReady(r) => format!("ready:{r}"),
            _ => "other".into(),
        }
    }

    #[tokio::test]
    async fn a_follower_sees_what_went_before_what_changed_and_only_its_keys() {
        let map = |entries: &[(&str, &Arc<String>)]| -> SharedMap<String> {
            Arc::new(
                entries
                    .iter()
                    .map(|(k, v)| (k.to_string(), Arc::clone(v)))
                    .collect(),
            )
        };
        let (a, b, b2, other) = (
            Arc::new("a1".to_string()),
            Arc::new("b1".to_string()),
            Arc::new("b2".to_string()),
            Arc::new("x".to_string()),
        );
        let (shared, rx) =
            tokio::sync::watch::channel(map(&[("a", &a), ("b", &b), ("skip", &other)]));
        let (tx, mut msgs) = mpsc::channel(16);
        let task = tokio::spawn(follow(
            rx,
            tx,
            |key| key != "skip",
            |before, now| {
                vec![Msg::OffloadingGone(format!(
                    "changed:{now}(was {})",
                    before.map_or("-", |b| b.as_str())
                ))]
            },
            |key| Msg::OffloadingGone(format!("gone:{key}")),
        ));
        let mut next = async || said(msgs.recv().await.expect("a message"));
        assert_eq!(next().await, "changed:a1(was -)");
        assert_eq!(next().await, "changed:b1(was -)");
        // A relisting (or changes merged): `a` went and `b` changed; `a` is said first. The
        // unwanted key, changed too, is never said.
        shared.send_replace(map(&[("b", &b2), ("skip", &a)]));
        assert_eq!(next().await, "gone:a");
        assert_eq!(next().await, "changed:b2(was b1)");
        // An entry the map kept (the same Arc) is not said again.
        shared.send_modify(|m| {
            Arc::make_mut(m).insert("c".into(), Arc::new("c1".into()));
        });
        assert_eq!(next().await, "changed:c1(was -)");
        assert!(msgs.try_recv().is_err(), "nothing else");
        task.abort();
    }

    #[test]
    fn a_node_ready_again_since_a_later_time_reads_as_an_outage_and_its_end() {
        let node = |ready: bool, since: i64| -> Node {
            serde_json::from_value(json!({"status": {"conditions": [{
                "type": "Ready", "status": if ready { "True" } else { "False" },
                "lastTransitionTime": k8s_openapi::jiff::Timestamp::from_second(since)
                    .unwrap().to_string(),
            }]}}))
            .unwrap()
        };
        let says = |before: Option<&Node>, now: &Node| -> Vec<String> {
            readiness_msgs(before, now).into_iter().map(said).collect()
        };
        assert_eq!(says(None, &node(true, 10)), ["ready:true"]);
        assert_eq!(says(Some(&node(true, 10)), &node(true, 10)), ["ready:true"]);
        assert_eq!(
            says(Some(&node(true, 10)), &node(false, 20)),
            ["ready:false"]
        );
        assert_eq!(
            says(Some(&node(false, 20)), &node(true, 30)),
            ["ready:true"]
        );
        assert_eq!(
            says(Some(&node(true, 10)), &node(true, 30)),
            ["ready:false", "ready:true"],
            "NotReady and back, merged"
        );
    }
}
