//! Twin namespaces: for each `RemoteNamespace` a consumer files in its tenant namespace, the
//! provider creates the twin Namespace and lets the consumer's peer identity work in it (a
//! RoleBinding to `tandem:peer-twin`). It never takes over a namespace it did not create for
//! that consumer, and deleting the request deletes the namespace — unless it holds
//! PersistentVolumeClaims and the request was not annotated `tandem.dev/delete-data`: then the
//! namespace is retained for its data (see [`retain_if_holding_data`]). The storage part of the
//! consumer's grant becomes the twin's ResourceQuota `tandem-grant`, and the pod access its
//! Tenant allows (`spec.podAccess`: exec, attach, port-forward) one RoleBinding per capability.
//! A Tenant's change re-reconciles the consumer's requests, so both follow it.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, ResourceQuota};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{Event, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;
use tandem_api::client;
use tandem_api::{NamespaceMappingStrategy, RemoteNamespace, ShadowPod, Tenant, names};

use crate::context::{Context, Ctx};
use crate::install::apply;
use crate::rbac::{PEER_TWIN_ROLE, PodCapability};

/// Name of the RoleBinding giving the peer identity its rights in a twin namespace.
pub const TWIN_ROLE_BINDING: &str = "tandem:peer-twin";
/// Name of the RoleBinding letting the peer identity exec into the twin's pods.
pub const EXEC_ROLE_BINDING: &str = "tandem:peer-exec";
/// Name of the RoleBinding letting the peer identity attach to the twin's pods.
pub const ATTACH_ROLE_BINDING: &str = "tandem:peer-attach";
/// Name of the RoleBinding letting the peer identity port-forward to the twin's pods.
pub const PORTFORWARD_ROLE_BINDING: &str = "tandem:peer-portforward";

/// The RoleBinding in a twin namespace granting `capability`, while the Tenant allows it.
pub fn pod_access_binding(capability: PodCapability) -> &'static str {
    match capability {
        PodCapability::Exec => EXEC_ROLE_BINDING,
        PodCapability::Attach => ATTACH_ROLE_BINDING,
        PodCapability::PortForward => PORTFORWARD_ROLE_BINDING,
    }
}

/// Every RoleBinding of the peer identity that the provider may put in a twin namespace.
pub(crate) fn peer_bindings() -> impl Iterator<Item = &'static str> {
    std::iter::once(TWIN_ROLE_BINDING).chain(PodCapability::ALL.map(pod_access_binding))
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("RemoteNamespace {0}: {1}")]
    Kube(String, &'static str, #[source] kube::Error),
    #[error("RemoteNamespace {0}: waiting for twin namespace {1} to terminate")]
    Terminating(String, String),
    #[error("RemoteNamespace {0}: finalizer")]
    Finalizer(
        String,
        #[source] Box<kube::runtime::finalizer::Error<Error>>,
    ),
}

/// Runs the reconciler until the controller stops.
pub async fn run(ctx: Ctx) {
    let api: Api<RemoteNamespace> = Api::all(ctx.client.clone());
    let controller = Controller::new(api, watcher::Config::default());
    // A Tenant's grant and pod access shape every twin namespace of its consumer: a change to
    // it re-reconciles the requests in its tenant namespace (rather than the Tenant reconciler
    // writing into twin namespaces too), so one reconciler owns what a twin holds.
    let requests = controller.store();
    controller
        .watches(
            Api::<Tenant>::all(ctx.client.clone()),
            watcher::Config::default(),
            move |tenant| {
                let tenant_namespace = tenant.namespace();
                requests
                    .state()
                    .into_iter()
                    .filter(|rn| rn.namespace() == tenant_namespace)
                    .map(|rn| ObjectRef::from_obj(&*rn))
                    .collect::<Vec<_>>()
            },
        )
        .run(
            crate::metrics::timed(ctx.metrics.clone(), "remotenamespace", reconcile),
            error_policy,
            ctx,
        )
        .for_each(|_| async {})
        .await;
}

fn error_policy(_rn: Arc<RemoteNamespace>, error: &Error, _ctx: Arc<Context>) -> Action {
    match error {
        Error::Terminating(..) => tracing::debug!(%error),
        _ => tracing::warn!(error = %crate::error::chain(error), "reconciling"),
    }
    Action::requeue(Duration::from_secs(1))
}

