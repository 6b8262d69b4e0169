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

use std::collections::BTreeMap;
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use tandem_api::{NetworkParameters, Peering, Tenant, client, names};
use tandem_core::nat::{ClusterPrefixes, NatPlanInput};

use crate::context::Ctx;
use crate::install::ClusterSettings;
use crate::rbac::{CONSUMER_NETWORK_PARAMETERS, PROVIDER_NETWORK_PARAMETERS};

use super::keys::{GATEWAY_CONFIG, gateway_secret};

pub use tandem_api::names::{AGENT, GATEWAY_APP, ROUTES_CONFIG_MAP, ROUTES_KEY};
/// The first gateway port.
pub const PORT_BASE: u16 = 51820;
const NAME_LABEL: &str = "app.kubernetes.io/name";
/// Annotation holding the hash of what Tandem last applied, so an unchanged object is not
/// written again on every sweep.
const APPLIED_HASH: &str = "tandem.dev/applied-hash";

/// The TUN interface of the gateway to `peer` (15 bytes, whatever the peer's name; its
/// nftables table is named after it).
pub fn interface(peer: &str) -> String {
    tandem_core::names::gateway_interface(peer)
}

/// What this cluster knows of the network of its relation with one peer.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerView {
    /// The peer's cluster ID.
    pub peer: String,
    /// The peer gateway's public key and endpoint, once published.
    pub peer_public_key: Option<String>,
    pub peer_endpoint: Option<String>,
    /// Both sides' prefixes and remaps, once negotiated.
    pub nat: Option<NatPlanInput>,
    /// Which roles this cluster plays towards the peer (both when peered both ways).
    pub consumer_of: bool,
    pub provider_for: bool,
}

fn prefixes(pod: Option<&str>, external: Option<&str>) -> Option<ClusterPrefixes> {
    Some(ClusterPrefixes {
        pod_cidr: pod?.parse().ok()?,
        external_cidr: external?.parse().ok()?,
    })
}

/// The view of every peer: consumer-side relations from the Peerings' negotiated network,
/// provider-side ones from the NetworkParameters pair in each Tenant's namespace. A cluster
/// peered both ways is seen through its Peering (one tunnel per pair of clusters).
pub async fn views(ctx: &Ctx, settings: &ClusterSettings) -> Result<Vec<PeerView>, kube::Error> {
    let local = prefixes(Some(&settings.pod_cidr), Some(&settings.external_cidr));
    let mut out: BTreeMap<String, PeerView> = BTreeMap::new();
    for tenant in Api::<Tenant>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await?
    {
        if tenant.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let peer = tenant.spec.cluster_id.clone();
        let ns = names::tenant_namespace(&peer);
        let params: Api<NetworkParameters> = Api::namespaced(ctx.client.clone(), &ns);
        let theirs = params.get_opt(CONSUMER_NETWORK_PARAMETERS).await?;
        let ours = params.get_opt(PROVIDER_NETWORK_PARAMETERS).await?;
        let seen_locally = theirs.as_ref().and_then(|t| {
            let s = t.status.as_ref()?;
            prefixes(
                s.remapped_pod_cidr.as_deref(),
                s.remapped_external_cidr.as_deref(),
            )
        });
        let seen_by_peer = ours.as_ref().and_then(|o| {
            let s = o.status.as_ref()?;
            prefixes(
                s.remapped_pod_cidr.as_deref(),
                s.remapped_external_cidr.as_deref(),
            )
        });
        out.insert(
            peer.clone(),
            PeerView {
                peer,
                peer_public_key: theirs.as_ref().and_then(|t| t.spec.public_key.clone()),
                peer_endpoint: theirs
                    .as_ref()
                    .and_then(|t| t.spec.gateway_endpoint.clone()),
                nat: nat(local, seen_by_peer, seen_locally),
                consumer_of: false,
                provider_for: true,
            },
        );
    }
    for peering in Api::<Peering>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await?
    {
        if peering.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let Some(n) = peering.status.as_ref().and_then(|s| s.network.clone()) else {
            continue;
        };
        let peer = peering.spec.cluster_id.clone();
        let provider_for = out.get(&peer).is_some_and(|v| v.provider_for);
        out.insert(
            peer.clone(),
            PeerView {
                consumer_of: true,
                provider_for,
                peer,
                peer_public_key: n.remote_public_key.clone(),
                peer_endpoint: n.remote_gateway_endpoint.clone(),
                nat: nat(
                    local,
                    prefixes(
                        n.local_pod_cidr_in_remote.as_deref(),
                        n.local_external_cidr_in_remote.as_deref(),
                    ),
                    prefixes(
                        Some(&n.remapped_remote_pod_cidr),
                        n.remapped_remote_external_cidr.as_deref(),
                    ),
                ),
            },
        );
    }
    Ok(out.into_values().collect())
}

