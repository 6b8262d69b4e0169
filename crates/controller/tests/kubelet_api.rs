//! The virtual node's kubelet API: it serves with a certificate obtained through the CSR API as
//! a kubelet's, at the address its node publishes, and answers only the API server: a caller
//! without a client certificate gets 401, one whose user may not `nodes/proxy` gets 403 — so
//! nobody reaches an offloaded pod around the consumer's RBAC.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use serde_json::json;
use support::{Cluster, until};

/// GET `path` from the kubelet endpoint at `addr`, checking its certificate against
/// `ca_pem` (for `addr`'s IP) and presenting `client` (certificate and key PEM) if given.
async fn get(
    addr: std::net::SocketAddr,
    ca_pem: &str,
    client: Option<(&str, &str)>,
    path: &str,
) -> (u16, String) {
    use rustls::pki_types::pem::PemObject;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match client {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                rustls::pki_types::CertificateDer::pem_slice_iter(cert.as_bytes())
                    .map(Result::unwrap)
                    .collect(),
                rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(
            rustls::pki_types::ServerName::IpAddress(addr.ip().into()),
            tcp,
        )
        .await
        .expect("the serving certificate is valid for the node's IP under the cluster CA");
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let response = sender
        .send_request(
            http::Request::get(path)
                .header(http::header::HOST, addr.to_string())
                .body(http_body_util::Empty::<bytes::Bytes>::new())
                .unwrap(),
        )
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_virtual_kubelet_serves_as_a_kubelet_and_answers_only_the_api_server() {
    let rome = Cluster::start("rome", "eu-central", 1).await;
    let milan = Cluster::start("milan", "eu-south", 1).await;
    support::peer_with(&rome, &milan, json!({"cpu": "4", "memory": "8Gi"}), None).await;

    let nodes: Api<Node> = Api::all(rome.client.clone());
    let addr: std::net::SocketAddr = until(
        "the virtual node publishing its kubelet endpoint",
        Duration::from_secs(60),
        || async {
            let status = nodes.get("tandem-milan").await.ok()?.status?;
            let port = status.daemon_endpoints?.kubelet_endpoint?.port;
            let ip = status
                .addresses?
                .into_iter()
                .find(|a| a.type_ == "InternalIP")?
                .address;
            format!("{ip}:{port}").parse().ok()
        },
    )
    .await;
    let ca = rome.lab.server.ca_pem().to_string();
    let path = "/containerLogs/demo/hello/hello";

    // No client certificate: 401, as a kubelet answers.
    let (status, _) = get(addr, &ca, None, path).await;
    assert_eq!(status, 401);

    // A certificate of the cluster's CA whose user may not proxy to the node: 403 naming it.
    let mallory = rome
        .lab
        .server
        .state()
        .pki
        .ca
        .issue("mallory", &["developers"], &[], false)
        .unwrap();
    let (status, body) = get(addr, &ca, Some((&mallory.cert_pem, &mallory.key_pem)), path).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body.contains("user=mallory") && body.contains("subresource=proxy"),
        "{body}"
    );

    // A certificate from a CA the API server does not publish: no TLS session at all.
    // (The impostor has the API server's very name and group.)
    let (_, stranger) = tandem_apiserver::pki::kubelet_client("stranger").unwrap();
    let refused = tokio::spawn(async move {
        get(
            addr,
            &ca,
            Some((&stranger.cert_pem, &stranger.key_pem)),
            path,
        )
        .await
    })
    .await;
    assert!(
        refused.is_err(),
        "a client certificate of an unknown CA is refused"
    );

    // The API server's own identity passes; a pod that is not on the node is not found.
    let apiserver = rome.lab.server.state().kubelets.client.clone();
    let (status, body) = get(
        addr,
        rome.lab.server.ca_pem(),
        Some((&apiserver.cert_pem, &apiserver.key_pem)),
        path,
    )
    .await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("demo/hello"), "{body}");

    // The CSR served its purpose and is gone.
    let csrs: Api<CertificateSigningRequest> = Api::all(rome.client.clone());
    let left: Vec<String> = csrs
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .filter(|n| n.starts_with("tandem-kubelet-serving-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
