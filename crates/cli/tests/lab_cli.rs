//! `tandem lab up` as a user runs it: several clusters, one kubeconfig, kubectl per context,
//! and objects that survive the lab being killed and restarted.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct LabProcess(Child);

impl Drop for LabProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn lab_up(dir: &Path, clusters: usize) -> LabProcess {
    let kubeconfig = dir.join("kubeconfig");
    let _ = std::fs::remove_file(&kubeconfig);
    let child = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args([
            "lab",
            "up",
            "--nodes",
            "2",
            "--clusters",
            &clusters.to_string(),
            "--dir",
        ])
        .arg(dir)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("tandem starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !kubeconfig.exists() {
        assert!(
            Instant::now() < deadline,
            "tandem lab up wrote no kubeconfig"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    LabProcess(child)
}

fn kubectl(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(dir.join("kubeconfig"))
        .args(args)
        .env("HOME", dir)
        .output()
        .expect("kubectl is installed");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Polls kubectl until `check` accepts its output.
fn eventually(dir: &Path, args: &[&str], what: &str, check: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (ok, out) = kubectl(dir, args);
        if ok && check(&out) {
            return out;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: kubectl {args:?} said:\n{out}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn lab_up_serves_each_cluster_and_keeps_objects_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let lab = lab_up(dir.path(), 3);
    let (_, contexts) = kubectl(dir.path(), &["config", "get-contexts", "-o", "name"]);
    assert_eq!(
        contexts.split_whitespace().collect::<Vec<_>>(),
        ["lab-1", "lab-2", "lab-3"]
    );
    for (ctx, region) in [
        ("lab-1", "eu-west"),
        ("lab-2", "us-east"),
        ("lab-3", "ap-south"),
    ] {
        let nodes = eventually(
            dir.path(),
            &[
                "--context",
                ctx,
                "get",
                "nodes",
                "-L",
                "topology.kubernetes.io/region",
                "--no-headers",
            ],
            "two Ready nodes",
            |out| out.lines().filter(|l| l.contains(" Ready ")).count() == 2,
        );
        assert!(
            nodes
                .lines()
                .all(|l| l.starts_with(&format!("{ctx}-node-")) && l.ends_with(region)),
            "{ctx}:\n{nodes}"
        );
    }
    let (ok, out) = kubectl(
        dir.path(),
        &[
            "--context",
            "lab-3",
            "create",
            "configmap",
            "kept",
            "--from-literal=k=v",
        ],
    );
    assert!(ok, "{out}");

    // Kill without warning, start again on the same directory.
    drop(lab);
    let _lab = lab_up(dir.path(), 3);
    let kept = eventually(
        dir.path(),
        &[
            "--context",
            "lab-3",
            "get",
            "configmap",
            "kept",
            "-o",
            "jsonpath={.data.k}",
        ],
        "the ConfigMap survives",
        |out| out == "v",
    );
    assert_eq!(kept, "v");
    let (_, other) = kubectl(
        dir.path(),
        &["--context", "lab-2", "get", "configmap", "kept"],
    );
    assert!(other.contains("NotFound"), "clusters are separate: {other}");
    eventually(
        dir.path(),
        &["--context", "lab-1", "get", "nodes", "--no-headers"],
        "nodes Ready again after the restart",
        |out| out.lines().filter(|l| l.contains(" Ready ")).count() == 2,
    );
    let (ok, status) = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["lab", "status", "--dir"])
        .arg(dir.path())
        .output()
        .map(|o| {
            (
                o.status.success(),
                String::from_utf8_lossy(&o.stdout).into_owned(),
            )
        })
        .unwrap();
    assert!(
        ok && status.lines().filter(|l| l.contains(" ok ")).count() == 3,
        "{status}"
    );
}
