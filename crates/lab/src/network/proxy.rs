//! kube-proxy for network-mode lab nodes: Services as nftables DNAT rules in every node
//! namespace (and the edge, so the API server reaches webhook Services as kube-apiserver
//! does), following Services and EndpointSlices. One table, `ip tandem-proxy`, replaced in
//! one transaction on each change, as kube-proxy's nftables mode syncs.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::Store;

/// The mark kube-proxy sets on connections to masquerade.
const MASQ_MARK: u32 = 0x4000;

/// One endpoint a Service port leads to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Target {
    ip: Ipv4Addr,
    port: u16,
}

/// One Service port's rules.
#[derive(Clone, Debug)]
struct ServicePort {
    id: String,
    cluster_ips: Vec<Ipv4Addr>,
    protocol: &'static str,
    port: u16,
    node_port: Option<u16>,
    /// Load-balancer ingress addresses (`type: LoadBalancer` only), served by the edge.
    load_balancer_ips: Vec<Ipv4Addr>,
    targets: Vec<Target>,
}

fn protocol(p: Option<&str>) -> Option<&'static str> {
    match p.unwrap_or("TCP") {
        "TCP" => Some("tcp"),
        "UDP" => Some("udp"),
        "SCTP" => Some("sctp"),
        _ => None,
    }
}

/// The Service ports of `services` with their ready endpoints from `slices`.
fn service_ports(services: &[Arc<Service>], slices: &[Arc<EndpointSlice>]) -> Vec<ServicePort> {
    let mut by_service: BTreeMap<(String, String), Vec<&EndpointSlice>> = BTreeMap::new();
    for slice in slices {
        if slice.address_type != "IPv4" {
            continue;
        }
        let Some(svc) = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("kubernetes.io/service-name"))
        else {
            continue;
        };
        let ns = slice.metadata.namespace.clone().unwrap_or_default();
        by_service.entry((ns, svc.clone())).or_default().push(slice);
    }
    let mut out = Vec::new();
    for svc in services {
        let Some(spec) = &svc.spec else { continue };
        let ns = svc.metadata.namespace.clone().unwrap_or_default();
        let name = svc.metadata.name.clone().unwrap_or_default();
        let cluster_ips: Vec<Ipv4Addr> = spec
            .cluster_ips
            .iter()
            .flatten()
            .chain(spec.cluster_ip.iter())
            .filter_map(|ip| ip.parse().ok())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        // Headless Services have no ClusterIP path; ExternalName ones no proxying at all.
        if cluster_ips.is_empty() || spec.type_.as_deref() == Some("ExternalName") {
            continue;
        }
        let load_balancer_ips = if spec.type_.as_deref() == Some("LoadBalancer") {
            super::servicelb::ingress_ips(svc)
        } else {
            Vec::new()
        };
        let slices = by_service
            .get(&(ns.clone(), name.clone()))
            .cloned()
            .unwrap_or_default();
        for port in spec.ports.iter().flatten() {
            let Some(proto) = protocol(port.protocol.as_deref()) else {
                continue;
            };
            let Ok(svc_port) = u16::try_from(port.port) else {
                continue;
            };
            let port_name = port.name.clone().unwrap_or_default();
            let mut targets = Vec::new();
            for slice in &slices {
                let Some(slice_port) = slice.ports.iter().flatten().find(|p| {
                    p.name.clone().unwrap_or_default() == port_name
                        && p.protocol.as_deref().unwrap_or("TCP")
                            == port.protocol.as_deref().unwrap_or("TCP")
                }) else {
                    continue;
                };
                let Some(target_port) = slice_port.port.and_then(|p| u16::try_from(p).ok()) else {
                    continue;
                };
                for ep in &slice.endpoints {
                    // kube-proxy sends to ready endpoints (terminating ones only when none
                    // is ready, which the lab's graceful deletions make rare).
                    let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
                    if !ready {
                        continue;
                    }
                    for ip in ep.addresses.iter().filter_map(|a| a.parse().ok()) {
                        targets.push(Target {
                            ip,
                            port: target_port,
                        });
                    }
                }
            }
            targets.sort();
            targets.dedup();
            out.push(ServicePort {
                id: format!("{ns}/{name}:{port_name}:{proto}"),
                cluster_ips: cluster_ips.clone(),
                protocol: proto,
                port: svc_port,
                node_port: port
                    .node_port
                    .and_then(|p| u16::try_from(p).ok())
                    .filter(|_| matches!(spec.type_.as_deref(), Some("NodePort" | "LoadBalancer"))),
                load_balancer_ips: load_balancer_ips.clone(),
                targets,
            });
        }
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    out
}

