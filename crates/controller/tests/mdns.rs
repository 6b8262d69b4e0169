//! mDNS discovery on an isolated LAN (root only; under CI=true a missing root fails): three
//! "clusters", each in a network namespace of its own with one interface on a shared bridge,
//! announce themselves as `_tandem._tcp.local` and browse for the others. Each hears the other
//! two with their endpoint, region and CA fingerprint; one that withdraws its advertisement is
//! heard saying goodbye; one that dies silently is not heard again. Then the same through
//! three lab clusters' controllers, turned on by their `tandem-discovery` settings: each records
//! the other two as DiscoveredClusters (never itself), and a withdrawal as a sighting that no
//! longer holds.
//!
//! The namespaces are anonymous (unshared by a thread, held by an open file): when the test
//! ends — or is killed — the kernel removes them with their links, and the host's own
//! namespace never gets an address or route.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use tandem_controller::discovery::Sighting;
use tandem_controller::mdns::{self, Config, Event};
use tandem_core::discovery::{Advertisement, fingerprint};
use tandem_testing::{IsolatedNetns, isolated_lan, lan_host};
use tokio::sync::{mpsc, watch};

/// The mDNS socket of `ns`, made inside it (it stays there) and driven by the current runtime.
fn socket_in(ns: &IsolatedNetns, ip: Ipv4Addr) -> std::io::Result<tokio::net::UdpSocket> {
    let handle = tokio::runtime::Handle::current();
    ns.run(move || {
        let _runtime = handle.enter();
        mdns::socket(Some(ip))
    })
}

/// One member of the LAN: its namespace, its address, and what its browse heard.
struct Member {
    _ns: IsolatedNetns,
    advertise: watch::Sender<Option<Advertisement>>,
    heard: mpsc::Receiver<Event>,
    task: tokio::task::JoinHandle<()>,
}

fn advertisement(id: &str, ip: Ipv4Addr) -> Advertisement {
    Advertisement {
        cluster_id: id.into(),
        endpoint: format!("https://{ip}:6443"),
        ca_fingerprint: fingerprint(format!("{id}'s CA").as_bytes()),
        protocol_version: tandem_core::protocol::VERSION,
        region: Some(format!("region-of-{id}")),
        zone: Some("a".into()),
        enroll: None,
    }
}

/// The sightings `member` hears until `until` holds for them (what was heard by cluster ID,
/// gone ones removed), or `limit` passes.
async fn listen(
    member: &mut Member,
    limit: Duration,
    until: impl Fn(&BTreeMap<String, Sighting>) -> bool,
) -> BTreeMap<String, Sighting> {
    let mut seen = BTreeMap::new();
    let deadline = Instant::now() + limit;
    while !until(&seen) {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, member.heard.recv()).await {
            Ok(Some(Event::Seen(s))) => {
                seen.insert(s.advertisement.cluster_id.clone(), s);
            }
            Ok(Some(Event::Gone(id))) => {
                seen.remove(&id);
            }
            Ok(None) | Err(_) => break,
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
async fn three_clusters_hear_each_other_and_a_goodbye_over_mdns() {
    tandem_testing::needs_root();
    let lan = isolated_lan();
    let config = Config {
        interface: None,
        ttl: 4,
        refresh: Duration::from_secs(2),
    };
    let ids = ["milan", "rome", "turin"];
    let mut members = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let (ns, ip) = lan_host(&lan, i as u8);
        let socket = socket_in(&ns, ip).expect("the mDNS socket");
        let (advertise, rx) = watch::channel(Some(advertisement(id, ip)));
        let (tx, heard) = mpsc::channel(64);
        let mut config = config.clone();
        config.interface = Some(ip);
        let task = tokio::spawn(mdns::run(socket, config, rx, Some(tx)));
        members.push(Member {
            _ns: ns,
            advertise,
            heard,
            task,
        });
    }

    // Each hears the other two (and itself, which discovery leaves out), as advertised.
    for (i, id) in ids.iter().enumerate() {
        let heard = listen(&mut members[i], Duration::from_secs(30), |s| s.len() == 3).await;
        assert_eq!(
            heard.keys().map(String::as_str).collect::<Vec<_>>(),
            ["milan", "rome", "turin"],
            "{id} heard {heard:#?}"
        );
        for (j, other) in ids.iter().enumerate() {
            let want = advertisement(other, Ipv4Addr::new(10, 99, 0, j as u8 + 1));
            assert_eq!(heard[*other].advertisement, want, "{id} heard {other}");
            assert_eq!(heard[*other].ttl, 4);
        }
    }

    // Turin withdraws its advertisement: the others hear its goodbye.
    members[2].advertise.send_replace(None);
    for i in 0..2 {
        let gone = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                match members[i].heard.recv().await {
                    Some(Event::Gone(id)) if id == "turin" => return true,
                    Some(_) => {}
                    None => return false,
                }
            }
        })
        .await;
        assert_eq!(gone, Ok(true), "{} heard no goodbye from turin", ids[i]);
    }

    // Rome dies without a goodbye: milan hears nothing more from it (nor from turin), while it
    // still hears itself.
    members[1].task.abort();
    tokio::time::sleep(Duration::from_millis(500)).await;
    while members[0].heard.try_recv().is_ok() {}
    let later = listen(&mut members[0], Duration::from_secs(6), |_| false).await;
    assert_eq!(
        later.keys().map(String::as_str).collect::<Vec<_>>(),
        ["milan"],
        "{later:#?}"
    );
    for m in &members {
        m.task.abort();
    }
}

