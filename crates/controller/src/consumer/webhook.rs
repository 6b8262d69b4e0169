//! The pod-placement mutating admission webhook: pods created in an offloaded namespace get the
//! toleration of the virtual-node taint and the required node affinity their namespace's pod
//! offloading strategy asks for (see `tandem_core::offloading::placement_patch`); DaemonSets, in
//! every namespace, are kept off virtual nodes unless they opt in (see `consumer::daemonset`).
//!
//! The server speaks HTTPS with a certificate issued at start by a throw-away CA, whose PEM goes
//! into the `tandem-pod-placement` MutatingWebhookConfiguration's caBundle. The certificate
//! lives [`Options::webhook_certificate_lifetime`](crate::context::Options) and is replaced
//! after two thirds of it, or when asked ([`ROTATE_ANNOTATION`], `tandem rotate
//! webhook-certificate`), without a failed call: the new CA joins the caBundle first, the
//! server switches once the API server has had time to see it, and the old CA leaves last.

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde::Deserialize;
use serde_json::{Value, json};
use tandem_api::{NamespaceOffloading, PodOffloadingStrategy, names};
use tandem_core::offloading::{
    PodPlacement, eviction_tolerations, placement_patch, tolerates_virtual_nodes,
};

use crate::consumer::daemonset;
use crate::consumer::offloading::{
    OFFLOADING_ENABLED, OFFLOADING_LABEL, placement, selector_terms,
};
use crate::context::Ctx;
use crate::install::apply;
use crate::node_marks::MARKS;
use crate::provider::peer_writes;

pub use tandem_api::names::PLACEMENT_WEBHOOK as WEBHOOK_CONFIGURATION;
/// Annotation of the MutatingWebhookConfiguration asking for a new serving certificate: any
/// new value (`tandem rotate webhook-certificate` writes the time) is one request.
pub const ROTATE_ANNOTATION: &str = "tandem.dev/rotate-certificate";
/// Annotation the controller sets to the request it last fulfilled (the value of
/// [`ROTATE_ANNOTATION`]) once the new certificate serves.
pub const ROTATED_ANNOTATION: &str = "tandem.dev/certificate-rotated";
/// Annotation the controller sets to when the serving certificate expires (RFC 3339).
pub const NOT_AFTER_ANNOTATION: &str = "tandem.dev/certificate-not-after";
/// The longest serving certificate issued (a longer lifetime is cut to it).
pub const MAX_LIFETIME: std::time::Duration = std::time::Duration::from_secs(10 * 365 * 24 * 3600);
/// After a failed rotation, when to try again (the old certificate still serves).
const ROTATION_RETRY: std::time::Duration = std::time::Duration::from_secs(30);

/// Serves the webhook; retries its setup until it succeeds.
pub async fn run(ctx: Ctx) {
    loop {
        match serve(&ctx).await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(error = %crate::error::chain(&e), "pod-placement webhook");
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            }
        }
    }
}

