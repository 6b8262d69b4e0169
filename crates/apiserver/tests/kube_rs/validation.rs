//! Field formats of built-in kinds that kube-apiserver checks: quantities (400 when not a
//! quantity at all, 422 when negative or a request exceeds its limit), container names,
//! ports and restart policies. Each refusal names the field; valid objects still pass.

use serde_json::{Value, json};

use super::common::{Cluster, api_status, code_of};

/// A pod whose first container is `container` merged over a valid one.
fn pod(name: &str, container: Value, spec: Value) -> Value {
    let mut c = json!({"name": "web", "image": "nginx"});
    merge(&mut c, container);
    let mut s = json!({"containers": [c]});
    merge(&mut s, spec);
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": s})
}

/// A Deployment whose pod template is `pod`'s spec.
fn deployment(name: &str, container: Value, spec: Value) -> Value {
    let template = pod(name, container, spec)["spec"].clone();
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": template}},
    })
}

fn quota(name: &str, hard: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name},
           "spec": {"hard": hard}})
}

fn node(name: &str, status: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "status": status})
}

fn merge(into: &mut Value, from: Value) {
    if let (Some(into), Value::Object(from)) = (into.as_object_mut(), from) {
        into.extend(from);
    }
}

/// Where `obj` is created (POST) and read back (GET).
fn collection(obj: &Value) -> &'static str {
    match obj["kind"].as_str().unwrap() {
        "Pod" => "/api/v1/namespaces/default/pods",
        "Deployment" => "/apis/apps/v1/namespaces/default/deployments",
        "ResourceQuota" => "/api/v1/namespaces/default/resourcequotas",
        "Node" => "/api/v1/nodes",
        other => panic!("no collection for {other}"),
    }
}

async fn create(client: &kube::Client, obj: &Value) -> kube::Result<Value> {
    let request = http::Request::post(collection(obj))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(obj).unwrap())
        .unwrap();
    client.request::<Value>(request).await
}

async fn get(client: &kube::Client, obj: &Value) -> kube::Result<Value> {
    let name = obj["metadata"]["name"].as_str().unwrap();
    let request = http::Request::get(format!("{}/{name}", collection(obj)))
        .body(Vec::new())
        .unwrap();
    client.request::<Value>(request).await
}

const NOT_A_QUANTITY: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";

