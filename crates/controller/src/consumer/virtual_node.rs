//! The virtual node standing for one provider: a Node whose capacity is the provider's grant,
//! labelled and tainted so only offloaded pods land on it, with a Lease renewed every heartbeat
//! and a Ready condition that follows whether the provider's API answers.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tandem_api::client;
use tandem_api::{Peering, Tenant, names};
use tokio::time::Instant;

use crate::consumer::link::{LinkWatch, ProviderLink};
use crate::context::Ctx;

use crate::rbac::LEASE_NAMESPACE;
/// Pods a virtual node admits when the grant does not say.
const DEFAULT_PODS: &str = "110";
/// How often the Ready condition's heartbeat time is refreshed when nothing changes.
const STATUS_REFRESH: Duration = Duration::from_secs(10);
/// How often the gateway's tunnel report is read between heartbeats.
const TUNNEL_POLL: Duration = Duration::from_secs(1);
pub use crate::node_marks::MARKS;

/// Reason of Ready=False when the provider does not answer.
pub const REASON_UNREACHABLE: &str = "ProviderUnreachable";

/// The desired metadata and spec of the virtual node (server-side applied).
pub fn desired_node(link: &ProviderLink) -> Value {
    let mut labels: BTreeMap<String, String> = link.node_labels.clone();
    labels.insert(
        names::NODE_TYPE_LABEL.into(),
        names::VIRTUAL_NODE_TYPE.into(),
    );
    labels.insert(names::REMOTE_CLUSTER_LABEL.into(), link.provider_id.clone());
    labels.insert("kubernetes.io/hostname".into(), link.virtual_node.clone());
    labels.insert("kubernetes.io/os".into(), "linux".into());
    labels.insert(names::MANAGED_BY_LABEL.into(), names::MANAGED_BY.into());
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": link.virtual_node, "labels": labels},
        "spec": {"taints": [{"key": names::VIRTUAL_NODE_TAINT, "value": "true", "effect": "NoExecute"}]},
    })
}

/// Whether `node` lost what marks it as virtual ([`MARKS`]: the type label and the NoExecute
/// taint). Only those: its other labels (a zone, say) are the admin's to override.
fn lost_marks(node: &Node) -> bool {
    let labelled = node
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MARKS.type_label))
        .map(String::as_str)
        == Some(MARKS.type_value);
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| {
            ts.iter().any(|t| {
                t.key == MARKS.taint_key
                    && t.effect == "NoExecute"
                    && t.value.as_deref() == Some("true")
            })
        });
    !(labelled && tainted)
}

/// Capacity (= allocatable) of the virtual node: the grant, with `pods` defaulted; the storage
/// part of the grant (`requests.storage`, `persistentvolumeclaims`) is a quota on claims in the
/// provider, not a node resource.
pub fn capacity(link: &ProviderLink) -> BTreeMap<String, String> {
    let mut cap: BTreeMap<String, String> = link
        .grant
        .iter()
        .filter(|(k, _)| !names::STORAGE_GRANT_KEYS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect();
    cap.entry("pods".into())
        .or_insert_with(|| DEFAULT_PODS.into());
    cap
}

/// Whether the provider answered, as the Ready condition shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Readiness {
    ready: bool,
    reason: String,
    message: String,
}

/// The tunnel's health as the NetworkUnavailable condition shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkHealth {
    pub unavailable: bool,
    pub reason: String,
    pub message: String,
}

/// What the virtual node's status last said, and since when each condition has said it.
struct Posted {
    readiness: Readiness,
    network: Option<NetworkHealth>,
    capacity: BTreeMap<String, String>,
    kubelet: Option<std::net::SocketAddr>,
    at: Instant,
    ready_since: String,
    network_since: String,
}

