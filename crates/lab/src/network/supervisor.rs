//! The supervisor of a container running Tandem's image: it requests the pod's token, runs
//! the sandboxed process, restarts it with kubelet's back-off, stops it gracefully, and
//! records its exits for the kubelet's restartCount.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use parking_lot::Mutex;

use super::incluster;
use super::programs::Log;
use super::usage::ContainerUsage;

/// How often a pod's real processes exited, and the last exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessExit {
    /// Exits so far (each followed by a restart, but a final one).
    pub count: i32,
    /// Whether the last exit is for good: the pod's restartPolicy does not restart it
    /// (`Never`; `OnFailure` and exit code 0), as kubelet decides.
    pub last: bool,
    /// The last exit code (128 + the signal for a killed process, as runtimes report it).
    pub code: i32,
    /// When it exited.
    pub at: k8s_openapi::jiff::Timestamp,
}

/// The exits of real processes, by pod uid.
pub(super) type Exits = Arc<Mutex<HashMap<String, ProcessExit>>>;

/// How long a real process gets between SIGTERM and SIGKILL when its pod stops (a pod's
/// `terminationGracePeriodSeconds` is not waited for in full: the lab's kubelet finishes
/// deletions at once).
pub(super) const TERMINATION_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Why a container of Tandem's image does not run. What its status and log report is
/// [`TandemStartError::message`].
#[derive(Debug, thiserror::Error)]
pub enum TandemStartError {
    /// The API server is not reachable for pods yet.
    #[error("the cluster's services have not started")]
    ServicesNotStarted,
    /// The pod's namespace could not be read (to tell whether it is a twin namespace).
    #[error("reading namespace {namespace}")]
    Namespace {
        /// The pod's namespace.
        namespace: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// The pod spec asks for something the allow-list refuses.
    #[error(transparent)]
    Refused(#[from] incluster::LaunchRefused),
    /// The lab has no tandem binary to run.
    #[error(
        "this lab was started without a tandem binary to run Tandem's image \
         (LabConfig::tandem_binary)"
    )]
    NoBinary,
    /// The `kubernetes` Service could not be read.
    #[error("reading Service default/kubernetes")]
    KubernetesService(#[source] kube::Error),
    /// The `kubernetes` Service has no ClusterIP.
    #[error("Service default/kubernetes has no ClusterIP")]
    NoClusterIp,
}

impl TandemStartError {
    /// What the container's status and log say: the step, then the client error as it words
    /// itself (each once).
    pub fn message(&self) -> String {
        match self {
            TandemStartError::Namespace { source, .. }
            | TandemStartError::KubernetesService(source) => format!("{self}: {source}"),
            _ => self.to_string(),
        }
    }
}

/// The `kubernetes` Service's ClusterIP: where pods reach the API server.
pub(super) async fn kubernetes_service_ip(
    client: &kube::Client,
) -> Result<String, TandemStartError> {
    kube::Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), "default")
        .get("kubernetes")
        .await
        .map_err(TandemStartError::KubernetesService)?
        .spec
        .and_then(|s| s.cluster_ip)
        .ok_or(TandemStartError::NoClusterIp)
}

