//! Shared handling of errors: how a cause chain reads in a log line or a condition's message.

/// `e` and its causes, outermost first, joined by ": " — the text a condition's message or a
/// log line shows (each error's own message names only its step, never its cause).
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

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

    #[test]
    fn chain_names_each_cause_once() {
        let e = Outer(std::io::Error::other("connection refused"));
        assert_eq!(chain(&e), "outer step: connection refused");
    }
}
