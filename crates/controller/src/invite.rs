//! Invites as the provider's controller sees them: the error and refusals of peering's steps,
//! the Role an invite's token gets, the provider's invites listed from their token Secrets, and
//! the removal of what an invite created (once the consumer is established, or its Tenant is
//! gone). Creating, accepting and revoking invites, waiting for a Peering and unpeering are the
//! admin library's (`tandem_admin::invite`).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tandem_api::client;
use tandem_api::names;
use tandem_core::invite::human_duration;

use crate::consumer::peering::{AuthFailureReason, UnpeerStep};

pub use crate::credentials::{
    EXPIRES_KEY, FORCE_UNPEER_ANNOTATION, INVITE_USED_ANNOTATION, TOKEN_KEY,
    consumer_token_secret_name, invite_role_name, token_secret_name,
};

/// What went wrong in an admin-side step of peering.
#[derive(Debug, thiserror::Error)]
pub enum InviteError {
    #[error("{step}")]
    Api {
        step: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Identity(#[from] crate::identity::IdentityError),
    #[error(transparent)]
    Invite(#[from] tandem_core::invite::InviteError),
    /// Peering or unpeering refused, for a reason the caller may act on.
    #[error("{0}")]
    Refused(Refusal),
    /// The Peering is neither Established nor Failed after `after`.
    #[error("not established after {}: {pending}", human_duration(after.as_secs() as i64))]
    NotEstablished {
        after: Duration,
        /// The first condition that is not True (`Type: message`), or what is missing.
        pending: String,
        /// Why authentication still fails, if that is where it waits.
        reason: Option<AuthFailureReason>,
        /// Whether the controller reports that the provider does not answer.
        provider_unreachable: bool,
    },
    /// Unpeering did not finish within `after`.
    #[error(
        "still unpeering from {peer} after {}{}{}",
        human_duration(after.as_secs() as i64),
        stuck.map(|s| format!(" ({s})")).unwrap_or_default(),
        force_hint.as_ref().map(|h| format!("; {h}")).unwrap_or_default()
    )]
    UnpeerTimedOut {
        peer: String,
        after: Duration,
        /// The step the controller retries, if it reported one.
        stuck: Option<UnpeerStep>,
        /// How to skip the provider's steps, unless already forced.
        force_hint: Option<String>,
    },
    /// Cleaning up after a refused peering did not finish.
    #[error("Peering {provider} or namespace {namespace} still there after {}", human_duration(after.as_secs() as i64))]
    CleanupTimedOut {
        provider: String,
        namespace: String,
        after: Duration,
    },
}

/// Why a peering step was refused: a typed value the CLI chooses its hint from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The invite names a cluster ID that is not a valid one.
    InvalidClusterId { id: String, problem: String },
    /// The invite comes from this very cluster.
    SameCluster { id: String },
    /// This cluster already has a Peering with the provider.
    AlreadyPeered { provider: String, phase: String },
    /// The tenant namespace of an earlier peering is still terminating.
    TenantNamespaceTerminating { namespace: String },
    /// No invite has this token ID.
    NoSuchInvite { token_id: String },
    /// This cluster has neither a Peering nor a Tenant for `peer`.
    NotPeered { peer: String },
    /// No peering request filed through discovery has this name (or claims this cluster ID).
    NoSuchRequest { id: String },
    /// Several pending requests claim this cluster ID.
    AmbiguousRequest { id: String, names: Vec<String> },
    /// The request was already approved or denied.
    RequestDecided { name: String, phase: String },
    /// `tandem approve` was given a cluster ID, which anyone may claim.
    ApproveByName { id: String, names: Vec<String> },
    /// Something grants rights to a group every bootstrap token is in (system:bootstrappers,
    /// system:authenticated, Tandem's enroll group), which the public enrollment credential
    /// would get.
    CredentialReachesFurther { bindings: Vec<String> },
    /// The controller could not authenticate with the provider (the Peering Failed).
    Authentication {
        /// The `Authenticated` condition's reason, when it is one the controller sets.
        reason: Option<AuthFailureReason>,
        message: String,
    },
}

impl Refusal {
    /// Whether only a new invite from the provider can help.
    pub fn needs_new_invite(&self) -> bool {
        matches!(
            self,
            Refusal::Authentication {
                reason: Some(
                    AuthFailureReason::InviteExpired
                        | AuthFailureReason::TokenUsed
                        | AuthFailureReason::TokenRejected
                        | AuthFailureReason::InviteMissing
                ),
                ..
            }
        )
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::InvalidClusterId { id, problem } => {
                write!(
                    f,
                    "the invite names an invalid cluster ID {id:?}: {problem}"
                )
            }
            Refusal::SameCluster { id } => write!(
                f,
                "the invite is from this very cluster ({id}); run `tandem peer` on the consumer"
            ),
            Refusal::AlreadyPeered { provider, phase } => write!(
                f,
                "this cluster already peers with {provider} (phase {phase}); `tandem unpeer {provider}` first"
            ),
            Refusal::TenantNamespaceTerminating { namespace } => write!(
                f,
                "namespace {namespace} of an earlier peering is still being deleted; retry in a moment"
            ),
            Refusal::NoSuchInvite { token_id } => write!(
                f,
                "no invite with token ID {token_id:?} (see `tandem invite --list`)"
            ),
            Refusal::NotPeered { peer } => write!(
                f,
                "this cluster has no peering with {peer:?} (no Peering and no Tenant)"
            ),
            Refusal::NoSuchRequest { id } => {
                write!(f, "no peering request {id:?} (see `tandem requests`)")
            }
            Refusal::AmbiguousRequest { id, names } => write!(
                f,
                "{} pending requests claim cluster ID {id:?} ({}); name one (cluster IDs are self-asserted: compare the key fingerprints in `tandem requests`)",
                names.len(),
                names.join(", ")
            ),
            Refusal::CredentialReachesFurther { bindings } => write!(
                f,
                "the public enrollment credential, a bootstrap token, must do nothing but file peering requests, but {}: bind narrower subjects (kubelet TLS bootstrapping: group system:bootstrappers:kubeadm:default-node-token), or advertise with --no-enroll",
                bindings.join("; ")
            ),
            Refusal::ApproveByName { id, names } => write!(
                f,
                "approve a request by its name, not by the cluster ID {id:?} it claims (anyone can claim one): {} (compare the key fingerprints in `tandem requests`)",
                names.join(", ")
            ),
            Refusal::RequestDecided { name, phase } => {
                write!(f, "peering request {name} is already {phase}")
            }
            Refusal::Authentication { message, .. } => f.write_str(message),
        }
    }
}

