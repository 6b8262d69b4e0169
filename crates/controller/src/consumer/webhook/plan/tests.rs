//! The webhook's decisions as an administrator sees them: what a pod or DaemonSet looks like
//! after `kubectl apply` (the patch the webhook answers) and what `kubectl` prints when a pod is
//! refused; the configuration and its certificate are in `rotation`.

use super::*;
use tandem_api::PodOffloadingStrategy::{Local, LocalAndRemote, Remote};

const NAMESPACE: &str = "app";

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

// ---- Fixtures ----

/// A NamespaceOffloading in namespace `app`, as `tandem offload` makes it.
struct OffloadingFixture(NamespaceOffloading);

impl OffloadingFixture {
    fn new(strategy: PodOffloadingStrategy) -> Self {
        let mut o = NamespaceOffloading::new(names::OFFLOADING_NAME, Default::default());
        o.metadata.namespace = Some(NAMESPACE.into());
        o.spec.pod_offloading_strategy = strategy;
        OffloadingFixture(o)
    }
    /// `spec.clusterSelector.nodeSelectorTerms`.
    fn selector(mut self, terms: Value) -> Self {
        self.0.spec.cluster_selector =
            Some(serde_json::from_value(json!({"nodeSelectorTerms": terms})).unwrap());
        self
    }
    fn evict_after(mut self, after: &str) -> Self {
        self.0.spec.evict_after = Some(after.into());
        self
    }
    /// `partitionPolicy: Fence` (with the default `fenceAfter`).
    fn fenced(mut self) -> Self {
        self.0.spec.partition_policy = tandem_api::PartitionPolicy::Fence;
        self
    }
    fn deleting(mut self) -> Self {
        self.0.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
        );
        self
    }
}

/// A pod in an AdmissionReview's `object`: one container, nothing else.
struct PodFixture(Value);

impl PodFixture {
    fn new() -> Self {
        PodFixture(json!({"metadata": {"name": "web"},
            "spec": {"containers": [{"name": "c", "image": "pause"}]}}))
    }
    fn tolerating_virtual_nodes(mut self) -> Self {
        self.0["spec"]["tolerations"] = json!([
            {"key": names::VIRTUAL_NODE_TAINT, "operator": "Exists", "effect": "NoExecute"}]);
        self
    }
    fn claim(self, volume: &str, claim: &str) -> Self {
        self.volume(json!({"name": volume, "persistentVolumeClaim": {"claimName": claim}}))
    }
    fn ephemeral(self, volume: &str) -> Self {
        self.volume(json!({"name": volume, "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}))
    }
    fn annotated(mut self, key: &str, value: &str) -> Self {
        self.0["metadata"]["annotations"] = json!({key: value});
        self
    }
    fn volume(mut self, volume: Value) -> Self {
        match self.0["spec"]["volumes"].as_array_mut() {
            Some(list) => list.push(volume),
            None => self.0["spec"]["volumes"] = json!([volume]),
        }
        self
    }
    /// The AdmissionReview of its creation in `namespace` (None: a review without one).
    fn review(&self, kind: &str, namespace: Option<&str>) -> Vec<u8> {
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "r-1", "namespace": namespace, "operation": "CREATE",
                "kind": {"group": "", "version": "v1", "kind": kind}, "object": self.0}})
        .to_string()
        .into_bytes()
    }
}

fn decoded(body: &[u8]) -> ReviewRequest {
    serde_json::from_slice::<Review>(body)
        .unwrap_or_default()
        .request
}

/// A DaemonSet whose pods tolerate every taint (so would land on virtual nodes), under review.
fn daemonset_review(annotations: Value) -> Vec<u8> {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "r-1", "namespace": "kube-system", "operation": "CREATE",
            "kind": {"group": "apps", "version": "v1", "kind": "DaemonSet"},
            "object": {"apiVersion": "apps/v1", "kind": "DaemonSet",
                "metadata": {"name": "agent", "annotations": annotations},
                "spec": {"selector": {"matchLabels": {"app": "agent"}},
                    "template": {"metadata": {"labels": {"app": "agent"}},
                        "spec": {"containers": [{"name": "a", "image": "x"}],
                                 "tolerations": [{"operator": "Exists"}]}}}}}})
    .to_string()
    .into_bytes()
}

