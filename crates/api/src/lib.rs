//! Tandem's API: the custom resources of the `tandem.dev` group (v1alpha1), the well-known
//! labels, annotations and names every component agrees on, and Kubernetes-style conditions.
//!
//! This crate owns the k8s-openapi version for the controller and the CLI.

pub mod client;
pub mod conditions;
pub mod crds;
pub mod discovery;
pub mod kubeconfig;
pub mod mcs;
pub mod names;
pub mod offloading;
pub mod peering;
pub mod policy;
pub mod provider;
pub mod schema;
pub mod shadowpod;

pub use conditions::{ConditionStatus, set_condition};
pub use discovery::{DiscoveredCluster, DiscoveredClusterSpec};
pub use mcs::{
    ClusterProperty, ExportedService, ExportedServiceSpec, ServiceExport, ServiceImport,
    ServiceImportSpec,
};
pub use offloading::{
    NamespaceMappingStrategy, NamespaceOffloading, NamespaceOffloadingSpec,
    NamespaceOffloadingStatus, PartitionPolicy, PodOffloadingStrategy, RemoteNamespaceStatus,
};
pub use peering::{NodeHealth, Peering, PeeringSpec, PeeringStatus};
pub use policy::{PeeringPolicy, PeeringPolicySpec, PolicyConsumer};
pub use provider::{
    FenceStatus, GrantableServiceType, NetworkParameters, NetworkParametersSpec,
    NetworkParametersStatus, PeeringRequest, PeeringRequestSpec, PeeringRequestStatus, PodAccess,
    PodResources, PodSecurity, RemoteNamespace, RemoteNamespaceSpec, RemoteNamespaceStatusFields,
    Tenant, TenantSpec, TenantStatus, WithoutRequests,
};
pub use shadowpod::{ShadowPod, ShadowPodSpec, ShadowPodStatus};

/// The API group of every Tandem custom resource.
pub const GROUP: &str = "tandem.dev";
/// The served (and stored) version.
pub const VERSION: &str = "v1alpha1";
