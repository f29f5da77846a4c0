//! MIG device management for dynamic MIG: create a GPU instance + compute instance at a chosen
//! placement, destroy them, list them. Policy-free: the caller picks profile and placement.

use nvml_wrapper::error::NvmlError as WrapperError;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::nvmlDevice_t;

use super::error::{CallError, NvmlCode, NvmlError};
use super::mig_sys::{self, ComputeInstance, GpuInstance};
use super::read::{self, GpuQueries};
use tessera_gpu_inventory::model::{MigInstance, MigProfile};

fn device_by_uuid<'n>(nvml: &'n Nvml, gpu_uuid: &str) -> Result<Device<'n>, NvmlError> {
    nvml.device_by_uuid(gpu_uuid).map_err(|e| match e {
        WrapperError::NotFound | WrapperError::InvalidArg => NvmlError::UnknownGpu {
            uuid: gpu_uuid.to_owned(),
        },
        e => NvmlError::DeviceQuery {
            gpu: gpu_uuid.to_owned(),
            query: "nvmlDeviceGetHandleByUUID",
            source: e.into(),
        },
    })
}

pub(super) fn list(nvml: &Nvml, gpu_uuid: &str) -> Result<Vec<MigInstance>, NvmlError> {
    let device = device_by_uuid(nvml, gpu_uuid)?;
    let q = GpuQueries { gpu: gpu_uuid };
    Ok(read::mig(&q, nvml, &device)?
        .map(|state| state.instances)
        .unwrap_or_default())
}

/// The profile named `profile_name` among `profiles`, when it may start at memory slice `start`.
fn placeable_profile<'a>(
    profiles: &'a [MigProfile],
    gpu_uuid: &str,
    profile_name: &str,
    start: u32,
) -> Result<&'a MigProfile, NvmlError> {
    let profile = profiles
        .iter()
        .find(|p| p.name == profile_name)
        .ok_or_else(|| NvmlError::UnknownMigProfile {
            gpu: gpu_uuid.to_owned(),
            profile: profile_name.to_owned(),
            available: join(profiles.iter().map(|p| p.name.clone())),
        })?;
    if !profile.placements.contains(&start) {
        return Err(NvmlError::InvalidMigPlacement {
            gpu: gpu_uuid.to_owned(),
            profile: profile_name.to_owned(),
            start,
            valid: join(profile.placements.iter().map(u32::to_string)),
        });
    }
    Ok(profile)
}

pub(super) fn create(
    nvml: &Nvml,
    gpu_uuid: &str,
    profile_name: &str,
    start: u32,
) -> Result<MigInstance, NvmlError> {
    let device = device_by_uuid(nvml, gpu_uuid)?;
    let q = GpuQueries { gpu: gpu_uuid };
    // SAFETY: the raw handle is only passed back to NVML while `device` lives.
    let handle = unsafe { device.handle() };
    let profiles: Vec<MigProfile> = q
        .on(
            "nvmlDeviceGetGpuInstanceProfileInfoV",
            mig_sys::gpu_instance_profiles(nvml, handle),
        )?
        .iter()
        .map(read::mig_profile)
        .collect();
    let profile = placeable_profile(&profiles, gpu_uuid, profile_name, start)?;
    let failed = |what: &'static str, source: CallError| NvmlError::MigCreate {
        gpu: gpu_uuid.to_owned(),
        profile: profile_name.to_owned(),
        start,
        what,
        source,
    };

    let gpu_instance = mig_sys::create_gpu_instance(
        nvml,
        handle,
        profile.profile_id,
        start,
        profile.memory_slices,
    )
    .map_err(|e| match e {
        CallError::Status(NvmlCode::INSUFFICIENT_RESOURCES) => NvmlError::MigPlacementUnavailable {
            gpu: gpu_uuid.to_owned(),
            profile: profile_name.to_owned(),
            start,
        },
        e => failed("GPU instance", e),
    })?;

    let finish = || -> Result<MigInstance, NvmlError> {
        let compute_profile = mig_sys::compute_instance_profiles(nvml, &gpu_instance)
            .map_err(|e| failed("compute instance", e))?
            .into_iter()
            .filter(|p| p.slice_count <= profile.compute_slices)
            .max_by_key(|p| p.slice_count)
            .ok_or_else(|| {
                failed(
                    "compute instance",
                    CallError::Malformed(
                        "the GPU instance offers no compute-instance profile".into(),
                    ),
                )
            })?;
        let compute_instance =
            mig_sys::create_compute_instance(nvml, &gpu_instance, compute_profile.id)
                .map_err(|e| failed("compute instance", e))?;
        describe(
            &q,
            nvml,
            handle,
            &gpu_instance,
            &compute_instance,
            &profiles,
        )
        .inspect_err(|_| {
            // Leave nothing half-created: the compute instance goes too.
            let _ = mig_sys::destroy_compute_instance(nvml, &compute_instance);
        })
    };
    finish().inspect_err(|_| {
        // Best effort: the error being returned matters more than a failed rollback.
        let _ = mig_sys::destroy_gpu_instance(nvml, &gpu_instance);
    })
}

