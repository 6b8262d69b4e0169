//! What a consumer's peer identity may write in its twin namespaces, as the provider's admin
//! sees it: which writes are refused and by which rule, what the refusal says, and which reads
//! each verdict costs the API server.

use super::*;
use k8s_openapi::api::core::v1::{PodIP, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use tandem_api::NetworkParametersStatus;

const CONSUMER: &str = "rome";
const TWIN: &str = "shop-rome";

/// (case, (kind, object, stored object), what the API server holds, the reads asked for in
/// order, the verdict).
type Case<'a> = (
    &'a str,
    (&'a str, Value, Option<Value>),
    World,
    &'a [Step],
    Result<(), Want>,
);
/// (case, claims admitted before, GiB and claims counted, the admitted claims kept).
type PendingCase<'a> = (&'a str, Vec<PendingClaim>, i128, i128, &'a [&'a str]);

/// Storage in thousandths of a byte, as [`StorageUse`] counts it.
fn gib(n: i128) -> i128 {
    n * (1 << 30) * 1000
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn tenant(spec: Value) -> Tenant {
    let mut t = Tenant::new(CONSUMER, serde_json::from_value(spec).unwrap());
    t.metadata.namespace = Some(names::tenant_namespace(CONSUMER));
    t
}

/// Everything the webhook could read about the consumer: a twin namespace of it, its Tenant
/// (offering class `fast`), range 10.1.0.0/16 granted, a ShadowPod's pod at 192.168.9.9, the
/// provider's default class `standard` and no other claim.
struct World {
    namespace: Namespace,
    tenants: Vec<Tenant>,
    ranges: Vec<IpNet>,
    own_pods: BTreeSet<IpAddr>,
    default_classes: Vec<String>,
    used: StorageUse,
}

impl World {
    fn new() -> Self {
        let mut namespace = Namespace::default();
        namespace.metadata.name = Some(TWIN.into());
        namespace.metadata.labels = Some(labels(&[
            (names::TWIN_NAMESPACE_LABEL, "true"),
            (names::ORIGIN_CLUSTER_LABEL, CONSUMER),
        ]));
        World {
            namespace,
            tenants: vec![tenant(
                json!({"clusterID": CONSUMER, "storageClasses": ["fast"]}),
            )],
            ranges: vec!["10.1.0.0/16".parse().unwrap()],
            own_pods: BTreeSet::from(["192.168.9.9".parse().unwrap()]),
            default_classes: vec!["standard".into()],
            used: StorageUse::default(),
        }
    }
    fn namespace_labels(mut self, pairs: &[(&str, &str)]) -> Self {
        self.namespace.metadata.labels = Some(labels(pairs));
        self
    }
    fn tenants(mut self, tenants: Vec<Tenant>) -> Self {
        self.tenants = tenants;
        self
    }
    fn tenant(self, spec: Value) -> Self {
        self.tenants(vec![tenant(spec)])
    }
    fn ranges(mut self, ranges: &[&str]) -> Self {
        self.ranges = ranges.iter().map(|r| r.parse().unwrap()).collect();
        self
    }
    fn used(mut self, storage: i128, claims: i128) -> Self {
        self.used = StorageUse { storage, claims };
        self
    }

    /// Answers `step` as the API server would.
    fn read(&self, step: Step, seen: &mut Observed) {
        match step {
            Step::ReadNamespace => seen.namespace = Some(self.namespace.clone()),
            Step::ListTenants => seen.tenants = Some(self.tenants.clone()),
            Step::ReadGrantedRanges => seen.ranges = Some(self.ranges.clone()),
            Step::ListTwinPods => seen.own_pods = Some(self.own_pods.clone()),
            Step::ListStorageClasses => seen.default_classes = Some(self.default_classes.clone()),
            Step::ListClaims => seen.used = Some(self.used),
            Step::Admit => unreachable!("not a read"),
        }
    }
}

fn write<'a>(kind: &'a str, object: &'a Value, old: Option<&'a Value>) -> PeerWrite<'a> {
    PeerWrite {
        consumer: CONSUMER,
        namespace: TWIN,
        kind,
        name: object["metadata"]["name"].as_str().unwrap_or_default(),
        object,
        old,
    }
}

