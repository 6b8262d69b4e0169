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

/// The namespaces of the lab instance the process `pid` registered (in
/// `/run/tandem-lab/<id>/owner`): `lab-<id>-…`. Other tests' labs run meanwhile, so what
/// appeared while this one started is not all its own.
fn namespaces_of(pid: u32) -> BTreeSet<String> {
    let id = std::fs::read_dir(tandem_lab::network::topology::REGISTRY)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .find(|e| {
            std::fs::read_to_string(e.path().join("owner"))
                .is_ok_and(|o| o.split_whitespace().next() == Some(pid.to_string().as_str()))
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .unwrap_or_else(|| panic!("no lab instance registered by pid {pid}"));
    let prefix = format!("lab-{id}-");
    lab_namespaces()
        .into_iter()
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

/// Starts `tandem lab up --network` in `dir`; returns it and the namespaces it made.
fn lab_up(dir: &Path) -> (Child, BTreeSet<String>) {
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
    let mine = namespaces_of(child.id());
    assert!(
        mine.iter().any(|n| n.ends_with("-wan")) && mine.iter().any(|n| n.ends_with("-1-node-1")),
        "the lab's namespaces: {mine:?}"
    );
    (child, mine)
}

#[test]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
fn ctrl_c_removes_everything_and_a_killed_labs_namespaces_go_at_the_next_start() {
    tandem_testing::needs_root();
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
