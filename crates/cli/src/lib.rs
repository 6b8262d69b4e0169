//! The `tandem` command line (also run as the kubectl plugin `kubectl-tandem`).

// The API server and the controllers allocate heavily (JSON trees per request and per watch
// event); glibc's malloc spent over half of a lab API server's CPU in a 10,000-pod burst
// (free-list scans, consolidation). mimalloc is made for this pattern. Declared here, once,
// for both binaries (`tandem`, `kubectl-tandem`) built on this library.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod advertise;
// Linux only (network namespaces, TUN, nftables, capabilities): see Cargo.toml.
#[cfg(target_os = "linux")]
mod agent;
mod apiserver;
mod check;
mod cleanup;
mod cluster;
mod completion;
mod controller;
mod crds;
mod dashboard;
// Linux only (network namespaces, TUN, nftables, capabilities): see Cargo.toml.
#[cfg(target_os = "linux")]
mod demo;
mod discover;
mod drain;
mod error;
mod export;
mod flags;
// Linux only (network namespaces, TUN, nftables, capabilities): see Cargo.toml.
#[cfg(target_os = "linux")]
mod gateway;
mod host;
mod install;
mod invite;
// Linux only (network namespaces, TUN, nftables, capabilities): see Cargo.toml.
#[cfg(target_os = "linux")]
mod lab;
mod manifests;
mod offload;
mod peer;
mod probe;
mod requests;
mod rotate;
mod status;
mod table;
mod uninstall;
mod unpeer;
mod version;
mod workdir;

use clap::{Parser, Subcommand};

/// Tandem peers Kubernetes clusters so they work as one.
#[derive(Parser)]
#[command(
    name = "tandem",
    version,
    about = "Tandem peers Kubernetes clusters so they work as one.",
    long_about = None,
    after_help = "Quick start:\n  tandem demo                      two lab clusters, peered, an app in both\n  tandem install --cluster-id ID   on each cluster\n  tandem invite                    on the provider; hand the string to the consumer's admin\n  tandem peer INVITE               on the consumer\n  tandem offload namespace NS      on the consumer\n  tandem status\n\nLike kubectl, every command takes --kubeconfig, --context, -n and -o, before or after the verb."
)]
struct Cli {
    #[command(flatten)]
    global: flags::GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Two lab clusters peered, a namespace offloaded, an app running in both.
    #[cfg(target_os = "linux")]
    Demo(demo::Args),
    /// Install (or upgrade) Tandem in a cluster and create its identity.
    Install(install::Args),
    /// Remove Tandem from a cluster (refused while peered, unless --force).
    Uninstall(uninstall::Args),
    /// Replace a credential now: the webhook's serving certificate, the WireGuard keys.
    Rotate(rotate::Args),
    /// On a provider: create, list or revoke a peering invite.
    Invite(invite::Args),
    /// Print the DNS records (DNS-SD) that advertise this cluster under a domain.
    Advertise(advertise::Args),
    /// List clusters that advertise themselves for peering (browsing a DNS domain first).
    Discover(discover::Args),
    /// On a consumer: peer with a provider, with its invite or through discovery.
    Peer(peer::Args),
    /// On a provider: list the peering requests filed without an invite.
    Requests(requests::ListArgs),
    /// On a provider: approve a peering request filed without an invite.
    Approve(requests::DecideArgs),
    /// On a provider: deny a peering request filed without an invite (nothing is created).
    Deny(requests::DecideArgs),
    /// Undo a peering (either side).
    Unpeer(unpeer::Args),
    /// Offload a namespace to peered providers (twin namespaces, pod placement).
    Offload(offload::OffloadArgs),
    /// Stop offloading a namespace and remove its twin namespaces.
    Unoffload(offload::UnoffloadArgs),
    /// Mark a provider's virtual node unschedulable: no new pod goes there, pods there stay.
    Cordon(drain::CordonArgs),
    /// Let pods be placed on a provider's virtual node again.
    Uncordon(drain::CordonArgs),
    /// Empty a provider for maintenance: cordon it, evict its pods honouring
    /// PodDisruptionBudgets, wait until they run elsewhere.
    Drain(drain::DrainArgs),
    /// Show peerings, virtual nodes, offloaded namespaces, pod counts, exported and imported
    /// services.
    Status(status::Args),
    /// Serve a live, read-only topology page (clusters, peerings, virtual nodes, tunnels,
    /// offloaded namespaces) on localhost.
    Dashboard(dashboard::Args),
    /// Export a Service to every peer (multi-cluster services: `<svc>.<ns>.svc.clusterset.local`).
    Export(export::ExportArgs),
    /// Stop exporting a Service.
    Unexport(export::UnexportArgs),
    /// On a consumer: test connectivity across a peering (pods both ways, the node,
    /// Services by ClusterIP and clusterset.local name, the tunnel), each path ✓ or ✗.
    Check(check::Args),
    /// Print Tandem's CustomResourceDefinitions (YAML).
    Crds(crds::Args),
    /// Print a shell completion script (bash, zsh, fish).
    Completion(completion::Args),
    /// Print this CLI's version and the installed controller's.
    Version(version::Args),
    /// Write the install manifests of `deploy/` (kustomize) from the same source as `tandem
    /// install`.
    #[command(hide = true)]
    Manifests(manifests::Args),
    /// Run Tandem's controller (the cluster agent) against a cluster.
    Controller(controller::Args),
    /// Run the per-peer network gateway (WireGuard tunnel, prefix NAT, routes).
    #[cfg(target_os = "linux")]
    Gateway(gateway::Args),
    /// Run the network fabric's node agent (routes to the gateways; in-cluster only).
    #[cfg(target_os = "linux")]
    Agent(agent::Args),
    /// Remove the controller's CoreDNS stub after `helm uninstall` (the chart's post-delete
    /// hook; in-cluster only).
    Cleanup(cleanup::Args),
    /// Run the connectivity probe `tandem check` starts in pods (in-cluster only).
    Probe(probe::Args),
    /// Run lab clusters (API server, scheduler, hollow nodes, controllers) on 127.0.0.1.
    #[cfg(target_os = "linux")]
    Lab(lab::Args),
    /// Run an embedded Kubernetes-compatible API server on 127.0.0.1.
    Apiserver(apiserver::Args),
}

