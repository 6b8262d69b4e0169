//! Item 1: CRUD through `Api<K>` on built-in types and on a kube-derive CRD.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, PodSpec};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

use super::common::{Cluster, Widget, WidgetStatus, api_status, widget};

fn config_map(name: &str, app: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([("app".to_string(), app.to_string())])),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..Default::default()
    }
}

fn names<K: kube::Resource>(list: &[K]) -> Vec<String> {
    let mut names: Vec<String> = list.iter().map(|o| o.name_any()).collect();
    names.sort();
    names
}

#[tokio::test]
async fn builtin_config_map_crud_with_selectors_and_every_patch_type() {
    let cluster = Cluster::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), "default");
    let pp = PostParams::default();
    for (name, app) in [("web-1", "web"), ("web-2", "web"), ("db-1", "db")] {
        let created = cms
            .create(&pp, &config_map(name, app, &[("k", name)]))
            .await
            .expect("create");
        assert_eq!(created.name_any(), name);
        assert!(created.uid().is_some(), "{name} gets a uid on create");
        assert!(created.resource_version().is_some());
    }
    assert_eq!(
        api_status(cms.create(&pp, &config_map("db-1", "db", &[])).await).code,
        409,
        "creating an existing name is a conflict"
    );

    let got = cms.get("web-2").await.expect("get");
    assert_eq!(got.data.unwrap()["k"], "web-2");

    // Table: selector → expected names.
    let cases = [
        (
            ListParams::default().labels("app=web"),
            vec!["web-1", "web-2"],
        ),
        (ListParams::default().labels("app!=web"), vec!["db-1"]),
        (
            ListParams::default().labels("app in (db,cache)"),
            vec!["db-1"],
        ),
        (
            ListParams::default().fields("metadata.name=web-1"),
            vec!["web-1"],
        ),
        (
            ListParams::default()
                .labels("app=web")
                .fields("metadata.name!=web-1"),
            vec!["web-2"],
        ),
        (ListParams::default().labels("app=none"), vec![]),
    ];
    for (lp, want) in cases {
        let list = cms.list(&lp).await.expect("list");
        assert_eq!(
            names(&list.items),
            want,
            "labels {:?} fields {:?}",
            lp.label_selector,
            lp.field_selector
        );
        assert!(
            list.metadata.resource_version.is_some(),
            "lists carry a resourceVersion"
        );
    }

    let unsupported = api_status(
        cms.list(&ListParams::default().fields("data.k=web-1"))
            .await,
    );
    assert_eq!(unsupported.code, 400, "{unsupported:?}");
    assert!(
        unsupported.message.contains("data.k"),
        "the refusal names the field label: {:?}",
        unsupported.message
    );

    // Replace: the whole object, with the resourceVersion read.
    let mut cm = cms.get("web-1").await.expect("get");
    let old_rv = cm.resource_version();
    cm.data = Some(BTreeMap::from([("replaced".into(), "yes".into())]));
    let replaced = cms.replace("web-1", &pp, &cm).await.expect("replace");
    assert_eq!(
        replaced.data.clone().unwrap(),
        BTreeMap::from([("replaced".into(), "yes".into())])
    );
    assert_ne!(
        replaced.resource_version(),
        old_rv,
        "a write bumps resourceVersion"
    );

    // Merge patch adds a key and keeps the others.
    let merged = cms
        .patch(
            "web-1",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"data": {"added": "1"}, "metadata": {"labels": {"tier": "front"}}}),
            ),
        )
        .await
        .expect("merge patch");
    assert_eq!(merged.data.as_ref().unwrap()["replaced"], "yes");
    assert_eq!(merged.data.as_ref().unwrap()["added"], "1");
    assert_eq!(merged.labels()["tier"], "front");
    assert_eq!(merged.labels()["app"], "web");

    // JSON patch: test-and-replace, remove.
    // The Patch type comes from kube's json-patch; inference names it for us.
    let patch = serde_json::from_value(json!([
        {"op": "test", "path": "/data/added", "value": "1"},
        {"op": "replace", "path": "/data/added", "value": "2"},
        {"op": "remove", "path": "/data/replaced"},
    ]))
    .unwrap();
    let patched = cms
        .patch("web-1", &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
        .expect("json patch");
    assert_eq!(
        patched.data.unwrap(),
        BTreeMap::from([("added".into(), "2".into())])
    );
    // generateName: the server picks a unique name with the prefix.
    let mut generated = config_map("", "gen", &[]);
    generated.metadata.name = None;
    generated.metadata.generate_name = Some("gen-".into());
    let (a, b) = (
        cms.create(&pp, &generated)
            .await
            .expect("generateName create"),
        cms.create(&pp, &generated)
            .await
            .expect("generateName create"),
    );
    for name in [a.name_any(), b.name_any()] {
        assert!(name.starts_with("gen-") && name.len() > 4, "{name}");
    }
    assert_ne!(a.name_any(), b.name_any());
    // Delete: gone from get and list.
    cms.delete("web-1", &DeleteParams::default())
        .await
        .expect("delete");
    let missing = api_status(cms.get("web-1").await);
    assert_eq!(missing.code, 404);
    assert_eq!(missing.reason, "NotFound");
    assert!(
        missing.message.contains(r#"configmaps "web-1" not found"#),
        "{:?}",
        missing.message
    );
    assert_eq!(
        names(
            &cms.list(&ListParams::default().labels("app=web"))
                .await
                .unwrap()
                .items
        ),
        vec!["web-2"]
    );
    assert_eq!(
        api_status(cms.delete("web-1", &DeleteParams::default()).await).code,
        404
    );
}

#[tokio::test]
async fn strategic_merge_patch_merges_containers_by_name() {
    let cluster = Cluster::start().await;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "default");
    let container = |name: &str, image: &str| Container {
        name: name.into(),
        image: Some(image.into()),
        ..Default::default()
    };
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("two".into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![container("app", "app:1"), container("sidecar", "proxy:1")],
            ..Default::default()
        }),
        ..Default::default()
    };
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    let patched = pods
        .patch(
            "two",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"spec": {"containers": [{"name": "sidecar", "image": "proxy:2"}]}}),
            ),
        )
        .await
        .expect("strategic patch");
    let images: Vec<(String, Option<String>)> = patched
        .spec
        .unwrap()
        .containers
        .into_iter()
        .map(|c| (c.name, c.image))
        .collect();
    assert_eq!(
        images,
        vec![
            ("app".to_string(), Some("app:1".to_string())),
            ("sidecar".to_string(), Some("proxy:2".to_string())),
        ],
        "strategic merge keeps the other container and updates the named one"
    );
}

