//! Which twin namespaces a consumer gets, as the provider's admin sees it: the RemoteNamespace's
//! phase and message for each refusal and wait, the namespace, bindings and quota a twin
//! holds, and what deleting the request does to the twin.

use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tandem_api::RemoteNamespaceSpec;

const CONSUMER: &str = "rome";
const TENANT_NS: &str = "tandem-tenant-rome";

/// (case, what the check returned, the refusal, status message, retried after).
type RefusalCase<'a> = (
    &'a str,
    Result<(), Refusal>,
    Refusal,
    &'a str,
    Option<Duration>,
);
/// (case, what the check returned, the hold, status message, retried after).
type HoldCase<'a> = (&'a str, Result<(), Hold>, Hold, &'a str, Option<Duration>);
/// (case, Tenant, twin, the request's pod offloading strategy, decision).
type StrategyCase<'a> = (
    &'a str,
    TenantFixture,
    &'a str,
    Option<PodOffloadingStrategy>,
    Result<(), Refusal>,
);
/// (case, Tenant, the consumer's twins, (held, cap) when refused).
type RoomCase<'a> = (
    &'a str,
    &'a TenantFixture,
    Vec<&'a str>,
    Option<(usize, u32)>,
);

fn secs(s: u64) -> Option<Duration> {
    Some(Duration::from_secs(s))
}

/// A Namespace as the provider holds it.
struct NsFixture(Namespace);

impl NsFixture {
    fn new(name: &str) -> Self {
        let mut ns = Namespace::default();
        ns.metadata.name = Some(name.into());
        NsFixture(ns)
    }
    fn label(mut self, key: &str, value: &str) -> Self {
        self.0.labels_mut().insert(key.into(), value.into());
        self
    }
    /// A tenant namespace of `consumer`, as peering labels it.
    fn tenant_of(self, consumer: &str) -> Self {
        self.label(names::TENANT_NAMESPACE_LABEL, "true")
            .label(names::REMOTE_CLUSTER_LABEL, consumer)
    }
    /// The twin of `consumer`'s `origin`, as this reconciler labels it.
    fn twin_of(self, consumer: &str, origin: &str) -> Self {
        self.label(names::TWIN_NAMESPACE_LABEL, "true")
            .label(names::ORIGIN_CLUSTER_LABEL, consumer)
            .label(names::ORIGIN_NAMESPACE_LABEL, origin)
    }
    /// Retained for its data on unpeering, for the peering under `key` if said.
    fn retained(mut self, key: Option<&str>) -> Self {
        if let Some(key) = key {
            self.0
                .annotations_mut()
                .insert(names::KEY_FINGERPRINT_ANNOTATION.into(), key.into());
        }
        self.label(names::RETAINED_DATA_LABEL, "true")
    }
    fn deleting(mut self) -> Self {
        self.0.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        self
    }
}

/// The consumer's Tenant: no limits said, its key recorded.
struct TenantFixture(serde_json::Value);

impl TenantFixture {
    fn new() -> Self {
        TenantFixture(json!({
            "apiVersion": "tandem.dev/v1alpha1", "kind": "Tenant",
            "metadata": {"name": CONSUMER, "namespace": TENANT_NS,
                         "annotations": {names::KEY_FINGERPRINT_ANNOTATION: "sha256:ab12"}},
            "spec": {"clusterID": CONSUMER},
        }))
    }
    fn spec(mut self, field: &str, value: serde_json::Value) -> Self {
        self.0["spec"][field] = value;
        self
    }
    fn key(mut self, key: Option<&str>) -> Self {
        self.0["metadata"]["annotations"][names::KEY_FINGERPRINT_ANNOTATION] = json!(key);
        self
    }
    fn policy(mut self, name: &str) -> Self {
        self.0["metadata"]["annotations"][names::POLICY_ANNOTATION] = json!(name);
        self
    }
    fn mappings(self, allowed: &[NamespaceMappingStrategy]) -> Self {
        self.spec("allowedNamespaceMappingStrategies", json!(allowed))
    }
    fn pods(self, allowed: &[PodOffloadingStrategy]) -> Self {
        self.spec("allowedPodOffloadingStrategies", json!(allowed))
    }
    fn max_twins(self, cap: u32) -> Self {
        self.spec("maxTwinNamespaces", json!(cap))
    }
    fn deleting(mut self) -> Self {
        self.0["metadata"]["deletionTimestamp"] = json!("2030-01-01T00:00:00Z");
        self
    }
    fn build(&self) -> Tenant {
        let mut value = self.0.clone();
        // A key set to null is no key.
        if let Some(a) = value["metadata"]["annotations"].as_object_mut() {
            a.retain(|_, v| !v.is_null());
        }
        serde_json::from_value(value).unwrap()
    }
}

