//! Cluster DNS for network-mode lab clusters: `cluster.local` answered as CoreDNS's
//! kubernetes plugin answers it, from watched Services and EndpointSlices.
//!
//! The serving loop and the answer skeleton are `tandem-dns`'s (shared with the
//! `clusterset.local` server of multi-cluster services); the UDP socket and TCP listener are
//! made by the caller inside the cluster's edge namespace.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::RecordType;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::Store;

/// The cluster domain.
pub const CLUSTER_DOMAIN: &str = "cluster.local";
/// The kube-dns Service's ClusterIP.
pub const DNS_SERVICE_IP: &str = "10.96.0.10";
/// TTL of answers (CoreDNS's kubernetes plugin default).
const TTL: u32 = 30;

/// The objects answers are computed from, and where other names go.
#[derive(Clone)]
pub struct Zone {
    services: Store<Service>,
    slices: Store<EndpointSlice>,
    config: Arc<parking_lot::RwLock<Forwarding>>,
    /// The namespace forwarded queries leave from (None: this process's own).
    netns: Option<String>,
}

impl Zone {
    /// The zone of the Services and EndpointSlices `view` watches; forwarded queries leave
    /// from namespace `netns`.
    pub fn new(view: super::service_view::ServiceView, netns: Option<String>) -> Zone {
        Zone {
            services: view.services,
            slices: view.slices,
            config: Default::default(),
            netns,
        }
    }

    /// Replaces where names outside the cluster zone go.
    pub fn set_forwarding(&self, forwarding: Forwarding) {
        *self.config.write() = forwarding;
    }
}

/// Where names outside `cluster.local` are sent, from the Corefile: stub domains (a server
/// block per zone with `forward . <servers>`) and the upstream (`forward` in the `.` block).
/// Empty: such names are refused, as CoreDNS refuses them without `forward`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Forwarding {
    /// (zone, servers), most specific zone first.
    pub stubs: Vec<(String, Vec<SocketAddr>)>,
    /// Servers for every other name.
    pub upstream: Vec<SocketAddr>,
}

impl Forwarding {
    /// The servers for `name` (lowercase, no trailing dot), if any.
    fn servers_for(&self, name: &str) -> Option<&[SocketAddr]> {
        self.stubs
            .iter()
            .find(|(zone, _)| name == zone || name.ends_with(&format!(".{zone}")))
            .map(|(_, s)| s.as_slice())
            .or((!self.upstream.is_empty()).then_some(self.upstream.as_slice()))
    }
}

/// The name of the ConfigMap (in kube-system) cluster DNS is configured from, and its key.
pub const CONFIG_MAP: &str = "coredns";
/// The key holding the Corefile.
pub const COREFILE_KEY: &str = "Corefile";
/// The lab's default Corefile: the cluster zone and nothing else.
pub const DEFAULT_COREFILE: &str = ".:53 {\n    errors\n    health\n    kubernetes cluster.local in-addr.arpa ip6.arpa {\n       pods insecure\n       fallthrough in-addr.arpa ip6.arpa\n    }\n    cache 30\n}\n";

/// Why a Corefile is not one the lab can follow.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CorefileError {
    /// A line outside any block that does not open a server block.
    #[error("line {line}: expected a server block (`zone {{`), found {found:?}")]
    NotABlock {
        /// The line's number (1-based).
        line: usize,
        /// The line, trimmed.
        found: String,
    },
    /// A `forward` to something that is not an address.
    #[error("line {line}: forward to {target:?}: not an IP address")]
    NotAnAddress {
        /// The line's number (1-based).
        line: usize,
        /// The target as written.
        target: String,
    },
    /// The file ends inside a block.
    #[error("the last server block does not close")]
    Unclosed,
}

