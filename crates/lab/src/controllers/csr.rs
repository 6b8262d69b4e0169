//! The CSR signers for `kubernetes.io/kube-apiserver-client` and
//! `kubernetes.io/kubelet-serving`: sign approved requests with the cluster CA, under the
//! constraints kube-controller-manager's signers enforce. Approval stays an admin action
//! (`kubectl certificate approve`).

use std::sync::Arc;

use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tandem_apiserver::pki::{CertPair, RequestedAltName, RequestedIdentity, requested_identity};

use super::error::{Error, StepExt, drain, key, retry_after_error};

/// The signer of client certificates for the API server.
pub const KUBE_APISERVER_CLIENT: &str = "kubernetes.io/kube-apiserver-client";
/// The signer of kubelets' serving certificates.
pub const KUBELET_SERVING: &str = "kubernetes.io/kubelet-serving";
/// The only subject organization a kubelet-serving certificate may carry.
const NODES_GROUP: &str = "system:nodes";
/// How a kubelet-serving certificate's common name starts (the node name follows).
const NODE_USER_PREFIX: &str = "system:node:";
/// How long a certificate is valid when the request names no expirationSeconds (kube's
/// default --cluster-signing-duration, one year).
const DEFAULT_VALID_SECONDS: i64 = 365 * 24 * 3600;

struct Context {
    client: Client,
    ca: CertPair,
}

/// Runs the signers until their watch ends.
pub async fn run(client: Client, ca: CertPair) {
    let controller = Controller::new(
        Api::<CertificateSigningRequest>::all(client.clone()),
        watcher::Config::default(),
    );
    let context = Arc::new(Context { client, ca });
    drain(
        "csr signer",
        controller.run(reconcile, retry_after_error("csr signer"), context),
    )
    .await;
}

/// What the signer does with a request.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Not ours, already signed, denied, failed or not approved yet: leave it alone.
    Skip,
    /// Approved but not signable: mark it Failed with this message.
    Fail(String),
    /// Approved and valid: sign it, for server auth when `server` (else client auth).
    Sign {
        /// Whether the certificate is a serving one.
        server: bool,
    },
}

/// Decides from the request alone whether to sign it.
///
/// kube-apiserver-client certificates may carry any subject (CN is the user, O the groups);
/// their usages must include client auth and may only add digital signature and key
/// encipherment. kubelet-serving certificates are for nodes only: O exactly system:nodes,
/// CN system:node:NAME, DNS and IP subjectAltNames only (at least one), usages server auth
/// plus at most digital signature and key encipherment.
pub fn decide(csr: &CertificateSigningRequest) -> Decision {
    let signer = csr.spec.signer_name.as_str();
    let server = match signer {
        KUBE_APISERVER_CLIENT => false,
        KUBELET_SERVING => true,
        _ => return Decision::Skip,
    };
    let status = csr.status.as_ref();
    if status
        .and_then(|s| s.certificate.as_ref())
        .is_some_and(|c| !c.0.is_empty())
    {
        return Decision::Skip;
    }
    let conditions = status
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let has = |t: &str| {
        conditions
            .iter()
            .any(|c| c.type_ == t && c.status == "True")
    };
    if has("Denied") || has("Failed") || !has("Approved") {
        return Decision::Skip;
    }
    let required = if server { "server auth" } else { "client auth" };
    let usages = csr.spec.usages.as_deref().unwrap_or_default();
    if !usages.iter().any(|u| u == required) {
        return Decision::Fail(format!("spec.usages must include {required:?}"));
    }
    if let Some(bad) = usages.iter().find(|u| {
        !(*u == required || matches!(u.as_str(), "digital signature" | "key encipherment"))
    }) {
        return Decision::Fail(format!("spec.usages: {bad:?} is not allowed for {signer}"));
    }
    let Ok(pem) = std::str::from_utf8(&csr.spec.request.0) else {
        return Decision::Fail("spec.request is not a PEM certificate request".into());
    };
    if server {
        // Approval does not vouch for the subject: kube's signer refuses a request that
        // does not name a node even when it is approved.
        let refusal = match requested_identity(pem) {
            Ok(identity) => kubelet_serving_refusal(&identity),
            Err(e) => Some(format!("spec.request: {e}")),
        };
        if let Some(message) = refusal {
            return Decision::Fail(message);
        }
    }
    Decision::Sign { server }
}

