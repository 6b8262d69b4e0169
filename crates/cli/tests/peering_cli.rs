//! The peering commands as an administrator runs them: `tandem lab up` (which hosts Tandem's
//! controller in-process once installed), `tandem install` on each cluster, `tandem invite` on
//! the provider, `tandem peer` on the consumer, `tandem status`, `kubectl tandem`, and
//! `tandem demo` from scratch.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

struct Background(Child);

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn tandem(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(args)
        .env("HOME", dir)
        .output()
        .expect("tandem runs")
}

/// `tandem ARGS -o json`, which must succeed: what it printed.
fn tandem_json(dir: &Path, args: &[&str]) -> serde_json::Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    let out = tandem(dir, &all);
    let (json, err) = text(&out);
    assert!(out.status.success(), "tandem {args:?}: {err}");
    serde_json::from_str(&json).unwrap_or_else(|e| panic!("tandem {args:?}: {e}: {json}"))
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn install_invite_peer_status_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let _lab = Background(
        Command::new(env!("CARGO_BIN_EXE_tandem"))
            .args(["lab", "up", "--clusters", "2", "--nodes", "1", "--dir"])
            .arg(dir.path())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !kubeconfig.exists() {
        assert!(
            Instant::now() < deadline,
            "tandem lab up wrote no kubeconfig"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let kc = kubeconfig.to_str().unwrap();

    for (ctx, id) in [("lab-1", "rome"), ("lab-2", "milan")] {
        let out = tandem(
            dir.path(),
            &[
                "install",
                "--kubeconfig",
                kc,
                "--context",
                ctx,
                "--cluster-id",
                id,
            ],
        );
        let (_, err) = text(&out);
        assert!(out.status.success(), "install on {ctx}: {err}");
    }

    // The invite is the only thing on stdout, so it can be captured by a script.
    let out = tandem(
        dir.path(),
        &[
            "invite",
            "--kubeconfig",
            kc,
            "--context",
            "lab-2",
            "--ttl",
            "10m",
        ],
    );
    let (invite, err) = text(&out);
    assert!(out.status.success(), "invite: {err}");
    let invite = invite.trim().to_string();
    assert!(
        invite.starts_with("tandem-invite-v1.") && !invite.contains('\n'),
        "{invite:?}"
    );

    // The same invite as a provider speaking a newer peering protocol would write it: refused
    // before anything is sent, naming both versions (the token stays unused, as the peering
    // below shows).
    let mut newer = tandem_core::invite::PeeringInvite::decode(&invite).unwrap();
    newer.protocol_version = tandem_core::protocol::VERSION + 98;
    let out = tandem(
        dir.path(),
        &[
            "peer",
            &newer.encode(),
            "--kubeconfig",
            kc,
            "--context",
            "lab-1",
        ],
    );
    let (_, err) = text(&out);
    assert!(!out.status.success(), "a v99 invite was accepted: {err}");
    assert!(
        err.contains(&format!(
            "the provider speaks peering protocol v99, and this tandem speaks v{}",
            tandem_core::protocol::VERSION
        )),
        "{err}"
    );

    let out = tandem(
        dir.path(),
        &["peer", &invite, "--kubeconfig", kc, "--context", "lab-1"],
    );
    let (_, err) = text(&out);
    assert!(out.status.success(), "peer: {err}");
    assert!(err.contains("established"), "{err}");
    // The fabric is on by default, but a hollow lab's pods have no network: peer says that no
    // traffic will cross, and why.
    assert!(
        err.contains("warning: the network fabric is off: this is a hollow lab cluster"),
        "{err}"
    );

    // The same invite again: refused, naming the cause.
    let out = tandem(
        dir.path(),
        &["peer", &invite, "--kubeconfig", kc, "--context", "lab-1"],
    );
    assert!(!out.status.success());

    // `tandem status -o json` on both sides, and as a kubectl plugin.
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        let v = tandem_json(
            dir.path(),
            &["status", "--kubeconfig", kc, "--context", "lab-1"],
        );
        if v["providers"][0]["virtualNodeReady"] == true {
            break v;
        }
        assert!(Instant::now() < deadline, "virtual node never Ready: {v}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(status["clusterID"], "rome");
    assert_eq!(status["networkFabric"]["on"], false, "{status}");
    assert!(
        status["networkFabric"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("hollow lab cluster")),
        "{status}"
    );
    assert_eq!(status["providers"][0]["clusterID"], "milan");
    assert_eq!(status["providers"][0]["phase"], "Established");
    assert_eq!(status["providers"][0]["virtualNode"], "tandem-milan");
    assert!(
        status["providers"][0]["tunnel"].is_null(),
        "no gateway configured, no tunnel state: {status}"
    );
    let out = tandem(
        dir.path(),
        &["status", "--kubeconfig", kc, "--context", "lab-2"],
    );
    let (table, _) = text(&out);
    assert!(
        table.contains("CONSUMERS") && table.contains("rome"),
        "{table}"
    );
    assert!(
        table.contains("Network fabric: OFF — the network fabric is off: this is a hollow lab"),
        "{table}"
    );

    // `tandem version`: this CLI's and the installed controller's, from its Deployment.
    let versions = tandem_json(
        dir.path(),
        &["version", "--kubeconfig", kc, "--context", "lab-1"],
    );
    assert_eq!(versions["client"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        versions["controller"]["version"],
        env!("CARGO_PKG_VERSION"),
        "{versions}"
    );
    assert_eq!(
        versions["controller"]["image"],
        tandem_admin::install::default_image(),
        "{versions}"
    );
    let out = tandem(dir.path(), &["version", "--client"]);
    let (table, err) = text(&out);
    assert!(out.status.success(), "version --client: {err}");
    assert_eq!(
        table.trim(),
        format!(
            "Client:     tandem {} (peering protocol v{})",
            env!("CARGO_PKG_VERSION"),
            tandem_core::protocol::VERSION
        )
    );

    // A user bound only to the tandem-viewer ClusterRole the install ships runs `tandem
    // status`: no Secret (the identity is read from the cluster's ClusterProperty), no listing
    // of every pod (the counts it may not see are null).
    let kubectl = |args: &[&str]| {
        let out = Command::new("kubectl")
            .args(["--kubeconfig", kc, "--context", "lab-1"])
            .args(args)
            .output()
            .expect("kubectl runs");
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "kubectl {args:?}: {stderr}");
        stdout
    };
    kubectl(&["create", "serviceaccount", "viewer"]);
    kubectl(&[
        "create",
        "clusterrolebinding",
        "viewer-tandem",
        "--clusterrole",
        tandem_api::names::VIEWER_ROLE,
        "--serviceaccount",
        "default:viewer",
    ]);
    let viewer = "system:serviceaccount:default:viewer";
    for (verb, what) in [("list", "pods"), ("get", "secrets")] {
        let out = Command::new("kubectl")
            .args([
                "--kubeconfig",
                kc,
                "--context",
                "lab-1",
                "auth",
                "can-i",
                verb,
                what,
            ])
            .args(["-A", "--as", viewer])
            .output()
            .unwrap();
        assert_eq!(text(&out).0.trim(), "no", "the viewer may {verb} {what}");
    }
    let token = kubectl(&["create", "token", "viewer"]);
    let viewer_kc = dir.path().join("viewer-kubeconfig");
    std::fs::copy(&kubeconfig, &viewer_kc).unwrap();
    let vkc = viewer_kc.to_str().unwrap();
    for args in [
        vec![
            "config",
            "set-credentials",
            "viewer",
            "--token",
            token.trim(),
        ],
        vec![
            "config",
            "set-context",
            "viewer",
            "--cluster",
            "lab-1",
            "--user",
            "viewer",
        ],
    ] {
        let out = Command::new("kubectl")
            .args(["--kubeconfig", vkc])
            .args(&args)
            .output()
            .unwrap();
        assert!(out.status.success(), "kubectl {args:?}: {}", text(&out).1);
    }
    let seen = tandem_json(
        dir.path(),
        &["status", "--kubeconfig", vkc, "--context", "viewer"],
    );
    assert_eq!(seen["clusterID"], "rome", "{seen}");
    assert_eq!(seen["providers"][0]["clusterID"], "milan", "{seen}");
    assert_eq!(seen["providers"][0]["phase"], "Established", "{seen}");
    assert!(seen["providers"][0]["pods"].is_null(), "{seen}");
    assert_eq!(seen["networkFabric"]["on"], false, "{seen}");

    // kubectl's global flags before or after the verb, the kubeconfig from $KUBECONFIG.
    for (args, cluster) in [
        (["--context", "lab-1", "status"], "rome"),
        (["status", "--context", "lab-1"], "rome"),
        (["--context", "lab-2", "status"], "milan"),
        (["status", "--context", "lab-2"], "milan"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_tandem"))
            .args(args)
            .env("HOME", dir.path())
            .env("KUBECONFIG", kc)
            .output()
            .expect("tandem runs");
        let (table, err) = text(&out);
        assert!(out.status.success(), "tandem {args:?}: {err}");
        assert!(
            table.starts_with(&format!("Cluster {cluster}\n")),
            "tandem {args:?}:\n{table}"
        );
    }
    let out = tandem(
        dir.path(),
        &[
            "-o",
            "json",
            "--kubeconfig",
            kc,
            "install",
            "--context",
            "lab-1",
        ],
    );
    let (_, err) = text(&out);
    assert!(
        !out.status.success() && err.contains("-o/--output json does not apply"),
        "{err}"
    );

    let plugin_dir = dir.path().join("bin");
    std::fs::create_dir_all(&plugin_dir).unwrap();
    std::fs::copy(
        env!("CARGO_BIN_EXE_kubectl-tandem"),
        plugin_dir.join("kubectl-tandem"),
    )
    .unwrap();
    let path = format!(
        "{}:{}",
        plugin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("kubectl")
        .args(["tandem", "status", "--kubeconfig", kc, "--context", "lab-1"])
        .env("PATH", path)
        .env("HOME", dir.path())
        .output()
        .expect("kubectl runs");
    let (table, err) = text(&out);
    assert!(out.status.success(), "kubectl tandem status: {err}");
    assert!(
        table.contains("tandem-milan") && table.contains("TUNNEL"),
        "{table}"
    );
}

#[test]
fn demo_runs_pods_in_both_clusters() {
    let dir = tempfile::tempdir().unwrap();
    let demo_dir = dir.path().join("demo");
    let out = tandem(
        dir.path(),
        &["demo", "--exit", "--dir", demo_dir.to_str().unwrap()],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "demo: {stderr}");
    // "N pod(s) run in lab-1, M in lab-2." with both N and M > 0.
    let pods = counts_on_line(&stdout, "pod(s) run in lab-1");
    assert!(
        pods.len() == 2 && pods[0] > 0 && pods[1] > 0,
        "pods in both clusters: {pods:?}"
    );
    // The Service has endpoints in both clusters: as many in the provider's reflection as here.
    assert_eq!(
        counts_on_line(&stdout, "ready endpoint(s) in lab-1"),
        vec![6, 6]
    );
}

/// Runs `tandem args` with HOME at `home`; fails the test if it is still running after a minute.
fn tandem_within_a_minute(home: &Path, args: &[&str]) -> (bool, String) {
    let mut child = Background(
        Command::new(env!("CARGO_BIN_EXE_tandem"))
            .args(args)
            .env("HOME", home)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tandem runs"),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "tandem {args:?} still runs");
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(child.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    (status.success(), err)
}

#[test]
fn demo_and_lab_up_refuse_a_directory_tandem_did_not_create() {
    let home = tempfile::tempdir().unwrap();
    let work = home.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("notes.txt"), "my notes").unwrap();
    let dir = work.to_str().unwrap();
    for args in [
        &["demo", "--exit", "--dir", dir][..],
        &["lab", "up", "--dir", dir][..],
    ] {
        let (ok, err) = tandem_within_a_minute(home.path(), args);
        assert!(!ok, "tandem {args:?} must refuse {dir}");
        assert!(
            err.contains(dir) && err.contains("Tandem did not create it") && err.contains("--dir"),
            "tandem {args:?}: {err}"
        );
        let entries: Vec<_> = std::fs::read_dir(&work)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            entries,
            ["notes.txt"],
            "tandem {args:?} left {dir} as it was"
        );
        assert_eq!(
            std::fs::read_to_string(work.join("notes.txt")).unwrap(),
            "my notes"
        );
    }
}

/// The numbers on the line of `out` containing `marker` (cluster names left out).
fn counts_on_line(out: &str, marker: &str) -> Vec<u32> {
    let line = out
        .lines()
        .find(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("no line with {marker:?} in:\n{out}"));
    line.replace("lab-1", "")
        .replace("lab-2", "")
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect()
}
