//! What a cluster advertises for discovery (DNS-SD, RFC 6763: the same records over multicast
//! DNS on a LAN and in a public zone across the WAN), and the CA fingerprint an administrator
//! confirms out of band before a discovered cluster is trusted. Pure: no I/O.
//!
//! Records, for cluster `milan` under `example.org`:
//!
//! ```text
//! _tandem._tcp.example.org.        300 IN PTR milan._tandem._tcp.example.org.
//! milan._tandem._tcp.example.org.  300 IN SRV 0 0 6443 api.milan.example.org.
//! milan._tandem._tcp.example.org.  300 IN TXT "id=milan" "v=1" "fp=sha256:…" "region=eu-south" …
//! ```

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// The DNS-SD service type.
pub const SERVICE: &str = "_tandem._tcp";

/// What one cluster advertises.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Advertisement {
    /// The cluster's ID (self-asserted: never a reason to trust it).
    pub cluster_id: String,
    /// Its API endpoint (`https://host:port`).
    pub endpoint: String,
    /// SHA-256 of its API CA certificate's DER, as [`fingerprint`] writes it.
    pub ca_fingerprint: String,
    /// The peering protocol version it speaks (`crate::protocol`).
    pub protocol_version: u32,
    /// `topology.kubernetes.io/region` and `zone` of its nodes, when they agree.
    pub region: Option<String>,
    pub zone: Option<String>,
    /// The enrollment credential (`<id>.<secret>` bootstrap token), when the cluster takes
    /// peering requests without an invite. Public by design: it can do nothing but file a
    /// bounded number of requests that wait for approval.
    pub enroll: Option<String>,
}

/// Why advertised records were not read as an [`Advertisement`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DiscoveryError {
    #[error("TXT record has no {0:?}")]
    Missing(&'static str),
    #[error("TXT record {key}={value:?}: {why}")]
    Invalid {
        key: &'static str,
        value: String,
        why: String,
    },
    #[error(
        "{0:?} is not a SHA-256 fingerprint (64 hex digits, colons allowed, optionally after sha256:)"
    )]
    Fingerprint(String),
}

/// The fingerprint of a CA certificate (its DER): `sha256:` and 64 lowercase hex digits, the
/// digits `openssl x509 -noout -fingerprint -sha256` prints.
pub fn fingerprint(der: &[u8]) -> String {
    let digest = Sha256::digest(der);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// Reads a fingerprint as an administrator may type it: with or without `sha256:` (any
/// case), with or without colons, in either case; returns it as [`fingerprint`] writes it.
pub fn parse_fingerprint(s: &str) -> Result<String, DiscoveryError> {
    let t = s.trim();
    let hex = match t.split_once(':') {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("sha256") => rest,
        _ => t,
    };
    let digits: String = hex.chars().filter(|c| *c != ':').collect();
    if digits.len() != 64 || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(DiscoveryError::Fingerprint(s.to_string()));
    }
    Ok(format!("sha256:{}", digits.to_ascii_lowercase()))
}

/// Whether `v` is a Kubernetes label value (what a region or zone label holds).
fn is_label_value(v: &str) -> bool {
    let edge = |c: Option<char>| c.is_none_or(|c| c.is_ascii_alphanumeric());
    v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && edge(v.chars().next())
        && edge(v.chars().last())
}

/// Whether `endpoint` is `https://HOST[:PORT][/PATH]` with a DNS name or an IP address as the
/// host, a port that is not 0, and nothing unprintable: advertised text is untrusted and ends
/// up in API objects and on an administrator's terminal.
fn valid_endpoint(endpoint: &str) -> bool {
    let Some(rest) = endpoint.strip_prefix("https://") else {
        return false;
    };
    if !endpoint.chars().all(|c| c.is_ascii_graphic()) {
        return false;
    }
    let authority = rest.split('/').next().unwrap_or_default();
    let (host, port): (Option<&str>, Option<&str>) = match authority.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((h, after)) if h.parse::<std::net::Ipv6Addr>().is_ok() => {
                match after.strip_prefix(':') {
                    Some(p) => (None, Some(p)),
                    None if after.is_empty() => (None, None),
                    None => return false,
                }
            }
            _ => return false,
        },
        None => match authority.rsplit_once(':') {
            Some((h, p)) => (Some(h), Some(p)),
            None => (Some(authority), None),
        },
    };
    let port_ok = port.is_none_or(|p| p.parse::<u16>().is_ok_and(|p| p != 0));
    let host_ok = host.is_none_or(|h| {
        h.parse::<std::net::Ipv4Addr>().is_ok()
            || (!h.is_empty()
                && h.len() <= 253
                && h.trim_end_matches('.').split('.').all(|l| {
                    !l.is_empty()
                        && l.len() <= 63
                        && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                        && !l.starts_with('-')
                        && !l.ends_with('-')
                }))
    });
    port_ok && host_ok
}

