//! The gateway process: TUN device + UDP socket + boringtun's noise state machine, with
//! the NAT plan applied through nftables, routes through rtnetlink, and probes for health.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::io::IoSliceMut;

use boringtun::noise::{Tunn, TunnResult};
use parking_lot::{Mutex, RwLock};
use quinn_udp::{RecvMeta, Transmit, UdpSocketState};
use tokio::io::Interest;
use tokio::net::{TcpListener, UdpSocket};
use tokio::time::{Instant, MissedTickBehavior};
use tun_rs::{AsyncDevice, DeviceBuilder, GROTable, IDEAL_BATCH_SIZE, VIRTIO_NET_HDR_LEN};

use crate::health::{Health, TunnelState};
use crate::packet::{self, Probe};
use crate::status::{GatewayStatus, Metrics};
use crate::{GatewayConfig, GatewayError, nft, route};

/// How often boringtun's timers run (handshake retries, keepalives, rekeying).
const TIMER_TICK: Duration = Duration::from_millis(100);
/// UDP socket buffer size: room for a few GSO batches in flight (capped by net.core.*mem_max).
const SOCKET_BUFFER: usize = 4 << 20;

/// State shared by the data-path tasks.
struct Shared {
    config: GatewayConfig,
    tunn: Mutex<Tunn>,
    endpoint: RwLock<Option<SocketAddr>>,
    health: Mutex<Health>,
    metrics: Metrics,
    udp: UdpSocket,
    udp_state: UdpSocketState,
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

/// Turns IPv4 forwarding on unless it already is. On a node (a hostNetwork gateway) it
/// already is wherever pods are routed, and there the gateway has CAP_NET_ADMIN but no right
/// to write root's sysctl files, so it only writes when it must.
fn ensure_ip_forward() -> Result<(), GatewayError> {
    const PATH: &str = "/proc/sys/net/ipv4/ip_forward";
    let err = |source| GatewayError::Sysctl {
        name: "net.ipv4.ip_forward",
        source,
    };
    if std::fs::read_to_string(PATH).map_err(err)?.trim() == "1" {
        return Ok(());
    }
    std::fs::write(PATH, "1").map_err(err)
}

/// Runs the gateway until `shutdown` completes (for embedding and tests).
pub async fn run_gateway_until(
    config: GatewayConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), GatewayError> {
    ensure_ip_forward()?;
    // Before this gateway's own state: the old table may translate the same prefixes.
    let removed =
        crate::legacy::remove(&config.legacy_interfaces, &config.legacy_nft_tables).await?;
    if !removed.is_empty() {
        tracing::info!(
            ?removed,
            "removed what an earlier version left under older names"
        );
    }
    let tun_err = |source| GatewayError::Tun {
        interface: config.interface.clone(),
        source,
    };
    let tun = DeviceBuilder::new()
        .name(&config.interface)
        .mtu(config.mtu)
        // IFF_VNET_HDR with TSO/USO: the kernel hands us and takes 64 KiB super-packets.
        .offload(true)
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
        config.allowed_destinations.as_deref(),
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
    // Enables UDP GRO and detects UDP GSO support on the socket.
    let udp_state = UdpSocketState::new((&udp).into()).map_err(|source| GatewayError::Udp {
        addr: config.listen,
        source,
    })?;
    for (what, result) in [
        (
            "send",
            udp_state.set_send_buffer_size((&udp).into(), SOCKET_BUFFER),
        ),
        (
            "receive",
            udp_state.set_recv_buffer_size((&udp).into(), SOCKET_BUFFER),
        ),
    ] {
        if let Err(e) = result {
            tracing::warn!(error = %e, "setting UDP {what} buffer size");
        }
    }
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
        udp_state,
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
        tun_tcp_gso = shared.tun.tcp_gso(),
        tun_udp_gso = shared.tun.udp_gso(),
        udp_gso_segments = shared.udp_state.max_gso_segments(),
        udp_gro_segments = shared.udp_state.gro_segments(),
        "gateway running"
    );

