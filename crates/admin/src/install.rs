//! `tandem install`: everything Tandem needs in one cluster — CRDs, the system namespace, RBAC,
//! settings, the cluster identity and the controller Deployment. Every step is a server-side
//! apply, so installing twice changes nothing and an upgrade converges.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde::Serialize;
use serde_json::json;
use tandem_api::names;

use tandem_controller::identity::{ClusterIdentity, IdentityError};
pub use tandem_controller::install::*;
use tandem_controller::rbac;
use tandem_controller::settings::step;

pub use tandem_api::names::PRIORITY_CLASS;

/// Settings of `tandem install`.
#[derive(Clone, Debug, Default)]
pub struct InstallOptions {
    /// The cluster ID; generated when None (and kept when already installed).
    pub cluster_id: Option<String>,
    /// The cluster's pod CIDR; detected from the Nodes' podCIDRs when None.
    pub pod_cidr: Option<String>,
    /// The external CIDR (stands for non-pod sources); 10.70.0.0/16 when None.
    pub external_cidr: Option<String>,
    /// Share of the cluster's allocatable resources granted to each new consumer (percent).
    pub share_percent: Option<u32>,
    /// Controller image of the Deployment (also the gateway's and the node agent's).
    pub image: Option<String>,
    /// Secrets in tandem-system to pull that image with (the controller's pod, the gateways,
    /// the node agent); kept when already installed, none when never set.
    pub image_pull_secrets: Option<Vec<String>>,
    /// Whether the controller builds the network fabric (gateways, node agent) for each
    /// peering; kept when already installed, on when never set (a hollow lab cluster, whose
    /// pods have no network, leaves it off whatever the setting, and says so).
    pub network_fabric: Option<bool>,
    /// What a peer may open connections to through the tunnel; kept when already installed,
    /// [`NetworkExposure::Peering`] when never set.
    pub network_exposure: Option<NetworkExposure>,
    /// How peers reach this cluster's gateways; kept when already installed,
    /// [`GatewayServiceType::Auto`] when never set.
    pub gateway_service_type: Option<GatewayServiceType>,
}

/// Port of the pod-placement webhook in the controller's pod.
pub const WEBHOOK_PORT: u16 = 9443;
/// The controller's RoleBinding to the Role reading the API server's client CAs (kube-system).
pub const CLIENT_CA_READER_BINDING: &str = "tandem-controller:client-ca-reader";
/// The `tandem` StorageClass: claims of it are provisioned in the provider whose virtual node
/// the scheduler picks for their first pod (`WaitForFirstConsumer`); `allowedTopologies` keeps
/// the scheduler from picking a local node for such a claim. Not the default class. Set the
/// `remoteStorageClass` parameter to choose the providers' class (default: theirs).
pub fn storage_class() -> serde_json::Value {
    json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": names::STORAGE_CLASS, "labels": labels()},
        "provisioner": names::STORAGE_PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "WaitForFirstConsumer",
        "allowedTopologies": [{"matchLabelExpressions": [
            {"key": names::NODE_TYPE_LABEL, "values": [names::VIRTUAL_NODE_TYPE]},
        ]}],
    })
}

/// The label `tandem version` reads the installed controller's version from.
pub const VERSION_LABEL: &str = "app.kubernetes.io/version";

/// `labels` and the version of the manifests (this build's).
fn versioned(mut labels: BTreeMap<String, String>) -> BTreeMap<String, String> {
    labels.insert(
        VERSION_LABEL.to_string(),
        env!("CARGO_PKG_VERSION").to_string(),
    );
    labels
}

fn labels() -> BTreeMap<String, String> {
    [(
        names::MANAGED_BY_LABEL.to_string(),
        names::MANAGED_BY.to_string(),
    )]
    .into()
}