/// Why a kubelet-serving request may not be signed as asked, if it may not.
fn kubelet_serving_refusal(identity: &RequestedIdentity) -> Option<String> {
    if identity.organizations != [NODES_GROUP] {
        return Some(format!(
            "spec.request: subject organization must be exactly [{NODES_GROUP:?}] for \
             {KUBELET_SERVING}, got {:?}",
            identity.organizations
        ));
    }
    let node_name = match identity.common_names.as_slice() {
        [cn] => cn.strip_prefix(NODE_USER_PREFIX),
        _ => None,
    };
    if node_name.is_none_or(str::is_empty) {
        return Some(format!(
            "spec.request: subject common name must be \"{NODE_USER_PREFIX}<nodeName>\" for \
             {KUBELET_SERVING}, got {:?}",
            identity.common_names
        ));
    }
    for name in &identity.alt_names {
        let kind = match name {
            RequestedAltName::Dns(_) | RequestedAltName::Ip(_) => continue,
            RequestedAltName::Email(_) => "email",
            RequestedAltName::Uri(_) => "URI",
            RequestedAltName::Other(kind) => kind,
        };
        return Some(format!(
            "spec.request: {kind} subjectAltNames are not allowed for {KUBELET_SERVING} \
             (DNS and IP only)"
        ));
    }
    if identity.alt_names.is_empty() {
        return Some(format!(
            "spec.request: a DNS or IP subjectAltName is required for {KUBELET_SERVING}"
        ));
    }
    None
}

async fn reconcile(
    csr: Arc<CertificateSigningRequest>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let object = key(&csr.metadata);
    let api = Api::<CertificateSigningRequest>::all(ctx.client.clone());
    let status = match decide(&csr) {
        Decision::Skip => return Ok(Action::await_change()),
        Decision::Fail(message) => failed(&csr, message),
        Decision::Sign { server } => {
            let pem = String::from_utf8_lossy(&csr.spec.request.0).into_owned();
            let seconds = csr
                .spec
                .expiration_seconds
                .map_or(DEFAULT_VALID_SECONDS, i64::from);
            match ctx.ca.sign_csr_for(&pem, server, Some(seconds)) {
                Ok(cert) => json!({"certificate": ByteString(cert.into_bytes())}),
                Err(e) => failed(&csr, format!("spec.request: {e}")),
            }
        }
    };
    api.patch_status(
        &csr.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"status": status})),
    )
    .await
    .step(&object, "writing the signed certificate")?;
    Ok(Action::await_change())
}

