//! Which nodes a pod may run on, before any device is looked at: kube-scheduler's NodeUnschedulable,
//! NodeAffinity (nodeSelector and required node affinity), TaintToleration and NodeResourcesFit
//! filters, in that order. The first reason a node is rejected is kept for the pod's message.

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::core::v1::{Node, NodeSelector, Pod, Taint, Toleration};
use tessera_allocator::{NodeInfo, selector_matches};

use crate::resources::{Allocatable, NodeUsage, Requests, Shortage, pod_requests, shortage};

/// The taint the node lifecycle controller puts on cordoned nodes.
const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";

/// The parts of a Node the filters read, parsed once per node change.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeFacts {
    pub info: NodeInfo,
    pub taints: Vec<Taint>,
    pub unschedulable: bool,
    pub allocatable: Allocatable,
}

impl From<&Node> for NodeFacts {
    fn from(node: &Node) -> NodeFacts {
        let spec = node.spec.as_ref();
        NodeFacts {
            info: NodeInfo::from(node),
            taints: spec.and_then(|s| s.taints.clone()).unwrap_or_default(),
            unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
            allocatable: Allocatable::of(node),
        }
    }
}

/// What a pod asks of a node.
#[derive(Clone, Debug)]
pub struct PodRequirements {
    node_selector: BTreeMap<String, String>,
    affinity: Option<NodeSelector>,
    tolerations: Vec<Toleration>,
    requests: Requests,
}

impl PodRequirements {
    pub fn of(pod: &Pod) -> PodRequirements {
        let spec = pod.spec.clone().unwrap_or_default();
        PodRequirements {
            requests: pod_requests(&spec),
            node_selector: spec.node_selector.unwrap_or_default(),
            affinity: spec
                .affinity
                .and_then(|a| a.node_affinity)
                .and_then(|a| a.required_during_scheduling_ignored_during_execution),
            tolerations: spec.tolerations.unwrap_or_default(),
        }
    }

    /// Why the pod cannot run on `node` with `used` already requested there, if it cannot.
    pub fn rejection(&self, node: &NodeFacts, used: &NodeUsage) -> Option<Rejection> {
        if node.unschedulable
            && !self.tolerations.iter().any(|t| {
                tolerates(
                    t,
                    &Taint {
                        key: UNSCHEDULABLE_TAINT.into(),
                        effect: "NoSchedule".into(),
                        ..Default::default()
                    },
                )
            })
        {
            return Some(Rejection::Unschedulable);
        }
        let labels = &node.info.labels;
        if self
            .node_selector
            .iter()
            .any(|(k, v)| labels.get(k) != Some(v))
            || self
                .affinity
                .as_ref()
                .is_some_and(|a| !selector_matches(a, &node.info))
        {
            return Some(Rejection::NodeAffinity);
        }
        if let Some(taint) = node.taints.iter().find(|taint| {
            matches!(taint.effect.as_str(), "NoSchedule" | "NoExecute")
                && !self.tolerations.iter().any(|t| tolerates(t, taint))
        }) {
            return Some(Rejection::Taint(format!(
                "{}{}:{}",
                taint.key,
                taint
                    .value
                    .as_deref()
                    .filter(|v| !v.is_empty())
                    .map(|v| format!("={v}"))
                    .unwrap_or_default(),
                taint.effect
            )));
        }
        shortage(&node.allocatable, used, &self.requests).map(Rejection::Resources)
    }

    /// The pod's own requests (what placing it adds to a node).
    pub fn requests(&self) -> Requests {
        self.requests
    }
}

/// core/v1 toleration matching (`Toleration.ToleratesTaint`).
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or_default();
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => {
            toleration.value.as_deref().unwrap_or_default()
                == taint.value.as_deref().unwrap_or_default()
        }
        _ => false,
    }
}

