//! Shared fixtures of the controller's end-to-end tests: lab clusters with Tandem installed and
//! a controller running, peerings between them, polling with deadlines.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, Node, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::discovery::Discovery;
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tandem_api::{Peering, Tenant, names};
use tandem_controller::{Controller, Options};
use tandem_lab::{LabCluster, LabConfig};

/// A lab cluster with Tandem installed and its controller running in this process.
pub struct Cluster {
    pub id: String,
    pub lab: LabCluster,
    /// The administrator's client.
    pub client: Client,
    /// The controller's own client: its ServiceAccount, confined by the ClusterRole
    /// `tandem install` binds to it, as in a real deployment.
    pub controller_client: Client,
    pub controller: Option<Controller>,
}

/// The user the controller's ServiceAccount authenticates as.
pub const CONTROLLER_USER: &str = "system:serviceaccount:tandem-system:tandem-controller";

/// A client that authenticates as the controller's ServiceAccount.
pub async fn controller_client(lab: &LabCluster) -> Client {
    let kubeconfig = lab
        .server
        .kubeconfig_for(
            CONTROLLER_USER,
            &[
                "system:serviceaccounts",
                "system:serviceaccounts:tandem-system",
            ],
        )
        .expect("kubeconfig for the controller");
    tandem_apiserver::client_from_kubeconfig(&kubeconfig)
        .await
        .expect("controller client")
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
        Cluster::start_in(id, region, nodes, None).await
    }

    /// As [`Cluster::start`], its API server keeping its objects in `data_dir` (so that it
    /// can be restarted).
    pub async fn start_in(
        id: &str,
        region: &str,
        nodes: usize,
        data_dir: Option<std::path::PathBuf>,
    ) -> Cluster {
        init_tracing();
        let lab = LabCluster::start(LabConfig {
            name: id.to_string(),
            region: region.to_string(),
            nodes,
            node_monitor_grace_period: Duration::from_secs(5),
            data_dir,
            ..Default::default()
        })
        .await
        .expect("lab cluster starts");
        let client = lab.client.clone();
        let options = tandem_admin::install::InstallOptions {
            cluster_id: Some(id.to_string()),
            pod_cidr: Some(lab.config.pod_cidr.clone()),
            ..Default::default()
        };
        tandem_admin::install::install(&client, &options, &mut |_| {})
            .await
            .expect("tandem install");
        let controller_client = controller_client(&lab).await;
        let controller = Controller::start(controller_client.clone(), test_options())
            .await
            .expect("controller starts");
        Cluster {
            id: id.to_string(),
            lab,
            client,
            controller_client,
            controller: Some(controller),
        }
    }

    /// Stops the controller as SIGKILL would (no cleanup).
    pub fn kill_controller(&mut self) {
        if let Some(c) = self.controller.take() {
            c.shutdown();
        }
    }

    /// Restarts the API server as a crash of its process would (see `start_in`).
    pub async fn restart_api_server(&mut self) {
        self.lab
            .restart_api_server()
            .await
            .expect("API server restarts");
    }

    /// Starts the controller again.
    pub async fn restart_controller(&mut self) {
        self.restart_controller_with(test_options()).await;
    }

    /// Starts the controller again with `options`.
    pub async fn restart_controller_with(&mut self, options: Options) {
        self.kill_controller();
        self.controller = Some(
            Controller::start(self.controller_client.clone(), options)
                .await
                .expect("controller starts"),
        );
    }
}

fn init_tracing() {
    init_tracing_at("warn");
}

/// Logs at `default` (unless RUST_LOG says otherwise); the first call in a test process wins.
/// Tests that cause faults on purpose log less, so that what fails stays in sight.
pub fn init_tracing_at(default: &str) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default.into()),
        )
        .with_test_writer()
        .try_init();
}

pub use tandem_testing::until;