/// Runs the virtual node of `link`'s provider until the task is aborted.
pub async fn run(
    ctx: Ctx,
    mut link: LinkWatch,
    mut kubelet: tokio::sync::watch::Receiver<Option<std::net::SocketAddr>>,
) {
    // The probe period is the Peering's (`nodeHealth.probePeriod`): the ticks are made again
    // when it changes.
    let mut period = link.get().map_or(ctx.options.heartbeat, |l| l.probe_period);
    let (mut tick, mut tunnel_tick) = ticks(period);
    let started = Instant::now();
    let mut last_answer: Option<Instant> = None;
    let mut last_error = String::from("not probed yet");
    // What was last written, to write only changes (plus a periodic heartbeat).
    let mut applied: Option<Value> = None;
    // The node's type label or taint found removed (by its last status post).
    let mut marks_lost = false;
    // The node found deleted (by its last status post) while its Peering stays: made again.
    let mut deleted = false;
    let mut posted: Option<Posted> = None;
    let mut node_uid: Option<String> = None;
    // Where the gateway's status API is (None: no gateway to follow), from the last heartbeat.
    let mut gateway_lookup: Option<Option<Result<String, String>>> = None;
    // The tunnel report last written to the node's annotation.
    let mut annotated: Option<String> = None;
    loop {
        // `full`: probe the provider and renew the lease too; otherwise only the tunnel.
        let full = tokio::select! {
            _ = tick.tick() => true,
            _ = link.changed() => true,
            Ok(()) = kubelet.changed() => true,
            _ = tunnel_tick.tick() => false,
        };
        let kubelet_endpoint = *kubelet.borrow_and_update();
        let Some(l) = link.get() else { continue };
        if l.probe_period != period {
            period = l.probe_period;
            (tick, tunnel_tick) = ticks(period);
        }
        let nodes: Api<Node> = Api::all(ctx.client.clone());

        let desired = desired_node(&l);
        let changed = applied.as_ref() != Some(&desired);
        if changed || marks_lost {
            match nodes
                .patch(
                    &l.virtual_node,
                    &PatchParams::apply(names::FIELD_MANAGER).force(),
                    &Patch::Apply(&desired),
                )
                .await
            {
                Ok(node) => {
                    // Made again after a deletion (seen by a status post, or by a new UID): unless
                    // unpeering began meanwhile (it deletes the node, perhaps before this apply),
                    // in which case it goes again.
                    let made_again = std::mem::take(&mut deleted)
                        || (node_uid.is_some() && node.metadata.uid != node_uid);
                    if made_again && peering_live(&ctx, &l.provider_id).await == Some(false) {
                        let gone = nodes
                            .delete(
                                &l.virtual_node,
                                &kube::api::DeleteParams {
                                    preconditions: Some(kube::api::Preconditions {
                                        uid: node.metadata.uid.clone(),
                                        resource_version: None,
                                    }),
                                    ..Default::default()
                                },
                            )
                            .await;
                        if let Err(e) = client::ok_if_not_found(gone) {
                            tracing::warn!(node = %l.virtual_node, "removing the virtual node made again as its Peering went: {e}");
                        }
                        // Not applied again: the task stops with the link.
                        applied = Some(desired);
                        continue;
                    }
                    node_uid = node.metadata.uid;
                    applied = Some(desired);
                    marks_lost = false;
                    // Only a new node (or a changed one, or one made again) needs its status and
                    // annotation again: marks put back leave the status alone, Ready since the
                    // same time.
                    if changed || made_again {
                        posted = None;
                        annotated = None;
                    }
                }
                Err(e) => {
                    tracing::warn!(node = %l.virtual_node, "applying virtual node: {e}");
                    continue;
                }
            }
        }

        if full {
            match probe(&l, probe_timeout(period)).await {
                Ok(()) => last_answer = Some(Instant::now()),
                Err(e) => last_error = crate::error::chain(&e),
            }
        }
        let since = last_answer.unwrap_or(started);
        let readiness = if last_answer.is_some_and(|t| t.elapsed() < l.not_ready_after) {
            Readiness {
                ready: true,
                reason: "ProviderReachable".into(),
                message: format!("provider {} answers", l.provider_id),
            }
        } else if last_answer.is_none() && started.elapsed() < l.not_ready_after {
            Readiness {
                ready: false,
                reason: "ProviderNotProbed".into(),
                message: format!(
                    "waiting for provider {} to answer: {last_error}",
                    l.provider_id
                ),
            }
        } else {
            Readiness {
                ready: false,
                reason: REASON_UNREACHABLE.into(),
                message: format!(
                    "provider {} at {} has not answered for {}s: {last_error}",
                    l.provider_id,
                    endpoint(&ctx, &l).await,
                    since.elapsed().as_secs()
                ),
            }
        };

        // The gateway the Peering names, else the fabric's own (when the cluster builds it):
        // looked up on the heartbeat, reused in between (only the report is read then).
        if full || gateway_lookup.is_none() {
            gateway_lookup = Some(match &l.gateway_status {
                Some(addr) => Some(Ok(addr.clone())),
                None => crate::fabric::gateway::status_address(&ctx, &l.provider_id)
                    .await
                    .transpose()
                    .map(|r| r.map_err(|e| crate::error::chain(&e))),
            });
        }
        let gateway = gateway_lookup.clone().flatten();
        let mut report: Option<GatewayReport> = None;
        let network = match gateway {
            Some(Ok(addr)) => {
                let state = gateway_state(&addr, probe_timeout(period)).await;
                report = state.as_ref().ok().cloned();
                Some(network_health(&l.provider_id, &addr, state))
            }
            Some(Err(reason)) => Some(network_health(
                &l.provider_id,
                "(none)",
                Err(ProbeError::NoGateway(reason)),
            )),
            None => None,
        };

        let cap = capacity(&l);
        let due = match &posted {
            Some(p) => {
                p.readiness.ready != readiness.ready
                    || p.readiness.reason != readiness.reason
                    || p.network.as_ref().map(|n| (n.unavailable, &n.reason))
                        != network.as_ref().map(|n| (n.unavailable, &n.reason))
                    || p.capacity != cap
                    || p.kubelet != kubelet_endpoint
                    || p.at.elapsed() >= STATUS_REFRESH
            }
            None => true,
        };
        if due {
            let now = now();
            let ready_since = match &posted {
                Some(p) if p.readiness.ready == readiness.ready => p.ready_since.clone(),
                _ => now.clone(),
            };
            let network_since = match (&posted, &network) {
                (Some(p), Some(n))
                    if p.network.as_ref().map(|o| o.unavailable) == Some(n.unavailable) =>
                {
                    p.network_since.clone()
                }
                _ => now.clone(),
            };
            let mut conditions = vec![json!({"type": "Ready",
                "status": if readiness.ready { "True" } else { "False" },
                "reason": readiness.reason, "message": readiness.message,
                "lastHeartbeatTime": now, "lastTransitionTime": ready_since})];
            if let Some(n) = &network {
                conditions.push(json!({"type": "NetworkUnavailable",
                    "status": if n.unavailable { "True" } else { "False" },
                    "reason": n.reason, "message": n.message,
                    "lastHeartbeatTime": now, "lastTransitionTime": network_since}));
            }
            let mut status = json!({"status": {
                "capacity": cap, "allocatable": cap,
                "conditions": conditions,
                "nodeInfo": {"kubeletVersion": concat!("tandem-", env!("CARGO_PKG_VERSION")),
                    "operatingSystem": "linux", "architecture": "amd64",
                    "containerRuntimeVersion": "tandem://shadowpod", "kernelVersion": "",
                    "osImage": "", "kubeProxyVersion": "", "machineID": "", "systemUUID": "",
                    "bootID": ""},
            }});
            // Where the API server reaches the virtual kubelet (logs, exec), as a kubelet's
            // node says it: InternalIP and the kubelet endpoint's port.
            if let Some(addr) = kubelet_endpoint {
                status["status"]["addresses"] = json!([
                    {"type": "InternalIP", "address": addr.ip().to_string()},
                    {"type": "Hostname", "address": l.virtual_node},
                ]);
                status["status"]["daemonEndpoints"] =
                    json!({"kubeletEndpoint": {"Port": addr.port()}});
            }
            match nodes
                .patch_status(
                    &l.virtual_node,
                    &PatchParams::default(),
                    &Patch::Merge(&status),
                )
                .await
            {
                Ok(node) => {
                    // The type label or the taint removed by hand (the virtual kubelets find
                    // their node by the label, and the taint keeps pods that do not tolerate
                    // it off the provider): applied again on the next pass.
                    if lost_marks(&node) && !marks_lost {
                        tracing::warn!(node = %l.virtual_node, "the virtual node lost its type label or taint; applying them again");
                        marks_lost = true;
                    }
                    // The tunnel's figures for `tandem status`, with the status they go with.
                    let tunnel = report.as_ref().map(|r| json!(r).to_string());
                    if tunnel != annotated {
                        let patch = json!({"metadata": {"annotations": {
                            names::TUNNEL_ANNOTATION: tunnel}}});
                        match nodes
                            .patch(
                                &l.virtual_node,
                                &PatchParams::default(),
                                &Patch::Merge(&patch),
                            )
                            .await
                        {
                            Ok(_) => annotated = tunnel,
                            Err(e) => {
                                tracing::warn!(node = %l.virtual_node, "annotating the tunnel's report: {e}")
                            }
                        }
                    }
                    posted = Some(Posted {
                        readiness,
                        network,
                        capacity: cap,
                        kubelet: kubelet_endpoint,
                        at: Instant::now(),
                        ready_since,
                        network_since,
                    })
                }
                // Deleted by hand (`kubectl delete node`): registered again on the next pass,
                // as virtual-kubelet's node controller does, unless its Peering is going
                // (unpeering deletes the node first).
                Err(e) if client::is_not_found(&e) => {
                    if peering_live(&ctx, &l.provider_id).await == Some(true) {
                        tracing::warn!(node = %l.virtual_node, "the virtual node was deleted while its Peering stays; registering it again");
                        applied = None;
                        deleted = true;
                    }
                }
                Err(e) => {
                    tracing::warn!(node = %l.virtual_node, "posting virtual node status: {e}")
                }
            }
        }

        if !full {
            continue;
        }
        if let Err(e) = renew_lease(&ctx, &l.virtual_node, node_uid.as_deref()).await {
            tracing::warn!(node = %l.virtual_node, "renewing virtual node lease: {e}");
        }
    }
}

