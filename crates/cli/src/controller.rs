//! `tandem controller`: the cluster agent (peering, negotiation, offloading, virtual kubelets,
//! shadow pods), normally run by the Deployment `tandem install` creates.

use std::time::Duration;

use anyhow::Context as _;
use tandem_controller::{Controller, Options};

use crate::flags::ClusterArgs;

/// Run Tandem's controller against a cluster until interrupted.
#[derive(clap::Args)]
#[command(
    after_help = "In a cluster it uses its ServiceAccount; elsewhere the kubeconfig \
(--kubeconfig, $KUBECONFIG, ~/.kube/config) and --context, like kubectl.\n\nExample:\n  \
tandem controller --kubeconfig ~/.tandem/lab/kubeconfig --context lab-1"
)]
pub struct Args {
    /// Address of the pod-placement admission webhook.
    #[arg(long, default_value = "127.0.0.1:0")]
    webhook_addr: std::net::SocketAddr,
    /// The Service the API server calls the webhook through (NAMESPACE/NAME, port 443), when
    /// the controller runs as a pod behind it [default: the API server calls --webhook-addr].
    #[arg(long, value_name = "NAMESPACE/NAME", value_parser = service_ref)]
    webhook_service: Option<(String, String)>,
    /// How often virtual nodes renew their Lease and probe their provider (seconds); a
    /// Peering's `spec.nodeHealth.probePeriod` overrides it for its provider.
    #[arg(long, default_value_t = 2)]
    heartbeat_seconds: u64,
    /// How long a provider may be unreachable before its virtual node is NotReady (seconds); a
    /// Peering's `spec.nodeHealth.notReadyAfter` overrides it for its provider.
    #[arg(long, default_value_t = 6)]
    provider_grace_seconds: u64,
    /// Fencing (`partitionPolicy: Fence`): how long a provider may take to stop a pod once its
    /// fence deadline passed (seconds). A lost provider's fenced pods are replaced here
    /// fenceAfter + 1 % + this after it was last heard from: raise it if your providers'
    /// kubelets are slow to kill containers.
    #[arg(long, default_value_t = 5)]
    fence_margin_seconds: u64,
    /// The address virtual kubelets serve `kubectl logs`/`exec` on (one port per virtual node)
    /// and publish as their node's InternalIP; it must be reachable from the API server
    /// [default: this host's address on the route to the API server — the pod IP in a cluster].
    #[arg(long, value_name = "IP")]
    kubelet_address: Option<std::net::IpAddr>,
    /// Serve `clusterset.local` (multi-cluster services' DNS) on this address, UDP and TCP;
    /// the cluster DNS forwards the zone here (`tandem install` adds the stub domain). The
    /// in-cluster Deployment serves on 0.0.0.0:10053 behind the Service tandem-system/tandem-dns
    /// [default: not served].
    #[arg(long, value_name = "IP:PORT")]
    dns_addr: Option<std::net::SocketAddr>,
    /// Serve Prometheus metrics on `/metrics`, and `/healthz` (liveness) and `/readyz`
    /// (ready once the reconcilers run: a replica waiting for the leader Lease is not) on this
    /// address. The in-cluster Deployment serves on 0.0.0.0:8080 [default: not served].
    #[arg(long, value_name = "IP:PORT")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Run the reconcilers only while holding the Lease tandem-system/tandem-controller, so
    /// that of several replicas only one writes; the others wait to take over (client-go's
    /// timings: a 15 s lease, renewed every 2 s). The in-cluster Deployment sets it.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value_t = false, value_name = "BOOL")]
    leader_elect: bool,
    /// As provider: the lifetime of the client certificates issued to consumers' peer
    /// identities (at least 10m; e.g. 30d) [default: the signer's, a year with
    /// kube-controller-manager]. Consumers renew theirs once 80 % of it has passed, the old
    /// one serving until the new one is in place.
    #[arg(long, value_name = "DURATION", value_parser = crate::flags::duration)]
    peer_certificate_lifetime: Option<Duration>,
    /// The lifetime of the pod-placement webhook's serving certificate (1m to 10y); a new
    /// one replaces it after two thirds of it, without a failed call, and `tandem rotate
    /// webhook-certificate` replaces it at once.
    #[arg(long, value_name = "DURATION", value_parser = crate::flags::duration, default_value = "90d")]
    webhook_certificate_lifetime: Duration,
}

