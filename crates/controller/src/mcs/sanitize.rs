//! A peer's export record, made into something this cluster can write. Peers are separately
//! administered and their API servers are theirs: a record read from one may hold anything
//! its schema (if any) let through. What cannot be part of a valid Service or EndpointSlice
//! is dropped here — a bad port, a malformed name, more endpoints than a slice holds — so an
//! import never fails to be written (or is rewritten on every pass) because of a peer.

use tandem_api::mcs::{ExportedEndpoint, ExportedServiceSpec, ExportedSlice, ServicePort};
use tandem_apimachinery::validation::{is_dns1123_label, validate_label_key};

/// At most this many slices per record, endpoints per slice (an EndpointSlice's own bound)
/// and ports per Service or slice.
pub const MAX_SLICES: usize = 100;
pub const MAX_ENDPOINTS: usize = 1000;
pub const MAX_PORTS: usize = 100;
/// The longest session affinity timeout a Service accepts (a day).
const MAX_AFFINITY_TIMEOUT: i32 = 86_400;

/// A port as an import writes it — protocol TCP when unset, an empty name as none — or None
/// when no Service or EndpointSlice could hold it.
fn port(p: &ServicePort) -> Option<ServicePort> {
    let protocol = p.protocol.clone().unwrap_or_else(|| "TCP".into());
    let name = p.name.clone().filter(|n| !n.is_empty());
    let valid = (1..=65_535).contains(&p.port)
        && matches!(protocol.as_str(), "TCP" | "UDP" | "SCTP")
        && name.as_deref().is_none_or(is_dns1123_label);
    valid.then(|| ServicePort {
        name,
        protocol: Some(protocol),
        app_protocol: p
            .app_protocol
            .clone()
            .filter(|a| validate_label_key(a).is_ok()),
        port: p.port,
    })
}

/// Whether ports are a Service's (each protocol/number once) or a slice's (target ports: two
/// Service ports may share one).
#[derive(Clone, Copy, PartialEq)]
enum Ports {
    Service,
    Slice,
}

/// The valid ports among `ports`, each name once (and for a Service each protocol/number);
/// when there are several, only named ones (a Service with more than one port names each).
fn ports(ports: &[ServicePort], kind: Ports) -> Vec<ServicePort> {
    let mut out: Vec<ServicePort> = Vec::new();
    for p in ports.iter().filter_map(port) {
        let clash = out.iter().any(|q| {
            q.name == p.name
                || (kind == Ports::Service && q.port == p.port && q.protocol == p.protocol)
        });
        if !clash && out.len() < MAX_PORTS {
            out.push(p);
        }
    }
    if out.len() > 1 {
        out.retain(|p| p.name.is_some());
    }
    out
}

fn endpoint(e: &ExportedEndpoint) -> Option<ExportedEndpoint> {
    let addresses: Vec<String> = e
        .addresses
        .iter()
        .filter(|a| a.parse::<std::net::IpAddr>().is_ok())
        .take(1)
        .cloned()
        .collect();
    (!addresses.is_empty()).then(|| ExportedEndpoint {
        addresses,
        hostname: e.hostname.clone().filter(|h| is_dns1123_label(h)),
        ready: e.ready,
    })
}

/// Why a peer's export cannot be imported at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unimportable {
    /// Neither `ClusterSetIP` nor `Headless`.
    #[error("type {0:?} is neither ClusterSetIP nor Headless")]
    Type(String),
    /// The Service's name is not a DNS-1035 label.
    #[error("{0:?} is not a Service name")]
    ServiceName(String),
    /// The namespace's name is not a DNS-1123 label.
    #[error("{0:?} is not a namespace name")]
    Namespace(String),
    /// A ClusterSetIP export with no port a Service could hold.
    #[error("a ClusterSetIP export without a valid port")]
    NoPort,
}

