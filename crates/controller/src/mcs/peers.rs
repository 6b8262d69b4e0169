//! The peers of a pass and what each exports: their sources, which may be imported here, and the refusals.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::FutureExt;
use ipnet::IpNet;
use kube::runtime::reflector::ObjectRef;
use tandem_api::mcs::{
    ExportedService, ExportedSlice, SERVICE_NAME_LABEL, SOURCE_CLUSTER_LABEL, exported_service_name,
};
use tandem_api::names;
use tandem_core::mcs::{
    ExportProperties, IMPORT_FROM_ANNOTATION, ImportNamespace, ImportScope, NotImported,
};

use crate::rbac::CONSUMER_NETWORK_PARAMETERS;

use super::pass::*;
use super::sanitize;

impl Pass<'_> {
    /// Every peer: from the Peerings (with a link) and the Tenants, not being deleted.
    pub(super) fn peers(&self) -> Vec<Peer> {
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
    pub(super) fn refuse(
        &self,
        peer: &Peer,
        (namespace, service): &(String, String),
        why: NotImported,
    ) {
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
    pub(super) fn virtual_node_ready(&self, node: &str) -> bool {
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

    /// The peer's exports this cluster imports: from records it wrote in our tenant namespace
    /// for it and in its tenant namespace for us, in namespaces we allow and have, with its
    /// addresses moved into our view of its pod CIDR. None while its records cannot be read.
    pub(super) fn peer_sources(
        &self,
        peer: &Peer,
        own: &Records,
    ) -> Option<Vec<((String, String), Source)>> {
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
    pub(super) fn may_import(
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
    pub(super) fn stored_sources(
        &self,
        (ns, name): &(String, String),
    ) -> Option<Vec<ExportProperties>> {
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
    pub(super) fn carried_sources(
        &self,
        peer: &Peer,
        own: &Records,
    ) -> Vec<((String, String), Source)> {
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
}
