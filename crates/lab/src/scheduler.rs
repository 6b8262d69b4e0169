//! The scheduler: binds pending pods to nodes through the binding subresource.
//!
//! Decide is separate from act: [`Snapshot`] is a synchronous, incrementally maintained view
//! of nodes and the pods placed on them (bound or assumed), and [`decide`] is a pure function
//! from a snapshot and a pod to a node name or a [`FitError`] worded like kube-scheduler's.
//! [`run`] only feeds watch events into the snapshot, binds and reports.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    Binding, Node, NodeSelectorRequirement, NodeSelectorTerm, ObjectReference, PersistentVolume,
    PersistentVolumeClaim, Pod, PodAffinityTerm, PodSpec, Taint, Toleration,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tandem_apimachinery::quantity::Quantity;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// The scheduler name pods ask for (an empty `spec.schedulerName` means this one too).
pub const SCHEDULER_NAME: &str = "default-scheduler";

/// CPU request kube-scheduler assumes for scoring when a container requests none (millicores).
const DEFAULT_MILLI_CPU: i64 = 100;
/// Memory request kube-scheduler assumes for scoring when a container requests none (bytes).
const DEFAULT_MEMORY: i64 = 200 * 1024 * 1024;

/// CPU in millicores and memory in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    /// Millicores.
    pub cpu_milli: i64,
    /// Bytes.
    pub memory: i64,
}

impl Resources {
    fn add(&mut self, o: Resources) {
        self.cpu_milli += o.cpu_milli;
        self.memory += o.memory;
    }

    fn sub(&mut self, o: Resources) {
        self.cpu_milli -= o.cpu_milli;
        self.memory -= o.memory;
    }

    fn max(self, o: Resources) -> Resources {
        Resources {
            cpu_milli: self.cpu_milli.max(o.cpu_milli),
            memory: self.memory.max(o.memory),
        }
    }
}

/// A quantity of `map[key]` times `10^scale` (3 for millicores, 0 for bytes and counts), rounded
/// up like `Quantity.MilliValue`/`Value`; `None` if absent or not a quantity.
fn quantity(
    map: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    key: &str,
    scale: i32,
) -> Option<i64> {
    let q = Quantity::parse(&map?.get(key)?.0).ok()?;
    Some(q.scaled(scale).clamp(i64::MIN.into(), i64::MAX.into()) as i64)
}

/// A pod as the scheduler accounts for it: requests and the key its replicas share.
#[derive(Debug)]
pub struct PodInfo {
    /// The pod.
    pub pod: Arc<Pod>,
    /// `metadata.uid`.
    pub uid: String,
    /// Effective requests (sum of containers, at least the largest init container).
    pub requests: Resources,
    /// Requests with kube-scheduler's non-zero defaults, used for scoring.
    pub nonzero: Resources,
    /// Pods with the same key are spread across nodes: the controlling owner, or the
    /// namespace and labels of a bare pod.
    pub spread_key: String,
    /// The claims its volumes use (`persistentVolumeClaim` and generic ephemeral volumes);
    /// empty for most pods, which then never look at volumes.
    pub claims: Vec<PodClaim>,
}

/// A claim a pod's volume uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodClaim {
    /// The claim's name (in the pod's namespace).
    pub name: String,
    /// Whether it comes from a generic ephemeral volume (`<pod>-<volume>`).
    pub ephemeral: bool,
}

impl PodInfo {
    /// Computes the accounting view of `pod`.
    pub fn new(pod: Arc<Pod>) -> PodInfo {
        let mut requests = Resources::default();
        let mut nonzero = Resources::default();
        let mut init = Resources::default();
        if let Some(spec) = &pod.spec {
            let of = |c: &k8s_openapi::api::core::v1::Container| {
                let r = c.resources.as_ref();
                let get = |key: &str, scale: i32| {
                    quantity(r.and_then(|r| r.requests.as_ref()), key, scale)
                        .or_else(|| quantity(r.and_then(|r| r.limits.as_ref()), key, scale))
                };
                (get("cpu", 3), get("memory", 0))
            };
            for c in &spec.containers {
                let (cpu, mem) = of(c);
                requests.add(Resources {
                    cpu_milli: cpu.unwrap_or(0),
                    memory: mem.unwrap_or(0),
                });
                nonzero.add(Resources {
                    cpu_milli: cpu.filter(|v| *v > 0).unwrap_or(DEFAULT_MILLI_CPU),
                    memory: mem.filter(|v| *v > 0).unwrap_or(DEFAULT_MEMORY),
                });
            }
            for c in spec.init_containers.iter().flatten() {
                let (cpu, mem) = of(c);
                init = init.max(Resources {
                    cpu_milli: cpu.unwrap_or(0),
                    memory: mem.unwrap_or(0),
                });
            }
        }
        requests = requests.max(init);
        let meta = &pod.metadata;
        let claims = pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|v| {
                if let Some(c) = &v.persistent_volume_claim {
                    Some(PodClaim {
                        name: c.claim_name.clone(),
                        ephemeral: false,
                    })
                } else {
                    v.ephemeral.as_ref().map(|_| PodClaim {
                        name: format!("{}-{}", meta.name.as_deref().unwrap_or(""), v.name),
                        ephemeral: true,
                    })
                }
            })
            .collect();
        let spread_key = match meta
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
        {
            Some(owner) => format!("owner:{}", owner.uid),
            None => {
                let labels: Vec<String> = meta
                    .labels
                    .iter()
                    .flatten()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                format!(
                    "labels:{}/{}",
                    meta.namespace.as_deref().unwrap_or(""),
                    labels.join(",")
                )
            }
        };
        PodInfo {
            uid: meta.uid.clone().unwrap_or_default(),
            pod,
            requests,
            nonzero,
            spread_key,
            claims,
        }
    }

    fn namespace(&self) -> &str {
        self.pod.metadata.namespace.as_deref().unwrap_or("")
    }

    fn anti_affinity_terms(&self) -> &[PodAffinityTerm] {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.pod_anti_affinity.as_ref())
            .and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_deref()
            })
            .unwrap_or(&[])
    }
}

/// One node and what is placed on it.
#[derive(Debug, Default)]
pub struct NodeState {
    node: Option<Arc<Node>>,
    allocatable: Resources,
    max_pods: i64,
    requested: Resources,
    nonzero: Resources,
    pods: HashMap<String, Arc<PodInfo>>,
    spread: HashMap<String, u32>,
}

impl NodeState {
    fn labels(&self) -> Option<&BTreeMap<String, String>> {
        self.node.as_ref()?.metadata.labels.as_ref()
    }
}

/// The scheduler's view of the cluster: nodes and the pods bound or assumed on them.
#[derive(Debug, Default)]
pub struct Snapshot {
    nodes: BTreeMap<String, NodeState>,
    placed: HashMap<String, String>,
    /// Placed pods with required anti-affinity terms (checked against incoming pods).
    anti: HashMap<String, Arc<PodInfo>>,
    /// Claims, volumes and classes, for pods with claims.
    volumes: Volumes,
}

