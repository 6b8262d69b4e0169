//! What a consumer's pod is charged against its grant, pure: the provider's defaults for
//! containers that request nothing, the bound on limits (a most limit-to-request ratio, as a
//! LimitRange's `maxLimitRequestRatio`) and the pod's effective requests as kube's quota
//! computes them (the containers' sum, at least the largest init container, sidecars counted
//! with the containers, plus the pod's overhead).
//!
//! The defaults and the bounded limits are written onto the real pod, so that what the grant
//! is charged is what the provider's scheduler reserves and what the real pod's own requests
//! say when it is read back (after a restart, say).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use crate::pod_admission::Refusal;
use crate::shadow::{Resources, parse_quantity};

/// Rule refusing a container without a request where the provider charges none.
pub const RULE_REQUESTS: &str = "pod-requests";
/// Rule refusing a limit above the provider's ratio to its request.
pub const RULE_RATIO: &str = "limit-request-ratio";

/// What a container that requests nothing of cpu or memory is charged, when the provider's
/// admin does not say: a tenth of a core and 128 MiB, the usual LimitRange defaults.
pub const DEFAULT_REQUESTS: [(&str, &str); 2] = [("cpu", "100m"), ("memory", "128Mi")];

/// The most a limit may be of its request, when the provider's admin does not say: a pod may
/// burst to ten times the cpu it is charged for, and four times the memory.
pub const DEFAULT_MAX_LIMIT_REQUEST_RATIO: [(&str, &str); 2] = [("cpu", "10"), ("memory", "4")];

/// What becomes of a container without a request for a resource the provider charges.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WithoutRequests {
    /// Charged the provider's default request (written on the real pod).
    #[default]
    Charge,
    /// Refused, naming the container and the resource.
    Refuse,
}

/// A quantity as the admin wrote it and as parsed (thousandths of a unit), so that a pod's
/// defaults are copied, never parsed again per pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Amount {
    pub written: String,
    pub milli: i128,
}

impl Amount {
    /// `s` parsed; None when it is not a non-negative quantity.
    pub fn parse(s: &str) -> Option<Amount> {
        Some(Amount {
            written: s.to_string(),
            milli: parse_quantity(s)?,
        })
    }
}

/// How a provider charges a consumer's pods (parsed once, when the Tenant is read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChargePolicy {
    /// Resource → what a container requesting none (or zero) of it is charged.
    pub default_requests: BTreeMap<String, Amount>,
    pub without_requests: WithoutRequests,
    /// Resource → the most its limit may be of its request, in thousandths (4000: four times;
    /// at least 1000).
    /// A container without a limit for one of these gets request × ratio as its limit.
    pub max_limit_request_ratio: BTreeMap<String, i128>,
}

fn parsed(entries: &[(&str, &str)]) -> BTreeMap<String, Amount> {
    entries
        .iter()
        .filter_map(|(k, v)| Some((k.to_string(), Amount::parse(v)?)))
        .collect()
}

impl Default for ChargePolicy {
    fn default() -> Self {
        ChargePolicy {
            default_requests: parsed(&DEFAULT_REQUESTS),
            without_requests: WithoutRequests::Charge,
            max_limit_request_ratio: parsed(&DEFAULT_MAX_LIMIT_REQUEST_RATIO)
                .into_iter()
                .map(|(k, a)| (k, a.milli))
                .collect(),
        }
    }
}

impl ChargePolicy {
    /// The policy of a Tenant's settings; an absent setting keeps its default, an empty map
    /// means none. Entries that are not non-negative quantities are skipped (the CRD's schema
    /// refuses them).
    pub fn from_settings<'a>(
        default_requests: Option<impl IntoIterator<Item = (&'a String, &'a String)>>,
        without_requests: WithoutRequests,
        max_limit_request_ratio: Option<impl IntoIterator<Item = (&'a String, &'a String)>>,
    ) -> ChargePolicy {
        let base = ChargePolicy::default();
        ChargePolicy {
            default_requests: match default_requests {
                Some(m) => m
                    .into_iter()
                    .filter_map(|(k, v)| Some((k.clone(), Amount::parse(v)?)))
                    .collect(),
                None => base.default_requests,
            },
            without_requests,
            max_limit_request_ratio: match max_limit_request_ratio {
                Some(m) => m
                    .into_iter()
                    // Below 1, a defaulted limit would be under its request.
                    .filter_map(|(k, v)| Some((k.clone(), parse_quantity(v)?.max(1000))))
                    .collect(),
                None => base.max_limit_request_ratio,
            },
        }
    }
}

