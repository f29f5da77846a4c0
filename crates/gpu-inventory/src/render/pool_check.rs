//! Checks that span the slices of one pool, which the API server cannot make per slice but the
//! allocator relies on (upstream's resourceslice `validatePool` makes the same ones).

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{CounterSet, ResourceSlice};

use super::check::{Violation, Violations};

/// Checks what only the whole pool shows: one pool name and generation, `resourceSliceCount`
/// equal to the number of slices, device names unique across slices, counter sets defined once,
/// and every consumed counter defined in the pool.
pub fn check_pool(slices: &[ResourceSlice]) -> Result<(), Vec<Violation>> {
    let mut v = Violations::default();
    let Some(first) = slices.first() else {
        return Ok(());
    };
    let mut sets: BTreeMap<&str, &CounterSet> = BTreeMap::new();
    let mut devices: BTreeMap<&str, usize> = BTreeMap::new();
    for (s, slice) in slices.iter().enumerate() {
        let pool = &slice.spec.pool;
        if pool.name != first.spec.pool.name || pool.generation != first.spec.pool.generation {
            v.add(
                format!("slices[{s}].spec.pool"),
                "all slices of a pool need the same pool name and generation",
            );
        }
        if usize::try_from(pool.resource_slice_count).ok() != Some(slices.len()) {
            v.add(
                format!("slices[{s}].spec.pool.resourceSliceCount"),
                format!(
                    "is {}, but the pool has {} slices",
                    pool.resource_slice_count,
                    slices.len()
                ),
            );
        }
        for set in slice.spec.shared_counters.iter().flatten() {
            if sets.insert(&set.name, set).is_some() {
                v.add(
                    format!("slices[{s}].spec.sharedCounters"),
                    format!("counter set `{}` is defined twice in the pool", set.name),
                );
            }
        }
        for device in slice.spec.devices.iter().flatten() {
            if let Some(other) = devices.insert(&device.name, s) {
                v.add(
                    format!("slices[{s}].spec.devices"),
                    format!("device `{}` is also in slices[{other}]", device.name),
                );
            }
        }
    }
    for (s, slice) in slices.iter().enumerate() {
        for device in slice.spec.devices.iter().flatten() {
            for consumption in device.consumes_counters.iter().flatten() {
                let set = sets.get(consumption.counter_set.as_str());
                let missing: Vec<&String> = consumption
                    .counters
                    .keys()
                    .filter(|c| set.is_none_or(|set| !set.counters.contains_key(*c)))
                    .collect();
                if !missing.is_empty() {
                    v.add(
                        format!("slices[{s}].spec.devices[{}]", device.name),
                        format!(
                            "consumes counters {missing:?} of set `{}`, which the pool does not define",
                            consumption.counter_set
                        ),
                    );
                }
            }
        }
    }
    v.finish()
}
