//! Item 3: a `kube::runtime::Controller` with the `finalizer` helper on a CRD.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{self, Event, finalizer};
use kube::runtime::watcher;
use parking_lot::Mutex;
use serde_json::json;

use super::common::{Cluster, Widget, eventually, widget};

const FINALIZER: &str = "widgets.tandem.test/teardown";

/// What the reconciler shares: the client and a log of cleanups it ran.
struct Context {
    client: kube::Client,
    cleaned: Mutex<Vec<String>>,
}

type ReconcileError = finalizer::Error<kube::Error>;

async fn reconcile(w: Arc<Widget>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let api: Api<Widget> = Api::namespaced(ctx.client.clone(), &w.namespace().unwrap_or_default());
    finalizer(&api, FINALIZER, w, |event| async {
        match event {
            Event::Apply(w) => {
                let status =
                    json!({"status": {"ready": true, "message": format!("{} parts", w.spec.size)}});
                api.patch_status(
                    &w.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(status),
                )
                .await?;
                Ok(Action::await_change())
            }
            Event::Cleanup(w) => {
                ctx.cleaned.lock().push(w.name_any());
                Ok(Action::await_change())
            }
        }
    })
    .await
}

fn error_policy(_: Arc<Widget>, _: &ReconcileError, _: Arc<Context>) -> Action {
    Action::requeue(Duration::from_millis(100))
}

/// Runs the controller against one Widget created with `other_finalizers` already set
/// (kube's finalizer helper takes a different JSON patch path when the list is empty).
async fn reconcile_and_delete_one_widget(other_finalizers: &[&str]) {
    let cluster = Cluster::start().await;
    cluster.install_widget_crd().await;
    let widgets: Api<Widget> = Api::namespaced(cluster.client.clone(), "default");
    let ctx = Arc::new(Context {
        client: cluster.client.clone(),
        cleaned: Mutex::new(Vec::new()),
    });
    let controller = tokio::spawn(
        Controller::new(widgets.clone(), watcher::Config::default())
            .run(reconcile, error_policy, ctx.clone())
            .for_each(|_| async {}),
    );

    let mut w = widget("gear", 4, "green");
    w.metadata.finalizers = Some(other_finalizers.iter().map(|f| f.to_string()).collect());
    widgets
        .create(&PostParams::default(), &w)
        .await
        .expect("create");
    let reconciled = eventually("finalizer added and status set", || {
        let widgets = widgets.clone();
        async move {
            let w = widgets.get("gear").await.ok()?;
            (w.finalizers().iter().any(|f| f == FINALIZER) && w.status.as_ref()?.ready).then_some(w)
        }
    })
    .await;
    assert_eq!(
        reconciled.status.as_ref().unwrap().message.as_deref(),
        Some("4 parts")
    );
    for other in other_finalizers {
        assert!(
            reconciled.finalizers().iter().any(|f| f == other),
            "{other} kept"
        );
    }
    assert!(ctx.cleaned.lock().is_empty(), "no cleanup before deletion");

    widgets
        .delete("gear", &DeleteParams::default())
        .await
        .expect("delete accepted");
    if !other_finalizers.is_empty() {
        // Our cleanup runs and our finalizer goes; the others still hold the object.
        let held = eventually("our finalizer removed after cleanup", || {
            let widgets = widgets.clone();
            async move {
                let w = widgets.get("gear").await.ok()?;
                (!w.finalizers().iter().any(|f| f == FINALIZER)).then_some(w)
            }
        })
        .await;
        assert!(held.metadata.deletion_timestamp.is_some());
        widgets
            .patch(
                "gear",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await
            .expect("release the other finalizers");
    }
    eventually("the widget is gone after cleanup", || {
        let widgets = widgets.clone();
        async move { widgets.get_opt("gear").await.ok()?.is_none().then_some(()) }
    })
    .await;
    assert_eq!(
        *ctx.cleaned.lock(),
        vec!["gear".to_string()],
        "cleanup ran exactly once"
    );
    controller.abort();
}

#[tokio::test]
async fn controller_with_finalizer_sets_status_and_cleans_up_before_deletion() {
    reconcile_and_delete_one_widget(&[]).await;
}

#[tokio::test]
async fn controller_with_finalizer_alongside_another_finalizer() {
    reconcile_and_delete_one_widget(&["tandem.test/keep"]).await;
}
