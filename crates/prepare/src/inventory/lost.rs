//! GPUs a rescan finds lost ([`GpuInventory::lost_gpus`]: NVML answers `NVML_ERROR_GPU_IS_LOST`).
//! Pure.
//!
//! - A lost GPU the previous inventory knew stays in the published inventory with its last known
//!   facts, and gets the `gpu.tessera.dev/unreachable` finding (NoExecute, whole GPU, so its MIG
//!   devices too): it is tainted on the slices and `UNHEALTHY` on the kubelet health stream.
//! - A lost GPU never seen before has no facts to publish: it is left out, logged once.
//! - When the GPU answers again, the next rescan reads it in full and the finding goes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::SystemTime;

use tessera_gpu_inventory::GpuInventory;

/// What the node inventory remembers about lost GPUs across rescans.
#[derive(Debug, Default)]
pub struct LostGpus {
    /// Lost GPUs published with their last known facts: UUID → first rescan that found it lost.
    kept: BTreeMap<String, SystemTime>,
    /// Lost GPUs never seen before, already logged.
    unknown: BTreeSet<String>,
}

impl LostGpus {
    /// The inventory to publish: `read` plus the last known facts (from `previous`, the
    /// inventory published before) of every GPU `read` reports lost. `now` dates new losses.
    pub fn merge(
        &mut self,
        mut read: GpuInventory,
        previous: Option<&GpuInventory>,
        now: SystemTime,
    ) -> GpuInventory {
        let lost: BTreeSet<&str> = read.lost_gpus.iter().map(String::as_str).collect();
        self.kept.retain(|uuid, _| {
            let still_lost = lost.contains(uuid.as_str());
            if !still_lost {
                tracing::info!(gpu = %uuid, "the lost GPU answers again; its unreachable taint goes");
            }
            still_lost
        });
        self.unknown.retain(|uuid| lost.contains(uuid.as_str()));
        let mut kept_facts = Vec::new();
        for uuid in &read.lost_gpus {
            match previous.and_then(|p| p.gpu_by_uuid(uuid)) {
                Some(gpu) => {
                    if !self.kept.contains_key(uuid) {
                        tracing::warn!(
                            gpu = %uuid,
                            "the GPU is lost (NVML_ERROR_GPU_IS_LOST); it stays published with its \
                             last known facts, tainted gpu.tessera.dev/unreachable:NoExecute"
                        );
                        self.kept.insert(uuid.clone(), now);
                    }
                    kept_facts.push(gpu.clone());
                }
                None => {
                    if self.unknown.insert(uuid.clone()) {
                        tracing::warn!(
                            gpu = %uuid,
                            "a GPU never seen before is lost (NVML_ERROR_GPU_IS_LOST); its facts \
                             cannot be read, so it is not published"
                        );
                    }
                }
            }
        }
        read.gpus.extend(kept_facts);
        read.normalize();
        read
    }

    /// UUIDs of the lost GPUs published with their last known facts.
    pub fn kept(&self) -> impl Iterator<Item = &str> {
        self.kept.keys().map(String::as_str)
    }

    /// The lost GPUs published with their last known facts, each with the rescan that first
    /// found it lost (what the node's health policy taints as unreachable, since then).
    pub fn kept_since(&self) -> impl Iterator<Item = (&str, SystemTime)> {
        self.kept
            .iter()
            .map(|(uuid, since)| (uuid.as_str(), *since))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tessera_gpu_inventory::{DeviceSource, MockSource};

    use super::*;

    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + seconds)
    }

    /// `full` as NVML reads it with the GPU `uuid` lost.
    fn read_without(full: &GpuInventory, uuid: &str) -> GpuInventory {
        let mut read = full.clone();
        read.gpus.retain(|g| g.uuid != uuid);
        read.lost_gpus = vec![uuid.to_owned()];
        read
    }

    #[test]
    fn a_known_lost_gpu_is_kept_tainted_until_it_answers_again() {
        let full = MockSource::new("hgx-a100-mig")
            .unwrap()
            .inventory()
            .unwrap();
        let gpu = full.gpus.iter().find(|g| g.mig_enabled()).unwrap();
        let mut lost = LostGpus::default();

        let merged = lost.merge(read_without(&full, &gpu.uuid), Some(&full), at(1));
        assert_eq!(
            merged.gpus, full.gpus,
            "published with its last known facts"
        );
        assert_eq!(merged.lost_gpus, [gpu.uuid.as_str()]);
        // A second rescan still finding it lost keeps the first date.
        let merged = lost.merge(read_without(&full, &gpu.uuid), Some(&merged), at(5));
        assert_eq!(merged.gpus, full.gpus);
        assert_eq!(lost.kept().collect::<Vec<_>>(), [gpu.uuid.as_str()]);

        assert_eq!(
            lost.kept_since().collect::<Vec<_>>(),
            [(gpu.uuid.as_str(), at(1))],
            "dated by the rescan that first found it lost"
        );

        let recovered = lost.merge(full.clone(), Some(&merged), at(9));
        assert_eq!(recovered, full);
        assert_eq!(lost.kept().count(), 0);
        assert_eq!(
            lost.kept_since().count(),
            0,
            "the taint goes when the GPU answers"
        );
    }

    #[test]
    fn a_lost_gpu_never_seen_is_not_published() {
        let full = MockSource::new("pcie-l40s").unwrap().inventory().unwrap();
        let uuid = full.gpus[1].uuid.clone();
        let mut lost = LostGpus::default();
        let merged = lost.merge(read_without(&full, &uuid), None, at(0));
        assert_eq!(merged.gpus.len(), full.gpus.len() - 1);
        assert!(merged.gpu_by_uuid(&uuid).is_none());
        assert_eq!(lost.kept().count(), 0);
        assert_eq!(lost.kept_since().count(), 0);
    }
}
