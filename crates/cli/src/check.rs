//! `tandem check`: a connectivity test of a peering, run from the consumer with its own
//! kubeconfig only, as `cilium connectivity test` or `subctl verify` do for theirs.
//!
//! It makes a namespace of its own (`connectivity-check-<random>` (a provider refuses `tandem-*` twin namespaces)), offloads it to the provider
//! (pods may run on both sides), and runs Tandem's own image there in its `probe` role, which holds
//! no capability and no credential: a server on a local node and one on the virtual node, a
//! Service in front of each, the remote one exported (this cluster imports its own export); then one-shot clients that
//! fetch across — a pod on a local node, the local node itself (hostNetwork) and a pod on the
//! virtual node — and print their verdicts, which are read from their logs. Each path is
//! printed with ✓ or ✗ and, for a ✗, why; with the tunnel's state and round trip from the
//! virtual node. The namespace is removed at the end (`--keep` keeps it to look around).

use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use kube::api::{Api, DeleteParams, LogParams, PostParams};
use kube::{Client, ResourceExt};
use serde::Serialize;
use serde_json::{Value, json};
use tandem_api::{NamespaceOffloading, Peering, names};

use crate::flags::{GlobalArgs, Output, duration};

/// The probe servers' port.
const PORT: u16 = 8080;
/// Label of everything the check creates (the namespace included).
const CHECK_LABEL: &str = "tandem.dev/check";

/// Test connectivity across a peering (run on the consumer).
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  tandem check\n  tandem check --peer milan -o json\n  \
                        tandem check --keep      # keep the connectivity-check-* namespace\n\n\
Paths checked, each ✓ or ✗ with the reason:\n  \
pod → offloaded pod         a pod on a local node fetches from a pod on the virtual node\n  \
offloaded pod → pod         and back (to the pod's address as the provider sees it)\n  \
offloaded pod → Service     by the name of a local Service (reflected to the provider)\n  \
node → offloaded pod        the local node itself (a hostNetwork pod)\n  \
Service (ClusterIP)         a local pod, through a Service whose endpoint is the offloaded pod\n  \
Service (clusterset.local)  a local pod, by the clusterset name of a local Service it exports\n  \
tunnel                      the gateway's state and round-trip time (from the virtual node)\n\n\
The pods run Tandem's image (the controller's, or --image) as `tandem probe`: no capability,\n\
no ServiceAccount token. The command exits non-zero when a path fails."
)]
pub struct Args {
    /// The provider to check (its cluster ID); needed only with several peerings.
    #[arg(long, value_name = "CLUSTER_ID")]
    peer: Option<String>,
    /// The image the probes run [default: the controller's].
    #[arg(long)]
    image: Option<String>,
    /// How long the whole check may take.
    #[arg(long, default_value = "3m", value_parser = duration)]
    timeout: Duration,
    /// Keep the check's namespace (and its pods) afterwards.
    #[arg(long)]
    keep: bool,
}

