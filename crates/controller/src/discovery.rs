//! What this cluster advertises for discovery (`tandem_core::discovery`): its identity, API
//! endpoint, CA fingerprint, protocol version, and the region and zone its nodes share.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;
use tandem_core::discovery::{Advertisement, fingerprint};

use crate::identity::ClusterIdentity;
pub use crate::mdns::{Sighting, txt_strings};

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
        enroll: None,
    })
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
/// advertisement. An instance whose TXT is missing or unreadable, that is not named under the
/// service, or whose TXT names another cluster than its instance label (as `tandem advertise`
/// prints them, `<cluster ID>._tandem._tcp.<domain>`; the mDNS browse holds the same rule) is
/// skipped and reported by name: one bad record does not hide the others.
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
        if instance.base_name() != service {
            found
                .skipped
                .push(format!("{instance}: not an instance of {service}"));
            continue;
        }
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
        // The instance label, as the advertisement's cluster ID is compared with it.
        let label = instance
            .iter()
            .next()
            .map(|l| String::from_utf8_lossy(l).to_ascii_lowercase())
            .unwrap_or_default();
        match Advertisement::from_txt(&txt_strings(strings)) {
            Ok(advertisement) if advertisement.cluster_id == label => {
                found.sightings.push(Sighting {
                    advertisement,
                    ttl: ptr_ttl.min(txt_ttl),
                })
            }
            Ok(advertisement) => found.skipped.push(format!(
                "{instance}: its TXT names cluster {:?}",
                advertisement.cluster_id
            )),
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
    /// Sightings not recorded, with why (this cluster itself, a conflict with the record
    /// already there, the list full, a write refused).
    pub dropped: Vec<String>,
}

/// What is recorded already, by cluster ID: its source, its domain and CA fingerprint, and
/// whether the sighting has lapsed (not seen within its TTL).
pub type Known = std::collections::BTreeMap<String, KnownCluster>;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KnownCluster {
    pub source: String,
    pub domain: Option<String>,
    pub ca_fingerprint: String,
    pub lapsed: bool,
}

/// Whether a sighting at `last_seen` with `ttl_seconds` no longer holds (it holds for
/// `ttl_seconds` from then: with a TTL of 0, a goodbye, not at all).
pub fn lapsed(last_seen: &str, ttl_seconds: u32) -> bool {
    last_seen
        .parse::<k8s_openapi::jiff::Timestamp>()
        .map_or(true, |t| {
            k8s_openapi::jiff::Timestamp::now()
                .duration_since(t)
                .as_secs()
                >= i64::from(ttl_seconds)
        })
}

/// The DiscoveredClusters recorded now.
pub async fn known(client: &kube::Client) -> Result<Known, kube::Error> {
    Ok(Api::<tandem_api::DiscoveredCluster>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|d| {
            let lapsed = lapsed(&d.spec.last_seen, d.spec.ttl_seconds);
            (
                d.spec.cluster_id,
                KnownCluster {
                    source: d.spec.source,
                    domain: d.spec.domain,
                    ca_fingerprint: d.spec.ca_fingerprint,
                    lapsed,
                },
            )
        })
        .collect())
}

