//! Cluster DNS for network-mode lab clusters: `cluster.local` answered as CoreDNS's
//! kubernetes plugin answers it, from watched Services and EndpointSlices.
//!
//! Messages are encoded and decoded by hickory-proto; the serving loop (one UDP socket, one
//! TCP listener, made by the caller inside the cluster's edge namespace) is written here
//! because the zone is computed from live API objects on each query, which hickory-server's
//! authorities (zone files, stores, forwarders) do not model.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::rdata::{A, SOA, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::Store;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The cluster domain.
pub const CLUSTER_DOMAIN: &str = "cluster.local";
/// The kube-dns Service's ClusterIP.
pub const DNS_SERVICE_IP: &str = "10.96.0.10";
/// TTL of answers (CoreDNS's kubernetes plugin default).
const TTL: u32 = 30;

/// The objects answers are computed from.
#[derive(Clone)]
pub struct Zone {
    services: Store<Service>,
    slices: Store<EndpointSlice>,
}

impl Zone {
    /// The zone of the Services and EndpointSlices `view` watches.
    pub fn new(view: super::ServiceView) -> Zone {
        Zone {
            services: view.services,
            slices: view.slices,
        }
    }
}

/// What a name in the cluster zone is.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    /// Addresses (A records).
    Addresses(Vec<Ipv4Addr>),
    /// SRV targets: (port, target name).
    Services(Vec<(u16, String)>),
    /// The name exists but has no records of the type asked.
    NoData,
    /// No such name.
    NxDomain,
}

impl Zone {
    fn service(&self, ns: &str, name: &str) -> Option<Arc<Service>> {
        self.services.state().into_iter().find(|s| {
            s.metadata.namespace.as_deref() == Some(ns) && s.metadata.name.as_deref() == Some(name)
        })
    }

