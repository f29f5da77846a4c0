//! What is already allocated: devices in exclusive use, and devices shared through consumable
//! capacity (with the capacity their allocations consume). Built from allocated ResourceClaims and
//! kept current by adding and removing allocation results.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceRequestAllocationResult, ResourceClaim,
};

use crate::device::{BuildPrehashed, DeviceId};
use crate::quantity::{Amount, InvalidQuantity};

/// A consumed-capacity value in an allocation result that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("allocation of device {device}{claim}: consumedCapacity {capacity}: {source}")]
pub struct StateError {
    /// The claim (`namespace/name`, or empty when not known).
    pub claim: String,
    /// The device of the result.
    pub device: String,
    /// The capacity name.
    pub capacity: String,
    /// What is wrong with the value.
    pub source: InvalidQuantity,
}

/// Allocations of one device shared through `allowMultipleAllocations`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SharedUse {
    /// Share ids of the allocations.
    pub share_ids: HashSet<String>,
    /// Capacity they consume, summed per capacity name.
    pub consumed: BTreeMap<String, Amount>,
}

/// Devices already allocated, as the allocator must respect them.
///
/// Results with `adminAccess: true` do not make a device unavailable (upstream semantics); results
/// with a `shareID` are shared allocations of a multi-allocatable device.
///
/// Every change of a device also gives its pool (by name) a new *stamp*, unique in the process: two
/// states — one cloned from the other, each changed since — show the same stamp for a pool only
/// when neither changed a device of that pool after the clone, so the pool's devices are in the
/// same use in both. The results the allocator stores per node (module `verdicts`) are checked
/// against the stamps first, and device by device only when a stamp moved. Equality ignores the
/// stamps.
#[derive(Clone, Debug, Default)]
pub struct AllocatedState {
    dedicated: HashSet<DeviceId, BuildPrehashed>,
    shared: HashMap<DeviceId, SharedUse, BuildPrehashed>,
    /// Per pool name, the stamp of its last change; a pool never changed has none (stamp 0).
    stamps: HashMap<Arc<str>, u64>,
}

impl PartialEq for AllocatedState {
    fn eq(&self, other: &Self) -> bool {
        self.dedicated == other.dedicated && self.shared == other.shared
    }
}

impl Eq for AllocatedState {}

/// The next stamp (never 0).
fn next_stamp() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl AllocatedState {
    /// Nothing allocated.
    pub fn new() -> AllocatedState {
        AllocatedState::default()
    }

    /// The devices used by the allocated claims among `claims` (claims without
    /// `status.allocation` are ignored).
    pub fn from_claims<'a>(
        claims: impl IntoIterator<Item = &'a ResourceClaim>,
    ) -> Result<AllocatedState, StateError> {
        let mut state = AllocatedState::new();
        for claim in claims {
            if let Some(allocation) = claim.status.as_ref().and_then(|s| s.allocation.as_ref()) {
                let name = format!(
                    " for claim {}/{}",
                    claim.metadata.namespace.as_deref().unwrap_or_default(),
                    claim.metadata.name.as_deref().unwrap_or_default()
                );
                state
                    .add_allocation(allocation)
                    .map_err(|e| StateError { claim: name, ..e })?;
            }
        }
        Ok(state)
    }

    /// Gives the pool of `id` a new stamp (a device of it changed).
    fn touch(&mut self, id: &DeviceId) {
        self.stamps.insert(id.pool_name().clone(), next_stamp());
    }

    /// The stamp of the pool's last change (0: none of its devices was ever changed in this state
    /// or the ones it was cloned from).
    pub(crate) fn pool_stamp(&self, pool: &str) -> u64 {
        self.stamps.get(pool).copied().unwrap_or(0)
    }

    /// Marks the devices of an allocation as used.
    pub fn add_allocation(&mut self, allocation: &AllocationResult) -> Result<(), StateError> {
        for result in allocation_results(allocation) {
            let id = DeviceId::new(&result.driver, &result.pool, &result.device);
            if result.admin_access == Some(true) {
                continue;
            }
            self.touch(&id);
            match &result.share_id {
                Some(share) => {
                    let consumed = parse_consumed(result, &id)?;
                    let entry = self.shared.entry(id).or_default();
                    entry.share_ids.insert(share.clone());
                    for (name, amount) in consumed {
                        let slot = entry.consumed.entry(name).or_default();
                        *slot = slot.saturating_add(amount);
                    }
                }
                None => {
                    self.dedicated.insert(id);
                }
            }
        }
        Ok(())
    }

    /// Releases the devices of an allocation (the inverse of [`Self::add_allocation`]).
    pub fn remove_allocation(&mut self, allocation: &AllocationResult) -> Result<(), StateError> {
        for result in allocation_results(allocation) {
            let id = DeviceId::new(&result.driver, &result.pool, &result.device);
            if result.admin_access == Some(true) {
                continue;
            }
            self.touch(&id);
            match &result.share_id {
                Some(share) => {
                    let consumed = parse_consumed(result, &id)?;
                    if let Some(entry) = self.shared.get_mut(&id) {
                        entry.share_ids.remove(share);
                        for (name, amount) in consumed {
                            if let Some(slot) = entry.consumed.get_mut(&name) {
                                *slot = slot.saturating_sub(amount);
                            }
                        }
                        if entry.share_ids.is_empty() {
                            self.shared.remove(&id);
                        }
                    }
                }
                None => {
                    self.dedicated.remove(&id);
                }
            }
        }
        Ok(())
    }

    /// Marks one device as allocated exclusively.
    pub fn insert_device(&mut self, id: DeviceId) {
        self.touch(&id);
        self.dedicated.insert(id);
    }

    /// Releases one device allocated exclusively (the inverse of [`Self::insert_device`]).
    pub fn remove_device(&mut self, id: &DeviceId) {
        self.touch(id);
        self.dedicated.remove(id);
    }

    /// Records one shared allocation of a device consuming `consumed`.
    pub fn insert_shared(
        &mut self,
        id: DeviceId,
        share_id: &str,
        consumed: impl IntoIterator<Item = (String, Amount)>,
    ) {
        self.touch(&id);
        let entry = self.shared.entry(id).or_default();
        entry.share_ids.insert(share_id.to_owned());
        for (name, amount) in consumed {
            let slot = entry.consumed.entry(name).or_default();
            *slot = slot.saturating_add(amount);
        }
    }

    /// Records capacity consumed on a device by shared allocations whose share ids are not
    /// known (upstream's `AggregatedCapacity` without `AllocatedSharedDeviceIDs`).
    pub fn insert_consumed(
        &mut self,
        id: DeviceId,
        consumed: impl IntoIterator<Item = (String, Amount)>,
    ) {
        self.touch(&id);
        let entry = self.shared.entry(id).or_default();
        for (name, amount) in consumed {
            let slot = entry.consumed.entry(name).or_default();
            *slot = slot.saturating_add(amount);
        }
    }

    /// Replaces everything recorded for one device: allocated exclusively or not, and its shared
    /// allocations (`None`: none). For callers that keep a state current device by device rather
    /// than allocation by allocation.
    pub fn set_device(&mut self, id: DeviceId, dedicated: bool, shared: Option<SharedUse>) {
        self.touch(&id);
        if dedicated {
            self.dedicated.insert(id.clone());
        } else {
            self.dedicated.remove(&id);
        }
        match shared {
            Some(shared) => {
                self.shared.insert(id, shared);
            }
            None => {
                self.shared.remove(&id);
            }
        }
    }

    /// Whether a device is allocated exclusively.
    pub fn is_dedicated(&self, id: &DeviceId) -> bool {
        self.dedicated.contains(id)
    }

    /// The shared allocations of a device, if any.
    pub fn shared(&self, id: &DeviceId) -> Option<&SharedUse> {
        self.shared.get(id)
    }

    /// Whether a device is allocated at all (exclusively or shared), which is what makes it
    /// consume its counters.
    pub fn is_in_use(&self, id: &DeviceId) -> bool {
        self.dedicated.contains(id) || self.shared.contains_key(id)
    }

    /// Number of exclusively allocated devices.
    pub fn dedicated_count(&self) -> usize {
        self.dedicated.len()
    }
}

