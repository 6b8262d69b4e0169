//! The gateway of each peer, and the node agent routing to it, when the cluster's
//! `networkFabric` setting is on.
//!
//! Per peer, in `tandem-system`, all named `tandem-gateway-<peer>`:
//! - a Deployment of one pod of Tandem's image running `tandem gateway --peer <peer>` on the
//!   node network (hostNetwork: a node forwards packets already, so the gateway needs no
//!   sysctl and no privilege beyond NET_ADMIN; `/dev/net/tun` is the node's, mode 0666), so
//!   the namespace needs the Pod Security level `privileged` (hostNetwork and NET_ADMIN are
//!   beyond `baseline`);
//! - a LoadBalancer Service on the gateway's UDP port (one port per peer, from 51820 up, so
//!   that two gateways on one node never clash): its ingress and port are the gateway endpoint
//!   this side publishes in its `NetworkParameters`;
//! - a ServiceAccount whose Role may only `get` the gateway's own Secret, where this reconciler
//!   writes the whole configuration (`gateway.json`: keys, the peer's endpoint, the NAT plan)
//!   once both sides' parameters are known.
//!
//! The node agent (DaemonSet `tandem-agent`, every real node) routes each peer's prefixes, as
//! this cluster names them, to the node running that peer's gateway; the prefixes are in the
//! ConfigMap `tandem-routes`.
//!
//! Each pass observes (this module: lists and reads), decides ([`plan`] for the objects and
//! the configuration, [`exposure`] for the least-exposure rule: pure, table-tested) and acts
//! on the plan's [`Step`]s (this module again).

pub mod exposure;
#[cfg(test)]
mod fixtures;
pub mod plan;

use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use tandem_api::{NetworkParameters, Peering, Tenant, client, names};

use crate::context::Ctx;
use crate::rbac::{CONSUMER_NETWORK_PARAMETERS, PROVIDER_NETWORK_PARAMETERS};
use crate::settings::{ClusterSettings, NetworkExposure};

use super::keys::{GATEWAY_CONFIG, gateway_secret};
use plan::{APPLIED_HASH, Kind, Manifest, NAME_LABEL, Step};

pub use plan::{
    AGENT, GATEWAY_APP, PORT_BASE, PeerView, ROUTES_CONFIG_MAP, ROUTES_KEY, gateway_args, interface,
};

/// The view of every peer: consumer-side relations from the Peerings' negotiated network,
/// provider-side ones from the NetworkParameters pair in each Tenant's namespace. A cluster
/// peered both ways is seen through its Peering (one tunnel per pair of clusters).
pub async fn views(ctx: &Ctx, settings: &ClusterSettings) -> Result<Vec<PeerView>, kube::Error> {
    let mut tenants = Vec::new();
    for tenant in Api::<Tenant>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await?
    {
        let Ok(peer) = plan::tenant_peer(&tenant) else {
            continue;
        };
        let ns = names::tenant_namespace(&peer);
        let params: Api<NetworkParameters> = Api::namespaced(ctx.client.clone(), &ns);
        let theirs = params.get_opt(CONSUMER_NETWORK_PARAMETERS).await?;
        let ours = params.get_opt(PROVIDER_NETWORK_PARAMETERS).await?;
        tenants.push(plan::TenantNetwork { peer, theirs, ours });
    }
    let peerings = Api::<Peering>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    Ok(plan::views(settings, &tenants, &peerings))
}

/// Least exposure: the local pods `view`'s peer may open connections to through the tunnel
/// (with the `pod-cidr` exposure, the whole pod CIDR), as [`exposure::destinations`] decides
/// from what this lists.
pub async fn allowed_destinations(
    ctx: &Ctx,
    settings: &ClusterSettings,
    view: &PeerView,
) -> Result<Vec<IpNet>, kube::Error> {
    // The whole pod CIDR needs nothing listed.
    let seen = if settings.network_exposure == NetworkExposure::PodCidr {
        exposure::Observed::default()
    } else {
        reachable(ctx, view).await?
    };
    Ok(exposure::destinations(
        settings.network_exposure,
        &settings.pod_cidr,
        view,
        &seen,
    ))
}

