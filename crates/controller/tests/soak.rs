//! Chaos soak: a consumer (`hub`) offloading to two providers (`east`, `west`), one namespace
//! under each partition policy — `ledger` (Fence, fenceAfter 3s: a 2-replica StatefulSet and a
//! Deployment) and `cache` (Keep: a Deployment) — while a schedule of faults runs: provider
//! API partitions, controller SIGKILLs (the consumer's in the middle of a partition, a
//! provider's for longer than the fence bound), and API server restarts on both sides; a writer keeps creating ConfigMaps in `ledger` throughout.
//!
//! Invariants, checked after every fault and after convergence:
//! - no StatefulSet ordinal of `ledger` ever ran in two clusters at once (the kubelets' record);
//! - every write the API server acknowledged is kept, and reflected to both providers;
//! - after convergence every pod is Ready, and no object is orphaned: each ShadowPod stands
//!   for a consumer pod bound to its provider's virtual node (same UID), each real pod has its
//!   ShadowPod, nothing stays Fenced, and no Tenant says Fenced.
//!
//! One round of faults runs in CI (about 2.5 minutes); `TANDEM_SOAK_ROUNDS=N cargo test -p
//! tandem-controller --test integration soak::` runs N rounds (the longer run: `benches/README.md`). Gateway
//! restarts need network-mode clusters and are not part of this soak.

use crate::support;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::{Cluster, until};
use tandem_api::{ShadowPod, Tenant, names};
use tandem_testing::until_every;

const LEDGER: &str = "ledger";
const CACHE: &str = "cache";
const ORDINALS: [&str; 2] = ["db-0", "db-1"];

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

async fn pods(client: &kube::Client, ns: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

/// One line on a consumer pod, for timeout messages.
fn describe(p: &Pod) -> String {
    format!(
        "{}/{}: uid {:?} node {:?} phase {:?} ready {} deleting {}",
        p.namespace().unwrap_or_default(),
        p.name_any(),
        p.uid(),
        p.spec.as_ref().and_then(|s| s.node_name.clone()),
        p.status.as_ref().and_then(|s| s.phase.clone()),
        ready(p),
        p.metadata.deletion_timestamp.is_some()
    )
}

/// One line per ShadowPod in `provider`'s twin of `ns`, for timeout messages.
async fn shadow_pods_state(provider: &Cluster, ns: &str) -> Vec<String> {
    Api::<ShadowPod>::namespaced(provider.client.clone(), &twin(ns))
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .iter()
        .map(|sp| {
            format!(
                "ShadowPod {}/{}: deleting {} finalizers {:?} status {:?}",
                provider.id,
                sp.name_any(),
                sp.metadata.deletion_timestamp.is_some(),
                sp.metadata.finalizers,
                sp.status
            )
        })
        .collect()
}

/// Waits up to `timeout` for every pod of both namespaces (4 in `ledger`, 3 in `cache`) to be
/// Ready and not deleting. On timeout it names what it saw last: each consumer pod, and the
/// ShadowPods on both providers (listed only while the pods are not all Ready, every 500 ms, to
/// keep the wait's own load off the clusters it waits for).
async fn every_pod_ready(hub: &Cluster, providers: &[Cluster], what: &str, timeout: Duration) {
    let seen = Arc::new(Mutex::new(String::new()));
    let every = Duration::from_millis(500);
    let waiting = until_every(what, timeout + Duration::from_secs(10), every, || async {
        let ledger = pods(&hub.client, LEDGER).await;
        let cache = pods(&hub.client, CACHE).await;
        let all_ready = ledger.len() == 4
            && cache.len() == 3
            && ledger
                .iter()
                .chain(&cache)
                .all(|p| ready(p) && p.metadata.deletion_timestamp.is_none());
        if all_ready {
            return Some(());
        }
        let mut state: Vec<String> = ledger.iter().chain(&cache).map(describe).collect();
        for p in providers {
            for ns in [LEDGER, CACHE] {
                state.extend(shadow_pods_state(p, ns).await);
            }
        }
        *seen.lock().unwrap() = state.join("\n");
        None
    });
    if tokio::time::timeout(timeout, waiting).await.is_err() {
        panic!(
            "timed out after {timeout:?} waiting for {what}; last seen:\n{}",
            seen.lock().unwrap()
        );
    }
}

/// The faults of one round, in order.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// A provider's API unreachable from the consumer for 15 s.
    Partition(usize),
    /// The consumer's controller SIGKILLed, started again 3 s later.
    KillConsumerController,
    /// A provider partitioned, and the consumer's controller SIGKILLed 2 s into it.
    PartitionAndKillConsumer(usize),
    /// A provider's controller SIGKILLed, started again 12 s later: its fence is down longer
    /// than the consumer's bound (fenceAfter + margin), while its API answers.
    KillProviderController(usize),
    /// The consumer's API server restarted.
    RestartConsumerApi,
    /// A provider's API server restarted.
    RestartProviderApi(usize),
}

