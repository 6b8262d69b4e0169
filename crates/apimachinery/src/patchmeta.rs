//! How the lists of an object merge: the `patchMergeKey` / `patchStrategy` tags of the
//! built-in types, and `x-kubernetes-list-type` / `x-kubernetes-list-map-keys` in CRD schemas.
//!
//! Strategic merge patch and server-side apply both need to know, for every list in an
//! object, whether it is replaced whole, merged as a set of primitives, or merged item by
//! item on key fields. Built-in kinds carry that knowledge in a table below (kube-apiserver
//! reads it from Go struct tags, which we do not have); custom resources carry it in their
//! structural schema.

use std::collections::BTreeMap;

use serde_json::Value;

/// How one list field merges.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum ListType {
    /// Replaced whole by a patch or an apply, owned as one field.
    #[default]
    Atomic,
    /// Primitive items merged as a set (e.g. `metadata.finalizers`).
    Set,
    /// Items merged on the values of these keys (e.g. containers by `name`). Strategic merge
    /// patch matches on the first key only, as the Go `patchMergeKey` tag does.
    Map(Vec<String>),
}

impl ListType {
    fn map(keys: &[&str]) -> Self {
        ListType::Map(keys.iter().map(|k| k.to_string()).collect())
    }

    /// The strategic-merge-patch merge key, if items merge by key.
    pub fn merge_key(&self) -> Option<&str> {
        match self {
            ListType::Map(keys) => keys.first().map(String::as_str),
            _ => None,
        }
    }
}

/// Merge semantics of one kind: a tree of field names whose nodes say how a list merges.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PatchSchema {
    root: Node,
}

#[derive(Clone, Debug, Default, PartialEq)]
struct Node {
    list: Option<ListType>,
    atomic_map: bool,
    fields: BTreeMap<String, Node>,
    /// Schema of the values of a map with arbitrary keys (`additionalProperties`).
    values: Option<Box<Node>>,
}

impl Node {
    fn child(&self, name: &str) -> Option<&Node> {
        self.fields.get(name).or(self.values.as_deref())
    }
}

/// List rules every kind shares (paths from the object root, list items skipped).
const OBJECT_META: &[(&str, &[&str], bool)] = &[
    ("metadata.finalizers", &[], true),
    ("metadata.ownerReferences", &["uid"], false),
];

/// List rules of a PodSpec, relative to the spec.
const POD_SPEC: &[(&str, &[&str])] = &[
    ("containers", &["name"]),
    ("initContainers", &["name"]),
    ("ephemeralContainers", &["name"]),
    ("containers.ports", &["containerPort", "protocol"]),
    ("initContainers.ports", &["containerPort", "protocol"]),
    ("ephemeralContainers.ports", &["containerPort", "protocol"]),
    ("containers.env", &["name"]),
    ("initContainers.env", &["name"]),
    ("ephemeralContainers.env", &["name"]),
    ("containers.volumeMounts", &["mountPath"]),
    ("initContainers.volumeMounts", &["mountPath"]),
    ("ephemeralContainers.volumeMounts", &["mountPath"]),
    ("containers.volumeDevices", &["devicePath"]),
    ("initContainers.volumeDevices", &["devicePath"]),
    ("ephemeralContainers.volumeDevices", &["devicePath"]),
    // `resizePolicy` is `+listType=atomic` with no patch strategy, so it is left out.
    ("volumes", &["name"]),
    ("imagePullSecrets", &["name"]),
    ("hostAliases", &["ip"]),
    (
        "topologySpreadConstraints",
        &["topologyKey", "whenUnsatisfiable"],
    ),
    ("schedulingGates", &["name"]),
    ("resourceClaims", &["name"]),
];

/// Lists of primitives that built-in kinds merge as sets, besides `metadata.finalizers`.
fn kind_sets(group: &str, kind: &str) -> &'static [&'static str] {
    match (group, kind) {
        ("", "Node") => &["spec.podCIDRs"],
        _ => &[],
    }
}

/// Where a kind keeps a PodSpec.
fn pod_spec_prefix(group: &str, kind: &str) -> Option<&'static str> {
    match (group, kind) {
        ("", "Pod") => Some("spec"),
        ("", "PodTemplate") => Some("template.spec"),
        ("", "ReplicationController")
        | ("apps", "Deployment" | "ReplicaSet" | "StatefulSet" | "DaemonSet")
        | ("batch", "Job") => Some("spec.template.spec"),
        ("batch", "CronJob") => Some("spec.jobTemplate.spec.template.spec"),
        _ => None,
    }
}

