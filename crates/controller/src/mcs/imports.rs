//! Acting on the plan's imports: writing a ServiceImport, its derived Service and its
//! EndpointSlices, and removing those no export backs.

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tandem_api::mcs::{SERVICE_NAME_LABEL, ServiceImport};
use tandem_api::{client, names};

use super::pass::{Pass, SyncError, Verb, Write};
use super::plan::Step;
use super::records::{Key, SLICE_MANAGED_BY_LABEL, SLICE_MANAGER};

impl Pass<'_> {
    /// Makes the steps of the import `key`: the ServiceImport first (a new one's UID owns the
    /// rest), then its derived Service and its EndpointSlices side by side, then — once both
    /// are written — its status.
    pub(super) async fn write_import(
        &self,
        (ns, name): &Key,
        steps: &[Step],
    ) -> Result<(), SyncError> {
        let write = |verb, kind, object: &str| Write::new(verb, kind, ns, object);
        let imports: Api<ServiceImport> = Api::namespaced(self.ctx.client.clone(), ns);
        let mut created_uid = None;
        for step in steps {
            match step {
                Step::CreateImport(new) => {
                    match imports.create(&PostParams::default(), new).await {
                        Ok(i) => created_uid = Some(i.metadata.uid.unwrap_or_default()),
                        // The namespace went (or is going) meanwhile: nothing to import into.
                        Err(e) if client::is_not_found(&e) || client::is_gone_or_forbidden(&e) => {
                            return Ok(());
                        }
                        Err(e) => {
                            return Err(write(Verb::Creating, "ServiceImport", name).failed(e));
                        }
                    }
                }
                Step::ReplaceImport(updated) => {
                    imports
                        .replace(name, &PostParams::default(), updated)
                        .await
                        .map_err(|e| write(Verb::Updating, "ServiceImport", name).failed(e))?;
                }
                _ => {}
            }
        }
        // The Service (and the import's IP) and the slices are independent once the import
        // exists: written side by side, the import is usable one write sooner.
        let service_step = async {
            for step in steps {
                let Step::ApplyService {
                    service,
                    recreate,
                    ips,
                    ..
                } = step
                else {
                    continue;
                };
                let mut service = service.clone();
                if let Some(uid) = &created_uid {
                    service["metadata"]["ownerReferences"][0]["uid"] = json!(uid);
                }
                let derived = service["metadata"]["name"].as_str().unwrap_or_default();
                let service_api: Api<Service> = Api::namespaced(self.ctx.client.clone(), ns);
                if *recreate {
                    // clusterIP is immutable: the import changed type, so the Service is remade.
                    client::delete_if_exists(&service_api, derived, &DeleteParams::default())
                        .await
                        .map_err(|e| write(Verb::Deleting, "Service", derived).failed(e))?;
                }
                let pp = PatchParams::apply(names::FIELD_MANAGER).force();
                let applied = service_api
                    .patch(derived, &pp, &Patch::Apply(&service))
                    .await
                    .map_err(|e| write(Verb::Applying, "Service", derived).failed(e))?;
                let headless = service["spec"]["clusterIP"] == "None";
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
                        .map_err(|e| write(Verb::Ip, "ServiceImport", name).failed(e))?;
                }
            }
            Ok::<(), SyncError>(())
        };
        let slices_step = async {
            let slices: Api<EndpointSlice> = Api::namespaced(self.ctx.client.clone(), ns);
            // Each slice on its own: one that cannot be written does not hold back the others.
            let mut result = Ok(());
            for step in steps {
                let (slice_name, written) = match step {
                    Step::CreateSlice { slice, .. } | Step::ReplaceSlice { slice, .. } => {
                        let mut slice = slice.clone();
                        if let Some(uid) = &created_uid {
                            for owner in slice.metadata.owner_references.iter_mut().flatten() {
                                owner.uid.clone_from(uid);
                            }
                        }
                        let slice_name = slice.metadata.name.clone().unwrap_or_default();
                        let written = if matches!(step, Step::ReplaceSlice { .. }) {
                            slices
                                .replace(&slice_name, &PostParams::default(), &slice)
                                .await
                                .map(drop)
                        } else {
                            // Already there (the cache is behind): the next pass compares it.
                            match slices.create(&PostParams::default(), &slice).await {
                                Err(e) if client::is_conflict(&e) => Ok(()),
                                created => created.map(drop),
                            }
                        };
                        let what = write(Verb::Writing, "EndpointSlice", &slice_name);
                        (what, written)
                    }
                    Step::DeleteSlice { name: stale, .. } => (
                        write(Verb::Deleting, "EndpointSlice", stale),
                        client::delete_if_exists(&slices, stale, &DeleteParams::default()).await,
                    ),
                    _ => continue,
                };
                if let Err(e) = written {
                    result = Err(slice_name.failed(e));
                }
            }
            result
        };
        let (service_written, slices_written) = tokio::join!(service_step, slices_step);
        service_written?;
        slices_written?;
        // Its status last: the endpoints are what traffic waits for.
        for step in steps {
            if let Step::SetImportStatus { status, .. } = step {
                imports
                    .patch_status(
                        name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"status": status})),
                    )
                    .await
                    .map_err(|e| write(Verb::Status, "ServiceImport", name).failed(e))?;
            }
        }
        Ok(())
    }

    /// Removes an import no export backs: its EndpointSlices and its derived Service (when
    /// ours) first — garbage collection would take them too, later — then the import.
    pub(super) async fn remove_import(
        &self,
        (ns, name): &Key,
        service: Option<&str>,
    ) -> Result<(), SyncError> {
        let dp = DeleteParams::default();
        let slices: Api<EndpointSlice> = Api::namespaced(self.ctx.client.clone(), ns);
        let services: Api<Service> = Api::namespaced(self.ctx.client.clone(), ns);
        let imports: Api<ServiceImport> = Api::namespaced(self.ctx.client.clone(), ns);
        let selector =
            format!("{SLICE_MANAGED_BY_LABEL}={SLICE_MANAGER},{SERVICE_NAME_LABEL}={name}");
        let removed = async {
            slices
                .delete_collection(&dp, &ListParams::default().labels(&selector))
                .await?;
            if let Some(derived) = service {
                client::delete_if_exists(&services, derived, &dp).await?;
            }
            client::delete_if_exists(&imports, name, &dp).await
        }
        .await;
        removed.map_err(|e| Write::new(Verb::Removing, "ServiceImport", ns, name).failed(e))
    }
}
