//! `tandem uninstall`: remove Tandem from the cluster of the current context.

use std::time::Duration;

use crate::flags::{ClusterArgs, duration};

/// Remove Tandem from a cluster: every object it created, webhook, finalizer, CRD and
/// namespace. Refused while the cluster peers with another, unless --force.
#[derive(clap::Args)]
#[command(
    after_help = "Order: unpeer (with --force), remove the admission webhooks (so pod creation never \
waits on a controller that is gone), stop the controller, remove Tandem's finalizers, delete its CRDs \
(and every Tandem object with them), its roles, Services, Secrets, settings, StorageClass and \
namespaces, the clusterset.local stub domain, and the MCS API's CRDs when nothing else uses them. \
Running it again finishes an interrupted uninstall.\n\nExample:\n  tandem uninstall --force --context lab-1"
)]
pub struct Args {
    /// Unpeer from every peer first (a peer that does not answer is left to its own admin:
    /// only this side is undone) instead of refusing.
    #[arg(long)]
    force: bool,
    /// Also delete the data (claims) held on providers for this cluster, and held here for
    /// consumers; without it, namespaces holding such data are kept and listed.
    #[arg(long)]
    delete_data: bool,
    /// How long each waiting step may take.
    #[arg(long, default_value = "120s", value_parser = duration)]
    timeout: Duration,
}

pub async fn run(args: Args, cluster: &ClusterArgs) -> anyhow::Result<()> {
    let client = cluster.client().await?;
    let options = tandem_admin::uninstall::UninstallOptions {
        force: args.force,
        delete_data: args.delete_data,
        timeout: args.timeout,
    };
    let kept = tandem_admin::uninstall::uninstall(&client, &options, &mut |step| {
        eprintln!("✓ {step}");
    })
    .await?;
    eprintln!("Tandem is uninstalled");
    for line in &kept {
        println!("kept: {line}");
    }
    Ok(())
}
