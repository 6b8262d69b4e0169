//! What the virtual node decides each pass, from what was observed: pure, with the clock passed
//! in.
//!
//! The node's metadata and spec ([`desired_node`]) and whether to apply them ([`apply`]), and
//! what follows an applied node ([`applied`]); whether it is Ready ([`Probes::readiness`], else
//! why [`NotReady`]) and what its Ready condition says ([`ready_condition`]); what
//! NetworkUnavailable says of the tunnel ([`network_health`], its reasons [`Tunnel`]); whether
//! its status is posted ([`status_due`], why [`Post`]) and what it says ([`node_status`]);
//! what follows a node found deleted ([`gone`]); and the Lease that heartbeats for it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};
use tandem_api::names;
use tokio::time::Instant;

use crate::node_marks::MARKS;
use crate::rbac::LEASE_NAMESPACE;

/// Pods a virtual node admits when the grant does not say.
const DEFAULT_PODS: &str = "110";
/// How often the Ready condition's heartbeat time is refreshed when nothing changes.
pub(super) const STATUS_REFRESH: Duration = Duration::from_secs(10);

/// Reason of Ready=False when the provider does not answer.
pub const REASON_UNREACHABLE: &str = "ProviderUnreachable";

/// The desired metadata and spec of virtual node `node` standing for `provider` (server-side
/// applied): the provider's suggested `labels` and the marks of a virtual node.
pub(super) fn desired_node(node: &str, provider: &str, labels: &BTreeMap<String, String>) -> Value {
    let mut labels = labels.clone();
    labels.insert(
        names::NODE_TYPE_LABEL.into(),
        names::VIRTUAL_NODE_TYPE.into(),
    );
    labels.insert(names::REMOTE_CLUSTER_LABEL.into(), provider.to_string());
    labels.insert("kubernetes.io/hostname".into(), node.to_string());
    labels.insert("kubernetes.io/os".into(), "linux".into());
    labels.insert(names::MANAGED_BY_LABEL.into(), names::MANAGED_BY.into());
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node, "labels": labels},
        "spec": {"taints": [{"key": names::VIRTUAL_NODE_TAINT, "value": "true", "effect": "NoExecute"}]},
    })
}

/// Whether `node` lost what marks it as virtual ([`MARKS`]: the type label and the NoExecute
/// taint). Only those: its other labels (a zone, say) are the admin's to override.
pub(super) fn lost_marks(node: &Node) -> bool {
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

/// Capacity (= allocatable) of the virtual node: the `grant`, with `pods` defaulted; the
/// storage part of the grant (`requests.storage`, `persistentvolumeclaims`) is a quota on
/// claims in the provider, not a node resource.
pub(super) fn capacity(grant: &BTreeMap<String, Quantity>) -> BTreeMap<String, String> {
    let mut cap: BTreeMap<String, String> = grant
        .iter()
        .filter(|(k, _)| !names::STORAGE_GRANT_KEYS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect();
    cap.entry("pods".into())
        .or_insert_with(|| DEFAULT_PODS.into());
    cap
}

/// Why the node's labels and taint are applied this pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Apply {
    /// Nothing applied yet by this task: the node is registered (or found as it is).
    Register,
    /// The node was found deleted by hand while its Peering stays: registered again.
    Reregister,
    /// What the node should carry changed (the provider's labels, say).
    Changed,
    /// The node lost its type label or taint: put back, its status left alone.
    RestoreMarks,
}

impl Apply {
    /// Whether the node the apply answered with (its UID `uid`) was made again: after a
    /// deletion seen by a status post, or under another UID than the one applied before.
    pub(super) fn made_again(self, known: Option<&str>, uid: Option<&str>) -> bool {
        self == Apply::Reregister || (known.is_some() && uid != known)
    }
}

/// Whether to apply the `desired` node, and why: what was last `applied`, whether the node was
/// found without its marks (`marks_lost`) or `deleted`. None: nothing to apply.
pub(super) fn apply(
    applied: Option<&Value>,
    desired: &Value,
    marks_lost: bool,
    deleted: bool,
) -> Option<Apply> {
    match applied {
        None if deleted => Some(Apply::Reregister),
        None => Some(Apply::Register),
        Some(a) if a != desired => Some(Apply::Changed),
        Some(_) if marks_lost => Some(Apply::RestoreMarks),
        Some(_) => None,
    }
}

/// What follows an applied node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Applied {
    /// The node stays; `repost`: its status and tunnel annotation are written anew (a new,
    /// changed or made-again node), else they are left alone (marks put back keep Ready since
    /// the same time).
    Kept { repost: bool },
    /// Made again while unpeering began (it deletes the node, perhaps before this apply): it
    /// goes again, and is not applied again (the task stops with the link).
    Remove,
}

