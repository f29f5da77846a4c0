//! The cluster as one decision reads it, and the decision for one pod built from it — the one
//! entry point the controller's worker and `tessera explain --pod` both call, so that they cannot
//! disagree.
//!
//! [`ClusterSnapshot`] is what changes rarely (slices, classes, nodes): the controller builds it once per
//! change and keeps it; explain builds it from files. [`PodContext`] adds what changes with every
//! placement (devices in use, pods' requests per node). [`decide_pod`] runs the node filters and the
//! planner for a pod whose claims are resolved. A decision over several pods (all or nothing) is
//! made from the same [`PodContext`]: it takes each pod's [`crate::planner::PodPlan`] against the
//! state the previous ones leave.

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tessera_allocator::{
    AllocateOptions, AllocatedState, DEFAULT_STEP_BUDGET, DeviceIndex, PlacementMode,
};

use crate::claims::{PodClaims, allocation};
use crate::extended::ExtendedResources;
use crate::group::settings::{DEFAULT_GROUP_HOLD, GroupSettings};
use crate::imex::{DomainJob, DomainNodes};
use crate::managed::{managed_slices, unmanaged_slices};
use crate::nodes::{NodeFacts, NodeFilter, PodRequirements};
use crate::planner::{Action, PlacementInput, PodPlan, decide};
use crate::protocol::{PodPlacement, is_gated, object_key};
use crate::resolve::PodClaim;
use crate::resources::NodeUsage;

/// How the controller decides (its flags).
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// The scheduling gate of the pods to place.
    pub gate: String,
    /// How long to avoid a node where the scheduler gave back an allocation.
    pub avoid_for: SignedDuration,
    /// Allocator options.
    pub options: AllocateOptions,
    /// How groups (gangs) are decided ([`crate::group`]).
    pub group: GroupSettings,
    /// How long a group waits for capacity before it holds back later arrivals
    /// ([`crate::group::starvation::held_back_by`]).
    pub group_hold: SignedDuration,
}

impl Settings {
    /// The controller's defaults for `gate`: topology-aware, the default step budget, brief
    /// accounts, nodes avoided for 5 minutes, the default group settings and hold time.
    pub fn new(gate: &str) -> Settings {
        Settings {
            gate: gate.to_owned(),
            avoid_for: SignedDuration::from_secs(300),
            options: AllocateOptions {
                mode: PlacementMode::TopologyAware,
                step_budget: DEFAULT_STEP_BUDGET,
                explain: false,
                numa: Default::default(),
            },
            group: GroupSettings::default(),
            group_hold: DEFAULT_GROUP_HOLD,
        }
    }
}

/// The devices and nodes of one generation of slices, classes and nodes.
pub struct ClusterSnapshot {
    /// Topology-managed devices only (the only ones the controller allocates).
    pub managed: Arc<DeviceIndex>,
    /// Nodes with topology-managed devices.
    pub managed_nodes: HashSet<String>,
    /// Every node, parsed for the filters.
    pub nodes: Vec<NodeFacts>,
    /// The extended resources the classes stand for.
    pub extended: ExtendedResources,
    /// Each node's fabric clique (indexed like [`ClusterSnapshot::nodes`]), found at the first
    /// group decision: the same for every decision on this snapshot.
    cliques: OnceLock<Vec<Option<String>>>,
    /// What group decisions read of the snapshot's domains, per hierarchy (its label keys): the
    /// group module's layout, held here without this module naming it.
    layouts: Mutex<HashMap<Vec<String>, Arc<dyn Any + Send + Sync>>>,
}