/// Ctrl-C (SIGINT) or SIGTERM from now on. Unlike `tokio::signal::ctrl_c`, which listens only once
/// awaited, the handler is in place when this returns, so a Ctrl-C that comes while a
/// foreground command still prints is caught rather than killing the process.
fn interrupt() -> std::io::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = sigint.recv() => {}
            _ = sigterm.recv() => {}
        }
    })
}

/// Runs the command line; `main` of both binaries.
pub fn main() -> std::process::ExitCode {
    // A network-mode lab starts pods of Tandem's image as `tandem __lab-sandbox`: set the
    // sandbox up while this process has one thread, then become the pod's role.
    #[cfg(target_os = "linux")]
    if std::env::args_os().nth(1).as_deref()
        == Some(std::ffi::OsStr::new(
            tandem_lab::network::incluster::SANDBOX_ARG,
        ))
    {
        let spec = std::env::var(tandem_lab::network::incluster::SANDBOX_ENV).unwrap_or_default();
        let pid1 = std::env::args_os().nth(2).as_deref()
            == Some(std::ffi::OsStr::new(
                tandem_lab::network::incluster::PID1_ARG,
            ));
        let Err(e) = tandem_lab::network::incluster::enter(&spec, pid1);
        eprintln!("error: {:#}", anyhow::Error::new(e));
        // What runc answers for a container that cannot start.
        return std::process::ExitCode::from(128);
    }
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}` prints the whole chain of causes on one line, kubectl style.
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    // As a kubectl plugin, usage lines read `kubectl tandem …`.
    let plugin = std::env::args()
        .next()
        .is_some_and(|a| a.ends_with("kubectl-tandem"));
    let mut command = <Cli as clap::CommandFactory>::command();
    if plugin {
        command = command.bin_name("kubectl tandem");
    }
    let cli = <Cli as clap::FromArgMatches>::from_arg_matches(&command.get_matches())?;
    // Servers log what they do; one-shot commands speak through their own output and only
    // log warnings (RUST_LOG overrides both).
    let servers = match &cli.command {
        Command::Controller(_) | Command::Probe(_) | Command::Apiserver(_) => true,
        #[cfg(target_os = "linux")]
        Command::Gateway(_) | Command::Agent(_) | Command::Lab(_) => true,
        _ => false,
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| if servers { "info" } else { "warn" }.into()),
        )
        .with_writer(std::io::stderr)
        // Colours only for a terminal: a pod's log (or a file) gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let prints_objects = match &cli.command {
        Command::Status(_)
        | Command::Discover(_)
        | Command::Requests(_)
        | Command::Version(_)
        | Command::Check(_) => true,
        #[cfg(target_os = "linux")]
        Command::Lab(args) => args.prints_objects(),
        Command::Install(args) => args.prints_objects(),
        _ => false,
    };
    if let (Some(output), false) = (cli.global.output, prints_objects) {
        anyhow::bail!(
            "-o/--output {} does not apply to this command; `tandem status`, `tandem version`, `tandem check`, `tandem discover`, `tandem lab status` and `tandem install --dry-run` take it",
            clap::ValueEnum::to_possible_value(&output)
                .map_or_else(String::new, |v| v.get_name().to_string())
        );
    }
    if let Command::Crds(args) = cli.command {
        return crds::run(args);
    }
    if let Command::Completion(args) = cli.command {
        return completion::run(args);
    }
    if let Command::Manifests(args) = cli.command {
        return manifests::run(args);
    }
    #[cfg(target_os = "linux")]
    if matches!(cli.command, Command::Gateway(_) | Command::Agent(_)) {
        // Before the runtime starts its threads: capabilities belong to threads.
        tandem_node::keep_capabilities_across_exec();
    }
    let global = cli.global;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        match cli.command {
            Command::Apiserver(args) => apiserver::run(args).await,
            #[cfg(target_os = "linux")]
            Command::Gateway(args) => gateway::run(args, &global.cluster).await,
            #[cfg(target_os = "linux")]
            Command::Agent(args) => agent::run(args, &global.cluster).await,
            Command::Probe(args) => probe::run(args).await,
            Command::Cleanup(args) => cleanup::run(args, &global.cluster).await,
            #[cfg(target_os = "linux")]
            Command::Lab(args) => lab::run(args, &global).await,
            Command::Controller(args) => controller::run(args, &global.cluster).await,
            Command::Status(args) => status::run(args, &global).await,
            Command::Version(args) => version::run(args, &global).await,
            Command::Dashboard(args) => dashboard::run(args, &global.cluster).await,
            #[cfg(target_os = "linux")]
            Command::Demo(args) => demo::run(args).await,
            Command::Install(args) => install::run(args, &global.cluster, global.output).await,
            Command::Uninstall(args) => uninstall::run(args, &global.cluster).await,
            Command::Rotate(args) => rotate::run(args, &global.cluster).await,
            Command::Invite(args) => invite::run(args, &global.cluster).await,
            Command::Advertise(args) => advertise::run(args, &global.cluster).await,
            Command::Discover(args) => discover::run(args, &global).await,
            Command::Peer(args) => peer::run(args, &global.cluster).await,
            Command::Requests(args) => requests::list(args, &global).await,
            Command::Approve(args) => {
                requests::decide(args, &global, tandem_admin::enroll::Decision::Approve).await
            }
            Command::Deny(args) => {
                requests::decide(args, &global, tandem_admin::enroll::Decision::Deny).await
            }
            Command::Unpeer(args) => unpeer::run(args, &global.cluster).await,
            Command::Offload(args) => offload::offload(args, &global).await,
            Command::Unoffload(args) => offload::unoffload(args, &global).await,
            Command::Cordon(args) => drain::cordon(args, &global.cluster, true).await,
            Command::Uncordon(args) => drain::cordon(args, &global.cluster, false).await,
            Command::Drain(args) => drain::drain(args, &global.cluster).await,
            Command::Export(args) => export::export(args, &global).await,
            Command::Check(args) => check::run(args, &global).await,
            Command::Unexport(args) => export::unexport(args, &global).await,
            Command::Crds(_) | Command::Manifests(_) | Command::Completion(_) => {
                unreachable!("handled above")
            }
        }
    })
}
