//! The RBAC Tandem installs: the controller's own ClusterRole, and the ClusterRoles a peer
//! identity is bound to — in its tenant namespace and in its twin namespaces only. Nothing
//! cluster-scoped is ever granted to a peer.

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
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
        ],
    )
}

/// What the controller itself needs in its own cluster (both roles).
pub fn controller_role() -> ClusterRole {
    let mut role = cluster_role(
        names::CONTROLLER_NAME,
        vec![PolicyRule {
            api_groups: Some(vec!["*".into()]),
            resources: Some(vec!["*".into()]),
            verbs: vec!["*".into()],
            ..Default::default()
        }],
    );
    // The controller creates namespaces, RBAC for peers (which needs every permission it
    // grants, RBAC's escalation check), webhooks, nodes, leases and pods across namespaces:
    // in practice cluster-admin. Narrowing it is tracked as a follow-up.
    role.metadata.annotations = Some(
        [(
            "tandem.dev/why".to_string(),
            "creates namespaces, nodes, RBAC and pods on behalf of peers".to_string(),
        )]
        .into(),
    );
    role
}