fn nat(
    local: Option<ClusterPrefixes>,
    local_as_seen_by_peer: Option<ClusterPrefixes>,
    peer_as_seen_locally: Option<ClusterPrefixes>,
) -> Option<NatPlanInput> {
    Some(NatPlanInput {
        local: local?,
        local_as_seen_by_peer: local_as_seen_by_peer?,
        peer_as_seen_locally: peer_as_seen_locally?,
    })
}

/// The gateway configuration for `view` (None until the peer's key and the NAT are known).
pub fn gateway_args(
    view: &PeerView,
    private_key: &str,
    port: u16,
    allowed: Vec<IpNet>,
) -> Option<tandem_netspec::GatewayArgs> {
    let peer_public_key = view.peer_public_key.clone()?;
    let nat = view.nat?;
    Some(tandem_netspec::GatewayArgs {
        interface: interface(&view.peer),
        listen: std::net::SocketAddr::from(([0, 0, 0, 0], port)),
        private_key: private_key.to_string(),
        peer_public_key,
        // An endpoint that is not an address (a host name) is not used: the peer then
        // contacts this side, and roaming learns its address.
        peer_endpoint: view.peer_endpoint.as_deref().and_then(|e| e.parse().ok()),
        persistent_keepalive_secs: 25,
        mtu: 1420,
        nat,
        status_listen: Some(std::net::SocketAddr::from(([0, 0, 0, 0], port))),
        probe_interval_ms: 500,
        probe_timeout_ms: 1500,
        nft_table: None,
        allowed_destinations: Some(allowed),
        // A gateway of an earlier version, killed by the upgrade on this gateway's node
        // (hostNetwork), left its table under the old name of this same peer.
        legacy_interfaces: vec![tandem_core::names::legacy_gateway_interface(&view.peer)],
        legacy_nft_tables: vec![tandem_netspec::default_nft_table(
            &tandem_core::names::legacy_gateway_interface(&view.peer),
        )],
    })
}

