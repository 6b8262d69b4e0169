//! The offloading decisions as an administrator sees them: what `kubectl get nso -o yaml`
//! says (phase, twin namespaces, the Ready condition), which providers get a twin namespace,
//! what is sent for each RemoteNamespace, and the `DataRetained` Event on unoffloading.

use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tandem_api::NamespaceOffloadingStatus;

const CONSUMER: &str = "rome";

/// (case, offloading, labels its provider suggests for the virtual node, decision).
type SelectionCase<'a> = (
    &'a str,
    OffloadingFixture,
    &'a BTreeMap<String, String>,
    Result<(), Unselected>,
);
/// (case, unoffloaded with `--delete-data`, claims in the twin, the claims logged and the
/// Event's message, or why nothing is said).
type DataCase<'a> = (
    &'a str,
    bool,
    &'a [String],
    Result<(&'a str, &'a str), NoReport>,
);

/// A NamespaceOffloading in namespace `app`, as `tandem offload` makes it.
struct OffloadingFixture(NamespaceOffloading);

impl OffloadingFixture {
    fn new() -> Self {
        let mut o = NamespaceOffloading::new(names::OFFLOADING_NAME, Default::default());
        o.metadata.namespace = Some("app".into());
        OffloadingFixture(o)
    }
    fn named(mut self, name: &str) -> Self {
        self.0.metadata.name = Some(name.into());
        self
    }
    fn pods(mut self, strategy: PodOffloadingStrategy) -> Self {
        self.0.spec.pod_offloading_strategy = strategy;
        self
    }
    fn mapping(mut self, mapping: NamespaceMappingStrategy, name: Option<&str>) -> Self {
        self.0.spec.namespace_mapping_strategy = mapping;
        self.0.spec.remote_namespace_name = name.map(String::from);
        self
    }
    /// `spec.clusterSelector.nodeSelectorTerms`.
    fn selector(mut self, terms: Value) -> Self {
        self.0.spec.cluster_selector =
            Some(serde_json::from_value(json!({"nodeSelectorTerms": terms})).unwrap());
        self
    }
    /// A status of `phase` listing `twins` (provider, namespace, phase).
    fn status(mut self, phase: &str, twins: &[(&str, &str, &str)]) -> Self {
        self.0.status = Some(NamespaceOffloadingStatus {
            phase: Some(phase.into()),
            remote_namespaces: twins
                .iter()
                .map(|(provider, ns, phase)| entry(provider, ns, phase, None))
                .collect(),
            conditions: Vec::new(),
        });
        self
    }
}

fn entry(provider: &str, ns: &str, phase: &str, message: Option<&str>) -> RemoteNamespaceStatus {
    RemoteNamespaceStatus {
        cluster_id: provider.into(),
        namespace: ns.into(),
        phase: phase.into(),
        message: message.map(String::from),
    }
}

/// A RemoteNamespace on the provider asking for twin namespace `twin` of namespace `app`.
struct TwinFixture(RemoteNamespace);

