//! Importing what peers export: ServiceImports, derived Services and EndpointSlices, and removing stale ones.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use serde_json::json;
use tandem_api::mcs::{
    ClusterStatus, SERVICE_NAME_LABEL, ServiceImport, ServiceImportSpec, ServicePort,
    export_condition,
};
use tandem_api::{ConditionStatus, client, conditions, names};
use tandem_core::mcs::{ExportProperties, ImportType, Merged};

use super::pass::*;

impl Pass<'_> {
    /// Writes the ServiceImport of `key`, its derived Service and one EndpointSlice per
    /// source cluster and slice.
    pub(super) async fn import(
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
    pub(super) async fn remove_stale_imports(
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
}
