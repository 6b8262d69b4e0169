//! The admin-side steps of peering, shared by the CLI and the tests:
//! - on the provider: create and revoke invites (a bootstrap token allowed nothing but filing
//!   and reading back one peering request; listing them is the controller's
//!   [`tandem_controller::invite::list`]);
//! - on the consumer: accept an invite (tenant namespace, token Secret, `Peering`), wait for
//!   the controller to establish it, and undo it;
//! - on either side: unpeer.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tandem_api::{Peering, Tenant, client, conditions, names};
use tandem_core::invite::{PeeringInvite, human_duration};

use tandem_controller::consumer::peering::{AuthFailureReason, UnpeerStep};
use tandem_controller::identity::ClusterIdentity;
pub use tandem_controller::invite::{
    EXPIRES_KEY, FORCE_UNPEER_ANNOTATION, INVITE_USED_ANNOTATION, InviteError, InviteInfo, Refusal,
    TOKEN_KEY, consumer_token_secret_name, invite_role_name, invite_rules, is_enrollment_token,
    list, remove_invite_objects, token_secret_name,
};
use tandem_controller::invite::{api, delete_ignoring_missing, managed};

fn now_unix() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_second()
}

pub(crate) fn random_token_part(len: usize) -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..len)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// Creates an invite on the provider (`client`) for consumers reaching it at `endpoint` with
/// `ca_pem`, valid for `ttl`.
pub async fn create(
    client: &Client,
    endpoint: &str,
    ca_pem: &str,
    ttl: Duration,
) -> Result<PeeringInvite, InviteError> {
    let identity = ClusterIdentity::load(client).await?;
    let invite = PeeringInvite {
        provider_cluster_id: identity.cluster_id,
        endpoint: endpoint.trim_end_matches('/').to_string(),
        ca_data: ca_pem.to_string(),
        token_id: random_token_part(tandem_core::invite::TOKEN_ID_LEN),
        token_secret: random_token_part(tandem_core::invite::TOKEN_SECRET_LEN),
        expires: now_unix() + ttl.as_secs() as i64,
        protocol_version: tandem_core::protocol::VERSION,
    };
    invite.validate()?;
    let id = &invite.token_id;
    let expiration = k8s_openapi::jiff::Timestamp::from_second(invite.expires)
        .expect("expiry in range")
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let group = format!("{}{id}", names::INVITE_GROUP_PREFIX);
    let role_name = invite_role_name(id);
    // RBAC first: a token that authenticates before its permissions exist would only get 403.
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": role_name, "namespace": names::SYSTEM_NAMESPACE, "labels": managed(),
                     "annotations": {names::INVITE_ANNOTATION: id}},
        "rules": invite_rules(id, true),
    }))
    .expect("static manifest");
    Api::<Role>::namespaced(client.clone(), names::SYSTEM_NAMESPACE)
        .create(&PostParams::default(), &role)
        .await
        .map_err(api(format!(
            "creating Role {}/{role_name}",
            names::SYSTEM_NAMESPACE
        )))?;
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": role_name, "namespace": names::SYSTEM_NAMESPACE, "labels": managed(),
                     "annotations": {names::INVITE_ANNOTATION: id}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role_name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}],
    }))
    .expect("static manifest");
    Api::<RoleBinding>::namespaced(client.clone(), names::SYSTEM_NAMESPACE)
        .create(&PostParams::default(), &binding)
        .await
        .map_err(api(format!(
            "creating RoleBinding {}/{role_name}",
            names::SYSTEM_NAMESPACE
        )))?;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": token_secret_name(id), "namespace": "kube-system", "labels": managed(),
                     "annotations": {names::INVITE_ANNOTATION: "peering"}},
        "type": "bootstrap.kubernetes.io/token",
        "stringData": {
            "description": "Tandem peering invite",
            "token-id": id,
            "token-secret": invite.token_secret,
            "expiration": expiration,
            "usage-bootstrap-authentication": "true",
            "auth-extra-groups": group,
        },
    }))
    .expect("static manifest");
    Api::<Secret>::namespaced(client.clone(), "kube-system")
        .create(&PostParams::default(), &secret)
        .await
        .map_err(api(format!(
            "creating Secret kube-system/{}",
            token_secret_name(id)
        )))?;
    Ok(invite)
}

