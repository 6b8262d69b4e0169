//! Reflection decisions as an administrator sees them in the twin namespace and on the
//! consumer's pods: what each source becomes there, what a sync creates, rewrites, leaves alone
//! and deletes, which namespaces are reflected, and the Events that come back.

use super::*;

fn view() -> EndpointView {
    let p = |s: &str| s.parse().ok();
    EndpointView {
        local_pod_cidr: p("10.244.0.0/16"),
        local_pod_cidr_there: p("10.245.0.0/16"),
        remote_pod_cidr_here: p("10.246.0.0/16"),
        remote_pod_cidr: p("10.244.0.0/16"),
    }
}

#[test]
fn endpoint_slices_in_the_provider_view() {
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": "web-abc", "labels": {"kubernetes.io/service-name": "web",
            "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
        "addressType": "IPv4",
        "endpoints": [
            {"addresses": ["10.244.1.5"], "nodeName": "node-1", "conditions": {"ready": true},
             "targetRef": {"kind": "Pod", "name": "web-1", "namespace": "app"}},
            {"addresses": ["10.246.0.9"], "nodeName": "tandem-milan", "conditions": {"ready": true}},
            {"addresses": ["10.247.0.9"], "nodeName": "tandem-paris", "conditions": {"ready": true}},
        ],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }))
    .unwrap();
    let got = desired_endpoint_slice(&slice, &view(), "tandem-milan").unwrap();
    assert_eq!(
        got["endpoints"],
        json!([
            {"addresses": ["10.245.1.5"], "conditions": {"ready": true}},
            {"addresses": ["10.244.0.9"], "conditions": {"ready": true}},
        ]),
        "node names and target refs dropped, other providers' pods dropped"
    );
    assert_eq!(
        got["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"],
        SLICE_MANAGER
    );
    assert_eq!(got["ports"][0]["port"], 8080);
    let mut fqdn = slice.clone();
    fqdn.address_type = "FQDN".into();
    assert!(desired_endpoint_slice(&fqdn, &view(), "tandem-milan").is_none());
}

#[test]
fn services_lose_cluster_ips_node_ports_and_selectors() {
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "web", "annotations": {
            "kubectl.kubernetes.io/last-applied-configuration": "{}", "team": "shop"}},
        "spec": {"type": "NodePort", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
                 "selector": {"app": "web"},
                 "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080, "protocol": "TCP"}]},
    }))
    .unwrap();
    let got = desired_service(&svc).unwrap();
    assert_eq!(
        got["spec"],
        json!({"type": "ClusterIP", "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]})
    );
    assert_eq!(got["metadata"]["annotations"], json!({"team": "shop"}));
}

#[test]
fn skipped_sources() {
    let root: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "kube-root-ca.crt"}})).unwrap();
    assert!(desired_config_map(&root).is_none());
    let token: Secret = serde_json::from_value(json!({"metadata": {"name": "t"},
        "type": "kubernetes.io/service-account-token"}))
    .unwrap();
    assert!(desired_secret(&token).is_none());
    assert_eq!(source_version("42", ""), "42");
    assert_ne!(source_version("42", "a"), source_version("42", "b"));
}

// What a sync sends into the twin namespace, as an administrator sees it there
// (`kubectl get cm -n <twin>`): created, rewritten, left alone, deleted.

/// A ConfigMap: a source in the consumer's namespace, or an object in the twin namespace.
struct ConfigMapFixture(ConfigMap);

impl ConfigMapFixture {
    /// A source at resourceVersion `version`, labelled `app: web`, with one key.
    fn source(name: &str, version: &str) -> Self {
        ConfigMapFixture(ConfigMap {
            metadata: kube::core::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("app".into()),
                resource_version: Some(version.into()),
                labels: Some([("app".to_string(), "web".to_string())].into()),
                ..Default::default()
            },
            data: Some([("k".to_string(), "v".to_string())].into()),
            ..Default::default()
        })
    }
    /// An object of the twin namespace Tandem did not create.
    fn foreign(name: &str) -> Self {
        ConfigMapFixture(ConfigMap {
            metadata: kube::core::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("app-rome".into()),
                ..Default::default()
            },
            ..Default::default()
        })
    }
    /// A reflection made from source version `version` (None: its annotation was removed).
    fn reflected(name: &str, version: Option<&str>) -> Self {
        let mut cm = Self::foreign(name).label(names::REFLECTED_LABEL, "configmap");
        if let Some(v) = version {
            cm.0.metadata.annotations =
                Some([(SOURCE_VERSION_ANNOTATION.to_string(), v.to_string())].into());
        }
        cm
    }
    fn label(mut self, key: &str, value: &str) -> Self {
        self.0
            .metadata
            .labels
            .get_or_insert_default()
            .insert(key.into(), value.into());
        self
    }
}

