//! The ServiceAccount controller: every active namespace has a `default` ServiceAccount.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tandem_api::client::{is_conflict, is_not_found};

use super::error::{Error, StepExt, drain, retry_after_error};

/// Name of the ServiceAccount every namespace gets.
pub const DEFAULT_SA: &str = "default";

/// Runs the ServiceAccount controller until its watches end.
pub async fn run(client: Client) {
    let controller = Controller::new(
        Api::<Namespace>::all(client.clone()),
        watcher::Config::default(),
    )
    // A deleted `default` ServiceAccount is recreated, as kube does.
    .watches(
        Api::<ServiceAccount>::all(client.clone()),
        watcher::Config::default(),
        |sa: ServiceAccount| {
            (sa.name_any() == DEFAULT_SA)
                .then(|| sa.namespace().map(|ns| ObjectRef::<Namespace>::new(&ns)))
                .flatten()
        },
    );
    drain(
        "serviceaccount",
        controller.run(
            reconcile,
            retry_after_error("serviceaccount"),
            Arc::new(client),
        ),
    )
    .await;
}

async fn reconcile(ns: Arc<Namespace>, client: Arc<Client>) -> Result<Action, Error> {
    let name = ns.name_any();
    let terminating = ns.metadata.deletion_timestamp.is_some()
        || ns.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Terminating");
    if terminating {
        return Ok(Action::await_change());
    }
    let api = Api::<ServiceAccount>::namespaced((*client).clone(), &name);
    match api
        .get_opt(DEFAULT_SA)
        .await
        .step(&name, "reading the default serviceaccount")?
    {
        Some(_) => {}
        None => {
            let sa = ServiceAccount {
                metadata: ObjectMeta {
                    name: Some(DEFAULT_SA.into()),
                    namespace: Some(name.clone()),
                    ..Default::default()
                },
                ..Default::default()
            };
            match api.create(&PostParams::default(), &sa).await {
                // Already there, or the namespace started terminating meanwhile.
                Err(e)
                    if is_conflict(&e)
                        || is_not_found(&e)
                        || tandem_api::client::status_code(&e) == Some(403) => {}
                r => {
                    r.step(&name, "creating the default serviceaccount")?;
                }
            }
        }
    }
    Ok(Action::await_change())
}
