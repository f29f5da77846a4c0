//! The decision for one pod, as a function of data: which claims to allocate where, which of the
//! controller's own earlier allocations to undo first, or why nothing can be done. No IO; the
//! controller's worker carries the decision out.
//!
//! A pod's claims are allocated jointly on one node. Claims already allocated by someone else are
//! fixed and pin the node; the controller's own allocations for the pod are completed on their
//! node when possible and otherwise undone and placed again from scratch, so the pod never stays
//! with part of its claims allocated.

use std::borrow::Cow;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaim};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tessera_allocator::{
    AllocateError, AllocateOptions, AllocatedState, DeviceIndex, NumaPolicy, NumaPolicyError,
    Outcome, TopologyScore, selector_matches,
};
use tessera_api::names::NUMA_POLICY_ANNOTATION;

use crate::claims::{PodClaims, allocation, request_classes, tolerating_managed_taint};
use crate::extended::ExtendedResources;
use crate::message::{claim_list, unsatisfiable_message};
use crate::nodes::{NodeFilter, Rejection};
use crate::protocol::PodPlacement;
use crate::reason::PodReason;
use crate::resolve::PodClaim;

/// Everything one decision reads.
pub struct PlacementInput<'a> {
    pub pod: &'a Pod,
    /// Whether the pod still carries the scheduling gate.
    pub gated: bool,
    pub claims: &'a [PodClaim],
    /// The topology-managed devices (the only ones the controller allocates).
    pub managed: &'a DeviceIndex,
    /// The devices the scheduler may allocate (untainted, any driver); built only when needed.
    pub unmanaged: &'a dyn Fn() -> Arc<DeviceIndex>,
    /// The extended resources DeviceClasses stand for (only the scheduler allocates them).
    pub extended: &'a ExtendedResources,
    /// Every allocated claim, whoever allocated it.
    pub in_use: &'a AllocatedState,
    /// The nodes the pod may run on, before devices are considered.
    pub nodes: NodeFilter,
    pub now: Timestamp,
    /// How long to avoid a node where the scheduler gave back an allocation.
    pub avoid_for: SignedDuration,
    pub options: AllocateOptions,
}

/// A pod whose NUMA policy annotation is not one waits with an event naming it.
fn check_numa_policy(input: &PlacementInput<'_>, sorted: &PodClaims) -> Option<Action> {
    numa_policy(input.pod)
        .err()
        .map(|message| Action::CannotPlace {
            failure: Failure::InvalidInput,
            message,
            undo: sorted.own.clone(),
        })
}

/// The allocator options for this pod: the controller's, with the pod's own NUMA policy.
fn pod_options(input: &PlacementInput<'_>) -> AllocateOptions {
    let mut options = input.options;
    if let Ok(Some(numa)) = numa_policy(input.pod) {
        options.numa = numa;
    }
    options
}

/// The pod's own NUMA policy ([`NUMA_POLICY_ANNOTATION`]), if it sets one.
fn numa_policy(pod: &Pod) -> Result<Option<NumaPolicy>, String> {
    let Some(value) = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(NUMA_POLICY_ANNOTATION))
    else {
        return Ok(None);
    };
    value
        .parse()
        .map(Some)
        .map_err(|e: NumaPolicyError| format!("annotation {NUMA_POLICY_ANNOTATION}: {e}"))
}

/// One claim and the allocation to write into it.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimWrite {
    pub claim: Arc<ResourceClaim>,
    pub allocation: AllocationResult,
}

/// A placement to carry out.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    pub node: String,
    /// The controller's own allocations to clear before writing (they are placed again).
    pub undo: Vec<Arc<ResourceClaim>>,
    /// Allocations to write, in order.
    pub writes: Vec<ClaimWrite>,
    pub score: TopologyScore,
    /// The search stopped at its budget: valid, maybe not the best placement.
    pub truncated: bool,
}

