//! RBAC: evaluation of Roles, ClusterRoles and their bindings for a request.
//!
//! A synchronous index of `rbac.authorization.k8s.io/v1` objects, fed by the server as they
//! change, answering "may this user do this?" the way kube-apiserver's RBAC authorizer does
//! (`plugin/pkg/auth/authorizer/rbac`): ClusterRoleBindings are visited first, then the
//! RoleBindings of the request's namespace, and the first rule that covers the request allows
//! it. Nothing ever denies explicitly. ClusterRole aggregation, which kube performs with a
//! controller that rewrites `rules`, is computed here at evaluation time.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde_json::{Map, Value, json};

use crate::selector::{LabelSelector, go_quote};

/// The group whose members may do anything (kube's `user.SystemPrivilegedGroup`).
pub const SYSTEM_MASTERS: &str = "system:masters";

/// Who is asking.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserInfo {
    /// The user name, e.g. `alice` or `system:serviceaccount:ns:sa`.
    pub name: String,
    /// The groups the authenticator put the user in.
    pub groups: Vec<String>,
}

/// What is asked (kube's `authorizer.Attributes`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Attributes<'a> {
    /// The API verb (`get`, `list`, `create`, ...) or the lowercased HTTP verb for paths.
    pub verb: &'a str,
    /// The namespace of the object, "" for cluster-scoped objects and for lists across namespaces.
    pub namespace: &'a str,
    /// The API group, "" for the core group.
    pub api_group: &'a str,
    /// The resource (plural), e.g. `pods`.
    pub resource: &'a str,
    /// The subresource, e.g. `log` or `status`, or "".
    pub subresource: &'a str,
    /// The object name, "" for lists and creates without a name.
    pub name: &'a str,
    /// The request path (what non-resource rules match).
    pub path: &'a str,
    /// Whether this is a request for an API resource rather than a non-resource URL.
    pub resource_request: bool,
}

/// The answer of [`RbacIndex::authorize`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Allowed; the reason names the binding, role and subject that allowed it, as in kube's
    /// SubjectAccessReview `status.reason` (empty for members of `system:masters`, as in kube).
    Allow(String),
    /// No rule allows the request.
    Deny,
}

impl Decision {
    /// Whether the request is allowed.
    pub fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allow(_))
    }
}

/// One rbac/v1 PolicyRule.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct PolicyRule {
    verbs: Vec<String>,
    api_groups: Vec<String>,
    resources: Vec<String>,
    resource_names: Vec<String>,
    non_resource_urls: Vec<String>,
}

impl PolicyRule {
    fn from_json(v: &Value) -> Self {
        PolicyRule {
            verbs: strings(v.get("verbs")),
            api_groups: strings(v.get("apiGroups")),
            resources: strings(v.get("resources")),
            resource_names: strings(v.get("resourceNames")),
            non_resource_urls: strings(v.get("nonResourceURLs")),
        }
    }

    /// The rule as rbac/v1 JSON; empty optional lists are omitted as Go's `omitempty` does.
    fn to_json(&self) -> Value {
        let mut out = Map::new();
        out.insert("verbs".into(), json!(self.verbs));
        for (key, list) in [
            ("apiGroups", &self.api_groups),
            ("resources", &self.resources),
            ("resourceNames", &self.resource_names),
            ("nonResourceURLs", &self.non_resource_urls),
        ] {
            if !list.is_empty() {
                out.insert(key.into(), json!(list));
            }
        }
        Value::Object(out)
    }

    /// `rbac.RuleAllows`.
    fn allows(&self, attrs: &Attributes) -> bool {
        let verb = self.verbs.iter().any(|v| v == "*" || v == attrs.verb);
        if !verb {
            return false;
        }
        if !attrs.resource_request {
            return self.non_resource_urls.iter().any(|url| {
                url == "*"
                    || url == attrs.path
                    || (url.ends_with('*') && attrs.path.starts_with(url.trim_end_matches('*')))
            });
        }
        let combined = if attrs.subresource.is_empty() {
            attrs.resource.to_string()
        } else {
            format!("{}/{}", attrs.resource, attrs.subresource)
        };
        self.api_groups
            .iter()
            .any(|g| g == "*" || g == attrs.api_group)
            // `*/sub` matches a subresource of any resource; `pods/*` is not a wildcard in kube.
            && self.resources.iter().any(|r| {
                r == "*"
                    || *r == combined
                    || (!attrs.subresource.is_empty()
                        && r.strip_prefix("*/") == Some(attrs.subresource))
            })
            && (self.resource_names.is_empty()
                || self.resource_names.iter().any(|n| n == attrs.name))
    }
}

impl PolicyRule {
    /// `BreakdownRule`: one rule per verb x group x resource (x name), and per verb x URL.
    fn breakdown(&self) -> Vec<PolicyRule> {
        let one = |s: &String| vec![s.clone()];
        let mut out = Vec::new();
        for group in &self.api_groups {
            for resource in &self.resources {
                for verb in &self.verbs {
                    let names: Vec<Vec<String>> = if self.resource_names.is_empty() {
                        vec![Vec::new()]
                    } else {
                        self.resource_names.iter().map(one).collect()
                    };
                    for resource_names in names {
                        out.push(PolicyRule {
                            verbs: one(verb),
                            api_groups: one(group),
                            resources: one(resource),
                            resource_names,
                            non_resource_urls: Vec::new(),
                        });
                    }
                }
            }
        }
        for url in &self.non_resource_urls {
            for verb in &self.verbs {
                out.push(PolicyRule {
                    verbs: one(verb),
                    non_resource_urls: one(url),
                    ..PolicyRule::default()
                });
            }
        }
        out
    }

    /// `ruleCovers`: whether holding `self` includes every permission of `sub`.
    fn covers(&self, sub: &PolicyRule) -> bool {
        let has = |set: &[String], item: &str| set.iter().any(|s| s == item);
        let has_all = |set: &[String], items: &[String]| items.iter().all(|i| has(set, i));
        let verbs = has(&self.verbs, "*") || has_all(&self.verbs, &sub.verbs);
        let groups = has(&self.api_groups, "*") || has_all(&self.api_groups, &sub.api_groups);
        let resources = has(&self.resources, "*")
            || sub.resources.iter().all(|r| {
                has(&self.resources, r)
                    || r.split_once('/').is_some_and(|(_, subresource)| {
                        has(&self.resources, &format!("*/{subresource}"))
                    })
            });
        let urls = sub.non_resource_urls.iter().all(|url| {
            self.non_resource_urls.iter().any(|owner| {
                owner == url
                    || (owner.ends_with('*') && url.starts_with(owner.trim_end_matches('*')))
            })
        });
        let names = self.resource_names.is_empty()
            || (!sub.resource_names.is_empty()
                && has_all(&self.resource_names, &sub.resource_names));
        verbs && groups && resources && urls && names
    }
}

