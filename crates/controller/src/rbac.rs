//! The RBAC Tandem installs: the controller's own ClusterRole, and the ClusterRoles a peer
//! identity is bound to — in its tenant namespace and in its twin namespaces only. Nothing
//! cluster-scoped is ever granted to a peer.

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use kube::api::ObjectMeta;
use tandem_api::{PodAccess, names};

/// ClusterRole bound (by RoleBinding) in a consumer's tenant namespace on the provider.
pub const PEER_TENANT_ROLE: &str = "tandem:peer-tenant";
/// ClusterRole to file the CSR renewing its own certificate, bound to each consumer's peer
/// user by its own ClusterRoleBinding ([`peer_renewal_binding`]) for as long as its Tenant
/// lives: a certificate outlives its peering, its right to renew must not.
pub const PEER_RENEWAL_ROLE: &str = "tandem:peer-renewal";
/// The ClusterRoleBinding of [`PEER_RENEWAL_ROLE`] to `consumer`'s peer user.
pub fn peer_renewal_binding(consumer: &str) -> String {
    format!("{PEER_RENEWAL_ROLE}:{consumer}")
}
/// The name prefix of a renewal CSR (`<prefix><consumer>-<unix seconds>`).
pub const RENEWAL_CSR_PREFIX: &str = "tandem-peer-renewal-";
/// ClusterRole bound (by RoleBinding) in each twin namespace on the provider.
pub const PEER_TWIN_ROLE: &str = "tandem:peer-twin";
/// ClusterRole bound in a twin namespace when the Tenant allows `kubectl exec` (pods/exec).
pub const PEER_EXEC_ROLE: &str = "tandem:peer-exec";
/// ClusterRole bound in a twin namespace when the Tenant allows `kubectl attach` (pods/attach).
pub const PEER_ATTACH_ROLE: &str = "tandem:peer-attach";
/// ClusterRole bound in a twin namespace when the Tenant allows `kubectl port-forward`
/// (pods/portforward).
pub const PEER_PORTFORWARD_ROLE: &str = "tandem:peer-portforward";

/// The RBAC subjects a consumer's peer roles are bound to, from its Tenant: the group of the
/// key the Tenant records ([`names::peer_key_group`]), so that a certificate for another key
/// (an earlier peering under the same self-asserted cluster ID) reaches nothing. Its user name
/// instead when no key is recorded (a Tenant made before keys were, until the provider's admin
/// records one), and as well while [`names::USER_BOUND_UNTIL_ANNOTATION`] lasts.
pub fn peer_subjects(tenant: &tandem_api::Tenant) -> serde_json::Value {
    use kube::ResourceExt;
    let user = serde_json::json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                  "name": names::peer_user(&tenant.spec.cluster_id)});
    let annotations = tenant.annotations();
    let Some(key) = annotations.get(names::KEY_FINGERPRINT_ANNOTATION) else {
        return serde_json::json!([user]);
    };
    let group = serde_json::json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                                   "name": names::peer_key_group(key)});
    let user_bound = annotations
        .get(names::USER_BOUND_UNTIL_ANNOTATION)
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .is_some_and(|until| until > k8s_openapi::jiff::Timestamp::now());
    if user_bound {
        serde_json::json!([group, user])
    } else {
        serde_json::json!([group])
    }
}

const READ: &[&str] = &["get", "list", "watch"];
/// What reflection does to the objects it owns in a twin namespace: one at a time, never
/// `deletecollection` (which would also reach objects of the twin it did not make).
const REFLECT: &[&str] = &[
    "get", "list", "watch", "create", "update", "patch", "delete",
];