/// Why a pod cannot be placed now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The claims fit on no eligible node: retry when the cluster changes.
    Unsatisfiable,
    /// The input is wrong (unknown class, CEL error, invalid claim): retry when objects change.
    InvalidInput,
    /// Only evicting pods that disruption budgets protect (or whose eviction was refused) could
    /// make room: retry when the cluster or the budgets change.
    PreemptionBlocked,
}

impl Failure {
    /// The condition reason and metric label.
    pub fn reason(self) -> PodReason {
        match self {
            Failure::Unsatisfiable => PodReason::Unsatisfiable,
            Failure::InvalidInput => PodReason::InvalidInput,
            Failure::PreemptionBlocked => PodReason::PreemptionBlocked,
        }
    }
}

/// What to do with the pod.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Allocate (after undoing) and then release the pod to the scheduler.
    Place(Placement),
    /// Every claim is allocated already: just release the pod.
    Release { node: Option<String> },
    /// A claim needs devices the controller does not allocate: release the pod and say why.
    LeaveToScheduler { message: String },
    /// Cannot place now; undo the controller's own partial allocations.
    CannotPlace {
        failure: Failure,
        message: String,
        undo: Vec<Arc<ResourceClaim>>,
    },
    /// Nothing to do (an ungated pod whose claims are all allocated).
    Nothing,
}

/// The planner's answer for one pod: the action, and the pod's placement record if it must be
/// written first (a node to avoid was added).
#[derive(Clone, Debug, PartialEq)]
pub struct PodPlan {
    pub action: Action,
    /// The placement record as it should be after this decision (avoided nodes updated).
    pub record: PodPlacement,
    /// Whether `record` gained an avoided node that must be written before anything else.
    pub record_first: bool,
}

/// Decides what to do for one pod.
pub fn decide(input: &PlacementInput<'_>) -> PodPlan {
    let sorted = PodClaims::sort(input.pod, input.claims);
    let before = PodPlacement::of(input.pod).unwrap_or_default();
    let mut record = before.clone();
    if !input.gated {
        // The pod was released and a claim we allocated lost its allocation: the scheduler gave
        // it back because the pod did not fit there for another reason.
        for node in &sorted.given_back {
            record.avoid_node(node, input.now, input.avoid_for);
        }
    }
    let record_first = record.avoid.keys().ne(before.avoid.keys());
    let action = decide_action(input, &sorted, &record);
    PodPlan {
        action,
        record,
        record_first,
    }
}

/// The eligible nodes less the ones avoided now and the ones the fixed claims' allocations exclude;
/// copied only when changed (at thousands of nodes the eligible set is not small).
fn nodes_for<'n>(
    input: &'n PlacementInput<'_>,
    sorted: &PodClaims,
    record: &PodPlacement,
) -> Cow<'n, NodeFilter> {
    let mut nodes = Cow::Borrowed(&input.nodes);
    for node in record.avoided_at(input.now) {
        if nodes.eligible.contains(&node) {
            nodes.to_mut().reject(&node, Rejection::Avoided);
        }
    }
    restrict_to_allocations(&mut nodes, input.managed, &sorted.fixed);
    nodes
}