/// The strings of a JSON array; absent, `null` and non-string items count as nothing.
fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(|i| i.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn str_field<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn rules_of(obj: &Value) -> Vec<PolicyRule> {
    obj.get("rules")
        .and_then(Value::as_array)
        .map(|rules| rules.iter().map(PolicyRule::from_json).collect())
        .unwrap_or_default()
}

#[derive(Clone, Debug)]
struct ClusterRole {
    labels: BTreeMap<String, String>,
    rules: Vec<PolicyRule>,
    /// `aggregationRule.clusterRoleSelectors`; `Some` means `rules` is replaced by the rules
    /// of the selected ClusterRoles. A selector kube would reject selects nothing here.
    aggregation: Option<Vec<LabelSelector>>,
}

#[derive(Clone, Debug)]
struct Subject {
    kind: String,
    name: String,
    namespace: String,
}

impl Subject {
    /// `appliesToUser`: a ServiceAccount without namespace is in `namespace` (the binding's).
    fn applies_to(&self, user: &UserInfo, namespace: &str) -> bool {
        match self.kind.as_str() {
            "User" => user.name == self.name,
            "Group" => user.groups.contains(&self.name),
            "ServiceAccount" => {
                let ns = if self.namespace.is_empty() {
                    namespace
                } else {
                    &self.namespace
                };
                !ns.is_empty()
                    && user
                        .name
                        .strip_prefix("system:serviceaccount:")
                        .and_then(|rest| rest.strip_prefix(ns))
                        .and_then(|rest| rest.strip_prefix(':'))
                        == Some(self.name.as_str())
            }
            _ => false,
        }
    }

    /// `describeSubject`, as it appears in an "allowed by" reason.
    fn describe(&self, binding_namespace: &str) -> String {
        if self.kind == "ServiceAccount" {
            let ns = if self.namespace.is_empty() {
                binding_namespace
            } else {
                &self.namespace
            };
            format!("{} {}", self.kind, go_quote(&format!("{}/{ns}", self.name)))
        } else {
            format!("{} {}", self.kind, go_quote(&self.name))
        }
    }
}

#[derive(Clone, Debug)]
struct Binding {
    name: String,
    namespace: String,
    role_kind: String,
    role_name: String,
    subjects: Vec<Subject>,
}

impl Binding {
    fn from_json(obj: &Value) -> Self {
        let subjects = obj
            .get("subjects")
            .and_then(Value::as_array)
            .map(|subjects| {
                subjects
                    .iter()
                    .map(|s| Subject {
                        kind: str_field(s, "/kind").to_string(),
                        name: str_field(s, "/name").to_string(),
                        namespace: str_field(s, "/namespace").to_string(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        Binding {
            name: str_field(obj, "/metadata/name").to_string(),
            namespace: str_field(obj, "/metadata/namespace").to_string(),
            role_kind: str_field(obj, "/roleRef/kind").to_string(),
            role_name: str_field(obj, "/roleRef/name").to_string(),
            subjects,
        }
    }

    /// The first subject that is `user` (for a RoleBinding, `namespace` is its own).
    fn subject_for(&self, user: &UserInfo, namespace: &str) -> Option<&Subject> {
        self.subjects.iter().find(|s| s.applies_to(user, namespace))
    }
}

/// Where a rule came from, rendered like kube's `clusterRoleBindingDescriber` /
/// `roleBindingDescriber` only when a rule allows the request.
struct RuleSource<'a> {
    binding: &'a Binding,
    subject: &'a Subject,
}

impl fmt::Display for RuleSource<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.binding;
        if b.namespace.is_empty() {
            write!(
                f,
                "ClusterRoleBinding {} of {} {} to {}",
                go_quote(&b.name),
                b.role_kind,
                go_quote(&b.role_name),
                self.subject.describe("")
            )
        } else {
            write!(
                f,
                "RoleBinding {} of {} {} to {}",
                go_quote(&format!("{}/{}", b.name, b.namespace)),
                b.role_kind,
                go_quote(&b.role_name),
                self.subject.describe(&b.namespace)
            )
        }
    }
}

/// Roles, ClusterRoles and bindings, kept current by the server through `apply` / `delete`.
#[derive(Default, Debug)]
pub struct RbacIndex {
    /// Roles by (namespace, name).
    roles: HashMap<(String, String), Vec<PolicyRule>>,
    /// ClusterRoles by name; ordered so aggregation visits them by name, as kube's controller.
    cluster_roles: BTreeMap<String, ClusterRole>,
    /// RoleBindings by namespace, then name.
    role_bindings: HashMap<String, BTreeMap<String, Binding>>,
    /// ClusterRoleBindings by name.
    cluster_role_bindings: BTreeMap<String, Binding>,
}

impl RbacIndex {
    /// Inserts or replaces an RBAC object (kind = "Role" | "ClusterRole" | "RoleBinding" |
    /// "ClusterRoleBinding"); other kinds are ignored.
    pub fn apply(&mut self, kind: &str, obj: &Value) {
        let name = str_field(obj, "/metadata/name").to_string();
        let namespace = str_field(obj, "/metadata/namespace").to_string();
        match kind {
            "Role" => {
                self.roles.insert((namespace, name), rules_of(obj));
            }
            "ClusterRole" => {
                let labels = obj
                    .pointer("/metadata/labels")
                    .and_then(Value::as_object)
                    .map(|l| {
                        l.iter()
                            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                            .collect()
                    })
                    .unwrap_or_default();
                let aggregation = match obj.get("aggregationRule") {
                    None | Some(Value::Null) => None,
                    Some(rule) => Some(
                        rule.get("clusterRoleSelectors")
                            .and_then(Value::as_array)
                            .map(|selectors| {
                                selectors
                                    .iter()
                                    .map(|s| {
                                        LabelSelector::from_metav1(Some(s))
                                            .unwrap_or_else(|_| LabelSelector::nothing())
                                    })
                                    .collect()
                            })
                            .unwrap_or_default(),
                    ),
                };
                self.cluster_roles.insert(
                    name,
                    ClusterRole {
                        labels,
                        rules: rules_of(obj),
                        aggregation,
                    },
                );
            }
            "RoleBinding" => {
                self.role_bindings
                    .entry(namespace)
                    .or_default()
                    .insert(name, Binding::from_json(obj));
            }
            "ClusterRoleBinding" => {
                self.cluster_role_bindings
                    .insert(name, Binding::from_json(obj));
            }
            _ => {}
        }
    }

    /// Removes an RBAC object; removing one that is not there does nothing.
    pub fn delete(&mut self, kind: &str, namespace: &str, name: &str) {
        match kind {
            "Role" => {
                self.roles
                    .remove(&(namespace.to_string(), name.to_string()));
            }
            "ClusterRole" => {
                self.cluster_roles.remove(name);
            }
            "RoleBinding" => {
                if let Some(bindings) = self.role_bindings.get_mut(namespace) {
                    bindings.remove(name);
                    if bindings.is_empty() {
                        self.role_bindings.remove(namespace);
                    }
                }
            }
            "ClusterRoleBinding" => {
                self.cluster_role_bindings.remove(name);
            }
            _ => {}
        }
    }

    /// Forgets everything (before a re-list).
    pub fn reset(&mut self) {
        *self = RbacIndex::default();
    }

    /// Allowed or denied, with the rule or binding that allowed it (for SubjectAccessReview
    /// status.reason).
    pub fn authorize(&self, user: &UserInfo, attrs: &Attributes) -> Decision {
        if user.groups.iter().any(|g| g == SYSTEM_MASTERS) {
            // kube-apiserver puts a privileged-group authorizer before RBAC; it gives no reason.
            return Decision::Allow(String::new());
        }
        let mut decision = Decision::Deny;
        self.visit_rules_for(user, attrs.namespace, |source, rule| {
            if rule.allows(attrs) {
                decision = Decision::Allow(format!("RBAC: allowed by {source}"));
                false
            } else {
                true
            }
        });
        decision
    }

    /// The rules that apply to `user` in `namespace` (for SelfSubjectRulesReview /
    /// `kubectl auth can-i --list`): those of its ClusterRoleBindings, then of the
    /// RoleBindings in `namespace`, in that order, duplicates kept as kube does.
    pub fn rules_for(&self, user: &UserInfo, namespace: &str) -> Vec<Value> {
        let mut rules = Vec::new();
        self.visit_rules_for(user, namespace, |_, rule| {
            rules.push(rule.to_json());
            true
        });
        rules
    }

    /// Kube's escalation check (`ConfirmNoEscalation`): the permissions in `rules` (rbac/v1
    /// PolicyRule JSON) that `user` does not hold in `namespace` ("" = cluster-wide), each
    /// broken down to one verb on one resource, name or URL. Creating a Role, or binding one,
    /// with these rules is allowed without the `escalate` / `bind` verbs only when this is
    /// empty. Members of system:masters hold everything.
    pub fn missing_rules(&self, user: &UserInfo, namespace: &str, rules: &[Value]) -> Vec<Value> {
        if user.groups.iter().any(|g| g == SYSTEM_MASTERS) {
            return Vec::new();
        }
        let mut owned = Vec::new();
        self.visit_rules_for(user, namespace, |_, rule| {
            owned.push(rule.clone());
            true
        });
        let mut missing: Vec<PolicyRule> = Vec::new();
        for simple in rules
            .iter()
            .flat_map(|r| PolicyRule::from_json(r).breakdown())
        {
            if !owned.iter().any(|o| o.covers(&simple)) && !missing.contains(&simple) {
                missing.push(simple);
            }
        }
        missing.iter().map(PolicyRule::to_json).collect()
    }

    /// The rules a binding in `namespace` ("" for a ClusterRoleBinding) of `role_kind`
    /// `role_name` grants, as rbac/v1 PolicyRule JSON (`GetRoleReferenceRules`): empty for a
    /// role that does not exist.
    pub fn bound_rules(&self, namespace: &str, role_kind: &str, role_name: &str) -> Vec<Value> {
        let binding = Binding {
            name: String::new(),
            namespace: namespace.to_string(),
            role_kind: role_kind.to_string(),
            role_name: role_name.to_string(),
            subjects: Vec::new(),
        };
        self.role_ref_rules(&binding, namespace)
            .into_iter()
            .map(PolicyRule::to_json)
            .collect()
    }

    /// `DefaultRuleResolver.VisitRulesFor`: calls `visit` with each rule granted to `user` in
    /// `namespace` until it returns false. Bindings to missing roles grant nothing.
    fn visit_rules_for(
        &self,
        user: &UserInfo,
        namespace: &str,
        mut visit: impl FnMut(&RuleSource, &PolicyRule) -> bool,
    ) {
        let cluster = self.cluster_role_bindings.values().map(|b| (b, ""));
        let namespaced = (!namespace.is_empty())
            .then(|| self.role_bindings.get(namespace))
            .flatten()
            .into_iter()
            .flat_map(|bindings| bindings.values().map(|b| (b, namespace)));
        for (binding, binding_namespace) in cluster.chain(namespaced) {
            let Some(subject) = binding.subject_for(user, binding_namespace) else {
                continue;
            };
            let source = RuleSource { binding, subject };
            for rule in self.role_ref_rules(binding, binding_namespace) {
                if !visit(&source, rule) {
                    return;
                }
            }
        }
    }

    /// `GetRoleReferenceRules`: a Role is looked up in the binding's namespace.
    fn role_ref_rules<'a>(
        &'a self,
        binding: &'a Binding,
        binding_namespace: &str,
    ) -> Vec<&'a PolicyRule> {
        match binding.role_kind.as_str() {
            // A ClusterRoleBinding has no namespace to find a Role in (kube rejects it anyway).
            "Role" if binding_namespace.is_empty() => Vec::new(),
            "Role" => self
                .roles
                .get(&(binding_namespace.to_string(), binding.role_name.clone()))
                .map(|rules| rules.iter().collect())
                .unwrap_or_default(),
            "ClusterRole" => {
                let mut visiting = Vec::new();
                self.cluster_role_rules(&binding.role_name, &mut visiting)
            }
            _ => Vec::new(),
        }
    }

    /// The effective rules of a ClusterRole: its own, or for an aggregated one the distinct
    /// rules of the ClusterRoles its selectors match (by selector, then by name), themselves
    /// aggregated. `visiting` breaks aggregation cycles.
    fn cluster_role_rules<'a>(
        &'a self,
        name: &'a str,
        visiting: &mut Vec<&'a str>,
    ) -> Vec<&'a PolicyRule> {
        let Some(role) = self.cluster_roles.get(name) else {
            return Vec::new();
        };
        let Some(selectors) = &role.aggregation else {
            return role.rules.iter().collect();
        };
        visiting.push(name);
        let mut rules: Vec<&PolicyRule> = Vec::new();
        for selector in selectors {
            for (other_name, other) in &self.cluster_roles {
                if other_name == name
                    || visiting.contains(&other_name.as_str())
                    || !selector.matches(|k| other.labels.get(k).map(String::as_str))
                {
                    continue;
                }
                for rule in self.cluster_role_rules(other_name, visiting) {
                    if !rules.contains(&rule) {
                        rules.push(rule);
                    }
                }
            }
        }
        visiting.pop();
        rules
    }
}

