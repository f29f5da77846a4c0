//! The entry point: allocate a set of claims (jointly, e.g. all claims of a pod) on one node or on
//! the node the mode prefers.

use std::sync::MutexGuard;
use std::sync::atomic::Ordering;

use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaim};
use serde::{Deserialize, Serialize};

use crate::cluster::Cluster;
use crate::error::AllocateError;
use crate::explain::{NodeExplanation, Unsatisfiable};
use crate::index::DeviceIndex;
use crate::node::NodeInfo;
use crate::pools::NodePools;
use crate::request::{Plan, claim_name, prefilter};
use crate::result::allocation_results;
use crate::search::{
    NodeSearch, NodeVerdict, PairCheck, QuietNode, QuietVerdicts, SearchMode, Solution,
    always_quiet, first_fit_may_skip_nodes, quiet_node,
};
use crate::state::AllocatedState;
use crate::topology::NumaPolicy;
use crate::topology::TopologyScore;
use crate::verdicts::{NodeUse, PlanResults, Stored, VerdictCache, plan_key, pool_stamps};

/// Steps one node's search may take by default (each checked candidate or recursion is a step).
/// About 0.8 s of best-of search on one core (770 ms for 10 of 80 devices, docs/benchmarks.md,
/// "Allocation"); past it the search stops.
pub const DEFAULT_STEP_BUDGET: u64 = 2_000_000;

/// How devices and nodes are chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PlacementMode {
    /// Exactly what kube-scheduler picks for the same input: the first solution in pool / slice /
    /// device order, and the first node (by name) that has one.
    #[default]
    FirstFit,
    /// The solution with the best [`TopologyScore`] on each node, and the node with the best
    /// score (ties: the first node by name).
    TopologyAware,
}

impl std::fmt::Display for PlacementMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PlacementMode::FirstFit => "first-fit",
            PlacementMode::TopologyAware => "topology-aware",
        })
    }
}

/// Options of one allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocateOptions {
    /// Device and node choice.
    pub mode: PlacementMode,
    /// Steps the search may take per node; see [`DEFAULT_STEP_BUDGET`].
    pub step_budget: u64,
    /// Whether to account, device by device, for nodes that do not fit. Costs one more pass over
    /// the node's devices per failed node; without it a failed node gets a one-line reason.
    pub explain: bool,
    /// Topology-aware: how NUMA alignment weighs against fragmentation ([`NumaPolicy`]).
    pub numa: NumaPolicy,
}

impl Default for AllocateOptions {
    fn default() -> AllocateOptions {
        AllocateOptions {
            mode: PlacementMode::FirstFit,
            step_budget: DEFAULT_STEP_BUDGET,
            explain: true,
            numa: NumaPolicy::Align,
        }
    }
}

/// The allocation of one claim.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClaimAllocation {
    /// `namespace/name` of the claim.
    pub claim: String,
    /// What to write into the claim's `status.allocation`.
    pub result: AllocationResult,
}

/// A successful allocation of all claims on one node.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Allocation {
    /// The node the claims were allocated for.
    pub node: String,
    /// One entry per claim, in input order.
    pub claims: Vec<ClaimAllocation>,
    /// The placement's score (computed in both modes).
    pub score: TopologyScore,
    /// Search steps taken, over all nodes searched in this call (topology-aware choice among
    /// nodes answers unchanged nodes from stored results, which take none).
    pub steps: u64,
    /// Topology-aware search stopped at the step budget on the chosen node: the placement is valid
    /// and at least as good as first fit, but a better one may exist.
    pub truncated: bool,
}

/// The answer to "can these claims be allocated?".
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Outcome {
    /// Yes, like this.
    Allocated(Allocation),
    /// No; why, node by node.
    Unsatisfiable(Unsatisfiable),
}

