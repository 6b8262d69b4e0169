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
//!
//! This module observes (the review, the NamespaceOffloading cache, the pod's claims, rotation
//! requests) and acts (answers, configurations applied, the certificate switched); what to do
//! is decided in `plan`, the certificates are made in `tls`.

use std::sync::Arc;

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
use serde_json::Value;
use tandem_api::{NamespaceOffloading, names};

use crate::context::Ctx;
use crate::install::apply;
use crate::provider::peer_writes;

mod errors;
mod plan;
mod tls;

pub use errors::WebhookError;
use plan::{Admission, Fulfilled, Hook, Placing, ReviewRequest, Rotations, Triage};
pub use plan::{
    MAX_LIFETIME, NOT_AFTER_ANNOTATION, ROTATE_ANNOTATION, ROTATED_ANNOTATION,
    WEBHOOK_CONFIGURATION, WebhookTarget, configuration,
};
use tls::{CurrentCertificate, Issued};

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
    let issued = tls::issue(&target, lifetime, time::OffsetDateTime::now_utc())?;
    let current = Arc::new(CurrentCertificate::new(issued.key.clone()));
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls::server_config(current.clone())?));
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
        &plan::certificate_annotations(issued.not_after, fulfilled.as_deref()),
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
    fulfilled: Option<String>,
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
    let mut rotations = Rotations::new(
        lifetime,
        propagation,
        fulfilled,
        tokio::time::Instant::now(),
    );
    loop {
        let rotation = tokio::select! {
            () = tokio::time::sleep_until(rotations.due) => rotations.when_due(),
            Some(request) = requests.next() => match rotations.when_requested(request) {
                Ok(rotation) => rotation,
                Err(_ignored) => continue,
            }
        };
        let reason = rotation.reason();
        match rotate_once(
            &hooks,
            &target,
            lifetime,
            &issued,
            &current,
            rotations.annotated(&rotation),
            propagation,
        )
        .await
        {
            Ok(new) => {
                tracing::info!(reason, not_after = %new.not_after,
                    "pod-placement webhook: serving certificate rotated");
                issued = new;
                rotations.rotated(rotation, tokio::time::Instant::now());
            }
            Err(e) => {
                tracing::warn!(reason, error = %crate::error::chain(&e),
                    "pod-placement webhook: rotating the serving certificate (the current one \
                     still serves; trying again in 30s)");
                rotations.failed(rotation, tokio::time::Instant::now());
            }
        }
    }
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
    let new = tls::issue(target, lifetime, time::OffsetDateTime::now_utc())?;
    let both = format!("{}{}", new.ca_pem, old.ca_pem);
    apply_configurations(
        hooks,
        target,
        &both,
        &plan::certificate_annotations(old.not_after, fulfilled.before),
    )
    .await?;
    tokio::time::sleep(propagation).await;
    current.switch(new.key.clone());
    if let Err(e) = apply_configurations(
        hooks,
        target,
        &new.ca_pem,
        &plan::certificate_annotations(new.not_after, fulfilled.after),
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
    let client = hooks.clone().into_client();
    let owner = install_anchor(&client).await;
    let mut mutating = configuration(target, ca_pem, annotations);
    mutating.metadata.owner_references = owner.clone();
    apply(hooks, &mutating)
        .await
        .map_err(WebhookError::Configuration)?;
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client);
    let mut checking = peer_writes::configuration(target.client_config(peer_writes::PATH, ca_pem));
    checking.metadata.owner_references = owner;
    apply(&validating, &checking)
        .await
        .map(drop)
        .map_err(WebhookError::ValidatingConfiguration)
}

/// The owner of the webhook configurations: the controller's ClusterRole, which every way of
/// installing Tandem creates and every way of removing it deletes (`helm uninstall`, `kubectl
/// delete -k`, `tandem uninstall`), so that the garbage collector removes the fail-closed
/// webhooks with it instead of leaving them to block pod creation in offloaded namespaces
/// with no server behind them. (A cluster-scoped object can only be owned by a cluster-scoped
/// one: not by the Deployment.) None when it cannot be read: the configurations are applied
/// unowned, as before.
async fn install_anchor(
    client: &kube::Client,
) -> Option<Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>> {
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(client.clone());
    match roles.get_opt(names::CONTROLLER_NAME).await {
        Ok(Some(role)) => Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "rbac.authorization.k8s.io/v1".into(),
                kind: "ClusterRole".into(),
                name: names::CONTROLLER_NAME.into(),
                uid: role.metadata.uid?,
                ..Default::default()
            },
        ]),
        Ok(None) => None,
        Err(e) => {
            tracing::warn!(
                "reading ClusterRole {} (the webhooks' owner): {e}",
                names::CONTROLLER_NAME
            );
            None
        }
    }
}

/// An HTTP answer carrying the AdmissionReview `answer`.
fn json_response(answer: &Value) -> http::Response<Full<Bytes>> {
    http::Response::builder()
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(answer.to_string())))
        .expect("static response")
}

async fn handle(
    ctx: Ctx,
    cache: Store<NamespaceOffloading>,
    req: http::Request<Incoming>,
) -> Result<http::Response<Full<Bytes>>, hyper::Error> {
    let arrived = std::time::Instant::now();
    let hook = Hook::of(req.uri().path());
    let body = req.into_body().collect().await?.to_bytes();
    if hook == Hook::PeerWrites {
        let answer = plan::answer(peer_writes::review(&ctx, &body).await);
        return Ok(json_response(&answer));
    }
    // An unreadable review has no uid to answer; the API server rejects the answer.
    let review: plan::Review = serde_json::from_slice(&body).unwrap_or_default();
    let admission = match plan::triage(hook, &review.request, &body) {
        Triage::Answer(admission) => admission,
        Triage::Offloaded(namespace) => admit(&ctx, &cache, namespace, &review.request).await,
    };
    let answer = plan::answer(admission.response(&review.request.uid));
    ctx.metrics.webhook_answered(arrived);
    Ok(json_response(&answer))
}

/// The answer for a pod of `namespace`, placed as its NamespaceOffloading asks.
async fn admit(
    ctx: &Ctx,
    cache: &Store<NamespaceOffloading>,
    namespace: &str,
    request: &ReviewRequest,
) -> Admission {
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
    let placing = match Placing::new(namespace, request, lookup) {
        Ok(placing) => placing,
        Err(answer) => return answer,
    };
    let claims = if placing.reads_claims() {
        local_claims(ctx, namespace, placing.pod()).await
    } else {
        Ok(Vec::new())
    };
    placing.admission(claims)
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
