//! `tandem discover`: the clusters found advertising themselves for peering, as recorded in
//! DiscoveredCluster objects; with `--domain`, browsing that domain's DNS-SD records first.

use std::net::SocketAddr;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams};
use serde::Serialize;
use tandem_api::discovery::{SOURCE_DNS, SOURCE_MDNS};
use tandem_api::names::SYSTEM_NAMESPACE;
use tandem_api::{DiscoveredCluster, Peering};
use tandem_controller::discovery::{BROWSE_KEY, SETTINGS};

use crate::flags::{GlobalArgs, Output};

/// List clusters that advertise themselves for peering (DNS-SD).
#[derive(clap::Args)]
#[command(
    after_help = "With --domain, the _tandem._tcp records under that domain (the ones \
`tandem advertise --domain` prints on the other side) are looked up through this machine's \
nameservers (/etc/resolv.conf) or --nameserver, and every cluster found is recorded as a \
DiscoveredCluster; then the recorded clusters are listed. A cluster not seen again within its \
records' TTL shows as NotSeen.\n\nNothing found this way is trusted: the cluster ID is \
self-asserted. Confirm the CA fingerprint with the other cluster's administrator out of band \
before peering.\n\nExamples:\n  tandem discover --domain example.org\n  tandem discover \
--domain example.org --nameserver 192.0.2.53\n  tandem discover -o json"
)]
pub struct Args {
    /// Browse this DNS domain's `_tandem._tcp` records first, and list only what it advertises.
    #[arg(long, value_name = "DOMAIN")]
    domain: Option<String>,
    /// The nameserver to ask (IP or IP:PORT; repeatable) [default: /etc/resolv.conf's].
    #[arg(long, value_name = "ADDR", requires = "domain")]
    nameserver: Vec<String>,
    /// Have the controller browse the LAN over mDNS (it keeps browsing until --mdns-off), and
    /// list only what it heard there.
    #[arg(long, conflicts_with = "domain")]
    mdns: bool,
    /// Stop the controller's mDNS browse.
    #[arg(long, conflicts_with_all = ["domain", "mdns"])]
    mdns_off: bool,
    /// With --mdns, when the browse was off: how long to let it listen before listing.
    #[arg(long, value_name = "DURATION", default_value = "3s", value_parser = crate::flags::duration)]
    wait: std::time::Duration,
}

/// One discovered cluster, as listed: its record, whether it was seen within its TTL, and
/// whether a Peering with it exists.
#[derive(Serialize)]
struct Listed {
    #[serde(flatten)]
    spec: tandem_api::DiscoveredClusterSpec,
    seen: bool,
    peered: bool,
}

/// `IP` or `IP:PORT` (port 53 when absent; `[v6]:port` for IPv6 with a port).
fn nameserver(s: &str) -> anyhow::Result<SocketAddr> {
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let ip: std::net::IpAddr = s
        .trim_matches(['[', ']'])
        .parse()
        .with_context(|| format!("--nameserver {s:?} is not IP or IP:PORT"))?;
    Ok(SocketAddr::new(ip, 53))
}

