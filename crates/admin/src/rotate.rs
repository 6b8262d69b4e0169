//! `tandem rotate`: replace Tandem's credentials now, without interrupting offloaded pods —
//! ask the controller for a new webhook serving certificate, or make new WireGuard keys for the
//! tunnels, then wait until the controller (or the gateways' configurations) carry them.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use tandem_api::names;
use tandem_controller::consumer::webhook::{
    NOT_AFTER_ANNOTATION, ROTATE_ANNOTATION, ROTATED_ANNOTATION, WEBHOOK_CONFIGURATION,
};
use tandem_controller::fabric::{self, GATEWAY_CONFIG, KeyError, PRIVATE_KEY};

/// How often the waits look again.
const POLL: Duration = Duration::from_millis(250);

/// Why a rotation stopped, naming the object and the step.
#[derive(Debug, thiserror::Error)]
pub enum RotateError {
    /// A request to the cluster failed at `step`.
    #[error("{step}")]
    Api {
        step: String,
        #[source]
        source: kube::Error,
    },
    /// No controller serves the pod-placement webhook on this cluster.
    #[error(
        "MutatingWebhookConfiguration {WEBHOOK_CONFIGURATION} does not exist: no controller \
         serves the pod-placement webhook here (is Tandem installed? `tandem install`)"
    )]
    NoWebhook,
    /// The controller did not fulfil the request within `timeout`; the request stays.
    #[error(
        "the controller has not rotated the webhook's certificate within {}: is it running? \
         (kubectl -n {} get pods -l app.kubernetes.io/name={}; its log names what failed). The \
         request stays: the controller fulfils it when it comes back.",
        humantime::format_duration(*timeout),
        names::SYSTEM_NAMESPACE,
        names::CONTROLLER_NAME
    )]
    WebhookNotRotated { timeout: Duration },
    /// This cluster has no peer, so no key.
    #[error(
        "this cluster holds no WireGuard key: it has no peer yet (keys are made when a peering \
         is)"
    )]
    NoKeys,
    /// A peer named that this cluster holds no key for.
    #[error("this cluster holds no WireGuard key for {peer:?}; it has keys for: {}", keyed.join(", "))]
    NoKeyFor { peer: String, keyed: Vec<String> },
    /// Making the new key pair for `peer` failed.
    #[error("rotating the WireGuard key for {peer}")]
    Key {
        peer: String,
        #[source]
        source: KeyError,
    },
    /// The gateways to `peers` did not take their new keys within `timeout`.
    #[error(
        "the controller has not given the new key to the gateway to {} within {}: is it \
         running? The new key is stored; it takes it when it comes back.",
        peers.join(", "),
        humantime::format_duration(*timeout)
    )]
    KeysNotTaken {
        peers: Vec<String>,
        timeout: Duration,
    },
}

fn api(step: impl Into<String>) -> impl FnOnce(kube::Error) -> RotateError {
    let step = step.into();
    move |source| RotateError::Api { step, source }
}

/// Has the controller issue a new serving certificate (and CA) for the pod-placement webhook,
/// and waits up to `timeout` until it serves it; `progress` is told each step.
pub async fn webhook_certificate(
    client: &kube::Client,
    timeout: Duration,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<(), RotateError> {
    let api_: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let what = format!("MutatingWebhookConfiguration {WEBHOOK_CONFIGURATION}");
    api_.get_opt(WEBHOOK_CONFIGURATION)
        .await
        .map_err(api(format!("reading {what}")))?
        .ok_or(RotateError::NoWebhook)?;
    // The request: a value never used before.
    let request = humantime::format_rfc3339_nanos(std::time::SystemTime::now()).to_string();
    api_.patch(
        WEBHOOK_CONFIGURATION,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {ROTATE_ANNOTATION: request}}})),
    )
    .await
    .map_err(api(format!("annotating {what} with {ROTATE_ANNOTATION}")))?;
    progress(&format!(
        "asked the controller for a new serving certificate ({ROTATE_ANNOTATION}={request})"
    ));
    let deadline = Instant::now() + timeout;
    loop {
        let config = api_
            .get(WEBHOOK_CONFIGURATION)
            .await
            .map_err(api(format!("reading {what}")))?;
        let annotations = config.metadata.annotations.unwrap_or_default();
        if annotations.get(ROTATED_ANNOTATION) == Some(&request) {
            let not_after = annotations
                .get(NOT_AFTER_ANNOTATION)
                .map(String::as_str)
                .unwrap_or("unknown");
            progress(&format!(
                "the pod-placement webhook serves a new certificate, valid until {not_after}"
            ));
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(RotateError::WebhookNotRotated { timeout });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The peers this cluster holds a gateway key for (from the key Secrets' label).
async fn keyed_peers(secrets: &Api<Secret>) -> Result<BTreeMap<String, Secret>, RotateError> {
    let listed = secrets
        .list(&ListParams::default().labels(&format!(
            "{}={},{}",
            names::MANAGED_BY_LABEL,
            names::MANAGED_BY,
            names::REMOTE_CLUSTER_LABEL
        )))
        .await
        .map_err(api(format!(
            "listing Secrets in {}",
            names::SYSTEM_NAMESPACE
        )))?;
    Ok(listed
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

/// Replaces this cluster's WireGuard key pair for the tunnel to each peer (to those in `only`
/// when not empty), then waits up to `timeout` until each running gateway's configuration
/// carries its new key; `progress` is told each step.
pub async fn wireguard_keys(
    client: &kube::Client,
    only: &[String],
    timeout: Duration,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<(), RotateError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), names::SYSTEM_NAMESPACE);
    let keyed = keyed_peers(&secrets).await?;
    if keyed.is_empty() {
        return Err(RotateError::NoKeys);
    }
    let peers: Vec<&String> = if only.is_empty() {
        keyed.keys().collect()
    } else {
        if let Some(peer) = only.iter().find(|p| !keyed.contains_key(*p)) {
            return Err(RotateError::NoKeyFor {
                peer: peer.clone(),
                keyed: keyed.keys().cloned().collect(),
            });
        }
        only.iter().collect()
    };
    // The gateways to wait for: those running with a configuration now.
    let mut waiting = Vec::new();
    for peer in peers {
        let key = fabric::rotate_gateway_key(client, peer)
            .await
            .map_err(|source| RotateError::Key {
                peer: peer.clone(),
                source,
            })?;
        progress(&format!(
            "{peer}: new WireGuard key pair (public key {})",
            key.public_key
        ));
        if configured_key(&keyed[peer]).is_some() {
            waiting.push((peer.clone(), key.private_key));
        }
    }
    let deadline = Instant::now() + timeout;
    while !waiting.is_empty() {
        let mut still = Vec::new();
        for (peer, private) in waiting {
            let name = fabric::gateway_secret(&peer);
            let secret = secrets.get(&name).await.map_err(api(format!(
                "reading Secret {}/{name}",
                names::SYSTEM_NAMESPACE
            )))?;
            if configured_key(&secret).as_deref() == Some(private.as_str()) {
                progress(&format!(
                    "{peer}: the gateway's configuration carries the new key"
                ));
            } else {
                still.push((peer, private));
            }
        }
        waiting = still;
        if waiting.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            return Err(RotateError::KeysNotTaken {
                peers: waiting.into_iter().map(|(p, _)| p).collect(),
                timeout,
            });
        }
        tokio::time::sleep(POLL).await;
    }
    Ok(())
}
