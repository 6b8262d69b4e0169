//! Waiting for the controller's Deployment to be rolled out, and saying why it is not: what
//! `tandem install` does after applying the manifests (unless `--wait=false`).
//!
//! The rollout is complete when `kubectl rollout status` would say so (the Deployment's
//! controller has seen the newest spec, every replica is updated and available, no old one is
//! left). A pod that cannot pull its image, or whose container keeps crashing, fails the wait
//! at once with the pod, the image or the exit, and the fix: kubelet retries them with a
//! back-off that would only run the wait into its timeout.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use tandem_api::names;

/// How often the rollout is looked at.
const POLL: Duration = Duration::from_millis(500);

/// Why the controller did not become Ready.
#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    #[error(
        "the controller's pod {namespace}/{pod} cannot pull its image {image} ({reason}: \
         {message}).\nLoad the image onto the cluster's nodes, or push it to a registry they \
         reach, and install again:\n  kind:         kind load docker-image {image} --name \
         CLUSTER\n  Tandem's lab: tandem lab load-image {image}\n  a registry:   docker build -f \
         deploy/image/Dockerfile -t REGISTRY/tandem:TAG . && docker push REGISTRY/tandem:TAG, \
         then tandem install --image REGISTRY/tandem:TAG",
        namespace = names::SYSTEM_NAMESPACE
    )]
    ImagePull {
        pod: String,
        image: String,
        reason: String,
        message: String,
    },
    #[error(
        "the controller's pod {namespace}/{pod} cannot start its container {container} \
         ({reason}{exit}){message}; see `kubectl -n {namespace} logs {pod} -c {container} \
         --previous` and `kubectl -n {namespace} describe pod {pod}`",
        namespace = names::SYSTEM_NAMESPACE,
        exit = exit_code.map(|c| format!(", last exit code {c}")).unwrap_or_default(),
        message = message.as_deref().map(|m| format!(": {m}")).unwrap_or_default()
    )]
    Container {
        pod: String,
        container: String,
        reason: String,
        exit_code: Option<i32>,
        message: Option<String>,
    },
    #[error(
        "the controller (Deployment {namespace}/{deployment}) was not Ready after {timeout:?}: \
         {waiting}; `kubectl -n {namespace} describe deployment {deployment}` says more, and \
         `tandem install --wait=false` does not wait",
        namespace = names::SYSTEM_NAMESPACE,
        deployment = names::CONTROLLER_NAME
    )]
    Timeout { timeout: Duration, waiting: String },
    #[error(
        "restarting the controller's pod {namespace}/{pod}, stuck from before this install",
        namespace = names::SYSTEM_NAMESPACE
    )]
    Restart {
        pod: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "the controller now running (pod {namespace}/{holder}, image {image}, tandem {version}) \
         speaks peering protocol v{theirs}, and this tandem {ours_version} speaks v{ours}: it \
         would misread what this CLI and its peers write. Tandem is applied but must not be \
         used this way: install again with an image of tandem {ours_version} or newer \
         (tandem install --image REPOSITORY/tandem:{ours_version}), or use the CLI of the \
         controller's version",
        namespace = names::SYSTEM_NAMESPACE,
        version = version.as_deref().unwrap_or("(unknown version)"),
        ours = tandem_core::protocol::VERSION,
        ours_version = env!("CARGO_PKG_VERSION")
    )]
    OlderProtocol {
        holder: String,
        image: String,
        version: Option<String>,
        theirs: u32,
    },
    #[error("reading the controller's {what} in {namespace}", namespace = names::SYSTEM_NAMESPACE)]
    Read {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
}

