//! The decisions of one pass, pure: from what the pass observed and the time, the writes
//! ([`Step`]) that make this cluster's records, imports and export statuses what they
//! should be, and what is not imported or not touched, and why. The parent module observes,
//! then acts on each step.
//!
//! In order: this cluster's records where each peer reads them; per Service exported by any
//! cluster (this one included), its ServiceImport, derived Service, EndpointSlices and the
//! import's status, merged as KEP-1645 says; the removal of imports no export backs; the
//! status of this cluster's ServiceExports.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use tandem_api::conditions::{self, ConditionStatus};
use tandem_api::mcs::{
    ClusterStatus, ExportedService, SERVICE_NAME_LABEL, ServiceExport, ServiceImport,
    ServiceImportSpec, ServiceImportStatus, ServicePort, export_condition, exported_service_name,
};
use tandem_api::names;
use tandem_core::mcs::{ExportProperties, ImportType, Merged};

use super::observed::Observed;
use super::records::{
    KUBE_SLICE_MANAGER, Key, Records, SLICE_MANAGED_BY_LABEL, SOURCES_ANNOTATION,
    derived_service_name, endpoint_slice, is_ours, key_of, label, properties, record,
    same_conditions, service_port,
};
use super::sources::{self, Refusal, Source};

/// Where this cluster's records of its exports are written for a peer to read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Place {
    /// Our tenant namespace for a consumer of ours, here.
    Tenant(String),
    /// Our tenant namespace on a provider of ours (this is the peer's ID), through the link.
    Provider(String),
}

/// One write of a pass. The steps of one object come in a row, in the order they are made.
#[derive(Clone, Debug)]
pub(super) enum Step {
    /// Publish a record of one of this cluster's exports where a peer reads it.
    CreateRecord {
        place: Place,
        record: ExportedService,
    },
    /// Rewrite a published record: the export changed.
    ReplaceRecord {
        place: Place,
        record: ExportedService,
    },
    /// Take back a published record: the export is gone or no longer valid.
    DeleteRecord { place: Place, name: String },
    /// Create the ServiceImport of a Service some cluster exports (its sources annotated).
    CreateImport(ServiceImport),
    /// Rewrite an import of ours: its merge or its sources changed.
    ReplaceImport(ServiceImport),
    /// Apply the derived Service backing `import` (deleted first when `recreate`: its
    /// clusterIP, immutable, changes with the import's type); then the import takes the
    /// Service's ClusterIP when it is not among `ips`.
    ApplyService {
        import: Key,
        service: serde_json::Value,
        recreate: bool,
        ips: Vec<String>,
    },
    /// Create one EndpointSlice of `import`: one slice of one source cluster's export.
    CreateSlice { import: Key, slice: EndpointSlice },
    /// Rewrite one EndpointSlice of `import` (its endpoints, ports or labels changed).
    ReplaceSlice { import: Key, slice: EndpointSlice },
    /// Delete an EndpointSlice of `import` no source's slice backs any more.
    DeleteSlice { import: Key, name: String },
    /// Set the import's clusters and its `Ready` and `Conflict` conditions.
    SetImportStatus {
        import: Key,
        status: ServiceImportStatus,
    },
    /// Remove an import of ours no export backs: its EndpointSlices, its derived Service
    /// (`service`, when that one is ours) and the import.
    RemoveImport {
        import: Key,
        service: Option<String>,
    },
    /// Set the `Valid`, `Conflict` and `Ready` conditions of one of this cluster's exports.
    SetExportStatus {
        export: Key,
        conditions: Vec<Condition>,
    },
}

/// The object a step writes: the steps of one target come in a row and are made together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Target {
    Records(Place),
    Import(Key),
    Removal(Key),
    Export(Key),
}

impl Step {
    pub(super) fn target(&self) -> Target {
        match self {
            Step::CreateRecord { place, .. }
            | Step::ReplaceRecord { place, .. }
            | Step::DeleteRecord { place, .. } => Target::Records(place.clone()),
            Step::CreateImport(i) | Step::ReplaceImport(i) => Target::Import(key_of(i)),
            Step::ApplyService { import, .. }
            | Step::CreateSlice { import, .. }
            | Step::ReplaceSlice { import, .. }
            | Step::DeleteSlice { import, .. }
            | Step::SetImportStatus { import, .. } => Target::Import(import.clone()),
            Step::RemoveImport { import, .. } => Target::Removal(import.clone()),
            Step::SetExportStatus { export, .. } => Target::Export(export.clone()),
        }
    }
}

