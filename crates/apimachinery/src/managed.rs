//! Server-side apply: field sets (fieldsV1), ownership, conflicts and managedFields bookkeeping.
//!
//! A port of what kube-apiserver runs on every write through
//! `k8s.io/apiserver/pkg/endpoints/handlers/fieldmanager` and
//! `sigs.k8s.io/structured-merge-diff`: `apply` merges an applied configuration into the live
//! object, prunes what the applier stopped applying, and refuses to silently take fields other
//! managers set to other values; `record_update` gives the fields a create/update/patch changed
//! to its manager. Both are pure functions over `serde_json::Value`; list merge rules come from
//! [`PatchSchema`]. Objects are not converted between versions: an entry's apiVersion is
//! recorded, not used.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_json::{Map, Value};

use crate::patchmeta::{ListType, PatchSchema};

/// Fields kube-apiserver never records as managed (`stripMeta` in the fieldmanager): they
/// identify the object or are maintained by the server.
const STRIPPED_METADATA: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
];

/// Structs and lists present (empty or null) in the Go zero value of their parent. kube compares
/// an update against a typed object, so creating one of these does not record the node itself
/// (`.`), only what is under it; without Go types we mimic that for the common ones.
const ZERO_VALUE_STRUCTS: &[&str] = &[
    "metadata",
    "spec",
    "status",
    "template",
    "strategy",
    "updateStrategy",
    "jobTemplate",
    "containers",
];

/// Manager kube-apiserver gives the fields of an object that predates managed fields, on its
/// first apply, so that the applier conflicts with them instead of silently taking them.
const BEFORE_FIRST_APPLY: &str = "before-first-apply";

/// kube-apiserver keeps at most this many Update entries; older ones merge into
/// [`ANCIENT_CHANGES`] buckets, one per apiVersion, so managedFields cannot grow without bound.
const MAX_UPDATE_MANAGERS: usize = 10;

/// Manager of the bucket the oldest Update entries merge into.
const ANCIENT_CHANGES: &str = "ancient-changes";

/// One step of a field path, as a key of the fieldsV1 format.
#[derive(Clone, Debug)]
pub enum PathElement {
    /// A field of a map or struct (`f:name`).
    Field(String),
    /// An item of a keyed list, by its key fields sorted by name (`k:{"name":"c"}`).
    Key(Vec<(String, Value)>),
    /// An item of a set list, by value (`v:"x"`).
    Value(Value),
    /// An item of a list by position (`i:0`), for list items that cannot be keyed.
    Index(usize),
}

impl PathElement {
    /// Parses one fieldsV1 key (`f:`, `k:`, `v:` or `i:` prefixed).
    pub fn parse(s: &str) -> Result<Self, ManagedError> {
        let invalid = |why: &str| ManagedError::Invalid(format!("fieldsV1 key {s:?}: {why}"));
        let (prefix, rest) = s
            .split_once(':')
            .ok_or_else(|| invalid("no f:, k:, v: or i: prefix"))?;
        match prefix {
            "f" => Ok(PathElement::Field(rest.to_string())),
            "k" => match serde_json::from_str::<Value>(rest) {
                Ok(Value::Object(fields)) => {
                    let mut key: Vec<(String, Value)> = fields.into_iter().collect();
                    key.sort_by(|a, b| a.0.cmp(&b.0));
                    Ok(PathElement::Key(key))
                }
                _ => Err(invalid("key is not a JSON object")),
            },
            "v" => serde_json::from_str(rest)
                .map(PathElement::Value)
                .map_err(|e| invalid(&format!("value is not JSON: {e}"))),
            "i" => rest
                .parse()
                .map(PathElement::Index)
                .map_err(|_| invalid("index is not a non-negative integer")),
            _ => Err(invalid("unknown prefix")),
        }
    }

    /// The fieldsV1 key of this element, encoded as the Go JSON encoder does.
    pub fn to_key(&self) -> String {
        match self {
            PathElement::Field(name) => format!("f:{name}"),
            PathElement::Key(fields) => {
                let map: Map<String, Value> = fields.iter().cloned().collect();
                format!("k:{}", go_json(&Value::Object(map)))
            }
            PathElement::Value(v) => format!("v:{}", go_json(v)),
            PathElement::Index(i) => format!("i:{i}"),
        }
    }

    fn rank(&self) -> u8 {
        match self {
            PathElement::Field(_) => 0,
            PathElement::Key(_) => 1,
            PathElement::Value(_) => 2,
            PathElement::Index(_) => 3,
        }
    }
}

/// Same order as structured-merge-diff's `PathElement.Compare`, which fixes the order of keys
/// in fieldsV1.
impl Ord for PathElement {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (PathElement::Field(a), PathElement::Field(b)) => a.cmp(b),
            (PathElement::Key(a), PathElement::Key(b)) => {
                for ((an, av), (bn, bv)) in a.iter().zip(b) {
                    let c = an.cmp(bn).then_with(|| cmp_values(av, bv));
                    if c != Ordering::Equal {
                        return c;
                    }
                }
                a.len().cmp(&b.len())
            }
            (PathElement::Value(a), PathElement::Value(b)) => cmp_values(a, b),
            (PathElement::Index(a), PathElement::Index(b)) => a.cmp(b),
            _ => self.rank().cmp(&other.rank()),
        }
    }
}

impl PartialOrd for PathElement {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for PathElement {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for PathElement {}

/// Same as `PathElement.String()` in structured-merge-diff: `.name`, `[name="c"]`, `[="x"]`.
impl fmt::Display for PathElement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathElement::Field(name) => write!(f, ".{name}"),
            PathElement::Key(fields) => {
                let parts: Vec<String> = fields
                    .iter()
                    .map(|(n, v)| format!("{n}={}", value_string(v)))
                    .collect();
                write!(f, "[{}]", parts.join(","))
            }
            PathElement::Value(v) => write!(f, "[={}]", value_string(v)),
            PathElement::Index(i) => write!(f, "[{i}]"),
        }
    }
}

/// A path as kube prints it in conflict messages: `.spec.template.spec.containers[name="c"].image`.
pub fn path_string(path: &[PathElement]) -> String {
    path.iter().map(ToString::to_string).collect()
}

/// A scalar as structured-merge-diff's `value.ToString` prints it (strings quoted).
fn value_string(v: &Value) -> String {
    match v {
        Value::String(_) => serde_json::to_string(v).unwrap_or_default(),
        Value::Null => "null".to_string(),
        other => other.to_string(),
    }
}

/// Compact JSON with the HTML escaping Go's encoder applies, so keys match kube byte for byte.
fn go_json(v: &Value) -> String {
    serde_json::to_string(v)
        .unwrap_or_default()
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
}

/// Total order over JSON values, as structured-merge-diff's `value.Compare`: numbers, strings,
/// booleans, lists, maps, null.
fn cmp_values(a: &Value, b: &Value) -> Ordering {
    fn rank(v: &Value) -> u8 {
        match v {
            Value::Number(_) => 0,
            Value::String(_) => 1,
            Value::Bool(_) => 2,
            Value::Array(_) => 3,
            Value::Object(_) => 4,
            Value::Null => 5,
        }
    }
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let int = |n: &serde_json::Number| {
                n.as_i64()
                    .map(i128::from)
                    .or_else(|| n.as_u64().map(i128::from))
            };
            match (int(x), int(y)) {
                (Some(x), Some(y)) => x.cmp(&y),
                _ => {
                    let (x, y) = (x.as_f64().unwrap_or(0.0), y.as_f64().unwrap_or(0.0));
                    x.partial_cmp(&y).unwrap_or(Ordering::Equal)
                }
            }
        }
        (Value::String(x), Value::String(y)) => x.cmp(y),
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::Array(x), Value::Array(y)) => x
            .iter()
            .zip(y)
            .map(|(a, b)| cmp_values(a, b))
            .find(|c| *c != Ordering::Equal)
            .unwrap_or_else(|| x.len().cmp(&y.len())),
        (Value::Object(x), Value::Object(y)) => {
            let (x, y) = (sorted_entries(x), sorted_entries(y));
            x.iter()
                .zip(&y)
                .map(|((an, av), (bn, bv))| an.cmp(bn).then_with(|| cmp_values(av, bv)))
                .find(|c| *c != Ordering::Equal)
                .unwrap_or_else(|| x.len().cmp(&y.len()))
        }
        _ => rank(a).cmp(&rank(b)),
    }
}

fn sorted_entries(m: &Map<String, Value>) -> Vec<(&String, &Value)> {
    let mut v: Vec<(&String, &Value)> = m.iter().collect();
    v.sort_by(|a, b| a.0.cmp(b.0));
    v
}

/// A set of field paths in the fieldsV1 format (`"f:name"`, `"k:{\"name\":\"c\"}"`, `"v:\"x\""`,
/// `"."` for the node itself).
///
/// A path is in the set when its last element is a member of the node at its prefix; nodes with
/// children are not themselves members unless fieldsV1 says `"."`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSet {
    members: BTreeSet<PathElement>,
    /// Never holds an empty set.
    children: BTreeMap<PathElement, FieldSet>,
}

impl FieldSet {
    /// Parses a `fieldsV1` object as stored in a managedFields entry.
    pub fn from_fields_v1(v: &Value) -> Result<Self, ManagedError> {
        let obj = v.as_object().ok_or_else(|| {
            ManagedError::Invalid(format!("fieldsV1 must be a JSON object, got {v}"))
        })?;
        let mut set = FieldSet::default();
        for (key, child) in obj {
            if key == "." {
                continue;
            }
            let pe = PathElement::parse(key)?;
            let child_obj = child.as_object().ok_or_else(|| {
                ManagedError::Invalid(format!("fieldsV1 key {key:?}: value must be an object"))
            })?;
            if child_obj.is_empty() || child_obj.contains_key(".") {
                set.members.insert(pe.clone());
            }
            let sub = FieldSet::from_fields_v1(child)?;
            if !sub.is_empty() {
                set.children.insert(pe, sub);
            }
        }
        Ok(set)
    }

