//! Names, labels, annotations and taints that the controller, the CLI and tests agree on.

/// Namespace Tandem is installed into (controller, cluster identity, invites, peering requests).
pub const SYSTEM_NAMESPACE: &str = "tandem-system";
/// Secret (in [`SYSTEM_NAMESPACE`]) holding this cluster's ID and key pair.
pub const IDENTITY_SECRET: &str = "tandem-cluster-identity";
/// Keys of the identity Secret.
pub const IDENTITY_KEY_CLUSTER_ID: &str = "cluster-id";
pub const IDENTITY_KEY_PRIVATE_KEY: &str = "private-key.pem";
pub const IDENTITY_KEY_PUBLIC_KEY: &str = "public-key.pem";
/// ConfigMap (in [`SYSTEM_NAMESPACE`]) with cluster-level settings written by `tandem install`.
pub const CONFIG_MAP: &str = "tandem-config";
/// ServiceAccount, ClusterRole and Deployment name of the controller.
pub const CONTROLLER_NAME: &str = "tandem-controller";

/// `app.kubernetes.io/managed-by` value on every object Tandem creates.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "tandem";
/// The cluster a tenant namespace, twin namespace or reflected object belongs to (the peer).
pub const REMOTE_CLUSTER_LABEL: &str = "tandem.dev/remote-cluster-id";
/// On objects in a provider: the consumer cluster they were created for.
pub const ORIGIN_CLUSTER_LABEL: &str = "tandem.dev/origin-cluster-id";
/// On twin namespaces: the consumer namespace they mirror.
pub const ORIGIN_NAMESPACE_LABEL: &str = "tandem.dev/origin-namespace";
/// Marks tenant namespaces (`tandem-tenant-<peer>`).
pub const TENANT_NAMESPACE_LABEL: &str = "tandem.dev/tenant-namespace";
/// Marks twin namespaces on providers.
pub const TWIN_NAMESPACE_LABEL: &str = "tandem.dev/twin-namespace";
/// Label on a twin namespace: the pod offloading strategy its consumer asked for it with
/// (checked at shadow-pod admission against the Tenant's allowed strategies).
pub const POD_OFFLOADING_LABEL: &str = "tandem.dev/pod-offloading-strategy";
/// Node label marking a virtual node; value [`VIRTUAL_NODE_TYPE`].
pub const NODE_TYPE_LABEL: &str = "tandem.dev/type";
pub const VIRTUAL_NODE_TYPE: &str = "virtual-node";
/// Taint key on virtual nodes; only pods of offloaded namespaces tolerate it.
pub const VIRTUAL_NODE_TAINT: &str = "virtual-node.tandem.dev/not-allowed";
/// Annotation opting a DaemonSet (or its pod template) into running on virtual nodes: value
/// `"true"`. Without it Tandem keeps DaemonSet pods off virtual nodes; with it, one pod per
/// virtual node runs in its provider.
pub const DAEMONSET_ON_VIRTUAL_NODES_ANNOTATION: &str = "tandem.dev/daemonset-on-virtual-nodes";
/// The ClusterRole that lets a user run `tandem status` and nothing more.
pub const VIEWER_ROLE: &str = "tandem-viewer";
/// Label a hollow lab cluster (pods without processes or network) puts on its `kube-system`
/// Namespace, value `"true"`: Tandem leaves the network fabric off there, and says why.
pub const HOLLOW_CLUSTER_LABEL: &str = "lab.tandem.dev/hollow-pods";
/// Label on reflected objects: the kind of reflection that owns them.
pub const REFLECTED_LABEL: &str = "tandem.dev/reflected";
/// Annotation on invite bootstrap-token Secrets: what the invite is for.
pub const INVITE_ANNOTATION: &str = "tandem.dev/invite";
/// Bootstrap-token group prefix of invite tokens (one group per token).
pub const INVITE_GROUP_PREFIX: &str = "system:bootstrappers:tandem:invite-";
/// Prefix of the group a peer certificate carries (its only organization): see
/// [`peer_key_group`].
pub const PEER_KEY_GROUP_PREFIX: &str = "tandem:peer-key:";
/// Namespace (on a provider) where consumers that found it through discovery file their
/// peering requests with the enrollment credential, and nothing else lives.
pub const ENROLL_NAMESPACE: &str = "tandem-enroll";
/// Bootstrap-token group of the enrollment credential.
pub const ENROLL_GROUP: &str = "system:bootstrappers:tandem:enroll";
/// Value of [`INVITE_ANNOTATION`] on the enrollment credential's token Secret.
pub const ENROLL_TOKEN_PURPOSE: &str = "enrollment";
/// Annotation on a Tenant: the PeeringPolicy that approved its consumer.
pub const POLICY_ANNOTATION: &str = "tandem.dev/peering-policy";
/// Annotation on a Tenant: the consumer key fingerprint its request was approved for.
pub const KEY_FINGERPRINT_ANNOTATION: &str = "tandem.dev/key-fingerprint";
/// Annotation on a Tenant whose roles are bound to its key's group
/// ([`peer_key_group`]): set on the Tenants made since, and on older ones once their key is
/// taken from the certificate issued to them.
pub const KEY_BOUND_ANNOTATION: &str = "tandem.dev/key-bound";
/// Annotation on a Tenant made before its certificates carried their key's group: until this
/// time (RFC 3339, the expiry of the certificate issued then) its roles stay bound to its user
/// name as well, so that the consumer can renew to a certificate that carries the group.
pub const USER_BOUND_UNTIL_ANNOTATION: &str = "tandem.dev/user-bound-until";
/// Finalizer of every Tandem reconciler that must undo state before deletion.
pub const FINALIZER: &str = "tandem.dev/finalizer";
/// On a pod of a namespace offloaded with `partitionPolicy: Fence` (set at admission), and as a
/// label on its ShadowPod: the pod's `fenceAfter` duration (`10s`), which both sides of a
/// partition read.
pub const FENCE_AFTER: &str = "tandem.dev/fence-after";
/// The Lease, in the consumer's tenant namespace on a provider, through which the consumer
/// hands back the provider's latest fence nonce (in the annotation below).
pub const FENCE_LEASE: &str = "tandem-fence";
/// The Lease, next to it, in which the provider publishes its latest nonce (same annotation)
/// and when the newest nonce handed back was issued (wall clock, for a restarted controller).
pub const FENCE_NONCE_LEASE: &str = "tandem-fence-nonce";
pub const FENCE_NONCE_ANNOTATION: &str = "tandem.dev/fence-nonce";
pub const FENCE_ACCEPTED_AT_ANNOTATION: &str = "tandem.dev/fence-accepted-at";
/// Label of both fence Leases (`consumer` or `provider`: who writes it).
pub const FENCE_LEASE_LABEL: &str = "tandem.dev/fence-lease";
/// Annotation of a virtual node: its gateway's last report of the tunnel, JSON
/// (`{"state", "rttMs", "rxBytes", "txBytes"}`), refreshed with the node's status.
pub const TUNNEL_ANNOTATION: &str = "tandem.dev/tunnel";
/// Annotations of the controller's leader Lease (`tandem-system/tandem-controller`): the
/// version and the peering protocol of the replica holding it, written with every renewal. An
/// image's version is known only once it runs: `tandem install` and `tandem version` read them
/// here.
pub const CONTROLLER_VERSION_ANNOTATION: &str = "tandem.dev/controller-version";
pub const PEERING_PROTOCOL_ANNOTATION: &str = "tandem.dev/peering-protocol";
/// Name a NamespaceOffloading must have (one per namespace).
pub const OFFLOADING_NAME: &str = "offloading";
/// Field manager used by every Tandem writer.
pub const FIELD_MANAGER: &str = "tandem";

