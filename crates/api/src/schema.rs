//! What the CRDs' schemas demand of each field beyond its type: the patterns, enums and bounds
//! the API server checks on every write, so that bad input is refused with a message naming the
//! field, as kube-apiserver refuses it on built-in kinds.
//!
//! Only what a structural schema says without CEL: Tandem's lab API server does not evaluate
//! `x-kubernetes-validations`, and a rule only some servers check would be a promise half kept.
//! What these cannot say (map keys, one field depending on another) the controllers report as
//! conditions.

use schemars::{Schema, SchemaGenerator, json_schema};
use serde_json::{Value, json};
use tandem_apimachinery::{quantity, validation};

use crate::names::CLUSTER_ID_MAX_LEN;

/// A host in an address: a DNS name or IPv4 address, or an IPv6 address in brackets.
macro_rules! host {
    () => {
        r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?)"
    };
}

/// A port, 1 to 65535.
macro_rules! port {
    () => {
        "([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
    };
}

/// `https://host[:port][/path]`: an API server's URL, as an invite carries it.
pub const HTTPS_URL_PATTERN: &str = concat!("^https://", host!(), "(:", port!(), r")?(/\S*)?$");
/// `host:port`: a gateway's tunnel or status address.
pub const HOST_PORT_PATTERN: &str = concat!("^", host!(), ":", port!(), "$");
/// One or more PEM certificates.
pub const PEM_CERTIFICATE_PATTERN: &str =
    r"^\s*-----BEGIN CERTIFICATE-----[\s\S]+-----END CERTIFICATE-----\s*$";
/// A PEM PKCS#10 certificate request.
pub const PEM_CSR_PATTERN: &str =
    r"^\s*-----BEGIN CERTIFICATE REQUEST-----[\s\S]+-----END CERTIFICATE REQUEST-----\s*$";
/// An invite token's ID: 6 of `[a-z0-9]` (`tandem_core::invite::TOKEN_ID_LEN`).
pub const TOKEN_ID_PATTERN: &str = "^[a-z0-9]{6}$";
/// A hex HMAC-SHA256.
pub const TOKEN_PROOF_PATTERN: &str = "^[0-9a-f]{64}$";
/// A WireGuard public key: 32 bytes in standard base64.
pub const WIREGUARD_KEY_PATTERN: &str = "^[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]=$";

/// Sets a string field's pattern and, when given, its maxLength.
fn string_rule(schema: &mut Schema, pattern: &str, max_len: Option<usize>) {
    schema.insert("pattern".into(), pattern.into());
    if let Some(max) = max_len {
        schema.insert("maxLength".into(), max.into());
    }
}

/// A cluster ID: a DNS-1123 label of at most [`CLUSTER_ID_MAX_LEN`] characters.
pub fn cluster_id(schema: &mut Schema) {
    string_rule(
        schema,
        validation::DNS1123_LABEL_PATTERN,
        Some(CLUSTER_ID_MAX_LEN),
    );
}

/// A label value (a region, a zone).
pub fn label_value(schema: &mut Schema) {
    string_rule(
        schema,
        validation::LABEL_VALUE_PATTERN,
        Some(validation::LABEL_VALUE_MAX),
    );
}

/// A namespace name: a DNS-1123 label.
pub fn namespace(schema: &mut Schema) {
    string_rule(
        schema,
        validation::DNS1123_LABEL_PATTERN,
        Some(validation::DNS1123_LABEL_MAX),
    );
}

/// An object name (Secret, Node): a DNS-1123 subdomain.
pub fn object_name(schema: &mut Schema) {
    string_rule(
        schema,
        validation::DNS1123_SUBDOMAIN_PATTERN,
        Some(validation::DNS1123_SUBDOMAIN_MAX),
    );
}

/// A ServiceImport's type.
pub fn import_type(schema: &mut Schema) {
    schema.insert(
        "enum".into(),
        serde_json::json!(["ClusterSetIP", "Headless"]),
    );
}

