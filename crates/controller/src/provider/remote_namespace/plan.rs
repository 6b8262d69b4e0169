//! Which twin namespaces a consumer may claim, create and delete, pure — a security decision:
//! a consumer names the namespace, so each check says why it is refused ([`Refusal`]) or held
//! ([`Hold`]): the request is in a tenant namespace ([`consumer`]), the name is not reserved
//! ([`twin_name`]), an existing namespace is this request's twin ([`claim`]), the Tenant is in
//! force ([`tenant_in_force`]) and allows the strategies ([`strategies`]) and another twin
//! ([`room`]), data retained for another key is not handed over ([`adopt`]). Then what the
//! twin holds ([`twin`]), what its request's status says ([`Outcome`]) and what deleting the
//! request does ([`teardown`]). The parent module reads the objects and sends what these decide.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::ResourceExt;
use serde_json::json;
use tandem_api::{
    NamespaceMappingStrategy, PodOffloadingStrategy, RemoteNamespace, RemoteNamespaceStatusFields,
    Tenant, names,
};

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

/// The Pod Security admission label of a namespace: the level its pods are held to.
pub const POD_SECURITY_ENFORCE_LABEL: &str = "pod-security.kubernetes.io/enforce";
/// The version of the Pod Security Standards the level is read at.
const POD_SECURITY_ENFORCE_VERSION_LABEL: &str = "pod-security.kubernetes.io/enforce-version";

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

/// Why a name can never be a twin namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Reserved {
    /// Not a DNS-1123 label.
    InvalidName,
    /// `default`, `kube-*`, `openshift*`.
    System,
    /// `tandem-*` and Tandem's own namespace.
    Tandem,
    /// One of [`RESERVED_NAMESPACES`].
    AddOn,
}

impl Reserved {
    /// How the status says it.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Reserved::InvalidName => "not a valid namespace name",
            Reserved::System => "reserved for the system",
            Reserved::Tandem => "reserved for Tandem",
            Reserved::AddOn => "reserved for an add-on this cluster's admin may install",
        }
    }
}

/// Why `name` can never be a twin namespace, if it cannot: invalid, or reserved for the
/// system, for Tandem or for well-known add-ons (even when it does not exist yet).
pub(super) fn reserved(name: &str) -> Option<Reserved> {
    if !tandem_apimachinery::validation::is_dns1123_label(name) {
        Some(Reserved::InvalidName)
    } else if name == "default" || name.starts_with("kube-") || name.starts_with("openshift") {
        Some(Reserved::System)
    } else if name.starts_with("tandem-") || name == names::SYSTEM_NAMESPACE {
        Some(Reserved::Tandem)
    } else if RESERVED_NAMESPACES.contains(&name) {
        Some(Reserved::AddOn)
    } else {
        None
    }
}

/// Why a RemoteNamespace is refused (phase Failed): one variant per refusal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// The request is not in a tenant namespace: twins are only made for peered consumers.
    NotInTenantNamespace,
    /// The twin's name can never be a twin namespace.
    Reserved { twin: String, why: Reserved },
    /// The namespace exists and is not this request's twin: it is never taken over.
    Taken {
        twin: String,
        consumer: String,
        origin: String,
    },
    /// The mapping strategy the twin's name shows is not one the Tenant allows.
    MappingNotAllowed {
        twin: String,
        mapping: NamespaceMappingStrategy,
        consumer: String,
        /// Who set the limit (the PeeringPolicy, the Tenant, or the Tenant's default).
        by: String,
        allowed: Vec<NamespaceMappingStrategy>,
    },
    /// The Tenant limits pod offloading strategies and the request does not say its own.
    PodStrategyUnsaid {
        origin: String,
        consumer: String,
        by: String,
        allowed: Vec<PodOffloadingStrategy>,
    },
    /// The request's pod offloading strategy is not one the Tenant allows.
    PodStrategyNotAllowed {
        pods: PodOffloadingStrategy,
        origin: String,
        consumer: String,
        by: String,
        allowed: Vec<PodOffloadingStrategy>,
    },
    /// The consumer has as many twins as its Tenant allows.
    TooManyTwins {
        consumer: String,
        held: usize,
        cap: u32,
    },
    /// The twin was retained for the data of a peering under another key (`key`: this
    /// peering's, if recorded): the cluster ID alone is self-asserted.
    RetainedForAnotherKey {
        twin: String,
        consumer: String,
        kept_for: String,
        key: Option<String>,
    },
}

