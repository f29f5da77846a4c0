//! The planner on data: which devices, which node, what to undo, and what the pod is told — no
//! API server involved.

use tessera_controller_harness as support;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use support::*;
use tessera_allocator::{AllocateOptions, AllocatedState, DeviceIndex, PlacementMode};
use tessera_api::names::NUMA_POLICY_ANNOTATION;
use tessera_placement::extended::ExtendedResources;
use tessera_placement::managed::{managed_slices, unmanaged_slices};
use tessera_placement::nodes::{NodeFacts, NodeFilter, PodRequirements};
use tessera_placement::planner::{Action, Failure, PlacementInput, PodPlan, decide};
use tessera_placement::protocol::{
    CLAIM_MARK_ANNOTATION, ClaimMark, POD_PLACEMENT_ANNOTATION, PodPlacement,
};
use tessera_placement::resolve::{PodClaim, Resolution, resolve_claims};
use tessera_placement::view::{Settings, decide_released};

#[derive(Default)]
struct World {
    slices: Vec<ResourceSlice>,
    classes: Vec<DeviceClass>,
    nodes: Vec<Node>,
    claims: Vec<ResourceClaim>,
}

impl World {
    /// `managed` DGX nodes `dgx-0..` and `plain` unmanaged ones `plain-0..`, shipped classes.
    fn dgx(managed: usize, plain: usize) -> World {
        let mut world = World {
            classes: shipped_classes(),
            ..World::default()
        };
        for i in 0..managed {
            let name = format!("dgx-{i}");
            world.slices.extend(dgx_slices(&name, true));
            world.nodes.push(node(&name, true));
        }
        for i in 0..plain {
            let name = format!("plain-{i}");
            world.slices.extend(dgx_slices(&name, false));
            world.nodes.push(node(&name, false));
        }
        world
    }

    /// The pod's claims, resolved from the world's.
    fn resolved(&self, pod: &Pod) -> Vec<PodClaim> {
        let by_name: HashMap<String, Arc<ResourceClaim>> = self
            .claims
            .iter()
            .map(|c| (c.metadata.name.clone().unwrap(), Arc::new(c.clone())))
            .collect();
        let Resolution::Resolved(claims) =
            resolve_claims(pod, |n| by_name.get(n).cloned(), |_| true)
        else {
            panic!("the test pod's claims resolve");
        };
        claims
    }

    fn decide(&self, pod: &Pod, gated: bool) -> PodPlan {
        let facts: Vec<NodeFacts> = self.nodes.iter().map(NodeFacts::from).collect();
        let infos = || facts.iter().map(|n| n.info.clone()).collect();
        let (managed, managed_nodes) = managed_slices(self.slices.clone());
        let managed = DeviceIndex::new(managed, self.classes.clone(), infos());
        let unmanaged = Arc::new(DeviceIndex::new(
            unmanaged_slices(self.slices.clone()),
            self.classes.clone(),
            infos(),
        ));
        let claims = self.resolved(pod);
        let in_use = AllocatedState::from_claims(&self.claims).unwrap();
        let nodes = NodeFilter::run(
            &PodRequirements::of(pod),
            &facts,
            &managed_nodes,
            &HashMap::new(),
        );
        let unmanaged_fn = || unmanaged.clone();
        let extended = ExtendedResources::new(&self.classes);
        decide(&PlacementInput {
            pod,
            gated,
            claims: &claims,
            managed: &managed,
            unmanaged: &unmanaged_fn,
            extended: &extended,
            in_use: &in_use,
            nodes,
            now: Timestamp::now(),
            avoid_for: SignedDuration::from_mins(5),
            options: AllocateOptions {
                mode: PlacementMode::TopologyAware,
                explain: false,
                ..AllocateOptions::default()
            },
        })
    }
}

/// Claim name and the devices written into it.
type Written = Vec<(String, Vec<String>)>;