fn rule(group: &str, resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.to_string()]),
        resources: Some(resources.iter().map(|s| s.to_string()).collect()),
        verbs: verbs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn cluster_role(name: &str, rules: Vec<PolicyRule>) -> ClusterRole {
    ClusterRole {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(
                [(
                    names::MANAGED_BY_LABEL.to_string(),
                    names::MANAGED_BY.to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        rules: Some(rules),
        ..Default::default()
    }
}

/// What a consumer may do in its tenant namespace: read its grant (and delete its own Tenant to
/// unpeer), publish its network parameters and read the provider's (writing only how it remaps
/// them, in their status), and ask for twin namespaces.
pub fn peer_tenant_role() -> ClusterRole {
    cluster_role(
        PEER_TENANT_ROLE,
        vec![
            rule(
                tandem_api::GROUP,
                &["tenants"],
                &["get", "list", "watch", "delete"],
            ),
            rule(
                tandem_api::GROUP,
                &["networkparameters"],
                &["get", "list", "watch", "create"],
            ),
            named(
                rule(
                    tandem_api::GROUP,
                    &["networkparameters"],
                    &["update", "patch", "delete"],
                ),
                CONSUMER_NETWORK_PARAMETERS,
            ),
            named(
                rule(
                    tandem_api::GROUP,
                    &["networkparameters/status"],
                    &["get", "update", "patch"],
                ),
                PROVIDER_NETWORK_PARAMETERS,
            ),
            rule(
                tandem_api::GROUP,
                &["remotenamespaces"],
                &[
                    "get", "list", "watch", "create", "update", "patch", "delete",
                ],
            ),
            // Fencing: it reads the provider's nonce Lease and hands the nonce back in its
            // own. RBAC cannot bind `create` to a name; every other verb is bound to one Lease.
            rule("coordination.k8s.io", &["leases"], &["create"]),
            named(
                rule(
                    "coordination.k8s.io",
                    &["leases"],
                    &["get", "update", "patch"],
                ),
                names::FENCE_LEASE,
            ),
            named(
                rule("coordination.k8s.io", &["leases"], &["get"]),
                names::FENCE_NONCE_LEASE,
            ),
            // Multi-cluster services: its records of its exports, and reading ours.
            rule(
                tandem_api::GROUP,
                &["exportedservices"],
                &[
                    "get", "list", "watch", "create", "update", "patch", "delete",
                ],
            ),
        ],
    )
}

/// The `NetworkParameters` (in a provider's tenant namespace) the consumer writes.
pub const CONSUMER_NETWORK_PARAMETERS: &str = "consumer";
/// The `NetworkParameters` (in a provider's tenant namespace) the provider writes.
pub const PROVIDER_NETWORK_PARAMETERS: &str = "provider";

fn named(mut rule: PolicyRule, name: &str) -> PolicyRule {
    rule.resource_names = Some(vec![name.to_string()]);
    rule
}

/// What a consumer may do in one of its twin namespaces: run shadow pods and reflect what they
/// need; read (never write) the real pods and their events.
pub fn peer_twin_role() -> ClusterRole {
    cluster_role(
        PEER_TWIN_ROLE,
        vec![
            rule(tandem_api::GROUP, &["shadowpods"], REFLECT),
            rule(tandem_api::GROUP, &["shadowpods/status"], READ),
            // What it writes here beyond RBAC's reach (Service types, slice addresses, claims)
            // is checked by `provider::peer_writes`.
            rule("", &["configmaps", "secrets", "services"], REFLECT),
            rule("discovery.k8s.io", &["endpointslices"], REFLECT),
            rule("", &["pods", "events"], READ),
            // `kubectl logs` on the consumer, carried here by its virtual kubelet.
            rule("", &["pods/log"], &["get"]),
            // `kubectl top` on the consumer: its virtual kubelet's /metrics/resource.
            rule("metrics.k8s.io", &["pods"], &["get", "list"]),
            rule("events.k8s.io", &["events"], READ),
            // Remote volumes: the provider's copies of the consumer's claims of the `tandem`
            // StorageClass (the provider's quota, from the grant, bounds them).
            rule(
                "",
                &["persistentvolumeclaims"],
                &["get", "list", "watch", "create", "patch", "delete"],
            ),
            rule("", &["resourcequotas"], READ),
        ],
    )
}

/// An interactive capability on the real pods of a consumer's twin namespaces. Each is a
/// ClusterRole of its own, bound in a twin namespace only while the consumer's Tenant allows it
/// (`spec.podAccess`), so that a provider can refuse one without touching the others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodCapability {
    Exec,
    Attach,
    PortForward,
}

impl PodCapability {
    /// Every capability, in a stable order.
    pub const ALL: [PodCapability; 3] = [
        PodCapability::Exec,
        PodCapability::Attach,
        PodCapability::PortForward,
    ];

    /// The ClusterRole granting it.
    pub fn role_name(self) -> &'static str {
        match self {
            PodCapability::Exec => PEER_EXEC_ROLE,
            PodCapability::Attach => PEER_ATTACH_ROLE,
            PodCapability::PortForward => PEER_PORTFORWARD_ROLE,
        }
    }

    /// The pods subresource it opens.
    pub fn subresource(self) -> &'static str {
        match self {
            PodCapability::Exec => "pods/exec",
            PodCapability::Attach => "pods/attach",
            PodCapability::PortForward => "pods/portforward",
        }
    }

    /// Whether `access` (a Tenant's `spec.podAccess` in force) allows it.
    pub fn allowed_by(self, access: &PodAccess) -> bool {
        match self {
            PodCapability::Exec => access.exec,
            PodCapability::Attach => access.attach,
            PodCapability::PortForward => access.port_forward,
        }
    }

    /// Its ClusterRole. The stream is opened by a WebSocket upgrade, which kube authorises as
    /// `create` (older clients and kube-apiservers: `get`), so both verbs are granted.
    pub fn role(self) -> ClusterRole {
        cluster_role(
            self.role_name(),
            vec![rule("", &[self.subresource()], &["create", "get"])],
        )
    }
}

