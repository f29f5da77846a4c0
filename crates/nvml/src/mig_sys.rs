//! MIG through nvml-wrapper-sys: GPU-instance profiles and placements, GPU and compute instances,
//! MIG device handles. nvml-wrapper wraps only a few of these (and none of the instance
//! management), so this module calls the C functions itself. Everything here is a thin, typed
//! shell over one NVML call; policy (which profile, which placement) lives in the callers.

use std::mem;
use std::ptr;

use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::{
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, NVML_COMPUTE_INSTANCE_PROFILE_COUNT,
    NVML_GPU_INSTANCE_PROFILE_COUNT, nvmlComputeInstance_t, nvmlComputeInstanceInfo_t,
    nvmlComputeInstanceProfileInfo_v2_t, nvmlDevice_t, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t,
    nvmlGpuInstancePlacement_t, nvmlGpuInstanceProfileInfo_v2_t,
};

use super::error::{CallError, NvmlCode};
use super::ffi::{check, string_from_buffer, struct_version, sys_fn};

/// One GPU-instance profile a GPU offers (`nvmlGpuInstanceProfileInfo_v2_t`), with the
/// placements at which it can be created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GpuInstanceProfile {
    /// The `NVML_GPU_INSTANCE_PROFILE_*` index the profile was queried with.
    pub index: u32,
    /// The profile id NVML reports (used to create and list GPU instances).
    pub id: u32,
    /// Profile name without NVML's `MIG ` prefix, e.g. `1g.10gb`.
    pub name: String,
    pub slice_count: u32,
    pub instance_count: u32,
    pub multiprocessors: u32,
    pub copy_engines: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpeg_engines: u32,
    pub ofa_engines: u32,
    pub memory_mib: u64,
    pub p2p_supported: bool,
    /// `(start, size)` in memory slices.
    pub placements: Vec<(u32, u32)>,
}

/// A GPU instance that exists (`nvmlGpuInstanceInfo_t`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct GpuInstance {
    pub handle: nvmlGpuInstance_t,
    pub id: u32,
    pub profile_id: u32,
    /// First memory slice of the placement.
    pub start: u32,
}

/// A compute instance that exists (`nvmlComputeInstanceInfo_t`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ComputeInstance {
    pub handle: nvmlComputeInstance_t,
    pub id: u32,
    pub profile_id: u32,
}

/// A compute-instance profile of a GPU instance (`nvmlComputeInstanceProfileInfo_v2_t`).
#[derive(Debug, Clone)]
pub(crate) struct ComputeInstanceProfile {
    pub id: u32,
    pub slice_count: u32,
    pub instance_count: u32,
}

/// Strips NVML's `MIG ` prefix from a profile name (`MIG 1g.10gb` → `1g.10gb`).
pub(crate) fn profile_name(nvml_name: &str) -> &str {
    nvml_name.strip_prefix("MIG ").unwrap_or(nvml_name).trim()
}

/// Every GPU-instance profile `device` offers. Profile ids the GPU does not support answer
/// `NVML_ERROR_NOT_SUPPORTED` or `NVML_ERROR_INVALID_ARGUMENT` and are skipped.
pub(crate) fn gpu_instance_profiles(
    nvml: &Nvml,
    device: nvmlDevice_t,
) -> Result<Vec<GpuInstanceProfile>, CallError> {
    let get_info = sys_fn!(nvml, nvmlDeviceGetGpuInstanceProfileInfoV)?;
    let mut profiles = Vec::new();
    for profile in 0..NVML_GPU_INSTANCE_PROFILE_COUNT {
        // SAFETY: all-zero is a valid value of this plain C struct.
        let mut info: nvmlGpuInstanceProfileInfo_v2_t = unsafe { mem::zeroed() };
        info.version = struct_version::<nvmlGpuInstanceProfileInfo_v2_t>(2);
        // SAFETY: `device` is a handle NVML gave us; `info` is a live, versioned v2 struct NVML
        // writes into and does not keep.
        let status = unsafe { get_info(device, profile, &mut info) };
        match check(status) {
            Ok(()) => {}
            Err(CallError::Status(NvmlCode::NOT_SUPPORTED | NvmlCode::INVALID_ARGUMENT)) => {
                continue;
            }
            Err(e) => return Err(e),
        }
        let name = string_from_buffer(&info.name)?;
        profiles.push(GpuInstanceProfile {
            index: profile,
            id: info.id,
            name: profile_name(&name).to_owned(),
            slice_count: info.sliceCount,
            instance_count: info.instanceCount,
            multiprocessors: info.multiprocessorCount,
            copy_engines: info.copyEngineCount,
            decoders: info.decoderCount,
            encoders: info.encoderCount,
            jpeg_engines: info.jpegCount,
            ofa_engines: info.ofaCount,
            memory_mib: info.memorySizeMB,
            p2p_supported: info.isP2pSupported != 0,
            placements: possible_placements(nvml, device, info.id)?,
        });
    }
    Ok(profiles)
}

