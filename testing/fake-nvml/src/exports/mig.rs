//! MIG: GPU-instance profiles and placements, GPU and compute instances. State changes are held
//! in the process (crate::driver); overlapping placements fail with
//! `NVML_ERROR_INSUFFICIENT_RESOURCES` as on real GPUs.

use std::ffi::c_uint;
use std::mem;

use nvml_wrapper_sys::bindings::{
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, NVML_GPU_INSTANCE_PROFILE_CAPS_P2P,
    NVML_GPU_INSTANCE_PROFILE_COUNT, nvmlComputeInstance_t, nvmlComputeInstanceInfo_t,
    nvmlComputeInstancePlacement_t, nvmlComputeInstanceProfileInfo_v2_t,
    nvmlComputeInstanceProfileInfo_v3_t, nvmlDevice_t, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t,
    nvmlGpuInstancePlacement_t, nvmlGpuInstanceProfileInfo_v2_t, nvmlGpuInstanceProfileInfo_v3_t,
    nvmlReturn_t,
};
use tessera_gpu_inventory::model::MigProfile;

use super::{fill, put, session, struct_version, versioned};
use crate::driver::Driver;
use crate::handles::Handle;
use crate::status::{
    ARGUMENT_VERSION_MISMATCH, INSUFFICIENT_SIZE, INVALID_ARGUMENT, NOT_FOUND, NOT_SUPPORTED,
    Status,
};

const MIB: u64 = 1 << 20;

/// The GPU-instance profile at `NVML_GPU_INSTANCE_PROFILE_*` index `index`.
fn profile_by_index(
    driver: &Driver,
    device: nvmlDevice_t,
    index: c_uint,
) -> Result<&MigProfile, Status> {
    let gpu = driver.mig_gpu(Handle::from_ptr(device))?;
    if index >= NVML_GPU_INSTANCE_PROFILE_COUNT {
        return Err(INVALID_ARGUMENT);
    }
    gpu.mig
        .as_ref()
        .and_then(|m| m.profiles.iter().find(|p| p.profile_index == index))
        .ok_or(NOT_SUPPORTED)
}

/// Versioned (`nvmlGpuInstanceProfileInfo_v2` or `_v3`). Names carry NVML's `MIG ` prefix.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoV(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    session(|driver, _| {
        let p = profile_by_index(driver, device, profile)?;
        // SAFETY: `info` is null or a readable struct starting with its version (nvml.h).
        let version = unsafe { struct_version(info) }?;
        let name = format!("MIG {}", p.name);
        if version == versioned::<nvmlGpuInstanceProfileInfo_v2_t>(2) {
            // SAFETY: all-zero is a valid value of this plain C struct.
            let mut answer: nvmlGpuInstanceProfileInfo_v2_t = unsafe { mem::zeroed() };
            answer.version = version;
            answer.id = p.profile_id;
            answer.isP2pSupported = c_uint::from(p.p2p_supported);
            answer.sliceCount = p.compute_slices;
            answer.instanceCount = p.instance_count;
            answer.multiprocessorCount = p.multiprocessors;
            answer.copyEngineCount = p.engines.copy_engines;
            answer.decoderCount = p.engines.decoders;
            answer.encoderCount = p.engines.encoders;
            answer.jpegCount = p.engines.jpeg_engines;
            answer.ofaCount = p.engines.ofa_engines;
            answer.memorySizeMB = p.memory_bytes / MIB;
            fill(&mut answer.name, &name);
            // SAFETY: a v2 caller's buffer is valid for writes of the v2 struct (nvml.h).
            unsafe { put(info, answer) }
        } else if version == versioned::<nvmlGpuInstanceProfileInfo_v3_t>(3) {
            // SAFETY: all-zero is a valid value of this plain C struct.
            let mut answer: nvmlGpuInstanceProfileInfo_v3_t = unsafe { mem::zeroed() };
            answer.version = version;
            answer.id = p.profile_id;
            answer.sliceCount = p.compute_slices;
            answer.instanceCount = p.instance_count;
            answer.multiprocessorCount = p.multiprocessors;
            answer.copyEngineCount = p.engines.copy_engines;
            answer.decoderCount = p.engines.decoders;
            answer.encoderCount = p.engines.encoders;
            answer.jpegCount = p.engines.jpeg_engines;
            answer.ofaCount = p.engines.ofa_engines;
            answer.memorySizeMB = p.memory_bytes / MIB;
            answer.capabilities = if p.p2p_supported {
                NVML_GPU_INSTANCE_PROFILE_CAPS_P2P
            } else {
                0
            };
            fill(&mut answer.name, &name);
            // SAFETY: a v3 caller's buffer is valid for writes of the v3 struct (nvml.h); the
            // pointer is non-null (checked above).
            unsafe { put(info.cast::<nvmlGpuInstanceProfileInfo_v3_t>(), answer) }
        } else {
            Err(ARGUMENT_VERSION_MISMATCH)
        }
    })
}

