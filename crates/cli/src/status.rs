//! `tandem status`: this cluster's peerings in both roles, virtual nodes, offloaded namespaces,
//! pod counts and multi-cluster services, read from the local cluster only.

use std::collections::BTreeMap;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde::Serialize;
use tandem_api::mcs::{ServiceExport, ServiceImport, export_condition};
use tandem_api::{NamespaceOffloading, Peering, Tenant, names};

use crate::flags::{GlobalArgs, Output};
use crate::table;

/// Show this cluster's peerings (as consumer and as provider), virtual nodes, offloaded
/// namespaces and pod counts.
#[derive(clap::Args)]
#[command(after_help = "Example:\n  tandem status --context lab-1\n  tandem status -o yaml")]
pub struct Args {}

/// Everything `tandem status` reports.
#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    #[serde(rename = "clusterID")]
    pub cluster_id: String,
    /// Whether this cluster's network fabric runs, and why not.
    pub network_fabric: FabricStatus,
    /// Providers this cluster offloads to.
    pub providers: Vec<ProviderStatus>,
    /// Consumers this cluster provides for.
    pub consumers: Vec<ConsumerStatus>,
    pub offloaded_namespaces: Vec<OffloadedNamespace>,
    /// Services this cluster exports (ServiceExports).
    pub exported_services: Vec<ExportedServiceStatus>,
    /// Services imported here (ServiceImports), with the clusters they come from.
    pub imported_services: Vec<ImportedServiceStatus>,
    /// The enrollment credential (`tandem advertise`), when there is one.
    pub enrollment: Option<EnrollmentStatus>,
}

/// Whether the network fabric runs here.
#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct FabricStatus {
    pub on: bool,
    /// Why it is off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Says on stderr that the network fabric is off here, and why (what `peer` and `export` add
/// to their output: without it no traffic crosses the peering). Silent when it runs, or when
/// it cannot be read (the command has done its job either way).
pub async fn warn_if_fabric_off(client: &Client) {
    if let Ok(Some(why)) = tandem_controller::settings::fabric_off(client).await {
        eprintln!("warning: {why}");
    }
}

