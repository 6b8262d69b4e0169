//! Events the controller writes about objects, so that `kubectl describe` and
//! `kubectl get events` say what Tandem did and why.

use k8s_openapi::api::core::v1::Event;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use tandem_api::names;

/// Writes (or refreshes) the Event `reason` about `involved` (its `apiVersion`, `kind`, `name`,
/// `uid` and, when namespaced, `namespace`), in `namespace`: one Event per object and reason, so a repeated report does not
/// pile them up. A failure is logged, never returned: a report is not worth failing a
/// reconcile for.
pub async fn record(
    client: &Client,
    namespace: &str,
    involved: Value,
    reason: &str,
    message: &str,
    warning: bool,
) {
    let object = involved["name"].as_str().unwrap_or_default();
    let name = format!("{object}.tandem-{}", reason.to_ascii_lowercase());
    let now = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let event = json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY}},
        "involvedObject": involved,
        "reason": reason, "message": message,
        "type": if warning { "Warning" } else { "Normal" },
        "firstTimestamp": now, "lastTimestamp": now,
        "reportingComponent": names::CONTROLLER_NAME,
        "source": {"component": names::CONTROLLER_NAME},
    });
    if let Err(e) = Api::<Event>::namespaced(client.clone(), namespace)
        .patch(
            &name,
            &PatchParams::apply(names::FIELD_MANAGER).force(),
            &Patch::Apply(&event),
        )
        .await
    {
        tracing::debug!(%namespace, %object, %reason, error = %e, "writing an Event");
    }
}