    /// Ready endpoint addresses of Service `ns/name`, with their hostnames.
    fn endpoints(&self, ns: &str, name: &str) -> Vec<(Ipv4Addr, Option<String>)> {
        let mut out = Vec::new();
        for slice in self.slices.state() {
            if slice.metadata.namespace.as_deref() != Some(ns)
                || slice.address_type != "IPv4"
                || slice
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("kubernetes.io/service-name"))
                    .map(String::as_str)
                    != Some(name)
            {
                continue;
            }
            for ep in &slice.endpoints {
                if !ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true) {
                    continue;
                }
                for ip in ep.addresses.iter().filter_map(|a| a.parse().ok()) {
                    out.push((ip, ep.hostname.clone()));
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// Answers `labels` (the name below the cluster domain, most specific first) for `kind`.
    fn answer(&self, labels: &[String], kind: RecordType) -> Answer {
        match labels {
            // <svc>.<ns>.svc
            [svc, ns, s] if s == "svc" => {
                let Some(service) = self.service(ns, svc) else {
                    return Answer::NxDomain;
                };
                let spec = service.spec.clone().unwrap_or_default();
                let headless = spec.cluster_ip.as_deref() == Some("None");
                if kind != RecordType::A {
                    return Answer::NoData;
                }
                if headless {
                    let ips: Vec<Ipv4Addr> = self
                        .endpoints(ns, svc)
                        .into_iter()
                        .map(|(ip, _)| ip)
                        .collect();
                    if ips.is_empty() {
                        Answer::NoData
                    } else {
                        Answer::Addresses(ips)
                    }
                } else {
                    match spec.cluster_ip.as_deref().and_then(|ip| ip.parse().ok()) {
                        Some(ip) => Answer::Addresses(vec![ip]),
                        None => Answer::NoData,
                    }
                }
            }
            // <hostname>.<svc>.<ns>.svc (endpoints of headless Services with a hostname)
            [host, svc, ns, s] if s == "svc" && !host.starts_with('_') => {
                let ips: Vec<Ipv4Addr> = self
                    .endpoints(ns, svc)
                    .into_iter()
                    .filter(|(_, h)| h.as_deref() == Some(host.as_str()))
                    .map(|(ip, _)| ip)
                    .collect();
                match (ips.is_empty(), kind) {
                    (true, _) => Answer::NxDomain,
                    (false, RecordType::A) => Answer::Addresses(ips),
                    (false, _) => Answer::NoData,
                }
            }
            // _<port>._<proto>.<svc>.<ns>.svc
            [port, proto, svc, ns, s] if s == "svc" && port.starts_with('_') => {
                let Some(service) = self.service(ns, svc) else {
                    return Answer::NxDomain;
                };
                let want_port = &port[1..];
                let want_proto = proto.trim_start_matches('_').to_ascii_uppercase();
                let found = service
                    .spec
                    .iter()
                    .flat_map(|s| s.ports.iter().flatten())
                    .find(|p| {
                        p.name.as_deref() == Some(want_port)
                            && p.protocol.as_deref().unwrap_or("TCP") == want_proto
                    });
                match (found, kind) {
                    (None, _) => Answer::NxDomain,
                    (Some(p), RecordType::SRV) => Answer::Services(vec![(
                        u16::try_from(p.port).unwrap_or(0),
                        format!("{svc}.{ns}.svc.{CLUSTER_DOMAIN}."),
                    )]),
                    (Some(_), _) => Answer::NoData,
                }
            }
            // <a-b-c-d>.<ns>.pod
            [ip, _ns, p] if p == "pod" => match ip.replace('-', ".").parse::<Ipv4Addr>() {
                Ok(ip) if kind == RecordType::A => Answer::Addresses(vec![ip]),
                Ok(_) => Answer::NoData,
                Err(_) => Answer::NxDomain,
            },
            // The zone's own structure: cluster.local, svc, <ns>.svc, pod, …
            [] | [_] | [_, _] => Answer::NoData,
            _ => Answer::NxDomain,
        }
    }

    /// The response to one query message.
    fn respond(&self, request: &Message) -> Message {
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
        let zone = Name::from_ascii(format!("{CLUSTER_DOMAIN}.")).expect("valid zone name");
        let qname = query.name().to_lowercase();
        if !zone.zone_of(&qname) {
            // Nothing outside the cluster zone is answered: lab traffic never leaves the
            // machine (CoreDNS with no `forward` refuses too).
            response.set_response_code(ResponseCode::Refused);
            return response;
        }
        response.set_authoritative(true);
        let labels: Vec<String> = qname
            .iter()
            .take(qname.num_labels() as usize - zone.num_labels() as usize)
            .map(|l| String::from_utf8_lossy(l).into_owned())
            .collect();
        match self.answer(&labels, query.query_type()) {
            Answer::Addresses(ips) => {
                for ip in ips {
                    response.add_answer(Record::from_rdata(qname.clone(), TTL, RData::A(A(ip))));
                }
            }
            Answer::Services(targets) => {
                for (port, target) in targets {
                    let Ok(target) = Name::from_ascii(&target) else {
                        continue;
                    };
                    response.add_answer(Record::from_rdata(
                        qname.clone(),
                        TTL,
                        RData::SRV(SRV::new(0, 100, port, target)),
                    ));
                }
            }
            Answer::NoData => {
                response.add_name_server(soa(&zone));
            }
            Answer::NxDomain => {
                response.set_response_code(ResponseCode::NXDomain);
                response.add_name_server(soa(&zone));
            }
        }
        response
    }
}

/// The zone's SOA record, as CoreDNS's kubernetes plugin gives it in negative answers.
fn soa(zone: &Name) -> Record {
    let ns = Name::from_ascii(format!("ns.dns.{CLUSTER_DOMAIN}.")).expect("valid name");
    let mbox = Name::from_ascii(format!("hostmaster.{CLUSTER_DOMAIN}.")).expect("valid name");
    let serial = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as u32)
        .unwrap_or(1);
    Record::from_rdata(
        zone.clone(),
        TTL,
        RData::SOA(SOA::new(ns, mbox, serial, 7200, 1800, 86400, TTL)),
    )
}

/// Serves `zone` on `udp` and `tcp` until the sockets fail.
pub async fn serve(zone: Zone, udp: tokio::net::UdpSocket, tcp: tokio::net::TcpListener) {
    let tcp_zone = zone.clone();
    let tcp_task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = tcp.accept().await else {
                continue;
            };
            tokio::spawn(serve_tcp(tcp_zone.clone(), stream));
        }
    });
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((n, peer)) = udp.recv_from(&mut buf).await else {
            break;
        };
        if let Some(bytes) = reply(&zone, &buf[..n]) {
            let _ = udp.send_to(&bytes, peer).await;
        }
    }
    tcp_task.abort();
}