/// The Pod Security admission label of a namespace: the level its pods are held to.
pub const POD_SECURITY_ENFORCE_LABEL: &str = "pod-security.kubernetes.io/enforce";
/// The version of the Pod Security Standards the level is read at.
const POD_SECURITY_ENFORCE_VERSION_LABEL: &str = "pod-security.kubernetes.io/enforce-version";

fn key(rn: &RemoteNamespace) -> String {
    format!("{}/{}", rn.namespace().unwrap_or_default(), rn.name_any())
}

async fn reconcile(rn: Arc<RemoteNamespace>, ctx: Arc<Context>) -> Result<Action, Error> {
    let k = key(&rn);
    let api: Api<RemoteNamespace> =
        Api::namespaced(ctx.client.clone(), &rn.namespace().unwrap_or_default());
    finalizer(&api, names::FINALIZER, rn, |event| async {
        match event {
            Event::Apply(rn) => ensure(&ctx.client, &rn).await,
            Event::Cleanup(rn) => cleanup(&ctx.client, &rn).await,
        }
    })
    .await
    .map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        other => Error::Finalizer(k, Box::new(other)),
    })
}

/// What the request's namespace says about the consumer: its ID if it is a tenant namespace.
async fn consumer_of(client: &Client, rn: &RemoteNamespace) -> Result<Option<String>, Error> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let tenant = rn.namespace().unwrap_or_default();
    let ns = namespaces
        .get_opt(&tenant)
        .await
        .map_err(|e| Error::Kube(key(rn), "reading its tenant namespace", e))?;
    Ok(ns.and_then(|ns| {
        let labels = ns.labels();
        labels.get(names::TENANT_NAMESPACE_LABEL)?;
        labels.get(names::REMOTE_CLUSTER_LABEL).cloned()
    }))
}

/// Namespaces that well-known add-ons install into: a consumer that named one before this
/// cluster's admin installed the add-on would read (and could delete) what the admin puts there.
pub const RESERVED_NAMESPACES: [&str; 22] = [
    "monitoring",
    "observability",
    "logging",
    "cert-manager",
    "ingress-nginx",
    "istio-system",
    "istio-ingress",
    "linkerd",
    "linkerd-viz",
    "cilium",
    "calico-system",
    "calico-apiserver",
    "tigera-operator",
    "metallb-system",
    "flux-system",
    "argocd",
    "gatekeeper-system",
    "kyverno",
    "velero",
    "vault",
    "external-secrets",
    "local-path-storage",
];

/// Why `name` can never be a twin namespace, if it cannot: invalid, or reserved for the
/// system, for Tandem or for well-known add-ons (even when it does not exist yet).
fn reserved(name: &str) -> Option<&'static str> {
    if !tandem_apimachinery::validation::is_dns1123_label(name) {
        Some("not a valid namespace name")
    } else if name == "default" || name.starts_with("kube-") || name.starts_with("openshift") {
        Some("reserved for the system")
    } else if name.starts_with("tandem-") || name == names::SYSTEM_NAMESPACE {
        Some("reserved for Tandem")
    } else if RESERVED_NAMESPACES.contains(&name) {
        Some("reserved for an add-on this cluster's admin may install")
    } else {
        None
    }
}

/// Whether `ns` is the twin namespace this request created for `consumer`.
fn is_twin_of(ns: &Namespace, consumer: &str, origin: &str) -> bool {
    let labels = ns.labels();
    labels.contains_key(names::TWIN_NAMESPACE_LABEL)
        && labels.get(names::ORIGIN_CLUSTER_LABEL).map(String::as_str) == Some(consumer)
        && labels
            .get(names::ORIGIN_NAMESPACE_LABEL)
            .map(String::as_str)
            == Some(origin)
}

/// The namespace mapping strategy a twin name shows (the provider does not take the
/// consumer's word for it): the consumer's name is EnforceSameName, `<ns>-<consumer>` is
/// DefaultName, anything else SelectedName.
fn mapping_of(twin: &str, origin: &str, consumer: &str) -> NamespaceMappingStrategy {
    let default = tandem_core::offloading::twin_namespace_name(
        tandem_core::offloading::NamespaceMapping::DefaultName,
        origin,
        consumer,
        None,
    );
    if twin == origin {
        NamespaceMappingStrategy::EnforceSameName
    } else if default.as_deref() == Ok(twin) {
        NamespaceMappingStrategy::DefaultName
    } else {
        NamespaceMappingStrategy::SelectedName
    }
}

