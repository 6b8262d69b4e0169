//! Gateway configuration: [`GatewayArgs`] is the plain, serialisable form (a file or a
//! controller fills it), [`GatewayConfig`] the validated one with decoded keys and NAT plan.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use boringtun::x25519::{PublicKey, StaticSecret};
use serde::{Deserialize, Serialize};
use tandem_core::nat::{NatPlan, NatPlanInput};

use crate::GatewayError;

/// Gateway parameters as written in a file (TOML or JSON) or by a controller.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GatewayArgs {
    /// Name of the TUN interface to create (at most 15 bytes).
    pub interface: String,
    /// UDP address WireGuard listens on.
    pub listen: SocketAddr,
    /// Our X25519 private key, base64.
    pub private_key: String,
    /// The peer's X25519 public key, base64.
    pub peer_public_key: String,
    /// The peer's UDP endpoint; optional on the side that waits to be contacted.
    #[serde(default)]
    pub peer_endpoint: Option<SocketAddr>,
    /// Seconds between keepalives while idle (0 disables them).
    #[serde(default = "default_keepalive")]
    pub persistent_keepalive_secs: u16,
    /// MTU of the TUN interface; 1420 leaves room for IPv6 + UDP + WireGuard headers on 1500.
    #[serde(default = "default_mtu")]
    pub mtu: u16,
    /// Prefixes of both sides, from which the NAT plan is computed.
    pub nat: NatPlanInput,
    /// Address of the status API (`/status`, `/metrics`); none disables it.
    #[serde(default)]
    pub status_listen: Option<SocketAddr>,
    /// Milliseconds between tunnel probes.
    #[serde(default = "default_probe_interval")]
    pub probe_interval_ms: u64,
    /// Milliseconds without a probe reply after which the tunnel is reported lost.
    #[serde(default = "default_probe_timeout")]
    pub probe_timeout_ms: u64,
    /// nftables table (family inet) the gateway owns; defaults to `tandem_<interface>`.
    #[serde(default)]
    pub nft_table: Option<String>,
    /// Least exposure: the local destinations (real addresses) the peer may open connections
    /// to through the tunnel; replies to connections opened from this side always pass. None
    /// lets the peer reach everything its routes lead to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_destinations: Option<Vec<ipnet::IpNet>>,
    /// Interfaces an earlier version named this same gateway by. A hostNetwork gateway killed
    /// during an upgrade leaves its device and table on the node, so the gateway removes them
    /// when it starts; never the current names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub legacy_interfaces: Vec<String>,
    /// nftables tables (family inet) an earlier version named this same gateway's table by,
    /// removed at start like [`Self::legacy_interfaces`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub legacy_nft_tables: Vec<String>,
}

fn default_keepalive() -> u16 {
    25
}
fn default_mtu() -> u16 {
    1420
}
fn default_probe_interval() -> u64 {
    500
}
fn default_probe_timeout() -> u64 {
    1500
}

/// A validated configuration, ready for [`crate::run_gateway`].
#[derive(Clone)]
pub struct GatewayConfig {
    /// TUN interface name.
    pub interface: String,
    /// UDP listen address.
    pub listen: SocketAddr,
    /// Our private key.
    pub private_key: StaticSecret,
    /// The peer's public key.
    pub peer_public_key: PublicKey,
    /// Initial peer endpoint (updated by roaming).
    pub peer_endpoint: Option<SocketAddr>,
    /// Keepalive interval, if any.
    pub persistent_keepalive: Option<u16>,
    /// TUN MTU.
    pub mtu: u16,
    /// The NAT plan.
    pub plan: NatPlan,
    /// Status API address.
    pub status_listen: Option<SocketAddr>,
    /// Probe period.
    pub probe_interval: Duration,
    /// Probe loss timeout.
    pub probe_timeout: Duration,
    /// nftables table name.
    pub nft_table: String,
    /// What the peer may open connections to (None: everything).
    pub allowed_destinations: Option<Vec<ipnet::IpNet>>,
    /// Interfaces left by earlier versions, removed at start.
    pub legacy_interfaces: Vec<String>,
    /// nftables tables left by earlier versions, removed at start.
    pub legacy_nft_tables: Vec<String>,
}

impl std::fmt::Debug for GatewayConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The private key is deliberately left out.
        f.debug_struct("GatewayConfig")
            .field("interface", &self.interface)
            .field("listen", &self.listen)
            .field(
                "peer_public_key",
                &encode_key(self.peer_public_key.as_bytes()),
            )
            .field("peer_endpoint", &self.peer_endpoint)
            .field("mtu", &self.mtu)
            .field("plan", &self.plan)
            .finish_non_exhaustive()
    }
}

