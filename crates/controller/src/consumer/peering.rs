//! TODO(owner): the consumer's Peering reconciler: invite flow, negotiation; publishes links.

use crate::consumer::Links;
use crate::context::Ctx;

pub async fn run(_ctx: Ctx, _links: Links) {
    std::future::pending::<()>().await
}
