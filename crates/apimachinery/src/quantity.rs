//! Resource quantities (`100m`, `1.5Gi`, `2e3`) as `k8s.io/apimachinery/pkg/api/resource`
//! parses them: one parser for every crate (the API server's validation, the lab scheduler, the
//! controller's grants and quotas, the CLI).
//!
//! Written by hand because k8s-openapi keeps quantities as opaque strings and no maintained
//! crate parses them with Kubernetes' grammar and rounding; the value is kept exact (an integer
//! mantissa with powers of ten and two), never as a float, so `0.1` is a tenth.

use std::str::FromStr;

/// kube's message for a string that is not a quantity (`resource.ErrFormatWrong`).
pub const FORMAT_ERROR: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";

/// The OpenAPI pattern of a quantity, for CRD schemas (what controller-gen emits for
/// `resource.Quantity`).
pub const PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

/// [`PATTERN`] without the minus sign: a quantity that cannot be negative (grants, requests).
pub const NON_NEGATIVE_PATTERN: &str = r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

/// Why a string is not a quantity.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Not of the quantity grammar.
    #[error("{FORMAT_ERROR}")]
    Format,
    /// More significant digits than an exact value can carry (kube: "quantity too large").
    #[error("quantity too large")]
    TooLarge,
    /// Below zero where only zero or more is allowed.
    #[error("must be greater than or equal to 0")]
    Negative,
}

/// A parsed quantity: `(-1)^negative · mantissa · 10^exp10 · 2^pow2`, exact.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quantity {
    negative: bool,
    mantissa: i128,
    exp10: i32,
    pow2: u32,
}

impl Quantity {
    /// Parses `s` with kube's grammar: a signed decimal number and an optional suffix, either
    /// binary SI (`Ki` … `Ei`), decimal SI (`n u m k M G T P E`) or an exponent (`e3`, `E-2`).
    pub fn parse(s: &str) -> Result<Quantity, QuantityError> {
        let (negative, rest) = match s.as_bytes().first() {
            Some(b'-') => (true, &s[1..]),
            Some(b'+') => (false, &s[1..]),
            _ => (false, s),
        };
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(num_end);
        let (int, frac) = number.split_once('.').unwrap_or((number, ""));
        if int.is_empty() && frac.is_empty() || frac.contains('.') {
            return Err(QuantityError::Format);
        }
        let (exp10, pow2) = match suffix {
            "" => (0, 0),
            "n" => (-9, 0),
            "u" => (-6, 0),
            "m" => (-3, 0),
            "k" => (3, 0),
            "M" => (6, 0),
            "G" => (9, 0),
            "T" => (12, 0),
            "P" => (15, 0),
            "E" => (18, 0),
            "Ki" => (0, 10),
            "Mi" => (0, 20),
            "Gi" => (0, 30),
            "Ti" => (0, 40),
            "Pi" => (0, 50),
            "Ei" => (0, 60),
            exp if exp.starts_with(['e', 'E']) => (parse_exponent(&exp[1..])?, 0),
            _ => return Err(QuantityError::Format),
        };
        let digits = format!("{int}{frac}");
        let digits = digits.trim_start_matches('0');
        let mantissa = if digits.is_empty() {
            0
        } else {
            digits
                .parse::<i128>()
                .map_err(|_| QuantityError::TooLarge)?
        };
        let frac_len = i32::try_from(frac.len()).map_err(|_| QuantityError::TooLarge)?;
        Ok(Quantity {
            negative: negative && mantissa != 0,
            mantissa,
            exp10: exp10 - frac_len,
            pow2,
        })
    }

    /// Whether the quantity is below zero.
    pub fn is_negative(&self) -> bool {
        self.negative
    }

    /// The value in whole units, rounded up (`Quantity.Value`); saturates at the `i128` range.
    pub fn value(&self) -> i128 {
        self.scaled(0)
    }

    /// The value in thousandths, rounded up (`Quantity.MilliValue`): millicores for cpu.
    pub fn milli_value(&self) -> i128 {
        self.scaled(3)
    }