const ROUND: [Fault; 6] = [
    Fault::Partition(0),
    Fault::KillConsumerController,
    Fault::PartitionAndKillConsumer(1),
    Fault::KillProviderController(0),
    Fault::RestartConsumerApi,
    Fault::RestartProviderApi(1),
];

/// The twin namespace of `ns` (DefaultName mapping) on either provider.
fn twin(ns: &str) -> String {
    format!("{ns}-hub")
}

fn no_ordinal_ran_twice(after: &str) {
    for ordinal in ORDINALS {
        let overlaps = tandem_lab::runs::overlaps_across_clusters(ordinal);
        assert!(
            overlaps.is_empty(),
            "{ordinal} ran in two clusters at once (after {after}): {overlaps:#?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_under_faults_keeps_every_invariant() {
    let rounds: usize = std::env::var("TANDEM_SOAK_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(1);
    // Partitions and restarts make every client warn on every retry: only errors of Tandem's
    // own are logged, so that a failure's message is not buried.
    support::init_tracing_at("error,kube_client=off");
    let started = std::time::Instant::now();
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut hub = Cluster::start_in("hub", "eu-west", 1, Some(dirs[0].path().into())).await;
    let mut providers = vec![
        Cluster::start_in("east", "eu-east", 1, Some(dirs[1].path().into())).await,
        Cluster::start_in("west", "eu-west", 1, Some(dirs[2].path().into())).await,
    ];
    let mut gates = Vec::new();
    for p in &providers {
        let gate = support::api_gate(p).await;
        support::peer_with(
            &hub,
            p,
            json!({"cpu": "4", "memory": "8Gi", "pods": "30"}),
            Some(gate.url()),
        )
        .await;
        Api::<tandem_api::Peering>::all(hub.client.clone())
            .patch(
                &p.id,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"nodeHealth":
                    {"probePeriod": "500ms", "notReadyAfter": "1s"}}})),
            )
            .await
            .unwrap();
        gates.push(gate);
    }
    let pp = PatchParams::apply("soak").force();
    for (ns, extra) in [
        (
            LEDGER,
            json!({"partitionPolicy": "Fence", "fenceAfter": "3s"}),
        ),
        (CACHE, json!({})),
    ] {
        support::offload(&hub, &providers[0], ns, "LocalAndRemote").await;
        let mut spec = json!({"podOffloadingStrategy": "LocalAndRemote"});
        spec.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        Api::<tandem_api::NamespaceOffloading>::namespaced(hub.client.clone(), ns)
            .patch(
                names::OFFLOADING_NAME,
                &pp,
                &Patch::Apply(json!({
                    "apiVersion": "tandem.dev/v1alpha1", "kind": "NamespaceOffloading",
                    "metadata": {"name": names::OFFLOADING_NAME}, "spec": spec,
                })),
            )
            .await
            .unwrap();
    }

    // The workloads, placed on the providers (the local node cordoned meanwhile).
    support::cordon_local_nodes(&hub, true).await;
    let mut db = support::deployment("db", 2);
    db["apiVersion"] = json!("apps/v1");
    db["kind"] = json!("StatefulSet");
    db["spec"]["serviceName"] = json!("db");
    Api::<StatefulSet>::namespaced(hub.client.clone(), LEDGER)
        .create(&PostParams::default(), &serde_json::from_value(db).unwrap())
        .await
        .unwrap();
    for (ns, replicas) in [(LEDGER, 2), (CACHE, 3)] {
        Api::<Deployment>::namespaced(hub.client.clone(), ns)
            .create(
                &PostParams::default(),
                &serde_json::from_value(support::deployment("web", replicas)).unwrap(),
            )
            .await
            .unwrap();
    }
    every_pod_ready(
        &hub,
        &providers,
        "every pod Ready on the providers",
        Duration::from_secs(60),
    )
    .await;
    support::cordon_local_nodes(&hub, false).await;

    // The writer: a ConfigMap every 100 ms; what the API server acknowledged is recorded.
    let acknowledged = Arc::new(Mutex::new(Vec::<String>::new()));
    let writer = {
        let acknowledged = acknowledged.clone();
        let configmaps: Api<ConfigMap> = Api::namespaced(hub.client.clone(), LEDGER);
        tokio::spawn(async move {
            for i in 0.. {
                let name = format!("w-{i}");
                let cm: ConfigMap = serde_json::from_value(
                    json!({"metadata": {"name": name}, "data": {"i": i.to_string()}}),
                )
                .unwrap();
                if configmaps.create(&PostParams::default(), &cm).await.is_ok() {
                    acknowledged.lock().unwrap().push(name);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    for round in 0..rounds {
        for fault in ROUND {
            // The StatefulSet's ordinals on the provider the fault is about, so that every
            // fault has something to fence.
            let target = match fault {
                Fault::Partition(i)
                | Fault::PartitionAndKillConsumer(i)
                | Fault::KillProviderController(i)
                | Fault::RestartProviderApi(i) => i,
                Fault::KillConsumerController | Fault::RestartConsumerApi => 0,
            };
            let before = ordinals_on(&hub, &providers[target]).await;
            eprintln!("soak round {round} at {:.0?}: {fault:?}", started.elapsed());
            match fault {
                Fault::Partition(i) => {
                    gates[i].close();
                    tokio::time::sleep(Duration::from_secs(15)).await;
                    gates[i].open();
                }
                Fault::KillConsumerController => {
                    hub.kill_controller();
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    hub.restart_controller().await;
                }
                Fault::PartitionAndKillConsumer(i) => {
                    gates[i].close();
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    hub.kill_controller();
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    hub.restart_controller().await;
                    tokio::time::sleep(Duration::from_secs(11)).await;
                    gates[i].open();
                }
                Fault::KillProviderController(i) => {
                    providers[i].kill_controller();
                    tokio::time::sleep(Duration::from_secs(12)).await;
                    providers[i].restart_controller().await;
                }
                Fault::RestartConsumerApi => hub.restart_api_server().await,
                Fault::RestartProviderApi(i) => providers[i].restart_api_server().await,
            }
            // The ordinals of a lost provider, or of one whose fence ran while its controller
            // was down, are replaced (fenced there first); the others stay.
            let moves = matches!(
                fault,
                Fault::Partition(_)
                    | Fault::PartitionAndKillConsumer(_)
                    | Fault::KillProviderController(_)
            );
            let pods_api: Api<Pod> = Api::namespaced(hub.client.clone(), LEDGER);
            if moves {
                until(
                    &format!("the ordinals replaced after {fault:?}"),
                    Duration::from_secs(60),
                    || async {
                        for (ordinal, uid) in &before {
                            let p = pods_api.get(ordinal).await.ok()?;
                            (p.uid().as_ref() != Some(uid) && ready(&p)).then_some(())?;
                        }
                        Some(())
                    },
                )
                .await;
            } else {
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
            no_ordinal_ran_twice(&format!("round {round}: {fault:?}"));
        }
    }
    writer.abort();

    // Convergence.
    every_pod_ready(
        &hub,
        &providers,
        "every pod Ready again",
        Duration::from_secs(120),
    )
    .await;
    until("no orphaned object", Duration::from_secs(120), || async {
        orphans(&hub, &providers).await.is_empty().then_some(())
    })
    .await;
    no_ordinal_ran_twice("convergence");
    // The faults did move the StatefulSet: an ordinal ran in more than one cluster (one after
    // the other).
    let moved = ORDINALS.iter().any(|o| {
        let clusters: BTreeSet<String> = tandem_lab::runs::of_pod(o)
            .into_iter()
            .map(|r| r.cluster)
            .collect();
        clusters.len() > 1
    });
    assert!(moved, "no ordinal moved: {:#?}", tandem_lab::runs::all());
    let acknowledged = acknowledged.lock().unwrap().clone();
    assert!(
        acknowledged.len() > 100,
        "the writer wrote: {}",
        acknowledged.len()
    );
    let kept: BTreeSet<String> = Api::<ConfigMap>::namespaced(hub.client.clone(), LEDGER)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|c| c.name_any())
        .collect();
    let lost: Vec<&String> = acknowledged.iter().filter(|n| !kept.contains(*n)).collect();
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    for p in &providers {
        let twin = twin(LEDGER);
        let configmaps: Api<ConfigMap> = Api::namespaced(p.client.clone(), &twin);
        until(
            &format!("every acknowledged ConfigMap reflected to {}", p.id),
            Duration::from_secs(60),
            || async {
                let there: BTreeSet<String> = configmaps
                    .list(&ListParams::default())
                    .await
                    .ok()?
                    .items
                    .iter()
                    .map(|c| c.name_any())
                    .collect();
                acknowledged.iter().all(|n| there.contains(n)).then_some(())
            },
        )
        .await;
    }
    for g in gates {
        g.close();
    }
}

/// Moves the StatefulSet's ordinals onto `provider` (every other node cordoned while they are
/// placed) and returns their names and UIDs once they are Ready there. On timeout it names what
/// it saw last: each ordinal on the consumer, and the ShadowPods in the provider's twin.
async fn ordinals_on(hub: &Cluster, provider: &Cluster) -> Vec<(String, String)> {
    let target = names::virtual_node_name(&provider.id);
    support::cordon_all_but(hub, &target, true).await;
    let pods_api: Api<Pod> = Api::namespaced(hub.client.clone(), LEDGER);
    let on_target =
        |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(target.as_str());
    let seen = Arc::new(Mutex::new(String::new()));
    let what = format!("the ordinals Ready on {}", provider.id);
    let placing = until(&what, Duration::from_secs(3600), || async {
        let mut placed = Vec::new();
        let mut state = Vec::new();
        for ordinal in ORDINALS {
            let p = pods_api.get(ordinal).await;
            state.push(match &p {
                Ok(p) => describe(p),
                Err(e) => format!("{ordinal}: {e}"),
            });
            let Ok(p) = p else { continue };
            // Only an ordinal bound elsewhere is moved: one not bound yet is the scheduler's to
            // place (every other node is cordoned), and deleting it too would starve a
            // scheduler slower than this loop (its watch backing off after an API restart).
            let bound_elsewhere = p
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .is_some_and(|n| n != target);
            if bound_elsewhere && p.metadata.deletion_timestamp.is_none() {
                let _ = pods_api.delete(ordinal, &Default::default()).await;
            }
            if ready(&p) && on_target(&p) && p.metadata.deletion_timestamp.is_none() {
                placed.push((ordinal.to_string(), p.uid().unwrap_or_default()));
            }
        }
        state.extend(shadow_pods_state(provider, LEDGER).await);
        *seen.lock().unwrap() = state.join("\n");
        (placed.len() == ORDINALS.len()).then_some(placed)
    });
    let placed = match tokio::time::timeout(Duration::from_secs(90), placing).await {
        Ok(placed) => placed,
        Err(_) => panic!(
            "timed out after 90s waiting for the ordinals Ready on {}; last seen:\n{}",
            provider.id,
            seen.lock().unwrap()
        ),
    };
    support::cordon_all_but(hub, &target, false).await;
    placed
}

/// What is left over on the providers: ShadowPods that stand for no consumer pod on their
/// provider's virtual node (or stand Fenced), real pods without their ShadowPod, Tenants that
/// say Fenced.
async fn orphans(hub: &Cluster, providers: &[Cluster]) -> Vec<String> {
    let mut found = Vec::new();
    for p in providers {
        let vn = names::virtual_node_name(&p.id);
        for ns in [LEDGER, CACHE] {
            let twin = twin(ns);
            let here: BTreeSet<String> = pods(&hub.client, ns)
                .await
                .iter()
                .filter(|pod| {
                    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(vn.as_str())
                })
                .filter_map(|pod| pod.uid())
                .collect();
            let shadows = Api::<ShadowPod>::namespaced(p.client.clone(), &twin)
                .list(&ListParams::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default();
            for s in &shadows {
                let origin = s
                    .spec
                    .annotations
                    .get(tandem_core::shadow::ORIGIN_UID_ANNOTATION)
                    .cloned()
                    .unwrap_or_default();
                let fenced = s.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Fenced");
                if !here.contains(&origin) || fenced {
                    found.push(format!("ShadowPod {}/{twin}/{}", p.id, s.name_any()));
                }
            }
            let shadow_uids: BTreeSet<String> = shadows.iter().filter_map(|s| s.uid()).collect();
            for real in pods(&p.client, &twin).await {
                let owned = real
                    .owner_references()
                    .iter()
                    .any(|o| o.kind == "ShadowPod" && shadow_uids.contains(&o.uid));
                if !owned {
                    found.push(format!("pod {}/{twin}/{}", p.id, real.name_any()));
                }
            }
        }
        let tenant = Api::<Tenant>::namespaced(p.client.clone(), &names::tenant_namespace("hub"))
            .get("hub")
            .await
            .ok();
        let fenced = tenant
            .and_then(|t| t.status)
            .and_then(|s| tandem_api::conditions::find(&s.conditions, "Fenced").cloned())
            .is_some_and(|c| c.status == "True");
        if fenced {
            found.push(format!("Tenant {}/hub says Fenced", p.id));
        }
    }
    found
}