impl GatewayArgs {
    /// Reads a TOML (or, with a `.json` extension, JSON) file.
    pub fn from_file(path: &Path) -> Result<Self, GatewayError> {
        let text = std::fs::read_to_string(path).map_err(|e| GatewayError::Config {
            field: "file",
            reason: format!("reading {}: {e}", path.display()),
        })?;
        let parsed = if path.extension().is_some_and(|e| e == "json") {
            serde_json::from_str(&text).map_err(|e| e.to_string())
        } else {
            toml::from_str(&text).map_err(|e| e.to_string())
        };
        parsed.map_err(|reason| GatewayError::Config {
            field: "file",
            reason: format!("{}: {reason}", path.display()),
        })
    }

    /// Validates and decodes.
    pub fn into_config(self) -> Result<GatewayConfig, GatewayError> {
        if self.interface.is_empty() || self.interface.len() > 15 {
            return Err(GatewayError::Config {
                field: "interface",
                reason: format!("{:?} must be 1 to 15 bytes", self.interface),
            });
        }
        if !(1280..=9000).contains(&self.mtu) {
            return Err(GatewayError::Config {
                field: "mtu",
                reason: format!("{} is outside 1280..=9000", self.mtu),
            });
        }
        if self.probe_interval_ms == 0 || self.probe_timeout_ms < self.probe_interval_ms {
            return Err(GatewayError::Config {
                field: "probeTimeoutMs",
                reason: format!(
                    "{} must be at least probeIntervalMs ({}), which must be positive",
                    self.probe_timeout_ms, self.probe_interval_ms
                ),
            });
        }
        let private_key = StaticSecret::from(decode_key("privateKey", &self.private_key)?);
        let peer_public_key = PublicKey::from(decode_key("peerPublicKey", &self.peer_public_key)?);
        let plan = NatPlan::build(&self.nat).map_err(|e| GatewayError::Config {
            field: "nat",
            reason: e.to_string(),
        })?;
        let nft_table = self
            .nft_table
            .unwrap_or_else(|| default_nft_table(&self.interface));
        for legacy in &self.legacy_interfaces {
            if legacy.is_empty() || legacy.len() > 15 || *legacy == self.interface {
                return Err(GatewayError::Config {
                    field: "legacyInterfaces",
                    reason: format!(
                        "{legacy:?} must be 1 to 15 bytes and not the interface itself"
                    ),
                });
            }
        }
        for legacy in &self.legacy_nft_tables {
            if !is_nft_identifier(legacy) || *legacy == nft_table {
                return Err(GatewayError::Config {
                    field: "legacyNftTables",
                    reason: format!(
                        "{legacy:?} must be an nftables identifier and not the table itself"
                    ),
                });
            }
        }
        Ok(GatewayConfig {
            interface: self.interface,
            listen: self.listen,
            private_key,
            peer_public_key,
            peer_endpoint: self.peer_endpoint,
            persistent_keepalive: (self.persistent_keepalive_secs > 0)
                .then_some(self.persistent_keepalive_secs),
            mtu: self.mtu,
            plan,
            status_listen: self.status_listen,
            probe_interval: Duration::from_millis(self.probe_interval_ms),
            probe_timeout: Duration::from_millis(self.probe_timeout_ms),
            nft_table,
            allowed_destinations: self.allowed_destinations,
            legacy_interfaces: self.legacy_interfaces,
            legacy_nft_tables: self.legacy_nft_tables,
        })
    }
}

/// The nftables table a gateway owns unless told otherwise: `tandem_` and its interface
/// (`-` becomes `_`, which nftables identifiers do not allow).
pub fn default_nft_table(interface: &str) -> String {
    format!("tandem_{}", interface.replace('-', "_"))
}

/// A letter, then letters, digits, `_` or `.` (what `nft` accepts unquoted), at most 255 bytes.
fn is_nft_identifier(name: &str) -> bool {
    name.len() < 256
        && name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
}

fn decode_key(field: &'static str, text: &str) -> Result<[u8; 32], GatewayError> {
    let bytes = B64.decode(text.trim()).map_err(|e| GatewayError::Config {
        field,
        reason: format!("not base64: {e}"),
    })?;
    bytes.try_into().map_err(|b: Vec<u8>| GatewayError::Config {
        field,
        reason: format!("decodes to {} bytes, want 32", b.len()),
    })
}

fn encode_key(bytes: &[u8; 32]) -> String {
    B64.encode(bytes)
}

/// A new random private key, base64 (like `wg genkey`).
pub fn generate_private_key() -> String {
    let bytes: [u8; 32] = rand::random();
    encode_key(&StaticSecret::from(bytes).to_bytes())
}

