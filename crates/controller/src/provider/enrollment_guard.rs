//! Provider side: keeps the enrollment credential (`tandem advertise`) confined while it is
//! published. A bootstrap token is in `system:bootstrappers` and `system:authenticated`, so a
//! binding an administrator adds to either at any time hands the public token its rights:
//! checked once at `tandem advertise` is not enough. Every few seconds the bindings are judged
//! (`tandem_core::enrollment`); while any reaches beyond filing requests the token is switched
//! off (`usage-bootstrap-authentication: "false"`, so the published credential, wherever it
//! was copied, stops authenticating), the token Secret's condition and a Warning Event name
//! the binding, and the token is switched back on once the binding is gone.

use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::context::Ctx;
use crate::enroll;
use crate::invite::InviteError;

/// The Secret key switching a bootstrap token on and off for authentication.
const USAGE_KEY: &str = "usage-bootstrap-authentication";

/// Judges the credential's reach every 2 s while there is one.
pub async fn run(ctx: Ctx) {
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = pass(&ctx).await {
            tracing::warn!("enrollment credential: {}", crate::error::chain(&e));
        }
    }
}

async fn pass(ctx: &Ctx) -> Result<(), InviteError> {
    let Some(secret) = enroll::token_secret(&ctx.client).await? else {
        return Ok(());
    };
    let data = secret.data.clone().unwrap_or_default();
    let get = |k: &str| {
        data.get(k)
            .map(|v| String::from_utf8_lossy(&v.0).into_owned())
    };
    let token_id = get("token-id");
    let reach = enroll::credential_reach(&ctx.client, token_id.as_deref()).await?;
    let verdict = tandem_core::enrollment::verdict(&reach);
    let mut conditions: Vec<_> = enroll::condition_of(&secret).into_iter().collect();
    let changed = tandem_api::conditions::set_condition(
        &mut conditions,
        enroll::CONFINED,
        if verdict.enabled {
            tandem_api::conditions::ConditionStatus::True
        } else {
            tandem_api::conditions::ConditionStatus::False
        },
        verdict.reason,
        &verdict.message,
        None,
    );
    let usage = if verdict.enabled { "true" } else { "false" };
    if !changed && get(USAGE_KEY).as_deref() == Some(usage) {
        return Ok(());
    }
    let name = secret.name_any();
    let condition = serde_json::to_string(&conditions[0]).expect("a condition serializes");
    Api::<Secret>::namespaced(ctx.client.clone(), "kube-system")
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"annotations": {enroll::CONDITION_ANNOTATION: condition}},
                "data": {USAGE_KEY: base64::engine::general_purpose::STANDARD.encode(usage)},
            })),
        )
        .await
        .map_err(crate::invite::api(format!(
            "switching the enrollment credential (Secret kube-system/{name}) {}",
            if verdict.enabled { "on" } else { "off" }
        )))?;
    if verdict.enabled {
        tracing::info!("enrollment credential confined again: resumed");
    } else {
        tracing::warn!("{}", verdict.message);
    }
    crate::events::record(
        &ctx.client,
        "kube-system",
        json!({"apiVersion": "v1", "kind": "Secret", "namespace": "kube-system",
               "name": name, "uid": secret.uid()}),
        if verdict.enabled {
            "EnrollmentResumed"
        } else {
            "EnrollmentWithdrawn"
        },
        &verdict.message,
        !verdict.enabled,
    )
    .await;
    Ok(())
}
