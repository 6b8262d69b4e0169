//! The real `kubectl` against the embedded API server: what a cluster admin would type.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use kube::CustomResourceExt;
use serde::{Deserialize, Serialize};
use tandem_apiserver::{ApiServer, Config};

/// A server with a kubeconfig on disk, and kubectl pointed at it.
struct Cluster {
    server: ApiServer,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
}

struct Out {
    ok: bool,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Cluster {
    async fn start() -> Cluster {
        let server = ApiServer::start(Config::default())
            .await
            .expect("server starts");
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("admin.kubeconfig");
        std::fs::write(&kubeconfig, server.admin_kubeconfig().unwrap()).unwrap();
        Cluster {
            server,
            dir,
            kubeconfig,
        }
    }

    /// A kubeconfig for another user, written next to the admin's.
    fn kubeconfig_as(&self, user: &str, groups: &[&str]) -> PathBuf {
        let path = self.dir.path().join(format!("{user}.kubeconfig"));
        std::fs::write(&path, self.server.kubeconfig_for(user, groups).unwrap()).unwrap();
        path
    }

    async fn kubectl_with(&self, kubeconfig: &PathBuf, args: &[&str], stdin: Option<&str>) -> Out {
        use tokio::io::AsyncWriteExt;
        let mut cmd = tokio::process::Command::new("kubectl");
        cmd.arg("--kubeconfig").arg(kubeconfig).args(args);
        cmd.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .env("HOME", self.dir.path());
        let mut child = cmd.spawn().expect("kubectl is installed");
        let mut input = child.stdin.take().unwrap();
        if let Some(s) = stdin {
            input.write_all(s.as_bytes()).await.unwrap();
        }
        drop(input);
        let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .expect("kubectl finishes")
            .unwrap();
        Out {
            ok: out.status.success(),
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    async fn kubectl(&self, args: &[&str]) -> Out {
        self.kubectl_with(&self.kubeconfig.clone(), args, None)
            .await
    }

    async fn kubectl_in(&self, args: &[&str], stdin: &str) -> Out {
        self.kubectl_with(&self.kubeconfig.clone(), args, Some(stdin))
            .await
    }

    /// Runs kubectl and fails the test with its output unless it succeeds.
    async fn ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args).await;
        assert!(
            out.ok,
            "kubectl {args:?} failed:\n{}\n{}",
            out.stdout, out.stderr
        );
        out.stdout
    }

    async fn ok_in(&self, args: &[&str], stdin: &str) -> String {
        let out = self.kubectl_in(args, stdin).await;
        assert!(
            out.ok,
            "kubectl {args:?} failed:\n{}\n{}",
            out.stdout, out.stderr
        );
        out.stdout
    }

    async fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut full = args.to_vec();
        full.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&full).await).expect("kubectl -o json prints JSON")
    }
}