/// Why an export of this cluster is not valid: the `Valid` condition's reason and message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum InvalidExport {
    #[error("Service {0}/{1} not found")]
    NoService(String, String),
    #[error("Service {0}/{1} is of type ExternalName, which cannot be exported")]
    ExternalName(String, String),
}

impl InvalidExport {
    /// The `Valid` condition's reason.
    pub(super) fn reason(&self) -> &'static str {
        match self {
            InvalidExport::NoService(..) => "NoService",
            InvalidExport::ExternalName(..) => "InvalidServiceType",
        }
    }
}

/// Why an import is not written: an object in its place that Tandem did not make.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum NotOurs {
    /// An administrator's own ServiceImport of that name: not ours to change.
    #[error("the ServiceImport is not Tandem's; not importing")]
    Import,
    /// The derived Service's name is taken by a Service Tandem did not make.
    #[error("Service {}/{} exists and is not Tandem's; not importing", .0.0, .0.1)]
    DerivedService(Key),
}

/// What one pass does: its writes in order, the peers' exports it does not import, and the
/// imports it leaves alone.
#[derive(Clone, Debug, Default)]
pub(super) struct Plan {
    pub(super) steps: Vec<Step>,
    pub(super) refused: Vec<Refusal>,
    pub(super) not_ours: Vec<(Key, NotOurs)>,
}

/// The pass's writes from what it `observed`, at `now`: the ages of peers' exports are
/// bounded by it, and conditions that change say so as of it.
pub(super) fn plan(observed: &Observed, now: Timestamp) -> Plan {
    let mut plan = Plan::default();
    let (own, verdicts) = own_exports(observed);
    for peer in &observed.peers {
        if let Some(ns) = &peer.tenant_namespace {
            let existing: Vec<_> = observed.records_in(ns).cloned().collect();
            let place = Place::Tenant(ns.clone());
            plan.steps
                .extend(publish(place, &observed.me, &own, &existing));
        }
        if let Some(existing) = &peer.remote {
            let place = Place::Provider(peer.id.clone());
            plan.steps
                .extend(publish(place, &observed.me, &own, existing));
        }
    }
    let mut sources: BTreeMap<Key, Vec<Source>> = BTreeMap::new();
    for (key, spec) in &own {
        sources.entry(key.clone()).or_default().push(Source {
            cluster: observed.me.clone(),
            props: properties(spec),
            slices: spec.endpoint_slices.clone(),
            healthy: true,
        });
    }
    for peer in &observed.peers {
        let from_peer = sources::of_peer(observed, peer, &own, now.as_second(), &mut plan.refused);
        for (key, source) in from_peer {
            sources.entry(key).or_default().push(source);
        }
    }
    let mut merged_of: BTreeMap<Key, Merged> = BTreeMap::new();
    for (key, srcs) in &sources {
        let props: Vec<ExportProperties> = srcs.iter().map(|s| s.props.clone()).collect();
        if let Some(m) = tandem_core::mcs::merge(&props) {
            merged_of.insert(key.clone(), m);
        }
    }
    let now = Time(now);
    for (key, srcs) in &sources {
        if let Some(merged) = merged_of.get(key) {
            match import(observed, key, srcs, merged, &now) {
                Ok(steps) => plan.steps.extend(steps),
                Err(why) => plan.not_ours.push((key.clone(), why)),
            }
        }
    }
    let all_readable = observed.peers.iter().all(|p| p.readable);
    plan.steps
        .extend(stale_imports(observed, &sources, all_readable));
    for (export, verdict) in &verdicts {
        let merged = merged_of.get(&key_of(export.as_ref()));
        plan.steps
            .extend(export_status(export, verdict, merged, &now));
    }
    plan
}

/// Whether each of this cluster's ServiceExports is valid.
type Verdicts = Vec<(Arc<ServiceExport>, Result<(), InvalidExport>)>;

