//! Liqo-style service exposition, with the MCS API: a Service of 1, 10 and 100 endpoints is
//! created and exported in a provider (milan); the time until its EndpointSlice there has every
//! endpoint ready is compared, in one run, with the time until the ServiceImport's slices in
//! the peer (rome, its consumer) have them all ready. Then 100 exports of Services whose
//! endpoints are already ready: the latency from the ServiceExport's creation to the endpoint
//! ready in the peer's import (p50 and p99).
//!
//! Both lab clusters run in this process (hollow nodes); their Tandem controllers are
//! `tandem controller` processes; peering goes through the real CLI.
//! Run: `cargo build --release -p tandem-cli && cargo bench -p tandem-benches --bench mcs`.

use std::time::{Duration, Instant};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DynamicObject, ListParams, PostParams};

use crate::{sites, tandem};

async fn create(
    client: &kube::Client,
    ns: Option<&str>,
    v: serde_json::Value,
) -> anyhow::Result<()> {
    let obj: DynamicObject = serde_json::from_value(v.clone())?;
    let gvk = kube::core::GroupVersionKind::try_from(obj.types.as_ref().expect("types"))?;
    let (ar, _) = kube::discovery::pinned_kind(client, &gvk).await?;
    let api: Api<DynamicObject> = match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    api.create(&PostParams::default(), &obj).await?;
    Ok(())
}

/// Ready endpoints of the slices of `ns` matching `selector`.
async fn ready(client: &kube::Client, ns: &str, selector: &str) -> usize {
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
    api.list(&ListParams::default().labels(selector))
        .await
        .map(|l| {
            l.items
                .iter()
                .flat_map(|s| s.endpoints.iter())
                .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
                .count()
        })
        .unwrap_or(0)
}

/// Whether the ServiceImport `ns/name` has its IP (what `clusterset.local` answers with).
async fn import_ip(client: &kube::Client, ns: &str, name: &str) -> bool {
    let resource = kube::core::ApiResource {
        group: "multicluster.x-k8s.io".into(),
        version: "v1alpha1".into(),
        api_version: "multicluster.x-k8s.io/v1alpha1".into(),
        kind: "ServiceImport".into(),
        plural: "serviceimports".into(),
    };
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource);
    api.get_opt(name).await.ok().flatten().is_some_and(|i| {
        i.data["spec"]["ips"]
            .as_array()
            .is_some_and(|ips| !ips.is_empty())
    })
}

/// Where a Service counts as ready: its own slices, or (an import) the slices of the import
/// and the import's IP, since a client can use neither without the other.
enum Ready<'a> {
    Local,
    Import(&'a str),
}

/// Polls (every 5 ms) until `selector`'s slices in `ns` have `n` ready endpoints (and, for an
/// import, it has its IP); the time since `t0`.
async fn until_ready(
    client: &kube::Client,
    ns: &str,
    selector: &str,
    n: usize,
    t0: Instant,
    kind: Ready<'_>,
) -> Duration {
    loop {
        let complete = match kind {
            Ready::Local => true,
            Ready::Import(name) => import_ip(client, ns, name).await,
        };
        if complete && ready(client, ns, selector).await >= n {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "{selector}: not ready in 120 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn service(
    client: &kube::Client,
    ns: &str,
    name: &str,
    replicas: usize,
    export: bool,
) -> anyhow::Result<()> {
    create(client, Some(ns), serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "main", "image": "nginx", "ports": [{"containerPort": 8080}]}]}}},
    })).await?;
    create(client, Some(ns), serde_json::json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
        "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
    })).await?;
    if export {
        export_service(client, ns, name).await?;
    }
    Ok(())
}

async fn export_service(client: &kube::Client, ns: &str, name: &str) -> anyhow::Result<()> {
    create(
        client,
        Some(ns),
        serde_json::json!({
            "apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceExport",
            "metadata": {"name": name},
        }),
    )
    .await
}

pub fn main() -> anyhow::Result<()> {
    tokio::runtime::Runtime::new()?.block_on(run())
}

async fn run() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    // Room in milan for every round's pods (5 × (1 + 10 + 100) + 100, at 110 per node).
    let sites = sites(
        dir.path(),
        &[("milan", "eu-south", 8), ("rome", "eu-central", 8)],
    )
    .await?;
    let (milan, mk) = (&sites[0].cluster, sites[0].kubeconfig.clone());
    let (rome, rk) = (&sites[1].cluster, sites[1].kubeconfig.clone());
    let invite = tandem(&["invite", "--kubeconfig", &mk])?;
    tandem(&["peer", &invite, "--kubeconfig", &rk])?;
    let ns = "mcs-bench";
    for c in [&milan.client, &rome.client] {
        create(
            c,
            None,
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )
        .await?;
    }
    // Let the controllers' caches settle after peering.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Each size several times (one sample of a ~20 ms path is mostly noise): the medians.
    const ROUNDS: usize = 5;
    println!(
        "\n| endpoints | local EndpointSlice ready (ms, median of {ROUNDS}) | import ready in the peer (ms, median of {ROUNDS}) | ratio |"
    );
    println!("|---:|---:|---:|---:|");
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    for n in [1usize, 10, 100] {
        let (mut locals, mut imports) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            let name = format!("svc-{n}-{round}");
            let t0 = Instant::now();
            service(&milan.client, ns, &name, n, true).await?;
            let local_sel = format!("kubernetes.io/service-name={name}");
            let import_sel = format!("multicluster.kubernetes.io/service-name={name}");
            let (local, import) = tokio::join!(
                until_ready(&milan.client, ns, &local_sel, n, t0, Ready::Local),
                until_ready(&rome.client, ns, &import_sel, n, t0, Ready::Import(&name)),
            );
            locals.push(local);
            imports.push(import);
        }
        let (local, import) = (median(locals), median(imports));
        println!(
            "| {n} | {:.0} | {:.0} | {:.2} |",
            local.as_secs_f64() * 1e3,
            import.as_secs_f64() * 1e3,
            import.as_secs_f64() / local.as_secs_f64()
        );
    }

    // 100 exports of Services whose endpoints are ready.
    let count = 100;
    for i in 0..count {
        service(&milan.client, ns, &format!("one-{i}"), 1, false).await?;
    }
    for i in 0..count {
        until_ready(
            &milan.client,
            ns,
            &format!("kubernetes.io/service-name=one-{i}"),
            1,
            Instant::now(),
            Ready::Local,
        )
        .await;
    }
    let mut latencies = Vec::new();
    for i in 0..count {
        let name = format!("one-{i}");
        let t0 = Instant::now();
        export_service(&milan.client, ns, &name).await?;
        latencies.push(
            until_ready(
                &rome.client,
                ns,
                &format!("multicluster.kubernetes.io/service-name={name}"),
                1,
                t0,
                Ready::Import(&name),
            )
            .await,
        );
    }
    latencies.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "\n{count} exports (endpoints already ready), ServiceExport created → endpoint ready in the peer's import: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        ms(latencies[count / 2]),
        ms(latencies[count * 99 / 100 - 1]),
        ms(latencies[count - 1]),
    );
    Ok(())
}