    /// Serializes to `fieldsV1` exactly as kube-apiserver writes it: keys in path-element
    /// order, `"."` first in a node that is both a member and has children.
    pub fn to_fields_v1(&self) -> Value {
        Value::Object(self.emit(false))
    }

    fn emit(&self, include_self: bool) -> Map<String, Value> {
        let mut out = Map::new();
        if include_self {
            out.insert(".".to_string(), Value::Object(Map::new()));
        }
        let elements: BTreeSet<&PathElement> =
            self.members.iter().chain(self.children.keys()).collect();
        for pe in elements {
            let value = match self.children.get(pe) {
                Some(child) => child.emit(self.members.contains(pe)),
                None => Map::new(),
            };
            out.insert(pe.to_key(), Value::Object(value));
        }
        out
    }

    /// The fields an object sets, as an applier of it would own them: leaves, atomic lists and
    /// maps, list items, empty maps and nulls; never apiVersion, kind or server-owned metadata.
    /// List items that cannot be keyed are recorded by index.
    pub fn of_object(obj: &Value, schema: &PatchSchema) -> Self {
        let mut walk = Walk::new(schema);
        walk.lenient = true;
        walk.field_set(obj).unwrap_or_default().strip_meta()
    }

    /// Whether the set holds no path.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty() && self.children.is_empty()
    }

    /// Adds a path (the empty path, the object itself, is never a member).
    pub fn insert(&mut self, path: &[PathElement]) {
        match path {
            [] => {}
            [last] => {
                self.members.insert(last.clone());
            }
            [first, rest @ ..] => self.children.entry(first.clone()).or_default().insert(rest),
        }
    }

    /// Whether the path is in the set.
    pub fn has(&self, path: &[PathElement]) -> bool {
        match path {
            [] => false,
            [last] => self.members.contains(last),
            [first, rest @ ..] => self.children.get(first).is_some_and(|c| c.has(rest)),
        }
    }

    /// Paths in either set.
    pub fn union(&self, other: &FieldSet) -> FieldSet {
        let mut out = self.clone();
        out.members.extend(other.members.iter().cloned());
        for (pe, child) in &other.children {
            let merged = match out.children.get(pe) {
                Some(mine) => mine.union(child),
                None => child.clone(),
            };
            out.children.insert(pe.clone(), merged);
        }
        out
    }

    /// Paths in this set and not in `other`.
    pub fn difference(&self, other: &FieldSet) -> FieldSet {
        FieldSet {
            members: self.members.difference(&other.members).cloned().collect(),
            children: self
                .children
                .iter()
                .filter_map(|(pe, child)| {
                    let rest = match other.children.get(pe) {
                        Some(theirs) => child.difference(theirs),
                        None => child.clone(),
                    };
                    (!rest.is_empty()).then(|| (pe.clone(), rest))
                })
                .collect(),
        }
    }

    /// Paths in both sets.
    pub fn intersection(&self, other: &FieldSet) -> FieldSet {
        FieldSet {
            members: self.members.intersection(&other.members).cloned().collect(),
            children: self
                .children
                .iter()
                .filter_map(|(pe, child)| {
                    let both = child.intersection(other.children.get(pe)?);
                    (!both.is_empty()).then(|| (pe.clone(), both))
                })
                .collect(),
        }
    }

    /// Every path in the set in structured-merge-diff's `Iterate` order (the order of kube's
    /// conflict lists): a node's members, then the paths under each of its children.
    pub fn paths(&self) -> Vec<Vec<PathElement>> {
        let mut out = Vec::new();
        self.collect_paths(&mut Vec::new(), &mut out);
        out
    }

    fn collect_paths(&self, prefix: &mut Vec<PathElement>, out: &mut Vec<Vec<PathElement>>) {
        for pe in &self.members {
            prefix.push(pe.clone());
            out.push(prefix.clone());
            prefix.pop();
        }
        for (pe, child) in &self.children {
            prefix.push(pe.clone());
            child.collect_paths(prefix, out);
            prefix.pop();
        }
    }

    /// This set plus every prefix of its paths.
    fn with_ancestors(&self) -> FieldSet {
        let mut out = FieldSet {
            members: self.members.clone(),
            children: BTreeMap::new(),
        };
        for (pe, child) in &self.children {
            out.members.insert(pe.clone());
            out.children.insert(pe.clone(), child.with_ancestors());
        }
        out
    }

    /// This set without the top-level fields `names` and everything under them (e.g. the
    /// fields an endpoint ignores).
    pub fn without_top_fields(&self, names: &[&str]) -> FieldSet {
        let drop =
            |pe: &PathElement| matches!(pe, PathElement::Field(n) if names.contains(&n.as_str()));
        FieldSet {
            members: self
                .members
                .iter()
                .filter(|pe| !drop(pe))
                .cloned()
                .collect(),
            children: self
                .children
                .iter()
                .filter(|(pe, _)| !drop(pe))
                .map(|(pe, c)| (pe.clone(), c.clone()))
                .collect(),
        }
    }

    /// This set without the fields kube never records (see [`STRIPPED_METADATA`]).
    fn strip_meta(&self) -> FieldSet {
        let mut out = self.without_top_fields(&["apiVersion", "kind"]);
        let metadata = PathElement::Field("metadata".to_string());
        out.members.remove(&metadata);
        if let Some(meta) = out.children.remove(&metadata) {
            let meta = meta.without_top_fields(STRIPPED_METADATA);
            if !meta.is_empty() {
                out.children.insert(metadata, meta);
            }
        }
        out
    }
}

/// Everything an apply or update needs besides the objects.
#[derive(Clone, Copy, Debug)]
pub struct ManagedContext<'a> {
    /// The field manager (`fieldManager` query parameter, or the user agent's program name).
    pub manager: &'a str,
    /// The apiVersion of the request (`apps/v1`), recorded in the entry.
    pub api_version: &'a str,
    /// Time of the request, RFC 3339 (`2024-05-01T10:00:00Z`).
    pub time: &'a str,
    /// How the kind's lists merge.
    pub schema: &'a PatchSchema,
    /// Subresource of the request (`"status"`, `"scale"`): recorded in the entry and part of
    /// the manager's identity.
    pub subresource: Option<&'a str>,
    /// Top-level fields this endpoint does not own, e.g. `["status"]` for the main resource of
    /// a kind with a status subresource, or all but `"status"` for `/status`. They are never
    /// recorded, and an apply leaves them as they are.
    pub ignored: &'a [&'a str],
}

/// Conflict with another manager.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// The other manager's name.
    pub manager: String,
    /// The apiVersion of the other manager's entry.
    pub api_version: String,
    /// `.spec.replicas` style path of the contested field.
    pub field: String,
    /// Operation of the other manager's entry (`Apply` or `Update`).
    pub operation: String,
    /// Subresource of the other manager's entry.
    pub subresource: Option<String>,
}

impl Conflict {
    /// The manager as kube prints it: `"m"`, `"m" with subresource "status"`, `"m" using v1`.
    fn who(&self) -> String {
        let mut out = format!("{:?}", self.manager);
        if let Some(sub) = &self.subresource {
            out.push_str(&format!(" with subresource {sub:?}"));
        }
        if self.operation == UPDATE {
            out.push_str(&format!(" using {}", self.api_version));
        }
        out
    }
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "conflict with {}: {}", self.who(), self.field)
    }
}

/// Why an apply or a managedFields decoding failed.
#[derive(Debug, thiserror::Error)]
pub enum ManagedError {
    /// The apply would change fields other managers own; the message is kube's.
    #[error("{}", conflict_message(.0))]
    Conflicts(Vec<Conflict>),
    /// The applied configuration or the stored managedFields are malformed.
    #[error("{0}")]
    Invalid(String),
}

/// Why an applied configuration has no field set: a list item that cannot be keyed.
#[derive(Debug, thiserror::Error)]
enum WalkError {
    /// An item of an associative list is not an object.
    #[error("list item {index} is not an object: {item}")]
    NotAnObject {
        /// The item's index.
        index: usize,
        /// The item.
        item: Value,
    },
    /// An item of an associative list omits a key that has no default.
    #[error(
        "associative list with keys has an element that omits key field {key:?} (item {index})"
    )]
    MissingKey {
        /// The key omitted.
        key: String,
        /// The item's index.
        index: usize,
    },
    /// Two items of the list at `path` have the same key.
    #[error(".{path}: duplicate entries for key {element}")]
    Duplicate {
        /// The list's path, its field names joined by `.`.
        path: String,
        /// The key repeated.
        element: PathElement,
    },
}

/// kube-apiserver's `getConflictMessage`.
fn conflict_message(conflicts: &[Conflict]) -> String {
    if let [one] = conflicts {
        return format!("Apply failed with 1 conflict: {one}");
    }
    let mut by_manager: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for c in conflicts {
        by_manager.entry(c.who()).or_default().push(&c.field);
    }
    let mut lines = Vec::new();
    for (who, fields) in by_manager {
        lines.push(format!("conflicts with {who}:"));
        lines.extend(fields.iter().map(|f| format!("- {f}")));
    }
    format!(
        "Apply failed with {} conflicts: {}",
        conflicts.len(),
        lines.join("\n")
    )
}

const APPLY: &str = "Apply";
const UPDATE: &str = "Update";

/// One managedFields entry.
#[derive(Clone, Debug, PartialEq)]
struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    time: Option<String>,
    subresource: Option<String>,
    fields: FieldSet,
}

impl Entry {
    /// kube's `BuildManagerIdentifier`: appliers are one manager whatever apiVersion they use.
    fn same_manager(
        &self,
        manager: &str,
        operation: &str,
        api_version: &str,
        sub: Option<&str>,
    ) -> bool {
        self.manager == manager
            && self.operation == operation
            && self.subresource.as_deref() == sub
            && (operation == APPLY || self.api_version == api_version)
    }

