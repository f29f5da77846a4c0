//! Topology-aware choice among nodes answers unchanged nodes from results stored for earlier claims
//! of the same shape (`DeviceIndex::set_reuse_results`). The property: over a random sequence of
//! allocations and releases on random clusters of GPU nodes, an inventory reusing its stored
//! results chooses exactly what an inventory searching every node every time chooses — the same
//! node, devices and score, or the same account of why nothing fits — whichever NUMA policy each
//! allocation asks for.

mod support;

use k8s_openapi::api::resource::v1::{Device, DeviceRequest, ResourceClaim, ResourceSlice};
use proptest::prelude::*;
use support::*;
use tessera_allocator::{
    AllocateOptions, AllocatedState, DeviceIndex, NumaPolicy, Outcome, PlacementMode,
};

const DRIVER: &str = "gpu.tessera.dev";
const CLASS_X: &str = "class-x";

/// One GPU: NVLink island, PCIe root, NUMA node, NVLink bandwidth, kind X, in use at the start.
type Gpu = (Option<u8>, u8, Option<i64>, i64, bool, bool);

fn gpu() -> impl Strategy<Value = Gpu> {
    (
        prop::option::weighted(0.6, 0..2u8),
        0..3u8,
        prop::option::weighted(0.9, 0..2i64),
        prop_oneof![Just(900i64), Just(600)],
        prop::bool::weighted(0.7),
        prop::bool::weighted(0.2),
    )
}

/// A claim shape: requests of (count, only kind X), a matchAttribute on the NUMA node over all
/// requests, and whether the first request is a `firstAvailable` list (4 devices, else the count).
type Shape = (Vec<(i64, bool)>, bool, bool);

fn shape() -> impl Strategy<Value = Shape> {
    (
        prop::collection::vec((1..4i64, prop::bool::weighted(0.3)), 1..3),
        prop::bool::weighted(0.3),
        prop::bool::weighted(0.15),
    )
}

/// Allocate a claim of shape `n % shapes` under a NUMA policy, or release the `n`-th allocated
/// claim still held.
#[derive(Clone, Debug)]
enum Step {
    Allocate(usize, NumaPolicy),
    Release(usize),
}

fn step() -> impl Strategy<Value = Step> {
    let policy = prop_oneof![3 => Just(NumaPolicy::Align), 1 => Just(NumaPolicy::Pack)];
    prop_oneof![
        4 => (0..8usize, policy).prop_map(|(s, numa)| Step::Allocate(s, numa)),
        1 => (0..8usize).prop_map(Step::Release),
    ]
}

fn gpu_device(node: usize, i: usize, g: &Gpu) -> Device {
    let (island, root, numa, bw, x, _) = g;
    let mut d = attrs(
        device(&format!("gpu-{i}")),
        &[
            (
                "resource.kubernetes.io/pcieRoot",
                string_attr(&format!("pci{node}:{root}")),
            ),
            ("type", string_attr(if *x { "X" } else { "Y" })),
        ],
    );
    if let Some(island) = island {
        d = attrs(
            d,
            &[
                (
                    "nvlinkIsland",
                    string_attr(&format!("node-{node}-island-{island}")),
                ),
                ("nvlinkBandwidthGBps", int_attr(*bw)),
            ],
        );
    }
    if let Some(numa) = numa {
        d = attrs(d, &[("numaNode", int_attr(*numa))]);
    }
    d
}

fn node_name(n: usize) -> String {
    format!("node-{n}")
}

fn cluster(nodes: &[Vec<Gpu>]) -> (Vec<ResourceSlice>, AllocatedState) {
    let mut slices = Vec::new();
    let mut state = AllocatedState::new();
    for (n, gpus) in nodes.iter().enumerate() {
        let name = node_name(n);
        let devices = gpus
            .iter()
            .enumerate()
            .map(|(i, g)| gpu_device(n, i, g))
            .collect();
        let mut s = slice(&name, On::Node(NODE1), pool(&name, 1), DRIVER, devices);
        s.spec.node_name = Some(name.clone());
        slices.push(s);
        for (i, g) in gpus.iter().enumerate() {
            if g.5 {
                state.insert_device(tessera_allocator::DeviceId::new(
                    DRIVER,
                    &name,
                    &format!("gpu-{i}"),
                ));
            }
        }
    }
    (slices, state)
}

fn claim_of(name: &str, shape: &Shape) -> ResourceClaim {
    let (requests, match_numa, first) = shape;
    let names: Vec<String> = (0..requests.len()).map(|i| format!("req-{i}")).collect();
    let requests: Vec<DeviceRequest> = requests
        .iter()
        .zip(&names)
        .enumerate()
        .map(|(i, ((count, only_x), req))| {
            let class = if *only_x { CLASS_X } else { CLASS_A };
            if i == 0 && *first {
                first_available(req, vec![sub(SUB0, class, 4), sub(SUB1, class, *count)])
            } else {
                request(req, class, *count)
            }
        })
        .collect();
    let constraints = if *match_numa && names.len() > 1 {
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        vec![match_attribute("gpu.tessera.dev/numaNode", &refs)]
    } else {
        Vec::new()
    };
    claim_with(name, requests, constraints, Vec::new())
}

