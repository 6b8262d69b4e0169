//! The install manifests as an administrator uses them: `deploy/install` rendered by kubectl's
//! kustomize is what `tandem install` applies; `tandem install --dry-run` prints what an
//! install then applies and changes nothing; and clusters installed with `kubectl apply -k`
//! alone (no `tandem install`) peer and offload, their controllers completing on first start
//! what the manifests leave to them (identity, cluster ID, pod CIDR).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::netlab;
use netlab::{hollow_lab, kubectl, ok, tandem, until};

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .canonicalize()
        .unwrap()
}

/// `v` with whole floats as integers: YAML and JSON spell a schema's `minimum: 0` either way.
fn normalized(v: Value) -> Value {
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => Value::from(f as i64),
            _ => Value::Number(n),
        },
        Value::Array(a) => Value::Array(a.into_iter().map(normalized).collect()),
        Value::Object(o) => Value::Object(o.into_iter().map(|(k, v)| (k, normalized(v))).collect()),
        other => other,
    }
}

/// Objects of a multi-document YAML stream (or a v1 List in JSON), by kind, namespace and name.
fn by_key(objects: Vec<Value>) -> BTreeMap<(String, String, String), Value> {
    objects
        .into_iter()
        .filter(|o| !o.is_null())
        .map(normalized)
        .map(|o| {
            let key = (
                o["kind"].as_str().unwrap_or_default().to_string(),
                o["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            );
            (key, o)
        })
        .collect()
}

fn yaml_documents(yaml: &str) -> Vec<Value> {
    serde_saphyr::from_multiple(yaml).expect("YAML documents")
}

/// Whether every field of `expected` is in `actual` with the same value (the server adds
/// defaults, status and metadata of its own).
fn contains(actual: &Value, expected: &Value) -> Result<(), String> {
    match (actual, expected) {
        (Value::Object(a), Value::Object(e)) => e.iter().try_for_each(|(k, v)| {
            contains(a.get(k).unwrap_or(&Value::Null), v).map_err(|why| format!("{k}.{why}"))
        }),
        (Value::Array(a), Value::Array(e)) if a.len() == e.len() => a
            .iter()
            .zip(e)
            .enumerate()
            .try_for_each(|(i, (a, e))| contains(a, e).map_err(|why| format!("[{i}]{why}"))),
        _ if actual == expected => Ok(()),
        _ => Err(format!(": {actual} where {expected} was applied")),
    }
}

#[test]
fn kustomize_renders_exactly_what_install_applies() {
    let rendered = ok(
        Command::new("kubectl")
            .arg("kustomize")
            .arg(deploy_dir().join("install"))
            .output()
            .expect("kubectl runs"),
        "kubectl kustomize deploy/install",
    );
    let rendered = by_key(yaml_documents(&rendered));
    let home = tempfile::tempdir().unwrap();
    let dry = ok(
        tandem(
            home.path(),
            &["install", "--dry-run", "--offline", "-o", "json"],
        ),
        "tandem install --dry-run --offline -o json",
    );
    let list: Value = serde_json::from_str(&dry).unwrap();
    assert_eq!(list["kind"], "List");
    let applied = by_key(list["items"].as_array().unwrap().clone());
    assert_eq!(
        rendered.keys().collect::<Vec<_>>(),
        applied.keys().collect::<Vec<_>>(),
        "the same objects"
    );
    for (key, object) in &applied {
        assert_eq!(&rendered[key], object, "{key:?}");
    }
    // What a real cluster needs of them: no caBundle for a re-apply to blank, no cluster ID
    // or pod CIDR baked in, the controller unprivileged.
    assert!(!dry.contains("caBundle"));
    let config = &applied[&(
        "ConfigMap".into(),
        "tandem-system".into(),
        "tandem-config".into(),
    )];
    assert!(config["data"]["podCIDR"].is_null(), "{config}");
    assert!(config["data"]["clusterID"].is_null(), "{config}");
    let deployment = &applied[&(
        "Deployment".into(),
        "tandem-system".into(),
        "tandem-controller".into(),
    )];
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "tandem-controller");
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["containers"][0]["securityContext"]["capabilities"]["drop"][0],
        "ALL"
    );

    // The flags go into the objects; bad ones are refused naming the setting.
    let dry = ok(
        tandem(
            home.path(),
            &[
                "install",
                "--dry-run",
                "--offline",
                "--cluster-id",
                "rome",
                "--pod-cidr",
                "10.244.0.0/16",
                "--image",
                "registry.example.org/tandem:1",
            ],
        ),
        "dry run with flags",
    );
    let objects = by_key(yaml_documents(&dry));
    let config = &objects[&(
        "ConfigMap".into(),
        "tandem-system".into(),
        "tandem-config".into(),
    )];
    assert_eq!(config["data"]["clusterID"], "rome");
    assert_eq!(config["data"]["podCIDR"], "10.244.0.0/16");
    assert_eq!(config["data"]["image"], "registry.example.org/tandem:1");
    for (flag, value, why) in [
        ("--pod-cidr", "10.244.0.1/16", "has host bits set"),
        ("--cluster-id", "Not_An_ID", "cluster ID"),
        ("--share-percent", "0", "between 1 and 100"),
    ] {
        let out = tandem(
            home.path(),
            &["install", "--dry-run", "--offline", flag, value],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(why), "{flag}: {err}");
    }
    // --offline alone (without --dry-run) is refused.
    let out = tandem(home.path(), &["install", "--offline"]);
    assert!(!out.status.success());
}

