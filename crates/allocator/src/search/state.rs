//! What one node's search holds: where it is, what it has taken, what it found, and the pruning
//! state. The search's steps are `impl NodeSearch` blocks above this file: candidate checks
//! (`candidate`), pruning (`prune`) and the recursion (`mod.rs`).

use std::collections::{BTreeMap, HashMap};

use crate::capacity::Consumption;
use crate::cluster::Cluster;
use crate::constraints::ConstraintState;
use crate::error::AllocateError;
use crate::pools::NodePools;
use crate::quantity::Amount;
use crate::request::Plan;
use crate::state::AllocatedState;
use crate::topology::{NumaPolicy, TopologyScore};

/// How the search ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SearchMode {
    /// Stop at the first solution.
    FirstFit,
    /// Enumerate, keep the best; prune branches whose communication cost exceeds `bound`.
    Best { bound: Option<u64> },
}

/// One device chosen for one slot.
#[derive(Clone, Debug)]
pub(crate) struct Pick {
    /// Candidate position on the node.
    pub pos: usize,
    pub slot: usize,
    /// For multi-allocatable devices: what this allocation consumes (and it gets a share id).
    pub shared: Option<Consumption>,
}

/// A complete allocation of all claims on one node.
#[derive(Clone, Debug)]
pub(crate) struct Solution {
    /// Per claim, the picks in allocation order.
    pub picks: Vec<Vec<Pick>>,
    /// Per claim, per request: the chosen subrequest (0 for plain requests).
    pub selected: Vec<Vec<usize>>,
    pub score: TopologyScore,
}

/// What the search on one node found.
#[derive(Debug)]
pub(crate) struct NodeVerdict {
    pub solution: Option<Solution>,
    pub steps: u64,
    /// Best-of search stopped at the bound with a solution in hand.
    pub truncated: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Flow {
    Found,
    NotFound,
    /// `errAllocationResultMaxSizeExceeded` upstream: more than 32 results for a claim.
    MaxSize,
}

pub(super) enum Stop {
    Error(AllocateError),
    /// Bound reached.
    Budget,
}

impl From<AllocateError> for Stop {
    fn from(e: AllocateError) -> Stop {
        Stop::Error(e)
    }
}

/// Where the search is: which device of which request (or subrequest) of which claim.
#[derive(Clone, Copy, Debug)]
pub(super) struct Position {
    pub(super) claim: usize,
    pub(super) request: usize,
    pub(super) slot: usize,
    /// Set while allocating one particular subrequest.
    pub(super) in_slot: Option<usize>,
    pub(super) device: usize,
}

/// Undo record of one tentative allocation.
pub(super) struct Undo {
    pub(super) claim: usize,
    pub(super) slot: usize,
    pub(super) pos: usize,
    pub(super) charged: bool,
    pub(super) exclusive: bool,
    pub(super) shared: bool,
    pub(super) comm_added: u64,
}

/// A (slot, candidate) pair's selector verdict, cached for the search.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Selectable {
    Unknown,
    Yes,
    No,
    /// Evaluating it fails; the error is in `NodeSearch::failures` and is raised when the search
    /// reaches the pair.
    Fails,
}

pub(crate) struct NodeSearch<'a> {
    pub inv: &'a Cluster,
    pub np: &'a NodePools,
    pub state: &'a AllocatedState,
    pub plan: &'a Plan<'a>,
    pub(super) mode: SearchMode,
    /// How the score weighs NUMA alignment.
    pub(super) numa: NumaPolicy,
    pub(super) budget: u64,
    pub(super) steps: u64,
    /// Per slot: devices needed here.
    pub(super) need: Vec<usize>,
    /// Per `All` slot: the candidate positions it must take.
    pub(super) all_devices: Vec<Vec<usize>>,
    pub(super) selectable_cache: Vec<Vec<Selectable>>,
    pub(super) failures: HashMap<(usize, usize), AllocateError>,
    /// Per candidate: free before this allocation (not in use at all).
    pub(super) free_before: Vec<bool>,
    /// Per candidate: claims that take it exclusively in this run.
    pub(super) taken_by: Vec<Vec<usize>>,
    /// Per candidate: shared allocations in this run and the capacity they consume.
    pub(super) run_shares: Vec<u32>,
    pub(super) run_capacity: Vec<BTreeMap<String, Amount>>,
    /// Per pool: counters left after allocated devices (may be negative); counters consumed in
    /// this run.
    pub(super) counters_left: Vec<Vec<Amount>>,
    pub(super) counters_used: Vec<Vec<Amount>>,
    pub(super) constraints: Vec<Vec<ConstraintState>>,
    pub(super) picks: Vec<Vec<Pick>>,
    pub(super) selected: Vec<Vec<usize>>,
    pub(super) chosen: Vec<usize>,
    pub(super) comm_cost: u64,
    pub(super) best: Option<Solution>,
    pub(super) solutions: u64,
    pub(super) pruned: u64,
    /// Best-of search: class of interchangeable candidates (see [`crate::symmetry`]).
    pub(super) classes: Option<Vec<u8>>,
    pub(super) prune: Pruning,
}

/// The pruning state of one node search.
#[derive(Default)]
pub(super) struct Pruning {
    /// The search has undone a tentative allocation: from now on, check before descending.
    pub backtracked: bool,
    /// Whether pruning may skip subtrees on this node (decided on first need).
    pub(super) allowed: Option<bool>,
    /// Situations that failed, with how (`NotFound` or `MaxSize`).
    pub(super) memo: HashMap<Vec<u64>, Flow>,
    /// Subtrees skipped because they were infeasible or seen before.
    pub skipped: u64,
}

/// What to do at a call.
pub(super) enum Check {
    /// The subtree is known to fail like this.
    Skip(Flow),
    /// Search it; remember the outcome under this key if it fails.
    Search(Option<Vec<u64>>),
}