/// The node, the writes and the claims undone first of a placement.
fn placed(decision: &PodPlan) -> (String, Written, Vec<String>) {
    let Action::Place(p) = &decision.action else {
        panic!("expected a placement, got {:?}", decision.action);
    };
    (
        p.node.clone(),
        p.writes
            .iter()
            .map(|w| {
                (
                    w.claim.metadata.name.clone().unwrap(),
                    devices_of(&w.allocation),
                )
            })
            .collect(),
        p.undo
            .iter()
            .map(|c| c.metadata.name.clone().unwrap())
            .collect(),
    )
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

fn marked(mut claim: ResourceClaim, pod: &Pod, node: &str) -> ResourceClaim {
    let mark = ClaimMark {
        pod_uid: pod.metadata.uid.clone().unwrap(),
        pod: pod.metadata.name.clone().unwrap(),
        node: node.into(),
        finalizer_added: true,
    };
    claim.metadata.annotations = Some(BTreeMap::from([(
        CLAIM_MARK_ANNOTATION.to_owned(),
        mark.to_annotation(),
    )]));
    claim
}

#[test]
fn a_fragmented_node_gets_the_gpus_of_one_numa_node() {
    // gpu-0 and gpu-1 are taken: first fit would take gpu-2..5 across both NUMA nodes.
    let mut world = World::dgx(1, 0);
    world.claims.push(allocated(
        gpu_claim("taken", 2),
        "dgx-0",
        &["gpu-0", "gpu-1"],
    ));
    world.claims.push(gpu_claim("train", 4));
    let pod = gated_pod("trainer", &[("gpus", Source::Claim("train"))]);
    let decision = world.decide(&pod, true);
    let (node, writes, undo) = placed(&decision);
    assert_eq!(node, "dgx-0");
    assert_eq!(
        writes,
        [(
            "train".to_owned(),
            strings(&["gpu-4", "gpu-5", "gpu-6", "gpu-7"])
        )]
    );
    assert!(undo.is_empty());
    let Action::Place(p) = &decision.action else {
        unreachable!()
    };
    let result = &p.writes[0].allocation;
    let tolerations = result.devices.as_ref().unwrap().results.as_ref().unwrap()[0]
        .tolerations
        .clone();
    assert_eq!(
        tolerations,
        Some(vec![tessera_placement::claims::managed_toleration()]),
        "results record the toleration of the managed taint"
    );
    assert!(result.node_selector.is_some());
}

#[test]
fn a_claim_that_fits_one_socket_gets_one_numa_node_unless_the_pod_asks_to_pack() {
    // dgx-0 has two GPUs in use on each socket, so its four free GPUs straddle them; dgx-1 is
    // free. Best fit alone prefers dgx-0 (it breaks no whole node); alignment prefers dgx-1.
    let mut world = World::dgx(2, 0);
    world.claims.push(allocated(
        gpu_claim("taken", 4),
        "dgx-0",
        &["gpu-0", "gpu-1", "gpu-4", "gpu-5"],
    ));
    world.claims.push(gpu_claim("train", 4));
    let pod = gated_pod("trainer", &[("gpus", Source::Claim("train"))]);
    let (node, writes, _) = placed(&world.decide(&pod, true));
    assert_eq!(node, "dgx-1");
    assert_eq!(
        writes,
        [(
            "train".to_owned(),
            strings(&["gpu-0", "gpu-1", "gpu-2", "gpu-3"])
        )]
    );
    let annotated = |value: &str| {
        let mut pod = pod.clone();
        pod.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(NUMA_POLICY_ANNOTATION.to_owned(), value.to_owned());
        pod
    };
    let (node, writes, _) = placed(&world.decide(&annotated("pack"), true));
    assert_eq!(node, "dgx-0");
    assert_eq!(
        writes,
        [(
            "train".to_owned(),
            strings(&["gpu-2", "gpu-3", "gpu-6", "gpu-7"])
        )]
    );
    let (node, _, _) = placed(&world.decide(&annotated("align"), true));
    assert_eq!(node, "dgx-1");
    let Action::CannotPlace {
        failure, message, ..
    } = world.decide(&annotated("packed"), true).action
    else {
        panic!("a wrong annotation value must be refused");
    };
    assert_eq!(failure, Failure::InvalidInput);
    assert!(
        message.contains(NUMA_POLICY_ANNOTATION) && message.contains("`packed`"),
        "{message}"
    );
}

#[test]
fn unmanaged_devices_are_never_allocated() {
    let mut world = World::dgx(1, 1);
    world.claims.push(allocated(
        gpu_claim("taken", 8),
        "dgx-0",
        &[
            "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7",
        ],
    ));
    world.claims.push(gpu_claim("train", 1));
    let pod = gated_pod("trainer", &[("gpus", Source::Claim("train"))]);
    let decision = world.decide(&pod, true);
    let Action::CannotPlace {
        failure, message, ..
    } = &decision.action
    else {
        panic!("expected no placement, got {:?}", decision.action);
    };
    assert_eq!(*failure, Failure::Unsatisfiable);
    assert!(
        message.starts_with("claim ml/train cannot be allocated (topology-aware): 0 of 2 nodes fit: 1 without enough free devices for the claims, 1 have no topology-managed devices"),
        "{message}"
    );
    assert!(message.contains("node dgx-0: cannot allocate"), "{message}");
    assert!(message.contains("in use by another claim"), "{message}");
}

#[test]
fn two_claims_of_a_pod_land_on_one_node_together() {
    let mut world = World::dgx(2, 0);
    // dgx-0 has 4 free GPUs: enough for each claim alone, not for both.
    world.claims.push(allocated(
        gpu_claim("taken", 4),
        "dgx-0",
        &["gpu-0", "gpu-1", "gpu-2", "gpu-3"],
    ));
    world.claims.push(gpu_claim("a", 4));
    world.claims.push(gpu_claim("b", 4));
    let pod = gated_pod(
        "trainer",
        &[
            ("first", Source::Claim("a")),
            ("second", Source::Claim("b")),
        ],
    );
    let decision = world.decide(&pod, true);
    let (node, writes, _) = placed(&decision);
    assert_eq!(node, "dgx-1");
    let mut devices: Vec<String> = writes.iter().flat_map(|(_, d)| d.clone()).collect();
    devices.sort();
    assert_eq!(
        devices,
        strings(&[
            "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"
        ])
    );
    assert_eq!(writes[0].0, "a");
    assert_eq!(writes[1].0, "b");
}

#[test]
fn a_claim_for_another_drivers_devices_goes_to_the_scheduler() {
    let mut world = World::dgx(1, 0);
    world
        .classes
        .push(class("nic", "device.driver == \"nic.example.com\""));
    let mut nic = dgx_slices("dgx-0", false).remove(0);
    nic.metadata.name = Some("dgx-0-nic".into());
    nic.spec.driver = "nic.example.com".into();
    nic.spec.pool.name = "dgx-0-nic".into();
    world.slices.push(nic);
    world.claims.push(gpu_claim("train", 2));
    world.claims.push(claim_of("net", "nic", 1));
    let pod = gated_pod(
        "trainer",
        &[
            ("gpus", Source::Claim("train")),
            ("nic", Source::Claim("net")),
        ],
    );
    let decision = world.decide(&pod, true);
    let Action::LeaveToScheduler { message } = &decision.action else {
        panic!(
            "expected the scheduler to get the pod, got {:?}",
            decision.action
        );
    };
    assert!(
        message
            .contains("claim ml/net, request gpus: class nic selects no topology-managed device"),
        "{message}"
    );
}

/// `pod` with `limits` on its first container.
fn with_limits(mut pod: Pod, limits: &[(&str, &str)]) -> Pod {
    let container = &mut pod.spec.as_mut().unwrap().containers[0];
    let resources = container.resources.get_or_insert_with(Default::default);
    resources.limits = Some(
        limits
            .iter()
            .map(|(k, v)| {
                (
                    (*k).to_owned(),
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity((*v).to_owned()),
                )
            })
            .collect(),
    );
    pod
}

#[test]
fn a_pod_asking_for_extended_resources_goes_to_the_scheduler() {
    // The shipped classes name nvidia.com/gpu and nvidia.com/mig-<profile>: the scheduler
    // allocates those itself, so the controller leaves the whole pod to it, claims included.
    let mut world = World::dgx(1, 1);
    world.claims.push(gpu_claim("train", 2));
    let no_claims = with_limits(gated_pod("plain", &[]), &[("nvidia.com/gpu", "4")]);
    let with_claim = with_limits(
        gated_pod("mixed", &[("gpus", Source::Claim("train"))]),
        &[("nvidia.com/mig-1g.10gb", "1"), ("cpu", "1")],
    );
    for (pod, names) in [
        (&no_claims, "nvidia.com/gpu (DeviceClass gpu.tessera.dev)"),
        (
            &with_claim,
            "nvidia.com/mig-1g.10gb (DeviceClass mig-1g.10gb.gpu.tessera.dev)",
        ),
    ] {
        let decision = world.decide(pod, true);
        let Action::LeaveToScheduler { message } = &decision.action else {
            panic!(
                "expected the scheduler to get the pod, got {:?}",
                decision.action
            );
        };
        assert!(
            message.contains(&format!(
                "the pod asks for the extended resource(s) {names}"
            )) && message.contains("ask for the devices in a ResourceClaim instead"),
            "{message}"
        );
    }
    // Names no class carries (a device plugin's, or the chart's names turned off) change
    // nothing: the pod's claim is placed as before.
    let plugin = with_limits(
        gated_pod("plugin", &[("gpus", Source::Claim("train"))]),
        &[("example.com/fpga", "1"), ("nvidia.com/gpu", "0")],
    );
    let (node, written, _) = placed(&world.decide(&plugin, true));
    assert_eq!(node, "dgx-0");
    assert_eq!(written.len(), 1);
    // An ungated pod is not the controller's to place at all.
    assert_eq!(world.decide(&no_claims, false).action, Action::Nothing);
}

#[test]
fn extended_resources_undo_the_controllers_own_allocations_first() {
    // The controller placed the pod's claim before its class got an extended-resource name the
    // pod also asks for: undo that allocation, so that the scheduler places everything together.
    let mut world = World::dgx(1, 0);
    let pod = with_limits(
        gated_pod("trainer", &[("gpus", Source::Claim("train"))]),
        &[("nvidia.com/gpu", "1")],
    );
    world.claims.push(marked(
        allocated(gpu_claim("train", 2), "dgx-0", &["gpu-0", "gpu-1"]),
        &pod,
        "dgx-0",
    ));
    let Action::CannotPlace {
        failure,
        message,
        undo,
    } = world.decide(&pod, true).action
    else {
        panic!("expected the controller's allocation undone");
    };
    assert_eq!(failure, Failure::InvalidInput);
    assert!(
        message.contains("undoing the controller's earlier allocations first"),
        "{message}"
    );
    assert_eq!(
        undo.iter()
            .map(|c| c.metadata.name.clone().unwrap())
            .collect::<Vec<_>>(),
        ["train"]
    );
}

#[test]
fn a_class_that_selects_nothing_anywhere_keeps_the_pod_waiting() {
    let mut world = World::dgx(1, 0);
    world.classes.push(class(
        "b200",
        "device.attributes[\"gpu.tessera.dev\"].productName == \"B200\"",
    ));
    world.claims.push(claim_of("train", "b200", 1));
    let pod = gated_pod("trainer", &[("gpus", Source::Claim("train"))]);
    let Action::CannotPlace {
        failure, message, ..
    } = world.decide(&pod, true).action
    else {
        panic!("expected no placement");
    };
    assert_eq!(failure, Failure::Unsatisfiable);
    assert_eq!(
        message,
        "claim ml/train, request gpus: class b200 selects no device in the cluster"
    );
}

#[test]
fn bad_input_is_named() {
    let mut world = World::dgx(1, 0);
    world.classes.push(class(
        "broken",
        "device.attributes[\"gpu.tessera.dev\"].nope == 1",
    ));
    world.claims.push(claim_of("unknown", "no-such-class", 1));
    world.claims.push(claim_of("cel", "broken", 1));
    for (claim, expected) in [
        (
            "unknown",
            "claim ml/unknown, request gpus: DeviceClass no-such-class does not exist",
        ),
        (
            "cel",
            "claim ml/cel, request gpus: class broken: selector #0 on device gpu.tessera.dev/dgx-0/gpu-0: CEL runtime error",
        ),
    ] {
        let pod = gated_pod("p", &[("gpus", Source::Claim(claim))]);
        let Action::CannotPlace {
            failure, message, ..
        } = world.decide(&pod, true).action
        else {
            panic!("expected invalid input for {claim}");
        };
        assert_eq!(failure, Failure::InvalidInput);
        assert!(message.starts_with(expected), "{message}");
    }
}

#[test]
fn a_partial_placement_is_completed_on_its_node() {
    let mut world = World::dgx(2, 0);
    let pod = gated_pod(
        "trainer",
        &[
            ("first", Source::Claim("a")),
            ("second", Source::Claim("b")),
        ],
    );
    // A previous leader wrote claim a on dgx-1 and died before claim b.
    world.claims.push(marked(
        allocated(gpu_claim("a", 2), "dgx-1", &["gpu-4", "gpu-5"]),
        &pod,
        "dgx-1",
    ));
    world.claims.push(gpu_claim("b", 2));
    let (node, writes, undo) = placed(&world.decide(&pod, true));
    assert_eq!(node, "dgx-1");
    assert!(undo.is_empty(), "claim a stays where it is");
    assert_eq!(writes.len(), 1);
    assert_eq!(writes[0].0, "b");
    assert_eq!(writes[0].1.len(), 2);
    assert!(
        writes[0].1.iter().all(|d| d != "gpu-4" && d != "gpu-5"),
        "{writes:?}"
    );
}

#[test]
fn a_partial_placement_that_cannot_be_completed_is_redone() {
    let mut world = World::dgx(2, 0);
    let pod = gated_pod(
        "trainer",
        &[
            ("first", Source::Claim("a")),
            ("second", Source::Claim("b")),
        ],
    );
    world.claims.push(marked(
        allocated(gpu_claim("a", 2), "dgx-1", &["gpu-0", "gpu-1"]),
        &pod,
        "dgx-1",
    ));
    world.claims.push(allocated(
        gpu_claim("other", 6),
        "dgx-1",
        &["gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"],
    ));
    world.claims.push(gpu_claim("b", 4));
    let (node, writes, undo) = placed(&world.decide(&pod, true));
    assert_eq!(node, "dgx-0");
    assert_eq!(undo, ["a"]);
    let names: Vec<&str> = writes.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
}

#[test]
fn a_given_back_allocation_moves_the_pod_off_that_node() {
    let mut world = World::dgx(2, 0);
    let mut pod = gated_pod(
        "trainer",
        &[
            ("first", Source::Claim("a")),
            ("second", Source::Claim("b")),
        ],
    );
    // Released earlier with both claims on dgx-0; the scheduler gave back claim b.
    pod.spec.as_mut().unwrap().scheduling_gates = None;
    pod.metadata.annotations = Some(BTreeMap::from([(
        POD_PLACEMENT_ANNOTATION.to_owned(),
        PodPlacement {
            node: "dgx-0".into(),
            ..Default::default()
        }
        .to_annotation(),
    )]));
    world.claims.push(marked(
        allocated(gpu_claim("a", 2), "dgx-0", &["gpu-4", "gpu-5"]),
        &pod,
        "dgx-0",
    ));
    world.claims.push(marked(gpu_claim("b", 2), &pod, "dgx-0"));
    let decision = world.decide(&pod, false);
    assert!(decision.record_first, "the node to avoid is recorded first");
    assert_eq!(decision.record.avoid.keys().collect::<Vec<_>>(), ["dgx-0"]);
    let (node, writes, undo) = placed(&decision);
    assert_eq!(node, "dgx-1");
    assert_eq!(undo, ["a"]);
    assert_eq!(writes.len(), 2);
}

#[test]
fn a_pod_whose_claims_are_allocated_is_just_released() {
    let mut world = World::dgx(1, 0);
    world
        .claims
        .push(allocated(gpu_claim("a", 1), "dgx-0", &["gpu-0"]));
    let pod = gated_pod("trainer", &[("gpus", Source::Claim("a"))]);
    assert_eq!(
        world.decide(&pod, true).action,
        Action::Release { node: None }
    );
    assert_eq!(world.decide(&pod, false).action, Action::Nothing);
}

#[test]
fn a_released_pod_with_every_claim_allocated_is_decided_without_the_cluster() {
    // `decide_released` (the worker's shortcut, taken before any node filter or snapshot of what
    // is in use) answers exactly what the full decision answers, and only for released pods with
    // nothing left to allocate.
    let mut world = World::dgx(1, 0);
    let released = |name: &str, claim: &str| {
        let mut pod = gated_pod(name, &[("gpus", Source::Claim(claim))]);
        pod.spec.as_mut().unwrap().scheduling_gates = None;
        pod.metadata.annotations = Some(BTreeMap::from([(
            POD_PLACEMENT_ANNOTATION.to_owned(),
            PodPlacement {
                node: "dgx-0".into(),
                ..Default::default()
            }
            .to_annotation(),
        )]));
        pod
    };
    let placed_pod = released("placed", "own");
    let scheduled = released("scheduled", "theirs");
    let given_back = released("given-back", "back");
    let waiting = released("waiting", "pending");
    let gated = gated_pod("gated", &[("gpus", Source::Claim("theirs"))]);
    let mut no_claims = gated_pod("no-claims", &[]);
    no_claims.spec.as_mut().unwrap().scheduling_gates = None;
    world.claims.push(marked(
        allocated(gpu_claim("own", 1), "dgx-0", &["gpu-0"]),
        &placed_pod,
        "dgx-0",
    ));
    world
        .claims
        .push(allocated(gpu_claim("theirs", 1), "dgx-0", &["gpu-1"]));
    world
        .claims
        .push(marked(gpu_claim("back", 1), &given_back, "dgx-0"));
    world.claims.push(gpu_claim("pending", 1));
    let settings = Settings::new(tessera_api::names::TOPOLOGY_AWARE_GATE);
    for (pod, shortcut) in [
        (&placed_pod, true),
        (&scheduled, true),
        (&no_claims, true),
        (&given_back, false),
        (&waiting, false),
        (&gated, false),
    ] {
        let name = pod.metadata.name.as_deref().unwrap();
        let fast = decide_released(pod, &world.resolved(pod), &settings);
        assert_eq!(fast.is_some(), shortcut, "pod {name}: {fast:?}");
        if let Some(fast) = fast {
            assert_eq!(fast.action, Action::Nothing, "pod {name}");
            assert_eq!(fast, world.decide(pod, false), "pod {name}");
        }
    }
    // The full decision for the ones it leaves alone is not "nothing".
    assert!(world.decide(&given_back, false).record_first);
    assert!(matches!(
        world.decide(&waiting, false).action,
        Action::Place(_)
    ));
}

#[test]
fn the_pods_node_constraints_apply() {
    let mut world = World::dgx(2, 0);
    world.claims.push(gpu_claim("a", 1));
    let mut pod = gated_pod("trainer", &[("gpus", Source::Claim("a"))]);
    pod.spec.as_mut().unwrap().node_selector = Some(BTreeMap::from([(
        "kubernetes.io/hostname".to_owned(),
        "dgx-1".to_owned(),
    )]));
    let (node, _, _) = placed(&world.decide(&pod, true));
    assert_eq!(node, "dgx-1");
}
