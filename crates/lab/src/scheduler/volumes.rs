//! VolumeBinding: the scheduler's view of claims, volumes and classes, whether a pod's claims
//! let it run on a node (PreFilter and Filter), and whether a volume could serve a claim (which
//! the volume controller asks too).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use tandem_apimachinery::quantity::Quantity;

use super::fit_error::Failure;
use super::matching::{label_selector_matches, term_matches};
use super::pod_info::PodInfo;

/// The scheduler's view of storage: claims by `namespace/name`, volumes and classes by name.
#[derive(Debug, Default)]
pub struct Volumes {
    pub(super) claims: HashMap<String, Arc<PersistentVolumeClaim>>,
    pub(super) volumes: BTreeMap<String, Arc<PersistentVolume>>,
    pub(super) classes: HashMap<String, Arc<StorageClass>>,
}

impl Volumes {
    /// Adds or updates a claim.
    pub fn apply_claim(&mut self, claim: PersistentVolumeClaim) {
        let key = format!(
            "{}/{}",
            claim.metadata.namespace.as_deref().unwrap_or(""),
            claim.metadata.name.as_deref().unwrap_or("")
        );
        self.claims.insert(key, Arc::new(claim));
    }

    /// Removes a claim.
    pub fn delete_claim(&mut self, namespace: &str, name: &str) {
        self.claims.remove(&format!("{namespace}/{name}"));
    }

    /// Adds or updates a volume.
    pub fn apply_volume(&mut self, pv: PersistentVolume) {
        let name = pv.metadata.name.clone().unwrap_or_default();
        self.volumes.insert(name, Arc::new(pv));
    }

    /// Removes a volume.
    pub fn delete_volume(&mut self, name: &str) {
        self.volumes.remove(name);
    }

    /// Adds or updates a class.
    pub fn apply_class(&mut self, class: StorageClass) {
        let name = class.metadata.name.clone().unwrap_or_default();
        self.classes.insert(name, Arc::new(class));
    }

    /// Removes a class.
    pub fn delete_class(&mut self, name: &str) {
        self.classes.remove(name);
    }

    fn claim(&self, namespace: &str, name: &str) -> Option<&PersistentVolumeClaim> {
        self.claims
            .get(&format!("{namespace}/{name}"))
            .map(Arc::as_ref)
    }
}

/// What a pod's claims ask of a node, worked out once per scheduling attempt (VolumeBinding's
/// PreFilter).
#[derive(Debug, Default)]
pub(super) struct VolumeNeeds<'a> {
    /// Volumes of bound claims (None: the claim names a volume the cache does not hold).
    pub(super) bound: Vec<Option<&'a PersistentVolume>>,
    /// Unbound WaitForFirstConsumer claims and their class, if it exists.
    pub(super) delayed: Vec<(&'a PersistentVolumeClaim, Option<&'a StorageClass>)>,
}

/// Whether a volume's required node affinity admits `node` (no affinity admits every node).
pub fn volume_reachable_from(pv: &PersistentVolume, node: &Node) -> bool {
    match pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
    {
        Some(required) => required
            .node_selector_terms
            .iter()
            .any(|t| term_matches(t, node)),
        None => true,
    }
}

fn delays_binding(class: Option<&StorageClass>) -> bool {
    class.is_some_and(|c| c.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer"))
}

/// Why a pod's claims keep it off every node (VolumeBinding's PreFilter), worded as
/// kube-scheduler words it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClaimNotReady {
    /// The claim of an ephemeral volume is not created yet.
    #[error(
        "waiting for ephemeral volume controller to create the persistentvolumeclaim \"{claim}\""
    )]
    EphemeralPending {
        /// The claim's name.
        claim: String,
    },
    /// The claim does not exist.
    #[error("persistentvolumeclaim \"{claim}\" not found")]
    NotFound {
        /// The claim's name.
        claim: String,
    },
    /// The claim's volume is gone (phase Lost).
    #[error(
        "persistentvolumeclaim \"{claim}\" bound to non-existent persistentvolume \"{volume}\""
    )]
    Lost {
        /// The claim's name.
        claim: String,
        /// The volume it names.
        volume: String,
    },
    /// The claim is being deleted.
    #[error("persistentvolumeclaim \"{claim}\" is being deleted")]
    Deleting {
        /// The claim's name.
        claim: String,
    },
    /// A claim of a class binding immediately is not bound yet.
    #[error("pod has unbound immediate PersistentVolumeClaims")]
    UnboundImmediate,
}

