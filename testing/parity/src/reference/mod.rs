//! The reference allocator: first fit for small instances, written from what the API and
//! kube-scheduler document, in test code, sharing nothing with `crates/allocator` but the API
//! types. It decides the instances upstream gives up on (its 10 s Filter timeout), and it is
//! itself checked against upstream on every instance upstream decides.
//!
//! How it differs from an allocator: it keeps nothing between calls and caches nothing; it reads
//! selector verdicts from a table ([`selectors`]; in the parity job, upstream's own CEL
//! environment computes them, so no CEL code is shared with Tessera either); it reads quantities
//! with a parser of its own ([`quantity`]); it walks assignments one device at a time in
//! first-fit order ([`search`]), and prunes only where it has shown that no error can happen. It
//! does not try to be fast beyond that: an instance it cannot decide within its budget of tried
//! devices, or that uses something it does not model, is *beyond its reach* ([`Beyond`]), and the
//! generator does not produce such instances.
//!
//! The verdict has the shape of the other two sides' (crate::instance::Verdict): PreFilter's
//! answer, or each node's (in name order) and the pod's — an error on any node fails the pod,
//! else the first node that fits.

mod alternative;
mod checks;
mod pools;
pub mod quantity;
mod request;
mod result;
pub mod search;
pub mod selectors;
mod state;
mod stop;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::instance::{Instance, NodeVerdict, Verdict, VerdictKind, apply_defaults};
use request::Planning;
use search::Search;
use selectors::SelectorTable;
use state::State;
pub use stop::Beyond;
use stop::{NodeStop, beyond, quantity};

/// How the reference walks an instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// Devices tried on one node before the reference gives up.
    pub budget: u64,
    /// Whether to prune prefixes that cannot be completed (only where no error is possible).
    pub prune: bool,
}

impl Options {
    /// An ordinary instance is walked plainly — exactly the walk first fit makes — and must
    /// stay small: an instance whose walk tries more than [`ORDINARY_WALK`] devices on a node
    /// is beyond reach (refused, drawn again), which keeps ordinary instances far inside
    /// upstream's timeout (upstream tries about half a million devices a second on a loaded
    /// CI machine). An adversarial instance is pruned, with a larger budget.
    pub fn for_instance(instance: &Instance) -> Options {
        if instance.adversarial {
            Options {
                budget: 2_000_000,
                prune: true,
            }
        } else {
            Options {
                budget: ORDINARY_WALK,
                prune: false,
            }
        }
    }
}

/// The longest plain walk (devices tried on one node) of an ordinary instance.
pub const ORDINARY_WALK: u64 = 250_000;

/// The reference's verdict on an instance, with the devices it tried on the busiest node.
#[derive(Debug)]
pub struct ReferenceDecision {
    pub verdict: Verdict,
    pub most_trials: u64,
}

/// Decides an instance (defaults applied as the API server applies them).
pub fn decide(
    instance: &Instance,
    table: &SelectorTable,
    options: Options,
) -> Result<ReferenceDecision, Beyond> {
    let mut instance = instance.clone();
    apply_defaults(&mut instance);
    refuse_unmodelled(&instance)?;
    let mut verdict = Verdict {
        name: instance.name.clone(),
        outcome: VerdictKind::Unsatisfiable,
        node: None,
        allocations: Vec::new(),
        error_class: None,
        message: None,
        stage: Some("prefilter".into()),
        nodes: Vec::new(),
    };
    if let Some((error, class)) = request::prefilter(&instance.claims, &instance.classes) {
        verdict.outcome = if error {
            VerdictKind::Error
        } else {
            VerdictKind::Unsatisfiable
        };
        verdict.error_class = Some(class.into());
        return Ok(ReferenceDecision {
            verdict,
            most_trials: 0,
        });
    }
    verdict.stage = Some("filter".into());
    let state = State::of(&instance)?;
    let mut most_trials = 0;
    for node in nodes(&instance) {
        let name = node.metadata.name.clone().unwrap_or_default();
        if instance.node.as_ref().is_some_and(|n| *n != name) {
            continue;
        }
        let (outcome, trials) = decide_node(&instance, &node, &state, table, options)?;
        most_trials = most_trials.max(trials);
        verdict.nodes.push(outcome);
    }
    if let Some(e) = verdict
        .nodes
        .iter()
        .find(|n| n.outcome == VerdictKind::Error)
    {
        verdict.outcome = VerdictKind::Error;
        verdict.node = Some(e.node.clone());
        verdict.error_class = e.error_class.clone();
    } else if let Some(a) = verdict
        .nodes
        .iter()
        .find(|n| n.outcome == VerdictKind::Allocated)
    {
        verdict.outcome = VerdictKind::Allocated;
        verdict.node = Some(a.node.clone());
        verdict.allocations = a.allocations.clone();
    }
    Ok(ReferenceDecision {
        verdict,
        most_trials,
    })
}