/// The message kube-apiserver puts in a 403: `User "alice" cannot list resource "pods" in API
/// group "" in the namespace "default"` (resource `pods/log` with a subresource, `at the
/// cluster scope` without namespace, `cannot get path "/foo"` for non-resource requests).
pub fn forbidden_message(user: &UserInfo, attrs: &Attributes) -> String {
    let user_name = go_quote(&user.name);
    if !attrs.resource_request {
        return format!(
            "User {user_name} cannot {} path {}",
            attrs.verb,
            go_quote(attrs.path)
        );
    }
    let resource = if attrs.subresource.is_empty() {
        attrs.resource.to_string()
    } else {
        format!("{}/{}", attrs.resource, attrs.subresource)
    };
    let scope = if attrs.namespace.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace {}", go_quote(attrs.namespace))
    };
    format!(
        "User {user_name} cannot {} resource {} in API group {} {scope}",
        attrs.verb,
        go_quote(&resource),
        go_quote(attrs.api_group)
    )
}

const READ: [&str; 3] = ["get", "list", "watch"];
const WRITE: [&str; 5] = ["create", "delete", "deletecollection", "patch", "update"];

fn rule(verbs: &[&str], groups: &[&str], resources: &[&str]) -> Value {
    json!({"apiGroups": groups, "resources": resources, "verbs": verbs})
}

fn bootstrap_cluster_role(name: &str, extra_labels: &[&str], rules: Vec<Value>) -> Value {
    let mut labels = Map::new();
    labels.insert("kubernetes.io/bootstrapping".into(), json!("rbac-defaults"));
    for label in extra_labels {
        labels.insert((*label).into(), json!("true"));
    }
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
        },
        "rules": rules,
    })
}

fn aggregated_cluster_role(name: &str, extra_labels: &[&str], aggregate_label: &str) -> Value {
    let mut role = bootstrap_cluster_role(name, extra_labels, Vec::new());
    role["aggregationRule"] = json!({
        "clusterRoleSelectors": [{"matchLabels": {aggregate_label: "true"}}]
    });
    role
}

fn bootstrap_binding(name: &str, groups: &[&str]) -> Value {
    let subjects: Vec<Value> = groups
        .iter()
        .map(|g| json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": g}))
        .collect();
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
            "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
        },
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": subjects,
    })
}

