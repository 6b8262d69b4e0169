//! The gateway's configuration as a file (TOML or JSON) or a controller writes it:
//! [`GatewayArgs`], and [`GatewayArgs::check`], the validation both the controller's tests and
//! the gateway apply before anything runs.

use std::net::SocketAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};
use tandem_core::nat::{NatPlan, NatPlanInput};

use crate::SpecError;
use crate::keys::decode_key;

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

/// What [`GatewayArgs::check`] decoded: the keys' bytes, the NAT plan and the table's name.
#[derive(Debug, Clone)]
pub struct Checked {
    /// Our X25519 private key.
    pub private_key: [u8; 32],
    /// The peer's X25519 public key.
    pub peer_public_key: [u8; 32],
    /// The NAT plan computed from [`GatewayArgs::nat`].
    pub plan: NatPlan,
    /// The nftables table the gateway owns ([`GatewayArgs::nft_table`] or its default).
    pub nft_table: String,
}

impl GatewayArgs {
    /// Reads a TOML (or, with a `.json` extension, JSON) file.
    pub fn from_file(path: &Path) -> Result<Self, SpecError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| SpecError::new("file", format!("reading {}: {e}", path.display())))?;
        let parsed = if path.extension().is_some_and(|e| e == "json") {
            serde_json::from_str(&text).map_err(|e| e.to_string())
        } else {
            toml::from_str(&text).map_err(|e| e.to_string())
        };
        parsed.map_err(|reason| SpecError::new("file", format!("{}: {reason}", path.display())))
    }

    /// Validates every field and decodes the keys and the NAT plan; the first field found
    /// wrong is named in the error.
    pub fn check(&self) -> Result<Checked, SpecError> {
        if self.interface.is_empty() || self.interface.len() > 15 {
            return Err(SpecError::new(
                "interface",
                format!("{:?} must be 1 to 15 bytes", self.interface),
            ));
        }
        if !(1280..=9000).contains(&self.mtu) {
            return Err(SpecError::new(
                "mtu",
                format!("{} is outside 1280..=9000", self.mtu),
            ));
        }
        if self.probe_interval_ms == 0 || self.probe_timeout_ms < self.probe_interval_ms {
            return Err(SpecError::new(
                "probeTimeoutMs",
                format!(
                    "{} must be at least probeIntervalMs ({}), which must be positive",
                    self.probe_timeout_ms, self.probe_interval_ms
                ),
            ));
        }
        let private_key = decode_key("privateKey", &self.private_key)?;
        let peer_public_key = decode_key("peerPublicKey", &self.peer_public_key)?;
        let plan = NatPlan::build(&self.nat).map_err(|e| SpecError::new("nat", e.to_string()))?;
        let nft_table = self
            .nft_table
            .clone()
            .unwrap_or_else(|| default_nft_table(&self.interface));
        for legacy in &self.legacy_interfaces {
            if legacy.is_empty() || legacy.len() > 15 || *legacy == self.interface {
                return Err(SpecError::new(
                    "legacyInterfaces",
                    format!("{legacy:?} must be 1 to 15 bytes and not the interface itself"),
                ));
            }
        }
        for legacy in &self.legacy_nft_tables {
            if !is_nft_identifier(legacy) || *legacy == nft_table {
                return Err(SpecError::new(
                    "legacyNftTables",
                    format!("{legacy:?} must be an nftables identifier and not the table itself"),
                ));
            }
        }
        Ok(Checked {
            private_key,
            peer_public_key,
            plan,
            nft_table,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{generate_private_key, public_key};

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
    fn file_form_checks_with_defaults() {
        let args = args();
        assert_eq!(args.mtu, 1420);
        assert_eq!(args.persistent_keepalive_secs, 25);
        let checked = args.check().unwrap();
        assert_eq!(checked.nft_table, "tandem_tdm_a");
        assert_eq!(checked.plan.snat_to_tunnel.len(), 1);
    }

    #[test]
    fn invalid_args_table() {
        type Edit = fn(&mut GatewayArgs);
        let cases: [(&str, Edit, &str); 9] = [
            ("long name", |a| a.interface = "x".repeat(16), "interface"),
            (
                "tiny mtu",
                |a| a.mtu = 500,
                "mtu: 500 is outside 1280..=9000",
            ),
            (
                "probe timeout below the interval",
                |a| a.probe_timeout_ms = 100,
                "probeTimeoutMs: 100 must be at least probeIntervalMs (500)",
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
            let err = a.check().unwrap_err().to_string();
            assert!(err.contains(want), "{name}: {err}");
        }
    }

    #[test]
    fn a_missing_file_is_named() {
        let unknown = GatewayArgs::from_file(Path::new("/nonexistent.toml")).unwrap_err();
        assert!(
            unknown.to_string().contains("/nonexistent.toml"),
            "{unknown}"
        );
    }
}