/// Peers `consumer` with `provider` through the real invite flow, the consumer reaching the
/// provider at `provider_url` (default: its API server; a `TcpGate` for partitions), then sets the
/// consumer's grant on the provider to `grant` (as the provider's admin would) and waits until
/// the consumer sees it. Returns the Established Peering.
pub async fn peer_with(
    consumer: &Cluster,
    provider: &Cluster,
    grant: serde_json::Value,
    provider_url: Option<String>,
) -> Peering {
    let endpoint = provider_url.unwrap_or_else(|| provider.lab.server.url());
    let invite = invite_at(provider, &endpoint, Duration::from_secs(3600)).await;
    accept(consumer, provider, &invite).await;
    let tenants: Api<Tenant> = Api::namespaced(
        provider.client.clone(),
        &names::tenant_namespace(&consumer.id),
    );
    // Replace the whole grant (a merge patch would keep resources `grant` does not name).
    let mut patch = grant.clone();
    let current = tenants.get(&consumer.id).await.expect("the Tenant");
    for key in current.spec.grant.keys() {
        if patch.get(key).is_none() {
            patch[key.as_str()] = serde_json::Value::Null;
        }
    }
    tenants
        .patch(
            &consumer.id,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"grant": patch}})),
        )
        .await
        .expect("set the grant");
    let want: std::collections::BTreeMap<String, String> =
        serde_json::from_value(grant).expect("grant is a map of quantities");
    let peerings: Api<Peering> = Api::all(consumer.client.clone());
    until(
        "the consumer to see the grant",
        Duration::from_secs(30),
        || async {
            let p = peerings.get(&provider.id).await.ok()?;
            let granted: std::collections::BTreeMap<String, String> = p
                .status
                .as_ref()?
                .granted
                .iter()
                .map(|(k, v)| (k.clone(), v.0.clone()))
                .collect();
            (granted == want).then_some(p)
        },
    )
    .await
}

/// The CIDR the consumer sees the provider's pods in (the IPAM's remap), and the provider's own.
pub fn remote_pod_cidrs(peering: &Peering) -> (ipnet::IpNet, ipnet::IpNet) {
    let n = peering
        .status
        .as_ref()
        .and_then(|s| s.network.as_ref())
        .expect("negotiated network");
    (
        n.remapped_remote_pod_cidr.parse().expect("remapped CIDR"),
        n.remote_pod_cidr.parse().expect("remote CIDR"),
    )
}

/// Offloads namespace `ns` (created if missing) with the Remote strategy to every provider and
/// waits until its twin namespaces are Ready. Returns the twin namespace on `provider`.
pub async fn offload_remote(consumer: &Cluster, provider: &Cluster, ns: &str) -> String {
    offload(consumer, provider, ns, "Remote").await
}

/// Offloads namespace `ns` (created if missing) with pod offloading `strategy` to every
/// provider and waits until its twin namespaces are Ready. Returns the twin namespace on
/// `provider`.
pub async fn offload(consumer: &Cluster, provider: &Cluster, ns: &str, strategy: &str) -> String {
    let pp = PatchParams::apply("test").force();
    let namespaces: Api<Namespace> = Api::all(consumer.client.clone());
    namespaces
        .patch(
            ns,
            &pp,
            &Patch::Apply(
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
            ),
        )
        .await
        .expect("offloaded namespace");
    let nsos: Api<tandem_api::NamespaceOffloading> = Api::namespaced(consumer.client.clone(), ns);
    nsos.patch(
        names::OFFLOADING_NAME,
        &pp,
        &Patch::Apply(json!({
            "apiVersion": "tandem.dev/v1alpha1", "kind": "NamespaceOffloading",
            "metadata": {"name": names::OFFLOADING_NAME},
            "spec": {"podOffloadingStrategy": strategy},
        })),
    )
    .await
    .expect("namespace offloading");
    until(
        "the twin namespace Ready",
        Duration::from_secs(30),
        || async {
            let o = nsos.get(names::OFFLOADING_NAME).await.ok()?;
            o.status?
                .remote_namespaces
                .into_iter()
                .find(|r| r.cluster_id == provider.id && r.phase == "Ready")
                .map(|r| r.namespace)
        },
    )
    .await
}

