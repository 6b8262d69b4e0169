//! Persistent volumes, as kube-controller-manager's persistentvolume-binder and
//! pvc/pv-protection controllers keep them, plus the lab's own provisioner of hollow volumes
//! (what an external CSI provisioner does in a real cluster): claims are bound to matching
//! available volumes, or get a volume provisioned when their class's provisioner is the lab's
//! (at once for `Immediate`, once the scheduler picked a node for `WaitForFirstConsumer`);
//! a volume whose claim is gone is deleted or released by its reclaim policy; claims in use by
//! a pod, and bound volumes, are held by their protection finalizers. Classes of other
//! provisioners are left to them (the claim waits with ExternalProvisioning, as upstream).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, ObjectReference,
    PersistentVolume, PersistentVolumeClaim, Pod, VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as KubeQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use tandem_apimachinery::quantity::Quantity;

use crate::scheduler::volumes::volume_matches;
use tandem_api::client::{is_conflict, is_not_found};

use super::context::Context;
use super::error::{Error, StepExt, drain, key, retry_after_error};

/// The provisioner name of the lab's hollow volumes.
pub const LAB_PROVISIONER: &str = "lab.tandem.dev/hollow";
/// The lab's default StorageClass.
pub const DEFAULT_CLASS: &str = "standard";
/// Annotation marking a StorageClass as the default.
pub const IS_DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";
/// Annotation the scheduler puts on a WaitForFirstConsumer claim: the node its pod goes to.
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// Annotation naming the provisioner expected to provision a claim.
pub const STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
const BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
/// Annotation on a claim whose binding is complete.
pub const BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
/// Annotation on claims and volumes bound by the controller (rather than pre-bound by a user).
pub const BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
/// Annotation on a volume naming the provisioner that made it.
pub const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// Finalizer holding a claim while a pod uses it.
pub const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
/// Finalizer holding a volume while it is bound.
pub const PV_PROTECTION: &str = "kubernetes.io/pv-protection";

/// Creates the lab's default StorageClass unless a class of that name exists.
pub async fn ensure_default_class(client: &Client) -> Result<(), kube::Error> {
    let class: StorageClass = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": DEFAULT_CLASS,
            "annotations": {IS_DEFAULT_CLASS: "true"},
        },
        "provisioner": LAB_PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "WaitForFirstConsumer",
    }))
    .expect("the default StorageClass is well-formed");
    match Api::<StorageClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await
    {
        Err(e) if !is_conflict(&e) => Err(e),
        _ => Ok(()),
    }
}

/// Runs the claim and volume controllers until their watches end.
pub async fn run(client: Client) {
    for attempt in 0.. {
        match ensure_default_class(&client).await {
            Ok(()) => break,
            Err(e) => {
                tracing::warn!("creating the default StorageClass {DEFAULT_CLASS}: {e}");
                tokio::time::sleep(Duration::from_millis(200 * attempt.min(10))).await;
            }
        }
    }
    let claims = Controller::new(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        watcher::Config::default(),
    )
    .watches(
        Api::<PersistentVolume>::all(client.clone()),
        watcher::Config::default(),
        |pv: PersistentVolume| {
            let claim = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
            claim
                .and_then(|c| {
                    Some(ObjectRef::new(c.name.as_deref()?).within(c.namespace.as_deref()?))
                })
                .into_iter()
                .collect::<Vec<_>>()
        },
    );
    let volumes = Controller::new(
        Api::<PersistentVolume>::all(client.clone()),
        watcher::Config::default(),
    )
    .watches(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        watcher::Config::default(),
        |pvc: PersistentVolumeClaim| {
            pvc.spec
                .as_ref()
                .and_then(|s| s.volume_name.as_deref())
                .filter(|v| !v.is_empty())
                .map(ObjectRef::new)
                .into_iter()
                .collect::<Vec<_>>()
        },
    );
    let ctx = Arc::new(Context::new(client.clone(), "persistentvolume-controller"));
    tokio::join!(
        drain(
            "persistentvolumeclaim",
            claims.run(
                sync_claim,
                retry_after_error("persistentvolumeclaim"),
                ctx.clone()
            ),
        ),
        drain(
            "persistentvolume",
            volumes.run(sync_volume, retry_after_error("persistentvolume"), ctx),
        ),
    );
}

