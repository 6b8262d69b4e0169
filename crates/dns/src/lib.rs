//! DNS serving shared by Tandem's two authoritative servers: the lab's `cluster.local` (as
//! CoreDNS's kubernetes plugin answers it) and `clusterset.local` of multi-cluster services.
//! Both compute answers from live API objects on each query, which hickory-server's
//! authorities (zone files, stores, forwarders) do not model; so messages are encoded and
//! decoded by hickory-proto and the serving loop is here, once. No kube: callers hand in a
//! function from a query's bytes to the answer's.

use std::future::Future;
use std::sync::Arc;

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, SOA, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub mod client;

pub use hickory_proto;

/// What a name in an authoritative zone is.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    /// Addresses (A or AAAA records, by the query's type).
    Addresses(Vec<std::net::IpAddr>),
    /// SRV targets: (port, target name with its trailing dot).
    Services(Vec<(u16, String)>),
    /// The name exists but has no records of the type asked.
    NoData,
    /// No such name.
    NxDomain,
}

/// The response to `request` for a zone (`zone`, with its trailing dot) answered by
/// `answer(labels below the zone, most specific first, lowercase; query type)`; names outside
/// the zone are Refused (the caller may forward those).
pub fn respond(
    request: &Message,
    zone: &str,
    ttl: u32,
    answer: impl FnOnce(&[String], RecordType) -> Answer,
) -> Message {
    let mut response = Message::new();
    response
        .set_id(request.id())
        .set_message_type(MessageType::Response)
        .set_op_code(request.op_code())
        .set_recursion_desired(request.recursion_desired())
        .set_recursion_available(false);
    let Some(query) = request.queries().first() else {
        response.set_response_code(ResponseCode::FormErr);
        return response;
    };
    response.add_query(query.clone());
    let Ok(zone) = Name::from_ascii(zone) else {
        response.set_response_code(ResponseCode::ServFail);
        return response;
    };
    let qname = query.name().to_lowercase();
    if !zone.zone_of(&qname) {
        response.set_response_code(ResponseCode::Refused);
        return response;
    }
    response.set_authoritative(true);
    let labels: Vec<String> = qname
        .iter()
        .take(qname.num_labels() as usize - zone.num_labels() as usize)
        .map(|l| String::from_utf8_lossy(l).into_owned())
        .collect();
    let kind = query.query_type();
    let mut any = false;
    match answer(&labels, kind) {
        Answer::Addresses(ips) => {
            for ip in ips {
                let rdata = match (ip, kind) {
                    (std::net::IpAddr::V4(v4), RecordType::A) => RData::A(A(v4)),
                    (std::net::IpAddr::V6(v6), RecordType::AAAA) => RData::AAAA(AAAA(v6)),
                    _ => continue,
                };
                any = true;
                response.add_answer(Record::from_rdata(qname.clone(), ttl, rdata));
            }
            if !any {
                response.add_name_server(soa(&zone, ttl));
            }
        }
        Answer::Services(targets) => {
            for (port, target) in targets {
                let Ok(target) = Name::from_ascii(&target) else {
                    continue;
                };
                response.add_answer(Record::from_rdata(
                    qname.clone(),
                    ttl,
                    RData::SRV(SRV::new(0, 100, port, target)),
                ));
            }
        }
        Answer::NoData => {
            response.add_name_server(soa(&zone, ttl));
        }
        Answer::NxDomain => {
            response.set_response_code(ResponseCode::NXDomain);
            response.add_name_server(soa(&zone, ttl));
        }
    }
    response
}

/// The zone's SOA record, as CoreDNS's kubernetes plugin gives it in negative answers.
pub fn soa(zone: &Name, ttl: u32) -> Record {
    let origin = zone.to_ascii();
    let ns = Name::from_ascii(format!("ns.dns.{origin}")).unwrap_or_else(|_| zone.clone());
    let mbox = Name::from_ascii(format!("hostmaster.{origin}")).unwrap_or_else(|_| zone.clone());
    let serial = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as u32)
        .unwrap_or(1);
    Record::from_rdata(
        zone.clone(),
        ttl,
        RData::SOA(SOA::new(ns, mbox, serial, 7200, 1800, 86400, ttl)),
    )
}