/// `helm template` of deploy/helm/tandem with `args`, by kind, namespace and name: the
/// release's objects (`hooks` false) or its hooks' (true).
fn helm_rendered(args: &[&str], hooks: bool) -> BTreeMap<(String, String, String), Value> {
    let out = Command::new("helm")
        .args(["template", "tandem"])
        .arg(deploy_dir().join("helm/tandem"))
        .args(["--include-crds", "--namespace", "default"])
        .args(args)
        .output()
        .expect("helm runs (.ci/install-deps installs it)");
    by_key(
        yaml_documents(&ok(out, "helm template"))
            .into_iter()
            .filter(|o| o["metadata"]["annotations"]["helm.sh/hook"].is_string() == hooks)
            .collect(),
    )
}

/// The release's objects `helm template` renders.
fn helm_template(args: &[&str]) -> BTreeMap<(String, String, String), Value> {
    helm_rendered(args, false)
}

fn dry_run(args: &[&str]) -> BTreeMap<(String, String, String), Value> {
    let home = tempfile::tempdir().unwrap();
    let out = ok(
        tandem(
            home.path(),
            &[
                &["install", "--dry-run", "--offline", "-o", "json"][..],
                args,
            ]
            .concat(),
        ),
        "tandem install --dry-run --offline",
    );
    let list: Value = serde_json::from_str(&out).unwrap();
    by_key(list["items"].as_array().unwrap().clone())
}

fn assert_same(
    rendered: &BTreeMap<(String, String, String), Value>,
    applied: &BTreeMap<(String, String, String), Value>,
) {
    assert_eq!(
        rendered.keys().collect::<Vec<_>>(),
        applied.keys().collect::<Vec<_>>(),
        "the same objects"
    );
    for (key, object) in applied {
        assert_eq!(&rendered[key], object, "{key:?}");
    }
}