use crate::support;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
async fn controllers_record_each_other_as_discovered_clusters() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, ListParams, Patch, PatchParams};
    use std::sync::Arc;
    use tandem_api::DiscoveredCluster;
    use tandem_controller::context::MdnsSocket;
    use tandem_controller::discovery::{ADVERTISE_KEY, BROWSE_KEY, SETTINGS};

    tandem_testing::needs_root();
    let lan = isolated_lan();
    let regions = [
        ("milan", "eu-south"),
        ("rome", "eu-central"),
        ("turin", "eu-south"),
    ];
    let mut clusters = Vec::new();
    let mut advertised = BTreeMap::new();
    for (i, (id, region)) in regions.iter().enumerate() {
        let mut cluster = support::Cluster::start(id, region, 1).await;
        let (ns, ip) = lan_host(&lan, i as u8);
        let ns = Arc::new(ns);
        let options = tandem_controller::Options {
            mdns_socket: Some(MdnsSocket(Arc::new(move || socket_in(&ns, ip)))),
            mdns: Config {
                interface: Some(ip),
                ttl: 4,
                refresh: Duration::from_secs(2),
            },
            ..support::test_options()
        };
        cluster.restart_controller_with(options).await;
        let ad = tandem_controller::discovery::advertisement(
            &cluster.client,
            &format!("https://{ip}:6443"),
            cluster.lab.server.ca_pem(),
        )
        .await
        .unwrap();
        assert_eq!(ad.region.as_deref(), Some(*region));
        Api::<ConfigMap>::namespaced(cluster.client.clone(), "tandem-system")
            .patch(
                SETTINGS,
                &PatchParams::apply("test").force(),
                &Patch::Apply(serde_json::json!({
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": SETTINGS, "namespace": "tandem-system"},
                    "data": {ADVERTISE_KEY: ad.txt().join("\n"), BROWSE_KEY: "true"},
                })),
            )
            .await
            .unwrap();
        advertised.insert(id.to_string(), ad);
        clusters.push(cluster);
    }

    let recorded = |client: kube::Client| async move {
        Api::<DiscoveredCluster>::all(client)
            .list(&ListParams::default())
            .await
            .map(|l| {
                l.items
                    .into_iter()
                    .map(|d| (d.spec.cluster_id.clone(), d.spec))
                    .collect::<BTreeMap<_, _>>()
            })
            .unwrap_or_default()
    };
    let started = Instant::now();
    for c in &clusters {
        let found = support::until(
            &format!("{} records the other two", c.id),
            Duration::from_secs(30),
            || async {
                let r = recorded(c.client.clone()).await;
                (r.len() == 2).then_some(r)
            },
        )
        .await;
        assert!(!found.contains_key(&c.id), "{} recorded itself", c.id);
        for (id, spec) in &found {
            let ad = &advertised[id];
            assert_eq!(spec.source, "mDNS");
            assert_eq!(spec.endpoint, ad.endpoint);
            assert_eq!(spec.ca_fingerprint, ad.ca_fingerprint);
            assert_eq!(spec.region, ad.region);
            // Announced with TTL 4, recorded with the least TTL a record keeps between two
            // writes.
            assert_eq!(spec.ttl_seconds, tandem_controller::discovery::MIN_TTL);
            assert_eq!(spec.domain, None);
        }
    }
    eprintln!(
        "all three recorded each other {:?} after their settings",
        started.elapsed()
    );
    for c in &clusters {
        let settings = Api::<ConfigMap>::namespaced(c.client.clone(), "tandem-system")
            .get(SETTINGS)
            .await
            .unwrap();
        assert_eq!(
            settings.metadata.annotations.unwrap_or_default()
                [tandem_controller::discovery::STATE_ANNOTATION],
            "announcing and browsing"
        );
    }

    // Milan stops advertising (it keeps browsing): the others record its goodbye.
    Api::<ConfigMap>::namespaced(clusters[0].client.clone(), "tandem-system")
        .patch(
            SETTINGS,
            &PatchParams::apply("test").force(),
            &Patch::Apply(serde_json::json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": SETTINGS, "namespace": "tandem-system"},
                "data": {BROWSE_KEY: "true"},
            })),
        )
        .await
        .unwrap();
    for c in &clusters[1..] {
        support::until(
            &format!("{} records milan's goodbye", c.id),
            Duration::from_secs(30),
            || async {
                let r = recorded(c.client.clone()).await;
                (r.get("milan")?.ttl_seconds == 0).then_some(())
            },
        )
        .await;
    }
}

