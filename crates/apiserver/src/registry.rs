//! The table of resources the server serves: built-in kinds and those CRDs add.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

/// Verbs of a stored resource.
pub const FULL_VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];
/// Verbs of a review resource that is only ever created (SubjectAccessReview, …).
pub const CREATE_ONLY: &[&str] = &["create"];

/// One served resource at one group/version.
#[derive(Clone, Debug)]
pub struct ResourceInfo {
    /// API group ("" for core).
    pub group: String,
    /// This entry's version.
    pub version: String,
    /// Plural resource name, as in URLs.
    pub resource: String,
    /// Singular name.
    pub singular: String,
    /// Kind.
    pub kind: String,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// Short names for kubectl.
    pub short_names: Vec<String>,
    /// Categories (e.g. `all`).
    pub categories: Vec<String>,
    /// Subresources served (`status`, `scale`, `binding`, …).
    pub subresources: Vec<String>,
    /// Verbs on the main resource.
    pub verbs: Vec<String>,
    /// Fields a field selector may name besides metadata.name and metadata.namespace.
    pub selectable_fields: Vec<String>,
    /// Whether objects are stored (false for reviews computed per request).
    pub stored: bool,
    /// Whether a create keeps the status the client sent (Nodes do; most kinds reset it).
    pub keeps_status_on_create: bool,
    /// Extra facts about a custom resource.
    pub custom: Option<Arc<CustomInfo>>,
}

/// What the CRD says about one version of a custom resource.
#[derive(Debug, Default)]
pub struct CustomInfo {
    /// `openAPIV3Schema` of this version.
    pub schema: Option<Value>,
    /// `additionalPrinterColumns` of this version.
    pub printer_columns: Vec<Value>,
    /// `subresources.scale` of this version.
    pub scale: Option<Value>,
    /// Name of the CRD.
    pub crd_name: String,
}

impl ResourceInfo {
    /// `group/version`, or `version` for the core group: the apiVersion of objects.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The storage key shared by every version of this resource.
    pub fn storage_key(&self) -> String {
        format!("{}/{}", self.group, self.resource)
    }

    /// Whether `sub` is a served subresource.
    pub fn has_subresource(&self, sub: &str) -> bool {
        self.subresources.iter().any(|s| s == sub)
    }

    /// Whether writes to the main resource ignore status (there is a status subresource).
    pub fn has_status(&self) -> bool {
        self.has_subresource("status")
    }
}

struct Builtin {
    group: &'static str,
    version: &'static str,
    resource: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
    short: &'static [&'static str],
    categories: &'static [&'static str],
    subresources: &'static [&'static str],
    stored: bool,
}

const fn b(
    group: &'static str,
    version: &'static str,
    resource: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
) -> Builtin {
    Builtin {
        group,
        version,
        resource,
        singular,
        kind,
        namespaced,
        short: &[],
        categories: &[],
        subresources: &[],
        stored: true,
    }
}

impl Builtin {
    const fn short(mut self, short: &'static [&'static str]) -> Self {
        self.short = short;
        self
    }
    const fn all(mut self) -> Self {
        self.categories = &["all"];
        self
    }
    const fn subs(mut self, subs: &'static [&'static str]) -> Self {
        self.subresources = subs;
        self
    }
    const fn review(mut self) -> Self {
        self.stored = false;
        self
    }
}