/// Thousandths of a unit as a quantity string: whole units (in Gi or Mi when exact) or
/// thousandths.
fn quantity(milli: i128) -> String {
    const MI: i128 = 1 << 20;
    const GI: i128 = 1 << 30;
    match (milli % 1000, milli / 1000) {
        (0, n) if n != 0 && n % GI == 0 => format!("{}Gi", n / GI),
        (0, n) if n != 0 && n % MI == 0 => format!("{}Mi", n / MI),
        (0, n) => n.to_string(),
        _ => format!("{milli}m"),
    }
}

/// A resource list (`requests`, `limits`, `overhead`), parsed; a malformed entry is absent.
fn amounts(list: &Value) -> Resources {
    list.as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), parse_quantity(v.as_str()?)?)))
        .collect()
}

/// Fills in and bounds one container's requests and limits; returns its requests, and adds
/// the resources it was charged the default for to `defaulted`.
fn charge_container(
    c: &mut Value,
    policy: &ChargePolicy,
    kind: &str,
    defaulted: &mut BTreeSet<String>,
) -> Result<Resources, Refusal> {
    let name = c["name"].as_str().unwrap_or_default().to_string();
    let mut requests = amounts(&c["resources"]["requests"]);
    let limits = amounts(&c["resources"]["limits"]);
    // What kube-apiserver would default anyway: a limit without a request is its request.
    // A request of zero is none: it would otherwise dodge the charge.
    let mut written_requests: Vec<(String, String)> = Vec::new();
    for (k, l) in &limits {
        if requests.get(k).is_none_or(|r| *r == 0) && *l > 0 {
            requests.insert(k.clone(), *l);
            written_requests.push((k.clone(), quantity(*l)));
        }
    }
    for (k, d) in &policy.default_requests {
        if requests.get(k).is_some_and(|r| *r > 0) {
            continue;
        }
        if policy.without_requests == WithoutRequests::Refuse {
            return Err(Refusal {
                rule: RULE_REQUESTS,
                detail: format!(
                    "{kind} {name:?} requests no {k}, and this provider charges every container for {k}: set resources.requests.{k}"
                ),
                pod_security: None,
            });
        }
        requests.insert(k.clone(), d.milli);
        written_requests.push((k.clone(), d.written.clone()));
        defaulted.insert(k.clone());
    }
    let mut written_limits: Vec<(String, String)> = Vec::new();
    for (k, ratio) in &policy.max_limit_request_ratio {
        let request = requests.get(k).copied().unwrap_or(0);
        match limits.get(k) {
            // limit / request > ratio / 1000, without division.
            Some(&limit) if limit > 0 && limit * 1000 > request * ratio => {
                return Err(Refusal {
                    rule: RULE_RATIO,
                    detail: format!(
                        "{kind} {name:?} has a {k} limit of {} for a request of {}: a limit may be at most {} times its request",
                        quantity(limit),
                        quantity(request),
                        quantity(*ratio)
                    ),
                    pod_security: None,
                });
            }
            Some(&limit) if limit > 0 => {}
            // No limit: what the container can use is bounded all the same.
            _ if request > 0 => {
                written_limits.push((k.clone(), quantity(request * ratio / 1000)));
            }
            _ => {}
        }
    }
    if !written_requests.is_empty() || !written_limits.is_empty() {
        if !c["resources"].is_object() {
            c["resources"] = Value::Object(Map::new());
        }
        for (list, entries) in [("requests", written_requests), ("limits", written_limits)] {
            if entries.is_empty() {
                continue;
            }
            if !c["resources"][list].is_object() {
                c["resources"][list] = Value::Object(Map::new());
            }
            for (k, v) in entries {
                c["resources"][list][k] = Value::String(v);
            }
        }
    }
    Ok(requests)
}

