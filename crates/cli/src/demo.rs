//! `tandem demo`: the whole story on one machine — two lab clusters, Tandem installed on both,
//! peered with an invite, a namespace offloaded, an application with a Service deployed, and
//! where each pod runs.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tandem_api::{NamespaceOffloading, names};
use tandem_lab::{Lab, LabSpec};

use crate::table;
use crate::workdir::{self, Use};

/// Start two lab clusters, peer them with an invite, offload a namespace and deploy an
/// application whose pods run in both clusters.
#[derive(clap::Args)]
#[command(
    after_help = "The first cluster (lab-1) is the consumer, the second (lab-2) the provider. \
Both use the pod CIDR 10.244.0.0/16, so the peering remaps it.\n\nAfterwards, in another terminal:\n  \
kubectl --kubeconfig ~/.tandem/demo/kubeconfig --context lab-1 get pods -n demo -o wide\n  \
tandem status --kubeconfig ~/.tandem/demo/kubeconfig --context lab-1\n\nWith --network \
(root): the clusters run real pods in network namespaces on one lab WAN, Tandem builds the \
network fabric (a WireGuard gateway per side), the application is the built-in echo server, \
and the demo shows requests crossing clusters: a probe pod in lab-1 calling the Service, \
answered by pods of both clusters, and an offloaded probe in lab-2 reaching lab-1's pods \
through the Service's reflection."
)]
pub struct Args {
    /// Directory for the clusters' data and the kubeconfig [default: ~/.tandem/demo]; cleared
    /// on start, so it must be new, empty, or one Tandem created.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Hollow nodes per cluster.
    #[arg(long, default_value_t = 2)]
    nodes: usize,
    /// Replicas of the demo application.
    #[arg(long, default_value_t = 6)]
    replicas: i32,
    /// Exit once the demo is shown instead of keeping the clusters running.
    #[arg(long)]
    exit: bool,
    /// Real pods and the network fabric (root): requests cross clusters through the peering's
    /// gateways.
    #[arg(long)]
    network: bool,
}

const NS: &str = "demo";
const APP: &str = "hello";

/// Requests each probe of `--network` sends per round (each on a new connection, so that the
/// Service picks an endpoint each time).
const PROBE_REQUESTS: usize = 12;

/// Rounds the table counts, from the first round in which every request was answered: the
/// Service picks endpoints at random (as kube-proxy does), so two rounds leave a cluster
/// holding a third of the endpoints unpicked about once in 17,000 demos, where one round
/// would about once in 130.
const PROBE_ROUNDS: usize = 2;

/// Which cluster answered how often, read from a probe's log (`fetch URL: {json}` or
/// `fetch URL: error: …` per request, `per_round` requests a round): `rounds` complete rounds
/// counted from the first round without an error, so that requests sent while the fabric
/// was still coming up (the first ones through a new tunnel can time out) do not make the
/// table say that only the local cluster answers. `None` until that many rounds are logged.
fn settled_answers(
    log: &str,
    url: &str,
    per_round: usize,
    rounds: usize,
) -> Option<std::collections::BTreeMap<String, usize>> {
    let prefix = format!("fetch {url}: ");
    // Each request's answering cluster, or None for an error or an unreadable reply.
    let replies: Vec<Option<String>> = log
        .lines()
        .filter_map(|line| line.strip_prefix(&prefix))
        .map(|body| {
            serde_json::from_str::<serde_json::Value>(body)
                .ok()
                .and_then(|reply| reply["cluster"].as_str().map(str::to_string))
        })
        .collect();
    let chunks: Vec<&[Option<String>]> = replies.chunks_exact(per_round).collect();
    let first = chunks
        .iter()
        .position(|round| round.iter().all(Option::is_some))?;
    let counted = chunks.get(first..first + rounds)?;
    let mut answers = std::collections::BTreeMap::new();
    for cluster in counted.iter().flat_map(|round| round.iter().flatten()) {
        *answers.entry(cluster.clone()).or_default() += 1;
    }
    Some(answers)
}

