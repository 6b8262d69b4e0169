//! Fixture builders for the tests of the plan and of the least-exposure rule: this cluster's
//! settings, its view of a peer, and the objects a pass lists (Tenants' network parameters,
//! Peerings, pods, offloadings, exported slices, gateway Services and Deployments).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    LoadBalancerIngress, LoadBalancerStatus, Pod, PodStatus, Service, ServicePort, ServiceSpec,
    ServiceStatus,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::core::ObjectMeta;
use tandem_api::offloading::{NamespaceOffloadingStatus, RemoteNamespaceStatus};
use tandem_api::peering::PeeringNetwork;
use tandem_api::{
    NamespaceOffloading, NetworkParameters, NetworkParametersStatus, Peering, PeeringStatus,
    Tenant, names,
};
use tandem_core::nat::{ClusterPrefixes, NatPlanInput};

use super::plan::{PeerView, TenantNetwork};
use crate::settings::{ClusterSettings, NetworkExposure};

/// This cluster's pod and external CIDRs.
pub(super) const POD_CIDR: &str = "10.244.0.0/16";
pub(super) const EXTERNAL_CIDR: &str = "10.70.0.0/16";
/// How the peer names this cluster's prefixes, and how this cluster names the peer's (the
/// peer's own pod CIDR is this cluster's too: both are remapped).
pub(super) const LOCAL_AS_SEEN_BY_PEER: (&str, &str) = ("10.0.0.0/16", "10.1.0.0/16");
pub(super) const PEER_AS_SEEN_LOCALLY: (&str, &str) = ("10.2.0.0/16", "10.3.0.0/16");
/// The public key the peer's gateway publishes.
pub(super) const PEER_KEY: &str = "cGVlci1rZXktb2YtdGhlLXBlZXJzLWdhdGV3YXkuLi4=";
/// The image the cluster runs.
pub(super) const IMAGE: &str = "ghcr.io/tandem-dev/tandem:test";

/// This cluster's settings, the fabric on.
pub(super) fn settings() -> ClusterSettings {
    ClusterSettings {
        pod_cidr: POD_CIDR.into(),
        external_cidr: EXTERNAL_CIDR.into(),
        share_percent: 50,
        network_fabric: true,
        hollow_cluster: false,
        image: IMAGE.into(),
        image_pull_secrets: Vec::new(),
        network_exposure: NetworkExposure::Peering,
        gateway_service_type: Default::default(),
    }
}

pub(super) fn prefixes((pod, external): (&str, &str)) -> ClusterPrefixes {
    ClusterPrefixes {
        pod_cidr: pod.parse().unwrap(),
        external_cidr: external.parse().unwrap(),
    }
}

/// The NAT of a negotiated relation.
pub(super) fn negotiated_nat() -> NatPlanInput {
    NatPlanInput {
        local: prefixes((POD_CIDR, EXTERNAL_CIDR)),
        local_as_seen_by_peer: prefixes(LOCAL_AS_SEEN_BY_PEER),
        peer_as_seen_locally: prefixes(PEER_AS_SEEN_LOCALLY),
    }
}

fn deleted() -> Option<Time> {
    Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH))
}

/// This cluster's view of a peer, built up by the cases: no role, nothing known.
pub(super) struct ViewFixture(pub(super) PeerView);

impl ViewFixture {
    pub(super) fn new(peer: &str) -> Self {
        ViewFixture(PeerView {
            peer: peer.into(),
            peer_public_key: None,
            peer_endpoint: None,
            nat: None,
            consumer_of: false,
            provider_for: false,
        })
    }
    /// This cluster offloads to the peer.
    pub(super) fn consumer(mut self) -> Self {
        self.0.consumer_of = true;
        self
    }
    /// The peer offloads to this cluster.
    pub(super) fn provider(mut self) -> Self {
        self.0.provider_for = true;
        self
    }
    /// The peer published its gateway's key.
    pub(super) fn keyed(mut self) -> Self {
        self.0.peer_public_key = Some(PEER_KEY.into());
        self
    }
    pub(super) fn endpoint(mut self, endpoint: &str) -> Self {
        self.0.peer_endpoint = Some(endpoint.into());
        self
    }
    /// Both sides' prefixes and remaps are known.
    pub(super) fn negotiated(mut self) -> Self {
        self.0.nat = Some(negotiated_nat());
        self
    }
}

