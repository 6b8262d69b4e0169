//! The connected fabric, control-plane side: this cluster's WireGuard key for each peer, and
//! ([`gateway`]) the gateway and node agent that use it. One key per peer cluster, whichever the
//! direction of the peerings (A→B and B→A share one tunnel): it lives in the Secret
//! `tandem-system/tandem-gateway-<peer>`, generated on first need and never sent anywhere;
//! only its public key travels, in this side's `NetworkParameters`. It goes when no peering
//! with that cluster is left in either direction.

pub mod gateway;
pub mod keys;

pub use gateway::forget_peer;
pub use keys::*;