/// (case, objects in the twin namespace, sources, context, rewrite, what the sync sends).
type SyncCase<'a> = (
    &'a str,
    Vec<ConfigMapFixture>,
    Vec<ConfigMapFixture>,
    &'a str,
    bool,
    Vec<Result<Step, Skip>>,
);

/// What one ConfigMap sync sends: a step or skip per source, then the deletions.
fn sync(
    existing: Vec<ConfigMapFixture>,
    sources: Vec<ConfigMapFixture>,
    context: &str,
    rewrite: bool,
) -> Vec<Result<Step, Skip>> {
    let existing: Vec<ConfigMap> = existing.into_iter().map(|c| c.0).collect();
    let mut reflections = Reflections::new(Kind::ConfigMap, &existing, rewrite);
    let mut sent: Vec<Result<Step, Skip>> = sources
        .iter()
        .map(|s| reflections.write(&s.0, desired_config_map(&s.0), context))
        .collect();
    sent.extend(reflections.deletions().map(Ok));
    sent
}

/// The reflection of source `name` (as [`ConfigMapFixture::source`] makes it) applied, made
/// from `version`.
fn applied(name: &str, version: &str) -> Result<Step, Skip> {
    Ok(Step::Apply {
        name: name.into(),
        object: json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name,
                "labels": {"app": "web", names::REFLECTED_LABEL: "configmap",
                           names::MANAGED_BY_LABEL: names::MANAGED_BY},
                "annotations": {SOURCE_VERSION_ANNOTATION: version}},
            "data": {"k": "v"},
        }),
    })
}