/// The operations and paths of an admission's patch, as `kubectl` would apply them.
fn patched(admission: &Admission) -> Vec<(String, String)> {
    let patch = match admission {
        Admission::KeptLocal(p) | Admission::Placed { patch: p, .. } | Admission::DaemonSet(p) => p,
        Admission::Unchanged(_) | Admission::Refused(_) => return Vec::new(),
    };
    patch
        .iter()
        .map(|op| {
            (
                op["op"].as_str().unwrap().to_string(),
                op["path"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn ops(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(op, path)| (op.to_string(), path.to_string()))
        .collect()
}

/// The patch an answer carries, decoded.
fn answered_patch(answer: &Value) -> Value {
    serde_json::from_slice(
        &STANDARD
            .decode(answer["patch"].as_str().expect("a patch"))
            .expect("base64"),
    )
    .expect("JSON")
}

// ---- The two tests kept from before the split ----

fn review(pod: Value) -> ReviewRequest {
    let body = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "r-1", "namespace": "default", "operation": "CREATE",
            "kind": {"group": "", "version": "v1", "kind": "Pod"}, "object": pod}});
    serde_json::from_slice::<Review>(body.to_string().as_bytes())
        .expect("decodes")
        .request
}

#[test]
fn keeps_pods_tolerating_virtual_nodes_local_from_the_review_alone() {
    let toleration =
        json!({"key": names::VIRTUAL_NODE_TAINT, "operator": "Exists", "effect": "NoExecute"});
    let pod = json!({"metadata": {"name": "p", "managedFields": [{"manager": "m"}]},
        "spec": {"containers": [{"name": "c", "image": "pause"}],
                 "tolerations": [toleration],
                 "affinity": {"podAntiAffinity": {}}}});
    let request = review(pod);
    let answer = keep_local(&request).response(&request.uid);
    assert_eq!(answer["uid"], "r-1");
    assert_eq!(answer["allowed"], true);
    let patch: Value = serde_json::from_slice(
        &STANDARD
            .decode(answer["patch"].as_str().expect("a patch"))
            .expect("base64"),
    )
    .expect("JSON");
    // The pod's own affinity is kept: the node affinity is added beside it.
    assert_eq!(patch[0]["path"], "/spec/affinity/nodeAffinity");

    let plain = json!({"metadata": {"name": "q"},
        "spec": {"containers": [{"name": "c", "image": "pause"}]}});
    let request = review(plain);
    let answer = keep_local(&request).response(&request.uid);
    assert_eq!(answer, json!({"uid": "r-1", "allowed": true}));
}

#[test]
fn an_unreadable_review_is_answered_without_a_patch() {
    let review: Review = serde_json::from_slice(b"{not json").unwrap_or_default();
    let answer = keep_local(&review.request).response(&review.request.uid);
    assert!(answer.get("patch").is_none());
    assert_eq!(answer["uid"], Value::Null);
}

// ---- Admission ----

#[test]
fn hook_table() {
    let cases = [
        (
            "the provider's check of peer writes: Hook::PeerWrites",
            peer_writes::PATH,
            Hook::PeerWrites,
        ),
        (
            "pod-locality.tandem.dev: Hook::LocalOnly",
            "/mutate-pods-local",
            Hook::LocalOnly,
        ),
        (
            "pod-placement.tandem.dev: Hook::Placement",
            "/mutate-pods",
            Hook::Placement,
        ),
    ];
    for (case, path, want) in cases {
        assert_eq!(Hook::of(path), want, "{case}");
    }
    // The configuration sends each webhook to the path that routes to it.
    let config = configuration(
        &WebhookTarget::Url("https://127.0.0.1:9443".into()),
        "PEM",
        &json!({}),
    );
    let routed: Vec<(String, Hook)> = config
        .webhooks
        .unwrap()
        .into_iter()
        .map(|w| {
            let url = w.client_config.url.unwrap();
            (
                w.name,
                Hook::of(url.trim_start_matches("https://127.0.0.1:9443")),
            )
        })
        .collect();
    assert_eq!(
        routed,
        [
            ("pod-placement.tandem.dev".to_string(), Hook::Placement),
            ("pod-locality.tandem.dev".to_string(), Hook::LocalOnly),
        ]
    );
}

/// (case, hook called, review, the namespace whose offloading decides or the answer, patch
/// operations).
type TriageCase<'a> = (
    &'a str,
    Hook,
    Vec<u8>,
    Result<&'a str, Admission>,
    Vec<(String, String)>,
);

