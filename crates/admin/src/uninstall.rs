//! `tandem uninstall`: removes everything Tandem put in a cluster, in the order that never
//! leaves the cluster worse off than before:
//!
//! 1. peerings first (refused unless forced: unpeering stops offloaded pods and removes a
//!    consumer's virtual node), each undone by the running controller on both sides;
//! 2. the admission webhooks, so that a controller that is gone never blocks pod creation;
//! 3. the controller (its Deployment, waited for until its pods are gone), then the webhooks
//!    again (a controller still stopping may have registered them anew);
//! 4. Tandem's finalizers, wherever they are, then its CRDs (and with them every Tandem
//!    object), the objects it labelled as its own, the CoreDNS stub domain, its namespaces;
//! 5. the MCS API's CRDs, only if no object of theirs is left (another implementation may
//!    share them).
//!
//! Every step is idempotent: an uninstall that was interrupted is run again.

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, Node, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tandem_api::{Peering, Tenant, names};

/// Why an uninstall stopped.
#[derive(Debug, thiserror::Error)]
pub enum UninstallError {
    #[error(
        "this cluster still peers with {0}: unpeer first (`tandem unpeer ID` on either side), \
         or run `tandem uninstall --force` to unpeer from every peer"
    )]
    Peered(String),
    #[error("uninstall step {step:?}")]
    Step {
        step: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("uninstall step {step:?}: {what} still present after {timeout:?}")]
    Timeout {
        step: &'static str,
        what: String,
        timeout: Duration,
    },
}

fn step(step: &'static str) -> impl FnOnce(kube::Error) -> UninstallError {
    move |source| UninstallError::Step { step, source }
}

/// Options of [`uninstall`].
#[derive(Clone, Debug)]
pub struct UninstallOptions {
    /// Unpeer from every peer (a peer that does not answer is left behind: only this side is
    /// undone) rather than refuse.
    pub force: bool,
    /// Also delete the data (claims) providers hold for this cluster, and that this cluster
    /// holds for its consumers.
    pub delete_data: bool,
    /// How long each waiting step may take.
    pub timeout: Duration,
}

/// The peers of this cluster: providers (Peerings) and consumers (Tenants), by cluster ID.
async fn peers(client: &Client) -> Result<Vec<String>, UninstallError> {
    let mut out = Vec::new();
    if let Some(list) = list_if_served::<Peering>(client).await? {
        out.extend(list.into_iter().map(|p| p.name_any()));
    }
    if let Some(list) = list_if_served::<Tenant>(client).await? {
        out.extend(list.into_iter().map(|t| t.name_any()));
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// Every object of kind `K`, or None when the kind is not served (its CRD is gone).
async fn list_if_served<K>(client: &Client) -> Result<Option<Vec<K>>, UninstallError>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match Api::<K>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => Ok(Some(list.items)),
        Err(e) if tandem_api::client::is_not_found(&e) => Ok(None),
        Err(e) => Err(step("peerings")(e)),
    }
}

