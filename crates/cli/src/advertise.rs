//! `tandem advertise`: what this cluster publishes for discovery.

use anyhow::Context as _;

use tandem_controller::discovery::ADVERTISE_KEY;

use crate::flags::ClusterArgs;

/// Advertise this cluster for discovery: on the LAN over mDNS, or as DNS records to publish.
#[derive(clap::Args)]
#[command(
    group = clap::ArgGroup::new("how").required(true).args(["domain", "mdns", "off"]),
    after_help = "Advertising is opt-in and off by default.\n\n--mdns makes this cluster's \
controller announce it on its LAN as _tandem._tcp.local (multicast DNS, from the controller's \
own network: run it with hostNetwork to reach the nodes' LAN) until --off. The announcement \
carries the cluster ID, protocol version, API endpoint, the SHA-256 fingerprint of the API's \
CA, region and zone.\n\n--domain prints the same as DNS-SD records (RFC 6763) to add to a \
zone you run: a PTR under _tandem._tcp.<domain> naming this cluster's instance, its SRV (the \
API endpoint's host and port) and its TXT. Tandem runs nobody's public DNS.\n\nNothing in \
them is a credential, and nothing in them is trusted either: anyone on a LAN can answer as any \
cluster. A consumer pins the CA fingerprint, which its admin confirms with yours out of \
band.\n\nThe advertisement also carries the enrollment credential (unless --no-enroll): a \
bootstrap token that can do nothing but file a peering request, which waits until you approve \
it (`tandem requests`, `tandem approve`, `tandem deny`) or a PeeringPolicy names the \
consumer's key. At most --max-pending requests wait at once (a ResourceQuota), each for \
--request-ttl: a flood can delay honest requests, never create anything else. A bootstrap token \
is in groups system:bootstrappers and system:authenticated: advertising is refused while a \
binding gives either (beyond Kubernetes' own discovery bindings) any rights, and while advertised \
the controller switches the credential off, with a Warning Event and the condition `tandem \
status` shows, as long as such a binding exists. The credential \
and this cluster's CA are also readable without credentials in kube-public (ConfigMaps \
tandem-enrollment and cluster-info, as kubeadm publishes it), for `tandem peer --endpoint`. \
--off withdraws both.\n\nExamples:\n  tandem advertise --mdns\n  tandem advertise --off\n  tandem \
advertise --domain example.org\n  tandem advertise --domain example.org --endpoint \
https://api.milan.example.org:6443 --ttl 3600"
)]
pub struct Args {
    /// Print the records to publish under this domain (`_tandem._tcp.<domain>`).
    #[arg(long, value_name = "DOMAIN")]
    domain: Option<String>,
    /// Announce this cluster on the LAN over mDNS (the controller does, until --off).
    #[arg(long)]
    mdns: bool,
    /// Stop announcing this cluster over mDNS.
    #[arg(long)]
    off: bool,
    /// The API endpoint consumers should use [default: the kubeconfig's server].
    #[arg(long, value_name = "URL", conflicts_with = "off")]
    endpoint: Option<String>,
    /// The records' TTL, in seconds (--domain).
    #[arg(long, default_value_t = 300, requires = "domain")]
    ttl: u32,
    /// Advertise without the enrollment credential: peering still takes an invite.
    #[arg(long, conflicts_with = "off")]
    no_enroll: bool,
    /// How many peering requests filed with the enrollment credential may wait at once.
    #[arg(long, value_name = "N", default_value_t = tandem_admin::enroll::DEFAULT_MAX_PENDING,
          value_parser = clap::value_parser!(u32).range(1..=1000), conflicts_with = "off")]
    max_pending: u32,
    /// How long such a request waits for approval before it is removed. Approved, but its
    /// consumer never used it (it gave up, or cannot reach this cluster: it published no network
    /// parameters), it is removed after this or 10 minutes, whichever is shorter, with the
    /// Tenant the approval made.
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = crate::flags::duration,
          conflicts_with = "off")]
    request_ttl: std::time::Duration,
}

