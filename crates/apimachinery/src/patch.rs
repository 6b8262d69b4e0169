//! JSON patch (RFC 6902), JSON merge patch (RFC 7386) and strategic merge patch.
//!
//! The three `PATCH` content types kube-apiserver accepts, as pure functions from the stored
//! object and the request body to the patched object. Strategic merge patch follows
//! `k8s.io/apimachinery/pkg/util/strategicpatch` as the server runs it (`StrategicMergeMapPatch`),
//! including the list order it produces and the `$setElementOrder`, `$deleteFromPrimitiveList`,
//! `$retainKeys` and `$patch` directives that `kubectl apply` and `kubectl patch` send.
//!
//! Strategic merge patch is written by hand: no Rust crate implements it, and its list
//! ordering rules are specific to kube-apiserver.

use std::collections::HashSet;
use std::fmt;

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::patchmeta::{ListType, PatchSchema};

/// kube-apiserver refuses JSON patches with more operations than this (`maxJSONPatchOperations`).
pub const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;

const PATCH: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const SET_ELEMENT_ORDER: &str = "$setElementOrder";
const DELETE_FROM_PRIMITIVE_LIST: &str = "$deleteFromPrimitiveList";

/// Why a patch could not be applied (messages as kube-apiserver words them where possible).
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// The body of a JSON patch is not a list of RFC 6902 operations.
    #[error("invalid JSON patch: {0}")]
    InvalidJsonPatch(String),
    /// A JSON patch longer than kube-apiserver allows.
    #[error("the allowed maximum operations in a JSON patch is {max}, got {got}")]
    TooManyOperations {
        /// The limit.
        max: usize,
        /// Operations in the patch.
        got: usize,
    },
    /// A JSON patch `test` operation found a different value.
    #[error("JSON patch operation {index} (test) failed: the value at {path:?} is not {expected}")]
    TestFailed {
        /// Position of the operation in the patch, from 0.
        index: usize,
        /// The JSON pointer tested.
        path: String,
        /// The value the operation expected.
        expected: Value,
    },
    /// A JSON patch operation names a path the document does not have.
    #[error("JSON patch operation {index} ({op} {path:?}) does not apply: {reason}")]
    OperationFailed {
        /// Position of the operation in the patch, from 0.
        index: usize,
        /// `add`, `remove`, `replace`, `move` or `copy`.
        op: &'static str,
        /// The operation's `path`.
        path: String,
        /// What was wrong with it.
        reason: String,
    },
    /// A merge or strategic merge patch, or the document it applies to, is not a JSON object.
    #[error("{what} must be a JSON object, got {got}")]
    NotAnObject {
        /// Which input: "merge patch", "strategic merge patch" or "document".
        what: &'static str,
        /// The JSON type found.
        got: &'static str,
    },
    /// A `$`-prefixed key that strategic merge patch does not define.
    #[error("unknown patch directive {key:?} at {at}")]
    UnknownDirective {
        /// Where in the object (dotted field path).
        at: String,
        /// The key.
        key: String,
    },
    /// A `$patch` value other than `replace`, `delete` or `merge`.
    #[error("unknown patch type: {value} in map at {at}")]
    UnknownPatchType {
        /// Where in the object.
        at: String,
        /// The `$patch` value, as JSON.
        value: String,
    },
    /// An item of a list merged by key lacks the key.
    #[error("map: {item} at {at} does not contain declared merge key: {key}")]
    NoMergeKey {
        /// Where in the object.
        at: String,
        /// The item, as JSON.
        item: String,
        /// The merge key.
        key: String,
    },
    /// A value of the wrong JSON type where strategic merge patch needs a specific one.
    #[error("{at}: expected {expected}, but received {got}")]
    WrongType {
        /// Where in the object.
        at: String,
        /// What was needed.
        expected: &'static str,
        /// The JSON type found.
        got: &'static str,
    },
    /// A malformed `$setElementOrder`, `$deleteFromPrimitiveList` or `$retainKeys` directive.
    #[error("invalid patch format of {directive} at {at}: {reason}")]
    BadDirective {
        /// Where in the object.
        at: String,
        /// The directive's name.
        directive: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A list item that is itself a list.
    #[error("{at}: lists of lists are not supported")]
    ListOfLists {
        /// Where in the object.
        at: String,
    },
}

impl PatchError {
    /// The HTTP status kube-apiserver answers with: 422 when a well-formed JSON patch does not
    /// apply to the object, 400 when the patch itself is malformed.
    pub fn http_status(&self) -> u16 {
        match self {
            PatchError::TestFailed { .. } | PatchError::OperationFailed { .. } => 422,
            _ => 400,
        }
    }
}

/// RFC 6902 JSON patch (use the `json-patch` crate, already a dependency).
pub fn json_patch(doc: &Value, patch: &Value) -> Result<Value, PatchError> {
    let ops = patch.as_array().ok_or_else(|| {
        PatchError::InvalidJsonPatch(format!(
            "expected a list of operations, got {}",
            type_name(patch)
        ))
    })?;
    if ops.len() > MAX_JSON_PATCH_OPERATIONS {
        return Err(PatchError::TooManyOperations {
            max: MAX_JSON_PATCH_OPERATIONS,
            got: ops.len(),
        });
    }
    // As kube-apiserver's JSON patch library does, a `test` of null passes on an absent
    // member (kube-rs' finalizer helper relies on it to add the first finalizer). Such ops
    // are dropped once the document before them is known not to have the member. Patches
    // without a null test (webhooks' patches: one per pod created) skip that tracking pass.
    let null_test = |op: &Value| op["op"] == "test" && op.get("value").is_some_and(Value::is_null);
    // Where each applied operation stands in the patch as sent (errors name that index).
    let mut origin: Vec<usize> = Vec::new();
    let parsed: json_patch::Patch = if ops.iter().any(null_test) {
        let mut kept = Vec::with_capacity(ops.len());
        let mut current = doc.clone();
        for (index, op) in ops.iter().enumerate() {
            let absent = op["path"]
                .as_str()
                .is_some_and(|p| current.pointer(p).is_none());
            if null_test(op) && absent {
                continue;
            }
            // Track the document as the ops before the next test leave it; errors are
            // reported by the real application below.
            if let Ok(single) = json_patch::Patch::deserialize(&Value::Array(vec![op.clone()])) {
                let _ = json_patch::patch(&mut current, &single.0);
            }
            kept.push(op.clone());
            origin.push(index);
        }
        serde_json::from_value(Value::Array(kept))
    } else {
        json_patch::Patch::deserialize(patch)
    }
    .map_err(|e| PatchError::InvalidJsonPatch(e.to_string()))?;
    let mut out = doc.clone();
    json_patch::patch(&mut out, &parsed.0).map_err(|e| {
        let op = &parsed.0[e.operation];
        let index = origin.get(e.operation).copied().unwrap_or(e.operation);
        let path = e.path.to_string();
        match (&e.kind, op) {
            (json_patch::PatchErrorKind::TestFailed, json_patch::PatchOperation::Test(t)) => {
                PatchError::TestFailed {
                    index,
                    path,
                    expected: t.value.clone(),
                }
            }
            (kind, op) => PatchError::OperationFailed {
                index,
                op: op_name(op),
                path,
                reason: match kind {
                    json_patch::PatchErrorKind::InvalidPointer => {
                        "the path does not exist in the object".to_string()
                    }
                    json_patch::PatchErrorKind::InvalidFromPointer => {
                        "the \"from\" path does not exist in the object".to_string()
                    }
                    other => other.to_string(),
                },
            },
        }
    })?;
    Ok(out)
}

fn op_name(op: &json_patch::PatchOperation) -> &'static str {
    match op {
        json_patch::PatchOperation::Add(_) => "add",
        json_patch::PatchOperation::Remove(_) => "remove",
        json_patch::PatchOperation::Replace(_) => "replace",
        json_patch::PatchOperation::Move(_) => "move",
        json_patch::PatchOperation::Copy(_) => "copy",
        json_patch::PatchOperation::Test(_) => "test",
    }
}

/// RFC 7386 JSON merge patch. Like kube-apiserver, refuses a patch that is not an object
/// (RFC 7386 would let it replace the whole document).
pub fn merge_patch(doc: &Value, patch: &Value) -> Result<Value, PatchError> {
    if !patch.is_object() {
        return Err(PatchError::NotAnObject {
            what: "merge patch",
            got: type_name(patch),
        });
    }
    let mut out = doc.clone();
    merge_into(&mut out, patch);
    Ok(out)
}

