//! Reflection into one provider: for every namespace offloaded there (its NamespaceOffloading
//! lists the provider with a Ready twin namespace), the ConfigMaps, Secrets, Services and
//! EndpointSlices offloaded pods need are copied into the twin namespace, and the Events of the
//! provider's pods come back onto the consumer's pods of the same name.
//!
//! Level-based: every sync lists both sides and converges (create/update what differs, delete
//! reflected objects whose source is gone), so restarts leave no duplicates and no orphans.
//! Nothing is cached between syncs; watches only say which kind to resync, and a periodic
//! resync (30 s) rewrites every reflection, undoing edits made in the twin namespace.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Debug;
use std::time::Duration;

use futures::{FutureExt, StreamExt, stream::BoxStream};
use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tandem_api::client;
use tandem_api::{NamespaceOffloading, names};
use tandem_core::offloading::{EndpointView, endpoint_address_there};

use crate::consumer::link::LinkWatch;
use crate::consumer::link::ProviderLink;
use crate::context::Ctx;
use crate::error::{RequestError, request};
use crate::lean::PodStatusRef;

/// Annotation on reflected objects: the source's resourceVersion they were made from.
pub const SOURCE_VERSION_ANNOTATION: &str = "tandem.dev/source-resource-version";
/// Field manager of reflected objects.
const MANAGER: &str = "tandem-reflection";
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
    const ALL: [Kind; 4] = [
        Kind::ConfigMap,
        Kind::Secret,
        Kind::Service,
        Kind::EndpointSlice,
    ];
    pub fn label(self) -> &'static str {
        match self {
            Kind::ConfigMap => "configmap",
            Kind::Secret => "secret",
            Kind::Service => "service",
            Kind::EndpointSlice => "endpointslice",
        }
    }
}

/// Runs while the provider is linked: one reflector per namespace offloaded to it.
pub async fn run(ctx: Ctx, mut link: LinkWatch) {
    let api: Api<NamespaceOffloading> = Api::all(ctx.client.clone());
    let mut stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    // origin namespace → twin namespace, for this provider.
    let mut offloaded: BTreeMap<String, String> = BTreeMap::new();
    let mut initial: Option<BTreeMap<String, String>> = None;
    #[allow(clippy::type_complexity)]
    let mut running: BTreeMap<String, (String, EndpointView, tokio::task::JoinHandle<()>)> =
        BTreeMap::new();
    loop {
        tokio::select! {
            event = stream.next() => match event {
                // A (re)list: keep reflecting what is known until it is complete.
                Some(Ok(watcher::Event::Init)) => {
                    initial = Some(BTreeMap::new());
                    continue;
                }
                Some(Ok(watcher::Event::InitApply(o))) => {
                    if let (Some(map), Some((ns, twin))) = (initial.as_mut(), twin_for(&o, &link.provider_id)) {
                        map.insert(ns, twin);
                    }
                    continue;
                }
                Some(Ok(watcher::Event::InitDone)) => {
                    if let Some(map) = initial.take() {
                        offloaded = map;
                    }
                }
                Some(Ok(watcher::Event::Apply(o))) => {
                    let ns = o.namespace().unwrap_or_default();
                    match twin_for(&o, &link.provider_id) {
                        Some((ns, twin)) => { offloaded.insert(ns, twin); }
                        None if o.name_any() == names::OFFLOADING_NAME => { offloaded.remove(&ns); }
                        None => {}
                    }
                }
                Some(Ok(watcher::Event::Delete(o))) => {
                    if o.name_any() == names::OFFLOADING_NAME {
                        offloaded.remove(&o.namespace().unwrap_or_default());
                    }
                }
                Some(Err(e)) => {
                    tracing::warn!(provider = %link.provider_id, error = %e, "reflection: watching NamespaceOffloadings");
                    continue;
                }
                None => break,
            },
            _ = link.changed() => {}
        }
        let Some(current) = link.get() else { break };
        // A renegotiated network changes how slices translate: restart their reflectors.
        let view = endpoint_view(&ctx, &current).await;
        running.retain(|ns, (twin, v, handle)| {
            let keep = offloaded.get(ns) == Some(twin) && *v == view && !handle.is_finished();
            if !keep {
                handle.abort();
            }
            keep
        });
        for (ns, twin) in &offloaded {
            if running.contains_key(ns) {
                continue;
            }
            let reflector = NamespaceReflector {
                ctx: ctx.clone(),
                link: current.clone(),
                namespace: ns.clone(),
                twin: twin.clone(),
                view: view.clone(),
                pod_uids: HashMap::new(),
            };
            running.insert(
                ns.clone(),
                (twin.clone(), view.clone(), tokio::spawn(reflector.run())),
            );
        }
    }
    for (_, (_, _, handle)) in running {
        handle.abort();
    }
}

