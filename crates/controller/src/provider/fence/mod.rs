//! Provider side of fencing (NamespaceOffloading `partitionPolicy: Fence`): for each consumer,
//! a nonce published in Lease `tandem-fence-nonce` of its tenant namespace that the consumer
//! hands back through Lease `tandem-fence`, and the fencing of its pods once it has not done so
//! for their `fenceAfter`.
//!
//! The deadline is kept on this process's monotonic clock (see `tandem_core::fence`): a pod
//! labelled `tandem.dev/fence-after: 10s` is fenced 10 s after the issue of the newest nonce
//! the consumer handed back. Fencing marks its ShadowPod `Fenced` first (so neither the shadow
//! pod controller nor a later pass starts it again), then deletes the real pod with grace 0 —
//! also a real pod still shutting down after its shadow pod went — and says so in an Event and
//! in the Tenant's `Fenced` condition and `status.fence.fencedPods`.
//!
//! The newest accepted issue time is also written, as wall-clock time, next to the nonce: a
//! restarted controller counts from there, so a hand-over that takes longer than a pod's
//! `fenceAfter` fences it at once.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tandem_api::conditions::{self, ConditionStatus};
use tandem_api::{ShadowPod, Tenant, client, names};
use tandem_core::fence::{self, ProviderLease};

use crate::context::Ctx;
use crate::provider::shadowpod::PHASE_FENCED;
use crate::tasks::AbortOnDrop;

mod plan;

use plan::{NonceStep, Step};

/// How often handed-back nonces and deadlines are checked: a deadline is acted on at most this
/// late (the consumer's margin covers it).
const TICK: Duration = Duration::from_millis(250);
/// Fencing writes in flight at once, and how long each may take: fencing must finish well
/// within the consumer's margin.
const PARALLEL_WRITES: usize = 32;
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);
/// Condition type on the Tenant: True while pods of the consumer stand fenced.
pub const CONDITION: &str = "Fenced";

/// One consumer's lease, as this process knows it.
struct Consumer {
    lease: ProviderLease,
    /// The newest nonce is not published yet.
    unpublished: bool,
    /// The nonce last seen in the consumer's fence Lease (each is accepted once).
    returned: Option<String>,
    /// The pods fenced since the lease was last renewed (for the condition).
    fenced: Vec<String>,
    /// UIDs of the shadow pods this process marked Fenced and of the real pods it deleted
    /// (the stores may not show it yet).
    done: BTreeSet<String>,
}

/// A random nonce: 128 bits, hex.
fn new_nonce() -> String {
    use rand::Rng;
    format!("{:032x}", rand::rng().random::<u128>())
}

fn wall_ms_now() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_millisecond()
}

/// `instant` (of this process's clock) as wall-clock RFC 3339, to the millisecond.
fn wall_of(instant: Instant) -> String {
    let ago = Instant::now().saturating_duration_since(instant);
    let ms = wall_ms_now().saturating_sub(i64::try_from(ago.as_millis()).unwrap_or(i64::MAX));
    k8s_openapi::jiff::Timestamp::from_millisecond(ms)
        .unwrap_or_else(|_| k8s_openapi::jiff::Timestamp::now())
        .strftime("%Y-%m-%dT%H:%M:%S%.3fZ")
        .to_string()
}

/// The lease of a consumer first seen now: counted from the base the nonce Lease holds
/// (written by an earlier process), else from now, the first nonce's issue being later still.
fn first_lease(published: Option<&Lease>, now: Instant) -> ProviderLease {
    let persisted = published
        .and_then(|l| {
            l.annotations()
                .get(names::FENCE_ACCEPTED_AT_ANNOTATION)
                .cloned()
        })
        .and_then(|at| at.parse::<k8s_openapi::jiff::Timestamp>().ok());
    let base = match persisted {
        Some(at) => fence::base_from_wall(at.as_millisecond(), wall_ms_now(), now),
        None => Some(now),
    };
    ProviderLease::new(new_nonce(), now, base)
}

/// Watches `api` into a store, in the background.
fn store<K>(api: Api<K>, config: watcher::Config) -> (Store<K>, tokio::task::JoinHandle<()>)
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, config))
        .default_backoff()
        .for_each(|_| async {});
    (reader, tokio::spawn(stream))
}

/// What the fence reads, kept current by watches.
struct View {
    tenants: Store<Tenant>,
    leases: Store<Lease>,
    shadows: Store<ShadowPod>,
    pods: Store<Pod>,
    namespaces: Store<Namespace>,
}