/// What the least-exposure rule reads for `view`'s peer.
async fn reachable(ctx: &Ctx, view: &PeerView) -> Result<exposure::Observed, kube::Error> {
    use k8s_openapi::api::core::v1::{Namespace, Pod};
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let mut seen = exposure::Observed::default();
    if view.provider_for {
        seen.twin_namespaces = Api::<Namespace>::all(ctx.client.clone())
            .list(&ListParams::default().labels(&format!(
                "{},{}={}",
                names::TWIN_NAMESPACE_LABEL,
                names::ORIGIN_CLUSTER_LABEL,
                view.peer
            )))
            .await?
            .items
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect();
        let origin = format!("{}={}", names::ORIGIN_CLUSTER_LABEL, view.peer);
        seen.origin_pods = Api::<Pod>::all(ctx.client.clone())
            .list(&ListParams::default().labels(&origin))
            .await?
            .items;
    }
    if view.consumer_of {
        let offloadings = Api::<tandem_api::NamespaceOffloading>::all(ctx.client.clone())
            .list(&ListParams::default())
            .await?
            .items;
        for ns in exposure::offloaded_to(&view.peer, &offloadings) {
            seen.offloaded_pods.extend(
                Api::<Pod>::namespaced(ctx.client.clone(), &ns)
                    .list(&ListParams::default())
                    .await?
                    .items,
            );
        }
    }
    let exports = Api::<tandem_api::ServiceExport>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await;
    // Absent CRDs (an install from before multi-cluster services) export nothing.
    for export in client::ok_if_not_found(exports)?
        .map(|l| l.items)
        .unwrap_or_default()
    {
        let (Some(ns), Some(name)) = (export.metadata.namespace, export.metadata.name) else {
            continue;
        };
        seen.exported_slices.extend(
            Api::<EndpointSlice>::namespaced(ctx.client.clone(), &ns)
                // Only the slices Kubernetes derives from the Service's selector: a slice
                // anyone with write access to the namespace could label would otherwise open
                // the fabric.
                .list(&ListParams::default().labels(&format!(
                    "kubernetes.io/service-name={name},{}",
                    tandem_api::names::SOURCE_SLICES_SELECTOR
                )))
                .await?
                .items,
        );
    }
    Ok(seen)
}

/// Why the fabric of a peer could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum FabricError {
    #[error("{what}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Key(#[from] super::keys::KeyError),
    #[error("reading the cluster's settings")]
    Settings(#[from] crate::settings::InstallError),
    #[error("no free gateway port from {PORT_BASE} up")]
    NoPort,
}

fn api_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> FabricError {
    let what = what.into();
    move |source| FabricError::Api { what, source }
}

/// Runs `$body` with `$k` the API type of `$kind`.
macro_rules! of_kind {
    ($kind:expr, $k:ident => $body:expr) => {
        match $kind {
            Kind::ServiceAccount => {
                type $k = ServiceAccount;
                $body
            }
            Kind::Role => {
                type $k = Role;
                $body
            }
            Kind::RoleBinding => {
                type $k = RoleBinding;
                $body
            }
            Kind::Service => {
                type $k = Service;
                $body
            }
            Kind::Deployment => {
                type $k = Deployment;
                $body
            }
            Kind::ConfigMap => {
                type $k = ConfigMap;
                $body
            }
            Kind::DaemonSet => {
                type $k = DaemonSet;
                $body
            }
        }
    };
}

fn system_api<K>(client: &kube::Client) -> Api<K>
where
    K: kube::Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
{
    Api::namespaced(client.clone(), names::SYSTEM_NAMESPACE)
}

/// The hash Tandem stamped on the object `name` of type `K` when it last applied it.
async fn applied<K>(client: &kube::Client, name: &str) -> Result<Option<String>, kube::Error>
where
    K: kube::Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    Ok(system_api::<K>(client)
        .get_opt(name)
        .await?
        .and_then(|current| {
            current
                .meta()
                .annotations
                .as_ref()?
                .get(APPLIED_HASH)
                .cloned()
        }))
}

async fn apply_as<K>(client: &kube::Client, manifest: &Manifest) -> Result<(), kube::Error>
where
    K: kube::Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Serialize
        + DeserializeOwned
        + std::fmt::Debug,
{
    system_api::<K>(client)
        .patch(
            &manifest.name,
            &PatchParams::apply(names::FIELD_MANAGER).force(),
            &Patch::Apply(&manifest.body),
        )
        .await?;
    Ok(())
}

