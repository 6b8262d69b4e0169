//! Network negotiation, provider side: publish the provider's `NetworkParameters` in each tenant
//! namespace and remap the consumer's CIDRs (written into the status of the consumer's
//! `NetworkParameters`). Also the cluster's persisted IPAM, shared with the consumer side.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tandem_api::{NetworkParameters, Peering, Tenant, names};
use tandem_api::{client, conditions};
use tandem_core::ipam::{Grant, Ipam, IpamConfig, IpamState};

use crate::context::Ctx;
pub use crate::ipam_cache::IpamCache;
use crate::rbac::{CONSUMER_NETWORK_PARAMETERS, PROVIDER_NETWORK_PARAMETERS};

/// ConfigMap (in tandem-system) persisting the IPAM's decisions.
pub const IPAM_CONFIG_MAP: &str = "tandem-ipam";
const IPAM_KEY: &str = "state.json";
/// Where remapped prefixes come from (RFC 1918), minus whatever is local.
const POOLS: &[&str] = &["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"];

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

fn ipam_config(settings: &crate::install::ClusterSettings) -> Result<IpamConfig, IpamError> {
    let parse = |s: &str| {
        s.parse::<IpNet>().map_err(|source| IpamError::Cidr {
            cidr: s.to_string(),
            source,
        })
    };
    Ok(IpamConfig {
        reserved: vec![parse(&settings.pod_cidr)?, parse(&settings.external_cidr)?],
        pools: POOLS.iter().map(|p| parse(p)).collect::<Result<_, _>>()?,
        allowed_public: Vec::new(),
    })
}

