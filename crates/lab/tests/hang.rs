//! A test the harness terminates says what it was waiting for: the waits of
//! `tandem_testing` are printed on SIGTERM (nextest's `terminate-after`).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use tandem_testing::{until, waiting_for};

/// Set in the child: the test below then waits as a hung test would.
const CHILD: &str = "TANDEM_HANG_CHILD";
/// What the child prints once it waits.
const READY: &str = "the child test is waiting";

#[tokio::test]
async fn a_terminated_test_names_the_waits_it_was_in() {
    if std::env::var_os(CHILD).is_some() {
        let _outer = waiting_for("the consumer's Peering Established");
        println!("{READY}");
        until(
            "a condition that never holds",
            Duration::from_secs(3600),
            || async { None::<()> },
        )
        .await;
        return;
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "hang::a_terminated_test_names_the_waits_it_was_in",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the test binary runs");
    // Once the child is in its waits, terminate it as nextest would.
    let stdout = BufReader::new(child.stdout.take().unwrap());
    // libtest prints the test's name on the same line, before what the test prints.
    let waiting = stdout
        .lines()
        .map_while(Result::ok)
        .any(|l| l.ends_with(READY));
    assert!(waiting, "the child did not start waiting");
    std::thread::sleep(Duration::from_millis(300));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(143),
        "exits as SIGTERM would: {stderr}"
    );
    assert!(
        stderr.contains("terminated while waiting for:"),
        "the report is printed: {stderr}"
    );
    assert!(
        stderr.contains("the consumer's Peering Established (for "),
        "{stderr}"
    );
    assert!(
        stderr.contains("a condition that never holds (polled for up to 3600s) (for "),
        "{stderr}"
    );
}
