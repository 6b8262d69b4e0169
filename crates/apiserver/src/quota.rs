//! ResourceQuota object counts at admission: a create is refused with kube-apiserver's 403 when
//! a quota of its namespace limits `count/<resource>.<group>` (`count/<resource>` for the core
//! group, or one of the core resources' legacy names such as `configmaps`) and the namespace
//! already holds that many.
//!
//! Only object counts are enforced, and only on create (a server-side dry run of a create is
//! refused alike, counting nothing). kube's quota controller, which fills
//! `status.hard` and `status.used`, is not reproduced: usage is counted from the store at each
//! create instead, against `spec.hard`, so `status` stays as clients wrote it. Compute-resource
//! keys (`requests.cpu`, `services.loadbalancers` …) and scoped quotas (`spec.scopes`,
//! `spec.scopeSelector`, which in kube only ever match pods) are not enforced.

use std::sync::Arc;

use serde_json::{Map, Value};
use tandem_apimachinery::quantity::Quantity;

use crate::error::{ApiError, ApiResult};
use crate::registry::ResourceInfo;
use crate::state::State;
use crate::store::Doc;

/// Where ResourceQuota objects are stored.
const QUOTAS: &str = "/resourcequotas";

/// Core resources a quota limits by their bare name, from before the `count/` syntax.
const LEGACY_COUNTED: &[&str] = &[
    "pods",
    "services",
    "secrets",
    "configmaps",
    "persistentvolumeclaims",
    "replicationcontrollers",
    "resourcequotas",
];

/// Stores `obj` as [`State::create_object`] does, unless a ResourceQuota of its namespace is
/// already full. Counting and writing happen under one process-wide lock, so concurrent creates
/// cannot overshoot a quota; namespaces without quotas never take it.
pub fn create_within_quota(
    state: &State,
    res: &ResourceInfo,
    ns: &str,
    name: &str,
    obj: &mut Value,
) -> ApiResult<Arc<Doc>> {
    let quotas = quotas_limiting(state, res, ns);
    if quotas.is_empty() {
        return state.create_object(res, ns, name, obj);
    }
    let _counting = state.quota_lock.lock();
    refuse_over(state, res, ns, name, obj, &quotas)?;
    state.create_object(res, ns, name, obj)
}

/// What [`create_within_quota`] would refuse, without storing anything: a server-side dry run
/// of a create is refused as the create would be (kube-apiserver's quota admission runs on
/// dry runs too, and only leaves the quota's usage alone).
pub fn check_create(
    state: &State,
    res: &ResourceInfo,
    ns: &str,
    name: &str,
    obj: &Value,
) -> ApiResult<()> {
    let quotas = quotas_limiting(state, res, ns);
    if quotas.is_empty() {
        return Ok(());
    }
    refuse_over(state, res, ns, name, obj, &quotas)
}

/// The ResourceQuotas of `ns` that limit a count of `res` objects.
fn quotas_limiting(state: &State, res: &ResourceInfo, ns: &str) -> Vec<Value> {
    if !res.namespaced || ns.is_empty() {
        return Vec::new();
    }
    let keys = object_count_keys(&res.group, &res.resource);
    state
        .store
        .list(QUOTAS, Some(ns), None)
        .1
        .iter()
        .map(|doc| doc.value())
        .filter(|quota| limits_any(quota, &keys))
        .collect()
}

/// Refuses `obj` if one more of it would exceed one of `quotas`.
fn refuse_over(
    state: &State,
    res: &ResourceInfo,
    ns: &str,
    name: &str,
    obj: &Value,
    quotas: &[Value],
) -> ApiResult<()> {
    let (_, existing) = state.store.list(&res.storage_key(), Some(ns), None);
    let usage: Vec<KeyUsage> = object_count_keys(&res.group, &res.resource)
        .into_iter()
        .map(|key| KeyUsage {
            used: used(&key, &existing),
            requested: u64::from(counts_under(&key, obj)),
            key,
        })
        .collect();
    for quota in quotas {
        if let Some(why) = refusal(quota, &usage) {
            return Err(ApiError::forbidden(&res.group, &res.resource, name, &why));
        }
    }
    Ok(())
}

