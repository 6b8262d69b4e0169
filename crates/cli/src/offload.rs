//! `tandem offload namespace NS` and `tandem unoffload namespace NS`: create (or update) the
//! namespace's NamespaceOffloading and wait until its twin namespaces are Ready, or delete it
//! and wait until they are gone.

use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};
use tandem_api::{NamespaceOffloading, client, conditions, names};

use crate::flags::{GlobalArgs, duration};

/// Arguments of `tandem offload`.
#[derive(clap::Args)]
pub struct OffloadArgs {
    #[command(subcommand)]
    command: OffloadCommand,
}

#[derive(clap::Subcommand)]
enum OffloadCommand {
    /// Offload a namespace: twin namespaces on the selected providers, pods placed per strategy.
    #[command(
        after_help = "Examples:\n  tandem offload namespace shop\n  tandem offload namespace shop --pod-offloading-strategy Remote --selector region=eu\n  tandem offload namespace shop --remote-namespace-name shop-eu\n  tandem offload namespace shop --evict-after 30s   replace pods of a lost provider after 30 s\n\nSelector keys `region` and `zone` stand for topology.kubernetes.io/region and /zone;\nthe virtual node of each provider carries tandem.dev/remote-cluster-id=<provider ID>.\n\nStatefulSets: their pods keep their names on providers, but their stable DNS names\n(<pod>.<service>.<namespace>.svc) resolve there only if the twin namespace has the same name\n(--namespace-mapping-strategy EnforceSameName, which each provider's admin allows per\nconsumer: Tenant spec.allowedNamespaceMappingStrategies). With another mapping, offload warns when the\nnamespace has StatefulSets.\n\nVolumes: PersistentVolumeClaims of StorageClass `tandem` are provisioned on the provider\nwhere their first pod is scheduled, and later pods using them are kept there."
    )]
    Namespace(OffloadNamespace),
}

#[derive(clap::Args)]
struct OffloadNamespace {
    /// The namespace to offload [default: -n/--namespace].
    namespace: Option<String>,
    /// Where the namespace's pods may run.
    #[arg(long, value_parser = ["Remote", "Local", "LocalAndRemote"])]
    pod_offloading_strategy: Option<String>,
    /// How twin namespaces are named [default: DefaultName, i.e. <namespace>-<cluster ID>;
    /// SelectedName when --remote-namespace-name is given].
    #[arg(long, value_parser = ["DefaultName", "EnforceSameName", "SelectedName"])]
    namespace_mapping_strategy: Option<String>,
    /// The twin namespaces' name (SelectedName).
    #[arg(long, value_name = "NAME")]
    remote_namespace_name: Option<String>,
    /// Only providers whose virtual node has these labels: key=value,...
    #[arg(long, value_name = "KEY=VALUE,...")]
    selector: Option<String>,
    /// How long the namespace's pods stay on a node that failed (its provider lost) before
    /// they are evicted and replaced elsewhere [default: Kubernetes' 300s]. Set on pods as
    /// they are created; pods already running keep theirs.
    #[arg(long, value_name = "DURATION", value_parser = whole_seconds)]
    evict_after: Option<String>,
    /// What happens to the namespace's pods on a provider this cluster loses. Keep: they run
    /// on there (their replacements here may run at the same time). Fence: the provider
    /// stops them once it has not heard from this cluster for --fence-after, and only then
    /// are they replaced here — never two copies of a pod at once (StatefulSets, singletons).
    /// Set on pods as they are created [default: Keep].
    #[arg(long, value_name = "POLICY", value_parser = ["Keep", "Fence"])]
    partition_policy: Option<String>,
    /// With --partition-policy Fence: how long the provider keeps the pods running without
    /// word from this cluster [default: 30s]. Their replacements start about 1 % + 5 s later.
    /// Keep it well above twice the providers' probe period (2 s by default) and above a
    /// controller's restart time: a provider controller down for longer fences the pods.
    #[arg(long, value_name = "DURATION", value_parser = whole_seconds)]
    fence_after: Option<String>,
    /// How long to wait for the twin namespaces.
    #[arg(long, default_value = "60s", value_parser = duration)]
    timeout: Duration,
}

/// Arguments of `tandem unoffload`.
#[derive(clap::Args)]
pub struct UnoffloadArgs {
    #[command(subcommand)]
    command: UnoffloadCommand,
}

#[derive(clap::Subcommand)]
enum UnoffloadCommand {
    /// Stop offloading a namespace and remove its twin namespaces.
    ///
    /// A twin namespace holding PersistentVolumeClaims (volumes of the `tandem` StorageClass)
    /// is retained on its provider, its pods stopped, and each claim is listed; deleting the
    /// claim here later deletes the copy there.
    Namespace {
        /// The offloaded namespace [default: -n/--namespace].
        namespace: Option<String>,
        /// Also delete the providers' PersistentVolumeClaims of the namespace, and their data.
        #[arg(long)]
        delete_data: bool,
        /// How long to wait for the twin namespaces to go.
        #[arg(long, default_value = "60s", value_parser = duration)]
        timeout: Duration,
    },
}

