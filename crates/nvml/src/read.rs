//! Reading the inventory through NVML: one function per part of the model, each naming the
//! NVML query that failed and the GPU it failed on.

use std::mem;

use nvml_wrapper::error::NvmlError as WrapperError;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{
    NVML_NVLINK_MAX_LINKS, nvmlDevice_t, nvmlGpuFabricInfo_t, nvmlGpuFabricInfoV_t,
};

use super::error::{CallError, NvmlCode, NvmlError};
use super::ffi::{check, format_uuid, struct_version, sys_fn};
use super::mig_sys;
use super::sysfs::Sysfs;
use tessera_gpu_inventory::model::{
    Architecture, Brand, FabricHealth, FabricInfo, FabricState, Gpu, GpuInventory, MigEngines,
    MigInstance, MigProfile, MigState, NvLink, NvLinkRemoteType, NvLinkState, NvLinkVersion,
};
use tessera_gpu_inventory::pci::normalize_bus_id;
use tessera_gpu_inventory::units::MajorMinor;

const MIB: u64 = 1 << 20;

/// Reads the whole inventory: system versions, then every GPU in NVML index order. A GPU that
/// answers `NVML_ERROR_GPU_IS_LOST` once its UUID is known is listed in
/// [`GpuInventory::lost_gpus`]; any other failure fails the read.
pub(crate) fn inventory(nvml: &Nvml, sysfs: &Sysfs) -> Result<GpuInventory, NvmlError> {
    let system = |query| {
        move |e: WrapperError| NvmlError::SystemQuery {
            query,
            source: e.into(),
        }
    };
    let driver_version = nvml
        .sys_driver_version()
        .map_err(system("nvmlSystemGetDriverVersion"))?;
    let cuda = nvml
        .sys_cuda_driver_version()
        .map_err(system("nvmlSystemGetCudaDriverVersion_v2"))?;
    let cuda_driver_version = u32::try_from(cuda)
        .map(MajorMinor::from_cuda_driver_version)
        .map_err(|_| NvmlError::SystemQuery {
            query: "nvmlSystemGetCudaDriverVersion_v2",
            source: CallError::Malformed(format!("a negative CUDA version {cuda}")),
        })?;
    let count = nvml
        .device_count()
        .map_err(system("nvmlDeviceGetCount_v2"))?;
    let mut gpus = Vec::with_capacity(count as usize);
    let mut lost_gpus = Vec::new();
    for index in 0..count {
        match gpu(nvml, sysfs, index) {
            Ok(found) => gpus.push(found),
            Err(error) => match lost_gpu_uuid(&error) {
                Some(uuid) => lost_gpus.push(uuid.to_owned()),
                None => return Err(error),
            },
        }
    }
    let mut inventory = GpuInventory {
        driver_version,
        cuda_driver_version,
        gpus,
        lost_gpus,
    };
    inventory.normalize();
    Ok(inventory)
}

/// The UUID of the GPU a failed read was about, when the failure says that GPU is lost
/// (`NVML_ERROR_GPU_IS_LOST` on a query after its UUID was read): such a GPU is reported in
/// [`GpuInventory::lost_gpus`] instead of failing the whole read. A GPU lost before NVML gave its
/// UUID, and every other failure, still fails the read.
fn lost_gpu_uuid(error: &NvmlError) -> Option<&str> {
    let (gpu, source) = match error {
        NvmlError::DeviceQuery { gpu, source, .. } => (gpu, source),
        NvmlError::MigDeviceQuery { gpu, source, .. } => (gpu, source),
        _ => return None,
    };
    (source.code() == Some(NvmlCode::GPU_IS_LOST) && gpu.starts_with("GPU-"))
        .then_some(gpu.as_str())
}

/// Attaches the GPU and the query name to a failed call.
pub(super) struct GpuQueries<'a> {
    pub(super) gpu: &'a str,
}