/// Revokes an invite: deletes its token, RBAC and pending request. Unknown IDs are an error.
pub async fn revoke(client: &Client, token_id: &str) -> Result<(), InviteError> {
    let secrets = Api::<Secret>::namespaced(client.clone(), "kube-system");
    let name = token_secret_name(token_id);
    let found = secrets
        .get_opt(&name)
        .await
        .map_err(api(format!("reading Secret kube-system/{name}")))?;
    if found.is_none() {
        return Err(InviteError::Refused(Refusal::NoSuchInvite {
            token_id: token_id.to_string(),
        }));
    }
    remove_invite_objects(client, token_id).await
}

/// Accepts an invite on the consumer (`client`): creates the tenant namespace, the token Secret
/// and the `Peering`. Touches only the consumer's cluster.
pub async fn accept(client: &Client, invite: &PeeringInvite) -> Result<(), InviteError> {
    invite.check_expiry(now_unix())?;
    let provider = &invite.provider_cluster_id;
    create_peering(
        client,
        provider,
        &invite.endpoint,
        &invite.ca_data,
        [
            (TOKEN_KEY.to_string(), invite.bearer_token()),
            (EXPIRES_KEY.to_string(), invite.expires.to_string()),
        ]
        .into(),
    )
    .await
}

/// Creates the Peering with `provider` at `endpoint` (CA `ca_pem`) on this cluster, with its
/// tenant namespace and the Secret holding `secret_data` (the token the controller files the
/// request with), once it checked that `provider` is a valid ID, not this cluster, not
/// already peered, and that no earlier tenant namespace is still terminating.
pub(crate) async fn create_peering(
    client: &Client,
    provider: &str,
    endpoint: &str,
    ca_pem: &str,
    secret_data: BTreeMap<String, String>,
) -> Result<(), InviteError> {
    let identity = ClusterIdentity::load(client).await?;
    names::validate_cluster_id(provider).map_err(|problem| {
        InviteError::Refused(Refusal::InvalidClusterId {
            id: provider.to_string(),
            problem: problem.to_string(),
        })
    })?;
    if provider == identity.cluster_id {
        return Err(InviteError::Refused(Refusal::SameCluster {
            id: provider.to_string(),
        }));
    }
    let peerings: Api<Peering> = Api::all(client.clone());
    if let Some(existing) = peerings
        .get_opt(provider)
        .await
        .map_err(api(format!("reading Peering {provider}")))?
    {
        let phase = existing
            .status
            .and_then(|s| s.phase)
            .unwrap_or_else(|| "Pending".into());
        return Err(InviteError::Refused(Refusal::AlreadyPeered {
            provider: provider.to_string(),
            phase,
        }));
    }
    let tenant = names::tenant_namespace(provider);
    if let Some(ns) = Api::<Namespace>::all(client.clone())
        .get_opt(&tenant)
        .await
        .map_err(api(format!("reading namespace {tenant}")))?
        && ns.metadata.deletion_timestamp.is_some()
    {
        return Err(InviteError::Refused(Refusal::TenantNamespaceTerminating {
            namespace: tenant,
        }));
    }
    let pp = PatchParams::apply(names::FIELD_MANAGER).force();
    let mut ns_labels = managed();
    ns_labels.insert(names::TENANT_NAMESPACE_LABEL.into(), "true".into());
    ns_labels.insert(names::REMOTE_CLUSTER_LABEL.into(), provider.to_string());
    Api::<Namespace>::all(client.clone())
        .patch(
            &tenant,
            &pp,
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": tenant, "labels": ns_labels},
            })),
        )
        .await
        .map_err(api(format!("creating namespace {tenant}")))?;
    let secret_name = consumer_token_secret_name(provider);
    Api::<Secret>::namespaced(client.clone(), &tenant)
        .patch(
            &secret_name,
            &pp,
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": secret_name, "labels": managed()},
                "stringData": secret_data,
            })),
        )
        .await
        .map_err(api(format!("creating Secret {tenant}/{secret_name}")))?;
    let peering: Peering = serde_json::from_value(json!({
        "apiVersion": "tandem.dev/v1alpha1", "kind": "Peering",
        "metadata": {"name": provider, "labels": managed()},
        "spec": {"clusterID": provider, "endpoint": endpoint, "caData": ca_pem,
                 "inviteSecret": secret_name},
    }))
    .expect("static manifest");
    peerings
        .create(&PostParams::default(), &peering)
        .await
        .map_err(api(format!("creating Peering {provider}")))?;
    Ok(())
}

