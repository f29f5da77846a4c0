//! Property tests of the allocator's invariants on random small clusters:
//! - no device is allocated twice, and never one that is already in use;
//! - every result satisfies its class and request selectors and the claim's constraints and
//!   counters;
//! - on small instances (≤ 8 devices) a solution exists exactly when brute force finds one;
//! - topology-aware placement never has a higher communication cost than first fit on the same node.

mod support;

use std::collections::HashSet;

use k8s_openapi::api::resource::v1::{Device, DeviceRequest, ResourceClaim};
use proptest::prelude::*;
use support::*;
use tessera_allocator::topology::{TopologyAttributes, comm_cost};
use tessera_allocator::{
    AllocateOptions, AllocatedState, DeviceId, DeviceIndex, Outcome, PlacementMode,
};

/// One device of a random instance.
#[derive(Clone, Debug)]
struct Dev {
    kind_x: bool,
    numa: Option<i64>,
    counter_units: i64,
    in_use: bool,
}

/// One request: how many devices, and whether it selects `type == "X"`.
#[derive(Clone, Debug)]
struct Req {
    count: usize,
    only_x: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Constraint {
    None,
    MatchNuma,
    DistinctNuma,
}

#[derive(Clone, Debug)]
struct Instance {
    devices: Vec<Dev>,
    /// Claims, each a list of requests and a constraint over all its requests.
    claims: Vec<(Vec<Req>, Constraint)>,
    /// Total units of the pool's one counter, if devices consume counters.
    counter_total: Option<i64>,
}

fn instance() -> impl Strategy<Value = Instance> {
    let dev = (
        any::<bool>(),
        prop::option::weighted(0.8, 0..2i64),
        1..3i64,
        prop::bool::weighted(0.2),
    )
        .prop_map(|(kind_x, numa, counter_units, in_use)| Dev {
            kind_x,
            numa,
            counter_units,
            in_use,
        });
    let req = (1..4usize, any::<bool>()).prop_map(|(count, only_x)| Req { count, only_x });
    let constraint = prop_oneof![
        Just(Constraint::None),
        Just(Constraint::MatchNuma),
        Just(Constraint::DistinctNuma)
    ];
    let claim = (prop::collection::vec(req, 1..3), constraint);
    (
        prop::collection::vec(dev, 0..9),
        prop::collection::vec(claim, 1..3),
        prop::option::weighted(0.4, 1..9i64),
    )
        .prop_map(|(devices, claims, counter_total)| Instance {
            devices,
            claims,
            counter_total,
        })
}

fn name(i: usize) -> String {
    format!("device-{i}")
}

fn build(inst: &Instance) -> (DeviceIndex, Vec<ResourceClaim>, AllocatedState) {
    let devices: Vec<Device> = inst
        .devices
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let mut dev = attrs(
                device(&name(i)),
                &[("type", string_attr(if d.kind_x { "X" } else { "Y" }))],
            );
            if let Some(n) = d.numa {
                dev = attrs(dev, &[("numa", int_attr(n))]);
            }
            if inst.counter_total.is_some() {
                dev = consuming(
                    dev,
                    COUNTER_SET1,
                    &[("units", &d.counter_units.to_string())],
                    false,
                );
            }
            dev
        })
        .collect();
    let mut slices = vec![node_slice(SLICE1, NODE1, POOL1, DRIVER_A, devices)];
    if let Some(total) = inst.counter_total {
        slices[0].spec.pool.resource_slice_count = 2;
        slices.push(counter_slice(
            SLICE2,
            On::Node(NODE1),
            pool(POOL1, 2),
            DRIVER_A,
            &[(COUNTER_SET1, &[("units", &total.to_string())])],
        ));
    }
    let claims = inst
        .claims
        .iter()
        .enumerate()
        .map(|(ci, (reqs, constraint))| {
            let requests: Vec<DeviceRequest> = reqs
                .iter()
                .enumerate()
                .map(|(ri, r)| {
                    request_with(&format!("req-{ri}"), CLASS_A, r.count as i64, |e| {
                        if r.only_x {
                            e.selectors = Some(vec![selector(
                                "device.attributes[\"driver-a\"].type == \"X\"",
                            )]);
                        }
                    })
                })
                .collect();
            let constraints = match constraint {
                Constraint::None => vec![],
                Constraint::MatchNuma => vec![match_attribute(INT_ATTRIBUTE, &[])],
                Constraint::DistinctNuma => vec![distinct_attribute(INT_ATTRIBUTE, &[])],
            };
            claim_with(&format!("claim-{ci}"), requests, constraints, vec![])
        })
        .collect();
    let mut state = AllocatedState::new();
    for (i, d) in inst.devices.iter().enumerate() {
        if d.in_use {
            state.insert_device(DeviceId::new(DRIVER_A, POOL1, &name(i)));
        }
    }
    let inv = DeviceIndex::new(
        slices,
        vec![class(CLASS_A, DRIVER_A)],
        vec![node(NODE1, REGION1)],
    );
    (inv, claims, state)
}