async fn delete_as<K>(client: &kube::Client, name: &str) -> Result<(), kube::Error>
where
    K: kube::Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    client::delete_if_exists(&system_api::<K>(client), name, &DeleteParams::background()).await
}

/// Sends `step`.
async fn act(client: &kube::Client, step: &Step) -> Result<(), kube::Error> {
    match step {
        Step::Apply(manifest) => {
            of_kind!(manifest.kind, K => apply_as::<K>(client, manifest).await)
        }
        Step::WriteConfig { secret, config } => {
            use base64::Engine as _;
            let encoded = base64::engine::general_purpose::STANDARD.encode(config);
            system_api::<Secret>(client)
                .patch(
                    secret,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"data": {GATEWAY_CONFIG: encoded}})),
                )
                .await?;
            Ok(())
        }
        Step::Delete { kind, name } => of_kind!(kind, K => delete_as::<K>(client, name).await),
    }
}

/// Creates or updates `manifest` (server-side apply) unless what Tandem last applied is the
/// same.
async fn ensure(client: &kube::Client, manifest: &Manifest) -> Result<(), kube::Error> {
    let applied = of_kind!(manifest.kind, K => applied::<K>(client, &manifest.name).await?);
    match plan::apply(manifest, applied.as_deref()) {
        Ok(step) => act(client, &step).await,
        Err(_unchanged) => Ok(()),
    }
}

/// The port of `peer`'s gateway: its Service's, else the lowest no other gateway uses.
async fn port_of(ctx: &Ctx, peer: &str) -> Result<u16, FabricError> {
    let all = system_api::<Service>(&ctx.client)
        .list(&ListParams::default().labels(&format!("{NAME_LABEL}={GATEWAY_APP}")))
        .await
        .map_err(api_err("listing gateway Services"))?;
    plan::port(peer, &all.items).ok_or(FabricError::NoPort)
}

/// Where `peer` reaches this side's gateway to it, as `exposed` says ([`plan::exposure`]), or
/// why it cannot yet.
///
/// The Service is read from the watched Services (the provider's network sweep asks for every
/// Tenant every second), or from the API until the watch has listed them; the gateway's pods
/// only when a node address is wanted.
pub async fn exposure(
    ctx: &Ctx,
    peer: &str,
    exposed: crate::settings::GatewayServiceType,
) -> Result<plan::Exposure, kube::Error> {
    let svc = match ctx.gateways.services.get(&gateway_secret(peer)) {
        Some(svc) => svc,
        None => system_api::<Service>(&ctx.client)
            .get_opt(&gateway_secret(peer))
            .await?
            .map(std::sync::Arc::new),
    };
    let age = svc
        .as_ref()
        .and_then(|s| s.metadata.creation_timestamp.as_ref())
        .map(|t| {
            let ms = k8s_openapi::jiff::Timestamp::now().as_millisecond() - t.0.as_millisecond();
            Duration::from_millis(ms.max(0) as u64)
        })
        .unwrap_or_default();
    let without_node = plan::exposure(svc.as_deref(), None, exposed, age);
    let needs_node = matches!(&without_node, plan::Exposure::Pending(_))
        && exposed != crate::settings::GatewayServiceType::LoadBalancer;
    if !needs_node {
        return Ok(without_node);
    }
    let pods = system_api::<k8s_openapi::api::core::v1::Pod>(&ctx.client)
        .list(&ListParams::default().labels(&format!(
            "{NAME_LABEL}={GATEWAY_APP},{}={peer}",
            names::REMOTE_CLUSTER_LABEL
        )))
        .await?;
    let node_ip = plan::running_host(&pods.items);
    Ok(plan::exposure(
        svc.as_deref(),
        node_ip.as_deref(),
        exposed,
        age,
    ))
}

/// `host:port` of this side's gateway to `peer` as the peer reaches it, once it has one (see
/// [`exposure`]).
pub async fn local_endpoint(
    ctx: &Ctx,
    peer: &str,
    exposed: crate::settings::GatewayServiceType,
) -> Result<Option<String>, kube::Error> {
    let exposure = exposure(ctx, peer, exposed).await?;
    Ok(exposure.endpoint().map(str::to_string))
}

