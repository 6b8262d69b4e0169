//! `tandem install`: deploy Tandem into the current cluster and create its identity.

use crate::flags::ClusterArgs;

/// Install (or upgrade) Tandem in the cluster of the current context.
#[derive(clap::Args)]
pub struct Args {
    /// This cluster's ID [default: kept if installed, else generated].
    #[arg(long)]
    cluster_id: Option<String>,
    /// The cluster's pod CIDR [default: detected from the Nodes].
    #[arg(long)]
    pod_cidr: Option<String>,
    /// The range standing for non-pod addresses [default: 10.70.0.0/16].
    #[arg(long)]
    external_cidr: Option<String>,
    /// Percent of the cluster's allocatable resources granted to each new consumer.
    #[arg(long)]
    share_percent: Option<u32>,
    /// Tandem's image (the controller's, the gateways' and the node agent's) [default:
    /// ghcr.io/tandem-dev/tandem:<this version>]. Where your registry does not have it, build
    /// and push it from the repository root: `docker build -f deploy/image/Dockerfile -t
    /// REGISTRY/tandem:TAG . && docker push REGISTRY/tandem:TAG`, then pass --image
    /// REGISTRY/tandem:TAG.
    #[arg(long, value_name = "IMAGE")]
    image: Option<String>,
    /// Build the network fabric for each peering: a WireGuard gateway per peer (a hostNetwork
    /// pod with NET_ADMIN behind a Service, see --gateway-service-type) and the node agent
    /// routing to it [default: kept if installed, else on; `--network-fabric=false` turns it
    /// off: pods still offload, but no traffic crosses the peering]. A hollow lab cluster
    /// (pods without network) leaves it off whatever this says, and `tandem status` says so.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    network_fabric: Option<bool>,
    /// What a peer may open connections to through the tunnel: `peering` (least exposure: a
    /// consumer its offloaded pods, offloaded pods the namespaces offloaded to their provider)
    /// or `pod-cidr` (every pod of this cluster, as Liqo does; never the nodes) [default: kept
    /// if installed, else peering].
    #[arg(long, value_name = "MODE", value_parser = ["peering", "pod-cidr"])]
    network_exposure: Option<String>,
    /// How peers reach this cluster's gateways: `auto` (a LoadBalancer Service's address or
    /// host name when it gets one; until then, after 10 s, the gateway's node address and
    /// port, as on kind or bare metal, which have no load balancer), `LoadBalancer` (only
    /// that: pending until a load balancer answers) or `NodePort` (the gateway's node address
    /// and its node port, `externalTrafficPolicy: Local`) [default: kept if installed, else
    /// auto].
    #[arg(long, value_name = "TYPE", value_parser = ["auto", "LoadBalancer", "NodePort"])]
    gateway_service_type: Option<String>,
    /// A Secret in tandem-system (type kubernetes.io/dockerconfigjson, created beforehand) to
    /// pull --image with, for the controller's pod, the gateways and the node agent;
    /// repeatable; `--image-pull-secret=` clears them [default: kept if installed, else none].
    #[arg(long = "image-pull-secret", value_name = "SECRET", action = clap::ArgAction::Append)]
    image_pull_secrets: Option<Vec<String>>,
    /// Wait until the controller is Ready; fail at once, naming the image or the exit, when
    /// its pod cannot pull its image or keeps crashing. `--wait=false` returns once applied.
    #[arg(long, num_args = 0..=1, default_value_t = true, default_missing_value = "true",
          value_name = "BOOL", action = clap::ArgAction::Set)]
    wait: bool,
    /// How long --wait waits for the controller ("90s", "5m").
    #[arg(long, default_value = "5m", value_parser = crate::flags::duration, value_name = "DURATION")]
    timeout: std::time::Duration,
    /// Print what would be applied (YAML, or a v1 List with `-o json`) and change nothing.
    /// The settings are resolved as for an install: the flags, else what the cluster stores,
    /// else the defaults and the pod CIDR detected from the Nodes.
    #[arg(long)]
    dry_run: bool,
    /// With --dry-run: contact no cluster; what the flags leave unset stays unset (the
    /// controller fills it in on its first start: cluster ID, pod CIDR). This is what
    /// `deploy/install/` holds with no flags.
    #[arg(long, requires = "dry_run")]
    offline: bool,
}