/// What one sighting says, for [`tandem_controller::discovery::record`].
fn sighting(id: &str, ca: &str, ttl: u32) -> Sighting {
    let mut ad = advertisement(id, Ipv4Addr::new(192, 0, 2, 1));
    ad.ca_fingerprint = fingerprint(ca.as_bytes());
    Sighting {
        advertisement: ad,
        ttl,
    }
}

/// Records one sighting.
async fn one(
    client: &kube::Client,
    known: &mut tandem_controller::discovery::Known,
    s: Sighting,
    source: &str,
    domain: Option<&str>,
) -> tandem_controller::discovery::Recorded {
    tandem_controller::discovery::record(client, "hub", known, &[s], source, domain).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sighting_never_replaces_another_sources_record_and_a_full_list_evicts_only_lapsed_ones()
{
    use tandem_api::discovery::MAX_DISCOVERED;
    use tandem_controller::discovery::{known, record};
    let hub = support::Cluster::start("hub", "eu-west", 1).await;
    let client = &hub.controller_client;
    let mut k = known(client).await.unwrap();

    // Rome recorded from DNS; a LAN host answering as rome (another CA) changes nothing.
    let r = one(
        client,
        &mut k,
        sighting("rome", "real", 300),
        "DNS",
        Some("example.org"),
    )
    .await;
    assert_eq!(r.written, ["rome"]);
    let r = one(
        client,
        &mut k,
        sighting("rome", "forged", 300),
        "mDNS",
        None,
    )
    .await;
    assert!(r.written.is_empty());
    assert!(
        r.dropped[0].contains("conflicts with DiscoveredCluster rome"),
        "{r:?}"
    );
    // Nor does the same CA heard from another source, nor a changed CA from DNS itself.
    let r = one(client, &mut k, sighting("rome", "real", 300), "mDNS", None).await;
    assert!(r.written.is_empty(), "{r:?}");
    let r = one(
        client,
        &mut k,
        sighting("rome", "rotated", 300),
        "DNS",
        Some("example.org"),
    )
    .await;
    assert!(r.written.is_empty(), "{r:?}");
    let rome = kube::Api::<tandem_api::DiscoveredCluster>::all(hub.client.clone())
        .get("rome")
        .await
        .unwrap();
    assert_eq!(rome.spec.ca_fingerprint, fingerprint(b"real"));
    assert_eq!(rome.spec.source, "DNS");
    // Its own advertisement is never recorded.
    let r = one(client, &mut k, sighting("hub", "mine", 300), "mDNS", None).await;
    assert!(
        r.written.is_empty() && r.dropped[0].contains("own advertisement"),
        "{r:?}"
    );

    // Filled up with sightings that hold: a new cluster is dropped, saying why.
    let flood: Vec<Sighting> = (1..MAX_DISCOVERED)
        .map(|i| sighting(&format!("flood-{i}"), "x", 300))
        .collect();
    let r = record(client, "hub", &mut k, &flood, "mDNS", None).await;
    assert_eq!(r.written.len(), MAX_DISCOVERED - 1, "{:?}", r.dropped);
    let r = one(client, &mut k, sighting("late", "x", 300), "mDNS", None).await;
    assert!(
        r.written.is_empty() && r.dropped[0].contains("recorded already"),
        "{r:?}"
    );
    // One of them lapses (a goodbye): the next new cluster takes its place, and the list
    // stays at its bound.
    kube::Api::<tandem_api::DiscoveredCluster>::all(hub.client.clone())
        .patch(
            "flood-7",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"ttlSeconds": 0}})),
        )
        .await
        .unwrap();
    let mut k = known(client).await.unwrap();
    let r = one(client, &mut k, sighting("late", "x", 300), "mDNS", None).await;
    assert_eq!(r.written, ["late"], "{r:?}");
    let all = known(client).await.unwrap();
    assert_eq!(all.len(), MAX_DISCOVERED);
    assert!(!all.contains_key("flood-7") && all.contains_key("rome"));
}