fn annotations(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> BTreeMap<String, String> {
    meta.annotations.clone().unwrap_or_default()
}

/// Adds (`keep`) or removes `finalizer` on an object (a compare-and-swap on its
/// resourceVersion, so a concurrent change is looked at again); an object already gone is fine.
async fn set_finalizer<K>(
    api: &Api<K>,
    meta: &ObjectMeta,
    finalizer: &str,
    keep: bool,
    object: &str,
) -> Result<(), Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut finalizers: Vec<String> = meta
        .finalizers
        .iter()
        .flatten()
        .filter(|f| *f != finalizer)
        .cloned()
        .collect();
    if keep {
        finalizers.push(finalizer.to_string());
    }
    let patch = json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": meta.resource_version,
    }});
    let step = if keep { "adding" } else { "removing" };
    api.patch(
        meta.name.as_deref().unwrap_or(""),
        &PatchParams::default(),
        &Patch::Merge(patch),
    )
    .await
    .map(|_| ())
    .or_else(|e| if is_not_found(&e) { Ok(()) } else { Err(e) })
    .step(object, format!("{step} the {finalizer} finalizer"))
}

fn has_finalizer(meta: &ObjectMeta, f: &str) -> bool {
    meta.finalizers.iter().flatten().any(|x| x == f)
}

fn capacity(pv: &PersistentVolume) -> i64 {
    let q = pv
        .spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"));
    q.and_then(|q| Quantity::parse(&q.0).ok())
        .map(|q| q.scaled(0).clamp(0, i64::MAX.into()) as i64)
        .unwrap_or(0)
}

/// The class a claim asks for: its storageClassName ("" means none).
fn class_of(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
}

fn claim_ref(claim: &PersistentVolumeClaim) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        name: claim.metadata.name.clone(),
        namespace: claim.metadata.namespace.clone(),
        uid: claim.metadata.uid.clone(),
        resource_version: claim.metadata.resource_version.clone(),
        ..Default::default()
    }
}

/// The hollow volume provisioned for `claim` of `class`, on `node`'s hostname if the class
/// waited for the first consumer.
pub fn provisioned_volume(
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    hostname: Option<&str>,
) -> PersistentVolume {
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    let name = format!("pvc-{uid}");
    let cspec = claim.spec.clone().unwrap_or_default();
    let storage = cspec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage").cloned())
        .unwrap_or_else(|| KubeQuantity("1Gi".into()));
    let mut pv = json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": name,
            "annotations": {PROVISIONED_BY: class.provisioner},
            "finalizers": [PV_PROTECTION],
        },
        "spec": {
            "capacity": {"storage": storage},
            "accessModes": cspec.access_modes.clone().unwrap_or_else(|| vec!["ReadWriteOnce".into()]),
            "persistentVolumeReclaimPolicy": class.reclaim_policy.clone().unwrap_or_else(|| "Delete".into()),
            "storageClassName": class.metadata.name,
            "volumeMode": cspec.volume_mode.clone().unwrap_or_else(|| "Filesystem".into()),
            "claimRef": claim_ref(claim),
            "csi": {"driver": class.provisioner, "volumeHandle": name, "fsType": "ext4"},
        },
    });
    if let Some(host) = hostname {
        pv["spec"]["nodeAffinity"] = serde_json::to_value(VolumeNodeAffinity {
            required: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(vec![NodeSelectorRequirement {
                        key: "kubernetes.io/hostname".into(),
                        operator: "In".into(),
                        values: Some(vec![host.to_string()]),
                    }]),
                    match_fields: None,
                }],
            }),
        })
        .unwrap_or(Value::Null);
    }
    serde_json::from_value(pv).expect("a provisioned volume is well-formed")
}

