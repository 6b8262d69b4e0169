//! The garbage collector (ownerReferences with Background, Foreground and Orphan
//! propagation) and the namespace lifecycle (a Terminating namespace is emptied, then goes).
//!
//! Both run inside the API server as kube-controller-manager's controllers would, fed by the
//! store's change feed; every change they make goes through the same write path as a
//! client's, so finalizers, grace periods and watches behave alike.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tandem_apimachinery::rbac::UserInfo;
use tokio::sync::broadcast::error::RecvError;

use crate::deletion::{DeleteOptions, delete_one};
use crate::registry::ResourceInfo;
use crate::request::{Call, RequestInfo};
use crate::state::State;
use crate::store::{Doc, EventType};

type ObjectRef = (String, String, String); // storage key, namespace, name

#[derive(Default)]
struct Index {
    /// uid → where the object is.
    objects: HashMap<String, ObjectRef>,
    /// owner uid → dependents.
    dependents: HashMap<String, HashSet<ObjectRef>>,
    /// Objects waiting on their dependents (foreground) or contents (namespaces).
    pending: HashSet<ObjectRef>,
}

impl Index {
    fn put(&mut self, key: &str, doc: &Doc) {
        let at = (
            key.to_string(),
            doc.namespace.to_string(),
            doc.name.to_string(),
        );
        self.objects.insert(doc.uid.to_string(), at.clone());
        for owner in doc.owners.iter() {
            self.dependents
                .entry(owner.to_string())
                .or_default()
                .insert(at.clone());
        }
    }

    fn remove(&mut self, key: &str, doc: &Doc) {
        let at = (
            key.to_string(),
            doc.namespace.to_string(),
            doc.name.to_string(),
        );
        self.objects.remove(&*doc.uid);
        for owner in doc.owners.iter() {
            if let Some(deps) = self.dependents.get_mut(&**owner) {
                deps.remove(&at);
                if deps.is_empty() {
                    self.dependents.remove(&**owner);
                }
            }
        }
    }
}

/// Runs the collector until the process ends.
pub async fn run(state: Arc<State>) {
    let mut feed = state.store.feed();
    let mut index = Index::default();
    resync(&state, &mut index).await;
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            event = feed.recv() => match event {
                Ok(event) => {
                    let key = event.key.to_string();
                    if let Some(prev) = &event.prev {
                        index.remove(&key, prev);
                    }
                    if event.kind == EventType::Deleted {
                        owner_gone(&state, &mut index, &event.doc).await;
                    } else {
                        index.put(&key, &event.doc);
                        examine(&state, &mut index, &key, &event.doc).await;
                    }
                }
                Err(RecvError::Lagged(missed)) => {
                    tracing::warn!("garbage collector missed {missed} changes; resyncing");
                    resync(&state, &mut index).await;
                }
                Err(RecvError::Closed) => return,
            },
            _ = tick.tick() => {
                let pending: Vec<ObjectRef> = index.pending.drain().collect();
                for (key, ns, name) in pending {
                    if let Some(doc) = state.store.get(&key, &ns, &name) {
                        examine(&state, &mut index, &key, &doc).await;
                    }
                }
            }
        }
    }
}

async fn resync(state: &State, index: &mut Index) {
    *index = Index::default();
    let mut all = Vec::new();
    for key in state.store.keys() {
        let (_, docs) = state.store.list(&key, None, None);
        for doc in docs {
            index.put(&key, &doc);
            all.push((key.clone(), doc));
        }
    }
    for (key, doc) in all {
        examine(state, index, &key, &doc).await;
    }
}

fn resource_for(state: &State, key: &str) -> Option<Arc<ResourceInfo>> {
    let (group, resource) = key.split_once('/')?;
    state.registry.read().preferred(group, resource)
}

fn system_call(res: &ResourceInfo, ns: &str, name: &str, verb: &str) -> Call {
    Call {
        info: RequestInfo {
            resource_request: true,
            verb: verb.into(),
            group: res.group.clone(),
            version: res.version.clone(),
            namespace: ns.into(),
            resource: res.resource.clone(),
            name: name.into(),
            ..Default::default()
        },
        query: Default::default(),
        headers: Default::default(),
        user: UserInfo {
            name: "system:serviceaccount:kube-system:generic-garbage-collector".into(),
            groups: vec![
                "system:serviceaccounts".into(),
                "system:authenticated".into(),
            ],
        },
        body: Default::default(),
    }
}

async fn delete(state: &State, at: &ObjectRef, propagation: &str) {
    let (key, ns, name) = at;
    let Some(res) = resource_for(state, key) else {
        return;
    };
    let call = system_call(&res, ns, name, "delete");
    let opts = DeleteOptions {
        propagation: Some(propagation.into()),
        ..Default::default()
    };
    if let Err(e) = delete_one(state, &call, &res, ns, name, &opts).await
        && e.code != 404
    {
        tracing::warn!(resource = %res.resource, namespace = %ns, %name, "garbage collector: delete failed: {e}");
    }
}

/// Read-modify-write of one object as the collector, retried on conflicts.
fn modify(state: &State, at: &ObjectRef, change: impl Fn(&mut Value) -> bool) {
    let (key, ns, name) = at;
    let Some(res) = resource_for(state, key) else {
        return;
    };
    for _ in 0..8 {
        let Some(doc) = state.store.get(key, ns, name) else {
            return;
        };
        let mut obj = doc.value();
        if !change(&mut obj) {
            return;
        }
        let done = if crate::objects::is_deleting(&obj)
            && crate::objects::finalizers(&obj).is_empty()
            && !(res.group.is_empty()
                && res.resource == "namespaces"
                && obj["spec"]["finalizers"]
                    .as_array()
                    .is_some_and(|f| !f.is_empty()))
        {
            state
                .remove_object(&res, ns, name, Some(doc.rv))
                .map(|_| ())
        } else {
            state
                .update_object(&res, ns, name, doc.rv, &mut obj)
                .map(|_| ())
        };
        match done {
            Ok(()) => return,
            Err(e) if e.code == 409 => continue,
            Err(e) => {
                tracing::warn!(%key, namespace = %ns, %name, "garbage collector: update failed: {e}");
                return;
            }
        }
    }
}

