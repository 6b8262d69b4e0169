//! The gateway process: TUN device + UDP socket + boringtun's noise state machine, with
//! the NAT plan applied through nftables, routes through rtnetlink, and probes for health.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use boringtun::noise::{Tunn, TunnResult};
use parking_lot::{Mutex, RwLock};
use tokio::net::{TcpListener, UdpSocket};
use tokio::time::{Instant, MissedTickBehavior};
use tun_rs::{AsyncDevice, DeviceBuilder};

use crate::health::{Health, TunnelState};
use crate::packet::{self, Probe};
use crate::status::{GatewayStatus, Metrics};
use crate::{GatewayConfig, GatewayError, nft, route};

/// Largest datagram or packet handled; TUN packets are at most the MTU (≤ 9000).
const BUF: usize = 65536;
/// How often boringtun's timers run (handshake retries, keepalives, rekeying).
const TIMER_TICK: Duration = Duration::from_millis(100);

/// State shared by the data-path tasks.
struct Shared {
    config: GatewayConfig,
    tunn: Mutex<Tunn>,
    endpoint: RwLock<Option<SocketAddr>>,
    health: Mutex<Health>,
    metrics: Metrics,
    udp: UdpSocket,
    tun: AsyncDevice,
}

/// Runs the gateway until SIGINT or SIGTERM, then removes its nftables table.
pub async fn run_gateway(config: GatewayConfig) -> Result<(), GatewayError> {
    run_gateway_until(config, shutdown_signal()).await
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Runs the gateway until `shutdown` completes (for embedding and tests).
pub async fn run_gateway_until(
    config: GatewayConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), GatewayError> {
    std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").map_err(|source| {
        GatewayError::Sysctl {
            name: "net.ipv4.ip_forward",
            source,
        }
    })?;
    let tun_err = |source| GatewayError::Tun {
        interface: config.interface.clone(),
        source,
    };
    let tun = DeviceBuilder::new()
        .name(&config.interface)
        .mtu(config.mtu)
        .enable(true)
        .build_async()
        .map_err(tun_err)?;
    let ifindex = tun.if_index().map_err(tun_err)?;
    route::sync_routes(ifindex, &config.plan.tunnel_destinations).await?;

    let ruleset = nft::render(
        &config.plan,
        &config.nft_table,
        &config.interface,
        config.mtu,
    );
    let changed = nft::apply(&ruleset)
        .await
        .map_err(|source| GatewayError::Nft {
            table: config.nft_table.clone(),
            source,
        })?;
    tracing::info!(table = %config.nft_table, changed, "nftables reconciled");

    let udp = UdpSocket::bind(config.listen)
        .await
        .map_err(|source| GatewayError::Udp {
            addr: config.listen,
            source,
        })?;
    let index: u32 = rand::random::<u32>() >> 8;
    let tunn = Tunn::new(
        config.private_key.clone(),
        config.peer_public_key,
        None,
        config.persistent_keepalive,
        index,
        None,
    );
    let shared = Arc::new(Shared {
        tunn: Mutex::new(tunn),
        endpoint: RwLock::new(config.peer_endpoint),
        health: Mutex::new(Health::new(config.probe_timeout)),
        metrics: Metrics::default(),
        udp,
        tun,
        config,
    });

    let mut tasks = tokio::task::JoinSet::new();
    if let Some(addr) = shared.config.status_listen {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| GatewayError::Status { addr, source })?;
        let s = shared.clone();
        let status = Arc::new(move || s.status());
        tasks.spawn(crate::status::serve(
            listener,
            shared.metrics.clone(),
            status,
        ));
    }
    tasks.spawn(tun_to_network(shared.clone()));
    tasks.spawn(network_to_tun(shared.clone()));
    tasks.spawn(timers(shared.clone()));
    tasks.spawn(probes(shared.clone()));
    tracing::info!(
        interface = %shared.config.interface,
        listen = %shared.config.listen,
        "gateway running"
    );

    shutdown.await;
    tasks.abort_all();
    tracing::info!("shutting down: removing nftables table");
    nft::delete_table(&shared.config.nft_table)
        .await
        .map_err(|source| GatewayError::Nft {
            table: shared.config.nft_table.clone(),
            source,
        })
}

impl Shared {
    /// The current status; also refreshes the gauges derived from it.
    fn status(&self) -> GatewayStatus {
        let now = Instant::now();
        let health = self.health.lock();
        let (since, ..) = self.tunn.lock().stats();
        let state = health.state(now);
        self.metrics
            .connected
            .set(i64::from(state == TunnelState::Connected));
        if let Some(since) = since
            && let Ok(unix) = SystemTime::now().duration_since(UNIX_EPOCH)
        {
            self.metrics
                .last_handshake_timestamp_seconds
                .set(unix.saturating_sub(since).as_secs_f64());
        }
        GatewayStatus {
            interface: self.config.interface.clone(),
            state,
            rtt_ms: health.rtt(now).map(|d| d.as_secs_f64() * 1000.0),
            last_handshake_seconds_ago: since.map(|d| d.as_secs_f64()),
            peer_endpoint: *self.endpoint.read(),
            rx_bytes: self.metrics.rx_bytes.get(),
            tx_bytes: self.metrics.tx_bytes.get(),
        }
    }

    async fn send(&self, datagram: &[u8]) {
        let endpoint = *self.endpoint.read();
        if let Some(ep) = endpoint
            && let Err(e) = self.udp.send_to(datagram, ep).await
        {
            tracing::debug!(%ep, error = %e, "sending datagram");
        }
    }