/// One pass over a claim (`syncClaim` and the pvc-protection controller).
async fn sync_claim(claim: Arc<PersistentVolumeClaim>, ctx: Arc<Context>) -> Result<Action, Error> {
    let client = &ctx.client;
    let object = key(&claim.metadata);
    let (Some(ns), Some(name)) = (claim.namespace(), claim.metadata.name.clone()) else {
        return Ok(Action::await_change());
    };
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns);

    if claim.metadata.deletion_timestamp.is_some() {
        if !has_finalizer(&claim.metadata, PVC_PROTECTION) {
            return Ok(Action::await_change());
        }
        // Held while a pod that is not finished uses it.
        let pods = Api::<Pod>::namespaced(client.clone(), &ns)
            .list(&ListParams::default())
            .await
            .step(&object, "listing pods")?;
        let in_use = pods.items.iter().any(|p| {
            !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            ) && p
                .spec
                .as_ref()
                .and_then(|s| s.volumes.as_ref())
                .into_iter()
                .flatten()
                .any(|v| {
                    v.persistent_volume_claim
                        .as_ref()
                        .is_some_and(|c| c.claim_name == name)
                })
        });
        if in_use {
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
        set_finalizer(&claims, &claim.metadata, PVC_PROTECTION, false, &object).await?;
        return Ok(Action::await_change());
    }
    if !has_finalizer(&claim.metadata, PVC_PROTECTION) {
        set_finalizer(&claims, &claim.metadata, PVC_PROTECTION, true, &object).await?;
        // The patch triggers the next pass.
        return Ok(Action::await_change());
    }

    let volumes = Api::<PersistentVolume>::all(client.clone());
    let spec = claim.spec.clone().unwrap_or_default();
    if let Some(volume_name) = spec.volume_name.as_deref().filter(|v| !v.is_empty()) {
        let Some(pv) = volumes
            .get_opt(volume_name)
            .await
            .step(&object, "reading its volume")?
        else {
            set_claim_phase(&claims, &claim, "Lost", &object).await?;
            return Ok(Action::await_change());
        };
        let pv_claim = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
        let bound_here =
            pv_claim.is_some_and(|r| r.uid.as_deref() == claim.metadata.uid.as_deref());
        let elsewhere = pv_claim.is_some_and(|r| {
            r.name.as_deref() != Some(name.as_str())
                || r.namespace.as_deref() != Some(ns.as_str())
                || r.uid
                    .as_deref()
                    .is_some_and(|u| !u.is_empty() && !bound_here)
        });
        if elsewhere {
            let note = format!("volume \"{volume_name}\" already bound to a different claim.");
            ctx.event(claim.as_ref(), "FailedBinding", note).await;
            return Ok(Action::await_change());
        }
        if !bound_here {
            // Pre-bound by the user to this volume: complete the volume's side first.
            bind_volume(&ctx, &pv, &claim, &object).await?;
        }
        return complete_claim(&claims, &claim, &pv, &object).await;
    }

    // Unbound. A claim without class gets the default one (retroactive default class).
    let classes = Api::<StorageClass>::all(client.clone());
    if spec.storage_class_name.is_none() {
        let listed = classes
            .list(&ListParams::default())
            .await
            .step(&object, "listing storageclasses")?;
        let default = listed
            .items
            .iter()
            .filter(|c| {
                annotations(&c.metadata)
                    .get(IS_DEFAULT_CLASS)
                    .map(String::as_str)
                    == Some("true")
            })
            .max_by_key(|c| c.metadata.creation_timestamp.as_ref().map(|t| t.0));
        if let Some(default) = default {
            claims
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"storageClassName": default.name_any()}})),
                )
                .await
                .step(&object, "setting the default storage class")?;
            return Ok(Action::await_change());
        }
    }
    if claim
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_none()
    {
        set_claim_phase(&claims, &claim, "Pending", &object).await?;
    }
    let class_name = class_of(&claim).unwrap_or("");
    let class = if class_name.is_empty() {
        None
    } else {
        classes
            .get_opt(class_name)
            .await
            .step(&object, "reading its storage class")?
    };
    let delayed = class
        .as_ref()
        .is_some_and(|c| c.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer"));
    let claim_annotations = annotations(&claim.metadata);
    let selected = claim_annotations.get(SELECTED_NODE).cloned();
    if delayed && selected.is_none() {
        ctx.event(
            claim.as_ref(),
            "WaitForFirstConsumer",
            "waiting for first consumer to be created before binding".into(),
        )
        .await;
        return Ok(Action::await_change());
    }
    let node = match &selected {
        Some(n) => Api::<Node>::all(client.clone())
            .get_opt(n)
            .await
            .step(&object, "reading the selected node")?,
        None => None,
    };
    let all = volumes
        .list(&ListParams::default())
        .await
        .step(&object, "listing persistentvolumes")?;
    let best = all
        .items
        .iter()
        .filter(|pv| volume_matches(pv, &claim, if delayed { node.as_ref() } else { None }))
        .min_by_key(|pv| {
            (
                pv.spec
                    .as_ref()
                    .and_then(|s| s.claim_ref.as_ref())
                    .is_none(),
                capacity(pv),
            )
        });
    if let Some(pv) = best {
        let pv = bind_volume(&ctx, pv, &claim, &object).await?;
        return complete_claim(&claims, &claim, &pv, &object).await;
    }
    let Some(class) = class else {
        let note = if class_name.is_empty() {
            "no persistent volumes available for this claim and no storage class is set".to_string()
        } else {
            format!("storageclass.storage.k8s.io \"{class_name}\" not found")
        };
        ctx.event(claim.as_ref(), "FailedBinding", note).await;
        return Ok(Action::await_change());
    };
    // Dynamic provisioning: the claim names its provisioner, which creates the volume.
    if claim_annotations.get(STORAGE_PROVISIONER) != Some(&class.provisioner) {
        claims
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {
                    STORAGE_PROVISIONER: class.provisioner,
                    BETA_STORAGE_PROVISIONER: class.provisioner,
                }}})),
            )
            .await
            .step(&object, "naming its provisioner")?;
        let note = format!(
            "Waiting for a volume to be created either by the external provisioner '{}' or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered.",
            class.provisioner
        );
        ctx.event(claim.as_ref(), "ExternalProvisioning", note)
            .await;
        return Ok(Action::await_change());
    }
    if class.provisioner != LAB_PROVISIONER {
        return Ok(Action::await_change());
    }
    let hostname = selected.as_deref().map(|n| {
        node.as_ref()
            .and_then(|node| node.labels().get("kubernetes.io/hostname").cloned())
            .unwrap_or_else(|| n.to_string())
    });
    let provisioner = Context::new(client.clone(), LAB_PROVISIONER);
    provisioner
        .event(
            claim.as_ref(),
            "Provisioning",
            format!("External provisioner is provisioning volume for claim \"{ns}/{name}\""),
        )
        .await;
    let pv = provisioned_volume(&claim, &class, hostname.as_deref());
    let pv_name = pv.name_any();
    match volumes.create(&PostParams::default(), &pv).await {
        Ok(_) => {
            provisioner
                .event(
                    claim.as_ref(),
                    "ProvisioningSucceeded",
                    format!("Successfully provisioned volume {pv_name}"),
                )
                .await;
        }
        Err(e) if is_conflict(&e) => {}
        Err(e) => return Err(e).step(&object, format!("provisioning volume {pv_name}")),
    }
    // The new volume's event brings the claim back to be bound.
    Ok(Action::await_change())
}

