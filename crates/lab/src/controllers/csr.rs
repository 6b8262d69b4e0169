//! The CSR signer for `kubernetes.io/kube-apiserver-client`: signs approved requests with
//! the cluster CA. Approval stays an admin action (`kubectl certificate approve`).

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
use tandem_apiserver::pki::CertPair;

use super::{Error, StepExt, drain, key, retry_after_error};

/// The signer this controller serves.
pub const KUBE_APISERVER_CLIENT: &str = "kubernetes.io/kube-apiserver-client";
/// How long a certificate is valid when the request names no expirationSeconds (kube's
/// default --cluster-signing-duration, one year).
const DEFAULT_VALID_SECONDS: i64 = 365 * 24 * 3600;

struct Context {
    client: Client,
    ca: CertPair,
}

/// Runs the signer until its watch ends.
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
    /// Approved and valid: sign it.
    Sign,
}

/// Decides from the request alone whether to sign it. kube-apiserver-client certificates
/// may carry any subject (CN is the user, O the groups); their usages must include client
/// auth and may only add digital signature and key encipherment.
pub fn decide(csr: &CertificateSigningRequest) -> Decision {
    if csr.spec.signer_name != KUBE_APISERVER_CLIENT {
        return Decision::Skip;
    }
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
    let usages = csr.spec.usages.as_deref().unwrap_or_default();
    if !usages.iter().any(|u| u == "client auth") {
        return Decision::Fail("spec.usages must include \"client auth\"".into());
    }
    if let Some(bad) = usages.iter().find(|u| {
        !matches!(
            u.as_str(),
            "client auth" | "digital signature" | "key encipherment"
        )
    }) {
        return Decision::Fail(format!(
            "spec.usages: {bad:?} is not allowed for {KUBE_APISERVER_CLIENT}"
        ));
    }
    if std::str::from_utf8(&csr.spec.request.0).is_err() {
        return Decision::Fail("spec.request is not a PEM certificate request".into());
    }
    Decision::Sign
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
        Decision::Sign => {
            let pem = String::from_utf8_lossy(&csr.spec.request.0).into_owned();
            let seconds = csr
                .spec
                .expiration_seconds
                .map_or(DEFAULT_VALID_SECONDS, i64::from);
            match ctx.ca.sign_csr_for(&pem, false, Some(seconds)) {
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
                Decision::Sign,
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
                    "kubernetes.io/kubelet-serving",
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
}