/// Why a node was not considered.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Rejection {
    /// Cordoned, and the pod does not tolerate that.
    Unschedulable,
    /// `nodeSelector` or required node affinity does not match.
    NodeAffinity,
    /// A NoSchedule/NoExecute taint the pod does not tolerate (`key[=value]:effect`).
    Taint(String),
    /// Not enough cpu, memory or pod slots left.
    Resources(Shortage),
    /// The node publishes no topology-managed device.
    NoManagedDevices,
    /// The scheduler gave back an allocation for this pod there recently.
    Avoided,
    /// Another claim of the pod is already allocated for a different node.
    ClaimsAllocatedElsewhere,
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rejection::Unschedulable => f.write_str("unschedulable (cordoned)"),
            Rejection::NodeAffinity => f.write_str("did not match the pod's node selector or affinity"),
            Rejection::Taint(t) => write!(f, "had untolerated taint {t}"),
            Rejection::Resources(s) => write!(f, "{s}"),
            Rejection::NoManagedDevices => f.write_str("have no topology-managed devices"),
            Rejection::Avoided => f.write_str(
                "are avoided for this pod for a while (the scheduler gave back an allocation there)",
            ),
            Rejection::ClaimsAllocatedElsewhere => {
                f.write_str("do not match where the pod's other claims are allocated")
            }

        }
    }
}

/// The nodes a pod may use, and how many were rejected for which reason.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeFilter {
    pub eligible: HashSet<String>,
    pub rejected: BTreeMap<Rejection, usize>,
    /// Nodes looked at.
    pub total: usize,
}

