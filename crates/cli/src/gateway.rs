//! `tandem gateway`: the per-peer data plane (userspace WireGuard, prefix NAT, routes).

use std::path::PathBuf;

use anyhow::Context;

/// Arguments of `tandem gateway`.
#[derive(clap::Args)]
#[command(
    args_conflicts_with_subcommands = true,
    after_help = "Needs CAP_NET_ADMIN and /dev/net/tun. Example configuration:\n  crates/net/gateway.example.toml\n\nIn a cluster, the controller runs one gateway per peer as the Deployment \
tandem-gateway-<peer> with --peer: the configuration then comes from the Secret of the same \
name (key gateway.json), which the controller keeps, and a change restarts the data path.\n\n\
Examples:\n  tandem gateway genkey > gw.key\n  tandem gateway pubkey \"$(cat gw.key)\"\n  tandem gateway --config gw.toml\n  tandem gateway --peer milan   # in a pod of the controller's Deployment"
)]
pub struct Args {
    /// Gateway configuration (TOML or JSON): keys, peer, CIDRs, NAT, probes.
    #[arg(long, value_name = "FILE", conflicts_with = "peer")]
    config: Option<PathBuf>,
    /// Run in a cluster as the gateway to this peer (cluster ID), configured by the controller.
    #[arg(long, value_name = "CLUSTER_ID")]
    peer: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Print a new WireGuard private key (base64).
    Genkey,
    /// Print the public key of a private key.
    Pubkey {
        /// The private key, base64.
        private_key: String,
    },
}

/// Runs `tandem gateway …`; the daemon itself is `tandem_node::gateway`.
pub async fn run(args: Args, cluster: &crate::flags::ClusterArgs) -> anyhow::Result<()> {
    if let Some(peer) = &args.peer {
        let config = cluster.config().await?;
        let namespace = config.default_namespace.clone();
        let client = kube::Client::try_from(config).context("building the API client")?;
        let interrupted = crate::interrupt().context("listening for SIGINT and SIGTERM")?;
        tandem_node::gateway::run_in_cluster(client, &namespace, peer, interrupted).await;
        return Ok(());
    }
    match (args.command, args.config) {
        (Some(Command::Genkey), _) => println!("{}", tandem_netspec::generate_private_key()),
        (Some(Command::Pubkey { private_key }), _) => {
            println!("{}", tandem_netspec::public_key(&private_key)?)
        }
        (None, Some(path)) => tandem_node::gateway::run_file(&path).await?,
        (None, None) => anyhow::bail!(
            "tandem gateway needs --config FILE (or the genkey / pubkey subcommands); see --help"
        ),
    }
    Ok(())
}
