//! The gateway's validated configuration: [`GatewayArgs`] (the plain, serialisable form a
//! file or a controller fills, defined in `tandem-netspec`) checked and decoded into keys and a
//! NAT plan.

use std::net::SocketAddr;
use std::time::Duration;

use boringtun::x25519::{PublicKey, StaticSecret};
use tandem_core::nat::NatPlan;
pub use tandem_netspec::gateway::{GatewayArgs, default_nft_table};
pub use tandem_netspec::keys::{generate_private_key, public_key};

use crate::GatewayError;

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
                &tandem_netspec::keys::encode_key(self.peer_public_key.as_bytes()),
            )
            .field("peer_endpoint", &self.peer_endpoint)
            .field("mtu", &self.mtu)
            .field("plan", &self.plan)
            .finish_non_exhaustive()
    }
}

impl TryFrom<GatewayArgs> for GatewayConfig {
    type Error = GatewayError;

    /// Validates and decodes ([`GatewayArgs::check`]).
    fn try_from(args: GatewayArgs) -> Result<Self, GatewayError> {
        let checked = args.check()?;
        Ok(GatewayConfig {
            interface: args.interface,
            listen: args.listen,
            private_key: StaticSecret::from(checked.private_key),
            peer_public_key: PublicKey::from(checked.peer_public_key),
            peer_endpoint: args.peer_endpoint,
            persistent_keepalive: (args.persistent_keepalive_secs > 0)
                .then_some(args.persistent_keepalive_secs),
            mtu: args.mtu,
            plan: checked.plan,
            status_listen: args.status_listen,
            probe_interval: Duration::from_millis(args.probe_interval_ms),
            probe_timeout: Duration::from_millis(args.probe_timeout_ms),
            nft_table: checked.nft_table,
            allowed_destinations: args.allowed_destinations,
            legacy_interfaces: args.legacy_interfaces,
            legacy_nft_tables: args.legacy_nft_tables,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// The documented example (`gateway.example.toml`); the file form's defaults and every
    /// refusal are tested where the format lives (`tandem-netspec`).
    fn example() -> GatewayArgs {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("gateway.example.toml");
        GatewayArgs::from_file(&path).unwrap()
    }

    #[test]
    fn example_file_is_valid() {
        let cfg = GatewayConfig::try_from(example()).unwrap();
        assert_eq!(cfg.interface, "tandem-milan");
        assert_eq!(cfg.nft_table, "tandem_tandem_milan");
        assert_eq!(cfg.plan.unknown_source.to.to_string(), "10.129.0.0");
        assert_eq!(cfg.persistent_keepalive, Some(25));
        let debug = format!("{cfg:?}");
        assert!(
            !debug.contains(&example().private_key),
            "private key must not be printed"
        );
    }

    #[test]
    fn invalid_args_are_refused_with_their_field() {
        let mut a = example();
        a.mtu = 500;
        let err = GatewayConfig::try_from(a).unwrap_err().to_string();
        assert!(
            err.contains("gateway config: mtu: 500 is outside 1280..=9000"),
            "{err}"
        );
    }
}
