//! Server-side printing: `meta.k8s.io/v1` Table responses, the columns `kubectl get` shows.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::registry::ResourceInfo;
use crate::request::Query;
use crate::store::Doc;

struct Column {
    name: &'static str,
    kind: &'static str,
    priority: u8,
}

const fn col(name: &'static str) -> Column {
    Column {
        name,
        kind: "string",
        priority: 0,
    }
}
const fn int(name: &'static str) -> Column {
    Column {
        name,
        kind: "integer",
        priority: 0,
    }
}
const fn wide(name: &'static str) -> Column {
    Column {
        name,
        kind: "string",
        priority: 1,
    }
}

/// Renders objects as a Table with the columns kubectl shows for their kind.
pub fn render(
    res: &ResourceInfo,
    docs: &[Arc<Doc>],
    query: &Query,
    rv: u64,
    continue_token: Option<&str>,
) -> Value {
    let include = query
        .get("includeObject")
        .map(String::as_str)
        .unwrap_or("Metadata");
    let custom_columns = res.custom.as_ref().map(|c| c.printer_columns.clone());
    let (columns, custom): (Vec<Value>, bool) = match &custom_columns {
        Some(cols) if !cols.is_empty() => {
            let mut defs = vec![json!({"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace.", "priority": 0})];
            for c in cols {
                defs.push(json!({
                    "name": c["name"], "type": c["type"].as_str().unwrap_or("string"),
                    "format": c["format"].as_str().unwrap_or(""),
                    "description": c["description"].as_str().unwrap_or(""),
                    "priority": c["priority"].as_i64().unwrap_or(0),
                }));
            }
            if !cols.iter().any(|c| c["jsonPath"] == ".metadata.creationTimestamp") {
                defs.push(json!({"name": "Age", "type": "date", "format": "", "description": "", "priority": 0}));
            }
            (defs, true)
        }
        _ => (
            builtin_columns(&res.kind)
                .iter()
                .map(|c| {
                    json!({"name": c.name, "type": c.kind, "format": if c.name == "Name" { "name" } else { "" },
                           "description": "", "priority": c.priority})
                })
                .collect(),
            false,
        ),
    };
    let rows: Vec<Value> = docs
        .iter()
        .map(|doc| {
            let obj = doc.value();
            let cells = if custom {
                custom_cells(&obj, custom_columns.as_deref().unwrap_or_default())
            } else {
                builtin_cells(&res.kind, &obj)
            };
            let mut row = json!({"cells": cells});
            match include {
                "None" => {}
                "Object" => row["object"] = obj,
                _ => {
                    row["object"] = json!({
                        "kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                        "metadata": obj["metadata"],
                    })
                }
            }
            row
        })
        .collect();
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = continue_token {
        meta["continue"] = json!(c);
    }
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "columnDefinitions": columns, "rows": rows})
}

fn custom_cells(obj: &Value, cols: &[Value]) -> Vec<Value> {
    let mut cells = vec![obj["metadata"]["name"].clone()];
    for c in cols {
        let path = c["jsonPath"].as_str().unwrap_or("");
        let values = tandem_apimachinery::jsonpath::evaluate(path, obj).unwrap_or_default();
        let cell = match (c["type"].as_str(), values.as_slice()) {
            (_, []) => Value::Null,
            (Some("date"), [Value::String(t)]) => json!(age(t)),
            (Some("integer" | "number" | "boolean"), [v]) => v.clone(),
            // kube-apiserver prints the first match only.
            _ => json!(tandem_apimachinery::jsonpath::format_cell(&values[..1])),
        };
        cells.push(cell);
    }
    if !cols
        .iter()
        .any(|c| c["jsonPath"] == ".metadata.creationTimestamp")
    {
        cells.push(json!(age(obj["metadata"]["creationTimestamp"]
            .as_str()
            .unwrap_or(""))));
    }
    cells
}

