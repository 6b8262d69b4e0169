//! The virtual node standing for one provider: a Node whose capacity is the provider's grant,
//! labelled and tainted so only offloaded pods land on it, with a Lease renewed every heartbeat
//! and a Ready condition that follows whether the provider's API answers.
//!
//! Each pass observes (the link, the kubelet endpoint, a probe of the provider, the gateway's
//! tunnel report), asks [`plan`] what to write (pure, the clock passed in), and writes it: the
//! node's labels and taint, its status, the tunnel annotation, the Lease.

mod plan;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tandem_api::client;
use tandem_api::{Peering, Tenant, names};
use tokio::time::Instant;

use crate::consumer::link::{LinkWatch, ProviderLink};
use crate::context::Ctx;
pub use crate::node_marks::MARKS;
use crate::rbac::LEASE_NAMESPACE;
use plan::{Applied, Gone, NotReady, Posted, Probes, Shown};
pub use plan::{
    GatewayReport, NetworkHealth, ProbeError, REASON_UNREACHABLE, Tunnel, network_health,
};

/// How often the gateway's tunnel report is read between heartbeats.
const TUNNEL_POLL: Duration = Duration::from_secs(1);

/// The desired metadata and spec of the virtual node (server-side applied).
pub fn desired_node(link: &ProviderLink) -> Value {
    plan::desired_node(&link.virtual_node, &link.provider_id, &link.node_labels)
}

/// Capacity (= allocatable) of the virtual node: the grant, with `pods` defaulted; the storage
/// part of the grant (`requests.storage`, `persistentvolumeclaims`) is a quota on claims in the
/// provider, not a node resource.
pub fn capacity(link: &ProviderLink) -> BTreeMap<String, String> {
    plan::capacity(&link.grant)
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
    let mut probes = Probes::new(Instant::now());
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
        if let Some(cause) = plan::apply(applied.as_ref(), &desired, marks_lost, deleted) {
            match nodes
                .patch(
                    &l.virtual_node,
                    &PatchParams::apply(names::FIELD_MANAGER).force(),
                    &Patch::Apply(&desired),
                )
                .await
            {
                Ok(node) => {
                    deleted = false;
                    // Made again after a deletion (seen by a status post, or by a new UID): the
                    // Peering is asked whether unpeering began meanwhile.
                    let made_again =
                        cause.made_again(node_uid.as_deref(), node.metadata.uid.as_deref());
                    let live = if made_again {
                        peering_live(&ctx, &l.provider_id).await
                    } else {
                        None
                    };
                    match plan::applied(cause, made_again, live) {
                        Applied::Remove => {
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
                        Applied::Kept { repost } => {
                            node_uid = node.metadata.uid;
                            applied = Some(desired);
                            marks_lost = false;
                            if repost {
                                posted = None;
                                annotated = None;
                            }
                        }
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
                Ok(()) => probes.last_answer = Some(Instant::now()),
                Err(e) => probes.last_error = crate::error::chain(&e),
            }
        }
        let readiness = probes.readiness(l.not_ready_after, Instant::now());
        // The provider's endpoint is read for the message only when it does not answer.
        let at = match readiness {
            Err(NotReady::Unreachable { .. }) => endpoint(&ctx, &l).await,
            _ => String::new(),
        };
        let ready = plan::ready_condition(&l.provider_id, readiness, &probes.last_error, &at);

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

        let shown = Shown {
            ready,
            network,
            capacity: capacity(&l),
            kubelet: kubelet_endpoint,
        };
        if plan::status_due(posted.as_ref(), &shown, Instant::now()).is_some() {
            let (status, since) =
                plan::node_status(&shown, posted.as_ref(), &l.virtual_node, Timestamp::now());
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
                    if plan::lost_marks(&node) && !marks_lost {
                        tracing::warn!(node = %l.virtual_node, "the virtual node lost its type label or taint; applying them again");
                        marks_lost = true;
                    }
                    // The tunnel's figures for `tandem status`, with the status they go with.
                    let tunnel = plan::tunnel_annotation(report.as_ref());
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
                        shown,
                        since,
                        at: Instant::now(),
                    })
                }
                // Deleted by hand (`kubectl delete node`): registered again on the next pass
                // unless its Peering is going.
                Err(e) if client::is_not_found(&e) => {
                    match plan::gone(peering_live(&ctx, &l.provider_id).await) {
                        Gone::Reregister => {
                            tracing::warn!(node = %l.virtual_node, "the virtual node was deleted while its Peering stays; registering it again");
                            applied = None;
                            deleted = true;
                        }
                        Gone::Unpeering | Gone::AskAgain => {}
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

/// Renews `node`'s Lease (owned by the node as it is now, its UID `node_uid`), made when
/// there is none.
async fn renew_lease(ctx: &Ctx, node: &str, node_uid: Option<&str>) -> Result<(), kube::Error> {
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), LEASE_NAMESPACE);
    let now = Timestamp::now();
    let patch = plan::lease_renewal(node, node_uid, now);
    match leases
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if client::is_not_found(&e) => {
            let lease: Lease = serde_json::from_value(plan::new_lease(node, node_uid, now))
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
