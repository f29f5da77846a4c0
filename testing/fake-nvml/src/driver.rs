//! The fake "driver": the GPUs of a topology file plus the MIG state that changes while the process
//! runs. Pure Rust, no FFI: the exported C functions (crate::exports) translate between this and
//! the NVML ABI. Every method answers with an NVML status on failure, chosen as real NVML does.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use tessera_gpu_inventory::model::{Gpu, GpuInventory, MigEngines, MigInstance, MigProfile};

use crate::handles::Handle;
use crate::samples::{Sample, Samples};
use crate::status::{
    GPU_IS_LOST, IN_USE, INSUFFICIENT_RESOURCES, INVALID_ARGUMENT, NO_PERMISSION, NOT_FOUND,
    NOT_SUPPORTED, Status,
};

/// Compute slices of each `NVML_COMPUTE_INSTANCE_PROFILE_*` index; the fake reports a
/// compute-instance profile's id equal to its index, as NVML does.
const COMPUTE_INSTANCE_PROFILE_SLICES: [u32; 7] = [1, 2, 3, 4, 7, 8, 6];

/// A compute instance: what its MIG device reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComputeInstanceState {
    pub profile_id: u32,
    pub start: u32,
    pub slices: u32,
    pub uuid: String,
    pub memory_bytes: u64,
    pub multiprocessors: u32,
    pub engines: MigEngines,
}

/// A GPU instance with its compute instances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInstanceState {
    /// Position of the instance's profile in the GPU's `mig.profiles`.
    pub profile: usize,
    pub start: u32,
    pub compute_instances: BTreeMap<u32, ComputeInstanceState>,
}

/// The fake driver state.
#[derive(Debug)]
pub struct Driver {
    inventory: GpuInventory,
    /// Per GPU (by NVML index): GPU instances by id.
    gpu_instances: Vec<BTreeMap<u32, GpuInstanceState>>,
    /// Counter mixed into the UUIDs of MIG devices created at run time.
    created: u64,
    /// GPUs (by NVML index) that "fell off the bus".
    lost: BTreeSet<u32>,
    /// Compute time slices set through the private call `nvidia-smi` uses, by GPU UUID, when no
    /// state directory keeps them.
    time_slices: BTreeMap<String, u32>,
    /// Where settings that outlive a process (time slices) are kept, as the real driver keeps
    /// them in the kernel; `None` keeps them in the process.
    state_dir: Option<PathBuf>,
    /// Scripted telemetry (utilization, memory in use, power, temperature, ECC counts).
    samples: Samples,
}

/// The device an NVML handle stands for, resolved against the state: a GPU or a MIG device.
pub enum NvmlDevice<'a> {
    Gpu(&'a Gpu),
    Mig {
        gpu: &'a Gpu,
        gpu_instance: &'a GpuInstanceState,
        compute_instance: &'a ComputeInstanceState,
        profile: &'a MigProfile,
    },
}

impl Driver {
    /// The driver for a validated, normalized inventory. Fails (with a message for the test log)
    /// when the GPUs' indices are not exactly `0..n`, which NVML enumeration requires.
    pub fn new(inventory: GpuInventory) -> Result<Driver, String> {
        for (position, gpu) in inventory.gpus.iter().enumerate() {
            if gpu.index as usize != position {
                return Err(format!(
                    "GPU {} has index {}, but NVML indices are 0..{} without gaps",
                    gpu.uuid,
                    gpu.index,
                    inventory.gpus.len()
                ));
            }
        }
        let gpu_instances = inventory.gpus.iter().map(existing_instances).collect();
        Ok(Driver {
            inventory,
            gpu_instances,
            created: 0,
            lost: BTreeSet::new(),
            time_slices: BTreeMap::new(),
            state_dir: None,
            samples: Samples::default(),
        })
    }

    /// Marks GPUs as fallen off the bus: every query on them (and their MIG devices) except
    /// `nvmlDeviceGetUUID` answers `NVML_ERROR_GPU_IS_LOST`.
    pub fn set_lost(&mut self, uuids: &[&str]) -> Result<(), String> {
        for uuid in uuids {
            let gpu = self
                .inventory
                .gpu_by_uuid(uuid)
                .ok_or_else(|| format!("no GPU has UUID `{uuid}`"))?;
            self.lost.insert(gpu.index);
        }
        Ok(())
    }

    /// Keeps settings that outlive the process (time slices) in files under `dir`.
    pub fn set_state_dir(&mut self, dir: Option<PathBuf>) {
        self.state_dir = dir;
    }

