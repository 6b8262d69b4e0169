//! Why the pod-placement webhook could not start serving (its TLS, its listener, its
//! configurations), apart from the module that serves so that its TLS room can name it too.

use tandem_api::names::PLACEMENT_WEBHOOK as WEBHOOK_CONFIGURATION;

use crate::provider::peer_writes;

/// Why the webhook could not start serving.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("{0}")]
    Certificate(&'static str, #[source] rcgen::Error),
    #[error("TLS config")]
    Tls(#[source] rustls::Error),
    #[error("listening on {addr}")]
    Listen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("listener address")]
    LocalAddr(#[source] std::io::Error),
    #[error("applying MutatingWebhookConfiguration {WEBHOOK_CONFIGURATION}")]
    Configuration(#[source] kube::Error),
    #[error(
        "applying ValidatingWebhookConfiguration {}",
        peer_writes::WEBHOOK_CONFIGURATION
    )]
    ValidatingConfiguration(#[source] kube::Error),
}
