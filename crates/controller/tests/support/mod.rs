//! Shared fixtures of the controller's end-to-end tests: lab clusters with Tandem installed and
//! a controller running, peerings between them, polling with deadlines.
#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tandem_api::{Peering, Tenant, names};
use tandem_controller::{Controller, Options};
use tandem_lab::{LabCluster, LabConfig};

/// A lab cluster with Tandem installed and its controller running in this process.
pub struct Cluster {
    pub id: String,
    pub lab: LabCluster,
    pub client: Client,
    pub controller: Option<Controller>,
}

/// Controller timings short enough for tests.
pub fn test_options() -> Options {
    Options {
        heartbeat: Duration::from_millis(500),
        provider_grace: Duration::from_secs(3),
        ..Options::default()
    }
}

impl Cluster {
    /// Starts a lab cluster named `id` in `region` with `nodes` hollow nodes, installs Tandem
    /// with cluster ID `id` and starts its controller.
    pub async fn start(id: &str, region: &str, nodes: usize) -> Cluster {
        init_tracing();
        let lab = LabCluster::start(LabConfig {
            name: id.to_string(),
            region: region.to_string(),
            nodes,
            node_monitor_grace_period: Duration::from_secs(5),
            ..Default::default()
        })
        .await
        .expect("lab cluster starts");
        let client = lab.client.clone();
        let options = tandem_controller::install::InstallOptions {
            cluster_id: Some(id.to_string()),
            pod_cidr: Some(lab.config.pod_cidr.clone()),
            ..Default::default()
        };
        tandem_controller::install::install(&client, &options, &mut |_| {})
            .await
            .expect("tandem install");
        let controller = Controller::start(client.clone(), test_options())
            .await
            .expect("controller starts");
        Cluster {
            id: id.to_string(),
            lab,
            client,
            controller: Some(controller),
        }
    }

    /// Stops the controller as SIGKILL would (no cleanup).
    pub fn kill_controller(&mut self) {
        if let Some(c) = self.controller.take() {
            c.shutdown();
        }
    }

    /// Starts the controller again.
    pub async fn restart_controller(&mut self) {
        self.kill_controller();
        self.controller = Some(
            Controller::start(self.client.clone(), test_options())
                .await
                .expect("controller starts"),
        );
    }
}

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

/// Polls `check` every 100 ms until it returns Some, panicking with `what` after `timeout`.
pub async fn until<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Stands in for the invite flow until it lands: creates on the provider what an accepted
/// peering request creates (tenant namespace, Tenant with `grant`, the peer identity's
/// RoleBinding) and on the consumer an authenticated Peering with the identity Secret.
/// `provider_url` overrides the API endpoint the consumer uses (e.g. a TCP gate).
pub async fn fake_peering(
    consumer: &Cluster,
    provider: &Cluster,
    grant: serde_json::Value,
    provider_url: Option<String>,
) {
    let user = names::peer_user(&consumer.id);
    let remote_tenant = names::tenant_namespace(&consumer.id);
    let local_tenant = names::tenant_namespace(&provider.id);
    let pp = PatchParams::apply("test").force();
    let managed = json!({names::MANAGED_BY_LABEL: names::MANAGED_BY});

    // Provider side.
    let ns: Api<Namespace> = Api::all(provider.client.clone());
    ns.patch(
        &remote_tenant,
        &pp,
        &Patch::Apply(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": remote_tenant, "labels": {
                names::MANAGED_BY_LABEL: names::MANAGED_BY,
                names::TENANT_NAMESPACE_LABEL: "true",
                names::REMOTE_CLUSTER_LABEL: consumer.id,
            }},
        })),
    )
    .await
    .expect("tenant namespace");
    let tenants: Api<Tenant> = Api::namespaced(provider.client.clone(), &remote_tenant);
    tenants.patch(&consumer.id, &pp, &Patch::Apply(json!({
        "apiVersion": "tandem.dev/v1alpha1", "kind": "Tenant",
        "metadata": {"name": consumer.id, "labels": managed},
        "spec": {"clusterID": consumer.id, "grant": grant,
                 "nodeLabels": {"topology.kubernetes.io/region": provider.lab.config.region}},
    }))).await.expect("tenant");
    let rb: Api<RoleBinding> = Api::namespaced(provider.client.clone(), &remote_tenant);
    rb.patch(
        "tandem:peer",
        &pp,
        &Patch::Apply(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "tandem:peer", "labels": managed},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": tandem_controller::rbac::PEER_TENANT_ROLE},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        })),
    )
    .await
    .expect("tenant role binding");
    let mut kubeconfig = provider
        .lab
        .server
        .kubeconfig_for(&user, &[names::PEERS_GROUP])
        .expect("peer kubeconfig");
    if let Some(url) = &provider_url {
        kubeconfig = kubeconfig.replace(&provider.lab.server.url(), url);
    }

    // Consumer side.
    let ns: Api<Namespace> = Api::all(consumer.client.clone());
    ns.patch(
        &local_tenant,
        &pp,
        &Patch::Apply(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": local_tenant, "labels": {
                names::MANAGED_BY_LABEL: names::MANAGED_BY,
                names::TENANT_NAMESPACE_LABEL: "true",
                names::REMOTE_CLUSTER_LABEL: provider.id,
            }},
        })),
    )
    .await
    .expect("local tenant namespace");
    let secret_name = tandem_controller::consumer::link::identity_secret_name(&provider.id);
    let secrets: Api<Secret> = Api::namespaced(consumer.client.clone(), &local_tenant);
    secrets.patch(&secret_name, &pp, &Patch::Apply(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": secret_name, "labels": managed},
        "stringData": {tandem_controller::consumer::link::IDENTITY_KUBECONFIG_KEY: kubeconfig},
    }))).await.expect("identity secret");
    let peerings: Api<Peering> = Api::all(consumer.client.clone());
    let peering: Peering = serde_json::from_value(json!({
        "apiVersion": "tandem.dev/v1alpha1", "kind": "Peering",
        "metadata": {"name": provider.id, "labels": managed},
        "spec": {"clusterID": provider.id, "endpoint": provider_url.clone().unwrap_or(provider.lab.server.url()),
                 "caData": provider.lab.server.ca_pem()},
    })).unwrap();
    let created = peerings
        .create(&PostParams::default(), &peering)
        .await
        .expect("peering");
    let now = chrono_now();
    let cond = |t: &str| json!({"type": t, "status": "True", "reason": "Test", "message": "", "lastTransitionTime": now});
    peerings.patch_status(&provider.id, &PatchParams::default(), &Patch::Merge(json!({
        "metadata": {"resourceVersion": created.metadata.resource_version},
        "status": {
            "phase": "Established",
            "conditions": [cond("Authenticated"), cond("ResourcesGranted"), cond("NetworkNegotiated")],
            "identitySecret": secret_name,
            "remoteTenantNamespace": remote_tenant,
            "granted": grant,
            "nodeLabels": {"topology.kubernetes.io/region": provider.lab.config.region},
            "network": {
                "remotePodCidr": provider.lab.config.pod_cidr,
                "remappedRemotePodCidr": remap_of(&provider.lab.config.pod_cidr),
                "localPodCidrInRemote": remap_of(&consumer.lab.config.pod_cidr),
            },
        },
    }))).await.expect("peering status");
}

/// The remap the fake peering pretends the IPAM chose: 10.244.0.0/16 → 10.245.0.0/16.
fn remap_of(cidr: &str) -> String {
    cidr.replacen("10.244.", "10.245.", 1)
}

fn chrono_now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}