#[test]
fn the_helm_chart_renders_what_install_applies_with_the_same_settings() {
    assert_same(&helm_template(&[]), &dry_run(&[]));
    assert_same(
        &helm_template(&[
            "--set",
            "clusterID=rome,podCIDR=10.244.0.0/16,externalCIDR=10.80.0.0/16,sharePercent=30,\
             networkFabric=true,networkExposure=pod-cidr,image.repository=registry.example.org/tandem,\
             image.tag=1,imagePullSecrets[0].name=regcred,imagePullSecrets[1].name=mirror",
        ]),
        &dry_run(&[
            "--cluster-id",
            "rome",
            "--pod-cidr",
            "10.244.0.0/16",
            "--external-cidr",
            "10.80.0.0/16",
            "--share-percent",
            "30",
            "--network-fabric",
            "--network-exposure",
            "pod-cidr",
            "--image",
            "registry.example.org/tandem:1",
            "--image-pull-secret",
            "regcred",
            "--image-pull-secret",
            "mirror",
        ]),
    );
    // The pull secrets reach the controller's pod and, through its settings, the pods it
    // creates (gateways, node agent).
    let with_secrets = helm_template(&["--set", "imagePullSecrets[0].name=regcred"]);
    let deployment = &with_secrets[&(
        "Deployment".into(),
        "tandem-system".into(),
        "tandem-controller".into(),
    )];
    assert_eq!(
        deployment["spec"]["template"]["spec"]["imagePullSecrets"],
        serde_json::json!([{"name": "regcred"}])
    );
    let settings = &with_secrets[&(
        "ConfigMap".into(),
        "tandem-system".into(),
        tandem_api::names::CONFIG_MAP.into(),
    )];
    assert_eq!(settings["data"]["imagePullSecrets"], "regcred");
    // The tag defaults to the chart's appVersion: the image `tandem install` uses.
    let image = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(image["image"], tandem_admin::install::default_image());
    assert!(image.get("imagePullPolicy").is_none(), "{image}");
    let pulled = helm_template(&["--set", "image.pullPolicy=Always"]);
    assert_eq!(
        pulled[&(
            "Deployment".into(),
            "tandem-system".into(),
            "tandem-controller".into(),
        )]["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"],
        "Always"
    );
    // The ServiceMonitor is optional, in the chart and as a kustomize component.
    let key = (
        "ServiceMonitor".to_string(),
        "tandem-system".to_string(),
        "tandem-controller".to_string(),
    );
    assert!(!helm_template(&[]).contains_key(&key));
    let monitored = helm_template(&["--set", "serviceMonitor.enabled=true"]);
    let expected = tandem_admin::install::service_monitor();
    assert_eq!(monitored[&key], expected);
    // kube-prometheus-stack's Prometheus selects ServiceMonitors by its release's label.
    let selected = helm_template(&[
        "--set",
        "serviceMonitor.enabled=true,serviceMonitor.labels.release=kube-prometheus-stack",
    ]);
    let mut labelled = expected.clone();
    labelled["metadata"]["labels"]["release"] = "kube-prometheus-stack".into();
    assert_eq!(selected[&key], labelled);
    let overlay = tempfile::tempdir().unwrap();
    let dir = netlab::install_overlay(&overlay.path().join("o"), None);
    let kustomization = std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
    let base = kustomization
        .lines()
        .nth(1)
        .unwrap()
        .trim_start_matches("- ");
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!("{kustomization}components:\n- {base}/servicemonitor\n"),
    )
    .unwrap();
    let rendered = by_key(yaml_documents(&ok(
        Command::new("kubectl")
            .arg("kustomize")
            .arg(&dir)
            .output()
            .unwrap(),
        "kubectl kustomize with the servicemonitor component",
    )));
    assert_eq!(rendered[&key], expected);
    // The post-delete hook: a Job of the same image, with the same pull secrets, running
    // `tandem cleanup` under a ServiceAccount that may only get and patch CoreDNS's ConfigMap.
    let hooks = helm_rendered(&["--set", "imagePullSecrets[0].name=regcred"], true);
    let job = &hooks[&("Job".into(), "default".into(), "tandem-cleanup".into())];
    assert_eq!(
        job["metadata"]["annotations"]["helm.sh/hook"],
        "post-delete"
    );
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(
        pod["containers"][0]["image"],
        tandem_admin::install::default_image()
    );
    assert_eq!(pod["containers"][0]["args"], serde_json::json!(["cleanup"]));
    assert_eq!(
        pod["imagePullSecrets"],
        serde_json::json!([{"name": "regcred"}])
    );
    let role = &hooks[&("Role".into(), "kube-system".into(), "tandem-cleanup".into())];
    assert_eq!(
        role["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["configmaps"],
                            "resourceNames": ["coredns"], "verbs": ["get", "patch"]}])
    );
    // Resources are the chart's own setting.
    let custom = helm_template(&["--set", "resources.requests.cpu=250m"]);
    let deployment = &custom[&(
        "Deployment".into(),
        "tandem-system".into(),
        "tandem-controller".into(),
    )];
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"],
        "250m"
    );
}