/// A pod's charge against its grant.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Charge {
    /// Its effective requests (see [`effective_requests`]).
    pub requests: Resources,
    /// The resources some container of it was charged the default for.
    pub defaulted: BTreeSet<String>,
}

/// Fills in the defaults and bounds of `policy` on the containers and init containers of an
/// admitted pod spec, and returns what the pod is charged; Err names the rule and the
/// container that breaks it.
pub fn charge(spec: &mut Value, policy: &ChargePolicy) -> Result<Charge, Refusal> {
    let mut containers = Vec::new();
    let mut inits = Vec::new();
    let mut defaulted = BTreeSet::new();
    for (field, kind, out) in [
        ("containers", "container", &mut containers),
        ("initContainers", "init container", &mut inits),
    ] {
        if let Some(Value::Array(cs)) = spec.get_mut(field) {
            for c in cs {
                let requests = charge_container(c, policy, kind, &mut defaulted)?;
                out.push((requests, is_sidecar(c)));
            }
        }
    }
    Ok(Charge {
        requests: total(&containers, &inits, &amounts(&spec["overhead"])),
        defaulted,
    })
}

/// An init container that keeps running beside the containers (a sidecar).
fn is_sidecar(c: &Value) -> bool {
    c["restartPolicy"].as_str() == Some("Always")
}

/// A pod's effective requests as kube's quota computes them: the sum of its containers and
/// sidecars, at least each init container's own with the sidecars started before it, plus its
/// overhead and one `pods`.
pub fn effective_requests(spec: &Value) -> Resources {
    let of = |field: &str| -> Vec<(Resources, bool)> {
        spec[field]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| (amounts(&c["resources"]["requests"]), is_sidecar(c)))
            .collect()
    };
    total(
        &of("containers"),
        &of("initContainers"),
        &amounts(&spec["overhead"]),
    )
}

