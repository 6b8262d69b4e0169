//! One lab cluster: the API server, its hollow nodes and its controllers, in this process.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tandem_api::names;
use tandem_apiserver::{ApiServer, Config};
use tokio::task::JoinHandle;

use crate::error::LabError;
use crate::kubelet::HollowNode;
use crate::network::NetworkError;
pub use crate::power::NodePower;
pub use crate::profile::LabProfile;

/// How to build a lab cluster.
#[derive(Clone, Debug)]
pub struct LabConfig {
    /// Cluster name (`lab-1`); nodes are called `<name>-node-<i>`.
    pub name: String,
    /// Number of hollow nodes.
    pub nodes: usize,
    /// Pod CIDR of the cluster; each node gets the i-th /24 of it.
    pub pod_cidr: String,
    /// Value of `topology.kubernetes.io/region` on every node.
    pub region: String,
    /// Allocatable CPU of each node.
    pub node_cpu: String,
    /// Allocatable memory of each node.
    pub node_memory: String,
    /// Maximum pods per node.
    pub node_pods: u32,
    /// Where the API server keeps its objects; None keeps them in memory.
    pub data_dir: Option<PathBuf>,
    /// API server port on 127.0.0.1 (0 picks a free one).
    pub port: u16,
    /// How long a node's Lease may go unrenewed before the node is NotReady and unreachable
    /// (kube-controller-manager's `--node-monitor-grace-period`).
    pub node_monitor_grace_period: std::time::Duration,
    /// The cluster's index in its lab (1-based): its node network is 172.<17+index>.0.0/16,
    /// its WAN address 198.18.<index>.2.
    pub index: usize,
    /// Network mode (root only): pods get network namespaces, built-in images run, Services
    /// route and cluster DNS answers. Off, pods are hollow.
    pub network: bool,
    /// The `tandem` binary network mode runs for pods of Tandem's image
    /// (`ghcr.io/tandem-dev/tandem`); None: such pods fail to start, saying so.
    pub tandem_binary: Option<PathBuf>,
    /// Which real distribution network mode models where they differ (see [`LabProfile`]).
    pub profile: LabProfile,
}

impl Default for LabConfig {
    fn default() -> Self {
        LabConfig {
            name: "lab-1".into(),
            nodes: 3,
            pod_cidr: "10.244.0.0/16".into(),
            region: "region-1".into(),
            node_cpu: "8".into(),
            node_memory: "32Gi".into(),
            node_pods: 110,
            data_dir: None,
            port: 0,
            node_monitor_grace_period: std::time::Duration::from_secs(40),
            index: 1,
            network: false,
            tandem_binary: None,
            profile: LabProfile::default(),
        }
    }
}

/// A running lab cluster.
pub struct LabCluster {
    /// The configuration it was started with.
    pub config: LabConfig,
    /// Its API server.
    pub server: ApiServer,
    /// An admin client.
    pub client: kube::Client,
    /// Node power switches.
    pub power: NodePower,
    /// Network mode's namespaces, programs and services (None in hollow mode).
    pub network: Option<Arc<crate::network::ClusterNetwork>>,
    scheduler_nodes_seen: tokio::sync::watch::Receiver<u64>,
    tasks: Vec<JoinHandle<()>>,
    images: crate::images::NodeImages,
}

/// The hollow nodes a configuration describes.
pub fn nodes_of(config: &LabConfig) -> Vec<HollowNode> {
    let base: Vec<u8> = config
        .pod_cidr
        .split('/')
        .next()
        .unwrap_or("10.244.0.0")
        .split('.')
        .filter_map(|o| o.parse().ok())
        .collect();
    (1..=config.nodes)
        .map(|i| {
            let name = format!("{}-node-{i}", config.name);
            let zone = format!("{}-{}", config.region, (b'a' + ((i - 1) % 3) as u8) as char);
            let labels = BTreeMap::from([
                ("kubernetes.io/hostname".to_string(), name.clone()),
                ("kubernetes.io/os".to_string(), "linux".to_string()),
                ("kubernetes.io/arch".to_string(), "amd64".to_string()),
                (
                    "topology.kubernetes.io/region".to_string(),
                    config.region.clone(),
                ),
                ("topology.kubernetes.io/zone".to_string(), zone),
            ]);
            HollowNode {
                cluster: config.name.clone(),
                pod_cidr: format!(
                    "{}.{}.{}.0/24",
                    base.first().copied().unwrap_or(10),
                    base.get(1).copied().unwrap_or(244),
                    i % 256
                ),
                internal_ip: crate::network::topology::node_ip(config.index, i).to_string(),
                name,
                labels,
                cpu: config.node_cpu.clone(),
                memory: config.node_memory.clone(),
                pods: config.node_pods,
                lease_renew_interval: crate::kubelet::lease_renew_interval(
                    config.node_monitor_grace_period,
                ),
            }
        })
        .collect()
}

