//! What multi-cluster services write and read, as values: export records made from a Service
//! and its EndpointSlices, the properties the merge compares, the derived objects' names and
//! labels, and an import's EndpointSlices made from a record's slices (and back).

use std::collections::BTreeMap;
use std::sync::Arc;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use kube::Resource;
use serde_json::json;
use tandem_api::mcs::{
    ExportedEndpoint, ExportedServiceSpec, ExportedSlice, SERVICE_NAME_LABEL, SOURCE_CLUSTER_LABEL,
    ServiceExport, ServicePort,
};
use tandem_api::names;
use tandem_core::mcs::{ExportProperties, ExportedPort, ImportType};

pub(super) use tandem_api::names::{MCS_SLICE_MANAGER as SLICE_MANAGER, SLICE_MANAGED_BY_LABEL};
/// The manager of the EndpointSlices of a cluster's own Services.
pub(super) const KUBE_SLICE_MANAGER: &str = "endpointslice-controller.k8s.io";

/// On a ServiceImport of ours: the properties of each export it was last written from (the
/// merge's inputs), so that an export whose cluster cannot be read for a while keeps its
/// place — and its age — in the merge.
pub(super) const SOURCES_ANNOTATION: &str = "mcs.tandem.dev/sources";

/// An object's (namespace, name).
pub(super) type Key = (String, String);
/// This cluster's exports as records, by (namespace, name).
pub(super) type Records = BTreeMap<Key, ExportedServiceSpec>;

/// The name of the Service backing the import of `namespace/name`: `derived-` and a hash,
/// as the MCS reference implementation names it (a user's Service could only collide by
/// taking that exact name; Tandem never touches a Service it did not make).
pub fn derived_service_name(namespace: &str, name: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("{namespace}/{name}").as_bytes());
    let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    format!("derived-{hex}")
}

pub(super) fn label<'a, K: Resource>(obj: &'a K, key: &str) -> Option<&'a str> {
    obj.meta().labels.as_ref()?.get(key).map(String::as_str)
}

/// Whether Tandem made `obj`.
pub(super) fn is_ours<K: Resource>(obj: &K) -> bool {
    label(obj, names::MANAGED_BY_LABEL) == Some(names::MANAGED_BY)
}

pub(super) fn key_of<K: Resource>(obj: &K) -> Key {
    (
        obj.meta().namespace.clone().unwrap_or_default(),
        obj.meta().name.clone().unwrap_or_default(),
    )
}

/// Conditions equal but for their transition times.
pub(super) fn same_conditions(a: &[Condition], b: &[Condition]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            (&x.type_, &x.status, &x.reason, &x.message)
                == (&y.type_, &y.status, &y.reason, &y.message)
        })
}

/// The record of this cluster's export of `service`: endpoints outside our pod CIDR (host
/// network pods, pods we offloaded elsewhere) are left out, since no peer reaches them.
pub(super) fn record(
    me: &str,
    export: &ServiceExport,
    service: &Service,
    slices: &[Arc<EndpointSlice>],
    pod_cidr: Option<IpNet>,
) -> ExportedServiceSpec {
    let spec = service.spec.clone().unwrap_or_default();
    let headless = spec.cluster_ip.as_deref() == Some("None");
    let ports = spec
        .ports
        .iter()
        .flatten()
        .map(|p| ServicePort {
            name: p.name.clone().filter(|n| !n.is_empty()),
            protocol: Some(p.protocol.clone().unwrap_or_else(|| "TCP".into())),
            app_protocol: p.app_protocol.clone(),
            port: p.port,
        })
        .collect();
    let mut endpoint_slices: Vec<ExportedSlice> = slices
        .iter()
        .filter(|s| s.address_type == "IPv4" || s.address_type == "IPv6")
        .map(|s| ExportedSlice {
            ports: s.ports.iter().flatten().filter_map(slice_port).collect(),
            endpoints: s
                .endpoints
                .iter()
                .filter_map(|e| {
                    let addresses: Vec<String> = e
                        .addresses
                        .iter()
                        .filter(|a| {
                            pod_cidr.is_none_or(|c| {
                                a.parse::<std::net::IpAddr>()
                                    .is_ok_and(|ip| c.contains(&ip))
                            })
                        })
                        .cloned()
                        .collect();
                    (!addresses.is_empty()).then(|| ExportedEndpoint {
                        addresses,
                        hostname: e.hostname.clone(),
                        ready: e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true),
                    })
                })
                .collect(),
        })
        .filter(|s| !s.endpoints.is_empty())
        .collect();
    // Stable across the slices' order in the cache.
    endpoint_slices.sort_by(|a, b| {
        (a.endpoints.first().map(|e| &e.addresses)).cmp(&b.endpoints.first().map(|e| &e.addresses))
    });
    ExportedServiceSpec {
        cluster_id: me.to_string(),
        namespace: export.metadata.namespace.clone().unwrap_or_default(),
        service: export.metadata.name.clone().unwrap_or_default(),
        exported_at: export
            .metadata
            .creation_timestamp
            .clone()
            .unwrap_or(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
        type_: if headless { "Headless" } else { "ClusterSetIP" }.into(),
        ports,
        session_affinity: spec.session_affinity.clone(),
        session_affinity_timeout_seconds: spec
            .session_affinity_config
            .and_then(|c| c.client_ip?.timeout_seconds),
        endpoint_slices,
    }
}