/// StorageClass `tandem install` creates in every cluster: a PVC of this class used by a pod
/// that the scheduler places on a virtual node is provisioned in that node's provider (in the
/// twin namespace, same name), and its consumer PV pins the claim to that virtual node (data
/// gravity). Binding waits for the first consumer (`WaitForFirstConsumer`).
pub const STORAGE_CLASS: &str = "tandem";
/// Provisioner of [`STORAGE_CLASS`] (the consumer's storage reconciler answers for it).
pub const STORAGE_PROVISIONER: &str = "tandem.dev/remote";
/// CSI driver named by the PVs Tandem creates for remote volumes (nothing mounts them locally:
/// the pods using them run in the provider, which mounts its own PVC).
pub const CSI_DRIVER: &str = "tandem.dev";
/// StorageClass parameter of [`STORAGE_CLASS`]: the provider StorageClass to provision remote
/// volumes with (absent: the provider's default StorageClass).
pub const REMOTE_STORAGE_CLASS_PARAMETER: &str = "remoteStorageClass";
/// Annotation the scheduler sets on an unbound `WaitForFirstConsumer` PVC: the node it chose.
pub const SELECTED_NODE_ANNOTATION: &str = "volume.kubernetes.io/selected-node";
/// Finalizer on consumer PVCs of [`STORAGE_CLASS`]: the provider's copy is deleted first.
pub const REMOTE_VOLUME_FINALIZER: &str = "tandem.dev/remote-volume";
/// On a consumer PV of a remote volume: the twin namespace its provider PVC lives in.
pub const REMOTE_NAMESPACE_ANNOTATION: &str = "tandem.dev/remote-namespace";
/// On a NamespaceOffloading, Peering or Tenant being deleted (`--delete-data`): the provider
/// PVCs of its twin namespaces are deleted too. Without it they are retained and reported.
pub const DELETE_DATA_ANNOTATION: &str = "tandem.dev/delete-data";
/// On a provider twin namespace kept after unoffloading or unpeering because it holds PVCs.
pub const RETAINED_DATA_LABEL: &str = "tandem.dev/retained-data";
/// ResourceQuota in every twin namespace: the storage part of the consumer's grant.
pub const GRANT_QUOTA: &str = "tandem-grant";
/// Grant keys that limit storage (enforced by [`GRANT_QUOTA`], not capacity of the virtual node).
pub const STORAGE_GRANT_KEYS: &[&str] = &["requests.storage", "persistentvolumeclaims"];

