//! The pod-placement webhook's serving certificate is replaced on schedule (after two thirds of
//! a short lifetime) and on request (the annotation `tandem rotate webhook-certificate`
//! writes), while pods are created in an offloaded namespace without pause: every create
//! succeeds (the webhook's failure policy is Fail there) and every pod carries the placement
//! only the webhook gives it. The API server keeps its connections to the webhook open, so at
//! every step a new TLS connection is also made, trusting what the caBundle holds then: a
//! server that presented a certificate the bundle does not yet trust would fail it.

use crate::support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tandem_api::{NamespaceOffloading, names};
use tandem_controller::consumer::webhook::{
    NOT_AFTER_ANNOTATION, ROTATE_ANNOTATION, ROTATED_ANNOTATION, WEBHOOK_CONFIGURATION,
};
use tandem_controller::context::Options;

use support::{Cluster, test_options, until};

const LIFETIME: Duration = Duration::from_secs(24);

/// A new TLS connection to the webhook at `url`, trusting only the CAs of `bundle`.
async fn handshake(url: &str, bundle: &str) -> Result<(), String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::pem::PemObject::pem_slice_iter(bundle.as_bytes()) {
        let cert: rustls::pki_types::CertificateDer = cert.map_err(|e| e.to_string())?;
        roots.add(cert).map_err(|e| e.to_string())?;
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let uri: http::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
    let (host, port) = (uri.host().unwrap().to_string(), uri.port_u16().unwrap());
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from(host).map_err(|e| e.to_string())?;
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The caBundle of the pod-placement webhook, its URL and the configuration's annotations
/// (empty before the controller made it).
async fn current(
    hooks: &Api<MutatingWebhookConfiguration>,
) -> (String, String, Option<String>, Option<String>) {
    let Some(config) = hooks.get_opt(WEBHOOK_CONFIGURATION).await.unwrap() else {
        return Default::default();
    };
    let url = config.webhooks.as_ref().unwrap()[0]
        .client_config
        .url
        .clone()
        .unwrap_or_default();
    let bundle = config.webhooks.as_ref().unwrap()[0]
        .client_config
        .ca_bundle
        .as_ref()
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .unwrap_or_default();
    let annotations = config.metadata.annotations.unwrap_or_default();
    (
        bundle,
        url,
        annotations.get(NOT_AFTER_ANNOTATION).cloned(),
        annotations.get(ROTATED_ANNOTATION).cloned(),
    )
}

#[tokio::test]
async fn the_serving_certificate_rotates_on_schedule_and_on_request_and_no_pod_create_fails() {
    let mut lisbon = Cluster::start("lisbon", "eu-west", 1).await;
    let started = std::time::SystemTime::now();
    lisbon
        .restart_controller_with(Options {
            webhook_certificate_lifetime: LIFETIME,
            webhook_ca_propagation: Duration::from_secs(5),
            ..test_options()
        })
        .await;
    let hooks: Api<MutatingWebhookConfiguration> = Api::all(lisbon.client.clone());
    // The restarted controller's certificate: it expires a lifetime from now, not in 90 days.
    let (first, not_after, _) = until(
        "the short-lived certificate",
        Duration::from_secs(20),
        || async {
            let (bundle, _, not_after, rotated) = current(&hooks).await;
            let until = humantime::parse_rfc3339(not_after.as_deref()?).ok()?;
            (until < started + LIFETIME + Duration::from_secs(30))
                .then_some((bundle, not_after, rotated))
        },
    )
    .await;
    assert!(not_after.is_some());

    let ns = "shop";
    Api::<Namespace>::all(lisbon.client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .unwrap();
    Api::<NamespaceOffloading>::namespaced(lisbon.client.clone(), ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "tandem.dev/v1alpha1", "kind": "NamespaceOffloading",
                "metadata": {"name": names::OFFLOADING_NAME},
                "spec": {"podOffloadingStrategy": "LocalAndRemote"},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let offloadings: Api<NamespaceOffloading> = Api::namespaced(lisbon.client.clone(), ns);
    until("the offloading Ready", Duration::from_secs(20), || async {
        let o = offloadings.get(names::OFFLOADING_NAME).await.ok()?;
        (o.status?.phase.as_deref() == Some("Ready")).then_some(())
    })
    .await;

    // Pods created one after the other while the certificate changes twice.
    let pods: Api<Pod> = Api::namespaced(lisbon.client.clone(), ns);
    let mut bundles: Vec<String> = vec![first.clone()];
    let mut request: Option<String> = None;
    let mut fulfilled = false;
    let mut created = 0;
    let deadline = Instant::now() + Duration::from_secs(90);
    while !fulfilled {
        assert!(
            Instant::now() < deadline,
            "within 90 s: rotations seen {}, request fulfilled {fulfilled}",
            bundles.len() - 1
        );
        let pod = pods
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": format!("p{created}")},
                    "spec": {"containers": [{"name": "c", "image": "busybox"}]}}))
                .unwrap(),
            )
            .await
            .unwrap_or_else(|e| panic!("pod {created} while the certificate rotates: {e}"));
        // The placement only the webhook adds: both kinds of node, by required affinity.
        let terms = pod
            .spec
            .and_then(|s| s.affinity)
            .and_then(|a| a.node_affinity)
            .and_then(|n| n.required_during_scheduling_ignored_during_execution)
            .map(|r| r.node_selector_terms.len());
        assert_eq!(terms, Some(2), "pod {created} did not pass the webhook");
        created += 1;

        let (bundle, url, _, rotated) = current(&hooks).await;
        if let Err(e) = handshake(&url, &bundle).await {
            panic!("a new connection to {url} trusting the caBundle of the moment: {e}");
        }
        if bundles.last() != Some(&bundle) {
            bundles.push(bundle);
        }
        // Once the scheduled rotation is done (the bundle changed and settled on one CA),
        // ask for another.
        let settled = bundles.len() >= 3 && bundles.last().unwrap().matches("BEGIN").count() == 1;
        match &request {
            None if settled => {
                let value = format!("test-{created}");
                hooks
                    .patch(
                        WEBHOOK_CONFIGURATION,
                        &PatchParams::default(),
                        &Patch::Merge(
                            json!({"metadata": {"annotations": {ROTATE_ANNOTATION: value}}}),
                        ),
                    )
                    .await
                    .unwrap();
                request = Some(value);
            }
            Some(value) => fulfilled = rotated.as_ref() == Some(value),
            None => {}
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Each rotation: the new CA joined the old one, then stood alone.
    let distinct: BTreeSet<&String> = bundles.iter().collect();
    assert!(
        bundles.len() >= 5 && distinct.len() == bundles.len(),
        "two rotations, each old → old+new → new: {} bundles",
        bundles.len()
    );
    assert!(
        bundles[1].contains(bundles[0].trim()),
        "the new CA joins the old one first"
    );
    assert_eq!(bundles[1].matches("BEGIN CERTIFICATE").count(), 2);
    assert!(
        bundles[1].contains(bundles[2].trim()),
        "then the old CA leaves"
    );
    assert!(created > 20, "only {created} pods created");
    // The request stays recorded as fulfilled (a later scheduled rotation keeps it too).
    let (_, _, _, rotated) = current(&hooks).await;
    assert_eq!(rotated, request);
}

/// Removing Tandem the way Helm or `kubectl delete -k` does — the controller and its
/// ClusterRole go, nothing asks the controller — takes the fail-closed webhooks with it: they
/// are owned by the controller's ClusterRole, and the garbage collector deletes them, so pod
/// creation in a once-offloaded namespace is not blocked by a webhook with no server.
#[tokio::test]
async fn the_webhooks_go_with_the_controllers_cluster_role() {
    let mut cluster = Cluster::start("rome", "eu-west", 1).await;
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(cluster.client.clone());
    let validating: Api<
        k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration,
    > = Api::all(cluster.client.clone());
    let role = Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(cluster.client.clone())
        .get(names::CONTROLLER_NAME)
        .await
        .unwrap();
    let owned_by_role =
        |refs: Option<Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>>| {
            refs.unwrap_or_default()
                .iter()
                .any(|r| r.kind == "ClusterRole" && Some(&r.uid) == role.metadata.uid.as_ref())
        };
    until(
        "both webhook configurations owned by the controller's ClusterRole",
        Duration::from_secs(30),
        || async {
            let m = mutating.get_opt(WEBHOOK_CONFIGURATION).await.ok()??;
            let v = validating
                .get_opt(names::PEER_WRITES_WEBHOOK)
                .await
                .ok()??;
            (owned_by_role(m.metadata.owner_references)
                && owned_by_role(v.metadata.owner_references))
            .then_some(())
        },
    )
    .await;
    cluster.kill_controller();
    Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(cluster.client.clone())
        .delete(names::CONTROLLER_NAME, &Default::default())
        .await
        .unwrap();
    until(
        "the webhook configurations gone with the ClusterRole",
        Duration::from_secs(30),
        || async {
            let m = mutating.get_opt(WEBHOOK_CONFIGURATION).await.ok()?;
            let v = validating.get_opt(names::PEER_WRITES_WEBHOOK).await.ok()?;
            (m.is_none() && v.is_none()).then_some(())
        },
    )
    .await;
}