/// What the controller does in a tenant namespace besides what its ClusterRole allows
/// everywhere: write its fence nonce Lease (and remove both fence Leases when the peer's
/// tenancy ends). Bound there, to its ServiceAccount, when the namespace is made: Leases
/// elsewhere stay out of its reach (kube-node-lease aside, for virtual nodes).
pub fn controller_tenant_role() -> ClusterRole {
    cluster_role(
        CONTROLLER_TENANT_ROLE,
        vec![rule(
            "coordination.k8s.io",
            &["leases"],
            &["create", "patch", "delete"],
        )],
    )
}

/// The ClusterRole of [`controller_tenant_role`], and its RoleBinding's name.
pub const CONTROLLER_TENANT_ROLE: &str = "tandem:controller-tenant";

/// Every ClusterRole a peer identity may be bound to (installed by `tandem install`).
/// What a peer needs to renew its identity: `create` on CertificateSigningRequests — nothing
/// to read, approve or delete them. The provider's controller approves only a request that
/// names the requester's own identity (see `provider::renewal`), and hands the certificate
/// back in the consumer's Tenant status, which the peer reads already.
pub fn peer_renewal_role() -> ClusterRole {
    cluster_role(
        PEER_RENEWAL_ROLE,
        vec![rule(
            "certificates.k8s.io",
            &["certificatesigningrequests"],
            &["create"],
        )],
    )
}

pub fn peer_roles() -> Vec<ClusterRole> {
    let mut roles = vec![peer_tenant_role(), peer_twin_role()];
    roles.extend(PodCapability::ALL.map(PodCapability::role));
    roles
}

/// What the controller itself needs in its own cluster, as provider and as consumer — and
/// nothing else: it never touches CRDs, ClusterRoles, ClusterRoleBindings, workloads or
/// webhooks other than its own. The rules here are cluster-wide because the namespaces they act
/// in (tenant, twin and offloaded namespaces) are only known at run time; what it does in fixed
/// namespaces is in [`controller_namespaced_roles`]. `tandem install`, which runs as the
/// administrator, creates what the controller cannot (CRDs, these roles, its Deployment).
/// `tandem-viewer`: what `tandem status` reads, for a user who should see the peerings and
/// nothing more. Bind it with a ClusterRoleBinding (`kubectl create clusterrolebinding
/// alice-tandem --clusterrole tandem-viewer --user alice`). No Secrets (not the cluster's
/// identity, not the enrollment credential) and no listing of Pods: status shows the cluster
/// ID from its ClusterProperty, and pod counts only where the user may list pods anyway.
pub fn viewer_role() -> ClusterRole {
    const READ: &[&str] = &["get", "list", "watch"];
    let mut settings = rule("", &["configmaps"], &["get"]);
    settings.resource_names = Some(vec![names::CONFIG_MAP.to_string()]);
    let mut kube_system = rule("", &["namespaces"], &["get"]);
    kube_system.resource_names = Some(vec!["kube-system".to_string()]);
    cluster_role(
        names::VIEWER_ROLE,
        vec![
            rule(
                tandem_api::GROUP,
                &["peerings", "tenants", "namespaceoffloadings"],
                READ,
            ),
            rule(
                tandem_api::mcs::MCS_GROUP,
                &["serviceexports", "serviceimports"],
                READ,
            ),
            rule(tandem_api::mcs::ABOUT_GROUP, &["clusterproperties"], READ),
            // Virtual nodes: readiness, cordoning, the tunnel's report.
            rule("", &["nodes"], READ),
            // Whether the network fabric runs: the settings, and a hollow lab's mark.
            settings,
            kube_system,
        ],
    )
}

