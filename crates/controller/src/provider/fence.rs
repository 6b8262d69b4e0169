//! Provider side of fencing (NamespaceOffloading `partitionPolicy: Fence`): for each consumer,
//! a nonce in its Tenant's status that the consumer hands back through its fence Lease, and the
//! fencing of its pods once it has not done so for their `fenceAfter`.
//!
//! The deadline is kept on this process's monotonic clock (see `tandem_core::fence`): a pod
//! labelled `tandem.dev/fence-after: 10s` is fenced 10 s after the issue of the newest nonce
//! the consumer handed back. Fencing marks its ShadowPod `Fenced` first (so neither the shadow
//! pod controller nor a later pass starts it again), then deletes the real pod with grace 0,
//! and says so in an Event and in the Tenant's `Fenced` condition and `status.fence`.
//!
//! The newest accepted issue time is also written, as wall-clock time, into the Tenant's
//! status: a restarted controller counts from there, so a hand-over that takes longer than a
//! pod's `fenceAfter` fences it at once.

use std::collections::{BTreeMap, BTreeSet};
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

/// How often handed-back nonces and deadlines are checked: a deadline is acted on at most this
/// late (the consumer's margin covers it).
const TICK: Duration = Duration::from_millis(250);
/// How often a new nonce is issued when none comes back: a consumer that reads one (a
/// restarted controller) renews from an issue time at most this old.
const REISSUE: Duration = Duration::from_secs(2);
/// Condition type on the Tenant: True while pods of the consumer stand fenced.
pub const CONDITION: &str = "Fenced";