/// The twin namespace on `provider` of an offloading, if reflection should run for it.
fn twin_for(o: &NamespaceOffloading, provider: &str) -> Option<(String, String)> {
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

/// How addresses translate into `link`'s provider (the local pod CIDR from the install
/// settings; with no negotiated network, local addresses pass unchanged).
async fn endpoint_view(ctx: &Ctx, link: &ProviderLink) -> EndpointView {
    let local: Option<ipnet::IpNet> = ctx
        .settings()
        .await
        .ok()
        .and_then(|s| s.pod_cidr.parse().ok());
    match &link.network {
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

enum Trigger {
    Changed(Kind),
    RemoteEvent(Box<CoreEvent>),
}

/// Reflection of one namespace into its twin.
struct NamespaceReflector {
    ctx: Ctx,
    link: ProviderLink,
    namespace: String,
    twin: String,
    view: EndpointView,
    /// The consumer pod each provider pod's Events were reflected onto, by the provider pod's
    /// UID: a pod's later Events (a burst brings several per pod) need no read of the pod.
    /// Cleared when it reaches [`POD_UIDS_KEPT`].
    pod_uids: HashMap<String, String>,
}

/// Entries of [`NamespaceReflector::pod_uids`] kept at most.
const POD_UIDS_KEPT: usize = 4096;

fn kind_stream<K>(api: Api<K>, kind: Kind) -> BoxStream<'static, Trigger>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    watcher(api, watcher::Config::default())
        .default_backoff()
        .filter_map(move |e| async move {
            match e {
                Ok(watcher::Event::InitApply(_) | watcher::Event::Init) => None,
                Ok(_) => Some(Trigger::Changed(kind)),
                Err(_) => None,
            }
        })
        .boxed()
}

impl NamespaceReflector {
    async fn run(mut self) {
        let local = self.ctx.client.clone();
        let namespace = self.namespace.clone();
        let ns = namespace.as_str();
        let remote_events: Api<CoreEvent> = Api::namespaced(self.link.client.clone(), &self.twin);
        let events = watcher(remote_events, watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .filter_map(|e| async move { e.ok().map(|e| Trigger::RemoteEvent(Box::new(e))) })
            .boxed();
        let mut triggers = futures::stream::select_all([
            kind_stream(
                Api::<ConfigMap>::namespaced(local.clone(), ns),
                Kind::ConfigMap,
            ),
            kind_stream(Api::<Secret>::namespaced(local.clone(), ns), Kind::Secret),
            kind_stream(Api::<Service>::namespaced(local.clone(), ns), Kind::Service),
            kind_stream(
                Api::<EndpointSlice>::namespaced(local.clone(), ns),
                Kind::EndpointSlice,
            ),
            events,
        ]);
        tracing::info!(namespace = %ns, twin = %self.twin, provider = %self.link.provider_id, "reflecting");
        let mut dirty: BTreeSet<Kind> = Kind::ALL.into_iter().collect();
        // Periodic resyncs rewrite every reflection, undoing edits made in the twin namespace.
        let mut rewrite = false;
        let mut resync = tokio::time::interval(Duration::from_secs(30));
        resync.tick().await;
        loop {
            let mut failed = BTreeSet::new();
            for kind in std::mem::take(&mut dirty) {
                if let Err(e) = self.sync(kind, rewrite).await {
                    tracing::warn!(namespace = %ns, twin = %self.twin, provider = %self.link.provider_id, error = %crate::error::chain(&e), "reflecting {}s", kind.label());
                    failed.insert(kind);
                }
            }
            let must_retry = !failed.is_empty();
            let retry = async move {
                if !must_retry {
                    std::future::pending::<()>().await
                } else {
                    tokio::time::sleep(Duration::from_secs(1)).await
                }
            };
            dirty = failed;
            rewrite = false;
            let first = tokio::select! {
                t = triggers.next() => match t { Some(t) => Some(t), None => return },
                _ = resync.tick() => { dirty.extend(Kind::ALL); rewrite = true; None }
                _ = retry => None,
            };
            // Coalesce a burst of changes into one sync per kind.
            let mut batch: Vec<Trigger> = first.into_iter().collect();
            while let Some(Some(t)) = triggers.next().now_or_never() {
                batch.push(t);
            }
            for t in batch {
                match t {
                    Trigger::Changed(kind) => {
                        dirty.insert(kind);
                    }
                    Trigger::RemoteEvent(e) => {
                        if let Err(err) = self.reflect_event(&e).await {
                            tracing::debug!(namespace = %ns, error = %crate::error::chain(&err), "reflecting an Event back");
                        }
                    }
                }
            }
        }
    }

    async fn sync(&self, kind: Kind, rewrite: bool) -> Result<(), RequestError> {
        let local = self.ctx.client.clone();
        let remote = self.link.client.clone();
        let (ns, twin) = (self.namespace.as_str(), self.twin.as_str());
        match kind {
            Kind::ConfigMap => {
                converge(
                    Api::<ConfigMap>::namespaced(local, ns),
                    Api::<ConfigMap>::namespaced(remote, twin),
                    kind,
                    desired_config_map,
                    "",
                    rewrite,
                )
                .await
            }
            Kind::Secret => {
                converge(
                    Api::<Secret>::namespaced(local, ns),
                    Api::<Secret>::namespaced(remote, twin),
                    kind,
                    desired_secret,
                    "",
                    rewrite,
                )
                .await
            }
            Kind::Service => {
                converge(
                    Api::<Service>::namespaced(local, ns),
                    Api::<Service>::namespaced(remote, twin),
                    kind,
                    desired_service,
                    "",
                    rewrite,
                )
                .await
            }
            Kind::EndpointSlice => {
                converge(
                    Api::<EndpointSlice>::namespaced(local, ns),
                    Api::<EndpointSlice>::namespaced(remote, twin),
                    kind,
                    |s| desired_endpoint_slice(s, &self.view, &self.link.virtual_node),
                    &format!("{:?}", self.view),
                    rewrite,
                )
                .await
            }
        }
    }

    /// Copies an Event of a provider pod onto the consumer's pod of the same name.
    async fn reflect_event(&mut self, e: &CoreEvent) -> Result<(), RequestError> {
        if e.involved_object.kind.as_deref() != Some("Pod") {
            return Ok(());
        }
        let Some(pod_name) = e.involved_object.name.as_deref() else {
            return Ok(());
        };
        let provider_uid = e.involved_object.uid.clone().unwrap_or_default();
        // (An Event naming no UID is never cached: the empty key is never stored.)
        let uid = match self.pod_uids.get(&provider_uid) {
            Some(uid) => uid.clone(),
            None => {
                // Read lean: the metadata without managedFields, the spec skipped.
                let pods: Api<PodStatusRef> =
                    Api::namespaced(self.ctx.client.clone(), &self.namespace);
                let Some(pod) = pods.get_opt(pod_name).await.map_err(request(format!(
                    "reading pod {}/{pod_name}",
                    self.namespace
                )))?
                else {
                    return Ok(());
                };
                let uid = pod.uid().unwrap_or_default();
                if !provider_uid.is_empty() {
                    if self.pod_uids.len() >= POD_UIDS_KEPT {
                        self.pod_uids.clear();
                    }
                    self.pod_uids.insert(provider_uid, uid.clone());
                }
                uid
            }
        };
        let name = e.name_any();
        let mut event = json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": self.namespace, "labels": {
                names::MANAGED_BY_LABEL: names::MANAGED_BY,
                names::REFLECTED_LABEL: "event",
                names::REMOTE_CLUSTER_LABEL: self.link.provider_id,
            }},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod_name,
                               "namespace": self.namespace, "uid": uid,
                               "fieldPath": e.involved_object.field_path},
            "reason": e.reason, "message": e.message, "type": e.type_,
            "count": e.count, "firstTimestamp": e.first_timestamp, "lastTimestamp": e.last_timestamp,
            "eventTime": e.event_time, "action": e.action,
            "reportingComponent": e.reporting_component.clone().unwrap_or_default(),
            "reportingInstance": self.link.provider_id,
            // `kubectl describe` shows only the component: it names the provider too.
            "source": {"component": format!("{}@{}",
                           e.source.as_ref().and_then(|s| s.component.as_deref()).unwrap_or("tandem"),
                           self.link.provider_id),
                       "host": self.link.virtual_node},
        });
        strip_nulls(&mut event);
        // The Event written is not read back (a burst brings several Events per pod).
        let events =
            kube::core::Request::new(CoreEvent::url_path(&(), Some(self.namespace.as_str())));
        let write = events.patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&event),
        );
        crate::requests::send_unread(&self.ctx.client, write)
            .await
            .map_err(request(format!("writing Event {}/{name}", self.namespace)))
    }
}

