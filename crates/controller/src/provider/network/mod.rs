//! Network negotiation, provider side: publish the provider's `NetworkParameters` in each tenant
//! namespace and remap the consumer's CIDRs (written into the status of the consumer's
//! `NetworkParameters`). Also the cluster's persisted IPAM, shared with the consumer side.

use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use tandem_api::client;
use tandem_api::{NetworkParameters, Peering, Tenant, names};
use tandem_core::ipam::{Grant, Ipam, IpamConfig, IpamState};

use crate::context::Ctx;
pub use crate::ipam_cache::IpamCache;
use crate::rbac::{CONSUMER_NETWORK_PARAMETERS, PROVIDER_NETWORK_PARAMETERS};

mod plan;

pub use plan::IPAM_CONFIG_MAP;
use plan::{Skip, Step, Unwritten, Write};

/// Why the IPAM could not map or release a peer's prefixes.
#[derive(Debug, thiserror::Error)]
pub enum IpamError {
    #[error("IPAM ConfigMap {ns}/{IPAM_CONFIG_MAP}", ns = names::SYSTEM_NAMESPACE)]
    Api(#[from] kube::Error),
    #[error("IPAM")]
    Ipam(#[from] tandem_core::ipam::IpamError),
    #[error("IPAM: reading the cluster's settings")]
    Settings(#[from] crate::install::InstallError),
    #[error("IPAM: {cidr:?} is not a CIDR")]
    Cidr {
        cidr: String,
        #[source]
        source: ipnet::AddrParseError,
    },
    #[error("IPAM ConfigMap {ns}/{IPAM_CONFIG_MAP}: too many concurrent updates", ns = names::SYSTEM_NAMESPACE)]
    Contended,
    #[error("IPAM ConfigMap {ns}/{IPAM_CONFIG_MAP} is missing: reading the remaps the Peerings and NetworkParameters record", ns = names::SYSTEM_NAMESPACE)]
    Records(#[source] kube::Error),
    #[error("this cluster's gateway key for the peer")]
    GatewayKey(#[from] crate::fabric::KeyError),
}

impl From<plan::NotACidr> for IpamError {
    fn from(plan::NotACidr { cidr, source }: plan::NotACidr) -> Self {
        IpamError::Cidr { cidr, source }
    }
}

/// Runs `f` on the persisted IPAM and stores the result (optimistic concurrency, retried).
async fn with_ipam<T>(
    ctx: &Ctx,
    settings: &crate::install::ClusterSettings,
    mut f: impl FnMut(&mut Ipam) -> Result<T, tandem_core::ipam::IpamError>,
) -> Result<T, IpamError> {
    let config = plan::ipam_config(&settings.pod_cidr, &settings.external_cidr)?;
    let maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), names::SYSTEM_NAMESPACE);
    let mut cache = ctx.ipam.0.lock().await;
    for _ in 0..10 {
        // Taken out: an error or a conflict below leaves the cache empty, read again next.
        let (current, rebuilt) = match cache.take() {
            Some(known) => (known, None),
            None => match maps.get_opt(IPAM_CONFIG_MAP).await? {
                Some(map) => (Some(map), None),
                // Missing (deleted by hand, say) while peerings may remain: a fresh state
                // would remap live peers anew and hand their prefixes out again.
                None => (
                    None,
                    Some(
                        recorded_state(ctx, &config)
                            .await
                            .map_err(IpamError::Records)?,
                    ),
                ),
            },
        };
        // What is stored: a state rebuilt from the records is written even if `f` changes
        // nothing.
        let stored = plan::stored_state(current.as_ref());
        let start = rebuilt.unwrap_or_else(|| stored.clone());
        let mut ipam = Ipam::with_state(config.clone(), start)?;
        let out = f(&mut ipam)?;
        let result = match plan::store(current.as_ref(), &stored, ipam.state()) {
            Err(Unwritten::Unchanged) => {
                *cache = Some(current);
                return Ok(out);
            }
            Ok(Write::Delete { resource_version }) => {
                let dp = kube::api::DeleteParams {
                    preconditions: Some(kube::api::Preconditions {
                        resource_version,
                        uid: None,
                    }),
                    ..Default::default()
                };
                match maps.delete(IPAM_CONFIG_MAP, &dp).await {
                    Ok(_) => {}
                    Err(e) if client::is_conflict(&e) || client::is_not_found(&e) => continue,
                    Err(e) => return Err(e.into()),
                }
                *cache = Some(None);
                return Ok(out);
            }
            Ok(Write::Replace(map)) => {
                match maps
                    .replace(IPAM_CONFIG_MAP, &PostParams::default(), &map)
                    .await
                {
                    // Deleted since read (by hand): made again with the whole state this
                    // process knew, which the records may not all show yet.
                    Err(e) if client::is_not_found(&e) => {
                        maps.create(&PostParams::default(), &plan::ipam_map(ipam.state()))
                            .await
                    }
                    replaced => replaced,
                }
            }
            Ok(Write::Create(map)) => maps.create(&PostParams::default(), &map).await,
        };
        match result {
            Ok(stored) => {
                *cache = Some(Some(stored));
                return Ok(out);
            }
            Err(e) if client::is_conflict(&e) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(IpamError::Contended)
}

/// The grants this cluster's own objects record, for when the IPAM ConfigMap is missing (see
/// [`plan::rebuild_state`]).
async fn recorded_state(ctx: &Ctx, config: &IpamConfig) -> kube::Result<IpamState> {
    // At once: a cluster's first IPAM change (no ConfigMap yet) waits on these.
    let all = ListParams::default();
    let (peerings, parameters, tenants) = (
        Api::<Peering>::all(ctx.client.clone()),
        Api::<NetworkParameters>::all(ctx.client.clone()),
        Api::<Tenant>::all(ctx.client.clone()),
    );
    let (peerings, parameters, tenants) = tokio::try_join!(
        peerings.list(&all),
        parameters.list(&all),
        tenants.list(&all)
    )?;
    let state = plan::rebuild_state(config, &peerings.items, &tenants.items, &parameters.items);
    if !state.peers.is_empty() {
        tracing::warn!(
            peers = state.peers.len(),
            "IPAM ConfigMap {}/{IPAM_CONFIG_MAP} was missing: rebuilt from the remaps Peerings and NetworkParameters record",
            names::SYSTEM_NAMESPACE
        );
    }
    Ok(state)
}

/// Maps `peer`'s prefixes into this cluster (same prefix when free, else remapped).
/// `settings` are the cluster's, as the caller read them.
pub async fn map_peer(
    ctx: &Ctx,
    settings: &crate::install::ClusterSettings,
    peer: &str,
    prefixes: &[IpNet],
) -> Result<Vec<Grant>, IpamError> {
    with_ipam(ctx, settings, |ipam| ipam.map_peer(peer, prefixes)).await
}

/// Forgets `peer`'s prefixes (on unpeer), unless a peering with it is left in the other
/// direction: both relations of a pair share the mapping (and the tunnel).
pub async fn release_peer(ctx: &Ctx, peer: &str) -> Result<(), IpamError> {
    if crate::fabric::live_relation(&ctx.client, Some(peer)).await? {
        return Ok(());
    }
    let settings = ctx.settings().await?;
    with_ipam(ctx, &settings, |ipam| {
        ipam.release_peer(peer);
        Ok(())
    })
    .await
}

/// Whether `consumer` has published its `NetworkParameters` in its tenant namespace: it does so
/// with the identity an approval issued, so this is how the provider knows the identity is in use.
pub async fn consumer_published(
    client: &kube::Client,
    consumer: &str,
) -> Result<bool, kube::Error> {
    Ok(
        Api::<NetworkParameters>::namespaced(client.clone(), &names::tenant_namespace(consumer))
            .get_opt(CONSUMER_NETWORK_PARAMETERS)
            .await?
            .is_some(),
    )
}

/// Publishes (server-side apply) the provider's `NetworkParameters` in `consumer`'s tenant namespace.
pub async fn ensure_provider_parameters(ctx: &Ctx, consumer: &str) -> Result<(), IpamError> {
    let settings = ctx.settings().await?;
    let key = crate::fabric::gateway_key(ctx, consumer).await?;
    let endpoint =
        crate::fabric::gateway::local_endpoint(ctx, consumer, settings.gateway_service_type)
            .await?;
    publish(
        ctx,
        consumer,
        &ours(ctx, &settings, &key.public_key, endpoint.as_deref()),
    )
    .await?;
    Ok(())
}

/// The provider's parameters for a consumer, as they are published.
fn ours(
    ctx: &Ctx,
    settings: &crate::install::ClusterSettings,
    public_key: &str,
    endpoint: Option<&str>,
) -> tandem_api::NetworkParametersSpec {
    plan::ours(
        &ctx.identity.cluster_id,
        &settings.pod_cidr,
        &settings.external_cidr,
        public_key,
        endpoint,
    )
}

/// Returns the resourceVersion written.
async fn publish(
    ctx: &Ctx,
    consumer: &str,
    spec: &tandem_api::NetworkParametersSpec,
) -> Result<Option<String>, IpamError> {
    let api: Api<NetworkParameters> =
        Api::namespaced(ctx.client.clone(), &names::tenant_namespace(consumer));
    let written = api
        .patch(
            PROVIDER_NETWORK_PARAMETERS,
            &PatchParams::apply(names::FIELD_MANAGER).force(),
            &Patch::Apply(plan::provider_parameters(spec)),
        )
        .await?;
    Ok(written.resource_version())
}

/// Every second, and as soon as a consumer publishes or changes its parameters: for each
/// Tenant, keep the provider's parameters published and remap the consumer's.
///
/// Both sides' parameters are read from a cache the watch keeps (a peering's negotiation
/// writes them several times, each write an event), and an event sweeps only the tenant
/// namespace it came from, unless the sweep's own write caused it; the one-second sweep goes
/// over every Tenant. While the watch keeps failing (see [`WatchHealth`]) the one-second sweep
/// reads them from the API instead: a cache that stopped at its last listing would never see
/// a new consumer's parameters.
///
/// [`WatchHealth`]: crate::watches::WatchHealth
pub async fn run(ctx: Ctx) {
    use crate::watches::{WatchHealth, WatchTracker};
    use futures::{FutureExt as _, StreamExt as _};
    use kube::runtime::{WatchStreamExt as _, reflector, watcher};
    // The IPAM read now (and rebuilt, if its ConfigMap is missing), not by the first
    // negotiation: every negotiation waits on it. A failure is met again by that negotiation.
    let warmed = match ctx.settings().await {
        Ok(settings) => with_ipam(&ctx, &settings, |_| Ok(())).await,
        Err(e) => Err(e.into()),
    };
    if let Err(e) = warmed {
        tracing::debug!(error = %crate::error::chain(&e), "reading the IPAM at start");
    }
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let (parameters, writer) = reflector::store();
    let mut events = reflector(
        writer,
        watcher(
            Api::<NetworkParameters>::all(ctx.client.clone()),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .boxed();
    // The cache is complete once the first listing is: no sweep from it before (from the
    // API only if the watch fails before it lists).
    let mut tracker = WatchTracker::new("NetworkParameters");
    // The last error listing them from the API, warned about once.
    let mut list_error: Option<String> = None;
    // (namespace, name, resourceVersion) of the sweeps' own writes, until their events come
    // (bounded: a relist replaces events).
    let mut own: Vec<(String, String, String)> = Vec::new();
    loop {
        // None: every Tenant; Some: the tenant namespaces whose parameters changed.
        let only = tokio::select! {
            _ = tick.tick() => None,
            event = events.next() => {
                let Some(event) = event else {
                    // A watcher with backoff never ends; were it to, polling it again would
                    // spin.
                    tracing::error!("the NetworkParameters watch ended: provider-side network negotiation stops");
                    return;
                };
                let mut changed = std::collections::BTreeSet::new();
                let mut relisted = false;
                let mut note = |event: Result<watcher::Event<NetworkParameters>, _>| {
                    tracker.note(&event);
                    match event {
                        Ok(watcher::Event::Apply(p) | watcher::Event::Delete(p)) => {
                            let ns = p.namespace().unwrap_or_default();
                            let key = (ns.clone(), p.name_any(), p.resource_version().unwrap_or_default());
                            match own.iter().position(|o| o == &key) {
                                Some(i) => {
                                    own.swap_remove(i);
                                }
                                None => {
                                    changed.insert(ns);
                                }
                            }
                        }
                        Ok(watcher::Event::InitDone) => relisted = true,
                        Ok(_) | Err(_) => {}
                    }
                };
                note(event);
                // Every event already here, then one sweep (the events of its own writes
                // are recognised by their resourceVersion and sweep nothing).
                // (A stream that ended stops the drain; the next `select!` returns.)
                while let Some(Some(event)) = events.next().now_or_never() {
                    note(event);
                }
                match (relisted, changed.is_empty()) {
                    (true, _) => None,
                    (false, true) => continue,
                    (false, false) => Some(changed),
                }
            }
        };
        if own.len() > 256 {
            own.clear();
        }
        let swept = match tracker.health() {
            WatchHealth::Listing => continue,
            WatchHealth::Fresh => {
                let cached = |ns: &str, name: &str| {
                    parameters.get(&kube::runtime::reflector::ObjectRef::new(name).within(ns))
                };
                sweep(&ctx, &cached, only.as_ref(), &mut own).await
            }
            WatchHealth::Stale => match listed_from_api(&ctx).await {
                Ok(listed) => {
                    list_error = None;
                    let read =
                        |ns: &str, name: &str| listed.get(&(ns.into(), name.into())).cloned();
                    sweep(&ctx, &read, None, &mut own).await
                }
                Err(e) => {
                    let e = e.to_string();
                    if list_error.as_ref() != Some(&e) {
                        tracing::warn!(error = %e, "network negotiation (provider side): listing NetworkParameters while their watch fails");
                    }
                    list_error = Some(e);
                    continue;
                }
            },
        };
        if let Err(e) = swept {
            tracing::warn!(error = %crate::error::chain(&e), "network negotiation (provider side)");
        }
    }
}

/// Every NetworkParameters, read from the API (for a sweep while the watch is stale).
async fn listed_from_api(
    ctx: &Ctx,
) -> kube::Result<std::collections::HashMap<(String, String), Arc<NetworkParameters>>> {
    let listed = Api::<NetworkParameters>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await?;
    Ok(listed
        .items
        .into_iter()
        .map(|p| {
            (
                (p.namespace().unwrap_or_default(), p.name_any()),
                Arc::new(p),
            )
        })
        .collect())
}

/// `parameters(namespace, name)`: the NetworkParameters as the sweep reads them.
async fn sweep(
    ctx: &Ctx,
    parameters: &(dyn Fn(&str, &str) -> Option<Arc<NetworkParameters>> + Sync),
    only: Option<&std::collections::BTreeSet<String>>,
    own: &mut Vec<(String, String, String)>,
) -> Result<(), IpamError> {
    let settings = ctx.settings().await?;
    let tenants = Api::<Tenant>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await?;
    for tenant in tenants.items {
        if plan::in_sweep(&tenant, only).is_err() {
            continue;
        }
        let ns = tenant.namespace().unwrap_or_default();
        let consumer = tenant.spec.cluster_id.clone();
        let parameters_of = |name: &str| parameters(&ns, name);
        let public_key = crate::fabric::gateway_key(ctx, &consumer).await?.public_key;
        let endpoint =
            crate::fabric::gateway::local_endpoint(ctx, &consumer, settings.gateway_service_type)
                .await?;
        let wanted = ours(ctx, &settings, &public_key, endpoint.as_deref());
        if let Ok(Step::Publish(spec)) = plan::publish(
            parameters_of(PROVIDER_NETWORK_PARAMETERS).as_deref(),
            wanted,
        ) && let Some(rv) = publish(ctx, &consumer, &spec).await?
        {
            own.push((ns.clone(), PROVIDER_NETWORK_PARAMETERS.into(), rv));
        }
        let theirs = parameters_of(CONSUMER_NETWORK_PARAMETERS);
        let prefixes = match plan::requested(theirs.as_deref()) {
            Ok(prefixes) => prefixes,
            Err(skip) => {
                if let Skip::UnreadablePodCidr(e) = skip {
                    tracing::warn!(%consumer, error = %e, "consumer pod CIDR");
                }
                continue;
            }
        };
        let Some(theirs) = theirs else { continue };
        let step = match map_peer(ctx, &settings, &consumer, &prefixes).await {
            Ok(grants) => plan::granted(&theirs, &grants),
            // A prefix no peer is granted: said to this consumer, and the other Tenants'
            // sweeps go on.
            Err(IpamError::Ipam(refused @ tandem_core::ipam::IpamError::Refused { .. })) => {
                plan::refused(&consumer, &theirs, &refused)
            }
            Err(e) => return Err(e),
        };
        let Ok(step) = step else { continue };
        if let Step::Refuse { message } = &step {
            tracing::warn!(%consumer, "{message}");
        }
        // Guarded by the version the cache holds: against a newer one (a consumer's change
        // whose event is still on its way) the write is refused, and that event sweeps
        // again. Unguarded, a write that changed nothing would answer with that newer
        // version, and its event would be taken for this write's and skipped.
        let written = Api::<NetworkParameters>::namespaced(ctx.client.clone(), &ns)
            .patch_status(
                CONSUMER_NETWORK_PARAMETERS,
                &PatchParams::default(),
                &Patch::Merge(step.body(
                    theirs.resource_version().as_deref(),
                    k8s_openapi::jiff::Timestamp::now(),
                )),
            )
            .await;
        match written {
            Ok(written) => {
                if let Some(rv) = written.resource_version() {
                    own.push((ns.clone(), CONSUMER_NETWORK_PARAMETERS.into(), rv));
                }
            }
            Err(e) if client::is_conflict(&e) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