impl GpuQueries<'_> {
    pub(super) fn on<T, E: Into<CallError>>(
        &self,
        query: &'static str,
        result: Result<T, E>,
    ) -> Result<T, NvmlError> {
        result.map_err(|e| NvmlError::DeviceQuery {
            gpu: self.gpu.to_owned(),
            query,
            source: e.into(),
        })
    }
}

fn gpu(nvml: &Nvml, sysfs: &Sysfs, index: u32) -> Result<Gpu, NvmlError> {
    let device = nvml
        .device_by_index(index)
        .map_err(|e| NvmlError::DeviceHandle {
            index,
            source: e.into(),
        })?;
    let by_index = format!("with index {index}");
    let uuid = GpuQueries { gpu: &by_index }.on("nvmlDeviceGetUUID", device.uuid())?;
    let q = GpuQueries { gpu: &uuid };
    // SAFETY: the raw handle is only passed back to NVML while `device` (and `nvml`) live.
    let handle = unsafe { device.handle() };

    let cuda_compute_capability = compute_capability(&q, &device)?;
    let pci_bus_id = pci_bus_id(&q, &device)?;
    Ok(Gpu {
        index,
        minor: q.on("nvmlDeviceGetMinorNumber", device.minor_number())?,
        product_name: q.on("nvmlDeviceGetName", device.name())?,
        brand: Brand::from_nvml_code(
            q.on("nvmlDeviceGetBrand", raw_u32(nvml, handle, RawQuery::Brand))?,
        ),
        architecture: Architecture::from_nvml_code(q.on(
            "nvmlDeviceGetArchitecture",
            raw_u32(nvml, handle, RawQuery::Architecture),
        )?),
        cuda_compute_capability,
        memory_bytes: q
            .on("nvmlDeviceGetMemoryInfo_v2", device.memory_info())?
            .total,
        multiprocessors: multiprocessors(&q, &device, cuda_compute_capability)?,
        pcie_root: sysfs.pcie_root(&uuid, &pci_bus_id)?,
        numa_node: sysfs.numa_node(&uuid, &pci_bus_id)?,
        pci_bus_id,
        nvlinks: nvlinks(&q, nvml, &device)?,
        fabric: fabric(&q, nvml, handle)?,
        mig: mig(&q, nvml, &device)?,
        uuid,
    })
}

fn compute_capability(q: &GpuQueries<'_>, device: &Device<'_>) -> Result<MajorMinor, NvmlError> {
    let query = "nvmlDeviceGetCudaComputeCapability";
    let cc = q.on(query, device.cuda_compute_capability())?;
    match (u32::try_from(cc.major), u32::try_from(cc.minor)) {
        (Ok(major), Ok(minor)) => Ok(MajorMinor::new(major, minor)),
        _ => q.on(
            query,
            Err(CallError::Malformed(format!(
                "compute capability {}.{}",
                cc.major, cc.minor
            ))),
        ),
    }
}

/// The GPU's PCI bus id, normalized to the extended BDF the model stores.
fn pci_bus_id(q: &GpuQueries<'_>, device: &Device<'_>) -> Result<String, NvmlError> {
    let query = "nvmlDeviceGetPciInfo_v3";
    let bus_id = q.on(query, device.pci_info())?.bus_id;
    q.on(
        query,
        normalize_bus_id(&bus_id)
            .ok_or_else(|| CallError::Malformed(format!("PCI bus id {bus_id:?}"))),
    )
}

enum RawQuery {
    Brand,
    Architecture,
}

/// Brand and architecture as raw NVML codes: nvml-wrapper refuses values newer than itself,
/// the model maps them (unknown ones to `Unknown`).
fn raw_u32(nvml: &Nvml, device: nvmlDevice_t, query: RawQuery) -> Result<u32, CallError> {
    let mut value = 0u32;
    let status = match query {
        RawQuery::Brand => {
            let get = sys_fn!(nvml, nvmlDeviceGetBrand)?;
            // SAFETY: `device` is a live GPU handle; NVML writes one enum value.
            unsafe { get(device, &mut value) }
        }
        RawQuery::Architecture => {
            let get = sys_fn!(nvml, nvmlDeviceGetArchitecture)?;
            // SAFETY: `device` is a live GPU handle; NVML writes one enum value.
            unsafe { get(device, &mut value) }
        }
    };
    check(status).map(|()| value)
}