fn possible_placements(
    nvml: &Nvml,
    device: nvmlDevice_t,
    profile_id: u32,
) -> Result<Vec<(u32, u32)>, CallError> {
    let get = sys_fn!(nvml, nvmlDeviceGetGpuInstancePossiblePlacements_v2)?;
    let mut count = 0u32;
    // SAFETY: with a null array NVML only writes the number of placements into `count`.
    check(unsafe { get(device, profile_id, ptr::null_mut(), &mut count) })?;
    let mut placements = vec![nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
    // SAFETY: `placements` holds `count` elements, and `count` tells NVML so.
    check(unsafe { get(device, profile_id, placements.as_mut_ptr(), &mut count) })?;
    placements.truncate(count as usize);
    Ok(placements.iter().map(|p| (p.start, p.size)).collect())
}

/// The GPU instance with NVML id `id` on `device`.
pub(crate) fn gpu_instance_by_id(
    nvml: &Nvml,
    device: nvmlDevice_t,
    id: u32,
) -> Result<GpuInstance, CallError> {
    let get = sys_fn!(nvml, nvmlDeviceGetGpuInstanceById)?;
    let mut handle: nvmlGpuInstance_t = ptr::null_mut();
    // SAFETY: NVML writes one handle into `handle`.
    check(unsafe { get(device, id, &mut handle) })?;
    gpu_instance_info(nvml, handle)
}

fn gpu_instance_info(nvml: &Nvml, handle: nvmlGpuInstance_t) -> Result<GpuInstance, CallError> {
    let get = sys_fn!(nvml, nvmlGpuInstanceGetInfo)?;
    // SAFETY: all-zero (null pointers, zero ids) is a valid value of this plain C struct.
    let mut info: nvmlGpuInstanceInfo_t = unsafe { mem::zeroed() };
    // SAFETY: `handle` came from NVML; NVML fills `info` and does not keep it.
    check(unsafe { get(handle, &mut info) })?;
    Ok(GpuInstance {
        handle,
        id: info.id,
        profile_id: info.profileId,
        start: info.placement.start,
    })
}

/// Creates a GPU instance of `profile_id` at memory slice `start`.
pub(crate) fn create_gpu_instance(
    nvml: &Nvml,
    device: nvmlDevice_t,
    profile_id: u32,
    start: u32,
    size: u32,
) -> Result<GpuInstance, CallError> {
    let create = sys_fn!(nvml, nvmlDeviceCreateGpuInstanceWithPlacement)?;
    let placement = nvmlGpuInstancePlacement_t { start, size };
    let mut handle: nvmlGpuInstance_t = ptr::null_mut();
    // SAFETY: `placement` lives across the call and is only read; NVML writes one handle.
    check(unsafe { create(device, profile_id, &placement, &mut handle) })?;
    gpu_instance_info(nvml, handle)
}

/// Destroys a GPU instance (which must have no compute instances left).
pub(crate) fn destroy_gpu_instance(nvml: &Nvml, instance: &GpuInstance) -> Result<(), CallError> {
    let destroy = sys_fn!(nvml, nvmlGpuInstanceDestroy)?;
    // SAFETY: the handle came from NVML for an instance that still existed when looked up.
    check(unsafe { destroy(instance.handle) })
}

/// The compute-instance profiles of a GPU instance (shared engines), skipping unsupported ids.
pub(crate) fn compute_instance_profiles(
    nvml: &Nvml,
    instance: &GpuInstance,
) -> Result<Vec<ComputeInstanceProfile>, CallError> {
    let get_info = sys_fn!(nvml, nvmlGpuInstanceGetComputeInstanceProfileInfoV)?;
    let mut profiles = Vec::new();
    for profile in 0..NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
        // SAFETY: all-zero is a valid value of this plain C struct.
        let mut info: nvmlComputeInstanceProfileInfo_v2_t = unsafe { mem::zeroed() };
        info.version = struct_version::<nvmlComputeInstanceProfileInfo_v2_t>(2);
        // SAFETY: the GPU-instance handle came from NVML; `info` is a live, versioned struct.
        let status = unsafe {
            get_info(
                instance.handle,
                profile,
                NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                &mut info,
            )
        };
        match check(status) {
            Ok(()) => profiles.push(ComputeInstanceProfile {
                id: info.id,
                slice_count: info.sliceCount,
                instance_count: info.instanceCount,
            }),
            Err(CallError::Status(NvmlCode::NOT_SUPPORTED | NvmlCode::INVALID_ARGUMENT)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(profiles)
}

/// The compute instances that exist on a GPU instance, over all compute-instance profiles.
pub(crate) fn compute_instances(
    nvml: &Nvml,
    instance: &GpuInstance,
) -> Result<Vec<ComputeInstance>, CallError> {
    let list = sys_fn!(nvml, nvmlGpuInstanceGetComputeInstances)?;
    let mut found = Vec::new();
    for profile in compute_instance_profiles(nvml, instance)? {
        let mut handles: Vec<nvmlComputeInstance_t> =
            vec![ptr::null_mut(); profile.instance_count.max(1) as usize];
        let mut count = 0u32;
        // SAFETY: `handles` has room for `instance_count` handles, the most NVML can return for
        // this profile; NVML writes how many it filled into `count`.
        check(unsafe {
            list(
                instance.handle,
                profile.id,
                handles.as_mut_ptr(),
                &mut count,
            )
        })?;
        handles.truncate(count as usize);
        for handle in handles {
            found.push(compute_instance_info(nvml, handle)?);
        }
    }
    found.sort_by_key(|ci| ci.id);
    Ok(found)
}

/// The compute instance with NVML id `id` on a GPU instance.
pub(crate) fn compute_instance_by_id(
    nvml: &Nvml,
    instance: &GpuInstance,
    id: u32,
) -> Result<ComputeInstance, CallError> {
    let get = sys_fn!(nvml, nvmlGpuInstanceGetComputeInstanceById)?;
    let mut handle: nvmlComputeInstance_t = ptr::null_mut();
    // SAFETY: NVML writes one handle into `handle`.
    check(unsafe { get(instance.handle, id, &mut handle) })?;
    compute_instance_info(nvml, handle)
}

fn compute_instance_info(
    nvml: &Nvml,
    handle: nvmlComputeInstance_t,
) -> Result<ComputeInstance, CallError> {
    let get = sys_fn!(nvml, nvmlComputeInstanceGetInfo_v2)?;
    // SAFETY: all-zero (null pointers, zero ids) is a valid value of this plain C struct.
    let mut info: nvmlComputeInstanceInfo_t = unsafe { mem::zeroed() };
    // SAFETY: `handle` came from NVML; NVML fills `info` and does not keep it.
    check(unsafe { get(handle, &mut info) })?;
    Ok(ComputeInstance {
        handle,
        id: info.id,
        profile_id: info.profileId,
    })
}

/// Creates a compute instance of `profile_id` on a GPU instance.
pub(crate) fn create_compute_instance(
    nvml: &Nvml,
    instance: &GpuInstance,
    profile_id: u32,
) -> Result<ComputeInstance, CallError> {
    let create = sys_fn!(nvml, nvmlGpuInstanceCreateComputeInstance)?;
    let mut handle: nvmlComputeInstance_t = ptr::null_mut();
    // SAFETY: the GPU-instance handle came from NVML; NVML writes one handle.
    check(unsafe { create(instance.handle, profile_id, &mut handle) })?;
    compute_instance_info(nvml, handle)
}

/// Destroys a compute instance.
pub(crate) fn destroy_compute_instance(
    nvml: &Nvml,
    instance: &ComputeInstance,
) -> Result<(), CallError> {
    let destroy = sys_fn!(nvml, nvmlComputeInstanceDestroy)?;
    // SAFETY: the handle came from NVML for an instance that still existed when looked up.
    check(unsafe { destroy(instance.handle) })
}

/// The MIG device handles of a MIG-enabled GPU: every index below `nvmlDeviceGetMaxMigDeviceCount`
/// that holds one (`NVML_ERROR_NOT_FOUND` marks an empty index).
pub(crate) fn mig_device_handles(
    nvml: &Nvml,
    device: nvmlDevice_t,
) -> Result<Vec<nvmlDevice_t>, CallError> {
    let max_count = sys_fn!(nvml, nvmlDeviceGetMaxMigDeviceCount)?;
    let by_index = sys_fn!(nvml, nvmlDeviceGetMigDeviceHandleByIndex)?;
    let mut max = 0u32;
    // SAFETY: NVML writes one integer into `max`.
    check(unsafe { max_count(device, &mut max) })?;
    let mut handles = Vec::new();
    for index in 0..max {
        let mut handle: nvmlDevice_t = ptr::null_mut();
        // SAFETY: NVML writes one handle into `handle`.
        match check(unsafe { by_index(device, index, &mut handle) }) {
            Ok(()) => handles.push(handle),
            Err(CallError::Status(NvmlCode::NOT_FOUND)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(handles)
}

/// The GPU-instance and compute-instance ids of a MIG device handle.
pub(crate) fn mig_device_instance_ids(
    nvml: &Nvml,
    mig_device: nvmlDevice_t,
) -> Result<(u32, u32), CallError> {
    let gi = sys_fn!(nvml, nvmlDeviceGetGpuInstanceId)?;
    let ci = sys_fn!(nvml, nvmlDeviceGetComputeInstanceId)?;
    let (mut gi_id, mut ci_id) = (0u32, 0u32);
    // SAFETY: `mig_device` is a MIG device handle from NVML; NVML writes one integer each.
    check(unsafe { gi(mig_device, &mut gi_id) })?;
    // SAFETY: as above.
    check(unsafe { ci(mig_device, &mut ci_id) })?;
    Ok((gi_id, ci_id))
}

#[cfg(test)]
mod tests {
    use super::profile_name;

    #[test]
    fn profile_names_lose_the_mig_prefix() {
        assert_eq!(profile_name("MIG 1g.10gb"), "1g.10gb");
        assert_eq!(profile_name("MIG 1g.10gb+me"), "1g.10gb+me");
        assert_eq!(profile_name("3g.40gb"), "3g.40gb");
    }
}
