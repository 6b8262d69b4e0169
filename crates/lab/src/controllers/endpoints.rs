//! The EndpointSlice and Endpoints controllers: for every Service with a selector, the pods
//! with an IP that it selects, as EndpointSlices and as the legacy Endpoints object.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort as CorePort, EndpointSubset, Endpoints, ObjectReference, Pod,
    Service,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use tandem_api::client::{is_conflict, is_not_found};

use super::availability::is_ready;
use super::error::{Error, StepExt, drain, key, retry_after_error};

/// Label naming the Service an EndpointSlice belongs to.
pub const SERVICE_NAME: &str = "kubernetes.io/service-name";
/// Label naming the controller managing an EndpointSlice.
pub const MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
/// This controller's value of [`MANAGED_BY`].
pub const CONTROLLER_NAME: &str = "endpointslice-controller.k8s.io";
/// Endpoints per slice, kube's default --max-endpoints-per-slice.
const MAX_PER_SLICE: usize = 100;

/// Runs the EndpointSlice/Endpoints controller until its watches end.
pub async fn run(client: Client) {
    let controller = Controller::new(
        Api::<Service>::all(client.clone()),
        watcher::Config::default(),
    )
    .owns(
        Api::<EndpointSlice>::all(client.clone()),
        watcher::Config::default(),
    )
    .owns(
        Api::<Endpoints>::all(client.clone()),
        watcher::Config::default(),
    );
    let store = controller.store();
    // Every selector Service of the pod's namespace: a pod whose labels changed must also
    // leave the Services that selected it before.
    let controller = controller.watches(
        Api::<Pod>::all(client.clone()),
        watcher::Config::default(),
        move |pod: Pod| {
            let ns = pod.namespace();
            store
                .state()
                .iter()
                .filter(|svc| svc.namespace() == ns && selector_of(svc).is_some())
                .map(|svc| ObjectRef::from_obj(svc.as_ref()))
                .collect::<Vec<_>>()
        },
    );
    drain(
        "endpoints",
        controller.run(reconcile, retry_after_error("endpoints"), Arc::new(client)),
    )
    .await;
}

/// The Service's selector, if it selects pods at all (an empty selector, like none, means
/// the endpoints are managed by someone else).
fn selector_of(svc: &Service) -> Option<&BTreeMap<String, String>> {
    let spec = svc.spec.as_ref()?;
    if spec.type_.as_deref() == Some("ExternalName") {
        return None;
    }
    spec.selector.as_ref().filter(|s| !s.is_empty())
}

/// One pod as an endpoint: its resolved ports and conditions.
struct PodEndpoint<'a> {
    pod: &'a Pod,
    ip: String,
    /// The pod's hostname when its subdomain is this Service (DNS names the pod then).
    hostname: Option<String>,
    ports: Vec<EndpointPort>,
    ready: bool,
    serving: bool,
    terminating: bool,
}

/// The pods of `pods` the Service selects, with their ports resolved from targetPort
/// (named ports looked up in the pod's containers), sorted by pod name.
fn pod_endpoints<'a>(svc: &Service, pods: &'a [Pod]) -> Vec<PodEndpoint<'a>> {
    let Some(selector) = selector_of(svc) else {
        return Vec::new();
    };
    let spec = svc.spec.as_ref().expect("a selector implies a spec");
    let publish_not_ready = spec.publish_not_ready_addresses == Some(true);
    let mut out: Vec<PodEndpoint<'a>> = pods
        .iter()
        .filter(|pod| {
            let labels = pod.metadata.labels.as_ref();
            selector
                .iter()
                .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
        })
        .filter(|pod| {
            !matches!(
                pod.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        })
        .filter_map(|pod| {
            let ip = pod
                .status
                .as_ref()?
                .pod_ip
                .clone()
                .filter(|ip| ip.parse::<std::net::Ipv4Addr>().is_ok())?;
            let terminating = pod.metadata.deletion_timestamp.is_some();
            let serving = publish_not_ready || is_ready(pod);
            let pod_spec = pod.spec.as_ref();
            let hostname = pod_spec
                .filter(|s| s.subdomain.is_some() && s.subdomain == svc.metadata.name)
                .and_then(|s| s.hostname.clone())
                .filter(|h| !h.is_empty());
            Some(PodEndpoint {
                pod,
                ip,
                hostname,
                ports: resolve_ports(svc, pod),
                ready: publish_not_ready || (serving && !terminating),
                serving,
                terminating,
            })
        })
        .collect();
    out.sort_by_key(|e| e.pod.name_any());
    out
}

