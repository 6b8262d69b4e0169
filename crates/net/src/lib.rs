//! Tandem's network data plane: a per-peer userspace WireGuard gateway (boringtun's noise
//! protocol over a TUN device and one UDP socket), the NAT plan rendered to nftables,
//! routes over rtnetlink, and tunnel health. Never depends on kube.
//!
//! Entry point: [`run_gateway`] with a [`GatewayConfig`], usually from
//! `GatewayArgs::from_file` (see `gateway.example.toml`); the `tandem-gateway` binary does
//! exactly that. Needs CAP_NET_ADMIN, `/dev/net/tun` and the `nft` binary.
//!
//! Why boringtun 0.7 (crates.io) and not a fork: its `noise` module is sans-IO and stable,
//! and it is what the rest of the ecosystem packages; the one maintained fork on crates.io
//! (Mullvad's gotatun) requires Rust 1.95, above the workspace MSRV, and its speed-ups are in
//! the device layer, which Tandem replaces with its own batched data path anyway.

pub mod config;
pub mod gateway;
pub mod health;
pub mod legacy;
pub mod nft;
pub mod packet;
pub mod route;
pub mod status;

pub use config::{GatewayArgs, GatewayConfig, generate_private_key, public_key};
pub use gateway::{run_gateway, run_gateway_until};
pub use tandem_netspec::SpecError;

/// What to do about a TUN device that could not be opened for want of `/dev/net/tun`: no
/// container runtime creates it, a pod mounts the node's.
fn tun_hint(e: &std::io::Error) -> &'static str {
    if e.kind() == std::io::ErrorKind::NotFound {
        " (/dev/net/tun is missing: in a pod, mount the node's with a hostPath volume of \
         type CharDevice; on a host, load the tun module)"
    } else {
        ""
    }
}

/// Why the gateway could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// A configuration field is invalid.
    #[error(transparent)]
    Config(#[from] SpecError),
    /// Creating or configuring the TUN device failed.
    #[error("TUN device `{interface}`: {source}{}", tun_hint(source))]
    Tun {
        /// Interface name.
        interface: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The UDP socket failed.
    #[error("UDP socket {addr}: {source}")]
    Udp {
        /// The listen address.
        addr: std::net::SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// Applying the NAT rules failed.
    #[error("nftables table `{table}`: {source}")]
    Nft {
        /// Table name.
        table: String,
        /// The failure.
        source: nft::NftError,
    },
    /// Installing routes failed.
    #[error("routes: {0}")]
    Route(#[from] route::RouteError),
    /// The status API could not listen.
    #[error("status API {addr}: {source}")]
    Status {
        /// The listen address.
        addr: std::net::SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// A data-path task stopped (it only does on a bug).
    #[error("gateway task ended unexpectedly: {0}")]
    TaskEnded(String),
    /// What an earlier version left under other names could not be removed.
    #[error(transparent)]
    Legacy(#[from] legacy::LegacyError),
    /// A sysctl could not be written.
    #[error("sysctl {name}: {source}")]
    Sysctl {
        /// The sysctl path.
        name: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_tun_device_says_how_a_pod_gets_it() {
        let missing = GatewayError::Tun {
            interface: "tdm0".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        let said = missing.to_string();
        assert!(
            said.starts_with("TUN device `tdm0`: ")
                && said.contains("hostPath volume of type CharDevice"),
            "{said}"
        );
        let denied = GatewayError::Tun {
            interface: "tdm0".into(),
            source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        };
        assert!(!denied.to_string().contains("hostPath"), "{denied}");
    }
}