/// The consumer's request for twin `twin` of its namespace `origin`.
fn request(twin: &str, origin: &str, pods: Option<PodOffloadingStrategy>) -> RemoteNamespace {
    let mut rn = RemoteNamespace::new(
        origin,
        RemoteNamespaceSpec {
            namespace: twin.into(),
            origin_namespace: origin.into(),
            pod_offloading_strategy: pods,
        },
    );
    rn.metadata.namespace = Some(TENANT_NS.into());
    rn
}

fn twins(names: &[&str]) -> Vec<Namespace> {
    names
        .iter()
        .map(|n| NsFixture::new(n).twin_of(CONSUMER, "x").0)
        .collect()
}

use NamespaceMappingStrategy::{DefaultName, EnforceSameName, SelectedName};
use PodOffloadingStrategy::{Local, LocalAndRemote, Remote};

/// Every refusal once: what the request's status says (phase Failed) and when it is looked at
/// again without a change.
#[test]
fn refusal_table() {
    let limited = TenantFixture::new().pods(&[Remote]);
    let cases: Vec<RefusalCase> = vec![
        (
            "NotInTenantNamespace: filed in a namespace peering did not make",
            consumer(Some(&NsFixture::new("default").0)).map(drop),
            Refusal::NotInTenantNamespace,
            "not in a tenant namespace: twin namespaces are only created for peered consumers",
            None,
        ),
        (
            "Reserved: kube-system",
            twin_name("kube-system"),
            Refusal::Reserved {
                twin: "kube-system".into(),
                why: Reserved::System,
            },
            "namespace kube-system: reserved for the system",
            None,
        ),
        (
            "Taken: the admin's own namespace",
            claim(
                Some(&NsFixture::new("payments").0),
                "payments",
                CONSUMER,
                "payments",
            ),
            Refusal::Taken {
                twin: "payments".into(),
                consumer: CONSUMER.into(),
                origin: "payments".into(),
            },
            "namespace payments already exists and is not the twin of rome/payments; choose another name (--namespace-mapping-strategy SelectedName)",
            secs(30),
        ),
        (
            "MappingNotAllowed: the same name, under the Tenant's default",
            strategies(&TenantFixture::new().build(), &request("app", "app", None), CONSUMER),
            Refusal::MappingNotAllowed {
                twin: "app".into(),
                mapping: EnforceSameName,
                consumer: CONSUMER.into(),
                by: "the default of Tenant tandem-tenant-rome/rome (the admin may allow more: spec.allowedNamespaceMappingStrategies)".into(),
                allowed: vec![DefaultName],
            },
            "namespace mapping strategy EnforceSameName (twin namespace app) is not allowed for consumer rome by the default of Tenant tandem-tenant-rome/rome (the admin may allow more: spec.allowedNamespaceMappingStrategies) (allowed: [DefaultName])",
            None,
        ),
        (
            "PodStrategyUnsaid: an older consumer under a PeeringPolicy's limit",
            strategies(
                &TenantFixture::new().pods(&[Remote]).policy("gold").build(),
                &request("app-rome", "app", None),
                CONSUMER,
            ),
            Refusal::PodStrategyUnsaid {
                origin: "app".into(),
                consumer: CONSUMER.into(),
                by: "PeeringPolicy gold".into(),
                allowed: vec![Remote],
            },
            "namespace app does not say its pod offloading strategy, which PeeringPolicy gold limits for consumer rome (allowed: [Remote]); upgrade its Tandem",
            None,
        ),
        (
            "PodStrategyNotAllowed: Local where only Remote is allowed",
            strategies(&limited.build(), &request("app-rome", "app", Some(Local)), CONSUMER),
            Refusal::PodStrategyNotAllowed {
                pods: Local,
                origin: "app".into(),
                consumer: CONSUMER.into(),
                by: "Tenant tandem-tenant-rome/rome".into(),
                allowed: vec![Remote],
            },
            "pod offloading strategy Local of namespace app is not allowed for consumer rome by Tenant tandem-tenant-rome/rome (allowed: [Remote])",
            None,
        ),
        (
            "TooManyTwins: a third twin where two are allowed",
            room(
                &TenantFixture::new().max_twins(2).build(),
                CONSUMER,
                "c-rome",
                &twins(&["a-rome", "b-rome"]),
            ),
            Refusal::TooManyTwins {
                consumer: CONSUMER.into(),
                held: 2,
                cap: 2,
            },
            "consumer rome already has 2 twin namespaces, the most Tenant tandem-tenant-rome/rome allows (spec.maxTwinNamespaces: 2)",
            secs(60),
        ),
        (
            "RetainedForAnotherKey: data kept for an earlier key",
            adopt(
                &NsFixture::new("app-rome")
                    .twin_of(CONSUMER, "app")
                    .retained(Some("sha256:aa"))
                    .0,
                &TenantFixture::new().key(Some("sha256:bb")).build(),
                "app-rome",
                CONSUMER,
            )
            .map(drop),
            Refusal::RetainedForAnotherKey {
                twin: "app-rome".into(),
                consumer: CONSUMER.into(),
                kept_for: "sha256:aa".into(),
                key: Some("sha256:bb".into()),
            },
            "namespace app-rome holds data kept from an earlier peering of rome under key sha256:aa, and this peering's key is sha256:bb: it is not re-adopted; the provider's admin deletes the namespace, or re-keys Tenant tandem-tenant-rome/rome if the consumer really changed its key",
            secs(60),
        ),
    ];
    for (case, got, want, message, retry) in cases {
        assert_eq!(got, Err(want.clone()), "{case}");
        let outcome = Outcome::from(want);
        assert_eq!(outcome.phase(), "Failed", "{case}");
        assert_eq!(outcome.message(), message, "{case}");
        assert_eq!(outcome.requeue(), retry, "{case}");
    }
}

