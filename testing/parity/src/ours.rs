//! Tessera's side: the same instance through `tessera_allocator` in first-fit mode, the way
//! `tessera explain --mode first-fit` runs it (one inventory, the allocated state from the claims
//! in use, every node in name order), plus one allocation per node for the per-node comparison.

use std::time::Instant;

use tessera_allocator::{
    AllocateError, AllocateOptions, AllocatedState, DeviceId, DeviceIndex, Outcome, PlacementMode,
    quantity::Amount,
};

use crate::instance::{Instance, NodeVerdict, Verdict, VerdictKind};

/// The error class (the same names the Go oracle uses) of an allocator error.
pub fn error_class(e: &AllocateError) -> &'static str {
    match e {
        AllocateError::CelRuntime { .. } => "cel-runtime",
        AllocateError::CelCompile { .. } => "cel-compile",
        AllocateError::AllOnUnusablePool { .. } => "all-pool-unusable",
        AllocateError::ConstraintRejectsAll { .. } => "all-constraint",
        AllocateError::TooManyDevices { .. } => "too-many-devices",
        AllocateError::SearchBudgetExhausted { .. } => "timeout",
        AllocateError::UnsupportedNodeSelector { .. } => "node-selector",
        AllocateError::InvalidCapacityRequest { .. } => "capacity",
        AllocateError::UnknownNode { .. } => "other",
        _ => "invalid-request",
    }
}

/// The allocated state of an instance: its claims in use plus the explicit state.
pub fn allocated_state(instance: &Instance) -> anyhow::Result<AllocatedState> {
    let mut state = AllocatedState::from_claims(&instance.allocated_claims)?;
    if let Some(explicit) = &instance.state {
        let id = |d: &crate::instance::DeviceRef| DeviceId::new(&d.driver, &d.pool, &d.device);
        for d in &explicit.devices {
            state.insert_device(id(d));
        }
        for s in &explicit.shared {
            state.insert_shared(id(&s.device), &s.share_id, []);
        }
        for c in &explicit.consumed {
            let consumed = c
                .capacity
                .iter()
                .map(|(name, q)| Ok((name.clone(), Amount::from_quantity(q)?)))
                .collect::<Result<Vec<_>, tessera_allocator::quantity::InvalidQuantity>>()?;
            state.insert_consumed(id(&c.device), consumed);
        }
    }
    Ok(state)
}

/// Builds the inventory of an instance.
pub fn inventory(instance: &Instance) -> DeviceIndex {
    DeviceIndex::from_nodes(
        instance.slices.clone(),
        instance.classes.clone(),
        &instance.nodes,
    )
}

fn options() -> AllocateOptions {
    AllocateOptions {
        mode: PlacementMode::FirstFit,
        explain: false,
        ..AllocateOptions::default()
    }
}

/// Tessera's verdict: first fit over the nodes (or the instance's one node), and every node on
/// its own.
pub fn run(instance: &Instance) -> anyhow::Result<Verdict> {
    let inv = inventory(instance);
    let state = allocated_state(instance)?;
    let overall = inv.allocate(
        &instance.claims,
        &state,
        instance.node.as_deref(),
        &options(),
    );
    let mut nodes = Vec::new();
    let prefilter = matches!(&overall, Ok(Outcome::Unsatisfiable(u)) if u.claim_problem.is_some())
        || matches!(&overall, Err(AllocateError::MissingClassName { .. }));
    for node in inv.nodes().iter().filter(|_| !prefilter) {
        if instance.node.as_ref().is_some_and(|n| *n != node.name) {
            continue;
        }
        let start = Instant::now();
        let result = inv.allocate(&instance.claims, &state, Some(&node.name), &options());
        let micros = i64::try_from(start.elapsed().as_micros()).unwrap_or(i64::MAX);
        let mut v = NodeVerdict {
            node: node.name.clone(),
            outcome: VerdictKind::Unsatisfiable,
            error_class: None,
            message: None,
            allocations: Vec::new(),
            micros,
        };
        match result {
            Ok(Outcome::Allocated(a)) => {
                v.outcome = VerdictKind::Allocated;
                v.allocations = a.claims.into_iter().map(|c| c.result).collect();
            }
            Ok(Outcome::Unsatisfiable(u)) => {
                v.message = Some(u.to_string());
            }
            Err(e) => {
                v.outcome = VerdictKind::Error;
                v.error_class = Some(error_class(&e).into());
                v.message = Some(e.to_string());
            }
        }
        nodes.push(v);
    }
    let mut verdict = Verdict {
        name: instance.name.clone(),
        outcome: VerdictKind::Unsatisfiable,
        node: None,
        allocations: Vec::new(),
        error_class: None,
        message: None,
        stage: None,
        nodes,
    };
    match overall {
        Ok(Outcome::Allocated(a)) => {
            verdict.outcome = VerdictKind::Allocated;
            verdict.node = Some(a.node);
            verdict.allocations = a.claims.into_iter().map(|c| c.result).collect();
        }
        Ok(Outcome::Unsatisfiable(u)) => verdict.message = Some(u.to_string()),
        Err(e) => {
            verdict.outcome = VerdictKind::Error;
            verdict.error_class = Some(error_class(&e).into());
            verdict.message = Some(e.to_string());
        }
    }
    Ok(verdict)
}
