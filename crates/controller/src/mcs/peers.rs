//! The peers of a pass, observed: who they are (the Peerings and Tenants here), whether
//! their records can be read, and whether their endpoints may be ready.

use std::collections::BTreeMap;

use futures::FutureExt;
use ipnet::IpNet;
use kube::runtime::reflector::ObjectRef;
use tandem_api::names;

use crate::rbac::CONSUMER_NETWORK_PARAMETERS;

use super::observed::Peer;
use super::pass::Pass;

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
            let peer = peers.entry(id.clone()).or_insert_with(|| Peer::new(&id));
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
            let peer = peers.entry(id.clone()).or_insert_with(|| Peer::new(&id));
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
        // What each peer with a link wrote for us, read through the link.
        for peer in peers.values_mut() {
            peer.remote = self.remotes.get(&peer.id).map(|r| r.store.state());
        }
        peers.into_values().collect()
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
}