/// Why the webhook could not start serving.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("{0}")]
    Certificate(&'static str, #[source] rcgen::Error),
    #[error("TLS config")]
    Tls(#[source] rustls::Error),
    #[error("listening on {addr}")]
    Listen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("listener address")]
    LocalAddr(#[source] std::io::Error),
    #[error("applying MutatingWebhookConfiguration {WEBHOOK_CONFIGURATION}")]
    Configuration(#[source] kube::Error),
    #[error(
        "applying ValidatingWebhookConfiguration {}",
        peer_writes::WEBHOOK_CONFIGURATION
    )]
    ValidatingConfiguration(#[source] kube::Error),
}

/// Where the API server calls the webhook.
#[derive(Clone, Debug)]
pub enum WebhookTarget {
    /// An address it reaches directly (`https://127.0.0.1:port`, in-process lab controllers).
    Url(String),
    /// A Service in front of the controller's pod (namespace, name), port 443.
    Service(String, String),
}

impl WebhookTarget {
    /// The `clientConfig` calling `path` on this target.
    fn client_config(&self, path: &str, ca_pem: &str) -> Value {
        match self {
            WebhookTarget::Url(base) => {
                json!({"url": format!("{base}{path}"), "caBundle": STANDARD.encode(ca_pem)})
            }
            WebhookTarget::Service(namespace, name) => json!({
                "service": {"namespace": namespace, "name": name, "path": path, "port": 443},
                "caBundle": STANDARD.encode(ca_pem)}),
        }
    }

    /// Names the serving certificate must carry.
    fn names(&self) -> Vec<String> {
        let mut names = vec!["127.0.0.1".to_string(), "localhost".to_string()];
        if let WebhookTarget::Service(ns, name) = self {
            names.push(format!("{name}.{ns}.svc"));
            names.push(format!("{name}.{ns}.svc.cluster.local"));
        }
        names
    }
}

/// A serving certificate and the CA that signed it.
struct Issued {
    /// The CA's PEM (what the caBundle carries).
    ca_pem: String,
    key: Arc<rustls::sign::CertifiedKey>,
    /// The end of the certificate's validity.
    not_after: time::OffsetDateTime,
}

/// A new CA and serving certificate for `target`, valid from five minutes ago (clock skew) for
/// `lifetime` (at most [`MAX_LIFETIME`]).
fn issue(target: &WebhookTarget, lifetime: std::time::Duration) -> Result<Issued, WebhookError> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let e = |what: &'static str| move |err: rcgen::Error| WebhookError::Certificate(what, err);
    let now = time::OffsetDateTime::now_utc();
    let not_before = now - time::Duration::minutes(5);
    let not_after = now + lifetime.min(MAX_LIFETIME);
    let ca_key = KeyPair::generate().map_err(e("generating the CA key"))?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(e("CA params"))?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "tandem-pod-placement-ca");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.not_before = not_before;
    ca_params.not_after = not_after;
    let ca_cert = ca_params
        .self_signed(&ca_key)
        .map_err(e("self-signing the CA"))?;
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().map_err(e("generating the server key"))?;
    let mut params = CertificateParams::new(target.names()).map_err(e("server params"))?;
    params
        .distinguished_name
        .push(DnType::CommonName, "tandem-pod-placement");
    params.not_before = not_before;
    params.not_after = not_after;
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(e("signing the server certificate"))?;
    let signing = rustls::crypto::ring::sign::any_supported_type(
        &rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
    .map_err(WebhookError::Tls)?;
    Ok(Issued {
        ca_pem: ca_cert.pem(),
        key: Arc::new(rustls::sign::CertifiedKey::new(
            vec![cert.der().clone()],
            signing,
        )),
        not_after,
    })
}

/// The serving certificate, swapped in place on rotation: connections already open keep the
/// one they were made with.
#[derive(Debug)]
struct CurrentCertificate(std::sync::RwLock<Arc<rustls::sign::CertifiedKey>>);

impl rustls::server::ResolvesServerCert for CurrentCertificate {
    fn resolve(
        &self,
        _hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.read().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

/// The server's TLS configuration, presenting whatever `current` holds.
fn server_config(current: Arc<CurrentCertificate>) -> Result<rustls::ServerConfig, WebhookError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(WebhookError::Tls)?
        .with_no_client_auth()
        .with_cert_resolver(current);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// The NamespaceOffloadings, cached: a burst of pod creates must not cost a GET each.
fn offloadings(ctx: &Ctx) -> (Store<NamespaceOffloading>, tokio::task::JoinHandle<()>) {
    let (reader, writer) = reflector::store();
    let api: Api<NamespaceOffloading> = Api::all(ctx.client.clone());
    let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()))
        .default_backoff()
        .touched_objects()
        .for_each(|_| async {});
    (reader, tokio::spawn(stream))
}

