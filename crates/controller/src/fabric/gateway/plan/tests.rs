//! The plan's tables: each decision as a user would notice it.

use super::super::fixtures::*;
use super::*;

const MILAN: &str = "milan";

/// (peer, consumer_of, provider_for, NAT known, the peer's key) of each view.
type Seen = (String, bool, bool, bool, Option<String>);

fn seen(views: &[PeerView]) -> Vec<Seen> {
    views
        .iter()
        .map(|v| {
            (
                v.peer.clone(),
                v.consumer_of,
                v.provider_for,
                v.nat.is_some(),
                v.peer_public_key.clone(),
            )
        })
        .collect()
}

fn view(peer: &str, consumer: bool, provider: bool, nat: bool, key: Option<&str>) -> Seen {
    (
        peer.into(),
        consumer,
        provider,
        nat,
        key.map(str::to_string),
    )
}

/// (case, the Tenants' network, the Peerings, the views wanted).
type ViewsCase = (
    &'static str,
    Vec<TenantFixture>,
    Vec<PeeringFixture>,
    Vec<Seen>,
);

#[test]
fn views_table() {
    let cases: Vec<ViewsCase> = vec![
        ("no relation", vec![], vec![], vec![]),
        (
            "a consumer, negotiated",
            vec![TenantFixture::new("rome").negotiated()],
            vec![],
            vec![view("rome", false, true, true, Some(PEER_KEY))],
        ),
        (
            "a consumer whose parameters are not remapped yet",
            vec![TenantFixture::new("rome")],
            vec![],
            vec![view("rome", false, true, false, None)],
        ),
        (
            "a provider, negotiated",
            vec![],
            vec![PeeringFixture::new(MILAN).negotiated("K")],
            vec![view(MILAN, true, false, true, Some("K"))],
        ),
        (
            "a provider that has not remapped this cluster yet",
            vec![],
            vec![
                PeeringFixture::new(MILAN)
                    .negotiated("K")
                    .not_remapped_by_peer(),
            ],
            vec![view(MILAN, true, false, false, Some("K"))],
        ),
        (
            "peered both ways: one view, through the Peering",
            vec![TenantFixture::new(MILAN).negotiated()],
            vec![PeeringFixture::new(MILAN).negotiated("K")],
            vec![view(MILAN, true, true, true, Some("K"))],
        ),
        (
            "both ways, the Peering not negotiated: the Tenant's view stays",
            vec![TenantFixture::new(MILAN).negotiated()],
            vec![PeeringFixture::new(MILAN)],
            vec![view(MILAN, false, true, true, Some(PEER_KEY))],
        ),
        (
            "a Peering not negotiated",
            vec![],
            vec![PeeringFixture::new(MILAN)],
            vec![],
        ),
        (
            "a Peering being deleted",
            vec![],
            vec![PeeringFixture::new(MILAN).negotiated("K").deleting()],
            vec![],
        ),
        (
            "several peers, by cluster ID",
            vec![TenantFixture::new("rome").negotiated()],
            vec![PeeringFixture::new(MILAN).negotiated("K")],
            vec![
                view(MILAN, true, false, true, Some("K")),
                view("rome", false, true, true, Some(PEER_KEY)),
            ],
        ),
    ];
    for (what, tenants, peerings, want) in cases {
        let tenants: Vec<TenantNetwork> = tenants.into_iter().map(|t| t.0).collect();
        let peerings: Vec<Peering> = peerings.into_iter().map(|p| p.0).collect();
        assert_eq!(
            seen(&views(&settings(), &tenants, &peerings)),
            want,
            "{what}"
        );
    }
}

