//! Multi-cluster services (the MCS API, KEP-1645) across every peering, whichever side is
//! the consumer.
//!
//! **Export.** Each `ServiceExport` here becomes an [`ExportedService`] record — the Service's
//! type, ports, session affinity and endpoints as this cluster addresses them — handed to every
//! peer through the peering's own channel, the provider's tenant namespace: a consumer writes
//! its records there with its peer identity, a provider writes its own into the same namespace
//! on its side, and each side reads the other's. No identity gains a right outside its tenant
//! namespace; the records are data, never instructions.
//!
//! **Import.** Each cluster decides alone what it imports: a peer's record becomes part of a
//! `ServiceImport` only in a namespace that exists here and where the relation applies — the
//! peer's own twin of that namespace, or a namespace this cluster's admin opted in for that
//! peer (`serviceImportNamespaces` of its Peering / Tenant, or the namespace's annotation
//! `mcs.tandem.dev/import-from`); it joins this cluster's own export of the same Service only
//! in an opted-in namespace ([`tandem_core::mcs::import_scope`]). What is not imported is said
//! once as an Event in the peer's tenant namespace. The peer's endpoint addresses are moved
//! into this cluster's view of the peer's pod CIDR — an address outside that CIDR is dropped, so an export can never aim
//! traffic at this cluster's own addresses or at a third cluster. The exports of one Service by
//! several clusters (this one included) merge as the KEP says ([`tandem_core::mcs::merge`]);
//! their conflicts show on the ServiceImport too (the `Conflict` condition of ServiceExports),
//! since two exporters that do not peer with each other never see each other's export.
//! A ClusterSetIP import is backed by a selector-less Service `derived-<hash>` whose ClusterIP
//! is the import's IP, and EndpointSlices per source cluster that any kube-proxy follows.
//! A peer whose virtual node is not Ready (or whose tunnel is down) has its endpoints marked
//! not ready.
//!
//! Everything is level-based: one loop recomputes the whole desired state from watched caches
//! on any change and writes only differences, so it is idempotent and converges after any
//! restart. Each pass observes (`pass`, `peers`: the caches as values), decides (`plan`, with
//! `sources` for the peers' part: pure, the clock passed in) and acts on the plan's steps
//! (`exports`, `imports`).

pub mod dns;
mod exports;
#[cfg(test)]
mod fixtures;
mod imports;
mod observed;
mod pass;
mod peers;
mod plan;
mod records;
mod sanitize;
mod sources;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use ipnet::IpNet;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::Store;
use serde_json::json;
use tandem_api::mcs::{ClusterProperty, ExportedService};
use tandem_api::{Tenant, client, names};
use tokio::sync::Notify;

use crate::consumer::link::Links;
use crate::context::Ctx;
pub use pass::Caches;
use pass::{Pass, RemoteRecords, SyncError, cache};
use plan::{NotOurs, Step, Target};
pub use records::derived_service_name;
use sources::{Refusal, RefusalEvent};
pub use tandem_api::names::{
    MCS_SLICE_MANAGER as SLICE_MANAGER, SLICE_MANAGED_BY_LABEL, SOURCE_SLICES_SELECTOR,
};

/// Recomputes this often even without a change (settings, failed writes).
const RESYNC: Duration = Duration::from_secs(10);
/// How often the tunnels to peers that only consume from us are checked, and how long their
/// gateway's status may take to answer.
const TUNNEL_CHECK: Duration = Duration::from_secs(2);
const TUNNEL_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// At most this many Events about peers' exports not imported are written in one pass (the
/// rest in the next ones): a peer cannot make this cluster write without bound.
const MAX_REFUSAL_EVENTS_PER_PASS: usize = 20;

/// Whether the tunnel to each peer that consumes from us is connected: such a peer has no
/// virtual node here, and our gateway's probes through the tunnel are what says it is there.
type TunnelHealth = Arc<std::sync::Mutex<BTreeMap<String, bool>>>;

/// Whether the tunnel to each consumer of ours is up now; where its state cannot be read
/// (the API failed), what `before` said. Without a network fabric there is nothing to check
/// (each counts as up).
async fn tunnel_states(
    ctx: &Ctx,
    tenants: &Store<Tenant>,
    before: &BTreeMap<String, bool>,
) -> BTreeMap<String, bool> {
    let mut now = BTreeMap::new();
    for tenant in tenants.state() {
        let id = &tenant.spec.cluster_id;
        let up = match crate::fabric::gateway::status_address(ctx, id).await {
            Ok(None) => Some(true),
            Ok(Some(addr)) => Some(
                crate::consumer::virtual_node::gateway_state(&addr, TUNNEL_PROBE_TIMEOUT)
                    .await
                    .is_ok_and(|r| r.state == "connected"),
            ),
            Err(e) => {
                tracing::debug!(
                    "multi-cluster services: tunnel to {id}: {}",
                    crate::error::chain(&e)
                );
                before.get(id).copied()
            }
        };
        if let Some(up) = up {
            now.insert(id.clone(), up);
        }
    }
    now
}