#[test]
fn reserved_table() {
    let long = "a".repeat(64);
    let cases: Vec<(&str, Option<Reserved>)> = vec![
        ("app", None),
        ("app-rome", None),
        ("monitoring-rome", None),
        ("kubeflow", None),
        ("App", Some(Reserved::InvalidName)),
        ("", Some(Reserved::InvalidName)),
        (&long, Some(Reserved::InvalidName)),
        ("default", Some(Reserved::System)),
        ("kube-system", Some(Reserved::System)),
        ("kube-public", Some(Reserved::System)),
        ("openshift-monitoring", Some(Reserved::System)),
        ("tandem-system", Some(Reserved::Tandem)),
        ("tandem-tenant-paris", Some(Reserved::Tandem)),
        ("monitoring", Some(Reserved::AddOn)),
        ("local-path-storage", Some(Reserved::AddOn)),
    ];
    for (name, want) in cases {
        assert_eq!(reserved(name), want, "{name:?}");
        assert_eq!(twin_name(name).is_ok(), want.is_none(), "{name:?}");
    }
    for name in RESERVED_NAMESPACES {
        assert_eq!(reserved(name), Some(Reserved::AddOn), "{name}");
    }
    // What the status says of each.
    assert_eq!(
        [
            Reserved::InvalidName,
            Reserved::System,
            Reserved::Tandem,
            Reserved::AddOn
        ]
        .map(|r| Outcome::from(Refusal::Reserved {
            twin: "x".into(),
            why: r
        })
        .message()),
        [
            "namespace x: not a valid namespace name",
            "namespace x: reserved for the system",
            "namespace x: reserved for Tandem",
            "namespace x: reserved for an add-on this cluster's admin may install",
        ]
    );
}