/// Whether the published enrollment credential works, as the controller judged its reach.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EnrollmentStatus {
    /// `Active` (files peering requests only), `Withdrawn` (a binding reaches further), or
    /// `Pending` (the controller has not judged it yet).
    pub state: String,
    pub message: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExportedServiceStatus {
    pub namespace: String,
    pub name: String,
    /// The Valid condition's status and reason.
    pub valid: String,
    /// The Conflict condition's reason when True (PortConflict, TypeConflict, …).
    pub conflict: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImportedServiceStatus {
    pub namespace: String,
    pub name: String,
    #[serde(rename = "type")]
    pub type_: String,
    pub ips: Vec<String>,
    pub clusters: Vec<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderStatus {
    #[serde(rename = "clusterID")]
    pub cluster_id: String,
    pub phase: String,
    pub conditions: BTreeMap<String, String>,
    pub virtual_node: Option<String>,
    pub virtual_node_ready: Option<bool>,
    /// Whether the virtual node is cordoned (`tandem cordon`, `tandem drain`).
    pub virtual_node_cordoned: bool,
    /// The reason of the virtual node's NetworkUnavailable condition (TunnelConnected,
    /// TunnelDown, …), when the Peering names its gateway.
    pub tunnel: Option<String>,
    /// The gateway's last report of the tunnel (RTT, bytes through it), when there is one.
    pub tunnel_rtt_ms: Option<f64>,
    pub tunnel_rx_bytes: Option<u64>,
    pub tunnel_tx_bytes: Option<u64>,
    pub granted: BTreeMap<String, String>,
    /// Pods on the virtual node; null where this user may not list pods.
    pub pods: Option<usize>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConsumerStatus {
    #[serde(rename = "clusterID")]
    pub cluster_id: String,
    pub tenant_namespace: String,
    pub granted: BTreeMap<String, String>,
    /// The consumer's pods here; null where neither pods nor the Tenant's status say.
    pub pods: Option<usize>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OffloadedNamespace {
    pub namespace: String,
    pub pod_offloading_strategy: String,
    pub phase: String,
    pub remote_namespaces: Vec<String>,
}

pub async fn run(_args: Args, global: &GlobalArgs) -> anyhow::Result<()> {
    let client = global.cluster.client().await?;
    let status = collect(&client).await?;
    match global.output.unwrap_or_default() {
        Output::Json => println!("{}", serde_json::to_string_pretty(&status)?),
        Output::Yaml => print!("{}", serde_saphyr::to_string(&status)?),
        Output::Table => print!("{}", table(&status)),
    }
    Ok(())
}

/// Reads the status from the local cluster.
pub async fn collect(client: &Client) -> anyhow::Result<Status> {
    let cluster_id = cluster_id(client).await?;
    let off = tandem_controller::settings::fabric_off(client)
        .await
        .context("reading whether the network fabric runs")?;
    let mut status = Status {
        cluster_id,
        network_fabric: FabricStatus {
            on: off.is_none(),
            reason: off.map(str::to_string),
        },
        ..Default::default()
    };
    let pods: Api<Pod> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    // How many pods match `lp`; None where this user may not list pods (`tandem-viewer`).
    let count = |lp: ListParams| {
        let pods = pods.clone();
        async move {
            match pods.list_metadata(&lp).await {
                Ok(list) => Ok(Some(list.items.len())),
                Err(e) if tandem_api::client::status_code(&e) == Some(403) => Ok(None),
                Err(e) => Err(anyhow::Error::new(e).context("counting pods")),
            }
        }
    };

    let peerings: Api<Peering> = Api::all(client.clone());
    for p in peerings
        .list(&ListParams::default())
        .await
        .context("listing Peerings")?
    {
        let st = p.status.clone().unwrap_or_default();
        let vn = st.virtual_node.clone();
        let (node, on_node) = match &vn {
            Some(vn) => {
                let node = nodes.get_opt(vn).await?;
                let lp = ListParams::default().fields(&format!("spec.nodeName={vn}"));
                (node, count(lp).await?)
            }
            None => (None, Some(0)),
        };
        let report: Option<serde_json::Value> = node
            .as_ref()
            .and_then(|n| n.annotations().get(names::TUNNEL_ANNOTATION))
            .and_then(|a| serde_json::from_str(a).ok());
        status.providers.push(ProviderStatus {
            cluster_id: p.spec.cluster_id.clone(),
            phase: st.phase.clone().unwrap_or_else(|| "Pending".into()),
            conditions: st
                .conditions
                .iter()
                .map(|c| (c.type_.clone(), c.status.clone()))
                .collect(),
            virtual_node: vn,
            virtual_node_ready: node.as_ref().map(node_ready),
            virtual_node_cordoned: node
                .as_ref()
                .and_then(|n| n.spec.as_ref()?.unschedulable)
                .unwrap_or(false),
            tunnel: node.as_ref().and_then(tunnel),
            tunnel_rtt_ms: report.as_ref().and_then(|r| r["rttMs"].as_f64()),
            tunnel_rx_bytes: report.as_ref().and_then(|r| r["rxBytes"].as_u64()),
            tunnel_tx_bytes: report.as_ref().and_then(|r| r["txBytes"].as_u64()),
            granted: st
                .granted
                .iter()
                .map(|(k, v)| (k.clone(), v.0.clone()))
                .collect(),
            pods: on_node,
        });
    }

    let tenants: Api<Tenant> = Api::all(client.clone());
    for t in tenants
        .list(&ListParams::default())
        .await
        .context("listing Tenants")?
    {
        let lp = ListParams::default().labels(&format!(
            "{}={}",
            names::ORIGIN_CLUSTER_LABEL,
            t.spec.cluster_id
        ));
        status.consumers.push(ConsumerStatus {
            cluster_id: t.spec.cluster_id.clone(),
            tenant_namespace: t.namespace().unwrap_or_default(),
            granted: t
                .spec
                .grant
                .iter()
                .map(|(k, v)| (k.clone(), v.0.clone()))
                .collect(),
            // Where pods cannot be listed, the Tenant's count of the consumer's running pods.
            pods: match count(lp).await? {
                Some(n) => Some(n),
                None => t
                    .status
                    .as_ref()
                    .and_then(|s| s.used.get("pods"))
                    .and_then(|q| tandem_core::shadow::parse_quantity(&q.0))
                    .map(|milli| (milli / 1000) as usize),
            },
        });
    }

    let offloadings: Api<NamespaceOffloading> = Api::all(client.clone());
    for o in offloadings
        .list(&ListParams::default())
        .await
        .context("listing NamespaceOffloadings")?
    {
        let st = o.status.clone().unwrap_or_default();
        status.offloaded_namespaces.push(OffloadedNamespace {
            namespace: o.namespace().unwrap_or_default(),
            pod_offloading_strategy: format!("{:?}", o.spec.pod_offloading_strategy),
            phase: st.phase.unwrap_or_else(|| "Pending".into()),
            remote_namespaces: st
                .remote_namespaces
                .iter()
                .map(|r| format!("{}/{} ({})", r.cluster_id, r.namespace, r.phase))
                .collect(),
        });
    }

    // Multi-cluster services (absent CRDs — an older install — read as none).
    let exports: Api<ServiceExport> = Api::all(client.clone());
    for e in tandem_api::client::ok_if_not_found(exports.list(&ListParams::default()).await)
        .context("listing ServiceExports")?
        .map(|l| l.items)
        .unwrap_or_default()
    {
        let conds = e.status.clone().unwrap_or_default().conditions;
        let find = |t: &str| conds.iter().find(|c| c.type_ == t);
        status.exported_services.push(ExportedServiceStatus {
            namespace: e.namespace().unwrap_or_default(),
            name: e.name_any(),
            valid: find(export_condition::VALID)
                .map(|c| format!("{} ({})", c.status, c.reason))
                .unwrap_or_else(|| "Unknown".into()),
            conflict: find(export_condition::CONFLICT)
                .filter(|c| c.status == "True")
                .map(|c| c.reason.clone()),
        });
    }
    let imports: Api<ServiceImport> = Api::all(client.clone());
    for i in tandem_api::client::ok_if_not_found(imports.list(&ListParams::default()).await)
        .context("listing ServiceImports")?
        .map(|l| l.items)
        .unwrap_or_default()
    {
        status.imported_services.push(ImportedServiceStatus {
            namespace: i.namespace().unwrap_or_default(),
            name: i.name_any(),
            type_: i.spec.type_.clone(),
            ips: i.spec.ips.clone(),
            clusters: i
                .status
                .clone()
                .unwrap_or_default()
                .clusters
                .into_iter()
                .map(|c| c.cluster)
                .collect(),
        });
    }
    let credential = match tandem_admin::enroll::token_secret(client).await {
        Err(e) if forbidden(&e) => Err(()),
        read => Ok(read.context("reading the enrollment credential")?),
    };
    status.enrollment = match credential {
        Err(()) => Some(EnrollmentStatus {
            state: "Unknown".into(),
            message: "this user may not read Secrets, where the credential is kept".into(),
        }),
        Ok(secret) => secret.map(|secret| match tandem_admin::enroll::condition_of(&secret) {
            Some(c) if c.status == "True" => EnrollmentStatus {
                state: "Active".into(),
                message: c.message,
            },
            Some(c) => EnrollmentStatus {
                state: "Withdrawn".into(),
                message: c.message,
            },
            None => EnrollmentStatus {
                state: "Pending".into(),
                message: "the controller has not judged the credential's reach yet".into(),
            },
        }),
    };
    Ok(status)
}

/// This cluster's ID: the ClusterProperty the controller publishes (readable by
/// `tandem-viewer`), else the identity Secret (an install whose controller has not run yet).
async fn cluster_id(client: &Client) -> anyhow::Result<String> {
    let properties: Api<tandem_api::mcs::ClusterProperty> = Api::all(client.clone());
    let property = tandem_api::client::ok_if_not_found(
        properties.get(tandem_api::mcs::CLUSTER_ID_PROPERTY).await,
    );
    match property {
        Ok(Some(p)) if !p.spec.value.is_empty() => return Ok(p.spec.value),
        Err(e) if tandem_api::client::status_code(&e) != Some(403) => {
            return Err(anyhow::Error::new(e).context(format!(
                "reading ClusterProperty {}",
                tandem_api::mcs::CLUSTER_ID_PROPERTY
            )));
        }
        _ => {}
    }
    let identity = tandem_controller::identity::ClusterIdentity::load(client)
        .await
        .context("reading the cluster identity")?;
    Ok(identity.cluster_id)
}

/// Whether `e` comes of the API server's 403 Forbidden.
fn forbidden(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(k) = e.downcast_ref::<kube::Error>()
            && tandem_api::client::status_code(k) == Some(403)
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// Whether the node's Ready condition is True.
pub fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A byte count as people read it (binary units, one decimal).
fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n}B")
    } else {
        format!("{v:.1}{}", UNITS[unit])
    }
}

/// The reason of the node's NetworkUnavailable condition.
fn tunnel(node: &Node) -> Option<String> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "NetworkUnavailable")
        .map(|c| c.reason.clone().unwrap_or_else(|| c.status.clone()))
}