/// The Service's ports as this pod serves them; a named targetPort the pod does not
/// declare is left out, as kube does.
pub fn resolve_ports(svc: &Service, pod: &Pod) -> Vec<EndpointPort> {
    let ports = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_deref())
        .unwrap_or_default();
    ports
        .iter()
        .filter_map(|sp| {
            let protocol = sp.protocol.clone().unwrap_or_else(|| "TCP".into());
            let port = match sp.target_port.clone().unwrap_or(IntOrString::Int(sp.port)) {
                IntOrString::Int(p) => p,
                IntOrString::String(name) => {
                    pod.spec
                        .as_ref()?
                        .containers
                        .iter()
                        .flat_map(|c| c.ports.as_deref().unwrap_or_default())
                        .find(|cp| {
                            cp.name.as_deref() == Some(name.as_str())
                                && cp.protocol.as_deref().unwrap_or("TCP") == protocol
                        })?
                        .container_port
                }
            };
            Some(EndpointPort {
                name: Some(sp.name.clone().unwrap_or_default()),
                port: Some(port),
                protocol: Some(protocol),
                app_protocol: sp.app_protocol.clone(),
            })
        })
        .collect()
}

fn target_ref(pod: &Pod) -> ObjectReference {
    ObjectReference {
        kind: Some("Pod".into()),
        name: pod.metadata.name.clone(),
        namespace: pod.metadata.namespace.clone(),
        uid: pod.metadata.uid.clone(),
        ..Default::default()
    }
}

/// What the Service's EndpointSlices should hold: (ports, endpoints) per slice, pods with
/// the same resolved ports together, at most 100 a slice. A Service without ready pods
/// still gets one empty slice, as kube's placeholder.
pub fn desired_slices(svc: &Service, pods: &[Pod]) -> Vec<(Vec<EndpointPort>, Vec<Endpoint>)> {
    let mut groups: BTreeMap<String, (Vec<EndpointPort>, Vec<Endpoint>)> = BTreeMap::new();
    for pe in pod_endpoints(svc, pods) {
        let group = serde_json::to_string(&pe.ports).unwrap_or_default();
        let entry = groups
            .entry(group)
            .or_insert_with(|| (pe.ports.clone(), Vec::new()));
        entry.1.push(Endpoint {
            addresses: vec![pe.ip.clone()],
            conditions: Some(EndpointConditions {
                ready: Some(pe.ready),
                serving: Some(pe.serving),
                terminating: Some(pe.terminating),
            }),
            node_name: pe.pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            target_ref: Some(target_ref(pe.pod)),
            hostname: pe.hostname.clone(),
            ..Default::default()
        });
    }
    let mut slices: Vec<_> = groups
        .into_values()
        .flat_map(|(ports, endpoints)| {
            endpoints
                .chunks(MAX_PER_SLICE)
                .map(|chunk| (ports.clone(), chunk.to_vec()))
                .collect::<Vec<_>>()
        })
        .collect();
    if slices.is_empty() {
        slices.push((Vec::new(), Vec::new()));
    }
    slices
}

