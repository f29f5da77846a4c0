//! CPU, memory and pod-count accounting, as kube-scheduler's NodeResourcesFit filter does it:
//! a pod's effective requests (containers, init containers, sidecars, overhead, pod-level
//! resources) against a node's allocatable minus what the pods on it request.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Node, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use tessera_allocator::quantity::Amount;

/// The resources the controller checks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Requests {
    pub cpu: Amount,
    pub memory: Amount,
}

impl Requests {
    fn add(self, other: Requests) -> Requests {
        Requests {
            cpu: self.cpu.saturating_add(other.cpu),
            memory: self.memory.saturating_add(other.memory),
        }
    }

    fn max(self, other: Requests) -> Requests {
        Requests {
            cpu: self.cpu.max(other.cpu),
            memory: self.memory.max(other.memory),
        }
    }
}

fn amount(map: Option<&BTreeMap<String, Quantity>>, name: &str) -> Amount {
    // A request the API server accepted always parses; should one not, it counts as zero rather
    // than blocking the pod (the scheduler has the last word on fit anyway).
    map.and_then(|m| m.get(name))
        .and_then(|q| Amount::from_quantity(q).ok())
        .unwrap_or_default()
}

fn container_requests(c: &Container) -> Requests {
    let requests = c.resources.as_ref().and_then(|r| r.requests.as_ref());
    Requests {
        cpu: amount(requests, "cpu"),
        memory: amount(requests, "memory"),
    }
}

/// `resourcehelper.PodRequests`: the sum of the containers, raised to what any init container
/// needs while it runs (with the sidecars started before it), plus sidecars, plus overhead;
/// pod-level requests (`spec.resources`) replace the container sum where set.
pub fn pod_requests(spec: &PodSpec) -> Requests {
    let mut total = spec
        .containers
        .iter()
        .map(container_requests)
        .fold(Requests::default(), Requests::add);
    let mut sidecars = Requests::default();
    let mut init_peak = Requests::default();
    for c in spec.init_containers.iter().flatten() {
        let r = container_requests(c);
        if c.restart_policy.as_deref() == Some("Always") {
            total = total.add(r);
            sidecars = sidecars.add(r);
            init_peak = init_peak.max(sidecars);
        } else {
            init_peak = init_peak.max(r.add(sidecars));
        }
    }
    let mut requests = total.max(init_peak);
    if let Some(pod_level) = spec.resources.as_ref().and_then(|r| r.requests.as_ref()) {
        if pod_level.contains_key("cpu") {
            requests.cpu = amount(Some(pod_level), "cpu");
        }
        if pod_level.contains_key("memory") {
            requests.memory = amount(Some(pod_level), "memory");
        }
    }
    let overhead = spec.overhead.as_ref();
    requests.add(Requests {
        cpu: amount(overhead, "cpu"),
        memory: amount(overhead, "memory"),
    })
}

/// What a node offers to pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocatable {
    pub cpu: Amount,
    pub memory: Amount,
    pub pods: i64,
}

impl Allocatable {
    /// `status.allocatable`; a node that reports none offers nothing.
    pub fn of(node: &Node) -> Allocatable {
        let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
        Allocatable {
            cpu: amount(allocatable, "cpu"),
            memory: amount(allocatable, "memory"),
            pods: i64::try_from(amount(allocatable, "pods").ceil_units()).unwrap_or(i64::MAX),
        }
    }
}

/// What the pods on a node request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeUsage {
    pub requests: Requests,
    pub pods: i64,
}

impl NodeUsage {
    /// Counts one more pod.
    pub fn add_pod(&mut self, requests: Requests) {
        self.requests = self.requests.add(requests);
        self.pods += 1;
    }
}

/// A resource a node lacks for the pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Shortage {
    Cpu,
    Memory,
    Pods,
}

impl std::fmt::Display for Shortage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Shortage::Cpu => "insufficient cpu",
            Shortage::Memory => "insufficient memory",
            Shortage::Pods => "too many pods",
        })
    }
}

