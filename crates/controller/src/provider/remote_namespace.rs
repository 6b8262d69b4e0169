//! TODO(owner): provider-side remote_namespace reconciler.

use crate::context::Ctx;

pub async fn run(_ctx: Ctx) {
    std::future::pending::<()>().await
}
