//! Tandem's cluster agent (`tandem controller`): one process per cluster that plays both roles.
//!
//! - provider side ([`provider`]): peering requests filed with invite tokens, tenants and their
//!   grants, twin namespaces, shadow pods → real pods under the tenant's quota;
//! - consumer side ([`consumer`]): the invite flow and negotiation for each `Peering`, one
//!   virtual node and virtual kubelet per provider, namespace offloading and its admission
//!   webhook, reflection of the objects offloaded pods need;
//! - multi-cluster services ([`mcs`]): ServiceExports handed to every peer, ServiceImports
//!   from theirs, and `clusterset.local` DNS.
//!
//! Every cluster — the local one and each provider — is reached only through `kube::Client`.

mod batch;
pub mod clients;
pub mod consumer;
pub mod context;
pub mod coredns;
pub mod credentials;
pub mod discovery;
pub mod enroll;
pub mod error;
pub mod events;
pub mod fabric;
pub mod identity;
pub mod input;
pub mod install;
pub mod invite;
pub mod ipam_cache;
pub mod leader;
pub mod lean;
pub mod mcs;
pub mod mdns;
pub mod metrics;
pub mod node_marks;
pub mod objects;
pub mod provider;
pub mod rbac;
pub mod requests;
pub mod runtime;
pub mod settings;
pub mod shared_watches;
mod tasks;
pub mod watches;

pub use context::{Context, Options};
pub use runtime::Controller;