async fn serve_tcp(zone: Zone, mut stream: tokio::net::TcpStream) {
    loop {
        let Ok(len) = stream.read_u16().await else {
            return;
        };
        let mut buf = vec![0u8; usize::from(len)];
        if stream.read_exact(&mut buf).await.is_err() {
            return;
        }
        let Some(bytes) = reply(&zone, &buf) else {
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

fn reply(zone: &Zone, request: &[u8]) -> Option<Vec<u8>> {
    let request = Message::from_vec(request).ok()?;
    if request.message_type() != MessageType::Query {
        return None;
    }
    zone.respond(&request).to_vec().ok()
}

/// The resolver configuration kubelet writes for `pod` (dnsPolicy and dnsConfig), with
/// `dns_ip` the cluster DNS Service's address.
pub fn resolv_conf(pod: &k8s_openapi::api::core::v1::Pod, dns_ip: &str) -> String {
    let spec = pod.spec.clone().unwrap_or_default();
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let host_network = spec.host_network.unwrap_or(false);
    let policy = spec.dns_policy.as_deref().unwrap_or("ClusterFirst");
    let cluster_first = match policy {
        "ClusterFirstWithHostNet" => true,
        "ClusterFirst" => !host_network,
        _ => false,
    };
    let (mut servers, mut searches, mut options): (Vec<String>, Vec<String>, Vec<String>) =
        if cluster_first {
            (
                vec![dns_ip.to_string()],
                vec![
                    format!("{ns}.svc.{CLUSTER_DOMAIN}"),
                    format!("svc.{CLUSTER_DOMAIN}"),
                    CLUSTER_DOMAIN.to_string(),
                ],
                vec!["ndots:5".to_string()],
            )
        } else {
            // Default (the node's resolver) and None: the lab's nodes resolve nothing
            // outside, so they start empty.
            (Vec::new(), Vec::new(), Vec::new())
        };
    if let Some(config) = &spec.dns_config {
        servers.extend(config.nameservers.iter().flatten().cloned());
        searches.extend(config.searches.iter().flatten().cloned());
        for o in config.options.iter().flatten() {
            let Some(name) = &o.name else { continue };
            options.retain(|existing| existing.split(':').next() != Some(name.as_str()));
            options.push(match &o.value {
                Some(v) => format!("{name}:{v}"),
                None => name.clone(),
            });
        }
    }
    // kubelet's limits: 3 nameservers, 32 search domains.
    servers.dedup();
    servers.truncate(3);
    let mut seen = std::collections::HashSet::new();
    searches.retain(|s| seen.insert(s.clone()));
    searches.truncate(32);
    let mut out = String::new();
    if !searches.is_empty() {
        out.push_str(&format!("search {}\n", searches.join(" ")));
    }
    for s in servers {
        out.push_str(&format!("nameserver {s}\n"));
    }
    if !options.is_empty() {
        out.push_str(&format!("options {}\n", options.join(" ")));
    }
    out
}

/// The address the DNS server listens on in the edge namespace (UDP and TCP 53).
pub fn listen_addr(edge_ip: Ipv4Addr) -> SocketAddr {
    SocketAddr::from((edge_ip, 53))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn cluster_first_pods_search_their_namespace_first() {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "demo"}, "spec": {"containers": []}
        }))
        .unwrap();
        assert_eq!(
            resolv_conf(&pod, "10.96.0.10"),
            "search demo.svc.cluster.local svc.cluster.local cluster.local\n\
             nameserver 10.96.0.10\noptions ndots:5\n"
        );
        let custom: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "demo"},
            "spec": {"containers": [], "dnsPolicy": "None", "dnsConfig": {
                "nameservers": ["10.0.0.53"], "searches": ["example.org"],
                "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}]}}
        }))
        .unwrap();
        assert_eq!(
            resolv_conf(&custom, "10.96.0.10"),
            "search example.org\nnameserver 10.0.0.53\noptions ndots:2 edns0\n"
        );
    }
}