    tokio::select! {
        () = shutdown => {}
        ended = tasks.join_next() => {
            // A data-path task never returns; if one did (a panic), fail loudly and leave
            // the rules in place for the restarted process to reconcile.
            tasks.abort_all();
            let reason = match ended {
                Some(Err(e)) => e.to_string(),
                _ => "returned".to_string(),
            };
            return Err(GatewayError::TaskEnded(reason));
        }
    }
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
        // Lock order is tunn before health (the receive path holds tunn while it records a
        // probe reply in health); take tunn's stats and release it before locking health.
        let (since, ..) = self.tunn.lock().stats();
        let health = self.health.lock();
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

/// Headroom before each packet written to the TUN, where tun-rs puts the virtio-net header.
const OFFSET: usize = VIRTIO_NET_HDR_LEN;
/// Packets gathered from the TUN before one round of encryption and sending.
const TX_BATCH: usize = 2 * IDEAL_BATCH_SIZE;
/// recvmmsg batch: each buffer can hold one GRO-coalesced run of datagrams (≤ 64 KiB).
const RX_BATCH: usize = 8;
/// Most datagrams one GRO buffer can hold (kernel limit for UDP GRO/GSO segments).
const MAX_SEGMENTS: usize = 64;
/// Largest payload of one UDP GSO send (the IPv4 datagram limit, with headroom).
const MAX_GSO_BYTES: usize = 65000;

/// Packets from local pods and hosts, routed to the TUN, go into the tunnel — but only
/// when their destination is one of the peer's prefixes (WireGuard's cryptokey routing).
///
/// The hot path is batched end to end: one TUN read returns a TSO super-packet split into
/// segments, all are encrypted under one lock into one contiguous buffer, and runs of
/// equal-size datagrams leave in one UDP GSO `sendmsg`. Buffers are allocated once.
async fn tun_to_network(shared: Arc<Shared>) {
    let seg_cap = usize::from(shared.config.mtu).max(1500) + 128;
    let mut original = vec![0u8; VIRTIO_NET_HDR_LEN + 65535];
    let mut bufs = vec![vec![0u8; seg_cap]; TX_BATCH];
    let mut sizes = vec![0usize; TX_BATCH];
    // Each encrypted datagram is the packet plus 32 bytes; a handshake initiation is 148.
    let mut out = vec![0u8; TX_BATCH * (seg_cap + 32) + 256];
    let mut lens: Vec<usize> = Vec::with_capacity(TX_BATCH);
    loop {
        let n = match shared
            .tun
            .recv_multiple(
                &mut original,
                &mut bufs[..IDEAL_BATCH_SIZE],
                &mut sizes[..IDEAL_BATCH_SIZE],
                0,
            )
            .await
        {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "reading TUN");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        // Drain what else is queued (typically small packets such as ACKs, one per read)
        // so it leaves in the same GSO send instead of one sendmsg each.
        let mut n = n;
        let mut reads = 1u64;
        while n + MAX_SEGMENTS <= bufs.len() {
            match shared
                .tun
                .try_recv_multiple(&mut original, &mut bufs[n..], &mut sizes[n..], 0)
            {
                Ok(m) => {
                    n += m;
                    reads += 1;
                }
                Err(e) => {
                    if e.kind() != std::io::ErrorKind::WouldBlock {
                        tracing::debug!(error = %e, "reading TUN");
                    }
                    break;
                }
            }
        }
        shared.metrics.tun_reads.inc_by(reads);
        shared.metrics.tun_read_packets.inc_by(n as u64);
        lens.clear();
        let (mut off, mut tx_bytes, mut dropped) = (0usize, 0u64, 0u64);
        {
            let mut tunn = shared.tunn.lock();
            for (buf, &size) in bufs.iter().zip(&sizes).take(n) {
                let packet = &buf[..size];
                let routed = packet::addresses(packet)
                    .is_some_and(|(_, dst)| shared.config.plan.routes_into_tunnel(dst));
                if !routed {
                    dropped += 1;
                    continue;
                }
                let dst = &mut out[off..];
                let dst_start = dst.as_ptr();
                match tunn.encapsulate(packet, dst) {
                    TunnResult::WriteToNetwork(d) => {
                        // boringtun writes at the start of the buffer it is given, which
                        // keeps the datagrams contiguous for GSO.
                        debug_assert_eq!(d.as_ptr(), dst_start);
                        let len = d.len();
                        lens.push(len);
                        off += len;
                        tx_bytes += size as u64;
                    }
                    TunnResult::Err(e) => tracing::debug!(error = ?e, "encapsulate"),
                    _ => {}
                }
            }
        }
        shared.metrics.tx_bytes.inc_by(tx_bytes);
        if dropped > 0 {
            shared.metrics.dropped_unrouted.inc_by(dropped);
        }
        shared.send_batch(&out[..off], &lens).await;
    }
}

impl Shared {
    /// Sends consecutive datagrams (lengths `lens`, packed in `data`) to the peer, one UDP
    /// GSO `sendmsg` per run of equal sizes (the last of a run may be shorter).
    async fn send_batch(&self, data: &[u8], lens: &[usize]) {
        let Some(destination) = *self.endpoint.read() else {
            return;
        };
        let max = self.udp_state.max_gso_segments().clamp(1, MAX_SEGMENTS);
        let (mut start, mut i) = (0usize, 0usize);
        while i < lens.len() {
            let seg = lens[i];
            let limit = max.min((MAX_GSO_BYTES / seg).max(1));
            let mut end = start + seg;
            let mut j = i + 1;
            while j < lens.len() && j - i < limit && lens[j] <= seg {
                end += lens[j];
                j += 1;
                if lens[j - 1] < seg {
                    break;
                }
            }
            let transmit = Transmit {
                destination,
                ecn: None,
                contents: &data[start..end],
                segment_size: (j - i > 1).then_some(seg),
                src_ip: None,
            };
            let sent = self
                .udp
                .async_io(Interest::WRITABLE, || {
                    self.udp_state.try_send((&self.udp).into(), &transmit)
                })
                .await;
            if let Err(e) = sent {
                tracing::debug!(%destination, error = %e, "sending datagrams");
            }
            start = end;
            i = j;
        }
    }
}

/// Datagrams from the peer: received in batches (recvmmsg + UDP GRO), decrypted under one
/// lock, probes answered, the rest written to the TUN coalesced (TUN GRO) if their source
/// is one of the peer's prefixes and their destination one of the names it gave ours.
async fn network_to_tun(shared: Arc<Shared>) {
    let mut rx: [Vec<u8>; RX_BATCH] = std::array::from_fn(|_| vec![0u8; 65536]);
    let mut meta = [RecvMeta::default(); RX_BATCH];
    // Each buffer must be able to grow to a whole coalesced 64 KiB packet: tun-rs's GRO
    // appends to the first packet of a flow in place and skips coalescing otherwise.
    // Untouched capacity costs no memory.
    let mut pkts: Vec<Vec<u8>> = (0..RX_BATCH * MAX_SEGMENTS)
        .map(|_| Vec::with_capacity(65536 + 2 * OFFSET))
        .collect();
    let mut gro = GROTable::default();
    // Rare-path messages (handshake replies, probe replies) sent after the lock is released.
    let mut replies: Vec<(Vec<u8>, SocketAddr)> = Vec::new();
    let mut probe_requests: Vec<u16> = Vec::new();
    let mut probe_out = vec![0u8; 256];
    loop {
        let received = shared
            .udp
            .async_io(Interest::READABLE, || {
                let mut slices = rx.each_mut().map(|b| IoSliceMut::new(&mut b[..]));
                shared
                    .udp_state
                    .recv((&shared.udp).into(), &mut slices, &mut meta)
            })
            .await;
        let n = match received {
            Ok(n) => n,
            Err(e) => {
                tracing::debug!(error = %e, "receiving datagrams");
                continue;
            }
        };
        shared.metrics.udp_recv_calls.inc();
        let datagrams: usize = meta[..n]
            .iter()
            .map(|m| {
                m.len.div_ceil(if m.stride == 0 {
                    m.len.max(1)
                } else {
                    m.stride
                })
            })
            .sum();
        shared.metrics.udp_recv_datagrams.inc_by(datagrams as u64);
        let mut k = 0usize;
        let (mut rx_bytes, mut dropped, mut errors) = (0u64, 0u64, 0u64);
        let mut roamed_to = None;
        {
            let mut tunn = shared.tunn.lock();
            for (buf, m) in rx.iter().zip(&meta).take(n) {
                let from = m.addr;
                let stride = if m.stride == 0 { m.len } else { m.stride };
                for datagram in buf[..m.len].chunks(stride.max(1)) {
                    let out = &mut pkts[k];
                    out.clear();
                    out.resize(OFFSET + datagram.len().max(256), 0);
                    let mut input = datagram;
                    loop {
                        let first = !input.is_empty();
                        let result = tunn.decapsulate(Some(from.ip()), input, &mut out[OFFSET..]);
                        input = &[];
                        match result {
                            TunnResult::Done => {
                                if first {
                                    roamed_to = Some(from);
                                }
                                break;
                            }
                            TunnResult::Err(e) => {
                                errors += 1;
                                tracing::debug!(%from, error = ?e, "decapsulate");
                                break;
                            }
                            TunnResult::WriteToNetwork(d) => {
                                // A handshake message or queued packets: the sender proved
                                // its key. boringtun asks to be called again to flush.
                                if first {
                                    roamed_to = Some(from);
                                }
                                replies.push((d.to_vec(), from));
                            }
                            TunnResult::WriteToTunnelV4(p, _)
                            | TunnResult::WriteToTunnelV6(p, _) => {
                                roamed_to = Some(from);
                                let len = p.len();
                                match packet::parse_probe(p) {
                                    Some(Probe::Request(seq)) => probe_requests.push(seq),
                                    Some(Probe::Reply(seq)) => {
                                        let rtt = shared
                                            .health
                                            .lock()
                                            .reply_received(seq, Instant::now());
                                        if let Some(rtt) = rtt {
                                            shared.metrics.rtt_seconds.set(rtt.as_secs_f64());
                                        }
                                    }
                                    None => {
                                        let allowed =
                                            packet::addresses(p).is_some_and(|(src, dst)| {
                                                shared.config.plan.accepts_from_tunnel(src, dst)
                                            });
                                        if allowed {
                                            out.truncate(OFFSET + len);
                                            rx_bytes += len as u64;
                                            k += 1;
                                        } else {
                                            dropped += 1;
                                        }
                                    }
                                }
                                break;
                            }
                        }
                    }
                }
            }
        }
        if let Some(from) = roamed_to {
            roam(&shared, from);
        }
        shared.metrics.rx_bytes.inc_by(rx_bytes);
        if dropped > 0 {
            shared.metrics.dropped_unrouted.inc_by(dropped);
        }
        if errors > 0 {
            shared.metrics.decrypt_errors.inc_by(errors);
        }
        for (datagram, to) in replies.drain(..) {
            if let Err(e) = shared.udp.send_to(&datagram, to).await {
                tracing::debug!(%to, error = %e, "sending datagram");
            }
        }
        for seq in probe_requests.drain(..) {
            let mut reply = [0u8; 28];
            let len = packet::build_probe(Probe::Reply(seq), &mut reply);
            shared
                .encapsulate_and_send(&reply[..len], &mut probe_out)
                .await;
        }
        if k > 0
            && let Err(e) = shared
                .tun
                .send_multiple(&mut gro, &mut pkts[..k], OFFSET)
                .await
        {
            tracing::debug!(error = %e, "writing TUN");
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