/// CUDA cores per streaming multiprocessor by compute capability (as in the CUDA samples'
/// `_ConvertSMVer2Cores`). NVML reports SM counts only for MIG devices
/// (`nvmlDeviceGetAttributes_v2`), so a whole GPU's count is its core count
/// (`nvmlDeviceGetNumGpuCores`) divided by this. `None` for capabilities not in the table.
pub fn cuda_cores_per_multiprocessor(cc: MajorMinor) -> Option<u32> {
    match (cc.major, cc.minor) {
        (3, _) => Some(192),
        (5, _) => Some(128),
        (6, 0) => Some(64),
        (6, 1 | 2) => Some(128),
        (7, _) => Some(64),
        (8, 0) => Some(64),
        (8, 6 | 7 | 9) => Some(128),
        (9, 0) => Some(128),
        (10..=12, _) => Some(128),
        _ => None,
    }
}

fn multiprocessors(
    q: &GpuQueries<'_>,
    device: &Device<'_>,
    cc: MajorMinor,
) -> Result<u32, NvmlError> {
    match device.attributes() {
        Ok(attributes) => return Ok(attributes.multiprocessor_count),
        Err(WrapperError::NotSupported | WrapperError::FailedToLoadSymbol(_)) => {}
        Err(e) => return q.on("nvmlDeviceGetAttributes_v2", Err(e)),
    }
    let cores = q.on("nvmlDeviceGetNumGpuCores", device.num_cores())?;
    let per_sm = q.on(
        "nvmlDeviceGetNumGpuCores",
        cuda_cores_per_multiprocessor(cc).ok_or_else(|| {
            CallError::Malformed(format!(
                "cannot convert {cores} CUDA cores into multiprocessors: compute capability {cc} \
                 is unknown to Tessera"
            ))
        }),
    )?;
    Ok(cores / per_sm)
}

/// Every NVLink link of the GPU. Link indices run from 0 until NVML answers
/// `NVML_ERROR_INVALID_ARGUMENT` (past the GPU's last link); `NVML_ERROR_NOT_SUPPORTED` on link 0
/// means the GPU has no NVLink. An inactive link whose details NVML cannot give (no remote end
/// to describe) is left out: it connects nothing, so islands and bandwidth do not change.
fn nvlinks(q: &GpuQueries<'_>, nvml: &Nvml, device: &Device<'_>) -> Result<Vec<NvLink>, NvmlError> {
    let mut links = Vec::new();
    for link in 0..NVML_NVLINK_MAX_LINKS {
        let state = match device.link_wrapper_for(link).is_active() {
            Ok(true) => NvLinkState::Active,
            Ok(false) => NvLinkState::Inactive,
            Err(WrapperError::NotSupported | WrapperError::InvalidArg) => break,
            Err(e) => return q.on("nvmlDeviceGetNvLinkState", Err(e)),
        };
        match nvlink(q, nvml, device, link, state) {
            Ok(found) => links.push(found),
            Err(_) if state == NvLinkState::Inactive => {}
            Err(e) => return Err(e),
        }
    }
    Ok(links)
}

