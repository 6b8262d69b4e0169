//! What the provider's side of the network negotiation decides, pure, with the clock passed
//! in: which prefixes the cluster's IPAM holds local and remaps into ([`ipam_config`]), how its
//! persisted state is stored ([`store`]) or rebuilt from the remaps objects record
//! ([`rebuild_state`]); and, for each Tenant, whether the provider's parameters are published
//! and what the consumer's are granted or why they are refused ([`Step`], [`Skip`]).

use std::collections::{BTreeMap, BTreeSet};

use ipnet::IpNet;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use serde_json::{Value, json};
use tandem_api::{NetworkParameters, NetworkParametersSpec, Peering, Tenant, conditions, names};
use tandem_core::ipam::{Grant, Ipam, IpamConfig, IpamState};

use crate::rbac::CONSUMER_NETWORK_PARAMETERS;

/// ConfigMap (in tandem-system) persisting the IPAM's decisions.
pub const IPAM_CONFIG_MAP: &str = "tandem-ipam";
const IPAM_KEY: &str = "state.json";
/// Where remapped prefixes come from (RFC 1918), minus whatever is local.
pub(super) const POOLS: &[&str] = &["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"];

/// A prefix of the cluster's settings that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("{cidr:?} is not a CIDR")]
pub(super) struct NotACidr {
    pub cidr: String,
    #[source]
    pub source: ipnet::AddrParseError,
}

/// The IPAM's configuration for a cluster whose pods and external addresses use `pod_cidr`
/// and `external_cidr`: both kept from every peer, remaps carved from [`POOLS`].
pub(super) fn ipam_config(pod_cidr: &str, external_cidr: &str) -> Result<IpamConfig, NotACidr> {
    let parse = |s: &str| {
        s.parse::<IpNet>().map_err(|source| NotACidr {
            cidr: s.to_string(),
            source,
        })
    };
    Ok(IpamConfig {
        reserved: vec![parse(pod_cidr)?, parse(external_cidr)?],
        pools: POOLS.iter().map(|p| parse(p)).collect::<Result<_, _>>()?,
        allowed_public: Vec::new(),
    })
}

/// The IPAM state a ConfigMap holds (none: empty).
pub(super) fn stored_state(map: Option<&ConfigMap>) -> IpamState {
    map.and_then(|m| m.data.as_ref()?.get(IPAM_KEY))
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or_default()
}

/// The IPAM ConfigMap holding `state`, as it is created.
pub(super) fn ipam_map(state: &IpamState) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": IPAM_CONFIG_MAP, "namespace": names::SYSTEM_NAMESPACE,
                     "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY}},
        "data": data(state),
    }))
    .expect("static manifest")
}

fn data(state: &IpamState) -> BTreeMap<String, String> {
    [(
        IPAM_KEY.to_string(),
        serde_json::to_string(state).expect("state serializes"),
    )]
    .into()
}

/// A write of the IPAM ConfigMap.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Write {
    /// Nothing is granted any more: delete it (preconditioned on the version read), so that
    /// the last unpeer leaves no state behind.
    Delete { resource_version: Option<String> },
    /// Replace the ConfigMap read with this one (the new state; made again if deleted since).
    Replace(ConfigMap),
    /// Create it, with the new state.
    Create(ConfigMap),
}

/// Why the IPAM ConfigMap is not written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Unwritten {
    /// The state is what is stored (nothing, when no ConfigMap is).
    Unchanged,
}

/// How `state` is stored, given the ConfigMap read (`current`) and the state it holds
/// (`stored`; a state rebuilt from the records is written even if nothing else changed).
pub(super) fn store(
    current: Option<&ConfigMap>,
    stored: &IpamState,
    state: &IpamState,
) -> Result<Write, Unwritten> {
    if state == stored {
        return Err(Unwritten::Unchanged);
    }
    if state.peers.is_empty() {
        return match current {
            Some(map) => Ok(Write::Delete {
                resource_version: map.resource_version(),
            }),
            None => Err(Unwritten::Unchanged),
        };
    }
    Ok(match current {
        Some(map) => {
            let mut map = map.clone();
            map.data = Some(data(state));
            Write::Replace(map)
        }
        None => Write::Create(ipam_map(state)),
    })
}

