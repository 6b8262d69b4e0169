//! ControllerRevisions as kube-controller-manager keeps them for StatefulSets and DaemonSets
//! (`pkg/controller/history`): a revision holds a snapshot of the owner's pod template, is
//! named `<owner>-<hash>` after the FNV-32 hash of that snapshot, and carries a revision number
//! that orders the owner's history. Pure helpers plus the one API step that needs care (a name
//! collision bumps the owner's collisionCount, as upstream).

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::api::{Api, PostParams};
use serde_json::Value;

/// Label on a ControllerRevision holding its hash.
pub const HASH_LABEL: &str = "controller.kubernetes.io/hash";
/// Label on pods naming the revision they were made from.
pub const POD_REVISION_LABEL: &str = "controller-revision-hash";

/// Upstream's `rand.SafeEncodeString` alphabet (no vowels, no look-alikes).
const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// `history.HashControllerRevision`: FNV-1 (32-bit) of the revision's data, then of the
/// collision count if any, printed in decimal and made name-safe.
pub fn hash(data: &Value, collision_count: Option<i32>) -> String {
    let mut bytes = data.to_string().into_bytes();
    if let Some(probe) = collision_count {
        bytes.extend(probe.to_string().bytes());
    }
    safe_encode(&fnv1_32(&bytes).to_string())
}

/// FNV-1, 32 bits (Go's `hash/fnv.New32`).
fn fnv1_32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |h: u32, b| {
        h.wrapping_mul(0x0100_0193) ^ u32::from(*b)
    })
}

/// `rand.SafeEncodeString`: each character mapped into [`ALPHANUMS`].
fn safe_encode(s: &str) -> String {
    s.bytes()
        .map(|b| ALPHANUMS[usize::from(b) % ALPHANUMS.len()] as char)
        .collect()
}

/// `history.ControllerRevisionName`: `<prefix>-<hash>`, the prefix cut to fit a name.
pub fn revision_name(prefix: &str, hash: &str) -> String {
    let prefix: String = prefix.chars().take(223).collect();
    format!("{prefix}-{hash}")
}

