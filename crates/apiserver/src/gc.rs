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

/// Deletes the object at `at`, only if it is still `doc` as the collector decided on it: its
/// UID (not a namesake made since) and, with `unchanged`, its resourceVersion too (not since
/// given another owner). kube-controller-manager's collector deletes with a UID precondition
/// too. A refused precondition is no failure: the change that made the object differ comes
/// through the feed, and the object is looked at again then.
async fn delete(state: &State, at: &ObjectRef, doc: &Doc, unchanged: bool, propagation: &str) {
    let (key, ns, name) = at;
    let Some(res) = resource_for(state, key) else {
        return;
    };
    let call = system_call(&res, ns, name, "delete");
    let opts = DeleteOptions {
        propagation: Some(propagation.into()),
        uid: Some(doc.uid.to_string()),
        rv: unchanged.then_some(doc.rv),
        ..Default::default()
    };
    match delete_one(state, &call, &res, ns, name, &opts).await {
        Ok(_) => {}
        Err(e) if e.code == 404 => {}
        Err(e) if e.code == 409 => {
            tracing::debug!(resource = %res.resource, namespace = %ns, %name, "garbage collector: changed since examined, not deleted: {e}");
        }
        Err(e) => {
            tracing::warn!(resource = %res.resource, namespace = %ns, %name, "garbage collector: delete failed: {e}");
        }
    }
}

/// Whether `doc` (in namespace `ns`) has an owner other than `gone_uid` that exists. The
/// index answers first; an owner it does not know is looked up in the store by its reference
/// (kind, name, UID), as kube-controller-manager's collector looks an owner up before calling
/// a dependent garbage: the index follows the change feed, which may not yet have reached an
/// owner made a moment ago that the dependent was just given (a node made again, its lease
/// handed to it).
fn has_live_owner(state: &State, index: &Index, ns: &str, doc: &Doc, gone_uid: &str) -> bool {
    if doc
        .owners
        .iter()
        .any(|u| **u != *gone_uid && index.objects.contains_key(&**u))
    {
        return true;
    }
    let obj = doc.value();
    let Some(refs) = obj["metadata"]["ownerReferences"].as_array() else {
        return false;
    };
    refs.iter().any(|r| {
        let (Some(uid), Some(kind), Some(name)) =
            (r["uid"].as_str(), r["kind"].as_str(), r["name"].as_str())
        else {
            return false;
        };
        if uid == gone_uid {
            return false;
        }
        let api_version = r["apiVersion"].as_str().unwrap_or_default();
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        let Some(res) = state.registry.read().by_kind(group, kind) else {
            return false;
        };
        let owner_ns = if res.namespaced { ns } else { "" };
        state
            .store
            .get(&res.storage_key(), owner_ns, name)
            .is_some_and(|owner| *owner.uid == *uid)
    })
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
        // As stored now, and still naming the owner: not a namesake made since, nor one
        // whose references changed (its own event decides then).
        let Some(doc) = state
            .store
            .get(&at.0, &at.1, &at.2)
            .filter(|d| d.owners.iter().any(|u| **u == *owner_uid))
        else {
            continue;
        };
        if has_live_owner(state, index, &at.1, &doc, &owner_uid) {
            modify(state, &at, |obj| {
                let Some(refs) = obj["metadata"]["ownerReferences"].as_array_mut() else {
                    return false;
                };
                let before = refs.len();
                refs.retain(|r| r["uid"] != owner_uid.as_str());
                before != refs.len()
            });
        } else {
            delete(state, &at, &doc, true, "Background").await;
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
    // A dependent whose owners all are gone is garbage. `doc` may be older than the stored
    // object (the feed lags): the delete holds only if the object is still this version.
    if !doc.owners.is_empty() && !has_live_owner(state, index, &doc.namespace, doc, "") {
        delete(state, &at, doc, true, "Background").await;
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
                if let Some(d) = state.store.get(&dep.0, &dep.1, &dep.2)
                    && !d.deleting
                    && d.owners.iter().any(|u| **u == *doc.uid)
                {
                    delete(state, dep, &d, false, "Foreground").await;
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
                let at = (res.storage_key(), ns.to_string(), doc.name.to_string());
                delete(state, &at, &doc, false, "Background").await;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn configmap(name: &str, uid: &str, owners: &[(&str, &str)]) -> Value {
        let owners: Vec<Value> = owners
            .iter()
            .map(|(name, uid)| json!({"apiVersion": "v1", "kind": "ConfigMap", "name": name, "uid": uid}))
            .collect();
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": "default", "uid": uid,
                            "ownerReferences": owners}})
    }

    /// The collector's index follows the change feed, which can lag the store. A dependent
    /// whose owner went, and that was given meanwhile another owner the index has not seen
    /// yet, is kept; so is one an older event still shows with only the gone owner.
    #[tokio::test]
    async fn a_dependent_given_an_owner_the_feed_has_not_reached_is_kept() {
        let server = crate::ApiServer::start(crate::Config::default())
            .await
            .unwrap();
        let state = server.state();
        let res = state.registry.read().preferred("", "configmaps").unwrap();
        let key = res.storage_key();
        let create = |name: &str, uid: &str, owners: &[(&str, &str)]| {
            state
                .create_object(&res, "default", name, &mut configmap(name, uid, owners))
                .unwrap()
        };
        let old = create("old-owner", "uid-old", &[]);
        let dependent = create("dependent", "uid-dep", &[("old-owner", "uid-old")]);
        // What the collector knew so far: the old owner and its dependent.
        let mut index = Index::default();
        index.put(&key, &old);
        index.put(&key, &dependent);
        // Past the index's reach: a new owner, the dependent given to it too, the old owner
        // gone.
        create("new-owner", "uid-new", &[]);
        let mut handed = configmap(
            "dependent",
            "uid-dep",
            &[("old-owner", "uid-old"), ("new-owner", "uid-new")],
        );
        state
            .update_object(&res, "default", "dependent", dependent.rv, &mut handed)
            .unwrap();
        let gone = state
            .remove_object(&res, "default", "old-owner", None)
            .unwrap();
        index.remove(&key, &gone);
        owner_gone(state, &mut index, &gone).await;
        assert!(
            state.store.get(&key, "default", "dependent").is_some(),
            "the dependent of a gone owner was deleted though it has another owner now"
        );
        // The dependent's first event, as the feed delivers it late: owned by the gone owner.
        examine(state, &mut index, &key, &dependent).await;
        assert!(
            state.store.get(&key, "default", "dependent").is_some(),
            "a stale event of the dependent deleted it though it has another owner now"
        );
    }
}
