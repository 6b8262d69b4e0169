//! The standard cron grammar CronJob schedules are checked against: five fields or a
//! descriptor, as robfig/cron's `ParseStandard` (which kube-apiserver uses) reads them, with
//! its error messages.
//!
//! Written here rather than with `croner` (which the lab's CronJob controller schedules with):
//! kube-apiserver answers an invalid schedule with robfig/cron's own messages, and croner
//! accepts extensions robfig's standard parser refuses (such as `L`, `W` and `#`), which
//! kube-apiserver would reject with a 422.

/// Why a schedule is invalid, worded as robfig/cron's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CronError {
    /// The schedule is blank.
    #[error("empty spec string")]
    Empty,
    /// The schedule has other than five fields.
    #[error("expected exactly 5 fields, found {}: [{}]", fields.len(), fields.join(" "))]
    FieldCount {
        /// The fields found.
        fields: Vec<String>,
    },
    /// `@spec` is no descriptor robfig/cron knows.
    #[error("unrecognized descriptor: {spec}")]
    Descriptor {
        /// The whole schedule.
        spec: String,
    },
    /// `@every` is followed by no Go duration.
    #[error("failed to parse duration {spec}: time: invalid duration {duration:?}")]
    Duration {
        /// The whole schedule.
        spec: String,
        /// The text after `@every`.
        duration: String,
    },
    /// A range `expr` has more than one `-`.
    #[error("too many hyphens: {expr}")]
    Hyphens {
        /// The range.
        expr: String,
    },
    /// A range `expr` has more than one `/`.
    #[error("too many slashes: {expr}")]
    Slashes {
        /// The range.
        expr: String,
    },
    /// A range `expr` starts below its field's minimum.
    #[error("beginning of range ({start}) below minimum ({min}): {expr}")]
    BelowMinimum {
        /// The start of the range.
        start: u32,
        /// The field's minimum.
        min: u32,
        /// The range.
        expr: String,
    },
    /// A range `expr` ends above its field's maximum.
    #[error("end of range ({end}) above maximum ({max}): {expr}")]
    AboveMaximum {
        /// The end of the range.
        end: u32,
        /// The field's maximum.
        max: u32,
        /// The range.
        expr: String,
    },
    /// A range `expr` starts after it ends.
    #[error("beginning of range ({start}) beyond end of range ({end}): {expr}")]
    Reversed {
        /// The start of the range.
        start: u32,
        /// The end of the range.
        end: u32,
        /// The range.
        expr: String,
    },
    /// A range `expr` has a step of 0.
    #[error("step of range should be a positive number: {expr}")]
    ZeroStep {
        /// The range.
        expr: String,
    },
    /// A number `expr` is negative.
    #[error("negative number ({n}) not allowed: {expr}")]
    Negative {
        /// Its value.
        n: i64,
        /// The number as written.
        expr: String,
    },
    /// A number `expr` does not fit 32 bits.
    #[error("failed to parse int from {expr}")]
    TooLarge {
        /// The number as written.
        expr: String,
    },
    /// `expr` is neither a number nor a name of its field's values.
    #[error("failed to parse int from {expr}: strconv.Atoi: parsing {expr:?}: invalid syntax")]
    NotANumber {
        /// The text as written.
        expr: String,
    },
}

/// Checks `schedule`; the error reads as robfig/cron's message.
pub fn check(schedule: &str) -> Result<(), CronError> {
    let spec = schedule.trim();
    if spec.is_empty() {
        return Err(CronError::Empty);
    }
    if let Some(descriptor) = spec.strip_prefix('@') {
        return check_descriptor(descriptor, spec);
    }
    let fields: Vec<&str> = spec.split_whitespace().collect();
    if fields.len() != 5 {
        return Err(CronError::FieldCount {
            fields: fields.iter().map(|f| f.to_string()).collect(),
        });
    }
    const BOUNDS: [(u32, u32, &[&str]); 5] = [
        (0, 59, &[]),
        (0, 23, &[]),
        (1, 31, &[]),
        (
            1,
            12,
            &[
                "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
            ],
        ),
        (0, 6, &["sun", "mon", "tue", "wed", "thu", "fri", "sat"]),
    ];
    for (field, (min, max, names)) in fields.iter().zip(BOUNDS) {
        for part in field.split(',') {
            range(part, min, max, names)?;
        }
    }
    Ok(())
}

fn check_descriptor(descriptor: &str, spec: &str) -> Result<(), CronError> {
    match descriptor {
        "yearly" | "annually" | "monthly" | "weekly" | "daily" | "midnight" | "hourly" => Ok(()),
        _ => match descriptor.strip_prefix("every ") {
            Some(duration) if go_duration(duration.trim()) => Ok(()),
            Some(duration) => Err(CronError::Duration {
                spec: spec.to_string(),
                duration: duration.trim().to_string(),
            }),
            None => Err(CronError::Descriptor {
                spec: spec.to_string(),
            }),
        },
    }
}