impl Args {
    /// Whether `-o` applies (it does to a dry run).
    pub fn prints_objects(&self) -> bool {
        self.dry_run
    }
}

const DRY_RUN_HEADER: &str = "What `tandem install` applies (dry run). The cluster identity is not \
among it: `tandem install`, or else the controller on its first start, creates it.";

pub async fn run(
    args: Args,
    cluster: &ClusterArgs,
    output: Option<crate::flags::Output>,
) -> anyhow::Result<()> {
    let options = tandem_admin::install::InstallOptions {
        cluster_id: args.cluster_id,
        pod_cidr: args.pod_cidr,
        external_cidr: args.external_cidr,
        share_percent: args.share_percent,
        image: args.image,
        image_pull_secrets: args
            .image_pull_secrets
            .map(|s| s.into_iter().filter(|s| !s.is_empty()).collect()),
        network_fabric: args.network_fabric,
        network_exposure: args
            .network_exposure
            .map(|m| m.parse())
            .transpose()
            .map_err(anyhow::Error::msg)?,
        gateway_service_type: args
            .gateway_service_type
            .map(|m| m.parse())
            .transpose()
            .map_err(anyhow::Error::msg)?,
    };
    if args.dry_run {
        let settings = if args.offline {
            tandem_admin::install::offline_settings(&options)?
        } else {
            let client = cluster.client().await?;
            tandem_admin::install::manifest_settings_for(&client, &options).await?
        };
        let objects = tandem_admin::install::manifests(&settings);
        match output {
            Some(crate::flags::Output::Json) => println!(
                "{}",
                serde_json::to_string_pretty(
                    &serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects})
                )?
            ),
            _ => print!(
                "{}",
                tandem_admin::install::manifests_yaml(&objects, DRY_RUN_HEADER)
            ),
        }
        return Ok(());
    }
    let client = cluster.client().await?;
    let default_image = options.image.is_none();
    let identity = tandem_admin::install::install(&client, &options, &mut |step| {
        eprintln!("✓ {step}");
    })
    .await?;
    if !args.wait {
        eprintln!(
            "Tandem is applied as cluster {:?}; not waiting for the controller (`kubectl -n {} \
             rollout status deployment/{}` does)",
            identity.cluster_id,
            tandem_api::names::SYSTEM_NAMESPACE,
            tandem_api::names::CONTROLLER_NAME
        );
        if default_image {
            eprintln!(
                "The controller runs the default image {}: if your nodes cannot pull it, load \
                 it onto them or install again with --image.",
                tandem_admin::install::default_image()
            );
        }
        return Ok(());
    }
    eprintln!(
        "… waiting for the controller to be Ready (up to {}; --wait=false skips this)",
        humantime::format_duration(args.timeout)
    );
    let started = std::time::Instant::now();
    tandem_admin::rollout::wait_for_controller(&client, args.timeout, &mut |waiting| {
        eprintln!("  … {waiting}");
    })
    .await?;
    eprintln!("✓ controller Ready");
    // What the image really runs is known only now: an older controller is refused.
    let left = args.timeout.saturating_sub(started.elapsed());
    match tandem_admin::rollout::check_controller_protocol(&client, left).await? {
        Some(running) => eprintln!(
            "✓ controller {} speaks peering protocol v{}",
            running.version.as_deref().unwrap_or("(unknown version)"),
            running.protocol
        ),
        None => eprintln!(
            "! the controller's peering protocol is not known (no leader Lease {}/{} held by \
             one of its pods)",
            tandem_api::names::SYSTEM_NAMESPACE,
            tandem_api::names::CONTROLLER_NAME
        ),
    }
    eprintln!("Tandem is installed as cluster {:?}", identity.cluster_id);
    Ok(())
}