const BUILTINS: &[Builtin] = &[
    b("", "v1", "namespaces", "namespace", "Namespace", false)
        .short(&["ns"])
        .subs(&["status", "finalize"]),
    b("", "v1", "pods", "pod", "Pod", true)
        .short(&["po"])
        .all()
        .subs(&["status", "binding", "eviction"]),
    b("", "v1", "nodes", "node", "Node", false)
        .short(&["no"])
        .subs(&["status"]),
    b("", "v1", "services", "service", "Service", true)
        .short(&["svc"])
        .all()
        .subs(&["status"]),
    b("", "v1", "endpoints", "endpoints", "Endpoints", true).short(&["ep"]),
    b("", "v1", "configmaps", "configmap", "ConfigMap", true).short(&["cm"]),
    b("", "v1", "secrets", "secret", "Secret", true),
    b(
        "",
        "v1",
        "serviceaccounts",
        "serviceaccount",
        "ServiceAccount",
        true,
    )
    .short(&["sa"])
    .subs(&["token"]),
    b("", "v1", "events", "event", "Event", true).short(&["ev"]),
    b(
        "",
        "v1",
        "resourcequotas",
        "resourcequota",
        "ResourceQuota",
        true,
    )
    .short(&["quota"])
    .subs(&["status"]),
    b(
        "apps",
        "v1",
        "deployments",
        "deployment",
        "Deployment",
        true,
    )
    .short(&["deploy"])
    .all()
    .subs(&["status", "scale"]),
    b(
        "apps",
        "v1",
        "replicasets",
        "replicaset",
        "ReplicaSet",
        true,
    )
    .short(&["rs"])
    .all()
    .subs(&["status", "scale"]),
    b(
        "apps",
        "v1",
        "statefulsets",
        "statefulset",
        "StatefulSet",
        true,
    )
    .short(&["sts"])
    .all()
    .subs(&["status", "scale"]),
    b("apps", "v1", "daemonsets", "daemonset", "DaemonSet", true)
        .short(&["ds"])
        .all()
        .subs(&["status"]),
    b(
        "apps",
        "v1",
        "controllerrevisions",
        "controllerrevision",
        "ControllerRevision",
        true,
    ),
    b("batch", "v1", "jobs", "job", "Job", true)
        .all()
        .subs(&["status"]),
    b("batch", "v1", "cronjobs", "cronjob", "CronJob", true)
        .short(&["cj"])
        .all()
        .subs(&["status"]),
    b(
        "",
        "v1",
        "persistentvolumeclaims",
        "persistentvolumeclaim",
        "PersistentVolumeClaim",
        true,
    )
    .short(&["pvc"])
    .subs(&["status"]),
    b(
        "",
        "v1",
        "persistentvolumes",
        "persistentvolume",
        "PersistentVolume",
        false,
    )
    .short(&["pv"])
    .subs(&["status"]),
    b(
        "storage.k8s.io",
        "v1",
        "storageclasses",
        "storageclass",
        "StorageClass",
        false,
    )
    .short(&["sc"]),
    b(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "poddisruptionbudget",
        "PodDisruptionBudget",
        true,
    )
    .short(&["pdb"])
    .subs(&["status"]),
    b(
        "coordination.k8s.io",
        "v1",
        "leases",
        "lease",
        "Lease",
        true,
    ),
    b(
        "discovery.k8s.io",
        "v1",
        "endpointslices",
        "endpointslice",
        "EndpointSlice",
        true,
    ),
    b("events.k8s.io", "v1", "events", "event", "Event", true).short(&["ev"]),
    b(
        "rbac.authorization.k8s.io",
        "v1",
        "roles",
        "role",
        "Role",
        true,
    ),
    b(
        "rbac.authorization.k8s.io",
        "v1",
        "rolebindings",
        "rolebinding",
        "RoleBinding",
        true,
    ),
    b(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterroles",
        "clusterrole",
        "ClusterRole",
        false,
    ),
    b(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "clusterrolebinding",
        "ClusterRoleBinding",
        false,
    ),
    b(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "customresourcedefinition",
        "CustomResourceDefinition",
        false,
    )
    .short(&["crd", "crds"])
    .subs(&["status"]),
    b(
        "certificates.k8s.io",
        "v1",
        "certificatesigningrequests",
        "certificatesigningrequest",
        "CertificateSigningRequest",
        false,
    )
    .short(&["csr"])
    .subs(&["status", "approval"]),
    b(
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
        "mutatingwebhookconfiguration",
        "MutatingWebhookConfiguration",
        false,
    ),
    b(
        "admissionregistration.k8s.io",
        "v1",
        "validatingwebhookconfigurations",
        "validatingwebhookconfiguration",
        "ValidatingWebhookConfiguration",
        false,
    ),
    b(
        "node.k8s.io",
        "v1",
        "runtimeclasses",
        "runtimeclass",
        "RuntimeClass",
        false,
    ),
    b(
        "scheduling.k8s.io",
        "v1",
        "priorityclasses",
        "priorityclass",
        "PriorityClass",
        false,
    )
    .short(&["pc"]),
    b(
        "authorization.k8s.io",
        "v1",
        "selfsubjectaccessreviews",
        "",
        "SelfSubjectAccessReview",
        false,
    )
    .review(),
    b(
        "authorization.k8s.io",
        "v1",
        "selfsubjectrulesreviews",
        "",
        "SelfSubjectRulesReview",
        false,
    )
    .review(),
    b(
        "authorization.k8s.io",
        "v1",
        "subjectaccessreviews",
        "",
        "SubjectAccessReview",
        false,
    )
    .review(),
    b(
        "authorization.k8s.io",
        "v1",
        "localsubjectaccessreviews",
        "",
        "LocalSubjectAccessReview",
        true,
    )
    .review(),
    b(
        "authentication.k8s.io",
        "v1",
        "selfsubjectreviews",
        "",
        "SelfSubjectReview",
        false,
    )
    .review(),
    b(
        "authentication.k8s.io",
        "v1",
        "tokenreviews",
        "",
        "TokenReview",
        false,
    )
    .review(),
];

