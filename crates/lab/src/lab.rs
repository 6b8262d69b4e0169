//! Several lab clusters in one process, with one kubeconfig holding a context per cluster.

use std::path::{Path, PathBuf};

use kube::config::Kubeconfig;

use crate::cluster::{LabCluster, LabConfig};
use crate::error::LabError;

/// Regions the clusters of a lab are placed in, in order (`topology.kubernetes.io/region`).
pub const REGIONS: &[&str] = &[
    "eu-west", "us-east", "ap-south", "eu-north", "us-west", "ap-east", "sa-east", "af-south",
];

/// How to build a lab.
#[derive(Clone, Debug)]
pub struct LabSpec {
    /// Number of clusters (`lab-1` … `lab-N`).
    pub clusters: usize,
    /// Hollow nodes per cluster.
    pub nodes: usize,
    /// Directory holding each cluster's data (`<dir>/lab-i`) and the kubeconfig.
    pub dir: Option<PathBuf>,
    /// Network mode (root only; see [`LabConfig::network`]): the clusters share one lab
    /// instance and its WAN.
    pub network: bool,
    /// The `tandem` binary network mode runs for Tandem's image (see
    /// [`LabConfig::tandem_binary`]).
    pub tandem_binary: Option<PathBuf>,
    /// The distribution network mode models (see [`LabConfig::profile`]).
    pub profile: crate::profile::LabProfile,
}

/// A running lab.
pub struct Lab {
    /// The clusters, `lab-1` first.
    pub clusters: Vec<LabCluster>,
}

/// The configuration of cluster `i` (1-based) of a lab: all share the pod CIDR 10.244.0.0/16
/// (so peering them exercises CIDR remapping) and differ in region.
pub fn cluster_config(i: usize, nodes: usize, dir: Option<&Path>) -> LabConfig {
    let name = format!("lab-{i}");
    LabConfig {
        data_dir: dir.map(|d| d.join(&name)),
        region: REGIONS[(i - 1) % REGIONS.len()].to_string(),
        index: i,
        name,
        nodes,
        ..Default::default()
    }
}

impl Lab {
    /// Starts every cluster; `progress` hears about each one as it comes up.
    pub async fn start(
        spec: &LabSpec,
        mut progress: impl FnMut(&LabCluster),
    ) -> Result<Lab, LabError> {
        let mut clusters = Vec::with_capacity(spec.clusters);
        for i in 1..=spec.clusters {
            let config = LabConfig {
                network: spec.network,
                tandem_binary: spec.tandem_binary.clone(),
                profile: spec.profile,
                ..cluster_config(i, spec.nodes, spec.dir.as_deref())
            };
            // The error names the cluster.
            let cluster = LabCluster::start(config).await?;
            progress(&cluster);
            clusters.push(cluster);
        }
        Ok(Lab { clusters })
    }

    /// One kubeconfig with a context (and cluster and admin user) per lab cluster, named
    /// after it; the current context is the first cluster.
    pub fn kubeconfig(&self) -> Result<String, LabError> {
        let mut merged: Option<Kubeconfig> = None;
        for cluster in &self.clusters {
            let name = || cluster.config.name.clone();
            let one = cluster
                .server
                .admin_config()
                .map_err(|source| LabError::Admin {
                    cluster: name(),
                    source,
                })?;
            // kube's merge keeps the first current context and appends the other entries.
            merged = Some(match merged {
                None => one,
                Some(m) => m.merge(one).map_err(|source| LabError::MergeKubeconfig {
                    cluster: name(),
                    source,
                })?,
            });
        }
        Ok(tandem_api::kubeconfig::to_yaml(&merged.unwrap_or_default()))
    }

    /// Stops every cluster.
    pub fn shutdown(self) {
        for c in self.clusters {
            c.shutdown();
        }
    }
}
