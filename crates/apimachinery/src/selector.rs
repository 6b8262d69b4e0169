//! Label selectors (string form and metav1.LabelSelector) and field selectors.
//!
//! The grammar, the validation and the error wording follow `k8s.io/apimachinery/pkg/labels`
//! (`labels.Parse`, `NewRequirement`, `metav1.LabelSelectorAsSelector`) and
//! `k8s.io/apimachinery/pkg/fields` (`fields.ParseSelector`), so that a client sees the same
//! 400 messages as from kube-apiserver.

use crate::validation::{validate_label_key, validate_label_value};
use std::fmt;

use serde_json::Value;

/// Why a label or field selector was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// A label requirement is malformed or invalid (`unable to parse requirement: ...`).
    #[error("unable to parse requirement: {0}")]
    Requirement(String),
    /// The label selector string does not follow the grammar (`found ',', expected: ...`).
    #[error("{0}")]
    Syntax(String),
    /// A requirement built from a metav1.LabelSelector is invalid (key, values or their count).
    #[error("{0}")]
    Invalid(String),
    /// A metav1.LabelSelector expression has an operator other than In/NotIn/Exists/DoesNotExist.
    #[error("{} is not a valid label selector operator", go_quote(.0))]
    Operator(String),
    /// A metav1.LabelSelector object does not have the shape of one.
    #[error("invalid label selector: {0}")]
    Malformed(String),
    /// A field selector term has no `=`, `==` or `!=`.
    #[error("invalid selector: '{selector}'; can't understand '{term}'")]
    FieldTerm {
        /// The whole field selector.
        selector: String,
        /// The term that could not be split.
        term: String,
    },
    /// A field selector value has a backslash not followed by `\`, `,` or `=`.
    #[error("invalid field selector: invalid escape sequence: {0}")]
    FieldEscape(String),
    /// A field selector value has an unescaped `,` or `=`. Go prints the rune as a number.
    #[error("invalid field selector: unescaped character in value: {}", u32::from(*.0))]
    FieldUnescaped(char),
}

/// The operator of one label requirement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabelOp {
    /// `key in (a,b)`: the label exists and has one of the values.
    In,
    /// `key notin (a,b)`: the label is absent or has none of the values.
    NotIn,
    /// `key=a`.
    Equals,
    /// `key==a` (same meaning as `=`, kept apart for the canonical string).
    DoubleEquals,
    /// `key!=a`: the label is absent or has another value.
    NotEquals,
    /// `key`: the label exists.
    Exists,
    /// `!key`: the label does not exist.
    DoesNotExist,
    /// `key>3`: the label is an integer greater than the value.
    GreaterThan,
    /// `key<3`: the label is an integer less than the value.
    LessThan,
}

/// One requirement of a label selector, e.g. `env in (a,b)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelRequirement {
    /// The label key.
    pub key: String,
    /// How the label relates to the values.
    pub op: LabelOp,
    /// The values (empty for Exists / DoesNotExist).
    pub values: Vec<String>,
}

impl LabelRequirement {
    /// Builds and validates a requirement like `labels.NewRequirement` (path `key` / `values`).
    pub fn new(key: &str, op: LabelOp, values: Vec<String>) -> Result<Self, SelectorError> {
        let mut errs = Vec::new();
        if let Err(msg) = validate_label_key(key) {
            errs.push(format!("key: Invalid value: {}: {msg}", go_quote(key)));
        }
        let bad_values = |detail: &str| {
            format!(
                "values: Invalid value: {}: {detail}",
                go_string_slice(&values)
            )
        };
        match op {
            LabelOp::In | LabelOp::NotIn => {
                if values.is_empty() {
                    errs.push(bad_values(
                        "for 'in', 'notin' operators, values set can't be empty",
                    ));
                }
            }
            LabelOp::Equals | LabelOp::DoubleEquals | LabelOp::NotEquals => {
                if values.len() != 1 {
                    errs.push(bad_values(
                        "exact-match compatibility requires one single value",
                    ));
                }
            }
            LabelOp::Exists | LabelOp::DoesNotExist => {
                if !values.is_empty() {
                    errs.push(bad_values(
                        "values set must be empty for exists and does not exist",
                    ));
                }
            }
            LabelOp::GreaterThan | LabelOp::LessThan => {
                if values.len() != 1 {
                    errs.push(bad_values(
                        "for 'Gt', 'Lt' operators, exactly one value is required",
                    ));
                }
                for (i, v) in values.iter().enumerate() {
                    if v.parse::<i64>().is_err() {
                        errs.push(format!(
                            "values[{i}]: Invalid value: {}: for 'Gt', 'Lt' operators, the value must be an integer",
                            go_quote(v)
                        ));
                    }
                }
            }
        }
        for (i, v) in values.iter().enumerate() {
            if let Err(msg) = validate_label_value(v) {
                errs.push(format!(
                    "values[{i}][{key}]: Invalid value: {}: {msg}",
                    go_quote(v)
                ));
            }
        }
        if errs.is_empty() {
            Ok(LabelRequirement {
                key: key.to_string(),
                op,
                values,
            })
        } else {
            Err(SelectorError::Invalid(aggregate(errs)))
        }
    }