#[test]
fn a_negotiated_view_carries_both_sides_prefixes() {
    let from_peering = consumer_view(
        &settings(),
        &PeeringFixture::new(MILAN).negotiated("K").0,
        false,
    )
    .unwrap();
    let from_tenant = provider_view(&settings(), &TenantFixture::new(MILAN).negotiated().0);
    for v in [&from_peering, &from_tenant] {
        assert_eq!(v.nat, Some(negotiated_nat()), "{v:?}");
    }
    assert_eq!(
        from_peering.peer_endpoint.as_deref(),
        Some("gw.example:51820")
    );
    assert_eq!(
        from_tenant.peer_endpoint.as_deref(),
        Some("192.0.2.9:51820")
    );
    // This cluster's own prefixes unreadable: no NAT, so no configuration.
    let mut broken = settings();
    broken.pod_cidr = "not-a-cidr".into();
    assert_eq!(
        provider_view(&broken, &TenantFixture::new(MILAN).negotiated().0).nat,
        None
    );
}

#[test]
fn unseen_table() {
    assert_eq!(tenant_peer(&tenant("rome", false)), Ok("rome".to_string()));
    assert_eq!(tenant_peer(&tenant("rome", true)), Err(Unseen::Deleting));
    let cases = [
        (
            "deleting",
            PeeringFixture::new(MILAN).negotiated("K").deleting(),
            Unseen::Deleting,
        ),
        (
            "deleting before negotiating",
            PeeringFixture::new(MILAN).deleting(),
            Unseen::Deleting,
        ),
        (
            "not negotiated",
            PeeringFixture::new(MILAN),
            Unseen::NotNegotiated,
        ),
    ];
    for (what, peering, want) in cases {
        assert_eq!(
            consumer_view(&settings(), &peering.0, true),
            Err(want),
            "{what}"
        );
    }
}

#[test]
fn the_sweep_needs_the_fabric_on_and_a_peer() {
    assert_eq!(fabric_on(&settings()), Ok(()));
    let mut off = settings();
    off.network_fabric = false;
    assert_eq!(fabric_on(&off), Err(Skip::FabricOff));
    assert_eq!(any_peer(&[]), Err(Skip::NoPeer));
    assert_eq!(any_peer(&[ViewFixture::new(MILAN).0]), Ok(()));
}

#[test]
fn gateway_args_table() {
    let allowed: Vec<IpNet> = vec!["10.244.1.5/32".parse().unwrap()];
    let cases = [
        (
            "nothing known",
            ViewFixture::new(MILAN),
            Err(Skip::NoPeerKey),
        ),
        (
            "prefixes but no key",
            ViewFixture::new(MILAN).negotiated(),
            Err(Skip::NoPeerKey),
        ),
        (
            "a key but no prefixes",
            ViewFixture::new(MILAN).keyed(),
            Err(Skip::NoNat),
        ),
        (
            "both, no endpoint: the peer contacts this side",
            ViewFixture::new(MILAN).keyed().negotiated(),
            Ok(None),
        ),
        (
            "an address endpoint",
            ViewFixture::new(MILAN)
                .keyed()
                .negotiated()
                .endpoint("192.0.2.9:51821"),
            Ok(Some("192.0.2.9:51821")),
        ),
        (
            "a host name endpoint is not used",
            ViewFixture::new(MILAN)
                .keyed()
                .negotiated()
                .endpoint("gw.example:51821"),
            Ok(None),
        ),
    ];
    for (what, view, want) in cases {
        let got = gateway_args(&view.0, "PRIVATE", 51822, allowed.clone());
        match want {
            Err(skip) => assert_eq!(got.err(), Some(skip), "{what}"),
            Ok(endpoint) => {
                let args = got.unwrap_or_else(|e| panic!("{what}: {e:?}"));
                assert_eq!(args.peer_endpoint, endpoint.map(|e| e.parse().unwrap()));
                assert_eq!(args.interface, interface(MILAN), "{what}");
                assert_eq!(args.listen.port(), 51822, "{what}");
                assert_eq!(args.status_listen.map(|s| s.port()), Some(51822));
                assert_eq!(args.peer_public_key, PEER_KEY, "{what}");
                assert_eq!(args.private_key, "PRIVATE", "{what}");
                assert_eq!(args.nat, negotiated_nat(), "{what}");
                assert_eq!(args.allowed_destinations.as_ref(), Some(&allowed));
                assert_eq!(
                    args.legacy_interfaces,
                    [tandem_core::names::legacy_gateway_interface(MILAN)]
                );
            }
        }
    }
}

