//! `tandem uninstall` on both clusters of a peered pair, as an administrator runs it: refused
//! while peered, then with --force it unpeers and leaves no Tandem object, webhook, finalizer,
//! label or CRD behind — and pods can still be created.

use std::time::Duration;

use serde_json::Value;

use crate::netlab;
use netlab::{hollow_lab, kubectl, ok, rome_offloads_shop_to_milan, tandem, until};

fn json_of(out: std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

#[test]
fn uninstall_on_both_sides_of_a_peering_leaves_nothing_and_pods_still_start() {
    let home = tempfile::tempdir().unwrap();
    let lab = hollow_lab(home.path(), "2");
    let kc = lab.kubeconfig.clone();
    let on = |ctx: &'static str| ["--kubeconfig", kc.as_str(), "--context", ctx];
    rome_offloads_shop_to_milan(home.path(), &lab);
    until("the twin namespace", Duration::from_secs(60), || {
        kubectl(&lab, "lab-2", &["get", "namespace", "shop-rome"])
            .status
            .success()
            .then_some(())
    });
    ok(
        kubectl(
            &lab,
            "lab-1",
            &["-n", "shop", "run", "web", "--image=nginx"],
        ),
        "kubectl run",
    );
    until("the offloaded pod Running", Duration::from_secs(60), || {
        let pod = json_of(kubectl(
            &lab,
            "lab-1",
            &["-n", "shop", "get", "pod", "web", "-o", "json"],
        ));
        (pod["status"]["phase"] == "Running" && pod["spec"]["nodeName"] == "tandem-milan")
            .then_some(())
    });

    // Peered: refused on both sides, naming the peer, and nothing is touched.
    for (ctx, peer) in [("lab-1", "milan"), ("lab-2", "rome")] {
        let out = tandem(home.path(), &[&["uninstall"][..], &on(ctx)].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(peer) && err.contains("--force"),
            "{ctx}: {err}"
        );
        ok(
            kubectl(&lab, ctx, &["get", "crd", "peerings.tandem.dev"]),
            "the CRDs are still there",
        );
    }

    // The consumer with --force: it unpeers (on both sides), then goes.
    let out = ok(
        tandem(
            home.path(),
            &[&["uninstall", "--force"][..], &on("lab-1")].concat(),
        ),
        "uninstall --force on rome",
    );
    assert!(out.is_empty() || !out.contains("kept: namespace"), "{out}");
    // The provider has no peer left: a plain uninstall.
    ok(
        tandem(home.path(), &[&["uninstall"][..], &on("lab-2")].concat()),
        "uninstall on milan",
    );

    for ctx in ["lab-1", "lab-2"] {
        let crds = ok(kubectl(&lab, ctx, &["get", "crd", "-o", "name"]), "crds");
        assert!(
            !crds.contains("tandem.dev") && !crds.contains("multicluster.x-k8s.io"),
            "{ctx}: {crds}"
        );
        let hooks = ok(
            kubectl(
                &lab,
                ctx,
                &[
                    "get",
                    "mutatingwebhookconfigurations,validatingwebhookconfigurations",
                    "-o",
                    "name",
                ],
            ),
            "webhooks",
        );
        assert!(hooks.trim().is_empty(), "{ctx}: {hooks}");
        let owned = ok(
            kubectl(
                &lab,
                ctx,
                &[
                    "get",
                    "namespaces,nodes,clusterroles,clusterrolebindings,roles,rolebindings,\
                     deployments,daemonsets,services,endpointslices,serviceaccounts,configmaps,\
                     secrets,leases,storageclasses,certificatesigningrequests,pods,\
                     priorityclasses,poddisruptionbudgets",
                    "-A",
                    "-l",
                    "app.kubernetes.io/managed-by=tandem",
                    "-o",
                    "name",
                ],
            ),
            "Tandem's objects",
        );
        assert!(owned.trim().is_empty(), "{ctx} keeps: {owned}");
        let nodes = ok(kubectl(&lab, ctx, &["get", "nodes", "-o", "name"]), "nodes");
        assert!(!nodes.contains("tandem-"), "{ctx}: {nodes}");
        // No finalizer and no label of Tandem's on anything left.
        let everything = json_of(kubectl(
            &lab,
            ctx,
            &[
                "get",
                "namespaces,pods,persistentvolumeclaims,services",
                "-A",
                "-o",
                "json",
            ],
        ));
        for item in everything["items"].as_array().unwrap() {
            let meta = &item["metadata"];
            // The lab's own mark on a hollow cluster's kube-system is not Tandem's.
            let mut labels = meta["labels"].clone();
            if let Some(l) = labels.as_object_mut() {
                l.remove(tandem_api::names::HOLLOW_CLUSTER_LABEL);
            }
            let text = format!("{}{labels}", meta["finalizers"]);
            assert!(
                !text.contains("tandem.dev"),
                "{ctx}: {} {} keeps {text}",
                item["kind"],
                meta["name"]
            );
        }
        // (A hollow lab has no CoreDNS: the stub domain's removal is a unit test of install.)
        let corefile = netlab::corefile(&lab, ctx);
        assert!(!corefile.contains("tandem"), "{ctx}: {corefile}");
    }
    // Pods are created (no webhook in the way) and run, in the namespace that was offloaded.
    ok(
        kubectl(
            &lab,
            "lab-1",
            &["-n", "shop", "run", "after", "--image=nginx"],
        ),
        "a pod after the uninstall",
    );
    until("the new pod Running", Duration::from_secs(60), || {
        let pod = json_of(kubectl(
            &lab,
            "lab-1",
            &["-n", "shop", "get", "pod", "after", "-o", "json"],
        ));
        (pod["status"]["phase"] == "Running").then_some(())
    });
    // The offloaded pod's node is gone with the peering; the pod with it.
    let web = kubectl(&lab, "lab-1", &["-n", "shop", "get", "pod", "web"]);
    assert!(
        !web.status.success(),
        "the pod bound to the virtual node is gone"
    );
    // Uninstalling again finds nothing to do.
    ok(
        tandem(home.path(), &[&["uninstall"][..], &on("lab-1")].concat()),
        "uninstall again",
    );
}
