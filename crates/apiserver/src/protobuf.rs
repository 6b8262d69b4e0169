//! Kubernetes protobuf request bodies, decoded into the JSON objects the handlers work on.
//!
//! kubectl's typed-clientset commands (`auth can-i`, `create deployment`, `create configmap`,
//! `drain`, `certificate approve`, ...) send `application/vnd.kubernetes.protobuf` and do not
//! fall back to JSON on 415. k8s-pb provides the prost messages but no JSON mapping, so each
//! supported kind is mapped here field by field, following the Go JSON tags of the Kubernetes
//! types. No field the client sent is dropped: each mapping names every field of its message,
//! fields not mapped are refused when set, and field numbers a message does not define (which
//! prost skips) are refused by a walk over the wire.

use std::collections::BTreeMap;

use base64::Engine;
use chrono::{DateTime, SecondsFormat};
use k8s_pb::api::{
    apps, authentication, authorization, batch, certificates, core, policy, rbac, scheduling,
};
use k8s_pb::apimachinery::pkg::api::resource::Quantity;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::runtime::Unknown;
use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;
use prost::Message;
use serde_json::{Map, Value};

/// The four bytes that start every Kubernetes protobuf payload.
const MAGIC: &[u8] = b"k8s\0";

/// Why a protobuf request body could not be turned into a JSON object.
#[derive(Debug, thiserror::Error)]
pub enum ProtobufError {
    /// The body does not start with `k8s\0`.
    #[error("the protobuf request body does not start with the Kubernetes magic number \"k8s\\0\"")]
    BadMagic,
    /// The runtime.Unknown envelope after the magic is not valid protobuf.
    #[error("cannot decode the protobuf envelope (runtime.Unknown): {0}")]
    Envelope(#[source] prost::DecodeError),
    /// The envelope says its payload is compressed or not protobuf.
    #[error(
        "unsupported protobuf envelope for {gvk}: contentEncoding {encoding:?}, contentType {content_type:?}"
    )]
    Encoding {
        /// The payload's group/version/kind.
        gvk: String,
        /// runtime.Unknown.contentEncoding.
        encoding: String,
        /// runtime.Unknown.contentType.
        content_type: String,
    },
    /// The payload is not a valid message of the kind the envelope names.
    #[error("cannot decode {gvk} from protobuf: {source}")]
    Object {
        /// The payload's group/version/kind.
        gvk: String,
        /// What prost found wrong.
        #[source]
        source: prost::DecodeError,
    },
    /// The object has a field that cannot become JSON: one this server does not map, or a
    /// field number its type does not define.
    #[error("cannot decode {gvk} from protobuf: {}", unmapped.describe())]
    Unmapped {
        /// The payload's group/version/kind.
        gvk: String,
        /// The field and why.
        unmapped: Unmapped,
    },
    /// The envelope names a kind this server has no protobuf mapping for.
    #[error("unsupported kind {0:?} in protobuf; send it as JSON (kubectl create -f / apply)")]
    UnsupportedKind(String),
}

impl ProtobufError {
    /// True when the body is well-formed but its kind or one of its fields is not mapped, so
    /// that the same object would be accepted as JSON (415 rather than 400).
    pub fn is_unsupported(&self) -> bool {
        matches!(
            self,
            ProtobufError::UnsupportedKind(_)
                | ProtobufError::Unmapped {
                    unmapped: Unmapped {
                        reason: UnmappedReason::NotSupported,
                        ..
                    },
                    ..
                }
        )
    }
}

/// Decodes a Kubernetes protobuf request body (the `k8s\0` magic + runtime.Unknown envelope) into the JSON object kube-apiserver would have seen, with apiVersion and kind set.
pub fn decode(body: &[u8]) -> Result<Value, ProtobufError> {
    let envelope = body.strip_prefix(MAGIC).ok_or(ProtobufError::BadMagic)?;
    let unknown = Unknown::decode(envelope).map_err(ProtobufError::Envelope)?;
    let type_meta = unknown.type_meta.unwrap_or_default();
    let api_version = type_meta.api_version.unwrap_or_default();
    let kind = type_meta.kind.unwrap_or_default();
    // Spelled like Go's schema.GroupVersionKind.String(), which users see in kube errors.
    let gvk = match api_version.split_once('/') {
        Some(_) => format!("{api_version}, Kind={kind}"),
        None => format!("/{api_version}, Kind={kind}"),
    };
    let encoding = unknown.content_encoding.unwrap_or_default();
    let content_type = unknown.content_type.unwrap_or_default();
    if !encoding.is_empty() || !(content_type.is_empty() || content_type.contains("protobuf")) {
        return Err(ProtobufError::Encoding {
            gvk,
            encoding,
            content_type,
        });
    }
    let (_, _, convert) = KINDS
        .iter()
        .find(|(v, k, _)| (*v == api_version || *v == ANY_VERSION) && *k == kind)
        .ok_or_else(|| ProtobufError::UnsupportedKind(gvk.clone()))?;
    let fields = convert(unknown.raw.as_deref().unwrap_or_default(), gvk)?;
    let mut object = Map::new();
    object.insert("apiVersion".into(), Value::String(api_version));
    object.insert("kind".into(), Value::String(kind));
    if let Value::Object(fields) = fields {
        object.extend(fields);
    }
    Ok(Value::Object(object))
}

/// Decodes one typed message and maps it to JSON; `gvk` names it in errors.
type Converter = fn(&[u8], String) -> Result<Value, ProtobufError>;

fn typed<M: Message + Default + ToJson>(raw: &[u8], gvk: String) -> Result<Value, ProtobufError> {
    let message = match M::decode(raw) {
        Ok(message) => message,
        Err(source) => return Err(ProtobufError::Object { gvk, source }),
    };
    M::check_wire(raw)
        .and_then(|()| message.to_json())
        .map_err(|unmapped| ProtobufError::Unmapped { gvk, unmapped })
}

/// Matches the apiVersion of any group.
const ANY_VERSION: &str = "*";

/// Every kind kubectl's typed clients send as protobuf that this server understands.
const KINDS: &[(&str, &str, Converter)] = &[
    ("v1", "ConfigMap", typed::<core::v1::ConfigMap>),
    ("v1", "Secret", typed::<core::v1::Secret>),
    ("v1", "Namespace", typed::<core::v1::Namespace>),
    ("v1", "ServiceAccount", typed::<core::v1::ServiceAccount>),
    ("v1", "ResourceQuota", typed::<core::v1::ResourceQuota>),
    ("v1", "Service", typed::<core::v1::Service>),
    ("apps/v1", "Deployment", typed::<apps::v1::Deployment>),
    ("apps/v1", "StatefulSet", typed::<apps::v1::StatefulSet>),
    ("apps/v1", "DaemonSet", typed::<apps::v1::DaemonSet>),
    ("batch/v1", "Job", typed::<batch::v1::Job>),
    ("batch/v1", "CronJob", typed::<batch::v1::CronJob>),
    (
        "policy/v1",
        "PodDisruptionBudget",
        typed::<policy::v1::PodDisruptionBudget>,
    ),
    // Registered in every group version: a typed client sends its own (`v1`, `apps/v1`, ...).
    (ANY_VERSION, "DeleteOptions", typed::<meta::DeleteOptions>),
    (
        "authorization.k8s.io/v1",
        "SelfSubjectAccessReview",
        typed::<authorization::v1::SelfSubjectAccessReview>,
    ),
    (
        "authorization.k8s.io/v1",
        "SubjectAccessReview",
        typed::<authorization::v1::SubjectAccessReview>,
    ),
    (
        "authorization.k8s.io/v1",
        "LocalSubjectAccessReview",
        typed::<authorization::v1::LocalSubjectAccessReview>,
    ),
    (
        "authorization.k8s.io/v1",
        "SelfSubjectRulesReview",
        typed::<authorization::v1::SelfSubjectRulesReview>,
    ),
    (
        "authentication.k8s.io/v1",
        "SelfSubjectReview",
        typed::<authentication::v1::SelfSubjectReview>,
    ),
    (
        "authentication.k8s.io/v1",
        "TokenReview",
        typed::<authentication::v1::TokenReview>,
    ),
    (
        "authentication.k8s.io/v1",
        "TokenRequest",
        typed::<authentication::v1::TokenRequest>,
    ),
    (
        "rbac.authorization.k8s.io/v1",
        "Role",
        typed::<rbac::v1::Role>,
    ),
    (
        "rbac.authorization.k8s.io/v1",
        "ClusterRole",
        typed::<rbac::v1::ClusterRole>,
    ),
    (
        "rbac.authorization.k8s.io/v1",
        "RoleBinding",
        typed::<rbac::v1::RoleBinding>,
    ),
    (
        "rbac.authorization.k8s.io/v1",
        "ClusterRoleBinding",
        typed::<rbac::v1::ClusterRoleBinding>,
    ),
    ("policy/v1", "Eviction", typed::<policy::v1::Eviction>),
    (
        "certificates.k8s.io/v1",
        "CertificateSigningRequest",
        typed::<certificates::v1::CertificateSigningRequest>,
    ),
    (
        "scheduling.k8s.io/v1",
        "PriorityClass",
        typed::<scheduling::v1::PriorityClass>,
    ),
];

/// A protobuf field that has no place in the JSON object, so decoding it would lose it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unmapped {
    /// Where it is, as a JSON path (`spec.template.spec.volumes[0]`); empty at the top.
    pub field: String,
    /// Why it cannot be mapped.
    pub reason: UnmappedReason,
}

/// Why a protobuf field cannot be mapped to JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnmappedReason {
    /// A field of the Kubernetes type that this server does not map from protobuf (it does
    /// from JSON).
    NotSupported,
    /// A field number the Kubernetes type does not define (a newer client's field).
    UnknownNumber(u32),
    /// The field's bytes are not valid protobuf.
    Malformed,
}

impl Unmapped {
    fn not_supported() -> Self {
        Unmapped {
            field: String::new(),
            reason: UnmappedReason::NotSupported,
        }
    }

    /// The same field seen from the message that holds it under `key` (`""` for inline
    /// members, `[i]`-style keys for list items).
    fn within(mut self, key: &str) -> Self {
        self.field = match (key, self.field.as_str()) {
            ("", _) => self.field,
            (_, "") => key.to_string(),
            (_, rest) if rest.starts_with('[') => format!("{key}{rest}"),
            (_, rest) => format!("{key}.{rest}"),
        };
        self
    }

    /// What the user reads after the object's group/version/kind.
    fn describe(&self) -> String {
        let field = if self.field.is_empty() {
            "the object"
        } else {
            &self.field
        };
        match self.reason {
            UnmappedReason::NotSupported => format!(
                "field {field} is not supported in protobuf by this server; send the object as JSON (kubectl create -f / apply)"
            ),
            UnmappedReason::UnknownNumber(number) => {
                format!("unknown field number {number} in {field}")
            }
            UnmappedReason::Malformed => format!("malformed protobuf in {field}"),
        }
    }
}

/// A value's Kubernetes JSON encoding.
trait ToJson {
    fn to_json(&self) -> Result<Value, Unmapped>;

    /// Refuses field numbers the message does not define, at any depth: prost skips them
    /// silently, and a field the client set must not vanish. Scalars have nothing to check.
    fn check_wire(_raw: &[u8]) -> Result<(), Unmapped>
    where
        Self: Sized,
    {
        Ok(())
    }
}

impl ToJson for String {
    fn to_json(&self) -> Result<Value, Unmapped> {
        Ok(Value::String(self.clone()))
    }
}

impl ToJson for bool {
    fn to_json(&self) -> Result<Value, Unmapped> {
        Ok(Value::Bool(*self))
    }
}

impl ToJson for i64 {
    fn to_json(&self) -> Result<Value, Unmapped> {
        Ok(Value::from(*self))
    }
}