/// A twin namespace made by hand (what a RemoteNamespace makes): the namespace `<ns>-<consumer>` and the peer
/// identity's RoleBinding in it.
pub async fn fake_twin_namespace(consumer: &Cluster, provider: &Cluster, ns: &str) -> String {
    let twin = format!("{ns}-{}", consumer.id);
    let pp = PatchParams::apply("test").force();
    let namespaces: Api<Namespace> = Api::all(provider.client.clone());
    namespaces
        .patch(
            &twin,
            &pp,
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": twin, "labels": {
                    names::MANAGED_BY_LABEL: names::MANAGED_BY,
                    names::TWIN_NAMESPACE_LABEL: "true",
                    names::REMOTE_CLUSTER_LABEL: consumer.id,
                    names::ORIGIN_CLUSTER_LABEL: consumer.id,
                    names::ORIGIN_NAMESPACE_LABEL: ns,
                }},
            })),
        )
        .await
        .expect("twin namespace");
    let rb: Api<RoleBinding> = Api::namespaced(provider.client.clone(), &twin);
    rb.patch(
        "tandem:peer",
        &pp,
        &Patch::Apply(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "tandem:peer", "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": tandem_controller::rbac::PEER_TWIN_ROLE},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                          "name": names::peer_user(&consumer.id)}],
        })),
    )
    .await
    .expect("twin role binding");
    twin
}

/// A plain Deployment, as a user writes it: no tolerations, no affinity (the placement webhook
/// adds what the namespace's strategy asks for).
pub fn deployment(name: &str, replicas: i32) -> serde_json::Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "main", "image": "nginx",
                    "ports": [{"containerPort": 8080}],
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]},
            },
        },
    })
}

/// A Deployment whose pods tolerate virtual nodes and must run on one (what the placement
/// webhook adds for the Remote strategy).
pub fn offloaded_deployment(name: &str, replicas: i32) -> serde_json::Value {
    let mut d = deployment(name, replicas);
    let spec = &mut d["spec"]["template"]["spec"];
    spec["tolerations"] =
        json!([{"key": names::VIRTUAL_NODE_TAINT, "operator": "Exists", "effect": "NoExecute"}]);
    spec["nodeSelector"] = json!({names::NODE_TYPE_LABEL: names::VIRTUAL_NODE_TYPE});
    d
}

/// Peers `consumer` with `provider` through the real invite flow (what `tandem invite` then
/// `tandem peer` do) and waits until the Peering is Established.
pub async fn peer(consumer: &Cluster, provider: &Cluster) -> Peering {
    let invite = invite(provider, Duration::from_secs(3600)).await;
    accept(consumer, provider, &invite).await
}

/// Accepts `invite` on `consumer` (what `tandem peer` does) and waits until the Peering with
/// `provider` is Established.
async fn accept(
    consumer: &Cluster,
    provider: &Cluster,
    invite: &tandem_core::invite::PeeringInvite,
) -> Peering {
    tandem_admin::invite::accept(&consumer.client, invite)
        .await
        .expect("accept invite");
    tandem_admin::invite::wait_established(
        &consumer.client,
        &provider.id,
        Duration::from_secs(30),
        &mut |_| {},
    )
    .await
    .expect("peering established")
}

/// Lets `consumer` name its twin namespaces on `provider` as it likes (same or selected names),
/// as the provider's admin would: by default only `<namespace>-<consumer>` is allowed.
pub async fn allow_namespace_mappings(provider: &Cluster, consumer: &str) {
    Api::<Tenant>::namespaced(provider.client.clone(), &names::tenant_namespace(consumer))
        .patch(
            consumer,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"allowedNamespaceMappingStrategies":
                ["DefaultName", "EnforceSameName", "SelectedName"]}})),
        )
        .await
        .expect("allow the namespace mapping strategies");
}