impl TwinFixture {
    fn asking_for(twin: &str) -> Self {
        TwinFixture(desired_twin(
            "app",
            twin,
            PodOffloadingStrategy::LocalAndRemote,
        ))
    }
    fn deleting(mut self) -> Self {
        self.0.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        self
    }
    fn data_deletion_annotated(mut self) -> Self {
        self.0
            .annotations_mut()
            .insert(names::DELETE_DATA_ANNOTATION.into(), "true".into());
        self
    }
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// What reconciling decides before any provider is asked, in the order it decides it: the
/// twin namespace's name, or the refusal.
fn checked(o: &NamespaceOffloading) -> Result<String, Refusal> {
    heeded(o)?;
    usable_selector(&selector_terms(o))?;
    twin_name(o, "app", CONSUMER)
}

#[test]
fn refusal_table() {
    let empty_in =
        json!([{"matchExpressions": [{"key": "region", "operator": "In", "values": []}]}]);
    let cases: Vec<(&str, OffloadingFixture, Result<&str, Refusal>)> = vec![
        (
            "DefaultName: <namespace>-<consumer>",
            OffloadingFixture::new(),
            Ok("app-rome"),
        ),
        (
            "EnforceSameName",
            OffloadingFixture::new().mapping(NamespaceMappingStrategy::EnforceSameName, None),
            Ok("app"),
        ),
        (
            "SelectedName",
            OffloadingFixture::new().mapping(NamespaceMappingStrategy::SelectedName, Some("shop")),
            Ok("shop"),
        ),
        (
            "a valid selector",
            OffloadingFixture::new().selector(
                json!([{"matchExpressions": [{"key": "region", "operator": "In", "values": ["eu"]}]}]),
            ),
            Ok("app-rome"),
        ),
        (
            "named otherwise: Refusal::WrongName (before anything else)",
            OffloadingFixture::new()
                .named("mine")
                .selector(empty_in.clone()),
            Err(Refusal::WrongName),
        ),
        (
            "In with no values: Refusal::InvalidClusterSelector",
            OffloadingFixture::new().selector(empty_in.clone()),
            Err(Refusal::InvalidClusterSelector(
                "spec.clusterSelector.nodeSelectorTerms[0].matchExpressions[0].values: Required \
                 value: must be specified when `operator` is 'In' or 'NotIn'"
                    .into(),
            )),
        ),
        (
            "an invalid selector and no selected name: the selector is reported",
            OffloadingFixture::new()
                .mapping(NamespaceMappingStrategy::SelectedName, None)
                .selector(empty_in),
            Err(Refusal::InvalidClusterSelector(
                "spec.clusterSelector.nodeSelectorTerms[0].matchExpressions[0].values: Required \
                 value: must be specified when `operator` is 'In' or 'NotIn'"
                    .into(),
            )),
        ),
        (
            "SelectedName without a name: Refusal::InvalidName",
            OffloadingFixture::new().mapping(NamespaceMappingStrategy::SelectedName, None),
            Err(Refusal::InvalidName(
                "namespace mapping SelectedName needs spec.remoteNamespaceName".into(),
            )),
        ),
        (
            "a selected name that is no DNS label: Refusal::InvalidName",
            OffloadingFixture::new()
                .mapping(NamespaceMappingStrategy::SelectedName, Some("Shop_1")),
            Err(Refusal::InvalidName(
                "twin namespace name \"Shop_1\" is not a DNS-1123 label (lower-case letters, \
                 digits, '-', at most 63 characters)"
                    .into(),
            )),
        ),
    ];
    for (case, o, want) in cases {
        assert_eq!(checked(&o.0), want.map(String::from), "{case}");
    }
}

#[test]
fn refusal_status_table() {
    let listed = OffloadingFixture::new().status("Ready", &[("milan", "app-rome", "Ready")]);
    let cases = [
        (
            "Refusal::WrongName: Ignored, no twin listed",
            Refusal::WrongName,
            Status {
                phase: "Ignored",
                remote_namespaces: Vec::new(),
                reason: "WrongName",
                message: "ignored: only the NamespaceOffloading named \"offloading\" offloads a \
                          namespace"
                    .into(),
            },
        ),
        (
            "Refusal::InvalidClusterSelector: Failed, the twins listed stay",
            Refusal::InvalidClusterSelector("spec.clusterSelector: bad".into()),
            Status {
                phase: "Failed",
                remote_namespaces: vec![entry("milan", "app-rome", "Ready", None)],
                reason: "InvalidClusterSelector",
                message: "spec.clusterSelector: bad".into(),
            },
        ),
        (
            "Refusal::InvalidName: Failed, no twin listed",
            Refusal::InvalidName("no name".into()),
            Status {
                phase: "Failed",
                remote_namespaces: Vec::new(),
                reason: "InvalidName",
                message: "no name".into(),
            },
        ),
    ];
    for (case, refusal, want) in cases {
        assert_eq!(refusal.status(&listed.0), want, "{case}");
    }
}

#[test]
fn selection_table() {
    use PodOffloadingStrategy::{Local, LocalAndRemote, Remote};
    let eu = labels(&[("region", "eu")]);
    let us = labels(&[("region", "us")]);
    let none = BTreeMap::new();
    let marked_real = labels(&[(names::NODE_TYPE_LABEL, "real")]);
    let region_eu =
        json!([{"matchExpressions": [{"key": "region", "operator": "In", "values": ["eu"]}]}]);
    let cases: Vec<SelectionCase> = vec![
        (
            "no selector: every provider",
            OffloadingFixture::new(),
            &none,
            Ok(()),
        ),
        (
            "Remote, the selector matches its labels",
            OffloadingFixture::new()
                .pods(Remote)
                .selector(region_eu.clone()),
            &eu,
            Ok(()),
        ),
        (
            "a selector on the provider's cluster ID",
            OffloadingFixture::new().selector(json!([{"matchExpressions": [
                {"key": names::REMOTE_CLUSTER_LABEL, "operator": "In", "values": ["milan"]}]}])),
            &none,
            Ok(()),
        ),
        (
            "Local: Unselected::LocalOnly, even when the selector matches",
            OffloadingFixture::new()
                .pods(Local)
                .selector(region_eu.clone()),
            &eu,
            Err(Unselected::LocalOnly),
        ),
        (
            "another region: Unselected::NotMatched",
            OffloadingFixture::new()
                .pods(LocalAndRemote)
                .selector(region_eu),
            &us,
            Err(Unselected::NotMatched),
        ),
        (
            "a provider cannot suggest away its virtual-node mark: Unselected::NotMatched",
            OffloadingFixture::new().selector(json!([{"matchExpressions": [
                {"key": names::NODE_TYPE_LABEL, "operator": "In", "values": ["real"]}]}])),
            &marked_real,
            Err(Unselected::NotMatched),
        ),
    ];
    for (case, o, suggested, want) in cases {
        let terms = selector_terms(&o.0);
        assert_eq!(selection(&o.0, &terms, "milan", suggested), want, "{case}");
    }
}

#[test]
fn twin_step_table() {
    let pending = |m: &str| Some(("Pending".to_string(), Some(m.to_string())));
    let cases: Vec<(&str, Option<TwinFixture>, Step, Option<Answer>)> = vec![
        ("none yet: Step::RequestTwin", None, Step::RequestTwin, None),
        (
            "asking for the twin already: Step::RequestTwin (applied again)",
            Some(TwinFixture::asking_for("app-rome")),
            Step::RequestTwin,
            None,
        ),
        (
            "asking for another twin: Step::DeletePrevious",
            Some(TwinFixture::asking_for("old")),
            Step::DeletePrevious {
                previous: "old".into(),
            },
            pending("removing previous twin namespace old"),
        ),
        (
            "being deleted: Step::AwaitTerminating",
            Some(TwinFixture::asking_for("app-rome").deleting()),
            Step::AwaitTerminating,
            pending("previous twin namespace terminating"),
        ),
        (
            "another twin, being deleted: Step::AwaitTerminating (nothing deleted twice)",
            Some(TwinFixture::asking_for("old").deleting()),
            Step::AwaitTerminating,
            pending("previous twin namespace terminating"),
        ),
    ];
    for (case, existing, want, answer) in cases {
        let step = twin_step(existing.as_ref().map(|t| &t.0), "app-rome");
        assert_eq!(step, want, "{case}");
        assert_eq!(step.answer(), answer, "{case}");
    }
}

#[test]
fn the_twin_request_and_the_providers_answers() {
    let rn = desired_twin("app", "app-rome", PodOffloadingStrategy::Remote);
    assert_eq!(rn.name_any(), "app");
    assert_eq!(
        rn.spec,
        RemoteNamespaceSpec {
            namespace: "app-rome".into(),
            origin_namespace: "app".into(),
            pod_offloading_strategy: Some(PodOffloadingStrategy::Remote),
        }
    );
    assert_eq!(
        rn.labels(),
        &labels(&[
            (names::MANAGED_BY_LABEL, names::MANAGED_BY),
            (names::ORIGIN_NAMESPACE_LABEL, "app"),
        ])
    );
    let cases = [
        ("no status yet: Pending", None, ("Pending", None)),
        (
            "the provider's phase and message",
            Some(RemoteNamespaceStatusFields {
                phase: Some("Failed".into()),
                message: Some("quota".into()),
            }),
            ("Failed", Some("quota")),
        ),
    ];
    for (case, status, (phase, message)) in cases {
        assert_eq!(
            applied_answer(status),
            (phase.to_string(), message.map(String::from)),
            "{case}"
        );
    }
    assert_eq!(
        failed_answer("403 Forbidden"),
        (
            "Pending".to_string(),
            Some("requesting the twin namespace: 403 Forbidden".to_string())
        )
    );
}

#[test]
fn removal_table() {
    let remove = |annotate, delete| Removal::Remove { annotate, delete };
    let cases: Vec<(&str, Option<TwinFixture>, bool, Removal)> = vec![
        ("none left: Removal::Gone", None, true, Removal::Gone),
        (
            "there, data kept: Removal::Remove, deleted only",
            Some(TwinFixture::asking_for("app-rome")),
            false,
            remove(false, true),
        ),
        (
            "there, data deleted: Removal::Remove, annotated then deleted",
            Some(TwinFixture::asking_for("app-rome")),
            true,
            remove(true, true),
        ),
        (
            "annotated already: Removal::Remove, deleted only",
            Some(TwinFixture::asking_for("app-rome").data_deletion_annotated()),
            true,
            remove(false, true),
        ),
        (
            "being deleted, data deleted: Removal::Remove, annotated only",
            Some(TwinFixture::asking_for("app-rome").deleting()),
            true,
            remove(true, false),
        ),
        (
            "being deleted, data kept: Removal::Remove, nothing sent",
            Some(TwinFixture::asking_for("app-rome").deleting()),
            false,
            remove(false, false),
        ),
    ];
    for (case, existing, delete_data, want) in cases {
        assert_eq!(
            removal(existing.as_ref().map(|t| &t.0), delete_data),
            want,
            "{case}"
        );
    }
}

#[test]
fn converged_status_table() {
    let cases = [
        (
            "no provider selected: Ready",
            vec![],
            (
                "Ready",
                "Offloaded",
                "twin namespace ready on 0 provider(s)",
            ),
            30,
        ),
        (
            "every twin Ready",
            vec![
                entry("milan", "app-rome", "Ready", None),
                entry("turin", "app-rome", "Ready", None),
            ],
            (
                "Ready",
                "Offloaded",
                "twin namespace ready on 2 provider(s)",
            ),
            30,
        ),
        (
            "one terminating: Pending, naming it",
            vec![
                entry(
                    "milan",
                    "app-rome",
                    "Pending",
                    Some("previous twin namespace terminating"),
                ),
                entry("turin", "app-rome", "Ready", None),
            ],
            (
                "Pending",
                "TwinNamespacesNotReady",
                "milan (Pending: previous twin namespace terminating)",
            ),
            1,
        ),
        (
            "one failed: Failed, naming each not Ready",
            vec![
                entry("milan", "app-rome", "Failed", Some("quota")),
                entry("turin", "app-rome", "Pending", None),
            ],
            (
                "Failed",
                "TwinNamespacesNotReady",
                "milan (Failed: quota); turin (Pending)",
            ),
            1,
        ),
    ];
    for (case, entries, (phase, reason, message), requeue) in cases {
        let got = converged(entries.clone());
        assert_eq!(
            got,
            Status {
                phase,
                remote_namespaces: entries,
                reason,
                message: message.into(),
            },
            "{case}"
        );
        assert_eq!(got.requeue(), Duration::from_secs(requeue), "{case}");
    }
}

#[test]
fn terminating_table() {
    let says = |twins: Vec<RemoteNamespaceStatus>| {
        Some(Status {
            phase: "Terminating",
            remote_namespaces: twins,
            reason: "Unoffloading",
            message: "removing twin namespaces".into(),
        })
    };
    let cases = [
        ("no status yet", OffloadingFixture::new(), says(vec![])),
        (
            "Ready: Terminating, the twins listed stay",
            OffloadingFixture::new().status("Ready", &[("milan", "app-rome", "Ready")]),
            says(vec![entry("milan", "app-rome", "Ready", None)]),
        ),
        (
            "Terminating already: not written again",
            OffloadingFixture::new().status("Terminating", &[("milan", "app-rome", "Ready")]),
            None,
        ),
    ];
    for (case, o, want) in cases {
        assert_eq!(terminating(&o.0), want, "{case}");
    }
    let o = OffloadingFixture::new().status("Ready", &[("milan", "shop", "Pending")]);
    assert_eq!(known_twin(&o.0, "milan"), Some("shop"));
    assert_eq!(known_twin(&o.0, "turin"), None);
    assert_eq!(known_twin(&OffloadingFixture::new().0, "milan"), None);
}

#[test]
fn data_retained_table() {
    let claims = ["data-0".to_string(), "data-1".to_string()];
    let cases: Vec<DataCase> = vec![
        (
            "unoffloaded with --delete-data: NoReport::DeletedWithTwin",
            true,
            &claims,
            Err(NoReport::DeletedWithTwin),
        ),
        (
            "no claims: NoReport::NoClaims",
            false,
            &[],
            Err(NoReport::NoClaims),
        ),
        (
            "claims kept: a DataRetained Event naming each",
            false,
            &claims,
            Ok((
                "data-0,data-1",
                "retained on provider milan in namespace app-rome: PersistentVolumeClaims \
                 data-0, data-1 (unoffload with --delete-data, or delete the claims here, to \
                 delete them)",
            )),
        ),
    ];
    for (case, delete_data, claims, want) in cases {
        let got = lists_claims(delete_data)
            .and_then(|()| data_retained("app", "milan", "app-rome", claims));
        match want {
            Err(skip) => assert_eq!(got, Err(skip), "{case}"),
            Ok((logged, message)) => {
                let got = got.expect(case);
                assert_eq!(got.name, "app.tandem-dataretained-milan", "{case}");
                assert_eq!(got.claims, logged, "{case}");
                assert_eq!(
                    got.event,
                    json!({
                        "apiVersion": "v1", "kind": "Event",
                        "metadata": {"name": "app.tandem-dataretained-milan", "namespace": "app",
                                     "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY}},
                        "involvedObject": {"apiVersion": "v1", "kind": "Namespace", "name": "app"},
                        "reason": "DataRetained", "message": message, "type": "Warning",
                        "source": {"component": names::CONTROLLER_NAME},
                    }),
                    "{case}"
                );
            }
        }
    }
}
