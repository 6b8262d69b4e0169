//! Multi-cluster services on lab clusters (control plane; traffic is asserted in the CLI's
//! network tests): ServiceExports become ServiceImports in every peer, merged as KEP-1645
//! says, with derived Services and EndpointSlices in the importer's view of the exporter's
//! pods, in the namespaces the importer's admin opted in; conflicts show on the exports and
//! on the imports (where only the importer sees both exporters); nothing derived is left after unexport, namespace
//! deletion or unpeer.

use crate::support;

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use support::{Cluster, until};
use tandem_api::mcs::{SERVICE_NAME_LABEL, SOURCE_CLUSTER_LABEL, ServiceExport, ServiceImport};
use tandem_api::names;
use tandem_controller::mcs::derived_service_name;

/// How long an export may take to show (generous: the benchmark measures the real time).
const WAIT: Duration = Duration::from_secs(30);

async fn create(client: &Client, ns: &str, v: serde_json::Value) {
    let kind = v["kind"].as_str().unwrap().to_string();
    let ar = match kind.as_str() {
        "Namespace" => kube::core::ApiResource::erase::<Namespace>(&()),
        "Service" => kube::core::ApiResource::erase::<Service>(&()),
        "Deployment" => {
            kube::core::ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(&())
        }
        "ServiceExport" => kube::core::ApiResource::erase::<ServiceExport>(&()),
        other => panic!("{other}"),
    };
    let obj: kube::api::DynamicObject = serde_json::from_value(v).unwrap();
    let api: Api<kube::api::DynamicObject> = if kind == "Namespace" {
        Api::all_with(client.clone(), &ar)
    } else {
        Api::namespaced_with(client.clone(), ns, &ar)
    };
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("creating {kind} {ns}/{}: {e}", obj.name_any()),
    }
}

/// Namespace `ns`, a Deployment `name` of `replicas` and its Service with `ports`
/// (`[(name, port, targetPort)]`), exported.
async fn export(c: &Cluster, ns: &str, name: &str, replicas: i32, ports: &[(&str, i32, i32)]) {
    create(
        &c.client,
        ns,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
    )
    .await;
    create(&c.client, ns, support::deployment(name, replicas)).await;
    let ports: Vec<_> = ports
        .iter()
        .map(|(n, p, t)| json!({"name": n, "port": p, "targetPort": t, "protocol": "TCP"}))
        .collect();
    create(
        &c.client,
        ns,
        json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name}, "spec": {"selector": {"app": name}, "ports": ports}}),
    )
    .await;
    create(
        &c.client,
        ns,
        json!({"apiVersion": "multicluster.x-k8s.io/v1alpha1",
        "kind": "ServiceExport", "metadata": {"name": name}}),
    )
    .await;
}

/// The import's EndpointSlices: (source cluster, ready addresses).
async fn import_slices(c: &Cluster, ns: &str, name: &str) -> Vec<(String, BTreeSet<String>)> {
    let slices: Api<EndpointSlice> = Api::namespaced(c.client.clone(), ns);
    let list = slices
        .list(&ListParams::default().labels(&format!("{SERVICE_NAME_LABEL}={name}")))
        .await
        .unwrap();
    let mut out: Vec<_> = list
        .items
        .iter()
        .map(|s| {
            let cluster = s
                .labels()
                .get(SOURCE_CLUSTER_LABEL)
                .cloned()
                .unwrap_or_default();
            let ready = s
                .endpoints
                .iter()
                .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
                .flat_map(|e| e.addresses.clone())
                .collect();
            (cluster, ready)
        })
        .collect();
    out.sort();
    out
}

/// The IPs of the Running pods of `app` in `c`'s namespace `ns`.
async fn pod_ips(c: &Cluster, ns: &str, app: &str) -> BTreeSet<String> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(c.client.clone(), ns);
    pods.list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|p| p.status?.pod_ip)
        .collect()
}

fn condition<'a>(
    e: &'a ServiceExport,
    t: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    e.status.as_ref()?.conditions.iter().find(|c| c.type_ == t)
}

