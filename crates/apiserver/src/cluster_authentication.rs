//! The ConfigMap `kube-system/extension-apiserver-authentication`, kept as kube-apiserver's
//! cluster-authentication-trust controller keeps it: `client-ca-file` names the CAs whose
//! client certificates the cluster's components (virtual kubelets among them) should accept.
//! Also the Role kube bootstraps to read it, granted to no one here.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

use crate::error::{ApiError, ApiResult};
use crate::state::State;

/// Namespace of the ConfigMap and its reader Role.
pub const NAMESPACE: &str = "kube-system";
/// Name of the ConfigMap.
pub const CONFIG_MAP: &str = "extension-apiserver-authentication";
/// The key holding the PEM bundle of client CAs.
pub const CLIENT_CA_KEY: &str = "client-ca-file";
/// The Role that may read the ConfigMap (kube-apiserver's bootstrap name).
pub const READER_ROLE: &str = "extension-apiserver-authentication-reader";
/// How often the ConfigMap is checked even without a change (kube's controller resyncs
/// once a minute too).
const RESYNC: Duration = Duration::from_secs(60);
/// Storage key of ConfigMaps (core group).
const CONFIG_MAPS_KEY: &str = "/configmaps";

/// The client CAs, PEM: the cluster CA, which signs users' and nodes' certificates, then
/// the API server's own kubelet-client CA, which signs the certificate it shows kubelets.
pub fn client_ca_bundle(state: &State) -> String {
    [&state.pki.ca.cert_pem, &state.kubelets.ca.cert_pem]
        .iter()
        .map(|pem| format!("{}\n", pem.trim_end()))
        .collect()
}

/// `extension-apiserver-authentication-reader` as kube-apiserver bootstraps it: get, list
/// and watch on that one ConfigMap.
pub fn reader_role() -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {
            "name": READER_ROLE,
            "namespace": NAMESPACE,
            "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
            "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
        },
        "rules": [{
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [CONFIG_MAP],
            "verbs": ["get", "list", "watch"],
        }],
    })
}

/// Creates the ConfigMap, or sets its `client-ca-file` to the current bundle; other keys
/// are kept and an up-to-date ConfigMap is not written again.
pub(crate) fn publish(state: &State) -> ApiResult<()> {
    let res = state
        .registry
        .read()
        .preferred("", "configmaps")
        .ok_or_else(|| ApiError::internal("built-in resource configmaps missing"))?;
    let bundle = client_ca_bundle(state);
    match state.store.get(&res.storage_key(), NAMESPACE, CONFIG_MAP) {
        None => {
            let mut obj = json!({
                "apiVersion": res.api_version(),
                "kind": res.kind,
                "metadata": {"name": CONFIG_MAP, "namespace": NAMESPACE},
                "data": {CLIENT_CA_KEY: bundle},
            });
            crate::objects::prepare_create(&res, &mut obj);
            state.create_object(&res, NAMESPACE, CONFIG_MAP, &mut obj)?;
        }
        // Being deleted: published again once it is gone.
        Some(doc) if doc.deleting => {}
        Some(doc) => {
            let old = doc.value();
            if old["data"][CLIENT_CA_KEY].as_str() == Some(bundle.as_str()) {
                return Ok(());
            }
            let mut obj = old.clone();
            if !obj["data"].is_object() {
                obj["data"] = json!({});
            }
            obj["data"][CLIENT_CA_KEY] = json!(bundle);
            crate::objects::prepare_update(&res, &old, &mut obj, "");
            state.update_object(&res, NAMESPACE, CONFIG_MAP, doc.rv, &mut obj)?;
        }
    }
    Ok(())
}

/// Publishes again whenever the ConfigMap changes or goes, and every minute, until the
/// process ends.
pub(crate) async fn run(state: Arc<State>) {
    let mut feed = state.store.feed();
    let mut resync = tokio::time::interval(RESYNC);
    loop {
        tokio::select! {
            event = feed.recv() => match event {
                Ok(event) if !is_ours(&event.key, &event.doc.namespace, &event.doc.name) => continue,
                Ok(_) => {}
                Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => return,
            },
            _ = resync.tick() => {}
        }
        if let Err(e) = publish(&state) {
            tracing::warn!("publishing {NAMESPACE}/{CONFIG_MAP}: {e}");
        }
    }
}

/// Whether a change in the store is to the published ConfigMap.
fn is_ours(key: &str, namespace: &str, name: &str) -> bool {
    key == CONFIG_MAPS_KEY && namespace == NAMESPACE && name == CONFIG_MAP
}