fn allocation_results(allocation: &AllocationResult) -> &[DeviceRequestAllocationResult] {
    allocation
        .devices
        .as_ref()
        .and_then(|d| d.results.as_deref())
        .unwrap_or_default()
}

fn parse_consumed(
    result: &DeviceRequestAllocationResult,
    id: &DeviceId,
) -> Result<Vec<(String, Amount)>, StateError> {
    result
        .consumed_capacity
        .iter()
        .flatten()
        .map(|(name, q)| {
            Amount::from_quantity(q)
                .map(|a| (name.clone(), a))
                .map_err(|source| StateError {
                    claim: String::new(),
                    device: id.to_string(),
                    capacity: name.clone(),
                    source,
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pools_stamp_moves_with_every_change_of_its_devices_and_only_then() {
        let mut state = AllocatedState::new();
        assert_eq!(state.pool_stamp("node-a"), 0, "never changed");
        state.insert_device(DeviceId::new("d", "node-a", "gpu-0"));
        let a = state.pool_stamp("node-a");
        assert_ne!(a, 0);
        assert_eq!(state.pool_stamp("node-b"), 0, "another pool is not touched");
        // A clone keeps the stamps; a change in either moves that pool's stamp in that one only.
        let mut copy = state.clone();
        assert_eq!(copy.pool_stamp("node-a"), a);
        copy.set_device(DeviceId::new("d", "node-a", "gpu-0"), false, None);
        assert_ne!(copy.pool_stamp("node-a"), a);
        assert_eq!(state.pool_stamp("node-a"), a);
        state.insert_shared(DeviceId::new("d", "node-b", "gpu-1"), "s1", []);
        let b = state.pool_stamp("node-b");
        assert_ne!(b, 0);
        assert_ne!(b, copy.pool_stamp("node-b"));
        state.insert_consumed(DeviceId::new("d", "node-b", "gpu-1"), []);
        assert_ne!(state.pool_stamp("node-b"), b);
        // Equality is about the devices, not the stamps.
        let mut again = AllocatedState::new();
        again.insert_device(DeviceId::new("d", "node-a", "gpu-0"));
        let mut same = AllocatedState::new();
        same.insert_device(DeviceId::new("d", "node-a", "gpu-0"));
        assert_ne!(again.pool_stamp("node-a"), same.pool_stamp("node-a"));
        assert_eq!(again, same);
    }
}
