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

/// The Status response for an error.
pub fn error_response(err: &ApiError) -> Response<Body> {
    json_response(err.code, &err.to_status())
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