/// What follows the node applied for `cause`, `made_again` or not, with its Peering live or not
/// (`peering_live`, asked only of a node made again; None when that could not be read: the
/// node is kept, unpeering deletes it once more after its provider-side steps).
pub(super) fn applied(cause: Apply, made_again: bool, peering_live: Option<bool>) -> Applied {
    if made_again && peering_live == Some(false) {
        return Applied::Remove;
    }
    Applied::Kept {
        repost: cause != Apply::RestoreMarks || made_again,
    }
}

/// What the probes of the provider's API found so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Probes {
    /// When the task started (the node is not NotReady before its bound passed once).
    pub started: Instant,
    /// When the provider last answered.
    pub last_answer: Option<Instant>,
    /// Why the last probe that failed did.
    pub last_error: String,
}

impl Probes {
    /// None yet, since `started`.
    pub(super) fn new(started: Instant) -> Self {
        Probes {
            started,
            last_answer: None,
            last_error: "not probed yet".into(),
        }
    }

    /// Whether the node is Ready at `now`: the provider answered within `not_ready_after`.
    pub(super) fn readiness(
        &self,
        not_ready_after: Duration,
        now: Instant,
    ) -> Result<(), NotReady> {
        let age = |t: Instant| now.saturating_duration_since(t);
        match self.last_answer {
            Some(t) if age(t) < not_ready_after => Ok(()),
            None if age(self.started) < not_ready_after => Err(NotReady::NotProbed),
            last => Err(NotReady::Unreachable {
                silent: age(last.unwrap_or(self.started)),
            }),
        }
    }
}

/// Why the virtual node is not Ready (the Ready condition's reason).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum NotReady {
    /// The provider has not answered yet, and the task started less than `notReadyAfter` ago.
    NotProbed,
    /// The provider has not answered for `silent` (since its last answer, or since the task
    /// started), at least `notReadyAfter`.
    Unreachable { silent: Duration },
}

/// The Ready condition, as `kubectl describe node` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ReadyCondition {
    pub ready: bool,
    pub reason: &'static str,
    pub message: String,
}

/// The Ready condition of `provider`'s node from its `readiness`; `endpoint` (the provider's
/// API endpoint the Peering records) is read only for [`NotReady::Unreachable`].
pub(super) fn ready_condition(
    provider: &str,
    readiness: Result<(), NotReady>,
    last_error: &str,
    endpoint: &str,
) -> ReadyCondition {
    match readiness {
        Ok(()) => ReadyCondition {
            ready: true,
            reason: "ProviderReachable",
            message: format!("provider {provider} answers"),
        },
        Err(NotReady::NotProbed) => ReadyCondition {
            ready: false,
            reason: "ProviderNotProbed",
            message: format!("waiting for provider {provider} to answer: {last_error}"),
        },
        Err(NotReady::Unreachable { silent }) => ReadyCondition {
            ready: false,
            reason: REASON_UNREACHABLE,
            message: format!(
                "provider {provider} at {endpoint} has not answered for {}s: {last_error}",
                silent.as_secs()
            ),
        },
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

/// The reason of the NetworkUnavailable condition: the tunnel as the gateway reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tunnel {
    /// Connected (NetworkUnavailable=False).
    Connected,
    /// Not connected yet.
    Connecting,
    /// Its probes go unanswered (any other state the gateway reports).
    Down,
    /// The cluster builds the fabric, but its gateway to the provider is not running.
    GatewayNotRunning,
    /// The gateway's status API gives no usable answer.
    GatewayUnreachable,
}

impl Tunnel {
    /// The condition's reason.
    pub fn as_str(self) -> &'static str {
        match self {
            Tunnel::Connected => "TunnelConnected",
            Tunnel::Connecting => "TunnelConnecting",
            Tunnel::Down => "TunnelDown",
            Tunnel::GatewayNotRunning => "GatewayNotRunning",
            Tunnel::GatewayUnreachable => "GatewayUnreachable",
        }
    }
}

