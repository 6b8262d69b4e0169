//! One cluster's network mode: its namespaces and its pods' programs — what the kubelet
//! starts, stops, execs into and reads the logs of. Its services are started by
//! `ClusterNetwork::start_services`, in the module above.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use parking_lot::Mutex;

use super::dns;
use super::error::NetworkError;
use super::incluster;
use super::programs::{self, Log, PodIdentity, ProbeError, Start};
use super::supervisor::{
    Exits, ProcessExit, TERMINATION_GRACE, TandemStartError, kubernetes_service_ip, supervise,
};
use super::topology::{self, ClusterNet, Instance, NodeSpec};
use super::usage::{ContainerUsage, PodUsage};

/// A running pod's programs: a log per container, the tasks serving them, and the supervisors
/// of its real processes (Tandem's image), which stop them gracefully when told.
pub(super) struct PodProcesses {
    pub(super) identity: PodIdentity,
    logs: HashMap<String, Log>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    processes: Vec<(
        tokio::sync::watch::Sender<bool>,
        tokio::task::JoinHandle<()>,
    )>,
    /// Its node and what its containers run, for the kubelet's resource metrics.
    pub(super) usage: PodUsage,
}

/// A finished pod's identity and its containers' logs.
type FinishedLogs = (PodIdentity, HashMap<String, Log>);

impl PodProcesses {
    /// Stops the real processes: SIGTERM, then SIGKILL after `grace`; waits for them.
    async fn stop_processes(&mut self, grace: std::time::Duration) {
        for (stop, _) in &self.processes {
            let _ = stop.send(true);
        }
        for (_, task) in self.processes.drain(..) {
            let abort = task.abort_handle();
            if tokio::time::timeout(grace + std::time::Duration::from_secs(1), task)
                .await
                .is_err()
            {
                // Dropping the supervisor kills its process (kill_on_drop).
                abort.abort();
                tracing::warn!(pod = %self.identity.pod, "a process outlived its grace period");
            }
        }
    }
}

impl Drop for PodProcesses {
    fn drop(&mut self) {
        // Supervisors dropped with their process kill it (kill_on_drop).
        for (_, task) in &self.processes {
            task.abort();
        }
        for t in &self.tasks {
            t.abort();
        }
        for log in self.logs.values() {
            log.close();
        }
    }
}

/// How a container of a network-mode pod started, for the kubelet to report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ContainerStart {
    /// Running (a built-in program, or hollow).
    Running,
    /// Failed to start: nothing runs (exit code 128, reason StartError).
    Failed(String),
}

/// One cluster's network mode: its namespaces, its pods' programs, its kube-proxy and DNS.
pub struct ClusterNetwork {
    /// The cluster's name (what echo answers as `cluster`).
    pub cluster: String,
    pub(super) net: Arc<ClusterNet>,
    pub(super) pods: Mutex<HashMap<String, PodProcesses>>,
    pub(super) tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// The `tandem` binary run for Tandem's image; None: that image fails to start.
    tandem_binary: Option<std::path::PathBuf>,
    /// The distribution the cluster behaves as.
    pub profile: crate::profile::LabProfile,
    /// The API server as pods see it (client for token requests and namespace checks, CA),
    /// once the services have started.
    pub(super) api: std::sync::OnceLock<(kube::Client, String)>,
    /// Exits of real processes, by pod uid, for the kubelet's restartCount.
    exits: Exits,
    /// The logs of pods that finished (Succeeded or Failed), by uid, until they are deleted:
    /// kubelet serves a terminated container's log as long as its pod exists.
    finished: Mutex<HashMap<String, FinishedLogs>>,
}

impl ClusterNetwork {
    /// Builds cluster `index`'s namespaces for `nodes` in this process's lab instance.
    pub async fn create(
        cluster: &str,
        index: usize,
        nodes: Vec<NodeSpec>,
        tandem_binary: Option<std::path::PathBuf>,
        profile: crate::profile::LabProfile,
    ) -> Result<Arc<ClusterNetwork>, NetworkError> {
        let shared = profile == crate::profile::LabProfile::Kind;
        let net = tokio::task::spawn_blocking(move || {
            ClusterNet::create(Instance::get()?, index, nodes, shared)
        })
        .await
        .map_err(|source| NetworkError::Task {
            step: "building the cluster's namespaces".into(),
            source,
        })??;
        Ok(Arc::new(ClusterNetwork {
            cluster: cluster.to_string(),
            net: Arc::new(net),
            pods: Mutex::new(HashMap::new()),
            tasks: Mutex::new(Vec::new()),
            tandem_binary,
            profile,
            api: std::sync::OnceLock::new(),
            exits: Exits::default(),
            finished: Mutex::new(HashMap::new()),
        }))
    }

