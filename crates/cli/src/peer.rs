//! `tandem peer INVITE`: on the consumer, peer with the provider that issued the invite.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::anyhow;
use tandem_core::invite::PeeringInvite;

use crate::flags::{ClusterArgs, duration};

/// Peer with a provider using its invite (touches only this cluster).
#[derive(clap::Args)]
pub struct Args {
    /// The invite string from `tandem invite` on the provider (omit with --remote-kubeconfig).
    invite: Option<String>,
    /// Create the invite on the provider with this kubeconfig first (admins of both clusters).
    #[arg(long, value_name = "FILE")]
    remote_kubeconfig: Option<PathBuf>,
    /// Context of --remote-kubeconfig.
    #[arg(long, value_name = "NAME")]
    remote_context: Option<String>,
    /// How long to wait for the peering to be established.
    #[arg(long, default_value = "60s", value_parser = duration)]
    timeout: Duration,
}

pub async fn run(args: Args, cluster: &ClusterArgs) -> anyhow::Result<()> {
    let invite = match (&args.invite, &args.remote_kubeconfig) {
        (Some(s), None) => {
            PeeringInvite::decode(s).map_err(|e| anyhow!("reading the invite: {e}"))?
        }
        (None, Some(path)) => {
            let remote = ClusterArgs {
                kubeconfig: Some(path.clone()),
                context: args.remote_context.clone(),
            }
            .target()
            .await?;
            let ca = remote.ca_pem.ok_or_else(|| {
                anyhow!(
                    "{} has no certificate-authority for the provider",
                    path.display()
                )
            })?;
            eprintln!("creating an invite on the provider with {}", path.display());
            tandem_controller::invite::create(
                &remote.client,
                &remote.server,
                &ca,
                Duration::from_secs(600),
            )
            .await?
        }
        _ => return Err(anyhow!("give either an INVITE or --remote-kubeconfig FILE")),
    };
    let provider = invite.provider_cluster_id.clone();
    let client = cluster.client().await?;
    tandem_controller::invite::accept(&client, &invite)
        .await
        .map_err(|e| {
            anyhow::Error::new(e).context(format!("peering with {provider}: accepting the invite"))
        })?;
    eprintln!(
        "peering with {provider} at {} (token {})",
        invite.endpoint, invite.token_id
    );
    let result = tandem_controller::invite::wait_established(
        &client,
        &provider,
        args.timeout,
        &mut |line| {
            eprintln!("✓ {line}");
        },
    )
    .await;
    match result {
        Ok(p) => {
            let node = p.status.and_then(|s| s.virtual_node).unwrap_or_default();
            eprintln!("peering with {provider} established; virtual node {node}");
            Ok(())
        }
        Err(e) => {
            let cleanup = tandem_controller::invite::abandon(&client, &provider).await;
            let hint = peer_hint(&e);
            let cause = format!("{:#}", anyhow::Error::new(e));
            let mut msg = format!("peering with {provider}: establishing: {cause}\nhint: {hint}");
            if let Err(c) = cleanup {
                msg.push_str(&format!(
                    "\nwarning: cleaning up failed: {:#}",
                    anyhow::Error::new(c)
                ));
            }
            Err(anyhow!(msg))
        }
    }
}

/// What the admin can do about a peering that did not get established.
fn peer_hint(e: &tandem_controller::invite::InviteError) -> &'static str {
    use tandem_controller::invite::InviteError;
    match e {
        InviteError::Refused(r) if r.needs_new_invite() => {
            "ask the provider's admin for a new invite (`tandem invite`)"
        }
        InviteError::NotEstablished {
            provider_unreachable: true,
            ..
        } => "check that this cluster's controller can reach the provider's API endpoint",
        _ => "see `kubectl get peering` and the controller's logs",
    }
}
