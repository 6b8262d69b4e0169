//! How the API server reaches kubelets: a client CA and certificate of its own, and how to
//! connect to a node's address (kept apart from the proxy so the server's state can hold it).

use std::net::SocketAddr;
use std::sync::Arc;

use futures::future::BoxFuture;
use parking_lot::RwLock;

use crate::pki::CertPair;

/// Connects to a kubelet's address.
pub type Dialer = Arc<
    dyn Fn(SocketAddr) -> BoxFuture<'static, std::io::Result<tokio::net::TcpStream>> + Send + Sync,
>;

/// The API server's means of reaching kubelets.
pub struct KubeletAccess {
    /// The CA kubelets trust for the API server's client certificate.
    pub ca: CertPair,
    /// The API server's client certificate for kubelets.
    pub client: CertPair,
    /// How to connect (None: plain TCP from this process).
    pub dialer: RwLock<Option<Dialer>>,
}

impl KubeletAccess {
    /// A fresh client CA and certificate for cluster `name`.
    pub fn new(name: &str) -> Result<KubeletAccess, crate::pki::PkiError> {
        let (ca, client) = crate::pki::kubelet_client(name)?;
        Ok(KubeletAccess {
            ca,
            client,
            dialer: RwLock::new(None),
        })
    }
}
