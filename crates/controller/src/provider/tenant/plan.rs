//! What the Tenant reconciler decides, pure, with the clock passed in: the next [`Step`] for a
//! Tenant; while it is served, the key its identity is bound to ([`Binding`]), its `Ready`
//! condition ([`grant_conditions`]) and when to come back ([`requeue_after`]); and at
//! unpeering, the peer's rights to revoke ([`Revocation`]), what becomes of each twin namespace
//! ([`TwinStep`], or why it is [`Spared`]) and what goes last ([`Closing`]).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use tandem_api::conditions::{self, ConditionStatus};
use tandem_api::{PeeringRequest, Tenant, names};

use crate::invite::InviteInfo;
use crate::provider::peering_request::PEER_ROLE_BINDING;

/// The reconciler's next step for a Tenant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// New: add the finalizer before anything else, so that unpeering always runs. The
    /// status follows from the next reconcile, which the write itself brings.
    AddFinalizer,
    /// Made before peer certificates carried their key's group: bind its identity to a key
    /// ([`key_binding`]); its next reconcile, brought by the write, serves it.
    BindToIssuedKey,
    /// Served: keep the peer identity bound and the `Ready` condition current, and come back
    /// when the grace of its user-name bindings ends.
    Serve,
    /// Deleted: undo the peering on this cluster, then remove the finalizer.
    Unpeer,
    /// Deleted and already undone: nothing left to do.
    Gone,
}

/// What to do next with `tenant`.
pub(super) fn next_step(tenant: &Tenant) -> Step {
    let has_finalizer = tenant.finalizers().iter().any(|f| f == names::FINALIZER);
    let key_bound = tenant
        .annotations()
        .contains_key(names::KEY_BOUND_ANNOTATION);
    match (tenant.metadata.deletion_timestamp.is_some(), has_finalizer) {
        (false, false) => Step::AddFinalizer,
        (false, true) if !key_bound => Step::BindToIssuedKey,
        (false, true) => Step::Serve,
        (true, true) => Step::Unpeer,
        (true, false) => Step::Gone,
    }
}

/// The key a Tenant made before keys is bound to, written as its annotations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Binding {
    /// No certificate was issued to it on record: it is marked bound, and its user-name
    /// bindings stay until the provider's admin records a key.
    NoCertificate,
    /// Bound to `key`: the one on record, else that of its newest issued certificate.
    Key {
        key: String,
        /// No key was on record: `key` is recorded.
        record: bool,
        /// That certificate carries no group of `key`: its user name stays bound until it
        /// expires (RFC 3339), long enough for the consumer to renew to one that does.
        user_bound_until: Option<String>,
    },
}

impl Binding {
    /// The annotations written on the Tenant.
    pub(super) fn annotations(&self) -> BTreeMap<String, String> {
        let mut annotations = BTreeMap::from([(names::KEY_BOUND_ANNOTATION.into(), "true".into())]);
        if let Binding::Key {
            key,
            record,
            user_bound_until,
        } = self
        {
            if *record {
                annotations.insert(names::KEY_FINGERPRINT_ANNOTATION.into(), key.clone());
            }
            if let Some(until) = user_bound_until {
                annotations.insert(names::USER_BOUND_UNTIL_ANNOTATION.into(), until.clone());
            }
        }
        annotations
    }
}