/// A query message from `raw`, or None for anything else (responses, garbage).
pub fn parse_query(raw: &[u8]) -> Option<Message> {
    let message = Message::from_vec(raw).ok()?;
    (message.message_type() == MessageType::Query).then_some(message)
}

/// A UDP socket and a TCP listener on the same address, as a DNS server needs. With port 0
/// the kernel picks the UDP port, and that port may already be taken for TCP by another
/// process: then another port is tried (up to 50 times). A fixed port is bound once.
pub async fn bind(
    addr: std::net::SocketAddr,
) -> std::io::Result<(tokio::net::UdpSocket, tokio::net::TcpListener)> {
    let tries = if addr.port() == 0 { 50 } else { 1 };
    let mut last = None;
    for _ in 0..tries {
        let udp = tokio::net::UdpSocket::bind(addr).await?;
        match tokio::net::TcpListener::bind(udp.local_addr()?).await {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.expect("at least one try"))
}

/// Serves on `udp` and `tcp` until the UDP socket fails: each query's bytes go to `handler`,
/// whose answer (if any) is sent back. Queries are handled concurrently (a forwarded one may
/// wait for its upstream).
pub async fn serve<H, F>(handler: H, udp: tokio::net::UdpSocket, tcp: tokio::net::TcpListener)
where
    H: Fn(Vec<u8>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Option<Vec<u8>>> + Send + 'static,
{
    let tcp_handler = handler.clone();
    let tcp_task = tokio::spawn(async move {
        loop {
            match tcp.accept().await {
                Ok((stream, _)) => {
                    tokio::spawn(serve_tcp(tcp_handler.clone(), stream));
                }
                Err(e) => {
                    // Out of descriptors, most likely: retrying at once would spin.
                    tracing::warn!("DNS over TCP: accepting a connection: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
    });
    let udp = Arc::new(udp);
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((n, peer)) = udp.recv_from(&mut buf).await else {
            break;
        };
        let limit = udp_limit(&buf[..n]);
        let (udp, answer) = (udp.clone(), handler(buf[..n].to_vec()));
        tokio::spawn(async move {
            if let Some(bytes) = answer.await.and_then(|b| truncate(b, limit)) {
                let _ = udp.send_to(&bytes, peer).await;
            }
        });
    }
    tcp_task.abort();
}

/// The most this server sends in one UDP answer whatever the client advertises: the size
/// DNS Flag Day 2020 settled on, which needs no IP fragmentation (and limits amplification).
const UDP_MAX: u16 = 1232;

/// The largest UDP answer the client of `query` takes: 512 bytes, or what its EDNS record
/// advertises (RFC 6891), at most [`UDP_MAX`].
fn udp_limit(query: &[u8]) -> usize {
    Message::from_vec(query)
        .ok()
        .and_then(|m| m.extensions().as_ref().map(|e| e.max_payload()))
        .map_or(512, |p| usize::from(p.clamp(512, UDP_MAX)))
}

/// `answer` as sent over UDP to a client that takes `limit` bytes: when longer, its header and
/// question alone with the TC bit set, so that the client asks again over TCP (RFC 1035
/// 4.2.1, RFC 7766).
fn truncate(answer: Vec<u8>, limit: usize) -> Option<Vec<u8>> {
    if answer.len() <= limit {
        return Some(answer);
    }
    // The same header (and EDNS record), without its records.
    let mut short = Message::from_vec(&answer).ok()?;
    short.take_answers();
    short.take_name_servers();
    short.take_additionals();
    short.set_truncated(true);
    short.to_vec().ok()
}

async fn serve_tcp<H, F>(handler: H, mut stream: tokio::net::TcpStream)
where
    H: Fn(Vec<u8>) -> F,
    F: Future<Output = Option<Vec<u8>>>,
{
    loop {
        let Ok(len) = stream.read_u16().await else {
            return;
        };
        let mut buf = vec![0u8; usize::from(len)];
        if stream.read_exact(&mut buf).await.is_err() {
            return;
        }
        let Some(bytes) = handler(buf).await else {
            return;
        };
        let Ok(len) = u16::try_from(bytes.len()) else {
            return;
        };
        if stream.write_u16(len).await.is_err() || stream.write_all(&bytes).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::Query;

    fn query(name: &str, kind: RecordType) -> Message {
        let mut m = Message::new();
        m.set_id(7)
            .add_query(Query::query(Name::from_ascii(name).unwrap(), kind));
        m
    }

    #[test]
    fn labels_below_the_zone_reach_the_answer_and_outside_names_are_refused() {
        let r = respond(
            &query("Web.Demo.svc.example.", RecordType::A),
            "example.",
            5,
            |l, _| {
                assert_eq!(l, ["web", "demo", "svc"]);
                Answer::Addresses(vec![
                    "10.0.0.1".parse().unwrap(),
                    "fd00::1".parse().unwrap(),
                ])
            },
        );
        assert_eq!(r.id(), 7);
        assert!(r.authoritative());
        // Only the A record answers an A query.
        assert_eq!(r.answers().len(), 1);
        let r = respond(
            &query("other.org.", RecordType::A),
            "example.",
            5,
            |_, _| unreachable!("not in the zone"),
        );
        assert_eq!(r.response_code(), ResponseCode::Refused);
        let r = respond(
            &query("x.example.", RecordType::A),
            "example.",
            5,
            |_, _| Answer::NxDomain,
        );
        assert_eq!(r.response_code(), ResponseCode::NXDomain);
        assert_eq!(r.name_servers().len(), 1, "negative answers carry the SOA");
    }

    #[test]
    fn long_udp_answers_are_truncated_to_their_question() {
        let q = query("many.example.", RecordType::A);
        let ips: Vec<std::net::IpAddr> = (0..60u8)
            .map(|i| std::net::Ipv4Addr::new(10, 0, 0, i).into())
            .collect();
        let full = respond(&q, "example.", 5, |_, _| Answer::Addresses(ips.clone()))
            .to_vec()
            .unwrap();
        assert!(full.len() > 512);
        let limit = udp_limit(&q.to_vec().unwrap());
        assert_eq!(limit, 512);
        let short = Message::from_vec(&truncate(full.clone(), limit).unwrap()).unwrap();
        assert!(short.truncated());
        assert!(short.answers().is_empty());
        assert_eq!(short.queries().len(), 1);
        assert_eq!(short.id(), 7);
        // A client that advertises a larger buffer gets the whole answer.
        let mut edns = q.clone();
        edns.set_edns({
            let mut e = hickory_proto::op::Edns::new();
            e.set_max_payload(1232);
            e
        });
        let limit = udp_limit(&edns.to_vec().unwrap());
        assert_eq!(limit, 1232);
        assert_eq!(truncate(full.clone(), limit), Some(full));
        // More than that is not sent over UDP, whatever the client says.
        let mut big = q.clone();
        big.set_edns({
            let mut e = hickory_proto::op::Edns::new();
            e.set_max_payload(65_000);
            e
        });
        assert_eq!(udp_limit(&big.to_vec().unwrap()), 1232);
    }

    #[tokio::test]
    async fn udp_and_tcp_queries_are_answered() {
        let (udp, tcp) = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = udp.local_addr().unwrap();
        let handler = |raw: Vec<u8>| async move {
            let q = parse_query(&raw)?;
            respond(&q, "example.", 5, |_, _| {
                Answer::Addresses(vec!["10.1.2.3".parse().unwrap()])
            })
            .to_vec()
            .ok()
        };
        let server = tokio::spawn(serve(handler, udp, tcp));
        let bytes = query("a.example.", RecordType::A).to_vec().unwrap();
        let client = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        client.send_to(&bytes, addr).await.unwrap();
        let mut buf = vec![0u8; 512];
        let n = client.recv(&mut buf).await.unwrap();
        assert_eq!(Message::from_vec(&buf[..n]).unwrap().answers().len(), 1);
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_u16(bytes.len() as u16).await.unwrap();
        stream.write_all(&bytes).await.unwrap();
        let len = stream.read_u16().await.unwrap();
        let mut buf = vec![0u8; usize::from(len)];
        stream.read_exact(&mut buf).await.unwrap();
        assert_eq!(Message::from_vec(&buf).unwrap().answers().len(), 1);
        server.abort();
    }
}
