//! Shared fixtures: a server per test, polling with a deadline, error inspection and a CRD.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tandem_apiserver::{ApiServer, Config};

/// How long `eventually` waits before failing a test.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// A running server and its admin client.
pub struct Cluster {
    /// The server under test.
    pub server: ApiServer,
    /// A client in group system:masters.
    pub client: kube::Client,
}

impl Cluster {
    /// An in-memory server with default settings.
    pub async fn start() -> Cluster {
        Cluster::start_with(Config::default()).await
    }

    /// An in-memory server with `config`.
    pub async fn start_with(config: Config) -> Cluster {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "warn".into()),
            )
            .with_test_writer()
            .try_init();
        let server = ApiServer::start(config).await.expect("server starts");
        let client = server.client().await.expect("admin client");
        Cluster { server, client }
    }

    /// A client authenticating with a certificate for `user` in `groups`.
    pub async fn client_for(&self, user: &str, groups: &[&str]) -> kube::Client {
        let kubeconfig = self
            .server
            .kubeconfig_for(user, groups)
            .expect("kubeconfig");
        tandem_apiserver::client_from_kubeconfig(&kubeconfig)
            .await
            .expect("user client")
    }

    /// Binds ClusterRole `role` cluster-wide to a subject (`kind` User or Group) by a
    /// ClusterRoleBinding named `name`.
    pub async fn bind_cluster_role(&self, name: &str, role: &str, kind: &str, subject: &str) {
        let binding: k8s_openapi::api::rbac::v1::ClusterRoleBinding =
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": subject}],
            }))
            .expect("ClusterRoleBinding");
        kube::Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(self.client.clone())
            .create(&Default::default(), &binding)
            .await
            .expect("creating the ClusterRoleBinding");
    }

    /// A client authenticating with a bearer token.
    pub async fn client_with_token(&self, token: &str) -> kube::Client {
        let kubeconfig = self.server.kubeconfig_with_token("token-user", token);
        tandem_apiserver::client_from_kubeconfig(&kubeconfig)
            .await
            .expect("token client")
    }

    /// A client that presents no credentials at all: no certificate, no token.
    pub async fn anonymous_client(&self) -> kube::Client {
        let yaml = self.server.kubeconfig_with_token("anonymous", "unused");
        let mut kubeconfig = kube::config::Kubeconfig::from_yaml(&yaml).expect("kubeconfig");
        for user in &mut kubeconfig.auth_infos {
            if let Some(auth) = user.auth_info.as_mut() {
                auth.token = None;
            }
        }
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .expect("anonymous config");
        kube::Client::try_from(config).expect("anonymous client")
    }

    /// Registers the Widget CRD and waits until it is Established.
    pub async fn install_widget_crd(&self) {
        let crds: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        crds.create(&PostParams::default(), &Widget::crd())
            .await
            .expect("CRD created");
        let established = await_condition(
            crds,
            "widgets.tandem.test",
            conditions::is_crd_established(),
        );
        tokio::time::timeout(DEADLINE, established)
            .await
            .expect("CRD established before the deadline")
            .expect("waiting for the CRD");
    }
}

/// Polls `check` until it returns Some, failing the test with `what` after [`DEADLINE`].
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {DEADLINE:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The Kubernetes Status of a refused request; panics on success or a transport error.
pub fn api_status<T: std::fmt::Debug>(result: kube::Result<T>) -> kube::core::Status {
    match result {
        Err(kube::Error::Api(status)) => *status,
        other => panic!("expected an API error Status, got {other:?}"),
    }
}

/// The HTTP code of a result: 200 for success, the Status code for an API error.
pub fn code_of<T: std::fmt::Debug>(result: kube::Result<T>) -> u16 {
    match result {
        Ok(_) => 200,
        Err(kube::Error::Api(status)) => status.code,
        Err(e) => panic!("expected an HTTP answer, got a transport error: {e}"),
    }
}

/// A namespaced custom resource with a status subresource and a validated spec.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "tandem.test",
    version = "v1",
    kind = "Widget",
    namespaced,
    status = "WidgetStatus",
    shortname = "wd"
)]
pub struct WidgetSpec {
    /// How many parts; the schema bounds it to 1..=10.
    #[schemars(range(min = 1, max = 10))]
    pub size: i64,
    /// Paint.
    pub color: String,
}

/// What a controller reports about a Widget.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct WidgetStatus {
    /// Whether the widget was assembled.
    pub ready: bool,
    /// A free-form note.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A Widget named `name` in `default`.
pub fn widget(name: &str, size: i64, color: &str) -> Widget {
    let mut w = Widget::new(
        name,
        WidgetSpec {
            size,
            color: color.into(),
        },
    );
    w.metadata.namespace = Some("default".into());
    w
}
