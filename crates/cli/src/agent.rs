//! `tandem agent`: the node agent of the network fabric, run by the controller's DaemonSet
//! `tandem-agent` on every real node (hostNetwork, NET_ADMIN). It routes each peer's
//! prefixes (as this cluster names them, from the ConfigMap `tandem-routes`) to the node
//! running that peer's gateway; on that node itself (the gateway pod's hostIP is one of the
//! node's own addresses) the gateway's own TUN routes serve. Its
//! routes carry their own protocol number (`ip route` shows `proto 173`), so it only ever
//! changes its own, and it removes them when stopped.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ListParams};
use tandem_controller::fabric::gateway::{GATEWAY_APP, ROUTES_CONFIG_MAP, ROUTES_KEY};

/// Run the network fabric's node agent (in a pod of the `tandem-agent` DaemonSet).
#[derive(clap::Args)]
#[command(
    after_help = "Run by the DaemonSet tandem-agent that the controller creates when the \
cluster's network fabric is on (tandem install --network-fabric); it needs hostNetwork and \
NET_ADMIN. Its routes show as `proto 173` in `ip route`."
)]
pub struct Args {}

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
async fn once(client: &kube::Client, namespace: &str) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    // The node's own addresses, from its network namespace (a hostNetwork pod's HOSTNAME is
    // the node's host name, so the agent does not look its pod up).
    let own_addresses = tandem_net::route::local_ipv4_addresses()
        .await
        .context("listing this node's addresses")?;
    let routes: BTreeMap<String, Vec<ipnet::IpNet>> =
        match Api::<ConfigMap>::namespaced(client.clone(), namespace)
            .get_opt(ROUTES_CONFIG_MAP)
            .await
            .with_context(|| format!("reading ConfigMap {namespace}/{ROUTES_CONFIG_MAP}"))?
            .and_then(|m| m.data?.remove(ROUTES_KEY))
        {
            Some(text) => serde_json::from_str(&text).with_context(|| {
                format!("ConfigMap {namespace}/{ROUTES_CONFIG_MAP}: {ROUTES_KEY} is not routes")
            })?,
            None => BTreeMap::new(),
        };
    let gateways = pods
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/name={GATEWAY_APP}")))
        .await
        .context("listing the gateway pods")?;
    let wanted = wanted(&routes, &gateways.items, &own_addresses);
    tandem_net::route::sync_agent_routes(&wanted)
        .await
        .context("syncing the routes")
}

/// Runs `tandem agent` until SIGTERM, then removes its routes.
pub async fn run(_args: Args, cluster: &crate::flags::ClusterArgs) -> anyhow::Result<()> {
    let config = cluster.config().await?;
    let namespace = config.default_namespace.clone();
    let client = kube::Client::try_from(config).context("building the API client")?;
    let interrupted = crate::interrupt().context("listening for SIGINT and SIGTERM")?;
    tokio::pin!(interrupted);
    tracing::info!("node agent started");
    loop {
        // The routes stay as they are while the API server is away.
        if let Err(e) = once(&client, &namespace).await {
            tracing::warn!("{e:#}");
        }
        tokio::select! {
            () = &mut interrupted => break,
            () = tokio::time::sleep(PERIOD) => {}
        }
    }
    tandem_net::route::sync_agent_routes(&[])
        .await
        .context("removing the agent's routes")
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