    fn decode(v: &Value, index: usize) -> Result<Entry, ManagedError> {
        let invalid =
            |why: String| ManagedError::Invalid(format!("metadata.managedFields[{index}]: {why}"));
        let s = |name: &str| v.get(name).and_then(Value::as_str).map(str::to_string);
        let operation = s("operation").unwrap_or_default();
        if operation != APPLY && operation != UPDATE {
            return Err(invalid(format!(
                "operation must be `Apply` or `Update`, got {operation:?}"
            )));
        }
        let api_version = s("apiVersion").unwrap_or_default();
        if api_version.is_empty() {
            return Err(invalid("apiVersion must not be empty".to_string()));
        }
        match s("fieldsType").as_deref() {
            Some("FieldsV1") => {}
            None | Some("") => return Err(invalid("missing fieldsType".to_string())),
            Some(other) => return Err(invalid(format!("invalid fieldsType {other:?}"))),
        }
        let fields = match v.get("fieldsV1") {
            None | Some(Value::Null) => FieldSet::default(),
            Some(f) => FieldSet::from_fields_v1(f).map_err(|e| invalid(e.to_string()))?,
        };
        Ok(Entry {
            manager: s("manager").unwrap_or_default(),
            operation,
            api_version,
            time: s("time"),
            subresource: s("subresource").filter(|s| !s.is_empty()),
            fields,
        })
    }

    fn encode(&self) -> Value {
        let mut m = Map::new();
        m.insert("manager".into(), Value::from(self.manager.clone()));
        m.insert("operation".into(), Value::from(self.operation.clone()));
        m.insert("apiVersion".into(), Value::from(self.api_version.clone()));
        if let Some(t) = &self.time {
            m.insert("time".into(), Value::from(t.clone()));
        }
        m.insert("fieldsType".into(), Value::from("FieldsV1"));
        m.insert("fieldsV1".into(), self.fields.to_fields_v1());
        if let Some(sub) = &self.subresource {
            m.insert("subresource".into(), Value::from(sub.clone()));
        }
        Value::Object(m)
    }
}

fn decode_entries(obj: &Value) -> Result<Vec<Entry>, ManagedError> {
    let Some(list) = obj.pointer("/metadata/managedFields") else {
        return Ok(Vec::new());
    };
    let items = match list {
        Value::Null => return Ok(Vec::new()),
        Value::Array(items) => items,
        _ => {
            return Err(ManagedError::Invalid(
                "metadata.managedFields must be a list".to_string(),
            ));
        }
    };
    let mut out: Vec<Entry> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let entry = Entry::decode(item, i)?;
        // Duplicate identities merge, as kube's decoder keys entries by identity.
        match out.iter_mut().find(|e| {
            e.same_manager(
                &entry.manager,
                &entry.operation,
                &entry.api_version,
                entry.subresource.as_deref(),
            )
        }) {
            Some(existing) => existing.fields = existing.fields.union(&entry.fields),
            None => out.push(entry),
        }
    }
    Ok(out)
}

/// Writes the entries in kube's order (`sortEncodedManagedFields`): Apply before Update, then
/// by time, manager, apiVersion, subresource; an empty list removes the field.
fn encode_entries(obj: &mut Value, mut entries: Vec<Entry>) {
    entries.retain(|e| !e.fields.is_empty());
    entries.sort_by(|a, b| {
        a.operation
            .cmp(&b.operation)
            .then_with(|| a.time.cmp(&b.time))
            .then_with(|| a.manager.cmp(&b.manager))
            .then_with(|| a.api_version.cmp(&b.api_version))
            .then_with(|| a.subresource.cmp(&b.subresource))
    });
    let Some(obj) = obj.as_object_mut() else {
        return;
    };
    let meta = obj
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(meta) = meta.as_object_mut() else {
        return;
    };
    if entries.is_empty() {
        meta.shift_remove("managedFields");
    } else {
        meta.insert(
            "managedFields".to_string(),
            Value::Array(entries.iter().map(Entry::encode).collect()),
        );
    }
}

/// A copy of the object without metadata.managedFields: ownership is never part of a diff.
fn without_managed_fields(obj: &Value) -> Value {
    let mut out = obj.clone();
    if let Some(meta) = out.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.shift_remove("managedFields");
    }
    out
}

/// Server-side apply of `config` (the applied configuration, already parsed from YAML/JSON)
/// onto `live` (None = create). Returns the new object with metadata.managedFields updated.
/// force=true takes ownership of conflicting fields.
pub fn apply(
    live: Option<&Value>,
    config: &Value,
    force: bool,
    ctx: &ManagedContext,
) -> Result<Value, ManagedError> {
    if !config.is_object() {
        return Err(ManagedError::Invalid(
            "apply configuration must be a JSON object".to_string(),
        ));
    }
    if config
        .pointer("/metadata/managedFields")
        .is_some_and(|v| !v.is_null())
    {
        return Err(ManagedError::Invalid(
            "metadata.managedFields must be nil in an apply configuration".to_string(),
        ));
    }
    let mut entries = match live {
        Some(l) => decode_entries(l)?,
        None => Vec::new(),
    };
    let base = live
        .map(without_managed_fields)
        .unwrap_or_else(|| Value::Object(Map::new()));
    if live.is_some() && entries.is_empty() {
        let fields = FieldSet::of_object(&base, ctx.schema).without_top_fields(ctx.ignored);
        entries.push(Entry {
            manager: BEFORE_FIRST_APPLY.to_string(),
            operation: UPDATE.to_string(),
            api_version: ctx.api_version.to_string(),
            time: Some(ctx.time.to_string()),
            subresource: None,
            fields,
        });
    }

    // The configuration must key every list item; stored objects are walked leniently.
    let mut owned_by_config = config.clone();
    if let Some(fields) = owned_by_config.as_object_mut() {
        fields.retain(|k, _| !ctx.ignored.contains(&k.as_str()));
    }
    let applied = Walk::new(ctx.schema)
        .field_set(&owned_by_config)
        .map_err(|e| ManagedError::Invalid(format!("apply configuration: {e}")))?
        .strip_meta();
    let mut walk = Walk::new(ctx.schema);
    walk.lenient = true;
    let config = keep_ignored(config, live, ctx.ignored);
    let mut result = walk.merge(Some(&base), &config, &mut Vec::new());

    let previous = entries
        .iter()
        .position(|e| e.same_manager(ctx.manager, APPLY, ctx.api_version, ctx.subresource))
        .map(|i| entries.remove(i));

    // Prune what this manager applied last time and nobody (itself included) owns now.
    if let Some(previous) = &previous {
        let owned = entries
            .iter()
            .fold(applied.clone(), |acc, e| acc.union(&e.fields));
        let stale = previous
            .fields
            .with_ancestors()
            .difference(&owned.with_ancestors());
        walk.remove(&mut result, &stale, &mut Vec::new(), ROOT_PROTECTED);
    }

    let diff = walk.compare(&base, &result, ctx.ignored);
    let changed = diff.added.union(&diff.modified);
    let mut conflicts = Vec::new();
    for entry in &entries {
        for path in entry.fields.intersection(&changed).paths() {
            conflicts.push(Conflict {
                manager: entry.manager.clone(),
                api_version: entry.api_version.clone(),
                field: path_string(&path),
                operation: entry.operation.clone(),
                subresource: entry.subresource.clone(),
            });
        }
    }
    if !force && !conflicts.is_empty() {
        return Err(ManagedError::Conflicts(conflicts));
    }
    for entry in &mut entries {
        entry.fields = entry.fields.difference(&changed).difference(&diff.removed);
    }

    let time = match &previous {
        Some(p) if p.fields == applied && base == without_managed_fields(&result) => p.time.clone(),
        _ => Some(ctx.time.to_string()),
    };
    entries.push(Entry {
        manager: ctx.manager.to_string(),
        operation: APPLY.to_string(),
        api_version: ctx.api_version.to_string(),
        time,
        subresource: ctx.subresource.map(str::to_string),
        fields: applied,
    });
    encode_entries(&mut result, entries);
    Ok(result)
}

/// Records an Update operation (create/update/non-apply patch): fields whose values changed
/// from `old` to `new` become owned by ctx.manager (one Update entry per
/// manager+apiVersion+subresource), and leave other managers' sets; entries with empty sets
/// are dropped. Mutates new's metadata.managedFields.
///
/// As kube-apiserver does, managedFields sent in `new` replace the stored ones when they are
/// valid and not empty (clients that do not know the field keep the stored ones by omitting
/// it), `[{}]` clears them, and a subresource request always starts from the stored ones.
pub fn record_update(old: Option<&Value>, new: &mut Value, ctx: &ManagedContext) {
    if !new.get("metadata").is_some_and(Value::is_object) {
        return;
    }
    let stored = || old.and_then(|o| decode_entries(o).ok()).unwrap_or_default();
    let sent = new.pointer("/metadata/managedFields");
    let reset = sent
        .and_then(Value::as_array)
        .is_some_and(|items| items.len() == 1 && items[0].as_object().is_some_and(Map::is_empty));
    let mut entries = if reset {
        Vec::new()
    } else if ctx.subresource.is_some() {
        stored()
    } else {
        match decode_entries(new) {
            Ok(entries) if !entries.is_empty() => entries,
            _ => stored(),
        }
    };

    let base = old
        .map(without_managed_fields)
        .unwrap_or_else(|| Value::Object(Map::new()));
    let current = without_managed_fields(new);
    let mut walk = Walk::new(ctx.schema);
    walk.lenient = true;
    let diff = walk.compare(&base, &current, ctx.ignored);
    let taken = diff.added.union(&diff.modified).difference(&diff.removed);
    for entry in &mut entries {
        entry.fields = entry.fields.difference(&taken).difference(&diff.removed);
    }
    if !taken.is_empty() {
        // kube unions the fields of this operation into the manager's earlier Update entry
        // and stamps it, so the time says when the manager last changed something.
        let mine = entries
            .iter()
            .position(|e| e.same_manager(ctx.manager, UPDATE, ctx.api_version, ctx.subresource));
        let fields = match mine {
            Some(i) => entries.remove(i).fields.union(&taken),
            None => taken,
        };
        entries.push(Entry {
            manager: ctx.manager.to_string(),
            operation: UPDATE.to_string(),
            api_version: ctx.api_version.to_string(),
            time: Some(ctx.time.to_string()),
            subresource: ctx.subresource.map(str::to_string),
            fields,
        });
    }
    cap_update_managers(&mut entries);
    encode_entries(new, entries);
}

