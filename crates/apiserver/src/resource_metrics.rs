//! Kubelets' resource metrics as the API server keeps them for `metrics.k8s.io`: the
//! `/metrics/resource` text decoded into batches ([`decode`]), the last two samples of each
//! node and container and the usage between them ([`window`]), and the state the scraper and
//! the handlers share. Pure: the scraping and serving are `metrics_api`'s.

pub mod decode;
pub mod window;

use std::sync::atomic::AtomicBool;

use window::{DEFAULT_RESOLUTION, Window};

/// The API server's resource metrics: the samples, how often to scrape, and who scrapes.
pub struct ResourceMetrics {
    /// The last two samples of everything.
    pub window: parking_lot::Mutex<Window>,
    /// How often kubelets are scraped.
    pub resolution: tokio::sync::watch::Sender<std::time::Duration>,
    /// Held while a round of scrapes runs.
    pub round: tokio::sync::Mutex<()>,
    /// Whether a metrics request has come yet (the first one scrapes at once).
    pub asked: AtomicBool,
    /// Told once, after the first request's scrape: the background scrapes start.
    pub first_request: tokio::sync::Notify,
}

impl Default for ResourceMetrics {
    fn default() -> Self {
        ResourceMetrics {
            window: Default::default(),
            resolution: tokio::sync::watch::Sender::new(DEFAULT_RESOLUTION),
            round: Default::default(),
            asked: AtomicBool::new(false),
            first_request: tokio::sync::Notify::new(),
        }
    }
}