fn decide_action(input: &PlacementInput<'_>, sorted: &PodClaims, record: &PodPlacement) -> Action {
    if input.gated
        && let Some(action) = check_extended_resources(input, sorted)
    {
        return action;
    }
    if sorted.pending.is_empty() {
        if !input.gated {
            return Action::Nothing;
        }
        let node = sorted
            .own
            .iter()
            .chain(&sorted.fixed)
            .find_map(|c| crate::protocol::ClaimMark::of(c).map(|m| m.node));
        return Action::Release { node };
    }
    if let Some(action) = check_numa_policy(input, sorted).or_else(|| check_classes(input, sorted))
    {
        return action;
    }
    let nodes = nodes_for(input, sorted, record);
    let options = pod_options(input);
    if !sorted.own.is_empty() {
        // Complete the controller's partial placement on its node.
        let mut completing = nodes.clone();
        restrict_to_allocations(&mut completing, input.managed, &sorted.own);
        let claims: Vec<ResourceClaim> = sorted
            .pending
            .iter()
            .map(|c| tolerating_managed_taint(c))
            .collect();
        match allocate(input.managed, &claims, input.in_use, &completing, &options) {
            Ok(Outcome::Allocated(a)) => {
                return Action::Place(placement(a, &sorted.pending, Vec::new()));
            }
            Ok(Outcome::Unsatisfiable(_)) => {}
            Err(e) => return invalid(e, sorted),
        }
    }
    // Place all claims the controller may allocate, from scratch (the devices in use copied only
    // when the pod's own allocations are taken out of them).
    let mut in_use = Cow::Borrowed(input.in_use);
    for claim in &sorted.own {
        if let Some(a) = allocation(claim)
            && let Err(e) = in_use.to_mut().remove_allocation(a)
        {
            return Action::CannotPlace {
                failure: Failure::InvalidInput,
                message: e.to_string(),
                undo: Vec::new(),
            };
        }
    }
    let targets: Vec<Arc<ResourceClaim>> =
        sorted.own.iter().chain(&sorted.pending).cloned().collect();
    let claims: Vec<ResourceClaim> = targets
        .iter()
        .map(|c| tolerating_managed_taint(c))
        .collect();
    match allocate(input.managed, &claims, &in_use, &nodes, &options) {
        Ok(Outcome::Allocated(a)) => Action::Place(placement(a, &targets, sorted.own.clone())),
        // A missing DeviceClass or an unknown request type: the claims are wrong (or wait for
        // their class), whatever node is tried.
        Ok(Outcome::Unsatisfiable(u)) if u.claim_problem.is_some() => Action::CannotPlace {
            failure: Failure::InvalidInput,
            message: u.to_string().trim_end().to_string(),
            undo: sorted.own.clone(),
        },
        Ok(Outcome::Unsatisfiable(u)) => Action::CannotPlace {
            failure: Failure::Unsatisfiable,
            message: unsatisfiable_message(input.managed, &claims, &in_use, &nodes, &u, &options),
            undo: sorted.own.clone(),
        },
        Err(e) => invalid(e, sorted),
    }
}

fn allocate(
    inventory: &DeviceIndex,
    claims: &[ResourceClaim],
    in_use: &AllocatedState,
    nodes: &NodeFilter,
    options: &AllocateOptions,
) -> Result<Outcome, AllocateError> {
    inventory.allocate_among(
        claims,
        in_use,
        |n| nodes.eligible.contains(&n.name),
        options,
    )
}

fn invalid(e: AllocateError, sorted: &PodClaims) -> Action {
    Action::CannotPlace {
        failure: Failure::InvalidInput,
        message: e.to_string(),
        undo: sorted.own.clone(),
    }
}

fn placement(
    a: tessera_allocator::Allocation,
    targets: &[Arc<ResourceClaim>],
    undo: Vec<Arc<ResourceClaim>>,
) -> Placement {
    Placement {
        writes: targets
            .iter()
            .zip(a.claims)
            .map(|(claim, c)| ClaimWrite {
                claim: claim.clone(),
                allocation: c.result,
            })
            .collect(),
        node: a.node,
        undo,
        score: a.score,
        truncated: a.truncated,
    }
}

/// Keeps only the nodes every allocation's node selector admits.
fn restrict_to_allocations(
    nodes: &mut Cow<'_, NodeFilter>,
    inventory: &DeviceIndex,
    claims: &[Arc<ResourceClaim>],
) {
    let selectors: Vec<_> = claims
        .iter()
        .filter_map(|c| allocation(c).and_then(|a| a.node_selector.as_ref()))
        .collect();
    if selectors.is_empty() {
        return;
    }
    let outside: Vec<String> = nodes
        .eligible
        .iter()
        .filter(|name| {
            !inventory
                .node(name)
                .is_some_and(|info| selectors.iter().all(|s| selector_matches(s, info)))
        })
        .cloned()
        .collect();
    for name in outside {
        nodes
            .to_mut()
            .reject(&name, Rejection::ClaimsAllocatedElsewhere);
    }
}

