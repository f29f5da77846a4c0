//! What decides whether a slot may take a candidate before anything is taken: the class's and the
//! request's selectors, per-device node selection, and the capacity request's check right after
//! them (`isSelectable` and the start of `CmpRequestOverCapacity` upstream). These are the checks
//! of a pair that can fail the allocation; they read nothing the search changes, so the search
//! and the checks made before searching a node (module `skip`) ask the same questions.

use crate::capacity::{self, CapacityRefusal};
use crate::cluster::Cluster;
use crate::device::DeviceEntry;
use crate::error::AllocateError;
use crate::pools::NodePools;
use crate::quantity::Amount;
use crate::request::Plan;
use crate::selection::Verdict;

/// The (slot, candidate) pairs of a plan on one node.
#[derive(Clone, Copy)]
pub(crate) struct PairCheck<'a> {
    pub inv: &'a Cluster,
    pub np: &'a NodePools,
    pub plan: &'a Plan<'a>,
}

impl<'a> PairCheck<'a> {
    fn device(&self, pos: usize) -> &'a DeviceEntry {
        &self.inv.devices[self.np.candidates[pos]]
    }

    /// Whether the slot's class and request selectors select the candidate and, for per-device
    /// node selection, the device is available on the node; a selector that fails is an error.
    pub fn verdict(&self, slot: usize, pos: usize) -> Result<bool, AllocateError> {
        let s = &self.plan.slots[slot];
        let index = self.np.candidates[pos];
        let class = &self.inv.classes[&s.class];
        let id = &self.inv.devices[index].id;
        match class.verdict(&self.inv.selectors, &self.inv.devices, index) {
            Verdict::Match => {}
            Verdict::NoMatch(_) => return Ok(false),
            Verdict::Failed {
                selector,
                message,
                compile,
            } => {
                return Err(AllocateError::selector(
                    format!("class {}", class.name()),
                    selector,
                    id,
                    message,
                    compile,
                ));
            }
        }
        match self
            .inv
            .selectors
            .evaluate(&s.selectors, &self.inv.devices, index)
        {
            Verdict::Match => {}
            Verdict::NoMatch(_) => return Ok(false),
            Verdict::Failed {
                selector,
                message,
                compile,
            } => {
                return Err(AllocateError::selector(
                    format!(
                        "claim {}, request {}",
                        self.plan.claims[s.claim].name, s.full_name
                    ),
                    selector,
                    id,
                    message,
                    compile,
                ));
            }
        }
        Ok(self.np.candidate_on_node[pos])
    }

    /// [`PairCheck::verdict`], then, for a selected device, the capacity request: upstream checks
    /// it right after the selectors, and a request the device's range arithmetic cannot represent
    /// aborts the allocation there.
    pub fn selectable(&self, slot: usize, pos: usize) -> Result<bool, AllocateError> {
        let selected = self.verdict(slot, pos)?;
        match selected.then(|| self.capacity_fatal(slot, pos)).flatten() {
            Some(e) => Err(e),
            None => Ok(selected),
        }
    }

    /// The error a capacity request raises on a device whatever is consumed already (see
    /// [`CapacityRefusal::Fatal`]).
    fn capacity_fatal(&self, slot: usize, pos: usize) -> Option<AllocateError> {
        let s = &self.plan.slots[slot];
        let device = self.device(pos);
        match capacity::fits(&device.parsed().capacities, &s.capacity, &|_| Amount::ZERO) {
            Err(CapacityRefusal::Fatal { capacity, why }) => {
                Some(AllocateError::InvalidCapacityRequest {
                    claim: self.plan.claims[s.claim].name.clone(),
                    request: s.full_name.clone(),
                    capacity,
                    message: format!("checking capacity for device {}: {why}", device.id),
                })
            }
            _ => None,
        }
    }
}