#[test]
fn triage_table() {
    let pod = PodFixture::new();
    let tolerating = PodFixture::new().tolerating_virtual_nodes();
    // What keeps a tolerating pod off virtual nodes: the Local strategy's affinity.
    let kept_local = ops(&[("add", "/spec/affinity")]);
    let cases: Vec<TriageCase> = vec![
        (
            "a pod of an offloaded namespace: Triage::Offloaded",
            Hook::Placement,
            pod.review("Pod", Some(NAMESPACE)),
            Ok(NAMESPACE),
            Vec::new(),
        ),
        (
            "not a pod: Untouched::NotAPod",
            Hook::Placement,
            pod.review("Binding", Some(NAMESPACE)),
            Err(Admission::Unchanged(Untouched::NotAPod)),
            Vec::new(),
        ),
        (
            "a pod without a namespace: Untouched::NoNamespace",
            Hook::Placement,
            pod.review("Pod", None),
            Err(Admission::Unchanged(Untouched::NoNamespace)),
            Vec::new(),
        ),
        (
            "an unreadable review: Untouched::NotAPod",
            Hook::Placement,
            b"{not json".to_vec(),
            Err(Admission::Unchanged(Untouched::NotAPod)),
            Vec::new(),
        ),
        (
            "not offloaded, tolerating virtual nodes: Admission::KeptLocal",
            Hook::LocalOnly,
            tolerating.review("Pod", Some("default")),
            Err(Admission::KeptLocal(Vec::new())),
            kept_local.clone(),
        ),
        (
            "not offloaded, not tolerating: Untouched::TaintKeepsItOff",
            Hook::LocalOnly,
            pod.review("Pod", Some("default")),
            Err(Admission::Unchanged(Untouched::TaintKeepsItOff)),
            Vec::new(),
        ),
        (
            "not offloaded, not a pod: Untouched::NotAPod",
            Hook::LocalOnly,
            tolerating.review("Binding", Some("default")),
            Err(Admission::Unchanged(Untouched::NotAPod)),
            Vec::new(),
        ),
        (
            "a DaemonSet tolerating every taint, on the placement hook: Admission::DaemonSet",
            Hook::Placement,
            daemonset_review(json!({})),
            Err(Admission::DaemonSet(Vec::new())),
            ops(&[("add", "/spec/template/spec/affinity")]),
        ),
        (
            "a DaemonSet tolerating every taint, on the locality hook: Admission::DaemonSet",
            Hook::LocalOnly,
            daemonset_review(json!({})),
            Err(Admission::DaemonSet(Vec::new())),
            ops(&[("add", "/spec/template/spec/affinity")]),
        ),
        (
            "a DaemonSet opted in: its pods carry the opt-in",
            Hook::Placement,
            daemonset_review(json!({names::DAEMONSET_ON_VIRTUAL_NODES_ANNOTATION: "true"})),
            Err(Admission::DaemonSet(Vec::new())),
            ops(&[("add", "/spec/template/metadata/annotations")]),
        ),
    ];
    for (case, hook, body, want, want_ops) in cases {
        let request = decoded(&body);
        let got = triage(hook, &request, &body);
        match (got, want) {
            (Triage::Offloaded(namespace), Ok(want)) => assert_eq!(namespace, want, "{case}"),
            (Triage::Answer(got), Err(want)) => {
                // Variants compared here, patches by their operations below.
                assert_eq!(
                    std::mem::discriminant(&got),
                    std::mem::discriminant(&want),
                    "{case}: {got:?}"
                );
                if let (Admission::Unchanged(got), Admission::Unchanged(want)) = (&got, &want) {
                    assert_eq!(got, want, "{case}");
                }
                assert_eq!(patched(&got), want_ops, "{case}");
            }
            (got, want) => panic!("{case}: {got:?}, want {want:?}"),
        }
    }
}

