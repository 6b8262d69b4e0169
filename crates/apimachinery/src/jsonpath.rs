//! JSONPath subset used by additionalPrinterColumns and `kubectl get -o jsonpath`.
//!
//! Mirrors `k8s.io/client-go/util/jsonpath` for what printer columns and kubectl users write:
//! `.a.b`, `['quoted.key']`, `[n]` (negative counts from the end), `[*]`, `.*`, slices
//! `[a:b:step]`, unions `[0,2]`, recursive descent `..name`, and filters
//! `[?(@.a=="x")]` with `==`, `!=`, `<`, `>`, `<=`, `>=` or bare existence `[?(@.a)]`.
//!
//! Missing fields yield no value instead of an error, as printer columns evaluate with
//! `AllowMissingKeys(true)`. Written by hand because the Rust JSONPath crates implement RFC 9535,
//! whose filters, unions and error behaviour differ from the Kubernetes dialect.

use serde_json::Value;

use crate::schema::{go_json, go_number};

/// Why a JSONPath expression could not be parsed or evaluated.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum JsonPathError {
    /// The expression is not valid JSONPath.
    #[error("invalid jsonpath {expr:?} at offset {offset}: {reason}")]
    Syntax {
        /// The whole expression.
        expr: String,
        /// Byte offset of the problem.
        offset: usize,
        /// What was expected.
        reason: String,
    },
    /// An index points outside the array.
    #[error("array index out of bounds: index {index}, length {len}")]
    IndexOutOfBounds {
        /// The index as written.
        index: i64,
        /// Length of the array.
        len: usize,
    },
    /// An index, slice or filter was applied to something that is not an array.
    #[error("{step} applies to arrays, but the value is {found}")]
    NotAnArray {
        /// The offending step, e.g. `[0]`.
        step: String,
        /// The JSON type found instead.
        found: &'static str,
    },
    /// A filter operand matched several values.
    #[error("filter {filter}: can only compare one element at a time")]
    AmbiguousComparison {
        /// The filter as written.
        filter: String,
    },
    /// A filter compared values of different types (kubectl refuses as Go templates do).
    #[error("filter {filter}: cannot compare {left} with {right}")]
    IncomparableTypes {
        /// The filter as written.
        filter: String,
        /// JSON type of the left operand.
        left: &'static str,
        /// JSON type of the right operand.
        right: &'static str,
    },
}

/// Evaluates `expr` (with or without the surrounding `{}`: `.spec.replicas`, `{.status.conditions[?(@.type=="Ready")].status}`) against `obj`; returns the matched values in order.
///
/// Templates with several blocks (`{.a}/{.b}`, `{"\n"}`) yield their literal text as strings
/// between the matches; `range`/`end` blocks are not supported.
pub fn evaluate(expr: &str, obj: &Value) -> Result<Vec<Value>, JsonPathError> {
    let mut out = Vec::new();
    for segment in Parser::new(expr).parse_template()? {
        match segment {
            Segment::Text(text) => out.push(Value::String(text)),
            Segment::Path(steps) => {
                out.extend(eval_steps(&steps, vec![obj], obj)?.into_iter().cloned())
            }
        }
    }
    Ok(out)
}

/// Formats matches for a Table cell as kubectl does (strings bare, others as JSON, several joined by ",").
pub fn format_cell(values: &[Value]) -> String {
    values
        .iter()
        .map(|v| match v {
            Value::String(s) => s.clone(),
            // Numbers print as Go's fmt does (int64 digits, float64 %v), like kubectl's text output.
            Value::Number(n) => go_number(n),
            other => go_json(other),
        })
        .collect::<Vec<_>>()
        .join(",")
}

// ---------------------------------------------------------------------------------------------
// Syntax
// ---------------------------------------------------------------------------------------------

/// A piece of a template: literal text or a path to evaluate.
#[derive(Clone, Debug, PartialEq)]
enum Segment {
    Text(String),
    Path(Vec<Step>),
}

#[derive(Clone, Debug, PartialEq)]
enum Step {
    /// `.name` or `['name']`.
    Field(String),
    /// `['a','b']`.
    Fields(Vec<String>),
    /// `.*`: every value of an object or item of an array.
    Wildcard,
    /// `..`: the value and all its descendants.
    Recursive,
    /// `[n]`.
    Index(i64),
    /// `[0,2]`.
    Indexes(Vec<i64>),
    /// `[a:b:c]` and `[*]`.
    Slice(Option<i64>, Option<i64>, Option<i64>),
    /// `[?(...)]`.
    Filter(Box<Filter>),
}

