//! mDNS discovery among network-mode lab clusters. Three clusters whose nodes share the lab's
//! site LAN (a bridge in the lab's WAN namespace: nothing reaches the host's network) run
//! Tandem's controller as their Deployment's pod with hostNetwork, as a real cluster must for
//! its multicast to reach the nodes' LAN. Each advertises with `tandem advertise --mdns`;
//! `tandem discover --mdns` on each lists the other two with the endpoint each advertised,
//! its region and the SHA-256 of its CA (read here from the kubeconfig, not from Tandem); a
//! cluster that stops advertising is listed as not seen. A controller left in its pod's own
//! network hears nobody, since multicast stays on the link it was sent on.

use std::time::Duration;

use serde_json::Value;

use crate::netlab;
use netlab::{Lab, json, kubectl, lab_up, ok, tandem, until};

const IDS: [&str; 3] = ["milan", "rome", "turin"];

/// The SHA-256 fingerprint of cluster `ctx`'s CA, from the kubeconfig's certificate data.
fn ca_fingerprint(lab: &Lab, ctx: &str) -> String {
    use base64::Engine as _;
    let config = kube::config::Kubeconfig::read_from(&lab.kubeconfig).unwrap();
    let cluster = config
        .clusters
        .iter()
        .find(|c| c.name == ctx)
        .and_then(|c| c.cluster.as_ref())
        .unwrap();
    let pem = base64::engine::general_purpose::STANDARD
        .decode(cluster.certificate_authority_data.as_ref().unwrap())
        .unwrap();
    let body: String = String::from_utf8(pem)
        .unwrap()
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN CERTIFICATE"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(body)
        .unwrap();
    tandem_core::discovery::fingerprint(&der)
}

/// Puts `ctx`'s controller on its node's network, as the README tells an administrator to.
fn host_network(lab: &Lab, ctx: &str) {
    ok(
        kubectl(
            lab,
            ctx,
            &[
                "-n",
                "tandem-system",
                "patch",
                "deployment",
                "tandem-controller",
                "--type",
                "merge",
                "-p",
                r#"{"spec":{"template":{"spec":{"hostNetwork":true,"dnsPolicy":"ClusterFirstWithHostNet"}}}}"#,
            ],
        ),
        &format!("kubectl patch deployment tandem-controller (hostNetwork) on {ctx}"),
    );
}

