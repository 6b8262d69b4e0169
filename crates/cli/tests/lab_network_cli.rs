//! `tandem lab up --network` leaves nothing behind: Ctrl-C removes every namespace it made,
//! and after a SIGKILL the next start removes them.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn lab_namespaces() -> BTreeSet<String> {
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("lab-"))
                .collect()
        })
        .unwrap_or_default()
}

/// Starts `tandem lab up --network` in `dir`; returns it and the namespaces it made.
fn lab_up(dir: &Path) -> (Child, BTreeSet<String>) {
    let before = lab_namespaces();
    let kubeconfig = dir.join("kubeconfig");
    let _ = std::fs::remove_file(&kubeconfig);
    let mut child = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args([
            "lab",
            "up",
            "--network",
            "--nodes",
            "1",
            "--clusters",
            "1",
            "--dir",
        ])
        .arg(dir)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("tandem starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !kubeconfig.exists() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("tandem lab up --network exited early: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "tandem lab up --network wrote no kubeconfig"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mine: BTreeSet<String> = lab_namespaces().difference(&before).cloned().collect();
    assert!(
        mine.iter().any(|n| n.ends_with("-wan")) && mine.iter().any(|n| n.ends_with("-1-node-1")),
        "the lab's namespaces: {mine:?}"
    );
    (child, mine)
}

#[test]
fn ctrl_c_removes_everything_and_a_killed_labs_namespaces_go_at_the_next_start() {
    if !tandem_lab::testing::network_tests_can_run() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (mut child, mine) = lab_up(dir.path());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "tandem lab up ends cleanly on Ctrl-C: {status}"
    );
    let left: Vec<String> = lab_namespaces().intersection(&mine).cloned().collect();
    assert!(left.is_empty(), "left after Ctrl-C: {left:?}");

    let (mut killed, killed_ns) = lab_up(dir.path());
    killed.kill().unwrap();
    killed.wait().unwrap();
    assert!(
        lab_namespaces().is_superset(&killed_ns),
        "SIGKILL runs no cleanup: the namespaces stay until the next start"
    );
    let (mut next, _) = lab_up(dir.path());
    let stale: Vec<String> = lab_namespaces().intersection(&killed_ns).cloned().collect();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(next.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(
        next.wait().unwrap().success(),
        "SIGTERM ends the lab cleanly too"
    );
    assert!(
        stale.is_empty(),
        "the next start removed the killed lab's namespaces: {stale:?}"
    );
}
