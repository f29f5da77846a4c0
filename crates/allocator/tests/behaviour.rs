//! Behaviour beyond upstream's table: the bounded search, topology-aware placement and node
//! choice, and the explanation of unsatisfiable claims.

mod support;

use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use support::*;
use tessera_allocator::{
    AllocateError, AllocateOptions, AllocatedState, DeviceId, DeviceIndex, NodeInfo, Outcome,
    PlacementMode, Reason,
};

const DRIVER: &str = "gpu.tessera.dev";

fn options(mode: PlacementMode) -> AllocateOptions {
    AllocateOptions {
        mode,
        ..AllocateOptions::default()
    }
}

/// A DGX-like node: 8 GPUs; `islands[i]` names GPU i's NVLink island (None: PCIe only).
fn gpu_node(node_name: &'static str, islands: &[Option<&str>]) -> ResourceSlice {
    let devices: Vec<Device> = islands
        .iter()
        .enumerate()
        .map(|(i, island)| {
            let numa = if i < islands.len() / 2 { 0 } else { 1 };
            let mut d = attrs(
                device(&format!("gpu-{i}")),
                &[
                    ("numaNode", int_attr(numa)),
                    (
                        "resource.kubernetes.io/pcieRoot",
                        string_attr(&format!("pci0000:{}", i / 2)),
                    ),
                ],
            );
            if let Some(island) = island {
                d = attrs(
                    d,
                    &[
                        ("nvlinkIsland", string_attr(island)),
                        ("nvlinkBandwidthGBps", int_attr(900)),
                    ],
                );
            }
            d
        })
        .collect();
    node_slice(
        &format!("{node_name}-gpus"),
        node_name,
        node_name,
        DRIVER,
        devices,
    )
}

fn picked(outcome: &Outcome) -> (String, Vec<String>) {
    let Outcome::Allocated(a) = outcome else {
        panic!("expected an allocation, got {outcome:?}");
    };
    let devices = a.claims[0]
        .result
        .devices
        .as_ref()
        .unwrap()
        .results
        .as_ref()
        .unwrap()
        .iter()
        .map(|r| r.device.clone())
        .collect();
    (a.node.clone(), devices)
}

fn in_use(node_name: &str, gpus: &[usize]) -> AllocatedState {
    let mut state = AllocatedState::new();
    for g in gpus {
        state.insert_device(DeviceId::new(DRIVER, node_name, &format!("gpu-{g}")));
    }
    state
}

/// Upstream issue 131730's shape: 12 of 40 devices for one request, then a request no device can
/// satisfy. Every combination of the first request is a dead end: C(40, 12) ≈ 5.6e9. `unique`
/// gives every device a distinct `index` that a distinctAttribute constraint looks at, so no two
/// devices are interchangeable.
fn adversarial(
    unique: bool,
) -> (
    DeviceIndex,
    Vec<k8s_openapi::api::resource::v1::ResourceClaim>,
) {
    let devices: Vec<Device> = (0..40)
        .map(|i| {
            attrs(
                device(&format!("device-{i}")),
                &[("type", string_attr("Y")), ("index", int_attr(i))],
            )
        })
        .collect();
    let inv = DeviceIndex::new(
        vec![node_slice(SLICE1, NODE1, POOL1, DRIVER_A, devices)],
        vec![class(CLASS_A, DRIVER_A)],
        vec![node(NODE1, REGION1)],
    );
    let constraints = if unique {
        vec![distinct_attribute("driver-a/index", &[REQ0])]
    } else {
        vec![]
    };
    let claims = vec![claim_with(
        CLAIM0,
        vec![
            request(REQ0, CLASS_A, 12),
            request_with(REQ1, CLASS_A, 1, |r| {
                r.selectors = Some(vec![selector(
                    "device.attributes[\"driver-a\"].type == \"X\"",
                )])
            }),
        ],
        constraints,
        vec![],
    )];
    (inv, claims)
}