pub fn api(step: impl Into<String>) -> impl FnOnce(kube::Error) -> InviteError {
    let step = step.into();
    move |source| InviteError::Api { step, source }
}

pub fn managed() -> BTreeMap<String, String> {
    [(
        names::MANAGED_BY_LABEL.to_string(),
        names::MANAGED_BY.to_string(),
    )]
    .into()
}

/// An invite as the provider lists it.
#[derive(Clone, Debug, PartialEq)]
pub struct InviteInfo {
    pub token_id: String,
    pub expires: i64,
    /// The consumer that used it, if any.
    pub used_by: Option<String>,
}

/// The rules of an invite's Role: file (while unused) and read back its one request.
pub fn invite_rules(token_id: &str, may_create: bool) -> serde_json::Value {
    let mut rules = vec![json!({
        "apiGroups": [tandem_api::GROUP], "resources": ["peeringrequests"],
        "verbs": ["get"], "resourceNames": [token_id],
    })];
    if may_create {
        rules.push(json!({
            "apiGroups": [tandem_api::GROUP], "resources": ["peeringrequests"], "verbs": ["create"],
        }));
    }
    json!(rules)
}

/// Tandem's bootstrap-token Secrets in kube-system: invites and the enrollment credential.
pub async fn managed_tokens(client: &Client) -> Result<Vec<Secret>, InviteError> {
    Ok(Api::<Secret>::namespaced(client.clone(), "kube-system")
        .list(&ListParams::default().labels(&format!(
            "{}={}",
            names::MANAGED_BY_LABEL,
            names::MANAGED_BY
        )))
        .await
        .map_err(api("listing Tandem's tokens in kube-system"))?
        .items)
}

/// Whether a token Secret of Tandem's is the enrollment credential (`tandem advertise`), not
/// an invite.
pub fn is_enrollment_token(secret: &Secret) -> bool {
    secret
        .annotations()
        .get(names::INVITE_ANNOTATION)
        .map(String::as_str)
        == Some(names::ENROLL_TOKEN_PURPOSE)
}

/// The provider's invites (unexpired or not yet cleaned up).
pub async fn list(client: &Client) -> Result<Vec<InviteInfo>, InviteError> {
    Ok(managed_tokens(client)
        .await?
        .iter()
        // The enrollment credential is not an invite: it does not expire and is never spent.
        .filter(|s| !is_enrollment_token(s))
        .filter_map(|s| {
            let data = s.data.as_ref()?;
            let get = |k: &str| {
                data.get(k)
                    .map(|v| String::from_utf8_lossy(&v.0).into_owned())
            };
            let expires = get("expiration")
                .and_then(|e| e.parse::<k8s_openapi::jiff::Timestamp>().ok())
                .map_or(0, |t| t.as_second());
            Some(InviteInfo {
                token_id: get("token-id")?,
                expires,
                used_by: s.annotations().get(INVITE_USED_ANNOTATION).cloned(),
            })
        })
        .collect())
}

/// Deletes everything an invite created on the provider (idempotent).
pub async fn remove_invite_objects(client: &Client, token_id: &str) -> Result<(), InviteError> {
    let role = invite_role_name(token_id);
    // A used invite's request is removed by the cleanup sweep once the consumer is
    // established; a Tenant undone before that would leave it behind for good.
    delete_ignoring_missing(
        &Api::<tandem_api::PeeringRequest>::namespaced(client.clone(), names::SYSTEM_NAMESPACE),
        token_id,
    )
    .await?;
    delete_ignoring_missing(
        &Api::<Secret>::namespaced(client.clone(), "kube-system"),
        &token_secret_name(token_id),
    )
    .await?;
    delete_ignoring_missing(
        &Api::<RoleBinding>::namespaced(client.clone(), names::SYSTEM_NAMESPACE),
        &role,
    )
    .await?;
    delete_ignoring_missing(
        &Api::<Role>::namespaced(client.clone(), names::SYSTEM_NAMESPACE),
        &role,
    )
    .await?;
    Ok(())
}

pub async fn delete_ignoring_missing<K>(api: &Api<K>, name: &str) -> Result<(), InviteError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    client::delete_if_exists(api, name, &DeleteParams::background())
        .await
        .map_err(|source| InviteError::Api {
            step: format!("deleting {} {name}", K::kind(&K::DynamicType::default())),
            source,
        })
}
