//! IPAM for peer prefixes: a peer's prefix is granted as-is when it collides with nothing
//! local, otherwise remapped to a free prefix of the same length from the configured pools.
//!
//! The allocator is deterministic (lowest free prefix, pools in the configured order) and
//! restart-stable: everything it decided is in [`IpamState`], which the caller persists and
//! hands back to [`Ipam::with_state`].

use std::collections::BTreeMap;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::prefix::{Family, block_size, is_canonical, overlaps, prefix_at, span};

/// What the local cluster already uses and where remapped prefixes may come from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpamConfig {
    /// Local prefixes no peer may be granted: pod CIDRs, service CIDR, external CIDR,
    /// node networks and any range the administrator reserves.
    pub reserved: Vec<IpNet>,
    /// Pools remapped prefixes are carved from, tried in order.
    pub pools: Vec<IpNet>,
    /// Public prefixes a peer may nevertheless be granted (the administrator's widening of
    /// [`PrefixClass::Public`]); none by default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_public: Vec<IpNet>,
}

/// A class of prefixes never granted to a peer: each becomes a route on every node of this
/// cluster into the peer's tunnel, so a peer that declared one would capture this cluster's
/// own traffic (loopback, a cloud's metadata service, multicast) or the Internet's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PrefixClass {
    /// 0.0.0.0/8, ::/128: "this network".
    Unspecified,
    /// 127.0.0.0/8, ::1/128.
    Loopback,
    /// 169.254.0.0/16 (cloud metadata services), fe80::/10.
    LinkLocal,
    /// 224.0.0.0/4, ff00::/8.
    Multicast,
    /// 240.0.0.0/4 and the broadcast address.
    Reserved,
    /// Anything outside the private ranges (RFC 1918, 100.64.0.0/10, fc00::/7), unless the
    /// administrator allows it.
    Public,
}

impl std::fmt::Display for PrefixClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PrefixClass::Unspecified => "unspecified (0.0.0.0/8, ::/128)",
            PrefixClass::Loopback => "loopback (127.0.0.0/8, ::1)",
            PrefixClass::LinkLocal => "link-local (169.254.0.0/16, fe80::/10)",
            PrefixClass::Multicast => "multicast (224.0.0.0/4, ff00::/8)",
            PrefixClass::Reserved => "reserved (240.0.0.0/4)",
            PrefixClass::Public => {
                "public (outside 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10, fc00::/7)"
            }
        })
    }
}

/// The class that keeps `prefix` from being granted, if one does: any overlap with a special
/// range, or any part outside the private ranges and `allowed_public`.
pub fn refused_class(prefix: &IpNet, allowed_public: &[IpNet]) -> Option<PrefixClass> {
    const SPECIAL: [(&str, PrefixClass); 9] = [
        ("0.0.0.0/8", PrefixClass::Unspecified),
        ("::/128", PrefixClass::Unspecified),
        ("127.0.0.0/8", PrefixClass::Loopback),
        ("::1/128", PrefixClass::Loopback),
        ("169.254.0.0/16", PrefixClass::LinkLocal),
        ("fe80::/10", PrefixClass::LinkLocal),
        ("224.0.0.0/4", PrefixClass::Multicast),
        ("ff00::/8", PrefixClass::Multicast),
        ("240.0.0.0/4", PrefixClass::Reserved),
    ];
    const PRIVATE: [&str; 5] = [
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "fc00::/7",
    ];
    let parse = |s: &str| s.parse::<IpNet>().expect("a static prefix");
    for (range, class) in SPECIAL {
        if overlaps(&parse(range), prefix) {
            return Some(class);
        }
    }
    let inside = |range: &IpNet| {
        Family::of(range) == Family::of(prefix)
            && range.prefix_len() <= prefix.prefix_len()
            && range.contains(&prefix.network())
    };
    if PRIVATE.iter().map(|r| parse(r)).any(|r| inside(&r)) || allowed_public.iter().any(inside) {
        None
    } else {
        Some(PrefixClass::Public)
    }
}

/// One decision of the IPAM: the peer's real prefix and the prefix it is known by locally.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Grant {
    /// The prefix as the peer uses it.
    pub requested: IpNet,
    /// The prefix the local cluster uses for it (equal to `requested` when not remapped).
    pub granted: IpNet,
}

impl Grant {
    /// Whether the peer's prefix had to be translated.
    pub fn is_remapped(&self) -> bool {
        self.requested != self.granted
    }
}

