//! `tandem rotate`: replace Tandem's credentials now, without interrupting offloaded pods.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use tandem_api::names;
use tandem_controller::consumer::webhook::{
    NOT_AFTER_ANNOTATION, ROTATE_ANNOTATION, ROTATED_ANNOTATION, WEBHOOK_CONFIGURATION,
};
use tandem_controller::fabric::{self, GATEWAY_CONFIG, PRIVATE_KEY};

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
    match args.what {
        What::WebhookCertificate { timeout } => webhook_certificate(&client, timeout).await,
        What::WireguardKeys { peers, timeout } => wireguard_keys(&client, &peers, timeout).await,
    }
}

/// How often the waits look again.
const POLL: Duration = Duration::from_millis(250);

async fn webhook_certificate(client: &kube::Client, timeout: Duration) -> anyhow::Result<()> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let what = format!("MutatingWebhookConfiguration {WEBHOOK_CONFIGURATION}");
    api.get_opt(WEBHOOK_CONFIGURATION)
        .await
        .with_context(|| format!("reading {what}"))?
        .with_context(|| {
            format!(
                "{what} does not exist: no controller serves the pod-placement webhook here \
                 (is Tandem installed? `tandem install`)"
            )
        })?;
    // The request: a value never used before.
    let request = humantime::format_rfc3339_nanos(std::time::SystemTime::now()).to_string();
    api.patch(
        WEBHOOK_CONFIGURATION,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {ROTATE_ANNOTATION: request}}})),
    )
    .await
    .with_context(|| format!("annotating {what} with {ROTATE_ANNOTATION}"))?;
    eprintln!(
        "✓ asked the controller for a new serving certificate ({ROTATE_ANNOTATION}={request})"
    );
    let deadline = Instant::now() + timeout;
    loop {
        let config = api
            .get(WEBHOOK_CONFIGURATION)
            .await
            .with_context(|| format!("reading {what}"))?;
        let annotations = config.metadata.annotations.unwrap_or_default();
        if annotations.get(ROTATED_ANNOTATION) == Some(&request) {
            let not_after = annotations
                .get(NOT_AFTER_ANNOTATION)
                .map(String::as_str)
                .unwrap_or("unknown");
            eprintln!(
                "✓ the pod-placement webhook serves a new certificate, valid until {not_after}"
            );
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the controller has not rotated the webhook's certificate within {}: is it running? \
             (kubectl -n {} get pods -l app.kubernetes.io/name={}; its log names \
             what failed). The request stays: the controller fulfils it when it comes back.",
            humantime::format_duration(timeout),
            names::SYSTEM_NAMESPACE,
            names::CONTROLLER_NAME
        );
        tokio::time::sleep(POLL).await;
    }
}

/// The peers this cluster holds a gateway key for (from the key Secrets' label).
async fn keyed_peers(api: &Api<Secret>) -> anyhow::Result<BTreeMap<String, Secret>> {
    let secrets = api
        .list(&ListParams::default().labels(&format!(
            "{}={},{}",
            names::MANAGED_BY_LABEL,
            names::MANAGED_BY,
            names::REMOTE_CLUSTER_LABEL
        )))
        .await
        .with_context(|| format!("listing Secrets in {}", names::SYSTEM_NAMESPACE))?;
    Ok(secrets
        .items
        .into_iter()
        .filter_map(|s| {
            let peer = s
                .metadata
                .labels
                .as_ref()?
                .get(names::REMOTE_CLUSTER_LABEL)?
                .clone();
            let keyed = s.metadata.name.as_deref() == Some(fabric::gateway_secret(&peer).as_str())
                && s.data.as_ref().is_some_and(|d| d.contains_key(PRIVATE_KEY));
            keyed.then_some((peer, s))
        })
        .collect())
}

/// The private key the gateway's configuration in `secret` runs with, if it has one.
fn configured_key(secret: &Secret) -> Option<String> {
    let config = secret.data.as_ref()?.get(GATEWAY_CONFIG)?;
    serde_json::from_slice::<tandem_netspec::GatewayArgs>(&config.0)
        .ok()
        .map(|a| a.private_key)
}

async fn wireguard_keys(
    client: &kube::Client,
    only: &[String],
    timeout: Duration,
) -> anyhow::Result<()> {
    let api: Api<Secret> = Api::namespaced(client.clone(), names::SYSTEM_NAMESPACE);
    let keyed = keyed_peers(&api).await?;
    if keyed.is_empty() {
        anyhow::bail!(
            "this cluster holds no WireGuard key: it has no peer yet (keys are made when a \
             peering is)"
        );
    }
    let peers: Vec<&String> = if only.is_empty() {
        keyed.keys().collect()
    } else {
        for peer in only {
            anyhow::ensure!(
                keyed.contains_key(peer),
                "this cluster holds no WireGuard key for {peer:?}; it has keys for: {}",
                keyed.keys().cloned().collect::<Vec<_>>().join(", ")
            );
        }
        only.iter().collect()
    };
    // The gateways to wait for: those running with a configuration now.
    let mut waiting = Vec::new();
    for peer in peers {
        let key = fabric::rotate_gateway_key(client, peer)
            .await
            .with_context(|| format!("rotating the WireGuard key for {peer}"))?;
        eprintln!(
            "✓ {peer}: new WireGuard key pair (public key {})",
            key.public_key
        );
        if configured_key(&keyed[peer]).is_some() {
            waiting.push((peer.clone(), key.private_key));
        }
    }
    let deadline = Instant::now() + timeout;
    while !waiting.is_empty() {
        let mut still = Vec::new();
        for (peer, private) in waiting {
            let name = fabric::gateway_secret(&peer);
            let secret = api
                .get(&name)
                .await
                .with_context(|| format!("reading Secret {}/{name}", names::SYSTEM_NAMESPACE))?;
            if configured_key(&secret).as_deref() == Some(private.as_str()) {
                eprintln!("✓ {peer}: the gateway's configuration carries the new key");
            } else {
                still.push((peer, private));
            }
        }
        waiting = still;
        if waiting.is_empty() {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the controller has not given the new key to the gateway to {} within {}: is it \
             running? The new key is stored; it takes it when it comes back.",
            waiting
                .iter()
                .map(|(p, _)| p.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            humantime::format_duration(timeout)
        );
        tokio::time::sleep(POLL).await;
    }
    eprintln!("each peer takes the new public key at its next sync (seconds)");
    Ok(())
}