/// kube's `capUpdateManagers`: while there are more than [`MAX_UPDATE_MANAGERS`] Update
/// entries, the oldest merge into an `ancient-changes` entry of their apiVersion (the first
/// one seen of a version becomes the bucket), which takes the time of the last merged.
fn cap_update_managers(entries: &mut Vec<Entry>) {
    let mut updaters: Vec<usize> = (0..entries.len())
        .filter(|&i| entries[i].operation == UPDATE)
        .collect();
    if updaters.len() <= MAX_UPDATE_MANAGERS {
        return;
    }
    updaters.sort_by(|&a, &b| {
        let (a, b) = (&entries[a], &entries[b]);
        a.time
            .cmp(&b.time)
            .then_with(|| a.manager.cmp(&b.manager))
            .then_with(|| a.api_version.cmp(&b.api_version))
            .then_with(|| a.subresource.cmp(&b.subresource))
    });
    let mut first_of_version: BTreeMap<String, usize> = BTreeMap::new();
    let mut merged = BTreeSet::new();
    let mut length = updaters.len();
    for i in updaters {
        if length <= MAX_UPDATE_MANAGERS {
            break;
        }
        let version = entries[i].api_version.clone();
        let Some(&first) = first_of_version.get(&version) else {
            first_of_version.insert(version, i);
            continue;
        };
        let existing = (0..entries.len()).find(|&b| {
            !merged.contains(&b) && entries[b].same_manager(ANCIENT_CHANGES, UPDATE, &version, None)
        });
        let bucket = existing.unwrap_or_else(|| {
            entries[first].manager = ANCIENT_CHANGES.to_string();
            entries[first].subresource = None;
            first
        });
        if bucket == i {
            continue;
        }
        entries[bucket].fields = entries[bucket].fields.union(&entries[i].fields);
        entries[bucket].time = entries[i].time.clone();
        merged.insert(i);
        length -= 1;
    }
    let mut index = 0;
    entries.retain(|_| {
        index += 1;
        !merged.contains(&(index - 1))
    });
}

/// The applied configuration with the fields this endpoint does not own taken from the live
/// object (or dropped on create): kube's strategies reset them, e.g. status on the main
/// resource. apiVersion, kind and metadata are kept on create, since they name the object.
fn keep_ignored(config: &Value, live: Option<&Value>, ignored: &[&str]) -> Value {
    let mut out = config.clone();
    let Some(obj) = out.as_object_mut() else {
        return out;
    };
    for name in ignored {
        match live {
            Some(live) => match live.get(*name) {
                Some(v) => {
                    obj.insert(name.to_string(), v.clone());
                }
                None => {
                    obj.shift_remove(*name);
                }
            },
            None if ["apiVersion", "kind", "metadata"].contains(name) => {}
            None => {
                obj.shift_remove(*name);
            }
        }
    }
    out
}

/// Fields of the object root an apply never prunes: they name the object.
const ROOT_PROTECTED: &[&str] = &["apiVersion", "kind", "metadata"];

/// Key fields that default when an item omits them, as the OpenAPI defaults kube keys items
/// with (`ContainerPort.protocol`, `ServicePort.protocol`); patchmeta has no defaults.
fn key_default(field: &str) -> Option<Value> {
    (field == "protocol").then(|| Value::from("TCP"))
}

/// How a node of an object merges.
enum Shape {
    /// Owned and replaced whole.
    Leaf,
    /// Merged field by field.
    Map,
    /// Merged item by item.
    List(ListType),
}

/// Differences between two objects, as structured-merge-diff's `Compare`.
#[derive(Default)]
struct Comparison {
    added: FieldSet,
    modified: FieldSet,
    removed: FieldSet,
}

/// Walks objects along with their merge rules; `names` is the schema path (list items skipped).
struct Walk<'a> {
    schema: &'a PatchSchema,
    /// Key list items by index instead of failing when they lack key fields or repeat a key:
    /// stored objects must always get field sets, applied configurations must be valid.
    lenient: bool,
}

impl<'a> Walk<'a> {
    fn new(schema: &'a PatchSchema) -> Self {
        Walk {
            schema,
            lenient: false,
        }
    }

    fn shape(&self, names: &[String], v: &Value) -> Shape {
        let path: Vec<&str> = names.iter().map(String::as_str).collect();
        match v {
            Value::Object(m) if self.schema.is_atomic_map(&path) || is_label_selector(m) => {
                Shape::Leaf
            }
            Value::Object(_) => Shape::Map,
            Value::Array(_) => match self.schema.list_type(&path) {
                ListType::Atomic => Shape::Leaf,
                other => Shape::List(other),
            },
            _ => Shape::Leaf,
        }
    }

    /// The path element of a list item.
    fn item_element(
        &self,
        list: &ListType,
        item: &Value,
        index: usize,
    ) -> Result<PathElement, WalkError> {
        let keys = match list {
            ListType::Set => return Ok(PathElement::Value(item.clone())),
            ListType::Map(keys) if !keys.is_empty() => keys,
            _ => return Ok(PathElement::Index(index)),
        };
        let keyed = || -> Result<PathElement, WalkError> {
            let obj = item.as_object().ok_or_else(|| WalkError::NotAnObject {
                index,
                item: item.clone(),
            })?;
            let mut key = Vec::new();
            for k in keys {
                let v = match obj.get(k).filter(|v| !v.is_null()) {
                    Some(v) => v.clone(),
                    None => key_default(k).ok_or_else(|| WalkError::MissingKey {
                        key: k.clone(),
                        index,
                    })?,
                };
                key.push((k.clone(), v));
            }
            key.sort_by(|a, b| a.0.cmp(&b.0));
            Ok(PathElement::Key(key))
        };
        match keyed() {
            Ok(pe) => Ok(pe),
            Err(_) if self.lenient => Ok(PathElement::Index(index)),
            Err(e) => Err(e),
        }
    }

