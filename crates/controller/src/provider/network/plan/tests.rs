//! The provider's network grant as the admins see it: which prefix each peer is known by here
//! and which are refused, what the IPAM ConfigMap holds, and what a consumer's
//! NetworkParameters status says (`remappedPodCIDR`, `PrefixesGranted`).

use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tandem_api::peering::PeeringNetwork;
use tandem_api::{NetworkParametersStatus, PeeringStatus};
use tandem_core::ipam::IpamError;

const CONSUMER: &str = "rome";

/// (case, prefixes the consumer declares, the prefixes it is known by here, or the error).
type PrefixCase<'a> = (&'a str, &'a [&'a str], Result<&'a [&'a str], &'a str>);
/// (case, the ConfigMap read, the state it holds, the new state, the write).
type StoreCase<'a> = (
    &'a str,
    Option<&'a ConfigMap>,
    &'a IpamState,
    &'a IpamState,
    Result<Write, Unwritten>,
);
/// (case, Tenant, the tenant namespaces swept, decision).
type SweepCase<'a> = (
    &'a str,
    &'a Tenant,
    Option<&'a BTreeSet<String>>,
    Result<(), Skip>,
);
/// (case, the consumer's parameters, the prefixes mapped or why none).
type RequestedCase<'a> = (&'a str, Option<Theirs>, Result<Vec<IpNet>, Skip>);
/// (case, the consumer's parameters, the IPAM's answer, what its status gets).
type GrantCase<'a> = (
    &'a str,
    Theirs,
    Result<&'a [Grant], &'a IpamError>,
    Result<Step, Skip>,
);

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn grant(requested: &str, granted: &str) -> Grant {
    Grant {
        requested: net(requested),
        granted: net(granted),
    }
}

fn peering(provider: &str, pod: (&str, &str), ext: Option<(&str, &str)>) -> Peering {
    let spec = serde_json::from_value(
        json!({"clusterID": provider, "endpoint": "https://x:6443", "caData": ""}),
    )
    .unwrap();
    let mut p = Peering::new(provider, spec);
    p.status = Some(PeeringStatus {
        network: Some(PeeringNetwork {
            remote_pod_cidr: pod.0.into(),
            remapped_remote_pod_cidr: pod.1.into(),
            remote_external_cidr: ext.map(|e| e.0.into()),
            remapped_remote_external_cidr: ext.map(|e| e.1.into()),
            ..Default::default()
        }),
        ..Default::default()
    });
    p
}

/// A tenant and its consumer's NetworkParameters, remapped as `pod` says.
fn tenant(consumer: &str, pod: (&str, Option<&str>)) -> (Tenant, NetworkParameters) {
    let ns = names::tenant_namespace(consumer);
    let mut t = Tenant::new(
        consumer,
        serde_json::from_value(json!({"clusterID": consumer})).unwrap(),
    );
    t.metadata.namespace = Some(ns.clone());
    let np = Theirs::new(consumer, pod.0, None).remapped(pod.1, None).0;
    (t, np)
}

/// A consumer's NetworkParameters, as the provider's cache holds them.
struct Theirs(NetworkParameters);

impl Theirs {
    fn new(consumer: &str, pod: &str, external: Option<&str>) -> Self {
        let mut np = NetworkParameters::new(
            CONSUMER_NETWORK_PARAMETERS,
            serde_json::from_value(
                json!({"clusterID": consumer, "podCIDR": pod, "externalCIDR": external}),
            )
            .unwrap(),
        );
        np.metadata.namespace = Some(names::tenant_namespace(consumer));
        Theirs(np)
    }
    fn rome(pod: &str, external: Option<&str>) -> Self {
        Self::new(CONSUMER, pod, external)
    }
    fn remapped(mut self, pod: Option<&str>, external: Option<&str>) -> Self {
        let status = self.0.status.get_or_insert_default();
        status.remapped_pod_cidr = pod.map(str::to_string);
        status.remapped_external_cidr = external.map(str::to_string);
        self
    }
    /// Its `PrefixesGranted` condition says `status` with `message`.
    fn prefixes_granted(mut self, status: &str, message: &str) -> Self {
        self.0.status.get_or_insert_default().conditions = vec![
            serde_json::from_value(json!({
                "type": conditions::PREFIXES_GRANTED, "status": status, "reason": "PrefixRefused",
                "message": message, "lastTransitionTime": "2024-01-01T00:00:00Z",
            }))
            .unwrap(),
        ];
        self
    }
}