    /// The value times `10^scale`, rounded towards positive infinity, saturating.
    pub fn scaled(&self, scale: i32) -> i128 {
        let sign = if self.negative { -1 } else { 1 };
        let Some(mut v) = 1i128
            .checked_shl(self.pow2)
            .and_then(|p| p.checked_mul(self.mantissa))
        else {
            return sign * i128::MAX;
        };
        let e = self.exp10 + scale;
        if e >= 0 {
            let p = 10i128.checked_pow(e as u32);
            return match p.and_then(|p| v.checked_mul(p)) {
                Some(v) => sign * v,
                None => sign * i128::MAX,
            };
        }
        let Some(div) = 10i128.checked_pow(e.unsigned_abs()) else {
            // Smaller than one unit of the scale: rounds up to one, or down to zero if negative.
            return i128::from(v != 0 && !self.negative);
        };
        let (q, r) = (v / div, v % div);
        v = q;
        if self.negative {
            -v
        } else {
            v + i128::from(r != 0)
        }
    }
}

impl FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(s: &str) -> Result<Quantity, QuantityError> {
        Quantity::parse(s)
    }
}

/// The exponent of `1e3`, `1E-2`, `1e+6`: a signed integer.
fn parse_exponent(s: &str) -> Result<i32, QuantityError> {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(QuantityError::Format);
    }
    s.parse::<i32>()
        .ok()
        .filter(|e| e.abs() <= 1000)
        .ok_or(QuantityError::TooLarge)
}

/// Checks that `s` is a quantity of zero or more, with kube's messages.
pub fn validate_non_negative(s: &str) -> Result<Quantity, QuantityError> {
    let q = Quantity::parse(s)?;
    if q.is_negative() {
        return Err(QuantityError::Negative);
    }
    Ok(q)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kube_quantities_exactly() {
        let cases: &[(&str, i128)] = &[
            // (input, milli value)
            ("0", 0),
            ("1", 1000),
            ("100m", 100),
            ("0.1", 100),
            ("1.5", 1500),
            (".5", 500),
            ("5.", 5000),
            ("+2", 2000),
            ("-2", -2000),
            ("1k", 1_000_000),
            ("1Ki", 1_024_000),
            ("64Mi", 64 * 1024 * 1024 * 1000),
            ("1Gi", 1024 * 1024 * 1024 * 1000),
            ("1e3", 1_000_000),
            ("1E-3", 1),
            ("2e+1", 20_000),
            ("1n", 1),
            ("1u", 1),
            ("1500u", 2),
            ("1.0001m", 2),
            ("8E", 8_000_000_000_000_000_000_000),
        ];
        for (s, milli) in cases {
            assert_eq!(
                Quantity::parse(s).map(|q| q.milli_value()),
                Ok(*milli),
                "{s}"
            );
        }
    }

    #[test]
    fn refuses_what_kube_refuses() {
        for s in [
            "", "abc", "1x", "1 ", " 1", "1.2.3", ".", "-", "1Kb", "1ki", "e3", "1e", "1e+", "1mi",
            "--1", "1m1",
        ] {
            assert_eq!(Quantity::parse(s), Err(QuantityError::Format), "{s:?}");
        }
        assert_eq!(
            Quantity::parse(&"9".repeat(50)),
            Err(QuantityError::TooLarge)
        );
    }

    #[test]
    fn non_negative_refuses_negatives_with_kube_message() {
        assert!(
            validate_non_negative("-5")
                .unwrap_err()
                .to_string()
                .contains("greater than or equal to 0")
        );
        assert!(
            validate_non_negative("abc")
                .unwrap_err()
                .to_string()
                .starts_with("quantities must match")
        );
        assert!(validate_non_negative("-0").is_ok());
        assert_eq!(validate_non_negative("2").unwrap().value(), 2);
    }

    #[test]
    fn patterns_agree_with_the_parser() {
        let pattern = regex::Regex::new(PATTERN).unwrap();
        let non_negative = regex::Regex::new(NON_NEGATIVE_PATTERN).unwrap();
        for s in [
            "1", "100m", "1.5Gi", "2e3", "-1", "+1", ".5", "abc", "1x", "", "1e", "-5Mi",
        ] {
            let parsed = Quantity::parse(s);
            assert_eq!(pattern.is_match(s), parsed.is_ok(), "{s:?}");
            assert_eq!(
                non_negative.is_match(s),
                parsed.is_ok() && !s.starts_with('-'),
                "{s:?}"
            );
        }
    }

    #[test]
    fn rounds_up_and_saturates() {
        assert_eq!(Quantity::parse("1m").unwrap().value(), 1);
        assert_eq!(Quantity::parse("1001m").unwrap().value(), 2);
        assert_eq!(Quantity::parse("-1500m").unwrap().value(), -1);
        assert_eq!(Quantity::parse("1e1000").unwrap().value(), i128::MAX);
        assert_eq!(Quantity::parse("1e-1000").unwrap().value(), 1);
    }
}