pub fn controller_role() -> ClusterRole {
    const WATCH: &[&str] = &["get", "list", "watch"];
    cluster_role(
        names::CONTROLLER_NAME,
        vec![
            // Its identity, invite tokens (kube-system), peer identities (tenant namespaces);
            // reflection reads the offloaded namespaces' Secrets and ConfigMaps.
            rule(
                "",
                &["secrets"],
                &["get", "list", "watch", "create", "patch", "delete"],
            ),
            // Reflection reads the offloaded namespaces' ConfigMaps and Services.
            rule("", &["configmaps"], &["list", "watch"]),
            // ... and multi-cluster services write the Services and EndpointSlices backing
            // ServiceImports (only those labelled as Tandem's are ever changed).
            rule(
                "",
                &["services"],
                &[
                    "get", "list", "watch", "create", "update", "patch", "delete",
                ],
            ),
            rule(
                "discovery.k8s.io",
                &["endpointslices"],
                &[
                    "get",
                    "list",
                    "watch",
                    "create",
                    "update",
                    "patch",
                    "delete",
                    "deletecollection",
                ],
            ),
            // Multi-cluster services: exports read (their status written), imports owned,
            // the cluster's ID published.
            rule(
                tandem_api::mcs::MCS_GROUP,
                &["serviceexports"],
                &["get", "list", "watch"],
            ),
            rule(
                tandem_api::mcs::MCS_GROUP,
                &["serviceexports/status"],
                &["update", "patch"],
            ),
            rule(
                tandem_api::mcs::MCS_GROUP,
                &["serviceimports", "serviceimports/status"],
                &[
                    "get", "list", "watch", "create", "update", "patch", "delete",
                ],
            ),
            rule(
                tandem_api::mcs::ABOUT_GROUP,
                &["clusterproperties"],
                &["get", "list", "watch", "create"],
            ),
            rule(
                tandem_api::GROUP,
                &["exportedservices"],
                &[
                    "get", "list", "watch", "create", "update", "patch", "delete",
                ],
            ),
            // Provider events reflected onto the consumer's pods.
            rule("", &["events"], &["create", "patch"]),
            // The fence Leases in tenant namespaces (provider), read; it writes its own (the
            // nonces) through [`controller_tenant_role`], bound in each tenant namespace.
            rule("coordination.k8s.io", &["leases"], WATCH),
            // Tenant and twin namespaces; the offloading label on offloaded ones.
            rule(
                "",
                &["namespaces"],
                &["get", "list", "watch", "create", "patch", "delete"],
            ),
            // Virtual nodes and their heartbeats.
            rule(
                "",
                &["nodes"],
                &["get", "list", "watch", "create", "patch", "delete"],
            ),
            rule("", &["nodes/status"], &["patch"]),
            // Real pods of shadow pods (provider); offloaded pods (consumer).
            rule("", &["pods"], &["get", "list", "watch", "create", "delete"]),
            rule("", &["pods/status"], &["patch"]),
            // Storage offloading (consumer): claims of the `tandem` class get a finalizer and
            // a PV pinned to their virtual node; the class names the provider's class.
            rule(
                "",
                &["persistentvolumeclaims"],
                &["get", "list", "watch", "patch"],
            ),
            rule(
                "",
                &["persistentvolumes"],
                &["get", "list", "watch", "create", "delete"],
            ),
            rule(
                "storage.k8s.io",
                &["storageclasses"],
                &["get", "list", "watch"],
            ),
            // Provider: the storage part of a consumer's grant, as a quota in each twin
            // namespace; and the shadow pods of a twin kept for its data.
            rule(
                "",
                &["resourcequotas"],
                &["get", "list", "watch", "create", "patch"],
            ),
            // RoleBindings of peer identities to the peer roles (and nothing else: `bind` is
            // limited to them), in tenant and twin namespaces; the pod-access ones removed when
            // the Tenant refuses them, all removed from a twin namespace retained for its data
            // when its consumer unpeers. `bind` is what lets it grant exec and the like without
            // holding them itself (kube's escalation check).
            rule(
                "rbac.authorization.k8s.io",
                &["rolebindings"],
                &["create", "patch", "delete"],
            ),
            // Each peer's right to renew its certificate, bound with its Tenant and removed
            // at unpeering (`bind` limited to the peer roles, below).
            rule(
                "rbac.authorization.k8s.io",
                &["clusterrolebindings"],
                &["create", "patch", "delete"],
            ),
            // Every binding read, never written, while the enrollment credential is advertised:
            // whatever binds a group every bootstrap token is in reaches the public credential
            // (see `provider::enrollment_guard`).
            rule(
                "rbac.authorization.k8s.io",
                &["rolebindings", "clusterrolebindings"],
                &["list"],
            ),
            PolicyRule {
                resource_names: Some(
                    peer_roles()
                        .into_iter()
                        .chain([controller_tenant_role(), peer_renewal_role()])
                        .filter_map(|r| r.metadata.name)
                        .collect(),
                ),
                ..rule("rbac.authorization.k8s.io", &["clusterroles"], &["bind"])
            },
            // Its own ClusterRole, read for its UID: the owner of its webhook configurations.
            named(
                rule("rbac.authorization.k8s.io", &["clusterroles"], &["get"]),
                names::CONTROLLER_NAME,
            ),
            // A peer's client certificate: filed, approved, then removed; and the requests
            // renewing one (listed to find them).
            rule(
                "certificates.k8s.io",
                &["certificatesigningrequests"],
                &[
                    "get",
                    "list",
                    "watch",
                    "create",
                    "delete",
                    "deletecollection",
                ],
            ),
            rule(
                "certificates.k8s.io",
                &["certificatesigningrequests/approval"],
                &["update", "patch"],
            ),
            // ... and its virtual kubelets' serving certificates, approved as an approver
            // would approve a kubelet's.
            PolicyRule {
                resource_names: Some(vec![
                    PEER_CSR_SIGNER.into(),
                    names::KUBELET_SERVING_SIGNER.into(),
                ]),
                ..rule("certificates.k8s.io", &["signers"], &["approve"])
            },
            // Virtual kubelets authorise their callers as a kubelet does (`nodes/proxy`).
            rule(
                "authorization.k8s.io",
                &["subjectaccessreviews"],
                &["create"],
            ),
            // Its own placement webhook, by name.
            PolicyRule {
                resource_names: Some(vec![names::PLACEMENT_WEBHOOK.into()]),
                ..rule(
                    "admissionregistration.k8s.io",
                    &["mutatingwebhookconfigurations"],
                    // get/list/watch by name: the webhook watches its own configuration
                    // for rotation requests.
                    &["create", "patch", "get", "list", "watch"],
                )
            },
            // The check of what peers write in twin namespaces, served with it.
            PolicyRule {
                resource_names: Some(vec![names::PEER_WRITES_WEBHOOK.into()]),
                ..rule(
                    "admissionregistration.k8s.io",
                    &["validatingwebhookconfigurations"],
                    &["create", "patch", "get"],
                )
            },
            // Tandem's own resources: read everything, write what each controller owns.
            rule(
                tandem_api::GROUP,
                &[
                    "peerings",
                    "peeringrequests",
                    "peeringpolicies",
                    "tenants",
                    "networkparameters",
                    "remotenamespaces",
                    "shadowpods",
                    "namespaceoffloadings",
                ],
                WATCH,
            ),
            rule(
                tandem_api::GROUP,
                &["peerings", "remotenamespaces", "namespaceoffloadings"],
                &["patch"],
            ),
            rule(tandem_api::GROUP, &["peeringrequests"], &["delete"]),
            // Clusters heard over mDNS, recorded (see `discovery`); a lapsed one removed to
            // make way when the list is full.
            rule(
                tandem_api::GROUP,
                &["discoveredclusters"],
                &["list", "create", "patch", "delete"],
            ),
            // A twin namespace kept for its data loses its shadow pods (and so its pods).
            rule(
                tandem_api::GROUP,
                &["shadowpods"],
                &["delete", "deletecollection"],
            ),
            rule(
                tandem_api::GROUP,
                &["tenants", "networkparameters"],
                &["create", "patch"],
            ),
            rule(
                tandem_api::GROUP,
                &[
                    "peerings/status",
                    "peeringrequests/status",
                    "tenants/status",
                    "networkparameters/status",
                    "remotenamespaces/status",
                    "shadowpods/status",
                    "namespaceoffloadings/status",
                ],
                &["update", "patch"],
            ),
            // Real pods are owned by their shadow pod with blockOwnerDeletion, which kube's
            // OwnerReferencesPermissionEnforcement admission allows only with this.
            rule(tandem_api::GROUP, &["shadowpods/finalizers"], &["update"]),
        ],
    )
}

