//! Standalone gateway process (what `tandem gateway` will run): `tandem-gateway <config.toml>`,
//! or `tandem-gateway genkey` / `tandem-gateway pubkey <private-key>`.

use anyhow::Context as _;
use tandem_net::{GatewayArgs, GatewayConfig, generate_private_key, public_key, run_gateway};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["genkey"] => println!("{}", generate_private_key()),
        ["pubkey", key] => println!("{}", public_key(key)?),
        [path] => {
            let config = GatewayConfig::try_from(GatewayArgs::from_file(path.as_ref())?)?;
            run_gateway(config).await.context("gateway")?;
        }
        _ => anyhow::bail!("usage: tandem-gateway <config.toml> | genkey | pubkey <private-key>"),
    }
    Ok(())
}