/// Why the consumer's Tenant does not allow this twin namespace (its mapping strategy or its
/// pods' offloading strategy), naming the PeeringPolicy that set the limit.
fn strategy_refusal(tenant: &Tenant, rn: &RemoteNamespace, consumer: &str) -> Option<String> {
    let by = match tenant.annotations().get(names::POLICY_ANNOTATION) {
        Some(p) => format!("PeeringPolicy {p}"),
        None => format!("Tenant {}/{consumer}", names::tenant_namespace(consumer)),
    };
    let mapping = mapping_of(&rn.spec.namespace, &rn.spec.origin_namespace, consumer);
    // Absent: DefaultName alone (see TenantSpec::allowed_namespace_mapping_strategies).
    let default_only = [NamespaceMappingStrategy::DefaultName];
    let (allowed, mapping_by): (&[NamespaceMappingStrategy], String) = match &tenant
        .spec
        .allowed_namespace_mapping_strategies
    {
        Some(allowed) => (allowed, by.clone()),
        None => (
            &default_only,
            format!(
                "the default of Tenant {}/{consumer} (the admin may allow more: spec.allowedNamespaceMappingStrategies)",
                names::tenant_namespace(consumer)
            ),
        ),
    };
    // A selected name that happens to be the consumer's is allowed as a selection.
    let selected_same = mapping == NamespaceMappingStrategy::EnforceSameName
        && allowed.contains(&NamespaceMappingStrategy::SelectedName);
    if !(allowed.contains(&mapping) || selected_same) {
        return Some(format!(
            "namespace mapping strategy {mapping:?} (twin namespace {}) is not allowed for consumer {consumer} by {mapping_by} (allowed: {allowed:?})",
            rn.spec.namespace
        ));
    }
    // The strategy is the consumer's word (where its pods go is decided on its side): a
    // limit refuses what it says, and a request that does not say.
    if let Some(allowed) = &tenant.spec.allowed_pod_offloading_strategies {
        match rn.spec.pod_offloading_strategy {
            None => {
                return Some(format!(
                    "namespace {} does not say its pod offloading strategy, which {by} limits for consumer {consumer} (allowed: {allowed:?}); upgrade its Tandem",
                    rn.spec.origin_namespace
                ));
            }
            Some(pods) if !allowed.contains(&pods) => {
                return Some(format!(
                    "pod offloading strategy {pods:?} of namespace {} is not allowed for consumer {consumer} by {by} (allowed: {allowed:?})",
                    rn.spec.origin_namespace
                ));
            }
            Some(_) => {}
        }
    }
    None
}

