//! Synthetic objects for simulations and benchmarks (`tessera simulate --gangs`, the group
//! bench): one builder, so the clusters they decide over are the nodes the controller sees.

use k8s_openapi::api::core::v1::{Node, NodeStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tessera_api::names::TOPOLOGY_MANAGED_LABEL;

/// A topology-managed GPU node named `name` with `labels` (rack, block, ...) besides the
/// managed label, and room for any pod: 256 CPUs, 2 TiB of memory, 110 pods allocatable, so
/// node resources never decide where a simulated pod goes, its GPUs do.
pub fn gpu_node<'l>(name: &str, labels: impl IntoIterator<Item = (&'l str, String)>) -> Node {
    let labels = std::iter::once((TOPOLOGY_MANAGED_LABEL.to_owned(), "true".to_owned()))
        .chain(labels.into_iter().map(|(k, v)| (k.to_owned(), v)))
        .collect();
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels),
            ..Default::default()
        },
        spec: None,
        status: Some(NodeStatus {
            allocatable: Some(
                [
                    ("cpu".to_owned(), Quantity("256".into())),
                    ("memory".to_owned(), Quantity("2Ti".into())),
                    ("pods".to_owned(), Quantity("110".into())),
                ]
                .into(),
            ),
            ..Default::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nodes::NodeFacts;

    #[test]
    fn a_synthetic_node_is_managed_labelled_and_roomy() {
        let node = gpu_node("dgx-0", [("gpu.tessera.dev/rack", "r1".to_owned())]);
        let labels = node.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[TOPOLOGY_MANAGED_LABEL], "true");
        assert_eq!(labels["gpu.tessera.dev/rack"], "r1");
        let facts = NodeFacts::from(&node);
        assert_eq!(facts.info.name, "dgx-0");
        assert!(!facts.unschedulable);
        assert!(facts.taints.is_empty());
        let allocatable = &node.status.as_ref().unwrap().allocatable.as_ref().unwrap();
        assert_eq!(allocatable["pods"].0, "110");
    }
}
