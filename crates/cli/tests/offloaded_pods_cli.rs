//! `kubectl logs`, `exec` and `attach` on an offloaded pod, with the real kubectl, through the
//! consumer's API server and the virtual node's kubelet API to the real pod in the provider —
//! on a network-mode lab where both controllers run as their Deployments' pods, as on real
//! clusters. The provider's policy and the consumer's RBAC each refuse what they should.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::netlab;
use netlab::{json, kubectl, lab_up, offload_hello, ok, tandem, until};
use tandem_testing::{http, port_forward};

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
fn logs_exec_and_attach_reach_the_offloaded_pod_as_its_provider_allows() {
    tandem_testing::needs_root();
    let home = tempfile::tempdir().unwrap();
    let lab = lab_up(home.path(), "lab", "2");
    let kc = lab.kubeconfig.clone();
    let on = |ctx: &'static str| ["--kubeconfig", kc.as_str(), "--context", ctx];
    for (ctx, id) in [("lab-1", "rome"), ("lab-2", "milan")] {
        let mut args = vec!["install", "--cluster-id", id];
        args.extend(on(ctx));
        ok(tandem(home.path(), &args), &format!("install on {ctx}"));
    }
    let mut args = vec!["invite", "--endpoint", "https://198.18.2.2:6443"];
    args.extend(on("lab-2"));
    let invite = ok(tandem(home.path(), &args), "invite");
    let mut args = vec!["peer", invite.trim()];
    args.extend(on("lab-1"));
    ok(tandem(home.path(), &args), "peer");
    // The webhook (behind its Service) places a pod on the virtual node; it runs in milan.
    offload_hello(home.path(), &lab);
    until(
        "the offloaded pod Running, its virtual node serving a kubelet endpoint",
        Duration::from_secs(90),
        || {
            let pod = json(&lab, "lab-1", &["-n", "demo", "get", "pod", "hello"]);
            let node = json(&lab, "lab-1", &["get", "node", "tandem-milan"]);
            (pod["status"]["phase"] == "Running"
                && node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
                    .as_u64()
                    .is_some_and(|p| p > 0))
            .then_some(())
        },
    );
    let controller_pods = || {
        json(
            &lab,
            "lab-1",
            &[
                "-n",
                "tandem-system",
                "get",
                "pods",
                "-l",
                "app.kubernetes.io/name=tandem-controller",
            ],
        )
    };
    // The virtual node is reached at its controller pod's address, as a kubelet at its node's.
    let node = json(&lab, "lab-1", &["get", "node", "tandem-milan"]);
    let controller = controller_pods();
    let controller_ip = controller["items"][0]["status"]["podIP"].clone();
    assert_eq!(
        node["status"]["addresses"][0],
        serde_json::json!({"type": "InternalIP", "address": controller_ip}),
        "{node}"
    );

    // Logs: the echo program's first line, read in the provider and shown in the consumer.
    let logs = until(
        "kubectl logs of the offloaded pod",
        Duration::from_secs(30),
        || {
            let out = kubectl(&lab, "lab-1", &["-n", "demo", "logs", "hello"]);
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
        },
    );
    assert!(logs.contains("echo: listening on :"), "{logs}");
    let port: u16 = logs
        .lines()
        .find_map(|l| l.strip_prefix("echo: listening on :"))
        .and_then(|p| p.trim().parse().ok())
        .unwrap();
    let tail = ok(
        kubectl(
            &lab,
            "lab-1",
            &["-n", "demo", "logs", "hello", "--tail=1", "-c", "hello"],
        ),
        "kubectl logs --tail=1 -c",
    );
    assert_eq!(tail.lines().count(), 1, "{tail}");

    // Exec: output and exit status of built-in commands, run in the real pod.
    let hostname = ok(
        kubectl(
            &lab,
            "lab-1",
            &["-n", "demo", "exec", "hello", "--", "hostname"],
        ),
        "kubectl exec hostname",
    );
    assert_eq!(hostname.trim(), "hello");
    let usage = kubectl(
        &lab,
        "lab-1",
        &["-n", "demo", "exec", "hello", "--", "probe"],
    );
    assert_eq!(usage.status.code(), Some(2), "{}", stderr_of(&usage));
    assert!(
        stderr_of(&usage).contains("usage: probe"),
        "{}",
        stderr_of(&usage)
    );
    let missing = kubectl(&lab, "lab-1", &["-n", "demo", "exec", "hello", "--", "sh"]);
    assert_eq!(missing.status.code(), Some(127), "{}", stderr_of(&missing));

    // Port-forward: kubectl's SPDY session, tunnelled in a WebSocket to the API server (as
    // kubectl ≥ 1.31 does) or not, reaches the echo program's port in the real pod; bodies
    // beyond SPDY's 64 KiB window come back whole.
    let payload: Vec<u8> = (0..300 * 1024u32).map(|i| (i % 251) as u8).collect();
    for websockets in [true, false] {
        let forward = port_forward(
            &lab.kubeconfig,
            "lab-1",
            "demo",
            "hello",
            port,
            websockets,
            &[],
        )
        .unwrap_or_else(|e| panic!("port-forward (websockets: {websockets}): {e}"));
        let (status, body) = http(forward.port, "GET", b"");
        assert!(status.contains(" 200 "), "{status}");
        let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(answer["pod"], "hello", "{answer}");
        assert_eq!(
            answer["cluster"], "lab-2",
            "served in the provider: {answer}"
        );
        for _ in 0..2 {
            let (status, echoed) = http(forward.port, "POST", &payload);
            assert!(status.contains(" 200 "), "{status}");
            assert!(echoed == payload, "{} bytes came back", echoed.len());
        }
    }

    // Follow and attach: a request served by the echo program (made from inside its own pod
    // by exec) appears on the consumer's `logs -f` stream, and on `kubectl attach`'s output.
    for (what, args) in [
        ("logs -f", &["logs", "-f", "--tail=0", "hello"][..]),
        ("attach", &["attach", "hello"][..]),
    ] {
        let mut child = Command::new("kubectl")
            .args(["--kubeconfig", &kc, "--context", "lab-1", "-n", "demo"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let url = format!("http://127.0.0.1:{port}/{}", what.replace(' ', ""));
        let line = until(
            &format!("a new line on {what}"),
            Duration::from_secs(30),
            || {
                let _ = kubectl(
                    &lab,
                    "lab-1",
                    &["-n", "demo", "exec", "hello", "--", "probe", "fetch", &url],
                );
                rx.recv_timeout(Duration::from_secs(2)).ok()
            },
        );
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            !line.starts_with("echo: listening"),
            "{what}: only new lines: {line}"
        );
    }

    // Events of the real pod (scheduled, pulled, started in milan) show on the consumer's pod,
    // once each — after the consumer's controller restarts too.
    let events_of = || {
        let out = ok(
            kubectl(&lab, "lab-1", &["-n", "demo", "describe", "pod", "hello"]),
            "kubectl describe",
        );
        let events = out.split("Events:").nth(1).unwrap_or_default().to_string();
        let count = |reason: &str| {
            events
                .lines()
                .filter(|l| l.split_whitespace().nth(1) == Some(reason))
                .count()
        };
        (
            ["Scheduled", "Pulled", "Created", "Started"].map(count),
            events,
        )
    };
    let mut last = String::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let (before, events) = loop {
        let (counts, events) = events_of();
        if counts == [2, 1, 1, 1] {
            break (counts, events);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the provider's events on the pod, once each: {counts:?} in {last}"
        );
        last = events;
        std::thread::sleep(Duration::from_millis(250));
    };
    assert!(
        events.contains("kubelet@milan"),
        "the source names the provider: {events}"
    );
    let old_controller = controller["items"][0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    ok(
        kubectl(
            &lab,
            "lab-1",
            &["-n", "tandem-system", "delete", "pod", &old_controller],
        ),
        "restarting the consumer's controller",
    );
    until(
        "a new consumer controller reflecting again",
        Duration::from_secs(60),
        || {
            let pods = controller_pods();
            let items = pods["items"].as_array()?;
            (items.len() == 1
                && items[0]["metadata"]["name"] != old_controller.as_str()
                && items[0]["status"]["phase"] == "Running")
                .then_some(())
        },
    );
    // Give the new controller's reflection time to have re-listed (logs through the new
    // virtual kubelet prove it runs), then the counts are unchanged. Until the new controller
    // publishes its address the node names the old pod's, which a dial may wait on: each try
    // is bounded.
    until(
        "logs through the restarted controller",
        Duration::from_secs(180),
        || {
            let out = kubectl(
                &lab,
                "lab-1",
                &[
                    "--request-timeout=10s",
                    "-n",
                    "demo",
                    "logs",
                    "hello",
                    "--tail=1",
                ],
            );
            out.status.success().then_some(())
        },
    );
    assert_eq!(events_of().0, before, "no duplicate after the restart");

    // The consumer's RBAC decides first: a user who may read pods and their logs but not
    // exec is refused by the consumer's API server, whatever the provider allows.
    ok(
        kubectl(
            &lab,
            "lab-1",
            &[
                "-n",
                "demo",
                "create",
                "role",
                "viewer",
                "--verb=get",
                "--resource=pods,pods/log",
            ],
        ),
        "role",
    );
    ok(
        kubectl(
            &lab,
            "lab-1",
            &[
                "-n",
                "demo",
                "create",
                "rolebinding",
                "alice-views",
                "--role=viewer",
                "--user=alice",
            ],
        ),
        "rolebinding",
    );
    let alice_logs = ok(
        kubectl(
            &lab,
            "lab-1",
            &["--as=alice", "-n", "demo", "logs", "hello"],
        ),
        "alice reads the logs",
    );
    assert!(alice_logs.contains("echo: listening"), "{alice_logs}");
    let refused = kubectl(
        &lab,
        "lab-1",
        &[
            "--as=alice",
            "-n",
            "demo",
            "exec",
            "hello",
            "--",
            "hostname",
        ],
    );
    assert!(!refused.status.success());
    assert!(
        stderr_of(&refused).contains("User \"alice\" cannot create resource \"pods/exec\""),
        "{}",
        stderr_of(&refused)
    );
    let refused = port_forward(
        &lab.kubeconfig,
        "lab-1",
        "demo",
        "hello",
        port,
        true,
        &["--as=alice"],
    )
    .err()
    .expect("alice may not port-forward")
    .stderr;
    assert!(
        refused.contains("cannot create resource \"pods/portforward\""),
        "{refused}"
    );

    // The provider refuses exec: the consumer's user gets a 403 naming the provider's policy;
    // logs still work.
    let tenants = json(&lab, "lab-2", &["get", "tenants", "-A"]);
    let meta = &tenants["items"][0]["metadata"];
    let (tenant_ns, tenant) = (
        meta["namespace"].as_str().unwrap(),
        meta["name"].as_str().unwrap(),
    );
    ok(
        kubectl(
            &lab,
            "lab-2",
            &[
                "-n",
                tenant_ns,
                "patch",
                "tenant",
                tenant,
                "--type=merge",
                "-p",
                r#"{"spec":{"podAccess":{"exec":false,"portForward":false}}}"#,
            ],
        ),
        "refusing exec on the provider",
    );
    let denied = until(
        "exec refused by the provider",
        Duration::from_secs(30),
        || {
            let out = kubectl(
                &lab,
                "lab-1",
                &["-n", "demo", "exec", "hello", "--", "hostname"],
            );
            (!out.status.success()).then_some(out)
        },
    );
    let message = stderr_of(&denied);
    assert!(
        message.contains("Forbidden")
            && message.contains("provider milan")
            && message.contains("spec.podAccess.exec"),
        "{message}"
    );
    let logs = ok(
        kubectl(&lab, "lab-1", &["-n", "demo", "logs", "hello"]),
        "logs with exec refused",
    );
    assert!(logs.contains("echo: listening"), "{logs}");
    eprintln!("the provider's refusal, as the user reads it: {message}");
    for websockets in [true, false] {
        let refused = port_forward(
            &lab.kubeconfig,
            "lab-1",
            "demo",
            "hello",
            port,
            websockets,
            &[],
        )
        .err()
        .expect("the provider refuses port-forward")
        .stderr;
        assert!(
            refused.contains("provider milan") && refused.contains("spec.podAccess.portForward"),
            "websockets: {websockets}: {refused}"
        );
    }

    // kubectl top: the consumer's metrics API (metrics-server's, built into lab clusters)
    // scrapes the virtual node's kubelet API like any kubelet's, which reads the provider's.
    ok(
        kubectl(
            &lab,
            "lab-1",
            &[
                "-n",
                "demo",
                "run",
                "local",
                "--image=tandem.dev/echo",
                "--overrides",
                r#"{"spec":{"nodeSelector":{"kubernetes.io/hostname":"lab-1-node-1"}}}"#,
            ],
        ),
        "kubectl run (local)",
    );
    // Port-forward to a local pod: the lab kubelet's own SPDY endpoint.
    until("the local pod Running", Duration::from_secs(90), || {
        let pod = json(&lab, "lab-1", &["-n", "demo", "get", "pod", "local"]);
        (pod["status"]["phase"] == "Running").then_some(())
    });
    let forward = port_forward(&lab.kubeconfig, "lab-1", "demo", "local", port, true, &[])
        .unwrap_or_else(|e| panic!("port-forward to the local pod: {e}"));
    let (status, echoed) = http(forward.port, "POST", &payload);
    assert!(status.contains(" 200 ") && echoed == payload, "{status}");
    drop(forward);
    // Two scrapes of the provider's kubelet, then two of the virtual kubelet, 15 s apart: a
    // generous bound, and what top last said if it is exceeded.
    let mut last = String::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    let top = loop {
        let out = kubectl(
            &lab,
            "lab-1",
            &["-n", "demo", "top", "pods", "--no-headers"],
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let names: Vec<&str> = text
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        if names.contains(&"hello") && names.contains(&"local") {
            break text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "kubectl top pods with both pods; it said: {last}"
        );
        last = format!("{text}{}", stderr_of(&out));
        std::thread::sleep(Duration::from_secs(1));
    };
    eprintln!("kubectl top pods -n demo:\n{top}");
    let nodes = until(
        "kubectl top nodes with the virtual node",
        Duration::from_secs(180),
        || {
            let out = kubectl(&lab, "lab-1", &["top", "nodes", "--no-headers"]);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.lines()
                .any(|l| l.split_whitespace().next() == Some("tandem-milan"))
                .then_some(text)
        },
    );
    eprintln!("kubectl top nodes:\n{nodes}");
}