async fn set_claim_phase(
    claims: &Api<PersistentVolumeClaim>,
    claim: &PersistentVolumeClaim,
    phase: &str,
    object: &str,
) -> Result<(), Error> {
    if claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phase) {
        return Ok(());
    }
    claims
        .patch_status(
            &claim.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": phase}})),
        )
        .await
        .map(|_| ())
        .step(object, format!("setting phase {phase}"))
}

/// Points `pv` at `claim` (`bindVolumeToClaim`), with a compare-and-swap on the volume so two
/// claims cannot take it at once; returns the bound volume.
async fn bind_volume(
    ctx: &Context,
    pv: &PersistentVolume,
    claim: &PersistentVolumeClaim,
    object: &str,
) -> Result<PersistentVolume, Error> {
    let volumes = Api::<PersistentVolume>::all(ctx.client.clone());
    let pv_name = pv.name_any();
    let current = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
    let mut bound = pv.clone();
    if current.and_then(|r| r.uid.as_deref()) != claim.metadata.uid.as_deref() {
        let mut patch = json!({"metadata": {"resourceVersion": pv.metadata.resource_version},
                               "spec": {"claimRef": claim_ref(claim)}});
        if current.is_none() {
            patch["metadata"]["annotations"] = json!({BOUND_BY_CONTROLLER: "yes"});
        }
        bound = volumes
            .patch(&pv_name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .step(object, format!("binding volume {pv_name}"))?;
    }
    if bound.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
        bound = volumes
            .patch_status(
                &pv_name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Bound"}})),
            )
            .await
            .step(object, format!("marking volume {pv_name} Bound"))?;
    }
    Ok(bound)
}

