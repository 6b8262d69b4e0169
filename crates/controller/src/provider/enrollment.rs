//! Provider side of peering without an invite. A consumer that found this cluster through
//! discovery files a `PeeringRequest` in `tandem-enroll` with the enrollment credential; this
//! reconciler checks it (the credential's whole token, the protocol version, a CSR signed by
//! the consumer's key for exactly the peer user, a name derived from that key), then leaves it
//! Pending until the administrator decides (`tandem approve` / `tandem deny`, written into its
//! status, which the filer cannot write) or a PeeringPolicy matches the key. Nothing is
//! created for a request before that: no tenant, no CSR. Approved, it is the invite flow's
//! approval, with the policy's terms on the Tenant. A janitor removes pending requests after
//! their TTL, denied ones once the consumer could read why, approved ones once used.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Client, ResourceExt};
use serde_json::json;
use tandem_api::client;
use tandem_api::{PeeringPolicy, PeeringRequest, Tenant, names};

use crate::context::Ctx;
use crate::enroll;
use crate::provider::peering_request::{
    DENIED_GRACE_SECS, Error, approve, check_csr, csr_name, ensure_tenant_with, set_status_in,
};

/// An approved request not used within this (or within the request TTL, if shorter) is
/// removed anyway, with the Tenant its approval made.
const APPROVED_GRACE_SECS: i64 = 600;
/// How often a pending request is checked against the policies again.
const POLICY_RECHECK: Duration = Duration::from_secs(2);

/// Runs the reconciler and the janitor.
pub async fn run(ctx: Ctx) {
    let janitor = tokio::spawn(janitor(ctx.clone()));
    crate::provider::peering_request::requests_controller(&ctx, names::ENROLL_NAMESPACE)
        .run(
            crate::metrics::timed(ctx.metrics.clone(), "enrollment", reconcile),
            crate::provider::peering_request::error_policy,
            ctx,
        )
        .for_each(|_| async {})
        .await;
    janitor.abort();
}

fn ns() -> &'static str {
    names::ENROLL_NAMESPACE
}