#[tokio::test(flavor = "multi_thread")]
async fn exports_of_two_providers_merge_into_one_import_that_follows_them() {
    // rome consumes from milan and from turin; milan and turin do not know each other.
    let milan = Cluster::start("milan", "eu-south", 1).await;
    let turin = Cluster::start("turin", "eu-south", 1).await;
    let rome = Cluster::start("rome", "eu-central", 1).await;
    let to_milan = support::peer(&rome, &milan).await;
    let to_turin = support::peer(&rome, &turin).await;
    // rome's admin opts its namespace demo in for its providers' exports: a peer's export is
    // imported only where the admin says so (or in the peer's own twin namespace).
    create(
        &rome.client,
        "",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo",
               "annotations": {tandem_core::mcs::IMPORT_FROM_ANNOTATION: "*"}}}),
    )
    .await;

    export(&milan, "demo", "hello", 2, &[("http", 80, 8080)]).await;
    export(&turin, "demo", "hello", 1, &[("http", 80, 8080)]).await;
    // A system namespace, and one rome does not have: neither becomes an import in rome.
    export(&milan, "kube-system", "sys", 1, &[("http", 80, 8080)]).await;
    export(&milan, "only-milan", "lonely", 1, &[("http", 80, 8080)]).await;

    // The pods' addresses as rome reaches them: the same host part in rome's name for each
    // provider's pod CIDR.
    let in_rome = |peering: &tandem_api::Peering, ips: BTreeSet<String>| {
        let (here, there) = support::remote_pod_cidrs(peering);
        ips.iter()
            .map(|ip| support::translate(ip, there, here))
            .collect::<BTreeSet<_>>()
    };
    let milan_ips = until("milan's pods running", WAIT, || async {
        let ips = pod_ips(&milan, "demo", "hello").await;
        (ips.len() == 2).then_some(ips)
    })
    .await;
    let turin_ips = until("turin's pod running", WAIT, || async {
        let ips = pod_ips(&turin, "demo", "hello").await;
        (ips.len() == 1).then_some(ips)
    })
    .await;
    let want = vec![
        ("milan".to_string(), in_rome(&to_milan, milan_ips.clone())),
        ("turin".to_string(), in_rome(&to_turin, turin_ips)),
    ];
    until(
        "rome's import has both providers' endpoints",
        WAIT,
        || async { (import_slices(&rome, "demo", "hello").await == want).then_some(()) },
    )
    .await;
    let imports: Api<ServiceImport> = Api::namespaced(rome.client.clone(), "demo");
    let import = imports.get("hello").await.unwrap();
    assert_eq!(import.spec.type_, "ClusterSetIP");
    assert_eq!(import.spec.ports.len(), 1);
    assert_eq!(import.spec.ports[0].port, 80);
    let clusters: Vec<_> = import
        .status
        .clone()
        .unwrap()
        .clusters
        .into_iter()
        .map(|c| c.cluster)
        .collect();
    assert_eq!(clusters, ["milan", "turin"]);
    // The import's IP is its derived Service's ClusterIP; the Service has no selector.
    let derived = derived_service_name("demo", "hello");
    let services: Api<Service> = Api::namespaced(rome.client.clone(), "demo");
    let ip = until("the import's IP", WAIT, || async {
        imports.get("hello").await.ok()?.spec.ips.first().cloned()
    })
    .await;
    let svc = services.get(&derived).await.unwrap().spec.unwrap();
    assert_eq!(svc.cluster_ip.as_deref(), Some(ip.as_str()));
    assert!(svc.selector.is_none_or(|s| s.is_empty()));
    // Each exporter imports its own export too (the KEP's "and in X itself").
    let milan_import = until("milan's own import", WAIT, || async {
        Api::<ServiceImport>::namespaced(milan.client.clone(), "demo")
            .get_opt("hello")
            .await
            .ok()?
    })
    .await;
    assert_eq!(milan_import.status.unwrap().clusters.len(), 1);
    // No import where rome does not allow it or lacks the namespace; nothing created.
    assert!(
        Api::<ServiceImport>::namespaced(rome.client.clone(), "kube-system")
            .get_opt("sys")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        Api::<Namespace>::all(rome.client.clone())
            .get_opt("only-milan")
            .await
            .unwrap()
            .is_none()
    );
    // The exports say so.
    let hello_export = Api::<ServiceExport>::namespaced(milan.client.clone(), "demo")
        .get("hello")
        .await
        .unwrap();
    assert_eq!(
        condition(&hello_export, "Valid").map(|c| c.status.as_str()),
        Some("True")
    );
    assert_eq!(
        condition(&hello_export, "Conflict").map(|c| c.reason.as_str()),
        Some("NoConflicts")
    );

    // A clash only rome can see: milan and turin do not peer, so neither export knows of the
    // other; rome's import says so, naming both.
    export(&milan, "demo", "clash", 1, &[("http", 80, 8080)]).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    export(&turin, "demo", "clash", 1, &[("http", 81, 8080)]).await;
    let conflict = until("the Conflict condition on rome's import", WAIT, || async {
        let i = imports.get_opt("clash").await.ok()??;
        let c = i
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Conflict")?;
        (c.status == "True").then_some(c)
    })
    .await;
    assert_eq!(conflict.reason, "PortConflict");
    assert!(
        conflict
            .message
            .contains("cluster turin: port \"http\" (TCP 81)")
            && conflict
                .message
                .contains("port \"http\" (TCP 80) of the older export of cluster milan"),
        "{}",
        conflict.message
    );
    let milan_export = Api::<ServiceExport>::namespaced(milan.client.clone(), "demo");
    until("milan's export of clash valid", WAIT, || async {
        let e = milan_export.get("clash").await.ok()?;
        (condition(&e, "Conflict")?.reason == "NoConflicts").then_some(())
    })
    .await;
    // The first import agrees on everything: no conflict there.
    let hello = imports.get("hello").await.unwrap().status.unwrap();
    let c = hello
        .conditions
        .iter()
        .find(|c| c.type_ == "Conflict")
        .unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "NoConflicts")
    );
    for c in [&milan, &turin] {
        Api::<ServiceExport>::namespaced(c.client.clone(), "demo")
            .delete("clash", &DeleteParams::default())
            .await
            .unwrap();
    }

    // The exported Service scales: the import follows.
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(milan.client.clone(), "demo");
    deployments
        .patch(
            "hello",
            &Default::default(),
            &kube::api::Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    until("rome's import has milan's third endpoint", WAIT, || async {
        let s = import_slices(&rome, "demo", "hello").await;
        (s.iter().find(|(c, _)| c == "milan")?.1.len() == 3).then_some(())
    })
    .await;

    // Unexport in turin: only milan's endpoints are left.
    Api::<ServiceExport>::namespaced(turin.client.clone(), "demo")
        .delete("hello", &DeleteParams::default())
        .await
        .unwrap();
    until("turin's endpoints leave rome's import", WAIT, || async {
        let s = import_slices(&rome, "demo", "hello").await;
        (s.len() == 1 && s[0].0 == "milan").then_some(())
    })
    .await;

    // Deleting the namespace in milan takes the last export: nothing derived is left in rome.
    Api::<Namespace>::all(milan.client.clone())
        .delete("demo", &DeleteParams::default())
        .await
        .unwrap();
    until(
        "rome's import and everything derived from it gone",
        WAIT,
        || async {
            let import = imports.get_opt("hello").await.ok()?;
            let derived_svc = services.get_opt(&derived).await.ok()?;
            let slices = import_slices(&rome, "demo", "hello").await;
            (import.is_none() && derived_svc.is_none() && slices.is_empty()).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn clashing_ports_conflict_on_every_export_and_unpeering_removes_the_peers_part() {
    let milan = Cluster::start("milan", "eu-south", 1).await;
    let rome = Cluster::start("rome", "eu-central", 1).await;
    let rome_before = support::tandem_owned(&rome.client).await;
    support::peer(&rome, &milan).await;
    // Each admin lets the other's exports join its own in demo, with the lists of the
    // peering's two ends (without them neither side merges a peer's export into its own).
    Api::<tandem_api::Tenant>::namespaced(milan.client.clone(), &names::tenant_namespace("rome"))
        .patch(
            "rome",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"serviceImportNamespaces": ["demo"]}})),
        )
        .await
        .unwrap();
    Api::<tandem_api::Peering>::all(rome.client.clone())
        .patch(
            "milan",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"serviceImportNamespaces": ["demo"]}})),
        )
        .await
        .unwrap();
    export(&milan, "demo", "hello", 1, &[("http", 80, 8080)]).await;
    // Creation times have a resolution of a second: rome's export is younger.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    export(
        &rome,
        "demo",
        "hello",
        1,
        &[("http", 8080, 8080), ("grpc", 9090, 9090)],
    )
    .await;

    for c in [&milan, &rome] {
        let exports: Api<ServiceExport> = Api::namespaced(c.client.clone(), "demo");
        let conflict = until(&format!("Conflict on {}'s export", c.id), WAIT, || async {
            let e = exports.get("hello").await.ok()?;
            let c = condition(&e, "Conflict")?.clone();
            (c.status == "True").then_some(c)
        })
        .await;
        assert_eq!(conflict.reason, "PortConflict");
        assert!(
            conflict.message.contains("port \"http\" (TCP 8080)")
                && conflict.message.contains("port \"http\" (TCP 80)")
                && conflict.message.contains("milan"),
            "{}",
            conflict.message
        );
        // The import's ports are the union, the clash resolved by the oldest (milan's).
        let imports: Api<ServiceImport> = Api::namespaced(c.client.clone(), "demo");
        let ports = until(&format!("{}'s import merged", c.id), WAIT, || async {
            let i = imports.get_opt("hello").await.ok()??;
            let clusters = i.status.as_ref()?.clusters.len();
            let mut ports: Vec<_> = i
                .spec
                .ports
                .iter()
                .map(|p| (p.name.clone().unwrap_or_default(), p.port))
                .collect();
            ports.sort();
            (clusters == 2).then_some(ports)
        })
        .await;
        assert_eq!(
            ports,
            [("grpc".to_string(), 9090), ("http".to_string(), 80)]
        );
        let on_import = until(&format!("Conflict on {}'s import", c.id), WAIT, || async {
            let i = imports.get("hello").await.ok()?;
            let c = i
                .status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Conflict")?;
            (c.status == "True").then_some(c)
        })
        .await;
        assert_eq!(on_import.reason, "PortConflict");
        assert!(
            on_import.message.contains("rome") && on_import.message.contains("milan"),
            "{}",
            on_import.message
        );
    }

    // Unpeer: rome's import keeps only its own export, and milan's part is gone from it.
    tandem_admin::invite::unpeer(
        &rome.client,
        "milan",
        false,
        Duration::from_secs(20),
        &mut |_| {},
    )
    .await
    .unwrap();
    until("rome's import without milan", WAIT, || async {
        let s = import_slices(&rome, "demo", "hello").await;
        (s.len() == 1 && s[0].0 == "rome").then_some(())
    })
    .await;
    // Unexport too: nothing Tandem made is left in rome but what was there before.
    Api::<ServiceExport>::namespaced(rome.client.clone(), "demo")
        .delete("hello", &DeleteParams::default())
        .await
        .unwrap();
    until("rome's import gone", WAIT, || async {
        Api::<ServiceImport>::namespaced(rome.client.clone(), "demo")
            .get_opt("hello")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    support::until_owned(&rome, &rome_before, "after unpeer and unexport", WAIT).await;
}

/// Ready flags of the import's endpoints from `cluster`.
async fn readiness(c: &Cluster, ns: &str, name: &str, cluster: &str) -> Vec<bool> {
    let slices: Api<EndpointSlice> = Api::namespaced(c.client.clone(), ns);
    slices
        .list(&ListParams::default().labels(&format!(
            "{SERVICE_NAME_LABEL}={name},{SOURCE_CLUSTER_LABEL}={cluster}"
        )))
        .await
        .unwrap()
        .items
        .iter()
        .flat_map(|s| s.endpoints.iter())
        .map(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
        .collect()
}

/// The import's UID and IP.
async fn import_identity(c: &Cluster, ns: &str, name: &str) -> Option<(String, Vec<String>)> {
    let imports: Api<ServiceImport> = Api::namespaced(c.client.clone(), ns);
    let i = imports.get_opt(name).await.unwrap()?;
    Some((i.uid()?, i.spec.ips))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_provider_s_endpoints_turn_not_ready_and_come_back() {
    let mut rome = Cluster::start("rome", "eu-central", 1).await;
    let milan = Cluster::start("milan", "eu-south", 1).await;
    let gate = support::api_gate(&milan).await;
    support::peer_with(
        &rome,
        &milan,
        json!({"cpu": "16", "memory": "64Gi", "pods": "100"}),
        Some(gate.url()),
    )
    .await;
    // rome's admin opts its namespace demo in for its providers' exports: a peer's export is
    // imported only where the admin says so (or in the peer's own twin namespace).
    create(
        &rome.client,
        "",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo",
               "annotations": {tandem_core::mcs::IMPORT_FROM_ANNOTATION: "*"}}}),
    )
    .await;
    export(&milan, "demo", "hello", 2, &[("http", 80, 8080)]).await;
    until("milan's endpoints ready in rome", WAIT, || async {
        (readiness(&rome, "demo", "hello", "milan").await == [true, true]).then_some(())
    })
    .await;
    // milan's API becomes unreachable: once its virtual node is NotReady, its endpoints stay
    // in rome's import but are not ready (kube-proxy stops sending to them).
    let before = import_identity(&rome, "demo", "hello").await;
    assert!(
        before.as_ref().is_some_and(|(_, ips)| ips.len() == 1),
        "{before:?}"
    );
    gate.close();
    until("milan's endpoints not ready in rome", WAIT, || async {
        (readiness(&rome, "demo", "hello", "milan").await == [false, false]).then_some(())
    })
    .await;
    // rome's controller restarts while milan cannot be reached: what milan exported is not
    // known, and is not taken as nothing — the import keeps its IP (clients keep their
    // address) and milan's endpoints, not ready.
    rome.restart_controller().await;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            import_identity(&rome, "demo", "hello").await,
            before,
            "the import stays while its exporter is unknown"
        );
        assert_eq!(
            readiness(&rome, "demo", "hello", "milan").await,
            [false, false]
        );
    }
    gate.open();
    until("milan's endpoints ready again", WAIT, || async {
        (readiness(&rome, "demo", "hello", "milan").await == [true, true]).then_some(())
    })
    .await;
    assert_eq!(import_identity(&rome, "demo", "hello").await, before);
}