/// The nftables script that replaces the proxy's table, for a node whose address is
/// `node_ip` (None for the edge, which has no NodePorts), or for the edge with the cluster's
/// WAN address `wan_ip` (where load-balancer ingresses are served).
fn render(ports: &[ServicePort], node_ip: Option<Ipv4Addr>, wan_ip: Option<Ipv4Addr>) -> String {
    let mut s = String::new();
    // Creating then deleting the table makes the reload one transaction whether or not it
    // existed (kube-proxy's pattern).
    s.push_str("table ip tandem-proxy\ndelete table ip tandem-proxy\ntable ip tandem-proxy {\n");
    let _ = writeln!(
        s,
        "\tchain prerouting {{\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t\tjump services\n\t}}\n\
         \tchain output {{\n\t\ttype nat hook output priority -100; policy accept;\n\t\tjump services\n\t}}\n\
         \tchain postrouting {{\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n\t\tmeta mark & {MASQ_MARK:#x} == {MASQ_MARK:#x} masquerade\n\t}}\n\
         \tchain mark-for-masquerade {{\n\t\tmeta mark set meta mark | {MASQ_MARK:#x}\n\t}}\n\
         \tchain filter-reject {{\n\t\ttype filter hook forward priority 0; policy accept;\n\t\tjump no-endpoints\n\t}}\n\
         \tchain filter-reject-output {{\n\t\ttype filter hook output priority 0; policy accept;\n\t\tjump no-endpoints\n\t}}"
    );
    let mut services = String::new();
    let mut no_endpoints = String::new();
    let mut chains = String::new();
    for (i, p) in ports.iter().enumerate() {
        let chain = format!("svc-{i}");
        let mut matches: Vec<String> = p
            .cluster_ips
            .iter()
            .map(|ip| format!("ip daddr {ip} {} dport {}", p.protocol, p.port))
            .collect();
        let node_port = match (p.node_port, node_ip) {
            (Some(np), Some(ip)) => Some(format!("ip daddr {ip} {} dport {np}", p.protocol)),
            _ => None,
        };
        // The load balancer's address keeps the client's source (see servicelb).
        if let Some(wan) = wan_ip.filter(|w| p.load_balancer_ips.contains(w)) {
            matches.push(format!("ip daddr {wan} {} dport {}", p.protocol, p.port));
        }
        if p.targets.is_empty() {
            for m in matches.iter().chain(node_port.iter()) {
                let _ = writeln!(no_endpoints, "\t\t{m} reject comment \"{}\"", p.id);
            }
            continue;
        }
        for m in matches.drain(..) {
            let _ = writeln!(services, "\t\t{m} goto {chain}");
        }
        if let Some(m) = node_port {
            // NodePort traffic is masqueraded (externalTrafficPolicy: Cluster).
            let _ = writeln!(services, "\t\t{m} jump mark-for-masquerade");
            let _ = writeln!(services, "\t\t{m} goto {chain}");
        }
        let _ = writeln!(chains, "\tchain {chain} {{");
        if p.targets.len() == 1 {
            let _ = writeln!(chains, "\t\tgoto {chain}-ep-0");
        } else {
            let arms: Vec<String> = (0..p.targets.len())
                .map(|j| format!("{j} : goto {chain}-ep-{j}"))
                .collect();
            let _ = writeln!(
                chains,
                "\t\tnumgen random mod {} vmap {{ {} }}",
                p.targets.len(),
                arms.join(", ")
            );
        }
        chains.push_str("\t}\n");
        for (j, t) in p.targets.iter().enumerate() {
            // A pod reaching itself through its Service (hairpin) must see the node as the
            // source, or it would answer itself directly.
            let _ = writeln!(
                chains,
                "\tchain {chain}-ep-{j} {{\n\t\tip saddr {ip} jump mark-for-masquerade\n\t\tmeta l4proto {proto} dnat to {ip}:{port}\n\t}}",
                ip = t.ip,
                port = t.port,
                proto = p.protocol,
            );
        }
    }
    let _ = write!(s, "\tchain services {{\n{services}\t}}\n");
    let _ = write!(s, "\tchain no-endpoints {{\n{no_endpoints}\t}}\n");
    s.push_str(&chains);
    s.push_str("}\n");
    s
}

/// Where the proxy applies its rules: a namespace, and the node address NodePorts listen
/// on there (None for the edge).
#[derive(Clone, Debug)]
pub struct ProxyTarget {
    /// The network namespace.
    pub netns: String,
    /// The node's InternalIP.
    pub node_ip: Option<Ipv4Addr>,
    /// The cluster's WAN address, for the edge (load-balancer ingresses).
    pub wan_ip: Option<Ipv4Addr>,
}

