//! The pool's shape and generation. Pure.
//!
//! Consumers use only the slices of a pool's highest generation, so the generation must grow
//! whenever the slices change in a way that would make an old and a new slice disagree about the
//! pool: a device or counter set appearing, disappearing or moving to another slice, or the
//! slice count changing. Attribute, capacity and taint changes are written in place.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::ResourceSlice;

/// Which slice holds which devices and counter sets: what the generation tracks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolLayout {
    slices: BTreeMap<String, SliceContents>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct SliceContents {
    devices: Vec<String>,
    counter_sets: Vec<String>,
    slice_count: i64,
}

impl PoolLayout {
    /// The layout of `slices`.
    pub fn of<'a>(slices: impl IntoIterator<Item = &'a ResourceSlice>) -> Self {
        let slices = slices
            .into_iter()
            .map(|slice| {
                let spec = &slice.spec;
                let contents = SliceContents {
                    devices: spec
                        .devices
                        .iter()
                        .flatten()
                        .map(|d| d.name.clone())
                        .collect(),
                    counter_sets: spec
                        .shared_counters
                        .iter()
                        .flatten()
                        .map(|c| c.name.clone())
                        .collect(),
                    slice_count: spec.pool.resource_slice_count,
                };
                (slice.metadata.name.clone().unwrap_or_default(), contents)
            })
            .collect();
        Self { slices }
    }

    /// Names of the devices, slice by slice.
    pub fn device_names(&self) -> impl Iterator<Item = &str> {
        self.slices
            .values()
            .flat_map(|s| s.devices.iter().map(String::as_str))
    }

    /// How many devices the pool has.
    pub fn device_count(&self) -> usize {
        self.slices.values().map(|s| s.devices.len()).sum()
    }

    /// Slice names.
    pub fn slice_names(&self) -> impl Iterator<Item = &str> {
        self.slices.keys().map(String::as_str)
    }
}

/// What the API server holds of the pool: its highest generation and the layout of the slices
/// at that generation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishedPool {
    pub generation: i64,
    pub layout: PoolLayout,
}

impl PublishedPool {
    /// The pool as `slices` (this node's slices of this driver) show it; `None` without slices.
    pub fn from_slices(slices: &[ResourceSlice]) -> Option<Self> {
        let generation = slices.iter().map(|s| s.spec.pool.generation).max()?;
        Some(Self {
            generation,
            layout: PoolLayout::of(
                slices
                    .iter()
                    .filter(|s| s.spec.pool.generation == generation),
            ),
        })
    }
}

/// The generation to publish `desired` with, given what the API server holds (`listed`) and
/// the highest generation this process has written (`written`): unchanged when the API already
/// holds this layout, else one more than anything seen — never lower, also after the slices
/// were deleted (the kubelet wipes them when it restarts).
pub fn next_generation(
    listed: Option<&PublishedPool>,
    written: Option<i64>,
    desired: &PoolLayout,
) -> i64 {
    let seen = listed
        .map(|pool| pool.generation)
        .into_iter()
        .chain(written)
        .max();
    match (listed, seen) {
        (Some(pool), Some(seen)) if pool.layout == *desired && pool.generation == seen => seen,
        (_, Some(seen)) => seen.saturating_add(1),
        (_, None) => 0,
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::resource::v1::{Device, ResourcePool, ResourceSliceSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn slice(name: &str, generation: i64, devices: &[&str]) -> ResourceSlice {
        ResourceSlice {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: ResourceSliceSpec {
                pool: ResourcePool {
                    name: "node-a".into(),
                    generation,
                    resource_slice_count: 1,
                },
                devices: Some(
                    devices
                        .iter()
                        .map(|d| Device {
                            name: (*d).into(),
                            ..Device::default()
                        })
                        .collect(),
                ),
                ..ResourceSliceSpec::default()
            },
        }
    }

    #[test]
    fn generation_moves_only_with_the_layout() {
        let current = vec![slice("s-0", 4, &["gpu-0", "gpu-1"])];
        let listed = PublishedPool::from_slices(&current);
        let same = PoolLayout::of(&current);
        assert_eq!(
            next_generation(listed.as_ref(), None, &same),
            4,
            "restart, same devices"
        );
        assert_eq!(next_generation(listed.as_ref(), Some(4), &same), 4);

        let fewer = PoolLayout::of(&[slice("s-0", 0, &["gpu-0"])]);
        assert_eq!(next_generation(listed.as_ref(), Some(4), &fewer), 5);
        assert_eq!(next_generation(None, None, &fewer), 0, "a new pool");
        assert_eq!(
            next_generation(None, Some(5), &fewer),
            6,
            "wiped slices do not reset it"
        );
        assert_eq!(fewer.device_count(), 1);
    }

    #[test]
    fn the_highest_generation_defines_the_published_pool() {
        let slices = vec![slice("s-0", 2, &["gpu-0"]), slice("s-1", 3, &["gpu-1"])];
        let pool = PublishedPool::from_slices(&slices).unwrap();
        assert_eq!(pool.generation, 3);
        assert_eq!(pool.layout.device_names().collect::<Vec<_>>(), ["gpu-1"]);
        assert!(PublishedPool::from_slices(&[]).is_none());
        let listed = Some(pool);
        let layout = PoolLayout::of(&slices[1..]);
        assert_eq!(
            next_generation(listed.as_ref(), Some(7), &layout),
            8,
            "written beats listed"
        );
    }
}