#[tokio::test]
async fn custom_resource_crud_separates_spec_from_status() {
    let cluster = Cluster::start().await;
    cluster.install_widget_crd().await;
    let widgets: Api<Widget> = Api::namespaced(cluster.client.clone(), "default");
    let pp = PostParams::default();

    let mut w = widget("gear", 3, "red");
    w.status = Some(WidgetStatus {
        ready: true,
        message: None,
    });
    let created = widgets.create(&pp, &w).await.expect("create widget");
    assert_eq!(created.spec.size, 3);
    assert_eq!(
        created.status, None,
        "status is not set through the main resource on create"
    );
    assert_eq!(created.metadata.generation, Some(1));

    let listed = widgets.list(&ListParams::default()).await.expect("list");
    assert_eq!(names(&listed.items), vec!["gear"]);

    // replace_status sets status, ignores a spec change, keeps generation.
    let mut s = widgets.get("gear").await.unwrap();
    s.spec.size = 9;
    s.status = Some(WidgetStatus {
        ready: true,
        message: Some("assembled".into()),
    });
    let after_status = widgets
        .replace_status("gear", &pp, &s)
        .await
        .expect("replace_status");
    assert_eq!(
        after_status.spec.size, 3,
        "the status subresource ignores spec"
    );
    assert_eq!(
        after_status.status.as_ref().unwrap().message.as_deref(),
        Some("assembled")
    );
    assert_eq!(
        after_status.metadata.generation,
        Some(1),
        "status writes keep generation"
    );

    // Replacing the main resource changes spec, ignores status, bumps generation.
    let mut m = after_status.clone();
    m.spec.color = "blue".into();
    m.status = Some(WidgetStatus {
        ready: false,
        message: Some("overwritten?".into()),
    });
    let after_replace = widgets.replace("gear", &pp, &m).await.expect("replace");
    assert_eq!(after_replace.spec.color, "blue");
    assert_eq!(
        after_replace.status, after_status.status,
        "a replace of the main resource ignores status"
    );
    assert_eq!(
        after_replace.metadata.generation,
        Some(2),
        "a spec change bumps generation"
    );

    // patch_status changes only status.
    let after_patch_status = widgets
        .patch_status(
            "gear",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 7}, "status": {"ready": false}})),
        )
        .await
        .expect("patch_status");
    assert_eq!(after_patch_status.spec.size, 3);
    assert!(!after_patch_status.status.as_ref().unwrap().ready);
    assert_eq!(after_patch_status.metadata.generation, Some(2));

    // A metadata-only change keeps generation; a spec patch bumps it.
    let labelled = widgets
        .patch(
            "gear",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "a"}}})),
        )
        .await
        .expect("label patch");
    assert_eq!(
        labelled.metadata.generation,
        Some(2),
        "metadata changes keep generation"
    );
    let resized = widgets
        .patch(
            "gear",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 5}, "status": {"ready": true}})),
        )
        .await
        .expect("spec patch");
    assert_eq!(resized.spec.size, 5);
    assert!(
        !resized.status.as_ref().unwrap().ready,
        "main-resource patch ignores status"
    );
    assert_eq!(resized.metadata.generation, Some(3));

    widgets
        .delete("gear", &DeleteParams::default())
        .await
        .expect("delete");
    assert_eq!(api_status(widgets.get("gear").await).code, 404);
}