/// What the provider side reads for a Tenant of `peer`: nothing remapped yet.
pub(super) struct TenantFixture(pub(super) TenantNetwork);

impl TenantFixture {
    pub(super) fn new(peer: &str) -> Self {
        TenantFixture(TenantNetwork {
            peer: peer.into(),
            theirs: None,
            ours: None,
        })
    }
    /// Both sides remapped the other's prefixes, and the consumer published its key.
    pub(super) fn negotiated(mut self) -> Self {
        let params = |(pod, external): (&str, &str), key: Option<&str>| {
            let mut p = NetworkParameters::new("p", Default::default());
            p.spec.public_key = key.map(str::to_string);
            p.spec.gateway_endpoint = key.map(|_| "192.0.2.9:51820".to_string());
            p.status = Some(NetworkParametersStatus {
                remapped_pod_cidr: Some(pod.into()),
                remapped_external_cidr: Some(external.into()),
                ..Default::default()
            });
            p
        };
        self.0.theirs = Some(params(PEER_AS_SEEN_LOCALLY, Some(PEER_KEY)));
        self.0.ours = Some(params(LOCAL_AS_SEEN_BY_PEER, None));
        self
    }
}

/// A Tenant of `peer`.
pub(super) fn tenant(peer: &str, deleting: bool) -> Tenant {
    let mut t = Tenant::new(peer, Default::default());
    t.spec.cluster_id = peer.into();
    if deleting {
        t.metadata.deletion_timestamp = deleted();
    }
    t
}

/// This cluster's Peering with `peer`: authenticated, no network negotiated yet.
pub(super) struct PeeringFixture(pub(super) Peering);

impl PeeringFixture {
    pub(super) fn new(peer: &str) -> Self {
        let mut p = Peering::new(peer, Default::default());
        p.spec.cluster_id = peer.into();
        PeeringFixture(p)
    }
    /// The network is negotiated; the peer's gateway key is `key`.
    pub(super) fn negotiated(mut self, key: &str) -> Self {
        let (remote_pod, remote_external) = PEER_AS_SEEN_LOCALLY;
        let (local_pod, local_external) = LOCAL_AS_SEEN_BY_PEER;
        self.0
            .status
            .get_or_insert_with(PeeringStatus::default)
            .network = Some(PeeringNetwork {
            remote_pod_cidr: POD_CIDR.into(),
            remapped_remote_pod_cidr: remote_pod.into(),
            remote_external_cidr: Some(EXTERNAL_CIDR.into()),
            remapped_remote_external_cidr: Some(remote_external.into()),
            local_pod_cidr_in_remote: Some(local_pod.into()),
            local_external_cidr_in_remote: Some(local_external.into()),
            remote_gateway_endpoint: Some("gw.example:51820".into()),
            remote_public_key: Some(key.into()),
        });
        self
    }
    /// The peer has not remapped this cluster's prefixes yet.
    pub(super) fn not_remapped_by_peer(mut self) -> Self {
        if let Some(n) = self.0.status.as_mut().and_then(|s| s.network.as_mut()) {
            n.local_pod_cidr_in_remote = None;
        }
        self
    }
    pub(super) fn deleting(mut self) -> Self {
        self.0.metadata.deletion_timestamp = deleted();
        self
    }
}

/// A pod of this cluster, with no status yet.
pub(super) struct PodFixture(pub(super) Pod);