#[test]
fn dry_run_prints_what_install_then_applies_and_changes_nothing() {
    let home = tempfile::tempdir().unwrap();
    let lab = hollow_lab(home.path(), "1");
    let kc = lab.kubeconfig.clone();
    let args = [
        "--kubeconfig",
        &kc,
        "--context",
        "lab-1",
        "--cluster-id",
        "rome",
    ];
    let dry = ok(
        tandem(
            home.path(),
            &[&["install", "--dry-run", "-o", "yaml"][..], &args].concat(),
        ),
        "tandem install --dry-run -o yaml",
    );
    let printed = by_key(yaml_documents(&dry));
    // Resolved against the cluster: the pod CIDR detected from its Node.
    let config = &printed[&(
        "ConfigMap".into(),
        "tandem-system".into(),
        "tandem-config".into(),
    )];
    assert!(
        config["data"]["podCIDR"]
            .as_str()
            .is_some_and(|c| c.contains('/')),
        "{config}"
    );
    // Nothing changed.
    let out = kubectl(&lab, "lab-1", &["get", "namespace", "tandem-system"]);
    assert!(!out.status.success(), "a dry run created tandem-system");
    let out = kubectl(&lab, "lab-1", &["get", "crd", "peerings.tandem.dev"]);
    assert!(!out.status.success(), "a dry run created a CRD");

    ok(
        tandem(home.path(), &[&["install"][..], &args].concat()),
        "tandem install",
    );
    for ((kind, namespace, name), object) in &printed {
        let mut get = vec!["get", kind.as_str(), name.as_str(), "-o", "json"];
        if !namespace.is_empty() {
            get.extend(["-n", namespace.as_str()]);
        }
        let live: Value = normalized(
            serde_json::from_str(&ok(
                kubectl(&lab, "lab-1", &get),
                &format!("get {kind} {name}"),
            ))
            .unwrap(),
        );
        if let Err(why) = contains(&live, object) {
            panic!("{kind} {namespace}/{name} differs from the dry run at {why}");
        }
    }
    // And the same dry run again prints the same objects (the stored settings are kept).
    let again = ok(
        tandem(
            home.path(),
            &[&["install", "--dry-run", "-o", "yaml"][..], &args].concat(),
        ),
        "the dry run again",
    );
    assert_eq!(by_key(yaml_documents(&again)), printed);
}