/// (case, what the Secret holds, the decision wanted).
type ConfigCase<'a> = (&'a str, Option<&'a [u8]>, Result<Step, Skip>);

#[test]
fn write_config_table() {
    let view = ViewFixture::new(MILAN).keyed().negotiated().0;
    let args = gateway_args(&view, "PRIVATE", PORT_BASE, vec![]).unwrap();
    let wanted = serde_json::to_vec(&args).unwrap();
    let mut other = args.clone();
    other.peer_public_key = "ROTATED".into();
    let stale = serde_json::to_vec(&other).unwrap();
    let write = Ok(Step::WriteConfig {
        secret: "tandem-gateway-milan".into(),
        config: wanted.clone(),
    });
    let cases: [ConfigCase; 3] = [
        ("a new Secret", None, write.clone()),
        ("a rotated key", Some(&stale), write),
        ("the same", Some(&wanted), Err(Skip::ConfigCurrent)),
    ];
    for (what, stored, want) in cases {
        assert_eq!(write_config(MILAN, &args, stored), want, "{what}");
    }
}

#[test]
fn apply_table() {
    let m = gateway_objects(MILAN, PORT_BASE, IMAGE, Default::default()).remove(0);
    let hash = applied_hash(&m.body);
    let cases = [
        ("no object yet", None, true),
        ("applied by an older version", Some("0ld"), true),
        ("unchanged since last applied", Some(hash.as_str()), false),
    ];
    for (what, applied, writes) in cases {
        match apply(&m, applied) {
            Ok(Step::Apply(stamped)) => {
                assert!(writes, "{what}");
                assert_eq!((stamped.kind, &stamped.name), (m.kind, &m.name));
                // The stamp is the hash of the unstamped object: the next pass skips it.
                assert_eq!(
                    stamped.body["metadata"]["annotations"][APPLIED_HASH],
                    json!(hash),
                    "{what}"
                );
                assert_eq!(
                    stamped.body["metadata"]["labels"],
                    m.body["metadata"]["labels"]
                );
            }
            Err(skip) => {
                assert!(!writes, "{what}");
                assert_eq!(skip, Skip::Unchanged);
            }
            Ok(other) => panic!("{what}: {other:?}"),
        }
    }
    // Another image is another hash: the Deployment is applied again on upgrade.
    let deployment = |image| gateway_objects(MILAN, PORT_BASE, image, Default::default()).remove(4);
    assert_ne!(
        applied_hash(&deployment("a").body),
        applied_hash(&deployment("b").body)
    );
}