/// The public key of a base64 private key (like `wg pubkey`).
pub fn public_key(private_key: &str) -> Result<String, GatewayError> {
    let secret = StaticSecret::from(decode_key("privateKey", private_key)?);
    Ok(encode_key(PublicKey::from(&secret).as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> GatewayArgs {
        let toml = format!(
            r#"
interface = "tdm-a"
listen = "0.0.0.0:51820"
privateKey = "{}"
peerPublicKey = "{}"
peerEndpoint = "192.0.2.2:51820"
[nat.local]
podCidr = "10.244.0.0/16"
externalCidr = "10.70.0.0/16"
[nat.localAsSeenByPeer]
podCidr = "10.0.0.0/16"
externalCidr = "10.1.0.0/16"
[nat.peerAsSeenLocally]
podCidr = "10.2.0.0/16"
externalCidr = "10.3.0.0/16"
"#,
            generate_private_key(),
            public_key(&generate_private_key()).unwrap()
        );
        toml::from_str(&toml).unwrap()
    }

    #[test]
    fn file_form_decodes_with_defaults() {
        let cfg = args().into_config().unwrap();
        assert_eq!(cfg.mtu, 1420);
        assert_eq!(cfg.persistent_keepalive, Some(25));
        assert_eq!(cfg.nft_table, "tandem_tdm_a");
        assert_eq!(cfg.plan.snat_to_tunnel.len(), 1);
        assert!(cfg.legacy_interfaces.is_empty() && cfg.legacy_nft_tables.is_empty());
        let debug = format!("{cfg:?}");
        assert!(
            !debug.contains(&args().private_key),
            "private key must not be printed"
        );
    }

    #[test]
    fn invalid_args_table() {
        type Edit = fn(&mut GatewayArgs);
        let cases: [(&str, Edit, &str); 8] = [
            ("long name", |a| a.interface = "x".repeat(16), "interface"),
            (
                "tiny mtu",
                |a| a.mtu = 500,
                "mtu: 500 is outside 1280..=9000",
            ),
            (
                "bad key",
                |a| a.private_key = "YWJj".into(),
                "privateKey: decodes to 3 bytes, want 32",
            ),
            (
                "not base64",
                |a| a.peer_public_key = "***".into(),
                "peerPublicKey: not base64",
            ),
            (
                "bad plan",
                |a| a.nat.local.pod_cidr = "10.244.0.1/16".parse().unwrap(),
                "nat: local.podCIDR: prefix 10.244.0.1/16 has host bits set",
            ),
            // A legacy name equal to the current one would remove the gateway's own state.
            (
                "legacy interface is the interface",
                |a| a.legacy_interfaces = vec!["tdm-a".into()],
                "legacyInterfaces: \"tdm-a\" must be 1 to 15 bytes and not the interface",
            ),
            (
                "legacy table is the table",
                |a| a.legacy_nft_tables = vec!["tandem_tdm_a".into()],
                "legacyNftTables: \"tandem_tdm_a\" must be an nftables identifier and not",
            ),
            (
                "legacy table is no identifier",
                |a| a.legacy_nft_tables = vec!["x; flush ruleset".into()],
                "legacyNftTables: \"x; flush ruleset\" must be an nftables identifier",
            ),
        ];
        for (name, edit, want) in cases {
            let mut a = args();
            edit(&mut a);
            let err = a.into_config().unwrap_err().to_string();
            assert!(err.contains(want), "{name}: {err}");
        }
    }

    #[test]
    fn example_file_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("gateway.example.toml");
        let cfg = GatewayArgs::from_file(&path)
            .unwrap()
            .into_config()
            .unwrap();
        assert_eq!(cfg.interface, "tandem-milan");
        assert_eq!(cfg.nft_table, "tandem_tandem_milan");
        assert_eq!(cfg.plan.unknown_source.to.to_string(), "10.129.0.0");
        let unknown = GatewayArgs::from_file(Path::new("/nonexistent.toml")).unwrap_err();
        assert!(
            unknown.to_string().contains("/nonexistent.toml"),
            "{unknown}"
        );
    }

    #[test]
    fn public_key_matches_known_vector() {
        // RFC 7748 §6.1: Alice's private and public key.
        let private = B64.encode([
            0x77, 0x07, 0x6d, 0x0a, 0x73, 0x18, 0xa5, 0x7d, 0x3c, 0x16, 0xc1, 0x72, 0x51, 0xb2,
            0x66, 0x45, 0xdf, 0x4c, 0x2f, 0x87, 0xeb, 0xc0, 0x99, 0x2a, 0xb1, 0x77, 0xfb, 0xa5,
            0x1d, 0xb9, 0x2c, 0x2a,
        ]);
        let public = B64.encode([
            0x85, 0x20, 0xf0, 0x09, 0x89, 0x30, 0xa7, 0x54, 0x74, 0x8b, 0x7d, 0xdc, 0xb4, 0x3e,
            0xf7, 0x5a, 0x0d, 0xbf, 0x3a, 0x0d, 0x26, 0x38, 0x1a, 0xf4, 0xeb, 0xa4, 0xa9, 0x8e,
            0xaa, 0x9b, 0x4e, 0x6a,
        ]);
        assert_eq!(public_key(&private).unwrap(), public);
    }
}