/// Everything the IPAM decided, keyed by peer cluster ID; the caller persists it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpamState {
    /// Grants per peer, in the order the peer's prefixes were given.
    pub peers: BTreeMap<String, Vec<Grant>>,
}

/// Why an IPAM operation was refused; the state is unchanged when one is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IpamError {
    /// A peer ID must be non-empty.
    #[error("peer ID is empty")]
    EmptyPeer,
    /// A prefix had host bits set, which usually means a typo.
    #[error("{field}: prefix {prefix} has host bits set (did you mean {}?)", prefix.trunc())]
    NotCanonical {
        /// Which input held the prefix.
        field: &'static str,
        /// The offending prefix.
        prefix: IpNet,
    },
    /// Two prefixes of the same peer overlap, so no one-to-one translation exists.
    #[error("peer `{peer}`: prefixes {a} and {b} overlap")]
    OverlappingRequest {
        /// The peer.
        peer: String,
        /// First prefix.
        a: IpNet,
        /// Second prefix.
        b: IpNet,
    },
    /// No pool has a free prefix of the needed length and family.
    #[error(
        "peer `{peer}`: prefix {prefix} collides with a local or granted prefix and no {family} pool has a free /{len}"
    )]
    Exhausted {
        /// The peer.
        peer: String,
        /// The prefix that needed remapping.
        prefix: IpNet,
        /// Its family.
        family: Family,
        /// Its length.
        len: u8,
    },
    /// A prefix of a class never granted to a peer.
    #[error("peer `{peer}`: prefix {prefix} is {class}: never granted to a peer")]
    Refused {
        /// The peer.
        peer: String,
        /// The refused prefix.
        prefix: IpNet,
        /// Why.
        class: PrefixClass,
    },
    /// Persisted state contradicts itself or the configuration.
    #[error("stored state: peer `{peer}`: granted {granted} overlaps {other}")]
    InconsistentState {
        /// The peer whose grant conflicts.
        peer: String,
        /// Its granted prefix.
        granted: IpNet,
        /// What it overlaps.
        other: IpNet,
    },
}

/// The allocator; cheap to rebuild from its config and state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ipam {
    config: IpamConfig,
    state: IpamState,
}

impl Ipam {
    /// An allocator with no grants yet.
    pub fn new(config: IpamConfig) -> Result<Self, IpamError> {
        Self::with_state(config, IpamState::default())
    }

    /// An allocator resuming from persisted state; rejects state whose grants overlap
    /// each other (reserved prefixes may have changed since: those grants are remapped
    /// on the peer's next [`Ipam::map_peer`]).
    pub fn with_state(config: IpamConfig, state: IpamState) -> Result<Self, IpamError> {
        for p in &config.reserved {
            check_canonical("reserved", p)?;
        }
        for p in &config.pools {
            check_canonical("pools", p)?;
        }
        let mut seen: Vec<(&str, IpNet)> = Vec::new();
        for (peer, grants) in &state.peers {
            for g in grants {
                check_canonical("state.requested", &g.requested)?;
                check_canonical("state.granted", &g.granted)?;
                if let Some((_, other)) = seen.iter().find(|(_, o)| overlaps(o, &g.granted)) {
                    return Err(IpamError::InconsistentState {
                        peer: peer.clone(),
                        granted: g.granted,
                        other: *other,
                    });
                }
                seen.push((peer, g.granted));
            }
        }
        Ok(Self { config, state })
    }

    /// The state to persist.
    pub fn state(&self) -> &IpamState {
        &self.state
    }

    /// The configuration in force.
    pub fn config(&self) -> &IpamConfig {
        &self.config
    }

    /// The grants of `peer`, if it is mapped.
    pub fn grants(&self, peer: &str) -> Option<&[Grant]> {
        self.state.peers.get(peer).map(Vec::as_slice)
    }

