//! The connected fabric on network-mode lab clusters installed with `--network-fabric`: right
//! after `tandem peer`, with no other step, each side runs a gateway to the other (a pod of
//! Tandem's image on the node network) and a node agent on every node, and a pod of the
//! consumer reaches an offloaded pod at the address the consumer reports for it, from either
//! node, across two clusters on the same pod CIDR. Unpeering removes the gateways, their keys
//! and the agent on both sides.

use std::time::Duration;

use serde_json::Value;

use crate::netlab;
use netlab::{
    install_with_fabric, invite_and_peer, json, kubectl, lab_up_with_nodes, offload_hello, ok,
    peer_with, probe_fetch, probe_fetch_in, rome_consumes_from_milan_and_turin, run_pod, tandem,
    until,
};

/// The parent of process `pid`.
fn ppid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The gateway processes the lab runs (under their relays) whose command line starts with
/// `tandem gateway --peer <peer>`, with their network namespaces.
fn gateways(lab_pid: u32, peer: &str) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if !String::from_utf8_lossy(&cmdline)
            .starts_with(&format!("tandem\0gateway\0--peer\0{peer}\0"))
        {
            continue;
        }
        if ppid(pid).and_then(ppid) != Some(lab_pid) {
            continue;
        }
        let out = std::process::Command::new("ip")
            .args(["netns", "identify", &pid.to_string()])
            .output()
            .unwrap();
        found.push((pid, String::from_utf8_lossy(&out.stdout).trim().to_string()));
    }
    found
}

/// The lab instance's prefix of namespace names (`lab-<id>-`), from the network namespace of
/// a gateway process the lab runs.
fn instance_prefix(lab_pid: u32) -> Option<String> {
    let (_, ns) = gateways(lab_pid, "milan").into_iter().next()?;
    let (prefix, _) = ns.split_once("-node-")?;
    Some(format!("{}-", prefix.rsplit_once('-')?.0))
}

/// What the fabric left in the lab's node namespaces: agent routes, TUN links, gateway tables
/// (the gateways to the peers these tests name, under the names Tandem gives them, and any
/// left under the names of earlier versions).
fn fabric_leftovers(prefix: &str) -> Vec<String> {
    let run = |args: &[&str]| {
        let out = std::process::Command::new("ip")
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let interfaces: Vec<String> = ["milan", "rome", "turin"]
        .into_iter()
        .map(tandem_core::names::gateway_interface)
        .chain(["tdm-".to_string()])
        .collect();
    let ours = |line: &str| interfaces.iter().any(|i| line.contains(i.as_str()));
    let tables: Vec<String> = interfaces
        .iter()
        .map(|i| tandem_netspec::default_nft_table(i))
        .collect();
    let mut left = Vec::new();
    for ns in run(&["netns", "list"]).lines() {
        let ns = ns.split_whitespace().next().unwrap_or_default();
        if !ns.starts_with(prefix) || !ns.contains("-node-") {
            continue;
        }
        for line in run(&["-n", ns, "route"]).lines() {
            if line.contains("proto 173") || ours(line) {
                left.push(format!("{ns}: route {line}"));
            }
        }
        for line in run(&["-n", ns, "link"]).lines() {
            if ours(line) {
                left.push(format!("{ns}: link {line}"));
            }
        }
        for line in run(&["netns", "exec", ns, "nft", "list", "tables"]).lines() {
            if tables.iter().any(|t| line.contains(t.as_str())) {
                left.push(format!("{ns}: {line}"));
            }
        }
    }
    left
}

/// Names of `ctx`'s Running pods in tandem-system with label `app`.
fn running(lab: &netlab::Lab, ctx: &str, app: &str) -> Vec<Value> {
    let pods = json(
        lab,
        ctx,
        &[
            "-n",
            "tandem-system",
            "get",
            "pods",
            "-l",
            &format!("app.kubernetes.io/name={app}"),
        ],
    );
    pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["status"]["phase"] == "Running")
        .cloned()
        .collect()
}

/// Waits until lab-1's virtual node `tandem-milan` says its tunnel is connected
/// (NetworkUnavailable False, TunnelConnected).
fn tunnel_connected(lab: &netlab::Lab) {
    until(
        "the virtual node's NetworkUnavailable False: tunnel connected",
        Duration::from_secs(60),
        || {
            let node = json(lab, "lab-1", &["get", "node", "tandem-milan"]);
            node["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|c| {
                    c["type"] == "NetworkUnavailable"
                        && c["status"] == "False"
                        && c["reason"] == "TunnelConnected"
                })
                .then_some(())
        },
    );
}

