//! A user files a CSR, the admin approves it, and the signed certificate authenticates as
//! the subject it names; denied and unapproved requests get nothing. A kubelet's serving
//! CSR, once approved, gets a serving certificate for the node's name and address.

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use super::common::{Cluster, eventually, kubectl};

/// A PEM CSR for `cn` in groups `orgs`, and its private key. Built with x509-cert: rcgen
/// keeps one value per attribute type in a DistinguishedName, so it cannot ask for two groups.
fn csr_pem(cn: &str, orgs: &[&str]) -> (String, String) {
    use p256::pkcs8::DecodePrivateKey;
    use x509_cert::builder::{Builder, RequestBuilder};
    use x509_cert::der::EncodePem;
    use x509_cert::der::asn1::{Any, SetOfVec, Utf8StringRef};
    use x509_cert::der::oid::db::rfc4519;
    use x509_cert::der::pem::LineEnding;
    use x509_cert::name::{RdnSequence, RelativeDistinguishedName};

    let key = rcgen::KeyPair::generate().unwrap();
    let signer = p256::ecdsa::SigningKey::from_pkcs8_pem(&key.serialize_pem()).unwrap();
    let rdn = |oid, value: &str| {
        let value = Any::encode_from(&Utf8StringRef::new(value).unwrap()).unwrap();
        let atv = x509_cert::attr::AttributeTypeAndValue { oid, value };
        RelativeDistinguishedName(SetOfVec::try_from(vec![atv]).unwrap())
    };
    let mut rdns = vec![rdn(rfc4519::CN, cn)];
    rdns.extend(orgs.iter().map(|o| rdn(rfc4519::O, o)));
    let csr = RequestBuilder::new(RdnSequence(rdns), &signer)
        .unwrap()
        .build::<p256::ecdsa::DerSignature>()
        .unwrap();
    (csr.to_pem(LineEnding::LF).unwrap(), key.serialize_pem())
}

/// A PEM CSR for node `node`'s kubelet serving certificate at `ip`, as a kubelet files it.
fn kubelet_serving_csr_pem(node: &str, ip: &str) -> String {
    use rcgen::{CertificateParams, DnType, KeyPair, SanType};
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, format!("system:node:{node}"));
    params
        .distinguished_name
        .push(DnType::OrganizationName, "system:nodes");
    params.subject_alt_names = vec![
        SanType::DnsName(node.try_into().unwrap()),
        SanType::IpAddress(ip.parse().unwrap()),
    ];
    let key = KeyPair::generate().unwrap();
    params.serialize_request(&key).unwrap().pem().unwrap()
}

async fn file_csr(client: &kube::Client, name: &str, pem: &str, expiration: Option<i32>) {
    file(
        client,
        name,
        pem,
        "kubernetes.io/kube-apiserver-client",
        &["client auth", "digital signature"],
        expiration,
    )
    .await;
}

async fn file(
    client: &kube::Client,
    name: &str,
    pem: &str,
    signer: &str,
    usages: &[&str],
    expiration: Option<i32>,
) {
    let csr: CertificateSigningRequest = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "request": base64(pem),
            "signerName": signer,
            "usages": usages,
            "expirationSeconds": expiration,
        },
    }))
    .unwrap();
    Api::<CertificateSigningRequest>::all(client.clone())
        .create(&PostParams::default(), &csr)
        .await
        .unwrap_or_else(|e| panic!("filing csr {name}: {e}"));
}

