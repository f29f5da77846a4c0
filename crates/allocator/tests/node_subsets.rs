//! The entry points the controller uses besides `allocate`: allocation restricted to a subset of
//! nodes, counting the devices a class selects, and node selector matching.

mod support;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use support::*;
use tessera_allocator::{
    AllocateError, AllocateOptions, AllocatedState, DeviceIndex, NODE_NAME_FIELD, NodeInfo,
    Outcome, PlacementMode, selector_matches,
};

fn two_nodes() -> DeviceIndex {
    DeviceIndex::new(
        vec![
            node_slice(SLICE1, NODE1, POOL1, DRIVER_A, devices(2)),
            node_slice(SLICE2, NODE2, POOL2, DRIVER_A, devices(2)),
        ],
        vec![
            class(CLASS_A, DRIVER_A),
            class(CLASS_B, DRIVER_B),
            class_with_selectors(
                "broken",
                vec![selector("device.attributes[\"driver-a\"].x")],
            ),
            class_with_selectors("syntax", vec![selector("?!")]),
        ],
        vec![node(NODE1, REGION1), node(NODE2, REGION2)],
    )
}

fn options(mode: PlacementMode) -> AllocateOptions {
    AllocateOptions {
        mode,
        ..AllocateOptions::default()
    }
}

#[test]
fn allocate_among_offers_only_eligible_nodes() {
    let inv = two_nodes();
    let claims = vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 2)])];
    for mode in [PlacementMode::FirstFit, PlacementMode::TopologyAware] {
        let outcome = inv
            .allocate_among(
                &claims,
                &AllocatedState::new(),
                |n: &NodeInfo| n.name == NODE2,
                &options(mode),
            )
            .unwrap();
        let Outcome::Allocated(a) = outcome else {
            panic!("{mode}: expected an allocation, got {outcome:?}");
        };
        assert_eq!(a.node, NODE2, "{mode}");
    }
}

#[test]
fn allocate_among_explains_only_eligible_nodes() {
    let inv = two_nodes();
    let claims = vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 3)])];
    let outcome = inv
        .allocate_among(
            &claims,
            &AllocatedState::new(),
            |n: &NodeInfo| n.name == NODE1,
            &options(PlacementMode::TopologyAware),
        )
        .unwrap();
    let Outcome::Unsatisfiable(u) = outcome else {
        panic!("expected no allocation, got {outcome:?}");
    };
    let nodes: Vec<&str> = u.nodes.iter().map(|n| n.node.as_str()).collect();
    assert_eq!(nodes, [NODE1]);
}

#[test]
fn allocate_among_no_node_is_unsatisfiable_with_no_nodes() {
    let inv = two_nodes();
    let claims = vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 1)])];
    let outcome = inv
        .allocate_among(
            &claims,
            &AllocatedState::new(),
            |_: &NodeInfo| false,
            &options(PlacementMode::TopologyAware),
        )
        .unwrap();
    assert_eq!(
        outcome,
        Outcome::Unsatisfiable(tessera_allocator::Unsatisfiable {
            claim_problem: None,
            nodes: vec![]
        })
    );
}

#[test]
fn class_selection_counts_devices_of_every_node() {
    let inv = two_nodes();
    assert_eq!(inv.devices_selected_by_class(CLASS_A), Some(Ok(4)));
    assert_eq!(inv.devices_selected_by_class(CLASS_B), Some(Ok(0)));
    assert_eq!(inv.devices_selected_by_class("missing"), None);
    let ids = inv.devices_of_class(CLASS_A).unwrap().unwrap();
    let names: Vec<String> = ids
        .iter()
        .map(|id| format!("{}/{}", id.pool(), id.device()))
        .collect();
    assert_eq!(
        names,
        [
            format!("{POOL1}/device-0"),
            format!("{POOL1}/device-1"),
            format!("{POOL2}/device-0"),
            format!("{POOL2}/device-1"),
        ]
    );
    assert!(inv.devices_of_class(CLASS_B).unwrap().unwrap().is_empty());
}

#[test]
fn class_selection_reports_selector_errors() {
    let inv = two_nodes();
    match inv.devices_selected_by_class("broken") {
        Some(Err(AllocateError::CelRuntime { owner, index, .. })) => {
            assert_eq!(owner, "class broken");
            assert_eq!(index, 0);
        }
        other => panic!("expected a CEL runtime error, got {other:?}"),
    }
    match inv.devices_selected_by_class("syntax") {
        Some(Err(AllocateError::CelCompile { owner, .. })) => assert_eq!(owner, "class syntax"),
        other => panic!("expected a CEL compile error, got {other:?}"),
    }
}

#[test]
fn node_selectors_match_labels_and_names() {
    let n = node(NODE1, REGION1);
    let by_label = label_selector("region", &[REGION1]);
    assert!(selector_matches(&by_label, &n));
    assert!(!selector_matches(&label_selector("region", &[REGION2]), &n));
    let by_name = NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_expressions: None,
            match_fields: Some(vec![NodeSelectorRequirement {
                key: NODE_NAME_FIELD.into(),
                operator: "In".into(),
                values: Some(vec![NODE2.into()]),
            }]),
        }],
    };
    assert!(!selector_matches(&by_name, &n));
    assert!(selector_matches(&by_name, &node(NODE2, REGION1)));
}
