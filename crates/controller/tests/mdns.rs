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
use std::fs::File;
use std::net::Ipv4Addr;
use std::os::fd::AsFd;
use std::process::Command;
use std::time::{Duration, Instant};

use tandem_controller::discovery::Sighting;
use tandem_controller::mdns::{self, Config, Event};
use tandem_core::discovery::{Advertisement, fingerprint};
use tokio::sync::{mpsc, watch};

/// A network namespace of its own, alive while this file is open.
struct Netns(File);

impl Netns {
    fn new() -> Netns {
        std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare");
            Netns(File::open("/proc/thread-self/ns/net").expect("open the new netns"))
        })
        .join()
        .unwrap()
    }

    /// Runs `f` on a thread inside the namespace (processes it spawns are inside too).
    fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let file = self.0.try_clone().unwrap();
        std::thread::spawn(move || {
            nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            f()
        })
        .join()
        .unwrap()
    }

    /// `ip ARGS…` inside the namespace.
    fn ip(&self, args: &[&str]) {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        self.run(move || {
            let out = Command::new("ip").args(&args).output().expect("run ip");
            assert!(
                out.status.success(),
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        });
    }

    /// A path other processes can name the namespace by (`ip link set … netns PATH`).
    fn path(&self) -> String {
        use std::os::fd::AsRawFd;
        format!("/proc/{}/fd/{}", std::process::id(), self.0.as_raw_fd())
    }
}

/// An isolated LAN: a bridge in a namespace of its own.
fn lan() -> Netns {
    let lan = Netns::new();
    lan.ip(&["link", "add", "br0", "type", "bridge"]);
    lan.ip(&["link", "set", "br0", "up"]);
    lan
}

/// Host `i` (0-based) of the LAN: a namespace whose `eth0` on the bridge holds 10.99.0.<i+1>/24.
fn host(lan: &Netns, i: usize) -> (Netns, Ipv4Addr) {
    let ns = Netns::new();
    let ip = Ipv4Addr::new(10, 99, 0, i as u8 + 1);
    let port = format!("lan{i}");
    lan.ip(&[
        "link",
        "add",
        &port,
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        &ns.path(),
    ]);
    lan.ip(&["link", "set", &port, "master", "br0", "up"]);
    ns.ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"]);
    ns.ip(&["link", "set", "eth0", "up"]);
    ns.ip(&["link", "set", "lo", "up"]);
    (ns, ip)
}

/// The mDNS socket of `ns`, made inside it (it stays there) and driven by the current runtime.
fn socket_in(ns: &Netns, ip: Ipv4Addr) -> std::io::Result<tokio::net::UdpSocket> {
    let handle = tokio::runtime::Handle::current();
    ns.run(move || {
        let _runtime = handle.enter();
        mdns::socket(Some(ip))
    })
}

/// One member of the LAN: its namespace, its address, and what its browse heard.
struct Member {
    _ns: Netns,
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
async fn three_clusters_hear_each_other_and_a_goodbye_over_mdns() {
    if !tandem_lab::testing::network_tests_can_run() {
        return;
    }
    let lan = lan();
    let config = Config {
        interface: None,
        ttl: 4,
        refresh: Duration::from_secs(2),
    };
    let ids = ["milan", "rome", "turin"];
    let mut members = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let (ns, ip) = host(&lan, i);
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

mod support;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controllers_record_each_other_as_discovered_clusters() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, ListParams, Patch, PatchParams};
    use std::sync::Arc;
    use tandem_api::DiscoveredCluster;
    use tandem_controller::context::MdnsSocket;
    use tandem_controller::discovery::{ADVERTISE_KEY, BROWSE_KEY, SETTINGS};

    if !tandem_lab::testing::network_tests_can_run() {
        return;
    }
    let lan = lan();
    let regions = [
        ("milan", "eu-south"),
        ("rome", "eu-central"),
        ("turin", "eu-south"),
    ];
    let mut clusters = Vec::new();
    let mut advertised = BTreeMap::new();
    for (i, (id, region)) in regions.iter().enumerate() {
        let mut cluster = support::Cluster::start(id, region, 1).await;
        let (ns, ip) = host(&lan, i);
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
            assert_eq!(spec.ttl_seconds, 4);
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
