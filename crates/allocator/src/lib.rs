//! Structured-parameters device allocation with upstream semantics plus topology scoring. No IO.
//!
//! The allocator decides which devices of which node a set of ResourceClaims gets, exactly as
//! kube-scheduler's structured allocator would ([`PlacementMode::FirstFit`]), or by the topology
//! score of docs/ARCHITECTURE.md, "The allocator" ([`PlacementMode::TopologyAware`]). Inputs are
//! `resource.k8s.io/v1` objects; the output is what goes into each claim's `status.allocation`, or
//! an account of why the claims fit nowhere ([`Unsatisfiable`]).
//!
//! ```text
//! DeviceIndex::new(slices, classes, nodes)      index once, share between allocations
//! AllocatedState::from_claims(allocated)      devices already in use
//! inventory.allocate(&claims, &state, node, &options) -> Outcome::{Allocated, Unsatisfiable}
//! ```
//!
//! Semantics follow `k8s.io/dynamic-resource-allocation/structured` (see
//! docs/ARCHITECTURE.md, "Allocator"): pools and generations, incomplete and invalid pools,
//! `ExactCount` and `All`, class then request CEL selectors, admin access, `matchAttribute` and
//! `distinctAttribute`, `firstAvailable`, partitionable devices with shared counters, consumable
//! capacity with request policies and share ids, device taints, the 32-result limit, node
//! selectors and configuration in results. The search is bounded by a step budget.

mod allocate;
mod capacity;
mod constraints;
mod device;
mod error;
mod explain;
mod inventory;
mod node;
mod pools;
pub mod quantity;
mod request;
mod result;
mod search;
mod selection;
mod state;
mod symmetry;
mod taints;
pub mod topology;
mod verdicts;

pub use allocate::{
    AllocateOptions, Allocation, ClaimAllocation, DEFAULT_STEP_BUDGET, Outcome, PlacementMode,
};
pub use device::DeviceId;
pub use error::AllocateError;
pub use explain::{
    ConstraintAccount, Exclusion, ExclusionReason, NodeExplanation, Reason, RequestAccount,
    Unsatisfiable, WantedDevices,
};
pub use inventory::DeviceIndex;
pub use node::{NODE_NAME_FIELD, NodeInfo, selector_matches};
pub use request::{MAX_RESULTS_PER_CLAIM, claim_name};
pub use state::{AllocatedState, SharedUse, StateError};
pub use topology::{NumaPolicy, NumaPolicyError, TopologyAttributes, TopologyScore};
