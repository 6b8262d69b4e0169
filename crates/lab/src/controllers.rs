//! The controllers kube-controller-manager would run in a real cluster.

use tandem_apiserver::pki::CertPair;

/// Runs every controller until the process ends. PLACEHOLDER on the lab branch.
pub async fn run_all(client: kube::Client, ca: CertPair) -> anyhow::Result<()> {
    let _ = (client, ca);
    anyhow::bail!("controllers not implemented yet")
}
