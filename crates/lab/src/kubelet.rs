//! Hollow kubelets: register Nodes, heartbeat Leases, run bound pods without containers.
//!
//! A hollow container starts instantly and does nothing; what it does instead is chosen by
//! the pod annotation [`BEHAVIOR_ANNOTATION`] (`lab.tandem.dev/behavior`):
//!
//! - absent: like `run`, except for pods of a Job (an ownerReference of kind `Job`, or the
//!   `batch.kubernetes.io/job-name` label, which a Job pod's copy in a provider keeps),
//!   whose containers run for [`JOB_POD_RUN`] and then exit with code 0, as a short-lived
//!   image would (so `kubectl create job j --image=busybox` completes).
//! - `run`: containers run and are ready; the pod is `Running` and `Ready`.
//! - `exit`: containers exit with code 0 — phase `Succeeded` under `restartPolicy`
//!   `Never`/`OnFailure`, restarted (and backing off) under `Always`.
//! - `fail`: containers exit with code 1 — phase `Failed` under `Never`, restarted (and
//!   backing off) under `OnFailure`/`Always`.
//! - `crashloop`: containers keep exiting with code 1; `restartCount` grows and the container
//!   waits with reason `CrashLoopBackOff`; the pod stays `Running` but never `Ready`.
//! - `never-ready`: containers run but never become ready; the pod is `Running`, not `Ready`.
//!
//! Restarts back off like the kubelet's, scaled down tenfold: 1 s, 2 s, 4 s, 8 s, then 10 s.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::image_pulls::{PULL_ERROR_SHOWN, Pulling, pulling_status};
use crate::images::{NodeImages, PullFailure};
use crate::power::NodePower;
use crate::restart::{restart_policy, restarts};

/// Pod annotation that chooses what a hollow container does (see the module documentation).
pub const BEHAVIOR_ANNOTATION: &str = "lab.tandem.dev/behavior";
/// How long the containers of a Job's pod run before exiting with code 0 (no annotation).
pub const JOB_POD_RUN: Duration = Duration::from_secs(1);
/// How often a hollow kubelet posts its node status (the Ready condition's heartbeat).
pub const NODE_STATUS_INTERVAL: Duration = Duration::from_secs(30);
/// `nodeInfo.kubeletVersion` of hollow nodes.
pub const KUBELET_VERSION: &str = "v1.33.0-tandem";
/// Namespace of node Leases.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// How often a powered-off kubelet checks whether it is back on.
const POWER_POLL: Duration = Duration::from_millis(100);

/// What a hollow node registers as.
#[derive(Clone, Debug)]
pub struct HollowNode {
    /// The lab cluster it belongs to (its name).
    pub cluster: String,
    /// Node name.
    pub name: String,
    /// The node's pod CIDR (pods get addresses from it).
    pub pod_cidr: String,
    /// The node's InternalIP.
    pub internal_ip: String,
    /// Node labels (hostname, os, arch, region, zone).
    pub labels: BTreeMap<String, String>,
    /// Allocatable CPU.
    pub cpu: String,
    /// Allocatable memory.
    pub memory: String,
    /// Maximum pods.
    pub pods: u32,
    /// How often the kubelet renews its Lease (see [`lease_renew_interval`]).
    pub lease_renew_interval: Duration,
}

/// The Lease renewal period for a node-monitor grace period: a quarter of it, at most 10 s
/// (the kubelet renews every 10 s against kube-controller-manager's 40 s), so a lab cluster
/// with a short grace period still sees several renewals per period, and a large one does
/// not spend the API server's time on leases.
pub fn lease_renew_interval(grace: Duration) -> Duration {
    (grace / 4).clamp(Duration::from_millis(100), Duration::from_secs(10))
}

/// Errors of a hollow kubelet.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    /// The node's pod CIDR is not an IPv4 CIDR.
    #[error("node {node}: pod CIDR {cidr:?} is not an IPv4 CIDR (a.b.c.d/len, len 8..=30)")]
    PodCidr {
        /// Node name.
        node: String,
        /// The CIDR as configured.
        cidr: String,
    },
}

/// What a hollow container does, from [`BEHAVIOR_ANNOTATION`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behavior {
    /// Runs and is ready.
    Run,
    /// Exits with code 0.
    Exit,
    /// Exits with code 1.
    Fail,
    /// Exits with code 1 forever, restarting with back-off.
    CrashLoop,
    /// Runs but is never ready.
    NeverReady,
    /// Runs for [`JOB_POD_RUN`], then exits with code 0 (Job pods by default).
    Complete,
}

impl Behavior {
    /// The behaviour a pod asks for (unknown values run normally).
    pub fn of(pod: &Pod) -> Behavior {
        match pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(BEHAVIOR_ANNOTATION))
            .map(String::as_str)
        {
            Some("exit") => Behavior::Exit,
            Some("fail") => Behavior::Fail,
            Some("crashloop") => Behavior::CrashLoop,
            Some("never-ready") => Behavior::NeverReady,
            Some(_) => Behavior::Run,
            None if owned_by_job(pod) => Behavior::Complete,
            None => Behavior::Run,
        }
    }

    /// What the containers do now: a Complete container is a Run one until it has run its
    /// time, then an Exit one.
    fn now(self, rt: &PodRuntime) -> Behavior {
        match self {
            Behavior::Complete if rt.completed => Behavior::Exit,
            Behavior::Complete => Behavior::Run,
            other => other,
        }
    }

    /// Exit code of a container that exits, or None if it keeps running.
    fn exit_code(self) -> Option<i32> {
        match self {
            Behavior::Exit => Some(0),
            Behavior::Fail | Behavior::CrashLoop => Some(1),
            Behavior::Run | Behavior::NeverReady | Behavior::Complete => None,
        }
    }
}

