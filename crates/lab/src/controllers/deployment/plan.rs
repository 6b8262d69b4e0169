//! The pure half of the Deployment controller: how big each ReplicaSet should be now,
//! given what they are (kube's rolling.go, recreate.go and sync.go scale), and which
//! template a ReplicaSet runs.

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// Label (and RS name suffix) naming the pod template a ReplicaSet runs.
pub const HASH_LABEL: &str = "pod-template-hash";

/// One ReplicaSet of a Deployment, as the planner sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RsState {
    /// spec.replicas.
    pub replicas: i32,
    /// status.availableReplicas.
    pub available: i32,
}

/// An int-or-percent field (maxSurge, maxUnavailable, minAvailable) that is neither.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid value {0:?}: must be an integer or a percentage")]
pub struct NotIntOrPercent(pub String);

/// [`NotIntOrPercent`] in a named field (`spec.minAvailable`), as a controller reports it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {invalid}")]
pub struct InvalidField {
    /// The field's path.
    pub field: &'static str,
    /// What is wrong with its value.
    pub invalid: NotIntOrPercent,
}

impl InvalidField {
    /// Names `field` in a [`NotIntOrPercent`] (for `map_err`).
    pub fn at(field: &'static str) -> impl FnOnce(NotIntOrPercent) -> InvalidField {
        move |invalid| InvalidField { field, invalid }
    }
}

/// Resolves maxSurge/maxUnavailable against `total`: ints as they are, percentages of
/// `total` rounded up (surge) or down (unavailable), as kube's intstr helper does.
pub fn resolve(
    value: Option<&IntOrString>,
    default: &str,
    total: i32,
    round_up: bool,
) -> Result<i32, NotIntOrPercent> {
    let value = value
        .cloned()
        .unwrap_or_else(|| IntOrString::String(default.into()));
    match value {
        IntOrString::Int(i) => Ok(i.max(0)),
        IntOrString::String(s) => {
            let percent: i64 = s
                .strip_suffix('%')
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| NotIntOrPercent(s.clone()))?;
            let scaled = percent * i64::from(total);
            let v = if round_up {
                (scaled + 99).div_euclid(100)
            } else {
                scaled.div_euclid(100)
            };
            Ok(i32::try_from(v.max(0)).unwrap_or(i32::MAX))
        }
    }
}

/// kube's ResolveFenceposts: (maxSurge, maxUnavailable) for `desired` replicas; both zero
/// would deadlock a rollout, so maxUnavailable becomes 1 then.
pub fn fenceposts(
    surge: Option<&IntOrString>,
    unavailable: Option<&IntOrString>,
    desired: i32,
) -> Result<(i32, i32), InvalidField> {
    let surge = resolve(surge, "25%", desired, true).map_err(InvalidField::at("maxSurge"))?;
    let unavailable =
        resolve(unavailable, "25%", desired, false).map_err(InvalidField::at("maxUnavailable"))?;
    Ok(if surge == 0 && unavailable == 0 {
        (0, 1)
    } else {
        (surge, unavailable)
    })
}

/// kube's NewRSNewReplicas: how big the new ReplicaSet may grow now without exceeding
/// desired + maxSurge pods in total (`total` counts spec.replicas of every ReplicaSet).
pub fn new_rs_size(desired: i32, max_surge: i32, new: i32, total: i32) -> i32 {
    if new >= desired {
        return desired;
    }
    let max_total = desired + max_surge;
    if total >= max_total {
        return new;
    }
    new + (max_total - total).min(desired - new)
}

/// kube's reconcileOldReplicaSets: new sizes of the old ReplicaSets (oldest first) so that
/// at least desired - maxUnavailable pods stay available. Unhealthy old pods go first;
/// healthy ones only as far as availability allows. An RS never counts more available pods
/// than its spec keeps, so a status not yet updated after a scale-down cannot make the
/// controller scale down twice.
pub fn old_rs_sizes(
    desired: i32,
    max_unavailable: i32,
    new: &RsState,
    olds: &[RsState],
) -> Vec<i32> {
    let mut sizes: Vec<i32> = olds.iter().map(|r| r.replicas).collect();
    let all: i32 = new.replicas + sizes.iter().sum::<i32>();
    let min_available = desired - max_unavailable.min(desired);
    let new_unavailable = (new.replicas - new.available).max(0);
    let mut budget = all - min_available - new_unavailable;
    if budget <= 0 {
        return sizes;
    }
    for (size, rs) in sizes.iter_mut().zip(olds) {
        let unhealthy = *size - rs.available.min(*size);
        let cut = unhealthy.min(budget);
        if cut > 0 {
            *size -= cut;
            budget -= cut;
        }
    }
    let available: i32 = new.available.min(new.replicas)
        + sizes
            .iter()
            .zip(olds)
            .map(|(s, r)| r.available.min(*s))
            .sum::<i32>();
    let mut excess = (available - min_available).min(budget);
    for size in sizes.iter_mut() {
        if excess <= 0 {
            break;
        }
        let cut = (*size).min(excess);
        *size -= cut;
        excess -= cut;
    }
    sizes
}