/// The tunnel's health as the NetworkUnavailable condition shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkHealth {
    pub unavailable: bool,
    pub reason: Tunnel,
    pub message: String,
}

/// The NetworkUnavailable condition of `provider`'s virtual node from its gateway's report.
pub fn network_health(
    provider: &str,
    addr: &str,
    report: Result<GatewayReport, ProbeError>,
) -> NetworkHealth {
    let (reason, message) = match report {
        Ok(r) if r.state == "connected" => (
            Tunnel::Connected,
            match r.rtt_ms {
                Some(rtt) => format!("tunnel to provider {provider} connected, RTT {rtt:.1} ms"),
                None => format!("tunnel to provider {provider} connected"),
            },
        ),
        Ok(r) if r.state == "connecting" => (
            Tunnel::Connecting,
            format!(
                "tunnel to provider {provider} not connected yet (gateway status at {addr}); \
                 check the gateway's peer endpoint and public key"
            ),
        ),
        Ok(r) => (
            Tunnel::Down,
            format!(
                "tunnel to provider {provider} is {}: its probes go unanswered (gateway status \
                 at {addr}); check that the provider's gateway is running and reachable over UDP",
                r.state
            ),
        ),
        Err(ProbeError::NoGateway(why)) => (
            Tunnel::GatewayNotRunning,
            format!("the gateway to provider {provider} is not running: {why}"),
        ),
        Err(e) => (
            Tunnel::GatewayUnreachable,
            format!(
                "the gateway to provider {provider} does not report its tunnel: status API at \
                 {addr}: {}; check that `tandem gateway` runs with statusListen = \"{addr}\"",
                crate::error::chain(&e)
            ),
        ),
    };
    NetworkHealth {
        unavailable: reason != Tunnel::Connected,
        reason,
        message,
    }
}

/// What the node's status shows this pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Shown {
    pub ready: ReadyCondition,
    /// None: no gateway to follow, no NetworkUnavailable condition.
    pub network: Option<NetworkHealth>,
    pub capacity: BTreeMap<String, String>,
    /// Where the API server reaches the virtual kubelet (logs, exec).
    pub kubelet: Option<SocketAddr>,
}

/// Since when each condition has said what it says (`lastTransitionTime`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Since {
    pub ready: String,
    pub network: String,
}

/// What the node's status last said, since when, and when it was posted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Posted {
    pub shown: Shown,
    pub since: Since,
    pub at: Instant,
}

/// Why the node's status is posted this pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Post {
    /// Nothing posted yet to this node (new, changed or made again).
    First,
    /// Ready turned, or its reason changed.
    Readiness,
    /// NetworkUnavailable turned, changed reason, appeared or went.
    Network,
    /// The grant changed.
    Capacity,
    /// The virtual kubelet's endpoint changed.
    KubeletEndpoint,
    /// Nothing changed for [`STATUS_REFRESH`]: the heartbeat times are refreshed.
    Heartbeat,
}

/// Whether to post `shown` at `now`, after what was last `posted`, and why. A message alone
/// (the seconds a provider has been silent) waits for the heartbeat.
pub(super) fn status_due(posted: Option<&Posted>, shown: &Shown, now: Instant) -> Option<Post> {
    let Some(p) = posted else {
        return Some(Post::First);
    };
    let network = |n: &Option<NetworkHealth>| n.as_ref().map(|n| (n.unavailable, n.reason));
    if (p.shown.ready.ready, p.shown.ready.reason) != (shown.ready.ready, shown.ready.reason) {
        Some(Post::Readiness)
    } else if network(&p.shown.network) != network(&shown.network) {
        Some(Post::Network)
    } else if p.shown.capacity != shown.capacity {
        Some(Post::Capacity)
    } else if p.shown.kubelet != shown.kubelet {
        Some(Post::KubeletEndpoint)
    } else if now.saturating_duration_since(p.at) >= STATUS_REFRESH {
        Some(Post::Heartbeat)
    } else {
        None
    }
}

