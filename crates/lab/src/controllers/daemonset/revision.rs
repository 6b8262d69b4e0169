//! A DaemonSet's ControllerRevisions, as kube's daemon controller keeps them: one per pod
//! template, named `<ds>-<hash>`, whose data is the strategic merge patch that restores the
//! template (what `kubectl rollout undo daemonset` applies), numbered by revision.

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::Resource;
use serde_json::{Value, json};

use super::plan::HASH_LABEL;
use crate::controllers::deployment::plan::template_hash;

/// kube's getPatch: `{"spec":{"template":{...,"$patch":"replace"}}}`.
pub fn patch_of(ds: &DaemonSet) -> Value {
    let template = ds
        .spec
        .as_ref()
        .map(|s| serde_json::to_value(&s.template).unwrap_or(Value::Null))
        .unwrap_or(Value::Null);
    let mut template = match template {
        Value::Object(m) => m,
        _ => Default::default(),
    };
    template.insert("$patch".into(), json!("replace"));
    json!({"spec": {"template": template}})
}

/// Whether `revision` holds the DaemonSet's current template (kube's Match). Compared as
/// JSON values, so a server that re-serialises the data in another key order still matches.
pub fn holds_template_of(ds: &DaemonSet, revision: &ControllerRevision) -> bool {
    revision.data.as_ref().map(|d| &d.0) == Some(&patch_of(ds))
}

/// The revision hash of the DaemonSet's template (kube's ComputeHash with the collision count).
pub fn hash_of(ds: &DaemonSet) -> String {
    let spec = ds.spec.as_ref();
    let template = spec.map(|s| s.template.clone()).unwrap_or_default();
    let collisions = ds.status.as_ref().and_then(|s| s.collision_count);
    template_hash(&template, collisions)
}

/// The revision kube's snapshot creates for the current template.
pub fn snapshot(ds: &DaemonSet, revision: i64) -> ControllerRevision {
    let hash = hash_of(ds);
    let mut labels = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    labels.insert(HASH_LABEL.into(), hash.clone());
    ControllerRevision {
        metadata: ObjectMeta {
            name: Some(format!(
                "{}-{hash}",
                ds.metadata.name.as_deref().unwrap_or_default()
            )),
            namespace: ds.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: ds.metadata.annotations.clone(),
            owner_references: ds.controller_owner_ref(&()).map(|r| vec![r]),
            ..Default::default()
        },
        data: Some(RawExtension(patch_of(ds))),
        revision,
    }
}

/// Old revisions to delete to keep `limit` of them (kube's cleanupHistory): lowest revision
/// first, never one a live pod still carries the hash of.
pub fn to_prune<'a>(
    old: &'a [ControllerRevision],
    live_hashes: &[&str],
    limit: i32,
) -> Vec<&'a ControllerRevision> {
    let limit = usize::try_from(limit.max(0)).unwrap_or(0);
    let Some(mut surplus) = old.len().checked_sub(limit).filter(|s| *s > 0) else {
        return Vec::new();
    };
    let mut sorted: Vec<&ControllerRevision> = old.iter().collect();
    sorted.sort_by_key(|r| r.revision);
    let mut pruned = Vec::new();
    for revision in sorted {
        if surplus == 0 {
            break;
        }
        let hash = revision
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(HASH_LABEL));
        if hash.is_some_and(|h| live_hashes.contains(&h.as_str())) {
            continue;
        }
        pruned.push(revision);
        surplus -= 1;
    }
    pruned
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ds(image: &str) -> DaemonSet {
        serde_json::from_value(json!({
            "metadata": {"name": "agent", "namespace": "kube-system", "uid": "u1"},
            "spec": {
                "selector": {"matchLabels": {"app": "agent"}},
                "template": {
                    "metadata": {"labels": {"app": "agent"}},
                    "spec": {"containers": [{"name": "a", "image": image}]},
                },
            },
        }))
        .unwrap()
    }

    fn revision(n: i64, hash: &str) -> ControllerRevision {
        ControllerRevision {
            metadata: ObjectMeta {
                name: Some(format!("agent-{hash}")),
                labels: Some([(HASH_LABEL.to_string(), hash.to_string())].into()),
                ..Default::default()
            },
            data: None,
            revision: n,
        }
    }

    #[test]
    fn a_snapshot_holds_the_template_as_a_replacing_patch() {
        let v1 = ds("agent:1");
        let snap = snapshot(&v1, 3);
        assert_eq!(snap.revision, 3);
        let data = &snap.data.as_ref().unwrap().0;
        assert_eq!(data["spec"]["template"]["$patch"], "replace");
        assert_eq!(
            data["spec"]["template"]["spec"]["containers"][0]["image"],
            "agent:1"
        );
        let hash = hash_of(&v1);
        assert_eq!(
            snap.metadata.name.as_deref(),
            Some(&*format!("agent-{hash}"))
        );
        let labels = snap.metadata.labels.as_ref().unwrap();
        assert_eq!(labels.get(HASH_LABEL), Some(&hash));
        assert_eq!(labels.get("app").map(String::as_str), Some("agent"));
        assert_eq!(
            snap.metadata.owner_references.as_ref().unwrap()[0].kind,
            "DaemonSet"
        );
        assert!(holds_template_of(&v1, &snap));
        assert!(!holds_template_of(&ds("agent:2"), &snap));
        assert_ne!(
            hash,
            hash_of(&ds("agent:2")),
            "another template, another hash"
        );
    }

    #[test]
    fn a_reordered_copy_of_the_data_still_matches() {
        let v1 = ds("agent:1");
        let mut snap = snapshot(&v1, 1);
        let text = serde_json::to_string(&snap.data.as_ref().unwrap().0).unwrap();
        // Same document, keys in reverse order.
        let value: serde_json::Map<String, Value> = serde_json::from_str(&text).unwrap();
        let reversed: serde_json::Map<String, Value> = value.into_iter().rev().collect();
        snap.data = Some(RawExtension(Value::Object(reversed)));
        assert!(holds_template_of(&v1, &snap));
    }

    #[test]
    fn pruning_keeps_the_limit_and_revisions_live_pods_use() {
        let old = vec![
            revision(1, "a"),
            revision(2, "b"),
            revision(3, "c"),
            revision(4, "d"),
        ];
        let names =
            |v: Vec<&ControllerRevision>| -> Vec<i64> { v.iter().map(|r| r.revision).collect() };
        // (limit, live hashes, expected pruned revisions)
        let cases: [(i32, &[&str], Vec<i64>); 5] = [
            (10, &[], vec![]),
            (4, &[], vec![]),
            (2, &[], vec![1, 2]),
            (2, &["a"], vec![2, 3]),
            (0, &["b", "d"], vec![1, 3]),
        ];
        for (limit, live, want) in cases {
            assert_eq!(
                names(to_prune(&old, live, limit)),
                want,
                "limit {limit}, live {live:?}"
            );
        }
    }
}
