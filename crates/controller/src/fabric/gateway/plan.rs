//! The gateway reconciler's decisions, pure: which peers get a gateway ([`views`]), the objects
//! that run it and the node agent ([`gateway_objects`], [`agent_objects`]), its port and its
//! configuration, and each write as a [`Step`] or the reason it is left undone ([`Skip`]).
//! The parent module lists the objects and sends what these functions decide.

use std::collections::BTreeMap;

use ipnet::IpNet;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use serde_json::json;
use tandem_api::names::{self, gateway_secret};
use tandem_api::{NetworkParameters, Peering, Tenant};
use tandem_core::nat::{ClusterPrefixes, NatPlanInput};

use crate::settings::{AUTO_LOAD_BALANCER_WAIT, ClusterSettings, GatewayServiceType};

pub use tandem_api::names::{AGENT, GATEWAY_APP, ROUTES_CONFIG_MAP, ROUTES_KEY};
/// The first gateway port.
pub const PORT_BASE: u16 = 51820;
/// The label naming what a gateway or agent object is part of.
pub const NAME_LABEL: &str = "app.kubernetes.io/name";
/// Annotation holding the hash of what Tandem last applied, so an unchanged object is not
/// written again on every sweep.
pub const APPLIED_HASH: &str = "tandem.dev/applied-hash";

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

/// Why a relation gets no view (so no gateway) this pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unseen {
    /// Its Tenant or Peering is being deleted: unpeering removes the gateway.
    Deleting,
    /// The Peering has not negotiated its network yet.
    NotNegotiated,
}

/// What the provider side reads for one Tenant: the consumer's `NetworkParameters` and this
/// side's, in the Tenant's namespace.
#[derive(Clone, Debug, Default)]
pub struct TenantNetwork {
    /// The consumer's cluster ID.
    pub peer: String,
    /// The consumer's parameters (its key, endpoint, and how this side remaps its prefixes).
    pub theirs: Option<NetworkParameters>,
    /// This side's parameters (how the consumer remaps this side's prefixes).
    pub ours: Option<NetworkParameters>,
}

/// The peer of `tenant`, unless it is being deleted (its parameters are then not read).
pub fn tenant_peer(tenant: &Tenant) -> Result<String, Unseen> {
    if tenant.metadata.deletion_timestamp.is_some() {
        return Err(Unseen::Deleting);
    }
    Ok(tenant.spec.cluster_id.clone())
}

fn prefixes(pod: Option<&str>, external: Option<&str>) -> Option<ClusterPrefixes> {
    Some(ClusterPrefixes {
        pod_cidr: pod?.parse().ok()?,
        external_cidr: external?.parse().ok()?,
    })
}

