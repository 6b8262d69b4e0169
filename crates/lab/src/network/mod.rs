//! Network mode: lab pods with real network namespaces, built-in programs, Services that
//! route (nftables), cluster DNS and kubelet endpoints for `kubectl logs` and `exec`.
//!
//! Hollow mode (the default) uses none of this. Network mode needs root; everything it
//! creates lives in network namespaces named `lab-<instance>-…`, never in the host's own.

pub mod dns;
pub mod incluster;
pub mod kubelet_metrics;
pub mod kubelet_server;
pub mod netns;
pub mod port_forward;
pub mod programs;
pub mod proxy;
pub mod servicelb;
pub mod spdy;
pub mod topology;

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use parking_lot::Mutex;
use serde_json::json;

use programs::{Log, PodIdentity, Start};
use topology::{ClusterNet, Instance, NodeSpec};

/// Services and EndpointSlices as kube-proxy and cluster DNS see them: two caches kept by
/// watches, and a counter that moves on every change.
#[derive(Clone)]
pub struct ServiceView {
    /// Every Service.
    pub services: kube::runtime::reflector::Store<k8s_openapi::api::core::v1::Service>,
    /// Every EndpointSlice.
    pub slices: kube::runtime::reflector::Store<k8s_openapi::api::discovery::v1::EndpointSlice>,
    /// Bumped on each change.
    pub changes: tokio::sync::watch::Receiver<u64>,
}

impl ServiceView {
    /// Starts the watches (stopped with the returned task) and waits for the first lists.
    pub async fn start(
        client: kube::Client,
    ) -> anyhow::Result<(ServiceView, tokio::task::JoinHandle<()>)> {
        use futures::StreamExt;
        use k8s_openapi::api::core::v1::Service;
        use k8s_openapi::api::discovery::v1::EndpointSlice;
        use kube::runtime::{WatchStreamExt, reflector, watcher};
        let (services, svc_writer) = reflector::store::<Service>();
        let (slices, slice_writer) = reflector::store::<EndpointSlice>();
        let svc = reflector::reflector(
            svc_writer,
            watcher(
                kube::Api::<Service>::all(client.clone()),
                Default::default(),
            ),
        )
        .default_backoff()
        .map(|_| ())
        .boxed();
        let eps = reflector::reflector(
            slice_writer,
            watcher(kube::Api::<EndpointSlice>::all(client), Default::default()),
        )
        .default_backoff()
        .map(|_| ())
        .boxed();
        let (tx, changes) = tokio::sync::watch::channel(0u64);
        let task = tokio::spawn(async move {
            let mut both = futures::stream::select(svc, eps);
            while both.next().await.is_some() {
                tx.send_modify(|n| *n += 1);
            }
        });
        services.wait_until_ready().await?;
        slices.wait_until_ready().await?;
        Ok((
            ServiceView {
                services,
                slices,
                changes,
            },
            task,
        ))
    }
}

/// A running pod's programs: a log per container, the tasks serving them, and the supervisors
/// of its real processes (Tandem's image), which stop them gracefully when told.
struct PodProcesses {
    identity: PodIdentity,
    logs: HashMap<String, Log>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    processes: Vec<(
        tokio::sync::watch::Sender<bool>,
        tokio::task::JoinHandle<()>,
    )>,
    /// Its node and what its containers run, for the kubelet's resource metrics.
    usage: kubelet_metrics::PodUsage,
}

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
    net: Arc<ClusterNet>,
    pods: Mutex<HashMap<String, PodProcesses>>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// The `tandem` binary run for Tandem's image; None: that image fails to start.
    tandem_binary: Option<std::path::PathBuf>,
    /// The API server as pods see it (client for token requests and namespace checks, CA),
    /// once the services have started.
    api: std::sync::OnceLock<(kube::Client, String)>,
    /// Exits of real processes, by pod uid, for the kubelet's restartCount.
    exits: Exits,
}

/// How often a pod's real processes exited, and the last exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessExit {
    /// Exits so far (each followed by a restart).
    pub count: i32,
    /// The last exit code (128 + the signal for a killed process, as runtimes report it).
    pub code: i32,
    /// When it exited.
    pub at: k8s_openapi::jiff::Timestamp,
}

type Exits = Arc<Mutex<HashMap<String, ProcessExit>>>;

