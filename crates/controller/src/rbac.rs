//! The RBAC Tandem installs: the controller's own ClusterRole, and the ClusterRoles a peer
//! identity is bound to — in its tenant namespace and in its twin namespaces only. Nothing
//! cluster-scoped is ever granted to a peer.

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use kube::api::ObjectMeta;
use tandem_api::names;

/// ClusterRole bound (by RoleBinding) in a consumer's tenant namespace on the provider.
pub const PEER_TENANT_ROLE: &str = "tandem:peer-tenant";
/// ClusterRole bound (by RoleBinding) in each twin namespace on the provider.
pub const PEER_TWIN_ROLE: &str = "tandem:peer-twin";

const READ: &[&str] = &["get", "list", "watch"];
const ALL: &[&str] = &[
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
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
            rule(tandem_api::GROUP, &["shadowpods"], ALL),
            rule(tandem_api::GROUP, &["shadowpods/status"], READ),
            rule("", &["configmaps", "secrets", "services"], ALL),
            rule("discovery.k8s.io", &["endpointslices"], ALL),
            rule("", &["pods", "events"], READ),
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

/// What the controller itself needs in its own cluster, as provider and as consumer — and
/// nothing else: it never touches CRDs, ClusterRoles, ClusterRoleBindings, workloads or
/// webhooks other than its own. The rules here are cluster-wide because the namespaces they act
/// in (tenant, twin and offloaded namespaces) are only known at run time; what it does in fixed
/// namespaces is in [`controller_namespaced_roles`]. `tandem install`, which runs as the
/// administrator, creates what the controller cannot (CRDs, these roles, its Deployment).
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
            rule("", &["configmaps", "services"], &["list", "watch"]),
            rule("discovery.k8s.io", &["endpointslices"], &["list", "watch"]),
            // Provider events reflected onto the consumer's pods.
            rule("", &["events"], &["create", "patch"]),
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
            // RoleBindings of peer identities to the two peer roles (and nothing else: `bind`
            // is limited to them), in tenant and twin namespaces; removed from a twin
            // namespace retained for its data when its consumer unpeers.
            rule(
                "rbac.authorization.k8s.io",
                &["rolebindings"],
                &["create", "patch", "delete"],
            ),
            PolicyRule {
                resource_names: Some(vec![PEER_TENANT_ROLE.into(), PEER_TWIN_ROLE.into()]),
                ..rule("rbac.authorization.k8s.io", &["clusterroles"], &["bind"])
            },
            // A peer's client certificate: filed, approved, then removed.
            rule(
                "certificates.k8s.io",
                &["certificatesigningrequests"],
                &["get", "create", "delete", "deletecollection"],
            ),
            rule(
                "certificates.k8s.io",
                &["certificatesigningrequests/approval"],
                &["update", "patch"],
            ),
            PolicyRule {
                resource_names: Some(vec![PEER_CSR_SIGNER.into()]),
                ..rule("certificates.k8s.io", &["signers"], &["approve"])
            },
            // Its own placement webhook, by name.
            PolicyRule {
                resource_names: Some(vec![crate::consumer::webhook::WEBHOOK_CONFIGURATION.into()]),
                ..rule(
                    "admissionregistration.k8s.io",
                    &["mutatingwebhookconfigurations"],
                    &["create", "patch"],
                )
            },
            // Tandem's own resources: read everything, write what each controller owns.
            rule(
                tandem_api::GROUP,
                &[
                    "peerings",
                    "peeringrequests",
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
                // Its settings (tandem-config) and its IPAM (tandem-ipam).
                rule("", &["configmaps"], &["get", "create", "update", "delete"]),
                // An invite's Role (narrowed to its request once filed) and binding, removed
                // when the invite ends.
                rule(
                    "rbac.authorization.k8s.io",
                    &["roles"],
                    &["patch", "delete"],
                ),
                rule("rbac.authorization.k8s.io", &["rolebindings"], &["delete"]),
            ],
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
