//! TODO(owner): provider-side tenant reconciler.

use crate::context::Ctx;

pub async fn run(_ctx: Ctx) {
    std::future::pending::<()>().await
}