fn step(n: u32, of: u32, what: &str) {
    eprintln!("[{n}/{of}] {what}");
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let of = if args.network { 7 } else { 6 };
    let step = |n, what: &str| step(n, of, what);
    if args.network {
        tandem_lab::network::topology::require_root()
            .context("tandem demo --network (run it with sudo, or without --network)")?;
    }
    let default = workdir::default_dir("demo");
    let dir = args.dir.clone().unwrap_or(default.clone());
    // A demo starts from scratch: objects of an earlier run would only confuse it. Only a
    // directory Tandem made is ever cleared.
    workdir::claim(&dir, &default, Use::Fresh)?;

    step(
        1,
        if args.network {
            "starting two lab clusters in network mode (real pods, one lab WAN)"
        } else {
            "starting two lab clusters"
        },
    );
    let lab = Lab::start(
        &LabSpec {
            clusters: 2,
            nodes: args.nodes,
            dir: Some(dir.clone()),
            network: args.network,
            tandem_binary: args.network.then(std::env::current_exe).transpose()?,
            profile: Default::default(),
        },
        |c| {
            eprintln!(
                "      ✓ {} ({}) at {}",
                c.config.name,
                c.config.region,
                c.server.url()
            );
        },
    )
    .await?;
    let kubeconfig = workdir::write_kubeconfig(&dir, &lab.kubeconfig()?)?;
    let (consumer, provider) = (&lab.clusters[0], &lab.clusters[1]);
    let (consumer_id, provider_id) = (consumer.config.name.clone(), provider.config.name.clone());

    step(2, "installing Tandem on both clusters");
    for c in &lab.clusters {
        let options = tandem_admin::install::InstallOptions {
            cluster_id: Some(c.config.name.clone()),
            pod_cidr: Some(c.config.pod_cidr.clone()),
            network_fabric: Some(args.network),
            ..Default::default()
        };
        tandem_admin::install::install(&c.client, &options, &mut |_| {})
            .await
            .with_context(|| format!("installing Tandem on {}", c.config.name))?;
        if args.network {
            // A network-mode lab runs the controller's Deployment as its pod (Tandem's image
            // is this binary): a second controller here would race it.
            eprintln!("      ✓ {} (controller pod starting)", c.config.name);
            continue;
        }
        tokio::spawn(crate::host::host_controller(
            c.config.name.clone(),
            c.client.clone(),
            tandem_controller::Options {
                heartbeat: Duration::from_secs(1),
                ..Default::default()
            },
        ));
        eprintln!("      ✓ {} (controller running)", c.config.name);
    }

    step(
        3,
        &format!(
            "peering {consumer_id} (consumer) with {provider_id} (provider) through an invite"
        ),
    );
    // Controllers in pods reach the provider's API server on the lab WAN.
    let endpoint = match provider.wan_url() {
        Some(url) if args.network => url,
        _ => provider.server.url(),
    };
    let invite = tandem_admin::invite::create(
        &provider.client,
        &endpoint,
        provider.server.ca_pem(),
        Duration::from_secs(600),
    )
    .await
    .context("creating the invite on the provider")?;
    tandem_admin::invite::accept(&consumer.client, &invite)
        .await
        .context("accepting the invite on the consumer")?;
    tandem_admin::invite::wait_established(
        &consumer.client,
        &provider_id,
        Duration::from_secs(60),
        &mut |l| eprintln!("      ✓ {l}"),
    )
    .await
    .context("establishing the peering")?;
    let vn = names::virtual_node_name(&provider_id);
    wait(
        &format!("virtual node {vn} Ready"),
        Duration::from_secs(60),
        async || {
            let node = Api::<Node>::all(consumer.client.clone())
                .get_opt(&vn)
                .await?;
            Ok(node.as_ref().is_some_and(crate::status::node_ready))
        },
    )
    .await?;
    eprintln!("      ✓ virtual node {vn} Ready");
    if args.network {
        // Until the tunnel is up the virtual node is NetworkUnavailable, and tainted so that
        // nothing is scheduled there.
        wait(
            &format!("the tunnel to {provider_id} (virtual node {vn} NetworkUnavailable=False)"),
            Duration::from_secs(90),
            async || {
                let node = Api::<Node>::all(consumer.client.clone())
                    .get_opt(&vn)
                    .await?;
                Ok(node.and_then(|n| n.status?.conditions).is_some_and(|c| {
                    c.iter()
                        .any(|c| c.type_ == "NetworkUnavailable" && c.status == "False")
                }))
            },
        )
        .await?;
        eprintln!("      ✓ tunnel to {provider_id} connected (gateways on both sides)");
    }

    step(
        4,
        &format!("offloading namespace {NS:?} (pods may run locally and remotely)"),
    );
    let pp = PatchParams::apply(names::FIELD_MANAGER).force();
    Api::<Namespace>::all(consumer.client.clone())
        .patch(
            NS,
            &pp,
            &Patch::Apply(
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}),
            ),
        )
        .await
        .context("creating namespace demo")?;
    let offloadings: Api<NamespaceOffloading> = Api::namespaced(consumer.client.clone(), NS);
    offloadings
        .patch(
            names::OFFLOADING_NAME,
            &pp,
            &Patch::Apply(json!({
                "apiVersion": "tandem.dev/v1alpha1", "kind": "NamespaceOffloading",
                "metadata": {"name": names::OFFLOADING_NAME},
                "spec": {"podOffloadingStrategy": "LocalAndRemote"},
            })),
        )
        .await
        .context("creating the NamespaceOffloading")?;
    wait(
        "the twin namespace on the provider",
        Duration::from_secs(60),
        async || {
            let o = offloadings.get(names::OFFLOADING_NAME).await?;
            Ok(o.status.and_then(|s| s.phase).as_deref() == Some("Ready"))
        },
    )
    .await?;
    let twin = offloadings
        .get(names::OFFLOADING_NAME)
        .await?
        .status
        .and_then(|s| s.remote_namespaces.into_iter().next())
        .map(|r| r.namespace)
        .ok_or_else(|| anyhow!("the NamespaceOffloading names no twin namespace"))?;
    eprintln!("      ✓ twin namespace {twin} on {provider_id}");

    step(
        5,
        &format!("deploying {APP} ({} replicas) and a Service", args.replicas),
    );
    let deployments: Api<Deployment> = Api::namespaced(consumer.client.clone(), NS);
    // Network mode runs real processes, and only built-in programs: the echo server.
    let (image, port) = if args.network {
        ("tandem.dev/echo", 8080)
    } else {
        ("nginx:1.27", 80)
    };
    deployments
        .patch(
            APP,
            &pp,
            &Patch::Apply(json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": APP},
                "spec": {
                    "replicas": args.replicas,
                    "selector": {"matchLabels": {"app": APP}},
                    "template": {
                        "metadata": {"labels": {"app": APP}},
                        "spec": {"containers": [{"name": "web", "image": image,
                            "ports": [{"containerPort": port, "name": "http"}],
                            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]},
                    },
                },
            })),
        )
        .await
        .context("creating the Deployment")?;
    Api::<Service>::namespaced(consumer.client.clone(), NS)
        .patch(
            APP,
            &pp,
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": APP},
                "spec": {"selector": {"app": APP}, "ports": [{"port": 80, "targetPort": "http"}]},
            })),
        )
        .await
        .context("creating the Service")?;
    let replicas = args.replicas;
    wait(
        &format!("{replicas} Ready pods"),
        Duration::from_secs(120),
        async || {
            let d = deployments.get(APP).await?;
            Ok(d.status.and_then(|s| s.ready_replicas).unwrap_or(0) == replicas)
        },
    )
    .await?;
    // The Service's endpoints follow the pods' readiness (EndpointSlice controller), and their
    // reflection in the provider follows those: the report waits for both rather than show a
    // count caught mid-way. Not converging is reported, not fatal.
    let converged = wait(
        "the Service's endpoints in both clusters",
        Duration::from_secs(60),
        async || {
            let (here, there) = ready_endpoints(&consumer.client, &provider.client, &twin).await?;
            Ok(i64::try_from(here).ok() == Some(i64::from(replicas)) && there == here)
        },
    )
    .await;
    if let Err(e) = converged {
        eprintln!("warning: {e}");
    }

    step(6, "where the pods run");
    // Listen before the report is out: a Ctrl-C that comes as it prints stops the demo cleanly.
    let interrupted = crate::interrupt()?;
    let report = report(
        &consumer.client,
        &provider.client,
        &vn,
        &provider_id,
        &consumer_id,
        &twin,
    )
    .await?;
    print!("{report}");
    if args.network {
        step(
            7,
            "requests crossing clusters: a probe in each cluster calls the Service",
        );
        print!(
            "{}",
            crossing(&consumer.client, &vn, &consumer_id, &provider_id).await?
        );
    }
    eprintln!(
        "\ndone in {:.1}s. kubeconfig: {k}\n  kubectl --kubeconfig {k} --context lab-1 get pods -n {NS} -o wide\n  kubectl --kubeconfig {k} --context lab-2 get pods -n {twin} -o wide\n  tandem status --kubeconfig {k} --context lab-1",
        started.elapsed().as_secs_f64(),
        k = kubeconfig.display()
    );
    if !args.exit {
        eprintln!("Ctrl-C stops the clusters.");
        interrupted.await;
        eprintln!("stopping the clusters");
    }
    lab.shutdown();
    if !args.exit {
        eprintln!(
            "demo stopped; its data and kubeconfig stay in {}",
            dir.display()
        );
    }
    Ok(())
}

