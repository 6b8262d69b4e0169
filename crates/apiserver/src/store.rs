//! The object store: every object as serialized JSON, one cluster-wide resourceVersion
//! counter, a bounded event log per resource for watches, and an optional write-ahead log.
//!
//! Objects are kept serialized (`Bytes`) rather than as `serde_json::Value`: gets, lists and
//! watch fan-out then copy no object, and the memory per object stays close to its JSON size.
//! The few values that reads filter on (labels, selectable fields, owner uids) are extracted
//! once, at write time.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::{broadcast, watch};

use crate::wal::{Record, Wal};

/// One stored version of an object.
#[derive(Debug)]
pub struct Doc {
    /// The object, serialized, with its resourceVersion.
    pub json: Bytes,
    /// Its resourceVersion.
    pub rv: u64,
    /// Namespace ("" for cluster scope).
    pub namespace: Box<str>,
    /// Name.
    pub name: Box<str>,
    /// metadata.uid.
    pub uid: Box<str>,
    /// metadata.labels.
    pub labels: Box<[(Box<str>, Box<str>)]>,
    /// Values of the resource's selectable fields, in [`selectable_fields`] order.
    pub fields: Box<[Box<str>]>,
    /// uids in metadata.ownerReferences.
    pub owners: Box<[Box<str>]>,
    /// Whether metadata.deletionTimestamp is set.
    pub deleting: bool,
    /// metadata.finalizers non-empty.
    pub has_finalizers: bool,
}

impl Doc {
    fn build(key: &str, obj: &Value, json: Bytes, rv: u64) -> Doc {
        let meta = &obj["metadata"];
        let text = |v: &Value| -> Box<str> {
            match v {
                Value::String(s) => s.as_str().into(),
                Value::Null => "".into(),
                Value::Bool(b) => b.to_string().into(),
                other => other.to_string().into(),
            }
        };
        let labels = meta["labels"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (Box::from(k.as_str()), text(v)))
                    .collect()
            })
            .unwrap_or_default();
        let fields = selectable_fields(key)
            .iter()
            .map(|path| text(lookup(obj, path).unwrap_or(&Value::Null)))
            .collect();
        let owners = meta["ownerReferences"]
            .as_array()
            .map(|refs| refs.iter().map(|r| text(&r["uid"])).collect())
            .unwrap_or_default();
        Doc {
            json,
            rv,
            namespace: text(&meta["namespace"]),
            name: text(&meta["name"]),
            uid: text(&meta["uid"]),
            labels,
            fields,
            owners,
            deleting: !meta["deletionTimestamp"].is_null(),
            has_finalizers: meta["finalizers"].as_array().is_some_and(|f| !f.is_empty()),
        }
    }

    /// The object as a JSON value.
    pub fn value(&self) -> Value {
        serde_json::from_slice(&self.json).expect("stored objects are valid JSON")
    }

    /// The label `key`, if set.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| &**k == key)
            .map(|(_, v)| &**v)
    }

    /// The value of a selectable field of resource `key`; absent fields read as "".
    pub fn field(&self, key: &str, path: &str) -> Option<&str> {
        match path {
            "metadata.name" => Some(&self.name),
            "metadata.namespace" => Some(&self.namespace),
            _ => selectable_fields(key)
                .iter()
                .position(|p| *p == path)
                .map(|i| &*self.fields[i]),
        }
    }
}

/// Follows a dotted path through a JSON object.
pub fn lookup<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(obj, |v, part| v.get(part))
}

/// Fields a field selector may name for the resource stored under `key`, besides
/// metadata.name and metadata.namespace. The registry advertises these same lists.
pub fn selectable_fields(key: &str) -> &'static [&'static str] {
    match key {
        "/pods" => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        "/events" | "events.k8s.io/events" => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        "/namespaces" => &["status.phase"],
        "/nodes" => &["spec.unschedulable"],
        "/secrets" => &["type"],
        "discovery.k8s.io/endpointslices" => &["addressType"],
        "certificates.k8s.io/certificatesigningrequests" => &["spec.signerName"],
        _ => &[],
    }
}

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Created.
    Added,
    /// Changed.
    Modified,
    /// Removed.
    Deleted,
}