#[test]
fn sync_table() {
    use ConfigMapFixture as Cm;
    let in_view_b = source_version("42", "view-b");
    let deleted = |name: &str| Ok(Step::Delete { name: name.into() });
    let cases: Vec<SyncCase> = vec![
        (
            "missing there: Step::Apply",
            vec![],
            vec![Cm::source("web", "42")],
            "",
            false,
            vec![applied("web", "42")],
        ),
        (
            "made from an older version: Step::Apply",
            vec![Cm::reflected("web", Some("41"))],
            vec![Cm::source("web", "42")],
            "",
            false,
            vec![applied("web", "42")],
        ),
        (
            "made from this version: Skip::UpToDate",
            vec![Cm::reflected("web", Some("42"))],
            vec![Cm::source("web", "42")],
            "",
            false,
            vec![Err(Skip::UpToDate)],
        ),
        (
            "made from this version, a periodic rewrite: Step::Apply",
            vec![Cm::reflected("web", Some("42"))],
            vec![Cm::source("web", "42")],
            "",
            true,
            vec![applied("web", "42")],
        ),
        (
            "its version annotation removed there: Step::Apply",
            vec![Cm::reflected("web", None)],
            vec![Cm::source("web", "42")],
            "",
            false,
            vec![applied("web", "42")],
        ),
        (
            "the context (address view) changed: Step::Apply",
            vec![Cm::reflected("web", Some("42"))],
            vec![Cm::source("web", "42")],
            "view-b",
            false,
            vec![applied("web", &in_view_b)],
        ),
        (
            "same version, same context: Skip::UpToDate",
            vec![Cm::reflected("web", Some(&in_view_b))],
            vec![Cm::source("web", "42")],
            "view-b",
            false,
            vec![Err(Skip::UpToDate)],
        ),
        (
            "an object of that name not created by Tandem: Skip::NotOurs, not deleted",
            vec![Cm::foreign("web")],
            vec![Cm::source("web", "42")],
            "",
            true,
            vec![Err(Skip::NotOurs { name: "web".into() })],
        ),
        (
            "reflected as another kind: Skip::NotOurs",
            vec![Cm::reflected("web", Some("42")).label(names::REFLECTED_LABEL, "secret")],
            vec![Cm::source("web", "42")],
            "",
            false,
            vec![Err(Skip::NotOurs { name: "web".into() })],
        ),
        (
            "the root CA bundle: Skip::NotReflected",
            vec![],
            vec![Cm::source("kube-root-ca.crt", "7")],
            "",
            false,
            vec![Err(Skip::NotReflected)],
        ),
        (
            "its source gone: Step::Delete",
            vec![Cm::reflected("old", Some("3"))],
            vec![],
            "",
            false,
            vec![deleted("old")],
        ),
        (
            "its source no longer reflected: Skip::NotReflected, then Step::Delete",
            vec![Cm::reflected("kube-root-ca.crt", Some("7"))],
            vec![Cm::source("kube-root-ca.crt", "7")],
            "",
            false,
            vec![Err(Skip::NotReflected), deleted("kube-root-ca.crt")],
        ),
        (
            "an object Tandem did not create, no source: left alone",
            vec![Cm::foreign("theirs")],
            vec![],
            "",
            false,
            vec![],
        ),
        (
            "several: writes in source order, then deletions",
            vec![
                Cm::reflected("a", Some("1")),
                Cm::reflected("gone", Some("1")),
                Cm::foreign("theirs"),
                Cm::reflected("web", Some("41")),
            ],
            vec![Cm::source("web", "42"), Cm::source("a", "1")],
            "",
            false,
            vec![applied("web", "42"), Err(Skip::UpToDate), deleted("gone")],
        ),
    ];
    for (case, existing, sources, context, rewrite, want) in cases {
        assert_eq!(sync(existing, sources, context, rewrite), want, "{case}");
    }
}

#[test]
fn twin_for_table() {
    use tandem_api::{NamespaceOffloadingStatus, RemoteNamespaceStatus};
    let nso = |name: &str, deleting: bool, twins: &[(&str, &str)]| {
        let mut o = NamespaceOffloading::new(name, Default::default());
        o.metadata.namespace = Some("app".into());
        if deleting {
            o.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ));
        }
        o.status = Some(NamespaceOffloadingStatus {
            remote_namespaces: twins
                .iter()
                .map(|(provider, phase)| RemoteNamespaceStatus {
                    cluster_id: provider.to_string(),
                    namespace: "app-rome".into(),
                    phase: phase.to_string(),
                    message: None,
                })
                .collect(),
            ..Default::default()
        });
        o
    };
    let reflected = Some(("app".to_string(), "app-rome".to_string()));
    let cases = [
        (
            "Ready on this provider",
            nso(
                "offloading",
                false,
                &[("turin", "Pending"), ("milan", "Ready")],
            ),
            reflected,
        ),
        (
            "Pending on this provider",
            nso("offloading", false, &[("milan", "Pending")]),
            None,
        ),
        (
            "Ready on another provider only",
            nso("offloading", false, &[("turin", "Ready")]),
            None,
        ),
        (
            "being deleted",
            nso("offloading", true, &[("milan", "Ready")]),
            None,
        ),
        (
            "not the namespace's offloading",
            nso("mine", false, &[("milan", "Ready")]),
            None,
        ),
    ];
    for (case, o, want) in cases {
        assert_eq!(twin_for(&o, "milan"), want, "{case}");
    }
}

