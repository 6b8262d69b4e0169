//! The NAT plan of one gateway: which prefix translations make two clusters with
//! overlapping addresses reach each other ("double NAT": each side translates once).
//!
//! Each side names the other's prefixes with its own IPAM. A gateway therefore
//! - rewrites the **source** of traffic it sends into the tunnel to the name the peer
//!   gave us (pod CIDR prefix-to-prefix; any other source to the first address of the name
//!   the peer gave our external CIDR), and
//! - rewrites the **destination** of traffic arriving from the tunnel from the name the
//!   peer gave us back to our real prefix.
//!
//! The plan is data; `tandem-net` renders it to nftables.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::prefix::{Family, is_canonical, overlaps, translate};

/// The prefixes one cluster is reached by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterPrefixes {
    /// The pod CIDR.
    pub pod_cidr: IpNet,
    /// The external CIDR: stands for non-pod addresses (nodes, hosts, third clusters).
    pub external_cidr: IpNet,
}

/// What a gateway knows to compute its plan: its own prefixes and both sides' IPAM results.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NatPlanInput {
    /// The local cluster's real prefixes.
    pub local: ClusterPrefixes,
    /// The names the peer's IPAM gave our prefixes (the peer's view of us).
    pub local_as_seen_by_peer: ClusterPrefixes,
    /// The names our IPAM gave the peer's prefixes (our view of the peer).
    pub peer_as_seen_locally: ClusterPrefixes,
}

/// A stateless one-to-one translation of a whole prefix, keeping the host part.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PrefixTranslation {
    /// The prefix matched.
    pub from: IpNet,
    /// The prefix it becomes.
    pub to: IpNet,
}

/// The translation of sources that are not pods: many-to-one, so it needs connection tracking.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnknownSourceTranslation {
    /// Sources inside these prefixes are not affected (they have a prefix translation).
    pub except: Vec<IpNet>,
    /// The address every other source becomes.
    pub to: IpAddr,
}

/// The complete NAT and routing intent of a gateway for one peer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NatPlan {
    /// Destination translations for traffic arriving from the tunnel (peer's name → real).
    pub dnat_from_tunnel: Vec<PrefixTranslation>,
    /// Source translations for traffic entering the tunnel (real → peer's name for it).
    pub snat_to_tunnel: Vec<PrefixTranslation>,
    /// Source translation for everything else entering the tunnel.
    pub unknown_source: UnknownSourceTranslation,
    /// Destinations routed into the tunnel; anything else never enters it.
    pub tunnel_destinations: Vec<IpNet>,
    /// Sources accepted from the tunnel (after the peer's own source translation).
    pub tunnel_sources: Vec<IpNet>,
    /// Destinations accepted from the tunnel: the names the peer gave our prefixes. Anything
    /// else a peer sends (say, a node address) is dropped before it reaches the kernel.
    pub tunnel_arrival_destinations: Vec<IpNet>,
}

/// Why no plan could be made from the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NatPlanError {
    /// A prefix had host bits set.
    #[error("{field}: prefix {prefix} has host bits set (did you mean {}?)", prefix.trunc())]
    NotCanonical {
        /// Which input field.
        field: &'static str,
        /// The prefix.
        prefix: IpNet,
    },
    /// A prefix and its name on the other side differ in length: no 1:1 translation exists.
    #[error("{field}: {real} and its remapped name {remapped} differ in length")]
    LengthMismatch {
        /// Which pair.
        field: &'static str,
        /// The real prefix.
        real: IpNet,
        /// The name it was given.
        remapped: IpNet,
    },
    /// Input mixes address families.
    #[error("{field}: {prefix} is {found}, but the local pod CIDR is {expected}")]
    FamilyMismatch {
        /// Which input field.
        field: &'static str,
        /// The prefix.
        prefix: IpNet,
        /// Its family.
        found: Family,
        /// The family of the plan.
        expected: Family,
    },
    /// Two prefixes that must be disjoint overlap, so routing would be ambiguous.
    #[error("{a_field} {a} overlaps {b_field} {b}")]
    Overlap {
        /// First field.
        a_field: &'static str,
        /// First prefix.
        a: IpNet,
        /// Second field.
        b_field: &'static str,
        /// Second prefix.
        b: IpNet,
    },
}

