//! `tandem install`: deploy Tandem into the current cluster and create its identity.

use crate::flags::ClusterArgs;

/// Install (or upgrade) Tandem in the cluster of the current context.
#[derive(clap::Args)]
pub struct Args {
    /// This cluster's ID [default: kept if installed, else generated].
    #[arg(long)]
    cluster_id: Option<String>,
    /// The cluster's pod CIDR [default: detected from the Nodes].
    #[arg(long)]
    pod_cidr: Option<String>,
    /// The range standing for non-pod addresses [default: 10.70.0.0/16].
    #[arg(long)]
    external_cidr: Option<String>,
    /// Percent of the cluster's allocatable resources granted to each new consumer.
    #[arg(long)]
    share_percent: Option<u32>,
    /// Tandem's image (the controller's, the gateways' and the node agent's).
    #[arg(long)]
    image: Option<String>,
    /// Build the network fabric for each peering: a WireGuard gateway per peer (a hostNetwork
    /// pod with NET_ADMIN behind a LoadBalancer Service) and the node agent routing to it
    /// [default: kept if installed, else off].
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    network_fabric: Option<bool>,
    /// What a peer may open connections to through the tunnel: `peering` (least exposure: a
    /// consumer its offloaded pods, offloaded pods the namespaces offloaded to their provider)
    /// or `pod-cidr` (every pod of this cluster, as Liqo does; never the nodes) [default: kept
    /// if installed, else peering].
    #[arg(long, value_name = "MODE", value_parser = ["peering", "pod-cidr"])]
    network_exposure: Option<String>,
}

pub async fn run(args: Args, cluster: &ClusterArgs) -> anyhow::Result<()> {
    let client = cluster.client().await?;
    let options = tandem_controller::install::InstallOptions {
        cluster_id: args.cluster_id,
        pod_cidr: args.pod_cidr,
        external_cidr: args.external_cidr,
        share_percent: args.share_percent,
        image: args.image,
        network_fabric: args.network_fabric,
        network_exposure: args
            .network_exposure
            .map(|m| m.parse())
            .transpose()
            .map_err(anyhow::Error::msg)?,
    };
    let identity = tandem_controller::install::install(&client, &options, &mut |step| {
        eprintln!("✓ {step}");
    })
    .await?;
    eprintln!("Tandem is installed as cluster {:?}", identity.cluster_id);
    Ok(())
}