/// Least exposure: the local pods `view`'s peer may open connections to through the tunnel
/// (with the `pod-cidr` exposure, the whole pod CIDR).
/// A consumer reaches its offloaded pods here (the pods of its twin namespaces, which carry
/// its cluster ID as origin); a provider's pods — the offloaded ones — reach the pods of the
/// namespaces offloaded from here (where their Services' endpoints are); and every peer
/// reaches the endpoints of the Services this cluster exports (multi-cluster services).
/// Nothing else: not kube-system, not tandem-system, not another consumer's twins.
pub async fn allowed_destinations(
    ctx: &Ctx,
    settings: &ClusterSettings,
    view: &PeerView,
) -> Result<Vec<IpNet>, kube::Error> {
    use k8s_openapi::api::core::v1::Pod;
    let local: Option<IpNet> = settings.pod_cidr.parse().ok();
    if settings.network_exposure == crate::install::NetworkExposure::PodCidr {
        return Ok(local.into_iter().collect());
    }
    let mut pods: Vec<Pod> = Vec::new();
    let all: Api<Pod> = Api::all(ctx.client.clone());
    if view.provider_for {
        // The peer's pods in its twin namespaces only: the origin label alone is a label
        // anyone may put on a pod of their own.
        let twins: Vec<String> =
            Api::<k8s_openapi::api::core::v1::Namespace>::all(ctx.client.clone())
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
        pods.extend(
            all.list(&ListParams::default().labels(&origin))
                .await?
                .items
                .into_iter()
                .filter(|p| {
                    p.metadata
                        .namespace
                        .as_ref()
                        .is_some_and(|n| twins.contains(n))
                }),
        );
    }
    if view.consumer_of {
        for offloading in Api::<tandem_api::NamespaceOffloading>::all(ctx.client.clone())
            .list(&ListParams::default())
            .await?
        {
            let Some(ns) = offloading.metadata.namespace.as_deref() else {
                continue;
            };
            // Only namespaces offloaded to this provider: another provider's pods never reach
            // what was offloaded elsewhere.
            if tandem_api::offloading::twin_of(&offloading, &view.peer).is_none() {
                continue;
            }
            pods.extend(
                Api::<Pod>::namespaced(ctx.client.clone(), ns)
                    .list(&ListParams::default())
                    .await?
                    .items,
            );
        }
    }
    let mut exported: Vec<std::net::IpAddr> = Vec::new();
    let exports = Api::<tandem_api::ServiceExport>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await;
    // Absent CRDs (an install from before multi-cluster services) export nothing.
    for export in tandem_api::client::ok_if_not_found(exports)?
        .map(|l| l.items)
        .unwrap_or_default()
    {
        let (Some(ns), Some(name)) = (export.metadata.namespace, export.metadata.name) else {
            continue;
        };
        let slices = Api::<k8s_openapi::api::discovery::v1::EndpointSlice>::namespaced(
            ctx.client.clone(),
            &ns,
        )
        // Only the slices Kubernetes derives from the Service's selector: a slice anyone
        // with write access to the namespace could label would otherwise open the fabric.
        .list(&ListParams::default().labels(&format!(
            "kubernetes.io/service-name={name},{}",
            tandem_api::names::SOURCE_SLICES_SELECTOR
        )))
        .await?;
        exported.extend(
            slices
                .items
                .iter()
                .flat_map(|s| s.endpoints.iter().flat_map(|e| e.addresses.iter()))
                .filter_map(|a| a.parse::<std::net::IpAddr>().ok()),
        );
    }
    let mut out: Vec<IpNet> = pods
        .iter()
        .filter_map(|p| {
            p.status
                .as_ref()?
                .pod_ip
                .as_deref()?
                .parse::<std::net::IpAddr>()
                .ok()
        })
        .chain(exported)
        // Pods of this cluster only (not those on virtual nodes, nor hostNetwork ones).
        .filter(|ip| local.is_some_and(|l| l.contains(ip)))
        .map(IpNet::from)
        .collect();
    out.sort();
    out.dedup();
    Ok(out)
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
    Settings(#[from] crate::install::InstallError),
    #[error("no free gateway port from {PORT_BASE} up")]
    NoPort,
}

fn api_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> FabricError {
    let what = what.into();
    move |source| FabricError::Api { what, source }
}

/// Creates or updates `value` (server-side apply) unless what Tandem last applied is the same.
async fn ensure<K>(api: &Api<K>, mut value: serde_json::Value) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    use sha2::Digest as _;
    let name = value["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let hash = format!("{:x}", sha2::Sha256::digest(value.to_string().as_bytes()));
    if let Some(current) = api.get_opt(&name).await?
        && current
            .meta()
            .annotations
            .as_ref()
            .and_then(|a| a.get(APPLIED_HASH))
            == Some(&hash)
    {
        return Ok(());
    }
    value["metadata"]["annotations"][APPLIED_HASH] = json!(hash);
    api.patch(
        &name,
        &PatchParams::apply(names::FIELD_MANAGER).force(),
        &Patch::Apply(&value),
    )
    .await?;
    Ok(())
}

fn labels(peer: &str) -> serde_json::Value {
    json!({NAME_LABEL: GATEWAY_APP, names::MANAGED_BY_LABEL: names::MANAGED_BY,
           names::REMOTE_CLUSTER_LABEL: peer})
}

/// The port of `peer`'s gateway: its Service's, else the lowest no other gateway uses.
async fn port_of(ctx: &Ctx, peer: &str) -> Result<u16, FabricError> {
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), names::SYSTEM_NAMESPACE);
    let all = services
        .list(&ListParams::default().labels(&format!("{NAME_LABEL}={GATEWAY_APP}")))
        .await
        .map_err(api_err("listing gateway Services"))?;
    let port = |s: &Service| -> Option<u16> {
        u16::try_from(s.spec.as_ref()?.ports.as_ref()?.first()?.port).ok()
    };
    let name = gateway_secret(peer);
    if let Some(p) = all
        .items
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some(&name))
        .and_then(port)
    {
        return Ok(p);
    }
    let used: Vec<u16> = all.items.iter().filter_map(port).collect();
    (PORT_BASE..=u16::MAX)
        .find(|p| !used.contains(p))
        .ok_or(FabricError::NoPort)
}