fn strip_nulls(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(strip_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

/// Converges the reflected objects of `kind` in the twin namespace to the sources: applies
/// each source whose reflection is missing or older, deletes reflections with no source, and
/// never touches an object of the twin namespace it did not create.
/// `context` is whatever else the reflection depends on (the address view for slices): a
/// change of it rewrites every reflection, as does `rewrite`.
async fn converge<K, F>(
    local: Api<K>,
    remote: Api<K>,
    kind: Kind,
    desired: F,
    context: &str,
    rewrite: bool,
) -> Result<(), RequestError>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug,
    F: Fn(&K) -> Option<Value>,
{
    let sources = local
        .list(&ListParams::default())
        .await
        .map_err(request(format!("listing local {}s", kind.label())))?;
    let existing = remote
        .list(&ListParams::default())
        .await
        .map_err(request(format!(
            "listing {}s in the twin namespace",
            kind.label()
        )))?;
    // name → (reflected by us, source version it was made from)
    let there: BTreeMap<String, (bool, Option<String>)> = existing
        .items
        .iter()
        .map(|o| {
            let ours =
                o.labels().get(names::REFLECTED_LABEL).map(String::as_str) == Some(kind.label());
            let version = o.annotations().get(SOURCE_VERSION_ANNOTATION).cloned();
            (o.name_any(), (ours, version))
        })
        .collect();
    drop(existing);
    let mut wanted = BTreeSet::new();
    for source in &sources.items {
        let Some(mut object) = desired(source) else {
            continue;
        };
        let name = source.name_any();
        wanted.insert(name.clone());
        let version = source_version(&source.resource_version().unwrap_or_default(), context);
        match there.get(&name) {
            Some((false, _)) => {
                tracing::warn!(kind = kind.label(), %name, "not reflected: an object of that name exists in the twin namespace and was not created by Tandem");
                continue;
            }
            Some((true, Some(v))) if *v == version && !rewrite => continue,
            _ => {}
        }
        let metadata = &mut object["metadata"];
        metadata["name"] = json!(name);
        metadata["labels"][names::REFLECTED_LABEL] = json!(kind.label());
        metadata["labels"][names::MANAGED_BY_LABEL] = json!(names::MANAGED_BY);
        metadata["annotations"][SOURCE_VERSION_ANNOTATION] = json!(version);
        match remote
            .patch(
                &name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&object),
            )
            .await
        {
            Ok(_) => {}
            // The provider decides what a peer may write there (an ExternalName Service, say,
            // only if its Tenant allows it): said on the source, and the others go on.
            Err(kube::Error::Api(ae)) if refused_by_provider(&ae) => {
                let namespace = source.namespace().unwrap_or_default();
                crate::events::record(
                    &local.clone().into_client(),
                    &namespace,
                    json!({"apiVersion": K::api_version(&()), "kind": K::kind(&()),
                           "namespace": namespace, "name": name, "uid": source.uid()}),
                    "NotReflected",
                    &format!(
                        "not reflected to the provider, which refuses it: {}",
                        ae.message
                    ),
                    true,
                )
                .await;
            }
            Err(e) => return Err(request(format!("reflecting {} {name}", kind.label()))(e)),
        }
    }
    for (name, (ours, _)) in there {
        if ours && !wanted.contains(&name) {
            match remote.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if client::is_not_found(&e) => {}
                Err(e) => {
                    return Err(request(format!(
                        "deleting reflected {} {name}",
                        kind.label()
                    ))(e));
                }
            }
        }
    }
    Ok(())
}

