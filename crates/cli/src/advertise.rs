//! `tandem advertise`: what this cluster publishes for discovery.

use anyhow::Context as _;

use crate::flags::ClusterArgs;

/// Print the DNS records that advertise this cluster for discovery under a domain.
#[derive(clap::Args)]
#[command(
    after_help = "The records follow DNS-SD (RFC 6763): a PTR under _tandem._tcp.<domain> naming \
this cluster's instance, its SRV (the API endpoint's host and port) and its TXT (cluster ID, \
protocol version, endpoint, the SHA-256 fingerprint of the API's CA, region and zone). Tandem \
runs nobody's public DNS: add them to your zone. Nothing in them is a credential, and nothing \
in them is trusted either — a consumer pins the CA fingerprint, which its admin confirms with \
yours out of band.\n\nExamples:\n  tandem advertise --domain example.org\n  tandem advertise \
--domain example.org --endpoint https://api.milan.example.org:6443 --ttl 3600"
)]
pub struct Args {
    /// The domain to publish under (`_tandem._tcp.<domain>`).
    #[arg(long, value_name = "DOMAIN")]
    domain: String,
    /// The API endpoint consumers should use [default: the kubeconfig's server].
    #[arg(long, value_name = "URL")]
    endpoint: Option<String>,
    /// The records' TTL, in seconds.
    #[arg(long, default_value_t = 300)]
    ttl: u32,
}

pub async fn run(args: Args, cluster: &ClusterArgs) -> anyhow::Result<()> {
    let domain = args.domain.trim_end_matches('.');
    anyhow::ensure!(
        tandem_core::discovery::valid_domain(&args.domain),
        "--domain {:?} is not a DNS domain name (lower-case labels separated by dots)",
        args.domain
    );
    let target = cluster.target().await?;
    let ca = target.ca_pem.context(
        "the kubeconfig has no certificate-authority for the cluster: consumers could not verify it",
    )?;
    let endpoint = args.endpoint.unwrap_or(target.server);
    let ad = tandem_controller::discovery::advertisement(&target.client, &endpoint, &ca).await?;
    let Some((host, _)) = ad.host_port() else {
        anyhow::bail!("the endpoint {endpoint:?} is not https://HOST[:PORT]; set --endpoint");
    };
    if host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
    {
        eprintln!(
            "warning: the endpoint {endpoint} is this machine's loopback address: other \
             clusters cannot reach it (set --endpoint)"
        );
    }
    println!(
        "; Tandem discovery records for cluster {} (add them to the zone of {domain})",
        ad.cluster_id
    );
    for record in ad.zone_records(domain, args.ttl) {
        println!("{record}");
    }
    eprintln!(
        "consumers confirm this CA fingerprint with you before peering: {}",
        ad.ca_fingerprint
    );
    Ok(())
}
