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
//! restart.

pub mod dns;
mod sanitize;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use kube::Resource;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tandem_api::mcs::{
    ClusterProperty, ClusterStatus, ExportedEndpoint, ExportedService, ExportedServiceSpec,
    ExportedSlice, SERVICE_NAME_LABEL, SOURCE_CLUSTER_LABEL, ServiceExport, ServiceImport,
    ServiceImportSpec, ServicePort, export_condition, exported_service_name,
};
use tandem_api::{ConditionStatus, NetworkParameters, Peering, Tenant, client, conditions, names};
use tandem_core::mcs::{
    ExportProperties, ExportedPort, IMPORT_FROM_ANNOTATION, ImportNamespace, ImportScope,
    ImportType, Merged, NotImported,
};
use tokio::sync::Notify;

use crate::consumer::link::{Links, ProviderLink};
use crate::context::Ctx;
use crate::rbac::CONSUMER_NETWORK_PARAMETERS;

pub use tandem_api::names::{
    MCS_SLICE_MANAGER as SLICE_MANAGER, SLICE_MANAGED_BY_LABEL, SOURCE_SLICES_SELECTOR,
};
const KUBE_SLICE_MANAGER: &str = "endpointslice-controller.k8s.io";
/// Recomputes this often even without a change (settings, failed writes).
const RESYNC: Duration = Duration::from_secs(10);
/// At most this many of one peer's exports are imported (by name): a peer cannot make this
/// cluster hold an unbounded number of objects.
const MAX_RECORDS_PER_PEER: usize = 1000;
/// At most this many of one peer's endpoints, over all its exports.
const MAX_ENDPOINTS_PER_PEER: usize = 10_000;
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
                tracing::debug!("multi-cluster services: tunnel to {id}: {e}");
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

/// On a ServiceImport of ours: the properties of each export it was last written from (the
/// merge's inputs), so that an export whose cluster cannot be read for a while keeps its
/// place — and its age — in the merge.
const SOURCES_ANNOTATION: &str = "mcs.tandem.dev/sources";

/// The name of the Service backing the import of `namespace/name`: `derived-` and a hash,
/// as the MCS reference implementation names it (a user's Service could only collide by
/// taking that exact name; Tandem never touches a Service it did not make).
pub fn derived_service_name(namespace: &str, name: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("{namespace}/{name}").as_bytes());
    let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    format!("derived-{hex}")
}

/// The caches the loop reads; the DNS server reads the same.
#[derive(Clone)]
pub struct Caches {
    pub exports: Store<ServiceExport>,
    pub services: Store<Service>,
    pub slices: Store<EndpointSlice>,
    pub records: Store<ExportedService>,
    pub imports: Store<ServiceImport>,
    pub namespaces: Store<Namespace>,
    pub peerings: Store<Peering>,
    pub tenants: Store<Tenant>,
    pub parameters: Store<NetworkParameters>,
    pub nodes: Store<Node>,
}

/// Starts a reflector for `api`, waking `notify` on each event.
fn cache<K>(
    api: Api<K>,
    notify: Arc<Notify>,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()))
        .default_backoff()
        .for_each(move |event| {
            if let Err(e) = event {
                tracing::debug!("multi-cluster services: watching {}: {e}", K::plural(&()));
            }
            notify.notify_one();
            async {}
        });
    tasks.push(tokio::spawn(stream));
    reader
}

impl Caches {
    fn start(
        client: &kube::Client,
        notify: &Arc<Notify>,
    ) -> (Caches, Vec<tokio::task::JoinHandle<()>>) {
        let mut tasks = Vec::new();
        let n = || notify.clone();
        let caches = Caches {
            exports: cache(Api::all(client.clone()), n(), &mut tasks),
            services: cache(Api::all(client.clone()), n(), &mut tasks),
            slices: cache(Api::all(client.clone()), n(), &mut tasks),
            records: cache(Api::all(client.clone()), n(), &mut tasks),
            imports: cache(Api::all(client.clone()), n(), &mut tasks),
            namespaces: cache(Api::all(client.clone()), n(), &mut tasks),
            peerings: cache(Api::all(client.clone()), n(), &mut tasks),
            tenants: cache(Api::all(client.clone()), n(), &mut tasks),
            parameters: cache(Api::all(client.clone()), n(), &mut tasks),
            nodes: cache(Api::all(client.clone()), n(), &mut tasks),
        };
        (caches, tasks)
    }

    async fn ready(&self) {
        let _ = tokio::join!(
            self.exports.wait_until_ready(),
            self.services.wait_until_ready(),
            self.slices.wait_until_ready(),
            self.records.wait_until_ready(),
            self.imports.wait_until_ready(),
            self.namespaces.wait_until_ready(),
            self.peerings.wait_until_ready(),
            self.tenants.wait_until_ready(),
            self.parameters.wait_until_ready(),
            self.nodes.wait_until_ready(),
        );
    }
}

/// The records a provider publishes for one consumer, read with the consumer's peer identity.
struct RemoteRecords {
    identity_version: String,
    store: Store<ExportedService>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RemoteRecords {
    fn drop(&mut self) {
        self.task.abort();
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
    let mut reported: BTreeSet<Refusal> = BTreeSet::new();
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
            refused: Default::default(),
        };
        if let Err(e) = sync.run().await {
            tracing::warn!("multi-cluster services: {e}");
            failed = true;
        }
        let refused = sync
            .refused
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
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

/// What went wrong in one pass (the pass goes on with the other objects; this is the first).
#[derive(Debug, thiserror::Error)]
#[error("{what}: {}", short(source))]
pub struct SyncError {
    what: String,
    #[source]
    source: kube::Error,
}

/// The API server's message alone (kube's own text of an API error repeats it in Debug form).
fn short(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => format!("{} ({})", status.message, status.code),
        other => other.to_string(),
    }
}

/// Whether an export is valid, else the `Valid` condition's reason and message.
type Verdict = Result<(), (&'static str, String)>;
/// This cluster's exports as records, by (namespace, name).
type Records = BTreeMap<(String, String), ExportedServiceSpec>;

/// One cluster that exports a Service, as this cluster sees its export.
#[derive(Clone, Debug)]
struct Source {
    cluster: String,
    props: ExportProperties,
    /// Its endpoints, as this cluster addresses them.
    slices: Vec<ExportedSlice>,
    /// Whether its endpoints may be ready (its virtual node / tunnel is up).
    healthy: bool,
}

/// One peer, as far as services go.
#[derive(Debug)]
struct Peer {
    id: String,
    /// Our tenant namespace for it, when it consumes from us.
    tenant_namespace: Option<String>,
    /// Its pod CIDR, and our name for it.
    pod_cidr: Option<(IpNet, IpNet)>,
    /// The namespaces this cluster's admin opted in for its exports (each side's list).
    allowed: Vec<Option<Vec<String>>>,
    healthy: bool,
    /// Whether its records can be read now: through our tenant namespace for it, or through
    /// its tenant namespace for us once that is watched. Until then (a restart, a link not
    /// yet up or renewed) what it exported is not known, and is not taken as nothing.
    readable: bool,
}

struct Pass<'a> {
    ctx: &'a Ctx,
    caches: &'a Caches,
    links: &'a BTreeMap<String, ProviderLink>,
    remotes: &'a BTreeMap<String, RemoteRecords>,
    pod_cidr: Option<IpNet>,
    /// Whether the tunnel to each consumer of ours is up (absent: not checked yet).
    tunnels: &'a BTreeMap<String, bool>,
    /// The peers' exports this pass did not import, and why.
    refused: std::sync::Mutex<Vec<Refusal>>,
}

/// A peer's export this cluster does not import, and why: reported as an Event (once while
/// it lasts) in the peer's tenant namespace, about the peer's record of the export.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Refusal {
    peer: String,
    /// The name of the peer's record (an ExportedService in the tenant namespaces).
    record: String,
    reason: &'static str,
    warning: bool,
    message: String,
}