/// RFC 7386 `MergePatch`. Written out rather than `json_patch::merge` because that removes
/// keys with `swap_remove`, which reorders the object's fields as `kubectl get -o yaml` shows them.
fn merge_into(doc: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *doc = patch.clone();
        return;
    };
    if !doc.is_object() {
        *doc = Value::Object(Map::new());
    }
    if let Value::Object(doc) = doc {
        for (key, value) in patch {
            if value.is_null() {
                doc.shift_remove(key);
            } else {
                merge_into(doc.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

/// Kubernetes strategic merge patch, as kube-apiserver applies it to a stored object.
///
/// kube-apiserver accepts this patch type for built-in kinds only; for custom resources it
/// answers 415 Unsupported Media Type, and callers serving the API should do the same.
///
/// Deliberate differences from kube-apiserver, all where its result depends on Go decoding
/// the output into a typed object: directives and `null`s inside values that are new to the
/// object are processed rather than copied through; `$patch: merge` is accepted (kube rejects
/// it) and means the default merge; `{"$patch": "replace"}` also works in a list of primitives;
/// `$deleteFromPrimitiveList` on a missing list is a no-op (kube creates the list).
pub fn strategic_merge_patch(
    doc: &Value,
    patch: &Value,
    schema: &PatchSchema,
) -> Result<Value, PatchError> {
    let patch = patch.as_object().ok_or(PatchError::NotAnObject {
        what: "strategic merge patch",
        got: type_name(patch),
    })?;
    let doc = doc.as_object().ok_or(PatchError::NotAnObject {
        what: "document",
        got: type_name(doc),
    })?;
    let merged = StrategicMerge { schema }.merge_map(Some(doc.clone()), patch, &Loc::default())?;
    Ok(Value::Object(merged))
}

/// Where the merge is in the object: field names for the schema (list items skipped) and a
/// readable path for errors.
#[derive(Clone, Debug, Default)]
struct Loc {
    fields: Vec<String>,
    shown: String,
}

impl Loc {
    fn field(&self, name: &str) -> Loc {
        let mut fields = self.fields.clone();
        fields.push(name.to_string());
        let shown = if self.shown.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.shown)
        };
        Loc { fields, shown }
    }

    fn item(&self, label: impl fmt::Display) -> Loc {
        Loc {
            fields: self.fields.clone(),
            shown: format!("{}[{label}]", self.shown),
        }
    }

    fn path(&self) -> Vec<&str> {
        self.fields.iter().map(String::as_str).collect()
    }
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.shown.is_empty() {
            f.write_str("the object root")
        } else {
            f.write_str(&self.shown)
        }
    }
}

/// One strategic merge, with the merge rules of the object's kind.
struct StrategicMerge<'s> {
    schema: &'s PatchSchema,
}