/// The details of one link: version, remote PCI bus id, remote device type.
fn nvlink(
    q: &GpuQueries<'_>,
    nvml: &Nvml,
    device: &Device<'_>,
    link: u32,
    state: NvLinkState,
) -> Result<NvLink, NvmlError> {
    let wrapper = device.link_wrapper_for(link);
    let code = q.on("nvmlDeviceGetNvLinkVersion", wrapper.version())?;
    let version = q.on(
        "nvmlDeviceGetNvLinkVersion",
        NvLinkVersion::from_nvml_code(code)
            .ok_or_else(|| CallError::Malformed(format!("NVLink version code {code}"))),
    )?;
    let query = "nvmlDeviceGetNvLinkRemotePciInfo_v2";
    let remote = q.on(query, wrapper.remote_pci_info())?;
    let remote_pci_bus_id = q.on(
        query,
        normalize_bus_id(&remote.bus_id)
            .ok_or_else(|| CallError::Malformed(format!("PCI bus id {:?}", remote.bus_id))),
    )?;
    // nvml-wrapper's `remote_device_type` discards NVML's answer, so call NVML directly.
    // SAFETY: the raw handle is passed back to NVML while `device` lives.
    let handle = unsafe { device.handle() };
    let remote_type = q.on(
        "nvmlDeviceGetNvLinkRemoteDeviceType",
        remote_type(nvml, handle, link),
    )?;
    Ok(NvLink {
        link,
        state,
        version,
        remote_type: NvLinkRemoteType::from_nvml_code(remote_type),
        remote_pci_bus_id,
    })
}

fn remote_type(nvml: &Nvml, device: nvmlDevice_t, link: u32) -> Result<u32, CallError> {
    let get = sys_fn!(nvml, nvmlDeviceGetNvLinkRemoteDeviceType)?;
    let mut value = 0u32;
    // SAFETY: `device` is a live GPU handle; NVML writes one enum value.
    check(unsafe { get(device, link, &mut value) }).map(|()| value)
}

/// Fabric membership via `nvmlDeviceGetGpuFabricInfoV` (v3, then v2 on drivers that only know
/// v2), or the unversioned `nvmlDeviceGetGpuFabricInfo` on drivers without the V call.
/// `NVML_ERROR_NOT_SUPPORTED` means no fabric.
fn fabric(
    q: &GpuQueries<'_>,
    nvml: &Nvml,
    device: nvmlDevice_t,
) -> Result<Option<FabricInfo>, NvmlError> {
    let read = match fabric_v(nvml, device) {
        Err(CallError::MissingSymbol(_)) => fabric_v1(nvml, device),
        other => other,
    };
    match read {
        Ok(info) => Ok(Some(info)),
        Err(CallError::Status(NvmlCode::NOT_SUPPORTED)) => Ok(None),
        Err(e) => q.on("nvmlDeviceGetGpuFabricInfoV", Err(e)),
    }
}

fn fabric_v(nvml: &Nvml, device: nvmlDevice_t) -> Result<FabricInfo, CallError> {
    let get = sys_fn!(nvml, nvmlDeviceGetGpuFabricInfoV)?;
    let mut last = CallError::Status(NvmlCode::ARGUMENT_VERSION_MISMATCH);
    for version in [3, 2] {
        // SAFETY: all-zero is a valid value of this plain C struct.
        let mut info: nvmlGpuFabricInfoV_t = unsafe { mem::zeroed() };
        // Version 2 of the struct is a prefix of version 3, so one buffer serves both.
        info.version = if version == 3 {
            struct_version::<nvmlGpuFabricInfoV_t>(3)
        } else {
            FABRIC_INFO_V2_SIZE | (2 << 24)
        };
        // SAFETY: `device` is a live GPU handle; `info` is large enough for the version named.
        match check(unsafe { get(device, &mut info) }) {
            Ok(()) => {
                return Ok(FabricInfo {
                    cluster_uuid: format_uuid(&info.clusterUuid),
                    clique_id: info.cliqueId,
                    state: FabricState::from_nvml_code(info.state),
                    status: info.status,
                    // Version 2 has no summary (the zeroed byte reads as not supported).
                    health: FabricHealth::from_nvml_code(info.healthSummary),
                });
            }
            Err(e @ CallError::Status(NvmlCode::ARGUMENT_VERSION_MISMATCH)) => last = e,
            Err(e) => return Err(e),
        }
    }
    Err(last)
}