/// The first resource the node lacks for a pod requesting `requests`, as NodeResourcesFit
/// checks it (a resource the pod does not request never blocks it; the pod count always does).
pub fn shortage(
    allocatable: &Allocatable,
    used: &NodeUsage,
    requests: &Requests,
) -> Option<Shortage> {
    if used.pods.saturating_add(1) > allocatable.pods {
        return Some(Shortage::Pods);
    }
    let lacks = |want: Amount, used: Amount, have: Amount| {
        want > Amount::default() && used.saturating_add(want) > have
    };
    if lacks(requests.cpu, used.requests.cpu, allocatable.cpu) {
        return Some(Shortage::Cpu);
    }
    if lacks(requests.memory, used.requests.memory, allocatable.memory) {
        return Some(Shortage::Memory);
    }
    None
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{NodeStatus, ResourceRequirements};

    use super::*;

    fn q(s: &str) -> Amount {
        Amount::parse(s).unwrap()
    }

    fn container(cpu: &str, memory: &str) -> Container {
        Container {
            name: "c".into(),
            resources: Some(ResourceRequirements {
                requests: Some(BTreeMap::from([
                    ("cpu".to_owned(), Quantity(cpu.into())),
                    ("memory".to_owned(), Quantity(memory.into())),
                ])),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn sidecar(cpu: &str, memory: &str) -> Container {
        Container {
            restart_policy: Some("Always".into()),
            ..container(cpu, memory)
        }
    }

    #[test]
    fn containers_add_up_and_init_containers_take_the_peak() {
        let spec = PodSpec {
            containers: vec![container("500m", "1Gi"), container("250m", "1Gi")],
            init_containers: Some(vec![container("2", "100Mi")]),
            ..Default::default()
        };
        assert_eq!(
            pod_requests(&spec),
            Requests {
                cpu: q("2"),
                memory: q("2Gi")
            }
        );
    }

    #[test]
    fn sidecars_run_alongside_later_init_containers_and_the_app() {
        // Upstream's example: sidecar 1 cpu, then an init container of 2 cpu runs next to it
        // (3), then the app (1) runs next to the sidecar (2): the peak is 3.
        let spec = PodSpec {
            containers: vec![container("1", "0")],
            init_containers: Some(vec![sidecar("1", "0"), container("2", "0")]),
            ..Default::default()
        };
        assert_eq!(pod_requests(&spec).cpu, q("3"));
    }

    #[test]
    fn overhead_and_pod_level_requests() {
        let spec = PodSpec {
            containers: vec![container("1", "1Gi")],
            overhead: Some(BTreeMap::from([(
                "cpu".to_owned(),
                Quantity("100m".into()),
            )])),
            resources: Some(ResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "memory".to_owned(),
                    Quantity("4Gi".into()),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            pod_requests(&spec),
            Requests {
                cpu: q("1100m"),
                memory: q("4Gi")
            }
        );
    }

    #[test]
    fn fit_checks_every_resource_the_pod_requests() {
        let node = Node {
            status: Some(NodeStatus {
                allocatable: Some(BTreeMap::from([
                    ("cpu".to_owned(), Quantity("4".into())),
                    ("memory".to_owned(), Quantity("8Gi".into())),
                    ("pods".to_owned(), Quantity("2".into())),
                ])),
                ..Default::default()
            }),
            ..Default::default()
        };
        let allocatable = Allocatable::of(&node);
        let mut used = NodeUsage::default();
        used.add_pod(Requests {
            cpu: q("3"),
            memory: q("1Gi"),
        });
        let small = Requests {
            cpu: q("1"),
            memory: q("1Gi"),
        };
        assert_eq!(shortage(&allocatable, &used, &small), None);
        let cpu_heavy = Requests {
            cpu: q("1001m"),
            memory: q("0"),
        };
        assert_eq!(
            shortage(&allocatable, &used, &cpu_heavy),
            Some(Shortage::Cpu)
        );
        let memory_heavy = Requests {
            cpu: q("0"),
            memory: q("8Gi"),
        };
        assert_eq!(
            shortage(&allocatable, &used, &memory_heavy),
            Some(Shortage::Memory)
        );
        used.add_pod(Requests::default());
        assert_eq!(
            shortage(&allocatable, &used, &Requests::default()),
            Some(Shortage::Pods)
        );
        assert_eq!(
            shortage(
                &Allocatable::of(&Node::default()),
                &NodeUsage::default(),
                &Requests::default()
            ),
            Some(Shortage::Pods),
            "a node without allocatable takes no pods"
        );
    }
}