    /// Reads scripted telemetry from the samples file at `path` ([`crate::samples`]).
    pub fn set_samples_file(&mut self, path: Option<PathBuf>) {
        self.samples = Samples::new(path);
    }

    /// The scripted telemetry of the GPU `uuid` now.
    pub fn sample(&mut self, uuid: &str) -> Sample {
        self.samples.sample(uuid)
    }

    fn time_slice_file(&self, uuid: &str) -> Option<PathBuf> {
        self.state_dir
            .as_ref()
            .map(|dir| dir.join("time-slice").join(uuid))
    }

    /// Sets the compute time slice (`0..=3`, as `nvidia-smi compute-policy --set-timeslice`)
    /// of the whole GPU `gpu`.
    pub fn set_time_slice(&mut self, gpu: u32, value: u32) -> Result<(), Status> {
        if value > 3 {
            return Err(INVALID_ARGUMENT);
        }
        let uuid = self.gpu_by_index(gpu)?.uuid.clone();
        match self.time_slice_file(&uuid) {
            Some(path) => {
                let write = || -> std::io::Result<()> {
                    if let Some(dir) = path.parent() {
                        std::fs::create_dir_all(dir)?;
                    }
                    let temp = path.with_extension(format!("tmp-{}", std::process::id()));
                    std::fs::write(&temp, value.to_string())?;
                    std::fs::rename(&temp, &path)
                };
                write().map_err(|e| {
                    eprintln!(
                        "fake-nvml: cannot keep the time slice in {}: {e}",
                        path.display()
                    );
                    NO_PERMISSION
                })?;
            }
            None => {
                self.time_slices.insert(uuid, value);
            }
        }
        Ok(())
    }

    /// The compute time slice of the whole GPU `gpu` (0, the default, when never set).
    pub fn time_slice(&self, gpu: u32) -> Result<u32, Status> {
        let uuid = &self.gpu_by_index(gpu)?.uuid;
        Ok(match self.time_slice_file(uuid) {
            Some(path) => std::fs::read_to_string(path)
                .ok()
                .and_then(|text| text.trim().parse().ok())
                .unwrap_or(0),
            None => self.time_slices.get(uuid).copied().unwrap_or(0),
        })
    }

    pub fn inventory(&self) -> &GpuInventory {
        &self.inventory
    }

    pub fn gpu_count(&self) -> u32 {
        self.inventory.gpus.len() as u32
    }

    pub fn gpu_by_index(&self, index: u32) -> Result<&Gpu, Status> {
        self.inventory
            .gpus
            .get(index as usize)
            .ok_or(INVALID_ARGUMENT)
    }

    /// The handle of the GPU or MIG device with this UUID.
    pub fn handle_by_uuid(&self, uuid: &str) -> Result<Handle, Status> {
        for (gpu, instances) in self.inventory.gpus.iter().zip(&self.gpu_instances) {
            if gpu.uuid == uuid {
                return Ok(Handle::Gpu { gpu: gpu.index });
            }
            for (&gi, state) in instances {
                for (&ci, compute) in &state.compute_instances {
                    if compute.uuid == uuid {
                        return Ok(Handle::MigDevice {
                            gpu: gpu.index,
                            gpu_instance: gi,
                            compute_instance: ci,
                        });
                    }
                }
            }
        }
        Err(NOT_FOUND)
    }