impl DeviceIndex {
    /// Allocates `claims` jointly on `node`, or — without a node — on the node the mode prefers
    /// among all nodes of the inventory. `state` holds the devices already allocated.
    ///
    /// Errors are problems with the input (unknown class, CEL error, …) or an exhausted search
    /// budget; claims that do not fit are [`Outcome::Unsatisfiable`].
    pub fn allocate(
        &self,
        claims: &[ResourceClaim],
        state: &AllocatedState,
        node: Option<&str>,
        options: &AllocateOptions,
    ) -> Result<Outcome, AllocateError> {
        if let Some(problem) = prefilter(&self.cluster, claims)? {
            return Ok(Outcome::Unsatisfiable(Unsatisfiable {
                claim_problem: Some(problem),
                nodes: Vec::new(),
            }));
        }
        let plan = Plan::new(&self.cluster, claims)?;
        let positions: Vec<usize> = match node {
            Some(name) => {
                let position =
                    self.cluster
                        .node_position(name)
                        .ok_or_else(|| AllocateError::UnknownNode {
                            node: name.to_owned(),
                            known: known_nodes(self),
                        })?;
                vec![position]
            }
            None => (0..self.nodes().len()).collect(),
        };
        self.allocate_at(claims, &plan, state, &positions, node.is_none(), options)
    }

    /// Like [`DeviceIndex::allocate`] without a node, but choosing only among the nodes for which
    /// `eligible` is true (e.g. the nodes a pod's node selector, affinity, tolerations and
    /// resource requests allow). Nodes the inventory does not know are never offered.
    pub fn allocate_among(
        &self,
        claims: &[ResourceClaim],
        state: &AllocatedState,
        eligible: impl Fn(&NodeInfo) -> bool,
        options: &AllocateOptions,
    ) -> Result<Outcome, AllocateError> {
        if let Some(problem) = prefilter(&self.cluster, claims)? {
            return Ok(Outcome::Unsatisfiable(Unsatisfiable {
                claim_problem: Some(problem),
                nodes: Vec::new(),
            }));
        }
        let plan = Plan::new(&self.cluster, claims)?;
        let positions: Vec<usize> = (0..self.nodes().len())
            .filter(|&p| eligible(&self.nodes()[p]))
            .collect();
        self.allocate_at(claims, &plan, state, &positions, true, options)
    }

    /// The outcome of searching the nodes at `positions` (see [`DeviceIndex::search_nodes`]).
    fn allocate_at(
        &self,
        claims: &[ResourceClaim],
        plan: &Plan<'_>,
        state: &AllocatedState,
        positions: &[usize],
        skip_quickly: bool,
        options: &AllocateOptions,
    ) -> Result<Outcome, AllocateError> {
        let search = self.search_nodes(plan, state, positions, skip_quickly, options)?;
        if let Some((position, solution, truncated)) = search.best {
            let results =
                allocation_results(&self.cluster, self.pools_for(position), plan, &solution)?;
            return Ok(Outcome::Allocated(Allocation {
                node: self.nodes()[position].name.clone(),
                claims: claims
                    .iter()
                    .zip(results)
                    .map(|(c, result)| ClaimAllocation {
                        claim: claim_name(c),
                        result,
                    })
                    .collect(),
                score: solution.score,
                steps: search.steps,
                truncated,
            }));
        }
        let mut explanations = Vec::with_capacity(search.failed.len());
        for position in search.failed {
            let pools = self.pools_for(position);
            explanations.push(if options.explain {
                NodeExplanation::diagnose(&self.cluster, pools, state, plan)?
            } else {
                NodeExplanation::brief(pools)
            });
        }
        Ok(Outcome::Unsatisfiable(Unsatisfiable {
            claim_problem: None,
            nodes: explanations,
        }))
    }