impl StrategicMerge<'_> {
    /// Merges `patch` into `original` (`None` when the field is absent), as Go's `mergeMap`.
    fn merge_map(
        &self,
        original: Option<Map<String, Value>>,
        patch: &Map<String, Value>,
        at: &Loc,
    ) -> Result<Map<String, Value>, PatchError> {
        let mut without_directive;
        let mut patch = patch;
        if let Some(directive) = patch.get(PATCH) {
            without_directive = patch.clone();
            without_directive.shift_remove(PATCH);
            match directive.as_str() {
                // The patch's own content, with its directives resolved, replaces the map.
                Some("replace") => return self.merge_map(None, &without_directive, at),
                // kube-apiserver leaves an empty map, not an absent field.
                Some("delete") => return Ok(Map::new()),
                Some("merge") => patch = &without_directive,
                _ => {
                    return Err(PatchError::UnknownPatchType {
                        at: at.to_string(),
                        value: directive.to_string(),
                    });
                }
            }
        }
        let mut original = original.unwrap_or_default();

        if let Some(retain) = patch.get(RETAIN_KEYS) {
            apply_retain_keys(&mut original, patch, retain, at)?;
        }

        // `$setElementOrder` lists go first: they merge their list and order it in one step.
        let mut ordered = HashSet::new();
        for (key, order) in patch {
            if let Some(field) = directive_field(key, SET_ELEMENT_ORDER, at)?
                && self.apply_element_order(&mut original, patch, field, order, at)?
            {
                ordered.insert(field);
            }
        }

        let mut deletions = Vec::new();
        for (key, value) in patch {
            if key == RETAIN_KEYS || directive_field(key, SET_ELEMENT_ORDER, at)?.is_some() {
                continue;
            }
            if let Some(field) = directive_field(key, DELETE_FROM_PRIMITIVE_LIST, at)? {
                deletions.push((field, value));
                continue;
            }
            if key.starts_with('$') {
                return Err(PatchError::UnknownDirective {
                    at: at.to_string(),
                    key: key.clone(),
                });
            }
            if ordered.contains(key.as_str()) {
                continue;
            }
            if value.is_null() {
                original.shift_remove(key);
                continue;
            }
            let loc = at.field(key);
            match original.get_mut(key) {
                Some(slot) => {
                    let current = std::mem::take(slot);
                    *slot = self.merge_value(current, value, &loc)?;
                }
                None => {
                    let fresh = self.fresh(value, &loc)?;
                    original.insert(key.clone(), fresh);
                }
            }
        }

        // Deletions after additions, so one patch can both add to and delete from a list
        // without depending on key order (Go iterates its map in random order).
        for (field, value) in deletions {
            let loc = at.field(field);
            let remove = value.as_array().ok_or_else(|| PatchError::BadDirective {
                at: loc.to_string(),
                directive: DELETE_FROM_PRIMITIVE_LIST,
                reason: format!("expected a list, got {}", type_name(value)),
            })?;
            if let Some(Value::Array(items)) = original.get_mut(field) {
                items.retain(|item| !remove.iter().any(|r| same(item, r)));
            }
        }
        Ok(original)
    }

    fn merge_value(&self, current: Value, patch: &Value, at: &Loc) -> Result<Value, PatchError> {
        match (current, patch) {
            (Value::Object(current), Value::Object(patch))
                if !self.schema.is_atomic_map(&at.path()) =>
            {
                Ok(Value::Object(self.merge_map(Some(current), patch, at)?))
            }
            (Value::Array(current), Value::Array(patch)) => {
                Ok(Value::Array(self.merge_list(current, patch, at)?))
            }
            // Scalars, type changes and atomic maps: the patch value replaces.
            _ => self.fresh(patch, at),
        }
    }

    /// A patch value for a field the object does not have, with its directives resolved.
    fn fresh(&self, patch: &Value, at: &Loc) -> Result<Value, PatchError> {
        match patch {
            Value::Object(patch) => Ok(Value::Object(self.merge_map(None, patch, at)?)),
            Value::Array(patch) => Ok(Value::Array(self.merge_list(Vec::new(), patch, at)?)),
            scalar => Ok(scalar.clone()),
        }
    }

    /// Merges two lists as Go's `mergeSliceHandler`: atomic lists are replaced, others merged
    /// by key (lists of maps) or as a set (lists of primitives).
    fn merge_list(
        &self,
        original: Vec<Value>,
        patch: &[Value],
        at: &Loc,
    ) -> Result<Vec<Value>, PatchError> {
        let list_type = self.schema.list_type(&at.path());
        if list_type == ListType::Atomic {
            return patch
                .iter()
                .enumerate()
                .map(|(i, item)| self.fresh(item, &at.item(i)))
                .collect();
        }
        if original.iter().chain(patch).any(Value::is_array) {
            return Err(PatchError::ListOfLists { at: at.to_string() });
        }
        let has_maps = original.iter().chain(patch).any(Value::is_object);
        match list_type.merge_key() {
            Some(key) if has_maps => self.merge_keyed(original, patch, key, at),
            _ => merge_primitives(original, patch, at),
        }
    }

    /// Merges a list of maps on `key`, as Go's `mergeSlice` for maps.
    fn merge_keyed(
        &self,
        mut original: Vec<Value>,
        patch: &[Value],
        key: &str,
        at: &Loc,
    ) -> Result<Vec<Value>, PatchError> {
        for (i, item) in original.iter().enumerate() {
            expect_map(item, &at.item(i))?;
        }
        let mut plain = Vec::with_capacity(patch.len());
        let mut replace = false;
        for (i, item) in patch.iter().enumerate() {
            let map = expect_map(item, &at.item(i))?;
            let Some(directive) = map.get(PATCH) else {
                plain.push(map);
                continue;
            };
            match directive.as_str() {
                Some("delete") => {
                    let value = merge_key_of(map, key, &at.item(i))?;
                    original.retain(|o| !o.get(key).is_some_and(|v| same(v, value)));
                }
                // Replaces the whole list with the other items of the patch.
                Some("replace") => replace = true,
                // With its key, an item asking to be merged; alone, a marker for the default.
                Some("merge") if map.contains_key(key) => plain.push(map),
                Some("merge") => {}
                _ => {
                    return Err(PatchError::UnknownPatchType {
                        at: at.item(i).to_string(),
                        value: directive.to_string(),
                    });
                }
            }
        }
        if replace {
            return plain
                .iter()
                .enumerate()
                .map(|(i, item)| Ok(Value::Object(self.merge_map(None, item, &at.item(i))?)))
                .collect();
        }

        // The live order, after deletions: the reference for interleaving.
        let live: Vec<Value> = original
            .iter()
            .map(|o| o.get(key).cloned().unwrap_or(Value::Null))
            .collect();
        let mut patch_keys = Vec::with_capacity(plain.len());
        for (i, item) in plain.iter().enumerate() {
            let value = merge_key_of(item, key, &at.item(i))?;
            patch_keys.push(value.clone());
            let loc = at.item(format_args!("{key}={value}"));
            match original
                .iter()
                .position(|o| o.get(key).is_some_and(|v| same(v, value)))
            {
                Some(pos) => {
                    let current = match std::mem::take(&mut original[pos]) {
                        Value::Object(map) => map,
                        _ => Map::new(),
                    };
                    original[pos] = Value::Object(self.merge_map(Some(current), item, &loc)?);
                }
                None => original.push(Value::Object(self.merge_map(None, item, &loc)?)),
            }
        }

        let id = |item: &Value| -> Result<Value, PatchError> {
            let map = expect_map(item, at)?;
            Ok(merge_key_of(map, key, at)?.clone())
        };
        let mut from_patch = Vec::new();
        let mut server_only = Vec::new();
        for item in original {
            if index_of(&patch_keys, &id(&item)?).is_some() {
                from_patch.push(item);
            } else {
                server_only.push(item);
            }
        }
        from_patch.sort_by_cached_key(|item| {
            id(item)
                .ok()
                .and_then(|v| index_of(&patch_keys, &v))
                .unwrap_or(usize::MAX)
        });
        interleave(server_only, from_patch, &live, id)
    }

    /// Applies `$setElementOrder/<field>`: merges the field's list (if the patch has it) and
    /// orders the result as Go's `mergePatchIntoOriginal`. Returns whether it handled the field.
    fn apply_element_order(
        &self,
        original: &mut Map<String, Value>,
        patch: &Map<String, Value>,
        field: &str,
        order: &Value,
        at: &Loc,
    ) -> Result<bool, PatchError> {
        let loc = at.field(field);
        let bad = |reason: String| PatchError::BadDirective {
            at: loc.to_string(),
            directive: SET_ELEMENT_ORDER,
            reason,
        };
        let order = order
            .as_array()
            .ok_or_else(|| bad(format!("expected a list, got {}", type_name(order))))?;
        let live = match original.get(field) {
            None | Some(Value::Null) => None,
            Some(Value::Array(items)) => Some(items),
            Some(other) => {
                return Err(PatchError::WrongType {
                    at: loc.to_string(),
                    expected: "a list",
                    got: type_name(other),
                });
            }
        };
        let patch_list = match patch.get(field) {
            None => None,
            Some(Value::Array(items)) => Some(items),
            // Deleting or replacing the list by a non-list: nothing to order.
            Some(_) => return Ok(false),
        };
        let key = self
            .schema
            .list_type(&loc.path())
            .merge_key()
            .map(str::to_string);
        let id = |item: &Value| -> Result<Value, PatchError> {
            match &key {
                Some(key) if item.is_object() => {
                    Ok(merge_key_of(expect_map(item, &loc)?, key, &loc)?.clone())
                }
                _ => Ok(item.clone()),
            }
        };

        if let Some(patch_list) = patch_list {
            // Every item of the patch list must appear in the order list, in the same order.
            let mut next = 0;
            for item in patch_list {
                let directive = item.get(PATCH);
                if directive.is_some() {
                    continue;
                }
                let wanted = id(item)?;
                while next < order.len() && !same(&id(&order[next])?, &wanted) {
                    next += 1;
                }
                if next == order.len() && !order.is_empty() {
                    return Err(bad(format!(
                        "the order in patch list {} doesn't match $setElementOrder list {}",
                        Value::Array(patch_list.clone()),
                        Value::Array(order.clone())
                    )));
                }
                next += 1;
            }
        }

        let live_items = live.cloned().unwrap_or_default();
        let live_ids = live_items.iter().map(&id).collect::<Result<Vec<_>, _>>()?;
        let merged = match patch_list {
            Some(patch_list) => self.merge_list(live_items, patch_list, &loc)?,
            None if live.is_some() => live_items,
            None => return Ok(true),
        };
        let order_ids = order.iter().map(&id).collect::<Result<Vec<_>, _>>()?;
        let mut in_order = Vec::new();
        let mut server_only = Vec::new();
        for item in merged {
            if index_of(&order_ids, &id(&item)?).is_some() {
                in_order.push(item);
            } else {
                server_only.push(item);
            }
        }
        let position = |ids: &[Value], item: &Value| {
            id(item)
                .ok()
                .and_then(|v| index_of(ids, &v))
                .unwrap_or(usize::MAX)
        };
        in_order.sort_by_cached_key(|item| position(&order_ids, item));
        server_only.sort_by_cached_key(|item| position(&live_ids, item));
        let result = interleave(server_only, in_order, &live_ids, id)?;
        original.insert(field.to_string(), Value::Array(result));
        Ok(true)
    }
}

/// Merges lists of primitives as a set, as Go's `mergeSlice` for scalars.
fn merge_primitives(
    original: Vec<Value>,
    patch: &[Value],
    at: &Loc,
) -> Result<Vec<Value>, PatchError> {
    let mut values = Vec::with_capacity(patch.len());
    let mut replace = false;
    for (i, item) in patch.iter().enumerate() {
        let Value::Object(map) = item else {
            values.push(item.clone());
            continue;
        };
        let loc = at.item(i);
        match map.get(PATCH).and_then(Value::as_str) {
            Some("replace") if map.len() == 1 => replace = true,
            Some("merge") if map.len() == 1 => {}
            Some(_) if map.len() == 1 => {
                return Err(PatchError::UnknownPatchType {
                    at: loc.to_string(),
                    value: map[PATCH].to_string(),
                });
            }
            _ => {
                return Err(PatchError::WrongType {
                    at: loc.to_string(),
                    expected: "a primitive value (the list has no merge key)",
                    got: "an object",
                });
            }
        }
    }
    if let Some((i, item)) = original.iter().enumerate().find(|(_, v)| v.is_object()) {
        return Err(PatchError::WrongType {
            at: at.item(i).to_string(),
            expected: "a primitive value (the list has no merge key)",
            got: type_name(item),
        });
    }
    let values = dedup(values);
    if replace {
        return Ok(values);
    }
    let server_only: Vec<Value> = dedup(original.clone())
        .into_iter()
        .filter(|v| index_of(&values, v).is_none())
        .collect();
    interleave(server_only, values, &original, |v| Ok(v.clone()))
}

/// Interleaves server-only items with patch items as Go's `mergeSortedSlice`: each keeps its
/// own order, and a server-only item goes before a patch item only when both are in the live
/// list and it comes first there. So new patch items land before the server-only items that
/// follow them, which is why a strategic patch adding a container puts it first.
fn interleave(
    server_only: Vec<Value>,
    from_patch: Vec<Value>,
    live: &[Value],
    id: impl Fn(&Value) -> Result<Value, PatchError>,
) -> Result<Vec<Value>, PatchError> {
    let mut out = Vec::with_capacity(server_only.len() + from_patch.len());
    let mut left = server_only.into_iter().peekable();
    let mut right = from_patch.into_iter().peekable();
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(l), Some(r)) => match (index_of(live, &id(l)?), index_of(live, &id(r)?)) {
                (Some(li), Some(ri)) => li < ri,
                _ => false,
            },
        };
        out.extend(if take_left { left.next() } else { right.next() });
    }
    Ok(out)
}

