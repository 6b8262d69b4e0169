//! The little packet parsing the gateway needs: IP source/destination for cryptokey
//! routing, and the ICMP echo probes that measure the tunnel.
//!
//! Written by hand because it is a few fixed offsets on the hot path; a general parser
//! (etherparse) would validate far more than we read.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Source and destination of an IP packet, or `None` when it is not a valid IPv4/IPv6 header.
pub fn addresses(packet: &[u8]) -> Option<(IpAddr, IpAddr)> {
    match packet.first()? >> 4 {
        4 if packet.len() >= 20 => {
            let src: [u8; 4] = packet[12..16].try_into().ok()?;
            let dst: [u8; 4] = packet[16..20].try_into().ok()?;
            Some((Ipv4Addr::from(src).into(), Ipv4Addr::from(dst).into()))
        }
        6 if packet.len() >= 40 => {
            let src: [u8; 16] = packet[8..24].try_into().ok()?;
            let dst: [u8; 16] = packet[24..40].try_into().ok()?;
            Some((Ipv6Addr::from(src).into(), Ipv6Addr::from(dst).into()))
        }
        _ => None,
    }
}

/// Source address of probe packets; they never reach a kernel, so the link-local
/// addresses only have to be recognisable in a packet capture.
pub const PROBE_SOURCE: Ipv4Addr = Ipv4Addr::new(169, 254, 84, 1);
/// Destination address of probe packets.
pub const PROBE_DESTINATION: Ipv4Addr = Ipv4Addr::new(169, 254, 84, 2);
/// ICMP echo identifier marking a tunnel probe ("Td").
pub const PROBE_IDENT: u16 = 0x5464;

/// What a decrypted packet is, as far as probing is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// The peer asks for an echo with this sequence number.
    Request(u16),
    /// The peer answers our probe with this sequence number.
    Reply(u16),
}

/// Builds an ICMP echo probe (request or reply) into `buf`, returning its length.
pub fn build_probe(probe: Probe, buf: &mut [u8; 28]) -> usize {
    let (icmp_type, seq, src, dst) = match probe {
        Probe::Request(seq) => (8u8, seq, PROBE_SOURCE, PROBE_DESTINATION),
        Probe::Reply(seq) => (0u8, seq, PROBE_DESTINATION, PROBE_SOURCE),
    };
    *buf = [0; 28];
    buf[0] = 0x45;
    buf[2..4].copy_from_slice(&28u16.to_be_bytes());
    buf[8] = 64; // TTL
    buf[9] = 1; // ICMP
    buf[12..16].copy_from_slice(&src.octets());
    buf[16..20].copy_from_slice(&dst.octets());
    let ip_sum = checksum(&buf[..20]);
    buf[10..12].copy_from_slice(&ip_sum.to_be_bytes());
    buf[20] = icmp_type;
    buf[24..26].copy_from_slice(&PROBE_IDENT.to_be_bytes());
    buf[26..28].copy_from_slice(&seq.to_be_bytes());
    let icmp_sum = checksum(&buf[20..28]);
    buf[22..24].copy_from_slice(&icmp_sum.to_be_bytes());
    28
}

/// Recognises a probe among decrypted packets (IPv4 ICMP echo with [`PROBE_IDENT`] between
/// the probe addresses).
pub fn parse_probe(packet: &[u8]) -> Option<Probe> {
    if packet.len() < 28 || packet[0] != 0x45 || packet[9] != 1 {
        return None;
    }
    let ends = (&packet[12..16], &packet[16..20]);
    let ident = u16::from_be_bytes([packet[24], packet[25]]);
    let seq = u16::from_be_bytes([packet[26], packet[27]]);
    if ident != PROBE_IDENT {
        return None;
    }
    let forward = (&PROBE_SOURCE.octets()[..], &PROBE_DESTINATION.octets()[..]);
    let backward = (forward.1, forward.0);
    match packet[20] {
        8 if ends == forward => Some(Probe::Request(seq)),
        0 if ends == backward => Some(Probe::Reply(seq)),
        _ => None,
    }
}

/// The Internet checksum (RFC 1071) of `data`.
fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for chunk in data.chunks(2) {
        let word = u16::from_be_bytes([chunk[0], *chunk.get(1).unwrap_or(&0)]);
        sum += u32::from(word);
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_round_trip_and_checksum_to_zero() {
        for probe in [Probe::Request(7), Probe::Reply(65535)] {
            let mut buf = [0u8; 28];
            let n = build_probe(probe, &mut buf);
            assert_eq!(parse_probe(&buf[..n]), Some(probe));
            // A valid header or ICMP message sums to zero including its checksum field.
            assert_eq!(checksum(&buf[..20]), 0);
            assert_eq!(checksum(&buf[20..28]), 0);
        }
    }

    #[test]
    fn ordinary_packets_are_not_probes() {
        let mut buf = [0u8; 28];
        build_probe(Probe::Request(1), &mut buf);
        let mut other_ident = buf;
        other_ident[24] = 0;
        let mut other_dst = buf;
        other_dst[19] = 9;
        let mut udp = buf;
        udp[9] = 17;
        for (name, pkt) in [("ident", other_ident), ("dst", other_dst), ("udp", udp)] {
            assert_eq!(parse_probe(&pkt), None, "{name}");
        }
        assert_eq!(parse_probe(&buf[..20]), None, "truncated");
    }

    #[test]
    fn addresses_of_v4_v6_and_garbage() {
        let mut v4 = [0u8; 28];
        build_probe(Probe::Request(1), &mut v4);
        assert_eq!(
            addresses(&v4),
            Some((PROBE_SOURCE.into(), PROBE_DESTINATION.into()))
        );
        let mut v6 = [0u8; 40];
        v6[0] = 0x60;
        v6[23] = 1;
        v6[39] = 2;
        assert_eq!(
            addresses(&v6),
            Some(("::1".parse().unwrap(), "::2".parse().unwrap()))
        );
        assert_eq!(addresses(&[0x45, 0, 0]), None);
        assert_eq!(addresses(&[]), None);
    }
}