/// One path's verdict.
#[derive(Clone, Debug, Serialize)]
pub struct PathResult {
    pub path: String,
    pub ok: bool,
    /// What answered and how fast, or why it failed.
    pub detail: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Report {
    peer: String,
    namespace: String,
    paths: Vec<PathResult>,
}

pub async fn run(args: Args, global: &GlobalArgs) -> anyhow::Result<()> {
    let client = global.cluster.client().await?;
    let peer = pick_peering(&client, args.peer.as_deref()).await?;
    let provider = peer.name_any();
    let mut paths = Vec::new();
    let mut namespace = String::new();
    if let Some(why) = tandem_controller::settings::fabric_off(&client).await? {
        // Nothing would cross: say so for every path rather than wait for timeouts.
        for (path, _) in CLIENT_PATHS.iter().flat_map(|(_, p)| p.iter()) {
            paths.push(failed(path, why));
        }
    } else {
        let image = match args.image {
            Some(i) => i,
            None => controller_image(&client).await?,
        };
        let ns = format!("connectivity-check-{}", random_suffix());
        namespace.clone_from(&ns);
        eprintln!("… checking the peering with {provider} in namespace {ns} (image {image})");
        // Ctrl-C stops the check, and its namespace still goes.
        let interrupted = crate::interrupt()?;
        let outcome = tokio::select! {
            outcome = tokio::time::timeout(
                args.timeout,
                check_paths(&client, &peer, &ns, &image, &mut paths),
            ) => Some(outcome),
            () = interrupted => None,
        };
        if args.keep {
            eprintln!("namespace {ns} kept (`kubectl delete namespace {ns}` removes it)");
        } else {
            remove_namespace(&client, &ns).await;
        }
        let Some(outcome) = outcome else {
            bail!("interrupted");
        };
        // A step that failed, or the time running out, fails every path not yet checked,
        // with the reason.
        let unchecked = match outcome {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!("{e:#}")),
            Err(_) => Some(format!(
                "not checked within --timeout {}",
                humantime::format_duration(args.timeout)
            )),
        };
        if let Some(why) = unchecked {
            let done: Vec<String> = paths.iter().map(|p| p.path.clone()).collect();
            for (path, _) in CLIENT_PATHS.iter().flat_map(|(_, p)| p.iter()) {
                if !done.iter().any(|d| d == path) {
                    paths.push(failed(path, &why));
                }
            }
        }
    }
    paths.push(tunnel(&client, &peer).await);
    let failures = paths.iter().filter(|p| !p.ok).count();
    let total = paths.len();
    let report = Report {
        peer: provider.clone(),
        namespace,
        paths,
    };
    match global.output.unwrap_or_default() {
        Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Output::Yaml => print!("{}", serde_saphyr::to_string(&report)?),
        Output::Table => {
            for p in &report.paths {
                println!(
                    "{} {:<28} {}",
                    if p.ok { "✓" } else { "✗" },
                    p.path,
                    p.detail
                );
            }
        }
    }
    if failures > 0 {
        bail!("{failures} of {total} paths to {provider} failed");
    }
    Ok(())
}

/// Which client checks which paths: (client pod, [(path, fetch name)]).
const CLIENT_PATHS: [(&str, &[(&str, &str)]); 3] = [
    (
        "client-local",
        &[
            ("pod → offloaded pod", "pod"),
            ("Service (ClusterIP)", "service"),
            ("Service (clusterset.local)", "clusterset"),
        ],
    ),
    ("client-node", &[("node → offloaded pod", "node")]),
    (
        "client-remote",
        &[
            ("offloaded pod → pod", "pod"),
            ("offloaded pod → Service", "service"),
        ],
    ),
];

fn failed(path: &str, why: &str) -> PathResult {
    verdict(path, false, why)
}

/// A path's verdict. The detail may quote what the provider reports (an offloaded pod's
/// status and log, its server's answer): it is cut to a line's length and stripped of control
/// characters, so that nothing a peer writes can move the terminal's cursor or colours.
fn verdict(path: &str, ok: bool, detail: &str) -> PathResult {
    const MAX: usize = 300;
    let mut shown: String = detail
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX)
        .collect();
    if detail
        .chars()
        .filter(|c| !c.is_control())
        .nth(MAX)
        .is_some()
    {
        shown.push('…');
    }
    PathResult {
        path: path.to_string(),
        ok,
        detail: shown,
    }
}

fn random_suffix() -> String {
    use rand::Rng;
    format!("{:05x}", rand::rng().random_range(0..0x10_0000))
}

/// The established peering with `wanted` (or the only one).
async fn pick_peering(client: &Client, wanted: Option<&str>) -> anyhow::Result<Peering> {
    let peerings = Api::<Peering>::all(client.clone())
        .list(&Default::default())
        .await
        .context("listing Peerings (is Tandem installed here? `tandem install`)")?
        .items;
    let names: Vec<String> = peerings.iter().map(|p| p.name_any()).collect();
    let chosen = match wanted {
        Some(w) => peerings.into_iter().find(|p| p.name_any() == w),
        None if peerings.len() == 1 => peerings.into_iter().next(),
        None if peerings.is_empty() => {
            bail!(
                "this cluster consumes from no provider: `tandem check` runs on a consumer, after `tandem peer`"
            )
        }
        None => bail!(
            "this cluster peers with {}: say which with --peer",
            names.join(", ")
        ),
    };
    chosen.with_context(|| {
        format!(
            "no peering with {:?} here (peerings: {})",
            wanted.unwrap_or_default(),
            if names.is_empty() {
                "none".into()
            } else {
                names.join(", ")
            }
        )
    })
}