/// Runs the proxy for `targets` until the watches end: on any Service or EndpointSlice
/// change (let settle for 100 ms), renders each target's table and applies it where changed.
pub async fn run(view: super::service_view::ServiceView, targets: Vec<ProxyTarget>) {
    let mut changes = view.changes.clone();
    let mut applied: BTreeMap<String, String> = BTreeMap::new();
    loop {
        changes.borrow_and_update();
        sync(&view.services, &view.slices, &targets, &mut applied).await;
        if changes.changed().await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn sync(
    services: &Store<Service>,
    slices: &Store<EndpointSlice>,
    targets: &[ProxyTarget],
    applied: &mut BTreeMap<String, String>,
) {
    let ports = service_ports(&services.state(), &slices.state());
    for target in targets {
        let script = render(&ports, target.node_ip, target.wan_ip);
        if applied.get(&target.netns) == Some(&script) {
            continue;
        }
        let (ns, text) = (target.netns.clone(), script.clone());
        match tokio::task::spawn_blocking(move || super::topology::nft(&ns, &text)).await {
            Ok(Ok(())) => {
                applied.insert(target.netns.clone(), script);
            }
            Ok(Err(e)) => tracing::error!(netns = %target.netns, "applying Service rules: {e}"),
            Err(e) => tracing::error!(netns = %target.netns, "applying Service rules: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(v: serde_json::Value) -> Arc<Service> {
        Arc::new(serde_json::from_value(v).unwrap())
    }
    fn slice(v: serde_json::Value) -> Arc<EndpointSlice> {
        Arc::new(serde_json::from_value(v).unwrap())
    }

    #[test]
    fn services_become_dnat_rules_to_ready_endpoints() {
        let services = vec![
            svc(json!({"metadata": {"name": "hello", "namespace": "demo"},
                "spec": {"clusterIP": "10.96.0.20", "clusterIPs": ["10.96.0.20"], "type": "NodePort",
                         "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]}})),
            svc(
                json!({"metadata": {"name": "headless", "namespace": "demo"},
                "spec": {"clusterIP": "None", "ports": [{"port": 80}]}}),
            ),
            svc(json!({"metadata": {"name": "empty", "namespace": "demo"},
                "spec": {"clusterIP": "10.96.0.30", "ports": [{"port": 80}]}})),
        ];
        let slices = vec![
            slice(json!({"metadata": {"name": "hello-x", "namespace": "demo",
                "labels": {"kubernetes.io/service-name": "hello"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [
                {"addresses": ["10.244.1.2"], "conditions": {"ready": true}},
                {"addresses": ["10.244.2.2"], "conditions": {"ready": true}},
                {"addresses": ["10.244.3.2"], "conditions": {"ready": false}},
            ]})),
            slice(
                json!({"metadata": {"name": "headless-x", "namespace": "demo",
                    "labels": {"kubernetes.io/service-name": "headless"}},
                "addressType": "IPv4", "ports": [{"port": 80}],
                "endpoints": [{"addresses": ["10.244.1.9"]}]}),
            ),
        ];
        let ports = service_ports(&services, &slices);
        assert_eq!(ports.len(), 2, "headless Services get no rules: {ports:?}");
        let script = render(&ports, Some(Ipv4Addr::new(172, 18, 0, 3)), None);
        assert!(
            script.contains("ip daddr 10.96.0.20 tcp dport 80 goto svc-1"),
            "{script}"
        );
        assert!(script.contains("numgen random mod 2"), "{script}");
        assert!(script.contains("dnat to 10.244.1.2:8080"), "{script}");
        assert!(script.contains("dnat to 10.244.2.2:8080"), "{script}");
        assert!(
            !script.contains("10.244.3.2"),
            "not-ready endpoints get no traffic"
        );
        assert!(
            !script.contains("10.244.1.9"),
            "headless endpoints get no rules"
        );
        assert!(
            script.contains("ip daddr 172.18.0.3 tcp dport 30080"),
            "{script}"
        );
        assert!(
            script.contains("ip daddr 10.96.0.30 tcp dport 80 reject"),
            "a Service without endpoints rejects: {script}"
        );
        let edge = render(&ports, None, Some(Ipv4Addr::new(198, 18, 1, 2)));
        assert!(!edge.contains("30080"), "the edge has no NodePorts");
        assert!(
            !edge.contains("198.18.1.2"),
            "a NodePort Service has no load-balancer rule"
        );
    }

    #[test]
    fn the_edge_serves_load_balancer_ingresses_on_the_wan_address_only() {
        let services = vec![svc(json!({"metadata": {"name": "gw", "namespace": "demo"},
            "spec": {"clusterIP": "10.96.0.40", "clusterIPs": ["10.96.0.40"], "type": "LoadBalancer",
                     "ports": [{"port": 51820, "protocol": "UDP", "nodePort": 31820}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.18.1.2"}]}}}))];
        let slices = vec![slice(
            json!({"metadata": {"name": "gw-x", "namespace": "demo",
                "labels": {"kubernetes.io/service-name": "gw"}},
            "addressType": "IPv4", "ports": [{"port": 51820, "protocol": "UDP"}],
            "endpoints": [{"addresses": ["10.244.1.5"], "conditions": {"ready": true}}]}),
        )];
        let ports = service_ports(&services, &slices);
        let edge = render(&ports, None, Some(Ipv4Addr::new(198, 18, 1, 2)));
        assert!(
            edge.contains("ip daddr 198.18.1.2 udp dport 51820 goto svc-0"),
            "{edge}"
        );
        assert!(edge.contains("dnat to 10.244.1.5:51820"), "{edge}");
        let other_cluster = render(&ports, None, Some(Ipv4Addr::new(198, 18, 2, 2)));
        assert!(!other_cluster.contains("198.18."), "{other_cluster}");
        let node = render(&ports, Some(Ipv4Addr::new(172, 18, 0, 2)), None);
        assert!(!node.contains("198.18.1.2"), "{node}");
    }
}