/// Reads the subset of a Corefile the lab honours: server blocks and their `forward`
/// directive. Other plugins are accepted and ignored; a block that does not close, or a
/// `forward` to something that is not an address, is an error naming the line.
pub fn parse_corefile(text: &str) -> Result<Forwarding, CorefileError> {
    let mut forwarding = Forwarding::default();
    let mut zones: Option<Vec<String>> = None;
    let mut depth = 0usize;
    for (n, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        if depth == 0 {
            let Some(head) = line.strip_suffix('{') else {
                return Err(CorefileError::NotABlock {
                    line: n + 1,
                    found: line.to_string(),
                });
            };
            zones = Some(
                head.split_whitespace()
                    .map(|z| {
                        let z = z.split(':').next().unwrap_or(z);
                        z.trim_end_matches('.').to_ascii_lowercase()
                    })
                    .collect(),
            );
            depth = 1;
            continue;
        }
        let opens = line.ends_with('{');
        if line == "}" {
            depth -= 1;
            if depth == 0 {
                zones = None;
            }
            continue;
        }
        if depth == 1 && line.starts_with("forward ") {
            let mut words = line.split_whitespace().skip(1);
            let _from = words.next();
            let mut servers = Vec::new();
            for w in words.take_while(|w| *w != "{") {
                let addr = w.trim_start_matches("dns://");
                let parsed = addr
                    .parse::<SocketAddr>()
                    .or_else(|_| {
                        addr.parse::<std::net::IpAddr>()
                            .map(|ip| SocketAddr::new(ip, 53))
                    })
                    .map_err(|_| CorefileError::NotAnAddress {
                        line: n + 1,
                        target: w.to_string(),
                    })?;
                servers.push(parsed);
            }
            for zone in zones.iter().flatten() {
                if zone.is_empty() {
                    forwarding.upstream = servers.clone();
                } else if zone != CLUSTER_DOMAIN {
                    forwarding.stubs.push((zone.clone(), servers.clone()));
                }
            }
        }
        if opens {
            depth += 1;
        }
    }
    if depth != 0 {
        return Err(CorefileError::Unclosed);
    }
    forwarding
        .stubs
        .sort_by_key(|(zone, _)| std::cmp::Reverse(zone.matches('.').count()));
    Ok(forwarding)
}

/// Keeps `zone`'s forwarding in line with the `kube-system/coredns` ConfigMap (creating the
/// lab default when absent), checking every second; an invalid Corefile keeps the last good
/// configuration and is logged with its line.
pub async fn follow_config(client: kube::Client, zone: Zone) {
    use k8s_openapi::api::core::v1::ConfigMap;
    let api = kube::Api::<ConfigMap>::namespaced(client, "kube-system");
    let mut last: Option<String> = None;
    loop {
        match api.get_opt(CONFIG_MAP).await {
            Ok(Some(cm)) => {
                let text = cm
                    .data
                    .as_ref()
                    .and_then(|d| d.get(COREFILE_KEY))
                    .cloned()
                    .unwrap_or_default();
                if last.as_ref() != Some(&text) {
                    match parse_corefile(&text) {
                        Ok(forwarding) => zone.set_forwarding(forwarding),
                        Err(e) => tracing::error!(
                            "ConfigMap kube-system/{CONFIG_MAP}: invalid Corefile, keeping the last good one: {e}"
                        ),
                    }
                    last = Some(text);
                }
            }
            Ok(None) => {
                let cm: ConfigMap = serde_json::from_value(serde_json::json!({
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": CONFIG_MAP, "namespace": "kube-system"},
                    "data": {COREFILE_KEY: DEFAULT_COREFILE},
                }))
                .expect("valid ConfigMap");
                if let Err(e) = api.create(&Default::default(), &cm).await {
                    tracing::debug!("creating ConfigMap kube-system/{CONFIG_MAP}: {e}");
                }
            }
            Err(e) => tracing::debug!("reading ConfigMap kube-system/{CONFIG_MAP}: {e}"),
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

use tandem_dns::Answer;

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
                        Answer::Addresses(ips.into_iter().map(Into::into).collect())
                    }
                } else {
                    match spec
                        .cluster_ip
                        .as_deref()
                        .and_then(|ip| ip.parse::<std::net::IpAddr>().ok())
                    {
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
                    (false, RecordType::A) => {
                        Answer::Addresses(ips.into_iter().map(Into::into).collect())
                    }
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
                Ok(ip) if kind == RecordType::A => Answer::Addresses(vec![ip.into()]),
                Ok(_) => Answer::NoData,
                Err(_) => Answer::NxDomain,
            },
            // The zone's own structure: cluster.local, svc, <ns>.svc, pod, …
            [] | [_] | [_, _] => Answer::NoData,
            _ => Answer::NxDomain,
        }
    }

    /// The response to one query message: names outside the cluster zone are refused
    /// (lab traffic never leaves the machine; CoreDNS with no `forward` refuses too) unless a
    /// stub domain or the upstream takes them (see [`reply`]).
    fn respond(&self, request: &Message) -> Message {
        tandem_dns::respond(
            request,
            &format!("{CLUSTER_DOMAIN}."),
            TTL,
            |labels, kind| self.answer(labels, kind),
        )
    }
}

