//! Pods and the workload controllers that own them: the controller ownerReference, the
//! controllers a pod event concerns (its owner, or those that may adopt it), the pods created
//! from a template, and label selection.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::Resource;
use kube::core::{Selector, SelectorExt};

/// The controller ownerReference of an object, if any.
pub(crate) fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|r| r.controller == Some(true))
}

/// The controllers of kind `K` a pod event concerns: its controller if it is a `K`, else (an
/// orphan) those of its namespace whose selector matches it, which may adopt it.
pub(crate) fn pod_controllers<K>(
    store: &kube::runtime::reflector::Store<K>,
    pod: &Pod,
    selector: impl Fn(&K) -> Option<&LabelSelector>,
) -> Vec<kube::runtime::reflector::ObjectRef<K>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    use kube::runtime::reflector::ObjectRef;
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    match controller_of(&pod.metadata) {
        Some(owner) if owner.kind == K::kind(&()) => {
            vec![ObjectRef::<K>::new(&owner.name).within(&ns)]
        }
        Some(_) => Vec::new(),
        None => store
            .state()
            .iter()
            .filter(|o| o.meta().namespace.as_deref() == Some(ns.as_str()))
            .filter(|o| selector(o).is_some_and(|s| selects(s, pod.metadata.labels.as_ref())))
            .map(|o| ObjectRef::from_obj(o.as_ref()))
            .collect(),
    }
}

/// The pod a workload controller creates from its pod template: `<owner>-<random>`, owned by it
/// (kube's GetPodFromTemplate).
pub(crate) fn pod_from_template(
    template: k8s_openapi::api::core::v1::PodTemplateSpec,
    owner_name: &str,
    ns: &str,
    owner: OwnerReference,
) -> Pod {
    let meta = template.metadata.unwrap_or_default();
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("{owner_name}-")),
            namespace: Some(ns.to_string()),
            labels: meta.labels,
            annotations: meta.annotations,
            finalizers: meta.finalizers,
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: template.spec,
        status: None,
    }
}

/// Whether `selector` selects `labels`. An empty or unparsable selector selects nothing,
/// as a workload controller must never grab every pod of a namespace.
pub(crate) fn selects(selector: &LabelSelector, labels: Option<&BTreeMap<String, String>>) -> bool {
    let Ok(selector) = Selector::try_from(selector.clone()) else {
        return false;
    };
    if selector.selects_all() {
        return false;
    }
    selector.matches(labels.unwrap_or(&BTreeMap::new()))
}
