//! Peering without an invite: the admin-side steps, shared by the CLI and the tests.
//!
//! On the provider, [`enable`] sets up the *enrollment credential*: a bootstrap token that can
//! do nothing but file peering requests in namespace `tandem-enroll` and read them back by
//! name, where a ResourceQuota caps how many exist (a flood leaves at most that many, and
//! nothing else is created for them). The credential is public by design (advertised over
//! mDNS or DNS): a request only waits, until an administrator approves it (`tandem approve`)
//! or a PeeringPolicy matches the consumer's key. The provider also publishes, readable
//! without credentials as kubeadm does, `kube-public/cluster-info` (its CA) and
//! `kube-public/tandem-enrollment` (the credential).
//!
//! On the consumer, [`fetch_provider`] reads the provider's CA *without sending anything*
//! and refuses it unless its SHA-256 is the fingerprint the administrator confirmed; only then
//! does it read the credential over TLS verified with that CA, and [`request`] hands it to the
//! controller (a Peering whose Secret says `mode: enroll`), which files the request signed
//! with this cluster's key. Everything after approval is the invite flow.

use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tandem_api::client;
use tandem_api::{PeeringRequest, names};

pub use tandem_controller::enroll::*;
use tandem_controller::invite::{InviteError, api, managed, token_secret_name};

/// The enrollment credential, once [`enable`]d.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Enrollment {
    /// `<id>.<secret>`.
    pub token: String,
    pub max_pending: u32,
    pub request_ttl: Duration,
}

/// Sets up (or updates) the enrollment credential on the provider (`client`), reachable at
/// `endpoint` with `ca_pem`: idempotent, it keeps an existing token.
pub async fn enable(
    client: &Client,
    endpoint: &str,
    ca_pem: &str,
    max_pending: u32,
    request_ttl: Duration,
) -> Result<Enrollment, InviteError> {
    let identity = tandem_controller::identity::ClusterIdentity::load(client).await?;
    let existing = token_secret(client).await?.as_ref().and_then(bearer_of);
    refuse_if_the_credential_reaches_further(
        client,
        existing
            .as_deref()
            .and_then(|t| t.split_once('.'))
            .map(|(id, _)| id),
    )
    .await?;
    let ns = names::ENROLL_NAMESPACE;
    apply(client, json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": ns, "labels": managed(),
                     "annotations": {REQUEST_TTL_ANNOTATION: request_ttl.as_secs().to_string()}},
    }))
    .await?;
    // The cap first: the credential must never work without it.
    apply(
        client,
        json!({
            "apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": ENROLL_QUOTA, "namespace": ns, "labels": managed()},
            "spec": {"hard": {quota_key(): max_pending.to_string()}},
        }),
    )
    .await?;
    apply(
        client,
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": ENROLL_OBJECTS, "namespace": ns, "labels": managed()},
            // File a request, read one back by name: no list, no watch, no update.
            "rules": [{"apiGroups": [tandem_api::GROUP], "resources": ["peeringrequests"],
                       "verbs": ["create", "get"]}],
        }),
    )
    .await?;
    apply(client, json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": ENROLL_OBJECTS, "namespace": ns, "labels": managed()},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ENROLL_OBJECTS},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                      "name": names::ENROLL_GROUP}],
    }))
    .await?;
    let token = match existing {
        Some(token) => token,
        None => create_token(client).await?,
    };
    publish(client, endpoint, ca_pem, &identity.cluster_id, &token).await?;
    Ok(Enrollment {
        token,
        max_pending,
        request_ttl,
    })
}

/// Enrollment is refused on a cluster where the credential would reach further than filing
/// requests, naming the bindings; the controller keeps checking while it is advertised
/// (`provider::enrollment_guard`).
async fn refuse_if_the_credential_reaches_further(
    client: &Client,
    token_id: Option<&str>,
) -> Result<(), InviteError> {
    let found = credential_reach(client, token_id).await?;
    if found.is_empty() {
        return Ok(());
    }
    Err(InviteError::Refused(
        tandem_controller::invite::Refusal::CredentialReachesFurther { bindings: found },
    ))
}

