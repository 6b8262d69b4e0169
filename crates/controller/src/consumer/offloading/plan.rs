//! What the NamespaceOffloading reconciler decides, from what it observed: pure.
//!
//! Whether an offloading is heeded, its selector usable and its twin namespace named (else its
//! [`Refusal`]); which providers it selects (else why [`Unselected`]); what to send for the
//! RemoteNamespace of a selected provider ([`Step`]) and of one whose twin goes ([`Removal`]);
//! what the status says ([`Status`]: [`converged`], [`terminating`]); and what is said of the
//! claims a provider retains ([`DataRetained`], or why nothing is: [`NoReport`]).

use std::collections::BTreeMap;
use std::fmt::Display;
use std::time::Duration;

use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use tandem_api::{
    NamespaceMappingStrategy, NamespaceOffloading, PodOffloadingStrategy, RemoteNamespace,
    RemoteNamespaceSpec, RemoteNamespaceStatus, RemoteNamespaceStatusFields, names,
};
use tandem_core::offloading::{self as rules, NamespaceMapping, PodPlacement, SelectorTerm};

use crate::consumer::link::ProviderLink;

/// Label on offloaded namespaces (value `enabled`); the placement webhook selects on it.
pub const OFFLOADING_LABEL: &str = "tandem.dev/offloading";
/// Value of [`OFFLOADING_LABEL`] on an offloaded namespace.
pub const OFFLOADING_ENABLED: &str = "enabled";

/// The labels a provider's virtual node carries, which the cluster selector matches.
pub fn virtual_node_labels(link: &ProviderLink) -> BTreeMap<String, String> {
    node_labels(&link.provider_id, &link.node_labels)
}

/// The labels of the virtual node of `provider`, which suggests `suggested`: the marks of a
/// virtual node win.
fn node_labels(provider: &str, suggested: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut labels = suggested.clone();
    labels.insert(
        names::NODE_TYPE_LABEL.to_string(),
        names::VIRTUAL_NODE_TYPE.to_string(),
    );
    labels.insert(
        names::REMOTE_CLUSTER_LABEL.to_string(),
        provider.to_string(),
    );
    labels
}

/// The cluster selector's terms in core's shape.
pub fn selector_terms(o: &NamespaceOffloading) -> Vec<SelectorTerm> {
    o.spec
        .cluster_selector
        .as_ref()
        .map(|s| serde_json::from_value(json!(s.node_selector_terms)).unwrap_or_default())
        .unwrap_or_default()
}

/// Where an offloading's pods go, in core's shape.
pub fn placement(s: PodOffloadingStrategy) -> PodPlacement {
    match s {
        PodOffloadingStrategy::Local => PodPlacement::Local,
        PodOffloadingStrategy::Remote => PodPlacement::Remote,
        PodOffloadingStrategy::LocalAndRemote => PodPlacement::LocalAndRemote,
    }
}

fn mapping(s: NamespaceMappingStrategy) -> NamespaceMapping {
    match s {
        NamespaceMappingStrategy::DefaultName => NamespaceMapping::DefaultName,
        NamespaceMappingStrategy::EnforceSameName => NamespaceMapping::EnforceSameName,
        NamespaceMappingStrategy::SelectedName => NamespaceMapping::SelectedName,
    }
}

/// What the status of a NamespaceOffloading says: its phase, its twin namespaces, and its
/// Ready condition's reason and message.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Status {
    pub phase: &'static str,
    pub remote_namespaces: Vec<RemoteNamespaceStatus>,
    pub reason: &'static str,
    pub message: String,
}

impl Status {
    /// When a converged offloading is looked at again: soon while a twin is not Ready.
    pub(super) fn requeue(&self) -> Duration {
        if self.phase == "Ready" {
            Duration::from_secs(30)
        } else {
            Duration::from_secs(1)
        }
    }
}

/// Why an offloading offloads nothing (and changes nothing): said in its status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// It is not named `offloading`: only that one offloads a namespace.
    WrongName,
    /// A cluster selector the API server let through but that means nothing (the problem).
    InvalidClusterSelector(String),
    /// The twin namespace cannot be named (why).
    InvalidName(String),
}

impl Refusal {
    /// The status that says so: a bad selector keeps the twin namespaces listed (none is added
    /// or removed on its account); the others list none.
    pub(super) fn status(self, o: &NamespaceOffloading) -> Status {
        match self {
            Refusal::WrongName => Status {
                phase: "Ignored",
                remote_namespaces: Vec::new(),
                reason: "WrongName",
                message: format!(
                    "ignored: only the NamespaceOffloading named {:?} offloads a namespace",
                    names::OFFLOADING_NAME
                ),
            },
            Refusal::InvalidClusterSelector(problem) => Status {
                phase: "Failed",
                remote_namespaces: o
                    .status
                    .as_ref()
                    .map(|s| s.remote_namespaces.clone())
                    .unwrap_or_default(),
                reason: "InvalidClusterSelector",
                message: problem,
            },
            Refusal::InvalidName(why) => Status {
                phase: "Failed",
                remote_namespaces: Vec::new(),
                reason: "InvalidName",
                message: why,
            },
        }
    }
}