impl ClusterSnapshot {
    /// Indexes the managed devices of `slices`. Every class is evaluated on every device now (the
    /// verdicts are cached in the inventory), not in the first decision that needs them; a class
    /// whose selectors fail is reported by the decisions that use it.
    pub fn new(
        slices: Vec<ResourceSlice>,
        classes: Vec<DeviceClass>,
        nodes: Vec<NodeFacts>,
    ) -> ClusterSnapshot {
        let (managed, managed_nodes) = managed_slices(slices);
        let extended = ExtendedResources::new(&classes);
        let managed = DeviceIndex::new(managed, classes.clone(), node_infos(&nodes));
        for class in &classes {
            if let Some(name) = class.metadata.name.as_deref() {
                let _ = managed.devices_selected_by_class(name);
            }
        }
        ClusterSnapshot {
            managed: Arc::new(managed),
            managed_nodes,
            nodes,
            extended,
            cliques: OnceLock::new(),
            layouts: Mutex::default(),
        }
    }

    /// The domains of the hierarchy of `labels` as group decisions read them, built once per
    /// snapshot by `build` (nodes, their devices and labels are the snapshot's own).
    pub(crate) fn layout_base<T: Any + Send + Sync>(
        &self,
        labels: &[String],
        build: impl FnOnce() -> T,
    ) -> Arc<T> {
        let mut layouts = self.layouts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(base) = layouts
            .get(labels)
            .and_then(|b| b.clone().downcast::<T>().ok())
        {
            return base;
        }
        let base = Arc::new(build());
        layouts.insert(labels.to_vec(), base.clone());
        base
    }

    /// Each node's fabric clique, computed once per snapshot by `find` (a node's clique is a
    /// property of its devices, which a snapshot never changes).
    pub(crate) fn cliques(
        &self,
        find: impl FnOnce(&ClusterSnapshot) -> Vec<Option<String>>,
    ) -> &[Option<String>] {
        self.cliques.get_or_init(|| find(self))
    }

    /// The devices the scheduler allocates (untainted, any driver), from the same `slices` and
    /// `classes`. Built only when a decision needs it.
    pub fn unmanaged(&self, slices: Vec<ResourceSlice>, classes: Vec<DeviceClass>) -> DeviceIndex {
        DeviceIndex::new(unmanaged_slices(slices), classes, node_infos(&self.nodes))
    }
}

fn node_infos(nodes: &[NodeFacts]) -> Vec<tessera_allocator::NodeInfo> {
    nodes.iter().map(|n| n.info.clone()).collect()
}

/// What one pod's decision reads about the cluster.
pub struct PodContext<'a> {
    pub devices: &'a ClusterSnapshot,
    /// [`ClusterSnapshot::unmanaged`], built on first call.
    pub unmanaged: &'a dyn Fn() -> Arc<DeviceIndex>,
    /// Every allocated claim's devices ([`crate::pods::devices_in_use`]).
    pub in_use: &'a AllocatedState,
    /// What the other pods request per node ([`crate::pods::node_usage`]).
    pub usage: &'a HashMap<String, NodeUsage>,
}

/// The decision for `pod`, whose claims are resolved ([`crate::resolve::resolve_claims`]): the
/// node filters, then the planner.
pub fn decide_pod(
    pod: &Pod,
    claims: &[PodClaim],
    context: &PodContext<'_>,
    settings: &Settings,
    now: Timestamp,
) -> PodPlan {
    let plan = decide_pod_within(pod, claims, context, settings, now, None);
    with_domain_reasons(plan, claims, context, None)
}

/// [`decide_pod`] for a pod of the IMEX domain `job`: never on a node where `domains` says
/// another domain's pods run (the node driver runs one IMEX daemon per node).
pub fn decide_domain_pod(
    pod: &Pod,
    claims: &[PodClaim],
    context: &PodContext<'_>,
    settings: &Settings,
    now: Timestamp,
    (job, domains): (&DomainJob, &DomainNodes),
) -> PodPlan {
    if domains.is_empty() {
        return decide_pod(pod, claims, context, settings, now);
    }
    let nodes = &context.devices.nodes;
    let mut shared = None;
    let within: Vec<usize> = (0..nodes.len())
        .filter(
            |&i| match domains.other_than(&nodes[i].info.name, &job.claim) {
                Some(other) => {
                    shared.get_or_insert_with(|| {
                        format!(
                            "{} runs pods of the IMEX domain {other} (one IMEX domain per node)",
                            nodes[i].info.name
                        )
                    });
                    false
                }
                None => true,
            },
        )
        .collect();
    let plan = decide_pod_within(pod, claims, context, settings, now, Some(&within));
    with_domain_reasons(plan, claims, context, shared)
}