/// `history.NewControllerRevision`: a revision of an owner (named `owner_name`, controlled
/// through `owner`) holding `data`, labelled with the pod template's labels and its hash.
pub fn new_revision(
    owner_name: &str,
    namespace: &str,
    owner: OwnerReference,
    template_labels: &BTreeMap<String, String>,
    data: Value,
    revision: i64,
    collision_count: Option<i32>,
) -> ControllerRevision {
    let hash = hash(&data, collision_count);
    let mut labels = template_labels.clone();
    labels.insert(HASH_LABEL.to_string(), hash.clone());
    ControllerRevision {
        metadata: ObjectMeta {
            name: Some(revision_name(owner_name, &hash)),
            namespace: Some(namespace.to_string()),
            labels: Some(labels),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        data: Some(RawExtension(data)),
        revision,
    }
}

/// `history.EqualRevision`: whether two revisions hold the same snapshot.
pub fn equal(a: &ControllerRevision, b: &ControllerRevision) -> bool {
    a.data.as_ref().map(|d| &d.0) == b.data.as_ref().map(|d| &d.0)
}

/// `history.SortControllerRevisions`: by revision number, then creation time, then name.
pub fn sort(revisions: &mut [ControllerRevision]) {
    revisions.sort_by(|a, b| {
        (
            a.revision,
            a.metadata.creation_timestamp.as_ref().map(|t| t.0),
            a.metadata.name.as_deref(),
        )
            .cmp(&(
                b.revision,
                b.metadata.creation_timestamp.as_ref().map(|t| t.0),
                b.metadata.name.as_deref(),
            ))
    });
}

/// The revision number after the newest of `sorted` (1 for an empty history).
pub fn next_number(sorted: &[ControllerRevision]) -> i64 {
    sorted.last().map_or(1, |r| r.revision + 1)
}

/// Which revisions to delete so that at most `limit` revisions that nothing uses remain:
/// the oldest unused ones first (`truncateHistory`). `sorted` is oldest first; `live` names
/// the revisions in use (current, update, and those pods run).
pub fn to_truncate(sorted: &[ControllerRevision], live: &HashSet<&str>, limit: i32) -> Vec<String> {
    let history: Vec<&str> = sorted
        .iter()
        .filter_map(|r| r.metadata.name.as_deref())
        .filter(|n| !live.contains(n))
        .collect();
    let Ok(limit) = usize::try_from(limit) else {
        return Vec::new();
    };
    if history.len() <= limit {
        return Vec::new();
    }
    history[..history.len() - limit]
        .iter()
        .map(|n| n.to_string())
        .collect()
}

/// What came of creating a revision.
pub struct Created {
    /// The stored revision (an equal one that already existed counts).
    pub revision: ControllerRevision,
    /// The owner's collisionCount after the attempt (bumped on each hash collision).
    pub collision_count: i32,
}

/// `realHistory.CreateControllerRevision`: creates `revision` (built by `build` for a given
/// collision count); when a different revision already holds the name, bumps the collision
/// count and tries again, as upstream does.
pub async fn create(
    api: &Api<ControllerRevision>,
    mut collision_count: i32,
    build: impl Fn(Option<i32>) -> ControllerRevision,
) -> Result<Created, kube::Error> {
    loop {
        let revision = build(Some(collision_count).filter(|c| *c > 0));
        match api.create(&PostParams::default(), &revision).await {
            Ok(revision) => {
                return Ok(Created {
                    revision,
                    collision_count,
                });
            }
            Err(kube::Error::Api(s)) if s.is_already_exists() => {
                let name = revision.metadata.name.clone().unwrap_or_default();
                if let Some(existing) = api.get_opt(&name).await?
                    && equal(&existing, &revision)
                {
                    return Ok(Created {
                        revision: existing,
                        collision_count,
                    });
                }
                collision_count += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rev(name: &str, number: i64) -> ControllerRevision {
        ControllerRevision {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            data: None,
            revision: number,
        }
    }

    #[test]
    fn hashes_are_name_safe_stable_and_change_with_data_and_collisions() {
        let a = json!({"spec": {"template": {"spec": {"containers": [{"image": "nginx:1"}]}}}});
        let b = json!({"spec": {"template": {"spec": {"containers": [{"image": "nginx:2"}]}}}});
        let h = hash(&a, None);
        assert_eq!(h, hash(&a, None), "stable");
        assert_ne!(h, hash(&b, None), "data counts");
        assert_ne!(h, hash(&a, Some(1)), "the collision count counts");
        assert!(
            h.bytes().all(|c| ALPHANUMS.contains(&c)) && (8..=10).contains(&h.len()),
            "{h}"
        );
        assert_eq!(revision_name("web", "6c4d5b"), "web-6c4d5b");
    }

    #[test]
    fn fnv1_and_safe_encoding_match_upstream() {
        // Reference values of FNV-1 (not 1a) 32.
        assert_eq!(fnv1_32(b""), 0x811c_9dc5);
        assert_eq!(fnv1_32(b"a"), 0x050c_5d7e);
        // Digits map through the alphabet as upstream's SafeEncodeString: '0' -> '4', '6' -> 'b'.
        assert_eq!(safe_encode("0123456789"), "456789bcdf");
    }

    #[test]
    fn history_keeps_live_revisions_and_the_newest_unused_ones() {
        let sorted = [rev("r1", 1), rev("r2", 2), rev("r3", 3), rev("r4", 4)];
        let live: HashSet<&str> = ["r4", "r1"].into();
        assert_eq!(to_truncate(&sorted, &live, 1), ["r2"]);
        assert_eq!(to_truncate(&sorted, &live, 0), ["r2", "r3"]);
        assert!(to_truncate(&sorted, &live, 2).is_empty());
        assert!(
            to_truncate(&sorted, &live, -1).is_empty(),
            "negative keeps all"
        );
        assert_eq!(next_number(&sorted), 5);
        assert_eq!(next_number(&[]), 1);
    }
}