fn total(
    containers: &[(Resources, bool)],
    inits: &[(Resources, bool)],
    overhead: &Resources,
) -> Resources {
    let mut sum = Resources::new();
    for (r, _) in containers {
        crate::shadow::add(&mut sum, r);
    }
    // Sidecars run with everything after them: they add to the containers, and to each later
    // init container while it runs.
    let mut sidecars = Resources::new();
    let mut peak = Resources::new();
    for (r, sidecar) in inits {
        let mut running = sidecars.clone();
        crate::shadow::add(&mut running, r);
        if *sidecar {
            crate::shadow::add(&mut sidecars, r);
        }
        for (k, v) in running {
            let e = peak.entry(k).or_default();
            *e = (*e).max(v);
        }
    }
    crate::shadow::add(&mut sum, &sidecars);
    for (k, v) in peak {
        let e = sum.entry(k).or_default();
        *e = (*e).max(v);
    }
    crate::shadow::add(&mut sum, overhead);
    *sum.entry("pods".into()).or_default() += 1000;
    sum
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const MI: i128 = 1024 * 1024 * 1000;

    fn refuse() -> ChargePolicy {
        ChargePolicy {
            without_requests: WithoutRequests::Refuse,
            ..Default::default()
        }
    }

    fn none() -> ChargePolicy {
        ChargePolicy {
            default_requests: BTreeMap::new(),
            without_requests: WithoutRequests::Charge,
            max_limit_request_ratio: BTreeMap::new(),
        }
    }

    fn c(resources: Value) -> Value {
        json!({"name": "app", "image": "nginx", "resources": resources})
    }

    #[test]
    fn charges_and_bounds() {
        // (case, containers, init containers, policy, charged cpu (m) and memory (bytes·1000),
        //  or the rule and a part of its detail)
        type Case = (
            &'static str,
            Vec<Value>,
            Vec<Value>,
            ChargePolicy,
            Result<(i128, i128), (&'static str, &'static str)>,
        );
        let cases: Vec<Case> = vec![
            (
                "no requests: charged the defaults",
                vec![json!({"name": "app"})],
                vec![],
                ChargePolicy::default(),
                Ok((100, 128 * MI)),
            ),
            (
                "the default is per container",
                vec![c(json!({})), json!({"name": "b"})],
                vec![],
                ChargePolicy::default(),
                Ok((200, 256 * MI)),
            ),
            (
                "the default is per resource",
                vec![c(json!({"requests": {"cpu": "1"}}))],
                vec![],
                ChargePolicy::default(),
                Ok((1000, 128 * MI)),
            ),
            (
                "a zero request is none",
                vec![c(json!({"requests": {"cpu": "0", "memory": "0"}}))],
                vec![],
                ChargePolicy::default(),
                Ok((100, 128 * MI)),
            ),
            (
                "a limit without a request is its request",
                vec![c(json!({"limits": {"cpu": "2", "memory": "1Gi"}}))],
                vec![],
                ChargePolicy::default(),
                Ok((2000, 1024 * MI)),
            ),
            (
                "requests as asked",
                vec![c(json!({"requests": {"cpu": "1m", "memory": "1Mi"}}))],
                vec![],
                ChargePolicy::default(),
                Ok((1, MI)),
            ),
            (
                "a limit at the ratio",
                vec![c(
                    json!({"requests": {"cpu": "100m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "4Gi"}}),
                )],
                vec![],
                ChargePolicy::default(),
                Ok((100, 1024 * MI)),
            ),
            (
                "a cpu limit above the ratio",
                vec![c(
                    json!({"requests": {"cpu": "100m", "memory": "1Gi"}, "limits": {"cpu": "1001m"}}),
                )],
                vec![],
                ChargePolicy::default(),
                Err((
                    RULE_RATIO,
                    "container \"app\" has a cpu limit of 1001m for a request of 100m: a limit may be at most 10 times its request",
                )),
            ),
            (
                "a memory limit far above its request",
                vec![c(
                    json!({"limits": {"memory": "64Gi"}, "requests": {"memory": "1"}}),
                )],
                vec![],
                ChargePolicy::default(),
                Err((RULE_RATIO, "memory limit of 64Gi for a request of 1")),
            ),
            (
                "an init container's limit is bounded too",
                vec![json!({"name": "app"})],
                vec![
                    json!({"name": "init", "resources": {"requests": {"cpu": "10m"}, "limits": {"cpu": "1"}}}),
                ],
                ChargePolicy::default(),
                Err((RULE_RATIO, "init container \"init\" has a cpu limit of 1")),
            ),
            (
                "a ratio the admin widened",
                vec![c(
                    json!({"requests": {"cpu": "100m"}, "limits": {"cpu": "8"}}),
                )],
                vec![],
                ChargePolicy {
                    max_limit_request_ratio: [("cpu".to_string(), 100_000)].into(),
                    ..Default::default()
                },
                Ok((100, 128 * MI)),
            ),
            (
                "no ratio: limits are not bounded",
                vec![c(
                    json!({"requests": {"cpu": "1m"}, "limits": {"cpu": "64"}}),
                )],
                vec![],
                none(),
                Ok((1, 0)),
            ),
            (
                "no defaults: a container requesting nothing is charged nothing",
                vec![json!({"name": "app"})],
                vec![],
                none(),
                Ok((0, 0)),
            ),
            (
                "refused instead of charged",
                vec![c(json!({"requests": {"cpu": "1"}}))],
                vec![],
                refuse(),
                Err((
                    RULE_REQUESTS,
                    "container \"app\" requests no memory, and this provider charges every container for memory",
                )),
            ),
            (
                "refused: an init container too",
                vec![c(json!({"requests": {"cpu": "1", "memory": "1Gi"}}))],
                vec![json!({"name": "init"})],
                refuse(),
                Err((RULE_REQUESTS, "init container \"init\" requests no cpu")),
            ),
            (
                "refused: a limit stands for its request",
                vec![c(json!({"limits": {"cpu": "1", "memory": "1Gi"}}))],
                vec![],
                refuse(),
                Ok((1000, 1024 * MI)),
            ),
            (
                "an init container larger than the containers",
                vec![c(json!({"requests": {"cpu": "100m", "memory": "1Mi"}}))],
                vec![c(json!({"requests": {"cpu": "2", "memory": "1Mi"}}))],
                ChargePolicy::default(),
                Ok((2000, MI)),
            ),
            (
                "a sidecar counts with the containers",
                vec![c(json!({"requests": {"cpu": "1", "memory": "1Mi"}}))],
                vec![json!({"name": "proxy", "restartPolicy": "Always",
                            "resources": {"requests": {"cpu": "1", "memory": "1Mi"}}})],
                ChargePolicy::default(),
                Ok((2000, 2 * MI)),
            ),
        ];
        for (name, containers, inits, policy, want) in cases {
            let mut spec = json!({"containers": containers});
            if !inits.is_empty() {
                spec["initContainers"] = Value::Array(inits);
            }
            let got = charge(&mut spec, &policy);
            match (got, want) {
                (Ok(Charge { requests: r, .. }), Ok((cpu, memory))) => {
                    let got = (
                        r.get("cpu").copied().unwrap_or(0),
                        r.get("memory").copied().unwrap_or(0),
                    );
                    assert_eq!(got, (cpu, memory), "{name}");
                    assert_eq!(r["pods"], 1000, "{name}");
                    // What was charged is what the spec now says.
                    assert_eq!(effective_requests(&spec), r, "{name}: {spec}");
                }
                (Err(refusal), Err((rule, detail))) => {
                    assert_eq!(refusal.rule, rule, "{name}");
                    assert!(
                        refusal.detail.contains(detail),
                        "{name}: {}",
                        refusal.detail
                    );
                    assert!(
                        refusal
                            .to_string()
                            .starts_with(&format!("refused by rule {rule}: ")),
                        "{name}: {refusal}"
                    );
                }
                (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn the_real_pod_carries_the_charge_and_the_bound() {
        let mut spec = json!({"containers": [
            {"name": "a"},
            {"name": "b", "resources": {"requests": {"cpu": "1m", "memory": "1Mi"}}},
            {"name": "c", "resources": {"requests": {"cpu": "250m"}, "limits": {"cpu": "500m"}}},
        ]});
        charge(&mut spec, &ChargePolicy::default()).unwrap();
        let res = |i: usize| spec["containers"][i]["resources"].clone();
        assert_eq!(
            res(0),
            json!({"requests": {"cpu": "100m", "memory": "128Mi"},
                   "limits": {"cpu": "1", "memory": "512Mi"}})
        );
        assert_eq!(
            res(1),
            json!({"requests": {"cpu": "1m", "memory": "1Mi"},
                   "limits": {"cpu": "10m", "memory": "4Mi"}})
        );
        assert_eq!(
            res(2),
            json!({"requests": {"cpu": "250m", "memory": "128Mi"},
                   "limits": {"cpu": "500m", "memory": "512Mi"}})
        );
        // Nothing to fill in: the spec is left as it was.
        let mut spec = json!({"containers": [{"name": "a", "resources": {
            "requests": {"cpu": "1"}, "limits": {"cpu": "2"}}}]});
        let before = spec.clone();
        charge(&mut spec, &none()).unwrap();
        assert_eq!(spec, before);
    }

    #[test]
    fn settings_keep_their_defaults_when_absent() {
        let none_given: Option<&BTreeMap<String, String>> = None;
        assert_eq!(
            ChargePolicy::from_settings(none_given, WithoutRequests::Charge, none_given),
            ChargePolicy::default()
        );
        let empty = BTreeMap::new();
        let p = ChargePolicy::from_settings(Some(&empty), WithoutRequests::Refuse, Some(&empty));
        assert_eq!(
            p,
            ChargePolicy {
                without_requests: WithoutRequests::Refuse,
                ..none()
            }
        );
        let storage: BTreeMap<String, String> = [
            ("ephemeral-storage".to_string(), "1Gi".to_string()),
            ("cpu".into(), "x".into()),
        ]
        .into();
        // A ratio below 1 would default a limit under its request.
        let half: BTreeMap<String, String> = [("cpu".to_string(), "500m".to_string())].into();
        let p = ChargePolicy::from_settings(none_given, WithoutRequests::Charge, Some(&half));
        assert_eq!(
            p.max_limit_request_ratio,
            [("cpu".to_string(), 1000)].into()
        );
        let p = ChargePolicy::from_settings(Some(&storage), WithoutRequests::Charge, none_given);
        assert_eq!(
            p.default_requests.keys().collect::<Vec<_>>(),
            ["ephemeral-storage"]
        );
    }
}
