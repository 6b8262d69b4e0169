//! What the kubelet endpoint (`/containerLogs`, `/exec`) asks of the pod runtime, so the
//! endpoint and the built-in programs can be built apart and joined by the node.

use std::pin::Pin;

use futures::Stream;

/// How `kubectl logs` wants a container's log.
#[derive(Clone, Debug, Default)]
pub struct LogOptions {
    /// Keep the stream open and send new lines as they come (`-f`).
    pub follow: bool,
    /// Only the last N lines (`--tail`).
    pub tail_lines: Option<usize>,
    /// The previous (terminated) instance of the container (`--previous`).
    pub previous: bool,
    /// Prefix each line with its RFC 3339 timestamp (`--timestamps`).
    pub timestamps: bool,
    /// Only lines newer than this many seconds (`--since`).
    pub since_seconds: Option<i64>,
    /// Stop after this many bytes (`--limit-bytes`).
    pub limit_bytes: Option<usize>,
}

/// Why the runtime could not serve a request; the endpoint maps these to kubelet's answers.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// No such pod or container on this node (404).
    #[error("{0}")]
    NotFound(String),
    /// The request is understood but cannot be served now (400), e.g. `--previous` with no
    /// previous instance, or exec into a container that is not running.
    #[error("{0}")]
    BadRequest(String),
}

/// Bytes of a log as they become available; ends when the log does (or, when following,
/// when the container stops).
pub type LogStream = Pin<Box<dyn Stream<Item = bytes::Bytes> + Send>>;

/// One exec session's standard streams, as the endpoint relays them. Writing to `stdin` and
/// reading `stdout`/`stderr` happen concurrently; `exit` resolves when the command ends.
pub struct ExecSession {
    /// The command's input, when the caller asked for stdin.
    pub stdin: Option<tokio::sync::mpsc::Sender<bytes::Bytes>>,
    /// The command's output.
    pub stdout: tokio::sync::mpsc::Receiver<bytes::Bytes>,
    /// The command's error output.
    pub stderr: tokio::sync::mpsc::Receiver<bytes::Bytes>,
    /// The exit code (127: no such executable, as a shell or runc reports it).
    pub exit: tokio::sync::oneshot::Receiver<i32>,
}

/// The containers of one node, as the kubelet endpoint sees them.
pub trait ContainerRuntime: Send + Sync + 'static {
    /// The log of `container` of pod `namespace/pod`.
    fn logs(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        options: LogOptions,
    ) -> Result<LogStream, RuntimeError>;

    /// Starts `command` in `container` of pod `namespace/pod`: only built-in commands run
    /// (in the pod's network namespace); anything else ends at once with exit code 127 and
    /// an "executable file not found" message on stderr, as runc reports it.
    fn exec(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        command: Vec<String>,
        stdin: bool,
        tty: bool,
    ) -> Result<ExecSession, RuntimeError>;
}
