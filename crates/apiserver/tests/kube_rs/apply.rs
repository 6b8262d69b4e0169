//! Item 4: server-side apply conflicts between field managers, and force.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::common::{Cluster, Widget, WidgetStatus, api_status};

fn applied(data: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "shared"}, "data": data})
}

#[tokio::test]
async fn apply_conflict_names_the_other_manager_and_force_takes_the_field() {
    let cluster = Cluster::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), "default");

    let created = cms
        .patch(
            "shared",
            &PatchParams::apply("alpha"),
            &Patch::Apply(applied(json!({"color": "red", "size": "1"}))),
        )
        .await
        .expect("the first apply creates the object");
    assert_eq!(created.data.unwrap()["color"], "red");

    // The same manager re-applying its own value is no conflict.
    cms.patch(
        "shared",
        &PatchParams::apply("alpha"),
        &Patch::Apply(applied(json!({"color": "red", "size": "1"}))),
    )
    .await
    .expect("idempotent re-apply");

    let status = api_status(
        cms.patch(
            "shared",
            &PatchParams::apply("beta"),
            &Patch::Apply(applied(json!({"color": "blue"}))),
        )
        .await,
    );
    assert_eq!(status.code, 409, "{status:?}");
    assert_eq!(status.reason, "Conflict", "{status:?}");
    assert!(
        status.message.contains("alpha") && status.message.contains(".data.color"),
        "the conflict names the other manager and the field: {:?}",
        status.message
    );
    assert_eq!(
        cms.get("shared").await.unwrap().data.unwrap()["color"],
        "red",
        "a refused apply changes nothing"
    );

    let forced = cms
        .patch(
            "shared",
            &PatchParams::apply("beta").force(),
            &Patch::Apply(applied(json!({"color": "blue"}))),
        )
        .await
        .expect("forced apply");
    let data = forced.data.clone().unwrap();
    assert_eq!(data["color"], "blue", "force wins the field");
    assert_eq!(data["size"], "1", "alpha's other field stays");

    let managed = forced.metadata.managed_fields.clone().unwrap_or_default();
    let fields_of = |manager: &str| -> String {
        managed
            .iter()
            .filter(|m| m.manager.as_deref() == Some(manager))
            .map(|m| {
                assert_eq!(m.operation.as_deref(), Some("Apply"), "{manager}: {m:?}");
                serde_json::to_string(&m.fields_v1).unwrap()
            })
            .collect()
    };
    let (alpha, beta) = (fields_of("alpha"), fields_of("beta"));
    assert!(
        alpha.contains("f:size") && !alpha.contains("f:color"),
        "alpha lost color: {alpha}"
    );
    assert!(
        beta.contains("f:color") && !beta.contains("f:size"),
        "beta owns color: {beta}"
    );

    // Now alpha is the one in conflict.
    let status = api_status(
        cms.patch(
            "shared",
            &PatchParams::apply("alpha"),
            &Patch::Apply(applied(json!({"color": "red", "size": "1"}))),
        )
        .await,
    );
    assert_eq!(status.code, 409);
    assert!(status.message.contains("beta"), "{:?}", status.message);
}

/// kube-apiserver lists each conflict as a `FieldManagerConflict` cause (field path and
/// `conflict with "<manager>"`), which clients such as kubectl and Flux read.
#[tokio::test]
async fn apply_conflict_lists_each_field_as_a_cause() {
    let cluster = Cluster::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), "default");
    cms.patch(
        "shared",
        &PatchParams::apply("alpha"),
        &Patch::Apply(applied(json!({"color": "red"}))),
    )
    .await
    .unwrap();
    let status = api_status(
        cms.patch(
            "shared",
            &PatchParams::apply("beta"),
            &Patch::Apply(applied(json!({"color": "blue"}))),
        )
        .await,
    );
    assert_eq!(status.code, 409);
    let causes: Vec<(String, String, String)> = status
        .details
        .as_ref()
        .map(|d| {
            d.causes
                .iter()
                .map(|c| (c.reason.clone(), c.field.clone(), c.message.clone()))
                .collect()
        })
        .unwrap_or_default();
    assert!(
        causes
            .iter()
            .any(|(reason, field, message)| reason == "FieldManagerConflict"
                && field == ".data.color"
                && message.contains("alpha")),
        "causes carry the conflicting field and manager: {causes:?}"
    );
}