/// Binds `tenant`'s identity to a key: its key is taken from the newest certificate already
/// issued to it (the one handed back at its last renewal, and those of its peering `requests`,
/// listed from every namespace requests are filed in), never from a later request, which an
/// impostor could race.
pub(super) fn key_binding(tenant: &Tenant, requests: &[PeeringRequest]) -> Binding {
    let consumer = tenant.spec.cluster_id.as_str();
    let renewed = tenant
        .status
        .as_ref()
        .and_then(|s| s.renewed_identity.as_ref())
        .map(|r| r.certificate.as_str());
    let filed = requests
        .iter()
        .filter(|r| r.spec.cluster_id == consumer)
        .filter_map(|r| r.status.as_ref()?.certificate.as_deref());
    let Some(cert) = renewed
        .into_iter()
        .chain(filed)
        .filter_map(crate::enroll::certificate_key)
        .max_by_key(|c| c.not_after)
    else {
        return Binding::NoCertificate;
    };
    let recorded = tenant.annotations().get(names::KEY_FINGERPRINT_ANNOTATION);
    let key = recorded.unwrap_or(&cert.fingerprint).clone();
    let user_bound_until = (!cert.groups.contains(&names::peer_key_group(&key))).then(|| {
        Timestamp::from_second(cert.not_after)
            .map(|t| t.to_string())
            .unwrap_or_default()
    });
    Binding::Key {
        key,
        record: recorded.is_none(),
        user_bound_until,
    }
}

/// The Tenant's conditions once its `Ready` condition says, at `now`, whether its grant is
/// usable: an edit the API server let through (`cpu: abc`, `-5`) is named, and neither the
/// quota nor the consumer's virtual node takes it. None when they say so already.
pub(super) fn grant_conditions(tenant: &Tenant, now: &Time) -> Option<Vec<Condition>> {
    let mut conds = tenant
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    let (status, reason, message) = match crate::input::grant(&tenant.spec.grant) {
        Ok(()) => (
            ConditionStatus::True,
            "GrantValid",
            "the grant is in force".to_string(),
        ),
        Err(problem) => (
            ConditionStatus::False,
            "InvalidGrant",
            format!("{problem}; the last valid grant stays in force"),
        ),
    };
    let was = conditions::find(&conds, conditions::READY).map(|c| c.status.clone());
    let changed = conditions::set_condition(
        &mut conds,
        conditions::READY,
        status,
        reason,
        &message,
        tenant.metadata.generation,
    );
    // Its transition at `now`, not at the wall clock's time.
    if was.as_deref() != Some(status.as_str())
        && let Some(c) = conds.iter_mut().find(|c| c.type_ == conditions::READY)
    {
        c.last_transition_time = now.clone();
    }
    changed.then_some(conds)
}

/// When to reconcile a served Tenant again, from `now`: just after the grace of its user-name
/// bindings ends, when its roles lose the user name. None: only on its next change.
pub(super) fn requeue_after(tenant: &Tenant, now: Timestamp) -> Option<Duration> {
    tenant
        .annotations()
        .get(names::USER_BOUND_UNTIL_ANNOTATION)
        .and_then(|t| t.parse::<Timestamp>().ok())
        .map(|until| until.as_second() - now.as_second())
        .filter(|left| *left > 0)
        .map(|left| Duration::from_secs(left as u64 + 1))
}

/// A right of the consumer's certificate removed, first thing at unpeering: the namespaces'
/// deletion, which takes a while (or never comes, for a twin kept for its data), must not be
/// what ends its access. The certificate itself lives on until it expires.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Revocation {
    /// Its right to renew (so a former peer files no more requests): a ClusterRoleBinding.
    RenewalBinding { name: String },
    /// A RoleBinding of the peer in the tenant namespace or a twin namespace.
    RoleBinding { namespace: String, name: String },
}

/// What is revoked before the twin namespaces are listed: the consumer's right to renew and
/// its RoleBinding in the tenant namespace `tenant_ns`.
pub(super) fn revocations(consumer: &str, tenant_ns: &str) -> Vec<Revocation> {
    vec![
        Revocation::RenewalBinding {
            name: crate::rbac::peer_renewal_binding(consumer),
        },
        Revocation::RoleBinding {
            namespace: tenant_ns.into(),
            name: PEER_ROLE_BINDING.into(),
        },
    ]
}

/// What is revoked in one of the consumer's namespaces, `twin`: the peer's RoleBindings there
/// (none if it is the tenant namespace, handled by [`revocations`]).
pub(super) fn twin_revocations(twin: &str, tenant_ns: &str) -> Vec<Revocation> {
    if twin == tenant_ns {
        return Vec::new();
    }
    crate::provider::remote_namespace::peer_bindings()
        .map(|name| Revocation::RoleBinding {
            namespace: twin.into(),
            name: name.into(),
        })
        .collect()
}