/// List rules of built-in kinds other than their PodSpec.
fn kind_rules(group: &str, kind: &str) -> &'static [(&'static str, &'static [&'static str])] {
    match (group, kind) {
        ("", "Pod") => &[
            ("status.conditions", &["type"]),
            ("status.podIPs", &["ip"]),
            ("status.hostIPs", &["ip"]),
            ("status.resourceClaimStatuses", &["name"]),
        ],
        ("", "ServiceAccount") => &[("secrets", &["name"])],
        ("", "Node") => &[
            ("status.conditions", &["type"]),
            ("status.addresses", &["type"]),
        ],
        ("", "Service") => &[
            ("spec.ports", &["port", "protocol"]),
            ("status.conditions", &["type"]),
        ],
        ("admissionregistration.k8s.io", "MutatingWebhookConfiguration")
        | ("admissionregistration.k8s.io", "ValidatingWebhookConfiguration") => {
            &[("webhooks", &["name"])]
        }
        _ => &[("status.conditions", &["type"])],
    }
}

impl PatchSchema {
    /// Every list atomic, every map merged: what JSON merge patch assumes.
    pub fn empty() -> Self {
        let mut schema = PatchSchema::default();
        for (path, keys, set) in OBJECT_META {
            schema.set(
                path,
                if *set {
                    ListType::Set
                } else {
                    ListType::map(keys)
                },
            );
        }
        schema
    }

    /// The merge rules of a built-in kind; kinds we have no table for get [`PatchSchema::empty`].
    pub fn builtin(group: &str, kind: &str) -> Self {
        let mut schema = PatchSchema::empty();
        if let Some(prefix) = pod_spec_prefix(group, kind) {
            for (path, keys) in POD_SPEC {
                schema.set(&format!("{prefix}.{path}"), ListType::map(keys));
            }
            if prefix != "spec" {
                // A template's metadata has the same list rules as an object's.
                let meta = prefix.trim_end_matches(".spec");
                schema.set(&format!("{meta}.metadata.finalizers"), ListType::Set);
                schema.set(
                    &format!("{meta}.metadata.ownerReferences"),
                    ListType::map(&["uid"]),
                );
            }
        }
        for (path, keys) in kind_rules(group, kind) {
            schema.set(path, ListType::map(keys));
        }
        for path in kind_sets(group, kind) {
            schema.set(path, ListType::Set);
        }
        schema
    }

    /// The merge rules declared in a CRD's `openAPIV3Schema` (`x-kubernetes-list-type`,
    /// `x-kubernetes-list-map-keys`, `x-kubernetes-map-type`), plus the ObjectMeta rules.
    pub fn from_openapi(schema: &Value) -> Self {
        let mut out = PatchSchema::empty();
        let metadata = out.root.fields.remove("metadata");
        out.root = node_from_openapi(schema);
        if let Some(metadata) = metadata {
            out.root.fields.insert("metadata".to_string(), metadata);
        }
        out
    }

    /// How the list at `path` merges; `path` names the fields from the object root with list
    /// items skipped, e.g. `["spec", "containers", "ports"]`.
    pub fn list_type(&self, path: &[&str]) -> ListType {
        self.node(path)
            .and_then(|n| n.list.clone())
            .unwrap_or_default()
    }

    /// Whether the map at `path` is replaced whole (`x-kubernetes-map-type: atomic`).
    pub fn is_atomic_map(&self, path: &[&str]) -> bool {
        self.node(path).is_some_and(|n| n.atomic_map)
    }

    fn node(&self, path: &[&str]) -> Option<&Node> {
        path.iter()
            .try_fold(&self.root, |node, name| node.child(name))
    }

    fn set(&mut self, dotted: &str, list: ListType) {
        let node = dotted.split('.').fold(&mut self.root, |node, name| {
            node.fields.entry(name.to_string()).or_default()
        });
        node.list = Some(list);
    }
}