impl NodeFilter {
    /// Runs the filters over `nodes`. `managed` holds the nodes with topology-managed devices;
    /// `usage` what the pods on each node request already.
    pub fn run<'n>(
        pod: &PodRequirements,
        nodes: impl IntoIterator<Item = &'n NodeFacts>,
        managed: &HashSet<String>,
        usage: &HashMap<String, NodeUsage>,
    ) -> NodeFilter {
        let mut filter = NodeFilter::default();
        let empty = NodeUsage::default();
        for node in nodes {
            filter.total += 1;
            let verdict = if managed.contains(&node.info.name) {
                pod.rejection(node, usage.get(&node.info.name).unwrap_or(&empty))
            } else {
                Some(Rejection::NoManagedDevices)
            };
            match verdict {
                None => {
                    filter.eligible.insert(node.info.name.clone());
                }
                Some(r) => *filter.rejected.entry(r).or_default() += 1,
            }
        }
        filter
    }

    /// Removes `node` from the eligible nodes for `reason`.
    pub fn reject(&mut self, node: &str, reason: Rejection) {
        if self.eligible.remove(node) {
            *self.rejected.entry(reason).or_default() += 1;
        }
    }

    /// `3 had untolerated taint x:NoSchedule, 2 insufficient cpu`.
    pub fn summary(&self) -> String {
        self.rejected
            .iter()
            .map(|(reason, n)| format!("{n} {reason}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        Affinity, NodeAffinity, NodeSelectorRequirement, NodeSelectorTerm, NodeSpec, NodeStatus,
        PodSpec,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::resources::Shortage;

    fn node(name: &str, labels: &[(&str, &str)], taints: Vec<Taint>, cpu: &str) -> NodeFacts {
        NodeFacts::from(&Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: Some(taints),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                allocatable: Some(BTreeMap::from([
                    ("cpu".to_owned(), Quantity(cpu.into())),
                    ("memory".to_owned(), Quantity("64Gi".into())),
                    ("pods".to_owned(), Quantity("110".into())),
                ])),
                ..Default::default()
            }),
        })
    }

    fn taint(key: &str, value: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: Some(value.into()),
            effect: effect.into(),
            time_added: None,
        }
    }

    fn toleration(key: &str, operator: &str, value: &str, effect: &str) -> Toleration {
        let opt = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        Toleration {
            key: opt(key),
            operator: opt(operator),
            value: opt(value),
            effect: opt(effect),
            toleration_seconds: None,
        }
    }

    fn pod(spec: PodSpec) -> PodRequirements {
        PodRequirements::of(&Pod {
            spec: Some(spec),
            ..Default::default()
        })
    }

    #[test]
    fn toleration_rules() {
        let t = taint("gpu", "h100", "NoSchedule");
        assert!(tolerates(&toleration("gpu", "Exists", "", ""), &t));
        assert!(tolerates(
            &toleration("gpu", "Equal", "h100", "NoSchedule"),
            &t
        ));
        assert!(tolerates(&toleration("gpu", "", "h100", ""), &t));
        assert!(!tolerates(&toleration("gpu", "Equal", "a100", ""), &t));
        assert!(!tolerates(
            &toleration("gpu", "Exists", "", "NoExecute"),
            &t
        ));
        assert!(tolerates(&toleration("", "Exists", "", ""), &t));
        assert!(!tolerates(&toleration("other", "Exists", "", ""), &t));
    }

    #[test]
    fn filters_in_scheduler_order() {
        let nodes = [
            node("a-fits", &[("pool", "train")], vec![], "8"),
            node("b-label", &[("pool", "infer")], vec![], "8"),
            node(
                "c-taint",
                &[("pool", "train")],
                vec![taint("dedicated", "x", "NoExecute")],
                "8",
            ),
            node(
                "d-prefer",
                &[("pool", "train")],
                vec![taint("soft", "", "PreferNoSchedule")],
                "8",
            ),
            node("e-small", &[("pool", "train")], vec![], "1"),
            node("f-unmanaged", &[("pool", "train")], vec![], "8"),
        ];
        let managed: HashSet<String> = ["a-fits", "b-label", "c-taint", "d-prefer", "e-small"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let requirements = pod(PodSpec {
            node_selector: Some(BTreeMap::from([("pool".into(), "train".into())])),
            containers: vec![k8s_openapi::api::core::v1::Container {
                name: "c".into(),
                resources: Some(k8s_openapi::api::core::v1::ResourceRequirements {
                    requests: Some(BTreeMap::from([("cpu".into(), Quantity("2".into()))])),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        });
        let filter = NodeFilter::run(&requirements, &nodes, &managed, &HashMap::new());
        let mut eligible: Vec<&str> = filter.eligible.iter().map(String::as_str).collect();
        eligible.sort();
        assert_eq!(eligible, ["a-fits", "d-prefer"]);
        assert_eq!(
            filter.summary(),
            "1 did not match the pod's node selector or affinity, 1 had untolerated taint dedicated=x:NoExecute, \
             1 insufficient cpu, 1 have no topology-managed devices"
        );
        assert_eq!(
            filter.rejected.get(&Rejection::Resources(Shortage::Cpu)),
            Some(&1)
        );
    }

    #[test]
    fn required_node_affinity_and_cordoned_nodes() {
        let affinity = PodSpec {
            affinity: Some(Affinity {
                node_affinity: Some(NodeAffinity {
                    required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                        node_selector_terms: vec![NodeSelectorTerm {
                            match_expressions: Some(vec![NodeSelectorRequirement {
                                key: "zone".into(),
                                operator: "NotIn".into(),
                                values: Some(vec!["z2".into()]),
                            }]),
                            match_fields: None,
                        }],
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let requirements = pod(affinity.clone());
        let used = NodeUsage::default();
        assert_eq!(
            requirements.rejection(&node("n", &[("zone", "z1")], vec![], "8"), &used),
            None
        );
        assert_eq!(
            requirements.rejection(&node("n", &[("zone", "z2")], vec![], "8"), &used),
            Some(Rejection::NodeAffinity)
        );
        let mut cordoned = node("n", &[("zone", "z1")], vec![], "8");
        cordoned.unschedulable = true;
        assert_eq!(
            requirements.rejection(&cordoned, &used),
            Some(Rejection::Unschedulable)
        );
        let tolerant = pod(PodSpec {
            tolerations: Some(vec![toleration(
                UNSCHEDULABLE_TAINT,
                "Exists",
                "",
                "NoSchedule",
            )]),
            ..affinity
        });
        assert_eq!(tolerant.rejection(&cordoned, &used), None);
    }

    #[test]
    fn rejecting_an_eligible_node_moves_it_to_the_summary() {
        let nodes = [node("a", &[], vec![], "8"), node("b", &[], vec![], "8")];
        let managed: HashSet<String> = ["a".to_owned(), "b".to_owned()].into();
        let mut filter =
            NodeFilter::run(&pod(PodSpec::default()), &nodes, &managed, &HashMap::new());
        filter.reject("a", Rejection::Avoided);
        filter.reject("zzz", Rejection::Avoided);
        assert_eq!(filter.eligible, HashSet::from(["b".to_owned()]));
        assert_eq!(filter.rejected, BTreeMap::from([(Rejection::Avoided, 1)]));
    }
}
