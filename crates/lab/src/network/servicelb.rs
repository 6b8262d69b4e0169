//! The load balancer of a network-mode lab cluster, in the manner of k3s's ServiceLB: every
//! `type: LoadBalancer` Service (without a `loadBalancerClass`) gets the cluster's one public
//! address on the lab WAN as its ingress, and the edge's kube-proxy table DNATs that address's
//! Service ports to the Service's ready endpoints ([`super::proxy`]). A second Service asking
//! for a port/protocol already held on that address stays without ingress (Pending, as with
//! ServiceLB when a port is taken), and so does one asking for the API server's port 6443.
//! The client's source address is kept (no masquerade): the edge is the cluster's router, so
//! replies go back through it.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// Port/protocol pairs of the WAN address the load balancer never hands out: the API server
/// listens on 6443 there (peers reach it at that address).
const RESERVED: &[(i32, &str)] = &[(6443, "TCP")];

/// What the load balancer wants a Service's `status.loadBalancer.ingress` to be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    /// Namespace and name of the Service.
    pub namespace: String,
    pub name: String,
    /// The ingress address, or None for no ingress.
    pub ip: Option<Ipv4Addr>,
    /// Why a LoadBalancer Service gets none (for the log).
    pub pending: Option<String>,
    /// Whether the Service's status differs from `ip` (else it is listed only as pending).
    pub write: bool,
}

fn is_ours(svc: &Service) -> bool {
    svc.spec.as_ref().is_some_and(|s| {
        s.type_.as_deref() == Some("LoadBalancer") && s.load_balancer_class.is_none()
    })
}

/// The IPv4 addresses of a Service's load-balancer ingress.
pub(crate) fn ingress_ips(svc: &Service) -> Vec<Ipv4Addr> {
    svc.status
        .iter()
        .flat_map(|s| s.load_balancer.iter())
        .flat_map(|lb| lb.ingress.iter().flatten())
        .filter_map(|i| i.ip.as_deref()?.parse().ok())
        .collect()
}

/// The assignments `services` need on address `wan`, oldest Service first (an older Service
/// keeps a port against a newer one); Services whose ingress is already right are left out.
pub fn plan(services: &[Arc<Service>], wan: Ipv4Addr) -> Vec<Assignment> {
    let mut ordered: Vec<&Arc<Service>> = services.iter().collect();
    ordered.sort_by_key(|s| {
        (
            s.metadata.creation_timestamp.as_ref().map(|t| t.0),
            s.metadata.namespace.clone(),
            s.metadata.name.clone(),
        )
    });
    let mut taken: BTreeSet<(i32, String)> = RESERVED
        .iter()
        .map(|(p, proto)| (*p, proto.to_string()))
        .collect();
    let mut out = Vec::new();
    for svc in ordered {
        let current = ingress_ips(svc);
        let (ip, pending) = if is_ours(svc) {
            let ports: Vec<(i32, String)> = svc
                .spec
                .iter()
                .flat_map(|s| s.ports.iter().flatten())
                .map(|p| (p.port, p.protocol.clone().unwrap_or_else(|| "TCP".into())))
                .collect();
            match ports.iter().find(|p| taken.contains(p)) {
                Some((port, proto)) => (
                    None,
                    Some(format!(
                        "port {port}/{proto} of the cluster's WAN address {wan} is already used"
                    )),
                ),
                None => {
                    taken.extend(ports);
                    (Some(wan), None)
                }
            }
        } else if current.contains(&wan) {
            // No longer a LoadBalancer Service (or now another class's): our ingress goes.
            (None, None)
        } else {
            continue;
        };
        let write = current != ip.into_iter().collect::<Vec<_>>();
        if !write && pending.is_none() {
            continue;
        }
        out.push(Assignment {
            namespace: svc.metadata.namespace.clone().unwrap_or_default(),
            name: svc.metadata.name.clone().unwrap_or_default(),
            ip,
            pending,
            write,
        });
    }
    out
}