/// An EndpointSlice's port as a record holds it.
pub(super) fn slice_port(p: &k8s_openapi::api::discovery::v1::EndpointPort) -> Option<ServicePort> {
    Some(ServicePort {
        name: p.name.clone().filter(|n| !n.is_empty()),
        protocol: Some(p.protocol.clone().unwrap_or_else(|| "TCP".into())),
        app_protocol: p.app_protocol.clone(),
        port: p.port?,
    })
}

/// One of our import's slices back as the slice of a record (its endpoints' own readiness is
/// what they serve: `ready` there also says whether their cluster is reachable).
pub(super) fn imported_slice(s: &EndpointSlice) -> ExportedSlice {
    ExportedSlice {
        ports: s.ports.iter().flatten().filter_map(slice_port).collect(),
        endpoints: s
            .endpoints
            .iter()
            .map(|e| ExportedEndpoint {
                addresses: e.addresses.clone(),
                hostname: e.hostname.clone(),
                ready: e
                    .conditions
                    .as_ref()
                    .and_then(|c| c.serving.or(c.ready))
                    .unwrap_or(true),
            })
            .collect(),
    }
}

/// What the merge compares of an export.
pub(super) fn properties(spec: &ExportedServiceSpec) -> ExportProperties {
    ExportProperties {
        cluster: spec.cluster_id.clone(),
        created: spec.exported_at.0.as_second(),
        import_type: if spec.type_ == "Headless" {
            ImportType::Headless
        } else {
            ImportType::ClusterSetIP
        },
        ports: spec
            .ports
            .iter()
            .map(|p| ExportedPort {
                name: p.name.clone(),
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                app_protocol: p.app_protocol.clone(),
                port: p.port,
            })
            .collect(),
        session_affinity: spec
            .session_affinity
            .clone()
            .unwrap_or_else(|| "None".into()),
        session_affinity_timeout: if spec.session_affinity.as_deref() == Some("ClientIP") {
            spec.session_affinity_timeout_seconds
        } else {
            None
        },
    }
}

pub(super) fn service_port(p: &ExportedPort) -> ServicePort {
    ServicePort {
        name: p.name.clone(),
        protocol: Some(p.protocol.clone()),
        app_protocol: p.app_protocol.clone(),
        port: p.port,
    }
}

/// The EndpointSlice `slice_name` of the import of `ns/service` for one slice of `cluster`'s
/// export: its endpoints ready only while they are and their cluster is `healthy`.
pub(super) fn endpoint_slice(
    (slice_name, ns, service): (&str, &str, &str),
    derived: &str,
    owner: &OwnerReference,
    (cluster, healthy): (&str, bool),
    slice: &ExportedSlice,
) -> EndpointSlice {
    let v6 = slice
        .endpoints
        .iter()
        .flat_map(|e| e.addresses.first())
        .any(|a| a.contains(':'));
    serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {
            "name": slice_name, "namespace": ns,
            "labels": {
                "kubernetes.io/service-name": derived,
                SLICE_MANAGED_BY_LABEL: SLICE_MANAGER,
                SERVICE_NAME_LABEL: service,
                SOURCE_CLUSTER_LABEL: cluster,
                names::MANAGED_BY_LABEL: names::MANAGED_BY,
            },
            "ownerReferences": [owner],
        },
        "addressType": if v6 { "IPv6" } else { "IPv4" },
        "endpoints": slice.endpoints.iter().map(|e| {
            let ready = e.ready && healthy;
            json!({
                "addresses": e.addresses,
                "hostname": e.hostname,
                "conditions": {"ready": ready, "serving": e.ready, "terminating": false},
            })
        }).collect::<Vec<_>>(),
        "ports": slice.ports.iter().map(|p| json!({
            "name": p.name.clone().unwrap_or_default(), "protocol": p.protocol,
            "appProtocol": p.app_protocol, "port": p.port,
        })).collect::<Vec<_>>(),
    }))
    .expect("a valid EndpointSlice")
}
