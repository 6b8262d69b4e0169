//! Why network mode, or a part of it, cannot start: the namespaces, a pod's network, the
//! cluster's services and the kubelet endpoints. Each error names the object and the step,
//! and keeps its cause as its source.

use std::net::SocketAddr;

/// Why network mode, or a part of it, cannot start.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// Not root.
    #[error(
        "network mode needs root (it creates network namespaces, veth links and nftables rules); \
         run as root, or leave network mode off for hollow pods"
    )]
    NotRoot,
    /// A tool failed.
    #[error("{step}: {detail}")]
    Step {
        /// What was being done.
        step: String,
        /// What went wrong.
        detail: String,
    },
    /// A command network mode runs is not installed.
    #[error(
        "network mode needs the `{tool}` command, which is not on PATH: install the Debian \
         package {package} (the project's .ci/install-deps does)"
    )]
    MissingTool {
        /// The command.
        tool: &'static str,
        /// The Debian package that has it.
        package: &'static str,
    },
    /// Two clusters of one instance asked for the same index.
    #[error("cluster index {0} is already used in this lab instance (node networks would clash)")]
    IndexInUse(usize),
    /// A node's InternalIP is not an IPv4 address.
    #[error("node {node}: InternalIP {ip:?}")]
    NodeIp {
        /// Node name.
        node: String,
        /// The address as configured.
        ip: String,
        /// Why it does not parse.
        #[source]
        source: std::net::AddrParseError,
    },
    /// A node's pod CIDR is not an IPv4 network.
    #[error("node {node}: pod CIDR {cidr:?}")]
    PodCidr {
        /// Node name.
        node: String,
        /// The CIDR as configured.
        cidr: String,
        /// Why it does not parse.
        #[source]
        source: ipnet::AddrParseError,
    },
    /// A blocking step (namespaces, links) did not finish: its task panicked or was cancelled.
    #[error("{step}")]
    Task {
        /// What was being done (`pod demo/web: creating its network`).
        step: String,
        /// Why the task did not finish.
        #[source]
        source: tokio::task::JoinError,
    },
    /// A pod was to start on a node the cluster does not have.
    #[error("pod {pod}: {node} is not a lab node")]
    NotALabNode {
        /// `namespace/name` of the pod.
        pod: String,
        /// The node it is bound to.
        node: String,
    },
    /// A pod's namespace or links could not be made.
    #[error("pod {pod}: creating its network")]
    PodNetwork {
        /// `namespace/name` of the pod.
        pod: String,
        /// What failed.
        #[source]
        source: Box<NetworkError>,
    },
    /// A socket of the cluster's services could not be opened in a namespace of the lab.
    #[error("{service} on {addr} in {netns}")]
    Listen {
        /// What listens (`API server listener`, `DNS socket`, `kubelet endpoint`).
        service: String,
        /// Where.
        addr: SocketAddr,
        /// The network namespace it was to be opened in.
        netns: String,
        /// The socket's error.
        #[source]
        source: std::io::Error,
    },
    /// A request setting up the cluster's services failed.
    #[error("{step}")]
    Api {
        /// What was being done (`creating Service kube-system/kube-dns`).
        step: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// An object the lab writes does not have the shape of its kind (a bug).
    #[error("building {object}")]
    Object {
        /// The kind and name of the object.
        object: String,
        /// Why it does not deserialize.
        #[source]
        source: serde_json::Error,
    },
    /// The watch of Services or EndpointSlices stopped before its first list.
    #[error("watching {kind}")]
    Watch {
        /// `Services` or `EndpointSlices`.
        kind: &'static str,
        /// The reflector's error.
        #[source]
        source: kube::runtime::reflector::store::WriterDropped,
    },
    /// A node's serving certificate could not be issued.
    #[error("node {node}: issuing the kubelet's serving certificate")]
    ServingCertificate {
        /// Node name.
        node: String,
        /// The CA's error.
        #[source]
        source: tandem_apiserver::pki::PkiError,
    },
    /// The TLS configuration of a kubelet endpoint could not be made.
    #[error("kubelet endpoint TLS: {step}")]
    KubeletTls {
        /// What was being read or built.
        step: &'static str,
        /// rustls's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}
