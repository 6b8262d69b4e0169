//! What can go wrong peering with a provider, negotiating its network and unpeering: each
//! error names the provider and the step.

use crate::consumer::link::IdentityError;
use crate::error::RequestError;

/// What failed while reconciling a Peering.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("peering with {provider}: {step}")]
    Kube {
        provider: String,
        step: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("peering with {provider}")]
    Unpeer {
        provider: String,
        #[source]
        source: UnpeerError,
    },
}

pub(super) fn kube_step(provider: &str, step: &'static str) -> impl FnOnce(kube::Error) -> Error {
    let provider = provider.to_string();
    move |source| Error::Kube {
        provider,
        step,
        source,
    }
}

/// A step of unpeering on the consumer; when one fails, the Peering's `Unpeered` condition
/// carries it as its reason, so `tandem unpeer` can tell the admin where it is stuck.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnpeerStep {
    DeleteVirtualNode,
    DeleteLease,
    DrainPods,
    ReadIdentity,
    DeleteTwinNamespaces,
    DeleteTenant,
    ReleaseIpam,
    RemoveGatewayKey,
    DeleteTenantNamespace,
}

impl UnpeerStep {
    pub(super) const ALL: [UnpeerStep; 9] = [
        UnpeerStep::DeleteVirtualNode,
        UnpeerStep::DeleteLease,
        UnpeerStep::DrainPods,
        UnpeerStep::ReadIdentity,
        UnpeerStep::DeleteTwinNamespaces,
        UnpeerStep::DeleteTenant,
        UnpeerStep::ReleaseIpam,
        UnpeerStep::RemoveGatewayKey,
        UnpeerStep::DeleteTenantNamespace,
    ];

    /// The condition reason standing for this step.
    pub fn reason(self) -> &'static str {
        match self {
            UnpeerStep::DeleteVirtualNode => "DeleteVirtualNode",
            UnpeerStep::DeleteLease => "DeleteLease",
            UnpeerStep::DrainPods => "DrainPods",
            UnpeerStep::ReadIdentity => "ReadIdentity",
            UnpeerStep::DeleteTwinNamespaces => "DeleteTwinNamespaces",
            UnpeerStep::DeleteTenant => "DeleteTenant",
            UnpeerStep::ReleaseIpam => "ReleaseIpam",
            UnpeerStep::RemoveGatewayKey => "RemoveGatewayKey",
            UnpeerStep::DeleteTenantNamespace => "DeleteTenantNamespace",
        }
    }

    /// The step a condition reason stands for.
    pub fn from_reason(reason: &str) -> Option<UnpeerStep> {
        Self::ALL.into_iter().find(|s| s.reason() == reason)
    }

    /// Whether `tandem unpeer --force` skips this step (it needs the provider).
    pub fn skipped_by_force(self) -> bool {
        matches!(
            self,
            UnpeerStep::ReadIdentity | UnpeerStep::DeleteTwinNamespaces | UnpeerStep::DeleteTenant
        )
    }
}

impl std::fmt::Display for UnpeerStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            UnpeerStep::DeleteVirtualNode => "deleting the virtual node",
            UnpeerStep::DeleteLease => "deleting the virtual node's Lease",
            UnpeerStep::DrainPods => "deleting the pods of the virtual node",
            UnpeerStep::ReadIdentity => "reading the peer identity",
            UnpeerStep::DeleteTwinNamespaces => "deleting the twin namespaces on the provider",
            UnpeerStep::DeleteTenant => "deleting our Tenant on the provider",
            UnpeerStep::ReleaseIpam => "releasing the IPAM grant",
            UnpeerStep::RemoveGatewayKey => "removing the gateway to the provider and its key",
            UnpeerStep::DeleteTenantNamespace => "deleting the tenant namespace",
        })
    }
}

/// What stopped an unpeering step.
#[derive(Debug, thiserror::Error)]
pub enum UnpeerCause {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error(transparent)]
    Ipam(#[from] crate::provider::network::IpamError),
    /// `--delete-data`: the Tenant goes only once the twin namespaces are gone, or the
    /// provider would retain those holding claims.
    #[error("waiting for {0} twin namespace(s) to be deleted with their data")]
    TwinsWithData(usize),
}

/// A step of unpeering that failed (the reconciler retries it).
#[derive(Debug, thiserror::Error)]
#[error("unpeering: {step}")]
pub struct UnpeerError {
    pub step: UnpeerStep,
    #[source]
    pub cause: UnpeerCause,
}

impl UnpeerError {
    /// Whether the provider did not answer at all.
    pub fn provider_unreachable(&self) -> bool {
        self.step.skipped_by_force()
            && matches!(&self.cause, UnpeerCause::Kube(e) if crate::error::is_unreachable(e))
    }
}

pub(super) fn unpeer_step<E: Into<UnpeerCause>>(step: UnpeerStep) -> impl FnOnce(E) -> UnpeerError {
    move |e| UnpeerError {
        step,
        cause: e.into(),
    }
}

/// Why the network parameters could not be exchanged.
#[derive(Debug, thiserror::Error)]
pub enum NegotiationError {
    #[error("reading this cluster's settings")]
    Settings(#[from] crate::install::InstallError),
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error("the provider's pod CIDR {cidr:?}")]
    PodCidr {
        cidr: String,
        #[source]
        source: ipnet::AddrParseError,
    },
    #[error("remapping the provider's prefixes")]
    Ipam(#[from] crate::provider::network::IpamError),
    #[error("the provider refused this cluster's prefixes: {0}")]
    Refused(String),
    #[error("this cluster's gateway key for the provider")]
    GatewayKey(#[from] crate::fabric::KeyError),
}