impl Step {
    fn describe(&self) -> String {
        match self {
            Step::Field(f) => format!(".{f}"),
            Step::Fields(f) => format!("[{}]", f.join(",")),
            Step::Wildcard => ".*".into(),
            Step::Recursive => "..".into(),
            Step::Index(i) => format!("[{i}]"),
            Step::Indexes(i) => {
                format!(
                    "[{}]",
                    i.iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                )
            }
            Step::Slice(a, b, c) => {
                let part = |x: &Option<i64>| x.map(|v| v.to_string()).unwrap_or_default();
                match c {
                    Some(_) => format!("[{}:{}:{}]", part(a), part(b), part(c)),
                    None => format!("[{}:{}]", part(a), part(b)),
                }
            }
            Step::Filter(f) => format!("[?({})]", f.text),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Operand {
    /// `@...` relative to the item, or `$...` relative to the root.
    Path {
        from_root: bool,
        steps: Vec<Step>,
    },
    Literal(Value),
}

#[derive(Clone, Debug, PartialEq)]
struct Filter {
    left: Operand,
    /// `None` for an existence test.
    comparison: Option<(Op, Operand)>,
    text: String,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Eq,
    Ne,
    Lt,
    Gt,
    Le,
    Ge,
}

struct Parser<'a> {
    expr: &'a str,
    src: &'a [u8],
    pos: usize,
}

/// Characters that end an unquoted field name, as in client-go's lexer.
fn ends_name(c: u8) -> bool {
    matches!(
        c,
        b'.' | b'['
            | b']'
            | b'{'
            | b'}'
            | b'('
            | b')'
            | b','
            | b' '
            | b'='
            | b'!'
            | b'<'
            | b'>'
            | b'@'
            | b'$'
            | b'\t'
    )
}

impl<'a> Parser<'a> {
    fn new(expr: &'a str) -> Self {
        Parser {
            expr,
            src: expr.as_bytes(),
            pos: 0,
        }
    }

    fn error(&self, reason: impl Into<String>) -> JsonPathError {
        JsonPathError::Syntax {
            expr: self.expr.to_string(),
            offset: self.pos,
            reason: reason.into(),
        }
    }

    fn peek(&self) -> Option<u8> {
        self.src.get(self.pos).copied()
    }

    fn eat(&mut self, c: u8) -> bool {
        if self.peek() == Some(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn skip_spaces(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.pos += 1;
        }
    }

    /// A bare path, or a template of `{path}` blocks, `{"literal"}` blocks and text.
    fn parse_template(&mut self) -> Result<Vec<Segment>, JsonPathError> {
        if self.expr.trim().is_empty() {
            return Err(self.error("empty expression"));
        }
        if !self.expr.contains('{') {
            let steps = self.parse_path()?;
            self.skip_spaces();
            if self.pos != self.src.len() {
                return Err(self.error("unexpected character"));
            }
            return Ok(vec![Segment::Path(steps)]);
        }
        // Surrounding blanks are not part of a one-block template.
        let end = self.expr.trim_end().len();
        self.skip_spaces();
        let mut segments = Vec::new();
        while self.pos < end {
            if self.eat(b'{') {
                self.skip_spaces();
                if matches!(self.peek(), Some(b'\'' | b'"')) {
                    segments.push(Segment::Text(self.parse_quoted()?));
                } else {
                    segments.push(Segment::Path(self.parse_path()?));
                }
                self.skip_spaces();
                if !self.eat(b'}') {
                    return Err(self.error("expected closing '}'"));
                }
            } else {
                let start = self.pos;
                while self.pos < end && self.peek() != Some(b'{') {
                    self.pos += 1;
                }
                segments.push(Segment::Text(self.expr[start..self.pos].to_string()));
            }
        }
        Ok(segments)
    }

    /// `$`, an optional relaxed leading field, then steps.
    fn parse_path(&mut self) -> Result<Vec<Step>, JsonPathError> {
        self.skip_spaces();
        self.eat(b'$');
        let mut steps = Vec::new();
        // kubectl accepts a relaxed leading field without the dot: `metadata.name`.
        if self.peek().is_some_and(|c| !ends_name(c)) {
            steps.push(Step::Field(self.parse_name()?));
        }
        steps.extend(self.parse_steps()?);
        Ok(steps)
    }

    fn parse_steps(&mut self) -> Result<Vec<Step>, JsonPathError> {
        let mut steps = Vec::new();
        loop {
            match self.peek() {
                Some(b'.') => {
                    self.pos += 1;
                    if self.eat(b'.') {
                        steps.push(Step::Recursive);
                        match self.peek() {
                            Some(b'[') => {}
                            Some(b'*') => {
                                self.pos += 1;
                                steps.push(Step::Wildcard);
                            }
                            _ => steps.push(Step::Field(self.parse_name()?)),
                        }
                    } else if self.eat(b'*') {
                        steps.push(Step::Wildcard);
                    } else {
                        steps.push(Step::Field(self.parse_name()?));
                    }
                }
                Some(b'[') => {
                    self.pos += 1;
                    steps.push(self.parse_bracket()?);
                }
                _ => return Ok(steps),
            }
        }
    }

    /// An unquoted field name; `\` escapes the next character (e.g. a dot in an annotation key).
    fn parse_name(&mut self) -> Result<String, JsonPathError> {
        let mut name = Vec::new();
        while let Some(c) = self.peek() {
            if c == b'\\' {
                self.pos += 1;
                match self.peek() {
                    Some(escaped) => name.push(escaped),
                    None => return Err(self.error("dangling escape")),
                }
                self.pos += 1;
            } else if ends_name(c) {
                break;
            } else {
                name.push(c);
                self.pos += 1;
            }
        }
        if name.is_empty() {
            return Err(self.error("expected a field name"));
        }
        String::from_utf8(name).map_err(|_| self.error("field name is not UTF-8"))
    }

    fn parse_quoted(&mut self) -> Result<String, JsonPathError> {
        let quote = self
            .peek()
            .ok_or_else(|| self.error("expected a quoted string"))?;
        self.pos += 1;
        let mut out = Vec::new();
        loop {
            match self.peek() {
                None => return Err(self.error("unterminated string")),
                Some(b'\\') => {
                    self.pos += 1;
                    let c = self
                        .peek()
                        .ok_or_else(|| self.error("unterminated string"))?;
                    out.push(match c {
                        b'n' => b'\n',
                        b't' => b'\t',
                        other => other,
                    });
                    self.pos += 1;
                }
                Some(c) if c == quote => {
                    self.pos += 1;
                    break;
                }
                Some(c) => {
                    out.push(c);
                    self.pos += 1;
                }
            }
        }
        String::from_utf8(out).map_err(|_| self.error("string is not UTF-8"))
    }

    fn parse_int(&mut self) -> Result<Option<i64>, JsonPathError> {
        self.skip_spaces();
        let start = self.pos;
        self.eat(b'-');
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        let text = &self.expr[start..self.pos];
        self.skip_spaces();
        if text.is_empty() {
            return Ok(None);
        }
        text.parse()
            .map(Some)
            .map_err(|_| self.error(format!("invalid array index {text:?}")))
    }

    /// After `[`: quoted keys, `*`, indexes, slices or a filter, up to `]`.
    fn parse_bracket(&mut self) -> Result<Step, JsonPathError> {
        self.skip_spaces();
        let step = match self.peek() {
            Some(b'\'' | b'"') => {
                let mut keys = vec![self.parse_quoted()?];
                self.skip_spaces();
                while self.eat(b',') {
                    self.skip_spaces();
                    keys.push(self.parse_quoted()?);
                    self.skip_spaces();
                }
                if keys.len() == 1 {
                    Step::Field(keys.remove(0))
                } else {
                    Step::Fields(keys)
                }
            }
            Some(b'*') => {
                self.pos += 1;
                self.skip_spaces();
                Step::Slice(None, None, None)
            }
            Some(b'?') => {
                self.pos += 1;
                self.skip_spaces();
                if !self.eat(b'(') {
                    return Err(self.error("expected '(' after '?'"));
                }
                let filter = self.parse_filter()?;
                self.skip_spaces();
                Step::Filter(Box::new(filter))
            }
            _ => {
                let first = self.parse_int()?;
                if self.peek() == Some(b':') {
                    self.pos += 1;
                    let end = self.parse_int()?;
                    let step = if self.eat(b':') {
                        self.parse_int()?
                    } else {
                        None
                    };
                    if step.is_some_and(|s| s <= 0) {
                        return Err(self.error("slice step must be > 0"));
                    }
                    Step::Slice(first, end, step)
                } else {
                    let first = first.ok_or_else(|| {
                        self.error("expected an index, a quoted key, '*' or a filter")
                    })?;
                    let mut all = vec![first];
                    while self.eat(b',') {
                        all.push(
                            self.parse_int()?
                                .ok_or_else(|| self.error("expected an index"))?,
                        );
                    }
                    if all.len() == 1 {
                        Step::Index(first)
                    } else {
                        Step::Indexes(all)
                    }
                }
            }
        };
        if !self.eat(b']') {
            return Err(self.error("expected ']'"));
        }
        Ok(step)
    }

    /// After `?(`: `operand [op operand]` up to `)`.
    fn parse_filter(&mut self) -> Result<Filter, JsonPathError> {
        let start = self.pos;
        self.skip_spaces();
        let left = self.parse_operand()?;
        self.skip_spaces();
        let op = match (self.peek(), self.src.get(self.pos + 1).copied()) {
            (Some(b'='), Some(b'=')) => Some((Op::Eq, 2)),
            (Some(b'!'), Some(b'=')) => Some((Op::Ne, 2)),
            (Some(b'<'), Some(b'=')) => Some((Op::Le, 2)),
            (Some(b'>'), Some(b'=')) => Some((Op::Ge, 2)),
            (Some(b'<'), _) => Some((Op::Lt, 1)),
            (Some(b'>'), _) => Some((Op::Gt, 1)),
            _ => None,
        };
        let comparison = match op {
            Some((op, len)) => {
                self.pos += len;
                self.skip_spaces();
                let right = self.parse_operand()?;
                self.skip_spaces();
                Some((op, right))
            }
            None => None,
        };
        let text = self.expr[start..self.pos].trim().to_string();
        if !self.eat(b')') {
            return Err(self.error("expected ')' closing the filter"));
        }
        Ok(Filter {
            left,
            comparison,
            text,
        })
    }

    fn parse_operand(&mut self) -> Result<Operand, JsonPathError> {
        match self.peek() {
            Some(c @ (b'@' | b'$')) => {
                self.pos += 1;
                let steps = self.parse_steps()?;
                Ok(Operand::Path {
                    from_root: c == b'$',
                    steps,
                })
            }
            Some(b'\'' | b'"') => Ok(Operand::Literal(Value::String(self.parse_quoted()?))),
            Some(c) if c == b'-' || c.is_ascii_digit() => {
                let start = self.pos;
                self.pos += 1;
                while self.peek().is_some_and(|c| {
                    c.is_ascii_digit() || matches!(c, b'.' | b'e' | b'E' | b'+' | b'-')
                }) {
                    self.pos += 1;
                }
                let text = &self.expr[start..self.pos];
                let number = if let Ok(i) = text.parse::<i64>() {
                    Value::from(i)
                } else {
                    let f: f64 = text
                        .parse()
                        .map_err(|_| self.error(format!("invalid number {text:?}")))?;
                    Value::from(f)
                };
                Ok(Operand::Literal(number))
            }
            _ => {
                let rest = &self.expr[self.pos..];
                for (word, value) in [
                    ("true", Value::Bool(true)),
                    ("false", Value::Bool(false)),
                    ("null", Value::Null),
                ] {
                    if rest.starts_with(word) {
                        self.pos += word.len();
                        return Ok(Operand::Literal(value));
                    }
                }
                Err(self.error("expected '@', a string, a number or a boolean in the filter"))
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Evaluation
// ---------------------------------------------------------------------------------------------

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn eval_steps<'v>(
    steps: &[Step],
    mut current: Vec<&'v Value>,
    root: &'v Value,
) -> Result<Vec<&'v Value>, JsonPathError> {
    // After `..` the candidate set mixes objects and arrays; array-only steps skip the objects
    // there instead of failing.
    let mut after_recursion = false;
    for step in steps {
        let mut next = Vec::new();
        for value in current {
            let array = match (step, value) {
                (Step::Field(_) | Step::Fields(_) | Step::Wildcard | Step::Recursive, _) => None,
                (_, Value::Array(items)) => Some(items.as_slice()),
                (_, Value::Null) => continue,
                (_, _) if after_recursion => continue,
                (_, other) => {
                    return Err(JsonPathError::NotAnArray {
                        step: step.describe(),
                        found: type_name(other),
                    });
                }
            };
            let items: &'v [Value] = array.unwrap_or(&[]);
            match step {
                Step::Field(name) => next.extend(value.get(name.as_str())),
                Step::Fields(names) => {
                    next.extend(names.iter().filter_map(|n| value.get(n.as_str())))
                }
                Step::Wildcard => match value {
                    Value::Object(map) => next.extend(map.values()),
                    Value::Array(items) => next.extend(items.iter()),
                    _ => {}
                },
                Step::Recursive => collect_descendants(value, &mut next),
                Step::Index(i) => next.push(index(items, *i)?),
                Step::Indexes(all) => {
                    for i in all {
                        next.push(index(items, *i)?);
                    }
                }
                Step::Slice(start, end, stride) => next.extend(slice(items, *start, *end, *stride)),
                Step::Filter(filter) => {
                    for item in items {
                        if filter_matches(filter, item, root)? {
                            next.push(item);
                        }
                    }
                }
            }
        }
        after_recursion = matches!(step, Step::Recursive);
        current = next;
    }
    Ok(current)
}

/// Pre-order list of the value and its descendants that have children, as client-go collects them.
fn collect_descendants<'v>(value: &'v Value, out: &mut Vec<&'v Value>) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            out.push(value);
            for child in map.values() {
                collect_descendants(child, out);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            out.push(value);
            for child in items {
                collect_descendants(child, out);
            }
        }
        _ => {}
    }
}

fn index(items: &[Value], i: i64) -> Result<&Value, JsonPathError> {
    let len = items.len();
    let at = if i < 0 { i + len as i64 } else { i };
    usize::try_from(at)
        .ok()
        .and_then(|at| items.get(at))
        .ok_or(JsonPathError::IndexOutOfBounds { index: i, len })
}

/// Slices clamp to the array like Python's (client-go 1.20+ no longer fails past the end).
fn slice(
    items: &[Value],
    start: Option<i64>,
    end: Option<i64>,
    stride: Option<i64>,
) -> Vec<&Value> {
    let len = items.len() as i64;
    let clamp = |v: i64| if v < 0 { (v + len).max(0) } else { v.min(len) };
    let start = clamp(start.unwrap_or(0));
    let end = clamp(end.unwrap_or(len));
    // The parser rejects steps below 1.
    let stride = stride.unwrap_or(1).max(1) as usize;
    if start >= end {
        return Vec::new();
    }
    items[start as usize..end as usize]
        .iter()
        .step_by(stride)
        .collect()
}

fn operand_values<'v>(
    operand: &'v Operand,
    item: &'v Value,
    root: &'v Value,
) -> Result<Vec<&'v Value>, JsonPathError> {
    match operand {
        Operand::Literal(v) => Ok(vec![v]),
        Operand::Path { from_root, steps } => {
            let start = if *from_root { root } else { item };
            eval_steps(steps, vec![start], root)
        }
    }
}

fn filter_matches(filter: &Filter, item: &Value, root: &Value) -> Result<bool, JsonPathError> {
    let left = operand_values(&filter.left, item, root)?;
    let Some((op, right)) = &filter.comparison else {
        return Ok(!left.is_empty());
    };
    let right = operand_values(right, item, root)?;
    let (left, right) = match (left.as_slice(), right.as_slice()) {
        ([], _) | (_, []) => return Ok(false),
        ([l], [r]) => (*l, *r),
        _ => {
            return Err(JsonPathError::AmbiguousComparison {
                filter: filter.text.clone(),
            });
        }
    };
    let incomparable = || JsonPathError::IncomparableTypes {
        filter: filter.text.clone(),
        left: type_name(left),
        right: type_name(right),
    };
    let ordering = match (left, right) {
        (Value::Number(a), Value::Number(b)) => a.as_f64().partial_cmp(&b.as_f64()),
        (Value::String(a), Value::String(b)) => Some(a.cmp(b)),
        (Value::Bool(a), Value::Bool(b)) if matches!(op, Op::Eq | Op::Ne) => Some(a.cmp(b)),
        (Value::Null, _) | (_, Value::Null) if matches!(op, Op::Eq | Op::Ne) => {
            return Ok((left == right) == (*op == Op::Eq));
        }
        _ => return Err(incomparable()),
    };
    let Some(ordering) = ordering else {
        return Ok(false);
    };
    Ok(match op {
        Op::Eq => ordering.is_eq(),
        Op::Ne => ordering.is_ne(),
        Op::Lt => ordering.is_lt(),
        Op::Gt => ordering.is_gt(),
        Op::Le => ordering.is_le(),
        Op::Ge => ordering.is_ge(),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod() -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "web-0",
                "labels": {"app.kubernetes.io/name": "web", "tier": "front"},
                "annotations": {"example.com/owner": "team-a"}
            },
            "spec": {
                "replicas": 3,
                "containers": [
                    {"name": "app", "image": "nginx:1.27", "ports": [{"containerPort": 80}]},
                    {"name": "sidecar", "image": "envoy:1.30"},
                    {"name": "metrics", "image": "prom:2"}
                ]
            },
            "status": {
                "conditions": [
                    {"type": "Ready", "status": "True"},
                    {"type": "PodScheduled", "status": "True", "reason": "Scheduled"},
                    {"type": "Initialized", "status": "False"}
                ],
                "containerStatuses": [
                    {"name": "app", "restartCount": 0},
                    {"name": "sidecar", "restartCount": 4},
                    {"name": "metrics", "restartCount": 1.5}
                ]
            }
        })
    }

    #[test]
    fn expressions_select_what_kubectl_selects() {
        let cases: Vec<(&str, Value)> = vec![
            (".spec.replicas", json!([3])),
            ("{.spec.replicas}", json!([3])),
            ("{ .spec.replicas }", json!([3])),
            ("$.spec.replicas", json!([3])),
            ("spec.replicas", json!([3])),
            (".metadata.labels['app.kubernetes.io/name']", json!(["web"])),
            (".metadata.labels[\"tier\"]", json!(["front"])),
            (
                r".metadata.annotations.example\.com/owner",
                json!(["team-a"]),
            ),
            (
                ".metadata.labels['tier','app.kubernetes.io/name']",
                json!(["front", "web"]),
            ),
            (".spec.containers[0].name", json!(["app"])),
            (".spec.containers[-1].name", json!(["metrics"])),
            (
                ".spec.containers[*].name",
                json!(["app", "sidecar", "metrics"]),
            ),
            (".spec.containers[0,2].name", json!(["app", "metrics"])),
            (".spec.containers[0:2].name", json!(["app", "sidecar"])),
            (".spec.containers[1:].name", json!(["sidecar", "metrics"])),
            (".spec.containers[-2:].name", json!(["sidecar", "metrics"])),
            (".spec.containers[::2].name", json!(["app", "metrics"])),
            (
                ".spec.containers[0:10].name",
                json!(["app", "sidecar", "metrics"]),
            ),
            (".spec.containers[2:1].name", json!([])),
            (".spec.containers[0].ports[0].containerPort", json!([80])),
            ("..image", json!(["nginx:1.27", "envoy:1.30", "prom:2"])),
            ("..containerPort", json!([80])),
            (".metadata.labels.*", json!(["web", "front"])),
            (
                ".status.conditions[?(@.type==\"Ready\")].status",
                json!(["True"]),
            ),
            (
                ".status.conditions[?(@.type == 'Ready')].status",
                json!(["True"]),
            ),
            (
                ".status.conditions[?(@.status!=\"True\")].type",
                json!(["Initialized"]),
            ),
            (
                ".status.conditions[?(@.reason)].type",
                json!(["PodScheduled"]),
            ),
            (
                ".status.containerStatuses[?(@.restartCount > 1)].name",
                json!(["sidecar", "metrics"]),
            ),
            (
                ".status.containerStatuses[?(@.restartCount < 1)].name",
                json!(["app"]),
            ),
            (
                ".status.containerStatuses[?(@.restartCount >= 1.5)].name",
                json!(["sidecar", "metrics"]),
            ),
            (
                ".status.containerStatuses[?(@.restartCount <= 0)].name",
                json!(["app"]),
            ),
            (".status.conditions[?(@.missing==\"x\")].type", json!([])),
            (".spec.missing.deeper", json!([])),
            (".metadata.labels.nope", json!([])),
            (".spec", json!([pod()["spec"].clone()])),
        ];
        let obj = pod();
        for (expr, want) in cases {
            let got = evaluate(expr, &obj).unwrap_or_else(|e| panic!("{expr}: {e}"));
            assert_eq!(Value::Array(got), want, "expression {expr}");
        }
    }

    #[test]
    fn templates_mix_text_and_paths() {
        let obj = pod();
        assert_eq!(
            evaluate("{.metadata.name}/{.spec.replicas}{\"\\n\"}", &obj).unwrap(),
            vec![json!("web-0"), json!("/"), json!(3), json!("\n")]
        );
        assert_eq!(
            evaluate("  {.metadata.name}  ", &obj).unwrap(),
            vec![json!("web-0")]
        );
    }

    #[test]
    fn filters_on_scalar_lists_use_the_item_itself() {
        let obj = json!({"finalizers": ["a", "b", "a"]});
        assert_eq!(
            evaluate("{.finalizers[?(@ == 'a')]}", &obj).unwrap(),
            vec![json!("a"), json!("a")]
        );
    }

    #[test]
    fn errors_name_the_problem() {
        let obj = pod();
        let cases: Vec<(&str, JsonPathError)> = vec![
            (
                ".spec.containers[5]",
                JsonPathError::IndexOutOfBounds { index: 5, len: 3 },
            ),
            (
                ".spec.containers[-4]",
                JsonPathError::IndexOutOfBounds { index: -4, len: 3 },
            ),
            (
                ".spec.replicas[0]",
                JsonPathError::NotAnArray {
                    step: "[0]".into(),
                    found: "number",
                },
            ),
            (
                ".metadata[?(@.a)]",
                JsonPathError::NotAnArray {
                    step: "[?(@.a)]".into(),
                    found: "object",
                },
            ),
            (
                ".status.containerStatuses[?(@.name > 1)]",
                JsonPathError::IncomparableTypes {
                    filter: "@.name > 1".into(),
                    left: "string",
                    right: "number",
                },
            ),
        ];
        for (expr, want) in cases {
            assert_eq!(evaluate(expr, &obj), Err(want), "expression {expr}");
        }
        // Missing fields yield nothing, even under array steps.
        assert_eq!(evaluate(".spec.nope[*].name", &obj), Ok(vec![]));
        assert_eq!(evaluate(".spec.nope[0]", &obj), Ok(vec![]));
        for bad in [
            "{.spec",
            ".spec[",
            ".spec[?(@.a ==)]",
            ".spec['x]",
            ".spec..",
            "",
            ".spec.[0]",
            ".spec.containers[::0]",
        ] {
            assert!(
                matches!(evaluate(bad, &obj), Err(JsonPathError::Syntax { .. })),
                "{bad:?} should be a syntax error"
            );
        }
        let message = evaluate("{.spec", &obj).unwrap_err().to_string();
        assert_eq!(
            message,
            r#"invalid jsonpath "{.spec" at offset 6: expected closing '}'"#
        );
    }

    #[test]
    fn ambiguous_filter_operands_are_rejected() {
        let obj = json!({"items": [{"tags": ["a", "b"]}]});
        assert_eq!(
            evaluate(".items[?(@.tags[*] == 'a')]", &obj),
            Err(JsonPathError::AmbiguousComparison {
                filter: "@.tags[*] == 'a'".into()
            })
        );
    }

    #[test]
    fn cells_format_like_kubectl() {
        let cases: Vec<(Value, &str)> = vec![
            (json!([]), ""),
            (json!(["Running"]), "Running"),
            (json!(["a", "b"]), "a,b"),
            (json!([3]), "3"),
            (json!([1.5]), "1.5"),
            (json!([1000000.0]), "1e+06"),
            (json!([true]), "true"),
            (json!([null]), "null"),
            (json!([{"b": 1, "a": "x"}]), r#"{"a":"x","b":1}"#),
            (json!([["x", 1]]), r#"["x",1]"#),
        ];
        for (values, want) in cases {
            let Value::Array(values) = values else {
                unreachable!()
            };
            assert_eq!(format_cell(&values), want);
        }
    }

    #[test]
    fn printer_column_round_trip() {
        let obj = pod();
        let ready = evaluate(".status.conditions[?(@.type==\"Ready\")].status", &obj).unwrap();
        assert_eq!(format_cell(&ready), "True");
        let images = evaluate("{.spec.containers[*].image}", &obj).unwrap();
        assert_eq!(format_cell(&images), "nginx:1.27,envoy:1.30,prom:2");
    }
}
