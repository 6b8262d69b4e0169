//! The DaemonSet controller: one pod per eligible node (nodeSelector, required node affinity,
//! taints against tolerations plus the ones kube gives every daemon pod), each pinned to its
//! node by a `metadata.name` node affinity and bound by the scheduler; rolled by RollingUpdate
//! (maxUnavailable, maxSurge) or OnDelete; its templates kept as ControllerRevisions.
//! Observe here, decide in `plan` and `revision`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, DaemonSetStatus};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use parking_lot::Mutex;
use serde_json::json;
use tandem_api::client::{is_conflict, is_not_found};
use tokio::time::Instant;

pub mod plan;
pub mod revision;

pub use plan::{
    Budget, Changes, Fit, GENERATION_ANNOTATION, GENERATION_LABEL, HASH_LABEL, View,
    add_daemon_tolerations, budget, manage, node_should_run, pod_template, rolling_update,
    status_of, target_node,
};

use super::context::Context;
use super::error::{Error, StepExt, drain, key, retry_after_error};
use super::owners::{controller_of, pod_controllers, pod_from_template, selects};

/// At most this many pods are created or deleted in one pass (kube's BurstReplicas).
const BURST: usize = 250;
/// First and longest wait before deleting another failed pod on the same node (kube's
/// failedPodsBackoff of kube-controller-manager: 1 s doubling up to 15 min).
const FAILED_BACKOFF_START: Duration = Duration::from_secs(1);
const FAILED_BACKOFF_MAX: Duration = Duration::from_secs(15 * 60);

/// When each (DaemonSet uid, node) last had a failed pod deleted, and the current delay. Kept in
/// memory, as kube's: a restart only forgets a delay.
type FailedBackoff = Mutex<HashMap<(String, String), (Instant, Duration)>>;
static FAILED_BACKOFF: std::sync::LazyLock<FailedBackoff> =
    std::sync::LazyLock::new(Mutex::default);

/// Nodes of DaemonSet `uid` still in back-off at `now`, and the soonest end of one.
fn nodes_in_backoff(uid: &str, now: Instant) -> (BTreeSet<String>, Option<Duration>) {
    let mut map = FAILED_BACKOFF.lock();
    // Forget entries long idle, as kube's backoff GC.
    map.retain(|_, (at, _)| now.saturating_duration_since(*at) < 2 * FAILED_BACKOFF_MAX);
    let mut soonest: Option<Duration> = None;
    let nodes = map
        .iter()
        .filter(|((u, _), _)| u == uid)
        .filter_map(|((_, node), (at, delay))| {
            let left = (*at + *delay).checked_duration_since(now)?;
            soonest = Some(soonest.map_or(left, |s| s.min(left)));
            Some(node.clone())
        })
        .collect();
    (nodes, soonest)
}

/// Records that failed pods of DaemonSet `uid` were deleted on `nodes` at `now`.
fn back_off(uid: &str, nodes: &[String], now: Instant) {
    let mut map = FAILED_BACKOFF.lock();
    for node in nodes {
        let entry = map
            .entry((uid.to_string(), node.clone()))
            .or_insert((now, Duration::ZERO));
        entry.1 = if entry.1.is_zero() {
            FAILED_BACKOFF_START
        } else {
            (entry.1 * 2).min(FAILED_BACKOFF_MAX)
        };
        entry.0 = now;
    }
}

/// Runs the DaemonSet controller until its watches end.
pub async fn run(client: Client) {
    let controller = Controller::new(
        Api::<DaemonSet>::all(client.clone()),
        watcher::Config::default(),
    );
    let store = controller.store();
    let controller = controller
        .owns(
            Api::<ControllerRevision>::all(client.clone()),
            watcher::Config::default(),
        )
        .watches(
            Api::<Pod>::all(client.clone()),
            watcher::Config::default(),
            move |pod: Pod| {
                pod_controllers(&store, &pod, |ds: &DaemonSet| {
                    ds.spec.as_ref().map(|s| &s.selector)
                })
            },
        )
        .reconcile_all_on(node_changes(client.clone()));
    drain(
        "daemonset",
        controller.run(
            reconcile,
            retry_after_error("daemonset"),
            Arc::new(Context::new(client, "daemonset-controller")),
        ),
    )
    .await;
}