/// Pod addresses of one node: the usable addresses of its pod CIDR, lowest free first.
#[derive(Debug)]
pub struct PodAddresses {
    base: u32,
    size: u32,
    used: BTreeSet<u32>,
}

impl PodAddresses {
    /// Parses an IPv4 CIDR; `.0` (network), `.1` (gateway) and the broadcast address are
    /// never handed out.
    pub fn parse(cidr: &str) -> Option<PodAddresses> {
        let (addr, len) = cidr.split_once('/')?;
        let addr: Ipv4Addr = addr.parse().ok()?;
        let len: u32 = len.parse().ok()?;
        if !(8..=30).contains(&len) {
            return None;
        }
        let size = 1u32 << (32 - len);
        Some(PodAddresses {
            base: u32::from(addr) & !(size - 1),
            size,
            used: BTreeSet::new(),
        })
    }

    /// The lowest free address, now in use.
    pub fn allocate(&mut self) -> Option<Ipv4Addr> {
        let offset = (2..self.size - 1).find(|o| !self.used.contains(o))?;
        self.used.insert(offset);
        Some(Ipv4Addr::from(self.base + offset))
    }

    /// Marks `ip` in use if it belongs to the CIDR; returns whether it does and was free.
    pub fn reserve(&mut self, ip: Ipv4Addr) -> bool {
        let offset = u32::from(ip).wrapping_sub(self.base);
        offset >= 2 && offset < self.size - 1 && self.used.insert(offset)
    }

    /// Frees `ip` (an address outside the CIDR, such as a hostNetwork pod's node address, is
    /// ignored).
    pub fn release(&mut self, ip: Ipv4Addr) {
        let offset = u32::from(ip).wrapping_sub(self.base);
        if offset < self.size {
            self.used.remove(&offset);
        }
    }
}

/// What the kubelet remembers about one pod it runs.
#[derive(Clone, Debug)]
pub struct PodRuntime {
    /// The pod's address (None once released).
    pub ip: Option<Ipv4Addr>,
    /// When the pod started.
    pub started: Timestamp,
    /// Container restarts so far.
    pub restarts: i32,
    /// When the next restart is due (crash-looping containers).
    pub next_restart: Option<Instant>,
    /// When the containers last exited.
    pub last_exit: Timestamp,
    /// When a [`Behavior::Complete`] container exits.
    pub exits_at: Option<Instant>,
    /// Whether a [`Behavior::Complete`] container has exited.
    pub completed: bool,
    /// Containers that could not start (network mode: a command the image does not have),
    /// with runc's message.
    pub start_errors: BTreeMap<String, String>,
    /// Exit code of the last exit of a real process (network mode, Tandem's image), which
    /// the lab restarted: the containers' `lastState`.
    pub process_exit: Option<i32>,
    /// Exit code of a real process that exited for good (its restart policy keeps it
    /// terminated): the pod's phase is then Succeeded or Failed.
    pub process_final: Option<i32>,
}

/// Whether a pod belongs to a Job: its controller is a Job, or it carries the
/// `batch.kubernetes.io/job-name` label kube-apiserver gives every Job's pods. The label
/// counts on its own because a Job pod offloaded to another cluster runs there as a copy
/// owned by Tandem's ShadowPod, and must finish there as the same short-lived image would.
fn owned_by_job(pod: &Pod) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.kind == "Job" && r.controller == Some(true))
        || pod
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(JOB_NAME_LABEL))
}

/// The label kube-apiserver's Job strategy puts on a Job's pod template.
const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";

/// Back-off before restart number `restarts + 1`: 1 s doubling to 10 s.
pub fn restart_backoff(restarts: i32) -> Duration {
    Duration::from_secs(1u64 << restarts.clamp(0, 4)).min(Duration::from_secs(10))
}

/// Whether the pod's containers, doing `behavior`, have exited for good under the pod's
/// restart policy.
fn exited_for_good(pod: &Pod, behavior: Behavior) -> Option<i32> {
    behavior
        .exit_code()
        .filter(|code| !restarts(restart_policy(pod), *code))
}

