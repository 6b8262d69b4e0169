//! The tunnel's least-exposure rule, pure: which of this cluster's addresses a peer may open
//! connections to through its gateway, from what the parent module lists for that peer.
//!
//! A consumer reaches its offloaded pods here (the pods of its twin namespaces, which carry
//! its cluster ID as origin); a provider's pods — the offloaded ones — reach the pods of the
//! namespaces offloaded from here (where their Services' endpoints are); and every peer
//! reaches the endpoints of the Services this cluster exports (multi-cluster services).
//! Nothing else: not kube-system, not tandem-system, not another consumer's twins, not a node.

use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use tandem_api::NamespaceOffloading;

use super::plan::PeerView;
use crate::settings::NetworkExposure;

/// What the rule reads of this cluster for one peer; left empty where the exposure or the
/// peer's roles need none of it.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// The peer's twin namespaces here (labelled twin namespaces with the peer as origin).
    pub twin_namespaces: Vec<String>,
    /// The pods labelled with the peer as their origin cluster, in whatever namespace.
    pub origin_pods: Vec<Pod>,
    /// The pods of the namespaces offloaded to the peer (see [`offloaded_to`]).
    pub offloaded_pods: Vec<Pod>,
    /// The EndpointSlices Kubernetes derives from the selectors of the Services this cluster
    /// exports.
    pub exported_slices: Vec<EndpointSlice>,
}

/// Why an address is not a destination the peer may reach.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unreachable {
    /// A pod labelled with the peer as origin outside the peer's twin namespaces: the label
    /// alone is one anyone may put on a pod of their own.
    NotATwin,
    /// The pod has no IP (yet), or none that reads as an address.
    NoAddress,
    /// Not in this cluster's pod CIDR: a pod on a virtual node (its IP is the peer's,
    /// remapped), a hostNetwork pod (a node's IP).
    NotLocal,
}

/// The namespaces offloaded to `peer` among `offloadings` (those with a Ready twin namespace
/// there): another provider's pods never reach what was offloaded elsewhere.
pub fn offloaded_to(peer: &str, offloadings: &[NamespaceOffloading]) -> Vec<String> {
    offloadings
        .iter()
        .filter(|o| tandem_api::offloading::twin_of(o, peer).is_some())
        .filter_map(|o| o.metadata.namespace.clone())
        .collect()
}

fn pod_ip(pod: &Pod) -> Result<IpAddr, Unreachable> {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref()?.parse().ok())
        .ok_or(Unreachable::NoAddress)
}

/// The address of `pod`, labelled with the peer as origin, if it is in one of the peer's
/// `twins` namespaces.
pub fn origin_pod(pod: &Pod, twins: &[String]) -> Result<IpAddr, Unreachable> {
    if !pod
        .metadata
        .namespace
        .as_ref()
        .is_some_and(|n| twins.contains(n))
    {
        return Err(Unreachable::NotATwin);
    }
    pod_ip(pod)
}

/// `address` as a destination, if it is one of this cluster's pods (`pod_cidr`).
pub fn local(address: IpAddr, pod_cidr: Option<IpNet>) -> Result<IpNet, Unreachable> {
    if pod_cidr.is_some_and(|l| l.contains(&address)) {
        Ok(IpNet::from(address))
    } else {
        Err(Unreachable::NotLocal)
    }
}