    /// Searches the nodes at `positions` in order: first fit ([`DeviceIndex::first_fit_nodes`])
    /// or topology-aware, which keeps the best score; with `skip_quickly`, topology-aware does not
    /// search nodes without enough free devices.
    fn search_nodes(
        &self,
        plan: &Plan<'_>,
        state: &AllocatedState,
        positions: &[usize],
        skip_quickly: bool,
        options: &AllocateOptions,
    ) -> Result<NodesSearched, AllocateError> {
        if options.mode == PlacementMode::FirstFit {
            return self.first_fit_nodes(plan, state, positions, skip_quickly, options);
        }
        let mut out = NodesSearched::default();
        let min_devices = plan.min_devices();
        let mut cache = self.verdict_cache(plan, options, skip_quickly);
        let mut cached = cache.as_mut().map(|c| {
            let key = plan_key(
                plan.claims.iter().map(|c| c.claim),
                options.step_budget,
                options.numa,
            );
            c.plan(key, self.nodes().len())
        });
        for &position in positions {
            let pools = self.pools_for(position);
            let bound = out.best.as_ref().map(|(_, s, _)| s.score.comm_cost);
            if let Some(results) = cached.as_deref_mut()
                && let Some(stored) = self.stored_verdict(
                    results,
                    (position, pools),
                    state,
                    plan,
                    options,
                    (bound, min_devices, &mut out.steps),
                )
            {
                out.offer_stored(position, stored);
                continue;
            }
            if skip_quickly && !fits_at_all(&self.cluster, pools, state, plan, min_devices) {
                out.failed.push(position);
                continue;
            }
            let verdict = self.search_node(pools, state, plan, options, bound)?;
            out.offer(position, verdict, false);
        }
        Ok(out)
    }

    /// First fit does what kube-scheduler's Filter does: it tries nodes until it has found as
    /// many that fit as the scheduler wants to find ([`nodes_to_find`]: every node of a cluster
    /// with fewer than 100), keeps the first that fits, and fails on an error from any node it
    /// tried (the first in node order).
    ///
    /// With `skip_quickly` (a choice among nodes) it searches only the nodes that matter for that
    /// outcome (module `search::skip`): a quiet node (one whose search can raise no error) with
    /// too few free devices is passed by as one without a solution; a quiet node after the one
    /// chosen is not searched at all unless a node after it that is not quiet has to be searched
    /// for its error, and then only while fewer nodes than the scheduler wants have been found
    /// to fit. Nodes in front of the one that fits then cost a check of their free devices, not a
    /// search, and so do the nodes after it.
    fn first_fit_nodes(
        &self,
        plan: &Plan<'_>,
        state: &AllocatedState,
        positions: &[usize],
        skip_quickly: bool,
        options: &AllocateOptions,
    ) -> Result<NodesSearched, AllocateError> {
        let mut walk = FirstFitWalk {
            out: NodesSearched::default(),
            to_find: nodes_to_find(self.nodes().len()),
            found: 0,
            deferred: Vec::new(),
        };
        let min_devices = plan.min_devices();
        let quiet = (skip_quickly && first_fit_may_skip_nodes(plan))
            .then(|| self.quiet_verdicts(plan, options));
        for &position in positions {
            if let Some(verdicts) = &quiet {
                let pairs = self.pairs(position, plan);
                let always = *verdicts[position].get_or_init(|| always_quiet(pairs));
                if always && walk.out.best.is_some() {
                    walk.deferred.push(position);
                    continue;
                }
                match quiet_node(pairs, state, min_devices, always) {
                    Some(QuietNode::TooFewFree) => {
                        walk.out.failed.push(position);
                        continue;
                    }
                    Some(QuietNode::MayFit) if walk.out.best.is_some() => {
                        walk.deferred.push(position);
                        continue;
                    }
                    _ => {}
                }
            }
            for deferred in std::mem::take(&mut walk.deferred) {
                let pools = self.pools_for(deferred);
                if !fits_at_all(&self.cluster, pools, state, plan, min_devices) {
                    walk.out.failed.push(deferred);
                    continue;
                }
                if walk.try_node(
                    deferred,
                    self.search_first_fit(deferred, plan, state, options),
                )? {
                    return Ok(walk.out);
                }
            }
            if walk.try_node(
                position,
                self.search_first_fit(position, plan, state, options),
            )? {
                break;
            }
        }
        Ok(walk.out)
    }