/// The scheduler's view of storage: claims by `namespace/name`, volumes and classes by name.
#[derive(Debug, Default)]
pub struct Volumes {
    claims: HashMap<String, Arc<PersistentVolumeClaim>>,
    volumes: BTreeMap<String, Arc<PersistentVolume>>,
    classes: HashMap<String, Arc<StorageClass>>,
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
struct VolumeNeeds<'a> {
    /// Volumes of bound claims (None: the claim names a volume the cache does not hold).
    bound: Vec<Option<&'a PersistentVolume>>,
    /// Unbound WaitForFirstConsumer claims and their class, if it exists.
    delayed: Vec<(&'a PersistentVolumeClaim, Option<&'a StorageClass>)>,
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

/// VolumeBinding's PreFilter: every claim exists and is usable, and none waits to be bound
/// by the volume controller; the error is the reason kube-scheduler gives.
fn volume_needs<'a>(snap: &'a Snapshot, pod: &PodInfo) -> Result<VolumeNeeds<'a>, String> {
    let mut needs = VolumeNeeds::default();
    let vols = &snap.volumes;
    for c in &pod.claims {
        let Some(claim) = vols.claim(pod.namespace(), &c.name) else {
            return Err(if c.ephemeral {
                format!(
                    "waiting for ephemeral volume controller to create the persistentvolumeclaim \"{}\"",
                    c.name
                )
            } else {
                format!("persistentvolumeclaim \"{}\" not found", c.name)
            });
        };
        let volume_name = claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .unwrap_or("");
        if claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Lost") {
            return Err(format!(
                "persistentvolumeclaim \"{}\" bound to non-existent persistentvolume \"{volume_name}\"",
                c.name
            ));
        }
        if claim.metadata.deletion_timestamp.is_some() {
            return Err(format!(
                "persistentvolumeclaim \"{}\" is being deleted",
                c.name
            ));
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
            return Err("pod has unbound immediate PersistentVolumeClaims".into());
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
fn volumes_fit(snap: &Snapshot, needs: &VolumeNeeds<'_>, node: &Node) -> Result<(), Failure> {
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
        let static_fit = snap
            .volumes
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

impl Snapshot {
    /// Adds or updates a node; returns whether anything scheduling depends on changed.
    pub fn apply_node(&mut self, node: Node) -> bool {
        let name = node.metadata.name.clone().unwrap_or_default();
        let alloc = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
        let allocatable = Resources {
            cpu_milli: quantity(alloc, "cpu", 3).unwrap_or(0),
            memory: quantity(alloc, "memory", 0).unwrap_or(0),
        };
        let max_pods = quantity(alloc, "pods", 0).unwrap_or(0);
        let state = self.nodes.entry(name).or_default();
        let relevant = |n: &Node| {
            (
                n.metadata.labels.clone(),
                n.spec.as_ref().map(|s| (s.taints.clone(), s.unschedulable)),
            )
        };
        let changed = state.node.as_deref().map(relevant) != Some(relevant(&node))
            || state.allocatable != allocatable
            || state.max_pods != max_pods;
        state.node = Some(Arc::new(node));
        state.allocatable = allocatable;
        state.max_pods = max_pods;
        changed
    }

    /// Removes a node (pods still placed on it keep their accounting until they go).
    pub fn delete_node(&mut self, name: &str) {
        if let Some(state) = self.nodes.get_mut(name) {
            state.node = None;
            if state.pods.is_empty() {
                self.nodes.remove(name);
            }
        }
    }

    /// Names of the known nodes.
    pub fn node_names(&self) -> impl Iterator<Item = &str> {
        self.nodes
            .iter()
            .filter(|(_, s)| s.node.is_some())
            .map(|(n, _)| n.as_str())
    }

    /// Places `pod` on `node` (bound or assumed), replacing an earlier placement.
    pub fn place(&mut self, pod: Arc<PodInfo>, node: &str) {
        self.forget(&pod.uid);
        let state = self.nodes.entry(node.to_string()).or_default();
        state.requested.add(pod.requests);
        state.nonzero.add(pod.nonzero);
        *state.spread.entry(pod.spread_key.clone()).or_default() += 1;
        if !pod.anti_affinity_terms().is_empty() {
            self.anti.insert(pod.uid.clone(), pod.clone());
        }
        self.placed.insert(pod.uid.clone(), node.to_string());
        state.pods.insert(pod.uid.clone(), pod);
    }

    /// Removes a pod's placement; returns whether it was placed.
    pub fn forget(&mut self, uid: &str) -> bool {
        let Some(node) = self.placed.remove(uid) else {
            return false;
        };
        self.anti.remove(uid);
        if let Some(state) = self.nodes.get_mut(&node) {
            if let Some(pod) = state.pods.remove(uid) {
                state.requested.sub(pod.requests);
                state.nonzero.sub(pod.nonzero);
                if let Some(n) = state.spread.get_mut(&pod.spread_key) {
                    *n -= 1;
                    if *n == 0 {
                        state.spread.remove(&pod.spread_key);
                    }
                }
            }
            if state.node.is_none() && state.pods.is_empty() {
                self.nodes.remove(&node);
            }
        }
        true
    }

    /// The node a pod is placed on.
    pub fn node_of(&self, uid: &str) -> Option<&str> {
        self.placed.get(uid).map(String::as_str)
    }

    /// Uids of all placed pods.
    pub fn placed_uids(&self) -> impl Iterator<Item = &String> {
        self.placed.keys()
    }

    /// The storage view, to update from watches.
    pub fn volumes_mut(&mut self) -> &mut Volumes {
        &mut self.volumes
    }

    /// The claims of `pod` still waiting for a node (unbound, WaitForFirstConsumer): the ones
    /// to annotate with the chosen node before the pod is bound.
    pub fn claims_to_select(&self, pod: &PodInfo) -> Vec<String> {
        match volume_needs(self, pod) {
            Ok(needs) => needs
                .delayed
                .iter()
                .filter_map(|(c, _)| c.metadata.name.clone())
                .collect(),
            Err(_) => Vec::new(),
        }
    }
}

/// Why a pod fits no node, counted per reason like kube-scheduler's `FitError`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FitError {
    /// Number of nodes considered.
    pub nodes: usize,
    /// Filter reason → number of nodes that failed with it.
    pub reasons: BTreeMap<String, usize>,
    /// Preemption verdict → number of nodes.
    pub preemption: BTreeMap<String, usize>,
    /// Set when the pod may not preempt at all.
    pub preemption_never: bool,
    /// Why the pod fits no node before any node was looked at (a PreFilter's reason).
    pub prefilter: Option<String>,
}

fn histogram(map: &BTreeMap<String, usize>) -> String {
    let mut parts: Vec<String> = map.iter().map(|(r, n)| format!("{n} {r}")).collect();
    parts.sort();
    parts.join(", ")
}

impl fmt::Display for FitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nodes == 0 {
            return write!(f, "no nodes available to schedule pods");
        }
        match &self.prefilter {
            Some(reason) => write!(f, "0/{} nodes are available: {reason}.", self.nodes)?,
            None => write!(
                f,
                "0/{} nodes are available: {}.",
                self.nodes,
                histogram(&self.reasons)
            )?,
        }
        if self.preemption_never {
            write!(
                f,
                " preemption: not eligible due to preemptionPolicy=Never."
            )
        } else {
            write!(
                f,
                " preemption: 0/{} nodes are available: {}.",
                self.nodes,
                histogram(&self.preemption)
            )
        }
    }
}

impl std::error::Error for FitError {}

/// A filter failure: its reason and whether evicting pods could resolve it.
struct Failure {
    reasons: Vec<String>,
    resolvable: bool,
}

impl Failure {
    fn unresolvable(reason: impl Into<String>) -> Failure {
        Failure {
            reasons: vec![reason.into()],
            resolvable: false,
        }
    }
}

/// Whether `toleration` tolerates `taint` (core/v1 `Toleration.ToleratesTaint`).
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = toleration.effect.as_deref().filter(|e| !e.is_empty())
        && effect != taint.effect
    {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or("");
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => {
            !key.is_empty()
                && toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
        _ => false,
    }
}

fn tolerations(pod: &Pod) -> &[Toleration] {
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or(&[])
}

fn requirement_matches(req: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = req.values.as_deref().unwrap_or(&[]);
    match req.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (
                value.and_then(|v| v.parse::<i64>().ok()),
                values.first().and_then(|b| b.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if req.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

/// Whether a node selector term matches a node (an empty term matches nothing).
pub fn term_matches(term: &NodeSelectorTerm, node: &Node) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or(&[]);
    let fields = term.match_fields.as_deref().unwrap_or(&[]);
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    let labels = node.metadata.labels.as_ref();
    exprs
        .iter()
        .all(|r| requirement_matches(r, labels.and_then(|l| l.get(&r.key)).map(String::as_str)))
        && fields.iter().all(|r| {
            r.key == "metadata.name" && requirement_matches(r, node.metadata.name.as_deref())
        })
}

fn node_affinity_matches(pod: &Pod, node: &Node) -> bool {
    pod.spec
        .as_ref()
        .is_none_or(|spec| selects_node(spec, node))
}

/// Whether a pod spec's nodeSelector and required node affinity select `node` (kube's
/// NodeAffinity filter; the DaemonSet controller asks the same question).
pub fn selects_node(spec: &PodSpec, node: &Node) -> bool {
    let labels = node.metadata.labels.as_ref();
    let selector_ok = spec
        .node_selector
        .iter()
        .flatten()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v));
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    selector_ok
        && required.is_none_or(|r| r.node_selector_terms.iter().any(|t| term_matches(t, node)))
}

/// Whether a metav1 label selector matches `labels` (a missing selector matches nothing).
pub fn label_selector_matches(
    selector: Option<&LabelSelector>,
    labels: Option<&BTreeMap<String, String>>,
) -> bool {
    let Some(selector) = selector else {
        return false;
    };
    let get = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| get(k) == Some(v.as_str()))
        && selector.match_expressions.iter().flatten().all(|r| {
            let values = r.values.as_deref().unwrap_or(&[]);
            let value = get(&r.key);
            match r.operator.as_str() {
                "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
                "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                _ => false,
            }
        })
}

/// Whether an affinity term of `owner` (a pod in `owner_ns`) selects `target`.
fn affinity_term_selects(term: &PodAffinityTerm, owner_ns: &str, target: &PodInfo) -> bool {
    let ns_ok = match (&term.namespaces, &term.namespace_selector) {
        (_, Some(sel))
            if sel.match_labels.as_ref().is_none_or(|m| m.is_empty())
                && sel.match_expressions.as_ref().is_none_or(|m| m.is_empty()) =>
        {
            true
        }
        (Some(list), _) if !list.is_empty() => list.iter().any(|n| n == target.namespace()),
        _ => owner_ns == target.namespace(),
    };
    ns_ok
        && label_selector_matches(
            term.label_selector.as_ref(),
            target.pod.metadata.labels.as_ref(),
        )
}

fn topology_value<'a>(state: &'a NodeState, key: &str) -> Option<&'a str> {
    state.labels()?.get(key).map(String::as_str)
}

