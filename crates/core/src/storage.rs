//! Storage offloading, pure: what to do next for one consumer PVC of Tandem's storage class,
//! from what the consumer and its provider show.
//!
//! The life of such a claim (the class binds `WaitForFirstConsumer`):
//! 1. created: it gets Tandem's finalizer, so that the provider's copy is deleted first;
//! 2. the scheduler picks a node for its first pod and writes it in
//!    `volume.kubernetes.io/selected-node`; if that is a virtual node, the claim is created in
//!    the provider's twin namespace (same name, same size and access modes), and once it exists
//!    a PV is created in the consumer, pre-bound to the claim (`claimRef`), whose required node
//!    affinity names the virtual node: the PV binder binds it, the scheduler binds the pod, and
//!    every later pod using the claim is kept on that virtual node (data gravity);
//! 3. deleted: once no pod uses it (`kubernetes.io/pvc-protection` gone), the provider's copy is
//!    deleted, then the PV, then the finalizer goes.
//!
//! The consumer PV does not wait for the provider's claim to be Bound: a provider whose storage
//! class also waits for the first consumer binds it only when the offloaded pod is scheduled
//! there, which happens only once the consumer's pod is bound to the virtual node — which the
//! consumer's scheduler does only once the consumer claim is bound. Waiting would deadlock.
//!
//! A provider claim that vanishes under a bound consumer claim is not silently re-created
//! empty: it is reported as lost. A provider claim of the same name left by an earlier consumer
//! claim (retained at unoffloading) is adopted, so re-offloading finds its data again.

/// The consumer's claim, as far as this decision goes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Claim {
    pub uid: String,
    /// Marked for deletion.
    pub deleting: bool,
    /// Carries Tandem's finalizer.
    pub finalized: bool,
    /// Still carries `kubernetes.io/pvc-protection` (a pod uses it).
    pub protected: bool,
}

/// Where the claim's volume lives, or is to be provisioned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// No node selected yet (no pod scheduled) and no PV.
    Unplaced,
    /// The scheduler selected a node that is not a virtual node.
    LocalNode(String),
    /// The selected node is neither a local node nor the virtual node of a linked provider.
    UnknownNode(String),
    /// On the virtual node of `provider`; `twin` is the twin namespace there, if Ready.
    Virtual {
        provider: String,
        twin: Option<String>,
    },
}

/// The provider's copy of the claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Remote {
    /// The provider did not answer (or was not asked: no twin namespace yet).
    Unknown,
    /// The consumer is no longer peered with the provider.
    NoLink,
    Absent,
    Present(RemoteClaim),
}

/// The provider's claim, as far as this decision goes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RemoteClaim {
    /// `tandem.dev/origin-uid`: the consumer claim it was created for.
    pub origin_uid: Option<String>,
    /// Pending, Bound or Lost.
    pub phase: Option<String>,
    pub deleting: bool,
}

/// One step towards agreement; the caller applies them in order and stops at a failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    AddFinalizer,
    /// Create the claim in the twin namespace.
    CreateRemote,
    /// Take over a provider claim left by an earlier consumer claim of that name.
    AdoptRemote,
    DeleteRemote,
    /// Create the consumer PV pre-bound to the claim, pinned to the virtual node.
    CreateLocalVolume,
    DeleteLocalVolume,
    RemoveFinalizer,
    /// Tell the user (an Event on the claim) why nothing more happens now.
    Report(Report),
}

/// An Event on the consumer claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

fn report(warning: bool, reason: &'static str, message: String) -> Step {
    Step::Report(Report {
        warning,
        reason,
        message,
    })
}

