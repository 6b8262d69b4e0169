//! What a controller writes for a gateway and reads back from it, without the data plane:
//! WireGuard keys ([`keys`]), the gateway's configuration ([`GatewayArgs`]) and its status
//! document ([`status`]). The controller depends on this crate, not on `tandem-net` (boringtun,
//! TUN, netlink): it generates keys and renders configurations, it never runs a tunnel.
//!
//! The gateway (`tandem-net`) validates the same [`GatewayArgs`] with [`GatewayArgs::validate`]
//! before decoding them into its own configuration, so both sides read one format.

pub mod gateway;
pub mod keys;
pub mod status;

pub use gateway::{GatewayArgs, default_nft_table};
pub use keys::{generate_private_key, public_key};
pub use status::{GatewayStatus, TunnelState};

/// A gateway configuration (or a key in it) that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("gateway config: {field}: {reason}")]
pub struct SpecError {
    /// Which field, as spelled in the file (`privateKey`, `mtu`, `file`).
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

impl SpecError {
    pub(crate) fn new(field: &'static str, reason: impl Into<String>) -> Self {
        SpecError {
            field,
            reason: reason.into(),
        }
    }
}
