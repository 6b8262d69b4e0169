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
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use serde_json::json;
use tandem_api::{client, names};
use tandem_core::fence::Receipt;

use crate::consumer::link::{LinkWatch, ProviderLink};
use crate::context::Ctx;

mod plan;

use plan::Step;

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
        let answer = read_nonce(&l).await;
        plan::note_answer(&mut receipt, &mut last_answer, answer, Instant::now());
        if let Ok(Step::HandBack { nonce }) = plan::hand_back(&receipt, handed_back.as_deref()) {
            match hand_back(&l, &nonce).await {
                Ok(()) => handed_back = Some(nonce),
                Err(e) => {
                    tracing::debug!(provider = %l.provider_id, "handing back the fence nonce: {e}")
                }
            }
        }
        if let Ok(Step::ListPods) = plan::list_pods(
            &receipt,
            last_answer,
            ctx.options.fence_margin,
            Instant::now(),
        ) && let Err(e) = confirm_stopped(&ctx, &l, &receipt, last_answer).await
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
        Ok(Ok(l)) => Some(plan::nonce_of(l.as_ref())),
        _ => None,
    }
}

/// Writes `nonce` into our fence Lease on the provider.
async fn hand_back(link: &ProviderLink, nonce: &str) -> Result<(), kube::Error> {
    let leases: Api<Lease> = Api::namespaced(link.client.clone(), &link.remote_tenant_namespace);
    let lease = plan::fence_lease(
        &link.consumer_id,
        nonce,
        k8s_openapi::jiff::Timestamp::now(),
    );
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
/// nonce arrived — and since the provider last answered at all (see [`plan::pod`]).
async fn confirm_stopped(
    ctx: &Ctx,
    link: &ProviderLink,
    receipt: &Receipt,
    last_answer: Option<Instant>,
) -> kube::Result<()> {
    let pods: Api<Pod> = Api::all(ctx.client.clone());
    let on_node = ListParams::default().fields(&format!("spec.nodeName={}", link.virtual_node));
    for pod in pods.list(&on_node).await? {
        let decided = plan::pod(
            &pod,
            &link.provider_id,
            receipt,
            last_answer,
            ctx.options.fence_margin,
            Instant::now(),
        );
        if let Ok(Step::DeletePod {
            namespace,
            name,
            uid,
            message,
        }) = decided
        {
            delete_fenced(&ctx.client, link, &namespace, &name, uid, &message).await;
        }
    }
    Ok(())
}

async fn delete_fenced(
    client: &Client,
    link: &ProviderLink,
    ns: &str,
    name: &str,
    uid: Option<String>,
    message: &str,
) {
    let grace0 = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match Api::<Pod>::namespaced(client.clone(), ns)
        .delete(name, &grace0)
        .await
    {
        Ok(_) => {}
        Err(e) if client::is_not_found(&e) || client::is_conflict(&e) => return,
        Err(e) => {
            tracing::warn!(pod = %format!("{ns}/{name}"), "fencing: deleting the pod: {e}");
            return;
        }
    }
    tracing::warn!(pod = %format!("{ns}/{name}"), provider = %link.provider_id, "{message}");
    crate::events::record(
        client,
        ns,
        json!({"apiVersion": "v1", "kind": "Pod", "namespace": ns, "name": name, "uid": uid}),
        "FenceConfirmed",
        message,
        true,
    )
    .await;
}