/// This cluster's exports as records, and whether each ServiceExport is valid.
fn own_exports(observed: &Observed) -> (Records, Verdicts) {
    let mut own = BTreeMap::new();
    let mut verdicts = Vec::new();
    let mut slices_of: BTreeMap<Key, Vec<Arc<EndpointSlice>>> = BTreeMap::new();
    for slice in &observed.slices {
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
    for export in &observed.exports {
        if export.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let key = key_of(export.as_ref());
        let service = observed.services.get(&key);
        let verdict = match service {
            None => Err(InvalidExport::NoService(key.0.clone(), key.1.clone())),
            Some(s) if s.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("ExternalName") => {
                Err(InvalidExport::ExternalName(key.0.clone(), key.1.clone()))
            }
            Some(_) => Ok(()),
        };
        if let (Some(service), Ok(())) = (service, &verdict) {
            let slices = slices_of.get(&key).cloned().unwrap_or_default();
            let spec = record(&observed.me, export, service, &slices, observed.pod_cidr);
            own.insert(key, spec);
        }
        verdicts.push((export.clone(), verdict));
    }
    (own, verdicts)
}

/// The writes that make the records with our cluster ID (`me`) at `place` exactly `own`,
/// given the records there now.
fn publish(place: Place, me: &str, own: &Records, existing: &[Arc<ExportedService>]) -> Vec<Step> {
    let mine: BTreeMap<String, &Arc<ExportedService>> = existing
        .iter()
        .filter(|r| r.spec.cluster_id == me)
        .map(|r| (r.metadata.name.clone().unwrap_or_default(), r))
        .collect();
    let mut steps = Vec::new();
    for ((svc_ns, svc), spec) in own {
        let name = exported_service_name(me, svc_ns, svc);
        match mine.get(&name) {
            Some(have) if have.spec == *spec => {}
            Some(have) => {
                let mut record = (***have).clone();
                record.spec = spec.clone();
                record.metadata.managed_fields = None;
                steps.push(Step::ReplaceRecord {
                    place: place.clone(),
                    record,
                });
            }
            None => {
                let mut record = ExportedService::new(&name, spec.clone());
                record.metadata.labels = Some(BTreeMap::from([
                    (names::MANAGED_BY_LABEL.into(), names::MANAGED_BY.into()),
                    (names::ORIGIN_CLUSTER_LABEL.into(), me.to_string()),
                ]));
                steps.push(Step::CreateRecord {
                    place: place.clone(),
                    record,
                });
            }
        }
    }
    for (name, r) in &mine {
        if !own.contains_key(&(r.spec.namespace.clone(), r.spec.service.clone())) {
            steps.push(Step::DeleteRecord {
                place: place.clone(),
                name: name.clone(),
            });
        }
    }
    steps
}

/// The writes that make the import of `key` the merge (`merged`) of its `sources`: the
/// ServiceImport, its derived Service and one EndpointSlice per source cluster and slice,
/// then its status. None where an object in the way is not Tandem's.
fn import(
    observed: &Observed,
    key: &Key,
    sources: &[Source],
    merged: &Merged,
    now: &Time,
) -> Result<Vec<Step>, NotOurs> {
    let (ns, name) = key;
    let derived = derived_service_name(ns, name);
    let headless = merged.import_type == ImportType::Headless;
    let existing_import = observed.imports.get(key);
    if existing_import.is_some_and(|i| !is_ours(i.as_ref())) {
        return Err(NotOurs::Import);
    }
    let existing_service = observed.services.get(&(ns.clone(), derived.clone()));
    if existing_service.is_some_and(|s| !is_ours(s.as_ref())) {
        return Err(NotOurs::DerivedService((ns.clone(), derived)));
    }
    let mut steps = Vec::new();
    let ports: Vec<ServicePort> = merged.ports.iter().map(service_port).collect();
    let ips: Vec<String> = match (existing_service, existing_import) {
        _ if headless => Vec::new(),
        (Some(service), _) => service
            .spec
            .as_ref()
            .and_then(|s| s.cluster_ip.clone())
            .filter(|ip| !ip.is_empty() && ip != "None")
            .into_iter()
            .collect(),
        // Not observed (yet, or any more): the IP the import has, until the Service is
        // applied — never a moment without it.
        (None, Some(import)) => import.spec.ips.clone(),
        (None, None) => Vec::new(),
    };
    let affinity_config = (merged.session_affinity == "ClientIP").then(|| {
        serde_json::from_value(json!({"clientIP": {
            "timeoutSeconds": merged.session_affinity_timeout.unwrap_or(10800)}}))
        .unwrap_or_default()
    });
    let spec = ServiceImportSpec {
        ports,
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
    match existing_import {
        Some(i) if i.spec == spec && stored_now(i) => {}
        Some(i) => {
            let mut updated = (**i).clone();
            updated.spec = spec;
            updated
                .metadata
                .annotations
                .get_or_insert_default()
                .insert(SOURCES_ANNOTATION.into(), stored);
            steps.push(Step::ReplaceImport(updated));
        }
        None => {
            let mut new = ServiceImport::new(name, spec);
            new.metadata.namespace = Some(ns.clone());
            new.metadata.labels = Some(BTreeMap::from([(
                names::MANAGED_BY_LABEL.into(),
                names::MANAGED_BY.into(),
            )]));
            new.metadata.annotations = Some(BTreeMap::from([(SOURCES_ANNOTATION.into(), stored)]));
            steps.push(Step::CreateImport(new));
        }
    }
    // The import's UID where it exists; the act sets a new import's.
    let owner = OwnerReference {
        api_version: "multicluster.x-k8s.io/v1alpha1".into(),
        kind: "ServiceImport".into(),
        name: name.clone(),
        uid: existing_import
            .and_then(|i| i.metadata.uid.clone())
            .unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    };
    if let Some(step) = derived_service(key, &derived, &owner, merged, existing_service, ips) {
        steps.push(step);
    }
    steps.extend(slices(observed, key, &derived, &owner, sources));
    // Its status last: the endpoints are what traffic waits for.
    let before = existing_import
        .and_then(|i| i.status.clone())
        .unwrap_or_default();
    steps.extend(import_status(key, merged, before, now));
    Ok(steps)
}

/// Applying the derived Service of the import `key`, unless `existing` is already it.
fn derived_service(
    key: &Key,
    derived: &str,
    owner: &OwnerReference,
    merged: &Merged,
    existing: Option<&Arc<Service>>,
    ips: Vec<String>,
) -> Option<Step> {
    let (ns, name) = key;
    let headless = merged.import_type == ImportType::Headless;
    let service_ports: Vec<serde_json::Value> = merged
        .ports
        .iter()
        .map(|p| {
            json!({"name": p.name, "protocol": p.protocol, "appProtocol": p.app_protocol,
                   "port": p.port, "targetPort": p.port})
        })
        .collect();
    let mut service = json!({
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
        service["spec"]["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": timeout}});
    }
    let was_headless =
        |s: &Service| s.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None");
    let differs = match existing {
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
                || was_headless(s) != headless
        }
    };
    differs.then(|| Step::ApplyService {
        import: key.clone(),
        service,
        recreate: existing.is_some_and(|s| was_headless(s) != headless),
        ips,
    })
}

