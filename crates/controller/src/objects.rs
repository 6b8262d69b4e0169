//! Writing Tandem's objects: server-side apply with Tandem's field manager, and Tandem's
//! finalizer.

use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use tandem_api::names;

/// Adds Tandem's finalizer to `obj`; the write carries `obj`'s resourceVersion, so it fails
/// (and the reconcile runs again) if the object changed meanwhile.
pub async fn add_finalizer<K>(api: &Api<K>, obj: &K) -> Result<(), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut finalizers = obj.finalizers().to_vec();
    finalizers.push(names::FINALIZER.to_string());
    api.patch(
        &obj.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": finalizers,
            "resourceVersion": obj.resource_version()}})),
    )
    .await?;
    Ok(())
}

/// Removes Tandem's finalizer from `obj` (other finalizers stay).
pub async fn remove_finalizer<K>(api: &Api<K>, obj: &K) -> Result<(), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let finalizers: Vec<&String> = obj
        .finalizers()
        .iter()
        .filter(|f| *f != names::FINALIZER)
        .collect();
    api.patch(
        &obj.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": finalizers}})),
    )
    .await?;
    Ok(())
}

/// Server-side applies `obj` with Tandem's field manager.
pub async fn apply<K>(api: &Api<K>, obj: &K) -> Result<K, kube::Error>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    let name = obj.meta().name.clone().unwrap_or_default();
    api.patch(
        &name,
        &PatchParams::apply(names::FIELD_MANAGER).force(),
        &Patch::Apply(obj),
    )
    .await
}