impl View {
    /// The consumer a twin namespace belongs to (its `origin-cluster-id` label, set by this
    /// cluster when it created the namespace).
    fn owner_of(&self, ns: &str) -> Option<String> {
        self.namespaces
            .get(&ObjectRef::new(ns))
            .filter(|n| !n.labels().contains_key(names::TENANT_NAMESPACE_LABEL))
            .and_then(|n| n.labels().get(names::ORIGIN_CLUSTER_LABEL).cloned())
    }

    fn lease(&self, ns: &str, name: &str) -> Option<std::sync::Arc<Lease>> {
        self.leases.get(&ObjectRef::new(name).within(ns))
    }

    /// `namespace/name` of the consumer's shadow pods standing fenced.
    fn fenced_pods(&self, consumer: &str) -> Vec<String> {
        let mut pods: Vec<String> = self
            .shadows
            .state()
            .iter()
            .filter(|sp| phase_of(sp) == Some(PHASE_FENCED))
            .filter(|sp| self.owner_of(&ns_of(&***sp)).as_deref() == Some(consumer))
            .map(|sp| format!("{}/{}", ns_of(&**sp), sp.name_any()))
            .collect();
        pods.sort();
        pods
    }
}

fn ns_of<K: Resource>(o: &K) -> String {
    o.meta().namespace.clone().unwrap_or_default()
}

fn phase_of(sp: &ShadowPod) -> Option<&str> {
    sp.status.as_ref().and_then(|s| s.phase.as_deref())
}

/// Runs the provider's fence until the task is aborted.
pub async fn run(ctx: Ctx) {
    let client = ctx.client.clone();
    let (tenants, t) = store(Api::<Tenant>::all(client.clone()), Default::default());
    let (leases, l) = store(
        Api::<Lease>::all(client.clone()),
        watcher::Config::default().labels(names::FENCE_LEASE_LABEL),
    );
    let (shadows, s) = store(
        Api::<ShadowPod>::all(client.clone()),
        watcher::Config::default().labels(names::FENCE_AFTER),
    );
    let (pods, p) = store(
        Api::<Pod>::all(client.clone()),
        watcher::Config::default().labels(names::FENCE_AFTER),
    );
    let (namespaces, n) = store(
        Api::<Namespace>::all(client.clone()),
        watcher::Config::default().labels(names::ORIGIN_CLUSTER_LABEL),
    );
    let _watches = AbortOnDrop::all(vec![t, l, s, p, n]);
    let view = View {
        tenants,
        leases,
        shadows,
        pods,
        namespaces,
    };
    let ready = futures::future::try_join5(
        view.tenants.wait_until_ready(),
        view.leases.wait_until_ready(),
        view.shadows.wait_until_ready(),
        view.pods.wait_until_ready(),
        view.namespaces.wait_until_ready(),
    );
    if ready.await.is_err() {
        return;
    }
    let mut consumers: BTreeMap<String, Consumer> = BTreeMap::new();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let mut seen = BTreeSet::new();
        for tenant in view.tenants.state() {
            let id = tenant.spec.cluster_id.clone();
            let ns = names::tenant_namespace(&id);
            // Only the tenant namespace of a consumer speaks for it.
            if tenant.namespace().as_deref() != Some(ns.as_str())
                || tenant.metadata.deletion_timestamp.is_some()
            {
                continue;
            }
            seen.insert(id.clone());
            let now = Instant::now();
            let consumer = consumers.entry(id.clone()).or_insert_with(|| Consumer {
                lease: first_lease(view.lease(&ns, names::FENCE_NONCE_LEASE).as_deref(), now),
                unpublished: true,
                returned: None,
                fenced: Vec::new(),
                done: BTreeSet::new(),
            });
            let returned = view
                .lease(&ns, names::FENCE_LEASE)
                .and_then(|l| l.annotations().get(names::FENCE_NONCE_ANNOTATION).cloned());
            let step = plan::next_nonce(
                &mut consumer.lease,
                &mut consumer.returned,
                returned.as_deref(),
                now,
            );
            if step == NonceStep::Renewed {
                consumer.fenced.clear();
            }
            // A new nonce after each renewal, and every few seconds without one.
            if step != NonceStep::Keep {
                consumer.lease.reissue(new_nonce(), Instant::now());
                consumer.unpublished = true;
            }
            let fenced = fence_due(&client, &view, &id, consumer).await;
            if consumer.unpublished {
                match publish(&ctx, &ns, &consumer.lease).await {
                    Ok(()) => consumer.unpublished = false,
                    Err(e) => {
                        tracing::warn!(tenant = %format!("{ns}/{id}"), "publishing the fence nonce: {e}")
                    }
                }
            }
            let standing = view.fenced_pods(&id);
            if status_lists(&tenant) != standing
                && let Err(e) = list_fenced(&client, &tenant, &standing).await
            {
                tracing::warn!(tenant = %format!("{ns}/{id}"), "listing the fenced pods in its status: {e}");
            }
            if !fenced.is_empty() {
                record_fencing(&client, &tenant, &fenced).await;
                consumer.fenced.extend(fenced);
            }
            report(&client, &tenant, &consumer.fenced, standing.len()).await;
        }
        consumers.retain(|id, _| seen.contains(id));
    }
}

