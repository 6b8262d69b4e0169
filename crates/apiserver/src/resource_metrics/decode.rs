//! Kubelet's `/metrics/resource` text, decoded into one node's batch as metrics-server decodes
//! it: the node's and each container's cumulative CPU, working set and sample time, and each
//! container's start time; a node or pod with a missing or zero value is left out whole.
//!
//! Written by hand: the one small crate for the Prometheus text format, prometheus-parse 0.2,
//! brings itertools 0.12 next to the 0.15 already in the tree (a second version `cargo deny`
//! refuses) and reads a label set with a regular expression that ends it at the first `}`,
//! even one inside a quoted value; openmetrics-parser is LGPL. Only sample lines matter here
//! (a name, an optional label set of quoted values, a value, an optional timestamp in ms), so
//! the reader is a few dozen lines.

use std::collections::BTreeMap;

/// A line of the text format that is not a sample, a comment or blank.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}")]
pub struct DecodeError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong with it.
    #[source]
    pub what: LineError,
}

/// What makes a line neither a sample, a comment nor blank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    /// The line starts with no metric name.
    #[error("no metric name")]
    NoName,
    /// A label set has no closing `}`.
    #[error("unterminated label set")]
    UnterminatedLabelSet,
    /// A label in a label set has no name.
    #[error("no label name")]
    NoLabelName,
    /// A label name is not followed by `=`.
    #[error("no `=` after a label name")]
    NoEquals,
    /// A label value does not start with `"`.
    #[error("label value not quoted")]
    UnquotedValue,
    /// A label value has an escape other than `\n`, `\\` or `\"`.
    #[error("bad escape in a label value")]
    BadEscape,
    /// A label value has no closing `"`.
    #[error("unterminated label value")]
    UnterminatedValue,
    /// A label value is followed by neither `,` nor `}`.
    #[error("no `,` or `}}` after a label value")]
    NoSeparator,
    /// The name or label set runs into the value.
    #[error("no space before the value")]
    NoSpace,
    /// The value is not a float.
    #[error("value is not a number")]
    BadValue,
    /// The timestamp is not an integer.
    #[error("timestamp is not an integer")]
    BadTimestamp,
    /// Something follows the timestamp.
    #[error("text after the timestamp")]
    TrailingText,
}

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample<'a> {
    /// Metric name.
    pub name: &'a str,
    /// Label names and (unescaped) values, in the order written.
    pub labels: Vec<(&'a str, String)>,
    /// Value.
    pub value: f64,
    /// Timestamp, ms since the epoch, if written.
    pub timestamp_ms: Option<i64>,
}

impl Sample<'_> {
    fn label(&self, name: &str) -> &str {
        self.labels
            .iter()
            .find(|(n, _)| *n == name)
            .map_or("", |(_, v)| v.as_str())
    }
}

/// Reads one line: None for a comment or a blank line.
pub fn parse_line(text: &str) -> Result<Option<Sample<'_>>, LineError> {
    let text = text.trim();
    if text.is_empty() || text.starts_with('#') {
        return Ok(None);
    }
    let name_end = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(text.len());
    let (name, mut rest) = text.split_at(name_end);
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(LineError::NoName);
    }
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        rest = after;
        loop {
            rest = rest.trim_start();
            if let Some(after) = rest.strip_prefix('}') {
                rest = after;
                break;
            }
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .ok_or(LineError::UnterminatedLabelSet)?;
            let (label, after) = rest.split_at(end);
            if label.is_empty() {
                return Err(LineError::NoLabelName);
            }
            let after = after
                .trim_start()
                .strip_prefix('=')
                .ok_or(LineError::NoEquals)?;
            let after = after
                .trim_start()
                .strip_prefix('"')
                .ok_or(LineError::UnquotedValue)?;
            let (value, after) = quoted(after)?;
            labels.push((label, value));
            rest = after.trim_start();
            if let Some(after) = rest.strip_prefix(',') {
                rest = after;
            } else if !rest.starts_with('}') {
                return Err(LineError::NoSeparator);
            }
        }
    }
    if !rest.starts_with(char::is_whitespace) {
        return Err(LineError::NoSpace);
    }
    let mut words = rest.split_whitespace();
    let value = words
        .next()
        .and_then(|v| v.parse::<f64>().ok())
        .ok_or(LineError::BadValue)?;
    let timestamp_ms = match words.next() {
        Some(t) => Some(t.parse::<i64>().map_err(|_| LineError::BadTimestamp)?),
        None => None,
    };
    if words.next().is_some() {
        return Err(LineError::TrailingText);
    }
    Ok(Some(Sample {
        name,
        labels,
        value,
        timestamp_ms,
    }))
}