    /// Path elements of a list's items; duplicates are an error unless lenient, where they
    /// fall back to their index.
    fn item_elements(
        &self,
        list: &ListType,
        items: &[Value],
        names: &[String],
    ) -> Result<Vec<PathElement>, WalkError> {
        let mut seen = BTreeSet::new();
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let mut pe = self.item_element(list, item, i)?;
            if !seen.insert(pe.clone()) {
                if !self.lenient {
                    return Err(WalkError::Duplicate {
                        path: names.join("."),
                        element: pe,
                    });
                }
                pe = PathElement::Index(i);
            }
            out.push(pe);
        }
        Ok(out)
    }

    /// Path elements of the items of a stored list, which must never fail: items that cannot be
    /// keyed, or repeat a key, are addressed by index.
    fn stored_elements(
        &self,
        list: &ListType,
        items: &[Value],
        names: &[String],
    ) -> Vec<PathElement> {
        let lenient = Walk {
            schema: self.schema,
            lenient: true,
        };
        lenient
            .item_elements(list, items, names)
            .unwrap_or_else(|_| (0..items.len()).map(PathElement::Index).collect())
    }

    /// The field set under `v` (structured-merge-diff's `ToFieldSet`), relative to it.
    fn field_set(&self, v: &Value) -> Result<FieldSet, WalkError> {
        self.field_set_at(v, &mut Vec::new())
    }

    fn field_set_at(&self, v: &Value, names: &mut Vec<String>) -> Result<FieldSet, WalkError> {
        let mut set = FieldSet::default();
        match (self.shape(names, v), v) {
            (Shape::Map, Value::Object(fields)) => {
                for (k, child) in fields {
                    names.push(k.clone());
                    let member = match self.shape(names, child) {
                        Shape::Leaf => true,
                        Shape::Map => child.as_object().is_some_and(Map::is_empty),
                        Shape::List(_) => false,
                    };
                    let sub = self.field_set_at(child, names)?;
                    names.pop();
                    let pe = PathElement::Field(k.clone());
                    if member {
                        set.members.insert(pe.clone());
                    }
                    if !sub.is_empty() {
                        set.children.insert(pe, sub);
                    }
                }
            }
            (Shape::List(list), Value::Array(items)) => {
                for (pe, item) in self
                    .item_elements(&list, items, names)?
                    .into_iter()
                    .zip(items)
                {
                    set.members.insert(pe.clone());
                    if matches!(list, ListType::Map(_)) {
                        let sub = self.field_set_at(item, names)?;
                        if !sub.is_empty() {
                            set.children.insert(pe, sub);
                        }
                    }
                }
            }
            _ => {}
        }
        Ok(set)
    }

    /// `rhs` merged into `lhs` (structured-merge-diff's `Merge`): maps recurse, keyed and set
    /// lists merge item by item, everything else is replaced. A null in `rhs` removes the field.
    fn merge(&self, lhs: Option<&Value>, rhs: &Value, names: &mut Vec<String>) -> Value {
        match (self.shape(names, rhs), rhs) {
            (Shape::Map, Value::Object(r)) => {
                let mut out = match lhs {
                    Some(Value::Object(l)) => l.clone(),
                    _ => Map::new(),
                };
                for (k, rv) in r {
                    if rv.is_null() {
                        out.shift_remove(k);
                        continue;
                    }
                    names.push(k.clone());
                    let merged = self.merge(out.get(k), rv, names);
                    names.pop();
                    out.insert(k.clone(), merged);
                }
                Value::Object(out)
            }
            (Shape::List(list), Value::Array(r)) => match lhs {
                Some(Value::Array(l)) => Value::Array(self.merge_list(&list, l, r, names)),
                _ => Value::Array(r.iter().map(|item| self.merge(None, item, names)).collect()),
            },
            _ => rhs.clone(),
        }
    }

    /// Port of structured-merge-diff's `visitListItems` ordering: items only in `l` keep their
    /// place, items of `r` come in `r`'s order, shared items where `r` puts them.
    fn merge_list(
        &self,
        list: &ListType,
        l: &[Value],
        r: &[Value],
        names: &mut Vec<String>,
    ) -> Vec<Value> {
        let (lpes, rpes) = (
            self.stored_elements(list, l, names),
            self.stored_elements(list, r, names),
        );
        let lindex: BTreeMap<&PathElement, usize> =
            lpes.iter().enumerate().map(|(i, pe)| (pe, i)).collect();
        let rindex: BTreeMap<&PathElement, usize> =
            rpes.iter().enumerate().map(|(i, pe)| (pe, i)).collect();
        let mut shared = rpes.iter().filter(|pe| lindex.contains_key(pe));
        let mut next_shared = shared.next();
        let mut merged_r: BTreeSet<&PathElement> = BTreeSet::new();
        let mut out = Vec::with_capacity(l.len().max(r.len()));
        let (mut li, mut ri) = (0, 0);
        while li < l.len() || ri < r.len() {
            if li < l.len() && ri < r.len() {
                if lpes[li] == rpes[ri] {
                    merged_r.insert(&rpes[ri]);
                    out.push(self.merge(Some(&l[li]), &r[ri], names));
                    li += 1;
                    ri += 1;
                    next_shared = shared.next();
                    continue;
                }
                if rindex.contains_key(&lpes[li]) && next_shared.is_some_and(|n| *n != lpes[li]) {
                    // Shared, but `r` wants another shared item first: it comes with `r`.
                    li += 1;
                    continue;
                }
            }
            if li < l.len() {
                if !rindex.contains_key(&lpes[li]) {
                    out.push(l[li].clone());
                    li += 1;
                    continue;
                }
                if merged_r.contains(&lpes[li]) {
                    li += 1;
                    continue;
                }
            }
            if ri < r.len() {
                let pe = &rpes[ri];
                merged_r.insert(pe);
                let lchild = lindex.get(pe).map(|&i| &l[i]);
                out.push(self.merge(lchild, &r[ri], names));
                ri += 1;
                if next_shared == Some(pe) {
                    next_shared = shared.next();
                }
            } else {
                // Only reachable with duplicate keys in `l`: keep the item rather than loop.
                out.push(l[li].clone());
                li += 1;
            }
        }
        out
    }

    /// Removes the paths of `stale` from `v`, except fields in `protected` (a list item's key
    /// fields, the object's identity).
    fn remove(&self, v: &mut Value, stale: &FieldSet, names: &mut Vec<String>, protected: &[&str]) {
        match self.shape(names, v) {
            Shape::Map => {
                let Some(fields) = v.as_object_mut() else {
                    return;
                };
                let keys: Vec<String> = fields.keys().cloned().collect();
                for k in keys {
                    let pe = PathElement::Field(k.clone());
                    if stale.members.contains(&pe) && !protected.contains(&k.as_str()) {
                        fields.shift_remove(&k);
                    } else if let (Some(sub), Some(child)) =
                        (stale.children.get(&pe), fields.get_mut(&k))
                    {
                        names.push(k);
                        self.remove(child, sub, names, &[]);
                        names.pop();
                    }
                }
            }
            Shape::List(list) => {
                let Some(items) = v.as_array_mut() else {
                    return;
                };
                let pes = self.stored_elements(&list, items, names);
                let keys: Vec<&str> = match &list {
                    ListType::Map(keys) => keys.iter().map(String::as_str).collect(),
                    _ => Vec::new(),
                };
                let mut kept = Vec::with_capacity(items.len());
                for (pe, mut item) in pes.into_iter().zip(items.drain(..)) {
                    if stale.members.contains(&pe) {
                        continue;
                    }
                    if let Some(sub) = stale.children.get(&pe) {
                        self.remove(&mut item, sub, names, &keys);
                    }
                    kept.push(item);
                }
                *items = kept;
            }
            Shape::Leaf => {}
        }
    }

    /// What changed from `lhs` to `rhs`, without the fields kube never records and the
    /// top-level `ignored` ones.
    fn compare(&self, lhs: &Value, rhs: &Value, ignored: &[&str]) -> Comparison {
        let mut c = Comparison::default();
        self.compare_at(
            Some(lhs),
            Some(rhs),
            &mut Vec::new(),
            &mut Vec::new(),
            &mut c,
        );
        let clean = |s: &FieldSet| s.strip_meta().without_top_fields(ignored);
        Comparison {
            added: clean(&c.added),
            modified: clean(&c.modified),
            removed: clean(&c.removed),
        }
    }

    fn compare_at<'v>(
        &self,
        lhs: Option<&'v Value>,
        rhs: Option<&'v Value>,
        names: &mut Vec<String>,
        path: &mut Vec<PathElement>,
        c: &mut Comparison,
    ) {
        let shape = |v: Option<&Value>| v.map(|v| self.shape(names, v));
        let container = match (shape(lhs), shape(rhs)) {
            (Some(Shape::Map), Some(Shape::Map) | None) | (None, Some(Shape::Map)) => {
                Some(Shape::Map)
            }
            (Some(Shape::List(l)), None) | (None, Some(Shape::List(l))) => Some(Shape::List(l)),
            (Some(Shape::List(l)), Some(Shape::List(r))) if l == r => Some(Shape::List(l)),
            _ => None,
        };
        match container {
            Some(Shape::Map) => {
                if lhs.is_none() {
                    c.added.insert(path);
                }
                if rhs.is_none() {
                    c.removed.insert(path);
                }
                let empty = Map::new();
                let l = lhs.and_then(Value::as_object).unwrap_or(&empty);
                let r = rhs.and_then(Value::as_object).unwrap_or(&empty);
                let (empty_map, empty_list) = (Value::Object(Map::new()), Value::Array(Vec::new()));
                // A struct or list of a Go zero value exists (empty) as soon as its parent does.
                let zero_like = |v: Option<&Value>| match v {
                    Some(Value::Object(_)) => Some(&empty_map),
                    Some(Value::Array(_)) => Some(&empty_list),
                    _ => None,
                };
                let keys: Vec<&String> = l
                    .keys()
                    .chain(r.keys().filter(|k| !l.contains_key(*k)))
                    .collect();
                for k in keys {
                    let (mut lc, mut rc) = (l.get(k), r.get(k));
                    if ZERO_VALUE_STRUCTS.contains(&k.as_str()) {
                        if lc.is_none() && lhs.is_some() {
                            lc = zero_like(rc);
                        }
                        if rc.is_none() && rhs.is_some() {
                            rc = zero_like(lc);
                        }
                    }
                    names.push(k.clone());
                    path.push(PathElement::Field(k.clone()));
                    self.compare_at(lc, rc, names, path, c);
                    path.pop();
                    names.pop();
                }
            }
            Some(Shape::List(list)) => {
                if lhs.is_none() {
                    c.added.insert(path);
                }
                if rhs.is_none() {
                    c.removed.insert(path);
                }
                let items = |v: Option<&'v Value>| -> &'v [Value] {
                    v.and_then(Value::as_array)
                        .map(Vec::as_slice)
                        .unwrap_or(&[])
                };
                let (l, r) = (items(lhs), items(rhs));
                let lpes = self.stored_elements(&list, l, names);
                let rpes = self.stored_elements(&list, r, names);
                let rindex: BTreeMap<&PathElement, usize> =
                    rpes.iter().enumerate().map(|(i, pe)| (pe, i)).collect();
                let lset: BTreeSet<&PathElement> = lpes.iter().collect();
                for (i, pe) in lpes.iter().enumerate() {
                    path.push(pe.clone());
                    self.compare_at(Some(&l[i]), rindex.get(pe).map(|&j| &r[j]), names, path, c);
                    path.pop();
                }
                for (j, pe) in rpes.iter().enumerate() {
                    if !lset.contains(pe) {
                        path.push(pe.clone());
                        self.compare_at(None, Some(&r[j]), names, path, c);
                        path.pop();
                    }
                }
            }
            _ => match (lhs, rhs) {
                (None, Some(_)) => c.added.insert(path),
                (Some(_), None) => c.removed.insert(path),
                (Some(a), Some(b)) if a != b => c.modified.insert(path),
                _ => {}
            },
        }
    }
}

