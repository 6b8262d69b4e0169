//! `tandem dashboard` as an administrator sees it: two peered lab clusters drawn in headless
//! Chromium (the page's DOM is checked, and a screenshot is kept in the target directory:
//! `target/tmp/dashboard.png`), its JSON, and its refusals (another Host, a write).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::netlab;
use netlab::{hollow_lab, kubectl, ok, rome_offloads_shop_to_milan, until};

struct Background(Child);

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A raw HTTP/1.1 request to `addr`: the status code and the body.
fn request(addr: &str, method: &str, path: &str, host: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let code = answer[9..12].parse().unwrap();
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    // The body may be chunked: the JSON or page is between the first and last chunk lines.
    (code, body.to_string())
}

fn chromium(args: &[&str], profile: &Path) -> std::process::Output {
    Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--virtual-time-budget=8000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .output()
        .expect("chromium runs (.ci/install-deps installs it)")
}

#[test]
fn the_dashboard_draws_two_peered_clusters_in_chromium() {
    let home = tempfile::tempdir().unwrap();
    let lab = hollow_lab(home.path(), "2");
    let kc = lab.kubeconfig.clone();
    rome_offloads_shop_to_milan(home.path(), &lab);
    for name in ["web-1", "web-2"] {
        ok(
            kubectl(&lab, "lab-1", &["-n", "shop", "run", name, "--image=nginx"]),
            "kubectl run",
        );
    }

    let mut dashboard = Background(
        Command::new(env!("CARGO_BIN_EXE_tandem"))
            .args(["dashboard", "--kubeconfig", &kc, "--address", "127.0.0.1:0"])
            .env("HOME", home.path())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut first = String::new();
    BufReader::new(dashboard.0.stderr.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let url = first
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in {first:?}"))
        .to_string();
    assert!(first.contains("lab-1, lab-2"), "{first}");
    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();

    // The JSON behind the page: both clusters, the peering Established with its pods.
    let topology: Value = until(
        "the peering Established with 2 pods",
        Duration::from_secs(60),
        || {
            let (code, body) = request(&addr, "GET", "/api/topology", &addr);
            assert_eq!(code, 200);
            let start = body.find('{')?;
            let end = body.rfind('}')?;
            let v: Value = serde_json::from_str(&body[start..=end]).ok()?;
            let p = &v["clusters"][0]["status"]["providers"][0];
            (p["phase"] == "Established" && p["virtualNodeReady"] == true && p["pods"] == 2)
                .then_some(v)
        },
    );
    assert_eq!(topology["clusters"][0]["context"], "lab-1");
    assert_eq!(topology["clusters"][1]["status"]["clusterID"], "milan");

    // Refused: a request naming another host (DNS rebinding), and any write.
    assert_eq!(request(&addr, "GET", "/", "evil.example:80").0, 403);
    assert_eq!(request(&addr, "POST", "/api/topology", &addr).0, 405);

    // The page in Chromium: both clusters, the arrow rome → milan, its phase, the virtual
    // node, the pod count and the offloaded namespace.
    let profile = tempfile::tempdir().unwrap();
    let dom = chromium(&["--dump-dom", &url], profile.path());
    let dom = String::from_utf8_lossy(&dom.stdout);
    assert!(
        dom.contains("data-loaded=\"true\""),
        "the page never rendered:\n{dom}"
    );
    for expected in [
        "data-cluster=\"rome\"",
        "data-cluster=\"milan\"",
        "data-peering=\"rome-&gt;milan\" data-phase=\"Established\"",
        "tandem-milan Ready",
        "2 pods offloaded",
        "<td>shop</td>",
        "2 clusters · 1 peering (1 Established)",
    ] {
        assert!(
            dom.contains(expected),
            "{expected:?} not on the page:\n{dom}"
        );
    }
    let screenshot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");
    let _ = std::fs::remove_file(&screenshot);
    let shot = chromium(
        &[
            &format!("--screenshot={}", screenshot.display()),
            "--window-size=1000,760",
            &url,
        ],
        profile.path(),
    );
    let png = std::fs::read(&screenshot)
        .unwrap_or_else(|_| panic!("no screenshot: {}", String::from_utf8_lossy(&shot.stderr)));
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{} bytes",
        png.len()
    );
    eprintln!("screenshot: {}", screenshot.display());
}
