//! Runs Tandem's controller in-process for a lab cluster. Lab clusters have hollow kubelets that
//! run no containers, so the controller Deployment `tandem install` creates is "run" here: once
//! the Deployment exists, a controller starts against the cluster — through `kube::Client`
//! over HTTPS like any other client — and stops when the Deployment is deleted.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::Client;
use kube::api::Api;
use tandem_api::names;
use tandem_controller::{Controller, Options};

/// Hosts the controller of one lab cluster until the process ends. It runs in this process's
/// network, the host's: its mDNS is refused (it would multicast on the host's LAN), with a
/// reason its log gives when `tandem advertise --mdns` or `tandem discover --mdns` asks.
pub async fn host_controller(name: String, client: Client, options: Options) {
    let options = Options {
        mdns_socket: Some(tandem_controller::context::MdnsSocket(std::sync::Arc::new(
            || {
                Err(std::io::Error::other(
                    "a hollow lab cluster has no LAN of its own (its controller runs in the host's \
                 network, which lab traffic never leaves for); a network-mode lab's nodes share \
                 one (`tandem lab up --network`, the controller patched with hostNetwork)",
                ))
            },
        ))),
        ..options
    };
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), names::SYSTEM_NAMESPACE);
    let mut running: Option<Controller> = None;
    loop {
        let installed = matches!(
            deployments.get_opt(names::CONTROLLER_NAME).await,
            Ok(Some(_))
        );
        match (installed, running.is_some()) {
            (true, false) => match Controller::start(client.clone(), options.clone()).await {
                Ok(c) => {
                    tracing::info!(cluster = %name, "tandem controller started in-process");
                    running = Some(c);
                }
                Err(e) => {
                    tracing::debug!(cluster = %name, error = %e, "controller not startable yet")
                }
            },
            (false, true) => {
                tracing::info!(cluster = %name, "tandem controller stopped (Deployment removed)");
                if let Some(c) = running.take() {
                    c.shutdown();
                }
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
