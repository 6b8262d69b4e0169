//! Storage offloading, consumer side: the provisioner of the `tandem` StorageClass. For each
//! PVC of that class it observes the claim, its consumer PV, where the scheduler placed it and
//! the provider's copy, lets `tandem_core::storage::decide` choose the next steps, and applies
//! them (see that module for the life of a claim).
//!
//! Names: the provider's copy has the claim's name in the twin namespace, with
//! `tandem.dev/origin-uid` = the consumer claim's UID; the consumer PV is `tandem-<claim UID>`,
//! labelled with the provider's ID and annotated with the twin namespace, so that deleting the
//! claim finds the copy even after the namespace stopped being offloaded. The provider copy's
//! StorageClass is the `remoteStorageClass` parameter of the `tandem` class, or the provider's
//! default.
//!
//! Unoffloading and unpeering never delete provider claims unless asked (`--delete-data`):
//! [`remote_claims`] and [`remote_volumes`] serve the reports of those paths.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    Event as CoreEvent, Node, PersistentVolume, PersistentVolumeClaim,
};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tandem_api::{NamespaceOffloading, client, names};
use tandem_core::shadow::ORIGIN_UID_ANNOTATION;
use tandem_core::storage::{self as plan, Claim, Placement, Remote, RemoteClaim, Step};

use crate::consumer::link::{Links, ProviderLink};
use crate::context::Ctx;

/// Finalizer the PV protection of kube-controller-manager puts on claims used by pods.
const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
/// Field manager and reporting component of this reconciler.
const COMPONENT: &str = "tandem-storage";

struct State {
    ctx: Ctx,
    links: Links,
}

/// A step of the storage reconciler that failed, naming the claim.
#[derive(Debug, thiserror::Error)]
#[error("PersistentVolumeClaim {claim}: {step}")]
pub struct Error {
    claim: String,
    step: String,
    #[source]
    source: kube::Error,
}

/// Runs the reconciler; every change of the provider links re-reconciles every claim.
pub async fn run(ctx: Ctx, links: Links) {
    let api: Api<PersistentVolumeClaim> = Api::all(ctx.client.clone());
    let link_changes = links.changes();
    Controller::new(api, watcher::Config::default())
        .reconcile_all_on(link_changes)
        .run(
            crate::metrics::timed(ctx.metrics.clone(), "storage", reconcile),
            error_policy,
            Arc::new(State { ctx, links }),
        )
        .for_each(|_| async {})
        .await;
}

fn error_policy(_c: Arc<PersistentVolumeClaim>, error: &Error, _s: Arc<State>) -> Action {
    tracing::warn!(error = %crate::error::chain(error), "reconciling");
    Action::requeue(Duration::from_secs(1))
}

/// Name of the consumer PV of the claim with UID `uid`.
pub fn volume_name(uid: &str) -> String {
    format!("tandem-{uid}")
}

fn class_of(pvc: &PersistentVolumeClaim) -> Option<&str> {
    pvc.spec.as_ref()?.storage_class_name.as_deref()
}

fn requested_storage(pvc: &PersistentVolumeClaim) -> Option<String> {
    Some(
        pvc.spec
            .as_ref()?
            .resources
            .as_ref()?
            .requests
            .as_ref()?
            .get("storage")?
            .0
            .clone(),
    )
}

/// The provider's copy of `pvc` in `twin`, created with `class` (the provider's default if
/// none).
pub fn remote_claim(
    pvc: &PersistentVolumeClaim,
    twin: &str,
    consumer_id: &str,
    class: Option<&str>,
) -> Value {
    let spec = pvc.spec.clone().unwrap_or_default();
    let mut out = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": pvc.name_any(), "namespace": twin,
            "labels": {
                names::MANAGED_BY_LABEL: names::MANAGED_BY,
                names::ORIGIN_CLUSTER_LABEL: consumer_id,
                names::ORIGIN_NAMESPACE_LABEL: pvc.namespace().unwrap_or_default(),
            },
            "annotations": {ORIGIN_UID_ANNOTATION: pvc.uid().unwrap_or_default()},
        },
        "spec": {
            "accessModes": spec.access_modes.unwrap_or_else(|| vec!["ReadWriteOnce".into()]),
            "resources": {"requests": {"storage": requested_storage(pvc)}},
        },
    });
    if let Some(mode) = spec.volume_mode {
        out["spec"]["volumeMode"] = json!(mode);
    }
    if let Some(class) = class {
        out["spec"]["storageClassName"] = json!(class);
    }
    out
}