/// This host's name (a pod's name, in a cluster), for the leader Lease.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "tandem-controller".into())
}

/// The local address of the route to `url`'s host: what the API server can reach this
/// process at (its pod IP when in a cluster, 127.0.0.1 for a local API server). A UDP
/// "connection" sends nothing; it only asks the kernel which source address it would use.
fn address_towards(url: &http::Uri) -> anyhow::Result<std::net::IpAddr> {
    let host = url
        .host()
        .context("the API server URL has no host")?
        .trim_start_matches('[')
        .trim_end_matches(']');
    let port = url.port_u16().unwrap_or(443);
    let target = std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
        .with_context(|| format!("resolving the API server's host {host}"))?
        .next()
        .with_context(|| format!("the API server's host {host} has no address"))?;
    let bind: std::net::SocketAddr = if target.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = std::net::UdpSocket::bind(bind).context("opening a UDP socket")?;
    socket
        .connect(target)
        .with_context(|| format!("finding the route to the API server at {target}"))?;
    Ok(socket.local_addr()?.ip())
}

fn service_ref(s: &str) -> Result<(String, String), String> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_string(), name.to_string()))
        }
        _ => Err(format!("{s:?} is not NAMESPACE/NAME")),
    }
}

/// Who the API server says this controller is (SelfSubjectReview), for its log.
async fn whoami(client: &kube::Client) -> anyhow::Result<String> {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let review = kube::Api::<SelfSubjectReview>::all(client.clone())
        .create(&Default::default(), &SelfSubjectReview::default())
        .await
        .context("asking the API server who this controller is (SelfSubjectReview)")?;
    Ok(review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .unwrap_or_default())
}

pub async fn run(args: Args, cluster: &ClusterArgs) -> anyhow::Result<()> {
    if let Some(lifetime) = args.peer_certificate_lifetime {
        anyhow::ensure!(
            lifetime >= Duration::from_secs(600),
            "--peer-certificate-lifetime {}: Kubernetes signs certificates for at least 10m",
            humantime::format_duration(lifetime)
        );
    }
    let max = tandem_controller::consumer::webhook::MAX_LIFETIME;
    anyhow::ensure!(
        (Duration::from_secs(60)..=max).contains(&args.webhook_certificate_lifetime),
        "--webhook-certificate-lifetime {}: between 1m (a rotation takes seconds) and {}",
        humantime::format_duration(args.webhook_certificate_lifetime),
        humantime::format_duration(max)
    );
    let config = cluster.config().await?;
    let kubelet_address = match args.kubelet_address {
        Some(ip) => ip,
        None => address_towards(&config.cluster_url)
            .context("choosing the virtual kubelets' address (set --kubelet-address)")?,
    };
    let client = kube::Client::try_from(config).context("building the API client")?;
    let user = whoami(&client).await?;
    tracing::info!("authenticated as {user}; virtual kubelets serve on {kubelet_address}");
    let options = Options {
        webhook_addr: args.webhook_addr,
        webhook_service: args.webhook_service,
        heartbeat: Duration::from_secs(args.heartbeat_seconds),
        provider_grace: Duration::from_secs(args.provider_grace_seconds),
        kubelet_address,
        dns_addr: args.dns_addr,
        fence_margin: Duration::from_secs(args.fence_margin_seconds),
        metrics_addr: args.metrics_addr,
        leader_election: args
            .leader_elect
            .then(|| tandem_controller::leader::LeaderElection::new(&hostname())),
        peer_certificate_lifetime: args.peer_certificate_lifetime,
        webhook_certificate_lifetime: args.webhook_certificate_lifetime,
        ..Options::default()
    };
    let controller = Controller::start(client, options)
        .await
        .context("starting the controller")?;
    // SIGTERM too: that is how a kubelet stops the controller's pod.
    let interrupted = crate::interrupt().context("listening for SIGINT and SIGTERM")?;
    if let Some(addr) = controller.metrics_addr() {
        tracing::info!("serving /metrics, /healthz and /readyz on {addr}");
    }
    let mut controller = controller;
    tokio::select! {
        () = controller.wait() => anyhow::bail!(
            "the controller stopped (see the log above: a task failed, or the leader Lease was lost)"
        ),
        () = interrupted => {}
    }
    tracing::info!("stopping");
    // The reconcilers stop, then the leader Lease is given up: another replica takes over
    // at once rather than after the lease runs out.
    controller.stop().await;
    Ok(())
}
