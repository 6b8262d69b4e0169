//! `tandem check` from the consumer, with its kubeconfig only: every path of a working peering
//! ✓ in network mode, and where the fabric cannot run, every path ✗ with the reason and a
//! failing exit; the check's namespace is removed either way.

use std::time::Duration;

use serde_json::Value;

use crate::netlab;
use netlab::{json, ok, tandem, until};

/// The paths `tandem check` reports, in its order.
const PATHS: [&str; 7] = [
    "pod → offloaded pod",
    "Service (ClusterIP)",
    "Service (clusterset.local)",
    "node → offloaded pod",
    "offloaded pod → pod",
    "offloaded pod → Service",
    "tunnel",
];

fn paths(report: &Value) -> Vec<(String, bool, String)> {
    report["paths"]
        .as_array()
        .unwrap_or_else(|| panic!("no paths: {report}"))
        .iter()
        .map(|p| {
            (
                p["path"].as_str().unwrap().to_string(),
                p["ok"].as_bool().unwrap(),
                p["detail"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The check's namespaces in `ctx`.
fn names_of_checks(lab: &netlab::Lab, ctx: &str) -> Vec<String> {
    let list = json(lab, ctx, &["get", "namespaces"]);
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["metadata"]["name"].as_str())
        .filter(|n| n.starts_with("connectivity-check-"))
        .map(String::from)
        .collect()
}

/// No namespace of the check is left in `ctx`.
fn no_check_namespace(lab: &netlab::Lab, ctx: &str) {
    until(
        &format!("no connectivity-check-* namespace in {ctx}"),
        Duration::from_secs(60),
        || names_of_checks(lab, ctx).is_empty().then_some(()),
    );
}

#[test]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
fn check_passes_every_path_of_a_working_peering_and_leaves_nothing() {
    tandem_testing::needs_root();
    let home = tempfile::tempdir().unwrap();
    let lab = netlab::lab_up(home.path(), "lab", "2");
    let kc = lab.kubeconfig.clone();
    netlab::install_with_fabric(home.path(), &kc, &[("lab-1", "rome"), ("lab-2", "milan")]);
    netlab::peer_with(home.path(), &kc, "lab-1", 2);
    let report = netlab::check_passes(home.path(), &kc, "lab-1");
    let got = paths(&report);
    assert_eq!(
        got.iter().map(|p| p.0.as_str()).collect::<Vec<_>>(),
        PATHS,
        "{report}"
    );
    assert_eq!(report["peer"], "milan");
    // The offloaded server answered from the provider, the local one from here.
    let detail = |name: &str| &got.iter().find(|p| p.0 == name).unwrap().2;
    assert!(
        detail("pod → offloaded pod").contains("server-remote answered"),
        "{report}"
    );
    assert!(
        detail("offloaded pod → pod").contains("server-local answered"),
        "{report}"
    );
    assert!(detail("tunnel").starts_with("connected"), "{report}");
    no_check_namespace(&lab, "lab-1");
    no_check_namespace(&lab, "lab-2");
    // The table says the same to a person.
    let table = ok(
        tandem(
            home.path(),
            &["check", "--kubeconfig", &kc, "--context", "lab-1"],
        ),
        "tandem check",
    );
    for path in PATHS {
        assert!(table.contains(&format!("✓ {path}")), "{table}");
    }
    // Ctrl-C during the check: it stops, says so, and its namespace still goes.
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["check", "--kubeconfig", &kc, "--context", "lab-1"])
        .env("HOME", home.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    until("the check's namespace", Duration::from_secs(60), || {
        names_of_checks(&lab, "lab-1").first().cloned()
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("removed") && stderr.contains("error: interrupted"),
        "{stderr}"
    );
    no_check_namespace(&lab, "lab-1");
    // milan's admin now allows rome only same-name twins: the check's offloading fails, and
    // every path says why at once (not after the timeout), the tunnel still ✓.
    ok(
        netlab::kubectl(
            &lab,
            "lab-2",
            &[
                "-n",
                "tandem-tenant-rome",
                "patch",
                "tenant",
                "rome",
                "--type=merge",
                "-p",
                r#"{"spec":{"allowedNamespaceMappingStrategies":["EnforceSameName"]}}"#,
            ],
        ),
        "restrict rome's twins",
    );
    let out = tandem(
        home.path(),
        &[
            "check",
            "--kubeconfig",
            &kc,
            "--context",
            "lab-1",
            "--timeout",
            "2m",
        ],
    );
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(!out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains("✗ pod → offloaded pod")
            && stdout.contains("probe server server-remote cannot run on the provider: offloading the namespace failed (milan: ")
            && stdout.contains("not allowed"),
        "{stdout}"
    );
    assert!(stdout.contains("✓ tunnel"), "{stdout}");
    assert!(stderr.contains("6 of 7 paths to milan failed"), "{stderr}");
    no_check_namespace(&lab, "lab-1");
}

/// A hollow lab's pods have no network, so the fabric stays off: every path is ✗ with that
/// reason, at once, and the command fails.
#[test]
fn without_the_fabric_every_path_fails_with_the_reason() {
    let home = tempfile::tempdir().unwrap();
    let lab = netlab::hollow_lab(home.path(), "2");
    let kc = lab.kubeconfig.clone();
    for (ctx, id) in [("lab-1", "rome"), ("lab-2", "milan")] {
        ok(
            tandem(
                home.path(),
                &[
                    "install",
                    "--kubeconfig",
                    &kc,
                    "--context",
                    ctx,
                    "--cluster-id",
                    id,
                    "--wait=false",
                ],
            ),
            "install",
        );
    }
    // A hollow lab's controllers run on the host: the invite's endpoint is the kubeconfig's.
    netlab::peer_as_invited(home.path(), &kc);
    let out = tandem(
        home.path(),
        &["check", "--kubeconfig", &kc, "--context", "lab-1"],
    );
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(!out.status.success(), "{stdout}{stderr}");
    for path in PATHS {
        assert!(stdout.contains(&format!("✗ {path}")), "{stdout}");
    }
    assert!(stdout.contains("hollow"), "{stdout}");
    assert!(stderr.contains("7 of 7 paths to milan failed"), "{stderr}");
    no_check_namespace(&lab, "lab-1");
}