fn status_lists(tenant: &Tenant) -> Vec<String> {
    tenant
        .status
        .as_ref()
        .and_then(|s| s.fence.as_ref())
        .map(|f| f.fenced_pods.clone())
        .unwrap_or_default()
}

/// Runs `writes` concurrently, each bounded in time (a slow one is retried on the next tick).
async fn all_bounded<F: Future<Output = ()>>(writes: Vec<F>) {
    futures::stream::iter(writes)
        .map(|w| async move {
            let _ = tokio::time::timeout(WRITE_TIMEOUT, w).await;
        })
        .buffer_unordered(PARALLEL_WRITES)
        .collect::<Vec<()>>()
        .await;
}

/// Fences the consumer's pods whose deadline has passed: marks their shadow pods Fenced, then
/// deletes the real pods (with those already shutting down) with grace 0. Returns the shadow
/// pods fenced now.
async fn fence_due(client: &Client, view: &View, id: &str, consumer: &mut Consumer) -> Vec<String> {
    let shadows = view.shadows.state();
    let pods = view.pods.state();
    // Marks and deletions the stores show (or whose objects are gone) need no memory.
    plan::forget_settled(&mut consumer.done, &shadows, &pods);
    let now = Instant::now();
    let to_mark: Vec<Step> = shadows
        .iter()
        .filter_map(|sp| {
            let owner = view.owner_of(&ns_of(&**sp));
            plan::shadow_pod(
                sp,
                owner.as_deref(),
                id,
                &consumer.lease,
                &consumer.done,
                now,
            )
            .ok()
        })
        .collect();
    let marked = std::sync::Mutex::new(Vec::new());
    all_bounded(
        to_mark
            .iter()
            .map(|step| {
                let marked = &marked;
                async move {
                    if let Some(done) = act(client, id, step).await {
                        marked.lock().unwrap_or_else(|e| e.into_inner()).push(done);
                    }
                }
            })
            .collect(),
    )
    .await;
    let marked = marked.into_inner().unwrap_or_else(|e| e.into_inner());
    let fenced: Vec<String> = marked.iter().map(|(_, key)| key.clone()).collect();
    consumer.done.extend(marked.into_iter().map(|(uid, _)| uid));
    // A pod whose shadow pod is not marked yet (its mark failed) waits for it: nothing must
    // start it again.
    let unmarked: BTreeSet<String> = to_mark
        .iter()
        .filter_map(|step| match step {
            Step::MarkFenced {
                namespace,
                name,
                uid,
                ..
            } if !consumer.done.contains(uid) => Some(format!("{namespace}/{name}")),
            _ => None,
        })
        .collect();
    let to_delete: Vec<Step> = pods
        .iter()
        .filter_map(|p| {
            let owner = view.owner_of(&ns_of(&**p));
            plan::real_pod(
                p,
                owner.as_deref(),
                id,
                &consumer.lease,
                &consumer.done,
                &unmarked,
                now,
            )
            .ok()
        })
        .collect();
    let deleted = std::sync::Mutex::new(Vec::new());
    all_bounded(
        to_delete
            .iter()
            .map(|step| {
                let deleted = &deleted;
                async move {
                    if let Some((uid, _)) = act(client, id, step).await {
                        deleted.lock().unwrap_or_else(|e| e.into_inner()).push(uid);
                    }
                }
            })
            .collect(),
    )
    .await;
    consumer
        .done
        .extend(deleted.into_inner().unwrap_or_else(|e| e.into_inner()));
    fenced
}