/// Writes an Event for each refusal not reported yet (at most
/// [`MAX_REFUSAL_EVENTS_PER_PASS`]); `reported` becomes what is reported and still holds, so
/// a refusal that ends and comes back is reported again.
async fn report_refusals(ctx: &Ctx, reported: &mut BTreeSet<Refusal>, now: Vec<Refusal>) {
    let now: BTreeSet<Refusal> = now.into_iter().collect();
    reported.retain(|r| now.contains(r));
    let fresh: Vec<&Refusal> = now.iter().filter(|r| !reported.contains(*r)).collect();
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

fn label<'a, K: Resource>(obj: &'a K, key: &str) -> Option<&'a str> {
    obj.meta().labels.as_ref()?.get(key).map(String::as_str)
}

fn is_ours<K: Resource>(obj: &K) -> bool {
    label(obj, names::MANAGED_BY_LABEL) == Some(names::MANAGED_BY)
}

fn key_of<K: Resource>(obj: &K) -> (String, String) {
    (
        obj.meta().namespace.clone().unwrap_or_default(),
        obj.meta().name.clone().unwrap_or_default(),
    )
}

/// Conditions equal but for their transition times.
fn same_conditions(a: &[Condition], b: &[Condition]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            (&x.type_, &x.status, &x.reason, &x.message)
                == (&y.type_, &y.status, &y.reason, &y.message)
        })
}

