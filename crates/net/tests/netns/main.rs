//! Root-only data-plane tests in network namespaces: real packets through two
//! `tandem-gateway` processes, with both clusters on pod CIDR 10.244.0.0/16.
//! Without root they print "skipped: needs root" and pass, except under CI=true.

mod harness;

use std::time::{Duration, Instant};

use harness::{Pair, Side, exec, needs_root, ping, ping_until, tcp_exchange, udp_exchange};

const CONNECT: Duration = Duration::from_secs(10);

fn started_pair() -> Pair {
    let mut pair = Pair::new();
    pair.start(Side::A);
    pair.start(Side::B);
    pair.wait_connected(Side::A, CONNECT);
    pair.wait_connected(Side::B, CONNECT);
    pair
}

#[test]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
fn pods_reach_each_other_through_double_nat() {
    needs_root();
    let pair = started_pair();
    for (from, to) in [(Side::A, Side::B), (Side::B, Side::A)] {
        let client = pair.pod(from, 1);
        let server = pair.pod(to, 2);
        // The client addresses the server pod by the name its own cluster gave it...
        let dst = pair.pod_ip_seen_by(from, 2);
        // ...and the server sees the client under the name the server's cluster gave it.
        let want_src = pair.pod_ip_seen_by(to, 1);

        assert!(ping(&client, &dst), "{from:?}→{to:?}: ICMP to {dst} failed");
        let seen = tcp_exchange(&server, 5001, &client, &dst)
            .unwrap_or_else(|e| panic!("{from:?}→{to:?}: TCP to {dst}: {e}"));
        assert_eq!(
            seen, want_src,
            "{from:?}→{to:?}: TCP source seen by the server"
        );
        let seen = udp_exchange(&server, 5002, &client, &dst)
            .unwrap_or_else(|e| panic!("{from:?}→{to:?}: UDP to {dst}: {e}"));
        assert_eq!(
            seen, want_src,
            "{from:?}→{to:?}: UDP source seen by the server"
        );
    }
    // The real pod address of the peer is a local address here: it must reach the local pod.
    let seen = tcp_exchange(
        &pair.pod(Side::A, 2),
        5003,
        &pair.pod(Side::A, 1),
        &Pair::pod_ip(2),
    )
    .expect("local pod-to-pod");
    assert_eq!(seen, Pair::pod_ip(1));
}

#[test]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
fn host_source_becomes_first_external_address() {
    needs_root();
    let pair = started_pair();
    let dst = pair.pod_ip_seen_by(Side::A, 1);
    for client in [pair.node(Side::A, 2), pair.gw(Side::A)] {
        let seen = tcp_exchange(&pair.pod(Side::B, 1), 5004, &client, &dst)
            .unwrap_or_else(|e| panic!("{client}: {e}"));
        assert_eq!(seen, pair.external_source_seen_by(Side::B), "from {client}");
    }
    let seen = udp_exchange(&pair.pod(Side::B, 1), 5005, &pair.node(Side::A, 1), &dst).unwrap();
    assert_eq!(seen, pair.external_source_seen_by(Side::B));
}

#[test]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
fn unmapped_prefixes_never_enter_the_tunnel() {
    needs_root();
    let pair = started_pair();
    let pod = pair.pod(Side::A, 1);
    let tx = || pair.metric(Side::A, "tandem_gateway_tx_bytes_total");
    let rx_b = || pair.metric(Side::B, "tandem_gateway_rx_bytes_total");
    let (tx0, rx0) = (tx(), rx_b());
    // Not mapped anywhere: the gateway has no route for it.
    assert!(!ping(&pod, "10.9.0.1"));
    // Even when something routes it into the TUN device, the gateway drops it:
    // the peer's prefixes are its only tunnel destinations.
    let gw = pair.gw(Side::A);
    let (ok, out) = exec(
        &gw,
        &["ip", "route", "add", "10.9.0.0/16", "dev", "tandem0"],
    );
    assert!(ok, "{out}");
    let dropped0 = pair.metric(Side::A, "tandem_gateway_dropped_unrouted_packets_total");
    assert!(!ping(&pod, "10.9.0.1"));
    // B's real pod address is not B's name in A either: it is A's own pod network.
    assert!(!ping(&pod, "10.244.9.9"));
    assert_eq!(tx(), tx0, "bytes entered the tunnel");
    assert_eq!(rx_b(), rx0, "bytes arrived at the peer");
    assert!(pair.metric(Side::A, "tandem_gateway_dropped_unrouted_packets_total") > dropped0);
    // The mapped prefix still works, and is counted.
    assert!(ping(&pod, &pair.pod_ip_seen_by(Side::A, 1)));
    assert!(tx() > tx0);
}