/// What the install manifests say: the settings an administrator chose. What is None is left
/// to the controller, which fills it in on its first start ([`bootstrap`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ManifestSettings {
    /// The cluster ID; None: the controller generates one.
    pub cluster_id: Option<String>,
    /// The pod CIDR; None: the controller detects it from the Nodes' podCIDRs.
    pub pod_cidr: Option<String>,
    pub external_cidr: String,
    pub share_percent: u32,
    pub network_fabric: bool,
    pub network_exposure: NetworkExposure,
    pub gateway_service_type: GatewayServiceType,
    /// Tandem's image: the controller's, and the pods it creates (gateways, node agent).
    pub image: String,
    /// Secrets in tandem-system the pods pull `image` with.
    pub image_pull_secrets: Vec<String>,
}

impl Default for ManifestSettings {
    /// What `deploy/install/` holds: every default, the rest left to the controller.
    fn default() -> Self {
        ManifestSettings {
            cluster_id: None,
            pod_cidr: None,
            external_cidr: DEFAULT_EXTERNAL_CIDR.to_string(),
            share_percent: DEFAULT_SHARE_PERCENT,
            network_fabric: true,
            network_exposure: NetworkExposure::default(),
            gateway_service_type: GatewayServiceType::default(),
            image: default_image(),
            image_pull_secrets: Vec::new(),
        }
    }
}

