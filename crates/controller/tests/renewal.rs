//! Peer identities renew before they expire: a consumer whose certificate has used up its
//! share of its (short) lifetime files a request, the provider approves it and hands the
//! certificate back, the consumer swaps it in — again and again — and its virtual node never
//! leaves Ready, offloading going on with the new identity. A request for another identity is
//! refused, and a peer cannot approve its own.

use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tandem_api::names;
use tandem_controller::consumer::renewal::{client_certificate, issued_lifetime, validity};

use crate::support;
use support::{Cluster, offload_remote, peer, test_options};

/// The client certificate (PEM) in rome's identity Secret for milan.
async fn identity_certificate(rome: &Cluster) -> String {
    let secrets: Api<Secret> =
        Api::namespaced(rome.client.clone(), &names::tenant_namespace("milan"));
    let list = secrets.list(&Default::default()).await.unwrap();
    let kubeconfig = list
        .items
        .iter()
        .find_map(|s| s.data.as_ref()?.get("kubeconfig").cloned())
        .expect("rome's identity Secret for milan");
    client_certificate(&String::from_utf8(kubeconfig.0).unwrap())
        .expect("a client certificate in the identity kubeconfig")
}

async fn node_ready(rome: &Cluster) -> Option<bool> {
    let node = Api::<Node>::all(rome.client.clone())
        .get_opt("tandem-milan")
        .await
        .ok()??;
    let conditions = node.status?.conditions?;
    let ready = conditions.iter().find(|c| c.type_ == "Ready")?;
    Some(ready.status == "True")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_peer_identity_is_renewed_before_it_expires_without_the_virtual_node_leaving_ready() {
    let mut rome = Cluster::start("rome", "eu-south", 1).await;
    let mut milan = Cluster::start("milan", "eu-west", 1).await;
    // milan issues 10-minute certificates (kube's shortest); rome renews after 1 % of that.
    milan
        .restart_controller_with(tandem_controller::Options {
            peer_certificate_lifetime: Some(Duration::from_secs(600)),
            ..test_options()
        })
        .await;
    rome.restart_controller_with(tandem_controller::Options {
        identity_renewal_after: 0.01,
        identity_renewal_check: Duration::from_millis(500),
        ..test_options()
    })
    .await;
    peer(&rome, &milan).await;
    let first = identity_certificate(&rome).await;
    let (start, end) = validity(&first).unwrap();
    assert_eq!(issued_lifetime(start, end), 600, "the provider's lifetime");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while node_ready(&rome).await != Some(true) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the virtual node never Ready"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Watched every 200 ms: two renewals, the node Ready at every look.
    let mut seen = vec![first.clone()];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while seen.len() < 3 {
        assert_eq!(
            node_ready(&rome).await,
            Some(true),
            "the virtual node left Ready during renewal (after {} certificates)",
            seen.len()
        );
        let current = identity_certificate(&rome).await;
        if seen.last() != Some(&current) {
            seen.push(current);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "renewed {} times",
            seen.len() - 1
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for cert in &seen[1..] {
        let (start, end) = validity(cert).unwrap();
        assert_eq!(
            issued_lifetime(start, end),
            600,
            "a renewal keeps the lifetime"
        );
    }
    let (_, first_end) = validity(&seen[0]).unwrap();
    let (_, last_end) = validity(&seen[2]).unwrap();
    assert!(last_end > first_end);
    // milan's requests are gone once answered (the last may still be on its way).
    let csrs: Api<CertificateSigningRequest> = Api::all(milan.client.clone());
    let left = csrs.list(&Default::default()).await.unwrap().items.len();
    assert!(left <= 2, "{left} CSRs left on milan");

    // Offloading goes on with the renewed identity.
    offload_remote(&rome, &milan, "shop").await;
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(rome.client.clone(), "shop");
    deployments
        .create(
            &PostParams::default(),
            &serde_json::from_value(support::offloaded_deployment("web", 2)).unwrap(),
        )
        .await
        .unwrap();
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(rome.client.clone(), "shop");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let running = pods
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|p| {
                p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("tandem-milan")
            })
            .count();
        if running == 2 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "offloaded pods never Running"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A peer asking for another identity is refused; it cannot approve its own request.
    let peer_client = support::peer_client(&rome, &milan).await;
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, names::peer_user("turin"));
    params.distinguished_name.push(
        rcgen::DnType::OrganizationName,
        names::peer_key_group("sha256:00"),
    );
    let pem = params.serialize_request(&key).unwrap().pem().unwrap();
    let forged: CertificateSigningRequest = serde_json::from_value(json!({
        "metadata": {"name": "tandem-peer-renewal-rome-1"},
        "spec": {"request": ByteString(pem.into_bytes()),
                 "signerName": "kubernetes.io/kube-apiserver-client",
                 "usages": ["client auth", "digital signature"]},
    }))
    .unwrap();
    Api::<CertificateSigningRequest>::all(peer_client.clone())
        .create(&PostParams::default(), &forged)
        .await
        .expect("a peer may file a request");
    let approval = Api::<CertificateSigningRequest>::all(peer_client.clone())
        .patch_subresource(
            "approval",
            "tandem-peer-renewal-rome-1",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"conditions": [{"type": "Approved", "status": "True"}]}}),
            ),
        )
        .await;
    assert!(
        matches!(&approval, Err(kube::Error::Api(e)) if e.code == 403),
        "{approval:?}"
    );
    let read = Api::<CertificateSigningRequest>::all(peer_client)
        .get("tandem-peer-renewal-rome-1")
        .await;
    assert!(
        matches!(&read, Err(kube::Error::Api(e)) if e.code == 403),
        "{read:?}"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let csr = csrs.get("tandem-peer-renewal-rome-1").await.unwrap();
        let conditions = csr.status.and_then(|s| s.conditions).unwrap_or_default();
        if let Some(c) = conditions.first() {
            assert_eq!(c.type_, "Denied", "{c:?}");
            assert!(
                c.message
                    .as_deref()
                    .unwrap_or_default()
                    .contains("own identity"),
                "{c:?}"
            );
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never judged");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
