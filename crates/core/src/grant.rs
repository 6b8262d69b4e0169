//! What a provider grants a new consumer: a share of the allocatable resources of its real,
//! Ready nodes. Quantities are Kubernetes strings (`100m`, `64Gi`) in and out.

use std::collections::BTreeMap;

use tandem_apimachinery::quantity::Quantity;

/// Resources a grant covers, and the power of ten each is summed in (millicores for cpu).
const GRANTED: &[(&str, i32)] = &[("cpu", 3), ("memory", 0), ("pods", 0)];

/// A non-negative quantity times `10^scale`, rounded up; `None` if `s` is not one.
fn parse_quantity(s: &str, scale: i32) -> Option<i64> {
    let q = Quantity::parse(s).ok().filter(|q| !q.is_negative())?;
    i64::try_from(q.scaled(scale)).ok()
}

/// `percent`% of the sum of `allocatable` (one map per node), for cpu, memory and pods.
/// Quantities that do not parse are skipped.
pub fn share(allocatable: &[BTreeMap<String, String>], percent: u32) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (resource, scale) in GRANTED {
        let total: i64 = allocatable
            .iter()
            .filter_map(|a| parse_quantity(a.get(*resource)?, *scale))
            .sum();
        let part = total * i64::from(percent) / 100;
        let q = match *resource {
            "cpu" if part % 1000 == 0 => (part / 1000).to_string(),
            "cpu" => format!("{part}m"),
            "memory" if part % (1024 * 1024) == 0 => format!("{}Mi", part / (1024 * 1024)),
            _ => part.to_string(),
        };
        out.insert(resource.to_string(), q);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    type Node = BTreeMap<String, String>;

    fn node(cpu: &str, mem: &str, pods: &str) -> BTreeMap<String, String> {
        [("cpu", cpu), ("memory", mem), ("pods", pods)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn shares() {
        let cases: Vec<(Vec<Node>, u32, [&str; 3])> = vec![
            (vec![node("4", "8Gi", "110")], 50, ["2", "4096Mi", "55"]),
            (
                vec![node("4", "8Gi", "110"), node("2", "4Gi", "110")],
                50,
                ["3", "6144Mi", "110"],
            ),
            (
                vec![node("1500m", "1G", "10")],
                10,
                ["150m", "100000000", "1"],
            ),
            (vec![], 50, ["0", "0Mi", "0"]),
            (vec![node("bogus", "1Gi", "10")], 100, ["0", "1024Mi", "10"]),
        ];
        for (nodes, pct, [cpu, mem, pods]) in cases {
            let s = share(&nodes, pct);
            assert_eq!(
                (s["cpu"].as_str(), s["memory"].as_str(), s["pods"].as_str()),
                (cpu, mem, pods),
                "{nodes:?} {pct}"
            );
        }
    }

    #[test]
    fn quantities() {
        for (s, scale, want) in [
            ("100m", 3, Some(100)),
            ("1.5", 3, Some(1500)),
            ("64Mi", 0, Some(64 << 20)),
            ("x", 0, None),
            ("-5", 0, None),
        ] {
            assert_eq!(parse_quantity(s, scale), want, "{s}");
        }
    }
}