/// Records `sightings` as DiscoveredClusters (server-side apply, so a sighting refreshes the
/// whole record), seen now through `source` (under `domain` for DNS), keeping `known` current.
///
/// Sightings are untrusted, so a record is only refreshed by the same source (and domain)
/// with the same CA fingerprint: a LAN host answering as `rome` cannot replace what DNS, or
/// an earlier sighting, recorded for rome — that is reported as a conflict (an administrator
/// deletes the DiscoveredCluster to accept a changed one). This cluster's own advertisement is
/// not recorded. At most [`tandem_api::discovery::MAX_DISCOVERED`] exist: when full, a lapsed
/// record makes way for a new cluster; with none lapsed, the new one is dropped.
pub async fn record(
    client: &kube::Client,
    own_id: &str,
    known: &mut Known,
    sightings: &[Sighting],
    source: &str,
    domain: Option<&str>,
) -> Recorded {
    use kube::api::{Patch, PatchParams};
    use tandem_api::DiscoveredCluster;
    use tandem_api::discovery::MAX_DISCOVERED;
    let api = Api::<DiscoveredCluster>::all(client.clone());
    let now = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let mut out = Recorded::default();
    for s in sightings {
        let ad = &s.advertisement;
        let id = &ad.cluster_id;
        if *id == own_id {
            out.dropped
                .push(format!("{id}: this cluster's own advertisement"));
            continue;
        }
        match known.get(id) {
            Some(k)
                if k.source != source
                    || k.domain.as_deref() != domain
                    || k.ca_fingerprint != ad.ca_fingerprint =>
            {
                out.dropped.push(format!(
                    "{id}: conflicts with DiscoveredCluster {id} (recorded from {}{} with CA \
                     fingerprint {}; this sighting has {}): kept as it was; delete it \
                     (`kubectl delete discoveredcluster {id}`) to accept the new one",
                    k.source,
                    k.domain
                        .as_deref()
                        .map(|d| format!(" under {d}"))
                        .unwrap_or_default(),
                    k.ca_fingerprint,
                    ad.ca_fingerprint
                ));
                continue;
            }
            Some(_) => {}
            None if known.len() >= MAX_DISCOVERED => {
                let lapsed = known.iter().find(|(_, k)| k.lapsed).map(|(n, _)| n.clone());
                let Some(gone) = lapsed else {
                    out.dropped.push(format!(
                        "{id}: {MAX_DISCOVERED} clusters are recorded already, all seen within \
                         their TTL (delete DiscoveredClusters no longer wanted)"
                    ));
                    continue;
                };
                match api.delete(&gone, &Default::default()).await {
                    Ok(_) => {
                        known.remove(&gone);
                    }
                    Err(kube::Error::Api(e)) if e.code == 404 => {
                        known.remove(&gone);
                    }
                    Err(e) => {
                        out.dropped.push(format!(
                            "{id}: the list is full and removing the lapsed DiscoveredCluster \
                             {gone} failed: {e}"
                        ));
                        continue;
                    }
                }
            }
            None => {}
        }
        let spec = tandem_api::DiscoveredClusterSpec {
            cluster_id: id.clone(),
            endpoint: ad.endpoint.clone(),
            ca_fingerprint: ad.ca_fingerprint.clone(),
            protocol_version: ad.protocol_version,
            region: ad.region.clone(),
            zone: ad.zone.clone(),
            source: source.to_string(),
            domain: domain.map(str::to_string),
            last_seen: now.clone(),
            ttl_seconds: s.ttl,
            enrollment_token: ad.enroll.clone(),
        };
        let object = serde_json::json!({
            "apiVersion": "tandem.dev/v1alpha1",
            "kind": "DiscoveredCluster",
            "metadata": {"name": id,
                         "labels": {tandem_api::names::MANAGED_BY_LABEL: tandem_api::names::MANAGED_BY}},
            "spec": spec,
        });
        match api
            .patch(
                id,
                &PatchParams::apply("tandem-discovery").force(),
                &Patch::Apply(object),
            )
            .await
        {
            Ok(_) => {
                known.insert(
                    id.clone(),
                    KnownCluster {
                        source: source.to_string(),
                        domain: domain.map(str::to_string),
                        ca_fingerprint: ad.ca_fingerprint.clone(),
                        lapsed: false,
                    },
                );
                out.written.push(id.clone());
            }
            Err(e) => out
                .dropped
                .push(format!("{id}: writing DiscoveredCluster {id}: {e}")),
        }
    }
    out
}