#[test]
fn consumer_table() {
    let cases = [
        ("no such namespace", None, None),
        ("an ordinary namespace", Some(NsFixture::new("app")), None),
        (
            "labelled a tenant namespace, no consumer",
            Some(NsFixture::new(TENANT_NS).label(names::TENANT_NAMESPACE_LABEL, "true")),
            None,
        ),
        (
            "naming a consumer, not a tenant namespace",
            Some(NsFixture::new("app").label(names::REMOTE_CLUSTER_LABEL, "rome")),
            None,
        ),
        (
            "the consumer's tenant namespace",
            Some(NsFixture::new(TENANT_NS).tenant_of(CONSUMER)),
            Some(CONSUMER),
        ),
    ];
    for (case, ns, want) in cases {
        let got = consumer(ns.as_ref().map(|n| &n.0));
        match want {
            Some(c) => assert_eq!(got, Ok(c.to_string()), "{case}"),
            None => assert_eq!(got, Err(Refusal::NotInTenantNamespace), "{case}"),
        }
    }
}

#[test]
fn claim_table() {
    let taken = Err(Refusal::Taken {
        twin: "app-rome".into(),
        consumer: CONSUMER.into(),
        origin: "app".into(),
    });
    let cases = [
        ("not there yet", None, Ok(())),
        (
            "this request's twin",
            Some(NsFixture::new("app-rome").twin_of(CONSUMER, "app")),
            Ok(()),
        ),
        (
            "the admin's namespace",
            Some(NsFixture::new("app-rome")),
            taken.clone(),
        ),
        (
            "another consumer's twin",
            Some(NsFixture::new("app-rome").twin_of("paris", "app")),
            taken.clone(),
        ),
        (
            "the twin of another of the consumer's namespaces",
            Some(NsFixture::new("app-rome").twin_of(CONSUMER, "web")),
            taken.clone(),
        ),
        (
            "labelled for the consumer but not a twin",
            Some(
                NsFixture::new("app-rome")
                    .label(names::ORIGIN_CLUSTER_LABEL, CONSUMER)
                    .label(names::ORIGIN_NAMESPACE_LABEL, "app"),
            ),
            taken,
        ),
    ];
    for (case, existing, want) in cases {
        assert_eq!(
            claim(existing.as_ref().map(|n| &n.0), "app-rome", CONSUMER, "app"),
            want,
            "{case}"
        );
    }
}

#[test]
fn strategies_table() {
    let by_tenant = || "Tenant tandem-tenant-rome/rome".to_string();
    let mapping_refused = |twin: &str, mapping, allowed: Vec<NamespaceMappingStrategy>| {
        Err(Refusal::MappingNotAllowed {
            twin: twin.into(),
            mapping,
            consumer: CONSUMER.into(),
            by: by_tenant(),
            allowed,
        })
    };
    let cases: Vec<StrategyCase> = vec![
        ("DefaultName by default", TenantFixture::new(), "app-rome", None, Ok(())),
        (
            "a selected name, refused by default",
            TenantFixture::new(),
            "blue",
            None,
            Err(Refusal::MappingNotAllowed {
                twin: "blue".into(),
                mapping: SelectedName,
                consumer: CONSUMER.into(),
                by: "the default of Tenant tandem-tenant-rome/rome (the admin may allow more: spec.allowedNamespaceMappingStrategies)".into(),
                allowed: vec![DefaultName],
            }),
        ),
        (
            "a selected name where selection is allowed",
            TenantFixture::new().mappings(&[DefaultName, SelectedName]),
            "blue",
            None,
            Ok(()),
        ),
        (
            "the consumer's own name, selected",
            TenantFixture::new().mappings(&[SelectedName]),
            "app",
            None,
            Ok(()),
        ),
        (
            "a selected name where only the same name is allowed",
            TenantFixture::new().mappings(&[EnforceSameName]),
            "blue",
            None,
            mapping_refused("blue", SelectedName, vec![EnforceSameName]),
        ),
        (
            "DefaultName, not in the Tenant's list",
            TenantFixture::new().mappings(&[EnforceSameName]),
            "app-rome",
            None,
            mapping_refused("app-rome", DefaultName, vec![EnforceSameName]),
        ),
        (
            "no pod limit: an unsaid strategy passes",
            TenantFixture::new(),
            "app-rome",
            None,
            Ok(()),
        ),
        (
            "an allowed pod strategy",
            TenantFixture::new().pods(&[Remote, LocalAndRemote]),
            "app-rome",
            Some(LocalAndRemote),
            Ok(()),
        ),
        (
            "the mapping is judged before the pods",
            TenantFixture::new().pods(&[Remote]),
            "blue",
            Some(Local),
            Err(Refusal::MappingNotAllowed {
                twin: "blue".into(),
                mapping: SelectedName,
                consumer: CONSUMER.into(),
                by: "the default of Tenant tandem-tenant-rome/rome (the admin may allow more: spec.allowedNamespaceMappingStrategies)".into(),
                allowed: vec![DefaultName],
            }),
        ),
        (
            "a PeeringPolicy's mapping limit is named",
            TenantFixture::new().mappings(&[DefaultName]).policy("gold"),
            "blue",
            None,
            Err(Refusal::MappingNotAllowed {
                twin: "blue".into(),
                mapping: SelectedName,
                consumer: CONSUMER.into(),
                by: "PeeringPolicy gold".into(),
                allowed: vec![DefaultName],
            }),
        ),
    ];
    for (case, tenant, twin, pods, want) in cases {
        let rn = request(twin, "app", pods);
        assert_eq!(strategies(&tenant.build(), &rn, CONSUMER), want, "{case}");
    }
}