/// Serves `zone` on `udp` and `tcp` until the sockets fail.
pub async fn serve(zone: Zone, udp: tokio::net::UdpSocket, tcp: tokio::net::TcpListener) {
    let handler = move |raw: Vec<u8>| {
        let zone = zone.clone();
        async move { reply(&zone, &raw).await }
    };
    tandem_dns::serve(handler, udp, tcp).await
}

async fn reply(zone: &Zone, raw: &[u8]) -> Option<Vec<u8>> {
    let request = tandem_dns::parse_query(raw)?;
    let response = zone.respond(&request);
    if response.response_code() == ResponseCode::Refused {
        let name = request.queries().first()?.name().to_lowercase().to_ascii();
        let name = name.trim_end_matches('.');
        let servers = zone
            .config
            .read()
            .servers_for(name)
            .map(<[SocketAddr]>::to_vec);
        if let Some(servers) = servers {
            let mut failed = response.clone();
            failed.set_response_code(ResponseCode::ServFail);
            return Some(
                forward(zone.netns.as_deref(), raw, request.id(), &servers)
                    .await
                    .unwrap_or_else(|| failed.to_vec().unwrap_or_default()),
            );
        }
    }
    response.to_vec().ok()
}

/// Sends `raw` to each of `servers` in turn (2 s each) from namespace `netns`; the first
/// answer with the query's id.
async fn forward(
    netns: Option<&str>,
    raw: &[u8],
    id: u16,
    servers: &[SocketAddr],
) -> Option<Vec<u8>> {
    let any = SocketAddr::from(([0, 0, 0, 0], 0));
    let socket = match netns {
        Some(ns) => super::netns::udp_socket(ns, any).await.ok()?,
        None => tokio::net::UdpSocket::bind(any).await.ok()?,
    };
    let mut buf = vec![0u8; 4096];
    for server in servers {
        if socket.send_to(raw, server).await.is_err() {
            continue;
        }
        let answer = tokio::time::timeout(std::time::Duration::from_secs(2), async {
            loop {
                let (n, from) = socket.recv_from(&mut buf).await.ok()?;
                if from == *server && n >= 2 && u16::from_be_bytes([buf[0], buf[1]]) == id {
                    return Some(buf[..n].to_vec());
                }
            }
        })
        .await;
        if let Ok(Some(bytes)) = answer {
            return Some(bytes);
        }
    }
    None
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
    fn corefiles_give_stub_domains_and_an_upstream() {
        let forwarding = parse_corefile(
            ".:53 {\n  errors\n  kubernetes cluster.local in-addr.arpa {\n    pods insecure\n  }\n  forward . 10.0.0.53 10.0.0.54:5353\n}\n\
             corp.example:53 {\n  forward . 10.1.0.1\n}\n\
             eu.corp.example {\n  forward . dns://10.2.0.1\n}\n",
        )
        .unwrap();
        assert_eq!(
            forwarding.upstream,
            vec![
                "10.0.0.53:53".parse().unwrap(),
                "10.0.0.54:5353".parse().unwrap()
            ]
        );
        assert_eq!(
            forwarding.stubs[0].0, "eu.corp.example",
            "most specific first"
        );
        assert_eq!(
            forwarding.servers_for("db.eu.corp.example"),
            Some(&["10.2.0.1:53".parse().unwrap()][..])
        );
        assert_eq!(
            forwarding.servers_for("corp.example"),
            Some(&["10.1.0.1:53".parse().unwrap()][..])
        );
        assert_eq!(
            parse_corefile(DEFAULT_COREFILE).unwrap(),
            Forwarding::default()
        );
        let broken = parse_corefile("x {\n forward . nowhere\n}\n")
            .unwrap_err()
            .to_string();
        assert!(broken.starts_with("line 2:"), "{broken}");
        assert!(parse_corefile(". {\n errors\n").is_err());
    }

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