/// Waits until the Peering with `provider` is Established (Ok) or Failed (Err with the cause),
/// telling `progress` each condition that turns True.
pub async fn wait_established(
    client: &Client,
    provider: &str,
    timeout: Duration,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<Peering, InviteError> {
    let peerings: Api<Peering> = Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + timeout;
    let mut told: Vec<String> = Vec::new();
    loop {
        let peering = peerings
            .get(provider)
            .await
            .map_err(api(format!("reading Peering {provider}")))?;
        let status = peering.status.clone().unwrap_or_default();
        for c in &status.conditions {
            if c.status == "True" && !told.contains(&c.type_) {
                told.push(c.type_.clone());
                progress(&format!("{}: {}", c.type_, c.message));
            }
        }
        match status.phase.as_deref() {
            Some("Established") => return Ok(peering),
            Some("Failed") => {
                let failed = status.conditions.iter().find(|c| c.status == "False");
                return Err(InviteError::Refused(Refusal::Authentication {
                    reason: failed.and_then(|c| AuthFailureReason::from_reason(&c.reason)),
                    message: failed
                        .map(|c| c.message.clone())
                        .unwrap_or_else(|| "failed".into()),
                }));
            }
            _ => {}
        }
        if tokio::time::Instant::now() > deadline {
            let pending = status.conditions.iter().find(|c| c.status != "True");
            return Err(InviteError::NotEstablished {
                after: timeout,
                pending: pending
                    .map(|c| format!("{}: {}", c.type_, c.message))
                    .unwrap_or_else(|| "no progress reported (is the controller running?)".into()),
                reason: pending
                    .filter(|c| c.type_ == conditions::AUTHENTICATED)
                    .and_then(|c| AuthFailureReason::from_reason(&c.reason)),
                provider_unreachable: status.conditions.iter().any(|c| {
                    c.status == "False"
                        && (c.type_ == conditions::PROVIDER_REACHABLE
                            || c.reason == AuthFailureReason::ProviderUnreachable.as_str())
                }),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What `unpeer` tells its caller while it waits, so an admin sees where it stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UnpeerProgress {
    /// The Peering with `peer` (this cluster its consumer) is being deleted.
    PeeringDeleted { peer: String },
    /// The Tenant of `peer` (this cluster its provider) is being deleted.
    TenantDeleted { peer: String },
    /// The controller fails at `step` and retries it; `provider_unreachable` when `peer` did
    /// not answer at all.
    Stuck {
        peer: String,
        step: UnpeerStep,
        provider_unreachable: bool,
        /// The failure, as the controller reports it in the Peering's `Unpeered` condition.
        message: String,
    },
    /// Still stuck at `step` after `waited` (repeated while the admin waits).
    StillStuck {
        peer: String,
        step: UnpeerStep,
        waited: Duration,
    },
    /// Everything of the peering is gone but the tenant namespace, which is terminating.
    TenantNamespaceTerminating { namespace: String },
}

impl UnpeerProgress {
    /// A hint naming `tandem unpeer --force` when waiting for `peer` may be pointless.
    pub fn force_hint(&self) -> Option<String> {
        match self {
            UnpeerProgress::Stuck { peer, step, .. }
            | UnpeerProgress::StillStuck { peer, step, .. }
                if step.skipped_by_force() =>
            {
                Some(force_hint(peer))
            }
            _ => None,
        }
    }
}

impl std::fmt::Display for UnpeerProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UnpeerProgress::PeeringDeleted { peer } => {
                write!(f, "Peering {peer} deleted; the controller undoes it")
            }
            UnpeerProgress::TenantDeleted { peer } => {
                write!(f, "Tenant {peer} deleted; the controller undoes it")
            }
            UnpeerProgress::Stuck {
                peer,
                step,
                provider_unreachable,
                message,
            } => {
                if *provider_unreachable {
                    write!(f, "{step}: {peer} is unreachable ({message}); retrying")
                } else {
                    write!(f, "{step}: {message}; retrying")
                }
            }
            UnpeerProgress::StillStuck { peer, step, waited } => write!(
                f,
                "still {step} for {peer} after {}; retrying",
                human_duration(waited.as_secs() as i64)
            ),
            UnpeerProgress::TenantNamespaceTerminating { namespace } => {
                write!(f, "waiting for namespace {namespace} to terminate")
            }
        }
    }
}

fn force_hint(peer: &str) -> String {
    format!("if {peer} is gone for good, run `tandem unpeer {peer} --force`")
}

/// How often `unpeer` repeats that it is still stuck.
const STILL_STUCK_EVERY: Duration = Duration::from_secs(10);

/// Where a deleting Peering's unpeering is stuck, from the controller's report in its status.
fn stuck_at(peering: &Peering) -> Option<UnpeerProgress> {
    let status = peering.status.as_ref()?;
    let unpeered = conditions::find(&status.conditions, conditions::UNPEERED)?;
    if unpeered.status != "False" {
        return None;
    }
    let step = UnpeerStep::from_reason(&unpeered.reason)?;
    let provider_unreachable = step.skipped_by_force()
        && conditions::find(&status.conditions, conditions::PROVIDER_REACHABLE)
            .is_some_and(|c| c.status == "False");
    Some(UnpeerProgress::Stuck {
        peer: peering.name_any(),
        step,
        provider_unreachable,
        message: unpeered.message.clone(),
    })
}

/// `--delete-data`: marks the Peering (as consumer) and the Tenant (as provider) for `peer` so
/// that unpeering deletes the provider's claims with their twin namespaces instead of
/// retaining them. Call before [`unpeer`].
pub async fn mark_delete_data(client: &Client, peer: &str) -> Result<(), InviteError> {
    let body = Patch::Merge(json!({"metadata": {"annotations": {
        names::DELETE_DATA_ANNOTATION: "true"}}}));
    let peerings: Api<Peering> = Api::all(client.clone());
    client::ok_if_not_found(peerings.patch(peer, &PatchParams::default(), &body).await)
        .map_err(api(format!("annotating Peering {peer}")))?;
    let tenant_ns = names::tenant_namespace(peer);
    let tenants: Api<Tenant> = Api::namespaced(client.clone(), &tenant_ns);
    client::ok_if_not_found(tenants.patch(peer, &PatchParams::default(), &body).await)
        .map_err(api(format!("annotating Tenant {tenant_ns}/{peer}")))?;
    Ok(())
}

/// What unpeering from `peer` retains, one line each: as consumer, the claims provisioned on
/// `peer` (from their PVs here); as provider, the twin namespaces of `peer` holding claims.
pub async fn data_held_with(client: &Client, peer: &str) -> Result<Vec<String>, InviteError> {
    let mut out = Vec::new();
    let volumes = tandem_controller::consumer::storage::remote_volumes(client)
        .await
        .map_err(api("listing PersistentVolumes".to_string()))?;
    for (claim, twin) in volumes.get(peer).into_iter().flatten() {
        out.push(format!(
            "PersistentVolumeClaim {claim}: its data stays on {peer} in namespace {twin}"
        ));
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let twins = namespaces
        .list(&ListParams::default().labels(&format!("{}={peer}", names::ORIGIN_CLUSTER_LABEL)))
        .await
        .map_err(api("listing twin namespaces".to_string()))?;
    for twin in twins
        .items
        .iter()
        .filter(|n| !n.labels().contains_key(names::TENANT_NAMESPACE_LABEL))
    {
        let claims: Vec<String> =
            Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(
                client.clone(),
                &twin.name_any(),
            )
            .list(&ListParams::default())
            .await
            .map_err(api(format!("listing claims in {}", twin.name_any())))?
            .items
            .iter()
            .map(ResourceExt::name_any)
            .collect();
        if !claims.is_empty() {
            out.push(format!(
                "namespace {} keeps {peer}'s PersistentVolumeClaims {}",
                twin.name_any(),
                claims.join(", ")
            ));
        }
    }
    Ok(out)
}

/// Unpeers from `peer` on this cluster: as consumer deletes the Peering (the controller undoes
/// everything, on the provider too unless `force`), as provider deletes the Tenant. Waits until
/// the tenant namespace is gone, telling `progress` where it stands: which step the controller
/// retries (and whether the provider is unreachable) as soon as it reports one, and again every
/// few seconds while it stays stuck.
pub async fn unpeer(
    client: &Client,
    peer: &str,
    force: bool,
    timeout: Duration,
    progress: &mut (dyn FnMut(UnpeerProgress) + Send),
) -> Result<(), InviteError> {
    let peerings: Api<Peering> = Api::all(client.clone());
    let tenant_ns = names::tenant_namespace(peer);
    let mut found = false;
    if peerings
        .get_opt(peer)
        .await
        .map_err(api(format!("reading Peering {peer}")))?
        .is_some()
    {
        found = true;
        if force {
            peerings
                .patch(
                    peer,
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({"metadata": {"annotations": {FORCE_UNPEER_ANNOTATION: "true"}}}),
                    ),
                )
                .await
                .map_err(api(format!("annotating Peering {peer}")))?;
        }
        delete_ignoring_missing(&peerings, peer).await?;
        progress(UnpeerProgress::PeeringDeleted { peer: peer.into() });
    }
    let tenants: Api<Tenant> = Api::namespaced(client.clone(), &tenant_ns);
    if tenants
        .get_opt(peer)
        .await
        .map_err(api(format!("reading Tenant {tenant_ns}/{peer}")))?
        .is_some()
    {
        found = true;
        delete_ignoring_missing(&tenants, peer).await?;
        progress(UnpeerProgress::TenantDeleted { peer: peer.into() });
    }
    if !found {
        return Err(InviteError::Refused(Refusal::NotPeered {
            peer: peer.to_string(),
        }));
    }
    let started = tokio::time::Instant::now();
    let deadline = started + timeout;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut last: Option<UnpeerProgress> = None;
    let mut stuck_since = started;
    let mut told_still = started;
    loop {
        let peering = peerings
            .get_opt(peer)
            .await
            .map_err(api(format!("reading Peering {peer}")))?;
        let ns = namespaces
            .get_opt(&tenant_ns)
            .await
            .map_err(api(format!("reading namespace {tenant_ns}")))?;
        if peering.is_none() && ns.is_none() {
            return Ok(());
        }
        let now = tokio::time::Instant::now();
        let state = match &peering {
            // Forced, the provider's steps are skipped: a report about them is from before.
            Some(p) => stuck_at(p).filter(|s| {
                !(force
                    && matches!(s, UnpeerProgress::Stuck { step, .. } if step.skipped_by_force()))
            }),
            None => Some(UnpeerProgress::TenantNamespaceTerminating {
                namespace: tenant_ns.clone(),
            }),
        };
        if state != last {
            stuck_since = now;
            told_still = now;
            if let Some(s) = &state {
                progress(s.clone());
            }
            last = state;
        } else if let Some(UnpeerProgress::Stuck { step, .. }) = &last
            && now.duration_since(told_still) >= STILL_STUCK_EVERY
        {
            told_still = now;
            progress(UnpeerProgress::StillStuck {
                peer: peer.to_string(),
                step: *step,
                waited: now.duration_since(stuck_since),
            });
        }
        if now > deadline {
            let stuck = match &last {
                Some(UnpeerProgress::Stuck { step, .. }) => Some(*step),
                _ => None,
            };
            return Err(InviteError::UnpeerTimedOut {
                peer: peer.to_string(),
                after: timeout,
                stuck,
                force_hint: (!force).then(|| force_hint(peer)),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether a Peering's conditions say it is usable.
pub fn is_established(peering: &Peering) -> bool {
    peering
        .status
        .as_ref()
        .is_some_and(|s| s.phase.as_deref() == Some("Established"))
        && peering
            .status
            .as_ref()
            .is_some_and(|s| conditions::is_true(&s.conditions, conditions::AUTHENTICATED))
}

/// Undoes [`accept`] after a failure: force-deletes the Peering (nothing on the provider
/// needs undoing, the request was refused) and the tenant namespace, and waits until both are gone.
pub async fn abandon(client: &Client, provider: &str) -> Result<(), InviteError> {
    let peerings: Api<Peering> = Api::all(client.clone());
    if peerings
        .get_opt(provider)
        .await
        .map_err(api(format!("reading Peering {provider}")))?
        .is_some()
    {
        let _ = peerings
            .patch(
                provider,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {FORCE_UNPEER_ANNOTATION: "true"}}}),
                ),
            )
            .await;
        delete_ignoring_missing(&peerings, provider).await?;
    }
    let tenant_ns = names::tenant_namespace(provider);
    let namespaces: Api<Namespace> = Api::all(client.clone());
    delete_ignoring_missing(&namespaces, &tenant_ns).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let peering = peerings
            .get_opt(provider)
            .await
            .map_err(api(format!("reading Peering {provider}")))?;
        let ns = namespaces
            .get_opt(&tenant_ns)
            .await
            .map_err(api(format!("reading namespace {tenant_ns}")))?;
        if peering.is_none() && ns.is_none() {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(InviteError::CleanupTimedOut {
                provider: provider.to_string(),
                namespace: tenant_ns,
                after: Duration::from_secs(30),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Why an established peering's virtual node does not take pods yet.
#[derive(Debug, thiserror::Error)]
#[error(
    "the peering with {provider} is established, but its virtual node {node} takes no pods \
     yet after {after:?}: {waiting}. The peering stays; `tandem status` shows when it can \
     (pods created meanwhile are placed on local nodes only)"
)]
pub struct NotSchedulable {
    pub provider: String,
    pub node: String,
    pub after: Duration,
    /// What it still waits for.
    pub waiting: String,
    /// The error reading the node, when that is what failed.
    #[source]
    pub source: Option<kube::Error>,
}

/// Waits until the virtual node of the established `peering` can take pods — it exists, is
/// Ready, its network is not unavailable (with the fabric on: the tunnel is up) and no taint
/// but Tandem's own keeps pods off it — telling `progress` what it waits for as that changes.
pub async fn wait_schedulable(
    client: &Client,
    peering: &Peering,
    timeout: Duration,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<(), NotSchedulable> {
    let provider = peering.name_any();
    let node = peering
        .status
        .as_ref()
        .and_then(|s| s.virtual_node.clone())
        .unwrap_or_else(|| names::virtual_node_name(&provider));
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + timeout;
    let mut said = String::new();
    loop {
        let waiting = match nodes.get_opt(&node).await {
            Ok(n) => match n.as_ref().map(why_unschedulable) {
                None => format!("the virtual node {node} does not exist yet"),
                Some(None) => return Ok(()),
                Some(Some(why)) => why,
            },
            Err(source) => {
                return Err(NotSchedulable {
                    provider,
                    node: node.clone(),
                    after: timeout,
                    waiting: format!("reading Node {node}"),
                    source: Some(source),
                });
            }
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(NotSchedulable {
                provider,
                node,
                after: timeout,
                waiting,
                source: None,
            });
        }
        if waiting != said {
            progress(&waiting);
            said = waiting;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What keeps pods off `node`; None when the scheduler may place pods of an offloaded
/// namespace there (they tolerate Tandem's own taint).
pub fn why_unschedulable(node: &k8s_openapi::api::core::v1::Node) -> Option<String> {
    let name = node.name_any();
    let conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let find = |t: &str| conditions.iter().find(|c| c.type_ == t);
    let said = |c: &k8s_openapi::api::core::v1::NodeCondition| {
        format!(
            "{}: {}",
            c.reason.as_deref().unwrap_or("-"),
            c.message.as_deref().unwrap_or("")
        )
    };
    match find("Ready") {
        Some(c) if c.status == "True" => {}
        Some(c) => {
            return Some(format!(
                "the virtual node {name} is not Ready ({})",
                said(c)
            ));
        }
        None => {
            return Some(format!(
                "the virtual node {name} has not reported Ready yet"
            ));
        }
    }
    if let Some(c) = find("NetworkUnavailable").filter(|c| c.status == "True") {
        return Some(format!(
            "waiting for the tunnel: the virtual node {name} is NetworkUnavailable ({})",
            said(c)
        ));
    }
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default();
    let blocking: Vec<String> = taints
        .iter()
        .filter(|t| t.key != names::VIRTUAL_NODE_TAINT && t.effect != "PreferNoSchedule")
        .map(|t| format!("{}:{}", t.key, t.effect))
        .collect();
    (!blocking.is_empty())
        .then(|| format!("the virtual node {name} is tainted {}", blocking.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(
        conditions: serde_json::Value,
        taints: serde_json::Value,
    ) -> k8s_openapi::api::core::v1::Node {
        serde_json::from_value(json!({"metadata": {"name": "tandem-milan"},
            "spec": {"taints": taints}, "status": {"conditions": conditions}}))
        .unwrap()
    }

    #[test]
    fn a_virtual_node_takes_pods_once_ready_with_its_tunnel_up_and_only_tandems_taint() {
        let ready = json!({"type": "Ready", "status": "True"});
        let own = json!([{"key": names::VIRTUAL_NODE_TAINT, "effect": "NoExecute"}]);
        assert_eq!(why_unschedulable(&node(json!([ready]), own.clone())), None);
        let down = json!({"type": "NetworkUnavailable", "status": "True",
                          "reason": "TunnelDown", "message": "no handshake yet"});
        let why = why_unschedulable(&node(json!([ready, down]), own.clone())).unwrap();
        assert!(
            why.contains("waiting for the tunnel") && why.contains("TunnelDown"),
            "{why}"
        );
        let not_ready = json!({"type": "Ready", "status": "False", "reason": "ProviderUnreachable",
                               "message": "x"});
        let why = why_unschedulable(&node(json!([not_ready]), own)).unwrap();
        assert!(why.contains("is not Ready (ProviderUnreachable"), "{why}");
        let tainted = json!([{"key": "node.kubernetes.io/network-unavailable",
                              "effect": "NoSchedule"}]);
        let why = why_unschedulable(&node(json!([ready]), tainted)).unwrap();
        assert!(
            why.contains("node.kubernetes.io/network-unavailable:NoSchedule"),
            "{why}"
        );
    }
}