impl Pass<'_> {
    async fn run(&self) -> Result<(), SyncError> {
        let mut first_error: Option<SyncError> = None;
        let mut keep = |r: Result<(), SyncError>| {
            if let Err(e) = r {
                tracing::debug!("multi-cluster services: {e}");
                first_error.get_or_insert(e);
            }
        };
        let (own, statuses) = self.own_exports();
        let peers = self.peers();
        keep(self.publish(&own, &peers).await);
        let mut sources: BTreeMap<(String, String), Vec<Source>> = BTreeMap::new();
        for (key, spec) in &own {
            sources.entry(key.clone()).or_default().push(Source {
                cluster: self.ctx.identity.cluster_id.clone(),
                props: properties(spec),
                slices: spec.endpoint_slices.clone(),
                healthy: true,
            });
        }
        for peer in &peers {
            let from_peer = match self.peer_sources(peer, &own) {
                Some(fresh) => fresh,
                None => self.carried_sources(peer, &own),
            };
            for (key, source) in from_peer {
                sources.entry(key).or_default().push(source);
            }
        }
        let mut merged_of: BTreeMap<(String, String), Merged> = BTreeMap::new();
        for (key, srcs) in &sources {
            let props: Vec<ExportProperties> = srcs.iter().map(|s| s.props.clone()).collect();
            if let Some(m) = tandem_core::mcs::merge(&props) {
                merged_of.insert(key.clone(), m);
            }
        }
        for (key, srcs) in &sources {
            if let Some(merged) = merged_of.get(key) {
                keep(self.import(key, srcs, merged).await);
            }
        }
        let all_readable = peers.iter().all(|p| p.readable);
        keep(self.remove_stale_imports(&sources, all_readable).await);
        keep(self.export_statuses(statuses, &merged_of).await);
        first_error.map_or(Ok(()), Err)
    }

    /// This cluster's exports as records, and the status each ServiceExport should have
    /// (before conflicts are known).
    fn own_exports(&self) -> (Records, Vec<(ServiceExport, Verdict)>) {
        let me = &self.ctx.identity.cluster_id;
        let mut own = BTreeMap::new();
        let mut statuses = Vec::new();
        let mut slices_of: BTreeMap<(String, String), Vec<Arc<EndpointSlice>>> = BTreeMap::new();
        for slice in self.caches.slices.state() {
            if label(slice.as_ref(), SLICE_MANAGED_BY_LABEL) != Some(KUBE_SLICE_MANAGER) {
                continue;
            }
            if let (Some(ns), Some(svc)) = (
                slice.metadata.namespace.clone(),
                label(slice.as_ref(), "kubernetes.io/service-name"),
            ) {
                slices_of
                    .entry((ns, svc.to_string()))
                    .or_default()
                    .push(slice.clone());
            }
        }
        for export in self.caches.exports.state() {
            if export.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let (ns, name) = key_of(export.as_ref());
            let service = self.caches.services.get(&ObjectRef::new(&name).within(&ns));
            let verdict = match &service {
                None => Err(("NoService", format!("Service {ns}/{name} not found"))),
                Some(s)
                    if s.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("ExternalName") =>
                {
                    Err((
                        "InvalidServiceType",
                        format!(
                            "Service {ns}/{name} is of type ExternalName, which cannot be exported"
                        ),
                    ))
                }
                Some(_) => Ok(()),
            };
            if let (Some(service), Ok(())) = (&service, &verdict) {
                let slices = slices_of
                    .get(&(ns.clone(), name.clone()))
                    .cloned()
                    .unwrap_or_default();
                own.insert(
                    (ns.clone(), name.clone()),
                    record(me, &export, service, &slices, self.pod_cidr),
                );
            }
            statuses.push(((*export).clone(), verdict));
        }
        (own, statuses)
    }

    /// Every peer: from the Peerings (with a link) and the Tenants, not being deleted.
    fn peers(&self) -> Vec<Peer> {
        let mut peers: BTreeMap<String, Peer> = BTreeMap::new();
        for tenant in self.caches.tenants.state() {
            if tenant.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let id = tenant.spec.cluster_id.clone();
            let ns = names::tenant_namespace(&id);
            let params = self
                .caches
                .parameters
                .get(&ObjectRef::new(CONSUMER_NETWORK_PARAMETERS).within(&ns));
            let cidr = params.and_then(|p| {
                let real: IpNet = p.spec.pod_cidr.parse().ok()?;
                let here: IpNet = p
                    .status
                    .as_ref()?
                    .remapped_pod_cidr
                    .as_deref()?
                    .parse()
                    .ok()?;
                Some((real, here))
            });
            let peer = peers.entry(id.clone()).or_insert_with(|| new_peer(&id));
            peer.tenant_namespace = Some(ns);
            peer.readable = true;
            // Its virtual node says more, when it also provides to us (below).
            peer.healthy = self.tunnels.get(&id).copied().unwrap_or(true);
            peer.pod_cidr = peer.pod_cidr.or(cidr);
            peer.allowed
                .push(tenant.spec.service_import_namespaces.clone());
        }
        for peering in self.caches.peerings.state() {
            if peering.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let id = peering.spec.cluster_id.clone();
            let peer = peers.entry(id.clone()).or_insert_with(|| new_peer(&id));
            peer.allowed
                .push(peering.spec.service_import_namespaces.clone());
            let Some(link) = self.links.get(&id) else {
                // Not linked (yet): its endpoints are ready only while its virtual node is.
                let node = peering.status.as_ref().and_then(|s| s.virtual_node.clone());
                peer.healthy =
                    self.virtual_node_ready(&node.unwrap_or_else(|| names::virtual_node_name(&id)));
                continue;
            };
            if let Some(n) = &link.network {
                peer.pod_cidr = Some((n.remote_pod_cidr, n.remote_pod_cidr_here));
            }
            peer.healthy = self.virtual_node_ready(&link.virtual_node);
            let watched = self
                .remotes
                .get(&id)
                .is_some_and(|r| r.store.wait_until_ready().now_or_never().is_some());
            peer.readable |= watched;
        }
        peers.into_values().collect()
    }

    /// Notes that `peer`'s export of `key` is not imported (a missing namespace is no news:
    /// peers export in namespaces this cluster never has).
    fn refuse(&self, peer: &Peer, (namespace, service): &(String, String), why: NotImported) {
        if why == NotImported::NoNamespace {
            return;
        }
        let refusal = Refusal {
            peer: peer.id.clone(),
            record: exported_service_name(&peer.id, namespace, service),
            reason: why.reason(),
            warning: why.is_warning(),
            message: why.message(&peer.id, namespace, service),
        };
        self.refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(refusal);
    }

    /// Whether a virtual node is Ready and its network available.
    fn virtual_node_ready(&self, node: &str) -> bool {
        let Some(node) = self.caches.nodes.get(&ObjectRef::new(node)) else {
            return false;
        };
        let conds = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        let status = |t: &str| {
            conds
                .iter()
                .find(|c| c.type_ == t)
                .map(|c| c.status.clone())
        };
        status("Ready").as_deref() == Some("True")
            && status("NetworkUnavailable").as_deref() != Some("True")
    }

    /// Hands this cluster's records to every peer: into our tenant namespace for a consumer
    /// of ours, into our tenant namespace on a provider of ours (with our identity there).
    async fn publish(
        &self,
        own: &BTreeMap<(String, String), ExportedServiceSpec>,
        peers: &[Peer],
    ) -> Result<(), SyncError> {
        let me = &self.ctx.identity.cluster_id;
        let mut result = Ok(());
        for peer in peers {
            if let Some(ns) = &peer.tenant_namespace {
                let existing: Vec<Arc<ExportedService>> = self
                    .caches
                    .records
                    .state()
                    .into_iter()
                    .filter(|r| r.metadata.namespace.as_deref() == Some(ns))
                    .collect();
                let api = Api::namespaced(self.ctx.client.clone(), ns);
                if let Err(e) = sync_records(&api, me, own, &existing).await {
                    result = Err(e);
                }
            }
            if let (Some(link), Some(remote)) =
                (self.links.get(&peer.id), self.remotes.get(&peer.id))
            {
                let api = Api::namespaced(link.client.clone(), &link.remote_tenant_namespace);
                if let Err(e) = sync_records(&api, me, own, &remote.store.state()).await {
                    result = Err(e);
                }
            }
        }
        result
    }

    /// The peer's exports this cluster imports: from records it wrote in our tenant namespace
    /// for it and in its tenant namespace for us, in namespaces we allow and have, with its
    /// addresses moved into our view of its pod CIDR. None while its records cannot be read.
    fn peer_sources(&self, peer: &Peer, own: &Records) -> Option<Vec<((String, String), Source)>> {
        if !peer.readable {
            return None;
        }
        let Some((real, here)) = peer.pod_cidr else {
            // No network with it: nothing of its can be reached from here.
            return Some(Vec::new());
        };
        // The peer's own copy (read through the link) first: the one it wrote into our
        // tenant namespace may be stale while its link to us is down.
        let mut records: Vec<Arc<ExportedService>> = Vec::new();
        if let Some(remote) = self.remotes.get(&peer.id) {
            records.extend(remote.store.state());
        }
        if let Some(ns) = &peer.tenant_namespace {
            records.extend(
                self.caches
                    .records
                    .state()
                    .into_iter()
                    .filter(|r| r.metadata.namespace.as_deref() == Some(ns)),
            );
        }
        // Only what the peer says of itself, under the name it must have (our own records
        // beside them are no news).
        let me = &self.ctx.identity.cluster_id;
        records.retain(|r| {
            let name = r.metadata.name.clone().unwrap_or_default();
            let its_own = r.spec.cluster_id == peer.id
                && name == exported_service_name(&peer.id, &r.spec.namespace, &r.spec.service);
            if !its_own && r.spec.cluster_id != *me {
                self.refused
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(Refusal {
                        peer: peer.id.clone(),
                        message: format!(
                            "ExportedService {name} of cluster {} is not imported: a peer's record \
                             must carry its own cluster ID ({}) and be named \
                             <cluster>.<namespace>.<service>",
                            peer.id, peer.id
                        ),
                        record: name,
                        reason: "NotThePeersOwnExport",
                        warning: true,
                    });
            }
            its_own
        });
        records.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        records.dedup_by(|a, b| a.metadata.name == b.metadata.name);
        if records.len() > MAX_RECORDS_PER_PEER {
            tracing::warn!(
                "multi-cluster services: cluster {} exports {} Services; importing the first {MAX_RECORDS_PER_PEER} by name",
                peer.id,
                records.len()
            );
            records.truncate(MAX_RECORDS_PER_PEER);
        }
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        let mut out = Vec::new();
        let (mut endpoints, mut over_budget) = (0usize, false);
        for r in records {
            let key = (r.spec.namespace.clone(), r.spec.service.clone());
            if let Err(why) = self.may_import(peer, &key, own) {
                self.refuse(peer, &key, why);
                continue;
            }
            let mut spec = match sanitize::sanitize(&r.spec) {
                Ok(spec) => spec,
                Err(e) => {
                    tracing::debug!(
                        "multi-cluster services: not importing {}/{} from {}: {e}",
                        key.0,
                        key.1,
                        peer.id
                    );
                    continue;
                }
            };
            for slice in &mut spec.endpoint_slices {
                for ep in &mut slice.endpoints {
                    ep.addresses = ep
                        .addresses
                        .iter()
                        .filter_map(|a| tandem_core::mcs::import_address(a, real, here))
                        .collect();
                }
                slice.endpoints.retain(|e| !e.addresses.is_empty());
            }
            let mut props = properties(&spec);
            props.created = export_age(
                props.created,
                now,
                &peer.id,
                self.stored_sources(&key).as_deref(),
            );
            // Bounded in total, not only per record: a peer cannot make this cluster hold
            // more than MAX_ENDPOINTS_PER_PEER endpoints of its.
            let mut slices = spec.endpoint_slices;
            for slice in &mut slices {
                let room = MAX_ENDPOINTS_PER_PEER.saturating_sub(endpoints);
                if slice.endpoints.len() > room {
                    over_budget = true;
                    slice.endpoints.truncate(room);
                }
                endpoints += slice.endpoints.len();
            }
            slices.retain(|s| !s.endpoints.is_empty());
            out.push((
                key,
                Source {
                    cluster: peer.id.clone(),
                    props,
                    slices,
                    healthy: peer.healthy,
                },
            ));
        }
        if over_budget {
            tracing::warn!(
                "multi-cluster services: cluster {} exports more than {MAX_ENDPOINTS_PER_PEER} endpoints; importing the first",
                peer.id
            );
        }
        Some(out)
    }

    /// Whether `peer`'s export of `namespace/service` may become (part of) an import here,
    /// as [`tandem_core::mcs::import_scope`] decides from the namespace as it is now, the
    /// peer's lists and whether this cluster exports that Service itself.
    fn may_import(
        &self,
        peer: &Peer,
        (namespace, service): &(String, String),
        own: &Records,
    ) -> Result<ImportScope, NotImported> {
        let ns = self
            .caches
            .namespaces
            .get(&ObjectRef::new(namespace))
            .filter(|ns| ns.metadata.deletion_timestamp.is_none());
        let here = ns.as_ref().map(|ns| ImportNamespace {
            name: namespace,
            twin_of: label(ns.as_ref(), names::TWIN_NAMESPACE_LABEL).and_then(|_| {
                Some((
                    label(ns.as_ref(), names::ORIGIN_CLUSTER_LABEL)?,
                    label(ns.as_ref(), names::ORIGIN_NAMESPACE_LABEL)?,
                ))
            }),
            opted_in: ns
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(IMPORT_FROM_ANNOTATION))
                .map(String::as_str),
        });
        let own_export = own.contains_key(&(namespace.clone(), service.clone()));
        tandem_core::mcs::import_scope(
            &peer.id,
            namespace,
            here.as_ref(),
            &peer.allowed,
            own_export,
        )
    }

    /// The exports (properties) an import of ours was last written from.
    fn stored_sources(&self, (ns, name): &(String, String)) -> Option<Vec<ExportProperties>> {
        let import = self.caches.imports.get(&ObjectRef::new(name).within(ns))?;
        if !is_ours(import.as_ref()) {
            return None;
        }
        let raw = import
            .metadata
            .annotations
            .as_ref()?
            .get(SOURCES_ANNOTATION)?;
        serde_json::from_str(raw).ok()
    }

    /// What an unreadable peer last exported, as this cluster last imported it: its part of
    /// each import (properties from the import, endpoints from its slices), so that a restart
    /// or a link not yet up neither removes imports (and their IPs) nor changes their merge.
    /// Its endpoints are ready only while its virtual node is.
    fn carried_sources(&self, peer: &Peer, own: &Records) -> Vec<((String, String), Source)> {
        let mut out = Vec::new();
        for import in self.caches.imports.state() {
            let key = key_of(import.as_ref());
            let Some(props) = self
                .stored_sources(&key)
                .and_then(|s| s.into_iter().find(|p| p.cluster == peer.id))
            else {
                continue;
            };
            if self.may_import(peer, &key, own).is_err() {
                continue;
            }
            let mut slices: Vec<(u32, ExportedSlice)> = self
                .caches
                .slices
                .state()
                .iter()
                .filter(|s| {
                    s.metadata.namespace.as_deref() == Some(key.0.as_str())
                        && label(s.as_ref(), SLICE_MANAGED_BY_LABEL) == Some(SLICE_MANAGER)
                        && label(s.as_ref(), SERVICE_NAME_LABEL) == Some(key.1.as_str())
                        && label(s.as_ref(), SOURCE_CLUSTER_LABEL) == Some(peer.id.as_str())
                })
                .map(|s| {
                    let index = s
                        .metadata
                        .name
                        .as_deref()
                        .and_then(|n| n.rsplit('-').next()?.parse().ok())
                        .unwrap_or(u32::MAX);
                    (index, imported_slice(s))
                })
                .collect();
            slices.sort_by_key(|(i, _)| *i);
            out.push((
                key,
                Source {
                    cluster: peer.id.clone(),
                    props,
                    slices: slices.into_iter().map(|(_, s)| s).collect(),
                    healthy: peer.healthy,
                },
            ));
        }
        out
    }

    /// Writes the ServiceImport of `key`, its derived Service and one EndpointSlice per
    /// source cluster and slice.
    async fn import(
        &self,
        (ns, name): &(String, String),
        sources: &[Source],
        merged: &Merged,
    ) -> Result<(), SyncError> {
        let err = |what: String| move |source| SyncError { what, source };
        let derived = derived_service_name(ns, name);
        let headless = merged.import_type == ImportType::Headless;
        let existing_import = self.caches.imports.get(&ObjectRef::new(name).within(ns));
        if existing_import
            .as_ref()
            .is_some_and(|i| !is_ours(i.as_ref()))
        {
            // An administrator's own ServiceImport: not ours to change.
            return Ok(());
        }
        let imports: Api<ServiceImport> = Api::namespaced(self.ctx.client.clone(), ns);
        let ports: Vec<ServicePort> = merged.ports.iter().map(service_port).collect();
        let service_api: Api<Service> = Api::namespaced(self.ctx.client.clone(), ns);
        let existing_service = self
            .caches
            .services
            .get(&ObjectRef::new(&derived).within(ns));
        if existing_service
            .as_ref()
            .is_some_and(|s| !is_ours(s.as_ref()))
        {
            tracing::warn!(
                "ServiceImport {ns}/{name}: Service {ns}/{derived} exists and is not Tandem's; not importing"
            );
            return Ok(());
        }
        let ips: Vec<String> = match (&existing_service, &existing_import) {
            _ if headless => Vec::new(),
            (Some(service), _) => service
                .spec
                .as_ref()
                .and_then(|s| s.cluster_ip.clone())
                .filter(|ip| !ip.is_empty() && ip != "None")
                .into_iter()
                .collect(),
            // Not in the cache (yet, or any more): the IP the import has, until the Service
            // is applied below — never a moment without it.
            (None, Some(import)) => import.spec.ips.clone(),
            (None, None) => Vec::new(),
        };
        let affinity_config = (merged.session_affinity == "ClientIP").then(|| {
            serde_json::from_value(json!({"clientIP": {
                "timeoutSeconds": merged.session_affinity_timeout.unwrap_or(10800)}}))
            .unwrap_or_default()
        });
        let spec = ServiceImportSpec {
            ports: ports.clone(),
            ips: ips.clone(),
            type_: merged.import_type.as_str().into(),
            session_affinity: Some(merged.session_affinity.clone()),
            session_affinity_config: affinity_config,
        };
        let mut stored: Vec<&ExportProperties> = sources.iter().map(|s| &s.props).collect();
        stored.sort_by(|a, b| a.cluster.cmp(&b.cluster));
        let stored = serde_json::to_string(&stored).unwrap_or_default();
        let stored_now = |i: &ServiceImport| {
            i.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(SOURCES_ANNOTATION))
                == Some(&stored)
        };
        let import = match existing_import {
            Some(i) if i.spec == spec && stored_now(&i) => i,
            Some(i) => {
                let mut updated = (*i).clone();
                updated.spec = spec;
                updated
                    .metadata
                    .annotations
                    .get_or_insert_default()
                    .insert(SOURCES_ANNOTATION.into(), stored.clone());
                Arc::new(
                    imports
                        .replace(name, &PostParams::default(), &updated)
                        .await
                        .map_err(err(format!("updating ServiceImport {ns}/{name}")))?,
                )
            }
            None => {
                let mut new = ServiceImport::new(name, spec);
                new.metadata.labels = Some(BTreeMap::from([(
                    names::MANAGED_BY_LABEL.into(),
                    names::MANAGED_BY.into(),
                )]));
                new.metadata.annotations = Some(BTreeMap::from([(
                    SOURCES_ANNOTATION.into(),
                    stored.clone(),
                )]));
                match imports.create(&PostParams::default(), &new).await {
                    Ok(i) => Arc::new(i),
                    // The namespace went (or is going) meanwhile: nothing to import into.
                    Err(e) if client::is_not_found(&e) || client::is_gone_or_forbidden(&e) => {
                        return Ok(());
                    }
                    Err(e) => return Err(err(format!("creating ServiceImport {ns}/{name}"))(e)),
                }
            }
        };
        let owner = OwnerReference {
            api_version: "multicluster.x-k8s.io/v1alpha1".into(),
            kind: "ServiceImport".into(),
            name: name.clone(),
            uid: import.metadata.uid.clone().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: None,
        };
        // The derived Service.
        let service_ports: Vec<serde_json::Value> = merged
            .ports
            .iter()
            .map(|p| {
                json!({"name": p.name, "protocol": p.protocol, "appProtocol": p.app_protocol,
                       "port": p.port, "targetPort": p.port})
            })
            .collect();
        let mut want_service = json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": derived, "namespace": ns,
                "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY, SERVICE_NAME_LABEL: name},
                "ownerReferences": [owner]},
            "spec": {
                "type": "ClusterIP",
                "clusterIP": if headless { Some("None") } else { None },
                "ports": service_ports,
                "sessionAffinity": merged.session_affinity,
            },
        });
        let affinity_timeout = (merged.session_affinity == "ClientIP")
            .then(|| merged.session_affinity_timeout.unwrap_or(10800));
        if let Some(timeout) = affinity_timeout {
            want_service["spec"]["sessionAffinityConfig"] =
                json!({"clientIP": {"timeoutSeconds": timeout}});
        }
        let service_differs = match &existing_service {
            None => true,
            Some(s) => {
                let spec = s.spec.clone().unwrap_or_default();
                type Port = (Option<String>, Option<String>, Option<String>, i32);
                let have: Vec<Port> = spec
                    .ports
                    .iter()
                    .flatten()
                    .map(|p| {
                        let name = p.name.clone().filter(|n| !n.is_empty());
                        (name, p.protocol.clone(), p.app_protocol.clone(), p.port)
                    })
                    .collect();
                let want: Vec<Port> = merged
                    .ports
                    .iter()
                    .map(|p| {
                        let protocol = Some(p.protocol.clone());
                        (p.name.clone(), protocol, p.app_protocol.clone(), p.port)
                    })
                    .collect();
                have != want
                    || spec.session_affinity.as_deref() != Some(merged.session_affinity.as_str())
                    || affinity_timeout.is_some_and(|t| {
                        spec.session_affinity_config
                            .as_ref()
                            .and_then(|c| c.client_ip.as_ref()?.timeout_seconds)
                            != Some(t)
                    })
                    || (spec.cluster_ip.as_deref() == Some("None")) != headless
            }
        };
        // The Service (and the import's IP) and the slices are independent once the import
        // exists: written side by side, the import is usable one write sooner.
        let service_step = async {
            if service_differs {
                let headless_changed = existing_service.as_ref().is_some_and(|s| {
                    (s.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None"))
                        != headless
                });
                if headless_changed {
                    // clusterIP is immutable: the import changed type, so the Service is remade.
                    client::delete_if_exists(&service_api, &derived, &DeleteParams::default())
                        .await
                        .map_err(err(format!("deleting Service {ns}/{derived}")))?;
                }
                let pp = PatchParams::apply(names::FIELD_MANAGER).force();
                let applied = service_api
                    .patch(&derived, &pp, &Patch::Apply(&want_service))
                    .await
                    .map_err(err(format!("applying Service {ns}/{derived}")))?;
                if let Some(ip) = applied
                    .spec
                    .and_then(|s| s.cluster_ip)
                    .filter(|ip| !headless && !ips.contains(ip))
                {
                    imports
                        .patch(
                            name,
                            &PatchParams::default(),
                            &Patch::Merge(json!({"spec": {"ips": [ip]}})),
                        )
                        .await
                        .map_err(err(format!("IP of ServiceImport {ns}/{name}")))?;
                }
            }
            Ok::<(), SyncError>(())
        };
        let slices_step = async {
            // One EndpointSlice per source cluster and slice of its export.
            let slices: Api<EndpointSlice> = Api::namespaced(self.ctx.client.clone(), ns);
            let existing: BTreeMap<String, Arc<EndpointSlice>> = self
                .caches
                .slices
                .state()
                .into_iter()
                .filter(|s| {
                    s.metadata.namespace.as_deref() == Some(ns.as_str())
                        && label(s.as_ref(), SLICE_MANAGED_BY_LABEL) == Some(SLICE_MANAGER)
                        && label(s.as_ref(), SERVICE_NAME_LABEL) == Some(name.as_str())
                })
                .map(|s| (s.metadata.name.clone().unwrap_or_default(), s))
                .collect();
            let mut wanted = BTreeSet::new();
            // Each slice on its own: one that cannot be written does not hold back the others.
            let mut result = Ok(());
            for source in sources {
                for (i, slice) in source.slices.iter().enumerate() {
                    let slice_name = tandem_core::names::import_slice(&derived, &source.cluster, i);
                    wanted.insert(slice_name.clone());
                    let want =
                        endpoint_slice(&slice_name, ns, name, &derived, &owner, source, slice);
                    let same = existing.get(&slice_name).is_some_and(|have| {
                        have.endpoints == want.endpoints
                            && have.ports == want.ports
                            && have.metadata.labels == want.metadata.labels
                    });
                    if same {
                        continue;
                    }
                    let written = match existing.get(&slice_name) {
                        Some(have) => {
                            let mut updated = want.clone();
                            updated.metadata.resource_version =
                                have.metadata.resource_version.clone();
                            slices
                                .replace(&slice_name, &PostParams::default(), &updated)
                                .await
                                .map(drop)
                        }
                        // Already there (the cache is behind): the next pass compares it.
                        None => match slices.create(&PostParams::default(), &want).await {
                            Err(e) if client::is_conflict(&e) => Ok(()),
                            created => created.map(drop),
                        },
                    };
                    if let Err(e) = written {
                        result = Err(err(format!("writing EndpointSlice {ns}/{slice_name}"))(e));
                    }
                }
            }
            for stale in existing.keys().filter(|n| !wanted.contains(*n)) {
                if let Err(e) =
                    client::delete_if_exists(&slices, stale, &DeleteParams::default()).await
                {
                    result = Err(err(format!("deleting EndpointSlice {ns}/{stale}"))(e));
                }
            }
            result
        };
        let (service_written, slices_written) = tokio::join!(service_step, slices_step);
        service_written?;
        slices_written?;

        // Its status last: the endpoints are what traffic waits for.
        let clusters: Vec<ClusterStatus> = merged
            .clusters
            .iter()
            .map(|c| ClusterStatus { cluster: c.clone() })
            .collect();
        let mut status = import.status.clone().unwrap_or_default();
        let mut conds = status.conditions.clone();
        conditions::set_condition(
            &mut conds,
            "Ready",
            ConditionStatus::True,
            "Ready",
            &format!("imported from {}", merged.clusters.join(", ")),
            None,
        );
        // The exports' conflicts, here too: two clusters that do not peer with each other
        // never see each other's export, so only an importer of both can say they clash.
        match merged.conflict_summary() {
            Some((reason, message)) => conditions::set_condition(
                &mut conds,
                export_condition::CONFLICT,
                ConditionStatus::True,
                &reason,
                &message,
                None,
            ),
            None => conditions::set_condition(
                &mut conds,
                export_condition::CONFLICT,
                ConditionStatus::False,
                "NoConflicts",
                &format!("the exports of {ns}/{name} agree"),
                None,
            ),
        };
        if status.clusters != clusters || !same_conditions(&conds, &status.conditions) {
            status.clusters = clusters;
            status.conditions = conds;
            imports
                .patch_status(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": status})),
                )
                .await
                .map_err(err(format!("status of ServiceImport {ns}/{name}")))?;
        }

        Ok(())
    }

    /// Removes the ServiceImports (with their derived Service and slices) no export backs.
    /// An import written before imports recorded their sources (an upgrade) is kept while
    /// any peer cannot be read: it may be that peer's.
    async fn remove_stale_imports(
        &self,
        sources: &BTreeMap<(String, String), Vec<Source>>,
        all_readable: bool,
    ) -> Result<(), SyncError> {
        let mut result = Ok(());
        for import in self.caches.imports.state() {
            let key = key_of(import.as_ref());
            if !is_ours(import.as_ref()) || sources.contains_key(&key) {
                continue;
            }
            if !all_readable && self.stored_sources(&key).is_none() {
                continue;
            }
            let (ns, name) = key;
            let derived = derived_service_name(&ns, &name);
            let dp = DeleteParams::default();
            let slices: Api<EndpointSlice> = Api::namespaced(self.ctx.client.clone(), &ns);
            let services: Api<Service> = Api::namespaced(self.ctx.client.clone(), &ns);
            let imports: Api<ServiceImport> = Api::namespaced(self.ctx.client.clone(), &ns);
            // Slices and Service first (garbage collection would take them too, later).
            let selector =
                format!("{SLICE_MANAGED_BY_LABEL}={SLICE_MANAGER},{SERVICE_NAME_LABEL}={name}");
            let r = async {
                slices
                    .delete_collection(&dp, &kube::api::ListParams::default().labels(&selector))
                    .await?;
                if self
                    .caches
                    .services
                    .get(&ObjectRef::new(&derived).within(&ns))
                    .is_some_and(|s| is_ours(s.as_ref()))
                {
                    client::delete_if_exists(&services, &derived, &dp).await?;
                }
                client::delete_if_exists(&imports, &name, &dp).await
            }
            .await;
            if let Err(source) = r {
                result = Err(SyncError {
                    what: format!("removing ServiceImport {ns}/{name} (no export left)"),
                    source,
                });
            }
        }
        result
    }

    /// Sets Valid, Conflict and Ready on this cluster's ServiceExports.
    async fn export_statuses(
        &self,
        statuses: Vec<(ServiceExport, Verdict)>,
        merged: &BTreeMap<(String, String), Merged>,
    ) -> Result<(), SyncError> {
        let mut result = Ok(());
        for (export, verdict) in statuses {
            let (ns, name) = key_of(&export);
            let generation = export.metadata.generation;
            let before = export.status.clone().unwrap_or_default().conditions;
            let mut conds = before.clone();
            let set = |conds: &mut Vec<Condition>, t: &str, s: bool, reason: &str, msg: &str| {
                conditions::set_condition(conds, t, s.into(), reason, msg, generation);
            };
            match &verdict {
                Err((reason, message)) => {
                    set(&mut conds, export_condition::VALID, false, reason, message);
                    set(
                        &mut conds,
                        export_condition::READY,
                        false,
                        "Failed",
                        message,
                    );
                    conds.retain(|c| c.type_ != export_condition::CONFLICT);
                }
                Ok(()) => {
                    set(
                        &mut conds,
                        export_condition::VALID,
                        true,
                        "Valid",
                        "the Service is exported",
                    );
                    let m = merged.get(&(ns.clone(), name.clone()));
                    match m.and_then(Merged::conflict_summary) {
                        Some((reason, message)) => set(
                            &mut conds,
                            export_condition::CONFLICT,
                            true,
                            &reason,
                            &message,
                        ),
                        None => set(
                            &mut conds,
                            export_condition::CONFLICT,
                            false,
                            "NoConflicts",
                            "the exports of this Service agree",
                        ),
                    }
                    let clusters = m.map(|m| m.clusters.join(", ")).unwrap_or_default();
                    set(
                        &mut conds,
                        export_condition::READY,
                        true,
                        "Exported",
                        &format!("exported to the peers; imported from {clusters}"),
                    );
                }
            }
            if same_conditions(&conds, &before) {
                continue;
            }
            let api: Api<ServiceExport> = Api::namespaced(self.ctx.client.clone(), &ns);
            let patched = api
                .patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"conditions": conds}})),
                )
                .await;
            match patched {
                Err(source) if !client::is_not_found(&source) => {
                    result = Err(SyncError {
                        what: format!("status of ServiceExport {ns}/{name}"),
                        source,
                    });
                }
                _ => {}
            }
        }
        result
    }
}

