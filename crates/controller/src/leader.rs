//! Leader election among controller replicas: only the holder of the Lease
//! `tandem-system/tandem-controller` runs the reconcilers (and so writes); the others wait,
//! serving only `/metrics` and `/healthz`.
//!
//! The algorithm is client-go's (`k8s.io/client-go/tools/leaderelection`), written here
//! because kube-rs has none and the crates that add one pull a second kube version: a
//! candidate takes the Lease when it is free or when its record has not changed for
//! `leaseDurationSeconds` as measured by the candidate's own clock (never by comparing
//! timestamps written by another host); every write carries the resourceVersion read, so two
//! candidates cannot both take it. The leader renews every `retry_period` and gives up — stops
//! every reconciler — when it could not renew for `renew_deadline`, which is shorter than the
//! lease, so it has stopped before anyone else may take over.
//!
//! Leader election is not fencing: a leader cut off from its API server stops writing there
//! by itself, but its writes to providers are idempotent rather than excluded (see
//! docs/fencing.md for what protects offloaded pods).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tandem_api::{client, names};
use tokio::time::Instant;

/// Timings of the election (client-go's defaults: 15 s, 10 s, 2 s).
#[derive(Clone, Debug)]
pub struct LeaderElection {
    /// This replica's name in the Lease (its pod's name, plus a random suffix).
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl LeaderElection {
    /// Client-go's timings, with `identity` made unique by a random suffix.
    pub fn new(identity: &str) -> Self {
        use rand::Rng;
        let suffix: u32 = rand::rng().random_range(0..0x100_0000);
        LeaderElection {
            identity: format!("{identity}_{suffix:06x}"),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// The Lease's name (in tandem-system).
pub const LEASE_NAME: &str = names::CONTROLLER_NAME;

/// What the holder says of itself on the Lease: its version and peering protocol.
fn holder_annotations() -> std::collections::BTreeMap<String, String> {
    [
        (
            names::CONTROLLER_VERSION_ANNOTATION.to_string(),
            env!("CARGO_PKG_VERSION").to_string(),
        ),
        (
            names::PEERING_PROTOCOL_ANNOTATION.to_string(),
            tandem_core::protocol::VERSION.to_string(),
        ),
    ]
    .into()
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// A candidate for (or the holder of) the Lease.
pub struct Elector {
    api: Api<Lease>,
    config: LeaderElection,
    /// The Lease as last read or written, and when this replica saw it change.
    observed: Option<(Lease, Instant)>,
}

impl Elector {
    pub fn new(client: Client, config: LeaderElection) -> Self {
        Elector {
            api: Api::namespaced(client, names::SYSTEM_NAMESPACE),
            config,
            observed: None,
        }
    }

    /// Waits until this replica holds the Lease.
    pub async fn acquire(&mut self) {
        let mut logged = false;
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => {
                    tracing::info!(identity = %self.config.identity, "leader Lease {}/{LEASE_NAME} acquired", names::SYSTEM_NAMESPACE);
                    return;
                }
                Ok(false) if !logged => {
                    logged = true;
                    tracing::info!(
                        identity = %self.config.identity,
                        leader = %self.holder().unwrap_or_default(),
                        "waiting for the leader Lease {}/{LEASE_NAME}",
                        names::SYSTEM_NAMESPACE
                    );
                }
                Ok(false) => {}
                Err(e) => tracing::debug!("leader Lease: {e}"),
            }
            tokio::time::sleep(self.config.retry_period).await;
        }
    }

    /// Renews the Lease until a renewal has failed for `renew_deadline` (or another replica
    /// holds it); then returns: this replica must stop writing.
    ///
    /// As in client-go, one attempt may take until the deadline: on a loaded API server a
    /// renewal slower than `retry_period` still keeps the Lease, which a per-attempt limit of
    /// `retry_period` would give up after a few slow answers.
    pub async fn keep(&mut self) {
        let mut renewed = Instant::now();
        loop {
            tokio::time::sleep(self.config.retry_period).await;
            let left = self.config.renew_deadline.saturating_sub(renewed.elapsed());
            match tokio::time::timeout(left, self.try_acquire_or_renew()).await {
                Ok(Ok(true)) => renewed = Instant::now(),
                Ok(Ok(false)) => {
                    tracing::error!(leader = %self.holder().unwrap_or_default(), "leader Lease taken by another replica; stopping");
                    return;
                }
                Ok(Err(e)) => tracing::warn!("renewing the leader Lease: {e}"),
                Err(_) => tracing::warn!("renewing the leader Lease: no answer"),
            }
            if renewed.elapsed() >= self.config.renew_deadline {
                tracing::error!(
                    "leader Lease not renewed for {:?}; stopping",
                    self.config.renew_deadline
                );
                return;
            }
        }
    }

    /// Gives the Lease up (on a graceful stop), so that another replica takes over at once.
    pub async fn release(&mut self) {
        if self.holder().as_deref() != Some(self.config.identity.as_str()) {
            return;
        }
        let Some((lease, _)) = &self.observed else {
            return;
        };
        let patch = json!({"metadata": {"resourceVersion": lease.resource_version()},
            "spec": {"holderIdentity": null, "leaseDurationSeconds": 1, "renewTime": now()}});
        match self
            .api
            .patch(LEASE_NAME, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => tracing::info!("leader Lease released"),
            Err(e) => tracing::warn!("releasing the leader Lease: {e}"),
        }
    }

    fn holder(&self) -> Option<String> {
        self.observed
            .as_ref()
            .and_then(|(l, _)| l.spec.as_ref()?.holder_identity.clone())
    }

    /// One round of client-go's `tryAcquireOrRenew`: whether this replica holds the Lease now.
    async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let me = self.config.identity.clone();
        let duration = self.config.lease_duration.as_secs().max(1) as i32;
        let Some(current) = self.api.get_opt(LEASE_NAME).await? else {
            let lease: Lease = serde_json::from_value(json!({
                "metadata": {"name": LEASE_NAME, "namespace": names::SYSTEM_NAMESPACE,
                             "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY},
                             "annotations": holder_annotations()},
                "spec": {"holderIdentity": me, "leaseDurationSeconds": duration,
                         "acquireTime": now(), "renewTime": now(), "leaseTransitions": 0},
            }))
            .expect("static Lease");
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.observed = Some((created, Instant::now()));
                    Ok(true)
                }
                Err(e) if client::is_conflict(&e) => Ok(false),
                Err(e) => Err(e),
            };
        };
        // When this replica first saw the record as it is now.
        let seen = match &self.observed {
            Some((old, at)) if old.resource_version() == current.resource_version() => *at,
            _ => Instant::now(),
        };
        let spec = current.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let lease_for =
            Duration::from_secs(spec.lease_duration_seconds.unwrap_or(duration).max(0) as u64);
        let mine = holder.as_deref() == Some(me.as_str());
        if !mine && holder.is_some() && seen.elapsed() < lease_for {
            self.observed = Some((current, seen));
            return Ok(false);
        }
        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!mine);
        let acquire_time = if mine {
            spec.acquire_time.clone()
        } else {
            Some(now())
        };
        let mut lease = current.clone();
        lease
            .metadata
            .annotations
            .get_or_insert_default()
            .extend(holder_annotations());
        lease.spec = Some(k8s_openapi::api::coordination::v1::LeaseSpec {
            holder_identity: Some(me),
            lease_duration_seconds: Some(duration),
            acquire_time,
            renew_time: Some(now()),
            lease_transitions: Some(transitions),
            ..Default::default()
        });
        // replace carries the resourceVersion read: of two candidates, one wins.
        match self
            .api
            .replace(LEASE_NAME, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => {
                self.observed = Some((written, Instant::now()));
                Ok(true)
            }
            Err(e) if client::is_conflict(&e) => {
                self.observed = Some((current, seen));
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}
