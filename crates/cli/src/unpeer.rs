//! `tandem unpeer ID`: undo a peering from either side.

use std::time::Duration;

use crate::flags::{ClusterArgs, duration};

/// Unpeer from a cluster: as consumer removes the virtual node, offloaded state and identity on
/// both sides; as provider removes the consumer's tenant.
#[derive(clap::Args)]
pub struct Args {
    /// The peer's cluster ID.
    cluster_id: String,
    /// Skip every step on the peer (when it is gone for good).
    #[arg(long)]
    force: bool,
    /// How long to wait.
    #[arg(long, default_value = "60s", value_parser = duration)]
    timeout: Duration,
}

pub async fn run(args: Args, cluster: &ClusterArgs) -> anyhow::Result<()> {
    let client = cluster.client().await?;
    eprintln!("unpeering from {}", args.cluster_id);
    tandem_controller::invite::unpeer(
        &client,
        &args.cluster_id,
        args.force,
        args.timeout,
        &mut |progress| {
            eprintln!("… {progress}");
            if let Some(hint) = progress.force_hint() {
                eprintln!("  hint: {hint}");
            }
        },
    )
    .await
    .map_err(|e| anyhow::Error::new(e).context(format!("unpeering from {}", args.cluster_id)))?;
    eprintln!("unpeered from {}", args.cluster_id);
    Ok(())
}
