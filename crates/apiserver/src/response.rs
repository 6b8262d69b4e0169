//! Building responses: buffered JSON, Status errors, and stored objects as served at the
//! version the client asked for.

use std::convert::Infallible;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::registry::ResourceInfo;
use crate::store::Doc;

/// Response body: a full buffer or a watch stream.
pub type Body = BoxBody<Bytes, std::io::Error>;

/// A buffered JSON response.
pub fn json_response(code: u16, body: &Value) -> Response<Body> {
    bytes_response(
        code,
        Bytes::from(serde_json::to_vec(body).expect("JSON serializes")),
    )
}

/// A buffered response of already serialized JSON.
pub fn bytes_response(code: u16, body: Bytes) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(body).map_err(|e: Infallible| match e {}).boxed())
        .expect("valid response")
}

/// An empty body (a 101 Switching Protocols, for one).
pub fn empty_body() -> Body {
    Full::new(Bytes::new())
        .map_err(|e: Infallible| match e {})
        .boxed()
}

/// The Status response for an error; like kube-apiserver, a Status that suggests when to
/// retry (an eviction a disruption budget has yet to see) says so in `Retry-After` too.
pub fn error_response(err: &ApiError) -> Response<Body> {
    let mut response = json_response(err.code, &err.to_status());
    if let Some(seconds) = err
        .details
        .as_ref()
        .and_then(|d| d["retryAfterSeconds"].as_u64())
        .filter(|s| *s > 0)
    {
        response
            .headers_mut()
            .insert(http::header::RETRY_AFTER, http::HeaderValue::from(seconds));
    }
    response
}

/// Rewrites a stored object's apiVersion for the version the client asked for.
pub fn for_version(res: &ResourceInfo, doc: &Doc) -> Bytes {
    let stored_prefix = format!("\"apiVersion\":\"{}\"", res.api_version());
    if doc
        .json
        .windows(stored_prefix.len())
        .any(|w| w == stored_prefix.as_bytes())
    {
        return doc.json.clone();
    }
    let mut v = doc.value();
    v["apiVersion"] = json!(res.api_version());
    Bytes::from(serde_json::to_vec(&v).expect("JSON serializes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_suggesting_a_retry_sets_retry_after() {
        let mut err = ApiError::too_many_requests("wait");
        assert!(error_response(&err).headers().get("retry-after").is_none());
        err.details = Some(json!({"retryAfterSeconds": 10}));
        let response = error_response(&err);
        assert_eq!(response.status(), 429);
        assert_eq!(response.headers()["retry-after"], "10");
        err.details = Some(json!({"retryAfterSeconds": 0}));
        assert!(error_response(&err).headers().get("retry-after").is_none());
    }
}