fn base64(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// The admin adds an Approved or Denied condition through the approval subresource.
async fn decide(client: &kube::Client, name: &str, type_: &str) {
    let patch = json!({"status": {"conditions": [{
        "type": type_, "status": "True", "reason": "AdminDecision", "message": "by the test admin",
    }]}});
    Api::<CertificateSigningRequest>::all(client.clone())
        .patch_subresource(
            "approval",
            name,
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await
        .unwrap_or_else(|e| panic!("{type_} csr {name}: {e}"));
}

async fn certificate(client: &kube::Client, name: &str) -> Option<String> {
    let csr = Api::<CertificateSigningRequest>::all(client.clone())
        .get(name)
        .await
        .unwrap();
    let cert = csr.status?.certificate?;
    (!cert.0.is_empty()).then(|| String::from_utf8(cert.0).expect("certificate is PEM"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approved_csr_yields_a_working_client_certificate_denied_and_pending_get_none() {
    let cluster = Cluster::start().await;
    let admin = &cluster.client;
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "csr-filer"},
        "rules": [{"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests"], "verbs": ["create", "get", "list", "watch"]}],
    }))
    .unwrap();
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "carol-files-csrs"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "csr-filer"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "carol"}],
    }))
    .unwrap();
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let carol = tandem_apiserver::client_from_kubeconfig(
        &cluster.server.kubeconfig_for("carol", &[]).unwrap(),
    )
    .await
    .unwrap();

    let (denied_pem, _) = csr_pem("mallory", &["system:masters"]);
    let (pending_pem, _) = csr_pem("pending", &[]);
    let (pem, key) = csr_pem("carol", &["team-a", "team-b"]);
    file_csr(&carol, "denied", &denied_pem, None).await;
    file_csr(&carol, "pending", &pending_pem, None).await;
    // Denied the way an admin does it: kubectl (an update of the approval subresource).
    let (ok, out) = kubectl(&cluster, &["certificate", "deny", "denied"]).await;
    assert!(ok, "kubectl certificate deny: {out}");
    file_csr(&carol, "carol-team-a", &pem, Some(3600)).await;
    assert_eq!(
        certificate(admin, "carol-team-a").await,
        None,
        "nothing is signed before approval"
    );
    decide(admin, "carol-team-a", "Approved").await;

    let cert = eventually("carol-team-a signed", || certificate(admin, "carol-team-a")).await;
    // The signer handled the earlier requests before this one; they stay unsigned.
    assert_eq!(
        certificate(admin, "denied").await,
        None,
        "denied CSR signed"
    );
    assert_eq!(
        certificate(admin, "pending").await,
        None,
        "unapproved CSR signed"
    );

    let der = x509_parser::pem::parse_x509_pem(cert.as_bytes()).unwrap().1;
    let parsed = der.parse_x509().unwrap();
    let lifetime =
        parsed.validity().not_after.timestamp() - k8s_openapi::jiff::Timestamp::now().as_second();
    assert!(
        (3500..=3600).contains(&lifetime),
        "expirationSeconds 3600 honoured, got {lifetime}s"
    );

    let orgs: Vec<_> = parsed
        .subject()
        .iter_organization()
        .map(|o| o.as_str().unwrap())
        .collect();
    assert_eq!(
        orgs,
        ["team-a", "team-b"],
        "the CSR's subject is kept whole"
    );

    // The certificate authenticates as its subject, in every group the CSR asked for (the
    // kubeconfig carol filed it with has no groups).
    let mut kubeconfig: serde_json::Value =
        serde_saphyr::from_str(&cluster.server.kubeconfig_for("carol", &[]).unwrap()).unwrap();
    let user = &mut kubeconfig["users"][0]["user"];
    user["client-certificate-data"] = base64(&cert).into();
    user["client-key-data"] = base64(&key).into();
    let signed_client =
        tandem_apiserver::client_from_kubeconfig(&serde_saphyr::to_string(&kubeconfig).unwrap())
            .await
            .unwrap();
    let review: SelfSubjectReview = serde_json::from_value(
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}),
    )
    .unwrap();
    let review = Api::<SelfSubjectReview>::all(signed_client)
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    let info = review.status.and_then(|s| s.user_info).expect("userInfo");
    assert_eq!(info.username.as_deref(), Some("carol"));
    let groups = info.groups.unwrap_or_default();
    for g in ["team-a", "team-b", "system:authenticated"] {
        assert!(
            groups.iter().any(|x| x == g),
            "group {g} missing from {groups:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approved_kubelet_serving_csr_yields_a_serving_certificate_for_the_node() {
    let cluster = Cluster::start().await;
    let admin = &cluster.client;
    let pem = kubelet_serving_csr_pem("vn-1", "10.0.0.7");
    file(
        admin,
        "vn-1-serving",
        &pem,
        "kubernetes.io/kubelet-serving",
        &["server auth", "digital signature", "key encipherment"],
        Some(3600),
    )
    .await;
    // A user's subject under the kubelet-serving signer is refused, approved or not.
    let (user_pem, _) = csr_pem("carol", &["system:nodes"]);
    file(
        admin,
        "carol-serving",
        &user_pem,
        "kubernetes.io/kubelet-serving",
        &["server auth"],
        None,
    )
    .await;
    decide(admin, "carol-serving", "Approved").await;
    decide(admin, "vn-1-serving", "Approved").await;

    let cert = eventually("vn-1-serving signed", || certificate(admin, "vn-1-serving")).await;
    let der = x509_parser::pem::parse_x509_pem(cert.as_bytes()).unwrap().1;
    let parsed = der.parse_x509().unwrap();
    let cn: Vec<_> = parsed
        .subject()
        .iter_common_name()
        .map(|cn| cn.as_str().unwrap())
        .collect();
    assert_eq!(cn, ["system:node:vn-1"]);
    let sans = parsed
        .subject_alternative_name()
        .unwrap()
        .expect("subjectAltName");
    let ips: Vec<&[u8]> = sans
        .value
        .general_names
        .iter()
        .filter_map(|n| match n {
            x509_parser::extensions::GeneralName::IPAddress(ip) => Some(*ip),
            _ => None,
        })
        .collect();
    assert_eq!(ips, [&[10u8, 0, 0, 7][..]], "the requested IP is certified");
    let eku = parsed
        .extended_key_usage()
        .unwrap()
        .expect("extendedKeyUsage")
        .value;
    assert!(eku.server_auth && !eku.client_auth, "{eku:?}");
    // Signed by the cluster CA.
    let ca = x509_parser::pem::parse_x509_pem(cluster.server.ca_pem().as_bytes())
        .unwrap()
        .1;
    let ca = ca.parse_x509().unwrap();
    parsed
        .verify_signature(Some(ca.public_key()))
        .expect("signed by the cluster CA");

    let refused = eventually("carol-serving failed", || async {
        let csr = Api::<CertificateSigningRequest>::all(admin.clone())
            .get("carol-serving")
            .await
            .unwrap();
        let status = csr.status?;
        assert!(
            status.certificate.is_none(),
            "a user's serving CSR was signed"
        );
        status
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "Failed" && c.status == "True")
    })
    .await;
    let message = refused.message.unwrap_or_default();
    assert!(
        message.contains("subject common name"),
        "the Failed condition names the rule: {message}"
    );
}
