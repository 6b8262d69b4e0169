//! What reflection decides, from what it listed: pure.
//!
//! Which namespaces are reflected into a provider ([`twin_for`]) and how addresses translate
//! there ([`endpoint_view`]); what each source becomes in the twin namespace (`desired_*`);
//! what a sync of one [`Kind`] sends ([`Reflections`]: a [`Step`] per object, or why it is
//! left alone, [`Skip`]); and the Event a provider pod's Event comes back as
//! ([`reflected_event`]).

use std::collections::{BTreeMap, BTreeSet};

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use tandem_api::{NamespaceOffloading, names};
use tandem_core::offloading::{EndpointView, endpoint_address_there};

use crate::consumer::link::NetworkView;

/// Annotation on reflected objects: the source's resourceVersion they were made from.
pub const SOURCE_VERSION_ANNOTATION: &str = "tandem.dev/source-resource-version";
/// `endpointslice.kubernetes.io/managed-by` of reflected slices (the provider's EndpointSlice
/// controller leaves slices it does not manage alone).
pub const SLICE_MANAGER: &str = "reflection.tandem.dev";

/// What a reflected object is; the value of its `tandem.dev/reflected` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    ConfigMap,
    Secret,
    Service,
    EndpointSlice,
}

impl Kind {
    /// Every kind, in the order a full sync goes through them.
    pub(super) const ALL: [Kind; 4] = [
        Kind::ConfigMap,
        Kind::Secret,
        Kind::Service,
        Kind::EndpointSlice,
    ];
    /// The value of the `tandem.dev/reflected` label of its reflections.
    pub fn label(self) -> &'static str {
        match self {
            Kind::ConfigMap => "configmap",
            Kind::Secret => "secret",
            Kind::Service => "service",
            Kind::EndpointSlice => "endpointslice",
        }
    }
}

/// The twin namespace on `provider` of an offloading, if reflection should run for it.
pub(super) fn twin_for(o: &NamespaceOffloading, provider: &str) -> Option<(String, String)> {
    if o.name_any() != names::OFFLOADING_NAME || o.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let entry = o
        .status
        .as_ref()?
        .remote_namespaces
        .iter()
        .find(|r| r.cluster_id == provider && r.phase == "Ready")?;
    Some((o.namespace()?, entry.namespace.clone()))
}

/// How addresses translate into a provider, given the `local` pod CIDR (from the install
/// settings) and the negotiated `network`; with none, local addresses pass unchanged.
pub(super) fn endpoint_view(local: Option<IpNet>, network: Option<&NetworkView>) -> EndpointView {
    match network {
        Some(n) => EndpointView {
            local_pod_cidr: local,
            local_pod_cidr_there: n.local_pod_cidr_there.or(local),
            remote_pod_cidr_here: Some(n.remote_pod_cidr_here),
            remote_pod_cidr: Some(n.remote_pod_cidr),
        },
        None => EndpointView {
            local_pod_cidr: local,
            local_pod_cidr_there: local,
            remote_pod_cidr_here: None,
            remote_pod_cidr: None,
        },
    }
}

/// A request a sync sends into the twin namespace.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Step {
    /// Server-side apply `object` as reflection `name`: it is missing there, made from another
    /// version of its source (or context), or this sync rewrites every reflection.
    Apply { name: String, object: Value },
    /// Delete reflection `name`: its source is gone, or is no longer reflected.
    Delete { name: String },
}

/// Why a sync sends nothing for a source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Skip {
    /// The source is never reflected (`kube-root-ca.crt`, a service account token, a slice
    /// of FQDNs or of no Service).
    NotReflected,
    /// An object of that name (`name`) is in the twin namespace and was not created by Tandem:
    /// it is left alone, and said in the log.
    NotOurs { name: String },
    /// Its reflection was made from this very version (and context), and this sync is no
    /// rewrite.
    UpToDate,
}

/// One sync of one kind: the objects of that kind in the twin namespace, as listed, and the
/// sources found reflected so far. Sources go through [`Reflections::write`] one by one, then
/// [`Reflections::deletions`] says which reflections lost their source.
#[derive(Debug)]
pub(super) struct Reflections {
    kind: Kind,
    /// Every reflection is written again, even if made from the same version.
    rewrite: bool,
    /// name → (reflected by us, source version it was made from)
    there: BTreeMap<String, (bool, Option<String>)>,
    /// The sources that are reflected, by name.
    wanted: BTreeSet<String>,
}

