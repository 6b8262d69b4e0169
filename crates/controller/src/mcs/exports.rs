//! This cluster's exports in a pass: which ServiceExports are valid, publishing them to every peer, and their statuses.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use serde_json::json;
use tandem_api::mcs::{ExportedService, ExportedServiceSpec, ServiceExport, export_condition};
use tandem_api::{client, conditions};
use tandem_core::mcs::Merged;

use super::pass::*;

impl Pass<'_> {
    /// This cluster's exports as records, and the status each ServiceExport should have
    /// (before conflicts are known).
    pub(super) fn own_exports(&self) -> (Records, Vec<(ServiceExport, Verdict)>) {
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

    /// Hands this cluster's records to every peer: into our tenant namespace for a consumer
    /// of ours, into our tenant namespace on a provider of ours (with our identity there).
    pub(super) async fn publish(
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

    /// Sets Valid, Conflict and Ready on this cluster's ServiceExports.
    pub(super) async fn export_statuses(
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