    /// Encrypts `packet` and sends it to the peer.
    async fn encapsulate_and_send(&self, packet: &[u8], out: &mut [u8]) {
        let result = self.tunn.lock().encapsulate(packet, out);
        match result {
            TunnResult::WriteToNetwork(d) => self.send(d).await,
            TunnResult::Err(e) => tracing::debug!(error = ?e, "encapsulate"),
            _ => {}
        }
    }
}

/// Packets from local pods and hosts, routed to the TUN, go into the tunnel — but only
/// when their destination is one of the peer's prefixes (WireGuard's cryptokey routing).
async fn tun_to_network(shared: Arc<Shared>) {
    let mut buf = vec![0u8; BUF];
    let mut out = vec![0u8; BUF + 32];
    loop {
        let n = match shared.tun.recv(&mut buf).await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "reading TUN");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let packet = &buf[..n];
        let routed = packet::addresses(packet)
            .is_some_and(|(_, dst)| shared.config.plan.routes_into_tunnel(dst));
        if !routed {
            shared.metrics.dropped_unrouted.inc();
            continue;
        }
        shared.metrics.tx_bytes.inc_by(n as u64);
        shared.encapsulate_and_send(packet, &mut out).await;
    }
}

/// Datagrams from the peer: decrypted, probes answered, the rest written to the TUN if
/// their source is one of the peer's prefixes.
async fn network_to_tun(shared: Arc<Shared>) {
    let mut buf = vec![0u8; BUF];
    let mut out = vec![0u8; BUF];
    let mut probe_out = vec![0u8; 256];
    loop {
        let (n, from) = match shared.udp.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(e) => {
                tracing::debug!(error = %e, "receiving datagram");
                continue;
            }
        };
        let mut datagram: &[u8] = &buf[..n];
        loop {
            let result = shared
                .tunn
                .lock()
                .decapsulate(Some(from.ip()), datagram, &mut out);
            let first = !datagram.is_empty();
            datagram = &[];
            match result {
                TunnResult::Done => {
                    if first {
                        roam(&shared, from);
                    }
                    break;
                }
                TunnResult::Err(e) => {
                    shared.metrics.decrypt_errors.inc();
                    tracing::debug!(%from, error = ?e, "decapsulate");
                    break;
                }
                TunnResult::WriteToNetwork(d) => {
                    // A handshake message or queued packets: the sender proved its key.
                    if first {
                        roam(&shared, from);
                    }
                    if let Err(e) = shared.udp.send_to(d, from).await {
                        tracing::debug!(%from, error = %e, "sending datagram");
                    }
                    // boringtun asks to be called again with an empty datagram to flush.
                }
                TunnResult::WriteToTunnelV4(p, _) | TunnResult::WriteToTunnelV6(p, _) => {
                    roam(&shared, from);
                    deliver(&shared, p, &mut probe_out).await;
                    break;
                }
            }
        }
    }
}

/// WireGuard roaming: the peer's endpoint is wherever its last authenticated packet came from.
fn roam(shared: &Shared, from: SocketAddr) {
    if *shared.endpoint.read() != Some(from) {
        tracing::info!(%from, "peer endpoint changed");
        *shared.endpoint.write() = Some(from);
    }
}

async fn deliver(shared: &Shared, packet: &[u8], probe_out: &mut [u8]) {
    match packet::parse_probe(packet) {
        Some(Probe::Request(seq)) => {
            let mut reply = [0u8; 28];
            let n = packet::build_probe(Probe::Reply(seq), &mut reply);
            shared.encapsulate_and_send(&reply[..n], probe_out).await;
            return;
        }
        Some(Probe::Reply(seq)) => {
            let rtt = shared.health.lock().reply_received(seq, Instant::now());
            if let Some(rtt) = rtt {
                shared.metrics.rtt_seconds.set(rtt.as_secs_f64());
                shared.metrics.connected.set(1);
            }
            return;
        }
        None => {}
    }
    let allowed = packet::addresses(packet).is_some_and(|(src, _)| {
        shared
            .config
            .plan
            .tunnel_sources
            .iter()
            .any(|p| p.contains(&src))
    });
    if !allowed {
        shared.metrics.dropped_unrouted.inc();
        return;
    }
    shared.metrics.rx_bytes.inc_by(packet.len() as u64);
    if let Err(e) = shared.tun.send(packet).await {
        tracing::debug!(error = %e, "writing TUN");
    }
}

/// Drives boringtun's timers: handshake (re)initiation, keepalives, session expiry.
async fn timers(shared: Arc<Shared>) {
    let mut out = vec![0u8; 256];
    let mut tick = tokio::time::interval(TIMER_TICK);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let result = shared.tunn.lock().update_timers(&mut out);
        match result {
            TunnResult::WriteToNetwork(d) => shared.send(d).await,
            TunnResult::Err(e) => tracing::debug!(error = ?e, "timers"),
            _ => {}
        }
    }
}

/// Sends a probe each interval and publishes the resulting state.
async fn probes(shared: Arc<Shared>) {
    let mut out = vec![0u8; 256];
    let mut tick = tokio::time::interval(shared.config.probe_interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last_state = None;
    loop {
        tick.tick().await;
        let now = Instant::now();
        let seq = shared.health.lock().probe_sent(now);
        let mut probe = [0u8; 28];
        let n = packet::build_probe(Probe::Request(seq), &mut probe);
        shared.encapsulate_and_send(&probe[..n], &mut out).await;

        let state = shared.status().state;
        if last_state != Some(state) {
            tracing::info!(state = state.as_str(), "tunnel state");
            last_state = Some(state);
        }
    }
}
