//! The `tandem` binary.

mod apiserver;
mod lab;

use clap::{Parser, Subcommand};

/// Tandem peers Kubernetes clusters so they work as one.
#[derive(Parser)]
#[command(name = "tandem", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run an embedded Kubernetes-compatible API server on 127.0.0.1.
    Apiserver(apiserver::Args),
    /// Run lab clusters (API server, scheduler, hollow nodes, controllers) on 127.0.0.1.
    Lab(lab::Args),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        match cli.command {
            Command::Apiserver(args) => apiserver::run(args).await,
            Command::Lab(args) => lab::run(args).await,
        }
    })
}
