//! The `nvml` backend: the only place in Tessera that calls NVML.
//!
//! [`NvmlSource`] reads the [inventory](tessera_gpu_inventory::model::GpuInventory) through nvml-wrapper, and through
//! nvml-wrapper-sys (`nvml.lib()`) what the wrapper lacks: GPU fabric info, GPU-instance profiles
//! and placements, GPU and compute instances, MIG device ids, NVLink remote device types. What
//! NVML does not know — the PCIe root complex and the NUMA node of the PCI attachment — comes
//! from sysfs ([`Sysfs`], with an injectable root for tests).
//!
//! It also manages MIG devices ([`NvmlSource::create_mig_device`],
//! [`NvmlSource::destroy_mig_device`], [`NvmlSource::mig_devices`]) and streams XID/ECC health
//! events ([`NvmlSource::health_events`]) and reads GPU telemetry ([`NvmlSource::telemetry`]:
//! utilization, memory, power, temperature, ECC counts) for the node plugin.
//!
//! Tests run this code unchanged against `testing/fake-nvml`, a library exporting the same C ABI.
//!
//! Safety: this module tree is the crate's FFI edge. `unsafe` is allowed here only; every block
//! says why it is sound.
//!
//! Modules: `error` (what NVML answered, per call), `ffi` (calling the C ABI through
//! nvml-wrapper-sys), `library` (which libnvidia-ml is loaded), `sysfs`, `mig_sys` (the raw MIG
//! calls nvml-wrapper lacks), `read` (the inventory), `mig` (create/destroy), `events` (XID/ECC),
//! `telemetry`.
#![allow(unsafe_code)]

mod error;
mod events;
mod ffi;
mod library;
mod mig;
mod mig_sys;
mod read;
mod sysfs;
mod telemetry;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use nvml_wrapper::Nvml;

pub use error::{CallError, NvmlCode, NvmlError};
pub use events::{HealthEvent, HealthEventKind, HealthEvents, UnmonitoredGpu};
pub use library::DEFAULT_LIBRARY;
pub use read::cuda_cores_per_multiprocessor;
pub use sysfs::{DEFAULT_SYSFS_ROOT, Sysfs};
pub use telemetry::GpuTelemetry;

use tessera_gpu_inventory::model::{GpuInventory, MigInstance};
use tessera_gpu_inventory::source::{DeviceSource, SourceError};

/// An open NVML session plus the sysfs tree to read PCI facts from.
///
/// NVML state is process-global: several `NvmlSource`s in one process share the driver's state
/// (NVML reference-counts `nvmlInit`/`nvmlShutdown`). Dropping the last one shuts NVML down.
#[derive(Debug, Clone)]
pub struct NvmlSource {
    nvml: Arc<Nvml>,
    library: PathBuf,
    sysfs: Sysfs,
}

impl NvmlSource {
    /// Loads the NVML library at `lib_path` (default [`DEFAULT_LIBRARY`], found through the
    /// dynamic loader's search path) and initialises it. Reads PCI facts from the host's `/sys`.
    ///
    /// A missing library, a library that is not NVML (no `nvmlInit_v2` / `nvmlShutdown`), or a
    /// failing `nvmlInit_v2` is an [`NvmlError`] naming the library path — never a panic.
    pub fn open(lib_path: Option<&Path>) -> Result<Self, NvmlError> {
        let (nvml, library) = library::open(lib_path)?;
        Ok(Self {
            nvml: Arc::new(nvml),
            library,
            sysfs: Sysfs::default(),
        })
    }

    /// Reads PCI facts (PCIe root, NUMA node) from `sysfs` instead of the host's `/sys`.
    pub fn with_sysfs(mut self, sysfs: Sysfs) -> Self {
        self.sysfs = sysfs;
        self
    }

    /// The library this session was opened from.
    pub fn library_path(&self) -> &Path {
        &self.library
    }

