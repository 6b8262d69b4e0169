//! Fixture builders for the tests of the plan and the sources: this cluster as a pass observes
//! it ([`ClusterFixture`]), its namespaces, its exported Services, its peers and what they
//! export; and what the plan's writes make of the cluster ([`ClusterFixture::apply`]), read back
//! as a user would (the import's ports, endpoints and conditions).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use tandem_api::mcs::{
    ExportedEndpoint, ExportedService, ExportedServiceSpec, ExportedSlice, SERVICE_NAME_LABEL,
    SOURCE_CLUSTER_LABEL, ServiceExport, ServiceImport, ServicePort, exported_service_name,
};
use tandem_api::names;
use tandem_core::mcs::IMPORT_FROM_ANNOTATION;

use super::observed::{Observed, Peer};
use super::plan::{Place, Plan, Step, plan};
use super::records::{KUBE_SLICE_MANAGER, Key, SLICE_MANAGED_BY_LABEL, derived_service_name};
use super::records::{key_of, label};

/// The time every fixture plan is made at (Unix seconds).
pub(super) const NOW: i64 = 1_750_000_000;
/// This cluster's pod CIDR, and every peer's own (each is remapped here).
pub(super) const POD_CIDR: &str = "10.244.0.0/16";

pub(super) fn at(seconds: i64) -> Time {
    Time(Timestamp::from_second(seconds).expect("a valid time"))
}

fn key(ns: &str, name: &str) -> Key {
    (ns.to_string(), name.to_string())
}

/// A namespace of this cluster.
pub(super) struct NamespaceFixture(Namespace);

impl NamespaceFixture {
    pub(super) fn new(name: &str) -> Self {
        let mut ns = Namespace::default();
        ns.metadata.name = Some(name.into());
        NamespaceFixture(ns)
    }
    /// Opted in for the exports of `peers` (`*`: every peer) by its annotation.
    pub(super) fn import_from(mut self, peers: &str) -> Self {
        self.0
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(IMPORT_FROM_ANNOTATION.into(), peers.into());
        self
    }
    /// The twin this cluster made of the consumer `peer`'s namespace `origin`.
    pub(super) fn twin_of(mut self, peer: &str, origin: &str) -> Self {
        self.0.metadata.labels = Some(BTreeMap::from([
            (names::TWIN_NAMESPACE_LABEL.into(), "true".into()),
            (names::ORIGIN_CLUSTER_LABEL.into(), peer.into()),
            (names::ORIGIN_NAMESPACE_LABEL.into(), origin.into()),
        ]));
        self
    }
    pub(super) fn deleting(mut self) -> Self {
        self.0.metadata.deletion_timestamp = Some(at(NOW));
        self
    }
}

/// A Service of this cluster with its ServiceExport and its endpoints.
pub(super) struct ServiceFixture {
    service: Service,
    export: ServiceExport,
    endpoints: Vec<String>,
}

impl ServiceFixture {
    pub(super) fn new(ns: &str, name: &str) -> Self {
        let mut service = Service::default();
        service.metadata.name = Some(name.into());
        service.metadata.namespace = Some(ns.into());
        service.spec = Some(Default::default());
        let mut export = ServiceExport::new(name);
        export.metadata.namespace = Some(ns.into());
        export.metadata.generation = Some(1);
        export.metadata.creation_timestamp = Some(at(NOW - 100));
        ServiceFixture {
            service,
            export,
            endpoints: Vec::new(),
        }
    }
    pub(super) fn port(mut self, name: &str, port: i32) -> Self {
        let spec = self.service.spec.get_or_insert_default();
        spec.ports.get_or_insert_default().push(
            serde_json::from_value(json!({"name": name, "port": port, "protocol": "TCP"}))
                .expect("a port"),
        );
        self
    }
    pub(super) fn external_name(mut self) -> Self {
        self.service.spec.get_or_insert_default().type_ = Some("ExternalName".into());
        self
    }
    /// Exported at `seconds`.
    pub(super) fn created(mut self, seconds: i64) -> Self {
        self.export.metadata.creation_timestamp = Some(at(seconds));
        self
    }
    pub(super) fn endpoint(mut self, address: &str) -> Self {
        self.endpoints.push(address.into());
        self
    }
}

/// A peer's record of one of its exports.
#[derive(Clone)]
pub(super) struct RecordFixture {
    spec: ExportedServiceSpec,
    name: Option<String>,
    claimed: Option<String>,
}

