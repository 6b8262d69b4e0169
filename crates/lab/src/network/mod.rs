//! Network mode: lab pods with real network namespaces, built-in programs, Services that
//! route (nftables), cluster DNS and kubelet endpoints for `kubectl logs` and `exec`.
//!
//! Hollow mode (the default) uses none of this. Network mode needs root; everything it
//! creates lives in network namespaces named `lab-<instance>-…`, never in the host's own.

pub mod dns;
pub mod kubelet_server;
pub mod netns;
pub mod programs;
pub mod proxy;
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

/// A running pod's programs: a log per container, and the tasks serving them.
struct PodProcesses {
    identity: PodIdentity,
    logs: HashMap<String, Log>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for PodProcesses {
    fn drop(&mut self) {
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
}

impl ClusterNetwork {
    /// Builds cluster `index`'s namespaces for `nodes` in this process's lab instance.
    pub async fn create(
        cluster: &str,
        index: usize,
        nodes: Vec<NodeSpec>,
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
    /// `kube-dns` Service, and kube-proxy in every node namespace and the edge.
    pub async fn start_services(
        self: &Arc<Self>,
        server: &tandem_apiserver::ApiServer,
        client: kube::Client,
    ) -> anyhow::Result<()> {
        let edge = self.net.edge();
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
            })
            .collect();
        targets.push(proxy::ProxyTarget {
            netns: edge,
            node_ip: None,
        });
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
        let netns = {
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
        };
        let mut started = Vec::new();
        for container in pod.spec.iter().flat_map(|s| s.containers.iter()) {
            let log = Log::default();
            let image = container.image.clone().unwrap_or_default();
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
                    ContainerStart::Running
                }
            };
            processes.logs.insert(container.name.clone(), log);
            started.push((container.name.clone(), outcome));
        }
        self.pods.lock().insert(uid, processes);
        Ok(started)
    }

    /// Stops a pod's programs and removes its namespace.
    pub async fn stop_pod(&self, uid: &str) {
        let removed = self.pods.lock().remove(uid);
        if removed.is_some() {
            let (net, uid) = (self.net.clone(), uid.to_string());
            let _ = tokio::task::spawn_blocking(move || net.detach_pod(&uid)).await;
        }
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
    /// URL`, `probe resolve NAME`. Anything else fails as a missing executable does (127).
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
            (Some("probe"), ["resolve", host]) => programs::probe_resolve(&who, host).await,
            (Some("probe"), _) => {
                return (
                    String::new(),
                    "usage: probe fetch URL | probe resolve NAME\n".into(),
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