fn filter(
    snap: &Snapshot,
    pod: &PodInfo,
    state: &NodeState,
    anti: &AntiAffinity,
    volumes: Option<&VolumeNeeds<'_>>,
) -> Result<(), Failure> {
    let Some(node) = state.node.as_deref() else {
        return Err(Failure::unresolvable("node(s) not found"));
    };
    let tols = tolerations(&pod.pod);
    let spec = node.spec.as_ref();
    if spec.and_then(|s| s.unschedulable).unwrap_or(false) {
        let taint = Taint {
            key: "node.kubernetes.io/unschedulable".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        };
        if !tols.iter().any(|t| tolerates(t, &taint)) {
            return Err(Failure::unresolvable("node(s) were unschedulable"));
        }
    }
    if let Some(taint) = spec
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .find(|taint| !tols.iter().any(|t| tolerates(t, taint)))
    {
        return Err(Failure::unresolvable(format!(
            "node(s) had untolerated taint {{{}: {}}}",
            taint.key,
            taint.value.as_deref().unwrap_or("")
        )));
    }
    if !node_affinity_matches(&pod.pod, node) {
        return Err(Failure::unresolvable(
            "node(s) didn't match Pod's node affinity/selector",
        ));
    }
    let mut reasons = Vec::new();
    if state.pods.len() as i64 + 1 > state.max_pods {
        reasons.push("Too many pods".to_string());
    }
    if pod.requests.cpu_milli > 0
        && pod.requests.cpu_milli > state.allocatable.cpu_milli - state.requested.cpu_milli
    {
        reasons.push("Insufficient cpu".to_string());
    }
    if pod.requests.memory > 0
        && pod.requests.memory > state.allocatable.memory - state.requested.memory
    {
        reasons.push("Insufficient memory".to_string());
    }
    if !reasons.is_empty() {
        return Err(Failure {
            reasons,
            resolvable: true,
        });
    }
    if let Some(needs) = volumes {
        volumes_fit(snap, needs, node)?;
    }
    if anti
        .own
        .iter()
        .any(|(key, value)| topology_value(state, key) == Some(value.as_str()))
    {
        return Err(Failure {
            reasons: vec!["node(s) didn't match pod anti-affinity rules".into()],
            resolvable: true,
        });
    }
    if anti
        .existing
        .iter()
        .any(|(key, value)| topology_value(state, key) == Some(value.as_str()))
    {
        return Err(Failure {
            reasons: vec!["node(s) didn't satisfy existing pods anti-affinity rules".into()],
            resolvable: true,
        });
    }
    Ok(())
}

/// Topology domains (label key, value) the pod may not join.
#[derive(Default)]
struct AntiAffinity {
    /// Domains of placed pods whose anti-affinity selects the incoming pod.
    existing: HashSet<(String, String)>,
    /// Domains holding pods the incoming pod's anti-affinity selects.
    own: HashSet<(String, String)>,
}

impl AntiAffinity {
    fn of(snap: &Snapshot, pod: &PodInfo) -> AntiAffinity {
        let mut out = AntiAffinity::default();
        for other in snap.anti.values() {
            let Some(state) = snap.node_of(&other.uid).and_then(|n| snap.nodes.get(n)) else {
                continue;
            };
            for term in other.anti_affinity_terms() {
                if affinity_term_selects(term, other.namespace(), pod)
                    && let Some(v) = topology_value(state, &term.topology_key)
                {
                    out.existing
                        .insert((term.topology_key.clone(), v.to_string()));
                }
            }
        }
        let terms = pod.anti_affinity_terms();
        if !terms.is_empty() {
            // One pass over placed pods, only for pods that carry anti-affinity.
            for state in snap.nodes.values() {
                for other in state.pods.values() {
                    for term in terms {
                        if affinity_term_selects(term, pod.namespace(), other)
                            && let Some(v) = topology_value(state, &term.topology_key)
                        {
                            out.own.insert((term.topology_key.clone(), v.to_string()));
                        }
                    }
                }
            }
        }
        out
    }
}

fn preferred_affinity(pod: &Pod, node: &Node) -> i64 {
    pod.spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.preferred_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .into_iter()
        .flatten()
        .filter(|p| term_matches(&p.preference, node))
        .map(|p| i64::from(p.weight))
        .sum()
}

fn intolerable_prefer_no_schedule(pod: &Pod, node: &Node) -> i64 {
    let tols = tolerations(pod);
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| t.effect == "PreferNoSchedule")
        .filter(|taint| {
            !tols.iter().any(|t| {
                (t.effect.as_deref().unwrap_or("").is_empty()
                    || t.effect.as_deref() == Some("PreferNoSchedule"))
                    && tolerates(t, taint)
            })
        })
        .count() as i64
}

fn least_allocated(state: &NodeState, pod: &PodInfo) -> i64 {
    let score = |cap: i64, used: i64| {
        if cap <= 0 || used > cap {
            0
        } else {
            (cap - used) * 100 / cap
        }
    };
    (score(
        state.allocatable.cpu_milli,
        state.nonzero.cpu_milli + pod.nonzero.cpu_milli,
    ) + score(
        state.allocatable.memory,
        state.nonzero.memory + pod.nonzero.memory,
    )) / 2
}

/// Picks the node for `pod`: filters like kube-scheduler's default plugins, then scores by
/// preferred node affinity (weight 2), PreferNoSchedule taints (3), least-allocated
/// resources (1) and spreading of the pod's replicas (2); ties go to the node with fewer
/// replicas, then fewer pods, then the first name.
pub fn decide(snap: &Snapshot, pod: &PodInfo) -> Result<String, FitError> {
    let mut error = FitError {
        nodes: 0,
        reasons: BTreeMap::new(),
        preemption: BTreeMap::new(),
        preemption_never: pod
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.preemption_policy.as_deref())
            == Some("Never"),
        prefilter: None,
    };
    // Only pods with claims look at volumes.
    let volumes = if pod.claims.is_empty() {
        None
    } else {
        match volume_needs(snap, pod) {
            Ok(needs) => Some(needs),
            Err(reason) => {
                error.nodes = snap.node_names().count();
                error.prefilter = Some(reason);
                error.preemption.insert(
                    "Preemption is not helpful for scheduling".to_string(),
                    error.nodes,
                );
                return Err(error);
            }
        }
    };
    let anti = AntiAffinity::of(snap, pod);
    let mut feasible: Vec<(&str, &NodeState)> = Vec::new();
    for (name, state) in &snap.nodes {
        if state.node.is_none() {
            continue;
        }
        error.nodes += 1;
        match filter(snap, pod, state, &anti, volumes.as_ref()) {
            Ok(()) => feasible.push((name, state)),
            Err(failure) => {
                for r in failure.reasons {
                    *error.reasons.entry(r).or_default() += 1;
                }
                let verdict = if failure.resolvable {
                    "No preemption victims found for incoming pod"
                } else {
                    "Preemption is not helpful for scheduling"
                };
                *error.preemption.entry(verdict.to_string()).or_default() += 1;
            }
        }
    }
    if feasible.is_empty() {
        return Err(error);
    }
    let raw: Vec<(i64, i64, i64, u32)> = feasible
        .iter()
        .map(|(_, s)| {
            let node = s.node.as_deref().expect("feasible nodes exist");
            (
                preferred_affinity(&pod.pod, node),
                intolerable_prefer_no_schedule(&pod.pod, node),
                least_allocated(s, pod),
                s.spread.get(&pod.spread_key).copied().unwrap_or(0),
            )
        })
        .collect();
    let max_aff = raw.iter().map(|r| r.0).max().unwrap_or(0);
    let max_taint = raw.iter().map(|r| r.1).max().unwrap_or(0);
    let max_spread = raw.iter().map(|r| r.3).max().unwrap_or(0);
    let best = feasible
        .iter()
        .zip(&raw)
        .map(|((name, state), &(aff, taints, alloc, spread))| {
            let aff = if max_aff > 0 { aff * 100 / max_aff } else { 0 };
            let taints = if max_taint > 0 {
                100 - taints * 100 / max_taint
            } else {
                100
            };
            let spread_score = if max_spread > 0 {
                i64::from(max_spread - spread) * 100 / i64::from(max_spread)
            } else {
                100
            };
            let score = 2 * aff + 3 * taints + alloc + 2 * spread_score;
            (
                score,
                std::cmp::Reverse(spread),
                std::cmp::Reverse(state.pods.len()),
                std::cmp::Reverse(*name),
            )
        })
        .max()
        .expect("at least one feasible node");
    Ok(best.3.0.to_string())
}

fn responsible_for(pod: &Pod) -> bool {
    let spec = pod.spec.as_ref();
    let name = spec.and_then(|s| s.scheduler_name.as_deref()).unwrap_or("");
    (name.is_empty() || name == SCHEDULER_NAME)
        && spec
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or("")
            .is_empty()
}

fn is_bound(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty())
}

fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// How many bindings may be in flight at once (more only queues in the API server).
const MAX_IN_FLIGHT: usize = 64;
/// How many failure reports (status patch and event) may be in flight at once.
const MAX_REPORTS: usize = 16;
/// How many pods one loop turn decides before it looks at events again.
const BATCH: usize = 512;
/// Unschedulable pods are retried at least this often when nothing changes.
const RETRY_PERIOD: Duration = Duration::from_secs(10);
/// ...and at most this often when nodes or pods change.
const RETRY_MIN: Duration = Duration::from_millis(500);

/// How long a pod waits for its WaitForFirstConsumer claims to be bound once it has a node
/// (kube-scheduler's `bindTimeoutSeconds`).
const VOLUME_BIND_TIMEOUT: Duration = Duration::from_secs(600);

/// The outcome of one binding request.
struct Bound {
    uid: String,
    node: String,
    result: Result<(), BindError>,
    /// Whether it counted against MAX_IN_FLIGHT (pods waiting for volumes do not).
    counted: bool,
}

/// Why a pod could not be bound.
#[derive(Debug, thiserror::Error)]
enum BindError {
    /// The binding (or a claim's annotation) was refused.
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// A claim was not bound in time.
    #[error("binding volumes: timed out waiting for persistentvolumeclaim {0:?} to be bound")]
    VolumeTimeout(String),
}

/// What the scheduling loop does next for one pod.
enum Step {
    /// Nothing (the pod went away, or its failure was already reported).
    Skip,
    /// Bind the pod, already assumed on `node`, once `claims` (WaitForFirstConsumer) name
    /// that node and are bound.
    Bind {
        uid: String,
        pod: Arc<Pod>,
        node: String,
        claims: Vec<String>,
    },
    /// Report why the pod fits nowhere.
    Report { pod: Arc<Pod>, message: String },
}

/// The scheduling queue and cache, fed by watch events.
struct Queue {
    snap: Snapshot,
    /// Unbound pods this scheduler is responsible for, by uid.
    pending: HashMap<String, Arc<Pod>>,
    /// Pods to decide, highest `spec.priority` first, then in arrival order. Entries whose
    /// uid is no longer in `in_active` are stale and skipped (removal is lazy, O(1)).
    active: BinaryHeap<(i32, Reverse<u64>, String)>,
    in_active: HashSet<String>,
    arrivals: u64,
    unschedulable: HashSet<String>,
    /// Pods assumed on a node while their binding is in flight.
    assumed: HashMap<String, String>,
    /// Last failure message reported per pod (reported again only when it changes).
    reported: HashMap<String, String>,
    changed: bool,
    last_retry: Instant,
    nodes_synced: bool,
    pods_synced: bool,
    /// Claims, volumes and classes listed (pods with claims wait for all three).
    volumes_synced: [bool; 3],
    init_nodes: HashSet<String>,
    init_pods: HashSet<String>,
}

impl Queue {
    fn new() -> Queue {
        Queue {
            snap: Snapshot::default(),
            pending: HashMap::new(),
            active: BinaryHeap::new(),
            in_active: HashSet::new(),
            arrivals: 0,
            unschedulable: HashSet::new(),
            assumed: HashMap::new(),
            reported: HashMap::new(),
            changed: false,
            last_retry: Instant::now(),
            nodes_synced: false,
            pods_synced: false,
            volumes_synced: [false; 3],
            init_nodes: HashSet::new(),
            init_pods: HashSet::new(),
        }
    }

    fn on_node(&mut self, event: Event<Node>) {
        match event {
            Event::Init => self.init_nodes.clear(),
            Event::InitApply(node) | Event::Apply(node) => {
                self.init_nodes
                    .insert(node.metadata.name.clone().unwrap_or_default());
                self.changed |= self.snap.apply_node(node);
            }
            Event::Delete(node) => {
                self.snap
                    .delete_node(node.metadata.name.as_deref().unwrap_or(""));
                self.changed = true;
            }
            Event::InitDone => {
                let gone: Vec<String> = self
                    .snap
                    .node_names()
                    .filter(|n| !self.init_nodes.contains(*n))
                    .map(str::to_string)
                    .collect();
                for n in gone {
                    self.snap.delete_node(&n);
                }
                self.nodes_synced = true;
                self.changed = true;
            }
        }
    }

    fn on_claim(&mut self, event: Event<PersistentVolumeClaim>) {
        let vols = self.snap.volumes_mut();
        match event {
            Event::Init => vols.claims.clear(),
            Event::InitApply(c) | Event::Apply(c) => vols.apply_claim(c),
            Event::Delete(c) => vols.delete_claim(
                c.metadata.namespace.as_deref().unwrap_or(""),
                c.metadata.name.as_deref().unwrap_or(""),
            ),
            Event::InitDone => self.volumes_synced[0] = true,
        }
        self.changed = true;
    }

    fn on_volume(&mut self, event: Event<PersistentVolume>) {
        let vols = self.snap.volumes_mut();
        match event {
            Event::Init => vols.volumes.clear(),
            Event::InitApply(v) | Event::Apply(v) => vols.apply_volume(v),
            Event::Delete(v) => vols.delete_volume(v.metadata.name.as_deref().unwrap_or("")),
            Event::InitDone => self.volumes_synced[1] = true,
        }
        self.changed = true;
    }

    fn on_class(&mut self, event: Event<StorageClass>) {
        let vols = self.snap.volumes_mut();
        match event {
            Event::Init => vols.classes.clear(),
            Event::InitApply(c) | Event::Apply(c) => vols.apply_class(c),
            Event::Delete(c) => vols.delete_class(c.metadata.name.as_deref().unwrap_or("")),
            Event::InitDone => self.volumes_synced[2] = true,
        }
        self.changed = true;
    }

    fn drop_pod(&mut self, uid: &str) {
        self.pending.remove(uid);
        self.unschedulable.remove(uid);
        self.reported.remove(uid);
        self.in_active.remove(uid);
    }

    fn on_pod(&mut self, event: Event<Pod>) {
        match event {
            Event::Init => self.init_pods.clear(),
            Event::InitApply(pod) | Event::Apply(pod) => {
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                self.init_pods.insert(uid.clone());
                let node = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .filter(|n| !n.is_empty());
                if let Some(node) = node {
                    self.drop_pod(&uid);
                    self.assumed.remove(&uid);
                    if is_terminal(&pod) {
                        self.changed |= self.snap.forget(&uid);
                    } else if self.snap.node_of(&uid) != Some(node.as_str()) {
                        self.snap
                            .place(Arc::new(PodInfo::new(Arc::new(pod))), &node);
                    }
                } else if responsible_for(&pod)
                    && pod.metadata.deletion_timestamp.is_none()
                    && !is_terminal(&pod)
                {
                    if self.assumed.contains_key(&uid) {
                        return;
                    }
                    self.pending.insert(uid.clone(), Arc::new(pod));
                    if !self.unschedulable.contains(&uid) {
                        self.enqueue(uid);
                    }
                } else {
                    self.drop_pod(&uid);
                }
            }
            Event::Delete(pod) => {
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                self.drop_pod(&uid);
                self.assumed.remove(&uid);
                self.changed |= self.snap.forget(&uid);
            }
            Event::InitDone => {
                let gone: Vec<String> = self
                    .snap
                    .placed_uids()
                    .chain(self.pending.keys())
                    .filter(|u| !self.init_pods.contains(*u) && !self.assumed.contains_key(*u))
                    .cloned()
                    .collect();
                for uid in gone {
                    self.drop_pod(&uid);
                    self.snap.forget(&uid);
                }
                self.pods_synced = true;
                self.changed = true;
            }
        }
    }

    fn on_bound(&mut self, bound: Bound) {
        let Err(e) = bound.result else { return };
        if self.assumed.get(&bound.uid) != Some(&bound.node) {
            return;
        }
        tracing::warn!(uid = %bound.uid, node = %bound.node, "binding failed: {e}");
        self.assumed.remove(&bound.uid);
        self.snap.forget(&bound.uid);
        if self.pending.contains_key(&bound.uid) {
            self.unschedulable.insert(bound.uid);
        }
        self.changed = true;
    }

    /// Adds a pending pod to the active queue (once).
    fn enqueue(&mut self, uid: String) {
        if self.in_active.insert(uid.clone()) {
            let priority = self
                .pending
                .get(&uid)
                .and_then(|p| p.spec.as_ref()?.priority)
                .unwrap_or(0);
            self.arrivals += 1;
            self.active.push((priority, Reverse(self.arrivals), uid));
        }
    }

    /// Decides the next pod of the active queue: assumes it on its node (to be bound), or
    /// parks it as unschedulable (to be reported if the reason changed). None when the active
    /// queue is empty.
    fn step(&mut self) -> Option<Step> {
        let uid = loop {
            let (_, _, uid) = self.active.pop()?;
            if self.in_active.remove(&uid) {
                break uid;
            }
        };
        let Some(pod) = self.pending.get(&uid).cloned() else {
            return Some(Step::Skip);
        };
        let info = Arc::new(PodInfo::new(pod.clone()));
        if !info.claims.is_empty() && self.volumes_synced.contains(&false) {
            // Judged once the claims, volumes and classes are listed.
            self.unschedulable.insert(uid);
            return Some(Step::Skip);
        }
        Some(match decide(&self.snap, &info) {
            Ok(node) => {
                let claims = if info.claims.is_empty() {
                    Vec::new()
                } else {
                    self.snap.claims_to_select(&info)
                };
                self.snap.place(info, &node);
                self.assumed.insert(uid.clone(), node.clone());
                Step::Bind {
                    uid,
                    pod,
                    node,
                    claims,
                }
            }
            Err(fit) => {
                let message = fit.to_string();
                self.unschedulable.insert(uid.clone());
                if self.reported.get(&uid) == Some(&message) {
                    Step::Skip
                } else {
                    self.reported.insert(uid, message.clone());
                    Step::Report { pod, message }
                }
            }
        })
    }

