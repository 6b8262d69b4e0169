//! What the peer-writes webhook decides, pure: from what it has read so far about one write of
//! a peer identity, the next read it needs ([`Step`]) or its verdict — admitted, or why not
//! ([`Refused`]) — and the AdmissionReview answer that says so. The rules themselves are
//! `tandem_core::peer_writes`; this module feeds them what the provider granted the consumer.
//!
//! The reads are asked for one at a time, each only when the verdict needs it: the twin's pods
//! only when an endpoint address lies outside the granted ranges, the StorageClasses only when
//! a claim names a class the Tenant does not offer.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;
use serde_json::{Value, json};
use tandem_api::{NetworkParameters, Tenant, names};
use tandem_core::peer_writes::{self, StorageGrant, StorageUse};
use tandem_core::pod_admission::Refusal;

/// How long an admitted claim counts against its consumer's grant while not yet listed.
pub(super) const PENDING_FOR: Duration = Duration::from_secs(30);

/// The ValidatingWebhookConfiguration calling `path` (the webhook's path on the controller's
/// webhook server) through `client_config`: writes to Services, EndpointSlices and claims in
/// twin namespaces. Only peer identities' writes are checked (`matchConditions`, where the API
/// server supports them; the webhook also lets anyone else through itself). Failing closed: an
/// unchecked peer write is the hole this closes, and the provider's admin's own writes in
/// twins are rare.
pub fn configuration(client_config: Value) -> ValidatingWebhookConfiguration {
    serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": names::PEER_WRITES_WEBHOOK,
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

/// One write of a consumer's peer identity, as its AdmissionReview request says it.
#[derive(Clone, Copy, Debug)]
pub(super) struct PeerWrite<'a> {
    pub consumer: &'a str,
    pub namespace: &'a str,
    pub kind: &'a str,
    pub name: &'a str,
    pub object: &'a Value,
    /// The stored object, on update.
    pub old: Option<&'a Value>,
}

/// The write an AdmissionReview `request` asks for; None when its author is no peer identity
/// (let through: only peers' writes are this webhook's to check).
pub(super) fn peer_write(request: &Value) -> Option<PeerWrite<'_>> {
    let consumer = request["userInfo"]["username"]
        .as_str()
        .and_then(|u| u.strip_prefix(names::peer_user("").as_str()))?;
    let object = &request["object"];
    Some(PeerWrite {
        consumer,
        namespace: request["namespace"].as_str().unwrap_or_default(),
        kind: request["kind"]["kind"].as_str().unwrap_or_default(),
        name: request["name"]
            .as_str()
            .or(object["metadata"]["name"].as_str())
            .unwrap_or_default(),
        object,
        old: Some(&request["oldObject"]).filter(|o| o.is_object()),
    })
}

/// What has been read for one write so far (None: not read yet).
#[derive(Clone, Debug, Default)]
pub(super) struct Observed {
    /// The namespace written in.
    pub namespace: Option<Namespace>,
    /// The Tenants of the consumer's tenant namespace.
    pub tenants: Option<Vec<Tenant>>,
    /// The consumer's ranges as this cluster granted them ([`granted_ranges`]).
    pub ranges: Option<Vec<IpNet>>,
    /// Addresses of the real pods of ShadowPods in the twin ([`own_pod_addresses`]).
    pub own_pods: Option<BTreeSet<IpAddr>>,
    /// The StorageClasses marked as this cluster's default ([`default_storage_classes`]).
    pub default_classes: Option<Vec<String>>,
    /// What the consumer's other claims use, stored or admitted ([`claims_in_use`]).
    pub used: Option<StorageUse>,
}

/// What the webhook does next for a write: a read its verdict needs, or let it through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// Read the namespace written in: its labels say whose twin it is.
    ReadNamespace,
    /// List the Tenants in the consumer's tenant namespace.
    ListTenants,
    /// Read the consumer's NetworkParameters, whose status holds the ranges granted to it.
    ReadGrantedRanges,
    /// List the pods of the twin: an endpoint address outside the ranges may be one of them.
    ListTwinPods,
    /// List the StorageClasses: a claim names a class the Tenant does not offer, which may be
    /// the default one.
    ListStorageClasses,
    /// Lock the consumer's pending claims and list its claims in every twin, to add up what
    /// they use.
    ListClaims,
    /// Let the write through (an admitted claim counts as pending until it is seen stored).
    Admit,
}