/// What one pass of a rollout changes: the new ReplicaSet's size and the old ones' sizes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// spec.replicas of the new ReplicaSet.
    pub new: i32,
    /// spec.replicas of each old ReplicaSet, in the order given.
    pub olds: Vec<i32>,
}

/// One RollingUpdate pass, as kube's rolloutRolling: grow the new RS if surge allows,
/// otherwise shrink old ones if availability allows.
pub fn rolling_step(
    desired: i32,
    max_surge: i32,
    max_unavailable: i32,
    new: &RsState,
    olds: &[RsState],
) -> Step {
    let total = new.replicas + olds.iter().map(|r| r.replicas).sum::<i32>();
    let grown = if new.replicas > desired {
        desired
    } else {
        new_rs_size(desired, max_surge, new.replicas, total)
    };
    if grown != new.replicas {
        return Step {
            new: grown,
            olds: olds.iter().map(|r| r.replicas).collect(),
        };
    }
    Step {
        new: new.replicas,
        olds: old_rs_sizes(desired, max_unavailable, new, olds),
    }
}

/// One ReplicaSet as kube's proportional scaling sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScalingRs {
    /// spec.replicas.
    pub replicas: i32,
    /// The max-replicas annotation: desired + maxSurge when it was last sized.
    pub max_replicas: Option<i32>,
}

/// kube's proportional scaling when spec.replicas changes while several ReplicaSets have
/// pods: each grows or shrinks in proportion to its share, within desired + maxSurge, the
/// rounding leftover going to the biggest. `rss` are ordered oldest first, the new one
/// last; `status_replicas` stands in for a missing annotation. Returns new sizes in order.
pub fn proportional_sizes(
    desired: i32,
    max_surge: i32,
    rss: &[ScalingRs],
    status_replicas: i32,
) -> Vec<i32> {
    let mut sizes: Vec<i32> = rss.iter().map(|r| r.replicas).collect();
    let allowed = if desired > 0 { desired + max_surge } else { 0 };
    let to_add = allowed - sizes.iter().sum::<i32>();
    if to_add == 0 {
        return sizes;
    }
    // Biggest first; among equals the newest when growing, the oldest when shrinking.
    let mut order: Vec<usize> = (0..rss.len()).collect();
    order.sort_by_key(|&i| {
        let age = if to_add > 0 { -(i as i64) } else { i as i64 };
        (-rss[i].replicas, age)
    });
    let mut added = 0;
    for &i in &order {
        let rs = &rss[i];
        if rs.replicas == 0 || added == to_add {
            continue;
        }
        let fraction = if desired == 0 {
            -rs.replicas
        } else {
            let annotated = rs.max_replicas.unwrap_or(status_replicas).max(1);
            let scaled = f64::from(rs.replicas) * f64::from(allowed) / f64::from(annotated);
            scaled.round() as i32 - rs.replicas
        };
        let allowed_now = to_add - added;
        let proportion = if to_add > 0 {
            fraction.min(allowed_now)
        } else {
            fraction.max(allowed_now)
        };
        sizes[i] += proportion;
        added += proportion;
    }
    if let Some(&biggest) = order.first() {
        sizes[biggest] = (sizes[biggest] + to_add - added).max(0);
    }
    sizes
}

/// One Recreate pass: every old pod goes before the new RS gets any. `old_pods` counts the
/// old ReplicaSets' pods still existing, terminating ones included.
pub fn recreate_step(desired: i32, new: &RsState, olds: &[RsState], old_pods: i32) -> Step {
    if olds.iter().any(|r| r.replicas > 0) || old_pods > 0 {
        return Step {
            new: new.replicas.min(0),
            olds: vec![0; olds.len()],
        };
    }
    Step {
        new: desired,
        olds: vec![0; olds.len()],
    }
}

