//! DNS-SD over multicast DNS (RFC 6762, RFC 6763) on the LAN: announcing this cluster's
//! advertisement as `<id>._tandem._tcp.local` and browsing for the others'.
//!
//! Written on hickory-proto's messages rather than an mDNS crate: the service here is one
//! record set, announced and answered, and one browse whose answers go straight into
//! DiscoveredClusters; mdns-sd (the maintained responder) runs its own thread and daemon per
//! process and would bring a second copy of its network dependencies. What this does of
//! RFC 6762: answers to PTR (and ANY) questions for the service, announcements at start (twice,
//! a second apart, §8.3) and every `refresh`, goodbyes (TTL 0, §10.1) when turned off, and a
//! browse that asks at start, after 1, 2, 4… seconds and then every `refresh` (§5.2). What it
//! leaves out: probing for name conflicts (the instance is the cluster ID, which is unique
//! among the clusters an administrator runs, and trusted by nobody), known-answer suppression
//! and IPv6.
//!
//! Nothing heard here is trusted: anyone on the LAN can answer as any cluster. A sighting only
//! shows an administrator what to confirm (the CA fingerprint) before peering.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use tandem_core::discovery::{Advertisement, SERVICE};
use tandem_dns::hickory_proto::op::{Message, MessageType, OpCode, Query};
use tandem_dns::hickory_proto::rr::rdata::{A, PTR, SRV, TXT};
use tandem_dns::hickory_proto::rr::{Name, RData, Record, RecordType};
use tokio::sync::{mpsc, watch};

/// One cluster found advertising, and for how long the sighting holds (its records' TTL).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sighting {
    pub advertisement: Advertisement,
    pub ttl: u32,
}

/// The strings of a TXT record, as text (bytes that are not UTF-8 replaced).
pub fn txt_strings(txt: &tandem_dns::hickory_proto::rr::rdata::TXT) -> Vec<String> {
    txt.iter()
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

/// The mDNS group and port.
pub const GROUP: Ipv4Addr = Ipv4Addr::new(224, 0, 0, 251);
pub const PORT: u16 = 5353;

/// How the responder and browser run.
#[derive(Clone, Debug)]
pub struct Config {
    /// The address of the interface to join and send on (None: the one the kernel routes
    /// 224.0.0.251 through).
    pub interface: Option<Ipv4Addr>,
    /// TTL of the announced records: a cluster not heard again within it counts as gone.
    pub ttl: u32,
    /// How often the announcement is repeated and the browse asks again (at most `ttl` / 2,
    /// so that a live cluster is always heard within its TTL).
    pub refresh: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            interface: None,
            ttl: 120,
            refresh: Duration::from_secs(60),
        }
    }
}

/// What the browse heard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// An advertisement, valid for its TTL.
    Seen(Sighting),
    /// A goodbye: the cluster stopped advertising.
    Gone(String),
}

/// The service name `_tandem._tcp.local.`.
fn service() -> Name {
    Name::from_ascii(format!("{SERVICE}.local.")).expect("a valid name")
}

/// The records announcing `ad` under `.local`, with `ttl` (0: a goodbye).
pub fn records(ad: &Advertisement, ttl: u32) -> Vec<Record> {
    let Ok(instance) = Name::from_ascii(format!("{}.{SERVICE}.local.", ad.cluster_id)) else {
        return Vec::new();
    };
    let (host, port) = ad.host_port().unwrap_or_default();
    let ip = host.parse::<Ipv4Addr>().ok();
    let target = match ip {
        Some(_) => Name::from_ascii(format!("{}.local.", ad.cluster_id)),
        None => Name::from_ascii(format!("{}.", host.trim_end_matches('.'))),
    };
    let mut out = vec![
        Record::from_rdata(service(), ttl, RData::PTR(PTR(instance.clone()))),
        Record::from_rdata(instance.clone(), ttl, RData::TXT(TXT::new(ad.txt()))),
    ];
    if let Ok(target) = target {
        out.push(Record::from_rdata(
            instance,
            ttl,
            RData::SRV(SRV::new(0, 0, port, target.clone())),
        ));
        if let Some(ip) = ip {
            out.push(Record::from_rdata(target, ttl, RData::A(A(ip))));
        }
    }
    out
}

