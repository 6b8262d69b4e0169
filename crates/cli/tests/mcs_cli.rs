//! Multi-cluster services on network-mode lab clusters, through the CLI and kubectl: rome
//! (lab-1) consumes from milan (lab-2) and turin (lab-3), all on 10.244.0.0/16. A Service
//! exported from milan (not offloaded: no virtual node involved) is reached from a pod in rome
//! as `hello.demo.svc.clusterset.local` and at its ServiceImport's IP; exported from turin too,
//! both answer; unexported from turin, only milan does. A headless export resolves each pod as
//! `<hostname>.<cluster>.<svc>.<ns>.svc.clusterset.local`. rome's admin opts its namespace demo
//! in for the providers' exports. Nothing derived is left after.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::netlab;
use netlab::{json, kubectl, ok, rome_consumes_from_milan_and_turin, run_pod, tandem, until};

/// How long an import may take to carry traffic (generous: the benchmark measures it).
const WAIT: Duration = Duration::from_secs(90);

/// Which clusters answered `count` requests to `url` from rome's pod demo/probe (None while
/// a request fails).
fn answers(lab: &netlab::Lab, url: &str, count: u32) -> Option<BTreeMap<String, u32>> {
    let out = kubectl(
        lab,
        "lab-1",
        &[
            "-n",
            "demo",
            "exec",
            "probe",
            "--",
            "probe",
            "fetch",
            "--count",
            &count.to_string(),
            url,
        ],
    );
    if !out.status.success() {
        return None;
    }
    let mut by_cluster = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let reply: Value = serde_json::from_str(line).ok()?;
        *by_cluster
            .entry(reply["cluster"].as_str()?.to_string())
            .or_default() += 1;
    }
    Some(by_cluster)
}

/// `tandem export|unexport service demo/NAME` on `ctx`.
fn tandem_on(home: &std::path::Path, kc: &str, ctx: &str, args: &[&str]) -> String {
    let mut all = args.to_vec();
    all.extend(["--kubeconfig", kc, "--context", ctx]);
    ok(
        tandem(home, &all),
        &format!("tandem {} on {ctx}", args.join(" ")),
    )
}

