//! Item 6: deletion propagation through ownerReferences, and namespace deletion.

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::common::{Cluster, api_status, eventually};

const HOLD: &str = "tandem.test/hold";

/// An owner ConfigMap and two dependents (a ConfigMap and a Secret) blocking its deletion.
struct Family {
    cms: Api<ConfigMap>,
    secrets: Api<Secret>,
}

impl Family {
    async fn create(cluster: &Cluster, hold_dependent: bool) -> Family {
        let cms: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), "default");
        let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), "default");
        let pp = PostParams::default();
        let owner = cms
            .create(
                &pp,
                &serde_json::from_value(json!({"metadata": {"name": "owner"}})).unwrap(),
            )
            .await
            .unwrap();
        let owner_ref = json!([{
            "apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
            "uid": owner.uid().unwrap(), "blockOwnerDeletion": true,
        }]);
        let finalizers = if hold_dependent {
            json!([HOLD])
        } else {
            json!([])
        };
        cms.create(
            &pp,
            &serde_json::from_value(json!({"metadata": {
                "name": "child", "ownerReferences": owner_ref, "finalizers": finalizers,
            }}))
            .unwrap(),
        )
        .await
        .unwrap();
        secrets
            .create(
                &pp,
                &serde_json::from_value(
                    json!({"metadata": {"name": "child-secret", "ownerReferences": owner_ref}}),
                )
                .unwrap(),
            )
            .await
            .unwrap();
        Family { cms, secrets }
    }

    async fn exists(&self) -> (bool, bool, bool) {
        (
            self.cms.get_opt("owner").await.unwrap().is_some(),
            self.cms.get_opt("child").await.unwrap().is_some(),
            self.secrets
                .get_opt("child-secret")
                .await
                .unwrap()
                .is_some(),
        )
    }

    async fn release_child(&self) {
        self.cms
            .patch(
                "child",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn foreground_deletion_keeps_the_owner_until_its_dependents_are_gone() {
    let cluster = Cluster::start().await;
    let family = Family::create(&cluster, true).await;
    let pending = family
        .cms
        .delete("owner", &DeleteParams::foreground())
        .await
        .expect("delete")
        .left()
        .expect("a foreground delete answers with the object, still present");
    assert!(pending.metadata.deletion_timestamp.is_some());
    assert!(
        pending
            .finalizers()
            .iter()
            .any(|f| f == "foregroundDeletion"),
        "{:?}",
        pending.finalizers()
    );

    // The collector deletes dependents first; the held one stays with a deletionTimestamp.
    eventually("the dependents are being deleted", || async {
        let child = family.cms.get("child").await.ok()?;
        let secret_gone = family.secrets.get_opt("child-secret").await.ok()?.is_none();
        (child.metadata.deletion_timestamp.is_some() && secret_gone).then_some(())
    })
    .await;
    let owner = family
        .cms
        .get("owner")
        .await
        .expect("the owner waits for its dependents");
    assert!(owner.metadata.deletion_timestamp.is_some());
    assert!(owner.finalizers().iter().any(|f| f == "foregroundDeletion"));

    family.release_child().await;
    eventually("owner and dependents gone", || async {
        (family.exists().await == (false, false, false)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn background_deletion_removes_the_owner_then_its_dependents() {
    let cluster = Cluster::start().await;
    let family = Family::create(&cluster, false).await;
    let answer = family
        .cms
        .delete("owner", &DeleteParams::background())
        .await
        .expect("delete");
    assert!(
        answer.is_right(),
        "a background delete without finalizers is immediate: {answer:?}"
    );
    assert_eq!(
        api_status(family.cms.get("owner").await).code,
        404,
        "the owner goes first"
    );
    eventually("dependents collected", || async {
        (family.exists().await == (false, false, false)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn orphan_deletion_keeps_dependents_without_the_owner_reference() {
    let cluster = Cluster::start().await;
    let family = Family::create(&cluster, false).await;
    family
        .cms
        .delete("owner", &DeleteParams::orphan())
        .await
        .expect("delete");
    eventually("the owner is gone", || async {
        family
            .cms
            .get_opt("owner")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    let child = family
        .cms
        .get("child")
        .await
        .expect("the dependent ConfigMap stays");
    let secret = family
        .secrets
        .get("child-secret")
        .await
        .expect("the dependent Secret stays");
    for (name, refs) in [
        ("child", child.owner_references()),
        ("child-secret", secret.owner_references()),
    ] {
        assert!(
            refs.iter().all(|r| r.name != "owner"),
            "{name} lost its ownerReference to the deleted owner: {refs:?}"
        );
    }
}

#[tokio::test]
async fn deleting_a_namespace_deletes_its_content_then_itself() {
    let cluster = Cluster::start().await;
    let namespaces: Api<Namespace> = Api::all(cluster.client.clone());
    let pp = PostParams::default();
    namespaces
        .create(
            &pp,
            &serde_json::from_value(json!({"metadata": {"name": "doomed"}})).unwrap(),
        )
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), "doomed");
    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), "doomed");
    cms.create(
        &pp,
        &serde_json::from_value(json!({"metadata": {"name": "held", "finalizers": [HOLD]}}))
            .unwrap(),
    )
    .await
    .unwrap();
    cms.create(
        &pp,
        &serde_json::from_value(json!({"metadata": {"name": "free"}})).unwrap(),
    )
    .await
    .unwrap();
    secrets
        .create(
            &pp,
            &serde_json::from_value(json!({"metadata": {"name": "s"}})).unwrap(),
        )
        .await
        .unwrap();

    namespaces
        .delete("doomed", &DeleteParams::default())
        .await
        .expect("delete");
    let ns = namespaces
        .get("doomed")
        .await
        .expect("the namespace waits for its content");
    assert!(ns.metadata.deletion_timestamp.is_some());
    assert_eq!(
        ns.status.and_then(|s| s.phase).as_deref(),
        Some("Terminating")
    );

    eventually("the content is being deleted", || async {
        let held = cms.get("held").await.ok()?;
        let free_gone = cms.get_opt("free").await.ok()?.is_none();
        let secret_gone = secrets.get_opt("s").await.ok()?.is_none();
        (held.metadata.deletion_timestamp.is_some() && free_gone && secret_gone).then_some(())
    })
    .await;
    let refused = api_status(
        cms.create(
            &pp,
            &serde_json::from_value(json!({"metadata": {"name": "late"}})).unwrap(),
        )
        .await,
    );
    assert_eq!(
        refused.code, 403,
        "no creates in a terminating namespace: {refused:?}"
    );
    assert!(
        namespaces.get_opt("doomed").await.unwrap().is_some(),
        "still terminating"
    );

    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    eventually("the namespace is gone", || async {
        namespaces
            .get_opt("doomed")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
}

/// kube-apiserver's batch/v1 Jobs orphan their pods when a delete names no propagation
/// policy (a client such as kube-rs sends none by default); asking for Background deletes
/// them.
#[tokio::test]
async fn deleting_a_job_orphans_its_pods_unless_asked_otherwise() {
    use k8s_openapi::api::batch::v1::Job;
    use k8s_openapi::api::core::v1::Pod;
    let cluster = Cluster::start().await;
    let jobs: Api<Job> = Api::namespaced(cluster.client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "default");
    for (job, params) in [
        ("kept", DeleteParams::default()),
        ("gone", DeleteParams::background()),
    ] {
        let created = jobs
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": job}, "spec": {"template": {
                    "spec": {"restartPolicy": "Never",
                             "containers": [{"name": "c", "image": "busybox"}]}}}}))
                .unwrap(),
            )
            .await
            .unwrap();
        let owner = json!([{"apiVersion": "batch/v1", "kind": "Job", "name": job,
            "uid": created.uid().unwrap(), "controller": true, "blockOwnerDeletion": true}]);
        pods.create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": format!("{job}-pod"), "ownerReferences": owner},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
        jobs.delete(job, &params).await.expect("delete");
        eventually("the job is gone", || async {
            jobs.get_opt(job).await.ok()?.is_none().then_some(())
        })
        .await;
    }
    let kept = pods.get("kept-pod").await.expect("the orphaned pod stays");
    assert!(
        kept.owner_references().is_empty(),
        "{:?}",
        kept.owner_references()
    );
    eventually("the background deletion removes the pod", || async {
        pods.get_opt("gone-pod").await.ok()?.is_none().then_some(())
    })
    .await;
}