/// (case, offloading as read, pod, the claims read, answer, patch operations).
type PlacingCase<'a> = (
    &'a str,
    Result<Option<OffloadingFixture>, &'a str>,
    PodFixture,
    Option<Result<Vec<String>, &'a str>>,
    Admission,
    Vec<(String, String)>,
);

#[test]
fn placing_table() {
    let placed = |strategy| Admission::Placed {
        strategy,
        patch: Vec::new(),
    };
    let on_virtual_nodes = ops(&[("add", "/spec/tolerations"), ("add", "/spec/affinity")]);
    let cases: Vec<PlacingCase> = vec![
        (
            "no NamespaceOffloading: Untouched::NotOffloaded",
            Ok(None),
            PodFixture::new(),
            None,
            Admission::Unchanged(Untouched::NotOffloaded),
            Vec::new(),
        ),
        (
            "its NamespaceOffloading being deleted: Untouched::NotOffloaded",
            Ok(Some(OffloadingFixture::new(Remote).deleting())),
            PodFixture::new(),
            None,
            Admission::Unchanged(Untouched::NotOffloaded),
            Vec::new(),
        ),
        (
            "the NamespaceOffloading unreadable: Refusal::OffloadingUnreadable",
            Err("connection refused"),
            PodFixture::new(),
            None,
            Admission::Refused(Refusal::OffloadingUnreadable {
                namespace: NAMESPACE.into(),
                error: "connection refused".into(),
            }),
            Vec::new(),
        ),
        (
            "a cluster selector meaning nothing: Refusal::InvalidSelector",
            Ok(Some(OffloadingFixture::new(Remote).selector(json!([
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": []}]}
            ])))),
            PodFixture::new(),
            None,
            Admission::Refused(Refusal::InvalidSelector {
                namespace: NAMESPACE.into(),
                problem: FieldError {
                    field: "spec.clusterSelector.nodeSelectorTerms[0].matchExpressions[0].values"
                        .into(),
                    message: "Required value: must be specified when `operator` is 'In' or 'NotIn'"
                        .into(),
                },
            }),
            Vec::new(),
        ),
        (
            "Remote, no volume here: Placed on virtual nodes",
            Ok(Some(OffloadingFixture::new(Remote))),
            PodFixture::new(),
            Some(Ok(Vec::new())),
            placed(PodPlacement::Remote),
            on_virtual_nodes.clone(),
        ),
        (
            "LocalAndRemote, no volume here: Placed anywhere, tolerating virtual nodes",
            Ok(Some(OffloadingFixture::new(LocalAndRemote))),
            PodFixture::new(),
            Some(Ok(Vec::new())),
            placed(PodPlacement::LocalAndRemote),
            on_virtual_nodes.clone(),
        ),
        (
            "LocalAndRemote, a claim of this cluster: Placed here (Local)",
            Ok(Some(OffloadingFixture::new(LocalAndRemote))),
            PodFixture::new().claim("data", "data-0"),
            Some(Ok(vec!["data-0".into()])),
            placed(PodPlacement::Local),
            ops(&[("add", "/spec/affinity")]),
        ),
        (
            "Local, tolerating virtual nodes: claims not read, Placed here",
            Ok(Some(OffloadingFixture::new(Local))),
            PodFixture::new().tolerating_virtual_nodes(),
            None,
            placed(PodPlacement::Local),
            ops(&[("add", "/spec/affinity")]),
        ),
        (
            "Remote, claims of this cluster: Refusal::LocalClaims",
            Ok(Some(OffloadingFixture::new(Remote))),
            PodFixture::new()
                .claim("data", "data-0")
                .ephemeral("scratch"),
            Some(Ok(vec!["data-0".into(), "scratch (ephemeral)".into()])),
            Admission::Refused(Refusal::LocalClaims {
                namespace: NAMESPACE.into(),
                claims: vec!["data-0".into(), "scratch (ephemeral)".into()],
            }),
            Vec::new(),
        ),
        (
            "Remote, the claims unreadable: Refusal::ClaimsUnreadable",
            Ok(Some(OffloadingFixture::new(Remote))),
            PodFixture::new().claim("data", "data-0"),
            Some(Err("forbidden")),
            Admission::Refused(Refusal::ClaimsUnreadable {
                namespace: NAMESPACE.into(),
                error: "forbidden".into(),
            }),
            Vec::new(),
        ),
        (
            "evictAfter: the eviction tolerations first, then the placement",
            Ok(Some(OffloadingFixture::new(Remote).evict_after("90s"))),
            PodFixture::new(),
            Some(Ok(Vec::new())),
            placed(PodPlacement::Remote),
            ops(&[
                ("add", "/spec/tolerations"),
                ("add", "/spec/tolerations/-"),
                ("add", "/spec/affinity"),
            ]),
        ),
        (
            "partitionPolicy Fence: the pod carries its bound",
            Ok(Some(OffloadingFixture::new(Remote).fenced())),
            PodFixture::new(),
            Some(Ok(Vec::new())),
            placed(PodPlacement::Remote),
            ops(&[
                ("add", "/metadata/annotations"),
                ("add", "/spec/tolerations"),
                ("add", "/spec/affinity"),
            ]),
        ),
    ];
    for (case, lookup, pod, claims, want, want_ops) in cases {
        let body = pod.review("Pod", Some(NAMESPACE));
        let request = decoded(&body);
        let got = match Placing::new(NAMESPACE, &request, lookup.map(|o| o.map(|o| o.0))) {
            Err(answer) => {
                assert!(
                    claims.is_none(),
                    "{case}: answered before its claims were read"
                );
                answer
            }
            Ok(placing) => {
                assert_eq!(placing.reads_claims(), claims.is_some(), "{case}");
                placing.admission(claims.unwrap_or(Ok(Vec::new())))
            }
        };
        assert_eq!(patched(&got), want_ops, "{case}");
        let got = match got {
            Admission::Placed { strategy, .. } => Admission::Placed {
                strategy,
                patch: Vec::new(),
            },
            other => other,
        };
        assert_eq!(got, want, "{case}");
    }
}

