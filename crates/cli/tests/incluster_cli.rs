//! Tandem run as a real cluster runs it, on a network-mode lab: `kubectl apply -k` of the
//! reviewable manifests (deploy/install) or `tandem install` makes the controller its
//! Deployment's pod (this very binary, sandboxed in the pod's namespaces, under
//! its ServiceAccount), and peering, offloading and the pod-placement webhook (called through
//! its Service) work with controllers run that way. Pods of Tandem's image that step outside
//! the allow-list run nothing, and nothing outlives the lab, even a SIGKILLed one.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::netlab;
use netlab::{
    install_overlay, invite_and_peer, json, kubectl, lab_up, offload_hello, ok, tandem, until,
};

/// The processes the lab started (its children), with their command lines.
fn children(lab_pid: u32) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // ppid is the second field after the parenthesised command name.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(lab_pid) {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            found.push((pid, cmdline.trim().to_string()));
        }
    }
    found
}

/// The lab's running controllers (its `tandem controller` children).
fn controller_pids(lab_pid: u32) -> Vec<u32> {
    children(lab_pid)
        .into_iter()
        .filter(|(_, cmd)| cmd.starts_with("tandem controller"))
        .map(|(pid, _)| pid)
        .collect()
}

/// The network namespace (`ip netns` name) process `pid` is in.
fn netns_of(pid: u32) -> String {
    let out = Command::new("ip")
        .args(["netns", "identify", &pid.to_string()])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The pod a sandboxed process belongs to (its HOSTNAME).
fn pod_of(pid: u32) -> Option<String> {
    let environ = std::fs::read_to_string(format!("/proc/{pid}/environ")).ok()?;
    environ
        .split('\0')
        .find_map(|v| v.strip_prefix("HOSTNAME="))
        .map(str::to_string)
}

/// The lab context of a controller running in namespace `netns`.
fn context_of(netns: &str) -> &'static str {
    if netns.contains("-1-tandem-system-") {
        "lab-1"
    } else {
        "lab-2"
    }
}

fn status_field(pid: u32, field: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix(&format!("{field}:"))
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_default()
}