impl Refusal {
    /// When the request is looked at again without a change to it: the refusals a change
    /// elsewhere lifts (a namespace deleted, a twin freed) are retried.
    pub(super) fn retry(&self) -> Option<Duration> {
        match self {
            Refusal::Taken { .. } => Some(Duration::from_secs(30)),
            Refusal::TooManyTwins { .. } | Refusal::RetainedForAnotherKey { .. } => {
                Some(Duration::from_secs(60))
            }
            _ => None,
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::NotInTenantNamespace => f.write_str(
                "not in a tenant namespace: twin namespaces are only created for peered consumers",
            ),
            Refusal::Reserved { twin, why } => write!(f, "namespace {twin}: {}", why.as_str()),
            Refusal::Taken {
                twin,
                consumer,
                origin,
            } => write!(
                f,
                "namespace {twin} already exists and is not the twin of {consumer}/{origin}; choose another name (--namespace-mapping-strategy SelectedName)"
            ),
            Refusal::MappingNotAllowed {
                twin,
                mapping,
                consumer,
                by,
                allowed,
            } => write!(
                f,
                "namespace mapping strategy {mapping:?} (twin namespace {twin}) is not allowed for consumer {consumer} by {by} (allowed: {allowed:?})"
            ),
            Refusal::PodStrategyUnsaid {
                origin,
                consumer,
                by,
                allowed,
            } => write!(
                f,
                "namespace {origin} does not say its pod offloading strategy, which {by} limits for consumer {consumer} (allowed: {allowed:?}); upgrade its Tandem"
            ),
            Refusal::PodStrategyNotAllowed {
                pods,
                origin,
                consumer,
                by,
                allowed,
            } => write!(
                f,
                "pod offloading strategy {pods:?} of namespace {origin} is not allowed for consumer {consumer} by {by} (allowed: {allowed:?})"
            ),
            Refusal::TooManyTwins {
                consumer,
                held,
                cap,
            } => write!(
                f,
                "consumer {consumer} already has {held} twin namespaces, the most Tenant {}/{consumer} allows (spec.maxTwinNamespaces: {cap})",
                names::tenant_namespace(consumer)
            ),
            Refusal::RetainedForAnotherKey {
                twin,
                consumer,
                kept_for,
                key,
            } => write!(
                f,
                "namespace {twin} holds data kept from an earlier peering of {consumer} under key {kept_for}, and this peering's key is {}: it is not re-adopted; the provider's admin deletes the namespace, or re-keys Tenant {}/{consumer} if the consumer really changed its key",
                key.as_deref().unwrap_or("not recorded"),
                names::tenant_namespace(consumer)
            ),
        }
    }
}

/// Why a RemoteNamespace waits (phase Pending).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Hold {
    /// No Tenant in force (being unpeered, or not yet peered): nothing is granted, and a twin
    /// retained for its data on unpeering is not taken back. The Tenant's watch wakes it.
    NoTenant { consumer: String },
    /// The twin namespace is being deleted: it is made again once gone.
    Terminating { twin: String },
}

/// What a RemoteNamespace's status says after a pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    /// The twin holds what the Tenant allows.
    Ready,
    /// Waiting, for a Tenant or for the namespace to go.
    Pending(Hold),
    /// Refused.
    Failed(Refusal),
}

impl From<Refusal> for Outcome {
    fn from(refusal: Refusal) -> Self {
        Outcome::Failed(refusal)
    }
}

impl From<Hold> for Outcome {
    fn from(hold: Hold) -> Self {
        Outcome::Pending(hold)
    }
}