/// An unsolicited response (announcement or goodbye) or an answer: PTR as the answer, the
/// rest as additional records (RFC 6763 §12.1). mDNS responses have ID 0 and are authoritative.
fn response(records: Vec<Record>) -> Message {
    let mut m = Message::new();
    m.set_id(0)
        .set_message_type(MessageType::Response)
        .set_op_code(OpCode::Query)
        .set_authoritative(true);
    for r in records {
        if r.record_type() == RecordType::PTR {
            m.add_answer(r);
        } else {
            m.add_additional(r);
        }
    }
    m
}

/// The browse's question: PTR `_tandem._tcp.local.`.
fn question() -> Message {
    let mut m = Message::new();
    m.set_id(0)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .add_query(Query::query(service(), RecordType::PTR));
    m
}

/// Whether `m` asks for the service (PTR or ANY).
fn asks_for_service(m: &Message) -> bool {
    let service = service();
    m.message_type() == MessageType::Query
        && m.queries().iter().any(|q| {
            q.name()
                .to_ascii()
                .eq_ignore_ascii_case(&service.to_ascii())
                && matches!(q.query_type(), RecordType::PTR | RecordType::ANY)
        })
}

/// What a response tells about advertising clusters: each instance named by a PTR of the
/// service, with its TXT from the same message. An instance whose TXT is missing, unreadable
/// or names another cluster ID than its instance label, or that is not named under the service,
/// is skipped (with why, for the log).
pub fn heard(m: &Message) -> (Vec<Event>, Vec<String>) {
    let mut events = Vec::new();
    let mut skipped = Vec::new();
    if m.message_type() != MessageType::Response {
        return (events, skipped);
    }
    let service_name = service();
    let service = service_name.to_ascii().to_ascii_lowercase();
    let all: Vec<&Record> = m.answers().iter().chain(m.additionals()).collect();
    let mut txts: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in &all {
        if let RData::TXT(t) = r.data() {
            txts.insert(r.name().to_ascii().to_ascii_lowercase(), txt_strings(t));
        }
    }
    for r in &all {
        let RData::PTR(PTR(instance)) = r.data() else {
            continue;
        };
        if r.name().to_ascii().to_ascii_lowercase() != service {
            continue;
        }
        let instance_name = instance.to_ascii().to_ascii_lowercase();
        if instance.base_name() != service_name {
            skipped.push(format!("{instance_name}: not an instance of {service}"));
            continue;
        }
        let label = instance_name
            .split('.')
            .next()
            .unwrap_or_default()
            .to_string();
        if r.ttl() == 0 {
            events.push(Event::Gone(label));
            continue;
        }
        let Some(strings) = txts.get(&instance_name) else {
            skipped.push(format!("{instance_name}: no TXT record in the answer"));
            continue;
        };
        match Advertisement::from_txt(strings) {
            Ok(ad) if ad.cluster_id == label => events.push(Event::Seen(Sighting {
                advertisement: ad,
                ttl: r.ttl(),
            })),
            Ok(ad) => skipped.push(format!(
                "{instance_name}: its TXT names cluster {:?}",
                ad.cluster_id
            )),
            Err(e) => skipped.push(format!("{instance_name}: {e}")),
        }
    }
    (events, skipped)
}

/// A UDP socket on port 5353 (shared with other mDNS responders on the host: SO_REUSEADDR and
/// SO_REUSEPORT), joined to 224.0.0.251 on `interface`, sending there with TTL 255.
pub fn socket(interface: Option<Ipv4Addr>) -> std::io::Result<tokio::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.bind(&SocketAddr::from(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, PORT)).into())?;
    let iface = interface.unwrap_or(Ipv4Addr::UNSPECIFIED);
    s.join_multicast_v4(&GROUP, &iface)?;
    if let Some(i) = interface {
        s.set_multicast_if_v4(&i)?;
    }
    s.set_multicast_ttl_v4(255)?;
    s.set_multicast_loop_v4(true)?;
    // Only the group joined on this socket, not every group another socket of the host joined.
    s.set_multicast_all_v4(false)?;
    s.set_nonblocking(true)?;
    tokio::net::UdpSocket::from_std(s.into())
}