async fn controller_image(client: &Client) -> anyhow::Result<String> {
    let deployment = Api::<Deployment>::namespaced(client.clone(), names::SYSTEM_NAMESPACE)
        .get(names::CONTROLLER_NAME)
        .await
        .with_context(|| {
            format!(
                "reading Deployment {}/{} for the image the probes run (or pass --image)",
                names::SYSTEM_NAMESPACE,
                names::CONTROLLER_NAME
            )
        })?;
    deployment
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.containers.into_iter().next())
        .and_then(|c| c.image)
        .context("the controller's Deployment names no image; pass --image")
}

/// A probe pod: on a local node, the local node's network, or `virtual` (the provider).
fn probe_pod(name: &str, image: &str, args: Vec<String>, place: Place, provider: &str) -> Pod {
    let mut spec = json!({
        "automountServiceAccountToken": false,
        "terminationGracePeriodSeconds": 1,
        "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532},
        "containers": [{
            "name": "probe", "image": image,
            "args": std::iter::once("probe".to_string()).chain(args).collect::<Vec<_>>(),
            "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
            "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                                "capabilities": {"drop": ["ALL"]}},
        }],
    });
    if name.starts_with("client") {
        spec["restartPolicy"] = json!("Never");
        spec["containers"][0]
            .as_object_mut()
            .expect("object")
            .remove("ports");
    }
    match place {
        Place::Virtual => {
            spec["nodeSelector"] = json!({names::NODE_TYPE_LABEL: names::VIRTUAL_NODE_TYPE,
                                          names::REMOTE_CLUSTER_LABEL: provider});
            spec["tolerations"] = json!([{"key": names::VIRTUAL_NODE_TAINT, "operator": "Exists"}]);
        }
        Place::Local | Place::Node => {
            spec["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": names::NODE_TYPE_LABEL,
                    "operator": "NotIn", "values": [names::VIRTUAL_NODE_TYPE]}]}]}}});
            if place == Place::Node {
                spec["hostNetwork"] = json!(true);
                spec["dnsPolicy"] = json!("ClusterFirstWithHostNet");
            }
        }
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name, CHECK_LABEL: "true"}},
        "spec": spec,
    }))
    .expect("a valid Pod")
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    Local,
    Node,
    Virtual,
}

