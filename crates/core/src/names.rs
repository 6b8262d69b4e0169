//! Names derived from a peer's cluster ID, which the peer chooses itself: the gateway's TUN
//! interface (and the nftables table named after it) and the EndpointSlices of multi-cluster
//! imports. They must be stable (two controllers, or two versions of one, derive the same
//! name), short (an interface name has at most 15 bytes) and hard to make collide, or a peer
//! choosing its ID could share another peer's interface, table or slices.

use sha2::{Digest, Sha256};

/// Length of [`peer_hash`]: 14 base32 characters, 70 bits.
pub const PEER_HASH_LEN: usize = 14;

/// Linux's limit on interface names (IFNAMSIZ less the terminating NUL).
pub const MAX_INTERFACE_LEN: usize = 15;

/// RFC 4648 base32 in lower case: letters and `2`–`7`, valid in interface names, nftables
/// identifiers and Kubernetes object names alike.
const BASE32: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

/// A collision-resistant, stable fragment naming the peer `cluster_id`: the first 70 bits of
/// its SHA-256 in lower-case base32 without padding ([`PEER_HASH_LEN`] characters).
///
/// Taking another peer's names means finding a second preimage of that peer's (public) ID:
/// about 2^70 hashes. Two IDs both chosen by an attacker meet after about 2^35, but then the
/// attacker only collides with itself.
pub fn peer_hash(cluster_id: &str) -> String {
    let digest = Sha256::digest(cluster_id.as_bytes());
    let mut out = String::with_capacity(PEER_HASH_LEN);
    // Five bits per character, most significant first, from the digest's leading bytes.
    let (mut acc, mut bits) = (0u32, 0u32);
    for &byte in digest.iter() {
        acc = (acc << 8) | u32::from(byte);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(char::from(BASE32[((acc >> bits) & 0x1f) as usize]));
            if out.len() == PEER_HASH_LEN {
                return out;
            }
        }
        acc &= (1 << bits) - 1;
    }
    unreachable!("a SHA-256 digest has more than {PEER_HASH_LEN} base32 characters")
}

/// The TUN interface of the gateway to `peer`: `t` and [`peer_hash`], 15 bytes.
pub fn gateway_interface(peer: &str) -> String {
    format!("t{}", peer_hash(peer))
}

/// The EndpointSlice holding slice `index` of `cluster`'s export of the Service imported as
/// `derived`.
pub fn import_slice(derived: &str, cluster: &str, index: usize) -> String {
    format!("{derived}-{}-{index}", peer_hash(cluster))
}

/// The 32-bit FNV-1a hash (eight hex digits) that named the gateway interface and import
/// slices before [`peer_hash`]. Kept only to find and remove what earlier versions left
/// under those names; never for a new name: two chosen IDs share it after about 2^16 tries.
pub fn legacy_short_hash(s: &str) -> String {
    let hash = s.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    format!("{hash:08x}")
}

/// The name earlier versions gave the TUN interface of the gateway to `peer`.
pub fn legacy_gateway_interface(peer: &str) -> String {
    format!("tdm-{}", legacy_short_hash(peer))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn peer_hash_is_sha256_in_base32() {
        // Reference values: Python's `base64.b32encode(hashlib.sha256(id).digest())`, lower
        // case, first 14 characters.
        for (id, want) in [
            ("", "4oymiquy7qobjg"),
            ("a", "zklycewkdo64v6"),
            ("milan", "57xgcrbayv652k"),
        ] {
            assert_eq!(peer_hash(id), want, "{id:?}");
        }
        assert_eq!(gateway_interface("milan"), "t57xgcrbayv652k");
    }

    #[test]
    fn names_fit_interfaces_and_nftables() {
        for peer in [
            "",
            "a",
            "milan",
            "a-very-long-cluster-id-that-a-peer-may-choose-at-will-0123456789",
            "UPPER.case_and.dots",
        ] {
            let interface = gateway_interface(peer);
            assert_eq!(interface.len(), MAX_INTERFACE_LEN, "{interface}");
            // Interface names: no '/', ':', whitespace or NUL, not "." or ".."; nftables
            // identifiers: a letter, then letters, digits, '_' or '.'.
            assert!(interface.starts_with(|c: char| c.is_ascii_lowercase()));
            assert!(
                interface
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || ('2'..='7').contains(&c)),
                "{interface}"
            );
            // Never one of the old names (`tdm-…`), so a migration cannot remove a current one.
            assert!(!interface.contains('-'));
            assert_ne!(interface, legacy_gateway_interface(peer));
        }
    }

    #[test]
    fn distinct_ids_get_distinct_names() {
        let ids: Vec<String> = (0..20_000).map(|i| format!("cluster-{i}")).collect();
        let names: BTreeSet<String> = ids.iter().map(|id| gateway_interface(id)).collect();
        assert_eq!(names.len(), ids.len());
        let slices: BTreeSet<String> = ids
            .iter()
            .map(|id| import_slice("derived-0123456789ab", id, 0))
            .collect();
        assert_eq!(slices.len(), ids.len());
    }

    #[test]
    fn legacy_names_are_what_earlier_versions_derived() {
        // FNV-1a test vectors: the upgrade finds exactly what the old gateway created.
        assert_eq!(legacy_short_hash(""), "811c9dc5");
        assert_eq!(legacy_short_hash("a"), "e40c292c");
        assert_eq!(legacy_gateway_interface("a"), "tdm-e40c292c");
    }
}
