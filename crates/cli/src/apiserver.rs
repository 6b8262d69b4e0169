//! `tandem apiserver`: one embedded API server in the foreground.

use std::path::PathBuf;

use anyhow::Context;

/// Arguments of `tandem apiserver`.
#[derive(clap::Args)]
#[command(
    after_help = "Example:\n  tandem apiserver --data-dir /tmp/c1\n  kubectl --kubeconfig /tmp/c1/admin.kubeconfig get namespaces"
)]
pub struct Args {
    /// Directory for the store, the cluster CA and admin.kubeconfig; created if missing.
    /// Restarting on the same directory keeps every object.
    #[arg(long, value_name = "DIR")]
    data_dir: PathBuf,
    /// Port on 127.0.0.1 (0 picks a free one).
    #[arg(long, default_value_t = 6443)]
    port: u16,
    /// Cluster name, used for the CA and the kubeconfig context.
    #[arg(long, default_value = "tandem")]
    name: String,
}

/// Runs the server until interrupted.
pub async fn run(args: Args) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating data directory {}", args.data_dir.display()))?;
    let server = tandem_apiserver::ApiServer::start(tandem_apiserver::Config {
        name: args.name,
        data_dir: Some(args.data_dir.clone()),
        port: args.port,
        ..Default::default()
    })
    .await
    .with_context(|| format!("starting the API server on 127.0.0.1:{}", args.port))?;
    let kubeconfig = args.data_dir.join("admin.kubeconfig");
    server.write_admin_kubeconfig(&kubeconfig)?;
    tracing::info!(
        url = %server.url(),
        kubeconfig = %kubeconfig.display(),
        "serving; try: kubectl --kubeconfig {} get namespaces",
        kubeconfig.display()
    );
    tokio::signal::ctrl_c().await?;
    tracing::info!("interrupted; shutting down");
    server.shutdown();
    Ok(())
}
