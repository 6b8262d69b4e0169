//! TODO(owner): per-provider reflection task.

use crate::consumer::link::LinkWatch;
use crate::context::Ctx;

pub async fn run(_ctx: Ctx, _link: LinkWatch) {
    std::future::pending::<()>().await
}
