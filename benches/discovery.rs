//! Discovery benchmark (root): how long until clusters on one LAN hear each other over mDNS.
//! N responders-and-browsers (`tandem_controller::mdns`, as each controller runs it), each in
//! an isolated network namespace on one bridge, start together; timed from their start until
//! every one has heard every other (its endpoint, fingerprint and region). Repeated, with the
//! median and the worst reported.
//!
//!     cargo bench -p tandem-benches --bench discovery

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use tandem_controller::mdns::{self, Config, Event};
use tandem_core::discovery::{Advertisement, fingerprint};
use tandem_testing::{isolated_lan, lan_host};
use tokio::sync::{mpsc, watch};

const RUNS: usize = 5;

fn advertisement(i: u8, ip: Ipv4Addr) -> Advertisement {
    Advertisement {
        cluster_id: format!("cluster-{i}"),
        endpoint: format!("https://{ip}:6443"),
        ca_fingerprint: fingerprint(&[i]),
        protocol_version: tandem_core::protocol::VERSION,
        region: Some("bench".into()),
        zone: None,
        enroll: None,
    }
}

/// One run with `n` clusters: the time until each has heard all the others.
async fn once(n: u8) -> Duration {
    let lan = isolated_lan();
    let mut hosts = Vec::new();
    for i in 0..n {
        let (ns, ip) = lan_host(&lan, i);
        let handle = tokio::runtime::Handle::current();
        let socket = ns.run(move || {
            let _runtime = handle.enter();
            mdns::socket(Some(ip)).expect("the mDNS socket")
        });
        hosts.push((ns, ip, socket));
    }
    let start = Instant::now();
    let mut waits = Vec::new();
    let mut keep = Vec::new();
    for (i, (ns, ip, socket)) in hosts.into_iter().enumerate() {
        let (advertise, rx) = watch::channel(Some(advertisement(i as u8, ip)));
        let (tx, mut heard) = mpsc::channel(1024);
        let config = Config {
            interface: Some(ip),
            ..Config::default()
        };
        tokio::spawn(mdns::run(socket, config, rx, Some(tx)));
        keep.push((ns, advertise));
        waits.push(tokio::spawn(async move {
            let mut seen = BTreeSet::new();
            while seen.len() < usize::from(n) {
                match heard.recv().await {
                    Some(Event::Seen(s)) => {
                        seen.insert(s.advertisement.cluster_id);
                    }
                    Some(Event::Gone(_)) => {}
                    None => break,
                }
            }
            start.elapsed()
        }));
    }
    let mut worst = Duration::ZERO;
    for w in waits {
        let took = tokio::time::timeout(Duration::from_secs(60), w)
            .await
            .expect("every cluster heard the others within 60 s")
            .expect("the listener");
        worst = worst.max(took);
    }
    drop(keep);
    worst
}

pub fn main() -> anyhow::Result<()> {
    if !is_root() {
        eprintln!("skipped: the discovery benchmark makes network namespaces (run as root)");
        return Ok(());
    }
    tokio::runtime::Runtime::new()?.block_on(async {
        for n in [3u8, 16, 32] {
            let mut times: Vec<Duration> = Vec::new();
            for _ in 0..RUNS {
                times.push(once(n).await);
            }
            times.sort();
            println!(
                "{n} clusters on one LAN: all heard each other after median {:?}, worst {:?} ({RUNS} runs)",
                times[RUNS / 2],
                times[RUNS - 1]
            );
        }
    });
    Ok(())
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .map(|u| u.split_whitespace().next() == Some("0"))
        })
        .unwrap_or(false)
}