impl EventType {
    /// The watch event type string.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, as watches see it.
#[derive(Debug)]
pub struct Event {
    /// Storage key of the resource.
    pub key: Arc<str>,
    /// What happened.
    pub kind: EventType,
    /// The object after the change (for deletes: its last state, at the delete's rv).
    pub doc: Arc<Doc>,
    /// The object before the change, for modifications and deletes.
    pub prev: Option<Arc<Doc>>,
}

/// Why a store operation failed.
#[derive(Debug, PartialEq, Eq)]
pub enum StoreError {
    /// No such object.
    NotFound,
    /// The object exists already.
    AlreadyExists,
    /// The object changed since the caller read it.
    Conflict,
    /// The events asked for are older than the retained window.
    TooOld {
        /// The oldest resourceVersion a watch may still start from.
        oldest: u64,
    },
    /// The write-ahead log could not be written: nothing was changed.
    Io(String),
}

struct Collection {
    key: Arc<str>,
    objects: BTreeMap<(Box<str>, Box<str>), Arc<Doc>>,
    log: VecDeque<Arc<Event>>,
    /// Every event with an rv above this is in `log`.
    floor: u64,
    notify: watch::Sender<u64>,
}

struct Inner {
    rv: u64,
    /// The resourceVersion the store opened at: every event since is logged (until evicted).
    opened_at: u64,
    collections: HashMap<String, Collection>,
    wal: Option<Wal>,
}

/// The store. Cheap to share behind an `Arc`.
pub struct Store {
    inner: Mutex<Inner>,
    window: usize,
    feed: broadcast::Sender<Arc<Event>>,
}

impl Store {
    /// Opens a store; with a data directory its content is recovered from and logged to it.
    /// `window` is how many events per resource are kept for watches to resume from.
    pub fn open(dir: Option<&Path>, window: usize) -> std::io::Result<Store> {
        let mut inner = Inner {
            rv: 0,
            opened_at: 0,
            collections: HashMap::new(),
            wal: None,
        };
        if let Some(dir) = dir {
            let (wal, records) = Wal::open(dir)?;
            for record in records {
                inner.rv = inner.rv.max(record.rv());
                match record {
                    Record::Put {
                        rv,
                        key,
                        namespace,
                        name,
                        json,
                    } => {
                        let obj: Value = serde_json::from_slice(&json).map_err(|e| {
                            std::io::Error::new(
                                std::io::ErrorKind::InvalidData,
                                format!("stored {key} {namespace}/{name}: {e}"),
                            )
                        })?;
                        let doc = Doc::build(&key, &obj, Bytes::from(json), rv);
                        inner
                            .collection(&key)
                            .objects
                            .insert((namespace.into(), name.into()), Arc::new(doc));
                    }
                    Record::Delete {
                        key,
                        namespace,
                        name,
                        ..
                    } => {
                        inner
                            .collection(&key)
                            .objects
                            .remove(&(Box::from(namespace), Box::from(name)));
                    }
                }
            }
            inner.wal = Some(wal);
        }
        inner.opened_at = inner.rv;
        let rv = inner.rv;
        for c in inner.collections.values_mut() {
            c.floor = rv;
        }
        Ok(Store {
            inner: Mutex::new(inner),
            window: window.max(1),
            feed: broadcast::channel(1 << 16).0,
        })
    }

    /// The latest resourceVersion.
    pub fn current_rv(&self) -> u64 {
        self.inner.lock().rv
    }

    /// One object.
    pub fn get(&self, key: &str, namespace: &str, name: &str) -> Option<Arc<Doc>> {
        let inner = self.inner.lock();
        inner
            .collections
            .get(key)?
            .objects
            .get(&(Box::from(namespace), Box::from(name)))
            .cloned()
    }