impl ClusterNetwork {
    /// Builds cluster `index`'s namespaces for `nodes` in this process's lab instance.
    pub async fn create(
        cluster: &str,
        index: usize,
        nodes: Vec<NodeSpec>,
        tandem_binary: Option<std::path::PathBuf>,
    ) -> anyhow::Result<Arc<ClusterNetwork>> {
        let net = tokio::task::spawn_blocking(move || -> anyhow::Result<ClusterNet> {
            let instance = Instance::get()?;
            Ok(ClusterNet::create(instance, index, nodes)?)
        })
        .await??;
        Ok(Arc::new(ClusterNetwork {
            cluster: cluster.to_string(),
            net: Arc::new(net),
            pods: Mutex::new(HashMap::new()),
            tasks: Mutex::new(Vec::new()),
            tandem_binary,
            api: std::sync::OnceLock::new(),
            exits: Exits::default(),
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

    /// Starts the cluster's services: the API server also listening on the edge and WAN
    /// addresses (port 6443), its `kubernetes` Service endpoints, cluster DNS behind the
    /// `kube-dns` Service, kube-proxy in every node namespace and the edge, and the load
    /// balancer giving LoadBalancer Services the cluster's WAN address ([`servicelb`]).
    pub async fn start_services(
        self: &Arc<Self>,
        server: &tandem_apiserver::ApiServer,
        client: kube::Client,
    ) -> anyhow::Result<()> {
        let edge = self.net.edge();
        let _ = self.api.set((client.clone(), server.ca_pem().to_string()));
        let mut tasks = Vec::new();
        for ip in [self.edge_ip(), self.wan_ip()] {
            let listener = netns::tcp_listener(&edge, SocketAddr::from((ip, 6443)))
                .await
                .map_err(|e| anyhow::anyhow!("API server listener on {ip}:6443 in {edge}: {e}"))?;
            tasks.push(server.serve_also(listener));
        }
        endpoints(
            &client,
            "default",
            "kubernetes",
            &[("https", 6443, "TCP")],
            self.edge_ip(),
        )
        .await?;

        let dns_addr = dns::listen_addr(self.edge_ip());
        let udp = netns::udp_socket(&edge, dns_addr)
            .await
            .map_err(|e| anyhow::anyhow!("DNS socket {dns_addr} in {edge}: {e}"))?;
        let tcp = netns::tcp_listener(&edge, dns_addr)
            .await
            .map_err(|e| anyhow::anyhow!("DNS listener {dns_addr} in {edge}: {e}"))?;
        let (view, watch) = ServiceView::start(client.clone()).await?;
        tasks.push(watch);
        let zone = dns::Zone::new(view.clone(), Some(edge.clone()));
        tasks.push(tokio::spawn(dns::follow_config(
            client.clone(),
            zone.clone(),
        )));
        tasks.push(tokio::spawn(dns::serve(zone, udp, tcp)));
        ensure_kube_dns(&client, self.edge_ip()).await?;

        let mut targets: Vec<proxy::ProxyTarget> = self
            .net
            .node_namespaces()
            .into_iter()
            .map(|(node, netns)| proxy::ProxyTarget {
                netns,
                node_ip: Some(node.ip),
                wan_ip: None,
            })
            .collect();
        targets.push(proxy::ProxyTarget {
            netns: edge,
            node_ip: None,
            wan_ip: Some(self.wan_ip()),
        });
        tasks.push(tokio::spawn(servicelb::run(
            view.clone(),
            client.clone(),
            self.wan_ip(),
        )));
        tasks.push(tokio::spawn(proxy::run(view, targets)));

        // Kubelet endpoints on each node, and the API server reaching them from the edge.
        let client_ca = server.kubelet_client_ca_pem().to_string();
        for (node, netns) in self.net.node_namespaces() {
            let ip = node.ip.to_string();
            let cert = server
                .state()
                .pki
                .ca
                .issue(
                    &format!("system:node:{}", node.name),
                    &["system:nodes"],
                    &[&node.name, &ip],
                    true,
                )
                .map_err(|e| anyhow::anyhow!("node {}: serving certificate: {e}", node.name))?;
            let tls = kubelet_server::tls_config(&cert.cert_pem, &cert.key_pem, &client_ca)?;
            let listener = netns::tcp_listener(&netns, SocketAddr::from((node.ip, 10250)))
                .await
                .map_err(|e| anyhow::anyhow!("node {}: kubelet endpoint: {e}", node.name))?;
            tasks.push(tokio::spawn(kubelet_server::serve(
                listener,
                Arc::new(tls),
                self.clone(),
            )));
        }
        let edge_ns = self.net.edge();
        server.set_kubelet_dialer(Arc::new(move |addr| {
            let edge_ns = edge_ns.clone();
            Box::pin(async move { netns::tcp_connect(&edge_ns, addr).await })
        }));
        self.tasks.lock().extend(tasks);
        Ok(())
    }

    /// Gives a pod its namespace with `ip` on `node` and starts its containers' programs;
    /// returns how each container started.
    pub async fn start_pod(
        &self,
        node: &str,
        pod: &Pod,
        ip: Ipv4Addr,
    ) -> anyhow::Result<Vec<(String, ContainerStart)>> {
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
                .ok_or_else(|| anyhow::anyhow!("pod {ns}/{name}: {node} is not a lab node"))?
        } else {
            let (net, node) = (self.net.clone(), node.to_string());
            let (pod_ns, pod_name, pod_uid) = (ns.clone(), name.clone(), uid.clone());
            // The topology calls wait for `ip`: they run on the blocking pool.
            tokio::task::spawn_blocking(move || {
                net.attach_pod(&node, &pod_ns, &pod_name, &pod_uid, ip)
            })
            .await?
            .map_err(|e| anyhow::anyhow!("pod {ns}/{name}: creating its network: {e}"))?
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
            usage: kubelet_metrics::PodUsage::new(node),
        };
        let mut started = Vec::new();
        for container in pod.spec.iter().flat_map(|s| s.containers.iter()) {
            let log = Log::default();
            let image = container.image.clone().unwrap_or_default();
            if incluster::is_tandem_image(&image) {
                let usage = kubelet_metrics::ContainerUsage::process();
                let outcome = match self
                    .start_tandem(pod, container, &identity, (log.clone(), usage.clone()))
                    .await
                {
                    Ok(process) => {
                        processes.processes.push(process);
                        processes.usage.add(&container.name, usage);
                        ContainerStart::Running
                    }
                    Err(message) => {
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
                            let usage = kubelet_metrics::ContainerUsage::builtin();
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
                    let usage = kubelet_metrics::ContainerUsage::builtin();
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
        (log, usage): (Log, kubelet_metrics::ContainerUsage),
    ) -> Result<
        (
            tokio::sync::watch::Sender<bool>,
            tokio::task::JoinHandle<()>,
        ),
        String,
    > {
        let (client, ca) = self
            .api
            .get()
            .cloned()
            .ok_or("the cluster's services have not started")?;
        let twin = kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
            .get(&who.namespace)
            .await
            .map_err(|e| format!("reading namespace {}: {e}", who.namespace))?
            .metadata
            .labels
            .is_some_and(|l| l.contains_key(tandem_api::names::TWIN_NAMESPACE_LABEL));
        let launch = incluster::plan(pod, container, twin)?;
        let binary = self.tandem_binary.clone().ok_or(
            "this lab was started without a tandem binary to run Tandem's image (LabConfig::tandem_binary)",
        )?;
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

    /// Stops a pod's programs and removes its namespace.
    pub async fn stop_pod(&self, uid: &str) {
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
        pods.values()
            .find(|p| p.identity.namespace == namespace && p.identity.pod == name)
            .and_then(|p| p.logs.get(container))
            .cloned()
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
            Err(e) => return (String::new(), format!("{e}\n"), 126),
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
            Err(e) => (String::new(), format!("{e}\n"), 1),
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
    ) -> Result<String, String> {
        let who = self.identity(namespace, name)?;
        programs::probe_fetch(&who, url).await
    }

    /// Runs the probe's `resolve NAME` from inside pod `namespace/name`.
    pub async fn probe_resolve(
        &self,
        namespace: &str,
        name: &str,
        host: &str,
    ) -> Result<String, String> {
        let who = self.identity(namespace, name)?;
        programs::probe_resolve(&who, host).await
    }

    /// The uid and identity of pod `namespace/name`, while its programs run here.
    fn running(&self, namespace: &str, name: &str) -> Option<(String, PodIdentity)> {
        self.pods
            .lock()
            .iter()
            .find(|(_, p)| p.identity.namespace == namespace && p.identity.pod == name)
            .map(|(uid, p)| (uid.clone(), p.identity.clone()))
    }

    fn identity(&self, namespace: &str, name: &str) -> Result<PodIdentity, String> {
        self.pods
            .lock()
            .values()
            .find(|p| p.identity.namespace == namespace && p.identity.pod == name)
            .map(|p| p.identity.clone())
            .ok_or_else(|| format!("pod {namespace}/{name} has no running programs here"))
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

/// How long a real process gets between SIGTERM and SIGKILL when its pod stops (a pod's
/// `terminationGracePeriodSeconds` is not waited for in full: the lab's kubelet finishes
/// deletions at once).
const TERMINATION_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// The `kubernetes` Service's ClusterIP: where pods reach the API server.
async fn kubernetes_service_ip(client: &kube::Client) -> Result<String, String> {
    kube::Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), "default")
        .get("kubernetes")
        .await
        .map_err(|e| format!("reading Service default/kubernetes: {e}"))?
        .spec
        .and_then(|s| s.cluster_ip)
        .ok_or_else(|| "Service default/kubernetes has no ClusterIP".to_string())
}

/// Runs a container of Tandem's image until told to stop: requests its bound token, starts
/// the sandboxed process with its output in the container's log, renews the token at 80% of
/// its life, and restarts the process with kubelet's back-off (10 s doubling to 5 min) when
/// it exits. On stop: SIGTERM, then SIGKILL after [`TERMINATION_GRACE`].
async fn supervise(
    client: kube::Client,
    ca: String,
    pod: Pod,
    mut sandbox: incluster::Sandbox,
    (log, exits, usage): (Log, Exits, kubelet_metrics::ContainerUsage),
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
                let mut exits = exits.lock();
                let count = exits.get(&uid).map_or(0, |e| e.count) + 1;
                exits.insert(
                    uid.clone(),
                    ProcessExit {
                        count,
                        code,
                        at: k8s_openapi::jiff::Timestamp::now(),
                    },
                );
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

/// Writes the EndpointSlice of a selector-less Service `ns/name` with one endpoint at `ip`
/// and `ports` (name, port, protocol), as kube-apiserver keeps the `kubernetes` Service's
/// (idempotent).
async fn endpoints(
    client: &kube::Client,
    ns: &str,
    name: &str,
    ports: &[(&str, u16, &str)],
    ip: Ipv4Addr,
) -> anyhow::Result<()> {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::api::{Patch, PatchParams};
    let ports: Vec<serde_json::Value> = ports
        .iter()
        .map(|(n, p, proto)| json!({"name": n, "port": p, "protocol": proto}))
        .collect();
    let slice: EndpointSlice = serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": ns, "labels": {
            "kubernetes.io/service-name": name,
            "endpointslice.kubernetes.io/managed-by": "tandem-lab",
        }},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip.to_string()], "conditions": {"ready": true}}],
        "ports": ports,
    }))?;
    kube::Api::<EndpointSlice>::namespaced(client.clone(), ns)
        .patch(
            name,
            &PatchParams::apply("tandem-lab").force(),
            &Patch::Apply(&slice),
        )
        .await
        .map_err(|e| anyhow::anyhow!("writing EndpointSlice {ns}/{name}: {e}"))?;
    Ok(())
}

/// The `kube-system/kube-dns` Service at [`dns::DNS_SERVICE_IP`], pointing at the DNS server
/// on the edge (idempotent).
async fn ensure_kube_dns(client: &kube::Client, edge_ip: Ipv4Addr) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Service;
    use kube::api::PostParams;
    let service: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "kube-dns", "namespace": "kube-system",
                     "labels": {"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"}},
        "spec": {"clusterIP": dns::DNS_SERVICE_IP, "ports": [
            {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
            {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
        ]},
    }))?;
    let api = kube::Api::<Service>::namespaced(client.clone(), "kube-system");
    match api.create(&PostParams::default(), &service).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => anyhow::bail!("creating Service kube-system/kube-dns: {e}"),
    }
    endpoints(
        client,
        "kube-system",
        "kube-dns",
        &[("dns", 53, "UDP"), ("dns-tcp", 53, "TCP")],
        edge_ip,
    )
    .await?;
    Ok(())
}
