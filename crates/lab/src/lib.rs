//! Lab clusters: an embedded API server plus what makes it a cluster — a scheduler, hollow
//! kubelets (pods run without containers, like kubemark/kwok), workload, endpoint, node
//! lifecycle and certificate controllers. Every controller talks to its cluster only through
//! a `kube::Client`, as it would to a real one.

pub mod cluster;
pub mod controllers;
pub mod error;
pub mod events;
pub mod gate;
pub mod image_pulls;
pub mod images;
pub mod kubelet;
pub mod lab;
pub mod network;
pub mod nodelifecycle;
pub mod power;
pub mod profile;
pub mod restart;
pub mod runs;
pub mod scheduler;

pub use cluster::{LabCluster, LabConfig, NodePower};
pub use error::LabError;
pub use gate::TcpGate;
pub use lab::{Lab, LabSpec};
pub use profile::LabProfile;
