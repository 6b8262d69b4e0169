//! Item 5, admission: a mutating webhook that is down (failurePolicy Fail refuses, Ignore
//! lets through) and a real HTTPS webhook that labels the ConfigMaps it sees created.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use parking_lot::Mutex;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use serde_json::{Value, json};

use super::common::{Cluster, api_status};

/// A mutating webhook configuration for ConfigMap creates, calling `url`.
fn hook_config(
    name: &str,
    url: &str,
    ca_pem: Option<&str>,
    policy: &str,
) -> MutatingWebhookConfiguration {
    let mut client_config = json!({"url": url});
    if let Some(ca) = ca_pem {
        client_config["caBundle"] = json!(STANDARD.encode(ca));
    }
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "webhooks": [{
            "name": format!("{name}.tandem.test"),
            "clientConfig": client_config,
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"]}],
            "failurePolicy": policy,
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 2,
        }],
    }))
    .expect("webhook configuration")
}

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v"}})).unwrap()
}

/// A port nothing listens on.
async fn closed_port() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().port()
}

#[tokio::test]
async fn unreachable_webhook_refuses_with_fail_and_admits_with_ignore() {
    let cluster = Cluster::start().await;
    let hooks: Api<MutatingWebhookConfiguration> = Api::all(cluster.client.clone());
    let cms: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), "default");
    let url = format!("https://127.0.0.1:{}/", closed_port().await);

    hooks
        .create(
            &PostParams::default(),
            &hook_config("down", &url, None, "Fail"),
        )
        .await
        .unwrap();
    let status = api_status(
        cms.create(&PostParams::default(), &config_map("refused"))
            .await,
    );
    assert_eq!(status.code, 500, "{status:?}");
    assert!(
        status.message.contains("failed calling webhook")
            && status.message.contains("down.tandem.test"),
        "the refusal names the webhook: {:?}",
        status.message
    );
    assert_eq!(
        api_status(cms.get("refused").await).code,
        404,
        "nothing was stored"
    );

    hooks
        .delete("down", &DeleteParams::default())
        .await
        .unwrap();
    hooks
        .create(
            &PostParams::default(),
            &hook_config("down", &url, None, "Ignore"),
        )
        .await
        .unwrap();
    let admitted = cms
        .create(&PostParams::default(), &config_map("admitted"))
        .await
        .expect("failurePolicy Ignore admits when the webhook is down");
    assert!(
        admitted.labels().is_empty(),
        "no mutation happened: {:?}",
        admitted.labels()
    );
}

/// An HTTPS admission webhook with its own CA; it labels every object `mutated-by=webhook`.
struct LabellingWebhook {
    port: u16,
    url: String,
    ca_pem: String,
    calls: Arc<AtomicUsize>,
    reviews: Arc<Mutex<Vec<Value>>>,
}

impl LabellingWebhook {
    async fn start() -> LabellingWebhook {
        LabellingWebhook::start_as(&["127.0.0.1"]).await
    }

    /// A webhook whose serving certificate names `names`.
    async fn start_as(names: &[&str]) -> LabellingWebhook {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "webhook-ca");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "webhook");
        let cert = params.signed_by(&key, &issuer).unwrap();

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .unwrap();
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let calls = Arc::new(AtomicUsize::new(0));
        let counter = calls.clone();
        let reviews = Arc::new(Mutex::new(Vec::new()));
        let seen = reviews.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let counter = counter.clone();
                let seen = seen.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |req| {
                        counter.fetch_add(1, Ordering::SeqCst);
                        review(req, seen.clone())
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        LabellingWebhook {
            port,
            url: format!("https://127.0.0.1:{port}/mutate"),
            ca_pem: ca_cert.pem(),
            calls,
            reviews,
        }
    }
}

/// Answers an AdmissionReview with a JSON patch adding the label.
async fn review(
    req: http::Request<Incoming>,
    seen: Arc<Mutex<Vec<Value>>>,
) -> Result<http::Response<Full<Bytes>>, hyper::Error> {
    let body = req.into_body().collect().await?.to_bytes();
    let review: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    seen.lock().push(review.clone());
    let request = &review["request"];
    let patch = if request["object"]["metadata"]["labels"].is_object() {
        json!([{"op": "add", "path": "/metadata/labels/mutated-by", "value": "webhook"}])
    } else {
        json!([{"op": "add", "path": "/metadata/labels", "value": {"mutated-by": "webhook"}}])
    };
    let answer = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {
            "uid": request["uid"],
            "allowed": true,
            "patchType": "JSONPatch",
            "patch": STANDARD.encode(patch.to_string()),
        },
    });
    Ok(http::Response::builder()
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(answer.to_string())))
        .unwrap())
}