/// Creates an invite on `provider` valid for `ttl`.
pub async fn invite(provider: &Cluster, ttl: Duration) -> tandem_core::invite::PeeringInvite {
    invite_at(provider, &provider.lab.server.url(), ttl).await
}

/// Creates an invite on `provider` valid for `ttl` that sends consumers to `endpoint`.
async fn invite_at(
    provider: &Cluster,
    endpoint: &str,
    ttl: Duration,
) -> tandem_core::invite::PeeringInvite {
    tandem_admin::invite::create(
        &provider.client,
        endpoint,
        provider.lab.server.ca_pem(),
        ttl,
    )
    .await
    .expect("create invite")
}

/// `ip` moved from prefix `from` to prefix `to` (same host part), as the prefix NAT does.
pub fn translate(ip: &str, from: ipnet::IpNet, to: ipnet::IpNet) -> String {
    let (std::net::IpAddr::V4(ip), ipnet::IpNet::V4(from), ipnet::IpNet::V4(to)) =
        (ip.parse().expect("an IP"), from, to)
    else {
        panic!("IPv4 only");
    };
    assert!(from.contains(&ip), "{ip} is not in {from}");
    let host = u32::from(ip) - u32::from(from.network());
    std::net::Ipv4Addr::from(u32::from(to.network()) + host).to_string()
}

/// Every Tandem-owned object on the cluster, as "kind namespace/name": every object of every
/// tandem.dev kind, and every object of the core/apps/rbac/discovery/... kinds below labelled
/// managed-by=tandem or with a tandem.dev label.
pub async fn tandem_owned(client: &Client) -> BTreeSet<String> {
    let discovery = Discovery::new(client.clone())
        .filter(&[tandem_api::GROUP])
        .run()
        .await
        .expect("API discovery");
    let mut tandem_kinds: Vec<ApiResource> = Vec::new();
    for group in discovery.groups() {
        for (ar, _) in group.recommended_resources() {
            tandem_kinds.push(ar);
        }
    }
    assert!(
        tandem_kinds.len() >= 7,
        "tandem.dev kinds served: {:?}",
        tandem_kinds.iter().map(|a| &a.kind).collect::<Vec<_>>()
    );
    fn erase<K: Resource<DynamicType = ()>>() -> ApiResource {
        ApiResource::erase::<K>(&())
    }
    let labelled_kinds = [
        erase::<Namespace>(),
        erase::<Pod>(),
        erase::<ConfigMap>(),
        erase::<Secret>(),
        erase::<Service>(),
        erase::<ServiceAccount>(),
        erase::<EndpointSlice>(),
        erase::<Deployment>(),
        erase::<Role>(),
        erase::<RoleBinding>(),
        erase::<ClusterRole>(),
        erase::<ClusterRoleBinding>(),
        erase::<Lease>(),
        erase::<Node>(),
        erase::<CertificateSigningRequest>(),
        erase::<MutatingWebhookConfiguration>(),
    ];
    let mut out = BTreeSet::new();
    for (ar, all) in tandem_kinds
        .iter()
        .map(|a| (a, true))
        .chain(labelled_kinds.iter().map(|a| (a, false)))
    {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), ar);
        let items = api
            .list(&ListParams::default())
            .await
            .unwrap_or_else(|e| panic!("listing {}: {e}", ar.kind))
            .items;
        for o in items {
            let labels = o.labels();
            let owned = all
                || labels.get(names::MANAGED_BY_LABEL).map(String::as_str)
                    == Some(names::MANAGED_BY)
                || labels.keys().any(|k| k.contains("tandem.dev/"))
                || (ar.kind == "Node" && o.name_any().starts_with("tandem-"));
            if owned {
                out.insert(format!(
                    "{} {}/{}",
                    ar.kind,
                    o.namespace().unwrap_or_default(),
                    o.name_any()
                ));
            }
        }
    }
    out
}

