//! A decision as data: what the controller does for a pod, or for the group the pod belongs to —
//! the claims it writes and undoes, the pod patches, the conditions and events, what it counts,
//! in order — and what was decided ([`Ruling`], what `tessera explain --pod` prints).
//! [`crate::decide::decide`] makes one from what a [`ClusterSource`] holds; the controller's
//! worker carries it out, step by step, and explain prints its ruling.
//!
//! **Order and undo.** [`Decision::first`] is carried out first, all or nothing: claims undone
//! and written, a placement record that must precede them, the waiting groups remembered or
//! forgotten. A write that fails there undoes every claim allocation the decision wrote (newest
//! first) and ends the decision: the pod is retried. Then [`Decision::per_pod`], pod by pod: its
//! release, its condition and event, its counts; a write that fails ends that pod's steps only
//! (the next decision finishes it) and the pod is retried. When nothing failed the pod leaves
//! the queue as [`Decision::then`] says.

use std::sync::Arc;

use std::collections::HashSet;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use k8s_openapi::api::scheduling::v1beta1::PodGroup;

use crate::group::membership::GroupKey;
use crate::group::search::GroupPlan;
use crate::group::starvation::Waiting;
use crate::planner::{ClaimWrite, PodPlan};
use crate::preemption::Victims;
use crate::preemption::nomination::{Nomination, PreemptedBy};
use crate::preemption::{PreemptionPlan, PreemptionSettings};
use crate::protocol::PodPlacement;
use crate::reason::{EventKind, PodReason};
use crate::view::PodContext;

/// What a decision reads of the cluster besides the pod: the controller's caches, or a set of
/// API objects (`tessera explain`).
pub trait ClusterSource {
    /// The claim `name` in `namespace`, newest version.
    fn claim(&self, namespace: &str, name: &str) -> Option<Arc<ResourceClaim>>;
    /// Whether the ResourceClaimTemplate `name` exists in `namespace`.
    fn template_exists(&self, namespace: &str, name: &str) -> bool;
    /// The pods of group `key` that still matter: not being deleted, not finished.
    fn group_pods(&self, key: &GroupKey) -> Vec<Arc<Pod>>;
    /// The PodGroup `key` names; `None` when it does not exist (or the cluster does not serve
    /// `scheduling.k8s.io/v1beta1`).
    fn pod_group(&self, key: &GroupKey) -> Option<&PodGroup>;
    /// Calls `decide` once with the cluster as a decision reads it: the devices, every device in
    /// use, and what the pods on each node request except the pod with UID `except` (`""`: none).
    fn with_context(&self, except: &str, decide: &mut dyn FnMut(&PodContext<'_>));
    /// What a preemption search reads ([`PreemptionObjects`]); `None` (the default): the source
    /// does not preempt.
    fn preemption(&self) -> Option<PreemptionObjects> {
        None
    }
    /// The IMEX domains (claims, `namespace/name`, sorted) holding a channel of fabric clique
    /// `clique`, for the message of a domain that waits for one; empty (the default) where the
    /// source does not say.
    fn channel_holders(&self, clique: &str) -> Vec<String> {
        let _ = clique;
        Vec::new()
    }
    /// The IMEX domains whose pods run or are placed on each node
    /// ([`crate::imex::DomainNodes::of`]), read for a group that asks for a domain; none (the
    /// default) where the source does not say.
    fn domain_nodes(&self) -> crate::imex::DomainNodes {
        crate::imex::DomainNodes::default()
    }
}

/// What a preemption search reads besides the devices: the pods (victims and nominations),
/// the claims they hold, the PodDisruptionBudgets, the evictions refused recently.
#[derive(Clone, Debug, Default)]
pub struct PreemptionObjects {
    pub pods: Vec<Arc<Pod>>,
    pub claims: Vec<Arc<ResourceClaim>>,
    pub budgets: Vec<Arc<PodDisruptionBudget>>,
    /// UIDs of pods whose eviction was refused recently: nobody's victims for a while.
    pub refused: HashSet<String>,
    pub settings: PreemptionSettings,
    /// The victim index of these objects on the devices the source's context gives, when the
    /// source keeps one across decisions (the controller rebuilds it only when pods, claims,
    /// budgets or the inventory changed); `None`: each search builds its own
    /// ([`crate::preemption::victim_index`]).
    pub victims: Option<Arc<Victims>>,
}

/// What the controller does, in order (see the module's docs for what a failure does).
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// What was decided.
    pub ruling: Ruling,
    /// Carried out first, all or nothing.
    pub first: Vec<Step>,
    /// Then each pod's own steps, pod by pod.
    pub per_pod: Vec<Vec<Step>>,
    /// How the pod leaves the queue when no write failed.
    pub then: Then,
}

impl Decision {
    /// A decision that changes nothing: the pod is done.
    pub fn nothing(ruling: Ruling) -> Decision {
        Decision {
            ruling,
            first: Vec::new(),
            per_pod: Vec::new(),
            then: Then::Done,
        }
    }
}

/// How the pod leaves the controller's queue once its decision is carried out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Then {
    /// Placed, released, or nothing to do: forget the pod.
    Done,
    /// It waits: look at it again when the cluster changes.
    Park,
}