    /// A GPU or MIG device handle; `NVML_ERROR_GPU_IS_LOST` for (MIG devices of) lost GPUs.
    pub fn device(&self, handle: Option<Handle>) -> Result<NvmlDevice<'_>, Status> {
        let device = self.device_identity(handle)?;
        let gpu = match &device {
            NvmlDevice::Gpu(gpu) | NvmlDevice::Mig { gpu, .. } => gpu.index,
        };
        if self.lost.contains(&gpu) {
            return Err(GPU_IS_LOST);
        }
        Ok(device)
    }

    /// A GPU or MIG device handle, also when the GPU is lost (its identity is still known).
    pub fn device_identity(&self, handle: Option<Handle>) -> Result<NvmlDevice<'_>, Status> {
        match handle.ok_or(INVALID_ARGUMENT)? {
            Handle::Gpu { gpu } => self.gpu_by_index(gpu).map(NvmlDevice::Gpu),
            Handle::MigDevice {
                gpu,
                gpu_instance,
                compute_instance,
            } => {
                let (gpu, state) = self.gpu_instance(gpu, gpu_instance)?;
                let compute = state
                    .compute_instances
                    .get(&compute_instance)
                    .ok_or(INVALID_ARGUMENT)?;
                let profile = &mig_profiles(gpu)?[state.profile];
                Ok(NvmlDevice::Mig {
                    gpu,
                    gpu_instance: state,
                    compute_instance: compute,
                    profile,
                })
            }
            _ => Err(INVALID_ARGUMENT),
        }
    }

    /// A whole-GPU handle; MIG device handles answer `NOT_SUPPORTED` (the query is a GPU one).
    pub fn gpu(&self, handle: Option<Handle>) -> Result<&Gpu, Status> {
        match self.device(handle)? {
            NvmlDevice::Gpu(gpu) => Ok(gpu),
            NvmlDevice::Mig { .. } => Err(NOT_SUPPORTED),
        }
    }

    /// A MIG-capable GPU's handle.
    pub fn mig_gpu(&self, handle: Option<Handle>) -> Result<&Gpu, Status> {
        let gpu = self.gpu(handle)?;
        gpu.mig.as_ref().map(|_| gpu).ok_or(NOT_SUPPORTED)
    }

    pub fn gpu_instance(&self, gpu: u32, id: u32) -> Result<(&Gpu, &GpuInstanceState), Status> {
        let gpu_ref = self.gpu_by_index(gpu)?;
        let state = self.gpu_instances[gpu as usize]
            .get(&id)
            .ok_or(INVALID_ARGUMENT)?;
        Ok((gpu_ref, state))
    }

    /// GPU instances of one GPU by id.
    pub fn gpu_instances(&self, gpu: u32) -> &BTreeMap<u32, GpuInstanceState> {
        &self.gpu_instances[gpu as usize]
    }

    /// MIG devices of a GPU as `(gpu instance id, compute instance id)`, in id order; this order
    /// is the one `nvmlDeviceGetMigDeviceHandleByIndex` enumerates.
    pub fn mig_devices(&self, gpu: u32) -> Vec<(u32, u32)> {
        self.gpu_instances[gpu as usize]
            .iter()
            .flat_map(|(&gi, state)| state.compute_instances.keys().map(move |&ci| (gi, ci)))
            .collect()
    }

    /// Creates a GPU instance of the profile with NVML id `profile_id` at `start`.
    pub fn create_gpu_instance(
        &mut self,
        gpu: u32,
        profile_id: u32,
        start: u32,
        size: u32,
    ) -> Result<u32, Status> {
        let gpu_ref = self.gpu_by_index(gpu)?;
        let mig = gpu_ref.mig.as_ref().ok_or(NOT_SUPPORTED)?;
        if !mig.enabled {
            return Err(NOT_SUPPORTED);
        }
        let (position, profile) = mig
            .profiles
            .iter()
            .enumerate()
            .find(|(_, p)| p.profile_id == profile_id)
            .ok_or(INVALID_ARGUMENT)?;
        if size != profile.memory_slices || !profile.placements.contains(&start) {
            return Err(INVALID_ARGUMENT);
        }
        let wanted = profile.memory_slice_range(start);
        let existing = &self.gpu_instances[gpu as usize];
        let mut compute_used = 0;
        for state in existing.values() {
            let other = &mig.profiles[state.profile];
            let taken = other.memory_slice_range(state.start);
            if taken.start < wanted.end && wanted.start < taken.end {
                return Err(INSUFFICIENT_RESOURCES);
            }
            compute_used += other.compute_slices;
        }
        if compute_used + profile.compute_slices > mig.compute_slice_count() {
            return Err(INSUFFICIENT_RESOURCES);
        }
        let id = (1..).find(|id| !existing.contains_key(id)).unwrap_or(1);
        self.gpu_instances[gpu as usize].insert(
            id,
            GpuInstanceState {
                profile: position,
                start,
                compute_instances: BTreeMap::new(),
            },
        );
        Ok(id)
    }

    /// Destroys a GPU instance; `IN_USE` while it still has compute instances.
    pub fn destroy_gpu_instance(&mut self, gpu: u32, id: u32) -> Result<(), Status> {
        let (_, state) = self.gpu_instance(gpu, id)?;
        if !state.compute_instances.is_empty() {
            return Err(IN_USE);
        }
        self.gpu_instances[gpu as usize].remove(&id);
        Ok(())
    }

    /// Compute slices of compute-instance profile `index` on a GPU instance, if offered there.
    pub fn compute_instance_profile(
        &self,
        gpu: u32,
        gpu_instance: u32,
        index: u32,
    ) -> Result<(u32, &MigProfile), Status> {
        let (gpu_ref, state) = self.gpu_instance(gpu, gpu_instance)?;
        let profile = &mig_profiles(gpu_ref)?[state.profile];
        let slices = *COMPUTE_INSTANCE_PROFILE_SLICES
            .get(index as usize)
            .ok_or(INVALID_ARGUMENT)?;
        if slices > profile.compute_slices {
            return Err(NOT_SUPPORTED);
        }
        Ok((slices, profile))
    }

    /// Creates a compute instance of profile `index` in the first free compute slices.
    pub fn create_compute_instance(
        &mut self,
        gpu: u32,
        gpu_instance: u32,
        index: u32,
    ) -> Result<u32, Status> {
        let (slices, profile) = self.compute_instance_profile(gpu, gpu_instance, index)?;
        let profile = profile.clone();
        let parent_uuid = self.gpu_by_index(gpu)?.uuid.clone();
        let (_, state) = self.gpu_instance(gpu, gpu_instance)?;
        let mut used = vec![false; profile.compute_slices as usize];
        for ci in state.compute_instances.values() {
            for slot in used
                .iter_mut()
                .skip(ci.start as usize)
                .take(ci.slices as usize)
            {
                *slot = true;
            }
        }
        let start = (0..=profile.compute_slices.saturating_sub(slices))
            .find(|&s| !used[s as usize..(s + slices) as usize].contains(&true))
            .ok_or(INSUFFICIENT_RESOURCES)?;
        let id = (0..)
            .find(|id| !state.compute_instances.contains_key(id))
            .unwrap_or(0);
        self.created += 1;
        let compute = ComputeInstanceState {
            profile_id: index,
            start,
            slices,
            uuid: mig_uuid(&parent_uuid, gpu_instance, id, self.created),
            memory_bytes: profile.memory_bytes,
            multiprocessors: profile.multiprocessors * slices / profile.compute_slices,
            engines: profile.engines,
        };
        self.gpu_instances[gpu as usize]
            .get_mut(&gpu_instance)
            .ok_or(INVALID_ARGUMENT)?
            .compute_instances
            .insert(id, compute);
        Ok(id)
    }

    /// Destroys a compute instance (and with it its MIG device).
    pub fn destroy_compute_instance(
        &mut self,
        gpu: u32,
        gpu_instance: u32,
        id: u32,
    ) -> Result<(), Status> {
        self.gpu_instances
            .get_mut(gpu as usize)
            .and_then(|instances| instances.get_mut(&gpu_instance))
            .and_then(|state| state.compute_instances.remove(&id))
            .map(|_| ())
            .ok_or(INVALID_ARGUMENT)
    }
}

