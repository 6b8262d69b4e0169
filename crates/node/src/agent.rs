//! The node agent (`tandem agent`) of the network fabric, run by the controller's DaemonSet
//! `tandem-agent` on every real node (hostNetwork, NET_ADMIN). It routes each peer's
//! prefixes (as this cluster names them, from the ConfigMap `tandem-routes`) to the node
//! running that peer's gateway; on that node itself (the gateway pod's hostIP is one of the
//! node's own addresses) the gateway's own TUN routes serve. Its
//! routes carry their own protocol number (`ip route` shows `proto 173`), so it only ever
//! changes its own, and it removes them when stopped.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ListParams};
use tandem_api::names::{GATEWAY_APP, ROUTES_CONFIG_MAP, ROUTES_KEY};

use crate::NodeError;

/// How often the agent reconciles its routes.
const PERIOD: Duration = Duration::from_secs(1);

/// The routes this node needs: each peer's prefixes via the node of that peer's Running
/// gateway, unless that node is this one.
fn wanted(
    routes: &BTreeMap<String, Vec<ipnet::IpNet>>,
    gateways: &[Pod],
    own_addresses: &[Ipv4Addr],
) -> Vec<(ipnet::Ipv4Net, Ipv4Addr)> {
    let mut out = Vec::new();
    for pod in gateways {
        let Some(peer) = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(tandem_api::names::REMOTE_CLUSTER_LABEL))
        else {
            continue;
        };
        let Some(status) = &pod.status else { continue };
        if status.phase.as_deref() != Some("Running") || pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let Some(node) = status.host_ip.as_deref().and_then(|ip| ip.parse().ok()) else {
            continue;
        };
        if own_addresses.contains(&node) {
            continue;
        }
        for net in routes.get(peer).into_iter().flatten() {
            if let ipnet::IpNet::V4(net) = net {
                out.push((*net, node));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// One reconciliation: read the routes and where the gateways run, then sync.
async fn once(client: &kube::Client, namespace: &str) -> Result<(), NodeError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    // The node's own addresses, from its network namespace (a hostNetwork pod's HOSTNAME is
    // the node's host name, so the agent does not look its pod up).
    let own_addresses = tandem_net::route::local_ipv4_addresses()
        .await
        .map_err(|source| NodeError::Routes {
            what: "listing this node's addresses",
            source,
        })?;
    let routes: BTreeMap<String, Vec<ipnet::IpNet>> =
        match Api::<ConfigMap>::namespaced(client.clone(), namespace)
            .get_opt(ROUTES_CONFIG_MAP)
            .await
            .map_err(|source| NodeError::Api {
                what: format!("reading ConfigMap {namespace}/{ROUTES_CONFIG_MAP}"),
                source,
            })?
            .and_then(|m| m.data?.remove(ROUTES_KEY))
        {
            Some(text) => serde_json::from_str(&text).map_err(|source| NodeError::Format {
                what: format!(
                    "ConfigMap {namespace}/{ROUTES_CONFIG_MAP}: {ROUTES_KEY} is not routes"
                ),
                source,
            })?,
            None => BTreeMap::new(),
        };
    let gateways = pods
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/name={GATEWAY_APP}")))
        .await
        .map_err(|source| NodeError::Api {
            what: format!("listing the gateway pods in {namespace}"),
            source,
        })?;
    let wanted = wanted(&routes, &gateways.items, &own_addresses);
    tandem_net::route::sync_agent_routes(&wanted)
        .await
        .map_err(|source| NodeError::Routes {
            what: "syncing the routes",
            source,
        })
}

/// Runs the node agent with `client`, reading its ConfigMap and the gateway pods in
/// `namespace`, until `shutdown` completes; then removes its routes.
pub async fn run(
    client: kube::Client,
    namespace: &str,
    shutdown: impl Future<Output = ()>,
) -> Result<(), NodeError> {
    tokio::pin!(shutdown);
    tracing::info!("node agent started");
    loop {
        // The routes stay as they are while the API server is away.
        if let Err(e) = once(&client, namespace).await {
            tracing::warn!("{}", tandem_core::errors::chain(&e));
        }
        tokio::select! {
            () = &mut shutdown => break,
            () = tokio::time::sleep(PERIOD) => {}
        }
    }
    tandem_net::route::sync_agent_routes(&[])
        .await
        .map_err(|source| NodeError::Routes {
            what: "removing the agent's routes",
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn gateway(peer: &str, host_ip: &str, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": format!("gw-{peer}"), "labels": {
                "app.kubernetes.io/name": GATEWAY_APP, "tandem.dev/remote-cluster-id": peer}},
            "status": {"phase": phase, "hostIP": host_ip},
        }))
        .unwrap()
    }

    #[test]
    fn peers_route_to_their_gateways_node_except_on_that_node() {
        let routes: BTreeMap<String, Vec<ipnet::IpNet>> = serde_json::from_value(json!({
            "milan": ["10.71.0.0/16", "10.72.0.0/16"],
            "paris": ["10.73.0.0/16"],
            "oslo": ["10.74.0.0/16"],
        }))
        .unwrap();
        let gateways = vec![
            gateway("milan", "172.18.0.3", "Running"),
            gateway("paris", "172.18.0.2", "Running"),
            gateway("oslo", "172.18.0.3", "Pending"),
        ];
        let own: Vec<Ipv4Addr> = vec!["127.0.0.1".parse().unwrap(), "172.18.0.2".parse().unwrap()];
        let via: Ipv4Addr = "172.18.0.3".parse().unwrap();
        assert_eq!(
            wanted(&routes, &gateways, &own),
            vec![
                ("10.71.0.0/16".parse().unwrap(), via),
                ("10.72.0.0/16".parse().unwrap(), via),
            ],
            "paris's gateway runs here (its TUN routes serve); oslo's is not running"
        );
    }
}
