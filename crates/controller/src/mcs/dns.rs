//! `clusterset.local`, answered from this cluster's ServiceImports and their EndpointSlices as
//! the MCS DNS specification says:
//!
//! - `<svc>.<ns>.svc.clusterset.local`: A/AAAA of the import's IP (ClusterSetIP), or of every
//!   ready endpoint (Headless; NXDOMAIN while none is ready);
//! - `<hostname>.<clusterid>.<svc>.<ns>.svc.clusterset.local`: the endpoint of that hostname in
//!   that cluster (Headless);
//! - `_<port>._<proto>.<svc>.<ns>.svc.clusterset.local`: SRV for named ports — to the service
//!   name (ClusterSetIP), or one per ready endpoint with a hostname (Headless).
//!
//! In network-mode lab clusters the cluster DNS forwards the zone here (a stub domain in its
//! Corefile, as CoreDNS's would); `tandem install` adds it.

use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::{ObjectRef, Store};
use tandem_api::mcs::{CLUSTERSET_DOMAIN, SERVICE_NAME_LABEL, SOURCE_CLUSTER_LABEL, ServiceImport};
use tandem_dns::Answer;
use tandem_dns::hickory_proto::rr::RecordType;

use tandem_api::names::{MCS_SLICE_MANAGER as SLICE_MANAGER, SLICE_MANAGED_BY_LABEL};

/// TTL of answers: as short as CoreDNS's multicluster plugin's default, so that a moved
/// import is followed quickly.
const TTL: u32 = 5;

/// The zone, read from the controller's caches.
#[derive(Clone)]
pub struct Zone {
    imports: Store<ServiceImport>,
    slices: Store<EndpointSlice>,
}

/// One ready endpoint of an import: its address, hostname, cluster and ports by name.
struct Endpoint {
    ip: IpAddr,
    hostname: Option<String>,
    cluster: String,
    ports: Vec<(String, String, u16)>,
}

impl Zone {
    pub fn new(imports: Store<ServiceImport>, slices: Store<EndpointSlice>) -> Zone {
        Zone { imports, slices }
    }

    fn endpoints(&self, ns: &str, svc: &str) -> Vec<Endpoint> {
        let mut out = Vec::new();
        for slice in self.slices.state() {
            let labels = slice.metadata.labels.clone().unwrap_or_default();
            if slice.metadata.namespace.as_deref() != Some(ns)
                || labels.get(SERVICE_NAME_LABEL).map(String::as_str) != Some(svc)
                || labels.get(SLICE_MANAGED_BY_LABEL).map(String::as_str) != Some(SLICE_MANAGER)
            {
                continue;
            }
            let cluster = labels
                .get(SOURCE_CLUSTER_LABEL)
                .cloned()
                .unwrap_or_default();
            let ports: Vec<(String, String, u16)> = slice
                .ports
                .iter()
                .flatten()
                .filter_map(|p| {
                    Some((
                        p.name.clone().filter(|n| !n.is_empty())?,
                        p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                        u16::try_from(p.port?).ok()?,
                    ))
                })
                .collect();
            for ep in &slice.endpoints {
                if !ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true) {
                    continue;
                }
                for ip in ep.addresses.iter().filter_map(|a| a.parse().ok()) {
                    out.push(Endpoint {
                        ip,
                        hostname: ep.hostname.clone(),
                        cluster: cluster.clone(),
                        ports: ports.clone(),
                    });
                }
            }
        }
        out.sort_by_key(|e| e.ip);
        out
    }

    fn namespace_has_imports(&self, ns: &str) -> bool {
        self.imports
            .state()
            .iter()
            .any(|i| i.metadata.namespace.as_deref() == Some(ns))
    }

    /// Answers `labels` (below `clusterset.local`, most specific first) for `kind`.
    fn answer(&self, labels: &[String], kind: RecordType) -> Answer {
        let addresses = |ips: Vec<IpAddr>| {
            if ips.is_empty() {
                Answer::NxDomain
            } else if matches!(kind, RecordType::A | RecordType::AAAA) {
                Answer::Addresses(ips)
            } else {
                Answer::NoData
            }
        };
        let import = |ns: &str, svc: &str| self.imports.get(&ObjectRef::new(svc).within(ns));
        match labels {
            // <svc>.<ns>.svc
            [svc, ns, s] if s == "svc" => {
                let Some(import) = import(ns, svc) else {
                    return Answer::NxDomain;
                };
                if import.spec.type_ == "Headless" {
                    addresses(self.endpoints(ns, svc).into_iter().map(|e| e.ip).collect())
                } else {
                    let ips: Vec<IpAddr> = import
                        .spec
                        .ips
                        .iter()
                        .filter_map(|ip| ip.parse().ok())
                        .collect();
                    if ips.is_empty() {
                        // Known, but its IP is not allocated yet.
                        Answer::NoData
                    } else {
                        addresses(ips)
                    }
                }
            }
            // _<port>._<proto>.<svc>.<ns>.svc
            [port, proto, svc, ns, s] if s == "svc" && port.starts_with('_') => {
                let Some(import) = import(ns, svc) else {
                    return Answer::NxDomain;
                };
                let want_port = &port[1..];
                let want_proto = proto.trim_start_matches('_').to_ascii_uppercase();
                let zone = format!("{svc}.{ns}.svc.{CLUSTERSET_DOMAIN}.");
                let targets: Vec<(u16, String)> = if import.spec.type_ == "Headless" {
                    self.endpoints(ns, svc)
                        .into_iter()
                        .filter_map(|e| {
                            let (_, _, p) = e
                                .ports
                                .iter()
                                .find(|(n, pr, _)| n == want_port && *pr == want_proto)?;
                            Some((*p, format!("{}.{}.{zone}", e.hostname?, e.cluster)))
                        })
                        .collect()
                } else {
                    import
                        .spec
                        .ports
                        .iter()
                        .filter(|p| {
                            p.name.as_deref() == Some(want_port)
                                && p.protocol.as_deref().unwrap_or("TCP") == want_proto
                        })
                        .filter_map(|p| Some((u16::try_from(p.port).ok()?, zone.clone())))
                        .collect()
                };
                match (targets.is_empty(), kind) {
                    (true, _) => Answer::NxDomain,
                    (false, RecordType::SRV) => Answer::Services(targets),
                    (false, _) => Answer::NoData,
                }
            }
            // <hostname>.<clusterid>.<svc>.<ns>.svc (endpoints of headless imports)
            [host, cluster, svc, ns, s] if s == "svc" => {
                if import(ns, svc).is_none_or(|i| i.spec.type_ != "Headless") {
                    return Answer::NxDomain;
                }
                addresses(
                    self.endpoints(ns, svc)
                        .into_iter()
                        .filter(|e| e.hostname.as_deref() == Some(host) && e.cluster == *cluster)
                        .map(|e| e.ip)
                        .collect(),
                )
            }
            // The zone's own structure: clusterset.local, svc, <ns>.svc.
            [] => Answer::NoData,
            [s] if s == "svc" => Answer::NoData,
            [ns, s] if s == "svc" => {
                if self.namespace_has_imports(ns) {
                    Answer::NoData
                } else {
                    Answer::NxDomain
                }
            }
            // Names with names below them (`<cluster>.<svc>…` of a headless import,
            // `_<proto>.<svc>…`): NODATA, since a resolver that takes NXDOMAIN as "nothing
            // below" (RFC 8020) would miss those.
            [_, svc, ns, s] if s == "svc" && import(ns, svc).is_some() => Answer::NoData,
            _ => Answer::NxDomain,
        }
    }

    /// The answer to one query's bytes.
    pub fn reply(&self, raw: &[u8]) -> Option<Vec<u8>> {
        let request = tandem_dns::parse_query(raw)?;
        tandem_dns::respond(
            &request,
            &format!("{CLUSTERSET_DOMAIN}."),
            TTL,
            |labels, kind| self.answer(labels, kind),
        )
        .to_vec()
        .ok()
    }
}

