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
use tandem_core::offloading::EndpointView;

use crate::consumer::link::LinkWatch;
use crate::consumer::link::ProviderLink;
use crate::context::Ctx;
use crate::error::{RequestError, request};
use crate::lean::PodStatusRef;

mod plan;

use plan::{
    EventTarget, Reflections, Skip, Step, desired_config_map, desired_endpoint_slice,
    desired_secret, desired_service, twin_for,
};
pub use plan::{Kind, SLICE_MANAGER, SOURCE_VERSION_ANNOTATION};

/// Field manager of reflected objects.
const MANAGER: &str = "tandem-reflection";

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

/// How addresses translate into `link`'s provider (the local pod CIDR from the install
/// settings; with no negotiated network, local addresses pass unchanged).
async fn endpoint_view(ctx: &Ctx, link: &ProviderLink) -> EndpointView {
    let local: Option<ipnet::IpNet> = ctx
        .settings()
        .await
        .ok()
        .and_then(|s| s.pod_cidr.parse().ok());
    plan::endpoint_view(local, link.network.as_ref())
}

/// What wakes a namespace's reflector.
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
        let Some(pod_name) = plan::event_pod(e) else {
            return Ok(());
        };
        let provider_uid = e.involved_object.uid.clone().unwrap_or_default();
        // (An Event naming no UID is never cached: the empty key is never stored.)
        // The virtual kubelet has most likely seen the real pod, and its origin annotation.
        let origins = &self.ctx.shared.origins;
        let known = (origins.get(&provider_uid, &self.namespace, pod_name))
            .or_else(|| self.pod_uids.get(&provider_uid).cloned());
        let uid = match known {
            Some(uid) => uid,
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
        let event = plan::reflected_event(
            e,
            &EventTarget {
                namespace: &self.namespace,
                name: &name,
                pod_name,
                uid: &uid,
                provider: &self.link.provider_id,
                virtual_node: &self.link.virtual_node,
            },
        );
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
    let mut reflections = Reflections::new(kind, &existing.items, rewrite);
    drop(existing);
    for source in &sources.items {
        match reflections.write(source, desired(source), context) {
            Ok(step) => send(&local, &remote, kind, step, Some(source)).await?,
            Err(Skip::NotOurs { name }) => {
                tracing::warn!(kind = kind.label(), %name, "not reflected: an object of that name exists in the twin namespace and was not created by Tandem");
            }
            Err(Skip::NotReflected | Skip::UpToDate) => {}
        }
    }
    for step in reflections.deletions() {
        send(&local, &remote, kind, step, None).await?;
    }
    Ok(())
}

/// Sends `step` into the twin namespace (`remote`); `source` is the source of an applied
/// reflection.
async fn send<K>(
    local: &Api<K>,
    remote: &Api<K>,
    kind: Kind,
    step: Step,
    source: Option<&K>,
) -> Result<(), RequestError>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug,
{
    match step {
        Step::Apply { name, object } => match remote
            .patch(
                &name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&object),
            )
            .await
        {
            Ok(_) => Ok(()),
            // The provider decides what a peer may write there (an ExternalName Service, say,
            // only if its Tenant allows it): said on the source, and the others go on.
            Err(kube::Error::Api(ae)) if plan::refused_by_provider(&ae) => {
                if let Some(source) = source {
                    let namespace = source.namespace().unwrap_or_default();
                    crate::events::record(
                        &local.clone().into_client(),
                        &namespace,
                        json!({"apiVersion": K::api_version(&()), "kind": K::kind(&()),
                               "namespace": namespace, "name": name, "uid": source.uid()}),
                        "NotReflected",
                        &plan::refusal_message(&ae),
                        true,
                    )
                    .await;
                }
                Ok(())
            }
            Err(e) => Err(request(format!("reflecting {} {name}", kind.label()))(e)),
        },
        Step::Delete { name } => match remote.delete(&name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(e) if client::is_not_found(&e) => Ok(()),
            Err(e) => Err(request(format!(
                "deleting reflected {} {name}",
                kind.label()
            ))(e)),
        },
    }
}
