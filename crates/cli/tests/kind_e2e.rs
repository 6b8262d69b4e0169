//! End to end in the lab's kind profile, as README's "Try it on kind" runs it, with no flag
//! beyond the cluster IDs and Tandem's image loaded onto the nodes: Helm on one cluster,
//! kustomize on the other, an invite whose endpoint is derived (the kubeconfig points at a
//! loopback address only the host reaches), the tunnel to the gateway's node address (kind has no
//! load balancer), a provider's export reached by its clusterset.local name, a namespace
//! offloaded and its pod reached on the provider, `tandem check` all ✓, then `helm uninstall` and `tandem uninstall` leaving nothing of Tandem's but the
//! CRDs Helm never deletes.

use std::time::Duration;

use crate::netlab;
use netlab::{json, kubectl, ok, tandem, until};

/// Every name of `kind` in `ctx` (cluster-scoped, or across namespaces).
fn names(lab: &netlab::Lab, ctx: &str, kind: &str) -> Vec<String> {
    let list = json(lab, ctx, &["get", kind, "-A"]);
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o["metadata"]["name"].as_str().map(String::from))
        .collect()
}

/// What of Tandem's is left in `ctx`: namespaces, cluster-wide RBAC, webhooks, its objects
/// in kube-system and the CoreDNS stub.
fn leftovers(lab: &netlab::Lab, ctx: &str) -> Vec<String> {
    let mut left = Vec::new();
    for kind in [
        "namespaces",
        "clusterroles",
        "clusterrolebindings",
        "mutatingwebhookconfigurations",
        "validatingwebhookconfigurations",
        "priorityclasses",
        "storageclasses",
        "roles",
        "rolebindings",
        "serviceaccounts",
        "jobs",
        "nodes",
    ] {
        for name in names(lab, ctx, kind) {
            if name.contains("tandem") {
                left.push(format!("{kind}/{name}"));
            }
        }
    }
    if netlab::corefile(lab, ctx).contains("clusterset.local") {
        left.push("the clusterset.local stub in CoreDNS's Corefile".into());
    }
    left
}

