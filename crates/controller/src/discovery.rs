//! What this cluster advertises for discovery (`tandem_core::discovery`): its identity, API
//! endpoint, CA fingerprint, protocol version, and the region and zone its nodes share.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;
use tandem_core::discovery::{Advertisement, fingerprint};

use crate::identity::ClusterIdentity;

/// The node labels a cluster's region and zone come from.
pub const REGION_LABEL: &str = "topology.kubernetes.io/region";
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// Why the advertisement could not be made.
#[derive(Debug, thiserror::Error)]
pub enum AdvertiseError {
    #[error("reading this cluster's identity (is Tandem installed? `tandem install`)")]
    Identity(#[source] crate::identity::IdentityError),
    #[error("listing Nodes for their region and zone")]
    Nodes(#[source] kube::Error),
    #[error("the API CA is not a PEM certificate")]
    Ca,
}

/// The fingerprint of the first certificate of `pem` (the CA consumers verify this cluster's
/// API with), as `openssl x509 -fingerprint -sha256` prints its digits.
pub fn ca_fingerprint(pem: &str) -> Option<String> {
    let der = CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()?
        .ok()?;
    Some(fingerprint(der.as_ref()))
}

/// The value of `label` on every Node (not virtual ones), if they all agree.
fn shared_label(nodes: &[Node], label: &str) -> Option<String> {
    let values: BTreeSet<Option<&String>> = nodes
        .iter()
        .filter(|n| {
            n.metadata
                .labels
                .as_ref()
                .is_none_or(|l| !l.contains_key(tandem_api::names::NODE_TYPE_LABEL))
        })
        .map(|n| n.metadata.labels.as_ref().and_then(|l| l.get(label)))
        .collect();
    match values.into_iter().collect::<Vec<_>>().as_slice() {
        [Some(v)] => Some((*v).clone()),
        _ => None,
    }
}

/// This cluster's advertisement, reached at `endpoint` and verified with `ca_pem`.
pub async fn advertisement(
    client: &kube::Client,
    endpoint: &str,
    ca_pem: &str,
) -> Result<Advertisement, AdvertiseError> {
    let identity = ClusterIdentity::load(client)
        .await
        .map_err(AdvertiseError::Identity)?;
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(AdvertiseError::Nodes)?
        .items;
    Ok(Advertisement {
        cluster_id: identity.cluster_id,
        endpoint: endpoint.trim_end_matches('/').to_string(),
        ca_fingerprint: ca_fingerprint(ca_pem).ok_or(AdvertiseError::Ca)?,
        protocol_version: tandem_core::protocol::VERSION,
        region: shared_label(&nodes, REGION_LABEL),
        zone: shared_label(&nodes, ZONE_LABEL),
    })
}

/// One cluster found advertising, and for how long the sighting holds (its records' TTL).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sighting {
    pub advertisement: Advertisement,
    pub ttl: u32,
}

/// What browsing a domain found: the clusters, and the instances skipped with why.
#[derive(Debug, Default)]
pub struct Browsed {
    pub sightings: Vec<Sighting>,
    pub skipped: Vec<String>,
}

/// Why browsing a domain found nothing.
#[derive(Debug, thiserror::Error)]
pub enum BrowseError {
    #[error("{0:?} is not a DNS domain name")]
    Domain(String),
    #[error(transparent)]
    Lookup(#[from] tandem_dns::client::LookupError),
    #[error(
        "no {service} records under {domain} ({service}.{domain} is NXDOMAIN): publish the ones \
         `tandem advertise --domain {domain}` prints",
        service = tandem_core::discovery::SERVICE
    )]
    NoService { domain: String },
}