fn remapped(params: Option<&NetworkParameters>) -> Option<ClusterPrefixes> {
    let s = params?.status.as_ref()?;
    prefixes(
        s.remapped_pod_cidr.as_deref(),
        s.remapped_external_cidr.as_deref(),
    )
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

fn local_prefixes(settings: &ClusterSettings) -> Option<ClusterPrefixes> {
    prefixes(Some(&settings.pod_cidr), Some(&settings.external_cidr))
}

/// The provider-side view of the relation with `tenant`'s consumer.
pub fn provider_view(settings: &ClusterSettings, tenant: &TenantNetwork) -> PeerView {
    let theirs = tenant.theirs.as_ref();
    PeerView {
        peer: tenant.peer.clone(),
        peer_public_key: theirs.and_then(|t| t.spec.public_key.clone()),
        peer_endpoint: theirs.and_then(|t| t.spec.gateway_endpoint.clone()),
        nat: nat(
            local_prefixes(settings),
            remapped(tenant.ours.as_ref()),
            remapped(theirs),
        ),
        consumer_of: false,
        provider_for: true,
    }
}

/// The consumer-side view of the relation `peering` describes (`provider_for`: this cluster
/// is also the peer's provider).
pub fn consumer_view(
    settings: &ClusterSettings,
    peering: &Peering,
    provider_for: bool,
) -> Result<PeerView, Unseen> {
    if peering.metadata.deletion_timestamp.is_some() {
        return Err(Unseen::Deleting);
    }
    let n = peering
        .status
        .as_ref()
        .and_then(|s| s.network.clone())
        .ok_or(Unseen::NotNegotiated)?;
    Ok(PeerView {
        consumer_of: true,
        provider_for,
        peer: peering.spec.cluster_id.clone(),
        peer_public_key: n.remote_public_key.clone(),
        peer_endpoint: n.remote_gateway_endpoint.clone(),
        nat: nat(
            local_prefixes(settings),
            prefixes(
                n.local_pod_cidr_in_remote.as_deref(),
                n.local_external_cidr_in_remote.as_deref(),
            ),
            prefixes(
                Some(&n.remapped_remote_pod_cidr),
                n.remapped_remote_external_cidr.as_deref(),
            ),
        ),
    })
}

/// The view of every peer, by cluster ID: provider-side relations from the `tenants`' network
/// parameters, consumer-side ones from the `peerings`' negotiated network. A cluster peered
/// both ways is seen through its Peering (one tunnel per pair of clusters).
pub fn views(
    settings: &ClusterSettings,
    tenants: &[TenantNetwork],
    peerings: &[Peering],
) -> Vec<PeerView> {
    let mut out: BTreeMap<String, PeerView> = tenants
        .iter()
        .map(|t| (t.peer.clone(), provider_view(settings, t)))
        .collect();
    for peering in peerings {
        let provider_for = out
            .get(&peering.spec.cluster_id)
            .is_some_and(|v| v.provider_for);
        if let Ok(view) = consumer_view(settings, peering, provider_for) {
            out.insert(view.peer.clone(), view);
        }
    }
    out.into_values().collect()
}

/// The kind of an object the gateway reconciler writes (all in `tandem-system`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    ServiceAccount,
    Role,
    RoleBinding,
    Service,
    Deployment,
    ConfigMap,
    DaemonSet,
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

/// An object Tandem keeps applied: its kind, name and the whole of what Tandem sets of it.
#[derive(Clone, Debug, PartialEq)]
pub struct Manifest {
    pub kind: Kind,
    pub name: String,
    pub body: serde_json::Value,
}

/// A write the gateway reconciler makes.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Apply the object (server-side, forced), stamped with the hash of what is applied.
    Apply(Manifest),
    /// Write the gateway's configuration (`gateway.json`) into its Secret `secret`.
    WriteConfig { secret: String, config: Vec<u8> },
    /// Delete the object if it exists (dependents in the background).
    Delete { kind: Kind, name: String },
}

/// Why a pass leaves something as it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    /// The cluster's `networkFabric` setting is off: no gateway, no node agent.
    FabricOff,
    /// No peer is in view: nothing to run a gateway or a node agent for.
    NoPeer,
    /// What Tandem last applied to the object is what it would apply now.
    Unchanged,
    /// The gateway's Secret holds this configuration already.
    ConfigCurrent,
    /// The peer has not published its gateway's public key yet.
    NoPeerKey,
    /// Both sides' prefixes and remaps are not negotiated yet.
    NoNat,
}

/// Whether the sweep runs at all.
pub fn fabric_on(settings: &ClusterSettings) -> Result<(), Skip> {
    match settings.fabric_off() {
        None => Ok(()),
        Some(_) => Err(Skip::FabricOff),
    }
}

/// Whether the sweep sets up gateways and the node agent for `views`.
pub fn any_peer(views: &[PeerView]) -> Result<(), Skip> {
    if views.is_empty() {
        Err(Skip::NoPeer)
    } else {
        Ok(())
    }
}

fn labels(peer: &str) -> serde_json::Value {
    json!({NAME_LABEL: GATEWAY_APP, names::MANAGED_BY_LABEL: names::MANAGED_BY,
           names::REMOTE_CLUSTER_LABEL: peer})
}

fn not_on_virtual_nodes() -> serde_json::Value {
    json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": names::NODE_TYPE_LABEL, "operator": "NotIn",
             "values": [names::VIRTUAL_NODE_TYPE]}]}]}}})
}

fn manifest(kind: Kind, name: &str, body: serde_json::Value) -> Manifest {
    Manifest {
        kind,
        name: name.to_string(),
        body,
    }
}