#[test]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
fn peering_builds_the_fabric_and_a_consumer_pod_reaches_an_offloaded_pod() {
    tandem_testing::needs_root();
    let home = tempfile::tempdir().unwrap();
    let lab = lab_up_with_nodes(home.path(), "lab", "2", "2");
    let kc = lab.kubeconfig.clone();
    install_with_fabric(home.path(), &kc, &[("lab-1", "rome"), ("lab-2", "milan")]);
    invite_and_peer(home.path(), &kc);

    // Each side: its gateway to the other Running on the node network, the agent on both
    // nodes, and the gateway's endpoint published to the other side.
    for (ctx, peer) in [("lab-1", "milan"), ("lab-2", "rome")] {
        let gateway = until(
            &format!("{ctx}'s gateway to {peer} Running"),
            Duration::from_secs(120),
            || running(&lab, ctx, "tandem-gateway").into_iter().next(),
        );
        assert_eq!(gateway["spec"]["hostNetwork"], true, "{gateway}");
        assert_eq!(
            gateway["metadata"]["labels"]["tandem.dev/remote-cluster-id"], peer,
            "{gateway}"
        );
        until(
            &format!("{ctx}'s node agent Running on both nodes"),
            Duration::from_secs(60),
            || (running(&lab, ctx, "tandem-agent").len() == 2).then_some(()),
        );
    }
    let params = until(
        "both gateway endpoints and keys in the NetworkParameters",
        Duration::from_secs(60),
        || {
            let np = json(
                &lab,
                "lab-2",
                &["-n", "tandem-tenant-rome", "get", "networkparameters"],
            );
            let items = np["items"].as_array()?.clone();
            (items.len() == 2
                && items.iter().all(|p| {
                    p["spec"]["gatewayEndpoint"].is_string() && p["spec"]["publicKey"].is_string()
                }))
            .then_some(items)
        },
    );
    for p in &params {
        let endpoint = p["spec"]["gatewayEndpoint"].as_str().unwrap();
        assert!(
            endpoint.starts_with("198.18.1.2:") || endpoint.starts_with("198.18.2.2:"),
            "the endpoint is the cluster's load-balancer address on the WAN: {p}"
        );
    }

    // The virtual node's NetworkUnavailable follows the tunnel, with no address to configure.
    tunnel_connected(&lab);

    // `tandem status` shows the tunnel: its state, RTT and the bytes through it (pods' traffic
    // only: none yet).
    let status_json = || -> Value {
        serde_json::from_str(&ok(
            tandem(
                home.path(),
                &[
                    "status",
                    "-o",
                    "json",
                    "--kubeconfig",
                    &kc,
                    "--context",
                    "lab-1",
                ],
            ),
            "status",
        ))
        .unwrap()
    };
    let status = until(
        "tandem status showing the tunnel's RTT and byte counters",
        Duration::from_secs(30),
        || {
            let status = status_json();
            let p = &status["providers"][0];
            (p["tunnelRttMs"].is_number() && p["tunnelRxBytes"].is_u64()).then_some(status)
        },
    );
    assert_eq!(
        status["providers"][0]["tunnel"], "TunnelConnected",
        "{status}"
    );
    let table = ok(
        tandem(
            home.path(),
            &["status", "--kubeconfig", &kc, "--context", "lab-1"],
        ),
        "status",
    );
    assert!(
        table.contains("RTT") && table.contains("RX/TX") && table.contains("ms "),
        "{table}"
    );

    // An offloaded echo pod, and a probe on each node of the consumer.
    offload_hello(home.path(), &lab);
    let nodes: Vec<String> =
        json(&lab, "lab-1", &["get", "nodes", "-l", "!tandem.dev/type"])["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["metadata"]["name"].as_str().unwrap().to_string())
            .collect();
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    for (i, node) in nodes.iter().enumerate() {
        let overrides = format!(r#"{{"spec":{{"nodeName":"{node}"}}}}"#);
        ok(
            kubectl(
                &lab,
                "lab-1",
                &[
                    "run",
                    &format!("probe-{i}"),
                    "--image=tandem.dev/probe",
                    "--overrides",
                    &overrides,
                ],
            ),
            "probe pod",
        );
    }
    let hello_ip = until(
        "the offloaded pod Running with an address",
        Duration::from_secs(60),
        || {
            let pod = json(&lab, "lab-1", &["-n", "demo", "get", "pod", "hello"]);
            (pod["status"]["phase"] == "Running")
                .then(|| pod["status"]["podIP"].as_str().map(str::to_string))
                .flatten()
        },
    );
    assert!(
        !hello_ip.starts_with("10.244."),
        "the consumer reports the offloaded pod at its remapped address, not {hello_ip}"
    );
    let network = json(&lab, "lab-1", &["get", "peering", "milan"])["status"]["network"].clone();
    let ours_there: ipnet::Ipv4Net = network["localPodCidrInRemote"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    for i in 0..nodes.len() {
        let probe = format!("probe-{i}");
        let probe_ip: std::net::Ipv4Addr =
            until(&format!("{probe} Running"), Duration::from_secs(60), || {
                let pod = json(&lab, "lab-1", &["get", "pod", &probe]);
                (pod["status"]["phase"] == "Running")
                    .then(|| pod["status"]["podIP"].as_str()?.parse().ok())
                    .flatten()
            });
        let reply: Value = until(
            &format!("{probe} reaching the offloaded pod at {hello_ip}"),
            Duration::from_secs(60),
            || probe_fetch(&lab, "default", &probe, &format!("http://{hello_ip}:8080/")),
        );
        assert_eq!(reply["cluster"], "lab-2", "{reply}");
        assert_eq!(reply["namespace"], "demo-rome", "{reply}");
        // The echo pod sees the probe at the address milan gave rome's pods: the same host
        // part in the prefix the provider's view names.
        let seen: std::net::Ipv4Addr = reply["client"].as_str().unwrap().parse().unwrap();
        let host = u32::from(probe_ip) & !u32::from(ours_there.netmask());
        assert_eq!(
            seen,
            std::net::Ipv4Addr::from(u32::from(ours_there.network()) | host),
            "probe {probe_ip} as the provider names it: {reply}"
        );
    }

    // probe-0's request to the offloaded pod, answered or not.
    let probe_0_to_hello = || {
        probe_fetch(
            &lab,
            "default",
            "probe-0",
            &format!("http://{hello_ip}:8080/"),
        )
    };
    // `tandem rotate wireguard-keys` on each side in turn: the new public key reaches the
    // peer, the tunnel comes back with it, and the offloaded pod is never touched.
    let hello_before = json(&lab, "lab-2", &["-n", "demo-rome", "get", "pod", "hello"]);
    let public_key = |ctx: &str, ns: &str, name: &str| -> String {
        json(&lab, ctx, &["-n", ns, "get", "networkparameters", name])["spec"]["publicKey"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    for (ctx, peer, args) in [
        ("lab-1", "milan", vec!["rotate", "wireguard-keys"]),
        (
            "lab-2",
            "rome",
            vec!["rotate", "wireguard-keys", "--peer", "rome"],
        ),
    ] {
        // Where the peer reads this side's key: the consumer's parameters in its tenant
        // namespace on milan, milan's own there too.
        let name = if ctx == "lab-1" {
            "consumer"
        } else {
            "provider"
        };
        let before = public_key("lab-2", "tandem-tenant-rome", name);
        let mut cmd = vec!["--kubeconfig", kc.as_str(), "--context", ctx];
        cmd.extend(args.iter().copied());
        let out = tandem(home.path(), &cmd);
        let said = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "tandem {cmd:?}: {said}");
        assert!(
            said.contains(&format!("✓ {peer}: new WireGuard key pair"))
                && said.contains("the gateway's configuration carries the new key"),
            "{said}"
        );
        let after = until(
            &format!("{ctx}'s new public key published to the peering"),
            Duration::from_secs(60),
            || {
                let key = public_key("lab-2", "tandem-tenant-rome", name);
                (!key.is_empty() && key != before).then_some(key)
            },
        );
        assert!(
            said.contains(&after),
            "the key announced is the one published: {said}"
        );
        // The peer's gateway is configured with it (its data path restarts on that change):
        // the tunnel that answers below runs on the new key, not the old one.
        let (peer_ctx, secret) = if ctx == "lab-1" {
            ("lab-2", "tandem-gateway-rome")
        } else {
            ("lab-1", "tandem-gateway-milan")
        };
        until(
            &format!("{peer_ctx}'s gateway configured with {ctx}'s new public key"),
            Duration::from_secs(60),
            || {
                let data = json(
                    &lab,
                    peer_ctx,
                    &["-n", "tandem-system", "get", "secret", secret],
                )["data"]["gateway.json"]
                    .as_str()?
                    .to_string();
                use base64::Engine as _;
                let config: Value = serde_json::from_slice(
                    &base64::engine::general_purpose::STANDARD
                        .decode(data)
                        .ok()?,
                )
                .ok()?;
                (config["peerPublicKey"] == after.as_str()).then_some(())
            },
        );
        let reply: Value = until(
            &format!("probe-0 reaching the offloaded pod again after {ctx} rotated its key"),
            Duration::from_secs(60),
            probe_0_to_hello,
        );
        assert_eq!(reply["cluster"], "lab-2", "{reply}");
    }
    let hello_after = json(&lab, "lab-2", &["-n", "demo-rome", "get", "pod", "hello"]);
    assert_eq!(
        (
            &hello_after["metadata"]["uid"],
            &hello_after["status"]["containerStatuses"][0]["restartCount"]
        ),
        (
            &hello_before["metadata"]["uid"],
            &hello_before["status"]["containerStatuses"][0]["restartCount"]
        ),
        "the offloaded pod lives on through both rotations"
    );

    // Node sources (hostNetwork pods, kubelet probes) reach the offloaded pod too, from either
    // node: the gateway hides them behind the external CIDR as the provider names it, so the
    // answer finds its way back.
    let external_there: ipnet::Ipv4Net = network["localExternalCidrInRemote"]
        .as_str()
        .expect("the provider's name for our external CIDR")
        .parse()
        .unwrap();
    for (i, node) in nodes.iter().enumerate() {
        let probe = format!("host-probe-{i}");
        ok(
            kubectl(
                &lab,
                "lab-1",
                &[
                    "run",
                    &probe,
                    "--image=tandem.dev/probe",
                    "--overrides",
                    &format!(r#"{{"spec":{{"nodeName":"{node}","hostNetwork":true}}}}"#),
                ],
            ),
            "hostNetwork probe",
        );
        until(&format!("{probe} Running"), Duration::from_secs(60), || {
            let pod = json(&lab, "lab-1", &["get", "pod", &probe]);
            (pod["status"]["phase"] == "Running").then_some(())
        });
        let reply: Value = until(
            &format!("{probe} (node network of {node}) reaching the offloaded pod"),
            Duration::from_secs(60),
            || probe_fetch(&lab, "default", &probe, &format!("http://{hello_ip}:8080/")),
        );
        let seen: std::net::Ipv4Addr = reply["client"].as_str().unwrap().parse().unwrap();
        assert!(
            external_there.contains(&seen),
            "node {node} seen in the external CIDR as the provider names it ({external_there}): {reply}"
        );
    }

    // The other way: an offloaded probe reaches a local echo pod of the consumer at the
    // address the provider's view gives it, and is seen at the address the consumer reports
    // for the probe.
    ok(
        kubectl(
            &lab,
            "lab-1",
            &[
                "-n",
                "demo",
                "run",
                "probe-remote",
                "--image=tandem.dev/probe",
                "--overrides",
                r#"{"spec":{"nodeSelector":{"kubernetes.io/hostname":"tandem-milan"}}}"#,
            ],
        ),
        "offloaded probe",
    );
    // A local echo pod of the offloaded namespace (pinned to a real node), and one of a
    // namespace that is not offloaded.
    ok(
        kubectl(
            &lab,
            "lab-1",
            &[
                "-n",
                "demo",
                "run",
                "local-echo",
                "--image=tandem.dev/echo",
                "--overrides",
                &format!(r#"{{"spec":{{"nodeName":"{}"}}}}"#, nodes[0]),
            ],
        ),
        "local echo pod",
    );
    ok(
        kubectl(
            &lab,
            "lab-1",
            &["run", "private-echo", "--image=tandem.dev/echo"],
        ),
        "echo pod of a namespace that is not offloaded",
    );
    let running_ip = |ns: &str, name: &str| {
        let pod = json(&lab, "lab-1", &["-n", ns, "get", "pod", name]);
        (pod["status"]["phase"] == "Running")
            .then(|| {
                pod["status"]["podIP"]
                    .as_str()?
                    .parse::<std::net::Ipv4Addr>()
                    .ok()
            })
            .flatten()
    };
    let remote_probe_ip = until(
        "the offloaded probe Running",
        Duration::from_secs(60),
        || running_ip("demo", "probe-remote"),
    );
    let local_echo_ip = until(
        "the local echo pod Running",
        Duration::from_secs(60),
        || running_ip("demo", "local-echo"),
    );
    let private_echo_ip = until(
        "the private echo pod Running",
        Duration::from_secs(60),
        || running_ip("default", "private-echo"),
    );
    let in_prefix = |ip: std::net::Ipv4Addr, prefix: ipnet::Ipv4Net| {
        let host = u32::from(ip) & !u32::from(prefix.netmask());
        std::net::Ipv4Addr::from(u32::from(prefix.network()) | host)
    };
    // A Service of the offloaded namespace with one endpoint in each cluster: the offloaded
    // echo pod and the local one.
    for pod in ["hello", "local-echo"] {
        ok(
            kubectl(
                &lab,
                "lab-1",
                &["-n", "demo", "label", "pod", pod, "app=web"],
            ),
            "label",
        );
    }
    ok(
        kubectl(
            &lab,
            "lab-1",
            &[
                "-n",
                "demo",
                "create",
                "service",
                "clusterip",
                "web",
                "--tcp=8080:8080",
            ],
        ),
        "Service web",
    );
    // The provider's reflected EndpointSlice names the local echo pod at the address the
    // provider's view gives it (rome's prefix in milan, same host part).
    let there = in_prefix(local_echo_ip, ours_there);
    until(
        &format!("the reflected EndpointSlice of web in milan naming {there}"),
        Duration::from_secs(60),
        || {
            let slices = json(
                &lab,
                "lab-2",
                &[
                    "-n",
                    "demo-rome",
                    "get",
                    "endpointslices",
                    "-l",
                    "kubernetes.io/service-name=web",
                ],
            );
            let addresses: Vec<String> = slices["items"]
                .as_array()?
                .iter()
                .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
                .flat_map(|e| e["addresses"].as_array().cloned().unwrap_or_default())
                .filter_map(|a| a.as_str().map(str::to_string))
                .collect();
            addresses.contains(&there.to_string()).then_some(())
        },
    );
    let reply: Value = until(
        &format!("the offloaded probe reaching the local echo pod at {there}"),
        Duration::from_secs(60),
        || {
            probe_fetch(
                &lab,
                "demo",
                "probe-remote",
                &format!("http://{there}:8080/"),
            )
        },
    );
    assert_eq!(reply["cluster"], "lab-1", "{reply}");
    assert_eq!(reply["pod"], "local-echo", "{reply}");
    assert_eq!(
        reply["client"],
        remote_probe_ip.to_string(),
        "the consumer sees the offloaded probe at the address it reports for it: {reply}"
    );

    // 100 requests to the Service's ClusterIP from a consumer pod: both clusters answer. The
    // reflected Service in the provider, from a pod there (the offloaded probe), too.
    let cluster_ip = |ctx: &str, ns: &str| {
        json(&lab, ctx, &["-n", ns, "get", "service", "web"])["spec"]["clusterIP"]
            .as_str()
            .map(str::to_string)
    };
    let consumer_ip = cluster_ip("lab-1", "demo").expect("web's ClusterIP in rome");
    let provider_ip = until(
        "the reflected Service web in milan with a ClusterIP of its own",
        Duration::from_secs(60),
        || cluster_ip("lab-2", "demo-rome"),
    );
    for (ns, probe, ip) in [
        ("default", "probe-0", &consumer_ip),
        ("demo", "probe-remote", &provider_ip),
    ] {
        let answered = until(
            &format!("100 requests from {probe} to web at {ip} answered by both clusters"),
            Duration::from_secs(90),
            || {
                let out = kubectl(
                    &lab,
                    "lab-1",
                    &[
                        "-n",
                        ns,
                        "exec",
                        probe,
                        "--",
                        "probe",
                        "fetch",
                        "--count",
                        "100",
                        &format!("http://{ip}:8080/"),
                    ],
                );
                if !out.status.success() {
                    return None;
                }
                let mut by_cluster = std::collections::BTreeMap::<String, usize>::new();
                for line in String::from_utf8_lossy(&out.stdout).lines() {
                    let reply: Value = serde_json::from_str(line).ok()?;
                    *by_cluster
                        .entry(reply["cluster"].as_str()?.to_string())
                        .or_default() += 1;
                }
                (by_cluster.values().sum::<usize>() == 100 && by_cluster.len() == 2)
                    .then_some(by_cluster)
            },
        );
        assert_eq!(
            answered.keys().collect::<Vec<_>>(),
            ["lab-1", "lab-2"],
            "{answered:?}"
        );
    }

    // The requests went through the tunnel: its byte counters in `tandem status` moved (they
    // are refreshed with the virtual node's status, every 10 s at most).
    until(
        "tandem status counting bytes both ways through the tunnel",
        Duration::from_secs(40),
        || {
            let p = status_json()["providers"][0].clone();
            (p["tunnelRxBytes"].as_u64() > Some(0) && p["tunnelTxBytes"].as_u64() > Some(0))
                .then_some(())
        },
    );

    // Least exposure: through the tunnel, neither side opens connections to the other's
    // pods outside the peering (the same remapped prefixes and routes as above: only the
    // receiving gateway's filter differs).
    let private_there = in_prefix(private_echo_ip, ours_there);
    assert_eq!(
        probe_fetch(
            &lab,
            "demo",
            "probe-remote",
            &format!("http://{private_there}:8080/")
        ),
        None,
        "an offloaded pod reaches a consumer pod of a namespace that is not offloaded"
    );
    ok(
        kubectl(
            &lab,
            "lab-2",
            &["run", "provider-private", "--image=tandem.dev/echo"],
        ),
        "an echo pod of the provider's own",
    );
    let provider_private: std::net::Ipv4Addr = until(
        "the provider's own echo pod Running",
        Duration::from_secs(60),
        || {
            let pod = json(&lab, "lab-2", &["get", "pod", "provider-private"]);
            (pod["status"]["phase"] == "Running")
                .then(|| pod["status"]["podIP"].as_str()?.parse().ok())
                .flatten()
        },
    );
    let theirs_here: ipnet::Ipv4Net = network["remappedRemotePodCidr"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        probe_fetch(
            &lab,
            "default",
            "probe-0",
            &format!("http://{}:8080/", in_prefix(provider_private, theirs_here)),
        ),
        None,
        "a consumer pod reaches a provider pod outside the twin namespaces"
    );
    until(
        "the offloaded pod, in the same remapped prefix, still answering",
        Duration::from_secs(30),
        probe_0_to_hello,
    );

    // The data plane in the node namespaces: the gateway's TUN, table and routes on its
    // node, the agent's routes on the other.
    let prefix = instance_prefix(lab.child.id()).expect("a gateway process of this lab");
    let during = fabric_leftovers(&prefix);
    for want in ["proto 173", "link", "table inet tandem_t"] {
        assert!(
            during.iter().any(|l| l.contains(want)),
            "{want} while peered: {during:#?}"
        );
    }

    // The consumer's gateway killed with SIGKILL: its pod's process restarts, traffic
    // resumes, and the restarted gateway reconciles what the killed one left (one table and
    // one TUN link on its node, not two).
    let (killed, node_ns) = gateways(lab.child.id(), "milan")
        .into_iter()
        .next()
        .expect("the consumer's gateway process");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(killed as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let network_unavailable = |want: &str| {
        let node = json(&lab, "lab-1", &["get", "node", "tandem-milan"]);
        node["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "NetworkUnavailable" && c["status"] == want)
            .cloned()
    };
    // Checked before the restart: the new gateway may reconnect before a later look.
    let down = until(
        "the virtual node's NetworkUnavailable True while the gateway is down",
        Duration::from_secs(30),
        || network_unavailable("True"),
    );
    assert!(
        [
            "GatewayUnreachable",
            "GatewayNotRunning",
            "TunnelDown",
            "TunnelConnecting"
        ]
        .contains(&down["reason"].as_str().unwrap_or_default()),
        "{down}"
    );
    until(
        "a new gateway process after SIGKILL",
        Duration::from_secs(60),
        || {
            gateways(lab.child.id(), "milan")
                .iter()
                .any(|(pid, _)| *pid != killed)
                .then_some(())
        },
    );
    until(
        "traffic resuming after the gateway's restart",
        Duration::from_secs(60),
        probe_0_to_hello,
    );
    until(
        "the virtual node's NetworkUnavailable False again",
        Duration::from_secs(30),
        || network_unavailable("False"),
    );
    let on_node: Vec<String> = fabric_leftovers(&prefix)
        .into_iter()
        .filter(|l| l.starts_with(&format!("{node_ns}:")))
        .collect();
    for want in [": link", "table inet tandem_t"] {
        assert_eq!(
            on_node.iter().filter(|l| l.contains(want)).count(),
            1,
            "one {want} on the gateway's node after its restart: {on_node:#?}"
        );
    }

    // Unpeer: no gateway, key, agent or routes ConfigMap of the fabric left on either side.
    ok(
        tandem(
            home.path(),
            &["unpeer", "milan", "--kubeconfig", &kc, "--context", "lab-1"],
        ),
        "unpeer",
    );
    for ctx in ["lab-1", "lab-2"] {
        until(
            &format!("no fabric object left in {ctx}"),
            Duration::from_secs(60),
            || {
                let left = json(
                    &lab,
                    ctx,
                    &[
                        "-n",
                        "tandem-system",
                        "get",
                        "deployments,daemonsets,services,secrets,configmaps,serviceaccounts,roles,rolebindings",
                    ],
                );
                let names: Vec<String> = left["items"]
                    .as_array()?
                    .iter()
                    .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_string))
                    .filter(|n| {
                        n.starts_with("tandem-gateway")
                            || n.starts_with("tandem-agent")
                            || n == "tandem-routes"
                    })
                    .collect();
                names.is_empty().then_some(())
            },
        );
    }
    until(
        "no route, TUN link or nftables table of the fabric left in the node namespaces",
        Duration::from_secs(30),
        || fabric_leftovers(&prefix).is_empty().then_some(()),
    );
}

/// Three clusters on 10.244.0.0/16: rome (lab-1) consumes from milan (lab-2) and turin
/// (lab-3). Pods of each peered pair reach each other; milan's pods never reach turin's (no
/// transit through rome); rome's pods reach nothing of a provider outside the twin namespaces
/// (kube-system, tandem-system), whichever address they try.
/// On kind the kubeconfig's server is a loopback address, and no load balancer answers: the
/// invite names the API server's advertised address instead; the gateways' LoadBalancer
/// Services stay pending, and with the default `--gateway-service-type auto` each side
/// publishes its gateway's node address instead (kind's clusters share one node network),
/// says so in the Peering, and the tunnel comes up with no flag beyond the fabric's.
#[test]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
fn on_kind_the_pending_load_balancer_gives_way_to_the_node_address() {
    tandem_testing::needs_root();
    let home = tempfile::tempdir().unwrap();
    let lab = netlab::lab_up_as(home.path(), "lab", "2", "1", "kind");
    let kc = lab.kubeconfig.clone();
    netlab::load_tandem_image(home.path(), "lab");
    install_with_fabric(home.path(), &kc, &[("lab-1", "rome"), ("lab-2", "milan")]);
    // The kubeconfig's server is a loopback address, as kind's is: the invite names the
    // address lab-2's API server advertises on the node network instead, and says so.
    let out = tandem(
        home.path(),
        &["invite", "--kubeconfig", &kc, "--context", "lab-2"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let invite = ok(out, "invite without --endpoint");
    assert!(
        stderr.contains("is a loopback address; the invite names https://172.19.0.1:6443"),
        "{stderr}"
    );
    let out = tandem(
        home.path(),
        &[
            "peer",
            invite.trim(),
            "--kubeconfig",
            &kc,
            "--context",
            "lab-1",
        ],
    );
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    ok(out, "peer through the derived endpoint");
    // peer returns once the virtual node takes pods: the tunnel is up, nothing taints it, so
    // a Deployment created now may land there.
    assert!(said.contains("✓ the virtual node takes pods"), "{said}");
    let node = json(&lab, "lab-1", &["get", "node", "tandem-milan"]);
    let network = node["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "NetworkUnavailable")
        .cloned();
    assert_eq!(
        network.as_ref().map(|c| c["status"].clone()),
        Some(Value::from("False")),
        "{node}"
    );
    assert!(
        !node["spec"]["taints"]
            .to_string()
            .contains("network-unavailable"),
        "{node}"
    );

    let params = until(
        "both gateway endpoints in the NetworkParameters",
        Duration::from_secs(120),
        || {
            let np = json(
                &lab,
                "lab-2",
                &["-n", "tandem-tenant-rome", "get", "networkparameters"],
            );
            let items = np["items"].as_array()?.clone();
            (items.len() == 2
                && items
                    .iter()
                    .all(|p| p["spec"]["gatewayEndpoint"].is_string()))
            .then_some(items)
        },
    );
    for p in &params {
        let endpoint = p["spec"]["gatewayEndpoint"].as_str().unwrap();
        assert!(
            endpoint.starts_with("172.18.0.") || endpoint.starts_with("172.19.0."),
            "the endpoint is the gateway's node address: {p}"
        );
    }
    for ctx in ["lab-1", "lab-2"] {
        let services = json(&lab, ctx, &["-n", "tandem-system", "get", "services"]);
        let gateway = services["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| {
                s["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .starts_with("tandem-gateway-")
            })
            .cloned()
            .unwrap_or_else(|| panic!("{ctx}'s gateway Service: {services}"));
        assert_eq!(gateway["spec"]["type"], "LoadBalancer", "{gateway}");
        assert!(
            gateway["status"]["loadBalancer"]["ingress"].is_null(),
            "no load balancer on kind: {gateway}"
        );
    }
    // The consumer's Peering says where the provider reaches its gateway, and why there.
    let exposed = until(
        "the Peering's GatewayExposed condition",
        Duration::from_secs(60),
        || {
            let peering = json(&lab, "lab-1", &["get", "peering", "milan"]);
            peering["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "GatewayExposed" && c["status"] == "True")
                .cloned()
        },
    );
    let message = exposed["message"].as_str().unwrap();
    assert!(
        message.contains("172.18.0.") && message.contains("no load balancer answered"),
        "{exposed}"
    );
    tunnel_connected(&lab);
}

#[test]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
fn three_clusters_pairs_connect_and_nothing_transits() {
    tandem_testing::needs_root();
    let home = tempfile::tempdir().unwrap();
    let lab = rome_consumes_from_milan_and_turin(home.path());
    let kc = lab.kubeconfig.clone();
    ok(
        kubectl(&lab, "lab-1", &["create", "namespace", "demo"]),
        "namespace",
    );
    ok(
        tandem(
            home.path(),
            &[
                "offload",
                "namespace",
                "demo",
                "--kubeconfig",
                &kc,
                "--context",
                "lab-1",
            ],
        ),
        "offload",
    );
    let on = |node: &str| {
        format!(r#"{{"spec":{{"nodeSelector":{{"kubernetes.io/hostname":"{node}"}}}}}}"#)
    };
    // In rome: a local echo pod and a probe of the offloaded namespace; an echo pod and a
    // probe offloaded to each provider (their addresses as rome reports them).
    let local_echo = run_pod(
        &lab,
        "lab-1",
        "demo",
        "local-echo",
        "echo",
        Some(&on("lab-1-node-1")),
    );
    run_pod(
        &lab,
        "lab-1",
        "demo",
        "probe",
        "probe",
        Some(&on("lab-1-node-1")),
    );
    let milan_echo = run_pod(
        &lab,
        "lab-1",
        "demo",
        "milan-echo",
        "echo",
        Some(&on("tandem-milan")),
    );
    let turin_echo = run_pod(
        &lab,
        "lab-1",
        "demo",
        "turin-echo",
        "echo",
        Some(&on("tandem-turin")),
    );
    run_pod(
        &lab,
        "lab-1",
        "demo",
        "milan-probe",
        "probe",
        Some(&on("tandem-milan")),
    );
    run_pod(
        &lab,
        "lab-1",
        "demo",
        "turin-probe",
        "probe",
        Some(&on("tandem-turin")),
    );
    // The same pods as their providers see them.
    let provider_ip = |ctx: &str, name: &str| -> std::net::Ipv4Addr {
        json(&lab, ctx, &["-n", "demo-rome", "get", "pod", name])["status"]["podIP"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    let turin_echo_there = provider_ip("lab-3", "turin-echo");
    let rome_in = |ctx: &str| -> ipnet::Ipv4Net {
        let peering = if ctx == "lab-2" { "milan" } else { "turin" };
        json(&lab, "lab-1", &["get", "peering", peering])["status"]["network"]
            ["localPodCidrInRemote"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    let in_prefix = |ip: std::net::Ipv4Addr, prefix: ipnet::Ipv4Net| {
        let host = u32::from(ip) & !u32::from(prefix.netmask());
        std::net::Ipv4Addr::from(u32::from(prefix.network()) | host)
    };
    let url = |ip: std::net::Ipv4Addr| format!("http://{ip}:8080/");

    // Each peered pair, both ways.
    for (echo, cluster) in [(milan_echo, "lab-2"), (turin_echo, "lab-3")] {
        let reply = until(
            &format!("rome's probe reaching the echo pod in {cluster} at {echo}"),
            Duration::from_secs(60),
            || probe_fetch(&lab, "demo", "probe", &url(echo)),
        );
        assert_eq!(reply["cluster"], cluster, "{reply}");
    }
    for (probe, ctx) in [("milan-probe", "lab-2"), ("turin-probe", "lab-3")] {
        let there = in_prefix(local_echo, rome_in(ctx));
        let reply = until(
            &format!("{probe} reaching rome's local echo pod at {there}"),
            Duration::from_secs(60),
            || probe_fetch(&lab, "demo", probe, &url(there)),
        );
        assert_eq!(reply["cluster"], "lab-1", "{reply}");
    }

    // No transit: from milan, turin's echo pod is unreachable at the address rome gives it
    // and at turin's own; whatever answers is never turin (the latter address is also a
    // milan pod's, as both clusters use 10.244.0.0/16).
    for addr in [turin_echo, turin_echo_there] {
        let reply = probe_fetch(&lab, "demo", "milan-probe", &url(addr));
        assert!(
            reply.as_ref().is_none_or(|r| r["cluster"] != "lab-3"),
            "milan's pod reached turin's at {addr} through rome: {reply:?}"
        );
    }

    // Least exposure: echo pods in milan's kube-system and tandem-system, tried from rome's
    // probe at the address rome's view gives milan's pods and at milan's own.
    let milan_view: ipnet::Ipv4Net = json(&lab, "lab-1", &["get", "peering", "milan"])["status"]
        ["network"]["remappedRemotePodCidr"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    for ns in ["kube-system", "tandem-system"] {
        let ip = run_pod(&lab, "lab-2", ns, "private-echo", "echo", None);
        for addr in [in_prefix(ip, milan_view), ip] {
            let reply = probe_fetch(&lab, "demo", "probe", &url(addr));
            assert!(
                reply.as_ref().is_none_or(|r| r["cluster"] != "lab-2"),
                "rome's pod reached milan's {ns} at {addr}: {reply:?}"
            );
        }
    }
    // …while the offloaded pod, in the same remapped prefix, still answers.
    until(
        "milan's offloaded echo pod still answering",
        Duration::from_secs(30),
        || probe_fetch(&lab, "demo", "probe", &url(milan_echo)),
    );
}

/// `tandem demo --network`: real pods and the fabric; its last table shows requests crossing
/// clusters both ways — the consumer's probe answered by the provider's pods too, the
/// offloaded probe by the consumer's — and the lab leaves no namespace behind on exit.
#[test]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
fn demo_network_shows_requests_crossing_clusters() {
    tandem_testing::needs_root();
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("demo");
    let out = ok(
        tandem(
            home.path(),
            &[
                "demo",
                "--network",
                "--exit",
                "--dir",
                dir.to_str().unwrap(),
            ],
        ),
        "tandem demo --network",
    );
    let row = |probe: &str| {
        out.lines()
            .find(|l| l.starts_with(probe))
            .unwrap_or_else(|| panic!("no {probe} row in:\n{out}"))
            .to_string()
    };
    let (local, offloaded) = (row("probe-local "), row("probe-offloaded "));
    assert!(
        local.contains(" lab-1 ") && local.contains("lab-2 ×"),
        "the consumer's probe is answered by the provider's pods too: {local}\n{out}"
    );
    assert!(
        offloaded.contains(" lab-2 ") && offloaded.contains("lab-1 ×"),
        "the offloaded probe reaches the consumer's pods: {offloaded}\n{out}"
    );
    assert!(
        out.contains("pod(s) run in lab-1") && !out.contains(", 0 in lab-2"),
        "{out}"
    );
}

/// rome and milan peered both ways (each consumes from the other): one tunnel serves both
/// relations, each side's offloaded pod is reached from the other, and unpeering one direction
/// leaves the other's traffic, gateway and key in place.
#[test]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
fn peered_both_ways_one_tunnel_serves_both_and_survives_unpeering_one() {
    tandem_testing::needs_root();
    let home = tempfile::tempdir().unwrap();
    let lab = lab_up_with_nodes(home.path(), "lab", "2", "1");
    let kc = lab.kubeconfig.clone();
    install_with_fabric(home.path(), &kc, &[("lab-1", "rome"), ("lab-2", "milan")]);
    peer_with(home.path(), &kc, "lab-1", 2);
    peer_with(home.path(), &kc, "lab-2", 1);
    // Each side offloads a namespace to the other and runs an echo pod there, and a probe of
    // its own.
    for (ctx, vn) in [("lab-1", "tandem-milan"), ("lab-2", "tandem-rome")] {
        ok(
            kubectl(&lab, ctx, &["create", "namespace", "demo"]),
            "namespace",
        );
        ok(
            tandem(
                home.path(),
                &[
                    "offload",
                    "namespace",
                    "demo",
                    "--kubeconfig",
                    &kc,
                    "--context",
                    ctx,
                ],
            ),
            &format!("offload on {ctx}"),
        );
        let on = format!(r#"{{"spec":{{"nodeSelector":{{"kubernetes.io/hostname":"{vn}"}}}}}}"#);
        run_pod(&lab, ctx, "demo", "echo", "echo", Some(&on));
        let local = format!(r#"{{"spec":{{"nodeName":"{ctx}-node-1"}}}}"#);
        run_pod(&lab, ctx, "demo", "probe", "probe", Some(&local));
    }
    // One gateway per side, for the pair.
    for ctx in ["lab-1", "lab-2"] {
        let gateways = json(
            &lab,
            ctx,
            &[
                "-n",
                "tandem-system",
                "get",
                "deployments",
                "-l",
                "app.kubernetes.io/name=tandem-gateway",
            ],
        );
        assert_eq!(
            gateways["items"].as_array().map(Vec::len),
            Some(1),
            "one gateway in {ctx}: {gateways}"
        );
    }
    let echo_ip = |ctx: &str| {
        json(&lab, ctx, &["-n", "demo", "get", "pod", "echo"])["status"]["podIP"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let reach = |ctx: &str, want: &str| {
        let ip = echo_ip(ctx);
        let reply = until(
            &format!("{ctx}'s probe reaching its offloaded echo pod at {ip}"),
            Duration::from_secs(60),
            || probe_fetch_in(&lab, ctx, "demo", "probe", &format!("http://{ip}:8080/")),
        );
        assert_eq!(reply["cluster"], want, "{reply}");
    };
    reach("lab-1", "lab-2");
    reach("lab-2", "lab-1");

    // The wider mode: with milan's exposure set to its whole pod CIDR, rome reaches a milan
    // pod outside the peering, which least exposure kept out before.
    let own = run_pod(&lab, "lab-2", "default", "own-echo", "echo", None);
    let milan_here: ipnet::Ipv4Net = json(&lab, "lab-1", &["get", "peering", "milan"])["status"]
        ["network"]["remappedRemotePodCidr"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let host = u32::from(own) & !u32::from(milan_here.netmask());
    let own_here = std::net::Ipv4Addr::from(u32::from(milan_here.network()) | host);
    let own_url = format!("http://{own_here}:8080/");
    assert_eq!(
        probe_fetch_in(&lab, "lab-1", "demo", "probe", &own_url),
        None,
        "least exposure: rome reaches milan's own pod at {own_here}"
    );
    ok(
        tandem(
            home.path(),
            &[
                "install",
                "--kubeconfig",
                &kc,
                "--context",
                "lab-2",
                "--network-exposure",
                "pod-cidr",
            ],
        ),
        "install --network-exposure pod-cidr on milan",
    );
    let reply = until(
        &format!("rome reaching milan's own pod at {own_here} with the pod-cidr exposure"),
        Duration::from_secs(60),
        || probe_fetch_in(&lab, "lab-1", "demo", "probe", &own_url),
    );
    assert_eq!(reply["pod"], "own-echo", "{reply}");

    // rome stops consuming from milan (its Peering deleted: kubectl waits for the unpeering);
    // milan still consumes from rome, through the same tunnel.
    ok(
        kubectl(
            &lab,
            "lab-1",
            &["delete", "peering", "milan", "--timeout=90s"],
        ),
        "delete rome's Peering with milan",
    );
    reach("lab-2", "lab-1");
    for ctx in ["lab-1", "lab-2"] {
        let secrets = json(&lab, ctx, &["-n", "tandem-system", "get", "secrets"]);
        let names: Vec<&str> = secrets["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|s| s["metadata"]["name"].as_str())
            .collect();
        assert!(
            names.iter().any(|n| n.starts_with("tandem-gateway-")),
            "{ctx} keeps its gateway key while a peering with the other is left: {names:?}"
        );
    }

    // milan unpeers from rome too: nothing of the pair's tunnel is left on either side.
    ok(
        tandem(
            home.path(),
            &["unpeer", "rome", "--kubeconfig", &kc, "--context", "lab-2"],
        ),
        "unpeer milan→rome",
    );
    for ctx in ["lab-1", "lab-2"] {
        until(
            &format!("no gateway or gateway key left in {ctx}"),
            Duration::from_secs(60),
            || {
                let left = json(
                    &lab,
                    ctx,
                    &["-n", "tandem-system", "get", "deployments,secrets"],
                );
                left["items"]
                    .as_array()?
                    .iter()
                    .all(|o| {
                        !o["metadata"]["name"]
                            .as_str()
                            .unwrap_or_default()
                            .starts_with("tandem-gateway-")
                    })
                    .then_some(())
            },
        );
    }
}
