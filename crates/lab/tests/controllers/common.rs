//! Shared fixtures: an API server with the controllers running, polling with a deadline,
//! and a stand-in kubelet that marks pods Ready.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tandem_apiserver::{ApiServer, Config};
use tokio::task::JoinHandle;

/// How long `eventually` waits before failing a test.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// A running API server with every controller attached.
pub struct Cluster {
    /// The server under test.
    pub server: ApiServer,
    /// A client in group system:masters.
    pub client: kube::Client,
    controllers: JoinHandle<()>,
}

impl Cluster {
    /// An in-memory server plus `controllers::run_all`.
    pub async fn start() -> Cluster {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "warn".into()),
            )
            .with_test_writer()
            .try_init();
        let server = ApiServer::start(Config::default())
            .await
            .expect("server starts");
        let client = server.client().await.expect("admin client");
        let controllers = spawn_controllers(&server, &client);
        Cluster {
            server,
            client,
            controllers,
        }
    }

    /// Stops the controllers, as a controller-manager going down.
    pub async fn stop_controllers(&mut self) {
        self.controllers.abort();
        let _ = (&mut self.controllers).await;
    }

    /// Starts fresh controllers: they must pick up from what the API server holds.
    pub fn start_controllers(&mut self) {
        self.controllers = spawn_controllers(&self.server, &self.client);
    }

    /// Creates namespace `name`.
    pub async fn namespace(&self, name: &str) {
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("namespace created");
    }
}

fn spawn_controllers(server: &ApiServer, client: &kube::Client) -> JoinHandle<()> {
    let ca = server.state().pki.ca.clone();
    let client = client.clone();
    tokio::spawn(async move {
        if let Err(e) = tandem_lab::controllers::run_all(client, ca).await {
            panic!("controllers stopped: {e:#}");
        }
    })
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.controllers.abort();
    }
}

/// Polls `check` every 50 ms until it returns Some, failing the test with `what` after
/// DEADLINE.
pub async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    tandem_testing::until_every(what, DEADLINE, Duration::from_millis(50), check).await
}

/// Plays the kubelet: the pod runs with `ip` and is Ready (or not).
pub async fn set_pod_status(client: &kube::Client, ns: &str, name: &str, ip: &str, ready: bool) {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let status = json!({"status": {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }, "lastTransitionTime": now}],
    }});
    Api::<Pod>::namespaced(client.clone(), ns)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap_or_else(|e| panic!("pod {ns}/{name}: setting status: {e}"));
}

/// A fresh pod IP for each call (10.77.x.y).
pub fn next_ip() -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("10.77.{}.{}", n / 250, n % 250 + 1)
}

/// Whether the pod is Ready and not being deleted.
pub fn ready_and_active(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Runs the real `kubectl` as the admin; returns whether it succeeded and its output.
pub async fn kubectl(cluster: &Cluster, args: &[&str]) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    cluster.server.write_admin_kubeconfig(&kubeconfig).unwrap();
    tandem_testing::kubectl(&kubeconfig, dir.path(), args, None).await
}