/// One consumer's lease, as this process knows it.
struct Consumer {
    lease: ProviderLease,
    /// The newest nonce is not in the Tenant's status yet.
    unpublished: bool,
    /// The nonce last seen in the consumer's fence Lease (each is accepted once).
    returned: Option<String>,
    /// The pods fenced since the lease was last renewed (for the condition).
    fenced: Vec<String>,
    /// UIDs of the shadow pods this process marked Fenced (the store may not show it yet).
    marked: BTreeSet<String>,
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

/// The lease of a consumer first seen now: counted from the base its Tenant's status holds
/// (written by an earlier process), else from now, the first nonce's issue being later still.
fn first_lease(tenant: &Tenant, now: Instant) -> ProviderLease {
    let persisted = tenant
        .status
        .as_ref()
        .and_then(|s| s.fence.as_ref())
        .and_then(|f| f.accepted_at.parse::<k8s_openapi::jiff::Timestamp>().ok());
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

/// Runs the provider's fence until the task is aborted.
pub async fn run(ctx: Ctx) {
    let client = ctx.client.clone();
    let (tenants, t) = store(Api::<Tenant>::all(client.clone()), Default::default());
    let (leases, l) = store(
        Api::<Lease>::all(client.clone()),
        watcher::Config::default().fields(&format!("metadata.name={}", names::FENCE_LEASE)),
    );
    let (shadows, s) = store(
        Api::<ShadowPod>::all(client.clone()),
        watcher::Config::default().labels(names::FENCE_AFTER),
    );
    let (namespaces, n) = store(
        Api::<Namespace>::all(client.clone()),
        watcher::Config::default().labels(names::ORIGIN_CLUSTER_LABEL),
    );
    let _watches = AbortOnDrop(vec![t, l, s, n]);
    let ready = futures::future::try_join4(
        tenants.wait_until_ready(),
        leases.wait_until_ready(),
        shadows.wait_until_ready(),
        namespaces.wait_until_ready(),
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
        for tenant in tenants.state() {
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
                lease: first_lease(&tenant, now),
                unpublished: true,
                returned: None,
                fenced: Vec::new(),
                marked: BTreeSet::new(),
            });
            let returned = leases
                .get(&ObjectRef::new(names::FENCE_LEASE).within(&ns))
                .and_then(|l| l.annotations().get(names::FENCE_NONCE_ANNOTATION).cloned());
            let mut renewed = false;
            if let Some(returned) = returned
                && consumer.returned.as_deref() != Some(returned.as_str())
            {
                renewed = consumer.lease.accept(&returned);
                consumer.returned = Some(returned);
            }
            if renewed {
                consumer.fenced.clear();
            }
            // A new nonce after each renewal, and every few seconds without one.
            if renewed
                || consumer
                    .lease
                    .issued()
                    .is_none_or(|t| now.saturating_duration_since(t) >= REISSUE)
            {
                consumer.lease.reissue(new_nonce(), Instant::now());
                consumer.unpublished = true;
            }
            let fenced = fence_due(&client, &shadows, &namespaces, &id, consumer).await;
            let standing = fenced_pods(&shadows, &namespaces, &id);
            if consumer.unpublished || status_lists(&tenant) != standing {
                match publish(&client, &tenant, consumer, &standing).await {
                    Ok(()) => consumer.unpublished = false,
                    Err(e) => {
                        tracing::warn!(tenant = %format!("{ns}/{id}"), "publishing the fence nonce: {e}")
                    }
                }
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

/// Aborts the watches when the fence stops.
struct AbortOnDrop(Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// The consumer a twin namespace belongs to (its `origin-cluster-id` label, set by this
/// cluster when it created the namespace).
fn owner_of(namespaces: &Store<Namespace>, ns: &str) -> Option<String> {
    namespaces
        .get(&ObjectRef::new(ns))
        .filter(|n| !n.labels().contains_key(names::TENANT_NAMESPACE_LABEL))
        .and_then(|n| n.labels().get(names::ORIGIN_CLUSTER_LABEL).cloned())
}

fn phase_of(sp: &ShadowPod) -> Option<&str> {
    sp.status.as_ref().and_then(|s| s.phase.as_deref())
}

/// `namespace/name` of the consumer's shadow pods standing fenced.
fn fenced_pods(
    shadows: &Store<ShadowPod>,
    namespaces: &Store<Namespace>,
    consumer: &str,
) -> Vec<String> {
    let mut pods: Vec<String> = shadows
        .state()
        .iter()
        .filter(|sp| phase_of(sp) == Some(PHASE_FENCED))
        .filter(|sp| {
            owner_of(namespaces, &sp.namespace().unwrap_or_default()).as_deref() == Some(consumer)
        })
        .map(|sp| format!("{}/{}", sp.namespace().unwrap_or_default(), sp.name_any()))
        .collect();
    pods.sort();
    pods
}

fn status_lists(tenant: &Tenant) -> Vec<String> {
    tenant
        .status
        .as_ref()
        .and_then(|s| s.fence.as_ref())
        .map(|f| f.fenced_pods.clone())
        .unwrap_or_default()
}

/// Fences the consumer's shadow pods whose deadline has passed; returns those fenced now.
async fn fence_due(
    client: &Client,
    shadows: &Store<ShadowPod>,
    namespaces: &Store<Namespace>,
    id: &str,
    consumer: &mut Consumer,
) -> Vec<String> {
    let mut fenced = Vec::new();
    let shadows = shadows.state();
    // Marks the store shows (or whose shadow pods are gone) need no memory.
    consumer.marked.retain(|uid| {
        shadows.iter().any(|sp| {
            sp.uid().as_deref() == Some(uid.as_str()) && phase_of(sp) != Some(PHASE_FENCED)
        })
    });
    for sp in shadows {
        let ns = sp.namespace().unwrap_or_default();
        let uid = sp.uid().unwrap_or_default();
        if phase_of(&sp) == Some(PHASE_FENCED)
            || consumer.marked.contains(&uid)
            || sp.metadata.deletion_timestamp.is_some()
            || owner_of(namespaces, &ns).as_deref() != Some(id)
        {
            continue;
        }
        let Some(after) = sp
            .labels()
            .get(names::FENCE_AFTER)
            .and_then(|d| fence::parse(d))
        else {
            continue;
        };
        if !consumer.lease.due(after, Instant::now()) {
            continue;
        }
        let name = sp.name_any();
        let message = format!(
            "fenced: consumer {id} renewed no fence lease for {}s (its fenceAfter); the pod is \
             stopped and will not run here again",
            after.as_secs_f64()
        );
        // The mark first: once the real pod is gone nothing may start it again.
        let api: Api<ShadowPod> = Api::namespaced(client.clone(), &ns);
        let patch = json!({"status": {"phase": PHASE_FENCED, "message": message}});
        if let Err(e) = api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            if !client::is_not_found(&e) {
                tracing::warn!(shadowpod = %format!("{ns}/{name}"), "fencing: marking the shadow pod: {e}");
            }
            continue;
        }
        consumer.marked.insert(uid);
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let grace0 = DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        };
        if let Err(e) = pods.delete(&name, &grace0).await
            && !client::is_not_found(&e)
        {
            // The shadow pod controller deletes a fenced shadow pod's real pod too.
            tracing::warn!(pod = %format!("{ns}/{name}"), "fencing: deleting the real pod: {e}");
        }
        tracing::warn!(pod = %format!("{ns}/{name}"), consumer = %id, "fenced");
        fenced.push(format!("{ns}/{name}"));
    }
    fenced
}

/// Writes the current nonce (and the base it counts from) and the standing fenced pods into
/// the Tenant's status.
async fn publish(
    client: &Client,
    tenant: &Tenant,
    consumer: &Consumer,
    standing: &[String],
) -> Result<(), kube::Error> {
    let accepted_at = consumer
        .lease
        .base()
        .map_or_else(|| "1970-01-01T00:00:00.000Z".to_string(), wall_of);
    let patch = json!({"status": {"fence": {
        "nonce": consumer.lease.nonce(),
        "acceptedAt": accepted_at,
        "fencedPods": standing,
    }}});
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
    if !fenced.is_empty() {
        let message = format!(
            "consumer {} renewed no fence lease: {} pod(s) stopped ({})",
            tenant.spec.cluster_id,
            fenced.len(),
            fenced.join(", ")
        );
        set_condition(
            client,
            tenant,
            ConditionStatus::True,
            "LeaseExpired",
            &message,
        )
        .await;
        return;
    }
    let was_fenced = tenant
        .status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, CONDITION))
        .is_some_and(|c| c.status == "True");
    if was_fenced {
        let message = format!(
            "consumer {} renews its fence lease; {standing} pod(s) fenced earlier stay stopped \
             until it replaces them",
            tenant.spec.cluster_id
        );
        set_condition(
            client,
            tenant,
            ConditionStatus::False,
            "LeaseRenewed",
            &message,
        )
        .await;
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
