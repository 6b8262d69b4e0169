//! The state every request shares (settings, store, served resources, RBAC index, keys), and
//! the writes that keep its in-memory indexes in step with the store: the RBAC index, and the
//! resources CRDs serve together with each CRD's status and cleanup on deletion.

use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::RwLock;
use serde_json::{Value, json};
use tandem_apimachinery::rbac::RbacIndex;

use crate::crd::resource_infos;
use crate::error::{ApiError, ApiResult};
use crate::pki::ClusterPki;
use crate::registry::{Registry, ResourceInfo};
use crate::store::{Doc, Store, StoreError};
use crate::webhook::WebhookClient;

/// How to run a server.
#[derive(Clone, Debug)]
pub struct Config {
    /// Name of the cluster (CA common name, kubeconfig cluster and context names).
    pub name: String,
    /// Where objects and the CA live; None keeps everything in memory.
    pub data_dir: Option<PathBuf>,
    /// Port on 127.0.0.1; 0 picks a free one.
    pub port: u16,
    /// Events kept per resource for watches to resume from.
    pub watch_window: usize,
    /// The range ClusterIPs are allocated from.
    pub service_cidr: String,
    /// More names and addresses for the serving certificate (other addresses the server is
    /// reached at).
    pub extra_sans: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            name: "tandem".into(),
            data_dir: None,
            port: 0,
            watch_window: 20_000,
            service_cidr: "10.96.0.0/12".into(),
            extra_sans: Vec::new(),
        }
    }
}

/// Everything request handlers share.
pub struct State {
    /// Settings.
    pub config: Config,
    /// Objects.
    pub store: Store,
    /// Served resources.
    pub registry: RwLock<Registry>,
    /// RBAC objects, indexed for authorization.
    pub rbac: RwLock<RbacIndex>,
    /// Key material.
    pub pki: ClusterPki,
    /// Bearer token of the static admin user.
    pub admin_token: String,
    /// Client for admission webhooks.
    pub webhooks: WebhookClient,
    /// How the API server reaches kubelets: its own client CA and certificate, and how to
    /// connect to a node's address.
    pub kubelets: crate::kubelet_access::KubeletAccess,
    /// What kubelets last reported for `metrics.k8s.io`, and how often to ask them.
    pub metrics: crate::resource_metrics::ResourceMetrics,
    /// Held from counting a namespace's objects against its ResourceQuotas until the create
    /// they admit is stored, so concurrent creates cannot overshoot a quota.
    pub quota_lock: parking_lot::Mutex<()>,
    /// Set when the server shuts down: its open connections (watches included) close, as a
    /// stopped process's would.
    pub stopped: tokio::sync::watch::Sender<bool>,
}

impl State {
    /// Stores a new object and updates the in-memory indexes that follow it.
    pub fn create_object(
        &self,
        res: &ResourceInfo,
        ns: &str,
        name: &str,
        obj: &mut Value,
    ) -> ApiResult<Arc<Doc>> {
        if res.namespaced {
            self.check_namespace_open(ns)?;
        }
        let doc = self
            .store
            .create(&res.storage_key(), ns, name, obj)
            .map_err(|e| store_error(res, name, e))?;
        self.observe(res, Some(obj), ns, name);
        Ok(doc)
    }

    /// What [`State::create_object`] would refuse before storing anything: a namespace that
    /// is missing or terminating, a name already taken. A server-side dry run of a create
    /// answers as the create would (kube's dry-run storage looks the key up too).
    pub fn check_create(&self, res: &ResourceInfo, ns: &str, name: &str) -> ApiResult<()> {
        if res.namespaced {
            self.check_namespace_open(ns)?;
        }
        if self.store.get(&res.storage_key(), ns, name).is_some() {
            return Err(store_error(res, name, StoreError::AlreadyExists));
        }
        Ok(())
    }

    /// Replaces an object at `expected_rv`.
    pub fn update_object(
        &self,
        res: &ResourceInfo,
        ns: &str,
        name: &str,
        expected_rv: u64,
        obj: &mut Value,
    ) -> ApiResult<Arc<Doc>> {
        let doc = self
            .store
            .update(&res.storage_key(), ns, name, expected_rv, obj)
            .map_err(|e| store_error(res, name, e))?;
        self.observe(res, Some(obj), ns, name);
        Ok(doc)
    }

    /// Removes an object (at `expected_rv` if given).
    pub fn remove_object(
        &self,
        res: &ResourceInfo,
        ns: &str,
        name: &str,
        expected_rv: Option<u64>,
    ) -> ApiResult<Arc<Doc>> {
        let doc = self
            .store
            .delete(&res.storage_key(), ns, name, expected_rv)
            .map_err(|e| store_error(res, name, e))?;
        self.observe(res, None, ns, name);
        Ok(doc)
    }

    /// Refuses writes into a namespace that does not exist or is being terminated.
    fn check_namespace_open(&self, ns: &str) -> ApiResult<()> {
        match self.store.get("/namespaces", "", ns) {
            None => Err(ApiError::not_found("", "namespaces", ns)),
            Some(doc) if doc.deleting => Err(ApiError {
                code: 403,
                reason: "Forbidden",
                message: format!(
                    "unable to create new content in namespace {ns} because it is being terminated"
                ),
                details: None,
            }),
            Some(_) => Ok(()),
        }
    }