async fn check_paths(
    client: &Client,
    peer: &Peering,
    ns: &str,
    image: &str,
    paths: &mut Vec<PathResult>,
) -> anyhow::Result<()> {
    let provider = peer.name_any();
    let pp = PostParams::default();
    let namespace: Namespace = serde_json::from_value(json!({
        "metadata": {"name": ns, "labels": {CHECK_LABEL: "true",
                                             names::MANAGED_BY_LABEL: names::MANAGED_BY}}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&pp, &namespace)
        .await
        .with_context(|| format!("creating namespace {ns}"))?;
    let offloading: NamespaceOffloading = serde_json::from_value(json!({
        "metadata": {"name": names::OFFLOADING_NAME, "namespace": ns},
        "spec": {"podOffloadingStrategy": "LocalAndRemote",
                 "clusterSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                     {"key": names::REMOTE_CLUSTER_LABEL, "operator": "In", "values": [provider]}]}]}},
    }))?;
    Api::<NamespaceOffloading>::namespaced(client.clone(), ns)
        .create(&pp, &offloading)
        .await
        .with_context(|| format!("offloading namespace {ns} to {provider}"))?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let serve = vec![format!("--serve={PORT}")];
    for (name, place) in [
        ("server-local", Place::Local),
        ("server-remote", Place::Virtual),
    ] {
        pods.create(
            &pp,
            &probe_pod(name, image, serve.clone(), place, &provider),
        )
        .await
        .with_context(|| format!("creating pod {ns}/{name}"))?;
        let service: Service = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {CHECK_LABEL: "true"}},
            "spec": {"selector": {"app": name},
                     "ports": [{"name": "http", "port": PORT, "targetPort": PORT, "protocol": "TCP"}]},
        }))?;
        services
            .create(&pp, &service)
            .await
            .with_context(|| format!("creating Service {ns}/{name}"))?;
    }
    // The local server's Service, exported: this cluster imports its own export too, so its
    // clusterset name goes through the cluster DNS's stub domain, Tandem's DNS and the
    // import's Service. (Offloaded pods are not exported: no peer reaches them there.)
    let export: tandem_api::mcs::ServiceExport =
        serde_json::from_value(json!({"metadata": {"name": "server-local", "namespace": ns}}))?;
    Api::<tandem_api::mcs::ServiceExport>::namespaced(client.clone(), ns)
        .create(&pp, &export)
        .await
        .with_context(|| format!("exporting Service {ns}/server-local"))?;
    eprintln!("… waiting for the probe servers on a local node and on {provider}'s virtual node");
    let offloadings: Api<NamespaceOffloading> = Api::namespaced(client.clone(), ns);
    let local_ip = running_ip(&pods, "server-local", None).await?;
    let remote_ip = running_ip(&pods, "server-remote", Some(&offloadings)).await?;
    // The provider sees this cluster's pods in the range the peering assigned them there.
    let local_cidr = tandem_controller::settings::load_settings(client)
        .await?
        .pod_cidr;
    let in_provider = peer
        .status
        .as_ref()
        .and_then(|s| s.network.as_ref())
        .and_then(|n| n.local_pod_cidr_in_remote.clone())
        .context("the Peering has no network yet (status.network.localPodCidrInRemote)")?;
    let local_in_provider = seen_from(&local_ip, &local_cidr, &in_provider).with_context(|| {
        format!(
            "pod address {local_ip} is outside {local_cidr}, which {provider} sees as {in_provider}"
        )
    })?;
    let service_ip = services
        .get("server-remote")
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .context("Service server-remote has no ClusterIP")?;
    let url = |host: &str| format!("http://{host}:{PORT}/");
    let clusterset = format!(
        "server-local.{ns}.svc.{}",
        tandem_api::mcs::CLUSTERSET_DOMAIN
    );
    // (client pod, where it runs, [(check, URL)])
    let fetches = [
        (
            "client-local",
            Place::Local,
            vec![
                ("pod", url(&remote_ip)),
                ("service", url(&service_ip)),
                ("clusterset", url(&clusterset)),
            ],
        ),
        ("client-node", Place::Node, vec![("node", url(&remote_ip))]),
        (
            "client-remote",
            Place::Virtual,
            vec![
                ("pod", url(&local_in_provider)),
                ("service", url("server-local")),
            ],
        ),
    ];
    for (name, place, targets) in &fetches {
        let mut args: Vec<String> = targets
            .iter()
            .map(|(check, u)| format!("--fetch={check}={u}"))
            .collect();
        args.push("--within=60".into());
        pods.create(&pp, &probe_pod(name, image, args, *place, &provider))
            .await
            .with_context(|| format!("creating pod {ns}/{name}"))?;
    }
    eprintln!("… the clients fetch across (each path for up to 60 s)");
    for (client_pod, checks) in CLIENT_PATHS {
        let verdicts = finished_verdicts(&pods, client_pod).await;
        for (path, check) in checks {
            paths.push(match &verdicts {
                Err(e) => failed(path, &chain(e)),
                Ok(v) => match v.iter().find(|v| v["check"] == *check) {
                    None => failed(path, &format!("pod {client_pod} printed no verdict for it")),
                    Some(v) if v["ok"] == true => verdict(
                        path,
                        true,
                        &format!(
                            "{} answered in {:.1} ms ({})",
                            v["answer"]["pod"].as_str().unwrap_or("?"),
                            v["ms"].as_f64().unwrap_or_default(),
                            v["url"].as_str().unwrap_or_default()
                        ),
                    ),
                    Some(v) => failed(
                        path,
                        &format!(
                            "{}: {} (after {} attempts)",
                            v["url"].as_str().unwrap_or_default(),
                            v["error"].as_str().unwrap_or("failed"),
                            v["attempts"]
                        ),
                    ),
                },
            });
        }
    }
    Ok(())
}