/// Whether a Peering with `provider` is there and not being deleted, read from the API server,
/// not a cache: it decides whether a deleted virtual node is made again, and whether one made
/// again stays. Listed, as a Peering need not be named after its provider; asked only when the
/// node was found gone or made again. None when the list failed: a gone node is then not made
/// again yet (the next status post asks again), and one made again is kept (unpeering deletes
/// the node once more after its provider-side steps).
async fn peering_live(ctx: &Ctx, provider: &str) -> Option<bool> {
    match Api::<Peering>::all(ctx.client.clone())
        .list(&kube::api::ListParams::default())
        .await
    {
        Ok(list) => Some(
            list.items
                .iter()
                .any(|p| p.spec.cluster_id == provider && p.metadata.deletion_timestamp.is_none()),
        ),
        Err(e) => {
            tracing::warn!(%provider, "reading the Peerings: {e}");
            None
        }
    }
}

/// What the gateway's `/status` says of the tunnel (see `tandem_netspec::GatewayStatus`).
#[derive(Clone, Debug, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayReport {
    /// `connected`, `connecting` or `error`.
    pub state: String,
    #[serde(default)]
    pub rtt_ms: Option<f64>,
    /// Bytes received and sent through the tunnel since the gateway started.
    #[serde(default)]
    pub rx_bytes: u64,
    #[serde(default)]
    pub tx_bytes: u64,
}