/// The status a hollow kubelet reports for `pod` (decide; the caller only sends it).
pub fn desired_status(pod: &Pod, rt: &PodRuntime, host_ip: &str, now: Timestamp) -> Value {
    let behavior = Behavior::of(pod).now(rt);
    let uid = pod.metadata.uid.as_deref().unwrap_or("");
    let ns = pod.metadata.namespace.as_deref().unwrap_or("");
    let name = pod.metadata.name.as_deref().unwrap_or("");
    let started = Time(rt.started);
    let finished = Time(rt.last_exit);
    let final_code = exited_for_good(pod, behavior).or(rt.process_final);
    let containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or(&[]);
    let mut unready = Vec::new();
    let statuses: Vec<Value> = containers
        .iter()
        .map(|c| {
            let image = c.image.clone().unwrap_or_default();
            let base = json!({
                "name": c.name, "image": image, "imageID": format!("hollow://{image}"),
                "containerID": format!("hollow://{uid}/{}/{}", c.name, rt.restarts),
                "restartCount": rt.restarts,
            });
            let start_error = rt.start_errors.get(&c.name).map(|message| {
                (
                    json!({"terminated": {"exitCode": 128, "reason": "StartError",
                        "message": message, "startedAt": started, "finishedAt": finished,
                        "containerID": base["containerID"]}}),
                    Value::Null,
                    false,
                    false,
                )
            });
            let (state, last, ready, started_flag) = if let Some(failed) = start_error {
                failed
            } else {
                match (behavior.exit_code().or(rt.process_final), final_code) {
                    (Some(_), Some(code)) => (
                        json!({"terminated": {"exitCode": code,
                        "reason": if code == 0 { "Completed" } else { "Error" },
                        "startedAt": started, "finishedAt": finished,
                        "containerID": base["containerID"]}}),
                        Value::Null,
                        false,
                        false,
                    ),
                    (Some(code), None) => (
                        json!({"waiting": {"reason": "CrashLoopBackOff", "message": format!(
                        "back-off {}s restarting failed container={} pod={name}_{ns}({uid})",
                        restart_backoff(rt.restarts).as_secs(), c.name)}}),
                        json!({"terminated": {"exitCode": code,
                        "reason": if code == 0 { "Completed" } else { "Error" },
                        "startedAt": started, "finishedAt": finished,
                        "containerID": base["containerID"]}}),
                        false,
                        false,
                    ),
                    (None, _) => (
                        json!({"running": {"startedAt": started}}),
                        rt.process_exit.map_or(Value::Null, |code| {
                            json!({"terminated": {"exitCode": code,
                            "reason": if code == 0 { "Completed" } else { "Error" },
                            "finishedAt": finished}})
                        }),
                        behavior != Behavior::NeverReady,
                        true,
                    ),
                }
            };
            if !ready {
                unready.push(c.name.clone());
            }
            let mut status = base;
            status["state"] = state;
            status["lastState"] = if last.is_null() { json!({}) } else { last };
            status["ready"] = json!(ready);
            status["started"] = json!(started_flag);
            status
        })
        .collect();
    let phase = match final_code {
        Some(0) => "Succeeded",
        Some(_) => "Failed",
        None => "Running",
    };
    let condition = |kind: &str, ok: bool, reason: Option<&str>, message: Option<String>| {
        let mut c = json!({"type": kind, "status": if ok { "True" } else { "False" },
                           "lastProbeTime": null, "lastTransitionTime": Time(now)});
        if let Some(r) = reason {
            c["reason"] = json!(r);
        }
        if let Some(m) = message {
            c["message"] = json!(m);
        }
        c
    };
    let (ready, reason, message) = if final_code.is_some() {
        (false, Some("PodCompleted"), None)
    } else if unready.is_empty() {
        (true, None, None)
    } else {
        (
            false,
            Some("ContainersNotReady"),
            Some(format!(
                "containers with unready status: [{}]",
                unready.join(" ")
            )),
        )
    };
    let pod_ips = rt
        .ip
        .map(|ip| vec![json!({"ip": ip.to_string()})])
        .unwrap_or_default();
    json!({
        "phase": phase,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "podIP": rt.ip.map(|ip| ip.to_string()),
        "podIPs": pod_ips,
        "startTime": started,
        "qosClass": pod.status.as_ref().and_then(|s| s.qos_class.clone()).unwrap_or_else(|| "BestEffort".into()),
        "conditions": [
            condition("PodReadyToStartContainers", final_code.is_none(), None, None),
            condition("Initialized", true, None, None),
            condition("ContainersReady", ready, reason, message.clone()),
            condition("Ready", ready, reason, message),
            condition("PodScheduled", true, None, None),
        ],
        "containerStatuses": statuses,
    })
}

/// The parts of a pod status whose change needs a write (timestamps excluded, so a status
/// the kubelet wrote itself does not trigger another write when the watch echoes it).
fn status_key(status: Option<&PodStatus>) -> String {
    let Some(s) = status else {
        return String::new();
    };
    let conditions: Vec<String> = s
        .conditions
        .iter()
        .flatten()
        .map(|c| format!("{}={}", c.type_, c.status))
        .collect();
    let containers: Vec<String> = s
        .init_container_statuses
        .iter()
        .flatten()
        .chain(s.container_statuses.iter().flatten())
        .map(|c| {
            let state = c.state.as_ref().map(|st| {
                if st.running.is_some() {
                    "running".to_string()
                } else if st.terminated.is_some() {
                    "terminated".to_string()
                } else {
                    // ErrImagePull turning ImagePullBackOff is a change to write.
                    let waiting = st.waiting.as_ref().and_then(|w| w.reason.as_deref());
                    format!("waiting/{}", waiting.unwrap_or_default())
                }
            });
            format!("{}:{}:{}:{state:?}", c.name, c.ready, c.restart_count)
        })
        .collect();
    format!(
        "{:?}|{:?}|{:?}|{}|{}",
        s.phase,
        s.pod_ip,
        s.host_ip,
        conditions.join(","),
        containers.join(",")
    )
}

/// One hollow kubelet's state.
struct Kubelet {
    client: kube::Client,
    node: HollowNode,
    addresses: PodAddresses,
    runtimes: HashMap<String, PodRuntime>,
    pods: HashMap<String, Pod>,
    deleting: HashSet<String>,
    seen: HashSet<String>,
    ready_since: Timestamp,
    node_uid: Option<String>,
    events: crate::events::Recorder,
    network: Option<Arc<crate::network::ClusterNetwork>>,
    images: NodeImages,
    /// Pods waiting for an image that is not on the node (kind profile), by UID.
    pulls: HashMap<String, Pulling>,
}

/// The events a kubelet records when it starts a pod's containers, in order (`{}` is the
/// container's name; Pulled names the image instead).
const CONTAINER_START: [(&str, &str); 3] = [
    ("Pulled", ""),
    ("Created", "Created container: {}"),
    ("Started", "Started container {}"),
];