#[test]
fn a_gateway_is_five_objects_named_after_its_peer() {
    let objects = gateway_objects(MILAN, 51821, IMAGE, Default::default());
    let kinds: Vec<Kind> = objects.iter().map(|m| m.kind).collect();
    assert_eq!(
        kinds,
        [
            Kind::ServiceAccount,
            Kind::Role,
            Kind::RoleBinding,
            Kind::Service,
            Kind::Deployment
        ]
    );
    for m in &objects {
        assert_eq!(m.name, "tandem-gateway-milan");
        assert_eq!(m.body["kind"], json!(m.kind.to_string()));
        assert_eq!(m.body["metadata"]["name"], json!(m.name));
        assert_eq!(m.body["metadata"]["namespace"], json!("tandem-system"));
        assert_eq!(
            m.body["metadata"]["labels"][names::REMOTE_CLUSTER_LABEL],
            json!(MILAN)
        );
    }
    // The Role reads the gateway's own Secret, nothing else.
    assert_eq!(
        objects[1].body["rules"],
        json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"],
                "resourceNames": ["tandem-gateway-milan"]}])
    );
    let svc = &objects[3].body["spec"];
    assert_eq!(svc["type"], "LoadBalancer");
    assert_eq!(
        svc["ports"],
        json!([{"name": "wireguard", "port": 51821, "targetPort": 51821,
                "protocol": "UDP"}])
    );
    let pod = &objects[4].body["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(
        objects[4].body["spec"]["strategy"]["type"], "Recreate",
        "never two gateways on one node's port"
    );
    let container = &pod["containers"][0];
    assert_eq!(container["image"], IMAGE);
    assert_eq!(container["args"], json!(["gateway", "--peer", MILAN]));
    assert_eq!(
        container["securityContext"]["capabilities"],
        json!({"drop": ["ALL"], "add": ["NET_ADMIN"]})
    );
    // The node's TUN device, which no runtime creates in a container.
    assert_eq!(
        pod["volumes"],
        json!([{"name": "dev-net-tun", "hostPath": {"path": "/dev/net/tun", "type": "CharDevice"}}])
    );
    assert_eq!(
        container["volumeMounts"],
        json!([{"name": "dev-net-tun", "mountPath": "/dev/net/tun"}])
    );
    assert_eq!(
        pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchExpressions"][0]["values"],
        json!([names::VIRTUAL_NODE_TYPE]),
        "never on a virtual node"
    );
    // The Service selects the Deployment's pods, and no other peer's.
    let selector = &objects[3].body["spec"]["selector"];
    for (k, v) in selector.as_object().unwrap() {
        assert_eq!(&pod_labels(&objects[4])[k], v);
    }
    assert_ne!(
        gateway_objects("paris", 51821, IMAGE, Default::default())[3].body["spec"]["selector"],
        *selector
    );
}

fn pod_labels(deployment: &Manifest) -> &serde_json::Value {
    &deployment.body["spec"]["template"]["metadata"]["labels"]
}

#[test]
fn the_agent_routes_each_negotiated_peer_to_its_gateway() {
    let views = [
        ViewFixture::new(MILAN).consumer().keyed().negotiated().0,
        // Not negotiated: nothing to route yet.
        ViewFixture::new("paris").provider().0,
    ];
    let objects = agent_objects(&views, IMAGE);
    let kinds: Vec<(Kind, &str)> = objects.iter().map(|m| (m.kind, m.name.as_str())).collect();
    assert_eq!(
        kinds,
        [
            (Kind::ConfigMap, ROUTES_CONFIG_MAP),
            (Kind::ServiceAccount, AGENT),
            (Kind::Role, AGENT),
            (Kind::RoleBinding, AGENT),
            (Kind::DaemonSet, AGENT),
        ]
    );
    let routes: BTreeMap<String, Vec<IpNet>> =
        serde_json::from_str(objects[0].body["data"][ROUTES_KEY].as_str().unwrap()).unwrap();
    let (pod, external) = PEER_AS_SEEN_LOCALLY;
    assert_eq!(
        routes,
        BTreeMap::from([(
            MILAN.to_string(),
            vec![pod.parse().unwrap(), external.parse().unwrap()]
        )])
    );
    let pod = &objects[4].body["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["tolerations"], json!([{"operator": "Exists"}]));
    assert_eq!(pod["containers"][0]["image"], IMAGE);
    assert_eq!(pod["containers"][0]["args"], json!(["agent"]));
    // No peer negotiated: an empty routes map, still valid JSON.
    assert_eq!(agent_objects(&[], IMAGE)[0].body["data"][ROUTES_KEY], "{}");
}

#[test]
fn removal_deletes_the_pods_first() {
    let name = "tandem-gateway-milan".to_string();
    let del = |kind, name: &str| Step::Delete {
        kind,
        name: name.to_string(),
    };
    assert_eq!(
        removal(MILAN),
        [
            del(Kind::Deployment, &name),
            del(Kind::Service, &name),
            del(Kind::RoleBinding, &name),
            del(Kind::Role, &name),
            del(Kind::ServiceAccount, &name),
        ]
    );
    assert_eq!(
        agent_removal(),
        [
            del(Kind::DaemonSet, AGENT),
            del(Kind::ConfigMap, ROUTES_CONFIG_MAP),
            del(Kind::RoleBinding, AGENT),
            del(Kind::Role, AGENT),
            del(Kind::ServiceAccount, AGENT),
        ]
    );
}

#[test]
fn gateways_of_peers_out_of_view_are_forgotten() {
    let views = [ViewFixture::new(MILAN).0];
    let deployments = [
        gateway_deployment(Some(MILAN)),
        gateway_deployment(Some("paris")),
        gateway_deployment(None),
    ];
    assert_eq!(
        orphans(&deployments, &views),
        ["paris".to_string(), String::new()]
    );
    assert_eq!(orphans(&deployments[..1], &views), Vec::<String>::new());
    assert_eq!(orphans(&deployments[..1], &[]), [MILAN.to_string()]);
}

#[test]
fn port_table() {
    let svc = |peer, port| ServiceFixture::gateway(peer, port).0;
    let cases = [
        ("the first gateway", vec![], Some(PORT_BASE)),
        (
            "its own Service's port is kept",
            vec![svc("paris", Some(51820)), svc(MILAN, Some(51830))],
            Some(51830),
        ),
        (
            "the lowest no other gateway uses",
            vec![svc("paris", Some(51820)), svc("rome", Some(51822))],
            Some(51821),
        ),
        (
            "a Service without ports holds none",
            vec![svc("paris", None)],
            Some(PORT_BASE),
        ),
        (
            "its own Service without ports: a free one",
            vec![svc(MILAN, None), svc("paris", Some(51820))],
            Some(51821),
        ),
    ];
    for (what, services, want) in cases {
        assert_eq!(port(MILAN, &services), want, "{what}");
    }
    let all: Vec<Service> = (PORT_BASE..=u16::MAX)
        .map(|p| svc("other", Some(i32::from(p))))
        .collect();
    assert_eq!(port(MILAN, &all), None, "every port taken");
}

/// (what, the Service, the gateway's node, the mode, the Service's age, the endpoint or a
/// part of why there is none).
type ExposureCase<'a> = (
    &'a str,
    Option<Service>,
    Option<&'a str>,
    crate::settings::GatewayServiceType,
    std::time::Duration,
    Result<&'a str, &'a str>,
);