#[test]
fn room_table() {
    let hundred: Vec<String> = (0..100).map(|i| format!("ns{i}-rome")).collect();
    let hundred: Vec<&str> = hundred.iter().map(String::as_str).collect();
    let two = TenantFixture::new().max_twins(2);
    let cases: Vec<RoomCase> = vec![
        ("the first twin", &two, vec![], None),
        ("one more below the cap", &two, vec!["a-rome"], None),
        ("at the cap", &two, vec!["a-rome", "b-rome"], Some((2, 2))),
        (
            "this twin, listed already, does not count",
            &two,
            vec!["a-rome", "c-rome"],
            None,
        ),
    ];
    let default = TenantFixture::new();
    let cases = cases.into_iter().chain([
        (
            "99 under the default",
            &default,
            hundred[..99].to_vec(),
            None,
        ),
        (
            "100 under the default",
            &default,
            hundred.clone(),
            Some((100, 100)),
        ),
    ]);
    for (case, tenant, held, want) in cases {
        let got = room(&tenant.build(), CONSUMER, "c-rome", &twins(&held));
        let want = match want {
            None => Ok(()),
            Some((held, cap)) => Err(Refusal::TooManyTwins {
                consumer: CONSUMER.into(),
                held,
                cap,
            }),
        };
        assert_eq!(got, want, "{case}");
    }
    assert_eq!(
        twins_selector(CONSUMER),
        "tandem.dev/origin-cluster-id=rome,tandem.dev/twin-namespace"
    );
}

#[test]
fn adopt_table() {
    let twin = || NsFixture::new("app-rome").twin_of(CONSUMER, "app");
    let refused = |key: Option<&str>| {
        Err(Refusal::RetainedForAnotherKey {
            twin: "app-rome".into(),
            consumer: CONSUMER.into(),
            kept_for: "sha256:aa".into(),
            key: key.map(str::to_string),
        })
    };
    // (case, twin, the Tenant's key, decision).
    let cases = [
        (
            "a twin in use: nothing to reclaim",
            twin(),
            Some("sha256:aa"),
            Ok(None),
        ),
        (
            "retained for this key",
            twin().retained(Some("sha256:aa")),
            Some("sha256:aa"),
            Ok(Some(Step::ReclaimRetained)),
        ),
        (
            "retained with no key recorded",
            twin().retained(None),
            Some("sha256:bb"),
            Ok(Some(Step::ReclaimRetained)),
        ),
        (
            "retained for another key",
            twin().retained(Some("sha256:aa")),
            Some("sha256:bb"),
            refused(Some("sha256:bb")),
        ),
        (
            "retained for a key, the Tenant records none",
            twin().retained(Some("sha256:aa")),
            None,
            refused(None),
        ),
    ];
    for (case, existing, key, want) in cases {
        let tenant = TenantFixture::new().key(key).build();
        assert_eq!(
            adopt(&existing.0, &tenant, "app-rome", CONSUMER),
            want,
            "{case}"
        );
    }
    let unrecorded = Outcome::from(refused(None).unwrap_err()).message();
    assert!(
        unrecorded.contains("this peering's key is not recorded: it is not re-adopted"),
        "{unrecorded}"
    );
}