/// Checks the tunnels to the consumers of ours every [`TUNNEL_CHECK`], waking the loop when
/// one changes.
async fn check_tunnels(
    ctx: Ctx,
    tenants: Store<Tenant>,
    health: TunnelHealth,
    notify: Arc<Notify>,
) {
    loop {
        tokio::time::sleep(TUNNEL_CHECK).await;
        let before = health
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let now = tunnel_states(&ctx, &tenants, &before).await;
        if now != before {
            *health
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = now;
            notify.notify_one();
        }
    }
}

/// Runs multi-cluster services until the controller stops; with `dns`, also serves
/// `clusterset.local` there.
pub async fn run(ctx: Ctx, links: Links) {
    let notify = Arc::new(Notify::new());
    let (caches, _tasks) = Caches::start(&ctx.client, &notify);
    struct AbortAll(Vec<tokio::task::JoinHandle<()>>);
    impl Drop for AbortAll {
        fn drop(&mut self) {
            self.0.iter().for_each(|t| t.abort());
        }
    }
    let mut tasks = AbortAll(_tasks);
    if let Some(addr) = ctx.options.dns_addr {
        let zone = dns::Zone::new(caches.imports.clone(), caches.slices.clone());
        tasks.0.push(tokio::spawn(async move {
            if let Err(e) = dns::listen_and_serve(zone, addr).await {
                tracing::error!("clusterset.local DNS on {addr}: {e}");
            }
        }));
    }
    caches.ready().await;
    // The tunnels' state before the first pass: endpoints a restart found not ready are not
    // made ready for the moment before the first check.
    let tunnels: TunnelHealth = Arc::new(std::sync::Mutex::new(
        tunnel_states(&ctx, &caches.tenants, &BTreeMap::new()).await,
    ));
    tasks.0.push(tokio::spawn(check_tunnels(
        ctx.clone(),
        caches.tenants.clone(),
        tunnels.clone(),
        notify.clone(),
    )));
    {
        let notify = notify.clone();
        let mut changes = Box::pin(links.changes());
        tasks.0.push(tokio::spawn(async move {
            while changes.next().await.is_some() {
                notify.notify_one();
            }
        }));
    }
    publish_cluster_id(&ctx).await;
    let mut remotes: BTreeMap<String, RemoteRecords> = BTreeMap::new();
    let mut reported: BTreeSet<RefusalEvent> = BTreeSet::new();
    let mut pod_cidr: Option<IpNet> = None;
    let mut last_settings = None::<tokio::time::Instant>;
    loop {
        if last_settings.is_none_or(|t| t.elapsed() >= RESYNC) {
            match ctx.settings().await {
                Ok(s) => pod_cidr = s.pod_cidr.parse().ok(),
                Err(e) => tracing::warn!("multi-cluster services: reading settings: {e}"),
            }
            last_settings = Some(tokio::time::Instant::now());
        }
        let linked = links.snapshot();
        remotes.retain(|id, r| {
            linked
                .get(id)
                .is_some_and(|l| l.identity_version == r.identity_version)
        });
        for (id, link) in &linked {
            if !remotes.contains_key(id) {
                let mut tasks = Vec::new();
                let store = cache(
                    Api::<ExportedService>::namespaced(
                        link.client.clone(),
                        &link.remote_tenant_namespace,
                    ),
                    notify.clone(),
                    &mut tasks,
                );
                remotes.insert(
                    id.clone(),
                    RemoteRecords {
                        identity_version: link.identity_version.clone(),
                        store,
                        task: tasks.remove(0),
                    },
                );
            }
        }
        let mut failed = false;
        let tunnel_health = tunnels
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let sync = Pass {
            ctx: &ctx,
            caches: &caches,
            links: &linked,
            remotes: &remotes,
            pod_cidr,
            tunnels: &tunnel_health,
        };
        let (result, refused) = sync.run().await;
        if let Err(e) = result {
            tracing::warn!("multi-cluster services: {e}");
            failed = true;
        }
        report_refusals(&ctx, &mut reported, refused).await;
        let wait = if failed {
            Duration::from_secs(1)
        } else {
            RESYNC
        };
        let _ = tokio::time::timeout(wait, notify.notified()).await;
        // Let the other events of the same write (already queued) arrive before recomputing;
        // any wait longer than that only delays every import by as much.
        tokio::task::yield_now().await;
    }
}

