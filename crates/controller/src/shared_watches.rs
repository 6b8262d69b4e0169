//! What every virtual kubelet of the cluster watches together: the NamespaceOffloadings and
//! the virtual nodes, each kept by one watch; and what the virtual kubelets learn of the
//! providers' real pods that the reflectors need ([`RealPodOrigins`]).

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::watcher::{self, watcher};
use kube::{Client, ResourceExt};
use tandem_api::{NamespaceOffloading, names};

/// Objects of one kind by key, as one watch keeps them for every virtual kubelet of the
/// cluster. (Each virtual kubelet watched them itself: a listing, a watch and, over HTTP/1.1, a
/// connection per provider, each carrying every change.)
pub type SharedMap<K> = Arc<std::collections::BTreeMap<String, Arc<K>>>;

/// What the virtual kubelets watch together (see [`SharedMap`]).
#[derive(Clone)]
pub struct SharedWatches {
    /// Each namespace's NamespaceOffloading (the one named [`names::OFFLOADING_NAME`]).
    pub(crate) offloadings: tokio::sync::watch::Receiver<SharedMap<NamespaceOffloading>>,
    /// The virtual nodes, by name.
    pub(crate) nodes: tokio::sync::watch::Receiver<SharedMap<Node>>,
    /// The consumer pod of each real pod, as the virtual kubelets see the real pods.
    pub(crate) origins: RealPodOrigins,
}

/// Which consumer pod each real pod of every provider runs: the real pod's UID → the consumer
/// pod's namespace, name and UID (from the origin annotation the virtual kubelet reads on every
/// real pod it watches, recorded only when the consumer pod of that name has that UID).
/// An Event a provider records about a real pod is written onto the consumer pod with that
/// pod's UID (what `kubectl describe pod` selects by); with this map the reflector needs no
/// read of the consumer pod per offloaded pod (a request per pod in a burst, on both the
/// controller and its API server). A real pod not in it yet is read as before.
#[derive(Clone, Default)]
pub struct RealPodOrigins(Arc<std::sync::RwLock<std::collections::HashMap<String, Origin>>>);

/// A consumer pod: namespace, name, UID.
type Origin = (String, String, String);

impl RealPodOrigins {
    /// The UID of the consumer pod `namespace`/`name` if the real pod `real_uid` runs it.
    /// The UIDs are the providers' word (any provider can report any UID, and an Event any
    /// pod name): an entry for another pod than the one named is not an answer.
    pub fn get(&self, real_uid: &str, namespace: &str, name: &str) -> Option<String> {
        // (A panic elsewhere while holding the lock leaves the map itself whole.)
        let map = self.0.read().unwrap_or_else(|e| e.into_inner());
        map.get(real_uid)
            .filter(|(ns, n, _)| ns == namespace && n == name)
            .map(|(_, _, uid)| uid.clone())
    }

    /// Records that the real pod `real_uid` runs the consumer pod `pod` (namespace, name),
    /// whose UID is `origin_uid` (an empty UID on either side records nothing).
    pub(crate) fn set(&self, real_uid: &str, pod: &(String, String), origin_uid: &str) {
        if real_uid.is_empty() || origin_uid.is_empty() {
            return;
        }
        let mut map = self.0.write().unwrap_or_else(|e| e.into_inner());
        let origin = (pod.0.clone(), pod.1.clone(), origin_uid.to_string());
        map.insert(real_uid.to_string(), origin);
    }

    /// Forgets the real pods of `real_uids` (gone from the provider).
    pub(crate) fn forget<'a>(&self, real_uids: impl IntoIterator<Item = &'a str>) {
        let mut map = self.0.write().unwrap_or_else(|e| e.into_inner());
        for uid in real_uids {
            map.remove(uid);
        }
    }

    /// Real pods recorded.
    pub fn len(&self) -> usize {
        self.0.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether no real pod is recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl SharedWatches {
    /// The shared maps, and the future that runs their watches (for as long as the controller
    /// runs).
    pub fn watch(
        client: &Client,
    ) -> (SharedWatches, impl std::future::Future<Output = ()> + use<>) {
        let (offloadings, watch_offloadings) = shared_watch(
            "NamespaceOffloadings",
            Api::<NamespaceOffloading>::all(client.clone()),
            watcher::Config::default(),
            |o| (o.name_any() == names::OFFLOADING_NAME).then(|| o.namespace().unwrap_or_default()),
        );
        // By the label every virtual node is applied with (a node stripped of it by hand reads
        // as gone, so not Ready, to its virtual kubelet until its virtual node task applies the
        // label again, at its next status post).
        let (nodes, watch_nodes) = shared_watch(
            "virtual nodes",
            Api::<Node>::all(client.clone()),
            watcher::Config::default().labels(&format!(
                "{}={}",
                names::NODE_TYPE_LABEL,
                names::VIRTUAL_NODE_TYPE
            )),
            |n| Some(n.name_any()),
        );
        let run = async move {
            futures::join!(watch_offloadings, watch_nodes);
        };
        (
            SharedWatches {
                offloadings,
                nodes,
                origins: RealPodOrigins::default(),
            },
            run,
        )
    }
}

/// A [`SharedMap`] of the objects `api` and `config` watch, under `key_of` (None: left out),
/// and the future that runs the watch. Empty until the first listing; a relisting replaces the
/// whole map, so that what went while the watch was down goes too.
fn shared_watch<K>(
    what: &'static str,
    api: Api<K>,
    config: watcher::Config,
    key_of: fn(&K) -> Option<String>,
) -> (
    tokio::sync::watch::Receiver<SharedMap<K>>,
    impl std::future::Future<Output = ()> + use<K>,
)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync,
    K: 'static,
{
    use kube::runtime::WatchStreamExt as _;
    let (tx, rx) = tokio::sync::watch::channel(SharedMap::default());
    let run = async move {
        let stream = watcher(api, config).default_backoff();
        futures::pin_mut!(stream);
        let mut listing = None;
        // Only to say so when the watch keeps failing: the map keeps what it last saw.
        let mut tracker = crate::watches::WatchTracker::new(what);
        while let Some(ev) = stream.next().await {
            tracker.note(&ev);
            let Ok(ev) = ev else { continue };
            match ev {
                watcher::Event::Init => listing = Some(std::collections::BTreeMap::new()),
                watcher::Event::InitApply(o) => {
                    if let (Some(listing), Some(key)) = (listing.as_mut(), key_of(&o)) {
                        listing.insert(key, Arc::new(o));
                    }
                }
                watcher::Event::InitDone => {
                    if let Some(listing) = listing.take() {
                        tx.send_replace(Arc::new(listing));
                    }
                }
                watcher::Event::Apply(o) => {
                    if let Some(key) = key_of(&o) {
                        tx.send_modify(|map| {
                            Arc::make_mut(map).insert(key, Arc::new(o));
                        });
                    }
                }
                watcher::Event::Delete(o) => {
                    if let Some(key) = key_of(&o) {
                        tx.send_modify(|map| {
                            Arc::make_mut(map).remove(&key);
                        });
                    }
                }
            }
        }
    };
    (rx, run)
}
