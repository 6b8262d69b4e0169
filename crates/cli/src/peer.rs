//! `tandem peer INVITE`: on the consumer, peer with the provider that issued the invite.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::anyhow;
use tandem_core::invite::PeeringInvite;

use crate::flags::{ClusterArgs, duration};

/// Peer with a provider using its invite, or without one through discovery (touches only
/// this cluster).
#[derive(clap::Args)]
#[command(
    group = clap::ArgGroup::new("how").args(["invite", "remote_kubeconfig", "discovered", "endpoint"]),
    after_help = "With an invite (`tandem invite` on the provider), the peering is approved in \
advance.\n\nWithout one, --discovered NAME (a cluster `tandem discover` lists) or --endpoint \
URL --ca-fingerprint sha256:HEX files a peering request that waits until the provider's admin \
approves it (`tandem approve` there) or a PeeringPolicy there names this cluster's key \
fingerprint, which this command prints. Discovery is unauthenticated, so nothing is sent before \
the provider's CA matches the fingerprint you confirmed with its admin out of band \
(--ca-fingerprint, `openssl x509 -fingerprint -sha256` form, colons optional; or, on a \
terminal, a confirmation of the advertised one). A provider presenting another CA is \
refused.\n\nExamples:\n  tandem peer INVITE\n  tandem peer --discovered milan --ca-fingerprint \
sha256:3f1c...\n  tandem peer --endpoint https://api.milan.example.org:6443 --ca-fingerprint \
3F:1C:...\n  tandem peer --discovered milan --wait --timeout 10m"
)]
pub struct Args {
    /// The invite string from `tandem invite` on the provider (omit with --remote-kubeconfig).
    invite: Option<String>,
    /// Peer without an invite with a cluster `tandem discover` lists (its cluster ID).
    #[arg(long, value_name = "NAME")]
    discovered: Option<String>,
    /// Peer without an invite with the cluster at this API endpoint (needs --ca-fingerprint).
    #[arg(long, value_name = "URL", requires = "ca_fingerprint")]
    endpoint: Option<String>,
    /// The SHA-256 fingerprint of the provider's CA, confirmed with its admin out of band.
    #[arg(long, value_name = "sha256:HEX")]
    ca_fingerprint: Option<String>,
    /// Without an invite: wait (up to --timeout) until the provider approves, rather than
    /// returning once the request waits for approval.
    #[arg(long)]
    wait: bool,
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
    if args.discovered.is_some() || args.endpoint.is_some() {
        return run_enrollment(args, cluster).await;
    }
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
            tandem_admin::invite::create(
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
    tandem_admin::invite::accept(&client, &invite)
        .await
        .map_err(|e| {
            anyhow::Error::new(e).context(format!("peering with {provider}: accepting the invite"))
        })?;
    eprintln!(
        "peering with {provider} at {} (token {})",
        invite.endpoint, invite.token_id
    );
    let result =
        tandem_admin::invite::wait_established(&client, &provider, args.timeout, &mut |line| {
            eprintln!("✓ {line}");
        })
        .await;
    match result {
        Ok(p) => {
            let node = p
                .status
                .clone()
                .and_then(|s| s.virtual_node)
                .unwrap_or_default();
            eprintln!("peering with {provider} established; virtual node {node}");
            crate::status::warn_if_fabric_off(&client).await;
            until_schedulable(&client, &p, args.timeout).await
        }
        Err(e) => {
            let cleanup = tandem_admin::invite::abandon(&client, &provider).await;
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

/// Returns once the established peering's virtual node takes pods (with the fabric on, once
/// the tunnel is up), saying what it waits for meanwhile; an error naming what it still waits
/// for after `timeout` (the peering stays).
async fn until_schedulable(
    client: &kube::Client,
    peering: &tandem_api::Peering,
    timeout: std::time::Duration,
) -> anyhow::Result<()> {
    tandem_admin::invite::wait_schedulable(client, peering, timeout, &mut |waiting| {
        eprintln!("… {waiting}");
    })
    .await?;
    eprintln!("✓ the virtual node takes pods");
    Ok(())
}

/// What the admin can do about a peering that did not get established.
fn peer_hint(e: &tandem_admin::invite::InviteError) -> &'static str {
    use tandem_admin::invite::InviteError;
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

/// `tandem peer --discovered NAME | --endpoint URL`: the CA pinned first, then the request.
async fn run_enrollment(args: Args, cluster: &ClusterArgs) -> anyhow::Result<()> {
    use tandem_admin::enroll;
    use tandem_api::DiscoveredCluster;
    let client = cluster.client().await?;
    let typed = args
        .ca_fingerprint
        .as_deref()
        .map(tandem_core::discovery::parse_fingerprint)
        .transpose()
        .map_err(|e| anyhow!("--ca-fingerprint: {e}"))?;
    let (endpoint, source, advertised, expected_id) = match (&args.discovered, &args.endpoint) {
        (Some(name), _) => {
            let found = kube::Api::<DiscoveredCluster>::all(client.clone())
                .get_opt(name)
                .await
                .map_err(|e| anyhow!("reading DiscoveredCluster {name}: {e}"))?
                .ok_or_else(|| {
                    anyhow!("no discovered cluster {name:?} (see `tandem discover --mdns` or `--domain`)")
                })?;
            let spec = found.spec;
            let source = match &spec.domain {
                Some(d) => format!("{} {d}", spec.source),
                None => spec.source.clone(),
            };
            (
                spec.endpoint,
                source,
                Some(spec.ca_fingerprint),
                Some(name.clone()),
            )
        }
        (None, Some(url)) => (
            url.trim_end_matches('/').to_string(),
            "endpoint".to_string(),
            None,
            None,
        ),
        (None, None) => unreachable!("checked by the caller"),
    };
    let pinned = match (typed, advertised) {
        (Some(typed), Some(advertised)) if typed != advertised => {
            return Err(anyhow!(
                "the fingerprint you confirmed ({typed}) is not the one {} advertises ({advertised}): refused, nothing was sent",
                args.discovered.as_deref().unwrap_or_default()
            ));
        }
        (Some(typed), _) => typed,
        (None, Some(advertised)) => confirm(&advertised)?,
        (None, None) => return Err(anyhow!("--endpoint needs --ca-fingerprint")),
    };
    eprintln!("reading the CA of {endpoint} and checking it is {pinned}");
    let provider = enroll::fetch_provider(&endpoint, &pinned)
        .await
        .map_err(|e| anyhow!("peering with {endpoint}: {e}"))?;
    if let Some(id) = expected_id
        && id != provider.cluster_id
    {
        return Err(anyhow!(
            "{endpoint} answers as cluster {:?}, not the discovered {id:?}: refused",
            provider.cluster_id
        ));
    }
    let identity = tandem_controller::identity::ClusterIdentity::load(&client).await?;
    let key = enroll::own_key_fingerprint(&identity.private_key_pem)
        .map_err(|e| anyhow!("reading this cluster's key: {e}"))?;
    let id = provider.cluster_id.clone();
    eprintln!("✓ {endpoint} presents the confirmed CA; it is cluster {id}");
    eprintln!("this cluster's key fingerprint (what a PeeringPolicy on {id} names): {key}");
    enroll::request(&client, &endpoint, &provider, &source)
        .await
        .map_err(|e| anyhow::Error::new(e).context(format!("peering with {id}")))?;
    let deadline = tokio::time::Instant::now() + args.timeout;
    let peerings = kube::Api::<tandem_api::Peering>::all(client.clone());
    let mut told = String::new();
    // The Peering's UID once seen: its Event, not one of an earlier peering with `id`.
    let mut uid: Option<String> = None;
    loop {
        let Some(peering) = peerings
            .get_opt(&id)
            .await
            .map_err(|e| anyhow!("reading Peering {id}: {e}"))?
        else {
            let why = match &uid {
                Some(uid) => why_given_up(&client, &id, uid).await,
                None => None,
            };
            return Err(match why {
                Some(why) => anyhow!("{why}; the controller removed the Peering"),
                // No Event of its own: removed by someone else, or the Event was lost.
                None => anyhow!(
                    "the Peering with {id} was removed before it was established (see `kubectl get events -n default --field-selector involvedObject.name={id}`)"
                ),
            });
        };
        uid = peering.metadata.uid.clone();
        if tandem_admin::invite::is_established(&peering) {
            let node = peering
                .status
                .clone()
                .and_then(|s| s.virtual_node)
                .unwrap_or_default();
            eprintln!("peering with {id} established; virtual node {node}");
            crate::status::warn_if_fabric_off(&client).await;
            return until_schedulable(&client, &peering, args.timeout).await;
        }
        let status = peering.status.clone().unwrap_or_default();
        let auth =
            tandem_api::conditions::find(&status.conditions, tandem_api::conditions::AUTHENTICATED);
        if status.phase.as_deref() == Some("Failed") {
            let why = auth.map(|c| c.message.clone()).unwrap_or_default();
            return Err(anyhow!("peering with {id}: {why}"));
        }
        // Each new word of the controller while it is not authenticated (waiting for an
        // approval, a decoy's removal, an unreachable provider): progress, and the cause when
        // it does not end.
        if let Some(c) = auth
            && c.status != "True"
            && c.message != told
        {
            told = c.message.clone();
            eprintln!("… {told}");
            if c.reason == "AwaitingApproval" && !args.wait {
                println!(
                    "Peering request filed with {id}; the peering completes when {id} approves it \
                     (`tandem approve` there, or a PeeringPolicy naming {key}). Follow it with \
                     `kubectl get peering {id}`."
                );
                return Ok(());
            }
        }
        if tokio::time::Instant::now() > deadline {
            let after = tandem_core::invite::human_duration(args.timeout.as_secs() as i64);
            return Err(match auth.filter(|c| c.status != "True") {
                Some(c) if c.reason == "AwaitingApproval" => anyhow!(
                    "peering with {id}: not established after {after} ({}); it stays requested (`kubectl get peering {id}`); `tandem unpeer {id}` removes it here, and the request on {id} expires unapproved",
                    c.message
                ),
                // Not filed, or not answered yet: say why.
                Some(c) => anyhow!(
                    "peering with {id}: not established after {after} ({}); the controller keeps trying (`kubectl get peering {id}`); `tandem unpeer {id}` removes it here",
                    c.message
                ),
                None => anyhow!(
                    "peering with {id}: not established after {after}; the controller keeps trying (`kubectl get peering {id}`); `tandem unpeer {id}` removes it here"
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What the controller's Event says about the peering through discovery with `id` (the
/// Peering `uid`) it gave up: denied, or its request removed by the provider.
async fn why_given_up(client: &kube::Client, id: &str, uid: &str) -> Option<String> {
    use k8s_openapi::api::core::v1::Event;
    let events = kube::Api::<Event>::namespaced(client.clone(), "default")
        .list(&kube::api::ListParams::default().fields(&format!("involvedObject.name={id}")))
        .await
        .ok()?;
    events
        .items
        .into_iter()
        .filter(|e| {
            e.involved_object.kind.as_deref() == Some("Peering")
                && e.involved_object.uid.as_deref() == Some(uid)
                && matches!(
                    e.reason.as_deref(),
                    Some("PeeringDenied" | "PeeringRequestRemoved")
                )
        })
        .max_by_key(|e| e.last_timestamp.clone().map(|t| t.0))
        .and_then(|e| e.message)
}

/// On a terminal, asks the admin to confirm the advertised fingerprint; elsewhere refuses.
fn confirm(advertised: &str) -> anyhow::Result<String> {
    use std::io::{BufRead, IsTerminal, Write};
    if !std::io::stdin().is_terminal() {
        return Err(anyhow!(
            "confirm the provider's CA fingerprint with its admin and pass it: --ca-fingerprint {advertised} (discovery is unauthenticated: anyone can advertise any name)"
        ));
    }
    eprint!(
        "The provider advertises CA fingerprint\n  {advertised}\nHas its admin confirmed this fingerprint to you (out of band)? [y/N] "
    );
    std::io::stderr().flush().ok();
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    if matches!(answer.trim(), "y" | "Y" | "yes") {
        Ok(advertised.to_string())
    } else {
        Err(anyhow!("not confirmed: nothing was sent"))
    }
}