/// Network mode: two probe pods call the demo's Service by its short name, each
/// [`PROBE_REQUESTS`] times — one on a node of the consumer (the Service's ClusterIP there),
/// one offloaded to the provider (where the name is the Service's reflection in the twin
/// namespace) — and a table says which cluster answered how often.
async fn crossing(
    consumer: &Client,
    vn: &str,
    consumer_id: &str,
    provider_id: &str,
) -> anyhow::Result<String> {
    let pods: Api<Pod> = Api::namespaced(consumer.clone(), NS);
    let local_node = Api::<Node>::all(consumer.clone())
        .list(&ListParams::default().labels(&format!("!{}", names::NODE_TYPE_LABEL)))
        .await?
        .items
        .first()
        .map(ResourceExt::name_any)
        .ok_or_else(|| anyhow!("the consumer has no node of its own for the probe"))?;
    let url = format!("http://{APP}:80/");
    let args: Vec<String> = std::iter::once("fetch".to_string())
        .chain(std::iter::repeat_n(url.clone(), PROBE_REQUESTS))
        .collect();
    let probes = [
        (
            "probe-local",
            json!({"nodeName": local_node}),
            consumer_id,
            format!("{url} (the Service in {consumer_id})"),
        ),
        (
            "probe-offloaded",
            json!({"nodeSelector": {"kubernetes.io/hostname": vn}}),
            provider_id,
            format!("{url} (its reflection in {provider_id})"),
        ),
    ];
    let pp = PatchParams::apply(names::FIELD_MANAGER).force();
    for (name, placement, _, _) in &probes {
        let mut spec = json!({"containers": [{"name": "probe", "image": "tandem.dev/probe",
            "args": args}]});
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), placement.as_object()) {
            spec.extend(extra.clone());
        }
        pods.patch(
            name,
            &pp,
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name}, "spec": spec})),
        )
        .await
        .with_context(|| format!("creating the probe pod {NS}/{name}"))?;
    }
    let mut t = table::new(["PROBE", "RUNS IN", "CALLS", "ANSWERED BY"]);
    for (name, _, runs_in, calls) in probes {
        let mut answers = std::collections::BTreeMap::<String, usize>::new();
        let waited = wait(
            &format!(
                "{PROBE_ROUNDS} rounds of {PROBE_REQUESTS} answered requests in the log of {NS}/{name}"
            ),
            Duration::from_secs(90),
            async || {
                let log = match pods.logs(name, &Default::default()).await {
                    Ok(log) => log,
                    // Not started yet: no log to read.
                    Err(kube::Error::Api(_)) => return Ok(false),
                    Err(e) => return Err(e.into()),
                };
                Ok(match settled_answers(&log, &url, PROBE_REQUESTS, PROBE_ROUNDS) {
                    Some(counted) => {
                        answers = counted;
                        true
                    }
                    None => false,
                })
            },
        )
        .await;
        let answered = match waited {
            Ok(()) => answers
                .iter()
                .map(|(cluster, n)| format!("{cluster} ×{n}"))
                .collect::<Vec<_>>()
                .join(", "),
            Err(e) => format!("(no answer yet: {e})"),
        };
        t.add_row([name.to_string(), runs_in.to_string(), calls, answered]);
    }
    Ok(table::render(t, 0))
}