/// The objects of `peer`'s gateway, in the order they are applied, all named
/// `tandem-gateway-<peer>`: a ServiceAccount whose Role may only `get` the gateway's own
/// Secret, a Service on its UDP `port` (LoadBalancer, or NodePort as `exposed` says), and a
/// Deployment of one pod of `image` on the node network.
pub fn gateway_objects(
    peer: &str,
    port: u16,
    image: &str,
    exposed: GatewayServiceType,
) -> Vec<Manifest> {
    let name = gateway_secret(peer);
    let ns = names::SYSTEM_NAMESPACE;
    let selector = json!({NAME_LABEL: GATEWAY_APP, names::REMOTE_CLUSTER_LABEL: peer});
    let mut service = json!({"type": "LoadBalancer", "selector": selector,
        "ports": [{"name": "wireguard", "port": port, "targetPort": port, "protocol": "UDP"}]});
    if exposed == GatewayServiceType::NodePort {
        // kube-proxy keeps the peer's address (no SNAT to another node's): WireGuard learns
        // its peer's endpoint from it.
        service["type"] = json!("NodePort");
        service["externalTrafficPolicy"] = json!("Local");
    }
    vec![
        manifest(
            Kind::ServiceAccount,
            &name,
            json!({"apiVersion": "v1", "kind": "ServiceAccount",
                   "metadata": {"name": name, "namespace": ns, "labels": labels(peer)}}),
        ),
        manifest(
            Kind::Role,
            &name,
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                   "metadata": {"name": name, "namespace": ns, "labels": labels(peer)},
                   "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"],
                              "resourceNames": [name]}]}),
        ),
        manifest(
            Kind::RoleBinding,
            &name,
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                   "metadata": {"name": name, "namespace": ns, "labels": labels(peer)},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                               "name": name},
                   "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]}),
        ),
        manifest(
            Kind::Service,
            &name,
            json!({"apiVersion": "v1", "kind": "Service",
                   "metadata": {"name": name, "namespace": ns, "labels": labels(peer)},
                   "spec": service}),
        ),
        manifest(
            Kind::Deployment,
            &name,
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
                        // The tunnel's TUN device: the node's, as no container runtime
                        // creates /dev/net/tun in a container (runc only allows it); kubelet
                        // checks that the node has it before the container starts.
                        "volumes": [{"name": "dev-net-tun",
                                     "hostPath": {"path": "/dev/net/tun", "type": "CharDevice"}}],
                        "containers": [{
                            "name": "gateway", "image": image,
                            "args": ["gateway", "--peer", peer],
                            "ports": [{"name": "wireguard", "containerPort": port,
                                       "protocol": "UDP"}],
                            "volumeMounts": [{"name": "dev-net-tun", "mountPath": "/dev/net/tun"}],
                            // The non-root process gets NET_ADMIN from the file capability
                            // on Tandem's binary (deploy/image/Dockerfile), which
                            // no_new_privs (allowPrivilegeEscalation: false) would void; it
                            // can gain nothing else: every other capability is dropped from
                            // its bounding set.
                            "securityContext": {"allowPrivilegeEscalation": true,
                                "readOnlyRootFilesystem": true,
                                "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]}},
                        }],
                    },
                },
            }}),
        ),
    ]
}

/// The prefixes the node agent routes to each peer's gateway, as this cluster names them
/// (peers whose NAT is not negotiated yet have none).
pub fn routes(views: &[PeerView]) -> BTreeMap<&str, Vec<IpNet>> {
    views
        .iter()
        .filter_map(|v| {
            let seen = v.nat?.peer_as_seen_locally;
            Some((v.peer.as_str(), vec![seen.pod_cidr, seen.external_cidr]))
        })
        .collect()
}

/// `manifests` with `secrets` as the image pull secrets of every pod template among them (the
/// settings' `imagePullSecrets`: Tandem's image from a private registry).
pub fn with_pull_secrets(mut manifests: Vec<Manifest>, secrets: &[String]) -> Vec<Manifest> {
    if secrets.is_empty() {
        return manifests;
    }
    let refs: Vec<serde_json::Value> = secrets.iter().map(|s| json!({"name": s})).collect();
    for m in &mut manifests {
        if let Some(spec) = m.body.pointer_mut("/spec/template/spec") {
            spec["imagePullSecrets"] = json!(refs);
        }
    }
    manifests
}

/// The node agent's objects for `views`, in the order they are applied: its routes
/// ConfigMap, a ServiceAccount, Role and RoleBinding, and a DaemonSet of `image` on every
/// real node.
pub fn agent_objects(views: &[PeerView], image: &str) -> Vec<Manifest> {
    let ns = names::SYSTEM_NAMESPACE;
    let agent_labels = json!({NAME_LABEL: AGENT, names::MANAGED_BY_LABEL: names::MANAGED_BY});
    vec![
        manifest(
            Kind::ConfigMap,
            ROUTES_CONFIG_MAP,
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": ROUTES_CONFIG_MAP, "namespace": ns,
                                "labels": agent_labels},
                   "data": {ROUTES_KEY: serde_json::to_string(&routes(views))
                                .expect("routes serialize")}}),
        ),
        manifest(
            Kind::ServiceAccount,
            AGENT,
            json!({"apiVersion": "v1", "kind": "ServiceAccount",
                   "metadata": {"name": AGENT, "namespace": ns, "labels": agent_labels}}),
        ),
        manifest(
            Kind::Role,
            AGENT,
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": AGENT, "namespace": ns, "labels": agent_labels},
            "rules": [
                {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"],
                 "resourceNames": [ROUTES_CONFIG_MAP]},
                // Where the gateways run.
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
            ]}),
        ),
        manifest(
            Kind::RoleBinding,
            AGENT,
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                   "metadata": {"name": AGENT, "namespace": ns, "labels": agent_labels},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                               "name": AGENT},
                   "subjects": [{"kind": "ServiceAccount", "name": AGENT, "namespace": ns}]}),
        ),
        manifest(
            Kind::DaemonSet,
            AGENT,
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
                            "name": "agent", "image": image,
                            "args": ["agent"],
                            // The non-root process gets NET_ADMIN from the file capability
                            // on Tandem's binary (deploy/image/Dockerfile), which
                            // no_new_privs (allowPrivilegeEscalation: false) would void; it
                            // can gain nothing else: every other capability is dropped from
                            // its bounding set.
                            "securityContext": {"allowPrivilegeEscalation": true,
                                "readOnlyRootFilesystem": true,
                                "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]}},
                        }],
                    },
                },
            }}),
        ),
    ]
}

