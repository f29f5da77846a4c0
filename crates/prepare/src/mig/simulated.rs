//! A [`MigControl`] for nodes without GPUs: MIG devices modelled from the inventory's profiles
//! and placements, kept in memory or in a file (so that, like real MIG instances, they outlive
//! the plugin process — crash tests read the file to find leaked instances).

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use tessera_gpu_inventory::node_identity::name_based_uuid;
use tessera_gpu_inventory::{GpuInventory, MigInstance, MigProfile};

use super::{MigControl, MigError};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SimulatedGpu {
    enabled: bool,
    profiles: Vec<MigProfile>,
    instances: Vec<MigInstance>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct State {
    /// Makes every created UUID unique, across restarts too.
    next_serial: u64,
    gpus: BTreeMap<String, SimulatedGpu>,
}

/// Simulated MIG devices.
#[derive(Debug)]
pub struct SimulatedMig {
    state: Mutex<State>,
    file: Option<PathBuf>,
}

fn initial_state(inventory: &GpuInventory) -> State {
    let gpus = inventory
        .gpus
        .iter()
        .filter_map(|gpu| {
            let mig = gpu.mig.as_ref()?;
            Some((
                gpu.uuid.clone(),
                SimulatedGpu {
                    enabled: mig.enabled,
                    profiles: mig.profiles.clone(),
                    instances: mig.instances.clone(),
                },
            ))
        })
        .collect();
    State {
        next_serial: 1,
        gpus,
    }
}

fn failure(message: String) -> Box<dyn std::error::Error + Send + Sync> {
    message.into()
}

impl SimulatedMig {
    /// In memory, starting with the inventory's MIG instances.
    pub fn in_memory(inventory: &GpuInventory) -> Self {
        Self {
            state: Mutex::new(initial_state(inventory)),
            file: None,
        }
    }

    /// Kept in `file`: loaded from it if it exists (and parses), otherwise started from the
    /// inventory's MIG instances.
    pub fn persistent(inventory: &GpuInventory, file: impl Into<PathBuf>) -> Self {
        let file = file.into();
        let state = fs::read(&file)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_else(|| initial_state(inventory));
        Self {
            state: Mutex::new(state),
            file: Some(file),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn persist(&self, state: &State) -> Result<(), String> {
        let Some(file) = &self.file else {
            return Ok(());
        };
        if let Some(dir) = file.parent() {
            fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let temp = file.with_extension(format!("tmp-{}", std::process::id()));
        let bytes = serde_json::to_vec_pretty(state).map_err(|e| e.to_string())?;
        fs::write(&temp, bytes).map_err(|e| format!("{}: {e}", temp.display()))?;
        fs::rename(&temp, file).map_err(|e| format!("{}: {e}", file.display()))
    }

    /// Every instance on every GPU, by GPU UUID.
    pub fn all_instances(&self) -> BTreeMap<String, Vec<MigInstance>> {
        self.state()
            .gpus
            .iter()
            .map(|(uuid, gpu)| (uuid.clone(), gpu.instances.clone()))
            .collect()
    }
}

fn overlaps(gpu: &SimulatedGpu, profile: &MigProfile, start: u32) -> bool {
    let wanted = profile.memory_slice_range(start);
    gpu.instances.iter().any(|existing| {
        gpu.profiles
            .iter()
            .find(|p| p.name == existing.profile)
            .map(|p| p.memory_slice_range(existing.placement_start))
            .is_some_and(|taken| taken.start < wanted.end && wanted.start < taken.end)
    })
}

impl MigControl for SimulatedMig {
    fn mig_devices(&self, gpu_uuid: &str) -> Result<Vec<MigInstance>, MigError> {
        let state = self.state();
        let gpu = state.gpus.get(gpu_uuid).ok_or_else(|| MigError::List {
            gpu: gpu_uuid.to_owned(),
            source: failure("no such MIG-capable GPU".into()),
        })?;
        Ok(gpu.instances.clone())
    }

    fn create(
        &self,
        gpu_uuid: &str,
        profile_name: &str,
        placement_start: u32,
    ) -> Result<MigInstance, MigError> {
        let failed = |message: String| MigError::Create {
            gpu: gpu_uuid.to_owned(),
            profile: profile_name.to_owned(),
            start: placement_start,
            source: failure(message),
        };
        let mut state = self.state();
        let serial = state.next_serial;
        let gpu = state
            .gpus
            .get_mut(gpu_uuid)
            .ok_or_else(|| failed("no such MIG-capable GPU".into()))?;
        if !gpu.enabled {
            return Err(failed("MIG mode is disabled".into()));
        }
        let profile = gpu
            .profiles
            .iter()
            .find(|p| p.name == profile_name)
            .ok_or_else(|| failed("no such profile".into()))?
            .clone();
        if !profile.placements.contains(&placement_start) {
            return Err(failed("not a placement of the profile".into()));
        }
        if overlaps(gpu, &profile, placement_start) {
            return Err(failed(
                "the placement overlaps an existing GPU instance".into(),
            ));
        }
        let gpu_instance_id = (1..)
            .find(|id| gpu.instances.iter().all(|i| i.gpu_instance_id != *id))
            .unwrap_or(1);
        let instance = MigInstance {
            // Derived from the parent GPU's UUID (itself per node with the mock backend), so
            // two nodes never create MIG devices with the same UUID.
            uuid: name_based_uuid("MIG", &[gpu_uuid, &serial.to_string()]),
            profile: profile.name.clone(),
            gpu_instance_id,
            compute_instance_id: 0,
            compute_instance_profile_id: profile.compute_slices.saturating_sub(1),
            placement_start,
            memory_bytes: profile.memory_bytes,
            multiprocessors: profile.multiprocessors,
            engines: profile.engines,
        };
        gpu.instances.push(instance.clone());
        state.next_serial += 1;
        self.persist(&state).map_err(failed)?;
        Ok(instance)
    }

    fn destroy(&self, gpu_uuid: &str, instance: &MigInstance) -> Result<(), MigError> {
        let failed = |message: String| MigError::Destroy {
            gpu: gpu_uuid.to_owned(),
            uuid: instance.uuid.clone(),
            gpu_instance_id: instance.gpu_instance_id,
            compute_instance_id: instance.compute_instance_id,
            source: failure(message),
        };
        let mut state = self.state();
        let gpu = state
            .gpus
            .get_mut(gpu_uuid)
            .ok_or_else(|| failed("no such MIG-capable GPU".into()))?;
        let before = gpu.instances.len();
        gpu.instances.retain(|i| {
            (i.gpu_instance_id, i.compute_instance_id)
                != (instance.gpu_instance_id, instance.compute_instance_id)
        });
        if gpu.instances.len() == before {
            return Err(failed("no such MIG device".into()));
        }
        self.persist(&state).map_err(failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::{Ensured, ensure_instance, release_instance};
    use tessera_gpu_inventory::{DeviceSource, MockSource};

    fn inventory() -> GpuInventory {
        MockSource::new("hgx-a100-mig")
            .unwrap()
            .inventory()
            .unwrap()
    }

    #[test]
    fn creates_refuses_overlaps_and_destroys() {
        let inventory = inventory();
        // Minor 1 (index 3): slice 3 is free.
        let gpu = inventory.gpu_by_minor(1).unwrap().uuid.clone();
        let mig = SimulatedMig::in_memory(&inventory);
        let before = mig.mig_devices(&gpu).unwrap();
        let created = mig.create(&gpu, "1g.10gb", 3).unwrap();
        assert_eq!(mig.mig_devices(&gpu).unwrap().len(), before.len() + 1);
        let err = mig.create(&gpu, "1g.10gb", 3).unwrap_err().to_string();
        assert!(err.contains("overlaps"), "{err}");
        assert!(
            mig.create(&gpu, "2g.20gb", 2).is_err(),
            "covers slice 2 and 3"
        );
        mig.destroy(&gpu, &created).unwrap();
        assert_eq!(mig.mig_devices(&gpu).unwrap(), before);
        assert!(mig.destroy(&gpu, &created).is_err());
        let disabled = inventory.gpu_by_minor(6).unwrap().uuid.clone();
        let err = mig.create(&disabled, "1g.10gb", 0).unwrap_err().to_string();
        assert!(err.contains("MIG mode is disabled"), "{err}");
    }

    #[test]
    fn created_uuids_differ_between_nodes_and_between_creations() {
        let created_on = |node: &str| {
            let inventory = MockSource::new("hgx-a100-mig")
                .unwrap()
                .for_node(node)
                .inventory()
                .unwrap();
            let gpu = inventory.gpu_by_minor(1).unwrap().uuid.clone();
            let mig = SimulatedMig::in_memory(&inventory);
            let first = mig.create(&gpu, "1g.10gb", 3).unwrap();
            mig.destroy(&gpu, &first).unwrap();
            let second = mig.create(&gpu, "1g.10gb", 3).unwrap();
            (first.uuid, second.uuid)
        };
        let (a1, a2) = created_on("node-a");
        let (b1, b2) = created_on("node-b");
        assert!(
            a1.starts_with("MIG-") && a1.len() == "MIG-".len() + 36,
            "{a1}"
        );
        assert_ne!(a1, a2, "a re-created instance is a new device");
        assert!(
            [&a1, &a2].iter().all(|u| *u != &b1 && *u != &b2),
            "{a1} {a2} {b1} {b2}"
        );
    }

    #[test]
    fn ensure_and_release_are_idempotent_and_survive_restarts() {
        let inventory = inventory();
        let gpu = inventory.gpu_by_minor(1).unwrap().uuid.clone();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mig.json");
        let mig = SimulatedMig::persistent(&inventory, &file);
        let first = ensure_instance(&mig, &gpu, "1g.10gb", 3).unwrap();
        assert!(matches!(first, Ensured::Created(_)));
        // Another process sees the instance and adopts it rather than creating a second.
        let restarted = SimulatedMig::persistent(&inventory, &file);
        let again = ensure_instance(&restarted, &gpu, "1g.10gb", 3).unwrap();
        assert_eq!(again, Ensured::Existing(first.record().clone()));

        // A record from another boot (a UUID that no longer exists) releases nothing...
        let stale = crate::checkpoint::MigInstanceRecord {
            uuid: "MIG-gone".into(),
            ..first.record().clone()
        };
        assert!(!release_instance(&restarted, &gpu, "1g.10gb", 3, Some(&stale)).unwrap());
        // ...the recorded one is released, once.
        assert!(release_instance(&restarted, &gpu, "1g.10gb", 3, Some(first.record())).unwrap());
        assert!(!release_instance(&restarted, &gpu, "1g.10gb", 3, Some(first.record())).unwrap());
        // Without a record, whatever sits at the placement is released.
        ensure_instance(&restarted, &gpu, "1g.10gb", 3).unwrap();
        assert!(release_instance(&restarted, &gpu, "1g.10gb", 3, None).unwrap());
        let reloaded = SimulatedMig::persistent(&inventory, &file);
        assert!(
            reloaded
                .mig_devices(&gpu)
                .unwrap()
                .iter()
                .all(|i| i.placement_start != 3)
        );
    }
}