#[test]
fn endpoint_view_table() {
    let net = |s: &str| -> IpNet { s.parse().unwrap() };
    let local = Some(net("10.244.0.0/16"));
    let network = |there: Option<&str>| NetworkView {
        remote_pod_cidr: net("10.244.0.0/16"),
        remote_pod_cidr_here: net("10.246.0.0/16"),
        local_pod_cidr: local,
        local_pod_cidr_there: there.map(net),
    };
    let remapped = network(Some("10.245.0.0/16"));
    let unremapped = network(None);
    let cases = [
        (
            "no negotiated network: local addresses pass unchanged",
            None,
            (local, local, None, None),
        ),
        (
            "a remapped local CIDR",
            Some(&remapped),
            (
                local,
                Some(net("10.245.0.0/16")),
                Some(net("10.246.0.0/16")),
                Some(net("10.244.0.0/16")),
            ),
        ),
        (
            "the local CIDR not remapped there",
            Some(&unremapped),
            (
                local,
                local,
                Some(net("10.246.0.0/16")),
                Some(net("10.244.0.0/16")),
            ),
        ),
    ];
    for (case, network, (here, there, remote_here, remote)) in cases {
        assert_eq!(
            endpoint_view(local, network),
            EndpointView {
                local_pod_cidr: here,
                local_pod_cidr_there: there,
                remote_pod_cidr_here: remote_here,
                remote_pod_cidr: remote,
            },
            "{case}"
        );
    }
}

#[test]
fn provider_refusals_are_told_apart() {
    let status = |code: u16, message: &str| kube::core::Status {
        code,
        message: message.into(),
        ..Default::default()
    };
    let refused = status(
        403,
        "admission webhook \"peer-writes.tandem.dev\" denied the request: ExternalName",
    );
    let cases = [
        ("the peer-writes webhook refuses", &refused, true),
        ("another 403", &status(403, "forbidden: RBAC"), false),
        (
            "the webhook's name, not a refusal",
            &status(422, "\"peer-writes.tandem.dev\""),
            false,
        ),
    ];
    for (case, e, want) in cases {
        assert_eq!(refused_by_provider(e), want, "{case}");
    }
    assert_eq!(
        refusal_message(&refused),
        "not reflected to the provider, which refuses it: admission webhook \
         \"peer-writes.tandem.dev\" denied the request: ExternalName"
    );
}

fn provider_event(involved: Value, source: Value) -> CoreEvent {
    serde_json::from_value(json!({
        "metadata": {"name": "web-1.17f", "namespace": "app-rome"},
        "involvedObject": involved,
        "reason": "Pulled", "message": "Successfully pulled image", "type": "Normal",
        "count": 2, "source": source, "reportingComponent": "kubelet",
    }))
    .unwrap()
}

#[test]
fn provider_pod_events_come_back_onto_the_consumers_pod() {
    let pod = json!({"kind": "Pod", "name": "web-1", "namespace": "app-rome", "uid": "p-uid",
                     "fieldPath": "spec.containers{web}"});
    let e = provider_event(
        pod.clone(),
        json!({"component": "kubelet", "host": "node-7"}),
    );
    let to = EventTarget {
        namespace: "app",
        name: "web-1.17f",
        pod_name: "web-1",
        uid: "c-uid",
        provider: "milan",
        virtual_node: "tandem-milan",
    };
    assert_eq!(
        reflected_event(&e, &to),
        json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": "web-1.17f", "namespace": "app", "labels": {
                names::MANAGED_BY_LABEL: names::MANAGED_BY, names::REFLECTED_LABEL: "event",
                names::REMOTE_CLUSTER_LABEL: "milan"}},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": "web-1",
                               "namespace": "app", "uid": "c-uid",
                               "fieldPath": "spec.containers{web}"},
            "reason": "Pulled", "message": "Successfully pulled image", "type": "Normal",
            "count": 2, "reportingComponent": "kubelet", "reportingInstance": "milan",
            "source": {"component": "kubelet@milan", "host": "tandem-milan"},
        }),
        "the provider's node and pod UID replaced, nulls dropped"
    );
    let anonymous = provider_event(pod, Value::Null);
    assert_eq!(
        reflected_event(&anonymous, &to)["source"]["component"],
        "tandem@milan"
    );
    let cases = [
        (
            "a pod's",
            json!({"kind": "Pod", "name": "web-1"}),
            Some("web-1"),
        ),
        ("a node's", json!({"kind": "Node", "name": "node-7"}), None),
        ("a pod's, unnamed", json!({"kind": "Pod"}), None),
    ];
    for (case, involved, want) in cases {
        assert_eq!(
            event_pod(&provider_event(involved, Value::Null)),
            want,
            "{case}"
        );
    }
}