#[test]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
fn restart_restores_connectivity_without_stray_rules() {
    needs_root();
    let mut pair = started_pair();
    let pod = pair.pod(Side::A, 1);
    let dst = pair.pod_ip_seen_by(Side::A, 2);
    assert!(ping(&pod, &dst));
    let before = pair.ruleset(Side::A);
    assert!(before.contains("snat ip prefix to"), "{before}");

    for round in 0..2 {
        pair.kill(Side::A);
        // Crash leftovers: the table survives the process.
        assert_eq!(
            pair.ruleset(Side::A),
            before,
            "round {round}: rules changed by the kill"
        );
        // A real restart takes a moment; restarting within milliseconds would also trip the
        // peer's handshake rate limit (10/s), whose cookie retry waits 5 s by protocol.
        std::thread::sleep(Duration::from_secs(1));
        let restarted = Instant::now();
        pair.start(Side::A);
        let took = ping_until(&pod, &dst, Duration::from_secs(3))
            .map(|_| restarted.elapsed())
            .unwrap_or_else(|| {
                panic!(
                    "round {round}: no connectivity 3s after restart\n{}",
                    pair.log(Side::A)
                )
            });
        assert!(
            took <= Duration::from_secs(3),
            "round {round}: took {took:?}"
        );
        assert_eq!(
            pair.ruleset(Side::A),
            before,
            "round {round}: ruleset differs after restart"
        );
    }
    // A stray rule (e.g. from an older plan) is removed on the next start; the rest is kept.
    pair.kill(Side::A);
    std::thread::sleep(Duration::from_secs(1));
    let table = format!("tandem_{}", pair.args(Side::A).interface);
    let (ok, out) = exec(
        &pair.gw(Side::A),
        &[
            "nft",
            "add",
            "rule",
            "inet",
            &table,
            "nat_out",
            "ip",
            "saddr",
            "10.244.7.0/24",
            "snat",
            "ip",
            "to",
            "10.0.7.7",
            "comment",
            "\"tandem:stale\"",
        ],
    );
    assert!(ok, "{out}");
    assert_ne!(pair.ruleset(Side::A), before);
    pair.start(Side::A);
    pair.wait_connected(Side::A, Duration::from_secs(3));
    assert_eq!(pair.ruleset(Side::A), before, "stale rule not removed");
    assert!(pair.log(Side::A).contains("changed=true"));
}