    /// Grants `peer` a local name for each of its prefixes: the same prefix when it is
    /// free, else the lowest free prefix of the same length from the pools. Calling it
    /// again with the same prefixes returns the same grants; prefixes the peer no longer
    /// announces are released.
    pub fn map_peer(&mut self, peer: &str, prefixes: &[IpNet]) -> Result<Vec<Grant>, IpamError> {
        if peer.is_empty() {
            return Err(IpamError::EmptyPeer);
        }
        for (i, p) in prefixes.iter().enumerate() {
            check_canonical("peer prefixes", p)?;
            if let Some(class) = refused_class(p, &self.config.allowed_public) {
                return Err(IpamError::Refused {
                    peer: peer.to_string(),
                    prefix: *p,
                    class,
                });
            }
            if let Some(q) = prefixes[..i].iter().find(|q| overlaps(p, q)) {
                return Err(IpamError::OverlappingRequest {
                    peer: peer.to_string(),
                    a: *q,
                    b: *p,
                });
            }
        }
        let previous = self.state.peers.get(peer).cloned().unwrap_or_default();
        // Everything this peer may not be given: local prefixes and other peers' grants.
        let mut taken: Vec<IpNet> = self.config.reserved.clone();
        taken.extend(
            self.state
                .peers
                .iter()
                .filter(|(p, _)| p.as_str() != peer)
                .flat_map(|(_, gs)| gs.iter().map(|g| g.granted)),
        );
        // Earlier grants that are still valid keep priority, so restarts and re-announces
        // never move a working mapping.
        let mut kept: BTreeMap<IpNet, IpNet> = BTreeMap::new();
        for g in &previous {
            let still_requested = prefixes.contains(&g.requested);
            let still_free = !taken.iter().any(|t| overlaps(t, &g.granted))
                && !kept.values().any(|k| overlaps(k, &g.granted));
            if still_requested && still_free {
                kept.insert(g.requested, g.granted);
            }
        }
        taken.extend(kept.values().copied());
        let mut grants = Vec::with_capacity(prefixes.len());
        for p in prefixes {
            let granted = match kept.get(p) {
                Some(g) => *g,
                None => {
                    let g = if taken.iter().any(|t| overlaps(t, p)) {
                        self.allocate(p, &taken).ok_or(IpamError::Exhausted {
                            peer: peer.to_string(),
                            prefix: *p,
                            family: Family::of(p),
                            len: p.prefix_len(),
                        })?
                    } else {
                        *p
                    };
                    taken.push(g);
                    g
                }
            };
            grants.push(Grant {
                requested: *p,
                granted,
            });
        }
        self.state.peers.insert(peer.to_string(), grants.clone());
        Ok(grants)
    }

    /// Forgets `peer` (on unpeer), returning what it held so the caller can clean up.
    pub fn release_peer(&mut self, peer: &str) -> Vec<Grant> {
        self.state.peers.remove(peer).unwrap_or_default()
    }

    /// The lowest free prefix with `wanted`'s family and length, pools in order.
    fn allocate(&self, wanted: &IpNet, taken: &[IpNet]) -> Option<IpNet> {
        let family = Family::of(wanted);
        let len = wanted.prefix_len();
        let size = block_size(family, len);
        for pool in &self.config.pools {
            if Family::of(pool) != family || pool.prefix_len() > len {
                continue;
            }
            let (pool_start, pool_end) = span(pool);
            let mut cand = pool_start;
            loop {
                let cand_end = cand.checked_add(size - 1)?;
                if cand_end > pool_end {
                    break;
                }
                let candidate = prefix_at(family, cand, len);
                // Jump past the furthest-reaching conflict instead of stepping one block,
                // so a large pool with few grants is scanned quickly.
                let blocker = taken
                    .iter()
                    .filter(|t| overlaps(t, &candidate))
                    .map(|t| span(t).1)
                    .max();
                match blocker {
                    None => return Some(candidate),
                    Some(end) => match align_up(end.checked_add(1), size) {
                        Some(next) => cand = next,
                        None => break,
                    },
                }
            }
        }
        None
    }
}

fn align_up(value: Option<u128>, size: u128) -> Option<u128> {
    let v = value?;
    let rem = v % size;
    if rem == 0 {
        Some(v)
    } else {
        v.checked_add(size - rem)
    }
}