/// The hash of what Tandem applies of an object.
pub fn applied_hash(body: &serde_json::Value) -> String {
    use sha2::Digest as _;
    format!("{:x}", sha2::Sha256::digest(body.to_string().as_bytes()))
}

/// Applying `manifest`, stamped with its hash, unless the object's `applied` hash (None: no
/// object, or none stamped) says Tandem applied the same already.
pub fn apply(manifest: &Manifest, applied: Option<&str>) -> Result<Step, Skip> {
    let hash = applied_hash(&manifest.body);
    if applied == Some(hash.as_str()) {
        return Err(Skip::Unchanged);
    }
    let mut stamped = manifest.clone();
    stamped.body["metadata"]["annotations"][APPLIED_HASH] = json!(hash);
    Ok(Step::Apply(stamped))
}

/// The gateway configuration for `view` (refused until the peer's key and the NAT are known).
pub fn gateway_args(
    view: &PeerView,
    private_key: &str,
    port: u16,
    allowed: Vec<IpNet>,
) -> Result<tandem_netspec::GatewayArgs, Skip> {
    let peer_public_key = view.peer_public_key.clone().ok_or(Skip::NoPeerKey)?;
    let nat = view.nat.ok_or(Skip::NoNat)?;
    Ok(tandem_netspec::GatewayArgs {
        interface: interface(&view.peer),
        listen: std::net::SocketAddr::from(([0, 0, 0, 0], port)),
        private_key: private_key.to_string(),
        peer_public_key,
        // A host name is resolved before (`reconcile`); one that does not resolve is not used:
        // the peer then contacts this side, and roaming learns its address.
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

/// Writing `args` into `peer`'s gateway Secret, unless it holds them already (`stored`).
pub fn write_config(
    peer: &str,
    args: &tandem_netspec::GatewayArgs,
    stored: Option<&[u8]>,
) -> Result<Step, Skip> {
    let config = serde_json::to_vec(args).expect("gateway args serialize");
    if stored == Some(config.as_slice()) {
        return Err(Skip::ConfigCurrent);
    }
    Ok(Step::WriteConfig {
        secret: gateway_secret(peer),
        config,
    })
}

fn delete(kind: Kind, name: &str) -> Step {
    Step::Delete {
        kind,
        name: name.to_string(),
    }
}

/// Removing `peer`'s gateway objects, its pod first (the key Secret is not among them).
pub fn removal(peer: &str) -> Vec<Step> {
    let name = gateway_secret(peer);
    [
        Kind::Deployment,
        Kind::Service,
        Kind::RoleBinding,
        Kind::Role,
        Kind::ServiceAccount,
    ]
    .into_iter()
    .map(|kind| delete(kind, &name))
    .collect()
}

/// Removing the node agent and its routes ConfigMap, its pods first.
pub fn agent_removal() -> Vec<Step> {
    vec![
        delete(Kind::DaemonSet, AGENT),
        delete(Kind::ConfigMap, ROUTES_CONFIG_MAP),
        delete(Kind::RoleBinding, AGENT),
        delete(Kind::Role, AGENT),
        delete(Kind::ServiceAccount, AGENT),
    ]
}

/// The peers of the gateway `deployments` that no view has (an unpeer that raced the sweep):
/// their gateways are forgotten.
pub fn orphans(deployments: &[Deployment], views: &[PeerView]) -> Vec<String> {
    deployments
        .iter()
        .map(|d| {
            d.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(names::REMOTE_CLUSTER_LABEL))
                .cloned()
                .unwrap_or_default()
        })
        .filter(|peer| !views.iter().any(|v| &v.peer == peer))
        .collect()
}

fn service_port(s: &Service) -> Option<u16> {
    u16::try_from(s.spec.as_ref()?.ports.as_ref()?.first()?.port).ok()
}

/// The port of `peer`'s gateway among the gateway `services`: its Service's, else the lowest
/// from [`PORT_BASE`] no other gateway uses (None: none is free).
pub fn port(peer: &str, services: &[Service]) -> Option<u16> {
    let name = gateway_secret(peer);
    if let Some(p) = services
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some(&name))
        .and_then(service_port)
    {
        return Some(p);
    }
    let used: Vec<u16> = services.iter().filter_map(service_port).collect();
    (PORT_BASE..=u16::MAX).find(|p| !used.contains(p))
}

/// Where peers reach a gateway, or why they cannot yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Exposure {
    /// `endpoint` (`host:port`), and how it was chosen.
    At { endpoint: String, how: String },
    /// Not reachable yet: why, and what to do.
    Pending(String),
}