/// What unpeering does with a twin namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum TwinStep {
    /// The unpeering asked for the data to go (`tandem.dev/delete-data`): delete it.
    Delete,
    /// Claims are data: keep it (its pods stopped, the consumer's key `key` on record) if it
    /// holds any, else delete it.
    DeleteUnlessHoldingData { key: Option<String> },
}

/// Why unpeering leaves a namespace labelled with the consumer alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Spared {
    /// It is the tenant namespace: it goes last, if at all ([`Closing`]).
    TenantNamespace,
    /// It is being deleted already.
    Deleting,
}

/// What unpeering `tenant` (whose namespace is `tenant_ns`) does with `twin`.
pub(super) fn twin(tenant: &Tenant, twin: &Namespace, tenant_ns: &str) -> Result<TwinStep, Spared> {
    if twin.name_any() == tenant_ns {
        return Err(Spared::TenantNamespace);
    }
    if twin.metadata.deletion_timestamp.is_some() {
        return Err(Spared::Deleting);
    }
    if tenant
        .annotations()
        .contains_key(names::DELETE_DATA_ANNOTATION)
    {
        return Ok(TwinStep::Delete);
    }
    Ok(TwinStep::DeleteUnlessHoldingData {
        key: tenant
            .annotations()
            .get(names::KEY_FINGERPRINT_ANNOTATION)
            .cloned(),
    })
}

/// The invites `consumer` used, whose objects unpeering removes: their token ids.
pub(super) fn used_invites<'a>(invites: &'a [InviteInfo], consumer: &str) -> Vec<&'a str> {
    invites
        .iter()
        .filter(|i| i.used_by.as_deref() == Some(consumer))
        .map(|i| i.token_id.as_str())
        .collect()
}

/// What unpeering removes last, once the finalizer is gone, in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Closing {
    /// The peer's RoleBinding in the tenant namespace.
    PeerRoleBinding,
    /// A NetworkParameters of the network negotiation.
    NetworkParameters(&'static str),
    /// A fence Lease.
    FenceLease(&'static str),
    /// This controller's own rights in the tenant namespace, which removing the Leases needed.
    ControllerRoleBinding,
    /// The tenant namespace, with all that is left in it.
    TenantNamespace,
}

impl Closing {
    /// The step an error names.
    pub(super) fn step(self) -> &'static str {
        match self {
            Closing::PeerRoleBinding => "deleting the peer's RoleBinding",
            Closing::NetworkParameters(_) => "deleting the NetworkParameters",
            Closing::FenceLease(_) => "deleting the fence Leases",
            Closing::ControllerRoleBinding => "deleting the controller's RoleBinding",
            Closing::TenantNamespace => "deleting the tenant namespace",
        }
    }
}

/// What goes last. Peered both ways (this cluster `consumes_from_peer`), the tenant namespace
/// also holds this cluster's identity for consuming from the peer: only what the peer's Tenant
/// was given goes (its RoleBinding and the network negotiation, then the fence Leases and the
/// controller's rights they needed), the namespace and our Secrets stay. A Peering being undone
/// still needs its identity to reach the peer; its unpeering deletes the namespace last.
pub(super) fn closing(consumes_from_peer: bool) -> Vec<Closing> {
    if !consumes_from_peer {
        return vec![Closing::TenantNamespace];
    }
    vec![
        Closing::PeerRoleBinding,
        Closing::NetworkParameters(crate::rbac::CONSUMER_NETWORK_PARAMETERS),
        Closing::NetworkParameters(crate::rbac::PROVIDER_NETWORK_PARAMETERS),
        Closing::FenceLease(names::FENCE_LEASE),
        Closing::FenceLease(names::FENCE_NONCE_LEASE),
        Closing::ControllerRoleBinding,
    ]
}

#[cfg(test)]
mod tests;
