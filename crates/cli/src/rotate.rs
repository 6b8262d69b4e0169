//! `tandem rotate`: replace Tandem's credentials now, without interrupting offloaded pods.

use std::time::Duration;

use tandem_admin::rotate;

use crate::flags::{ClusterArgs, duration};

/// Replace a credential of this cluster's Tandem now.
#[derive(clap::Args)]
#[command(
    after_help = "What renews by itself: the webhook's serving certificate after two thirds of \
its lifetime (`tandem controller --webhook-certificate-lifetime`, 90 days by default) and a \
consumer's peer certificate after 80 % of its lifetime. WireGuard keys change only when rotated \
here.\n\nExamples:\n  tandem rotate webhook-certificate\n  tandem rotate wireguard-keys              # the \
tunnel to every peer\n  tandem rotate wireguard-keys --peer milan"
)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// Have the controller issue a new serving certificate (and CA) for the pod-placement
    /// webhook. The new CA joins the webhook's caBundle before the certificate serves, and the
    /// old one leaves after: pod creation never fails on it.
    WebhookCertificate {
        /// How long to wait for the controller to do it.
        #[arg(long, default_value = "60s", value_parser = duration)]
        timeout: Duration,
    },
    /// Replace this cluster's WireGuard key pair for the tunnel to each peer (or to those
    /// named). The peer learns the new public key through the peering within seconds and both
    /// gateways restart their data path: packets in flight then may be lost (TCP resends
    /// them); offloaded pods keep running.
    WireguardKeys {
        /// Only the key of the tunnel to this peer (cluster ID); repeatable.
        #[arg(long = "peer", value_name = "CLUSTER_ID")]
        peers: Vec<String>,
        /// How long to wait for this cluster's gateways to take the new keys.
        #[arg(long, default_value = "60s", value_parser = duration)]
        timeout: Duration,
    },
}

pub async fn run(args: Args, cluster: &ClusterArgs) -> anyhow::Result<()> {
    let client = cluster.client().await?;
    let mut progress = |line: &str| eprintln!("✓ {line}");
    match args.what {
        What::WebhookCertificate { timeout } => {
            rotate::webhook_certificate(&client, timeout, &mut progress).await?
        }
        What::WireguardKeys { peers, timeout } => {
            rotate::wireguard_keys(&client, &peers, timeout, &mut progress).await?;
            eprintln!("each peer takes the new public key at its next sync (seconds)");
        }
    }
    Ok(())
}