/// Runs one hollow kubelet until the process ends.
pub async fn run(
    client: kube::Client,
    node: HollowNode,
    power: NodePower,
    events: crate::events::Recorder,
    network: Option<Arc<crate::network::ClusterNetwork>>,
    images: NodeImages,
) -> Result<(), KubeletError> {
    let addresses = PodAddresses::parse(&node.pod_cidr).ok_or_else(|| KubeletError::PodCidr {
        node: node.name.clone(),
        cidr: node.pod_cidr.clone(),
    })?;
    let events = events.for_host(&node.name);
    let mut kubelet = Kubelet {
        client,
        events,
        network,
        node,
        addresses,
        runtimes: HashMap::new(),
        pods: HashMap::new(),
        deleting: HashSet::new(),
        seen: HashSet::new(),
        ready_since: Timestamp::now(),
        node_uid: None,
        images,
        pulls: HashMap::new(),
    };
    loop {
        while !power.is_on(&kubelet.node.name) {
            tokio::time::sleep(POWER_POLL).await;
        }
        kubelet.ready_since = Timestamp::now();
        if let Err(e) = kubelet.register().await {
            tracing::warn!(node = %kubelet.node.name, "registering: {e}");
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        kubelet.serve(&power).await;
        // Powered off: the node's containers die with it.
        crate::runs::node_down(&kubelet.node.cluster, &kubelet.node.name);
    }
}

impl Kubelet {
    fn node_status(&self) -> Value {
        let n = &self.node;
        let now = Time(Timestamp::now());
        let since = Time(self.ready_since);
        let resources = json!({"cpu": n.cpu, "memory": n.memory, "pods": n.pods.to_string(),
                               "ephemeral-storage": "100Gi"});
        let pressure = |kind: &str, reason: &str, message: &str| {
            json!({"type": kind, "status": "False", "reason": reason, "message": message,
                   "lastHeartbeatTime": now, "lastTransitionTime": since})
        };
        json!({
            "capacity": resources,
            "allocatable": resources,
            "addresses": [{"type": "InternalIP", "address": n.internal_ip},
                          {"type": "Hostname", "address": n.name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": n.name, "systemUUID": n.name, "bootID": n.name,
                "kernelVersion": "6.1.0-hollow", "osImage": "Tandem Hollow Linux",
                "containerRuntimeVersion": "hollow://1.0", "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": KUBELET_VERSION, "operatingSystem": "linux",
                "architecture": n.labels.get("kubernetes.io/arch").cloned().unwrap_or_else(|| "amd64".into()),
            },
            "conditions": [
                pressure("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                pressure("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                pressure("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                {"type": "Ready", "status": "True", "reason": "KubeletReady",
                 "message": "kubelet is posting ready status", "lastHeartbeatTime": now,
                 "lastTransitionTime": since},
            ],
        })
    }

    /// Creates the Node (or finds it), renews the Lease and posts the node status.
    async fn register(&mut self) -> Result<(), kube::Error> {
        let nodes = Api::<Node>::all(self.client.clone());
        let n = &self.node;
        let object: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": n.name, "labels": n.labels,
                         "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
            "spec": {"podCIDR": n.pod_cidr, "podCIDRs": [n.pod_cidr],
                     "providerID": format!("hollow://{}", n.name)},
            "status": self.node_status(),
        }))
        .map_err(kube::Error::SerdeError)?;
        let created = match nodes.create(&PostParams::default(), &object).await {
            Ok(node) => node,
            Err(e) if tandem_api::client::is_conflict(&e) => nodes.get(&n.name).await?,
            Err(e) => return Err(e),
        };
        self.node_uid = created.metadata.uid.clone();
        // Lease first: once the node lifecycle controller sees it renewed it no longer marks
        // the node unknown, so the Ready status posted next is not overwritten.
        self.renew_lease().await?;
        self.post_node_status().await
    }

    async fn post_node_status(&self) -> Result<(), kube::Error> {
        Api::<Node>::all(self.client.clone())
            .patch_status(
                &self.node.name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": self.node_status()})),
            )
            .await
            .map(|_| ())
    }

    async fn renew_lease(&self) -> Result<(), kube::Error> {
        let leases = Api::<Lease>::namespaced(self.client.clone(), NODE_LEASE_NAMESPACE);
        let now = MicroTime(Timestamp::now());
        let patch = json!({"spec": {"holderIdentity": self.node.name, "renewTime": now}});
        match leases
            .patch(
                &self.node.name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if tandem_api::client::is_not_found(&e) => {
                let lease: Lease = serde_json::from_value(json!({
                    "metadata": {"name": self.node.name, "namespace": NODE_LEASE_NAMESPACE,
                        "ownerReferences": self.node_uid.as_ref().map(|uid| vec![json!({
                            "apiVersion": "v1", "kind": "Node", "name": self.node.name, "uid": uid})])},
                    "spec": {"holderIdentity": self.node.name, "leaseDurationSeconds": 40,
                             "renewTime": now},
                }))
                .map_err(kube::Error::SerdeError)?;
                leases
                    .create(&PostParams::default(), &lease)
                    .await
                    .map(|_| ())
            }
            Err(e) => Err(e),
        }
    }

    /// Runs pods and heartbeats until the node is powered off.
    async fn serve(&mut self, power: &NodePower) {
        let api = Api::<Pod>::all(self.client.clone());
        let config =
            watcher::Config::default().fields(&format!("spec.nodeName={}", self.node.name));
        let stream = watcher::watcher(api, config).default_backoff();
        futures::pin_mut!(stream);
        let mut lease = tokio::time::interval(self.node.lease_renew_interval);
        let mut status = tokio::time::interval(NODE_STATUS_INTERVAL);
        let mut power_tick = tokio::time::interval(POWER_POLL);
        let mut restart_tick = tokio::time::interval(Duration::from_millis(250));
        status.tick().await;
        loop {
            tokio::select! {
                ev = stream.next() => match ev {
                    Some(Ok(ev)) => self.on_event(ev).await,
                    Some(Err(e)) => tracing::debug!(node = %self.node.name, "pod watch: {e}"),
                    None => return,
                },
                _ = lease.tick() => {
                    if let Err(e) = self.renew_lease().await {
                        tracing::warn!(node = %self.node.name, "renewing lease: {e}");
                    }
                }
                _ = status.tick() => {
                    if let Err(e) = self.post_node_status().await {
                        tracing::warn!(node = %self.node.name, "posting node status: {e}");
                    }
                }
                _ = restart_tick.tick() => self.restart_due().await,
                _ = power_tick.tick() => {}
            }
            if !power.is_on(&self.node.name) {
                return;
            }
        }
    }

    async fn on_event(&mut self, event: Event<Pod>) {
        match event {
            Event::Init => self.seen.clear(),
            Event::InitApply(pod) | Event::Apply(pod) => {
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                self.seen.insert(uid.clone());
                self.sync(pod).await;
            }
            Event::Delete(pod) => {
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                self.forget(&uid).await;
            }
            Event::InitDone => {
                let gone: Vec<String> = self
                    .pods
                    .keys()
                    .filter(|u| !self.seen.contains(*u))
                    .cloned()
                    .collect();
                for uid in gone {
                    self.forget(&uid).await;
                }
            }
        }
    }

    /// Records a `reason` event about each of the pod's containers, as the kubelet's
    /// container runtime manager does (with the container's field path).
    fn container_events(&self, pod: &Pod, reason: &str, message: impl Fn(&str) -> String) {
        let Some(spec) = &pod.spec else { return };
        for c in &spec.containers {
            let text = if reason == "Pulled" {
                format!(
                    "Container image \"{}\" already present on machine",
                    c.image.as_deref().unwrap_or_default()
                )
            } else {
                message(&c.name)
            };
            self.events.pod(
                pod,
                Some(format!("spec.containers{{{}}}", c.name)),
                crate::events::PodEvent {
                    reason,
                    type_: "Normal",
                    message: text,
                    component: "kubelet",
                    action: "",
                },
            );
        }
    }

    /// Whether every image of `pod` is on the node, trying to pull the missing ones when their
    /// back-off has passed (kubelet's `ErrImagePull`, then `ImagePullBackOff`, with events).
    fn images_pulled(&mut self, pod: &Pod) -> bool {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let now = Instant::now();
        if self.pulls.get(&uid).is_some_and(|p| now < p.next) {
            return false;
        }
        let spec = pod.spec.as_ref();
        let containers = spec
            .and_then(|s| s.init_containers.as_deref())
            .unwrap_or_default()
            .iter()
            .chain(spec.map(|s| s.containers.as_slice()).unwrap_or_default());
        let failures: BTreeMap<String, PullFailure> = containers
            .filter_map(|c| {
                let image = c.image.as_deref().unwrap_or_default();
                let failure = self.images.pull(image, c.image_pull_policy.as_deref())?;
                Some((c.name.clone(), failure))
            })
            .collect();
        if failures.is_empty() {
            self.pulls.remove(&uid);
            return true;
        }
        let attempts = self.pulls.get(&uid).map_or(0, |p| p.attempts) + 1;
        for (container, f) in &failures {
            let path = Some(format!("spec.containers{{{container}}}"));
            let event = |reason, type_, message| crate::events::PodEvent {
                reason,
                type_,
                message,
                component: "kubelet",
                action: "",
            };
            if f.reason == "ErrImagePull" {
                let pulling = format!("Pulling image \"{}\"", f.image);
                self.events
                    .pod(pod, path.clone(), event("Pulling", "Normal", pulling));
            }
            let failed = format!("Failed to pull image \"{}\": {}", f.image, f.message);
            self.events
                .pod(pod, path.clone(), event("Failed", "Warning", failed));
            let error = format!("Error: {}", f.reason);
            self.events
                .pod(pod, path, event("Failed", "Warning", error));
        }
        self.pulls.insert(
            uid,
            Pulling {
                failures,
                attempts,
                failed_at: now,
                next: now + restart_backoff(attempts - 1),
                backing_off: false,
            },
        );
        false
    }

    /// Reports the back-off of pulls that failed a moment ago, and tries again those whose
    /// back-off has passed.
    async fn pulls_due(&mut self, now: Instant) {
        let backing_off: Vec<String> = self
            .pulls
            .iter_mut()
            .filter(|(_, p)| !p.backing_off && now >= p.failed_at + PULL_ERROR_SHOWN)
            .map(|(uid, p)| {
                p.backing_off = true;
                uid.clone()
            })
            .collect();
        for uid in backing_off {
            if let (Some(pod), Some(pulling)) = (self.pods.get(&uid), self.pulls.get(&uid)) {
                for (container, f) in pulling
                    .failures
                    .iter()
                    .filter(|(_, f)| f.reason == "ErrImagePull")
                {
                    let path = Some(format!("spec.containers{{{container}}}"));
                    for (reason, type_, message) in [
                        (
                            "BackOff",
                            "Normal",
                            format!("Back-off pulling image \"{}\"", f.image),
                        ),
                        ("Failed", "Warning", "Error: ImagePullBackOff".to_string()),
                    ] {
                        self.events.pod(
                            pod,
                            path.clone(),
                            crate::events::PodEvent {
                                reason,
                                type_,
                                message,
                                component: "kubelet",
                                action: "",
                            },
                        );
                    }
                }
            }
            self.report(&uid).await;
        }
        let retry: Vec<Pod> = self
            .pulls
            .iter()
            .filter(|(_, p)| now >= p.next)
            .filter_map(|(uid, _)| self.pods.get(uid).cloned())
            .collect();
        for pod in retry {
            self.sync(pod).await;
        }
    }

    async fn forget(&mut self, uid: &str) {
        if let Some(network) = &self.network {
            network.stop_pod(uid).await;
        }
        crate::runs::stopped(uid);
        self.pods.remove(uid);
        self.deleting.remove(uid);
        self.pulls.remove(uid);
        if let Some(ip) = self.runtimes.remove(uid).and_then(|rt| rt.ip) {
            self.addresses.release(ip);
        }
    }

    /// Brings one pod's reported status in line with its hollow containers.
    async fn sync(&mut self, pod: Pod) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let api = Api::<Pod>::namespaced(self.client.clone(), &ns);
        if pod.metadata.deletion_timestamp.is_some() {
            if !self.deleting.insert(uid.clone()) {
                return;
            }
            self.pulls.remove(&uid);
            if let Some(rt) = self.runtimes.get_mut(&uid) {
                rt.next_restart = None;
                rt.exits_at = None;
            }
            self.container_events(&pod, "Killing", |c| format!("Stopping container {c}"));
            if let Some(network) = &self.network {
                network.stop_pod(&uid).await;
            }
            crate::runs::stopped(&uid);
            // Hollow containers stop at once: report them terminated, then finish the
            // graceful deletion without waiting for the grace period.
            let terminated = terminated_status(&pod);
            if let Err(e) = api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&terminated))
                .await
            {
                tracing::debug!(pod = %name, "reporting terminated containers: {e}");
            }
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(uid.clone()),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match api.delete(&name, &dp).await {
                Ok(_) => {}
                Err(e)
                    if tandem_api::client::is_not_found(&e)
                        || tandem_api::client::is_conflict(&e) => {}
                Err(e) => {
                    tracing::warn!(pod = %name, "finishing deletion: {e}");
                    self.deleting.remove(&uid);
                }
            }
            return;
        }
        let terminal = matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        );
        if terminal {
            // Terminal pods keep their status and logs but give their address back.
            if let Some(network) = &self.network {
                network.finish_pod(&uid).await;
            }
            crate::runs::stopped(&uid);
            if let Some(rt) = self.runtimes.get_mut(&uid)
                && let Some(ip) = rt.ip.take()
            {
                self.addresses.release(ip);
            }
            self.pods.insert(uid, pod);
            return;
        }
        if !self.runtimes.contains_key(&uid) && !self.images_pulled(&pod) {
            self.pods.insert(uid.clone(), pod);
            self.report(&uid).await;
            return;
        }
        if !self.runtimes.contains_key(&uid) {
            let previous = pod
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.as_deref())
                .and_then(|ip| ip.parse::<Ipv4Addr>().ok())
                .filter(|ip| self.addresses.reserve(*ip));
            // A hostNetwork pod shares its node's network: the node's address is its own, as
            // kubelet reports it, and nothing is taken from the pod CIDR.
            let host_network = pod
                .spec
                .as_ref()
                .and_then(|s| s.host_network)
                .unwrap_or(false);
            let ip = if host_network {
                self.node.internal_ip.parse().ok()
            } else {
                previous.or_else(|| self.addresses.allocate())
            };
            if ip.is_none() {
                tracing::warn!(node = %self.node.name, pod = %name, "pod CIDR exhausted");
            }
            let now = Timestamp::now();
            let behavior = Behavior::of(&pod);
            self.runtimes.insert(
                uid.clone(),
                PodRuntime {
                    ip,
                    started: now,
                    restarts: 0,
                    next_restart: (behavior.exit_code().is_some()
                        && exited_for_good(&pod, behavior).is_none())
                    .then(|| Instant::now() + restart_backoff(0)),
                    last_exit: now,
                    exits_at: (behavior == Behavior::Complete)
                        .then(|| Instant::now() + JOB_POD_RUN),
                    completed: false,
                    start_errors: BTreeMap::new(),
                    process_exit: None,
                    process_final: None,
                },
            );
            if let (Some(network), Some(ip)) = (&self.network, ip) {
                match network.start_pod(&self.node.name, &pod, ip).await {
                    Ok(started) => {
                        let errors = started.into_iter().filter_map(|(c, s)| match s {
                            crate::network::ContainerStart::Failed(m) => Some((c, m)),
                            crate::network::ContainerStart::Running => None,
                        });
                        if let Some(rt) = self.runtimes.get_mut(&uid) {
                            rt.start_errors.extend(errors);
                        }
                    }
                    Err(e) => tracing::error!(
                        node = %self.node.name,
                        pod = %name,
                        "{:#}",
                        anyhow::Error::new(e)
                    ),
                }
            }
            for (reason, message) in CONTAINER_START {
                self.container_events(&pod, reason, |c| message.replace("{}", c));
            }
        }
        crate::runs::started(&self.node.cluster, &self.node.name, &pod);
        self.pods.insert(uid.clone(), pod);
        self.report(&uid).await;
    }

    /// Writes the pod's status if it differs from what its runtime says.
    async fn report(&mut self, uid: &str) {
        let Some(pod) = self.pods.get(uid) else {
            return;
        };
        let desired = match (self.runtimes.get(uid), self.pulls.get(uid)) {
            (Some(rt), _) => desired_status(pod, rt, &self.node.internal_ip, Timestamp::now()),
            (None, Some(pulling)) => pulling_status(pod, pulling, &self.node.internal_ip),
            (None, None) => return,
        };
        let desired_typed: Option<PodStatus> = serde_json::from_value(desired.clone()).ok();
        if status_key(desired_typed.as_ref()) == status_key(pod.status.as_ref()) {
            return;
        }
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        if let Err(e) = Api::<Pod>::namespaced(self.client.clone(), &ns)
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": desired})),
            )
            .await
        {
            tracing::debug!(pod = %name, "updating status: {e}");
        }
    }

    /// Restarts crash-looping containers whose back-off has passed, and ends Job containers
    /// that have run their time.
    async fn restart_due(&mut self) {
        let now = Instant::now();
        self.pulls_due(now).await;
        // Real processes the network restarted: their count and last exit, as kubelet reports.
        if let Some(network) = &self.network {
            let restarted: Vec<String> = self
                .runtimes
                .iter_mut()
                .filter_map(|(uid, rt)| {
                    let exit = network.process_exits(uid)?;
                    if exit.last {
                        // Exited for good: terminated, and not counted as a restart.
                        return rt.process_final.is_none().then(|| {
                            rt.restarts = exit.count - 1;
                            rt.last_exit = exit.at;
                            rt.process_final = Some(exit.code);
                            uid.clone()
                        });
                    }
                    (exit.count != rt.restarts).then(|| {
                        rt.restarts = exit.count;
                        rt.last_exit = exit.at;
                        rt.process_exit = Some(exit.code);
                        uid.clone()
                    })
                })
                .collect();
            for uid in restarted {
                self.report(&uid).await;
            }
        }
        let ending: Vec<String> = self
            .runtimes
            .iter()
            .filter(|(_, rt)| rt.exits_at.is_some_and(|t| t <= now))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in ending {
            if let Some(rt) = self.runtimes.get_mut(&uid) {
                rt.exits_at = None;
                rt.completed = true;
                rt.last_exit = Timestamp::now();
            }
            self.report(&uid).await;
        }
        let due: Vec<String> = self
            .runtimes
            .iter()
            .filter(|(_, rt)| rt.next_restart.is_some_and(|t| t <= now))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in due {
            if let Some(rt) = self.runtimes.get_mut(&uid) {
                rt.restarts += 1;
                rt.last_exit = Timestamp::now();
                rt.next_restart = Some(now + restart_backoff(rt.restarts));
            }
            self.report(&uid).await;
        }
    }
}

