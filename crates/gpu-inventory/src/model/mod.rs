//! The inventory model: what a node knows about its GPUs, as raw facts (what NVML and sysfs
//! report). Derived facts (NVLink islands, link bandwidth, MIG memory-slice totals) are computed
//! from these by functions of this crate, never stored, so two backends that read the same
//! hardware produce equal inventories.
//!
//! The same types are the YAML topology file format (docs/topology-format.md): `serde` names are
//! camelCase, unknown fields are rejected.

mod kinds;

use serde::{Deserialize, Serialize};

pub use kinds::{
    Architecture, Brand, FabricHealth, FabricState, NvLinkRemoteType, NvLinkState, NvLinkVersion,
};

use crate::units::{MajorMinor, bytes_quantity};

/// Everything the node plugin knows about the GPUs of one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuInventory {
    /// NVIDIA kernel driver version as NVML reports it (`nvmlSystemGetDriverVersion`), e.g.
    /// `550.54.15` or `535.129.03`; rendering turns it into semver.
    pub driver_version: String,
    /// Highest CUDA version the driver supports (`nvmlSystemGetCudaDriverVersion_v2`, which
    /// reports `major * 1000 + minor * 10`), e.g. `12.4`.
    pub cuda_driver_version: MajorMinor,
    /// The GPUs, in NVML index order after [`GpuInventory::normalize`].
    pub gpus: Vec<Gpu>,
    /// UUIDs of GPUs the backend enumerates but cannot query: NVML answers
    /// `NVML_ERROR_GPU_IS_LOST` (the GPU fell off the bus). They are not in [`Self::gpus`]: their
    /// facts cannot be read. A runtime observation of the NVML backend, not a topology fact, so
    /// not part of the topology file format. Sorted by [`GpuInventory::normalize`].
    #[serde(skip)]
    pub lost_gpus: Vec<String>,
}

/// One physical GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Gpu {
    /// NVML UUID, `GPU-<uuid>`.
    pub uuid: String,
    /// NVML enumeration index.
    pub index: u32,
    /// Device minor number: the GPU is `/dev/nvidia<minor>`. Device names are built from it.
    pub minor: u32,
    /// Product name (`nvmlDeviceGetName`), e.g. `NVIDIA H100 80GB HBM3`.
    pub product_name: String,
    pub brand: Brand,
    pub architecture: Architecture,
    /// CUDA compute capability, e.g. `9.0`.
    pub cuda_compute_capability: MajorMinor,
    /// Total device memory in bytes (`nvmlDeviceGetMemoryInfo().total`). In the topology file a
    /// byte count or a binary quantity such as `81559Mi`.
    #[serde(rename = "memory", with = "bytes_quantity")]
    pub memory_bytes: u64,
    /// Streaming multiprocessors. NVML reports SM counts only for MIG devices
    /// (`nvmlDeviceGetAttributes_v2`), so the nvml backend divides `nvmlDeviceGetNumGpuCores` by the
    /// CUDA cores per SM of the compute capability (`nvml::cuda_cores_per_multiprocessor`).
    pub multiprocessors: u32,
    /// PCI bus id, extended BDF `dddd:bb:dd.f` in lower case (normalized from NVML's
    /// `dddddddd:bb:dd.f`, see [`crate::pci::normalize_bus_id`]).
    pub pci_bus_id: String,
    /// PCIe root complex the GPU hangs off, `pci<domain>:<bus>` (from sysfs, as upstream's
    /// `resource.kubernetes.io/pcieRoot`). Absent when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_root: Option<String>,
    /// NUMA node of the GPU's PCIe attachment. Absent when the platform reports none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    /// NVLink links, one entry per link index the GPU has (active or not).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvlinks: Vec<NvLink>,
    /// Multi-node NVLink fabric membership (`nvmlDeviceGetGpuFabricInfo`); absent on GPUs
    /// without fabric support.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<FabricInfo>,
    /// MIG state; absent when the GPU is not MIG-capable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<MigState>,
}

impl Gpu {
    /// Whether the GPU supports MIG.
    pub fn mig_capable(&self) -> bool {
        self.mig.is_some()
    }

    /// Whether the GPU is in MIG mode (current mode, not pending).
    pub fn mig_enabled(&self) -> bool {
        self.mig.as_ref().is_some_and(|m| m.enabled)
    }

    /// Links in state `active`.
    pub fn active_nvlinks(&self) -> impl Iterator<Item = &NvLink> {
        self.nvlinks
            .iter()
            .filter(|l| l.state == NvLinkState::Active)
    }

    /// Aggregate bandwidth of the active links in GB/s (both directions), from the link versions.
    pub fn nvlink_bandwidth_gbps(&self) -> u64 {
        self.active_nvlinks()
            .map(|l| u64::from(l.version.bandwidth_gbps_per_link()))
            .sum()
    }