#[test]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
fn peer_roaming_keeps_the_tunnel_up() {
    needs_root();
    let mut pair = started_pair();
    let gw_b = pair.gw(Side::B);
    // B's gateway moves to a new WAN address: everything it sends now comes from there.
    for cmd in [
        // Keep the new (secondary) address when the old primary goes away.
        &[
            "sh",
            "-c",
            "echo 1 > /proc/sys/net/ipv4/conf/wan0/promote_secondaries",
        ][..],
        &["ip", "addr", "add", "192.0.2.22/24", "dev", "wan0"][..],
        &["ip", "addr", "del", "192.0.2.2/24", "dev", "wan0"][..],
    ] {
        let (ok, out) = exec(&gw_b, cmd);
        assert!(ok, "{out}");
    }
    let pod = pair.pod(Side::A, 1);
    let dst = pair.pod_ip_seen_by(Side::A, 1);
    let start = Instant::now();
    let mut endpoint = String::new();
    while start.elapsed() < Duration::from_secs(5) {
        endpoint = pair
            .status(Side::A)
            .map(|s| s["peerEndpoint"].to_string())
            .unwrap_or_default();
        if endpoint.contains("192.0.2.22") {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        endpoint.contains("192.0.2.22:51820"),
        "A never learned B's new endpoint: {endpoint}"
    );
    assert!(ping(&pod, &dst), "no traffic after roaming");
    let seen = tcp_exchange(&pair.pod(Side::B, 1), 5006, &pod, &dst).unwrap();
    assert_eq!(seen, pair.pod_ip_seen_by(Side::B, 1));
    pair.wait_connected(Side::A, Duration::from_secs(1));
    pair.wait_connected(Side::B, Duration::from_secs(1));
}

#[test]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
fn peer_with_wrong_key_never_gets_a_packet_through() {
    needs_root();
    let mut pair = Pair::new();
    // B runs with a key A does not know (A still expects the original public key).
    pair.args_mut(Side::B).private_key = tandem_net::generate_private_key();
    pair.start(Side::A);
    pair.start(Side::B);
    std::thread::sleep(Duration::from_secs(2));
    let from_b = pair.pod(Side::B, 1);
    let to_a = pair.pod_ip_seen_by(Side::B, 1);
    assert!(!ping(&from_b, &to_a), "ICMP passed with a wrong key");
    assert!(udp_exchange(&pair.pod(Side::A, 1), 5007, &from_b, &to_a).is_err());
    assert!(!ping(
        &pair.pod(Side::A, 1),
        &pair.pod_ip_seen_by(Side::A, 1)
    ));
    for side in [Side::A, Side::B] {
        assert_eq!(
            pair.metric(side, "tandem_gateway_rx_bytes_total"),
            0.0,
            "{side:?}"
        );
        let state = pair.status(side).unwrap()["state"].clone();
        assert_eq!(state, "connecting", "{side:?}");
    }
    assert!(
        pair.metric(Side::A, "tandem_gateway_decrypt_errors_total") > 0.0,
        "A should have rejected B's handshakes"
    );
}

#[test]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
fn tunnel_loss_is_reported_within_3s() {
    needs_root();
    let mut pair = started_pair();
    let rtt = pair.status(Side::A).unwrap()["rttMs"]
        .as_f64()
        .expect("RTT while connected");
    assert!(rtt > 0.0 && rtt < 1000.0, "rtt {rtt}");
    assert_eq!(pair.metric(Side::A, "tandem_gateway_connected"), 1.0);
    assert!(pair.metric(Side::A, "tandem_gateway_last_handshake_timestamp_seconds") > 1.0e9);

    let (ok, out) = exec(&pair.gw(Side::B), &["ip", "link", "set", "wan0", "down"]);
    assert!(ok, "{out}");
    let lost = Instant::now();
    loop {
        let state = pair.status(Side::A).unwrap()["state"].clone();
        if state != "connected" {
            assert_eq!(state, "error");
            break;
        }
        assert!(
            lost.elapsed() < Duration::from_secs(3),
            "still connected 3s after the link went down"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(pair.metric(Side::A, "tandem_gateway_connected"), 0.0);
    assert!(pair.status(Side::A).unwrap()["rttMs"].is_null());

    // And it comes back when the link does.
    let (ok, out) = exec(&pair.gw(Side::B), &["ip", "link", "set", "wan0", "up"]);
    assert!(ok, "{out}");
    pair.wait_connected(Side::A, Duration::from_secs(5));
}

/// Rules of the gateway's table as (rule text without handle, handle), from `nft -a`.
fn rules_with_handles(pair: &Pair, side: Side) -> Vec<(String, u64)> {
    let table = format!("tandem_{}", pair.args(side).interface);
    let (ok, text) = exec(
        &pair.gw(side),
        &["nft", "-a", "list", "table", "inet", &table],
    );
    assert!(ok, "{text}");
    text.lines()
        .filter_map(|l| {
            let (rule, handle) = l.trim().rsplit_once(" # handle ")?;
            rule.contains("comment")
                .then(|| (rule.to_string(), handle.parse().unwrap()))
        })
        .collect()
}

#[test]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
fn changed_plan_replaces_only_the_rules_that_differ() {
    needs_root();
    let mut pair = started_pair();
    let before = rules_with_handles(&pair, Side::A);
    pair.kill(Side::A);
    // The peer renamed our external CIDR: only the two rules about it may change.
    pair.args_mut(Side::A)
        .nat
        .local_as_seen_by_peer
        .external_cidr = "10.200.0.0/16".parse().unwrap();
    pair.start(Side::A);
    pair.wait_connected(Side::A, CONNECT);
    let after = rules_with_handles(&pair, Side::A);
    assert_eq!(after.len(), before.len(), "{after:#?}");
    let kept: Vec<_> = before.iter().filter(|r| after.contains(r)).collect();
    let added: Vec<_> = after.iter().filter(|r| !before.contains(r)).collect();
    assert_eq!(
        kept.len(),
        before.len() - 2,
        "kept (same text and handle): {kept:#?}"
    );
    assert_eq!(added.len(), 2, "{added:#?}");
    assert!(
        added
            .iter()
            .any(|(r, _)| r.contains("ip daddr 10.200.0.0/16 dnat ip prefix to 10.70.0.0/16")),
        "{added:#?}"
    );
    assert!(
        added
            .iter()
            .any(|(r, _)| r.contains("snat ip to 10.200.0.0")),
        "{added:#?}"
    );
    // Pods are untouched by the change and still connect.
    assert!(ping(
        &pair.pod(Side::A, 1),
        &pair.pod_ip_seen_by(Side::A, 2)
    ));
}

#[test]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
fn orderly_stop_removes_rules_routes_and_device() {
    needs_root();
    let mut pair = started_pair();
    let gw = pair.gw(Side::A);
    assert!(pair.ruleset(Side::A).contains("tandem_tandem0"));
    let status = pair.terminate(Side::A);
    assert!(
        status.success(),
        "exit status {status}\n{}",
        pair.log(Side::A)
    );
    assert!(
        !pair.ruleset(Side::A).contains("tandem"),
        "{}",
        pair.ruleset(Side::A)
    );
    let (_, links) = exec(&gw, &["ip", "link", "show"]);
    assert!(!links.contains("tandem0"), "{links}");
    let (_, routes) = exec(&gw, &["ip", "route", "show"]);
    assert!(!routes.contains("10.0.0.0/16"), "{routes}");
    // Nothing is routed towards the peer any more.
    assert!(!ping(
        &pair.pod(Side::A, 1),
        &pair.pod_ip_seen_by(Side::A, 1)
    ));
}

#[test]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
fn side_without_endpoint_learns_it_from_the_handshake() {
    needs_root();
    let mut pair = Pair::new();
    // B only listens (e.g. behind a load balancer); A knows where to find it.
    pair.args_mut(Side::B).peer_endpoint = None;
    pair.start(Side::B);
    pair.start(Side::A);
    pair.wait_connected(Side::A, CONNECT);
    pair.wait_connected(Side::B, CONNECT);
    let endpoint = pair.status(Side::B).unwrap()["peerEndpoint"].clone();
    assert_eq!(endpoint, "192.0.2.1:51820");
    let seen = tcp_exchange(
        &pair.pod(Side::A, 1),
        5008,
        &pair.pod(Side::B, 2),
        &pair.pod_ip_seen_by(Side::B, 1),
    )
    .expect("B to A after learning the endpoint");
    assert_eq!(seen, pair.pod_ip_seen_by(Side::A, 2));
}

#[test]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
fn gateway_under_new_names_removes_only_its_own_old_interface_and_table() {
    needs_root();
    use tandem_core::names::{gateway_interface, legacy_gateway_interface};
    use tandem_net::config::default_nft_table;
    // A's gateway is the one to peer `milan`; `turin` is another peer whose gateway (of the
    // earlier version too) runs on the same node.
    let (old, new) = (
        legacy_gateway_interface("milan"),
        gateway_interface("milan"),
    );
    let (old_table, new_table) = (default_nft_table(&old), default_nft_table(&new));
    let (other, other_table) = (
        legacy_gateway_interface("turin"),
        default_nft_table(&legacy_gateway_interface("turin")),
    );
    let mut pair = Pair::new();
    let gw = pair.gw(Side::A);
    // The earlier version runs under the old name, then is killed by the upgrade: its
    // table stays on the node (hostNetwork), with its rules.
    pair.args_mut(Side::A).interface = old.clone();
    pair.start(Side::A);
    pair.start(Side::B);
    pair.wait_connected(Side::A, CONNECT);
    pair.kill(Side::A);
    let left = pair.ruleset(Side::A);
    assert!(left.contains(&format!("table inet {old_table}")), "{left}");
    assert!(left.contains("snat ip prefix to"), "{left}");
    // The killed process's TUN went with it; a device still held open elsewhere (or made
    // persistent) would not: one stands for it. And what is not this gateway's: the other
    // peer's interface and table of the earlier version, and a table that is not Tandem's.
    for cmd in [
        vec!["ip", "tuntap", "add", "dev", old.as_str(), "mode", "tun"],
        vec!["ip", "tuntap", "add", "dev", other.as_str(), "mode", "tun"],
        vec!["nft", "add", "table", "inet", other_table.as_str()],
        vec!["nft", "add", "table", "inet", "admins_own"],
    ] {
        let (ok, out) = exec(&gw, &cmd);
        assert!(ok, "{cmd:?}: {out}");
    }

    // The new version: new names, and the old ones of the same peer to remove.
    std::thread::sleep(Duration::from_secs(1));
    let args = pair.args_mut(Side::A);
    args.interface = new.clone();
    args.legacy_interfaces = vec![old.clone()];
    args.legacy_nft_tables = vec![old_table.clone()];
    pair.start(Side::A);
    pair.wait_connected(Side::A, CONNECT);
    assert!(
        ping(&pair.pod(Side::A, 1), &pair.pod_ip_seen_by(Side::A, 2)),
        "no traffic under the new names"
    );

    let tables = pair.ruleset(Side::A);
    assert!(!tables.contains(&old_table), "old table left:\n{tables}");
    for kept in [new_table.as_str(), other_table.as_str(), "admins_own"] {
        assert!(
            tables.contains(&format!("table inet {kept}")),
            "{kept} missing:\n{tables}"
        );
    }
    let (_, links) = exec(&gw, &["ip", "-o", "link", "show"]);
    let has_link = |name: &str| links.contains(&format!(": {name}:"));
    assert!(!has_link(&old), "old interface left:\n{links}");
    assert!(has_link(&new), "{links}");
    assert!(
        has_link(&other),
        "another peer's interface removed:\n{links}"
    );
    assert!(
        pair.log(Side::A)
            .contains("removed what an earlier version left"),
        "{}",
        pair.log(Side::A)
    );
}