/// What the controller does in namespaces known at install time: a Role in each, bound to its
/// ServiceAccount by a RoleBinding of the same name.
pub fn controller_namespaced_roles() -> Vec<Role> {
    let role = |namespace: &str, rules: Vec<PolicyRule>| Role {
        metadata: ObjectMeta {
            namespace: Some(namespace.to_string()),
            ..cluster_role(names::CONTROLLER_NAME, vec![]).metadata
        },
        rules: Some(rules),
    };
    vec![
        role(
            names::SYSTEM_NAMESPACE,
            vec![
                // Its settings (tandem-config), its IPAM (tandem-ipam) and the node agent's
                // routes (tandem-routes); its settings are watched.
                rule(
                    "",
                    &["configmaps"],
                    &[
                        "get", "list", "watch", "create", "update", "patch", "delete",
                    ],
                ),
                // An invite's Role (narrowed to its request once filed) and binding, removed
                // when the invite ends; the gateways' and the node agent's, which read their
                // own configuration.
                rule(
                    "rbac.authorization.k8s.io",
                    &["roles", "rolebindings"],
                    &["get", "create", "patch", "delete"],
                ),
                // The network fabric: a gateway Deployment, its ServiceAccount and its
                // LoadBalancer Service per peer, and the node agent's DaemonSet.
                rule(
                    "",
                    &["serviceaccounts", "services"],
                    &["get", "list", "create", "patch", "delete"],
                ),
                rule(
                    "apps",
                    &["deployments", "daemonsets"],
                    &["get", "list", "create", "patch", "delete"],
                ),
                // Its discovery settings, watched by name.
                named(
                    rule("", &["configmaps"], &["list", "watch"]),
                    names::DISCOVERY_SETTINGS,
                ),
                // The leader Lease among its replicas.
                rule(
                    "coordination.k8s.io",
                    &["leases"],
                    &["get", "create", "update", "patch"],
                ),
            ],
        ),
        role(
            "kube-system",
            // The clusterset.local stub domain it keeps in CoreDNS's Corefile.
            vec![named(
                rule("", &["configmaps"], &["get", "patch"]),
                "coredns",
            )],
        ),
        role(
            LEASE_NAMESPACE,
            // Virtual nodes' heartbeats.
            vec![rule(
                "coordination.k8s.io",
                &["leases"],
                &["create", "patch", "delete"],
            )],
        ),
    ]
}

