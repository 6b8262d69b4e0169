//! The supervisor of the consumer's links: keeps [`Links`] equal to the authenticated
//! Peerings and runs each provider's tasks (virtual node, virtual kubelet, kubelet API, fence,
//! reflection), restarting them when the link's identity changes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use futures::StreamExt;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tandem_api::Peering;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::consumer::link::{Links, ProviderLink, link_for};
use crate::context::Ctx;

/// Keeps `links` equal to the authenticated Peerings, and runs the per-provider tasks of each
/// link (restarting them when its identity changes, stopping them when it goes).
pub async fn supervise(ctx: Ctx, links: Links) {
    let publisher = tokio::spawn(publish(ctx.clone(), links.clone()));
    let mut rx = links.subscribe();
    let mut running: BTreeMap<String, (String, JoinSet<()>)> = BTreeMap::new();
    // The kubelet API of each virtual node outlives restarts of the other tasks: its address
    // (in the node's status) stays the one the API server dials. It reads the link per request.
    let mut kubelets: BTreeMap<String, (JoinSet<()>, watch::Receiver<Option<SocketAddr>>)> =
        BTreeMap::new();
    loop {
        let current = rx.borrow_and_update().clone();
        running.retain(|id, (key, _)| current.get(id).is_some_and(|l| &restart_key(l) == key));
        kubelets.retain(|id, _| current.contains_key(id));
        for (id, link) in &current {
            if running.contains_key(id) {
                continue;
            }
            tracing::info!(provider = %id, "starting virtual node, virtual kubelet, fence and reflection");
            let (_, kubelet_endpoint) = kubelets.entry(id.clone()).or_insert_with(|| {
                let (endpoint, published) = watch::channel(None);
                let mut task = JoinSet::new();
                task.spawn(crate::consumer::kubelet_api::run(
                    ctx.clone(),
                    links.watch(id),
                    endpoint,
                ));
                (task, published)
            });
            let mut tasks = JoinSet::new();
            tasks.spawn(crate::consumer::virtual_node::run(
                ctx.clone(),
                links.watch(id),
                kubelet_endpoint.clone(),
            ));
            tasks.spawn(crate::consumer::vk::run(ctx.clone(), links.watch(id)));
            tasks.spawn(crate::consumer::fence::run(ctx.clone(), links.watch(id)));
            tasks.spawn(crate::consumer::reflection::run(
                ctx.clone(),
                links.watch(id),
            ));
            running.insert(id.clone(), (restart_key(link), tasks));
        }
        if rx.changed().await.is_err() {
            break;
        }
    }
    publisher.abort();
}

/// What the per-provider tasks of a link depend on without re-reading it: the identity (their
/// clients). The rest (grant, labels, the network once negotiated) they follow on the link.
fn restart_key(link: &ProviderLink) -> String {
    link.identity_version.clone()
}

/// Watches Peerings and publishes the link of each authenticated one.
///
/// A link is worked out again only for a Peering that changed since (or at the resync, every
/// 30 s, when an identity renewed in its Secret is picked up): working one out reads the
/// identity Secret and builds two clients, and redoing that for every Peering on every event
/// made peering with many providers at once quadratic (32 at once spent about a second here).
async fn publish(ctx: Ctx, links: Links) {
    use futures::FutureExt as _;
    let api: Api<Peering> = Api::all(ctx.client.clone());
    let mut stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut peerings: BTreeMap<String, Peering> = BTreeMap::new();
    let mut relisted: Option<BTreeMap<String, Peering>> = None;
    // Per Peering: the resourceVersion its link was worked out from, and the link.
    let mut worked_out: BTreeMap<String, (String, Option<ProviderLink>)> = BTreeMap::new();
    let mut resync = tokio::time::interval(Duration::from_secs(30));
    loop {
        let mut event = tokio::select! {
            event = stream.next() => Some(event),
            _ = resync.tick() => {
                worked_out.clear();
                None
            }
        };
        // Every event already here, then one look at the result.
        while let Some(next) = event {
            match next {
                Some(Ok(watcher::Event::Apply(p))) => {
                    peerings.insert(p.name_any(), p);
                }
                Some(Ok(watcher::Event::Delete(p))) => {
                    peerings.remove(&p.name_any());
                }
                // A (re)list: what was known stands until it is complete, so that no link
                // (and no task of it) goes for a Peering not listed again yet.
                Some(Ok(watcher::Event::Init)) => relisted = Some(BTreeMap::new()),
                Some(Ok(watcher::Event::InitApply(p))) => {
                    if let Some(relisted) = relisted.as_mut() {
                        relisted.insert(p.name_any(), p);
                    }
                }
                Some(Ok(watcher::Event::InitDone)) => {
                    if let Some(relisted) = relisted.take() {
                        peerings = relisted;
                    }
                }
                Some(Err(e)) => tracing::warn!(error = %e, "watching Peerings"),
                None => return,
            }
            event = stream.next().now_or_never();
        }
        let live: Vec<&Peering> = peerings
            .values()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        worked_out.retain(|name, _| {
            peerings
                .get(name)
                .is_some_and(|p| p.metadata.deletion_timestamp.is_none())
        });
        // Clients of providers with no Peering left (one removed without unpeering). A
        // Peering being deleted keeps them: its unpeering still reaches the provider.
        ctx.peer_clients.keep_only(
            &peerings
                .values()
                .map(|p| p.spec.cluster_id.clone())
                .collect(),
        );
        let changed: Vec<&Peering> = live
            .iter()
            .copied()
            .filter(|p| {
                worked_out.get(&p.name_any()).map(|(v, _)| v.as_str())
                    != Some(p.resource_version().unwrap_or_default().as_str())
            })
            .collect();
        // Side by side: each waits on the API server for its Secret.
        let results = futures::future::join_all(changed.iter().map(|p| link_for(&ctx, p))).await;
        for (peering, result) in changed.iter().zip(results) {
            let name = peering.name_any();
            match result {
                Ok(link) => {
                    let version = peering.resource_version().unwrap_or_default();
                    worked_out.insert(name, (version, link));
                }
                Err(e) => {
                    // Not remembered: tried again at the next event or resync.
                    worked_out.remove(&name);
                    tracing::warn!(peering = %name, error = %crate::error::chain(&e), "no link");
                }
            }
        }
        // The clients are the kept ones (`PeerClients`) while the identity is the same.
        let next: BTreeMap<String, ProviderLink> = worked_out
            .values()
            .filter_map(|(_, link)| link.clone())
            .map(|link| (link.provider_id.clone(), link))
            .collect();
        links.set(next);
    }
}