async fn serve(ctx: &Ctx) -> Result<(), WebhookError> {
    let (cache, cache_task) = offloadings(ctx);
    // Stops the cache's watch when the server stops.
    let _cache_task = crate::tasks::AbortOnDrop::new(cache_task);
    let listener = tokio::net::TcpListener::bind(ctx.options.webhook_addr)
        .await
        .map_err(|source| WebhookError::Listen {
            addr: ctx.options.webhook_addr,
            source,
        })?;
    let addr = listener.local_addr().map_err(WebhookError::LocalAddr)?;
    let target = match &ctx.options.webhook_service {
        Some((ns, name)) => WebhookTarget::Service(ns.clone(), name.clone()),
        None => WebhookTarget::Url(format!("https://{addr}")),
    };
    let lifetime = ctx.options.webhook_certificate_lifetime;
    let issued = issue(&target, lifetime)?;
    let current = Arc::new(CurrentCertificate(std::sync::RwLock::new(
        issued.key.clone(),
    )));
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_config(current.clone())?));
    let hooks: Api<MutatingWebhookConfiguration> = Api::all(ctx.client.clone());
    // A request made before this start is fulfilled by it: the certificate is new. (Unreadable
    // — a ClusterRole older than this binary — it is left to the watch: serving comes first.)
    let fulfilled = match hooks.get_opt(WEBHOOK_CONFIGURATION).await {
        Ok(config) => config.and_then(|c| annotation(&c, ROTATE_ANNOTATION)),
        Err(e) => {
            tracing::warn!(error = %e, "reading MutatingWebhookConfiguration {WEBHOOK_CONFIGURATION}");
            None
        }
    };
    apply_configurations(
        &hooks,
        &target,
        &issued.ca_pem,
        &certificate_annotations(&issued, fulfilled.as_deref()),
    )
    .await?;
    tracing::info!(%addr, ?target, not_after = %issued.not_after, "pod-placement webhook serving");
    let rotation = tokio::spawn(rotate(
        hooks,
        target.clone(),
        (lifetime, ctx.options.webhook_ca_propagation),
        issued,
        current,
        fulfilled,
    ));
    let _rotation = crate::tasks::AbortOnDrop::new(rotation);
    loop {
        let (tcp, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "webhook accept");
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let ctx = ctx.clone();
        let cache = cache.clone();
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let service =
                hyper::service::service_fn(move |req| handle(ctx.clone(), cache.clone(), req));
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
    }
}

/// Path of the pod-placement webhook.
const MUTATE_PATH: &str = "/mutate-pods";

/// Path suffix of the webhook keeping pods of non-offloaded namespaces off virtual nodes.
const LOCAL_ONLY_SUFFIX: &str = "-local";

/// The annotations recording `issued` and the last rotation request fulfilled.
fn certificate_annotations(issued: &Issued, fulfilled: Option<&str>) -> Value {
    let not_after = issued
        .not_after
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    let mut annotations = json!({NOT_AFTER_ANNOTATION: not_after});
    if let Some(request) = fulfilled {
        annotations[ROTATED_ANNOTATION] = json!(request);
    }
    annotations
}

fn annotation(config: &MutatingWebhookConfiguration, key: &str) -> Option<String> {
    config.metadata.annotations.as_ref()?.get(key).cloned()
}

/// Replaces the serving certificate after two thirds of its lifetime, or when the
/// configuration's [`ROTATE_ANNOTATION`] changes (watched), for as long as the server runs.
async fn rotate(
    hooks: Api<MutatingWebhookConfiguration>,
    target: WebhookTarget,
    (lifetime, propagation): (std::time::Duration, std::time::Duration),
    mut issued: Issued,
    current: Arc<CurrentCertificate>,
    mut fulfilled: Option<String>,
) {
    let requests = watcher(
        hooks.clone(),
        watcher::Config::default().fields(&format!("metadata.name={WEBHOOK_CONFIGURATION}")),
    )
    .default_backoff()
    .applied_objects()
    .filter_map(|c| async move {
        match c {
            Ok(c) => annotation(&c, ROTATE_ANNOTATION),
            Err(e) => {
                tracing::warn!(error = %e, "watching for certificate rotation requests");
                None
            }
        }
    });
    tokio::pin!(requests);
    let renew_after = renew_after(lifetime, propagation);
    let mut due = tokio::time::Instant::now() + renew_after;
    // A request whose rotation failed, tried again at `due`.
    let mut pending: Option<String> = None;
    loop {
        let request = tokio::select! {
            () = tokio::time::sleep_until(due) => pending.take(),
            Some(request) = requests.next() => {
                if fulfilled.as_ref() == Some(&request) || pending.as_ref() == Some(&request) {
                    continue;
                }
                Some(request)
            }
        };
        let reason = if request.is_some() {
            "requested"
        } else {
            "scheduled"
        };
        let annotated = Fulfilled {
            before: fulfilled.as_deref(),
            after: request.as_deref().or(fulfilled.as_deref()),
        };
        match rotate_once(
            &hooks,
            &target,
            lifetime,
            &issued,
            &current,
            annotated,
            propagation,
        )
        .await
        {
            Ok(new) => {
                tracing::info!(reason, not_after = %new.not_after,
                    "pod-placement webhook: serving certificate rotated");
                issued = new;
                if request.is_some() {
                    fulfilled = request;
                    pending = None;
                }
                due = tokio::time::Instant::now() + renew_after;
            }
            Err(e) => {
                tracing::warn!(reason, error = %crate::error::chain(&e),
                    "pod-placement webhook: rotating the serving certificate (the current one \
                     still serves; trying again in 30s)");
                pending = request;
                due = tokio::time::Instant::now() + ROTATION_RETRY;
            }
        }
    }
}