fn mig_profiles(gpu: &Gpu) -> Result<&[MigProfile], Status> {
    gpu.mig
        .as_ref()
        .map(|m| m.profiles.as_slice())
        .ok_or(NOT_SUPPORTED)
}

/// The MIG devices a topology file lists, as GPU instances holding one compute instance each.
fn existing_instances(gpu: &Gpu) -> BTreeMap<u32, GpuInstanceState> {
    let Some(mig) = &gpu.mig else {
        return BTreeMap::new();
    };
    mig.instances
        .iter()
        .filter_map(|instance| {
            let profile = mig
                .profiles
                .iter()
                .position(|p| p.name == instance.profile)?;
            Some((
                instance.gpu_instance_id,
                GpuInstanceState {
                    profile,
                    start: instance.placement_start,
                    compute_instances: BTreeMap::from([(
                        instance.compute_instance_id,
                        compute_from_topology(instance, &mig.profiles[profile]),
                    )]),
                },
            ))
        })
        .collect()
}

fn compute_from_topology(instance: &MigInstance, profile: &MigProfile) -> ComputeInstanceState {
    ComputeInstanceState {
        profile_id: instance.compute_instance_profile_id,
        start: 0,
        slices: COMPUTE_INSTANCE_PROFILE_SLICES
            .get(instance.compute_instance_profile_id as usize)
            .copied()
            .unwrap_or(profile.compute_slices)
            .min(profile.compute_slices),
        uuid: instance.uuid.clone(),
        memory_bytes: instance.memory_bytes,
        multiprocessors: instance.multiprocessors,
        engines: instance.engines,
    }
}

