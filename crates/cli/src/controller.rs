//! `tandem controller`: the cluster agent (peering, negotiation, offloading, virtual kubelets,
//! shadow pods), normally run by the Deployment `tandem install` creates.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use tandem_controller::{Controller, Options};

/// Run Tandem's controller against a cluster until interrupted.
#[derive(clap::Args)]
#[command(
    after_help = "In a cluster it uses its ServiceAccount; elsewhere the kubeconfig \
(--kubeconfig, $KUBECONFIG, ~/.kube/config) and --context, like kubectl.\n\nExample:\n  \
tandem controller --kubeconfig ~/.tandem/lab/kubeconfig --context lab-1"
)]
pub struct Args {
    /// Path to the kubeconfig file.
    #[arg(long, env = "KUBECONFIG", value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long)]
    context: Option<String>,
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

pub async fn run(args: Args) -> anyhow::Result<()> {
    let client = client(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
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

/// A client for `--kubeconfig`/`--context`, else kube's usual inference (in-cluster or ~/.kube).
pub async fn client(
    kubeconfig: Option<&std::path::Path>,
    context: Option<&str>,
) -> anyhow::Result<kube::Client> {
    let options = kube::config::KubeConfigOptions {
        context: context.map(str::to_string),
        ..Default::default()
    };
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &options).await?
        }
        None if context.is_some() => kube::Config::from_kubeconfig(&options).await?,
        None => kube::Config::infer().await?,
    };
    Ok(kube::Client::try_from(config)?)
}
