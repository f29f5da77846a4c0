//! What is already allocated: devices in exclusive use, and devices shared through consumable
//! capacity (with the capacity their allocations consume). Built from allocated ResourceClaims and
//! kept current by adding and removing allocation results.

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceRequestAllocationResult, ResourceClaim,
};

use crate::device::{BuildPrehashed, DeviceId};
use crate::quantity::{Amount, QuantityError};

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
    pub source: QuantityError,
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
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllocatedState {
    dedicated: HashSet<DeviceId, BuildPrehashed>,
    shared: HashMap<DeviceId, SharedUse, BuildPrehashed>,
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

    /// Marks the devices of an allocation as used.
    pub fn add_allocation(&mut self, allocation: &AllocationResult) -> Result<(), StateError> {
        for result in allocation_results(allocation) {
            let id = DeviceId::new(&result.driver, &result.pool, &result.device);
            if result.admin_access == Some(true) {
                continue;
            }
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
        self.dedicated.insert(id);
    }

    /// Records one shared allocation of a device consuming `consumed`.
    pub fn insert_shared(
        &mut self,
        id: DeviceId,
        share_id: &str,
        consumed: impl IntoIterator<Item = (String, Amount)>,
    ) {
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