/// The quota keys that count objects of `group`/`resource`: `count/<resource>.<group>`
/// (`count/<resource>` in the core group), and a legacy core resource's bare name.
fn object_count_keys(group: &str, resource: &str) -> Vec<String> {
    let mut keys = Vec::with_capacity(2);
    if group.is_empty() && LEGACY_COUNTED.contains(&resource) {
        keys.push(resource.to_string());
    }
    keys.push(if group.is_empty() {
        format!("count/{resource}")
    } else {
        format!("count/{resource}.{group}")
    });
    keys
}

/// Whether `quota` limits any of `keys` and applies to every object (it has no scopes).
fn limits_any(quota: &Value, keys: &[String]) -> bool {
    let spec = &quota["spec"];
    let scoped = spec["scopes"].as_array().is_some_and(|s| !s.is_empty())
        || spec["scopeSelector"]["matchExpressions"]
            .as_array()
            .is_some_and(|s| !s.is_empty());
    !scoped
        && spec["hard"]
            .as_object()
            .is_some_and(|hard| keys.iter().any(|k| hard.contains_key(k)))
}

/// Whether `obj` counts under `key`: every stored object does, except that the legacy `pods`
/// key counts only pods that have not finished (kube's `count/pods` counts them all).
fn counts_under(key: &str, obj: &Value) -> bool {
    counts_in_phase(key, obj["status"]["phase"].as_str())
}

/// [`counts_under`] for an object in `phase`.
fn counts_in_phase(key: &str, phase: Option<&str>) -> bool {
    key != "pods" || !matches!(phase, Some("Succeeded" | "Failed"))
}

