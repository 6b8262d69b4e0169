//! The one way a command reaches its cluster: a client (and, for invites, the endpoint and CA a
//! peer would use) from `--kubeconfig` and `--context`, read through kube's typed `Kubeconfig`.

use base64::Engine;
use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::{Client, Config};

use crate::error::Error;
use crate::flags::ClusterArgs;

/// A cluster as a kubeconfig names it.
pub struct Target {
    /// A client of the cluster.
    pub client: Client,
    /// The API endpoint (https://host:port).
    pub server: String,
    /// PEM of the CA of the API serving certificate, if the kubeconfig has one.
    pub ca_pem: Option<String>,
}

impl ClusterArgs {
    fn load(&self) -> Result<Kubeconfig, Error> {
        match &self.kubeconfig {
            Some(path) => Kubeconfig::read_from(path),
            None => Kubeconfig::read(),
        }
        .map_err(|source| match source {
            // kube's message repeats its io::Error source; name the step and the file once.
            KubeconfigError::ReadConfig(source, path) => Error::Io {
                step: "reading kubeconfig",
                path,
                source,
            },
            source => Error::ReadKubeconfig {
                path: self.kubeconfig.clone(),
                source,
            },
        })
    }

    /// The kubeconfig's contexts, in its order.
    pub fn contexts(&self) -> Result<Vec<String>, Error> {
        Ok(self.load()?.contexts.into_iter().map(|c| c.name).collect())
    }

    /// A client of the chosen cluster; without flags kube's usual inference ($KUBECONFIG,
    /// ~/.kube/config, else the in-cluster ServiceAccount), as the controller's Deployment needs.
    pub async fn client(&self) -> Result<Client, Error> {
        Client::try_from(self.config().await?).map_err(Error::Client)
    }

    /// The configuration [`Self::client`] connects with.
    pub async fn config(&self) -> Result<Config, Error> {
        if self.kubeconfig.is_none() && self.context.is_none() {
            Config::infer().await.map_err(Error::InferConfig)
        } else {
            let kubeconfig = self.load()?;
            let context = context_name(&kubeconfig, self.context.as_deref())?;
            config(kubeconfig, context).await
        }
    }

    /// The chosen cluster's client, endpoint and CA (what an invite hands to a peer).
    pub async fn target(&self) -> Result<Target, Error> {
        let kubeconfig = self.load()?;
        let context = context_name(&kubeconfig, self.context.as_deref())?;
        let cluster_name = kubeconfig
            .contexts
            .iter()
            .find(|c| c.name == context)
            .and_then(|c| c.context.as_ref())
            .map(|c| c.cluster.clone())
            .ok_or_else(|| Error::UnknownContext(context.clone()))?;
        let cluster = kubeconfig
            .clusters
            .iter()
            .find(|c| c.name == cluster_name)
            .and_then(|c| c.cluster.clone())
            .ok_or_else(|| Error::UnknownCluster {
                context: context.clone(),
                cluster: cluster_name.clone(),
            })?;
        let server = cluster
            .server
            .clone()
            .ok_or_else(|| Error::NoServer(cluster_name.clone()))?;
        let ca_pem = match (
            &cluster.certificate_authority_data,
            &cluster.certificate_authority,
        ) {
            (Some(data), _) => Some(
                base64::engine::general_purpose::STANDARD
                    .decode(data.trim())
                    .ok()
                    .and_then(|pem| String::from_utf8(pem).ok())
                    .ok_or_else(|| Error::CaData(cluster_name.clone()))?,
            ),
            (None, Some(path)) => {
                Some(
                    std::fs::read_to_string(path).map_err(|source| Error::CaFile {
                        path: path.clone(),
                        source,
                    })?,
                )
            }
            (None, None) => None,
        };
        let client = Client::try_from(config(kubeconfig, context).await?).map_err(Error::Client)?;
        Ok(Target {
            client,
            server,
            ca_pem,
        })
    }
}

/// `--context`, else the kubeconfig's current context.
fn context_name(kubeconfig: &Kubeconfig, flag: Option<&str>) -> Result<String, Error> {
    flag.map(str::to_string)
        .or_else(|| kubeconfig.current_context.clone())
        .ok_or(Error::NoCurrentContext)
}

async fn config(kubeconfig: Kubeconfig, context: String) -> Result<Config, Error> {
    if !kubeconfig.contexts.iter().any(|c| c.name == context) {
        return Err(Error::UnknownContext(context));
    }
    let options = KubeConfigOptions {
        context: Some(context.clone()),
        ..Default::default()
    };
    Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .map_err(|source| Error::ClientConfig { context, source })
}