/// Publishes this cluster's ID as the KEP-2149 ClusterProperty when absent (an
/// administrator's own value is left alone).
async fn publish_cluster_id(ctx: &Ctx) {
    let api: Api<ClusterProperty> = Api::all(ctx.client.clone());
    let property: ClusterProperty = match serde_json::from_value(json!({
        "apiVersion": "about.k8s.io/v1alpha1", "kind": "ClusterProperty",
        "metadata": {"name": tandem_api::mcs::CLUSTER_ID_PROPERTY,
                     "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY}},
        "spec": {"value": ctx.identity.cluster_id},
    })) {
        Ok(p) => p,
        Err(e) => return tracing::error!("ClusterProperty: {e}"),
    };
    match api.create(&PostParams::default(), &property).await {
        Ok(_) => {}
        Err(e) if client::is_conflict(&e) => {}
        Err(e) => tracing::warn!(
            "creating ClusterProperty {}: {e}",
            tandem_api::mcs::CLUSTER_ID_PROPERTY
        ),
    }
}

/// Logs the refusals that are not Events, and writes an Event for each other one not
/// reported yet (at most [`MAX_REFUSAL_EVENTS_PER_PASS`]); `reported` becomes what is
/// reported and still holds, so a refusal that ends and comes back is reported again.
async fn report_refusals(ctx: &Ctx, reported: &mut BTreeSet<RefusalEvent>, now: Vec<Refusal>) {
    for r in &now {
        match r.log_level() {
            Some(tracing::Level::WARN) => tracing::warn!("multi-cluster services: {r}"),
            Some(_) => tracing::debug!("multi-cluster services: {r}"),
            None => {}
        }
    }
    let now: BTreeSet<RefusalEvent> = now.iter().filter_map(Refusal::event).collect();
    reported.retain(|r| now.contains(r));
    let fresh: Vec<&RefusalEvent> = now.iter().filter(|r| !reported.contains(*r)).collect();
    for r in fresh.into_iter().take(MAX_REFUSAL_EVENTS_PER_PASS) {
        let tenant_ns = names::tenant_namespace(&r.peer);
        tracing::info!("multi-cluster services: {}", r.message);
        crate::events::record(
            &ctx.client,
            &tenant_ns,
            json!({"apiVersion": "tandem.dev/v1alpha1", "kind": "ExportedService",
                   "namespace": tenant_ns,
                   "name": r.record}),
            r.reason,
            &r.message,
            r.warning,
        )
        .await;
        reported.insert(r.clone());
    }
}

impl Pass<'_> {
    /// Observes, plans and acts once, one object's steps after another's: the first write
    /// that failed (the others are still made), and the peers' exports not imported.
    async fn run(&self) -> (Result<(), SyncError>, Vec<Refusal>) {
        let plan = plan::plan(&self.observe(), k8s_openapi::jiff::Timestamp::now());
        for ((ns, name), why) in &plan.not_ours {
            match why {
                NotOurs::Import => tracing::debug!("ServiceImport {ns}/{name}: {why}"),
                NotOurs::DerivedService(_) => tracing::warn!("ServiceImport {ns}/{name}: {why}"),
            }
        }
        let mut first_error: Option<SyncError> = None;
        for steps in plan.steps.chunk_by(|a, b| a.target() == b.target()) {
            let written = match steps[0].target() {
                Target::Records(place) => self.write_records(&place, steps).await,
                Target::Import(key) => self.write_import(&key, steps).await,
                Target::Removal(key) => match &steps[0] {
                    Step::RemoveImport { service, .. } => {
                        self.remove_import(&key, service.as_deref()).await
                    }
                    _ => Ok(()),
                },
                Target::Export(key) => match &steps[0] {
                    Step::SetExportStatus { conditions, .. } => {
                        self.set_export_status(&key, conditions).await
                    }
                    _ => Ok(()),
                },
            };
            if let Err(e) = written {
                tracing::debug!("multi-cluster services: {e}");
                first_error.get_or_insert(e);
            }
        }
        (first_error.map_or(Ok(()), Err), plan.refused)
    }
}

#[cfg(test)]
mod tests {
    use tandem_core::mcs::{ExportProperties, ImportType};

    use super::sources::export_age;
    use super::*;

    fn stored(cluster: &str, created: i64) -> ExportProperties {
        ExportProperties {
            cluster: cluster.into(),
            created,
            import_type: ImportType::ClusterSetIP,
            ports: vec![],
            session_affinity: "None".into(),
            session_affinity_timeout: None,
        }
    }

    #[test]
    fn a_peer_cannot_back_date_or_future_date_its_export() {
        let now = 1_000;
        // First sight: taken as claimed, but never in the future.
        assert_eq!(export_age(500, now, "milan", None), 500);
        assert_eq!(export_age(9_999, now, "milan", None), now);
        let recorded = [stored("milan", 500), stored("rome", 700)];
        // Recorded: not moved earlier, nor re-dated to each pass's "now" from the future;
        // a later claim (a new export) is taken.
        assert_eq!(export_age(100, now, "milan", Some(&recorded)), 500);
        assert_eq!(export_age(9_999, now, "milan", Some(&recorded)), 500);
        assert_eq!(export_age(800, now, "milan", Some(&recorded)), 800);
        // A newcomer is taken at its word (but not from the future).
        assert_eq!(export_age(1, now, "turin", Some(&recorded)), 1);
        assert_eq!(export_age(9_999, now, "turin", Some(&recorded)), now);
    }

    #[test]
    fn derived_names_are_stable_valid_and_distinct() {
        let a = derived_service_name("demo", "hello");
        assert_eq!(a, derived_service_name("demo", "hello"));
        assert_ne!(a, derived_service_name("demo", "hello2"));
        assert_ne!(a, derived_service_name("demo-hello", ""));
        assert!(
            tandem_apimachinery::validation::is_dns1123_label(&a)
                && a.starts_with(char::is_alphabetic),
            "{a}"
        );
    }
}
