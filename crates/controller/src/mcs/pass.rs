//! One pass of the multi-cluster services sync: the caches it reads, what it observes in
//! them ([`Pass::observe`]), and what a failed write says.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tandem_api::mcs::{ExportedService, ServiceExport, ServiceImport};
use tandem_api::{NetworkParameters, Peering, Tenant};
use tokio::sync::Notify;

use crate::consumer::link::ProviderLink;
use crate::context::Ctx;

use super::observed::Observed;
use super::records::{Key, key_of};

/// The caches the loop reads; the DNS server reads the same.
#[derive(Clone)]
pub struct Caches {
    pub exports: Store<ServiceExport>,
    pub services: Store<Service>,
    pub slices: Store<EndpointSlice>,
    pub records: Store<ExportedService>,
    pub imports: Store<ServiceImport>,
    pub namespaces: Store<Namespace>,
    pub peerings: Store<Peering>,
    pub tenants: Store<Tenant>,
    pub parameters: Store<NetworkParameters>,
    pub nodes: Store<Node>,
}

/// Starts a reflector for `api`, waking `notify` on each event.
pub(super) fn cache<K>(
    api: Api<K>,
    notify: Arc<Notify>,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()))
        .default_backoff()
        .for_each(move |event| {
            if let Err(e) = event {
                tracing::debug!("multi-cluster services: watching {}: {e}", K::plural(&()));
            }
            notify.notify_one();
            async {}
        });
    tasks.push(tokio::spawn(stream));
    reader
}

impl Caches {
    pub(super) fn start(
        client: &kube::Client,
        notify: &Arc<Notify>,
    ) -> (Caches, Vec<tokio::task::JoinHandle<()>>) {
        let mut tasks = Vec::new();
        let n = || notify.clone();
        let caches = Caches {
            exports: cache(Api::all(client.clone()), n(), &mut tasks),
            services: cache(Api::all(client.clone()), n(), &mut tasks),
            slices: cache(Api::all(client.clone()), n(), &mut tasks),
            records: cache(Api::all(client.clone()), n(), &mut tasks),
            imports: cache(Api::all(client.clone()), n(), &mut tasks),
            namespaces: cache(Api::all(client.clone()), n(), &mut tasks),
            peerings: cache(Api::all(client.clone()), n(), &mut tasks),
            tenants: cache(Api::all(client.clone()), n(), &mut tasks),
            parameters: cache(Api::all(client.clone()), n(), &mut tasks),
            nodes: cache(Api::all(client.clone()), n(), &mut tasks),
        };
        (caches, tasks)
    }

    pub(super) async fn ready(&self) {
        let _ = tokio::join!(
            self.exports.wait_until_ready(),
            self.services.wait_until_ready(),
            self.slices.wait_until_ready(),
            self.records.wait_until_ready(),
            self.imports.wait_until_ready(),
            self.namespaces.wait_until_ready(),
            self.peerings.wait_until_ready(),
            self.tenants.wait_until_ready(),
            self.parameters.wait_until_ready(),
            self.nodes.wait_until_ready(),
        );
    }
}

/// The records a provider publishes for one consumer, read with the consumer's peer identity.
pub(super) struct RemoteRecords {
    pub(super) identity_version: String,
    pub(super) store: Store<ExportedService>,
    pub(super) task: tokio::task::JoinHandle<()>,
}

impl Drop for RemoteRecords {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A write of a pass that failed (the pass goes on with the other objects).
#[derive(Debug, thiserror::Error)]
#[error("{write}: {}", short(source))]
pub struct SyncError {
    pub(super) write: Write,
    #[source]
    pub(super) source: kube::Error,
}

/// The API server's message alone (kube's own text of an API error repeats it in Debug form).
pub(super) fn short(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => format!("{} ({})", status.message, status.code),
        other => other.to_string(),
    }
}

/// What a pass was doing to which object when a write failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Write {
    pub(super) verb: Verb,
    /// The object's kind.
    pub(super) kind: &'static str,
    pub(super) namespace: String,
    pub(super) name: String,
}

/// What a pass does to an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Verb {
    Creating,
    Updating,
    Applying,
    Writing,
    Deleting,
    /// Removing an import no export backs, with what derives from it.
    Removing,
    /// Setting an object's status.
    Status,
    /// Setting an import's IP.
    Ip,
}

impl Write {
    pub(super) fn new(verb: Verb, kind: &'static str, namespace: &str, name: &str) -> Write {
        Write {
            verb,
            kind,
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }

    /// The error of this write failing with `source`.
    pub(super) fn failed(self, source: kube::Error) -> SyncError {
        SyncError {
            write: self,
            source,
        }
    }
}

impl std::fmt::Display for Write {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Write {
            kind,
            namespace,
            name,
            ..
        } = self;
        let object = format!("{kind} {namespace}/{name}");
        match self.verb {
            Verb::Creating => write!(f, "creating {object}"),
            Verb::Updating => write!(f, "updating {object}"),
            Verb::Applying => write!(f, "applying {object}"),
            Verb::Writing => write!(f, "writing {object}"),
            Verb::Deleting => write!(f, "deleting {object}"),
            Verb::Removing => write!(f, "removing {object} (no export left)"),
            Verb::Status => write!(f, "status of {object}"),
            Verb::Ip => write!(f, "IP of {object}"),
        }
    }
}

pub(super) struct Pass<'a> {
    pub(super) ctx: &'a Ctx,
    pub(super) caches: &'a Caches,
    pub(super) links: &'a BTreeMap<String, ProviderLink>,
    pub(super) remotes: &'a BTreeMap<String, RemoteRecords>,
    pub(super) pod_cidr: Option<IpNet>,
    /// Whether the tunnel to each consumer of ours is up (absent: not checked yet).
    pub(super) tunnels: &'a BTreeMap<String, bool>,
}

impl Pass<'_> {
    /// What the caches and the peers hold now, as values for the plan.
    pub(super) fn observe(&self) -> Observed {
        fn by_key<K: kube::Resource>(objects: Vec<Arc<K>>) -> BTreeMap<Key, Arc<K>> {
            objects
                .into_iter()
                .map(|o| (key_of(o.as_ref()), o))
                .collect()
        }
        Observed {
            me: self.ctx.identity.cluster_id.clone(),
            pod_cidr: self.pod_cidr,
            exports: self.caches.exports.state(),
            services: by_key(self.caches.services.state()),
            slices: self.caches.slices.state(),
            records: self.caches.records.state(),
            imports: by_key(self.caches.imports.state()),
            namespaces: self
                .caches
                .namespaces
                .state()
                .into_iter()
                .map(|n| (n.metadata.name.clone().unwrap_or_default(), n))
                .collect(),
            peers: self.peers(),
        }
    }
}
