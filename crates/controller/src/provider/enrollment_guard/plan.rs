//! What the enrollment guard decides each pass, pure, with the clock passed in: from the
//! token Secret and what the credential reaches, whether to switch the token off
//! ([`Step::Withdraw`]) or back on ([`Step::Resume`]), with the condition and Event that say
//! so, or why it leaves the Secret alone ([`Skip`]).

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;
use tandem_api::conditions::{self, ConditionStatus};

use crate::enroll;

/// The Secret key switching a bootstrap token on and off for authentication.
pub(super) const USAGE_KEY: &str = "usage-bootstrap-authentication";

/// A value of the token Secret's `data`, as text.
fn data_of(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()?
        .get(key)
        .map(|v| String::from_utf8_lossy(&v.0).into_owned())
}

/// The id of the bootstrap token the Secret holds.
pub(super) fn token_id(secret: &Secret) -> Option<String> {
    data_of(secret, "token-id")
}

/// A switch of the enrollment credential, written to its token Secret (its usage key and its
/// condition annotation) and told in an Event.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Step {
    /// A binding reaches beyond filing requests: switch the token off, so the published
    /// credential, wherever it was copied, stops authenticating; a Warning Event names it.
    Withdraw(Switch),
    /// Nothing reaches beyond filing requests (any more): switch the token (back) on.
    Resume(Switch),
}

/// What a [`Step`] writes.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Switch {
    /// The token Secret's name (in kube-system).
    pub secret: String,
    /// Its uid, for the Event.
    pub uid: Option<String>,
    /// The [`enroll::CONFINED`] condition, for the Secret's annotation.
    pub condition: Condition,
    /// The verdict's message: the condition's, the Event's and the log line's.
    pub message: String,
}

/// Why the guard leaves the Secret alone this pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Skip {
    /// The condition says so already and the token is already switched so.
    Unchanged,
}

impl Step {
    /// What was decided, whichever way.
    pub(super) fn switch(&self) -> &Switch {
        match self {
            Step::Withdraw(s) | Step::Resume(s) => s,
        }
    }

    /// Whether the token may authenticate after this step.
    pub(super) fn enabled(&self) -> bool {
        matches!(self, Step::Resume(_))
    }

    /// The Secret's usage value after this step.
    pub(super) fn usage(&self) -> &'static str {
        if self.enabled() { "true" } else { "false" }
    }

    /// How the error of a failed write names the switch.
    pub(super) fn direction(&self) -> &'static str {
        if self.enabled() { "on" } else { "off" }
    }

    /// The Event's reason.
    pub(super) fn event_reason(&self) -> &'static str {
        if self.enabled() {
            "EnrollmentResumed"
        } else {
            "EnrollmentWithdrawn"
        }
    }
}

/// Judges the credential held by `secret`, which reaches `reach` beyond filing requests (one
/// binding a line), at `now`.
pub(super) fn next_step(secret: &Secret, reach: &[String], now: &Time) -> Result<Step, Skip> {
    let verdict = tandem_core::enrollment::verdict(reach);
    let mut conds: Vec<_> = enroll::condition_of(secret).into_iter().collect();
    let status = if verdict.enabled {
        ConditionStatus::True
    } else {
        ConditionStatus::False
    };
    let changed = set_at(
        &mut conds,
        enroll::CONFINED,
        status,
        verdict.reason,
        &verdict.message,
        now,
    );
    let usage = if verdict.enabled { "true" } else { "false" };
    if !changed && data_of(secret, USAGE_KEY).as_deref() == Some(usage) {
        return Err(Skip::Unchanged);
    }
    let switch = Switch {
        secret: secret.name_any(),
        uid: secret.uid(),
        // The annotation holds the first condition, as it always has.
        condition: conds.swap_remove(0),
        message: verdict.message,
    };
    Ok(if verdict.enabled {
        Step::Resume(switch)
    } else {
        Step::Withdraw(switch)
    })
}

