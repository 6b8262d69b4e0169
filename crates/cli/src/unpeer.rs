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
    /// Also delete the PersistentVolumeClaims (and their data) the provider holds for the
    /// consumer. Without it, twin namespaces holding claims are retained on the provider (their
    /// pods stopped, the consumer's access removed) and listed when unpeering ends.
    #[arg(long)]
    delete_data: bool,
    /// How long to wait.
    #[arg(long, default_value = "60s", value_parser = duration)]
    timeout: Duration,
}

pub async fn run(args: Args, cluster: &ClusterArgs) -> anyhow::Result<()> {
    let client = cluster.client().await?;
    eprintln!("unpeering from {}", args.cluster_id);
    let retained = if args.delete_data {
        tandem_admin::invite::mark_delete_data(&client, &args.cluster_id).await?;
        Vec::new()
    } else {
        tandem_admin::invite::data_held_with(&client, &args.cluster_id).await?
    };
    tandem_admin::invite::unpeer(
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
    for line in &retained {
        println!("retained: {line}");
    }
    if !retained.is_empty() {
        println!(
            "(data is never deleted unless asked: delete those namespaces or claims by hand, or unpeer with --delete-data)"
        );
    }
    Ok(())
}