/// Where the status API of this cluster's gateway to `peer` answers (`hostIP:port`: the
/// gateway runs on the node network and serves `/status` on TCP at its UDP port): `Ok(None)`
/// when the cluster's network fabric is off, `Err` with the reason when it is on but no
/// gateway to `peer` runs.
pub async fn status_address(ctx: &Ctx, peer: &str) -> Result<Option<String>, StatusAddressError> {
    let client = &ctx.client;
    let settings = ctx.settings().await?;
    if plan::fabric_on(&settings).is_err() {
        return Ok(None);
    }
    let ns = names::SYSTEM_NAMESPACE;
    let name = gateway_secret(peer);
    let port = system_api::<Service>(client)
        .get_opt(&name)
        .await
        .map_err(|source| StatusAddressError::Service {
            name: format!("{ns}/{name}"),
            source,
        })?
        .and_then(|s| s.spec?.ports?.first().map(|p| p.port))
        .ok_or_else(|| StatusAddressError::NoService(format!("{ns}/{name}")))?;
    let pods = system_api::<k8s_openapi::api::core::v1::Pod>(client)
        .list(&ListParams::default().labels(&format!(
            "{NAME_LABEL}={GATEWAY_APP},{}={peer}",
            names::REMOTE_CLUSTER_LABEL
        )))
        .await
        .map_err(|source| StatusAddressError::Pods {
            namespace: ns.to_string(),
            source,
        })?;
    plan::running_host(&pods.items)
        .map(|ip| Some(format!("{ip}:{port}")))
        .ok_or_else(|| StatusAddressError::NotRunning(format!("{ns}/{name}")))
}

/// Why the address of a peer's gateway status API cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum StatusAddressError {
    /// The cluster's settings cannot be read.
    #[error(transparent)]
    Settings(#[from] crate::settings::InstallError),
    /// Reading the gateway's Service (`namespace/name`) failed.
    #[error("reading Service {name}")]
    Service {
        name: String,
        #[source]
        source: kube::Error,
    },
    /// The gateway's Service (`namespace/name`) is not there yet.
    #[error("the gateway Service {0} does not exist yet")]
    NoService(String),
    /// Listing the gateway's pods failed.
    #[error("listing the gateway pods in {namespace}")]
    Pods {
        namespace: String,
        #[source]
        source: kube::Error,
    },
    /// No pod of the gateway's Deployment (`namespace/name`) runs.
    #[error("no pod of the gateway Deployment {0} is running")]
    NotRunning(String),
}

/// Keeps `peer`'s gateway objects and configuration in line with `view`.
pub async fn reconcile(
    ctx: &Ctx,
    settings: &ClusterSettings,
    view: &PeerView,
) -> Result<(), FabricError> {
    let peer = view.peer.as_str();
    let name = gateway_secret(peer);
    let key = super::keys::gateway_key(ctx, peer).await?;
    let port = port_of(ctx, peer).await?;
    let ns = names::SYSTEM_NAMESPACE;
    let client = &ctx.client;
    for manifest in plan::with_pull_secrets(
        plan::gateway_objects(peer, port, &settings.image, settings.gateway_service_type),
        &settings.image_pull_secrets,
    ) {
        ensure(client, &manifest).await.map_err(api_err(format!(
            "gateway {} {ns}/{}",
            manifest.kind, manifest.name
        )))?;
    }

    let allowed = allowed_destinations(ctx, settings, view)
        .await
        .map_err(api_err("listing the pods the peer may reach"))?;
    // A peer's endpoint that is a host name (a cloud load balancer's) is resolved here, on
    // every pass: the gateway takes addresses only.
    let resolved;
    let view = match view.peer_endpoint.as_deref() {
        Some(e) if e.parse::<std::net::SocketAddr>().is_err() => {
            let address = tokio::net::lookup_host(e)
                .await
                .ok()
                .and_then(|mut a| a.next());
            if address.is_none() {
                tracing::warn!(
                    peer,
                    endpoint = e,
                    "the peer's gateway endpoint does not resolve"
                );
            }
            resolved = PeerView {
                peer_endpoint: address.map(|a| a.to_string()),
                ..view.clone()
            };
            &resolved
        }
        _ => view,
    };
    // Not before the peer's key and the NAT are known.
    let Ok(args) = plan::gateway_args(view, &key.private_key, port, allowed) else {
        return Ok(());
    };
    let current = system_api::<Secret>(client)
        .get(&name)
        .await
        .map_err(api_err(format!("Secret {ns}/{name}")))?;
    let stored = current
        .data
        .as_ref()
        .and_then(|d| d.get(GATEWAY_CONFIG))
        .map(|b| b.0.as_slice());
    if let Ok(step) = plan::write_config(peer, &args, stored) {
        act(client, &step).await.map_err(api_err(format!(
            "writing the gateway configuration into Secret {ns}/{name}"
        )))?;
        tracing::info!(peer, "gateway configuration written");
    }
    Ok(())
}

