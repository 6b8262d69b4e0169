//! `tandem export service NS/NAME` and `tandem unexport service NS/NAME`: create or delete
//! the Service's ServiceExport (the MCS API), and say what the controller made of it.

use std::time::Duration;

use anyhow::{Context, bail};
use kube::api::{Api, DeleteParams, PostParams};
use tandem_api::client;
use tandem_api::mcs::{CLUSTERSET_DOMAIN, ServiceExport, export_condition};

use crate::flags::{GlobalArgs, duration};

/// Arguments of `tandem export`.
#[derive(clap::Args)]
pub struct ExportArgs {
    #[command(subcommand)]
    command: ExportCommand,
}

#[derive(clap::Subcommand)]
enum ExportCommand {
    /// Export a Service to every peer (a ServiceExport of the same name): each peer that
    /// shares the namespace with this cluster imports it as `<name>.<namespace>.svc.clusterset.local`.
    #[command(
        after_help = "Examples:\n  tandem export service demo/hello\n  tandem export service hello -n demo\n\n\
Peers import it in the namespace of the same name if they have it and it is shared with\n\
this cluster: a provider's twin namespace of it, or a namespace the peer's admin opted in\n\
(the annotation mcs.tandem.dev/import-from, or its Peering's or Tenant's\n\
spec.serviceImportNamespaces). The exports of one Service by several clusters merge: ports\n\
are the union, and a clash is resolved by the oldest export, with the Conflict condition on\n\
every export and on the imports."
    )]
    Service(ServiceRef),
}

/// Arguments of `tandem unexport`.
#[derive(clap::Args)]
pub struct UnexportArgs {
    #[command(subcommand)]
    command: UnexportCommand,
}

#[derive(clap::Subcommand)]
enum UnexportCommand {
    /// Stop exporting a Service (delete its ServiceExport): peers drop its endpoints from
    /// their imports, and the import goes where no other cluster exports it.
    #[command(after_help = "Example:\n  tandem unexport service demo/hello")]
    Service(ServiceRef),
}

#[derive(clap::Args)]
struct ServiceRef {
    /// The Service, as NAMESPACE/NAME or NAME with -n.
    service: String,
    /// How long to wait for the controller's verdict on the export.
    #[arg(long, default_value = "15s", value_parser = duration)]
    timeout: Duration,
}

impl ServiceRef {
    fn split(&self, global: &GlobalArgs) -> anyhow::Result<(String, String)> {
        match self.service.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() => {
                let ns = global.namespace_or(Some(ns.to_string()))?;
                Ok((ns, name.to_string()))
            }
            Some(_) => bail!("{:?} is not NAMESPACE/NAME", self.service),
            None => Ok((global.namespace_or(None)?, self.service.clone())),
        }
    }
}

pub async fn export(args: ExportArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let ExportCommand::Service(svc) = args.command;
    let (ns, name) = svc.split(global)?;
    let client = global.cluster.client().await?;
    let exports: Api<ServiceExport> = Api::namespaced(client.clone(), &ns);
    match exports
        .create(&PostParams::default(), &ServiceExport::new(&name))
        .await
    {
        Ok(_) => eprintln!("serviceexport {ns}/{name} created"),
        Err(e) if client::is_conflict(&e) => eprintln!("serviceexport {ns}/{name} exists"),
        Err(e) if client::is_not_found(&e) => {
            return Err(anyhow::Error::new(e).context(format!(
                "creating ServiceExport {ns}/{name}: is Tandem installed (`tandem install`) and does namespace {ns} exist?"
            )));
        }
        Err(e) => {
            return Err(
                anyhow::Error::new(e).context(format!("creating ServiceExport {ns}/{name}"))
            );
        }
    }
    // The controller's verdict: Valid (and Conflict) on the export.
    let deadline = tokio::time::Instant::now() + svc.timeout;
    loop {
        let export = exports
            .get(&name)
            .await
            .with_context(|| format!("reading ServiceExport {ns}/{name}"))?;
        let conds = export.status.map(|s| s.conditions).unwrap_or_default();
        let find = |t: &str| conds.iter().find(|c| c.type_ == t);
        if let Some(valid) = find(export_condition::VALID) {
            if valid.status != "True" {
                bail!(
                    "ServiceExport {ns}/{name} is not valid ({}): {}",
                    valid.reason,
                    valid.message
                );
            }
            if let Some(c) = find(export_condition::CONFLICT).filter(|c| c.status == "True") {
                eprintln!("warning: {}: {}", c.reason, c.message);
            }
            if let Some(ready) = find(export_condition::READY) {
                eprintln!("… {}", ready.message);
            }
            println!("{name}.{ns}.svc.{CLUSTERSET_DOMAIN} exported");
            crate::status::warn_if_fabric_off(&client).await;
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "ServiceExport {ns}/{name} created, but no controller has set its Valid condition \
                 within {:?}: is `tandem controller` running?",
                svc.timeout
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub async fn unexport(args: UnexportArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let UnexportCommand::Service(svc) = args.command;
    let (ns, name) = svc.split(global)?;
    let client = global.cluster.client().await?;
    let exports: Api<ServiceExport> = Api::namespaced(client, &ns);
    match exports.delete(&name, &DeleteParams::default()).await {
        Ok(_) => {
            println!("serviceexport {ns}/{name} deleted");
            Ok(())
        }
        Err(e) if client::is_not_found(&e) => {
            bail!("Service {ns}/{name} is not exported (no ServiceExport {ns}/{name})")
        }
        Err(e) => Err(anyhow::Error::new(e).context(format!("deleting ServiceExport {ns}/{name}"))),
    }
}