/// The GPU-instance profile with NVML profile id `id`.
fn profile_by_id(
    driver: &Driver,
    device: nvmlDevice_t,
    id: c_uint,
) -> Result<(u32, &MigProfile), Status> {
    let gpu = driver.mig_gpu(Handle::from_ptr(device))?;
    let profile = gpu
        .mig
        .as_ref()
        .and_then(|m| m.profiles.iter().find(|p| p.profile_id == id))
        .ok_or(INVALID_ARGUMENT)?;
    Ok((gpu.index, profile))
}

/// Two-call protocol: with a null array only the count is written.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placements: *mut nvmlGpuInstancePlacement_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    session(|driver, _| {
        let (_, profile) = profile_by_id(driver, device, profile_id)?;
        let all: Vec<nvmlGpuInstancePlacement_t> = profile
            .placements
            .iter()
            .map(|&start| nvmlGpuInstancePlacement_t {
                start,
                size: profile.memory_slices,
            })
            .collect();
        // SAFETY: `placements` is null or valid for `*count` elements and `count` is null or
        // valid for reads and writes (nvml.h).
        unsafe { put_array(placements, count, &all) }
    })
}

/// Writes `items` into a caller's array of `*count` elements and the number written into
/// `*count`; with a null array only the count. `NVML_ERROR_INSUFFICIENT_SIZE` (and the needed
/// count) when the array is too small.
///
/// # Safety
/// `count` is null or valid for reads and writes; `array` is null or valid for `*count` writes.
unsafe fn put_array<T: Copy>(array: *mut T, count: *mut c_uint, items: &[T]) -> Result<(), Status> {
    if count.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    let needed = items.len() as c_uint;
    if array.is_null() {
        // SAFETY: `count` is non-null and valid for writes by the contract.
        return unsafe { put(count, needed) };
    }
    // SAFETY: `count` is non-null and valid for reads by the contract.
    let room = unsafe { count.read() };
    if room < needed {
        // SAFETY: as above, for writes.
        unsafe { put(count, needed) }?;
        return Err(INSUFFICIENT_SIZE);
    }
    for (i, item) in items.iter().enumerate() {
        // SAFETY: `i < needed <= room`, and the array is valid for `room` writes.
        unsafe { array.add(i).write(*item) };
    }
    // SAFETY: `count` is non-null and valid for writes by the contract.
    unsafe { put(count, needed) }
}

/// Writes `items` into a caller's array sized by NVML's rules (`capacity`, a profile's
/// `instanceCount`) and their number into `*count` (an output only).
///
/// # Safety
/// `array` is null or valid for `capacity` writes; `count` is null or valid for a write.
unsafe fn put_list<T: Copy>(
    array: *mut T,
    capacity: c_uint,
    count: *mut c_uint,
    items: &[T],
) -> Result<(), Status> {
    if array.is_null() || count.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    if items.len() > capacity as usize {
        return Err(INSUFFICIENT_SIZE);
    }
    for (i, item) in items.iter().enumerate() {
        // SAFETY: `i < items.len() <= capacity`, and the array is valid for `capacity` writes.
        unsafe { array.add(i).write(*item) };
    }
    // SAFETY: `count` is non-null and valid for a write by the contract.
    unsafe { put(count, items.len() as c_uint) }
}

