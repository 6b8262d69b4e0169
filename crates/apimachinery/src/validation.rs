//! Name and label formats as `k8s.io/apimachinery/pkg/util/validation` checks them: DNS-1123
//! labels and subdomains, qualified names (label keys) and label values. One copy for every
//! crate: the API server, the lab, the controller and the CLI all validate through here.

/// The longest DNS-1123 label (a namespace, a Service name).
pub const DNS1123_LABEL_MAX: usize = 63;
/// The longest DNS-1123 subdomain (most object names).
pub const DNS1123_SUBDOMAIN_MAX: usize = 253;

// The same formats as OpenAPI patterns, for CRD schemas (pair each with its maxLength): Go's
// regexp and Rust's regex read them alike, and a test below holds them to the checks above.

/// A DNS-1123 label, as a pattern (with maxLength [`DNS1123_LABEL_MAX`]).
pub const DNS1123_LABEL_PATTERN: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
/// A DNS-1123 subdomain, as a pattern (with maxLength [`DNS1123_SUBDOMAIN_MAX`]).
pub const DNS1123_SUBDOMAIN_PATTERN: &str =
    "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// The longest label value.
pub const LABEL_VALUE_MAX: usize = 63;
/// A label value, as a pattern (with maxLength [`LABEL_VALUE_MAX`]).
pub const LABEL_VALUE_PATTERN: &str = "^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$";
/// The longest label key: a 253-character prefix, '/', and a 63-character name.
pub const LABEL_KEY_MAX: usize = 317;
/// A label key (`[prefix/]name`), as a pattern (with maxLength [`LABEL_KEY_MAX`]); the name
/// part's 63 characters are in the pattern, the prefix's 253 only in the overall maxLength.
pub const LABEL_KEY_PATTERN: &str = "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$";