/// Whether `domain` (a trailing dot allowed) is a DNS domain name records can go under.
pub fn valid_domain(domain: &str) -> bool {
    let d = domain.strip_suffix('.').unwrap_or(domain);
    !d.is_empty()
        && d.len() <= 253
        && d.split('.')
            .all(tandem_apimachinery::validation::is_dns1123_label)
}

impl Advertisement {
    /// The TXT record's strings (`key=value`, RFC 6763 §6), in a fixed order.
    pub fn txt(&self) -> Vec<String> {
        let mut out = vec![
            format!("id={}", self.cluster_id),
            format!("v={}", self.protocol_version),
            format!("endpoint={}", self.endpoint),
            format!("fp={}", self.ca_fingerprint),
        ];
        if let Some(r) = &self.region {
            out.push(format!("region={r}"));
        }
        if let Some(z) = &self.zone {
            out.push(format!("zone={z}"));
        }
        if let Some(e) = &self.enroll {
            out.push(format!("enroll={e}"));
        }
        out
    }

    /// Reads the TXT record's strings (unknown keys are ignored, as RFC 6763 asks).
    pub fn from_txt<S: AsRef<str>>(strings: &[S]) -> Result<Advertisement, DiscoveryError> {
        // Keys are case-insensitive and the first of a repeated key counts (RFC 6763 §6.4).
        let mut map: BTreeMap<String, &str> = BTreeMap::new();
        for (key, value) in strings.iter().filter_map(|s| s.as_ref().split_once('=')) {
            map.entry(key.to_ascii_lowercase()).or_insert(value);
        }
        let get = |k: &'static str| map.get(k).copied().ok_or(DiscoveryError::Missing(k));
        let cluster_id = get("id")?.to_string();
        // As `tandem_api::names::validate_cluster_id` wants (core stays below the API crate):
        // a DNS label of at most 40 characters, which names the DNS-SD instance too.
        let label = cluster_id.len() <= 40
            && tandem_apimachinery::validation::is_dns1123_label(&cluster_id);
        if !label {
            return Err(DiscoveryError::Invalid {
                key: "id",
                value: cluster_id,
                why: "not a cluster ID (a DNS label of at most 40 characters)".into(),
            });
        }
        let version = get("v")?;
        let protocol_version = version.parse().map_err(|_| DiscoveryError::Invalid {
            key: "v",
            value: version.to_string(),
            why: "not a version number".into(),
        })?;
        let endpoint = get("endpoint")?.to_string();
        if !valid_endpoint(&endpoint) {
            return Err(DiscoveryError::Invalid {
                key: "endpoint",
                value: endpoint,
                why: "not https://HOST[:PORT][/PATH] (printable, no spaces)".into(),
            });
        }
        for key in ["region", "zone"] {
            if let Some(v) = map.get(key)
                && !is_label_value(v)
            {
                return Err(DiscoveryError::Invalid {
                    key: if key == "region" { "region" } else { "zone" },
                    value: v.to_string(),
                    why: "not a label value (at most 63 letters, digits, '-', '_', '.')".into(),
                });
            }
        }
        let ca_fingerprint = parse_fingerprint(get("fp")?)?;
        let enroll = map.get("enroll").map(|s| s.to_string());
        if let Some(e) = &enroll
            && !crate::invite::valid_bearer_token(e)
        {
            return Err(DiscoveryError::Invalid {
                key: "enroll",
                value: e.clone(),
                why: "not a bootstrap token (<6 characters>.<16 characters>, a-z and 0-9)".into(),
            });
        }
        Ok(Advertisement {
            enroll,
            cluster_id,
            endpoint,
            ca_fingerprint,
            protocol_version,
            region: map.get("region").map(|s| s.to_string()),
            zone: map.get("zone").map(|s| s.to_string()),
        })
    }