async fn create_token(client: &Client) -> Result<String, InviteError> {
    let id = crate::invite::random_token_part(tandem_core::invite::TOKEN_ID_LEN);
    let secret = crate::invite::random_token_part(tandem_core::invite::TOKEN_SECRET_LEN);
    let object: Secret = serde_json::from_value(json!({
        "metadata": {"name": token_secret_name(&id), "namespace": "kube-system", "labels": managed(),
                     "annotations": {names::INVITE_ANNOTATION: names::ENROLL_TOKEN_PURPOSE}},
        "type": "bootstrap.kubernetes.io/token",
        "stringData": {
            "description": "Tandem enrollment credential (files peering requests only)",
            "token-id": id,
            "token-secret": secret,
            "usage-bootstrap-authentication": "true",
            "auth-extra-groups": names::ENROLL_GROUP,
        },
    }))
    .expect("static manifest");
    Api::<Secret>::namespaced(client.clone(), "kube-system")
        .create(&PostParams::default(), &object)
        .await
        .map_err(api(format!(
            "creating Secret kube-system/{}",
            token_secret_name(&id)
        )))?;
    Ok(format!("{id}.{secret}"))
}

/// Publishes the CA (kubeadm's `cluster-info`, unless the cluster has one) and the credential
/// in kube-public, readable without credentials.
async fn publish(
    client: &Client,
    endpoint: &str,
    ca_pem: &str,
    cluster_id: &str,
    token: &str,
) -> Result<(), InviteError> {
    if Api::<ConfigMap>::namespaced(client.clone(), "kube-public")
        .get_opt(CLUSTER_INFO)
        .await
        .map_err(api("reading ConfigMap kube-public/cluster-info"))?
        .is_none()
    {
        let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: \"\"\n  cluster:\n    certificate-authority-data: {ca}\n    server: {endpoint}\ncontexts: []\ncurrent-context: \"\"\nusers: []\npreferences: {{}}\n"
        );
        apply(
            client,
            json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": CLUSTER_INFO, "namespace": "kube-public", "labels": managed()},
                "data": {"kubeconfig": kubeconfig},
            }),
        )
        .await?;
    }
    apply(client, json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": ENROLLMENT_CONFIGMAP, "namespace": "kube-public", "labels": managed()},
        "data": {"clusterID": cluster_id, "token": token,
                 "protocolVersion": tandem_core::protocol::VERSION.to_string()},
    }))
    .await?;
    apply(
        client,
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": PUBLIC_INFO_ROLE, "namespace": "kube-public", "labels": managed()},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"],
                       "resourceNames": [CLUSTER_INFO, ENROLLMENT_CONFIGMAP]}],
        }),
    )
    .await?;
    apply(client, json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": PUBLIC_INFO_ROLE, "namespace": "kube-public", "labels": managed()},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": PUBLIC_INFO_ROLE},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                      "name": "system:anonymous"}],
    }))
    .await
}

/// Server-side applies `obj` under Tandem's field manager; a failure names the object.
async fn apply(client: &Client, obj: serde_json::Value) -> Result<(), InviteError> {
    let meta = &obj["metadata"];
    let what = format!(
        "writing {} {}{}",
        obj["kind"].as_str().unwrap_or_default(),
        meta["namespace"]
            .as_str()
            .map(|ns| format!("{ns}/"))
            .unwrap_or_default(),
        meta["name"].as_str().unwrap_or_default()
    );
    crate::install::apply_json(client, &obj)
        .await
        .map(drop)
        .map_err(api(what))
}