/// The consumer PV of `pvc`: pre-bound to it, pinned to `virtual_node` by a required node
/// affinity on its hostname label, its size the provider copy's (its request until bound).
pub fn local_volume(
    pvc: &PersistentVolumeClaim,
    remote: Option<&PersistentVolumeClaim>,
    provider: &str,
    virtual_node: &str,
    twin: &str,
) -> Value {
    let spec = pvc.spec.clone().unwrap_or_default();
    let capacity = remote
        .and_then(|r| {
            r.status
                .as_ref()?
                .capacity
                .as_ref()?
                .get("storage")
                .cloned()
        })
        .map(|q| q.0)
        .or_else(|| requested_storage(pvc));
    let (ns, name, uid) = (
        pvc.namespace().unwrap_or_default(),
        pvc.name_any(),
        pvc.uid().unwrap_or_default(),
    );
    let mut out = json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {
            "name": volume_name(&uid),
            "labels": {
                names::MANAGED_BY_LABEL: names::MANAGED_BY,
                names::REMOTE_CLUSTER_LABEL: provider,
            },
            "annotations": {
                "pv.kubernetes.io/provisioned-by": names::STORAGE_PROVISIONER,
                names::REMOTE_NAMESPACE_ANNOTATION: twin,
            },
        },
        "spec": {
            "capacity": {"storage": capacity},
            "accessModes": spec.access_modes.unwrap_or_else(|| vec!["ReadWriteOnce".into()]),
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": names::STORAGE_CLASS,
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                         "namespace": ns, "name": name, "uid": uid},
            "csi": {"driver": names::CSI_DRIVER, "volumeHandle": format!("{provider}/{twin}/{name}")},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [virtual_node]},
            ]}]}},
        },
    });
    if let Some(mode) = spec.volume_mode {
        out["spec"]["volumeMode"] = json!(mode);
    }
    out
}

/// The twin namespace of `ns` on `provider`, once Ready.
async fn twin_of(client: &Client, ns: &str, provider: &str) -> Option<String> {
    let o = Api::<NamespaceOffloading>::namespaced(client.clone(), ns)
        .get_opt(names::OFFLOADING_NAME)
        .await
        .ok()??;
    o.status?
        .remote_namespaces
        .into_iter()
        .find(|r| r.cluster_id == provider && r.phase == "Ready")
        .map(|r| r.namespace)
}

/// What reconcile observed about one claim.
struct Observed {
    placement: Placement,
    /// The selected (or pinned) virtual node.
    node: Option<String>,
    link: Option<ProviderLink>,
    remote: Remote,
    remote_obj: Option<PersistentVolumeClaim>,
    local_pv: bool,
}

async fn observe(state: &State, pvc: &PersistentVolumeClaim) -> Result<Observed, Error> {
    let client = &state.ctx.client;
    let ns = pvc.namespace().unwrap_or_default();
    let err = step_error(pvc);
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get_opt(&volume_name(&pvc.uid().unwrap_or_default()))
        .await
        .map_err(err("reading its PersistentVolume"))?;
    let links = state.links.snapshot();
    let (placement, node) = if let Some(pv) = &pv {
        // Once provisioned, the PV says where the data is, offloaded namespace or not.
        let provider = pv
            .labels()
            .get(names::REMOTE_CLUSTER_LABEL)
            .cloned()
            .unwrap_or_default();
        let twin = pv
            .annotations()
            .get(names::REMOTE_NAMESPACE_ANNOTATION)
            .cloned();
        let node = links.get(&provider).map(|l| l.virtual_node.clone());
        (Placement::Virtual { provider, twin }, node)
    } else if let Some(node) = pvc.annotations().get(names::SELECTED_NODE_ANNOTATION) {
        match links.values().find(|l| &l.virtual_node == node) {
            Some(link) => (
                Placement::Virtual {
                    provider: link.provider_id.clone(),
                    twin: twin_of(client, &ns, &link.provider_id).await,
                },
                Some(node.clone()),
            ),
            None => {
                let found = Api::<Node>::all(client.clone())
                    .get_opt(node)
                    .await
                    .map_err(err("reading its selected node"))?;
                let is_virtual = found.as_ref().is_some_and(|n| {
                    n.labels().get(names::NODE_TYPE_LABEL).map(String::as_str)
                        == Some(names::VIRTUAL_NODE_TYPE)
                });
                if found.is_some() && !is_virtual {
                    (Placement::LocalNode(node.clone()), None)
                } else {
                    (Placement::UnknownNode(node.clone()), None)
                }
            }
        }
    } else {
        (Placement::Unplaced, None)
    };
    let mut link = None;
    let (remote, remote_obj) = match &placement {
        Placement::Virtual {
            provider,
            twin: Some(twin),
        } => match links.get(provider) {
            None => (Remote::NoLink, None),
            Some(l) => {
                link = Some(l.clone());
                let api: Api<PersistentVolumeClaim> = Api::namespaced(l.client.clone(), twin);
                match api.get_opt(&pvc.name_any()).await {
                    Ok(None) => (Remote::Absent, None),
                    Ok(Some(r)) => (
                        Remote::Present(RemoteClaim {
                            origin_uid: r.annotations().get(ORIGIN_UID_ANNOTATION).cloned(),
                            phase: r.status.as_ref().and_then(|s| s.phase.clone()),
                            deleting: r.metadata.deletion_timestamp.is_some(),
                        }),
                        Some(r),
                    ),
                    Err(e) => {
                        tracing::debug!(claim = %key(pvc), %provider, error = %e, "reading the provider's copy");
                        (Remote::Unknown, None)
                    }
                }
            }
        },
        _ => (Remote::Unknown, None),
    };
    Ok(Observed {
        placement,
        node,
        link,
        remote,
        remote_obj,
        local_pv: pv.is_some(),
    })
}

