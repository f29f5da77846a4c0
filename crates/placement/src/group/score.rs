//! How close a group's pods are: [`GroupScore`], compared field by field.

use std::collections::{BTreeSet, HashMap};

use crate::group::domains::Level;
use crate::planner::{Action, PodPlan};

/// How close a group's pods are; lower is better, compared field by field in this order.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct GroupScore {
    /// The pods' nodes are not all in one fabric clique (only when some node publishes one).
    pub outside_one_clique: bool,
    /// Distinct domains per label level (a node without the label counts as its own domain).
    pub domains: Vec<usize>,
    /// Distinct nodes.
    pub nodes: usize,
    /// Sum over the pods of the in-node communication cost, then of NUMA nodes spanned.
    pub comm_cost: u64,
    pub numa_nodes_spanned: u32,
}

/// The node a decision places on, if any.
pub(crate) fn decision_node(decision: &PodPlan) -> Option<&str> {
    match &decision.action {
        Action::Place(p) => Some(&p.node),
        Action::Release { node } => node.as_deref(),
        _ => None,
    }
}

pub(crate) fn score(
    placed: &[(usize, PodPlan)],
    clique: Option<&Level>,
    labels: &[Level],
    index: &HashMap<String, usize>,
) -> GroupScore {
    let nodes: BTreeSet<&str> = placed
        .iter()
        .filter_map(|(_, d)| decision_node(d))
        .collect();
    let distinct = |level: &Level| -> usize {
        let mut values = BTreeSet::new();
        let mut unlabelled = 0;
        for node in &nodes {
            match index.get(*node).and_then(|&i| level.of_node[i].as_ref()) {
                Some(v) => {
                    values.insert(v.clone());
                }
                None => unlabelled += 1,
            }
        }
        values.len() + unlabelled
    };
    let mut score = GroupScore {
        outside_one_clique: clique.is_some_and(|c| {
            let values: BTreeSet<Option<&String>> = nodes
                .iter()
                .map(|n| index.get(*n).and_then(|&i| c.of_node[i].as_ref()))
                .collect();
            values.len() > 1 || values.contains(&None)
        }),
        domains: labels.iter().map(distinct).collect(),
        nodes: nodes.len(),
        ..GroupScore::default()
    };
    for (_, d) in placed {
        if let Action::Place(p) = &d.action {
            score.comm_cost += p.score.comm_cost;
            score.numa_nodes_spanned += p.score.numa_nodes_spanned;
        }
    }
    score
}
