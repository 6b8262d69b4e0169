//! The README's main command, run the way the README writes it (`cargo run … -- demo` from the
//! workspace root, read from README.md itself), with a fresh HOME: it prints the demo's table,
//! keeps the clusters running, and stops cleanly on Ctrl-C (SIGINT to its process group, as a
//! terminal sends it). CI builds that binary before the suite (`.ci/run`), so `cargo run` here
//! only reuses it; on a cold target directory it builds it first, hence the long bound.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// The README command's process group; killed if the test fails half-way.
struct Group(Child);

impl Group {
    fn signal(&self, signal: Signal) {
        let _ = killpg(Pid::from_raw(self.0.id() as i32), signal);
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.signal(Signal::SIGKILL);
        let _ = self.0.wait();
    }
}

/// Where cargo and rustup live for this user, so that they stay the same under a fresh HOME.
fn tool_home(var: &str, under_home: &str) -> PathBuf {
    std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(under_home)
    })
}

/// Whether cargo or nextest set `name` for this test process (rather than the user for cargo).
fn test_harness_variable(name: &str) -> bool {
    [
        "CARGO_MANIFEST_",
        "CARGO_PKG_",
        "CARGO_CRATE_",
        "CARGO_BIN_",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_TARGET_TMPDIR",
        "CARGO_RUSTC_CURRENT_DIR",
        "NEXTEST",
        "OUT_DIR",
        "RUST_TEST_",
    ]
    .iter()
    .any(|prefix| name.starts_with(prefix))
}

#[test]
fn the_readmes_main_command_prints_the_demo_and_stops_cleanly_on_ctrl_c() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md is readable");
    let line = readme
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("cargo run ") && l.ends_with(" demo"))
        .expect("the README shows its main command, `cargo run … demo`");
    let words: Vec<&str> = line.split_whitespace().collect();

    let home = tempfile::tempdir().unwrap();
    let mut command = Command::new(words[0]);
    // Run it as a user's shell would: without the variables cargo and nextest set for this test
    // (a build script that watches CARGO_MANIFEST_DIR would otherwise rebuild the tree).
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if test_harness_variable(&name) {
            command.env_remove(&*name);
        }
    }
    command
        .args(&words[1..])
        .current_dir(&root)
        .env("HOME", home.path())
        .env("CARGO_HOME", tool_home("CARGO_HOME", ".cargo"))
        .env("RUSTUP_HOME", tool_home("RUSTUP_HOME", ".rustup"))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut group = Group(command.spawn().expect("cargo runs"));

    let (lines, stdout_lines) = mpsc::channel();
    let stdout = group.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let mut stderr_pipe = group.0.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr_pipe.read_to_string(&mut text);
        text
    });

    // The table of pods, then the summary line that ends the report.
    let deadline = Instant::now() + Duration::from_secs(25 * 60);
    let mut printed = Vec::new();
    loop {
        match stdout_lines.recv_timeout(Duration::from_secs(1)) {
            Ok(line) => {
                let done = line.contains("pod(s) run in lab-1");
                printed.push(line);
                if done {
                    break;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Some(status) = group.0.try_wait().unwrap() {
                    group.signal(Signal::SIGKILL);
                    panic!(
                        "`{line}` exited with {status} before its table:\n{}\n{}",
                        printed.join("\n"),
                        stderr.join().unwrap()
                    );
                }
                assert!(
                    Instant::now() < deadline,
                    "`{line}` printed no table in 25 minutes:\n{}",
                    printed.join("\n")
                );
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = group.0.wait().unwrap();
                panic!(
                    "`{line}` closed its output ({status}) before its table:\n{}\n{}",
                    printed.join("\n"),
                    stderr.join().unwrap()
                );
            }
        }
    }
    let header = printed
        .iter()
        .find(|l| l.starts_with("POD "))
        .unwrap_or_else(|| panic!("no table header:\n{}", printed.join("\n")));
    assert!(
        header.contains("NODE") && header.contains("CLUSTER"),
        "{header}"
    );
    let pods = printed
        .iter()
        .filter(|l| l.starts_with("hello-"))
        .collect::<Vec<_>>();
    assert_eq!(pods.len(), 6, "six pods listed:\n{}", printed.join("\n"));

    // The demo keeps running until Ctrl-C.
    assert!(
        group.0.try_wait().unwrap().is_none(),
        "the demo keeps its clusters running"
    );
    group.signal(Signal::SIGINT);
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = group.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the demo did not stop within a minute of Ctrl-C"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let stderr = stderr.join().unwrap();
    assert!(status.success(), "exit status {status}:\n{stderr}");
    assert!(
        stderr.contains("stopping the clusters") && stderr.contains("demo stopped"),
        "{stderr}"
    );
    assert!(
        home.path().join(".tandem/demo/kubeconfig").is_file(),
        "the demo's kubeconfig is in the fresh HOME"
    );
}