/// Whether the provider's check of what peers write (`provider::peer_writes`, its validating
/// webhook) refused a write.
fn refused_by_provider(e: &kube::core::Status) -> bool {
    e.code == 403 && e.message.contains("\"peer-writes.tandem.dev\"")
}

/// What the source-version annotation records: the source's resourceVersion, and a digest of
/// the context when there is one.
fn source_version(resource_version: &str, context: &str) -> String {
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

fn desired_config_map(cm: &ConfigMap) -> Option<Value> {
    if cm.name_any() == "kube-root-ca.crt" {
        return None;
    }
    let mut v = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": copied_metadata(cm),
                       "data": cm.data, "binaryData": cm.binary_data});
    strip_nulls(&mut v);
    Some(v)
}

fn desired_secret(s: &Secret) -> Option<Value> {
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
fn desired_service(svc: &Service) -> Option<Value> {
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
fn desired_endpoint_slice(
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

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> EndpointView {
        let p = |s: &str| s.parse().ok();
        EndpointView {
            local_pod_cidr: p("10.244.0.0/16"),
            local_pod_cidr_there: p("10.245.0.0/16"),
            remote_pod_cidr_here: p("10.246.0.0/16"),
            remote_pod_cidr: p("10.244.0.0/16"),
        }
    }

    #[test]
    fn endpoint_slices_in_the_provider_view() {
        let slice: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"name": "web-abc", "labels": {"kubernetes.io/service-name": "web",
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.244.1.5"], "nodeName": "node-1", "conditions": {"ready": true},
                 "targetRef": {"kind": "Pod", "name": "web-1", "namespace": "app"}},
                {"addresses": ["10.246.0.9"], "nodeName": "tandem-milan", "conditions": {"ready": true}},
                {"addresses": ["10.247.0.9"], "nodeName": "tandem-paris", "conditions": {"ready": true}},
            ],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        }))
        .unwrap();
        let got = desired_endpoint_slice(&slice, &view(), "tandem-milan").unwrap();
        assert_eq!(
            got["endpoints"],
            json!([
                {"addresses": ["10.245.1.5"], "conditions": {"ready": true}},
                {"addresses": ["10.244.0.9"], "conditions": {"ready": true}},
            ]),
            "node names and target refs dropped, other providers' pods dropped"
        );
        assert_eq!(
            got["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"],
            SLICE_MANAGER
        );
        assert_eq!(got["ports"][0]["port"], 8080);
        let mut fqdn = slice.clone();
        fqdn.address_type = "FQDN".into();
        assert!(desired_endpoint_slice(&fqdn, &view(), "tandem-milan").is_none());
    }

    #[test]
    fn services_lose_cluster_ips_node_ports_and_selectors() {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "{}", "team": "shop"}},
            "spec": {"type": "NodePort", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
                     "selector": {"app": "web"},
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080, "protocol": "TCP"}]},
        }))
        .unwrap();
        let got = desired_service(&svc).unwrap();
        assert_eq!(
            got["spec"],
            json!({"type": "ClusterIP", "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]})
        );
        assert_eq!(got["metadata"]["annotations"], json!({"team": "shop"}));
    }

    #[test]
    fn skipped_sources() {
        let root: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": "kube-root-ca.crt"}})).unwrap();
        assert!(desired_config_map(&root).is_none());
        let token: Secret = serde_json::from_value(json!({"metadata": {"name": "t"},
            "type": "kubernetes.io/service-account-token"}))
        .unwrap();
        assert!(desired_secret(&token).is_none());
        assert_eq!(source_version("42", ""), "42");
        assert_ne!(source_version("42", "a"), source_version("42", "b"));
    }
}