/// The steps for `claim` (of Tandem's class) given where it is placed, the provider's copy and
/// whether the consumer PV exists.
pub fn decide(claim: &Claim, placement: &Placement, remote: &Remote, local_pv: bool) -> Vec<Step> {
    if claim.deleting {
        return decide_deletion(claim, placement, remote, local_pv);
    }
    let mut steps = Vec::new();
    if !claim.finalized {
        steps.push(Step::AddFinalizer);
    }
    match placement {
        Placement::Unplaced => {}
        Placement::LocalNode(node) => steps.push(report(
            true,
            "ProvisioningFailed",
            format!(
                "node {node} is not a virtual node: claims of this class are provisioned in providers only; use a local storage class for local pods"
            ),
        )),
        Placement::UnknownNode(node) => steps.push(report(
            true,
            "ProvisioningFailed",
            format!("selected node {node} is not the virtual node of a peered provider"),
        )),
        Placement::Virtual {
            provider,
            twin: None,
        } => steps.push(report(
            false,
            "WaitingForTwinNamespace",
            format!("waiting for the twin namespace on provider {provider}"),
        )),
        Placement::Virtual {
            provider,
            twin: Some(twin),
        } => match remote {
            Remote::Unknown => steps.push(report(
                false,
                "ProviderUnreachable",
                format!("waiting for provider {provider} to answer"),
            )),
            Remote::NoLink => steps.push(report(
                true,
                "ProviderGone",
                format!("no longer peered with provider {provider}"),
            )),
            Remote::Absent if local_pv => steps.push(report(
                true,
                "RemoteVolumeLost",
                format!(
                    "its copy in namespace {twin} on provider {provider} is gone: the data is lost; delete this claim to provision a new one"
                ),
            )),
            Remote::Absent => steps.push(Step::CreateRemote),
            Remote::Present(r) if r.deleting => steps.push(report(
                false,
                "WaitingForRemoteVolume",
                format!("an earlier claim of this name on provider {provider} is being deleted"),
            )),
            Remote::Present(r) => {
                if r.origin_uid.as_deref() != Some(claim.uid.as_str()) {
                    steps.push(Step::AdoptRemote);
                }
                if r.phase.as_deref() == Some("Lost") {
                    steps.push(report(
                        true,
                        "RemoteVolumeLost",
                        format!("the claim on provider {provider} lost its volume"),
                    ));
                } else if !local_pv {
                    steps.push(Step::CreateLocalVolume);
                }
            }
        },
    }
    steps
}