/// Whether `o` is the offloading of its namespace (the one named `offloading`).
pub(super) fn heeded(o: &NamespaceOffloading) -> Result<(), Refusal> {
    if o.name_any() != names::OFFLOADING_NAME {
        return Err(Refusal::WrongName);
    }
    Ok(())
}

/// Whether the cluster selector's `terms` mean something.
pub(super) fn usable_selector(terms: &[SelectorTerm]) -> Result<(), Refusal> {
    crate::input::cluster_selector(terms)
        .map_err(|problem| Refusal::InvalidClusterSelector(problem.to_string()))
}

/// The name of the twin namespace of `o` (in namespace `ns`) for consumer `cluster_id`.
pub(super) fn twin_name(
    o: &NamespaceOffloading,
    ns: &str,
    cluster_id: &str,
) -> Result<String, Refusal> {
    rules::twin_namespace_name(
        mapping(o.spec.namespace_mapping_strategy),
        ns,
        cluster_id,
        o.spec.remote_namespace_name.as_deref(),
    )
    .map_err(|e| Refusal::InvalidName(e.to_string()))
}

/// Why a provider gets no twin namespace (and loses the one it has).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Unselected {
    /// The pods stay local (`podOffloadingStrategy: Local`).
    LocalOnly,
    /// The cluster selector does not match its virtual node's labels.
    NotMatched,
}

/// Whether `o`, of selector `terms`, offloads to `provider`, whose virtual node carries the
/// `suggested` labels besides its marks.
pub(super) fn selection(
    o: &NamespaceOffloading,
    terms: &[SelectorTerm],
    provider: &str,
    suggested: &BTreeMap<String, String>,
) -> Result<(), Unselected> {
    if o.spec.pod_offloading_strategy == PodOffloadingStrategy::Local {
        return Err(Unselected::LocalOnly);
    }
    if !rules::cluster_selected(terms, &node_labels(provider, suggested)) {
        return Err(Unselected::NotMatched);
    }
    Ok(())
}

/// What is sent for the RemoteNamespace of a selected provider, the existing one observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// Apply the RemoteNamespace asking for the twin ([`desired_twin`]) and report the
    /// provider's answer.
    RequestTwin,
    /// It asks for another (a renamed twin): the old namespace goes first, then the new one is
    /// requested.
    DeletePrevious { previous: String },
    /// The previous one is being deleted: nothing is sent until it is gone.
    AwaitTerminating,
}

/// What to send for the RemoteNamespace asking for `twin`, given the `existing` one.
pub(super) fn twin_step(existing: Option<&RemoteNamespace>, twin: &str) -> Step {
    match existing {
        Some(e) if e.metadata.deletion_timestamp.is_some() => Step::AwaitTerminating,
        Some(e) if e.spec.namespace != twin => Step::DeletePrevious {
            previous: e.spec.namespace.clone(),
        },
        _ => Step::RequestTwin,
    }
}

/// A twin's phase and message, as the status lists them.
pub(super) type Answer = (String, Option<String>);

impl Step {
    /// What the status says of the twin once the step is sent, when the provider's answer
    /// does not say it.
    pub(super) fn answer(&self) -> Option<Answer> {
        match self {
            Step::RequestTwin => None,
            Step::DeletePrevious { previous } => Some((
                "Pending".into(),
                Some(format!("removing previous twin namespace {previous}")),
            )),
            Step::AwaitTerminating => Some((
                "Pending".into(),
                Some("previous twin namespace terminating".into()),
            )),
        }
    }
}

/// The provider's answer in the status of the RemoteNamespace it was applied as.
pub(super) fn applied_answer(status: Option<RemoteNamespaceStatusFields>) -> Answer {
    let status = status.unwrap_or_default();
    (
        status.phase.unwrap_or_else(|| "Pending".into()),
        status.message,
    )
}

/// What the status says of a twin whose request failed with `e`.
pub(super) fn failed_answer(e: impl Display) -> Answer {
    (
        "Pending".to_string(),
        Some(format!("requesting the twin namespace: {e}")),
    )
}

/// The RemoteNamespace (named after origin namespace `ns`) asking for twin namespace `twin`.
pub(super) fn desired_twin(ns: &str, twin: &str, pods: PodOffloadingStrategy) -> RemoteNamespace {
    let mut rn = RemoteNamespace::new(
        ns,
        RemoteNamespaceSpec {
            namespace: twin.to_string(),
            origin_namespace: ns.to_string(),
            pod_offloading_strategy: Some(pods),
        },
    );
    rn.meta_mut().labels = Some(
        [
            (
                names::MANAGED_BY_LABEL.to_string(),
                names::MANAGED_BY.to_string(),
            ),
            (names::ORIGIN_NAMESPACE_LABEL.to_string(), ns.to_string()),
        ]
        .into(),
    );
    rn
}