async fn ensure(client: &Client, rn: &RemoteNamespace) -> Result<Action, Error> {
    let k = key(rn);
    let twin = rn.spec.namespace.clone();
    let origin = rn.spec.origin_namespace.clone();
    let Some(consumer) = consumer_of(client, rn).await? else {
        set_status(
            client,
            rn,
            "Failed",
            "not in a tenant namespace: twin namespaces are only created for peered consumers",
        )
        .await?;
        return Ok(Action::await_change());
    };
    if let Some(why) = reserved(&twin) {
        set_status(client, rn, "Failed", &format!("namespace {twin}: {why}")).await?;
        return Ok(Action::await_change());
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let existing = namespaces
        .get_opt(&twin)
        .await
        .map_err(|e| Error::Kube(k.clone(), "reading the twin namespace", e))?;
    if let Some(existing) = &existing
        && !is_twin_of(existing, &consumer, &origin)
    {
        set_status(
            client,
            rn,
            "Failed",
            &format!(
                "namespace {twin} already exists and is not the twin of {consumer}/{origin}; choose another name (--namespace-mapping-strategy SelectedName)"
            ),
        )
        .await?;
        return Ok(Action::requeue(Duration::from_secs(30)));
    }
    // What a twin namespace holds follows the consumer's Tenant; without one in force (being
    // unpeered, or not yet peered) nothing is granted, and a twin retained for its data on
    // unpeering is not taken back. The Tenant's watch requeues this request when that changes.
    let tenant = Api::<Tenant>::namespaced(client.clone(), &rn.namespace().unwrap_or_default())
        .get_opt(&consumer)
        .await
        .map_err(|e| Error::Kube(k.clone(), "reading the consumer's Tenant", e))?;
    let Some(tenant) = tenant.filter(|t| t.metadata.deletion_timestamp.is_none()) else {
        set_status(
            client,
            rn,
            "Pending",
            &format!("no Tenant in force for consumer {consumer} (unpeering?)"),
        )
        .await?;
        return Ok(Action::await_change());
    };
    if let Some(why) = strategy_refusal(&tenant, rn, &consumer) {
        set_status(client, rn, "Failed", &why).await?;
        return Ok(Action::await_change());
    }
    if existing.is_none() {
        let cap = tenant
            .spec
            .max_twin_namespaces
            .unwrap_or(tandem_api::TenantSpec::DEFAULT_MAX_TWIN_NAMESPACES);
        let twins = namespaces
            .list(&ListParams::default().labels(&format!(
                "{}={consumer},{}",
                names::ORIGIN_CLUSTER_LABEL,
                names::TWIN_NAMESPACE_LABEL
            )))
            .await
            .map_err(|e| Error::Kube(k.clone(), "counting the consumer's twin namespaces", e))?;
        let held = twins.items.iter().filter(|n| n.name_any() != twin).count();
        if held >= cap as usize {
            set_status(
                client,
                rn,
                "Failed",
                &format!(
                    "consumer {consumer} already has {held} twin namespaces, the most Tenant {}/{consumer} allows (spec.maxTwinNamespaces: {cap})",
                    names::tenant_namespace(&consumer)
                ),
            )
            .await?;
            return Ok(Action::requeue(Duration::from_secs(60)));
        }
    }
    if let Some(existing) = &existing {
        if existing.labels().contains_key(names::RETAINED_DATA_LABEL) {
            // Kept from a peering under another key: the cluster ID alone is self-asserted,
            // so the data is not handed to whoever claims it next.
            let kept_for = existing
                .annotations()
                .get(names::KEY_FINGERPRINT_ANNOTATION);
            let key = tenant.annotations().get(names::KEY_FINGERPRINT_ANNOTATION);
            if let Some(kept_for) = kept_for
                && key != Some(kept_for)
            {
                set_status(
                    client,
                    rn,
                    "Failed",
                    &format!(
                        "namespace {twin} holds data kept from an earlier peering of {consumer} under key {kept_for}, and this peering's key is {}: it is not re-adopted; the provider's admin deletes the namespace, or re-keys Tenant {}/{consumer} if the consumer really changed its key",
                        key.map_or("not recorded", String::as_str),
                        names::tenant_namespace(&consumer)
                    ),
                )
                .await?;
                return Ok(Action::requeue(Duration::from_secs(60)));
            }
            // Offloaded again: the retained claims are the consumer's to adopt.
            namespaces
                .patch(
                    &twin,
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({"metadata": {"labels": {names::RETAINED_DATA_LABEL: null}}}),
                    ),
                )
                .await
                .map_err(|e| Error::Kube(k.clone(), "reclaiming a retained twin namespace", e))?;
        }
        if existing.metadata.deletion_timestamp.is_some() {
            set_status(
                client,
                rn,
                "Pending",
                &format!("namespace {twin} is terminating"),
            )
            .await?;
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
    }
    let mut labels = json!({
        names::MANAGED_BY_LABEL: names::MANAGED_BY,
        names::TWIN_NAMESPACE_LABEL: "true",
        names::ORIGIN_CLUSTER_LABEL: consumer,
        names::ORIGIN_NAMESPACE_LABEL: origin,
    });
    if let Some(pods) = rn.spec.pod_offloading_strategy {
        labels[names::POD_OFFLOADING_LABEL] = json!(pods);
    }
    // What the shadow pod controller enforces where it makes the real pods, said again to the
    // API server: a real kube-apiserver's Pod Security admission then refuses anything that
    // would reach the twin by another path.
    labels[POD_SECURITY_ENFORCE_LABEL] = json!(tenant.spec.pod_security.unwrap_or_default());
    labels[POD_SECURITY_ENFORCE_VERSION_LABEL] = json!("latest");
    let ns: Namespace = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": twin, "labels": labels},
    }))
    .expect("static manifest");
    apply(&namespaces, &ns)
        .await
        .map_err(|e| Error::Kube(k.clone(), "creating the twin namespace", e))?;
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), &twin);
    apply(
        &bindings,
        &peer_binding(&twin, TWIN_ROLE_BINDING, PEER_TWIN_ROLE, &tenant),
    )
    .await
    .map_err(|e| {
        Error::Kube(
            k.clone(),
            "binding the peer identity in the twin namespace",
            e,
        )
    })?;
    let access = tenant.spec.pod_access();
    for capability in PodCapability::ALL {
        let name = pod_access_binding(capability);
        if capability.allowed_by(&access) {
            let binding = peer_binding(&twin, name, capability.role_name(), &tenant);
            apply(&bindings, &binding)
                .await
                .map_err(|e| Error::Kube(k.clone(), "granting pod access the Tenant allows", e))?;
        } else {
            client::ok_if_not_found(bindings.delete(name, &DeleteParams::default()).await)
                .map_err(|e| Error::Kube(k.clone(), "revoking pod access the Tenant refuses", e))?;
        }
    }
    apply_grant_quota(client, rn, &tenant, &twin).await?;
    set_status(client, rn, "Ready", "").await?;
    Ok(Action::requeue(Duration::from_secs(60)))
}