impl Outcome {
    /// `status.phase`.
    pub(super) fn phase(&self) -> &'static str {
        match self {
            Outcome::Ready => "Ready",
            Outcome::Pending(_) => "Pending",
            Outcome::Failed(_) => "Failed",
        }
    }

    /// `status.message` (empty: none).
    pub(super) fn message(&self) -> String {
        match self {
            Outcome::Ready => String::new(),
            Outcome::Pending(Hold::NoTenant { consumer }) => {
                format!("no Tenant in force for consumer {consumer} (unpeering?)")
            }
            Outcome::Pending(Hold::Terminating { twin }) => {
                format!("namespace {twin} is terminating")
            }
            Outcome::Failed(refusal) => refusal.to_string(),
        }
    }

    /// When the request is reconciled again without a change (None: on a change only).
    pub(super) fn requeue(&self) -> Option<Duration> {
        match self {
            // What a twin holds is converged again now and then.
            Outcome::Ready => Some(Duration::from_secs(60)),
            Outcome::Pending(Hold::NoTenant { .. }) => None,
            Outcome::Pending(Hold::Terminating { .. }) => Some(Duration::from_secs(1)),
            Outcome::Failed(refusal) => refusal.retry(),
        }
    }
}

/// The status patch saying `outcome`; None when the status says it already.
pub(super) fn status_patch(
    current: Option<&RemoteNamespaceStatusFields>,
    outcome: &Outcome,
) -> Option<serde_json::Value> {
    let (phase, message) = (outcome.phase(), outcome.message());
    if current.and_then(|s| s.phase.as_deref()) == Some(phase)
        && current.and_then(|s| s.message.as_deref()).unwrap_or("") == message
    {
        return None;
    }
    let message = (!message.is_empty()).then_some(message);
    Some(json!({"status": {"phase": phase, "message": message}}))
}

/// The consumer a request's namespace (`tenant_namespace`, if it exists) belongs to: its ID if
/// it is a tenant namespace.
pub(super) fn consumer(tenant_namespace: Option<&Namespace>) -> Result<String, Refusal> {
    tenant_namespace
        .and_then(|ns| {
            let labels = ns.labels();
            labels.get(names::TENANT_NAMESPACE_LABEL)?;
            labels.get(names::REMOTE_CLUSTER_LABEL).cloned()
        })
        .ok_or(Refusal::NotInTenantNamespace)
}

/// Refuses a twin name that is invalid or reserved.
pub(super) fn twin_name(twin: &str) -> Result<(), Refusal> {
    match reserved(twin) {
        Some(why) => Err(Refusal::Reserved {
            twin: twin.to_string(),
            why,
        }),
        None => Ok(()),
    }
}

/// Whether `ns` is the twin namespace this request created for `consumer`.
pub(super) fn is_twin_of(ns: &Namespace, consumer: &str, origin: &str) -> bool {
    let labels = ns.labels();
    labels.contains_key(names::TWIN_NAMESPACE_LABEL)
        && labels.get(names::ORIGIN_CLUSTER_LABEL).map(String::as_str) == Some(consumer)
        && labels
            .get(names::ORIGIN_NAMESPACE_LABEL)
            .map(String::as_str)
            == Some(origin)
}

/// Refuses to take over an `existing` namespace that is not the twin of `consumer`'s `origin`.
pub(super) fn claim(
    existing: Option<&Namespace>,
    twin: &str,
    consumer: &str,
    origin: &str,
) -> Result<(), Refusal> {
    match existing {
        Some(ns) if !is_twin_of(ns, consumer, origin) => Err(Refusal::Taken {
            twin: twin.to_string(),
            consumer: consumer.to_string(),
            origin: origin.to_string(),
        }),
        _ => Ok(()),
    }
}

/// The consumer's Tenant, if one is in force (found and not being deleted).
pub(super) fn tenant_in_force(tenant: Option<Tenant>, consumer: &str) -> Result<Tenant, Hold> {
    tenant
        .filter(|t| t.metadata.deletion_timestamp.is_none())
        .ok_or_else(|| Hold::NoTenant {
            consumer: consumer.to_string(),
        })
}