    /// The fabric clique `<clusterUUID>.<cliqueId>` when the GPU has completed fabric registration.
    pub fn fabric_clique(&self) -> Option<String> {
        self.fabric
            .as_ref()
            .filter(|f| f.state == FabricState::Completed)
            .map(|f| format!("{}.{}", f.cluster_uuid, f.clique_id))
    }
}

/// One NVLink link of a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NvLink {
    /// Link index (`0 .. NVML_NVLINK_MAX_LINKS`).
    pub link: u32,
    /// `nvmlDeviceGetNvLinkState`.
    pub state: NvLinkState,
    /// `nvmlDeviceGetNvLinkVersion`.
    pub version: NvLinkVersion,
    /// What the link connects to (`nvmlDeviceGetNvLinkRemoteDeviceType`).
    pub remote_type: NvLinkRemoteType,
    /// PCI bus id of the remote end (`nvmlDeviceGetNvLinkRemotePciInfo_v2`), extended BDF. For a
    /// GPU peer this is that GPU's `pciBusId`; for an NVSwitch, the switch's.
    pub remote_pci_bus_id: String,
}

/// Multi-node NVLink fabric membership (`nvmlGpuFabricInfo_v2_t`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FabricInfo {
    /// UUID of the NVLink cluster (canonical lower-case hyphenated form of NVML's 16 bytes).
    pub cluster_uuid: String,
    /// Clique within the cluster: GPUs of one clique can reach each other over NVLink.
    pub clique_id: u32,
    /// Registration state (`NVML_GPU_FABRIC_STATE_*`).
    pub state: FabricState,
    /// The registration's result (`status`, an `nvmlReturn_t`): 0 (`NVML_SUCCESS`) unless a
    /// completed registration failed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub status: u32,
    /// The fabric's health summary (v3 of the struct); not supported before.
    #[serde(default, skip_serializing_if = "FabricHealth::is_not_supported")]
    pub health: FabricHealth,
}

fn is_zero(value: &u32) -> bool {
    *value == 0
}

/// MIG facts of a MIG-capable GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigState {
    /// Current MIG mode (`nvmlDeviceGetMigMode`, current).
    pub enabled: bool,
    /// GPU-instance profiles the GPU supports, with their placements (`nvmlDeviceGetGpuInstanceProfileInfoV`
    /// and `nvmlDeviceGetGpuInstancePossiblePlacements_v2`), in NVML profile-index order after
    /// [`GpuInventory::normalize`].
    pub profiles: Vec<MigProfile>,
    /// Existing MIG devices (GPU instance + compute instance), only while `enabled`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<MigInstance>,
}

impl MigState {
    /// The profile with this name (e.g. `1g.10gb`).
    pub fn profile(&self, name: &str) -> Option<&MigProfile> {
        self.profiles.iter().find(|p| p.name == name)
    }

    /// Memory slices of the GPU: the end of the furthest placement (8 on A100/H100).
    pub fn memory_slice_count(&self) -> u32 {
        self.profiles
            .iter()
            .flat_map(|p| p.placements.iter().map(move |s| s + p.memory_slices))
            .max()
            .unwrap_or(0)
    }

    /// Compute (GPC) slices of the GPU: the largest profile's (7 on A100/H100).
    pub fn compute_slice_count(&self) -> u32 {
        self.profiles
            .iter()
            .map(|p| p.compute_slices)
            .max()
            .unwrap_or(0)
    }

    /// The profile covering the most memory slices (the whole-GPU profile, e.g. `7g.80gb`).
    pub fn largest_profile(&self) -> Option<&MigProfile> {
        self.profiles
            .iter()
            .max_by_key(|p| (p.memory_slices, p.compute_slices, p.engines.total()))
    }
}

/// Engine counts of a MIG profile or instance; in files `{copy: 1, decoders: 0, encoders: 0, jpeg: 0, ofa: 0}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigEngines {
    /// Copy engines (`copyEngineCount`).
    #[serde(rename = "copy")]
    pub copy_engines: u32,
    /// Video decoders, NVDEC (`decoderCount`).
    pub decoders: u32,
    /// Video encoders, NVENC (`encoderCount`).
    pub encoders: u32,
    /// JPEG decoders, NVJPG (`jpegCount`).
    #[serde(rename = "jpeg")]
    pub jpeg_engines: u32,
    /// Optical flow accelerators (`ofaCount`).
    #[serde(rename = "ofa")]
    pub ofa_engines: u32,
}

impl MigEngines {
    fn total(&self) -> u32 {
        self.copy_engines + self.decoders + self.encoders + self.jpeg_engines + self.ofa_engines
    }
}