/// Applies `$retainKeys`: every field the patch sets must be listed, and the original keeps
/// only the listed fields (Go's `applyRetainKeysDirective`).
fn apply_retain_keys(
    original: &mut Map<String, Value>,
    patch: &Map<String, Value>,
    retain: &Value,
    at: &Loc,
) -> Result<(), PatchError> {
    let bad = |reason: String| PatchError::BadDirective {
        at: at.to_string(),
        directive: RETAIN_KEYS,
        reason,
    };
    let keys = retain
        .as_array()
        .ok_or_else(|| bad(format!("expected a list, got {}", type_name(retain))))?
        .iter()
        .map(|k| {
            k.as_str()
                .ok_or_else(|| bad(format!("expected field names, got {k}")))
        })
        .collect::<Result<HashSet<&str>, _>>()?;
    for (key, value) in patch {
        if value.is_null()
            || key == RETAIN_KEYS
            || key.starts_with(SET_ELEMENT_ORDER)
            || key.starts_with(DELETE_FROM_PRIMITIVE_LIST)
        {
            continue;
        }
        if !keys.contains(key.as_str()) {
            return Err(bad(format!(
                "the patch sets field {key:?}, which is not in the $retainKeys list"
            )));
        }
    }
    original.retain(|k, _| keys.contains(k.as_str()));
    Ok(())
}

/// The field a `<prefix>/<field>` directive key applies to, if `key` is such a directive.
fn directive_field<'k>(
    key: &'k str,
    prefix: &str,
    at: &Loc,
) -> Result<Option<&'k str>, PatchError> {
    let Some(rest) = key.strip_prefix(prefix) else {
        return Ok(None);
    };
    match rest.strip_prefix('/') {
        Some(field) if !field.is_empty() => Ok(Some(field)),
        _ => Err(PatchError::BadDirective {
            at: at.to_string(),
            directive: if prefix == SET_ELEMENT_ORDER {
                SET_ELEMENT_ORDER
            } else {
                DELETE_FROM_PRIMITIVE_LIST
            },
            reason: format!("{key:?} does not name a field as {prefix}/<field>"),
        }),
    }
}

fn expect_map<'v>(item: &'v Value, at: &Loc) -> Result<&'v Map<String, Value>, PatchError> {
    item.as_object().ok_or(PatchError::WrongType {
        at: at.to_string(),
        expected: "a map (the list merges by key)",
        got: type_name(item),
    })
}

fn merge_key_of<'m>(
    item: &'m Map<String, Value>,
    key: &str,
    at: &Loc,
) -> Result<&'m Value, PatchError> {
    item.get(key).ok_or_else(|| PatchError::NoMergeKey {
        at: at.to_string(),
        item: Value::Object(item.clone()).to_string(),
        key: key.to_string(),
    })
}

/// JSON equality with numbers compared by value, so `80` matches `80.0` as in Go.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x == y || x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

fn index_of(list: &[Value], value: &Value) -> Option<usize> {
    list.iter().position(|v| same(v, value))
}