fn builtin_columns(kind: &str) -> Vec<Column> {
    match kind {
        "Pod" => vec![
            col("Name"),
            col("Ready"),
            col("Status"),
            col("Restarts"),
            col("Age"),
            wide("IP"),
            wide("Node"),
            wide("Nominated Node"),
            wide("Readiness Gates"),
        ],
        "Node" => vec![
            col("Name"),
            col("Status"),
            col("Roles"),
            col("Age"),
            col("Version"),
            wide("Internal-IP"),
            wide("External-IP"),
            wide("OS-Image"),
            wide("Kernel-Version"),
            wide("Container-Runtime"),
        ],
        "Namespace" => vec![col("Name"), col("Status"), col("Age")],
        "Deployment" => vec![
            col("Name"),
            col("Ready"),
            int("Up-to-date"),
            int("Available"),
            col("Age"),
            wide("Containers"),
            wide("Images"),
            wide("Selector"),
        ],
        "ReplicaSet" => vec![
            col("Name"),
            int("Desired"),
            int("Current"),
            int("Ready"),
            col("Age"),
            wide("Containers"),
            wide("Images"),
            wide("Selector"),
        ],
        "Service" => vec![
            col("Name"),
            col("Type"),
            col("Cluster-IP"),
            col("External-IP"),
            col("Port(s)"),
            col("Age"),
            wide("Selector"),
        ],
        "ConfigMap" => vec![col("Name"), int("Data"), col("Age")],
        "Secret" => vec![col("Name"), col("Type"), int("Data"), col("Age")],
        "ServiceAccount" => vec![col("Name"), int("Secrets"), col("Age")],
        "Endpoints" => vec![col("Name"), col("Endpoints"), col("Age")],
        "EndpointSlice" => vec![
            col("Name"),
            col("AddressType"),
            col("Ports"),
            col("Endpoints"),
            col("Age"),
        ],
        "Event" => vec![
            col("Last Seen"),
            col("Type"),
            col("Reason"),
            col("Object"),
            col("Message"),
        ],
        "Lease" => vec![col("Name"), col("Holder"), col("Age")],
        "CertificateSigningRequest" => vec![
            col("Name"),
            col("Age"),
            col("SignerName"),
            col("Requestor"),
            col("RequestedDuration"),
            col("Condition"),
        ],
        "CustomResourceDefinition" => vec![col("Name"), col("Created At")],
        "RoleBinding" | "ClusterRoleBinding" => vec![
            col("Name"),
            col("Role"),
            col("Age"),
            wide("Users"),
            wide("Groups"),
            wide("ServiceAccounts"),
        ],
        "Job" => vec![
            col("Name"),
            col("Status"),
            col("Completions"),
            col("Duration"),
            col("Age"),
            wide("Containers"),
            wide("Images"),
            wide("Selector"),
        ],
        "CronJob" => vec![
            col("Name"),
            col("Schedule"),
            col("Timezone"),
            col("Suspend"),
            int("Active"),
            col("Last Schedule"),
            col("Age"),
            wide("Containers"),
            wide("Images"),
            wide("Selector"),
        ],
        "StatefulSet" => vec![
            col("Name"),
            col("Ready"),
            col("Age"),
            wide("Containers"),
            wide("Images"),
        ],
        "DaemonSet" => vec![
            col("Name"),
            int("Desired"),
            int("Current"),
            int("Ready"),
            int("Up-to-date"),
            int("Available"),
            col("Node Selector"),
            col("Age"),
            wide("Containers"),
            wide("Images"),
            wide("Selector"),
        ],
        "ControllerRevision" => vec![col("Name"), col("Controller"), int("Revision"), col("Age")],
        "PersistentVolumeClaim" => vec![
            col("Name"),
            col("Status"),
            col("Volume"),
            col("Capacity"),
            col("Access Modes"),
            col("StorageClass"),
            col("VolumeAttributesClass"),
            col("Age"),
            wide("VolumeMode"),
        ],
        "PersistentVolume" => vec![
            col("Name"),
            col("Capacity"),
            col("Access Modes"),
            col("Reclaim Policy"),
            col("Status"),
            col("Claim"),
            col("StorageClass"),
            col("VolumeAttributesClass"),
            col("Reason"),
            col("Age"),
            wide("VolumeMode"),
        ],
        "StorageClass" => vec![
            col("Name"),
            col("Provisioner"),
            col("ReclaimPolicy"),
            col("VolumeBindingMode"),
            col("AllowVolumeExpansion"),
            col("Age"),
        ],
        "PodDisruptionBudget" => vec![
            col("Name"),
            col("Min Available"),
            col("Max Unavailable"),
            int("Allowed Disruptions"),
            col("Age"),
        ],
        _ => vec![col("Name"), col("Age")],
    }
}

/// READY of a workload: ready replicas out of those asked for.
fn ready_of_desired(o: &Value) -> Value {
    json!(format!(
        "{}/{}",
        o["status"]["readyReplicas"].as_i64().unwrap_or(0),
        o["spec"]["replicas"].as_i64().unwrap_or(0)
    ))
}