/// Browses `domain` for advertising clusters (DNS-SD, RFC 6763 §4): the PTR records of
/// `_tandem._tcp.<domain>` name the instances, and each instance's TXT record carries its
/// advertisement. An instance whose TXT is missing or unreadable is skipped and reported by
/// name (one bad record does not hide the others).
pub async fn browse_domain(
    domain: &str,
    servers: &[std::net::SocketAddr],
) -> Result<Browsed, BrowseError> {
    use tandem_dns::hickory_proto::op::ResponseCode;
    use tandem_dns::hickory_proto::rr::{Name, RData, RecordType};
    let domain = domain.trim_end_matches('.');
    if !tandem_core::discovery::valid_domain(domain) {
        return Err(BrowseError::Domain(domain.to_string()));
    }
    let service = Name::from_ascii(format!("{}.{domain}.", tandem_core::discovery::SERVICE))
        .map_err(|_| BrowseError::Domain(domain.to_string()))?;
    let ptr = tandem_dns::client::lookup(servers, &service, RecordType::PTR).await?;
    if ptr.response_code() == ResponseCode::NXDomain {
        return Err(BrowseError::NoService {
            domain: domain.to_string(),
        });
    }
    let instances: BTreeSet<(Name, u32)> = ptr
        .answers()
        .iter()
        .filter(|r| r.name() == &service)
        .filter_map(|r| match r.data() {
            RData::PTR(p) => Some((p.0.clone(), r.ttl())),
            _ => None,
        })
        .collect();
    let mut found = Browsed::default();
    for (instance, ptr_ttl) in instances {
        let txt = match tandem_dns::client::lookup(servers, &instance, RecordType::TXT).await {
            Ok(m) => m,
            Err(e) => {
                found.skipped.push(format!("{instance}: {e}"));
                continue;
            }
        };
        let record = txt
            .answers()
            .iter()
            .filter(|r| r.name() == &instance)
            .find_map(|r| match r.data() {
                RData::TXT(t) => Some((t, r.ttl())),
                _ => None,
            });
        let Some((strings, txt_ttl)) = record else {
            found.skipped.push(format!("{instance}: no TXT record"));
            continue;
        };
        let strings: Vec<String> = strings
            .iter()
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect();
        match Advertisement::from_txt(&strings) {
            Ok(advertisement) => found.sightings.push(Sighting {
                advertisement,
                ttl: ptr_ttl.min(txt_ttl),
            }),
            Err(e) => found.skipped.push(format!("{instance}: {e}")),
        }
    }
    Ok(found)
}

/// What [`record`] did with a browse's sightings.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Recorded {
    /// Cluster IDs written (created or refreshed).
    pub written: Vec<String>,
    /// Sightings not recorded, with why (this cluster itself, the list full).
    pub dropped: Vec<String>,
}

/// Records `sightings` as DiscoveredClusters (server-side apply, so a sighting refreshes the
/// whole record), seen now through `source` (under `domain` for DNS). This cluster's own
/// advertisement is not recorded, nor, once [`tandem_api::discovery::MAX_DISCOVERED`] exist, a
/// cluster not already among them.
pub async fn record(
    client: &kube::Client,
    own_id: &str,
    sightings: &[Sighting],
    source: &str,
    domain: Option<&str>,
) -> Result<Recorded, kube::Error> {
    use kube::api::{Patch, PatchParams};
    use tandem_api::DiscoveredCluster;
    use tandem_api::discovery::MAX_DISCOVERED;
    let api = Api::<DiscoveredCluster>::all(client.clone());
    let mut known: BTreeSet<String> = api
        .list_metadata(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|m| m.metadata.name)
        .collect();
    let now = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let mut out = Recorded::default();
    for s in sightings {
        let ad = &s.advertisement;
        if ad.cluster_id == own_id {
            out.dropped.push(format!(
                "{}: this cluster's own advertisement",
                ad.cluster_id
            ));
            continue;
        }
        if !known.contains(&ad.cluster_id) && known.len() >= MAX_DISCOVERED {
            out.dropped.push(format!(
                "{}: {MAX_DISCOVERED} clusters are recorded already (delete DiscoveredClusters \
                 no longer wanted)",
                ad.cluster_id
            ));
            continue;
        }
        let spec = tandem_api::DiscoveredClusterSpec {
            cluster_id: ad.cluster_id.clone(),
            endpoint: ad.endpoint.clone(),
            ca_fingerprint: ad.ca_fingerprint.clone(),
            protocol_version: ad.protocol_version,
            region: ad.region.clone(),
            zone: ad.zone.clone(),
            source: source.to_string(),
            domain: domain.map(str::to_string),
            last_seen: now.clone(),
            ttl_seconds: s.ttl,
        };
        let object = serde_json::json!({
            "apiVersion": "tandem.dev/v1alpha1",
            "kind": "DiscoveredCluster",
            "metadata": {"name": ad.cluster_id,
                         "labels": {tandem_api::names::MANAGED_BY_LABEL: tandem_api::names::MANAGED_BY}},
            "spec": spec,
        });
        api.patch(
            &ad.cluster_id,
            &PatchParams::apply("tandem-discovery").force(),
            &Patch::Apply(object),
        )
        .await?;
        known.insert(ad.cluster_id.clone());
        out.written.push(ad.cluster_id.clone());
    }
    Ok(out)
}

