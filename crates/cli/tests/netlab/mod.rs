//! What the network-mode CLI suites share: a `tandem lab up --network` child (killed when
//! dropped), and running `tandem` and the real kubectl against it.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub struct Lab {
    pub child: Child,
    pub kubeconfig: String,
}

impl Drop for Lab {
    /// Stops the lab as Ctrl-C does, so that it removes its namespaces; SIGKILL only if it
    /// has not stopped within 20 s.
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// SIGINT, then SIGKILL after 20 s.
pub fn stop(child: &mut Child) {
    // Already reaped: its pid may belong to another process by now.
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
}

pub fn tandem(home: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(args)
        .env("HOME", home)
        .output()
        .expect("tandem runs")
}

pub fn kubectl(lab: &Lab, context: &str, args: &[&str]) -> Output {
    Command::new("kubectl")
        .args(["--kubeconfig", &lab.kubeconfig, "--context", context])
        .args(args)
        .output()
        .expect("kubectl runs")
}

pub fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Polls with a deadline (the shared test support's, named here as the CLI's tests call it).
pub use tandem_testing::until_blocking as until;

pub fn json(lab: &Lab, context: &str, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&ok(
        kubectl(lab, context, &all),
        &format!("kubectl {args:?}"),
    ))
    .unwrap()
}

/// Starts `tandem lab up --network` with `clusters` clusters in `home/name`; returns once its
/// kubeconfig is written.
pub fn lab_up(home: &Path, name: &str, clusters: &str) -> Lab {
    lab_up_with_nodes(home, name, clusters, "1")
}

/// [`lab_up`] with `nodes` nodes per cluster.
pub fn lab_up_with_nodes(home: &Path, name: &str, clusters: &str, nodes: &str) -> Lab {
    lab_up_as(home, name, clusters, nodes, "k3s")
}

/// [`lab_up_with_nodes`] in lab profile `profile` (`k3s`, `kind`).
pub fn lab_up_as(home: &Path, name: &str, clusters: &str, nodes: &str, profile: &str) -> Lab {
    let dir = home.join(name);
    let child = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args([
            "lab",
            "up",
            "--network",
            "--profile",
            profile,
            "--clusters",
            clusters,
            "--nodes",
            nodes,
            "--dir",
        ])
        .arg(&dir)
        .env("HOME", home)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let kubeconfig = dir.join("kubeconfig");
    let lab = Lab {
        child,
        kubeconfig: kubeconfig.to_string_lossy().into_owned(),
    };
    until(
        &format!("{name}'s kubeconfig"),
        Duration::from_secs(60),
        || kubeconfig.exists().then_some(()),
    );
    lab
}