/// Points `claim` at `pv` and reports it Bound with the volume's capacity and access modes.
async fn complete_claim(
    claims: &Api<PersistentVolumeClaim>,
    claim: &PersistentVolumeClaim,
    pv: &PersistentVolume,
    object: &str,
) -> Result<Action, Error> {
    let name = claim.name_any();
    let pv_name = pv.name_any();
    let ann = annotations(&claim.metadata);
    let pre_bound = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .is_some_and(|v| v == pv_name);
    if !pre_bound || ann.get(BIND_COMPLETED).map(String::as_str) != Some("yes") {
        let mut annotations = json!({BIND_COMPLETED: "yes"});
        if !pre_bound {
            annotations[BOUND_BY_CONTROLLER] = json!("yes");
        }
        claims
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({
                    "metadata": {"annotations": annotations, "resourceVersion": claim.metadata.resource_version},
                    "spec": {"volumeName": pv_name},
                })),
            )
            .await
            .step(object, format!("binding to volume {pv_name}"))?;
    }
    let spec = pv.spec.clone().unwrap_or_default();
    let status = claim.status.clone().unwrap_or_default();
    if status.phase.as_deref() != Some("Bound")
        || status.capacity != spec.capacity
        || status.access_modes != spec.access_modes
    {
        claims
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {
                    "phase": "Bound",
                    "capacity": spec.capacity,
                    "accessModes": spec.access_modes,
                }})),
            )
            .await
            .step(object, "marking it Bound")?;
    }
    Ok(Action::await_change())
}

/// One pass over a volume (`syncVolume` and the pv-protection controller).
async fn sync_volume(pv: Arc<PersistentVolume>, ctx: Arc<Context>) -> Result<Action, Error> {
    let client = &ctx.client;
    let object = key(&pv.metadata);
    let name = pv.name_any();
    let volumes = Api::<PersistentVolume>::all(client.clone());
    let phase = pv
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("");
    if pv.metadata.deletion_timestamp.is_some() {
        if has_finalizer(&pv.metadata, PV_PROTECTION) && phase != "Bound" {
            set_finalizer(&volumes, &pv.metadata, PV_PROTECTION, false, &object).await?;
        }
        if phase != "Bound" {
            return Ok(Action::await_change());
        }
    } else if !has_finalizer(&pv.metadata, PV_PROTECTION) {
        set_finalizer(&volumes, &pv.metadata, PV_PROTECTION, true, &object).await?;
        return Ok(Action::await_change());
    }
    let set_phase = |phase: &'static str| {
        let volumes = volumes.clone();
        let name = name.clone();
        let object = object.clone();
        async move {
            volumes
                .patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"phase": phase}})),
                )
                .await
                .map(|_| ())
                .step(&object, format!("setting phase {phase}"))
        }
    };
    let spec = pv.spec.clone().unwrap_or_default();
    let Some(claim_ref) = spec.claim_ref.as_ref() else {
        if phase != "Available" {
            set_phase("Available").await?;
        }
        return Ok(Action::await_change());
    };
    let (Some(claim_ns), Some(claim_name)) =
        (claim_ref.namespace.as_deref(), claim_ref.name.as_deref())
    else {
        return Ok(Action::await_change());
    };
    let claim = Api::<PersistentVolumeClaim>::namespaced(client.clone(), claim_ns)
        .get_opt(claim_name)
        .await
        .step(&object, "reading its claim")?;
    let ref_uid = claim_ref.uid.as_deref().unwrap_or("");
    let claim_gone = match &claim {
        None => !ref_uid.is_empty(),
        Some(c) => !ref_uid.is_empty() && c.metadata.uid.as_deref() != Some(ref_uid),
    };
    if !claim_gone {
        if phase.is_empty() || phase == "Pending" {
            set_phase("Available").await?;
        }
        // The claim's own pass completes the binding.
        return Ok(Action::await_change());
    }
    // The claim went: the reclaim policy decides.
    if phase != "Released" && phase != "Failed" {
        set_phase("Released").await?;
    }
    let policy = spec
        .persistent_volume_reclaim_policy
        .as_deref()
        .unwrap_or("Retain");
    let provisioner = annotations(&pv.metadata).get(PROVISIONED_BY).cloned();
    // Hollow volumes (the lab's, or made by hand) need no deleter; another provisioner's
    // volumes are that provisioner's to delete.
    let ours = provisioner.as_deref().is_none_or(|p| p == LAB_PROVISIONER);
    if policy == "Delete" && ours && pv.metadata.deletion_timestamp.is_none() {
        match volumes.delete(&name, &DeleteParams::default()).await {
            Err(e) if !is_not_found(&e) => {
                return Err(e).step(&object, "deleting the released volume");
            }
            _ => {}
        }
    }
    Ok(Action::await_change())
}