#[test]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
fn on_kind_helm_and_kustomize_installs_peer_pass_check_and_uninstall_to_nothing() {
    tandem_testing::needs_root();
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let lab = netlab::lab_up_as(h, "lab", "2", "1", "kind");
    let kc = lab.kubeconfig.clone();
    // kind load docker-image ghcr.io/tandem-dev/tandem:0.1.0 (both clusters)
    netlab::load_tandem_image(h, "lab");

    // lab-1 (rome): Helm.
    let chart = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/tandem");
    let helm = |args: &[&str]| {
        std::process::Command::new("helm")
            .args(["--kubeconfig", &kc, "--kube-context", "lab-1"])
            .args(args)
            .output()
            .expect("helm runs (.ci/install-deps installs it)")
    };
    ok(
        helm(&[
            "install",
            "tandem",
            &chart.to_string_lossy(),
            "--set",
            "clusterID=rome",
            "--wait",
            "--timeout",
            "3m",
        ]),
        "helm install",
    );
    // lab-2 (milan): kustomize, an overlay setting the cluster ID.
    let overlay = netlab::install_overlay(&h.join("overlay"), Some("milan"));
    ok(
        kubectl(&lab, "lab-2", &["apply", "-k", &overlay.to_string_lossy()]),
        "kubectl apply -k",
    );
    ok(
        kubectl(
            &lab,
            "lab-2",
            &[
                "-n",
                "tandem-system",
                "rollout",
                "status",
                "deployment/tandem-controller",
                "--timeout=3m",
            ],
        ),
        "rollout status on lab-2",
    );

    // The invite, on the provider: the kubeconfig's server is a loopback address, so the
    // endpoint is derived, and said.
    let out = tandem(h, &["invite", "--kubeconfig", &kc, "--context", "lab-2"]);
    let note = String::from_utf8_lossy(&out.stderr).into_owned();
    let invite = ok(out, "invite");
    assert!(
        note.contains("is a loopback address; the invite names"),
        "{note}"
    );
    let out = tandem(
        h,
        &[
            "peer",
            invite.trim(),
            "--kubeconfig",
            &kc,
            "--context",
            "lab-1",
        ],
    );
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    ok(out, "peer");
    assert!(said.contains("✓ the virtual node takes pods"), "{said}");
    // No load balancer answers on kind: the gateway's LoadBalancer Service stays pending, and
    // (`auto`) rome reaches milan's gateway at its node's address, on the node network.
    let svc = json(
        &lab,
        "lab-2",
        &[
            "-n",
            "tandem-system",
            "get",
            "service",
            "tandem-gateway-rome",
        ],
    );
    assert!(svc["status"]["loadBalancer"]["ingress"].is_null(), "{svc}");
    let gateway = json(
        &lab,
        "lab-2",
        &[
            "-n",
            "tandem-system",
            "get",
            "pods",
            "-l",
            "app.kubernetes.io/name=tandem-gateway",
        ],
    );
    let node_ip = gateway["items"][0]["status"]["hostIP"]
        .as_str()
        .unwrap()
        .to_string();
    let peering = json(&lab, "lab-1", &["get", "peering", "milan"]);
    let endpoint = peering["status"]["network"]["remoteGatewayEndpoint"]
        .as_str()
        .unwrap_or_default();
    assert!(
        endpoint.starts_with(&format!("{node_ip}:")),
        "{endpoint} vs node {node_ip}"
    );

    // milan exports demo/hello; rome opts its demo in for milan's exports and reaches it by
    // its clusterset.local name.
    for ctx in ["lab-1", "lab-2"] {
        ok(
            kubectl(&lab, ctx, &["create", "namespace", "demo"]),
            "namespace demo",
        );
    }
    ok(
        kubectl(
            &lab,
            "lab-2",
            &[
                "-n",
                "demo",
                "create",
                "deployment",
                "hello",
                "--image=tandem.dev/echo",
                "--port=8080",
            ],
        ),
        "deployment hello",
    );
    ok(
        kubectl(
            &lab,
            "lab-2",
            &[
                "-n",
                "demo",
                "expose",
                "deployment",
                "hello",
                "--port=80",
                "--target-port=8080",
            ],
        ),
        "service hello",
    );
    ok(
        tandem(
            h,
            &[
                "export",
                "service",
                "demo/hello",
                "--kubeconfig",
                &kc,
                "--context",
                "lab-2",
            ],
        ),
        "export",
    );
    ok(
        kubectl(
            &lab,
            "lab-1",
            &[
                "annotate",
                "namespace",
                "demo",
                "mcs.tandem.dev/import-from=milan",
            ],
        ),
        "opt demo in",
    );
    netlab::run_pod(&lab, "lab-1", "demo", "probe", "probe", None);
    let answer = until(
        "hello.demo.svc.clusterset.local answering from rome",
        Duration::from_secs(90),
        || {
            netlab::probe_fetch_in(
                &lab,
                "lab-1",
                "demo",
                "probe",
                "http://hello.demo.svc.clusterset.local/",
            )
        },
    );
    assert_eq!(answer["cluster"], "lab-2", "{answer}");

    // rome offloads demo to milan: a pod created now runs there, and rome's probe reaches it
    // through the tunnel.
    ok(
        tandem(
            h,
            &[
                "offload",
                "namespace",
                "demo",
                "--pod-offloading-strategy",
                "Remote",
                "--kubeconfig",
                &kc,
                "--context",
                "lab-1",
            ],
        ),
        "offload",
    );
    let web = netlab::run_pod(&lab, "lab-1", "demo", "web", "echo", None);
    let pod = json(&lab, "lab-1", &["-n", "demo", "get", "pod", "web"]);
    assert_eq!(pod["spec"]["nodeName"], "tandem-milan", "{pod}");
    let answer = until(
        "the offloaded echo answering rome's probe",
        Duration::from_secs(90),
        || {
            netlab::probe_fetch_in(
                &lab,
                "lab-1",
                "demo",
                "probe",
                &format!("http://{web}:8080/"),
            )
        },
    );
    assert_eq!(answer["cluster"], "lab-2", "{answer}");

    // The connectivity test, from the consumer alone.
    netlab::check_passes(h, &kc, "lab-1");

    // Undo it all: unoffload, unpeer, helm uninstall on rome, tandem uninstall on milan.
    ok(
        tandem(
            h,
            &[
                "-n",
                "demo",
                "unoffload",
                "namespace",
                "--kubeconfig",
                &kc,
                "--context",
                "lab-1",
            ],
        ),
        "unoffload",
    );
    ok(
        tandem(
            h,
            &["unpeer", "milan", "--kubeconfig", &kc, "--context", "lab-1"],
        ),
        "unpeer",
    );
    for ctx in ["lab-1", "lab-2"] {
        ok(
            kubectl(&lab, ctx, &["delete", "namespace", "demo"]),
            "delete demo",
        );
    }
    ok(
        helm(&["uninstall", "tandem", "--wait", "--timeout", "3m"]),
        "helm uninstall",
    );
    ok(
        tandem(h, &["uninstall", "--kubeconfig", &kc, "--context", "lab-2"]),
        "tandem uninstall",
    );
    for ctx in ["lab-1", "lab-2"] {
        until(
            &format!("nothing of Tandem's left in {ctx}"),
            Duration::from_secs(90),
            || {
                let left = leftovers(&lab, ctx);
                left.is_empty().then_some(()).ok_or(left).ok()
            },
        );
    }
    // Helm leaves a chart's CRDs (crds/) by design; `tandem uninstall` removes them.
    let crds = |ctx| {
        names(&lab, ctx, "customresourcedefinitions")
            .into_iter()
            .filter(|n| n.ends_with(".tandem.dev"))
            .count()
    };
    assert!(crds("lab-1") > 0);
    assert_eq!(crds("lab-2"), 0);
}