/// When a certificate of `lifetime` is replaced: after two thirds of it, and early enough that
/// the new one serves (a rotation takes `propagation`) a while before the old one expires.
fn renew_after(
    lifetime: std::time::Duration,
    propagation: std::time::Duration,
) -> std::time::Duration {
    (lifetime * 2 / 3)
        .min(lifetime.saturating_sub(propagation * 2))
        .max(lifetime / 2)
}

/// The rotation request the annotations name before and after a rotation.
#[derive(Clone, Copy)]
struct Fulfilled<'a> {
    before: Option<&'a str>,
    after: Option<&'a str>,
}

/// One rotation: the new CA joins the caBundle, the server switches to the new certificate
/// once the API server has seen it, and the old CA leaves; the annotations record `fulfilled`
/// (the request only once the new certificate serves). Once the server has switched, the
/// rotation is done even if the old CA could not be removed: the bundle then still holds both,
/// and the next rotation builds on the certificate that serves.
async fn rotate_once(
    hooks: &Api<MutatingWebhookConfiguration>,
    target: &WebhookTarget,
    lifetime: std::time::Duration,
    old: &Issued,
    current: &CurrentCertificate,
    fulfilled: Fulfilled<'_>,
    propagation: std::time::Duration,
) -> Result<Issued, WebhookError> {
    let new = issue(target, lifetime)?;
    let both = format!("{}{}", new.ca_pem, old.ca_pem);
    apply_configurations(
        hooks,
        target,
        &both,
        &certificate_annotations(old, fulfilled.before),
    )
    .await?;
    tokio::time::sleep(propagation).await;
    *current.0.write().unwrap_or_else(|e| e.into_inner()) = new.key.clone();
    if let Err(e) = apply_configurations(
        hooks,
        target,
        &new.ca_pem,
        &certificate_annotations(&new, fulfilled.after),
    )
    .await
    {
        tracing::warn!(error = %e, "pod-placement webhook: removing the old CA from the caBundle \
            (both stay trusted until the next rotation)");
    }
    Ok(new)
}

/// Points both webhooks this server serves at `target`, trusting the CAs of `ca_pem`: the
/// pod-placement one (a MutatingWebhookConfiguration, carrying the certificate's annotations)
/// and the provider's check of what peers write in twin namespaces (a validating one, see
/// `provider::peer_writes`), so that a rotation moves both.
async fn apply_configurations(
    hooks: &Api<MutatingWebhookConfiguration>,
    target: &WebhookTarget,
    ca_pem: &str,
    annotations: &Value,
) -> Result<(), WebhookError> {
    apply(hooks, &configuration(target, ca_pem, annotations))
        .await
        .map_err(WebhookError::Configuration)?;
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(hooks.clone().into_client());
    apply(
        &validating,
        &peer_writes::configuration(target.client_config(peer_writes::PATH, ca_pem)),
    )
    .await
    .map(drop)
    .map_err(WebhookError::ValidatingConfiguration)
}

