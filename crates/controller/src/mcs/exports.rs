//! Acting on the plan's exports: this cluster's records where each peer reads them, and the
//! status of its ServiceExports.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tandem_api::client;
use tandem_api::mcs::{ExportedService, ServiceExport};

use super::pass::{Pass, SyncError, Verb, Write};
use super::plan::{Place, Step};
use super::records::Key;

impl Pass<'_> {
    /// Makes the steps of this cluster's records at `place`, in order; the first that fails
    /// ends them (the next pass starts over).
    pub(super) async fn write_records(
        &self,
        place: &Place,
        steps: &[Step],
    ) -> Result<(), SyncError> {
        let api: Api<ExportedService> = match place {
            Place::Tenant(ns) => Api::namespaced(self.ctx.client.clone(), ns),
            Place::Provider(id) => {
                let Some(link) = self.links.get(id) else {
                    return Ok(());
                };
                Api::namespaced(link.client.clone(), &link.remote_tenant_namespace)
            }
        };
        let ns = api.namespace().unwrap_or_default().to_string();
        let write = |verb, name: &str| Write::new(verb, "ExportedService", &ns, name);
        for step in steps {
            match step {
                Step::CreateRecord { record, .. } => {
                    let name = record.metadata.name.as_deref().unwrap_or_default();
                    match api.create(&PostParams::default(), record).await {
                        Ok(_) => {}
                        Err(e) if client::is_conflict(&e) => {}
                        Err(e) => return Err(write(Verb::Creating, name).failed(e)),
                    }
                }
                Step::ReplaceRecord { record, .. } => {
                    let name = record.metadata.name.as_deref().unwrap_or_default();
                    api.replace(name, &PostParams::default(), record)
                        .await
                        .map_err(|e| write(Verb::Updating, name).failed(e))?;
                }
                Step::DeleteRecord { name, .. } => {
                    client::delete_if_exists(&api, name, &DeleteParams::default())
                        .await
                        .map_err(|e| write(Verb::Deleting, name).failed(e))?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Sets the conditions of this cluster's ServiceExport `key` (gone meanwhile: nothing to
    /// say).
    pub(super) async fn set_export_status(
        &self,
        (ns, name): &Key,
        conditions: &[Condition],
    ) -> Result<(), SyncError> {
        let api: Api<ServiceExport> = Api::namespaced(self.ctx.client.clone(), ns);
        let patched = api
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"conditions": conditions}})),
            )
            .await;
        match patched {
            Err(e) if !client::is_not_found(&e) => {
                Err(Write::new(Verb::Status, "ServiceExport", ns, name).failed(e))
            }
            _ => Ok(()),
        }
    }
}