async fn cleanup(client: &Client, rn: &RemoteNamespace) -> Result<Action, Error> {
    let k = key(rn);
    let twin = &rn.spec.namespace;
    let Some(consumer) = consumer_of(client, rn).await? else {
        return Ok(Action::await_change());
    };
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let Some(existing) = namespaces
        .get_opt(twin)
        .await
        .map_err(|e| Error::Kube(k.clone(), "reading the twin namespace", e))?
    else {
        return Ok(Action::await_change());
    };
    // A refused request never owned the namespace: leave it alone.
    if !is_twin_of(&existing, &consumer, &rn.spec.origin_namespace) {
        return Ok(Action::await_change());
    }
    if existing.metadata.deletion_timestamp.is_none() {
        // Data is never deleted unless asked: a twin holding claims is kept, without its pods.
        let key = Api::<Tenant>::namespaced(client.clone(), &names::tenant_namespace(&consumer))
            .get_opt(&consumer)
            .await
            .map_err(|e| Error::Kube(k.clone(), "reading the consumer's Tenant", e))?
            .and_then(|t| {
                t.annotations()
                    .get(names::KEY_FINGERPRINT_ANNOTATION)
                    .cloned()
            });
        if !rn.annotations().contains_key(names::DELETE_DATA_ANNOTATION)
            && retain_if_holding_data(client, twin, &consumer, key.as_deref(), false)
                .await
                .map_err(|e| Error::Kube(k.clone(), "retaining the twin namespace's claims", e))?
        {
            return Ok(Action::await_change());
        }
        match namespaces.delete(twin, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(e) if client::is_not_found(&e) => return Ok(Action::await_change()),
            Err(e) => return Err(Error::Kube(k, "deleting the twin namespace", e)),
        }
    }
    Err(Error::Terminating(k, twin.clone()))
}

/// The RoleBinding `name` of `tenant`'s consumer to ClusterRole `role` in `twin` (bound to
/// the subjects its Tenant says: the group of its key).
fn peer_binding(twin: &str, name: &str, role: &str, tenant: &Tenant) -> RoleBinding {
    serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": twin,
                     "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": crate::rbac::peer_subjects(tenant),
    }))
    .expect("static manifest")
}

/// The storage part of the consumer's grant in `tenant` (`requests.storage`,
/// `persistentvolumeclaims`) as the ResourceQuota `tandem-grant` of the twin namespace, so that
/// kube-apiserver's quota admission bounds the claims the consumer creates there. Per twin
/// namespace: a consumer with several twins may use the storage grant in each.
async fn apply_grant_quota(
    client: &Client,
    rn: &RemoteNamespace,
    tenant: &Tenant,
    twin: &str,
) -> Result<(), Error> {
    let hard: BTreeMap<String, String> = tenant
        .spec
        .grant
        .iter()
        .filter(|(k, _)| names::STORAGE_GRANT_KEYS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect();
    let quota: ResourceQuota = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": names::GRANT_QUOTA, "namespace": twin,
                     "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY}},
        "spec": {"hard": hard},
    }))
    .expect("static manifest");
    apply(&Api::namespaced(client.clone(), twin), &quota)
        .await
        .map_err(|e| Error::Kube(key(rn), "applying the storage quota", e))?;
    Ok(())
}