/// Turns enrollment off: the credential, its publication and every request waiting go.
/// Peerings already approved stay. Idempotent.
pub async fn disable(client: &Client) -> Result<(), InviteError> {
    if let Some(secret) = token_secret(client).await? {
        client::delete_if_exists(
            &Api::<Secret>::namespaced(client.clone(), "kube-system"),
            &secret.name_any(),
            &DeleteParams::default(),
        )
        .await
        .map_err(api(format!(
            "deleting Secret kube-system/{}",
            secret.name_any()
        )))?;
    }
    let configmaps = Api::<ConfigMap>::namespaced(client.clone(), "kube-public");
    client::delete_if_exists(&configmaps, ENROLLMENT_CONFIGMAP, &DeleteParams::default())
        .await
        .map_err(api(format!(
            "deleting ConfigMap kube-public/{ENROLLMENT_CONFIGMAP}"
        )))?;
    // Only a cluster-info Tandem wrote (kubeadm's is the cluster's).
    if let Some(info) = configmaps
        .get_opt(CLUSTER_INFO)
        .await
        .map_err(api("reading ConfigMap kube-public/cluster-info"))?
        && info
            .labels()
            .get(names::MANAGED_BY_LABEL)
            .map(String::as_str)
            == Some(names::MANAGED_BY)
    {
        client::delete_if_exists(&configmaps, CLUSTER_INFO, &DeleteParams::default())
            .await
            .map_err(api("deleting ConfigMap kube-public/cluster-info"))?;
    }
    client::delete_if_exists(
        &Api::<RoleBinding>::namespaced(client.clone(), "kube-public"),
        PUBLIC_INFO_ROLE,
        &DeleteParams::default(),
    )
    .await
    .map_err(api(format!(
        "deleting RoleBinding kube-public/{PUBLIC_INFO_ROLE}"
    )))?;
    client::delete_if_exists(
        &Api::<Role>::namespaced(client.clone(), "kube-public"),
        PUBLIC_INFO_ROLE,
        &DeleteParams::default(),
    )
    .await
    .map_err(api(format!("deleting Role kube-public/{PUBLIC_INFO_ROLE}")))?;
    client::delete_if_exists(
        &Api::<Namespace>::all(client.clone()),
        names::ENROLL_NAMESPACE,
        &DeleteParams::default(),
    )
    .await
    .map_err(api(format!(
        "deleting namespace {}",
        names::ENROLL_NAMESPACE
    )))?;
    Ok(())
}

/// A peering request filed with the enrollment credential, as the provider lists it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestInfo {
    pub name: String,
    #[serde(rename = "consumerClusterID")]
    pub consumer: String,
    pub key_fingerprint: String,
    pub source: String,
    /// Unix seconds.
    pub created: i64,
    pub phase: String,
    pub message: String,
}

/// The requests filed with the enrollment credential, oldest first.
pub async fn list_requests(client: &Client) -> Result<Vec<RequestInfo>, InviteError> {
    let requests = Api::<PeeringRequest>::namespaced(client.clone(), names::ENROLL_NAMESPACE)
        .list(&ListParams::default())
        .await;
    let requests = match requests {
        Ok(l) => l.items,
        Err(e) if client::is_not_found(&e) => Vec::new(),
        Err(e) => return Err(api("listing peering requests")(e)),
    };
    let mut out: Vec<RequestInfo> = requests
        .iter()
        .map(|r| {
            let status = r.status.clone().unwrap_or_default();
            RequestInfo {
                name: r.name_any(),
                consumer: r.spec.cluster_id.clone(),
                key_fingerprint: status
                    .key_fingerprint
                    .clone()
                    .or_else(|| csr_key_fingerprint(&r.spec.csr))
                    .unwrap_or_else(|| "-".into()),
                source: r.spec.source.clone().unwrap_or_else(|| "-".into()),
                created: r
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map_or(0, |t| t.0.as_second()),
                phase: status.phase.unwrap_or_else(|| "Pending".into()),
                message: status.message.unwrap_or_default(),
            }
        })
        .collect();
    out.sort_by(|a, b| (a.created, &a.name).cmp(&(b.created, &b.name)));
    Ok(out)
}

/// What `tandem approve` / `tandem deny` decide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Approve,
    Deny,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Approve => "Approve",
            Decision::Deny => "Deny",
        }
    }
}

/// Records the admin's decision on the pending request named `id` (its name, or the cluster
/// ID it claims when only one pending request claims it); the controller carries it out.
/// Returns the request's name.
pub async fn decide(
    client: &Client,
    id: &str,
    decision: Decision,
) -> Result<RequestInfo, InviteError> {
    let all = list_requests(client).await?;
    let by_name = all.iter().find(|r| r.name == id);
    let claiming: Vec<&RequestInfo> = all
        .iter()
        .filter(|r| r.consumer == id && r.phase == "Pending")
        .collect();
    let request = match (by_name, claiming.as_slice()) {
        (Some(r), _) => r,
        // A cluster ID is self-asserted: only a denial may go by it.
        (None, [_, ..]) if decision == Decision::Approve => {
            return Err(InviteError::Refused(
                tandem_controller::invite::Refusal::ApproveByName {
                    id: id.to_string(),
                    names: claiming.iter().map(|r| r.name.clone()).collect(),
                },
            ));
        }
        (None, [one]) => one,
        (None, []) => {
            return Err(InviteError::Refused(
                tandem_controller::invite::Refusal::NoSuchRequest { id: id.to_string() },
            ));
        }
        (None, many) => {
            return Err(InviteError::Refused(
                tandem_controller::invite::Refusal::AmbiguousRequest {
                    id: id.to_string(),
                    names: many.iter().map(|r| r.name.clone()).collect(),
                },
            ));
        }
    };
    if request.phase != "Pending" {
        return Err(InviteError::Refused(
            tandem_controller::invite::Refusal::RequestDecided {
                name: request.name.clone(),
                phase: request.phase.clone(),
            },
        ));
    }
    Api::<PeeringRequest>::namespaced(client.clone(), names::ENROLL_NAMESPACE)
        .patch_status(
            &request.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"decision": decision.as_str()}})),
        )
        .await
        .map_err(api(format!(
            "recording the decision on PeeringRequest {}/{}",
            names::ENROLL_NAMESPACE,
            request.name
        )))?;
    Ok(request.clone())
}