/// Status of a pod whose hollow containers were stopped for deletion.
fn terminated_status(pod: &Pod) -> Value {
    let now = Time(Timestamp::now());
    let statuses: Vec<Value> = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|c| {
            let mut v = serde_json::to_value(&c).unwrap_or_default();
            let started = c
                .state
                .as_ref()
                .and_then(|s| s.running.as_ref())
                .and_then(|r| r.started_at.clone());
            v["state"] = json!({"terminated": {"exitCode": 0, "reason": "Completed",
                                "startedAt": started, "finishedAt": now}});
            v["ready"] = json!(false);
            v["started"] = json!(false);
            v
        })
        .collect();
    json!({"status": {"containerStatuses": statuses}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_addresses_hand_out_lowest_free_and_reuse() {
        let mut a = PodAddresses::parse("10.244.3.0/24").expect("valid CIDR");
        let first = a.allocate().expect("free");
        let second = a.allocate().expect("free");
        assert_eq!(first, Ipv4Addr::new(10, 244, 3, 2));
        assert_eq!(second, Ipv4Addr::new(10, 244, 3, 3));
        a.release(first);
        assert_eq!(a.allocate(), Some(first));
        assert!(!a.reserve(Ipv4Addr::new(10, 244, 4, 9)), "outside the CIDR");
        assert!(a.reserve(Ipv4Addr::new(10, 244, 3, 9)));
        let mut small = PodAddresses::parse("10.0.0.0/30").expect("valid CIDR");
        assert_eq!(small.allocate(), Some(Ipv4Addr::new(10, 0, 0, 2)));
        assert_eq!(small.allocate(), None, "a /30 has one usable pod address");
        assert!(PodAddresses::parse("10.0.0.0").is_none());
        assert!(PodAddresses::parse("fd00::/64").is_none());
    }

    fn pod(behavior: Option<&str>, policy: &str) -> Pod {
        let mut annotations = BTreeMap::new();
        if let Some(b) = behavior {
            annotations.insert(BEHAVIOR_ANNOTATION.to_string(), b.to_string());
        }
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "u1", "annotations": annotations},
            "spec": {"restartPolicy": policy, "containers": [{"name": "app", "image": "nginx"}]},
        }))
        .expect("valid pod")
    }

    #[test]
    fn behaviours_give_phase_readiness_and_container_state() {
        // (annotation, restartPolicy, phase, Ready, container state)
        let cases = [
            (None, "Always", "Running", "True", "running"),
            (Some("never-ready"), "Always", "Running", "False", "running"),
            (Some("exit"), "Never", "Succeeded", "False", "terminated"),
            (
                Some("exit"),
                "OnFailure",
                "Succeeded",
                "False",
                "terminated",
            ),
            (Some("exit"), "Always", "Running", "False", "waiting"),
            (Some("fail"), "Never", "Failed", "False", "terminated"),
            (Some("fail"), "OnFailure", "Running", "False", "waiting"),
            (Some("crashloop"), "Always", "Running", "False", "waiting"),
        ];
        let now = Timestamp::now();
        let rt = PodRuntime {
            ip: Some(Ipv4Addr::new(10, 244, 1, 2)),
            started: now,
            restarts: 3,
            next_restart: None,
            last_exit: now,
            exits_at: None,
            completed: false,
            start_errors: BTreeMap::new(),
            process_exit: None,
            process_final: None,
        };
        for (behavior, policy, phase, ready, state) in cases {
            let status = desired_status(&pod(behavior, policy), &rt, "172.18.0.3", now);
            let case = format!("{behavior:?} under {policy}");
            assert_eq!(status["phase"], phase, "{case}");
            let ready_cond = status["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
                .expect("Ready condition");
            assert_eq!(ready_cond["status"], ready, "{case}");
            let c = &status["containerStatuses"][0];
            assert!(c["state"].get(state).is_some(), "{case}: {c}");
            assert_eq!(c["restartCount"], 3, "{case}");
            assert_eq!(status["podIP"], "10.244.1.2", "{case}");
            if state == "waiting" {
                assert_eq!(
                    c["state"]["waiting"]["reason"], "CrashLoopBackOff",
                    "{case}"
                );
            }
            // The status parses as a core/v1 PodStatus and its key is stable.
            let typed: PodStatus = serde_json::from_value(status).expect("PodStatus");
            assert!(!status_key(Some(&typed)).is_empty());
        }
        // A real process (network mode) that exited for good under its policy: terminated,
        // Completed or Error, and the pod Succeeded or Failed, as kubelet reports a Job's pod.
        for (code, phase, reason) in [(0, "Succeeded", "Completed"), (2, "Failed", "Error")] {
            let done = PodRuntime {
                process_final: Some(code),
                ..rt.clone()
            };
            let status = desired_status(&pod(None, "Never"), &done, "172.18.0.3", now);
            assert_eq!(status["phase"], phase, "{status}");
            let terminated = &status["containerStatuses"][0]["state"]["terminated"];
            assert_eq!(terminated["exitCode"], code, "{status}");
            assert_eq!(terminated["reason"], reason, "{status}");
        }
        // One the lab restarted: running again, the last exit said as kubelet says it.
        let restarted = PodRuntime {
            process_exit: Some(0),
            ..rt.clone()
        };
        let status = desired_status(&pod(None, "Always"), &restarted, "172.18.0.3", now);
        assert_eq!(status["phase"], "Running");
        let c = &status["containerStatuses"][0];
        assert_eq!(c["lastState"]["terminated"]["reason"], "Completed", "{c}");
        assert!(restarts("Always", 0) && restarts("OnFailure", 1));
        assert!(!restarts("Never", 1) && !restarts("OnFailure", 0));
    }

    #[test]
    fn job_pods_run_then_exit_zero_unless_the_annotation_says_otherwise() {
        // (owned by a Job, annotation, run time over, phase, container state, exit code)
        let cases = [
            (true, None, false, "Running", "running", None),
            (true, None, true, "Succeeded", "terminated", Some(0)),
            (true, Some("fail"), false, "Failed", "terminated", Some(1)),
            (true, Some("run"), true, "Running", "running", None),
            (
                true,
                Some("exit"),
                false,
                "Succeeded",
                "terminated",
                Some(0),
            ),
            (false, None, true, "Running", "running", None),
        ];
        let now = Timestamp::now();
        for (job, behavior, over, phase, state, code) in cases {
            let mut p = pod(behavior, "Never");
            if job {
                p.metadata.owner_references = Some(vec![
                    serde_json::from_value(json!({"apiVersion": "batch/v1", "kind": "Job",
                        "name": "pi", "uid": "j1", "controller": true}))
                    .expect("owner reference"),
                ]);
            }
            let rt = PodRuntime {
                ip: None,
                started: now,
                restarts: 0,
                next_restart: None,
                last_exit: now,
                exits_at: None,
                completed: over,
                start_errors: BTreeMap::new(),
                process_exit: None,
                process_final: None,
            };
            let case = format!("job={job} {behavior:?} over={over}");
            let status = desired_status(&p, &rt, "172.18.0.3", now);
            assert_eq!(status["phase"], phase, "{case}");
            let c = &status["containerStatuses"][0]["state"];
            assert!(c.get(state).is_some(), "{case}: {c}");
            assert_eq!(c[state]["exitCode"].as_i64(), code.map(i64::from), "{case}");
            // A Job pod's copy in a provider cluster has no Job owner, only the Job's label.
            if job && behavior.is_none() {
                p.metadata.owner_references = None;
                p.metadata.labels = Some([(JOB_NAME_LABEL.to_string(), "pi".to_string())].into());
                let status = desired_status(&p, &rt, "172.18.0.3", now);
                assert_eq!(status["phase"], phase, "{case} (label only)");
            }
        }
    }

    #[test]
    fn leases_renew_four_times_per_grace_period_at_most_every_10s() {
        let cases = [
            (40_000, 10_000),
            (2_000, 500),
            (100_000, 10_000),
            (200, 100),
        ];
        for (grace, want) in cases {
            assert_eq!(
                lease_renew_interval(Duration::from_millis(grace)),
                Duration::from_millis(want),
                "grace {grace} ms"
            );
        }
    }

    #[test]
    fn restart_backoff_doubles_to_ten_seconds() {
        let secs: Vec<u64> = (0..6).map(|n| restart_backoff(n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 10, 10]);
    }
}