impl NatPlan {
    /// Computes the plan; identity translations (prefixes the peer did not remap) are omitted.
    pub fn build(input: &NatPlanInput) -> Result<Self, NatPlanError> {
        let fields = [
            ("local.podCIDR", input.local.pod_cidr),
            ("local.externalCIDR", input.local.external_cidr),
            (
                "localAsSeenByPeer.podCIDR",
                input.local_as_seen_by_peer.pod_cidr,
            ),
            (
                "localAsSeenByPeer.externalCIDR",
                input.local_as_seen_by_peer.external_cidr,
            ),
            (
                "peerAsSeenLocally.podCIDR",
                input.peer_as_seen_locally.pod_cidr,
            ),
            (
                "peerAsSeenLocally.externalCIDR",
                input.peer_as_seen_locally.external_cidr,
            ),
        ];
        let family = Family::of(&input.local.pod_cidr);
        for (field, prefix) in fields {
            if !is_canonical(&prefix) {
                return Err(NatPlanError::NotCanonical { field, prefix });
            }
            if Family::of(&prefix) != family {
                return Err(NatPlanError::FamilyMismatch {
                    field,
                    prefix,
                    found: Family::of(&prefix),
                    expected: family,
                });
            }
        }
        let pairs = [
            (
                "podCIDR",
                input.local.pod_cidr,
                input.local_as_seen_by_peer.pod_cidr,
            ),
            (
                "externalCIDR",
                input.local.external_cidr,
                input.local_as_seen_by_peer.external_cidr,
            ),
        ];
        for (field, real, remapped) in pairs {
            if real.prefix_len() != remapped.prefix_len() {
                return Err(NatPlanError::LengthMismatch {
                    field,
                    real,
                    remapped,
                });
            }
        }
        // Local real prefixes and our names for the peer share one routing table.
        let disjoint = [fields[0], fields[1], fields[4], fields[5]];
        for (i, (a_field, a)) in disjoint.iter().enumerate() {
            for (b_field, b) in &disjoint[i + 1..] {
                if overlaps(a, b) {
                    return Err(NatPlanError::Overlap {
                        a_field,
                        a: *a,
                        b_field,
                        b: *b,
                    });
                }
            }
        }
        // Likewise the names the peer gave us must be distinct from each other.
        if overlaps(
            &input.local_as_seen_by_peer.pod_cidr,
            &input.local_as_seen_by_peer.external_cidr,
        ) {
            return Err(NatPlanError::Overlap {
                a_field: fields[2].0,
                a: fields[2].1,
                b_field: fields[3].0,
                b: fields[3].1,
            });
        }

        let dnat_from_tunnel = pairs
            .iter()
            .filter(|(_, real, remapped)| real != remapped)
            .map(|(_, real, remapped)| PrefixTranslation {
                from: *remapped,
                to: *real,
            })
            .collect();
        let snat_to_tunnel = pairs[..1]
            .iter()
            .filter(|(_, real, remapped)| real != remapped)
            .map(|(_, real, remapped)| PrefixTranslation {
                from: *real,
                to: *remapped,
            })
            .collect();
        let peer = input.peer_as_seen_locally;
        Ok(Self {
            dnat_from_tunnel,
            snat_to_tunnel,
            unknown_source: UnknownSourceTranslation {
                except: vec![input.local.pod_cidr],
                to: input.local_as_seen_by_peer.external_cidr.network(),
            },
            tunnel_destinations: vec![peer.pod_cidr, peer.external_cidr],
            tunnel_sources: vec![peer.pod_cidr, peer.external_cidr],
            tunnel_arrival_destinations: vec![
                input.local_as_seen_by_peer.pod_cidr,
                input.local_as_seen_by_peer.external_cidr,
            ],
        })
    }

    /// The source address the peer sees for a packet we send from `src`.
    pub fn source_as_seen_by_peer(&self, src: IpAddr) -> IpAddr {
        if let Some(t) = self.snat_to_tunnel.iter().find(|t| t.from.contains(&src)) {
            return translate(src, &t.from, &t.to).unwrap_or(src);
        }
        if self.unknown_source.except.iter().any(|e| e.contains(&src)) {
            src
        } else {
            self.unknown_source.to
        }
    }

    /// The local destination of a packet arriving from the tunnel addressed to `dst`.
    pub fn destination_from_tunnel(&self, dst: IpAddr) -> IpAddr {
        self.dnat_from_tunnel
            .iter()
            .find(|t| t.from.contains(&dst))
            .and_then(|t| translate(dst, &t.from, &t.to))
            .unwrap_or(dst)
    }