/// Waits until the cluster's Tandem-owned objects are `expected`; names the difference if not.
pub async fn until_owned(
    cluster: &Cluster,
    expected: &BTreeSet<String>,
    what: &str,
    timeout: Duration,
) {
    let mut last = BTreeSet::new();
    let found = tokio::time::timeout(timeout, async {
        loop {
            last = tandem_owned(&cluster.client).await;
            if &last == expected {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
    .await;
    if found.is_err() {
        let extra: Vec<_> = last.difference(expected).collect();
        let missing: Vec<_> = expected.difference(&last).collect();
        panic!(
            "{what} on {}: left behind {extra:?}, missing {missing:?}",
            cluster.id
        );
    }
}

/// Makes the API server store any spec of CRD `name` (a CRD installed before its schema
/// validated the field, or an edit the schema cannot catch), so that tests can check that the
/// controllers report such input instead of trusting it.
pub async fn accept_any_spec(client: &Client, name: &str) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut crd = crds.get(name).await.expect("the CRD");
    for version in &mut crd.spec.versions {
        version.schema = Some(
            serde_json::from_value(json!({"openAPIV3Schema": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": true,
            }}))
            .expect("schema"),
        );
    }
    crds.replace(name, &Default::default(), &crd)
        .await
        .expect("loosening the CRD");
}

/// Cordons (`on`) or uncordons every node of `cluster` that is not a virtual node: while
/// they are cordoned, pods that may run locally or remotely can only be placed remotely.
pub async fn cordon_local_nodes(cluster: &Cluster, on: bool) {
    let selector = format!("!{}", names::NODE_TYPE_LABEL);
    cordon_where(cluster, &ListParams::default().labels(&selector), None, on).await;
}

/// Cordons (`on`) or uncordons every node of `cluster` but `keep`: pods are then placed there.
pub async fn cordon_all_but(cluster: &Cluster, keep: &str, on: bool) {
    cordon_where(cluster, &ListParams::default(), Some(keep), on).await;
}

async fn cordon_where(cluster: &Cluster, nodes_listed: &ListParams, keep: Option<&str>, on: bool) {
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let listed = nodes.list(nodes_listed).await.expect("listing nodes");
    for n in listed.items {
        if Some(n.name_any().as_str()) == keep {
            continue;
        }
        nodes
            .patch(
                &n.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"unschedulable": on}})),
            )
            .await
            .expect("cordoning a node");
    }
}

/// A gate in front of `cluster`'s API server: a peer given `gate.url()` loses the cluster when
/// it is closed and finds it again when it is opened.
pub async fn api_gate(cluster: &Cluster) -> tandem_lab::TcpGate {
    let target = cluster
        .lab
        .server
        .url()
        .trim_start_matches("https://")
        .parse()
        .expect("API server address");
    tandem_lab::TcpGate::start(target).await.expect("gate")
}

/// The consumer's peer identity, as a client of the provider.
pub async fn peer_client(consumer: &Cluster, provider: &Cluster) -> Client {
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(
        consumer.client.clone(),
        &names::tenant_namespace(&provider.id),
    );
    let secret = secrets
        .get(&tandem_controller::consumer::link::identity_secret_name(
            &provider.id,
        ))
        .await
        .unwrap();
    let kc = secret.data.unwrap()[tandem_controller::consumer::link::IDENTITY_KUBECONFIG_KEY]
        .0
        .clone();
    tandem_controller::consumer::link::client_from_kubeconfig(&String::from_utf8(kc).unwrap())
        .await
        .unwrap()
}

/// The ready addresses of Service `svc`'s EndpointSlices in `ns`.
pub async fn endpoint_addresses(client: &Client, ns: &str, svc: &str) -> BTreeSet<String> {
    Api::<EndpointSlice>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={svc}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .iter()
        .flat_map(|s| s.endpoints.iter())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
        .flat_map(|e| e.addresses.iter().cloned())
        .collect()
}