fn dedup(values: Vec<Value>) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::with_capacity(values.len());
    for v in values {
        if index_of(&out, &v).is_none() {
            out.push(v);
        }
    }
    out
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> PatchSchema {
        PatchSchema::builtin("", "Pod")
    }

    fn deployment() -> PatchSchema {
        PatchSchema::builtin("apps", "Deployment")
    }

    /// A pod spec with the given containers.
    fn pod_with(containers: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
               "spec": {"containers": containers}})
    }

    /// A patch that must fail, and how to recognise the right error.
    type ErrorCase = (&'static str, Value, fn(&PatchError) -> bool);

    struct Case {
        name: &'static str,
        schema: PatchSchema,
        doc: Value,
        patch: Value,
        want: Value,
    }

    fn check(cases: Vec<Case>) {
        for case in cases {
            let got = strategic_merge_patch(&case.doc, &case.patch, &case.schema)
                .unwrap_or_else(|e| panic!("{}: {e}", case.name));
            assert_eq!(got, case.want, "{}", case.name);
            // No directive may reach the stored object.
            assert!(
                !got.to_string().contains("\"$"),
                "{}: directive leaked into {got}",
                case.name
            );
        }
    }

    #[test]
    fn maps_merge_and_null_deletes() {
        check(vec![
            Case {
                name: "nested maps merge, null deletes a key",
                schema: pod(),
                doc: json!({"metadata": {"labels": {"a": "1", "b": "2"}, "name": "p"}}),
                patch: json!({"metadata": {"labels": {"a": null, "c": "3"}}}),
                want: json!({"metadata": {"labels": {"b": "2", "c": "3"}, "name": "p"}}),
            },
            Case {
                name: "missing nested maps are created",
                schema: pod(),
                doc: json!({"metadata": {"name": "p"}}),
                patch: json!({"spec": {"securityContext": {"runAsUser": 1000}}}),
                want: json!({"metadata": {"name": "p"},
                             "spec": {"securityContext": {"runAsUser": 1000}}}),
            },
            Case {
                name: "null for a missing key is ignored, nulls in a new map are dropped",
                schema: pod(),
                doc: json!({"metadata": {"name": "p"}}),
                patch: json!({"spec": {"nodeName": null, "dnsConfig": {"options": null,
                                                                        "nameservers": ["1.1.1.1"]}}}),
                want: json!({"metadata": {"name": "p"},
                             "spec": {"dnsConfig": {"nameservers": ["1.1.1.1"]}}}),
            },
            Case {
                name: "a scalar replaces a map and the other way round",
                schema: pod(),
                doc: json!({"a": {"x": 1}, "b": 2}),
                patch: json!({"a": 3, "b": {"y": 4}}),
                want: json!({"a": 3, "b": {"y": 4}}),
            },
            Case {
                name: "empty patch changes nothing",
                schema: pod(),
                doc: pod_with(json!([{"name": "c", "image": "i"}])),
                patch: json!({}),
                want: pod_with(json!([{"name": "c", "image": "i"}])),
            },
        ]);
    }

    #[test]
    fn keyed_lists() {
        check(vec![
            Case {
                name: "container merged by name",
                schema: pod(),
                doc: pod_with(json!([{"name": "app", "image": "nginx:1", "args": ["-v"]},
                                     {"name": "log", "image": "busybox"}])),
                patch: json!({"spec": {"containers": [{"name": "log", "image": "busybox:2"}]}}),
                want: pod_with(json!([{"name": "app", "image": "nginx:1", "args": ["-v"]},
                                      {"name": "log", "image": "busybox:2"}])),
            },
            Case {
                // As in the Kubernetes docs ("Update API Objects in Place Using kubectl
                // patch"): the new container comes out first.
                name: "new container goes before the live ones",
                schema: deployment(),
                doc: json!({"spec": {"template": {"spec": {"containers": [
                    {"name": "patch-demo-ctr", "image": "nginx"}]}}}}),
                patch: json!({"spec": {"template": {"spec": {"containers": [
                    {"name": "patch-demo-ctr-2", "image": "redis"}]}}}}),
                want: json!({"spec": {"template": {"spec": {"containers": [
                    {"name": "patch-demo-ctr-2", "image": "redis"},
                    {"name": "patch-demo-ctr", "image": "nginx"}]}}}}),
            },
            Case {
                name: "env merged by name inside the matching container",
                schema: pod(),
                doc: pod_with(json!([{"name": "app", "env": [{"name": "A", "value": "1"},
                                                             {"name": "B", "value": "2"}]}])),
                patch: json!({"spec": {"containers": [{"name": "app", "env": [
                    {"name": "B", "value": "3"}, {"name": "C", "value": "4"}]}]}}),
                want: pod_with(json!([{"name": "app", "env": [{"name": "A", "value": "1"},
                                                              {"name": "B", "value": "3"},
                                                              {"name": "C", "value": "4"}]}])),
            },
            Case {
                name: "env valueFrom replaced by value through null",
                schema: pod(),
                doc: pod_with(json!([{"name": "app", "env": [{"name": "A",
                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}])),
                patch: json!({"spec": {"containers": [{"name": "app", "env": [
                    {"name": "A", "value": "x", "valueFrom": null}]}]}}),
                want: pod_with(json!([{"name": "app", "env": [{"name": "A", "value": "x"}]}])),
            },
            Case {
                name: "ports merged by containerPort",
                schema: pod(),
                doc: pod_with(json!([{"name": "app", "ports": [
                    {"containerPort": 80, "protocol": "TCP"},
                    {"containerPort": 443, "protocol": "TCP"}]}])),
                patch: json!({"spec": {"containers": [{"name": "app", "ports": [
                    {"containerPort": 443, "name": "https"}]}]}}),
                want: pod_with(json!([{"name": "app", "ports": [
                    {"containerPort": 80, "protocol": "TCP"},
                    {"containerPort": 443, "protocol": "TCP", "name": "https"}]}])),
            },
            Case {
                name: "service ports merged by port",
                schema: PatchSchema::builtin("", "Service"),
                doc: json!({"spec": {"ports": [{"port": 80, "targetPort": 8080}]}}),
                patch: json!({"spec": {"ports": [{"port": 80, "targetPort": 9090}]}}),
                want: json!({"spec": {"ports": [{"port": 80, "targetPort": 9090}]}}),
            },
            Case {
                name: "patch order wins over live order for the items it names",
                schema: pod(),
                doc: pod_with(json!([{"name": "a"}, {"name": "b", "image": "b"}, {"name": "c"}])),
                patch: json!({"spec": {"containers": [{"name": "c", "image": "c"},
                                                      {"name": "a", "image": "a"}]}}),
                want: pod_with(
                    json!([{"name": "b", "image": "b"}, {"name": "c", "image": "c"},
                                      {"name": "a", "image": "a"}]),
                ),
            },
            Case {
                name: "ownerReferences merged by uid on any kind",
                schema: PatchSchema::builtin("", "ConfigMap"),
                doc: json!({"metadata": {"ownerReferences": [{"uid": "1", "name": "a"}]}}),
                patch: json!({"metadata": {"ownerReferences": [{"uid": "2", "name": "b"}]}}),
                want: json!({"metadata": {"ownerReferences": [{"uid": "2", "name": "b"},
                                                              {"uid": "1", "name": "a"}]}}),
            },
        ]);
    }

    #[test]
    fn set_and_atomic_lists() {
        let crd = PatchSchema::from_openapi(&json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "selector": {"type": "object", "x-kubernetes-map-type": "atomic"},
                "routes": {"type": "array", "x-kubernetes-list-type": "map",
                           "x-kubernetes-list-map-keys": ["host"],
                           "items": {"type": "object"}},
                "tags": {"type": "array", "x-kubernetes-list-type": "set",
                         "items": {"type": "string"}}}}}}));
        check(vec![
            Case {
                name: "schema: atomic map replaced whole",
                schema: crd.clone(),
                doc: json!({"spec": {"selector": {"a": "1"}}}),
                patch: json!({"spec": {"selector": {"b": "2"}}}),
                want: json!({"spec": {"selector": {"b": "2"}}}),
            },
            Case {
                name: "schema: list-type map merged on its key, list-type set unioned",
                schema: crd,
                doc: json!({"spec": {"routes": [{"host": "a", "port": 1}], "tags": ["x"]}}),
                patch: json!({"spec": {"routes": [{"host": "a", "port": 2}], "tags": ["y"]}}),
                want: json!({"spec": {"routes": [{"host": "a", "port": 2}], "tags": ["y", "x"]}}),
            },
            Case {
                name: "finalizers are a set: union without duplicates",
                schema: pod(),
                doc: json!({"metadata": {"finalizers": ["a", "b"]}}),
                patch: json!({"metadata": {"finalizers": ["b", "c"]}}),
                want: json!({"metadata": {"finalizers": ["a", "b", "c"]}}),
            },
            Case {
                name: "set keeps patch order for the items it names",
                schema: pod(),
                doc: json!({"metadata": {"finalizers": ["a", "b", "c"]}}),
                patch: json!({"metadata": {"finalizers": ["c", "a"]}}),
                want: json!({"metadata": {"finalizers": ["b", "c", "a"]}}),
            },
            Case {
                name: "tolerations are atomic: replaced whole",
                schema: pod(),
                doc: json!({"spec": {"tolerations": [{"key": "a", "operator": "Exists"},
                                                     {"key": "b", "operator": "Exists"}]}}),
                patch: json!({"spec": {"tolerations": [{"key": "c", "operator": "Exists"}]}}),
                want: json!({"spec": {"tolerations": [{"key": "c", "operator": "Exists"}]}}),
            },
            Case {
                name: "args are atomic",
                schema: pod(),
                doc: pod_with(json!([{"name": "app", "args": ["-a", "-b"]}])),
                patch: json!({"spec": {"containers": [{"name": "app", "args": ["-c"]}]}}),
                want: pod_with(json!([{"name": "app", "args": ["-c"]}])),
            },
            Case {
                name: "null deletes a whole list",
                schema: pod(),
                doc: pod_with(json!([{"name": "app", "args": ["-a"]}])),
                patch: json!({"spec": {"containers": [{"name": "app", "args": null}]}}),
                want: pod_with(json!([{"name": "app"}])),
            },
            Case {
                name: "lists of a kind without a table are atomic",
                schema: PatchSchema::builtin("example.com", "Widget"),
                doc: json!({"spec": {"containers": [{"name": "a"}]}}),
                patch: json!({"spec": {"containers": [{"name": "b"}]}}),
                want: json!({"spec": {"containers": [{"name": "b"}]}}),
            },
        ]);
    }

    #[test]
    fn patch_directives() {
        check(vec![
            Case {
                name: "$patch: replace on a map",
                schema: pod(),
                doc: json!({"metadata": {"labels": {"a": "1", "b": "2"}}}),
                patch: json!({"metadata": {"labels": {"$patch": "replace", "c": "3"}}}),
                want: json!({"metadata": {"labels": {"c": "3"}}}),
            },
            Case {
                name: "$patch: delete on a map leaves it empty, as kube-apiserver does",
                schema: pod(),
                doc: json!({"metadata": {"labels": {"a": "1"}, "name": "p"}}),
                patch: json!({"metadata": {"labels": {"$patch": "delete"}}}),
                want: json!({"metadata": {"labels": {}, "name": "p"}}),
            },
            Case {
                name: "$patch: merge is the default merge",
                schema: pod(),
                doc: json!({"metadata": {"labels": {"a": "1"}}}),
                patch: json!({"metadata": {"labels": {"$patch": "merge", "b": "2"}}}),
                want: json!({"metadata": {"labels": {"a": "1", "b": "2"}}}),
            },
            Case {
                name: "$patch: replace in a keyed list replaces the list",
                schema: pod(),
                doc: pod_with(json!([{"name": "a", "image": "x"}, {"name": "b"}])),
                patch: json!({"spec": {"containers": [{"name": "c"}, {"$patch": "replace"}]}}),
                want: pod_with(json!([{"name": "c"}])),
            },
            Case {
                name: "$patch: delete removes the item with that key",
                schema: pod(),
                doc: pod_with(json!([{"name": "a"}, {"name": "b"}, {"name": "c"}])),
                patch: json!({"spec": {"containers": [{"name": "b", "$patch": "delete"}]}}),
                want: pod_with(json!([{"name": "a"}, {"name": "c"}])),
            },
            Case {
                name: "$patch: delete of an absent item is a no-op",
                schema: pod(),
                doc: pod_with(json!([{"name": "a"}])),
                patch: json!({"spec": {"containers": [{"name": "z", "$patch": "delete"}]}}),
                want: pod_with(json!([{"name": "a"}])),
            },
            Case {
                name: "$patch: replace inside a keyed item is a list directive, as in Go",
                schema: pod(),
                doc: pod_with(json!([{"name": "a", "image": "x", "args": ["1"]}])),
                patch: json!({"spec": {"containers": [{"name": "a", "$patch": "replace"}]}}),
                want: pod_with(json!([])),
            },
            Case {
                name: "$patch: replace on a set list",
                schema: pod(),
                doc: json!({"metadata": {"finalizers": ["a", "b"]}}),
                patch: json!({"metadata": {"finalizers": ["c", {"$patch": "replace"}]}}),
                want: json!({"metadata": {"finalizers": ["c"]}}),
            },
            Case {
                name: "$deleteFromPrimitiveList removes from a set",
                schema: pod(),
                doc: json!({"metadata": {"finalizers": ["a", "b", "c"]}}),
                patch: json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["b", "z"]}}),
                want: json!({"metadata": {"finalizers": ["a", "c"]}}),
            },
            Case {
                name: "$deleteFromPrimitiveList with additions in the same patch",
                schema: pod(),
                doc: json!({"metadata": {"finalizers": ["a", "b"]}}),
                patch: json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"],
                                           "finalizers": ["c"]}}),
                want: json!({"metadata": {"finalizers": ["c", "b"]}}),
            },
            Case {
                name: "$deleteFromPrimitiveList on a missing list does not create it",
                schema: pod(),
                doc: json!({"metadata": {"name": "p"}}),
                patch: json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}),
                want: json!({"metadata": {"name": "p"}}),
            },
            Case {
                name: "$setElementOrder reorders a keyed list without other changes",
                schema: pod(),
                doc: pod_with(json!([{"name": "a"}, {"name": "b"}, {"name": "c"}])),
                patch: json!({"spec": {"$setElementOrder/containers": [
                    {"name": "c"}, {"name": "a"}, {"name": "b"}]}}),
                want: pod_with(json!([{"name": "c"}, {"name": "a"}, {"name": "b"}])),
            },
            Case {
                name: "$setElementOrder places a new item and keeps server-only items",
                schema: pod(),
                doc: pod_with(json!([{"name": "a"}, {"name": "sidecar"}, {"name": "b"}])),
                patch: json!({"spec": {
                    "$setElementOrder/containers": [{"name": "a"}, {"name": "new"}, {"name": "b"}],
                    "containers": [{"name": "new", "image": "n"}]}}),
                want: pod_with(json!([{"name": "a"}, {"name": "new", "image": "n"},
                                      {"name": "sidecar"}, {"name": "b"}])),
            },
            Case {
                name: "$setElementOrder of a set with $deleteFromPrimitiveList",
                schema: pod(),
                doc: json!({"metadata": {"finalizers": ["a", "b", "c"]}}),
                patch: json!({"metadata": {"$setElementOrder/finalizers": ["c", "d", "a"],
                                           "$deleteFromPrimitiveList/finalizers": ["b"],
                                           "finalizers": ["d"]}}),
                want: json!({"metadata": {"finalizers": ["c", "d", "a"]}}),
            },
            Case {
                name: "$setElementOrder for a list the object lacks creates it",
                schema: pod(),
                doc: json!({"spec": {}}),
                patch: json!({"spec": {"$setElementOrder/volumes": [{"name": "v"}],
                                       "volumes": [{"name": "v", "emptyDir": {}}]}}),
                want: json!({"spec": {"volumes": [{"name": "v", "emptyDir": {}}]}}),
            },
            Case {
                // kubectl patch docs: switching a Deployment to Recreate.
                name: "$retainKeys clears fields not listed",
                schema: deployment(),
                doc: json!({"spec": {"replicas": 2, "strategy": {"type": "RollingUpdate",
                    "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}}}),
                patch: json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}}),
                want: json!({"spec": {"replicas": 2, "strategy": {"type": "Recreate"}}}),
            },
            Case {
                name: "$retainKeys in a volume item switches its source",
                schema: pod(),
                doc: json!({"spec": {"volumes": [{"name": "data", "emptyDir": {}},
                                                 {"name": "other", "emptyDir": {}}]}}),
                patch: json!({"spec": {"volumes": [{"name": "data",
                    "$retainKeys": ["configMap", "name"], "configMap": {"name": "cfg"}}]}}),
                want: json!({"spec": {"volumes": [{"name": "data", "configMap": {"name": "cfg"}},
                                                  {"name": "other", "emptyDir": {}}]}}),
            },
            Case {
                name: "directives inside a value new to the object are resolved",
                schema: pod(),
                doc: json!({"metadata": {"name": "p"}}),
                patch: json!({"spec": {"containers": [{"name": "a"}, {"name": "b", "$patch": "delete"}],
                                       "$setElementOrder/initContainers": [{"name": "i"}],
                                       "initContainers": [{"name": "i", "env": [
                                           {"name": "X", "value": "1"},
                                           {"name": "Y", "$patch": "delete"}]}]}}),
                want: json!({"metadata": {"name": "p"},
                             "spec": {"containers": [{"name": "a"}],
                                      "initContainers": [{"name": "i", "env": [
                                          {"name": "X", "value": "1"}]}]}}),
            },
        ]);
    }

    // Request bodies the real `kubectl apply` (v1.32, client-side) sent to a stub server
    // holding the live objects below, captured verbatim.

    /// Manifest change: container image 1.25 -> 1.26, env var `DEBUG` removed.
    const APPLY_IMAGE_AND_ENV: &str = r#"{"metadata":{"annotations":{"kubectl.kubernetes.io/last-applied-configuration":"{\"apiVersion\":\"apps/v1\",\"kind\":\"Deployment\",\"metadata\":{\"annotations\":{},\"name\":\"web\",\"namespace\":\"default\"},\"spec\":{\"replicas\":2,\"selector\":{\"matchLabels\":{\"app\":\"web\"}},\"template\":{\"metadata\":{\"labels\":{\"app\":\"web\"}},\"spec\":{\"containers\":[{\"env\":[{\"name\":\"MODE\",\"value\":\"prod\"}],\"image\":\"nginx:1.26\",\"name\":\"web\",\"ports\":[{\"containerPort\":80}]}]}}}}\n"}},"spec":{"template":{"spec":{"$setElementOrder/containers":[{"name":"web"}],"containers":[{"$setElementOrder/env":[{"name":"MODE"}],"env":[{"$patch":"delete","name":"DEBUG"}],"image":"nginx:1.26","name":"web"}]}}}}"#;

    /// Manifest change: finalizer x dropped and z added, strategy RollingUpdate -> Recreate,
    /// volume `data` emptyDir -> configMap, volume `cache` removed, an arg removed, a
    /// container `exporter` added.
    const APPLY_FINALIZERS_STRATEGY_VOLUMES: &str = r#"{"metadata":{"$deleteFromPrimitiveList/finalizers":["example.com/x"],"$setElementOrder/finalizers":["example.com/y","example.com/z"],"annotations":{"kubectl.kubernetes.io/last-applied-configuration":"{\"apiVersion\":\"apps/v1\",\"kind\":\"Deployment\",\"metadata\":{\"annotations\":{},\"finalizers\":[\"example.com/y\",\"example.com/z\"],\"name\":\"web\",\"namespace\":\"default\"},\"spec\":{\"replicas\":2,\"selector\":{\"matchLabels\":{\"app\":\"web\"}},\"strategy\":{\"type\":\"Recreate\"},\"template\":{\"metadata\":{\"labels\":{\"app\":\"web\"}},\"spec\":{\"containers\":[{\"args\":[\"--b\"],\"image\":\"nginx:1.25\",\"name\":\"web\",\"volumeMounts\":[{\"mountPath\":\"/data\",\"name\":\"data\"}]},{\"image\":\"exporter:1\",\"name\":\"exporter\"}],\"volumes\":[{\"configMap\":{\"name\":\"web-config\"},\"name\":\"data\"}]}}}}\n"},"finalizers":["example.com/z"]},"spec":{"strategy":{"$retainKeys":["type"],"rollingUpdate":null,"type":"Recreate"},"template":{"spec":{"$setElementOrder/containers":[{"name":"web"},{"name":"exporter"}],"$setElementOrder/volumes":[{"name":"data"}],"containers":[{"args":["--b"],"name":"web"},{"image":"exporter:1","name":"exporter"}],"volumes":[{"$retainKeys":["configMap","name"],"configMap":{"name":"web-config"},"emptyDir":null,"name":"data"},{"$patch":"delete","name":"cache"}]}}}}"#;

    /// The last-applied configuration an apply compares against, as kubectl stores it.
    fn last_applied(patch: &str) -> Value {
        let patch: Value = serde_json::from_str(patch).unwrap();
        patch["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"].clone()
    }

    #[test]
    fn kubectl_apply_changes_image_and_removes_env() {
        let live = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default", "uid": "u-1",
                "resourceVersion": "7", "generation": 1,
                "annotations": {"deployment.kubernetes.io/revision": "1",
                    "kubectl.kubernetes.io/last-applied-configuration": "{}\n"}},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                "strategy": {"type": "RollingUpdate",
                    "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {
                    "containers": [
                        {"name": "web", "image": "nginx:1.25",
                         "env": [{"name": "MODE", "value": "prod"}, {"name": "DEBUG", "value": "1"}],
                         "ports": [{"containerPort": 80, "protocol": "TCP"}],
                         "imagePullPolicy": "IfNotPresent", "resources": {}},
                        // Injected by someone else: apply must keep it, after `web`.
                        {"name": "mesh-proxy", "image": "proxy:1"}],
                    "restartPolicy": "Always", "dnsPolicy": "ClusterFirst"}}},
            "status": {"replicas": 2, "readyReplicas": 2}
        });
        let mut want = live.clone();
        want["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] =
            last_applied(APPLY_IMAGE_AND_ENV);
        let web = &mut want["spec"]["template"]["spec"]["containers"][0];
        web["image"] = json!("nginx:1.26");
        web["env"] = json!([{"name": "MODE", "value": "prod"}]);

        let patch = serde_json::from_str(APPLY_IMAGE_AND_ENV).unwrap();
        let got = strategic_merge_patch(&live, &patch, &deployment()).unwrap();
        assert_eq!(got, want);
    }

    #[test]
    fn kubectl_apply_finalizers_strategy_volumes_containers() {
        let live = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default", "uid": "u-1",
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}\n"},
                // `example.com/server` was added by a controller, not by the manifest.
                "finalizers": ["example.com/x", "example.com/y", "example.com/server"]},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                "strategy": {"type": "RollingUpdate",
                    "rollingUpdate": {"maxSurge": 1, "maxUnavailable": "25%"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {
                    "containers": [{"name": "web", "image": "nginx:1.25", "args": ["--a", "--b"],
                        "volumeMounts": [{"mountPath": "/data", "name": "data"}],
                        "imagePullPolicy": "IfNotPresent"}],
                    "volumes": [{"name": "data", "emptyDir": {"medium": ""}},
                                {"name": "cache", "emptyDir": {}},
                                {"name": "injected", "emptyDir": {}}]}}},
            "status": {"replicas": 2}
        });
        let want = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default", "uid": "u-1",
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration":
                    last_applied(APPLY_FINALIZERS_STRATEGY_VOLUMES)},
                "finalizers": ["example.com/y", "example.com/z", "example.com/server"]},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                "strategy": {"type": "Recreate"},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {
                    "containers": [
                        {"name": "web", "image": "nginx:1.25", "args": ["--b"],
                         "volumeMounts": [{"mountPath": "/data", "name": "data"}],
                         "imagePullPolicy": "IfNotPresent"},
                        {"name": "exporter", "image": "exporter:1"}],
                    "volumes": [{"name": "data", "configMap": {"name": "web-config"}},
                                {"name": "injected", "emptyDir": {}}]}}},
            "status": {"replicas": 2}
        });
        let patch = serde_json::from_str(APPLY_FINALIZERS_STRATEGY_VOLUMES).unwrap();
        let got = strategic_merge_patch(&live, &patch, &deployment()).unwrap();
        assert_eq!(got, want);
    }

    /// `kubectl set image`, `kubectl rollout restart` and `kubectl set env`, in that order
    /// (bodies captured as above: a 2-way patch with `$setElementOrder` for every merge list
    /// the object has).
    #[test]
    fn kubectl_set_and_rollout_restart() {
        let patches = [
            r#"{"metadata":{"$setElementOrder/finalizers":["example.com/x","example.com/y","example.com/server"]},"spec":{"template":{"spec":{"$setElementOrder/containers":[{"name":"web"}],"containers":[{"image":"nginx:1.27","name":"web"}]}}}}"#,
            r#"{"metadata":{"$setElementOrder/finalizers":["example.com/x","example.com/y","example.com/server"]},"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":"2026-11-22T14:30:09Z"}}}}}"#,
            r#"{"metadata":{"$setElementOrder/finalizers":["example.com/x","example.com/y","example.com/server"]},"spec":{"template":{"spec":{"$setElementOrder/containers":[{"name":"web"}],"containers":[{"env":[{"name":"FOO","value":"bar"}],"name":"web"}]}}}}"#,
        ];
        let live = json!({
            "metadata": {"name": "web", "finalizers": ["example.com/x", "example.com/y", "example.com/server"]},
            "spec": {"template": {"metadata": {"labels": {"app": "web"}}, "spec": {
                "containers": [{"name": "web", "image": "nginx:1.25"}]}}}
        });
        let want = json!({
            "metadata": {"name": "web", "finalizers": ["example.com/x", "example.com/y", "example.com/server"]},
            "spec": {"template": {
                "metadata": {"labels": {"app": "web"},
                    "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-11-22T14:30:09Z"}},
                "spec": {"containers": [{"name": "web", "image": "nginx:1.27",
                                         "env": [{"name": "FOO", "value": "bar"}]}]}}}
        });
        let got = patches.iter().fold(live, |doc, patch| {
            let patch = serde_json::from_str(patch).unwrap();
            strategic_merge_patch(&doc, &patch, &deployment()).unwrap()
        });
        assert_eq!(got, want);
    }

    #[test]
    fn strategic_errors() {
        let doc = pod_with(json!([{"name": "a", "env": [{"name": "X"}]}]));
        let cases: Vec<ErrorCase> = vec![
            ("patch is a list", json!([]), |e| {
                matches!(
                    e,
                    PatchError::NotAnObject {
                        what: "strategic merge patch",
                        ..
                    }
                )
            }),
            (
                "unknown $-directive",
                json!({"spec": {"$frobnicate": 1}}),
                |e| matches!(e, PatchError::UnknownDirective { key, at } if key == "$frobnicate" && at == "spec"),
            ),
            (
                "unknown $patch value",
                json!({"metadata": {"$patch": "explode"}}),
                |e| matches!(e, PatchError::UnknownPatchType { .. }),
            ),
            (
                "unknown $patch in a list item",
                json!({"spec": {"containers": [{"name": "a", "$patch": "explode"}]}}),
                |e| matches!(e, PatchError::UnknownPatchType { .. }),
            ),
            (
                "keyed item without its key",
                json!({"spec": {"containers": [{"image": "x"}]}}),
                |e| matches!(e, PatchError::NoMergeKey { key, .. } if key == "name"),
            ),
            (
                "delete without the key",
                json!({"spec": {"containers": [{"$patch": "delete"}]}}),
                |e| matches!(e, PatchError::NoMergeKey { .. }),
            ),
            (
                "primitive in a keyed list",
                json!({"spec": {"containers": [{"name": "a", "env": ["X"]}]}}),
                |e| matches!(e, PatchError::WrongType { at, .. } if at == "spec.containers[name=\"a\"].env[0]"),
            ),
            (
                "list of lists",
                json!({"metadata": {"finalizers": [["a"]]}}),
                |e| matches!(e, PatchError::ListOfLists { .. }),
            ),
            (
                "object in a set",
                json!({"metadata": {"finalizers": [{"a": 1}]}}),
                |e| matches!(e, PatchError::WrongType { .. }),
            ),
            (
                "$setElementOrder not a list",
                json!({"spec": {"$setElementOrder/containers": {"name": "a"}}}),
                |e| {
                    matches!(
                        e,
                        PatchError::BadDirective {
                            directive: "$setElementOrder",
                            ..
                        }
                    )
                },
            ),
            (
                "$setElementOrder without a field",
                json!({"spec": {"$setElementOrder": []}}),
                |e| matches!(e, PatchError::BadDirective { .. }),
            ),
            (
                "$setElementOrder not matching the patch list",
                json!({"spec": {"$setElementOrder/containers": [{"name": "a"}],
                             "containers": [{"name": "b"}]}}),
                |e| matches!(e, PatchError::BadDirective { reason, .. } if reason.contains("doesn't match")),
            ),
            (
                "$deleteFromPrimitiveList not a list",
                json!({"metadata": {"$deleteFromPrimitiveList/finalizers": "a"}}),
                |e| {
                    matches!(
                        e,
                        PatchError::BadDirective {
                            directive: "$deleteFromPrimitiveList",
                            ..
                        }
                    )
                },
            ),
            (
                "$retainKeys missing a patched field",
                json!({"spec": {"$retainKeys": ["nodeName"], "hostname": "h"}}),
                |e| matches!(e, PatchError::BadDirective { directive: "$retainKeys", reason, .. } if reason.contains("hostname")),
            ),
            (
                "$retainKeys not a list",
                json!({"spec": {"$retainKeys": "x"}}),
                |e| {
                    matches!(
                        e,
                        PatchError::BadDirective {
                            directive: "$retainKeys",
                            ..
                        }
                    )
                },
            ),
        ];
        for (name, patch, want) in cases {
            match strategic_merge_patch(&doc, &patch, &pod()) {
                Ok(v) => panic!("{name}: expected an error, got {v}"),
                Err(e) => {
                    assert!(want(&e), "{name}: wrong error {e:?}");
                    assert_eq!(e.http_status(), 400, "{name}");
                }
            }
        }
        assert!(matches!(
            strategic_merge_patch(&json!("x"), &json!({}), &pod()),
            Err(PatchError::NotAnObject {
                what: "document",
                ..
            })
        ));
    }

    #[test]
    fn json_patches() {
        let doc = json!({"metadata": {"name": "p", "labels": {"a": "1"}},
                         "spec": {"replicas": 1, "args": ["x", "y"]}});
        let cases = [
            (
                "replace",
                json!([{"op": "replace", "path": "/spec/replicas", "value": 3}]),
                json!({"metadata": {"name": "p", "labels": {"a": "1"}},
                    "spec": {"replicas": 3, "args": ["x", "y"]}}),
            ),
            (
                "add to list end and escaped key",
                json!([{"op": "add", "path": "/spec/args/-", "value": "z"},
                    {"op": "add", "path": "/metadata/labels/app.kubernetes.io~1name", "value": "w"}]),
                json!({"metadata": {"name": "p", "labels": {"a": "1", "app.kubernetes.io/name": "w"}},
                    "spec": {"replicas": 1, "args": ["x", "y", "z"]}}),
            ),
            (
                "test then remove",
                json!([{"op": "test", "path": "/spec/replicas", "value": 1},
                    {"op": "remove", "path": "/metadata/labels"}]),
                json!({"metadata": {"name": "p"}, "spec": {"replicas": 1, "args": ["x", "y"]}}),
            ),
            (
                "move and copy",
                json!([{"op": "copy", "from": "/metadata/name", "path": "/spec/name"},
                    {"op": "move", "from": "/spec/args/0", "path": "/spec/args/1"}]),
                json!({"metadata": {"name": "p", "labels": {"a": "1"}},
                    "spec": {"replicas": 1, "args": ["y", "x"], "name": "p"}}),
            ),
            ("empty patch", json!([]), doc.clone()),
        ];
        for (name, patch, want) in cases {
            assert_eq!(json_patch(&doc, &patch).unwrap(), want, "{name}");
        }

        let errors: Vec<ErrorCase> = vec![
            ("not a list", json!({"op": "add"}), |e| {
                matches!(e, PatchError::InvalidJsonPatch(_))
            }),
            (
                "unknown op",
                json!([{"op": "frob", "path": "/a"}]),
                |e| matches!(e, PatchError::InvalidJsonPatch(m) if m.contains("frob")),
            ),
            ("missing value", json!([{"op": "add", "path": "/a"}]), |e| {
                matches!(e, PatchError::InvalidJsonPatch(_))
            }),
            (
                "test fails",
                json!([{"op": "replace", "path": "/spec/replicas", "value": 5},
                    {"op": "test", "path": "/metadata/name", "value": "q"}]),
                |e| matches!(e, PatchError::TestFailed { index: 1, path, .. } if path == "/metadata/name"),
            ),
            (
                "remove missing",
                json!([{"op": "remove", "path": "/spec/nope"}]),
                |e| matches!(e, PatchError::OperationFailed { op: "remove", .. }),
            ),
            (
                "add under missing parent",
                json!([{"op": "add", "path": "/a/b", "value": 1}]),
                |e| {
                    matches!(
                        e,
                        PatchError::OperationFailed {
                            op: "add",
                            index: 0,
                            ..
                        }
                    )
                },
            ),
            (
                "index out of range",
                json!([{"op": "replace", "path": "/spec/args/9", "value": 1}]),
                |e| matches!(e, PatchError::OperationFailed { op: "replace", .. }),
            ),
        ];
        for (name, patch, want) in errors {
            match json_patch(&doc, &patch) {
                Ok(v) => panic!("{name}: expected an error, got {v}"),
                Err(e) => assert!(want(&e), "{name}: wrong error {e:?}"),
            }
        }
        let fail = json_patch(
            &doc,
            &json!([{"op": "test", "path": "/spec/replicas", "value": 2}]),
        )
        .unwrap_err();
        assert_eq!(fail.http_status(), 422);
        assert!(fail.to_string().contains("/spec/replicas"), "{fail}");

        let too_long = Value::Array(vec![json!({"op": "test", "path": "", "value": 1}); 10_001]);
        assert!(matches!(
            json_patch(&doc, &too_long),
            Err(PatchError::TooManyOperations { got: 10_001, .. })
        ));
    }

    #[test]
    fn merge_patches() {
        let doc = json!({"metadata": {"name": "p", "labels": {"a": "1", "b": "2"}},
                         "spec": {"args": ["x", "y"], "replicas": 1}});
        let cases = [
            (
                "null deletes, maps merge",
                json!({"metadata": {"labels": {"a": null, "c": "3"}}}),
                json!({"metadata": {"name": "p", "labels": {"b": "2", "c": "3"}},
                    "spec": {"args": ["x", "y"], "replicas": 1}}),
            ),
            (
                "lists are replaced whole",
                json!({"spec": {"args": ["z"]}}),
                json!({"metadata": {"name": "p", "labels": {"a": "1", "b": "2"}},
                    "spec": {"args": ["z"], "replicas": 1}}),
            ),
            (
                "new nested map created without its nulls",
                json!({"status": {"phase": "Running", "reason": null}}),
                json!({"metadata": {"name": "p", "labels": {"a": "1", "b": "2"}},
                    "spec": {"args": ["x", "y"], "replicas": 1}, "status": {"phase": "Running"}}),
            ),
            (
                "whole subtree deleted",
                json!({"spec": null}),
                json!({"metadata": {"name": "p", "labels": {"a": "1", "b": "2"}}}),
            ),
            (
                "a map replaces a scalar",
                json!({"spec": {"replicas": {"min": 1}}}),
                json!({"metadata": {"name": "p", "labels": {"a": "1", "b": "2"}},
                       "spec": {"args": ["x", "y"], "replicas": {"min": 1}}}),
            ),
        ];
        for (name, patch, want) in cases {
            assert_eq!(merge_patch(&doc, &patch).unwrap(), want, "{name}");
        }
        // Deleting a field keeps the others in place (Value equality ignores key order).
        let got = merge_patch(&json!({"a": 1, "b": 2, "c": 3}), &json!({"a": null})).unwrap();
        let keys: Vec<&String> = got.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["b", "c"]);
        for bad in [json!([1]), json!("x"), json!(null), json!(3)] {
            assert!(
                matches!(
                    merge_patch(&doc, &bad),
                    Err(PatchError::NotAnObject {
                        what: "merge patch",
                        ..
                    })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn json_patch_test_of_null_passes_on_absent_member() {
        let doc = json!({"metadata": {"name": "a"}});
        let patch = json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": ["f"]},
            {"op": "test", "path": "/metadata/finalizers", "value": null}
        ]);
        // The second test sees the member the add created, so it fails like kube's would.
        assert!(json_patch(&doc, &patch).is_err());
        let ok = json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": ["f"]}
        ]);
        assert_eq!(
            json_patch(&doc, &ok).unwrap(),
            json!({"metadata": {"name": "a", "finalizers": ["f"]}})
        );
        // An error names the operation by its place in the patch as sent, dropped tests
        // counted.
        let failing = json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "remove", "path": "/spec/missing"}
        ]);
        let err = json_patch(&doc, &failing).unwrap_err().to_string();
        assert!(err.starts_with("JSON patch operation 1 (remove"), "{err}");
        let failing_test = json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "test", "path": "/metadata/name", "value": "b"}
        ]);
        let err = json_patch(&doc, &failing_test).unwrap_err().to_string();
        assert!(err.starts_with("JSON patch operation 1 (test)"), "{err}");
    }
}
