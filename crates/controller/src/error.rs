//! Shared handling of errors: how a cause chain reads in a log line or a condition's message.

pub use tandem_core::errors::chain;

/// A request to a cluster that failed: the step (naming the object) and the API's answer.
#[derive(Debug, thiserror::Error)]
#[error("{step}")]
pub struct RequestError {
    pub step: String,
    #[source]
    pub source: kube::Error,
}

/// Turns the error of a request made at `step` into a [`RequestError`].
pub fn request(step: impl Into<String>) -> impl FnOnce(kube::Error) -> RequestError {
    let step = step.into();
    move |source| RequestError { step, source }
}

/// Whether `e` means the other end did not answer at all (no HTTP status: refused connection,
/// timeout, TLS failure), as opposed to an API server that answered with an error.
pub fn is_unreachable(e: &kube::Error) -> bool {
    !matches!(e, kube::Error::Api(_))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer step")]
    struct Outer(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("client error: connection refused")]
    struct Repeating(#[source] std::io::Error);

    #[test]
    fn chain_names_each_cause_once() {
        let e = Outer(std::io::Error::other("connection refused"));
        assert_eq!(chain(&e), "outer step: connection refused");
        let e = Repeating(std::io::Error::other("connection refused"));
        assert_eq!(chain(&e), "client error: connection refused");
    }
}