/// A `metav1.LabelSelector`: kube marks it `structType=atomic`, so it is owned and replaced
/// whole wherever it appears (controller-gen carries the marker into CRD schemas too).
fn is_label_selector(m: &Map<String, Value>) -> bool {
    !m.is_empty()
        && m.keys()
            .all(|k| k == "matchLabels" || k == "matchExpressions")
        && m.get("matchLabels").is_none_or(Value::is_object)
        && m.get("matchExpressions").is_none_or(Value::is_array)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const T1: &str = "2026-01-01T10:00:00Z";
    const T2: &str = "2026-01-01T11:00:00Z";
    const MAIN: &[&str] = &["status"];

    fn deployments() -> PatchSchema {
        PatchSchema::builtin("apps", "Deployment")
    }

    fn ctx<'a>(manager: &'a str, time: &'a str, schema: &'a PatchSchema) -> ManagedContext<'a> {
        ManagedContext {
            manager,
            api_version: "apps/v1",
            time,
            schema,
            subresource: None,
            ignored: MAIN,
        }
    }

    /// The Deployment of the Kubernetes docs, as a user writes it for `kubectl apply`.
    fn deployment(replicas: i64, image: &str) -> Value {
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "nginx", "namespace": "default", "labels": {"app": "nginx"}},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": "nginx"}},
                "template": {
                    "metadata": {"labels": {"app": "nginx"}},
                    "spec": {"containers": [{
                        "name": "nginx",
                        "image": image,
                        "ports": [{"containerPort": 80}]
                    }]}
                }
            }
        })
    }

    /// The fieldsV1 of the entry of `manager` with `operation`, if any.
    fn fields_of(obj: &Value, manager: &str, operation: &str) -> Option<Value> {
        obj.pointer("/metadata/managedFields")?
            .as_array()?
            .iter()
            .find(|e| e["manager"] == manager && e["operation"] == operation)
            .map(|e| e["fieldsV1"].clone())
    }

    fn managers(obj: &Value) -> Vec<(String, String)> {
        obj.pointer("/metadata/managedFields")
            .and_then(Value::as_array)
            .map(|entries| {
                entries
                    .iter()
                    .map(|e| {
                        (
                            e["manager"].as_str().unwrap_or_default().to_string(),
                            e["operation"].as_str().unwrap_or_default().to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// fieldsV1 of `kubectl apply --server-side` of [`deployment`], as kube-apiserver stores it.
    const KUBECTL_APPLY: &str = r#"{"f:metadata":{"f:labels":{"f:app":{}}},"f:spec":{"f:replicas":{},"f:selector":{},"f:template":{"f:metadata":{"f:labels":{"f:app":{}}},"f:spec":{"f:containers":{"k:{\"name\":\"nginx\"}":{".":{},"f:image":{},"f:name":{},"f:ports":{"k:{\"containerPort\":80,\"protocol\":\"TCP\"}":{".":{},"f:containerPort":{}}}}}}}}}"#;

    #[test]
    fn fields_v1_round_trips_kube_samples() {
        let samples = [
            ("kubectl server-side apply", KUBECTL_APPLY),
            (
                "kube-controller-manager status update",
                r#"{"f:metadata":{"f:annotations":{".":{},"f:deployment.kubernetes.io/revision":{}}},"f:status":{"f:availableReplicas":{},"f:conditions":{".":{},"k:{\"type\":\"Available\"}":{".":{},"f:lastTransitionTime":{},"f:lastUpdateTime":{},"f:message":{},"f:reason":{},"f:status":{},"f:type":{}},"k:{\"type\":\"Progressing\"}":{".":{},"f:lastTransitionTime":{},"f:lastUpdateTime":{},"f:message":{},"f:reason":{},"f:status":{},"f:type":{}}},"f:observedGeneration":{},"f:readyReplicas":{},"f:replicas":{},"f:updatedReplicas":{}}}"#,
            ),
            (
                "kubectl-client-side-apply create",
                r#"{"f:metadata":{"f:annotations":{".":{},"f:kubectl.kubernetes.io/last-applied-configuration":{}}},"f:spec":{"f:progressDeadlineSeconds":{},"f:replicas":{},"f:strategy":{"f:rollingUpdate":{".":{},"f:maxSurge":{},"f:maxUnavailable":{}},"f:type":{}},"f:template":{"f:spec":{"f:containers":{"k:{\"name\":\"nginx\"}":{".":{},"f:image":{},"f:ports":{".":{},"k:{\"containerPort\":80,\"protocol\":\"TCP\"}":{".":{},"f:containerPort":{},"f:protocol":{}}},"f:resources":{}}},"f:securityContext":{}}}}}"#,
            ),
            (
                "service ports sorted numerically",
                r#"{"f:spec":{"f:ports":{".":{},"k:{\"port\":80,\"protocol\":\"TCP\"}":{".":{},"f:port":{}},"k:{\"port\":443,\"protocol\":\"TCP\"}":{".":{},"f:port":{}}}}}"#,
            ),
            (
                "finalizers and owner references",
                r#"{"f:metadata":{"f:finalizers":{".":{},"v:\"kubernetes.io/pvc-protection\"":{}},"f:ownerReferences":{".":{},"k:{\"uid\":\"5b1f4c7e-0c5d-4c1e-9a7c-3f2d1e0b9a8c\"}":{}}}}"#,
            ),
            ("empty", "{}"),
        ];
        for (name, sample) in samples {
            let parsed: Value = serde_json::from_str(sample).unwrap();
            let set = FieldSet::from_fields_v1(&parsed).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(set.to_fields_v1().to_string(), sample, "{name}");
            assert_eq!(set.is_empty(), sample == "{}", "{name}");
        }
    }

    #[test]
    fn fields_v1_sorts_and_escapes_like_kube() {
        // Written out of order: kube's encoder sorts fields before keys, keys by value.
        let unsorted = json!({
            "k:{\"port\":443}": {},
            "k:{\"port\":80}": {},
            "f:b": {},
            "v:\"<x>\"": {},
            "f:a": {"f:z": {}, ".": {}}
        });
        let set = FieldSet::from_fields_v1(&unsorted).unwrap();
        assert_eq!(
            set.to_fields_v1().to_string(),
            r#"{"f:a":{".":{},"f:z":{}},"f:b":{},"k:{\"port\":80}":{},"k:{\"port\":443}":{},"v:\"\\u003cx\\u003e\"":{}}"#
        );
        assert!(set.has(&[PathElement::Field("a".into())]));
        assert!(set.has(&[
            PathElement::Field("a".into()),
            PathElement::Field("z".into())
        ]));
    }

    #[test]
    fn paths_list_members_before_children() {
        let set = FieldSet::from_fields_v1(&json!({
            "f:alpha": {".": {}, "f:x": {}},
            "f:zeta": {}
        }))
        .unwrap();
        let paths: Vec<String> = set.paths().iter().map(|p| path_string(p)).collect();
        assert_eq!(paths, [".alpha", ".zeta", ".alpha.x"]);
    }

    #[test]
    fn fields_v1_rejects_malformed_input() {
        let cases = [
            (json!([]), "fieldsV1 must be a JSON object"),
            (
                json!({"x:foo": {}}),
                "fieldsV1 key \"x:foo\": unknown prefix",
            ),
            (json!({"foo": {}}), "no f:, k:, v: or i: prefix"),
            (json!({"k:[1]": {}}), "key is not a JSON object"),
            (
                json!({"f:a": 1}),
                "fieldsV1 key \"f:a\": value must be an object",
            ),
            (json!({"i:x": {}}), "index is not a non-negative integer"),
        ];
        for (input, want) in cases {
            let err = FieldSet::from_fields_v1(&input).unwrap_err().to_string();
            assert!(err.contains(want), "{input}: {err}");
        }
    }

    #[test]
    fn of_object_matches_kubectl_apply() {
        let set = FieldSet::of_object(&deployment(3, "nginx:1.25"), &deployments());
        assert_eq!(set.to_fields_v1().to_string(), KUBECTL_APPLY);
    }

    #[test]
    fn apply_creates_with_one_apply_entry() {
        let schema = deployments();
        let out = apply(
            None,
            &deployment(3, "nginx:1.25"),
            false,
            &ctx("kubectl", T1, &schema),
        )
        .unwrap();
        let mut want = deployment(3, "nginx:1.25");
        want["metadata"]["managedFields"] = json!([{
            "manager": "kubectl",
            "operation": "Apply",
            "apiVersion": "apps/v1",
            "time": T1,
            "fieldsType": "FieldsV1",
            "fieldsV1": serde_json::from_str::<Value>(KUBECTL_APPLY).unwrap()
        }]);
        assert_eq!(out.to_string(), want.to_string());
    }

    #[test]
    fn reapplying_the_same_config_changes_nothing() {
        let schema = deployments();
        let config = deployment(3, "nginx:1.25");
        let first = apply(None, &config, false, &ctx("kubectl", T1, &schema)).unwrap();
        let second = apply(Some(&first), &config, false, &ctx("kubectl", T2, &schema)).unwrap();
        assert_eq!(second, first);
        // A change stamps the new time.
        let third = apply(
            Some(&second),
            &deployment(4, "nginx:1.25"),
            false,
            &ctx("kubectl", T2, &schema),
        )
        .unwrap();
        assert_eq!(third["spec"]["replicas"], 4);
        assert_eq!(third["metadata"]["managedFields"][0]["time"], T2);
    }

    /// A Deployment created by client-side `kubectl apply` (an Update), with replicas 2.
    fn created_client_side(schema: &PatchSchema) -> Value {
        let mut live = deployment(2, "nginx:1.25");
        live["spec"]["template"]["spec"]["containers"][0]["ports"][0]["protocol"] = json!("TCP");
        record_update(
            None,
            &mut live,
            &ctx("kubectl-client-side-apply", T1, schema),
        );
        live
    }

    #[test]
    fn update_on_create_records_new_maps_like_kube() {
        let schema = deployments();
        let live = created_client_side(&schema);
        assert_eq!(
            fields_of(&live, "kubectl-client-side-apply", "Update")
                .unwrap()
                .to_string(),
            r#"{"f:metadata":{"f:labels":{".":{},"f:app":{}}},"f:spec":{"f:replicas":{},"f:selector":{},"f:template":{"f:metadata":{"f:labels":{".":{},"f:app":{}}},"f:spec":{"f:containers":{"k:{\"name\":\"nginx\"}":{".":{},"f:image":{},"f:name":{},"f:ports":{".":{},"k:{\"containerPort\":80,\"protocol\":\"TCP\"}":{".":{},"f:containerPort":{},"f:protocol":{}}}}}}}}}"#
        );
    }

    #[test]
    fn apply_conflicts_name_the_other_manager_exactly() {
        let schema = deployments();
        let live = created_client_side(&schema);
        let cases = [
            (
                deployment(3, "nginx:1.25"),
                "Apply failed with 1 conflict: conflict with \"kubectl-client-side-apply\" using apps/v1: .spec.replicas",
            ),
            (
                deployment(3, "nginx:1.26"),
                "Apply failed with 2 conflicts: conflicts with \"kubectl-client-side-apply\" using apps/v1:\n- .spec.replicas\n- .spec.template.spec.containers[name=\"nginx\"].image",
            ),
        ];
        for (config, want) in cases {
            let err = apply(Some(&live), &config, false, &ctx("kubectl", T2, &schema)).unwrap_err();
            assert_eq!(err.to_string(), want);
            let ManagedError::Conflicts(conflicts) = err else {
                panic!("not a conflict: {err}");
            };
            assert_eq!(conflicts[0].manager, "kubectl-client-side-apply");
            assert_eq!(conflicts[0].api_version, "apps/v1");
            assert_eq!(conflicts[0].field, ".spec.replicas");
        }
    }

    #[test]
    fn conflict_message_names_apply_and_subresource_managers() {
        let conflict = |manager: &str, operation: &str, sub: Option<&str>, field: &str| Conflict {
            manager: manager.into(),
            api_version: "v1".into(),
            field: field.into(),
            operation: operation.into(),
            subresource: sub.map(Into::into),
        };
        let cases = [
            (
                vec![conflict("helm", "Apply", None, ".data.a")],
                "Apply failed with 1 conflict: conflict with \"helm\": .data.a",
            ),
            (
                vec![conflict(
                    "kubelet",
                    "Update",
                    Some("status"),
                    ".status.phase",
                )],
                "Apply failed with 1 conflict: conflict with \"kubelet\" with subresource \"status\" using v1: .status.phase",
            ),
            (
                vec![
                    conflict("zeta", "Apply", None, ".a"),
                    conflict("alpha", "Update", None, ".b"),
                    conflict("zeta", "Apply", None, ".c"),
                ],
                "Apply failed with 3 conflicts: conflicts with \"alpha\" using v1:\n- .b\nconflicts with \"zeta\":\n- .a\n- .c",
            ),
        ];
        for (conflicts, want) in cases {
            assert_eq!(ManagedError::Conflicts(conflicts).to_string(), want);
        }
    }

    #[test]
    fn force_takes_ownership_of_conflicting_fields() {
        let schema = deployments();
        let live = created_client_side(&schema);
        let out = apply(
            Some(&live),
            &deployment(3, "nginx:1.25"),
            true,
            &ctx("kubectl", T2, &schema),
        )
        .unwrap();
        assert_eq!(out["spec"]["replicas"], 3);
        let replicas = [
            PathElement::Field("spec".into()),
            PathElement::Field("replicas".into()),
        ];
        let csa = FieldSet::from_fields_v1(
            &fields_of(&out, "kubectl-client-side-apply", "Update").unwrap(),
        )
        .unwrap();
        let ssa = FieldSet::from_fields_v1(&fields_of(&out, "kubectl", "Apply").unwrap()).unwrap();
        assert!(!csa.has(&replicas), "old owner keeps .spec.replicas");
        assert!(ssa.has(&replicas));
        // Fields applied with the same value are shared, not taken.
        let image = [
            PathElement::Field("spec".into()),
            PathElement::Field("template".into()),
            PathElement::Field("spec".into()),
            PathElement::Field("containers".into()),
            PathElement::Key(vec![("name".into(), json!("nginx"))]),
            PathElement::Field("image".into()),
        ];
        assert!(csa.has(&image) && ssa.has(&image));
        // Now the applier owns replicas, re-applying without force works.
        apply(
            Some(&out),
            &deployment(3, "nginx:1.25"),
            false,
            &ctx("kubectl", T2, &schema),
        )
        .unwrap();
    }

    #[test]
    fn applying_the_same_value_shares_ownership() {
        let schema = deployments();
        let live = created_client_side(&schema);
        let out = apply(
            Some(&live),
            &deployment(2, "nginx:1.25"),
            false,
            &ctx("kubectl", T2, &schema),
        )
        .unwrap();
        assert_eq!(
            managers(&out),
            [
                ("kubectl".to_string(), "Apply".to_string()),
                (
                    "kubectl-client-side-apply".to_string(),
                    "Update".to_string()
                )
            ]
        );
        assert_eq!(without_managed_fields(&out), without_managed_fields(&live));
    }

    #[test]
    fn dropped_fields_are_removed_unless_someone_else_owns_them() {
        let schema = PatchSchema::builtin("", "ConfigMap");
        let cm = |data: Value| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": data});
        let v1 = |manager| ManagedContext {
            api_version: "v1",
            ..ctx(manager, T1, &schema)
        };
        // (other manager's action on key b, whether b survives kubectl dropping it)
        let cases = [
            ("nobody else", None, false),
            ("another applier with the same value", Some(true), true),
            ("an updater that changed it", Some(false), true),
        ];
        for (name, other, survives) in cases {
            let mut live = apply(
                None,
                &cm(json!({"a": "1", "b": "2"})),
                false,
                &v1("kubectl"),
            )
            .unwrap();
            match other {
                Some(true) => {
                    live = apply(Some(&live), &cm(json!({"b": "2"})), false, &v1("helm")).unwrap();
                }
                Some(false) => {
                    let mut new = live.clone();
                    new["data"]["b"] = json!("3");
                    record_update(Some(&live), &mut new, &v1("kubectl-edit"));
                    live = new;
                }
                None => {}
            }
            let out = apply(Some(&live), &cm(json!({"a": "1"})), false, &v1("kubectl")).unwrap();
            assert_eq!(out["data"].get("b").is_some(), survives, "{name}: {out}");
            assert_eq!(out["data"]["a"], "1", "{name}");
            assert_eq!(
                fields_of(&out, "kubectl", "Apply").unwrap(),
                json!({"f:data": {"f:a": {}}}),
                "{name}"
            );
        }
    }

    #[test]
    fn dropping_a_whole_struct_removes_it() {
        let schema = deployments();
        let mut config = deployment(3, "nginx:1.25");
        config["spec"]["strategy"] =
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}});
        let live = apply(None, &config, false, &ctx("kubectl", T1, &schema)).unwrap();
        assert_eq!(live["spec"]["strategy"]["rollingUpdate"]["maxSurge"], 1);
        let out = apply(
            Some(&live),
            &deployment(3, "nginx:1.25"),
            false,
            &ctx("kubectl", T2, &schema),
        )
        .unwrap();
        assert!(out["spec"].get("strategy").is_none(), "{}", out["spec"]);
        assert_eq!(out["metadata"]["name"], "nginx", "identity is never pruned");
    }

    fn with_containers(names: &[&str]) -> Value {
        let mut d = deployment(1, "unused");
        d["spec"]["template"]["spec"]["containers"] = names
            .iter()
            .map(|n| json!({"name": n, "image": format!("{n}:1"), "args": ["--v=2"]}))
            .collect();
        d
    }

    #[test]
    fn keyed_list_items_are_removed_when_no_field_stays_owned() {
        let schema = deployments();
        let containers = |obj: &Value| obj["spec"]["template"]["spec"]["containers"].clone();
        let live = apply(
            None,
            &with_containers(&["app", "sidecar"]),
            false,
            &ctx("kubectl", T1, &schema),
        )
        .unwrap();

        let out = apply(
            Some(&live),
            &with_containers(&["app"]),
            false,
            &ctx("kubectl", T2, &schema),
        )
        .unwrap();
        assert_eq!(
            containers(&out),
            json!([{"name": "app", "image": "app:1", "args": ["--v=2"]}])
        );

        // `kubectl set image` on the sidecar: the updater owns its image, so the item stays,
        // with only its key and the updater's field.
        let mut edited = live.clone();
        edited["spec"]["template"]["spec"]["containers"][1]["image"] = json!("sidecar:2");
        record_update(Some(&live), &mut edited, &ctx("kubectl-set", T2, &schema));
        let out = apply(
            Some(&edited),
            &with_containers(&["app"]),
            false,
            &ctx("kubectl", T2, &schema),
        )
        .unwrap();
        assert_eq!(
            containers(&out),
            json!([
                {"name": "app", "image": "app:1", "args": ["--v=2"]},
                {"name": "sidecar", "image": "sidecar:2"}
            ])
        );
    }

    #[test]
    fn keyed_list_merge_keeps_other_items_in_place() {
        let schema = deployments();
        let live = apply(
            None,
            &with_containers(&["a", "c"]),
            false,
            &ctx("other", T1, &schema),
        )
        .unwrap();
        let out = apply(
            Some(&live),
            &with_containers(&["a", "b"]),
            false,
            &ctx("kubectl", T2, &schema),
        )
        .unwrap();
        let names: Vec<&Value> = out["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| &c["name"])
            .collect();
        assert_eq!(names, [&json!("a"), &json!("c"), &json!("b")]);
    }

    #[test]
    fn set_lists_merge_as_a_union() {
        let schema = PatchSchema::builtin("", "ConfigMap");
        let v1 = |manager| ManagedContext {
            api_version: "v1",
            ..ctx(manager, T1, &schema)
        };
        let cm = |finalizers: Value| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "finalizers": finalizers}});
        let mut live = cm(json!(["example.com/x"]));
        record_update(None, &mut live, &v1("controller"));
        let out = apply(
            Some(&live),
            &cm(json!(["example.com/y"])),
            false,
            &v1("kubectl"),
        )
        .unwrap();
        assert_eq!(
            out["metadata"]["finalizers"],
            json!(["example.com/x", "example.com/y"])
        );
        assert_eq!(
            fields_of(&out, "kubectl", "Apply").unwrap(),
            json!({"f:metadata": {"f:finalizers": {"v:\"example.com/y\"": {}}}})
        );
        assert_eq!(
            fields_of(&out, "controller", "Update").unwrap(),
            json!({"f:metadata": {"f:finalizers": {".": {}, "v:\"example.com/x\"": {}}}})
        );
        let out = apply(Some(&out), &cm(json!([])), false, &v1("kubectl")).unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["example.com/x"]));
        assert_eq!(
            managers(&out),
            [("controller".to_string(), "Update".to_string())]
        );
    }

    #[test]
    fn update_takes_fields_from_an_applier() {
        let schema = deployments();
        let live = apply(
            None,
            &deployment(3, "nginx:1.25"),
            false,
            &ctx("kubectl", T1, &schema),
        )
        .unwrap();
        let mut scaled = live.clone();
        scaled["spec"]["replicas"] = json!(5);
        record_update(Some(&live), &mut scaled, &ctx("kubectl-scale", T2, &schema));
        assert_eq!(
            fields_of(&scaled, "kubectl-scale", "Update").unwrap(),
            json!({"f:spec": {"f:replicas": {}}})
        );
        let applied =
            FieldSet::from_fields_v1(&fields_of(&scaled, "kubectl", "Apply").unwrap()).unwrap();
        assert!(!applied.has(&[
            PathElement::Field("spec".into()),
            PathElement::Field("replicas".into())
        ]));
        assert_eq!(
            scaled["metadata"]["managedFields"][1],
            json!({"manager": "kubectl-scale", "operation": "Update", "apiVersion": "apps/v1",
                   "time": T2, "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:replicas": {}}}})
        );
        // The applier now conflicts with the updater.
        let err = apply(
            Some(&scaled),
            &deployment(3, "nginx:1.25"),
            false,
            &ctx("kubectl", T2, &schema),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "Apply failed with 1 conflict: conflict with \"kubectl-scale\" using apps/v1: .spec.replicas"
        );
        // An update that changes nothing records nothing and keeps the entry's time.
        let mut same = scaled.clone();
        record_update(
            Some(&scaled),
            &mut same,
            &ctx("kubectl-scale", "2026-01-02T00:00:00Z", &schema),
        );
        assert_eq!(same, scaled);
    }

    #[test]
    fn update_entries_are_capped_into_ancient_changes() {
        let schema = PatchSchema::builtin("", "ConfigMap");
        let mut live = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {}});
        let mut times = Vec::new();
        for i in 0..12 {
            let (manager, time) = (
                format!("writer-{i:02}"),
                format!("2026-01-01T10:{i:02}:00Z"),
            );
            let mut new = live.clone();
            new["data"][format!("k{i}")] = json!("v");
            let c = ManagedContext {
                api_version: "v1",
                ..ctx(&manager, &time, &schema)
            };
            record_update(Some(&live), &mut new, &c);
            live = new;
            times.push(time);
        }
        let entries = live["metadata"]["managedFields"].as_array().unwrap();
        assert_eq!(entries.len(), MAX_UPDATE_MANAGERS);
        // The three oldest writers became one bucket stamped with the newest of them.
        assert_eq!(entries[0]["manager"], "ancient-changes");
        assert_eq!(entries[0]["time"], times[2].as_str());
        assert_eq!(
            entries[0]["fieldsV1"],
            json!({"f:data": {"f:k0": {}, "f:k1": {}, "f:k2": {}}})
        );
        assert_eq!(entries[1]["manager"], "writer-03");
        assert_eq!(entries[9]["manager"], "writer-11");
    }

    #[test]
    fn update_keeps_stored_managed_fields_unless_the_client_resets_them() {
        let schema = deployments();
        let live = apply(
            None,
            &deployment(3, "nginx:1.25"),
            false,
            &ctx("kubectl", T1, &schema),
        )
        .unwrap();
        let changed = |managed: Option<Value>| {
            let mut new = live.clone();
            new["spec"]["replicas"] = json!(4);
            let meta = new["metadata"].as_object_mut().unwrap();
            match managed {
                Some(m) => meta.insert("managedFields".into(), m),
                None => meta.shift_remove("managedFields"),
            };
            record_update(Some(&live), &mut new, &ctx("editor", T2, &schema));
            managers(&new)
        };
        let both = vec![
            ("kubectl".to_string(), "Apply".to_string()),
            ("editor".to_string(), "Update".to_string()),
        ];
        assert_eq!(
            changed(None),
            both,
            "omitted managedFields keep the stored ones"
        );
        assert_eq!(
            changed(Some(json!([]))),
            both,
            "an empty list keeps the stored ones"
        );
        assert_eq!(
            changed(Some(json!([{}]))),
            [("editor".to_string(), "Update".to_string())]
        );
    }

    #[test]
    fn status_is_not_owned_through_the_main_resource() {
        let schema = deployments();
        let mut config = deployment(3, "nginx:1.25");
        config["status"] = json!({"replicas": 99});
        let created = apply(None, &config, false, &ctx("kubectl", T1, &schema)).unwrap();
        assert!(created.get("status").is_none());
        assert_eq!(
            fields_of(&created, "kubectl", "Apply").unwrap().to_string(),
            KUBECTL_APPLY
        );

        // The controller writes status through /status.
        let status_ctx = ManagedContext {
            subresource: Some("status"),
            ignored: &["apiVersion", "kind", "metadata", "spec"],
            ..ctx("kube-controller-manager", T2, &schema)
        };
        let mut with_status = created.clone();
        with_status["status"] =
            json!({"replicas": 3, "conditions": [{"type": "Available", "status": "True"}]});
        with_status["spec"]["replicas"] = json!(7); // ignored by /status: not recorded
        record_update(Some(&created), &mut with_status, &status_ctx);
        let entry = with_status["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["manager"] == "kube-controller-manager")
            .unwrap()
            .clone();
        assert_eq!(entry["subresource"], "status");
        assert_eq!(
            entry["fieldsV1"].to_string(),
            r#"{"f:status":{"f:conditions":{".":{},"k:{\"type\":\"Available\"}":{".":{},"f:status":{},"f:type":{}}},"f:replicas":{}}}"#
        );
        with_status["spec"]["replicas"] = json!(3);

        // Applying status through the main resource leaves it alone and conflicts with no one.
        let out = apply(
            Some(&with_status),
            &config,
            false,
            &ctx("kubectl", T2, &schema),
        )
        .unwrap();
        assert_eq!(out["status"]["replicas"], 3);
        // And a main-resource update that touches only status records nothing.
        let mut new = out.clone();
        new["status"]["replicas"] = json!(1);
        record_update(Some(&out), &mut new, &ctx("someone", T2, &schema));
        assert!(fields_of(&new, "someone", "Update").is_none());
    }

    #[test]
    fn status_apply_touches_only_status() {
        let schema = deployments();
        let live = apply(
            None,
            &deployment(3, "nginx:1.25"),
            false,
            &ctx("kubectl", T1, &schema),
        )
        .unwrap();
        let status_ctx = ManagedContext {
            subresource: Some("status"),
            ignored: &["apiVersion", "kind", "metadata", "spec"],
            ..ctx("my-controller", T2, &schema)
        };
        let mut config = deployment(9, "evil:1");
        config["metadata"]["labels"]["extra"] = json!("x");
        config["status"] = json!({"readyReplicas": 3});
        let out = apply(Some(&live), &config, false, &status_ctx).unwrap();
        assert_eq!(out["spec"], live["spec"]);
        assert_eq!(out["metadata"]["labels"], live["metadata"]["labels"]);
        assert_eq!(out["status"], json!({"readyReplicas": 3}));
        let entry = out["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["manager"] == "my-controller")
            .unwrap();
        assert_eq!(entry["subresource"], "status");
        assert_eq!(entry["operation"], "Apply");
        assert_eq!(
            entry["fieldsV1"],
            json!({"f:status": {"f:readyReplicas": {}}})
        );
    }

    #[test]
    fn null_in_a_config_removes_the_field() {
        let schema = PatchSchema::builtin("", "ConfigMap");
        let c = ManagedContext {
            api_version: "v1",
            ..ctx("kubectl", T1, &schema)
        };
        let cm = |data: Value| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": data});
        let live = apply(None, &cm(json!({"a": "1", "b": "2"})), false, &c).unwrap();
        let out = apply(Some(&live), &cm(json!({"a": null, "b": "2"})), false, &c).unwrap();
        assert_eq!(out["data"], json!({"b": "2"}));
    }

    #[test]
    fn objects_without_managed_fields_get_a_before_first_apply_owner() {
        let schema = deployments();
        let live = deployment(2, "nginx:1.25");
        let err = apply(
            Some(&live),
            &deployment(3, "nginx:1.25"),
            false,
            &ctx("kubectl", T1, &schema),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "Apply failed with 1 conflict: conflict with \"before-first-apply\" using apps/v1: .spec.replicas"
        );
    }

    #[test]
    fn service_port_keys_default_the_protocol() {
        let schema = PatchSchema::builtin("", "Service");
        let v1 = ManagedContext {
            api_version: "v1",
            ..ctx("kubectl", T1, &schema)
        };
        let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
                         "spec": {"ports": [{"port": 80}, {"port": 443, "protocol": "TCP"}]}});
        let out = apply(None, &svc, false, &v1).unwrap();
        assert_eq!(
            fields_of(&out, "kubectl", "Apply").unwrap().to_string(),
            r#"{"f:spec":{"f:ports":{"k:{\"port\":80,\"protocol\":\"TCP\"}":{".":{},"f:port":{}},"k:{\"port\":443,\"protocol\":\"TCP\"}":{".":{},"f:port":{},"f:protocol":{}}}}}"#
        );
        assert_eq!(apply(Some(&out), &svc, false, &v1).unwrap(), out);
    }

    #[test]
    fn invalid_configurations_are_rejected() {
        let schema = deployments();
        let c = ctx("kubectl", T1, &schema);
        let mut no_name = deployment(1, "x");
        no_name["spec"]["template"]["spec"]["containers"][0]
            .as_object_mut()
            .unwrap()
            .shift_remove("name");
        let mut duplicate = deployment(1, "x");
        duplicate["spec"]["template"]["spec"]["containers"] = json!([{"name": "a"}, {"name": "a"}]);
        let mut managed = deployment(1, "x");
        managed["metadata"]["managedFields"] = json!([]);
        let cases = [
            (json!("text"), "apply configuration must be a JSON object"),
            (managed, "metadata.managedFields must be nil"),
            (no_name, "omits key field \"name\""),
            (
                duplicate,
                ".spec.template.spec.containers: duplicate entries for key [name=\"a\"]",
            ),
        ];
        for (config, want) in cases {
            let err = apply(None, &config, false, &c).unwrap_err();
            assert!(matches!(err, ManagedError::Invalid(_)), "{err}");
            assert!(err.to_string().contains(want), "{err}");
        }
        let mut bad_live = deployment(1, "x");
        bad_live["metadata"]["managedFields"] = json!([{"manager": "m", "operation": "Bogus", "apiVersion": "v1", "fieldsType": "FieldsV1"}]);
        let err = apply(Some(&bad_live), &deployment(1, "x"), false, &c).unwrap_err();
        assert_eq!(
            err.to_string(),
            "metadata.managedFields[0]: operation must be `Apply` or `Update`, got \"Bogus\""
        );
    }
}