impl ToJson for i32 {
    fn to_json(&self) -> Result<Value, Unmapped> {
        Ok(Value::from(*self))
    }
}

/// Go's `[]byte`, which encoding/json writes as standard base64.
impl ToJson for Vec<u8> {
    fn to_json(&self) -> Result<Value, Unmapped> {
        Ok(Value::String(
            base64::engine::general_purpose::STANDARD.encode(self),
        ))
    }
}

impl ToJson for Quantity {
    fn to_json(&self) -> Result<Value, Unmapped> {
        self.string.clone().unwrap_or_default().to_json()
    }
}

/// intstr.IntOrString: a JSON number or string, as its type says.
impl ToJson for IntOrString {
    fn to_json(&self) -> Result<Value, Unmapped> {
        match self.r#type {
            Some(1) => self.str_val.clone().unwrap_or_default().to_json(),
            _ => self.int_val.unwrap_or_default().to_json(),
        }
    }
}

/// metav1.Time: RFC3339 in UTC at second precision. Go writes the zero time as an empty
/// message (no seconds), which JSON renders as null.
impl ToJson for meta::Time {
    fn to_json(&self) -> Result<Value, Unmapped> {
        let Some(seconds) = self.seconds else {
            return Ok(Value::Null);
        };
        Ok(DateTime::from_timestamp(seconds, 0)
            .map(|t| Value::String(t.to_rfc3339_opts(SecondsFormat::Secs, true)))
            .unwrap_or(Value::Null))
    }
}

/// metav1.FieldsV1 is raw JSON in both encodings.
impl ToJson for meta::FieldsV1 {
    fn to_json(&self) -> Result<Value, Unmapped> {
        Ok(serde_json::from_slice(self.raw.as_deref().unwrap_or_default()).unwrap_or(Value::Null))
    }
}

/// A JSON object built field by field, with Go's encoding/json rules for absent values.
#[derive(Default)]
struct Fields(Map<String, Value>);

/// Whether Go's `omitempty` would drop this value (structs count as empty when all their
/// fields were dropped, which Go itself does not do but which keeps `status: {}` out).
fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

/// One field's JSON value, its errors placed under its key.
fn field_json<T: ToJson>(key: &str, value: &T) -> Result<Value, Unmapped> {
    value.to_json().map_err(|e| e.within(key))
}

impl Fields {
    /// A value field tagged `omitempty`: dropped when absent or zero. Go's protobuf encoding
    /// writes non-pointer fields even when zero, so presence alone does not decide.
    fn opt<T: ToJson>(mut self, key: &str, value: &Option<T>) -> Result<Self, Unmapped> {
        if let Some(v) = value {
            let v = field_json(key, v)?;
            if !is_empty(&v) {
                self.0.insert(key.into(), v);
            }
        }
        Ok(self)
    }

    /// A pointer field (`*bool`, `*int64`, ...): present exactly when set, even when zero.
    fn ptr<T: ToJson>(mut self, key: &str, value: &Option<T>) -> Result<Self, Unmapped> {
        if let Some(v) = value {
            self.0.insert(key.into(), field_json(key, v)?);
        }
        Ok(self)
    }

    /// A field without `omitempty`: always present, zero when absent.
    fn req<T: ToJson + Default>(mut self, key: &str, value: &Option<T>) -> Result<Self, Unmapped> {
        let v = match value {
            Some(v) => field_json(key, v)?,
            None => field_json(key, &T::default())?,
        };
        self.0.insert(key.into(), v);
        Ok(self)
    }

    /// A Go struct embedded with `json:",inline"`: its fields are the holder's.
    fn inline<T: ToJson>(mut self, key: &str, value: &Option<T>) -> Result<Self, Unmapped> {
        if let Some(Value::Object(fields)) =
            value.as_ref().map(|v| field_json(key, v)).transpose()?
        {
            self.0.extend(fields);
        }
        Ok(self)
    }

    /// A list, dropped when empty.
    fn list<T: ToJson>(mut self, key: &str, items: &[T]) -> Result<Self, Unmapped> {
        if !items.is_empty() {
            let items = items
                .iter()
                .enumerate()
                .map(|(i, v)| field_json(&format!("{key}[{i}]"), v))
                .collect::<Result<_, _>>()?;
            self.0.insert(key.into(), Value::Array(items));
        }
        Ok(self)
    }

    /// A string-keyed map, dropped when empty.
    fn map<T: ToJson>(
        mut self,
        key: &str,
        entries: &BTreeMap<String, T>,
    ) -> Result<Self, Unmapped> {
        if !entries.is_empty() {
            let entries = entries
                .iter()
                .map(|(k, v)| Ok((k.clone(), field_json(&format!("{key}[{k}]"), v)?)))
                .collect::<Result<_, _>>()?;
            self.0.insert(key.into(), Value::Object(entries));
        }
        Ok(self)
    }

    /// A field of the Kubernetes type this server does not map from protobuf: refused when
    /// the client set it, so that it is never silently dropped.
    fn no<T: Present>(self, key: &str, value: &T) -> Result<Self, Unmapped> {
        if value.present() {
            return Err(Unmapped::not_supported().within(key));
        }
        Ok(self)
    }

    fn done(self) -> Value {
        Value::Object(self.0)
    }
}

/// Whether a field the server does not map carries anything.
trait Present {
    fn present(&self) -> bool;
}

impl<T: Message> Present for Option<T> {
    fn present(&self) -> bool {
        self.as_ref().is_some_and(|m| m.encoded_len() > 0)
    }
}

impl<T> Present for Vec<T> {
    fn present(&self) -> bool {
        !self.is_empty()
    }
}

/// A field set to a value that puts its key on the wire: how a message's field numbers are
/// learnt from prost, which has no reflection.
trait Probe {
    fn probe() -> Self;
}

impl<T: Default> Probe for Option<T> {
    fn probe() -> Self {
        Some(T::default())
    }
}

impl<T: Default> Probe for Vec<T> {
    fn probe() -> Self {
        vec![T::default()]
    }
}

impl<T: Default> Probe for BTreeMap<String, T> {
    fn probe() -> Self {
        [(String::new(), T::default())].into()
    }
}

/// How the wire checker reads one field of a message.
struct WireField {
    number: u32,
    key: &'static str,
    /// Lists and maps repeat the field; occurrences are named `key[i]`.
    repeated: bool,
    check: fn(&[u8]) -> Result<(), Unmapped>,
}

impl WireField {
    /// The field that `probe` (a default message with only this field set) puts on the wire.
    fn probed<F: Nested>(key: &'static str, probe: &impl Message, _field: &F) -> WireField {
        WireField {
            number: number_of(probe),
            key,
            repeated: F::REPEATED,
            check: F::check,
        }
    }

    /// A field the server refuses when set: any content in it is refused on the wire too.
    fn refused<F: Shape>(key: &'static str, probe: &impl Message, _field: &F) -> WireField {
        fn refuse(raw: &[u8]) -> Result<(), Unmapped> {
            if raw.is_empty() {
                Ok(())
            } else {
                Err(Unmapped::not_supported())
            }
        }
        WireField {
            number: number_of(probe),
            key,
            repeated: F::REPEATED,
            check: refuse,
        }
    }
}

/// The number of the one field set in `probe`.
fn number_of(probe: &impl Message) -> u32 {
    let wire = probe.encode_to_vec();
    let (number, _) = prost::encoding::decode_key(&mut wire.as_slice())
        .expect("prost writes the key of a set field");
    number
}

/// Whether a field's Rust container repeats it on the wire (lists and maps).
trait Shape {
    const REPEATED: bool;
}

impl<T> Shape for Option<T> {
    const REPEATED: bool = false;
}

impl<T> Shape for Vec<T> {
    const REPEATED: bool = true;
}

impl<T> Shape for BTreeMap<String, T> {
    const REPEATED: bool = true;
}

/// The wire checker of a field's values, by the field's Rust container type.
trait Nested: Shape {
    fn check(raw: &[u8]) -> Result<(), Unmapped>;
}

impl<T: ToJson> Nested for Option<T> {
    fn check(raw: &[u8]) -> Result<(), Unmapped> {
        T::check_wire(raw)
    }
}

impl<T: ToJson> Nested for Vec<T> {
    fn check(raw: &[u8]) -> Result<(), Unmapped> {
        T::check_wire(raw)
    }
}

/// A map entry is a message of key (1) and value (2).
impl<T: ToJson> Nested for BTreeMap<String, T> {
    fn check(raw: &[u8]) -> Result<(), Unmapped> {
        let entry = [
            WireField {
                number: 1,
                key: "",
                repeated: false,
                check: String::check_wire,
            },
            WireField {
                number: 2,
                key: "",
                repeated: false,
                check: T::check_wire,
            },
        ];
        check_fields(raw, &entry)
    }
}

/// Walks the fields of one message on the wire: every field number must be one of `fields`,
/// and nested messages are walked in turn. prost has decoded the body already, so the wire
/// is well-formed; malformed bytes are still refused rather than trusted.
fn check_fields(raw: &[u8], fields: &[WireField]) -> Result<(), Unmapped> {
    use prost::encoding::{DecodeContext, WireType, decode_key, decode_varint, skip_field};
    let mut buf = raw;
    let mut seen: Vec<(u32, usize)> = Vec::new();
    let malformed = || Unmapped {
        field: String::new(),
        reason: UnmappedReason::Malformed,
    };
    while !buf.is_empty() {
        let (number, wire_type) = decode_key(&mut buf).map_err(|_| malformed())?;
        let Some(field) = fields.iter().find(|f| f.number == number) else {
            return Err(Unmapped {
                field: String::new(),
                reason: UnmappedReason::UnknownNumber(number),
            });
        };
        let index = match seen.iter_mut().find(|(n, _)| *n == number) {
            Some((_, count)) => {
                *count += 1;
                *count - 1
            }
            None => {
                seen.push((number, 1));
                0
            }
        };
        if wire_type != WireType::LengthDelimited {
            skip_field(wire_type, number, &mut buf, DecodeContext::default())
                .map_err(|_| malformed())?;
            continue;
        }
        let len = usize::try_from(decode_varint(&mut buf).map_err(|_| malformed())?)
            .map_err(|_| malformed())?;
        let payload = buf.get(..len).ok_or_else(malformed)?;
        buf = &buf[len..];
        let key = if field.repeated && !field.key.is_empty() {
            format!("{}[{index}]", field.key)
        } else {
            field.key.to_string()
        };
        (field.check)(payload).map_err(|e| e.within(&key))?;
    }
    Ok(())
}

/// The wire field of one table entry: `no` fields are refused when they carry anything.
macro_rules! wire_field {
    (no, $key:literal, $probe:ident, $field:expr) => {
        WireField::refused($key, &$probe, $field)
    };
    ($how:ident, $key:literal, $probe:ident, $field:expr) => {
        WireField::probed($key, &$probe, $field)
    };
}

/// Implements ToJson for prost messages from a field table: `how "jsonName" rust_field`,
/// where `how` is a [`Fields`] method naming the Go encoding rule of that field. The table
/// must name every field of the message (the destructuring fails to compile otherwise), so
/// none is dropped unnoticed: a field the server does not map is listed as `no`. Messages
/// with the same fields share one table (`A | B { ... }`).
macro_rules! to_json {
    ($($($ty:path)|+ { $($fields:tt)* })*) => {
        $(to_json!(@each [$($ty)|+] { $($fields)* });)*
    };
    (@each [$ty:path $(| $more:path)*] $fields:tt) => {
        to_json!(@one $ty $fields);
        to_json!(@each [$($more)|*] $fields);
    };
    (@each [] $fields:tt) => {};
    (@one $ty:path { $($how:ident $key:literal $field:ident),* $(,)? }) => {
        impl ToJson for $ty {
            fn to_json(&self) -> Result<Value, Unmapped> {
                let $ty { $($field),* } = self;
                Ok(Fields::default()$(.$how($key, $field)?)*.done())
            }

            fn check_wire(raw: &[u8]) -> Result<(), Unmapped> {
                static FIELDS: std::sync::OnceLock<Vec<WireField>> = std::sync::OnceLock::new();
                let fields = FIELDS.get_or_init(|| vec![$({
                    let mut probe = <$ty>::default();
                    probe.$field = Probe::probe();
                    wire_field!($how, $key, probe, &probe.$field)
                }),*]);
                check_fields(raw, fields)
            }
        }
    };
}