/// Status with a Failed condition added (merge patches replace lists whole).
fn failed(csr: &CertificateSigningRequest, message: String) -> serde_json::Value {
    tracing::warn!("csr {}: not signed: {message}", csr.name_any());
    let mut conditions = csr
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    conditions.push(CertificateSigningRequestCondition {
        type_: "Failed".into(),
        status: "True".into(),
        reason: Some("SignerValidationFailure".into()),
        message: Some(message),
        last_update_time: Some(now.clone()),
        last_transition_time: Some(now),
    });
    json!({"conditions": conditions})
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::certificates::v1::{
        CertificateSigningRequestSpec, CertificateSigningRequestStatus,
    };

    fn csr(
        signer: &str,
        usages: &[&str],
        conditions: &[(&str, &str)],
        signed: bool,
    ) -> CertificateSigningRequest {
        CertificateSigningRequest {
            metadata: Default::default(),
            spec: CertificateSigningRequestSpec {
                signer_name: signer.into(),
                usages: Some(usages.iter().map(|u| u.to_string()).collect()),
                request: ByteString(b"-----BEGIN CERTIFICATE REQUEST-----".to_vec()),
                ..Default::default()
            },
            status: Some(CertificateSigningRequestStatus {
                certificate: signed.then(|| ByteString(b"cert".to_vec())),
                conditions: Some(
                    conditions
                        .iter()
                        .map(|(t, s)| CertificateSigningRequestCondition {
                            type_: t.to_string(),
                            status: s.to_string(),
                            ..Default::default()
                        })
                        .collect(),
                ),
            }),
        }
    }

    #[test]
    fn signs_only_approved_valid_requests() {
        let client = ["client auth", "digital signature"];
        let cases = [
            (
                "approved",
                csr(
                    KUBE_APISERVER_CLIENT,
                    &client,
                    &[("Approved", "True")],
                    false,
                ),
                Decision::Sign { server: false },
            ),
            (
                "unapproved",
                csr(KUBE_APISERVER_CLIENT, &client, &[], false),
                Decision::Skip,
            ),
            (
                "approval withdrawn",
                csr(
                    KUBE_APISERVER_CLIENT,
                    &client,
                    &[("Approved", "False")],
                    false,
                ),
                Decision::Skip,
            ),
            (
                "denied",
                csr(KUBE_APISERVER_CLIENT, &client, &[("Denied", "True")], false),
                Decision::Skip,
            ),
            (
                "approved then denied",
                csr(
                    KUBE_APISERVER_CLIENT,
                    &client,
                    &[("Approved", "True"), ("Denied", "True")],
                    false,
                ),
                Decision::Skip,
            ),
            (
                "failed",
                csr(
                    KUBE_APISERVER_CLIENT,
                    &client,
                    &[("Approved", "True"), ("Failed", "True")],
                    false,
                ),
                Decision::Skip,
            ),
            (
                "already signed",
                csr(
                    KUBE_APISERVER_CLIENT,
                    &client,
                    &[("Approved", "True")],
                    true,
                ),
                Decision::Skip,
            ),
            (
                "other signer",
                csr(
                    "kubernetes.io/legacy-unknown",
                    &client,
                    &[("Approved", "True")],
                    false,
                ),
                Decision::Skip,
            ),
            (
                "no client auth",
                csr(
                    KUBE_APISERVER_CLIENT,
                    &["digital signature"],
                    &[("Approved", "True")],
                    false,
                ),
                Decision::Fail("spec.usages must include \"client auth\"".into()),
            ),
            (
                "server auth",
                csr(
                    KUBE_APISERVER_CLIENT,
                    &["client auth", "server auth"],
                    &[("Approved", "True")],
                    false,
                ),
                Decision::Fail(format!(
                    "spec.usages: \"server auth\" is not allowed for {KUBE_APISERVER_CLIENT}"
                )),
            ),
        ];
        for (what, request, want) in cases {
            assert_eq!(decide(&request), want, "{what}");
        }
    }

    /// A PEM CSR with subject CN `cn` (none when empty) and O `org` (none when empty),
    /// asking for `sans`.
    fn request(cn: &str, org: &str, sans: Vec<rcgen::SanType>) -> String {
        use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};
        let mut params = CertificateParams::default();
        let mut subject = DistinguishedName::new();
        if !cn.is_empty() {
            subject.push(DnType::CommonName, cn);
        }
        if !org.is_empty() {
            subject.push(DnType::OrganizationName, org);
        }
        params.distinguished_name = subject;
        params.subject_alt_names = sans;
        let key = KeyPair::generate().unwrap();
        params.serialize_request(&key).unwrap().pem().unwrap()
    }

    /// An approved kubelet-serving CSR with `usages` for `pem`.
    fn kubelet_serving(usages: &[&str], pem: String) -> CertificateSigningRequest {
        let mut csr = csr(KUBELET_SERVING, usages, &[("Approved", "True")], false);
        csr.spec.request = ByteString(pem.into_bytes());
        csr
    }

    #[test]
    fn signs_kubelet_serving_requests_only_for_nodes_with_dns_and_ip_names() {
        use rcgen::SanType;
        let dns = || SanType::DnsName("vn-1.lab".try_into().unwrap());
        let ip = || SanType::IpAddress("10.0.0.7".parse().unwrap());
        let node = |sans| request("system:node:vn-1", "system:nodes", sans);
        let serving = ["server auth", "digital signature", "key encipherment"];
        let fail = |rule: &str| Decision::Fail(format!("spec.request: {rule}"));
        let cases = [
            (
                "node with DNS and IP names",
                kubelet_serving(&serving, node(vec![dns(), ip()])),
                Decision::Sign { server: true },
            ),
            (
                "server auth alone",
                kubelet_serving(&["server auth"], node(vec![ip()])),
                Decision::Sign { server: true },
            ),
            (
                "unapproved",
                {
                    let mut csr = kubelet_serving(&serving, node(vec![ip()]));
                    csr.status = None;
                    csr
                },
                Decision::Skip,
            ),
            (
                "organization system:masters",
                kubelet_serving(
                    &serving,
                    request("system:node:vn-1", "system:masters", vec![ip()]),
                ),
                fail(
                    "subject organization must be exactly [\"system:nodes\"] for \
                     kubernetes.io/kubelet-serving, got [\"system:masters\"]",
                ),
            ),
            (
                "no organization",
                kubelet_serving(&serving, request("system:node:vn-1", "", vec![ip()])),
                fail(
                    "subject organization must be exactly [\"system:nodes\"] for \
                     kubernetes.io/kubelet-serving, got []",
                ),
            ),
            (
                "common name of a user",
                kubelet_serving(&serving, request("carol", "system:nodes", vec![ip()])),
                fail(
                    "subject common name must be \"system:node:<nodeName>\" for \
                     kubernetes.io/kubelet-serving, got [\"carol\"]",
                ),
            ),
            (
                "common name without a node name",
                kubelet_serving(
                    &serving,
                    request("system:node:", "system:nodes", vec![ip()]),
                ),
                fail(
                    "subject common name must be \"system:node:<nodeName>\" for \
                     kubernetes.io/kubelet-serving, got [\"system:node:\"]",
                ),
            ),
            (
                "no server auth",
                kubelet_serving(&["digital signature"], node(vec![ip()])),
                Decision::Fail("spec.usages must include \"server auth\"".into()),
            ),
            (
                "client auth too",
                kubelet_serving(&["server auth", "client auth"], node(vec![ip()])),
                Decision::Fail(format!(
                    "spec.usages: \"client auth\" is not allowed for {KUBELET_SERVING}"
                )),
            ),
            (
                "URI name",
                kubelet_serving(
                    &serving,
                    node(vec![
                        ip(),
                        SanType::URI("spiffe://lab/vn-1".try_into().unwrap()),
                    ]),
                ),
                fail(
                    "URI subjectAltNames are not allowed for kubernetes.io/kubelet-serving \
                     (DNS and IP only)",
                ),
            ),
            (
                "email name",
                kubelet_serving(
                    &serving,
                    node(vec![
                        dns(),
                        SanType::Rfc822Name("vn-1@lab".try_into().unwrap()),
                    ]),
                ),
                fail(
                    "email subjectAltNames are not allowed for kubernetes.io/kubelet-serving \
                     (DNS and IP only)",
                ),
            ),
            (
                "no names",
                kubelet_serving(&serving, node(vec![])),
                fail("a DNS or IP subjectAltName is required for kubernetes.io/kubelet-serving"),
            ),
            (
                "not a request",
                kubelet_serving(&serving, "garbage".into()),
                fail("certificate signing request: not PEM: "),
            ),
        ];
        for (what, request, want) in cases {
            let got = decide(&request);
            match (&got, &want) {
                // The parser's own wording follows the prefix.
                (Decision::Fail(got), Decision::Fail(want)) if want.ends_with(": ") => {
                    assert!(got.starts_with(want.as_str()), "{what}: {got}")
                }
                _ => assert_eq!(got, want, "{what}"),
            }
        }
    }
}