/// Removes Tandem from the cluster of `client` (see the module documentation); `progress`
/// is told each step as it completes. Returns what was deliberately kept (retained data).
pub async fn uninstall(
    client: &Client,
    options: &UninstallOptions,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<Vec<String>, UninstallError> {
    let mut kept = Vec::new();
    let peers = peers(client).await?;
    if !peers.is_empty() && !options.force {
        return Err(UninstallError::Peered(peers.join(", ")));
    }
    for peer in &peers {
        if options.delete_data {
            let _ = crate::invite::mark_delete_data(client, peer).await;
        } else if let Ok(held) = crate::invite::data_held_with(client, peer).await {
            kept.extend(held);
        }
        let polite = crate::invite::unpeer(client, peer, false, options.timeout, &mut |p| {
            progress(&format!("… unpeering from {peer}: {p}"))
        })
        .await;
        match polite {
            Ok(()) => progress(&format!("unpeered from {peer}")),
            Err(e) => {
                progress(&format!(
                    "{peer} did not take part in unpeering ({}); undoing this side only",
                    tandem_controller::error::chain(&e)
                ));
                crate::invite::unpeer(client, peer, true, options.timeout, &mut |p| {
                    progress(&format!("… unpeering from {peer}: {p}"))
                })
                .await
                .map_err(|e| UninstallError::Timeout {
                    step: "unpeering",
                    what: format!(
                        "the peering with {peer} ({})",
                        tandem_controller::error::chain(&e)
                    ),
                    timeout: options.timeout,
                })?;
                progress(&format!("unpeered from {peer} (this side only)"));
            }
        }
    }

    delete_labelled(client, &erase::<MutatingWebhookConfiguration>(), "webhooks").await?;
    delete_labelled(
        client,
        &erase::<ValidatingWebhookConfiguration>(),
        "webhooks",
    )
    .await?;
    progress("admission webhooks removed: pod creation no longer calls Tandem");

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), names::SYSTEM_NAMESPACE);
    ignore_gone(
        deployments
            .delete(names::CONTROLLER_NAME, &DeleteParams::foreground())
            .await,
    )
    .map_err(step("controller"))?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), names::SYSTEM_NAMESPACE);
    let selector = format!("app.kubernetes.io/name={}", names::CONTROLLER_NAME);
    wait_until(
        "controller",
        "the controller's pods",
        options.timeout,
        async || {
            let gone = deployments.get_opt(names::CONTROLLER_NAME).await?.is_none()
                && pods
                    .list(&ListParams::default().labels(&selector))
                    .await?
                    .items
                    .is_empty();
            Ok(gone)
        },
    )
    .await?;
    delete_labelled(client, &erase::<MutatingWebhookConfiguration>(), "webhooks").await?;
    delete_labelled(
        client,
        &erase::<ValidatingWebhookConfiguration>(),
        "webhooks",
    )
    .await?;
    progress("controller stopped");

    // Finalizers first: nothing Tandem put on an object may outlive the controller that
    // would have removed it.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let tandem_crds: Vec<CustomResourceDefinition> = crds
        .list(&ListParams::default())
        .await
        .map_err(step("CRDs"))?
        .items
        .into_iter()
        .filter(|c| c.spec.group == tandem_api::GROUP)
        .collect();
    for crd in &tandem_crds {
        clear_finalizers(client, &resource_of(crd)).await?;
    }
    for kind in [
        erase::<Pod>(),
        erase::<PersistentVolumeClaim>(),
        erase::<Namespace>(),
        erase::<Service>(),
    ] {
        clear_finalizers(client, &kind).await?;
    }
    progress("Tandem's finalizers removed");
    for crd in &tandem_crds {
        ignore_gone(crds.delete(&crd.name_any(), &DeleteParams::default()).await)
            .map_err(step("CRDs"))?;
    }
    wait_until("CRDs", "Tandem's CRDs", options.timeout, async || {
        let left = crds.list(&ListParams::default()).await?;
        Ok(!left.items.iter().any(|c| c.spec.group == tandem_api::GROUP))
    })
    .await?;
    progress(&format!(
        "{} CustomResourceDefinitions deleted, and every Tandem object with them",
        tandem_crds.len()
    ));

    for kind in [
        erase::<ClusterRoleBinding>(),
        erase::<ClusterRole>(),
        erase::<RoleBinding>(),
        erase::<Role>(),
        erase::<Deployment>(),
        erase::<DaemonSet>(),
        erase::<Service>(),
        erase::<EndpointSlice>(),
        erase::<ServiceAccount>(),
        erase::<ConfigMap>(),
        erase::<Secret>(),
        erase::<Lease>(),
        erase::<CertificateSigningRequest>(),
        erase::<StorageClass>(),
        erase::<PriorityClass>(),
        erase::<PodDisruptionBudget>(),
        erase::<Node>(),
    ] {
        delete_labelled(client, &kind, "Tandem's objects").await?;
    }
    // Labels Tandem set on objects that are not its own (an offloaded namespace).
    remove_tandem_labels(client, &erase::<Namespace>()).await?;
    progress("Tandem's roles, bindings, Services, Secrets, settings and StorageClass deleted");

    let edited = crate::install::edit_corefile(client, crate::install::without_stub_domain)
        .await
        .map_err(step("CoreDNS"))?;
    if edited == Some(true) {
        progress("clusterset.local stub domain removed from ConfigMap kube-system/coredns");
    }

    let namespaces: Api<Namespace> = Api::all(client.clone());
    let owned = namespaces
        .list(&ListParams::default().labels(&managed_by()))
        .await
        .map_err(step("namespaces"))?;
    let mut deleting = Vec::new();
    for ns in owned.items {
        if ns.labels().contains_key(names::RETAINED_DATA_LABEL) && !options.delete_data {
            kept.push(format!(
                "namespace {} (data retained on unpeering)",
                ns.name_any()
            ));
            continue;
        }
        ignore_gone(
            namespaces
                .delete(&ns.name_any(), &DeleteParams::default())
                .await,
        )
        .map_err(step("namespaces"))?;
        deleting.push(ns.name_any());
    }
    wait_until(
        "namespaces",
        "Tandem's namespaces",
        options.timeout,
        async || {
            for name in &deleting {
                if namespaces.get_opt(name).await?.is_some() {
                    return Ok(false);
                }
            }
            Ok(true)
        },
    )
    .await?;
    progress(&format!("namespaces deleted: {}", deleting.join(", ")));

    // The MCS API's CRDs, unless another implementation's objects live in them.
    let mut mcs_kept = Vec::new();
    for crd in tandem_api::crds::upstream() {
        let name = crd.name_any();
        let Some(current) = crds.get_opt(&name).await.map_err(step("MCS CRDs"))? else {
            continue;
        };
        // Tandem's own (ServiceImports, the cluster's ID property) go first.
        let kind = resource_of(&current);
        clear_finalizers(client, &kind).await?;
        delete_labelled(client, &kind, "MCS CRDs").await?;
        let objects = Api::<DynamicObject>::all_with(client.clone(), &kind)
            .list_metadata(&ListParams::default())
            .await
            .map_err(step("MCS CRDs"))?;
        let others = objects.items.iter().filter(|o| {
            o.labels().get(names::MANAGED_BY_LABEL).map(String::as_str) != Some(names::MANAGED_BY)
                && o.metadata.deletion_timestamp.is_none()
        });
        if others.count() == 0 {
            ignore_gone(crds.delete(&name, &DeleteParams::default()).await)
                .map_err(step("MCS CRDs"))?;
        } else {
            mcs_kept.push(name);
        }
    }
    if mcs_kept.is_empty() {
        progress("the MCS API's CRDs deleted (no object of theirs was left)");
    } else {
        kept.push(format!(
            "the MCS API's CRDs {} (they hold objects Tandem did not create)",
            mcs_kept.join(", ")
        ));
    }
    Ok(kept)
}