/// Go's `time.ParseDuration` grammar: one or more decimal numbers with a unit.
fn go_duration(text: &str) -> bool {
    let mut rest = text.strip_prefix(['-', '+']).unwrap_or(text);
    if rest == "0" {
        return true;
    }
    if rest.is_empty() {
        return false;
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        if digits == 0 {
            return false;
        }
        rest = &rest[digits..];
        let Some(unit) = ["ns", "us", "µs", "μs", "ms", "s", "m", "h"]
            .into_iter()
            .find(|u| rest.starts_with(u) && !(*u == "m" && rest.starts_with("ms")))
        else {
            return false;
        };
        rest = &rest[unit.len()..];
    }
    true
}

/// robfig/cron's `getRange`: `*`, `?`, `n`, `a-b`, each with an optional `/step`.
fn range(expr: &str, min: u32, max: u32, names: &[&str]) -> Result<(), CronError> {
    let expr_owned = || expr.to_string();
    let range_and_step: Vec<&str> = expr.split('/').collect();
    let low_and_high: Vec<&str> = range_and_step[0].split('-').collect();
    let single = low_and_high.len() == 1;
    let (start, mut end) = if low_and_high[0] == "*" || low_and_high[0] == "?" {
        (min, max)
    } else {
        let start = int_or_name(low_and_high[0], names)?;
        let end = match low_and_high.len() {
            1 => start,
            2 => int_or_name(low_and_high[1], names)?,
            _ => return Err(CronError::Hyphens { expr: expr_owned() }),
        };
        (start, end)
    };
    let step = match range_and_step.len() {
        1 => 1,
        2 => {
            if single {
                end = max;
            }
            int(range_and_step[1])?
        }
        _ => return Err(CronError::Slashes { expr: expr_owned() }),
    };
    if start < min {
        return Err(CronError::BelowMinimum {
            start,
            min,
            expr: expr_owned(),
        });
    }
    if end > max {
        return Err(CronError::AboveMaximum {
            end,
            max,
            expr: expr_owned(),
        });
    }
    if start > end {
        return Err(CronError::Reversed {
            start,
            end,
            expr: expr_owned(),
        });
    }
    if step == 0 {
        return Err(CronError::ZeroStep { expr: expr_owned() });
    }
    Ok(())
}

fn int_or_name(expr: &str, names: &[&str]) -> Result<u32, CronError> {
    let lower = expr.to_ascii_lowercase();
    if let Some(i) = names.iter().position(|n| *n == lower) {
        // Months count from 1, weekdays from 0 (Sunday).
        let base = if names.len() == 12 { 1 } else { 0 };
        return Ok(i as u32 + base);
    }
    int(expr)
}

fn int(expr: &str) -> Result<u32, CronError> {
    let expr_owned = || expr.to_string();
    match expr.parse::<i64>() {
        Ok(n) if n < 0 => Err(CronError::Negative {
            n,
            expr: expr_owned(),
        }),
        Ok(n) => u32::try_from(n).map_err(|_| CronError::TooLarge { expr: expr_owned() }),
        Err(_) => Err(CronError::NotANumber { expr: expr_owned() }),
    }
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn schedules_as_robfig_cron_reads_them() {
        let cases: &[(&str, Result<(), &str>)] = &[
            ("*/5 * * * *", Ok(())),
            ("0 3 * * 1-5", Ok(())),
            ("15,45 */2 1 jan-jun SUN", Ok(())),
            ("0 0 ? * *", Ok(())),
            ("@hourly", Ok(())),
            ("@every 1h30m", Ok(())),
            ("bad", Err("expected exactly 5 fields, found 1: [bad]")),
            (
                "* * * *",
                Err("expected exactly 5 fields, found 4: [* * * *]"),
            ),
            (
                "60 * * * *",
                Err("end of range (60) above maximum (59): 60"),
            ),
            (
                "* * 0 * *",
                Err("beginning of range (0) below minimum (1): 0"),
            ),
            (
                "5-1 * * * *",
                Err("beginning of range (5) beyond end of range (1): 5-1"),
            ),
            (
                "*/0 * * * *",
                Err("step of range should be a positive number: */0"),
            ),
            ("1-2-3 * * * *", Err("too many hyphens: 1-2-3")),
            (
                "x * * * *",
                Err("failed to parse int from x: strconv.Atoi: parsing \"x\": invalid syntax"),
            ),
            ("@fortnightly", Err("unrecognized descriptor: @fortnightly")),
            (
                "@every soon",
                Err("failed to parse duration @every soon: time: invalid duration \"soon\""),
            ),
            ("", Err("empty spec string")),
        ];
        for (schedule, want) in cases {
            assert_eq!(
                check(schedule).map_err(|e| e.to_string()),
                want.map_err(str::to_string),
                "schedule {schedule:?}"
            );
        }
    }
}
