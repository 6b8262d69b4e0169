//! `tandem gateway`: the per-peer data plane (userspace WireGuard, prefix NAT, routes).

use std::path::PathBuf;

use anyhow::Context;
use tandem_net::GatewayArgs;

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

/// Runs `tandem gateway …`.
pub async fn run(args: Args, cluster: &crate::flags::ClusterArgs) -> anyhow::Result<()> {
    if let Some(peer) = &args.peer {
        return in_cluster(peer, cluster).await;
    }
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

/// How often the in-cluster gateway reads its configuration: a new pod is reachable once its
/// address is in the allow-list, so this is part of a new pod's first-request time (one GET
/// of one Secret per period).
const POLL: std::time::Duration = std::time::Duration::from_millis(500);
/// … and while it has none yet (the tunnel comes up as soon as the controller writes it).
const POLL_WAITING: std::time::Duration = std::time::Duration::from_millis(200);

/// The configuration in the Secret, or why there is none to run.
async fn read_config(
    api: &kube::Api<k8s_openapi::api::core::v1::Secret>,
    name: &str,
) -> anyhow::Result<Option<tandem_net::GatewayArgs>> {
    let Some(secret) = api
        .get_opt(name)
        .await
        .with_context(|| format!("reading Secret {name}"))?
    else {
        return Ok(None);
    };
    let Some(data) = secret
        .data
        .as_ref()
        .and_then(|d| d.get(tandem_controller::fabric::GATEWAY_CONFIG))
    else {
        return Ok(None);
    };
    serde_json::from_slice(&data.0).map(Some).with_context(|| {
        format!(
            "Secret {name}: {} is not a gateway configuration",
            tandem_controller::fabric::GATEWAY_CONFIG
        )
    })
}

/// The gateway to `peer` run in a cluster: its ServiceAccount may read only its own Secret,
/// which it reads every [`POLL`] ([`POLL_WAITING`] before it has one); the data path runs the last valid configuration and is
/// restarted (rules reconciled, not flushed) when it changes or fails. SIGTERM removes its
/// nftables table and TUN device before it exits.
async fn in_cluster(peer: &str, cluster: &crate::flags::ClusterArgs) -> anyhow::Result<()> {
    let config = cluster.config().await?;
    let namespace = config.default_namespace.clone();
    let client = kube::Client::try_from(config).context("building the API client")?;
    let api: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(client, &namespace);
    let name = tandem_controller::fabric::gateway_secret(peer);
    let interrupted = crate::interrupt().context("listening for SIGINT and SIGTERM")?;
    tokio::pin!(interrupted);
    type Running = (
        tandem_net::GatewayArgs,
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<Result<(), tandem_net::GatewayError>>,
    );
    let mut running: Option<Running> = None;
    let stop = |r: Running| async move {
        let (_, tx, task) = r;
        let _ = tx.send(());
        match task.await {
            Ok(Err(e)) => tracing::warn!("gateway stopped: {e}"),
            Err(e) => tracing::warn!("gateway task: {e}"),
            Ok(Ok(())) => {}
        }
    };
    tracing::info!(peer, secret = %format!("{namespace}/{name}"), "gateway waiting for its configuration");
    loop {
        if running.as_ref().is_some_and(|r| r.2.is_finished()) {
            let r = running.take().expect("checked");
            stop(r).await;
        }
        let read = tokio::select! {
            () = &mut interrupted => break,
            read = read_config(&api, &name) => read,
        };
        match read {
            // Only the allow-list changed (pods came or went): the rules follow, the tunnel
            // stays up.
            Ok(Some(args))
                if running.as_ref().is_some_and(|r| {
                    r.0 != args
                        && GatewayArgs {
                            allowed_destinations: None,
                            ..r.0.clone()
                        } == GatewayArgs {
                            allowed_destinations: None,
                            ..args.clone()
                        }
                }) =>
            {
                match args.clone().into_config() {
                    Ok(c) => {
                        let rules = tandem_net::nft::render(
                            &c.plan,
                            &c.nft_table,
                            &c.interface,
                            c.mtu,
                            c.allowed_destinations.as_deref(),
                        );
                        match tandem_net::nft::apply(&rules).await {
                            Ok(_) => {
                                if let Some(r) = running.as_mut() {
                                    r.0 = args;
                                }
                            }
                            Err(e) => tracing::warn!("updating the allowed destinations: {e}"),
                        }
                    }
                    Err(e) => tracing::error!("Secret {name}: {e}"),
                }
            }
            Ok(Some(args)) if running.as_ref().map(|r| &r.0) != Some(&args) => {
                if let Some(r) = running.take() {
                    tracing::info!("configuration changed: restarting the data path");
                    stop(r).await;
                }
                match args.clone().into_config() {
                    Ok(config) => {
                        let (tx, rx) = tokio::sync::oneshot::channel();
                        let task = tokio::spawn(tandem_net::run_gateway_until(config, async {
                            let _ = rx.await;
                        }));
                        running = Some((args, tx, task));
                    }
                    Err(e) => tracing::error!("Secret {name}: {e}"),
                }
            }
            Ok(Some(_)) => {}
            Ok(None) => {
                if let Some(r) = running.take() {
                    tracing::info!("configuration removed: stopping the data path");
                    stop(r).await;
                }
            }
            // Keep the tunnel up while the API server is away.
            Err(e) => tracing::warn!("{e:#}"),
        }
        tokio::select! {
            () = &mut interrupted => break,
            () = tokio::time::sleep(if running.is_some() { POLL } else { POLL_WAITING }) => {}
        }
    }
    if let Some(r) = running.take() {
        stop(r).await;
    }
    Ok(())
}