/// `metav1.FormatLabelSelector`: requirements sorted by key, `<none>` for none.
fn label_selector_string(sel: &Value) -> String {
    let mut parts: Vec<(String, String)> = sel["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), format!("{k}={}", s(v))))
        .collect();
    for e in sel["matchExpressions"].as_array().into_iter().flatten() {
        let key = s(&e["key"]);
        let mut values: Vec<String> = e["values"]
            .as_array()
            .into_iter()
            .flatten()
            .map(s)
            .collect();
        values.sort();
        let text = match e["operator"].as_str().unwrap_or("") {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.clone(),
            "DoesNotExist" => format!("!{key}"),
            other => format!("{key} {other}"),
        };
        parts.push((key, text));
    }
    parts.sort();
    or_none(
        parts
            .into_iter()
            .map(|(_, t)| t)
            .collect::<Vec<_>>()
            .join(","),
    )
}

/// `helper.GetAccessModesAsString`: kube's short names, in kube's order.
fn access_modes(modes: &Value) -> String {
    let modes: Vec<&str> = modes
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    [
        ("ReadWriteOnce", "RWO"),
        ("ReadOnlyMany", "ROX"),
        ("ReadWriteMany", "RWX"),
        ("ReadWriteOncePod", "RWOP"),
    ]
    .iter()
    .filter(|(mode, _)| modes.contains(mode))
    .map(|(_, short)| *short)
    .collect::<Vec<_>>()
    .join(",")
}

/// `printBoolPtr`.
fn bool_ptr(v: &Value) -> String {
    match v.as_bool() {
        Some(true) => "True".into(),
        Some(false) => "False".into(),
        None => "<unset>".into(),
    }
}

/// An IntOrString as Go prints it, `N/A` when unset.
fn int_or_string(v: &Value) -> String {
    if v.is_null() { "N/A".into() } else { s(v) }
}

fn has_condition(o: &Value, kind: &str) -> bool {
    o["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == kind && c["status"] == "True")
}

/// The Job's STATUS column, in kube's order of precedence.
fn job_status(o: &Value) -> &'static str {
    if has_condition(o, "Complete") {
        "Complete"
    } else if has_condition(o, "Failed") {
        "Failed"
    } else if crate::objects::is_deleting(o) {
        "Terminating"
    } else if has_condition(o, "Suspended") {
        "Suspended"
    } else if has_condition(o, "FailureTarget") {
        "FailureTarget"
    } else if has_condition(o, "SuccessCriteriaMet") {
        "SuccessCriteriaMet"
    } else {
        "Running"
    }
}

fn job_completions(o: &Value) -> String {
    let succeeded = o["status"]["succeeded"].as_i64().unwrap_or(0);
    match (
        o["spec"]["completions"].as_i64(),
        o["spec"]["parallelism"].as_i64(),
    ) {
        (Some(c), _) => format!("{succeeded}/{c}"),
        (None, Some(p)) if p > 1 => format!("{succeeded}/1 of {p}"),
        _ => format!("{succeeded}/1"),
    }
}

fn job_duration(o: &Value) -> String {
    let time = |v: &Value| {
        v.as_str()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
    };
    match (
        time(&o["status"]["startTime"]),
        time(&o["status"]["completionTime"]),
    ) {
        (None, _) => String::new(),
        (Some(start), None) => human_duration(chrono::Utc::now().signed_duration_since(start)),
        (Some(start), Some(end)) => human_duration(end.signed_duration_since(start)),
    }
}

/// The controller of an object as `kind.group/name`, as the CONTROLLER column shows it.
fn controller_of(o: &Value) -> String {
    o["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["controller"] == true)
        .map(|r| {
            let group = s(&r["apiVersion"])
                .rsplit_once('/')
                .map(|(g, _)| g.to_string())
                .unwrap_or_default();
            let kind = s(&r["kind"]).to_ascii_lowercase();
            if group.is_empty() {
                format!("{kind}/{}", s(&r["name"]))
            } else {
                format!("{kind}.{group}/{}", s(&r["name"]))
            }
        })
        .unwrap_or_else(|| "<none>".into())
}

/// The storage class of a claim or volume: the beta annotation first, as kube reads it.
fn storage_class(o: &Value) -> String {
    o["metadata"]["annotations"]["volume.beta.kubernetes.io/storage-class"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| s(&o["spec"]["storageClassName"]))
}

fn phase_or_terminating(o: &Value) -> String {
    if crate::objects::is_deleting(o) {
        "Terminating".into()
    } else {
        s(&o["status"]["phase"])
    }
}

fn unset_or(v: &Value) -> String {
    if v.is_null() { "<unset>".into() } else { s(v) }
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn or_none(v: String) -> String {
    if v.is_empty() { "<none>".into() } else { v }
}

fn selector_string(sel: &Value) -> String {
    let mut parts: Vec<String> = sel
        .as_object()
        .map(|m| m.iter().map(|(k, v)| format!("{k}={}", s(v))).collect())
        .unwrap_or_default();
    parts.sort();
    parts.join(",")
}

fn containers_and_images(spec: &Value) -> (String, String) {
    let containers = spec["containers"].as_array().cloned().unwrap_or_default();
    (
        containers
            .iter()
            .map(|c| s(&c["name"]))
            .collect::<Vec<_>>()
            .join(","),
        containers
            .iter()
            .map(|c| s(&c["image"]))
            .collect::<Vec<_>>()
            .join(","),
    )
}

fn builtin_cells(kind: &str, o: &Value) -> Vec<Value> {
    let name = json!(o["metadata"]["name"]);
    let created = age(o["metadata"]["creationTimestamp"].as_str().unwrap_or(""));
    let int_of = |v: &Value| json!(v.as_i64().unwrap_or(0));
    match kind {
        "Pod" => {
            let statuses = o["status"]["containerStatuses"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let total = o["spec"]["containers"].as_array().map_or(0, Vec::len);
            let ready = statuses.iter().filter(|c| c["ready"] == true).count();
            let restarts: i64 = statuses
                .iter()
                .map(|c| c["restartCount"].as_i64().unwrap_or(0))
                .sum();
            let mut status = o["status"]["reason"]
                .as_str()
                .or(o["status"]["phase"].as_str())
                .unwrap_or("Pending")
                .to_string();
            for c in &statuses {
                if let Some(reason) = c["state"]["waiting"]["reason"].as_str() {
                    status = reason.to_string();
                } else if let Some(reason) = c["state"]["terminated"]["reason"].as_str()
                    && status == "Running"
                {
                    status = reason.to_string();
                }
            }
            if crate::objects::is_deleting(o) {
                status = "Terminating".into();
            }
            vec![
                name,
                json!(format!("{ready}/{total}")),
                json!(status),
                json!(restarts.to_string()),
                json!(created),
                json!(or_none(s(&o["status"]["podIP"]))),
                json!(or_none(s(&o["spec"]["nodeName"]))),
                json!(or_none(s(&o["status"]["nominatedNodeName"]))),
                json!("<none>"),
            ]
        }
        "Node" => {
            let ready = o["status"]["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
                .map(|c| c["status"] == "True");
            let mut status = match ready {
                Some(true) => "Ready",
                Some(false) => "NotReady",
                None => "Unknown",
            }
            .to_string();
            if o["spec"]["unschedulable"] == true {
                status.push_str(",SchedulingDisabled");
            }
            let mut roles: Vec<String> = o["metadata"]["labels"]
                .as_object()
                .map(|l| {
                    l.keys()
                        .filter_map(|k| {
                            k.strip_prefix("node-role.kubernetes.io/")
                                .map(str::to_string)
                        })
                        .collect()
                })
                .unwrap_or_default();
            roles.sort();
            let addr = |t: &str| {
                o["status"]["addresses"]
                    .as_array()
                    .and_then(|a| a.iter().find(|x| x["type"] == t))
                    .map(|x| s(&x["address"]))
                    .unwrap_or_default()
            };
            let info = &o["status"]["nodeInfo"];
            vec![
                name,
                json!(status),
                json!(if roles.is_empty() {
                    "<none>".into()
                } else {
                    roles.join(",")
                }),
                json!(created),
                json!(s(&info["kubeletVersion"])),
                json!(or_none(addr("InternalIP"))),
                json!(or_none(addr("ExternalIP"))),
                json!(s(&info["osImage"])),
                json!(s(&info["kernelVersion"])),
                json!(s(&info["containerRuntimeVersion"])),
            ]
        }
        "Namespace" => vec![name, json!(s(&o["status"]["phase"])), json!(created)],
        "Deployment" => {
            let (c, i) = containers_and_images(&o["spec"]["template"]["spec"]);
            vec![
                name,
                ready_of_desired(o),
                int_of(&o["status"]["updatedReplicas"]),
                int_of(&o["status"]["availableReplicas"]),
                json!(created),
                json!(c),
                json!(i),
                json!(selector_string(&o["spec"]["selector"]["matchLabels"])),
            ]
        }
        "ReplicaSet" => {
            let (c, i) = containers_and_images(&o["spec"]["template"]["spec"]);
            vec![
                name,
                int_of(&o["spec"]["replicas"]),
                int_of(&o["status"]["replicas"]),
                int_of(&o["status"]["readyReplicas"]),
                json!(created),
                json!(c),
                json!(i),
                json!(selector_string(&o["spec"]["selector"]["matchLabels"])),
            ]
        }
        "Service" => {
            let ports: Vec<String> = o["spec"]["ports"]
                .as_array()
                .map(|ps| {
                    ps.iter()
                        .map(|p| {
                            let base = format!("{}", p["port"].as_i64().unwrap_or(0));
                            let base = match p["nodePort"].as_i64() {
                                Some(np) => format!("{base}:{np}"),
                                None => base,
                            };
                            format!("{base}/{}", p["protocol"].as_str().unwrap_or("TCP"))
                        })
                        .collect()
                })
                .unwrap_or_default();
            let external = o["spec"]["externalIPs"]
                .as_array()
                .map(|a| a.iter().map(s).collect::<Vec<_>>().join(","))
                .unwrap_or_default();
            let external = if external.is_empty() && o["spec"]["type"] == "LoadBalancer" {
                "<pending>".into()
            } else {
                or_none(external)
            };
            vec![
                name,
                json!(s(&o["spec"]["type"])),
                json!(or_none(s(&o["spec"]["clusterIP"]))),
                json!(external),
                json!(or_none(ports.join(","))),
                json!(created),
                json!(or_none(selector_string(&o["spec"]["selector"]))),
            ]
        }
        "ConfigMap" => {
            let n = o["data"].as_object().map_or(0, |m| m.len())
                + o["binaryData"].as_object().map_or(0, |m| m.len());
            vec![name, json!(n), json!(created)]
        }
        "Secret" => vec![
            name,
            json!(s(&o["type"])),
            json!(o["data"].as_object().map_or(0, |m| m.len())),
            json!(created),
        ],
        "ServiceAccount" => vec![
            name,
            json!(o["secrets"].as_array().map_or(0, Vec::len)),
            json!(created),
        ],
        "Endpoints" => {
            let eps: Vec<String> = o["subsets"]
                .as_array()
                .map(|subsets| {
                    subsets
                        .iter()
                        .flat_map(|ss| {
                            let ports: Vec<i64> = ss["ports"]
                                .as_array()
                                .map(|p| p.iter().filter_map(|x| x["port"].as_i64()).collect())
                                .unwrap_or_default();
                            ss["addresses"]
                                .as_array()
                                .cloned()
                                .unwrap_or_default()
                                .into_iter()
                                .flat_map(move |a| {
                                    let ip = s(&a["ip"]);
                                    if ports.is_empty() {
                                        vec![ip]
                                    } else {
                                        ports.iter().map(|p| format!("{ip}:{p}")).collect()
                                    }
                                })
                        })
                        .collect()
                })
                .unwrap_or_default();
            vec![name, json!(or_none(eps.join(","))), json!(created)]
        }
        "EndpointSlice" => {
            let ports: Vec<String> = o["ports"]
                .as_array()
                .map(|p| p.iter().map(|x| s(&x["port"])).collect())
                .unwrap_or_default();
            let eps: Vec<String> = o["endpoints"]
                .as_array()
                .map(|e| {
                    e.iter()
                        .flat_map(|x| x["addresses"].as_array().cloned().unwrap_or_default())
                        .map(|a| s(&a))
                        .collect()
                })
                .unwrap_or_default();
            vec![
                name,
                json!(s(&o["addressType"])),
                json!(or_none(ports.join(","))),
                json!(or_none(eps.join(","))),
                json!(created),
            ]
        }
        "Event" => {
            let last = o["lastTimestamp"]
                .as_str()
                .or(o["eventTime"].as_str())
                .or(o["metadata"]["creationTimestamp"].as_str())
                .unwrap_or("");
            let obj = &o["involvedObject"];
            vec![
                json!(age(last)),
                json!(s(&o["type"])),
                json!(s(&o["reason"])),
                json!(format!(
                    "{}/{}",
                    s(&obj["kind"]).to_lowercase(),
                    s(&obj["name"])
                )),
                json!(s(&o["message"])),
            ]
        }
        "Lease" => vec![
            name,
            json!(or_none(s(&o["spec"]["holderIdentity"]))),
            json!(created),
        ],
        "CertificateSigningRequest" => {
            let conds: Vec<String> = o["status"]["conditions"]
                .as_array()
                .map(|c| {
                    c.iter()
                        .filter(|c| c["status"] != "False")
                        .map(|c| s(&c["type"]))
                        .collect()
                })
                .unwrap_or_default();
            let mut condition = if conds.is_empty() {
                "Pending".to_string()
            } else {
                conds.join(",")
            };
            if o["status"]["certificate"].is_string()
                && !o["status"]["certificate"].as_str().unwrap_or("").is_empty()
            {
                condition.push_str(",Issued");
            }
            let duration = o["spec"]["expirationSeconds"]
                .as_i64()
                .map(|secs| human_duration(chrono::Duration::seconds(secs)))
                .unwrap_or_else(|| "<none>".into());
            vec![
                name,
                json!(created),
                json!(s(&o["spec"]["signerName"])),
                json!(s(&o["spec"]["username"])),
                json!(duration),
                json!(condition),
            ]
        }
        "CustomResourceDefinition" => vec![name, json!(s(&o["metadata"]["creationTimestamp"]))],
        "RoleBinding" | "ClusterRoleBinding" => {
            let subjects = o["subjects"].as_array().cloned().unwrap_or_default();
            let of = |k: &str| {
                subjects
                    .iter()
                    .filter(|x| x["kind"] == k)
                    .map(|x| {
                        if k == "ServiceAccount" {
                            format!("{}/{}", s(&x["namespace"]), s(&x["name"]))
                        } else {
                            s(&x["name"])
                        }
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            vec![
                name,
                json!(format!(
                    "{}/{}",
                    s(&o["roleRef"]["kind"]),
                    s(&o["roleRef"]["name"])
                )),
                json!(created),
                json!(of("User")),
                json!(of("Group")),
                json!(of("ServiceAccount")),
            ]
        }
        "Job" => {
            let (c, i) = containers_and_images(&o["spec"]["template"]["spec"]);
            vec![
                name,
                json!(job_status(o)),
                json!(job_completions(o)),
                json!(job_duration(o)),
                json!(created),
                json!(c),
                json!(i),
                json!(label_selector_string(&o["spec"]["selector"])),
            ]
        }
        "CronJob" => {
            let job = &o["spec"]["jobTemplate"]["spec"];
            let (c, i) = containers_and_images(&job["template"]["spec"]);
            let last = o["status"]["lastScheduleTime"]
                .as_str()
                .map_or_else(|| "<none>".to_string(), age);
            vec![
                name,
                json!(s(&o["spec"]["schedule"])),
                json!(or_none(s(&o["spec"]["timeZone"]))),
                json!(bool_ptr(&o["spec"]["suspend"])),
                json!(o["status"]["active"].as_array().map_or(0, Vec::len)),
                json!(last),
                json!(created),
                json!(c),
                json!(i),
                json!(label_selector_string(&job["selector"])),
            ]
        }
        "StatefulSet" => {
            let (c, i) = containers_and_images(&o["spec"]["template"]["spec"]);
            vec![
                name,
                ready_of_desired(o),
                json!(created),
                json!(c),
                json!(i),
            ]
        }
        "DaemonSet" => {
            let (c, i) = containers_and_images(&o["spec"]["template"]["spec"]);
            vec![
                name,
                int_of(&o["status"]["desiredNumberScheduled"]),
                int_of(&o["status"]["currentNumberScheduled"]),
                int_of(&o["status"]["numberReady"]),
                int_of(&o["status"]["updatedNumberScheduled"]),
                int_of(&o["status"]["numberAvailable"]),
                json!(or_none(selector_string(
                    &o["spec"]["template"]["spec"]["nodeSelector"]
                ))),
                json!(created),
                json!(c),
                json!(i),
                json!(label_selector_string(&o["spec"]["selector"])),
            ]
        }
        "ControllerRevision" => vec![
            name,
            json!(controller_of(o)),
            int_of(&o["revision"]),
            json!(created),
        ],
        "PersistentVolumeClaim" => {
            // Capacity and access modes are the bound volume's, shown once bound.
            let bound = !s(&o["spec"]["volumeName"]).is_empty();
            let (capacity, modes) = if bound {
                (
                    s(&o["status"]["capacity"]["storage"]),
                    access_modes(&o["status"]["accessModes"]),
                )
            } else {
                (String::new(), String::new())
            };
            vec![
                name,
                json!(phase_or_terminating(o)),
                json!(s(&o["spec"]["volumeName"])),
                json!(capacity),
                json!(modes),
                json!(storage_class(o)),
                json!(unset_or(&o["spec"]["volumeAttributesClassName"])),
                json!(created),
                json!(unset_or(&o["spec"]["volumeMode"])),
            ]
        }
        "PersistentVolume" => {
            let claim = &o["spec"]["claimRef"];
            let claim = if claim.is_object() {
                format!("{}/{}", s(&claim["namespace"]), s(&claim["name"]))
            } else {
                String::new()
            };
            let capacity = s(&o["spec"]["capacity"]["storage"]);
            vec![
                name,
                json!(if capacity.is_empty() {
                    "0".into()
                } else {
                    capacity
                }),
                json!(access_modes(&o["spec"]["accessModes"])),
                json!(s(&o["spec"]["persistentVolumeReclaimPolicy"])),
                json!(phase_or_terminating(o)),
                json!(claim),
                json!(storage_class(o)),
                json!(unset_or(&o["spec"]["volumeAttributesClassName"])),
                json!(s(&o["status"]["reason"])),
                json!(created),
                json!(unset_or(&o["spec"]["volumeMode"])),
            ]
        }
        "StorageClass" => {
            let annotations = &o["metadata"]["annotations"];
            let default = annotations[crate::defaults::DEFAULT_CLASS] == "true"
                || annotations["storageclass.beta.kubernetes.io/is-default-class"] == "true";
            let mut shown = s(&o["metadata"]["name"]);
            if default {
                shown.push_str(" (default)");
            }
            vec![
                json!(shown),
                json!(s(&o["provisioner"])),
                json!(o["reclaimPolicy"].as_str().unwrap_or("Delete")),
                json!(o["volumeBindingMode"].as_str().unwrap_or("Immediate")),
                json!(o["allowVolumeExpansion"].as_bool().unwrap_or(false)),
                json!(created),
            ]
        }
        "PodDisruptionBudget" => vec![
            name,
            json!(int_or_string(&o["spec"]["minAvailable"])),
            json!(int_or_string(&o["spec"]["maxUnavailable"])),
            int_of(&o["status"]["disruptionsAllowed"]),
            json!(created),
        ],
        _ => vec![name, json!(created)],
    }
}

/// How long ago an RFC 3339 time was, as kubectl's AGE column shows it.
pub fn age(timestamp: &str) -> String {
    match chrono::DateTime::parse_from_rfc3339(timestamp) {
        Ok(t) => human_duration(chrono::Utc::now().signed_duration_since(t)),
        Err(_) => "<unknown>".into(),
    }
}

/// Kubernetes' duration.HumanDuration.
pub fn human_duration(d: chrono::Duration) -> String {
    let secs = d.num_seconds();
    if secs < -1 {
        return "<invalid>".into();
    }
    let secs = secs.max(0);
    let (mins, hours, days) = (secs / 60, secs / 3600, secs / 86400);
    if secs < 120 {
        format!("{secs}s")
    } else if mins < 10 {
        match secs % 60 {
            0 => format!("{mins}m"),
            s => format!("{mins}m{s}s"),
        }
    } else if mins < 180 {
        format!("{mins}m")
    } else if hours < 8 {
        match mins % 60 {
            0 => format!("{hours}h"),
            m => format!("{hours}h{m}m"),
        }
    } else if hours < 48 {
        format!("{hours}h")
    } else if hours < 24 * 8 {
        match hours % 24 {
            0 => format!("{days}d"),
            h => format!("{days}d{h}h"),
        }
    } else if hours < 24 * 365 * 2 {
        format!("{days}d")
    } else if hours < 24 * 365 * 8 {
        let years = days / 365;
        match days % 365 {
            0 => format!("{years}y"),
            d => format!("{years}y{d}d"),
        }
    } else {
        format!("{}y", days / 365)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_durations_like_kubectl() {
        for (secs, want) in [
            (5, "5s"),
            (119, "119s"),
            (150, "2m30s"),
            (600, "10m"),
            (3 * 3600 + 5 * 60, "3h5m"),
            (10 * 3600, "10h"),
            (3 * 86400 + 7200, "3d2h"),
            (30 * 86400, "30d"),
        ] {
            assert_eq!(
                human_duration(chrono::Duration::seconds(secs)),
                want,
                "{secs}s"
            );
        }
    }

    #[test]
    fn workload_storage_and_budget_rows_as_kubectl_prints_them() {
        let pod_spec = json!({"containers": [{"name": "a", "image": "busybox"}, {"name": "b", "image": "nginx:1.25"}]});
        // (kind, object, the cells but the AGE column)
        let cases: Vec<(&str, Value, Value)> = vec![
            (
                "Job",
                json!({"metadata": {"name": "j"}, "spec": {"completions": 3, "parallelism": 2,
                    "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "u"}},
                    "template": {"spec": pod_spec}},
                    "status": {"succeeded": 3, "startTime": "2024-01-01T00:00:00Z",
                               "completionTime": "2024-01-01T00:01:05Z",
                               "conditions": [{"type": "Complete", "status": "True"}]}}),
                json!([
                    "j",
                    "Complete",
                    "3/3",
                    "65s",
                    "a,b",
                    "busybox,nginx:1.25",
                    "batch.kubernetes.io/controller-uid=u"
                ]),
            ),
            (
                "Job",
                json!({"metadata": {"name": "q"}, "spec": {"parallelism": 4, "suspend": true,
                    "selector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["b", "a"]}]}},
                    "status": {"conditions": [{"type": "Suspended", "status": "True"}]}}),
                json!(["q", "Suspended", "0/1 of 4", "", "", "", "tier in (a,b)"]),
            ),
            (
                "Job",
                json!({"metadata": {"name": "f"}, "spec": {"completions": 1},
                    "status": {"failed": 7, "conditions": [{"type": "Failed", "status": "True"}]}}),
                json!(["f", "Failed", "0/1", "", "", "", "<none>"]),
            ),
            (
                "CronJob",
                json!({"metadata": {"name": "c"}, "spec": {"schedule": "*/5 * * * *", "suspend": false,
                    "jobTemplate": {"spec": {"template": {"spec": pod_spec}}}},
                    "status": {"active": [{"name": "c-1"}, {"name": "c-2"}]}}),
                json!([
                    "c",
                    "*/5 * * * *",
                    "<none>",
                    "False",
                    2,
                    "<none>",
                    "a,b",
                    "busybox,nginx:1.25",
                    "<none>"
                ]),
            ),
            (
                "CronJob",
                json!({"metadata": {"name": "t"}, "spec": {"schedule": "@daily", "timeZone": "Europe/Rome"}}),
                json!([
                    "t",
                    "@daily",
                    "Europe/Rome",
                    "<unset>",
                    0,
                    "<none>",
                    "",
                    "",
                    "<none>"
                ]),
            ),
            (
                "StatefulSet",
                json!({"metadata": {"name": "db"}, "spec": {"replicas": 3, "template": {"spec": pod_spec}},
                    "status": {"readyReplicas": 2}}),
                json!(["db", "2/3", "a,b", "busybox,nginx:1.25"]),
            ),
            (
                "DaemonSet",
                json!({"metadata": {"name": "agent"}, "spec": {"selector": {"matchLabels": {"app": "agent"}},
                    "template": {"spec": {"nodeSelector": {"os": "linux", "arch": "amd64"}, "containers": []}}},
                    "status": {"desiredNumberScheduled": 3, "currentNumberScheduled": 3, "numberReady": 2,
                               "updatedNumberScheduled": 1, "numberAvailable": 2}}),
                json!([
                    "agent",
                    3,
                    3,
                    2,
                    1,
                    2,
                    "arch=amd64,os=linux",
                    "",
                    "",
                    "app=agent"
                ]),
            ),
            (
                "DaemonSet",
                json!({"metadata": {"name": "bare"}, "spec": {"selector": {"matchLabels": {"app": "x"}}}}),
                json!(["bare", 0, 0, 0, 0, 0, "<none>", "", "", "app=x"]),
            ),
            (
                "ControllerRevision",
                json!({"metadata": {"name": "db-7f9", "ownerReferences": [
                        {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "controller": true}]},
                    "revision": 2}),
                json!(["db-7f9", "statefulset.apps/db", 2]),
            ),
            (
                "PersistentVolumeClaim",
                json!({"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}}, "storageClassName": "standard",
                    "volumeMode": "Filesystem"},
                    "status": {"phase": "Pending"}}),
                json!([
                    "data",
                    "Pending",
                    "",
                    "",
                    "",
                    "standard",
                    "<unset>",
                    "Filesystem"
                ]),
            ),
            (
                "PersistentVolumeClaim",
                json!({"metadata": {"name": "data"}, "spec": {"volumeName": "pv-1", "storageClassName": "standard"},
                    "status": {"phase": "Bound", "capacity": {"storage": "2Gi"},
                               "accessModes": ["ReadWriteMany", "ReadWriteOnce"]}}),
                json!([
                    "data", "Bound", "pv-1", "2Gi", "RWO,RWX", "standard", "<unset>", "<unset>"
                ]),
            ),
            (
                "PersistentVolume",
                json!({"metadata": {"name": "pv-1"}, "spec": {"capacity": {"storage": "2Gi"},
                    "accessModes": ["ReadWriteOnce"], "persistentVolumeReclaimPolicy": "Delete",
                    "claimRef": {"namespace": "prod", "name": "data"}, "storageClassName": "standard",
                    "volumeMode": "Filesystem"},
                    "status": {"phase": "Bound"}}),
                json!([
                    "pv-1",
                    "2Gi",
                    "RWO",
                    "Delete",
                    "Bound",
                    "prod/data",
                    "standard",
                    "<unset>",
                    "",
                    "Filesystem"
                ]),
            ),
            (
                "StorageClass",
                json!({"metadata": {"name": "standard", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
                    "provisioner": "lab.tandem.dev/hollow", "volumeBindingMode": "WaitForFirstConsumer",
                    "allowVolumeExpansion": true}),
                json!([
                    "standard (default)",
                    "lab.tandem.dev/hollow",
                    "Delete",
                    "WaitForFirstConsumer",
                    true
                ]),
            ),
            (
                "StorageClass",
                json!({"metadata": {"name": "slow"}, "provisioner": "p", "reclaimPolicy": "Retain"}),
                json!(["slow", "p", "Retain", "Immediate", false]),
            ),
            (
                "PodDisruptionBudget",
                json!({"metadata": {"name": "p"}, "spec": {"minAvailable": 1}, "status": {"disruptionsAllowed": 2}}),
                json!(["p", "1", "N/A", 2]),
            ),
            (
                "PodDisruptionBudget",
                json!({"metadata": {"name": "q"}, "spec": {"maxUnavailable": "25%"}}),
                json!(["q", "N/A", "25%", 0]),
            ),
        ];
        for (kind, mut obj, want) in cases {
            obj["metadata"]["creationTimestamp"] = json!("2024-01-01T00:00:00Z");
            let columns = builtin_columns(kind);
            let mut cells = builtin_cells(kind, &obj);
            assert_eq!(cells.len(), columns.len(), "{kind}: a cell per column");
            let age_at = columns
                .iter()
                .position(|c| c.name == "Age")
                .expect("an AGE column");
            let age = cells.remove(age_at);
            assert!(
                age.as_str().is_some_and(|a| a.contains('y')),
                "{kind}: age {age}"
            );
            assert_eq!(Value::Array(cells), want, "{kind}");
        }
        let names: Vec<&str> = builtin_columns("PersistentVolumeClaim")
            .iter()
            .map(|c| c.name)
            .collect();
        assert_eq!(
            names,
            [
                "Name",
                "Status",
                "Volume",
                "Capacity",
                "Access Modes",
                "StorageClass",
                "VolumeAttributesClass",
                "Age",
                "VolumeMode"
            ]
        );
    }
}