/// The ConfigMap (in `tandem-system`) that turns mDNS on: `tandem advertise --mdns` writes
/// [`ADVERTISE_KEY`], `tandem discover --mdns` writes [`BROWSE_KEY`]. Absent: no multicast at
/// all (discovery is opt-in).
pub const SETTINGS: &str = "tandem-discovery";
/// The advertisement to announce on the LAN: its TXT strings, one per line.
pub const ADVERTISE_KEY: &str = "mdns-advertise";
/// `"true"`: browse the LAN and record what answers as DiscoveredClusters.
pub const BROWSE_KEY: &str = "mdns-browse";

/// What the settings ConfigMap asks for: the advertisement to announce, and whether to browse.
/// An advertisement that does not read back is not announced (and says why).
pub fn settings_of(
    data: Option<&std::collections::BTreeMap<String, String>>,
) -> (Option<Advertisement>, bool) {
    let Some(data) = data else {
        return (None, false);
    };
    let advertisement = data.get(ADVERTISE_KEY).and_then(|txt| {
        let lines: Vec<&str> = txt.lines().filter(|l| !l.is_empty()).collect();
        Advertisement::from_txt(&lines)
            .map_err(|e| {
                tracing::warn!("ConfigMap {SETTINGS}: {ADVERTISE_KEY} is not announced: {e}")
            })
            .ok()
    });
    let browse = data.get(BROWSE_KEY).is_some_and(|v| v == "true");
    (advertisement, browse)
}

/// The mDNS responder and browse running now, as the settings asked. Dropped, it stops them:
/// the responder, its advertisement's sender gone, says goodbye and ends, and the recorder
/// ends with it (neither is aborted, which would leave no goodbye).
struct Running {
    advertise: tokio::sync::watch::Sender<Option<Advertisement>>,
    browse: bool,
}

/// Runs mDNS as the settings ConfigMap asks, until the task is aborted: announces the
/// advertisement it holds, and when browsing records every cluster heard as a
/// DiscoveredCluster (source mDNS), refreshed at most every half TTL, and a goodbye as a
/// sighting that no longer holds (TTL 0).
pub async fn run(ctx: crate::context::Ctx) {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::watcher;
    let api = Api::<ConfigMap>::namespaced(ctx.client.clone(), tandem_api::names::SYSTEM_NAMESPACE);
    let stream = crate::runtime::watch_events(
        "discovery settings",
        api,
        watcher::Config::default().fields(&format!("metadata.name={SETTINGS}")),
    );
    futures::pin_mut!(stream);
    let mut data = None;
    // The settings ConfigMap while it exists, and the state it last reported.
    let mut exists = false;
    let mut reported: Option<String> = None;
    let mut running: Option<Running> = None;
    while let Some(ev) = stream.next().await {
        match ev {
            watcher::Event::Apply(cm) | watcher::Event::InitApply(cm) => {
                reported = kube::ResourceExt::annotations(&cm)
                    .get(STATE_ANNOTATION)
                    .cloned();
                exists = true;
                data = cm.data;
            }
            watcher::Event::Delete(_) | watcher::Event::Init => {
                exists = false;
                data = None;
            }
            watcher::Event::InitDone => {}
        }
        let (advertisement, browse) = settings_of(data.as_ref());
        let state = mdns_state(&ctx, &mut running, advertisement, browse);
        if exists && reported.as_deref() != Some(state.as_str()) {
            report(&ctx.client, &state).await;
            reported = Some(state);
        }
    }
}

/// The annotation on the settings ConfigMap where the controller says what its mDNS does:
/// `off`, `announcing`, `browsing`, `announcing and browsing`, or `failed: why`.
pub const STATE_ANNOTATION: &str = "tandem.dev/mdns-state";

