//! Tunnel counters, Prometheus metrics and the small HTTP status API a controller reads.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

pub use tandem_netspec::status::GatewayStatus;

/// Counters the data path updates and the status API reads.
#[derive(Debug, Default, Clone)]
pub struct Metrics {
    /// Inner (decrypted) bytes received from the tunnel.
    pub rx_bytes: Counter,
    /// Inner bytes sent into the tunnel.
    pub tx_bytes: Counter,
    /// Packets dropped because their address is not routed through this tunnel.
    pub dropped_unrouted: Counter,
    /// Datagrams that failed WireGuard authentication or decryption.
    pub decrypt_errors: Counter,
    /// RTT of the last answered probe, seconds.
    pub rtt_seconds: Gauge<f64, AtomicU64>,
    /// Unix time of the last completed handshake.
    pub last_handshake_timestamp_seconds: Gauge<f64, AtomicU64>,
    /// 1 when connected.
    pub connected: Gauge,
    /// TUN reads; with `tun_read_packets` it shows how well TSO batches packets.
    pub tun_reads: Counter,
    /// Packets (segments) those TUN reads returned.
    pub tun_read_packets: Counter,
    /// recvmmsg calls on the UDP socket.
    pub udp_recv_calls: Counter,
    /// Datagrams those calls returned (GRO and recvmmsg batching).
    pub udp_recv_datagrams: Counter,
}

impl Metrics {
    /// The registry exposing these metrics under `tandem_gateway_*`.
    pub fn registry(&self) -> Registry {
        let mut r = Registry::with_prefix("tandem_gateway");
        r.register(
            "rx_bytes",
            "Bytes received through the tunnel",
            self.rx_bytes.clone(),
        );
        r.register(
            "tx_bytes",
            "Bytes sent through the tunnel",
            self.tx_bytes.clone(),
        );
        r.register(
            "dropped_unrouted_packets",
            "Packets dropped because no tunnel prefix covers them",
            self.dropped_unrouted.clone(),
        );
        r.register(
            "decrypt_errors",
            "Datagrams that failed WireGuard authentication",
            self.decrypt_errors.clone(),
        );
        r.register(
            "probe_rtt_seconds",
            "Round-trip time of the last tunnel probe",
            self.rtt_seconds.clone(),
        );
        r.register(
            "last_handshake_timestamp_seconds",
            "Unix time of the last WireGuard handshake",
            self.last_handshake_timestamp_seconds.clone(),
        );
        r.register(
            "connected",
            "1 when the tunnel answers probes",
            self.connected.clone(),
        );
        r.register(
            "tun_reads",
            "Reads from the TUN device",
            self.tun_reads.clone(),
        );
        r.register(
            "tun_read_packets",
            "Packets returned by TUN reads (after splitting TSO super-packets)",
            self.tun_read_packets.clone(),
        );
        r.register(
            "udp_recv_calls",
            "Receive calls on the UDP socket",
            self.udp_recv_calls.clone(),
        );
        r.register(
            "udp_recv_datagrams",
            "Datagrams returned by those calls",
            self.udp_recv_datagrams.clone(),
        );
        r
    }
}

/// Serves `/status` (JSON) and `/metrics` (Prometheus text) until the task is dropped.
pub async fn serve(
    listener: TcpListener,
    metrics: Metrics,
    status: Arc<dyn Fn() -> GatewayStatus + Send + Sync>,
) {
    let registry = Arc::new(metrics.registry());
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let registry = registry.clone();
        let status = status.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<Incoming>| {
                let registry = registry.clone();
                let status = status.clone();
                async move { Ok::<_, Infallible>(route(&req, &registry, &*status)) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

fn route(
    req: &Request<Incoming>,
    registry: &Registry,
    status: &(dyn Fn() -> GatewayStatus + Send + Sync),
) -> Response<Full<Bytes>> {
    let (code, ctype, body) = match req.uri().path() {
        "/metrics" => {
            // Computing the status refreshes the gauges derived from it.
            let _ = status();
            let mut text = String::new();
            match encode(&mut text, registry) {
                Ok(()) => (
                    StatusCode::OK,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    text,
                ),
                Err(e) => (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain",
                    e.to_string(),
                ),
            }
        }
        "/status" => (
            StatusCode::OK,
            "application/json",
            serde_json::to_string(&status()).unwrap_or_default(),
        ),
        "/healthz" => (StatusCode::OK, "text/plain", "ok".into()),
        other => (
            StatusCode::NOT_FOUND,
            "text/plain",
            format!("no such path {other}; try /status or /metrics"),
        ),
    };
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, ctype)
        .body(Full::new(Bytes::from(body)))
        .expect("static response parts are valid")
}