/// The writes that make the import's EndpointSlices one per source cluster and slice of its
/// export: each written where it differs, those no source backs deleted.
fn slices(
    observed: &Observed,
    key: &Key,
    derived: &str,
    owner: &OwnerReference,
    sources: &[Source],
) -> Vec<Step> {
    let (ns, name) = key;
    let existing: BTreeMap<String, &Arc<EndpointSlice>> = observed
        .import_slices(key)
        .map(|s| (s.metadata.name.clone().unwrap_or_default(), s))
        .collect();
    let mut wanted = BTreeSet::new();
    let mut steps = Vec::new();
    for source in sources {
        for (i, slice) in source.slices.iter().enumerate() {
            let slice_name = tandem_core::names::import_slice(derived, &source.cluster, i);
            wanted.insert(slice_name.clone());
            let mut want = endpoint_slice(
                (&slice_name, ns, name),
                derived,
                owner,
                (&source.cluster, source.healthy),
                slice,
            );
            match existing.get(&slice_name) {
                Some(have)
                    if have.endpoints == want.endpoints
                        && have.ports == want.ports
                        && have.metadata.labels == want.metadata.labels => {}
                Some(have) => {
                    want.metadata.resource_version = have.metadata.resource_version.clone();
                    steps.push(Step::ReplaceSlice {
                        import: key.clone(),
                        slice: want,
                    });
                }
                None => steps.push(Step::CreateSlice {
                    import: key.clone(),
                    slice: want,
                }),
            }
        }
    }
    for stale in existing.keys().filter(|n| !wanted.contains(*n)) {
        steps.push(Step::DeleteSlice {
            import: key.clone(),
            name: stale.clone(),
        });
    }
    steps
}