/// Whether `chosen` (per claim, per request: device indices) satisfies everything.
fn valid(inst: &Instance, chosen: &[Vec<Vec<usize>>]) -> Result<(), String> {
    let mut seen = HashSet::new();
    // Devices already in use consume their counters too.
    let mut units: i64 = inst
        .devices
        .iter()
        .filter(|d| d.in_use)
        .map(|d| d.counter_units)
        .sum();
    for (ci, (reqs, constraint)) in inst.claims.iter().enumerate() {
        let mut claim_devices = Vec::new();
        for (ri, r) in reqs.iter().enumerate() {
            let devs = &chosen[ci][ri];
            if devs.len() != r.count {
                return Err(format!(
                    "claim {ci} request {ri}: {} devices, {} wanted",
                    devs.len(),
                    r.count
                ));
            }
            for &d in devs {
                let dev = &inst.devices[d];
                if !seen.insert(d) {
                    return Err(format!("device {d} allocated twice"));
                }
                if dev.in_use {
                    return Err(format!("device {d} already in use"));
                }
                if r.only_x && !dev.kind_x {
                    return Err(format!("device {d} does not match the request selector"));
                }
                units += dev.counter_units;
                claim_devices.push(dev.numa);
            }
        }
        let ok = match constraint {
            Constraint::None => true,
            Constraint::MatchNuma => {
                claim_devices.iter().all(Option::is_some)
                    && claim_devices.windows(2).all(|w| w[0] == w[1])
            }
            Constraint::DistinctNuma => {
                let set: HashSet<_> = claim_devices.iter().collect();
                claim_devices.iter().all(Option::is_some) && set.len() == claim_devices.len()
            }
        };
        if !ok {
            return Err(format!("claim {ci}: constraint {constraint:?} violated"));
        }
    }
    if let Some(total) = inst.counter_total
        && units > total
    {
        return Err(format!("counters overdrawn: {units} > {total}"));
    }
    Ok(())
}

/// Exhaustive search over combinations, independent of the allocator's code.
fn brute_force(inst: &Instance) -> bool {
    let slots: Vec<(usize, usize)> = inst
        .claims
        .iter()
        .enumerate()
        .flat_map(|(ci, (reqs, _))| (0..reqs.len()).map(move |ri| (ci, ri)))
        .collect();
    let mut chosen: Vec<Vec<Vec<usize>>> = inst
        .claims
        .iter()
        .map(|(r, _)| vec![Vec::new(); r.len()])
        .collect();
    fn go(
        inst: &Instance,
        slots: &[(usize, usize)],
        k: usize,
        used: &mut Vec<bool>,
        chosen: &mut Vec<Vec<Vec<usize>>>,
    ) -> bool {
        if k == slots.len() {
            return valid(inst, chosen).is_ok();
        }
        let (ci, ri) = slots[k];
        let count = inst.claims[ci].0[ri].count;
        let n = inst.devices.len();
        // All subsets of unused devices of size `count` (bitmask over ≤ 8 devices).
        for mask in 0u32..(1 << n) {
            if mask.count_ones() as usize != count
                || (0..n).any(|i| mask & (1 << i) != 0 && used[i])
            {
                continue;
            }
            let devs: Vec<usize> = (0..n).filter(|i| mask & (1 << i) != 0).collect();
            for &d in &devs {
                used[d] = true;
            }
            chosen[ci][ri] = devs.clone();
            let found = go(inst, slots, k + 1, used, chosen);
            for &d in &devs {
                used[d] = false;
            }
            if found {
                return true;
            }
        }
        false
    }
    let mut used = vec![false; inst.devices.len()];
    go(inst, &slots, 0, &mut used, &mut chosen)
}

