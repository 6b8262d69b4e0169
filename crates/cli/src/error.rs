//! The errors of the CLI's shared plumbing (flags, cluster access, owned directories); each
//! command adds its own context at its edge with anyhow.

use std::path::PathBuf;

/// An error of the CLI's shared plumbing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kubeconfig could not be read or parsed.
    #[error("reading kubeconfig {}", path.as_ref().map_or("($KUBECONFIG or ~/.kube/config)".into(), |p| p.display().to_string()))]
    ReadKubeconfig {
        /// The file `--kubeconfig` named; `None` for kubectl's default search.
        path: Option<PathBuf>,
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// Neither `--context` nor the kubeconfig's current context says which cluster to use.
    #[error("the kubeconfig has no current context; pass --context")]
    NoCurrentContext,
    /// `--context` (or the current context) names no context of the kubeconfig.
    #[error("context {0:?} is not in the kubeconfig")]
    UnknownContext(String),
    /// A context names a cluster the kubeconfig does not define.
    #[error("cluster {cluster:?} of context {context:?} is not in the kubeconfig")]
    UnknownCluster {
        /// The context.
        context: String,
        /// The cluster it names.
        cluster: String,
    },
    /// The cluster entry has no `server`.
    #[error("cluster {0:?} of the kubeconfig has no server")]
    NoServer(String),
    /// `certificate-authority-data` is not base64 of a PEM text.
    #[error("certificate-authority-data of cluster {0:?} is not base64 of a PEM certificate")]
    CaData(String),
    /// The `certificate-authority` file could not be read.
    #[error("reading CA file {path}")]
    CaFile {
        /// The file.
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// kube could not make a client configuration of the context.
    #[error("kubeconfig context {context:?}")]
    ClientConfig {
        /// The context.
        context: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// No flags, and neither a kubeconfig nor an in-cluster configuration was found.
    #[error("finding the cluster (pass --kubeconfig / --context)")]
    InferConfig(#[source] kube::config::InferConfigError),
    /// kube refused to build the client.
    #[error("building the client")]
    Client(#[source] kube::Error),
    /// A duration flag that humantime cannot read.
    #[error("{input:?} is not a duration like 90s, 2m or 1h30m")]
    Duration {
        /// What was given.
        input: String,
        #[source]
        source: humantime::DurationError,
    },
    /// A zero duration where a wait or a validity is meant.
    #[error("{0:?} is zero; give a positive duration like 90s, 2m or 1h30m")]
    ZeroDuration(String),
    /// The namespace positional and `-n` disagree.
    #[error("namespace {positional:?} and -n/--namespace {flag:?} disagree; give one")]
    NamespaceConflict {
        /// The positional argument.
        positional: String,
        /// The `-n` flag.
        flag: String,
    },
    /// Neither the positional nor `-n` names a namespace.
    #[error("which namespace? give it as an argument or with -n/--namespace")]
    NoNamespace,
    /// A directory Tandem would write into or clear holds things Tandem did not put there.
    #[error(
        "{} exists and Tandem did not create it (no {marker} file in it); Tandem only clears or writes into a directory it made: pass --dir with a new or empty directory, or remove {} yourself",
        dir.display(), dir.display()
    )]
    ForeignDirectory {
        /// The directory.
        dir: PathBuf,
        /// The marker file Tandem writes into directories it creates.
        marker: &'static str,
    },
    /// A file-system step on a Tandem directory failed.
    #[error("{step} {}", path.display())]
    Io {
        /// What was being done ("creating", "clearing", …).
        step: &'static str,
        /// The path.
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}
