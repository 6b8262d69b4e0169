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
//! [`PENDING_FOR`]). Each twin's ResourceQuota stays as the per-namespace bound.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ipnet::IpNet;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tandem_api::{NetworkParameters, Tenant, names};
use tandem_core::peer_writes::{self, StorageGrant, StorageUse};
use tandem_core::pod_admission::Refusal;

use crate::context::Ctx;
use crate::rbac::CONSUMER_NETWORK_PARAMETERS;

pub use tandem_api::names::PEER_WRITES_WEBHOOK as WEBHOOK_CONFIGURATION;
/// Path of the webhook on the controller's webhook server.
pub const PATH: &str = "/validate-peer-writes";
/// How long an admitted claim counts against its consumer's grant while not yet listed.
const PENDING_FOR: Duration = Duration::from_secs(30);

/// The ValidatingWebhookConfiguration calling [`PATH`] through `client_config`: writes to
/// Services, EndpointSlices and claims in twin namespaces. Only peer identities' writes are
/// checked (`matchConditions`, where the API server supports them; the webhook also lets
/// anyone else through itself). Failing closed: an unchecked peer write is the hole this
/// closes, and the provider's admin's own writes in twins are rare.
pub fn configuration(client_config: Value) -> ValidatingWebhookConfiguration {
    serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK_CONFIGURATION,
                     "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY}},
        "webhooks": [{
            "name": "peer-writes.tandem.dev",
            "clientConfig": client_config,
            "rules": [
                {"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
                 "resources": ["services", "persistentvolumeclaims"]},
                {"operations": ["CREATE", "UPDATE"], "apiGroups": ["discovery.k8s.io"],
                 "apiVersions": ["v1"], "resources": ["endpointslices"]},
            ],
            "namespaceSelector": {"matchExpressions": [
                {"key": names::TWIN_NAMESPACE_LABEL, "operator": "Exists"}]},
            "matchConditions": [{"name": "peer-identities-only",
                "expression": format!("request.userInfo.username.startsWith('{}')", names::peer_user(""))}],
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 10,
        }],
    }))
    .expect("static manifest")
}

/// Claims admitted but maybe not stored yet, per (provider, consumer): this process may run
/// several lab providers.
type Pending = HashMap<(String, String), Arc<tokio::sync::Mutex<Vec<PendingClaim>>>>;

struct PendingClaim {
    namespace: String,
    name: String,
    usage: StorageUse,
    admitted: Instant,
}

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
    let uid = request["uid"].clone();
    let allowed = json!({"uid": uid, "allowed": true});
    let Some(consumer) = request["userInfo"]["username"]
        .as_str()
        .and_then(|u| u.strip_prefix(&names::peer_user("")))
    else {
        return allowed;
    };
    let object = &request["object"];
    let old = Some(&request["oldObject"]).filter(|o| o.is_object());
    let namespace = request["namespace"].as_str().unwrap_or_default();
    let kind = request["kind"]["kind"].as_str().unwrap_or_default();
    let name = request["name"]
        .as_str()
        .or(object["metadata"]["name"].as_str())
        .unwrap_or_default();
    match check(ctx, consumer, namespace, kind, name, object, old).await {
        Ok(Ok(())) => allowed,
        Ok(Err(refusal)) => {
            tracing::info!(%consumer, %namespace, %kind, %name, %refusal, "peer write refused");
            json!({"uid": uid, "allowed": false, "status": {
                "code": 403, "reason": "Forbidden",
                "message": format!("{kind} {namespace}/{name} of consumer {consumer}: {refusal}"),
            }})
        }
        // Failing closed: what could not be checked is not let through.
        Err(e) => json!({"uid": uid, "allowed": false, "status": {
            "code": 500,
            "message": format!("checking {kind} {namespace}/{name} of consumer {consumer}: {e}"),
        }}),
    }
}