/// Serves `zone` on UDP and TCP `addr` until the socket fails.
pub async fn listen_and_serve(zone: Zone, addr: SocketAddr) -> std::io::Result<()> {
    let (udp, tcp) = tandem_dns::bind(addr).await?;
    tracing::info!(%addr, "serving {CLUSTERSET_DOMAIN}");
    let handler = move |raw: Vec<u8>| {
        let answer = zone.reply(&raw);
        async move { answer }
    };
    tandem_dns::serve(handler, udp, tcp).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::{reflector, watcher};
    use tandem_api::mcs::ServiceImportSpec;

    fn zone() -> Zone {
        let (imports, mut writer) = reflector::store();
        let mut import = ServiceImport::new(
            "hello",
            ServiceImportSpec {
                ports: vec![],
                ips: vec!["10.96.0.42".into()],
                type_: "ClusterSetIP".into(),
                session_affinity: None,
                session_affinity_config: None,
            },
        );
        import.metadata.namespace = Some("demo".into());
        writer.apply_watcher_event(&watcher::Event::Apply(import));
        let (slices, _) = reflector::store::<EndpointSlice>();
        Zone::new(imports, slices)
    }

    fn labels(name: &str) -> Vec<String> {
        name.split('.')
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn names_that_cannot_exist_are_nxdomain_and_the_zone_s_structure_is_nodata() {
        let z = zone();
        assert_eq!(
            z.answer(&labels("hello.demo.svc"), RecordType::A),
            Answer::Addresses(vec!["10.96.0.42".parse().unwrap()])
        );
        assert_eq!(
            z.answer(&labels("nope.demo.svc"), RecordType::A),
            Answer::NxDomain
        );
        for existing in ["", "svc", "demo.svc"] {
            assert_eq!(
                z.answer(&labels(existing), RecordType::A),
                Answer::NoData,
                "{existing:?}"
            );
        }
        // A search-path suffix, a namespace without imports, a name outside `svc`.
        assert_eq!(
            z.answer(&labels("_tcp.hello.demo.svc"), RecordType::A),
            Answer::NoData
        );
        for absent in [
            "www",
            "example.com",
            "other.svc",
            "hello.demo",
            "_tcp.nope.demo.svc",
        ] {
            assert_eq!(
                z.answer(&labels(absent), RecordType::A),
                Answer::NxDomain,
                "{absent:?}"
            );
        }
    }
}
