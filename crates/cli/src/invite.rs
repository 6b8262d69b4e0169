//! `tandem invite`: on the provider, create (or list, or revoke) a peering invite.

use std::time::Duration;

use anyhow::anyhow;

use crate::flags::{ClusterArgs, duration};
use crate::table;

/// Create a single-use peering invite; prints only the invite string on stdout.
#[derive(clap::Args)]
#[command(
    after_help = "Example:\n  tandem invite --ttl 1h > invite.txt\n  # on the consumer:\n  tandem peer \"$(cat invite.txt)\""
)]
pub struct Args {
    /// How long the invite is valid.
    #[arg(long, default_value = "1h", value_parser = duration)]
    ttl: Duration,
    /// The API endpoint consumers should use [default: the kubeconfig's server; when that is
    /// a loopback address (kind, k3s's own k3s.yaml), the address the API server advertises
    /// in the `kubernetes` Service's endpoints, said on stderr].
    #[arg(long)]
    endpoint: Option<String>,
    /// Revoke the invite with this token ID instead.
    #[arg(long, value_name = "TOKEN_ID", conflicts_with = "list")]
    revoke: Option<String>,
    /// List the invites instead.
    #[arg(long)]
    list: bool,
}

pub async fn run(args: Args, cluster: &ClusterArgs) -> anyhow::Result<()> {
    let target = cluster.target().await?;
    if let Some(id) = args.revoke {
        tandem_admin::invite::revoke(&target.client, &id).await?;
        eprintln!("invite {id} revoked");
        return Ok(());
    }
    if args.list {
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        let mut t = table::new(["TOKEN", "EXPIRES", "USED BY"]);
        for i in tandem_admin::invite::list(&target.client).await? {
            let expires = if i.expires > now {
                format!(
                    "in {}",
                    tandem_core::invite::human_duration(i.expires - now)
                )
            } else {
                "expired".into()
            };
            t.add_row([i.token_id, expires, i.used_by.unwrap_or_else(|| "-".into())]);
        }
        print!("{}", table::render(t, 0));
        return Ok(());
    }
    let ca = target
        .ca_pem
        .ok_or_else(|| anyhow!("the kubeconfig has no certificate-authority for the cluster; consumers could not verify it"))?;
    let endpoint = match args.endpoint {
        Some(e) => e,
        None => {
            let chosen = tandem_admin::endpoint::for_invite(&target.client, &target.server).await?;
            if let Some(note) = chosen.note {
                eprintln!("note: {note}");
            }
            chosen.endpoint
        }
    };
    let invite = tandem_admin::invite::create(&target.client, &endpoint, &ca, args.ttl).await?;
    eprintln!(
        "invite {} for cluster {} valid for {} (revoke: tandem invite --revoke {})",
        invite.token_id,
        invite.provider_cluster_id,
        tandem_core::invite::human_duration(args.ttl.as_secs() as i64),
        invite.token_id
    );
    println!("{}", invite.encode());
    Ok(())
}