/// The namespace mapping strategy a twin name shows (the provider does not take the
/// consumer's word for it): the consumer's name is EnforceSameName, `<ns>-<consumer>` is
/// DefaultName, anything else SelectedName.
pub(super) fn mapping_of(twin: &str, origin: &str, consumer: &str) -> NamespaceMappingStrategy {
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

/// Refuses a twin namespace the consumer's Tenant does not allow (its mapping strategy or its
/// pods' offloading strategy), naming the PeeringPolicy that set the limit.
pub(super) fn strategies(
    tenant: &Tenant,
    rn: &RemoteNamespace,
    consumer: &str,
) -> Result<(), Refusal> {
    let by = match tenant.annotations().get(names::POLICY_ANNOTATION) {
        Some(p) => format!("PeeringPolicy {p}"),
        None => format!("Tenant {}/{consumer}", names::tenant_namespace(consumer)),
    };
    let mapping = mapping_of(&rn.spec.namespace, &rn.spec.origin_namespace, consumer);
    // Absent: DefaultName alone (see TenantSpec::allowed_namespace_mapping_strategies).
    let (allowed, mapping_by) = match &tenant.spec.allowed_namespace_mapping_strategies {
        Some(allowed) => (allowed.clone(), by.clone()),
        None => (
            vec![NamespaceMappingStrategy::DefaultName],
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
        return Err(Refusal::MappingNotAllowed {
            twin: rn.spec.namespace.clone(),
            mapping,
            consumer: consumer.to_string(),
            by: mapping_by,
            allowed,
        });
    }
    // The strategy is the consumer's word (where its pods go is decided on its side): a
    // limit refuses what it says, and a request that does not say.
    if let Some(allowed) = &tenant.spec.allowed_pod_offloading_strategies {
        let origin = rn.spec.origin_namespace.clone();
        match rn.spec.pod_offloading_strategy {
            None => {
                return Err(Refusal::PodStrategyUnsaid {
                    origin,
                    consumer: consumer.to_string(),
                    by,
                    allowed: allowed.clone(),
                });
            }
            Some(pods) if !allowed.contains(&pods) => {
                return Err(Refusal::PodStrategyNotAllowed {
                    pods,
                    origin,
                    consumer: consumer.to_string(),
                    by,
                    allowed: allowed.clone(),
                });
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// Refuses a new twin when the consumer holds as many as its Tenant allows; `twins` are the
/// consumer's twin namespaces (this one, if listed, does not count).
pub(super) fn room(
    tenant: &Tenant,
    consumer: &str,
    twin: &str,
    twins: &[Namespace],
) -> Result<(), Refusal> {
    let cap = tenant
        .spec
        .max_twin_namespaces
        .unwrap_or(tandem_api::TenantSpec::DEFAULT_MAX_TWIN_NAMESPACES);
    let held = twins.iter().filter(|n| n.name_any() != twin).count();
    if held >= cap as usize {
        return Err(Refusal::TooManyTwins {
            consumer: consumer.to_string(),
            held,
            cap,
        });
    }
    Ok(())
}

/// The label selector of `consumer`'s twin namespaces.
pub(super) fn twins_selector(consumer: &str) -> String {
    format!(
        "{}={consumer},{}",
        names::ORIGIN_CLUSTER_LABEL,
        names::TWIN_NAMESPACE_LABEL
    )
}

/// What becomes of `existing`, this request's twin, before it is converged: a twin retained
/// for its data is reclaimed ([`Step::ReclaimRetained`]) unless it was kept for another key.
pub(super) fn adopt(
    existing: &Namespace,
    tenant: &Tenant,
    twin: &str,
    consumer: &str,
) -> Result<Option<Step>, Refusal> {
    if !existing.labels().contains_key(names::RETAINED_DATA_LABEL) {
        return Ok(None);
    }
    // Kept from a peering under another key: the cluster ID alone is self-asserted, so the
    // data is not handed to whoever claims it next.
    let kept_for = existing
        .annotations()
        .get(names::KEY_FINGERPRINT_ANNOTATION);
    let key = tenant.annotations().get(names::KEY_FINGERPRINT_ANNOTATION);
    if let Some(kept_for) = kept_for
        && key != Some(kept_for)
    {
        return Err(Refusal::RetainedForAnotherKey {
            twin: twin.to_string(),
            consumer: consumer.to_string(),
            kept_for: kept_for.clone(),
            key: key.cloned(),
        });
    }
    // Offloaded again: the retained claims are the consumer's to adopt.
    Ok(Some(Step::ReclaimRetained))
}

/// Holds a request whose twin is being deleted.
pub(super) fn settled(existing: &Namespace, twin: &str) -> Result<(), Hold> {
    match existing.metadata.deletion_timestamp {
        Some(_) => Err(Hold::Terminating {
            twin: twin.to_string(),
        }),
        None => Ok(()),
    }
}

/// A request the act half sends for a twin namespace.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Step {
    /// Take the retained-data label off the twin: the consumer adopts its claims again.
    ReclaimRetained,
    /// Apply the twin Namespace.
    ApplyNamespace(Box<Namespace>),
    /// Apply the RoleBinding of the peer identity to `tandem:peer-twin`.
    BindPeer(Box<RoleBinding>),
    /// Apply the RoleBinding of a pod capability the Tenant allows.
    GrantPodAccess(Box<RoleBinding>),
    /// Delete the RoleBinding of a pod capability the Tenant refuses (absent is fine).
    RevokePodAccess(&'static str),
    /// Apply the ResourceQuota of the storage grant.
    ApplyQuota(Box<ResourceQuota>),
}

impl Step {
    /// What the step does, as its error says.
    pub(super) fn doing(&self) -> &'static str {
        match self {
            Step::ReclaimRetained => "reclaiming a retained twin namespace",
            Step::ApplyNamespace(_) => "creating the twin namespace",
            Step::BindPeer(_) => "binding the peer identity in the twin namespace",
            Step::GrantPodAccess(_) => "granting pod access the Tenant allows",
            Step::RevokePodAccess(_) => "revoking pod access the Tenant refuses",
            Step::ApplyQuota(_) => "applying the storage quota",
        }
    }
}

/// What `consumer`'s twin of `rn` holds, as `tenant` says, in the order it is sent: the
/// namespace, the peer's binding, each pod capability granted or revoked, the storage quota.
/// Its bindings name `subjects` ([`crate::rbac::peer_subjects`] of the Tenant, read with
/// the clock by the caller).
pub(super) fn twin(
    rn: &RemoteNamespace,
    consumer: &str,
    tenant: &Tenant,
    subjects: &serde_json::Value,
) -> Vec<Step> {
    let twin = rn.spec.namespace.as_str();
    let mut steps = vec![
        Step::ApplyNamespace(Box::new(twin_namespace(rn, consumer, tenant))),
        Step::BindPeer(Box::new(peer_binding(
            twin,
            TWIN_ROLE_BINDING,
            PEER_TWIN_ROLE,
            subjects,
        ))),
    ];
    let access = tenant.spec.pod_access();
    for capability in PodCapability::ALL {
        let name = pod_access_binding(capability);
        steps.push(if capability.allowed_by(&access) {
            Step::GrantPodAccess(Box::new(peer_binding(
                twin,
                name,
                capability.role_name(),
                subjects,
            )))
        } else {
            Step::RevokePodAccess(name)
        });
    }
    steps.push(Step::ApplyQuota(Box::new(grant_quota(tenant, twin))));
    steps
}

/// The twin Namespace of `rn` for `consumer`, labelled whose twin it is and the level its
/// pods are held to.
fn twin_namespace(rn: &RemoteNamespace, consumer: &str, tenant: &Tenant) -> Namespace {
    let mut labels = json!({
        names::MANAGED_BY_LABEL: names::MANAGED_BY,
        names::TWIN_NAMESPACE_LABEL: "true",
        names::ORIGIN_CLUSTER_LABEL: consumer,
        names::ORIGIN_NAMESPACE_LABEL: rn.spec.origin_namespace,
    });
    if let Some(pods) = rn.spec.pod_offloading_strategy {
        labels[names::POD_OFFLOADING_LABEL] = json!(pods);
    }
    // What the shadow pod controller enforces where it makes the real pods, said again to the
    // API server: a real kube-apiserver's Pod Security admission then refuses anything that
    // would reach the twin by another path.
    labels[POD_SECURITY_ENFORCE_LABEL] = json!(tenant.spec.pod_security.unwrap_or_default());
    labels[POD_SECURITY_ENFORCE_VERSION_LABEL] = json!("latest");
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": rn.spec.namespace, "labels": labels},
    }))
    .expect("static manifest")
}

/// The RoleBinding `name` of a consumer to ClusterRole `role` in `twin`, bound to `subjects`
/// (those its Tenant says: the group of its key).
pub(super) fn peer_binding(
    twin: &str,
    name: &str,
    role: &str,
    subjects: &serde_json::Value,
) -> RoleBinding {
    serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": twin,
                     "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": subjects,
    }))
    .expect("static manifest")
}