/// One item per change of the node set that can change where daemon pods belong: a node
/// added or deleted, or its labels or taints changed. Heartbeats (status only) are dropped,
/// as kube's shouldIgnoreNodeUpdate does. Watch errors back off (as the controller's own
/// watches do) before they are dropped here: a client that fails at once — as every request
/// does once the runtime is shutting down — would otherwise keep this stream in one endless
/// poll that never yields, which hung a test process's runtime shutdown.
fn node_changes(client: Client) -> impl Stream<Item = ()> + Send + 'static {
    let seen: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let fingerprint = |node: &Node| {
        serde_json::to_string(&(
            &node.metadata.labels,
            node.spec.as_ref().map(|s| (&s.taints, s.unschedulable)),
        ))
        .unwrap_or_default()
    };
    watcher(Api::<Node>::all(client), watcher::Config::default())
        .default_backoff()
        .filter_map(move |event| {
            let seen = seen.clone();
            let changed = match event {
                Ok(watcher::Event::InitApply(node)) => {
                    seen.lock().insert(node.name_any(), fingerprint(&node));
                    false
                }
                Ok(watcher::Event::InitDone) => true,
                Ok(watcher::Event::Apply(node)) => {
                    let print = fingerprint(&node);
                    seen.lock().insert(node.name_any(), print.clone()) != Some(print)
                }
                Ok(watcher::Event::Delete(node)) => {
                    seen.lock().remove(&node.name_any());
                    true
                }
                Ok(watcher::Event::Init) | Err(_) => false,
            };
            futures::future::ready(changed.then_some(()))
        })
}