    /// Keeps derived in-memory state (RBAC index, served CRDs) in step with a write.
    pub fn observe(&self, res: &ResourceInfo, obj: Option<&Value>, ns: &str, name: &str) {
        if res.group == "rbac.authorization.k8s.io" {
            let mut rbac = self.rbac.write();
            match obj {
                Some(obj) => rbac.apply(&res.kind, obj),
                None => rbac.delete(&res.kind, ns, name),
            }
        } else if res.group == "apiextensions.k8s.io" && res.resource == "customresourcedefinitions"
        {
            sync_crd(self, obj, name);
        }
    }
}

/// The stored object, or 404.
pub fn fetch(state: &State, res: &ResourceInfo, ns: &str, name: &str) -> ApiResult<Arc<Doc>> {
    state
        .store
        .get(&res.storage_key(), ns, name)
        .ok_or_else(|| ApiError::not_found(&res.group, &res.resource, name))
}

/// Maps a store failure to the API error kube-apiserver returns.
pub fn store_error(res: &ResourceInfo, name: &str, e: StoreError) -> ApiError {
    match e {
        StoreError::NotFound => ApiError::not_found(&res.group, &res.resource, name),
        StoreError::AlreadyExists => ApiError::already_exists(&res.group, &res.resource, name),
        StoreError::Conflict => ApiError::conflict(
            &res.group,
            &res.resource,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        ),
        StoreError::TooOld { .. } => ApiError::gone("too old resource version"),
        StoreError::Io(e) => ApiError::internal(e),
    }
}

const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

/// Brings the registry and the CRD's status in line with a stored (or deleted) CRD.
pub fn sync_crd(state: &State, crd: Option<&Value>, name: &str) {
    let Some(crd) = crd else {
        // The CRD is gone: stop serving whatever it defined.
        if let Some((plural, group)) = name.split_once('.') {
            state.registry.write().remove_resource(group, plural);
        }
        return;
    };
    let spec = &crd["spec"];
    let group = spec["group"].as_str().unwrap_or("").to_string();
    let plural = spec["names"]["plural"].as_str().unwrap_or("").to_string();
    if crate::objects::is_deleting(crd) {
        clean_up_crd(state, crd, &group, &plural);
        return;
    }
    {
        let mut registry = state.registry.write();
        registry.remove_resource(&group, &plural);
        for info in resource_infos(crd) {
            registry.insert(info);
        }
    }
    update_crd_status(state, crd);
}

fn update_crd_status(state: &State, crd: &Value) {
    let name = crd["metadata"]["name"].as_str().unwrap_or("");
    let Some(crd_res) =
        state
            .registry
            .read()
            .get("apiextensions.k8s.io", "v1", "customresourcedefinitions")
    else {
        return;
    };
    let mut desired = crd.clone();
    let now = crate::objects::now();
    let keep_time = |t: &str| -> Value {
        crd["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == t && c["status"] == "True"))
            .map(|c| c["lastTransitionTime"].clone())
            .unwrap_or(json!(now))
    };
    let names = &crd["spec"]["names"];
    let mut accepted = names.clone();
    if accepted["singular"].as_str().unwrap_or("").is_empty() {
        accepted["singular"] = json!(names["kind"].as_str().unwrap_or("").to_lowercase());
    }
    if accepted["listKind"].as_str().unwrap_or("").is_empty() {
        accepted["listKind"] = json!(format!("{}List", names["kind"].as_str().unwrap_or("")));
    }
    let storage = crd["spec"]["versions"]
        .as_array()
        .and_then(|v| v.iter().find(|x| x["storage"] == true))
        .map(|v| v["name"].clone());
    let mut stored: Vec<Value> = crd["status"]["storedVersions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if let Some(s) = storage
        && !stored.contains(&s)
    {
        stored.push(s);
    }
    desired["status"] = json!({
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": keep_time("NamesAccepted")},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": keep_time("Established")},
        ],
        "acceptedNames": accepted,
        "storedVersions": stored,
    });
    let finalizers = crate::objects::finalizers(crd);
    if !finalizers.iter().any(|f| f == CLEANUP_FINALIZER) {
        let mut f = finalizers;
        f.push(CLEANUP_FINALIZER.into());
        desired["metadata"]["finalizers"] = json!(f);
    }
    if desired == *crd {
        return;
    }
    let rv = crd["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    if let Err(e) = state.update_object(&crd_res, "", name, rv, &mut desired) {
        // A concurrent write re-triggers sync with the newer object.
        tracing::debug!(crd = name, "status update raced: {e}");
    }
}

/// Deletes every custom resource of a CRD being deleted, then releases its finalizer.
fn clean_up_crd(state: &State, crd: &Value, group: &str, plural: &str) {
    let name = crd["metadata"]["name"].as_str().unwrap_or("");
    let key = format!("{group}/{plural}");
    let (_, docs) = state.store.list(&key, None, None);
    for doc in docs {
        if let Err(e) = state.store.delete(&key, &doc.namespace, &doc.name, None) {
            tracing::warn!(crd = name, object = %doc.name, "deleting custom resource: {e:?}");
        }
    }
    let Some(crd_res) =
        state
            .registry
            .read()
            .get("apiextensions.k8s.io", "v1", "customresourcedefinitions")
    else {
        return;
    };
    let mut desired = crd.clone();
    let remaining: Vec<String> = crate::objects::finalizers(crd)
        .into_iter()
        .filter(|f| f != CLEANUP_FINALIZER)
        .collect();
    let rv = crd["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    let result = if remaining.is_empty() {
        state
            .remove_object(&crd_res, "", name, Some(rv))
            .map(|_| ())
    } else {
        desired["metadata"]["finalizers"] = json!(remaining);
        state
            .update_object(&crd_res, "", name, rv, &mut desired)
            .map(|_| ())
    };
    if let Err(e) = result {
        tracing::debug!(crd = name, "cleanup raced: {e}");
    }
}