/// Makes one write of the fence for consumer `id`; on success, the UID and `namespace/name` of
/// what it wrote. An object gone already (or replaced) needs nothing more; a failure is logged
/// and retried on the next tick.
async fn act(client: &Client, id: &str, step: &Step) -> Option<(String, String)> {
    match step {
        Step::MarkFenced {
            namespace,
            name,
            uid,
            fence_after,
        } => {
            let message = format!(
                "fenced: consumer {id} renewed no fence lease for its fenceAfter ({fence_after}); \
                 the pod is stopped and will not run here again"
            );
            let patch = json!({"status": {"phase": PHASE_FENCED, "message": message}});
            match Api::<ShadowPod>::namespaced(client.clone(), namespace)
                .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => Some((uid.clone(), format!("{namespace}/{name}"))),
                Err(e) if client::is_not_found(&e) => None,
                Err(e) => {
                    tracing::warn!(shadowpod = %format!("{namespace}/{name}"), "fencing: marking the shadow pod: {e}");
                    None
                }
            }
        }
        Step::DeletePod {
            namespace,
            name,
            uid,
        } => {
            let grace0 = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(kube::api::Preconditions {
                    uid: Some(uid.clone()),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match Api::<Pod>::namespaced(client.clone(), namespace)
                .delete(name, &grace0)
                .await
            {
                Ok(_) => {
                    tracing::warn!(pod = %format!("{namespace}/{name}"), consumer = %id, "fenced");
                    Some((uid.clone(), format!("{namespace}/{name}")))
                }
                Err(e) if client::is_not_found(&e) || client::is_conflict(&e) => None,
                Err(e) => {
                    tracing::warn!(pod = %format!("{namespace}/{name}"), "fencing: deleting the real pod: {e}");
                    None
                }
            }
        }
    }
}

/// Writes the newest nonce, and the base it counts from, into the nonce Lease.
async fn publish(ctx: &Ctx, ns: &str, lease: &ProviderLease) -> Result<(), kube::Error> {
    let accepted_at = lease
        .base()
        .map_or_else(|| "1970-01-01T00:00:00.000Z".to_string(), wall_of);
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    );
    let object = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": names::FENCE_NONCE_LEASE,
                     "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY,
                                names::FENCE_LEASE_LABEL: "provider"},
                     "annotations": {names::FENCE_NONCE_ANNOTATION: lease.nonce(),
                                     names::FENCE_ACCEPTED_AT_ANNOTATION: accepted_at}},
        "spec": {"holderIdentity": ctx.identity.cluster_id, "renewTime": now},
    });
    let api = Api::<Lease>::namespaced(ctx.client.clone(), ns);
    let params = PatchParams::apply(names::FIELD_MANAGER).force();
    let patch = Patch::Apply(&object);
    crate::requests::within(
        WRITE_TIMEOUT,
        api.patch(names::FENCE_NONCE_LEASE, &params, &patch),
    )
    .await
    .map(|_| ())
}

/// Lists the consumer's fenced pods in its Tenant's status.
async fn list_fenced(client: &Client, tenant: &Tenant, standing: &[String]) -> kube::Result<()> {
    let patch = json!({"status": {"fence": {"fencedPods": standing}}});
    Api::<Tenant>::namespaced(client.clone(), &tenant.namespace().unwrap_or_default())
        .patch_status(
            &tenant.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map(|_| ())
}

/// An Event on the Tenant for the pods fenced now.
async fn record_fencing(client: &Client, tenant: &Tenant, fenced: &[String]) {
    crate::events::record(
        client,
        &tenant.namespace().unwrap_or_default(),
        json!({"apiVersion": "tandem.dev/v1alpha1", "kind": "Tenant",
               "namespace": tenant.namespace(), "name": tenant.name_any(), "uid": tenant.uid()}),
        "PodsFenced",
        &format!(
            "consumer {} renewed no fence lease: pod(s) {} stopped",
            tenant.spec.cluster_id,
            fenced.join(", ")
        ),
        true,
    )
    .await;
}

/// The Tenant's `Fenced` condition: True with the pods fenced since the consumer last renewed
/// its lease; False once it renews again (after a fencing: absent before any).
async fn report(client: &Client, tenant: &Tenant, fenced: &[String], standing: usize) {
    let was_fenced = tenant
        .status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, CONDITION))
        .is_some_and(|c| c.status == "True");
    if let Some(c) = plan::condition(&tenant.spec.cluster_id, fenced, was_fenced, standing) {
        set_condition(client, tenant, c.status, c.reason, &c.message).await;
    }
}

async fn set_condition(
    client: &Client,
    tenant: &Tenant,
    status: ConditionStatus,
    reason: &str,
    message: &str,
) {
    let mut current = tenant.status.clone().unwrap_or_default().conditions;
    if !conditions::set_condition(
        &mut current,
        CONDITION,
        status,
        reason,
        message,
        tenant.metadata.generation,
    ) {
        return;
    }
    // Guarded by the resource version: the Tenant reconciler writes the other conditions.
    let patch = json!({"metadata": {"resourceVersion": tenant.resource_version()},
                       "status": {"conditions": current}});
    if let Err(e) =
        Api::<Tenant>::namespaced(client.clone(), &tenant.namespace().unwrap_or_default())
            .patch_status(
                &tenant.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        && !client::is_conflict(&e)
    {
        tracing::warn!(tenant = %tenant.name_any(), "writing the Fenced condition: {e}");
    }
}