    /// Reads every GPU: identity, versions, memory, multiprocessors, PCI placement, NVLink links,
    /// fabric membership, MIG state with existing MIG devices and creatable profiles. The result
    /// is normalized ([`GpuInventory::normalize`]) but not validated; [`DeviceSource::inventory`]
    /// validates it too.
    pub fn read_inventory(&self) -> Result<GpuInventory, NvmlError> {
        read::inventory(&self.nvml, &self.sysfs)
    }

    /// Creates a MIG device on the GPU `gpu_uuid`: a GPU instance of `profile` (e.g. `1g.10gb`,
    /// as in [`tessera_gpu_inventory::model::MigProfile::name`]) at memory slice `placement_start`, and one compute
    /// instance spanning the whole GPU instance. Returns the new MIG device with its UUID and
    /// GPU/compute instance ids.
    ///
    /// The GPU must be in MIG mode. A placement overlapping an existing GPU instance is
    /// [`NvmlError::MigPlacementUnavailable`]; a start that is not one of the profile's placements
    /// is [`NvmlError::InvalidMigPlacement`]. If any step after creating the GPU instance fails,
    /// what was created is destroyed again before the error is returned.
    pub fn create_mig_device(
        &self,
        gpu_uuid: &str,
        profile: &str,
        placement_start: u32,
    ) -> Result<MigInstance, NvmlError> {
        mig::create(&self.nvml, gpu_uuid, profile, placement_start)
    }

    /// Destroys the MIG device with these ids on the GPU `gpu_uuid`: its compute instance, then
    /// the GPU instance once no compute instance is left on it.
    pub fn destroy_mig_device(
        &self,
        gpu_uuid: &str,
        gpu_instance_id: u32,
        compute_instance_id: u32,
    ) -> Result<(), NvmlError> {
        mig::destroy(&self.nvml, gpu_uuid, gpu_instance_id, compute_instance_id)
    }

    /// The MIG devices that exist on the GPU `gpu_uuid` (empty when MIG mode is off).
    pub fn mig_devices(&self, gpu_uuid: &str) -> Result<Vec<MigInstance>, NvmlError> {
        mig::list(&self.nvml, gpu_uuid)
    }

    /// Reads every GPU's utilization, memory in use, power, temperature and ECC error counts
    /// (the node plugin's per-device metrics; see [`GpuTelemetry`] for the calls).
    pub fn telemetry(&self) -> Result<Vec<GpuTelemetry>, NvmlError> {
        telemetry::sample(&self.nvml)
    }

    /// Registers every GPU for XID and ECC events and returns the event set to wait on. GPUs that
    /// cannot deliver any of these events are listed by [`HealthEvents::unmonitored`].
    pub fn health_events(&self) -> Result<HealthEvents, NvmlError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| NvmlError::SystemQuery {
                query: "nvmlDeviceGetCount_v2",
                source: e.into(),
            })?;
        let mut gpus = Vec::with_capacity(count as usize);
        for index in 0..count {
            let device = self
                .nvml
                .device_by_index(index)
                .map_err(|e| NvmlError::DeviceHandle {
                    index,
                    source: e.into(),
                })?;
            let uuid = device.uuid().map_err(|e| NvmlError::DeviceQuery {
                gpu: format!("with index {index}"),
                query: "nvmlDeviceGetUUID",
                source: e.into(),
            })?;
            // SAFETY: the raw handle stays valid while NVML is initialised, which the event set
            // guarantees by holding the `Arc<Nvml>`.
            gpus.push((uuid, unsafe { device.handle() }));
        }
        HealthEvents::register(Arc::clone(&self.nvml), gpus)
    }
}

impl DeviceSource for NvmlSource {
    fn inventory(&self) -> Result<GpuInventory, SourceError> {
        let inventory = self.read_inventory().map_err(|e| {
            let (operation, source) = e.into_operation_and_cause();
            SourceError::Backend {
                backend: "nvml",
                operation,
                source,
            }
        })?;
        inventory
            .validate()
            .map_err(|problems| SourceError::BackendInvalid {
                backend: "nvml",
                problems,
            })?;
        Ok(inventory)
    }

    fn describe(&self) -> String {
        format!("NVML ({})", self.library.display())
    }
}