/// Whether `s` is a DNS-1123 label: at most 63 lower-case alphanumerics or '-', starting and
/// ending with an alphanumeric (what a namespace or Service name must be).
pub fn is_dns1123_label(s: &str) -> bool {
    s.len() <= DNS1123_LABEL_MAX && is_label_format(s)
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?` without a length bound (kube bounds a subdomain's labels only
/// by the whole name's 253 characters).
fn is_label_format(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_ERR: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_ERR: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_ERR: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";

/// `validation.RegexError`: the message, examples and the regex the value failed.
fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    let examples: String = examples
        .iter()
        .enumerate()
        .map(|(i, e)| format!("{}'{e}', ", if i > 0 { " or " } else { "" }))
        .collect();
    format!("{msg} (e.g. {examples}regex used for validation is '{fmt}')")
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, checked by hand (no regex dependency for one pattern).
pub fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Whether `s` is a DNS-1123 subdomain: at most 253 characters of dot-separated labels.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= DNS1123_SUBDOMAIN_MAX && s.split('.').all(is_label_format)
}

/// `validation.IsQualifiedName`: `[prefix/]name`, name at most 63 characters.
pub fn validate_label_key(key: &str) -> Result<(), InvalidFormat> {
    let mut broken = Vec::new();
    let parts: Vec<&str> = key.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                broken.push(FormatRule::EmptyPart(KeyPart::Prefix));
            } else {
                if prefix.len() > 253 {
                    broken.push(FormatRule::PartMaxLength(KeyPart::Prefix, 253));
                }
                if !is_dns1123_subdomain(prefix) {
                    broken.push(FormatRule::PrefixDns1123Subdomain);
                }
            }
            *name
        }
        _ => return InvalidFormat::check(vec![FormatRule::QualifiedName]),
    };
    if name.is_empty() {
        broken.push(FormatRule::EmptyPart(KeyPart::Name));
    } else if name.len() > 63 {
        broken.push(FormatRule::PartMaxLength(KeyPart::Name, 63));
    }
    if !is_qualified_name_part(name) {
        broken.push(FormatRule::NameQualifiedNamePart);
    }
    InvalidFormat::check(broken)
}

/// The part of a qualified name (`prefix/name`) a rule applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyPart {
    Prefix,
    Name,
}

impl std::fmt::Display for KeyPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KeyPart::Prefix => "prefix",
            KeyPart::Name => "name",
        })
    }
}

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_LABEL_ERR: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";

/// A rule of a name or label format that a value breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FormatRule {
    /// At most this many characters.
    MaxLength(usize),
    /// The characters of a DNS-1123 label.
    Dns1123Label,
    /// The characters of a label value.
    LabelValue,
    /// A qualified name's part is empty.
    EmptyPart(KeyPart),
    /// A qualified name's part is longer than this.
    PartMaxLength(KeyPart, usize),
    /// A qualified name's prefix is not a DNS-1123 subdomain.
    PrefixDns1123Subdomain,
    /// A qualified name's name part has characters a name may not have.
    NameQualifiedNamePart,
    /// More than one `/`.
    QualifiedName,
}

impl std::fmt::Display for FormatRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FormatRule::MaxLength(max) => write!(f, "must be no more than {max} characters"),
            FormatRule::Dns1123Label => f.write_str(&regex_error(
                DNS1123_LABEL_ERR,
                DNS1123_LABEL_FMT,
                &["my-name", "123-abc"],
            )),
            FormatRule::LabelValue => f.write_str(&regex_error(
                LABEL_VALUE_ERR,
                &format!("({QUALIFIED_NAME_FMT})?"),
                &["MyValue", "my_value", "12345"],
            )),
            FormatRule::EmptyPart(part) => write!(f, "{part} part must be non-empty"),
            FormatRule::PartMaxLength(part, max) => {
                write!(f, "{part} part must be no more than {max} characters")
            }
            FormatRule::PrefixDns1123Subdomain => write!(
                f,
                "prefix part {}",
                regex_error(
                    DNS1123_SUBDOMAIN_ERR,
                    DNS1123_SUBDOMAIN_FMT,
                    &["example.com"]
                )
            ),
            FormatRule::NameQualifiedNamePart => write!(
                f,
                "name part {}",
                regex_error(
                    QUALIFIED_NAME_ERR,
                    QUALIFIED_NAME_FMT,
                    &["MyName", "my.name", "123-abc"]
                )
            ),
            FormatRule::QualifiedName => write!(
                f,
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. \
                 'example.com/MyName')",
                regex_error(
                    QUALIFIED_NAME_ERR,
                    QUALIFIED_NAME_FMT,
                    &["MyName", "my.name", "123-abc"]
                )
            ),
        }
    }
}

/// A value that breaks its format's rules; the message is kube's, one per rule joined by `; `.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", join(.broken))]
pub struct InvalidFormat {
    /// The rules broken, in the order kube checks them (never empty).
    pub broken: Vec<FormatRule>,
}

fn join(rules: &[FormatRule]) -> String {
    rules
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl InvalidFormat {
    /// Ok when no rule is broken.
    fn check(broken: Vec<FormatRule>) -> Result<(), InvalidFormat> {
        if broken.is_empty() {
            Ok(())
        } else {
            Err(InvalidFormat { broken })
        }
    }
}

/// `validation.IsDNS1123Label` with kube's messages (container names, Service names).
pub fn validate_dns1123_label(value: &str) -> Result<(), InvalidFormat> {
    let mut broken = Vec::new();
    if value.len() > DNS1123_LABEL_MAX {
        broken.push(FormatRule::MaxLength(DNS1123_LABEL_MAX));
    }
    if !is_label_format(value) {
        broken.push(FormatRule::Dns1123Label);
    }
    InvalidFormat::check(broken)
}

/// `validation.IsValidLabelValue`: empty, or a qualified name part of at most 63 characters.
pub fn validate_label_value(value: &str) -> Result<(), InvalidFormat> {
    let mut broken = Vec::new();
    if value.len() > LABEL_VALUE_MAX {
        broken.push(FormatRule::MaxLength(LABEL_VALUE_MAX));
    }
    if !value.is_empty() && !is_qualified_name_part(value) {
        broken.push(FormatRule::LabelValue);
    }
    InvalidFormat::check(broken)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns1123_labels_and_subdomains() {
        let long = "a".repeat(64);
        let cases: &[(&str, bool, bool)] = &[
            // (input, label, subdomain)
            ("web", true, true),
            ("web-1", true, true),
            ("1web", true, true),
            ("a.b", false, true),
            ("", false, false),
            ("-web", false, false),
            ("web-", false, false),
            ("Web", false, false),
            ("we_b", false, false),
            ("a..b", false, false),
            (&long, false, true),
        ];
        for (s, label, subdomain) in cases {
            assert_eq!(is_dns1123_label(s), *label, "label {s:?}");
            assert_eq!(is_dns1123_subdomain(s), *subdomain, "subdomain {s:?}");
        }
        assert!(!is_dns1123_subdomain(&format!("{}.b", "a".repeat(253))));
    }

    #[test]
    fn dns1123_label_messages_are_kubes() {
        assert_eq!(validate_dns1123_label("web-1"), Ok(()));
        assert_eq!(
            validate_dns1123_label("Web_1").unwrap_err().to_string(),
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
        );
        assert_eq!(
            validate_dns1123_label(&"a".repeat(64))
                .unwrap_err()
                .to_string(),
            "must be no more than 63 characters"
        );
    }

    #[test]
    fn label_keys_and_values() {
        assert!(validate_label_key("app").is_ok());
        assert!(validate_label_key("tandem.dev/cluster-id").is_ok());
        assert!(validate_label_key("Bad Key").is_err());
        assert!(validate_label_key("/x").is_err());
        assert!(validate_label_value("").is_ok());
        assert!(validate_label_value("eu-west").is_ok());
        assert!(validate_label_value("-x").is_err());
        assert!(validate_label_value(&"v".repeat(64)).is_err());
    }

    #[test]
    fn patterns_agree_with_the_checks() {
        let matches = |pattern: &str, max: usize, s: &str| {
            s.len() <= max && regex::Regex::new(pattern).unwrap().is_match(s)
        };
        let long_name = format!("example.com/{}", "n".repeat(64));
        let inputs = [
            "web",
            "web-1",
            "1web",
            "a.b",
            "",
            "-web",
            "web-",
            "Web",
            "we_b",
            "a..b",
            "My.Value",
            "x_",
            "app",
            "tandem.dev/cluster-id",
            "Bad Key",
            "/x",
            "a/b/c",
            "Example.com/x",
            "example.com/",
            &"a".repeat(63),
            &"a".repeat(64),
            &long_name,
        ];
        for s in inputs {
            let label = matches(DNS1123_LABEL_PATTERN, DNS1123_LABEL_MAX, s);
            assert_eq!(label, is_dns1123_label(s), "label {s:?}");
            let subdomain = matches(DNS1123_SUBDOMAIN_PATTERN, DNS1123_SUBDOMAIN_MAX, s);
            assert_eq!(subdomain, is_dns1123_subdomain(s), "subdomain {s:?}");
            let value = matches(LABEL_VALUE_PATTERN, LABEL_VALUE_MAX, s);
            assert_eq!(value, validate_label_value(s).is_ok(), "label value {s:?}");
            let key = matches(LABEL_KEY_PATTERN, LABEL_KEY_MAX, s);
            assert_eq!(key, validate_label_key(s).is_ok(), "label key {s:?}");
        }
    }
}