/// An IP range in CIDR notation (`10.244.0.0/16`, `fd00::/64`).
pub fn cidr(schema: &mut Schema) {
    schema.insert("format".into(), "cidr".into());
}

/// A duration in whole units, Go style without fractions: `30s`, `2m`, `1m30s`, `500ms`, `0s`.
pub const DURATION_PATTERN: &str = "^([0-9]{1,9}(ms|s|m|h))+$";

/// A CA fingerprint as discovery writes it: `sha256:` and 64 lower-case hex digits.
pub const CA_FINGERPRINT_PATTERN: &str = "^sha256:[0-9a-f]{64}$";

/// Transforms that set one pattern, for `#[schemars(transform = ...)]`.
macro_rules! pattern_rules {
    ($($name:ident => $pattern:ident),* $(,)?) => {$(
        #[doc = concat!("Sets [`", stringify!($pattern), "`].")]
        pub fn $name(schema: &mut Schema) {
            string_rule(schema, $pattern, None);
        }
    )*};
}

pattern_rules! {
    https_url => HTTPS_URL_PATTERN,
    host_port => HOST_PORT_PATTERN,
    pem_certificate => PEM_CERTIFICATE_PATTERN,
    pem_csr => PEM_CSR_PATTERN,
    token_id => TOKEN_ID_PATTERN,
    token_proof => TOKEN_PROOF_PATTERN,
    wireguard_key => WIREGUARD_KEY_PATTERN,
    duration => DURATION_PATTERN,
    ca_fingerprint => CA_FINGERPRINT_PATTERN,
}

/// A quantity that cannot be negative, as a string (`500m`, `2Gi`) or an integer: the
/// controller-gen schema of `resource.Quantity` with the sign taken away (the pattern checks
/// strings, the minimum integers).
fn non_negative_quantity() -> Value {
    json!({
        "description": "A quantity: 500m, 2, 1.5Gi, 1e3; never negative.",
        "x-kubernetes-int-or-string": true,
        "pattern": quantity::NON_NEGATIVE_PATTERN,
        "minimum": 0
    })
}

/// A map from resource name (`cpu`, `memory`, `pods`, `nvidia.com/gpu`) to a non-negative
/// quantity: a grant, a use, a capacity.
pub fn resource_quantities(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "additionalProperties": non_negative_quantity()
    })
}

/// Labels: keys are not checked (a structural schema cannot constrain them), values are.
pub fn labels(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "additionalProperties": {
            "type": "string",
            "pattern": validation::LABEL_VALUE_PATTERN,
            "maxLength": validation::LABEL_VALUE_MAX
        }
    })
}

/// `metav1.Condition` with the markers its Go type carries (what controller-gen emits).
pub fn conditions(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "items": {
            "description": "One aspect of the object's state.",
            "type": "object",
            "required": ["lastTransitionTime", "message", "reason", "status", "type"],
            "properties": {
                "lastTransitionTime": {
                    "description": "When the status last changed.",
                    "type": "string",
                    "format": "date-time"
                },
                "message": {
                    "description": "What the condition means now, for people.",
                    "type": "string",
                    "maxLength": 32768
                },
                "observedGeneration": {
                    "description": "The metadata.generation the condition was set for.",
                    "type": "integer",
                    "format": "int64",
                    "minimum": 0
                },
                "reason": {
                    "description": "Why, in CamelCase.",
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 1024,
                    "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
                },
                "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                "type": {
                    "description": "The aspect, in CamelCase (Ready, Authenticated, ...).",
                    "type": "string",
                    "maxLength": 316,
                    "pattern": r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
                }
            }
        }
    })
}