#[test]
fn placement_patch_values() {
    let offloading = OffloadingFixture::new(Remote).evict_after("90s").fenced();
    let body = PodFixture::new().review("Pod", Some(NAMESPACE));
    let request = decoded(&body);
    let answer = Placing::new(NAMESPACE, &request, Ok::<_, &str>(Some(offloading.0)))
        .unwrap()
        .admission(Ok::<_, &str>(Vec::new()))
        .response(&request.uid);
    assert_eq!(answer["uid"], "r-1");
    assert_eq!(answer["patchType"], "JSONPatch");
    let patch = answered_patch(&answer);
    // The node-failure tolerations bounded by evictAfter.
    assert_eq!(
        patch[0]["value"],
        json!([
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 90},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 90},
        ])
    );
    assert_eq!(
        patch[1]["value"],
        json!({names::FENCE_AFTER: tandem_api::offloading::DEFAULT_FENCE_AFTER})
    );
    assert_eq!(
        patch[2]["value"],
        json!({"key": names::VIRTUAL_NODE_TAINT, "operator": "Exists", "effect": "NoExecute"})
    );
    assert_eq!(
        patch[3]["value"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchExpressions"][0]["key"],
        names::NODE_TYPE_LABEL
    );
}

/// A pod of a fenced namespace keeps the annotations it was created with: the webhook adds its
/// bound beside them (a JSON Patch `add` of the whole map would replace them), and a pod
/// without any gets the map.
#[test]
fn a_fenced_pod_keeps_its_own_annotations() {
    let cases = [
        (
            "annotated",
            PodFixture::new().annotated("team", "shop"),
            json!({"team": "shop", names::FENCE_AFTER: tandem_api::offloading::DEFAULT_FENCE_AFTER}),
        ),
        (
            "without annotations",
            PodFixture::new(),
            json!({names::FENCE_AFTER: tandem_api::offloading::DEFAULT_FENCE_AFTER}),
        ),
    ];
    for (case, pod, want) in cases {
        let offloading = OffloadingFixture::new(Remote).fenced();
        let request = decoded(&pod.review("Pod", Some(NAMESPACE)));
        let answer = Placing::new(NAMESPACE, &request, Ok::<_, &str>(Some(offloading.0)))
            .unwrap()
            .admission(Ok::<_, &str>(Vec::new()))
            .response(&request.uid);
        let admitted = tandem_apimachinery::patch::json_patch(&pod.0, &answered_patch(&answer))
            .unwrap_or_else(|e| panic!("{case}: the patch applies: {e}"));
        assert_eq!(admitted["metadata"]["annotations"], want, "{case}");
    }
}