/// The pod-template-hash of a template: FNV-1a (32 bit) of its JSON form and the collision
/// count, written with kube's vowel-free alphabet so names never spell words.
pub fn template_hash(template: &PodTemplateSpec, collision_count: Option<i32>) -> String {
    let mut hash: u32 = 0x811c_9dc5;
    let mut feed = |bytes: &[u8]| {
        for b in bytes {
            hash ^= u32::from(*b);
            hash = hash.wrapping_mul(0x0100_0193);
        }
    };
    feed(&serde_json::to_vec(template).unwrap_or_default());
    if let Some(c) = collision_count {
        feed(&c.to_le_bytes());
    }
    const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    hash.to_string()
        .bytes()
        .map(|b| ALPHANUMS[usize::from(b) % ALPHANUMS.len()] as char)
        .collect()
}

/// Whether a ReplicaSet runs `template` (its pod-template-hash label aside).
pub fn runs_template(rs: &ReplicaSet, template: &PodTemplateSpec) -> bool {
    let Some(mut rs_template) = rs.spec.as_ref().and_then(|s| s.template.clone()) else {
        return false;
    };
    if let Some(labels) = rs_template
        .metadata
        .as_mut()
        .and_then(|m| m.labels.as_mut())
    {
        labels.remove(HASH_LABEL);
    }
    serde_json::to_value(&rs_template).ok() == serde_json::to_value(template).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn rs(replicas: i32, available: i32) -> RsState {
        RsState {
            replicas,
            available,
        }
    }

    #[test]
    fn surge_rounds_up_and_unavailable_rounds_down() {
        let int = |i| Some(IntOrString::Int(i));
        let pct = |s: &str| Some(IntOrString::String(s.into()));
        // (surge, unavailable, desired, expected (surge, unavailable))
        let cases = [
            (pct("25%"), pct("25%"), 10, (3, 2)),
            (pct("25%"), pct("25%"), 4, (1, 1)),
            (pct("25%"), pct("25%"), 1, (1, 0)),
            (int(0), int(0), 5, (0, 1)),
            (int(2), pct("50%"), 5, (2, 2)),
            (None, None, 20, (5, 5)),
            (pct("0%"), pct("100%"), 3, (0, 3)),
        ];
        for (surge, unavailable, desired, want) in cases {
            assert_eq!(
                fenceposts(surge.as_ref(), unavailable.as_ref(), desired),
                Ok(want),
                "{surge:?} {unavailable:?} of {desired}"
            );
        }
        assert!(
            fenceposts(Some(&IntOrString::String("lots".into())), None, 3)
                .unwrap_err()
                .to_string()
                .contains("maxSurge")
        );
    }

    #[test]
    fn rolling_steps_follow_kube() {
        // (what, desired, surge, unavailable, new, olds, expected step)
        let cases = [
            (
                "first rollout creates everything",
                20,
                5,
                5,
                rs(0, 0),
                vec![],
                Step {
                    new: 20,
                    olds: vec![],
                },
            ),
            (
                "new RS grows by the surge",
                4,
                1,
                1,
                rs(0, 0),
                vec![rs(4, 4)],
                Step {
                    new: 1,
                    olds: vec![4],
                },
            ),
            (
                "then old shrinks down to min available",
                4,
                1,
                1,
                rs(1, 0),
                vec![rs(4, 4)],
                Step {
                    new: 1,
                    olds: vec![3],
                },
            ),
            (
                "then new grows again",
                4,
                1,
                1,
                rs(1, 0),
                vec![rs(3, 3)],
                Step {
                    new: 2,
                    olds: vec![3],
                },
            ),
            (
                "nothing while new pods are unavailable",
                4,
                1,
                1,
                rs(2, 0),
                vec![rs(3, 3)],
                Step {
                    new: 2,
                    olds: vec![3],
                },
            ),
            (
                "one new available frees one old",
                4,
                1,
                1,
                rs(2, 1),
                vec![rs(3, 3)],
                Step {
                    new: 2,
                    olds: vec![2],
                },
            ),
            (
                "stale old status never double-counts",
                4,
                1,
                1,
                rs(3, 2),
                vec![rs(2, 3)],
                Step {
                    new: 3,
                    olds: vec![1],
                },
            ),
            (
                "unhealthy old pods go first",
                4,
                1,
                1,
                rs(1, 1),
                vec![rs(2, 0), rs(2, 2)],
                Step {
                    new: 1,
                    olds: vec![0, 2],
                },
            ),
            (
                "surge 0 scales old first",
                3,
                0,
                1,
                rs(0, 0),
                vec![rs(3, 3)],
                Step {
                    new: 0,
                    olds: vec![2],
                },
            ),
            (
                "scale down of a finished rollout",
                5,
                2,
                1,
                rs(20, 20),
                vec![],
                Step {
                    new: 5,
                    olds: vec![],
                },
            ),
            (
                "scale up of a finished rollout",
                20,
                5,
                5,
                rs(5, 5),
                vec![],
                Step {
                    new: 20,
                    olds: vec![],
                },
            ),
            (
                "done",
                4,
                1,
                1,
                rs(4, 4),
                vec![rs(0, 0)],
                Step {
                    new: 4,
                    olds: vec![0],
                },
            ),
        ];
        for (what, desired, surge, unavailable, new, olds, want) in cases {
            assert_eq!(
                rolling_step(desired, surge, unavailable, &new, &olds),
                want,
                "{what}"
            );
        }
    }

    #[test]
    fn recreate_waits_for_old_pods() {
        let cases = [
            (
                "old RS still sized",
                rs(0, 0),
                vec![rs(3, 3)],
                3,
                Step {
                    new: 0,
                    olds: vec![0],
                },
            ),
            (
                "old pods still terminating",
                rs(0, 0),
                vec![rs(0, 0)],
                2,
                Step {
                    new: 0,
                    olds: vec![0],
                },
            ),
            (
                "old pods gone",
                rs(0, 0),
                vec![rs(0, 0)],
                0,
                Step {
                    new: 3,
                    olds: vec![0],
                },
            ),
        ];
        for (what, new, olds, old_pods, want) in cases {
            assert_eq!(recreate_step(3, &new, &olds, old_pods), want, "{what}");
        }
    }

    #[test]
    fn template_hash_depends_on_template_and_collisions() {
        let mut a = PodTemplateSpec::default();
        let h = template_hash(&a, None);
        assert_eq!(h, template_hash(&a, None), "stable");
        assert!(
            h.bytes()
                .all(|b| b"bcdfghjklmnpqrstvwxz2456789".contains(&b)),
            "{h}"
        );
        assert_ne!(h, template_hash(&a, Some(1)));
        a.metadata = Some(ObjectMeta {
            labels: Some([("app".to_string(), "x".to_string())].into()),
            ..Default::default()
        });
        assert_ne!(h, template_hash(&a, None));
    }

    #[test]
    fn scaling_mid_rollout_is_proportional() {
        let rs = |replicas, max| ScalingRs {
            replicas,
            max_replicas: Some(max),
        };
        // (what, desired, surge, [old..., new], expected sizes)
        let cases = [
            // kube's documented example: 10 -> 15 replicas, maxSurge 3, RSs of 8 and 5.
            ("scale up", 15, 3, vec![rs(8, 13), rs(5, 13)], vec![11, 7]),
            ("scale down", 5, 1, vec![rs(8, 13), rs(5, 13)], vec![4, 2]),
            ("to zero", 0, 3, vec![rs(8, 13), rs(5, 13)], vec![0, 0]),
            (
                "nothing to add",
                10,
                3,
                vec![rs(8, 13), rs(5, 13)],
                vec![8, 5],
            ),
            (
                "equals: the newest grows first",
                20,
                0,
                vec![rs(1, 3), rs(1, 3), rs(1, 3)],
                vec![6, 7, 7],
            ),
            (
                "leftover goes to the biggest",
                10,
                0,
                vec![rs(1, 3), rs(1, 3)],
                vec![3, 7],
            ),
        ];
        for (what, desired, surge, rss, want) in cases {
            let got = proportional_sizes(desired, surge, &rss, 0);
            assert_eq!(got, want, "{what}");
            let total: i32 = got.iter().sum();
            let allowed = if desired > 0 { desired + surge } else { 0 };
            assert_eq!(total, allowed, "{what}: sizes add up to desired + maxSurge");
        }
    }
}