fn key(pvc: &PersistentVolumeClaim) -> String {
    format!("{}/{}", pvc.namespace().unwrap_or_default(), pvc.name_any())
}

fn step_error(
    pvc: &PersistentVolumeClaim,
) -> impl Fn(&str) -> Box<dyn FnOnce(kube::Error) -> Error> {
    let claim = key(pvc);
    move |step: &str| {
        let claim = claim.clone();
        let step = step.to_string();
        Box::new(move |source| Error {
            claim,
            step,
            source,
        })
    }
}

async fn reconcile(pvc: Arc<PersistentVolumeClaim>, state: Arc<State>) -> Result<Action, Error> {
    if class_of(&pvc) != Some(names::STORAGE_CLASS) {
        return Ok(Action::await_change());
    }
    let finalizers = pvc.finalizers();
    let claim = Claim {
        uid: pvc.uid().unwrap_or_default(),
        deleting: pvc.metadata.deletion_timestamp.is_some(),
        finalized: finalizers
            .iter()
            .any(|f| f == names::REMOTE_VOLUME_FINALIZER),
        protected: finalizers.iter().any(|f| f == PVC_PROTECTION),
    };
    let seen = observe(&state, &pvc).await?;
    let steps = plan::decide(&claim, &seen.placement, &seen.remote, seen.local_pv);
    // Nothing to do, or only a warning that no retry soon will change (a lost volume, a
    // provider gone, a local node): looked at again in a while. Waiting steps: soon.
    let settled = steps
        .iter()
        .all(|s| matches!(s, Step::Report(r) if r.warning && r.reason != "ProviderUnreachable"));
    for step in steps {
        act(&state, &pvc, &seen, step).await?;
    }
    Ok(Action::requeue(if settled {
        Duration::from_secs(30)
    } else {
        Duration::from_secs(2)
    }))
}

/// The provider StorageClass named by the `tandem` class, if any.
async fn remote_class(client: &Client) -> Option<String> {
    let class = Api::<StorageClass>::all(client.clone())
        .get_opt(names::STORAGE_CLASS)
        .await
        .ok()??;
    class
        .parameters?
        .get(names::REMOTE_STORAGE_CLASS_PARAMETER)
        .cloned()
}