    /// Whether the labels given by `get` satisfy this requirement (as `Requirement.Matches`).
    pub fn matches<'a>(&self, get: &impl Fn(&str) -> Option<&'a str>) -> bool {
        let has_value = |v: &str| self.values.iter().any(|x| x == v);
        match self.op {
            LabelOp::In | LabelOp::Equals | LabelOp::DoubleEquals => {
                get(&self.key).is_some_and(has_value)
            }
            LabelOp::NotIn | LabelOp::NotEquals => !get(&self.key).is_some_and(has_value),
            LabelOp::Exists => get(&self.key).is_some(),
            LabelOp::DoesNotExist => get(&self.key).is_none(),
            LabelOp::GreaterThan | LabelOp::LessThan => {
                let Some(label) = get(&self.key).and_then(|v| v.parse::<i64>().ok()) else {
                    return false;
                };
                let [bound] = self.values.as_slice() else {
                    return false;
                };
                let Ok(bound) = bound.parse::<i64>() else {
                    return false;
                };
                if self.op == LabelOp::GreaterThan {
                    label > bound
                } else {
                    label < bound
                }
            }
        }
    }
}

impl fmt::Display for LabelRequirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.op == LabelOp::DoesNotExist {
            f.write_str("!")?;
        }
        f.write_str(&self.key)?;
        let op = match self.op {
            LabelOp::Exists | LabelOp::DoesNotExist => return Ok(()),
            LabelOp::Equals => "=",
            LabelOp::DoubleEquals => "==",
            LabelOp::NotEquals => "!=",
            LabelOp::In => " in ",
            LabelOp::NotIn => " notin ",
            LabelOp::GreaterThan => ">",
            LabelOp::LessThan => "<",
        };
        f.write_str(op)?;
        let set = matches!(self.op, LabelOp::In | LabelOp::NotIn);
        let mut values = self.values.clone();
        values.sort();
        if set {
            write!(f, "({})", values.join(","))
        } else {
            f.write_str(&values.join(","))
        }
    }
}

/// A label selector: `app=web,tier!=db,env in (a,b),env notin (c),has,!missing`.
#[derive(Clone, Debug, PartialEq)]
pub struct LabelSelector {
    /// `None` is the selector that matches nothing (a nil metav1.LabelSelector).
    requirements: Option<Vec<LabelRequirement>>,
}

impl LabelSelector {
    /// Parses the string form, as `labels.Parse` does (the empty string matches everything).
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut parser = Parser {
            tokens: lex(s),
            position: 0,
        };
        let mut requirements = parser.parse()?;
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(LabelSelector {
            requirements: Some(requirements),
        })
    }

    /// From a metav1.LabelSelector object (`{matchLabels, matchExpressions}`), as
    /// `metav1.LabelSelectorAsSelector`: absent or `null` matches nothing, `{}` everything.
    pub fn from_metav1(v: Option<&Value>) -> Result<Self, SelectorError> {
        let obj = match v {
            None | Some(Value::Null) => return Ok(Self::nothing()),
            Some(Value::Object(obj)) => obj,
            Some(other) => {
                return Err(SelectorError::Malformed(format!(
                    "expected an object, got {other}"
                )));
            }
        };
        let mut requirements = Vec::new();
        match obj.get("matchLabels") {
            None | Some(Value::Null) => {}
            Some(Value::Object(labels)) => {
                for (k, v) in labels {
                    let Some(v) = v.as_str() else {
                        return Err(SelectorError::Malformed(format!(
                            "matchLabels.{k}: expected a string, got {v}"
                        )));
                    };
                    requirements.push(LabelRequirement::new(
                        k,
                        LabelOp::Equals,
                        vec![v.to_string()],
                    )?);
                }
            }
            Some(other) => {
                return Err(SelectorError::Malformed(format!(
                    "matchLabels: expected an object, got {other}"
                )));
            }
        }
        match obj.get("matchExpressions") {
            None | Some(Value::Null) => {}
            Some(Value::Array(exprs)) => {
                for (i, expr) in exprs.iter().enumerate() {
                    requirements.push(metav1_expression(i, expr)?);
                }
            }
            Some(other) => {
                return Err(SelectorError::Malformed(format!(
                    "matchExpressions: expected an array, got {other}"
                )));
            }
        }
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(LabelSelector {
            requirements: Some(requirements),
        })
    }

    /// The selector that matches every object.
    pub fn everything() -> Self {
        LabelSelector {
            requirements: Some(Vec::new()),
        }
    }

    /// The selector that matches no object.
    pub fn nothing() -> Self {
        LabelSelector { requirements: None }
    }

    /// Whether the selector does not restrict anything (so a list need not filter).
    pub fn is_everything(&self) -> bool {
        self.requirements.as_ref().is_some_and(Vec::is_empty)
    }

    /// Whether the selector matches no object at all (the nil selector).
    pub fn is_nothing(&self) -> bool {
        self.requirements.is_none()
    }

    /// The requirements, sorted by key (empty for both everything and nothing).
    pub fn requirements(&self) -> &[LabelRequirement] {
        self.requirements.as_deref().unwrap_or_default()
    }

    /// Whether labels given by `get` (label key -> value) match.
    pub fn matches<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        match &self.requirements {
            None => false,
            Some(reqs) => reqs.iter().all(|r| r.matches(&get)),
        }
    }

    /// Convenience: match the `metadata.labels` object of a JSON object (absent labels = no labels).
    pub fn matches_object(&self, obj: &Value) -> bool {
        let labels = obj
            .get("metadata")
            .and_then(|m| m.get("labels"))
            .and_then(Value::as_object);
        self.matches(|k| labels.and_then(|l| l.get(k)).and_then(Value::as_str))
    }
}