/// The `extra` values of a user, a JSON list of strings in every API group.
macro_rules! extra_value {
    ($($ty:ty),*) => {
        $(impl ToJson for $ty {
            fn to_json(&self) -> Result<Value, Unmapped> {
                Ok(Value::Array(self.items.iter().map(ToJson::to_json).collect::<Result<_, _>>()?))
            }
        })*
    };
}

extra_value!(
    authorization::v1::ExtraValue,
    authentication::v1::ExtraValue,
    certificates::v1::ExtraValue
);

to_json! {
    meta::ObjectMeta {
        opt "name" name, opt "generateName" generate_name, opt "namespace" namespace,
        opt "selfLink" self_link, opt "uid" uid, opt "resourceVersion" resource_version,
        opt "generation" generation, opt "creationTimestamp" creation_timestamp,
        opt "deletionTimestamp" deletion_timestamp,
        ptr "deletionGracePeriodSeconds" deletion_grace_period_seconds,
        map "labels" labels, map "annotations" annotations,
        list "ownerReferences" owner_references, list "finalizers" finalizers,
        list "managedFields" managed_fields,
    }
    meta::OwnerReference {
        req "apiVersion" api_version, req "kind" kind, req "name" name, req "uid" uid,
        ptr "controller" controller, ptr "blockOwnerDeletion" block_owner_deletion,
    }
    meta::ManagedFieldsEntry {
        opt "manager" manager, opt "operation" operation, opt "apiVersion" api_version,
        opt "time" time, opt "fieldsType" fields_type, opt "fieldsV1" fields_v1,
        opt "subresource" subresource,
    }
    meta::DeleteOptions {
        ptr "gracePeriodSeconds" grace_period_seconds, opt "preconditions" preconditions,
        ptr "orphanDependents" orphan_dependents, ptr "propagationPolicy" propagation_policy,
        list "dryRun" dry_run,
        ptr "ignoreStoreReadErrorWithClusterBreakingPotential"
            ignore_store_read_error_with_cluster_breaking_potential,
    }
    meta::Preconditions { ptr "uid" uid, ptr "resourceVersion" resource_version }
    meta::LabelSelector { map "matchLabels" match_labels, list "matchExpressions" match_expressions }
    meta::LabelSelectorRequirement | meta::FieldSelectorRequirement {
        req "key" key, req "operator" operator, list "values" values,
    }

    authorization::v1::SelfSubjectAccessReview
        | authorization::v1::SubjectAccessReview
        | authorization::v1::LocalSubjectAccessReview
        | authorization::v1::SelfSubjectRulesReview
        | authentication::v1::TokenReview
        | authentication::v1::TokenRequest
        | core::v1::Namespace
        | core::v1::ResourceQuota
        | core::v1::Service
        | apps::v1::Deployment
        | apps::v1::StatefulSet
        | apps::v1::DaemonSet
        | batch::v1::Job
        | batch::v1::CronJob
        | policy::v1::PodDisruptionBudget
        | certificates::v1::CertificateSigningRequest {
        opt "metadata" metadata, opt "spec" spec, opt "status" status,
    }
    authorization::v1::SelfSubjectAccessReviewSpec {
        opt "resourceAttributes" resource_attributes,
        opt "nonResourceAttributes" non_resource_attributes,
    }
    authorization::v1::SubjectAccessReviewSpec {
        opt "resourceAttributes" resource_attributes,
        opt "nonResourceAttributes" non_resource_attributes,
        opt "user" user, list "groups" groups, map "extra" extra, opt "uid" uid,
    }
    authorization::v1::ResourceAttributes {
        opt "namespace" namespace, opt "verb" verb, opt "group" group, opt "version" version,
        opt "resource" resource, opt "subresource" subresource, opt "name" name,
        opt "fieldSelector" field_selector, opt "labelSelector" label_selector,
    }
    authorization::v1::FieldSelectorAttributes {
        opt "rawSelector" raw_selector, list "requirements" requirements,
    }
    authorization::v1::LabelSelectorAttributes {
        opt "rawSelector" raw_selector, list "requirements" requirements,
    }
    authorization::v1::NonResourceAttributes { opt "path" path, opt "verb" verb }
    authorization::v1::SubjectAccessReviewStatus {
        req "allowed" allowed, opt "denied" denied, opt "reason" reason,
        opt "evaluationError" evaluation_error,
    }
    authorization::v1::SelfSubjectRulesReviewSpec { opt "namespace" namespace }
    authorization::v1::SubjectRulesReviewStatus {
        list "resourceRules" resource_rules, list "nonResourceRules" non_resource_rules,
        opt "incomplete" incomplete, opt "evaluationError" evaluation_error,
    }
    authorization::v1::ResourceRule {
        list "verbs" verbs, list "apiGroups" api_groups, list "resources" resources,
        list "resourceNames" resource_names,
    }
    authorization::v1::NonResourceRule {
        list "verbs" verbs, list "nonResourceURLs" non_resource_ur_ls,
    }

    authentication::v1::SelfSubjectReview { opt "metadata" metadata, opt "status" status }
    authentication::v1::SelfSubjectReviewStatus { opt "userInfo" user_info }
    authentication::v1::UserInfo {
        opt "username" username, opt "uid" uid, list "groups" groups, map "extra" extra,
    }
    authentication::v1::TokenReviewSpec { opt "token" token, list "audiences" audiences }
    authentication::v1::TokenReviewStatus {
        opt "authenticated" authenticated, opt "user" user, list "audiences" audiences,
        opt "error" error,
    }
    authentication::v1::TokenRequestSpec {
        list "audiences" audiences, ptr "expirationSeconds" expiration_seconds,
        opt "boundObjectRef" bound_object_ref,
    }
    authentication::v1::TokenRequestStatus {
        opt "token" token, opt "expirationTimestamp" expiration_timestamp,
    }
    authentication::v1::BoundObjectReference {
        opt "kind" kind, opt "apiVersion" api_version, opt "name" name, opt "uid" u_id,
    }

    core::v1::ConfigMap {
        opt "metadata" metadata, ptr "immutable" immutable, map "data" data,
        map "binaryData" binary_data,
    }
    core::v1::Secret {
        opt "metadata" metadata, ptr "immutable" immutable, map "data" data,
        map "stringData" string_data, opt "type" r#type,
    }
    core::v1::NamespaceSpec { list "finalizers" finalizers }
    core::v1::NamespaceStatus { opt "phase" phase, list "conditions" conditions }
    core::v1::NamespaceCondition {
        req "type" r#type, req "status" status, opt "lastTransitionTime" last_transition_time,
        opt "reason" reason, opt "message" message,
    }
    core::v1::ServiceAccount {
        opt "metadata" metadata, list "secrets" secrets,
        list "imagePullSecrets" image_pull_secrets,
        ptr "automountServiceAccountToken" automount_service_account_token,
    }
    core::v1::ObjectReference {
        opt "kind" kind, opt "namespace" namespace, opt "name" name, opt "uid" uid,
        opt "apiVersion" api_version, opt "resourceVersion" resource_version,
        opt "fieldPath" field_path,
    }
    core::v1::LocalObjectReference { opt "name" name }
    core::v1::ResourceQuotaSpec {
        map "hard" hard, list "scopes" scopes, opt "scopeSelector" scope_selector,
    }
    core::v1::ResourceQuotaStatus { map "hard" hard, map "used" used }
    core::v1::ScopeSelector { list "matchExpressions" match_expressions }
    core::v1::ScopedResourceSelectorRequirement {
        req "scopeName" scope_name, req "operator" operator, list "values" values,
    }

    rbac::v1::Role { opt "metadata" metadata, list "rules" rules }
    rbac::v1::ClusterRole {
        opt "metadata" metadata, list "rules" rules, opt "aggregationRule" aggregation_rule,
    }
    rbac::v1::AggregationRule { list "clusterRoleSelectors" cluster_role_selectors }
    rbac::v1::PolicyRule {
        list "verbs" verbs, list "apiGroups" api_groups, list "resources" resources,
        list "resourceNames" resource_names, list "nonResourceURLs" non_resource_ur_ls,
    }
    rbac::v1::RoleBinding | rbac::v1::ClusterRoleBinding {
        opt "metadata" metadata, list "subjects" subjects, opt "roleRef" role_ref,
    }
    rbac::v1::Subject {
        req "kind" kind, opt "apiGroup" api_group, req "name" name, opt "namespace" namespace,
    }
    rbac::v1::RoleRef { req "apiGroup" api_group, req "kind" kind, req "name" name }

    policy::v1::Eviction { opt "metadata" metadata, ptr "deleteOptions" delete_options }

    meta::Condition {
        req "type" r#type, req "status" status, opt "observedGeneration" observed_generation,
        req "lastTransitionTime" last_transition_time, req "reason" reason,
        req "message" message,
    }

    core::v1::ServiceSpec {
        list "ports" ports, map "selector" selector, opt "clusterIP" cluster_ip,
        list "clusterIPs" cluster_ips, opt "type" r#type, list "externalIPs" external_ips,
        opt "sessionAffinity" session_affinity, opt "loadBalancerIP" load_balancer_ip,
        list "loadBalancerSourceRanges" load_balancer_source_ranges,
        opt "externalName" external_name, opt "externalTrafficPolicy" external_traffic_policy,
        opt "healthCheckNodePort" health_check_node_port,
        opt "publishNotReadyAddresses" publish_not_ready_addresses,
        ptr "sessionAffinityConfig" session_affinity_config, list "ipFamilies" ip_families,
        ptr "ipFamilyPolicy" ip_family_policy,
        ptr "allocateLoadBalancerNodePorts" allocate_load_balancer_node_ports,
        ptr "loadBalancerClass" load_balancer_class,
        ptr "internalTrafficPolicy" internal_traffic_policy,
        ptr "trafficDistribution" traffic_distribution,
    }
    core::v1::ServicePort {
        opt "name" name, opt "protocol" protocol, ptr "appProtocol" app_protocol,
        req "port" port, opt "targetPort" target_port, opt "nodePort" node_port,
    }
    core::v1::SessionAffinityConfig { ptr "clientIP" client_ip }
    core::v1::ClientIpConfig { ptr "timeoutSeconds" timeout_seconds }
    core::v1::ServiceStatus { opt "loadBalancer" load_balancer, list "conditions" conditions }
    core::v1::LoadBalancerStatus { list "ingress" ingress }
    core::v1::LoadBalancerIngress {
        opt "ip" ip, opt "hostname" hostname, ptr "ipMode" ip_mode, list "ports" ports,
    }
    core::v1::PortStatus { req "port" port, req "protocol" protocol, ptr "error" error }

    scheduling::v1::PriorityClass {
        opt "metadata" metadata, req "value" value, opt "globalDefault" global_default,
        opt "description" description, ptr "preemptionPolicy" preemption_policy,
    }

    certificates::v1::CertificateSigningRequestSpec {
        req "request" request, req "signerName" signer_name,
        ptr "expirationSeconds" expiration_seconds, list "usages" usages,
        opt "username" username, opt "uid" uid, list "groups" groups, map "extra" extra,
    }
    certificates::v1::CertificateSigningRequestStatus {
        list "conditions" conditions, opt "certificate" certificate,
    }
    certificates::v1::CertificateSigningRequestCondition {
        req "type" r#type, req "status" status, opt "reason" reason, opt "message" message,
        opt "lastUpdateTime" last_update_time, opt "lastTransitionTime" last_transition_time,
    }

    apps::v1::DeploymentSpec {
        ptr "replicas" replicas, opt "selector" selector, opt "template" template,
        opt "strategy" strategy, opt "minReadySeconds" min_ready_seconds,
        ptr "revisionHistoryLimit" revision_history_limit, opt "paused" paused,
        ptr "progressDeadlineSeconds" progress_deadline_seconds,
    }
    apps::v1::DeploymentStrategy { opt "type" r#type, opt "rollingUpdate" rolling_update }
    apps::v1::RollingUpdateDeployment {
        ptr "maxUnavailable" max_unavailable, ptr "maxSurge" max_surge,
    }
    apps::v1::DeploymentStatus {
        opt "observedGeneration" observed_generation, opt "replicas" replicas,
        opt "updatedReplicas" updated_replicas, opt "readyReplicas" ready_replicas,
        opt "availableReplicas" available_replicas,
        opt "unavailableReplicas" unavailable_replicas,
        ptr "terminatingReplicas" terminating_replicas, list "conditions" conditions,
        ptr "collisionCount" collision_count,
    }
    apps::v1::DeploymentCondition {
        req "type" r#type, req "status" status, opt "lastUpdateTime" last_update_time,
        opt "lastTransitionTime" last_transition_time, opt "reason" reason,
        opt "message" message,
    }

    apps::v1::StatefulSetSpec {
        ptr "replicas" replicas, opt "selector" selector, opt "template" template,
        no "volumeClaimTemplates" volume_claim_templates, opt "serviceName" service_name,
        opt "podManagementPolicy" pod_management_policy,
        opt "updateStrategy" update_strategy,
        ptr "revisionHistoryLimit" revision_history_limit,
        opt "minReadySeconds" min_ready_seconds,
        ptr "persistentVolumeClaimRetentionPolicy" persistent_volume_claim_retention_policy,
        ptr "ordinals" ordinals,
    }
    apps::v1::StatefulSetUpdateStrategy { opt "type" r#type, ptr "rollingUpdate" rolling_update }
    apps::v1::RollingUpdateStatefulSetStrategy {
        ptr "partition" partition, ptr "maxUnavailable" max_unavailable,
    }
    apps::v1::StatefulSetPersistentVolumeClaimRetentionPolicy {
        opt "whenDeleted" when_deleted, opt "whenScaled" when_scaled,
    }
    apps::v1::StatefulSetOrdinals { opt "start" start }
    apps::v1::StatefulSetStatus {
        opt "observedGeneration" observed_generation, req "replicas" replicas,
        opt "readyReplicas" ready_replicas, opt "currentReplicas" current_replicas,
        opt "updatedReplicas" updated_replicas, opt "currentRevision" current_revision,
        opt "updateRevision" update_revision, ptr "collisionCount" collision_count,
        list "conditions" conditions, req "availableReplicas" available_replicas,
    }
    apps::v1::StatefulSetCondition | apps::v1::DaemonSetCondition {
        req "type" r#type, req "status" status, opt "lastTransitionTime" last_transition_time,
        opt "reason" reason, opt "message" message,
    }
    apps::v1::DaemonSetSpec {
        opt "selector" selector, opt "template" template, opt "updateStrategy" update_strategy,
        opt "minReadySeconds" min_ready_seconds,
        ptr "revisionHistoryLimit" revision_history_limit,
    }
    apps::v1::DaemonSetUpdateStrategy { opt "type" r#type, ptr "rollingUpdate" rolling_update }
    apps::v1::RollingUpdateDaemonSet {
        ptr "maxUnavailable" max_unavailable, ptr "maxSurge" max_surge,
    }
    apps::v1::DaemonSetStatus {
        req "currentNumberScheduled" current_number_scheduled,
        req "numberMisscheduled" number_misscheduled,
        req "desiredNumberScheduled" desired_number_scheduled, req "numberReady" number_ready,
        opt "observedGeneration" observed_generation,
        opt "updatedNumberScheduled" updated_number_scheduled,
        opt "numberAvailable" number_available, opt "numberUnavailable" number_unavailable,
        ptr "collisionCount" collision_count, list "conditions" conditions,
    }

    batch::v1::JobSpec {
        ptr "parallelism" parallelism, ptr "completions" completions,
        ptr "activeDeadlineSeconds" active_deadline_seconds,
        ptr "podFailurePolicy" pod_failure_policy, ptr "successPolicy" success_policy,
        ptr "backoffLimit" backoff_limit, ptr "backoffLimitPerIndex" backoff_limit_per_index,
        ptr "maxFailedIndexes" max_failed_indexes, opt "selector" selector,
        ptr "manualSelector" manual_selector, opt "template" template,
        ptr "ttlSecondsAfterFinished" ttl_seconds_after_finished,
        ptr "completionMode" completion_mode, ptr "suspend" suspend,
        ptr "podReplacementPolicy" pod_replacement_policy, ptr "managedBy" managed_by,
    }
    batch::v1::PodFailurePolicy | batch::v1::SuccessPolicy { list "rules" rules }
    batch::v1::PodFailurePolicyRule {
        req "action" action, ptr "onExitCodes" on_exit_codes,
        list "onPodConditions" on_pod_conditions,
    }
    batch::v1::PodFailurePolicyOnExitCodesRequirement {
        ptr "containerName" container_name, req "operator" operator, list "values" values,
    }
    batch::v1::PodFailurePolicyOnPodConditionsPattern { req "type" r#type, opt "status" status }
    batch::v1::SuccessPolicyRule {
        ptr "succeededIndexes" succeeded_indexes, ptr "succeededCount" succeeded_count,
    }
    batch::v1::JobStatus {
        list "conditions" conditions, opt "startTime" start_time,
        opt "completionTime" completion_time, opt "active" active, opt "succeeded" succeeded,
        opt "failed" failed, ptr "terminating" terminating,
        opt "completedIndexes" completed_indexes, ptr "failedIndexes" failed_indexes,
        opt "uncountedTerminatedPods" uncounted_terminated_pods, ptr "ready" ready,
    }
    batch::v1::JobCondition {
        req "type" r#type, req "status" status, opt "lastProbeTime" last_probe_time,
        opt "lastTransitionTime" last_transition_time, opt "reason" reason,
        opt "message" message,
    }
    batch::v1::UncountedTerminatedPods { list "succeeded" succeeded, list "failed" failed }
    batch::v1::JobTemplateSpec { opt "metadata" metadata, opt "spec" spec }
    batch::v1::CronJobSpec {
        req "schedule" schedule, ptr "timeZone" time_zone,
        ptr "startingDeadlineSeconds" starting_deadline_seconds,
        opt "concurrencyPolicy" concurrency_policy, ptr "suspend" suspend,
        opt "jobTemplate" job_template,
        ptr "successfulJobsHistoryLimit" successful_jobs_history_limit,
        ptr "failedJobsHistoryLimit" failed_jobs_history_limit,
    }
    batch::v1::CronJobStatus {
        list "active" active, opt "lastScheduleTime" last_schedule_time,
        opt "lastSuccessfulTime" last_successful_time,
    }

    policy::v1::PodDisruptionBudgetSpec {
        ptr "minAvailable" min_available, opt "selector" selector,
        ptr "maxUnavailable" max_unavailable,
        ptr "unhealthyPodEvictionPolicy" unhealthy_pod_eviction_policy,
    }
    policy::v1::PodDisruptionBudgetStatus {
        opt "observedGeneration" observed_generation, map "disruptedPods" disrupted_pods,
        req "disruptionsAllowed" disruptions_allowed, req "currentHealthy" current_healthy,
        req "desiredHealthy" desired_healthy, req "expectedPods" expected_pods,
        list "conditions" conditions,
    }

    // The pod template: what workloads carry. Volumes, security contexts, affinity and the
    // other large sub-APIs are not mapped yet; a template that sets them is refused.
    core::v1::PodTemplateSpec { opt "metadata" metadata, opt "spec" spec }
    core::v1::PodSpec {
        no "volumes" volumes, list "initContainers" init_containers,
        list "containers" containers, no "ephemeralContainers" ephemeral_containers,
        opt "restartPolicy" restart_policy,
        ptr "terminationGracePeriodSeconds" termination_grace_period_seconds,
        ptr "activeDeadlineSeconds" active_deadline_seconds, opt "dnsPolicy" dns_policy,
        map "nodeSelector" node_selector, opt "serviceAccountName" service_account_name,
        opt "serviceAccount" service_account,
        ptr "automountServiceAccountToken" automount_service_account_token,
        opt "nodeName" node_name, opt "hostNetwork" host_network, opt "hostPID" host_pid,
        opt "hostIPC" host_ipc, ptr "shareProcessNamespace" share_process_namespace,
        no "securityContext" security_context, list "imagePullSecrets" image_pull_secrets,
        opt "hostname" hostname, opt "subdomain" subdomain, no "affinity" affinity,
        opt "schedulerName" scheduler_name, list "tolerations" tolerations,
        list "hostAliases" host_aliases, opt "priorityClassName" priority_class_name,
        ptr "priority" priority, no "dnsConfig" dns_config,
        list "readinessGates" readiness_gates, ptr "runtimeClassName" runtime_class_name,
        ptr "enableServiceLinks" enable_service_links,
        ptr "preemptionPolicy" preemption_policy, map "overhead" overhead,
        no "topologySpreadConstraints" topology_spread_constraints,
        ptr "setHostnameAsFQDN" set_hostname_as_fqdn, no "os" os,
        ptr "hostUsers" host_users, list "schedulingGates" scheduling_gates,
        no "resourceClaims" resource_claims, opt "resources" resources,
        ptr "hostnameOverride" hostname_override, no "workloadRef" workload_ref,
    }
    core::v1::Container {
        req "name" name, opt "image" image, list "command" command, list "args" args,
        opt "workingDir" working_dir, list "ports" ports, list "envFrom" env_from,
        list "env" env, opt "resources" resources, list "resizePolicy" resize_policy,
        ptr "restartPolicy" restart_policy, no "restartPolicyRules" restart_policy_rules,
        list "volumeMounts" volume_mounts, no "volumeDevices" volume_devices,
        opt "livenessProbe" liveness_probe, opt "readinessProbe" readiness_probe,
        opt "startupProbe" startup_probe, opt "lifecycle" lifecycle,
        opt "terminationMessagePath" termination_message_path,
        opt "terminationMessagePolicy" termination_message_policy,
        opt "imagePullPolicy" image_pull_policy, no "securityContext" security_context,
        opt "stdin" stdin, opt "stdinOnce" stdin_once, opt "tty" tty,
    }
    core::v1::ContainerPort {
        opt "name" name, opt "hostPort" host_port, req "containerPort" container_port,
        opt "protocol" protocol, opt "hostIP" host_ip,
    }
    core::v1::EnvVar { req "name" name, opt "value" value, opt "valueFrom" value_from }
    core::v1::EnvVarSource {
        opt "fieldRef" field_ref, opt "resourceFieldRef" resource_field_ref,
        opt "configMapKeyRef" config_map_key_ref, opt "secretKeyRef" secret_key_ref,
        no "fileKeyRef" file_key_ref,
    }
    core::v1::ObjectFieldSelector { opt "apiVersion" api_version, req "fieldPath" field_path }
    core::v1::ResourceFieldSelector {
        opt "containerName" container_name, req "resource" resource, opt "divisor" divisor,
    }
    core::v1::ConfigMapKeySelector | core::v1::SecretKeySelector {
        inline "" local_object_reference, req "key" key, ptr "optional" optional,
    }
    core::v1::EnvFromSource {
        opt "prefix" prefix, opt "configMapRef" config_map_ref, opt "secretRef" secret_ref,
    }
    core::v1::ConfigMapEnvSource | core::v1::SecretEnvSource {
        inline "" local_object_reference, ptr "optional" optional,
    }
    core::v1::ResourceRequirements {
        map "limits" limits, map "requests" requests, list "claims" claims,
    }
    core::v1::ResourceClaim { req "name" name, opt "request" request }
    core::v1::ContainerResizePolicy {
        req "resourceName" resource_name, req "restartPolicy" restart_policy,
    }
    core::v1::VolumeMount {
        req "name" name, opt "readOnly" read_only, ptr "recursiveReadOnly" recursive_read_only,
        req "mountPath" mount_path, opt "subPath" sub_path,
        ptr "mountPropagation" mount_propagation, opt "subPathExpr" sub_path_expr,
    }
    core::v1::Probe {
        inline "" handler, opt "initialDelaySeconds" initial_delay_seconds,
        opt "timeoutSeconds" timeout_seconds, opt "periodSeconds" period_seconds,
        opt "successThreshold" success_threshold, opt "failureThreshold" failure_threshold,
        ptr "terminationGracePeriodSeconds" termination_grace_period_seconds,
    }
    core::v1::ProbeHandler {
        opt "exec" exec, opt "httpGet" http_get, opt "tcpSocket" tcp_socket, opt "grpc" grpc,
    }
    core::v1::ExecAction { list "command" command }
    core::v1::HttpGetAction {
        opt "path" path, req "port" port, opt "host" host, opt "scheme" scheme,
        list "httpHeaders" http_headers,
    }
    core::v1::HttpHeader { req "name" name, req "value" value }
    core::v1::TcpSocketAction { req "port" port, opt "host" host }
    core::v1::GrpcAction { req "port" port, ptr "service" service }
    core::v1::Lifecycle {
        opt "postStart" post_start, opt "preStop" pre_stop, ptr "stopSignal" stop_signal,
    }
    core::v1::LifecycleHandler {
        opt "exec" exec, opt "httpGet" http_get, opt "tcpSocket" tcp_socket, opt "sleep" sleep,
    }
    core::v1::SleepAction { req "seconds" seconds }
    core::v1::Toleration {
        opt "key" key, opt "operator" operator, opt "value" value, opt "effect" effect,
        ptr "tolerationSeconds" toleration_seconds,
    }
    core::v1::HostAlias { req "ip" ip, list "hostnames" hostnames }
    core::v1::PodReadinessGate { req "conditionType" condition_type }
    core::v1::PodSchedulingGate { req "name" name }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_pb::apimachinery::pkg::runtime::TypeMeta;
    use serde_json::json;

    /// Wraps a message the way client-go's protobuf serializer does (Go writes the empty
    /// contentEncoding/contentType strings too).
    fn envelope(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
        let unknown = Unknown {
            type_meta: Some(TypeMeta {
                api_version: Some(api_version.into()),
                kind: Some(kind.into()),
            }),
            raw: Some(raw),
            content_encoding: Some(String::new()),
            content_type: Some(String::new()),
        };
        [MAGIC, &unknown.encode_to_vec()].concat()
    }

    fn s(v: &str) -> Option<String> {
        Some(v.into())
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn string_map(v: &[(&str, &str)]) -> BTreeMap<String, String> {
        v.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// ObjectMeta as Go's protobuf encoding sends a fresh object: zero-valued scalars and an
    /// empty creationTimestamp are present on the wire and must not reach the JSON.
    fn meta(name: &str, namespace: &str) -> Option<meta::ObjectMeta> {
        Some(meta::ObjectMeta {
            name: s(name),
            generate_name: s(""),
            namespace: s(namespace),
            uid: s(""),
            resource_version: s(""),
            generation: Some(0),
            creation_timestamp: Some(meta::Time::default()),
            ..Default::default()
        })
    }

    fn time(seconds: i64) -> Option<meta::Time> {
        Some(meta::Time {
            seconds: Some(seconds),
            nanos: Some(0),
        })
    }

    fn cases() -> Vec<(&'static str, &'static str, Vec<u8>, Value)> {
        vec![
            (
                "v1",
                "ConfigMap",
                core::v1::ConfigMap {
                    metadata: meta("cfg", "default"),
                    data: string_map(&[("a", "1")]),
                    binary_data: [("b".to_string(), vec![0, 1, 2])].into(),
                    ..Default::default()
                }
                .encode_to_vec(),
                json!({"metadata": {"name": "cfg", "namespace": "default"},
                       "data": {"a": "1"}, "binaryData": {"b": "AAEC"}}),
            ),
            (
                "v1",
                "Secret",
                core::v1::Secret {
                    metadata: meta("db", "prod"),
                    immutable: Some(false),
                    data: [("password".to_string(), b"s3cr3t".to_vec())].into(),
                    r#type: s("Opaque"),
                    ..Default::default()
                }
                .encode_to_vec(),
                json!({"metadata": {"name": "db", "namespace": "prod"}, "immutable": false,
                       "data": {"password": "czNjcjN0"}, "type": "Opaque"}),
            ),
            (
                "v1",
                "Namespace",
                core::v1::Namespace {
                    metadata: meta("team-a", ""),
                    spec: Some(Default::default()),
                    status: Some(core::v1::NamespaceStatus {
                        phase: s(""),
                        ..Default::default()
                    }),
                }
                .encode_to_vec(),
                json!({"metadata": {"name": "team-a"}}),
            ),
            (
                "v1",
                "ServiceAccount",
                core::v1::ServiceAccount {
                    metadata: meta("builder", "ci"),
                    image_pull_secrets: vec![core::v1::LocalObjectReference { name: s("reg") }],
                    automount_service_account_token: Some(false),
                    ..Default::default()
                }
                .encode_to_vec(),
                json!({"metadata": {"name": "builder", "namespace": "ci"},
                       "imagePullSecrets": [{"name": "reg"}],
                       "automountServiceAccountToken": false}),
            ),
            (
                "v1",
                "ResourceQuota",
                core::v1::ResourceQuota {
                    metadata: meta("quota", "ci"),
                    spec: Some(core::v1::ResourceQuotaSpec {
                        hard: [
                            ("pods".to_string(), Quantity { string: s("10") }),
                            ("requests.memory".to_string(), Quantity { string: s("1Gi") }),
                        ]
                        .into(),
                        scopes: strings(&["BestEffort"]),
                        scope_selector: None,
                    }),
                    status: Some(Default::default()),
                }
                .encode_to_vec(),
                json!({"metadata": {"name": "quota", "namespace": "ci"},
                       "spec": {"hard": {"pods": "10", "requests.memory": "1Gi"},
                                "scopes": ["BestEffort"]}}),
            ),
            (
                "apps/v1",
                "DeleteOptions",
                meta::DeleteOptions {
                    propagation_policy: s("Background"),
                    dry_run: strings(&["All"]),
                    preconditions: Some(meta::Preconditions {
                        uid: s("u-1"),
                        resource_version: None,
                    }),
                    ..Default::default()
                }
                .encode_to_vec(),
                json!({"preconditions": {"uid": "u-1"}, "propagationPolicy": "Background",
                       "dryRun": ["All"]}),
            ),
            (
                "authorization.k8s.io/v1",
                "SelfSubjectAccessReview",
                authorization::v1::SelfSubjectAccessReview {
                    metadata: meta("", ""),
                    spec: Some(authorization::v1::SelfSubjectAccessReviewSpec {
                        resource_attributes: Some(authorization::v1::ResourceAttributes {
                            namespace: s("default"),
                            verb: s("create"),
                            group: s(""),
                            version: s(""),
                            resource: s("pods"),
                            subresource: s(""),
                            name: s(""),
                            ..Default::default()
                        }),
                        non_resource_attributes: None,
                    }),
                    status: Some(authorization::v1::SubjectAccessReviewStatus {
                        allowed: Some(false),
                        denied: Some(false),
                        reason: s(""),
                        evaluation_error: s(""),
                    }),
                }
                .encode_to_vec(),
                json!({"spec": {"resourceAttributes":
                           {"namespace": "default", "verb": "create", "resource": "pods"}},
                       "status": {"allowed": false}}),
            ),
            (
                "authorization.k8s.io/v1",
                "SubjectAccessReview",
                authorization::v1::SubjectAccessReview {
                    metadata: None,
                    spec: Some(authorization::v1::SubjectAccessReviewSpec {
                        non_resource_attributes: Some(authorization::v1::NonResourceAttributes {
                            path: s("/healthz"),
                            verb: s("get"),
                        }),
                        user: s("alice"),
                        groups: strings(&["dev"]),
                        extra: [(
                            "scopes".to_string(),
                            authorization::v1::ExtraValue {
                                items: strings(&["a", "b"]),
                            },
                        )]
                        .into(),
                        uid: s("42"),
                        ..Default::default()
                    }),
                    status: None,
                }
                .encode_to_vec(),
                json!({"spec": {"nonResourceAttributes": {"path": "/healthz", "verb": "get"},
                                "user": "alice", "groups": ["dev"],
                                "extra": {"scopes": ["a", "b"]}, "uid": "42"}}),
            ),
            (
                "authorization.k8s.io/v1",
                "LocalSubjectAccessReview",
                authorization::v1::LocalSubjectAccessReview {
                    metadata: meta("", "dev"),
                    spec: Some(authorization::v1::SubjectAccessReviewSpec {
                        resource_attributes: Some(authorization::v1::ResourceAttributes {
                            namespace: s("dev"),
                            verb: s("list"),
                            resource: s("pods"),
                            field_selector: Some(authorization::v1::FieldSelectorAttributes {
                                raw_selector: s("spec.nodeName=n1"),
                                requirements: vec![meta::FieldSelectorRequirement {
                                    key: s("spec.nodeName"),
                                    operator: s("In"),
                                    values: strings(&["n1"]),
                                }],
                            }),
                            ..Default::default()
                        }),
                        user: s("bob"),
                        ..Default::default()
                    }),
                    status: None,
                }
                .encode_to_vec(),
                json!({"metadata": {"namespace": "dev"},
                       "spec": {"resourceAttributes": {
                           "namespace": "dev", "verb": "list", "resource": "pods",
                           "fieldSelector": {"rawSelector": "spec.nodeName=n1", "requirements":
                               [{"key": "spec.nodeName", "operator": "In", "values": ["n1"]}]}},
                           "user": "bob"}}),
            ),
            (
                "authorization.k8s.io/v1",
                "SelfSubjectRulesReview",
                authorization::v1::SelfSubjectRulesReview {
                    metadata: meta("", ""),
                    spec: Some(authorization::v1::SelfSubjectRulesReviewSpec {
                        namespace: s("default"),
                    }),
                    status: Some(authorization::v1::SubjectRulesReviewStatus {
                        incomplete: Some(false),
                        evaluation_error: s(""),
                        ..Default::default()
                    }),
                }
                .encode_to_vec(),
                json!({"spec": {"namespace": "default"}}),
            ),
            (
                "authentication.k8s.io/v1",
                "SelfSubjectReview",
                authentication::v1::SelfSubjectReview {
                    metadata: meta("", ""),
                    status: Some(authentication::v1::SelfSubjectReviewStatus {
                        user_info: Some(authentication::v1::UserInfo {
                            username: s(""),
                            uid: s(""),
                            ..Default::default()
                        }),
                    }),
                }
                .encode_to_vec(),
                json!({}),
            ),
            (
                "authentication.k8s.io/v1",
                "TokenReview",
                authentication::v1::TokenReview {
                    metadata: None,
                    spec: Some(authentication::v1::TokenReviewSpec {
                        token: s("abc.def"),
                        audiences: strings(&["https://kubernetes.default.svc"]),
                    }),
                    status: Some(authentication::v1::TokenReviewStatus {
                        authenticated: Some(false),
                        user: Some(Default::default()),
                        error: s(""),
                        ..Default::default()
                    }),
                }
                .encode_to_vec(),
                json!({"spec": {"token": "abc.def",
                                "audiences": ["https://kubernetes.default.svc"]}}),
            ),
            (
                "authentication.k8s.io/v1",
                "TokenRequest",
                authentication::v1::TokenRequest {
                    metadata: meta("builder", "ci"),
                    spec: Some(authentication::v1::TokenRequestSpec {
                        audiences: strings(&["vault"]),
                        expiration_seconds: Some(3600),
                        bound_object_ref: Some(authentication::v1::BoundObjectReference {
                            kind: s("Pod"),
                            api_version: s("v1"),
                            name: s("web-0"),
                            u_id: s("pod-uid"),
                        }),
                    }),
                    status: Some(authentication::v1::TokenRequestStatus {
                        token: s(""),
                        expiration_timestamp: Some(meta::Time::default()),
                    }),
                }
                .encode_to_vec(),
                json!({"metadata": {"name": "builder", "namespace": "ci"},
                       "spec": {"audiences": ["vault"], "expirationSeconds": 3600,
                                "boundObjectRef": {"kind": "Pod", "apiVersion": "v1",
                                                   "name": "web-0", "uid": "pod-uid"}}}),
            ),
            (
                "rbac.authorization.k8s.io/v1",
                "Role",
                rbac::v1::Role {
                    metadata: meta("reader", "dev"),
                    rules: vec![rbac::v1::PolicyRule {
                        verbs: strings(&["get", "list"]),
                        api_groups: strings(&[""]),
                        resources: strings(&["pods"]),
                        resource_names: strings(&["web"]),
                        ..Default::default()
                    }],
                }
                .encode_to_vec(),
                json!({"metadata": {"name": "reader", "namespace": "dev"},
                       "rules": [{"verbs": ["get", "list"], "apiGroups": [""],
                                  "resources": ["pods"], "resourceNames": ["web"]}]}),
            ),
            (
                "rbac.authorization.k8s.io/v1",
                "ClusterRole",
                rbac::v1::ClusterRole {
                    metadata: meta("agg", ""),
                    rules: vec![rbac::v1::PolicyRule {
                        verbs: strings(&["get"]),
                        non_resource_ur_ls: strings(&["/healthz"]),
                        ..Default::default()
                    }],
                    aggregation_rule: Some(rbac::v1::AggregationRule {
                        cluster_role_selectors: vec![meta::LabelSelector {
                            match_labels: string_map(&[("agg", "true")]),
                            match_expressions: vec![meta::LabelSelectorRequirement {
                                key: s("tier"),
                                operator: s("Exists"),
                                values: vec![],
                            }],
                        }],
                    }),
                }
                .encode_to_vec(),
                json!({"metadata": {"name": "agg"},
                       "rules": [{"verbs": ["get"], "nonResourceURLs": ["/healthz"]}],
                       "aggregationRule": {"clusterRoleSelectors": [{
                           "matchLabels": {"agg": "true"},
                           "matchExpressions": [{"key": "tier", "operator": "Exists"}]}]}}),
            ),
            (
                "rbac.authorization.k8s.io/v1",
                "RoleBinding",
                rbac::v1::RoleBinding {
                    metadata: meta("read", "dev"),
                    subjects: vec![rbac::v1::Subject {
                        kind: s("User"),
                        api_group: s("rbac.authorization.k8s.io"),
                        name: s("alice"),
                        namespace: s(""),
                    }],
                    role_ref: Some(rbac::v1::RoleRef {
                        api_group: s("rbac.authorization.k8s.io"),
                        kind: s("Role"),
                        name: s("reader"),
                    }),
                }
                .encode_to_vec(),
                json!({"metadata": {"name": "read", "namespace": "dev"},
                       "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io",
                                     "name": "alice"}],
                       "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                   "name": "reader"}}),
            ),
            (
                "rbac.authorization.k8s.io/v1",
                "ClusterRoleBinding",
                rbac::v1::ClusterRoleBinding {
                    metadata: meta("admins", ""),
                    subjects: vec![rbac::v1::Subject {
                        kind: s("ServiceAccount"),
                        api_group: s(""),
                        name: s("builder"),
                        namespace: s("ci"),
                    }],
                    role_ref: Some(rbac::v1::RoleRef {
                        api_group: s("rbac.authorization.k8s.io"),
                        kind: s("ClusterRole"),
                        name: s("cluster-admin"),
                    }),
                }
                .encode_to_vec(),
                json!({"metadata": {"name": "admins"},
                       "subjects": [{"kind": "ServiceAccount", "name": "builder",
                                     "namespace": "ci"}],
                       "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                   "kind": "ClusterRole", "name": "cluster-admin"}}),
            ),
            (
                "policy/v1",
                "Eviction",
                policy::v1::Eviction {
                    metadata: meta("web-0", "prod"),
                    delete_options: Some(meta::DeleteOptions {
                        grace_period_seconds: Some(0),
                        ..Default::default()
                    }),
                }
                .encode_to_vec(),
                json!({"metadata": {"name": "web-0", "namespace": "prod"},
                       "deleteOptions": {"gracePeriodSeconds": 0}}),
            ),
            (
                "certificates.k8s.io/v1",
                "CertificateSigningRequest",
                certificates::v1::CertificateSigningRequest {
                    metadata: Some(meta::ObjectMeta {
                        name: s("node-csr"),
                        uid: s("csr-uid"),
                        resource_version: s("17"),
                        creation_timestamp: time(1_700_000_000),
                        ..Default::default()
                    }),
                    spec: Some(certificates::v1::CertificateSigningRequestSpec {
                        request: Some(b"PEM".to_vec()),
                        signer_name: s("kubernetes.io/kube-apiserver-client"),
                        usages: strings(&["client auth"]),
                        username: s("alice"),
                        ..Default::default()
                    }),
                    status: Some(certificates::v1::CertificateSigningRequestStatus {
                        conditions: vec![certificates::v1::CertificateSigningRequestCondition {
                            r#type: s("Approved"),
                            status: s("True"),
                            reason: s("KubectlApprove"),
                            message: s("This CSR was approved by kubectl certificate approve."),
                            last_update_time: time(1_700_000_060),
                            last_transition_time: Some(meta::Time::default()),
                        }],
                        certificate: None,
                    }),
                }
                .encode_to_vec(),
                json!({"metadata": {"name": "node-csr", "uid": "csr-uid", "resourceVersion": "17",
                                    "creationTimestamp": "2023-11-14T22:13:20Z"},
                       "spec": {"request": "UEVN",
                                "signerName": "kubernetes.io/kube-apiserver-client",
                                "usages": ["client auth"], "username": "alice"},
                       "status": {"conditions": [{
                           "type": "Approved", "status": "True", "reason": "KubectlApprove",
                           "message": "This CSR was approved by kubectl certificate approve.",
                           "lastUpdateTime": "2023-11-14T22:14:20Z"}]}}),
            ),
            (
                "v1",
                "Service",
                core::v1::Service {
                    metadata: meta("web", "prod"),
                    spec: Some(core::v1::ServiceSpec {
                        ports: vec![
                            core::v1::ServicePort {
                                name: s("http"),
                                protocol: s("TCP"),
                                port: Some(80),
                                target_port: Some(IntOrString {
                                    r#type: Some(0),
                                    int_val: Some(8080),
                                    str_val: s(""),
                                }),
                                node_port: Some(30080),
                                ..Default::default()
                            },
                            core::v1::ServicePort {
                                name: s("metrics"),
                                protocol: s("TCP"),
                                app_protocol: s("http"),
                                port: Some(9090),
                                target_port: Some(IntOrString {
                                    r#type: Some(1),
                                    int_val: Some(0),
                                    str_val: s("metrics"),
                                }),
                                node_port: Some(0),
                            },
                            // kubectl leaves targetPort zero for the server to default.
                            core::v1::ServicePort {
                                name: s("dns"),
                                protocol: s("UDP"),
                                port: Some(53),
                                target_port: Some(IntOrString::default()),
                                ..Default::default()
                            },
                        ],
                        selector: string_map(&[("app", "web")]),
                        cluster_ip: s(""),
                        r#type: s("NodePort"),
                        session_affinity: s("ClientIP"),
                        session_affinity_config: Some(core::v1::SessionAffinityConfig {
                            client_ip: Some(core::v1::ClientIpConfig {
                                timeout_seconds: Some(600),
                            }),
                        }),
                        ip_family_policy: s("SingleStack"),
                        health_check_node_port: Some(0),
                        publish_not_ready_addresses: Some(false),
                        ..Default::default()
                    }),
                    status: Some(core::v1::ServiceStatus {
                        load_balancer: Some(Default::default()),
                        conditions: vec![],
                    }),
                }
                .encode_to_vec(),
                json!({"metadata": {"name": "web", "namespace": "prod"},
                       "spec": {"ports": [
                                    {"name": "http", "protocol": "TCP", "port": 80,
                                     "targetPort": 8080, "nodePort": 30080},
                                    {"name": "metrics", "protocol": "TCP", "appProtocol": "http",
                                     "port": 9090, "targetPort": "metrics"},
                                    {"name": "dns", "protocol": "UDP", "port": 53}],
                                "selector": {"app": "web"}, "type": "NodePort",
                                "sessionAffinity": "ClientIP",
                                "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 600}},
                                "ipFamilyPolicy": "SingleStack"}}),
            ),
            (
                "apps/v1",
                "Deployment",
                deployment(vec![nginx()]).encode_to_vec(),
                json!({"metadata": {"name": "web", "namespace": "prod", "labels": {"app": "web"}},
                       "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                                "template": {"metadata": {"labels": {"app": "web"}},
                                             "spec": {"containers": [{
                                                 "name": "nginx", "image": "nginx",
                                                 "ports": [{"containerPort": 80}]}]}}}}),
            ),
            (
                "batch/v1",
                "Job",
                batch::v1::Job {
                    metadata: meta("pi", "prod"),
                    spec: Some(batch::v1::JobSpec {
                        parallelism: Some(2),
                        completions: Some(4),
                        backoff_limit: Some(0),
                        completion_mode: s("Indexed"),
                        suspend: Some(false),
                        pod_failure_policy: Some(batch::v1::PodFailurePolicy {
                            rules: vec![batch::v1::PodFailurePolicyRule {
                                action: s("FailJob"),
                                on_exit_codes: Some(
                                    batch::v1::PodFailurePolicyOnExitCodesRequirement {
                                        container_name: None,
                                        operator: s("In"),
                                        values: vec![42, 43],
                                    },
                                ),
                                on_pod_conditions: vec![],
                            }],
                        }),
                        template: Some(core::v1::PodTemplateSpec {
                            metadata: Some(Default::default()),
                            spec: Some(core::v1::PodSpec {
                                containers: vec![core::v1::Container {
                                    name: s("pi"),
                                    image: s("busybox"),
                                    resources: Some(Default::default()),
                                    ..Default::default()
                                }],
                                restart_policy: s("Never"),
                                ..Default::default()
                            }),
                        }),
                        ..Default::default()
                    }),
                    status: Some(batch::v1::JobStatus {
                        uncounted_terminated_pods: Some(Default::default()),
                        ..Default::default()
                    }),
                }
                .encode_to_vec(),
                json!({"metadata": {"name": "pi", "namespace": "prod"},
                       "spec": {"parallelism": 2, "completions": 4, "backoffLimit": 0,
                                "completionMode": "Indexed", "suspend": false,
                                "podFailurePolicy": {"rules": [{"action": "FailJob",
                                    "onExitCodes": {"operator": "In", "values": [42, 43]}}]},
                                "template": {"spec": {"containers": [{"name": "pi", "image": "busybox"}],
                                                      "restartPolicy": "Never"}}}}),
            ),
            (
                "batch/v1",
                "CronJob",
                batch::v1::CronJob {
                    metadata: meta("tick", "prod"),
                    spec: Some(batch::v1::CronJobSpec {
                        schedule: s("*/5 * * * *"),
                        time_zone: s("Etc/UTC"),
                        concurrency_policy: s("Forbid"),
                        suspend: Some(true),
                        job_template: Some(batch::v1::JobTemplateSpec {
                            metadata: meta("tick", ""),
                            spec: Some(batch::v1::JobSpec {
                                ttl_seconds_after_finished: Some(60),
                                ..Default::default()
                            }),
                        }),
                        successful_jobs_history_limit: Some(0),
                        ..Default::default()
                    }),
                    status: Some(Default::default()),
                }
                .encode_to_vec(),
                json!({"metadata": {"name": "tick", "namespace": "prod"},
                       "spec": {"schedule": "*/5 * * * *", "timeZone": "Etc/UTC",
                                "concurrencyPolicy": "Forbid", "suspend": true,
                                "jobTemplate": {"metadata": {"name": "tick"},
                                                "spec": {"ttlSecondsAfterFinished": 60}},
                                "successfulJobsHistoryLimit": 0}}),
            ),
            (
                "policy/v1",
                "PodDisruptionBudget",
                policy::v1::PodDisruptionBudget {
                    metadata: meta("web", "prod"),
                    spec: Some(policy::v1::PodDisruptionBudgetSpec {
                        min_available: Some(IntOrString {
                            r#type: Some(1),
                            int_val: Some(0),
                            str_val: s("50%"),
                        }),
                        selector: Some(meta::LabelSelector {
                            match_labels: string_map(&[("app", "web")]),
                            match_expressions: vec![],
                        }),
                        ..Default::default()
                    }),
                    // Go writes the counters, which have no omitempty, even when zero.
                    status: Some(policy::v1::PodDisruptionBudgetStatus {
                        observed_generation: Some(0),
                        disrupted_pods: [(
                            "web-0".to_string(),
                            meta::Time {
                                seconds: Some(1_700_000_000),
                                nanos: Some(0),
                            },
                        )]
                        .into(),
                        disruptions_allowed: Some(0),
                        current_healthy: Some(0),
                        desired_healthy: Some(0),
                        expected_pods: Some(0),
                        conditions: vec![],
                    }),
                }
                .encode_to_vec(),
                json!({"metadata": {"name": "web", "namespace": "prod"},
                       "spec": {"minAvailable": "50%", "selector": {"matchLabels": {"app": "web"}}},
                       "status": {"disruptedPods": {"web-0": "2023-11-14T22:13:20Z"},
                                  "disruptionsAllowed": 0, "currentHealthy": 0,
                                  "desiredHealthy": 0, "expectedPods": 0}}),
            ),
            (
                "apps/v1",
                "StatefulSet",
                apps::v1::StatefulSet {
                    metadata: meta("db", "prod"),
                    spec: Some(apps::v1::StatefulSetSpec {
                        replicas: Some(3),
                        service_name: s("db"),
                        pod_management_policy: s("Parallel"),
                        update_strategy: Some(apps::v1::StatefulSetUpdateStrategy {
                            r#type: s("RollingUpdate"),
                            rolling_update: Some(apps::v1::RollingUpdateStatefulSetStrategy {
                                partition: Some(1),
                                max_unavailable: None,
                            }),
                        }),
                        persistent_volume_claim_retention_policy: Some(
                            apps::v1::StatefulSetPersistentVolumeClaimRetentionPolicy {
                                when_deleted: s("Delete"),
                                when_scaled: s("Retain"),
                            },
                        ),
                        ..Default::default()
                    }),
                    status: Some(Default::default()),
                }
                .encode_to_vec(),
                json!({"metadata": {"name": "db", "namespace": "prod"},
                       "spec": {"replicas": 3, "serviceName": "db", "podManagementPolicy": "Parallel",
                                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 1}},
                                "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Retain"}},
                       "status": {"replicas": 0, "availableReplicas": 0}}),
            ),
            (
                "apps/v1",
                "DaemonSet",
                apps::v1::DaemonSet {
                    metadata: meta("agent", "kube-system"),
                    spec: Some(apps::v1::DaemonSetSpec {
                        selector: Some(meta::LabelSelector {
                            match_labels: string_map(&[("app", "agent")]),
                            match_expressions: vec![],
                        }),
                        update_strategy: Some(apps::v1::DaemonSetUpdateStrategy {
                            r#type: s("RollingUpdate"),
                            rolling_update: Some(apps::v1::RollingUpdateDaemonSet {
                                max_unavailable: Some(IntOrString {
                                    r#type: Some(0),
                                    int_val: Some(1),
                                    str_val: s(""),
                                }),
                                max_surge: None,
                            }),
                        }),
                        revision_history_limit: Some(5),
                        ..Default::default()
                    }),
                    status: None,
                }
                .encode_to_vec(),
                json!({"metadata": {"name": "agent", "namespace": "kube-system"},
                       "spec": {"selector": {"matchLabels": {"app": "agent"}},
                                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
                                "revisionHistoryLimit": 5}}),
            ),
            (
                "scheduling.k8s.io/v1",
                "PriorityClass",
                scheduling::v1::PriorityClass {
                    metadata: meta("low", ""),
                    value: Some(0),
                    global_default: Some(false),
                    description: s(""),
                    preemption_policy: s("Never"),
                }
                .encode_to_vec(),
                json!({"metadata": {"name": "low"}, "value": 0, "preemptionPolicy": "Never"}),
            ),
        ]
    }

    #[test]
    fn decodes_every_supported_kind_like_kubernetes_json() {
        let cases = cases();
        for (api_version, kind, raw, fields) in &cases {
            let mut want = json!({"apiVersion": api_version, "kind": kind});
            want.as_object_mut()
                .unwrap()
                .extend(fields.as_object().unwrap().clone());
            let got = decode(&envelope(api_version, kind, raw.clone()))
                .unwrap_or_else(|e| panic!("{api_version} {kind}: {e}"));
            assert_eq!(got, want, "{api_version} {kind}");
        }
        // Every entry of the table is exercised.
        let tested = |v: &str, k: &str| {
            cases
                .iter()
                .any(|(cv, ck, ..)| (*cv == v || v == ANY_VERSION) && *ck == k)
        };
        let untested: Vec<_> = KINDS
            .iter()
            .filter(|(v, k, _)| !tested(v, k))
            .map(|(v, k, _)| format!("{v} {k}"))
            .collect();
        assert!(untested.is_empty(), "kinds without a test: {untested:?}");
    }

    fn unhex(hex: &str) -> Vec<u8> {
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Bodies captured from kubectl v1.33 (`-v=9` hex dumps), with the JSON each must become.
    #[test]
    fn decodes_bodies_captured_from_kubectl() {
        let cases = [
            (
                "kubectl auth can-i create pods -n default",
                "6b3873000a320a17617574686f72697a6174696f6e2e6b38732e696f2f7631121753656c665375626a6563\
                 74416363657373526576696577123f0a100a0012001a0022002a0032003800420012210a1f0a0764656661\
                 756c7412066372656174651a0022002a04706f647332003a001a08080012001a0020001a002200",
                json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                       "spec": {"resourceAttributes":
                           {"namespace": "default", "verb": "create", "resource": "pods"}},
                       "status": {"allowed": false}}),
            ),
            (
                "kubectl auth can-i --list -n team-a",
                "6b3873000a310a17617574686f72697a6174696f6e2e6b38732e696f2f7631121653656c665375626a6563\
                 7452756c657352657669657712220a100a0012001a0022002a0032003800420012080a067465616d2d611a\
                 04180022001a002200",
                json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview",
                       "spec": {"namespace": "team-a"}}),
            ),
            (
                "kubectl auth whoami",
                "6b3873000a2d0a1861757468656e7469636174696f6e2e6b38732e696f2f7631121153656c665375626a65\
                 6374526576696577121a0a100a0012001a0022002a0032003800420012060a040a0012001a002200",
                json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}),
            ),
            (
                "kubectl create token builder -n team-a --duration=1h --audience=vault",
                "6b3873000a280a1861757468656e7469636174696f6e2e6b38732e696f2f7631120c546f6b656e52657175\
                 65737412240a100a0012001a0022002a00320038004200120a0a057661756c7420901c1a040a0012001a00\
                 2200",
                json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                       "spec": {"audiences": ["vault"], "expirationSeconds": 3600}}),
            ),
            (
                "kubectl create namespace team-b",
                "6b3873000a0f0a02763112094e616d657370616365121e0a160a067465616d2d6212001a0022002a003200\
                 3800420012001a020a001a002200",
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-b"}}),
            ),
            (
                "kubectl create serviceaccount robot -n team-b",
                "6b3873000a140a027631120e536572766963654163636f756e74121d0a1b0a05726f626f7412001a067465\
                 616d2d6222002a003200380042001a002200",
                json!({"apiVersion": "v1", "kind": "ServiceAccount",
                       "metadata": {"name": "robot", "namespace": "team-b"}}),
            ),
            (
                "kubectl create secret generic s2 --from-literal=k=v -n team-b",
                "6b3873000a0c0a027631120653656372657412240a180a02733212001a067465616d2d6222002a00320038\
                 00420012060a016b1201761a001a002200",
                json!({"apiVersion": "v1", "kind": "Secret",
                       "metadata": {"name": "s2", "namespace": "team-b"}, "data": {"k": "dg=="}}),
            ),
            (
                "kubectl create quota q2 --hard=cpu=2 -n team-b",
                "6b3873000a130a027631120d5265736f7572636551756f7461122a0a180a02713212001a067465616d2d62\
                 22002a00320038004200120c0a0a0a0363707512030a01321a001a002200",
                json!({"apiVersion": "v1", "kind": "ResourceQuota",
                       "metadata": {"name": "q2", "namespace": "team-b"},
                       "spec": {"hard": {"cpu": "2"}}}),
            ),
            (
                "kubectl create rolebinding rb2 --clusterrole=view --group=g -n team-b",
                "6b3873000a2b0a1c726261632e617574686f72697a6174696f6e2e6b38732e696f2f7631120b526f6c6542\
                 696e64696e6712740a190a0372623212001a067465616d2d6222002a0032003800420012270a0547726f75\
                 701219726261632e617574686f72697a6174696f6e2e6b38732e696f1a016722001a2e0a19726261632e61\
                 7574686f72697a6174696f6e2e6b38732e696f120b436c7573746572526f6c651a04766965771a002200",
                json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                       "metadata": {"name": "rb2", "namespace": "team-b"},
                       "subjects": [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io",
                                     "name": "g"}],
                       "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                   "kind": "ClusterRole", "name": "view"}}),
            ),
            (
                "kubectl create service nodeport svc6 --tcp=80:http",
                "6b3873000a0d0a027631120753657276696365126e0a210a047376633612001a0022002a003200380042\
                 005a0b0a0361707012047376633612450a1e0a0738302d6874747012035443501850220a080110001a0468\
                 7474702800120b0a036170701204737663361a0022084e6f6465506f72743a00420052005a00600068001a\
                 020a001a002200",
                json!({"apiVersion": "v1", "kind": "Service",
                       "metadata": {"name": "svc6", "labels": {"app": "svc6"}},
                       "spec": {"ports": [{"name": "80-http", "protocol": "TCP", "port": 80,
                                           "targetPort": "http"}],
                                "selector": {"app": "svc6"}, "type": "NodePort"}}),
            ),
            (
                "kubectl create priorityclass pc2 --value=7",
                "6b3873000a250a147363686564756c696e672e6b38732e696f2f7631120d5072696f72697479436c6173\
                 7312310a130a0370633212001a0022002a003200380042001007180022002a14507265656d70744c6f7765\
                 725072696f726974791a002200",
                json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                       "metadata": {"name": "pc2"}, "value": 7,
                       "preemptionPolicy": "PreemptLowerPriority"}),
            ),
            (
                "kubectl drain n1 --disable-eviction --grace-period=0 (DELETE pod)",
                "6b3873000a130a027631120d44656c6574654f7074696f6e73120208001a002200",
                json!({"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}),
            ),
        ];
        for (command, hex, want) in cases {
            let hex: String = hex.split_whitespace().collect();
            let got = decode(&unhex(&hex)).unwrap_or_else(|e| panic!("{command}: {e}"));
            assert_eq!(got, want, "{command}");
        }
    }

    #[test]
    fn object_meta_maps_every_field() {
        let metadata = meta::ObjectMeta {
            name: s("web"),
            generate_name: s("web-"),
            namespace: s("prod"),
            uid: s("u-1"),
            resource_version: s("42"),
            generation: Some(3),
            creation_timestamp: time(0),
            deletion_timestamp: time(1_700_000_000),
            deletion_grace_period_seconds: Some(0),
            labels: string_map(&[("app", "web")]),
            annotations: string_map(&[("note", "x")]),
            owner_references: vec![meta::OwnerReference {
                api_version: s("apps/v1"),
                kind: s("ReplicaSet"),
                name: s("web-abc"),
                uid: s("rs-1"),
                controller: Some(true),
                block_owner_deletion: Some(false),
            }],
            finalizers: strings(&["kubernetes.io/pvc-protection"]),
            managed_fields: vec![meta::ManagedFieldsEntry {
                manager: s("kubectl"),
                operation: s("Update"),
                api_version: s("v1"),
                time: time(1_700_000_000),
                fields_type: s("FieldsV1"),
                fields_v1: Some(meta::FieldsV1 {
                    raw: Some(br#"{"f:data":{".":{}}}"#.to_vec()),
                }),
                subresource: s(""),
            }],
            ..Default::default()
        };
        let body = envelope(
            "v1",
            "ConfigMap",
            core::v1::ConfigMap {
                metadata: Some(metadata),
                ..Default::default()
            }
            .encode_to_vec(),
        );
        assert_eq!(
            decode(&body).unwrap()["metadata"],
            json!({
                "name": "web", "generateName": "web-", "namespace": "prod", "uid": "u-1",
                "resourceVersion": "42", "generation": 3,
                "creationTimestamp": "1970-01-01T00:00:00Z",
                "deletionTimestamp": "2023-11-14T22:13:20Z", "deletionGracePeriodSeconds": 0,
                "labels": {"app": "web"}, "annotations": {"note": "x"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                     "name": "web-abc", "uid": "rs-1", "controller": true,
                                     "blockOwnerDeletion": false}],
                "finalizers": ["kubernetes.io/pvc-protection"],
                "managedFields": [{"manager": "kubectl", "operation": "Update",
                                   "apiVersion": "v1", "time": "2023-11-14T22:13:20Z",
                                   "fieldsType": "FieldsV1",
                                   "fieldsV1": {"f:data": {".": {}}}}],
            })
        );
    }

    /// A Deployment as `kubectl create deployment web --image=nginx --port=80` sends it: Go
    /// writes every non-pointer field, zero or not.
    fn deployment(containers: Vec<core::v1::Container>) -> apps::v1::Deployment {
        let labels = string_map(&[("app", "web")]);
        apps::v1::Deployment {
            metadata: Some(meta::ObjectMeta {
                labels: labels.clone(),
                ..meta("web", "prod").unwrap()
            }),
            spec: Some(apps::v1::DeploymentSpec {
                replicas: Some(1),
                selector: Some(meta::LabelSelector {
                    match_labels: labels.clone(),
                    match_expressions: vec![],
                }),
                template: Some(core::v1::PodTemplateSpec {
                    metadata: Some(meta::ObjectMeta {
                        labels,
                        ..meta("", "").unwrap()
                    }),
                    spec: Some(core::v1::PodSpec {
                        containers,
                        restart_policy: s(""),
                        dns_policy: s(""),
                        service_account_name: s(""),
                        host_network: Some(false),
                        security_context: Some(Default::default()),
                        ..Default::default()
                    }),
                }),
                strategy: Some(Default::default()),
                min_ready_seconds: Some(0),
                paused: Some(false),
                ..Default::default()
            }),
            status: Some(apps::v1::DeploymentStatus {
                replicas: Some(0),
                ..Default::default()
            }),
        }
    }

    fn nginx() -> core::v1::Container {
        core::v1::Container {
            name: s("nginx"),
            image: s("nginx"),
            ports: vec![core::v1::ContainerPort {
                container_port: Some(80),
                host_port: Some(0),
                ..Default::default()
            }],
            resources: Some(Default::default()),
            stdin: Some(false),
            ..Default::default()
        }
    }

    /// Fields the server does not map, or whose number it does not know, are refused with
    /// their path, never dropped.
    #[test]
    fn refuses_fields_it_cannot_map_naming_them() {
        let with_volume = {
            let mut d = deployment(vec![nginx()]);
            let pod = d.spec.as_mut().unwrap().template.as_mut().unwrap();
            pod.spec.as_mut().unwrap().volumes = vec![core::v1::Volume {
                name: s("data"),
                volume_source: Some(Default::default()),
            }];
            d.encode_to_vec()
        };
        let with_security_context = {
            let mut sidecar = nginx();
            sidecar.name = s("sidecar");
            sidecar.security_context = Some(core::v1::SecurityContext {
                run_as_user: Some(1000),
                ..Default::default()
            });
            deployment(vec![nginx(), sidecar]).encode_to_vec()
        };
        // A field number ConfigMap does not define, as a newer client might send.
        let unknown_top = {
            let mut raw = core::v1::ConfigMap {
                metadata: meta("cfg", "default"),
                ..Default::default()
            }
            .encode_to_vec();
            prost::encoding::string::encode(99, &"x".to_string(), &mut raw);
            raw
        };
        // ... and one deep inside a Deployment's second container's first port.
        let unknown_deep = {
            let mut port = core::v1::ContainerPort {
                container_port: Some(8080),
                ..Default::default()
            }
            .encode_to_vec();
            prost::encoding::int32::encode(42, &7, &mut port);
            let mut container = core::v1::Container {
                name: s("api"),
                image: s("api"),
                ..Default::default()
            }
            .encode_to_vec();
            prost::encoding::bytes::encode(6, &port, &mut container);
            let mut pod = core::v1::PodSpec::default().encode_to_vec();
            prost::encoding::message::encode(2, &nginx(), &mut pod);
            prost::encoding::bytes::encode(2, &container, &mut pod);
            let template = [core::v1::PodTemplateSpec::default().encode_to_vec(), {
                let mut b = Vec::new();
                prost::encoding::bytes::encode(2, &pod, &mut b);
                b
            }]
            .concat();
            let mut spec = Vec::new();
            prost::encoding::bytes::encode(3, &template, &mut spec);
            let mut d = Vec::new();
            prost::encoding::bytes::encode(2, &spec, &mut d);
            d
        };
        let cases = [
            (
                "apps/v1",
                "Deployment",
                with_volume,
                "cannot decode apps/v1, Kind=Deployment from protobuf: field spec.template.spec.volumes[0] is not supported in protobuf by this server; send the object as JSON",
                true,
            ),
            (
                "apps/v1",
                "Deployment",
                with_security_context,
                "field spec.template.spec.containers[1].securityContext is not supported",
                true,
            ),
            (
                "v1",
                "ConfigMap",
                unknown_top,
                "cannot decode /v1, Kind=ConfigMap from protobuf: unknown field number 99 in the object",
                false,
            ),
            (
                "apps/v1",
                "Deployment",
                unknown_deep,
                "unknown field number 42 in spec.template.spec.containers[1].ports[0]",
                false,
            ),
        ];
        for (api_version, kind, raw, message, unsupported) in cases {
            let err = decode(&envelope(api_version, kind, raw)).expect_err(message);
            assert!(
                err.to_string().contains(message),
                "got {err}, want {message:?}"
            );
            assert_eq!(err.is_unsupported(), unsupported, "{message}");
        }
    }

    /// What a request handler answers: the object, 415 for an unmapped kind, 400 otherwise.
    #[test]
    fn request_bodies_in_protobuf_reach_handlers_as_json() {
        const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";
        let namespace = core::v1::Namespace {
            metadata: meta("team-a", ""),
            ..Default::default()
        };
        let body = envelope("v1", "Namespace", namespace.encode_to_vec());
        let parsed = crate::objects::parse_body(&body, PROTOBUF).unwrap();
        assert_eq!(
            parsed,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}})
        );

        let revision = envelope("apps/v1", "ControllerRevision", vec![]);
        let err = crate::objects::parse_body(&revision, PROTOBUF).unwrap_err();
        assert_eq!((err.code, err.reason), (415, "UnsupportedMediaType"));
        assert!(
            err.message.contains("apps/v1, Kind=ControllerRevision"),
            "{}",
            err.message
        );

        let err = crate::objects::parse_body(&body[..body.len() - 3], PROTOBUF).unwrap_err();
        assert_eq!(
            (err.code, err.reason),
            (400, "BadRequest"),
            "{}",
            err.message
        );
    }

    #[test]
    fn rejects_bodies_it_cannot_decode() {
        let config_map = core::v1::ConfigMap {
            metadata: meta("cfg", "default"),
            data: string_map(&[("key", "a value long enough to cut")]),
            ..Default::default()
        }
        .encode_to_vec();
        let good = envelope("v1", "ConfigMap", config_map.clone());
        let gzipped = {
            let mut unknown = Unknown::decode(&good[4..]).unwrap();
            unknown.content_encoding = s("gzip");
            [MAGIC, &unknown.encode_to_vec()].concat()
        };
        let cases: Vec<(&str, Vec<u8>, &str, bool)> = vec![
            (
                "JSON body",
                br#"{"kind":"ConfigMap"}"#.to_vec(),
                "does not start with the Kubernetes magic number",
                false,
            ),
            (
                "truncated envelope",
                good[..good.len() - 10].to_vec(),
                "cannot decode the protobuf envelope",
                false,
            ),
            (
                "truncated object",
                envelope(
                    "v1",
                    "ConfigMap",
                    config_map[..config_map.len() - 5].to_vec(),
                ),
                "cannot decode /v1, Kind=ConfigMap from protobuf",
                false,
            ),
            (
                "compressed payload",
                gzipped,
                "contentEncoding \"gzip\"",
                false,
            ),
            (
                "group kind without a mapping",
                envelope("apps/v1", "ControllerRevision", vec![]),
                "unsupported kind \"apps/v1, Kind=ControllerRevision\" in protobuf; send it as JSON (kubectl create -f / apply)",
                true,
            ),
            (
                "core kind without a mapping",
                envelope("v1", "Pod", vec![]),
                "unsupported kind \"/v1, Kind=Pod\"",
                true,
            ),
        ];
        for (name, body, message, unsupported) in cases {
            let err = decode(&body).expect_err(name);
            assert!(
                err.to_string().contains(message),
                "{name}: got {err:?}, want {message:?}"
            );
            assert_eq!(err.is_unsupported(), unsupported, "{name}");
        }
    }
}