impl Reflections {
    /// A sync of `kind`, the twin namespace holding `existing`.
    pub(super) fn new<K: Resource>(kind: Kind, existing: &[K], rewrite: bool) -> Self {
        let there = existing
            .iter()
            .map(|o| {
                let ours = o.labels().get(names::REFLECTED_LABEL).map(String::as_str)
                    == Some(kind.label());
                let version = o.annotations().get(SOURCE_VERSION_ANNOTATION).cloned();
                (o.name_any(), (ours, version))
            })
            .collect();
        Reflections {
            kind,
            rewrite,
            there,
            wanted: BTreeSet::new(),
        }
    }

    /// What to send for `source`, which would be reflected as `desired` (None: it is not
    /// reflected). `context` is whatever else the reflection depends on (the address view for
    /// slices): a change of it rewrites every reflection.
    pub(super) fn write<K: Resource>(
        &mut self,
        source: &K,
        desired: Option<Value>,
        context: &str,
    ) -> Result<Step, Skip> {
        let Some(mut object) = desired else {
            return Err(Skip::NotReflected);
        };
        let name = source.name_any();
        self.wanted.insert(name.clone());
        let version = source_version(&source.resource_version().unwrap_or_default(), context);
        match self.there.get(&name) {
            Some((false, _)) => return Err(Skip::NotOurs { name }),
            Some((true, Some(v))) if *v == version && !self.rewrite => return Err(Skip::UpToDate),
            _ => {}
        }
        let metadata = &mut object["metadata"];
        metadata["name"] = json!(name);
        metadata["labels"][names::REFLECTED_LABEL] = json!(self.kind.label());
        metadata["labels"][names::MANAGED_BY_LABEL] = json!(names::MANAGED_BY);
        metadata["annotations"][SOURCE_VERSION_ANNOTATION] = json!(version);
        Ok(Step::Apply { name, object })
    }

    /// The reflections whose source is gone or no longer reflected, once every source went
    /// through [`Reflections::write`]. Objects Tandem did not create are never deleted.
    pub(super) fn deletions(self) -> impl Iterator<Item = Step> {
        let wanted = self.wanted;
        self.there.into_iter().filter_map(move |(name, (ours, _))| {
            (ours && !wanted.contains(&name)).then_some(Step::Delete { name })
        })
    }
}

/// Removes the null fields of `v`, at every depth.
pub(super) fn strip_nulls(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(strip_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

/// Whether the provider's check of what peers write (`provider::peer_writes`, its validating
/// webhook) refused a write.
pub(super) fn refused_by_provider(e: &kube::core::Status) -> bool {
    e.code == 403 && e.message.contains("\"peer-writes.tandem.dev\"")
}

/// What the Event on a refused source says.
pub(super) fn refusal_message(e: &kube::core::Status) -> String {
    format!(
        "not reflected to the provider, which refuses it: {}",
        e.message
    )
}

/// What the source-version annotation records: the source's resourceVersion, and a digest of
/// the context when there is one.
pub(super) fn source_version(resource_version: &str, context: &str) -> String {
    if context.is_empty() {
        return resource_version.to_string();
    }
    use sha2::Digest;
    let digest = sha2::Sha256::digest(context.as_bytes());
    let short: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("{resource_version}-{short}")
}

/// The source's labels and annotations, minus what only means something locally.
fn copied_metadata<K: Resource>(source: &K) -> Value {
    let mut annotations = source.meta().annotations.clone().unwrap_or_default();
    annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    json!({"labels": source.meta().labels.clone().unwrap_or_default(), "annotations": annotations})
}

/// A ConfigMap as the provider should hold it; not the cluster's root CA bundle, which the
/// provider has its own of.
pub(super) fn desired_config_map(cm: &ConfigMap) -> Option<Value> {
    if cm.name_any() == "kube-root-ca.crt" {
        return None;
    }
    let mut v = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": copied_metadata(cm),
                       "data": cm.data, "binaryData": cm.binary_data});
    strip_nulls(&mut v);
    Some(v)
}

/// A Secret as the provider should hold it; not a service account token, which means
/// nothing there.
pub(super) fn desired_secret(s: &Secret) -> Option<Value> {
    if s.type_.as_deref() == Some("kubernetes.io/service-account-token") {
        return None;
    }
    let mut v = json!({"apiVersion": "v1", "kind": "Secret", "metadata": copied_metadata(s),
                       "type": s.type_, "data": s.data});
    strip_nulls(&mut v);
    Some(v)
}