/// Every wait once: phase Pending, its message and when it is looked at again.
#[test]
fn hold_table() {
    let twin = NsFixture::new("app-rome").twin_of(CONSUMER, "app");
    let cases: Vec<HoldCase> = vec![
        (
            "NoTenant: not peered (yet)",
            tenant_in_force(None, CONSUMER).map(drop),
            Hold::NoTenant {
                consumer: CONSUMER.into(),
            },
            "no Tenant in force for consumer rome (unpeering?)",
            None,
        ),
        (
            "NoTenant: being unpeered",
            tenant_in_force(Some(TenantFixture::new().deleting().build()), CONSUMER).map(drop),
            Hold::NoTenant {
                consumer: CONSUMER.into(),
            },
            "no Tenant in force for consumer rome (unpeering?)",
            None,
        ),
        (
            "Terminating: the twin is being deleted",
            settled(&twin.deleting().0, "app-rome"),
            Hold::Terminating {
                twin: "app-rome".into(),
            },
            "namespace app-rome is terminating",
            secs(1),
        ),
    ];
    for (case, got, want, message, retry) in cases {
        assert_eq!(got, Err(want.clone()), "{case}");
        let outcome = Outcome::from(want);
        assert_eq!(outcome.phase(), "Pending", "{case}");
        assert_eq!(outcome.message(), message, "{case}");
        assert_eq!(outcome.requeue(), retry, "{case}");
    }
    assert!(tenant_in_force(Some(TenantFixture::new().build()), CONSUMER).is_ok());
    assert!(settled(&NsFixture::new("app-rome").0, "app-rome").is_ok());
}

#[test]
fn status_is_written_only_when_it_changes() {
    let status = |phase: &str, message: Option<&str>| RemoteNamespaceStatusFields {
        phase: Some(phase.into()),
        message: message.map(str::to_string),
    };
    let terminating = Outcome::Pending(Hold::Terminating {
        twin: "app-rome".into(),
    });
    // (case, status now, outcome, patch).
    let cases = [
        (
            "Ready, new",
            None,
            Outcome::Ready,
            Some(json!({"status": {"phase": "Ready", "message": null}})),
        ),
        (
            "Ready, again",
            Some(status("Ready", None)),
            Outcome::Ready,
            None,
        ),
        (
            "Ready after a wait: the message goes",
            Some(status("Pending", Some("namespace app-rome is terminating"))),
            Outcome::Ready,
            Some(json!({"status": {"phase": "Ready", "message": null}})),
        ),
        (
            "the same wait",
            Some(status("Pending", Some("namespace app-rome is terminating"))),
            terminating.clone(),
            None,
        ),
        (
            "a wait after Ready",
            Some(status("Ready", None)),
            terminating,
            Some(
                json!({"status": {"phase": "Pending", "message": "namespace app-rome is terminating"}}),
            ),
        ),
        (
            "refused again, the same way",
            Some(status(
                "Failed",
                Some("namespace default: reserved for the system"),
            )),
            Outcome::Failed(Refusal::Reserved {
                twin: "default".into(),
                why: Reserved::System,
            }),
            None,
        ),
    ];
    for (case, current, outcome, want) in cases {
        assert_eq!(status_patch(current.as_ref(), &outcome), want, "{case}");
    }
    assert_eq!(
        Outcome::Ready.requeue(),
        secs(60),
        "a Ready twin is converged again"
    );
}

/// A step as the admin sees its request: `apply Namespace app-rome`.
fn describe(step: &Step) -> String {
    fn binding(rb: &RoleBinding) -> String {
        format!(
            "{}/{} -> {}",
            rb.metadata.namespace.as_deref().unwrap_or_default(),
            rb.metadata.name.as_deref().unwrap_or_default(),
            rb.role_ref.name
        )
    }
    match step {
        Step::ReclaimRetained => "reclaim".into(),
        Step::ApplyNamespace(ns) => format!("apply Namespace {}", ns.name_any()),
        Step::BindPeer(rb) => format!("bind {}", binding(rb)),
        Step::GrantPodAccess(rb) => format!("grant {}", binding(rb)),
        Step::RevokePodAccess(name) => format!("revoke {name}"),
        Step::ApplyQuota(q) => format!(
            "quota {}/{} {:?}",
            q.metadata.namespace.as_deref().unwrap_or_default(),
            q.name_any(),
            q.spec
                .as_ref()
                .and_then(|s| s.hard.as_ref())
                .map(|h| h
                    .iter()
                    .map(|(k, v)| format!("{k}={}", v.0))
                    .collect::<Vec<_>>())
                .unwrap_or_default()
        ),
    }
}

