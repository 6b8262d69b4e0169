//! A pod as the scheduler sees it: whether it is this scheduler's to place, and what it
//! asks of a node (requests, claims) and shares with its replicas (the spread key).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodAffinityTerm};
use tandem_apimachinery::quantity::Quantity;

/// The scheduler name pods ask for (an empty `spec.schedulerName` means this one too).
pub const SCHEDULER_NAME: &str = "default-scheduler";

/// CPU request kube-scheduler assumes for scoring when a container requests none (millicores).
const DEFAULT_MILLI_CPU: i64 = 100;
/// Memory request kube-scheduler assumes for scoring when a container requests none (bytes).
const DEFAULT_MEMORY: i64 = 200 * 1024 * 1024;

/// CPU in millicores and memory in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    /// Millicores.
    pub cpu_milli: i64,
    /// Bytes.
    pub memory: i64,
}

impl Resources {
    pub(super) fn add(&mut self, o: Resources) {
        self.cpu_milli += o.cpu_milli;
        self.memory += o.memory;
    }

    pub(super) fn sub(&mut self, o: Resources) {
        self.cpu_milli -= o.cpu_milli;
        self.memory -= o.memory;
    }

    fn max(self, o: Resources) -> Resources {
        Resources {
            cpu_milli: self.cpu_milli.max(o.cpu_milli),
            memory: self.memory.max(o.memory),
        }
    }
}

/// A quantity of `map[key]` times `10^scale` (3 for millicores, 0 for bytes and counts), rounded
/// up like `Quantity.MilliValue`/`Value`; `None` if absent or not a quantity.
pub(super) fn quantity(
    map: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    key: &str,
    scale: i32,
) -> Option<i64> {
    let q = Quantity::parse(&map?.get(key)?.0).ok()?;
    Some(q.scaled(scale).clamp(i64::MIN.into(), i64::MAX.into()) as i64)
}

/// A pod as the scheduler accounts for it: requests and the key its replicas share.
#[derive(Debug)]
pub struct PodInfo {
    /// The pod.
    pub pod: Arc<Pod>,
    /// `metadata.uid`.
    pub uid: String,
    /// Effective requests (sum of containers, at least the largest init container).
    pub requests: Resources,
    /// Requests with kube-scheduler's non-zero defaults, used for scoring.
    pub nonzero: Resources,
    /// Pods with the same key are spread across nodes: the controlling owner, or the
    /// namespace and labels of a bare pod.
    pub spread_key: String,
    /// The claims its volumes use (`persistentVolumeClaim` and generic ephemeral volumes);
    /// empty for most pods, which then never look at volumes.
    pub claims: Vec<PodClaim>,
}

/// A claim a pod's volume uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodClaim {
    /// The claim's name (in the pod's namespace).
    pub name: String,
    /// Whether it comes from a generic ephemeral volume (`<pod>-<volume>`).
    pub ephemeral: bool,
}

impl PodInfo {
    /// Computes the accounting view of `pod`.
    pub fn new(pod: Arc<Pod>) -> PodInfo {
        let mut requests = Resources::default();
        let mut nonzero = Resources::default();
        let mut init = Resources::default();
        if let Some(spec) = &pod.spec {
            let of = |c: &k8s_openapi::api::core::v1::Container| {
                let r = c.resources.as_ref();
                let get = |key: &str, scale: i32| {
                    quantity(r.and_then(|r| r.requests.as_ref()), key, scale)
                        .or_else(|| quantity(r.and_then(|r| r.limits.as_ref()), key, scale))
                };
                (get("cpu", 3), get("memory", 0))
            };
            for c in &spec.containers {
                let (cpu, mem) = of(c);
                requests.add(Resources {
                    cpu_milli: cpu.unwrap_or(0),
                    memory: mem.unwrap_or(0),
                });
                nonzero.add(Resources {
                    cpu_milli: cpu.filter(|v| *v > 0).unwrap_or(DEFAULT_MILLI_CPU),
                    memory: mem.filter(|v| *v > 0).unwrap_or(DEFAULT_MEMORY),
                });
            }
            for c in spec.init_containers.iter().flatten() {
                let (cpu, mem) = of(c);
                init = init.max(Resources {
                    cpu_milli: cpu.unwrap_or(0),
                    memory: mem.unwrap_or(0),
                });
            }
        }
        requests = requests.max(init);
        let meta = &pod.metadata;
        let claims = pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|v| {
                if let Some(c) = &v.persistent_volume_claim {
                    Some(PodClaim {
                        name: c.claim_name.clone(),
                        ephemeral: false,
                    })
                } else {
                    v.ephemeral.as_ref().map(|_| PodClaim {
                        name: format!("{}-{}", meta.name.as_deref().unwrap_or(""), v.name),
                        ephemeral: true,
                    })
                }
            })
            .collect();
        let spread_key = match meta
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
        {
            Some(owner) => format!("owner:{}", owner.uid),
            None => {
                let labels: Vec<String> = meta
                    .labels
                    .iter()
                    .flatten()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                format!(
                    "labels:{}/{}",
                    meta.namespace.as_deref().unwrap_or(""),
                    labels.join(",")
                )
            }
        };
        PodInfo {
            uid: meta.uid.clone().unwrap_or_default(),
            pod,
            requests,
            nonzero,
            spread_key,
            claims,
        }
    }

    pub(super) fn namespace(&self) -> &str {
        self.pod.metadata.namespace.as_deref().unwrap_or("")
    }

    pub(super) fn anti_affinity_terms(&self) -> &[PodAffinityTerm] {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.pod_anti_affinity.as_ref())
            .and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_deref()
            })
            .unwrap_or(&[])
    }
}

/// Whether this scheduler is to place `pod`: it asks for it (or for none) and has no node.
pub(super) fn responsible_for(pod: &Pod) -> bool {
    let spec = pod.spec.as_ref();
    let name = spec.and_then(|s| s.scheduler_name.as_deref()).unwrap_or("");
    (name.is_empty() || name == SCHEDULER_NAME)
        && spec
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or("")
            .is_empty()
}

/// Whether `pod` has a node.
pub(super) fn is_bound(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty())
}

/// Whether `pod` has finished (Succeeded or Failed).
pub(super) fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}
