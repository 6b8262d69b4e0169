//! The cluster's settings (the `tandem-config` ConfigMap `tandem install` writes), as every
//! reconciler reads them, and the error of reading them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::ResourceExt;
use kube::api::Api;
use tandem_api::names;

use crate::identity::IdentityError;

/// What a peer may open connections to through the tunnel (filtered at this cluster's
/// gateway; replies to what this side opened always pass).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NetworkExposure {
    /// Least exposure: a consumer reaches its offloaded pods, offloaded pods reach the pods of
    /// the namespaces offloaded to their provider; nothing else.
    #[default]
    Peering,
    /// Every pod of this cluster (its whole pod CIDR), as Liqo does; never the nodes.
    PodCidr,
}

impl NetworkExposure {
    /// The value in the `tandem-config` ConfigMap and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            NetworkExposure::Peering => "peering",
            NetworkExposure::PodCidr => "pod-cidr",
        }
    }
}

impl std::str::FromStr for NetworkExposure {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "peering" => Ok(NetworkExposure::Peering),
            "pod-cidr" => Ok(NetworkExposure::PodCidr),
            other => Err(format!(
                "network exposure {other:?} is neither \"peering\" nor \"pod-cidr\""
            )),
        }
    }
}

/// How peers reach this cluster's gateways (`tandem install --gateway-service-type`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GatewayServiceType {
    /// A LoadBalancer Service, whose ingress (address or host name) is the endpoint whenever
    /// it has one; while it has none (kind, bare metal: no load balancer answers), after
    /// [`AUTO_LOAD_BALANCER_WAIT`], the gateway's node address and its own port (the gateway
    /// listens on the node network: no NAT on the way in).
    #[default]
    Auto,
    /// A LoadBalancer Service only: pending until a load balancer answers.
    LoadBalancer,
    /// A NodePort Service with `externalTrafficPolicy: Local` (kube-proxy keeps the peer's
    /// address, which WireGuard's roaming relies on): the gateway's node address and its node
    /// port, for networks that open only the NodePort range.
    NodePort,
}

/// How long `auto` waits for a load balancer before it publishes the node address.
pub const AUTO_LOAD_BALANCER_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl GatewayServiceType {
    /// The value in the `tandem-config` ConfigMap and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            GatewayServiceType::Auto => "auto",
            GatewayServiceType::LoadBalancer => "LoadBalancer",
            GatewayServiceType::NodePort => "NodePort",
        }
    }
}

impl std::str::FromStr for GatewayServiceType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(GatewayServiceType::Auto),
            "LoadBalancer" => Ok(GatewayServiceType::LoadBalancer),
            "NodePort" => Ok(GatewayServiceType::NodePort),
            other => Err(format!(
                "gateway Service type {other:?} is none of \"auto\", \"LoadBalancer\", \"NodePort\""
            )),
        }
    }
}

/// Settings the controller reads from the `tandem-config` ConfigMap.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterSettings {
    pub pod_cidr: String,
    pub external_cidr: String,
    pub share_percent: u32,
    /// Whether peerings get a gateway and the node agent routes to it (as set; see
    /// [`ClusterSettings::fabric_off`] for whether it runs).
    pub network_fabric: bool,
    /// Whether this is a hollow lab cluster (its pods have no network): the fabric stays off
    /// whatever the setting. Not a setting: the controller finds it out.
    pub hollow_cluster: bool,
    /// Tandem's image, for the pods the controller creates (gateways).
    pub image: String,
    /// Secrets (in tandem-system) the pods it creates pull that image with.
    pub image_pull_secrets: Vec<String>,
    /// What peers may open connections to through the tunnel.
    pub network_exposure: NetworkExposure,
    /// How peers reach this cluster's gateways.
    pub gateway_service_type: GatewayServiceType,
}

impl ClusterSettings {
    /// Why the network fabric does not run here; None when it does.
    pub fn fabric_off(&self) -> Option<&'static str> {
        if !self.network_fabric {
            Some(FABRIC_OFF_BY_SETTING)
        } else if self.hollow_cluster {
            Some(FABRIC_OFF_IN_HOLLOW_LAB)
        } else {
            None
        }
    }
}

/// Why the fabric is off when the setting says so.
pub const FABRIC_OFF_BY_SETTING: &str = "the network fabric is off in this cluster's settings \
    (networkFabric: \"false\"; `tandem install --network-fabric` turns it on): pods run across \
    the peering, but no traffic flows between the clusters' pods and clusterset.local names \
    do not answer from the other cluster";
/// Why the fabric is off in a hollow lab cluster.
pub const FABRIC_OFF_IN_HOLLOW_LAB: &str = "the network fabric is off: this is a hollow lab \
    cluster, whose pods have no network (kube-system is labelled lab.tandem.dev/hollow-pods); \
    `tandem lab up --network` runs clusters with one";

pub const DEFAULT_EXTERNAL_CIDR: &str = "10.70.0.0/16";

