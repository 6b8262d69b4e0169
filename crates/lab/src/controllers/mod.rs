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

/// Runs every controller until one of them stops (they only stop on a bug).
pub async fn run_all(client: kube::Client, ca: CertPair) -> anyhow::Result<()> {
    tokio::select! {
        () = replicaset::run(client.clone()) => anyhow::bail!("replicaset controller stopped"),
        () = deployment::run(client.clone()) => anyhow::bail!("deployment controller stopped"),
        () = daemonset::run(client.clone()) => anyhow::bail!("daemonset controller stopped"),
        () = disruption::run(client.clone()) => anyhow::bail!("disruption controller stopped"),
        () = endpoints::run(client.clone()) => anyhow::bail!("endpoints controller stopped"),
        () = statefulset::run(client.clone()) => anyhow::bail!("statefulset controller stopped"),
        () = volume::run(client.clone()) => anyhow::bail!("persistentvolume controller stopped"),
        () = job::run(client.clone()) => anyhow::bail!("job controller stopped"),
        () = cronjob::run(client.clone()) => anyhow::bail!("cronjob controller stopped"),
        () = csr::run(client.clone(), ca) => anyhow::bail!("csr signer stopped"),
        () = serviceaccount::run(client) => anyhow::bail!("serviceaccount controller stopped"),
    }
}
