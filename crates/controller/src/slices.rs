//! The ResourceSlice cache. Slices are kept encoded (JSON, after trimming) and decoded only when
//! the device inventory is rebuilt: on a large cluster the devices are most of the controller's
//! memory, and the inventory holds a decoded copy of every device anyway. Kept decoded in a watch
//! cache too, they would be held twice (1,000 dgx-h100 nodes: about 80 MiB as objects, about
//! 20 MiB as JSON; see docs/benchmarks.md, "Controller at scale").

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::runtime::watcher::Event;

/// One slice, encoded.
pub type EncodedSlice = Arc<[u8]>;

/// The slices by name, encoded, kept as a watch delivers them (a relist replaces them whole once
/// it has completed, as a reflector store does).
#[derive(Debug, Default)]
pub struct SliceCache {
    slices: Mutex<HashMap<String, EncodedSlice>>,
    /// The slices of a relist in progress.
    relist: Mutex<Option<HashMap<String, EncodedSlice>>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn encode(slice: &ResourceSlice) -> Option<(String, EncodedSlice)> {
    let name = slice.metadata.name.clone()?;
    match serde_json::to_vec(slice) {
        Ok(bytes) => Some((name, bytes.into())),
        Err(e) => {
            tracing::warn!(slice = %name, error = %e, "cannot encode a ResourceSlice; ignoring it");
            None
        }
    }
}

impl SliceCache {
    /// Applies a watch event.
    pub fn apply(&self, event: &Event<ResourceSlice>) {
        match event {
            Event::Apply(slice) => {
                if let Some((name, bytes)) = encode(slice) {
                    lock(&self.slices).insert(name, bytes);
                }
            }
            Event::Delete(slice) => {
                if let Some(name) = slice.metadata.name.as_deref() {
                    lock(&self.slices).remove(name);
                }
            }
            Event::Init => *lock(&self.relist) = Some(HashMap::new()),
            Event::InitApply(slice) => {
                if let Some((name, bytes)) = encode(slice) {
                    lock(&self.relist)
                        .get_or_insert_with(HashMap::new)
                        .insert(name, bytes);
                }
            }
            Event::InitDone => {
                let listed = lock(&self.relist).take().unwrap_or_default();
                *lock(&self.slices) = listed;
            }
        }
    }

    /// The cached slices, encoded, in no particular order.
    pub fn encoded(&self) -> Vec<EncodedSlice> {
        lock(&self.slices).values().cloned().collect()
    }

    /// Number of cached slices.
    pub fn len(&self) -> usize {
        lock(&self.slices).len()
    }

    /// Whether no slice is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Decodes cached slices (what [`SliceCache`] encoded always decodes; anything else is logged and
/// left out).
pub fn decode(encoded: &[EncodedSlice]) -> Vec<ResourceSlice> {
    encoded
        .iter()
        .filter_map(|bytes| match serde_json::from_slice(bytes) {
            Ok(slice) => Some(slice),
            Err(e) => {
                tracing::warn!(error = %e, "a cached ResourceSlice does not decode; ignoring it");
                None
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::resource::v1::{Device, ResourcePool, ResourceSliceSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn slice(name: &str, devices: &[&str]) -> ResourceSlice {
        ResourceSlice {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: ResourceSliceSpec {
                driver: "gpu.tessera.dev".into(),
                node_name: Some("node-a".into()),
                pool: ResourcePool {
                    name: "node-a".into(),
                    generation: 1,
                    resource_slice_count: 1,
                },
                devices: Some(
                    devices
                        .iter()
                        .map(|d| Device {
                            name: (*d).into(),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            },
        }
    }

    fn cached(cache: &SliceCache) -> Vec<ResourceSlice> {
        let mut slices = decode(&cache.encoded());
        slices.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        slices
    }

    #[test]
    fn slices_round_trip_through_the_cache() {
        let cache = SliceCache::default();
        cache.apply(&Event::Init);
        cache.apply(&Event::InitApply(slice("a", &["gpu-0"])));
        assert!(cache.is_empty(), "a relist shows only once complete");
        cache.apply(&Event::InitDone);
        cache.apply(&Event::Apply(slice("b", &["gpu-1"])));
        cache.apply(&Event::Apply(slice("a", &["gpu-0", "gpu-2"])));
        assert_eq!(
            cached(&cache),
            [slice("a", &["gpu-0", "gpu-2"]), slice("b", &["gpu-1"])]
        );
        cache.apply(&Event::Delete(slice("b", &[])));
        assert_eq!(cached(&cache), [slice("a", &["gpu-0", "gpu-2"])]);
        // A relist replaces everything: slices deleted meanwhile are gone.
        cache.apply(&Event::Init);
        cache.apply(&Event::InitApply(slice("c", &["gpu-3"])));
        cache.apply(&Event::InitDone);
        assert_eq!(cached(&cache), [slice("c", &["gpu-3"])]);
    }
}