/// The MutatingWebhookConfiguration pointing at `target`, trusting the CAs of `ca_pem`.
pub fn configuration(
    target: &WebhookTarget,
    ca_pem: &str,
    annotations: &Value,
) -> MutatingWebhookConfiguration {
    serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK_CONFIGURATION,
                     "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY},
                     "annotations": annotations},
        "webhooks": [{
            "name": "pod-placement.tandem.dev",
            "clientConfig": target.client_config(MUTATE_PATH, ca_pem),
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]},
                      {"operations": ["CREATE", "UPDATE"], "apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["daemonsets"]}],
            "namespaceSelector": {"matchLabels": {OFFLOADING_LABEL: OFFLOADING_ENABLED}},
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 10,
        }, {
            // Pods of namespaces that are not offloaded never land on a virtual node, even if
            // they tolerate its taint (no virtual kubelet would run them). Ignore on failure:
            // this must never block pod creation in the rest of the cluster.
            "name": "pod-locality.tandem.dev",
            "clientConfig": target.client_config(&format!("{MUTATE_PATH}{LOCAL_ONLY_SUFFIX}"), ca_pem),
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]},
                      {"operations": ["CREATE", "UPDATE"], "apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["daemonsets"]}],
            // Twin namespaces are left out: the provider's controller gives the pods it creates
            // there this affinity itself (see `provider::shadowpod`), sparing the API server a
            // webhook call per offloaded pod.
            "namespaceSelector": {"matchExpressions": [
                {"key": OFFLOADING_LABEL, "operator": "NotIn", "values": [OFFLOADING_ENABLED]},
                {"key": names::TWIN_NAMESPACE_LABEL, "operator": "DoesNotExist"}]},
            "failurePolicy": "Ignore",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5,
        }],
    }))
    .expect("static manifest")
}

/// The parts of an AdmissionReview the webhook reads. Decoding only these skips the rest of
/// the pod (its metadata, containers, volumes...): the webhook is called for every pod created.
#[derive(Default, Deserialize)]
#[serde(default)]
struct Review {
    request: ReviewRequest,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct ReviewRequest {
    uid: Value,
    kind: ReviewKind,
    namespace: Option<String>,
    object: Option<PlacementFields>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct ReviewKind {
    kind: String,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct PlacementFields {
    spec: PlacementSpec,
}

/// What `placement_patch`, `tolerates_virtual_nodes` and `local_claims` read of a pod.
#[derive(Default, Deserialize)]
#[serde(default)]
struct PlacementSpec {
    tolerations: Value,
    affinity: Value,
    volumes: Value,
}

impl ReviewRequest {
    /// The pod as far as placement goes (absent fields read as null, as in the whole pod).
    fn pod(&self) -> Value {
        let spec = self.object.as_ref().map(|o| &o.spec);
        json!({"spec": {
            "tolerations": spec.map_or(&Value::Null, |s| &s.tolerations),
            "affinity": spec.map_or(&Value::Null, |s| &s.affinity),
            "volumes": spec.map_or(&Value::Null, |s| &s.volumes),
        }})
    }
}

async fn handle(
    ctx: Ctx,
    cache: Store<NamespaceOffloading>,
    req: http::Request<Incoming>,
) -> Result<http::Response<Full<Bytes>>, hyper::Error> {
    let arrived = std::time::Instant::now();
    let local_only = req.uri().path().ends_with(LOCAL_ONLY_SUFFIX);
    let peer_writes = req.uri().path() == peer_writes::PATH;
    let body = req.into_body().collect().await?.to_bytes();
    if peer_writes {
        let answer = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": peer_writes::review(&ctx, &body).await,
        });
        return Ok(http::Response::builder()
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(answer.to_string())))
            .expect("static response"));
    }
    // An unreadable review has no uid to answer; the API server rejects the answer.
    let review: Review = serde_json::from_slice(&body).unwrap_or_default();
    let response = if review.request.kind.kind == "DaemonSet" {
        // Rare (DaemonSets change seldom): the whole object is decoded.
        keep_daemonset_off_virtual_nodes(&review.request.uid, &body)
    } else if local_only {
        keep_local(&review.request)
    } else {
        admit(&ctx, &cache, &review.request).await
    };
    let answer = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    });
    ctx.metrics.webhook_answered(arrived);
    Ok(http::Response::builder()
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(answer.to_string())))
        .expect("static response"))
}

/// A pod of a namespace that is not offloaded: if it tolerates the virtual-node taint, add the
/// Local strategy's affinity so that it still stays off virtual nodes. Other pods are untouched.
fn keep_local(request: &ReviewRequest) -> Value {
    let uid = &request.uid;
    let pod = request.pod();
    if request.kind.kind != "Pod" || !tolerates_virtual_nodes(&pod, MARKS) {
        return json!({"uid": uid, "allowed": true});
    }
    let patch = placement_patch(&pod, placement(PodOffloadingStrategy::Local), &[], MARKS);
    allowed_with(uid, patch)
}

