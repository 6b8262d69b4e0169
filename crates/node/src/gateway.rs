//! The gateway to one peer (`tandem gateway`): `tandem-net`'s data plane (userspace
//! WireGuard, prefix NAT, routes), from a file or, in a cluster, from the Secret the controller
//! keeps.

use std::path::Path;

use tandem_api::names::{GATEWAY_CONFIG, gateway_secret};
use tandem_net::{GatewayArgs, GatewayConfig};

use crate::NodeError;

/// Runs the gateway configured by the file at `path` (TOML or JSON) until it fails.
pub async fn run_file(path: &Path) -> Result<(), NodeError> {
    let args = GatewayArgs::from_file(path)
        .map_err(|e| NodeError::Gateway(tandem_net::GatewayError::Config(e)))?;
    let config = GatewayConfig::try_from(args).map_err(NodeError::Gateway)?;
    tandem_net::run_gateway(config)
        .await
        .map_err(NodeError::Gateway)
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
) -> Result<Option<GatewayArgs>, NodeError> {
    let Some(secret) = api.get_opt(name).await.map_err(|source| NodeError::Api {
        what: format!("reading Secret {name}"),
        source,
    })?
    else {
        return Ok(None);
    };
    let Some(data) = secret.data.as_ref().and_then(|d| d.get(GATEWAY_CONFIG)) else {
        return Ok(None);
    };
    serde_json::from_slice(&data.0)
        .map(Some)
        .map_err(|source| NodeError::Format {
            what: format!("Secret {name}: {GATEWAY_CONFIG} is not a gateway configuration"),
            source,
        })
}

/// The gateway to `peer` run in a cluster, reading its Secret in `namespace` with `client`
/// until `shutdown` completes: its ServiceAccount may read only its own Secret,
/// which it reads every [`POLL`] ([`POLL_WAITING`] before it has one); the data path runs the last valid configuration and is
/// restarted (rules reconciled, not flushed) when it changes or fails. SIGTERM removes its
/// nftables table and TUN device before it exits.
pub async fn run_in_cluster(
    client: kube::Client,
    namespace: &str,
    peer: &str,
    shutdown: impl Future<Output = ()>,
) {
    let api: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(client, namespace);
    let name = gateway_secret(peer);
    let interrupted = shutdown;
    tokio::pin!(interrupted);
    type Running = (
        GatewayArgs,
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
                match GatewayConfig::try_from(args.clone()) {
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
                    Err(e) => tracing::error!("Secret {name}: {}", tandem_core::errors::chain(&e)),
                }
            }
            Ok(Some(args)) if running.as_ref().map(|r| &r.0) != Some(&args) => {
                if let Some(r) = running.take() {
                    tracing::info!("configuration changed: restarting the data path");
                    stop(r).await;
                }
                match GatewayConfig::try_from(args.clone()) {
                    Ok(config) => {
                        let (tx, rx) = tokio::sync::oneshot::channel();
                        let task = tokio::spawn(tandem_net::run_gateway_until(config, async {
                            let _ = rx.await;
                        }));
                        running = Some((args, tx, task));
                    }
                    Err(e) => tracing::error!("Secret {name}: {}", tandem_core::errors::chain(&e)),
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
            Err(e) => tracing::warn!("{}", tandem_core::errors::chain(&e)),
        }
        tokio::select! {
            () = &mut interrupted => break,
            () = tokio::time::sleep(if running.is_some() { POLL } else { POLL_WAITING }) => {}
        }
    }
    if let Some(r) = running.take() {
        stop(r).await;
    }
}