impl RecordFixture {
    /// ClusterSetIP, exported 100 seconds before [`NOW`], without ports or endpoints.
    pub(super) fn new(ns: &str, service: &str) -> Self {
        RecordFixture {
            spec: ExportedServiceSpec {
                cluster_id: String::new(),
                namespace: ns.into(),
                service: service.into(),
                exported_at: at(NOW - 100),
                type_: "ClusterSetIP".into(),
                ports: Vec::new(),
                session_affinity: None,
                session_affinity_timeout_seconds: None,
                endpoint_slices: Vec::new(),
            },
            name: None,
            claimed: None,
        }
    }
    pub(super) fn port(mut self, name: &str, port: i32) -> Self {
        self.spec.ports.push(ServicePort {
            name: Some(name.into()),
            protocol: Some("TCP".into()),
            app_protocol: None,
            port,
        });
        self
    }
    pub(super) fn type_(mut self, type_: &str) -> Self {
        self.spec.type_ = type_.into();
        self
    }
    pub(super) fn headless(self) -> Self {
        self.type_("Headless")
    }
    pub(super) fn client_ip_affinity(mut self) -> Self {
        self.spec.session_affinity = Some("ClientIP".into());
        self
    }
    pub(super) fn created(mut self, seconds: i64) -> Self {
        self.spec.exported_at = at(seconds);
        self
    }
    /// One more slice with these endpoints (ready), on the record's ports.
    pub(super) fn slice(mut self, addresses: &[&str]) -> Self {
        self.spec.endpoint_slices.push(ExportedSlice {
            ports: self.spec.ports.clone(),
            endpoints: addresses
                .iter()
                .map(|a| ExportedEndpoint {
                    addresses: vec![a.to_string()],
                    hostname: None,
                    ready: true,
                })
                .collect(),
        });
        self
    }
    /// Its endpoints all not ready (terminating, failing their probes).
    pub(super) fn not_ready(mut self) -> Self {
        for slice in &mut self.spec.endpoint_slices {
            for e in &mut slice.endpoints {
                e.ready = false;
            }
        }
        self
    }
    /// Under the record name `name` rather than the one it must have.
    pub(super) fn named(mut self, name: &str) -> Self {
        self.name = Some(name.into());
        self
    }
    /// Claiming to be cluster `cluster`'s export.
    pub(super) fn claiming(mut self, cluster: &str) -> Self {
        self.claimed = Some(cluster.into());
        self
    }

    fn of(&self, peer: &str) -> ExportedService {
        let mut spec = self.spec.clone();
        spec.cluster_id = self.claimed.clone().unwrap_or_else(|| peer.into());
        let name = self.name.clone().unwrap_or_else(|| {
            exported_service_name(&spec.cluster_id, &spec.namespace, &spec.service)
        });
        ExportedService::new(&name, spec)
    }
}

/// A peer of this cluster.
pub(super) struct PeerFixture {
    peer: Peer,
    records: Vec<RecordFixture>,
}

impl PeerFixture {
    /// A consumer of ours: its records are in our tenant namespace for it; its pods, in
    /// [`POD_CIDR`] there, are in 10.201.0.0/16 here.
    pub(super) fn consumer(id: &str) -> Self {
        let mut peer = Peer::new(id);
        peer.tenant_namespace = Some(names::tenant_namespace(id));
        peer.readable = true;
        let fixture = PeerFixture {
            peer,
            records: Vec::new(),
        };
        fixture.remapped("10.201.0.0/16")
    }
    /// A provider of ours: its records are read through the link to it.
    pub(super) fn provider(id: &str) -> Self {
        let mut fixture = PeerFixture::consumer(id);
        fixture.peer.tenant_namespace = None;
        fixture.peer.remote = Some(Vec::new());
        fixture
    }
    /// Its pods are in `here` in this cluster's view.
    pub(super) fn remapped(mut self, here: &str) -> Self {
        let cidr = |c: &str| c.parse().expect("a CIDR");
        self.peer.pod_cidr = Some((cidr(POD_CIDR), cidr(here)));
        self
    }
    /// No network with it (yet).
    pub(super) fn without_network(mut self) -> Self {
        self.peer.pod_cidr = None;
        self
    }
    /// Its records cannot be read now (a restart, a link not up yet).
    pub(super) fn unreadable(mut self) -> Self {
        self.peer.readable = false;
        self
    }
    /// This cluster's admin opted `ns` in for its exports (its Peering's or Tenant's list).
    pub(super) fn allows(mut self, ns: &str) -> Self {
        self.peer.allowed.push(Some(vec![ns.into()]));
        self
    }
    pub(super) fn exports(mut self, record: RecordFixture) -> Self {
        self.records.push(record);
        self
    }
}

