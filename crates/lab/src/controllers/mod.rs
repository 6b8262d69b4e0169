//! The controllers kube-controller-manager would run in a real cluster: ReplicaSet,
//! Deployment, DaemonSet, StatefulSet, Job, CronJob (with TTL-after-finished), disruption (PodDisruptionBudget status),
//! EndpointSlice/Endpoints, the persistent volume binder (with the lab's provisioner of
//! hollow volumes), the kube-apiserver-client and kubelet-serving CSR signers and the
//! ServiceAccount controller. Each one talks to the cluster only through its `kube::Client`,
//! is level-based (it recomputes from what it lists, so a restart loses nothing) and logs
//! failures with the object and the step.
//!
//! What they share sits in modules below them (`context`, `error`, `owners`, `availability`);
//! this module only runs them.

pub(crate) mod availability;
pub mod context;
pub mod cronjob;
pub mod csr;
pub mod daemonset;
pub mod deployment;
pub mod disruption;
pub mod endpoints;
pub mod error;
pub mod history;
pub mod job;
pub(crate) mod owners;
pub mod replicaset;
pub mod serviceaccount;
pub mod statefulset;
pub mod volume;

use tandem_apiserver::pki::CertPair;

pub use context::Context;
pub use error::Error;

/// A controller that stopped (they stop only on a bug).
#[derive(Debug, thiserror::Error)]
#[error("{controller} stopped")]
pub struct Stopped {
    /// Which one (`replicaset controller`, `csr signer`).
    pub controller: &'static str,
}

/// Runs every controller until one of them stops (they only stop on a bug).
pub async fn run_all(client: kube::Client, ca: CertPair) -> Result<(), Stopped> {
    let controller = tokio::select! {
        () = replicaset::run(client.clone()) => "replicaset controller",
        () = deployment::run(client.clone()) => "deployment controller",
        () = daemonset::run(client.clone()) => "daemonset controller",
        () = disruption::run(client.clone()) => "disruption controller",
        () = endpoints::run(client.clone()) => "endpoints controller",
        () = statefulset::run(client.clone()) => "statefulset controller",
        () = volume::run(client.clone()) => "persistentvolume controller",
        () = job::run(client.clone()) => "job controller",
        () = cronjob::run(client.clone()) => "cronjob controller",
        () = csr::run(client.clone(), ca) => "csr signer",
        () = serviceaccount::run(client) => "serviceaccount controller",
    };
    Err(Stopped { controller })
}