/// The IPAM of a cluster whose pods use 10.244.0.0/16 and external addresses 10.70.0.0/16.
fn config() -> IpamConfig {
    ipam_config("10.244.0.0/16", "10.70.0.0/16").unwrap()
}

#[test]
fn the_ipam_keeps_the_cluster_s_own_prefixes_and_remaps_from_rfc_1918() {
    let c = config();
    assert_eq!(c.reserved, vec![net("10.244.0.0/16"), net("10.70.0.0/16")]);
    assert_eq!(
        c.pools,
        vec![
            net("10.0.0.0/8"),
            net("172.16.0.0/12"),
            net("192.168.0.0/16")
        ]
    );
    assert!(c.allowed_public.is_empty(), "no public prefix is granted");
    let bad = ipam_config("10.244.0.0/16", "ten-seventy").unwrap_err();
    assert_eq!(bad.cidr, "ten-seventy");
    assert_eq!(bad.to_string(), "\"ten-seventy\" is not a CIDR");
}

#[test]
fn which_prefix_a_peer_is_granted_table() {
    // Milan holds 10.0.0.0/16 already.
    let with_milan = || {
        let mut ipam = Ipam::new(config()).unwrap();
        ipam.map_peer("milan", &[net("10.244.0.0/16")]).unwrap();
        ipam
    };
    // (case, prefixes rome declares, the prefixes it is known by here, or the error)
    let cases: &[PrefixCase] = &[
        (
            "free: granted as it is",
            &["10.245.0.0/16", "10.71.0.0/16"],
            Ok(&["10.245.0.0/16", "10.71.0.0/16"]),
        ),
        (
            "our own pods' prefix: remapped past milan's grant",
            &["10.244.0.0/16"],
            Ok(&["10.1.0.0/16"]),
        ),
        (
            "milan's grant: remapped",
            &["10.0.0.0/16", "10.70.0.0/16"],
            Ok(&["10.1.0.0/16", "10.2.0.0/16"]),
        ),
        (
            "a public prefix: refused",
            &["10.245.0.0/16", "8.8.8.0/24"],
            Err(
                "peer `rome`: prefix 8.8.8.0/24 is public (outside 10.0.0.0/8, 172.16.0.0/12, \
                 192.168.0.0/16, 100.64.0.0/10, fc00::/7): never granted to a peer",
            ),
        ),
        (
            "link-local: refused",
            &["169.254.0.0/16"],
            Err(
                "peer `rome`: prefix 169.254.0.0/16 is link-local (169.254.0.0/16, fe80::/10): \
                 never granted to a peer",
            ),
        ),
        (
            "its own prefixes overlapping: refused",
            &["10.245.0.0/16", "10.245.1.0/24"],
            Err("peer `rome`: prefixes 10.245.0.0/16 and 10.245.1.0/24 overlap"),
        ),
        (
            "host bits set: refused",
            &["10.245.0.1/16"],
            Err(
                "peer prefixes: prefix 10.245.0.1/16 has host bits set (did you mean \
                 10.245.0.0/16?)",
            ),
        ),
        (
            "no pool has a free /8",
            &["10.0.0.0/8"],
            Err(
                "peer `rome`: prefix 10.0.0.0/8 collides with a local or granted prefix and \
                 no IPv4 pool has a free /8",
            ),
        ),
    ];
    for (case, declared, want) in cases {
        let prefixes: Vec<IpNet> = declared.iter().map(|p| net(p)).collect();
        let got = with_milan().map_peer(CONSUMER, &prefixes);
        match (want, got) {
            (Ok(want), Ok(grants)) => {
                let granted: Vec<String> = grants.iter().map(|g| g.granted.to_string()).collect();
                assert_eq!(granted, *want, "{case}");
            }
            (Err(want), Err(e)) => assert_eq!(e.to_string(), *want, "{case}"),
            (want, got) => panic!("{case}: wanted {want:?}, got {got:?}"),
        }
    }
}