impl fmt::Display for LabelSelector {
    /// The canonical form: requirements sorted by key, set values sorted; nothing prints as "".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements().iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

fn metav1_expression(i: usize, expr: &Value) -> Result<LabelRequirement, SelectorError> {
    let malformed = |what: &str| SelectorError::Malformed(format!("matchExpressions[{i}]: {what}"));
    let key = match expr.get("key") {
        None | Some(Value::Null) => "",
        Some(Value::String(k)) => k.as_str(),
        Some(_) => return Err(malformed("key must be a string")),
    };
    let operator = match expr.get("operator") {
        None | Some(Value::Null) => "",
        Some(Value::String(o)) => o.as_str(),
        Some(_) => return Err(malformed("operator must be a string")),
    };
    let values = match expr.get("values") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(vs)) => vs
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| malformed("values must be strings"))?,
        Some(_) => return Err(malformed("values must be an array")),
    };
    let op = match operator {
        "In" => LabelOp::In,
        "NotIn" => LabelOp::NotIn,
        "Exists" => LabelOp::Exists,
        "DoesNotExist" => LabelOp::DoesNotExist,
        other => return Err(SelectorError::Operator(other.to_string())),
    };
    LabelRequirement::new(key, op, values)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Token {
    EndOfString,
    ClosedPar,
    Comma,
    DoesNotExist,
    DoubleEquals,
    Equals,
    GreaterThan,
    Identifier,
    In,
    LessThan,
    NotEquals,
    NotIn,
    OpenPar,
}

/// Whether the lexer may read a word as a value, where `in`/`notin` are plain identifiers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Context {
    KeyAndOperator,
    Values,
}

fn keyword(s: &str) -> Option<Token> {
    Some(match s {
        ")" => Token::ClosedPar,
        "," => Token::Comma,
        "!" => Token::DoesNotExist,
        "==" => Token::DoubleEquals,
        "=" => Token::Equals,
        ">" => Token::GreaterThan,
        "in" => Token::In,
        "<" => Token::LessThan,
        "!=" => Token::NotEquals,
        "notin" => Token::NotIn,
        "(" => Token::OpenPar,
        _ => return None,
    })
}

fn is_whitespace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