#[test]
fn clusters_installed_with_kubectl_apply_k_peer_and_offload() {
    let home = tempfile::tempdir().unwrap();
    let lab = hollow_lab(home.path(), "2");
    let kc = lab.kubeconfig.clone();
    // rome names its ID in an overlay; the provider applies deploy/install as it is.
    let rome = netlab::install_overlay(&home.path().join("rome"), Some("rome"));
    for (ctx, dir) in [("lab-1", rome), ("lab-2", deploy_dir().join("install"))] {
        let out = ok(
            kubectl(&lab, ctx, &["apply", "-k", dir.to_str().unwrap()]),
            &format!("kubectl apply -k on {ctx}"),
        );
        assert!(
            out.contains("deployment.apps/tandem-controller created"),
            "{out}"
        );
    }
    // Each controller completes what the manifests left to it: the identity (with the
    // overlay's ID, or a generated one) and the pod CIDR, detected from the Nodes.
    let status = |ctx: &str| -> Option<Value> {
        let out = tandem(
            home.path(),
            &[
                "status",
                "-o",
                "json",
                "--kubeconfig",
                &kc,
                "--context",
                ctx,
            ],
        );
        serde_json::from_slice(&out.stdout).ok()
    };
    let rome_status = until("rome's identity", Duration::from_secs(60), || {
        status("lab-1")
    });
    assert_eq!(rome_status["clusterID"], "rome");
    let provider = until("the provider's identity", Duration::from_secs(60), || {
        status("lab-2")
    });
    let provider_id = provider["clusterID"].as_str().unwrap().to_string();
    assert!(provider_id.starts_with("cluster-"), "{provider}");
    for ctx in ["lab-1", "lab-2"] {
        let cidr = until("the detected pod CIDR", Duration::from_secs(60), || {
            let out = kubectl(
                &lab,
                ctx,
                &[
                    "-n",
                    "tandem-system",
                    "get",
                    "configmap",
                    "tandem-config",
                    "-o",
                    "jsonpath={.data.podCIDR}",
                ],
            );
            let cidr = String::from_utf8_lossy(&out.stdout).into_owned();
            (!cidr.is_empty()).then_some(cidr)
        });
        let node_cidr = ok(
            kubectl(
                &lab,
                ctx,
                &["get", "nodes", "-o", "jsonpath={.items[0].spec.podCIDR}"],
            ),
            "the node's podCIDR",
        );
        let net: ipnet::IpNet = cidr.parse().unwrap();
        assert!(
            net.contains(&node_cidr.parse::<ipnet::IpNet>().unwrap()),
            "{cidr} {node_cidr}"
        );
    }
    // Re-applying the manifests keeps what the controller stored.
    ok(
        kubectl(
            &lab,
            "lab-2",
            &[
                "apply",
                "-k",
                deploy_dir().join("install").to_str().unwrap(),
            ],
        ),
        "kubectl apply -k again",
    );
    let after = status("lab-2").unwrap();
    assert_eq!(after["clusterID"], provider_id.as_str());

    // Peering by invite, then an offloaded pod running in the provider.
    netlab::peer_as_invited(home.path(), &kc);
    until("the virtual node Ready", Duration::from_secs(60), || {
        let v = status("lab-1")?;
        (v["providers"][0]["virtualNodeReady"] == true
            && v["providers"][0]["clusterID"] == provider_id.as_str())
        .then_some(())
    });
    netlab::offload_remote(home.path(), &lab, "shop");
    let twin = "shop-rome".to_string();
    until("the twin namespace", Duration::from_secs(60), || {
        kubectl(&lab, "lab-2", &["get", "namespace", &twin])
            .status
            .success()
            .then_some(())
    });
    ok(
        kubectl(
            &lab,
            "lab-1",
            &[
                "-n",
                "shop",
                "run",
                "web",
                "--image=registry.k8s.io/pause:3.9",
            ],
        ),
        "kubectl run",
    );
    until(
        "the offloaded pod Running in both clusters",
        Duration::from_secs(60),
        || {
            let pod: Value = serde_json::from_slice(
                &kubectl(
                    &lab,
                    "lab-1",
                    &["-n", "shop", "get", "pod", "web", "-o", "json"],
                )
                .stdout,
            )
            .ok()?;
            let twins: Value = serde_json::from_slice(
                &kubectl(&lab, "lab-2", &["-n", &twin, "get", "pods", "-o", "json"]).stdout,
            )
            .ok()?;
            (pod["status"]["phase"] == "Running"
                && pod["spec"]["nodeName"] == format!("tandem-{provider_id}")
                && twins["items"]
                    .as_array()?
                    .iter()
                    .any(|p| p["status"]["phase"] == "Running"))
            .then_some(())
        },
    );
}
