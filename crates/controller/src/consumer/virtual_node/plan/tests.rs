//! The virtual node's decisions as an administrator sees them on the Node (`kubectl get node`,
//! `kubectl describe node`): its labels, taint and capacity, when it is applied, Ready or not
//! and why, what NetworkUnavailable says of the tunnel, when its status is posted, what becomes
//! of it when deleted by hand, and the Lease that heartbeats for it.

use super::*;
use k8s_openapi::api::core::v1::{NodeSpec, Taint};

const NODE: &str = "tandem-milan";
const PROVIDER: &str = "milan";

/// (case, last applied, marks lost, found deleted, decision).
type ApplyCase<'a> = (&'a str, Option<&'a Value>, bool, bool, Option<Apply>);
/// (case, seconds from the start to the last answer, the last failure, seconds since the
/// start, readiness, Ready as `kubectl describe node` shows it: status, reason, message).
type ReadinessCase<'a> = (
    &'a str,
    Option<u64>,
    Option<&'a str>,
    u64,
    Result<(), NotReady>,
    (bool, &'a str, &'a str),
);

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The virtual node as the API server holds it: marked as `desired_node` marks it.
struct NodeFixture(Node);

impl NodeFixture {
    fn marked() -> Self {
        NodeFixture(serde_json::from_value(desired_node(NODE, PROVIDER, &BTreeMap::new())).unwrap())
    }
    fn label(mut self, key: &str, value: Option<&str>) -> Self {
        let labels = self.0.metadata.labels.get_or_insert_default();
        match value {
            Some(v) => labels.insert(key.into(), v.into()),
            None => labels.remove(key),
        };
        self
    }
    fn taints(mut self, taints: &[(&str, &str, Option<&str>)]) -> Self {
        self.0.spec = Some(NodeSpec {
            taints: Some(
                taints
                    .iter()
                    .map(|(key, effect, value)| Taint {
                        key: key.to_string(),
                        effect: effect.to_string(),
                        value: value.map(String::from),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        });
        self
    }
}

#[test]
fn the_desired_node_is_labelled_and_tainted_as_virtual() {
    let desired = desired_node(
        NODE,
        PROVIDER,
        &map(&[("topology.kubernetes.io/zone", "eu-west")]),
    );
    let node: Node = serde_json::from_value(desired).unwrap();
    assert_eq!(node.metadata.name.as_deref(), Some(NODE));
    assert_eq!(
        node.metadata.labels.unwrap(),
        map(&[
            ("kubernetes.io/hostname", NODE),
            ("kubernetes.io/os", "linux"),
            (names::MANAGED_BY_LABEL, names::MANAGED_BY),
            (names::REMOTE_CLUSTER_LABEL, PROVIDER),
            (names::NODE_TYPE_LABEL, names::VIRTUAL_NODE_TYPE),
            ("topology.kubernetes.io/zone", "eu-west"),
        ])
    );
    let taints = node.spec.unwrap().taints.unwrap();
    assert_eq!(
        taints
            .iter()
            .map(|t| (t.key.as_str(), t.value.as_deref(), t.effect.as_str()))
            .collect::<Vec<_>>(),
        [(names::VIRTUAL_NODE_TAINT, Some("true"), "NoExecute")]
    );
    // The provider cannot unmark its node by suggesting labels.
    let hostile = desired_node(NODE, PROVIDER, &map(&[(names::NODE_TYPE_LABEL, "real")]));
    assert_eq!(
        hostile["metadata"]["labels"][names::NODE_TYPE_LABEL],
        names::VIRTUAL_NODE_TYPE
    );
}

#[test]
fn lost_marks_table() {
    let taint = names::VIRTUAL_NODE_TAINT;
    let cases = [
        ("as applied", NodeFixture::marked(), false),
        (
            "another label removed (the admin's to override)",
            NodeFixture::marked().label("kubernetes.io/os", None),
            false,
        ),
        (
            "another taint added",
            NodeFixture::marked().taints(&[
                (taint, "NoExecute", Some("true")),
                ("node.kubernetes.io/network-unavailable", "NoSchedule", None),
            ]),
            false,
        ),
        (
            "type label removed",
            NodeFixture::marked().label(names::NODE_TYPE_LABEL, None),
            true,
        ),
        (
            "type label rewritten",
            NodeFixture::marked().label(names::NODE_TYPE_LABEL, Some("real")),
            true,
        ),
        ("taints removed", NodeFixture::marked().taints(&[]), true),
        (
            "taint softened to NoSchedule",
            NodeFixture::marked().taints(&[(taint, "NoSchedule", Some("true"))]),
            true,
        ),
        (
            "taint value changed",
            NodeFixture::marked().taints(&[(taint, "NoExecute", Some("false"))]),
            true,
        ),
    ];
    for (what, node, want) in cases {
        assert_eq!(lost_marks(&node.0), want, "{what}");
    }
}

#[test]
fn capacity_is_the_grant_without_its_storage_quota() {
    let grant = |pairs: &[(&str, &str)]| -> BTreeMap<String, Quantity> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
            .collect()
    };
    let cases = [
        (
            grant(&[("cpu", "4"), ("memory", "8Gi")]),
            map(&[("cpu", "4"), ("memory", "8Gi"), ("pods", "110")]),
        ),
        (
            grant(&[("cpu", "4"), ("pods", "20")]),
            map(&[("cpu", "4"), ("pods", "20")]),
        ),
        (
            grant(&[
                ("cpu", "1"),
                ("requests.storage", "10Gi"),
                ("persistentvolumeclaims", "5"),
            ]),
            map(&[("cpu", "1"), ("pods", "110")]),
        ),
        (grant(&[]), map(&[("pods", "110")])),
    ];
    for (grant, want) in cases {
        assert_eq!(capacity(&grant), want, "{grant:?}");
    }
}

#[test]
fn apply_table() {
    let desired = desired_node(NODE, PROVIDER, &BTreeMap::new());
    let before = desired_node(NODE, PROVIDER, &map(&[("zone", "a")]));
    let cases: &[ApplyCase] = &[
        ("first pass", None, false, false, Some(Apply::Register)),
        ("found deleted", None, false, true, Some(Apply::Reregister)),
        (
            "labels changed",
            Some(&before),
            false,
            false,
            Some(Apply::Changed),
        ),
        (
            "changed, marks lost too",
            Some(&before),
            true,
            false,
            Some(Apply::Changed),
        ),
        (
            "marks lost",
            Some(&desired),
            true,
            false,
            Some(Apply::RestoreMarks),
        ),
        ("as applied", Some(&desired), false, false, None),
    ];
    for &(what, applied, marks_lost, deleted, want) in cases {
        assert_eq!(
            apply(applied, &desired, marks_lost, deleted),
            want,
            "{what}"
        );
    }
}

#[test]
fn applied_table() {
    let (u1, u2) = (Some("uid-1"), Some("uid-2"));
    // (case, cause, UID known, UID answered, Peering live, made again, decision).
    let cases = [
        (
            "registered",
            Apply::Register,
            None,
            u1,
            None,
            false,
            Applied::Kept { repost: true },
        ),
        (
            "changed",
            Apply::Changed,
            u1,
            u1,
            None,
            false,
            Applied::Kept { repost: true },
        ),
        (
            "marks put back: Ready since the same time",
            Apply::RestoreMarks,
            u1,
            u1,
            None,
            false,
            Applied::Kept { repost: false },
        ),
        (
            "deleted since, made again by the apply",
            Apply::RestoreMarks,
            u1,
            u2,
            Some(true),
            true,
            Applied::Kept { repost: true },
        ),
        (
            "registered again, Peering stays",
            Apply::Reregister,
            u1,
            u2,
            Some(true),
            true,
            Applied::Kept { repost: true },
        ),
        (
            "registered again, Peerings unreadable",
            Apply::Reregister,
            u1,
            u2,
            None,
            true,
            Applied::Kept { repost: true },
        ),
        (
            "registered again as unpeering began",
            Apply::Reregister,
            u1,
            u2,
            Some(false),
            true,
            Applied::Remove,
        ),
        (
            "made again by a change as unpeering began",
            Apply::Changed,
            u1,
            u2,
            Some(false),
            true,
            Applied::Remove,
        ),
    ];
    for (what, cause, known, uid, live, again, want) in cases {
        assert_eq!(cause.made_again(known, uid), again, "{what}");
        assert_eq!(applied(cause, again, live), want, "{what}");
    }
}

#[test]
fn readiness_table() {
    let t0 = Instant::now();
    let bound = secs(10);
    let cases: &[ReadinessCase] = &[
        (
            "answered 2s ago",
            Some(30),
            None,
            32,
            Ok(()),
            (true, "ProviderReachable", "provider milan answers"),
        ),
        (
            "just started",
            None,
            None,
            3,
            Err(NotReady::NotProbed),
            (
                false,
                "ProviderNotProbed",
                "waiting for provider milan to answer: not probed yet",
            ),
        ),
        (
            "started, the first probe failed",
            None,
            Some("no answer within 2s"),
            9,
            Err(NotReady::NotProbed),
            (
                false,
                "ProviderNotProbed",
                "waiting for provider milan to answer: no answer within 2s",
            ),
        ),
        (
            "never answered",
            None,
            Some("no answer: connection refused"),
            10,
            Err(NotReady::Unreachable { silent: secs(10) }),
            (
                false,
                REASON_UNREACHABLE,
                "provider milan at https://milan:6443 has not answered for 10s: no answer: \
                 connection refused",
            ),
        ),
        (
            "silent since",
            Some(5),
            Some("no answer within 2s"),
            30,
            Err(NotReady::Unreachable { silent: secs(25) }),
            (
                false,
                REASON_UNREACHABLE,
                "provider milan at https://milan:6443 has not answered for 25s: no answer \
                 within 2s",
            ),
        ),
    ];
    for &(what, answered, failure, at, want, (ready, reason, message)) in cases {
        let mut probes = Probes::new(t0);
        probes.last_answer = answered.map(|s| t0 + secs(s));
        if let Some(e) = failure {
            probes.last_error = e.into();
        }
        let got = probes.readiness(bound, t0 + secs(at));
        assert_eq!(got, want, "{what}");
        let shown = ready_condition(PROVIDER, got, &probes.last_error, "https://milan:6443");
        assert_eq!(
            (shown.ready, shown.reason, shown.message.as_str()),
            (ready, reason, message),
            "{what}"
        );
    }
}

/// A `hyper::Error`, as a gateway that hangs up gives it.
async fn hung_up() -> hyper::Error {
    let (ours, theirs) = tokio::io::duplex(64);
    drop(theirs);
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(ours))
            .await
            .unwrap();
    tokio::spawn(conn);
    let request = http::Request::get("/status")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    sender.send_request(request).await.unwrap_err()
}

fn report(state: &str, rtt_ms: Option<f64>) -> Result<GatewayReport, ProbeError> {
    Ok(GatewayReport {
        state: state.into(),
        rtt_ms,
        rx_bytes: 0,
        tx_bytes: 0,
    })
}

#[tokio::test]
async fn network_table() {
    let addr = "127.0.0.1:9101";
    let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
    let bad_request = http::Request::get("\n").body(()).unwrap_err();
    let garbled = serde_json::from_str::<GatewayReport>("{").unwrap_err();
    let kube_error = kube::Error::SerdeError(serde_json::from_str::<u8>("x").unwrap_err());
    // (what the status API answered, the reason, a part of the message).
    let cases = vec![
        (
            report("connected", Some(1.54)),
            Tunnel::Connected,
            "tunnel to provider milan connected, RTT 1.5 ms",
        ),
        (
            report("connected", None),
            Tunnel::Connected,
            "tunnel to provider milan connected",
        ),
        (
            report("connecting", None),
            Tunnel::Connecting,
            "not connected yet (gateway status at 127.0.0.1:9101); check the gateway's peer \
             endpoint and public key",
        ),
        (
            report("error", None),
            Tunnel::Down,
            "tunnel to provider milan is error: its probes go unanswered",
        ),
        (
            Err(ProbeError::NoGateway("no gateway pod for milan".into())),
            Tunnel::GatewayNotRunning,
            "the gateway to provider milan is not running: no gateway pod for milan",
        ),
        (
            Err(ProbeError::Connect(refused)),
            Tunnel::GatewayUnreachable,
            "status API at 127.0.0.1:9101: connecting: connection refused; check that \
             `tandem gateway` runs with statusListen = \"127.0.0.1:9101\"",
        ),
        (
            Err(ProbeError::Http(hung_up().await)),
            Tunnel::GatewayUnreachable,
            ": HTTP: ",
        ),
        (
            Err(ProbeError::Request(bad_request)),
            Tunnel::GatewayUnreachable,
            ": building the request: ",
        ),
        (
            Err(ProbeError::Status(http::StatusCode::SERVICE_UNAVAILABLE)),
            Tunnel::GatewayUnreachable,
            ": GET /status answered 503 Service Unavailable;",
        ),
        (
            Err(ProbeError::Decode(garbled)),
            Tunnel::GatewayUnreachable,
            ": reading GET /status: EOF",
        ),
        (
            Err(ProbeError::Timeout(secs(2))),
            Tunnel::GatewayUnreachable,
            ": no answer within 2s;",
        ),
        (
            Err(ProbeError::Kube(kube_error)),
            Tunnel::GatewayUnreachable,
            ": no answer: ",
        ),
    ];
    for (answer, reason, message) in cases {
        let what = format!("{answer:?}");
        let got = network_health(PROVIDER, addr, answer);
        assert_eq!(got.reason, reason, "{what}");
        assert_eq!(got.unavailable, reason != Tunnel::Connected, "{what}");
        assert!(got.message.contains(message), "{what}: {}", got.message);
    }
}

/// What the node shows: Ready, the default capacity, no gateway, no kubelet endpoint.
struct ShownFixture(Shown);

impl ShownFixture {
    fn ready() -> Self {
        ShownFixture(Shown {
            ready: ready_condition(PROVIDER, Ok(()), "", ""),
            network: None,
            capacity: map(&[("cpu", "4"), ("pods", "110")]),
            kubelet: None,
        })
    }
    fn not_ready(mut self, why: NotReady, last_error: &str) -> Self {
        self.0.ready = ready_condition(PROVIDER, Err(why), last_error, "https://milan:6443");
        self
    }
    fn tunnel(mut self, state: &str) -> Self {
        self.0.network = Some(network_health(
            PROVIDER,
            "127.0.0.1:9101",
            report(state, None),
        ));
        self
    }
    fn cpu(mut self, cpu: &str) -> Self {
        self.0.capacity.insert("cpu".into(), cpu.into());
        self
    }
    fn kubelet(mut self, addr: &str) -> Self {
        self.0.kubelet = Some(addr.parse().unwrap());
        self
    }
    /// Posted at `at`.
    fn posted(self, at: Instant) -> Posted {
        let (_, since) = node_status(&self.0, None, NODE, Timestamp::UNIX_EPOCH);
        Posted {
            shown: self.0,
            since,
            at,
        }
    }
}

#[test]
fn status_due_table() {
    let t0 = Instant::now();
    let base = || {
        ShownFixture::ready()
            .tunnel("connected")
            .kubelet("10.0.0.5:10250")
    };
    let last = base().posted(t0);
    let silent = |s| NotReady::Unreachable { silent: secs(s) };
    let unreachable = base().not_ready(silent(10), "x").posted(t0);
    // (case, what was posted, what is shown, seconds since, decision).
    let cases = [
        ("nothing posted", None, base(), 0, Some(Post::First)),
        ("as posted", Some(&last), base(), 9, None),
        (
            "as posted, 10s on",
            Some(&last),
            base(),
            10,
            Some(Post::Heartbeat),
        ),
        (
            "provider silent",
            Some(&last),
            base().not_ready(silent(10), "x"),
            1,
            Some(Post::Readiness),
        ),
        (
            "not probed, then unreachable",
            Some(&base().not_ready(NotReady::NotProbed, "x").posted(t0)),
            base().not_ready(silent(10), "x"),
            1,
            Some(Post::Readiness),
        ),
        (
            "silent longer: the message waits for the heartbeat",
            Some(&unreachable),
            base().not_ready(silent(15), "y"),
            5,
            None,
        ),
        (
            "tunnel down",
            Some(&last),
            base().tunnel("error"),
            1,
            Some(Post::Network),
        ),
        (
            "connecting, then down: both unavailable",
            Some(&base().tunnel("connecting").posted(t0)),
            base().tunnel("error"),
            1,
            Some(Post::Network),
        ),
        (
            "gateway unset",
            Some(&last),
            ShownFixture::ready().kubelet("10.0.0.5:10250"),
            1,
            Some(Post::Network),
        ),
        (
            "grant changed",
            Some(&last),
            base().cpu("8"),
            1,
            Some(Post::Capacity),
        ),
        (
            "kubelet moved",
            Some(&last),
            base().kubelet("10.0.0.6:10250"),
            1,
            Some(Post::KubeletEndpoint),
        ),
    ];
    for (what, posted, shown, after, want) in cases {
        assert_eq!(
            status_due(posted, &shown.0, t0 + secs(after)),
            want,
            "{what}"
        );
    }
}

/// A condition of a status patch as `kubectl describe node` lists it: (status, reason,
/// message, lastTransitionTime).
fn condition(status: &Value, type_: &str) -> Option<(String, String, String, String)> {
    let c = status["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)?;
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    Some((
        s("status"),
        s("reason"),
        s("message"),
        s("lastTransitionTime"),
    ))
}

#[test]
fn the_status_reads_as_a_kubelets_node() {
    let t0 = Instant::now();
    let at = |s: i64| Timestamp::from_second(1_700_000_000 + s).unwrap();
    let shown = ShownFixture::ready()
        .tunnel("connecting")
        .kubelet("10.0.0.5:10250")
        .0;
    let (status, since) = node_status(&shown, None, NODE, at(0));
    let first = "2023-11-14T22:13:20Z";
    assert_eq!(
        condition(&status, "Ready").unwrap(),
        (
            "True".into(),
            "ProviderReachable".into(),
            "provider milan answers".into(),
            first.into()
        )
    );
    let (s, reason, _, when) = condition(&status, "NetworkUnavailable").unwrap();
    assert_eq!(
        (s.as_str(), reason.as_str(), when.as_str()),
        ("True", "TunnelConnecting", first)
    );
    assert_eq!(
        status["status"]["conditions"][0]["lastHeartbeatTime"],
        first
    );
    let st = &status["status"];
    assert_eq!(st["capacity"], json!({"cpu": "4", "pods": "110"}));
    assert_eq!(st["allocatable"], st["capacity"]);
    assert_eq!(
        st["addresses"],
        json!([{"type": "InternalIP", "address": "10.0.0.5"}, {"type": "Hostname", "address": NODE}])
    );
    assert_eq!(st["daemonEndpoints"]["kubeletEndpoint"]["Port"], 10250);
    assert_eq!(
        st["nodeInfo"]["containerRuntimeVersion"],
        "tandem://shadowpod"
    );
    assert_eq!(st["nodeInfo"]["operatingSystem"], "linux");

    // A minute on, still Ready, the tunnel up: Ready since the same time, the network
    // condition turned now.
    let posted = Posted {
        shown,
        since,
        at: t0,
    };
    let later = ShownFixture::ready().tunnel("connected").0;
    let (status, since) = node_status(&later, Some(&posted), NODE, at(60));
    let turned = "2023-11-14T22:14:20Z";
    assert_eq!(condition(&status, "Ready").unwrap().3, first);
    let (s, reason, _, when) = condition(&status, "NetworkUnavailable").unwrap();
    assert_eq!(
        (s.as_str(), reason.as_str(), when.as_str()),
        ("False", "TunnelConnected", turned)
    );
    assert_eq!(
        status["status"]["conditions"][1]["lastHeartbeatTime"],
        turned
    );
    // No kubelet endpoint: no addresses.
    assert!(status["status"].get("addresses").is_none());
    assert!(status["status"].get("daemonEndpoints").is_none());

    // Then the provider goes silent and the gateway is unset: NotReady since now, and no
    // NetworkUnavailable (a merge patch replaces the list).
    let posted = Posted {
        shown: later,
        since,
        at: t0,
    };
    let silent = ShownFixture::ready()
        .not_ready(
            NotReady::Unreachable { silent: secs(40) },
            "no answer within 2s",
        )
        .0;
    let (status, _) = node_status(&silent, Some(&posted), NODE, at(120));
    assert_eq!(
        condition(&status, "Ready").unwrap(),
        (
            "False".into(),
            REASON_UNREACHABLE.into(),
            "provider milan at https://milan:6443 has not answered for 40s: no answer within 2s"
                .into(),
            "2023-11-14T22:15:20Z".into()
        )
    );
    assert_eq!(condition(&status, "NetworkUnavailable"), None);
}

#[test]
fn gone_table() {
    let cases = [
        (Some(true), Gone::Reregister),
        (Some(false), Gone::Unpeering),
        (None, Gone::AskAgain),
    ];
    for (live, want) in cases {
        assert_eq!(gone(live), want, "Peering live: {live:?}");
    }
}

#[test]
fn the_tunnel_annotation_is_the_gateways_report() {
    let r = report("connected", Some(1.5)).unwrap();
    let got: Value = serde_json::from_str(&tunnel_annotation(Some(&r)).unwrap()).unwrap();
    assert_eq!(
        got,
        json!({"state": "connected", "rttMs": 1.5, "rxBytes": 0, "txBytes": 0})
    );
    assert_eq!(tunnel_annotation(None), None);
}

#[test]
fn the_lease_is_owned_by_the_node_as_it_is_now() {
    let now = Timestamp::from_second(1_700_000_000).unwrap();
    let renewal = lease_renewal(NODE, Some("uid-2"), now);
    assert_eq!(renewal["spec"]["holderIdentity"], NODE);
    assert_eq!(renewal["spec"]["renewTime"], "2023-11-14T22:13:20.000000Z");
    assert_eq!(
        renewal["metadata"]["ownerReferences"],
        json!([{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "uid-2"}])
    );
    // The node not applied yet: no owner to name.
    assert!(lease_renewal(NODE, None, now).get("metadata").is_none());

    let lease: k8s_openapi::api::coordination::v1::Lease =
        serde_json::from_value(new_lease(NODE, Some("uid-2"), now)).unwrap();
    assert_eq!(lease.metadata.namespace.as_deref(), Some(LEASE_NAMESPACE));
    assert_eq!(lease.metadata.owner_references.unwrap()[0].uid, "uid-2");
    let spec = lease.spec.unwrap();
    assert_eq!(spec.lease_duration_seconds, Some(40));
    assert_eq!(spec.renew_time.map(|t| t.0), Some(now));
    let orphan: k8s_openapi::api::coordination::v1::Lease =
        serde_json::from_value(new_lease(NODE, None, now)).unwrap();
    assert_eq!(orphan.metadata.owner_references, None);
}