/// `sizeof(nvmlGpuFabricInfo_v2_t)`: v3 minus its trailing `healthSummary` byte and padding.
const FABRIC_INFO_V2_SIZE: u32 =
    mem::size_of::<nvml_wrapper_sys::bindings::nvmlGpuFabricInfo_v2_t>() as u32;

fn fabric_v1(nvml: &Nvml, device: nvmlDevice_t) -> Result<FabricInfo, CallError> {
    let get = sys_fn!(nvml, nvmlDeviceGetGpuFabricInfo)?;
    // SAFETY: all-zero is a valid value of this plain C struct.
    let mut info: nvmlGpuFabricInfo_t = unsafe { mem::zeroed() };
    // SAFETY: `device` is a live GPU handle; NVML fills `info`.
    check(unsafe { get(device, &mut info) })?;
    Ok(FabricInfo {
        cluster_uuid: format_uuid(&info.clusterUuid),
        clique_id: info.cliqueId,
        state: FabricState::from_nvml_code(info.state),
        status: info.status,
        health: FabricHealth::NotSupported,
    })
}

/// MIG facts: `None` when the GPU is not MIG-capable (`nvmlDeviceGetMigMode` answers
/// `NVML_ERROR_NOT_SUPPORTED`).
pub(super) fn mig(
    q: &GpuQueries<'_>,
    nvml: &Nvml,
    device: &Device<'_>,
) -> Result<Option<MigState>, NvmlError> {
    let mode = match device.mig_mode() {
        Ok(mode) => mode,
        Err(WrapperError::NotSupported | WrapperError::FailedToLoadSymbol(_)) => return Ok(None),
        Err(e) => return q.on("nvmlDeviceGetMigMode", Err(e)),
    };
    // SAFETY: the raw handle is only passed back to NVML while `device` lives.
    let handle = unsafe { device.handle() };
    let enabled = mode.current == nvml_wrapper_sys::bindings::NVML_DEVICE_MIG_ENABLE;
    let nvml_profiles = q.on(
        "nvmlDeviceGetGpuInstanceProfileInfoV",
        mig_sys::gpu_instance_profiles(nvml, handle),
    )?;
    let profiles: Vec<MigProfile> = nvml_profiles.iter().map(mig_profile).collect();
    let instances = if enabled {
        mig_instances(q, nvml, handle, &profiles)?
    } else {
        Vec::new()
    };
    Ok(Some(MigState {
        enabled,
        profiles,
        instances,
    }))
}

pub(super) fn mig_profile(p: &mig_sys::GpuInstanceProfile) -> MigProfile {
    MigProfile {
        name: p.name.clone(),
        profile_index: p.index,
        profile_id: p.id,
        compute_slices: p.slice_count,
        memory_slices: p.placements.first().map_or(0, |&(_, size)| size),
        instance_count: p.instance_count,
        memory_bytes: p.memory_mib * MIB,
        multiprocessors: p.multiprocessors,
        engines: MigEngines {
            copy_engines: p.copy_engines,
            decoders: p.decoders,
            encoders: p.encoders,
            jpeg_engines: p.jpeg_engines,
            ofa_engines: p.ofa_engines,
        },
        p2p_supported: p.p2p_supported,
        placements: p.placements.iter().map(|&(start, _)| start).collect(),
    }
}

/// The MIG devices of a MIG-enabled GPU, one per MIG device handle.
fn mig_instances(
    q: &GpuQueries<'_>,
    nvml: &Nvml,
    device: nvmlDevice_t,
    profiles: &[MigProfile],
) -> Result<Vec<MigInstance>, NvmlError> {
    let handles = q.on(
        "nvmlDeviceGetMigDeviceHandleByIndex",
        mig_sys::mig_device_handles(nvml, device),
    )?;
    handles
        .into_iter()
        .map(|mig_handle| mig_instance(q, nvml, device, mig_handle, profiles))
        .collect()
}