/// Runs `f` on the persisted IPAM and stores the result (optimistic concurrency, retried).
async fn with_ipam<T>(
    ctx: &Ctx,
    settings: &crate::install::ClusterSettings,
    mut f: impl FnMut(&mut Ipam) -> Result<T, tandem_core::ipam::IpamError>,
) -> Result<T, IpamError> {
    let config = ipam_config(settings)?;
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
        let stored = stored_state(current.as_ref());
        let start = rebuilt.unwrap_or_else(|| stored.clone());
        let mut ipam = Ipam::with_state(config.clone(), start)?;
        let out = f(&mut ipam)?;
        if ipam.state() == &stored {
            *cache = Some(current);
            return Ok(out);
        }
        if ipam.state().peers.is_empty() {
            // Nothing granted: leave no state behind (unpeer of the last peer).
            if let Some(map) = &current {
                let dp = kube::api::DeleteParams {
                    preconditions: Some(kube::api::Preconditions {
                        resource_version: map.resource_version(),
                        uid: None,
                    }),
                    ..Default::default()
                };
                match maps.delete(IPAM_CONFIG_MAP, &dp).await {
                    Ok(_) => {}
                    Err(e) if client::is_conflict(&e) || client::is_not_found(&e) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            *cache = Some(None);
            return Ok(out);
        }
        let data: BTreeMap<String, String> = [(
            IPAM_KEY.to_string(),
            serde_json::to_string(ipam.state()).expect("state serializes"),
        )]
        .into();
        let fresh = |data: BTreeMap<String, String>| -> ConfigMap {
            serde_json::from_value(json!({
                "metadata": {"name": IPAM_CONFIG_MAP, "namespace": names::SYSTEM_NAMESPACE,
                             "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY}},
                "data": data,
            }))
            .expect("static manifest")
        };
        let result = match current {
            Some(mut map) => {
                map.data = Some(data.clone());
                match maps
                    .replace(IPAM_CONFIG_MAP, &PostParams::default(), &map)
                    .await
                {
                    // Deleted since read (by hand): made again with the whole state this
                    // process knew, which the records may not all show yet.
                    Err(e) if client::is_not_found(&e) => {
                        maps.create(&PostParams::default(), &fresh(data)).await
                    }
                    replaced => replaced,
                }
            }
            None => maps.create(&PostParams::default(), &fresh(data)).await,
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

/// The IPAM state a ConfigMap holds (none: empty).
fn stored_state(map: Option<&ConfigMap>) -> IpamState {
    map.and_then(|m| m.data.as_ref()?.get(IPAM_KEY))
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or_default()
}

/// The grants this cluster's own objects record, for when the IPAM ConfigMap is missing (see
/// [`rebuild_state`]).
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
    let state = rebuild_state(config, &peerings.items, &tenants.items, &parameters.items);
    if !state.peers.is_empty() {
        tracing::warn!(
            peers = state.peers.len(),
            "IPAM ConfigMap {}/{IPAM_CONFIG_MAP} was missing: rebuilt from the remaps Peerings and NetworkParameters record",
            names::SYSTEM_NAMESPACE
        );
    }
    Ok(state)
}

/// The IPAM state the remaps in these objects record: each live Peering's `status.network`
/// (how this cluster, as consumer, maps its provider's prefixes) and each live tenant's
/// NetworkParameters `consumer` (how it, as provider, maps its consumer's). Both relations
/// with one peer share its grants; the first found is kept. A peer whose grants would overlap
/// another's kept so far is left out (it is mapped anew when it negotiates next).
fn rebuild_state(
    config: &IpamConfig,
    peerings: &[Peering],
    tenants: &[Tenant],
    parameters: &[NetworkParameters],
) -> IpamState {
    let grants = |pairs: [(Option<&str>, Option<&str>); 2]| -> Vec<Grant> {
        pairs
            .into_iter()
            .map_while(|(requested, granted)| {
                let requested: IpNet = requested?.parse().ok()?;
                let granted: IpNet = granted?.parse().ok()?;
                // A spec changed since its remap was written pairs the new prefix with the
                // old remap: not a mapping (the peer is mapped anew when it negotiates).
                let same_shape = requested.prefix_len() == granted.prefix_len()
                    && requested.addr().is_ipv4() == granted.addr().is_ipv4();
                same_shape.then_some(Grant { requested, granted })
            })
            .collect()
    };
    let as_consumer = peerings
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let net = p.status.as_ref()?.network.as_ref()?;
            let recorded = grants([
                (
                    Some(net.remote_pod_cidr.as_str()),
                    Some(net.remapped_remote_pod_cidr.as_str()),
                ),
                (
                    net.remote_external_cidr.as_deref(),
                    net.remapped_remote_external_cidr.as_deref(),
                ),
            ]);
            Some((p.spec.cluster_id.clone(), recorded))
        });
    let as_provider = tenants
        .iter()
        .filter(|t| t.metadata.deletion_timestamp.is_none())
        .filter_map(|t| {
            let theirs = parameters.iter().find(|p| {
                p.namespace() == t.namespace() && p.name_any() == CONSUMER_NETWORK_PARAMETERS
            })?;
            let status = theirs.status.clone().unwrap_or_default();
            let recorded = grants([
                (
                    Some(theirs.spec.pod_cidr.as_str()),
                    status.remapped_pod_cidr.as_deref(),
                ),
                (
                    theirs.spec.external_cidr.as_deref(),
                    status.remapped_external_cidr.as_deref(),
                ),
            ]);
            Some((t.spec.cluster_id.clone(), recorded))
        });
    let mut state = IpamState::default();
    for (peer, grants) in as_consumer.chain(as_provider) {
        if grants.is_empty() || state.peers.contains_key(&peer) {
            continue;
        }
        let mut with = state.clone();
        with.peers.insert(peer.clone(), grants);
        match Ipam::with_state(config.clone(), with) {
            Ok(ipam) => state = ipam.state().clone(),
            Err(e) => {
                tracing::warn!(%peer, "IPAM ConfigMap missing: a recorded remap is left out: {e}")
            }
        }
    }
    state
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
    let endpoint = crate::fabric::gateway::local_endpoint(ctx, consumer).await?;
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
    tandem_api::NetworkParametersSpec {
        cluster_id: ctx.identity.cluster_id.clone(),
        pod_cidr: settings.pod_cidr.clone(),
        external_cidr: Some(settings.external_cidr.clone()),
        public_key: Some(public_key.to_string()),
        gateway_endpoint: endpoint.map(str::to_string),
    }
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
            &Patch::Apply(json!({
                "apiVersion": "tandem.dev/v1alpha1", "kind": "NetworkParameters",
                "metadata": {"name": PROVIDER_NETWORK_PARAMETERS,
                             "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY}},
                "spec": {"clusterID": spec.cluster_id, "podCIDR": spec.pod_cidr,
                         "externalCIDR": spec.external_cidr, "publicKey": spec.public_key,
                         "gatewayEndpoint": spec.gateway_endpoint},
            })),
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
        if tenant.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let ns = tenant.namespace().unwrap_or_default();
        if only.is_some_and(|only| !only.contains(&ns)) {
            continue;
        }
        let consumer = tenant.spec.cluster_id.clone();
        let parameters_of = |name: &str| parameters(&ns, name);
        let public_key = crate::fabric::gateway_key(ctx, &consumer).await?.public_key;
        let endpoint = crate::fabric::gateway::local_endpoint(ctx, &consumer).await?;
        let wanted = ours(ctx, &settings, &public_key, endpoint.as_deref());
        if parameters_of(PROVIDER_NETWORK_PARAMETERS).is_none_or(|p| p.spec != wanted)
            && let Some(rv) = publish(ctx, &consumer, &wanted).await?
        {
            own.push((ns.clone(), PROVIDER_NETWORK_PARAMETERS.into(), rv));
        }
        let Some(theirs) = parameters_of(CONSUMER_NETWORK_PARAMETERS) else {
            continue;
        };
        let mut prefixes = Vec::new();
        let pod: IpNet = match theirs.spec.pod_cidr.parse() {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(%consumer, error = %e, "consumer pod CIDR");
                continue;
            }
        };
        prefixes.push(pod);
        if let Some(ext) = theirs
            .spec
            .external_cidr
            .as_ref()
            .and_then(|e| e.parse().ok())
        {
            prefixes.push(ext);
        }
        let current = theirs.status.clone().unwrap_or_default();
        let refused_before = conditions::find(&current.conditions, conditions::PREFIXES_GRANTED)
            .filter(|c| c.status == "False")
            .map(|c| c.message.clone());
        let status = match map_peer(ctx, &settings, &consumer, &prefixes).await {
            Ok(grants) => {
                let remapped_pod = grants[0].granted.to_string();
                let remapped_ext = grants.get(1).map(|g| g.granted.to_string());
                if current.remapped_pod_cidr.as_deref() == Some(&remapped_pod)
                    && current.remapped_external_cidr == remapped_ext
                    && refused_before.is_none()
                {
                    continue;
                }
                json!({"remappedPodCIDR": remapped_pod, "remappedExternalCIDR": remapped_ext,
                       "conditions": []})
            }
            // A prefix no peer is granted: said to this consumer, and the other Tenants'
            // sweeps go on.
            Err(IpamError::Ipam(refused @ tandem_core::ipam::IpamError::Refused { .. })) => {
                let message = format!("consumer {consumer}: {refused}");
                if refused_before.as_deref() == Some(message.as_str()) {
                    continue;
                }
                tracing::warn!(%consumer, "{message}");
                json!({"remappedPodCIDR": null, "remappedExternalCIDR": null,
                       "conditions": [{"type": conditions::PREFIXES_GRANTED, "status": "False",
                                       "reason": "PrefixRefused", "message": message,
                                       "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string()}]})
            }
            Err(e) => return Err(e),
        };
        {
            // Guarded by the version the cache holds: against a newer one (a consumer's
            // change whose event is still on its way) the write is refused, and that event
            // sweeps again. Unguarded, a write that changed nothing would answer with that
            // newer version, and its event would be taken for this write's and skipped.
            let written = Api::<NetworkParameters>::namespaced(ctx.client.clone(), &ns)
                .patch_status(
                    CONSUMER_NETWORK_PARAMETERS,
                    &PatchParams::default(),
                    &Patch::Merge(json!({
                        "metadata": {"resourceVersion": theirs.resource_version()},
                        "status": status,
                    })),
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
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_api::peering::PeeringNetwork;
    use tandem_api::{NetworkParametersStatus, PeeringStatus};

    fn peering(provider: &str, pod: (&str, &str), ext: Option<(&str, &str)>) -> Peering {
        let spec = serde_json::from_value(
            json!({"clusterID": provider, "endpoint": "https://x:6443", "caData": ""}),
        )
        .unwrap();
        let mut p = Peering::new(provider, spec);
        p.status = Some(PeeringStatus {
            network: Some(PeeringNetwork {
                remote_pod_cidr: pod.0.into(),
                remapped_remote_pod_cidr: pod.1.into(),
                remote_external_cidr: ext.map(|e| e.0.into()),
                remapped_remote_external_cidr: ext.map(|e| e.1.into()),
                ..Default::default()
            }),
            ..Default::default()
        });
        p
    }

    /// A tenant and its consumer's NetworkParameters, remapped as `pod` says.
    fn tenant(consumer: &str, pod: (&str, Option<&str>)) -> (Tenant, NetworkParameters) {
        let ns = names::tenant_namespace(consumer);
        let mut t = Tenant::new(
            consumer,
            serde_json::from_value(json!({"clusterID": consumer})).unwrap(),
        );
        t.metadata.namespace = Some(ns.clone());
        let mut np = NetworkParameters::new(
            CONSUMER_NETWORK_PARAMETERS,
            serde_json::from_value(json!({"clusterID": consumer, "podCIDR": pod.0})).unwrap(),
        );
        np.metadata.namespace = Some(ns);
        np.status = Some(NetworkParametersStatus {
            remapped_pod_cidr: pod.1.map(str::to_string),
            ..Default::default()
        });
        (t, np)
    }

    fn grant(requested: &str, granted: &str) -> Grant {
        Grant {
            requested: requested.parse().unwrap(),
            granted: granted.parse().unwrap(),
        }
    }

    #[test]
    fn the_ipam_state_is_rebuilt_from_the_remaps_peerings_and_tenants_record() {
        let config = IpamConfig {
            reserved: vec!["10.244.0.0/16".parse().unwrap()],
            pools: POOLS.iter().map(|p| p.parse().unwrap()).collect(),
            allowed_public: Vec::new(),
        };
        let mut leaving = peering("naples", ("10.250.0.0/16", "10.9.0.0/16"), None);
        leaving.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        let peerings = [
            peering(
                "milan",
                ("10.244.0.0/16", "10.0.0.0/16"),
                Some(("10.245.0.0/16", "10.1.0.0/16")),
            ),
            leaving,
        ];
        let (rome, rome_np) = tenant("rome", ("10.244.0.0/16", Some("10.2.0.0/16")));
        // Milan peers both ways: the two relations share the grants.
        let (milan, milan_np) = tenant("milan", ("10.244.0.0/16", Some("10.0.0.0/16")));
        // Overlapping milan's grant: left out.
        let (turin, turin_np) = tenant("turin", ("10.244.0.0/16", Some("10.0.0.0/16")));
        // A spec changed since its remap (a /16 remapped as a /24): left out.
        let (genoa, genoa_np) = tenant("genoa", ("10.244.0.0/16", Some("10.5.0.0/24")));
        // Not remapped yet: nothing recorded.
        let (bari, bari_np) = tenant("bari", ("10.244.0.0/16", None));
        let state = rebuild_state(
            &config,
            &peerings,
            &[rome, milan, turin, genoa, bari],
            &[rome_np, milan_np, turin_np, genoa_np, bari_np],
        );
        let expected: BTreeMap<String, Vec<Grant>> = [
            (
                "milan".to_string(),
                vec![
                    grant("10.244.0.0/16", "10.0.0.0/16"),
                    grant("10.245.0.0/16", "10.1.0.0/16"),
                ],
            ),
            (
                "rome".to_string(),
                vec![grant("10.244.0.0/16", "10.2.0.0/16")],
            ),
        ]
        .into();
        assert_eq!(state.peers, expected);
    }
}
