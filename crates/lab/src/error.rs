//! Why a lab cluster could not be started, restarted or described: the cluster, the step,
//! and the cause as its source.

use tandem_apiserver::{ClientError, StartError};

use crate::network::NetworkError;

/// Why a lab cluster could not be started, restarted or described.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// Network mode could not be set up.
    #[error("cluster {cluster}: network mode")]
    Network {
        /// The cluster's name.
        cluster: String,
        /// What failed.
        #[source]
        source: NetworkError,
    },
    /// The API server did not start.
    #[error("cluster {cluster}: starting the API server")]
    ApiServer {
        /// The cluster's name.
        cluster: String,
        /// Why.
        #[source]
        source: StartError,
    },
    /// No admin client or kubeconfig could be made for the API server.
    #[error("cluster {cluster}: admin credentials")]
    Admin {
        /// The cluster's name.
        cluster: String,
        /// Why.
        #[source]
        source: ClientError,
    },
    /// The cluster keeps its objects in memory: a restart would lose them.
    #[error(
        "cluster {cluster}: restarting the API server needs a data directory (LabConfig::data_dir)"
    )]
    RestartWithoutDataDir {
        /// The cluster's name.
        cluster: String,
    },
    /// Network mode's listeners do not survive a restart.
    #[error("cluster {cluster}: restarting the API server is not supported in network mode")]
    RestartInNetworkMode {
        /// The cluster's name.
        cluster: String,
    },
    /// The API server did not start again.
    #[error("cluster {cluster}: restarting the API server")]
    Restart {
        /// The cluster's name.
        cluster: String,
        /// Why.
        #[source]
        source: StartError,
    },
    /// The hollow cluster could not label its kube-system Namespace as hollow.
    #[error("cluster {cluster}: marking kube-system as a hollow cluster's")]
    MarkHollow {
        /// The cluster's name.
        cluster: String,
        /// kube's error.
        #[source]
        source: kube::Error,
    },
    /// A cluster's kubeconfig could not be merged into the lab's.
    #[error("cluster {cluster}: merging its kubeconfig into the lab's")]
    MergeKubeconfig {
        /// The cluster's name.
        cluster: String,
        /// kube's error.
        #[source]
        source: kube::config::KubeconfigError,
    },
}