/// Every served resource, looked up by group/version/resource or by kind.
#[derive(Default)]
pub struct Registry {
    by_gvr: BTreeMap<(String, String, String), Arc<ResourceInfo>>,
    /// Group → served versions, preferred first.
    groups: BTreeMap<String, Vec<String>>,
    /// Order in which groups were first registered (discovery lists them in this order).
    group_order: Vec<String>,
}

impl Registry {
    /// The built-in resources.
    pub fn builtin() -> Self {
        let mut reg = Registry::default();
        for bi in BUILTINS {
            reg.insert(ResourceInfo {
                group: bi.group.into(),
                version: bi.version.into(),
                resource: bi.resource.into(),
                singular: bi.singular.into(),
                kind: bi.kind.into(),
                namespaced: bi.namespaced,
                short_names: bi.short.iter().map(|s| s.to_string()).collect(),
                categories: bi.categories.iter().map(|s| s.to_string()).collect(),
                subresources: bi.subresources.iter().map(|s| s.to_string()).collect(),
                verbs: if bi.stored { FULL_VERBS } else { CREATE_ONLY }
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
                selectable_fields: crate::store::selectable_fields(&format!(
                    "{}/{}",
                    bi.group, bi.resource
                ))
                .iter()
                .map(|s| s.to_string())
                .collect(),
                stored: bi.stored,
                keeps_status_on_create: matches!(bi.kind, "Node" | "Lease" | "Event"),
                custom: None,
            });
        }
        reg
    }

    /// Adds or replaces one resource version.
    pub fn insert(&mut self, info: ResourceInfo) {
        let versions = self.groups.entry(info.group.clone()).or_default();
        if !versions.contains(&info.version) {
            versions.push(info.version.clone());
            versions.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
        }
        if !self.group_order.contains(&info.group) {
            self.group_order.push(info.group.clone());
        }
        self.by_gvr.insert(
            (
                info.group.clone(),
                info.version.clone(),
                info.resource.clone(),
            ),
            Arc::new(info),
        );
    }

    /// Removes every version of `group/resource` (a CRD was deleted).
    pub fn remove_resource(&mut self, group: &str, resource: &str) {
        self.by_gvr
            .retain(|(g, _, r), _| !(g == group && r == resource));
        let remaining: Vec<String> = self
            .by_gvr
            .keys()
            .filter(|(g, _, _)| g == group)
            .map(|(_, v, _)| v.clone())
            .collect();
        if remaining.is_empty() {
            self.groups.remove(group);
            self.group_order.retain(|g| g != group);
        } else if let Some(versions) = self.groups.get_mut(group) {
            versions.retain(|v| remaining.contains(v));
        }
    }