fn check_canonical(field: &'static str, prefix: &IpNet) -> Result<(), IpamError> {
    if is_canonical(prefix) {
        Ok(())
    } else {
        Err(IpamError::NotCanonical {
            field,
            prefix: *prefix,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_and_public_prefixes_are_never_granted() {
        let cases: Vec<(&str, Option<PrefixClass>)> = vec![
            ("10.244.0.0/16", None),
            ("172.20.0.0/16", None),
            ("192.168.4.0/24", None),
            ("100.64.0.0/16", None),
            ("fd00:10::/64", None),
            ("0.0.0.0/0", Some(PrefixClass::Unspecified)),
            ("0.0.0.0/8", Some(PrefixClass::Unspecified)),
            ("127.0.0.0/8", Some(PrefixClass::Loopback)),
            ("127.0.0.1/32", Some(PrefixClass::Loopback)),
            ("::1/128", Some(PrefixClass::Loopback)),
            ("64.0.0.0/2", Some(PrefixClass::Loopback)),
            ("169.254.169.254/32", Some(PrefixClass::LinkLocal)),
            ("169.254.0.0/16", Some(PrefixClass::LinkLocal)),
            ("fe80::/64", Some(PrefixClass::LinkLocal)),
            ("224.0.0.0/24", Some(PrefixClass::Multicast)),
            ("ff02::/16", Some(PrefixClass::Multicast)),
            ("255.255.255.255/32", Some(PrefixClass::Reserved)),
            ("8.8.8.0/24", Some(PrefixClass::Public)),
            ("192.0.2.0/24", Some(PrefixClass::Public)),
            ("172.0.0.0/8", Some(PrefixClass::Public)),
            ("2001:db8::/32", Some(PrefixClass::Public)),
        ];
        for (prefix, want) in cases {
            assert_eq!(refused_class(&net(prefix), &[]), want, "{prefix}");
        }
        // The administrator may widen Public, never the special classes.
        let widened = nets(&["198.18.0.0/15", "0.0.0.0/0"]);
        assert_eq!(refused_class(&net("198.18.4.0/24"), &widened), None);
        assert_eq!(
            refused_class(&net("127.0.0.0/8"), &widened),
            Some(PrefixClass::Loopback)
        );
        let mut ipam = Ipam::new(cluster()).unwrap();
        let err = ipam
            .map_peer("rome", &nets(&["10.9.0.0/16", "169.254.0.0/16"]))
            .unwrap_err();
        assert!(
            matches!(
                err,
                IpamError::Refused {
                    class: PrefixClass::LinkLocal,
                    ..
                }
            ),
            "{err}"
        );
        assert!(
            ipam.grants("rome").is_none(),
            "nothing granted on a refusal"
        );
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|s| net(s)).collect()
    }

    /// A typical cluster: pod, service and external CIDRs reserved, remapping from 10/8.
    fn cluster() -> IpamConfig {
        IpamConfig {
            reserved: nets(&["10.244.0.0/16", "10.96.0.0/12", "10.70.0.0/16"]),
            pools: nets(&["10.0.0.0/8"]),
            allowed_public: Vec::new(),
        }
    }

    #[test]
    fn grants_table() {
        struct Case {
            name: &'static str,
            config: IpamConfig,
            request: Vec<&'static str>,
            want: Result<Vec<&'static str>, &'static str>,
        }
        let cases = [
            Case {
                name: "free prefix is granted as-is",
                config: cluster(),
                request: vec!["10.245.0.0/16"],
                want: Ok(vec!["10.245.0.0/16"]),
            },
            Case {
                name: "same pod CIDR is remapped to the lowest free /16",
                config: cluster(),
                request: vec!["10.244.0.0/16"],
                want: Ok(vec!["10.0.0.0/16"]),
            },
            Case {
                name: "overlap with service CIDR is remapped",
                config: cluster(),
                request: vec!["10.100.0.0/16"],
                want: Ok(vec!["10.0.0.0/16"]),
            },
            Case {
                name: "prefix nested inside a reserved one is remapped",
                config: cluster(),
                request: vec!["10.244.8.0/24"],
                want: Ok(vec!["10.0.0.0/24"]),
            },
            Case {
                name: "prefix containing a reserved one is remapped",
                config: cluster(),
                request: vec!["10.64.0.0/10"],
                want: Ok(vec!["10.0.0.0/10"]),
            },
            Case {
                name: "pod and external CIDR of one peer get distinct prefixes",
                config: cluster(),
                request: vec!["10.244.0.0/16", "10.70.0.0/16"],
                want: Ok(vec!["10.0.0.0/16", "10.1.0.0/16"]),
            },
            Case {
                name: "remapping skips reserved ranges inside the pool",
                config: IpamConfig {
                    reserved: nets(&["10.244.0.0/16", "10.0.0.0/15"]),
                    pools: nets(&["10.0.0.0/8"]),
                    allowed_public: Vec::new(),
                },
                request: vec!["10.244.0.0/16"],
                want: Ok(vec!["10.2.0.0/16"]),
            },
            Case {
                name: "pools are tried in order",
                config: IpamConfig {
                    reserved: nets(&["10.244.0.0/16", "172.16.0.0/16"]),
                    pools: nets(&["172.16.0.0/15", "192.168.0.0/16"]),
                    allowed_public: Vec::new(),
                },
                request: vec!["10.244.0.0/16"],
                want: Ok(vec!["172.17.0.0/16"]),
            },
            Case {
                name: "pool too small for the prefix is exhausted",
                config: IpamConfig {
                    reserved: nets(&["10.244.0.0/16"]),
                    pools: nets(&["192.168.0.0/24"]),
                    allowed_public: Vec::new(),
                },
                request: vec!["10.244.0.0/16"],
                want: Err(
                    "peer `p`: prefix 10.244.0.0/16 collides with a local or granted prefix and no IPv4 pool has a free /16",
                ),
            },
            Case {
                name: "fully reserved pool is exhausted",
                config: IpamConfig {
                    reserved: nets(&["10.244.0.0/16", "192.168.0.0/16"]),
                    pools: nets(&["192.168.0.0/16"]),
                    allowed_public: Vec::new(),
                },
                request: vec!["10.244.0.0/16"],
                want: Err(
                    "peer `p`: prefix 10.244.0.0/16 collides with a local or granted prefix and no IPv4 pool has a free /16",
                ),
            },
            Case {
                name: "IPv6 prefix with only IPv4 pools is exhausted",
                config: IpamConfig {
                    reserved: nets(&["fd00::/48"]),
                    pools: nets(&["10.0.0.0/8"]),
                    allowed_public: Vec::new(),
                },
                request: vec!["fd00::/48"],
                want: Err(
                    "peer `p`: prefix fd00::/48 collides with a local or granted prefix and no IPv6 pool has a free /48",
                ),
            },
            Case {
                name: "IPv6 remapping works the same way",
                config: IpamConfig {
                    reserved: nets(&["fd00::/48"]),
                    pools: nets(&["fd00::/40"]),
                    allowed_public: Vec::new(),
                },
                request: vec!["fd00::/48"],
                want: Ok(vec!["fd00:0:1::/48"]),
            },
            Case {
                name: "host bits set is invalid input",
                config: cluster(),
                request: vec!["10.244.1.0/16"],
                want: Err(
                    "peer prefixes: prefix 10.244.1.0/16 has host bits set (did you mean 10.244.0.0/16?)",
                ),
            },
            Case {
                name: "overlapping prefixes of one peer are invalid input",
                config: cluster(),
                request: vec!["10.244.0.0/16", "10.244.4.0/24"],
                want: Err("peer `p`: prefixes 10.244.0.0/16 and 10.244.4.0/24 overlap"),
            },
        ];
        for case in cases {
            let mut ipam = Ipam::new(case.config).unwrap();
            let got = ipam
                .map_peer("p", &nets(&case.request))
                .map(|gs| gs.iter().map(|g| g.granted.to_string()).collect::<Vec<_>>())
                .map_err(|e| e.to_string());
            let want = case
                .want
                .map(|v| v.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .map_err(str::to_string);
            assert_eq!(got, want, "{}", case.name);
            if got.is_err() {
                assert_eq!(
                    ipam.grants("p"),
                    None,
                    "{}: failed call left state",
                    case.name
                );
            }
        }
    }

    #[test]
    fn two_peers_with_the_same_cidr_get_different_prefixes() {
        let mut ipam = Ipam::new(cluster()).unwrap();
        let a = ipam.map_peer("a", &nets(&["10.244.0.0/16"])).unwrap();
        let b = ipam.map_peer("b", &nets(&["10.244.0.0/16"])).unwrap();
        assert_eq!(a[0].granted, net("10.0.0.0/16"));
        assert_eq!(b[0].granted, net("10.1.0.0/16"));
        // A peer with a free CIDR that another peer was remapped into must move too.
        let c = ipam.map_peer("c", &nets(&["10.0.0.0/16"])).unwrap();
        assert_eq!(c[0].granted, net("10.2.0.0/16"));
    }

    #[test]
    fn remap_is_stable_across_restart_and_reannounce() {
        let mut ipam = Ipam::new(cluster()).unwrap();
        ipam.map_peer("a", &nets(&["10.244.0.0/16"])).unwrap();
        ipam.map_peer("b", &nets(&["10.244.0.0/16", "10.70.0.0/16"]))
            .unwrap();
        let persisted = serde_json::to_string(ipam.state()).unwrap();

        // Restart: a new allocator from persisted state, peers re-announced in another order.
        let state: IpamState = serde_json::from_str(&persisted).unwrap();
        let mut restarted = Ipam::with_state(cluster(), state).unwrap();
        let b = restarted
            .map_peer("b", &nets(&["10.244.0.0/16", "10.70.0.0/16"]))
            .unwrap();
        let a = restarted.map_peer("a", &nets(&["10.244.0.0/16"])).unwrap();
        assert_eq!(a, ipam.grants("a").unwrap());
        assert_eq!(b, ipam.grants("b").unwrap());
        assert_eq!(restarted.state(), ipam.state());
    }

    #[test]
    fn release_frees_prefixes_for_the_next_peer() {
        let mut ipam = Ipam::new(cluster()).unwrap();
        ipam.map_peer("a", &nets(&["10.244.0.0/16"])).unwrap();
        let released = ipam.release_peer("a");
        assert_eq!(released[0].granted, net("10.0.0.0/16"));
        assert_eq!(ipam.grants("a"), None);
        let b = ipam.map_peer("b", &nets(&["10.244.0.0/16"])).unwrap();
        assert_eq!(b[0].granted, net("10.0.0.0/16"));
        assert!(ipam.release_peer("unknown").is_empty());
    }

    #[test]
    fn withdrawn_prefix_is_released_and_kept_ones_stay() {
        let mut ipam = Ipam::new(cluster()).unwrap();
        let first = ipam
            .map_peer("a", &nets(&["10.244.0.0/16", "10.70.0.0/16"]))
            .unwrap();
        let second = ipam.map_peer("a", &nets(&["10.70.0.0/16"])).unwrap();
        assert_eq!(second[0], first[1], "kept prefix must not move");
        let other = ipam.map_peer("b", &nets(&["10.244.0.0/16"])).unwrap();
        assert_eq!(
            other[0].granted, first[0].granted,
            "withdrawn grant is free again"
        );
    }

    #[test]
    fn exhaustion_after_pool_is_used_up() {
        let config = IpamConfig {
            reserved: nets(&["10.244.0.0/16"]),
            pools: nets(&["10.0.0.0/15"]),
            allowed_public: Vec::new(),
        };
        let mut ipam = Ipam::new(config).unwrap();
        for peer in ["a", "b"] {
            ipam.map_peer(peer, &nets(&["10.244.0.0/16"])).unwrap();
        }
        let err = ipam.map_peer("c", &nets(&["10.244.0.0/16"])).unwrap_err();
        assert!(
            matches!(err, IpamError::Exhausted { ref peer, .. } if peer == "c"),
            "{err}"
        );
        assert_eq!(ipam.state().peers.len(), 2);
    }

    #[test]
    fn invalid_config_and_state_are_rejected() {
        let bad_pool = IpamConfig {
            reserved: vec![],
            pools: nets(&["10.0.0.1/8"]),
            allowed_public: Vec::new(),
        };
        assert_eq!(
            Ipam::new(bad_pool).unwrap_err().to_string(),
            "pools: prefix 10.0.0.1/8 has host bits set (did you mean 10.0.0.0/8?)"
        );
        let mut state = IpamState::default();
        let g = Grant {
            requested: net("10.244.0.0/16"),
            granted: net("10.0.0.0/16"),
        };
        state.peers.insert("a".into(), vec![g]);
        state.peers.insert("b".into(), vec![g]);
        let err = Ipam::with_state(cluster(), state).unwrap_err();
        assert_eq!(
            err.to_string(),
            "stored state: peer `b`: granted 10.0.0.0/16 overlaps 10.0.0.0/16"
        );
        let mut ipam = Ipam::new(cluster()).unwrap();
        assert_eq!(ipam.map_peer("", &[]).unwrap_err(), IpamError::EmptyPeer);
    }

    #[test]
    fn grant_moves_when_a_reserved_range_is_added_later() {
        let mut ipam = Ipam::new(cluster()).unwrap();
        ipam.map_peer("a", &nets(&["10.244.0.0/16"])).unwrap();
        let mut config = cluster();
        config.reserved.push(net("10.0.0.0/16"));
        let mut ipam = Ipam::with_state(config, ipam.state().clone()).unwrap();
        let again = ipam.map_peer("a", &nets(&["10.244.0.0/16"])).unwrap();
        assert_eq!(again[0].granted, net("10.1.0.0/16"));
    }
}
