//! The provider's check of what a consumer's peer identity writes in its twin namespaces
//! besides ShadowPods — Services, EndpointSlices and PersistentVolumeClaims — served as the
//! validating webhook `peer-writes.tandem.dev` by the controller's webhook server (see
//! `consumer::webhook`, which serves it with the pod-placement webhook and rotates both
//! configurations' CA together). The rules are `tandem_core::peer_writes`; this module reads
//! what they need: the namespace's owner, the consumer's Tenant, the ranges granted to it and
//! its claims in all of its twins.
//!
//! RBAC alone cannot say any of this (it grants verbs on resources, not field values), and a
//! per-namespace ResourceQuota cannot sum a consumer's storage over several namespaces: the
//! webhook adds up the claims of every twin the consumer has here. Two claims admitted at the
//! same time in two twins would each miss the other until stored, so the checks of one
//! consumer run one at a time and each admitted claim counts until it is seen stored (or for
//! 30 s: `plan::PENDING_FOR`). Each twin's ResourceQuota stays as the per-namespace bound.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde_json::Value;
use tandem_api::{NetworkParameters, Tenant, names};
use tandem_core::peer_writes::StorageUse;

use crate::context::Ctx;
use crate::rbac::CONSUMER_NETWORK_PARAMETERS;

mod plan;

pub use plan::configuration;
use plan::{Observed, PeerWrite, PendingClaim, Step};
pub use tandem_api::names::PEER_WRITES_WEBHOOK as WEBHOOK_CONFIGURATION;
/// Path of the webhook on the controller's webhook server.
pub const PATH: &str = "/validate-peer-writes";

/// Claims admitted but maybe not stored yet, per (provider, consumer): this process may run
/// several lab providers.
type Pending = HashMap<(String, String), Arc<tokio::sync::Mutex<Vec<PendingClaim>>>>;

fn pending_of(provider: &str, consumer: &str) -> Arc<tokio::sync::Mutex<Vec<PendingClaim>>> {
    static PENDING: Mutex<Option<Pending>> = Mutex::new(None);
    let mut all = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    all.get_or_insert_with(HashMap::new)
        .entry((provider.to_string(), consumer.to_string()))
        .or_default()
        .clone()
}

/// Answers one AdmissionReview (its raw body): the `response` object.
pub async fn review(ctx: &Ctx, body: &[u8]) -> Value {
    let review: Value = serde_json::from_slice(body).unwrap_or_default();
    let request = &review["request"];
    let uid = &request["uid"];
    let Some(write) = plan::peer_write(request) else {
        return plan::allowed(uid);
    };
    match check(ctx, &write).await {
        Ok(verdict) => {
            if let Err(refusal) = &verdict {
                let PeerWrite {
                    consumer,
                    namespace,
                    kind,
                    name,
                    ..
                } = write;
                tracing::info!(%consumer, %namespace, %kind, %name, %refusal, "peer write refused");
            }
            plan::answer(uid, &write, &verdict)
        }
        // Failing closed: what could not be checked is not let through.
        Err(e) => plan::unchecked(uid, &write, &e),
    }
}

/// The verdict on one write; Err when what it needs could not be read. Reads what the plan
/// asks for, one at a time, until it decides.
async fn check(ctx: &Ctx, write: &PeerWrite<'_>) -> Result<Result<(), plan::Refused>, kube::Error> {
    let client = &ctx.client;
    let mut seen = Observed::default();
    // The consumer's pending claims, held from the listing of its claims to the verdict: two
    // claims checked at once would each miss the other.
    let mut pending: Option<tokio::sync::OwnedMutexGuard<Vec<PendingClaim>>> = None;
    loop {
        match plan::next(write, &seen) {
            Err(refused) => return Ok(Err(refused)),
            Ok(Step::Admit) => {
                if let Some(pending) = pending.as_mut() {
                    pending.push(plan::pending_claim(write, Instant::now()));
                }
                return Ok(Ok(()));
            }
            Ok(Step::ReadNamespace) => {
                let ns = Api::<Namespace>::all(client.clone())
                    .get(write.namespace)
                    .await?;
                seen.namespace = Some(ns);
            }
            Ok(Step::ListTenants) => {
                let tenant_ns = names::tenant_namespace(write.consumer);
                let tenants = Api::<Tenant>::namespaced(client.clone(), &tenant_ns)
                    .list(&ListParams::default())
                    .await?;
                seen.tenants = Some(tenants.items);
            }
            Ok(Step::ReadGrantedRanges) => {
                let tenant_ns = names::tenant_namespace(write.consumer);
                let theirs = Api::<NetworkParameters>::namespaced(client.clone(), &tenant_ns)
                    .get_opt(CONSUMER_NETWORK_PARAMETERS)
                    .await?;
                seen.ranges = Some(plan::granted_ranges(theirs));
            }
            Ok(Step::ListTwinPods) => {
                let pods = Api::<Pod>::namespaced(client.clone(), write.namespace)
                    .list(&ListParams::default())
                    .await?;
                seen.own_pods = Some(plan::own_pod_addresses(&pods.items));
            }
            Ok(Step::ListStorageClasses) => {
                let classes = Api::<StorageClass>::all(client.clone())
                    .list(&ListParams::default())
                    .await?;
                seen.default_classes = Some(plan::default_storage_classes(&classes.items));
            }
            Ok(Step::ListClaims) => {
                let mut held = pending_of(&ctx.identity.cluster_id, write.consumer)
                    .lock_owned()
                    .await;
                let stored = claims_of(client, write.consumer).await?;
                seen.used = Some(plan::claims_in_use(
                    &stored,
                    &mut held,
                    write.namespace,
                    write.name,
                    Instant::now(),
                ));
                pending = Some(held);
            }
        }
    }
}

/// Every claim in the consumer's twin namespaces here, by (namespace, name).
async fn claims_of(
    client: &Client,
    consumer: &str,
) -> Result<BTreeMap<(String, String), StorageUse>, kube::Error> {
    let twins: BTreeSet<String> = Api::<Namespace>::all(client.clone())
        .list(&ListParams::default().labels(&format!(
            "{},{}={consumer}",
            names::TWIN_NAMESPACE_LABEL,
            names::ORIGIN_CLUSTER_LABEL
        )))
        .await?
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    let claims = Api::<PersistentVolumeClaim>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    Ok(plan::claims_of(&twins, &claims.items))
}