/// Everything Tandem installs in a cluster, in the order it is applied: the one source of both
/// `tandem install` and the reviewable manifests in `deploy/install/` (a test keeps them
/// equal). The cluster identity (a Secret holding a private key) is not among them: the
/// controller creates it on its first start, as `tandem install` does before it.
pub fn manifests(settings: &ManifestSettings) -> Vec<serde_json::Value> {
    let sa_subject = json!([{"kind": "ServiceAccount", "name": names::CONTROLLER_NAME,
                             "namespace": names::SYSTEM_NAMESPACE}]);
    let mut out: Vec<serde_json::Value> = tandem_api::crds::all()
        .into_iter()
        .chain(tandem_api::crds::upstream())
        .map(|crd| to_value(&crd))
        .collect();
    // Pod Security: the gateways and the node agent run on the node network with NET_ADMIN and
    // the TUN device, which only the privileged level admits; said explicitly, so that a
    // cluster whose default level is stricter (a hardened one, or an admission configuration
    // with `defaults.enforce: baseline`) still runs them.
    let mut ns_labels = labels();
    ns_labels.insert(
        "pod-security.kubernetes.io/enforce".to_string(),
        "privileged".to_string(),
    );
    out.push(json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": names::SYSTEM_NAMESPACE, "labels": ns_labels},
    }));
    out.extend(
        [rbac::controller_role(), rbac::controller_tenant_role()]
            .into_iter()
            .chain(rbac::peer_roles())
            .chain([rbac::peer_renewal_role(), rbac::viewer_role()])
            .map(|r| to_value(&r)),
    );
    // The right to renew is bound per consumer, with its Tenant (`rbac::peer_renewal_binding`):
    // no binding to every peer certificate, which would outlive a peering.
    for role in rbac::controller_namespaced_roles() {
        let namespace = role.metadata.namespace.clone().unwrap_or_default();
        out.push(to_value(&role));
        out.push(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": names::CONTROLLER_NAME, "namespace": namespace, "labels": labels()},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": names::CONTROLLER_NAME},
            "subjects": sa_subject,
        }));
    }
    out.push(json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": names::CONTROLLER_NAME, "namespace": names::SYSTEM_NAMESPACE, "labels": labels()},
    }));
    out.push(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": names::CONTROLLER_NAME, "labels": labels()},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": names::CONTROLLER_NAME},
        "subjects": sa_subject,
    }));
    // Virtual kubelets read the CAs of the API server's client certificates, as kube's
    // aggregated API servers do: through the Role kube-apiserver bootstraps for it.
    out.push(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": CLIENT_CA_READER_BINDING,
                     "namespace": names::CLIENT_CA_NAMESPACE, "labels": labels()},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": names::CLIENT_CA_READER_ROLE},
        "subjects": sa_subject,
    }));
    out.push(storage_class());
    // The controller and the gateways are what offloaded pods depend on: scheduled (and kept)
    // before ordinary pods under pressure. Kubernetes reserves system-cluster-critical for
    // kube-system, so Tandem brings its own class.
    out.push(json!({
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
        "metadata": {"name": PRIORITY_CLASS, "labels": labels()},
        "value": 1_000_000_000,
        "globalDefault": false,
        "description": "Tandem's controller and gateways: offloaded pods and cross-cluster traffic depend on them.",
    }));
    let mut data = json!({
        "externalCIDR": settings.external_cidr,
        "sharePercent": settings.share_percent.to_string(),
        "networkFabric": settings.network_fabric.to_string(),
        "networkExposure": settings.network_exposure.as_str(),
        "gatewayServiceType": settings.gateway_service_type.as_str(),
        "image": settings.image,
    });
    if let Some(cidr) = &settings.pod_cidr {
        data["podCIDR"] = json!(cidr);
    }
    if let Some(id) = &settings.cluster_id {
        data["clusterID"] = json!(id);
    }
    if !settings.image_pull_secrets.is_empty() {
        data["imagePullSecrets"] = json!(settings.image_pull_secrets.join(","));
    }
    out.push(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": names::CONFIG_MAP, "namespace": names::SYSTEM_NAMESPACE, "labels": labels()},
        "data": data,
    }));
    out.push(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": names::CONTROLLER_NAME, "namespace": names::SYSTEM_NAMESPACE,
                     "labels": versioned(labels())},
        "spec": {
            "replicas": 1,
            // One controller at a time, even across an upgrade: two would each renew and
            // judge the fence leases (docs/fencing.md).
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"app.kubernetes.io/name": names::CONTROLLER_NAME}},
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/name": names::CONTROLLER_NAME}},
                "spec": {
                    "serviceAccountName": names::CONTROLLER_NAME,
                    "priorityClassName": PRIORITY_CLASS,
                    // Time to give the leader Lease up (`Controller::stop`).
                    "terminationGracePeriodSeconds": 30,
                    "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532},
                    "containers": [{
                        "name": "controller", "image": settings.image,
                        "args": ["controller",
                                 format!("--webhook-addr=0.0.0.0:{WEBHOOK_PORT}"),
                                 format!("--webhook-service={}/{}", names::SYSTEM_NAMESPACE, names::CONTROLLER_NAME),
                                 format!("--dns-addr=0.0.0.0:{DNS_PORT}"),
                                 format!("--metrics-addr=0.0.0.0:{METRICS_PORT}"),
                                 // More replicas wait for the Lease; one writes.
                                 "--leader-elect=true"],
                        "ports": [{"name": "webhook", "containerPort": WEBHOOK_PORT, "protocol": "TCP"},
                                  {"name": "dns", "containerPort": DNS_PORT, "protocol": "UDP"},
                                  {"name": "dns-tcp", "containerPort": DNS_PORT, "protocol": "TCP"},
                                  {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
                        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "metrics"},
                                          "periodSeconds": 10, "failureThreshold": 3},
                        // A replica waiting for the leader Lease is not ready, so the webhook's
                        // Service sends reviews only to the leader, which serves them.
                        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics"},
                                           "periodSeconds": 2, "failureThreshold": 1},
                        "resources": controller_resources(),
                        "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                                            "capabilities": {"drop": ["ALL"]}},
                    }],
                },
            },
        },
    }));
    if !settings.image_pull_secrets.is_empty() {
        let deployment = out.last_mut().expect("the Deployment, just pushed");
        deployment["spec"]["template"]["spec"]["imagePullSecrets"] = settings
            .image_pull_secrets
            .iter()
            .map(|name| json!({"name": name}))
            .collect();
    }
    // A drain evicts one replica at a time (with more than one, the others take over).
    out.push(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": names::CONTROLLER_NAME, "namespace": names::SYSTEM_NAMESPACE, "labels": labels()},
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": {"app.kubernetes.io/name": names::CONTROLLER_NAME}},
        },
    }));
    // The API server calls the pod-placement webhook through this Service when the controller
    // runs as the Deployment's pod.
    out.push(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": names::CONTROLLER_NAME, "namespace": names::SYSTEM_NAMESPACE, "labels": labels()},
        "spec": {
            "selector": {"app.kubernetes.io/name": names::CONTROLLER_NAME},
            "ports": [{"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}],
        },
    }));
    // Prometheus scrapes the controller through this one (see [`service_monitor`]).
    out.push(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": METRICS_SERVICE, "namespace": names::SYSTEM_NAMESPACE,
                     "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY,
                                "app.kubernetes.io/name": METRICS_SERVICE}},
        "spec": {
            "selector": {"app.kubernetes.io/name": names::CONTROLLER_NAME},
            "ports": [{"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"}],
        },
    }));
    // The cluster DNS forwards `clusterset.local` to the controller through this one.
    out.push(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": DNS_SERVICE, "namespace": names::SYSTEM_NAMESPACE, "labels": labels()},
        "spec": {
            "selector": {"app.kubernetes.io/name": names::CONTROLLER_NAME},
            "ports": [
                {"name": "dns", "port": 53, "targetPort": "dns", "protocol": "UDP"},
                {"name": "dns-tcp", "port": 53, "targetPort": "dns-tcp", "protocol": "TCP"},
            ],
        },
    }));
    out
}