/// Tandem's image of this build's version.
pub fn default_image() -> String {
    format!("ghcr.io/tandem-dev/tandem:{}", env!("CARGO_PKG_VERSION"))
}
/// The share of its capacity a provider lends when the settings name none.
pub const DEFAULT_SHARE_PERCENT: u32 = 50;

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("install step {step:?}")]
    Step {
        step: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("install step \"CRDs\": CustomResourceDefinition {0} not Established after 30s")]
    CrdNotEstablished(String),
    #[error("install step \"settings\": {0}")]
    Settings(String),
    #[error("install step \"cluster identity\"")]
    Identity(#[from] IdentityError),
}

/// Maps kube's error of an install step to [`InstallError::Step`] naming it.
pub fn step(step: &'static str) -> impl FnOnce(kube::Error) -> InstallError {
    move |source| InstallError::Step { step, source }
}

/// Whether the cluster's `kube-system` Namespace carries the label of a hollow lab cluster,
/// whose pods have no network ([`names::HOLLOW_CLUSTER_LABEL`]).
pub async fn is_hollow_cluster(client: &Client) -> Result<bool, kube::Error> {
    let ns = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .get_opt("kube-system")
        .await?;
    Ok(ns.is_some_and(|ns| {
        ns.labels()
            .get(names::HOLLOW_CLUSTER_LABEL)
            .is_some_and(|v| v == "true")
    }))
}

/// Why the network fabric does not run in the cluster of `client` (None: it does), read as
/// the controller reads it: its settings, and whether the cluster is a hollow lab's.
pub async fn fabric_off(client: &Client) -> Result<Option<&'static str>, InstallError> {
    let mut settings = load_settings(client).await?;
    if settings.network_fabric {
        settings.hollow_cluster = is_hollow_cluster(client)
            .await
            .map_err(step("reading kube-system's labels"))?;
    }
    Ok(settings.fabric_off())
}

/// Reads the `tandem-config` ConfigMap.
pub async fn load_settings(client: &Client) -> Result<ClusterSettings, InstallError> {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), names::SYSTEM_NAMESPACE);
    let map = maps
        .get(names::CONFIG_MAP)
        .await
        .map_err(step("settings"))?;
    settings_from(&map)
}

/// The settings the `tandem-config` ConfigMap `map` holds.
pub fn settings_from(map: &ConfigMap) -> Result<ClusterSettings, InstallError> {
    let empty = BTreeMap::new();
    let data = map.data.as_ref().unwrap_or(&empty);
    let get = |k: &str| {
        data.get(k).cloned().ok_or_else(|| {
            InstallError::Settings(format!(
                "ConfigMap {}/{} lacks {k:?}; re-run `tandem install`",
                names::SYSTEM_NAMESPACE,
                names::CONFIG_MAP
            ))
        })
    };
    let parsed = |key: &str, e: String| {
        InstallError::Settings(format!(
            "ConfigMap {}/{}: {key}: {e}",
            names::SYSTEM_NAMESPACE,
            names::CONFIG_MAP
        ))
    };
    Ok(ClusterSettings {
        gateway_service_type: match data.get("gatewayServiceType") {
            None => GatewayServiceType::default(),
            Some(v) => v.parse().map_err(|e| parsed("gatewayServiceType", e))?,
        },
        pod_cidr: get("podCIDR")?,
        external_cidr: get("externalCIDR")?,
        share_percent: get("sharePercent")?
            .parse()
            .unwrap_or(DEFAULT_SHARE_PERCENT),
        // Settings written before these keys existed: no fabric, this build's image.
        network_fabric: data.get("networkFabric").is_some_and(|v| v == "true"),
        hollow_cluster: false,
        image: data.get("image").cloned().unwrap_or_else(default_image),
        image_pull_secrets: data
            .get("imagePullSecrets")
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default(),
        network_exposure: match data.get("networkExposure") {
            None => NetworkExposure::default(),
            Some(v) => v.parse().map_err(|e: String| {
                InstallError::Settings(format!(
                    "ConfigMap {}/{}: {e}",
                    names::SYSTEM_NAMESPACE,
                    names::CONFIG_MAP
                ))
            })?,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(data: &[(&str, &str)]) -> ConfigMap {
        ConfigMap {
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn pull_secrets_are_read_from_the_settings_comma_separated() {
        let base = [
            ("podCIDR", "10.244.0.0/16"),
            ("externalCIDR", "10.70.0.0/16"),
            ("sharePercent", "50"),
        ];
        assert!(
            settings_from(&map(&base))
                .unwrap()
                .image_pull_secrets
                .is_empty()
        );
        let mut with = base.to_vec();
        with.push(("imagePullSecrets", "regcred, mirror,"));
        assert_eq!(
            settings_from(&map(&with)).unwrap().image_pull_secrets,
            ["regcred", "mirror"]
        );
    }
}