/// A request whose every alternative selects no topology-managed device is not the controller's
/// to allocate: if the scheduler could serve it (another driver's devices, or devices on
/// unmanaged nodes) the pod goes to the scheduler; if nothing in the cluster matches, the pod
/// waits. Unknown classes are left to the allocator, which names claim and request.
/// A pod asking for extended resources backed by a DeviceClass (`nvidia.com/gpu: 2`) is the
/// scheduler's: it allocates them itself, in a claim it creates while binding the pod, and would
/// treat a claim made beforehand as stale and delete it (docs/user-guide.md, "Topology-aware
/// placement needs a claim"). Its devices may also not be taken from managed nodes, whose taint the
/// scheduler's claim does not tolerate, so the pod's claims cannot go there either: the whole pod
/// is left to the scheduler. The controller's own allocations for it (made before the class got
/// its name) are undone first, so that the scheduler places all claims together.
fn check_extended_resources(input: &PlacementInput<'_>, sorted: &PodClaims) -> Option<Action> {
    let asked = input.extended.requested_by(input.pod);
    if asked.is_empty() {
        return None;
    }
    let names: Vec<String> = asked
        .iter()
        .map(|(resource, class)| format!("{resource} (DeviceClass {class})"))
        .collect();
    let message = format!(
        "the pod asks for the extended resource(s) {}: kube-scheduler allocates those itself, first fit and \
         never on devices of nodes labelled gpu.tessera.dev/topology-managed=true, so the scheduler places \
         this pod; for topology-aware placement ask for the devices in a ResourceClaim instead",
        names.join(", ")
    );
    if sorted.own.is_empty() {
        Some(Action::LeaveToScheduler { message })
    } else {
        Some(Action::CannotPlace {
            failure: Failure::InvalidInput,
            message: format!("{message}; undoing the controller's earlier allocations first"),
            undo: sorted.own.clone(),
        })
    }
}

fn check_classes(input: &PlacementInput<'_>, sorted: &PodClaims) -> Option<Action> {
    let mut unmanaged: Option<Arc<DeviceIndex>> = None;
    let mut nowhere = Vec::new();
    for claim in &sorted.pending {
        let claim_name = claim_list(std::slice::from_ref(claim));
        for (request, classes) in request_classes(claim) {
            let mut managed_match = false;
            for class in &classes {
                match input.managed.devices_selected_by_class(class) {
                    None => return None,
                    Some(Err(e)) => {
                        return Some(Action::CannotPlace {
                            failure: Failure::InvalidInput,
                            message: format!("claim {claim_name}, request {request}: {e}"),
                            undo: sorted.own.clone(),
                        });
                    }
                    Some(Ok(n)) => managed_match |= n > 0,
                }
            }
            if managed_match || classes.is_empty() {
                continue;
            }
            let others = unmanaged.get_or_insert_with(|| (input.unmanaged)());
            let elsewhere = classes
                .iter()
                .any(|c| matches!(others.devices_selected_by_class(c), Some(Ok(n)) if n > 0));
            let class_list = classes.join(", ");
            if elsewhere {
                return Some(Action::LeaveToScheduler {
                    message: format!(
                        "claim {claim_name}, request {request}: class {class_list} selects no topology-managed device, \
                         only devices the default scheduler allocates (another driver's, or on nodes without the \
                         gpu.tessera.dev/topology-managed label); the scheduler places this pod"
                    ),
                });
            }
            nowhere.push(format!(
                "claim {claim_name}, request {request}: class {class_list} selects no device in the cluster"
            ));
        }
    }
    if nowhere.is_empty() {
        return None;
    }
    Some(Action::CannotPlace {
        failure: Failure::Unsatisfiable,
        message: nowhere.join("; "),
        undo: sorted.own.clone(),
    })
}
