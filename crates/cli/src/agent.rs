//! `tandem agent`: the network fabric's node agent; the daemon itself is `tandem_node::agent`.

use anyhow::Context as _;

/// Run the network fabric's node agent (in a pod of the `tandem-agent` DaemonSet).
#[derive(clap::Args)]
#[command(
    after_help = "Run by the DaemonSet tandem-agent that the controller creates when the \
cluster's network fabric is on (tandem install --network-fabric); it needs hostNetwork and \
NET_ADMIN. Its routes show as `proto 173` in `ip route`."
)]
pub struct Args {}

/// Runs `tandem agent` until SIGTERM, then removes its routes.
pub async fn run(_args: Args, cluster: &crate::flags::ClusterArgs) -> anyhow::Result<()> {
    let config = cluster.config().await?;
    let namespace = config.default_namespace.clone();
    let client = kube::Client::try_from(config).context("building the API client")?;
    let interrupted = crate::interrupt().context("listening for SIGINT and SIGTERM")?;
    Ok(tandem_node::agent::run(client, &namespace, interrupted).await?)
}
