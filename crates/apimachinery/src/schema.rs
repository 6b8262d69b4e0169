//! Structural schemas of CustomResourceDefinitions: defaulting, pruning and validation.
//!
//! A CRD version's `schema.openAPIV3Schema` is kept as a `serde_json::Value` and read as a
//! structural schema, the way kube-apiserver reads it in
//! `k8s.io/apiextensions-apiserver/pkg/apiserver/schema` (defaulting, pruning, list-type and
//! embedded-resource validation) and `k8s.io/kube-openapi/pkg/validation/validate` (value
//! validation). Error texts are those of `k8s.io/apimachinery/pkg/util/validation/field`, so a
//! client sees the same messages it would see from a real API server.

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::sync::{Mutex, OnceLock};

use regex::Regex;
use serde_json::{Map, Number, Value};

const PRESERVE_UNKNOWN: &str = "x-kubernetes-preserve-unknown-fields";
const EMBEDDED_RESOURCE: &str = "x-kubernetes-embedded-resource";
const INT_OR_STRING: &str = "x-kubernetes-int-or-string";
const LIST_TYPE: &str = "x-kubernetes-list-type";
const LIST_MAP_KEYS: &str = "x-kubernetes-list-map-keys";

/// TypeMeta and ObjectMeta fields that pruning leaves alone at the root and in embedded resources.
const META_FIELDS: [&str; 3] = ["apiVersion", "kind", "metadata"];

// ---------------------------------------------------------------------------------------------
// Field errors
// ---------------------------------------------------------------------------------------------

/// One invalid field, worded like k8s.io/apimachinery/pkg/util/validation/field.Error.
#[derive(Clone, Debug, PartialEq)]
pub struct FieldError {
    /// Path of the field, e.g. `spec.replicas` or `spec.ports[1]`; `<nil>` for errors about
    /// the whole object (kube-apiserver reports anyOf/oneOf/allOf/not failures that way).
    pub field: String,
    /// What is wrong.
    pub kind: FieldErrorKind,
    /// The offending value as shown in the message; `None` when Kubernetes omits it.
    pub value: Option<Value>,
    /// Human-readable detail appended after the value.
    pub detail: String,
}

/// The kinds of field errors a structural schema can produce (field.ErrorType).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldErrorKind {
    /// `Invalid value`: malformed value (pattern, bounds, ...).
    Invalid,
    /// `Required value`: a required field is missing.
    Required,
    /// `Unsupported value`: not one of the enumerated values.
    NotSupported,
    /// `Too long`: a string exceeds maxLength.
    TooLong,
    /// `Too many`: a list or map has too many items.
    TooMany,
    /// `Duplicate value`: a set or map list repeats an item or key.
    Duplicate,
    /// `Forbidden`: the field may not be set here.
    Forbidden,
    /// `Invalid value` caused by the JSON type of the value.
    TypeInvalid,
}

impl FieldErrorKind {
    /// The metav1 StatusCause reason of this kind.
    pub fn reason(&self) -> &'static str {
        match self {
            FieldErrorKind::Invalid => "FieldValueInvalid",
            FieldErrorKind::Required => "FieldValueRequired",
            FieldErrorKind::NotSupported => "FieldValueNotSupported",
            FieldErrorKind::TooLong => "FieldValueTooLong",
            FieldErrorKind::TooMany => "FieldValueTooMany",
            FieldErrorKind::Duplicate => "FieldValueDuplicate",
            FieldErrorKind::Forbidden => "FieldValueForbidden",
            FieldErrorKind::TypeInvalid => "FieldValueTypeInvalid",
        }
    }

    /// The canonical words of this kind (field.ErrorType.String()).
    fn words(&self) -> &'static str {
        match self {
            FieldErrorKind::Invalid | FieldErrorKind::TypeInvalid => "Invalid value",
            FieldErrorKind::Required => "Required value",
            FieldErrorKind::NotSupported => "Unsupported value",
            FieldErrorKind::TooLong => "Too long",
            FieldErrorKind::TooMany => "Too many",
            FieldErrorKind::Duplicate => "Duplicate value",
            FieldErrorKind::Forbidden => "Forbidden",
        }
    }
}

impl FieldError {
    fn new(
        field: impl Into<String>,
        kind: FieldErrorKind,
        value: Option<Value>,
        detail: impl Into<String>,
    ) -> Self {
        FieldError {
            field: field.into(),
            kind,
            value,
            detail: detail.into(),
        }
    }

    fn invalid(field: impl Into<String>, value: Value, detail: impl Into<String>) -> Self {
        Self::new(field, FieldErrorKind::Invalid, Some(value), detail)
    }

    fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(field, FieldErrorKind::Required, None, detail)
    }

    fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(field, FieldErrorKind::Forbidden, None, detail)
    }

    fn not_supported(field: impl Into<String>, value: Value, supported: &[String]) -> Self {
        let detail = if supported.is_empty() {
            String::new()
        } else {
            let quoted: Vec<String> = supported.iter().map(|s| go_quote(s)).collect();
            format!("supported values: {}", quoted.join(", "))
        };
        Self::new(field, FieldErrorKind::NotSupported, Some(value), detail)
    }

    fn too_long(field: impl Into<String>, max: i64) -> Self {
        let unit = if max == 1 { "byte" } else { "bytes" };
        Self::new(
            field,
            FieldErrorKind::TooLong,
            None,
            format!("may not be more than {max} {unit}"),
        )
    }

    fn too_many(field: impl Into<String>, actual: usize, max: i64) -> Self {
        let unit = if max == 1 { "item" } else { "items" };
        Self::new(
            field,
            FieldErrorKind::TooMany,
            Some(Value::from(actual)),
            format!("must have at most {max} {unit}"),
        )
    }

    fn duplicate(field: impl Into<String>, value: Value) -> Self {
        Self::new(field, FieldErrorKind::Duplicate, Some(value), "")
    }

    fn type_invalid(field: impl Into<String>, value: Value, detail: impl Into<String>) -> Self {
        Self::new(field, FieldErrorKind::TypeInvalid, Some(value), detail)
    }

    /// The message without the field path (field.Error.ErrorBody), used as StatusCause message.
    pub fn body(&self) -> String {
        let mut s = self.kind.words().to_string();
        let shows_value = !matches!(
            self.kind,
            FieldErrorKind::Required | FieldErrorKind::Forbidden | FieldErrorKind::TooLong
        );
        if shows_value && let Some(value) = &self.value {
            s.push_str(": ");
            s.push_str(&go_value(value));
        }
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

impl std::error::Error for FieldError {}

// ---------------------------------------------------------------------------------------------
// Go-compatible rendering of values (fmt %q, %v and encoding/json), so messages match byte for byte
// ---------------------------------------------------------------------------------------------

/// Renders a bad value as field.Error does: strings quoted, scalars bare, the rest as JSON.
fn go_value(v: &Value) -> String {
    match v {
        Value::String(s) => go_quote(s),
        Value::Number(n) => go_number(n),
        Value::Bool(b) => b.to_string(),
        Value::Null | Value::Array(_) | Value::Object(_) => go_json(v),
    }
}

/// Go's `strconv.Quote` (and `%q`): double quotes, Go escapes, printable Unicode kept.
pub(crate) fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A JSON number as Go's `%v` prints the int64 or float64 it decodes to.
pub(crate) fn go_number(n: &Number) -> String {
    if let Some(i) = n.as_i64() {
        i.to_string()
    } else if let Some(u) = n.as_u64() {
        u.to_string()
    } else {
        go_float(n.as_f64().unwrap_or(0.0))
    }
}

/// Go's `%v` for a float64 (`strconv.FormatFloat(f, 'g', -1, 64)`): shortest digits, in
/// exponent form when the decimal exponent is below -4 or at least 6 (`1e+06`, `1.5e-05`).
pub(crate) fn go_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        };
    }
    if f == 0.0 {
        return "0".into();
    }
    // Rust's `{:e}` yields the same shortest round-trip digits as Go, with the exponent apart.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    } else {
        format!("{f}")
    }
}

/// Go's `json.Marshal` of a decoded JSON value: sorted keys, HTML-safe escapes.
pub(crate) fn go_json(v: &Value) -> String {
    let mut out = String::new();
    write_go_json(v, &mut out);
    out
}

fn write_go_json(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            if n.is_i64() || n.is_u64() {
                out.push_str(&n.to_string());
            } else {
                let f = n.as_f64().unwrap_or(0.0);
                if f.fract() == 0.0 && f.abs() < 1e21 {
                    let _ = write!(out, "{f:.0}");
                } else {
                    out.push_str(&n.to_string());
                }
            }
        }
        Value::String(s) => write_go_json_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_go_json(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_go_json_string(k, out);
                out.push(':');
                write_go_json(&map[k.as_str()], out);
            }
            out.push('}');
        }
    }
}

fn write_go_json_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

// ---------------------------------------------------------------------------------------------
// Reading schema nodes
// ---------------------------------------------------------------------------------------------

/// `additionalProperties` of a node: a boolean or a schema.
enum Additional<'a> {
    Allows(bool),
    Schema(&'a Value),
}

impl<'a> Additional<'a> {
    fn schema(&self) -> Option<&'a Value> {
        match self {
            Additional::Schema(s) => Some(s),
            Additional::Allows(_) => None,
        }
    }
}

fn flag(s: &Value, key: &str) -> bool {
    s.get(key).and_then(Value::as_bool).unwrap_or(false)
}

fn string_of<'a>(s: &'a Value, key: &str) -> Option<&'a str> {
    s.get(key).and_then(Value::as_str)
}

fn float_of(s: &Value, key: &str) -> Option<f64> {
    s.get(key).and_then(Value::as_f64)
}

fn int_of(s: &Value, key: &str) -> Option<i64> {
    match s.get(key)? {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)),
        _ => None,
    }
}

fn properties(s: &Value) -> Option<&Map<String, Value>> {
    s.get("properties").and_then(Value::as_object)
}

fn property<'a>(s: &'a Value, name: &str) -> Option<&'a Value> {
    properties(s).and_then(|p| p.get(name))
}

fn items(s: &Value) -> Option<&Value> {
    s.get("items").filter(|i| i.is_object())
}

fn additional(s: &Value) -> Option<Additional<'_>> {
    match s.get("additionalProperties")? {
        Value::Bool(b) => Some(Additional::Allows(*b)),
        v @ Value::Object(_) => Some(Additional::Schema(v)),
        _ => None,
    }
}

fn nullable(s: &Value) -> bool {
    flag(s, "nullable")
}

/// The `default` of a node; an explicit `default: null` counts as none, as in Kubernetes.
fn default_of(s: &Value) -> Option<&Value> {
    s.get("default").filter(|d| !d.is_null())
}

// ---------------------------------------------------------------------------------------------
// Defaulting
// ---------------------------------------------------------------------------------------------

/// Fills `default` values from the schema into `obj` (only where the field is absent; recursing into objects, array items and additionalProperties), as kube-apiserver does on read and write.
///
/// Like kube-apiserver's defaulter it first drops `null` values of non-nullable fields that have
/// no default, and replaces `null` values of non-nullable fields that have one.
pub fn apply_defaults(obj: &mut Value, schema: &Value) {
    prune_non_nullable_nulls(obj, schema);
    default_node(obj, schema);
}

fn prune_non_nullable_nulls(x: &mut Value, s: &Value) {
    match x {
        Value::Object(map) => {
            map.retain(|k, v| match property(s, k) {
                Some(prop) => !(v.is_null() && !nullable(prop) && default_of(prop).is_none()),
                None => true,
            });
            for (k, v) in map.iter_mut() {
                if let Some(prop) = property(s, k) {
                    prune_non_nullable_nulls(v, prop);
                } else if let Some(ap) = additional(s).and_then(|a| a.schema()) {
                    prune_non_nullable_nulls(v, ap);
                }
            }
        }
        Value::Array(list) => {
            if let Some(is) = items(s) {
                for v in list {
                    prune_non_nullable_nulls(v, is);
                }
            }
        }
        _ => {}
    }
}

fn default_node(x: &mut Value, s: &Value) {
    match x {
        Value::Object(map) => {
            if let Some(props) = properties(s) {
                for (k, prop) in props {
                    let Some(default) = default_of(prop) else {
                        continue;
                    };
                    let missing = match map.get(k) {
                        None => true,
                        Some(v) => v.is_null() && !nullable(prop),
                    };
                    if missing {
                        map.insert(k.clone(), default.clone());
                    }
                }
            }
            // Recurse after filling, so that defaults inside a defaulted object apply too.
            for (k, v) in map.iter_mut() {
                if let Some(prop) = property(s, k) {
                    default_node(v, prop);
                } else if let Some(ap) = additional(s).and_then(|a| a.schema()) {
                    if v.is_null()
                        && !nullable(ap)
                        && let Some(default) = default_of(ap)
                    {
                        *v = default.clone();
                    }
                    default_node(v, ap);
                }
            }
        }
        Value::Array(list) => {
            if let Some(is) = items(s) {
                for v in list {
                    if v.is_null()
                        && !nullable(is)
                        && let Some(default) = default_of(is)
                    {
                        *v = default.clone();
                    }
                    default_node(v, is);
                }
            }
        }
        _ => {}
    }
}

