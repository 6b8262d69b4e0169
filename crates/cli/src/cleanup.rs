//! `tandem cleanup`: the in-cluster role the Helm chart's post-delete hook runs once `helm
//! uninstall` has deleted the release. It removes what the controller kept outside the
//! release's objects and that nothing owns: the `clusterset.local` stub domain in CoreDNS's
//! Corefile (the controller re-adds it while it runs, so only after it is gone can the stub go
//! for good). The webhook configurations go with the controller's ClusterRole, their owner;
//! the CRDs stay, as Helm leaves a chart's `crds/`.

/// Remove the controller's CoreDNS stub once Tandem is uninstalled (the chart's
/// post-delete hook runs this).
#[derive(clap::Args)]
#[command(
    after_help = "Run by the Helm chart's post-delete hook (in-cluster only); \
                        `tandem uninstall` does the same and more."
)]
pub struct Args {}

pub async fn run(_args: Args, cluster: &crate::flags::ClusterArgs) -> anyhow::Result<()> {
    let client = cluster.client().await?;
    let edited =
        tandem_admin::install::edit_corefile(&client, tandem_admin::install::without_stub_domain)
            .await
            .map_err(|e| anyhow::anyhow!("editing ConfigMap kube-system/coredns: {e}"))?;
    match edited {
        Some(true) => {
            eprintln!("clusterset.local stub domain removed from ConfigMap kube-system/coredns")
        }
        Some(false) => eprintln!("ConfigMap kube-system/coredns holds no clusterset.local stub"),
        None => eprintln!("no ConfigMap kube-system/coredns: nothing to remove"),
    }
    Ok(())
}
