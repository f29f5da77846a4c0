//! Label and field selectors, parsed from the `labelSelector` / `fieldSelector` query parameters
//! and matched against stored JSON objects.
//!
//! Label selectors: `k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`, `k notin (a,b)`, joined by
//! commas. Field selectors: `f=v`, `f==v`, `f!=v`, joined by commas, on the fields the resource
//! type supports (a missing field compares as the empty string, as upstream's field sets do).

use serde_json::Value;

use crate::resources::ResourceType;

/// A selector the fake cannot parse or does not support; becomes a 400 Bad Request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SelectorError(pub String);

#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelRequirement {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    NotExists(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<LabelRequirement>);

impl LabelSelector {
    /// Parses the `labelSelector` query parameter.
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        split_top_level(text)
            .into_iter()
            .map(|term| parse_label_term(&term))
            .collect::<Result<Vec<_>, _>>()
            .map(Self)
    }

    /// Whether `object`'s `metadata.labels` satisfy every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        let labels = object.pointer("/metadata/labels");
        let label = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
        self.0.iter().all(|requirement| match requirement {
            LabelRequirement::Equals(k, v) => label(k) == Some(v.as_str()),
            LabelRequirement::NotEquals(k, v) => label(k) != Some(v.as_str()),
            LabelRequirement::Exists(k) => label(k).is_some(),
            LabelRequirement::NotExists(k) => label(k).is_none(),
            LabelRequirement::In(k, values) => {
                label(k).is_some_and(|l| values.iter().any(|v| v == l))
            }
            LabelRequirement::NotIn(k, values) => {
                !label(k).is_some_and(|l| values.iter().any(|v| v == l))
            }
        })
    }
}

/// Splits on commas that are not inside parentheses, dropping empty terms.
fn split_top_level(text: &str) -> Vec<String> {
    let mut terms = Vec::new();
    let mut depth = 0usize;
    let mut current = String::new();
    for c in text.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                terms.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    terms.push(current);
    terms
        .into_iter()
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty())
        .collect()
}

fn parse_label_term(term: &str) -> Result<LabelRequirement, SelectorError> {
    let invalid = |why: &str| SelectorError(format!("invalid label selector term `{term}`: {why}"));
    if let Some(key) = term.strip_prefix('!') {
        return Ok(LabelRequirement::NotExists(label_key(key.trim(), term)?));
    }
    if let Some((key, value)) = term.split_once("!=") {
        return Ok(LabelRequirement::NotEquals(
            label_key(key.trim(), term)?,
            value.trim().to_owned(),
        ));
    }
    if let Some((key, value)) = term.split_once("==").or_else(|| term.split_once('=')) {
        return Ok(LabelRequirement::Equals(
            label_key(key.trim(), term)?,
            value.trim().to_owned(),
        ));
    }
    for (operator, negated) in [(" notin ", true), (" in ", false)] {
        if let Some((key, values)) = term.split_once(operator) {
            let values = values
                .trim()
                .strip_prefix('(')
                .and_then(|v| v.strip_suffix(')'))
                .ok_or_else(|| invalid("the value list must be in parentheses"))?;
            let values: Vec<String> = values.split(',').map(|v| v.trim().to_owned()).collect();
            let key = label_key(key.trim(), term)?;
            return Ok(if negated {
                LabelRequirement::NotIn(key, values)
            } else {
                LabelRequirement::In(key, values)
            });
        }
    }
    Ok(LabelRequirement::Exists(label_key(term, term)?))
}

fn label_key(key: &str, term: &str) -> Result<String, SelectorError> {
    let valid = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if valid {
        Ok(key.to_owned())
    } else {
        Err(SelectorError(format!(
            "invalid label selector term `{term}`: `{key}` is not a label key"
        )))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldRequirement {
    field: String,
    value: String,
    negated: bool,
}

/// A parsed field selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<FieldRequirement>);

impl FieldSelector {
    /// Parses the `fieldSelector` query parameter and checks that `resource` supports each field.
    pub fn parse(text: &str, resource: &ResourceType) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        for term in split_top_level(text) {
            let (field, value, negated) = if let Some((f, v)) = term.split_once("!=") {
                (f, v, true)
            } else if let Some((f, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (f, v, false)
            } else {
                return Err(SelectorError(format!(
                    "invalid field selector term `{term}`: expected `field=value` or `field!=value`"
                )));
            };
            let field = field.trim();
            if !resource.supports_field_selector(field) {
                return Err(SelectorError(format!(
                    "field label not supported: {field} (on {})",
                    resource.qualified_plural()
                )));
            }
            requirements.push(FieldRequirement {
                field: field.to_owned(),
                value: value.trim().to_owned(),
                negated,
            });
        }
        Ok(Self(requirements))
    }

    /// Whether `object` satisfies every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|requirement| {
            let actual = field_value(object, &requirement.field);
            (actual == requirement.value) != requirement.negated
        })
    }
}

/// The string form of a dotted field of `object`: strings as they are, numbers and booleans
/// printed, anything missing as the empty string.
fn field_value(object: &Value, field: &str) -> String {
    let mut current = object;
    for part in field.split('.') {
        match current.get(part) {
            Some(next) => current = next,
            None => return String::new(),
        }
    }
    match current {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::resources::by_name;

    fn labelled(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "labels": labels}})
    }

    #[test]
    fn label_selectors_match_like_upstream() {
        let object = labelled(json!({"app": "gpu", "tier": "node", "managed": "true"}));
        for (selector, expected) in [
            ("", true),
            ("app=gpu", true),
            ("app==gpu", true),
            ("app!=gpu", false),
            ("app=cpu", false),
            ("app", true),
            ("!app", false),
            ("!missing", true),
            ("missing!=x", true),
            ("app in (cpu, gpu)", true),
            ("app notin (cpu,gpu)", false),
            ("missing notin (x)", true),
            ("app=gpu,tier=node", true),
            ("app=gpu,tier in (edge)", false),
        ] {
            let parsed = LabelSelector::parse(selector).unwrap();
            assert_eq!(parsed.matches(&object), expected, "{selector}");
        }
        assert!(LabelSelector::parse("app in gpu").is_err());
        assert!(LabelSelector::parse("a b=c").is_err());
    }

    #[test]
    fn field_selectors_check_support_and_match() {
        let slices = by_name("resourceslices").unwrap();
        let slice = json!({"metadata": {"name": "s"}, "spec": {"nodeName": "node-a", "driver": "gpu.tessera.dev"}});
        let selector =
            FieldSelector::parse("spec.nodeName=node-a,spec.driver=gpu.tessera.dev", slices)
                .unwrap();
        assert!(selector.matches(&slice));
        let selector = FieldSelector::parse("spec.nodeName!=node-a", slices).unwrap();
        assert!(!selector.matches(&slice));
        let selector = FieldSelector::parse("metadata.name==s", slices).unwrap();
        assert!(selector.matches(&slice));
        let error = FieldSelector::parse("spec.pool.name=x", slices).unwrap_err();
        assert!(
            error
                .0
                .contains("field label not supported: spec.pool.name"),
            "{error}"
        );
        assert!(FieldSelector::parse("spec.nodeName", slices).is_err());

        let nodes = by_name("nodes").unwrap();
        let node = json!({"metadata": {"name": "n"}, "spec": {}});
        assert!(
            FieldSelector::parse("spec.unschedulable=", nodes)
                .unwrap()
                .matches(&node)
        );
    }
}