#[test]
fn the_ipam_state_is_rebuilt_from_the_remaps_peerings_and_tenants_record() {
    let config = IpamConfig {
        reserved: vec!["10.244.0.0/16".parse().unwrap()],
        pools: POOLS.iter().map(|p| p.parse().unwrap()).collect(),
        allowed_public: Vec::new(),
    };
    let mut leaving = peering("naples", ("10.250.0.0/16", "10.9.0.0/16"), None);
    leaving.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    let peerings = [
        peering(
            "milan",
            ("10.244.0.0/16", "10.0.0.0/16"),
            Some(("10.245.0.0/16", "10.1.0.0/16")),
        ),
        leaving,
    ];
    let (rome, rome_np) = tenant("rome", ("10.244.0.0/16", Some("10.2.0.0/16")));
    // Milan peers both ways: the two relations share the grants.
    let (milan, milan_np) = tenant("milan", ("10.244.0.0/16", Some("10.0.0.0/16")));
    // Overlapping milan's grant: left out.
    let (turin, turin_np) = tenant("turin", ("10.244.0.0/16", Some("10.0.0.0/16")));
    // A spec changed since its remap (a /16 remapped as a /24): left out.
    let (genoa, genoa_np) = tenant("genoa", ("10.244.0.0/16", Some("10.5.0.0/24")));
    // Not remapped yet: nothing recorded.
    let (bari, bari_np) = tenant("bari", ("10.244.0.0/16", None));
    let state = rebuild_state(
        &config,
        &peerings,
        &[rome, milan, turin, genoa, bari],
        &[rome_np, milan_np, turin_np, genoa_np, bari_np],
    );
    let expected: BTreeMap<String, Vec<Grant>> = [
        (
            "milan".to_string(),
            vec![
                grant("10.244.0.0/16", "10.0.0.0/16"),
                grant("10.245.0.0/16", "10.1.0.0/16"),
            ],
        ),
        (
            "rome".to_string(),
            vec![grant("10.244.0.0/16", "10.2.0.0/16")],
        ),
    ]
    .into();
    assert_eq!(state.peers, expected);
}

#[test]
fn store_table() {
    let state = |peers: &[(&str, &str, &str)]| IpamState {
        peers: peers
            .iter()
            .map(|(peer, requested, granted)| (peer.to_string(), vec![grant(requested, granted)]))
            .collect(),
    };
    let milan = state(&[("milan", "10.244.0.0/16", "10.0.0.0/16")]);
    let both = state(&[
        ("milan", "10.244.0.0/16", "10.0.0.0/16"),
        ("rome", "10.245.0.0/16", "10.245.0.0/16"),
    ]);
    let none = IpamState::default();
    let mut read = ipam_map(&milan);
    read.metadata.resource_version = Some("41".into());
    let mut replaced = read.clone();
    replaced.data = ipam_map(&both).data;
    // (case, ConfigMap read, the state it holds, the new state, the write)
    let cases: Vec<StoreCase> = vec![
        (
            "Unchanged",
            Some(&read),
            &milan,
            &milan,
            Err(Unwritten::Unchanged),
        ),
        (
            "Unchanged: nothing stored, nothing granted",
            None,
            &none,
            &none,
            Err(Unwritten::Unchanged),
        ),
        (
            "Delete: the last peer released",
            Some(&read),
            &milan,
            &none,
            Ok(Write::Delete {
                resource_version: Some("41".into()),
            }),
        ),
        (
            "Replace: a peer mapped",
            Some(&read),
            &milan,
            &both,
            Ok(Write::Replace(replaced)),
        ),
        (
            "Create: the first peer mapped",
            None,
            &none,
            &milan,
            Ok(Write::Create(ipam_map(&milan))),
        ),
        (
            "Create: rebuilt from the records, unchanged since",
            None,
            &none,
            &both,
            Ok(Write::Create(ipam_map(&both))),
        ),
    ];
    for (case, current, stored, new, want) in cases {
        assert_eq!(store(current, stored, new), want, "{case}");
    }
    // What is stored reads back as it was written.
    let created = ipam_map(&both);
    assert_eq!(created.metadata.name.as_deref(), Some(IPAM_CONFIG_MAP));
    assert_eq!(
        created.metadata.namespace.as_deref(),
        Some(names::SYSTEM_NAMESPACE)
    );
    assert_eq!(stored_state(Some(&created)), both);
    assert_eq!(stored_state(None), none);
}