/// The legacy Endpoints subsets: Ready pods in addresses, the others in
/// notReadyAddresses; terminating pods are left out unless publishNotReadyAddresses.
pub fn desired_subsets(svc: &Service, pods: &[Pod]) -> Vec<EndpointSubset> {
    let mut groups: BTreeMap<String, EndpointSubset> = BTreeMap::new();
    for pe in pod_endpoints(svc, pods) {
        if pe.terminating && !pe.ready {
            continue;
        }
        let ports: Vec<CorePort> = pe
            .ports
            .iter()
            .map(|p| CorePort {
                name: p.name.clone().filter(|n| !n.is_empty()),
                port: p.port.unwrap_or_default(),
                protocol: p.protocol.clone(),
                app_protocol: p.app_protocol.clone(),
            })
            .collect();
        let subset = groups
            .entry(serde_json::to_string(&ports).unwrap_or_default())
            .or_insert_with(|| EndpointSubset {
                ports: Some(ports),
                ..Default::default()
            });
        let address = EndpointAddress {
            ip: pe.ip.clone(),
            hostname: pe.hostname.clone(),
            node_name: pe.pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            target_ref: Some(target_ref(pe.pod)),
        };
        let list = if pe.ready {
            &mut subset.addresses
        } else {
            &mut subset.not_ready_addresses
        };
        list.get_or_insert_with(Vec::new).push(address);
    }
    groups.into_values().collect()
}

