//! `tandem version`: this CLI's version and the installed controller's, read from its
//! Deployment, as `kubectl version` shows the client's and the server's.

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;
use serde::Serialize;
use tandem_api::names;

use crate::flags::{GlobalArgs, Output};

/// Print this CLI's version and the installed controller's.
#[derive(clap::Args)]
#[command(
    after_help = "Example:\n  tandem version\n  tandem version --client\n  tandem version -o json"
)]
pub struct Args {
    /// Only this CLI's version; no cluster is contacted.
    #[arg(long)]
    client: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Running {
    pub pod: String,
    pub version: Option<String>,
    pub peering_protocol: u32,
}

/// What `tandem version` reports.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Versions {
    pub client: ClientVersion,
    /// None with --client.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub controller: Option<ControllerVersion>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientVersion {
    pub version: String,
    pub peering_protocol: u32,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ControllerVersion {
    /// The version its manifests were made by (the Deployment's app.kubernetes.io/version);
    /// None when it is not installed or cannot be read.
    pub version: Option<String>,
    pub image: Option<String>,
    /// Ready/desired replicas.
    pub ready: Option<String>,
    /// What the replica holding the leader Lease says it runs (the image's real version and
    /// protocol); None when no current pod holds it or it cannot be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub running: Option<Running>,
    /// Why it is not known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

pub async fn run(args: Args, global: &GlobalArgs) -> anyhow::Result<()> {
    let client = ClientVersion {
        version: env!("CARGO_PKG_VERSION").to_string(),
        peering_protocol: tandem_core::protocol::VERSION,
    };
    let controller = if args.client {
        None
    } else {
        Some(controller(global).await)
    };
    let versions = Versions { client, controller };
    match global.output.unwrap_or_default() {
        Output::Json => println!("{}", serde_json::to_string_pretty(&versions)?),
        Output::Yaml => print!("{}", serde_saphyr::to_string(&versions)?),
        Output::Table => {
            println!(
                "Client:     tandem {} (peering protocol v{})",
                versions.client.version, versions.client.peering_protocol
            );
            if let Some(c) = &versions.controller {
                match (&c.version, &c.error) {
                    (_, Some(e)) => println!("Controller: unknown ({e})"),
                    (v, None) => println!(
                        "Controller: tandem {}, image {} (Deployment {}/{}, {} ready)",
                        v.as_deref().unwrap_or("(unlabelled)"),
                        c.image.as_deref().unwrap_or("-"),
                        names::SYSTEM_NAMESPACE,
                        names::CONTROLLER_NAME,
                        c.ready.as_deref().unwrap_or("-")
                    ),
                }
                if let Some(r) = &c.running {
                    println!(
                        "Running:    tandem {} (peering protocol v{}), leader {}",
                        r.version.as_deref().unwrap_or("(unknown version)"),
                        r.peering_protocol,
                        r.pod
                    );
                }
            }
        }
    }
    Ok(())
}

/// The installed controller's version, or why it is unknown (never an error: the client's
/// version is worth printing either way).
async fn controller(global: &GlobalArgs) -> ControllerVersion {
    let unknown = |error: String| ControllerVersion {
        version: None,
        image: None,
        ready: None,
        running: None,
        error: Some(error),
    };
    let client = match global.cluster.client().await {
        Ok(c) => c,
        Err(e) => return unknown(format!("{e:#}")),
    };
    // Not waited for: what holds the Lease now, if a current pod does.
    let running = tandem_admin::rollout::running_controller(&client, std::time::Duration::ZERO)
        .await
        .ok()
        .flatten()
        .map(|r| Running {
            pod: r.holder,
            version: r.version,
            peering_protocol: r.protocol,
        });
    let deployments: Api<Deployment> = Api::namespaced(client, names::SYSTEM_NAMESPACE);
    match deployments.get_opt(names::CONTROLLER_NAME).await {
        Ok(Some(d)) => ControllerVersion {
            version: d
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(tandem_admin::install::VERSION_LABEL))
                .cloned(),
            image: d
                .spec
                .as_ref()
                .and_then(|s| s.template.spec.as_ref())
                .and_then(|s| s.containers.first())
                .and_then(|c| c.image.clone()),
            ready: Some(format!(
                "{}/{}",
                d.status
                    .as_ref()
                    .and_then(|s| s.ready_replicas)
                    .unwrap_or(0),
                d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
            )),
            running,
            error: None,
        },
        Ok(None) => unknown(format!(
            "no Deployment {}/{}: Tandem is not installed here (`tandem install`)",
            names::SYSTEM_NAMESPACE,
            names::CONTROLLER_NAME
        )),
        Err(e) => unknown(format!(
            "reading Deployment {}/{}: {e}",
            names::SYSTEM_NAMESPACE,
            names::CONTROLLER_NAME
        )),
    }
}