const DEPLOYMENT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: nginx
        image: nginx:1.25
        env: [{name: A, value: "1"}, {name: B, value: "2"}]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_resources_and_discovery() {
    let c = Cluster::start().await;
    let out = c.ok(&["api-resources"]).await;
    for line in [
        "pods ",
        "deployments ",
        "customresourcedefinitions ",
        "certificatesigningrequests ",
        "mutatingwebhookconfigurations ",
        "selfsubjectaccessreviews ",
        "leases ",
        "endpointslices ",
    ] {
        assert!(out.contains(line), "api-resources lacks {line}:\n{out}");
    }
    let pods = out.lines().find(|l| l.starts_with("pods ")).unwrap();
    assert!(
        pods.contains(" po ")
            && pods.contains(" v1 ")
            && pods.contains("true")
            && pods.contains("Pod"),
        "{pods}"
    );
    let version = c.ok(&["version", "-o", "json"]).await;
    assert!(version.contains("\"serverVersion\""), "{version}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_apply_get_and_diff() {
    let c = Cluster::start().await;
    assert!(
        c.ok_in(&["apply", "-f", "-"], DEPLOYMENT)
            .await
            .contains("deployment.apps/web created")
    );
    let again = c.kubectl_in(&["create", "-f", "-"], DEPLOYMENT).await;
    assert!(
        !again.ok && again.stderr.contains("AlreadyExists"),
        "{}",
        again.stderr
    );
    // A server-side dry run answers as the create would: the name is taken, and a namespace
    // that does not exist is refused.
    refused(
        &c,
        &["create", "--dry-run=server", "-f", "-"],
        Some(DEPLOYMENT),
        "AlreadyExists",
    )
    .await;
    refused(
        &c,
        &[
            "create",
            "configmap",
            "cm",
            "--dry-run=server",
            "-n",
            "nowhere",
        ],
        None,
        "namespaces \"nowhere\" not found",
    )
    .await;

    // Client-side apply: a changed image and a removed env var reach the object.
    let changed = DEPLOYMENT
        .replace("nginx:1.25", "nginx:1.26")
        .replace(r#", {name: B, value: "2"}"#, "");
    let diff = c.kubectl_in(&["diff", "-f", "-"], &changed).await;
    assert_eq!(
        diff.code,
        Some(1),
        "diff exits 1 when there are differences: {}",
        diff.stderr
    );
    assert!(
        diff.stdout.contains("+        image: nginx:1.26")
            && diff.stdout.contains("-          value: \"2\""),
        "{}",
        diff.stdout
    );
    assert!(
        c.ok_in(&["apply", "-f", "-"], &changed)
            .await
            .contains("configured")
    );
    let d = c.json(&["get", "deploy", "web"]).await;
    let container = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "nginx:1.26");
    assert_eq!(
        container["env"],
        serde_json::json!([{"name": "A", "value": "1"}])
    );
    assert_eq!(d["metadata"]["generation"], 2);
    let no_diff = c.kubectl_in(&["diff", "-f", "-"], &changed).await;
    assert_eq!(
        no_diff.code,
        Some(0),
        "no differences after apply: {}{}",
        no_diff.stdout,
        no_diff.stderr
    );
    // Re-applying the same configuration writes nothing.
    let rv = d["metadata"]["resourceVersion"].clone();
    c.ok_in(&["apply", "-f", "-"], &changed).await;
    assert_eq!(
        c.json(&["get", "deploy", "web"]).await["metadata"]["resourceVersion"],
        rv,
        "a no-op apply is not a write"
    );

    // Server-side apply by a second manager conflicts on a field the first one set.
    let ssa = changed.replace("replicas: 2", "replicas: 4");
    let conflict = c
        .kubectl_in(
            &["apply", "--server-side", "--field-manager=ops", "-f", "-"],
            &ssa,
        )
        .await;
    assert!(
        !conflict.ok
            && conflict.stderr.contains("conflict")
            && conflict.stderr.contains(".spec.replicas"),
        "{}",
        conflict.stderr
    );
    c.ok_in(
        &[
            "apply",
            "--server-side",
            "--field-manager=ops",
            "--force-conflicts",
            "-f",
            "-",
        ],
        &ssa,
    )
    .await;
    // Taking ownership without changing a value is stored too.
    c.ok_in(
        &[
            "apply",
            "--server-side",
            "--field-manager=auditor",
            "-f",
            "-",
        ],
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec: {replicas: 4}\n",
    )
    .await;
    let d = c
        .json(&["get", "deploy", "web", "--show-managed-fields"])
        .await;
    assert_eq!(d["spec"]["replicas"], 4);
    let managers: Vec<&str> = d["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["manager"].as_str().unwrap())
        .collect();
    assert!(
        managers.contains(&"ops") && managers.contains(&"auditor"),
        "{managers:?}"
    );

    let yaml = c.ok(&["get", "deploy", "web", "-o", "yaml"]).await;
    assert!(
        yaml.contains("kind: Deployment") && yaml.contains("resourceVersion:"),
        "{yaml}"
    );
    let wide = c.ok(&["get", "deploy", "-o", "wide"]).await;
    let header = wide.lines().next().unwrap();
    assert!(
        header.split_whitespace().collect::<Vec<_>>().starts_with(&[
            "NAME",
            "READY",
            "UP-TO-DATE",
            "AVAILABLE",
            "AGE",
            "CONTAINERS",
            "IMAGES",
            "SELECTOR"
        ]),
        "{wide}"
    );
    assert!(
        wide.contains("nginx:1.26") && wide.contains("app=web"),
        "{wide}"
    );

    // A List (what `kubectl get -o yaml` prints for several objects) applies item by item:
    // kubectl validates its items against /openapi/v2 in protobuf first.
    let list = "apiVersion: v1\nkind: List\nitems:\n\
        - {apiVersion: v1, kind: ConfigMap, metadata: {name: one}, data: {a: '1'}}\n\
        - {apiVersion: v1, kind: ConfigMap, metadata: {name: two}, data: {b: '2'}}\n";
    let applied = c.ok_in(&["apply", "-f", "-"], list).await;
    assert!(
        applied.contains("configmap/one created") && applied.contains("configmap/two created"),
        "{applied}"
    );
    let printed = c
        .ok(&["get", "configmap", "one", "two", "-o", "yaml"])
        .await;
    assert!(printed.contains("kind: List"), "{printed}");
    let again = c
        .ok_in(
            &["apply", "-f", "-"],
            &printed.replace("a: \"1\"", "a: \"3\""),
        )
        .await;
    assert!(again.contains("configmap/one configured"), "{again}");
    assert_eq!(c.json(&["get", "configmap", "one"]).await["data"]["a"], "3");

    // A misspelt field is refused, as kube-apiserver refuses it when kubectl asks for strict
    // validation (its default); --validate=false lets it through.
    let typo = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: typo}\n\
        spec: {replica: 2, selector: {matchLabels: {app: t}}, template: {metadata: {labels: {app: t}}, \
        spec: {containers: [{name: t, image: t, imagePullPolicyy: Always}]}}}\n";
    let refused = c.kubectl_in(&["apply", "-f", "-"], typo).await;
    assert!(
        !refused.ok
            && refused.stderr.contains("strict decoding error")
            && refused.stderr.contains(r#"unknown field "spec.replica""#)
            && refused
                .stderr
                .contains(r#"unknown field "spec.template.spec.containers[0].imagePullPolicyy""#),
        "{}",
        refused.stderr
    );
    c.ok_in(&["apply", "--validate=false", "-f", "-"], typo)
        .await;
    // A later strict write that does not bring the field is not refused for it.
    c.ok(&["label", "deploy", "typo", "checked=yes"]).await;
    let fixed = typo.replace("replica: 2", "replicas: 2");
    c.ok_in(&["apply", "-f", "-"], &fixed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_annotate_patch_and_scale() {
    let c = Cluster::start().await;
    c.ok_in(&["apply", "-f", "-"], DEPLOYMENT).await;
    c.ok(&["label", "deploy", "web", "tier=frontend"]).await;
    c.ok(&["annotate", "deploy", "web", "owner=team-a"]).await;
    let listed = c
        .ok(&["get", "deploy", "-l", "tier=frontend", "-o", "name"])
        .await;
    assert_eq!(listed.trim(), "deployment.apps/web");
    assert!(
        c.ok(&["get", "deploy", "-l", "tier!=frontend", "-o", "name"])
            .await
            .trim()
            .is_empty()
    );

    c.ok(&[
        "patch",
        "deploy",
        "web",
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/spec/replicas","value":3}]"#,
    ])
    .await;
    c.ok(&[
        "patch",
        "deploy",
        "web",
        "--type=merge",
        "-p",
        r#"{"metadata":{"labels":{"tier":null}}}"#,
    ])
    .await;
    c.ok(&[
        "patch",
        "deploy",
        "web",
        "--type=strategic",
        "-p",
        r#"{"spec":{"template":{"spec":{"containers":[{"name":"sidecar","image":"busybox"}]}}}}"#,
    ])
    .await;
    let d = c.json(&["get", "deploy", "web"]).await;
    assert_eq!(d["spec"]["replicas"], 3);
    assert!(d["metadata"]["labels"].get("tier").is_none());
    assert_eq!(d["metadata"]["annotations"]["owner"], "team-a");
    let names: Vec<&str> = d["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names.len(),
        2,
        "strategic merge keeps nginx and adds the sidecar: {names:?}"
    );
    assert!(names.contains(&"nginx") && names.contains(&"sidecar"));

    c.ok(&["scale", "deploy", "web", "--replicas=5"]).await;
    assert_eq!(
        c.json(&["get", "deploy", "web"]).await["spec"]["replicas"],
        5
    );
    let bad = c
        .kubectl(&[
            "patch",
            "deploy",
            "web",
            "--type=json",
            "-p",
            r#"[{"op":"test","path":"/spec/replicas","value":9}]"#,
        ])
        .await;
    assert!(!bad.ok, "a failing JSON patch test op is refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_watch_streams_changes() {
    let c = Cluster::start().await;
    c.ok_in(
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: first}\n",
    )
    .await;
    let mut watch = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&c.kubeconfig)
        .args(["get", "configmaps", "-w", "--output-watch-events"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = watch.stdout.take().unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut step = 0;
    while Instant::now() < deadline {
        let line = match tokio::time::timeout(Duration::from_millis(300), lines.next_line()).await {
            Ok(Ok(Some(l))) => l,
            Ok(_) => break,
            Err(_) => String::new(),
        };
        seen.push_str(&line);
        seen.push('\n');
        if step == 0 && seen.contains("first") {
            c.ok_in(
                &["apply", "-f", "-"],
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: second}\n",
            )
            .await;
            step = 1;
        } else if step == 1 && seen.contains("second") {
            c.ok(&["delete", "configmap", "first"]).await;
            step = 2;
        } else if step == 2
            && seen
                .lines()
                .any(|l| l.starts_with("DELETED") && l.contains("first"))
        {
            step = 3;
            break;
        }
    }
    assert_eq!(step, 3, "watch output:\n{seen}");
    assert!(
        seen.lines()
            .any(|l| l.starts_with("ADDED") && l.contains("second")),
        "{seen}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_cascades_and_waits() {
    let c = Cluster::start().await;
    c.ok_in(&["apply", "-f", "-"], DEPLOYMENT).await;
    let uid = c.json(&["get", "deploy", "web"]).await["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    // A dependent like the one the Deployment controller would create.
    let rs = |uid: &str| {
        format!(
            r#"
apiVersion: apps/v1
kind: ReplicaSet
metadata:
  name: web-1
  labels: {{app: web}}
  ownerReferences: [{{apiVersion: apps/v1, kind: Deployment, name: web, uid: {uid}, controller: true, blockOwnerDeletion: true}}]
spec:
  replicas: 1
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec: {{containers: [{{name: c, image: nginx}}]}}
"#
        )
    };
    c.ok_in(&["create", "-f", "-"], &rs(&uid)).await;
    c.ok(&[
        "delete",
        "deploy",
        "web",
        "--cascade=foreground",
        "--wait",
        "--timeout=20s",
    ])
    .await;
    assert!(
        c.ok(&["get", "deploy,rs", "-o", "name"])
            .await
            .trim()
            .is_empty(),
        "owner and dependent are gone"
    );

    // Orphan keeps the dependent and cuts its owner reference.
    c.ok_in(&["apply", "-f", "-"], DEPLOYMENT).await;
    let uid = c.json(&["get", "deploy", "web"]).await["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    c.ok_in(&["create", "-f", "-"], &rs(&uid)).await;
    c.ok(&[
        "delete",
        "deploy",
        "web",
        "--cascade=orphan",
        "--wait",
        "--timeout=20s",
    ])
    .await;
    let orphan = c.json(&["get", "rs", "web-1"]).await;
    assert!(
        orphan["metadata"]
            .get("ownerReferences")
            .is_none_or(|r| r.as_array().unwrap().is_empty()),
        "{orphan}"
    );

    // Namespaces delete their content, then themselves.
    c.ok_in(
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: scratch}\n",
    )
    .await;
    c.ok_in(
        &["apply", "-n", "scratch", "-f", "-"],
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n",
    )
    .await;
    c.ok(&["delete", "namespace", "scratch", "--wait", "--timeout=20s"])
        .await;
    let gone = c.kubectl(&["get", "namespace", "scratch"]).await;
    assert!(
        !gone.ok && gone.stderr.contains("NotFound"),
        "{}",
        gone.stderr
    );
}

/// A custom resource defined in Rust, as Tandem's own CRDs are.
#[derive(kube::CustomResource, Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
#[kube(
    group = "example.com",
    version = "v1",
    kind = "Gadget",
    namespaced,
    status = "GadgetStatus",
    shortname = "gd",
    printcolumn = r#"{"name":"Size","type":"integer","jsonPath":".spec.size"}"#
)]
pub struct GadgetSpec {
    /// How big.
    #[schemars(range(min = 1))]
    size: i64,
}

/// Status of a Gadget.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema, Default)]
pub struct GadgetStatus {
    /// Conditions.
    #[serde(default)]
    conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    /// Replicas running.
    #[serde(default)]
    replicas: i64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_resources_from_a_kube_derive_type() {
    let c = Cluster::start().await;
    let crd = serde_saphyr::to_string(&Gadget::crd()).unwrap();
    c.ok_in(&["apply", "-f", "-"], &crd).await;
    c.ok(&[
        "wait",
        "--for=condition=Established",
        "crd/gadgets.example.com",
        "--timeout=10s",
    ])
    .await;
    c.ok_in(
        &["apply", "-f", "-"],
        "apiVersion: example.com/v1\nkind: Gadget\nmetadata: {name: g1}\nspec: {size: 3}\n",
    )
    .await;
    let table = c.ok(&["get", "gd"]).await;
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "SIZE", "AGE"], "{table}");
    assert!(
        table
            .lines()
            .nth(1)
            .unwrap()
            .split_whitespace()
            .take(2)
            .eq(["g1", "3"]),
        "{table}"
    );

    let invalid = c
        .kubectl_in(
            &["apply", "-f", "-"],
            "apiVersion: example.com/v1\nkind: Gadget\nmetadata: {name: g2}\nspec: {size: 0}\n",
        )
        .await;
    assert!(
        !invalid.ok
            && invalid.stderr.contains("spec.size")
            && invalid.stderr.contains("greater than or equal to 1"),
        "{}",
        invalid.stderr
    );

    // A condition set through the status subresource satisfies kubectl wait.
    c.ok(&["patch", "gadget", "g1", "--subresource=status", "--type=merge", "-p",
           r#"{"status":{"conditions":[{"type":"Ready","status":"True","reason":"Test","message":"","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}"#]).await;
    c.ok(&[
        "wait",
        "--for=condition=Ready",
        "gadget/g1",
        "--timeout=10s",
    ])
    .await;
    // A main-resource write cannot change status.
    c.ok(&[
        "patch",
        "gadget",
        "g1",
        "--type=merge",
        "-p",
        r#"{"status":{"conditions":[]},"spec":{"size":4}}"#,
    ])
    .await;
    let g = c.json(&["get", "gadget", "g1"]).await;
    assert_eq!(g["spec"]["size"], 4);
    assert_eq!(g["status"]["conditions"][0]["type"], "Ready");
    assert_eq!(g["metadata"]["generation"], 2);

    let explain = c.ok(&["explain", "gadget.spec"]).await;
    assert!(
        explain.contains("size") && explain.contains("<integer>"),
        "{explain}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_refusals_through_kubectl() {
    let c = Cluster::start().await;
    c.ok_in(
        &["apply", "-f", "-"],
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: cm-reader, namespace: default}
rules: [{apiGroups: [""], resources: [configmaps], verbs: [get, list]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: alice-reads, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: cm-reader}
subjects: [{kind: User, name: alice, apiGroup: rbac.authorization.k8s.io}]
"#,
    )
    .await;
    let alice = c.kubeconfig_as("alice", &["devs"]);
    let allowed = c.kubectl_with(&alice, &["get", "configmaps"], None).await;
    assert!(allowed.ok, "{}", allowed.stderr);
    let denied = c.kubectl_with(&alice, &["get", "secrets"], None).await;
    assert!(!denied.ok, "alice may not list secrets");
    assert!(denied.stderr.contains(r#"secrets is forbidden: User "alice" cannot list resource "secrets" in API group "" in the namespace "default""#), "{}", denied.stderr);
    let other_ns = c
        .kubectl_with(&alice, &["get", "configmaps", "-n", "kube-system"], None)
        .await;
    assert!(
        !other_ns.ok && other_ns.stderr.contains("forbidden"),
        "{}",
        other_ns.stderr
    );
    let write = c
        .kubectl_with(
            &alice,
            &["apply", "-f", "-"],
            Some("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"),
        )
        .await;
    assert!(
        !write.ok && write.stderr.contains("forbidden"),
        "{}",
        write.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_can_i_also_impersonated() {
    let c = Cluster::start().await;
    c.ok_in(
        &["apply", "-f", "-"],
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: alice-view}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: view}
subjects: [{kind: User, name: alice, apiGroup: rbac.authorization.k8s.io}]
"#,
    )
    .await;
    assert_eq!(
        c.ok(&["auth", "can-i", "create", "pods"]).await.trim(),
        "yes"
    );
    let as_alice = c
        .kubectl(&["auth", "can-i", "create", "pods", "--as", "alice"])
        .await;
    assert_eq!(as_alice.stdout.trim(), "no", "{}", as_alice.stderr);
    assert_eq!(
        c.ok(&["auth", "can-i", "list", "pods", "--as", "alice"])
            .await
            .trim(),
        "yes"
    );
    let alice = c.kubeconfig_as("alice", &[]);
    let own = c
        .kubectl_with(&alice, &["auth", "can-i", "delete", "configmaps"], None)
        .await;
    assert_eq!(own.stdout.trim(), "no", "{}", own.stderr);
    // Impersonation itself is authorized: alice may not act as the admin.
    let escalate = c
        .kubectl_with(
            &alice,
            &[
                "get",
                "pods",
                "--as",
                "admin",
                "--as-group",
                "system:masters",
            ],
            None,
        )
        .await;
    assert!(
        !escalate.ok && escalate.stderr.contains("cannot impersonate"),
        "{}",
        escalate.stderr
    );
}

/// Fails the test unless every field of `sent` is in `stored` with the same value. A null
/// (kubectl's `creationTimestamp: null`) is the server's to fill, and an object holding only
/// empty objects and nulls (`status: {loadBalancer: {}}`, a job template's
/// `metadata: {creationTimestamp: null}`) may be absent: Go writes empty structs.
fn assert_stored_as_sent(
    what: &str,
    path: &str,
    sent: &serde_json::Value,
    stored: &serde_json::Value,
) {
    use serde_json::Value;
    fn hollow(v: &Value) -> bool {
        v.is_null() || v.as_object().is_some_and(|o| o.values().all(hollow))
    }
    match (sent, stored) {
        (Value::Null, _) => {}
        (s, Value::Null) if hollow(s) => {}
        (Value::Object(s), Value::Object(t)) => {
            for (k, v) in s {
                assert_stored_as_sent(
                    what,
                    &format!("{path}.{k}"),
                    v,
                    t.get(k).unwrap_or(&Value::Null),
                );
            }
        }
        (Value::Array(s), Value::Array(t)) if s.len() == t.len() => {
            for (i, (v, w)) in s.iter().zip(t).enumerate() {
                assert_stored_as_sent(what, &format!("{path}[{i}]"), v, w);
            }
        }
        _ => assert_eq!(
            sent, stored,
            "{what}: {path} differs from what kubectl sent"
        ),
    }
}

/// Every typed `kubectl create` of a kind the lab serves (kubectl sends them as protobuf)
/// stores what `--dry-run=client -o json` shows kubectl would send, plus server defaults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_create_commands_store_what_kubectl_sends() {
    let c = Cluster::start().await;
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["web.example".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let (cert_file, key_file) = (c.dir.path().join("tls.crt"), c.dir.path().join("tls.key"));
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    let (cert_file, key_file) = (cert_file.to_str().unwrap(), key_file.to_str().unwrap());
    let tls_cert = format!("--cert={cert_file}");
    let tls_key = format!("--key={key_file}");

    // (kubectl create arguments, what `kubectl get` names the stored object)
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["namespace", "team-a"], "namespace/team-a"),
        (
            vec![
                "service",
                "clusterip",
                "svc-c",
                "--tcp=80:8080",
                "--tcp=443",
            ],
            "service/svc-c",
        ),
        (
            vec!["service", "clusterip", "svc-h", "--clusterip=None"],
            "service/svc-h",
        ),
        (
            vec![
                "service",
                "nodeport",
                "svc-n",
                "--tcp=80:http",
                "--node-port=30080",
            ],
            "service/svc-n",
        ),
        (
            vec!["service", "loadbalancer", "svc-l", "--tcp=5678:8080"],
            "service/svc-l",
        ),
        (
            vec![
                "service",
                "externalname",
                "svc-e",
                "--external-name=db.example.com",
                "--tcp=5432",
            ],
            "service/svc-e",
        ),
        (
            vec![
                "secret",
                "generic",
                "s-gen",
                "--from-literal=user=admin",
                "--type=Opaque",
            ],
            "secret/s-gen",
        ),
        (
            vec!["secret", "tls", "s-tls", &tls_cert, &tls_key],
            "secret/s-tls",
        ),
        (
            vec![
                "secret",
                "docker-registry",
                "s-reg",
                "--docker-server=registry.example",
                "--docker-username=u",
                "--docker-password=p",
                "--docker-email=u@example.com",
            ],
            "secret/s-reg",
        ),
        (
            vec![
                "configmap",
                "cm",
                "--from-literal=a=1",
                "--from-literal=b=2",
            ],
            "configmap/cm",
        ),
        (vec!["serviceaccount", "builder"], "serviceaccount/builder"),
        (
            vec![
                "role",
                "reader",
                "--verb=get,list",
                "--resource=pods,deployments.apps",
                "--resource-name=web",
            ],
            "role/reader",
        ),
        (
            vec![
                "rolebinding",
                "read",
                "--role=reader",
                "--user=alice",
                "--serviceaccount=default:builder",
            ],
            "rolebinding/read",
        ),
        (
            vec![
                "clusterrole",
                "nodes",
                "--verb=get",
                "--resource=nodes",
                "--non-resource-url=/healthz",
            ],
            "clusterrole/nodes",
        ),
        (
            vec!["clusterrole", "agg", "--aggregation-rule=team=a"],
            "clusterrole/agg",
        ),
        (
            vec![
                "clusterrolebinding",
                "ops",
                "--clusterrole=nodes",
                "--group=ops",
            ],
            "clusterrolebinding/ops",
        ),
        (
            vec![
                "quota",
                "q",
                "--hard=cpu=2,memory=1Gi,pods=10",
                "--scopes=NotBestEffort",
            ],
            "resourcequota/q",
        ),
        (
            vec![
                "priorityclass",
                "high",
                "--value=1000",
                "--description=urgent",
                "--preemption-policy=Never",
            ],
            "priorityclass/high",
        ),
        (vec!["deployment", "web", "--image=nginx"], "deployment/web"),
        (
            vec![
                "deployment",
                "api",
                "--image=nginx:1.25",
                "--image=busybox",
                "--replicas=3",
                "--port=8080",
            ],
            "deployment/api",
        ),
        (
            vec![
                "deployment",
                "sleeper",
                "--image=busybox",
                "--",
                "sleep",
                "3600",
            ],
            "deployment/sleeper",
        ),
        (
            vec![
                "cronjob",
                "tick",
                "--image=busybox",
                "--schedule=*/5 * * * *",
                "--restart=OnFailure",
            ],
            "cronjob/tick",
        ),
        (vec!["job", "once", "--image=busybox"], "job/once"),
        (
            vec![
                "job",
                "pi",
                "--image=perl:5.34",
                "--",
                "perl",
                "-e",
                "print 1",
            ],
            "job/pi",
        ),
        // Built from the stored CronJob's job template, owned by it.
        (vec!["job", "manual", "--from=cronjob/tick"], "job/manual"),
        (
            vec![
                "poddisruptionbudget",
                "web",
                "--selector=app=web",
                "--min-available=1",
            ],
            "poddisruptionbudget/web",
        ),
        (
            vec!["pdb", "api", "--selector=app=api", "--max-unavailable=50%"],
            "poddisruptionbudget/api",
        ),
    ];
    for (args, object) in &cases {
        let mut create = vec!["create"];
        create.extend(args);
        // Flags go before `--`: what follows it is the container's command.
        let mut dry_run = create.clone();
        let flags_at = dry_run
            .iter()
            .position(|a| *a == "--")
            .unwrap_or(dry_run.len());
        dry_run.splice(flags_at..flags_at, ["--dry-run=client", "-o", "json"]);
        let sent: serde_json::Value = serde_json::from_str(&c.ok(&dry_run).await).unwrap();
        c.ok(&create).await;
        let stored = c.json(&["get", object]).await;
        assert_stored_as_sent(&format!("kubectl {}", create.join(" ")), "", &sent, &stored);
    }

    // `create token` stores nothing: it returns a token for the ServiceAccount.
    let token = c
        .ok(&[
            "create",
            "token",
            "builder",
            "--duration=1h",
            "--audience=vault",
        ])
        .await;
    assert_eq!(token.trim().split('.').count(), 3, "a JWT: {token}");
}

/// The words of a table's header line and of the row starting with `name`.
fn table(out: &str, name: &str) -> (Vec<String>, String) {
    let header = out
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let row = out
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no row {name} in:\n{out}"))
        .to_string();
    (header, row)
}

fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// Fails the test unless kubectl refuses `args` (given `stdin`) with `message` in its error.
async fn refused(c: &Cluster, args: &[&str], stdin: Option<&str>, message: &str) {
    let out = match stdin {
        Some(input) => c.kubectl_in(args, input).await,
        None => c.kubectl(args).await,
    };
    assert!(
        !out.ok && out.stderr.contains(message),
        "kubectl {args:?} should fail with {message:?}:\n{}\n{}",
        out.stdout,
        out.stderr
    );
}

const WORKLOADS: &str = r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: fast
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: lab.tandem.dev/hollow
volumeBindingMode: WaitForFirstConsumer
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: static}
spec:
  storageClassName: ""
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  serviceName: db
  replicas: 3
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec: {containers: [{name: pg, image: postgres:16}]}
  volumeClaimTemplates:
  - metadata: {name: data}
    spec:
      accessModes: [ReadWriteOnce]
      resources: {requests: {storage: 1Gi}}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec:
      nodeSelector: {kubernetes.io/os: linux}
      containers: [{name: agent, image: busybox}]
"#;

/// Jobs, CronJobs, StatefulSets, DaemonSets and storage through kubectl: what the server
/// fills in, the columns `kubectl get` prints, refusals in kube's words, and `get all`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_stateful_and_storage_kinds_as_kubectl_shows_them() {
    let c = Cluster::start().await;
    c.ok(&[
        "create",
        "cronjob",
        "tick",
        "--image=busybox",
        "--schedule=*/5 * * * *",
    ])
    .await;
    c.ok(&["create", "job", "once", "--image=busybox"]).await;

    // The job's selector picks its uid, and its pods carry its name and uid.
    let job = c.json(&["get", "job", "once"]).await;
    let uid = job["metadata"]["uid"].as_str().unwrap();
    assert_eq!(
        job["spec"]["selector"],
        serde_json::json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}})
    );
    for (key, value) in [
        ("batch.kubernetes.io/controller-uid", uid),
        ("controller-uid", uid),
        ("batch.kubernetes.io/job-name", "once"),
        ("job-name", "once"),
    ] {
        assert_eq!(job["spec"]["template"]["metadata"]["labels"][key], value);
        assert_eq!(
            job["metadata"]["labels"][key], value,
            "the job takes its template's labels"
        );
    }
    for (field, value) in [
        ("completions", serde_json::json!(1)),
        ("parallelism", serde_json::json!(1)),
        ("backoffLimit", serde_json::json!(6)),
        ("completionMode", serde_json::json!("NonIndexed")),
        ("suspend", serde_json::json!(false)),
        (
            "podReplacementPolicy",
            serde_json::json!("TerminatingOrFailed"),
        ),
    ] {
        assert_eq!(job["spec"][field], value, "spec.{field}");
    }

    let (header, row) = table(&c.ok(&["get", "jobs"]).await, "once");
    assert_eq!(header, ["NAME", "STATUS", "COMPLETIONS", "DURATION", "AGE"]);
    assert_eq!(
        row.split_whitespace().take(3).collect::<Vec<_>>(),
        ["once", "Running", "0/1"]
    );
    let (header, row) = table(&c.ok(&["get", "jobs", "-o", "wide"]).await, "once");
    assert_eq!(header[5..], ["CONTAINERS", "IMAGES", "SELECTOR"]);
    assert_eq!(
        words(&row)[words(&row).len() - 3..],
        [
            "once",
            "busybox",
            &format!("batch.kubernetes.io/controller-uid={uid}")
        ]
    );
    let (header, row) = table(&c.ok(&["get", "cronjobs"]).await, "tick");
    assert_eq!(
        header,
        [
            "NAME", "SCHEDULE", "TIMEZONE", "SUSPEND", "ACTIVE", "LAST", "SCHEDULE", "AGE"
        ]
    );
    assert_eq!(
        words(&row)[..10],
        [
            "tick", "*/5", "*", "*", "*", "*", "<none>", "False", "0", "<none>"
        ]
    );

    // Refusals, worded as kube-apiserver words them.
    let always = r#"{"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "always"},
        "spec": {"template": {"spec": {"restartPolicy": "Always",
                 "containers": [{"name": "c", "image": "busybox"}]}}}}"#;
    refused(&c, &["create", "-f", "-"], Some(always),
        r#"The Job "always" is invalid: spec.template.spec.restartPolicy: Unsupported value: "Always": supported values: "OnFailure", "Never""#).await;
    refused(
        &c,
        &["set", "image", "job/once", "once=nginx"],
        None,
        "spec.template: Invalid value: ",
    )
    .await;
    refused(
        &c,
        &["set", "image", "job/once", "once=nginx"],
        None,
        "field is immutable",
    )
    .await;
    refused(
        &c,
        &[
            "create",
            "cronjob",
            "bad",
            "--image=busybox",
            "--schedule=bad",
        ],
        None,
        r#"spec.schedule: Invalid value: "bad": expected exactly 5 fields, found 1: [bad]"#,
    )
    .await;
    c.ok_in(&["apply", "-f", "-"], WORKLOADS).await;

    // The DefaultStorageClass admission plugin names the default class; "" asks for none.
    let data = c.json(&["get", "pvc", "data"]).await;
    assert_eq!(data["spec"]["storageClassName"], "fast");
    assert_eq!(data["spec"]["volumeMode"], "Filesystem");
    assert_eq!(data["status"]["phase"], "Pending");
    let fixed = c.json(&["get", "pvc", "static"]).await;
    assert_eq!(fixed["spec"]["storageClassName"], "");
    let (header, row) = table(&c.ok(&["get", "pvc"]).await, "data");
    assert_eq!(
        header,
        [
            "NAME",
            "STATUS",
            "VOLUME",
            "CAPACITY",
            "ACCESS",
            "MODES",
            "STORAGECLASS",
            "VOLUMEATTRIBUTESCLASS",
            "AGE"
        ]
    );
    assert_eq!(
        words(&row)[..4],
        ["data", "Pending", "fast", "<unset>"],
        "unbound: no volume, capacity or modes"
    );
    let (header, row) = table(&c.ok(&["get", "storageclasses"]).await, "fast");
    assert_eq!(
        header,
        [
            "NAME",
            "PROVISIONER",
            "RECLAIMPOLICY",
            "VOLUMEBINDINGMODE",
            "ALLOWVOLUMEEXPANSION",
            "AGE"
        ]
    );
    assert_eq!(
        words(&row)[..6],
        [
            "fast",
            "(default)",
            "lab.tandem.dev/hollow",
            "Delete",
            "WaitForFirstConsumer",
            "false"
        ]
    );
    // A claim is fixed until bound (the binder sets its volume once), then may grow, but
    // never change its access modes.
    let grow = r#"{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}"#;
    refused(
        &c,
        &["patch", "pvc", "data", "-p", grow],
        None,
        "spec: Forbidden: spec is immutable after creation",
    )
    .await;
    c.ok(&[
        "patch",
        "pvc",
        "data",
        "-p",
        r#"{"spec":{"volumeName":"pv-1"}}"#,
    ])
    .await;
    patch_status(&c, "pvc", "data", r#"{"status":{"phase":"Bound"}}"#).await;
    c.ok(&["patch", "pvc", "data", "-p", grow]).await;
    refused(
        &c,
        &[
            "patch",
            "pvc",
            "data",
            "-p",
            r#"{"spec":{"volumeName":"pv-2"}}"#,
        ],
        None,
        "spec: Forbidden: spec is immutable after creation",
    )
    .await;
    refused(
        &c,
        &[
            "patch",
            "pvc",
            "data",
            "-p",
            r#"{"spec":{"accessModes":["ReadWriteMany"]}}"#,
        ],
        None,
        "spec: Forbidden: spec is immutable after creation",
    )
    .await;

    let db = c.json(&["get", "statefulset", "db"]).await;
    assert_eq!(db["spec"]["podManagementPolicy"], "OrderedReady");
    assert_eq!(
        db["spec"]["updateStrategy"]["rollingUpdate"]["partition"],
        0
    );
    assert_eq!(
        db["spec"]["volumeClaimTemplates"][0]["spec"]["volumeMode"],
        "Filesystem"
    );
    let (header, row) = table(&c.ok(&["get", "sts"]).await, "db");
    assert_eq!(header, ["NAME", "READY", "AGE"]);
    assert_eq!(words(&row)[..2], ["db", "0/3"]);
    let (header, row) = table(&c.ok(&["get", "ds"]).await, "agent");
    assert_eq!(
        header,
        [
            "NAME",
            "DESIRED",
            "CURRENT",
            "READY",
            "UP-TO-DATE",
            "AVAILABLE",
            "NODE",
            "SELECTOR",
            "AGE"
        ]
    );
    assert_eq!(
        words(&row)[..7],
        ["agent", "0", "0", "0", "0", "0", "kubernetes.io/os=linux"]
    );

    // kubectl's describers read each kind (and the pods, claims and events around it).
    for (what, line) in [
        ("job/once", "Pods Statuses:"),
        ("cronjob/tick", "Schedule:"),
        ("statefulset/db", "Volume Claims:"),
        ("daemonset/agent", "Desired Number of Nodes Scheduled: 0"),
        ("pvc/data", "StorageClass:"),
        ("storageclass/fast", "IsDefaultClass:"),
    ] {
        let out = c.ok(&["describe", what]).await;
        assert!(out.contains(line), "describe {what} lacks {line:?}:\n{out}");
    }

    // `get all` is the `all` category: workloads, not claims.
    let all = c.ok(&["get", "all", "-o", "name"]).await;
    for name in [
        "job.batch/once",
        "cronjob.batch/tick",
        "statefulset.apps/db",
        "daemonset.apps/agent",
    ] {
        assert!(
            all.lines().any(|l| l == name),
            "get all lacks {name}:\n{all}"
        );
    }
    assert!(!all.contains("persistentvolumeclaim"), "{all}");
    let resources = c.ok(&["api-resources", "--api-group=batch"]).await;
    assert!(
        resources
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()
                == ["cronjobs", "cj", "batch/v1", "true", "CronJob"]),
        "{resources}"
    );
}

const DRAINED_NODE: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: n1}
---
apiVersion: v1
kind: Pod
metadata: {name: web-0, labels: {app: web}}
spec: {nodeName: n1, containers: [{name: web, image: nginx}]}
---
apiVersion: v1
kind: Pod
metadata: {name: web-1, labels: {app: web}}
spec: {nodeName: n1, containers: [{name: web, image: nginx}]}
---
apiVersion: v1
kind: Pod
metadata: {name: starting, labels: {app: web}}
spec: {containers: [{name: web, image: nginx}]}
"#;

/// Sets the status of PodDisruptionBudget `web` as its controller would, observed at
/// generation 1.
async fn set_budget(c: &Cluster, allowed: i64) {
    let patch = format!(
        r#"{{"status":{{"observedGeneration":1,"disruptionsAllowed":{allowed},"currentHealthy":2,"desiredHealthy":1,"expectedPods":2}}}}"#
    );
    patch_status(c, "pdb", "web", &patch).await;
}

/// Merges `patch` into the status of `kind/name`, as its controller would.
async fn patch_status(c: &Cluster, kind: &str, name: &str, patch: &str) {
    c.ok(&[
        "patch",
        kind,
        name,
        "--subresource=status",
        "--type=merge",
        "-p",
        patch,
    ])
    .await;
}

/// Whether `pod` is gone or going: a pod on a node waits for its kubelet (none here) once
/// its grace period starts.
async fn evicted(c: &Cluster, pod: &str) -> bool {
    let out = c.kubectl(&["get", "pod", pod, "-o", "json"]).await;
    !out.ok
        || serde_json::from_str::<serde_json::Value>(&out.stdout).unwrap()["metadata"]
            ["deletionTimestamp"]
            .is_string()
}

/// POSTs an Eviction of `pod` with `kubectl create --raw`.
async fn evict(c: &Cluster, pod: &str) -> Out {
    let path = c.dir.path().join(format!("evict-{pod}.json"));
    std::fs::write(
        &path,
        format!(r#"{{"apiVersion":"policy/v1","kind":"Eviction","metadata":{{"name":"{pod}"}}}}"#),
    )
    .unwrap();
    let url = format!("/api/v1/namespaces/default/pods/{pod}/eviction");
    c.kubectl(&["create", "--raw", &url, "-f", path.to_str().unwrap()])
        .await
}

/// `kubectl drain` and raw evictions against a PodDisruptionBudget whose status is set by
/// hand (as the disruption controller would): refused with 429 while the budget allows no
/// disruption or has not seen its spec, allowed (and counted in the budget) once it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evictions_honour_pod_disruption_budgets() {
    let c = Cluster::start().await;
    c.ok_in(&["apply", "-f", "-"], DRAINED_NODE).await;
    for pod in ["web-0", "web-1"] {
        patch_status(
            &c,
            "pod",
            pod,
            r#"{"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}}"#,
        )
        .await;
    }
    c.ok(&[
        "create",
        "pdb",
        "web",
        "--selector=app=web",
        "--min-available=1",
    ])
    .await;
    set_budget(&c, 0).await;
    let described = c.ok(&["describe", "pdb", "web"]).await;
    assert!(described.contains("Allowed disruptions:  0"), "{described}");
    let (header, row) = table(&c.ok(&["get", "pdb"]).await, "web");
    assert_eq!(
        header,
        [
            "NAME",
            "MIN",
            "AVAILABLE",
            "MAX",
            "UNAVAILABLE",
            "ALLOWED",
            "DISRUPTIONS",
            "AGE"
        ]
    );
    assert_eq!(words(&row)[..4], ["web", "1", "N/A", "0"]);

    const REFUSED: &str = "Cannot evict pod as it would violate the pod's disruption budget.";

    // No disruption allowed: 429, and the pod stays.
    let out = evict(&c, "web-0").await;
    assert!(!out.ok && out.stderr.contains(REFUSED), "{}", out.stderr);
    assert!(
        out.stderr.contains("TooManyRequests") || out.stderr.contains("429"),
        "{}",
        out.stderr
    );
    c.ok(&["get", "pod", "web-0"]).await;
    // A pod not running yet costs the budget nothing.
    let out = evict(&c, "starting").await;
    assert!(out.ok, "{}", out.stderr);
    assert!(
        !c.kubectl(&["get", "pod", "starting"]).await.ok,
        "starting was evicted"
    );

    // kubectl drain retries on 429 until its timeout...
    let out = c
        .kubectl(&["drain", "n1", "--force", "--grace-period=0", "--timeout=3s"])
        .await;
    assert!(
        !out.ok && out.stderr.contains(REFUSED),
        "{}\n{}",
        out.stdout,
        out.stderr
    );

    // ... and evicts once the budget allows one disruption: the budget counts it.
    set_budget(&c, 1).await;
    let out = evict(&c, "web-0").await;
    assert!(out.ok, "{}", out.stderr);
    assert!(evicted(&c, "web-0").await, "web-0 was evicted");
    let pdb = c.json(&["get", "pdb", "web"]).await;
    assert_eq!(pdb["status"]["disruptionsAllowed"], 0);
    assert!(pdb["status"]["disruptedPods"]["web-0"].is_string(), "{pdb}");
    let condition = pdb["status"]["conditions"]
        .as_array()
        .and_then(|l| l.iter().find(|c| c["type"] == "DisruptionAllowed"))
        .unwrap_or_else(|| panic!("no DisruptionAllowed condition: {pdb}"));
    assert_eq!(
        (&condition["status"], &condition["reason"]),
        (
            &serde_json::json!("False"),
            &serde_json::json!("InsufficientPods")
        )
    );
    let out = evict(&c, "web-1").await;
    assert!(!out.ok && out.stderr.contains(REFUSED), "{}", out.stderr);

    // A budget whose spec changed since its controller last looked refuses too.
    c.ok(&[
        "patch",
        "pdb",
        "web",
        "--type=merge",
        "-p",
        r#"{"spec":{"minAvailable":0}}"#,
    ])
    .await;
    patch_status(&c, "pdb", "web", r#"{"status":{"disruptionsAllowed":5}}"#).await;
    let out = evict(&c, "web-1").await;
    assert!(!out.ok && out.stderr.contains(REFUSED), "{}", out.stderr);

    // Two budgets over one pod: kube does not choose between them.
    c.ok(&[
        "create",
        "pdb",
        "web-too",
        "--selector=app=web",
        "--max-unavailable=1",
    ])
    .await;
    let out = evict(&c, "web-1").await;
    assert!(
        !out.ok
            && out.stderr.contains(
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
            ),
        "{}",
        out.stderr
    );
    c.ok(&["delete", "pdb", "web-too"]).await;

    // Once the budget is observed again, drain goes through.
    patch_status(&c, "pdb", "web", r#"{"status":{"observedGeneration":2}}"#).await;
    let out = c
        .kubectl(&[
            "drain",
            "n1",
            "--force",
            "--grace-period=0",
            "--timeout=60s",
        ])
        .await;
    assert!(out.ok, "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("pod/web-1 evicted"), "{}", out.stdout);
    assert!(evicted(&c, "web-1").await, "web-1 was evicted");
}