#[test]
fn an_unsatisfiable_claim_fails_fast_instead_of_at_a_budget() {
    // Upstream issue 131730's shape: C(40, 12) combinations for the first request, none of which
    // helps the second. Pruning sees after the first dead end that the second request has no
    // device left, so both modes prove unsatisfiability in a handful of calls.
    for (mode, unique) in [
        (PlacementMode::FirstFit, false),
        (PlacementMode::FirstFit, true),
        (PlacementMode::TopologyAware, true),
    ] {
        let (inv, claims) = adversarial(unique);
        let options = AllocateOptions {
            mode,
            step_budget: 1_000,
            explain: true,
            numa: Default::default(),
        };
        let outcome = inv
            .allocate(&claims, &AllocatedState::new(), None, &options)
            .unwrap_or_else(|e| panic!("{mode}: {e}"));
        assert!(
            matches!(outcome, Outcome::Unsatisfiable(_)),
            "{mode}: {outcome:?}"
        );
    }
}

#[test]
fn the_search_still_has_a_bound() {
    // A satisfiable claim with a bound too small for it: the bound error, naming node and budget.
    let (inv, _) = adversarial(false);
    let claims = vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 12)])];
    let options = AllocateOptions {
        mode: PlacementMode::FirstFit,
        step_budget: 5,
        explain: true,
        numa: Default::default(),
    };
    let err = inv
        .allocate(&claims, &AllocatedState::new(), None, &options)
        .unwrap_err();
    match &err {
        AllocateError::SearchBudgetExhausted {
            node,
            steps,
            budget,
            ..
        } => {
            assert_eq!(node, NODE1);
            assert_eq!(*budget, 5);
            assert!(*steps > *budget);
        }
        other => panic!("expected the bound error, got {other}"),
    }
}

#[test]
fn interchangeable_devices_let_topology_aware_search_prove_unsatisfiability() {
    // The same adversarial claim on 40 interchangeable devices: one class, so topology-aware search
    // tries one combination per request instead of C(40, 12).
    let (inv, claims) = adversarial(false);
    let options = AllocateOptions {
        mode: PlacementMode::TopologyAware,
        step_budget: 200_000,
        explain: true,
        numa: Default::default(),
    };
    let Outcome::Unsatisfiable(u) = inv
        .allocate(&claims, &AllocatedState::new(), None, &options)
        .unwrap()
    else {
        panic!("expected unsatisfiable");
    };
    assert!(u.to_string().contains("request req-1 (class class-a) wants 1 device: 40 devices on the node, 40 match the class selectors, 0 match the request selectors"), "{u}");
}

#[test]
fn topology_aware_keeps_a_claim_inside_one_nvlink_island() {
    let islands = [
        Some("a"),
        Some("a"),
        Some("a"),
        Some("a"),
        Some("b"),
        Some("b"),
        Some("b"),
        Some("b"),
    ];
    let inv = DeviceIndex::new(
        vec![gpu_node(NODE1, &islands)],
        vec![class(CLASS_A, DRIVER)],
        vec![],
    );
    let state = in_use(NODE1, &[0, 1]);
    let claims = vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 4)])];
    let ff = inv
        .allocate(
            &claims,
            &state,
            Some(NODE1),
            &options(PlacementMode::FirstFit),
        )
        .unwrap();
    let ta = inv
        .allocate(
            &claims,
            &state,
            Some(NODE1),
            &options(PlacementMode::TopologyAware),
        )
        .unwrap();
    assert_eq!(picked(&ff).1, ["gpu-2", "gpu-3", "gpu-4", "gpu-5"]);
    assert_eq!(picked(&ta).1, ["gpu-4", "gpu-5", "gpu-6", "gpu-7"]);
    let (Outcome::Allocated(ff), Outcome::Allocated(ta)) = (ff, ta) else {
        unreachable!()
    };
    assert_eq!(ta.score.comm_cost, 6 * 10, "six NVLink pairs at 900 GB/s");
    assert!(ff.score.comm_cost > ta.score.comm_cost);
    assert!(!ta.truncated);
}

