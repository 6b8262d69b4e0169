//! How an error's cause chain reads in a log line or a condition's message.

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

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("reading Secret tandem-gateway-milan")]
    struct Outer(#[source] Middle);

    #[derive(Debug, thiserror::Error)]
    #[error("connecting: refused")]
    struct Middle(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("refused")]
    struct Inner;

    #[test]
    fn causes_are_joined_and_a_repeated_one_said_once() {
        assert_eq!(
            chain(&Outer(Middle(Inner))),
            "reading Secret tandem-gateway-milan: connecting: refused"
        );
    }
}