async fn act(
    state: &State,
    pvc: &PersistentVolumeClaim,
    seen: &Observed,
    step: Step,
) -> Result<(), Error> {
    let client = &state.ctx.client;
    let ns = pvc.namespace().unwrap_or_default();
    let name = pvc.name_any();
    let err = step_error(pvc);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let (provider, twin) = match &seen.placement {
        Placement::Virtual { provider, twin } => {
            (provider.clone(), twin.clone().unwrap_or_default())
        }
        _ => Default::default(),
    };
    let remote_api = || {
        seen.link
            .as_ref()
            .map(|l| Api::<PersistentVolumeClaim>::namespaced(l.client.clone(), &twin))
    };
    match step {
        Step::AddFinalizer => {
            let mut finalizers = pvc.finalizers().to_vec();
            finalizers.push(names::REMOTE_VOLUME_FINALIZER.to_string());
            claims
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"finalizers": finalizers,
                        "resourceVersion": pvc.resource_version()}})),
                )
                .await
                .map_err(err("adding its finalizer"))?;
        }
        Step::RemoveFinalizer => {
            let finalizers: Vec<&String> = pvc
                .finalizers()
                .iter()
                .filter(|f| *f != names::REMOTE_VOLUME_FINALIZER)
                .collect();
            claims
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"finalizers": finalizers,
                        "resourceVersion": pvc.resource_version()}})),
                )
                .await
                .map_err(err("removing its finalizer"))?;
        }
        Step::CreateRemote => {
            let Some(api) = remote_api() else {
                return Ok(());
            };
            let class = remote_class(client).await;
            let body: PersistentVolumeClaim = serde_json::from_value(remote_claim(
                pvc,
                &twin,
                &state.ctx.identity.cluster_id,
                class.as_deref(),
            ))
            .expect("a PVC");
            match api.create(&PostParams::default(), &body).await {
                Ok(_) => {
                    tracing::info!(claim = %key(pvc), %provider, %twin, "provisioning on the provider");
                    record(
                        client,
                        pvc,
                        false,
                        "Provisioning",
                        &format!("creating the claim in namespace {twin} on provider {provider}"),
                    )
                    .await;
                }
                Err(e) if client::is_conflict(&e) => {}
                Err(e) => return Err(err(&format!("creating its copy on provider {provider}"))(e)),
            }
        }
        Step::AdoptRemote => {
            let Some(api) = remote_api() else {
                return Ok(());
            };
            api.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {
                    ORIGIN_UID_ANNOTATION: pvc.uid()}}})),
            )
            .await
            .map_err(err(&format!(
                "adopting its retained copy on provider {provider}"
            )))?;
            record(
                client,
                pvc,
                false,
                "AdoptedRetainedVolume",
                &format!("using the claim retained in namespace {twin} on provider {provider}"),
            )
            .await;
        }
        Step::DeleteRemote => {
            let Some(api) = remote_api() else {
                return Ok(());
            };
            client::ok_if_not_found(api.delete(&name, &DeleteParams::default()).await)
                .map_err(err(&format!("deleting its copy on provider {provider}")))?;
        }
        Step::CreateLocalVolume => {
            let Some(node) = &seen.node else {
                return Ok(());
            };
            let body: PersistentVolume = serde_json::from_value(local_volume(
                pvc,
                seen.remote_obj.as_ref(),
                &provider,
                node,
                &twin,
            ))
            .expect("a PV");
            match Api::<PersistentVolume>::all(client.clone())
                .create(&PostParams::default(), &body)
                .await
            {
                Ok(_) => {
                    record(
                        client,
                        pvc,
                        false,
                        "ProvisioningSucceeded",
                        &format!(
                            "provisioned in namespace {twin} on provider {provider}; pods using it run on {node}"
                        ),
                    )
                    .await;
                }
                Err(e) if client::is_conflict(&e) => {}
                Err(e) => return Err(err("creating its PersistentVolume")(e)),
            }
        }
        Step::DeleteLocalVolume => {
            client::ok_if_not_found(
                Api::<PersistentVolume>::all(client.clone())
                    .delete(
                        &volume_name(&pvc.uid().unwrap_or_default()),
                        &DeleteParams::default(),
                    )
                    .await,
            )
            .map_err(err("deleting its PersistentVolume"))?;
        }
        Step::Report(r) => record(client, pvc, r.warning, r.reason, &r.message).await,
    }
    Ok(())
}

/// Writes (or refreshes) an Event about `pvc`; one per reason, so a waiting claim does not
/// pile them up. A failure is logged: the report is not worth failing the reconcile for.
async fn record(
    client: &Client,
    pvc: &PersistentVolumeClaim,
    warning: bool,
    reason: &str,
    message: &str,
) {
    let ns = pvc.namespace().unwrap_or_default();
    let name = format!("{}.tandem-{}", pvc.name_any(), reason.to_ascii_lowercase());
    let now = chrono_now();
    let event = json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": name, "namespace": ns,
                     "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY}},
        "involvedObject": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                           "namespace": ns, "name": pvc.name_any(), "uid": pvc.uid()},
        "reason": reason, "message": message,
        "type": if warning { "Warning" } else { "Normal" },
        "firstTimestamp": now, "lastTimestamp": now,
        "reportingComponent": names::STORAGE_PROVISIONER,
        "source": {"component": names::STORAGE_PROVISIONER},
    });
    let api: Api<CoreEvent> = Api::namespaced(client.clone(), &ns);
    if let Err(e) = api
        .patch(
            &name,
            &PatchParams::apply(COMPONENT).force(),
            &Patch::Apply(&event),
        )
        .await
    {
        tracing::debug!(claim = %key(pvc), %reason, error = %e, "writing an Event");
    }
}