impl PodFixture {
    pub(super) fn new(ns: &str, name: &str) -> Self {
        PodFixture(Pod {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        })
    }
    /// Labelled as coming from `peer` (as offloaded pods are).
    pub(super) fn origin(mut self, peer: &str) -> Self {
        self.0.metadata.labels = Some(BTreeMap::from([(
            names::ORIGIN_CLUSTER_LABEL.to_string(),
            peer.to_string(),
        )]));
        self
    }
    pub(super) fn ip(mut self, ip: &str) -> Self {
        self.0.status.get_or_insert_with(PodStatus::default).pod_ip = Some(ip.into());
        self
    }
    pub(super) fn running_on(mut self, host_ip: &str) -> Self {
        let status = self.0.status.get_or_insert_with(PodStatus::default);
        status.phase = Some("Running".into());
        status.host_ip = Some(host_ip.into());
        self
    }
    pub(super) fn phase(mut self, phase: &str) -> Self {
        self.0.status.get_or_insert_with(PodStatus::default).phase = Some(phase.into());
        self
    }
    pub(super) fn deleting(mut self) -> Self {
        self.0.metadata.deletion_timestamp = deleted();
        self
    }
}

/// The offloading of namespace `ns`, with no twin namespace yet.
pub(super) struct OffloadingFixture(pub(super) NamespaceOffloading);

impl OffloadingFixture {
    pub(super) fn new(ns: &str) -> Self {
        let mut o = NamespaceOffloading::new("offloading", Default::default());
        o.metadata.namespace = Some(ns.into());
        OffloadingFixture(o)
    }
    /// Its twin namespace on `provider` is in `phase`.
    pub(super) fn twin_on(mut self, provider: &str, phase: &str) -> Self {
        let ns = self.0.metadata.namespace.clone().unwrap_or_default();
        self.0
            .status
            .get_or_insert_with(NamespaceOffloadingStatus::default)
            .remote_namespaces
            .push(RemoteNamespaceStatus {
                cluster_id: provider.into(),
                namespace: format!("{ns}-rome"),
                phase: phase.into(),
                message: None,
            });
        self
    }
}

/// The EndpointSlice Kubernetes derives for exported Service `ns/service`, with `addresses`.
pub(super) fn exported_slice(ns: &str, service: &str, addresses: &[&str]) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            namespace: Some(ns.into()),
            name: Some(format!("{service}-abcde")),
            ..Default::default()
        },
        address_type: "IPv4".into(),
        endpoints: addresses
            .iter()
            .map(|a| Endpoint {
                addresses: vec![a.to_string()],
                ..Default::default()
            })
            .collect(),
        ports: None,
    }
}

/// The gateway Service of `peer` on UDP `port` (None: no ports), without an ingress yet.
pub(super) struct ServiceFixture(pub(super) Service);

impl ServiceFixture {
    pub(super) fn gateway(peer: &str, port: Option<i32>) -> Self {
        ServiceFixture(Service {
            metadata: ObjectMeta {
                namespace: Some(names::SYSTEM_NAMESPACE.into()),
                name: Some(names::gateway_secret(peer)),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                ports: port.map(|port| {
                    vec![ServicePort {
                        port,
                        protocol: Some("UDP".into()),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
            ..Default::default()
        })
    }
    /// Its load balancer's ingress is `ip`.
    pub(super) fn ingress(self, ip: &str) -> Self {
        self.ingress_of(LoadBalancerIngress {
            ip: Some(ip.into()),
            ..Default::default()
        })
    }
    /// Its load balancer's ingress is the host name `name` (as on EKS).
    pub(super) fn ingress_hostname(self, name: &str) -> Self {
        self.ingress_of(LoadBalancerIngress {
            hostname: Some(name.into()),
            ..Default::default()
        })
    }
    fn ingress_of(mut self, ingress: LoadBalancerIngress) -> Self {
        self.0.status = Some(ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(vec![ingress]),
            }),
            ..Default::default()
        });
        self
    }
    /// Its port's node port is `port`.
    pub(super) fn node_port(mut self, port: i32) -> Self {
        if let Some(p) = self.0.spec.as_mut().and_then(|s| s.ports.as_mut()) {
            p[0].node_port = Some(port);
        }
        self
    }
}

/// A gateway Deployment labelled with its peer (None: unlabelled).
pub(super) fn gateway_deployment(peer: Option<&str>) -> Deployment {
    Deployment {
        metadata: ObjectMeta {
            name: Some(names::gateway_secret(peer.unwrap_or("unknown"))),
            labels: peer.map(|p| {
                BTreeMap::from([(names::REMOTE_CLUSTER_LABEL.to_string(), p.to_string())])
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}