/// Where peers reach the gateway, for each way of exposing it: a load balancer's address
/// or host name whenever there is one (but in NodePort mode), else what the mode falls back
/// to, or why there is nothing yet.
#[test]
fn exposure_table() {
    use crate::settings::GatewayServiceType::{Auto, LoadBalancer, NodePort};
    let svc = || ServiceFixture::gateway(MILAN, Some(51821));
    let soon = std::time::Duration::from_secs(2);
    let later = std::time::Duration::from_secs(60);
    let node = Some("172.18.0.3");
    let cases: Vec<ExposureCase> = vec![
        (
            "LB: the ingress address",
            Some(svc().ingress("203.0.113.7").0),
            node,
            LoadBalancer,
            soon,
            Ok("203.0.113.7:51821"),
        ),
        (
            "LB: a host name (EKS)",
            Some(svc().ingress_hostname("gw.elb.example").0),
            None,
            LoadBalancer,
            soon,
            Ok("gw.elb.example:51821"),
        ),
        (
            "LB: pending, forever",
            Some(svc().0),
            node,
            LoadBalancer,
            later,
            Err("no load-balancer address yet"),
        ),
        (
            "auto: the ingress first",
            Some(svc().ingress("203.0.113.7").0),
            node,
            Auto,
            later,
            Ok("203.0.113.7:51821"),
        ),
        (
            "auto: waits a little for one",
            Some(svc().0),
            node,
            Auto,
            soon,
            Err("waiting up to 10s"),
        ),
        (
            "auto: then the node address, the gateway's own port",
            Some(svc().node_port(31820).0),
            node,
            Auto,
            later,
            Ok("172.18.0.3:51821"),
        ),
        (
            "auto: no pod, no node",
            Some(svc().0),
            None,
            Auto,
            later,
            Err("no pod of the gateway runs"),
        ),
        (
            "NodePort: the node port on the gateway's node",
            Some(svc().node_port(31820).ingress("203.0.113.7").0),
            node,
            NodePort,
            soon,
            Ok("172.18.0.3:31820"),
        ),
        (
            "NodePort: none allocated yet",
            Some(svc().0),
            node,
            NodePort,
            soon,
            Err("no node port yet"),
        ),
        (
            "no Service yet",
            None,
            node,
            Auto,
            later,
            Err("does not exist yet"),
        ),
        (
            "no port",
            Some(
                ServiceFixture::gateway(MILAN, None)
                    .ingress("203.0.113.7")
                    .0,
            ),
            node,
            Auto,
            later,
            Err("has no port"),
        ),
    ];
    for (what, svc, node_ip, exposed, age, want) in cases {
        let got = exposure(svc.as_ref(), node_ip, exposed, age);
        match (want, &got) {
            (Ok(endpoint), Exposure::At { endpoint: e, how }) => {
                assert_eq!(e, endpoint, "{what}");
                assert!(
                    how.contains("tandem-system/tandem-gateway-milan") || what.starts_with("no"),
                    "{what}: {how}"
                );
            }
            (Err(why), Exposure::Pending(said)) => assert!(said.contains(why), "{what}: {said}"),
            _ => panic!("{what}: {got:?}"),
        }
    }
}