async fn reconcile(req: Arc<PeeringRequest>, ctx: Ctx) -> Result<Action, Error> {
    let name = req.name_any();
    let status = req.status.clone().unwrap_or_default();
    if matches!(status.phase.as_deref(), Some("Approved" | "Denied")) {
        return Ok(Action::await_change());
    }
    let client = &ctx.client;
    let step = |step: &str| {
        let request = format!("{}/{name}", ns());
        let step = step.to_string();
        move |source| Error::Api {
            request,
            step,
            source,
        }
    };
    // The filer wrote the metadata: finalizers or owners it set would keep its request (and
    // its place in the quota) past any deletion, or hand it to another object's lifetime.
    if req.finalizers().iter().next().is_some() || req.owner_references().iter().next().is_some() {
        Api::<PeeringRequest>::namespaced(client.clone(), ns())
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null, "ownerReferences": null}})),
            )
            .await
            .map_err(step("removing the filer's finalizers and owners"))?;
        return Ok(Action::await_change());
    }
    let token = enroll::token_secret(client).await.map_err(|e| Error::Api {
        request: format!("{}/{name}", ns()),
        step: "reading the enrollment credential".into(),
        source: match e {
            crate::invite::InviteError::Api { source, .. } => source,
            other => kube::Error::Service(other.to_string().into()),
        },
    })?;
    let fingerprint = enroll::csr_key_fingerprint(&req.spec.csr);
    // A request not named after the key its CSR proves (signed with it) takes a name another
    // consumer's key owns: gone.
    if fingerprint.as_deref().map(enroll::request_name) != Some(name.clone()) {
        tracing::info!(request = %name, "enrollment request not named after a key its CSR proves removed");
        Api::<PeeringRequest>::namespaced(client.clone(), ns())
            .delete(&name, &DeleteParams::default())
            .await
            .map(|_| ())
            .or_else(crate::provider::peering_request::ignore_missing)
            .map_err(step("removing the request"))?;
        return Ok(Action::await_change());
    }
    let fingerprint = fingerprint.expect("checked above");
    let deny = |message: String| {
        json!({"phase": "Denied", "message": message, "keyFingerprint": fingerprint,
               "decidedAt": now_rfc3339()})
    };
    if let Err(why) = check(&ctx.identity.cluster_id, &req, token.as_ref()) {
        tracing::info!(request = %name, consumer = %req.spec.cluster_id, %why, "enrollment request denied");
        set_status_in(client, ns(), &name, deny(why.to_string()))
            .await
            .map_err(step("writing status"))?;
        return Ok(Action::await_change());
    }
    let consumer = req.spec.cluster_id.clone();
    let tenant_ns = names::tenant_namespace(&consumer);
    let tenant = Api::<Tenant>::namespaced(client.clone(), &tenant_ns)
        .get_opt(&consumer)
        .await
        .map_err(step("reading the consumer's Tenant"))?;
    if let Some(t) = &tenant
        && t.annotations().get(names::KEY_FINGERPRINT_ANNOTATION) != Some(&fingerprint)
    {
        let why = format!(
            "cluster ID {consumer} already peers with this cluster (Tenant {tenant_ns}/{consumer}) under another key; cluster IDs are self-asserted, so this request is refused"
        );
        set_status_in(client, ns(), &name, deny(why))
            .await
            .map_err(step("writing status"))?;
        return Ok(Action::await_change());
    }
    if status.decision.as_deref() == Some("Deny") {
        tracing::info!(request = %name, %consumer, "enrollment request denied by the administrator");
        set_status_in(
            client,
            ns(),
            &name,
            deny("denied by the provider's administrator".into()),
        )
        .await
        .map_err(step("writing status"))?;
        return Ok(Action::await_change());
    }
    let policies = Api::<PeeringPolicy>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(step("listing PeeringPolicies"))?
        .items;
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let matched = enroll::matching_policy(&policies, &fingerprint, &consumer, now);
    let approved_by = match (&matched, status.decision.as_deref()) {
        (Ok(p), _) => Some((format!("PeeringPolicy/{}", p.name_any()), Some(*p))),
        (Err(_), Some("Approve")) => Some(("admin".to_string(), None)),
        (Err(_), _) => None,
    };
    let Some((approved_by, policy)) = approved_by else {
        let why = matched.err().map(|e| e.to_string()).unwrap_or_default();
        let mut message = format!(
            "waiting for approval: `tandem approve {name}` on this cluster, or a PeeringPolicy naming key {fingerprint}"
        );
        if !why.is_empty() {
            message.push_str(&format!(" ({why})"));
        }
        if status.phase.as_deref() != Some("Pending")
            || status.message.as_deref() != Some(message.as_str())
        {
            set_status_in(
                client,
                ns(),
                &name,
                json!({"phase": "Pending", "message": message, "keyFingerprint": fingerprint}),
            )
            .await
            .map_err(step("writing status"))?;
        }
        return Ok(Action::requeue(POLICY_RECHECK));
    };
    // The request's CSR is filed only once the Tenant carries this key and its terms
    // (below): a later pass (woken by the CSR's signing) that finds both goes straight to
    // the identity.
    let filed = tenant.is_some()
        && Api::<CertificateSigningRequest>::all(client.clone())
            .get_opt(&csr_name(&req))
            .await
            .map_err(step("reading the request's CSR"))?
            .is_some();
    if !filed {
        // The terms go on the Tenant before the identity exists: the consumer never runs a
        // moment without them.
        // Two keys approved for one cluster ID (an admin and a policy, say) race for the Tenant:
        // it is created with the key on it, so only the first key's creation lands, and the
        // other request is denied on reading it back.
        ensure_tenant_with(
            &ctx,
            &consumer,
            json!({names::KEY_FINGERPRINT_ANNOTATION: fingerprint}),
        )
        .await
        .map_err(step("creating the tenant"))?;
        let tenants = Api::<Tenant>::namespaced(client.clone(), &tenant_ns);
        let current = tenants
            .get(&consumer)
            .await
            .map_err(step("reading the consumer's Tenant"))?;
        if let Some(other) = current.annotations().get(names::KEY_FINGERPRINT_ANNOTATION)
            && other != &fingerprint
        {
            let why = format!(
                "cluster ID {consumer} was just approved for another key ({other}); cluster IDs are self-asserted, so this request is refused"
            );
            set_status_in(client, ns(), &name, deny(why))
                .await
                .map_err(step("writing status"))?;
            return Ok(Action::await_change());
        }
        let mut annotations = serde_json::Map::new();
        let mut spec = serde_json::Map::new();
        if let Some(p) = policy {
            annotations.insert(names::POLICY_ANNOTATION.into(), json!(p.name_any()));
            if let Some(grant) = &p.spec.grant {
                spec.insert("grant".into(), json!(grant));
            }
            spec.insert(
                "allowedNamespaceMappingStrategies".into(),
                json!(p.spec.namespace_mapping_strategies),
            );
            spec.insert(
                "allowedPodOffloadingStrategies".into(),
                json!(p.spec.pod_offloading_strategies),
            );
            spec.insert("podResources".into(), json!(p.spec.pod_resources));
        }
        tenants
            .patch(
                &consumer,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": annotations}, "spec": spec})),
            )
            .await
            .map_err(step("writing the approval's terms on the Tenant"))?;
    }
    tracing::info!(request = %name, %consumer, %approved_by, "enrollment request approved");
    approve(
        &ctx,
        &req,
        ns(),
        json!({"keyFingerprint": fingerprint, "approvedBy": approved_by,
               "decidedAt": now_rfc3339()}),
    )
    .await
}

fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Why an enrollment request is denied; its text is the request's status message.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// The consumer speaks a protocol version this cluster does not.
    #[error(transparent)]
    Protocol(#[from] tandem_core::protocol::Unsupported),
    /// Enrollment is off: no credential to check against.
    #[error("this cluster no longer takes peering requests without an invite")]
    NoCredential,
    /// The request names another token.
    #[error("spec.tokenID {0:?} is not this cluster's enrollment credential")]
    OtherToken(String),
    /// The proof was not made with the credential's secret.
    #[error("spec.tokenProof does not match the enrollment credential")]
    BadProof,
    /// The claimed cluster ID is not one.
    #[error(transparent)]
    ClusterId(#[from] names::ClusterIdError),
    /// The consumer claims this cluster's own ID.
    #[error("a cluster cannot peer with itself")]
    Itself,
    /// The CSR is not one this cluster signs for the consumer.
    #[error("spec.csr: {0}")]
    Csr(crate::provider::peering_request::CsrError),
}

/// Checks a request against the enrollment credential: `own_id` is this cluster's ID, `token`
/// the credential's Secret if enrollment is on.
fn check(own_id: &str, req: &PeeringRequest, token: Option<&Secret>) -> Result<(), Refusal> {
    let spec = &req.spec;
    let version = spec
        .protocol_version
        .unwrap_or_else(tandem_core::protocol::unversioned);
    tandem_core::protocol::check("consumer", version)?;
    let Some(token) = token else {
        return Err(Refusal::NoCredential);
    };
    let bearer = enroll::bearer_of(token).unwrap_or_default();
    let (id, secret) = bearer.split_once('.').unwrap_or_default();
    if spec.token_id != id {
        return Err(Refusal::OtherToken(spec.token_id.clone()));
    }
    if !tandem_core::invite::verify_token_proof(
        secret,
        &spec.cluster_id,
        &spec.token_id,
        &spec.csr,
        &spec.token_proof,
    ) {
        return Err(Refusal::BadProof);
    }
    names::validate_cluster_id(&spec.cluster_id)?;
    if spec.cluster_id == own_id {
        return Err(Refusal::Itself);
    }
    check_csr(&spec.csr, &spec.cluster_id).map_err(Refusal::Csr)
}

async fn janitor(ctx: Ctx) {
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    loop {
        tick.tick().await;
        if let Err(e) = sweep(&ctx.client).await {
            tracing::warn!(error = %crate::error::chain(&e), "cleaning up enrollment requests");
        }
    }
}

/// Removes pending requests past their TTL, denied ones after their grace, approved ones once
/// their consumer authenticated (it published its network parameters) or after a while.
///
/// An approved request its consumer never used (it unpeered while waiting, or went) takes the
/// Tenant its approval made with it: nobody would ever remove that Tenant, its namespace, its
/// RoleBindings and the pod range reserved for it otherwise (the consumer's unpeering cannot
/// reach this cluster without the identity it never collected).
async fn sweep(client: &Client) -> Result<(), kube::Error> {
    let Some(namespace) = Api::<Namespace>::all(client.clone()).get_opt(ns()).await? else {
        return Ok(());
    };
    let ttl = namespace
        .annotations()
        .get(enroll::REQUEST_TTL_ANNOTATION)
        .and_then(|v| v.parse::<i64>().ok())
        .unwrap_or(enroll::DEFAULT_REQUEST_TTL.as_secs() as i64);
    let requests: Api<PeeringRequest> = Api::namespaced(client.clone(), ns());
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    for r in requests.list(&ListParams::default()).await?.items {
        let age = r
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(0, |t| now - t.0.as_second());
        // A decision's grace runs from the decision, not from the filing.
        let since_decided = r
            .status
            .as_ref()
            .and_then(|s| s.decided_at.as_deref())
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .map_or(age, |t| now - t.as_second());
        let mut unused = false;
        let remove = match r.status.as_ref().and_then(|s| s.phase.as_deref()) {
            Some("Denied") => since_decided > DENIED_GRACE_SECS,
            Some("Approved") => {
                let used = super::network::consumer_published(client, &r.spec.cluster_id).await?;
                unused = !used && since_decided > APPROVED_GRACE_SECS.min(ttl);
                used || unused
            }
            _ => age > ttl,
        };
        if unused {
            let key = r.status.as_ref().and_then(|s| s.key_fingerprint.as_deref());
            remove_unused_tenant(client, &r, key).await?;
        }
        if remove {
            tracing::info!(request = %r.name_any(), consumer = %r.spec.cluster_id, age, "enrollment request removed");
            client::ok_if_not_found(
                requests
                    .delete(&r.name_any(), &DeleteParams::default())
                    .await,
            )?;
        }
    }
    Ok(())
}

/// Removes the Tenant that approving `request` made, if it is still that approval's (it carries
/// the request's key) and its consumer never published its network parameters with the
/// identity: the Tenant's finalizer then undoes the rest (namespace, RoleBindings, pod range).
async fn remove_unused_tenant(
    client: &Client,
    request: &PeeringRequest,
    key: Option<&str>,
) -> Result<(), kube::Error> {
    let consumer = &request.spec.cluster_id;
    let tenants = Api::<Tenant>::namespaced(client.clone(), &names::tenant_namespace(consumer));
    let Some(tenant) = tenants.get_opt(consumer).await? else {
        return Ok(());
    };
    let ours = key.is_some()
        && tenant
            .annotations()
            .get(names::KEY_FINGERPRINT_ANNOTATION)
            .map(String::as_str)
            == key;
    if !ours || tenant.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    // Looked at again just before: a consumer that publishes now keeps its Tenant.
    if super::network::consumer_published(client, consumer).await? {
        return Ok(());
    }
    tracing::info!(request = %request.name_any(), %consumer, "approved enrollment never used: removing the Tenant its approval made");
    // This Tenant, not one made again since under the same name.
    let params = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: tenant.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match tenants.delete(consumer, &params).await {
        Ok(_) => Ok(()),
        Err(e) if client::is_not_found(&e) || client::is_conflict(&e) => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;
    use tandem_api::PeeringRequestSpec;

    use super::*;

    const TOKEN_ID: &str = "abcdef";
    const SECRET: &str = "0123456789abcdef";

    /// A CSR for `cluster`'s key, with the subject a provider signs (`subject_of` overrides it).
    fn csr(cluster: &str, subject_of: Option<&str>) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let fingerprint = crate::credentials::own_key_fingerprint(&key.serialize_pem()).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        let mut dn = rcgen::DistinguishedName::new();
        dn.push(
            rcgen::DnType::CommonName,
            names::peer_user(subject_of.unwrap_or(cluster)),
        );
        dn.push(
            rcgen::DnType::OrganizationName,
            names::peer_key_group(&fingerprint),
        );
        params.distinguished_name = dn;
        params.serialize_request(&key).unwrap().pem().unwrap()
    }

    /// A request from `cluster` proving the credential, as a consumer files it.
    fn request(cluster: &str) -> PeeringRequest {
        let csr = csr(cluster, None);
        let proof = tandem_core::invite::token_proof(SECRET, cluster, TOKEN_ID, &csr);
        PeeringRequest::new(
            "enroll-x",
            PeeringRequestSpec {
                cluster_id: cluster.into(),
                token_id: TOKEN_ID.into(),
                token_proof: proof,
                csr,
                protocol_version: None,
                source: None,
            },
        )
    }

    fn credential() -> Secret {
        Secret {
            data: Some(BTreeMap::from([
                ("token-id".into(), ByteString(TOKEN_ID.into())),
                ("token-secret".into(), ByteString(SECRET.into())),
            ])),
            ..Secret::default()
        }
    }

    /// Every refusal, each from a request that differs from a good one in one way.
    #[test]
    fn enrollment_refusals_table() {
        type Edit = fn(&mut PeeringRequest, &mut Option<Secret>);
        type Variant = fn(&Refusal) -> bool;
        let cases: [(&str, Edit, Variant, &str); 8] = [
            (
                "protocol",
                |r, _| r.spec.protocol_version = Some(999),
                |e| matches!(e, Refusal::Protocol(_)),
                "999",
            ),
            (
                "enrollment off",
                |_, t| *t = None,
                |e| matches!(e, Refusal::NoCredential),
                "no longer takes peering requests without an invite",
            ),
            (
                "another token",
                |r, _| r.spec.token_id = "zzzzzz".into(),
                |e| matches!(e, Refusal::OtherToken(_)),
                "spec.tokenID \"zzzzzz\" is not this cluster's enrollment credential",
            ),
            (
                "proof from another secret",
                |r, _| {
                    r.spec.token_proof = tandem_core::invite::token_proof(
                        "another-secret-16",
                        &r.spec.cluster_id,
                        TOKEN_ID,
                        &r.spec.csr,
                    )
                },
                |e| matches!(e, Refusal::BadProof),
                "spec.tokenProof does not match",
            ),
            (
                "invalid cluster ID",
                |r, _| *r = request("Not_A_Label"),
                |e| matches!(e, Refusal::ClusterId(_)),
                "cluster ID \"Not_A_Label\" must consist of lower-case letters",
            ),
            (
                "itself",
                |r, _| *r = request("milan"),
                |e| matches!(e, Refusal::Itself),
                "a cluster cannot peer with itself",
            ),
            (
                "CSR for another cluster",
                |r, _| {
                    r.spec.csr = csr("rome", Some("paris"));
                    r.spec.token_proof =
                        tandem_core::invite::token_proof(SECRET, "rome", TOKEN_ID, &r.spec.csr);
                },
                |e| matches!(e, Refusal::Csr(_)),
                "spec.csr: ",
            ),
            (
                "CSR not PEM",
                |r, _| {
                    r.spec.csr = "garbage".into();
                    r.spec.token_proof =
                        tandem_core::invite::token_proof(SECRET, "rome", TOKEN_ID, "garbage");
                },
                |e| matches!(e, Refusal::Csr(_)),
                "spec.csr: not PEM",
            ),
        ];
        let good = request("rome");
        assert!(
            check("milan", &good, Some(&credential())).is_ok(),
            "the unedited request passes"
        );
        for (name, edit, variant, text) in cases {
            let (mut req, mut token) = (request("rome"), Some(credential()));
            edit(&mut req, &mut token);
            let refusal = check("milan", &req, token.as_ref()).expect_err(name);
            assert!(variant(&refusal), "{name}: {refusal:?}");
            assert!(refusal.to_string().contains(text), "{name}: {refusal}");
        }
    }
}