/// A Service as the provider should hold it: no cluster IPs or node ports (the provider
/// allocates its own) and no selector, so the provider's endpoint controller leaves its
/// (reflected) EndpointSlices alone.
pub(super) fn desired_service(svc: &Service) -> Option<Value> {
    let spec = svc.spec.clone().unwrap_or_default();
    let type_ = match spec.type_.as_deref() {
        Some("ExternalName") => "ExternalName",
        _ => "ClusterIP",
    };
    let ports: Vec<Value> = spec
        .ports
        .unwrap_or_default()
        .into_iter()
        .map(|p| {
            json!({"name": p.name, "port": p.port, "targetPort": p.target_port,
                   "protocol": p.protocol, "appProtocol": p.app_protocol})
        })
        .collect();
    let mut v = json!({"apiVersion": "v1", "kind": "Service", "metadata": copied_metadata(svc),
        "spec": {"type": type_, "ports": ports, "externalName": spec.external_name,
                 "sessionAffinity": spec.session_affinity,
                 "publishNotReadyAddresses": spec.publish_not_ready_addresses}});
    strip_nulls(&mut v);
    Some(v)
}

/// An EndpointSlice with its addresses in the provider's view (see
/// [`endpoint_address_there`]); endpoints with no address left are dropped.
pub(super) fn desired_endpoint_slice(
    slice: &EndpointSlice,
    view: &EndpointView,
    virtual_node: &str,
) -> Option<Value> {
    if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
        return None;
    }
    let service = slice.labels().get("kubernetes.io/service-name")?.clone();
    let endpoints: Vec<Value> = slice
        .endpoints
        .iter()
        .filter_map(|ep| {
            let on_provider = ep.node_name.as_deref() == Some(virtual_node);
            let addresses: Vec<String> = ep
                .addresses
                .iter()
                .filter_map(|a| a.parse().ok())
                .filter_map(|a| endpoint_address_there(view, a, on_provider))
                .map(|a| a.to_string())
                .collect();
            (!addresses.is_empty()).then(
                || json!({"addresses": addresses, "conditions": ep.conditions, "zone": ep.zone}),
            )
        })
        .collect();
    let mut metadata = copied_metadata(slice);
    metadata["labels"]["endpointslice.kubernetes.io/managed-by"] = json!(SLICE_MANAGER);
    metadata["labels"]["kubernetes.io/service-name"] = json!(service);
    let mut v = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": metadata, "addressType": slice.address_type,
        "endpoints": endpoints, "ports": slice.ports});
    strip_nulls(&mut v);
    Some(v)
}

/// The pod a provider's Event is about, if it is about a pod (by name).
pub(super) fn event_pod(e: &CoreEvent) -> Option<&str> {
    if e.involved_object.kind.as_deref() != Some("Pod") {
        return None;
    }
    e.involved_object.name.as_deref()
}

/// Where a provider pod's Event comes back: the consumer's pod `pod_name` (UID `uid`) in
/// `namespace`, the Event named `name` there.
pub(super) struct EventTarget<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub pod_name: &'a str,
    pub uid: &'a str,
    pub provider: &'a str,
    pub virtual_node: &'a str,
}

/// Event `e` of a provider pod, as it is written onto the consumer's pod (server-side
/// applied).
pub(super) fn reflected_event(e: &CoreEvent, to: &EventTarget) -> Value {
    let mut event = json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": to.name, "namespace": to.namespace, "labels": {
            names::MANAGED_BY_LABEL: names::MANAGED_BY,
            names::REFLECTED_LABEL: "event",
            names::REMOTE_CLUSTER_LABEL: to.provider,
        }},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": to.pod_name,
                           "namespace": to.namespace, "uid": to.uid,
                           "fieldPath": e.involved_object.field_path},
        "reason": e.reason, "message": e.message, "type": e.type_,
        "count": e.count, "firstTimestamp": e.first_timestamp, "lastTimestamp": e.last_timestamp,
        "eventTime": e.event_time, "action": e.action,
        "reportingComponent": e.reporting_component.clone().unwrap_or_default(),
        "reportingInstance": to.provider,
        // `kubectl describe` shows only the component: it names the provider too.
        "source": {"component": format!("{}@{}",
                       e.source.as_ref().and_then(|s| s.component.as_deref()).unwrap_or("tandem"),
                       to.provider),
                   "host": to.virtual_node},
    });
    strip_nulls(&mut event);
    event
}

#[cfg(test)]
mod tests;