/// `tandem-tenant-<peer>`: the namespace holding everything about one peering, on each side.
pub fn tenant_namespace(peer_cluster_id: &str) -> String {
    format!("tandem-tenant-{peer_cluster_id}")
}

/// User name of a consumer's peer identity in a provider.
pub fn peer_user(consumer_cluster_id: &str) -> String {
    format!("tandem:peer:{consumer_cluster_id}")
}

/// The group of a peer certificate issued for the key `key_fingerprint` (`sha256:<hex>`, as
/// [`KEY_FINGERPRINT_ANNOTATION`] records it). A provider binds a consumer's roles to the group
/// of the key its Tenant records, not to the user name, which is only the self-asserted cluster
/// ID: a certificate from an earlier peering under the same ID, for another key, reaches
/// nothing once the ID peers again.
pub fn peer_key_group(key_fingerprint: &str) -> String {
    let hex = key_fingerprint
        .strip_prefix("sha256:")
        .unwrap_or(key_fingerprint);
    format!("{PEER_KEY_GROUP_PREFIX}{hex}")
}

/// Name of the virtual node standing for a provider in a consumer.
pub fn virtual_node_name(provider_cluster_id: &str) -> String {
    format!("tandem-{provider_cluster_id}")
}

/// The longest cluster ID, so that derived names (`tandem-tenant-<id>`, `<ns>-<id>`) stay valid.
pub const CLUSTER_ID_MAX_LEN: usize = 40;

/// Whether `id` is usable as a cluster ID: a DNS-1123 label of at most [`CLUSTER_ID_MAX_LEN`]
/// characters.
pub fn validate_cluster_id(id: &str) -> Result<(), ClusterIdError> {
    if id.is_empty() || id.len() > CLUSTER_ID_MAX_LEN {
        return Err(ClusterIdError::Length(id.to_string()));
    }
    if !tandem_apimachinery::validation::is_dns1123_label(id) {
        return Err(ClusterIdError::Characters(id.to_string()));
    }
    Ok(())
}