/// What removing a twin sends, its RemoteNamespace observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Removal {
    /// No RemoteNamespace is left: the twin is gone.
    Gone,
    /// It is still there: annotated first (`annotate`) so that the provider deletes a twin
    /// holding claims instead of retaining it, deleted (`delete`) unless it is being deleted
    /// already; then waited for.
    Remove { annotate: bool, delete: bool },
}

/// How to remove the `existing` RemoteNamespace; `delete_data`: its claims go too.
pub(super) fn removal(existing: Option<&RemoteNamespace>, delete_data: bool) -> Removal {
    match existing {
        None => Removal::Gone,
        Some(existing) => Removal::Remove {
            annotate: delete_data
                && !existing
                    .annotations()
                    .contains_key(names::DELETE_DATA_ANNOTATION),
            delete: existing.metadata.deletion_timestamp.is_none(),
        },
    }
}

/// The status once every selected provider answered for its twin (`entries`): Ready when all
/// are, Failed when one failed, else Pending with what each not-Ready twin waits for.
pub(super) fn converged(entries: Vec<RemoteNamespaceStatus>) -> Status {
    let phase = if entries.iter().all(|e| e.phase == "Ready") {
        "Ready"
    } else if entries.iter().any(|e| e.phase == "Failed") {
        "Failed"
    } else {
        "Pending"
    };
    let (reason, message) = match phase {
        "Ready" => (
            "Offloaded",
            format!("twin namespace ready on {} provider(s)", entries.len()),
        ),
        _ => {
            let waiting: Vec<String> = entries
                .iter()
                .filter(|e| e.phase != "Ready")
                .map(|e| {
                    format!(
                        "{} ({}{})",
                        e.cluster_id,
                        e.phase,
                        e.message
                            .as_ref()
                            .map(|m| format!(": {m}"))
                            .unwrap_or_default()
                    )
                })
                .collect();
            ("TwinNamespacesNotReady", waiting.join("; "))
        }
    };
    Status {
        phase,
        remote_namespaces: entries,
        reason,
        message,
    }
}

/// The status of an offloading being deleted, unless it says so already.
pub(super) fn terminating(o: &NamespaceOffloading) -> Option<Status> {
    let status = o.status.as_ref();
    if status.and_then(|s| s.phase.as_deref()) == Some("Terminating") {
        return None;
    }
    Some(Status {
        phase: "Terminating",
        remote_namespaces: status
            .map(|s| s.remote_namespaces.clone())
            .unwrap_or_default(),
        reason: "Unoffloading",
        message: "removing twin namespaces".into(),
    })
}

/// The twin namespace `o`'s status lists on `provider`.
pub(super) fn known_twin<'a>(o: &'a NamespaceOffloading, provider: &str) -> Option<&'a str> {
    o.status
        .as_ref()?
        .remote_namespaces
        .iter()
        .find(|r| r.cluster_id == provider)
        .map(|r| r.namespace.as_str())
}

/// Why nothing is said of the claims in a twin namespace that goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum NoReport {
    /// Unoffloaded with `--delete-data`: the RemoteNamespace's annotation has the provider
    /// delete the whole twin (deleting claims one by one would wait on the pods using them).
    DeletedWithTwin,
    /// The twin holds no claims.
    NoClaims,
}

/// Whether the claims of a twin that goes are listed, to be reported.
pub(super) fn lists_claims(delete_data: bool) -> Result<(), NoReport> {
    if delete_data {
        return Err(NoReport::DeletedWithTwin);
    }
    Ok(())
}

/// What is said of claims the provider retains: an Event on the namespace and a log line.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct DataRetained {
    /// The Event's name (one per namespace and provider, rewritten each time).
    pub name: String,
    /// The claims, comma-separated, for the log.
    pub claims: String,
    /// The Event, server-side applied.
    pub event: Value,
}

/// What is said when provider `provider` retains `claims` of twin namespace `twin` of
/// namespace `ns`.
pub(super) fn data_retained(
    ns: &str,
    provider: &str,
    twin: &str,
    claims: &[String],
) -> Result<DataRetained, NoReport> {
    if claims.is_empty() {
        return Err(NoReport::NoClaims);
    }
    let message = format!(
        "retained on provider {} in namespace {twin}: PersistentVolumeClaims {} (unoffload with --delete-data, or delete the claims here, to delete them)",
        provider,
        claims.join(", ")
    );
    let name = format!("{ns}.tandem-dataretained-{}", provider);
    let event = json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": name, "namespace": ns,
                     "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY}},
        "involvedObject": {"apiVersion": "v1", "kind": "Namespace", "name": ns},
        "reason": "DataRetained", "message": message, "type": "Warning",
        "source": {"component": names::CONTROLLER_NAME},
    });
    Ok(DataRetained {
        name,
        claims: claims.join(","),
        event,
    })
}

#[cfg(test)]
mod tests;