    /// The resource at group/version/resource.
    pub fn get(&self, group: &str, version: &str, resource: &str) -> Option<Arc<ResourceInfo>> {
        self.by_gvr
            .get(&(group.to_string(), version.to_string(), resource.to_string()))
            .cloned()
    }

    /// The resource of `kind` in `group` at its preferred version.
    pub fn by_kind(&self, group: &str, kind: &str) -> Option<Arc<ResourceInfo>> {
        let versions = self.groups.get(group)?;
        versions.iter().find_map(|v| {
            self.by_gvr
                .range((group.to_string(), v.clone(), String::new())..)
                .take_while(|((g, vv, _), _)| g == group && vv == v)
                .find(|(_, info)| info.kind == kind)
                .map(|(_, info)| info.clone())
        })
    }

    /// The preferred version of `group/resource` (the one the storage uses).
    pub fn preferred(&self, group: &str, resource: &str) -> Option<Arc<ResourceInfo>> {
        let versions = self.groups.get(group)?;
        versions.iter().find_map(|v| self.get(group, v, resource))
    }

    /// Groups in discovery order, each with its versions, preferred first.
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        self.group_order
            .iter()
            .filter_map(|g| self.groups.get(g).map(|v| (g.clone(), v.clone())))
            .collect()
    }

    /// Resources served at group/version.
    pub fn resources_at(&self, group: &str, version: &str) -> Vec<Arc<ResourceInfo>> {
        self.by_gvr
            .iter()
            .filter(|((g, v, _), _)| g == group && v == version)
            .map(|(_, info)| info.clone())
            .collect()
    }

    /// Every stored resource (one entry per group/resource, at its preferred version).
    pub fn stored_resources(&self) -> Vec<Arc<ResourceInfo>> {
        let mut seen = std::collections::BTreeSet::new();
        let mut out = Vec::new();
        for ((g, _, r), _) in self.by_gvr.iter() {
            if seen.insert((g.clone(), r.clone()))
                && let Some(info) = self.preferred(g, r)
                && info.stored
            {
                out.push(info);
            }
        }
        out
    }
}

/// Kubernetes version priority: GA > beta > alpha, then by number.
pub fn version_priority(v: &str) -> (u8, u32, u32) {
    let Some(rest) = v.strip_prefix('v') else {
        return (0, 0, 0);
    };
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    let Ok(major) = digits.parse::<u32>() else {
        return (0, 0, 0);
    };
    let tail = &rest[digits.len()..];
    if tail.is_empty() {
        return (3, major, 0);
    }
    let (stage, num) = if let Some(n) = tail.strip_prefix("beta") {
        (2, n)
    } else if let Some(n) = tail.strip_prefix("alpha") {
        (1, n)
    } else {
        return (0, 0, 0);
    };
    match num.parse::<u32>() {
        Ok(n) => (stage, major, n),
        Err(_) => (0, 0, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_order_matches_kubernetes() {
        let mut versions = vec![
            "v1alpha1", "v2beta1", "v1", "v1beta2", "v2", "foo", "v1beta1",
        ];
        versions.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
        assert_eq!(
            versions,
            vec![
                "v2", "v1", "v2beta1", "v1beta2", "v1beta1", "v1alpha1", "foo"
            ]
        );
    }

    #[test]
    fn builtin_lookup() {
        let reg = Registry::builtin();
        let pods = reg.get("", "v1", "pods").expect("pods served");
        assert!(pods.namespaced && pods.has_status() && pods.has_subresource("binding"));
        assert_eq!(
            reg.by_kind("apps", "Deployment").unwrap().resource,
            "deployments"
        );
        assert!(reg.get("apps", "v1", "pods").is_none());
        assert_eq!(reg.groups()[0].0, "");
        assert!(
            reg.stored_resources()
                .iter()
                .all(|r| r.stored && r.kind != "SubjectAccessReview")
        );
    }
}
