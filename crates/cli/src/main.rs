//! The `tandem` binary.

mod apiserver;
mod controller;
mod crds;
mod demo;
mod gateway;
mod host;
mod install;
mod invite;
mod kubeconfig;
mod lab;
mod offload;
mod peer;
mod status;
mod unpeer;

use clap::{Parser, Subcommand};

/// Tandem peers Kubernetes clusters so they work as one.
#[derive(Parser)]
#[command(
    name = "tandem",
    version,
    about = "Tandem peers Kubernetes clusters so they work as one.",
    long_about = None
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run an embedded Kubernetes-compatible API server on 127.0.0.1.
    Apiserver(apiserver::Args),
    /// Run the per-peer network gateway (WireGuard tunnel, prefix NAT, routes).
    Gateway(gateway::Args),
    /// Two lab clusters peered, a namespace offloaded, an app running in both.
    Demo(demo::Args),
    /// Run Tandem's controller (the cluster agent) against a cluster.
    Controller(controller::Args),
    /// Show peerings, virtual nodes, offloaded namespaces and pod counts.
    Status(status::Args),
    /// Print Tandem's CustomResourceDefinitions (YAML).
    Crds(crds::Args),
    /// Run lab clusters (API server, scheduler, hollow nodes, controllers) on 127.0.0.1.
    Lab(lab::Args),
    /// Install (or upgrade) Tandem in a cluster and create its identity.
    Install(install::Args),
    /// On a provider: create, list or revoke a peering invite.
    Invite(invite::Args),
    /// On a consumer: peer with the provider that issued an invite.
    Peer(peer::Args),
    /// Undo a peering (either side).
    Unpeer(unpeer::Args),
    /// Offload a namespace to peered providers (twin namespaces, pod placement).
    Offload(offload::OffloadArgs),
    /// Stop offloading a namespace and remove its twin namespaces.
    Unoffload(offload::UnoffloadArgs),
}

fn main() -> std::process::ExitCode {
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
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    if let Command::Crds(args) = cli.command {
        return crds::run(args);
    }
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        match cli.command {
            Command::Apiserver(args) => apiserver::run(args).await,
            Command::Gateway(args) => gateway::run(args).await,
            Command::Lab(args) => lab::run(args).await,
            Command::Controller(args) => controller::run(args).await,
            Command::Status(args) => status::run(args).await,
            Command::Demo(args) => demo::run(args).await,
            Command::Install(args) => install::run(args).await,
            Command::Invite(args) => invite::run(args).await,
            Command::Peer(args) => peer::run(args).await,
            Command::Unpeer(args) => unpeer::run(args).await,
            Command::Offload(args) => offload::offload(args).await,
            Command::Unoffload(args) => offload::unoffload(args).await,
            Command::Crds(_) => unreachable!("handled above"),
        }
    })
}
