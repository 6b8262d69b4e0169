//! Which real distribution a lab cluster models where distributions differ.

/// The real distribution a network-mode cluster behaves as, where distributions differ.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LabProfile {
    /// k3s on its own machines: ServiceLB answers every LoadBalancer Service with the
    /// cluster's public (WAN) address; the nodes sit behind the cluster's NAT.
    #[default]
    K3s,
    /// kind: no load balancer (LoadBalancer Services stay pending), and the nodes of every
    /// kind cluster share one network (kind's docker bridge), so a node's address is reached
    /// from the other kind clusters' nodes and pods, unNATed.
    Kind,
}

impl LabProfile {
    /// The name on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            LabProfile::K3s => "k3s",
            LabProfile::Kind => "kind",
        }
    }
}

impl std::str::FromStr for LabProfile {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "k3s" => Ok(LabProfile::K3s),
            "kind" => Ok(LabProfile::Kind),
            other => Err(format!(
                "lab profile {other:?} is neither \"k3s\" nor \"kind\""
            )),
        }
    }
}