/// One pass over a DaemonSet. Pods, nodes and revisions are listed from the API server, so
/// the previous pass's creations and deletions are always seen (this replaces kube's
/// expectations), and a manage pass that changed something leaves the rolling update to the
/// next pass, as kube's expectations do.
async fn reconcile(ds: Arc<DaemonSet>, ctx: Arc<Context>) -> Result<Action, Error> {
    let client = &ctx.client;
    let object = key(&ds.metadata);
    let (Some(ns), Some(uid), Some(spec)) = (ds.namespace(), ds.uid(), ds.spec.as_ref()) else {
        return Ok(Action::await_change());
    };
    // A DaemonSet being deleted may have lost its revisions already: kube leaves it alone.
    if ds.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let everything = spec
        .selector
        .match_labels
        .as_ref()
        .is_none_or(|m| m.is_empty())
        && spec
            .selector
            .match_expressions
            .as_ref()
            .is_none_or(|e| e.is_empty());
    if everything {
        tracing::warn!("daemonset {object}: selects all pods; a non-empty selector is required");
        return Ok(Action::await_change());
    }
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .step(&object, "listing nodes")?
        .items;
    let pods = claim_pods(&ctx, &ds, &ns, &uid).await?;
    let (hash, old_revisions) = construct_history(&ctx, &ds, &ns, &uid).await?;

    let mut by_node: BTreeMap<String, Vec<Pod>> = BTreeMap::new();
    for pod in &pods {
        // Finished pods already being deleted are history, not daemons.
        let finished = matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        );
        if finished && pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        match target_node(pod) {
            Some(node) => by_node.entry(node).or_default().push(pod.clone()),
            None => tracing::debug!(
                "daemonset {object}: pod {} has no target node",
                pod.name_any()
            ),
        }
    }
    let now = Timestamp::now();
    let (failed_backoff, backoff_ends) = nodes_in_backoff(&uid, Instant::now());
    let view = View {
        ds: &ds,
        nodes: &nodes,
        pods: &by_node,
        hash: &hash,
        now,
        failed_backoff: &failed_backoff,
    };
    let mut changes = manage(&view);
    if changes.is_empty() {
        let desired = nodes
            .iter()
            .filter(|n| node_should_run(&spec.template, n).should_run)
            .count();
        let budget = budget(&ds, i32::try_from(desired).unwrap_or(i32::MAX)).map_err(|reason| {
            Error::Invalid {
                object: object.clone(),
                reason: reason.to_string(),
            }
        })?;
        let (events, backing_off) = (std::mem::take(&mut changes.events), changes.backing_off);
        changes = rolling_update(&view, budget);
        changes.events.extend(events);
        changes.backing_off = backing_off;
    }
    let (status, recheck) = status_of(&view);
    let applied = apply(&ctx, &ds, &ns, &hash, &changes).await;
    back_off(&uid, &changes.failed_on, Instant::now());

    let live: Vec<&str> = pods
        .iter()
        .filter_map(|p| p.labels().get(HASH_LABEL).map(String::as_str))
        .collect();
    let limit = spec.revision_history_limit.unwrap_or(10);
    for old in revision::to_prune(&old_revisions, &live, limit) {
        let name = old.name_any();
        match Api::<ControllerRevision>::namespaced(client.clone(), &ns)
            .delete(&name, &DeleteParams::default())
            .await
        {
            Err(e) if !is_not_found(&e) => {
                return Err(e).step(&object, format!("deleting old revision {name}"));
            }
            _ => {}
        }
    }
    write_status(client, &ds, &ns, status).await?;
    applied?;
    let min_ready = spec.min_ready_seconds.unwrap_or(0).max(0);
    let available_in = recheck.then(|| {
        Duration::from_secs(u64::try_from(min_ready).unwrap_or(0)) + Duration::from_millis(100)
    });
    let backoff_in = backoff_ends.filter(|_| changes.backing_off);
    Ok(match (available_in, backoff_in) {
        (Some(a), Some(b)) => Action::requeue(a.min(b)),
        (Some(d), None) | (None, Some(d)) => Action::requeue(d),
        (None, None) => Action::await_change(),
    })
}

/// The DaemonSet's pods: those it controls and its selector matches, plus matching orphans
/// it adopts; pods it controls that no longer match are released, as kube's ClaimPods.
async fn claim_pods(ctx: &Context, ds: &DaemonSet, ns: &str, uid: &str) -> Result<Vec<Pod>, Error> {
    let object = key(&ds.metadata);
    let selector = &ds.spec.as_ref().expect("checked by the caller").selector;
    let api = Api::<Pod>::namespaced(ctx.client.clone(), ns);
    let listed = api
        .list(&ListParams::default())
        .await
        .step(&object, "listing pods")?
        .items;
    let owner = ds
        .controller_owner_ref(&())
        .expect("DaemonSet has a name and uid");
    let mut owned = Vec::new();
    for pod in listed {
        let matches = selects(selector, pod.metadata.labels.as_ref());
        let name = pod.name_any();
        let refs = match controller_of(&pod.metadata) {
            Some(r) if r.uid == uid && matches => {
                owned.push(pod);
                continue;
            }
            Some(r) if r.uid == uid => {
                let refs: Vec<_> = pod
                    .owner_references()
                    .iter()
                    .filter(|r| r.uid != uid)
                    .cloned()
                    .collect();
                (refs, false)
            }
            None if matches && pod.metadata.deletion_timestamp.is_none() => {
                let mut refs = pod.owner_references().to_vec();
                refs.push(owner.clone());
                (refs, true)
            }
            _ => continue,
        };
        let (refs, adopting) = refs;
        // The resourceVersion makes this a compare-and-swap with other claimants.
        let patch = json!({"metadata": {
            "ownerReferences": refs,
            "resourceVersion": pod.metadata.resource_version,
        }});
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(adopted) if adopting => owned.push(adopted),
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => {
                let step = if adopting { "adopting" } else { "releasing" };
                return Err(e).step(&object, format!("{step} pod {name}"));
            }
        }
    }
    Ok(owned)
}