/// The IPAM state the remaps in these objects record: each live Peering's `status.network`
/// (how this cluster, as consumer, maps its provider's prefixes) and each live tenant's
/// NetworkParameters `consumer` (how it, as provider, maps its consumer's). Both relations
/// with one peer share its grants; the first found is kept. A peer whose grants would overlap
/// another's kept so far is left out (it is mapped anew when it negotiates next).
pub(super) fn rebuild_state(
    config: &IpamConfig,
    peerings: &[Peering],
    tenants: &[Tenant],
    parameters: &[NetworkParameters],
) -> IpamState {
    let grants = |pairs: [(Option<&str>, Option<&str>); 2]| -> Vec<Grant> {
        pairs
            .into_iter()
            .map_while(|(requested, granted)| {
                let requested: IpNet = requested?.parse().ok()?;
                let granted: IpNet = granted?.parse().ok()?;
                // A spec changed since its remap was written pairs the new prefix with the
                // old remap: not a mapping (the peer is mapped anew when it negotiates).
                let same_shape = requested.prefix_len() == granted.prefix_len()
                    && requested.addr().is_ipv4() == granted.addr().is_ipv4();
                same_shape.then_some(Grant { requested, granted })
            })
            .collect()
    };
    let as_consumer = peerings
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let net = p.status.as_ref()?.network.as_ref()?;
            let recorded = grants([
                (
                    Some(net.remote_pod_cidr.as_str()),
                    Some(net.remapped_remote_pod_cidr.as_str()),
                ),
                (
                    net.remote_external_cidr.as_deref(),
                    net.remapped_remote_external_cidr.as_deref(),
                ),
            ]);
            Some((p.spec.cluster_id.clone(), recorded))
        });
    let as_provider = tenants
        .iter()
        .filter(|t| t.metadata.deletion_timestamp.is_none())
        .filter_map(|t| {
            let theirs = parameters.iter().find(|p| {
                p.namespace() == t.namespace() && p.name_any() == CONSUMER_NETWORK_PARAMETERS
            })?;
            let status = theirs.status.clone().unwrap_or_default();
            let recorded = grants([
                (
                    Some(theirs.spec.pod_cidr.as_str()),
                    status.remapped_pod_cidr.as_deref(),
                ),
                (
                    theirs.spec.external_cidr.as_deref(),
                    status.remapped_external_cidr.as_deref(),
                ),
            ]);
            Some((t.spec.cluster_id.clone(), recorded))
        });
    let mut state = IpamState::default();
    for (peer, grants) in as_consumer.chain(as_provider) {
        if grants.is_empty() || state.peers.contains_key(&peer) {
            continue;
        }
        let mut with = state.clone();
        with.peers.insert(peer.clone(), grants);
        match Ipam::with_state(config.clone(), with) {
            Ok(ipam) => state = ipam.state().clone(),
            Err(e) => {
                tracing::warn!(%peer, "IPAM ConfigMap missing: a recorded remap is left out: {e}")
            }
        }
    }
    state
}

/// The provider's parameters for a consumer, as they are published: this cluster's ID, its
/// pod and external CIDRs, and its gateway's key and endpoint for that consumer.
pub(super) fn ours(
    cluster_id: &str,
    pod_cidr: &str,
    external_cidr: &str,
    public_key: &str,
    endpoint: Option<&str>,
) -> NetworkParametersSpec {
    NetworkParametersSpec {
        cluster_id: cluster_id.to_string(),
        pod_cidr: pod_cidr.to_string(),
        external_cidr: Some(external_cidr.to_string()),
        public_key: Some(public_key.to_string()),
        gateway_endpoint: endpoint.map(str::to_string),
    }
}

/// The provider's NetworkParameters `spec` says, as applied (server-side) in the tenant
/// namespace.
pub(super) fn provider_parameters(spec: &NetworkParametersSpec) -> Value {
    json!({
        "apiVersion": "tandem.dev/v1alpha1", "kind": "NetworkParameters",
        "metadata": {"name": crate::rbac::PROVIDER_NETWORK_PARAMETERS,
                     "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY}},
        "spec": {"clusterID": spec.cluster_id, "podCIDR": spec.pod_cidr,
                 "externalCIDR": spec.external_cidr, "publicKey": spec.public_key,
                 "gatewayEndpoint": spec.gateway_endpoint},
    })
}

/// A write the negotiation makes for one Tenant.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Step {
    /// Apply the provider's NetworkParameters in the tenant namespace.
    Publish(NetworkParametersSpec),
    /// Write the prefixes granted to the consumer into its NetworkParameters' status,
    /// clearing any refusal.
    Grant {
        pod: String,
        external: Option<String>,
    },
    /// Grant the consumer nothing and say why in its `PrefixesGranted` condition.
    Refuse { message: String },
}