/// The age (Unix seconds) this cluster gives `peer`'s export of a Service, which decides
/// the import's conflicts, from the one it `claimed` and the ages the import recorded:
///
/// - never in the future: a claim from the future counts as now, and once recorded stays
///   (re-dating it on every pass would rewrite the import each time);
/// - once recorded, never earlier: a peer cannot back-date its export later to win.
///
/// A later claim (re-exported) is taken as it is. A first claim is trusted as KEP-1645 trusts
/// creation times: were a newcomer's age floored at the import's oldest, two clusters that
/// peer after both exported would each see its own export win, and disagree.
fn export_age(claimed: i64, now: i64, peer: &str, stored: Option<&[ExportProperties]>) -> i64 {
    let stored = stored.unwrap_or_default();
    match stored.iter().find(|p| p.cluster == peer) {
        Some(first) if claimed < first.created || claimed > now => first.created,
        Some(_) => claimed,
        None => claimed.min(now),
    }
}

fn new_peer(id: &str) -> Peer {
    Peer {
        id: id.to_string(),
        tenant_namespace: None,
        pod_cidr: None,
        allowed: Vec::new(),
        healthy: true,
        readable: false,
    }
}

/// Makes the records with our cluster ID in `api`'s namespace exactly `own`.
async fn sync_records(
    api: &Api<ExportedService>,
    me: &str,
    own: &BTreeMap<(String, String), ExportedServiceSpec>,
    existing: &[Arc<ExportedService>],
) -> Result<(), SyncError> {
    let ns = api.namespace().unwrap_or_default().to_string();
    let err = |what: String| move |source| SyncError { what, source };
    let mine: BTreeMap<String, &Arc<ExportedService>> = existing
        .iter()
        .filter(|r| r.spec.cluster_id == me)
        .map(|r| (r.metadata.name.clone().unwrap_or_default(), r))
        .collect();
    for ((svc_ns, svc), spec) in own {
        let name = exported_service_name(me, svc_ns, svc);
        match mine.get(&name) {
            Some(have) if have.spec == *spec => {}
            Some(have) => {
                let mut updated = (***have).clone();
                updated.spec = spec.clone();
                updated.metadata.managed_fields = None;
                api.replace(&name, &PostParams::default(), &updated)
                    .await
                    .map_err(err(format!("updating ExportedService {ns}/{name}")))?;
            }
            None => {
                let mut record = ExportedService::new(&name, spec.clone());
                record.metadata.labels = Some(BTreeMap::from([
                    (names::MANAGED_BY_LABEL.into(), names::MANAGED_BY.into()),
                    (names::ORIGIN_CLUSTER_LABEL.into(), me.to_string()),
                ]));
                match api.create(&PostParams::default(), &record).await {
                    Ok(_) => {}
                    Err(e) if client::is_conflict(&e) => {}
                    Err(e) => return Err(err(format!("creating ExportedService {ns}/{name}"))(e)),
                }
            }
        }
    }
    for (name, r) in &mine {
        if !own.contains_key(&(r.spec.namespace.clone(), r.spec.service.clone())) {
            client::delete_if_exists(api, name, &DeleteParams::default())
                .await
                .map_err(err(format!("deleting ExportedService {ns}/{name}")))?;
        }
    }
    Ok(())
}