/// The ConfigMap (in `tandem-system`) that turns mDNS on: `tandem advertise --mdns` writes
/// [`ADVERTISE_KEY`], `tandem discover --mdns` writes [`BROWSE_KEY`]. Absent: no multicast at
/// all (discovery is opt-in).
pub use tandem_api::names::DISCOVERY_SETTINGS as SETTINGS;
/// The advertisement to announce on the LAN: its TXT strings, one per line.
pub const ADVERTISE_KEY: &str = "mdns-advertise";
/// `"true"`: browse the LAN and record what answers as DiscoveredClusters.
pub const BROWSE_KEY: &str = "mdns-browse";
/// A token the CLI writes with a setting; the controller echoes it in [`ACTED_ANNOTATION`]
/// once its state reflects that write, so that the CLI never reads an older state.
pub const REQUEST_KEY: &str = "request";
/// The annotation on the settings ConfigMap where the controller says what its mDNS does:
/// `off`, `announcing`, `browsing`, `announcing and browsing`, or `failed: why`.
pub const STATE_ANNOTATION: &str = "tandem.dev/mdns-state";
/// The [`REQUEST_KEY`] the state annotation answers.
pub const ACTED_ANNOTATION: &str = "tandem.dev/mdns-request";

/// What the settings ConfigMap asks for: the advertisement to announce (an error when it does
/// not read back), and whether to browse.
pub fn settings_of(
    data: Option<&std::collections::BTreeMap<String, String>>,
) -> (Result<Option<Advertisement>, AdvertisementError>, bool) {
    let Some(data) = data else {
        return (Ok(None), false);
    };
    let advertisement = match data.get(ADVERTISE_KEY) {
        None => Ok(None),
        Some(txt) => {
            let lines: Vec<&str> = txt.lines().filter(|l| !l.is_empty()).collect();
            Advertisement::from_txt(&lines)
                .map(Some)
                .map_err(AdvertisementError)
        }
    };
    let browse = data.get(BROWSE_KEY).is_some_and(|v| v == "true");
    (advertisement, browse)
}

/// The advertisement the discovery settings hold cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("{ADVERTISE_KEY} of ConfigMap {SETTINGS} is not an advertisement")]
pub struct AdvertisementError(#[source] pub tandem_core::discovery::DiscoveryError);

/// The mDNS responder and browse running now, as the settings asked. Dropped, it stops them:
/// the responder, its advertisement's sender gone, says goodbye and ends, and the recorder
/// ends with it (neither is aborted, which would leave no goodbye).
struct Running {
    advertise: tokio::sync::watch::Sender<Option<Advertisement>>,
    browse: bool,
}

/// How often a failed start (the port taken, the interface not up yet) is tried again.
const RETRY_FAILED: std::time::Duration = std::time::Duration::from_secs(30);

/// Runs mDNS as the settings ConfigMap asks, until the task is aborted: announces the
/// advertisement it holds, and when browsing records every cluster heard as a
/// DiscoveredCluster (source mDNS; see [`record`] and [`record_heard`]). Reports its state on
/// the ConfigMap.
pub async fn run(ctx: crate::context::Ctx) {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::watcher;
    let api = Api::<ConfigMap>::namespaced(ctx.client.clone(), tandem_api::names::SYSTEM_NAMESPACE);
    let stream = crate::watches::watch_events(
        "discovery settings",
        api,
        watcher::Config::default().fields(&format!("metadata.name={SETTINGS}")),
    );
    futures::pin_mut!(stream);
    // What the ConfigMap holds (None: absent), as its latest event or listing says.
    let mut latest: Option<ConfigMap> = None;
    let mut listed: Option<ConfigMap> = None;
    let mut running: Option<Running> = None;
    let mut retry = tokio::time::interval(RETRY_FAILED);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let failed = latest
            .as_ref()
            .and_then(|c| {
                c.metadata
                    .annotations
                    .as_ref()?
                    .get(STATE_ANNOTATION)
                    .cloned()
            })
            .is_some_and(|s| s.starts_with("failed"));
        tokio::select! {
            ev = stream.next() => match ev {
                None => return,
                Some(watcher::Event::Apply(cm)) => latest = Some(cm),
                Some(watcher::Event::Delete(_)) => latest = None,
                // A relisting: what it finds counts once it is done (acting on the empty
                // state between would stop the responder, and say goodbye, for nothing).
                Some(watcher::Event::Init) => {
                    listed = None;
                    continue;
                }
                Some(watcher::Event::InitApply(cm)) => {
                    listed = Some(cm);
                    continue;
                }
                Some(watcher::Event::InitDone) => latest = listed.take(),
            },
            _ = retry.tick(), if failed && running.is_none() => {}
        }
        let data = latest.as_ref().and_then(|c| c.data.as_ref());
        let (advertisement, browse) = settings_of(data);
        let state = match advertisement {
            Ok(ad) => mdns_state(&ctx, &mut running, ad, browse),
            Err(why) => {
                running = None;
                format!("failed: {}", crate::error::chain(&why))
            }
        };
        let Some(cm) = &latest else { continue };
        let request = data
            .and_then(|d| d.get(REQUEST_KEY))
            .cloned()
            .unwrap_or_default();
        let annotations = cm.metadata.annotations.clone().unwrap_or_default();
        if annotations.get(STATE_ANNOTATION) != Some(&state)
            || annotations.get(ACTED_ANNOTATION) != Some(&request)
        {
            report(&ctx.client, &state, &request).await;
        }
    }
}

