//! The lab controllers against a real embedded API server, observed only through kube-rs:
//! what a user of `kubectl` would notice (pods, ReplicaSets, rollout status, endpoints,
//! signed certificates, default ServiceAccounts). No kubelet runs here: the tests play the
//! kubelet by writing pod status themselves.

#[path = "controllers/common.rs"]
mod common;
#[path = "controllers/cronjobs.rs"]
mod cronjobs;
#[path = "controllers/csr.rs"]
mod csr;
#[path = "controllers/daemonsets.rs"]
mod daemonsets;
#[path = "controllers/deployments.rs"]
mod deployments;
#[path = "controllers/disruption.rs"]
mod disruption;
#[path = "controllers/endpoints.rs"]
mod endpoints;
#[path = "controllers/jobs.rs"]
mod jobs;
#[path = "controllers/replicasets.rs"]
mod replicasets;
#[path = "controllers/serviceaccounts.rs"]
mod serviceaccounts;
#[path = "controllers/statefulsets.rs"]
mod statefulsets;
#[path = "controllers/volumes.rs"]
mod volumes;