/// The local addresses `view`'s peer may open connections to, sorted: with the `pod-cidr`
/// exposure the whole `pod_cidr`; otherwise those `seen` for the roles this cluster plays
/// towards the peer and the exported Services, within `pod_cidr`.
pub fn destinations(
    exposure: NetworkExposure,
    pod_cidr: &str,
    view: &PeerView,
    seen: &Observed,
) -> Vec<IpNet> {
    let pod_cidr: Option<IpNet> = pod_cidr.parse().ok();
    if exposure == NetworkExposure::PodCidr {
        return pod_cidr.into_iter().collect();
    }
    // Each list counts only for the role it is read for.
    let origin_pods: &[Pod] = if view.provider_for {
        &seen.origin_pods
    } else {
        &[]
    };
    let offloaded_pods: &[Pod] = if view.consumer_of {
        &seen.offloaded_pods
    } else {
        &[]
    };
    let twins = origin_pods
        .iter()
        .filter_map(|p| origin_pod(p, &seen.twin_namespaces).ok());
    let offloaded = offloaded_pods.iter().filter_map(|p| pod_ip(p).ok());
    let exported = seen
        .exported_slices
        .iter()
        .flat_map(|s| s.endpoints.iter().flat_map(|e| e.addresses.iter()))
        .filter_map(|a| a.parse::<IpAddr>().ok());
    let mut out: Vec<IpNet> = twins
        .chain(offloaded)
        .chain(exported)
        .filter_map(|ip| local(ip, pod_cidr).ok())
        .collect();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;

    const MILAN: &str = "milan";

    fn pod(ns: &str, name: &str, ip: &str) -> Pod {
        PodFixture::new(ns, name).ip(ip).0
    }

    fn nets(ips: &[&str]) -> Vec<IpNet> {
        ips.iter()
            .map(|ip| IpNet::from(ip.parse::<IpAddr>().unwrap()))
            .collect()
    }

    /// What a provider of `milan` lists: its twin namespace `shop-milan` with two of
    /// milan's pods, one pending; a pod anyone labelled as milan's in `default`; and the
    /// system pods nobody offloaded.
    fn as_provider() -> Observed {
        Observed {
            twin_namespaces: vec!["shop-milan".into()],
            origin_pods: vec![
                PodFixture::new("shop-milan", "web")
                    .origin(MILAN)
                    .ip("10.244.1.5")
                    .0,
                PodFixture::new("shop-milan", "db").origin(MILAN).0,
                PodFixture::new("default", "spoof")
                    .origin(MILAN)
                    .ip("10.244.9.9")
                    .0,
            ],
            ..Default::default()
        }
    }

    /// What a consumer of `milan` lists: the pods of `shop`, offloaded to milan — one here,
    /// one on the virtual node (its IP is milan's, as this cluster names it), one on the node
    /// network.
    fn as_consumer() -> Observed {
        Observed {
            offloaded_pods: vec![
                pod("shop", "frontend", "10.244.2.7"),
                pod("shop", "web-offloaded", "10.2.1.5"),
                pod("shop", "node-exporter", "192.168.1.10"),
            ],
            ..Default::default()
        }
    }

    /// (case, exposure, view of the peer, what was listed, the destinations wanted).
    type Case<'a> = (
        &'a str,
        NetworkExposure,
        &'a PeerView,
        Observed,
        Vec<&'a str>,
    );

    #[test]
    fn destinations_table() {
        let provider = ViewFixture::new(MILAN).provider().negotiated().0;
        let consumer = ViewFixture::new(MILAN).consumer().negotiated().0;
        let both = ViewFixture::new(MILAN).consumer().provider().negotiated().0;
        let exported = Observed {
            exported_slices: vec![
                exported_slice("shop", "api", &["10.244.3.1", "10.244.3.2"]),
                // An exported Service's endpoint on a virtual node is the peer's pod.
                exported_slice("shop", "cache", &["10.2.4.4", "not-an-ip"]),
            ],
            ..Default::default()
        };
        let mut everything = as_provider();
        everything.offloaded_pods = as_consumer().offloaded_pods;
        everything.exported_slices = exported.exported_slices.clone();
        let peering = NetworkExposure::Peering;
        let cases: Vec<Case> = vec![
            (
                "a provider: the peer's pods in its twin namespaces, nothing it labelled \
                 elsewhere",
                peering,
                &provider,
                as_provider(),
                vec!["10.244.1.5"],
            ),
            (
                "a consumer: its pods in the namespaces offloaded to the peer, not those on \
                 the virtual node nor on a node's network",
                peering,
                &consumer,
                as_consumer(),
                vec!["10.244.2.7"],
            ),
            (
                "a consumer only: the peer's origin label opens nothing",
                peering,
                &consumer,
                as_provider(),
                vec![],
            ),
            (
                "a provider only: what the other side offloaded elsewhere stays closed",
                peering,
                &provider,
                as_consumer(),
                vec![],
            ),
            (
                "any peer: the local endpoints of exported Services",
                peering,
                &provider,
                exported.clone(),
                vec!["10.244.3.1", "10.244.3.2"],
            ),
            (
                "peered both ways: all of it, sorted, each once",
                peering,
                &both,
                everything.clone(),
                vec!["10.244.1.5", "10.244.2.7", "10.244.3.1", "10.244.3.2"],
            ),
            (
                "nothing offloaded or exported: nothing (not kube-system, not tandem-system)",
                peering,
                &both,
                Observed::default(),
                vec![],
            ),
            (
                "pod-cidr exposure: the whole pod CIDR, never a node",
                NetworkExposure::PodCidr,
                &provider,
                everything,
                vec![],
            ),
        ];
        for (what, exposure, view, seen, want) in cases {
            let got = destinations(exposure, POD_CIDR, view, &seen);
            let want = if exposure == NetworkExposure::PodCidr {
                vec![POD_CIDR.parse().unwrap()]
            } else {
                nets(&want)
            };
            assert_eq!(got, want, "{what}");
        }
    }

    #[test]
    fn the_same_pod_listed_twice_is_one_destination() {
        let both = ViewFixture::new(MILAN).consumer().provider().0;
        let seen = Observed {
            offloaded_pods: vec![pod("shop", "web", "10.244.2.7")],
            exported_slices: vec![exported_slice("shop", "web", &["10.244.2.7"])],
            ..Default::default()
        };
        assert_eq!(
            destinations(NetworkExposure::Peering, POD_CIDR, &both, &seen),
            nets(&["10.244.2.7"])
        );
    }

    /// Both clusters on one pod CIDR: the peer's pods, remapped here, are never destinations,
    /// and this cluster's are listed as it names them (the gateway's NAT translates).
    #[test]
    fn overlapping_pod_cidrs_expose_local_names_only() {
        let view = ViewFixture::new(MILAN).consumer().negotiated().0;
        let nat = view.nat.unwrap();
        assert_eq!(nat.local.pod_cidr, POD_CIDR.parse::<IpNet>().unwrap());
        let peer_pod = "10.2.1.5";
        assert!(
            nat.peer_as_seen_locally
                .pod_cidr
                .contains(&peer_pod.parse::<IpAddr>().unwrap())
        );
        let seen = Observed {
            offloaded_pods: vec![
                pod("shop", "here", "10.244.1.5"),
                pod("shop", "there", peer_pod),
            ],
            ..Default::default()
        };
        let got = destinations(NetworkExposure::Peering, POD_CIDR, &view, &seen);
        assert_eq!(got, nets(&["10.244.1.5"]));
        assert!(
            got.iter()
                .all(|d| !nat.local_as_seen_by_peer.pod_cidr.contains(d)),
            "listed in this cluster's names, not the peer's: {got:?}"
        );
    }

    #[test]
    fn an_unreadable_pod_cidr_exposes_nothing() {
        let both = ViewFixture::new(MILAN).consumer().provider().0;
        for exposure in [NetworkExposure::Peering, NetworkExposure::PodCidr] {
            assert_eq!(
                destinations(exposure, "not-a-cidr", &both, &as_consumer()),
                vec![],
                "{exposure:?}"
            );
        }
    }

    #[test]
    fn unreachable_table() {
        let twins = ["shop-milan".to_string()];
        let cases = [
            (
                "a twin's pod",
                PodFixture::new("shop-milan", "web").ip("10.244.1.5"),
                Ok("10.244.1.5"),
            ),
            (
                "labelled elsewhere",
                PodFixture::new("kube-system", "dns").ip("10.244.0.10"),
                Err(Unreachable::NotATwin),
            ),
            (
                "no namespace",
                PodFixture(Pod::default()),
                Err(Unreachable::NotATwin),
            ),
            (
                "no IP yet",
                PodFixture::new("shop-milan", "web"),
                Err(Unreachable::NoAddress),
            ),
            (
                "an IP that does not read",
                PodFixture::new("shop-milan", "web").ip("10.244.1"),
                Err(Unreachable::NoAddress),
            ),
        ];
        for (what, pod, want) in cases {
            assert_eq!(
                origin_pod(&pod.0, &twins),
                want.map(|ip| ip.parse().unwrap()),
                "{what}"
            );
        }
        let cidr = POD_CIDR.parse().ok();
        let at = |ip: &str| ip.parse::<IpAddr>().unwrap();
        assert_eq!(local(at("10.244.1.5"), cidr), Ok(nets(&["10.244.1.5"])[0]));
        for (what, ip) in [
            ("on a virtual node", "10.2.1.5"),
            ("a node's address", "192.168.1.10"),
            ("IPv6", "fd00::1"),
        ] {
            assert_eq!(local(at(ip), cidr), Err(Unreachable::NotLocal), "{what}");
        }
        assert_eq!(
            local(at("10.244.1.5"), None),
            Err(Unreachable::NotLocal),
            "no readable pod CIDR"
        );
    }

    #[test]
    fn only_namespaces_offloaded_to_the_peer_are_read() {
        let offloadings: Vec<NamespaceOffloading> = [
            OffloadingFixture::new("shop").twin_on(MILAN, "Ready"),
            OffloadingFixture::new("blog").twin_on("paris", "Ready"),
            OffloadingFixture::new("wiki")
                .twin_on("paris", "Ready")
                .twin_on(MILAN, "Ready"),
            OffloadingFixture::new("ci").twin_on(MILAN, "Pending"),
            OffloadingFixture::new("new"),
        ]
        .into_iter()
        .map(|o| o.0)
        .collect();
        assert_eq!(
            offloaded_to(MILAN, &offloadings),
            ["shop".to_string(), "wiki".to_string()]
        );
        assert_eq!(
            offloaded_to("paris", &offloadings),
            ["blog".to_string(), "wiki".to_string()]
        );
        assert_eq!(offloaded_to("rome", &offloadings), Vec::<String>::new());
    }
}