/// If `twin` holds claims, keeps it (labelled `tandem.dev/retained-data`, with an Event naming
/// them) and deletes only its shadow pods, so nothing of the consumer runs on; Ok(true) if so.
/// `revoke` also removes the consumer's access to it (unpeering); after unoffloading the
/// consumer keeps it, so that deleting its claim still deletes the copy here.
pub async fn retain_if_holding_data(
    client: &Client,
    twin: &str,
    consumer: &str,
    key: Option<&str>,
    revoke: bool,
) -> Result<bool, kube::Error> {
    let claims: Vec<String> = Api::<PersistentVolumeClaim>::namespaced(client.clone(), twin)
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    if claims.is_empty() {
        return Ok(false);
    }
    Api::<ShadowPod>::namespaced(client.clone(), twin)
        .delete_collection(&DeleteParams::background(), &ListParams::default())
        .await?;
    if revoke {
        let bindings = Api::<RoleBinding>::namespaced(client.clone(), twin);
        for name in peer_bindings() {
            client::ok_if_not_found(bindings.delete(name, &DeleteParams::default()).await)?;
        }
    }
    let mut metadata = json!({"labels": {names::RETAINED_DATA_LABEL: "true"}});
    // The key it is kept for: only a peering under that key adopts it again. (Retained a second
    // time once the Tenant is gone, with no key to hand, the one recorded stays.)
    if let Some(key) = key {
        metadata["annotations"] = json!({names::KEY_FINGERPRINT_ANNOTATION: key});
    }
    Api::<Namespace>::all(client.clone())
        .patch(
            twin,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": metadata })),
        )
        .await?;
    let message = format!(
        "kept for the data of consumer {consumer}: PersistentVolumeClaims {}; delete the namespace to delete them",
        claims.join(", ")
    );
    tracing::info!(namespace = %twin, %consumer, claims = %claims.join(","), "twin namespace retained for its data");
    crate::events::record(
        client,
        twin,
        json!({"apiVersion": "v1", "kind": "Namespace", "name": twin}),
        "DataRetained",
        &message,
        true,
    )
    .await;
    Ok(true)
}

async fn set_status(
    client: &Client,
    rn: &RemoteNamespace,
    phase: &str,
    message: &str,
) -> Result<(), Error> {
    let current = rn.status.as_ref();
    if current.and_then(|s| s.phase.as_deref()) == Some(phase)
        && current.and_then(|s| s.message.as_deref()).unwrap_or("") == message
    {
        return Ok(());
    }
    if phase == "Failed" {
        tracing::warn!(remote_namespace = %key(rn), %message, "refused");
    }
    let api: Api<RemoteNamespace> =
        Api::namespaced(client.clone(), &rn.namespace().unwrap_or_default());
    let message = (!message.is_empty()).then_some(message);
    api.patch_status(
        &rn.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": phase, "message": message}})),
    )
    .await
    .map_err(|e| Error::Kube(key(rn), "writing its status", e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_capability_has_its_own_binding_to_its_own_role() {
        for capability in PodCapability::ALL {
            let name = pod_access_binding(capability);
            let mut tenant = Tenant::new(
                "rome",
                serde_json::from_value(json!({"clusterID": "rome"})).unwrap(),
            );
            tenant.metadata.annotations = Some(
                [(
                    names::KEY_FINGERPRINT_ANNOTATION.to_string(),
                    "sha256:ab12".to_string(),
                )]
                .into(),
            );
            let binding = peer_binding("app-rome", name, capability.role_name(), &tenant);
            assert_eq!(binding.metadata.name.as_deref(), Some(name));
            assert_eq!(binding.metadata.namespace.as_deref(), Some("app-rome"));
            assert_eq!(binding.role_ref.kind, "ClusterRole");
            assert_eq!(binding.role_ref.name, capability.role_name());
            let subjects = binding.subjects.unwrap();
            assert_eq!(subjects.len(), 1);
            assert_eq!(
                (subjects[0].kind.as_str(), subjects[0].name.as_str()),
                ("Group", "tandem:peer-key:ab12"),
                "bound to the key's group, not to the self-asserted name"
            );
        }
        let all: std::collections::BTreeSet<_> = peer_bindings().collect();
        assert_eq!(
            all.len(),
            1 + PodCapability::ALL.len(),
            "names are distinct"
        );
    }
}