/// Why a string is not a cluster ID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterIdError {
    /// Empty, or longer than [`CLUSTER_ID_MAX_LEN`].
    #[error("cluster ID {0:?} must be 1 to {CLUSTER_ID_MAX_LEN} characters long")]
    Length(String),
    /// Not a DNS-1123 label.
    #[error(
        "cluster ID {0:?} must consist of lower-case letters, digits and '-', and start and end with a letter or digit"
    )]
    Characters(String),
}

/// `app.kubernetes.io/name` of the fabric's gateway pods.
pub const GATEWAY_APP: &str = "tandem-gateway";
/// The fabric's node agent: its DaemonSet, ServiceAccount, Role and RoleBinding.
pub const AGENT: &str = "tandem-agent";
/// ConfigMap (tandem-system) with each peer's prefixes for the node agent (`routes.json`:
/// peer → prefixes).
pub const ROUTES_CONFIG_MAP: &str = "tandem-routes";
/// The key of the routes in [`ROUTES_CONFIG_MAP`].
pub const ROUTES_KEY: &str = "routes.json";
/// The key of the private key (base64 X25519, as `wg genkey` prints it) in a gateway's Secret
/// ([`gateway_secret`]).
pub const GATEWAY_PRIVATE_KEY: &str = "privateKey";
/// The key of the gateway's whole configuration (`tandem_netspec::GatewayArgs`, JSON) in its
/// Secret, once both sides' parameters are known; the gateway pod reads it.
pub const GATEWAY_CONFIG: &str = "gateway.json";

/// The Secret (tandem-system) holding this cluster's WireGuard key for `peer`, and the
/// configuration of the gateway to it; also the name of that gateway's Deployment.
pub fn gateway_secret(peer: &str) -> String {
    format!("tandem-gateway-{peer}")
}

/// The signer of kubelet serving certificates (kube-controller-manager's name).
pub const KUBELET_SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";
/// Where kube-apiserver publishes the CAs of the client certificates it accepts.
pub const CLIENT_CA_NAMESPACE: &str = "kube-system";
/// The Role kube-apiserver bootstraps for reading the client CAs in [`CLIENT_CA_NAMESPACE`].
pub const CLIENT_CA_READER_ROLE: &str = "extension-apiserver-authentication-reader";
/// The MutatingWebhookConfiguration that places pods of offloaded namespaces.
pub const PLACEMENT_WEBHOOK: &str = "tandem-pod-placement";
/// The ValidatingWebhookConfiguration that checks what a peer writes in its tenant namespace.
pub const PEER_WRITES_WEBHOOK: &str = "tandem-peer-writes";
/// The ConfigMap (in `tandem-system`) that turns mDNS discovery on (absent: no multicast).
pub const DISCOVERY_SETTINGS: &str = "tandem-discovery";
/// The PriorityClass of the controller and the gateways.
pub const PRIORITY_CLASS: &str = "tandem-critical";
/// `endpointslice.kubernetes.io/managed-by`: which controller manages an EndpointSlice.
pub const SLICE_MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// `endpointslice.kubernetes.io/managed-by` of the EndpointSlices Tandem writes for imports.
pub const MCS_SLICE_MANAGER: &str = "mcs-controller.tandem.dev";
/// The EndpointSlices Kubernetes derives from a Service's selector, and no others: the only
/// source of a Service's exported endpoints (a slice labelled by hand, reflected or imported
/// would let anyone with write access to a namespace export, and open the fabric to, any
/// address).
pub const SOURCE_SLICES_SELECTOR: &str =
    "endpointslice.kubernetes.io/managed-by=endpointslice-controller.k8s.io";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_ids() {
        for ok in ["milan", "eu-west-1", "a", "0abc"] {
            assert!(validate_cluster_id(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Milan", "-a", "a-", "a_b", "a.b", &"x".repeat(41)] {
            assert!(validate_cluster_id(bad).is_err(), "{bad}");
        }
    }
}
