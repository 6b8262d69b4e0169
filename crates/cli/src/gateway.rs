//! `tandem gateway`: the per-peer data plane (userspace WireGuard, prefix NAT, routes).

use std::path::PathBuf;

use anyhow::Context;

/// Arguments of `tandem gateway`.
#[derive(clap::Args)]
#[command(
    args_conflicts_with_subcommands = true,
    after_help = "Needs CAP_NET_ADMIN and /dev/net/tun. Example configuration:\n  crates/net/gateway.example.toml\n\nExamples:\n  tandem gateway genkey > gw.key\n  tandem gateway pubkey \"$(cat gw.key)\"\n  tandem gateway --config gw.toml"
)]
pub struct Args {
    /// Gateway configuration (TOML or JSON): keys, peer, CIDRs, NAT, probes.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
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

/// Runs `tandem gateway …`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    match (args.command, args.config) {
        (Some(Command::Genkey), _) => println!("{}", tandem_net::generate_private_key()),
        (Some(Command::Pubkey { private_key }), _) => {
            println!("{}", tandem_net::public_key(&private_key)?)
        }
        (None, Some(path)) => {
            let config = tandem_net::GatewayArgs::from_file(&path)
                .with_context(|| format!("reading gateway configuration {}", path.display()))?
                .into_config()
                .with_context(|| format!("gateway configuration {}", path.display()))?;
            tandem_net::run_gateway(config).await.context("gateway")?;
        }
        (None, None) => anyhow::bail!(
            "tandem gateway needs --config FILE (or the genkey / pubkey subcommands); see --help"
        ),
    }
    Ok(())
}