async fn report(client: &kube::Client, state: &str) {
    use k8s_openapi::api::core::v1::ConfigMap;
    let api = Api::<ConfigMap>::namespaced(client.clone(), tandem_api::names::SYSTEM_NAMESPACE);
    let patch = serde_json::json!({"metadata": {"annotations": {STATE_ANNOTATION: state}}});
    if let Err(e) = api
        .patch(
            SETTINGS,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
    {
        tracing::debug!("reporting the mDNS state on ConfigMap {SETTINGS}: {e}");
    }
}

/// Brings the mDNS responder and browse to what the settings ask; returns the state to report.
fn mdns_state(
    ctx: &crate::context::Ctx,
    running: &mut Option<Running>,
    advertisement: Option<Advertisement>,
    browse: bool,
) -> String {
    let what = match (advertisement.is_some(), browse) {
        (false, false) => {
            // Dropping the sender ends the responder with a goodbye.
            *running = None;
            return "off".into();
        }
        (true, false) => "announcing",
        (false, true) => "browsing",
        (true, true) => "announcing and browsing",
    };
    if let Some(r) = running.as_ref()
        && r.browse == browse
    {
        r.advertise.send_if_modified(|current| {
            let changed = *current != advertisement;
            *current = advertisement.clone();
            changed
        });
        return what.into();
    }
    *running = None;
    let socket = match &ctx.options.mdns_socket {
        Some(make) => (make.0)(),
        None => crate::mdns::socket(ctx.options.mdns.interface),
    };
    let socket = match socket {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("mDNS: opening UDP port {}: {e}", crate::mdns::PORT);
            return format!("failed: opening UDP port {}: {e}", crate::mdns::PORT);
        }
    };
    tracing::info!(
        advertise = advertisement.is_some(),
        browse,
        "mDNS discovery started"
    );
    let (advertise, watched) = tokio::sync::watch::channel(advertisement);
    let events = if browse {
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        tokio::spawn(record_heard(ctx.clone(), rx));
        Some(tx)
    } else {
        None
    };
    tokio::spawn(crate::mdns::run(
        socket,
        ctx.options.mdns.clone(),
        watched,
        events,
    ));
    *running = Some(Running { advertise, browse });
    what.into()
}

/// Records what the browse hears (see [`run`]).
async fn record_heard(
    ctx: crate::context::Ctx,
    mut heard: tokio::sync::mpsc::Receiver<crate::mdns::Event>,
) {
    use std::collections::HashMap;
    use std::time::{Duration, Instant};
    use tandem_api::discovery::SOURCE_MDNS;
    // Cluster ID → what was last written and when.
    let mut written: HashMap<String, (Advertisement, Instant)> = HashMap::new();
    while let Some(event) = heard.recv().await {
        match event {
            crate::mdns::Event::Seen(s) => {
                let id = s.advertisement.cluster_id.clone();
                if id == ctx.identity.cluster_id {
                    continue;
                }
                let fresh = written.get(&id).is_some_and(|(ad, at)| {
                    *ad == s.advertisement
                        && at.elapsed() < Duration::from_secs(u64::from(s.ttl / 2))
                });
                if fresh {
                    continue;
                }
                match record(
                    &ctx.client,
                    &ctx.identity.cluster_id,
                    std::slice::from_ref(&s),
                    SOURCE_MDNS,
                    None,
                )
                .await
                {
                    Ok(r) => {
                        for why in r.dropped {
                            tracing::warn!("mDNS: not recorded: {why}");
                        }
                        if r.written.contains(&id) {
                            written.insert(id, (s.advertisement, Instant::now()));
                        }
                    }
                    Err(e) => {
                        tracing::warn!(cluster = %id, "mDNS: recording a DiscoveredCluster: {e}")
                    }
                }
            }
            crate::mdns::Event::Gone(id) => {
                written.remove(&id);
                let api = Api::<tandem_api::DiscoveredCluster>::all(ctx.client.clone());
                let patch = serde_json::json!({"spec": {"ttlSeconds": 0}});
                match api
                    .patch(
                        &id,
                        &kube::api::PatchParams::default(),
                        &kube::api::Patch::Merge(&patch),
                    )
                    .await
                {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => tracing::warn!(cluster = %id, "mDNS: recording a goodbye: {e}"),
                }
            }
        }
    }
}