/// Runs the plan against `world`: the reads it asks for, in order, and its verdict.
fn decide(write: &PeerWrite<'_>, world: &World) -> (Vec<Step>, Result<(), Refused>) {
    let mut seen = Observed::default();
    let mut reads = Vec::new();
    loop {
        match next(write, &seen) {
            Err(refused) => return (reads, Err(refused)),
            Ok(Step::Admit) => return (reads, Ok(())),
            Ok(step) => {
                assert!(!reads.contains(&step), "{step:?} asked for twice");
                reads.push(step);
                world.read(step, &mut seen);
            }
        }
    }
}

/// A refusal expected: exactly this one, or one of a core rule (the variant, the rule, a part
/// of its detail).
enum Want {
    Exactly(Refused),
    Rule(fn(Refusal) -> Refused, &'static str, &'static str),
}

fn service(spec: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": spec})
}

fn slice(address_type: &str, addresses: &[&str]) -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": "web-abc"}, "addressType": address_type,
           "endpoints": [{"addresses": addresses}]})
}

fn claim(spec: Value) -> Value {
    let mut spec = spec;
    spec["resources"] = json!({"requests": {"storage": "5Gi"}});
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data"},
           "spec": spec})
}

use Step::{
    ListClaims, ListStorageClasses, ListTenants, ListTwinPods, ReadGrantedRanges, ReadNamespace,
};
const TENANT_READS: &[Step] = &[ReadNamespace, ListTenants];
const SLICE_READS: &[Step] = &[ReadNamespace, ListTenants, ReadGrantedRanges];
const SLICE_POD_READS: &[Step] = &[ReadNamespace, ListTenants, ReadGrantedRanges, ListTwinPods];
const CLAIM_READS: &[Step] = &[ReadNamespace, ListTenants, ListClaims];
const CLAIM_CLASS_READS: &[Step] = &[ReadNamespace, ListTenants, ListStorageClasses, ListClaims];