pub async fn run(args: Args, global: &GlobalArgs) -> anyhow::Result<()> {
    let client = global.cluster.client().await?;
    let domain = args
        .domain
        .as_deref()
        .map(|d| d.trim_end_matches('.').to_ascii_lowercase());
    if let Some(domain) = &domain {
        anyhow::ensure!(
            tandem_core::discovery::valid_domain(domain),
            "--domain {domain:?} is not a DNS domain name (labels separated by dots)"
        );
        let servers = if args.nameserver.is_empty() {
            tandem_dns::client::system_nameservers()
        } else {
            args.nameserver
                .iter()
                .map(|s| nameserver(s))
                .collect::<anyhow::Result<_>>()?
        };
        let identity = tandem_controller::identity::ClusterIdentity::load(&client)
            .await
            .context("reading this cluster's identity (is Tandem installed? `tandem install`)")?;
        let browsed = tandem_controller::discovery::browse_domain(domain, &servers)
            .await
            .with_context(|| format!("browsing {domain} for advertised clusters"))?;
        for why in &browsed.skipped {
            eprintln!("warning: skipped {why}");
        }
        let mut known = tandem_controller::discovery::known(&client)
            .await
            .context("listing DiscoveredClusters")?;
        let recorded = tandem_controller::discovery::record(
            &client,
            &identity.cluster_id,
            &mut known,
            &browsed.sightings,
            SOURCE_DNS,
            Some(domain),
        )
        .await;
        for why in &recorded.dropped {
            eprintln!("note: not recorded: {why}");
        }
    }
    if args.mdns_off {
        let request = crate::advertise::set_setting(&client, BROWSE_KEY, None).await?;
        let state = crate::advertise::mdns_state(&client, &request).await?;
        anyhow::ensure!(
            !state.contains("browsing"),
            "the controller's mDNS still reports {state:?}"
        );
        println!("The controller no longer browses for clusters over mDNS.");
        return Ok(());
    }
    if args.mdns {
        let settings = Api::<ConfigMap>::namespaced(client.clone(), SYSTEM_NAMESPACE)
            .get_opt(SETTINGS)
            .await
            .context("reading the discovery settings")?;
        let browsing = settings
            .and_then(|c| c.data)
            .is_some_and(|d| d.get(BROWSE_KEY).is_some_and(|v| v == "true"));
        // Written even when on already: the controller then says it acted on it (and tries
        // again if it had failed).
        let request =
            crate::advertise::set_setting(&client, BROWSE_KEY, Some("true".into())).await?;
        let state = crate::advertise::mdns_state(&client, &request).await?;
        anyhow::ensure!(state.contains("browsing"), "the controller's mDNS {state}");
        if !browsing {
            eprintln!(
                "The controller browses the LAN over mDNS from now on (`tandem discover \
                 --mdns-off` stops it); listening for {}…",
                humantime::format_duration(args.wait)
            );
            tokio::time::sleep(args.wait).await;
        }
    }
    let discovered = Api::<DiscoveredCluster>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing DiscoveredClusters")?
        .items;
    let peerings: std::collections::BTreeSet<String> = Api::<Peering>::all(client.clone())
        .list_metadata(&ListParams::default())
        .await
        .context("listing Peerings")?
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    let listed: Vec<Listed> = discovered
        .into_iter()
        .map(|d| d.spec)
        .filter(|s| domain.is_none() || s.domain == domain)
        .filter(|s| !args.mdns || s.source == SOURCE_MDNS)
        .map(|s| {
            let seen = !tandem_controller::discovery::lapsed(&s.last_seen, s.ttl_seconds);
            Listed {
                peered: peerings.contains(&s.cluster_id),
                seen,
                spec: s,
            }
        })
        .collect();
    match global.output.unwrap_or_default() {
        Output::Json => println!("{}", serde_json::to_string_pretty(&listed)?),
        Output::Yaml => print!("{}", serde_saphyr::to_string(&listed)?),
        Output::Table if listed.is_empty() => eprintln!(
            "No clusters discovered{}.",
            match (&domain, args.mdns) {
                (Some(d), _) => format!(" under {d}"),
                (None, true) => " over mDNS".to_string(),
                (None, false) => String::new(),
            }
        ),
        Output::Table => {
            let mut t = crate::table::new([
                "CLUSTER",
                "ENDPOINT",
                "REGION",
                "ZONE",
                "SOURCE",
                "STATE",
                "PROTOCOL",
                "PEERED",
                "CA FINGERPRINT",
            ]);
            for l in &listed {
                let source = match &l.spec.domain {
                    Some(d) => format!("{} ({d})", l.spec.source),
                    None => l.spec.source.clone(),
                };
                t.add_row([
                    l.spec.cluster_id.clone(),
                    l.spec.endpoint.clone(),
                    l.spec.region.clone().unwrap_or_else(|| "-".into()),
                    l.spec.zone.clone().unwrap_or_else(|| "-".into()),
                    source,
                    if l.seen { "Seen" } else { "NotSeen" }.to_string(),
                    if tandem_core::protocol::SUPPORTED.contains(&l.spec.protocol_version) {
                        format!("v{}", l.spec.protocol_version)
                    } else {
                        format!("v{} (unsupported)", l.spec.protocol_version)
                    },
                    if l.peered { "yes" } else { "no" }.to_string(),
                    l.spec.ca_fingerprint.clone(),
                ]);
            }
            print!("{}", crate::table::render(t, 0));
        }
    }
    Ok(())
}