fn is_special(b: u8) -> bool {
    matches!(b, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<')
}

/// Splits a label selector into tokens the way the Go lexer does: a run of operator
/// characters is cut after its longest prefix that is an operator.
fn lex(s: &str) -> Vec<(Token, String)> {
    let bytes = s.as_bytes();
    let mut pos = 0;
    let mut out = Vec::new();
    loop {
        // Go's lexer treats a NUL byte as the end of the input.
        while pos < bytes.len() && is_whitespace(bytes[pos]) {
            pos += 1;
        }
        if pos >= bytes.len() || bytes[pos] == 0 {
            out.push((Token::EndOfString, String::new()));
            return out;
        }
        let start = pos;
        if is_special(bytes[pos]) {
            // Every single operator character is a token, so this always finds one.
            let mut best = (Token::EndOfString, start + 1);
            while pos < bytes.len() && is_special(bytes[pos]) {
                pos += 1;
                match keyword(&s[start..pos]) {
                    Some(tok) => best = (tok, pos),
                    None => break,
                }
            }
            pos = best.1;
            out.push((best.0, s[start..pos].to_string()));
        } else {
            while pos < bytes.len()
                && bytes[pos] != 0
                && !is_special(bytes[pos])
                && !is_whitespace(bytes[pos])
            {
                pos += 1;
            }
            let word = &s[start..pos];
            let tok = match keyword(word) {
                Some(tok) => tok,
                None => Token::Identifier,
            };
            out.push((tok, word.to_string()));
        }
    }
}

struct Parser {
    tokens: Vec<(Token, String)>,
    position: usize,
}

impl Parser {
    fn lookahead(&self, ctx: Context) -> (Token, String) {
        let (tok, lit) = &self.tokens[self.position.min(self.tokens.len() - 1)];
        (Self::in_context(*tok, ctx), lit.clone())
    }

    fn consume(&mut self, ctx: Context) -> (Token, String) {
        let item = self.lookahead(ctx);
        self.position += 1;
        item
    }

    fn in_context(tok: Token, ctx: Context) -> Token {
        match tok {
            Token::In | Token::NotIn if ctx == Context::Values => Token::Identifier,
            other => other,
        }
    }

    fn parse(&mut self) -> Result<Vec<LabelRequirement>, SelectorError> {
        let mut requirements = Vec::new();
        loop {
            let (tok, lit) = self.lookahead(Context::Values);
            match tok {
                Token::Identifier | Token::DoesNotExist => {
                    let r = self.parse_requirement().map_err(|e| {
                        SelectorError::Requirement(match e {
                            SelectorError::Syntax(m) | SelectorError::Invalid(m) => m,
                            other => other.to_string(),
                        })
                    })?;
                    requirements.push(r);
                    let (t, l) = self.consume(Context::Values);
                    match t {
                        Token::EndOfString => return Ok(requirements),
                        Token::Comma => {
                            let (t2, l2) = self.lookahead(Context::Values);
                            if t2 != Token::Identifier && t2 != Token::DoesNotExist {
                                return Err(SelectorError::Syntax(format!(
                                    "found '{l2}', expected: identifier after ','"
                                )));
                            }
                        }
                        _ => {
                            return Err(SelectorError::Syntax(format!(
                                "found '{l}', expected: ',' or 'end of string'"
                            )));
                        }
                    }
                }
                Token::EndOfString => return Ok(requirements),
                _ => {
                    return Err(SelectorError::Syntax(format!(
                        "found '{lit}', expected: !, identifier, or 'end of string'"
                    )));
                }
            }
        }
    }

    fn parse_requirement(&mut self) -> Result<LabelRequirement, SelectorError> {
        let (key, inferred) = self.parse_key_and_infer_operator()?;
        if let Some(op) = inferred {
            return LabelRequirement::new(&key, op, Vec::new());
        }
        let op = self.parse_operator()?;
        let mut values = match op {
            LabelOp::In | LabelOp::NotIn => self.parse_values()?,
            _ => self.parse_exact_value()?,
        };
        // Go collects values in a sorted set.
        values.sort();
        values.dedup();
        LabelRequirement::new(&key, op, values)
    }

    fn parse_key_and_infer_operator(&mut self) -> Result<(String, Option<LabelOp>), SelectorError> {
        let (mut tok, mut lit) = self.consume(Context::Values);
        let negated = tok == Token::DoesNotExist;
        if negated {
            (tok, lit) = self.consume(Context::Values);
        }
        if tok != Token::Identifier {
            return Err(SelectorError::Syntax(format!(
                "found '{lit}', expected: identifier"
            )));
        }
        if let Err(msg) = validate_label_key(&lit) {
            // The parser validates the key with a nil field path, which Go prints as <nil>.
            return Err(SelectorError::Syntax(format!(
                "<nil>: Invalid value: {}: {msg}",
                go_quote(&lit)
            )));
        }
        let (next, _) = self.lookahead(Context::Values);
        let op = if negated {
            Some(LabelOp::DoesNotExist)
        } else if matches!(next, Token::EndOfString | Token::Comma) {
            Some(LabelOp::Exists)
        } else {
            None
        };
        Ok((lit, op))
    }

    fn parse_operator(&mut self) -> Result<LabelOp, SelectorError> {
        let (tok, lit) = self.consume(Context::KeyAndOperator);
        Ok(match tok {
            Token::In => LabelOp::In,
            Token::Equals => LabelOp::Equals,
            Token::DoubleEquals => LabelOp::DoubleEquals,
            Token::GreaterThan => LabelOp::GreaterThan,
            Token::LessThan => LabelOp::LessThan,
            Token::NotIn => LabelOp::NotIn,
            Token::NotEquals => LabelOp::NotEquals,
            _ => {
                return Err(SelectorError::Syntax(format!(
                    "found '{lit}', expected: in, notin, =, ==, !=, gt, lt"
                )));
            }
        })
    }

    fn parse_values(&mut self) -> Result<Vec<String>, SelectorError> {
        let (tok, lit) = self.consume(Context::Values);
        if tok != Token::OpenPar {
            return Err(SelectorError::Syntax(format!(
                "found '{lit}' expected: '('"
            )));
        }
        let (tok, lit) = self.lookahead(Context::Values);
        match tok {
            Token::Identifier | Token::Comma => {
                let values = self.parse_identifiers_list()?;
                let (tok, _) = self.consume(Context::Values);
                if tok != Token::ClosedPar {
                    return Err(SelectorError::Syntax(format!(
                        "found '{lit}', expected: ')'"
                    )));
                }
                Ok(values)
            }
            Token::ClosedPar => {
                self.consume(Context::Values);
                Ok(vec![String::new()])
            }
            _ => Err(SelectorError::Syntax(format!(
                "found '{lit}', expected: ',', ')' or identifier"
            ))),
        }
    }

    /// A list of possibly empty values: `(a,,b)` and `(,a)` hold the empty value.
    fn parse_identifiers_list(&mut self) -> Result<Vec<String>, SelectorError> {
        let mut values: Vec<String> = Vec::new();
        loop {
            let (tok, lit) = self.consume(Context::Values);
            match tok {
                Token::Identifier => {
                    values.push(lit);
                    let (tok2, lit2) = self.lookahead(Context::Values);
                    match tok2 {
                        Token::Comma => continue,
                        Token::ClosedPar => return Ok(values),
                        _ => {
                            return Err(SelectorError::Syntax(format!(
                                "found '{lit2}', expected: ',' or ')'"
                            )));
                        }
                    }
                }
                Token::Comma => {
                    if values.is_empty() {
                        values.push(String::new());
                    }
                    let (tok2, _) = self.lookahead(Context::Values);
                    if tok2 == Token::ClosedPar {
                        values.push(String::new());
                        return Ok(values);
                    }
                    if tok2 == Token::Comma {
                        values.push(String::new());
                    }
                }
                _ => {
                    return Err(SelectorError::Syntax(format!(
                        "found '{lit}', expected: ',', or identifier"
                    )));
                }
            }
        }
    }

    fn parse_exact_value(&mut self) -> Result<Vec<String>, SelectorError> {
        let (tok, _) = self.lookahead(Context::Values);
        if matches!(tok, Token::EndOfString | Token::Comma) {
            return Ok(vec![String::new()]);
        }
        let (tok, lit) = self.consume(Context::Values);
        if tok == Token::Identifier {
            Ok(vec![lit])
        } else {
            Err(SelectorError::Syntax(format!(
                "found '{lit}', expected: identifier"
            )))
        }
    }
}

/// The operator of a field requirement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldOp {
    /// `field=value` or `field==value`.
    Equals,
    /// `field!=value`.
    NotEquals,
}