/// `spec` as this cluster imports it, or why it cannot be imported at all.
pub fn sanitize(spec: &ExportedServiceSpec) -> Result<ExportedServiceSpec, Unimportable> {
    if !matches!(spec.type_.as_str(), "ClusterSetIP" | "Headless") {
        return Err(Unimportable::Type(spec.type_.clone()));
    }
    // A Service name is a DNS-1035 label; it is also a label value on every derived object.
    if !is_dns1123_label(&spec.service)
        || !spec.service.starts_with(|c: char| c.is_ascii_lowercase())
    {
        return Err(Unimportable::ServiceName(spec.service.clone()));
    }
    if !is_dns1123_label(&spec.namespace) {
        return Err(Unimportable::Namespace(spec.namespace.clone()));
    }
    let service_ports = ports(&spec.ports, Ports::Service);
    if spec.type_ == "ClusterSetIP" && service_ports.is_empty() {
        return Err(Unimportable::NoPort);
    }
    let affinity = spec
        .session_affinity
        .clone()
        .filter(|a| a == "ClientIP" || a == "None");
    let timeout = spec.session_affinity_timeout_seconds.filter(|t| {
        (1..=MAX_AFFINITY_TIMEOUT).contains(t) && affinity.as_deref() == Some("ClientIP")
    });
    let endpoint_slices = spec
        .endpoint_slices
        .iter()
        .take(MAX_SLICES)
        .map(|s| ExportedSlice {
            ports: ports(&s.ports, Ports::Slice),
            endpoints: s
                .endpoints
                .iter()
                .filter_map(endpoint)
                .take(MAX_ENDPOINTS)
                .collect(),
        })
        .filter(|s| !s.endpoints.is_empty())
        .collect();
    Ok(ExportedServiceSpec {
        ports: service_ports,
        session_affinity: affinity,
        session_affinity_timeout_seconds: timeout,
        endpoint_slices,
        ..spec.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn p(name: Option<&str>, protocol: Option<&str>, port: i32) -> ServicePort {
        ServicePort {
            name: name.map(str::to_string),
            protocol: protocol.map(str::to_string),
            app_protocol: None,
            port,
        }
    }

    fn spec() -> ExportedServiceSpec {
        ExportedServiceSpec {
            cluster_id: "milan".into(),
            namespace: "demo".into(),
            service: "hello".into(),
            exported_at: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            type_: "ClusterSetIP".into(),
            ports: vec![p(Some("http"), None, 80)],
            session_affinity: None,
            session_affinity_timeout_seconds: None,
            endpoint_slices: vec![],
        }
    }

    #[test]
    fn ports_get_defaults_and_what_no_service_could_hold_is_dropped() {
        let mut s = spec();
        s.ports = vec![
            p(Some("http"), None, 80),
            p(Some("http"), Some("TCP"), 81),
            p(Some("dns"), Some("ICMP"), 53),
            p(Some("Bad_Name"), Some("TCP"), 82),
            p(Some("big"), Some("TCP"), 70_000),
            p(None, Some("TCP"), 90),
            p(Some("grpc"), Some("UDP"), 80),
        ];
        s.session_affinity = Some("Sticky".into());
        s.session_affinity_timeout_seconds = Some(10);
        let out = sanitize(&s).unwrap();
        assert_eq!(
            out.ports,
            vec![
                p(Some("http"), Some("TCP"), 80),
                p(Some("grpc"), Some("UDP"), 80)
            ]
        );
        assert_eq!(out.session_affinity, None);
        assert_eq!(out.session_affinity_timeout_seconds, None);
        // A single unnamed port is a valid Service.
        s.ports = vec![p(Some(""), None, 8080)];
        assert_eq!(
            sanitize(&s).unwrap().ports,
            vec![p(None, Some("TCP"), 8080)]
        );
    }

    #[test]
    fn endpoints_keep_one_valid_address_and_a_valid_hostname_only() {
        let mut s = spec();
        s.endpoint_slices = vec![ExportedSlice {
            ports: vec![p(Some("http"), None, 8080), p(Some("metrics"), None, 8080)],
            endpoints: vec![
                ExportedEndpoint {
                    addresses: vec!["nonsense".into(), "10.244.0.7".into(), "10.244.0.8".into()],
                    hostname: Some("NOT A HOST".into()),
                    ready: true,
                },
                ExportedEndpoint {
                    addresses: vec!["x".into()],
                    hostname: Some("web-0".into()),
                    ready: true,
                },
            ],
        }];
        let out = sanitize(&s).unwrap();
        let eps = &out.endpoint_slices[0].endpoints;
        assert_eq!(eps.len(), 1);
        assert_eq!(eps[0].addresses, vec!["10.244.0.7"]);
        assert_eq!(eps[0].hostname, None);
        // Two Service ports may target one port: a slice holds both names.
        assert_eq!(
            out.endpoint_slices[0].ports,
            vec![
                p(Some("http"), Some("TCP"), 8080),
                p(Some("metrics"), Some("TCP"), 8080)
            ]
        );
    }

    #[test]
    fn records_no_import_could_be_written_from_are_refused() {
        let mut s = spec();
        s.type_ = "LoadBalancer".into();
        assert!(
            sanitize(&s)
                .unwrap_err()
                .to_string()
                .contains("LoadBalancer")
        );
        let mut s = spec();
        s.service = "Hello".into();
        assert!(sanitize(&s).is_err());
        s.service = "x".repeat(64);
        assert!(sanitize(&s).is_err());
        let mut s = spec();
        s.ports = vec![p(Some("icmp"), Some("ICMP"), 1)];
        assert!(sanitize(&s).unwrap_err().to_string().contains("port"));
        // A headless Service may have no port.
        s.type_ = "Headless".into();
        assert!(sanitize(&s).is_ok());
    }
}