pub(super) fn mig_instance(
    q: &GpuQueries<'_>,
    nvml: &Nvml,
    device: nvmlDevice_t,
    mig_handle: nvmlDevice_t,
    profiles: &[MigProfile],
) -> Result<MigInstance, NvmlError> {
    // SAFETY: `mig_handle` is a MIG device handle NVML just returned; `nvml` outlives the wrapper.
    let mig_device = unsafe { Device::new(mig_handle, nvml) };
    let uuid = q.on("nvmlDeviceGetUUID", mig_device.uuid())?;
    let on_mig = |query: &'static str, source: CallError| NvmlError::MigDeviceQuery {
        gpu: q.gpu.to_owned(),
        mig_device: uuid.clone(),
        query,
        source,
    };
    let (gpu_instance_id, compute_instance_id) = mig_sys::mig_device_instance_ids(nvml, mig_handle)
        .map_err(|e| on_mig("nvmlDeviceGetGpuInstanceId", e))?;
    let gpu_instance = mig_sys::gpu_instance_by_id(nvml, device, gpu_instance_id)
        .map_err(|e| on_mig("nvmlDeviceGetGpuInstanceById", e))?;
    let compute_instance =
        mig_sys::compute_instance_by_id(nvml, &gpu_instance, compute_instance_id)
            .map_err(|e| on_mig("nvmlGpuInstanceGetComputeInstanceById", e))?;
    let profile = profiles
        .iter()
        .find(|p| p.profile_id == gpu_instance.profile_id)
        .ok_or_else(|| {
            on_mig(
                "nvmlGpuInstanceGetInfo",
                CallError::Malformed(format!(
                    "GPU instance profile id {} is not among the GPU's profiles",
                    gpu_instance.profile_id
                )),
            )
        })?;
    let attributes = mig_device
        .attributes()
        .map_err(|e| on_mig("nvmlDeviceGetAttributes_v2", e.into()))?;
    Ok(MigInstance {
        profile: profile.name.clone(),
        gpu_instance_id,
        compute_instance_id,
        compute_instance_profile_id: compute_instance.profile_id,
        placement_start: gpu_instance.start,
        memory_bytes: attributes.memory_size_mb * MIB,
        multiprocessors: attributes.multiprocessor_count,
        engines: MigEngines {
            copy_engines: attributes.shared_copy_engine_count,
            decoders: attributes.shared_decoder_count,
            encoders: attributes.shared_encoder_count,
            jpeg_engines: attributes.shared_jpeg_count,
            ofa_engines: attributes.shared_ofa_count,
        },
        uuid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query_failing(gpu: &str, code: NvmlCode) -> NvmlError {
        NvmlError::DeviceQuery {
            gpu: gpu.to_owned(),
            query: "nvmlDeviceGetName",
            source: CallError::Status(code),
        }
    }

    #[test]
    fn only_gpu_is_lost_on_a_known_gpu_marks_it_lost() {
        let uuid = "GPU-41a89231-70e2-5ba4-b5a0-3ebf0c2cf235";
        assert_eq!(
            lost_gpu_uuid(&query_failing(uuid, NvmlCode::GPU_IS_LOST)),
            Some(uuid)
        );
        assert_eq!(
            lost_gpu_uuid(&query_failing(uuid, NvmlCode::UNKNOWN)),
            None,
            "other failures still fail the read"
        );
        assert_eq!(
            lost_gpu_uuid(&query_failing("with index 3", NvmlCode::GPU_IS_LOST)),
            None,
            "a GPU lost before its UUID was read cannot be named"
        );
    }

    #[test]
    fn cores_per_multiprocessor_by_capability() {
        assert_eq!(
            cuda_cores_per_multiprocessor(MajorMinor::new(8, 0)),
            Some(64)
        );
        assert_eq!(
            cuda_cores_per_multiprocessor(MajorMinor::new(8, 9)),
            Some(128)
        );
        assert_eq!(
            cuda_cores_per_multiprocessor(MajorMinor::new(9, 0)),
            Some(128)
        );
        assert_eq!(cuda_cores_per_multiprocessor(MajorMinor::new(1, 0)), None);
    }
}