fn node_from_openapi(schema: &Value) -> Node {
    let mut node = Node::default();
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, sub) in props {
            node.fields.insert(name.clone(), node_from_openapi(sub));
        }
    }
    if let Some(extra) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        node.values = Some(Box::new(node_from_openapi(extra)));
    }
    node.atomic_map = schema.get("x-kubernetes-map-type").and_then(Value::as_str) == Some("atomic");
    if let Some(items) = schema.get("items") {
        // A list's node holds its rule and, merged in, the schema of its items, because
        // paths skip list items.
        let item = node_from_openapi(items);
        node.fields = item.fields;
        node.values = item.values;
        node.list = Some(
            match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
                Some("set") => ListType::Set,
                Some("map") => ListType::Map(
                    schema
                        .get("x-kubernetes-list-map-keys")
                        .and_then(Value::as_array)
                        .map(|keys| {
                            keys.iter()
                                .filter_map(|k| k.as_str().map(str::to_string))
                                .collect()
                        })
                        .unwrap_or_default(),
                ),
                _ => ListType::Atomic,
            },
        );
    }
    node
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn builtin_tables() {
        let cases: &[(&str, &str, &[&str], ListType)] = &[
            ("", "Pod", &["spec", "containers"], ListType::map(&["name"])),
            (
                "",
                "Pod",
                &["spec", "containers", "env"],
                ListType::map(&["name"]),
            ),
            ("", "Pod", &["spec", "tolerations"], ListType::Atomic),
            ("", "Pod", &["spec", "containers", "args"], ListType::Atomic),
            (
                "",
                "Pod",
                &["spec", "containers", "resizePolicy"],
                ListType::Atomic,
            ),
            (
                "",
                "Pod",
                &["spec", "ephemeralContainers", "ports"],
                ListType::map(&["containerPort", "protocol"]),
            ),
            ("", "ServiceAccount", &["secrets"], ListType::map(&["name"])),
            ("", "Node", &["spec", "podCIDRs"], ListType::Set),
            (
                "apps",
                "StatefulSet",
                &["spec", "template", "metadata", "ownerReferences"],
                ListType::map(&["uid"]),
            ),
            ("", "Pod", &["metadata", "finalizers"], ListType::Set),
            (
                "",
                "Pod",
                &["status", "conditions"],
                ListType::map(&["type"]),
            ),
            (
                "apps",
                "Deployment",
                &["spec", "template", "spec", "containers"],
                ListType::map(&["name"]),
            ),
            (
                "apps",
                "Deployment",
                &["spec", "template", "metadata", "finalizers"],
                ListType::Set,
            ),
            (
                "apps",
                "Deployment",
                &["spec", "containers"],
                ListType::Atomic,
            ),
            (
                "batch",
                "CronJob",
                &["spec", "jobTemplate", "spec", "template", "spec", "volumes"],
                ListType::map(&["name"]),
            ),
            (
                "",
                "Service",
                &["spec", "ports"],
                ListType::map(&["port", "protocol"]),
            ),
            (
                "",
                "ConfigMap",
                &["metadata", "ownerReferences"],
                ListType::map(&["uid"]),
            ),
            (
                "example.com",
                "Widget",
                &["spec", "items"],
                ListType::Atomic,
            ),
        ];
        for (group, kind, path, want) in cases {
            assert_eq!(
                PatchSchema::builtin(group, kind).list_type(path),
                *want,
                "{group}/{kind} {path:?}"
            );
        }
        assert_eq!(
            PatchSchema::builtin("", "Service")
                .list_type(&["spec", "ports"])
                .merge_key(),
            Some("port")
        );
    }

    #[test]
    fn openapi_list_types() {
        let schema = PatchSchema::from_openapi(&json!({
            "type": "object",
            "properties": {
                "spec": {"type": "object", "properties": {
                    "ports": {"type": "array", "x-kubernetes-list-type": "map",
                              "x-kubernetes-list-map-keys": ["port", "protocol"],
                              "items": {"type": "object", "properties": {
                                  "hosts": {"type": "array", "x-kubernetes-list-type": "set",
                                            "items": {"type": "string"}}}}},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "byName": {"type": "object", "additionalProperties": {
                        "type": "object", "properties": {"ids": {"type": "array",
                            "x-kubernetes-list-type": "set", "items": {"type": "integer"}}}}},
                    "selector": {"type": "object", "x-kubernetes-map-type": "atomic"}
                }}
            }
        }));
        assert_eq!(
            schema.list_type(&["spec", "ports"]),
            ListType::map(&["port", "protocol"])
        );
        assert_eq!(schema.list_type(&["spec", "ports", "hosts"]), ListType::Set);
        assert_eq!(schema.list_type(&["spec", "tags"]), ListType::Atomic);
        assert_eq!(
            schema.list_type(&["spec", "byName", "any-key", "ids"]),
            ListType::Set
        );
        assert!(schema.is_atomic_map(&["spec", "selector"]));
        assert!(!schema.is_atomic_map(&["spec"]));
        assert_eq!(schema.list_type(&["metadata", "finalizers"]), ListType::Set);
    }
}
