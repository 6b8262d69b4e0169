//! MCS leakage: a consumer's exported Services, written as records with its peer identity,
//! become imports in its provider only where the relation applies — its own twin of the
//! namespace, or a namespace the provider's admin opted in — and never join the provider's own
//! export of the same name unless opted in. A clash that only the provider sees (two consumers
//! that do not peer with each other) shows as `Conflict` on the provider's ServiceImport.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Namespace};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};
use tandem_api::mcs::{
    ExportedService, SOURCE_CLUSTER_LABEL, ServiceExport, ServiceImport, exported_service_name,
};
use tandem_api::{NetworkParameters, names};
use tandem_core::mcs::IMPORT_FROM_ANNOTATION;

use super::support::{self, Cluster, until};

const WAIT: Duration = Duration::from_secs(30);

/// Creates `v` as `client`, whatever its kind (an existing object is left as it is).
async fn create(client: &Client, ns: &str, v: Value) {
    let kind = v["kind"].as_str().unwrap().to_string();
    let ar = match kind.as_str() {
        "Namespace" => kube::core::ApiResource::erase::<Namespace>(&()),
        "Service" => kube::core::ApiResource::erase::<k8s_openapi::api::core::v1::Service>(&()),
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
        Err(e) => panic!("creating {kind} {ns}: {e}"),
    }
}

/// What an admin does: namespace `ns`, a Deployment `name` and its Service on port `port`
/// (named http), exported.
async fn export(c: &Cluster, ns: &str, name: &str, port: i32) {
    create(
        &c.client,
        "",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
    )
    .await;
    create(&c.client, ns, support::deployment(name, 1)).await;
    create(
        &c.client,
        ns,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
               "spec": {"selector": {"app": name},
                        "ports": [{"name": "http", "port": port, "targetPort": 8080, "protocol": "TCP"}]}}),
    )
    .await;
    create(
        &c.client,
        ns,
        json!({"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceExport",
               "metadata": {"name": name}}),
    )
    .await;
}

/// What a forged record claims: (cluster, namespace, service, exportedAt, port, endpoint).
type Claims<'a> = (&'a str, &'a str, &'a str, &'a str, i32, &'a str);

/// Writes, with the peer identity, the ExportedService `name` saying `cluster` exports
/// `ns/svc` (created at `at`) on port `port` with endpoint `address`.
async fn forge(peer: &Client, consumer: &str, name: &str, spec: Claims<'_>) {
    let (cluster, ns, svc, at, port, address) = spec;
    let record: ExportedService = serde_json::from_value(json!({
        "apiVersion": "tandem.dev/v1alpha1", "kind": "ExportedService",
        "metadata": {"name": name},
        "spec": {"clusterID": cluster, "namespace": ns, "service": svc, "exportedAt": at,
                 "type": "ClusterSetIP",
                 "ports": [{"name": "http", "protocol": "TCP", "port": port}],
                 "endpointSlices": [{"ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
                                     "endpoints": [{"addresses": [address], "ready": true}]}]},
    }))
    .unwrap();
    Api::<ExportedService>::namespaced(peer.clone(), &names::tenant_namespace(consumer))
        .create(&PostParams::default(), &record)
        .await
        .unwrap_or_else(|e| panic!("the peer may write its records ({name}): {e}"));
}

/// `c`'s ServiceImport `ns/name`, if there is one.
async fn import_of(c: &Cluster, ns: &str, name: &str) -> Option<ServiceImport> {
    Api::<ServiceImport>::namespaced(c.client.clone(), ns)
        .get_opt(name)
        .await
        .ok()?
}

fn clusters(i: &ServiceImport) -> Vec<String> {
    i.status
        .iter()
        .flat_map(|s| &s.clusters)
        .map(|c| c.cluster.clone())
        .collect()
}