/// Waits until the request `name` is Approved or Denied (or gone), for `timeout`.
///
/// An approved request is removed once its consumer has used it, which can be before this
/// looks: gone, it counts as Approved when the consumer's Tenant carries the request's key.
pub async fn wait_decided(
    client: &Client,
    request: &RequestInfo,
    timeout: Duration,
) -> Result<Option<String>, InviteError> {
    let name = &request.name;
    let requests = Api::<PeeringRequest>::namespaced(client.clone(), names::ENROLL_NAMESPACE);
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let found = requests
            .get_opt(name)
            .await
            .map_err(api(format!("reading PeeringRequest {name}")))?;
        let phase = match found {
            Some(r) => r.status.and_then(|s| s.phase),
            None => {
                let consumer = &request.consumer;
                let tenant_ns = names::tenant_namespace(consumer);
                let tenant = Api::<tandem_api::Tenant>::namespaced(client.clone(), &tenant_ns)
                    .get_opt(consumer)
                    .await
                    .map_err(api(format!("reading Tenant {tenant_ns}/{consumer}")))?;
                let used = tenant.is_some_and(|t| {
                    t.annotations().get(names::KEY_FINGERPRINT_ANNOTATION)
                        == Some(&request.key_fingerprint)
                });
                used.then(|| "Approved".to_string())
            }
        };
        match phase.as_deref() {
            Some("Approved" | "Denied") | None => return Ok(phase),
            _ if tokio::time::Instant::now() > deadline => return Ok(phase),
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// What the consumer learnt about a provider before filing anything.
#[derive(Clone, Debug)]
pub struct ProviderInfo {
    /// The CA, confirmed by its fingerprint.
    pub ca_pem: String,
    pub cluster_id: String,
    pub token: String,
    pub protocol_version: u32,
}

/// Why a provider was not taken.
#[derive(Debug, thiserror::Error)]
pub enum EnrollError {
    #[error(
        "the provider at {endpoint} presents CA {presented}, not the confirmed {expected}: refused, nothing was sent (a wrong fingerprint, or someone answering in its place)"
    )]
    FingerprintMismatch {
        endpoint: String,
        expected: String,
        presented: String,
    },
    #[error("reading {what} from {endpoint}: {source}")]
    Read {
        endpoint: String,
        what: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("{endpoint}: {why}")]
    Invalid { endpoint: String, why: String },
    #[error(transparent)]
    Protocol(#[from] tandem_core::protocol::Unsupported),
}

fn anonymous_client(endpoint: &str, ca_der: Option<Vec<u8>>) -> Result<Client, EnrollError> {
    let invalid = |why: String| EnrollError::Invalid {
        endpoint: endpoint.to_string(),
        why,
    };
    let url = endpoint
        .parse()
        .map_err(|e| invalid(format!("not a URL: {e}")))?;
    let mut config = kube::Config::new(url);
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(Duration::from_secs(15));
    match ca_der {
        Some(der) => config.root_cert = Some(vec![der]),
        // Only to read the CA, which is then checked against the pinned fingerprint: nothing
        // is sent on this connection but the GET (no credential exists on it).
        None => config.accept_invalid_certs = true,
    }
    Client::try_from(config).map_err(|e| invalid(format!("building a client: {e}")))
}

/// One certificate as PEM.
fn pem_certificate(der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}

/// Reads the provider at `endpoint`: its CA (kube-public/cluster-info, read without
/// credentials), refused unless its fingerprint is `pinned`; then, over TLS verified with
/// that CA, its enrollment credential (kube-public/tandem-enrollment).
pub async fn fetch_provider(endpoint: &str, pinned: &str) -> Result<ProviderInfo, EnrollError> {
    let invalid = |why: String| EnrollError::Invalid {
        endpoint: endpoint.to_string(),
        why,
    };
    let unverified = anonymous_client(endpoint, None)?;
    let info = Api::<ConfigMap>::namespaced(unverified, "kube-public")
        .get(CLUSTER_INFO)
        .await
        .map_err(|source| EnrollError::Read {
            endpoint: endpoint.to_string(),
            what: "ConfigMap kube-public/cluster-info",
            source,
        })?;
    let kubeconfig = info
        .data
        .as_ref()
        .and_then(|d| d.get("kubeconfig"))
        .ok_or_else(|| invalid("ConfigMap kube-public/cluster-info has no kubeconfig".into()))?;
    let parsed: serde_json::Value = serde_saphyr::from_str(kubeconfig)
        .map_err(|e| invalid(format!("cluster-info's kubeconfig: {e}")))?;
    let ca_b64 = parsed["clusters"][0]["cluster"]["certificate-authority-data"]
        .as_str()
        .ok_or_else(|| {
            invalid("cluster-info's kubeconfig has no certificate-authority-data".into())
        })?;
    let bundle = base64::engine::general_purpose::STANDARD
        .decode(ca_b64.trim())
        .map_err(|_| invalid("cluster-info's certificate-authority-data is not base64".into()))?;
    use rustls::pki_types::pem::PemObject as _;
    let certificates: Vec<Vec<u8>> = rustls::pki_types::CertificateDer::pem_slice_iter(&bundle)
        .filter_map(Result::ok)
        .map(|c| c.to_vec())
        .collect();
    // Only the pinned certificate is kept: a bundle adding another CA to the pinned one would
    // otherwise have the controller trust whoever holds that other CA.
    let Some(der) = certificates
        .iter()
        .find(|der| tandem_core::discovery::fingerprint(der) == pinned)
        .cloned()
    else {
        let presented = certificates
            .iter()
            .map(|der| tandem_core::discovery::fingerprint(der))
            .collect::<Vec<_>>();
        if presented.is_empty() {
            return Err(invalid("cluster-info's CA is not a PEM certificate".into()));
        }
        return Err(EnrollError::FingerprintMismatch {
            endpoint: endpoint.to_string(),
            expected: pinned.to_string(),
            presented: presented.join(", "),
        });
    };
    let ca_pem = pem_certificate(&der);
    let verified = anonymous_client(endpoint, Some(der))?;
    let published = Api::<ConfigMap>::namespaced(verified, "kube-public")
        .get(ENROLLMENT_CONFIGMAP)
        .await
        .map_err(|source| EnrollError::Read {
            endpoint: endpoint.to_string(),
            what: "its enrollment credential (ConfigMap kube-public/tandem-enrollment; is it advertising?)",
            source,
        })?;
    let data = published.data.unwrap_or_default();
    let get = |k: &str| data.get(k).cloned().unwrap_or_default();
    let token = get("token");
    if !tandem_core::invite::valid_bearer_token(&token) {
        return Err(invalid(
            "its enrollment credential is not a bootstrap token".into(),
        ));
    }
    let cluster_id = get("clusterID");
    names::validate_cluster_id(&cluster_id)
        .map_err(|e| invalid(format!("its cluster ID {cluster_id:?}: {e}")))?;
    let protocol_version = get("protocolVersion")
        .parse()
        .map_err(|_| invalid("its protocol version is not a number".into()))?;
    tandem_core::protocol::check("provider", protocol_version)?;
    Ok(ProviderInfo {
        ca_pem,
        cluster_id,
        token,
        protocol_version,
    })
}

/// Hands the peering to this cluster's controller (`client`): tenant namespace, a Secret with
/// the enrollment credential, and the Peering. The controller files the request.
pub async fn request(
    client: &Client,
    endpoint: &str,
    provider: &ProviderInfo,
    source: &str,
) -> Result<(), InviteError> {
    crate::invite::create_peering(
        client,
        &provider.cluster_id,
        endpoint,
        &provider.ca_pem,
        [
            (tandem_controller::invite::TOKEN_KEY, provider.token.clone()),
            (MODE_KEY, MODE_ENROLL.to_string()),
            (SOURCE_KEY, source.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect(),
    )
    .await
}
