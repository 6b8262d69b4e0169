//! Kubernetes-convention conditions (`metav1.Condition`) and the condition types Tandem reports.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// `status` of a condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

impl ConditionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        }
    }
}

impl From<bool> for ConditionStatus {
    fn from(b: bool) -> Self {
        if b {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        }
    }
}

/// Peering: the consumer holds a peer identity signed by the provider.
pub const AUTHENTICATED: &str = "Authenticated";
/// Peering: the provider granted resources and they are known.
pub const RESOURCES_GRANTED: &str = "ResourcesGranted";
/// Peering: pod/external CIDRs and gateway parameters exchanged and remapped.
pub const NETWORK_NEGOTIATED: &str = "NetworkNegotiated";
/// NetworkParameters (the consumer's, on the provider): the provider granted the prefixes it
/// declares. False names the refused prefix and its class (loopback, public, ...).
pub const PREFIXES_GRANTED: &str = "PrefixesGranted";
/// Peering (with the network fabric on): this cluster's gateway to the provider has an
/// endpoint the provider can reach; the message says which and how it was chosen, or, False,
/// why there is none yet (a load balancer that never answers, on kind or bare metal).
pub const GATEWAY_EXPOSED: &str = "GatewayExposed";
/// Peering: whether this cluster's network fabric runs (True, reason `On`), or why not (False:
/// `Disabled` by the settings, `HollowCluster` in a lab cluster whose pods have no network);
/// without it pods offload but no traffic crosses the peering.
pub const NETWORK_FABRIC: &str = "NetworkFabric";
/// Peering: the provider's API answered recently.
pub const PROVIDER_REACHABLE: &str = "ProviderReachable";
/// Peering: the virtual node exists and is Ready.
pub const VIRTUAL_NODE_READY: &str = "VirtualNodeReady";
/// Peering being deleted: False while an unpeering step fails (the reason names the step).
pub const UNPEERED: &str = "Unpeered";
/// Summary condition of most objects.
pub const READY: &str = "Ready";

/// Sets (or adds) condition `type_`, keeping `lastTransitionTime` when the status is unchanged,
/// as the Kubernetes API conventions ask. Returns whether anything changed.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: ConditionStatus,
    reason: &str,
    message: &str,
    observed_generation: Option<i64>,
) -> bool {
    let status = status.as_str();
    if let Some(c) = conditions.iter_mut().find(|c| c.type_ == type_) {
        let changed = c.status != status
            || c.reason != reason
            || c.message != message
            || c.observed_generation != observed_generation;
        if c.status != status {
            c.last_transition_time = Time(k8s_openapi::jiff::Timestamp::now());
        }
        c.status = status.to_string();
        c.reason = reason.to_string();
        c.message = message.to_string();
        c.observed_generation = observed_generation;
        return changed;
    }
    conditions.push(Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message: message.to_string(),
        observed_generation,
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
    });
    true
}

/// The condition of type `type_`, if present.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether condition `type_` is present with status True.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_moves_only_with_status() {
        let mut cs = Vec::new();
        assert!(set_condition(
            &mut cs,
            READY,
            ConditionStatus::False,
            "Waiting",
            "a",
            None
        ));
        let t0 = cs[0].last_transition_time.clone();
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert!(set_condition(
            &mut cs,
            READY,
            ConditionStatus::False,
            "Waiting",
            "b",
            None
        ));
        assert_eq!(cs[0].last_transition_time, t0, "same status keeps the time");
        assert!(!set_condition(
            &mut cs,
            READY,
            ConditionStatus::False,
            "Waiting",
            "b",
            None
        ));
        assert!(set_condition(
            &mut cs,
            READY,
            ConditionStatus::True,
            "Ok",
            "",
            None
        ));
        assert_ne!(cs[0].last_transition_time, t0);
        assert!(is_true(&cs, READY));
        assert_eq!(cs.len(), 1);
    }
}