/// `plan`, when no node can take the pod, with what its IMEX domain adds to why: no free
/// channel, and `shared` (a node another domain's pods run on).
fn with_domain_reasons(
    mut plan: PodPlan,
    claims: &[PodClaim],
    context: &PodContext<'_>,
    shared: Option<String>,
) -> PodPlan {
    if let Action::CannotPlace {
        failure: crate::planner::Failure::Unsatisfiable,
        message,
        ..
    } = &mut plan.action
    {
        for why in channels_taken(claims, context).into_iter().chain(shared) {
            message.push_str(&format!("; {why}"));
        }
    }
    plan
}

/// For a pod with an IMEX domain claim still to allocate: that no clique has a free channel, if
/// so (then no node can take the pod, whatever the rest of the message says of its GPUs).
fn channels_taken(claims: &[PodClaim], context: &PodContext<'_>) -> Option<String> {
    let domain = claims
        .iter()
        .find(|c| crate::imex::is_domain_claim(&c.claim) && allocation(&c.claim).is_none())?;
    let counts = crate::imex::channels(&context.devices.managed, context.in_use);
    if counts.is_empty() || counts.values().any(|c| c.free() > 0) {
        return None;
    }
    let cliques: Vec<String> = counts
        .iter()
        .map(|(clique, c)| format!("clique {clique}: {} of {} in use", c.in_use, c.total))
        .collect();
    Some(format!(
        "no free IMEX channel for the domain {} in any clique ({})",
        object_key(&domain.claim.metadata),
        cliques.join(", ")
    ))
}

/// The decision for a released pod (the gate removed) whose claims are all allocated: nothing to
/// do — what [`decide_pod`] decides for it, without the node filters and without what the cluster
/// uses, which the answer does not depend on. `None` for every other pod. Every pod the controller
/// places is looked at once more after its release; at thousands of nodes the filters and the
/// snapshots of what is in use were most of the cost of that second look.
pub fn decide_released(pod: &Pod, claims: &[PodClaim], settings: &Settings) -> Option<PodPlan> {
    // A claim that lost an allocation the controller wrote is pending, so with nothing pending no
    // node is given back and the placement record stays as it is.
    let done = !is_gated(pod, &settings.gate) && PodClaims::sort(pod, claims).pending.is_empty();
    done.then(|| PodPlan {
        action: Action::Nothing,
        record: PodPlacement::of(pod).unwrap_or_default(),
        record_first: false,
    })
}

/// [`decide_pod`] with the nodes looked at restricted to `within` (indices into
/// [`ClusterSnapshot::nodes`]): a group's decision tries one topology domain at a time.
pub fn decide_pod_within(
    pod: &Pod,
    claims: &[PodClaim],
    context: &PodContext<'_>,
    settings: &Settings,
    now: Timestamp,
    within: Option<&[usize]>,
) -> PodPlan {
    if let Some(decision) = decide_released(pod, claims, settings) {
        return decision;
    }
    let requirements = PodRequirements::of(pod);
    let all = &context.devices.nodes;
    let nodes = match within {
        None => NodeFilter::run(
            &requirements,
            all,
            &context.devices.managed_nodes,
            context.usage,
        ),
        Some(within) => NodeFilter::run(
            &requirements,
            within.iter().filter_map(|&i| all.get(i)),
            &context.devices.managed_nodes,
            context.usage,
        ),
    };
    decide(&PlacementInput {
        pod,
        gated: is_gated(pod, &settings.gate),
        claims,
        managed: &context.devices.managed,
        unmanaged: context.unmanaged,
        extended: &context.devices.extended,
        in_use: context.in_use,
        nodes,
        now,
        avoid_for: settings.avoid_for,
        options: settings.options,
    })
}