/// Now, as Kubernetes writes times (RFC 3339, seconds).
fn chrono_now() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    k8s_openapi::jiff::Timestamp::from_second(now.as_second())
        .unwrap_or(now)
        .to_string()
}

/// The claims in `twin` on `link`'s provider (names), for reporting what unoffloading or
/// unpeering retains.
pub async fn remote_claims(link: &ProviderLink, twin: &str) -> Result<Vec<String>, kube::Error> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(link.client.clone(), twin);
    match api.list(&ListParams::default()).await {
        Ok(l) => Ok(l.items.iter().map(ResourceExt::name_any).collect()),
        Err(e) if client::is_gone_or_forbidden(&e) => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// The consumer's remote volumes, by provider: for each PV Tandem made, (claim namespace/name,
/// twin namespace).
pub async fn remote_volumes(
    client: &Client,
) -> Result<BTreeMap<String, Vec<(String, String)>>, kube::Error> {
    let pvs = Api::<PersistentVolume>::all(client.clone())
        .list(&ListParams::default().labels(names::REMOTE_CLUSTER_LABEL))
        .await?;
    let mut out: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for pv in pvs.items {
        let provider = pv.labels()[names::REMOTE_CLUSTER_LABEL].clone();
        let twin = pv
            .annotations()
            .get(names::REMOTE_NAMESPACE_ANNOTATION)
            .cloned()
            .unwrap_or_default();
        let claim = pv
            .spec
            .as_ref()
            .and_then(|s| s.claim_ref.as_ref())
            .map(|c| {
                format!(
                    "{}/{}",
                    c.namespace.clone().unwrap_or_default(),
                    c.name.clone().unwrap_or_default()
                )
            })
            .unwrap_or_default();
        out.entry(provider).or_default().push((claim, twin));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pvc() -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "data-db-0", "namespace": "db", "uid": "u1"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "tandem",
                     "resources": {"requests": {"storage": "1Gi"}}},
        }))
        .unwrap()
    }

    #[test]
    fn the_provider_copy_keeps_name_size_and_modes() {
        let r = remote_claim(&pvc(), "db-rome", "rome", None);
        assert_eq!(r["metadata"]["name"], "data-db-0");
        assert_eq!(r["metadata"]["namespace"], "db-rome");
        assert_eq!(r["metadata"]["annotations"][ORIGIN_UID_ANNOTATION], "u1");
        assert_eq!(r["metadata"]["labels"][names::ORIGIN_CLUSTER_LABEL], "rome");
        assert_eq!(r["spec"]["resources"]["requests"]["storage"], "1Gi");
        assert_eq!(r["spec"]["accessModes"], json!(["ReadWriteOnce"]));
        assert!(
            r["spec"].get("storageClassName").is_none(),
            "the provider's default class"
        );
        let r = remote_claim(&pvc(), "db-rome", "rome", Some("fast"));
        assert_eq!(r["spec"]["storageClassName"], "fast");
    }

    #[test]
    fn the_consumer_volume_is_pre_bound_and_pinned_to_the_virtual_node() {
        let pv = local_volume(&pvc(), None, "milan", "tandem-milan", "db-rome");
        assert_eq!(pv["metadata"]["name"], "tandem-u1");
        assert_eq!(pv["spec"]["claimRef"]["uid"], "u1");
        assert_eq!(pv["spec"]["claimRef"]["namespace"], "db");
        assert_eq!(pv["spec"]["storageClassName"], names::STORAGE_CLASS);
        assert_eq!(
            pv["spec"]["capacity"]["storage"], "1Gi",
            "the request until bound"
        );
        assert_eq!(
            pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"],
            json!(["tandem-milan"])
        );
        assert_eq!(pv["spec"]["csi"]["driver"], names::CSI_DRIVER);
        let bound: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "data-db-0"},
            "status": {"phase": "Bound", "capacity": {"storage": "2Gi"}},
        }))
        .unwrap();
        let pv = local_volume(&pvc(), Some(&bound), "milan", "tandem-milan", "db-rome");
        assert_eq!(
            pv["spec"]["capacity"]["storage"], "2Gi",
            "what the provider gave"
        );
    }
}
