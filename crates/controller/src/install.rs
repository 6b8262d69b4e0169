//! What the controller installs by itself on its first start ([`bootstrap`]: the pod CIDR
//! detected from the Nodes, the cluster identity), and the install-time helpers every
//! reconciler shares (server-side apply, finalizers, the cluster's settings), re-exported from
//! where they live. `tandem install` itself — the manifests and their apply — is the admin
//! library's (`tandem_admin::install`).

use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tandem_api::names;

pub use crate::coredns::{
    DNS_SERVICE, STUB_BEGIN, STUB_END, edit_corefile, stub_domain_block, with_stub_domain,
    without_stub_domain,
};
use crate::identity::ClusterIdentity;
pub use crate::objects::{add_finalizer, apply, remove_finalizer};
use crate::settings::step;
pub use crate::settings::{
    ClusterSettings, DEFAULT_EXTERNAL_CIDR, DEFAULT_SHARE_PERCENT, GatewayServiceType,
    InstallError, NetworkExposure, default_image, load_settings, settings_from,
};

/// What the controller does on its first start where `tandem install` did it before: detects
/// the pod CIDR when the settings name none, and creates the cluster identity (with the
/// settings' `clusterID`, else a generated one). Idempotent; returns the identity.
pub async fn bootstrap(client: &Client) -> Result<ClusterIdentity, InstallError> {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), names::SYSTEM_NAMESPACE);
    let map = maps
        .get_opt(names::CONFIG_MAP)
        .await
        .map_err(step("settings"))?
        .ok_or_else(|| {
            InstallError::Settings(format!(
                "ConfigMap {}/{} not found: install Tandem first (`tandem install`, or \
                 `kubectl apply -k deploy/install`)",
                names::SYSTEM_NAMESPACE,
                names::CONFIG_MAP
            ))
        })?;
    let data = map.data.unwrap_or_default();
    if !data.contains_key("podCIDR") {
        let cidr = detect_pod_cidr(client).await.map_err(|e| match e {
            InstallError::Settings(why) => InstallError::Settings(format!(
                "{why} (or set podCIDR in ConfigMap {}/{})",
                names::SYSTEM_NAMESPACE,
                names::CONFIG_MAP
            )),
            other => other,
        })?;
        maps.patch(
            names::CONFIG_MAP,
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"podCIDR": cidr}})),
        )
        .await
        .map_err(step("settings"))?;
        tracing::info!(pod_cidr = %cidr, "pod CIDR detected from the Nodes and stored in the settings");
    }
    Ok(ClusterIdentity::ensure(client, data.get("clusterID").map(String::as_str)).await?)
}

/// The smallest prefix covering every Node's podCIDR.
pub async fn detect_pod_cidr(client: &Client) -> Result<String, InstallError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let list = nodes
        .list(&ListParams::default())
        .await
        .map_err(step("settings"))?;
    let cidrs: Vec<ipnet::IpNet> = list
        .items
        .iter()
        .filter(|n| {
            n.labels().get(names::NODE_TYPE_LABEL).map(String::as_str)
                != Some(names::VIRTUAL_NODE_TYPE)
        })
        .filter_map(|n| n.spec.as_ref()?.pod_cidr.as_ref()?.parse().ok())
        .collect();
    let Some(first) = cidrs.first() else {
        return Err(InstallError::Settings(
            "no Node has a podCIDR to detect the pod CIDR from; pass --pod-cidr".into(),
        ));
    };
    let mut cover = *first;
    while !cidrs.iter().all(|c| cover.contains(c)) {
        cover = cover.supernet().ok_or_else(|| {
            InstallError::Settings("Nodes' podCIDRs have no common prefix; pass --pod-cidr".into())
        })?;
    }
    Ok(cover.trunc().to_string())
}