#[tokio::test]
async fn malformed_fields_of_built_in_kinds_are_refused_by_name() {
    let cluster = Cluster::start().await;
    let requests = |r: Value| json!({"resources": {"requests": r}});
    let cases: Vec<(&str, Value, u16, String)> = vec![
        (
            "a cpu request that is not a quantity",
            pod("p1", requests(json!({"cpu": "abc"})), json!({})),
            400,
            format!("Pod in version \"v1\" cannot be handled as a Pod: spec.containers[0].resources.requests[cpu]: {NOT_A_QUANTITY}"),
        ),
        (
            "a memory limit of an init container that is not a quantity",
            pod(
                "p2",
                json!({}),
                json!({"initContainers": [{"name": "init", "image": "busybox",
                                           "resources": {"limits": {"memory": "1 Gi"}}}]}),
            ),
            400,
            format!("spec.initContainers[0].resources.limits[memory]: {NOT_A_QUANTITY}"),
        ),
        (
            "a quantity in a Deployment's pod template",
            deployment("d1", requests(json!({"memory": "lots"})), json!({})),
            400,
            format!("Deployment in version \"v1\" cannot be handled as a Deployment: spec.template.spec.containers[0].resources.requests[memory]: {NOT_A_QUANTITY}"),
        ),
        (
            "a quota's hard limit",
            quota("q1", json!({"pods": "ten"})),
            400,
            format!("spec.hard[pods]: {NOT_A_QUANTITY}"),
        ),
        (
            "a node's capacity",
            node("n1", json!({"capacity": {"cpu": "4 cores"}})),
            400,
            format!("status.capacity[cpu]: {NOT_A_QUANTITY}"),
        ),
        (
            "a negative cpu request",
            pod("p3", requests(json!({"cpu": "-1"})), json!({})),
            422,
            "spec.containers[0].resources.requests[cpu]: Invalid value: \"-1\": must be greater than or equal to 0".into(),
        ),
        (
            "a request above its limit",
            pod(
                "p4",
                json!({"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1500m"}}}),
                json!({}),
            ),
            422,
            "spec.containers[0].resources.requests: Invalid value: \"2\": must be less than or equal to cpu limit of 1500m".into(),
        ),
        (
            "an extended resource requested below its limit",
            pod(
                "p5",
                json!({"resources": {"requests": {"example.com/gpu": "1"},
                                     "limits": {"example.com/gpu": "2"}}}),
                json!({}),
            ),
            422,
            "spec.containers[0].resources.requests: Invalid value: \"1\": must be equal to example.com/gpu limit of 2".into(),
        ),
        (
            "a negative memory limit in a Deployment's pod template",
            deployment("d2", json!({"resources": {"limits": {"memory": "-1Gi"}}}), json!({})),
            422,
            "spec.template.spec.containers[0].resources.limits[memory]: Invalid value: \"-1Gi\": must be greater than or equal to 0".into(),
        ),
        (
            "a negative quota",
            quota("q2", json!({"requests.cpu": "-1"})),
            422,
            "spec.hard[requests.cpu]: Invalid value: \"-1\": must be greater than or equal to 0".into(),
        ),
        (
            "a negative allocatable",
            node("n2", json!({"allocatable": {"memory": "-1Mi"}})),
            422,
            "status.allocatable.memory: Invalid value: \"-1Mi\": must be greater than or equal to 0".into(),
        ),
        (
            "a misspelt container resource",
            pod("p12", requests(json!({"cpus": "1"})), json!({})),
            422,
            "spec.containers[0].resources.requests[cpus]: Invalid value: \"cpus\": must be a standard resource for containers".into(),
        ),
        (
            "a fraction of a counted resource",
            quota("q3", json!({"pods": "1.5"})),
            422,
            "spec.hard[pods]: Invalid value: \"1.5\": must be an integer".into(),
        ),
        (
            "a fraction of an extended resource",
            pod(
                "p13",
                json!({"resources": {"requests": {"example.com/gpu": "500m"},
                                     "limits": {"example.com/gpu": "500m"}}}),
                json!({}),
            ),
            422,
            "spec.containers[0].resources.limits[example.com/gpu]: Invalid value: \"500m\": must be an integer".into(),
        ),
        (
            "a container name that is not a DNS-1123 label",
            pod("p6", json!({"name": "Web_1"}), json!({})),
            422,
            "spec.containers[0].name: Invalid value: \"Web_1\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'".into(),
        ),
        (
            "a container port out of range",
            pod("p7", json!({"ports": [{"containerPort": 70000}]}), json!({})),
            422,
            "spec.containers[0].ports[0].containerPort: Invalid value: 70000: must be between 1 and 65535, inclusive".into(),
        ),
        (
            "a container port of zero",
            pod("p8", json!({"ports": [{"containerPort": 0}]}), json!({})),
            422,
            "spec.containers[0].ports[0].containerPort: Required value".into(),
        ),
        (
            "a host port out of range",
            pod("p9", json!({"ports": [{"containerPort": 80, "hostPort": 65536}]}), json!({})),
            422,
            "spec.containers[0].ports[0].hostPort: Invalid value: 65536: must be between 1 and 65535, inclusive".into(),
        ),
        (
            "a port protocol kube does not know",
            pod("p10", json!({"ports": [{"containerPort": 80, "protocol": "HTTP"}]}), json!({})),
            422,
            "spec.containers[0].ports[0].protocol: Unsupported value: \"HTTP\": supported values: \"SCTP\", \"TCP\", \"UDP\"".into(),
        ),
        (
            "a pod restart policy kube does not know",
            pod("p11", json!({}), json!({"restartPolicy": "Sometimes"})),
            422,
            "spec.restartPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"OnFailure\", \"Never\"".into(),
        ),
        (
            "a Deployment whose pods would not restart",
            deployment("d3", json!({}), json!({"restartPolicy": "Never"})),
            422,
            "spec.template.spec.restartPolicy: Unsupported value: \"Never\": supported values: \"Always\"".into(),
        ),
    ];
    for (what, obj, code, message) in &cases {
        let status = api_status(create(&cluster.client, obj).await);
        assert_eq!(status.code, *code, "{what}: {status:?}");
        assert!(
            status.message.contains(message.as_str()),
            "{what}: the message names the field: got {:?}, want {message:?}",
            status.message
        );
        assert_eq!(
            code_of(get(&cluster.client, obj).await),
            404,
            "{what}: nothing stored"
        );
    }

    // Valid objects, quantities written as strings or bare JSON numbers, still pass.
    let valid = [
        pod(
            "ok-pod",
            json!({"name": "web-1",
                   "resources": {"requests": {"cpu": "100m", "memory": 64},
                                 "limits": {"cpu": 1, "memory": "128Mi",
                                            "example.com/gpu": "1"}},
                   "ports": [{"containerPort": 8080, "hostPort": 80, "protocol": "UDP"}]}),
            json!({"restartPolicy": "OnFailure",
                   "initContainers": [{"name": "init", "image": "busybox",
                                       "resources": {"requests": {"cpu": "0.5"}}}]}),
        ),
        deployment(
            "ok-deploy",
            json!({"resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                 "limits": {"cpu": "1000m", "memory": "1Gi"}}}),
            json!({}),
        ),
        quota(
            "ok-quota",
            json!({"pods": "10", "requests.cpu": "2", "limits.memory": "4Gi"}),
        ),
        node(
            "ok-node",
            json!({"capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                               "allocatable": {"cpu": "3500m", "memory": "7Gi"}}),
        ),
    ];
    for obj in &valid {
        let name = &obj["metadata"]["name"];
        create(&cluster.client, obj)
            .await
            .unwrap_or_else(|e| panic!("{name} is valid: {e}"));
        get(&cluster.client, obj).await.expect("stored");
    }
}

/// NodePort and LoadBalancer Services get node ports as kube-apiserver hands them out: from
/// 30000–32767, kept across updates that name none, never one another Service holds, and
/// dropped when the Service turns ClusterIP.
#[tokio::test]
async fn node_ports_are_allocated_kept_unique_and_released() {
    use k8s_openapi::api::core::v1::Service;
    use kube::api::{Api, Patch, PatchParams, PostParams};
    let cluster = Cluster::start().await;
    let services: Api<Service> = Api::namespaced(cluster.client.clone(), "default");
    let svc = |name: &str, spec: Value| -> Service {
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
    };
    let node_ports = |s: &Service| -> Vec<i32> {
        let ports = s
            .spec
            .as_ref()
            .and_then(|s| s.ports.clone())
            .unwrap_or_default();
        ports.iter().filter_map(|p| p.node_port).collect()
    };
    let pp = PostParams::default();
    let lb = services
        .create(
            &pp,
            &svc(
                "lb",
                json!({"type": "LoadBalancer", "ports": [
            {"name": "wg", "port": 51820, "protocol": "UDP"},
            {"name": "http", "port": 80}]}),
            ),
        )
        .await
        .unwrap();
    let lb_ports = node_ports(&lb);
    assert_eq!(lb_ports.len(), 2, "{lb:?}");
    assert!(lb_ports.iter().all(|p| (30000..=32767).contains(p)) && lb_ports[0] != lb_ports[1]);
    let spec = lb.spec.as_ref().unwrap();
    assert_eq!(spec.external_traffic_policy.as_deref(), Some("Cluster"));
    assert_eq!(spec.allocate_load_balancer_node_ports, Some(true));

    // Another Service asking for a port already held is refused, naming the field.
    let taken = services
        .create(
            &pp,
            &svc(
                "np",
                json!({"type": "NodePort",
            "ports": [{"port": 53, "protocol": "UDP", "nodePort": lb_ports[0]}]}),
            ),
        )
        .await;
    let status = api_status(taken);
    assert_eq!(status.code, 422);
    assert!(
        status.message.contains("spec.ports[0].nodePort")
            && status
                .message
                .contains("provided port is already allocated"),
        "{}",
        status.message
    );
    let outside = services
        .create(
            &pp,
            &svc(
                "np",
                json!({"type": "NodePort", "ports": [{"port": 53, "nodePort": 8080}]}),
            ),
        )
        .await;
    assert!(
        api_status(outside)
            .message
            .contains("not in the valid range")
    );
    let np = services
        .create(
            &pp,
            &svc("np", json!({"type": "NodePort", "ports": [{"port": 53}]})),
        )
        .await
        .unwrap();
    assert!(!lb_ports.contains(&node_ports(&np)[0]), "a port of its own");

    // An apply that names no node port keeps the ones allocated.
    let applied = services
        .patch(
            "lb",
            &PatchParams::apply("test").force(),
            &Patch::Apply(
                json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "lb"},
                "spec": {"type": "LoadBalancer", "ports": [
                    {"name": "wg", "port": 51820, "protocol": "UDP"},
                    {"name": "http", "port": 80}]}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(node_ports(&applied), lb_ports);
    // ClusterIP holds none, and the port is free for another Service again.
    let plain = services
        .patch(
            "lb",
            &PatchParams::apply("test").force(),
            &Patch::Apply(
                json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "lb"},
                "spec": {"type": "ClusterIP", "ports": [{"name": "http", "port": 80}]}}),
            ),
        )
        .await
        .unwrap();
    assert!(node_ports(&plain).is_empty(), "{plain:?}");
    services
        .create(
            &pp,
            &svc(
                "again",
                json!({"type": "NodePort",
            "ports": [{"port": 53, "nodePort": lb_ports[0]}]}),
            ),
        )
        .await
        .expect("a released port is free again");
}
