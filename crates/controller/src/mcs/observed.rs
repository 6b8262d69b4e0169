//! What one pass of multi-cluster services reads, as values: this cluster's objects from the
//! caches and its peers with their records. The plan decides from nothing else.

use std::collections::BTreeMap;
use std::sync::Arc;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use tandem_api::mcs::{ExportedService, SERVICE_NAME_LABEL, ServiceExport, ServiceImport};
use tandem_core::mcs::ExportProperties;

use super::records::{Key, SLICE_MANAGED_BY_LABEL, SLICE_MANAGER, SOURCES_ANNOTATION};
use super::records::{is_ours, label};

/// This cluster's objects and its peers, as one pass sees them.
#[derive(Clone, Debug, Default)]
pub(super) struct Observed {
    /// This cluster's ID.
    pub(super) me: String,
    /// This cluster's pod CIDR, when known: its exports leave out endpoints outside it.
    pub(super) pod_cidr: Option<IpNet>,
    pub(super) exports: Vec<Arc<ServiceExport>>,
    pub(super) services: BTreeMap<Key, Arc<Service>>,
    /// Every EndpointSlice: of this cluster's Services and of its imports.
    pub(super) slices: Vec<Arc<EndpointSlice>>,
    /// The export records in this cluster's tenant namespaces (ours and the consumers').
    pub(super) records: Vec<Arc<ExportedService>>,
    pub(super) imports: BTreeMap<Key, Arc<ServiceImport>>,
    pub(super) namespaces: BTreeMap<String, Arc<Namespace>>,
    pub(super) peers: Vec<Peer>,
}

/// One peer, as far as services go.
#[derive(Clone, Debug)]
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
    /// The records in its tenant namespace for us (its and ours), read through the link to
    /// it; None without a link.
    pub(super) remote: Option<Vec<Arc<ExportedService>>>,
}

impl Peer {
    /// A peer known by its ID alone: unreadable, healthy, nothing opted in.
    pub(super) fn new(id: &str) -> Peer {
        Peer {
            id: id.to_string(),
            tenant_namespace: None,
            pod_cidr: None,
            allowed: Vec::new(),
            healthy: true,
            readable: false,
            remote: None,
        }
    }
}

impl Observed {
    /// The records in this cluster's namespace `ns`.
    pub(super) fn records_in<'a>(
        &'a self,
        ns: &'a str,
    ) -> impl Iterator<Item = &'a Arc<ExportedService>> + 'a {
        self.records
            .iter()
            .filter(move |r| r.metadata.namespace.as_deref() == Some(ns))
    }

    /// The EndpointSlices of ours that back the import `(ns, name)`.
    pub(super) fn import_slices<'a>(
        &'a self,
        (ns, name): &'a Key,
    ) -> impl Iterator<Item = &'a Arc<EndpointSlice>> + 'a {
        self.slices.iter().filter(move |s| {
            s.metadata.namespace.as_deref() == Some(ns.as_str())
                && label(s.as_ref(), SLICE_MANAGED_BY_LABEL) == Some(SLICE_MANAGER)
                && label(s.as_ref(), SERVICE_NAME_LABEL) == Some(name.as_str())
        })
    }

    /// The exports (properties) an import of ours was last written from.
    pub(super) fn stored_sources(&self, key: &Key) -> Option<Vec<ExportProperties>> {
        let import = self.imports.get(key)?;
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
}