/// The default cluster roles and bindings kube-apiserver bootstraps (from kube's
/// `bootstrappolicy` testdata): cluster-admin bound to system:masters; the aggregated admin,
/// edit and view roles with the `system:aggregate-to-*` roles that feed them;
/// system:discovery, system:basic-user and system:public-info-viewer with their bindings;
/// system:auth-delegator and the CSR node-client roles. Objects are ready to store.
pub fn bootstrap_policy() -> Vec<Value> {
    const TO_ADMIN: &str = "rbac.authorization.k8s.io/aggregate-to-admin";
    const TO_EDIT: &str = "rbac.authorization.k8s.io/aggregate-to-edit";
    const TO_VIEW: &str = "rbac.authorization.k8s.io/aggregate-to-view";
    let mut sorted_all: Vec<&str> = WRITE.iter().chain(READ.iter()).copied().collect();
    sorted_all.sort();
    vec![
        bootstrap_cluster_role(
            "cluster-admin",
            &[],
            vec![
                rule(&["*"], &["*"], &["*"]),
                json!({"nonResourceURLs": ["*"], "verbs": ["*"]}),
            ],
        ),
        aggregated_cluster_role("admin", &[], TO_ADMIN),
        aggregated_cluster_role("edit", &[TO_ADMIN], TO_EDIT),
        aggregated_cluster_role("view", &[TO_EDIT], TO_VIEW),
        bootstrap_cluster_role(
            "system:aggregate-to-admin",
            &[TO_ADMIN],
            vec![
                rule(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["localsubjectaccessreviews"],
                ),
                rule(
                    &sorted_all,
                    &["rbac.authorization.k8s.io"],
                    &["rolebindings", "roles"],
                ),
            ],
        ),
        bootstrap_cluster_role(
            "system:aggregate-to-edit",
            &[TO_EDIT],
            vec![
                rule(
                    &READ,
                    &[""],
                    &[
                        "pods/attach",
                        "pods/exec",
                        "pods/portforward",
                        "pods/proxy",
                        "secrets",
                        "services/proxy",
                    ],
                ),
                rule(&["impersonate"], &[""], &["serviceaccounts"]),
                rule(
                    &WRITE,
                    &[""],
                    &[
                        "pods",
                        "pods/attach",
                        "pods/exec",
                        "pods/portforward",
                        "pods/proxy",
                    ],
                ),
                rule(&["create"], &[""], &["pods/eviction"]),
                rule(
                    &WRITE,
                    &[""],
                    &[
                        "configmaps",
                        "events",
                        "persistentvolumeclaims",
                        "replicationcontrollers",
                        "replicationcontrollers/scale",
                        "secrets",
                        "serviceaccounts",
                        "services",
                        "services/proxy",
                    ],
                ),
                rule(&["create"], &[""], &["serviceaccounts/token"]),
                rule(
                    &WRITE,
                    &["apps"],
                    &[
                        "daemonsets",
                        "deployments",
                        "deployments/rollback",
                        "deployments/scale",
                        "replicasets",
                        "replicasets/scale",
                        "statefulsets",
                        "statefulsets/scale",
                    ],
                ),
                rule(&WRITE, &["autoscaling"], &["horizontalpodautoscalers"]),
                rule(&WRITE, &["batch"], &["cronjobs", "jobs"]),
                rule(
                    &WRITE,
                    &["extensions"],
                    &[
                        "daemonsets",
                        "deployments",
                        "deployments/rollback",
                        "deployments/scale",
                        "ingresses",
                        "networkpolicies",
                        "replicasets",
                        "replicasets/scale",
                        "replicationcontrollers/scale",
                    ],
                ),
                rule(&WRITE, &["policy"], &["poddisruptionbudgets"]),
                rule(
                    &WRITE,
                    &["networking.k8s.io"],
                    &["ingresses", "networkpolicies"],
                ),
                rule(&sorted_all, &["coordination.k8s.io"], &["leases"]),
            ],
        ),
        bootstrap_cluster_role(
            "system:aggregate-to-view",
            &[TO_VIEW],
            vec![
                rule(
                    &READ,
                    &[""],
                    &[
                        "configmaps",
                        "endpoints",
                        "persistentvolumeclaims",
                        "persistentvolumeclaims/status",
                        "pods",
                        "replicationcontrollers",
                        "replicationcontrollers/scale",
                        "serviceaccounts",
                        "services",
                        "services/status",
                    ],
                ),
                rule(
                    &READ,
                    &[""],
                    &[
                        "bindings",
                        "events",
                        "limitranges",
                        "namespaces/status",
                        "pods/log",
                        "pods/status",
                        "replicationcontrollers/status",
                        "resourcequotas",
                        "resourcequotas/status",
                    ],
                ),
                rule(&READ, &[""], &["namespaces"]),
                rule(&READ, &["discovery.k8s.io"], &["endpointslices"]),
                rule(
                    &READ,
                    &["apps"],
                    &[
                        "controllerrevisions",
                        "daemonsets",
                        "daemonsets/status",
                        "deployments",
                        "deployments/scale",
                        "deployments/status",
                        "replicasets",
                        "replicasets/scale",
                        "replicasets/status",
                        "statefulsets",
                        "statefulsets/scale",
                        "statefulsets/status",
                    ],
                ),
                rule(
                    &READ,
                    &["autoscaling"],
                    &[
                        "horizontalpodautoscalers",
                        "horizontalpodautoscalers/status",
                    ],
                ),
                rule(
                    &READ,
                    &["batch"],
                    &["cronjobs", "cronjobs/status", "jobs", "jobs/status"],
                ),
                rule(
                    &READ,
                    &["extensions"],
                    &[
                        "daemonsets",
                        "daemonsets/status",
                        "deployments",
                        "deployments/scale",
                        "deployments/status",
                        "ingresses",
                        "ingresses/status",
                        "networkpolicies",
                        "replicasets",
                        "replicasets/scale",
                        "replicasets/status",
                        "replicationcontrollers/scale",
                    ],
                ),
                rule(
                    &READ,
                    &["policy"],
                    &["poddisruptionbudgets", "poddisruptionbudgets/status"],
                ),
                rule(
                    &READ,
                    &["networking.k8s.io"],
                    &["ingresses", "ingresses/status", "networkpolicies"],
                ),
            ],
        ),
        bootstrap_cluster_role(
            "system:discovery",
            &[],
            vec![json!({
                "nonResourceURLs": [
                    "/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi",
                    "/openapi/*", "/readyz", "/version", "/version/"
                ],
                "verbs": ["get"],
            })],
        ),
        bootstrap_cluster_role(
            "system:basic-user",
            &[],
            vec![
                rule(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                ),
                rule(
                    &["create"],
                    &["authentication.k8s.io"],
                    &["selfsubjectreviews"],
                ),
            ],
        ),
        bootstrap_cluster_role(
            "system:public-info-viewer",
            &[],
            vec![json!({
                "nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"],
                "verbs": ["get"],
            })],
        ),
        bootstrap_cluster_role(
            "system:auth-delegator",
            &[],
            vec![
                rule(&["create"], &["authentication.k8s.io"], &["tokenreviews"]),
                rule(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["subjectaccessreviews"],
                ),
            ],
        ),
        bootstrap_cluster_role(
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            &[],
            vec![rule(
                &["create"],
                &["certificates.k8s.io"],
                &["certificatesigningrequests/nodeclient"],
            )],
        ),
        bootstrap_cluster_role(
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            &[],
            vec![rule(
                &["create"],
                &["certificates.k8s.io"],
                &["certificatesigningrequests/selfnodeclient"],
            )],
        ),
        bootstrap_binding("cluster-admin", &[SYSTEM_MASTERS]),
        bootstrap_binding("system:discovery", &["system:authenticated"]),
        bootstrap_binding("system:basic-user", &["system:authenticated"]),
        bootstrap_binding(
            "system:public-info-viewer",
            &["system:authenticated", "system:unauthenticated"],
        ),
    ]
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo {
            name: name.to_string(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        }
    }

    fn alice() -> UserInfo {
        user("alice", &["system:authenticated"])
    }

    fn role(ns: &str, name: &str, rules: Value) -> (&'static str, Value) {
        (
            "Role",
            json!({"metadata": {"namespace": ns, "name": name}, "rules": rules}),
        )
    }

    fn cluster_role(name: &str, labels: Value, rules: Value) -> (&'static str, Value) {
        (
            "ClusterRole",
            json!({"metadata": {"name": name, "labels": labels}, "rules": rules}),
        )
    }

    fn aggregated(
        name: &str,
        labels: Value,
        selectors: Value,
        rules: Value,
    ) -> (&'static str, Value) {
        (
            "ClusterRole",
            json!({
                "metadata": {"name": name, "labels": labels},
                "aggregationRule": {"clusterRoleSelectors": selectors},
                "rules": rules,
            }),
        )
    }

    fn role_binding(
        ns: &str,
        name: &str,
        role_kind: &str,
        role_name: &str,
        subjects: Value,
    ) -> (&'static str, Value) {
        (
            "RoleBinding",
            json!({
                "metadata": {"namespace": ns, "name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role_name},
                "subjects": subjects,
            }),
        )
    }

    fn cluster_binding(
        name: &str,
        role_kind: &str,
        role_name: &str,
        subjects: Value,
    ) -> (&'static str, Value) {
        (
            "ClusterRoleBinding",
            json!({
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role_name},
                "subjects": subjects,
            }),
        )
    }

    fn user_subject(name: &str) -> Value {
        json!([{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": name}])
    }

    fn resource(
        verb: &'static str,
        namespace: &'static str,
        api_group: &'static str,
        resource: &'static str,
    ) -> Attributes<'static> {
        Attributes {
            verb,
            namespace,
            api_group,
            resource,
            resource_request: true,
            ..Attributes::default()
        }
    }

    fn named(mut attrs: Attributes<'static>, name: &'static str) -> Attributes<'static> {
        attrs.name = name;
        attrs
    }

    fn sub(mut attrs: Attributes<'static>, subresource: &'static str) -> Attributes<'static> {
        attrs.subresource = subresource;
        attrs
    }

    fn path(verb: &'static str, path: &'static str) -> Attributes<'static> {
        Attributes {
            verb,
            path,
            ..Attributes::default()
        }
    }

    fn index(objects: &[(&str, Value)]) -> RbacIndex {
        let mut index = RbacIndex::default();
        for (kind, obj) in objects {
            index.apply(kind, obj);
        }
        index
    }

    struct Case {
        name: &'static str,
        objects: Vec<(&'static str, Value)>,
        user: UserInfo,
        attrs: Attributes<'static>,
        /// `None`: denied; `Some(reason)`: allowed with this reason.
        expected: Option<&'static str>,
    }

    fn check(cases: Vec<Case>) {
        for case in cases {
            let got = index(&case.objects).authorize(&case.user, &case.attrs);
            let want = match case.expected {
                Some(reason) => Decision::Allow(reason.to_string()),
                None => Decision::Deny,
            };
            assert_eq!(got, want, "case {:?}", case.name);
        }
    }

    /// Alice is bound in namespace `a` to a Role `r` with `rules`.
    fn alice_role_in_a(rules: Value) -> Vec<(&'static str, Value)> {
        vec![
            role("a", "r", rules),
            role_binding("a", "rb", "Role", "r", user_subject("alice")),
        ]
    }

    const ALICE_RB: &str = r#"RBAC: allowed by RoleBinding "rb/a" of Role "r" to User "alice""#;

    #[test]
    fn rule_features() {
        let get_pods = json!([{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}]);
        check(vec![
            Case {
                name: "no bindings",
                objects: vec![],
                user: alice(),
                attrs: resource("get", "a", "", "pods"),
                expected: None,
            },
            Case {
                name: "exact verb, group and resource",
                objects: alice_role_in_a(get_pods.clone()),
                user: alice(),
                attrs: resource("get", "a", "", "pods"),
                expected: Some(ALICE_RB),
            },
            Case {
                name: "other verb",
                objects: alice_role_in_a(get_pods.clone()),
                user: alice(),
                attrs: resource("list", "a", "", "pods"),
                expected: None,
            },
            Case {
                name: "other resource",
                objects: alice_role_in_a(get_pods.clone()),
                user: alice(),
                attrs: resource("get", "a", "", "secrets"),
                expected: None,
            },
            Case {
                name: "other group",
                objects: alice_role_in_a(get_pods.clone()),
                user: alice(),
                attrs: resource("get", "a", "example.com", "pods"),
                expected: None,
            },
            Case {
                name: "verb wildcard",
                objects: alice_role_in_a(
                    json!([{"verbs": ["*"], "apiGroups": [""], "resources": ["pods"]}]),
                ),
                user: alice(),
                attrs: resource("deletecollection", "a", "", "pods"),
                expected: Some(ALICE_RB),
            },
            Case {
                name: "group wildcard",
                objects: alice_role_in_a(
                    json!([{"verbs": ["get"], "apiGroups": ["*"], "resources": ["deployments"]}]),
                ),
                user: alice(),
                attrs: resource("get", "a", "apps", "deployments"),
                expected: Some(ALICE_RB),
            },
            Case {
                name: "no apiGroups matches no group",
                objects: alice_role_in_a(json!([{"verbs": ["get"], "resources": ["pods"]}])),
                user: alice(),
                attrs: resource("get", "a", "", "pods"),
                expected: None,
            },
            Case {
                name: "resource wildcard covers subresources",
                objects: alice_role_in_a(
                    json!([{"verbs": ["get"], "apiGroups": [""], "resources": ["*"]}]),
                ),
                user: alice(),
                attrs: sub(resource("get", "a", "", "pods"), "log"),
                expected: Some(ALICE_RB),
            },
            Case {
                name: "resource does not cover its subresources",
                objects: alice_role_in_a(get_pods.clone()),
                user: alice(),
                attrs: sub(resource("get", "a", "", "pods"), "log"),
                expected: None,
            },
            Case {
                name: "resource/subresource",
                objects: alice_role_in_a(
                    json!([{"verbs": ["get"], "apiGroups": [""], "resources": ["pods/log"]}]),
                ),
                user: alice(),
                attrs: sub(resource("get", "a", "", "pods"), "log"),
                expected: Some(ALICE_RB),
            },
            Case {
                name: "resource/subresource does not cover the resource",
                objects: alice_role_in_a(
                    json!([{"verbs": ["get"], "apiGroups": [""], "resources": ["pods/log"]}]),
                ),
                user: alice(),
                attrs: resource("get", "a", "", "pods"),
                expected: None,
            },
            Case {
                name: "*/subresource covers that subresource of any resource",
                objects: alice_role_in_a(
                    json!([{"verbs": ["update"], "apiGroups": ["apps"], "resources": ["*/status"]}]),
                ),
                user: alice(),
                attrs: sub(resource("update", "a", "apps", "deployments"), "status"),
                expected: Some(ALICE_RB),
            },
            Case {
                name: "*/subresource does not cover the resource",
                objects: alice_role_in_a(
                    json!([{"verbs": ["update"], "apiGroups": ["apps"], "resources": ["*/status"]}]),
                ),
                user: alice(),
                attrs: resource("update", "a", "apps", "deployments"),
                expected: None,
            },
            Case {
                name: "*/subresource does not cover another subresource",
                objects: alice_role_in_a(
                    json!([{"verbs": ["update"], "apiGroups": ["apps"], "resources": ["*/status"]}]),
                ),
                user: alice(),
                attrs: sub(resource("update", "a", "apps", "deployments"), "scale"),
                expected: None,
            },
            Case {
                name: "resource/* is not a wildcard in kube",
                objects: alice_role_in_a(
                    json!([{"verbs": ["get"], "apiGroups": [""], "resources": ["pods/*"]}]),
                ),
                user: alice(),
                attrs: sub(resource("get", "a", "", "pods"), "log"),
                expected: None,
            },
            Case {
                name: "resourceNames allow the named object",
                objects: alice_role_in_a(
                    json!([{"verbs": ["get"], "apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["web"]}]),
                ),
                user: alice(),
                attrs: named(resource("get", "a", "", "configmaps"), "web"),
                expected: Some(ALICE_RB),
            },
            Case {
                name: "resourceNames deny other objects",
                objects: alice_role_in_a(
                    json!([{"verbs": ["get"], "apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["web"]}]),
                ),
                user: alice(),
                attrs: named(resource("get", "a", "", "configmaps"), "db"),
                expected: None,
            },
            Case {
                name: "resourceNames deny unnamed requests (list)",
                objects: alice_role_in_a(
                    json!([{"verbs": ["list"], "apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["web"]}]),
                ),
                user: alice(),
                attrs: resource("list", "a", "", "configmaps"),
                expected: None,
            },
            Case {
                name: "empty resourceNames allow any name",
                objects: alice_role_in_a(get_pods.clone()),
                user: alice(),
                attrs: named(resource("get", "a", "", "pods"), "anything"),
                expected: Some(ALICE_RB),
            },
            Case {
                name: "second rule of a role",
                objects: alice_role_in_a(json!([
                    {"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]},
                    {"verbs": ["list"], "apiGroups": ["batch"], "resources": ["jobs"]},
                ])),
                user: alice(),
                attrs: resource("list", "a", "batch", "jobs"),
                expected: Some(ALICE_RB),
            },
            Case {
                name: "verbs and resources must match in the same rule",
                objects: alice_role_in_a(json!([
                    {"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]},
                    {"verbs": ["list"], "apiGroups": [""], "resources": ["secrets"]},
                ])),
                user: alice(),
                attrs: resource("list", "a", "", "pods"),
                expected: None,
            },
        ]);
    }

    #[test]
    fn subjects_and_namespace_scoping() {
        let get_pods = json!([{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}]);
        let robot = || user("system:serviceaccount:a:robot", &["system:serviceaccounts"]);
        check(vec![
            Case {
                name: "a RoleBinding in a does not grant in b",
                objects: alice_role_in_a(get_pods.clone()),
                user: alice(),
                attrs: resource("get", "b", "", "pods"),
                expected: None,
            },
            Case {
                name: "a RoleBinding does not grant across all namespaces",
                objects: alice_role_in_a(get_pods.clone()),
                user: alice(),
                attrs: resource("get", "", "", "pods"),
                expected: None,
            },
            Case {
                name: "another user",
                objects: alice_role_in_a(get_pods.clone()),
                user: user("bob", &["system:authenticated"]),
                attrs: resource("get", "a", "", "pods"),
                expected: None,
            },
            Case {
                name: "group subject, member",
                objects: vec![
                    role("a", "r", get_pods.clone()),
                    role_binding(
                        "a",
                        "devs",
                        "Role",
                        "r",
                        json!([{"kind": "Group", "name": "devs"}]),
                    ),
                ],
                user: user("carol", &["devs"]),
                attrs: resource("get", "a", "", "pods"),
                expected: Some(
                    r#"RBAC: allowed by RoleBinding "devs/a" of Role "r" to Group "devs""#,
                ),
            },
            Case {
                name: "group subject, not a member",
                objects: vec![
                    role("a", "r", get_pods.clone()),
                    role_binding(
                        "a",
                        "devs",
                        "Role",
                        "r",
                        json!([{"kind": "Group", "name": "devs"}]),
                    ),
                ],
                user: user("devs", &["ops"]),
                attrs: resource("get", "a", "", "pods"),
                expected: None,
            },
            Case {
                name: "user subject does not match a group of that name",
                objects: alice_role_in_a(get_pods.clone()),
                user: user("dave", &["alice"]),
                attrs: resource("get", "a", "", "pods"),
                expected: None,
            },
            Case {
                name: "second subject of a binding",
                objects: vec![
                    role("a", "r", get_pods.clone()),
                    role_binding(
                        "a",
                        "rb",
                        "Role",
                        "r",
                        json!([{"kind": "User", "name": "bob"}, {"kind": "User", "name": "alice"}]),
                    ),
                ],
                user: alice(),
                attrs: resource("get", "a", "", "pods"),
                expected: Some(ALICE_RB),
            },
            Case {
                name: "service account defaults to the binding's namespace",
                objects: vec![
                    role("a", "r", get_pods.clone()),
                    role_binding(
                        "a",
                        "sa",
                        "Role",
                        "r",
                        json!([{"kind": "ServiceAccount", "name": "robot"}]),
                    ),
                ],
                user: robot(),
                attrs: resource("get", "a", "", "pods"),
                expected: Some(
                    r#"RBAC: allowed by RoleBinding "sa/a" of Role "r" to ServiceAccount "robot/a""#,
                ),
            },
            Case {
                name: "service account of another namespace with the same name",
                objects: vec![
                    role("a", "r", get_pods.clone()),
                    role_binding(
                        "a",
                        "sa",
                        "Role",
                        "r",
                        json!([{"kind": "ServiceAccount", "name": "robot"}]),
                    ),
                ],
                user: user("system:serviceaccount:b:robot", &[]),
                attrs: resource("get", "a", "", "pods"),
                expected: None,
            },
            Case {
                name: "service account from another namespace named in the subject",
                objects: vec![
                    role("a", "r", get_pods.clone()),
                    role_binding(
                        "a",
                        "sa",
                        "Role",
                        "r",
                        json!([{"kind": "ServiceAccount", "name": "robot", "namespace": "b"}]),
                    ),
                ],
                user: user("system:serviceaccount:b:robot", &[]),
                attrs: resource("get", "a", "", "pods"),
                expected: Some(
                    r#"RBAC: allowed by RoleBinding "sa/a" of Role "r" to ServiceAccount "robot/b""#,
                ),
            },
            Case {
                name: "service account name is matched whole",
                objects: vec![
                    role("a", "r", get_pods.clone()),
                    role_binding(
                        "a",
                        "sa",
                        "Role",
                        "r",
                        json!([{"kind": "ServiceAccount", "name": "robot"}]),
                    ),
                ],
                user: user("system:serviceaccount:a:robot2", &[]),
                attrs: resource("get", "a", "", "pods"),
                expected: None,
            },
            Case {
                name: "a plain user named like a service account is that service account",
                objects: vec![
                    role("a", "r", get_pods.clone()),
                    role_binding(
                        "a",
                        "sa",
                        "Role",
                        "r",
                        json!([{"kind": "ServiceAccount", "name": "robot"}]),
                    ),
                ],
                user: user("system:serviceaccount:a:robot", &[]),
                attrs: resource("get", "a", "", "pods"),
                expected: Some(
                    r#"RBAC: allowed by RoleBinding "sa/a" of Role "r" to ServiceAccount "robot/a""#,
                ),
            },
            Case {
                name: "ClusterRoleBinding to a service account grants in every namespace",
                objects: vec![
                    cluster_role("pod-reader", json!({}), get_pods.clone()),
                    cluster_binding(
                        "crb",
                        "ClusterRole",
                        "pod-reader",
                        json!([{"kind": "ServiceAccount", "name": "robot", "namespace": "a"}]),
                    ),
                ],
                user: robot(),
                attrs: resource("get", "z", "", "pods"),
                expected: Some(
                    r#"RBAC: allowed by ClusterRoleBinding "crb" of ClusterRole "pod-reader" to ServiceAccount "robot/a""#,
                ),
            },
            Case {
                name: "ClusterRoleBinding grants at the cluster scope",
                objects: vec![
                    cluster_role("pod-reader", json!({}), get_pods.clone()),
                    cluster_binding("crb", "ClusterRole", "pod-reader", user_subject("alice")),
                ],
                user: alice(),
                attrs: resource("get", "", "", "pods"),
                expected: Some(
                    r#"RBAC: allowed by ClusterRoleBinding "crb" of ClusterRole "pod-reader" to User "alice""#,
                ),
            },
            Case {
                name: "service account without namespace in a ClusterRoleBinding matches nobody",
                objects: vec![
                    cluster_role("pod-reader", json!({}), get_pods.clone()),
                    cluster_binding(
                        "crb",
                        "ClusterRole",
                        "pod-reader",
                        json!([{"kind": "ServiceAccount", "name": "robot"}]),
                    ),
                ],
                user: robot(),
                attrs: resource("get", "a", "", "pods"),
                expected: None,
            },
            Case {
                name: "RoleBinding to a ClusterRole grants in its namespace",
                objects: vec![
                    cluster_role("pod-reader", json!({}), get_pods.clone()),
                    role_binding(
                        "a",
                        "rb",
                        "ClusterRole",
                        "pod-reader",
                        user_subject("alice"),
                    ),
                ],
                user: alice(),
                attrs: resource("get", "a", "", "pods"),
                expected: Some(
                    r#"RBAC: allowed by RoleBinding "rb/a" of ClusterRole "pod-reader" to User "alice""#,
                ),
            },
            Case {
                name: "RoleBinding to a ClusterRole does not grant in another namespace",
                objects: vec![
                    cluster_role("pod-reader", json!({}), get_pods.clone()),
                    role_binding(
                        "a",
                        "rb",
                        "ClusterRole",
                        "pod-reader",
                        user_subject("alice"),
                    ),
                ],
                user: alice(),
                attrs: resource("get", "b", "", "pods"),
                expected: None,
            },
            Case {
                name: "RoleBinding to a ClusterRole does not grant cluster-scoped resources",
                objects: vec![
                    cluster_role(
                        "node-reader",
                        json!({}),
                        json!([{"verbs": ["get"], "apiGroups": [""], "resources": ["nodes"]}]),
                    ),
                    role_binding(
                        "a",
                        "rb",
                        "ClusterRole",
                        "node-reader",
                        user_subject("alice"),
                    ),
                ],
                user: alice(),
                attrs: resource("get", "", "", "nodes"),
                expected: None,
            },
            Case {
                name: "RoleBinding to a Role of another namespace",
                objects: vec![
                    role("b", "r", get_pods.clone()),
                    role_binding("a", "rb", "Role", "r", user_subject("alice")),
                ],
                user: alice(),
                attrs: resource("get", "a", "", "pods"),
                expected: None,
            },
            Case {
                name: "RoleBinding to a missing Role",
                objects: vec![role_binding("a", "rb", "Role", "r", user_subject("alice"))],
                user: alice(),
                attrs: resource("get", "a", "", "pods"),
                expected: None,
            },
            Case {
                name: "ClusterRoleBinding to a Role",
                objects: vec![
                    role("", "r", get_pods.clone()),
                    role("a", "r", get_pods.clone()),
                    cluster_binding("crb", "Role", "r", user_subject("alice")),
                ],
                user: alice(),
                attrs: resource("get", "a", "", "pods"),
                expected: None,
            },
            Case {
                name: "ClusterRoleBindings are visited before RoleBindings",
                objects: vec![
                    role("a", "r", get_pods.clone()),
                    role_binding("a", "rb", "Role", "r", user_subject("alice")),
                    cluster_role("pod-reader", json!({}), get_pods.clone()),
                    cluster_binding("crb", "ClusterRole", "pod-reader", user_subject("alice")),
                ],
                user: alice(),
                attrs: resource("get", "a", "", "pods"),
                expected: Some(
                    r#"RBAC: allowed by ClusterRoleBinding "crb" of ClusterRole "pod-reader" to User "alice""#,
                ),
            },
            Case {
                name: "system:masters is always allowed, without reason",
                objects: vec![],
                user: user("root", &["system:masters", "system:authenticated"]),
                attrs: resource("delete", "", "", "nodes"),
                expected: Some(""),
            },
            Case {
                name: "system:masters is allowed non-resource URLs",
                objects: vec![],
                user: user("root", &["system:masters"]),
                attrs: path("post", "/anything"),
                expected: Some(""),
            },
        ]);
    }

    #[test]
    fn non_resource_urls() {
        let with_urls = |urls: Value| {
            vec![
                cluster_role(
                    "urls",
                    json!({}),
                    json!([{"verbs": ["get"], "nonResourceURLs": urls}]),
                ),
                cluster_binding("crb", "ClusterRole", "urls", user_subject("alice")),
            ]
        };
        const REASON: &str =
            r#"RBAC: allowed by ClusterRoleBinding "crb" of ClusterRole "urls" to User "alice""#;
        let cases: Vec<(Value, Attributes<'static>, bool)> = vec![
            (json!(["/healthz"]), path("get", "/healthz"), true),
            (json!(["/healthz"]), path("post", "/healthz"), false),
            (json!(["/healthz"]), path("get", "/healthz/etcd"), false),
            (json!(["/healthz"]), path("get", "/health"), false),
            (json!(["/apis/*"]), path("get", "/apis/apps/v1"), true),
            (json!(["/apis/*"]), path("get", "/apis/"), true),
            (json!(["/apis/*"]), path("get", "/apis"), false),
            (json!(["/apis*"]), path("get", "/apis"), true),
            (json!(["/api", "/version"]), path("get", "/version"), true),
            (json!(["*"]), path("get", "/anything/at/all"), true),
            // Non-resource rules never match resource requests, whatever their paths.
            (json!(["*"]), resource("get", "", "", "pods"), false),
        ];
        for (urls, attrs, allowed) in cases {
            let got = index(&with_urls(urls.clone())).authorize(&alice(), &attrs);
            let want = if allowed {
                Decision::Allow(REASON.to_string())
            } else {
                Decision::Deny
            };
            assert_eq!(got, want, "{urls} for {attrs:?}");
        }

        // Resource rules never match non-resource requests.
        let everything = vec![
            cluster_role(
                "all",
                json!({}),
                json!([{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}]),
            ),
            cluster_binding("crb", "ClusterRole", "all", user_subject("alice")),
        ];
        assert_eq!(
            index(&everything).authorize(&alice(), &path("get", "/healthz")),
            Decision::Deny
        );

        // Non-resource requests have no namespace, so RoleBindings never grant them.
        let via_role_binding = vec![
            cluster_role(
                "urls",
                json!({}),
                json!([{"verbs": ["get"], "nonResourceURLs": ["*"]}]),
            ),
            role_binding("a", "rb", "ClusterRole", "urls", user_subject("alice")),
        ];
        assert_eq!(
            index(&via_role_binding).authorize(&alice(), &path("get", "/healthz")),
            Decision::Deny
        );
    }

    #[test]
    fn cluster_role_aggregation() {
        let labelled = |name: &str, verb: &str| {
            cluster_role(
                name,
                json!({"agg": "true"}),
                json!([{"verbs": [verb], "apiGroups": [""], "resources": ["pods"]}]),
            )
        };
        let objects = vec![
            aggregated(
                "combined",
                json!({}),
                json!([{"matchLabels": {"agg": "true"}}]),
                // Ignored: the aggregation controller replaces the rules of an aggregated role.
                json!([{"verbs": ["watch"], "apiGroups": [""], "resources": ["pods"]}]),
            ),
            labelled("getter", "get"),
            labelled("lister", "list"),
            cluster_role(
                "deleter",
                json!({"agg": "false"}),
                json!([{"verbs": ["delete"], "apiGroups": [""], "resources": ["pods"]}]),
            ),
            cluster_binding("crb", "ClusterRole", "combined", user_subject("alice")),
        ];
        let reason = r#"RBAC: allowed by ClusterRoleBinding "crb" of ClusterRole "combined" to User "alice""#;
        let mut idx = index(&objects);
        for (verb, allowed) in [
            ("get", true),
            ("list", true),
            ("delete", false),
            ("watch", false),
        ] {
            let want = if allowed {
                Decision::Allow(reason.to_string())
            } else {
                Decision::Deny
            };
            assert_eq!(
                idx.authorize(&alice(), &resource(verb, "a", "", "pods")),
                want,
                "{verb}"
            );
        }

        // Labelling a role later aggregates it without touching the aggregated role.
        idx.apply(
            "ClusterRole",
            &json!({"metadata": {"name": "deleter", "labels": {"agg": "true"}}, "rules": [
                {"verbs": ["delete"], "apiGroups": [""], "resources": ["pods"]}
            ]}),
        );
        assert!(
            idx.authorize(&alice(), &resource("delete", "a", "", "pods"))
                .is_allowed()
        );
        // Deleting an aggregated-from role removes its rules.
        idx.delete("ClusterRole", "", "getter");
        assert_eq!(
            idx.authorize(&alice(), &resource("get", "a", "", "pods")),
            Decision::Deny
        );
        // rules_for shows the aggregated rules, deduplicated, not the role's own.
        let mut same_rule_twice = idx;
        same_rule_twice.apply("ClusterRole", &labelled("lister-too", "list").1);
        assert_eq!(
            same_rule_twice.rules_for(&alice(), "a"),
            vec![
                json!({"verbs": ["delete"], "apiGroups": [""], "resources": ["pods"]}),
                json!({"verbs": ["list"], "apiGroups": [""], "resources": ["pods"]}),
            ]
        );
    }

    #[test]
    fn aggregation_is_transitive_and_survives_cycles() {
        let objects = vec![
            aggregated(
                "outer",
                json!({"ring": "b"}),
                json!([{"matchLabels": {"ring": "a"}}]),
                json!([]),
            ),
            aggregated(
                "inner",
                json!({"ring": "a"}),
                json!([{"matchLabels": {"ring": "b"}}]),
                json!([]),
            ),
            cluster_role(
                "leaf",
                json!({"ring": "b"}),
                json!([{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}]),
            ),
            cluster_binding("to-outer", "ClusterRole", "outer", user_subject("alice")),
            cluster_binding("to-inner", "ClusterRole", "inner", user_subject("bob")),
        ];
        let idx = index(&objects);
        // outer <- inner <- {outer (cycle), leaf}
        assert!(
            idx.authorize(&alice(), &resource("get", "a", "", "pods"))
                .is_allowed()
        );
        assert!(
            idx.authorize(&user("bob", &[]), &resource("get", "a", "", "pods"))
                .is_allowed()
        );
        assert!(
            !idx.authorize(&alice(), &resource("list", "a", "", "pods"))
                .is_allowed()
        );
    }

    #[test]
    fn bootstrap_policy_grants_like_kube() {
        let mut idx = RbacIndex::default();
        for obj in bootstrap_policy() {
            let kind = obj["kind"].as_str().unwrap().to_string();
            idx.apply(&kind, &obj);
        }
        idx.apply(
            "RoleBinding",
            &role_binding(
                "team",
                "admins",
                "ClusterRole",
                "admin",
                user_subject("alice"),
            )
            .1,
        );
        idx.apply(
            "RoleBinding",
            &role_binding(
                "team",
                "viewers",
                "ClusterRole",
                "view",
                user_subject("bob"),
            )
            .1,
        );
        idx.apply(
            "RoleBinding",
            &role_binding(
                "team",
                "editors",
                "ClusterRole",
                "edit",
                user_subject("erin"),
            )
            .1,
        );
        let bob = user("bob", &["system:authenticated"]);
        let erin = user("erin", &["system:authenticated"]);
        let anonymous = user("system:anonymous", &["system:unauthenticated"]);
        let alice = alice();
        let cases: Vec<(&str, &UserInfo, Attributes<'static>, bool)> = vec![
            (
                "admin manages roles",
                &alice,
                resource("create", "team", "rbac.authorization.k8s.io", "roles"),
                true,
            ),
            (
                "admin edits (admin <- edit)",
                &alice,
                resource("delete", "team", "apps", "deployments"),
                true,
            ),
            (
                "admin views (admin <- edit <- view)",
                &alice,
                sub(resource("get", "team", "", "pods"), "log"),
                true,
            ),
            (
                "admin only in its namespace",
                &alice,
                resource("get", "other", "", "pods"),
                false,
            ),
            (
                "admin cannot touch nodes",
                &alice,
                resource("get", "", "", "nodes"),
                false,
            ),
            (
                "edit cannot manage roles",
                &erin,
                resource("create", "team", "rbac.authorization.k8s.io", "roles"),
                false,
            ),
            (
                "edit reads secrets",
                &erin,
                resource("get", "team", "", "secrets"),
                true,
            ),
            (
                "edit execs into pods",
                &erin,
                sub(resource("create", "team", "", "pods"), "exec"),
                true,
            ),
            (
                "view lists deployments",
                &bob,
                resource("list", "team", "apps", "deployments"),
                true,
            ),
            (
                "view cannot read secrets",
                &bob,
                resource("get", "team", "", "secrets"),
                false,
            ),
            (
                "view cannot write",
                &bob,
                resource("update", "team", "", "configmaps"),
                false,
            ),
            (
                "authenticated discovery",
                &bob,
                path("get", "/apis/apps/v1"),
                true,
            ),
            ("authenticated version", &bob, path("get", "/version"), true),
            (
                "authenticated can-i",
                &bob,
                resource(
                    "create",
                    "",
                    "authorization.k8s.io",
                    "selfsubjectaccessreviews",
                ),
                true,
            ),
            (
                "authenticated cannot list pods",
                &bob,
                resource("list", "", "", "pods"),
                false,
            ),
            (
                "anonymous health",
                &anonymous,
                path("get", "/healthz"),
                true,
            ),
            (
                "anonymous no discovery",
                &anonymous,
                path("get", "/api"),
                false,
            ),
            (
                "anonymous no can-i",
                &anonymous,
                resource(
                    "create",
                    "",
                    "authorization.k8s.io",
                    "selfsubjectrulesreviews",
                ),
                false,
            ),
        ];
        for (name, who, attrs, allowed) in cases {
            assert_eq!(idx.authorize(who, &attrs).is_allowed(), allowed, "{name}");
        }
        // cluster-admin is bound to system:masters through a real binding too.
        let reason = |who: &UserInfo, attrs: &Attributes| {
            let mut found = None;
            idx.visit_rules_for(who, attrs.namespace, |source, rule| {
                if rule.allows(attrs) {
                    found = Some(source.to_string());
                    return false;
                }
                true
            });
            found
        };
        assert_eq!(
            reason(
                &user("root", &["system:masters"]),
                &resource("delete", "", "", "nodes")
            )
            .as_deref(),
            Some(
                r#"ClusterRoleBinding "cluster-admin" of ClusterRole "cluster-admin" to Group "system:masters""#
            )
        );
    }

    #[test]
    fn apply_delete_reset_keep_the_index_current() {
        let get_pods = json!([{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}]);
        let attrs = resource("get", "a", "", "pods");
        let mut idx = index(&alice_role_in_a(get_pods));
        assert!(idx.authorize(&alice(), &attrs).is_allowed());

        // Replacing the role with other rules takes effect.
        idx.apply(
            "Role",
            &role(
                "a",
                "r",
                json!([{"verbs": ["list"], "apiGroups": [""], "resources": ["pods"]}]),
            )
            .1,
        );
        assert!(!idx.authorize(&alice(), &attrs).is_allowed());
        assert!(
            idx.authorize(&alice(), &resource("list", "a", "", "pods"))
                .is_allowed()
        );

        // Deleting the binding, or deleting in the wrong namespace.
        idx.delete("RoleBinding", "b", "rb");
        assert!(
            idx.authorize(&alice(), &resource("list", "a", "", "pods"))
                .is_allowed()
        );
        idx.delete("RoleBinding", "a", "rb");
        assert!(
            !idx.authorize(&alice(), &resource("list", "a", "", "pods"))
                .is_allowed()
        );

        // Re-binding, then deleting the role.
        idx.apply(
            "RoleBinding",
            &role_binding("a", "rb", "Role", "r", user_subject("alice")).1,
        );
        assert!(
            idx.authorize(&alice(), &resource("list", "a", "", "pods"))
                .is_allowed()
        );
        idx.delete("Role", "a", "r");
        assert!(
            !idx.authorize(&alice(), &resource("list", "a", "", "pods"))
                .is_allowed()
        );

        // Cluster-wide objects, then reset.
        idx.apply(
            "ClusterRole",
            &cluster_role(
                "all",
                json!({}),
                json!([{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}]),
            )
            .1,
        );
        idx.apply(
            "ClusterRoleBinding",
            &cluster_binding("crb", "ClusterRole", "all", user_subject("alice")).1,
        );
        assert!(idx.authorize(&alice(), &attrs).is_allowed());
        idx.delete("ClusterRoleBinding", "", "crb");
        assert!(!idx.authorize(&alice(), &attrs).is_allowed());
        idx.apply(
            "ClusterRoleBinding",
            &cluster_binding("crb", "ClusterRole", "all", user_subject("alice")).1,
        );
        idx.reset();
        assert!(!idx.authorize(&alice(), &attrs).is_allowed());

        // Unknown kinds are ignored.
        idx.apply("ConfigMap", &json!({"metadata": {"name": "x"}}));
        assert!(idx.rules_for(&alice(), "a").is_empty());
    }

    #[test]
    fn rules_for_lists_cluster_then_namespace_rules() {
        let objects = vec![
            cluster_role(
                "urls",
                json!({}),
                json!([{"verbs": ["get"], "nonResourceURLs": ["/healthz"]}]),
            ),
            cluster_binding(
                "crb",
                "ClusterRole",
                "urls",
                json!([{"kind": "Group", "name": "system:authenticated"}]),
            ),
            role(
                "a",
                "r",
                json!([{"verbs": ["get"], "apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["web"]}]),
            ),
            role_binding("a", "rb", "Role", "r", user_subject("alice")),
        ];
        let idx = index(&objects);
        assert_eq!(
            idx.rules_for(&alice(), "a"),
            vec![
                json!({"verbs": ["get"], "nonResourceURLs": ["/healthz"]}),
                json!({"verbs": ["get"], "apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["web"]}),
            ]
        );
        assert_eq!(
            idx.rules_for(&alice(), "b"),
            vec![json!({"verbs": ["get"], "nonResourceURLs": ["/healthz"]})]
        );
        assert!(idx.rules_for(&user("anon", &[]), "a").is_empty());
    }

    #[test]
    fn missing_rules_reports_escalation() {
        let objects = vec![
            role(
                "a",
                "r",
                json!([
                    {"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods", "*/status"]},
                    {"verbs": ["*"], "apiGroups": ["apps"], "resources": ["deployments"]},
                    {"verbs": ["get"], "apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["web"]},
                ]),
            ),
            role_binding("a", "rb", "Role", "r", user_subject("alice")),
            cluster_role(
                "urls",
                json!({}),
                json!([{"verbs": ["get"], "nonResourceURLs": ["/apis/*"]}]),
            ),
            cluster_binding("crb", "ClusterRole", "urls", user_subject("alice")),
        ];
        let idx = index(&objects);
        let cases: Vec<(&str, &str, Value, Vec<Value>)> = vec![
            (
                "held exactly",
                "a",
                json!([{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}]),
                vec![],
            ),
            (
                "held through */status and verb *",
                "a",
                json!([
                    {"verbs": ["list"], "apiGroups": [""], "resources": ["pods/status"]},
                    {"verbs": ["delete", "patch"], "apiGroups": ["apps"], "resources": ["deployments"]},
                ]),
                vec![],
            ),
            (
                "one verb too many",
                "a",
                json!([{"verbs": ["get", "delete"], "apiGroups": [""], "resources": ["pods"]}]),
                vec![json!({"verbs": ["delete"], "apiGroups": [""], "resources": ["pods"]})],
            ),
            (
                "a subresource not held",
                "a",
                json!([{"verbs": ["get"], "apiGroups": [""], "resources": ["pods/log"]}]),
                vec![json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods/log"]})],
            ),
            (
                "named objects held, any object not",
                "a",
                json!([
                    {"verbs": ["get"], "apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["web"]},
                    {"verbs": ["get"], "apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["web", "db"]},
                    {"verbs": ["get"], "apiGroups": [""], "resources": ["configmaps"]},
                ]),
                vec![
                    json!({"verbs": ["get"], "apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["db"]}),
                    json!({"verbs": ["get"], "apiGroups": [""], "resources": ["configmaps"]}),
                ],
            ),
            (
                "wildcards are not held by specific grants",
                "a",
                json!([{"verbs": ["get"], "apiGroups": ["*"], "resources": ["pods"]}]),
                vec![json!({"verbs": ["get"], "apiGroups": ["*"], "resources": ["pods"]})],
            ),
            (
                "the namespace grant is not held elsewhere",
                "b",
                json!([{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}]),
                vec![json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]})],
            ),
            (
                "URL under a held prefix",
                "",
                json!([{"verbs": ["get"], "nonResourceURLs": ["/apis/apps", "/apis/*"]}]),
                vec![],
            ),
            (
                "URL outside held prefixes",
                "",
                json!([{"verbs": ["get"], "nonResourceURLs": ["/api", "/apis"]}]),
                vec![
                    json!({"verbs": ["get"], "nonResourceURLs": ["/api"]}),
                    json!({"verbs": ["get"], "nonResourceURLs": ["/apis"]}),
                ],
            ),
        ];
        for (name, namespace, rules, missing) in cases {
            let rules = rules.as_array().unwrap().clone();
            assert_eq!(
                idx.missing_rules(&alice(), namespace, &rules),
                missing,
                "{name}"
            );
        }
        let everything = [json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]})];
        assert!(
            idx.missing_rules(&user("root", &["system:masters"]), "a", &everything)
                .is_empty()
        );
        assert_eq!(
            idx.missing_rules(&alice(), "a", &everything),
            everything.to_vec()
        );
    }

    #[test]
    fn forbidden_messages_match_kube() {
        let cases: Vec<(UserInfo, Attributes<'static>, &str)> = vec![
            (
                alice(),
                resource("list", "default", "", "pods"),
                r#"User "alice" cannot list resource "pods" in API group "" in the namespace "default""#,
            ),
            (
                alice(),
                named(sub(resource("get", "default", "", "pods"), "log"), "web"),
                r#"User "alice" cannot get resource "pods/log" in API group "" in the namespace "default""#,
            ),
            (
                alice(),
                resource("list", "", "", "nodes"),
                r#"User "alice" cannot list resource "nodes" in API group "" at the cluster scope"#,
            ),
            (
                alice(),
                resource("create", "prod", "apps", "deployments"),
                r#"User "alice" cannot create resource "deployments" in API group "apps" in the namespace "prod""#,
            ),
            (
                user("system:serviceaccount:a:robot", &[]),
                sub(resource("patch", "", "", "nodes"), "status"),
                r#"User "system:serviceaccount:a:robot" cannot patch resource "nodes/status" in API group "" at the cluster scope"#,
            ),
            (
                alice(),
                path("get", "/foo"),
                r#"User "alice" cannot get path "/foo""#,
            ),
            (
                user("say \"hi\"", &[]),
                path("post", "/"),
                r#"User "say \"hi\"" cannot post path "/""#,
            ),
        ];
        for (who, attrs, message) in cases {
            assert_eq!(forbidden_message(&who, &attrs), message);
        }
    }
}