/// The storage part of the consumer's grant in `tenant` (`requests.storage`,
/// `persistentvolumeclaims`) as the ResourceQuota `tandem-grant` of the twin namespace, so that
/// kube-apiserver's quota admission bounds the claims the consumer creates there. Per twin
/// namespace: a consumer with several twins may use the storage grant in each.
fn grant_quota(tenant: &Tenant, twin: &str) -> ResourceQuota {
    let hard: BTreeMap<String, String> = tenant
        .spec
        .grant
        .iter()
        .filter(|(k, _)| names::STORAGE_GRANT_KEYS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": names::GRANT_QUOTA, "namespace": twin,
                     "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY}},
        "spec": {"hard": hard},
    }))
    .expect("static manifest")
}

/// What deleting a request does to its twin namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Teardown {
    /// Not this request's twin (a refused request never owned it): left alone.
    NotOurs,
    /// Being deleted already: the request waits for it to go.
    AwaitTermination,
    /// Delete it; one holding claims is retained instead, unless the request asked for its
    /// data to be deleted too (`keep_data` false).
    Delete { keep_data: bool },
}

/// What becomes of `existing`, the namespace `rn` named, when `consumer` deletes `rn`.
pub(super) fn teardown(existing: &Namespace, rn: &RemoteNamespace, consumer: &str) -> Teardown {
    if !is_twin_of(existing, consumer, &rn.spec.origin_namespace) {
        Teardown::NotOurs
    } else if existing.metadata.deletion_timestamp.is_some() {
        Teardown::AwaitTermination
    } else {
        // Data is never deleted unless asked: a twin holding claims is kept, without its pods.
        Teardown::Delete {
            keep_data: !rn.annotations().contains_key(names::DELETE_DATA_ANNOTATION),
        }
    }
}

/// The metadata patch marking a twin retained for its data, for the peering under `key`.
pub(super) fn retained_metadata(key: Option<&str>) -> serde_json::Value {
    let mut metadata = json!({"labels": {names::RETAINED_DATA_LABEL: "true"}});
    // The key it is kept for: only a peering under that key adopts it again. (Retained a second
    // time once the Tenant is gone, with no key to hand, the one recorded stays.)
    if let Some(key) = key {
        metadata["annotations"] = json!({names::KEY_FINGERPRINT_ANNOTATION: key});
    }
    json!({ "metadata": metadata })
}

/// The `DataRetained` Event's message on a twin kept for `consumer`'s `claims`.
pub(super) fn retained_message(consumer: &str, claims: &[String]) -> String {
    format!(
        "kept for the data of consumer {consumer}: PersistentVolumeClaims {}; delete the namespace to delete them",
        claims.join(", ")
    )
}

#[cfg(test)]
mod tests;
