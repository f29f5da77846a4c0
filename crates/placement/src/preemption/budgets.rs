//! PodDisruptionBudgets as preemption reads them: which budgets cover a pod, and how many of
//! their pods may still be disrupted (`status.disruptionsAllowed`). The controller evicts through
//! the Eviction API, which refuses (429) an eviction that would exceed a budget and refuses any
//! eviction of a pod that more than one budget covers; a plan that respects these counts is one
//! the API server accepts.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::protocol::object_key;

/// One budget.
#[derive(Clone, Debug, PartialEq)]
struct Budget {
    /// `namespace/name`.
    key: String,
    namespace: String,
    /// `None`: the budget selects no pod (policy/v1 semantics of a missing selector).
    selector: Option<LabelSelector>,
    /// Disruptions still allowed (never below 0).
    allowed: u32,
}

/// The cluster's PodDisruptionBudgets.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DisruptionBudgets {
    budgets: Vec<Budget>,
}

impl DisruptionBudgets {
    /// The budgets of `pdbs`. A budget whose status was never written allows no disruption (the
    /// API server refuses evictions under it until the disruption controller has counted).
    pub fn new<'p>(pdbs: impl IntoIterator<Item = &'p PodDisruptionBudget>) -> DisruptionBudgets {
        let mut budgets: Vec<Budget> = pdbs
            .into_iter()
            .map(|pdb| Budget {
                key: object_key(&pdb.metadata),
                namespace: pdb.metadata.namespace.clone().unwrap_or_default(),
                selector: pdb.spec.as_ref().and_then(|s| s.selector.clone()),
                allowed: pdb.status.as_ref().map_or(0, |s| {
                    u32::try_from(s.disruptions_allowed.unwrap_or(0)).unwrap_or(0)
                }),
            })
            .collect();
        budgets.sort_by(|a, b| a.key.cmp(&b.key));
        DisruptionBudgets { budgets }
    }

    /// The budgets covering `pod` (indices, ascending).
    pub fn covering(&self, pod: &Pod) -> Vec<usize> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let empty = BTreeMap::new();
        let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
        self.budgets
            .iter()
            .enumerate()
            .filter(|(_, b)| {
                b.namespace == namespace && b.selector.as_ref().is_some_and(|s| selects(s, labels))
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// Disruptions budget `index` still allows.
    pub fn allowed(&self, index: usize) -> u32 {
        self.budgets.get(index).map_or(0, |b| b.allowed)
    }

    /// `namespace/name` of budget `index`.
    pub fn name(&self, index: usize) -> &str {
        self.budgets.get(index).map_or("", |b| b.key.as_str())
    }

    /// Counts `disruptions` against budget `index` (evictions the controller has made that the
    /// budget's status may not show yet).
    pub fn spend(&mut self, index: usize, disruptions: u32) {
        if let Some(b) = self.budgets.get_mut(index) {
            b.allowed = b.allowed.saturating_sub(disruptions);
        }
    }
}

/// Whether budget `pdb` covers `pod`: same namespace, and its selector (a missing one selects
/// nothing) selects the pod's labels.
pub fn covers(pdb: &PodDisruptionBudget, pod: &Pod) -> bool {
    let empty = BTreeMap::new();
    pdb.metadata.namespace == pod.metadata.namespace
        && pdb
            .spec
            .as_ref()
            .and_then(|s| s.selector.as_ref())
            .is_some_and(|s| selects(s, pod.metadata.labels.as_ref().unwrap_or(&empty)))
}

/// Whether a label selector selects `labels`. An empty selector selects everything. An
/// operator the API would not accept selects (a budget that cannot be read protects its pods).
pub fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_labels = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    by_labels
        && selector.match_expressions.iter().flatten().all(|e| {
            let value = labels.get(&e.key);
            let values = e.values.as_deref().unwrap_or_default();
            match e.operator.as_str() {
                "In" => value.is_some_and(|v| values.contains(v)),
                "NotIn" => value.is_none_or(|v| !values.contains(v)),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                _ => true,
            }
        })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::policy::v1::{PodDisruptionBudgetSpec, PodDisruptionBudgetStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelectorRequirement, ObjectMeta};

    use super::*;

    fn pdb(
        name: &str,
        selector: Option<LabelSelector>,
        allowed: Option<i32>,
    ) -> PodDisruptionBudget {
        PodDisruptionBudget {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            spec: Some(PodDisruptionBudgetSpec {
                selector,
                ..Default::default()
            }),
            status: allowed.map(|a| PodDisruptionBudgetStatus {
                disruptions_allowed: Some(a),
                ..Default::default()
            }),
        }
    }

    fn pod(namespace: &str, labels: &[(&str, &str)]) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some(namespace.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> LabelSelector {
        LabelSelector {
            match_labels: Some(
                pairs
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            match_expressions: None,
        }
    }

    #[test]
    fn a_budget_covers_the_pods_its_selector_selects_in_its_namespace() {
        let budgets = DisruptionBudgets::new(&[
            pdb("web", Some(labels(&[("app", "web")])), Some(1)),
            pdb("all", Some(LabelSelector::default()), Some(0)),
            pdb("none", None, Some(5)),
        ]);
        // Sorted by name: all, none, web.
        assert_eq!(budgets.name(0), "ns/all");
        assert_eq!(budgets.name(2), "ns/web");
        assert_eq!(budgets.covering(&pod("ns", &[("app", "web")])), [0, 2]);
        assert_eq!(budgets.covering(&pod("ns", &[("app", "db")])), [0]);
        assert!(
            budgets
                .covering(&pod("other", &[("app", "web")]))
                .is_empty()
        );
        assert_eq!(budgets.allowed(0), 0);
        assert_eq!(budgets.allowed(2), 1);
    }

    #[test]
    fn a_budget_without_status_allows_nothing_and_spending_stops_at_zero() {
        let mut budgets = DisruptionBudgets::new(&[
            pdb("fresh", Some(LabelSelector::default()), None),
            pdb("two", Some(LabelSelector::default()), Some(2)),
            pdb("negative", Some(LabelSelector::default()), Some(-1)),
        ]);
        assert_eq!(budgets.allowed(0), 0, "fresh");
        assert_eq!(budgets.allowed(1), 0, "negative");
        assert_eq!(budgets.allowed(2), 2);
        budgets.spend(2, 1);
        assert_eq!(budgets.allowed(2), 1);
        budgets.spend(2, 5);
        assert_eq!(budgets.allowed(2), 0);
    }

    #[test]
    fn expressions_select_as_the_api_defines_them() {
        let expr = |key: &str, op: &str, values: &[&str]| LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: key.into(),
                operator: op.into(),
                values: Some(values.iter().map(|v| (*v).to_owned()).collect()),
            }]),
        };
        let l: BTreeMap<String, String> = [("tier".to_owned(), "batch".to_owned())].into();
        assert!(selects(&expr("tier", "In", &["batch", "x"]), &l));
        assert!(!selects(&expr("tier", "In", &["prod"]), &l));
        assert!(selects(&expr("tier", "NotIn", &["prod"]), &l));
        assert!(!selects(&expr("tier", "NotIn", &["batch"]), &l));
        assert!(selects(&expr("other", "NotIn", &["x"]), &l));
        assert!(selects(&expr("tier", "Exists", &[]), &l));
        assert!(!selects(&expr("other", "Exists", &[]), &l));
        assert!(selects(&expr("other", "DoesNotExist", &[]), &l));
        assert!(
            selects(&expr("tier", "Bogus", &[]), &l),
            "unreadable protects"
        );
    }
}