/// Why the negotiation writes nothing (more) for a Tenant this sweep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Skip {
    /// The Tenant is being deleted.
    Deleting,
    /// The sweep is for other tenant namespaces (those whose parameters changed).
    OutOfSweep,
    /// The provider's parameters there are current.
    Published,
    /// The consumer has not published its parameters yet.
    NotPublished,
    /// The consumer's pod CIDR does not parse (warned about; nothing to map).
    UnreadablePodCidr(ipnet::AddrParseError),
    /// Its status already says these grants.
    Granted,
    /// Its status already says this refusal.
    StillRefused,
}

/// Whether the sweep (of the tenant namespaces `only`, or of all) looks at `tenant`.
pub(super) fn in_sweep(tenant: &Tenant, only: Option<&BTreeSet<String>>) -> Result<(), Skip> {
    if tenant.metadata.deletion_timestamp.is_some() {
        return Err(Skip::Deleting);
    }
    let ns = tenant.namespace().unwrap_or_default();
    if only.is_some_and(|only| !only.contains(&ns)) {
        return Err(Skip::OutOfSweep);
    }
    Ok(())
}

/// Whether the provider's parameters (as cached: `published`) are published again.
pub(super) fn publish(
    published: Option<&NetworkParameters>,
    wanted: NetworkParametersSpec,
) -> Result<Step, Skip> {
    if published.is_some_and(|p| p.spec == wanted) {
        return Err(Skip::Published);
    }
    Ok(Step::Publish(wanted))
}

/// The prefixes the consumer's parameters (`theirs`) ask to be mapped: its pod CIDR, and its
/// external CIDR when it has a readable one.
pub(super) fn requested(theirs: Option<&NetworkParameters>) -> Result<Vec<IpNet>, Skip> {
    let theirs = theirs.ok_or(Skip::NotPublished)?;
    let pod: IpNet = theirs
        .spec
        .pod_cidr
        .parse()
        .map_err(Skip::UnreadablePodCidr)?;
    let mut prefixes = vec![pod];
    if let Some(ext) = theirs
        .spec
        .external_cidr
        .as_ref()
        .and_then(|e| e.parse().ok())
    {
        prefixes.push(ext);
    }
    Ok(prefixes)
}

/// The message of the consumer's `PrefixesGranted=False` condition, if it stands.
fn refused_before(theirs: &NetworkParameters) -> Option<String> {
    let current = theirs.status.as_ref()?;
    conditions::find(&current.conditions, conditions::PREFIXES_GRANTED)
        .filter(|c| c.status == "False")
        .map(|c| c.message.clone())
}

/// What the consumer's status gets once the IPAM granted it `grants` (its pod CIDR's first).
pub(super) fn granted(theirs: &NetworkParameters, grants: &[Grant]) -> Result<Step, Skip> {
    let current = theirs.status.clone().unwrap_or_default();
    let pod = grants[0].granted.to_string();
    let external = grants.get(1).map(|g| g.granted.to_string());
    if current.remapped_pod_cidr.as_deref() == Some(&pod)
        && current.remapped_external_cidr == external
        && refused_before(theirs).is_none()
    {
        return Err(Skip::Granted);
    }
    Ok(Step::Grant { pod, external })
}

/// What the consumer's status gets once the IPAM refused one of its prefixes (`refused`: a
/// prefix no peer is granted).
pub(super) fn refused(
    consumer: &str,
    theirs: &NetworkParameters,
    refused: &tandem_core::ipam::IpamError,
) -> Result<Step, Skip> {
    let message = format!("consumer {consumer}: {refused}");
    if refused_before(theirs).as_deref() == Some(message.as_str()) {
        return Err(Skip::StillRefused);
    }
    Ok(Step::Refuse { message })
}

impl Step {
    /// The body of the request this step sends: the provider's parameters applied, or the
    /// merge patch of the consumer's status, guarded by the `resource_version` read and
    /// dated `now`.
    pub(super) fn body(
        &self,
        resource_version: Option<&str>,
        now: k8s_openapi::jiff::Timestamp,
    ) -> Value {
        let status = match self {
            Step::Publish(spec) => return provider_parameters(spec),
            Step::Grant { pod, external } => {
                json!({"remappedPodCIDR": pod, "remappedExternalCIDR": external,
                       "conditions": []})
            }
            Step::Refuse { message } => {
                json!({"remappedPodCIDR": null, "remappedExternalCIDR": null,
                       "conditions": [{"type": conditions::PREFIXES_GRANTED, "status": "False",
                                       "reason": "PrefixRefused", "message": message,
                                       "lastTransitionTime": now.to_string()}]})
            }
        };
        json!({
            "metadata": {"resourceVersion": resource_version},
            "status": status,
        })
    }
}

#[cfg(test)]
mod tests;