#[test]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
fn install_runs_the_controller_as_its_pod_and_peering_works_with_controllers_run_that_way() {
    tandem_testing::needs_root();
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("lab");
    let mut lab = lab_up(home.path(), "lab", "2");
    let lab_pid = lab.child.id();
    let kc = lab.kubeconfig.clone();

    // rome (the consumer) is installed as an administrator who reviews what goes in does it:
    // `kubectl apply -k` of an overlay of deploy/install naming its cluster ID; milan with
    // `tandem install`. Both must run alike.
    let overlay = install_overlay(&home.path().join("rome-overlay"), Some("rome"));
    ok(
        kubectl(&lab, "lab-1", &["apply", "-k", overlay.to_str().unwrap()]),
        "kubectl apply -k on lab-1",
    );
    ok(
        tandem(
            home.path(),
            &[
                "install",
                "--kubeconfig",
                &kc,
                "--context",
                "lab-2",
                "--cluster-id",
                "milan",
            ],
        ),
        "install on lab-2",
    );
    // The clusterset.local stub domain is the controller's to keep: rome, installed without
    // `tandem install`, gets it in CoreDNS's Corefile, and gets it back when something
    // rewrites the Corefile (as k3s does on every restart).
    let corefile = || netlab::corefile(&lab, "lab-1");
    let stub = "# BEGIN tandem: clusterset.local";
    let with_stub = until(
        "rome's controller adding the stub domain to the Corefile",
        Duration::from_secs(90),
        || Some(corefile()).filter(|c| c.contains(stub)),
    );
    let original = tandem_admin::install::without_stub_domain(&with_stub);
    let patch = serde_json::json!({"data": {"Corefile": original}}).to_string();
    ok(
        kubectl(
            &lab,
            "lab-1",
            &[
                "-n",
                "kube-system",
                "patch",
                "configmap",
                "coredns",
                "--type",
                "merge",
                "-p",
                &patch,
            ],
        ),
        "rewriting the Corefile without the stub",
    );
    until(
        "the stub domain back in the rewritten Corefile",
        Duration::from_secs(60),
        || corefile().contains(stub).then_some(()),
    );
    // Each controller is its Deployment's pod, and says who the API server knows it as.
    for ctx in ["lab-1", "lab-2"] {
        let log = until(
            &format!("the controller pod of {ctx} logging who it is"),
            Duration::from_secs(60),
            || {
                let out = kubectl(
                    &lab,
                    ctx,
                    &["-n", "tandem-system", "logs", "deploy/tandem-controller"],
                );
                let log = String::from_utf8_lossy(&out.stdout).into_owned();
                log.contains("authenticated as").then_some(log)
            },
        );
        assert!(
            log.contains("authenticated as system:serviceaccount:tandem-system:tandem-controller"),
            "{ctx}: {log}"
        );
        assert!(
            !log.contains('\u{1b}'),
            "a pod's log has no colour codes: {log}"
        );
    }
    // The processes: this binary, as the image's nonroot user, without any capability, with
    // no_new_privs, each in its pod's network namespace; its token is nowhere on the host.
    let controllers: Vec<u32> = until("two controller processes", Duration::from_secs(30), || {
        let found = controller_pids(lab_pid);
        (found.len() == 2).then_some(found)
    });
    for pid in &controllers {
        assert_eq!(status_field(*pid, "Uid"), "65532\t65532\t65532\t65532");
        for set in ["CapEff", "CapPrm", "CapBnd", "CapAmb", "CapInh"] {
            assert_eq!(status_field(*pid, set), "0000000000000000", "{set}");
        }
        assert_eq!(status_field(*pid, "NoNewPrivs"), "1");
        let netns = netns_of(*pid);
        assert!(
            netns.starts_with("lab-") && netns.contains("-tandem-system-tandem-controller-"),
            "the controller runs in its pod's namespace, not {netns:?}"
        );
        let resolv = std::fs::read_to_string(format!("/proc/{pid}/root/etc/resolv.conf")).unwrap();
        assert!(
            resolv.contains("nameserver 10.96.0.10") && resolv.contains("search tandem-system.svc"),
            "the pod's resolver configuration, not the host's: {resolv}"
        );
        let credentials = format!("/proc/{pid}/root/run/secrets/kubernetes.io/serviceaccount");
        let namespace = std::fs::read_to_string(format!("{credentials}/namespace")).unwrap();
        assert_eq!(namespace, "tandem-system");
        // The token is bound as kube binds a projected one: to the pod, for the API server's
        // audience, for 3607 s.
        let token = std::fs::read_to_string(format!("{credentials}/token")).unwrap();
        let payload = token.split('.').nth(1).unwrap();
        use base64::Engine as _;
        let claims: Value = serde_json::from_slice(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(payload)
                .unwrap(),
        )
        .unwrap();
        let pod = pod_of(*pid).unwrap();
        assert_eq!(
            claims["kubernetes.io"]["pod"]["name"],
            pod.as_str(),
            "{claims}"
        );
        assert_eq!(
            claims["aud"][0], "https://kubernetes.default.svc",
            "{claims}"
        );
        assert_eq!(
            claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(),
            3607,
            "{claims}"
        );
    }
    assert!(
        !Path::new("/var/run/secrets/kubernetes.io/serviceaccount/token").exists(),
        "the host's own path holds no pod's token"
    );
    // Nor can a pod's user read the lab's admin kubeconfig or a cluster's CA key.
    for private in [dir.clone(), dir.join("lab-1")] {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&private).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{} is {mode:o}", private.display());
    }

    // Peering with controllers in pods: the consumer's controller reaches the provider's API
    // server on the lab WAN, as the invite says.
    let invite = invite_and_peer(home.path(), &kc);
    // What `tandem status` reports on both sides, as in the peering CLI suite.
    let status = until(
        "the peering Established with its virtual node Ready",
        Duration::from_secs(60),
        || {
            let out = tandem(
                home.path(),
                &[
                    "status",
                    "-o",
                    "json",
                    "--kubeconfig",
                    &kc,
                    "--context",
                    "lab-1",
                ],
            );
            let v: Value = serde_json::from_slice(&out.stdout).ok()?;
            (v["providers"][0]["virtualNodeReady"] == true).then_some(v)
        },
    );
    assert_eq!(status["clusterID"], "rome", "{status}");
    assert_eq!(status["providers"][0]["clusterID"], "milan", "{status}");
    assert_eq!(status["providers"][0]["phase"], "Established", "{status}");
    let provider = ok(
        tandem(
            home.path(),
            &["status", "--kubeconfig", &kc, "--context", "lab-2"],
        ),
        "status on the provider",
    );
    assert!(
        provider.contains("CONSUMERS") && provider.contains("rome"),
        "{provider}"
    );
    // The same invite again: refused.
    let again = tandem(
        home.path(),
        &[
            "peer",
            invite.trim(),
            "--kubeconfig",
            &kc,
            "--context",
            "lab-1",
        ],
    );
    assert!(!again.status.success(), "an invite is good for one peering");
    // The webhook (behind its Service) places a pod on the virtual node; it runs in milan.
    offload_hello(home.path(), &lab);
    until(
        "the offloaded pod Running in both clusters",
        Duration::from_secs(60),
        || {
            let pod = json(&lab, "lab-1", &["-n", "demo", "get", "pod", "hello"]);
            let twin = json(&lab, "lab-2", &["-n", "demo-rome", "get", "pods"]);
            (pod["status"]["phase"] == "Running"
                && twin["items"]
                    .as_array()?
                    .iter()
                    .any(|p| p["status"]["phase"] == "Running"))
            .then_some(())
        },
    );

    // Tandem's image outside the allow-list: nothing starts, the status says why.
    let pods = [
        (
            "bad-arg",
            "demo-local",
            r#"["controller","--kubeconfig","/root/.kube/config"]"#,
            "argument \"--kubeconfig\" is not allowed",
        ),
        (
            "bad-role",
            "demo-local",
            r#"["lab","up"]"#,
            "only its in-cluster roles",
        ),
        (
            "in-twin",
            "demo-rome",
            r#"["controller"]"#,
            "twin namespace",
        ),
    ];
    ok(
        kubectl(&lab, "lab-1", &["create", "namespace", "demo-local"]),
        "namespace",
    );
    for (name, ns, args, _) in pods {
        let context = if ns == "demo-rome" { "lab-2" } else { "lab-1" };
        let overrides = format!(
            r#"{{"spec":{{"containers":[{{"name":"c","image":"ghcr.io/tandem-dev/tandem:0.1.0","args":{args}}}]}}}}"#
        );
        ok(
            kubectl(
                &lab,
                context,
                &[
                    "-n",
                    ns,
                    "run",
                    name,
                    "--image=ghcr.io/tandem-dev/tandem:0.1.0",
                    "--overrides",
                    &overrides,
                ],
            ),
            "kubectl run",
        );
    }
    for (name, ns, _, why) in pods {
        let context = if ns == "demo-rome" { "lab-2" } else { "lab-1" };
        let state = until(
            &format!("pod {ns}/{name} refused"),
            Duration::from_secs(60),
            || {
                let pod = json(&lab, context, &["-n", ns, "get", "pod", name]);
                let state = pod["status"]["containerStatuses"][0]["state"].clone();
                (!state["terminated"].is_null()).then_some(state)
            },
        );
        assert_eq!(
            state["terminated"]["reason"], "StartError",
            "{name}: {state}"
        );
        let message = state["terminated"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(why), "{name}: {message}");
    }
    let running: Vec<String> = children(lab_pid)
        .into_iter()
        .map(|(_, c)| c)
        .filter(|c| c.starts_with("tandem"))
        .collect();
    assert_eq!(
        running.len(),
        2,
        "only the two controllers run, nothing for the refused pods: {running:?}"
    );

    // Deleting the controller's pod stops its process; the Deployment's next pod runs anew.
    let old = controllers[0];
    let netns = netns_of(old);
    let context = context_of(&netns);
    // `lab-<instance>-…`: the namespaces of this lab.
    let instance = format!("lab-{}-", netns.split('-').nth(1).unwrap_or_default());
    ok(
        kubectl(
            &lab,
            context,
            &[
                "-n",
                "tandem-system",
                "delete",
                "pod",
                "-l",
                "app.kubernetes.io/name=tandem-controller",
            ],
        ),
        "delete the controller pod",
    );
    until(
        "the old controller process gone and a new one running",
        Duration::from_secs(60),
        || {
            let now = controller_pids(lab_pid);
            (!now.contains(&old) && now.len() == 2).then_some(())
        },
    );

    // A controller process killed under its pod: restarted after kubelet's back-off, and the
    // pod's status counts the restart with the exit (137: SIGKILL).
    let (victim, pod) = until(
        "a controller process to kill",
        Duration::from_secs(30),
        || {
            controller_pids(lab_pid)
                .into_iter()
                .find_map(|pid| Some((pid, pod_of(pid)?)))
        },
    );
    let context = context_of(&netns_of(victim));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let status = until(
        "the killed controller restarted and counted",
        Duration::from_secs(60),
        || {
            let p = json(&lab, context, &["-n", "tandem-system", "get", "pod", &pod]);
            let status = p["status"]["containerStatuses"][0].clone();
            (status["restartCount"] == 1).then_some(status)
        },
    );
    assert_eq!(
        status["lastState"]["terminated"]["exitCode"], 137,
        "{status}"
    );
    until(
        "a new process for the killed controller",
        Duration::from_secs(60),
        || {
            let now = controller_pids(lab_pid);
            (now.len() == 2 && !now.contains(&victim)).then_some(())
        },
    );
    let log = ok(
        kubectl(&lab, context, &["-n", "tandem-system", "logs", &pod]),
        "the restarted controller's log",
    );
    assert!(log.contains("tandem exited: signal: 9"), "{log}");

    // SIGKILL the lab: its processes die with it, and the next start removes its namespaces.
    let last: Vec<u32> = children(lab_pid)
        .into_iter()
        .filter(|(_, c)| c.starts_with("tandem"))
        .map(|(p, _)| p)
        .collect();
    lab.child.kill().unwrap();
    lab.child.wait().unwrap();
    until(
        "the lab's processes gone with it",
        Duration::from_secs(10),
        || {
            last.iter()
                .all(|pid| {
                    !Path::new(&format!("/proc/{pid}")).exists()
                        || status_field(*pid, "State").starts_with('Z')
                })
                .then_some(())
        },
    );
    let mut second = lab_up(home.path(), "second", "1");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(second.child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let _ = second.child.wait();
    let left: Vec<String> = tandem_lab::network::topology::namespaces()
        .into_iter()
        .filter(|n| n.starts_with(&instance))
        .collect();
    assert!(
        left.is_empty(),
        "namespaces of the killed lab left behind: {left:?}"
    );
}
