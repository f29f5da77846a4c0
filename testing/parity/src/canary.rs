//! The parity job's canary: a deliberately wrong Tessera. `tessera-parity diff --canary` plants
//! two faults into Tessera's verdicts — on the first allocated instance, one allocated device
//! swapped for another device of the same pool; on the next allocated instance, the outcome
//! flipped to unsatisfiable — and the job must fail on exactly those instances. scripts/test-all
//! runs it and fails when the canary passes.

use crate::instance::{Instance, Verdict, VerdictKind};

/// The faults planted so far: (instance, what).
#[derive(Debug, Default)]
pub struct Canary {
    pub planted: Vec<(String, String)>,
}

impl Canary {
    /// Plants the next fault into `ours` if this instance can carry it; returns what was
    /// planted.
    pub fn plant(&mut self, instance: &Instance, ours: &mut Verdict) -> Option<String> {
        if ours.outcome != VerdictKind::Allocated {
            return None;
        }
        let what = match self.planted.len() {
            0 => swap_device(instance, ours)?,
            1 => flip_outcome(ours),
            _ => return None,
        };
        self.planted.push((instance.name.clone(), what.clone()));
        Some(what)
    }
}

/// One allocated device replaced by another device of its pool (in the pod's allocation and in
/// its node's).
fn swap_device(instance: &Instance, ours: &mut Verdict) -> Option<String> {
    let first = ours
        .allocations
        .first()?
        .devices
        .as_ref()?
        .results
        .as_ref()?
        .first()?
        .clone();
    let taken: Vec<&str> = ours
        .allocations
        .iter()
        .filter_map(|a| a.devices.as_ref()?.results.as_ref())
        .flatten()
        .map(|r| r.device.as_str())
        .collect();
    let other = instance
        .slices
        .iter()
        .filter(|s| s.spec.driver == first.driver && s.spec.pool.name == first.pool)
        .flat_map(|s| s.spec.devices.iter().flatten())
        .map(|d| d.name.clone())
        .find(|name| !taken.contains(&name.as_str()))?;
    let node = ours.node.clone();
    let allocations = ours.allocations.iter_mut().chain(
        ours.nodes
            .iter_mut()
            .filter(|n| Some(&n.node) == node.as_ref())
            .flat_map(|n| n.allocations.iter_mut()),
    );
    for allocation in allocations {
        let results = allocation.devices.as_mut().and_then(|d| d.results.as_mut());
        if let Some(r) = results.and_then(|r| r.first_mut())
            && r.device == first.device
            && r.pool == first.pool
        {
            r.device = other.clone();
        }
    }
    Some(format!("device {} swapped for {other}", first.device))
}

/// The outcome flipped from allocated to unsatisfiable (the pod's and its node's).
fn flip_outcome(ours: &mut Verdict) -> String {
    let node = ours.node.take();
    ours.outcome = VerdictKind::Unsatisfiable;
    ours.allocations.clear();
    for n in ours
        .nodes
        .iter_mut()
        .filter(|n| Some(&n.node) == node.as_ref())
    {
        n.outcome = VerdictKind::Unsatisfiable;
        n.allocations.clear();
    }
    "outcome flipped from allocated to unsatisfiable".into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::compare;
    use crate::generate::{Generator, Switches};
    use crate::ours;

    #[test]
    fn both_planted_faults_are_differences_the_comparison_reports() {
        let mut g = Generator::new(3, Switches::default());
        let mut canary = Canary::default();
        let mut caught = Vec::new();
        for _ in 0..400 {
            let instance = g.instance();
            let honest = ours::run(&instance).unwrap();
            let mut planted = honest.clone();
            if canary.plant(&instance, &mut planted).is_some() {
                let whats: Vec<String> = compare(&planted, &honest)
                    .into_iter()
                    .map(|d| d.what)
                    .collect();
                caught.push(whats);
            }
            if canary.planted.len() == 2 {
                break;
            }
        }
        assert_eq!(caught.len(), 2, "{caught:?}");
        let (swap, flip) = (&caught[0], &caught[1]);
        assert_eq!(swap.len(), 2, "{swap:?}");
        assert_eq!(swap[0], "pod allocation");
        assert!(
            swap[1].starts_with("node ") && swap[1].ends_with(" allocation"),
            "{swap:?}"
        );
        assert_eq!(flip.len(), 2, "{flip:?}");
        assert_eq!(flip[0], "pod outcome");
        assert!(
            flip[1].starts_with("node ") && flip[1].ends_with(" outcome"),
            "{flip:?}"
        );
        assert_eq!(canary.planted.len(), 2);
    }
}