async fn report(
    consumer: &Client,
    provider: &Client,
    vn: &str,
    provider_id: &str,
    consumer_id: &str,
    twin: &str,
) -> anyhow::Result<String> {
    let mut t = table::new(["POD", "NODE", "CLUSTER", "IP (consumer view)"]);
    let pods = Api::<Pod>::namespaced(consumer.clone(), NS)
        .list(&ListParams::default())
        .await?;
    let (mut local, mut remote) = (0, 0);
    for p in &pods.items {
        let node = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        let cluster = if node == vn {
            remote += 1;
            provider_id
        } else {
            local += 1;
            consumer_id
        };
        let ip = p
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .unwrap_or_default();
        t.add_row([p.name_any(), node, cluster.to_string(), ip]);
    }
    let mut out = table::render(t, 0);
    let (here, there) = ready_endpoints(consumer, provider, twin).await?;
    out.push_str(&format!(
        "\n{local} pod(s) run in {consumer_id}, {remote} in {provider_id}.\nService {NS}/{APP}: {here} ready endpoint(s) in {consumer_id}; its reflection {twin}/{APP} in {provider_id}: {there}.\n"
    ));
    Ok(out)
}

/// Ready endpoints of the demo's Service in the consumer, and in its reflection in the
/// provider's twin namespace.
async fn ready_endpoints(
    consumer: &Client,
    provider: &Client,
    twin: &str,
) -> anyhow::Result<(usize, usize)> {
    let lp = ListParams::default().labels(&format!("kubernetes.io/service-name={APP}"));
    let count = |slices: Vec<EndpointSlice>| -> usize {
        slices
            .iter()
            .flat_map(|s| s.endpoints.iter())
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false))
            .count()
    };
    let here = Api::<EndpointSlice>::namespaced(consumer.clone(), NS)
        .list(&lp)
        .await?
        .items;
    let there = Api::<EndpointSlice>::namespaced(provider.clone(), twin)
        .list(&lp)
        .await?
        .items;
    Ok((count(here), count(there)))
}

