//! Selector verdicts the reference reads instead of evaluating CEL itself: every selector of an
//! instance (its classes' and its claims') on every device of every slice, computed once.
//!
//! In the parity job they come from upstream's own CEL environment (the Go oracle's `cel`
//! operation, the same library kube-scheduler evaluates selectors with), so the reference shares
//! no CEL code with Tessera; unit tests without Go use `tessera-cel` instead. The `cel`
//! subcommand compares the two environments on every selector the generator writes.

use std::collections::{BTreeSet, HashMap};

use crate::cel::{CelDevice, CelVerdict};
use crate::instance::Instance;
use crate::oracle::Oracle;

/// One selector's verdict on one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Eval {
    True,
    False,
    CompileError,
    RuntimeError,
}

/// Verdicts by expression and device (slice and device position in the instance).
#[derive(Debug, Default)]
pub struct SelectorTable {
    verdicts: HashMap<(String, usize, usize), Eval>,
}

impl SelectorTable {
    /// Upstream's verdicts (the Go oracle).
    pub fn upstream(oracle: &mut Oracle, instance: &Instance) -> anyhow::Result<SelectorTable> {
        let (expressions, devices, positions) = inputs(instance);
        if expressions.is_empty() || devices.is_empty() {
            return Ok(SelectorTable::default());
        }
        let verdicts = crate::cel::upstream(oracle, &expressions, &devices)?;
        Ok(SelectorTable::from_verdicts(
            &expressions,
            &positions,
            &verdicts,
        ))
    }

    /// `tessera-cel`'s verdicts (tests that run without Go).
    pub fn tessera(instance: &Instance) -> SelectorTable {
        let (expressions, devices, positions) = inputs(instance);
        let verdicts = crate::cel::ours(&expressions, &devices);
        SelectorTable::from_verdicts(&expressions, &positions, &verdicts)
    }

    fn from_verdicts(
        expressions: &[String],
        positions: &[(usize, usize)],
        verdicts: &[Vec<CelVerdict>],
    ) -> SelectorTable {
        let mut table = SelectorTable::default();
        for (e, row) in expressions.iter().zip(verdicts) {
            for (&(s, d), v) in positions.iter().zip(row) {
                let eval = match (v.result.as_str(), v.error_class.as_deref()) {
                    ("true", _) => Eval::True,
                    ("false", _) => Eval::False,
                    (_, Some("cel-compile")) => Eval::CompileError,
                    _ => Eval::RuntimeError,
                };
                table.verdicts.insert((e.clone(), s, d), eval);
            }
        }
        table
    }

    /// The verdict of `expression` on device `device` of slice `slice`.
    pub fn get(&self, expression: &str, slice: usize, device: usize) -> Option<Eval> {
        self.verdicts
            .get(&(expression.to_owned(), slice, device))
            .copied()
    }
}

type Inputs = (Vec<String>, Vec<CelDevice>, Vec<(usize, usize)>);

/// The instance's expressions, its devices and their positions.
fn inputs(instance: &Instance) -> Inputs {
    let mut expressions = BTreeSet::new();
    for class in &instance.classes {
        let selectors = class.spec.as_ref().and_then(|s| s.selectors.as_ref());
        for s in selectors.into_iter().flatten() {
            expressions.extend(s.cel.as_ref().map(|c| c.expression.clone()));
        }
    }
    for claim in &instance.claims {
        let requests = claim
            .spec
            .as_ref()
            .and_then(|s| s.devices.as_ref())
            .and_then(|d| d.requests.as_ref());
        for r in requests.into_iter().flatten() {
            let exact = r.exactly.iter().flat_map(|e| e.selectors.iter().flatten());
            let subs = r
                .first_available
                .iter()
                .flatten()
                .flat_map(|s| s.selectors.iter().flatten());
            for s in exact.chain(subs) {
                expressions.extend(s.cel.as_ref().map(|c| c.expression.clone()));
            }
        }
    }
    let mut devices = Vec::new();
    let mut positions = Vec::new();
    for (i, slice) in instance.slices.iter().enumerate() {
        for (j, device) in slice.spec.devices.iter().flatten().enumerate() {
            devices.push(CelDevice {
                driver: slice.spec.driver.clone(),
                device: device.clone(),
            });
            positions.push((i, j));
        }
    }
    (expressions.into_iter().collect(), devices, positions)
}