#[test]
fn peer_writes_table() {
    let not_twin = Want::Exactly(Refused::NotTwin {
        namespace: TWIN.into(),
        consumer: CONSUMER.into(),
    });
    let no_tenant = || {
        Want::Exactly(Refused::NoTenant {
            consumer: CONSUMER.into(),
            tenant_namespace: "tandem-tenant-rome".into(),
        })
    };
    let mut deleting = tenant(json!({"clusterID": CONSUMER}));
    deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    let svc = |spec| ("Service", service(spec), None);
    let eps = |t, a: &[&str]| ("EndpointSlice", slice(t, a), None);
    let pvc = |spec| ("PersistentVolumeClaim", claim(spec), None);
    let update = |spec, old: Value| ("PersistentVolumeClaim", claim(spec), Some(claim(old)));
    let cases: Vec<Case> = vec![
        // Whose namespace, whose Tenant.
        (
            "NotTwin: not a twin namespace",
            svc(json!({})),
            World::new().namespace_labels(&[]),
            &[ReadNamespace],
            Err(not_twin),
        ),
        (
            "NotTwin: another consumer's twin",
            svc(json!({})),
            World::new().namespace_labels(&[
                (names::TWIN_NAMESPACE_LABEL, "true"),
                (names::ORIGIN_CLUSTER_LABEL, "milan"),
            ]),
            &[ReadNamespace],
            Err(Want::Exactly(Refused::NotTwin {
                namespace: TWIN.into(),
                consumer: CONSUMER.into(),
            })),
        ),
        (
            "NoTenant: none",
            svc(json!({})),
            World::new().tenants(vec![]),
            TENANT_READS,
            Err(no_tenant()),
        ),
        (
            "NoTenant: being deleted",
            svc(json!({})),
            World::new().tenants(vec![deleting]),
            TENANT_READS,
            Err(no_tenant()),
        ),
        (
            "NoTenant: another consumer's",
            svc(json!({})),
            World::new().tenant(json!({"clusterID": "milan"})),
            TENANT_READS,
            Err(no_tenant()),
        ),
        // Services.
        (
            "Admit: a ClusterIP Service",
            svc(json!({"ports": [{"port": 80}]})),
            World::new(),
            TENANT_READS,
            Ok(()),
        ),
        (
            "Admit: a NodePort Service the Tenant allows",
            svc(json!({"type": "NodePort"})),
            World::new()
                .tenant(json!({"clusterID": CONSUMER, "allowedServiceTypes": ["NodePort"]})),
            TENANT_READS,
            Ok(()),
        ),
        (
            "Service: a LoadBalancer the Tenant does not allow",
            svc(json!({"type": "LoadBalancer"})),
            World::new()
                .tenant(json!({"clusterID": CONSUMER, "allowedServiceTypes": ["NodePort"]})),
            TENANT_READS,
            Err(Want::Rule(
                Refused::Service,
                "services",
                "type LoadBalancer is not allowed for a peer",
            )),
        ),
        (
            "Service: externalIPs",
            svc(json!({"externalIPs": ["1.2.3.4"]})),
            World::new(),
            TENANT_READS,
            Err(Want::Rule(
                Refused::Service,
                "services",
                "externalIPs are never allowed for a peer",
            )),
        ),
        // EndpointSlices.
        (
            "Admit: addresses in the granted range",
            eps("IPv4", &["10.1.0.5", "10.1.3.4"]),
            World::new(),
            SLICE_READS,
            Ok(()),
        ),
        (
            "Admit: the address of its own ShadowPod's pod",
            eps("IPv4", &["10.1.0.5", "192.168.9.9"]),
            World::new(),
            SLICE_POD_READS,
            Ok(()),
        ),
        (
            "EndpointSlice: an address of the provider's",
            eps("IPv4", &["10.1.0.5", "192.168.9.10"]),
            World::new(),
            SLICE_POD_READS,
            Err(Want::Rule(
                Refused::EndpointSlice,
                "endpoint-slices",
                "endpoint address 192.168.9.10 is neither in the consumer's ranges (granted: \
                 10.1.0.0/16) nor a pod of its own in this namespace",
            )),
        ),
        (
            "EndpointSlice: no range granted yet",
            eps("IPv4", &["10.1.0.5"]),
            World::new().ranges(&[]),
            SLICE_POD_READS,
            Err(Want::Rule(
                Refused::EndpointSlice,
                "endpoint-slices",
                "(no range is granted to it)",
            )),
        ),
        (
            "EndpointSlice: an FQDN slice",
            eps("FQDN", &["db.example.com"]),
            World::new(),
            SLICE_READS,
            Err(Want::Rule(
                Refused::EndpointSlice,
                "endpoint-slices",
                "addressType \"FQDN\": only IPv4 and IPv6 slices are reflected",
            )),
        ),
        (
            "EndpointSlice: an address that is no IP",
            eps("IPv4", &["db.local"]),
            World::new(),
            SLICE_READS,
            Err(Want::Rule(
                Refused::EndpointSlice,
                "endpoint-slices",
                "endpoint address \"db.local\" is not an IP address",
            )),
        ),
        // Claims.
        (
            "Admit: a claim of a class the Tenant offers",
            pvc(json!({"storageClassName": "fast"})),
            World::new(),
            CLAIM_READS,
            Ok(()),
        ),
        (
            "Admit: a claim naming no class",
            pvc(json!({})),
            World::new(),
            CLAIM_READS,
            Ok(()),
        ),
        (
            "Admit: the provider's default class",
            pvc(json!({"storageClassName": "standard"})),
            World::new(),
            CLAIM_CLASS_READS,
            Ok(()),
        ),
        (
            "Admit: an update keeping the volume the provider bound",
            update(
                json!({"storageClassName": "fast", "volumeName": "pv-1"}),
                json!({"storageClassName": "fast", "volumeName": "pv-1"}),
            ),
            World::new(),
            CLAIM_READS,
            Ok(()),
        ),
        (
            "Claim: a class not offered",
            pvc(json!({"storageClassName": "gold"})),
            World::new(),
            CLAIM_CLASS_READS,
            Err(Want::Rule(
                Refused::Claim,
                "claims",
                "StorageClass \"gold\" is not offered to this consumer",
            )),
        ),
        (
            "Claim: the empty class",
            pvc(json!({"storageClassName": ""})),
            World::new(),
            CLAIM_READS,
            Err(Want::Rule(
                Refused::Claim,
                "claims",
                "storageClassName \"\" binds a pre-provisioned volume",
            )),
        ),
        (
            "Claim: a volume named",
            pvc(json!({"volumeName": "pv-other-tenant"})),
            World::new(),
            CLAIM_READS,
            Err(Want::Rule(
                Refused::Claim,
                "claims",
                "volumeName: a peer's claim never names a volume",
            )),
        ),
        (
            "Claim: a selector",
            pvc(json!({"selector": {"matchLabels": {"a": "b"}}})),
            World::new(),
            CLAIM_READS,
            Err(Want::Rule(
                Refused::Claim,
                "claims",
                "selector: a peer's claim is always a new, empty volume",
            )),
        ),
        (
            "Claim: a data source",
            pvc(json!({"dataSource": {"kind": "PersistentVolumeClaim", "name": "theirs"}})),
            World::new(),
            CLAIM_READS,
            Err(Want::Rule(Refused::Claim, "claims", "dataSource:")),
        ),
        (
            "Claim: a data source reference",
            pvc(json!({"dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "theirs"}})),
            World::new(),
            CLAIM_READS,
            Err(Want::Rule(Refused::Claim, "claims", "dataSourceRef:")),
        ),
        (
            "Claim: storage beyond the grant, over all twins",
            pvc(json!({})),
            World::new()
                .tenant(json!({"clusterID": CONSUMER, "grant": {"requests.storage": "10Gi"}}))
                .used(gib(8), 1),
            CLAIM_READS,
            Err(Want::Rule(
                Refused::Claim,
                "storage-grant",
                "would request 13958643712 bytes of storage, beyond its grant of 10737418240",
            )),
        ),
        (
            "Admit: storage within the grant",
            pvc(json!({})),
            World::new()
                .tenant(json!({"clusterID": CONSUMER, "grant": {"requests.storage": "10Gi"}}))
                .used(gib(5), 1),
            CLAIM_READS,
            Ok(()),
        ),
        (
            "Claim: claims beyond the grant",
            pvc(json!({})),
            World::new()
                .tenant(json!({"clusterID": CONSUMER, "grant": {"persistentvolumeclaims": "2"}}))
                .used(0, 2),
            CLAIM_READS,
            Err(Want::Rule(
                Refused::Claim,
                "storage-grant",
                "the consumer would have 3 claims in all of its namespaces here, beyond its grant \
                 of 2",
            )),
        ),
        // Anything else in a twin is not this webhook's.
        (
            "Admit: a kind not checked",
            ("ConfigMap", json!({"metadata": {"name": "cfg"}}), None),
            World::new(),
            TENANT_READS,
            Ok(()),
        ),
    ];
    for (case, (kind, object, old), world, reads, want) in cases {
        let (got_reads, got) = decide(&write(kind, &object, old.as_ref()), &world);
        assert_eq!(got_reads, reads, "{case}: reads");
        match (want, got) {
            (Ok(()), got) => assert_eq!(got, Ok(()), "{case}"),
            (Err(Want::Exactly(want)), got) => assert_eq!(got, Err(want), "{case}"),
            (Err(Want::Rule(variant, rule, detail)), got) => {
                let got = got.expect_err(case);
                let refusal = got.refusal();
                assert_eq!(
                    std::mem::discriminant(&got),
                    std::mem::discriminant(&variant(refusal.clone())),
                    "{case}: {got:?}"
                );
                assert_eq!(refusal.rule, rule, "{case}");
                assert!(
                    refusal.detail.contains(detail),
                    "{case}: {}",
                    refusal.detail
                );
            }
        }
    }
}

#[test]
fn the_answer_names_the_object_the_consumer_and_the_rule() {
    let object = service(json!({}));
    let w = write("Service", &object, None);
    let uid = json!("u-1");
    assert_eq!(
        answer(&uid, &w, &Ok(())),
        json!({"uid": "u-1", "allowed": true})
    );
    let refused = Refused::NoTenant {
        consumer: CONSUMER.into(),
        tenant_namespace: "tandem-tenant-rome".into(),
    };
    assert_eq!(
        answer(&uid, &w, &Err(refused)),
        json!({"uid": "u-1", "allowed": false, "status": {
            "code": 403, "reason": "Forbidden",
            "message": "Service shop-rome/web of consumer rome: refused by rule tenant: consumer \
                        rome has no Tenant in tandem-tenant-rome",
        }})
    );
    let not_twin = Refused::NotTwin {
        namespace: TWIN.into(),
        consumer: CONSUMER.into(),
    };
    assert_eq!(
        not_twin.to_string(),
        "refused by rule twin-namespaces: namespace shop-rome is not a twin namespace of \
         consumer rome"
    );
    // Failing closed: what could not be read refuses the write.
    assert_eq!(
        unchecked(&uid, &w, &"connection refused"),
        json!({"uid": "u-1", "allowed": false, "status": {
            "code": 500,
            "message": "checking Service shop-rome/web of consumer rome: connection refused",
        }})
    );
}

#[test]
fn only_peer_identities_writes_are_checked() {
    let object = json!({"metadata": {"name": "from-object"}});
    let request = |user: &str, name: Option<&str>, old: Value| {
        json!({"uid": "u", "userInfo": {"username": user}, "namespace": TWIN,
               "kind": {"kind": "Service"}, "name": name, "object": object, "oldObject": old})
    };
    let admin = request("kubernetes-admin", Some("web"), Value::Null);
    assert!(
        peer_write(&admin).is_none(),
        "the admin's write is let through"
    );
    let created = request("tandem:peer:rome", None, Value::Null);
    let w = peer_write(&created).unwrap();
    assert_eq!(
        (w.consumer, w.namespace, w.kind, w.name, w.old),
        (CONSUMER, TWIN, "Service", "from-object", None)
    );
    let updated = request("tandem:peer:rome", Some("web"), json!({"spec": {}}));
    let w = peer_write(&updated).unwrap();
    assert_eq!(w.name, "web");
    assert_eq!(w.old, Some(&json!({"spec": {}})));
}

#[test]
fn the_webhook_fails_closed_for_peer_identities_only() {
    let config = serde_json::to_value(configuration(json!({"url": "https://x/validate"}))).unwrap();
    let hook = &config["webhooks"][0];
    assert_eq!(config["metadata"]["name"], names::PEER_WRITES_WEBHOOK);
    assert_eq!(hook["failurePolicy"], "Fail");
    assert_eq!(
        hook["matchConditions"][0]["expression"],
        "request.userInfo.username.startsWith('tandem:peer:')"
    );
    assert_eq!(
        hook["namespaceSelector"]["matchExpressions"][0]["key"],
        names::TWIN_NAMESPACE_LABEL
    );
}

#[test]
fn claims_in_use_table() {
    let now = Instant::now() + Duration::from_secs(3600);
    let use_of = |gi| StorageUse {
        storage: gib(gi),
        claims: 1,
    };
    let stored: BTreeMap<(String, String), StorageUse> = [
        ((TWIN.to_string(), "a".to_string()), use_of(1)),
        (("other-twin".to_string(), "b".to_string()), use_of(2)),
        ((TWIN.to_string(), "data".to_string()), use_of(4)),
    ]
    .into();
    let pending = |name: &str, gi, ago: u64| PendingClaim {
        namespace: TWIN.into(),
        name: name.into(),
        usage: use_of(gi),
        admitted: now - Duration::from_secs(ago),
    };
    // (case, pending before, storage counted in GiB, claims counted, pending kept)
    let cases: Vec<PendingCase> = vec![
        ("stored claims, but the one written now", vec![], 3, 2, &[]),
        (
            "an admitted claim not listed yet",
            vec![pending("new", 8, 1)],
            11,
            3,
            &["new"],
        ),
        (
            "an admitted claim listed since",
            vec![pending("a", 1, 1)],
            3,
            2,
            &[],
        ),
        (
            "an admitted claim never stored, past its time",
            vec![pending("lost", 8, PENDING_FOR.as_secs())],
            3,
            2,
            &[],
        ),
        (
            "the claim written now, admitted before",
            vec![pending("data", 8, 1)],
            3,
            2,
            &[],
        ),
    ];
    for (case, mut kept, storage, claims, want_kept) in cases {
        let used = claims_in_use(&stored, &mut kept, TWIN, "data", now);
        assert_eq!(
            used,
            StorageUse {
                storage: gib(storage),
                claims
            },
            "{case}"
        );
        let names: Vec<&str> = kept.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, want_kept, "{case}");
    }
    let object = claim(json!({}));
    let admitted = pending_claim(&write("PersistentVolumeClaim", &object, None), now);
    assert_eq!(
        (admitted.name.as_str(), admitted.usage),
        ("data", use_of(5))
    );
}

#[test]
fn what_is_read_is_what_the_provider_granted() {
    // Ranges: only the status this cluster writes, unparsable ones dropped.
    let mut theirs = NetworkParameters::new(
        "consumer",
        serde_json::from_value(json!({"clusterID": CONSUMER, "podCIDR": "10.99.0.0/16"})).unwrap(),
    );
    assert_eq!(granted_ranges(Some(theirs.clone())), Vec::<IpNet>::new());
    theirs.status = Some(NetworkParametersStatus {
        remapped_pod_cidr: Some("10.1.0.0/16".into()),
        remapped_external_cidr: Some("nonsense".into()),
        ..Default::default()
    });
    assert_eq!(
        granted_ranges(Some(theirs)),
        vec!["10.1.0.0/16".parse::<IpNet>().unwrap()]
    );
    assert_eq!(granted_ranges(None), Vec::<IpNet>::new());

    // Own pods: only those a ShadowPod owns.
    let pod = |owner: &str, ips: &[&str]| {
        let mut p = Pod::default();
        p.metadata.owner_references = Some(vec![OwnerReference {
            kind: owner.into(),
            ..Default::default()
        }]);
        p.status = Some(PodStatus {
            pod_ip: ips.first().map(|ip| ip.to_string()),
            pod_ips: Some(ips.iter().map(|ip| PodIP { ip: ip.to_string() }).collect()),
            ..Default::default()
        });
        p
    };
    let own = own_pod_addresses(&[
        pod("ShadowPod", &["192.168.9.9", "fd00::9"]),
        pod("ReplicaSet", &["192.168.9.10"]),
    ]);
    assert_eq!(
        own,
        BTreeSet::from(["192.168.9.9".parse().unwrap(), "fd00::9".parse().unwrap()])
    );

    // Default classes: those annotated so.
    let class = |name: &str, default: Option<&str>| {
        let mut c = StorageClass::default();
        c.metadata.name = Some(name.into());
        c.metadata.annotations =
            default.map(|d| labels(&[("storageclass.kubernetes.io/is-default-class", d)]));
        c
    };
    assert_eq!(
        default_storage_classes(&[
            class("standard", Some("true")),
            class("fast", None),
            class("old", Some("false")),
        ]),
        vec!["standard".to_string()]
    );

    // Claims: those in the consumer's twins only.
    let pvc = |ns: &str, name: &str| {
        let mut c: PersistentVolumeClaim = serde_json::from_value(claim(json!({}))).unwrap();
        c.metadata.namespace = Some(ns.into());
        c.metadata.name = Some(name.into());
        c
    };
    let twins = BTreeSet::from([TWIN.to_string()]);
    let claims = claims_of(&twins, &[pvc(TWIN, "data"), pvc("shop-milan", "data")]);
    assert_eq!(
        claims,
        BTreeMap::from([(
            (TWIN.to_string(), "data".to_string()),
            StorageUse {
                storage: gib(5),
                claims: 1
            }
        )])
    );
}