/// `ip:port` of this side's gateway to `peer` as the peer reaches it: the load balancer's
/// ingress of the gateway's Service, once it has one.
///
/// Read from the watched Services (the provider's network sweep asks for every Tenant every
/// second), or from the API until the watch has listed them.
pub async fn local_endpoint(ctx: &Ctx, peer: &str) -> Result<Option<String>, kube::Error> {
    let svc = match ctx.gateways.services.get(&gateway_secret(peer)) {
        Some(svc) => svc,
        None => Api::<Service>::namespaced(ctx.client.clone(), names::SYSTEM_NAMESPACE)
            .get_opt(&gateway_secret(peer))
            .await?
            .map(std::sync::Arc::new),
    };
    let Some(svc) = svc else {
        return Ok(None);
    };
    let port = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref()?.first().map(|p| p.port));
    let ip = svc.status.as_ref().and_then(|s| {
        s.load_balancer
            .as_ref()?
            .ingress
            .as_ref()?
            .first()?
            .ip
            .clone()
    });
    Ok(match (ip, port) {
        (Some(ip), Some(port)) => Some(format!("{ip}:{port}")),
        _ => None,
    })
}

/// Where the status API of this cluster's gateway to `peer` answers (`hostIP:port`: the
/// gateway runs on the node network and serves `/status` on TCP at its UDP port): `Ok(None)`
/// when the cluster's network fabric is off, `Err` with the reason when it is on but no
/// gateway to `peer` runs.
pub async fn status_address(ctx: &Ctx, peer: &str) -> Result<Option<String>, StatusAddressError> {
    let client = &ctx.client;
    let settings = ctx.settings().await?;
    if !settings.network_fabric {
        return Ok(None);
    }
    let ns = names::SYSTEM_NAMESPACE;
    let name = gateway_secret(peer);
    let port = Api::<Service>::namespaced(client.clone(), ns)
        .get_opt(&name)
        .await
        .map_err(|source| StatusAddressError::Service {
            name: format!("{ns}/{name}"),
            source,
        })?
        .and_then(|s| s.spec?.ports?.first().map(|p| p.port))
        .ok_or_else(|| StatusAddressError::NoService(format!("{ns}/{name}")))?;
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!(
            "{NAME_LABEL}={GATEWAY_APP},{}={peer}",
            names::REMOTE_CLUSTER_LABEL
        )))
        .await
        .map_err(|source| StatusAddressError::Pods {
            namespace: ns.to_string(),
            source,
        })?;
    pods.items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let status = p.status.as_ref()?;
            (status.phase.as_deref() == Some("Running")).then_some(())?;
            status.host_ip.clone()
        })
        .next()
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
    ensure(
        &Api::<ServiceAccount>::namespaced(client.clone(), ns),
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": name, "namespace": ns, "labels": labels(peer)}}),
    )
    .await
    .map_err(api_err(format!("gateway ServiceAccount {ns}/{name}")))?;
    ensure(
        &Api::<Role>::namespaced(client.clone(), ns),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": name, "namespace": ns, "labels": labels(peer)},
               "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"],
                          "resourceNames": [name]}]}),
    )
    .await
    .map_err(api_err(format!("gateway Role {ns}/{name}")))?;
    ensure(
        &Api::<RoleBinding>::namespaced(client.clone(), ns),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": name, "namespace": ns, "labels": labels(peer)},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
               "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]}),
    )
    .await
    .map_err(api_err(format!("gateway RoleBinding {ns}/{name}")))?;
    let selector = json!({NAME_LABEL: GATEWAY_APP, names::REMOTE_CLUSTER_LABEL: peer});
    ensure(
        &Api::<Service>::namespaced(client.clone(), ns),
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": name, "namespace": ns, "labels": labels(peer)},
               "spec": {"type": "LoadBalancer", "selector": selector,
                        "ports": [{"name": "wireguard", "port": port, "targetPort": port,
                                   "protocol": "UDP"}]}}),
    )
    .await
    .map_err(api_err(format!("gateway Service {ns}/{name}")))?;
    ensure(
        &Api::<Deployment>::namespaced(client.clone(), ns),
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "labels": labels(peer)},
        "spec": {
            "replicas": 1,
            // Never two on one node's port at once.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": labels(peer)},
                "spec": {
                    "serviceAccountName": name,
                    // Offloaded pods' traffic crosses it: evicted last under node pressure.
                    "priorityClassName": tandem_api::names::PRIORITY_CLASS,
                    "hostNetwork": true,
                    "dnsPolicy": "ClusterFirstWithHostNet",
                    "affinity": not_on_virtual_nodes(),
                    "securityContext": {"runAsNonRoot": true, "runAsUser": 65532,
                                        "runAsGroup": 65532},
                    "containers": [{
                        "name": "gateway", "image": settings.image,
                        "args": ["gateway", "--peer", peer],
                        "ports": [{"name": "wireguard", "containerPort": port,
                                   "protocol": "UDP"}],
                        // The non-root process gets NET_ADMIN from the file capability on
                        // Tandem's binary (deploy/image/Dockerfile), which no_new_privs
                        // (allowPrivilegeEscalation: false) would void; it can gain nothing
                        // else: every other capability is dropped from its bounding set.
                        "securityContext": {"allowPrivilegeEscalation": true,
                            "readOnlyRootFilesystem": true,
                            "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]}},
                    }],
                },
            },
        }}),
    )
    .await
    .map_err(api_err(format!("gateway Deployment {ns}/{name}")))?;

    let allowed = allowed_destinations(ctx, settings, view)
        .await
        .map_err(api_err("listing the pods the peer may reach"))?;
    let Some(args) = gateway_args(view, &key.private_key, port, allowed) else {
        return Ok(());
    };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let current = secrets
        .get(&name)
        .await
        .map_err(api_err(format!("Secret {ns}/{name}")))?;
    let wanted = serde_json::to_vec(&args).expect("gateway args serialize");
    let stored = current
        .data
        .as_ref()
        .and_then(|d| d.get(GATEWAY_CONFIG))
        .map(|b| b.0.as_slice());
    if stored != Some(wanted.as_slice()) {
        use base64::Engine as _;
        let encoded = base64::engine::general_purpose::STANDARD.encode(&wanted);
        secrets
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {GATEWAY_CONFIG: encoded}})),
            )
            .await
            .map_err(api_err(format!(
                "writing the gateway configuration into Secret {ns}/{name}"
            )))?;
        tracing::info!(peer, "gateway configuration written");
    }
    Ok(())
}

