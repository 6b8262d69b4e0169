//! The document a gateway's status API serves at `/status`, which the consumer's virtual node
//! reads to set its NetworkUnavailable condition.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// What a controller needs to know about the tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TunnelState {
    /// No probe answered yet since start.
    Connecting,
    /// A probe was answered within the timeout.
    Connected,
    /// The tunnel answered before but has not within the timeout.
    Error,
}

impl TunnelState {
    /// Lower-case name, as in the status API.
    pub fn as_str(self) -> &'static str {
        match self {
            TunnelState::Connecting => "connecting",
            TunnelState::Connected => "connected",
            TunnelState::Error => "error",
        }
    }
}

/// What `/status` returns.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GatewayStatus {
    /// TUN interface.
    pub interface: String,
    /// Tunnel state from probes.
    pub state: TunnelState,
    /// RTT of the last probe while connected, milliseconds.
    pub rtt_ms: Option<f64>,
    /// Seconds since the last handshake.
    pub last_handshake_seconds_ago: Option<f64>,
    /// The peer's current UDP endpoint.
    pub peer_endpoint: Option<SocketAddr>,
    /// Bytes received through the tunnel.
    pub rx_bytes: u64,
    /// Bytes sent through the tunnel.
    pub tx_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_names_are_the_status_api_names() {
        for state in [
            TunnelState::Connecting,
            TunnelState::Connected,
            TunnelState::Error,
        ] {
            let json = serde_json::to_string(&state).unwrap();
            assert_eq!(json, format!("\"{}\"", state.as_str()));
            assert_eq!(serde_json::from_str::<TunnelState>(&json).unwrap(), state);
        }
    }
}