/// A GPU-instance profile (what `nvidia-smi mig -lgip` and `-lgipp` show).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigProfile {
    /// Profile name without NVML's `MIG ` prefix, e.g. `1g.10gb`, `1g.10gb+me`.
    pub name: String,
    /// The `NVML_GPU_INSTANCE_PROFILE_*` index used to query the profile
    /// (`nvmlDeviceGetGpuInstanceProfileInfo(device, profileIndex)`), e.g. 0 for `1_SLICE`.
    pub profile_index: u32,
    /// The profile id NVML reports in the profile info and expects when creating or listing
    /// GPU instances, e.g. 19 for `1g.10gb` on A100/H100.
    pub profile_id: u32,
    /// Compute (GPC) slices (`sliceCount`).
    pub compute_slices: u32,
    /// Memory slices: the size of each placement.
    pub memory_slices: u32,
    /// How many instances of this profile fit on an empty GPU (`instanceCount`).
    pub instance_count: u32,
    /// Memory of an instance in bytes (`memorySizeMB` × 1 MiB). A byte count or `9728Mi` in files.
    #[serde(rename = "memory", with = "bytes_quantity")]
    pub memory_bytes: u64,
    pub multiprocessors: u32,
    pub engines: MigEngines,
    /// Whether instances of the profile support peer-to-peer (`isP2pSupported`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub p2p_supported: bool,
    /// Possible placement starts in memory slices; each placement spans `memorySlices` slices.
    pub placements: Vec<u32>,
}

impl MigProfile {
    /// The memory slices a placement starting at `start` covers.
    pub fn memory_slice_range(&self, start: u32) -> std::ops::Range<u32> {
        start..start + self.memory_slices
    }
}

/// An existing MIG device: one GPU instance with its (full-size) compute instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigInstance {
    /// MIG device UUID, `MIG-<uuid>`.
    pub uuid: String,
    /// Name of the GPU-instance profile (one of the GPU's `profiles`).
    pub profile: String,
    /// GPU instance id (`nvmlGpuInstanceInfo_t.id`).
    pub gpu_instance_id: u32,
    /// Compute instance id within the GPU instance (`nvmlComputeInstanceInfo_t.id`).
    pub compute_instance_id: u32,
    /// Compute-instance profile id (`nvmlComputeInstanceInfo_t.profileId`); for the full-size
    /// compute instance this is the `NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE` of the GPU instance.
    pub compute_instance_profile_id: u32,
    /// First memory slice of the GPU instance's placement; the size is the profile's `memorySlices`.
    pub placement_start: u32,
    /// Memory in bytes (the MIG device's `nvmlDeviceGetMemoryInfo().total`, or the attributes'
    /// `memorySizeMB`).
    #[serde(rename = "memory", with = "bytes_quantity")]
    pub memory_bytes: u64,
    pub multiprocessors: u32,
    pub engines: MigEngines,
}

impl GpuInventory {
    /// Sorts GPUs by index, links by link index, profiles by NVML profile index and instances by
    /// (placement, GPU-instance id), so that backends enumerating in different orders agree.
    pub fn normalize(&mut self) {
        self.gpus.sort_by_key(|g| g.index);
        self.lost_gpus.sort_unstable();
        self.lost_gpus.dedup();
        for gpu in &mut self.gpus {
            gpu.nvlinks.sort_by_key(|l| l.link);
            if let Some(mig) = &mut gpu.mig {
                mig.profiles.sort_by_key(|p| p.profile_index);
                for p in &mut mig.profiles {
                    p.placements.sort_unstable();
                }
                mig.instances
                    .sort_by_key(|i| (i.placement_start, i.gpu_instance_id, i.compute_instance_id));
            }
        }
    }

    /// The GPU with this PCI bus id (extended BDF, any case).
    pub fn gpu_by_pci_bus_id(&self, bus_id: &str) -> Option<&Gpu> {
        self.gpus
            .iter()
            .find(|g| g.pci_bus_id.eq_ignore_ascii_case(bus_id))
    }

    /// The GPU with this minor number.
    pub fn gpu_by_minor(&self, minor: u32) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.minor == minor)
    }

    /// The GPU with this UUID.
    pub fn gpu_by_uuid(&self, uuid: &str) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.uuid == uuid)
    }

    /// What link `link` of `gpu` reaches.
    pub fn link_peer<'a>(&'a self, link: &'a NvLink) -> LinkPeer<'a> {
        match link.remote_type {
            NvLinkRemoteType::Gpu => match self.gpu_by_pci_bus_id(&link.remote_pci_bus_id) {
                Some(gpu) => LinkPeer::Gpu(gpu),
                None => LinkPeer::Other(&link.remote_pci_bus_id),
            },
            NvLinkRemoteType::NvSwitch => LinkPeer::NvSwitch(&link.remote_pci_bus_id),
            NvLinkRemoteType::IbmNpu | NvLinkRemoteType::Unknown => {
                LinkPeer::Other(&link.remote_pci_bus_id)
            }
        }
    }
}

/// The far end of an NVLink link, resolved against the inventory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkPeer<'a> {
    /// A GPU of this node.
    Gpu(&'a Gpu),
    /// An NVSwitch, by its PCI bus id.
    NvSwitch(&'a str),
    /// Anything else (an NPU, or a GPU that is not part of the inventory), by PCI bus id.
    Other(&'a str),
}