/// Why a peer's write is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Refused {
    /// The namespace is not a twin namespace of this consumer.
    NotTwin { namespace: String, consumer: String },
    /// The consumer has no live Tenant in its tenant namespace.
    NoTenant {
        consumer: String,
        tenant_namespace: String,
    },
    /// The Service breaks a rule of `tandem_core::peer_writes`.
    Service(Refusal),
    /// The EndpointSlice breaks a rule of `tandem_core::peer_writes`.
    EndpointSlice(Refusal),
    /// The claim breaks a rule of `tandem_core::peer_writes`.
    Claim(Refusal),
}

impl Refused {
    /// The refusal as the webhook says it (rule and detail).
    pub(super) fn refusal(&self) -> Refusal {
        let rule = |rule: &'static str, detail: String| Refusal {
            rule,
            detail,
            pod_security: None,
        };
        match self {
            Refused::NotTwin {
                namespace,
                consumer,
            } => rule(
                "twin-namespaces",
                format!("namespace {namespace} is not a twin namespace of consumer {consumer}"),
            ),
            Refused::NoTenant {
                consumer,
                tenant_namespace,
            } => rule(
                "tenant",
                format!("consumer {consumer} has no Tenant in {tenant_namespace}"),
            ),
            Refused::Service(r) | Refused::EndpointSlice(r) | Refused::Claim(r) => r.clone(),
        }
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.refusal().fmt(f)
    }
}

/// The next step for `write`, given what `seen` holds: a read, or the verdict.
pub(super) fn next(write: &PeerWrite<'_>, seen: &Observed) -> Result<Step, Refused> {
    let Some(ns) = &seen.namespace else {
        return Ok(Step::ReadNamespace);
    };
    let labels = ns.labels();
    if !labels.contains_key(names::TWIN_NAMESPACE_LABEL)
        || labels.get(names::ORIGIN_CLUSTER_LABEL).map(String::as_str) != Some(write.consumer)
    {
        return Err(Refused::NotTwin {
            namespace: write.namespace.to_string(),
            consumer: write.consumer.to_string(),
        });
    }
    let Some(tenants) = &seen.tenants else {
        return Ok(Step::ListTenants);
    };
    let Some(tenant) = tenants
        .iter()
        .find(|t| t.spec.cluster_id == write.consumer && t.metadata.deletion_timestamp.is_none())
    else {
        return Err(Refused::NoTenant {
            consumer: write.consumer.to_string(),
            tenant_namespace: names::tenant_namespace(write.consumer),
        });
    };
    let object = write.object;
    match write.kind {
        "Service" => {
            let allowed: Vec<String> = tenant
                .spec
                .allowed_service_types
                .iter()
                .flatten()
                .map(|t| t.as_str().to_string())
                .collect();
            peer_writes::check_service(object, &allowed).map_err(Refused::Service)?;
        }
        "EndpointSlice" => {
            let Some(ranges) = &seen.ranges else {
                return Ok(Step::ReadGrantedRanges);
            };
            let outside = |ip: &IpAddr| !ranges.iter().any(|r| r.contains(ip));
            let own = match &seen.own_pods {
                Some(own) => own,
                None if endpoint_addresses(object).iter().any(outside) => {
                    return Ok(Step::ListTwinPods);
                }
                None => &BTreeSet::new(),
            };
            peer_writes::check_endpoint_slice(object, ranges, own)
                .map_err(Refused::EndpointSlice)?;
        }
        "PersistentVolumeClaim" => {
            let mut classes = tenant.spec.storage_classes.clone().unwrap_or_default();
            // The API server's DefaultStorageClass admission names the default class on a
            // claim that names none before this check sees it: that one is always offered.
            if object["spec"]["storageClassName"]
                .as_str()
                .is_some_and(|c| !c.is_empty() && !classes.iter().any(|o| o == c))
            {
                let Some(defaults) = &seen.default_classes else {
                    return Ok(Step::ListStorageClasses);
                };
                classes.extend(defaults.iter().cloned());
            }
            let Some(used) = seen.used else {
                return Ok(Step::ListClaims);
            };
            let grant =
                StorageGrant::from_grant(tenant.spec.grant.iter().map(|(k, v)| (k, v.0.as_str())));
            peer_writes::check_claim(object, write.old, &classes, grant, used)
                .map_err(Refused::Claim)?;
        }
        _ => {}
    }
    Ok(Step::Admit)
}