/// Waiting reasons of a container whose image will not come without a change by the admin.
const PULL_FAILURES: [&str; 3] = ["ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName"];
/// Waiting reasons of a container that cannot start or keeps stopping.
const START_FAILURES: [&str; 4] = [
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

/// Waits until the controller's Deployment is rolled out (at most `timeout`); `progress` hears
/// what it waits for whenever that changes.
pub async fn wait_for_controller(
    client: &Client,
    timeout: Duration,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<(), RolloutError> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), names::SYSTEM_NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(client.clone(), names::SYSTEM_NAMESPACE);
    let selector = format!("app.kubernetes.io/name={}", names::CONTROLLER_NAME);
    let deadline = tokio::time::Instant::now() + timeout;
    let started = k8s_openapi::jiff::Timestamp::now();
    let mut restarted = std::collections::BTreeSet::new();
    let mut said = String::new();
    loop {
        let deployment = deployments
            .get(names::CONTROLLER_NAME)
            .await
            .map_err(|source| RolloutError::Read {
                what: "Deployment",
                source,
            })?;
        let waiting = match rollout_waits_for(&deployment) {
            None => return Ok(()),
            Some(w) => w,
        };
        let listed = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|source| RolloutError::Read {
                what: "pods",
                source,
            })?;
        let mut status = waiting;
        for pod in listed
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
        {
            match stuck(pod) {
                Ok(Some(stuck)) => status = stuck,
                Ok(None) => {}
                // A pod stuck since before this install (an image loaded meanwhile, a fixed
                // setting) is restarted once, as `kubectl delete pod` would: kubelet would
                // otherwise try again only when its back-off ends, up to minutes later.
                Err(e) if older_than(pod, started) && restarted.insert(pod.name_any()) => {
                    restart(&pods, pod).await?;
                    let why = e.to_string();
                    let why = why.lines().next().unwrap_or_default();
                    status = format!("restarting a pod stuck from before this install: {why}");
                }
                Err(e) => return Err(e),
            }
        }
        if status != said {
            progress(&status);
            said = status;
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(RolloutError::Timeout {
                timeout,
                waiting: said,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// What the controller holding the leader Lease says of itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunningController {
    /// The Lease's holder: a pod's name in the cluster (the host's name for a controller a
    /// hollow lab's user runs on the host).
    pub holder: String,
    pub version: Option<String>,
    /// A controller from before the annotation speaks the first version.
    pub protocol: u32,
}

/// The controller holding the leader Lease, once one of the Deployment's current pods holds it
/// (any holder in a hollow lab cluster, whose pods run no process), waiting at most `timeout`.
/// None when there is no Lease (the controller runs without `--leader-elect`) or no current
/// pod took it in time.
pub async fn running_controller(
    client: &Client,
    timeout: Duration,
) -> Result<Option<RunningController>, RolloutError> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), names::SYSTEM_NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(client.clone(), names::SYSTEM_NAMESPACE);
    let hollow = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .get_opt("kube-system")
        .await
        .map_err(|source| RolloutError::Read {
            what: "kube-system Namespace",
            source,
        })?
        .is_some_and(|ns| {
            ns.labels()
                .get(names::HOLLOW_CLUSTER_LABEL)
                .is_some_and(|v| v == "true")
        });
    let selector = format!("app.kubernetes.io/name={}", names::CONTROLLER_NAME);
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let lease = leases
            .get_opt(names::CONTROLLER_NAME)
            .await
            .map_err(|source| RolloutError::Read {
                what: "leader Lease",
                source,
            })?;
        let Some(lease) = lease else { return Ok(None) };
        let holder = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.clone())
            .filter(|h| !h.is_empty());
        if let Some(identity) = holder {
            // A replica's identity is its pod's name (its hostname) and a random suffix, as
            // client-go's leader election makes it: `<pod>_<hex>`.
            let holder = match identity.rsplit_once('_') {
                Some((pod, _)) => pod.to_string(),
                None => identity,
            };
            let current = hollow
                || pods
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .map_err(|source| RolloutError::Read {
                        what: "pods",
                        source,
                    })?
                    .items
                    .iter()
                    .any(|p| p.metadata.deletion_timestamp.is_none() && p.name_any() == holder);
            if current {
                let said = |key: &str| lease.annotations().get(key).cloned();
                return Ok(Some(RunningController {
                    holder,
                    version: said(names::CONTROLLER_VERSION_ANNOTATION),
                    protocol: said(names::PEERING_PROTOCOL_ANNOTATION)
                        .and_then(|p| p.parse().ok())
                        .unwrap_or_else(tandem_core::protocol::unversioned),
                }));
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Refuses a running controller that speaks an older peering protocol than this CLI: what it
/// would do with the objects this CLI writes (invites, peering requests) is not known.
/// Returns what was checked (None: nothing could be, see [`running_controller`]).
pub async fn check_controller_protocol(
    client: &Client,
    timeout: Duration,
) -> Result<Option<RunningController>, RolloutError> {
    let Some(running) = running_controller(client, timeout).await? else {
        return Ok(None);
    };
    if running.protocol >= tandem_core::protocol::VERSION {
        return Ok(Some(running));
    }
    let image = Api::<Deployment>::namespaced(client.clone(), names::SYSTEM_NAMESPACE)
        .get_opt(names::CONTROLLER_NAME)
        .await
        .ok()
        .flatten()
        .and_then(|d| d.spec?.template.spec?.containers.first()?.image.clone())
        .unwrap_or_else(|| "-".into());
    Err(RolloutError::OlderProtocol {
        holder: running.holder,
        image,
        version: running.version,
        theirs: running.protocol,
    })
}

/// Whether `pod` was created before `t` (with a second's grace for clock skew).
fn older_than(pod: &Pod, t: k8s_openapi::jiff::Timestamp) -> bool {
    pod.metadata
        .creation_timestamp
        .as_ref()
        .is_some_and(|c| c.0 < t - k8s_openapi::jiff::SignedDuration::from_secs(1))
}

/// Deletes `pod` (this very one, by UID) so that its ReplicaSet makes a new one.
async fn restart(pods: &Api<Pod>, pod: &Pod) -> Result<(), RolloutError> {
    let dp = kube::api::DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match pods.delete(&pod.name_any(), &dp).await {
        Ok(_) => Ok(()),
        Err(e) if tandem_api::client::is_not_found(&e) || tandem_api::client::is_conflict(&e) => {
            Ok(())
        }
        Err(source) => Err(RolloutError::Restart {
            pod: pod.name_any(),
            source,
        }),
    }
}

/// What the rollout of `d` still waits for, as `kubectl rollout status` reads it; None when
/// it is complete.
fn rollout_waits_for(d: &Deployment) -> Option<String> {
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let s = d.status.clone().unwrap_or_default();
    let generation = d.metadata.generation.unwrap_or(0);
    let updated = s.updated_replicas.unwrap_or(0);
    let available = s.available_replicas.unwrap_or(0);
    let total = s.replicas.unwrap_or(0);
    if s.observed_generation.unwrap_or(0) < generation {
        Some("the Deployment's new spec is not yet seen by its controller".into())
    } else if updated < want {
        Some(format!("{updated} of {want} replicas updated"))
    } else if total > updated {
        Some(format!("{} old replicas still running", total - updated))
    } else if available < updated {
        Some(format!(
            "{available} of {updated} updated replicas available (Ready)"
        ))
    } else {
        None
    }
}

/// What keeps `pod` from running, as a progress line; an error when it will not get better by
/// waiting (an image that does not pull, a container that keeps failing).
fn stuck(pod: &Pod) -> Result<Option<String>, RolloutError> {
    let name = pod.name_any();
    let status = pod.status.clone().unwrap_or_default();
    let containers: Vec<&ContainerStatus> = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .collect();
    for c in &containers {
        let Some(waiting) = c.state.as_ref().and_then(|s| s.waiting.as_ref()) else {
            continue;
        };
        let reason = waiting.reason.clone().unwrap_or_default();
        let message = waiting.message.clone();
        if PULL_FAILURES.contains(&reason.as_str()) {
            return Err(RolloutError::ImagePull {
                pod: name,
                image: c.image.clone(),
                reason,
                message: message.unwrap_or_default(),
            });
        }
        if START_FAILURES.contains(&reason.as_str()) {
            let last = c.last_state.as_ref().and_then(|s| s.terminated.as_ref());
            return Err(RolloutError::Container {
                pod: name,
                container: c.name.clone(),
                reason,
                exit_code: last.map(|t| t.exit_code),
                message: last.and_then(|t| t.message.clone()).or(message),
            });
        }
        return Ok(Some(format!("pod {name}: container {} {reason}", c.name)));
    }
    let unscheduled = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False");
    Ok(unscheduled.map(|c| {
        format!(
            "pod {name} not scheduled: {}",
            c.message.clone().unwrap_or_default()
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(containers: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "tandem-controller-abc"},
            "status": {"phase": "Pending", "containerStatuses": containers}}))
        .unwrap()
    }

    #[test]
    fn a_pull_back_off_names_the_image_and_how_to_load_it() {
        let p = pod(
            json!([{"name": "controller", "image": "ghcr.io/tandem-dev/tandem:0.1.0",
            "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ImagePullBackOff",
                                  "message": "Back-off pulling image"}}}]),
        );
        let e = stuck(&p).unwrap_err().to_string();
        assert!(e.contains("tandem-system/tandem-controller-abc"), "{e}");
        assert!(
            e.contains("kind load docker-image ghcr.io/tandem-dev/tandem:0.1.0"),
            "{e}"
        );
        assert!(
            e.contains("tandem lab load-image ghcr.io/tandem-dev/tandem:0.1.0"),
            "{e}"
        );
        assert!(e.contains("--image"), "{e}");
    }

    #[test]
    fn a_crash_loop_names_the_exit_and_where_the_logs_are() {
        let p = pod(
            json!([{"name": "controller", "image": "x", "imageID": "", "ready": false,
            "restartCount": 3, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 2, "message": "bad flag"}}}]),
        );
        let e = stuck(&p).unwrap_err().to_string();
        assert!(
            e.contains("(CrashLoopBackOff, last exit code 2): bad flag"),
            "{e}"
        );
        assert!(
            e.contains("logs tandem-controller-abc -c controller --previous"),
            "{e}"
        );
    }

    #[test]
    fn creating_or_pulling_is_waited_for() {
        let p = pod(
            json!([{"name": "controller", "image": "x", "imageID": "", "ready": false,
            "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}}]),
        );
        assert_eq!(
            stuck(&p).unwrap().as_deref(),
            Some("pod tandem-controller-abc: container controller ContainerCreating")
        );
    }

    #[test]
    fn the_rollout_is_complete_as_kubectl_rollout_status_says() {
        let d = |generation: i64, status: serde_json::Value| -> Deployment {
            serde_json::from_value(json!({"metadata": {"name": "d", "generation": generation},
                "spec": {"replicas": 1, "selector": {}, "template": {}}, "status": status}))
            .unwrap()
        };
        let done = json!({"observedGeneration": 2, "replicas": 1, "updatedReplicas": 1,
                          "availableReplicas": 1});
        assert_eq!(rollout_waits_for(&d(2, done.clone())), None);
        assert!(rollout_waits_for(&d(3, done)).is_some());
        let old_left = json!({"observedGeneration": 2, "replicas": 2, "updatedReplicas": 1,
                              "availableReplicas": 1});
        assert!(
            rollout_waits_for(&d(2, old_left))
                .unwrap()
                .contains("old replicas")
        );
        let unready = json!({"observedGeneration": 2, "replicas": 1, "updatedReplicas": 1});
        assert!(
            rollout_waits_for(&d(2, unready))
                .unwrap()
                .contains("0 of 1")
        );
    }
}