/// The Service in front of the controllers' `/metrics`.
pub const METRICS_SERVICE: &str = "tandem-controller-metrics";

/// The Prometheus Operator's ServiceMonitor for the controller's `/metrics`: optional (its CRD
/// may be absent), so not among [`manifests`] — the kustomize component
/// `deploy/install/servicemonitor` and the chart's `serviceMonitor.enabled` add it.
pub fn service_monitor() -> serde_json::Value {
    json!({
        "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
        "metadata": {"name": names::CONTROLLER_NAME, "namespace": names::SYSTEM_NAMESPACE,
                     "labels": labels()},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": METRICS_SERVICE}},
            "namespaceSelector": {"matchNames": [names::SYSTEM_NAMESPACE]},
            "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "30s"}],
        },
    })
}

/// The controller container's resources (the Helm chart's `resources` value by default).
pub fn controller_resources() -> serde_json::Value {
    json!({"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}})
}

fn to_value(obj: &impl Serialize) -> serde_json::Value {
    serde_json::to_value(obj).expect("Kubernetes objects serialize")
}

/// `manifests` as one multi-document YAML stream, with a header saying where it comes from.
pub fn manifests_yaml(objects: &[serde_json::Value], header: &str) -> String {
    let mut out = String::new();
    for line in header.lines() {
        out.push_str(&format!("# {line}\n").replace("# \n", "#\n"));
    }
    for obj in objects {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(obj).expect("JSON values serialize as YAML"));
    }
    out
}

/// The install step an object of `kind` belongs to (named in errors).
fn step_of(kind: &str) -> &'static str {
    match kind {
        "CustomResourceDefinition" => "CRDs",
        "Namespace" => "namespace",
        "ClusterRole" | "ClusterRoleBinding" | "Role" | "RoleBinding" | "ServiceAccount" => "RBAC",
        "StorageClass" | "PriorityClass" => "StorageClass",
        "ConfigMap" => "settings",
        "Deployment" | "PodDisruptionBudget" => "controller Deployment",
        _ => "Services",
    }
}

/// Server-side applies `obj` (any kind) with Tandem's field manager.
pub async fn apply_value(
    client: &Client,
    obj: &serde_json::Value,
) -> Result<kube::api::DynamicObject, InstallError> {
    apply_json(client, obj)
        .await
        .map_err(step(step_of(obj["kind"].as_str().unwrap_or_default())))
}

/// [`apply_value`] with kube's error, for callers that name the step themselves.
pub async fn apply_json(
    client: &Client,
    obj: &serde_json::Value,
) -> Result<kube::api::DynamicObject, kube::Error> {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let kind = obj["kind"].as_str().unwrap_or_default();
    let (group, version) = match obj["apiVersion"]
        .as_str()
        .unwrap_or_default()
        .split_once('/')
    {
        Some((g, v)) => (g, v),
        None => ("", obj["apiVersion"].as_str().unwrap_or_default()),
    };
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    let api: Api<DynamicObject> = match obj["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    api.patch(
        name,
        &PatchParams::apply(names::FIELD_MANAGER).force(),
        &Patch::Apply(obj),
    )
    .await
}