/// The value of a quoted label (after its opening quote) and the text after its closing one.
fn quoted(text: &str) -> Result<(String, &str), LineError> {
    let mut value = String::new();
    let mut chars = text.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Ok((value, &text[i + 1..])),
            '\\' => match chars.next() {
                Some((_, 'n')) => value.push('\n'),
                Some((_, c @ ('\\' | '"'))) => value.push(c),
                _ => return Err(LineError::BadEscape),
            },
            c => value.push(c),
        }
    }
    Err(LineError::UnterminatedValue)
}

/// A cumulative CPU counter and a working set, read at one time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Point {
    /// Sample time, ms since the epoch.
    pub at_ms: i64,
    /// Cumulative CPU, core-nanoseconds.
    pub cpu_ns: u64,
    /// Working set, bytes.
    pub memory: u64,
}

/// One container's point and when the container started (ms since the epoch).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ContainerPoint {
    /// Usage.
    pub point: Point,
    /// Start time, if reported.
    pub start_ms: Option<i64>,
}

/// A pod: namespace and name.
pub type PodKey = (String, String);

/// What one kubelet reported.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    /// The node's usage, if complete.
    pub node: Option<Point>,
    /// Each pod whose containers all reported CPU and memory, by container name.
    pub pods: Pods,
}

/// Containers by pod, then by name.
pub type Pods = BTreeMap<PodKey, BTreeMap<String, ContainerPoint>>;

/// The entry of the container a sample names.
fn container<'p>(pods: &'p mut Pods, s: &Sample<'_>) -> &'p mut ContainerPoint {
    let key = (s.label("namespace").to_string(), s.label("pod").to_string());
    pods.entry(key)
        .or_default()
        .entry(s.label("container").to_string())
        .or_default()
}