/// Keeps the node agent (DaemonSet, its ServiceAccount, Role and RoleBinding) and its routes
/// ConfigMap in line with `views`.
pub async fn reconcile_agent(
    ctx: &Ctx,
    settings: &ClusterSettings,
    views: &[PeerView],
) -> Result<(), FabricError> {
    let ns = names::SYSTEM_NAMESPACE;
    for manifest in plan::with_pull_secrets(
        plan::agent_objects(views, &settings.image),
        &settings.image_pull_secrets,
    ) {
        ensure(&ctx.client, &manifest)
            .await
            .map_err(api_err(format!("{} {ns}/{}", manifest.kind, manifest.name)))?;
    }
    Ok(())
}

/// Removes `peer`'s gateway objects (the key Secret is removed by the caller).
pub async fn remove(client: &kube::Client, peer: &str) -> Result<(), kube::Error> {
    for step in plan::removal(peer) {
        act(client, &step).await?;
    }
    Ok(())
}

/// Removes the node agent and its routes ConfigMap (no peer left).
pub async fn remove_agent(client: &kube::Client) -> Result<(), kube::Error> {
    for step in plan::agent_removal() {
        act(client, &step).await?;
    }
    Ok(())
}

/// Every second, while the cluster's `networkFabric` setting is on: each peer's gateway and
/// the node agent.
pub async fn run(ctx: Ctx) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = sweep(&ctx).await {
            tracing::warn!(error = %crate::error::chain(&e), "network fabric");
        }
    }
}

async fn sweep(ctx: &Ctx) -> Result<(), FabricError> {
    let settings = ctx.settings().await?;
    if plan::fabric_on(&settings).is_err() {
        return Ok(());
    }
    let views = views(ctx, &settings)
        .await
        .map_err(api_err("reading peerings and their network parameters"))?;
    // A gateway whose peer is gone (an unpeer that raced this sweep) is removed.
    let deployments = system_api::<Deployment>(&ctx.client)
        .list(&ListParams::default().labels(&format!("{NAME_LABEL}={GATEWAY_APP}")))
        .await
        .map_err(api_err("listing gateway Deployments"))?;
    for peer in plan::orphans(&deployments.items, &views) {
        forget_peer(&ctx.client, &peer)
            .await
            .map_err(api_err(format!("removing the gateway to {peer}")))?;
    }
    if plan::any_peer(&views).is_err() {
        return Ok(());
    }
    for view in &views {
        if let Err(e) = reconcile(ctx, &settings, view).await {
            tracing::warn!(peer = %view.peer, error = %crate::error::chain(&e), "gateway");
        }
    }
    reconcile_agent(ctx, &settings, &views).await
}

/// Removes this cluster's gateway to `peer` (its objects and its key) unless a peering with
/// it is left in either direction, and the node agent when no peering at all is left.
pub async fn forget_peer(client: &kube::Client, peer: &str) -> Result<(), kube::Error> {
    if super::keys::live_relation(client, Some(peer)).await? {
        return Ok(());
    }
    remove(client, peer).await?;
    client::delete_if_exists(
        &system_api::<Secret>(client),
        &gateway_secret(peer),
        &DeleteParams::default(),
    )
    .await?;
    if !super::keys::live_relation(client, None).await? {
        remove_agent(client).await?;
    }
    Ok(())
}