/// This cluster as one pass observes it.
pub(super) struct ClusterFixture {
    pub(super) observed: Observed,
    next_ip: u32,
}

impl ClusterFixture {
    pub(super) fn new(me: &str) -> Self {
        ClusterFixture {
            observed: Observed {
                me: me.into(),
                pod_cidr: Some(POD_CIDR.parse().expect("a CIDR")),
                ..Default::default()
            },
            next_ip: 1,
        }
    }

    pub(super) fn namespace(mut self, ns: NamespaceFixture) -> Self {
        let name = ns.0.metadata.name.clone().unwrap_or_default();
        self.observed.namespaces.insert(name, Arc::new(ns.0));
        self
    }

    /// A Service exported here: its ServiceExport, the Service and its EndpointSlice.
    pub(super) fn export(mut self, svc: ServiceFixture) -> Self {
        let (ns, name) = key_of(&svc.service);
        let slice = json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{name}-abcde"), "namespace": ns, "labels": {
                SLICE_MANAGED_BY_LABEL: KUBE_SLICE_MANAGER, "kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "endpoints": svc.endpoints.iter().map(|a| json!({
                "addresses": [a], "conditions": {"ready": true}})).collect::<Vec<_>>(),
        });
        self.observed
            .slices
            .push(Arc::new(serde_json::from_value(slice).expect("a slice")));
        self.observed
            .services
            .insert((ns, name), Arc::new(svc.service));
        self.observed.exports.push(Arc::new(svc.export));
        self
    }

    /// A ServiceExport whose Service does not exist.
    pub(super) fn export_alone(mut self, ns: &str, name: &str) -> Self {
        let mut export = ServiceExport::new(name);
        export.metadata.namespace = Some(ns.into());
        self.observed.exports.push(Arc::new(export));
        self
    }

    pub(super) fn peer(mut self, fixture: PeerFixture) -> Self {
        let id = fixture.peer.id.clone();
        self.observed.peers.push(fixture.peer);
        for record in fixture.records {
            self.peer_exports(&id, record);
        }
        self
    }

    /// `ns/name` is taken by an object Tandem did not make: a ServiceImport or a Service.
    pub(super) fn foreign_import(mut self, ns: &str, name: &str) -> Self {
        let mut import = ServiceImport::new(name, Default::default());
        import.metadata.namespace = Some(ns.into());
        self.observed
            .imports
            .insert(key(ns, name), Arc::new(import));
        self
    }
    pub(super) fn foreign_service(mut self, ns: &str, name: &str) -> Self {
        let mut service = Service::default();
        service.metadata.name = Some(name.into());
        service.metadata.namespace = Some(ns.into());
        self.observed
            .services
            .insert(key(ns, name), Arc::new(service));
        self
    }

    /// The peer `id`'s record of `record`, new or changed.
    pub(super) fn peer_exports(&mut self, id: &str, record: RecordFixture) {
        let mut record = record.of(id);
        let place = self.place_of(id);
        if let Place::Tenant(ns) = &place {
            record.metadata.namespace = Some(ns.clone());
        }
        self.put_record(&place, record);
    }

    /// Where the peer `id`'s records are: our tenant namespace for a consumer, else read
    /// through the link.
    fn place_of(&mut self, id: &str) -> Place {
        match &self.peer_mut(id).tenant_namespace {
            Some(tenant) => Place::Tenant(tenant.clone()),
            None => Place::Provider(id.into()),
        }
    }

    /// The peer `id` no longer exports `ns/service`.
    pub(super) fn peer_unexports(&mut self, id: &str, ns: &str, service: &str) {
        let name = exported_service_name(id, ns, service);
        let place = self.place_of(id);
        self.records_at_mut(&place)
            .retain(|r| r.metadata.name.as_deref() != Some(name.as_str()));
    }

    pub(super) fn peer_mut(&mut self, id: &str) -> &mut Peer {
        self.observed
            .peers
            .iter_mut()
            .find(|p| p.id == id)
            .expect("a peer")
    }

    /// The pods behind this cluster's Service `ns/name` are now at `addresses`.
    pub(super) fn serve(&mut self, ns: &str, name: &str, addresses: &[&str]) {
        for slice in &mut self.observed.slices {
            if label(slice.as_ref(), "kubernetes.io/service-name") == Some(name)
                && slice.metadata.namespace.as_deref() == Some(ns)
            {
                let mut updated = (**slice).clone();
                updated.endpoints = addresses
                    .iter()
                    .map(|a| {
                        serde_json::from_value(
                            json!({"addresses": [a], "conditions": {"ready": true}}),
                        )
                        .expect("an endpoint")
                    })
                    .collect();
                *slice = Arc::new(updated);
            }
        }
    }

    /// This cluster no longer exports `ns/name` (its Service stays).
    pub(super) fn unexport(&mut self, ns: &str, name: &str) {
        self.observed
            .exports
            .retain(|e| key_of(e.as_ref()) != key(ns, name));
    }

    /// The plan of a pass now.
    pub(super) fn plan(&self) -> Plan {
        plan(&self.observed, Timestamp::from_second(NOW).expect("a time"))
    }

    /// A pass: its plan, and the cluster as its writes leave it.
    pub(super) fn pass(&mut self) -> Plan {
        let plan = self.plan();
        self.apply(&plan);
        plan
    }

    /// What the plan's writes make of this cluster (and of the places of its records), as the
    /// API servers would: new objects get a UID, a Service its ClusterIP.
    pub(super) fn apply(&mut self, plan: &Plan) {
        for step in &plan.steps {
            self.apply_step(step.clone());
        }
    }

    fn apply_step(&mut self, step: Step) {
        let imports = &mut self.observed.imports;
        match step {
            Step::CreateRecord { place, mut record }
            | Step::ReplaceRecord { place, mut record } => {
                if let Place::Tenant(ns) = &place {
                    record.metadata.namespace = Some(ns.clone());
                }
                self.put_record(&place, record);
            }
            Step::DeleteRecord { place, name } => self
                .records_at_mut(&place)
                .retain(|r| r.metadata.name.as_deref() != Some(name.as_str())),
            Step::CreateImport(mut import) => {
                import.metadata.uid = Some(format!(
                    "uid-{}",
                    import.metadata.name.as_deref().unwrap_or_default()
                ));
                imports.insert(key_of(&import), Arc::new(import));
            }
            Step::ReplaceImport(import) => {
                imports.insert(key_of(&import), Arc::new(import));
            }
            Step::ApplyService {
                import,
                service,
                recreate,
                ips,
            } => {
                let mut service: Service = serde_json::from_value(service).expect("a Service");
                let uid = imports[&import].metadata.uid.clone().unwrap_or_default();
                for owner in service.metadata.owner_references.iter_mut().flatten() {
                    owner.uid.clone_from(&uid);
                }
                let at = key_of(&service);
                let kept = self
                    .observed
                    .services
                    .get(&at)
                    .filter(|_| !recreate)
                    .and_then(|s| s.spec.as_ref()?.cluster_ip.clone());
                let spec = service.spec.get_or_insert_default();
                if spec.cluster_ip.is_none() {
                    let ip = kept.unwrap_or_else(|| {
                        self.next_ip += 1;
                        format!("10.96.0.{}", self.next_ip)
                    });
                    spec.cluster_ip = Some(ip.clone());
                    if !ips.contains(&ip) {
                        let mut updated = (*imports[&import]).clone();
                        updated.spec.ips = vec![ip];
                        imports.insert(import, Arc::new(updated));
                    }
                }
                self.observed.services.insert(at, Arc::new(service));
            }
            Step::CreateSlice { import, mut slice } | Step::ReplaceSlice { import, mut slice } => {
                let uid = imports[&import].metadata.uid.clone().unwrap_or_default();
                for owner in slice.metadata.owner_references.iter_mut().flatten() {
                    owner.uid.clone_from(&uid);
                }
                let at = key_of(&slice);
                self.observed.slices.retain(|s| key_of(s.as_ref()) != at);
                self.observed.slices.push(Arc::new(slice));
            }
            Step::DeleteSlice { import, name } => {
                let at = key(&import.0, &name);
                self.observed.slices.retain(|s| key_of(s.as_ref()) != at);
            }
            Step::SetImportStatus { import, status } => {
                let mut updated = (*imports[&import]).clone();
                updated.status = Some(status);
                imports.insert(import, Arc::new(updated));
            }
            Step::RemoveImport { import, service } => {
                let slices: Vec<Key> = self
                    .observed
                    .import_slices(&import)
                    .map(|s| key_of(s.as_ref()))
                    .collect();
                self.observed
                    .slices
                    .retain(|s| !slices.contains(&key_of(s.as_ref())));
                if let Some(derived) = service {
                    self.observed.services.remove(&key(&import.0, &derived));
                }
                self.observed.imports.remove(&import);
            }
            Step::SetExportStatus { export, conditions } => {
                for e in &mut self.observed.exports {
                    if key_of(e.as_ref()) == export {
                        let mut updated = (**e).clone();
                        updated.status.get_or_insert_default().conditions = conditions.clone();
                        *e = Arc::new(updated);
                    }
                }
            }
        }
    }

    fn records_at_mut(&mut self, place: &Place) -> &mut Vec<Arc<ExportedService>> {
        match place {
            Place::Tenant(_) => &mut self.observed.records,
            Place::Provider(id) => self
                .peer_mut(id)
                .remote
                .as_mut()
                .expect("a provider's records"),
        }
    }

    fn put_record(&mut self, place: &Place, record: ExportedService) {
        let at = key_of(&record);
        let records = self.records_at_mut(place);
        records.retain(|r| key_of(r.as_ref()) != at);
        records.push(Arc::new(record));
    }

    /// This cluster's records at `place`: (namespace, service) of each.
    pub(super) fn published(&self, place: &Place) -> Vec<Key> {
        let records: Vec<&Arc<ExportedService>> = match place {
            Place::Tenant(ns) => self.observed.records_in(ns).collect(),
            Place::Provider(id) => self
                .observed
                .peers
                .iter()
                .filter(|p| p.id == *id)
                .flat_map(|p| p.remote.iter().flatten())
                .collect(),
        };
        let mut out: Vec<Key> = records
            .iter()
            .filter(|r| r.spec.cluster_id == self.observed.me)
            .map(|r| key(&r.spec.namespace, &r.spec.service))
            .collect();
        out.sort();
        out
    }

    pub(super) fn import(&self, ns: &str, name: &str) -> Option<&ServiceImport> {
        self.observed.imports.get(&key(ns, name)).map(AsRef::as_ref)
    }

    /// The import's ports: (name, port).
    pub(super) fn ports(&self, ns: &str, name: &str) -> Vec<(String, i32)> {
        self.import(ns, name)
            .map(|i| {
                i.spec
                    .ports
                    .iter()
                    .map(|p| (p.name.clone().unwrap_or_default(), p.port))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The import's endpoints, as kube-proxy reads them: (source cluster, address, ready).
    pub(super) fn endpoints(&self, ns: &str, name: &str) -> Vec<(String, String, bool)> {
        let import = key(ns, name);
        let mut out: Vec<(String, String, bool)> = self
            .observed
            .import_slices(&import)
            .flat_map(|s| {
                let cluster = label(s.as_ref(), SOURCE_CLUSTER_LABEL).unwrap_or_default();
                s.endpoints.iter().map(move |e| {
                    let ready = e.conditions.as_ref().and_then(|c| c.ready) == Some(true);
                    (cluster.to_string(), e.addresses[0].clone(), ready)
                })
            })
            .collect();
        out.sort();
        out
    }

    /// How many EndpointSlices the import has.
    pub(super) fn slice_count(&self, ns: &str, name: &str) -> usize {
        self.observed.import_slices(&key(ns, name)).count()
    }

    /// The import's derived Service.
    pub(super) fn derived(&self, ns: &str, name: &str) -> Option<&Service> {
        let derived = derived_service_name(ns, name);
        let service = self.observed.services.get(&key(ns, &derived))?;
        (label(service.as_ref(), SERVICE_NAME_LABEL) == Some(name)).then_some(service.as_ref())
    }

    /// The import's condition `type_`: (status, reason, message).
    pub(super) fn import_condition(
        &self,
        ns: &str,
        name: &str,
        type_: &str,
    ) -> Option<(String, String, String)> {
        let status = self.import(ns, name)?.status.as_ref()?;
        let c = status.conditions.iter().find(|c| c.type_ == type_)?;
        Some((c.status.clone(), c.reason.clone(), c.message.clone()))
    }

    /// The condition `type_` of this cluster's export of `ns/name`: (status, reason, message).
    pub(super) fn export_condition(
        &self,
        ns: &str,
        name: &str,
        type_: &str,
    ) -> Option<(String, String, String)> {
        let export = self
            .observed
            .exports
            .iter()
            .find(|e| key_of(e.as_ref()) == key(ns, name))?;
        let c = export
            .status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == type_)?;
        Some((c.status.clone(), c.reason.clone(), c.message.clone()))
    }
}