/// Decodes `/metrics/resource`; samples without a timestamp are taken at `now_ms`.
pub fn decode(text: &str, now_ms: i64) -> Result<Batch, DecodeError> {
    let mut node = Point::default();
    let mut pods = Pods::new();
    for (i, line) in text.lines().enumerate() {
        let sample = parse_line(line).map_err(|what| DecodeError { line: i + 1, what })?;
        let Some(s) = sample else { continue };
        let at = s.timestamp_ms.unwrap_or(now_ms);
        // Values are converted as metrics-server converts them (Go's float-to-uint truncation).
        match s.name {
            "node_cpu_usage_seconds_total" => {
                node.cpu_ns = (s.value * 1e9) as u64;
                node.at_ms = at;
            }
            "node_memory_working_set_bytes" => {
                node.memory = s.value as u64;
                node.at_ms = at;
            }
            "container_cpu_usage_seconds_total" => {
                let c = container(&mut pods, &s);
                c.point.cpu_ns = (s.value * 1e9) as u64;
                c.point.at_ms = at;
            }
            "container_memory_working_set_bytes" => {
                let c = container(&mut pods, &s);
                c.point.memory = s.value as u64;
                c.point.at_ms = at;
            }
            "container_start_time_seconds" => {
                container(&mut pods, &s).start_ms = Some((s.value * 1e3) as i64);
            }
            _ => {}
        }
    }
    let complete = |p: &Point| p.at_ms != 0 && p.cpu_ns != 0 && p.memory != 0;
    pods.retain(|_, containers| {
        containers.retain(|_, c| *c != ContainerPoint::default());
        !containers.is_empty() && containers.values().all(|c| complete(&c.point))
    });
    Ok(Batch {
        node: complete(&node).then_some(node),
        pods,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a kubelet 1.32 serves (comments abridged).
    const KUBELET: &str = r#"# HELP container_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the container in core-seconds
# TYPE container_cpu_usage_seconds_total counter
container_cpu_usage_seconds_total{container="coredns",namespace="kube-system",pod="coredns-55cb58b774-2lm6t"} 1.230457 1700000001000
container_cpu_usage_seconds_total{container="web",namespace="demo",pod="web-1"} 0.5 1700000001500
# HELP container_memory_working_set_bytes [STABLE] Current working set of the container in bytes
# TYPE container_memory_working_set_bytes gauge
container_memory_working_set_bytes{container="coredns",namespace="kube-system",pod="coredns-55cb58b774-2lm6t"} 1.4221312e+07 1700000001000
container_memory_working_set_bytes{container="web",namespace="demo",pod="web-1"} 0 1700000001500
# HELP container_start_time_seconds [STABLE] Start time of the container since unix epoch in seconds
# TYPE container_start_time_seconds gauge
container_start_time_seconds{container="coredns",namespace="kube-system",pod="coredns-55cb58b774-2lm6t"} 1.6999e+09
container_start_time_seconds{container="gone",namespace="demo",pod="done-1"} 1.6999e+09
# HELP node_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the node in core-seconds
# TYPE node_cpu_usage_seconds_total counter
node_cpu_usage_seconds_total 357.35 1700000000500
# HELP node_memory_working_set_bytes [STABLE] Current working set of the node in bytes
# TYPE node_memory_working_set_bytes gauge
node_memory_working_set_bytes 1.097728e+09 1700000000500
# HELP pod_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the pod in core-seconds
# TYPE pod_cpu_usage_seconds_total counter
pod_cpu_usage_seconds_total{namespace="demo",pod="web-1"} 0.5 1700000001500
# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise
# TYPE resource_scrape_error gauge
resource_scrape_error 0
# HELP scrape_error [ALPHA] 1 if there was an error while getting container metrics, 0 otherwise
# TYPE scrape_error gauge
scrape_error 0
"#;

    #[test]
    fn decodes_what_a_kubelet_serves_and_drops_incomplete_pods() {
        let batch = decode(KUBELET, 1).unwrap();
        assert_eq!(
            batch.node,
            Some(Point {
                at_ms: 1_700_000_000_500,
                cpu_ns: 357_350_000_000,
                memory: 1_097_728_000,
            })
        );
        let coredns = (
            "kube-system".to_string(),
            "coredns-55cb58b774-2lm6t".to_string(),
        );
        assert_eq!(
            batch.pods.keys().collect::<Vec<_>>(),
            vec![&coredns],
            "web-1 reports no working set and done-1 only a start time: both are dropped"
        );
        assert_eq!(
            batch.pods[&coredns]["coredns"],
            ContainerPoint {
                point: Point {
                    at_ms: 1_700_000_001_000,
                    cpu_ns: 1_230_457_000,
                    memory: 14_221_312,
                },
                start_ms: Some(1_699_900_000_000),
            }
        );
    }

    #[test]
    fn a_node_without_cpu_or_memory_is_left_out() {
        let batch = decode("node_memory_working_set_bytes 1024 5\nscrape_error 1\n", 1).unwrap();
        assert_eq!(batch.node, None);
        let batch = decode(
            "node_cpu_usage_seconds_total 2\nnode_memory_working_set_bytes 1024\n",
            7,
        )
        .unwrap();
        assert_eq!(
            batch.node.map(|n| n.at_ms),
            Some(7),
            "untimed samples are taken now"
        );
    }

    /// A line read: name, labels, value and timestamp, or why not.
    type Parsed = Result<
        Option<(
            &'static str,
            Vec<(&'static str, &'static str)>,
            f64,
            Option<i64>,
        )>,
        &'static str,
    >;

    #[test]
    fn reads_the_text_format_line_by_line() {
        let cases: &[(&str, Parsed)] = &[
            ("", Ok(None)),
            ("# TYPE x counter", Ok(None)),
            ("up 1", Ok(Some(("up", vec![], 1.0, None)))),
            (
                "a_b:c{} -2.5e3 12",
                Ok(Some(("a_b:c", vec![], -2500.0, Some(12)))),
            ),
            (
                r#"m{a="x,}y", b = "q\"\\\n" ,} +Inf"#,
                Ok(Some((
                    "m",
                    vec![("a", "x,}y"), ("b", "q\"\\\n")],
                    f64::INFINITY,
                    None,
                ))),
            ),
            ("m{a=x} 1", Err("label value not quoted")),
            (r#"m{a="x} 1"#, Err("unterminated label value")),
            (
                r#"m{a="x" b="y"} 1"#,
                Err("no `,` or `}` after a label value"),
            ),
            ("m one", Err("value is not a number")),
            ("m 1 1.5", Err("timestamp is not an integer")),
            ("m 1 2 3", Err("text after the timestamp")),
            ("{a=\"b\"} 1", Err("no metric name")),
            ("m{a=\"b\"}1", Err("no space before the value")),
        ];
        for (line, want) in cases {
            let got = parse_line(line).map_err(|e| e.to_string()).map(|s| {
                s.map(|s| {
                    let labels: Vec<String> =
                        s.labels.iter().map(|(n, v)| format!("{n}={v}")).collect();
                    (s.name, labels, s.value, s.timestamp_ms)
                })
            });
            let want = want.clone().map_err(str::to_string).map(|s| {
                s.map(|(name, labels, value, at)| {
                    let labels = labels.iter().map(|(n, v)| format!("{n}={v}")).collect();
                    (name, labels, value, at)
                })
            });
            assert_eq!(got, want, "{line:?}");
        }
        assert_eq!(
            decode("ok 1\nbad{ 1\n", 0),
            Err(DecodeError {
                line: 2,
                what: LineError::UnterminatedLabelSet
            })
        );
        let error = decode("ok 1\nbad{ 1\n", 0).unwrap_err();
        let cause = std::error::Error::source(&error).map(ToString::to_string);
        assert_eq!(
            format!("{error}: {}", cause.unwrap_or_default()),
            "line 2: unterminated label set"
        );
    }
}