/// The endpoint addresses of a slice that parse as IP addresses.
fn endpoint_addresses(slice: &Value) -> Vec<IpAddr> {
    slice["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|e| e["addresses"].as_array().into_iter().flatten())
        .filter_map(|a| a.as_str()?.parse().ok())
        .collect()
}

/// The answer to a write checked: allowed, or a 403 that says which rule refused it.
pub(super) fn answer(uid: &Value, write: &PeerWrite<'_>, verdict: &Result<(), Refused>) -> Value {
    let PeerWrite {
        consumer,
        namespace,
        kind,
        name,
        ..
    } = write;
    match verdict {
        Ok(()) => allowed(uid),
        Err(refused) => json!({"uid": uid, "allowed": false, "status": {
            "code": 403, "reason": "Forbidden",
            "message": format!("{kind} {namespace}/{name} of consumer {consumer}: {refused}"),
        }}),
    }
}

/// The answer to a write that could not be checked: refused (failing closed), with a 500.
pub(super) fn unchecked(
    uid: &Value,
    write: &PeerWrite<'_>,
    error: &dyn std::fmt::Display,
) -> Value {
    let PeerWrite {
        consumer,
        namespace,
        kind,
        name,
        ..
    } = write;
    json!({"uid": uid, "allowed": false, "status": {
        "code": 500,
        "message": format!("checking {kind} {namespace}/{name} of consumer {consumer}: {error}"),
    }})
}

/// The answer letting a write through.
pub(super) fn allowed(uid: &Value) -> Value {
    json!({"uid": uid, "allowed": true})
}

/// The consumer's pod and external ranges as this cluster granted them (the status of its
/// NetworkParameters, which only this cluster writes); none before the fabric negotiated them.
pub(super) fn granted_ranges(theirs: Option<NetworkParameters>) -> Vec<IpNet> {
    let status = theirs.and_then(|p| p.status).unwrap_or_default();
    [status.remapped_pod_cidr, status.remapped_external_cidr]
        .into_iter()
        .flatten()
        .filter_map(|r| r.parse().ok())
        .collect()
}

/// Addresses of the real pods of ShadowPods among `pods` (made by this cluster's controller,
/// owned by their ShadowPod).
pub(super) fn own_pod_addresses(pods: &[Pod]) -> BTreeSet<IpAddr> {
    pods.iter()
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
        .collect()
}

/// The StorageClasses marked as this cluster's default.
pub(super) fn default_storage_classes(classes: &[StorageClass]) -> Vec<String> {
    classes
        .iter()
        .filter(|c| {
            c.annotations()
                .get("storageclass.kubernetes.io/is-default-class")
                .is_some_and(|v| v == "true")
        })
        .map(ResourceExt::name_any)
        .collect()
}

/// What each claim in the `twins` (the consumer's twin namespaces) uses, by (namespace, name).
pub(super) fn claims_of(
    twins: &BTreeSet<String>,
    claims: &[PersistentVolumeClaim],
) -> BTreeMap<(String, String), StorageUse> {
    claims
        .iter()
        .filter(|c| c.namespace().is_some_and(|ns| twins.contains(&ns)))
        .map(|c| {
            let value = serde_json::to_value(c).unwrap_or_default();
            (
                (c.namespace().unwrap_or_default(), c.name_any()),
                StorageUse::of_claim(&value),
            )
        })
        .collect()
}

/// A claim admitted but maybe not stored yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct PendingClaim {
    pub namespace: String,
    pub name: String,
    pub usage: StorageUse,
    pub admitted: Instant,
}

/// The claim `write` admitted at `now`, counted until it is seen stored.
pub(super) fn pending_claim(write: &PeerWrite<'_>, now: Instant) -> PendingClaim {
    PendingClaim {
        namespace: write.namespace.to_string(),
        name: write.name.to_string(),
        usage: StorageUse::of_claim(write.object),
        admitted: now,
    }
}

/// What the consumer's claims other than `namespace/name` use at `now`: those `stored`, and
/// those admitted within [`PENDING_FOR`] and not stored yet. `pending` keeps only the latter
/// (and never the claim written now, which is counted again if admitted).
pub(super) fn claims_in_use(
    stored: &BTreeMap<(String, String), StorageUse>,
    pending: &mut Vec<PendingClaim>,
    namespace: &str,
    name: &str,
    now: Instant,
) -> StorageUse {
    pending.retain(|p| {
        now.saturating_duration_since(p.admitted) < PENDING_FOR
            && !stored.contains_key(&(p.namespace.clone(), p.name.clone()))
            && !(p.namespace == namespace && p.name == name)
    });
    stored
        .iter()
        .filter(|((ns, n), _)| !(ns == namespace && n == name))
        .map(|(_, u)| *u)
        .chain(pending.iter().map(|p| p.usage))
        .fold(StorageUse::default(), |a, b| a + b)
}

#[cfg(test)]
mod tests;