#[test]
fn topology_aware_fills_partly_used_islands_and_nodes_first() {
    let islands = [
        Some("a"),
        Some("a"),
        Some("a"),
        Some("a"),
        Some("b"),
        Some("b"),
        Some("b"),
        Some("b"),
    ];
    let inv = DeviceIndex::new(
        vec![gpu_node("node-a", &islands), gpu_node("node-b", &islands)],
        vec![class(CLASS_A, DRIVER)],
        vec![],
    );
    // node-a is untouched; node-b has one GPU in use in island b.
    let state = in_use("node-b", &[7]);
    let claims = vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 1)])];
    let ff = inv
        .allocate(&claims, &state, None, &options(PlacementMode::FirstFit))
        .unwrap();
    let ta = inv
        .allocate(
            &claims,
            &state,
            None,
            &options(PlacementMode::TopologyAware),
        )
        .unwrap();
    assert_eq!(picked(&ff), ("node-a".into(), vec!["gpu-0".into()]));
    assert_eq!(picked(&ta), ("node-b".into(), vec!["gpu-4".into()]));
    let Outcome::Allocated(ta) = ta else {
        unreachable!()
    };
    assert_eq!((ta.score.islands_broken, ta.score.nodes_broken), (0, 0));
}

#[test]
fn topology_aware_prefers_pcie_only_gpus_for_small_claims() {
    let nvlink = [Some("a"); 8];
    let pcie = [None; 4];
    let inv = DeviceIndex::new(
        vec![gpu_node("dgx", &nvlink), gpu_node("l40s", &pcie)],
        vec![class(CLASS_A, DRIVER)],
        vec![],
    );
    let state = in_use("l40s", &[0]);
    let one = vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 1)])];
    let ta = inv
        .allocate(&one, &state, None, &options(PlacementMode::TopologyAware))
        .unwrap();
    assert_eq!(
        picked(&ta).0,
        "l40s",
        "a single GPU must not break a whole NVLink island"
    );
    let two = vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 2)])];
    let ta = inv
        .allocate(&two, &state, None, &options(PlacementMode::TopologyAware))
        .unwrap();
    assert_eq!(
        picked(&ta).0,
        "dgx",
        "two GPUs talk over NVLink rather than PCIe"
    );
}

#[test]
fn first_fit_without_a_node_takes_the_first_node_by_name_that_fits() {
    let islands = [Some("a"); 2];
    let inv = DeviceIndex::new(
        vec![
            gpu_node("node-c", &islands),
            gpu_node("node-a", &islands),
            gpu_node("node-b", &islands),
        ],
        vec![class(CLASS_A, DRIVER)],
        vec![],
    );
    let state = in_use("node-a", &[0, 1]);
    let claims = vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 2)])];
    let ff = inv
        .allocate(&claims, &state, None, &options(PlacementMode::FirstFit))
        .unwrap();
    assert_eq!(picked(&ff).0, "node-b");
}

