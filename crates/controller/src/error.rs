//! Shared handling of errors: how a cause chain reads in a log line or a condition's message.

/// `e` and its causes, outermost first, joined by ": " — the text a condition's message or a
/// log line shows. A cause whose text the message before it already ends with is said once
/// (some foreign errors, kube's and hyper's among them, repeat their source).
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
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