/// The allocation as device indices per claim and request.
fn decode(inst: &Instance, outcome: &Outcome) -> Option<Vec<Vec<Vec<usize>>>> {
    let Outcome::Allocated(a) = outcome else {
        return None;
    };
    let mut chosen: Vec<Vec<Vec<usize>>> = inst
        .claims
        .iter()
        .map(|(r, _)| vec![Vec::new(); r.len()])
        .collect();
    for (ci, c) in a.claims.iter().enumerate() {
        for r in c.result.devices.as_ref().unwrap().results.as_ref().unwrap() {
            let ri: usize = r.request.trim_start_matches("req-").parse().unwrap();
            let d: usize = r.device.trim_start_matches("device-").parse().unwrap();
            chosen[ci][ri].push(d);
        }
    }
    Some(chosen)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn first_fit_is_sound_and_complete(inst in instance()) {
        let (inv, claims, state) = build(&inst);
        let outcome = inv.allocate(&claims, &state, Some(NODE1), &AllocateOptions::default()).unwrap();
        let exists = brute_force(&inst);
        match decode(&inst, &outcome) {
            Some(chosen) => {
                prop_assert!(exists, "allocated although brute force finds nothing");
                prop_assert_eq!(valid(&inst, &chosen), Ok(()));
            }
            None => prop_assert!(!exists, "unsatisfiable although brute force finds a solution"),
        }
    }

    #[test]
    fn topology_aware_is_sound_and_complete(inst in instance()) {
        let (inv, claims, state) = build(&inst);
        let options = AllocateOptions { mode: PlacementMode::TopologyAware, ..AllocateOptions::default() };
        let outcome = inv.allocate(&claims, &state, Some(NODE1), &options).unwrap();
        match decode(&inst, &outcome) {
            Some(chosen) => prop_assert_eq!(valid(&inst, &chosen), Ok(())),
            None => prop_assert!(!brute_force(&inst)),
        }
    }
}

/// A GPU of a random node: NVLink island, PCIe root, NUMA node, bandwidth, in use.
fn gpu() -> impl Strategy<Value = (Option<u8>, u8, Option<i64>, i64, bool)> {
    (
        prop::option::weighted(0.6, 0..2u8),
        0..4u8,
        prop::option::weighted(0.9, 0..2i64),
        prop_oneof![Just(900i64), Just(600), Just(100)],
        prop::bool::weighted(0.25),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn topology_aware_is_optimal_and_never_costs_more_than_first_fit(gpus in prop::collection::vec(gpu(), 1..9), count in 1..5i64) {
        const DRIVER: &str = "gpu.tessera.dev";
        let devices: Vec<Device> = gpus
            .iter()
            .enumerate()
            .map(|(i, (island, root, numa, bw, _))| {
                let mut d = attrs(
                    device(&name(i)),
                    &[("resource.kubernetes.io/pcieRoot", string_attr(&format!("pci0000:{root}")))],
                );
                if let Some(island) = island {
                    d = attrs(d, &[("nvlinkIsland", string_attr(&format!("island-{island}"))), ("nvlinkBandwidthGBps", int_attr(*bw))]);
                }
                if let Some(numa) = numa {
                    d = attrs(d, &[("numaNode", int_attr(*numa))]);
                }
                d
            })
            .collect();
        let mut state = AllocatedState::new();
        for (i, g) in gpus.iter().enumerate() {
            if g.4 {
                state.insert_device(DeviceId::new(DRIVER, NODE1, &name(i)));
            }
        }
        let inv = DeviceIndex::new(
            vec![node_slice(SLICE1, NODE1, NODE1, DRIVER, devices.clone())],
            vec![class(CLASS_A, DRIVER)],
            vec![node(NODE1, REGION1)],
        );
        let claims = vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, count)])];
        let run = |mode| inv.allocate(&claims, &state, Some(NODE1), &AllocateOptions { mode, ..AllocateOptions::default() }).unwrap();
        match (run(PlacementMode::FirstFit), run(PlacementMode::TopologyAware)) {
            (Outcome::Allocated(ff), Outcome::Allocated(ta)) => {
                prop_assert!(ta.score.comm_cost <= ff.score.comm_cost, "topology-aware {} > first-fit {}", ta.score, ff.score);
                prop_assert!(ta.score <= ff.score);
                // And it is optimal: no set of free devices communicates more cheaply.
                let topo: Vec<TopologyAttributes> = devices.iter().map(|d| TopologyAttributes::from_device(DRIVER, d)).collect();
                let free: Vec<usize> = (0..gpus.len()).filter(|&i| !gpus[i].4).collect();
                let best = (0u32..(1 << free.len()))
                    .filter(|m| m.count_ones() as i64 == count)
                    .map(|m| comm_cost(free.iter().enumerate().filter(|(b, _)| m & (1 << b) != 0).map(|(_, &i)| (i, &topo[i]))))
                    .min()
                    .unwrap();
                prop_assert_eq!(ta.score.comm_cost, best);
            }
            (Outcome::Unsatisfiable(_), Outcome::Unsatisfiable(_)) => {}
            (ff, ta) => prop_assert!(false, "modes disagree on feasibility: {ff:?} vs {ta:?}"),
        }
    }
}