async fn reconcile(svc: Arc<Service>, client: Arc<Client>) -> Result<Action, Error> {
    let object = key(&svc.metadata);
    let Some(ns) = svc.namespace() else {
        return Ok(Action::await_change());
    };
    if selector_of(&svc).is_none() || svc.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let name = svc.name_any();
    let pods = Api::<Pod>::namespaced((*client).clone(), &ns)
        .list(&ListParams::default())
        .await
        .step(&object, "listing pods")?
        .items;
    let owner = svc
        .controller_owner_ref(&())
        .expect("Service has a name and uid");

    let slices_api = Api::<EndpointSlice>::namespaced((*client).clone(), &ns);
    let mut existing = slices_api
        .list(&ListParams::default().labels(&format!(
            "{SERVICE_NAME}={name},{MANAGED_BY}={CONTROLLER_NAME}"
        )))
        .await
        .step(&object, "listing endpointslices")?
        .items;
    existing.sort_by_key(|s| s.name_any());
    let mut labels = svc.labels().clone();
    labels.insert(SERVICE_NAME.into(), name.clone());
    labels.insert(MANAGED_BY.into(), CONTROLLER_NAME.into());
    let desired = desired_slices(&svc, &pods);
    let keep = desired.len();
    for (i, (ports, endpoints)) in desired.into_iter().enumerate() {
        let mut slice = EndpointSlice {
            metadata: ObjectMeta {
                generate_name: Some(format!("{name}-")),
                namespace: Some(ns.clone()),
                labels: Some(labels.clone()),
                owner_references: Some(vec![owner.clone()]),
                ..Default::default()
            },
            address_type: "IPv4".into(),
            endpoints,
            ports: Some(ports),
        };
        match existing.get(i) {
            Some(current) => {
                let same = current.endpoints == slice.endpoints
                    && current.ports.clone().unwrap_or_default()
                        == slice.ports.clone().unwrap_or_default()
                    && current.metadata.labels.as_ref() == Some(&labels);
                if !same {
                    slice.metadata.name = current.metadata.name.clone();
                    slice.metadata.generate_name = None;
                    slice.metadata.resource_version = current.metadata.resource_version.clone();
                    slices_api
                        .replace(&current.name_any(), &PostParams::default(), &slice)
                        .await
                        .step(
                            &object,
                            format!("updating endpointslice {}", current.name_any()),
                        )?;
                }
            }
            None => {
                slices_api
                    .create(&PostParams::default(), &slice)
                    .await
                    .step(&object, "creating an endpointslice")?;
            }
        }
    }
    for surplus in existing.iter().skip(keep) {
        match slices_api
            .delete(&surplus.name_any(), &DeleteParams::default())
            .await
        {
            Err(e) if !is_not_found(&e) => {
                return Err(e).step(
                    &object,
                    format!("deleting endpointslice {}", surplus.name_any()),
                );
            }
            _ => {}
        }
    }

    let endpoints_api = Api::<Endpoints>::namespaced((*client).clone(), &ns);
    let subsets = desired_subsets(&svc, &pods);
    let mut endpoints = Endpoints {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(ns.clone()),
            labels: Some(svc.labels().clone()),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        subsets: Some(subsets),
    };
    match endpoints_api
        .get_opt(&name)
        .await
        .step(&object, "reading endpoints")?
    {
        None => match endpoints_api
            .create(&PostParams::default(), &endpoints)
            .await
        {
            // Created by a previous pass we did not see finish: the next pass compares.
            Err(e) if is_conflict(&e) => {
                return Ok(Action::requeue(std::time::Duration::from_millis(200)));
            }
            r => {
                r.step(&object, "creating endpoints")?;
            }
        },
        Some(current) => {
            let same = current.subsets.clone().unwrap_or_default()
                == endpoints.subsets.clone().unwrap_or_default()
                && current.metadata.owner_references == endpoints.metadata.owner_references;
            if !same {
                endpoints.metadata.resource_version = current.metadata.resource_version.clone();
                endpoints.metadata.labels = Some(
                    current
                        .labels()
                        .clone()
                        .into_iter()
                        .chain(svc.labels().clone())
                        .collect(),
                );
                endpoints_api
                    .replace(&name, &PostParams::default(), &endpoints)
                    .await
                    .step(&object, "updating endpoints")?;
            }
        }
    }
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, app: &str, ip: Option<&str>, ready: bool, terminating: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": name,
                "namespace": "ns",
                "uid": format!("uid-{name}"),
                "labels": {"app": app},
                "deletionTimestamp": terminating.then_some("2026-01-01T00:00:00Z"),
            },
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "ports": [
                {"name": "http", "containerPort": 8080},
                {"name": "dns", "containerPort": 5353, "protocol": "UDP"},
            ]}]},
            "status": {
                "phase": "Running",
                "podIP": ip,
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
            },
        }))
        .unwrap()
    }

    fn service(ports: serde_json::Value, publish_not_ready: bool) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns"},
            "spec": {"selector": {"app": "web"}, "ports": ports, "publishNotReadyAddresses": publish_not_ready},
        }))
        .unwrap()
    }

    #[test]
    fn target_ports_resolve_by_number_name_and_protocol() {
        // (service port, resolved (name, port, protocol) or None when the pod lacks it)
        let cases = [
            (json!({"name": "a", "port": 80}), Some(("a", 80, "TCP"))),
            (
                json!({"name": "a", "port": 80, "targetPort": 9090}),
                Some(("a", 9090, "TCP")),
            ),
            (
                json!({"name": "a", "port": 80, "targetPort": "http"}),
                Some(("a", 8080, "TCP")),
            ),
            (
                json!({"name": "a", "port": 53, "targetPort": "dns", "protocol": "UDP"}),
                Some(("a", 5353, "UDP")),
            ),
            // The pod's `dns` port is UDP: a TCP service port does not match it.
            (json!({"name": "a", "port": 53, "targetPort": "dns"}), None),
            (
                json!({"name": "a", "port": 80, "targetPort": "missing"}),
                None,
            ),
        ];
        let p = pod("p", "web", Some("10.0.0.1"), true, false);
        for (port, want) in cases {
            let got = resolve_ports(&service(json!([port.clone()]), false), &p);
            let got = got.first().map(|e| {
                (
                    e.name.clone().unwrap(),
                    e.port.unwrap(),
                    e.protocol.clone().unwrap(),
                )
            });
            let want = want.map(|(n, p, proto)| (n.to_string(), p, proto.to_string()));
            assert_eq!(got, want, "{port}");
        }
    }

    #[test]
    fn endpoints_list_selected_pods_with_an_ip_by_readiness() {
        let pods = [
            pod("ready", "web", Some("10.0.0.1"), true, false),
            pod("starting", "web", Some("10.0.0.2"), false, false),
            pod("leaving", "web", Some("10.0.0.3"), true, true),
            pod("no-ip", "web", None, true, false),
            pod("ipv6", "web", Some("fd00::1"), true, false),
            pod("other", "db", Some("10.0.0.4"), true, false),
        ];
        // (publishNotReadyAddresses, slice endpoints (pod, ready, serving, terminating),
        //  Endpoints (ready, not ready))
        let cases = [
            (
                false,
                vec![
                    ("leaving", false, true, true),
                    ("ready", true, true, false),
                    ("starting", false, false, false),
                ],
                (vec!["ready"], vec!["starting"]),
            ),
            (
                true,
                vec![
                    ("leaving", true, true, true),
                    ("ready", true, true, false),
                    ("starting", true, true, false),
                ],
                (vec!["leaving", "ready", "starting"], vec![]),
            ),
        ];
        for (publish, want_slice, want_endpoints) in cases {
            let svc = service(
                json!([{"name": "http", "port": 80, "targetPort": "http"}]),
                publish,
            );
            let slices = desired_slices(&svc, &pods);
            assert_eq!(slices.len(), 1, "publish={publish}");
            let got: Vec<_> = slices[0]
                .1
                .iter()
                .map(|e| {
                    let c = e.conditions.clone().unwrap();
                    (
                        e.target_ref.clone().unwrap().name.unwrap(),
                        c.ready.unwrap(),
                        c.serving.unwrap(),
                        c.terminating.unwrap(),
                    )
                })
                .collect();
            let want: Vec<_> = want_slice
                .iter()
                .map(|(n, r, s, t)| (n.to_string(), *r, *s, *t))
                .collect();
            assert_eq!(got, want, "slice, publish={publish}");
            let subsets = desired_subsets(&svc, &pods);
            let names = |list: Option<&Vec<EndpointAddress>>| -> Vec<String> {
                list.map(|l| {
                    l.iter()
                        .map(|a| a.target_ref.clone().unwrap().name.unwrap())
                        .collect()
                })
                .unwrap_or_default()
            };
            let got = (
                names(subsets[0].addresses.as_ref()),
                names(subsets[0].not_ready_addresses.as_ref()),
            );
            let want = (
                want_endpoints
                    .0
                    .iter()
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>(),
                want_endpoints
                    .1
                    .iter()
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>(),
            );
            assert_eq!(got, want, "endpoints, publish={publish}");
        }
    }

    #[test]
    fn pods_in_the_service_subdomain_carry_their_hostname() {
        let svc = service(json!([{"name": "http", "port": 80}]), false);
        // (hostname, subdomain, expected hostname on the endpoint)
        let cases = [
            (Some("db-0"), Some("web"), Some("db-0")),
            (Some("db-0"), Some("other"), None),
            (Some("db-0"), None, None),
            (None, Some("web"), None),
        ];
        for (hostname, subdomain, want) in cases {
            let mut p = pod("p", "web", Some("10.0.0.1"), true, false);
            let spec = p.spec.as_mut().unwrap();
            spec.hostname = hostname.map(String::from);
            spec.subdomain = subdomain.map(String::from);
            let slices = desired_slices(&svc, &[p.clone()]);
            assert_eq!(
                slices[0].1[0].hostname.as_deref(),
                want,
                "{hostname:?} in {subdomain:?}"
            );
            let subsets = desired_subsets(&svc, &[p]);
            let address = &subsets[0].addresses.as_ref().unwrap()[0];
            assert_eq!(
                address.hostname.as_deref(),
                want,
                "{hostname:?} in {subdomain:?}"
            );
        }
    }

    #[test]
    fn slices_hold_at_most_100_endpoints_and_one_placeholder_when_empty() {
        let svc = service(json!([{"name": "http", "port": 80}]), false);
        let pods: Vec<Pod> = (0..250)
            .map(|i| {
                pod(
                    &format!("p{i:03}"),
                    "web",
                    Some(&format!("10.0.{}.{}", i / 200, i % 200 + 1)),
                    true,
                    false,
                )
            })
            .collect();
        let sizes: Vec<usize> = desired_slices(&svc, &pods)
            .iter()
            .map(|s| s.1.len())
            .collect();
        assert_eq!(sizes, vec![100, 100, 50]);
        let empty = desired_slices(&svc, &[]);
        assert_eq!(empty.len(), 1);
        assert!(empty[0].1.is_empty());
        assert!(desired_subsets(&svc, &[]).is_empty());
    }
}