/// The controller's pod in `ctx`, once exactly one is Running and Ready.
fn controller_pod(lab: &Lab, ctx: &str) -> Value {
    until(
        &format!("{ctx}'s controller pod Ready"),
        Duration::from_secs(120),
        || {
            let pods = json(
                lab,
                ctx,
                &[
                    "get",
                    "pods",
                    "-n",
                    "tandem-system",
                    "-l",
                    "app.kubernetes.io/name=tandem-controller",
                ],
            );
            let items = pods["items"].as_array()?.clone();
            let [pod] = &items[..] else { return None };
            let ready = pod["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            (ready && pod["metadata"]["deletionTimestamp"].is_null()).then(|| pod.clone())
        },
    )
}

#[test]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
fn three_lab_clusters_hear_each_other_over_mdns_on_their_lan() {
    tandem_testing::needs_root();
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    let lab = lab_up(home, "mdns", "3");
    let kubeconfig = lab.kubeconfig.clone();
    let on = |ctx: &str, args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--kubeconfig", &kubeconfig, "--context", ctx]);
        tandem(home, &all)
    };
    let ctx = |i: usize| format!("lab-{}", i + 1);
    let endpoint = |i: usize| format!("https://198.18.{}.2:6443", i + 1);

    for (i, id) in IDS.iter().enumerate() {
        ok(
            on(&ctx(i), &["install", "--cluster-id", id]),
            &format!("install on {}", ctx(i)),
        );
    }
    // Rome's controller stays in its pod's network: its multicast goes nowhere.
    controller_pod(&lab, &ctx(1));
    let out = on(
        &ctx(1),
        &["advertise", "--mdns", "--endpoint", &endpoint(1)],
    );
    ok(out, "advertise --mdns from rome's pod network");

    // Milan's and turin's controllers on their node's network, which has the site LAN.
    for i in [0, 2] {
        host_network(&lab, &ctx(i));
    }
    for i in [0, 2] {
        let pod = until(
            &format!("{}'s controller pod on hostNetwork", ctx(i)),
            Duration::from_secs(120),
            || {
                let pod = controller_pod(&lab, &ctx(i));
                (pod["spec"]["hostNetwork"] == true).then_some(pod)
            },
        );
        // On the node's network, the pod's IP is its node's.
        assert_eq!(pod["status"]["podIP"], pod["status"]["hostIP"], "{pod}");
        ok(
            on(
                &ctx(i),
                &["advertise", "--mdns", "--endpoint", &endpoint(i)],
            ),
            &format!("advertise --mdns on {}", ctx(i)),
        );
    }

    // Milan hears turin and turin milan, each with what it advertised.
    let listed = |i: usize| -> Vec<Value> {
        let out = ok(
            on(&ctx(i), &["discover", "--mdns", "-o", "json"]),
            &format!("discover --mdns on {}", ctx(i)),
        );
        serde_json::from_str::<Value>(&out)
            .unwrap()
            .as_array()
            .unwrap()
            .clone()
    };
    let seen = |i: usize, other: usize| -> Option<Value> {
        listed(i)
            .into_iter()
            .find(|c| c["clusterID"] == IDS[other] && c["seen"] == true)
    };
    for (i, other) in [(0, 2), (2, 0)] {
        let entry = until(
            &format!("{} listing {}", IDS[i], IDS[other]),
            Duration::from_secs(60),
            || seen(i, other),
        );
        let region = tandem_lab::lab::cluster_config(other + 1, 1, None).region;
        assert_eq!(entry["endpoint"], endpoint(other), "{entry}");
        assert_eq!(entry["region"], region.as_str(), "{entry}");
        assert_eq!(
            entry["caFingerprint"],
            ca_fingerprint(&lab, &ctx(other)).as_str(),
            "{entry}"
        );
        assert_eq!(entry["source"], "mDNS", "{entry}");
        assert_eq!(entry["protocolVersion"], tandem_core::protocol::VERSION);
        assert_eq!(entry["peered"], false, "{entry}");
    }

    // Rome, in its pod's network, is heard by nobody and hears nobody.
    for i in [0, 2] {
        assert!(
            !listed(i).iter().any(|c| c["clusterID"] == "rome"),
            "{} heard rome from its pod network",
            IDS[i]
        );
    }
    let rome = on(&ctx(1), &["discover", "--mdns", "-o", "json"]);
    assert_eq!(ok(rome, "discover --mdns on rome").trim(), "[]");

    // Rome joins its node's LAN too: all three list the other two.
    host_network(&lab, &ctx(1));
    until(
        "rome's controller pod on hostNetwork",
        Duration::from_secs(120),
        || (controller_pod(&lab, &ctx(1))["spec"]["hostNetwork"] == true).then_some(()),
    );
    // The new pod reads the settings anew: advertising and browsing resume by themselves.
    for (i, id) in IDS.iter().enumerate() {
        for other in (0..3).filter(|o| *o != i) {
            until(
                &format!("{id} listing {}", IDS[other]),
                Duration::from_secs(60),
                || seen(i, other),
            );
        }
    }
    let table = ok(on(&ctx(1), &["discover", "--mdns"]), "discover --mdns");
    for id in ["milan", "turin"] {
        let row = table
            .lines()
            .find(|l| l.starts_with(&format!("{id} ")))
            .unwrap_or_else(|| panic!("{id} not listed:\n{table}"));
        assert!(row.contains("mDNS") && row.contains("Seen"), "{row}");
    }

    // Turin stops advertising: milan and rome list it as not seen.
    let off = ok(on(&ctx(2), &["advertise", "--off"]), "advertise --off");
    assert!(off.contains("no longer announced"), "{off}");
    for i in [0, 1] {
        until(
            &format!("{} listing turin as not seen", IDS[i]),
            Duration::from_secs(60),
            || {
                listed(i)
                    .into_iter()
                    .find(|c| c["clusterID"] == "turin" && c["seen"] == false)
            },
        );
        assert!(seen(i, 1 - i).is_some(), "{} lost its other peer", IDS[i]);
    }
}