/// kube's constructHistory: the revision of the current template (created, or renumbered
/// as the newest when an old template comes back) and the old ones. Returns the current
/// revision's hash.
async fn construct_history(
    ctx: &Context,
    ds: &DaemonSet,
    ns: &str,
    uid: &str,
) -> Result<(String, Vec<ControllerRevision>), Error> {
    let object = key(&ds.metadata);
    let selector = &ds.spec.as_ref().expect("checked by the caller").selector;
    let api = Api::<ControllerRevision>::namespaced(ctx.client.clone(), ns);
    let listed = api
        .list(&ListParams::default())
        .await
        .step(&object, "listing controllerrevisions")?
        .items;
    let mut current = Vec::new();
    let mut old = Vec::new();
    for mut rev in listed {
        if rev.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = rev.name_any();
        match controller_of(&rev.metadata) {
            Some(r) if r.uid == uid => {}
            None if selects(selector, rev.metadata.labels.as_ref()) => {
                let mut refs = rev.owner_references().to_vec();
                refs.push(ds.controller_owner_ref(&()).expect("named"));
                let patch = json!({"metadata": {
                    "ownerReferences": refs,
                    "resourceVersion": rev.metadata.resource_version,
                }});
                rev = match api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                    .await
                {
                    Ok(rev) => rev,
                    Err(e) if is_not_found(&e) => continue,
                    Err(e) => return Err(e).step(&object, format!("adopting revision {name}")),
                };
            }
            _ => continue,
        }
        if !rev.labels().contains_key(HASH_LABEL) {
            // Revisions without the hash label get their name, as kube does.
            let patch = json!({"metadata": {"labels": {HASH_LABEL: name}}});
            rev = api
                .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await
                .step(&object, format!("labelling revision {name}"))?;
        }
        if revision::holds_template_of(ds, &rev) {
            current.push(rev);
        } else {
            old.push(rev);
        }
    }
    let next = old.iter().map(|r| r.revision).max().unwrap_or(0) + 1;
    let cur = if current.is_empty() {
        let snapshot = revision::snapshot(ds, next);
        let name = snapshot.name_any();
        match api.create(&PostParams::default(), &snapshot).await {
            Ok(rev) => rev,
            Err(e) if is_conflict(&e) => {
                let existing = api
                    .get(&name)
                    .await
                    .step(&object, format!("reading revision {name}"))?;
                if !revision::holds_template_of(ds, &existing) {
                    // Another template hashed to the same name: count the collision so the
                    // next hash differs, and try again.
                    let collisions = ds
                        .status
                        .as_ref()
                        .and_then(|s| s.collision_count)
                        .unwrap_or(0);
                    Api::<DaemonSet>::namespaced(ctx.client.clone(), ns)
                        .patch_status(
                            &ds.name_any(),
                            &PatchParams::default(),
                            &Patch::Merge(json!({"status": {"collisionCount": collisions + 1}})),
                        )
                        .await
                        .step(&object, "recording a revision hash collision")?;
                    return Err(Error::Invalid {
                        object,
                        reason: format!("revision {name} holds another template (hash collision)"),
                    });
                }
                existing
            }
            Err(e) => return Err(e).step(&object, format!("creating revision {name}")),
        }
    } else {
        // Duplicates of the current template: keep the newest, as kube's dedupCurHistories.
        current.sort_by_key(|r| r.revision);
        let keep = current.pop().expect("not empty");
        for dup in current {
            let name = dup.name_any();
            match api.delete(&name, &DeleteParams::default()).await {
                Err(e) if !is_not_found(&e) => {
                    return Err(e).step(&object, format!("deleting duplicate revision {name}"));
                }
                _ => {}
            }
        }
        if keep.revision < next {
            let name = keep.name_any();
            api.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"revision": next})),
            )
            .await
            .step(&object, format!("renumbering revision {name}"))?
        } else {
            keep
        }
    };
    let hash = cur.labels().get(HASH_LABEL).cloned().unwrap_or_default();
    Ok((hash, old))
}