/// `ip`, of this cluster's pod range `local`, as the peer sees it: at the same offset in
/// `there`.
fn seen_from(ip: &str, local: &str, there: &str) -> Option<String> {
    let ip: std::net::Ipv4Addr = ip.parse().ok()?;
    let local: ipnet::Ipv4Net = local.parse().ok()?;
    let there: ipnet::Ipv4Net = there.parse().ok()?;
    let offset = u32::from(ip).checked_sub(u32::from(local.network()))?;
    let size = 1u64 << (32 - u32::from(there.prefix_len()));
    (local.contains(&ip) && u64::from(offset) < size)
        .then(|| std::net::Ipv4Addr::from(u32::from(there.network()) + offset).to_string())
}

/// Waits until `name` runs and has an IP; fails naming why it cannot (unschedulable, image).
/// With `offloading` (a pod for the provider), a failed offloading of the namespace fails it
/// at once, with the provider's reason (a twin namespace it refuses, say).
async fn running_ip(
    pods: &Api<Pod>,
    name: &str,
    offloading: Option<&Api<NamespaceOffloading>>,
) -> anyhow::Result<String> {
    loop {
        if let Some(api) = offloading
            && let Some(why) = offloading_failed(api).await?
        {
            bail!("probe server {name} cannot run on the provider: {why}");
        }
        let pod = pods.get(name).await?;
        let status = pod.status.clone().unwrap_or_default();
        if status.phase.as_deref() == Some("Running")
            && let Some(ip) = status.pod_ip.filter(|ip| !ip.is_empty())
        {
            return Ok(ip);
        }
        if let Some(why) = stuck(&pod) {
            bail!("probe server {name} cannot run: {why}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// An error and its causes, as one line (`a: b: c`).
fn chain(e: &dyn std::error::Error) -> String {
    std::iter::successors(Some(e), |e| e.source())
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}

/// Why the namespace's offloading failed, as its status says; None while it has not.
async fn offloading_failed(api: &Api<NamespaceOffloading>) -> anyhow::Result<Option<String>> {
    let Some(status) = api
        .get_opt(names::OFFLOADING_NAME)
        .await?
        .and_then(|o| o.status)
    else {
        return Ok(None);
    };
    if status.phase.as_deref() != Some("Failed") {
        return Ok(None);
    }
    let reasons: Vec<String> = status
        .remote_namespaces
        .iter()
        .filter_map(|r| Some(format!("{}: {}", r.cluster_id, r.message.as_deref()?)))
        .collect();
    Ok(Some(format!(
        "offloading the namespace failed ({})",
        if reasons.is_empty() {
            "no reason given".into()
        } else {
            reasons.join("; ")
        }
    )))
}

/// Why `pod` will not run without a change (an image that cannot be pulled, a refused
/// container); None while it may still.
fn stuck(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    for c in status.container_statuses.iter().flatten() {
        if let Some(w) = c.state.as_ref().and_then(|s| s.waiting.as_ref()) {
            let reason = w.reason.as_deref().unwrap_or_default();
            if matches!(
                reason,
                "ImagePullBackOff" | "ErrImagePull" | "InvalidImageName" | "CreateContainerError"
            ) {
                return Some(format!(
                    "{reason}: {}",
                    w.message.as_deref().unwrap_or_default()
                ));
            }
        }
        if let Some(t) = c.state.as_ref().and_then(|s| s.terminated.as_ref())
            && pod
                .metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("server"))
        {
            return Some(format!(
                "its container stopped ({}, exit code {}){}",
                t.reason.as_deref().unwrap_or("terminated"),
                t.exit_code,
                t.message
                    .as_deref()
                    .map(|m| format!(": {m}"))
                    .unwrap_or_default()
            ));
        }
    }
    if status.phase.as_deref() == Some("Failed") {
        return Some(
            status
                .message
                .clone()
                .unwrap_or_else(|| "the pod failed".into()),
        );
    }
    None
}

/// The verdicts client `name` printed, once it has finished; why there are none otherwise.
async fn finished_verdicts(pods: &Api<Pod>, name: &str) -> Result<Vec<Value>, ClientFailed> {
    let pod_name = || name.to_string();
    loop {
        let pod = pods.get(name).await.map_err(|source| ClientFailed::Read {
            pod: pod_name(),
            source,
        })?;
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
        match phase.as_deref() {
            Some("Succeeded") => break,
            Some("Failed") => {
                return Err(ClientFailed::Failed {
                    pod: pod_name(),
                    why: stuck(&pod).unwrap_or_else(|| "the pod failed".into()),
                });
            }
            _ => {
                if let Some(why) = stuck(&pod) {
                    return Err(ClientFailed::CannotRun {
                        pod: pod_name(),
                        why,
                    });
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // An offloaded client's log comes from the provider: bounded (its verdicts take a few
    // hundred bytes).
    let bounded = LogParams {
        limit_bytes: Some(64 * 1024),
        ..Default::default()
    };
    let log = pods
        .logs(name, &bounded)
        .await
        .map_err(|source| ClientFailed::Log {
            pod: pod_name(),
            source,
        })?;
    Ok(log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v.get("check").is_some())
        .collect())
}

/// Why a client pod gave no verdicts.
#[derive(Debug, thiserror::Error)]
enum ClientFailed {
    #[error("reading pod {pod}")]
    Read {
        pod: String,
        #[source]
        source: kube::Error,
    },
    #[error("pod {pod} failed: {why}")]
    Failed { pod: String, why: String },
    #[error("pod {pod} cannot run: {why}")]
    CannotRun { pod: String, why: String },
    #[error("reading the log of pod {pod}")]
    Log {
        pod: String,
        #[source]
        source: kube::Error,
    },
}

/// The tunnel as the virtual node reports it (its gateway's last report).
async fn tunnel(client: &Client, peer: &Peering) -> PathResult {
    let provider = peer.name_any();
    let node_name = peer
        .status
        .as_ref()
        .and_then(|s| s.virtual_node.clone())
        .unwrap_or_else(|| names::virtual_node_name(&provider));
    let node = match Api::<Node>::all(client.clone()).get_opt(&node_name).await {
        Ok(Some(n)) => n,
        Ok(None) => return failed("tunnel", &format!("no virtual node {node_name}")),
        Err(e) => return failed("tunnel", &format!("reading Node {node_name}: {e}")),
    };
    let Some(report) = node.annotations().get(names::TUNNEL_ANNOTATION) else {
        return failed(
            "tunnel",
            &format!(
                "virtual node {node_name} carries no tunnel report (is the network fabric on?)"
            ),
        );
    };
    let report: Value = serde_json::from_str(report).unwrap_or_default();
    let state = report["state"].as_str().unwrap_or("unknown");
    let rtt = report["rttMs"]
        .as_f64()
        .map(|ms| format!(", round trip {ms:.1} ms"))
        .unwrap_or_default();
    verdict(
        "tunnel",
        state == "connected",
        &format!("{state}{rtt} (virtual node {node_name})"),
    )
}

async fn remove_namespace(client: &Client, ns: &str) {
    match Api::<Namespace>::all(client.clone())
        .delete(ns, &DeleteParams::background())
        .await
    {
        Ok(_) => eprintln!("… namespace {ns} removed"),
        Err(e) if tandem_api::client::is_not_found(&e) => {}
        Err(e) => {
            eprintln!("! could not remove namespace {ns}: {e} (`kubectl delete namespace {ns}`)")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_peer_reports_is_shown_without_control_characters_and_cut() {
        let v = verdict("tunnel", true, "connected\u{1b}[2J\u{1b}]0;owned\u{7}\n");
        assert_eq!(v.detail, "connected[2J]0;owned");
        let long = verdict("pod → offloaded pod", false, &"x".repeat(1000));
        assert_eq!(long.detail.chars().count(), 301);
        assert!(long.detail.ends_with('…'));
        assert_eq!(verdict("p", false, "short").detail, "short");
    }

    #[test]
    fn a_pod_address_is_moved_to_where_the_peer_sees_this_cluster() {
        assert_eq!(
            seen_from("10.244.1.4", "10.244.1.0/24", "10.0.0.0/24").as_deref(),
            Some("10.0.0.4")
        );
        assert_eq!(
            seen_from("10.244.3.9", "10.244.0.0/16", "10.10.0.0/16").as_deref(),
            Some("10.10.3.9")
        );
        // Outside the range, or beyond what the peer's range holds: not translatable.
        assert_eq!(
            seen_from("10.245.0.1", "10.244.0.0/16", "10.10.0.0/16"),
            None
        );
        assert_eq!(
            seen_from("10.244.3.9", "10.244.0.0/16", "10.10.0.0/24"),
            None
        );
    }
}
