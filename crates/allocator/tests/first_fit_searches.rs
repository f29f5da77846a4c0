//! How many nodes first fit searches, counted ([`DeviceIndex::node_searches`]), on the shape of
//! scheduler_perf's `SchedulingWithResourceClaimTemplate` (500 nodes of 10 devices, claims of one
//! device; first fit picks the first node by name with a free device). A node whose search can
//! raise no error is passed by with a check of its free devices: in front of the node chosen when
//! it is full, after it as long as no node that could raise an error needs the count of nodes
//! that fit. These counts are what keeps first fit fast: a lost skip multiplies them by hundreds,
//! which a timed test could only guess at.

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use tessera_allocator::{
    AllocateError, AllocateOptions, AllocatedState, DeviceIndex, Outcome, PlacementMode,
};
use tessera_test_support::scheduler_perf::{self as perf, DRIVER, class, request};

const NODES: usize = 500;
const DEVICES: i64 = 10;

fn first_fit() -> AllocateOptions {
    AllocateOptions {
        mode: PlacementMode::FirstFit,
        explain: false,
        ..AllocateOptions::default()
    }
}

fn index(slices: Vec<ResourceSlice>, selector: &str) -> DeviceIndex {
    DeviceIndex::new(slices, vec![class("perf", selector)], vec![])
}

fn perf_index() -> DeviceIndex {
    let slices = (0..NODES).map(|n| perf::slice(n, DEVICES)).collect();
    index(slices, &format!("device.driver == \"{DRIVER}\""))
}

fn claim(i: usize, count: i64) -> ResourceClaim {
    perf::claim(i, vec![request("req-0", "perf", count)])
}

/// Allocates `claim` without a node; the node chosen and the node searches it took.
fn allocate(
    index: &DeviceIndex,
    claim: &ResourceClaim,
    state: &mut AllocatedState,
) -> Result<(String, u64), AllocateError> {
    let before = index.node_searches();
    let outcome = index.allocate(std::slice::from_ref(claim), state, None, &first_fit())?;
    let searches = index.node_searches() - before;
    let Outcome::Allocated(a) = outcome else {
        panic!(
            "claim {:?} is not allocated: {outcome:?}",
            claim.metadata.name
        );
    };
    state
        .add_allocation(&a.claims[0].result)
        .expect("own results parse");
    Ok((a.node, searches))
}

#[test]
fn first_fit_searches_only_the_node_it_picks_while_the_nodes_fill_up() {
    let index = perf_index();
    let mut state = AllocatedState::new();
    // 25 nodes filled one device at a time: the node chosen moves on every 10 claims; the full
    // nodes in front of it and the 475 free ones after it are never searched.
    for i in 0..250 {
        let (node, searches) = allocate(&index, &claim(i, 1), &mut state).expect("allocates");
        assert_eq!(node, format!("node-{:03}", i / 10), "claim {i}");
        assert_eq!(searches, 1, "claim {i} on {node}: nodes searched");
    }
}

#[test]
fn first_fit_searches_only_the_last_node_when_all_others_are_full() {
    let index = perf_index();
    let mut state = AllocatedState::new();
    // Fill every node but the last with one 10-device claim each, on the node by name.
    for n in 0..NODES - 1 {
        let name = format!("node-{n:03}");
        let outcome = index
            .allocate(&[claim(n, DEVICES)], &state, Some(&name), &first_fit())
            .expect("allocates");
        let Outcome::Allocated(a) = outcome else {
            panic!("{name} is not filled: {outcome:?}");
        };
        state.add_allocation(&a.claims[0].result).expect("parses");
    }
    let (node, searches) = allocate(&index, &claim(NODES, 1), &mut state).expect("allocates");
    assert_eq!(node, format!("node-{:03}", NODES - 1));
    assert_eq!(
        searches, 1,
        "499 full nodes in front of the free one are passed by"
    );
}

/// 150 nodes (first fit wants 100 that fit), node `bad`'s first device lacking the attribute the
/// class's selector reads: a runtime error on the device the node's search tries first, upstream's
/// and ours.
fn index_with_a_failing_selector_on(bad: usize) -> DeviceIndex {
    let slices = (0..150)
        .map(|n| {
            let mut slice = perf::slice(n, DEVICES);
            if n == bad {
                let devices = slice.spec.devices.as_mut().expect("devices");
                devices[0]
                    .attributes
                    .as_mut()
                    .expect("attributes")
                    .remove("model");
            }
            slice
        })
        .collect();
    index(
        slices,
        &format!("device.attributes[\"{DRIVER}\"].model == \"A100\""),
    )
}

#[test]
fn an_error_on_a_node_first_fit_still_tries_fails_the_claim() {
    // Node 50 is within the 100 fitting nodes first fit tries: its error fails the claim, as
    // kube-scheduler's Filter fails the pod. Nodes 1..49 are searched only once node 50, which
    // is not quiet, needs to know how many fit before it: 1 + 49 + 1 searches.
    let index = index_with_a_failing_selector_on(50);
    let mut state = AllocatedState::new();
    let before = index.node_searches();
    let error = allocate(&index, &claim(0, 1), &mut state).expect_err("node-050's error");
    assert!(
        error.to_string().contains("node-050"),
        "the error names the device of node-050: {error}"
    );
    assert_eq!(index.node_searches() - before, 51);
}

#[test]
fn a_failing_selector_on_a_device_the_search_does_not_reach_is_no_error() {
    // Node 50's last device fails, but the search there takes its first device and stops: no
    // error, upstream's walk neither. The node is not quiet, so it is searched (with the 49
    // quiet nodes in front of it, to count them).
    let slices = (0..150)
        .map(|n| {
            let mut slice = perf::slice(n, DEVICES);
            if n == 50 {
                let devices = slice.spec.devices.as_mut().expect("devices");
                devices[9]
                    .attributes
                    .as_mut()
                    .expect("attributes")
                    .remove("model");
            }
            slice
        })
        .collect();
    let index = index(
        slices,
        &format!("device.attributes[\"{DRIVER}\"].model == \"A100\""),
    );
    let mut state = AllocatedState::new();
    let (node, searches) = allocate(&index, &claim(0, 1), &mut state).expect("allocates");
    assert_eq!(node, "node-000");
    assert_eq!(searches, 51);
}

#[test]
fn an_error_on_a_node_past_the_nodes_first_fit_tries_does_not_matter() {
    // Node 120 comes after the 100th node that fits: first fit stops there, as the scheduler
    // does, and takes node-000. Nodes 1..99 are searched to count them (node 120 is not quiet),
    // node 120 is not.
    let index = index_with_a_failing_selector_on(120);
    let mut state = AllocatedState::new();
    let (node, searches) = allocate(&index, &claim(0, 1), &mut state).expect("allocates");
    assert_eq!(node, "node-000");
    assert_eq!(searches, 100);
}
