//! Consumer side: peering with providers, and offloading to them.

use tokio::task::JoinSet;

use crate::context::Ctx;

pub mod daemonset;
pub mod fence;
pub mod kubelet_api;
pub mod kubelet_metrics;
pub mod link;
pub mod offloading;
pub mod peering;
pub mod reflection;
pub mod renewal;
pub mod storage;
pub mod supervisor;
pub mod virtual_node;
pub mod vk;
pub mod webhook;

pub use link::{Links, ProviderLink};

/// Spawns every consumer-side reconciler. `Links` is shared: the peering reconciler publishes
/// an established provider into it; the per-provider tasks, the offloading reconciler and
/// multi-cluster services read it.
pub fn spawn(ctx: &Ctx, tasks: &mut JoinSet<()>) {
    let links = Links::default();
    tasks.spawn(peering::run(ctx.clone(), links.clone()));
    tasks.spawn(offloading::run(ctx.clone(), links.clone()));
    tasks.spawn(storage::run(ctx.clone(), links.clone()));
    tasks.spawn(webhook::run(ctx.clone()));
    tasks.spawn(crate::mcs::run(ctx.clone(), links.clone()));
    tasks.spawn(renewal::run(ctx.clone()));
    tasks.spawn(supervisor::supervise(ctx.clone(), links));
}
