//! `tandem discover --domain` across the WAN: the records `tandem advertise --domain` prints on
//! one lab cluster, served by a test DNS server, make `tandem discover --domain` on another
//! list it (endpoint, region, fingerprint) and record it as a DiscoveredCluster; a record past
//! its TTL shows as not seen; a broken instance is skipped by name; a domain without records
//! and an unreachable nameserver are clear errors.

use std::collections::BTreeMap;
use std::net::UdpSocket;
use std::time::Duration;

use tandem_dns::hickory_proto::op::{Message, MessageType, ResponseCode};
use tandem_dns::hickory_proto::rr::rdata::{A, PTR, SRV, TXT};
use tandem_dns::hickory_proto::rr::{Name, RData, Record, RecordType};

use crate::netlab;
use netlab::{hollow_lab, ok, tandem, until};

/// The records of zone-file lines as `tandem advertise` prints them (`NAME TTL IN TYPE DATA`),
/// read independently of the code that wrote them.
fn parse_zone(lines: &[&str]) -> Vec<Record> {
    lines
        .iter()
        .map(|line| {
            let mut words = line.splitn(5, ' ');
            let name = Name::from_ascii(words.next().unwrap()).unwrap();
            let ttl: u32 = words.next().unwrap().parse().unwrap();
            assert_eq!(words.next(), Some("IN"), "{line}");
            let kind = words.next().unwrap();
            let data = words.next().unwrap();
            let rdata = match kind {
                "PTR" => RData::PTR(PTR(Name::from_ascii(data).unwrap())),
                "SRV" => {
                    let f: Vec<&str> = data.split(' ').collect();
                    RData::SRV(SRV::new(
                        f[0].parse().unwrap(),
                        f[1].parse().unwrap(),
                        f[2].parse().unwrap(),
                        Name::from_ascii(f[3]).unwrap(),
                    ))
                }
                "TXT" => RData::TXT(TXT::new(
                    data.split('"')
                        .skip(1)
                        .step_by(2)
                        .map(str::to_string)
                        .collect(),
                )),
                "A" => RData::A(A(data.parse().unwrap())),
                other => panic!("unexpected record type {other} in {line}"),
            };
            Record::from_rdata(name, ttl, rdata)
        })
        .collect()
}

/// An authoritative server for `records` on 127.0.0.1 (UDP), answering until the test ends.
fn serve(records: Vec<Record>) -> std::net::SocketAddr {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = socket.local_addr().unwrap();
    let mut zone: BTreeMap<(String, RecordType), Vec<Record>> = BTreeMap::new();
    for r in records {
        zone.entry((r.name().to_ascii().to_ascii_lowercase(), r.record_type()))
            .or_default()
            .push(r);
    }
    std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        loop {
            let Ok((n, from)) = socket.recv_from(&mut buf) else {
                return;
            };
            let Ok(query) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            let mut answer = Message::new();
            answer
                .set_id(query.id())
                .set_message_type(MessageType::Response)
                .set_authoritative(true);
            for q in query.queries() {
                answer.add_query(q.clone());
                let name = q.name().to_ascii().to_ascii_lowercase();
                match zone.get(&(name.clone(), q.query_type())) {
                    Some(found) => {
                        answer.add_answers(found.iter().cloned());
                    }
                    None if zone.keys().any(|(n, _)| *n == name) => {}
                    None => {
                        answer.set_response_code(ResponseCode::NXDomain);
                    }
                }
            }
            let _ = socket.send_to(&answer.to_vec().unwrap(), from);
        }
    });
    addr
}