/// VolumeBinding's PreFilter: every claim exists and is usable, and none waits to be bound
/// by the volume controller; the error is the reason kube-scheduler gives.
pub(super) fn volume_needs<'a>(
    vols: &'a Volumes,
    pod: &PodInfo,
) -> Result<VolumeNeeds<'a>, ClaimNotReady> {
    let mut needs = VolumeNeeds::default();
    for c in &pod.claims {
        let Some(claim) = vols.claim(pod.namespace(), &c.name) else {
            let claim = c.name.clone();
            return Err(if c.ephemeral {
                ClaimNotReady::EphemeralPending { claim }
            } else {
                ClaimNotReady::NotFound { claim }
            });
        };
        let volume_name = claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .unwrap_or("");
        if claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Lost") {
            return Err(ClaimNotReady::Lost {
                claim: c.name.clone(),
                volume: volume_name.to_string(),
            });
        }
        if claim.metadata.deletion_timestamp.is_some() {
            return Err(ClaimNotReady::Deleting {
                claim: c.name.clone(),
            });
        }
        if !volume_name.is_empty() {
            needs
                .bound
                .push(vols.volumes.get(volume_name).map(Arc::as_ref));
            continue;
        }
        let class_name = claim
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.as_deref())
            .unwrap_or("");
        let class = vols.classes.get(class_name).map(Arc::as_ref);
        if !delays_binding(class) {
            return Err(ClaimNotReady::UnboundImmediate);
        }
        needs.delayed.push((claim, class));
    }
    Ok(needs)
}

/// Whether `pv` could serve `claim` (the volume controller's `findMatchingVolume`): free or
/// pre-bound to it, same class and volume mode, the access modes and capacity asked for,
/// labels the claim's selector matches, and (when `node` is given) reachable from that node.
pub fn volume_matches(
    pv: &PersistentVolume,
    claim: &PersistentVolumeClaim,
    node: Option<&Node>,
) -> bool {
    let (Some(spec), Some(cspec)) = (pv.spec.as_ref(), claim.spec.as_ref()) else {
        return false;
    };
    if pv.metadata.deletion_timestamp.is_some() {
        return false;
    }
    if let Some(r) = &spec.claim_ref {
        let same = r.name.as_deref() == claim.metadata.name.as_deref()
            && r.namespace.as_deref() == claim.metadata.namespace.as_deref()
            && r.uid
                .as_deref()
                .is_none_or(|u| u.is_empty() || Some(u) == claim.metadata.uid.as_deref());
        if !same {
            return false;
        }
    } else if pv
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p != "Available" && p != "Pending")
    {
        return false;
    }
    let class = cspec.storage_class_name.as_deref().unwrap_or("");
    if spec.storage_class_name.as_deref().unwrap_or("") != class {
        return false;
    }
    if spec.volume_mode.as_deref().unwrap_or("Filesystem")
        != cspec.volume_mode.as_deref().unwrap_or("Filesystem")
    {
        return false;
    }
    let offered = spec.access_modes.as_deref().unwrap_or(&[]);
    if !cspec
        .access_modes
        .iter()
        .flatten()
        .all(|m| offered.contains(m))
    {
        return false;
    }
    let storage = |q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
        q.and_then(|q| Quantity::parse(&q.0).ok())
            .map(|q| q.scaled(0).clamp(0, i64::MAX.into()) as i64)
            .unwrap_or(0)
    };
    let capacity = storage(spec.capacity.as_ref().and_then(|c| c.get("storage")));
    let wanted = storage(
        cspec
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage")),
    );
    if capacity < wanted {
        return false;
    }
    if cspec.selector.is_some()
        && !label_selector_matches(cspec.selector.as_ref(), pv.metadata.labels.as_ref())
    {
        return false;
    }
    node.is_none_or(|node| volume_reachable_from(pv, node))
}

/// Whether a class may provision a volume reachable from `node` (its allowedTopologies).
fn provisionable_on(class: &StorageClass, node: &Node) -> bool {
    if class.provisioner.is_empty() || class.provisioner == "kubernetes.io/no-provisioner" {
        return false;
    }
    let labels = node.metadata.labels.as_ref();
    match class.allowed_topologies.as_deref() {
        None | Some([]) => true,
        Some(terms) => terms.iter().any(|t| {
            t.match_label_expressions.iter().flatten().all(|e| {
                labels
                    .and_then(|l| l.get(&e.key))
                    .is_some_and(|v| e.values.contains(v))
            })
        }),
    }
}

/// VolumeBinding's Filter on one node.
pub(super) fn volumes_fit(
    vols: &Volumes,
    needs: &VolumeNeeds<'_>,
    node: &Node,
) -> Result<(), Failure> {
    for pv in &needs.bound {
        match pv {
            None => {
                return Err(Failure::unresolvable(
                    "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)",
                ));
            }
            Some(pv) if !volume_reachable_from(pv, node) => {
                return Err(Failure::unresolvable(
                    "node(s) had volume node affinity conflict",
                ));
            }
            Some(_) => {}
        }
    }
    for (claim, class) in &needs.delayed {
        let static_fit = vols
            .volumes
            .values()
            .any(|pv| volume_matches(pv, claim, Some(node)));
        if !static_fit && !class.is_some_and(|c| provisionable_on(c, node)) {
            return Err(Failure::unresolvable(
                "node(s) didn't find available persistent volumes to bind",
            ));
        }
    }
    Ok(())
}
