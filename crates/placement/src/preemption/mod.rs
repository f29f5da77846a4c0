//! Preemption for devices: when a pending pod (or gang) fits on no free devices, which running
//! pods of lower priority to evict so that it fits — with its placement requirements (NVLink
//! island, NUMA policy, clique and rack for gangs) — and which devices to reserve for it until it
//! is placed. A function of data like the rest of the crate; the controller carries the plan out
//! (evictions through the Eviction API) and `tessera explain --pod` prints it.
//!
//! **Victims** ([`victims`]) are running pods whose allocated claims hold topology-managed
//! devices, whoever placed them, in units evicted whole: a pod alone, or every running pod of a
//! gang. A claim's devices count as freed only when every pod reserving it is a victim. Never a
//! victim: a pod of equal or higher priority than the preemptor, a pod whose eviction a
//! PodDisruptionBudget would refuse (victims are counted per budget: a plan never asks more of a
//! budget than it allows), a pod covered by several budgets (the Eviction API refuses those), a
//! pod whose eviction was refused recently. A preemptor with `preemptionPolicy: Never` preempts
//! nobody.
//!
//! **The search** ([`preempt_pod`]): per node with eligible victims, a lower bound on the victims
//! needed from device counts (the devices the pod's classes select, free or held by one unit);
//! nodes are taken cheapest bound first, and on each node victim sets are enumerated in order of
//! [`PreemptionCost`] (fewest victims, then lowest highest priority, then lowest priority sum,
//! then least work lost), each checked by the pod's own decision
//! ([`crate::view::decide_pod_within`]) on the devices in use less what the set frees. Plans
//! compare by victims, highest priority and priority sum first; among plans equal there, the
//! better connected placement (one NVLink island, one NUMA node) wins over less work lost, so a
//! few sets of the same rank after a node's first plan, and a few nodes of the same rank after
//! the best one, are still checked. The search stops when no remaining node can beat the best,
//! after [`PreemptionSettings::candidate_nodes`] nodes with a plan (as kube-scheduler samples
//! candidates), or at its budgets — deterministically.
//!
//! **Gangs** ([`preempt_group`]): the group decision ([`crate::group::decide_group`]) on the
//! devices in use less the eligible units, priority level by level (lowest first) until the gang
//! fits; then units are given back (reprieved): at once those away from the nodes the decision
//! chose, then one by one, highest priority and most work first, while the members on the unit's
//! nodes still fit there.
//!
//! **Nothing is allocated twice**: a plan frees nothing by itself. Its devices stay in use until
//! the victims' claims are released; meanwhile they are nominated for the preemptor
//! ([`nomination`]), which adds them to what is in use for every pod not of higher priority.

mod budgets;
mod gang;
mod kept;
mod mark;
pub mod nomination;
mod plan;
mod priority;
mod search;
mod victims;

use std::collections::HashSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::jiff::Timestamp;
use tessera_allocator::DeviceId;

pub use budgets::{DisruptionBudgets, covers, selects};
pub use gang::preempt_group;
pub use kept::{KeptVictims, KeptWork};
pub use plan::{
    PlannedVictim, PreemptionCost, PreemptionDecision, PreemptionOutcome, PreemptionPlan,
    Reservation,
};
pub use priority::{pod_priority, preemption_allowed};
pub(crate) use search::Demand;
pub use search::preempt_pod;
pub use victims::{Blocked, Exclusions, HeldClaim, ManagedDevices, Unit, VictimPod, Victims};

/// How hard a preemption search may look.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreemptionSettings {
    /// Nodes with a plan after which the search stops (at least this many, or
    /// [`PreemptionSettings::candidate_percent`] of the nodes with victims if more).
    pub candidate_nodes: usize,
    pub candidate_percent: usize,
    /// Placement checks (a victim set tried with the allocator, or a group decision) per search.
    pub step_budget: usize,
    /// Victim sets looked at per search (most are rejected by counting, without the allocator).
    pub combination_budget: usize,
}

/// Nodes with a plan before a pod's search stops: kube-scheduler's default
/// `minCandidateNodesAbsolute` is 100; preemption here compares topology as well, so fewer do.
pub const DEFAULT_CANDIDATE_NODES: usize = 16;

impl Default for PreemptionSettings {
    fn default() -> PreemptionSettings {
        PreemptionSettings {
            candidate_nodes: DEFAULT_CANDIDATE_NODES,
            candidate_percent: 2,
            step_budget: 1024,
            combination_budget: 65_536,
        }
    }
}

impl PreemptionSettings {
    /// Nodes with a plan after which the search stops, out of `nodes` with victims.
    pub fn candidate_cap(&self, nodes: usize) -> usize {
        self.candidate_nodes
            .max(nodes * self.candidate_percent / 100)
            .max(1)
    }
}

/// What a search reads besides the cluster and the preemptor.
pub struct PreemptionInput<'a> {
    pub victims: &'a Victims,
    /// Devices nominated for other pods that this preemptor may not take
    /// ([`nomination::Nominations::reserved_against`]).
    pub reserved: &'a [DeviceId],
    /// UIDs of pods whose eviction was refused recently.
    pub refused: &'a HashSet<String>,
    pub settings: &'a PreemptionSettings,
}

/// The victim index of a cluster at `now` ([`Victims::new`]): the running pods of `pods` that
/// hold the managed `devices` through `claims`, with the `budgets` covering them; the victims of
/// nominations that stand (on pods gated by `gate`) are nobody else's. What one decision reads,
/// and what a caller that sees every change keeps across decisions.
pub fn victim_index(
    devices: &ManagedDevices,
    pods: &[Arc<Pod>],
    claims: &[Arc<ResourceClaim>],
    budgets: &[Arc<PodDisruptionBudget>],
    gate: &str,
    now: Timestamp,
) -> Victims {
    let pods = || pods.iter().map(AsRef::as_ref);
    let nominations = nomination::Nominations::from_pods(pods(), gate, now);
    Victims::new(
        devices,
        pods(),
        claims.iter().cloned(),
        DisruptionBudgets::new(budgets.iter().map(AsRef::as_ref)),
        &nominations.promised(),
        now,
    )
}
