//! Network negotiation, provider side: publish the provider's `NetworkParameters` in each tenant
//! namespace and remap the consumer's CIDRs (written into the status of the consumer's
//! `NetworkParameters`). Also the cluster's persisted IPAM, shared with the consumer side.

use std::collections::BTreeMap;
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tandem_api::client;
use tandem_api::{NetworkParameters, Tenant, names};
use tandem_core::ipam::{Grant, Ipam, IpamConfig, IpamState};

use crate::context::Ctx;
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
    #[error("this cluster's gateway key for the peer")]
    GatewayKey(#[from] crate::fabric::KeyError),
}

async fn ipam_config(ctx: &Ctx) -> Result<IpamConfig, IpamError> {
    let settings = crate::install::load_settings(&ctx.client).await?;
    let parse = |s: &str| {
        s.parse::<IpNet>().map_err(|source| IpamError::Cidr {
            cidr: s.to_string(),
            source,
        })
    };
    Ok(IpamConfig {
        reserved: vec![parse(&settings.pod_cidr)?, parse(&settings.external_cidr)?],
        pools: POOLS.iter().map(|p| parse(p)).collect::<Result<_, _>>()?,
    })
}

/// Runs `f` on the persisted IPAM and stores the result (optimistic concurrency, retried).
async fn with_ipam<T>(
    ctx: &Ctx,
    mut f: impl FnMut(&mut Ipam) -> Result<T, tandem_core::ipam::IpamError>,
) -> Result<T, IpamError> {
    let config = ipam_config(ctx).await?;
    let maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), names::SYSTEM_NAMESPACE);
    for _ in 0..10 {
        let current = maps.get_opt(IPAM_CONFIG_MAP).await?;
        let state: IpamState = current
            .as_ref()
            .and_then(|m| m.data.as_ref()?.get(IPAM_KEY))
            .and_then(|s| serde_json::from_str(s).ok())
            .unwrap_or_default();
        let mut ipam = Ipam::with_state(config.clone(), state.clone())?;
        let out = f(&mut ipam)?;
        if ipam.state() == &state {
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
                    Ok(_) => return Ok(out),
                    Err(e) if client::is_conflict(&e) || client::is_not_found(&e) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            return Ok(out);
        }
        let data: BTreeMap<String, String> = [(
            IPAM_KEY.to_string(),
            serde_json::to_string(ipam.state()).expect("state serializes"),
        )]
        .into();
        let result = match current {
            Some(mut map) => {
                map.data = Some(data);
                maps.replace(IPAM_CONFIG_MAP, &PostParams::default(), &map)
                    .await
            }
            None => {
                let map: ConfigMap = serde_json::from_value(json!({
                    "metadata": {"name": IPAM_CONFIG_MAP, "namespace": names::SYSTEM_NAMESPACE,
                                 "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY}},
                    "data": data,
                }))
                .expect("static manifest");
                maps.create(&PostParams::default(), &map).await
            }
        };
        match result {
            Ok(_) => return Ok(out),
            Err(e) if client::is_conflict(&e) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(IpamError::Contended)
}

/// Maps `peer`'s prefixes into this cluster (same prefix when free, else remapped).
pub async fn map_peer(ctx: &Ctx, peer: &str, prefixes: &[IpNet]) -> Result<Vec<Grant>, IpamError> {
    with_ipam(ctx, |ipam| ipam.map_peer(peer, prefixes)).await
}

/// Forgets `peer`'s prefixes (on unpeer), unless a peering with it is left in the other
/// direction: both relations of a pair share the mapping (and the tunnel).
pub async fn release_peer(ctx: &Ctx, peer: &str) -> Result<(), IpamError> {
    if crate::fabric::live_relation(&ctx.client, Some(peer)).await? {
        return Ok(());
    }
    with_ipam(ctx, |ipam| {
        ipam.release_peer(peer);
        Ok(())
    })
    .await
}

/// Publishes (server-side apply) the provider's `NetworkParameters` in `consumer`'s tenant namespace.
pub async fn ensure_provider_parameters(ctx: &Ctx, consumer: &str) -> Result<(), IpamError> {
    let settings = crate::install::load_settings(&ctx.client).await?;
    let key = crate::fabric::ensure_gateway_key(&ctx.client, consumer).await?;
    let endpoint = crate::fabric::gateway::local_endpoint(&ctx.client, consumer).await?;
    let api: Api<NetworkParameters> =
        Api::namespaced(ctx.client.clone(), &names::tenant_namespace(consumer));
    api.patch(
        PROVIDER_NETWORK_PARAMETERS,
        &PatchParams::apply(names::FIELD_MANAGER).force(),
        &Patch::Apply(json!({
            "apiVersion": "tandem.dev/v1alpha1", "kind": "NetworkParameters",
            "metadata": {"name": PROVIDER_NETWORK_PARAMETERS,
                         "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY}},
            "spec": {"clusterID": ctx.identity.cluster_id, "podCIDR": settings.pod_cidr,
                     "externalCIDR": settings.external_cidr, "publicKey": key.public_key,
                     "gatewayEndpoint": endpoint},
        })),
    )
    .await?;
    Ok(())
}

/// Every second, and as soon as a consumer publishes or changes its parameters: for each
/// Tenant, keep the provider's parameters published and remap the consumer's.
pub async fn run(ctx: Ctx) {
    use futures::{FutureExt as _, StreamExt as _};
    use kube::runtime::{WatchStreamExt as _, watcher};
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut published = watcher(
        Api::<NetworkParameters>::all(ctx.client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .boxed();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            event = published.next() => {
                if let Some(Err(e)) = event {
                    tracing::debug!(error = %e, "watching NetworkParameters");
                }
                // Every event already here, then one sweep (its own status writes come back
                // as events, and the sweep after them finds nothing to do).
                while published.next().now_or_never().flatten().is_some() {}
            }
        }
        if let Err(e) = sweep(&ctx).await {
            tracing::warn!(error = %crate::error::chain(&e), "network negotiation (provider side)");
        }
    }
}

async fn sweep(ctx: &Ctx) -> Result<(), IpamError> {
    let settings = crate::install::load_settings(&ctx.client).await?;
    let tenants = Api::<Tenant>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await?;
    for tenant in tenants.items {
        if tenant.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let consumer = tenant.spec.cluster_id.clone();
        let ns = tenant.namespace().unwrap_or_default();
        let api: Api<NetworkParameters> = Api::namespaced(ctx.client.clone(), &ns);
        let published = api.get_opt(PROVIDER_NETWORK_PARAMETERS).await?;
        let public_key = crate::fabric::ensure_gateway_key(&ctx.client, &consumer)
            .await?
            .public_key;
        let endpoint = crate::fabric::gateway::local_endpoint(&ctx.client, &consumer).await?;
        let current = published.as_ref().map(|p| {
            (
                p.spec.cluster_id.as_str(),
                p.spec.pod_cidr.as_str(),
                p.spec.external_cidr.as_deref(),
                p.spec.public_key.as_deref(),
                p.spec.gateway_endpoint.as_deref(),
            )
        });
        if current
            != Some((
                ctx.identity.cluster_id.as_str(),
                settings.pod_cidr.as_str(),
                Some(settings.external_cidr.as_str()),
                Some(public_key.as_str()),
                endpoint.as_deref(),
            ))
        {
            ensure_provider_parameters(ctx, &consumer).await?;
        }
        let Some(theirs) = api.get_opt(CONSUMER_NETWORK_PARAMETERS).await? else {
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
        let grants = map_peer(ctx, &consumer, &prefixes).await?;
        let status = json!({
            "remappedPodCIDR": grants[0].granted.to_string(),
            "remappedExternalCIDR": grants.get(1).map(|g| g.granted.to_string()),
        });
        let current = theirs.status.clone().unwrap_or_default();
        if current.remapped_pod_cidr.as_deref() != Some(&grants[0].granted.to_string())
            || current.remapped_external_cidr != grants.get(1).map(|g| g.granted.to_string())
        {
            api.patch_status(
                CONSUMER_NETWORK_PARAMETERS,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await?;
        }
    }
    Ok(())
}