fn not_on_virtual_nodes() -> serde_json::Value {
    json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": names::NODE_TYPE_LABEL, "operator": "NotIn",
             "values": [names::VIRTUAL_NODE_TYPE]}]}]}}})
}

/// Keeps the node agent (DaemonSet, its ServiceAccount, Role and RoleBinding) and its routes
/// ConfigMap in line with `views`.
pub async fn reconcile_agent(
    ctx: &Ctx,
    settings: &ClusterSettings,
    views: &[PeerView],
) -> Result<(), FabricError> {
    let ns = names::SYSTEM_NAMESPACE;
    let client = &ctx.client;
    let agent_labels = json!({NAME_LABEL: AGENT, names::MANAGED_BY_LABEL: names::MANAGED_BY});
    let routes: BTreeMap<&str, Vec<IpNet>> = views
        .iter()
        .filter_map(|v| {
            let seen = v.nat?.peer_as_seen_locally;
            Some((v.peer.as_str(), vec![seen.pod_cidr, seen.external_cidr]))
        })
        .collect();
    ensure(
        &Api::<ConfigMap>::namespaced(client.clone(), ns),
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": ROUTES_CONFIG_MAP, "namespace": ns, "labels": agent_labels},
               "data": {ROUTES_KEY: serde_json::to_string(&routes).expect("routes serialize")}}),
    )
    .await
    .map_err(api_err(format!("ConfigMap {ns}/{ROUTES_CONFIG_MAP}")))?;
    ensure(
        &Api::<ServiceAccount>::namespaced(client.clone(), ns),
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": AGENT, "namespace": ns, "labels": agent_labels}}),
    )
    .await
    .map_err(api_err(format!("ServiceAccount {ns}/{AGENT}")))?;
    ensure(
        &Api::<Role>::namespaced(client.clone(), ns),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": AGENT, "namespace": ns, "labels": agent_labels},
        "rules": [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"],
             "resourceNames": [ROUTES_CONFIG_MAP]},
            // Where the gateways run.
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        ]}),
    )
    .await
    .map_err(api_err(format!("Role {ns}/{AGENT}")))?;
    ensure(
        &Api::<RoleBinding>::namespaced(client.clone(), ns),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": AGENT, "namespace": ns, "labels": agent_labels},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": AGENT},
               "subjects": [{"kind": "ServiceAccount", "name": AGENT, "namespace": ns}]}),
    )
    .await
    .map_err(api_err(format!("RoleBinding {ns}/{AGENT}")))?;
    ensure(
        &Api::<DaemonSet>::namespaced(client.clone(), ns),
        json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": AGENT, "namespace": ns, "labels": agent_labels},
        "spec": {
            "selector": {"matchLabels": {NAME_LABEL: AGENT}},
            "template": {
                "metadata": {"labels": agent_labels},
                "spec": {
                    "serviceAccountName": AGENT,
                    "priorityClassName": tandem_api::names::PRIORITY_CLASS,
                    "hostNetwork": true,
                    "dnsPolicy": "ClusterFirstWithHostNet",
                    "affinity": not_on_virtual_nodes(),
                    "tolerations": [{"operator": "Exists"}],
                    "securityContext": {"runAsNonRoot": true, "runAsUser": 65532,
                                        "runAsGroup": 65532},
                    "containers": [{
                        "name": "agent", "image": settings.image,
                        "args": ["agent"],
                        // The non-root process gets NET_ADMIN from the file capability on
                        // Tandem's binary (deploy/image/Dockerfile), which no_new_privs
                        // (allowPrivilegeEscalation: false) would void; it can gain nothing
                        // else: every other capability is dropped from its bounding set.
                        "securityContext": {"allowPrivilegeEscalation": true,
                            "readOnlyRootFilesystem": true,
                            "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]}},
                    }],
                },
            },
        }}),
    )
    .await
    .map_err(api_err(format!("DaemonSet {ns}/{AGENT}")))?;
    Ok(())
}

