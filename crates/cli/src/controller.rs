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
    /// The Service the API server calls the webhook through (NAMESPACE/NAME, port 443), when
    /// the controller runs as a pod behind it [default: the API server calls --webhook-addr].
    #[arg(long, value_name = "NAMESPACE/NAME", value_parser = service_ref)]
    webhook_service: Option<(String, String)>,
    /// How often virtual nodes renew their Lease and probe their provider (seconds).
    #[arg(long, default_value_t = 5)]
    heartbeat_seconds: u64,
    /// How long a provider may be unreachable before its virtual node is NotReady (seconds).
    #[arg(long, default_value_t = 15)]
    provider_grace_seconds: u64,
}

fn service_ref(s: &str) -> Result<(String, String), String> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_string(), name.to_string()))
        }
        _ => Err(format!("{s:?} is not NAMESPACE/NAME")),
    }
}

/// Who the API server says this controller is (SelfSubjectReview), for its log.
async fn whoami(client: &kube::Client) -> anyhow::Result<String> {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let review = kube::Api::<SelfSubjectReview>::all(client.clone())
        .create(&Default::default(), &SelfSubjectReview::default())
        .await
        .context("asking the API server who this controller is (SelfSubjectReview)")?;
    Ok(review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .unwrap_or_default())
}

pub async fn run(args: Args, cluster: &ClusterArgs) -> anyhow::Result<()> {
    let client = cluster.client().await?;
    let user = whoami(&client).await?;
    tracing::info!("authenticated as {user}");
    let options = Options {
        webhook_addr: args.webhook_addr,
        webhook_service: args.webhook_service,
        heartbeat: Duration::from_secs(args.heartbeat_seconds),
        provider_grace: Duration::from_secs(args.provider_grace_seconds),
    };
    let controller = Controller::start(client, options)
        .await
        .context("starting the controller")?;
    // SIGTERM too: that is how a kubelet stops the controller's pod.
    let interrupted = crate::interrupt().context("listening for SIGINT and SIGTERM")?;
    tokio::select! {
        _ = controller.wait() => anyhow::bail!("the controller stopped"),
        () = interrupted => {
            tracing::info!("stopping");
            Ok(())
        }
    }
}
