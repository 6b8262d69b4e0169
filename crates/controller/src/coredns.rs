//! The `clusterset.local` stub domain in CoreDNS's Corefile (ConfigMap `kube-system/coredns`):
//! the controller keeps it there, so that installs by Helm or kustomize get it as `tandem
//! install` does, and so that it comes back when something rewrites the Corefile (k3s restores
//! its own on every restart, an addon manager may too). `tandem uninstall` removes it.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tandem_api::names;

use crate::context::Ctx;

/// How often the Corefile is checked (one GET; a PATCH only when the stub is missing).
pub const CHECK_EVERY: Duration = Duration::from_secs(5);

/// The Service (in tandem-system) in front of it, port 53.
pub const DNS_SERVICE: &str = "tandem-dns";
/// The markers around the stub domain Tandem keeps in CoreDNS's Corefile.
pub const STUB_BEGIN: &str = "# BEGIN tandem: clusterset.local (multi-cluster services)";
pub const STUB_END: &str = "# END tandem";

/// The Corefile server block that sends `clusterset.local` to `dns_ip`.
pub fn stub_domain_block(dns_ip: &str) -> String {
    format!(
        "{STUB_BEGIN}\n{}:53 {{\n    errors\n    cache 5\n    forward . {dns_ip}\n}}\n{STUB_END}\n",
        tandem_api::mcs::CLUSTERSET_DOMAIN
    )
}

/// `corefile` with Tandem's stub domain set to `dns_ip` (replacing an earlier one).
pub fn with_stub_domain(corefile: &str, dns_ip: &str) -> String {
    let mut out = without_stub_domain(corefile);
    if !out.ends_with("\n\n") && !out.is_empty() {
        out.push('\n');
    }
    out + &stub_domain_block(dns_ip)
}

/// `corefile` without Tandem's stub domain (what `tandem uninstall` leaves).
pub fn without_stub_domain(corefile: &str) -> String {
    let mut out = String::new();
    let mut skipping = false;
    let mut removed = false;
    for line in corefile.lines() {
        if line.trim() == STUB_BEGIN {
            skipping = true;
            removed = true;
        } else if skipping && line.trim() == STUB_END {
            skipping = false;
        } else if !skipping {
            out.push_str(line);
            out.push('\n');
        }
    }
    // The blank line `with_stub_domain` put before the block.
    while removed && out.ends_with("\n\n") {
        out.pop();
    }
    out
}

/// Rewrites CoreDNS's Corefile (`kube-system/coredns`) with `edit`: None when there is no such
/// ConfigMap (another cluster DNS), else whether the Corefile changed.
pub async fn edit_corefile(
    client: &Client,
    edit: impl FnOnce(&str) -> String,
) -> Result<Option<bool>, kube::Error> {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
    let Some(cm) = maps.get_opt("coredns").await? else {
        return Ok(None);
    };
    let corefile = cm
        .data
        .as_ref()
        .and_then(|d| d.get("Corefile"))
        .cloned()
        .unwrap_or_default();
    let updated = edit(&corefile);
    if updated == corefile {
        return Ok(Some(false));
    }
    maps.patch(
        "coredns",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"Corefile": updated}})),
    )
    .await?;
    Ok(Some(true))
}

/// The ClusterIP of the `tandem-dns` Service, where `clusterset.local` is answered; None while
/// it has none.
pub async fn dns_ip(client: &Client) -> Result<Option<String>, kube::Error> {
    let svc = Api::<Service>::namespaced(client.clone(), names::SYSTEM_NAMESPACE)
        .get_opt(DNS_SERVICE)
        .await?;
    Ok(svc
        .and_then(|s| s.spec?.cluster_ip)
        .filter(|ip| !ip.is_empty() && ip != "None"))
}

/// Keeps the stub domain in the Corefile for as long as the task runs.
pub async fn run(ctx: Ctx) {
    let mut tick = tokio::time::interval(CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match keep(&ctx.client).await {
            Ok(true) => tracing::info!(
                "added the {} stub domain to ConfigMap kube-system/coredns (absent or \
                 rewritten)",
                tandem_api::mcs::CLUSTERSET_DOMAIN
            ),
            Ok(false) => {}
            Err(e) => tracing::warn!("keeping the stub domain in kube-system/coredns: {e}"),
        }
    }
}

/// Puts the stub domain back if it is missing or stale; whether it changed the Corefile.
async fn keep(client: &Client) -> Result<bool, kube::Error> {
    let Some(ip) = dns_ip(client).await? else {
        return Ok(false);
    };
    Ok(
        edit_corefile(client, |corefile| with_stub_domain(corefile, &ip))
            .await?
            .unwrap_or(false),
    )
}
