//! `--kubeconfig` and `--context`, as kubectl takes them: the client of the chosen cluster and
//! the endpoint and CA a peer would use to reach it.

use std::path::PathBuf;

use anyhow::{Context, anyhow};
use base64::Engine;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

/// Which cluster a command talks to.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct KubeArgs {
    /// Path to the kubeconfig file [default: $KUBECONFIG or ~/.kube/config].
    #[arg(long, value_name = "FILE", global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use [default: its current context].
    #[arg(long, value_name = "NAME", global = true)]
    pub context: Option<String>,
}

/// A cluster as a kubeconfig names it.
pub struct Target {
    pub client: Client,
    /// The API endpoint (https://host:port).
    pub server: String,
    /// PEM of the CA of the API serving certificate, if the kubeconfig has one.
    pub ca_pem: Option<String>,
}

impl KubeArgs {
    fn load(&self) -> anyhow::Result<Kubeconfig> {
        match &self.kubeconfig {
            Some(path) => Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display())),
            None => {
                Kubeconfig::read().context("reading the kubeconfig ($KUBECONFIG or ~/.kube/config)")
            }
        }
    }

    /// Connects to the chosen cluster.
    pub async fn target(&self) -> anyhow::Result<Target> {
        let kubeconfig = self.load()?;
        let context_name = self
            .context
            .clone()
            .or(kubeconfig.current_context.clone())
            .ok_or_else(|| anyhow!("the kubeconfig has no current context; pass --context"))?;
        let context = kubeconfig
            .contexts
            .iter()
            .find(|c| c.name == context_name)
            .and_then(|c| c.context.clone())
            .ok_or_else(|| anyhow!("context {context_name:?} is not in the kubeconfig"))?;
        let cluster = kubeconfig
            .clusters
            .iter()
            .find(|c| c.name == context.cluster)
            .and_then(|c| c.cluster.clone())
            .ok_or_else(|| {
                anyhow!(
                    "cluster {:?} of context {context_name:?} is not in the kubeconfig",
                    context.cluster
                )
            })?;
        let server = cluster
            .server
            .clone()
            .ok_or_else(|| anyhow!("cluster {:?} has no server", context.cluster))?;
        let ca_pem = match (
            &cluster.certificate_authority_data,
            &cluster.certificate_authority,
        ) {
            (Some(data), _) => Some(String::from_utf8(
                base64::engine::general_purpose::STANDARD
                    .decode(data.trim())
                    .context("certificate-authority-data is not base64")?,
            )?),
            (None, Some(path)) => Some(
                std::fs::read_to_string(path).with_context(|| format!("reading CA file {path}"))?,
            ),
            (None, None) => None,
        };
        let options = KubeConfigOptions {
            context: Some(context_name.clone()),
            ..Default::default()
        };
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .with_context(|| format!("kubeconfig context {context_name:?}"))?;
        let client = Client::try_from(config).context("building the client")?;
        Ok(Target {
            client,
            server,
            ca_pem,
        })
    }
}

/// Parses "90s", "30m", "1h", "1h30m", "2d".
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let mut total = 0u64;
    let mut num = String::new();
    for c in s.trim().chars() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let n: u64 = num.parse().map_err(|_| format!("invalid duration {s:?}"))?;
        num.clear();
        total += n * match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86400,
            _ => {
                return Err(format!(
                    "invalid duration {s:?} (use s, m, h or d, e.g. 1h30m)"
                ));
            }
        };
    }
    if !num.is_empty() || total == 0 {
        return Err(format!(
            "invalid duration {s:?} (use s, m, h or d, e.g. 1h30m)"
        ));
    }
    Ok(std::time::Duration::from_secs(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        for (s, want) in [
            ("90s", Some(90)),
            ("1h30m", Some(5400)),
            ("2d", Some(172800)),
            ("1", None),
            ("x", None),
            ("0s", None),
        ] {
            assert_eq!(parse_duration(s).ok().map(|d| d.as_secs()), want, "{s}");
        }
    }
}
