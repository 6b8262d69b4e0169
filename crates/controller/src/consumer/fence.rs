//! Consumer side of fencing (NamespaceOffloading `partitionPolicy: Fence`), per provider: reads
//! the provider's fence nonce (Lease `tandem-fence-nonce` of our tenant namespace there) at
//! every probe, notes when it arrived (on
//! this process's monotonic clock), hands it back through our fence Lease there — and when no
//! new nonce has arrived for a pod's `fenceAfter` stretched for clock drift, plus the margin the
//! provider has to stop the pod, the pod is certainly stopped there: it is deleted here with
//! grace 0, so that its controller (ReplicaSet, StatefulSet) replaces it elsewhere.
//!
//! Nothing is confirmed while the provider answers (its controller may be down, its fence with
//! it: what it shows is then the truth), nor before this process has received a nonce: a
//! controller restarted during a partition cannot know when its predecessor last heard from
//! the provider, so its pods wait for the provider to come back (which then reports them
//! fenced).

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::{Client, ResourceExt};
use serde_json::json;
use tandem_api::{client, names};
use tandem_core::fence::{self, Receipt};

use crate::consumer::link::{LinkWatch, ProviderLink};
use crate::context::Ctx;

/// Runs the fence of `link`'s provider until the task is aborted.
pub async fn run(ctx: Ctx, mut link: LinkWatch) {
    let mut receipt = Receipt::default();
    let mut handed_back: Option<String> = None;
    // When the provider last answered (with a new nonce or not).
    let mut last_answer: Option<Instant> = None;
    loop {
        let Some(l) = link.get() else {
            link.changed().await;
            continue;
        };
        tokio::select! {
            _ = tokio::time::sleep(l.probe_period) => {}
            _ = link.changed() => continue,
        }
        if let Some(answer) = read_nonce(&l).await {
            last_answer = Some(Instant::now());
            if let Some(nonce) = answer {
                receipt.receive(&nonce, Instant::now());
            }
        }
        if let Some(nonce) = receipt.nonce()
            && handed_back.as_deref() != Some(nonce)
        {
            match hand_back(&l, nonce).await {
                Ok(()) => handed_back = Some(nonce.to_string()),
                Err(e) => {
                    tracing::debug!(provider = %l.provider_id, "handing back the fence nonce: {e}")
                }
            }
        }
        // A fresh receipt confirms nothing: the pods are only listed once it is older than the
        // least any pod waits.
        if receipt
            .age(Instant::now())
            .is_some_and(|age| age >= ctx.options.fence_margin)
            && let Err(e) = confirm_stopped(&ctx, &l, &receipt, last_answer).await
        {
            tracing::warn!(provider = %l.provider_id, "fencing: listing the pods on {}: {e}", l.virtual_node);
        }
    }
}

/// How long a read or write of a fence Lease may take: a partition that drops packets must not
/// hold the loop (the link's client waits up to 30 s).
fn io_timeout(link: &ProviderLink) -> Duration {
    link.probe_period.max(Duration::from_secs(2))
}

/// The provider's current nonce (None: it has none for us yet), if it answers.
async fn read_nonce(link: &ProviderLink) -> Option<Option<String>> {
    let leases: Api<Lease> = Api::namespaced(link.client.clone(), &link.remote_tenant_namespace);
    match tokio::time::timeout(io_timeout(link), leases.get_opt(names::FENCE_NONCE_LEASE)).await {
        Ok(Ok(l)) => {
            Some(l.and_then(|l| l.annotations().get(names::FENCE_NONCE_ANNOTATION).cloned()))
        }
        _ => None,
    }
}

/// Writes `nonce` into our fence Lease on the provider.
async fn hand_back(link: &ProviderLink, nonce: &str) -> Result<(), kube::Error> {
    let leases: Api<Lease> = Api::namespaced(link.client.clone(), &link.remote_tenant_namespace);
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    );
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": names::FENCE_LEASE,
                     "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY,
                                names::FENCE_LEASE_LABEL: "consumer"},
                     "annotations": {names::FENCE_NONCE_ANNOTATION: nonce}},
        "spec": {"holderIdentity": link.consumer_id, "renewTime": now},
    });
    let params = PatchParams::apply(names::FIELD_MANAGER).force();
    let patch = Patch::Apply(&lease);
    crate::requests::within(
        io_timeout(link),
        leases.patch(names::FENCE_LEASE, &params, &patch),
    )
    .await
    .map(|_| ())
}

/// Deletes (grace 0) the pods on the virtual node whose fence bound has passed since the newest
/// nonce arrived — and since the provider last answered at all: a provider that answers but
/// issues no nonce has no fence running (its controller is down), so nothing is confirmed
/// stopped there; its pods are shown as they are until it is back.
async fn confirm_stopped(
    ctx: &Ctx,
    link: &ProviderLink,
    receipt: &Receipt,
    last_answer: Option<Instant>,
) -> kube::Result<()> {
    let silent_for = |wait: Duration| {
        last_answer.is_none_or(|t| Instant::now().saturating_duration_since(t) >= wait)
    };
    if !silent_for(ctx.options.fence_margin) {
        return Ok(());
    }
    let pods: Api<Pod> = Api::all(ctx.client.clone());
    let on_node = ListParams::default().fields(&format!("spec.nodeName={}", link.virtual_node));
    for pod in pods.list(&on_node).await? {
        let Some(after) = pod
            .annotations()
            .get(names::FENCE_AFTER)
            .and_then(|d| fence::parse(d))
        else {
            continue;
        };
        if !receipt.confirms_stopped(after, ctx.options.fence_margin, Instant::now())
            || !silent_for(fence::consumer_wait(after, ctx.options.fence_margin))
        {
            continue;
        }
        let silent = receipt.age(Instant::now()).unwrap_or_default();
        delete_fenced(&ctx.client, link, &pod, after, silent).await;
    }
    Ok(())
}

async fn delete_fenced(
    client: &Client,
    link: &ProviderLink,
    pod: &Pod,
    after: Duration,
    silent: Duration,
) {
    let ns = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let grace0 = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match Api::<Pod>::namespaced(client.clone(), &ns)
        .delete(&name, &grace0)
        .await
    {
        Ok(_) => {}
        Err(e) if client::is_not_found(&e) || client::is_conflict(&e) => return,
        Err(e) => {
            tracing::warn!(pod = %format!("{ns}/{name}"), "fencing: deleting the pod: {e}");
            return;
        }
    }
    let message = format!(
        "provider {} has not been heard from for {}s: its fence (fenceAfter {}s) has stopped \
         the pod there; deleted here so that its controller replaces it",
        link.provider_id,
        silent.as_secs(),
        after.as_secs_f64()
    );
    tracing::warn!(pod = %format!("{ns}/{name}"), provider = %link.provider_id, "{message}");
    crate::events::record(
        client,
        &ns,
        json!({"apiVersion": "v1", "kind": "Pod", "namespace": ns, "name": name, "uid": pod.uid()}),
        "FenceConfirmed",
        &message,
        true,
    )
    .await;
}