    /// Objects of a resource (in one namespace if given), ordered by namespace and name,
    /// starting after `after`; with the resourceVersion they are consistent with.
    pub fn list(
        &self,
        key: &str,
        namespace: Option<&str>,
        after: Option<(&str, &str)>,
    ) -> (u64, Vec<Arc<Doc>>) {
        let inner = self.inner.lock();
        let Some(c) = inner.collections.get(key) else {
            return (inner.rv, Vec::new());
        };
        use std::ops::Bound;
        let lower = match (after, namespace) {
            (Some((ns, name)), _) => Bound::Excluded((Box::from(ns), Box::from(name))),
            (None, Some(ns)) => Bound::Included((Box::from(ns), Box::from(""))),
            (None, None) => Bound::Unbounded,
        };
        let docs = c
            .objects
            .range((lower, Bound::Unbounded))
            .take_while(|((ns, _), _)| namespace.is_none_or(|want| &**ns == want))
            .map(|(_, d)| d.clone())
            .collect();
        (inner.rv, docs)
    }

    /// Storage keys that hold at least one object.
    pub fn keys(&self) -> Vec<String> {
        let inner = self.inner.lock();
        inner
            .collections
            .iter()
            .filter(|(_, c)| !c.objects.is_empty())
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Stores a new object; `obj` gets its resourceVersion.
    pub fn create(
        &self,
        key: &str,
        namespace: &str,
        name: &str,
        obj: &mut Value,
    ) -> Result<Arc<Doc>, StoreError> {
        self.write(key, namespace, name, None, Some(obj))
    }

    /// Replaces an object if it is still at `expected_rv`.
    pub fn update(
        &self,
        key: &str,
        namespace: &str,
        name: &str,
        expected_rv: u64,
        obj: &mut Value,
    ) -> Result<Arc<Doc>, StoreError> {
        self.write(key, namespace, name, Some(expected_rv), Some(obj))
    }

    /// Removes an object (if still at `expected_rv`, when given). Returns its last state.
    pub fn delete(
        &self,
        key: &str,
        namespace: &str,
        name: &str,
        expected_rv: Option<u64>,
    ) -> Result<Arc<Doc>, StoreError> {
        self.write(key, namespace, name, Some(expected_rv.unwrap_or(0)), None)
    }

    /// expected: None = create; Some(0) = any version; Some(rv) = exactly that version.
    fn write(
        &self,
        key: &str,
        namespace: &str,
        name: &str,
        expected: Option<u64>,
        obj: Option<&mut Value>,
    ) -> Result<Arc<Doc>, StoreError> {
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        let obj_key = (Box::from(namespace), Box::from(name));
        let prev = inner
            .collections
            .get(key)
            .and_then(|c| c.objects.get(&obj_key).cloned());
        match (expected, &prev) {
            (None, Some(_)) => return Err(StoreError::AlreadyExists),
            (Some(_), None) => return Err(StoreError::NotFound),
            (Some(rv), Some(p)) if rv != 0 && p.rv != rv => return Err(StoreError::Conflict),
            _ => {}
        }
        let rv = inner.rv + 1;
        let (doc, record, kind) = match obj {
            Some(obj) => {
                obj["metadata"]["resourceVersion"] = Value::String(rv.to_string());
                let json = serde_json::to_vec(obj).expect("JSON values serialize");
                let record = Record::Put {
                    rv,
                    key: key.into(),
                    namespace: namespace.into(),
                    name: name.into(),
                    json: json.clone(),
                };
                let doc = Doc::build(key, obj, Bytes::from(json), rv);
                let kind = if prev.is_some() {
                    EventType::Modified
                } else {
                    EventType::Added
                };
                (doc, record, kind)
            }
            None => {
                let prev = prev.as_ref().expect("checked above");
                // The DELETED event carries the last state at the delete's resourceVersion.
                let mut last = prev.value();
                last["metadata"]["resourceVersion"] = Value::String(rv.to_string());
                let json = serde_json::to_vec(&last).expect("JSON values serialize");
                let record = Record::Delete {
                    rv,
                    key: key.into(),
                    namespace: namespace.into(),
                    name: name.into(),
                };
                (
                    Doc::build(key, &last, Bytes::from(json), rv),
                    record,
                    EventType::Deleted,
                )
            }
        };
        if let Some(wal) = inner.wal.as_mut() {
            wal.append(&record)
                .map_err(|e| StoreError::Io(format!("write-ahead log: {e}")))?;
        }
        inner.rv = rv;
        let doc = Arc::new(doc);
        let window = self.window;
        let c = inner.collection(key);
        if kind == EventType::Deleted {
            c.objects.remove(&obj_key);
        } else {
            c.objects.insert(obj_key, doc.clone());
        }
        let event = Arc::new(Event {
            key: c.key.clone(),
            kind,
            doc: doc.clone(),
            prev,
        });
        c.log.push_back(event.clone());
        while c.log.len() > window {
            if let Some(old) = c.log.pop_front() {
                c.floor = old.doc.rv;
            }
        }
        c.notify.send_replace(rv);
        // Nobody listening is fine: the feed only serves in-process controllers.
        let _ = self.feed.send(event);
        if inner.wal.as_ref().is_some_and(Wal::wants_compaction) {
            let records: Vec<Record> = inner
                .collections
                .iter()
                .flat_map(|(key, c)| {
                    c.objects.values().map(move |d| Record::Put {
                        rv: d.rv,
                        key: key.clone(),
                        namespace: d.namespace.to_string(),
                        name: d.name.to_string(),
                        json: d.json.to_vec(),
                    })
                })
                .collect();
            if let Some(wal) = inner.wal.as_mut()
                && let Err(e) = wal.compact(records.into_iter())
            {
                tracing::error!("compacting the write-ahead log: {e}");
            }
        }
        Ok(doc)
    }

    /// A receiver that changes whenever resource `key` changes.
    pub fn subscribe(&self, key: &str) -> watch::Receiver<u64> {
        self.inner.lock().collection(key).notify.subscribe()
    }

    /// Every change to any resource, for in-process controllers (garbage collector,
    /// namespace lifecycle). A lagging receiver must resync from lists.
    pub fn feed(&self) -> broadcast::Receiver<Arc<Event>> {
        self.feed.subscribe()
    }

    /// Events of resource `key` newer than `rv`, or TooOld if some were already dropped.
    pub fn events_since(&self, key: &str, rv: u64) -> Result<Vec<Arc<Event>>, StoreError> {
        let mut inner = self.inner.lock();
        let c = inner.collection(key);
        if rv < c.floor {
            return Err(StoreError::TooOld { oldest: c.floor });
        }
        let start = c.log.partition_point(|e| e.doc.rv <= rv);
        Ok(c.log.range(start..).cloned().collect())
    }
}

impl Inner {
    fn collection(&mut self, key: &str) -> &mut Collection {
        // Nothing of this resource was ever evicted: it can be watched from the opening on.
        let floor = self.opened_at;
        let rv = self.rv;
        self.collections
            .entry(key.to_string())
            .or_insert_with(|| Collection {
                key: Arc::from(key),
                objects: BTreeMap::new(),
                log: VecDeque::new(),
                floor,
                notify: watch::channel(rv).0,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cm(name: &str, labels: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": "default", "labels": labels, "uid": format!("uid-{name}")}})
    }

    #[test]
    fn optimistic_concurrency_and_events() {
        let store = Store::open(None, 100).unwrap();
        let a = store
            .create(
                "/configmaps",
                "default",
                "a",
                &mut cm("a", json!({"x": "1"})),
            )
            .unwrap();
        assert_eq!(a.rv, 1);
        assert_eq!(a.label("x"), Some("1"));
        assert_eq!(
            store
                .create("/configmaps", "default", "a", &mut cm("a", json!({})))
                .err(),
            Some(StoreError::AlreadyExists)
        );
        let b = store
            .update("/configmaps", "default", "a", 1, &mut cm("a", json!({})))
            .unwrap();
        assert_eq!(b.rv, 2);
        assert_eq!(
            store
                .update("/configmaps", "default", "a", 1, &mut cm("a", json!({})))
                .err(),
            Some(StoreError::Conflict)
        );
        let gone = store.delete("/configmaps", "default", "a", None).unwrap();
        assert_eq!(gone.rv, 3);
        assert_eq!(gone.value()["metadata"]["resourceVersion"], "3");
        let kinds: Vec<_> = store
            .events_since("/configmaps", 0)
            .unwrap()
            .iter()
            .map(|e| e.kind)
            .collect();
        assert_eq!(
            kinds,
            [EventType::Added, EventType::Modified, EventType::Deleted]
        );
        assert_eq!(store.events_since("/configmaps", 2).unwrap().len(), 1);
    }

    #[test]
    fn window_expires_old_events() {
        let store = Store::open(None, 3).unwrap();
        for i in 0..10 {
            store
                .create(
                    "/configmaps",
                    "default",
                    &format!("c{i}"),
                    &mut cm("x", json!({})),
                )
                .unwrap();
        }
        assert_eq!(
            store.events_since("/configmaps", 2).err(),
            Some(StoreError::TooOld { oldest: 7 })
        );
        assert_eq!(store.events_since("/configmaps", 7).unwrap().len(), 3);
        // A resource untouched since start can be watched from any version.
        assert!(store.events_since("/secrets", 0).is_ok());
        // Also one first written after other resources moved the version on.
        store
            .create("/secrets", "default", "s", &mut cm("s", json!({})))
            .unwrap();
        assert_eq!(store.events_since("/secrets", 3).unwrap().len(), 1);
    }

    #[test]
    fn list_by_namespace_and_page() {
        let store = Store::open(None, 100).unwrap();
        for (ns, name) in [("b", "1"), ("a", "2"), ("a", "1"), ("c", "0")] {
            let mut obj = cm(name, json!({}));
            obj["metadata"]["namespace"] = json!(ns);
            store.create("/configmaps", ns, name, &mut obj).unwrap();
        }
        let names = |docs: Vec<Arc<Doc>>| {
            docs.iter()
                .map(|d| format!("{}/{}", d.namespace, d.name))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(store.list("/configmaps", None, None).1),
            ["a/1", "a/2", "b/1", "c/0"]
        );
        assert_eq!(
            names(store.list("/configmaps", Some("a"), None).1),
            ["a/1", "a/2"]
        );
        assert_eq!(
            names(store.list("/configmaps", None, Some(("a", "2"))).1),
            ["b/1", "c/0"]
        );
        assert_eq!(
            names(store.list("/configmaps", Some("a"), Some(("a", "1"))).1),
            ["a/2"]
        );
    }

    #[test]
    fn survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(Some(dir.path()), 100).unwrap();
            store
                .create(
                    "/configmaps",
                    "default",
                    "a",
                    &mut cm("a", json!({"k": "v"})),
                )
                .unwrap();
            store
                .create("/configmaps", "default", "b", &mut cm("b", json!({})))
                .unwrap();
            store.delete("/configmaps", "default", "b", None).unwrap();
        }
        let store = Store::open(Some(dir.path()), 100).unwrap();
        assert_eq!(store.current_rv(), 3);
        let a = store.get("/configmaps", "default", "a").unwrap();
        assert_eq!(a.label("k"), Some("v"));
        assert!(store.get("/configmaps", "default", "b").is_none());
        // Events from before the restart are gone: resuming from them must be refused.
        assert_eq!(
            store.events_since("/configmaps", 1).err(),
            Some(StoreError::TooOld { oldest: 3 })
        );
    }
}
