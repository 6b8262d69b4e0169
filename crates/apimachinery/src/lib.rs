//! Kubernetes object semantics as pure functions over `serde_json::Value`.
//!
//! This crate mirrors the parts of `k8s.io/apimachinery` (and the pure parts of
//! `k8s.io/apiserver`) that Tandem's embedded API server needs: label and field
//! selectors, JSON / merge / strategic-merge patches, server-side apply with managed
//! fields, structural-schema defaulting, pruning and validation, JSONPath for printer
//! columns, RBAC rule evaluation, resource quantities and name formats. It does no I/O and never depends on kube.

pub mod jsonpath;
pub mod managed;
pub mod patch;
pub mod patchmeta;
pub mod pod_security;
pub mod quantity;
pub mod rbac;
pub mod schema;
pub mod selector;
pub mod validation;