pub async fn run(args: Args, cluster: &ClusterArgs) -> anyhow::Result<()> {
    if args.off {
        let client = cluster.client().await?;
        let request = set_setting(&client, ADVERTISE_KEY, None).await?;
        let state = mdns_state(&client, &request).await?;
        anyhow::ensure!(
            !state.contains("announcing"),
            "the controller's mDNS still reports {state:?}"
        );
        tandem_admin::enroll::disable(&client)
            .await
            .context("withdrawing the enrollment credential")?;
        println!(
            "This cluster is no longer announced over mDNS (its controller says goodbye), and \
             takes no peering request without an invite."
        );
        return Ok(());
    }
    if let Some(domain) = &args.domain {
        anyhow::ensure!(
            tandem_core::discovery::valid_domain(domain),
            "--domain {domain:?} is not a DNS domain name (lower-case labels separated by dots)"
        );
    }
    let target = cluster.target().await?;
    let ca = target.ca_pem.context(
        "the kubeconfig has no certificate-authority for the cluster: consumers could not verify it",
    )?;
    let endpoint = args.endpoint.unwrap_or(target.server);
    let mut ad =
        tandem_controller::discovery::advertisement(&target.client, &endpoint, &ca).await?;
    if !args.no_enroll {
        let enrollment = tandem_admin::enroll::enable(
            &target.client,
            &ad.endpoint,
            &ca,
            args.max_pending,
            args.request_ttl,
        )
        .await
        .context("setting up the enrollment credential")?;
        eprintln!(
            "peering requests without an invite: at most {} waiting, each for {}; see them with \
             `tandem requests`. The controller withdraws the credential while any binding gives \
             it more than filing requests (`tandem status` names it)",
            enrollment.max_pending,
            tandem_core::invite::human_duration(enrollment.request_ttl.as_secs() as i64)
        );
        ad.enroll = Some(enrollment.token);
    } else {
        // Advertised without it, no earlier credential may keep working.
        tandem_admin::enroll::disable(&target.client)
            .await
            .context("withdrawing the enrollment credential")?;
    }
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
    let Some(domain) = args.domain.as_deref().map(|d| d.trim_end_matches('.')) else {
        let request = set_setting(&target.client, ADVERTISE_KEY, Some(ad.txt().join("\n"))).await?;
        let state = mdns_state(&target.client, &request).await?;
        anyhow::ensure!(
            state.contains("announcing"),
            "the controller's mDNS {state}"
        );
        println!(
            "Cluster {} is announced over mDNS as {}._tandem._tcp.local by its controller, with \
             endpoint {}.",
            ad.cluster_id, ad.cluster_id, ad.endpoint
        );
        eprintln!(
            "consumers confirm this CA fingerprint with you before peering: {}",
            ad.ca_fingerprint
        );
        return Ok(());
    };
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

/// Sets (Some) or removes (None) `key` of the discovery settings ConfigMap, which the
/// controller watches, with a fresh request token; returns the token (see [`mdns_state`]).
pub async fn set_setting(
    client: &kube::Client,
    key: &str,
    value: Option<String>,
) -> anyhow::Result<String> {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, Patch, PatchParams};
    use tandem_controller::discovery::{REQUEST_KEY, SETTINGS};
    let api = Api::<ConfigMap>::namespaced(client.clone(), tandem_api::names::SYSTEM_NAMESPACE);
    // Unique, not secret: this process and the time.
    let request = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default()
    );
    // Each key has its own field manager, so setting one never takes the other away.
    let manager = format!("tandem-cli-{key}");
    let mut data = serde_json::json!({ REQUEST_KEY: request });
    if let Some(v) = &value {
        data[key] = serde_json::json!(v);
    }
    let object = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": SETTINGS, "namespace": tandem_api::names::SYSTEM_NAMESPACE,
                     "labels": {tandem_api::names::MANAGED_BY_LABEL: tandem_api::names::MANAGED_BY}},
        "data": data,
    });
    api.patch(
        SETTINGS,
        &PatchParams::apply(&manager).force(),
        &Patch::Apply(object),
    )
    .await
    .with_context(|| {
        format!(
            "writing {key} in ConfigMap {}/{SETTINGS} (is Tandem installed? `tandem install`)",
            tandem_api::names::SYSTEM_NAMESPACE
        )
    })?;
    Ok(request)
}

/// Waits (up to 15 s) until the controller has acted on the settings write that carried
/// `request` (see [`set_setting`]), and returns the state of its mDNS it reports then
/// (`failed: why` included); fails when the controller does not answer.
pub async fn mdns_state(client: &kube::Client, request: &str) -> anyhow::Result<String> {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::ResourceExt as _;
    use tandem_controller::discovery::{ACTED_ANNOTATION, SETTINGS, STATE_ANNOTATION};
    let api =
        kube::Api::<ConfigMap>::namespaced(client.clone(), tandem_api::names::SYSTEM_NAMESPACE);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let settings = api
            .get_opt(SETTINGS)
            .await
            .context("reading the discovery settings")?;
        let annotations = settings
            .map(|c| c.annotations().clone())
            .unwrap_or_default();
        let state = annotations.get(STATE_ANNOTATION);
        match (annotations.get(ACTED_ANNOTATION).map(String::as_str), state) {
            (Some(acted), Some(s)) if acted == request => return Ok(s.clone()),
            _ if std::time::Instant::now() > deadline => anyhow::bail!(
                "the controller has not acted on the discovery settings within 15 s (is it \
                 running? `tandem status`)"
            ),
            _ => tokio::time::sleep(std::time::Duration::from_millis(200)).await,
        }
    }
}