/// Removes `peer`'s gateway objects (the key Secret is removed by the caller).
pub async fn remove(client: &kube::Client, peer: &str) -> Result<(), kube::Error> {
    let ns = names::SYSTEM_NAMESPACE;
    let name = gateway_secret(peer);
    let dp = DeleteParams::background();
    client::delete_if_exists(
        &Api::<Deployment>::namespaced(client.clone(), ns),
        &name,
        &dp,
    )
    .await?;
    client::delete_if_exists(&Api::<Service>::namespaced(client.clone(), ns), &name, &dp).await?;
    client::delete_if_exists(
        &Api::<RoleBinding>::namespaced(client.clone(), ns),
        &name,
        &dp,
    )
    .await?;
    client::delete_if_exists(&Api::<Role>::namespaced(client.clone(), ns), &name, &dp).await?;
    client::delete_if_exists(
        &Api::<ServiceAccount>::namespaced(client.clone(), ns),
        &name,
        &dp,
    )
    .await
}

/// Removes the node agent and its routes ConfigMap (no peer left).
pub async fn remove_agent(client: &kube::Client) -> Result<(), kube::Error> {
    let ns = names::SYSTEM_NAMESPACE;
    let dp = DeleteParams::background();
    client::delete_if_exists(
        &Api::<DaemonSet>::namespaced(client.clone(), ns),
        AGENT,
        &dp,
    )
    .await?;
    client::delete_if_exists(
        &Api::<ConfigMap>::namespaced(client.clone(), ns),
        ROUTES_CONFIG_MAP,
        &dp,
    )
    .await?;
    client::delete_if_exists(
        &Api::<RoleBinding>::namespaced(client.clone(), ns),
        AGENT,
        &dp,
    )
    .await?;
    client::delete_if_exists(&Api::<Role>::namespaced(client.clone(), ns), AGENT, &dp).await?;
    client::delete_if_exists(
        &Api::<ServiceAccount>::namespaced(client.clone(), ns),
        AGENT,
        &dp,
    )
    .await
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
    if !settings.network_fabric {
        return Ok(());
    }
    let views = views(ctx, &settings)
        .await
        .map_err(api_err("reading peerings and their network parameters"))?;
    // A gateway whose peer is gone (an unpeer that raced this sweep) is removed.
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), names::SYSTEM_NAMESPACE);
    for d in deployments
        .list(&ListParams::default().labels(&format!("{NAME_LABEL}={GATEWAY_APP}")))
        .await
        .map_err(api_err("listing gateway Deployments"))?
    {
        let peer = d
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(names::REMOTE_CLUSTER_LABEL))
            .cloned()
            .unwrap_or_default();
        if !views.iter().any(|v| v.peer == peer) {
            forget_peer(&ctx.client, &peer)
                .await
                .map_err(api_err(format!("removing the gateway to {peer}")))?;
        }
    }
    if views.is_empty() {
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
        &Api::<Secret>::namespaced(client.clone(), names::SYSTEM_NAMESPACE),
        &gateway_secret(peer),
        &DeleteParams::default(),
    )
    .await?;
    if !super::keys::live_relation(client, None).await? {
        remove_agent(client).await?;
    }
    Ok(())
}
