//! The Kubernetes version the server reports, in /version and the OpenAPI documents.

/// The Kubernetes version the server reports (the API it models).
pub const KUBE_VERSION: (&str, &str) = ("1", "33");