    /// The endpoint's host and port (443 when it names none).
    pub fn host_port(&self) -> Option<(String, u16)> {
        let rest = self.endpoint.strip_prefix("https://")?;
        let authority = rest.split('/').next()?;
        if let Some(v6) = authority.strip_prefix('[') {
            let (host, after) = v6.split_once(']')?;
            let port = after
                .strip_prefix(':')
                .map_or(Some(443), |p| p.parse().ok())?;
            return Some((host.to_string(), port));
        }
        match authority.rsplit_once(':') {
            Some((host, port)) => Some((host.to_string(), port.parse().ok()?)),
            None => Some((authority.to_string(), 443)),
        }
    }

    /// The zone-file lines to publish under `_tandem._tcp.<domain>`: a PTR naming this
    /// cluster's instance, its SRV (the API endpoint's host and port; an IP address endpoint
    /// needs an A/AAAA record of `target` too, which the caller says) and its TXT.
    pub fn zone_records(&self, domain: &str, ttl: u32) -> Vec<String> {
        let domain = domain.trim_end_matches('.');
        let instance = format!("{}.{SERVICE}.{domain}.", self.cluster_id);
        let (host, port) = self.host_port().unwrap_or_default();
        let target = if host.parse::<std::net::IpAddr>().is_ok() {
            format!("{}.{domain}.", self.cluster_id)
        } else {
            format!("{}.", host.trim_end_matches('.'))
        };
        let txt = self
            .txt()
            .iter()
            .map(|s| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\"")))
            .collect::<Vec<_>>()
            .join(" ");
        let mut out = vec![
            format!("{SERVICE}.{domain}. {ttl} IN PTR {instance}"),
            format!("{instance} {ttl} IN SRV 0 0 {port} {target}"),
            format!("{instance} {ttl} IN TXT {txt}"),
        ];
        if let Ok(ip) = host.parse::<std::net::IpAddr>() {
            let kind = if ip.is_ipv4() { "A" } else { "AAAA" };
            out.push(format!("{target} {ttl} IN {kind} {ip}"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn milan() -> Advertisement {
        Advertisement {
            cluster_id: "milan".into(),
            endpoint: "https://api.milan.example.org:6443".into(),
            ca_fingerprint: fingerprint(b"milan's CA"),
            protocol_version: crate::protocol::VERSION,
            region: Some("eu-south".into()),
            zone: None,
            enroll: Some("abcdef.0123456789abcdef".into()),
        }
    }

    #[test]
    fn an_enrollment_credential_must_be_a_bootstrap_token() {
        let ad = milan();
        assert_eq!(Advertisement::from_txt(&ad.txt()), Ok(ad.clone()));
        let without = Advertisement {
            enroll: None,
            ..ad.clone()
        };
        assert_eq!(Advertisement::from_txt(&without.txt()), Ok(without));
        for bad in [
            "abcdef",
            "abcdef.short",
            "ABCDEF.0123456789abcdef",
            "abc.0123456789abcdef",
        ] {
            let mut txt = ad.txt();
            txt.retain(|s| !s.starts_with("enroll="));
            txt.push(format!("enroll={bad}"));
            assert!(
                matches!(
                    Advertisement::from_txt(&txt),
                    Err(DiscoveryError::Invalid { key: "enroll", .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn fingerprints_as_openssl_prints_them_are_read_in_any_form() {
        let fp = fingerprint(b"x");
        assert_eq!(
            fp,
            "sha256:2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"
        );
        let hex = fp.strip_prefix("sha256:").unwrap().to_ascii_uppercase();
        let colons = hex
            .as_bytes()
            .chunks(2)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect::<Vec<_>>()
            .join(":");
        for typed in [
            fp.clone(),
            hex.clone(),
            colons.clone(),
            format!("SHA256:{colons}"),
        ] {
            assert_eq!(parse_fingerprint(&typed), Ok(fp.clone()), "{typed}");
        }
        for bad in ["", "sha256:", "sha1:ab", &hex[..62], &format!("{hex}00")] {
            assert!(parse_fingerprint(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn txt_round_trips_and_refuses_what_it_cannot_trust() {
        assert_eq!(Advertisement::from_txt(&milan().txt()), Ok(milan()));
        // Unknown keys are ignored; a missing or bad one is named.
        let mut more = milan().txt();
        more.push("future=1".into());
        assert_eq!(Advertisement::from_txt(&more), Ok(milan()));
        // Keys in any case; the first of a repeated key counts.
        let mut shouted: Vec<String> = milan()
            .txt()
            .into_iter()
            .map(|s| match s.split_once('=') {
                Some((k, v)) => format!("{}={v}", k.to_ascii_uppercase()),
                None => s,
            })
            .collect();
        shouted.push("id=paris".into());
        assert_eq!(Advertisement::from_txt(&shouted), Ok(milan()));
        let without = |key: &str| -> Vec<String> {
            milan()
                .txt()
                .into_iter()
                .filter(|s| !s.starts_with(&format!("{key}=")))
                .collect()
        };
        assert_eq!(
            Advertisement::from_txt(&without("fp")),
            Err(DiscoveryError::Missing("fp"))
        );
        let with = |key: &str, value: &str| -> Vec<String> {
            let mut v = without(key);
            v.push(format!("{key}={value}"));
            v
        };
        // Advertised text is untrusted: it reaches API objects and terminals.
        for bad in [
            "http://x",
            "https://",
            "https://a_b",
            "https://a:0",
            "https://a:99999",
            "https://a/\u{1b}[2J",
            "https://a b",
            "https://[zz]:443",
        ] {
            assert!(
                Advertisement::from_txt(&with("endpoint", bad)).is_err(),
                "{bad:?}"
            );
        }
        for good in [
            "https://api.milan.example.org",
            "https://198.18.1.2:6443",
            "https://[2001:db8::1]:6443/k8s",
        ] {
            assert!(
                Advertisement::from_txt(&with("endpoint", good)).is_ok(),
                "{good:?}"
            );
        }
        for bad in ["\u{1b}]0;pwned\u{7}", "a b", &"x".repeat(64), "-a"] {
            assert!(
                Advertisement::from_txt(&with("region", bad)).is_err(),
                "{bad:?}"
            );
            assert!(
                Advertisement::from_txt(&with("zone", bad)).is_err(),
                "{bad:?}"
            );
        }
        assert!(Advertisement::from_txt(&with("id", "Not/An/ID")).is_err());
        assert!(Advertisement::from_txt(&with("v", "one")).is_err());
        assert!(Advertisement::from_txt(&with("fp", "sha256:00")).is_err());
    }

    #[test]
    fn zone_records_name_the_instance_its_endpoint_and_txt() {
        let records = milan().zone_records("example.org.", 300);
        assert_eq!(
            records[..2],
            [
                "_tandem._tcp.example.org. 300 IN PTR milan._tandem._tcp.example.org.".to_string(),
                "milan._tandem._tcp.example.org. 300 IN SRV 0 0 6443 api.milan.example.org."
                    .to_string(),
            ]
        );
        assert!(
            records[2]
                .starts_with("milan._tandem._tcp.example.org. 300 IN TXT \"id=milan\" \"v=1\"")
        );
        assert_eq!(records.len(), 3);
        // An address endpoint gets a host name in the domain, with its A record.
        let mut by_ip = milan();
        by_ip.endpoint = "https://198.51.100.7".into();
        let records = by_ip.zone_records("example.org", 60);
        assert!(
            records[1].ends_with("IN SRV 0 0 443 milan.example.org."),
            "{records:?}"
        );
        assert_eq!(records[3], "milan.example.org. 60 IN A 198.51.100.7");
    }

    #[test]
    fn domains() {
        for ok in ["example.org", "example.org.", "a.b-c.d"] {
            assert!(valid_domain(ok), "{ok}");
        }
        for bad in ["", ".", "Example.org", "a..b", "-a.org", "a_b.org"] {
            assert!(!valid_domain(bad), "{bad}");
        }
    }
}