/// A node selector over virtual nodes' labels, checked as kube-apiserver checks a pod's
/// required node affinity: at least one term, label keys, the six operators, and `matchFields`
/// only on `metadata.name` with one value. Which operators take how many values needs CEL; the
/// controller reports that.
pub fn node_selector(_: &mut SchemaGenerator) -> Schema {
    let values = json!({"type": "array", "items": {"type": "string"}});
    json_schema!({
        "type": "object",
        "nullable": true,
        "required": ["nodeSelectorTerms"],
        "properties": {
            "nodeSelectorTerms": {
                "description": "The terms are ORed; a node matches a term when all its requirements hold.",
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "properties": {
                        "matchExpressions": {
                            "description": "Requirements on the node's labels.",
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["key", "operator"],
                                "properties": {
                                    "key": {
                                        "type": "string",
                                        "pattern": validation::LABEL_KEY_PATTERN,
                                        "maxLength": validation::LABEL_KEY_MAX
                                    },
                                    "operator": {
                                        "type": "string",
                                        "enum": ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
                                    },
                                    "values": values
                                }
                            }
                        },
                        "matchFields": {
                            "description": "Requirements on the node's fields: only metadata.name.",
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["key", "operator"],
                                "properties": {
                                    "key": {"type": "string", "enum": ["metadata.name"]},
                                    "operator": {"type": "string", "enum": ["In", "NotIn"]},
                                    "values": {
                                        "type": "array",
                                        "minItems": 1,
                                        "maxItems": 1,
                                        "items": {"type": "string"}
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    })
}

/// A PodSpec kept mostly opaque (its full schema would make the CRD enormous; the provider
/// validates the pod when it creates it), but with the containers it cannot do without.
pub fn pod_spec(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
        "required": ["containers"],
        "properties": {
            "containers": {
                "type": "array",
                "minItems": 1,
                "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_take_what_tandem_writes_and_refuse_the_rest() {
        let cases: &[(&str, &str, bool)] = &[
            (HTTPS_URL_PATTERN, "https://127.0.0.1:6443", true),
            (HTTPS_URL_PATTERN, "https://api.milan.example.com", true),
            (
                HTTPS_URL_PATTERN,
                "https://[::1]:6443/k8s/clusters/c-1",
                true,
            ),
            (HTTPS_URL_PATTERN, "http://127.0.0.1:6443", false),
            (HTTPS_URL_PATTERN, "https://127.0.0.1:70000", false),
            (HTTPS_URL_PATTERN, "https://", false),
            (HOST_PORT_PATTERN, "127.0.0.1:9100", true),
            (HOST_PORT_PATTERN, "gw.milan:51820", true),
            (HOST_PORT_PATTERN, "[fd00::1]:51820", true),
            (HOST_PORT_PATTERN, "127.0.0.1", false),
            (HOST_PORT_PATTERN, "127.0.0.1:0", false),
            (HOST_PORT_PATTERN, "127.0.0.1:65536", false),
            (HOST_PORT_PATTERN, "http://127.0.0.1:9100", false),
            (
                PEM_CERTIFICATE_PATTERN,
                "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
                true,
            ),
            (PEM_CERTIFICATE_PATTERN, "not a certificate", false),
            (
                PEM_CSR_PATTERN,
                "-----BEGIN CERTIFICATE REQUEST-----\nMIIB\n-----END CERTIFICATE REQUEST-----\n",
                true,
            ),
            (
                PEM_CSR_PATTERN,
                "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
                false,
            ),
            (TOKEN_ID_PATTERN, "abc123", true),
            (TOKEN_ID_PATTERN, "ABC123", false),
            (TOKEN_PROOF_PATTERN, &"0f".repeat(32), true),
            (TOKEN_PROOF_PATTERN, "0f", false),
            (
                WIREGUARD_KEY_PATTERN,
                "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=",
                true,
            ),
            (WIREGUARD_KEY_PATTERN, "not-a-key", false),
        ];
        for (pattern, value, ok) in cases {
            let re = regex::Regex::new(pattern).unwrap();
            assert_eq!(re.is_match(value), *ok, "{value:?} against {pattern}");
        }
    }
}