fn inventory(slices: &[ResourceSlice], nodes: usize, reuse: bool) -> DeviceIndex {
    let inv = DeviceIndex::new(
        slices.to_vec(),
        vec![
            class(CLASS_A, DRIVER),
            class_with_selectors(
                CLASS_X,
                vec![selector(&format!(
                    "device.driver == \"{DRIVER}\" && device.attributes[\"{DRIVER}\"].type == \"X\""
                ))],
            ),
        ],
        (0..nodes).map(|n| node(&node_name(n), REGION1)).collect(),
    );
    inv.set_reuse_results(reuse);
    inv
}

/// The outcome without the step count (which counts only the searches actually run).
fn comparable(outcome: Outcome) -> Outcome {
    match outcome {
        Outcome::Allocated(mut a) => {
            a.steps = 0;
            Outcome::Allocated(a)
        }
        other => other,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn reusing_stored_results_chooses_what_searching_every_node_chooses(
        nodes in prop::collection::vec(prop::collection::vec(gpu(), 0..7), 1..6),
        shapes in prop::collection::vec(shape(), 1..4),
        steps in prop::collection::vec(step(), 1..16),
    ) {
        let (slices, mut state) = cluster(&nodes);
        let reusing = inventory(&slices, nodes.len(), true);
        let searching = inventory(&slices, nodes.len(), false);
        let mut held = Vec::new();
        for (i, step) in steps.iter().enumerate() {
            match step {
                Step::Allocate(s, numa) => {
                    let options = AllocateOptions {
                        mode: PlacementMode::TopologyAware,
                        explain: false,
                        numa: *numa,
                        ..AllocateOptions::default()
                    };
                    let claims = vec![claim_of(&format!("claim-{i}"), &shapes[s % shapes.len()])];
                    let got = reusing.allocate_among(&claims, &state, |_| true, &options);
                    let want = searching.allocate_among(&claims, &state, |_| true, &options);
                    match (got, want) {
                        (Ok(got), Ok(want)) => {
                            let (got, want) = (comparable(got), comparable(want));
                            prop_assert_eq!(&got, &want, "step {} of {:?}", i, steps);
                            if let Outcome::Allocated(a) = got {
                                let result = a.claims[0].result.clone();
                                state.add_allocation(&result).unwrap();
                                held.push(result);
                            }
                        }
                        (Err(got), Err(want)) => prop_assert_eq!(got.to_string(), want.to_string()),
                        (got, want) => prop_assert!(false, "step {i}: {got:?} vs {want:?}"),
                    }
                }
                Step::Release(n) if !held.is_empty() => {
                    let result = held.remove(n % held.len());
                    state.remove_allocation(&result).unwrap();
                }
                Step::Release(_) => {}
            }
        }
    }
}

/// A result stored under one NUMA policy never answers an allocation under the other: node-0's
/// four free GPUs straddle its two sockets (best fit prefers it: it breaks no whole node),
/// node-1 is free (four GPUs of one socket). `pack` must choose node-0 and `align` node-1, in
/// either order and again after both are stored.
#[test]
fn a_change_of_numa_policy_is_not_answered_from_a_stored_result() {
    let gpu = |numa: i64, used: bool| -> Gpu { (Some(0), 0, Some(numa), 900, true, used) };
    let fragmented: Vec<Gpu> = (0..8)
        .map(|i| gpu(i / 4, matches!(i, 0 | 1 | 4 | 5)))
        .collect();
    let free: Vec<Gpu> = (0..8).map(|i| gpu(i / 4, false)).collect();
    let (slices, state) = cluster(&[fragmented, free]);
    let claims = vec![claim_of("train", &(vec![(4, false)], false, false))];
    let chosen = |inv: &DeviceIndex, numa: NumaPolicy| {
        let options = AllocateOptions {
            mode: PlacementMode::TopologyAware,
            explain: false,
            numa,
            ..AllocateOptions::default()
        };
        match inv.allocate_among(&claims, &state, |_| true, &options) {
            Ok(Outcome::Allocated(a)) => (a.node, a.score.numa_nodes_spanned),
            other => panic!("{numa}: {other:?}"),
        }
    };
    let pack = (node_name(0), 2);
    let align = (node_name(1), 1);
    for order in [
        [NumaPolicy::Pack, NumaPolicy::Align],
        [NumaPolicy::Align, NumaPolicy::Pack],
    ] {
        let inv = inventory(&slices, 2, true);
        for _ in 0..2 {
            for numa in order {
                let want = match numa {
                    NumaPolicy::Pack => &pack,
                    NumaPolicy::Align => &align,
                };
                assert_eq!(&chosen(&inv, numa), want, "{numa} after {order:?}");
            }
        }
    }
}