/// Namespace of node Leases.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";

/// The signer of peer identities' client certificates.
pub const PEER_CSR_SIGNER: &str = "kubernetes.io/kube-apiserver-client";

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};
    use tandem_apimachinery::rbac::{Attributes, RbacIndex, UserInfo};

    const TWIN: &str = "app-rome";
    const CONTROLLER: &str = "system:serviceaccount:tandem-system:tandem-controller";

    fn binding(kind: &str, namespace: &str, name: &str, role: &str, subject: Value) -> Value {
        json!({"kind": kind, "metadata": {"name": name, "namespace": namespace},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
               "subjects": [subject]})
    }

    /// The provider's RBAC as `tandem install` and a twin namespace allowing `capabilities` leave
    /// it: every Tandem ClusterRole, the controller's binding, the peer identity's bindings.
    fn provider(capabilities: &[PodCapability]) -> RbacIndex {
        let mut index = RbacIndex::default();
        for role in std::iter::once(controller_role()).chain(peer_roles()) {
            index.apply("ClusterRole", &serde_json::to_value(role).unwrap());
        }
        index.apply(
            "ClusterRoleBinding",
            &binding(
                "ClusterRoleBinding",
                "",
                names::CONTROLLER_NAME,
                names::CONTROLLER_NAME,
                json!({"kind": "ServiceAccount", "name": names::CONTROLLER_NAME,
                       "namespace": names::SYSTEM_NAMESPACE}),
            ),
        );
        let peer = json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                          "name": names::peer_user("rome")});
        let roles =
            std::iter::once(PEER_TWIN_ROLE).chain(capabilities.iter().map(|c| c.role_name()));
        for role in roles {
            index.apply(
                "RoleBinding",
                &binding("RoleBinding", TWIN, role, role, peer.clone()),
            );
        }
        index
    }

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo {
            name: name.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        }
    }

    fn peer() -> UserInfo {
        user(
            &names::peer_user("rome"),
            &[&names::peer_key_group("sha256:aa"), "system:authenticated"],
        )
    }

    fn may(index: &RbacIndex, who: &UserInfo, verb: &str, namespace: &str, sub: &str) -> bool {
        let attrs = Attributes {
            verb,
            namespace,
            resource: "pods",
            subresource: sub,
            name: "web-0",
            resource_request: true,
            ..Default::default()
        };
        index.authorize(who, &attrs).is_allowed()
    }

    #[test]
    fn peer_reads_logs_of_its_twin_pods_but_opens_streams_only_as_granted() {
        let index = provider(&[PodCapability::Exec]);
        let peer = peer();
        assert!(may(&index, &peer, "get", TWIN, "log"));
        assert!(may(&index, &peer, "create", TWIN, "exec"));
        assert!(may(&index, &peer, "get", TWIN, "exec"), "pre-1.30 upgrades");
        assert!(!may(&index, &peer, "create", TWIN, "attach"));
        assert!(!may(&index, &peer, "create", TWIN, "portforward"));
        // Never a write on the pods themselves, never outside its twin namespace.
        assert!(!may(&index, &peer, "delete", TWIN, ""));
        assert!(!may(&index, &peer, "create", TWIN, "eviction"));
        for elsewhere in ["kube-system", names::SYSTEM_NAMESPACE, "default"] {
            assert!(
                !may(&index, &peer, "create", elsewhere, "exec"),
                "{elsewhere}"
            );
            assert!(!may(&index, &peer, "get", elsewhere, "log"), "{elsewhere}");
        }
    }

    /// A consumer renews its fence lease and nothing else: not another Lease (a node's, in its
    /// tenant namespace or in kube-node-lease), not the provider's nonce Lease it reads.
    #[test]
    fn peer_hands_back_its_fence_nonce_only_through_its_fence_lease() {
        let tenant_ns = names::tenant_namespace("rome");
        let mut index = provider(&[]);
        index.apply(
            "RoleBinding",
            &binding(
                "RoleBinding",
                &tenant_ns,
                PEER_TENANT_ROLE,
                PEER_TENANT_ROLE,
                json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                       "name": names::peer_user("rome")}),
            ),
        );
        let can = |verb: &str, group: &str, resource: &str, sub: &str, ns: &str, name: &str| {
            let attrs = Attributes {
                verb,
                namespace: ns,
                api_group: group,
                resource,
                subresource: sub,
                name,
                resource_request: true,
                ..Default::default()
            };
            index.authorize(&peer(), &attrs).is_allowed()
        };
        let lease = "coordination.k8s.io";
        assert!(can(
            "patch",
            lease,
            "leases",
            "",
            &tenant_ns,
            names::FENCE_LEASE
        ));
        assert!(can(
            "get",
            lease,
            "leases",
            "",
            &tenant_ns,
            names::FENCE_LEASE
        ));
        assert!(can("create", lease, "leases", "", &tenant_ns, ""));
        assert!(!can("patch", lease, "leases", "", &tenant_ns, "other"));
        assert!(!can(
            "delete",
            lease,
            "leases",
            "",
            &tenant_ns,
            names::FENCE_LEASE
        ));
        assert!(!can("list", lease, "leases", "", &tenant_ns, ""));
        assert!(!can(
            "patch",
            lease,
            "leases",
            "",
            LEASE_NAMESPACE,
            names::FENCE_LEASE
        ));
        assert!(!can("create", lease, "leases", "", LEASE_NAMESPACE, ""));
        // The provider's nonce: read, never written.
        let nonce = names::FENCE_NONCE_LEASE;
        assert!(can("get", lease, "leases", "", &tenant_ns, nonce));
        assert!(!can("patch", lease, "leases", "", &tenant_ns, nonce));
        assert!(!can("update", lease, "leases", "", &tenant_ns, nonce));
        assert!(!can(
            "patch",
            tandem_api::GROUP,
            "tenants",
            "status",
            &tenant_ns,
            "rome"
        ));
        assert!(can(
            "get",
            tandem_api::GROUP,
            "tenants",
            "",
            &tenant_ns,
            "rome"
        ));
    }

    #[test]
    fn each_capability_role_opens_exactly_its_subresource() {
        let cases = [
            (PodCapability::Exec, PEER_EXEC_ROLE, "exec"),
            (PodCapability::Attach, PEER_ATTACH_ROLE, "attach"),
            (
                PodCapability::PortForward,
                PEER_PORTFORWARD_ROLE,
                "portforward",
            ),
        ];
        for (capability, role, sub) in cases {
            assert_eq!(capability.role().metadata.name.as_deref(), Some(role));
            let index = provider(&[capability]);
            for other in ["exec", "attach", "portforward"] {
                assert_eq!(
                    may(&index, &peer(), "create", TWIN, other),
                    other == sub,
                    "{role} and pods/{other}"
                );
            }
        }
        // The twin role alone opens no stream: refusing a capability is unbinding its role.
        let index = provider(&[]);
        for sub in ["exec", "attach", "portforward"] {
            assert!(!may(&index, &peer(), "create", TWIN, sub), "{sub}");
            assert!(!may(&index, &peer(), "get", TWIN, sub), "{sub}");
        }
    }

    #[test]
    fn tenant_pod_access_allows_each_capability_unless_refused() {
        let refused = |exec, attach, port_forward| PodAccess {
            exec,
            attach,
            port_forward,
        };
        let cases = [
            (PodAccess::default(), [true, true, true]),
            (refused(false, true, true), [false, true, true]),
            (refused(true, false, true), [true, false, true]),
            (refused(true, true, false), [true, true, false]),
            (refused(false, false, false), [false, false, false]),
        ];
        for (access, want) in cases {
            let got = PodCapability::ALL.map(|c| c.allowed_by(&access));
            assert_eq!(got, want, "{access:?}");
        }
        let absent: tandem_api::TenantSpec =
            serde_json::from_value(json!({"clusterID": "rome"})).unwrap();
        assert_eq!(absent.pod_access(), PodAccess::default());
        let partial: tandem_api::TenantSpec =
            serde_json::from_value(json!({"clusterID": "rome", "podAccess": {"exec": false}}))
                .unwrap();
        assert_eq!(partial.pod_access(), refused(false, true, true));
    }

    #[test]
    fn controller_binds_pod_access_without_holding_it() {
        // kube lets a user bind a role it does not hold only with `bind` on that role
        // (escalation check): the controller has it for every peer role, and no stream rights.
        let index = provider(&[]);
        let controller = user(
            CONTROLLER,
            &[
                "system:serviceaccounts",
                "system:serviceaccounts:tandem-system",
            ],
        );
        for role in peer_roles() {
            let name = role.metadata.name.clone().unwrap();
            let bind = Attributes {
                verb: "bind",
                api_group: "rbac.authorization.k8s.io",
                resource: "clusterroles",
                name: &name,
                resource_request: true,
                ..Default::default()
            };
            assert!(
                index.authorize(&controller, &bind).is_allowed(),
                "bind {name}"
            );
        }
        for capability in PodCapability::ALL {
            let rules = serde_json::to_value(capability.role().rules).unwrap();
            let missing = index.missing_rules(&controller, TWIN, rules.as_array().unwrap());
            assert!(
                !missing.is_empty(),
                "{capability:?} held by the controller itself"
            );
        }
        let bind_other = Attributes {
            verb: "bind",
            api_group: "rbac.authorization.k8s.io",
            resource: "clusterroles",
            name: "cluster-admin",
            resource_request: true,
            ..Default::default()
        };
        assert!(!index.authorize(&controller, &bind_other).is_allowed());
    }

    #[test]
    fn a_peer_is_bound_by_its_key_and_by_name_only_without_one_or_in_its_grace() {
        let tenant = |annotations: &[(&str, String)]| {
            let mut t = tandem_api::Tenant::new(
                "rome",
                serde_json::from_value(json!({"clusterID": "rome"})).unwrap(),
            );
            t.metadata.annotations = Some(
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.clone()))
                    .collect(),
            );
            t
        };
        let kinds = |v: Value| -> Vec<(String, String)> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|s| {
                    (
                        s["kind"].as_str().unwrap().to_string(),
                        s["name"].as_str().unwrap().to_string(),
                    )
                })
                .collect()
        };
        let key = (names::KEY_FINGERPRINT_ANNOTATION, "sha256:ab".to_string());
        let group = ("Group".to_string(), "tandem:peer-key:ab".to_string());
        let user = ("User".to_string(), "tandem:peer:rome".to_string());
        let now = k8s_openapi::jiff::Timestamp::now();
        let later = (now + std::time::Duration::from_secs(3600)).to_string();
        let earlier = (now - std::time::Duration::from_secs(3600)).to_string();
        let cases = [
            ("no key recorded", vec![], vec![user.clone()]),
            ("a key", vec![key.clone()], vec![group.clone()]),
            (
                "a Tenant from before, its old certificate still valid",
                vec![key.clone(), (names::USER_BOUND_UNTIL_ANNOTATION, later)],
                vec![group.clone(), user.clone()],
            ),
            (
                "a Tenant from before, its old certificate expired",
                vec![key.clone(), (names::USER_BOUND_UNTIL_ANNOTATION, earlier)],
                vec![group.clone()],
            ),
            (
                "an unreadable grace",
                vec![key, (names::USER_BOUND_UNTIL_ANNOTATION, "soon".into())],
                vec![group],
            ),
        ];
        for (what, annotations, want) in cases {
            assert_eq!(kinds(peer_subjects(&tenant(&annotations))), want, "{what}");
        }
    }
}