/// Reads the gateway's status API at `addr` (`host:port`, `GET /status`). One plain HTTP/1.1
/// request per heartbeat over hyper's client connection: the status API is unencrypted and
/// local, so there is nothing for a pooled client to add.
pub(crate) async fn gateway_state(
    addr: &str,
    timeout: Duration,
) -> Result<GatewayReport, ProbeError> {
    use http_body_util::BodyExt;
    let fetch = async {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(ProbeError::Connect)?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(ProbeError::Http)?;
        tokio::spawn(conn);
        let request = http::Request::get("/status")
            .header(http::header::HOST, addr)
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .map_err(ProbeError::Request)?;
        let response = sender
            .send_request(request)
            .await
            .map_err(ProbeError::Http)?;
        if !response.status().is_success() {
            return Err(ProbeError::Status(response.status()));
        }
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(ProbeError::Http)?
            .to_bytes();
        serde_json::from_slice(&body).map_err(ProbeError::Decode)
    };
    tokio::time::timeout(timeout, fetch)
        .await
        .map_err(|_| ProbeError::Timeout(timeout))?
}

/// Why a peer (its API server or its gateway's status API) gave no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("connecting")]
    Connect(#[source] std::io::Error),
    #[error("HTTP")]
    Http(#[source] hyper::Error),
    #[error("building the request")]
    Request(#[source] http::Error),
    #[error("GET /status answered {0}")]
    Status(http::StatusCode),
    /// The cluster builds the fabric, but its gateway to the provider is not running.
    #[error("{0}")]
    NoGateway(String),
    #[error("reading GET /status")]
    Decode(#[source] serde_json::Error),
    #[error("no answer within {}s", .0.as_secs())]
    Timeout(Duration),
    #[error("no answer")]
    Kube(#[source] kube::Error),
}

/// The NetworkUnavailable condition of `provider`'s virtual node from its gateway's report.
pub fn network_health(
    provider: &str,
    addr: &str,
    report: Result<GatewayReport, ProbeError>,
) -> NetworkHealth {
    let (unavailable, reason, message) = match report {
        Ok(r) if r.state == "connected" => (
            false,
            "TunnelConnected",
            match r.rtt_ms {
                Some(rtt) => format!("tunnel to provider {provider} connected, RTT {rtt:.1} ms"),
                None => format!("tunnel to provider {provider} connected"),
            },
        ),
        Ok(r) if r.state == "connecting" => (
            true,
            "TunnelConnecting",
            format!(
                "tunnel to provider {provider} not connected yet (gateway status at {addr}); \
                 check the gateway's peer endpoint and public key"
            ),
        ),
        Ok(r) => (
            true,
            "TunnelDown",
            format!(
                "tunnel to provider {provider} is {}: its probes go unanswered (gateway status \
                 at {addr}); check that the provider's gateway is running and reachable over UDP",
                r.state
            ),
        ),
        Err(ProbeError::NoGateway(why)) => (
            true,
            "GatewayNotRunning",
            format!("the gateway to provider {provider} is not running: {why}"),
        ),
        Err(e) => (
            true,
            "GatewayUnreachable",
            format!(
                "the gateway to provider {provider} does not report its tunnel: status API at \
                 {addr}: {}; check that `tandem gateway` runs with statusListen = \"{addr}\"",
                crate::error::chain(&e)
            ),
        ),
    };
    NetworkHealth {
        unavailable,
        reason: reason.into(),
        message,
    }
}

fn probe_timeout(period: Duration) -> Duration {
    period.max(Duration::from_secs(2))
}

/// The heartbeat (probe the provider, renew the Lease) every `period`, and the tunnel poll.
/// The gateway's report is local and cheap to read: it is read more often than the provider
/// is probed, so that NetworkUnavailable follows a lost tunnel within about a second of the
/// gateway noticing (its probes time out in 1.5 s).
fn ticks(period: Duration) -> (tokio::time::Interval, tokio::time::Interval) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut tunnel_tick = tokio::time::interval(TUNNEL_POLL.min(period));
    tunnel_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    (tick, tunnel_tick)
}

/// The provider answers (any HTTP answer counts, even 403/404: the API server is up).
async fn probe(link: &ProviderLink, timeout: Duration) -> Result<(), ProbeError> {
    let tenants: Api<Tenant> = Api::namespaced(link.client.clone(), &link.remote_tenant_namespace);
    match tokio::time::timeout(timeout, tenants.get_opt(&link.consumer_id)).await {
        Ok(Ok(_)) | Ok(Err(kube::Error::Api(_))) => Ok(()),
        Ok(Err(e)) => Err(ProbeError::Kube(e)),
        Err(_) => Err(ProbeError::Timeout(timeout)),
    }
}

/// The provider's API endpoint as the Peering records it (for messages).
async fn endpoint(ctx: &Ctx, link: &ProviderLink) -> String {
    let peerings: Api<Peering> = Api::all(ctx.client.clone());
    match peerings.get_opt(&link.provider_id).await {
        Ok(Some(p)) => p.spec.endpoint,
        _ => "its API endpoint".into(),
    }
}

async fn renew_lease(ctx: &Ctx, node: &str, node_uid: Option<&str>) -> Result<(), kube::Error> {
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), LEASE_NAMESPACE);
    let now = micro_now();
    let mut patch = json!({"spec": {"holderIdentity": node, "renewTime": now}});
    // Owned by the node as it is now: a node made again (deleted by hand) has a new UID, and a
    // lease still naming the old one would be collected as an orphan.
    if let Some(uid) = node_uid {
        patch["metadata"] = json!({"ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}]});
    }
    match leases
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if client::is_not_found(&e) => {
            let lease: Lease = serde_json::from_value(json!({
                "metadata": {"name": node, "namespace": LEASE_NAMESPACE,
                    "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY},
                    "ownerReferences": node_uid.map(|uid| vec![json!({
                        "apiVersion": "v1", "kind": "Node", "name": node, "uid": uid})])},
                "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": now},
            }))
            .map_err(kube::Error::SerdeError)?;
            match leases.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(()),
                Err(e) if client::is_conflict(&e) => Ok(()),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn micro_now() -> Value {
    serde_json::to_value(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    ))
    .unwrap_or(Value::Null)
}