/// The record of this cluster's export of `service`: endpoints outside our pod CIDR (host
/// network pods, pods we offloaded elsewhere) are left out, since no peer reaches them.
fn record(
    me: &str,
    export: &ServiceExport,
    service: &Service,
    slices: &[Arc<EndpointSlice>],
    pod_cidr: Option<IpNet>,
) -> ExportedServiceSpec {
    let spec = service.spec.clone().unwrap_or_default();
    let headless = spec.cluster_ip.as_deref() == Some("None");
    let ports = spec
        .ports
        .iter()
        .flatten()
        .map(|p| ServicePort {
            name: p.name.clone().filter(|n| !n.is_empty()),
            protocol: Some(p.protocol.clone().unwrap_or_else(|| "TCP".into())),
            app_protocol: p.app_protocol.clone(),
            port: p.port,
        })
        .collect();
    let mut endpoint_slices: Vec<ExportedSlice> = slices
        .iter()
        .filter(|s| s.address_type == "IPv4" || s.address_type == "IPv6")
        .map(|s| ExportedSlice {
            ports: s.ports.iter().flatten().filter_map(slice_port).collect(),
            endpoints: s
                .endpoints
                .iter()
                .filter_map(|e| {
                    let addresses: Vec<String> = e
                        .addresses
                        .iter()
                        .filter(|a| {
                            pod_cidr.is_none_or(|c| {
                                a.parse::<std::net::IpAddr>()
                                    .is_ok_and(|ip| c.contains(&ip))
                            })
                        })
                        .cloned()
                        .collect();
                    (!addresses.is_empty()).then(|| ExportedEndpoint {
                        addresses,
                        hostname: e.hostname.clone(),
                        ready: e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true),
                    })
                })
                .collect(),
        })
        .filter(|s| !s.endpoints.is_empty())
        .collect();
    // Stable across the slices' order in the cache.
    endpoint_slices.sort_by(|a, b| {
        (a.endpoints.first().map(|e| &e.addresses)).cmp(&b.endpoints.first().map(|e| &e.addresses))
    });
    ExportedServiceSpec {
        cluster_id: me.to_string(),
        namespace: export.metadata.namespace.clone().unwrap_or_default(),
        service: export.metadata.name.clone().unwrap_or_default(),
        exported_at: export
            .metadata
            .creation_timestamp
            .clone()
            .unwrap_or(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
        type_: if headless { "Headless" } else { "ClusterSetIP" }.into(),
        ports,
        session_affinity: spec.session_affinity.clone(),
        session_affinity_timeout_seconds: spec
            .session_affinity_config
            .and_then(|c| c.client_ip?.timeout_seconds),
        endpoint_slices,
    }
}

