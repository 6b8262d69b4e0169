//! Grants count what a pod can use: a hostile consumer writes ShadowPods that request nothing,
//! zero, limits far above their requests, scratch space beyond its grant or a sidecar hidden
//! in the init containers — every one is charged or refused on the provider, naming the rule.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tandem_api::{ShadowPod, Tenant, names};

use super::support::{self, Cluster, until};
use super::{shadow_pod, verdict};

/// A container's resources, as a ShadowPod's container fields.
fn resources(requests: Value, limits: Value) -> Value {
    json!({"resources": {"requests": requests, "limits": limits}})
}

/// The verdict on ShadowPod `name` once it has one (the real pod, or the Rejected message).
async fn verdict_on(admin: &Client, twin: &str, name: &str) -> Result<Pod, String> {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), twin);
    let shadows: Api<ShadowPod> = Api::namespaced(admin.clone(), twin);
    until(
        &format!("a verdict on ShadowPod {name}"),
        Duration::from_secs(60),
        || async {
            if let Ok(Some(p)) = pods.get_opt(name).await {
                return Some(Ok(p));
            }
            let st = shadows.get(name).await.ok()?.status?;
            (st.phase.as_deref() == Some("Rejected")).then(|| Err(st.message.unwrap_or_default()))
        },
    )
    .await
}

/// Waits until ShadowPod `name`'s Rejected message contains `part` (the provider decides a
/// rejected pod again when its consumer's Tenant changes: this is how a test knows the
/// provider has the Tenant's new terms).
async fn until_rejected_with(admin: &Client, twin: &str, name: &str, part: &str) -> String {
    let shadows: Api<ShadowPod> = Api::namespaced(admin.clone(), twin);
    until(
        &format!("ShadowPod {name} rejected with {part:?}"),
        Duration::from_secs(60),
        || async {
            let m = shadows.get(name).await.ok()?.status?.message?;
            m.contains(part).then_some(m)
        },
    )
    .await
}