/// The pod network address `ip` of cluster `provider` as rome sees it.
fn in_rome(lab: &netlab::Lab, provider: &str, ip: &str) -> String {
    let peering = json(lab, "lab-1", &["get", "peering", provider]);
    let n = &peering["status"]["network"];
    let (there, here): (ipnet::Ipv4Net, ipnet::Ipv4Net) = (
        n["remotePodCidr"].as_str().unwrap().parse().unwrap(),
        n["remappedRemotePodCidr"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap(),
    );
    let ip: std::net::Ipv4Addr = ip.parse().unwrap();
    let host = u32::from(ip) - u32::from(there.network());
    std::net::Ipv4Addr::from(u32::from(here.network()) + host).to_string()
}

#[test]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
fn exported_services_are_reached_by_clusterset_names_from_a_peer() {
    tandem_testing::needs_root();
    let home = tempfile::tempdir().unwrap();
    let lab = rome_consumes_from_milan_and_turin(home.path());
    let kc = lab.kubeconfig.clone();
    for ctx in ["lab-1", "lab-2", "lab-3"] {
        ok(
            kubectl(&lab, ctx, &["create", "namespace", "demo"]),
            "namespace",
        );
    }
    // rome's admin shares its demo with the providers' exports (a peer's export is imported
    // only in its own twin namespace or where the admin opts in).
    ok(
        kubectl(
            &lab,
            "lab-1",
            &[
                "annotate",
                "namespace",
                "demo",
                "mcs.tandem.dev/import-from=milan,turin",
            ],
        ),
        "opt demo in for milan's and turin's exports",
    );
    // hello: an echo Deployment behind a Service, in milan and in turin.
    for ctx in ["lab-2", "lab-3"] {
        ok(
            kubectl(
                &lab,
                ctx,
                &[
                    "-n",
                    "demo",
                    "create",
                    "deployment",
                    "hello",
                    "--image=tandem.dev/echo",
                    "--replicas=2",
                    "--port=8080",
                ],
            ),
            "deployment",
        );
        ok(
            kubectl(
                &lab,
                ctx,
                &[
                    "-n",
                    "demo",
                    "expose",
                    "deployment",
                    "hello",
                    "--port=80",
                    "--target-port=8080",
                    "--name=hello",
                ],
            ),
            "service",
        );
    }
    run_pod(&lab, "lab-1", "demo", "probe", "probe", None);

    // Exported from milan only: rome's pod reaches it by name and at the import's IP.
    let out = tandem_on(
        home.path(),
        &kc,
        "lab-2",
        &["export", "service", "demo/hello"],
    );
    assert!(
        out.contains("hello.demo.svc.clusterset.local exported"),
        "{out}"
    );
    let name_url = "http://hello.demo.svc.clusterset.local/";
    let by_name = until(
        "rome reaches milan's hello by its clusterset name",
        WAIT,
        || answers(&lab, name_url, 10),
    );
    assert_eq!(by_name.keys().collect::<Vec<_>>(), ["lab-2"], "{by_name:?}");
    let import = json(
        &lab,
        "lab-1",
        &["-n", "demo", "get", "serviceimport", "hello"],
    );
    let ip = import["spec"]["ips"][0]
        .as_str()
        .expect("the import's IP")
        .to_string();
    assert_eq!(import["spec"]["type"], "ClusterSetIP");
    let by_ip = answers(&lab, &format!("http://{ip}/"), 10).expect("the import's IP answers");
    assert_eq!(by_ip.keys().collect::<Vec<_>>(), ["lab-2"], "{by_ip:?}");
    let resolved = ok(
        kubectl(
            &lab,
            "lab-1",
            &[
                "-n",
                "demo",
                "exec",
                "probe",
                "--",
                "probe",
                "resolve",
                "hello.demo.svc.clusterset.local",
            ],
        ),
        "resolve",
    );
    assert!(
        resolved.contains(&format!("has address {ip}")),
        "{resolved}"
    );

    // Exported from turin too: the import merges both; 100 requests reach both clusters.
    tandem_on(
        home.path(),
        &kc,
        "lab-3",
        &["export", "service", "demo/hello"],
    );
    let both = until("both milan and turin answer", WAIT, || {
        answers(&lab, name_url, 100).filter(|a| a.len() == 2)
    });
    assert_eq!(
        both.keys().collect::<Vec<_>>(),
        ["lab-2", "lab-3"],
        "{both:?}"
    );
    assert_eq!(both.values().sum::<u32>(), 100);

    // Unexported from turin: only milan answers (the time it takes is in benches/README.md).
    let t0 = Instant::now();
    tandem_on(
        home.path(),
        &kc,
        "lab-3",
        &["unexport", "service", "demo/hello"],
    );
    until("only milan answers", WAIT, || {
        answers(&lab, name_url, 20).filter(|a| a.keys().eq(["lab-2"].iter()))
    });
    eprintln!("unexport → only milan answers: {:?}", t0.elapsed());

    // kubectl shows the upstream printer columns.
    let table = ok(
        kubectl(
            &lab,
            "lab-1",
            &["get", "serviceexports,serviceimports", "-A"],
        ),
        "kubectl get",
    );
    let header = table
        .lines()
        .find(|l| l.contains("TYPE"))
        .unwrap_or_else(|| panic!("no ServiceImport table: {table}"));
    let columns: Vec<&str> = header.split_whitespace().collect();
    assert_eq!(
        columns,
        ["NAMESPACE", "NAME", "TYPE", "IP", "AGE"],
        "{table}"
    );
    assert!(
        table.contains("ClusterSetIP") && table.contains(&ip),
        "{table}"
    );
    let exports = ok(
        kubectl(&lab, "lab-2", &["get", "serviceexports", "-A"]),
        "kubectl get",
    );
    let header: Vec<&str> = exports.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAMESPACE", "NAME", "AGE"], "{exports}");

    // Headless: a pod with a hostname under a headless Service in milan, resolvable from
    // rome by <hostname>.<cluster>.<svc>.<ns>.svc.clusterset.local at rome's address for it.
    ok(
        kubectl(
            &lab,
            "lab-2",
            &[
                "-n",
                "demo",
                "create",
                "service",
                "clusterip",
                "db",
                "--clusterip=None",
                "--tcp=5432:5432",
            ],
        ),
        "headless service",
    );
    let db_ip = run_pod(
        &lab,
        "lab-2",
        "demo",
        "db-0",
        "echo",
        Some(r#"{"metadata":{"labels":{"app":"db"}},"spec":{"hostname":"db-0","subdomain":"db"}}"#),
    );
    tandem_on(home.path(), &kc, "lab-2", &["export", "service", "demo/db"]);
    let want = in_rome(&lab, "milan", &db_ip.to_string());
    until(
        "db-0.milan.db.demo.svc.clusterset.local resolves in rome",
        WAIT,
        || {
            let out = kubectl(
                &lab,
                "lab-1",
                &[
                    "-n",
                    "demo",
                    "exec",
                    "probe",
                    "--",
                    "probe",
                    "resolve",
                    "db-0.milan.db.demo.svc.clusterset.local",
                ],
            );
            String::from_utf8_lossy(&out.stdout)
                .contains(&format!("has address {want}"))
                .then_some(())
        },
    );

    // The other direction: rome (the consumer) exports, milan (its provider) imports. milan
    // has no virtual node for rome: its endpoints are ready while milan's gateway reports the
    // tunnel to rome connected.
    ok(
        kubectl(
            &lab,
            "lab-1",
            &[
                "-n",
                "demo",
                "expose",
                "pod",
                "probe",
                "--name=back",
                "--port=80",
            ],
        ),
        "service back in rome",
    );
    // The reverse direction is milan's admin's choice to make: demo is not a twin of rome's.
    ok(
        kubectl(
            &lab,
            "lab-2",
            &[
                "annotate",
                "namespace",
                "demo",
                "mcs.tandem.dev/import-from=rome",
            ],
        ),
        "opt milan's demo in for rome's exports",
    );
    tandem_on(
        home.path(),
        &kc,
        "lab-1",
        &["export", "service", "demo/back"],
    );
    until("rome's export ready in milan's import", WAIT, || {
        let slices = json(
            &lab,
            "lab-2",
            &[
                "-n",
                "demo",
                "get",
                "endpointslices",
                "-l",
                "multicluster.kubernetes.io/service-name=back,multicluster.kubernetes.io/source-cluster=rome",
            ],
        );
        slices["items"]
            .as_array()?
            .iter()
            .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
            .any(|e| e["conditions"]["ready"] == true)
            .then_some(())
    });
    tandem_on(
        home.path(),
        &kc,
        "lab-1",
        &["unexport", "service", "demo/back"],
    );

    // `tandem status` lists the imports with their clusters.
    let status = ok(
        tandem(
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
        ),
        "status",
    );
    let status: Value = serde_json::from_str(&status).unwrap();
    let imported: Vec<(String, String)> = status["importedServices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["name"].as_str().unwrap().to_string(),
                i["clusters"].to_string(),
            )
        })
        .collect();
    assert!(
        imported.contains(&("hello".into(), r#"["milan"]"#.into())),
        "{imported:?}"
    );
    assert!(
        imported.contains(&("db".into(), r#"["milan"]"#.into())),
        "{imported:?}"
    );

    // Unexport everything: nothing derived is left in rome.
    for svc in ["demo/hello", "demo/db"] {
        tandem_on(home.path(), &kc, "lab-2", &["unexport", "service", svc]);
    }
    until(
        "no ServiceImport, derived Service or EndpointSlice left in rome",
        WAIT,
        || {
            let imports = json(&lab, "lab-1", &["get", "serviceimports", "-A"]);
            let services = json(
                &lab,
                "lab-1",
                &[
                    "get",
                    "services",
                    "-A",
                    "-l",
                    "multicluster.kubernetes.io/service-name",
                ],
            );
            let slices = json(
                &lab,
                "lab-1",
                &[
                    "get",
                    "endpointslices",
                    "-A",
                    "-l",
                    "multicluster.kubernetes.io/service-name",
                ],
            );
            [imports, services, slices]
                .iter()
                .all(|l| l["items"].as_array().is_some_and(Vec::is_empty))
                .then_some(())
        },
    );
}