/// An admission that allows the object, changed by `patch` (JSON patch) unless it is empty.
fn allowed_with(uid: &Value, patch: Vec<Value>) -> Value {
    if patch.is_empty() {
        return json!({"uid": uid, "allowed": true});
    }
    json!({
        "uid": uid,
        "allowed": true,
        "patchType": "JSONPatch",
        "patch": STANDARD.encode(Value::Array(patch).to_string()),
    })
}

/// A DaemonSet, in any namespace: kept off virtual nodes unless it opts in (see
/// `consumer::daemonset`).
fn keep_daemonset_off_virtual_nodes(uid: &Value, body: &[u8]) -> Value {
    let review: Value = serde_json::from_slice(body).unwrap_or_default();
    allowed_with(
        uid,
        daemonset::admission_patch(&review["request"]["object"]),
    )
}

/// The admission response for one request.
async fn admit(ctx: &Ctx, cache: &Store<NamespaceOffloading>, request: &ReviewRequest) -> Value {
    let uid = &request.uid;
    let namespace = request.namespace.as_deref().unwrap_or_default();
    let allowed = json!({"uid": uid, "allowed": true});
    if request.kind.kind != "Pod" || namespace.is_empty() {
        return allowed;
    }
    let cached = cache.get(&ObjectRef::new(names::OFFLOADING_NAME).within(namespace));
    // The namespace is labelled, so an offloading exists or did: on a cache miss (the watch
    // lagging behind the label) ask the API server.
    let lookup = match cached {
        Some(o) => Ok(Some((*o).clone())),
        None => {
            let api: Api<NamespaceOffloading> = Api::namespaced(ctx.client.clone(), namespace);
            api.get_opt(names::OFFLOADING_NAME).await
        }
    };
    let offloading = match lookup {
        Ok(Some(o)) if o.metadata.deletion_timestamp.is_none() => o,
        Ok(_) => return allowed,
        Err(e) => {
            // Failing closed: a pod placed without its constraints could land anywhere.
            return json!({"uid": uid, "allowed": false, "status": {
                "code": 500,
                "message": format!("tandem pod placement: reading NamespaceOffloading {namespace}/{}: {e}", names::OFFLOADING_NAME),
            }});
        }
    };
    let terms = selector_terms(&offloading);
    if let Err(problem) = crate::input::cluster_selector(&terms) {
        // The offloading's own status reports it too; a pod placed by a selector that means
        // nothing could land anywhere.
        return json!({"uid": uid, "allowed": false, "status": {
            "code": 422,
            "message": format!("tandem pod placement: NamespaceOffloading {namespace}/{}: {problem}", names::OFFLOADING_NAME),
        }});
    }
    let mut pod = request.pod();
    let mut patch = Vec::new();
    // The namespace's eviction timing first: the placement patch then appends to the
    // tolerations as they are after it.
    if let Some(seconds) = evict_after_seconds(&offloading)
        && let Some(tolerations) = eviction_tolerations(&pod, seconds)
    {
        patch.push(json!({"op": "add", "path": "/spec/tolerations", "value": tolerations}));
        pod["spec"]["tolerations"] = tolerations;
    }
    // Fencing: the pod carries its bound, which the virtual kubelet passes on to the provider
    // (as a label of its ShadowPod) and the consumer's fence reads back.
    if let Some(fence_after) = offloading.spec.fence_after() {
        patch.push(if pod["metadata"]["annotations"].is_object() {
            json!({"op": "add",
                "path": format!("/metadata/annotations/{}", names::FENCE_AFTER.replace('/', "~1")),
                "value": fence_after})
        } else {
            json!({"op": "add", "path": "/metadata/annotations",
                "value": {names::FENCE_AFTER: fence_after}})
        });
    }
    let mut strategy = placement(offloading.spec.pod_offloading_strategy);
    if strategy != PodPlacement::Local {
        match local_claims(ctx, namespace, &pod).await {
            Ok(local) if local.is_empty() => {}
            // A volume of this cluster cannot follow the pod to a provider: the pod stays here.
            Ok(_) if strategy == PodPlacement::LocalAndRemote => strategy = PodPlacement::Local,
            Ok(local) => {
                return json!({"uid": uid, "allowed": false, "status": {
                    "code": 422,
                    "message": format!(
                        "tandem pod placement: namespace {namespace} runs pods only in providers (Remote), \
                         but claim(s) {} are not of StorageClass {:?} and cannot follow the pod there; \
                         give them storageClassName {:?} or offload with LocalAndRemote",
                        local.join(", "), names::STORAGE_CLASS, names::STORAGE_CLASS),
                }});
            }
            Err(e) => {
                return json!({"uid": uid, "allowed": false, "status": {
                    "code": 500,
                    "message": format!("tandem pod placement: reading the pod's claims in {namespace}: {e}"),
                }});
            }
        }
    }
    patch.extend(placement_patch(&pod, strategy, &terms, MARKS));
    allowed_with(uid, patch)
}

