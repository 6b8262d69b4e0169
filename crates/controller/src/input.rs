//! Checks of input the API server may have let through (a CRD stored before its schema
//! validated it, or a schema that cannot say everything): the controllers never act on such
//! input, they report it. Pure; each problem names the field as kube-apiserver would.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use tandem_apimachinery::quantity;
use tandem_apimachinery::validation::validate_label_key;
use tandem_core::offloading::{Requirement, SelectorTerm};

/// One invalid field: its path (`spec.grant.cpu`) and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    fn invalid(field: String, value: &str, why: &str) -> FieldError {
        FieldError {
            field,
            message: format!("Invalid value: {value:?}: {why}"),
        }
    }
}

/// The first invalid requirement of a cluster selector (`spec.clusterSelector`), checked as
/// kube-apiserver checks a pod's required node affinity.
pub fn cluster_selector(terms: &[SelectorTerm]) -> Result<(), FieldError> {
    for (i, term) in terms.iter().enumerate() {
        let at = format!("spec.clusterSelector.nodeSelectorTerms[{i}]");
        for (j, r) in term.match_expressions.iter().enumerate() {
            requirement(r, &format!("{at}.matchExpressions[{j}]"), true)?;
        }
        for (j, r) in term.match_fields.iter().enumerate() {
            requirement(r, &format!("{at}.matchFields[{j}]"), false)?;
        }
    }
    Ok(())
}

fn requirement(r: &Requirement, at: &str, label_key: bool) -> Result<(), FieldError> {
    let values = format!("{at}.values");
    match r.operator.as_str() {
        "In" | "NotIn" if r.values.is_empty() => {
            return Err(FieldError {
                field: values,
                message: "Required value: must be specified when `operator` is 'In' or 'NotIn'"
                    .into(),
            });
        }
        "Exists" | "DoesNotExist" if !r.values.is_empty() => {
            return Err(FieldError {
                field: values,
                message:
                    "Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
                        .into(),
            });
        }
        "Gt" | "Lt" if r.values.len() != 1 => {
            return Err(FieldError {
                field: values,
                message:
                    "Required value: must be specified single value when `operator` is 'Lt' or 'Gt'"
                        .into(),
            });
        }
        "Gt" | "Lt" if r.values[0].parse::<i64>().is_err() => {
            return Err(FieldError::invalid(
                format!("{values}[0]"),
                &r.values[0],
                "must be an integer",
            ));
        }
        "In" | "NotIn" | "Exists" | "DoesNotExist" | "Gt" | "Lt" => {}
        other => {
            return Err(FieldError::invalid(
                format!("{at}.operator"),
                other,
                "not a valid selector operator",
            ));
        }
    }
    if label_key && let Err(why) = validate_label_key(&r.key) {
        return Err(FieldError::invalid(
            format!("{at}.key"),
            &r.key,
            &why.to_string(),
        ));
    }
    Ok(())
}

/// The first resource of a Tenant's grant (`spec.grant`) that is not a quantity of zero or more.
pub fn grant(grant: &BTreeMap<String, Quantity>) -> Result<(), FieldError> {
    for (name, value) in grant {
        if let Err(why) = quantity::validate_non_negative(&value.0) {
            return Err(FieldError::invalid(
                format!("spec.grant.{name}"),
                &value.0,
                &why.to_string(),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(key: &str, operator: &str, values: &[&str]) -> Requirement {
        Requirement {
            key: key.into(),
            operator: operator.into(),
            values: values.iter().map(|v| v.to_string()).collect(),
        }
    }

    fn term(reqs: Vec<Requirement>) -> SelectorTerm {
        SelectorTerm {
            match_expressions: reqs,
            match_fields: Vec::new(),
        }
    }

    #[test]
    fn cluster_selector_problems_name_the_field() {
        let region = "topology.kubernetes.io/region";
        let cases: Vec<(&str, Vec<SelectorTerm>, Option<&str>)> = vec![
            ("no terms", vec![], None),
            (
                "In with values",
                vec![term(vec![req(region, "In", &["eu"])])],
                None,
            ),
            ("Exists", vec![term(vec![req(region, "Exists", &[])])], None),
            (
                "Gt an integer",
                vec![term(vec![req("cores", "Gt", &["4"])])],
                None,
            ),
            (
                "unknown operator",
                vec![term(vec![req(region, "Bogus", &["eu"])])],
                Some("spec.clusterSelector.nodeSelectorTerms[0].matchExpressions[0].operator"),
            ),
            (
                "second term, second requirement",
                vec![
                    term(vec![req(region, "In", &["eu"])]),
                    term(vec![req(region, "In", &["eu"]), req(region, "bogus", &[])]),
                ],
                Some("spec.clusterSelector.nodeSelectorTerms[1].matchExpressions[1].operator"),
            ),
            (
                "In without values",
                vec![term(vec![req(region, "In", &[])])],
                Some("spec.clusterSelector.nodeSelectorTerms[0].matchExpressions[0].values"),
            ),
            (
                "Exists with values",
                vec![term(vec![req(region, "Exists", &["eu"])])],
                Some("spec.clusterSelector.nodeSelectorTerms[0].matchExpressions[0].values"),
            ),
            (
                "Gt with two values",
                vec![term(vec![req("cores", "Gt", &["1", "2"])])],
                Some("spec.clusterSelector.nodeSelectorTerms[0].matchExpressions[0].values"),
            ),
            (
                "Lt not an integer",
                vec![term(vec![req("cores", "Lt", &["four"])])],
                Some("spec.clusterSelector.nodeSelectorTerms[0].matchExpressions[0].values[0]"),
            ),
            (
                "invalid key",
                vec![term(vec![req("not a key", "Exists", &[])])],
                Some("spec.clusterSelector.nodeSelectorTerms[0].matchExpressions[0].key"),
            ),
        ];
        for (name, terms, want) in cases {
            let got = cluster_selector(&terms).err().map(|e| e.field);
            assert_eq!(got.as_deref(), want, "{name}");
        }
    }

    #[test]
    fn the_operator_problem_shows_the_value() {
        let terms = vec![term(vec![req("zone", "Bogus", &[])])];
        assert_eq!(
            cluster_selector(&terms).unwrap_err().to_string(),
            "spec.clusterSelector.nodeSelectorTerms[0].matchExpressions[0].operator: \
             Invalid value: \"Bogus\": not a valid selector operator"
        );
    }

    #[test]
    fn grant_problems_name_the_resource() {
        // (case, grant entries, the field named)
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], Option<&'a str>);
        let cases: &[Case] = &[
            (
                "valid",
                &[("cpu", "2"), ("memory", "4Gi"), ("pods", "110")],
                None,
            ),
            ("empty", &[], None),
            ("zero", &[("cpu", "0")], None),
            ("not a quantity", &[("cpu", "abc")], Some("spec.grant.cpu")),
            (
                "negative",
                &[("memory", "1Gi"), ("cpu", "-5")],
                Some("spec.grant.cpu"),
            ),
            ("empty string", &[("pods", "")], Some("spec.grant.pods")),
        ];
        for (name, entries, want) in cases {
            let g: BTreeMap<String, Quantity> = entries
                .iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect();
            let got = grant(&g).err().map(|e| e.field);
            assert_eq!(got.as_deref(), *want, "{name}");
        }
        let g = [("cpu".to_string(), Quantity("-5".into()))].into();
        assert_eq!(
            grant(&g).unwrap_err().to_string(),
            "spec.grant.cpu: Invalid value: \"-5\": must be greater than or equal to 0"
        );
    }
}