/// One term of a field selector, with its value unescaped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldRequirement {
    /// The field path, e.g. `metadata.name` (not validated here: each resource knows its own).
    pub field: String,
    /// Equality or inequality.
    pub op: FieldOp,
    /// The value, unescaped.
    pub value: String,
}

impl fmt::Display for FieldRequirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match self.op {
            FieldOp::Equals => "=",
            FieldOp::NotEquals => "!=",
        };
        write!(f, "{}{op}{}", self.field, escape_field_value(&self.value))
    }
}

/// A field selector: `metadata.name=foo,status.phase!=Running`.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct FieldSelector {
    requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    /// Parses the string form as `fields.ParseSelector` does: terms split on unescaped
    /// commas, sorted, each split at its first operator; `\,` `\=` `\\` escape the value.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut terms = split_field_terms(s);
        terms.sort();
        let mut requirements = Vec::new();
        for term in terms.into_iter().filter(|t| !t.is_empty()) {
            let Some((field, op, raw)) = split_field_term(term) else {
                return Err(SelectorError::FieldTerm {
                    selector: s.to_string(),
                    term: term.to_string(),
                });
            };
            let value = unescape_field_value(raw)?;
            // kube's term Transform turns a term with neither field nor value into Everything.
            if field.is_empty() && value.is_empty() {
                continue;
            }
            requirements.push(FieldRequirement {
                field: field.to_string(),
                op,
                value,
            });
        }
        Ok(FieldSelector { requirements })
    }

    /// The selector that matches every object.
    pub fn everything() -> Self {
        FieldSelector::default()
    }

    /// The terms, in their canonical (sorted) order.
    pub fn requirements(&self) -> &[FieldRequirement] {
        &self.requirements
    }

    /// Whether the fields given by `get` match; an absent field reads as "".
    pub fn matches<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.requirements.iter().all(|r| {
            let actual = get(&r.field).unwrap_or("");
            match r.op {
                FieldOp::Equals => actual == r.value,
                FieldOp::NotEquals => actual != r.value,
            }
        })
    }

    /// Whether the selector does not restrict anything.
    pub fn is_everything(&self) -> bool {
        self.requirements.is_empty()
    }
}

impl fmt::Display for FieldSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

/// Splits on commas not escaped by a backslash (the backslash stays for unescaping later).
fn split_field_terms(s: &str) -> Vec<&str> {
    if s.is_empty() {
        return Vec::new();
    }
    let mut terms = Vec::new();
    let mut start = 0;
    let mut in_slash = false;
    for (i, c) in s.char_indices() {
        if in_slash {
            in_slash = false;
        } else if c == '\\' {
            in_slash = true;
        } else if c == ',' {
            terms.push(&s[start..i]);
            start = i + 1;
        }
    }
    terms.push(&s[start..]);
    terms
}

/// Splits a term at the first operator; `!=` and `==` are tried before `=` at each position.
fn split_field_term(term: &str) -> Option<(&str, FieldOp, &str)> {
    for (i, _) in term.char_indices() {
        let rest = &term[i..];
        for (op, kind) in [
            ("!=", FieldOp::NotEquals),
            ("==", FieldOp::Equals),
            ("=", FieldOp::Equals),
        ] {
            if let Some(value) = rest.strip_prefix(op) {
                return Some((&term[..i], kind, value));
            }
        }
    }
    None
}

fn unescape_field_value(s: &str) -> Result<String, SelectorError> {
    let mut out = String::with_capacity(s.len());
    let mut in_slash = false;
    for c in s.chars() {
        if in_slash {
            match c {
                '\\' | ',' | '=' => out.push(c),
                _ => return Err(SelectorError::FieldEscape(format!("\\{c}"))),
            }
            in_slash = false;
            continue;
        }
        match c {
            '\\' => in_slash = true,
            ',' | '=' => return Err(SelectorError::FieldUnescaped(c)),
            _ => out.push(c),
        }
    }
    if in_slash {
        return Err(SelectorError::FieldEscape("\\".to_string()));
    }
    Ok(out)
}

