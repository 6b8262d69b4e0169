//! `tandem cordon|uncordon|drain PROVIDER`: planned moves off a provider. Cordoning marks the
//! provider's virtual node unschedulable (pods already there keep running); draining cordons it,
//! then evicts its pods through the Eviction API — so PodDisruptionBudgets are honoured, as
//! `kubectl drain` honours them — and waits until they are gone, their controllers having
//! replaced them on other providers or local nodes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tandem_api::names;

use crate::flags::{ClusterArgs, duration};

/// How often a drain lists what is left and retries evictions a budget refused.
const DRAIN_POLL: Duration = Duration::from_secs(1);

/// Arguments of `tandem cordon` and `tandem uncordon`.
#[derive(clap::Args)]
pub struct CordonArgs {
    /// The provider's cluster ID (its virtual node is `tandem-<ID>`).
    provider: String,
}

/// Arguments of `tandem drain`.
#[derive(clap::Args)]
#[command(
    after_help = "What a drain does, in order:\n  1. cordons the provider's virtual node: no new pod is placed there;\n  2. evicts every pod on it through the Eviction API, retrying those a PodDisruptionBudget\n     holds back until their replacements are ready elsewhere;\n  3. waits until the pods are gone from the provider.\nDaemonSet pods are left alone (their DaemonSet keeps one per node). Pods no controller\nrecreates are refused unless --force: they would be gone for good.\nThe node stays cordoned afterwards: `tandem uncordon PROVIDER` lets pods land there again.\n\nExample:\n  tandem drain milan && <maintenance of milan> && tandem uncordon milan"
)]
pub struct DrainArgs {
    /// The provider's cluster ID (its virtual node is `tandem-<ID>`).
    provider: String,
    /// Also delete pods no controller manages (they are not recreated anywhere).
    #[arg(long)]
    force: bool,
    /// Seconds each pod is given to stop [default: the pod's own terminationGracePeriodSeconds].
    #[arg(long, value_name = "SECONDS")]
    grace_period: Option<u32>,
    /// How long to wait for the provider to be empty; the node stays cordoned if it is not.
    #[arg(long, default_value = "5m", value_parser = duration)]
    timeout: Duration,
}

/// The virtual node of `provider`, or an error saying there is none.
async fn virtual_node(client: &Client, provider: &str) -> anyhow::Result<Node> {
    let name = names::virtual_node_name(provider);
    let node = Api::<Node>::all(client.clone())
        .get_opt(&name)
        .await
        .with_context(|| format!("reading node {name}"))?;
    match node {
        Some(n)
            if n.labels().get(names::NODE_TYPE_LABEL).map(String::as_str)
                == Some(names::VIRTUAL_NODE_TYPE) =>
        {
            Ok(n)
        }
        Some(_) => bail!(
            "node {name} is not a Tandem virtual node; `tandem status` lists peered providers"
        ),
        None => bail!(
            "provider {provider} has no virtual node here (no node {name}); `tandem status` lists peered providers"
        ),
    }
}

/// Sets the virtual node's `spec.unschedulable`; whether it changed.
async fn set_unschedulable(client: &Client, node: &Node, cordon: bool) -> anyhow::Result<bool> {
    let was = node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    if was == cordon {
        return Ok(false);
    }
    // `null` removes the field, as `kubectl uncordon` leaves it.
    let value = if cordon { json!(true) } else { json!(null) };
    Api::<Node>::all(client.clone())
        .patch(
            &node.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": value}})),
        )
        .await
        .with_context(|| {
            format!(
                "{} node {}",
                if cordon { "cordoning" } else { "uncordoning" },
                node.name_any()
            )
        })?;
    Ok(true)
}

/// `tandem cordon` (`cordon`) or `tandem uncordon`.
pub async fn cordon(args: CordonArgs, cluster: &ClusterArgs, cordon: bool) -> anyhow::Result<()> {
    let client = cluster.client().await?;
    let node = virtual_node(&client, &args.provider).await?;
    let changed = set_unschedulable(&client, &node, cordon).await?;
    let name = node.name_any();
    println!(
        "{} {name} (provider {}){}",
        match (cordon, changed) {
            (true, true) => "cordoned",
            (true, false) => "already cordoned:",
            (false, true) => "uncordoned",
            (false, false) => "not cordoned:",
        },
        args.provider,
        if cordon {
            ": no new pod is placed there; pods there keep running"
        } else {
            ": new pods may be placed there again"
        }
    );
    Ok(())
}