/// The offloading's `evictAfter` in whole seconds (rounded up), when set and readable (its
/// schema's pattern makes it so).
fn evict_after_seconds(offloading: &NamespaceOffloading) -> Option<i64> {
    let d = tandem_core::fence::parse(offloading.spec.evict_after.as_deref()?)?;
    i64::try_from(tandem_core::fence::whole_seconds(d)).ok()
}

/// The pod's volumes that live in this cluster: claims not of Tandem's StorageClass (or not
/// created yet), and ephemeral volumes (claims made here from a template). Tandem provisions
/// only its own class's claims in a provider; any other would be provisioned or bound here,
/// where a pod on a virtual node could never mount it.
async fn local_claims(ctx: &Ctx, namespace: &str, pod: &Value) -> Result<Vec<String>, kube::Error> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), namespace);
    let mut local = Vec::new();
    for volume in pod["spec"]["volumes"].as_array().into_iter().flatten() {
        let name = volume["name"].as_str().unwrap_or_default();
        if volume.get("ephemeral").is_some() {
            local.push(format!("{name} (ephemeral)"));
            continue;
        }
        let Some(claim) = volume["persistentVolumeClaim"]["claimName"].as_str() else {
            continue;
        };
        let class = api
            .get_opt(claim)
            .await?
            .and_then(|c| c.spec.and_then(|s| s.storage_class_name));
        if class.as_deref() != Some(names::STORAGE_CLASS) {
            local.push(claim.to_string());
        }
    }
    Ok(local)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn review(pod: Value) -> ReviewRequest {
        let body = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "r-1", "namespace": "default", "operation": "CREATE",
                "kind": {"group": "", "version": "v1", "kind": "Pod"}, "object": pod}});
        serde_json::from_slice::<Review>(body.to_string().as_bytes())
            .expect("decodes")
            .request
    }

    #[test]
    fn keeps_pods_tolerating_virtual_nodes_local_from_the_review_alone() {
        let toleration =
            json!({"key": names::VIRTUAL_NODE_TAINT, "operator": "Exists", "effect": "NoExecute"});
        let pod = json!({"metadata": {"name": "p", "managedFields": [{"manager": "m"}]},
            "spec": {"containers": [{"name": "c", "image": "pause"}],
                     "tolerations": [toleration],
                     "affinity": {"podAntiAffinity": {}}}});
        let answer = keep_local(&review(pod));
        assert_eq!(answer["uid"], "r-1");
        assert_eq!(answer["allowed"], true);
        let patch: Value = serde_json::from_slice(
            &STANDARD
                .decode(answer["patch"].as_str().expect("a patch"))
                .expect("base64"),
        )
        .expect("JSON");
        // The pod's own affinity is kept: the node affinity is added beside it.
        assert_eq!(patch[0]["path"], "/spec/affinity/nodeAffinity");

        let plain = json!({"metadata": {"name": "q"},
            "spec": {"containers": [{"name": "c", "image": "pause"}]}});
        let answer = keep_local(&review(plain));
        assert_eq!(answer, json!({"uid": "r-1", "allowed": true}));
    }

    #[test]
    fn an_unreadable_review_is_answered_without_a_patch() {
        let review: Review = serde_json::from_slice(b"{not json").unwrap_or_default();
        let answer = keep_local(&review.request);
        assert!(answer.get("patch").is_none());
        assert_eq!(answer["uid"], Value::Null);
    }
}