/// A JSON patch whose `test` op fails is 422 on a kube-apiserver (patch.go: applyJSPatch),
/// and changes nothing.
#[tokio::test]
async fn json_patch_with_a_failing_test_op_is_unprocessable() {
    let cluster = Cluster::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), "default");
    cms.create(
        &PostParams::default(),
        &config_map("cfg", "web", &[("k", "1")]),
    )
    .await
    .unwrap();
    let failing = serde_json::from_value(json!([
        {"op": "test", "path": "/data/k", "value": "2"},
        {"op": "replace", "path": "/data/k", "value": "3"},
    ]))
    .unwrap();
    let status = api_status(
        cms.patch("cfg", &PatchParams::default(), &Patch::<()>::Json(failing))
            .await,
    );
    assert_eq!(status.code, 422, "{status:?}");
    assert_eq!(cms.get("cfg").await.unwrap().data.unwrap()["k"], "1");
}

/// RFC 6902 `test` of `null` on an absent member passes on a kube-apiserver (evanphx/json-patch
/// treats a missing key as null); kube-runtime's `finalizer` helper relies on it to add the
/// first finalizer of an object.
#[tokio::test]
async fn json_patch_test_of_null_on_an_absent_member_passes() {
    let cluster = Cluster::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), "default");
    cms.create(
        &PostParams::default(),
        &config_map("cfg", "web", &[("k", "1")]),
    )
    .await
    .unwrap();
    let patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers", "value": null},
        {"op": "add", "path": "/metadata/finalizers", "value": ["tandem.test/first"]},
    ]))
    .unwrap();
    let patched = cms
        .patch("cfg", &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
        .expect("test null on an absent member passes");
    assert_eq!(patched.finalizers(), ["tandem.test/first"]);
}

/// DELETE on a collection answers with the list of deleted objects (the registry's
/// DeleteCollection returns the listed items), which kube decodes as `ObjectList<K>`.
#[tokio::test]
async fn delete_collection_removes_only_the_selected_objects() {
    let cluster = Cluster::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), "default");
    let pp = PostParams::default();
    for (name, app) in [("gen-1", "gen"), ("gen-2", "gen"), ("keep", "other")] {
        cms.create(&pp, &config_map(name, app, &[])).await.unwrap();
    }
    let deleted = cms
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("app=gen"),
        )
        .await
        .expect("delete collection")
        .left()
        .expect("a list of the deleted objects");
    assert_eq!(names(&deleted.items), vec!["gen-1", "gen-2"]);
    assert_eq!(
        names(&cms.list(&ListParams::default()).await.unwrap().items),
        vec!["keep"]
    );
}