impl Exposure {
    /// The endpoint, if there is one.
    pub fn endpoint(&self) -> Option<&str> {
        match self {
            Exposure::At { endpoint, .. } => Some(endpoint),
            Exposure::Pending(_) => None,
        }
    }
}

/// Where peers reach the gateway of Service `svc` (None: not created yet) as `exposed` says;
/// `node_ip` is the address of the node its pod runs on, if one runs; `age` how long the
/// Service has existed.
pub fn exposure(
    svc: Option<&Service>,
    node_ip: Option<&str>,
    exposed: GatewayServiceType,
    age: std::time::Duration,
) -> Exposure {
    let name = svc
        .and_then(|s| s.metadata.name.clone())
        .unwrap_or_default();
    let service = format!("Service {}/{name}", names::SYSTEM_NAMESPACE);
    let Some(svc) = svc else {
        return Exposure::Pending("the gateway's Service does not exist yet".into());
    };
    let first = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref()?.first().cloned());
    let (port, node_port) = (
        first.as_ref().map(|p| p.port),
        first.and_then(|p| p.node_port),
    );
    let ingress = svc.status.as_ref().and_then(|s| {
        let first = s.load_balancer.as_ref()?.ingress.as_ref()?.first()?;
        first.ip.clone().or_else(|| first.hostname.clone())
    });
    let at = |host: &str, port: i32, how: String| Exposure::At {
        endpoint: format!("{host}:{port}"),
        how,
    };
    let Some(port) = port else {
        return Exposure::Pending(format!("{service} has no port"));
    };
    if exposed != GatewayServiceType::NodePort
        && let Some(ingress) = &ingress
    {
        return at(ingress, port, format!("the load balancer of {service}"));
    }
    let no_pod = "no pod of the gateway runs yet, so its node's address is not known";
    match exposed {
        GatewayServiceType::LoadBalancer => Exposure::Pending(format!(
            "{service} has no load-balancer address yet: kind and bare-metal clusters run no \
             load balancer (reinstall with --gateway-service-type auto or NodePort there)"
        )),
        GatewayServiceType::NodePort => match (node_ip, node_port) {
            (Some(ip), Some(node_port)) => at(
                ip,
                node_port,
                format!("the node port of {service} on the gateway's node"),
            ),
            (None, _) => Exposure::Pending(no_pod.into()),
            (_, None) => Exposure::Pending(format!("{service} has no node port yet")),
        },
        GatewayServiceType::Auto if age < AUTO_LOAD_BALANCER_WAIT => Exposure::Pending(format!(
            "waiting up to {}s for a load balancer to answer {service}",
            AUTO_LOAD_BALANCER_WAIT.as_secs()
        )),
        GatewayServiceType::Auto => match node_ip {
            Some(ip) => at(
                ip,
                port,
                format!(
                    "no load balancer answered {service} within {}s (kind and bare-metal \
                     clusters run none): the gateway's node address, its own port",
                    AUTO_LOAD_BALANCER_WAIT.as_secs()
                ),
            ),
            None => Exposure::Pending(format!(
                "no load balancer answered {service} within {}s, and {no_pod}",
                AUTO_LOAD_BALANCER_WAIT.as_secs()
            )),
        },
    }
}

/// The node IP of the first of a gateway's `pods` that runs and is not being deleted (where
/// its status API answers, on the node network).
pub fn running_host(pods: &[Pod]) -> Option<String> {
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .find_map(|p| {
            let status = p.status.as_ref()?;
            (status.phase.as_deref() == Some("Running")).then_some(())?;
            status.host_ip.clone()
        })
}

#[cfg(test)]
mod tests;
