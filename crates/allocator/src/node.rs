//! Nodes as the allocator sees them (name and labels) and `core/v1` NodeSelector matching, used
//! for slices and devices that are not local to one node.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};

/// The field `matchFields` may select on.
pub const NODE_NAME_FIELD: &str = "metadata.name";

/// A node: its name and labels.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
}

impl NodeInfo {
    /// A node with a name and no labels.
    pub fn named(name: impl Into<String>) -> NodeInfo {
        NodeInfo {
            name: name.into(),
            labels: BTreeMap::new(),
        }
    }
}

impl From<&Node> for NodeInfo {
    fn from(node: &Node) -> NodeInfo {
        NodeInfo {
            name: node.metadata.name.clone().unwrap_or_default(),
            labels: node.metadata.labels.clone().unwrap_or_default(),
        }
    }
}

/// Whether a node is selected by a slice's or device's node selection fields: a node name, all
/// nodes, or a node selector. Nothing set selects nothing.
pub(crate) fn node_matches(
    node: &NodeInfo,
    node_name: Option<&str>,
    all_nodes: bool,
    selector: Option<&NodeSelector>,
) -> bool {
    match (node_name.filter(|n| !n.is_empty()), all_nodes, selector) {
        (Some(name), _, _) => node.name == name,
        (None, true, _) => true,
        (None, false, Some(selector)) => selector_matches(selector, node),
        (None, false, None) => false,
    }
}

/// `NodeSelector` semantics: terms are ORed; a term's requirements are ANDed; an empty term
/// selects nothing. `matchFields` may only select on `metadata.name`.
pub fn selector_matches(selector: &NodeSelector, node: &NodeInfo) -> bool {
    selector
        .node_selector_terms
        .iter()
        .any(|term| term_matches(term, node))
}

fn term_matches(term: &NodeSelectorTerm, node: &NodeInfo) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    expressions
        .iter()
        .all(|r| requirement_matches(r, node.labels.get(&r.key).map(String::as_str)))
        && fields
            .iter()
            .all(|r| r.key == NODE_NAME_FIELD && requirement_matches(r, Some(node.name.as_str())))
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), [bound]) = (value, values) else {
                return false;
            };
            let (Ok(v), Ok(bound)) = (v.parse::<i64>(), bound.parse::<i64>()) else {
                return false;
            };
            if r.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> NodeInfo {
        NodeInfo {
            name: "node-1".into(),
            labels: [("region", "r1"), ("gpus", "8")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        }
    }

    fn req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: Some(values.iter().map(|v| (*v).to_owned()).collect()),
        }
    }

    fn term(
        exprs: Vec<NodeSelectorRequirement>,
        fields: Vec<NodeSelectorRequirement>,
    ) -> NodeSelector {
        NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: Some(exprs),
                match_fields: Some(fields),
            }],
        }
    }

    #[test]
    fn operators() {
        let n = node();
        let cases = [
            (req("region", "In", &["r1", "r2"]), true),
            (req("region", "In", &["r2"]), false),
            (req("region", "NotIn", &["r2"]), true),
            (req("zone", "NotIn", &["r2"]), true),
            (req("region", "Exists", &[]), true),
            (req("zone", "DoesNotExist", &[]), true),
            (req("gpus", "Gt", &["4"]), true),
            (req("gpus", "Lt", &["4"]), false),
            (req("region", "Gt", &["4"]), false),
            (req("region", "Bogus", &["r1"]), false),
        ];
        for (r, want) in cases {
            assert_eq!(
                selector_matches(&term(vec![r.clone()], vec![]), &n),
                want,
                "{r:?}"
            );
        }
    }

    #[test]
    fn fields_select_only_on_the_name() {
        let n = node();
        assert!(selector_matches(
            &term(vec![], vec![req(NODE_NAME_FIELD, "In", &["node-1"])]),
            &n
        ));
        assert!(!selector_matches(
            &term(vec![], vec![req(NODE_NAME_FIELD, "In", &["node-2"])]),
            &n
        ));
        assert!(!selector_matches(
            &term(vec![], vec![req("metadata.uid", "In", &["node-1"])]),
            &n
        ));
    }

    #[test]
    fn empty_terms_select_nothing() {
        assert!(!selector_matches(&term(vec![], vec![]), &node()));
        assert!(!selector_matches(
            &NodeSelector {
                node_selector_terms: vec![]
            },
            &node()
        ));
    }

    #[test]
    fn node_selection_fields() {
        let n = node();
        assert!(node_matches(&n, Some("node-1"), false, None));
        assert!(!node_matches(&n, Some("node-2"), true, None));
        assert!(node_matches(&n, None, true, None));
        assert!(node_matches(&n, Some(""), true, None));
        assert!(!node_matches(&n, None, false, None));
    }
}
