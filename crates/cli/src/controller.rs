//! `tandem controller`: the cluster agent (peering, negotiation, offloading, virtual kubelets,
//! shadow pods), normally run by the Deployment `tandem install` creates.

use std::time::Duration;

use anyhow::Context as _;
use tandem_controller::{Controller, Options};

use crate::flags::ClusterArgs;

/// Run Tandem's controller against a cluster until interrupted.
#[derive(clap::Args)]
#[command(
    after_help = "In a cluster it uses its ServiceAccount; elsewhere the kubeconfig \
(--kubeconfig, $KUBECONFIG, ~/.kube/config) and --context, like kubectl.\n\nExample:\n  \
tandem controller --kubeconfig ~/.tandem/lab/kubeconfig --context lab-1"
)]
pub struct Args {
    /// Address of the pod-placement admission webhook.
    #[arg(long, default_value = "127.0.0.1:0")]
    webhook_addr: std::net::SocketAddr,
    /// How often virtual nodes renew their Lease and probe their provider (seconds).
    #[arg(long, default_value_t = 5)]
    heartbeat_seconds: u64,
    /// How long a provider may be unreachable before its virtual node is NotReady (seconds).
    #[arg(long, default_value_t = 15)]
    provider_grace_seconds: u64,
}

pub async fn run(args: Args, cluster: &ClusterArgs) -> anyhow::Result<()> {
    let client = cluster.client().await?;
    let options = Options {
        webhook_addr: args.webhook_addr,
        heartbeat: Duration::from_secs(args.heartbeat_seconds),
        provider_grace: Duration::from_secs(args.provider_grace_seconds),
    };
    let controller = Controller::start(client, options)
        .await
        .context("starting the controller")?;
    tokio::select! {
        _ = controller.wait() => anyhow::bail!("the controller stopped"),
        r = tokio::signal::ctrl_c() => r.context("waiting for Ctrl-C"),
    }
}