    /// Moves unschedulable pods back to the active queue when the cluster changed (or
    /// periodically).
    fn maybe_retry(&mut self) {
        self.retry_if(false);
    }

    #[cfg(test)]
    fn maybe_retry_now(&mut self) {
        self.retry_if(true);
    }

    fn retry_if(&mut self, force: bool) {
        let since = self.last_retry.elapsed();
        if force || (self.changed && since >= RETRY_MIN) || since >= RETRY_PERIOD {
            self.changed = false;
            self.last_retry = Instant::now();
            let parked: Vec<String> = self.unschedulable.drain().collect();
            for uid in parked {
                self.enqueue(uid);
            }
        }
    }
}

/// Runs the scheduler until the process ends. `nodes_seen` carries the resourceVersion of the
/// last node event its cache has applied (the lab's resourceVersions are one increasing
/// counter), so tests can wait until a node change is visible to scheduling decisions.
pub async fn run(client: kube::Client, nodes_seen: watch::Sender<u64>) -> anyhow::Result<()> {
    let nodes = watcher(Api::<Node>::all(client.clone()));
    let pods = watcher(Api::<Pod>::all(client.clone()));
    let claims = watcher(Api::<PersistentVolumeClaim>::all(client.clone()));
    let volumes = watcher(Api::<PersistentVolume>::all(client.clone()));
    let classes = watcher(Api::<StorageClass>::all(client.clone()));
    futures::pin_mut!(nodes, pods, claims, volumes, classes);
    let (tx, mut rx) = mpsc::unbounded_channel::<Bound>();
    let mut q = Queue::new();
    let mut in_flight = 0usize;
    let reports = Arc::new(tokio::sync::Semaphore::new(MAX_REPORTS));
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    let events = crate::events::Recorder::new(client.clone(), SCHEDULER_NAME);
    loop {
        tokio::select! {
            Some(ev) = nodes.next() => {
                let rv = node_event_version(&ev);
                q.on_node(ev);
                if let Some(rv) = rv {
                    nodes_seen.send_if_modified(|seen| {
                        let newer = rv > *seen;
                        if newer {
                            *seen = rv;
                        }
                        newer
                    });
                }
            }
            Some(ev) = pods.next() => q.on_pod(ev),
            Some(ev) = claims.next() => q.on_claim(ev),
            Some(ev) = volumes.next() => q.on_volume(ev),
            Some(ev) = classes.next() => q.on_class(ev),
            Some(b) = rx.recv() => { in_flight -= usize::from(b.counted); q.on_bound(b) },
            _ = tick.tick() => q.maybe_retry(),
        }
        if !(q.nodes_synced && q.pods_synced) {
            continue;
        }
        let mut budget = BATCH;
        while in_flight < MAX_IN_FLIGHT && budget > 0 {
            budget -= 1;
            match q.step() {
                None => break,
                Some(Step::Skip) => {}
                Some(Step::Bind {
                    uid,
                    pod,
                    node,
                    claims,
                }) => {
                    // Pods waiting for volumes may wait long: they do not hold up the others.
                    let counted = claims.is_empty();
                    in_flight += usize::from(counted);
                    tokio::spawn(bind(
                        client.clone(),
                        events.clone(),
                        pod,
                        uid,
                        node,
                        claims,
                        tx.clone(),
                    ));
                }
                Some(Step::Report { pod, message }) => {
                    let (client, reports) = (client.clone(), reports.clone());
                    tokio::spawn(async move {
                        let _permit = reports.acquire_owned().await;
                        report(client, pod, message).await;
                    });
                }
            }
        }
    }
}

/// The resourceVersion a node event carries, if it carries a node.
fn node_event_version(ev: &Event<Node>) -> Option<u64> {
    match ev {
        Event::InitApply(n) | Event::Apply(n) | Event::Delete(n) => {
            n.metadata.resource_version.as_deref()?.parse().ok()
        }
        Event::Init | Event::InitDone => None,
    }
}

/// A watch stream that logs and retries errors with backoff instead of ending.
fn watcher<K>(api: Api<K>) -> impl futures::Stream<Item = Event<K>> + Send
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + fmt::Debug + Send + 'static,
{
    watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .filter_map(|ev| async move { ev.map_err(|e| tracing::warn!("scheduler watch: {e}")).ok() })
}

async fn bind(
    client: kube::Client,
    events: crate::events::Recorder,
    pod: Arc<Pod>,
    uid: String,
    node: String,
    claims: Vec<String>,
    done: mpsc::UnboundedSender<Bound>,
) {
    let counted = claims.is_empty();
    let result = bind_volumes(&client, &pod, &node, &claims).await;
    let result = match result {
        Ok(()) => bind_pod(client, &pod, &uid, &node)
            .await
            .map_err(BindError::from),
        Err(e) => Err(e),
    };
    if result.is_ok() {
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        events.pod(
            &pod,
            None,
            crate::events::PodEvent {
                reason: "Scheduled",
                type_: "Normal",
                message: format!("Successfully assigned {ns}/{name} to {node}"),
                component: SCHEDULER_NAME,
                action: "Binding",
            },
        );
    }
    let _ = done.send(Bound {
        uid,
        node,
        result,
        counted,
    });
}