/// One thing the controller does.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Clears the controller's own allocation of `claim` for `pod`, then its mark (and the
    /// finalizer if the controller added it).
    Undo {
        pod: Arc<Pod>,
        claim: Arc<ResourceClaim>,
    },
    /// Writes the finalizer and the mark on `write.claim` for `pod` on `node`, then the
    /// allocation (its `allocationTimestamp`: the time of the write).
    Allocate {
        pod: Arc<Pod>,
        node: String,
        write: ClaimWrite,
    },
    /// Merge-patches the pod.
    PatchPod { pod: Arc<Pod>, patch: PodPatch },
    /// Sets the pod's condition and records an event, unless the condition already says the
    /// same.
    Notify { pod: Arc<Pod>, notice: Notice },
    /// Creates the ResourceClaimTemplate a pod converted from the device plugin names and that
    /// does not exist (docs/admission.md); one that exists meanwhile is fine.
    CreateTemplate {
        pod: Arc<Pod>,
        template: Arc<ResourceClaimTemplate>,
    },
    /// Counts in the controller's metrics.
    Count(Count),
    /// Remembers a group that waits for capacity (kept if it is remembered already).
    Remember(Waiting),
    /// Forgets a group that no longer waits.
    Forget(GroupKey),
    /// Records on `pod` the devices nominated for it (the annotation of
    /// [`Nomination`] and `status.nominatedNodeName`), or removes them (`None`).
    Nominate {
        pod: Arc<Pod>,
        nomination: Option<Nomination>,
    },
    /// Marks `victim` as preempted by `preemptor` ([`PreemptedBy`]), then evicts it through the
    /// Eviction API (its UID as precondition). `committed`: another pod of the victim's gang is
    /// evicted already, so a refusal does not withdraw the plan; otherwise a refusal withdraws
    /// the nominations of `nominees` (the preemptor, or its gang's members) and the pod is
    /// retried (the refused victim left out a while).
    Evict {
        victim: Arc<Pod>,
        preemptor: Arc<Pod>,
        nominees: Vec<Arc<Pod>>,
        by: PreemptedBy,
        committed: bool,
    },
}

/// A patch of a pod (the placement record of docs/protocol.md, the scheduling gate).
#[derive(Clone, Debug, PartialEq)]
pub enum PodPatch {
    /// Records the nodes to avoid (the record as decided), before anything else is written.
    AvoidNodes(PodPlacement),
    /// Removes the scheduling gate `gate` (when the pod carries it) and records `record`, its
    /// `placedAt` the time of the write; without a record the scheduler has the pod to itself.
    Release {
        record: Option<PodPlacement>,
        gate: Option<String>,
    },
}

/// What the pod's condition and event say.
#[derive(Clone, Debug, PartialEq)]
pub struct Notice {
    /// The condition's reason (its status is `True` when the reason says the pod is placed)
    /// and the event's.
    pub reason: PodReason,
    pub message: String,
    pub kind: EventKind,
}

/// What the controller counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Count {
    /// An attempt that did not place the pod, by reason.
    Failure(PodReason),
    /// Claim allocations written.
    ClaimsAllocated(u64),
    /// A pod placed (its claims written, its gate removed).
    PodPlaced,
    /// A pod left to the scheduler.
    LeftToScheduler,
    /// A preemption planned: its victims and the GPU-seconds of work they lose.
    Preemption { victims: u64, gpu_seconds: u64 },
}

/// What was decided.
#[derive(Clone, Debug, PartialEq)]
pub enum Ruling {
    /// About the pod alone.
    Pod(PodVerdict),
    /// About the group the pod belongs to.
    Group(GroupVerdict),
}

impl Ruling {
    /// Whether the planner (or the group search) made the decision; otherwise the pod waits for
    /// something first, or is not the controller's.
    pub fn planned(&self) -> bool {
        matches!(
            self,
            Ruling::Pod(PodVerdict::Decided(_)) | Ruling::Group(GroupVerdict::Decided { .. })
        )
    }
}

/// What the controller does with a pod placed alone.
#[derive(Clone, Debug, PartialEq)]
pub enum PodVerdict {
    /// The controller leaves the pod alone (why).
    NotCandidate(String),
    /// Other components' scheduling gates (`gates`, in the pod's order) still hold the pod: the
    /// controller allocates nothing for it until they are removed.
    WaitingForGates { gates: Vec<String>, message: String },
    /// A group that arrived earlier waits for capacity and holds the pod back.
    HeldBack { by: Waiting, message: String },
    /// A claim of the pod does not exist yet or is being replaced (why).
    WaitingForClaims(String),
    /// The pod's claims cannot be resolved as written (why).
    InvalidClaims(String),
    /// The planner's plan.
    Decided(PodPlan),
    /// The pod fits on no free devices (`plan`) but does once the victims of its
    /// `nomination` are gone: they are evicted, the devices nominated for the pod. `preemption`:
    /// the plan made now (`None`: the nomination stands from an earlier decision and the pod
    /// waits for its victims to release their devices).
    Preempting {
        plan: PodPlan,
        nomination: Nomination,
        preemption: Option<PreemptionPlan>,
    },
}

/// What the controller does with a group.
#[derive(Clone, Debug, PartialEq)]
pub enum GroupVerdict {
    /// The PodGroup the pods name does not exist: the group waits.
    MissingPodGroup { key: GroupKey, message: String },
    /// The group's definition (or a member's claims) is wrong (why).
    Invalid(String),
    /// A group that arrived earlier waits for capacity and holds this one back.
    HeldBack {
        key: GroupKey,
        by: Waiting,
        message: String,
    },
    /// The group fits on no free devices but does once pods of lower priority are gone: the
    /// plan made now (`preemption`), or the nominations that stand (`None`), in `message`.
    Preempting {
        key: GroupKey,
        message: String,
        preemption: Option<PreemptionPlan>,
    },
    /// The group's plan; `members` are the gated pods with their claims, in the order tried.
    Decided {
        key: GroupKey,
        min_count: u32,
        placed: u32,
        members: Vec<String>,
        plan: GroupPlan,
    },
}