#[test]
fn records_advertise_prints_make_discover_list_the_cluster_until_their_ttl_passes() {
    let home = tempfile::tempdir().unwrap();
    let lab = hollow_lab(home.path(), "2");
    let on = |ctx: &'static str, args: &[&str]| {
        let mut all = vec!["--kubeconfig", lab.kubeconfig.as_str(), "--context", ctx];
        all.extend_from_slice(args);
        tandem(home.path(), &all)
    };
    ok(
        on("lab-1", &["install", "--cluster-id", "milan"]),
        "install milan",
    );
    ok(
        on("lab-2", &["install", "--cluster-id", "rome"]),
        "install rome",
    );

    let printed = ok(
        on(
            "lab-1",
            &["advertise", "--domain", "example.org", "--ttl", "5"],
        ),
        "advertise",
    );
    let mut lines: Vec<&str> = printed.lines().filter(|l| !l.starts_with(';')).collect();
    // A second instance under the domain whose TXT is not an advertisement; a third that
    // carries milan's TXT under another instance label; a fourth named outside the service.
    let decoy_txt = lines
        .iter()
        .find(|l| l.starts_with("milan._tandem._tcp.example.org.") && l.contains(" IN TXT "))
        .expect("advertise prints milan's TXT")
        .replacen("milan.", "decoy.", 1);
    let outside_txt = decoy_txt.replacen("decoy._tandem._tcp.", "milan.elsewhere.", 1);
    lines.extend([
        "_tandem._tcp.example.org. 5 IN PTR broken._tandem._tcp.example.org.",
        "broken._tandem._tcp.example.org. 5 IN TXT \"id=broken\"",
        "_tandem._tcp.example.org. 5 IN PTR decoy._tandem._tcp.example.org.",
        decoy_txt.as_str(),
        "_tandem._tcp.example.org. 5 IN PTR milan.elsewhere.example.org.",
        outside_txt.as_str(),
    ]);
    let records = parse_zone(&lines);
    let milan_txt: Vec<String> = records
        .iter()
        .find_map(|r| match r.data() {
            RData::TXT(t) if r.name().to_ascii().starts_with("milan.") => Some(
                t.iter()
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .collect(),
            ),
            _ => None,
        })
        .unwrap();
    let advertised = tandem_core::discovery::Advertisement::from_txt(&milan_txt).unwrap();
    let server = serve(records).to_string();

    // Rome browses example.org: milan is listed, the broken instance skipped by name.
    let out = on(
        "lab-2",
        &[
            "discover",
            "--domain",
            "example.org",
            "--nameserver",
            &server,
        ],
    );
    let table = ok(out.clone(), "discover --domain");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("skipped broken._tandem._tcp.example.org.: TXT record has no \"v\""),
        "{said}"
    );
    assert!(
        said.contains("skipped decoy._tandem._tcp.example.org.: its TXT names cluster \"milan\""),
        "{said}"
    );
    assert!(
        said.contains(
            "skipped milan.elsewhere.example.org.: not an instance of _tandem._tcp.example.org."
        ),
        "{said}"
    );
    let row = table
        .lines()
        .find(|l| l.starts_with("milan "))
        .unwrap_or_else(|| panic!("milan is not listed:\n{table}"));
    for cell in [
        advertised.endpoint.as_str(),
        "eu-west",
        "DNS (example.org)",
        "Seen",
        "v1",
        advertised.ca_fingerprint.as_str(),
    ] {
        assert!(row.contains(cell), "{cell:?} missing from {row:?}");
    }
    assert!(!table.contains("broken"), "{table}");

    // Recorded as a DiscoveredCluster kubectl sees, and as JSON.
    let listed = ok(
        netlab::kubectl(&lab, "lab-2", &["get", "discoveredclusters", "-o", "name"]),
        "kubectl get discoveredclusters",
    );
    assert_eq!(listed.trim(), "discoveredcluster.tandem.dev/milan");
    let json = |out: String| -> serde_json::Value { serde_json::from_str(&out).unwrap() };
    let first = json(ok(
        on("lab-2", &["discover", "-o", "json"]),
        "discover -o json",
    ));
    assert_eq!(first[0]["clusterID"], "milan", "{first}");
    assert_eq!(first[0]["endpoint"], advertised.endpoint.as_str());
    assert_eq!(
        first[0]["caFingerprint"],
        advertised.ca_fingerprint.as_str()
    );
    assert_eq!(first[0]["region"], "eu-west");
    assert_eq!(first[0]["protocolVersion"], tandem_core::protocol::VERSION);
    assert_eq!(first[0]["seen"], true);
    assert_eq!(first[0]["peered"], false);

    // Not seen again within its TTL (5 s): shown as not seen.
    until("milan shown as not seen", Duration::from_secs(60), || {
        let now = json(ok(on("lab-2", &["discover", "-o", "json"]), "discover"));
        (now[0]["seen"] == false).then_some(())
    });
    let table = ok(on("lab-2", &["discover"]), "discover");
    assert!(table.contains("NotSeen"), "{table}");
    // Browsing again refreshes it.
    ok(
        on(
            "lab-2",
            &[
                "discover",
                "--domain",
                "example.org",
                "--nameserver",
                &server,
            ],
        ),
        "discover again",
    );
    let again = json(ok(on("lab-2", &["discover", "-o", "json"]), "discover"));
    assert_eq!(again[0]["seen"], true, "{again}");

    // Milan browsing the same domain does not record itself.
    let out = on(
        "lab-1",
        &[
            "discover",
            "--domain",
            "example.org",
            "--nameserver",
            &server,
        ],
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("this cluster's own advertisement"), "{said}");
    let mine = ok(
        netlab::kubectl(&lab, "lab-1", &["get", "discoveredclusters", "-o", "name"]),
        "kubectl get",
    );
    assert_eq!(mine.trim(), "", "milan recorded itself");

    // A domain with no records, an unreachable nameserver: errors that say what failed.
    let fails_saying = |nameserver: &str, domain: &str, what: &str| {
        let out = on(
            "lab-2",
            &["discover", "--domain", domain, "--nameserver", nameserver],
        );
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && said.contains(what), "{said}");
    };
    fails_saying(
        &server,
        "nobody.example",
        "no _tandem._tcp records under nobody.example",
    );
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let silent_addr = silent.local_addr().unwrap().to_string();
    fails_saying(
        &silent_addr,
        "example.org",
        &format!("{silent_addr} did not answer"),
    );
    drop(silent);
    // What was recorded before is still there.
    let kept = json(ok(on("lab-2", &["discover", "-o", "json"]), "discover"));
    assert_eq!(kept[0]["clusterID"], "milan", "{kept}");

    // mDNS: a hollow lab cluster's controller runs in the host's network, which lab traffic
    // never leaves: it refuses, and says why, rather than multicast on the host's LAN.
    for args in [&["advertise", "--mdns"][..], &["discover", "--mdns"][..]] {
        let out = on("lab-1", args);
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success()
                && said.contains("the controller's mDNS failed: opening UDP port 5353")
                && said.contains("a hollow lab cluster has no LAN of its own"),
            "{args:?}: {said}"
        );
    }
    let off = ok(on("lab-1", &["advertise", "--off"]), "advertise --off");
    assert!(off.contains("no longer announced"), "{off}");
    ok(
        on("lab-1", &["discover", "--mdns-off"]),
        "discover --mdns-off",
    );
    // The controller says its mDNS is off, and no setting is left.
    until(
        "the controller reports mDNS off",
        Duration::from_secs(60),
        || {
            let state = ok(
                netlab::kubectl(
                    &lab,
                    "lab-1",
                    &[
                        "get",
                        "configmap",
                        "-n",
                        "tandem-system",
                        "tandem-discovery",
                        "-o",
                        "jsonpath={.metadata.annotations.tandem\\.dev/mdns-state} \
                     {.data.mdns-advertise}{.data.mdns-browse}",
                    ],
                ),
                "kubectl get configmap tandem-discovery",
            );
            (state.trim() == "off").then_some(())
        },
    );
}
