//! `tandem requests`, `tandem approve`, `tandem deny`: on a provider, the peering requests
//! filed without an invite (through discovery), and the administrator's decision on each.

use std::time::Duration;

use anyhow::Context as _;
use tandem_admin::enroll::{self, Decision};

use crate::flags::{GlobalArgs, Output};
use crate::table;

/// List the peering requests waiting for approval (and those just decided).
#[derive(clap::Args)]
#[command(
    after_help = "Each request names the cluster ID the consumer claims (self-asserted), \
the SHA-256 fingerprint of its key (what counts: the consumer's `tandem peer` prints it, so \
its admin can read it to you), how it found this cluster, its age and phase.\n\nApprove with \
`tandem approve NAME`, refuse with `tandem deny NAME`, or let a PeeringPolicy approve keys you \
trust:\n  apiVersion: tandem.dev/v1alpha1\n  kind: PeeringPolicy\n  metadata: {name: partners}\n  \
spec:\n    consumers:\n    - keyFingerprint: sha256:...\n    grant: {cpu: \"4\", memory: 8Gi, \
pods: \"50\"}\n    namespaceMappingStrategies: [DefaultName]\n\nRequests wait at most the \
--request-ttl given to `tandem advertise`, and at most --max-pending of them at once."
)]
pub struct ListArgs {}

/// Approve a peering request filed without an invite.
#[derive(clap::Args)]
pub struct DecideArgs {
    /// The request's name (`tandem requests`), or the cluster ID it claims when only one
    /// pending request claims it.
    id: String,
    /// How long to wait for the controller to carry the decision out.
    #[arg(long, default_value = "30s", value_parser = crate::flags::duration)]
    timeout: Duration,
}

pub async fn list(_args: ListArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let client = global.cluster.client().await?;
    let requests = enroll::list_requests(&client).await?;
    match global.output.unwrap_or_default() {
        Output::Json => println!("{}", serde_json::to_string_pretty(&requests)?),
        Output::Yaml => print!("{}", serde_saphyr::to_string(&requests)?),
        Output::Table if requests.is_empty() => {
            eprintln!("No peering requests (filed without an invite) are waiting.")
        }
        Output::Table => {
            let now = k8s_openapi::jiff::Timestamp::now().as_second();
            let mut t = table::new([
                "NAME",
                "CONSUMER",
                "KEY FINGERPRINT",
                "SOURCE",
                "AGE",
                "PHASE",
            ]);
            for r in &requests {
                t.add_row([
                    r.name.clone(),
                    r.consumer.clone(),
                    r.key_fingerprint.clone(),
                    r.source.clone(),
                    tandem_core::invite::human_duration(now - r.created),
                    r.phase.clone(),
                ]);
            }
            print!("{}", table::render(t, 0));
        }
    }
    Ok(())
}

pub async fn decide(
    args: DecideArgs,
    global: &GlobalArgs,
    decision: Decision,
) -> anyhow::Result<()> {
    let client = global.cluster.client().await?;
    let request = enroll::decide(&client, &args.id, decision).await?;
    let name = &request.name;
    let phase = enroll::wait_decided(&client, &request, args.timeout)
        .await
        .context("waiting for the controller")?;
    match (decision, phase.as_deref()) {
        (Decision::Approve, Some("Approved")) => {
            println!(
                "peering request {name} approved; the consumer's peering completes on its side"
            )
        }
        (Decision::Deny, Some("Denied") | None) => {
            println!("peering request {name} denied; nothing was created for it")
        }
        (_, Some("Denied")) => anyhow::bail!(
            "peering request {name} was denied by the controller's checks (see `tandem requests -o yaml`)"
        ),
        (_, other) => anyhow::bail!(
            "the controller has not carried the decision out within {} (phase {}); is it running? `tandem status`",
            tandem_core::invite::human_duration(args.timeout.as_secs() as i64),
            other.unwrap_or("gone")
        ),
    }
    Ok(())
}