#[test]
fn in_sweep_table() {
    let live = tenant(CONSUMER, ("10.244.0.0/16", None)).0;
    let mut deleting = live.clone();
    deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    let rome_ns = BTreeSet::from([names::tenant_namespace(CONSUMER)]);
    let milan_ns = BTreeSet::from([names::tenant_namespace("milan")]);
    let cases: &[SweepCase] = &[
        ("every Tenant's sweep", &live, None, Ok(())),
        ("its parameters changed", &live, Some(&rome_ns), Ok(())),
        (
            "OutOfSweep: another's changed",
            &live,
            Some(&milan_ns),
            Err(Skip::OutOfSweep),
        ),
        ("Deleting", &deleting, None, Err(Skip::Deleting)),
    ];
    for (case, t, only, want) in cases {
        assert_eq!(&in_sweep(t, *only), want, "{case}");
    }
}

#[test]
fn publish_table() {
    let wanted = ours(
        "milan",
        "10.244.0.0/16",
        "10.70.0.0/16",
        "key=",
        Some("1.2.3.4:51820"),
    );
    let published = |spec: &NetworkParametersSpec| {
        NetworkParameters::new(crate::rbac::PROVIDER_NETWORK_PARAMETERS, spec.clone())
    };
    let mut old_endpoint = wanted.clone();
    old_endpoint.gateway_endpoint = None;
    let cases: &[(&str, Option<NetworkParameters>, Result<Step, Skip>)] = &[
        ("Publish: none yet", None, Ok(Step::Publish(wanted.clone()))),
        (
            "Publish: the gateway's endpoint changed",
            Some(published(&old_endpoint)),
            Ok(Step::Publish(wanted.clone())),
        ),
        ("Published", Some(published(&wanted)), Err(Skip::Published)),
    ];
    for (case, cached, want) in cases {
        assert_eq!(&publish(cached.as_ref(), wanted.clone()), want, "{case}");
    }
    // As applied: this cluster's ID, CIDRs, key and endpoint.
    assert_eq!(
        Step::Publish(wanted).body(None, k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        json!({
            "apiVersion": "tandem.dev/v1alpha1", "kind": "NetworkParameters",
            "metadata": {"name": crate::rbac::PROVIDER_NETWORK_PARAMETERS,
                         "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY}},
            "spec": {"clusterID": "milan", "podCIDR": "10.244.0.0/16",
                     "externalCIDR": "10.70.0.0/16", "publicKey": "key=",
                     "gatewayEndpoint": "1.2.3.4:51820"},
        })
    );
}

#[test]
fn requested_table() {
    let cases: Vec<RequestedCase> = vec![
        (
            "pods and external addresses",
            Some(Theirs::rome("10.244.0.0/16", Some("10.70.0.0/16"))),
            Ok(vec![net("10.244.0.0/16"), net("10.70.0.0/16")]),
        ),
        (
            "pods only",
            Some(Theirs::rome("10.244.0.0/16", None)),
            Ok(vec![net("10.244.0.0/16")]),
        ),
        (
            "an unreadable external CIDR is left out",
            Some(Theirs::rome("10.244.0.0/16", Some("ten-seventy"))),
            Ok(vec![net("10.244.0.0/16")]),
        ),
        (
            "UnreadablePodCidr",
            Some(Theirs::rome("ten-two-four-four", None)),
            Err(Skip::UnreadablePodCidr("x".parse::<IpNet>().unwrap_err())),
        ),
        ("NotPublished", None, Err(Skip::NotPublished)),
    ];
    for (case, theirs, want) in cases {
        assert_eq!(requested(theirs.as_ref().map(|t| &t.0)), want, "{case}");
    }
}

#[test]
fn grant_table() {
    let public = IpamError::Refused {
        peer: CONSUMER.into(),
        prefix: net("8.8.8.0/24"),
        class: tandem_core::ipam::PrefixClass::Public,
    };
    let message = "consumer rome: peer `rome`: prefix 8.8.8.0/24 is public (outside 10.0.0.0/8, \
                   172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10, fc00::/7): never granted to a \
                   peer";
    let both = [
        grant("10.244.0.0/16", "10.1.0.0/16"),
        grant("10.70.0.0/16", "10.2.0.0/16"),
    ];
    let pods = [grant("10.244.0.0/16", "10.1.0.0/16")];
    let remap = |pod: &str, external: Option<&str>| {
        Ok(Step::Grant {
            pod: pod.into(),
            external: external.map(str::to_string),
        })
    };
    let fresh = || Theirs::rome("10.244.0.0/16", Some("10.70.0.0/16"));
    // (case, the consumer's parameters, the IPAM's answer, what its status gets)
    let cases: Vec<GrantCase> = vec![
        (
            "Grant: first remap",
            fresh(),
            Ok(&both),
            remap("10.1.0.0/16", Some("10.2.0.0/16")),
        ),
        (
            "Granted: the status says it",
            fresh().remapped(Some("10.1.0.0/16"), Some("10.2.0.0/16")),
            Ok(&both),
            Err(Skip::Granted),
        ),
        (
            "Grant: the external CIDR dropped",
            fresh().remapped(Some("10.1.0.0/16"), Some("10.2.0.0/16")),
            Ok(&pods),
            remap("10.1.0.0/16", None),
        ),
        (
            "Grant: clears a refusal",
            fresh()
                .remapped(Some("10.1.0.0/16"), Some("10.2.0.0/16"))
                .prefixes_granted("False", message),
            Ok(&both),
            remap("10.1.0.0/16", Some("10.2.0.0/16")),
        ),
        (
            "Refuse: a public prefix",
            fresh().remapped(Some("10.1.0.0/16"), None),
            Err(&public),
            Ok(Step::Refuse {
                message: message.into(),
            }),
        ),
        (
            "Refuse: another refusal stood",
            fresh().prefixes_granted("False", "consumer rome: something else"),
            Err(&public),
            Ok(Step::Refuse {
                message: message.into(),
            }),
        ),
        (
            "StillRefused",
            fresh().prefixes_granted("False", message),
            Err(&public),
            Err(Skip::StillRefused),
        ),
    ];
    for (case, theirs, answer, want) in cases {
        let got = match answer {
            Ok(grants) => granted(&theirs.0, grants),
            Err(e) => refused(CONSUMER, &theirs.0, e),
        };
        assert_eq!(got, want, "{case}");
    }
}

#[test]
fn the_status_says_the_grant_or_the_refusal() {
    let now: k8s_openapi::jiff::Timestamp = "2024-05-06T07:08:09Z".parse().unwrap();
    let remap = Step::Grant {
        pod: "10.1.0.0/16".into(),
        external: None,
    };
    assert_eq!(
        remap.body(Some("7"), now),
        json!({"metadata": {"resourceVersion": "7"},
               "status": {"remappedPodCIDR": "10.1.0.0/16", "remappedExternalCIDR": null,
                          "conditions": []}})
    );
    let refuse = Step::Refuse {
        message: "consumer rome: no".into(),
    };
    assert_eq!(
        refuse.body(Some("7"), now),
        json!({"metadata": {"resourceVersion": "7"},
               "status": {"remappedPodCIDR": null, "remappedExternalCIDR": null,
                          "conditions": [{"type": "PrefixesGranted", "status": "False",
                                          "reason": "PrefixRefused",
                                          "message": "consumer rome: no",
                                          "lastTransitionTime": "2024-05-06T07:08:09Z"}]}})
    );
    // The status a Grant writes reads back as the grant and no refusal.
    let mut theirs = Theirs::rome("10.244.0.0/16", None)
        .prefixes_granted("False", "no")
        .0;
    let written: NetworkParametersStatus =
        serde_json::from_value(remap.body(None, now)["status"].clone()).unwrap();
    theirs.status = Some(written);
    assert_eq!(
        granted(&theirs, &[grant("10.244.0.0/16", "10.1.0.0/16")]),
        Err(Skip::Granted)
    );
}