async fn wait(
    what: &str,
    timeout: Duration,
    mut done: impl AsyncFnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if done().await? {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(anyhow!(
                "waiting for {what}: not done after {}s",
                timeout.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::settled_answers;

    const URL: &str = "http://hello:80/";

    fn answer(cluster: &str) -> String {
        format!("fetch {URL}: {{\"cluster\":\"{cluster}\",\"pod\":\"p\"}}")
    }

    fn error() -> String {
        format!("fetch {URL}: error: fetching {URL}: timed out")
    }

    #[test]
    fn rounds_with_errors_before_the_fabric_is_up_are_not_counted() {
        // Rounds of three: in the first the remote answer times out; two whole ones follow.
        let mut log = vec![
            "probe: started".to_string(),
            answer("lab-1"),
            error(),
            answer("lab-1"),
            answer("lab-1"),
            answer("lab-2"),
            answer("lab-1"),
            answer("lab-2"),
            answer("lab-1"),
        ];
        assert_eq!(
            settled_answers(&log.join("\n"), URL, 3, 2),
            None,
            "the second whole round is not finished yet"
        );
        log.push(answer("lab-1"));
        let counted =
            settled_answers(&log.join("\n"), URL, 3, 2).expect("two whole rounds after the first");
        assert_eq!(
            counted.into_iter().collect::<Vec<_>>(),
            vec![("lab-1".to_string(), 4), ("lab-2".to_string(), 2)]
        );
    }

    #[test]
    fn a_probe_that_never_gets_a_whole_round_counts_nothing() {
        let log = [error(), answer("lab-1"), error(), error()].join("\n");
        assert_eq!(settled_answers(&log, URL, 2, 1), None);
        assert_eq!(settled_answers("", URL, 2, 1), None);
    }
}