/// The status patch of virtual node `node` showing `shown` at `now`, and since when each
/// condition says it: kept from what was last `posted` while the condition's status holds.
pub(super) fn node_status(
    shown: &Shown,
    posted: Option<&Posted>,
    node: &str,
    now: Timestamp,
) -> (Value, Since) {
    let now = now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let ready_since = match posted {
        Some(p) if p.shown.ready.ready == shown.ready.ready => p.since.ready.clone(),
        _ => now.clone(),
    };
    let network_since = match (posted, &shown.network) {
        (Some(p), Some(n))
            if p.shown.network.as_ref().map(|o| o.unavailable) == Some(n.unavailable) =>
        {
            p.since.network.clone()
        }
        _ => now.clone(),
    };
    let ready = &shown.ready;
    let mut conditions = vec![json!({"type": "Ready",
        "status": if ready.ready { "True" } else { "False" },
        "reason": ready.reason, "message": ready.message,
        "lastHeartbeatTime": now, "lastTransitionTime": ready_since})];
    if let Some(n) = &shown.network {
        conditions.push(json!({"type": "NetworkUnavailable",
            "status": if n.unavailable { "True" } else { "False" },
            "reason": n.reason.as_str(), "message": n.message,
            "lastHeartbeatTime": now, "lastTransitionTime": network_since}));
    }
    let cap = &shown.capacity;
    let mut status = json!({"status": {
        "capacity": cap, "allocatable": cap,
        "conditions": conditions,
        "nodeInfo": {"kubeletVersion": concat!("tandem-", env!("CARGO_PKG_VERSION")),
            "operatingSystem": "linux", "architecture": "amd64",
            "containerRuntimeVersion": "tandem://shadowpod", "kernelVersion": "",
            "osImage": "", "kubeProxyVersion": "", "machineID": "", "systemUUID": "",
            "bootID": ""},
    }});
    // Where the API server reaches the virtual kubelet (logs, exec), as a kubelet's node says
    // it: InternalIP and the kubelet endpoint's port.
    if let Some(addr) = shown.kubelet {
        status["status"]["addresses"] = json!([
            {"type": "InternalIP", "address": addr.ip().to_string()},
            {"type": "Hostname", "address": node},
        ]);
        status["status"]["daemonEndpoints"] = json!({"kubeletEndpoint": {"Port": addr.port()}});
    }
    (
        status,
        Since {
            ready: ready_since,
            network: network_since,
        },
    )
}

/// What follows a status post that found no node (deleted by hand, `kubectl delete node`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Gone {
    /// Its Peering stays: registered again on the next pass, as virtual-kubelet's node
    /// controller does.
    Reregister,
    /// Its Peering is going (unpeering deletes the node first): left gone.
    Unpeering,
    /// The Peerings could not be read: not made again yet, the next post asks again.
    AskAgain,
}

/// What follows a node found gone, with its Peering live or not (`peering_live`, None when
/// the Peerings could not be read).
pub(super) fn gone(peering_live: Option<bool>) -> Gone {
    match peering_live {
        Some(true) => Gone::Reregister,
        Some(false) => Gone::Unpeering,
        None => Gone::AskAgain,
    }
}

/// The value of the node's tunnel annotation: the gateway's report, when there is one.
pub(super) fn tunnel_annotation(report: Option<&GatewayReport>) -> Option<String> {
    report.map(|r| json!(r).to_string())
}

/// A `renewTime` of `now`.
fn micro_time(now: Timestamp) -> Value {
    serde_json::to_value(MicroTime(now)).unwrap_or(Value::Null)
}

/// The owner reference of the Lease: the node as it is now (its UID `uid`).
fn lease_owner(node: &str, uid: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid})
}

/// The merge patch renewing `node`'s Lease at `now`, owned by the node as it is now: a node
/// made again (deleted by hand) has a new UID, and a lease still naming the old one would be
/// collected as an orphan.
pub(super) fn lease_renewal(node: &str, uid: Option<&str>, now: Timestamp) -> Value {
    let mut patch = json!({"spec": {"holderIdentity": node, "renewTime": micro_time(now)}});
    if let Some(uid) = uid {
        patch["metadata"] = json!({"ownerReferences": [lease_owner(node, uid)]});
    }
    patch
}

/// `node`'s Lease, made at `now` when there is none.
pub(super) fn new_lease(node: &str, uid: Option<&str>, now: Timestamp) -> Value {
    json!({
        "metadata": {"name": node, "namespace": LEASE_NAMESPACE,
            "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY},
            "ownerReferences": uid.map(|uid| vec![lease_owner(node, uid)])},
        "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": micro_time(now)},
    })
}

#[cfg(test)]
mod tests;