async fn report(client: &kube::Client, state: &str, request: &str) {
    use k8s_openapi::api::core::v1::ConfigMap;
    let api = Api::<ConfigMap>::namespaced(client.clone(), tandem_api::names::SYSTEM_NAMESPACE);
    let patch = serde_json::json!({"metadata": {"annotations": {
        STATE_ANNOTATION: state, ACTED_ANNOTATION: request}}});
    if let Err(e) = api
        .patch(
            SETTINGS,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
    {
        tracing::warn!("reporting the mDNS state on ConfigMap {SETTINGS}: {e}");
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

/// The least time between two writes of one cluster's record: whatever its TTL says, a LAN
/// host cannot make this controller write faster than this per cluster ID.
const MIN_REWRITE: std::time::Duration = std::time::Duration::from_secs(5);
/// The least TTL a sighting is recorded with: a shorter one would lapse between two writes.
pub const MIN_TTL: u32 = 10;

/// Records what the browse hears (see [`run`]): a new or changed sighting at once (at most
/// every [`MIN_REWRITE`] per cluster), an unchanged one again after half its TTL; a goodbye
/// as a sighting that no longer holds (TTL 0), only for a cluster this browse recorded. What
/// is recorded already is listed once, then kept in memory.
async fn record_heard(
    ctx: crate::context::Ctx,
    mut heard: tokio::sync::mpsc::Receiver<crate::mdns::Event>,
) {
    use std::collections::HashMap;
    use std::time::{Duration, Instant};
    use tandem_api::discovery::SOURCE_MDNS;
    let mut known = loop {
        match known(&ctx.client).await {
            Ok(k) => break k,
            Err(e) => {
                tracing::warn!("mDNS: listing DiscoveredClusters: {e}");
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
    };
    // Cluster ID → what this browse last wrote, when, and what it said.
    let mut written: HashMap<String, (Advertisement, Instant)> = HashMap::new();
    // Cluster ID → when a sighting was last dropped (said once a minute at most).
    let mut complained: HashMap<String, Instant> = HashMap::new();
    while let Some(event) = heard.recv().await {
        match event {
            crate::mdns::Event::Seen(mut s) => {
                s.ttl = s.ttl.max(MIN_TTL);
                let id = s.advertisement.cluster_id.clone();
                if id == ctx.identity.cluster_id {
                    continue;
                }
                if let Some((ad, at)) = written.get(&id) {
                    let wait = if *ad == s.advertisement {
                        MIN_REWRITE.max(Duration::from_secs(u64::from(s.ttl / 2)))
                    } else {
                        MIN_REWRITE
                    };
                    if at.elapsed() < wait {
                        continue;
                    }
                }
                let r = record(
                    &ctx.client,
                    &ctx.identity.cluster_id,
                    &mut known,
                    std::slice::from_ref(&s),
                    SOURCE_MDNS,
                    None,
                )
                .await;
                if r.written.contains(&id) {
                    written.insert(id.clone(), (s.advertisement, Instant::now()));
                }
                for why in r.dropped {
                    let said = complained
                        .get(&id)
                        .is_some_and(|t| t.elapsed() < Duration::from_secs(60));
                    if !said {
                        tracing::warn!("mDNS: not recorded: {why}");
                        complained.insert(id.clone(), Instant::now());
                    }
                }
            }
            crate::mdns::Event::Gone(id) => {
                if written.remove(&id).is_none() {
                    continue;
                }
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
                    Ok(_) => {
                        if let Some(k) = known.get_mut(&id) {
                            k.lapsed = true;
                        }
                    }
                    Err(kube::Error::Api(s)) if s.code == 404 => {
                        known.remove(&id);
                    }
                    Err(e) => tracing::warn!(cluster = %id, "mDNS: recording a goodbye: {e}"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// What the discovery settings ConfigMap asks for: every shape of its two keys.
    #[test]
    fn discovery_settings_table() {
        let fp = format!("sha256:{}", "ab".repeat(32));
        let good = format!("id=milan\nv=1\nendpoint=https://milan.example:6443\nfp={fp}\n");
        struct Case<'a> {
            what: &'a str,
            /// The ConfigMap's data (None: no ConfigMap).
            data: Option<Vec<(&'a str, &'a str)>>,
            /// The cluster ID advertised.
            advertises: Option<&'a str>,
            /// The refusal's text.
            error: Option<&'a str>,
            browses: bool,
        }
        let case = |what, data, advertises, error, browses| Case {
            what,
            data,
            advertises,
            error,
            browses,
        };
        let cases = vec![
            case("no ConfigMap", None, None, None, false),
            case("empty", Some(vec![]), None, None, false),
            case(
                "browse only",
                Some(vec![(BROWSE_KEY, "true")]),
                None,
                None,
                true,
            ),
            case(
                "browse is only \"true\"",
                Some(vec![(BROWSE_KEY, "yes")]),
                None,
                None,
                false,
            ),
            case(
                "advertise and browse",
                Some(vec![(ADVERTISE_KEY, good.as_str()), (BROWSE_KEY, "true")]),
                Some("milan"),
                None,
                true,
            ),
            case(
                "an advertisement that does not read",
                Some(vec![(ADVERTISE_KEY, "id=Not_A_Label\nv=1")]),
                None,
                Some("mdns-advertise of ConfigMap tandem-discovery is not an advertisement"),
                false,
            ),
        ];
        for Case {
            what,
            data,
            advertises,
            error,
            browses,
        } in cases
        {
            let map: Option<BTreeMap<String, String>> = data.map(|d| {
                d.into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            });
            let (advertisement, browse) = settings_of(map.as_ref());
            assert_eq!(browse, browses, "{what}: browse");
            match (advertisement, advertises, error) {
                (Ok(ad), want, None) => {
                    assert_eq!(ad.map(|a| a.cluster_id).as_deref(), want, "{what}")
                }
                (Err(e), None, Some(text)) => {
                    assert!(e.to_string().contains(text), "{what}: {e}");
                    assert!(
                        crate::error::chain(&e).contains("id"),
                        "{what}: the cause names the key: {}",
                        crate::error::chain(&e)
                    );
                }
                (got, _, _) => panic!("{what}: {got:?}"),
            }
        }
    }
}