/// `key=value,...` as one node selector term (keys `region` and `zone` are the topology labels).
fn selector_terms(selector: &str) -> anyhow::Result<Value> {
    let mut expressions = Vec::new();
    for pair in selector.split(',').filter(|p| !p.trim().is_empty()) {
        let Some((key, value)) = pair.split_once('=') else {
            bail!("--selector: {pair:?} is not key=value");
        };
        let key = match key.trim() {
            "region" | "zone" => format!("topology.kubernetes.io/{}", key.trim()),
            k => k.to_string(),
        };
        expressions.push(json!({"key": key, "operator": "In", "values": [value.trim()]}));
    }
    Ok(json!({"nodeSelectorTerms": [{"matchExpressions": expressions}]}))
}

/// A duration flag as the NamespaceOffloading stores it: whole seconds (`90s`), rounded up;
/// zero is allowed (evict at once).
fn whole_seconds(s: &str) -> Result<String, humantime::DurationError> {
    let d = humantime::parse_duration(s)?;
    Ok(format!("{}s", tandem_core::fence::whole_seconds(d)))
}

/// Runs `tandem offload …`.
pub async fn offload(args: OffloadArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let OffloadCommand::Namespace(a) = args.command;
    let ns = &global.namespace_or(a.namespace.clone())?;
    let mapping = match (&a.namespace_mapping_strategy, &a.remote_namespace_name) {
        (Some(m), _) => m.clone(),
        (None, Some(_)) => "SelectedName".to_string(),
        (None, None) => "DefaultName".to_string(),
    };
    if mapping == "SelectedName" && a.remote_namespace_name.is_none() {
        bail!("--namespace-mapping-strategy SelectedName needs --remote-namespace-name");
    }
    let mut spec = json!({"namespaceMappingStrategy": mapping});
    if let Some(s) = &a.pod_offloading_strategy {
        spec["podOffloadingStrategy"] = json!(s);
    }
    if let Some(n) = &a.remote_namespace_name {
        spec["remoteNamespaceName"] = json!(n);
    }
    if let Some(s) = &a.selector {
        spec["clusterSelector"] = selector_terms(s)?;
    }
    if let Some(d) = &a.evict_after {
        spec["evictAfter"] = json!(d);
    }
    if a.fence_after.is_some() && a.partition_policy.as_deref() != Some("Fence") {
        bail!("--fence-after needs --partition-policy Fence");
    }
    if let Some(p) = &a.partition_policy {
        spec["partitionPolicy"] = json!(p);
    }
    if let Some(d) = &a.fence_after {
        spec["fenceAfter"] = json!(d);
    }
    let client = global.cluster.client().await?;
    Api::<Namespace>::all(client.clone())
        .get_opt(ns)
        .await
        .with_context(|| format!("reading namespace {ns}"))?
        .with_context(|| {
            format!(
                "namespace {ns} does not exist (create it first: kubectl create namespace {ns})"
            )
        })?;
    if mapping != "EnforceSameName"
        && let Some(line) = stateful_set_warning(&client, ns, &mapping).await
    {
        eprintln!("{line}");
    }
    let api: Api<NamespaceOffloading> = Api::namespaced(client.clone(), ns);
    let applied = api
        .patch(
            names::OFFLOADING_NAME,
            &PatchParams::apply("tandem-cli").force(),
            &Patch::Apply(json!({
                "apiVersion": "tandem.dev/v1alpha1", "kind": "NamespaceOffloading",
                "metadata": {"name": names::OFFLOADING_NAME},
                "spec": spec,
            })),
        )
        .await
        .with_context(|| {
            format!(
                "writing NamespaceOffloading {ns}/{} (is Tandem installed? run `tandem install`)",
                names::OFFLOADING_NAME
            )
        })?;
    let generation = applied.metadata.generation;
    eprintln!(
        "NamespaceOffloading {ns}/{} applied",
        names::OFFLOADING_NAME
    );
    let deadline = tokio::time::Instant::now() + a.timeout;
    let mut last = String::new();
    loop {
        let o = api
            .get(names::OFFLOADING_NAME)
            .await
            .with_context(|| format!("reading NamespaceOffloading {ns}/offloading"))?;
        let status = o.status.clone().unwrap_or_default();
        let ready = conditions::find(&status.conditions, conditions::READY);
        let current = ready.is_some_and(|c| c.observed_generation >= generation);
        let phase = status.phase.clone().unwrap_or_else(|| "Pending".into());
        let message = ready.map(|c| c.message.clone()).unwrap_or_default();
        if current && phase == "Ready" {
            if status.remote_namespaces.is_empty() {
                println!(
                    "namespace {ns} offloaded to no provider (none linked or selected; pods stay local)"
                );
            }
            for r in &status.remote_namespaces {
                println!(
                    "namespace {ns} offloaded to {}: twin namespace {}",
                    r.cluster_id, r.namespace
                );
            }
            return Ok(());
        }
        if current && phase == "Failed" {
            bail!("offloading namespace {ns}: {message}");
        }
        let line = format!("{phase}: {message}");
        if line != last {
            eprintln!("waiting for twin namespaces: {line}");
            last = line;
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "offloading namespace {ns}: twin namespaces not Ready after {:?} ({last}); check `kubectl -n {ns} get namespaceoffloading offloading -o yaml` and the providers' peerings",
                a.timeout
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The warning for a namespace with StatefulSets offloaded with a `mapping` that renames it on
/// providers: `db-0.db.<ns>.svc` names `<ns>`, so in a twin namespace of another name the
/// stable names of the pods running there do not resolve. None when it has none (or they
/// cannot be listed: the warning is advice, not a precondition).
async fn stateful_set_warning(client: &kube::Client, ns: &str, mapping: &str) -> Option<String> {
    let sets = Api::<StatefulSet>::namespaced(client.clone(), ns)
        .list(&kube::api::ListParams::default())
        .await
        .ok()?;
    let names: Vec<String> = sets.items.iter().map(kube::ResourceExt::name_any).collect();
    (!names.is_empty()).then(|| {
        format!(
            "warning: namespace {ns} has StatefulSets ({}): with {mapping} their pods' stable DNS names (<pod>.<service>.{ns}.svc) do not resolve on providers; use --namespace-mapping-strategy EnforceSameName (each provider's admin must allow it for this cluster: Tenant spec.allowedNamespaceMappingStrategies)",
            names.join(", ")
        )
    })
}

/// Runs `tandem unoffload …`.
pub async fn unoffload(args: UnoffloadArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let UnoffloadCommand::Namespace {
        namespace,
        delete_data,
        timeout,
    } = args.command;
    let ns = global.namespace_or(namespace)?;
    let client = global.cluster.client().await?;
    let api: Api<NamespaceOffloading> = Api::namespaced(client.clone(), &ns);
    let mut retained = Vec::new();
    if delete_data {
        client::ok_if_not_found(
            api.patch(
                names::OFFLOADING_NAME,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {
                    names::DELETE_DATA_ANNOTATION: "true"}}})),
            )
            .await,
        )
        .with_context(|| format!("marking NamespaceOffloading {ns}/offloading --delete-data"))?;
    } else {
        let volumes = tandem_controller::consumer::storage::remote_volumes(&client)
            .await
            .context("listing PersistentVolumes")?;
        for (provider, claims) in volumes {
            for (claim, twin) in claims {
                if claim.split('/').next() == Some(ns.as_str()) {
                    retained.push(format!(
                        "retained: PersistentVolumeClaim {claim} on {provider} in namespace {twin}"
                    ));
                }
            }
        }
    }
    match api
        .delete(names::OFFLOADING_NAME, &DeleteParams::default())
        .await
    {
        Ok(_) => {}
        Err(e) if tandem_api::client::is_not_found(&e) => bail!("namespace {ns} is not offloaded"),
        Err(e) => {
            return Err(e).with_context(|| format!("deleting NamespaceOffloading {ns}/offloading"));
        }
    }
    eprintln!("NamespaceOffloading {ns}/offloading deleted; removing twin namespaces");
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let Some(o) = api
            .get_opt(names::OFFLOADING_NAME)
            .await
            .with_context(|| format!("reading NamespaceOffloading {ns}/offloading"))?
        else {
            if retained.is_empty() {
                println!("namespace {ns} is no longer offloaded; its twin namespaces are gone");
            } else {
                println!(
                    "namespace {ns} is no longer offloaded; twin namespaces holding claims are retained"
                );
                for line in &retained {
                    println!("{line}");
                }
                println!(
                    "(delete a claim here to delete its copy, or unoffload with --delete-data)"
                );
            }
            return Ok(());
        };
        if tokio::time::Instant::now() > deadline {
            let left: Vec<String> = o
                .status
                .unwrap_or_default()
                .remote_namespaces
                .iter()
                .map(|r| format!("{}/{}", r.cluster_id, r.namespace))
                .collect();
            bail!(
                "unoffloading namespace {ns}: twin namespaces still present after {timeout:?} ({}); is the Tandem controller running?",
                left.join(", ")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_become_one_node_selector_term() {
        assert_eq!(
            selector_terms("region=eu,tier = gold").unwrap(),
            json!({"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "topology.kubernetes.io/region", "operator": "In", "values": ["eu"]},
                {"key": "tier", "operator": "In", "values": ["gold"]},
            ]}]})
        );
        assert!(selector_terms("region").is_err());
    }
}