/// Runs a container of Tandem's image until told to stop: requests its bound token, starts
/// the sandboxed process with its output in the container's log, renews the token at 80% of
/// its life, and restarts the process with kubelet's back-off (10 s doubling to 5 min) when
/// it exits. On stop: SIGTERM, then SIGKILL after [`TERMINATION_GRACE`].
pub(super) async fn supervise(
    client: kube::Client,
    ca: String,
    pod: Pod,
    mut sandbox: incluster::Sandbox,
    (log, exits, usage): (Log, Exits, ContainerUsage),
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    use tokio::io::AsyncBufReadExt;
    let mut backoff = std::time::Duration::from_secs(10);
    let name = pod.metadata.name.clone().unwrap_or_default();
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let automount = incluster::automounts_token(&pod);
    loop {
        let mut renew = None;
        sandbox.credentials.clear();
        if automount {
            match incluster::request_token(&client, &pod).await {
                Ok((token, after)) => {
                    sandbox.credentials = vec![
                        ("token".into(), token),
                        ("ca.crt".into(), ca.clone()),
                        ("namespace".into(), ns.clone()),
                    ];
                    renew = Some(tokio::time::Instant::now() + after);
                }
                Err(e) => log.line(format!(
                    "MountVolume.SetUp failed for volume \"kube-api-access\": requesting a \
                     token for pod {ns}/{name}: {e}"
                )),
            }
        }
        let spawned = if !automount || renew.is_some() {
            incluster::sandbox(&sandbox).and_then(|mut c| c.spawn())
        } else {
            Err(std::io::Error::other("no ServiceAccount token"))
        };
        let started = tokio::time::Instant::now();
        match spawned {
            Err(e) => log.line(format!("starting tandem: {e}")),
            Ok(mut child) => {
                let pid = child.id().unwrap_or_default();
                usage.started(pid);
                let mut pumps = Vec::new();
                let out = child
                    .stdout
                    .take()
                    .map(|o| Box::new(o) as Box<dyn tokio::io::AsyncRead + Send + Unpin>);
                let err = child
                    .stderr
                    .take()
                    .map(|o| Box::new(o) as Box<dyn tokio::io::AsyncRead + Send + Unpin>);
                for stream in [out, err].into_iter().flatten() {
                    let log = log.clone();
                    pumps.push(tokio::spawn(async move {
                        let mut lines = tokio::io::BufReader::new(stream).lines();
                        while let Ok(Some(line)) = lines.next_line().await {
                            log.line(line);
                        }
                    }));
                }
                let status = loop {
                    let renewal = async {
                        match renew {
                            Some(at) => tokio::time::sleep_until(at).await,
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        status = child.wait() => break status,
                        _ = stop.changed() => {
                            let _ = nix::sys::signal::kill(
                                nix::unistd::Pid::from_raw(pid as i32),
                                nix::sys::signal::Signal::SIGTERM,
                            );
                            if tokio::time::timeout(TERMINATION_GRACE, child.wait()).await.is_err() {
                                let _ = child.kill().await;
                            }
                            for p in pumps {
                                let _ = p.await;
                            }
                            return;
                        }
                        () = renewal => match incluster::request_token(&client, &pod).await {
                            Ok((token, after)) => {
                                if let Err(e) = incluster::write_token(pid, &token) {
                                    tracing::warn!(pod = %name, "renewing the token: {e}");
                                }
                                renew = Some(tokio::time::Instant::now() + after);
                            }
                            Err(e) => {
                                tracing::warn!(pod = %name, "renewing the token: {e}");
                                renew = Some(tokio::time::Instant::now() + std::time::Duration::from_secs(10));
                            }
                        },
                    }
                };
                usage.exited();
                for p in pumps {
                    let _ = p.await;
                }
                let code = match status {
                    Ok(status) => {
                        log.line(format!("tandem exited: {status}"));
                        use std::os::unix::process::ExitStatusExt as _;
                        status
                            .code()
                            .or(status.signal().map(|s| 128 + s))
                            .unwrap_or(128)
                    }
                    Err(e) => {
                        log.line(format!("waiting for tandem: {e}"));
                        128
                    }
                };
                let last = !crate::restart::restarts(crate::restart::restart_policy(&pod), code);
                let mut exits = exits.lock();
                let count = exits.get(&uid).map_or(0, |e| e.count) + 1;
                exits.insert(
                    uid.clone(),
                    ProcessExit {
                        count,
                        code,
                        last,
                        at: k8s_openapi::jiff::Timestamp::now(),
                    },
                );
                if last {
                    // Not restarted: the container stays terminated, the pod Succeeded or
                    // Failed.
                    return;
                }
            }
        }
        if started.elapsed() > std::time::Duration::from_secs(600) {
            backoff = std::time::Duration::from_secs(10);
        }
        tokio::select! {
            _ = stop.changed() => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(std::time::Duration::from_secs(300));
    }
}