fn table(s: &Status) -> String {
    let mut out = format!("Cluster {}\n", s.cluster_id);
    match &s.network_fabric.reason {
        None => out.push_str("Network fabric: on\n"),
        Some(why) => out.push_str(&format!("Network fabric: OFF — {why}\n")),
    }
    let res = |g: &BTreeMap<String, String>| {
        ["cpu", "memory", "pods"]
            .iter()
            .map(|k| format!("{k}={}", g.get(*k).map(String::as_str).unwrap_or("-")))
            .collect::<Vec<_>>()
            .join(",")
    };
    out.push_str("\nPROVIDERS (this cluster offloads to)\n");
    if s.providers.is_empty() {
        out.push_str("  none — peer with `tandem peer INVITE`\n");
    } else {
        let mut t = table::new([
            "CLUSTER",
            "PHASE",
            "VIRTUAL NODE",
            "READY",
            "TUNNEL",
            "RTT",
            "RX/TX",
            "GRANTED",
            "PODS",
            "NOT TRUE",
        ]);
        for p in &s.providers {
            let not_true: Vec<&str> = p
                .conditions
                .iter()
                .filter(|(_, v)| v.as_str() != "True")
                .map(|(k, _)| k.as_str())
                .collect();
            t.add_row([
                p.cluster_id.clone(),
                p.phase.clone(),
                p.virtual_node.clone().unwrap_or_else(|| "-".into()),
                // As `kubectl get nodes` shows a cordoned node.
                match (p.virtual_node_ready, p.virtual_node_cordoned) {
                    (Some(true), false) => "True",
                    (Some(true), true) => "True,SchedulingDisabled",
                    (Some(false), false) => "False",
                    (Some(false), true) => "False,SchedulingDisabled",
                    (None, _) => "-",
                }
                .to_string(),
                p.tunnel.clone().unwrap_or_else(|| "-".into()),
                p.tunnel_rtt_ms
                    .map(|ms| format!("{ms:.1}ms"))
                    .unwrap_or_else(|| "-".into()),
                match (p.tunnel_rx_bytes, p.tunnel_tx_bytes) {
                    (Some(rx), Some(tx)) => format!("{}/{}", bytes(rx), bytes(tx)),
                    _ => "-".into(),
                },
                res(&p.granted),
                p.pods.map_or("-".into(), |n| n.to_string()),
                if not_true.is_empty() {
                    "-".to_string()
                } else {
                    not_true.join(",")
                },
            ]);
        }
        out.push_str(&table::render(t, 2));
    }
    out.push_str("\nCONSUMERS (this cluster provides for)\n");
    if s.consumers.is_empty() {
        out.push_str("  none — hand out an invite with `tandem invite`\n");
    } else {
        let mut t = table::new(["CLUSTER", "TENANT NAMESPACE", "GRANTED", "PODS"]);
        for c in &s.consumers {
            t.add_row([
                c.cluster_id.clone(),
                c.tenant_namespace.clone(),
                res(&c.granted),
                c.pods.map_or("-".into(), |n| n.to_string()),
            ]);
        }
        out.push_str(&table::render(t, 2));
    }
    if let Some(e) = &s.enrollment {
        out.push_str("\nENROLLMENT (peering requests without an invite)\n");
        out.push_str(&format!("  {}: {}\n", e.state, e.message));
    }
    out.push_str("\nOFFLOADED NAMESPACES\n");
    if s.offloaded_namespaces.is_empty() {
        out.push_str("  none — offload one with `tandem offload namespace NS`\n");
    } else {
        let mut t = table::new(["NAMESPACE", "STRATEGY", "PHASE", "REMOTE"]);
        for o in &s.offloaded_namespaces {
            t.add_row([
                o.namespace.clone(),
                o.pod_offloading_strategy.clone(),
                o.phase.clone(),
                o.remote_namespaces.join(", "),
            ]);
        }
        out.push_str(&table::render(t, 2));
    }
    out.push_str("\nEXPORTED SERVICES\n");
    if s.exported_services.is_empty() {
        out.push_str("  none — export one with `tandem export service NS/NAME`\n");
    } else {
        let mut t = table::new(["NAMESPACE", "SERVICE", "VALID", "CONFLICT"]);
        for e in &s.exported_services {
            t.add_row([
                e.namespace.clone(),
                e.name.clone(),
                e.valid.clone(),
                e.conflict.clone().unwrap_or_else(|| "-".into()),
            ]);
        }
        out.push_str(&table::render(t, 2));
    }
    out.push_str("\nIMPORTED SERVICES\n");
    if s.imported_services.is_empty() {
        out.push_str("  none\n");
    } else {
        let mut t = table::new(["NAMESPACE", "SERVICE", "TYPE", "IP", "CLUSTERS"]);
        for i in &s.imported_services {
            t.add_row([
                i.namespace.clone(),
                i.name.clone(),
                i.type_.clone(),
                if i.ips.is_empty() {
                    "-".into()
                } else {
                    i.ips.join(",")
                },
                i.clusters.join(","),
            ]);
        }
        out.push_str(&table::render(t, 2));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn byte_counts_read_as_people_read_them() {
        assert_eq!(super::bytes(0), "0B");
        assert_eq!(super::bytes(1023), "1023B");
        assert_eq!(super::bytes(1536), "1.5KiB");
        assert_eq!(super::bytes(5 * 1024 * 1024 * 1024), "5.0GiB");
    }
}