#[test]
fn refusals_as_kubectl_prints_them() {
    let ns = || NAMESPACE.to_string();
    let cases = [
        (
            "OffloadingUnreadable",
            Refusal::OffloadingUnreadable {
                namespace: ns(),
                error: "connection refused".into(),
            },
            500,
            "tandem pod placement: reading NamespaceOffloading app/offloading: connection refused",
        ),
        (
            "InvalidSelector",
            Refusal::InvalidSelector {
                namespace: ns(),
                problem: FieldError {
                    field: "spec.clusterSelector.nodeSelectorTerms[0]".into(),
                    message: "bad".into(),
                },
            },
            422,
            "tandem pod placement: NamespaceOffloading app/offloading: \
             spec.clusterSelector.nodeSelectorTerms[0]: bad",
        ),
        (
            "LocalClaims",
            Refusal::LocalClaims {
                namespace: ns(),
                claims: vec!["data-0".into(), "scratch (ephemeral)".into()],
            },
            422,
            "tandem pod placement: namespace app runs pods only in providers (Remote), but \
             claim(s) data-0, scratch (ephemeral) are not of StorageClass \"tandem\" and cannot \
             follow the pod there; give them storageClassName \"tandem\" or offload with \
             LocalAndRemote",
        ),
        (
            "ClaimsUnreadable",
            Refusal::ClaimsUnreadable {
                namespace: ns(),
                error: "forbidden".into(),
            },
            500,
            "tandem pod placement: reading the pod's claims in app: forbidden",
        ),
    ];
    assert_eq!(names::OFFLOADING_NAME, "offloading");
    assert_eq!(names::STORAGE_CLASS, "tandem");
    for (case, refusal, code, message) in cases {
        let answer = Admission::Refused(refusal).response(&json!("r-1"));
        assert_eq!(
            answer,
            json!({"uid": "r-1", "allowed": false, "status": {"code": code, "message": message}}),
            "{case}"
        );
        // The answer's keys in the order the API server has always been sent them.
        assert_eq!(
            answer.to_string(),
            format!(
                r#"{{"uid":"r-1","allowed":false,"status":{{"code":{code},"message":{}}}}}"#,
                json!(message)
            ),
            "{case}"
        );
    }
}

#[test]
fn answers_byte_for_byte() {
    let uid = json!("r-1");
    let unchanged = answer(Admission::Unchanged(Untouched::NothingToAdd).response(&uid));
    assert_eq!(
        unchanged.to_string(),
        r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"r-1","allowed":true}}"#
    );
    let patch = vec![json!({"op": "add", "path": "/spec/affinity", "value": {}})];
    let changed = Admission::KeptLocal(patch).response(&uid);
    assert_eq!(
        changed.to_string(),
        format!(
            r#"{{"uid":"r-1","allowed":true,"patchType":"JSONPatch","patch":"{}"}}"#,
            STANDARD.encode(r#"[{"op":"add","path":"/spec/affinity","value":{}}]"#)
        )
    );
    // An empty patch is no patch.
    assert_eq!(
        Admission::Placed {
            strategy: PodPlacement::Remote,
            patch: Vec::new()
        }
        .response(&uid),
        json!({"uid": "r-1", "allowed": true})
    );
}

#[test]
fn evict_after_seconds_table() {
    let cases = [
        ("not set", None, None),
        ("whole seconds", Some("90s"), Some(90)),
        ("minutes", Some("2m"), Some(120)),
        ("a fraction, rounded up", Some("1500ms"), Some(2)),
        ("unreadable", Some("soon"), None),
    ];
    for (case, after, want) in cases {
        let mut offloading = OffloadingFixture::new(Remote);
        if let Some(after) = after {
            offloading = offloading.evict_after(after);
        }
        assert_eq!(evict_after_seconds(&offloading.0), want, "{case}");
    }
}

mod rotation;