    /// Whether a packet to `dst` may enter the tunnel.
    pub fn routes_into_tunnel(&self, dst: IpAddr) -> bool {
        self.tunnel_destinations.iter().any(|p| p.contains(&dst))
    }

    /// Whether a decrypted packet from `src` to `dst` may leave the tunnel (WireGuard's
    /// allowed IPs for the source, plus the destinations the peer may address).
    pub fn accepts_from_tunnel(&self, src: IpAddr, dst: IpAddr) -> bool {
        self.tunnel_sources.iter().any(|p| p.contains(&src))
            && self
                .tunnel_arrival_destinations
                .iter()
                .any(|p| p.contains(&dst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn prefixes(pod: &str, ext: &str) -> ClusterPrefixes {
        ClusterPrefixes {
            pod_cidr: net(pod),
            external_cidr: net(ext),
        }
    }

    /// Two clusters with the same pod and external CIDRs, each remapping the other.
    fn double_nat() -> NatPlanInput {
        NatPlanInput {
            local: prefixes("10.244.0.0/16", "10.70.0.0/16"),
            local_as_seen_by_peer: prefixes("10.0.0.0/16", "10.1.0.0/16"),
            peer_as_seen_locally: prefixes("10.2.0.0/16", "10.3.0.0/16"),
        }
    }

    #[test]
    fn double_nat_plan() {
        let plan = NatPlan::build(&double_nat()).unwrap();
        assert_eq!(
            plan.dnat_from_tunnel,
            vec![
                PrefixTranslation {
                    from: net("10.0.0.0/16"),
                    to: net("10.244.0.0/16")
                },
                PrefixTranslation {
                    from: net("10.1.0.0/16"),
                    to: net("10.70.0.0/16")
                },
            ]
        );
        assert_eq!(
            plan.snat_to_tunnel,
            vec![PrefixTranslation {
                from: net("10.244.0.0/16"),
                to: net("10.0.0.0/16")
            }]
        );
        assert_eq!(plan.unknown_source.to, ip("10.1.0.0"));
        assert_eq!(
            plan.tunnel_destinations,
            vec![net("10.2.0.0/16"), net("10.3.0.0/16")]
        );
    }

    #[test]
    fn addresses_as_translated() {
        struct Case {
            name: &'static str,
            input: NatPlanInput,
            src: &'static str,
            seen_by_peer: &'static str,
            arriving_dst: &'static str,
            local_dst: &'static str,
        }
        let no_remap = NatPlanInput {
            local: prefixes("10.244.0.0/16", "10.70.0.0/16"),
            local_as_seen_by_peer: prefixes("10.244.0.0/16", "10.70.0.0/16"),
            peer_as_seen_locally: prefixes("10.245.0.0/16", "10.71.0.0/16"),
        };
        let cases = [
            Case {
                name: "pod source keeps its host part in the remapped prefix",
                input: double_nat(),
                src: "10.244.3.7",
                seen_by_peer: "10.0.3.7",
                arriving_dst: "10.0.3.7",
                local_dst: "10.244.3.7",
            },
            Case {
                name: "node source becomes the first external address",
                input: double_nat(),
                src: "172.16.0.11",
                seen_by_peer: "10.1.0.0",
                arriving_dst: "10.1.0.9",
                local_dst: "10.70.0.9",
            },
            Case {
                name: "address outside every remapped prefix is untouched on arrival",
                input: double_nat(),
                src: "10.244.0.1",
                seen_by_peer: "10.0.0.1",
                arriving_dst: "192.168.1.1",
                local_dst: "192.168.1.1",
            },
            Case {
                name: "without remapping pods keep their address",
                input: no_remap,
                src: "10.244.1.2",
                seen_by_peer: "10.244.1.2",
                arriving_dst: "10.244.1.2",
                local_dst: "10.244.1.2",
            },
            Case {
                name: "without remapping hosts still hide behind the external CIDR",
                input: no_remap,
                src: "192.168.5.5",
                seen_by_peer: "10.70.0.0",
                arriving_dst: "10.70.0.1",
                local_dst: "10.70.0.1",
            },
        ];
        for c in cases {
            let plan = NatPlan::build(&c.input).unwrap();
            assert_eq!(
                plan.source_as_seen_by_peer(ip(c.src)),
                ip(c.seen_by_peer),
                "{}",
                c.name
            );
            assert_eq!(
                plan.destination_from_tunnel(ip(c.arriving_dst)),
                ip(c.local_dst),
                "{}",
                c.name
            );
        }
        let plan = NatPlan::build(&no_remap).unwrap();
        assert!(plan.dnat_from_tunnel.is_empty() && plan.snat_to_tunnel.is_empty());
    }

    #[test]
    fn only_the_peer_prefixes_enter_the_tunnel() {
        let plan = NatPlan::build(&double_nat()).unwrap();
        let cases = [
            ("10.2.1.1", true),
            ("10.3.0.0", true),
            ("10.244.1.1", false),
            ("10.4.0.1", false),
            ("8.8.8.8", false),
        ];
        for (dst, want) in cases {
            assert_eq!(plan.routes_into_tunnel(ip(dst)), want, "{dst}");
        }
    }

    #[test]
    fn only_the_peer_names_and_our_names_leave_the_tunnel() {
        let plan = NatPlan::build(&double_nat()).unwrap();
        let cases = [
            ("peer pod to our pod", "10.2.0.5", "10.0.1.10", true),
            ("peer host to our pod", "10.3.0.0", "10.0.1.10", true),
            ("reply to our host source", "10.2.0.5", "10.1.0.0", true),
            ("spoofed source", "10.244.1.1", "10.0.1.10", false),
            ("our real pod address", "10.2.0.5", "10.244.1.10", false),
            ("a node address", "10.2.0.5", "172.16.0.11", false),
        ];
        for (name, src, dst, want) in cases {
            assert_eq!(plan.accepts_from_tunnel(ip(src), ip(dst)), want, "{name}");
        }
    }

    #[test]
    fn invalid_input_table() {
        let base = double_nat();
        let cases: Vec<(&str, NatPlanInput, &str)> = vec![
            (
                "host bits",
                NatPlanInput {
                    local: prefixes("10.244.0.1/16", "10.70.0.0/16"),
                    ..base
                },
                "local.podCIDR: prefix 10.244.0.1/16 has host bits set (did you mean 10.244.0.0/16?)",
            ),
            (
                "length mismatch",
                NatPlanInput {
                    local_as_seen_by_peer: prefixes("10.0.0.0/17", "10.1.0.0/16"),
                    ..base
                },
                "podCIDR: 10.244.0.0/16 and its remapped name 10.0.0.0/17 differ in length",
            ),
            (
                "mixed families",
                NatPlanInput {
                    peer_as_seen_locally: prefixes("fd00::/64", "10.3.0.0/16"),
                    ..base
                },
                "peerAsSeenLocally.podCIDR: fd00::/64 is IPv6, but the local pod CIDR is IPv4",
            ),
            (
                "peer name collides with local pods",
                NatPlanInput {
                    peer_as_seen_locally: prefixes("10.244.0.0/16", "10.3.0.0/16"),
                    ..base
                },
                "local.podCIDR 10.244.0.0/16 overlaps peerAsSeenLocally.podCIDR 10.244.0.0/16",
            ),
            (
                "nested peer name inside local external",
                NatPlanInput {
                    peer_as_seen_locally: prefixes("10.2.0.0/16", "10.70.128.0/17"),
                    ..base
                },
                "local.externalCIDR 10.70.0.0/16 overlaps peerAsSeenLocally.externalCIDR 10.70.128.0/17",
            ),
            (
                "local pod and external overlap",
                NatPlanInput {
                    local: prefixes("10.244.0.0/16", "10.244.0.0/24"),
                    local_as_seen_by_peer: prefixes("10.0.0.0/16", "10.1.0.0/24"),
                    ..base
                },
                "local.podCIDR 10.244.0.0/16 overlaps local.externalCIDR 10.244.0.0/24",
            ),
            (
                "peer gave both our prefixes overlapping names",
                NatPlanInput {
                    local_as_seen_by_peer: prefixes("10.0.0.0/16", "10.0.0.0/16"),
                    ..base
                },
                "localAsSeenByPeer.podCIDR 10.0.0.0/16 overlaps localAsSeenByPeer.externalCIDR 10.0.0.0/16",
            ),
        ];
        for (name, input, want) in cases {
            let err = NatPlan::build(&input).unwrap_err();
            assert_eq!(err.to_string(), want, "{name}");
        }
    }
}