    /// The (slot, candidate) pairs of `plan` on the node at `position`.
    fn pairs<'p>(&'p self, position: usize, plan: &'p Plan<'p>) -> PairCheck<'p> {
        PairCheck {
            inv: &self.cluster,
            np: self.pools_for(position),
            plan,
        }
    }

    /// Per node, whether first fit's search there can raise no error whatever is in use, for
    /// the claims' shape (module `search::skip`).
    fn quiet_verdicts(&self, plan: &Plan<'_>, options: &AllocateOptions) -> QuietVerdicts {
        let key = plan_key(
            plan.claims.iter().map(|c| c.claim),
            options.step_budget,
            options.numa,
        );
        self.quiet
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .shape(key, self.nodes().len())
    }

    /// The first-fit search of the node at `position`.
    fn search_first_fit(
        &self,
        position: usize,
        plan: &Plan<'_>,
        state: &AllocatedState,
        options: &AllocateOptions,
    ) -> Result<NodeVerdict, AllocateError> {
        self.search_node(self.pools_for(position), state, plan, options, None)
    }

    /// The stored results of earlier searches, for a topology-aware choice among nodes: results
    /// of earlier allocations of the same claim shape are reused on nodes whose devices in use
    /// did not change (module `verdicts`). `None` in first fit, on one node, with
    /// `firstAvailable`, or when reuse is off.
    fn verdict_cache(
        &self,
        plan: &Plan<'_>,
        options: &AllocateOptions,
        skip_quickly: bool,
    ) -> Option<MutexGuard<'_, VerdictCache>> {
        let reuse = self
            .reuse_results
            .load(std::sync::atomic::Ordering::Relaxed);
        let first_fit = options.mode == PlacementMode::FirstFit;
        (reuse && !first_fit && skip_quickly && !plan.has_first_available()).then(|| {
            self.verdicts
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        })
    }

    /// The live search on one node: first fit, or best-of within `bound` (the best
    /// communication cost found on earlier nodes).
    fn search_node(
        &self,
        pools: &NodePools,
        state: &AllocatedState,
        plan: &Plan<'_>,
        options: &AllocateOptions,
        bound: Option<u64>,
    ) -> Result<NodeVerdict, AllocateError> {
        let mode = match options.mode {
            PlacementMode::FirstFit => SearchMode::FirstFit,
            PlacementMode::TopologyAware => SearchMode::Best { bound },
        };
        self.node_searches.fetch_add(1, Ordering::Relaxed);
        NodeSearch::new(&self.cluster, pools, state, plan, mode, options.step_budget)
            .map(|search| search.with_numa(options.numa))
            .and_then(NodeSearch::run)
    }

    /// What the bounded best-of search on the node at `position` would return, answered from
    /// the node's stored unbounded result (searched and stored first when the node's devices in
    /// use changed): `Some(Some(solution))` a solution within `bound`, `Some(None)` nothing within
    /// it, or too few free devices to try ([`fits_at_all`]). `None` when only the live search can
    /// tell (it stopped at the budget or failed). The steps of a search run here are added to
    /// `steps`.
    fn stored_verdict<'r>(
        &self,
        results: &'r mut PlanResults,
        (position, pools): (usize, &NodePools),
        state: &AllocatedState,
        plan: &Plan<'_>,
        options: &AllocateOptions,
        (bound, min_devices, steps): (Option<u64>, usize, &mut u64),
    ) -> Option<Option<&'r Solution>> {
        let slot = &mut results.nodes[position];
        // Unchanged pools (same stamps) need no device-by-device comparison.
        let holds = match slot.as_mut() {
            Some(s) if s.stamps.iter().copied().eq(pool_stamps(pools, state)) => true,
            Some(s) if s.uses.matches(&self.cluster, pools, state) => {
                s.stamps = pool_stamps(pools, state).collect();
                true
            }
            _ => false,
        };
        if !holds {
            *slot = None;
            let solution = if fits_at_all(&self.cluster, pools, state, plan, min_devices) {
                let verdict = self
                    .search_node(pools, state, plan, options, None)
                    .ok()
                    .filter(|v| !v.truncated)?;
                *steps += verdict.steps;
                verdict.solution
            } else {
                None
            };
            *slot = Some(Stored {
                uses: NodeUse::of(&self.cluster, pools, state),
                stamps: pool_stamps(pools, state).collect(),
                solution,
            });
        }
        let stored = slot.as_ref()?;
        Some(
            stored
                .solution
                .as_ref()
                .filter(|s| bound.is_none_or(|b| s.score.comm_cost <= b)),
        )
    }
}

