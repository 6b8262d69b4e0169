//! Provider side: what this cluster does for the consumers that peer with it.

use tokio::task::JoinSet;

use crate::context::Ctx;

pub mod enrollment;
pub mod enrollment_guard;
pub mod fence;
pub mod network;
pub mod peer_writes;
pub mod peering_request;
pub mod remote_namespace;
pub mod renewal;
pub mod shadowpod;
pub mod tenant;

/// Spawns every provider-side reconciler.
pub fn spawn(ctx: &Ctx, tasks: &mut JoinSet<()>) {
    tasks.spawn(peering_request::run(ctx.clone()));
    tasks.spawn(enrollment::run(ctx.clone()));
    tasks.spawn(enrollment_guard::run(ctx.clone()));
    tasks.spawn(tenant::run(ctx.clone()));
    tasks.spawn(network::run(ctx.clone()));
    tasks.spawn(remote_namespace::run(ctx.clone()));
    tasks.spawn(shadowpod::run(ctx.clone()));
    tasks.spawn(fence::run(ctx.clone()));
    tasks.spawn(renewal::run(ctx.clone()));
}