/// Runs the responder (for the advertisement `advertise` holds, when Some) and the browse (when
/// `events` is given) on `socket` until the advertisement's sender is dropped; a goodbye goes
/// out when the advertisement is withdrawn or replaced, and at the end.
pub async fn run(
    socket: tokio::net::UdpSocket,
    config: Config,
    mut advertise: watch::Receiver<Option<Advertisement>>,
    events: Option<mpsc::Sender<Event>>,
) {
    let group = SocketAddr::from(SocketAddrV4::new(GROUP, PORT));
    let send = |m: Message| {
        let socket = &socket;
        async move {
            match m.to_vec() {
                Ok(bytes) => {
                    if let Err(e) = socket.send_to(&bytes, group).await {
                        tracing::warn!("mDNS: sending to {group}: {e}");
                    }
                }
                Err(e) => tracing::warn!("mDNS: encoding a message: {e}"),
            }
        }
    };
    let refresh = config
        .refresh
        .min(Duration::from_secs(u64::from(config.ttl.max(2) / 2)));
    let mut current: Option<Advertisement> = advertise.borrow_and_update().clone();
    // The next announcement, and announcements still owed at one-second steps (§8.3).
    let mut announce_at = tokio::time::Instant::now();
    let mut announcements_due = 2u32;
    // The next question, and the gap before the one after (1 s, doubling up to `refresh`).
    let mut ask_at = tokio::time::Instant::now();
    let mut ask_gap = Duration::from_secs(1);
    let mut buf = vec![0u8; 9000];
    // When this responder last answered a question (at most once a second, §6).
    let mut answered: Option<tokio::time::Instant> = None;
    loop {
        let next_announce = current.as_ref().map(|_| announce_at);
        let next_ask = events.as_ref().map(|_| ask_at);
        let wake = [next_announce, next_ask]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            changed = advertise.changed() => {
                let next = if changed.is_ok() { advertise.borrow_and_update().clone() } else { None };
                if next != current {
                    if let Some(old) = &current {
                        send(response(records(old, 0))).await;
                    }
                    current = next;
                    announce_at = tokio::time::Instant::now();
                    announcements_due = 2;
                }
                if changed.is_err() {
                    return;
                }
            }
            _ = tokio::time::sleep_until(wake) => {
                let now = tokio::time::Instant::now();
                if let Some(ad) = &current && announce_at <= now {
                    send(response(records(ad, config.ttl))).await;
                    announcements_due = announcements_due.saturating_sub(1);
                    announce_at = now + if announcements_due > 0 { Duration::from_secs(1) } else { refresh };
                }
                if events.is_some() && ask_at <= now {
                    send(question()).await;
                    ask_at = now + ask_gap;
                    ask_gap = (ask_gap * 2).min(refresh);
                }
            }
            received = socket.recv_from(&mut buf) => {
                let Ok((n, from)) = received else { continue };
                let Ok(m) = Message::from_vec(&buf[..n]) else { continue };
                if asks_for_service(&m) {
                    let recently = answered.is_some_and(|t| t.elapsed() < Duration::from_secs(1));
                    if let Some(ad) = &current && !recently {
                        answered = Some(tokio::time::Instant::now());
                        // Shared records: answered after 20–120 ms (§6), so that answers from
                        // many responders do not collide.
                        let delay = Duration::from_millis(20 + u64::from(rand::random::<u8>() % 100));
                        tokio::time::sleep(delay).await;
                        send(response(records(ad, config.ttl))).await;
                    }
                    continue;
                }
                let Some(tx) = &events else { continue };
                let (heard, skipped) = heard(&m);
                for why in skipped {
                    tracing::debug!(%from, "mDNS: skipped {why}");
                }
                // Never waits for the recorder: a LAN that talks faster than the API server
                // takes writes loses sightings (the next announcement brings them again), and
                // this responder keeps answering.
                for e in heard {
                    if let Err(mpsc::error::TrySendError::Closed(_)) = tx.try_send(e) {
                        return;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn milan(endpoint: &str) -> Advertisement {
        Advertisement {
            cluster_id: "milan".into(),
            endpoint: endpoint.into(),
            ca_fingerprint: tandem_core::discovery::fingerprint(b"milan's CA"),
            protocol_version: tandem_core::protocol::VERSION,
            region: Some("eu-south".into()),
            zone: None,
            enroll: None,
        }
    }

    fn wire(m: Message) -> Message {
        Message::from_vec(&m.to_vec().unwrap()).unwrap()
    }

    #[test]
    fn an_announcement_is_heard_as_the_advertisement_and_a_goodbye_as_gone() {
        for endpoint in ["https://198.18.1.2:6443", "https://api.milan.example.org"] {
            let ad = milan(endpoint);
            let (events, skipped) = heard(&wire(response(records(&ad, 120))));
            assert_eq!(
                events,
                vec![Event::Seen(Sighting {
                    advertisement: ad.clone(),
                    ttl: 120
                })]
            );
            assert!(skipped.is_empty(), "{skipped:?}");
            let (events, _) = heard(&wire(response(records(&ad, 0))));
            assert_eq!(events, vec![Event::Gone("milan".into())]);
        }
        let srv = records(&milan("https://198.18.1.2:6443"), 120);
        assert!(srv.iter().any(|r| matches!(r.data(), RData::SRV(s)
            if s.port() == 6443 && s.target().to_ascii() == "milan.local.")));
        assert!(
            srv.iter()
                .any(|r| matches!(r.data(), RData::A(a) if a.0 == Ipv4Addr::new(198, 18, 1, 2)))
        );
    }

    #[test]
    fn questions_are_answered_and_lies_about_the_instance_are_skipped() {
        assert!(asks_for_service(&wire(question())));
        let mut other = Message::new();
        other.add_query(Query::query(
            Name::from_ascii("_http._tcp.local.").unwrap(),
            RecordType::PTR,
        ));
        assert!(!asks_for_service(&wire(other)));
        // An instance named milan whose TXT claims rome is not taken for either.
        let mut rome = milan("https://198.18.1.2:6443");
        rome.cluster_id = "rome".into();
        let mut recs = records(&milan("https://198.18.1.2:6443"), 120);
        for r in &mut recs {
            if matches!(r.data(), RData::TXT(_)) {
                r.set_data(RData::TXT(TXT::new(rome.txt())));
            }
        }
        let (events, skipped) = heard(&wire(response(recs)));
        assert!(events.is_empty(), "{events:?}");
        assert!(skipped[0].contains("names cluster \"rome\""), "{skipped:?}");
        // An instance named outside the service (its announcement or its goodbye) is neither.
        let outside = Name::from_ascii("milan.elsewhere.local.").unwrap();
        for ttl in [120, 0] {
            let mut recs = records(&milan("https://198.18.1.2:6443"), ttl);
            for r in &mut recs {
                if matches!(r.data(), RData::PTR(_)) {
                    r.set_data(RData::PTR(PTR(outside.clone())));
                } else if matches!(r.data(), RData::TXT(_) | RData::SRV(_)) {
                    r.set_name(outside.clone());
                }
            }
            let (events, skipped) = heard(&wire(response(recs)));
            assert!(events.is_empty(), "{events:?}");
            assert!(
                skipped[0].contains("not an instance of _tandem._tcp.local."),
                "{skipped:?}"
            );
        }
        // A question is not an answer.
        assert_eq!(heard(&wire(question())).0, vec![]);
    }
}