/// `ns/name` of a pod.
fn key(pod: &Pod) -> String {
    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())
}

/// The kind of the pod's managing controller, if any.
fn controller_kind(pod: &Pod) -> Option<String> {
    pod.owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| o.kind.clone())
}

/// What a drain does with a pod it finds on the node.
#[derive(Debug, PartialEq, Eq)]
enum Disposition {
    /// Evicted (and waited for).
    Evict,
    /// Left alone: its DaemonSet runs one per node.
    DaemonSet,
    /// Nothing would recreate it: refused without `--force`.
    Unmanaged,
}

fn disposition(pod: &Pod) -> Disposition {
    match controller_kind(pod).as_deref() {
        Some("DaemonSet") => Disposition::DaemonSet,
        Some(_) => Disposition::Evict,
        // A terminal pod holds nothing: removing it loses nothing.
        None if matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        ) =>
        {
            Disposition::Evict
        }
        None => Disposition::Unmanaged,
    }
}

/// `tandem drain`.
pub async fn drain(args: DrainArgs, cluster: &ClusterArgs) -> anyhow::Result<()> {
    // kube's client retries a 429 by itself, with a growing backoff and in silence; the
    // drain retries evictions a budget refuses on its own schedule, and says so.
    let mut config = cluster.config().await?;
    config.default_retry = false;
    let client = Client::try_from(config).context("building a client")?;
    let node = virtual_node(&client, &args.provider).await?;
    let name = node.name_any();
    if set_unschedulable(&client, &node, true).await? {
        eprintln!("cordoned {name} (provider {})", args.provider);
    } else {
        eprintln!("{name} (provider {}) already cordoned", args.provider);
    }
    let pods_api: Api<Pod> = Api::all(client.clone());
    let on_node = ListParams::default().fields(&format!("spec.nodeName={name}"));
    let list = || {
        let pods_api = pods_api.clone();
        let on_node = on_node.clone();
        let name = name.clone();
        async move {
            pods_api
                .list(&on_node)
                .await
                .with_context(|| format!("draining {name}: listing the pods on it"))
        }
    };
    // Checked on every listing: a pod bound there after the drain began is no exception.
    let refuse_unmanaged = |pods: &[Pod]| -> anyhow::Result<()> {
        let unmanaged: Vec<String> = pods
            .iter()
            .filter(|p| {
                disposition(p) == Disposition::Unmanaged && p.metadata.deletion_timestamp.is_none()
            })
            .map(key)
            .collect();
        if !unmanaged.is_empty() && !args.force {
            bail!(
                "draining {name}: pod(s) {} are managed by no controller and would be gone for \
                 good; delete them yourself or drain with --force (the node stays cordoned)",
                unmanaged.join(", ")
            );
        }
        Ok(())
    };

    let first = list().await?;
    refuse_unmanaged(&first.items)?;
    let ignored: Vec<String> = first
        .items
        .iter()
        .filter(|p| disposition(p) == Disposition::DaemonSet)
        .map(key)
        .collect();
    if !ignored.is_empty() {
        eprintln!("leaving DaemonSet pod(s) alone: {}", ignored.join(", "));
    }

    let deadline = tokio::time::Instant::now() + args.timeout;
    // Pods (by UID) an eviction or deletion was accepted for, and what each waits on.
    let mut evicted: BTreeSet<String> = BTreeSet::new();
    let mut blocked: BTreeMap<String, String> = BTreeMap::new();
    // Every pod (by UID) the drain has had to move, for the progress line.
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut last_progress = String::new();
    loop {
        let pods: Vec<Pod> = list()
            .await?
            .items
            .into_iter()
            .filter(|p| disposition(p) != Disposition::DaemonSet)
            .collect();
        refuse_unmanaged(&pods)?;
        seen.extend(pods.iter().map(|p| p.uid().unwrap_or_default()));
        if pods.is_empty() {
            break;
        }
        for pod in &pods {
            let uid = pod.uid().unwrap_or_default();
            if evicted.contains(&uid) || pod.metadata.deletion_timestamp.is_some() {
                evicted.insert(uid);
                continue;
            }
            let ns_api: Api<Pod> =
                Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
            let delete = DeleteParams {
                grace_period_seconds: args.grace_period,
                preconditions: Some(kube::api::Preconditions {
                    uid: Some(uid.clone()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            let result = if disposition(pod) == Disposition::Unmanaged {
                // --force: no budget can cover a pod without a controller, as kubectl deletes it.
                ns_api.delete(&pod.name_any(), &delete).await.map(|_| ())
            } else {
                ns_api
                    .evict(
                        &pod.name_any(),
                        &EvictParams {
                            delete_options: Some(delete),
                            ..EvictParams::default()
                        },
                    )
                    .await
                    .map(|_| ())
            };
            match result {
                Ok(()) => {
                    eprintln!("evicted pod {}", key(pod));
                    blocked.remove(&uid);
                    evicted.insert(uid);
                }
                // Gone already, or replaced by a pod of the same name (its own turn comes).
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(kube::Error::Api(e)) if e.code == 429 => {
                    if blocked.get(&uid) != Some(&e.message) {
                        eprintln!("… waiting to evict pod {}: {}", key(pod), e.message);
                    }
                    blocked.insert(uid, e.message.clone());
                }
                Err(e) => {
                    return Err(anyhow::Error::new(e).context(format!(
                        "draining {name}: evicting pod {} (the node stays cordoned)",
                        key(pod)
                    )));
                }
            }
        }
        let left = pods.len();
        let progress = format!(
            "… {} of {} pod(s) evicted; {left} still on {name} ({} held by a disruption budget)",
            evicted.len(),
            seen.len(),
            pods.iter()
                .filter(|p| blocked.contains_key(&p.uid().unwrap_or_default()))
                .count(),
        );
        if progress != last_progress {
            eprintln!("{progress}");
            last_progress = progress;
        }
        if tokio::time::Instant::now() >= deadline {
            let names: Vec<String> = pods
                .iter()
                .map(|p| match blocked.get(&p.uid().unwrap_or_default()) {
                    Some(why) => format!("{} ({why})", key(p)),
                    None => format!("{} (terminating)", key(p)),
                })
                .collect();
            bail!(
                "draining {name}: timed out after {} with {left} pod(s) left: {} (the node stays cordoned; run drain again to go on)",
                humantime::format_duration(args.timeout),
                names.join(", ")
            );
        }
        tokio::time::sleep(DRAIN_POLL).await;
    }
    println!(
        "drained {name} (provider {}): {} pod(s) moved off it; it stays cordoned until `tandem uncordon {}`",
        args.provider,
        seen.len(),
        args.provider
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(owner: Option<&str>, phase: &str) -> Pod {
        let mut p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "status": {"phase": phase},
        }))
        .unwrap();
        if let Some(kind) = owner {
            p.metadata.owner_references = Some(vec![serde_json::from_value(json!({
                "apiVersion": "apps/v1", "kind": kind, "name": "o", "uid": "u", "controller": true,
            }))
            .unwrap()]);
        }
        p
    }

    #[test]
    fn daemonset_pods_stay_and_unmanaged_running_pods_need_force() {
        assert_eq!(
            disposition(&pod(Some("ReplicaSet"), "Running")),
            Disposition::Evict
        );
        assert_eq!(
            disposition(&pod(Some("StatefulSet"), "Pending")),
            Disposition::Evict
        );
        assert_eq!(
            disposition(&pod(Some("DaemonSet"), "Running")),
            Disposition::DaemonSet
        );
        assert_eq!(disposition(&pod(None, "Running")), Disposition::Unmanaged);
        assert_eq!(disposition(&pod(None, "Succeeded")), Disposition::Evict);
    }
}