/// Sets a condition as [`conditions::set_condition`] does (no generation), its transition
/// (when its status changes or it is new) at `now` rather than at the wall clock's time.
fn set_at(
    conds: &mut Vec<Condition>,
    type_: &str,
    status: ConditionStatus,
    reason: &str,
    message: &str,
    now: &Time,
) -> bool {
    let was = conditions::find(conds, type_).map(|c| c.status.clone());
    let changed = conditions::set_condition(conds, type_, status, reason, message, None);
    if was.as_deref() != Some(status.as_str())
        && let Some(c) = conds.iter_mut().find(|c| c.type_ == type_)
    {
        c.last_transition_time = now.clone();
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use std::collections::BTreeMap;

    const CONFINED_MESSAGE: &str =
        "the enrollment credential can do nothing but file peering requests";
    const REACH: &str = "ClusterRoleBinding open binds system:authenticated to cluster-admin";
    const OTHER: &str = "RoleBinding x/y binds system:bootstrappers to edit";

    fn at(second: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(second).unwrap())
    }

    /// The withdrawal message naming `reach`.
    fn withdrawn(reach: &str) -> String {
        format!(
            "enrollment withdrawn (the published credential no longer authenticates) because a \
             bootstrap token would get more than filing peering requests: {reach}; it resumes by \
             itself once that is gone"
        )
    }

    /// A token Secret, as `tandem advertise` leaves it, then as the guard wrote it.
    struct TokenSecret(Secret);

    impl TokenSecret {
        fn new() -> Self {
            let mut s = Secret::default();
            s.metadata.name = Some("bootstrap-token-abcdef".into());
            s.metadata.uid = Some("uid-1".into());
            s.data = Some(BTreeMap::from([(
                "token-id".to_string(),
                ByteString(b"abcdef".to_vec()),
            )]));
            TokenSecret(s)
        }

        fn usage(mut self, usage: &str) -> Self {
            self.0
                .data
                .get_or_insert_default()
                .insert(USAGE_KEY.into(), ByteString(usage.as_bytes().to_vec()));
            self
        }

        /// The guard's condition, written at second 1.
        fn judged(mut self, confined: bool, message: &str) -> Self {
            let condition = Condition {
                type_: enroll::CONFINED.into(),
                status: if confined { "True" } else { "False" }.into(),
                reason: if confined {
                    "FilesRequestsOnly"
                } else {
                    "ReachesBeyondFiling"
                }
                .into(),
                message: message.into(),
                observed_generation: None,
                last_transition_time: at(1),
            };
            self.0.annotations_mut().insert(
                enroll::CONDITION_ANNOTATION.into(),
                serde_json::to_string(&condition).unwrap(),
            );
            self
        }
    }

    /// What the Secret's condition reads after a step: (status, reason, message, transition).
    fn condition(step: &Step) -> (&str, &str, &str, i64) {
        let c = &step.switch().condition;
        (
            &c.status,
            &c.reason,
            &c.message,
            c.last_transition_time.0.as_second(),
        )
    }

    #[test]
    fn token_id_is_read_from_the_secret() {
        assert_eq!(token_id(&TokenSecret::new().0).as_deref(), Some("abcdef"));
        assert_eq!(token_id(&Secret::default()), None);
    }

    #[test]
    fn switch_table() {
        let withdrawn_msg = withdrawn(REACH);
        let withdrawn_both = withdrawn(&format!("{REACH}; {OTHER}"));
        // (case, token Secret, reach, wanted: Ok((usage, event reason, condition)) or the skip)
        type Want<'a> = Result<(&'a str, &'a str, (&'a str, &'a str, &'a str, i64)), Skip>;
        let cases: Vec<(&str, TokenSecret, Vec<&str>, Want)> = vec![
            (
                "Resume: first judgement of a confined credential",
                TokenSecret::new().usage("true"),
                vec![],
                Ok((
                    "true",
                    "EnrollmentResumed",
                    ("True", "FilesRequestsOnly", CONFINED_MESSAGE, 50),
                )),
            ),
            (
                "Resume: the binding is gone",
                TokenSecret::new()
                    .usage("false")
                    .judged(false, &withdrawn_msg),
                vec![],
                Ok((
                    "true",
                    "EnrollmentResumed",
                    ("True", "FilesRequestsOnly", CONFINED_MESSAGE, 50),
                )),
            ),
            (
                "Resume: an admin switched the confined token off by hand",
                TokenSecret::new()
                    .usage("false")
                    .judged(true, CONFINED_MESSAGE),
                vec![],
                Ok((
                    "true",
                    "EnrollmentResumed",
                    ("True", "FilesRequestsOnly", CONFINED_MESSAGE, 1),
                )),
            ),
            (
                "Withdraw: a binding reaches beyond filing",
                TokenSecret::new()
                    .usage("true")
                    .judged(true, CONFINED_MESSAGE),
                vec![REACH],
                Ok((
                    "false",
                    "EnrollmentWithdrawn",
                    ("False", "ReachesBeyondFiling", &withdrawn_msg, 50),
                )),
            ),
            (
                "Withdraw: the token was never switched, and is not confined",
                TokenSecret::new(),
                vec![REACH],
                Ok((
                    "false",
                    "EnrollmentWithdrawn",
                    ("False", "ReachesBeyondFiling", &withdrawn_msg, 50),
                )),
            ),
            (
                "Withdraw: a second binding is named too (no new transition)",
                TokenSecret::new()
                    .usage("false")
                    .judged(false, &withdrawn_msg),
                vec![REACH, OTHER],
                Ok((
                    "false",
                    "EnrollmentWithdrawn",
                    ("False", "ReachesBeyondFiling", &withdrawn_both, 1),
                )),
            ),
            (
                "Withdraw: an admin switched the withdrawn token back on by hand",
                TokenSecret::new()
                    .usage("true")
                    .judged(false, &withdrawn_msg),
                vec![REACH],
                Ok((
                    "false",
                    "EnrollmentWithdrawn",
                    ("False", "ReachesBeyondFiling", &withdrawn_msg, 1),
                )),
            ),
            (
                "Unchanged: confined and on",
                TokenSecret::new()
                    .usage("true")
                    .judged(true, CONFINED_MESSAGE),
                vec![],
                Err(Skip::Unchanged),
            ),
            (
                "Unchanged: withdrawn and off",
                TokenSecret::new()
                    .usage("false")
                    .judged(false, &withdrawn_msg),
                vec![REACH],
                Err(Skip::Unchanged),
            ),
        ];
        for (case, secret, reach, want) in cases {
            let reach: Vec<String> = reach.into_iter().map(String::from).collect();
            let got = next_step(&secret.0, &reach, &at(50));
            match want {
                Err(skip) => assert_eq!(got, Err(skip), "{case}"),
                Ok((usage, event, cond)) => {
                    let step = got.unwrap_or_else(|e| panic!("{case}: {e:?}"));
                    assert_eq!(step.usage(), usage, "{case}");
                    assert_eq!(step.event_reason(), event, "{case}");
                    assert_eq!(condition(&step), cond, "{case}");
                    let switch = step.switch();
                    assert_eq!(switch.message, cond.2, "{case}: the Event says it");
                    assert_eq!(switch.secret, "bootstrap-token-abcdef", "{case}");
                    assert_eq!(switch.uid.as_deref(), Some("uid-1"), "{case}");
                    assert_eq!(switch.condition.type_, enroll::CONFINED, "{case}");
                    let (variant, direction) = if usage == "true" {
                        ("Resume", "on")
                    } else {
                        ("Withdraw", "off")
                    };
                    assert!(case.starts_with(variant), "{case}: {step:?}");
                    assert_eq!(step.direction(), direction, "{case}");
                }
            }
        }
    }
}