/// The MIG device backed by `compute_instance`, read back through its MIG device handle.
fn describe(
    q: &GpuQueries<'_>,
    nvml: &Nvml,
    device: nvmlDevice_t,
    gpu_instance: &GpuInstance,
    compute_instance: &ComputeInstance,
    profiles: &[MigProfile],
) -> Result<MigInstance, NvmlError> {
    let handles = q.on(
        "nvmlDeviceGetMigDeviceHandleByIndex",
        mig_sys::mig_device_handles(nvml, device),
    )?;
    for mig_handle in handles {
        let ids = q.on(
            "nvmlDeviceGetGpuInstanceId",
            mig_sys::mig_device_instance_ids(nvml, mig_handle),
        )?;
        if ids == (gpu_instance.id, compute_instance.id) {
            return read::mig_instance(q, nvml, device, mig_handle, profiles);
        }
    }
    Err(NvmlError::UnknownMigDevice {
        gpu: q.gpu.to_owned(),
        gpu_instance_id: gpu_instance.id,
        compute_instance_id: compute_instance.id,
    })
}

pub(super) fn destroy(
    nvml: &Nvml,
    gpu_uuid: &str,
    gpu_instance_id: u32,
    compute_instance_id: u32,
) -> Result<(), NvmlError> {
    let device = device_by_uuid(nvml, gpu_uuid)?;
    // SAFETY: the raw handle is only passed back to NVML while `device` lives.
    let handle = unsafe { device.handle() };
    let unknown = || NvmlError::UnknownMigDevice {
        gpu: gpu_uuid.to_owned(),
        gpu_instance_id,
        compute_instance_id,
    };
    let not_found = |e: &CallError| {
        matches!(
            e.code(),
            Some(NvmlCode::NOT_FOUND | NvmlCode::INVALID_ARGUMENT)
        )
    };
    let gpu_instance = match mig_sys::gpu_instance_by_id(nvml, handle, gpu_instance_id) {
        Ok(gi) => gi,
        Err(e) if not_found(&e) => return Err(unknown()),
        Err(source) => {
            return Err(destroy_failed(
                gpu_uuid,
                "GPU instance",
                gpu_instance_id,
                source,
            ));
        }
    };
    let compute_instance =
        match mig_sys::compute_instance_by_id(nvml, &gpu_instance, compute_instance_id) {
            Ok(ci) => ci,
            Err(e) if not_found(&e) => return Err(unknown()),
            Err(source) => {
                return Err(destroy_failed(
                    gpu_uuid,
                    "compute instance",
                    compute_instance_id,
                    source,
                ));
            }
        };
    mig_sys::destroy_compute_instance(nvml, &compute_instance).map_err(|source| {
        destroy_failed(gpu_uuid, "compute instance", compute_instance_id, source)
    })?;
    let remaining = mig_sys::compute_instances(nvml, &gpu_instance)
        .map_err(|source| destroy_failed(gpu_uuid, "GPU instance", gpu_instance_id, source))?;
    if remaining.is_empty() {
        mig_sys::destroy_gpu_instance(nvml, &gpu_instance)
            .map_err(|source| destroy_failed(gpu_uuid, "GPU instance", gpu_instance_id, source))?;
    }
    Ok(())
}

fn destroy_failed(gpu: &str, what: &'static str, id: u32, source: CallError) -> NvmlError {
    NvmlError::MigDestroy {
        gpu: gpu.to_owned(),
        what,
        id,
        source,
    }
}

fn join(items: impl Iterator<Item = String>) -> String {
    let items: Vec<String> = items.collect();
    if items.is_empty() {
        "(none)".to_owned()
    } else {
        items.join(", ")
    }
}
