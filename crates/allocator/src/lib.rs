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
//! index.allocate(&claims, &state, node, &options) -> Outcome::{Allocated, Unsatisfiable}
//! ```
//!
//! Semantics follow `k8s.io/dynamic-resource-allocation/structured` (see
//! docs/ARCHITECTURE.md, "Allocator"): pools and generations, incomplete and invalid pools,
//! `ExactCount` and `All`, class then request CEL selectors, admin access, `matchAttribute` and
//! `distinctAttribute`, `firstAvailable`, partitionable devices with shared counters, consumable
//! capacity with request policies and share ids, device taints, the 32-result limit, node
//! selectors and configuration in results. The search is bounded by a step budget.
//!
//! Modules, from the ground up (a module imports only from modules on its line or the lines before):
//! - `quantity` (exact quantity arithmetic), `attribute` (a device's attribute by qualified
//!   name), `node` (nodes and node selectors), `taints` (taints and tolerations);
//! - `topology`: topology attributes and the `TopologyScore`;
//! - `device`: a device as indexed (`DeviceId`, capacities, counter consumption);
//! - `error`, `capacity` (consumable capacity), `selection` (CEL selectors on devices), `state`
//!   (what is already allocated);
//! - `cluster`: slices, devices, classes and nodes indexed once;
//! - `pools` (a node's usable pools and candidates), `request` (claims flattened into slots);
//! - `constraints`: `matchAttribute` / `distinctAttribute`;
//! - `search`: one node's depth-first search (`pair`, the checks of a request and a device that
//!   can fail the allocation, below `state`, `candidate` and `prune`, the recursion in `mod.rs`;
//!   `skip`, the nodes first fit need not search), with `symmetry` (interchangeable candidates);
//! - `explain` (why claims do not fit), `result` (`status.allocation`), `verdicts` (search results
//!   kept between allocations);
//! - `index`: [`DeviceIndex`], the cluster with what allocations keep;
//! - `allocate`: the entry points on [`DeviceIndex`] and their [`Outcome`].

mod allocate;
mod attribute;
mod capacity;
mod cluster;
mod constraints;
mod device;
mod error;
mod explain;
mod index;
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
pub use index::DeviceIndex;
pub use node::{NODE_NAME_FIELD, NodeInfo, selector_matches};
pub use request::{MAX_RESULTS_PER_CLAIM, claim_name};
pub use state::{AllocatedState, SharedUse, StateError};
pub use topology::{NumaPolicy, NumaPolicyError, TopologyAttributes, TopologyScore};