#[test]
fn explanations_account_for_every_device() {
    let islands = [
        Some("a"),
        Some("a"),
        Some("a"),
        Some("a"),
        Some("b"),
        Some("b"),
        Some("b"),
        Some("b"),
    ];
    let mut slice = gpu_node(NODE1, &islands);
    let devices = slice.spec.devices.as_mut().unwrap();
    devices[6] = tainted(
        devices[6].clone(),
        &[taint("gpu.tessera.dev/xid", "79", "NoSchedule")],
    );
    let inv = DeviceIndex::new(vec![slice], vec![class(CLASS_A, DRIVER)], vec![]);
    let state = in_use(NODE1, &[0, 1, 2, 3, 4]);
    let claims = vec![claim_with(
        CLAIM0,
        vec![request(REQ0, CLASS_A, 3)],
        vec![match_attribute("gpu.tessera.dev/nvlinkIsland", &[])],
        vec![],
    )];
    let Outcome::Unsatisfiable(u) = inv
        .allocate(&claims, &state, None, &AllocateOptions::default())
        .unwrap()
    else {
        panic!("expected unsatisfiable");
    };
    assert_eq!(u.nodes.len(), 1);
    let node = &u.nodes[0];
    let Reason::Request(account) = &node.reasons[0] else {
        panic!("first reason should be the request: {:?}", node.reasons);
    };
    assert_eq!(
        (
            account.on_node,
            account.class_matched,
            account.request_matched,
            account.available
        ),
        (8, 8, 8, 2)
    );
    let text = u.to_string();
    assert!(
        text.contains(
            "claim claim-0, request req-0 (class class-a) wants 3 devices: 8 devices on the node"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "in use by another claim: gpu.tessera.dev/node-1/gpu-0, gpu.tessera.dev/node-1/gpu-1"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "taint gpu.tessera.dev/xid=79:NoSchedule not tolerated: gpu.tessera.dev/node-1/gpu-6"
        ),
        "{text}"
    );
    assert_eq!(
        node.reason_lines().len(),
        4,
        "request, two exclusion groups, constraint: {text}"
    );
}

#[test]
fn constraint_accounts_name_the_values_of_available_devices() {
    let islands = [Some("a"), Some("a"), Some("b"), Some("b")];
    let inv = DeviceIndex::new(
        vec![gpu_node(NODE1, &islands)],
        vec![class(CLASS_A, DRIVER)],
        vec![],
    );
    let claims = vec![claim_with(
        CLAIM0,
        vec![request(REQ0, CLASS_A, 3)],
        vec![match_attribute("gpu.tessera.dev/nvlinkIsland", &[])],
        vec![],
    )];
    let Outcome::Unsatisfiable(u) = inv
        .allocate(
            &claims,
            &AllocatedState::new(),
            None,
            &AllocateOptions::default(),
        )
        .unwrap()
    else {
        panic!("expected unsatisfiable");
    };
    let text = u.to_string();
    assert!(
        text.contains("constraint #0 matchAttribute gpu.tessera.dev/nvlinkIsland: 3 needed, the most available devices sharing one value: 2 (values {a: 2, b: 2}"),
        "{text}"
    );
}

#[test]
fn an_unknown_node_is_an_error_naming_the_known_ones() {
    let inv = DeviceIndex::new(
        vec![gpu_node(NODE1, &[None])],
        vec![class(CLASS_A, DRIVER)],
        vec![],
    );
    let err = inv
        .allocate(
            &[simple_claim(CLAIM0, REQ0, CLASS_A)],
            &AllocatedState::new(),
            Some("nope"),
            &AllocateOptions::default(),
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "node nope is not known: it has no ResourceSlices and no Node object was given (known nodes: node-1)"
    );
    assert_eq!(inv.nodes(), [NodeInfo::named(NODE1)]);
}

#[test]
fn the_shared_types_can_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<DeviceIndex>();
    send_sync::<AllocatedState>();
    send_sync::<tessera_allocator::Outcome>();
    send_sync::<AllocateError>();
}

#[test]
fn allocations_round_trip_through_the_allocated_state() {
    let inv = DeviceIndex::new(
        vec![gpu_node(NODE1, &[Some("a"); 4])],
        vec![class(CLASS_A, DRIVER)],
        vec![],
    );
    let claims = vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 3)])];
    let mut state = AllocatedState::new();
    let Outcome::Allocated(a) = inv
        .allocate(&claims, &state, None, &AllocateOptions::default())
        .unwrap()
    else {
        panic!("first allocation fits");
    };
    state.add_allocation(&a.claims[0].result).unwrap();
    assert_eq!(state.dedicated_count(), 3);
    assert!(matches!(
        inv.allocate(&claims, &state, None, &AllocateOptions::default())
            .unwrap(),
        Outcome::Unsatisfiable(_)
    ));
    state.remove_allocation(&a.claims[0].result).unwrap();
    assert_eq!(state.dedicated_count(), 0);
}
