//! Network mode: lab pods with real network namespaces, built-in programs, Services that
//! route (nftables), cluster DNS and kubelet endpoints for `kubectl logs` and `exec`.
//!
//! Hollow mode (the default) uses none of this. Network mode needs root; everything it
//! creates lives in network namespaces named `lab-<instance>-…`, never in the host's own.
//!
//! This module declares the parts and wires them: [`ClusterNetwork::start_services`] starts
//! the API server's extra listeners, cluster DNS, kube-proxy, the load balancer and the
//! kubelet endpoints; the pods' side of [`ClusterNetwork`] lives in [`cluster_network`].

pub mod cluster_network;
mod cluster_services;
pub mod dns;
pub mod error;
pub mod incluster;
pub mod kubelet_metrics;
pub mod kubelet_server;
pub mod netns;
pub mod port_forward;
pub mod programs;
pub mod proxy;
pub mod service_view;
pub mod servicelb;
pub mod spdy;
pub mod supervisor;
pub mod topology;
pub mod usage;

use std::net::SocketAddr;
use std::sync::Arc;

pub use cluster_network::{ClusterNetwork, ContainerStart};
pub use error::NetworkError;
pub use service_view::ServiceView;
pub use supervisor::ProcessExit;

use cluster_services::{endpoints, ensure_kube_dns};

/// Writes the `kubernetes` Service's EndpointSlice: the API server at `ip:port`, where it says
/// it is reachable (kube-apiserver's advertise address). A hollow lab, reached only from this
/// host, says 127.0.0.1 and its port; network mode, the edge's address and 6443.
pub(crate) async fn advertise_api_server(
    client: &kube::Client,
    ip: std::net::Ipv4Addr,
    port: u16,
) -> Result<(), NetworkError> {
    endpoints(
        client,
        "default",
        "kubernetes",
        &[("https", port, "TCP")],
        ip,
    )
    .await
}

impl ClusterNetwork {
    /// Starts the cluster's services: the API server also listening on the edge and WAN
    /// addresses (port 6443), its `kubernetes` Service endpoints, cluster DNS behind the
    /// `kube-dns` Service, kube-proxy in every node namespace and the edge, and the load
    /// balancer giving LoadBalancer Services the cluster's WAN address ([`servicelb`]).
    pub async fn start_services(
        self: &Arc<Self>,
        server: &tandem_apiserver::ApiServer,
        client: kube::Client,
    ) -> Result<(), NetworkError> {
        let edge = self.net.edge();
        let _ = self.api.set((client.clone(), server.ca_pem().to_string()));
        let mut tasks = Vec::new();
        for ip in [self.edge_ip(), self.wan_ip()] {
            let addr = SocketAddr::from((ip, 6443));
            let listener = netns::tcp_listener(&edge, addr).await.map_err(listen(
                "API server listener",
                addr,
                &edge,
            ))?;
            tasks.push(server.serve_also(listener));
        }
        advertise_api_server(&client, self.edge_ip(), 6443).await?;

        let dns_addr = dns::listen_addr(self.edge_ip());
        let udp = netns::udp_socket(&edge, dns_addr).await.map_err(listen(
            "DNS socket",
            dns_addr,
            &edge,
        ))?;
        let tcp = netns::tcp_listener(&edge, dns_addr).await.map_err(listen(
            "DNS listener",
            dns_addr,
            &edge,
        ))?;
        let (view, watch) = ServiceView::start(client.clone()).await?;
        tasks.push(watch);
        let zone = dns::Zone::new(view.clone(), Some(edge.clone()));
        tasks.push(tokio::spawn(dns::follow_config(
            client.clone(),
            zone.clone(),
        )));
        tasks.push(tokio::spawn(dns::serve(zone, udp, tcp)));
        ensure_kube_dns(&client, self.edge_ip()).await?;

        let mut targets: Vec<proxy::ProxyTarget> = self
            .net
            .node_namespaces()
            .into_iter()
            .map(|(node, netns)| proxy::ProxyTarget {
                netns,
                node_ip: Some(node.ip),
                wan_ip: None,
            })
            .collect();
        targets.push(proxy::ProxyTarget {
            netns: edge,
            node_ip: None,
            wan_ip: Some(self.wan_ip()),
        });
        // kind runs no load balancer: LoadBalancer Services stay pending there.
        if self.profile == crate::profile::LabProfile::K3s {
            tasks.push(tokio::spawn(servicelb::run(
                view.clone(),
                client.clone(),
                self.wan_ip(),
            )));
        }
        tasks.push(tokio::spawn(proxy::run(view, targets)));

        // Kubelet endpoints on each node, and the API server reaching them from the edge.
        let client_ca = server.kubelet_client_ca_pem().to_string();
        for (node, netns) in self.net.node_namespaces() {
            let ip = node.ip.to_string();
            let cert = server
                .state()
                .pki
                .ca
                .issue(
                    &format!("system:node:{}", node.name),
                    &["system:nodes"],
                    &[&node.name, &ip],
                    true,
                )
                .map_err(|source| NetworkError::ServingCertificate {
                    node: node.name.clone(),
                    source,
                })?;
            let tls = kubelet_server::tls_config(&cert.cert_pem, &cert.key_pem, &client_ca)?;
            let addr = SocketAddr::from((node.ip, 10250));
            let listener = netns::tcp_listener(&netns, addr).await.map_err(listen(
                "kubelet endpoint",
                addr,
                &netns,
            ))?;
            tasks.push(tokio::spawn(kubelet_server::serve(
                listener,
                Arc::new(tls),
                self.clone(),
            )));
        }
        let edge_ns = self.net.edge();
        server.set_kubelet_dialer(Arc::new(move |addr| {
            let edge_ns = edge_ns.clone();
            Box::pin(async move { netns::tcp_connect(&edge_ns, addr).await })
        }));
        self.tasks.lock().extend(tasks);
        Ok(())
    }
}

/// Names a socket of the cluster's services that could not be opened.
fn listen(
    service: &str,
    addr: SocketAddr,
    netns: &str,
) -> impl FnOnce(std::io::Error) -> NetworkError {
    let (service, netns) = (service.to_string(), netns.to_string());
    move |source| NetworkError::Listen {
        service,
        addr,
        netns,
        source,
    }
}