/// Lists GPU instances of one profile; the array must hold the profile's `instanceCount`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstances(
    device: nvmlDevice_t,
    profile_id: c_uint,
    instances: *mut nvmlGpuInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    session(|driver, _| {
        let (gpu, profile) = profile_by_id(driver, device, profile_id)?;
        let position = driver.inventory().gpus[gpu as usize]
            .mig
            .as_ref()
            .and_then(|m| {
                m.profiles
                    .iter()
                    .position(|p| p.profile_id == profile.profile_id)
            });
        let handles: Vec<nvmlGpuInstance_t> = driver
            .gpu_instances(gpu)
            .iter()
            .filter(|(_, state)| Some(state.profile) == position)
            .map(|(&id, _)| {
                Handle::GpuInstance {
                    gpu,
                    gpu_instance: id,
                }
                .as_ptr()
            })
            .collect();
        // SAFETY: the caller's array holds the profile's `instanceCount` handles (nvml.h);
        // `count` is null or valid for writes.
        unsafe { put_list(instances, profile.instance_count, count, &handles) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstanceWithPlacement(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placement: *const nvmlGpuInstancePlacement_t,
    gpu_instance: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    session(|driver, _| {
        if placement.is_null() || gpu_instance.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let gpu = driver.mig_gpu(Handle::from_ptr(device))?.index;
        // SAFETY: `placement` is non-null and readable (nvml.h).
        let wanted = unsafe { placement.read() };
        let id = driver.create_gpu_instance(gpu, profile_id, wanted.start, wanted.size)?;
        let handle = Handle::GpuInstance {
            gpu,
            gpu_instance: id,
        };
        // SAFETY: `gpu_instance` is non-null and valid for writes (nvml.h).
        unsafe { put(gpu_instance, handle.as_ptr()) }
    })
}

fn gpu_instance_ids(handle: nvmlGpuInstance_t) -> Result<(u32, u32), Status> {
    match Handle::from_ptr(handle) {
        Some(Handle::GpuInstance { gpu, gpu_instance }) => Ok((gpu, gpu_instance)),
        _ => Err(INVALID_ARGUMENT),
    }
}

/// `NVML_ERROR_IN_USE` while compute instances remain on the GPU instance.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlGpuInstanceDestroy(gpu_instance: nvmlGpuInstance_t) -> nvmlReturn_t {
    session(|driver, _| {
        let (gpu, id) = gpu_instance_ids(gpu_instance)?;
        driver.destroy_gpu_instance(gpu, id)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    device: nvmlDevice_t,
    id: c_uint,
    gpu_instance: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    session(|driver, _| {
        let gpu = driver.mig_gpu(Handle::from_ptr(device))?.index;
        if !driver.gpu_instances(gpu).contains_key(&id) {
            return Err(NOT_FOUND);
        }
        let handle = Handle::GpuInstance {
            gpu,
            gpu_instance: id,
        };
        // SAFETY: `gpu_instance` is null or valid for writes (nvml.h).
        unsafe { put(gpu_instance, handle.as_ptr()) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    gpu_instance: nvmlGpuInstance_t,
    info: *mut nvmlGpuInstanceInfo_t,
) -> nvmlReturn_t {
    session(|driver, _| {
        let (gpu, id) = gpu_instance_ids(gpu_instance)?;
        let (gpu_ref, state) = driver.gpu_instance(gpu, id)?;
        let profile = gpu_ref
            .mig
            .as_ref()
            .map(|m| &m.profiles[state.profile])
            .ok_or(NOT_SUPPORTED)?;
        let answer = nvmlGpuInstanceInfo_t {
            device: Handle::Gpu { gpu }.as_ptr(),
            id,
            profileId: profile.profile_id,
            placement: nvmlGpuInstancePlacement_t {
                start: state.start,
                size: profile.memory_slices,
            },
        };
        // SAFETY: `info` is null or valid for writes (nvml.h).
        unsafe { put(info, answer) }
    })
}

/// Versioned (`nvmlComputeInstanceProfileInfo_v2` or `_v3`); only the shared engine profile.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfoV(
    gpu_instance: nvmlGpuInstance_t,
    profile: c_uint,
    engine_profile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    session(|driver, _| {
        let (gpu, id) = gpu_instance_ids(gpu_instance)?;
        if engine_profile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
            return Err(NOT_SUPPORTED);
        }
        let (slices, gi_profile) = driver.compute_instance_profile(gpu, id, profile)?;
        // SAFETY: `info` is null or a readable struct starting with its version (nvml.h).
        let version = unsafe { struct_version(info) }?;
        // SAFETY: all-zero is a valid value of this plain C struct.
        let mut answer: nvmlComputeInstanceProfileInfo_v3_t = unsafe { mem::zeroed() };
        answer.version = version;
        answer.id = profile;
        answer.sliceCount = slices;
        answer.instanceCount = gi_profile.compute_slices / slices;
        answer.multiprocessorCount =
            gi_profile.multiprocessors * slices / gi_profile.compute_slices;
        answer.sharedCopyEngineCount = gi_profile.engines.copy_engines;
        answer.sharedDecoderCount = gi_profile.engines.decoders;
        answer.sharedEncoderCount = gi_profile.engines.encoders;
        answer.sharedJpegCount = gi_profile.engines.jpeg_engines;
        answer.sharedOfaCount = gi_profile.engines.ofa_engines;
        let name = if slices == gi_profile.compute_slices {
            format!("MIG {}", gi_profile.name)
        } else {
            format!("MIG {slices}c.{}", gi_profile.name)
        };
        fill(&mut answer.name, &name);
        if version == versioned::<nvmlComputeInstanceProfileInfo_v3_t>(3) {
            // SAFETY: a v3 caller's buffer is valid for writes of the v3 struct (nvml.h); the
            // pointer is non-null (checked above).
            unsafe { put(info.cast::<nvmlComputeInstanceProfileInfo_v3_t>(), answer) }
        } else if version == versioned::<nvmlComputeInstanceProfileInfo_v2_t>(2) {
            let v2 = nvmlComputeInstanceProfileInfo_v2_t {
                version,
                id: answer.id,
                sliceCount: answer.sliceCount,
                instanceCount: answer.instanceCount,
                multiprocessorCount: answer.multiprocessorCount,
                sharedCopyEngineCount: answer.sharedCopyEngineCount,
                sharedDecoderCount: answer.sharedDecoderCount,
                sharedEncoderCount: answer.sharedEncoderCount,
                sharedJpegCount: answer.sharedJpegCount,
                sharedOfaCount: answer.sharedOfaCount,
                name: answer.name,
            };
            // SAFETY: a v2 caller's buffer is valid for writes of the v2 struct (nvml.h).
            unsafe { put(info, v2) }
        } else {
            Err(ARGUMENT_VERSION_MISMATCH)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstance(
    gpu_instance: nvmlGpuInstance_t,
    profile_id: c_uint,
    compute_instance: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    session(|driver, _| {
        let (gpu, id) = gpu_instance_ids(gpu_instance)?;
        if compute_instance.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let ci = driver.create_compute_instance(gpu, id, profile_id)?;
        let handle = Handle::ComputeInstance {
            gpu,
            gpu_instance: id,
            compute_instance: ci,
        };
        // SAFETY: `compute_instance` is non-null and valid for writes (nvml.h).
        unsafe { put(compute_instance, handle.as_ptr()) }
    })
}

fn compute_instance_ids(handle: nvmlComputeInstance_t) -> Result<(u32, u32, u32), Status> {
    match Handle::from_ptr(handle) {
        Some(Handle::ComputeInstance {
            gpu,
            gpu_instance,
            compute_instance,
        }) => Ok((gpu, gpu_instance, compute_instance)),
        _ => Err(INVALID_ARGUMENT),
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlComputeInstanceDestroy(
    compute_instance: nvmlComputeInstance_t,
) -> nvmlReturn_t {
    session(|driver, _| {
        let (gpu, gi, ci) = compute_instance_ids(compute_instance)?;
        driver.destroy_compute_instance(gpu, gi, ci)
    })
}

/// Lists the compute instances of one compute-instance profile on a GPU instance.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    gpu_instance: nvmlGpuInstance_t,
    profile_id: c_uint,
    compute_instances: *mut nvmlComputeInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    session(|driver, _| {
        let (gpu, id) = gpu_instance_ids(gpu_instance)?;
        let (slices, gi_profile) = driver.compute_instance_profile(gpu, id, profile_id)?;
        let capacity = gi_profile.compute_slices / slices;
        let (_, state) = driver.gpu_instance(gpu, id)?;
        let handles: Vec<nvmlComputeInstance_t> = state
            .compute_instances
            .iter()
            .filter(|(_, ci)| ci.profile_id == profile_id)
            .map(|(&ci, _)| {
                Handle::ComputeInstance {
                    gpu,
                    gpu_instance: id,
                    compute_instance: ci,
                }
                .as_ptr()
            })
            .collect();
        // SAFETY: the caller's array holds the profile's `instanceCount` handles (nvml.h);
        // `count` is null or valid for writes.
        unsafe { put_list(compute_instances, capacity, count, &handles) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceById(
    gpu_instance: nvmlGpuInstance_t,
    id: c_uint,
    compute_instance: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    session(|driver, _| {
        let (gpu, gi) = gpu_instance_ids(gpu_instance)?;
        let (_, state) = driver.gpu_instance(gpu, gi)?;
        if !state.compute_instances.contains_key(&id) {
            return Err(NOT_FOUND);
        }
        let handle = Handle::ComputeInstance {
            gpu,
            gpu_instance: gi,
            compute_instance: id,
        };
        // SAFETY: `compute_instance` is null or valid for writes (nvml.h).
        unsafe { put(compute_instance, handle.as_ptr()) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo_v2(
    compute_instance: nvmlComputeInstance_t,
    info: *mut nvmlComputeInstanceInfo_t,
) -> nvmlReturn_t {
    session(|driver, _| {
        let (gpu, gi, ci) = compute_instance_ids(compute_instance)?;
        let (_, state) = driver.gpu_instance(gpu, gi)?;
        let compute = state.compute_instances.get(&ci).ok_or(INVALID_ARGUMENT)?;
        let answer = nvmlComputeInstanceInfo_t {
            device: Handle::Gpu { gpu }.as_ptr(),
            gpuInstance: Handle::GpuInstance {
                gpu,
                gpu_instance: gi,
            }
            .as_ptr(),
            id: ci,
            profileId: compute.profile_id,
            placement: nvmlComputeInstancePlacement_t {
                start: compute.start,
                size: compute.slices,
            },
        };
        // SAFETY: `info` is null or valid for writes (nvml.h).
        unsafe { put(info, answer) }
    })
}
