//! The state every request shares (settings, store, served resources, RBAC index, keys), and
//! the writes that keep its in-memory indexes in step with the store.

use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::RwLock;
use serde_json::Value;
use tandem_apimachinery::rbac::RbacIndex;

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
}

impl Default for Config {
    fn default() -> Self {
        Config {
            name: "tandem".into(),
            data_dir: None,
            port: 0,
            watch_window: 20_000,
            service_cidr: "10.96.0.0/12".into(),
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
            crate::crd::sync(self, obj, name);
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
