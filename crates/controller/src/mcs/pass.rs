//! One pass of the multi-cluster services sync: what it reads ([`Pass`]), the peers and
//! sources it finds, and the pure conversions between records, Services and EndpointSlices.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use kube::Resource;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tandem_api::mcs::{
    ExportedEndpoint, ExportedService, ExportedServiceSpec, ExportedSlice, SERVICE_NAME_LABEL,
    SOURCE_CLUSTER_LABEL, ServiceExport, ServiceImport, ServicePort, exported_service_name,
};
use tandem_api::{NetworkParameters, Peering, Tenant, client, names};
use tandem_core::mcs::{ExportProperties, ExportedPort, ImportType};
use tokio::sync::Notify;

use crate::consumer::link::ProviderLink;
use crate::context::Ctx;

pub(super) use tandem_api::names::{MCS_SLICE_MANAGER as SLICE_MANAGER, SLICE_MANAGED_BY_LABEL};
pub(super) const KUBE_SLICE_MANAGER: &str = "endpointslice-controller.k8s.io";
/// At most this many of one peer's exports are imported (by name): a peer cannot make this
/// cluster hold an unbounded number of objects.
pub(super) const MAX_RECORDS_PER_PEER: usize = 1000;
/// At most this many of one peer's endpoints, over all its exports.
pub(super) const MAX_ENDPOINTS_PER_PEER: usize = 10_000;

/// On a ServiceImport of ours: the properties of each export it was last written from (the
/// merge's inputs), so that an export whose cluster cannot be read for a while keeps its
/// place — and its age — in the merge.
pub(super) const SOURCES_ANNOTATION: &str = "mcs.tandem.dev/sources";

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
pub(super) fn cache<K>(
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
    pub(super) fn start(
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

    pub(super) async fn ready(&self) {
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
pub(super) struct RemoteRecords {
    pub(super) identity_version: String,
    pub(super) store: Store<ExportedService>,
    pub(super) task: tokio::task::JoinHandle<()>,
}

impl Drop for RemoteRecords {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What went wrong in one pass (the pass goes on with the other objects; this is the first).
#[derive(Debug, thiserror::Error)]
#[error("{what}: {}", short(source))]
pub struct SyncError {
    pub(super) what: String,
    #[source]
    pub(super) source: kube::Error,
}

/// The API server's message alone (kube's own text of an API error repeats it in Debug form).
pub(super) fn short(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => format!("{} ({})", status.message, status.code),
        other => other.to_string(),
    }
}

/// Whether an export is valid, else the `Valid` condition's reason and message.
pub(super) type Verdict = Result<(), (&'static str, String)>;
/// This cluster's exports as records, by (namespace, name).
pub(super) type Records = BTreeMap<(String, String), ExportedServiceSpec>;

/// One cluster that exports a Service, as this cluster sees its export.
#[derive(Clone, Debug)]
pub(super) struct Source {
    pub(super) cluster: String,
    pub(super) props: ExportProperties,
    /// Its endpoints, as this cluster addresses them.
    pub(super) slices: Vec<ExportedSlice>,
    /// Whether its endpoints may be ready (its virtual node / tunnel is up).
    pub(super) healthy: bool,
}

/// One peer, as far as services go.
#[derive(Debug)]
pub(super) struct Peer {
    pub(super) id: String,
    /// Our tenant namespace for it, when it consumes from us.
    pub(super) tenant_namespace: Option<String>,
    /// Its pod CIDR, and our name for it.
    pub(super) pod_cidr: Option<(IpNet, IpNet)>,
    /// The namespaces this cluster's admin opted in for its exports (each side's list).
    pub(super) allowed: Vec<Option<Vec<String>>>,
    pub(super) healthy: bool,
    /// Whether its records can be read now: through our tenant namespace for it, or through
    /// its tenant namespace for us once that is watched. Until then (a restart, a link not
    /// yet up or renewed) what it exported is not known, and is not taken as nothing.
    pub(super) readable: bool,
}

pub(super) struct Pass<'a> {
    pub(super) ctx: &'a Ctx,
    pub(super) caches: &'a Caches,
    pub(super) links: &'a BTreeMap<String, ProviderLink>,
    pub(super) remotes: &'a BTreeMap<String, RemoteRecords>,
    pub(super) pod_cidr: Option<IpNet>,
    /// Whether the tunnel to each consumer of ours is up (absent: not checked yet).
    pub(super) tunnels: &'a BTreeMap<String, bool>,
    /// The peers' exports this pass did not import, and why.
    pub(super) refused: std::sync::Mutex<Vec<Refusal>>,
}

/// A peer's export this cluster does not import, and why: reported as an Event (once while
/// it lasts) in the peer's tenant namespace, about the peer's record of the export.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Refusal {
    pub(super) peer: String,
    /// The name of the peer's record (an ExportedService in the tenant namespaces).
    pub(super) record: String,
    pub(super) reason: &'static str,
    pub(super) warning: bool,
    pub(super) message: String,
}

pub(super) fn label<'a, K: Resource>(obj: &'a K, key: &str) -> Option<&'a str> {
    obj.meta().labels.as_ref()?.get(key).map(String::as_str)
}

pub(super) fn is_ours<K: Resource>(obj: &K) -> bool {
    label(obj, names::MANAGED_BY_LABEL) == Some(names::MANAGED_BY)
}

pub(super) fn key_of<K: Resource>(obj: &K) -> (String, String) {
    (
        obj.meta().namespace.clone().unwrap_or_default(),
        obj.meta().name.clone().unwrap_or_default(),
    )
}

/// Conditions equal but for their transition times.
pub(super) fn same_conditions(a: &[Condition], b: &[Condition]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            (&x.type_, &x.status, &x.reason, &x.message)
                == (&y.type_, &y.status, &y.reason, &y.message)
        })
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
pub(super) fn export_age(
    claimed: i64,
    now: i64,
    peer: &str,
    stored: Option<&[ExportProperties]>,
) -> i64 {
    let stored = stored.unwrap_or_default();
    match stored.iter().find(|p| p.cluster == peer) {
        Some(first) if claimed < first.created || claimed > now => first.created,
        Some(_) => claimed,
        None => claimed.min(now),
    }
}

pub(super) fn new_peer(id: &str) -> Peer {
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
pub(super) async fn sync_records(
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
pub(super) fn record(
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
pub(super) fn slice_port(p: &k8s_openapi::api::discovery::v1::EndpointPort) -> Option<ServicePort> {
    Some(ServicePort {
        name: p.name.clone().filter(|n| !n.is_empty()),
        protocol: Some(p.protocol.clone().unwrap_or_else(|| "TCP".into())),
        app_protocol: p.app_protocol.clone(),
        port: p.port?,
    })
}

/// One of our import's slices back as the slice of a record (its endpoints' own readiness is
/// what they serve: `ready` there also says whether their cluster is reachable).
pub(super) fn imported_slice(s: &EndpointSlice) -> ExportedSlice {
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

pub(super) fn properties(spec: &ExportedServiceSpec) -> ExportProperties {
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

pub(super) fn service_port(p: &ExportedPort) -> ServicePort {
    ServicePort {
        name: p.name.clone(),
        protocol: Some(p.protocol.clone()),
        app_protocol: p.app_protocol.clone(),
        port: p.port,
    }
}

pub(super) fn endpoint_slice(
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