fn remove_finalizer(state: &State, at: &ObjectRef, finalizer: &str) {
    modify(state, at, |obj| {
        let before = crate::objects::finalizers(obj);
        let after: Vec<String> = before.iter().filter(|f| *f != finalizer).cloned().collect();
        if after.len() == before.len() {
            return false;
        }
        obj["metadata"]["finalizers"] = json!(after);
        true
    });
}

/// An owner disappeared: dependents with no other live owner are deleted; the others lose
/// the reference.
async fn owner_gone(state: &State, index: &mut Index, owner: &Doc) {
    let owner_uid = owner.uid.to_string();
    let dependents: Vec<ObjectRef> = index
        .dependents
        .remove(&owner_uid)
        .into_iter()
        .flatten()
        .collect();
    for at in dependents {
        let Some(doc) = state.store.get(&at.0, &at.1, &at.2) else {
            continue;
        };
        let live_owner = doc
            .owners
            .iter()
            .any(|u| **u != *owner_uid && index.objects.contains_key(&**u));
        if live_owner {
            modify(state, &at, |obj| {
                let Some(refs) = obj["metadata"]["ownerReferences"].as_array_mut() else {
                    return false;
                };
                let before = refs.len();
                refs.retain(|r| r["uid"] != owner_uid.as_str());
                before != refs.len()
            });
        } else {
            delete(state, &at, "Background").await;
        }
    }
    // Owners waiting in foreground deletion may now be free to go.
    for u in owner.owners.iter() {
        if let Some(at) = index.objects.get(&**u) {
            index.pending.insert(at.clone());
        }
    }
    if !owner.namespace.is_empty() {
        index.pending.insert((
            "/namespaces".into(),
            String::new(),
            owner.namespace.to_string(),
        ));
    }
}

async fn examine(state: &State, index: &mut Index, key: &str, doc: &Doc) {
    let at = (
        key.to_string(),
        doc.namespace.to_string(),
        doc.name.to_string(),
    );
    // A dependent whose owners all are gone is garbage.
    if !doc.owners.is_empty() && !doc.owners.iter().any(|u| index.objects.contains_key(&**u)) {
        delete(state, &at, "Background").await;
        return;
    }
    if !doc.deleting {
        return;
    }
    let obj = doc.value();
    let finalizers = crate::objects::finalizers(&obj);
    let dependents: Vec<ObjectRef> = index
        .dependents
        .get(&*doc.uid)
        .map(|d| d.iter().cloned().collect())
        .unwrap_or_default();
    if finalizers.iter().any(|f| f == "orphan") {
        let uid = doc.uid.to_string();
        for dep in &dependents {
            modify(state, dep, |o| {
                let Some(refs) = o["metadata"]["ownerReferences"].as_array_mut() else {
                    return false;
                };
                let before = refs.len();
                refs.retain(|r| r["uid"] != uid.as_str());
                before != refs.len()
            });
        }
        remove_finalizer(state, &at, "orphan");
    } else if finalizers.iter().any(|f| f == "foregroundDeletion") {
        if dependents.is_empty() {
            remove_finalizer(state, &at, "foregroundDeletion");
        } else {
            for dep in &dependents {
                let deleting = state
                    .store
                    .get(&dep.0, &dep.1, &dep.2)
                    .is_some_and(|d| d.deleting);
                if !deleting {
                    delete(state, dep, "Foreground").await;
                }
            }
            index.pending.insert(at);
        }
    } else if key == "/namespaces" {
        terminate_namespace(state, index, &doc.name, &obj).await;
    }
}

/// Empties a Terminating namespace, then releases its `kubernetes` finalizer.
async fn terminate_namespace(state: &State, index: &mut Index, ns: &str, obj: &Value) {
    let spec_finalizers: Vec<String> = obj["spec"]["finalizers"]
        .as_array()
        .map(|f| {
            f.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    if !spec_finalizers.iter().any(|f| f == "kubernetes") {
        // Nothing of ours left: the namespace goes once other finalizers are done.
        if crate::objects::finalizers(obj).is_empty()
            && let Some(res) = resource_for(state, "/namespaces")
        {
            let _ = state.remove_object(&res, "", ns, None);
        }
        return;
    }
    let namespaced: Vec<Arc<ResourceInfo>> = state
        .registry
        .read()
        .stored_resources()
        .into_iter()
        .filter(|r| r.namespaced)
        .collect();
    let mut remaining = 0;
    for res in namespaced {
        let (_, docs) = state.store.list(&res.storage_key(), Some(ns), None);
        for doc in docs {
            remaining += 1;
            if !doc.deleting {
                delete(
                    state,
                    &(res.storage_key(), ns.to_string(), doc.name.to_string()),
                    "Background",
                )
                .await;
            }
        }
    }
    let at = ("/namespaces".to_string(), String::new(), ns.to_string());
    if remaining > 0 {
        index.pending.insert(at);
        return;
    }
    modify(state, &at, |o| {
        let Some(f) = o["spec"]["finalizers"].as_array_mut() else {
            return false;
        };
        f.retain(|x| x != "kubernetes");
        true
    });
}