/// The network-mode description of hollow node `n` (the `i`-th, 0-based).
fn node_spec(
    (i, n): (usize, HollowNode),
) -> Result<crate::network::topology::NodeSpec, NetworkError> {
    Ok(crate::network::topology::NodeSpec {
        index: i + 1,
        ip: n
            .internal_ip
            .parse()
            .map_err(|source| NetworkError::NodeIp {
                node: n.name.clone(),
                ip: n.internal_ip.clone(),
                source,
            })?,
        pod_cidr: n.pod_cidr.parse().map_err(|source| NetworkError::PodCidr {
            node: n.name.clone(),
            cidr: n.pod_cidr.clone(),
            source,
        })?,
        name: n.name,
    })
}

/// Runs one of the cluster's tasks, logging why it stopped if it fails.
fn spawn_logged<E: std::fmt::Display>(
    name: &'static str,
    task: impl std::future::Future<Output = Result<(), E>> + Send + 'static,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        if let Err(e) = task.await {
            tracing::error!("lab {name} stopped: {e}");
        }
    })
}

impl LabCluster {
    /// Starts the API server, the hollow nodes and the controllers.
    pub async fn start(config: LabConfig) -> Result<LabCluster, LabError> {
        let cluster = || config.name.clone();
        let network_mode = |source| LabError::Network {
            cluster: cluster(),
            source,
        };
        let network = if config.network {
            let nodes = nodes_of(&config)
                .into_iter()
                .enumerate()
                .map(node_spec)
                .collect::<Result<Vec<_>, _>>()
                .map_err(network_mode)?;
            Some(
                crate::network::ClusterNetwork::create(
                    &config.name,
                    config.index,
                    nodes,
                    config.tandem_binary.clone(),
                    config.profile,
                )
                .await
                .map_err(network_mode)?,
            )
        } else {
            None
        };
        let server = ApiServer::start(Config {
            name: config.name.clone(),
            data_dir: config.data_dir.clone(),
            port: config.port,
            extra_sans: network
                .as_ref()
                .map(|n| vec![n.edge_ip().to_string(), n.wan_ip().to_string()])
                .unwrap_or_default(),
            ..Default::default()
        })
        .await
        .map_err(|source| LabError::ApiServer {
            cluster: cluster(),
            source,
        })?;
        let client = server.client().await.map_err(|source| LabError::Admin {
            cluster: cluster(),
            source,
        })?;
        if let Some(network) = &network {
            network
                .start_services(&server, client.clone())
                .await
                .map_err(network_mode)?;
        } else {
            // Reached from this host only: what it advertises says so (see `tandem invite`).
            crate::network::advertise_api_server(
                &client,
                std::net::Ipv4Addr::LOCALHOST,
                server.addr().port(),
            )
            .await
            .map_err(network_mode)?;
            // Its pods have no network: Tandem, seeing this, leaves the fabric off and says so.
            let label = json!({"metadata": {"labels": {names::HOLLOW_CLUSTER_LABEL: "true"}}});
            Api::<Namespace>::all(client.clone())
                .patch(
                    "kube-system",
                    &PatchParams::default(),
                    &Patch::Merge(&label),
                )
                .await
                .map_err(|source| LabError::MarkHollow {
                    cluster: cluster(),
                    source,
                })?;
        }
        let power = NodePower::default();
        let mut tasks = Vec::new();
        let (nodes_seen, scheduler_nodes_seen) = tokio::sync::watch::channel(0);
        tasks.push(tokio::spawn(crate::scheduler::run(
            client.clone(),
            nodes_seen,
        )));
        tasks.push(tokio::spawn(crate::nodelifecycle::run(
            client.clone(),
            config.node_monitor_grace_period,
        )));
        tasks.push(spawn_logged(
            "controllers",
            crate::controllers::run_all(client.clone(), server.state().pki.ca.clone()),
        ));
        let kubelet_events = crate::events::Recorder::new(client.clone(), "kubelet");
        // kind's nodes reach no registry here: only built-in and loaded images run.
        let images = if config.network && config.profile == LabProfile::Kind {
            crate::images::NodeImages::loaded_only(config.data_dir.clone())
        } else {
            crate::images::NodeImages::from_registry()
        };
        for node in nodes_of(&config) {
            tasks.push(spawn_logged(
                "kubelet",
                crate::kubelet::run(
                    client.clone(),
                    node,
                    power.clone(),
                    kubelet_events.clone(),
                    network.clone(),
                    images.clone(),
                ),
            ));
        }
        Ok(LabCluster {
            config,
            server,
            client,
            power,
            network,
            scheduler_nodes_seen,
            tasks,
            images,
        })
    }