#[test]
fn twin_table() {
    let exec = crate::rbac::PodCapability::Exec.role_name();
    let attach = crate::rbac::PodCapability::Attach.role_name();
    let portforward = crate::rbac::PodCapability::PortForward.role_name();
    let subjects = json!([{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                           "name": "tandem:peer-key:ab12"}]);
    // (case, Tenant, the requests sent in order).
    let cases: Vec<(&str, TenantFixture, Vec<String>)> = vec![
        (
            "no podAccess: every capability granted, no storage",
            TenantFixture::new(),
            vec![
                "apply Namespace app-rome".into(),
                format!("bind app-rome/tandem:peer-twin -> {PEER_TWIN_ROLE}"),
                format!("grant app-rome/tandem:peer-exec -> {exec}"),
                format!("grant app-rome/tandem:peer-attach -> {attach}"),
                format!("grant app-rome/tandem:peer-portforward -> {portforward}"),
                "quota app-rome/tandem-grant []".into(),
            ],
        ),
        (
            "exec refused, storage granted",
            TenantFixture::new()
                .spec("podAccess", json!({"exec": false}))
                .spec(
                    "grant",
                    json!({"cpu": "2", "requests.storage": "10Gi", "persistentvolumeclaims": "5"}),
                ),
            vec![
                "apply Namespace app-rome".into(),
                format!("bind app-rome/tandem:peer-twin -> {PEER_TWIN_ROLE}"),
                "revoke tandem:peer-exec".into(),
                format!("grant app-rome/tandem:peer-attach -> {attach}"),
                format!("grant app-rome/tandem:peer-portforward -> {portforward}"),
                r#"quota app-rome/tandem-grant ["persistentvolumeclaims=5", "requests.storage=10Gi"]"#
                    .into(),
            ],
        ),
        (
            "every capability refused",
            TenantFixture::new().spec(
                "podAccess",
                json!({"exec": false, "attach": false, "portForward": false}),
            ),
            vec![
                "apply Namespace app-rome".into(),
                format!("bind app-rome/tandem:peer-twin -> {PEER_TWIN_ROLE}"),
                "revoke tandem:peer-exec".into(),
                "revoke tandem:peer-attach".into(),
                "revoke tandem:peer-portforward".into(),
                "quota app-rome/tandem-grant []".into(),
            ],
        ),
    ];
    let rn = request("app-rome", "app", Some(Remote));
    for (case, tenant, want) in cases {
        let steps = twin(&rn, CONSUMER, &tenant.build(), &subjects);
        let got: Vec<String> = steps.iter().map(describe).collect();
        assert_eq!(got, want, "{case}");
        for step in &steps {
            if let Step::BindPeer(rb) | Step::GrantPodAccess(rb) = step {
                assert_eq!(
                    serde_json::to_value(&rb.subjects).unwrap(),
                    subjects,
                    "{case}: bound to the key's group"
                );
            }
        }
    }
}