/// A deterministic `MIG-<uuid>` for a MIG device created at run time (FNV-1a over its identity).
fn mig_uuid(parent: &str, gpu_instance: u32, compute_instance: u32, serial: u64) -> String {
    let mut bytes = [0u8; 16];
    for (half, seed) in bytes
        .chunks_mut(8)
        .zip([0xcbf2_9ce4_8422_2325u64, 0x8422_2325])
    {
        let mut hash = seed;
        let identity = format!("{parent}/{gpu_instance}/{compute_instance}/{serial}");
        for byte in identity.bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        half.copy_from_slice(&hash.to_be_bytes());
    }
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "MIG-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_gpu_inventory::mock::{parse_topology, shipped_topology};

    fn driver(name: &str) -> Driver {
        let yaml = shipped_topology(name).unwrap();
        Driver::new(parse_topology(name, yaml).unwrap()).unwrap()
    }

    #[test]
    fn existing_instances_come_from_the_topology() {
        let driver = driver("hgx-a100-mig");
        let gpu0 = driver.inventory().gpus[0].mig.as_ref().unwrap();
        assert_eq!(driver.mig_devices(0).len(), gpu0.instances.len());
        assert!(driver.mig_devices(4).is_empty());
    }

    #[test]
    fn overlapping_placements_are_refused_and_free_ones_accepted() {
        let mut driver = driver("hgx-a100-mig");
        // GPU 3 has memory slice 3 free; 1g.10gb is profile id 19 with 1 memory slice.
        let free = driver.create_gpu_instance(3, 19, 3, 1);
        let gi = free.expect("slice 3 of GPU 3 is free");
        assert_eq!(
            driver.create_gpu_instance(3, 19, 3, 1),
            Err(INSUFFICIENT_RESOURCES)
        );
        assert_eq!(
            driver.create_gpu_instance(3, 19, 0, 1),
            Err(INSUFFICIENT_RESOURCES)
        );
        // Not a placement of the profile, or the wrong size.
        assert_eq!(
            driver.create_gpu_instance(3, 19, 9, 1),
            Err(INVALID_ARGUMENT)
        );
        assert_eq!(
            driver.create_gpu_instance(3, 19, 3, 2),
            Err(INVALID_ARGUMENT)
        );
        // MIG disabled on GPU 4.
        assert_eq!(driver.create_gpu_instance(4, 19, 0, 1), Err(NOT_SUPPORTED));

        let ci = driver.create_compute_instance(3, gi, 0).unwrap();
        assert_eq!(driver.destroy_gpu_instance(3, gi), Err(IN_USE));
        let (gpu, state) = driver.gpu_instance(3, gi).unwrap();
        let uuid = &state.compute_instances[&ci].uuid;
        assert!(uuid.starts_with("MIG-"));
        assert_eq!(
            driver.handle_by_uuid(uuid),
            Ok(Handle::MigDevice {
                gpu: gpu.index,
                gpu_instance: gi,
                compute_instance: ci
            })
        );
        // One compute slice: a second 1-slice compute instance does not fit.
        assert_eq!(
            driver.create_compute_instance(3, gi, 0),
            Err(INSUFFICIENT_RESOURCES)
        );
        driver.destroy_compute_instance(3, gi, ci).unwrap();
        driver.destroy_gpu_instance(3, gi).unwrap();
        assert_eq!(driver.gpu_instance(3, gi).err(), Some(INVALID_ARGUMENT));
    }

    #[test]
    fn mig_uuids_are_distinct_per_serial() {
        let a = mig_uuid("GPU-1", 1, 0, 1);
        let b = mig_uuid("GPU-1", 1, 0, 2);
        assert_ne!(a, b);
        assert_eq!(a.len(), "MIG-".len() + 36);
    }

    #[test]
    fn lost_gpus_answer_gpu_is_lost_but_keep_their_identity() {
        let mut driver = driver("pcie-l40s");
        let uuid = driver.inventory().gpus[2].uuid.clone();
        driver.set_lost(&[&uuid]).unwrap();
        let handle = Some(Handle::Gpu { gpu: 2 });
        assert_eq!(driver.gpu(handle).err(), Some(GPU_IS_LOST));
        assert!(driver.device_identity(handle).is_ok());
        assert!(driver.gpu(Some(Handle::Gpu { gpu: 1 })).is_ok());
        assert!(
            driver
                .set_lost(&["GPU-nope"])
                .unwrap_err()
                .contains("GPU-nope")
        );
    }

    #[test]
    fn non_contiguous_indices_are_refused() {
        let mut inventory = driver("pcie-l40s").inventory().clone();
        inventory.gpus[1].index = 9;
        let err = Driver::new(inventory).unwrap_err();
        assert!(err.contains("index 9"), "{err}");
    }
}
