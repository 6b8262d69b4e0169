//! The scheduler: binds pending pods to nodes through the binding subresource.

/// Runs the scheduler until the process ends. PLACEHOLDER on the lab branch.
pub async fn run(client: kube::Client) -> anyhow::Result<()> {
    let _ = client;
    anyhow::bail!("scheduler not implemented yet")
}