/// VolumeBinding's PreBind: names the chosen node on each WaitForFirstConsumer claim, then
/// waits until the volume controller (or a provisioner) has bound every one of them.
async fn bind_volumes(
    client: &kube::Client,
    pod: &Pod,
    node: &str,
    claims: &[String],
) -> Result<(), BindError> {
    if claims.is_empty() {
        return Ok(());
    }
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let api = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns);
    for claim in claims {
        let patch = serde_json::json!({"metadata": {"annotations": {
            "volume.kubernetes.io/selected-node": node,
        }}});
        api.patch(claim, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
    }
    let deadline = Instant::now() + VOLUME_BIND_TIMEOUT;
    for claim in claims {
        loop {
            let current = api.get(claim).await?;
            let bound = current
                .spec
                .as_ref()
                .and_then(|s| s.volume_name.as_deref())
                .is_some_and(|v| !v.is_empty())
                && current.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
            if bound {
                break;
            }
            if Instant::now() >= deadline {
                return Err(BindError::VolumeTimeout(claim.clone()));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

async fn bind_pod(
    client: kube::Client,
    pod: &Pod,
    uid: &str,
    node: &str,
) -> Result<(), kube::Error> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let binding = Binding {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(ns.clone()),
            uid: Some(uid.to_string()),
            ..Default::default()
        },
        target: ObjectReference {
            kind: Some("Node".into()),
            api_version: Some("v1".into()),
            name: Some(node.to_string()),
            ..Default::default()
        },
    };
    Api::<Pod>::namespaced(client, &ns)
        .create_subresource::<_, serde_json::Value>(
            "binding",
            &name,
            &PostParams::default(),
            &binding,
        )
        .await
        .map(|_| ())
}

/// Sets PodScheduled=False (reason Unschedulable) and records a FailedScheduling event.
async fn report(client: kube::Client, pod: Arc<Pod>, message: String) {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let now = k8s_openapi::jiff::Timestamp::now();
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    // The patch carries the pod's resourceVersion so that it cannot land after a binding
    // (which would leave a bound pod with PodScheduled=False); on conflict, look again.
    let mut rv = pod.metadata.resource_version.clone();
    for _ in 0..3 {
        let status = serde_json::json!({
            "metadata": {"resourceVersion": rv},
            "status": {"conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": message, "lastProbeTime": null, "lastTransitionTime": Time(now),
            }]},
        });
        match pods
            .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&status))
            .await
        {
            Ok(_) => break,
            Err(e) if tandem_api::client::is_conflict(&e) => match pods.get_opt(&name).await {
                Ok(Some(fresh)) if fresh.metadata.uid == pod.metadata.uid && !is_bound(&fresh) => {
                    rv = fresh.metadata.resource_version;
                }
                _ => return,
            },
            Err(e) => {
                tracing::debug!(pod = %name, "setting PodScheduled=False: {e}");
                return;
            }
        }
    }
    crate::events::record(
        &client,
        &pod,
        crate::events::PodEvent {
            reason: "FailedScheduling",
            type_: "Warning",
            message,
            component: SCHEDULER_NAME,
            action: "Scheduling",
        },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// A node under construction: `NodeFixture::new("n1").alloc("2", "4Gi").label("k", "v")`.
    struct NodeFixture(Value);

    impl NodeFixture {
        fn new(name: &str) -> Self {
            NodeFixture(json!({
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
                "spec": {},
                "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}},
            }))
        }
        fn alloc(mut self, cpu: &str, memory: &str) -> Self {
            self.0["status"]["allocatable"]["cpu"] = json!(cpu);
            self.0["status"]["allocatable"]["memory"] = json!(memory);
            self
        }
        fn max_pods(mut self, n: u32) -> Self {
            self.0["status"]["allocatable"]["pods"] = json!(n.to_string());
            self
        }
        fn label(mut self, k: &str, v: &str) -> Self {
            self.0["metadata"]["labels"][k] = json!(v);
            self
        }
        fn taint(mut self, key: &str, value: &str, effect: &str) -> Self {
            let t = json!({"key": key, "value": value, "effect": effect});
            match self.0["spec"]["taints"].as_array_mut() {
                Some(list) => list.push(t),
                None => self.0["spec"]["taints"] = json!([t]),
            }
            self
        }
        fn unschedulable(mut self) -> Self {
            self.0["spec"]["unschedulable"] = json!(true);
            self
        }
        fn build(self) -> Node {
            serde_json::from_value(self.0).expect("valid node fixture")
        }
    }

    /// A pod under construction: `PodFixture::new("web").requests("100m", "64Mi")`.
    struct PodFixture(Value);

    impl PodFixture {
        fn new(name: &str) -> Self {
            PodFixture(json!({
                "metadata": {"name": name, "namespace": "default", "uid": name,
                             "labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": "nginx"}]},
            }))
        }
        fn requests(mut self, cpu: &str, memory: &str) -> Self {
            self.0["spec"]["containers"][0]["resources"] =
                json!({"requests": {"cpu": cpu, "memory": memory}});
            self
        }
        fn uid(mut self, uid: &str) -> Self {
            self.0["metadata"]["uid"] = json!(uid);
            self
        }
        fn label(mut self, k: &str, v: &str) -> Self {
            self.0["metadata"]["labels"][k] = json!(v);
            self
        }
        fn owner(mut self, uid: &str) -> Self {
            self.0["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1",
                "kind": "ReplicaSet", "name": "rs", "uid": uid, "controller": true}]);
            self
        }
        fn node_selector(mut self, k: &str, v: &str) -> Self {
            self.0["spec"]["nodeSelector"][k] = json!(v);
            self
        }
        fn required_node_affinity(mut self, terms: Value) -> Self {
            self.0["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] =
                json!({"nodeSelectorTerms": terms});
            self
        }
        fn preferred_node_affinity(mut self, weight: i32, expr: Value) -> Self {
            self.0["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] =
                json!([{"weight": weight, "preference": {"matchExpressions": [expr]}}]);
            self
        }
        fn tolerate(mut self, toleration: Value) -> Self {
            match self.0["spec"]["tolerations"].as_array_mut() {
                Some(list) => list.push(toleration),
                None => self.0["spec"]["tolerations"] = json!([toleration]),
            }
            self
        }
        fn anti_affinity(mut self, app: &str) -> Self {
            self.0["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] = json!([{
                    "labelSelector": {"matchLabels": {"app": app}},
                    "topologyKey": "kubernetes.io/hostname"}]);
            self
        }
        fn info(self) -> Arc<PodInfo> {
            Arc::new(PodInfo::new(Arc::new(
                serde_json::from_value(self.0).expect("valid pod fixture"),
            )))
        }
    }

    fn snapshot(nodes: Vec<NodeFixture>, placed: Vec<(PodFixture, &str)>) -> Snapshot {
        let mut snap = Snapshot::default();
        for n in nodes {
            snap.apply_node(n.build());
        }
        for (p, node) in placed {
            snap.place(p.info(), node);
        }
        snap
    }

    fn nodes(names: &[&str]) -> Vec<NodeFixture> {
        names.iter().map(|n| NodeFixture::new(n)).collect()
    }

    /// (case, nodes, placed pods, pod, expected node or FailedScheduling message)
    type Case = (
        &'static str,
        Vec<NodeFixture>,
        Vec<(PodFixture, &'static str)>,
        PodFixture,
        Result<&'static str, &'static str>,
    );

    fn run_cases(cases: Vec<Case>) {
        for (name, nodes, placed, pod, want) in cases {
            let snap = snapshot(nodes, placed);
            let got = decide(&snap, &pod.info()).map_err(|e| e.to_string());
            let want = want.map(str::to_string).map_err(str::to_string);
            assert_eq!(got, want, "case: {name}");
        }
    }

    #[test]
    fn resource_fit() {
        run_cases(vec![
            (
                "requests count against what is already placed",
                vec![
                    NodeFixture::new("a").alloc("1", "1Gi"),
                    NodeFixture::new("b").alloc("1", "1Gi"),
                ],
                vec![(PodFixture::new("big").requests("800m", "100Mi"), "b")],
                PodFixture::new("web").requests("500m", "64Mi"),
                Ok("a"),
            ),
            (
                "cpu fits nowhere",
                vec![
                    NodeFixture::new("a").alloc("1", "1Gi"),
                    NodeFixture::new("b").alloc("1", "1Gi"),
                ],
                vec![],
                PodFixture::new("web").requests("1500m", "64Mi"),
                Err(
                    "0/2 nodes are available: 2 Insufficient cpu. preemption: 0/2 nodes are \
                     available: 2 No preemption victims found for incoming pod.",
                ),
            ),
            (
                "cpu and memory both reported",
                vec![NodeFixture::new("a").alloc("1", "1Gi")],
                vec![],
                PodFixture::new("web").requests("2", "2Gi"),
                Err(
                    "0/1 nodes are available: 1 Insufficient cpu, 1 Insufficient memory. \
                     preemption: 0/1 nodes are available: 1 No preemption victims found for \
                     incoming pod.",
                ),
            ),
            (
                "pods count",
                vec![
                    NodeFixture::new("a").max_pods(1),
                    NodeFixture::new("b").max_pods(2),
                ],
                vec![(PodFixture::new("x"), "a"), (PodFixture::new("y"), "b")],
                PodFixture::new("web"),
                Ok("b"),
            ),
            (
                "pods count exhausted",
                vec![NodeFixture::new("a").max_pods(1)],
                vec![(PodFixture::new("x"), "a")],
                PodFixture::new("web"),
                Err(
                    "0/1 nodes are available: 1 Too many pods. preemption: 0/1 nodes are \
                     available: 1 No preemption victims found for incoming pod.",
                ),
            ),
            (
                "no nodes at all",
                vec![],
                vec![],
                PodFixture::new("web"),
                Err("no nodes available to schedule pods"),
            ),
        ]);
    }

    #[test]
    fn node_selectors_and_affinity() {
        let zoned = || {
            vec![
                NodeFixture::new("a").label("zone", "z1").label("gen", "3"),
                NodeFixture::new("b").label("zone", "z2").label("gen", "5"),
                NodeFixture::new("c").label("gen", "7"),
            ]
        };
        let mismatch = "0/3 nodes are available: 3 node(s) didn't match Pod's node \
                        affinity/selector. preemption: 0/3 nodes are available: 3 Preemption \
                        is not helpful for scheduling.";
        let expr = |key: &str, op: &str, values: &[&str]| json!([{"matchExpressions": [{"key": key, "operator": op, "values": values}]}]);
        run_cases(vec![
            (
                "nodeSelector",
                zoned(),
                vec![],
                PodFixture::new("p").node_selector("zone", "z2"),
                Ok("b"),
            ),
            (
                "nodeSelector unmatched",
                zoned(),
                vec![],
                PodFixture::new("p").node_selector("zone", "z9"),
                Err(mismatch),
            ),
            (
                "In",
                zoned(),
                vec![],
                PodFixture::new("p").required_node_affinity(expr("zone", "In", &["z1"])),
                Ok("a"),
            ),
            (
                "NotIn (a missing label is not in)",
                zoned(),
                vec![],
                PodFixture::new("p").required_node_affinity(expr("zone", "NotIn", &["z1", "z2"])),
                Ok("c"),
            ),
            (
                "Exists",
                zoned(),
                vec![(PodFixture::new("x"), "a")],
                PodFixture::new("p").required_node_affinity(expr("zone", "Exists", &[])),
                Ok("b"),
            ),
            (
                "DoesNotExist",
                zoned(),
                vec![],
                PodFixture::new("p").required_node_affinity(expr("zone", "DoesNotExist", &[])),
                Ok("c"),
            ),
            (
                "Gt",
                zoned(),
                vec![],
                PodFixture::new("p").required_node_affinity(expr("gen", "Gt", &["6"])),
                Ok("c"),
            ),
            (
                "Lt",
                zoned(),
                vec![],
                PodFixture::new("p").required_node_affinity(expr("gen", "Lt", &["4"])),
                Ok("a"),
            ),
            (
                "Gt nothing",
                zoned(),
                vec![],
                PodFixture::new("p").required_node_affinity(expr("gen", "Gt", &["7"])),
                Err(mismatch),
            ),
            (
                "matchFields metadata.name",
                zoned(),
                vec![],
                PodFixture::new("p").required_node_affinity(json!([{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": ["b"]}]}])),
                Ok("b"),
            ),
            (
                "terms are ORed",
                zoned(),
                vec![(PodFixture::new("x"), "a")],
                PodFixture::new("p").required_node_affinity(json!([
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]},
                    {"matchExpressions": [{"key": "gen", "operator": "In", "values": ["5"]}]}])),
                Ok("b"),
            ),
            (
                "an empty term matches nothing",
                zoned(),
                vec![],
                PodFixture::new("p").required_node_affinity(json!([{}])),
                Err(mismatch),
            ),
            (
                "preferred affinity scores",
                zoned(),
                vec![],
                PodFixture::new("p").preferred_node_affinity(
                    50,
                    json!({"key": "zone", "operator": "In", "values": ["z2"]}),
                ),
                Ok("b"),
            ),
        ]);
    }

    #[test]
    fn taints_tolerations_and_unschedulable_nodes() {
        let cp = |n: &str| {
            NodeFixture::new(n).taint("node-role.kubernetes.io/control-plane", "", "NoSchedule")
        };
        run_cases(vec![
            (
                "control-plane taint everywhere",
                vec![cp("a"), cp("b"), cp("c")],
                vec![],
                PodFixture::new("p"),
                Err("0/3 nodes are available: 3 node(s) had untolerated taint \
                     {node-role.kubernetes.io/control-plane: }. preemption: 0/3 nodes are \
                     available: 3 Preemption is not helpful for scheduling."),
            ),
            ("only the untainted node", vec![cp("a"), NodeFixture::new("b"), cp("c")], vec![(PodFixture::new("x"), "b")], PodFixture::new("p"), Ok("b")),
            (
                "tolerated by Exists",
                vec![cp("a")],
                vec![],
                PodFixture::new("p").tolerate(json!({"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"})),
                Ok("a"),
            ),
            (
                "Equal needs the value",
                vec![NodeFixture::new("a").taint("dedicated", "gpu", "NoExecute")],
                vec![],
                PodFixture::new("p").tolerate(json!({"key": "dedicated", "operator": "Equal", "value": "cpu"})),
                Err("0/1 nodes are available: 1 node(s) had untolerated taint {dedicated: gpu}. \
                     preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."),
            ),
            (
                "a NotReady node takes tolerating pods",
                vec![NodeFixture::new("a").taint("node.kubernetes.io/not-ready", "", "NoSchedule").taint("node.kubernetes.io/not-ready", "", "NoExecute")],
                vec![],
                PodFixture::new("p").tolerate(json!({"key": "node.kubernetes.io/not-ready", "operator": "Exists"})),
                Ok("a"),
            ),
            (
                "PreferNoSchedule only scores",
                vec![NodeFixture::new("a").taint("soft", "", "PreferNoSchedule"), NodeFixture::new("b")],
                vec![(PodFixture::new("x").requests("1", "1Gi"), "b")],
                PodFixture::new("p"),
                Ok("b"),
            ),
            ("PreferNoSchedule everywhere still schedules", vec![NodeFixture::new("a").taint("soft", "", "PreferNoSchedule")], vec![], PodFixture::new("p"), Ok("a")),
            (
                "unschedulable, untolerated taint and full node, sorted like kube-scheduler",
                vec![
                    NodeFixture::new("a").unschedulable(),
                    NodeFixture::new("b").taint("k", "v", "NoSchedule"),
                    NodeFixture::new("c").alloc("1", "1Gi"),
                ],
                vec![],
                PodFixture::new("p").requests("2", "1Mi"),
                Err("0/3 nodes are available: 1 Insufficient cpu, 1 node(s) had untolerated taint \
                     {k: v}, 1 node(s) were unschedulable. preemption: 0/3 nodes are available: \
                     1 No preemption victims found for incoming pod, 2 Preemption is not helpful \
                     for scheduling."),
            ),
            (
                "unschedulable is tolerable",
                vec![NodeFixture::new("a").unschedulable()],
                vec![],
                PodFixture::new("p").tolerate(json!({"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"})),
                Ok("a"),
            ),
        ]);
    }

    #[test]
    fn pod_anti_affinity() {
        run_cases(vec![
            (
                "the pod avoids nodes with pods it repels",
                nodes(&["a", "b"]),
                vec![(PodFixture::new("w1").label("app", "web"), "a")],
                PodFixture::new("w2")
                    .label("app", "web")
                    .anti_affinity("web"),
                Ok("b"),
            ),
            (
                "existing pods repel the pod",
                nodes(&["a", "b"]),
                vec![
                    (
                        PodFixture::new("w1")
                            .label("app", "web")
                            .anti_affinity("web"),
                        "b",
                    ),
                    (PodFixture::new("x"), "a"),
                ],
                PodFixture::new("w2").label("app", "web"),
                Ok("a"),
            ),
            (
                "no node left",
                nodes(&["a", "b"]),
                vec![
                    (PodFixture::new("w1").label("app", "web"), "a"),
                    (
                        PodFixture::new("d1")
                            .label("app", "db")
                            .anti_affinity("web"),
                        "b",
                    ),
                ],
                PodFixture::new("w3")
                    .label("app", "web")
                    .anti_affinity("web"),
                Err(
                    "0/2 nodes are available: 1 node(s) didn't match pod anti-affinity rules, \
                     1 node(s) didn't satisfy existing pods anti-affinity rules. preemption: \
                     0/2 nodes are available: 2 No preemption victims found for incoming pod.",
                ),
            ),
            (
                "other namespaces do not count",
                nodes(&["a"]),
                vec![(PodFixture::new("w1").label("app", "web"), "a")],
                {
                    let mut p = PodFixture::new("w2").anti_affinity("web");
                    p.0["metadata"]["namespace"] = json!("other");
                    p
                },
                Ok("a"),
            ),
        ]);
    }

    fn claim_volume(mut pod: PodFixture, claim: &str) -> PodFixture {
        pod.0["spec"]["volumes"] =
            json!([{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]);
        pod
    }

    /// Storage objects for the volume cases: classes `standard` (lab provisioner, waits for
    /// the first consumer), `fast` (Immediate) and `local` (no provisioner, waits), and claims
    /// and volumes as each case lists them.
    fn storage(snap: &mut Snapshot, objects: &[Value]) {
        let vols = snap.volumes_mut();
        for (name, provisioner, mode) in [
            ("standard", "lab.tandem.dev/hollow", "WaitForFirstConsumer"),
            ("fast", "lab.tandem.dev/hollow", "Immediate"),
            (
                "local",
                "kubernetes.io/no-provisioner",
                "WaitForFirstConsumer",
            ),
        ] {
            vols.apply_class(
                serde_json::from_value(json!({"metadata": {"name": name},
                "provisioner": provisioner, "volumeBindingMode": mode}))
                .unwrap(),
            );
        }
        for o in objects {
            if o["kind"] == "PersistentVolume" {
                vols.apply_volume(serde_json::from_value(o.clone()).unwrap());
            } else {
                vols.apply_claim(serde_json::from_value(o.clone()).unwrap());
            }
        }
    }

    fn pvc(name: &str, class: &str, volume: Option<&str>) -> Value {
        json!({"kind": "PersistentVolumeClaim",
               "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
               "spec": {"storageClassName": class, "volumeName": volume,
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "1Gi"}}}})
    }

    fn pv(name: &str, class: &str, host: &str) -> Value {
        json!({"kind": "PersistentVolume", "metadata": {"name": name},
               "spec": {"storageClassName": class, "capacity": {"storage": "5Gi"},
                        "accessModes": ["ReadWriteOnce"],
                        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "In", "values": [host]}]}]}}},
               "status": {"phase": "Available"}})
    }

    #[test]
    fn volume_binding_filters_nodes_by_claims_and_explains_refusals() {
        let unresolvable = |reason: &str| {
            format!(
                "0/3 nodes are available: {reason}. preemption: 0/3 nodes are available: \
                 3 Preemption is not helpful for scheduling."
            )
        };
        let mut deleting = pvc("data", "standard", Some("pv-1"));
        deleting["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:00:00Z");
        /// (case, claims and volumes, expected node or message, claims to select)
        type VolumeCase = (
            &'static str,
            Vec<Value>,
            Result<&'static str, String>,
            Vec<&'static str>,
        );
        let cases: Vec<VolumeCase> = vec![
            (
                "a missing claim",
                vec![],
                Err(unresolvable("persistentvolumeclaim \"data\" not found")),
                vec![],
            ),
            (
                "an unbound Immediate claim waits for the volume controller",
                vec![pvc("data", "fast", None)],
                Err(unresolvable(
                    "pod has unbound immediate PersistentVolumeClaims",
                )),
                vec![],
            ),
            (
                "a claim being deleted",
                vec![deleting],
                Err(unresolvable(
                    "persistentvolumeclaim \"data\" is being deleted",
                )),
                vec![],
            ),
            (
                "a bound volume pins the pod to its node (data gravity)",
                vec![
                    pvc("data", "standard", Some("pv-1")),
                    pv("pv-1", "standard", "b"),
                ],
                Ok("b"),
                vec![],
            ),
            (
                "a bound volume on no node the cluster has",
                vec![
                    pvc("data", "standard", Some("pv-1")),
                    pv("pv-1", "standard", "gone"),
                ],
                Err(
                    "0/3 nodes are available: 3 node(s) had volume node affinity conflict. \
                     preemption: 0/3 nodes are available: 3 Preemption is not helpful for \
                     scheduling."
                        .to_string(),
                ),
                vec![],
            ),
            (
                "a claim bound to a volume not yet seen",
                vec![pvc("data", "standard", Some("pv-1"))],
                Err(
                    "0/3 nodes are available: 3 node(s) unavailable due to one or more pvc(s) \
                     bound to non-existent pv(s). preemption: 0/3 nodes are available: 3 \
                     Preemption is not helpful for scheduling."
                        .to_string(),
                ),
                vec![],
            ),
            (
                "WaitForFirstConsumer with a provisioner: any node, and the claim is selected",
                vec![pvc("data", "standard", None)],
                Ok("a"),
                vec!["data"],
            ),
            (
                "WaitForFirstConsumer without one: only where a matching volume is",
                vec![
                    pvc("data", "local", None),
                    pv("pv-c", "local", "c"),
                    pv("pv-x", "standard", "a"),
                ],
                Ok("c"),
                vec!["data"],
            ),
            (
                "...and nowhere without one",
                vec![pvc("data", "local", None)],
                Err(
                    "0/3 nodes are available: 3 node(s) didn't find available persistent \
                     volumes to bind. preemption: 0/3 nodes are available: 3 Preemption is not \
                     helpful for scheduling."
                        .to_string(),
                ),
                vec![],
            ),
        ];
        for (what, objects, want, select) in cases {
            let mut snap = snapshot(nodes(&["a", "b", "c"]), vec![]);
            storage(&mut snap, &objects);
            let pod = claim_volume(PodFixture::new("db-0"), "data").info();
            let got = decide(&snap, &pod).map_err(|e| e.to_string());
            assert_eq!(got, want.map(str::to_string), "{what}");
            if got.is_ok() {
                assert_eq!(snap.claims_to_select(&pod), select, "{what}");
            }
        }
    }

    #[test]
    fn pods_without_claims_never_look_at_volumes() {
        // No claim, no class, not even the storage caches: the pod schedules as before.
        let snap = snapshot(nodes(&["a"]), vec![]);
        let pod = PodFixture::new("web").info();
        assert!(pod.claims.is_empty());
        assert_eq!(decide(&snap, &pod), Ok("a".to_string()));
        let mut q = synced_queue(nodes(&["a"]));
        q.on_pod(pod_event(PodFixture::new("web")));
        assert!(
            matches!(q.step(), Some(Step::Bind { claims, .. }) if claims.is_empty()),
            "bound although the storage watches have not listed yet"
        );
        // A pod with a claim waits for them.
        q.on_pod(pod_event(claim_volume(PodFixture::new("db"), "data")));
        assert!(matches!(q.step(), Some(Step::Skip)));
        assert!(q.unschedulable.contains("db"));
    }

    #[test]
    fn replicas_spread_across_nodes() {
        let mut snap = snapshot(nodes(&["a", "b", "c"]), vec![]);
        // Uneven background load that replicas should not simply pile onto the emptiest node.
        snap.place(PodFixture::new("bg").requests("100m", "64Mi").info(), "a");
        for i in 0..20 {
            let pod = PodFixture::new("web")
                .uid(&format!("web-{i}"))
                .owner("rs-1")
                .requests("100m", "64Mi")
                .info();
            let node = decide(&snap, &pod).expect("fits");
            snap.place(pod, &node);
        }
        let mut per_node: Vec<u32> = ["a", "b", "c"]
            .iter()
            .map(|n| {
                snap.nodes[*n]
                    .spread
                    .get("owner:rs-1")
                    .copied()
                    .unwrap_or(0)
            })
            .collect();
        per_node.sort();
        assert_eq!(per_node, [6, 7, 7]);
        // Forgetting releases the accounting.
        for i in 0..20 {
            snap.forget(&format!("web-{i}"));
        }
        assert!(
            snap.nodes
                .values()
                .all(|n| !n.spread.contains_key("owner:rs-1"))
        );
        assert_eq!(snap.nodes["b"].requested, Resources::default());
    }

    fn node_event(n: NodeFixture) -> Event<Node> {
        Event::Apply(n.build())
    }

    fn pod_event(p: PodFixture) -> Event<Pod> {
        Event::Apply(serde_json::from_value(p.0).expect("valid pod fixture"))
    }

    fn synced_queue(nodes: Vec<NodeFixture>) -> Queue {
        let mut q = Queue::new();
        q.on_node(Event::Init);
        for n in nodes {
            q.on_node(Event::InitApply(n.build()));
        }
        q.on_node(Event::InitDone);
        q.on_pod(Event::Init);
        q.on_pod(Event::InitDone);
        q
    }

    #[test]
    fn queue_assumes_binds_and_accounts_bound_pods() {
        let mut q = synced_queue(vec![NodeFixture::new("a").alloc("1", "1Gi")]);
        q.on_pod(pod_event(PodFixture::new("web").requests("600m", "64Mi")));
        q.on_pod(pod_event(PodFixture::new("api").requests("600m", "64Mi")));
        let Some(Step::Bind { uid, node, .. }) = q.step() else {
            panic!("web is bound first");
        };
        assert_eq!((uid.as_str(), node.as_str()), ("web", "a"));
        // web is assumed: api no longer fits, and the failure is reported once.
        let Some(Step::Report { message, .. }) = q.step() else {
            panic!("api does not fit");
        };
        assert!(message.contains("1 Insufficient cpu"), "{message}");
        assert!(q.step().is_none());
        q.maybe_retry_now();
        assert!(
            matches!(q.step(), Some(Step::Skip)),
            "same reason, not reported twice"
        );
        // web's binding failed: it is forgotten, and api fits after the next retry.
        q.on_bound(Bound {
            uid: "web".into(),
            node: "a".into(),
            result: Err(kube::Error::LinesCodecMaxLineLengthExceeded.into()),
            counted: true,
        });
        q.maybe_retry_now();
        let bound: Vec<String> = std::iter::from_fn(|| q.step())
            .filter_map(|s| match s {
                Step::Bind { uid, .. } => Some(uid),
                _ => None,
            })
            .collect();
        assert_eq!(bound.len(), 1, "one of the two fits: {bound:?}");
        // A pod bound by someone else counts against its node; deleting it frees the node.
        q.on_pod(pod_event({
            let mut p = PodFixture::new("other").requests("100m", "1Mi");
            p.0["spec"]["nodeName"] = json!("a");
            p
        }));
        assert_eq!(q.snap.node_of("other"), Some("a"));
        q.on_pod(Event::Delete(
            serde_json::from_value(PodFixture::new("other").0).expect("pod"),
        ));
        assert_eq!(q.snap.node_of("other"), None);
    }

    #[test]
    fn queue_decides_higher_priority_first_then_in_arrival_order() {
        let mut q = synced_queue(nodes(&["a"]));
        for (name, priority) in [("low", 0), ("high", 1000), ("low-2", 0), ("mid", 10)] {
            let mut p = PodFixture::new(name);
            p.0["spec"]["priority"] = json!(priority);
            q.on_pod(pod_event(p));
        }
        // Deleted while queued: skipped.
        q.on_pod(Event::Delete(
            serde_json::from_value(PodFixture::new("mid").0).expect("pod"),
        ));
        let order: Vec<String> = std::iter::from_fn(|| q.step())
            .filter_map(|s| match s {
                Step::Bind { uid, .. } => Some(uid),
                _ => None,
            })
            .collect();
        assert_eq!(order, ["high", "low", "low-2"]);
    }

    #[test]
    fn queue_ignores_other_schedulers_and_waits_for_sync() {
        let mut q = Queue::new();
        q.on_pod(pod_event(PodFixture::new("early")));
        assert!(!q.nodes_synced, "no decisions before the node list is in");
        let mut q = synced_queue(nodes(&["a"]));
        let mut custom = PodFixture::new("custom");
        custom.0["spec"]["schedulerName"] = json!("my-scheduler");
        q.on_pod(pod_event(custom));
        assert!(
            q.step().is_none(),
            "pods of other schedulers are not queued"
        );
        q.on_pod(pod_event(PodFixture::new("mine")));
        assert!(matches!(q.step(), Some(Step::Bind { .. })));
    }

    #[test]
    fn unschedulable_pods_retry_when_a_node_changes() {
        let mut q = synced_queue(vec![NodeFixture::new("a").taint("k", "v", "NoSchedule")]);
        q.on_pod(pod_event(PodFixture::new("web")));
        assert!(matches!(q.step(), Some(Step::Report { .. })));
        q.last_retry = Instant::now() - RETRY_MIN;
        q.on_node(node_event(NodeFixture::new("a").label("unrelated", "yes")));
        q.maybe_retry();
        let Some(Step::Bind { node, .. }) = q.step() else {
            panic!("retried and bound once the taint is gone");
        };
        assert_eq!(node, "a");
    }
}