/// The controller-rs pattern: spec applied by one manager, status applied through the status
/// subresource by the controller; neither write touches the other half.
#[tokio::test]
async fn apply_to_spec_and_to_the_status_subresource_stay_separate() {
    let cluster = Cluster::start().await;
    cluster.install_widget_crd().await;
    let widgets: Api<Widget> = Api::namespaced(cluster.client.clone(), "default");
    let body = |spec: serde_json::Value, status: serde_json::Value| {
        json!({
            "apiVersion": "tandem.test/v1", "kind": "Widget",
            "metadata": {"name": "cog"}, "spec": spec, "status": status,
        })
    };
    let created = widgets
        .patch(
            "cog",
            &PatchParams::apply("author"),
            &Patch::Apply(body(
                json!({"size": 2, "color": "red"}),
                json!({"ready": true}),
            )),
        )
        .await
        .expect("apply creates the widget");
    assert_eq!(created.spec.size, 2);
    assert_eq!(
        created.status, None,
        "status sent to the main resource is ignored"
    );
    assert_eq!(created.metadata.generation, Some(1));

    let status = json!({"apiVersion": "tandem.test/v1", "kind": "Widget", "status": {"ready": true, "message": "ok"}});
    let reported = widgets
        .patch_status(
            "cog",
            &PatchParams::apply("widget-controller").force(),
            &Patch::Apply(status),
        )
        .await
        .expect("status apply");
    assert_eq!(
        reported.status,
        Some(WidgetStatus {
            ready: true,
            message: Some("ok".into())
        })
    );
    assert_eq!(reported.spec.size, 2, "a status apply keeps spec");
    assert_eq!(
        reported.metadata.generation,
        Some(1),
        "a status apply keeps generation"
    );

    let resized = widgets
        .patch(
            "cog",
            &PatchParams::apply("author"),
            &Patch::Apply(body(json!({"size": 3, "color": "red"}), json!(null))),
        )
        .await
        .expect("spec re-apply");
    assert_eq!(resized.spec.size, 3);
    assert_eq!(resized.metadata.generation, Some(2));
    assert_eq!(
        resized.status, reported.status,
        "the author's apply leaves the controller's status alone"
    );
    let managers: Vec<(String, String)> = resized
        .metadata
        .managed_fields
        .unwrap_or_default()
        .iter()
        .map(|m| {
            (
                m.manager.clone().unwrap_or_default(),
                m.subresource.clone().unwrap_or_default(),
            )
        })
        .collect();
    for want in [("author", ""), ("widget-controller", "status")] {
        assert!(
            managers.contains(&(want.0.to_string(), want.1.to_string())),
            "{want:?} (manager, subresource) in {managers:?}"
        );
    }
}

/// An apply that creates its object is authorized as a create too (kube-apiserver's patch
/// handler checks `create` when the patch creates): `patch` alone updates but does not create.
#[tokio::test]
async fn apply_that_creates_needs_the_create_permission() {
    use k8s_openapi::api::rbac::v1::ClusterRole;
    use kube::api::PostParams;

    let cluster = Cluster::start().await;
    let grant = |verbs: &[&str]| {
        let role: ClusterRole = serde_json::from_value(json!({
            "metadata": {"name": "configmap-writer"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": verbs}],
        }))
        .unwrap();
        let roles = Api::<ClusterRole>::all(cluster.client.clone());
        async move {
            roles
                .patch(
                    "configmap-writer",
                    &PatchParams::apply("test").force(),
                    &Patch::Apply(&role),
                )
                .await
                .unwrap();
        }
    };
    grant(&["patch"]).await;
    cluster
        .bind_cluster_role("erin-writes-configmaps", "configmap-writer", "User", "erin")
        .await;
    let erin = Api::<ConfigMap>::namespaced(cluster.client_for("erin", &[]).await, "default");
    let admin = Api::<ConfigMap>::namespaced(cluster.client.clone(), "default");
    let apply = |name: &str, value: &str| {
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": name}, "data": {"k": value}});
        let erin = erin.clone();
        let name = name.to_string();
        async move {
            erin.patch(
                &name,
                &PatchParams::apply("erin").force(),
                &Patch::Apply(&cm),
            )
            .await
        }
    };

    let refused = api_status(apply("new", "1").await);
    assert_eq!(refused.code, 403, "{refused:?}");
    assert!(
        refused
            .message
            .contains("cannot create resource \"configmaps\""),
        "{}",
        refused.message
    );
    assert!(
        admin.get_opt("new").await.unwrap().is_none(),
        "nothing created"
    );

    // What exists, `patch` may change.
    admin
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "old"}, "data": {"k": "0"}}))
                .unwrap(),
        )
        .await
        .unwrap();
    apply("old", "2").await.expect("patch permission updates");
    assert_eq!(admin.get("old").await.unwrap().data.unwrap()["k"], "2");

    grant(&["patch", "create"]).await;
    super::common::eventually("apply creates with patch and create", || async {
        apply("new", "3").await.ok()
    })
    .await;
    assert_eq!(admin.get("new").await.unwrap().data.unwrap()["k"], "3");
}