/// How many of the `existing` objects count under `key`. Only core pods count under `pods`,
/// and their phase is read from what the store extracted (`status.phase` is a selectable
/// field), not by parsing each pod: this runs on every create in a namespace with such a quota.
fn used(key: &str, existing: &[Arc<Doc>]) -> u64 {
    let n = if key == "pods" {
        existing
            .iter()
            .filter(|doc| counts_in_phase(key, doc.field("/pods", "status.phase")))
            .count()
    } else {
        existing.len()
    };
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// How one quota key stands for the object being created.
#[derive(Debug)]
struct KeyUsage {
    key: String,
    used: u64,
    requested: u64,
}

/// Why `quota` refuses the object, in kube's words, when one more would pass a hard limit:
/// `exceeded quota: q, requested: count/configmaps=1, used: count/configmaps=3, limited:
/// count/configmaps=3` (every key that would pass its limit, sorted and joined by commas).
fn refusal(quota: &Value, usage: &[KeyUsage]) -> Option<String> {
    let hard: &Map<String, Value> = quota["spec"]["hard"].as_object()?;
    let mut failed: Vec<(&KeyUsage, &str)> = usage
        .iter()
        .filter(|u| u.requested > 0)
        .filter_map(|u| {
            let limit = hard.get(&u.key)?.as_str()?;
            // Compared in thousandths so a fractional limit ("2.5") is honoured as kube does.
            let limit_milli = Quantity::parse(limit).ok()?.milli_value();
            let wanted = i128::from(u.used + u.requested) * 1000;
            (wanted > limit_milli).then_some((u, limit))
        })
        .collect();
    if failed.is_empty() {
        return None;
    }
    failed.sort_by(|a, b| a.0.key.cmp(&b.0.key));
    let list = |part: &dyn Fn(&KeyUsage, &str) -> String| {
        failed
            .iter()
            .map(|(u, limit)| format!("{}={}", u.key, part(u, limit)))
            .collect::<Vec<_>>()
            .join(",")
    };
    Some(format!(
        "exceeded quota: {}, requested: {}, used: {}, limited: {}",
        quota["metadata"]["name"].as_str().unwrap_or_default(),
        list(&|u, _| u.requested.to_string()),
        list(&|u, _| u.used.to_string()),
        list(&|_, limit| limit.to_string()),
    ))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn quota(name: &str, spec: Value) -> Value {
        json!({"metadata": {"name": name, "namespace": "team"}, "spec": spec})
    }

    fn usage(key: &str, used: u64) -> KeyUsage {
        KeyUsage {
            key: key.into(),
            used,
            requested: 1,
        }
    }

    #[test]
    fn core_resources_are_counted_by_count_syntax_and_legacy_name() {
        assert_eq!(
            object_count_keys("", "configmaps"),
            ["configmaps", "count/configmaps"]
        );
        assert_eq!(object_count_keys("", "pods"), ["pods", "count/pods"]);
        assert_eq!(
            object_count_keys("", "resourcequotas"),
            ["resourcequotas", "count/resourcequotas"]
        );
        // Core resources kube never counted by bare name only have the count/ key.
        assert_eq!(object_count_keys("", "endpoints"), ["count/endpoints"]);
    }

    #[test]
    fn grouped_resources_are_counted_as_resource_dot_group() {
        assert_eq!(
            object_count_keys("tandem.dev", "peeringrequests"),
            ["count/peeringrequests.tandem.dev"]
        );
        assert_eq!(
            object_count_keys("apps", "deployments"),
            ["count/deployments.apps"]
        );
    }

    #[test]
    fn a_quota_applies_when_it_limits_a_key_of_the_resource_and_has_no_scopes() {
        let keys = object_count_keys("", "configmaps");
        let cases = [
            (
                "count syntax",
                json!({"hard": {"count/configmaps": "3"}}),
                true,
            ),
            ("legacy name", json!({"hard": {"configmaps": "3"}}), true),
            (
                "another resource",
                json!({"hard": {"count/secrets": "3"}}),
                false,
            ),
            (
                "a group's resource of the same name",
                json!({"hard": {"count/configmaps.tandem.dev": "3"}}),
                false,
            ),
            (
                "compute only",
                json!({"hard": {"requests.cpu": "1"}}),
                false,
            ),
            ("no hard", json!({}), false),
            (
                "scoped",
                json!({"hard": {"count/configmaps": "3"}, "scopes": ["BestEffort"]}),
                false,
            ),
            (
                "scope selector",
                json!({"hard": {"count/configmaps": "3"}, "scopeSelector": {"matchExpressions":
                    [{"scopeName": "PriorityClass", "operator": "Exists"}]}}),
                false,
            ),
        ];
        for (case, spec, want) in cases {
            assert_eq!(limits_any(&quota("q", spec), &keys), want, "{case}");
        }
    }

    #[test]
    fn legacy_pods_key_skips_finished_pods_but_count_pods_does_not() {
        let finished = json!({"status": {"phase": "Succeeded"}});
        let running = json!({"status": {"phase": "Running"}});
        assert!(!counts_under("pods", &finished));
        assert!(counts_under("pods", &running));
        assert!(counts_under("count/pods", &finished));
        assert!(counts_under("configmaps", &finished));
    }

    #[test]
    fn stored_pods_count_under_the_legacy_key_by_their_phase() {
        let store = crate::store::Store::open(None, 100).unwrap();
        for (name, status) in [
            ("running", json!({"phase": "Running"})),
            ("pending", json!({})),
            ("done", json!({"phase": "Succeeded"})),
            ("failed", json!({"phase": "Failed"})),
        ] {
            let mut pod =
                json!({"metadata": {"name": name, "namespace": "team"}, "status": status});
            store.create("/pods", "team", name, &mut pod).unwrap();
        }
        let (_, pods) = store.list("/pods", Some("team"), None);
        assert_eq!(used("pods", &pods), 2, "finished pods are not counted");
        assert_eq!(used("count/pods", &pods), 4);
    }

    #[test]
    fn one_more_than_the_limit_is_refused_in_kubes_words() {
        let q = quota("small", json!({"hard": {"count/configmaps": "3"}}));
        assert_eq!(refusal(&q, &[usage("count/configmaps", 2)]), None);
        assert_eq!(
            refusal(&q, &[usage("count/configmaps", 3)]).as_deref(),
            Some(
                "exceeded quota: small, requested: count/configmaps=1, used: count/configmaps=3, \
                 limited: count/configmaps=3"
            )
        );
    }

    #[test]
    fn every_exceeded_key_is_named_sorted() {
        let q = quota(
            "both",
            json!({"hard": {"count/configmaps": "2", "configmaps": "5"}}),
        );
        let at = |n| [usage("configmaps", n), usage("count/configmaps", n)];
        assert_eq!(
            refusal(&q, &at(2)).as_deref(),
            Some(
                "exceeded quota: both, requested: count/configmaps=1, used: count/configmaps=2, \
                 limited: count/configmaps=2"
            )
        );
        assert_eq!(
            refusal(&q, &at(5)).as_deref(),
            Some(
                "exceeded quota: both, requested: configmaps=1,count/configmaps=1, used: \
                 configmaps=5,count/configmaps=5, limited: configmaps=5,count/configmaps=2"
            )
        );
    }

    #[test]
    fn limits_are_quantities() {
        let refused = |hard: &str, used: u64| {
            let q = quota("q", json!({"hard": {"count/configmaps": hard}}));
            refusal(&q, &[usage("count/configmaps", used)]).is_some()
        };
        assert!(refused("0", 0), "zero admits nothing");
        assert!(!refused("1k", 999));
        assert!(refused("1k", 1000));
        assert!(
            refused("2.5", 2),
            "a fractional limit rounds down the count"
        );
        assert!(!refused("2.5", 1));
        assert!(
            !refused("not-a-quantity", 100),
            "unparsable limits bind nothing"
        );
    }

    /// Counting and storing are one step: threads racing to create never leave more objects
    /// than the quota allows.
    #[tokio::test]
    async fn racing_creates_never_overshoot_the_quota() {
        let server = crate::ApiServer::start(crate::Config::default())
            .await
            .expect("server starts");
        let state = server.state().clone();
        let resource = |name: &str| state.registry.read().get("", "v1", name).unwrap();
        let mut limit = quota("small", json!({"hard": {"count/configmaps": "3"}}));
        limit["metadata"]["namespace"] = json!("default");
        state
            .create_object(&resource("resourcequotas"), "default", "small", &mut limit)
            .unwrap();
        let configmaps = resource("configmaps");
        let admitted = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for t in 0..8 {
                let (state, configmaps, admitted) = (&state, &configmaps, &admitted);
                s.spawn(move || {
                    for i in 0..125 {
                        let name = format!("cm-{t}-{i}");
                        let mut obj = json!({"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": name, "namespace": "default"}});
                        crate::objects::prepare_create(configmaps, &mut obj);
                        match create_within_quota(state, configmaps, "default", &name, &mut obj) {
                            Ok(_) => {
                                admitted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                            Err(e) => assert_eq!(e.code, 403, "{e:?}"),
                        }
                    }
                });
            }
        });
        assert_eq!(admitted.into_inner(), 3);
        let stored = state.store.list("/configmaps", Some("default"), None).1;
        assert_eq!(stored.len(), 3);
        server.shutdown();
    }

    #[test]
    fn an_object_that_does_not_count_is_never_refused() {
        let q = quota("q", json!({"hard": {"pods": "1"}}));
        let finished_pod = KeyUsage {
            key: "pods".into(),
            used: 1,
            requested: 0,
        };
        assert_eq!(refusal(&q, &[finished_pod]), None);
    }
}
