//! The virtual node standing for one provider: a Node whose capacity is the provider's grant,
//! labelled and tainted so only offloaded pods land on it, with a Lease renewed every heartbeat
//! and a Ready condition that follows whether the provider's API answers.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tandem_api::{Peering, Tenant, names};
use tandem_core::offloading::VirtualNodeMarks;
use tokio::time::Instant;

use crate::consumer::link::{LinkWatch, ProviderLink};
use crate::context::Ctx;

/// Namespace of node Leases.
const LEASE_NAMESPACE: &str = "kube-node-lease";
/// Pods a virtual node admits when the grant does not say.
const DEFAULT_PODS: &str = "110";
/// How often the Ready condition's heartbeat time is refreshed when nothing changes.
const STATUS_REFRESH: Duration = Duration::from_secs(10);
/// What marks a node as virtual (label and NoExecute taint, as `desired_node` sets them), for
/// the placement rules that keep pods on or off virtual nodes.
pub const MARKS: VirtualNodeMarks<'static> = VirtualNodeMarks {
    type_label: names::NODE_TYPE_LABEL,
    type_value: names::VIRTUAL_NODE_TYPE,
    taint_key: names::VIRTUAL_NODE_TAINT,
};

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

/// Capacity (= allocatable) of the virtual node: the grant, with `pods` defaulted.
pub fn capacity(link: &ProviderLink) -> BTreeMap<String, String> {
    let mut cap: BTreeMap<String, String> = link
        .grant
        .iter()
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

/// Runs the virtual node of `link`'s provider until the task is aborted.
pub async fn run(ctx: Ctx, mut link: LinkWatch) {
    let mut tick = tokio::time::interval(ctx.options.heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let started = Instant::now();
    let mut last_answer: Option<Instant> = None;
    let mut last_error = String::from("not probed yet");
    // What was last written, to write only changes (plus a periodic heartbeat).
    let mut applied: Option<Value> = None;
    let mut posted: Option<(Readiness, BTreeMap<String, String>, Instant, String)> = None;
    let mut node_uid: Option<String> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = link.changed() => {}
        }
        let Some(l) = link.get() else { continue };
        let nodes: Api<Node> = Api::all(ctx.client.clone());

        let desired = desired_node(&l);
        if applied.as_ref() != Some(&desired) {
            match nodes
                .patch(
                    &l.virtual_node,
                    &PatchParams::apply(names::FIELD_MANAGER).force(),
                    &Patch::Apply(&desired),
                )
                .await
            {
                Ok(node) => {
                    node_uid = node.metadata.uid;
                    applied = Some(desired);
                    posted = None;
                }
                Err(e) => {
                    tracing::warn!(node = %l.virtual_node, "applying virtual node: {e}");
                    continue;
                }
            }
        }

        match probe(&l, probe_timeout(&ctx)).await {
            Ok(()) => last_answer = Some(Instant::now()),
            Err(e) => last_error = e,
        }
        let since = last_answer.unwrap_or(started);
        let readiness = if last_answer.is_some_and(|t| t.elapsed() < ctx.options.provider_grace) {
            Readiness {
                ready: true,
                reason: "ProviderReachable".into(),
                message: format!("provider {} answers", l.provider_id),
            }
        } else if last_answer.is_none() && started.elapsed() < ctx.options.provider_grace {
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

        let cap = capacity(&l);
        let due = match &posted {
            Some((r, c, at, _)) => {
                r.ready != readiness.ready
                    || r.reason != readiness.reason
                    || *c != cap
                    || at.elapsed() >= STATUS_REFRESH
            }
            None => true,
        };
        if due {
            let now = now();
            let transition = match &posted {
                Some((r, _, _, t)) if r.ready == readiness.ready => t.clone(),
                _ => now.clone(),
            };
            let status = json!({"status": {
                "capacity": cap, "allocatable": cap,
                "conditions": [{"type": "Ready", "status": if readiness.ready { "True" } else { "False" },
                    "reason": readiness.reason, "message": readiness.message,
                    "lastHeartbeatTime": now, "lastTransitionTime": transition}],
                "nodeInfo": {"kubeletVersion": concat!("tandem-", env!("CARGO_PKG_VERSION")),
                    "operatingSystem": "linux", "architecture": "amd64",
                    "containerRuntimeVersion": "tandem://shadowpod", "kernelVersion": "",
                    "osImage": "", "kubeProxyVersion": "", "machineID": "", "systemUUID": "",
                    "bootID": ""},
            }});
            match nodes
                .patch_status(
                    &l.virtual_node,
                    &PatchParams::default(),
                    &Patch::Merge(&status),
                )
                .await
            {
                Ok(_) => posted = Some((readiness, cap, Instant::now(), transition)),
                Err(e) => {
                    tracing::warn!(node = %l.virtual_node, "posting virtual node status: {e}")
                }
            }
        }

        if let Err(e) = renew_lease(&ctx, &l.virtual_node, node_uid.as_deref()).await {
            tracing::warn!(node = %l.virtual_node, "renewing virtual node lease: {e}");
        }
    }
}

fn probe_timeout(ctx: &Ctx) -> Duration {
    ctx.options.heartbeat.max(Duration::from_secs(2))
}

/// The provider answers (any HTTP answer counts, even 403/404: the API server is up).
async fn probe(link: &ProviderLink, timeout: Duration) -> Result<(), String> {
    let tenants: Api<Tenant> = Api::namespaced(link.client.clone(), &link.remote_tenant_namespace);
    match tokio::time::timeout(timeout, tenants.get_opt(&link.consumer_id)).await {
        Ok(Ok(_)) | Ok(Err(kube::Error::Api(_))) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {}s", timeout.as_secs())),
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
    let patch = json!({"spec": {"holderIdentity": node, "renewTime": now}});
    match leases
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => {
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
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
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