    /// The underlying namespaces.
    pub fn net(&self) -> &ClusterNet {
        &self.net
    }

    /// The control-plane address on the node network.
    pub fn edge_ip(&self) -> Ipv4Addr {
        topology::edge_ip(self.net.index)
    }

    /// The cluster's public address on the lab WAN.
    pub fn wan_ip(&self) -> Ipv4Addr {
        topology::wan_ip(self.net.index)
    }

    /// Gives a pod its namespace with `ip` on `node` and starts its containers' programs;
    /// returns how each container started.
    pub async fn start_pod(
        &self,
        node: &str,
        pod: &Pod,
        ip: Ipv4Addr,
    ) -> Result<Vec<(String, ContainerStart)>, NetworkError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        self.stop_pod(&uid).await;
        let host_network = pod
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false);
        let netns = if host_network {
            // Its node's namespace, which outlives it: nothing is attached, nothing removed.
            self.net
                .node_ns_of(node)
                .ok_or_else(|| NetworkError::NotALabNode {
                    pod: format!("{ns}/{name}"),
                    node: node.to_string(),
                })?
        } else {
            let (net, node) = (self.net.clone(), node.to_string());
            let (pod_ns, pod_name, pod_uid) = (ns.clone(), name.clone(), uid.clone());
            // The topology calls wait for `ip`: they run on the blocking pool.
            tokio::task::spawn_blocking(move || {
                net.attach_pod(&node, &pod_ns, &pod_name, &pod_uid, ip)
            })
            .await
            .map_err(|source| NetworkError::Task {
                step: format!("pod {ns}/{name}: creating its network"),
                source,
            })?
            .map_err(|source| NetworkError::PodNetwork {
                pod: format!("{ns}/{name}"),
                source: Box::new(source),
            })?
        };
        let identity = programs::identity(
            pod,
            &self.cluster,
            &netns,
            dns::resolv_conf(pod, dns::DNS_SERVICE_IP),
        );
        let mut processes = PodProcesses {
            identity: identity.clone(),
            logs: HashMap::new(),
            tasks: Vec::new(),
            processes: Vec::new(),
            usage: PodUsage::new(node),
        };
        let mut started = Vec::new();
        for container in pod.spec.iter().flat_map(|s| s.containers.iter()) {
            let log = Log::default();
            let image = container.image.clone().unwrap_or_default();
            if incluster::is_tandem_image(&image) {
                let usage = ContainerUsage::process();
                let outcome = match self
                    .start_tandem(pod, container, &identity, (log.clone(), usage.clone()))
                    .await
                {
                    Ok(process) => {
                        processes.processes.push(process);
                        processes.usage.add(&container.name, usage);
                        ContainerStart::Running
                    }
                    Err(e) => {
                        let message = e.message();
                        log.line(message.clone());
                        ContainerStart::Failed(message)
                    }
                };
                processes.logs.insert(container.name.clone(), log);
                started.push((container.name.clone(), outcome));
                continue;
            }
            let outcome = match programs::start_of(container) {
                Start::Hollow => {
                    log.line(format!(
                        "this container is hollow: the lab runs no process for image {image}"
                    ));
                    ContainerStart::Running
                }
                Start::Refused(message) => {
                    log.line(message.clone());
                    ContainerStart::Failed(message)
                }
                Start::Runs(programs::Program::Echo) => {
                    match programs::start_echo(&identity, container, log.clone()).await {
                        Ok(tasks) => {
                            processes.tasks.extend(tasks);
                            let usage = ContainerUsage::builtin();
                            processes.usage.add(&container.name, usage);
                            ContainerStart::Running
                        }
                        Err(e) => {
                            let message = format!("echo: listening: {e}");
                            log.line(message.clone());
                            ContainerStart::Failed(message)
                        }
                    }
                }
                Start::Runs(programs::Program::Probe) => {
                    processes.tasks.push(tokio::spawn(programs::run_probe(
                        identity.clone(),
                        container.args.clone().unwrap_or_default(),
                        log.clone(),
                    )));
                    let usage = ContainerUsage::builtin();
                    processes.usage.add(&container.name, usage);
                    ContainerStart::Running
                }
            };
            processes.logs.insert(container.name.clone(), log);
            started.push((container.name.clone(), outcome));
        }
        self.pods.lock().insert(uid, processes);
        Ok(started)
    }

    /// Starts a container of Tandem's image: checks it against the allow-list, then runs the
    /// tandem binary sandboxed under a supervisor that renews its token and restarts it when
    /// it exits. The error says why nothing runs.
    async fn start_tandem(
        &self,
        pod: &Pod,
        container: &k8s_openapi::api::core::v1::Container,
        who: &PodIdentity,
        (log, usage): (Log, ContainerUsage),
    ) -> Result<
        (
            tokio::sync::watch::Sender<bool>,
            tokio::task::JoinHandle<()>,
        ),
        TandemStartError,
    > {
        let (client, ca) = self
            .api
            .get()
            .cloned()
            .ok_or(TandemStartError::ServicesNotStarted)?;
        let twin = kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
            .get(&who.namespace)
            .await
            .map_err(|source| TandemStartError::Namespace {
                namespace: who.namespace.clone(),
                source,
            })?
            .metadata
            .labels
            .is_some_and(|l| l.contains_key(tandem_api::names::TWIN_NAMESPACE_LABEL));
        let launch = incluster::plan(pod, container, twin)?;
        let binary = self
            .tandem_binary
            .clone()
            .ok_or(TandemStartError::NoBinary)?;
        let sandbox = incluster::Sandbox {
            binary,
            launch,
            netns: who.netns.clone(),
            hostname: who.pod.clone(),
            credentials: Vec::new(),
            resolv_conf: who.resolv_conf.clone(),
            api_server: (kubernetes_service_ip(&client).await?, 443),
        };
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(supervise(
            client,
            ca,
            pod.clone(),
            sandbox,
            (log, self.exits.clone(), usage),
            stopped,
        ));
        Ok((stop, task))
    }

    /// Stops a pod's programs and removes its namespace, keeping its containers' logs until
    /// [`ClusterNetwork::stop_pod`]: for a pod that finished (Succeeded or Failed).
    pub async fn finish_pod(&self, uid: &str) {
        let logs = self
            .pods
            .lock()
            .get(uid)
            .map(|p| (p.identity.clone(), p.logs.clone()));
        if let Some(logs) = logs {
            self.finished.lock().insert(uid.to_string(), logs);
        }
        self.stop_pod_keeping_logs(uid).await;
    }

    /// Stops a pod's programs and removes its namespace and logs.
    pub async fn stop_pod(&self, uid: &str) {
        self.finished.lock().remove(uid);
        self.stop_pod_keeping_logs(uid).await;
    }

    async fn stop_pod_keeping_logs(&self, uid: &str) {
        let removed = self.pods.lock().remove(uid);
        self.exits.lock().remove(uid);
        if let Some(mut pod) = removed {
            pod.stop_processes(TERMINATION_GRACE).await;
            drop(pod);
            let (net, uid) = (self.net.clone(), uid.to_string());
            let _ = tokio::task::spawn_blocking(move || net.detach_pod(&uid)).await;
        }
    }

    /// How often the real processes of pod `uid` exited (and were restarted), if ever.
    pub fn process_exits(&self, uid: &str) -> Option<ProcessExit> {
        self.exits.lock().get(uid).copied()
    }

    /// The log of `container` of pod `namespace/name` (while the pod runs here).
    pub fn log_of(&self, namespace: &str, name: &str, container: &str) -> Option<Log> {
        let pods = self.pods.lock();
        let running = pods
            .values()
            .find(|p| p.identity.namespace == namespace && p.identity.pod == name)
            .map(|p| &p.logs);
        let finished = self.finished.lock();
        let done = || {
            finished
                .values()
                .find(|(who, _)| who.namespace == namespace && who.pod == name)
                .map(|(_, logs)| logs)
        };
        running.or_else(done)?.get(container).cloned()
    }

    /// Runs `command` in pod `namespace/name` as `kubectl exec` asks: only built-in commands,
    /// inside the pod's network namespace — `hostname`, `cat /etc/resolv.conf`, `probe fetch
    /// URL` (`--count N`: N requests), `probe resolve NAME`. Anything else fails as a missing executable does (127).
    /// Returns (stdout, stderr, exit code).
    pub async fn exec(
        &self,
        namespace: &str,
        name: &str,
        _container: &str,
        command: &[String],
    ) -> (String, String, i32) {
        let who = match self.identity(namespace, name) {
            Ok(who) => who,
            Err(e) => return (String::new(), format!("{}\n", e.message()), 126),
        };
        let words: Vec<&str> = command.iter().map(String::as_str).collect();
        let program = words.first().map(|w| w.rsplit('/').next().unwrap_or(w));
        let outcome = match (program, &words[1..]) {
            (Some("hostname"), []) => Ok(format!("{}\n", who.pod)),
            (Some("cat"), ["/etc/resolv.conf"]) => Ok(who.resolv_conf.clone()),
            (Some("probe"), ["fetch", url]) => programs::probe_fetch(&who, url).await,
            (Some("probe"), ["fetch", "--count", n, url]) => {
                programs::probe_fetch_many(&who, n, url).await
            }
            (Some("probe"), ["resolve", host]) => programs::probe_resolve(&who, host).await,
            (Some("probe"), _) => {
                return (
                    String::new(),
                    "usage: probe fetch [--count N] URL | probe resolve NAME\n".into(),
                    2,
                );
            }
            _ => {
                let first = words.first().copied().unwrap_or_default();
                return (
                    String::new(),
                    format!(
                        "OCI runtime exec failed: exec failed: unable to start container \
                         process: exec: \"{first}\": executable file not found in $PATH: unknown\n"
                    ),
                    127,
                );
            }
        };
        match outcome {
            Ok(out) => (out, String::new(), 0),
            Err(e) => (String::new(), format!("{}\n", e.message()), 1),
        }
    }

    /// The log of `container` of pod `namespace/name`, as it is now.
    pub fn log(&self, namespace: &str, name: &str, container: &str) -> Option<String> {
        let pods = self.pods.lock();
        pods.values()
            .find(|p| p.identity.namespace == namespace && p.identity.pod == name)
            .and_then(|p| p.logs.get(container))
            .map(Log::text)
    }

    /// Runs the probe's `fetch URL` from inside pod `namespace/name`.
    pub async fn probe_fetch(
        &self,
        namespace: &str,
        name: &str,
        url: &str,
    ) -> Result<String, ProbeError> {
        let who = self.identity(namespace, name)?;
        programs::probe_fetch(&who, url).await
    }

    /// Runs the probe's `resolve NAME` from inside pod `namespace/name`.
    pub async fn probe_resolve(
        &self,
        namespace: &str,
        name: &str,
        host: &str,
    ) -> Result<String, ProbeError> {
        let who = self.identity(namespace, name)?;
        programs::probe_resolve(&who, host).await
    }

    /// The uid and identity of pod `namespace/name`, while its programs run here.
    pub(super) fn running(&self, namespace: &str, name: &str) -> Option<(String, PodIdentity)> {
        self.pods
            .lock()
            .iter()
            .find(|(_, p)| p.identity.namespace == namespace && p.identity.pod == name)
            .map(|(uid, p)| (uid.clone(), p.identity.clone()))
    }

    fn identity(&self, namespace: &str, name: &str) -> Result<PodIdentity, ProbeError> {
        self.pods
            .lock()
            .values()
            .find(|p| p.identity.namespace == namespace && p.identity.pod == name)
            .map(|p| p.identity.clone())
            .ok_or_else(|| ProbeError::NotRunning {
                namespace: namespace.to_string(),
                pod: name.to_string(),
            })
    }
}

impl ClusterNetwork {
    /// Stops the cluster's programs and services and deletes its namespaces now (not when
    /// the last task holding it is dropped). Idempotent.
    pub fn shutdown(&self) {
        for t in self.tasks.lock().drain(..) {
            t.abort();
        }
        self.pods.lock().clear();
        self.net.remove();
    }
}

impl Drop for ClusterNetwork {
    fn drop(&mut self) {
        self.shutdown();
    }
}
