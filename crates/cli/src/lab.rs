//! `tandem lab`: several embedded clusters in the foreground, one kubeconfig for all.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::config::Kubeconfig;
use serde::Serialize;
use tandem_lab::{Lab, LabProfile, LabSpec};

use crate::flags::{ClusterArgs, GlobalArgs, Output};
use crate::table;
use crate::workdir::{self, Use};

/// Arguments of `tandem lab`.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Start N lab clusters on 127.0.0.1 and run them until interrupted.
    #[command(
        after_help = "Example:\n  tandem lab up --clusters 3\n  kubectl --kubeconfig ~/.tandem/lab/kubeconfig --context lab-2 get nodes\n\nAll clusters use the pod CIDR 10.244.0.0/16 and differ in region\n(topology.kubernetes.io/region: eu-west, us-east, ap-south, …). Restarting on the\nsame --dir keeps every object.\n\nWith --network (root only) pods get real network namespaces: images tandem.dev/echo\n(an HTTP server answering who it is) and tandem.dev/probe run as built-in programs,\nServices route (nftables), and cluster DNS answers cluster.local. Nodes sit on\n172.<17+N>.0.0/16 per cluster; clusters reach each other's API servers on the lab\nWAN (198.18.N.2:6443). --profile kind models kind instead of k3s: no load balancer\n(LoadBalancer Services stay <pending>) and every cluster's nodes on one network,\nreachable from the other clusters' nodes and pods. Nothing is added to the host's own network namespace, and\nCtrl-C removes every namespace (`ip netns list` shows them as lab-<instance>-…)."
    )]
    Up {
        /// Number of clusters (contexts lab-1 … lab-N).
        #[arg(long, default_value_t = 2)]
        clusters: usize,
        /// Hollow nodes per cluster.
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// Directory for the clusters' data and the kubeconfig [default: ~/.tandem/lab].
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Network mode: real pod networking, built-in programs, Services and DNS (root).
        #[arg(long)]
        network: bool,
        /// The distribution network mode behaves as where they differ: k3s (ServiceLB gives
        /// LoadBalancer Services the cluster's WAN address; nodes behind the cluster's NAT)
        /// or kind (no load balancer; every cluster's nodes on one shared network).
        #[arg(long, requires = "network", default_value = "k3s", value_name = "k3s|kind",
              value_parser = |s: &str| s.parse::<LabProfile>())]
        profile: LabProfile,
    },
    /// Load images onto the lab's nodes, as `kind load docker-image` loads them onto kind's.
    #[command(
        after_help = "Example:\n  tandem lab load-image ghcr.io/tandem-dev/tandem:0.1.0\n  tandem lab load-image localhost/tandem:dev --cluster lab-2\n\nIn the kind profile (`tandem lab up --network --profile kind`) no registry answers:\na pod runs only the lab's built-in images (tandem.dev/echo, tandem.dev/probe) and the\nimages loaded here; any other fails to pull (ErrImagePull, then ImagePullBackOff), as\non kind. Like kind, a loaded image whose tag is `latest` (or absent) still needs\nimagePullPolicy IfNotPresent or Never. The lab has no container engine: the image's\ncontents are not copied; Tandem's image runs the lab's own tandem binary, any other\nimage stays hollow. The k3s profile and hollow labs pull every image, so loading\nchanges nothing there. A running lab sees loaded images at its next pull attempt."
    )]
    LoadImage {
        /// The images, as pods name them (`nginx` stands for docker.io/library/nginx:latest).
        #[arg(required = true, value_name = "IMAGE")]
        images: Vec<String>,
        /// The clusters to load them onto (lab-1, …) [default: every cluster of the lab].
        #[arg(long = "cluster", value_name = "NAME")]
        clusters: Vec<String>,
        /// The lab's directory [default: ~/.tandem/lab].
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Show the clusters of a running lab and their health.
    Status {
        /// The lab's directory [default: ~/.tandem/lab].
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

impl Args {
    /// Whether the command prints objects (and so takes `-o`).
    pub fn prints_objects(&self) -> bool {
        matches!(self.command, Command::Status { .. })
    }
}

/// Runs `tandem lab …`.
pub async fn run(args: Args, global: &GlobalArgs) -> anyhow::Result<()> {
    let default = workdir::default_dir("lab");
    match args.command {
        Command::Up {
            clusters,
            nodes,
            dir,
            network,
            profile,
        } => {
            up(
                clusters,
                nodes,
                network.then_some(profile),
                dir.unwrap_or(default.clone()),
                &default,
            )
            .await
        }
        Command::LoadImage {
            images,
            clusters,
            dir,
        } => load_images(&dir.unwrap_or(default), &images, &clusters),
        Command::Status { dir } => {
            status(dir.unwrap_or(default), global.output.unwrap_or_default()).await
        }
    }
}

/// `network`: network mode, as the distribution given; None: hollow.
async fn up(
    clusters: usize,
    nodes: usize,
    network: Option<LabProfile>,
    dir: PathBuf,
    default: &Path,
) -> anyhow::Result<()> {
    let profile = network.unwrap_or_default();
    let network = network.is_some();
    anyhow::ensure!(clusters >= 1, "--clusters must be at least 1");
    if network {
        tandem_lab::network::topology::require_root()?;
    }
    workdir::claim(&dir, default, Use::Keep)?;
    let spec = LabSpec {
        clusters,
        nodes,
        dir: Some(dir.clone()),
        network,
        // Pods of Tandem's image run this very binary.
        tandem_binary: network.then(std::env::current_exe).transpose()?,
        profile,
    };
    eprintln!(
        "starting {clusters} lab cluster(s) with {nodes} node(s) each in {}",
        dir.display()
    );
    let lab = Lab::start(&spec, |c| {
        eprintln!(
            "  ✓ {} ({}) at {}",
            c.config.name,
            c.config.region,
            c.server.url()
        );
    })
    .await?;
    // Listen before the kubeconfig is out: a Ctrl-C as soon as the lab is usable stops it cleanly.
    let interrupted = crate::interrupt()?;
    let kubeconfig = workdir::write_kubeconfig(&dir, &lab.kubeconfig()?)?;
    // Hollow pods run nothing: the controller of an installed cluster runs in this process.
    // In network mode it runs as its Deployment's pod, this binary sandboxed in the pod.
    if !network {
        for c in &lab.clusters {
            tokio::spawn(crate::host::host_controller(
                c.config.name.clone(),
                c.client.clone(),
                tandem_controller::Options::default(),
            ));
        }
    }
    let runs = if network {
        "as its Deployment's pod (this binary, sandboxed in the pod's namespaces)".to_string()
    } else {
        "in this process".to_string()
    };
    eprintln!(
        "lab ready; kubeconfig: {path}\n  kubectl --kubeconfig {path} --context lab-1 get nodes\n`tandem install --kubeconfig {path} --context lab-N` runs Tandem's controller {runs}.\nCtrl-C stops the lab (objects are kept in {dir}).",
        path = kubeconfig.display(),
        dir = dir.display()
    );
    if network {
        for c in &lab.clusters {
            if let Some(wan) = c.wan_url() {
                eprintln!(
                    "  {}: peers reach its API server at {wan} (`tandem invite --endpoint {wan}`)",
                    c.config.name
                );
            }
        }
    }
    interrupted.await;
    eprintln!("stopping the lab");
    lab.shutdown();
    Ok(())
}

/// `tandem lab load-image`: records each image in the data directory of each chosen cluster
/// (every cluster of the lab's kubeconfig when none is named).
fn load_images(dir: &Path, images: &[String], clusters: &[String]) -> anyhow::Result<()> {
    let path = dir.join("kubeconfig");
    let kubeconfig = Kubeconfig::read_from(&path).with_context(|| {
        format!(
            "reading {} (is a lab there? start one with `tandem lab up --dir {}`)",
            path.display(),
            dir.display()
        )
    })?;
    let known: Vec<String> = kubeconfig.contexts.iter().map(|c| c.name.clone()).collect();
    let chosen = if clusters.is_empty() {
        known.clone()
    } else {
        for c in clusters {
            anyhow::ensure!(
                known.contains(c),
                "the lab in {} has no cluster {c:?} (it has {})",
                dir.display(),
                known.join(", ")
            );
        }
        clusters.to_vec()
    };
    for cluster in &chosen {
        let data = dir.join(cluster);
        anyhow::ensure!(
            data.is_dir(),
            "cluster {cluster} keeps no data in {} (was the lab started with --dir {}?)",
            data.display(),
            dir.display()
        );
        for image in images {
            tandem_lab::images::load_into(&data, image).with_context(|| {
                format!("loading image {image} onto {cluster} ({})", data.display())
            })?;
            eprintln!(
                "✓ image {} loaded onto {cluster}'s nodes",
                tandem_lab::images::normalize(image)
            );
        }
    }
    Ok(())
}

/// One cluster of `tandem lab status`.
#[derive(Serialize)]
struct ClusterHealth {
    cluster: String,
    server: String,
    health: &'static str,
    /// Ready/all nodes; empty when the cluster does not answer.
    nodes: String,
    pods: Option<usize>,
    /// Why the cluster is down.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

async fn status(dir: PathBuf, output: Output) -> anyhow::Result<()> {
    let path = dir.join("kubeconfig");
    let kubeconfig = Kubeconfig::read_from(&path).with_context(|| {
        format!(
            "reading {} (is a lab running? start one with `tandem lab up`)",
            path.display()
        )
    })?;
    let mut rows = Vec::new();
    for ctx in &kubeconfig.contexts {
        let server = kubeconfig
            .clusters
            .iter()
            .find(|c| Some(&c.name) == ctx.context.as_ref().map(|x| &x.cluster))
            .and_then(|c| c.cluster.as_ref().and_then(|c| c.server.clone()))
            .unwrap_or_default();
        let cluster = ClusterArgs {
            kubeconfig: Some(path.clone()),
            context: Some(ctx.name.clone()),
        };
        let row = async {
            let client = cluster.client().await?;
            let nodes = Api::<Node>::all(client.clone())
                .list(&ListParams::default())
                .await?;
            let ready = nodes
                .items
                .iter()
                .filter(|n| crate::status::node_ready(n))
                .count();
            let pods = Api::<Pod>::all(client)
                .list(&ListParams::default())
                .await?
                .items
                .len();
            anyhow::Ok((format!("{ready}/{}", nodes.items.len()), pods))
        };
        let (health, nodes, pods, error) =
            match tokio::time::timeout(Duration::from_secs(3), row).await {
                Ok(Ok((nodes, pods))) => ("ok", nodes, Some(pods), None),
                Ok(Err(e)) => ("down", String::new(), None, Some(format!("{e:#}"))),
                Err(_) => ("down", String::new(), None, Some("no answer in 3s".into())),
            };
        rows.push(ClusterHealth {
            cluster: ctx.name.clone(),
            server,
            health,
            nodes,
            pods,
            error,
        });
    }
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
        Output::Yaml => print!("{}", serde_saphyr::to_string(&rows)?),
        Output::Table => {
            let mut t = table::new(["CLUSTER", "SERVER", "HEALTH", "NODES", "PODS", "ERROR"]);
            for r in rows {
                t.add_row([
                    r.cluster,
                    r.server,
                    r.health.to_string(),
                    r.nodes,
                    r.pods.map(|p| p.to_string()).unwrap_or_default(),
                    r.error.unwrap_or_default(),
                ]);
            }
            print!("{}", table::render(t, 0));
        }
    }
    Ok(())
}