/// Installs (or upgrades) Tandem; `progress` is told each step as it completes.
pub async fn install(
    client: &Client,
    options: &InstallOptions,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<ClusterIdentity, InstallError> {
    let settings = manifest_settings_for(client, options).await?;
    let objects = manifests(&settings);
    let (crd_objects, rest): (Vec<_>, Vec<_>) = objects
        .iter()
        .partition(|o| o["kind"] == "CustomResourceDefinition");
    for crd in &crd_objects {
        apply_value(client, crd).await?;
    }
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in &crd_objects {
        wait_established(&crds, crd["metadata"]["name"].as_str().unwrap_or_default()).await?;
    }
    progress(
        "CustomResourceDefinitions applied and Established (Tandem's, and the MCS API's \
         ServiceExport, ServiceImport and ClusterProperty)",
    );
    let mut identity = None;
    let mut dns_ip = None;
    for obj in rest {
        let kind = obj["kind"].as_str().unwrap_or_default();
        if kind == "Deployment" {
            // The identity first, so that the controller finds it (it would make one itself).
            let id = ClusterIdentity::ensure(client, settings.cluster_id.as_deref()).await?;
            progress(&format!("cluster identity {:?}", id.cluster_id));
            identity = Some(id);
        }
        let applied = apply_value(client, obj).await?;
        let name = applied.name_any();
        match kind {
            "Namespace" => progress(&format!("namespace {name} ready")),
            "StorageClass" => {
                progress("RBAC for the controller and for peers applied");
                progress(&format!(
                    "StorageClass {name} (remote volumes, bound where the first pod runs)"
                ));
            }
            "ConfigMap" => progress(&format!(
                "settings: pod CIDR {}, external CIDR {}, share {}%",
                settings
                    .pod_cidr
                    .as_deref()
                    .unwrap_or("(detected by the controller)"),
                settings.external_cidr,
                settings.share_percent
            )),
            "Deployment" => progress(&format!(
                "controller Deployment {}/{name}",
                names::SYSTEM_NAMESPACE
            )),
            "Service" if name == DNS_SERVICE => {
                dns_ip = applied.data["spec"]["clusterIP"]
                    .as_str()
                    .filter(|ip| !ip.is_empty() && *ip != "None")
                    .map(str::to_string);
            }
            _ => {}
        }
    }
    // Before per-consumer renewal bindings, one ClusterRoleBinding let every certificate in
    // group tandem:peers file renewals, a former peer's included: an upgrade removes it.
    tandem_api::client::delete_if_exists(
        &Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(client.clone()),
        rbac::PEER_RENEWAL_ROLE,
        &Default::default(),
    )
    .await
    .map_err(step(
        "removing the renewal binding of every peer certificate",
    ))?;
    let dns_ip = dns_ip.ok_or_else(|| {
        InstallError::Settings(format!(
            "Service {}/{DNS_SERVICE} has no ClusterIP",
            names::SYSTEM_NAMESPACE
        ))
    })?;
    progress(&stub_domain(client, &dns_ip).await?);
    Ok(identity.expect("the manifests hold the Deployment"))
}

/// The port the in-cluster controller serves `/metrics`, `/healthz` and `/readyz` on.
pub const METRICS_PORT: u16 = 8080;
/// The port the in-cluster controller serves `clusterset.local` on (kube-dns's in-pod port; not
/// 5353, which is mDNS's: the controller announces its cluster there with `tandem advertise
/// --mdns`).
pub const DNS_PORT: u16 = 10053;
/// Points the cluster DNS at `clusterset.local`: the stub domain in CoreDNS's Corefile
/// (`kube-system/coredns`, which CoreDNS's `reload` plugin and the lab's DNS follow); where
/// there is no such ConfigMap, what to add by hand. Idempotent. Returns what was done.
async fn stub_domain(client: &Client, dns_ip: &str) -> Result<String, InstallError> {
    let edited = edit_corefile(client, |corefile| with_stub_domain(corefile, dns_ip))
        .await
        .map_err(step("CoreDNS stub domain"))?;
    if edited.is_none() {
        return Ok(format!(
            "no ConfigMap kube-system/coredns: for `<svc>.<ns>.svc.{}` names, add to your \
             cluster DNS's configuration:\n{}",
            tandem_api::mcs::CLUSTERSET_DOMAIN,
            stub_domain_block(dns_ip)
        ));
    }
    Ok(format!(
        "{} forwarded to {dns_ip} (stub domain in ConfigMap kube-system/coredns)",
        tandem_api::mcs::CLUSTERSET_DOMAIN
    ))
}

async fn wait_established(
    crds: &Api<CustomResourceDefinition>,
    name: &str,
) -> Result<(), InstallError> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let crd = crds.get(name).await.map_err(step("CRDs"))?;
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(InstallError::CrdNotEstablished(name.to_string()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The settings of a dry run that contacts no cluster: the options, else the defaults; what
/// they leave unset (cluster ID, pod CIDR) the controller fills in on its first start.
pub fn offline_settings(options: &InstallOptions) -> Result<ManifestSettings, InstallError> {
    let defaults = ManifestSettings::default();
    let settings = ManifestSettings {
        cluster_id: options.cluster_id.clone(),
        pod_cidr: options
            .pod_cidr
            .as_deref()
            .map(|c| validate_cidr("pod CIDR", c))
            .transpose()?,
        external_cidr: validate_cidr(
            "external CIDR",
            options
                .external_cidr
                .as_deref()
                .unwrap_or(&defaults.external_cidr),
        )?,
        share_percent: options.share_percent.unwrap_or(defaults.share_percent),
        network_fabric: options.network_fabric.unwrap_or(defaults.network_fabric),
        network_exposure: options.network_exposure.unwrap_or_default(),
        gateway_service_type: options.gateway_service_type.unwrap_or_default(),
        image: options.image.clone().unwrap_or(defaults.image),
        image_pull_secrets: options.image_pull_secrets.clone().unwrap_or_default(),
    };
    check_settings(&settings)?;
    Ok(settings)
}

fn check_settings(settings: &ManifestSettings) -> Result<(), InstallError> {
    if !(1..=100).contains(&settings.share_percent) {
        return Err(InstallError::Settings(format!(
            "share percent {} must be between 1 and 100",
            settings.share_percent
        )));
    }
    for secret in &settings.image_pull_secrets {
        // A Secret's name: a DNS subdomain (a comma would split the ConfigMap's list).
        let valid = secret.len() <= 253
            && secret.split('.').all(|label| {
                !label.is_empty()
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            });
        if !valid {
            return Err(InstallError::Settings(format!(
                "image pull secret {secret:?} is not a Secret name (lowercase letters, digits, \
                 '-' and '.')"
            )));
        }
    }
    if let Some(id) = &settings.cluster_id {
        names::validate_cluster_id(id)
            .map_err(|e| InstallError::Identity(IdentityError::InvalidId(e.to_string())))?;
    }
    Ok(())
}

/// The settings to install: the options, else what is already stored, else the defaults; the
/// pod CIDR detected from the Nodes when neither names it.
pub async fn manifest_settings_for(
    client: &Client,
    options: &InstallOptions,
) -> Result<ManifestSettings, InstallError> {
    let stored = load_settings(client).await.ok();
    let pod_cidr = match (&options.pod_cidr, &stored) {
        (Some(c), _) => c.clone(),
        (None, Some(s)) => s.pod_cidr.clone(),
        (None, None) => detect_pod_cidr(client).await?,
    };
    let pod_cidr = validate_cidr("pod CIDR", &pod_cidr)?;
    let external_cidr = options
        .external_cidr
        .clone()
        .or(stored.as_ref().map(|s| s.external_cidr.clone()))
        .unwrap_or_else(|| DEFAULT_EXTERNAL_CIDR.to_string());
    let external_cidr = validate_cidr("external CIDR", &external_cidr)?;
    let share_percent = options
        .share_percent
        .or(stored.as_ref().map(|s| s.share_percent))
        .unwrap_or(DEFAULT_SHARE_PERCENT);
    let settings = ManifestSettings {
        cluster_id: options.cluster_id.clone(),
        pod_cidr: Some(pod_cidr),
        external_cidr,
        share_percent,
        network_fabric: options
            .network_fabric
            .or(stored.as_ref().map(|s| s.network_fabric))
            .unwrap_or(true),
        network_exposure: options
            .network_exposure
            .or(stored.as_ref().map(|s| s.network_exposure))
            .unwrap_or_default(),
        gateway_service_type: options
            .gateway_service_type
            .or(stored.as_ref().map(|s| s.gateway_service_type))
            .unwrap_or_default(),
        image: options.image.clone().unwrap_or_else(default_image),
        image_pull_secrets: options
            .image_pull_secrets
            .clone()
            .or(stored.as_ref().map(|s| s.image_pull_secrets.clone()))
            .unwrap_or_default(),
    };
    check_settings(&settings)?;
    Ok(settings)
}

fn validate_cidr(what: &str, cidr: &str) -> Result<String, InstallError> {
    let net: ipnet::IpNet = cidr
        .parse()
        .map_err(|e| InstallError::Settings(format!("{what} {cidr:?} is not a CIDR: {e}")))?;
    if net.trunc() != net {
        return Err(InstallError::Settings(format!(
            "{what} {cidr:?} has host bits set (did you mean {}?)",
            net.trunc()
        )));
    }
    Ok(net.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pull_secret_that_is_not_a_secret_name_is_refused() {
        let with = |secrets: &[&str]| {
            offline_settings(&InstallOptions {
                image_pull_secrets: Some(secrets.iter().map(|s| s.to_string()).collect()),
                ..Default::default()
            })
        };
        assert_eq!(
            with(&["regcred", "mirror.example"])
                .unwrap()
                .image_pull_secrets
                .len(),
            2
        );
        for bad in ["Regcred", "a,b", "-x", "x..y", ""] {
            let e = with(&[bad]).unwrap_err().to_string();
            assert!(
                e.contains(&format!("image pull secret {bad:?} is not a Secret name")),
                "{e}"
            );
        }
    }

    #[test]
    fn the_stub_domain_is_replaced_once_and_removed_without_a_trace() {
        let corefile = ".:53 {\n    errors\n    forward . /etc/resolv.conf\n}\n";
        let with = with_stub_domain(corefile, "10.96.0.53");
        assert!(with.starts_with(corefile) && with.contains("forward . 10.96.0.53"));
        let moved = with_stub_domain(&with, "10.96.0.54");
        assert_eq!(moved.matches(STUB_BEGIN).count(), 1, "{moved}");
        assert!(moved.contains("10.96.0.54") && !moved.contains("10.96.0.53"));
        assert_eq!(without_stub_domain(&moved), corefile);
        assert_eq!(without_stub_domain(corefile), corefile);
    }

    #[test]
    fn manifests_leave_what_is_unset_to_the_controller() {
        let objects = manifests(&ManifestSettings::default());
        let config = objects
            .iter()
            .find(|o| o["kind"] == "ConfigMap")
            .expect("the settings");
        assert!(config["data"]["podCIDR"].is_null() && config["data"]["clusterID"].is_null());
        assert!(
            !serde_json::to_string(&objects)
                .unwrap()
                .contains("caBundle")
        );
        let settings = ManifestSettings {
            cluster_id: Some("rome".into()),
            pod_cidr: Some("10.244.0.0/16".into()),
            ..Default::default()
        };
        let objects = manifests(&settings);
        let config = objects.iter().find(|o| o["kind"] == "ConfigMap").unwrap();
        assert_eq!(config["data"]["clusterID"], "rome");
        assert_eq!(config["data"]["podCIDR"], "10.244.0.0/16");
    }
}
