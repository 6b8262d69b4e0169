//! Provider side: keeps the enrollment credential (`tandem advertise`) confined while it is
//! published. A bootstrap token is in `system:bootstrappers` and `system:authenticated`, so a
//! binding an administrator adds to either at any time hands the public token its rights:
//! checked once at `tandem advertise` is not enough. Every few seconds the bindings are judged
//! (`tandem_core::enrollment`); while any reaches beyond filing requests the token is switched
//! off (`usage-bootstrap-authentication: "false"`, so the published credential, wherever it
//! was copied, stops authenticating), the token Secret's condition and a Warning Event name
//! the binding, and the token is switched back on once the binding is gone.

mod plan;

use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::context::Ctx;
use crate::enroll;
use crate::invite::InviteError;
use plan::{Step, USAGE_KEY};

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

/// Observes the token Secret and what the credential reaches, then writes the switch the plan
/// decides: the Secret (its usage and condition), the log line, then the Event.
async fn pass(ctx: &Ctx) -> Result<(), InviteError> {
    let Some(secret) = enroll::token_secret(&ctx.client).await? else {
        return Ok(());
    };
    let token_id = plan::token_id(&secret);
    let reach = enroll::credential_reach(&ctx.client, token_id.as_deref()).await?;
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let Ok(step) = plan::next_step(&secret, &reach, &now) else {
        return Ok(());
    };
    let switch = step.switch();
    let name = &switch.secret;
    let condition = serde_json::to_string(&switch.condition).expect("a condition serializes");
    Api::<Secret>::namespaced(ctx.client.clone(), "kube-system")
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"annotations": {enroll::CONDITION_ANNOTATION: condition}},
                "data": {USAGE_KEY: base64::engine::general_purpose::STANDARD.encode(step.usage())},
            })),
        )
        .await
        .map_err(crate::invite::api(format!(
            "switching the enrollment credential (Secret kube-system/{name}) {}",
            step.direction()
        )))?;
    match &step {
        Step::Resume(_) => tracing::info!("enrollment credential confined again: resumed"),
        Step::Withdraw(s) => tracing::warn!("{}", s.message),
    }
    crate::events::record(
        &ctx.client,
        "kube-system",
        json!({"apiVersion": "v1", "kind": "Secret", "namespace": "kube-system",
               "name": name, "uid": switch.uid}),
        step.event_reason(),
        &switch.message,
        !step.enabled(),
    )
    .await;
    Ok(())
}