// ---------------------------------------------------------------------------------------------
// Pruning
// ---------------------------------------------------------------------------------------------

/// Removes fields the schema does not declare (honouring x-kubernetes-preserve-unknown-fields, additionalProperties, x-kubernetes-embedded-resource — keeps apiVersion/kind/metadata there — and at the root always keeps apiVersion, kind, metadata). Returns the pruned paths like "spec.foo" (the server reports them as `unknown field "spec.foo"` for fieldValidation=Strict/Warn).
///
/// Paths are sorted and use `[i]` for list items, as kube-apiserver reports them.
pub fn prune(obj: &mut Value, schema: &Value) -> Vec<String> {
    let mut pruned = Vec::new();
    prune_node(obj, Some(schema), true, "", &mut pruned);
    pruned.sort();
    pruned
}

fn child_path(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

/// `root` marks the resource root, which kube-apiserver treats as an embedded resource.
fn prune_node(x: &mut Value, s: Option<&Value>, root: bool, path: &str, out: &mut Vec<String>) {
    if let Some(s) = s
        && flag(s, PRESERVE_UNKNOWN)
    {
        skip_prune(x, s, root, path, out);
        return;
    }
    match x {
        Value::Object(map) => {
            let Some(s) = s else {
                out.extend(map.keys().map(|k| child_path(path, k)));
                map.clear();
                return;
            };
            let embedded = root || flag(s, EMBEDDED_RESOURCE);
            map.retain(|k, v| {
                if embedded && META_FIELDS.contains(&k.as_str()) {
                    return true;
                }
                if let Some(prop) = property(s, k) {
                    prune_node(v, Some(prop), false, &child_path(path, k), out);
                    true
                } else if let Some(ap) = additional(s) {
                    prune_node(v, ap.schema(), false, &child_path(path, k), out);
                    true
                } else {
                    if !META_FIELDS.contains(&k.as_str()) || !path.is_empty() {
                        out.push(child_path(path, k));
                    }
                    false
                }
            });
        }
        Value::Array(list) => {
            let item_schema = s.and_then(items);
            for (i, v) in list.iter_mut().enumerate() {
                prune_node(v, item_schema, false, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// Under x-kubernetes-preserve-unknown-fields unknown fields stay, but declared ones are pruned.
fn skip_prune(x: &mut Value, s: &Value, root: bool, path: &str, out: &mut Vec<String>) {
    match x {
        Value::Object(map) => {
            let embedded = root || flag(s, EMBEDDED_RESOURCE);
            for (k, v) in map.iter_mut() {
                if embedded && META_FIELDS.contains(&k.as_str()) {
                    continue;
                }
                if let Some(prop) = property(s, k) {
                    prune_node(v, Some(prop), false, &child_path(path, k), out);
                } else if let Some(ap) = additional(s) {
                    prune_node(v, ap.schema(), false, &child_path(path, k), out);
                }
            }
        }
        Value::Array(list) => {
            if let Some(is) = items(s) {
                for (i, v) in list.iter_mut().enumerate() {
                    skip_prune(v, is, false, &format!("{path}[{i}]"), out);
                }
            }
        }
        _ => {}
    }
}

// ---------------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------------

/// Formats kube-apiserver checks; the others are stripped from CRD schemas before validation
/// (apiextensions `StripUnsupportedFormatsPostProcess`), so they never fail.
const SUPPORTED_FORMATS: &[&str] = &[
    "bsonobjectid",
    "uri",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "cidr",
    "mac",
    "uuid",
    "uuid3",
    "uuid4",
    "uuid5",
    "isbn",
    "isbn10",
    "isbn13",
    "creditcard",
    "ssn",
    "hexcolor",
    "rgbcolor",
    "byte",
    "password",
    "date",
    "duration",
    "datetime",
];

/// Validates `obj` against the schema; returns every violation.
///
/// Runs what kube-apiserver runs on a custom resource: the OpenAPI value validation, the
/// apiVersion/kind checks of embedded resources, and the uniqueness of
/// `x-kubernetes-list-type: set` / `map` lists.
pub fn validate(obj: &Value, schema: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    validate_node(obj, schema, "", &mut errs);
    validate_embedded(obj, schema, "", true, &mut errs);
    validate_list_types(obj, schema, "", &mut errs);
    errs
}

/// The field of an error reported by kube-openapi under `name` (kubeOpenAPIResultToFieldErrors).
fn error_field(name: &str) -> String {
    let trimmed = name.strip_prefix('.').unwrap_or(name);
    if trimmed.is_empty() {
        "<nil>".to_string()
    } else {
        trimmed.to_string()
    }
}

/// An error kube-openapi raises about a whole junctor; Kubernetes reports it on a nil path.
fn composite_error(detail: String) -> FieldError {
    FieldError::invalid("<nil>", Value::String(String::new()), detail)
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The allowed types of a node; `x-kubernetes-int-or-string` means integer or string.
fn schema_types(s: &Value) -> Vec<&str> {
    if flag(s, INT_OR_STRING) {
        return vec!["integer", "string"];
    }
    match string_of(s, "type") {
        Some(t) if !t.is_empty() => vec![t],
        _ => Vec::new(),
    }
}

/// The node's format if kube-apiserver validates it (names compare without dashes).
fn effective_format(s: &Value) -> Option<&str> {
    let format = string_of(s, "format").filter(|f| !f.is_empty())?;
    SUPPORTED_FORMATS
        .contains(&format.replace('-', "").as_str())
        .then_some(format)
}

/// swag.IsFloat64AJSONInteger: whole within the safe JSON range, allowing a relative error of 1e-9.
fn is_json_integer(f: f64) -> bool {
    const MAX_JSON_FLOAT: f64 = 9007199254740992.0; // 2^53
    if !f.is_finite() || !(-MAX_JSON_FLOAT..=MAX_JSON_FLOAT).contains(&f) {
        return false;
    }
    let g = f.trunc();
    if f == g {
        return true;
    }
    let diff = (f - g).abs();
    if g == 0.0 {
        return diff < 1e-9 * f64::MIN_POSITIVE;
    }
    diff / (f.abs() + g.abs()) < 1e-9
}

fn validate_node(data: &Value, s: &Value, path: &str, out: &mut Vec<FieldError>) {
    let types = schema_types(s);
    let format = effective_format(s);
    if data.is_null() {
        if !types.is_empty() && !nullable(s) {
            out.push(type_error(path, &types.join(","), "null"));
        }
        check_enum(data, s, path, out);
        return;
    }
    if !types.is_empty() || format.is_some() {
        check_type(data, &types, format, path, out);
    }
    check_junctors(data, s, path, out);
    match data {
        Value::String(text) => {
            check_string(text, s, path, out);
            if let Some(format) = format
                && !format_matches(format, text)
            {
                out.push(FieldError::type_invalid(
                    error_field(path),
                    data.clone(),
                    format!(
                        "{path} in body must be of type {format}: {}",
                        go_quote(text)
                    ),
                ));
            }
        }
        Value::Number(n) => check_number(n, s, path, out),
        Value::Array(list) => check_array(list, s, path, out),
        _ => {}
    }
    check_enum(data, s, path, out);
    if let Value::Object(map) = data {
        check_object(map, s, path, out);
    }
}

fn type_error(path: &str, type_name: &str, actual: &str) -> FieldError {
    FieldError::type_invalid(
        error_field(path),
        Value::String(actual.to_string()),
        format!(
            "{path} in body must be of type {type_name}: {}",
            go_quote(actual)
        ),
    )
}

/// kube-openapi's type validator, quirks included (a format may stand in for the type).
fn check_type(
    data: &Value,
    types: &[&str],
    format: Option<&str>,
    path: &str,
    out: &mut Vec<FieldError>,
) {
    let actual = json_type(data);
    let go_format = match data {
        Value::Number(n) if n.is_i64() || n.is_u64() => "int64",
        Value::Number(_) => "float64",
        _ => "",
    };
    let float_is_int = actual == "number"
        && data.as_f64().is_some_and(is_json_integer)
        && types.contains(&"integer");
    let int_is_number = actual == "integer" && types.contains(&"number");
    let string_or_array = matches!(data, Value::String(_) | Value::Array(_));
    if let Some(format) = format {
        let matches_type =
            types.contains(&actual) || go_format == format || float_is_int || int_is_number;
        if !string_or_array && !matches_type {
            out.push(type_error(path, format, go_format));
            return;
        }
        if string_or_array && !types.iter().any(|t| *t == "number" || *t == "integer") {
            return;
        }
    }
    if !(types.contains(&actual) || float_is_int || int_is_number) {
        out.push(type_error(path, &types.join(","), actual));
    }
}

/// allOf / anyOf / oneOf / not, reported as kube-openapi's schemaPropsValidator does.
fn check_junctors(data: &Value, s: &Value, path: &str, out: &mut Vec<FieldError>) {
    let run = |branch: &Value| {
        let mut errs = Vec::new();
        validate_node(data, branch, path, &mut errs);
        errs
    };
    let branches = |key: &str| {
        s.get(key)
            .and_then(Value::as_array)
            .filter(|b| !b.is_empty())
    };

    if let Some(any_of) = branches("anyOf") {
        // The errors of the branch that came closest are shown along with the summary.
        let mut best: Option<Vec<FieldError>> = None;
        let mut matched = false;
        for branch in any_of {
            let errs = run(branch);
            if errs.is_empty() {
                matched = true;
                break;
            }
            if best.as_ref().is_none_or(|b| errs.len() < b.len()) {
                best = Some(errs);
            }
        }
        if !matched {
            out.push(composite_error(format!(
                "{} must validate at least one schema (anyOf)",
                go_quote(path)
            )));
            out.extend(best.unwrap_or_default());
        }
    }

    if let Some(one_of) = branches("oneOf") {
        let mut best: Option<Vec<FieldError>> = None;
        let mut valid = 0;
        for branch in one_of {
            let errs = run(branch);
            if errs.is_empty() {
                valid += 1;
            } else if valid == 0 && best.as_ref().is_none_or(|b| errs.len() < b.len()) {
                best = Some(errs);
            }
        }
        if valid != 1 {
            let found = if valid == 0 {
                "Found none valid".to_string()
            } else {
                format!("Found {valid} valid alternatives")
            };
            out.push(composite_error(format!(
                "{} must validate one and only one schema (oneOf). {found}",
                go_quote(path)
            )));
            if valid == 0 {
                out.extend(best.unwrap_or_default());
            }
        }
    }

    if let Some(all_of) = branches("allOf") {
        let mut valid = 0;
        for branch in all_of {
            let errs = run(branch);
            if errs.is_empty() {
                valid += 1;
            }
            out.extend(errs);
        }
        if valid != all_of.len() {
            let none = if valid == 0 { ". None validated" } else { "" };
            out.push(composite_error(format!(
                "{} must validate all the schemas (allOf){none}",
                go_quote(path)
            )));
        }
    }

    if let Some(not) = s.get("not").filter(|n| n.is_object())
        && run(not).is_empty()
    {
        out.push(composite_error(format!(
            "{} must not validate the schema (not)",
            go_quote(path)
        )));
    }
}

/// maxLength, minLength, pattern: kube-openapi stops at the first failure.
fn check_string(text: &str, s: &Value, path: &str, out: &mut Vec<FieldError>) {
    let len = text.chars().count() as i64;
    if let Some(max) = int_of(s, "maxLength")
        && len > max
    {
        out.push(FieldError::too_long(error_field(path), max));
        return;
    }
    if let Some(min) = int_of(s, "minLength")
        && len < min
    {
        out.push(FieldError::invalid(
            error_field(path),
            Value::String(text.to_string()),
            format!("{path} in body should be at least {min} chars long"),
        ));
        return;
    }
    if let Some(pattern) = string_of(s, "pattern") {
        let detail = match compiled(pattern) {
            Ok(re) if re.is_match(text) => return,
            Ok(_) => format!("{path} in body should match '{pattern}'"),
            Err(err) => {
                format!("{path} in body should match '{pattern}, but pattern is invalid: {err}'")
            }
        };
        out.push(FieldError::invalid(
            error_field(path),
            Value::String(text.to_string()),
            detail,
        ));
    }
}

/// Compiled patterns, cached because the same schema validates every object of a kind.
///
/// Shared behind an `Arc`, not cloned: a cloned `Regex` starts with an empty match cache, so
/// every validation would build its lazy DFA again (about 2% of the lab API servers' CPU
/// when many peerings write CRs at once).
fn compiled(pattern: &str) -> Result<std::sync::Arc<Regex>, regex::Error> {
    static CACHE: OnceLock<Mutex<HashMap<String, std::sync::Arc<Regex>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let mut cache = cache
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(re) = cache.get(pattern) {
        return Ok(re.clone());
    }
    let re = std::sync::Arc::new(Regex::new(pattern)?);
    if cache.len() > 1024 {
        cache.clear();
    }
    cache.insert(pattern.to_string(), re.clone());
    Ok(re)
}

fn format_matches(format: &str, text: &str) -> bool {
    static PATTERNS: OnceLock<HashMap<&'static str, Regex>> = OnceLock::new();
    let patterns = PATTERNS.get_or_init(|| {
        let table: &[(&str, &str)] = &[
            ("uuid", r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$"),
            ("uuid3", r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?3[0-9a-f]{3}-?[0-9a-f]{4}-?[0-9a-f]{12}$"),
            ("uuid4", r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?4[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$"),
            ("uuid5", r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?5[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$"),
            ("hexcolor", r"^#?([0-9a-fA-F]{3}|[0-9a-fA-F]{6})$"),
            ("rgbcolor", r"^rgb\(\s*(0|[1-9]\d?|1\d\d?|2[0-4]\d|25[0-5])\s*,\s*(0|[1-9]\d?|1\d\d?|2[0-4]\d|25[0-5])\s*,\s*(0|[1-9]\d?|1\d\d?|2[0-4]\d|25[0-5])\s*\)$"),
            ("ssn", r"^\d{3}[- ]?\d{2}[- ]?\d{4}$"),
            ("bsonobjectid", r"^[0-9a-fA-F]{24}$"),
            ("hostname", r"^[a-zA-Z0-9]([-a-zA-Z0-9]{0,61}[a-zA-Z0-9])?(\.[a-zA-Z0-9]([-a-zA-Z0-9]{0,61}[a-zA-Z0-9])?)*$"),
            ("email", r"^[^@\s]+@[^@\s]+$"),
            ("mac", r"^([0-9A-Fa-f]{2}[:-]){5}[0-9A-Fa-f]{2}$|^([0-9A-Fa-f]{4}\.){2}[0-9A-Fa-f]{4}$|^([0-9A-Fa-f]{2}[:-]){7}[0-9A-Fa-f]{2}$|^([0-9A-Fa-f]{2}[:-]){19}[0-9A-Fa-f]{2}$"),
        ];
        table
            .iter()
            .filter_map(|(name, re)| Regex::new(re).ok().map(|re| (*name, re)))
            .collect()
    });
    let normalized = format.replace('-', "");
    match normalized.as_str() {
        "datetime" => chrono::DateTime::parse_from_rfc3339(text).is_ok(),
        "date" => chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d").is_ok(),
        "ipv4" => text.parse::<std::net::Ipv4Addr>().is_ok(),
        "ipv6" => text.contains(':') && text.parse::<std::net::IpAddr>().is_ok(),
        "cidr" => is_cidr(text),
        "byte" => {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .is_ok()
        }
        "hostname" => {
            text.len() <= 255 && patterns.get("hostname").is_none_or(|re| re.is_match(text))
        }
        // Checks that need more than a pattern (URIs, durations, ISBN and card checksums) are
        // not reproduced: such values pass, which errs on the side of accepting objects.
        name => patterns.get(name).is_none_or(|re| re.is_match(text)),
    }
}

fn is_cidr(text: &str) -> bool {
    let Some((ip, bits)) = text.split_once('/') else {
        return false;
    };
    let Ok(bits) = bits.parse::<u8>() else {
        return false;
    };
    match ip.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => bits <= 32,
        Ok(std::net::IpAddr::V6(_)) => bits <= 128,
        Err(_) => false,
    }
}

/// maximum, minimum (and exclusive variants), multipleOf. Integers are compared with the bound
/// truncated to an integer, as kube-openapi does.
fn check_number(n: &Number, s: &Value, path: &str, out: &mut Vec<FieldError>) {
    let value = Value::Number(n.clone());
    let int = n
        .as_i64()
        .or_else(|| n.as_u64().map(|u| u.min(i64::MAX as u64) as i64));
    let float = n.as_f64().unwrap_or(0.0);
    let field = error_field(path);

    if let Some(max) = float_of(s, "maximum") {
        let exclusive = flag(s, "exclusiveMaximum");
        let (exceeds, bound) = match int {
            Some(i) => {
                let m = max as i64;
                (if exclusive { i >= m } else { i > m }, m.to_string())
            }
            None => (
                if exclusive { float >= max } else { float > max },
                go_float(max),
            ),
        };
        if exceeds {
            let relation = if exclusive {
                "less than"
            } else {
                "less than or equal to"
            };
            out.push(FieldError::invalid(
                field.clone(),
                value.clone(),
                format!("{path} in body should be {relation} {bound}"),
            ));
        }
    }
    if let Some(min) = float_of(s, "minimum") {
        let exclusive = flag(s, "exclusiveMinimum");
        let (below, bound) = match int {
            Some(i) => {
                let m = min as i64;
                (if exclusive { i <= m } else { i < m }, m.to_string())
            }
            None => (
                if exclusive { float <= min } else { float < min },
                go_float(min),
            ),
        };
        if below {
            let relation = if exclusive {
                "greater than"
            } else {
                "greater than or equal to"
            };
            out.push(FieldError::invalid(
                field.clone(),
                value.clone(),
                format!("{path} in body should be {relation} {bound}"),
            ));
        }
    }
    if let Some(factor) = float_of(s, "multipleOf") {
        if factor < 0.0 {
            out.push(FieldError::invalid(
                field,
                Value::from(factor),
                format!(
                    "factor MultipleOf declared for {path} must be positive: {}",
                    go_float(factor)
                ),
            ));
            return;
        }
        let detail = match int {
            Some(i) if factor as i64 != 0 => {
                let f = factor as i64;
                (i % f != 0).then(|| format!("{path} in body should be a multiple of {f}"))
            }
            _ => {
                let ratio = if factor < 1.0 {
                    1.0 / factor * float
                } else {
                    float / factor
                };
                (!is_json_integer(ratio)).then(|| {
                    format!(
                        "{path} in body should be a multiple of {}",
                        go_float(factor)
                    )
                })
            }
        };
        if let Some(detail) = detail {
            out.push(FieldError::invalid(field, value, detail));
        }
    }
}

fn check_array(list: &[Value], s: &Value, path: &str, out: &mut Vec<FieldError>) {
    if let Some(is) = items(s) {
        for (i, item) in list.iter().enumerate() {
            validate_node(item, is, &format!("{path}[{i}]"), out);
        }
    }
    let len = list.len();
    if let Some(min) = int_of(s, "minItems")
        && (len as i64) < min
    {
        out.push(FieldError::invalid(
            error_field(path),
            Value::from(len),
            format!("{path} in body should have at least {min} items"),
        ));
    }
    if let Some(max) = int_of(s, "maxItems")
        && len as i64 > max
    {
        out.push(FieldError::too_many(error_field(path), len, max));
    }
    if flag(s, "uniqueItems") {
        let duplicated = list.iter().enumerate().any(|(i, a)| list[..i].contains(a));
        if duplicated {
            out.push(FieldError::invalid(
                error_field(path),
                Value::String(String::new()),
                format!("{path} in body shouldn't contain duplicates"),
            ));
        }
    }
}

/// Numbers compare by value (1 matches 1.0), as the Go validator converts before comparing.
fn json_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

fn check_enum(data: &Value, s: &Value, path: &str, out: &mut Vec<FieldError>) {
    let Some(allowed) = s
        .get("enum")
        .and_then(Value::as_array)
        .filter(|e| !e.is_empty())
    else {
        return;
    };
    // kube-openapi never matches a null value against an enum (it has no Go type to compare).
    if !data.is_null() && allowed.iter().any(|e| !e.is_null() && json_equal(data, e)) {
        return;
    }
    let supported: Vec<String> = allowed
        .iter()
        .map(|e| match e {
            Value::String(s) => s.clone(),
            other => go_json(other),
        })
        .collect();
    out.push(FieldError::not_supported(
        error_field(path),
        data.clone(),
        &supported,
    ));
}

fn check_object(map: &Map<String, Value>, s: &Value, path: &str, out: &mut Vec<FieldError>) {
    let count = map.len();
    // kube-openapi reports a property count violation alone, skipping the fields.
    if let Some(min) = int_of(s, "minProperties")
        && (count as i64) < min
    {
        out.push(FieldError::invalid(
            error_field(path),
            Value::from(count),
            format!("{path} in body should have at least {min} properties"),
        ));
        return;
    }
    if let Some(max) = int_of(s, "maxProperties")
        && count as i64 > max
    {
        out.push(FieldError::too_many(error_field(path), count, max));
        return;
    }
    let declared = |k: &str| property(s, k).is_some();
    match additional(s) {
        Some(Additional::Allows(false)) => {
            for k in map.keys().filter(|k| !declared(k)) {
                out.push(FieldError::invalid(
                    error_field(path),
                    Value::String(k.clone()),
                    format!("{path}.{k} in body is a forbidden property"),
                ));
            }
        }
        Some(Additional::Schema(ap)) => {
            for (k, v) in map.iter().filter(|(k, _)| !declared(k)) {
                validate_node(v, ap, &format!("{path}.{k}"), out);
            }
        }
        _ => {}
    }
    if let Some(props) = properties(s) {
        for (name, prop) in props {
            if let Some(v) = map.get(name) {
                validate_node(v, prop, &child_path(path, name), out);
            }
        }
    }
    if let Some(required) = s.get("required").and_then(Value::as_array) {
        for name in required.iter().filter_map(Value::as_str) {
            if !map.contains_key(name) {
                out.push(FieldError::required(
                    error_field(&format!("{path}.{name}")),
                    "",
                ));
            }
        }
    }
}

/// Embedded resources (x-kubernetes-embedded-resource) must name their apiVersion and kind.
fn validate_embedded(x: &Value, s: &Value, path: &str, root: bool, out: &mut Vec<FieldError>) {
    match x {
        Value::Object(map) => {
            if !root && flag(s, EMBEDDED_RESOURCE) {
                check_type_meta(map, path, out);
            }
            for (k, v) in map {
                if let Some(prop) = property(s, k) {
                    validate_embedded(v, prop, &child_path(path, k), false, out);
                } else if let Some(ap) = additional(s).and_then(|a| a.schema()) {
                    validate_embedded(v, ap, &format!("{path}[{k}]"), false, out);
                }
            }
        }
        Value::Array(list) => {
            if let Some(is) = items(s) {
                for (i, v) in list.iter().enumerate() {
                    validate_embedded(v, is, &format!("{path}[{i}]"), false, out);
                }
            }
        }
        _ => {}
    }
}

fn check_type_meta(map: &Map<String, Value>, path: &str, out: &mut Vec<FieldError>) {
    for key in ["apiVersion", "kind"] {
        let field = child_path(path, key);
        match map.get(key) {
            None => out.push(FieldError::required(field, "must not be empty")),
            Some(Value::String(s)) if s.is_empty() => out.push(FieldError::invalid(
                field,
                Value::String(String::new()),
                "must not be empty",
            )),
            Some(Value::String(s)) => {
                let problem = if key == "apiVersion" {
                    (s.matches('/').count() > 1)
                        .then(|| format!("unexpected GroupVersion string: {s}"))
                } else {
                    dns1035_label_problem(&s.to_lowercase())
                        .map(|p| format!("may have mixed case, but should otherwise match: {p}"))
                };
                if let Some(problem) = problem {
                    out.push(FieldError::invalid(
                        field,
                        Value::String(s.clone()),
                        problem,
                    ));
                }
            }
            Some(other) => out.push(FieldError::invalid(
                field,
                other.clone(),
                "must be a string",
            )),
        }
    }
}

/// utilvalidation.IsDNS1035Label, joined as Kubernetes joins its messages.
fn dns1035_label_problem(value: &str) -> Option<String> {
    static LABEL: OnceLock<Regex> = OnceLock::new();
    let label =
        LABEL.get_or_init(|| Regex::new("^[a-z]([-a-z0-9]*[a-z0-9])?$").expect("valid regex"));
    let mut problems = Vec::new();
    if value.len() > 63 {
        problems.push("must be no more than 63 characters".to_string());
    }
    if !label.is_match(value) {
        problems.push(
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')".to_string(),
        );
    }
    (!problems.is_empty()).then(|| problems.join(","))
}

/// x-kubernetes-list-type set and map: items (resp. key tuples) must be unique.
fn validate_list_types(x: &Value, s: &Value, path: &str, out: &mut Vec<FieldError>) {
    match x {
        Value::Object(map) => {
            for (k, v) in map {
                if let Some(prop) = property(s, k) {
                    validate_list_types(v, prop, &child_path(path, k), out);
                } else if let Some(ap) = additional(s).and_then(|a| a.schema()) {
                    validate_list_types(v, ap, &format!("{path}[{k}]"), out);
                }
            }
        }
        Value::Array(list) => {
            match string_of(s, LIST_TYPE) {
                Some("set") => check_list_set(list, path, out),
                Some("map") => check_list_map(list, s, path, out),
                _ => {}
            }
            if let Some(is) = items(s) {
                for (i, v) in list.iter().enumerate() {
                    validate_list_types(v, is, &format!("{path}[{i}]"), out);
                }
            }
        }
        _ => {}
    }
}

fn check_list_set(list: &[Value], path: &str, out: &mut Vec<FieldError>) {
    // Kubernetes reports each repeated item once, at its second occurrence.
    let mut seen: Vec<(&Value, usize)> = Vec::new();
    for (i, item) in list.iter().enumerate() {
        match seen.iter_mut().find(|(v, _)| *v == item) {
            Some((_, times)) => {
                *times += 1;
                if *times == 2 {
                    out.push(FieldError::duplicate(format!("{path}[{i}]"), item.clone()));
                }
            }
            None => seen.push((item, 1)),
        }
    }
}

fn check_list_map(list: &[Value], s: &Value, path: &str, out: &mut Vec<FieldError>) {
    for (i, item) in list.iter().enumerate() {
        if !item.is_null() && !item.is_object() {
            out.push(FieldError::invalid(
                format!("{path}[{i}]"),
                item.clone(),
                "must be an object for an array of list-type map",
            ));
            return;
        }
    }
    let keys: Vec<&str> = s
        .get(LIST_MAP_KEYS)
        .and_then(Value::as_array)
        .map(|k| k.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let item_schema = items(s);
    let mut seen: Vec<(Value, usize)> = Vec::new();
    for (i, item) in list.iter().enumerate() {
        let Value::Object(fields) = item else {
            continue;
        };
        // A missing key takes its default; without one it is "unspecified", shown as {}.
        let key: Map<String, Value> = keys
            .iter()
            .map(|k| {
                let v = fields
                    .get(*k)
                    .cloned()
                    .or_else(|| {
                        item_schema
                            .and_then(|is| property(is, k))
                            .and_then(default_of)
                            .cloned()
                    })
                    .unwrap_or_else(|| Value::Object(Map::new()));
                (k.to_string(), v)
            })
            .collect();
        let key = Value::Object(key);
        match seen.iter_mut().find(|(v, _)| *v == key) {
            Some((_, times)) => {
                *times += 1;
                if *times == 2 {
                    out.push(FieldError::duplicate(format!("{path}[{i}]"), key));
                }
            }
            None => seen.push((key, 1)),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Structural schema checks
// ---------------------------------------------------------------------------------------------

/// Where a schema node sits: it decides the wording of a missing `type`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Level {
    Root,
    Item,
    Field,
}

/// Checks a CRD's schema is structural (every node has a type unless x-kubernetes-int-or-string / preserve-unknown-fields, no additionalProperties together with properties, ...); messages name the schema path.
///
/// Paths start at `openAPIV3Schema` (prefix them with `spec.versions[i].schema.` for a CRD) and
/// messages are sorted, as kube-apiserver reports them in the `NonStructuralSchema` condition
/// and when rejecting a CRD.
pub fn structural_errors(schema: &Value) -> Vec<String> {
    const ROOT: &str = "openAPIV3Schema";
    let mut errs = Vec::new();
    structural_invariants(schema, Level::Root, ROOT, &mut errs);
    structural_completeness(schema, Some(schema), ROOT, ROOT, &mut errs);
    crd_schema_rules(schema, ROOT, true, false, &mut errs);
    // Defaults are only meaningful (and only checked by kube-apiserver) on a structural schema.
    if errs.is_empty() {
        default_rules(schema, ROOT, true, DefaultScope::Field, &mut errs);
    }
    let mut messages: Vec<String> = errs.iter().map(ToString::to_string).collect();
    messages.sort();
    messages.dedup();
    messages
}

fn key_path(parent: &str, child: &str, key: &str) -> String {
    format!("{parent}.{child}[{key}]")
}

fn type_value(s: &Value) -> Value {
    Value::String(string_of(s, "type").unwrap_or_default().to_string())
}

fn structural_invariants(s: &Value, lvl: Level, path: &str, out: &mut Vec<FieldError>) {
    if !s.is_object() {
        return;
    }
    let ty = string_of(s, "type").unwrap_or_default();
    let embedded = flag(s, EMBEDDED_RESOURCE);
    let int_or_string = flag(s, INT_OR_STRING);
    let preserve = flag(s, PRESERVE_UNKNOWN);

    if ty == "array" && items(s).is_none() {
        out.push(FieldError::required(
            format!("{path}.items"),
            "must be specified",
        ));
    }
    if let Some(is) = items(s) {
        structural_invariants(is, Level::Item, &format!("{path}.items"), out);
    }
    if let Some(props) = properties(s) {
        for (k, v) in props {
            structural_invariants(v, Level::Field, &key_path(path, "properties", k), out);
        }
    }
    if let Some(ap) = additional(s) {
        if lvl == Level::Root {
            out.push(FieldError::forbidden(
                format!("{path}.additionalProperties"),
                "must not be used at the root",
            ));
        }
        if let Some(ap) = ap.schema() {
            structural_invariants(
                ap,
                Level::Field,
                &format!("{path}.additionalProperties"),
                out,
            );
        }
    }
    if int_or_string && preserve {
        out.push(FieldError::invalid(
            format!("{path}.{PRESERVE_UNKNOWN}"),
            Value::Bool(true),
            "must be false if x-kubernetes-int-or-string is true",
        ));
    }
    if int_or_string && embedded {
        out.push(FieldError::invalid(
            format!("{path}.{EMBEDDED_RESOURCE}"),
            Value::Bool(true),
            "must be false if x-kubernetes-int-or-string is true",
        ));
    }

    let skip_any_of = is_int_or_string_any_of(s.get("anyOf"));
    let skip_first_all_of_any_of = s
        .get("allOf")
        .and_then(Value::as_array)
        .and_then(|all| all.first())
        .is_some_and(|first| is_int_or_string_any_of(first.get("anyOf")));
    value_validation(s, skip_any_of, skip_first_all_of_any_of, path, out);

    if embedded && ty != "object" {
        let detail = "must be object if x-kubernetes-embedded-resource is true";
        if ty.is_empty() {
            out.push(FieldError::required(format!("{path}.type"), detail));
        } else {
            out.push(FieldError::invalid(
                format!("{path}.type"),
                type_value(s),
                detail,
            ));
        }
    } else if ty.is_empty() && !int_or_string && !preserve {
        let detail = match lvl {
            Level::Root => "must not be empty at the root",
            Level::Item => "must not be empty for specified array items",
            Level::Field => "must not be empty for specified object fields",
        };
        out.push(FieldError::required(format!("{path}.type"), detail));
    }
    if embedded && additional(s).is_some() {
        out.push(FieldError::forbidden(
            format!("{path}.additionalProperties"),
            "must not be used if x-kubernetes-embedded-resource is set",
        ));
    }
    if lvl == Level::Root && !ty.is_empty() && ty != "object" {
        out.push(FieldError::invalid(
            format!("{path}.type"),
            type_value(s),
            "must be object at the root",
        ));
    }

    if lvl == Level::Root || embedded {
        for (name, want) in [
            ("kind", "string"),
            ("apiVersion", "string"),
            ("metadata", "object"),
        ] {
            if let Some(prop) = property(s, name)
                && string_of(prop, "type").unwrap_or_default() != want
            {
                out.push(FieldError::invalid(
                    format!("{}.type", key_path(path, "properties", name)),
                    type_value(prop),
                    format!("must be {want}"),
                ));
            }
        }
    }
    if lvl == Level::Root
        && let Some(metadata) = property(s, "metadata")
        && !is_plain_root_metadata(metadata)
    {
        out.push(FieldError::forbidden(
                    key_path(path, "properties", "metadata"),
                    "must not specify anything other than name and generateName, but metadata is implicitly specified",
                ));
    }
    if embedded && !preserve && properties(s).is_none_or(Map::is_empty) {
        out.push(FieldError::required(
            format!("{path}.properties"),
            "must not be empty if x-kubernetes-embedded-resource is true without x-kubernetes-preserve-unknown-fields",
        ));
    }
}

/// Root metadata may only say it is an object and restrict name and generateName.
fn is_plain_root_metadata(metadata: &Value) -> bool {
    let Some(fields) = metadata.as_object() else {
        return false;
    };
    fields.iter().all(|(k, v)| match k.as_str() {
        "type" | "default" => true,
        "properties" => v
            .as_object()
            .is_some_and(|p| p.keys().all(|k| k == "name" || k == "generateName")),
        _ => false,
    })
}

/// The `anyOf: [{type: integer}, {type: string}]` spelling of int-or-string.
fn is_int_or_string_any_of(any_of: Option<&Value>) -> bool {
    let Some(branches) = any_of.and_then(Value::as_array) else {
        return false;
    };
    branches.len() == 2
        && branches[0] == serde_json::json!({"type": "integer"})
        && branches[1] == serde_json::json!({"type": "string"})
}

fn value_validation(
    s: &Value,
    skip_any_of: bool,
    skip_first_all_of_any_of: bool,
    path: &str,
    out: &mut Vec<FieldError>,
) {
    let branches = |key: &str| {
        s.get(key)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    if !skip_any_of {
        for (i, b) in branches("anyOf").iter().enumerate() {
            nested_value_validation(b, false, false, &format!("{path}.anyOf[{i}]"), out);
        }
    }
    for (i, b) in branches("allOf").iter().enumerate() {
        let skip = skip_first_all_of_any_of && i == 0;
        nested_value_validation(b, skip, false, &format!("{path}.allOf[{i}]"), out);
    }
    for (i, b) in branches("oneOf").iter().enumerate() {
        nested_value_validation(b, false, false, &format!("{path}.oneOf[{i}]"), out);
    }
    if let Some(not) = s.get("not") {
        nested_value_validation(not, false, false, &format!("{path}.not"), out);
    }
    if let Some(pattern) = string_of(s, "pattern").filter(|p| !p.is_empty())
        && let Err(err) = Regex::new(pattern)
    {
        out.push(FieldError::invalid(
            format!("{path}.pattern"),
            Value::String(pattern.to_string()),
            format!("must be a valid regular expression, but isn't: {err}"),
        ));
    }
}

/// Under allOf/anyOf/oneOf/not only value validations may appear, never structure.
fn nested_value_validation(
    v: &Value,
    skip_any_of: bool,
    skip_all_of_any_of: bool,
    path: &str,
    out: &mut Vec<FieldError>,
) {
    if !v.is_object() {
        return;
    }
    value_validation(v, skip_any_of, skip_all_of_any_of, path, out);
    if let Some(is) = items(v) {
        nested_value_validation(is, false, false, &format!("{path}.items"), out);
    }
    if let Some(props) = properties(v) {
        for (k, p) in props {
            nested_value_validation(p, false, false, &key_path(path, "properties", k), out);
        }
    }
    let set = |key: &str| match v.get(key) {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Bool(b)) => *b,
        Some(Value::Array(a)) => !a.is_empty(),
        Some(_) => true,
    };
    let forbidden: [(&str, &str); 11] = [
        ("type", "must be empty to be structural"),
        ("additionalProperties", "must be undefined to be structural"),
        ("default", "must be undefined to be structural"),
        ("title", "must be empty to be structural"),
        ("description", "must be empty to be structural"),
        ("nullable", "must be false to be structural"),
        (PRESERVE_UNKNOWN, "must be false to be structural"),
        (EMBEDDED_RESOURCE, "must be false to be structural"),
        (INT_OR_STRING, "must be false to be structural"),
        (LIST_MAP_KEYS, "must be empty to be structural"),
        (LIST_TYPE, "must be undefined to be structural"),
    ];
    for (key, detail) in forbidden {
        // additionalProperties: false and default: null are still "defined".
        let present = match key {
            "additionalProperties" | "default" | LIST_TYPE => v.get(key).is_some(),
            _ => set(key),
        };
        if present {
            out.push(FieldError::forbidden(format!("{path}.{key}"), detail));
        }
    }
    if property(v, "metadata").is_some() {
        out.push(FieldError::forbidden(
            key_path(path, "properties", "metadata"),
            "must not be specified in a nested context",
        ));
    }
}

/// Every field or item named under a junctor must also be specified structurally. Like
/// kube-apiserver this starts from the root's junctors only.
fn structural_completeness(
    v: &Value,
    s: Option<&Value>,
    s_path: &str,
    v_path: &str,
    out: &mut Vec<FieldError>,
) {
    let branches = |key: &str| {
        v.get(key)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    if let Some(not) = v.get("not").filter(|n| n.is_object()) {
        nested_completeness(not, s, s_path, &format!("{v_path}.not"), out);
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        for (i, b) in branches(key).iter().enumerate() {
            nested_completeness(b, s, s_path, &format!("{v_path}.{key}[{i}]"), out);
        }
    }
}

fn nested_completeness(
    v: &Value,
    s: Option<&Value>,
    s_path: &str,
    v_path: &str,
    out: &mut Vec<FieldError>,
) {
    let Some(s) = s else {
        out.push(FieldError::required(
            s_path,
            format!("because it is defined in {v_path}"),
        ));
        return;
    };
    structural_completeness(v, Some(s), s_path, v_path, out);
    if let Some(vi) = items(v) {
        nested_completeness(
            vi,
            items(s),
            &format!("{s_path}.items"),
            &format!("{v_path}.items"),
            out,
        );
    }
    if let Some(props) = properties(v) {
        for (k, vp) in props {
            let sp = key_path(s_path, "properties", k);
            let vpath = key_path(v_path, "properties", k);
            match property(s, k) {
                None => out.push(FieldError::required(
                    sp,
                    format!("because it is defined in {vpath}"),
                )),
                Some(sf) => nested_completeness(vp, Some(sf), &sp, &vpath, out),
            }
        }
    }
}

/// The rules CRD validation adds to structurality (apiextensions ValidateCustomResourceDefinitionOpenAPISchema).
fn crd_schema_rules(
    s: &Value,
    path: &str,
    is_root: bool,
    inside_meta: bool,
    out: &mut Vec<FieldError>,
) {
    if !s.is_object() {
        return;
    }
    if is_root && nullable(s) {
        out.push(FieldError::forbidden(
            format!("{path}.nullable"),
            "nullable cannot be true at the root",
        ));
    }
    let unsupported = [
        ("id", "id is not supported"),
        ("additionalItems", "additionalItems is not supported"),
        ("patternProperties", "patternProperties is not supported"),
        ("definitions", "definitions is not supported"),
        ("dependencies", "dependencies is not supported"),
        ("$ref", "$ref is not supported"),
    ];
    for (key, detail) in unsupported {
        let set = match s.get(key) {
            None | Some(Value::Null) => false,
            Some(Value::String(v)) => !v.is_empty(),
            Some(Value::Object(m)) => {
                !m.is_empty() || key == "additionalItems" || key == "dependencies"
            }
            Some(_) => true,
        };
        if set {
            out.push(FieldError::forbidden(format!("{path}.{key}"), detail));
        }
    }
    if flag(s, "uniqueItems") {
        out.push(FieldError::forbidden(
            format!("{path}.uniqueItems"),
            "uniqueItems cannot be set to true since the runtime complexity becomes quadratic",
        ));
    }
    // Properties are for structs and additionalProperties for maps: both at once would
    // contradict the convention of ignoring unknown fields.
    if let Some(ap) = additional(s) {
        let has_properties = properties(s).is_some_and(|p| !p.is_empty());
        if has_properties && !matches!(ap, Additional::Allows(true)) {
            out.push(FieldError::forbidden(
                format!("{path}.additionalProperties"),
                "additionalProperties and properties are mutual exclusive",
            ));
        }
    }
    if let Some(ty) = string_of(s, "type").filter(|t| !t.is_empty()) {
        const TYPES: [&str; 6] = ["array", "boolean", "integer", "number", "object", "string"];
        if !TYPES.contains(&ty) {
            let supported: Vec<String> = TYPES.iter().map(|t| t.to_string()).collect();
            out.push(FieldError::not_supported(
                format!("{path}.type"),
                type_value(s),
                &supported,
            ));
        }
        if ty == "null" {
            out.push(FieldError::forbidden(
                format!("{path}.type"),
                "type cannot be set to null, use nullable as an alternative",
            ));
        }
    }
    if s.get("items").is_some_and(Value::is_array) {
        out.push(FieldError::forbidden(
            format!("{path}.items"),
            "items must be a schema object and not an array",
        ));
    }
    if inside_meta && flag(s, EMBEDDED_RESOURCE) {
        out.push(FieldError::forbidden(
            format!("{path}.{EMBEDDED_RESOURCE}"),
            "must not be used inside of resource meta",
        ));
    }
    if s.get(PRESERVE_UNKNOWN) == Some(&Value::Bool(false)) {
        out.push(FieldError::invalid(
            format!("{path}.{PRESERVE_UNKNOWN}"),
            Value::Bool(false),
            "must be true or undefined",
        ));
    }
    list_type_rules(s, path, out);

    let mut children: Vec<(String, &Value, bool)> = Vec::new();
    if let Some(props) = properties(s) {
        let holds_meta = is_root || flag(s, EMBEDDED_RESOURCE);
        children.extend(props.iter().map(|(k, v)| {
            let meta = inside_meta || (holds_meta && META_FIELDS.contains(&k.as_str()));
            (key_path(path, "properties", k), v, meta)
        }));
    }
    if let Some(is) = items(s) {
        children.push((format!("{path}.items"), is, inside_meta));
    }
    if let Some(ap) = additional(s).and_then(|a| a.schema()) {
        children.push((format!("{path}.additionalProperties"), ap, inside_meta));
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        if let Some(branches) = s.get(key).and_then(Value::as_array) {
            children.extend(
                branches
                    .iter()
                    .enumerate()
                    .map(|(i, b)| (format!("{path}.{key}[{i}]"), b, inside_meta)),
            );
        }
    }
    if let Some(not) = s.get("not") {
        children.push((format!("{path}.not"), not, inside_meta));
    }
    for (child_path, child, meta) in children {
        crd_schema_rules(child, &child_path, false, meta, out);
    }
}

/// Where a default sits, which decides how it is checked.
#[derive(Clone, Copy, PartialEq, Eq)]
enum DefaultScope<'a> {
    /// Ordinary fields: the default must survive pruning and validate.
    Field,
    /// Inside ObjectMeta/TypeMeta of an embedded resource: validated but not pruned, because
    /// the implicitly known metadata fields would be pruned as well.
    ResourceMeta,
    /// Not allowed at all, for the reason given.
    Forbidden(&'a str),
}

/// Every `default` must survive pruning and validate against its own node; none may sit in
/// the root's apiVersion, kind or metadata (apiextensions specStandardValidatorV3).
fn default_rules(
    s: &Value,
    path: &str,
    is_root: bool,
    scope: DefaultScope<'_>,
    out: &mut Vec<FieldError>,
) {
    if !s.is_object() {
        return;
    }
    if let Some(default) = default_of(s) {
        let at = format!("{path}.default");
        match scope {
            DefaultScope::Forbidden(reason) => {
                out.push(FieldError::forbidden(
                    at,
                    format!("must not be set {reason}"),
                ));
            }
            DefaultScope::Field | DefaultScope::ResourceMeta => {
                let mut pruned = default.clone();
                if scope == DefaultScope::Field {
                    prune_node(
                        &mut pruned,
                        Some(s),
                        flag(s, EMBEDDED_RESOURCE),
                        "",
                        &mut Vec::new(),
                    );
                }
                if &pruned != default {
                    out.push(FieldError::invalid(
                        at,
                        default.clone(),
                        "must not have unknown fields",
                    ));
                } else {
                    validate_embedded(default, s, &at, false, out);
                    // The default is validated as a document of its own: kube-openapi names
                    // fields relative to it and Kubernetes hangs them below `.default`.
                    let mut errs = Vec::new();
                    validate_node(default, s, "", &mut errs);
                    out.extend(errs.into_iter().map(|mut e| {
                        e.field = if e.field == "<nil>" {
                            at.clone()
                        } else {
                            format!("{at}.{}", e.field)
                        };
                        e
                    }));
                }
            }
        }
    }
    if let Some(props) = properties(s) {
        let holds_meta = is_root || flag(s, EMBEDDED_RESOURCE);
        for (k, p) in props {
            let child_scope = if holds_meta && META_FIELDS.contains(&k.as_str()) {
                if is_root {
                    DefaultScope::Forbidden(match k.as_str() {
                        "apiVersion" => "in top-level apiVersion",
                        "kind" => "in top-level kind",
                        _ => "in top-level metadata",
                    })
                } else if matches!(scope, DefaultScope::Forbidden(_)) {
                    scope
                } else {
                    DefaultScope::ResourceMeta
                }
            } else {
                scope
            };
            default_rules(p, &key_path(path, "properties", k), false, child_scope, out);
        }
    }
    if let Some(is) = items(s) {
        default_rules(is, &format!("{path}.items"), false, scope, out);
    }
    if let Some(ap) = additional(s).and_then(|a| a.schema()) {
        // Pruning a map default without the actual object is ambiguous inside metadata.
        let child_scope = match scope {
            DefaultScope::ResourceMeta => {
                DefaultScope::Forbidden("inside additionalProperties applying to object metadata")
            }
            other => other,
        };
        default_rules(
            ap,
            &format!("{path}.additionalProperties"),
            false,
            child_scope,
            out,
        );
    }
}

/// x-kubernetes-list-type / list-map-keys consistency (apiextensions validation, including
/// validateMapListKeysMapSet which applies to every new CRD).
fn list_type_rules(s: &Value, path: &str, out: &mut Vec<FieldError>) {
    let list_type = s.get(LIST_TYPE);
    let map_keys: Vec<&str> = s
        .get(LIST_MAP_KEYS)
        .and_then(Value::as_array)
        .map(|k| k.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let keys_value = || s.get(LIST_MAP_KEYS).cloned().unwrap_or(Value::Null);
    if let Some(lt) = list_type
        && !matches!(lt.as_str(), Some("atomic" | "set" | "map"))
    {
        let supported = ["atomic".to_string(), "set".to_string(), "map".to_string()];
        out.push(FieldError::not_supported(
            format!("{path}.{LIST_TYPE}"),
            lt.clone(),
            &supported,
        ));
    }
    let lt = list_type.and_then(Value::as_str);
    if !map_keys.is_empty() {
        let detail = "must be map if x-kubernetes-list-map-keys is non-empty";
        match list_type {
            None => out.push(FieldError::required(format!("{path}.{LIST_TYPE}"), detail)),
            Some(other) if lt != Some("map") => out.push(FieldError::invalid(
                format!("{path}.{LIST_TYPE}"),
                other.clone(),
                detail,
            )),
            Some(_) => {}
        }
    }
    let item_schema = items(s);
    if lt == Some("map") {
        if map_keys.is_empty() {
            out.push(FieldError::required(
                format!("{path}.{LIST_MAP_KEYS}"),
                "must not be empty if x-kubernetes-list-type is map",
            ));
        }
        match s.get("items") {
            None => out.push(FieldError::required(
                format!("{path}.items"),
                "must have a schema if x-kubernetes-list-type is map",
            )),
            Some(tuple @ Value::Array(_)) => out.push(FieldError::invalid(
                format!("{path}.items"),
                tuple.clone(),
                "must only have a single schema if x-kubernetes-list-type is map",
            )),
            Some(_) => {}
        }
        if let Some(is) = item_schema {
            if string_of(is, "type") != Some("object") {
                out.push(FieldError::invalid(
                    format!("{path}.items.type"),
                    type_value(is),
                    "must be object if parent array's x-kubernetes-list-type is map",
                ));
            } else {
                for (i, k) in map_keys.iter().enumerate() {
                    match property(is, k) {
                        // Kubernetes shows the item type here, not the key's.
                        Some(kp) if matches!(string_of(kp, "type"), Some("array" | "object")) => {
                            out.push(FieldError::invalid(
                                format!("{}.type", key_path(&format!("{path}.items"), "properties", k)),
                                type_value(is),
                                "must be a scalar type if parent array's x-kubernetes-list-type is map",
                            ))
                        }
                        Some(_) => {}
                        None => out.push(FieldError::invalid(
                            format!("{path}.{LIST_MAP_KEYS}"),
                            keys_value(),
                            "entries must all be names of item properties",
                        )),
                    }
                    if map_keys[..i].contains(k) {
                        out.push(FieldError::invalid(
                            format!("{path}.{LIST_MAP_KEYS}"),
                            keys_value(),
                            "must not contain duplicate entries",
                        ));
                    }
                }
            }
        }
    }
    // Set and map items, and map keys, must be identifiable: never null, keys always present.
    if let (Some(lt @ ("set" | "map")), Some(is)) = (lt, item_schema) {
        if nullable(is) {
            out.push(FieldError::forbidden(
                format!("{path}.items.nullable"),
                format!("cannot be nullable when x-kubernetes-list-type is {lt}"),
            ));
        }
        if lt == "map" {
            let required: Vec<&str> = is
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            for k in &map_keys {
                let Some(kp) = property(is, k) else { continue };
                let key_path = key_path(&format!("{path}.items"), "properties", k);
                if !required.contains(k) && kp.get("default").is_none() {
                    out.push(FieldError::required(
                        format!("{key_path}.default"),
                        "this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property",
                    ));
                }
                if nullable(kp) {
                    out.push(FieldError::forbidden(
                        format!("{key_path}.nullable"),
                        "this property is in x-kubernetes-list-map-keys, so it cannot be nullable",
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A CRD root schema whose `spec.f` field has the given schema.
    fn with_field(field: Value) -> Value {
        json!({
            "type": "object",
            "properties": {
                "spec": {"type": "object", "properties": {"f": field}}
            }
        })
    }

    fn messages(obj: &Value, schema: &Value) -> Vec<String> {
        validate(obj, schema)
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn validation_messages_match_kube_apiserver() {
        let cases: Vec<(&str, Value, Value, Vec<&str>)> = vec![
            (
                "integer given a string",
                json!({"type": "integer"}),
                json!("string"),
                vec![
                    r#"spec.f: Invalid value: "string": spec.f in body must be of type integer: "string""#,
                ],
            ),
            (
                "string given an integer",
                json!({"type": "string"}),
                json!(5),
                vec![
                    r#"spec.f: Invalid value: "integer": spec.f in body must be of type string: "integer""#,
                ],
            ),
            (
                "boolean given a string",
                json!({"type": "boolean"}),
                json!("yes"),
                vec![
                    r#"spec.f: Invalid value: "string": spec.f in body must be of type boolean: "string""#,
                ],
            ),
            (
                "number given a boolean",
                json!({"type": "number"}),
                json!(true),
                vec![
                    r#"spec.f: Invalid value: "boolean": spec.f in body must be of type number: "boolean""#,
                ],
            ),
            (
                "integer given a fraction",
                json!({"type": "integer"}),
                json!(1.5),
                vec![
                    r#"spec.f: Invalid value: "number": spec.f in body must be of type integer: "number""#,
                ],
            ),
            (
                "integer given a whole float",
                json!({"type": "integer"}),
                json!(2.0),
                vec![],
            ),
            (
                "number given an integer",
                json!({"type": "number"}),
                json!(2),
                vec![],
            ),
            (
                "array given an object",
                json!({"type": "array", "items": {"type": "string"}}),
                json!({}),
                vec![
                    r#"spec.f: Invalid value: "object": spec.f in body must be of type array: "object""#,
                ],
            ),
            (
                "object given an array",
                json!({"type": "object"}),
                json!([]),
                vec![
                    r#"spec.f: Invalid value: "array": spec.f in body must be of type object: "array""#,
                ],
            ),
            (
                "null where not nullable",
                json!({"type": "string"}),
                Value::Null,
                vec![
                    r#"spec.f: Invalid value: "null": spec.f in body must be of type string: "null""#,
                ],
            ),
            (
                "null where nullable",
                json!({"type": "string", "nullable": true}),
                Value::Null,
                vec![],
            ),
            (
                "minimum",
                json!({"type": "integer", "minimum": 1}),
                json!(0),
                vec![
                    "spec.f: Invalid value: 0: spec.f in body should be greater than or equal to 1",
                ],
            ),
            (
                "exclusive minimum",
                json!({"type": "integer", "minimum": 1, "exclusiveMinimum": true}),
                json!(1),
                vec!["spec.f: Invalid value: 1: spec.f in body should be greater than 1"],
            ),
            (
                "maximum",
                json!({"type": "integer", "maximum": 10}),
                json!(11),
                vec![
                    "spec.f: Invalid value: 11: spec.f in body should be less than or equal to 10",
                ],
            ),
            (
                "exclusive maximum",
                json!({"type": "integer", "maximum": 10, "exclusiveMaximum": true}),
                json!(10),
                vec!["spec.f: Invalid value: 10: spec.f in body should be less than 10"],
            ),
            (
                "fractional maximum",
                json!({"type": "number", "maximum": 1.5}),
                json!(2.5),
                vec![
                    "spec.f: Invalid value: 2.5: spec.f in body should be less than or equal to 1.5",
                ],
            ),
            (
                "within bounds",
                json!({"type": "integer", "minimum": 1, "maximum": 3}),
                json!(2),
                vec![],
            ),
            (
                "integer multipleOf",
                json!({"type": "integer", "multipleOf": 3}),
                json!(7),
                vec!["spec.f: Invalid value: 7: spec.f in body should be a multiple of 3"],
            ),
            (
                "fractional multipleOf",
                json!({"type": "number", "multipleOf": 0.5}),
                json!(1.25),
                vec!["spec.f: Invalid value: 1.25: spec.f in body should be a multiple of 0.5"],
            ),
            (
                "multipleOf tolerates rounding",
                json!({"type": "number", "multipleOf": 0.1}),
                json!(0.3),
                vec![],
            ),
            (
                "minLength",
                json!({"type": "string", "minLength": 3}),
                json!("ab"),
                vec![
                    r#"spec.f: Invalid value: "ab": spec.f in body should be at least 3 chars long"#,
                ],
            ),
            (
                "maxLength omits the value",
                json!({"type": "string", "maxLength": 3}),
                json!("abcd"),
                vec!["spec.f: Too long: may not be more than 3 bytes"],
            ),
            (
                "maxLength of one",
                json!({"type": "string", "maxLength": 1}),
                json!("ab"),
                vec!["spec.f: Too long: may not be more than 1 byte"],
            ),
            (
                "maxLength counts characters",
                json!({"type": "string", "maxLength": 3}),
                json!("héé"),
                vec![],
            ),
            (
                "pattern",
                json!({"type": "string", "pattern": "^[a-z]+$"}),
                json!("ABC"),
                vec![r#"spec.f: Invalid value: "ABC": spec.f in body should match '^[a-z]+$'"#],
            ),
            (
                "string checks stop at the first failure",
                json!({"type": "string", "minLength": 3, "pattern": "^[a-z]+$"}),
                json!("A"),
                vec![
                    r#"spec.f: Invalid value: "A": spec.f in body should be at least 3 chars long"#,
                ],
            ),
            (
                "string enum",
                json!({"type": "string", "enum": ["red", "blue"]}),
                json!("pink"),
                vec![r#"spec.f: Unsupported value: "pink": supported values: "red", "blue""#],
            ),
            (
                "integer enum",
                json!({"type": "integer", "enum": [1, 2]}),
                json!(3),
                vec![r#"spec.f: Unsupported value: 3: supported values: "1", "2""#],
            ),
            (
                "enum member",
                json!({"type": "string", "enum": ["red", "blue"]}),
                json!("blue"),
                vec![],
            ),
            (
                "date-time format",
                json!({"type": "string", "format": "date-time"}),
                json!("yesterday"),
                vec![
                    r#"spec.f: Invalid value: "yesterday": spec.f in body must be of type date-time: "yesterday""#,
                ],
            ),
            (
                "valid date-time",
                json!({"type": "string", "format": "date-time"}),
                json!("2024-01-02T03:04:05Z"),
                vec![],
            ),
            (
                "date format",
                json!({"type": "string", "format": "date"}),
                json!("2024-13-01"),
                vec![
                    r#"spec.f: Invalid value: "2024-13-01": spec.f in body must be of type date: "2024-13-01""#,
                ],
            ),
            (
                "unknown formats are not checked",
                json!({"type": "string", "format": "my-format"}),
                json!("x"),
                vec![],
            ),
            (
                "int32 format is stripped",
                json!({"type": "integer", "format": "int32"}),
                json!(1),
                vec![],
            ),
            (
                "int-or-string takes an integer",
                json!({"x-kubernetes-int-or-string": true}),
                json!(80),
                vec![],
            ),
            (
                "int-or-string takes a string",
                json!({"x-kubernetes-int-or-string": true}),
                json!("http"),
                vec![],
            ),
            (
                "int-or-string rejects a boolean",
                json!({"x-kubernetes-int-or-string": true}),
                json!(true),
                vec![
                    r#"spec.f: Invalid value: "boolean": spec.f in body must be of type integer,string: "boolean""#,
                ],
            ),
            (
                "minItems",
                json!({"type": "array", "items": {"type": "integer"}, "minItems": 1}),
                json!([]),
                vec!["spec.f: Invalid value: 0: spec.f in body should have at least 1 items"],
            ),
            (
                "maxItems",
                json!({"type": "array", "items": {"type": "integer"}, "maxItems": 2}),
                json!([1, 2, 3]),
                vec!["spec.f: Too many: 3: must have at most 2 items"],
            ),
            (
                "uniqueItems",
                json!({"type": "array", "items": {"type": "integer"}, "uniqueItems": true}),
                json!([1, 2, 1]),
                vec![r#"spec.f: Invalid value: "": spec.f in body shouldn't contain duplicates"#],
            ),
            (
                "item types",
                json!({"type": "array", "items": {"type": "integer"}}),
                json!([1, "x"]),
                vec![
                    r#"spec.f[1]: Invalid value: "string": spec.f[1] in body must be of type integer: "string""#,
                ],
            ),
            (
                "minProperties",
                json!({"type": "object", "additionalProperties": {"type": "string"}, "minProperties": 1}),
                json!({}),
                vec!["spec.f: Invalid value: 0: spec.f in body should have at least 1 properties"],
            ),
            (
                "maxProperties",
                json!({"type": "object", "additionalProperties": {"type": "string"}, "maxProperties": 1}),
                json!({"a": "x", "b": "y"}),
                vec!["spec.f: Too many: 2: must have at most 1 item"],
            ),
            (
                "additionalProperties schema",
                json!({"type": "object", "additionalProperties": {"type": "integer"}}),
                json!({"a": 1, "b": "x"}),
                vec![
                    r#"spec.f.b: Invalid value: "string": spec.f.b in body must be of type integer: "string""#,
                ],
            ),
            (
                "additionalProperties false names the forbidden key",
                json!({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": false}),
                json!({"a": "x", "b": 1}),
                vec![r#"spec.f: Invalid value: "b": spec.f.b in body is a forbidden property"#],
            ),
            (
                "required",
                json!({"type": "object", "properties": {"size": {"type": "integer"}}, "required": ["size"]}),
                json!({}),
                vec!["spec.f.size: Required value"],
            ),
            (
                "anyOf reports the closest branch",
                json!({"type": "object", "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}),
                json!({}),
                vec![
                    r#"<nil>: Invalid value: "": "spec.f" must validate at least one schema (anyOf)"#,
                    "spec.f.a: Required value",
                ],
            ),
            (
                "anyOf satisfied",
                json!({"type": "object", "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}),
                json!({"b": 1}),
                vec![],
            ),
            (
                "oneOf with two matches",
                json!({"type": "integer", "oneOf": [{"minimum": 0}, {"minimum": 5}]}),
                json!(6),
                vec![
                    r#"<nil>: Invalid value: "": "spec.f" must validate one and only one schema (oneOf). Found 2 valid alternatives"#,
                ],
            ),
            (
                "oneOf with no match",
                json!({"type": "integer", "oneOf": [{"maximum": 1}, {"maximum": 2}]}),
                json!(5),
                vec![
                    r#"<nil>: Invalid value: "": "spec.f" must validate one and only one schema (oneOf). Found none valid"#,
                    "spec.f: Invalid value: 5: spec.f in body should be less than or equal to 1",
                ],
            ),
            (
                "allOf",
                json!({"type": "integer", "allOf": [{"minimum": 1}, {"maximum": 3}]}),
                json!(5),
                vec![
                    "spec.f: Invalid value: 5: spec.f in body should be less than or equal to 3",
                    r#"<nil>: Invalid value: "": "spec.f" must validate all the schemas (allOf)"#,
                ],
            ),
            (
                "not",
                json!({"type": "string", "not": {"enum": ["x"]}}),
                json!("x"),
                vec![r#"<nil>: Invalid value: "": "spec.f" must not validate the schema (not)"#],
            ),
            (
                "list-type set reports each repeated item once",
                json!({"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"}),
                json!(["a", "b", "a", "a"]),
                vec![r#"spec.f[2]: Duplicate value: "a""#],
            ),
            (
                "list-type map names the key",
                json!({
                    "type": "array",
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["name"],
                    "items": {"type": "object", "properties": {"name": {"type": "string"}, "x": {"type": "integer"}}}
                }),
                json!([{"name": "a"}, {"name": "b"}, {"name": "a", "x": 1}]),
                vec![r#"spec.f[2]: Duplicate value: {"name":"a"}"#],
            ),
            (
                "list-type map keys take their defaults",
                json!({
                    "type": "array",
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["port", "protocol"],
                    "items": {"type": "object", "properties": {
                        "port": {"type": "integer"},
                        "protocol": {"type": "string", "default": "TCP"}
                    }}
                }),
                json!([{"port": 80}, {"port": 80, "protocol": "UDP"}, {"port": 80, "protocol": "TCP"}]),
                vec![r#"spec.f[2]: Duplicate value: {"port":80,"protocol":"TCP"}"#],
            ),
            (
                "embedded resources need apiVersion and kind",
                json!({"type": "object", "x-kubernetes-embedded-resource": true, "x-kubernetes-preserve-unknown-fields": true}),
                json!({"metadata": {}}),
                vec![
                    "spec.f.apiVersion: Required value: must not be empty",
                    "spec.f.kind: Required value: must not be empty",
                ],
            ),
            (
                "embedded resource kinds are DNS labels",
                json!({"type": "object", "x-kubernetes-embedded-resource": true, "x-kubernetes-preserve-unknown-fields": true}),
                json!({"apiVersion": "v1", "kind": "Con_figMap"}),
                vec![
                    r#"spec.f.kind: Invalid value: "Con_figMap": may have mixed case, but should otherwise match: a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"#,
                ],
            ),
        ];
        for (name, field, value, expected) in cases {
            let schema = with_field(field);
            let obj =
                json!({"apiVersion": "example.com/v1", "kind": "Widget", "spec": {"f": value}});
            assert_eq!(messages(&obj, &schema), expected, "case {name:?}");
        }
    }

    #[test]
    fn errors_carry_status_cause_reasons_and_values() {
        let schema = with_field(json!({"type": "object", "properties": {
            "replicas": {"type": "integer"},
            "color": {"type": "string", "enum": ["red"]},
            "name": {"type": "string", "maxLength": 2}
        }, "required": ["size"]}));
        let obj = json!({"spec": {"f": {"replicas": "x", "color": "blue", "name": "abc"}}});
        let got: Vec<(String, &str, Option<Value>)> = validate(&obj, &schema)
            .into_iter()
            .map(|e| (e.field, e.kind.reason(), e.value))
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "spec.f.replicas".to_string(),
                    "FieldValueTypeInvalid",
                    Some(json!("string"))
                ),
                (
                    "spec.f.color".to_string(),
                    "FieldValueNotSupported",
                    Some(json!("blue"))
                ),
                ("spec.f.name".to_string(), "FieldValueTooLong", None),
                ("spec.f.size".to_string(), "FieldValueRequired", None),
            ]
        );
    }

    #[test]
    fn field_error_bodies_render_values_like_go() {
        let cases = vec![
            (
                FieldError::invalid("a", json!("q\"\n"), "d"),
                r#"a: Invalid value: "q\"\n": d"#,
            ),
            (
                FieldError::invalid("a", json!(1_000_000.0), "d"),
                "a: Invalid value: 1e+06: d",
            ),
            (
                FieldError::invalid("a", json!(0.00001), "d"),
                "a: Invalid value: 1e-05: d",
            ),
            (
                FieldError::invalid("a", json!(123456.5), "d"),
                "a: Invalid value: 123456.5: d",
            ),
            (
                FieldError::invalid("a", json!({"b": "<", "a": [1]}), "d"),
                r#"a: Invalid value: {"a":[1],"b":"\u003c"}: d"#,
            ),
            (
                FieldError::invalid("a", Value::Null, "d"),
                "a: Invalid value: null: d",
            ),
            (FieldError::forbidden("a", "no"), "a: Forbidden: no"),
            (
                FieldError::duplicate("a[1]", json!(true)),
                "a[1]: Duplicate value: true",
            ),
        ];
        for (err, want) in cases {
            assert_eq!(err.to_string(), want);
        }
        assert_eq!(FieldErrorKind::Duplicate.reason(), "FieldValueDuplicate");
        assert_eq!(FieldErrorKind::Forbidden.reason(), "FieldValueForbidden");
        assert_eq!(FieldErrorKind::Invalid.reason(), "FieldValueInvalid");
        assert_eq!(FieldErrorKind::TooMany.reason(), "FieldValueTooMany");
    }

    #[test]
    fn supported_formats() {
        let cases = [
            ("date-time", "2026-11-22T14:00:00.123+01:00", true),
            ("date-time", "2026-11-22 14:00", false),
            ("datetime", "2026-11-22T14:00:00Z", true),
            ("date", "2026-02-28", true),
            ("date", "2026-02-30", false),
            ("ipv4", "10.0.0.1", true),
            ("ipv4", "10.0.0.256", false),
            ("ipv6", "fd00::1", true),
            ("ipv6", "10.0.0.1", false),
            ("cidr", "10.244.0.0/16", true),
            ("cidr", "10.244.0.0/33", false),
            ("cidr", "fd00::/64", true),
            ("uuid", "123e4567-e89b-12d3-a456-426614174000", true),
            ("uuid", "not-a-uuid", false),
            ("uuid4", "123e4567-e89b-42d3-a456-426614174000", true),
            ("uuid4", "123e4567-e89b-12d3-a456-426614174000", false),
            ("hostname", "api.example.com", true),
            ("hostname", "-bad-.example", false),
            ("mac", "00:1a:2b:3c:4d:5e", true),
            ("mac", "00:1a:2b", false),
            ("byte", "aGVsbG8=", true),
            ("byte", "not base64!", false),
            ("hexcolor", "#ff00AA", true),
            ("hexcolor", "#ff00A", false),
            ("password", "anything", true),
        ];
        for (format, text, ok) in cases {
            assert_eq!(format_matches(format, text), ok, "{format} {text:?}");
        }
    }

    #[test]
    fn go_formatting_helpers() {
        let floats = [
            (1.0, "1"),
            (0.5, "0.5"),
            (123456.0, "123456"),
            (1234567.0, "1.234567e+06"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-2.5, "-2.5"),
            (0.1 + 0.2, "0.30000000000000004"),
        ];
        for (f, want) in floats {
            assert_eq!(go_float(f), want);
        }
        assert_eq!(go_quote("tab\there \u{1} é"), r#""tab\there \x01 é""#);
        assert_eq!(
            go_json(&json!({"z": 1.0, "a": "&"})),
            r#"{"a":"\u0026","z":1}"#
        );
    }

    #[test]
    fn defaulting() {
        let schema = json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "default": {},
                    "properties": {
                        "replicas": {"type": "integer", "default": 1},
                        "mode": {"type": "string", "default": "auto"},
                        "note": {"type": "string", "nullable": true, "default": "n"},
                        "extra": {"type": "string"},
                        "ports": {
                            "type": "array",
                            "items": {"type": "object", "properties": {
                                "port": {"type": "integer", "default": 80},
                                "protocol": {"type": "string", "default": "TCP"}
                            }}
                        },
                        "limits": {
                            "type": "object",
                            "additionalProperties": {"type": "object", "properties": {
                                "max": {"type": "integer", "default": 10}
                            }}
                        }
                    }
                }
            }
        });
        let cases = vec![
            (
                "absent object gets its default, then the defaults inside it",
                json!({}),
                json!({"spec": {"replicas": 1, "mode": "auto", "note": "n"}}),
            ),
            (
                "present values are kept",
                json!({"spec": {"replicas": 3, "mode": "manual", "note": "x"}}),
                json!({"spec": {"replicas": 3, "mode": "manual", "note": "x"}}),
            ),
            (
                "array items are defaulted one by one",
                json!({"spec": {"ports": [{}, {"port": 8080, "protocol": "UDP"}]}}),
                json!({"spec": {"replicas": 1, "mode": "auto", "note": "n", "ports": [
                    {"port": 80, "protocol": "TCP"},
                    {"port": 8080, "protocol": "UDP"}
                ]}}),
            ),
            (
                "additionalProperties values are defaulted",
                json!({"spec": {"limits": {"cpu": {}, "mem": {"max": 2}}}}),
                json!({"spec": {"replicas": 1, "mode": "auto", "note": "n", "limits": {"cpu": {"max": 10}, "mem": {"max": 2}}}}),
            ),
            (
                "null of a non-nullable field takes the default, a nullable one stays null",
                json!({"spec": {"replicas": null, "note": null}}),
                json!({"spec": {"replicas": 1, "mode": "auto", "note": null}}),
            ),
            (
                "null of a non-nullable field without default is dropped",
                json!({"spec": {"extra": null}}),
                json!({"spec": {"replicas": 1, "mode": "auto", "note": "n"}}),
            ),
        ];
        for (name, mut obj, want) in cases {
            apply_defaults(&mut obj, &schema);
            assert_eq!(obj, want, "case {name:?}");
        }
    }

    #[test]
    fn pruning() {
        let schema = json!({
            "type": "object",
            "properties": {
                "spec": {"type": "object", "properties": {
                    "replicas": {"type": "integer"},
                    "template": {"type": "object", "properties": {"x": {"type": "integer"}}},
                    "list": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}},
                    "labels": {"type": "object", "additionalProperties": {"type": "object", "properties": {"v": {"type": "string"}}}},
                    "config": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": true,
                        "properties": {"known": {"type": "object", "properties": {"a": {"type": "integer"}}}}
                    },
                    "pod": {
                        "type": "object",
                        "x-kubernetes-embedded-resource": true,
                        "properties": {"spec": {"type": "object", "properties": {"x": {"type": "integer"}}}}
                    }
                }}
            }
        });
        let cases = vec![
            (
                "unknown nested fields",
                json!({"spec": {"replicas": 1, "foo": 1, "template": {"x": 1, "y": {"z": 2}}}}),
                json!({"spec": {"replicas": 1, "template": {"x": 1}}}),
                vec!["spec.foo", "spec.template.y"],
            ),
            (
                "root keeps apiVersion, kind and all of metadata",
                json!({"apiVersion": "a/v1", "kind": "K", "metadata": {"name": "n", "whatever": 1}, "extra": true}),
                json!({"apiVersion": "a/v1", "kind": "K", "metadata": {"name": "n", "whatever": 1}}),
                vec!["extra"],
            ),
            (
                "list items are pruned with their index",
                json!({"spec": {"list": [{"name": "a"}, {"name": "b", "bad": 1}]}}),
                json!({"spec": {"list": [{"name": "a"}, {"name": "b"}]}}),
                vec!["spec.list[1].bad"],
            ),
            (
                "additionalProperties values are pruned by their schema",
                json!({"spec": {"labels": {"k": {"v": "x", "w": "y"}}}}),
                json!({"spec": {"labels": {"k": {"v": "x"}}}}),
                vec!["spec.labels.k.w"],
            ),
            (
                "preserve-unknown-fields keeps unknown fields but prunes declared ones",
                json!({"spec": {"config": {"anything": {"deep": 1}, "known": {"a": 1, "b": 2}}}}),
                json!({"spec": {"config": {"anything": {"deep": 1}, "known": {"a": 1}}}}),
                vec!["spec.config.known.b"],
            ),
            (
                "embedded resources keep apiVersion, kind and metadata",
                json!({"spec": {"pod": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "foo": 1}, "spec": {"x": 1, "y": 2}, "other": 3}}}),
                json!({"spec": {"pod": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "foo": 1}, "spec": {"x": 1}}}}),
                vec!["spec.pod.other", "spec.pod.spec.y"],
            ),
            (
                "metadata is only special at the root and in embedded resources",
                json!({"spec": {"template": {"metadata": {"name": "x"}}}}),
                json!({"spec": {"template": {}}}),
                vec!["spec.template.metadata"],
            ),
        ];
        for (name, mut obj, want, want_paths) in cases {
            let paths = prune(&mut obj, &schema);
            assert_eq!(obj, want, "case {name:?}");
            assert_eq!(paths, want_paths, "case {name:?}");
        }
    }

    #[test]
    fn root_preserve_unknown_fields_prunes_nothing_unknown() {
        let schema = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
        let mut obj = json!({"apiVersion": "v1", "spec": {"a": 1}, "x": [1]});
        let before = obj.clone();
        assert!(prune(&mut obj, &schema).is_empty());
        assert_eq!(obj, before);
    }

    /// The shape kubebuilder generates for a CRD with metav1.Conditions and an IntOrString.
    fn kubebuilder_schema() -> Value {
        json!({
            "description": "Widget is the Schema for the widgets API",
            "type": "object",
            "properties": {
                "apiVersion": {"description": "APIVersion defines the versioned schema", "type": "string"},
                "kind": {"description": "Kind is a string value", "type": "string"},
                "metadata": {"type": "object"},
                "spec": {
                    "type": "object",
                    "required": ["size"],
                    "properties": {
                        "size": {"type": "integer", "format": "int32", "minimum": 1, "maximum": 10},
                        "port": {
                            "anyOf": [{"type": "integer"}, {"type": "string"}],
                            "x-kubernetes-int-or-string": true
                        },
                        "mode": {"type": "string", "enum": ["Fast", "Safe"], "default": "Safe"},
                        "selector": {
                            "type": "object",
                            "x-kubernetes-map-type": "atomic",
                            "additionalProperties": {"type": "string"}
                        },
                        "args": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "atomic"}
                    }
                },
                "status": {
                    "type": "object",
                    "properties": {
                        "conditions": {
                            "type": "array",
                            "x-kubernetes-list-type": "map",
                            "x-kubernetes-list-map-keys": ["type"],
                            "items": {
                                "type": "object",
                                "required": ["lastTransitionTime", "message", "reason", "status", "type"],
                                "properties": {
                                    "lastTransitionTime": {"type": "string", "format": "date-time"},
                                    "message": {"type": "string", "maxLength": 32768},
                                    "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
                                    "reason": {
                                        "type": "string",
                                        "maxLength": 1024,
                                        "minLength": 1,
                                        "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
                                    },
                                    "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                                    "type": {"type": "string", "maxLength": 316}
                                }
                            }
                        }
                    }
                }
            }
        })
    }

    #[test]
    fn kubebuilder_crd_round_trip() {
        let schema = kubebuilder_schema();
        assert_eq!(structural_errors(&schema), Vec::<String>::new());

        let mut obj = json!({
            "apiVersion": "example.com/v1",
            "kind": "Widget",
            "metadata": {"name": "w", "namespace": "default", "labels": {"a": "b"}},
            "spec": {"size": 3, "port": "http", "selector": {"app": "w"}, "args": ["-v"], "legacy": true},
            "status": {"conditions": [{
                "type": "Ready", "status": "True", "reason": "Done", "message": "",
                "lastTransitionTime": "2026-11-22T14:00:00Z", "observedGeneration": 1
            }]}
        });
        assert_eq!(prune(&mut obj, &schema), vec!["spec.legacy"]);
        apply_defaults(&mut obj, &schema);
        assert_eq!(obj["spec"]["mode"], json!("Safe"));
        assert_eq!(messages(&obj, &schema), Vec::<String>::new());

        obj["spec"]["size"] = json!(0);
        obj["status"]["conditions"][0]["status"] = json!("Maybe");
        obj["status"]["conditions"][0]["reason"] = json!("not ok");
        let copy = obj["status"]["conditions"][0].clone();
        obj["status"]["conditions"]
            .as_array_mut()
            .unwrap()
            .push(copy);
        assert_eq!(
            messages(&obj, &schema),
            vec![
                "spec.size: Invalid value: 0: spec.size in body should be greater than or equal to 1",
                r#"status.conditions[0].reason: Invalid value: "not ok": status.conditions[0].reason in body should match '^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$'"#,
                r#"status.conditions[0].status: Unsupported value: "Maybe": supported values: "True", "False", "Unknown""#,
                r#"status.conditions[1].reason: Invalid value: "not ok": status.conditions[1].reason in body should match '^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$'"#,
                r#"status.conditions[1].status: Unsupported value: "Maybe": supported values: "True", "False", "Unknown""#,
                r#"status.conditions[1]: Duplicate value: {"type":"Ready"}"#,
            ]
        );
    }

    #[test]
    fn structural_checks() {
        let cases: Vec<(&str, Value, Vec<&str>)> = vec![
            (
                "a well-formed schema",
                json!({"type": "object", "properties": {
                    "metadata": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}}},
                    "spec": {"type": "object", "required": ["port"], "properties": {
                        "port": {"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}]},
                        "raw": {"x-kubernetes-preserve-unknown-fields": true},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "items": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                                  "items": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}},
                        "choice": {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
                                   "oneOf": [{"required": ["a"]}, {"required": ["b"]}]}
                    }}
                }}),
                vec![],
            ),
            (
                "missing root type",
                json!({"properties": {}}),
                vec!["openAPIV3Schema.type: Required value: must not be empty at the root"],
            ),
            (
                "root must be an object",
                json!({"type": "string"}),
                vec![
                    r#"openAPIV3Schema.type: Invalid value: "string": must be object at the root"#,
                ],
            ),
            (
                "missing field type",
                json!({"type": "object", "properties": {"spec": {"properties": {"a": {"type": "string"}}}}}),
                vec![
                    "openAPIV3Schema.properties[spec].type: Required value: must not be empty for specified object fields",
                ],
            ),
            (
                "missing item type",
                json!({"type": "object", "properties": {"l": {"type": "array", "items": {}}}}),
                vec![
                    "openAPIV3Schema.properties[l].items.type: Required value: must not be empty for specified array items",
                ],
            ),
            (
                "array without items",
                json!({"type": "object", "properties": {"l": {"type": "array"}}}),
                vec!["openAPIV3Schema.properties[l].items: Required value: must be specified"],
            ),
            (
                "additionalProperties with properties",
                json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "string"}}}}),
                vec![
                    "openAPIV3Schema.properties[spec].additionalProperties: Forbidden: additionalProperties and properties are mutual exclusive",
                ],
            ),
            (
                "additionalProperties at the root",
                json!({"type": "object", "additionalProperties": {"type": "string"}}),
                vec![
                    "openAPIV3Schema.additionalProperties: Forbidden: must not be used at the root",
                ],
            ),
            (
                "structure under a junctor",
                json!({"type": "object", "properties": {"spec": {"type": "object", "anyOf": [{"type": "object", "description": "d"}]}}}),
                vec![
                    "openAPIV3Schema.properties[spec].anyOf[0].description: Forbidden: must be empty to be structural",
                    "openAPIV3Schema.properties[spec].anyOf[0].type: Forbidden: must be empty to be structural",
                ],
            ),
            (
                "field named only under a root junctor",
                json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {"a": {"type": "string"}}}},
                    "anyOf": [{"properties": {"spec": {"properties": {"b": {"minLength": 1}}}}}]}),
                vec![
                    "openAPIV3Schema.properties[spec].properties[b]: Required value: because it is defined in openAPIV3Schema.anyOf[0].properties[spec].properties[b]",
                ],
            ),
            (
                "uniqueItems",
                json!({"type": "object", "properties": {"l": {"type": "array", "uniqueItems": true, "items": {"type": "string"}}}}),
                vec![
                    "openAPIV3Schema.properties[l].uniqueItems: Forbidden: uniqueItems cannot be set to true since the runtime complexity becomes quadratic",
                ],
            ),
            (
                "root metadata beyond name and generateName",
                json!({"type": "object", "properties": {"metadata": {"type": "object", "properties": {"labels": {"type": "object"}}}}}),
                vec![
                    "openAPIV3Schema.properties[metadata]: Forbidden: must not specify anything other than name and generateName, but metadata is implicitly specified",
                ],
            ),
            (
                "embedded resource without fields",
                json!({"type": "object", "properties": {"t": {"type": "object", "x-kubernetes-embedded-resource": true}}}),
                vec![
                    "openAPIV3Schema.properties[t].properties: Required value: must not be empty if x-kubernetes-embedded-resource is true without x-kubernetes-preserve-unknown-fields",
                ],
            ),
            (
                "list-type map without keys",
                json!({"type": "object", "properties": {"l": {"type": "array", "x-kubernetes-list-type": "map", "items": {"type": "object"}}}}),
                vec![
                    "openAPIV3Schema.properties[l].x-kubernetes-list-map-keys: Required value: must not be empty if x-kubernetes-list-type is map",
                ],
            ),
            (
                "default of the wrong type",
                json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
                    "replicas": {"type": "integer", "default": "one"}}}}}),
                vec![
                    r#"openAPIV3Schema.properties[spec].properties[replicas].default: Invalid value: "string":  in body must be of type integer: "string""#,
                ],
            ),
            (
                "object default missing a required field",
                json!({"type": "object", "properties": {"spec": {"type": "object", "default": {"a": "x"}, "required": ["b"],
                    "properties": {"a": {"type": "string"}, "b": {"type": "string"}}}}}),
                vec!["openAPIV3Schema.properties[spec].default.b: Required value"],
            ),
            (
                "default with unknown fields",
                json!({"type": "object", "properties": {"spec": {"type": "object", "default": {"a": "x", "zzz": 1},
                    "properties": {"a": {"type": "string"}}}}}),
                vec![
                    r#"openAPIV3Schema.properties[spec].default: Invalid value: {"a":"x","zzz":1}: must not have unknown fields"#,
                ],
            ),
            (
                "default in root metadata",
                json!({"type": "object", "properties": {"metadata": {"type": "object", "properties": {"name": {"type": "string", "default": "x"}}}}}),
                vec![
                    "openAPIV3Schema.properties[metadata].properties[name].default: Forbidden: must not be set in top-level metadata",
                ],
            ),
            (
                "valid defaults",
                json!({"type": "object", "properties": {"spec": {"type": "object", "default": {"a": "x"},
                    "properties": {"a": {"type": "string", "default": "y", "enum": ["x", "y"]},
                                   "ports": {"type": "array", "items": {"type": "integer", "default": 80}}}}}}),
                vec![],
            ),
            (
                "list-map-keys without list-type map",
                json!({"type": "object", "properties": {"l": {"type": "array", "x-kubernetes-list-map-keys": ["name"],
                    "items": {"type": "object", "properties": {"name": {"type": "string"}}}}}}),
                vec![
                    "openAPIV3Schema.properties[l].x-kubernetes-list-type: Required value: must be map if x-kubernetes-list-map-keys is non-empty",
                ],
            ),
            (
                "list map keys must be required or defaulted, and exist",
                json!({"type": "object", "properties": {"l": {"type": "array", "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["name", "missing"],
                    "items": {"type": "object", "properties": {"name": {"type": "string"}}}}}}),
                vec![
                    r#"openAPIV3Schema.properties[l].items.properties[name].default: Required value: this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property"#,
                    r#"openAPIV3Schema.properties[l].x-kubernetes-list-map-keys: Invalid value: ["name","missing"]: entries must all be names of item properties"#,
                ],
            ),
            (
                "nullable set items",
                json!({"type": "object", "properties": {"l": {"type": "array", "x-kubernetes-list-type": "set",
                    "items": {"type": "string", "nullable": true}}}}),
                vec![
                    "openAPIV3Schema.properties[l].items.nullable: Forbidden: cannot be nullable when x-kubernetes-list-type is set",
                ],
            ),
            (
                "nullable root",
                json!({"type": "object", "nullable": true}),
                vec!["openAPIV3Schema.nullable: Forbidden: nullable cannot be true at the root"],
            ),
            (
                "unsupported JSON-schema keywords",
                json!({"type": "object", "properties": {
                    "a": {"type": "string", "$ref": "#/definitions/x"},
                    "b": {"type": "object", "patternProperties": {"^x": {"type": "string"}}},
                    "c": {"type": "null"}
                }}),
                vec![
                    "openAPIV3Schema.properties[a].$ref: Forbidden: $ref is not supported",
                    "openAPIV3Schema.properties[b].patternProperties: Forbidden: patternProperties is not supported",
                    "openAPIV3Schema.properties[c].type: Forbidden: type cannot be set to null, use nullable as an alternative",
                    r#"openAPIV3Schema.properties[c].type: Unsupported value: "null": supported values: "array", "boolean", "integer", "number", "object", "string""#,
                ],
            ),
            (
                "default in an embedded resource's metadata is validated but not pruned",
                json!({"type": "object", "properties": {"t": {
                    "type": "object",
                    "x-kubernetes-embedded-resource": true,
                    "x-kubernetes-preserve-unknown-fields": true,
                    "properties": {"metadata": {"type": "object", "default": {"name": 5}, "properties": {"name": {"type": "string"}}}}
                }}}),
                vec![
                    r#"openAPIV3Schema.properties[t].properties[metadata].default.name: Invalid value: "integer": name in body must be of type string: "integer""#,
                ],
            ),
            (
                "int-or-string with preserve-unknown-fields",
                json!({"type": "object", "properties": {"p": {"x-kubernetes-int-or-string": true, "x-kubernetes-preserve-unknown-fields": true}}}),
                vec![
                    "openAPIV3Schema.properties[p].x-kubernetes-preserve-unknown-fields: Invalid value: true: must be false if x-kubernetes-int-or-string is true",
                ],
            ),
        ];
        for (name, schema, expected) in cases {
            assert_eq!(structural_errors(&schema), expected, "case {name:?}");
        }
    }
}