/// One node: the pools it sees, the claims' plans, the walk.
fn decide_node(
    instance: &Instance,
    node: &Node,
    state: &State,
    table: &SelectorTable,
    options: Options,
) -> Result<(NodeVerdict, u64), Beyond> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let mut verdict = NodeVerdict {
        node: name.clone(),
        outcome: VerdictKind::Unsatisfiable,
        error_class: None,
        message: None,
        allocations: Vec::new(),
        micros: 0,
    };
    let error = |mut v: NodeVerdict, class: &str| {
        v.outcome = VerdictKind::Error;
        v.error_class = Some(class.into());
        v
    };
    let view = pools::node_view(&instance.slices, node, state)?;
    let planning = Planning {
        classes: &instance.classes,
        view: &view,
        table,
        node,
    };
    let plans = match planning.plans(&instance.claims) {
        Ok(plans) => plans,
        Err(NodeStop::Error(class)) => return Ok((error(verdict, class), 0)),
        Err(NodeStop::Beyond(b)) => return Err(b),
    };
    let mut search = Search::new(
        &plans,
        &view,
        table,
        state,
        node,
        options.budget,
        options.prune,
    );
    let found = match search.run() {
        Ok(found) => found,
        Err(NodeStop::Error(class)) => return Ok((error(verdict, class), search.trials)),
        Err(NodeStop::Beyond(b)) => return Err(b),
    };
    if !found {
        if view
            .pools
            .iter()
            .any(|p| p.state == pools::PoolState::Invalid)
        {
            verdict.error_class = Some("invalid-pools".into());
        }
        return Ok((verdict, search.trials));
    }
    match result::allocations(&search, &name) {
        Ok(allocations) => {
            verdict.outcome = VerdictKind::Allocated;
            verdict.allocations = allocations;
            Ok((verdict, search.trials))
        }
        Err(NodeStop::Error(class)) => Ok((error(verdict, class), search.trials)),
        Err(NodeStop::Beyond(b)) => Err(b),
    }
}

/// The instance's nodes by name; without Node objects, one bare node per node name used.
fn nodes(instance: &Instance) -> Vec<Node> {
    let mut nodes = instance.nodes.clone();
    if nodes.is_empty() {
        let mut names: Vec<String> = instance
            .slices
            .iter()
            .flat_map(|s| {
                s.spec
                    .node_name
                    .iter()
                    .chain(
                        s.spec
                            .devices
                            .iter()
                            .flatten()
                            .filter_map(|d| d.node_name.as_ref()),
                    )
                    .filter(|n| !n.is_empty())
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .collect();
        names.sort();
        names.dedup();
        nodes = names
            .into_iter()
            .map(|name| Node {
                metadata: ObjectMeta {
                    name: Some(name),
                    ..Default::default()
                },
                ..Default::default()
            })
            .collect();
    }
    nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    nodes
}

/// Fields whose semantics the reference does not model (newer alpha features, list attributes,
/// a request policy whose default breaks the policy itself).
fn refuse_unmodelled(instance: &Instance) -> Result<(), Beyond> {
    for slice in &instance.slices {
        let spec = &slice.spec;
        if spec.partition_type_attribute.is_some() || spec.skip_node_operations.is_some() {
            return Err(beyond("a slice field of a newer alpha feature"));
        }
        for device in spec.devices.iter().flatten() {
            if device.node_allocatable_resources.is_some() {
                return Err(beyond("node allocatable resources"));
            }
            let lists = device.attributes.iter().flatten().any(|(_, a)| {
                a.bools.is_some() || a.ints.is_some() || a.strings.is_some() || a.versions.is_some()
            });
            if lists {
                return Err(beyond("list attributes"));
            }
            let groups = device
                .consumes_counters
                .iter()
                .flatten()
                .any(|c| c.compatibility_groups.is_some());
            if groups {
                return Err(beyond("counter compatibility groups"));
            }
            for capacity in device.capacity.iter().flatten().map(|(_, c)| c) {
                if let Some(policy) = &capacity.request_policy
                    && let Some(default) = &policy.default
                    && checks::policy_rejects(quantity(default)?, policy)?
                {
                    return Err(beyond("a capacity request policy whose default it rejects"));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
