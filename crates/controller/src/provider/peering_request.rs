//! TODO(owner): provider-side peering_request reconciler.

use crate::context::Ctx;

pub async fn run(_ctx: Ctx) {
    std::future::pending::<()>().await
}
