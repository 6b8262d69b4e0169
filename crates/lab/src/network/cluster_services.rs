//! The Services every network-mode cluster has from the start, written as kube-apiserver and
//! a cluster's DNS add-on would: `default/kubernetes` and `kube-system/kube-dns`, each with
//! the EndpointSlice of its one endpoint on the edge.

use std::net::Ipv4Addr;

use serde_json::json;

use super::dns;
use super::error::NetworkError;

/// Writes the EndpointSlice of a selector-less Service `ns/name` with one endpoint at `ip`
/// and `ports` (name, port, protocol), as kube-apiserver keeps the `kubernetes` Service's
/// (idempotent).
pub(super) async fn endpoints(
    client: &kube::Client,
    ns: &str,
    name: &str,
    ports: &[(&str, u16, &str)],
    ip: Ipv4Addr,
) -> Result<(), NetworkError> {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::api::{Patch, PatchParams};
    let ports: Vec<serde_json::Value> = ports
        .iter()
        .map(|(n, p, proto)| json!({"name": n, "port": p, "protocol": proto}))
        .collect();
    let slice: EndpointSlice = serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": ns, "labels": {
            "kubernetes.io/service-name": name,
            "endpointslice.kubernetes.io/managed-by": "tandem-lab",
        }},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip.to_string()], "conditions": {"ready": true}}],
        "ports": ports,
    }))
    .map_err(|source| NetworkError::Object {
        object: format!("EndpointSlice {ns}/{name}"),
        source,
    })?;
    kube::Api::<EndpointSlice>::namespaced(client.clone(), ns)
        .patch(
            name,
            &PatchParams::apply("tandem-lab").force(),
            &Patch::Apply(&slice),
        )
        .await
        .map_err(|source| NetworkError::Api {
            step: format!("writing EndpointSlice {ns}/{name}"),
            source,
        })?;
    Ok(())
}

/// The `kube-system/kube-dns` Service at [`dns::DNS_SERVICE_IP`], pointing at the DNS server
/// on the edge (idempotent).
pub(super) async fn ensure_kube_dns(
    client: &kube::Client,
    edge_ip: Ipv4Addr,
) -> Result<(), NetworkError> {
    use k8s_openapi::api::core::v1::Service;
    use kube::api::PostParams;
    let service: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "kube-dns", "namespace": "kube-system",
                     "labels": {"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"}},
        "spec": {"clusterIP": dns::DNS_SERVICE_IP, "ports": [
            {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
            {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
        ]},
    }))
    .map_err(|source| NetworkError::Object {
        object: "Service kube-system/kube-dns".into(),
        source,
    })?;
    let api = kube::Api::<Service>::namespaced(client.clone(), "kube-system");
    match api.create(&PostParams::default(), &service).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(source) => {
            return Err(NetworkError::Api {
                step: "creating Service kube-system/kube-dns".into(),
                source,
            });
        }
    }
    endpoints(
        client,
        "kube-system",
        "kube-dns",
        &[("dns", 53, "UDP"), ("dns-tcp", 53, "TCP")],
        edge_ip,
    )
    .await?;
    Ok(())
}