#[tokio::test]
async fn https_webhook_patches_a_label_onto_created_config_maps() {
    let cluster = Cluster::start().await;
    let webhook = LabellingWebhook::start().await;
    let hooks: Api<MutatingWebhookConfiguration> = Api::all(cluster.client.clone());
    hooks
        .create(
            &PostParams::default(),
            &hook_config("labeller", &webhook.url, Some(&webhook.ca_pem), "Fail"),
        )
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), "default");

    let mut with_labels = config_map("labelled");
    with_labels.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
    for cm in [config_map("plain"), with_labels] {
        let name = cm.name_any();
        let created = cms
            .create(&PostParams::default(), &cm)
            .await
            .expect("create");
        assert_eq!(
            created.labels().get("mutated-by").map(String::as_str),
            Some("webhook"),
            "{name}: the create response carries the mutation"
        );
        let stored = cms.get(&name).await.unwrap();
        assert_eq!(
            stored.labels()["mutated-by"],
            "webhook",
            "{name}: the mutation is stored"
        );
        if name == "labelled" {
            assert_eq!(stored.labels()["app"], "web", "existing labels are kept");
        }
    }
    assert_eq!(
        webhook.calls.load(Ordering::SeqCst),
        2,
        "one review per create"
    );
    let first = webhook.reviews.lock()[0].clone();
    assert_eq!(first["apiVersion"], "admission.k8s.io/v1", "{first}");
    assert_eq!(first["kind"], "AdmissionReview", "{first}");
    let request = &first["request"];
    assert!(
        request["uid"].as_str().is_some_and(|u| !u.is_empty()),
        "{request}"
    );
    assert_eq!(request["operation"], "CREATE", "{request}");
    assert_eq!(
        request["kind"],
        json!({"group": "", "version": "v1", "kind": "ConfigMap"})
    );
    assert_eq!(
        request["resource"],
        json!({"group": "", "version": "v1", "resource": "configmaps"})
    );
    assert_eq!(request["namespace"], "default");
    assert_eq!(request["name"], "plain");
    assert_eq!(request["object"]["data"]["k"], "v");
    assert_eq!(request["userInfo"]["username"], "admin");
    assert_eq!(request["dryRun"], false);

    // The rules say CREATE only: an update is not sent to the webhook.
    let mut cm = cms.get("plain").await.unwrap();
    cm.data = Some([("k".to_string(), "w".to_string())].into());
    cms.replace("plain", &PostParams::default(), &cm)
        .await
        .unwrap();
    assert_eq!(
        webhook.calls.load(Ordering::SeqCst),
        2,
        "updates do not match the rules"
    );
}

/// Points webhook `name` at Service `hooks/<service>` port 443, path `/mutate`.
fn service_hook_config(name: &str, service: &str, ca_pem: &str) -> MutatingWebhookConfiguration {
    let mut config = serde_json::to_value(hook_config(name, "-", Some(ca_pem), "Fail")).unwrap();
    config["webhooks"][0]["clientConfig"] = json!({
        "service": {"namespace": "hooks", "name": service, "path": "/mutate"},
        "caBundle": STANDARD.encode(ca_pem),
    });
    serde_json::from_value(config).unwrap()
}

#[tokio::test]
async fn a_webhook_behind_a_service_is_called_at_a_ready_endpoint_under_its_service_name() {
    let cluster = Cluster::start().await;
    let client = cluster.client.clone();
    // The certificate names only the Service: the call is verified as `labeller.hooks.svc`.
    let webhook = LabellingWebhook::start_as(&["labeller.hooks.svc"]).await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "hooks"}})).unwrap(),
        )
        .await
        .unwrap();
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(client.clone(), "hooks");
    let slices: Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
        Api::namespaced(client.clone(), "hooks");
    for name in ["labeller", "empty"] {
        services
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": name},
                    "spec": {"ports": [{"name": "https", "port": 443, "targetPort": webhook.port}]},
                }))
                .unwrap(),
            )
            .await
            .unwrap();
    }
    // One endpoint not ready (nothing listens there), one ready: only the ready one is called.
    slices
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "labeller-1", "labels": {"kubernetes.io/service-name": "labeller"}},
                "addressType": "IPv4",
                "endpoints": [
                    {"addresses": ["127.0.0.1"], "conditions": {"ready": true}},
                    {"addresses": ["127.0.0.2"], "conditions": {"ready": false}},
                ],
                "ports": [{"name": "https", "port": webhook.port}],
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let hooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    hooks
        .create(
            &PostParams::default(),
            &service_hook_config("labeller", "labeller", &webhook.ca_pem),
        )
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for i in 0..4 {
        let created = cms
            .create(
                &PostParams::default(),
                &config_map(&format!("via-service-{i}")),
            )
            .await
            .expect("admitted through the Service");
        assert_eq!(
            created.labels().get("mutated-by").map(String::as_str),
            Some("webhook")
        );
    }
    assert_eq!(webhook.calls.load(Ordering::SeqCst), 4);

    // A Service without endpoints: refused (failurePolicy Fail), saying so, nothing stored.
    hooks
        .delete("labeller", &DeleteParams::default())
        .await
        .unwrap();
    hooks
        .create(
            &PostParams::default(),
            &service_hook_config("nowhere", "empty", &webhook.ca_pem),
        )
        .await
        .unwrap();
    let status = api_status(
        cms.create(&PostParams::default(), &config_map("refused"))
            .await,
    );
    assert!(
        status.message.contains("nowhere.tandem.test")
            && status
                .message
                .contains("https://empty.hooks.svc:443/mutate")
            && status
                .message
                .contains("no endpoints available for service \"empty\""),
        "{status:?}"
    );
    assert_eq!(api_status(cms.get("refused").await).code, 404);
}
