//! Tandem's embedded API server driven through kube-rs only: what a controller author
//! relies on (CRUD, CRDs, watch and reflectors, controllers with finalizers, server-side
//! apply, refusals, quotas, deletion propagation) behaves as on a kube-apiserver.

#[path = "kube_rs/apply.rs"]
mod apply;
#[path = "kube_rs/common.rs"]
mod common;
#[path = "kube_rs/controller.rs"]
mod controller;
#[path = "kube_rs/crud.rs"]
mod crud;
#[path = "kube_rs/deletion.rs"]
mod deletion;
#[path = "kube_rs/eviction.rs"]
mod eviction;
#[path = "kube_rs/identity.rs"]
mod identity;
#[path = "kube_rs/quota.rs"]
mod quota;
#[path = "kube_rs/refusals.rs"]
mod refusals;
#[path = "kube_rs/validation.rs"]
mod validation;
#[path = "kube_rs/watch.rs"]
mod watch;
#[path = "kube_rs/webhook.rs"]
mod webhook;