/// Where a first-fit walk over the nodes stands.
struct FirstFitWalk {
    out: NodesSearched,
    /// How many fitting nodes the scheduler wants to find ([`nodes_to_find`]).
    to_find: usize,
    /// How many nodes were found to fit.
    found: usize,
    /// Quiet nodes after the one chosen whose search was put off (module `search::skip`).
    deferred: Vec<usize>,
}

impl FirstFitWalk {
    /// Takes the search of the node at `position`: `Ok(true)` when the walk is over (enough
    /// nodes fit), an error from the node fails the walk (the first in node order: the walk
    /// stops at it).
    fn try_node(
        &mut self,
        position: usize,
        verdict: Result<NodeVerdict, AllocateError>,
    ) -> Result<bool, AllocateError> {
        if self.out.offer(position, verdict?, true) {
            self.found += 1;
        }
        Ok(self.found >= self.to_find)
    }
}

/// What searching the nodes found: the best node and solution (and whether that search was
/// truncated), the nodes without a solution, and the steps taken.
#[derive(Default)]
struct NodesSearched {
    best: Option<(usize, Solution, bool)>,
    failed: Vec<usize>,
    steps: u64,
}

impl NodesSearched {
    /// Takes a node's live search: keeps its solution if it is the first (first fit) or better
    /// than the best so far (topology-aware). Whether the node has a solution.
    fn offer(&mut self, position: usize, verdict: NodeVerdict, first_fit: bool) -> bool {
        self.steps += verdict.steps;
        let Some(solution) = verdict.solution else {
            self.failed.push(position);
            return false;
        };
        let better = match &self.best {
            None => true,
            Some(_) if first_fit => false,
            Some((_, b, _)) => solution.score < b.score,
        };
        if better {
            self.best = Some((position, solution, verdict.truncated));
        }
        true
    }

    /// Takes a node's stored result (topology-aware only): kept if better than the best so far.
    fn offer_stored(&mut self, position: usize, stored: Option<&Solution>) {
        match stored {
            Some(s) if self.best.as_ref().is_none_or(|(_, b, _)| s.score < b.score) => {
                self.best = Some((position, s.clone(), false));
            }
            Some(_) => {}
            None => self.failed.push(position),
        }
    }
}

/// How many fitting nodes kube-scheduler's Filter looks for before it stops trying nodes
/// (`numFeasibleNodesToFind` with the default adaptive percentage): every node below 100 nodes,
/// then 50 % minus a point per 125 nodes (at least 5 %), at least 100 nodes.
pub(crate) fn nodes_to_find(nodes: usize) -> usize {
    const MIN: usize = 100;
    if nodes < MIN {
        return nodes.max(1);
    }
    let percentage = 50usize.saturating_sub(nodes / 125).max(5);
    (nodes * percentage / 100).max(MIN)
}

/// A quick necessary condition when choosing among many nodes: enough devices not in use for the
/// smallest possible allocation. Undecided (true) when devices may be shared: admin access or
/// multi-allocatable devices.
fn fits_at_all(
    inv: &Cluster,
    pools: &NodePools,
    state: &AllocatedState,
    plan: &Plan<'_>,
    min: usize,
) -> bool {
    if plan.has_admin_access() || pools.has_multi_allocatable {
        return true;
    }
    let free = pools
        .candidates
        .iter()
        .filter(|&&d| !state.is_in_use(&inv.devices[d].id))
        .take(min)
        .count();
    free >= min
}

fn known_nodes(inv: &DeviceIndex) -> String {
    let names: Vec<&str> = inv
        .nodes()
        .iter()
        .take(10)
        .map(|n| n.name.as_str())
        .collect();
    let more = inv.nodes().len().saturating_sub(names.len());
    match (names.is_empty(), more) {
        (true, _) => "none".into(),
        (false, 0) => names.join(", "),
        (false, m) => format!("{}, … and {m} more", names.join(", ")),
    }
}