fn erase<K: Resource<DynamicType = ()>>() -> ApiResource {
    ApiResource::erase::<K>(&())
}

fn managed_by() -> String {
    format!("{}={}", names::MANAGED_BY_LABEL, names::MANAGED_BY)
}

/// The API resource of a CRD's storage version.
fn resource_of(crd: &CustomResourceDefinition) -> ApiResource {
    let version = crd
        .spec
        .versions
        .iter()
        .find(|v| v.storage)
        .or(crd.spec.versions.first())
        .map(|v| v.name.clone())
        .unwrap_or_default();
    ApiResource {
        group: crd.spec.group.clone(),
        version: version.clone(),
        api_version: format!("{}/{version}", crd.spec.group),
        kind: crd.spec.names.kind.clone(),
        plural: crd.spec.names.plural.clone(),
    }
}

fn ignore_gone<T>(result: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match result {
        Ok(_) => Ok(()),
        Err(e) if tandem_api::client::is_not_found(&e) => Ok(()),
        Err(e) => Err(e),
    }
}

fn api_for(client: &Client, kind: &ApiResource, namespace: Option<&str>) -> Api<DynamicObject> {
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, kind),
        None => Api::all_with(client.clone(), kind),
    }
}

/// Deletes every object of `kind` labelled as Tandem's.
async fn delete_labelled(
    client: &Client,
    kind: &ApiResource,
    what: &'static str,
) -> Result<(), UninstallError> {
    let all: Api<DynamicObject> = Api::all_with(client.clone(), kind);
    let list = all
        .list_metadata(&ListParams::default().labels(&managed_by()))
        .await
        .map_err(step(what))?;
    for o in list.items {
        let api = api_for(client, kind, o.namespace().as_deref());
        ignore_gone(api.delete(&o.name_any(), &DeleteParams::default()).await)
            .map_err(step(what))?;
    }
    Ok(())
}

/// Removes Tandem's finalizers from every object of `kind` that carries one.
async fn clear_finalizers(client: &Client, kind: &ApiResource) -> Result<(), UninstallError> {
    let all: Api<DynamicObject> = Api::all_with(client.clone(), kind);
    let list = match all.list_metadata(&ListParams::default()).await {
        Ok(l) => l,
        Err(e) if tandem_api::client::is_not_found(&e) => return Ok(()),
        Err(e) => return Err(step("finalizers")(e)),
    };
    for o in list.items {
        let finalizers = o.finalizers();
        if !finalizers.iter().any(|f| f.starts_with("tandem.dev/")) {
            continue;
        }
        let keep: Vec<&String> = finalizers
            .iter()
            .filter(|f| !f.starts_with("tandem.dev/"))
            .collect();
        let api = api_for(client, kind, o.namespace().as_deref());
        ignore_gone(
            api.patch(
                &o.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": keep,
                    "resourceVersion": o.resource_version()}})),
            )
            .await,
        )
        .map_err(step("finalizers"))?;
    }
    Ok(())
}

/// Removes `tandem.dev/` labels from objects of `kind` that are not Tandem's own.
async fn remove_tandem_labels(client: &Client, kind: &ApiResource) -> Result<(), UninstallError> {
    let all: Api<DynamicObject> = Api::all_with(client.clone(), kind);
    let list = all
        .list_metadata(&ListParams::default())
        .await
        .map_err(step("labels"))?;
    for o in list.items {
        let labels = o.labels();
        if labels.get(names::MANAGED_BY_LABEL).map(String::as_str) == Some(names::MANAGED_BY) {
            continue;
        }
        let ours: serde_json::Map<String, serde_json::Value> = labels
            .keys()
            .filter(|k| k.starts_with("tandem.dev/"))
            .map(|k| (k.clone(), serde_json::Value::Null))
            .collect();
        if ours.is_empty() {
            continue;
        }
        let api = api_for(client, kind, o.namespace().as_deref());
        ignore_gone(
            api.patch(
                &o.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": ours}})),
            )
            .await,
        )
        .map_err(step("labels"))?;
    }
    Ok(())
}

/// Polls `done` until it holds, or fails naming `what` after `timeout`.
async fn wait_until(
    step_name: &'static str,
    what: &str,
    timeout: Duration,
    mut done: impl AsyncFnMut() -> Result<bool, kube::Error>,
) -> Result<(), UninstallError> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if done().await.map_err(step(step_name))? {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(UninstallError::Timeout {
                step: step_name,
                what: what.to_string(),
                timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