fn decide_deletion(
    claim: &Claim,
    placement: &Placement,
    remote: &Remote,
    local_pv: bool,
) -> Vec<Step> {
    if !claim.finalized || claim.protected {
        return Vec::new();
    }
    let finish = || {
        let mut steps = Vec::new();
        if local_pv {
            steps.push(Step::DeleteLocalVolume);
        }
        steps.push(Step::RemoveFinalizer);
        steps
    };
    let Placement::Virtual { provider, twin } = placement else {
        return finish();
    };
    if twin.is_none() {
        return finish();
    }
    match remote {
        Remote::Unknown => vec![report(
            true,
            "ProviderUnreachable",
            format!("waiting for provider {provider} to delete its copy of the claim"),
        )],
        Remote::NoLink => {
            let mut steps = vec![report(
                true,
                "ProviderGone",
                format!(
                    "no longer peered with provider {provider}: its copy of the claim, if retained there, is left to its administrator"
                ),
            )];
            steps.extend(finish());
            steps
        }
        // Only the copy made for this claim is deleted; another one (adopted later by a new
        // claim of that name, or never ours) is left alone.
        Remote::Present(r) if r.origin_uid.as_deref() == Some(claim.uid.as_str()) => {
            if r.deleting {
                Vec::new()
            } else {
                vec![Step::DeleteRemote]
            }
        }
        Remote::Present(_) | Remote::Absent => finish(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim() -> Claim {
        Claim {
            uid: "u1".into(),
            finalized: true,
            ..Default::default()
        }
    }

    fn on_milan() -> Placement {
        Placement::Virtual {
            provider: "milan".into(),
            twin: Some("db-rome".into()),
        }
    }

    fn remote(origin: &str, phase: &str) -> Remote {
        Remote::Present(RemoteClaim {
            origin_uid: Some(origin.into()),
            phase: Some(phase.into()),
            deleting: false,
        })
    }

    /// One word per step, to compare with a table.
    fn summary(steps: &[Step]) -> Vec<String> {
        steps
            .iter()
            .map(|s| match s {
                Step::Report(r) => format!("report {}", r.reason),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn decide_table() {
        let deleting = Claim {
            deleting: true,
            ..claim()
        };
        /// (case, claim, placement, provider copy, consumer PV exists, steps wanted)
        type Case = (
            &'static str,
            Claim,
            Placement,
            Remote,
            bool,
            &'static [&'static str],
        );
        let cases: Vec<Case> = vec![
            (
                "a new claim gets the finalizer and waits for a pod",
                Claim {
                    finalized: false,
                    ..claim()
                },
                Placement::Unplaced,
                Remote::Unknown,
                false,
                &["AddFinalizer"],
            ),
            (
                "a claim selected onto a virtual node is created in the twin namespace",
                claim(),
                on_milan(),
                Remote::Absent,
                false,
                &["CreateRemote"],
            ),
            (
                "the finalizer comes before the provider's copy",
                Claim {
                    finalized: false,
                    ..claim()
                },
                on_milan(),
                Remote::Absent,
                false,
                &["AddFinalizer", "CreateRemote"],
            ),
            (
                "once the provider's copy exists the consumer PV is created, bound or not",
                claim(),
                on_milan(),
                remote("u1", "Pending"),
                false,
                &["CreateLocalVolume"],
            ),
            (
                "a claim with its PV and its provider copy needs nothing",
                claim(),
                on_milan(),
                remote("u1", "Bound"),
                true,
                &[],
            ),
            (
                "a copy retained from an earlier claim of that name is adopted",
                claim(),
                on_milan(),
                remote("u0", "Bound"),
                false,
                &["AdoptRemote", "CreateLocalVolume"],
            ),
            (
                "a provider copy that vanished is reported, not re-created empty",
                claim(),
                on_milan(),
                Remote::Absent,
                true,
                &["report RemoteVolumeLost"],
            ),
            (
                "a provider copy that lost its volume is reported",
                claim(),
                on_milan(),
                remote("u1", "Lost"),
                false,
                &["report RemoteVolumeLost"],
            ),
            (
                "an unreachable provider is waited for",
                claim(),
                on_milan(),
                Remote::Unknown,
                false,
                &["report ProviderUnreachable"],
            ),
            (
                "a twin namespace not Ready yet is waited for",
                claim(),
                Placement::Virtual {
                    provider: "milan".into(),
                    twin: None,
                },
                Remote::Unknown,
                false,
                &["report WaitingForTwinNamespace"],
            ),
            (
                "a local node is refused with a reason",
                claim(),
                Placement::LocalNode("rome-1".into()),
                Remote::Unknown,
                false,
                &["report ProvisioningFailed"],
            ),
            (
                "an earlier copy being deleted is waited for",
                claim(),
                on_milan(),
                Remote::Present(RemoteClaim {
                    origin_uid: Some("u0".into()),
                    phase: Some("Bound".into()),
                    deleting: true,
                }),
                false,
                &["report WaitingForRemoteVolume"],
            ),
            (
                "a deleted claim still used by a pod waits",
                Claim {
                    protected: true,
                    ..deleting.clone()
                },
                on_milan(),
                remote("u1", "Bound"),
                true,
                &[],
            ),
            (
                "a deleted claim deletes the provider's copy first",
                deleting.clone(),
                on_milan(),
                remote("u1", "Bound"),
                true,
                &["DeleteRemote"],
            ),
            (
                "a deleted claim waits for the provider's copy to go",
                deleting.clone(),
                on_milan(),
                Remote::Present(RemoteClaim {
                    origin_uid: Some("u1".into()),
                    phase: Some("Bound".into()),
                    deleting: true,
                }),
                true,
                &[],
            ),
            (
                "with the provider's copy gone, the PV and the finalizer go",
                deleting.clone(),
                on_milan(),
                Remote::Absent,
                true,
                &["DeleteLocalVolume", "RemoveFinalizer"],
            ),
            (
                "a deleted claim leaves a provider copy that is not its own",
                deleting.clone(),
                on_milan(),
                remote("u0", "Bound"),
                false,
                &["RemoveFinalizer"],
            ),
            (
                "a deleted claim waits for an unreachable provider",
                deleting.clone(),
                on_milan(),
                Remote::Unknown,
                true,
                &["report ProviderUnreachable"],
            ),
            (
                "a deleted claim of a provider no longer peered is let go, with a warning",
                deleting.clone(),
                on_milan(),
                Remote::NoLink,
                true,
                &[
                    "report ProviderGone",
                    "DeleteLocalVolume",
                    "RemoveFinalizer",
                ],
            ),
            (
                "a deleted claim never provisioned just loses its finalizer",
                deleting.clone(),
                Placement::Unplaced,
                Remote::Unknown,
                false,
                &["RemoveFinalizer"],
            ),
            (
                "a deleted claim without the finalizer is not ours to hold",
                Claim {
                    finalized: false,
                    ..deleting.clone()
                },
                on_milan(),
                remote("u1", "Bound"),
                true,
                &[],
            ),
        ];
        for (name, claim, placement, remote, pv, want) in cases {
            let got = summary(&decide(&claim, &placement, &remote, pv));
            assert_eq!(got, want.to_vec(), "{name}");
        }
    }
}