/// An EndpointSlice's port as a record holds it.
fn slice_port(p: &k8s_openapi::api::discovery::v1::EndpointPort) -> Option<ServicePort> {
    Some(ServicePort {
        name: p.name.clone().filter(|n| !n.is_empty()),
        protocol: Some(p.protocol.clone().unwrap_or_else(|| "TCP".into())),
        app_protocol: p.app_protocol.clone(),
        port: p.port?,
    })
}

/// One of our import's slices back as the slice of a record (its endpoints' own readiness is
/// what they serve: `ready` there also says whether their cluster is reachable).
fn imported_slice(s: &EndpointSlice) -> ExportedSlice {
    ExportedSlice {
        ports: s.ports.iter().flatten().filter_map(slice_port).collect(),
        endpoints: s
            .endpoints
            .iter()
            .map(|e| ExportedEndpoint {
                addresses: e.addresses.clone(),
                hostname: e.hostname.clone(),
                ready: e
                    .conditions
                    .as_ref()
                    .and_then(|c| c.serving.or(c.ready))
                    .unwrap_or(true),
            })
            .collect(),
    }
}

fn properties(spec: &ExportedServiceSpec) -> ExportProperties {
    ExportProperties {
        cluster: spec.cluster_id.clone(),
        created: spec.exported_at.0.as_second(),
        import_type: if spec.type_ == "Headless" {
            ImportType::Headless
        } else {
            ImportType::ClusterSetIP
        },
        ports: spec
            .ports
            .iter()
            .map(|p| ExportedPort {
                name: p.name.clone(),
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                app_protocol: p.app_protocol.clone(),
                port: p.port,
            })
            .collect(),
        session_affinity: spec
            .session_affinity
            .clone()
            .unwrap_or_else(|| "None".into()),
        session_affinity_timeout: if spec.session_affinity.as_deref() == Some("ClientIP") {
            spec.session_affinity_timeout_seconds
        } else {
            None
        },
    }
}