/// Tries 8 distinct attacks on the grant: a burst of request-less pods, zero requests, a cpu
/// limit and a memory limit beyond the ratio, an init container's limit beyond it, a sidecar
/// whose request a max-of-init-containers count would hide, scratch space beyond the grant,
/// and a request-less pod where the Tenant refuses them.
#[tokio::test]
async fn a_hostile_consumer_pays_for_what_its_pods_can_use() {
    let provider = Cluster::start("lugano", "eu-south", 2).await;
    let mut hostile = Cluster::start("chur", "eu-south", 1).await;
    let honest = Cluster::start("sion", "eu-south", 1).await;
    support::peer_with(
        &hostile,
        &provider,
        json!({"cpu": "1", "memory": "8Gi", "pods": "50", "ephemeral-storage": "1Gi"}),
        None,
    )
    .await;
    support::peer(&honest, &provider).await;
    let twin = support::offload_remote(&hostile, &provider, "shop").await;
    let honest_twin = support::offload_remote(&honest, &provider, "shop").await;
    let admin = provider.client.clone();
    let peer = support::peer_client(&hostile, &provider).await;
    // From here on the hostile consumer runs code of its own (its controller would remove
    // ShadowPods no pod of its own stands for).
    hostile.kill_controller();

    // The provider's own pod requests nothing: it is never charged to any consumer.
    let own: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let own_pod: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "provider-own"},
        "spec": {"containers": [{"name": "db", "image": "postgres"}]}}))
    .unwrap();
    let own_uid = own
        .create(&PostParams::default(), &own_pod)
        .await
        .unwrap()
        .uid()
        .unwrap();

    // The grant in force: a pod asking for a thousand cores is refused against 1 cpu.
    let none = json!({});
    let huge = shadow_pod(
        "probe",
        none.clone(),
        resources(json!({"cpu": "1000"}), none.clone()),
        none.clone(),
    );
    let _ = verdict(&peer, &admin, &twin, huge).await;
    until_rejected_with(&admin, &twin, "probe", "used 0m of 1000m").await;

    // Refused before anything is charged: limits beyond the ratio, scratch space beyond the
    // grant, a sidecar counted with the containers.
    let sidecar = json!({"initContainers": [{"name": "proxy", "image": "envoy",
        "restartPolicy": "Always", "resources": {"requests": {"cpu": "800m"}}}]});
    let refused: Vec<(&str, Value, Value, &str)> = vec![
        (
            "cpu-limit",
            none.clone(),
            resources(json!({"cpu": "100m"}), json!({"cpu": "4"})),
            "refused by rule limit-request-ratio: container \"app\" has a cpu limit of 4 for a request of 100m: a limit may be at most 10 times its request",
        ),
        (
            "memory-limit",
            none.clone(),
            resources(json!({"memory": "64Mi"}), json!({"memory": "8Gi"})),
            "refused by rule limit-request-ratio: container \"app\" has a memory limit of 8Gi for a request of 64Mi: a limit may be at most 4 times its request",
        ),
        (
            "init-limit",
            json!({"initContainers": [{"name": "setup", "image": "busybox",
                "resources": {"requests": {"cpu": "10m"}, "limits": {"cpu": "1"}}}]}),
            none.clone(),
            "refused by rule limit-request-ratio: init container \"setup\" has a cpu limit of 1",
        ),
        (
            "scratch",
            none.clone(),
            resources(
                json!({"cpu": "10m", "ephemeral-storage": "2Gi"}),
                none.clone(),
            ),
            "quota exceeded for ephemeral-storage: requested 2147483648, used 0 of 1073741824",
        ),
        (
            "sidecar",
            sidecar,
            resources(json!({"cpu": "800m"}), none.clone()),
            "quota exceeded for cpu: requested 1600m, used 0m of 1000m",
        ),
    ];
    for (name, pod, container, rule) in refused {
        let got = verdict(
            &peer,
            &admin,
            &twin,
            shadow_pod(name, pod, container, none.clone()),
        )
        .await;
        assert!(
            got.as_ref()
                .is_err_and(|m| m.contains(rule) && m.contains("Tenant tandem-tenant-chur/chur")),
            "{name}: {:?}",
            got.map(|p| p.name_any())
        );
    }

    // A burst of pods requesting nothing (the first one zero, which is the same): each is
    // charged the default 100m, so 1 cpu takes ten and the rest are refused, naming the rule.
    let shadows: Api<ShadowPod> = Api::namespaced(peer.clone(), &twin);
    let burst: Vec<String> = (0..12).map(|i| format!("burst-{i:02}")).collect();
    for (i, name) in burst.iter().enumerate() {
        let container = if i == 0 {
            resources(json!({"cpu": "0", "memory": "0"}), none.clone())
        } else {
            none.clone()
        };
        let sp: ShadowPod =
            serde_json::from_value(shadow_pod(name, none.clone(), container, none.clone()))
                .unwrap();
        shadows.create(&PostParams::default(), &sp).await.unwrap();
    }
    let mut ran = Vec::new();
    let mut rejected = Vec::new();
    for name in &burst {
        match verdict_on(&admin, &twin, name).await {
            Ok(pod) => ran.push(pod),
            Err(m) => rejected.push(m),
        }
    }
    assert_eq!(ran.len(), 10, "1 cpu at 100m each: {rejected:?}");
    for m in &rejected {
        assert!(
            m.contains("quota exceeded for cpu: requested 100m, used 1000m of 1000m")
                && m.contains("charged the provider's default (podResources.defaultRequests)"),
            "{m}"
        );
    }
    // The charge is on the real pods, where the provider's scheduler reserves it, and what
    // they can use is bounded by it.
    for pod in &ran {
        let r = pod.spec.as_ref().unwrap().containers[0]
            .resources
            .clone()
            .unwrap();
        let q = |m: &Option<std::collections::BTreeMap<String, _>>, k: &str| {
            m.as_ref()
                .and_then(|m| m.get(k))
                .map(|q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| q.0.clone())
        };
        assert_eq!(
            q(&r.requests, "cpu").as_deref(),
            Some("100m"),
            "{}",
            pod.name_any()
        );
        assert_eq!(q(&r.requests, "memory").as_deref(), Some("128Mi"));
        assert_eq!(q(&r.limits, "cpu").as_deref(), Some("1"));
        assert_eq!(q(&r.limits, "memory").as_deref(), Some("512Mi"));
    }

    // A Tenant that refuses pods without requests: the pod the burst left over is decided
    // again under it, and a new one is refused too.
    let tenants: Api<Tenant> = Api::namespaced(admin.clone(), &names::tenant_namespace("chur"));
    tenants
        .patch(
            "chur",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"podResources": {"withoutRequests": "Refuse"}}})),
        )
        .await
        .unwrap();
    let left = burst
        .iter()
        .find(|n| !ran.iter().any(|p| &p.name_any() == *n))
        .unwrap();
    until_rejected_with(&admin, &twin, left, "refused by rule pod-requests").await;
    let strict = verdict(
        &peer,
        &admin,
        &twin,
        shadow_pod("strict", none.clone(), none.clone(), none.clone()),
    )
    .await;
    assert!(
        strict.as_ref().is_err_and(|m| m.contains(
            "refused by rule pod-requests: container \"app\" requests no cpu, and this provider charges every container for cpu"
        )),
        "{:?}",
        strict.map(|p| p.name_any())
    );

    // Another Tenant's pod requesting nothing, offloaded by its honest consumer, still runs,
    // charged the default against its own grant.
    let mut web = support::deployment("web", 1);
    web["spec"]["template"]["spec"]["containers"][0]
        .as_object_mut()
        .unwrap()
        .remove("resources");
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(honest.client.clone(), "shop");
    deployments
        .create(
            &PostParams::default(),
            &serde_json::from_value(web).unwrap(),
        )
        .await
        .unwrap();
    let theirs: Api<Pod> = Api::namespaced(admin.clone(), &honest_twin);
    let charged = until(
        "the honest consumer's pod running on the provider",
        Duration::from_secs(60),
        || async {
            let pods = theirs.list(&Default::default()).await.ok()?;
            let p = pods
                .items
                .into_iter()
                .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))?;
            let r = p.spec?.containers[0].resources.clone()?;
            r.requests?.get("cpu").map(|q| q.0.clone())
        },
    )
    .await;
    assert_eq!(charged, "100m");
    // The provider's own pod is as it was, and charged to nobody.
    let after = own.get("provider-own").await.unwrap();
    assert_eq!(after.uid().unwrap(), own_uid);
    let spec = after.spec.unwrap();
    assert!(
        spec.node_name.is_some(),
        "the provider's own pod was not scheduled"
    );
    assert!(
        spec.containers[0]
            .resources
            .clone()
            .and_then(|r| r.requests)
            .is_none_or(|r| r.is_empty()),
        "the provider's own pod was given requests"
    );
}
