//! A Service's EndpointSlices and Endpoints list exactly the selected pods with an IP,
//! Ready ones apart from the others, with ports resolved from targetPort.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

use super::common::{Cluster, eventually, set_pod_status};

async fn pod(client: &kube::Client, name: &str, app: &str, node: Option<&str>) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "pg", "image": "postgres", "ports": [{"name": "pg", "containerPort": 5432}]}],
        },
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), "data")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

/// Slice endpoints as pod name -> (ip, ready, serving, terminating).
type SliceView = BTreeMap<String, (String, bool, bool, bool)>;

async fn slice_view(client: &kube::Client) -> Option<(SliceView, Vec<(String, i32)>)> {
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), "data")
        .list(&ListParams::default().labels("kubernetes.io/service-name=db"))
        .await
        .unwrap()
        .items;
    let mut view = SliceView::new();
    let mut ports = Vec::new();
    for s in &slices {
        let labels = s.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels
                .get("endpointslice.kubernetes.io/managed-by")
                .map(String::as_str),
            Some("endpointslice-controller.k8s.io")
        );
        assert_eq!(s.address_type, "IPv4");
        let owner = &s.metadata.owner_references.as_ref()?[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str()),
            ("Service", "db")
        );
        for e in &s.endpoints {
            let c = e.conditions.clone().unwrap_or_default();
            let target = e.target_ref.clone()?;
            assert_eq!(target.kind.as_deref(), Some("Pod"));
            view.insert(
                target.name?,
                (e.addresses[0].clone(), c.ready?, c.serving?, c.terminating?),
            );
        }
        if !s.endpoints.is_empty() {
            ports = s
                .ports
                .clone()?
                .into_iter()
                .map(|p| (p.name.unwrap_or_default(), p.port.unwrap_or_default()))
                .collect();
            ports.sort();
        }
    }
    Some((view, ports))
}

/// (ready addresses, not-ready addresses) of the Endpoints object, by pod name.
async fn endpoints_view(client: &kube::Client) -> Option<(Vec<String>, Vec<String>)> {
    let ep = Api::<Endpoints>::namespaced(client.clone(), "data")
        .get_opt("db")
        .await
        .unwrap()?;
    let (mut ready, mut not_ready) = (Vec::new(), Vec::new());
    for subset in ep.subsets.unwrap_or_default() {
        for a in subset.addresses.unwrap_or_default() {
            ready.push(a.target_ref?.name?);
        }
        for a in subset.not_ready_addresses.unwrap_or_default() {
            not_ready.push(a.target_ref?.name?);
        }
    }
    ready.sort();
    not_ready.sort();
    Some((ready, not_ready))
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_endpoints_follow_pod_readiness_and_go_with_the_service() {
    let cluster = Cluster::start().await;
    let client = &cluster.client;
    cluster.namespace("data").await;
    pod(client, "db-ready", "db", Some("node-1")).await;
    pod(client, "db-starting", "db", Some("node-2")).await;
    pod(client, "db-no-ip", "db", None).await;
    pod(client, "cache", "cache", None).await;
    set_pod_status(client, "data", "db-ready", "10.1.0.1", true).await;
    set_pod_status(client, "data", "db-starting", "10.1.0.2", false).await;
    set_pod_status(client, "data", "cache", "10.1.0.3", true).await;
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "db"},
        "spec": {"selector": {"app": "db"}, "ports": [
            {"name": "sql", "port": 5432, "targetPort": "pg"},
            {"name": "metrics", "port": 9000, "targetPort": 9187},
        ]},
    }))
    .unwrap();
    Api::<Service>::namespaced(client.clone(), "data")
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();

    let want = SliceView::from([
        (
            "db-ready".to_string(),
            ("10.1.0.1".to_string(), true, true, false),
        ),
        (
            "db-starting".to_string(),
            ("10.1.0.2".to_string(), false, false, false),
        ),
    ]);
    let (_, ports) = eventually("slices list db-ready and db-starting", || async {
        slice_view(client).await.filter(|(view, _)| *view == want)
    })
    .await;
    assert_eq!(
        ports,
        vec![("metrics".to_string(), 9187), ("sql".to_string(), 5432)],
        "named targetPort resolved from the pod"
    );
    eventually(
        "endpoints: db-ready ready, db-starting not ready",
        || async {
            endpoints_view(client)
                .await
                .filter(|v| *v == (names(&["db-ready"]), names(&["db-starting"])))
        },
    )
    .await;
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), "data")
        .list(&ListParams::default().labels("kubernetes.io/service-name=db"))
        .await
        .unwrap();
    let node = slices
        .items
        .iter()
        .flat_map(|s| &s.endpoints)
        .find(|e| e.addresses[0] == "10.1.0.1")
        .and_then(|e| e.node_name.clone());
    assert_eq!(node.as_deref(), Some("node-1"));

    // The pod becomes Ready; the other one is deleted and stays terminating on its node.
    set_pod_status(client, "data", "db-starting", "10.1.0.2", true).await;
    Api::<Pod>::namespaced(client.clone(), "data")
        .delete("db-ready", &DeleteParams::default())
        .await
        .unwrap();
    let want = SliceView::from([
        (
            "db-ready".to_string(),
            ("10.1.0.1".to_string(), false, true, true),
        ),
        (
            "db-starting".to_string(),
            ("10.1.0.2".to_string(), true, true, false),
        ),
    ]);
    eventually(
        "slices: db-ready terminating, db-starting ready",
        || async { slice_view(client).await.filter(|(view, _)| *view == want) },
    )
    .await;
    eventually("endpoints: only db-starting, ready", || async {
        endpoints_view(client)
            .await
            .filter(|v| *v == (names(&["db-starting"]), vec![]))
    })
    .await;

    Api::<Service>::namespaced(client.clone(), "data")
        .delete("db", &DeleteParams::default())
        .await
        .unwrap();
    eventually("slices and endpoints deleted with the service", || async {
        let slices = Api::<EndpointSlice>::namespaced(client.clone(), "data")
            .list(&ListParams::default().labels("kubernetes.io/service-name=db"))
            .await
            .unwrap();
        let ep = Api::<Endpoints>::namespaced(client.clone(), "data")
            .get_opt("db")
            .await
            .unwrap();
        (slices.items.is_empty() && ep.is_none()).then_some(())
    })
    .await;
}