fn escape_field_value(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace(',', "\\,")
        .replace('=', "\\=")
}

/// `utilerrors.NewAggregate(...).Error()`: one message alone, several in brackets.
fn aggregate(mut errs: Vec<String>) -> String {
    let mut seen = std::collections::HashSet::new();
    errs.retain(|e| seen.insert(e.clone()));
    if errs.len() == 1 {
        errs.remove(0)
    } else {
        format!("[{}]", errs.join(", "))
    }
}

/// Go's `%q` for the strings that appear in selectors and names.
pub(crate) fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Go's `%#v` of a `[]string` (a nil and an empty slice look alike to us: both print as nil).
fn go_string_slice(values: &[String]) -> String {
    if values.is_empty() {
        return "[]string(nil)".to_string();
    }
    let items: Vec<String> = values.iter().map(|v| go_quote(v)).collect();
    format!("[]string{{{}}}", items.join(", "))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;

    const NAME_PART_REGEX: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
    const VALUE_REGEX: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_valid_label_selectors_to_canonical_form() {
        let cases = [
            ("", ""),
            ("   ", ""),
            ("x=a", "x=a"),
            ("x==a", "x==a"),
            ("x!=a", "x!=a"),
            ("  x  =  a  ", "x=a"),
            ("x=", "x="),
            ("x in (b,a,a)", "x in (a,b)"),
            ("x notin (c)", "x notin (c)"),
            ("has", "has"),
            ("!missing", "!missing"),
            ("! missing", "!missing"),
            ("z=1,a=2", "a=2,z=1"),
            (
                "x in (foo,,baz),y,z notin ()",
                "x in (,baz,foo),y,z notin ()",
            ),
            ("x in (,a)", "x in (,a)"),
            ("x>1,y<10", "x>1,y<10"),
            ("example.com/app=web", "example.com/app=web"),
            ("in in (in,notin)", "in in (in,notin)"),
            ("app=web,tier!=db,!missing", "app=web,!missing,tier!=db"),
            ("a.b-c_d=A.b-1_2", "a.b-c_d=A.b-1_2"),
        ];
        for (input, canonical) in cases {
            let sel = LabelSelector::parse(input)
                .unwrap_or_else(|e| panic!("parsing {input:?} failed: {e}"));
            assert_eq!(sel.to_string(), canonical, "canonical form of {input:?}");
            assert_eq!(
                sel.is_everything(),
                canonical.is_empty(),
                "is_everything of {input:?}"
            );
            // The canonical form parses back to the same selector.
            assert_eq!(LabelSelector::parse(canonical).unwrap(), sel, "{input:?}");
        }
    }

    #[test]
    fn rejects_invalid_label_selectors_with_kube_messages() {
        let long = "a".repeat(64);
        let cases: Vec<(String, String)> = vec![
            ("x=a,".into(), "found '', expected: identifier after ','".into()),
            ("x=a b".into(), "found 'b', expected: ',' or 'end of string'".into()),
            ("x=a=b".into(), "found '=', expected: ',' or 'end of string'".into()),
            ("=a".into(), "found '=', expected: !, identifier, or 'end of string'".into()),
            (",".into(), "found ',', expected: !, identifier, or 'end of string'".into()),
            ("x in a".into(), "unable to parse requirement: found 'a' expected: '('".into()),
            ("x in (a".into(), "unable to parse requirement: found '', expected: ',' or ')'".into()),
            ("x in (a b)".into(), "unable to parse requirement: found 'b', expected: ',' or ')'".into()),
            ("x in (=)".into(), "unable to parse requirement: found '=', expected: ',', ')' or identifier".into()),
            (
                "x (a)".into(),
                "unable to parse requirement: found '(', expected: in, notin, =, ==, !=, gt, lt".into(),
            ),
            (
                "a b=c".into(),
                "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt".into(),
            ),
            ("x=(".into(), "unable to parse requirement: found '(', expected: identifier".into()),
            ("!".into(), "unable to parse requirement: found '', expected: identifier".into()),
            (
                "x>a".into(),
                "unable to parse requirement: values[0]: Invalid value: \"a\": for 'Gt', 'Lt' operators, the value must be an integer".into(),
            ),
            (
                // As in kube: the value must also be a valid label value, so no negative bound.
                "x>-3".into(),
                format!("unable to parse requirement: values[0][x]: Invalid value: \"-3\": {VALUE_REGEX}"),
            ),
            (
                "-bad=x".into(),
                format!("unable to parse requirement: <nil>: Invalid value: \"-bad\": {NAME_PART_REGEX}"),
            ),
            (
                format!("{long}=x"),
                format!("unable to parse requirement: <nil>: Invalid value: \"{long}\": name part must be no more than 63 characters"),
            ),
            (
                "a/b/c".into(),
                "unable to parse requirement: <nil>: Invalid value: \"a/b/c\": a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')".into(),
            ),
            (
                "Example.com/x".into(),
                "unable to parse requirement: <nil>: Invalid value: \"Example.com/x\": prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')".into(),
            ),
            (
                "/x".into(),
                "unable to parse requirement: <nil>: Invalid value: \"/x\": prefix part must be non-empty".into(),
            ),
            (
                "x=a/b".into(),
                format!("unable to parse requirement: values[0][x]: Invalid value: \"a/b\": {VALUE_REGEX}"),
            ),
            (
                format!("x={long}"),
                format!("unable to parse requirement: values[0][x]: Invalid value: \"{long}\": must be no more than 63 characters"),
            ),
        ];
        for (input, message) in cases {
            match LabelSelector::parse(&input) {
                Ok(sel) => panic!("{input:?} parsed as {sel}, expected error {message}"),
                Err(e) => assert_eq!(e.to_string(), message, "error for {input:?}"),
            }
        }
    }

    #[test]
    fn label_selectors_match_like_kube() {
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], bool);
        let cases: &[Case] = &[
            ("", &[], true),
            ("", &[("a", "b")], true),
            ("app=web", &[("app", "web")], true),
            ("app==web", &[("app", "web")], true),
            ("app=web", &[("app", "db")], false),
            ("app=web", &[], false),
            ("app=", &[("app", "")], true),
            ("app=", &[], false),
            ("app!=web", &[("app", "db")], true),
            ("app!=web", &[], true),
            ("app!=web", &[("app", "web")], false),
            ("env in (a,b)", &[("env", "b")], true),
            ("env in (a,b)", &[("env", "c")], false),
            ("env in (a,b)", &[], false),
            ("env in (,a)", &[("env", "")], true),
            ("env notin (c)", &[("env", "a")], true),
            ("env notin (c)", &[], true),
            ("env notin (c)", &[("env", "c")], false),
            ("has", &[("has", "")], true),
            ("has", &[("other", "x")], false),
            ("!missing", &[], true),
            ("!missing", &[("missing", "x")], false),
            ("n>5", &[("n", "6")], true),
            ("n>5", &[("n", "5")], false),
            ("n>5", &[("n", "many")], false),
            ("n>5", &[], false),
            ("n<5", &[("n", "-1")], true),
            ("n<5", &[("n", "5")], false),
            ("app=web,tier!=db", &[("app", "web"), ("tier", "fe")], true),
            ("app=web,tier!=db", &[("app", "web"), ("tier", "db")], false),
        ];
        for (selector, pairs, expected) in cases {
            let sel = LabelSelector::parse(selector).unwrap();
            let ls = labels(pairs);
            assert_eq!(
                sel.matches(|k| ls.get(k).map(String::as_str)),
                *expected,
                "{selector:?} against {pairs:?}"
            );
        }
    }

    #[test]
    fn matches_object_reads_metadata_labels() {
        let sel = LabelSelector::parse("app=web").unwrap();
        assert!(sel.matches_object(&json!({"metadata": {"labels": {"app": "web"}}})));
        assert!(!sel.matches_object(&json!({"metadata": {"labels": {"app": "db"}}})));
        assert!(!sel.matches_object(&json!({"metadata": {"name": "x"}})));
        assert!(
            LabelSelector::parse("!app")
                .unwrap()
                .matches_object(&json!({}))
        );
        assert!(!LabelSelector::nothing().matches_object(&json!({"metadata": {}})));
        assert!(LabelSelector::everything().matches_object(&json!({})));
    }

    #[test]
    fn converts_metav1_label_selectors() {
        let cases = [
            (json!({}), ""),
            (json!({"matchLabels": {"b": "2", "a": "1"}}), "a=1,b=2"),
            (json!({"matchLabels": null, "matchExpressions": null}), ""),
            (
                json!({"matchExpressions": [
                    {"key": "env", "operator": "In", "values": ["b", "a"]},
                    {"key": "tier", "operator": "NotIn", "values": ["db"]},
                    {"key": "has", "operator": "Exists"},
                    {"key": "gone", "operator": "DoesNotExist", "values": []},
                ]}),
                "env in (a,b),!gone,has,tier notin (db)",
            ),
            (
                json!({"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "app", "operator": "Exists"}]}),
                "app=web,app",
            ),
        ];
        for (obj, canonical) in cases {
            let sel = LabelSelector::from_metav1(Some(&obj)).unwrap();
            assert_eq!(sel.to_string(), canonical, "{obj}");
            assert!(!sel.is_nothing(), "{obj}");
        }
        let everything = LabelSelector::from_metav1(Some(&json!({}))).unwrap();
        assert!(everything.is_everything());
        assert!(everything.matches(|_| None));
        for nil in [None, Some(&Value::Null)] {
            let sel = LabelSelector::from_metav1(nil).unwrap();
            assert!(sel.is_nothing() && !sel.is_everything());
            assert!(!sel.matches(|_| None));
            assert!(!sel.matches(|_| Some("x")));
        }
    }

    #[test]
    fn rejects_invalid_metav1_label_selectors() {
        let cases = [
            (
                json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}),
                "\"Gt\" is not a valid label selector operator".to_string(),
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "In"}]}),
                "values: Invalid value: []string(nil): for 'in', 'notin' operators, values set can't be empty".to_string(),
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}),
                "values: Invalid value: []string{\"x\"}: values set must be empty for exists and does not exist".to_string(),
            ),
            (
                json!({"matchLabels": {"a b": "x"}}),
                format!("key: Invalid value: \"a b\": {NAME_PART_REGEX}"),
            ),
            (
                json!({"matchLabels": {"a": "x y"}}),
                format!("values[0][a]: Invalid value: \"x y\": {VALUE_REGEX}"),
            ),
            (
                json!({"matchExpressions": [{"key": "", "operator": "NotIn", "values": []}]}),
                format!("[key: Invalid value: \"\": name part must be non-empty; {NAME_PART_REGEX}, values: Invalid value: []string(nil): for 'in', 'notin' operators, values set can't be empty]"),
            ),
            (
                json!({"matchLabels": {"a": 1}}),
                "invalid label selector: matchLabels.a: expected a string, got 1".to_string(),
            ),
            (
                json!({"matchExpressions": {}}),
                "invalid label selector: matchExpressions: expected an array, got {}".to_string(),
            ),
            (
                json!("app=web"),
                "invalid label selector: expected an object, got \"app=web\"".to_string(),
            ),
        ];
        for (obj, message) in cases {
            let err = LabelSelector::from_metav1(Some(&obj)).unwrap_err();
            assert_eq!(err.to_string(), message, "{obj}");
        }
    }

    #[test]
    fn parses_field_selectors() {
        let eq = |f: &str, v: &str| FieldRequirement {
            field: f.into(),
            op: FieldOp::Equals,
            value: v.into(),
        };
        let ne = |f: &str, v: &str| FieldRequirement {
            field: f.into(),
            op: FieldOp::NotEquals,
            value: v.into(),
        };
        let cases = [
            ("", vec![], ""),
            (",", vec![], ""),
            (
                "metadata.name=foo",
                vec![eq("metadata.name", "foo")],
                "metadata.name=foo",
            ),
            (
                "metadata.name==foo",
                vec![eq("metadata.name", "foo")],
                "metadata.name=foo",
            ),
            (
                "status.phase!=Running,metadata.name=foo",
                vec![eq("metadata.name", "foo"), ne("status.phase", "Running")],
                "metadata.name=foo,status.phase!=Running",
            ),
            ("a=", vec![eq("a", "")], "a="),
            ("a=b\\,c", vec![eq("a", "b,c")], "a=b\\,c"),
            ("a=b\\=c", vec![eq("a", "b=c")], "a=b\\=c"),
            ("a=x\\\\", vec![eq("a", "x\\")], "a=x\\\\"),
            (
                "a!=b\\,c,d=e",
                vec![ne("a", "b,c"), eq("d", "e")],
                "a!=b\\,c,d=e",
            ),
            ("a=b c", vec![eq("a", "b c")], "a=b c"),
            ("=", vec![], ""),
            ("!=,a=b", vec![eq("a", "b")], "a=b"),
            ("=x", vec![eq("", "x")], "=x"),
        ];
        for (input, reqs, canonical) in cases {
            let sel = FieldSelector::parse(input)
                .unwrap_or_else(|e| panic!("parsing {input:?} failed: {e}"));
            assert_eq!(sel.requirements(), reqs.as_slice(), "{input:?}");
            assert_eq!(sel.to_string(), canonical, "{input:?}");
            assert_eq!(sel.is_everything(), reqs.is_empty(), "{input:?}");
        }
    }

    #[test]
    fn rejects_invalid_field_selectors() {
        let cases = [
            ("a", "invalid selector: 'a'; can't understand 'a'"),
            ("x=y,a", "invalid selector: 'x=y,a'; can't understand 'a'"),
            (
                "a=b=c",
                "invalid field selector: unescaped character in value: 61",
            ),
            (
                "a=b\\x",
                "invalid field selector: invalid escape sequence: \\x",
            ),
            (
                "a=b\\",
                "invalid field selector: invalid escape sequence: \\",
            ),
        ];
        for (input, message) in cases {
            let err = FieldSelector::parse(input).unwrap_err();
            assert_eq!(err.to_string(), message, "{input:?}");
        }
    }

    #[test]
    fn field_selectors_match_with_absent_fields_empty() {
        let fields: BTreeMap<&str, &str> =
            [("metadata.name", "foo"), ("status.phase", "Running")].into();
        let get = |k: &str| fields.get(k).copied();
        let cases = [
            ("", true),
            ("metadata.name=foo", true),
            ("metadata.name=bar", false),
            ("metadata.name!=bar", true),
            ("status.phase!=Running", false),
            ("metadata.name=foo,status.phase=Running", true),
            ("metadata.name=foo,status.phase=Pending", false),
            ("spec.nodeName=", true),
            ("spec.nodeName!=", false),
            ("spec.nodeName!=n1", true),
        ];
        for (input, expected) in cases {
            let sel = FieldSelector::parse(input).unwrap();
            assert_eq!(sel.matches(get), expected, "{input:?}");
        }
    }
}