/// The verdict on one write; Err when what it needs could not be read.
async fn check(
    ctx: &Ctx,
    consumer: &str,
    namespace: &str,
    kind: &str,
    name: &str,
    object: &Value,
    old: Option<&Value>,
) -> Result<Result<(), Refusal>, kube::Error> {
    let client = &ctx.client;
    let ns = Api::<Namespace>::all(client.clone()).get(namespace).await?;
    let labels = ns.labels();
    if !labels.contains_key(names::TWIN_NAMESPACE_LABEL)
        || labels.get(names::ORIGIN_CLUSTER_LABEL).map(String::as_str) != Some(consumer)
    {
        return Ok(Err(Refusal {
            rule: "twin-namespaces",
            detail: format!("namespace {namespace} is not a twin namespace of consumer {consumer}"),
            pod_security: None,
        }));
    }
    let tenant_ns = names::tenant_namespace(consumer);
    let tenant = Api::<Tenant>::namespaced(client.clone(), &tenant_ns)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .find(|t| t.spec.cluster_id == consumer && t.metadata.deletion_timestamp.is_none());
    let Some(tenant) = tenant else {
        return Ok(Err(Refusal {
            rule: "tenant",
            detail: format!("consumer {consumer} has no Tenant in {tenant_ns}"),
            pod_security: None,
        }));
    };
    Ok(match kind {
        "Service" => {
            let allowed: Vec<String> = tenant
                .spec
                .allowed_service_types
                .iter()
                .flatten()
                .map(|t| t.as_str().to_string())
                .collect();
            peer_writes::check_service(object, &allowed)
        }
        "EndpointSlice" => {
            let ranges = granted_ranges(client, &tenant_ns).await?;
            let outside = |ip: &IpAddr| !ranges.iter().any(|r| r.contains(ip));
            let addresses: Vec<IpAddr> = object["endpoints"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|e| e["addresses"].as_array().into_iter().flatten())
                .filter_map(|a| a.as_str()?.parse().ok())
                .collect();
            // The twin's pods are read only when an address needs them.
            let own = if addresses.iter().any(outside) {
                own_pod_addresses(client, namespace).await?
            } else {
                BTreeSet::new()
            };
            peer_writes::check_endpoint_slice(object, &ranges, &own)
        }
        "PersistentVolumeClaim" => {
            let mut classes = tenant.spec.storage_classes.clone().unwrap_or_default();
            // The API server's DefaultStorageClass admission names the default class on a
            // claim that names none before this check sees it: that one is always offered.
            if object["spec"]["storageClassName"]
                .as_str()
                .is_some_and(|c| !c.is_empty() && !classes.iter().any(|o| o == c))
            {
                classes.extend(default_storage_classes(client).await?);
            }
            let grant =
                StorageGrant::from_grant(tenant.spec.grant.iter().map(|(k, v)| (k, v.0.as_str())));
            let pending = pending_of(&ctx.identity.cluster_id, consumer);
            let mut pending = pending.lock().await;
            let stored = claims_of(client, consumer).await?;
            pending.retain(|p| {
                p.admitted.elapsed() < PENDING_FOR
                    && !stored.contains_key(&(p.namespace.clone(), p.name.clone()))
                    && !(p.namespace == namespace && p.name == name)
            });
            let used = stored
                .iter()
                .filter(|((ns, n), _)| !(ns == namespace && n == name))
                .map(|(_, u)| *u)
                .chain(pending.iter().map(|p| p.usage))
                .fold(StorageUse::default(), |a, b| a + b);
            let verdict = peer_writes::check_claim(object, old, &classes, grant, used);
            if verdict.is_ok() {
                pending.push(PendingClaim {
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                    usage: StorageUse::of_claim(object),
                    admitted: Instant::now(),
                });
            }
            verdict
        }
        _ => Ok(()),
    })
}

/// The consumer's pod and external ranges as this cluster granted them (the status of its
/// NetworkParameters, which only this cluster writes); none before the fabric negotiated them.
async fn granted_ranges(client: &Client, tenant_ns: &str) -> Result<Vec<IpNet>, kube::Error> {
    let theirs = Api::<NetworkParameters>::namespaced(client.clone(), tenant_ns)
        .get_opt(CONSUMER_NETWORK_PARAMETERS)
        .await?;
    let status = theirs.and_then(|p| p.status).unwrap_or_default();
    Ok([status.remapped_pod_cidr, status.remapped_external_cidr]
        .into_iter()
        .flatten()
        .filter_map(|r| r.parse().ok())
        .collect())
}

/// Addresses of the real pods of ShadowPods in `twin` (made by this cluster's controller,
/// owned by their ShadowPod).
async fn own_pod_addresses(client: &Client, twin: &str) -> Result<BTreeSet<IpAddr>, kube::Error> {
    let pods = Api::<Pod>::namespaced(client.clone(), twin)
        .list(&ListParams::default())
        .await?;
    Ok(pods
        .items
        .iter()
        .filter(|p| p.owner_references().iter().any(|o| o.kind == "ShadowPod"))
        .filter_map(|p| p.status.as_ref())
        .flat_map(|s| {
            s.pod_ips
                .iter()
                .flatten()
                .map(|ip| ip.ip.clone())
                .chain(s.pod_ip.clone())
                .collect::<Vec<_>>()
        })
        .filter_map(|ip| ip.parse().ok())
        .collect())
}

/// The StorageClasses marked as this cluster's default.
async fn default_storage_classes(client: &Client) -> Result<Vec<String>, kube::Error> {
    Ok(Api::<StorageClass>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|c| {
            c.annotations()
                .get("storageclass.kubernetes.io/is-default-class")
                .is_some_and(|v| v == "true")
        })
        .map(ResourceExt::name_any)
        .collect())
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
    Ok(claims
        .items
        .iter()
        .filter(|c| c.namespace().is_some_and(|ns| twins.contains(&ns)))
        .map(|c| {
            let value = serde_json::to_value(c).unwrap_or_default();
            (
                (c.namespace().unwrap_or_default(), c.name_any()),
                StorageUse::of_claim(&value),
            )
        })
        .collect())
}