fn service_port(p: &ExportedPort) -> ServicePort {
    ServicePort {
        name: p.name.clone(),
        protocol: Some(p.protocol.clone()),
        app_protocol: p.app_protocol.clone(),
        port: p.port,
    }
}

fn endpoint_slice(
    slice_name: &str,
    ns: &str,
    service: &str,
    derived: &str,
    owner: &OwnerReference,
    source: &Source,
    slice: &ExportedSlice,
) -> EndpointSlice {
    let v6 = slice
        .endpoints
        .iter()
        .flat_map(|e| e.addresses.first())
        .any(|a| a.contains(':'));
    serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {
            "name": slice_name, "namespace": ns,
            "labels": {
                "kubernetes.io/service-name": derived,
                SLICE_MANAGED_BY_LABEL: SLICE_MANAGER,
                SERVICE_NAME_LABEL: service,
                SOURCE_CLUSTER_LABEL: source.cluster,
                names::MANAGED_BY_LABEL: names::MANAGED_BY,
            },
            "ownerReferences": [owner],
        },
        "addressType": if v6 { "IPv6" } else { "IPv4" },
        "endpoints": slice.endpoints.iter().map(|e| {
            let ready = e.ready && source.healthy;
            json!({
                "addresses": e.addresses,
                "hostname": e.hostname,
                "conditions": {"ready": ready, "serving": e.ready, "terminating": false},
            })
        }).collect::<Vec<_>>(),
        "ports": slice.ports.iter().map(|p| json!({
            "name": p.name.clone().unwrap_or_default(), "protocol": p.protocol,
            "appProtocol": p.app_protocol, "port": p.port,
        })).collect::<Vec<_>>(),
    }))
    .expect("a valid EndpointSlice")
}

#[cfg(test)]
mod tests {
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