/// CoreDNS's Corefile in cluster `ctx` (ConfigMap kube-system/coredns); empty without one.
pub fn corefile(lab: &Lab, ctx: &str) -> String {
    let out = kubectl(
        lab,
        ctx,
        &[
            "-n",
            "kube-system",
            "get",
            "configmap",
            "coredns",
            "-o",
            "jsonpath={.data.Corefile}",
        ],
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `tandem lab load-image` of Tandem's default image onto every cluster of the lab in
/// `home/name`: what a kind-profile lab needs before Tandem is installed, as kind does.
pub fn load_tandem_image(home: &Path, name: &str) {
    let dir = home.join(name);
    ok(
        tandem(
            home,
            &[
                "lab",
                "load-image",
                &tandem_admin::install::default_image(),
                "--dir",
                &dir.to_string_lossy(),
            ],
        ),
        "lab load-image",
    );
}

/// In lab-1 (rome, peered with milan): creates namespace `demo`, offloads it, and runs the
/// `tandem.dev/echo` pod `hello` on the virtual node `tandem-milan` (placed by the webhook).
pub fn offload_hello(home: &Path, lab: &Lab) {
    ok(
        kubectl(lab, "lab-1", &["create", "namespace", "demo"]),
        "namespace",
    );
    let kc = lab.kubeconfig.as_str();
    ok(
        tandem(
            home,
            &[
                "offload",
                "namespace",
                "demo",
                "--kubeconfig",
                kc,
                "--context",
                "lab-1",
            ],
        ),
        "offload",
    );
    ok(
        kubectl(
            lab,
            "lab-1",
            &[
                "-n",
                "demo",
                "run",
                "hello",
                "--image=tandem.dev/echo",
                "--overrides",
                r#"{"spec":{"nodeSelector":{"kubernetes.io/hostname":"tandem-milan"}}}"#,
            ],
        ),
        "kubectl run",
    );
}

/// `tandem invite` on lab-2 (milan, endpoint on the WAN), then `tandem peer` on lab-1 (rome);
/// returns the invite, spent.
pub fn invite_and_peer(home: &Path, kubeconfig: &str) -> String {
    peer_with(home, kubeconfig, "lab-1", 2)
}

/// `tandem invite` on `lab-<provider>` (its API endpoint on the WAN, 198.18.<provider>.2),
/// then `tandem peer` on `consumer`; returns the invite, spent.
pub fn peer_with(home: &Path, kubeconfig: &str, consumer: &str, provider: u8) -> String {
    let invite = ok(
        tandem(
            home,
            &[
                "invite",
                "--kubeconfig",
                kubeconfig,
                "--context",
                &format!("lab-{provider}"),
                "--endpoint",
                &format!("https://198.18.{provider}.2:6443"),
            ],
        ),
        "invite",
    );
    ok(
        tandem(
            home,
            &[
                "peer",
                invite.trim(),
                "--kubeconfig",
                kubeconfig,
                "--context",
                consumer,
            ],
        ),
        "peer",
    );
    invite
}

/// `tandem invite` on lab-2 with the endpoint it derives itself, then `tandem peer` on
/// lab-1: how a hollow lab's clusters peer (their controllers run on the host, which reaches
/// the kubeconfig's address).
pub fn peer_as_invited(home: &Path, kubeconfig: &str) {
    let invite = ok(
        tandem(
            home,
            &["invite", "--kubeconfig", kubeconfig, "--context", "lab-2"],
        ),
        "invite",
    );
    ok(
        tandem(
            home,
            &[
                "peer",
                invite.trim(),
                "--kubeconfig",
                kubeconfig,
                "--context",
                "lab-1",
            ],
        ),
        "peer",
    );
}

/// `tandem check -o json` on `ctx`: asserts that every path passed and the command
/// succeeded; returns the report.
pub fn check_passes(home: &Path, kubeconfig: &str, ctx: &str) -> Value {
    let out = tandem(
        home,
        &[
            "check",
            "--kubeconfig",
            kubeconfig,
            "--context",
            ctx,
            "-o",
            "json",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("check printed no JSON ({e}): {stderr}"));
    for path in report["paths"].as_array().expect("paths") {
        assert_eq!(path["ok"], true, "{path}\n{report}\n{stderr}");
    }
    assert!(out.status.success(), "{stderr}");
    report
}

/// What the echo server at `url` answered `kubectl exec POD -- probe fetch URL` in lab-1's
/// namespace `ns`; None while it fails.
pub fn probe_fetch(lab: &Lab, ns: &str, pod: &str, url: &str) -> Option<Value> {
    probe_fetch_in(lab, "lab-1", ns, pod, url)
}

/// [`probe_fetch`] from a pod of cluster `ctx`.
pub fn probe_fetch_in(lab: &Lab, ctx: &str, ns: &str, pod: &str, url: &str) -> Option<Value> {
    let out = kubectl(
        lab,
        ctx,
        &["-n", ns, "exec", pod, "--", "probe", "fetch", url],
    );
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())
        .flatten()
}

/// `tandem install --network-fabric` on each `(context, cluster ID)`.
pub fn install_with_fabric(home: &std::path::Path, kubeconfig: &str, clusters: &[(&str, &str)]) {
    for (ctx, id) in clusters {
        ok(
            tandem(
                home,
                &[
                    "install",
                    "--kubeconfig",
                    kubeconfig,
                    "--context",
                    ctx,
                    "--cluster-id",
                    id,
                    "--network-fabric",
                ],
            ),
            &format!("install on {ctx}"),
        );
    }
}

/// `kubectl run NAME --image=tandem.dev/<image>` in `ctx`'s namespace `ns` with `overrides`;
/// returns its podIP once Running.
pub fn run_pod(
    lab: &Lab,
    ctx: &str,
    ns: &str,
    name: &str,
    image: &str,
    overrides: Option<&str>,
) -> std::net::Ipv4Addr {
    let image = format!("--image=tandem.dev/{image}");
    let mut args = vec!["-n", ns, "run", name, image.as_str()];
    if let Some(o) = overrides {
        args.extend(["--overrides", o]);
    }
    ok(
        kubectl(lab, ctx, &args),
        &format!("pod {ns}/{name} in {ctx}"),
    );
    until(
        &format!("pod {ns}/{name} of {ctx} Running"),
        Duration::from_secs(90),
        || {
            let pod = json(lab, ctx, &["-n", ns, "get", "pod", name]);
            (pod["status"]["phase"] == "Running")
                .then(|| pod["status"]["podIP"].as_str()?.parse().ok())
                .flatten()
        },
    )
}

/// Three network-mode clusters of one node on 10.244.0.0/16, installed with the fabric: rome
/// (lab-1) consumes from milan (lab-2) and turin (lab-3).
pub fn rome_consumes_from_milan_and_turin(home: &Path) -> Lab {
    let lab = lab_up_with_nodes(home, "lab", "3", "1");
    let kc = lab.kubeconfig.clone();
    install_with_fabric(
        home,
        &kc,
        &[("lab-1", "rome"), ("lab-2", "milan"), ("lab-3", "turin")],
    );
    peer_with(home, &kc, "lab-1", 2);
    peer_with(home, &kc, "lab-1", 3);
    lab
}

/// A kustomize overlay of the repository's `deploy/install` in `dir` (created), setting the
/// cluster ID in tandem-config when given, as an administrator's own overlay would.
pub fn install_overlay(dir: &Path, cluster_id: Option<&str>) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/install")
        .canonicalize()
        .unwrap();
    // kustomize takes a base only by a relative path.
    let base = format!(
        "{}{}",
        "../".repeat(dir.components().count() - 1),
        deploy.to_str().unwrap().trim_start_matches('/')
    );
    let mut kustomization = format!("resources:\n- {base}\n");
    if let Some(id) = cluster_id {
        kustomization.push_str(&format!(
            "patches:\n- target: {{kind: ConfigMap, name: tandem-config}}\n  patch: |-\n    \
             - {{op: add, path: /data/clusterID, value: {id}}}\n"
        ));
    }
    std::fs::write(dir.join("kustomization.yaml"), kustomization).unwrap();
    dir.to_path_buf()
}

/// `tandem lab up` with `clusters` hollow clusters (it hosts each controller in-process once
/// the controller Deployment exists); stopped when dropped.
pub fn hollow_lab(home: &Path, clusters: &str) -> Lab {
    let kubeconfig = home.join("kubeconfig");
    let child = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["lab", "up", "--clusters", clusters, "--nodes", "1", "--dir"])
        .arg(home)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !kubeconfig.exists() {
        assert!(
            Instant::now() < deadline,
            "tandem lab up wrote no kubeconfig"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let lab = Lab {
        child,
        kubeconfig: kubeconfig.to_str().unwrap().to_string(),
    };
    // The kubeconfig comes first; each cluster's hollow nodes register just after (and
    // `tandem install` detects the pod CIDR from them).
    let count: usize = clusters.parse().unwrap_or(1);
    for i in 1..=count {
        let context = format!("lab-{i}");
        until(
            &format!("{context}'s nodes with a podCIDR"),
            Duration::from_secs(30),
            || {
                let out = kubectl(
                    &lab,
                    &context,
                    &["get", "nodes", "-o", "jsonpath={.items[*].spec.podCIDR}"],
                );
                (out.status.success() && !String::from_utf8_lossy(&out.stdout).trim().is_empty())
                    .then_some(())
            },
        );
    }
    lab
}

/// Offloads namespace `ns` of lab-1 (created) with the Remote strategy: its pods run on
/// lab-1's providers only.
pub fn offload_remote(home: &Path, lab: &Lab, ns: &str) {
    ok(
        kubectl(lab, "lab-1", &["create", "namespace", ns]),
        "namespace",
    );
    ok(
        tandem(
            home,
            &[
                "offload",
                "namespace",
                ns,
                "--pod-offloading-strategy",
                "Remote",
                "--kubeconfig",
                &lab.kubeconfig,
                "--context",
                "lab-1",
            ],
        ),
        "offload",
    );
}

/// `tandem install` on lab-1 as rome and lab-2 as milan, rome peered with milan by invite,
/// and `shop` offloaded from rome (Remote).
pub fn rome_offloads_shop_to_milan(home: &Path, lab: &Lab) {
    let kc = lab.kubeconfig.as_str();
    for (ctx, id) in [("lab-1", "rome"), ("lab-2", "milan")] {
        ok(
            tandem(
                home,
                &[
                    "install",
                    "--cluster-id",
                    id,
                    "--kubeconfig",
                    kc,
                    "--context",
                    ctx,
                ],
            ),
            "install",
        );
    }
    let invite = ok(
        tandem(home, &["invite", "--kubeconfig", kc, "--context", "lab-2"]),
        "invite",
    );
    ok(
        tandem(
            home,
            &[
                "peer",
                invite.trim(),
                "--kubeconfig",
                kc,
                "--context",
                "lab-1",
            ],
        ),
        "peer",
    );
    offload_remote(home, lab, "shop");
}