/// NodePort mode exposes the gateway through a NodePort Service that keeps the peer's address.
#[test]
fn node_port_mode_makes_a_node_port_service_keeping_the_source() {
    let svc = gateway_objects(
        MILAN,
        51821,
        IMAGE,
        crate::settings::GatewayServiceType::NodePort,
    )
    .remove(3);
    assert_eq!(svc.body["spec"]["type"], "NodePort");
    assert_eq!(svc.body["spec"]["externalTrafficPolicy"], "Local");
    let lb = gateway_objects(
        MILAN,
        51821,
        IMAGE,
        crate::settings::GatewayServiceType::Auto,
    )
    .remove(3);
    assert_eq!(lb.body["spec"]["type"], "LoadBalancer");
    assert!(lb.body["spec"]["externalTrafficPolicy"].is_null());
}

#[test]
fn the_status_api_answers_on_a_running_gateways_node() {
    let pod = |name| PodFixture::new("tandem-system", name);
    let cases = [
        ("no pod", vec![], None),
        ("pending", vec![pod("a").phase("Pending")], None),
        (
            "running",
            vec![
                pod("a").phase("Pending"),
                pod("b").running_on("192.168.1.2"),
            ],
            Some("192.168.1.2"),
        ),
        (
            "the old pod deleting, the new one running",
            vec![
                pod("a").running_on("192.168.1.1").deleting(),
                pod("b").running_on("192.168.1.2"),
            ],
            Some("192.168.1.2"),
        ),
        (
            "only a deleting one",
            vec![pod("a").running_on("192.168.1.1").deleting()],
            None,
        ),
    ];
    for (what, pods, want) in cases {
        let pods: Vec<Pod> = pods.into_iter().map(|p| p.0).collect();
        assert_eq!(running_host(&pods).as_deref(), want, "{what}");
    }
}

#[test]
fn the_settings_pull_secrets_go_on_the_gateway_and_agent_pods_only() {
    let secrets = vec!["regcred".to_string()];
    let gateway = with_pull_secrets(
        gateway_objects(MILAN, PORT_BASE, IMAGE, Default::default()),
        &secrets,
    );
    let agent = with_pull_secrets(agent_objects(&[], IMAGE), &secrets);
    for m in gateway.iter().chain(&agent) {
        let pulls = &m.body["spec"]["template"]["spec"]["imagePullSecrets"];
        match m.kind {
            Kind::Deployment | Kind::DaemonSet => {
                assert_eq!(*pulls, json!([{"name": "regcred"}]), "{}", m.name)
            }
            _ => assert!(pulls.is_null(), "{} {}", m.kind, m.name),
        }
    }
    // None set: the templates are left as they were.
    assert_eq!(
        with_pull_secrets(agent_objects(&[], IMAGE), &[]),
        agent_objects(&[], IMAGE)
    );
}