/// Keeps the ingress of LoadBalancer Services in line with [`plan`] until the watches end.
pub async fn run(view: super::service_view::ServiceView, client: kube::Client, wan: Ipv4Addr) {
    let mut changes = view.changes.clone();
    // Pending Services already reported, so that each reason is logged once.
    let mut reported = BTreeSet::new();
    loop {
        changes.borrow_and_update();
        for a in plan(&view.services.state(), wan) {
            if let Some(reason) = &a.pending
                && reported.insert((a.namespace.clone(), a.name.clone(), reason.clone()))
            {
                tracing::warn!(service = %format!("{}/{}", a.namespace, a.name),
                    "load balancer: no ingress: {reason}");
            }
            if !a.write {
                continue;
            }
            let ingress = match a.ip {
                Some(ip) => json!([{ "ip": ip.to_string() }]),
                None => serde_json::Value::Null,
            };
            let api: Api<Service> = Api::namespaced(client.clone(), &a.namespace);
            let patch = json!({"status": {"loadBalancer": {"ingress": ingress}}});
            if let Err(e) = api
                .patch_status(&a.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                tracing::warn!(service = %format!("{}/{}", a.namespace, a.name),
                    "load balancer: writing the ingress: {e}");
            }
        }
        // Also every few seconds: a write that failed is tried again.
        if let Ok(Err(_)) = tokio::time::timeout(Duration::from_secs(5), changes.changed()).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(name: &str, created: &str, spec: serde_json::Value, ingress: &[&str]) -> Arc<Service> {
        let ingress: Vec<_> = ingress.iter().map(|ip| json!({ "ip": ip })).collect();
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "demo", "creationTimestamp": created},
                "spec": spec,
                "status": {"loadBalancer": {"ingress": ingress}},
            }))
            .unwrap(),
        )
    }

    const WAN: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 2);

    #[test]
    fn older_services_keep_their_ports_and_the_api_server_port_is_never_handed_out() {
        let lb = |port: i32, proto: &str| json!({"type": "LoadBalancer", "ports": [{"port": port, "protocol": proto}]});
        let services = vec![
            svc("newer", "2026-01-02T00:00:00Z", lb(51820, "UDP"), &[]),
            svc("older", "2026-01-01T00:00:00Z", lb(51820, "UDP"), &[]),
            svc(
                "tcp-same-port",
                "2026-01-03T00:00:00Z",
                lb(51820, "TCP"),
                &[],
            ),
            svc("api", "2026-01-01T00:00:00Z", lb(6443, "TCP"), &[]),
            svc(
                "classed",
                "2026-01-01T00:00:00Z",
                json!({"type": "LoadBalancer", "loadBalancerClass": "example.com/lb",
                       "ports": [{"port": 80}]}),
                &[],
            ),
            svc(
                "was-lb",
                "2026-01-01T00:00:00Z",
                json!({"type": "ClusterIP", "ports": [{"port": 81}]}),
                &["198.18.2.2"],
            ),
            svc(
                "done",
                "2026-01-01T00:00:00Z",
                lb(82, "TCP"),
                &["198.18.2.2"],
            ),
        ];
        let plan = plan(&services, WAN);
        let get = |name: &str| plan.iter().find(|a| a.name == name).cloned();
        assert_eq!(get("older").unwrap().ip, Some(WAN));
        let newer = get("newer").unwrap();
        assert_eq!(newer.ip, None);
        assert!(
            newer.pending.as_deref().unwrap().contains("51820/UDP"),
            "{newer:?}"
        );
        assert_eq!(get("tcp-same-port").unwrap().ip, Some(WAN));
        assert!(get("api").unwrap().pending.unwrap().contains("6443/TCP"));
        assert_eq!(
            get("classed"),
            None,
            "another class's Service is left alone"
        );
        let was = get("was-lb").unwrap();
        assert_eq!((was.ip, was.pending), (None, None), "stale ingress removed");
        assert_eq!(get("done"), None, "nothing to write when already right");
        assert_eq!(plan.len(), 5, "{plan:?}");
        assert!(
            !newer.write,
            "a pending Service without ingress needs no write"
        );
    }
}