    /// The API server's address on the lab WAN, as another cluster's pods reach it (network
    /// mode only).
    pub fn wan_url(&self) -> Option<String> {
        self.network
            .as_ref()
            .map(|n| format!("https://{}:6443", n.wan_ip()))
    }

    /// Loads `image` onto every node, as `kind load docker-image` does (it matters in the kind
    /// profile only, where nothing else pulls).
    pub fn load_image(&self, image: &str) {
        self.images.load(image);
    }

    /// Names of the cluster's hollow nodes.
    pub fn node_names(&self) -> Vec<String> {
        nodes_of(&self.config).into_iter().map(|n| n.name).collect()
    }

    /// Waits until the scheduler's cache has applied every node change up to `resource_version`
    /// (as returned by the write that made it), so a pod created next is scheduled against it.
    pub async fn scheduler_sees_nodes_at(&self, resource_version: &str) {
        let want: u64 = resource_version.parse().unwrap_or(u64::MAX);
        let mut seen = self.scheduler_nodes_seen.clone();
        // The sender lives as long as the scheduler task, which lives as long as `self`.
        let _ = seen.wait_for(|v| *v >= want).await;
    }

    /// Restarts the API server as a crash and restart of its process would: every connection
    /// closes (watches end, requests in flight fail), and a new server serves the same store,
    /// port and certificates. Every client — the lab's own controllers and kubelets, Tandem,
    /// kubectl — reconnects by itself. The cluster needs a data directory (where the store's
    /// log keeps every acknowledged write); hollow mode only.
    pub async fn restart_api_server(&mut self) -> Result<(), LabError> {
        let name = &self.config.name;
        if self.config.data_dir.is_none() {
            return Err(LabError::RestartWithoutDataDir {
                cluster: name.clone(),
            });
        }
        if self.network.is_some() {
            return Err(LabError::RestartInNetworkMode {
                cluster: name.clone(),
            });
        }
        let mut config = self.server.state().config.clone();
        config.port = self.server.addr().port();
        self.server.stop();
        // A request in flight when it stopped may still be writing: the new server reads the
        // store only once the old one has no connection left (each holds the state).
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::sync::Arc::strong_count(self.server.state()) > 1
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        // The old listener closes as its task ends: the port may take a moment to be free.
        let server = loop {
            match ApiServer::start(config.clone()).await {
                Ok(s) => break s,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    tracing::debug!(
                        cluster = %name,
                        "restarting the API server: {:#}",
                        anyhow::Error::new(e)
                    );
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(source) => {
                    return Err(LabError::Restart {
                        cluster: name.clone(),
                        source,
                    });
                }
            }
        };
        self.server = server;
        Ok(())
    }

    /// Stops everything (objects stay in the data directory, if any).
    pub fn shutdown(self) {
        for t in self.tasks {
            t.abort();
        }
        if let Some(network) = &self.network {
            network.shutdown();
        }
        self.server.shutdown();
    }
}
