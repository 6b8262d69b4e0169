//! Why the API server could not start, or could not hand out a client.

use std::path::PathBuf;

use crate::error::ApiError;
use crate::pki::PkiError;

/// Why [`ApiServer::start`](crate::ApiServer::start) failed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The store's directory could not be opened or replayed.
    #[error("opening the store in {dir:?}")]
    Store {
        dir: Option<PathBuf>,
        #[source]
        source: std::io::Error,
    },
    /// A certificate or key could not be loaded, made or saved.
    #[error(transparent)]
    Pki(#[from] PkiError),
    /// The admin token could not be saved.
    #[error("writing the admin token {path:?}")]
    Token {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The port could not be listened on.
    #[error("listening on 127.0.0.1:{port}")]
    Listen {
        port: u16,
        #[source]
        source: std::io::Error,
    },
    /// The cluster's built-in objects could not be created.
    #[error(transparent)]
    Bootstrap(#[from] BootstrapError),
}

/// Why the built-in objects of a fresh cluster could not be created.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// The registry lacks a built-in resource (a bug).
    #[error("built-in resource {group}/{resource} missing")]
    MissingResource { group: String, resource: String },
    /// The default RBAC policy names a kind the registry does not serve (a bug).
    #[error("bootstrap policy has unknown kind {0}")]
    UnknownKind(String),
    /// Defaulting or creating one object failed.
    #[error("bootstrapping {resource}/{name}")]
    Create {
        resource: String,
        name: String,
        #[source]
        source: Box<ApiError>,
    },
    /// The client CAs could not be published in `kube-system`.
    #[error("publishing the client CAs")]
    ClientCas(#[source] Box<ApiError>),
}

/// Why a kubeconfig or client for this server could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The client certificate could not be issued.
    #[error("issuing the client certificate")]
    Certificate(#[source] PkiError),
    /// The kubeconfig could not be written.
    #[error("writing {path:?}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The kubeconfig does not parse.
    #[error("reading the kubeconfig")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
    /// kube could not build a client from it.
    #[error("building the client")]
    Build(#[source] kube::Error),
}