fn condition(i: &ServiceImport, t: &str) -> Option<(String, String, String)> {
    let c = i
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == t)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Seven distinct attacks by a consumer (chur) writing its export records by hand with its
/// peer identity: (1) joining the provider's own export `payments/api` with an older, clashing
/// export and an endpoint of its own, (2) an import in the provider's namespace `payments`
/// never shared with it, (3) an import in another consumer's twin namespace, (4) in
/// kube-system, (5) in another consumer's tenant namespace, (6) a record under another
/// consumer's cluster ID, (7) a record whose name and namespace disagree. Each is refused
/// with an Event naming the rule; the provider's own import and the other consumer's (thun's)
/// imports are checked unchanged after. The consumer's own twin (same name, allowed by the
/// admin) and a namespace the admin opted in still receive its exports, and a clash there that
/// only the provider sees is its ServiceImport's `Conflict` condition, naming both consumers.
#[tokio::test]
async fn a_consumers_exports_reach_only_what_the_provider_shared_with_it() {
    let lugano = Cluster::start("lugano", "eu-central", 1).await;
    let mut chur = Cluster::start("chur", "eu-central", 1).await;
    let thun = Cluster::start("thun", "eu-central", 1).await;
    support::peer(&chur, &lugano).await;
    support::peer(&thun, &lugano).await;
    let thun_twin = support::offload_remote(&thun, &lugano, "shop").await;
    let admin = lugano.client.clone();

    // The provider's own exported Service, and a namespace its admin shares with both
    // consumers.
    export(&lugano, "payments", "api", 80).await;
    let own = until("lugano's own import of payments/api", WAIT, || async {
        let i = import_of(&lugano, "payments", "api").await?;
        (clusters(&i) == ["lugano"]).then_some(i)
    })
    .await;
    create(
        &admin,
        "",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shared",
               "annotations": {IMPORT_FROM_ANNOTATION: "chur,thun"}}}),
    )
    .await;
    // The honest consumer exports there (and its own cluster has the namespace too).
    export(&thun, "shared", "cache", 80).await;
    until(
        "thun's export imported in lugano's shared",
        WAIT,
        || async {
            let i = import_of(&lugano, "shared", "cache").await?;
            (clusters(&i) == ["thun"]).then_some(())
        },
    )
    .await;

    // From here on chur runs code of its own, with its peer identity.
    let peer = support::peer_client(&chur, &lugano).await;
    chur.kill_controller();
    support::allow_namespace_mappings(&lugano, "chur").await;
    super::twin_verdict(&peer, "chur", "web", "web", "web")
        .await
        .expect("chur's twin of web under its own name, as the admin allows");
    // An address of chur's own pods, as it would export honestly.
    let params: Api<NetworkParameters> =
        Api::namespaced(admin.clone(), &names::tenant_namespace("chur"));
    let chur_cidr: ipnet::IpNet = params
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find_map(|p| p.spec.pod_cidr.parse().ok())
        .expect("chur's pod CIDR");
    let chur_pod = chur_cidr.hosts().nth(10).unwrap().to_string();
    let old = "2000-01-01T00:00:00Z";
    let now = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    // (record name, its claims, the rule that refuses it)
    let attacks: Vec<(String, Claims, &str)> = vec![
        (
            exported_service_name("chur", "payments", "api"),
            ("chur", "payments", "api", old, 8080, &chur_pod),
            "NamespaceNotShared",
        ),
        (
            exported_service_name("chur", "payments", "ledger"),
            ("chur", "payments", "ledger", old, 80, &chur_pod),
            "NamespaceNotShared",
        ),
        (
            exported_service_name("chur", &thun_twin, "cart"),
            ("chur", &thun_twin, "cart", old, 80, &chur_pod),
            "NamespaceNotShared",
        ),
        (
            exported_service_name("chur", "kube-system", "kube-dns"),
            ("chur", "kube-system", "kube-dns", old, 53, &chur_pod),
            "ReservedNamespace",
        ),
        (
            exported_service_name("chur", "tandem-tenant-thun", "steal"),
            ("chur", "tandem-tenant-thun", "steal", old, 80, &chur_pod),
            "ReservedNamespace",
        ),
        (
            exported_service_name("thun", "shared", "cache2"),
            ("thun", "shared", "cache2", old, 80, &chur_pod),
            "NotThePeersOwnExport",
        ),
        (
            exported_service_name("chur", "web", "site2"),
            ("chur", "payments", "site2", old, 80, &chur_pod),
            "NotThePeersOwnExport",
        ),
    ];
    for (name, spec, _) in &attacks {
        forge(&peer, "chur", name, *spec).await;
    }
    // What the relation allows: chur's own twin, and the namespace shared with it — where
    // chur's port clashes with thun's, a conflict only lugano can see.
    forge(
        &peer,
        "chur",
        &exported_service_name("chur", "web", "site"),
        ("chur", "web", "site", &now, 80, &chur_pod),
    )
    .await;
    forge(
        &peer,
        "chur",
        &exported_service_name("chur", "shared", "cache"),
        ("chur", "shared", "cache", &now, 8080, &chur_pod),
    )
    .await;

    // Each attack refused with an Event naming the rule, about the record.
    let events: Api<Event> = Api::namespaced(admin.clone(), &names::tenant_namespace("chur"));
    for (name, (_, ns, _, _, _, _), rule) in &attacks {
        let event = until(&format!("the {rule} Event on {name}"), WAIT, || async {
            events
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|e| {
                    e.involved_object.name.as_deref() == Some(name.as_str())
                        && e.reason.as_deref() == Some(*rule)
                })
        })
        .await;
        let message = event.message.unwrap_or_default();
        assert!(
            message.contains("not imported")
                && message.contains(if *rule == "NotThePeersOwnExport" {
                    name.as_str()
                } else {
                    ns
                }),
            "{name}: {message}"
        );
        assert_eq!(
            event.type_.as_deref(),
            Some(if *rule == "NamespaceNotShared" {
                "Normal"
            } else {
                "Warning"
            })
        );
    }

    // The consumer's own twin and the shared namespace do import its exports.
    until("chur's export imported in its own twin", WAIT, || async {
        (clusters(&import_of(&lugano, "web", "site").await?) == ["chur"]).then_some(())
    })
    .await;
    let (status, reason, message) = until("Conflict on lugano's shared/cache", WAIT, || async {
        let i = import_of(&lugano, "shared", "cache").await?;
        let c = condition(&i, "Conflict")?;
        (clusters(&i) == ["chur", "thun"] && c.0 == "True").then_some(c)
    })
    .await;
    assert_eq!((status.as_str(), reason.as_str()), ("True", "PortConflict"));
    assert!(
        message.contains("cluster chur") || message.contains("cluster thun"),
        "{message}"
    );
    assert!(
        message.contains("chur") && message.contains("thun"),
        "{message}"
    );
    // thun cannot see chur: its own export reports no conflict.
    let thun_export = Api::<ServiceExport>::namespaced(thun.client.clone(), "shared")
        .get("cache")
        .await
        .unwrap();
    let thun_conflict = thun_export
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Conflict")
        .unwrap();
    assert_eq!(thun_conflict.reason, "NoConflicts");

    // Nothing was imported where it was refused.
    for (ns, svc) in [
        ("payments", "ledger"),
        (thun_twin.as_str(), "cart"),
        ("kube-system", "kube-dns"),
        ("tandem-tenant-thun", "steal"),
        ("shared", "cache2"),
        ("payments", "site2"),
    ] {
        assert!(
            import_of(&lugano, ns, svc).await.is_none(),
            "{ns}/{svc} imported"
        );
    }
    // The provider's own import is as it was: its cluster, its port, its endpoints only; its
    // export reports no conflict.
    let after = import_of(&lugano, "payments", "api").await.unwrap();
    assert_eq!(clusters(&after), ["lugano"]);
    assert_eq!(after.spec, own.spec);
    let sources: BTreeSet<String> = Api::<EndpointSlice>::namespaced(admin.clone(), "payments")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter_map(|s| {
            s.metadata
                .labels
                .as_ref()?
                .get(SOURCE_CLUSTER_LABEL)
                .cloned()
        })
        .collect();
    assert_eq!(sources, BTreeSet::from(["lugano".to_string()]));
    let own_export = Api::<ServiceExport>::namespaced(admin.clone(), "payments")
        .get("api")
        .await
        .unwrap();
    let c = own_export
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Conflict")
        .unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "NoConflicts")
    );
    // The other consumer's twin holds no import, and its shared export is still imported.
    let in_twin = Api::<ServiceImport>::namespaced(admin.clone(), &thun_twin)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(in_twin.items.is_empty());
    assert!(
        clusters(&import_of(&lugano, "shared", "cache").await.unwrap())
            .contains(&"thun".to_string())
    );
}