#[test]
fn the_twin_namespace_says_whose_twin_it_is_and_its_pod_security() {
    let labels = |rn: &RemoteNamespace, tenant: TenantFixture| {
        let steps = twin(rn, CONSUMER, &tenant.build(), &json!([]));
        let Step::ApplyNamespace(ns) = &steps[0] else {
            panic!("the namespace first: {steps:?}");
        };
        ns.labels().clone()
    };
    let remote = labels(
        &request("app-rome", "app", Some(Remote)),
        TenantFixture::new(),
    );
    let want: BTreeMap<String, String> = [
        (names::MANAGED_BY_LABEL, names::MANAGED_BY),
        (names::TWIN_NAMESPACE_LABEL, "true"),
        (names::ORIGIN_CLUSTER_LABEL, CONSUMER),
        (names::ORIGIN_NAMESPACE_LABEL, "app"),
        (names::POD_OFFLOADING_LABEL, "Remote"),
        (POD_SECURITY_ENFORCE_LABEL, "baseline"),
        (POD_SECURITY_ENFORCE_VERSION_LABEL, "latest"),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .into();
    assert_eq!(remote, want);
    let unsaid = labels(
        &request("app-rome", "app", None),
        TenantFixture::new().spec("podSecurity", json!("restricted")),
    );
    assert_eq!(unsaid.get(names::POD_OFFLOADING_LABEL), None);
    assert_eq!(
        unsaid[POD_SECURITY_ENFORCE_LABEL], "restricted",
        "held to the Tenant's level"
    );
}

#[test]
fn teardown_table() {
    let twin = || NsFixture::new("app-rome").twin_of(CONSUMER, "app");
    let mut delete_data = request("app-rome", "app", None);
    delete_data
        .annotations_mut()
        .insert(names::DELETE_DATA_ANNOTATION.into(), "true".into());
    let plain = request("app-rome", "app", None);
    // (case, the namespace, the request, what happens).
    let cases = [
        (
            "NotOurs: the admin's namespace of that name",
            NsFixture::new("app-rome"),
            &plain,
            Teardown::NotOurs,
        ),
        (
            "NotOurs: another consumer's twin",
            NsFixture::new("app-rome").twin_of("paris", "app"),
            &plain,
            Teardown::NotOurs,
        ),
        (
            "NotOurs: even while it is deleted",
            NsFixture::new("app-rome").deleting(),
            &delete_data,
            Teardown::NotOurs,
        ),
        (
            "AwaitTermination: deleted already",
            twin().deleting(),
            &plain,
            Teardown::AwaitTermination,
        ),
        (
            "Delete, keeping data held in claims",
            twin(),
            &plain,
            Teardown::Delete { keep_data: true },
        ),
        (
            "Delete with its data: tandem.dev/delete-data",
            twin(),
            &delete_data,
            Teardown::Delete { keep_data: false },
        ),
    ];
    for (case, existing, rn, want) in cases {
        assert_eq!(teardown(&existing.0, rn, CONSUMER), want, "{case}");
    }
}

#[test]
fn a_retained_twin_says_for_whom_and_which_claims() {
    assert_eq!(
        retained_metadata(Some("sha256:aa")),
        json!({"metadata": {
            "labels": {names::RETAINED_DATA_LABEL: "true"},
            "annotations": {names::KEY_FINGERPRINT_ANNOTATION: "sha256:aa"},
        }})
    );
    assert_eq!(
        retained_metadata(None),
        json!({"metadata": {"labels": {names::RETAINED_DATA_LABEL: "true"}}}),
        "the key recorded earlier stays"
    );
    assert_eq!(
        retained_message(CONSUMER, &["data-0".into(), "data-1".into()]),
        "kept for the data of consumer rome: PersistentVolumeClaims data-0, data-1; delete the namespace to delete them"
    );
}

#[test]
fn each_capability_has_its_own_binding_to_its_own_role() {
    for capability in PodCapability::ALL {
        let name = pod_access_binding(capability);
        let mut tenant = Tenant::new(
            "rome",
            serde_json::from_value(json!({"clusterID": "rome"})).unwrap(),
        );
        tenant.metadata.annotations = Some(
            [(
                names::KEY_FINGERPRINT_ANNOTATION.to_string(),
                "sha256:ab12".to_string(),
            )]
            .into(),
        );
        let binding = peer_binding(
            "app-rome",
            name,
            capability.role_name(),
            &crate::rbac::peer_subjects(&tenant),
        );
        assert_eq!(binding.metadata.name.as_deref(), Some(name));
        assert_eq!(binding.metadata.namespace.as_deref(), Some("app-rome"));
        assert_eq!(binding.role_ref.kind, "ClusterRole");
        assert_eq!(binding.role_ref.name, capability.role_name());
        let subjects = binding.subjects.unwrap();
        assert_eq!(subjects.len(), 1);
        assert_eq!(
            (subjects[0].kind.as_str(), subjects[0].name.as_str()),
            ("Group", "tandem:peer-key:ab12"),
            "bound to the key's group, not to the self-asserted name"
        );
    }
    let all: std::collections::BTreeSet<_> = peer_bindings().collect();
    assert_eq!(
        all.len(),
        1 + PodCapability::ALL.len(),
        "names are distinct"
    );
}