/// The import's status from `before`: its clusters, `Ready`, and the exports' conflicts —
/// here too, since two clusters that do not peer with each other never see each other's
/// export, so only an importer of both can say they clash. None when `before` is it.
fn import_status(
    key: &Key,
    merged: &Merged,
    before: ServiceImportStatus,
    now: &Time,
) -> Option<Step> {
    let (ns, name) = key;
    let clusters: Vec<ClusterStatus> = merged
        .clusters
        .iter()
        .map(|c| ClusterStatus { cluster: c.clone() })
        .collect();
    let mut conds = before.conditions.clone();
    let set = |conds: &mut Vec<Condition>, t: &str, s: bool, reason: &str, msg: &str| {
        set_at(conds, t, s.into(), reason, msg, None, now);
    };
    let from = format!("imported from {}", merged.clusters.join(", "));
    set(&mut conds, "Ready", true, "Ready", &from);
    let (conflict, reason, message) =
        conflict_condition(Some(merged), &format!("the exports of {ns}/{name} agree"));
    set(
        &mut conds,
        export_condition::CONFLICT,
        conflict,
        &reason,
        &message,
    );
    if before.clusters == clusters && same_conditions(&conds, &before.conditions) {
        return None;
    }
    Some(Step::SetImportStatus {
        import: key.clone(),
        status: ServiceImportStatus {
            clusters,
            conditions: conds,
        },
    })
}

/// The `Conflict` condition the merge of a Service's exports calls for: True with the merge's
/// reason and message when they disagree, else False (`NoConflicts`) saying `agree`.
fn conflict_condition(merged: Option<&Merged>, agree: &str) -> (bool, String, String) {
    match merged.and_then(Merged::conflict_summary) {
        Some((reason, message)) => (true, reason, message),
        None => (false, "NoConflicts".into(), agree.into()),
    }
}

/// The removal of each import of ours no export backs. An import written before imports
/// recorded their sources (an upgrade) is kept while any peer cannot be read (not
/// `all_readable`): it may be that peer's.
fn stale_imports(
    observed: &Observed,
    sources: &BTreeMap<Key, Vec<Source>>,
    all_readable: bool,
) -> Vec<Step> {
    let mut steps = Vec::new();
    for (key, import) in &observed.imports {
        if !is_ours(import.as_ref()) || sources.contains_key(key) {
            continue;
        }
        if !all_readable && observed.stored_sources(key).is_none() {
            continue;
        }
        let derived = derived_service_name(&key.0, &key.1);
        let ours = observed
            .services
            .get(&(key.0.clone(), derived.clone()))
            .is_some_and(|s| is_ours(s.as_ref()));
        steps.push(Step::RemoveImport {
            import: key.clone(),
            service: ours.then_some(derived),
        });
    }
    steps
}

/// The `Valid`, `Conflict` and `Ready` conditions one of this cluster's exports should
/// have, from whether it is valid and the merge of every export of its Service. None when
/// it has them.
fn export_status(
    export: &ServiceExport,
    verdict: &Result<(), InvalidExport>,
    merged: Option<&Merged>,
    now: &Time,
) -> Option<Step> {
    let generation = export.metadata.generation;
    let before = export.status.clone().unwrap_or_default().conditions;
    let mut conds = before.clone();
    let set = |conds: &mut Vec<Condition>, t: &str, s: bool, reason: &str, msg: &str| {
        set_at(conds, t, s.into(), reason, msg, generation, now);
    };
    match verdict {
        Err(invalid) => {
            let message = invalid.to_string();
            set(
                &mut conds,
                export_condition::VALID,
                false,
                invalid.reason(),
                &message,
            );
            set(
                &mut conds,
                export_condition::READY,
                false,
                "Failed",
                &message,
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
            let (conflict, reason, message) =
                conflict_condition(merged, "the exports of this Service agree");
            set(
                &mut conds,
                export_condition::CONFLICT,
                conflict,
                &reason,
                &message,
            );
            let clusters = merged.map(|m| m.clusters.join(", ")).unwrap_or_default();
            set(
                &mut conds,
                export_condition::READY,
                true,
                "Exported",
                &format!("exported to the peers; imported from {clusters}"),
            );
        }
    }
    (!same_conditions(&conds, &before)).then(|| Step::SetExportStatus {
        export: key_of(export),
        conditions: conds,
    })
}

/// Sets a condition as [`conditions::set_condition`] does, its transition (when its status
/// changes or it is new) at `now` rather than at the wall clock's time.
fn set_at(
    conds: &mut Vec<Condition>,
    type_: &str,
    status: ConditionStatus,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) {
    let was = conditions::find(conds, type_).map(|c| c.status.clone());
    conditions::set_condition(conds, type_, status, reason, message, generation);
    if was.as_deref() != Some(status.as_str())
        && let Some(c) = conds.iter_mut().find(|c| c.type_ == type_)
    {
        c.last_transition_time = now.clone();
    }
}

#[cfg(test)]
mod tests;