/// Creates and deletes what the plan says, with kube's events; creation in slow-start
/// batches (1, 2, 4, ...) so a template the API server rejects costs one request.
async fn apply(
    ctx: &Context,
    ds: &DaemonSet,
    ns: &str,
    hash: &str,
    changes: &Changes,
) -> Result<(), Error> {
    let object = key(&ds.metadata);
    for (reason, note) in &changes.events {
        ctx.event(ds, reason, note.clone()).await;
    }
    let api = Api::<Pod>::namespaced(ctx.client.clone(), ns);
    let spec = ds.spec.as_ref().expect("checked by the caller");
    let generation = plan::template_generation(ds);
    let owner = ds.controller_owner_ref(&()).expect("named");
    let pod_for = |node: &str| {
        let template = pod_template(&spec.template, generation, hash, node);
        pod_from_template(template, &ds.name_any(), ns, owner.clone())
    };
    let nodes: Vec<&String> = changes.create_on.iter().take(BURST).collect();
    let mut failure: Option<(String, kube::Error)> = None;
    let mut done = 0;
    let mut batch = 1;
    while done < nodes.len() && failure.is_none() {
        let slice = &nodes[done..(done + batch).min(nodes.len())];
        let results = join_all(slice.iter().map(|node| {
            let pod = pod_for(node);
            let api = api.clone();
            async move { (api.create(&PostParams::default(), &pod).await, node) }
        }))
        .await;
        for (result, node) in results {
            match result {
                Ok(pod) => {
                    let note = format!("Created pod: {}", pod.name_any());
                    ctx.event(ds, "SuccessfulCreate", note).await;
                }
                Err(e) => failure = Some((format!("creating pod for node {node}"), e)),
            }
        }
        done += slice.len();
        batch *= 2;
    }
    let results = join_all(changes.delete.iter().take(BURST).map(|name| {
        let api = api.clone();
        async move { (api.delete(name, &DeleteParams::default()).await, name) }
    }))
    .await;
    for (result, name) in results {
        match result {
            Ok(_) => {
                let note = format!("Deleted pod: {name}");
                ctx.event(ds, "SuccessfulDelete", note).await;
            }
            Err(e) if is_not_found(&e) => {}
            Err(e) => {
                if failure.is_none() {
                    failure = Some((format!("deleting pod {name}"), e));
                }
            }
        }
    }
    match failure {
        Some((step, e)) => Err(e).step(&object, step),
        None => Ok(()),
    }
}

async fn write_status(
    client: &Client,
    ds: &DaemonSet,
    ns: &str,
    mut status: DaemonSetStatus,
) -> Result<(), Error> {
    let old = ds.status.clone().unwrap_or_default();
    status.collision_count = old.collision_count;
    status.conditions = old.conditions.clone();
    if serde_json::to_value(&status).ok() == serde_json::to_value(&old).ok() {
        return Ok(());
    }
    Api::<DaemonSet>::namespaced(client.clone(), ns)
        .patch_status(
            &ds.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
        .step(&key(&ds.metadata), "updating status")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A node watch against a server that drops every connection retries with backoff — a
    /// handful of attempts in two seconds — instead of retrying as fast as it fails.
    #[tokio::test]
    async fn a_failing_node_watch_backs_off() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let attempts = Arc::new(AtomicUsize::new(0));
        let counted = attempts.clone();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                drop(conn);
            }
        });
        let client = Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
        let changes = node_changes(client);
        futures::pin_mut!(changes);
        let waited = tokio::time::timeout(Duration::from_secs(2), changes.next()).await;
        assert!(waited.is_err(), "no node change can arrive");
        let n = attempts.load(Ordering::SeqCst);
        assert!((1..=10).contains(&n), "{n} watch attempts in 2 s");
    }
}
