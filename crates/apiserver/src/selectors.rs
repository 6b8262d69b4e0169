//! The label and field selectors a list, watch or deletecollection filters objects with.

use tandem_apimachinery::selector::{FieldSelector, LabelSelector};

use crate::error::{ApiError, ApiResult};
use crate::registry::ResourceInfo;
use crate::request::Call;
use crate::store::Doc;

/// Parsed label and field selectors of a list or watch.
pub struct Selectors {
    labels: Option<LabelSelector>,
    fields: Option<FieldSelector>,
}

impl Selectors {
    /// Parses `labelSelector` and `fieldSelector`, refusing fields the resource cannot select on.
    pub fn parse(call: &Call, res: &ResourceInfo) -> ApiResult<Selectors> {
        let labels =
            match call.query.get("labelSelector").filter(|s| !s.is_empty()) {
                Some(s) => Some(LabelSelector::parse(s).map_err(|e| {
                    ApiError::bad_request(format!("unable to parse requirement: {e}"))
                })?),
                None => None,
            };
        let fields = match call.query.get("fieldSelector").filter(|s| !s.is_empty()) {
            Some(s) => {
                let sel =
                    FieldSelector::parse(s).map_err(|e| ApiError::bad_request(e.to_string()))?;
                for req in sel.requirements() {
                    let f = req.field.as_str();
                    if !matches!(f, "metadata.name" | "metadata.namespace")
                        && !res.selectable_fields.iter().any(|s| s == f)
                    {
                        return Err(ApiError::bad_request(format!(
                            "field label not supported: {f}"
                        )));
                    }
                }
                Some(sel)
            }
            None => None,
        };
        Ok(Selectors { labels, fields })
    }

    /// Whether a stored object of resource `key` matches.
    pub fn matches(&self, key: &str, doc: &Doc) -> bool {
        self.labels
            .as_ref()
            .is_none_or(|l| l.matches(|k| doc.label(k)))
            && self
                .fields
                .as_ref()
                .is_none_or(|f| f.matches(|path| doc.field(key, path)))
    }
}
