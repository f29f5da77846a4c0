//! Per-device queries: identity, versions, memory, multiprocessors, PCI, MIG mode and MIG device
//! handles, and scripted telemetry (utilization, power, temperature, ECC counts).

use std::ffi::{c_char, c_int, c_uint, c_ulonglong};
use std::mem;

use nvml_wrapper_sys::bindings::{
    nvmlBrandType_t, nvmlDevice_t, nvmlDeviceArchitecture_t, nvmlDeviceAttributes_t,
    nvmlEccCounterType_enum_NVML_AGGREGATE_ECC, nvmlEccCounterType_enum_NVML_VOLATILE_ECC,
    nvmlEccCounterType_t, nvmlMemory_t, nvmlMemory_v2_t,
    nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_CORRECTED,
    nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvmlMemoryErrorType_t,
    nvmlPciInfo_t, nvmlReturn_t, nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU,
    nvmlTemperatureSensors_t, nvmlUtilization_t,
};
use tessera_nvml::cuda_cores_per_multiprocessor;

use super::{fill, put, put_str, session, struct_version, versioned};
use crate::driver::{Driver, NvmlDevice};
use crate::handles::Handle;
use crate::samples::Sample;
use crate::status::{
    ARGUMENT_VERSION_MISMATCH, INVALID_ARGUMENT, NOT_FOUND, NOT_SUPPORTED, Status,
};

const MIB: u64 = 1 << 20;
/// PCI vendor id of NVIDIA in the low 16 bits of `pciDeviceId`.
const NVIDIA_VENDOR_ID: u32 = 0x10de;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    session(|driver, _| {
        let text = match driver.device_identity(Handle::from_ptr(device))? {
            NvmlDevice::Gpu(gpu) => &gpu.uuid,
            NvmlDevice::Mig {
                compute_instance, ..
            } => &compute_instance.uuid,
        };
        // SAFETY: `uuid` is null or valid for `length` bytes (nvml.h).
        unsafe { put_str(uuid, length, text) }
    })
}

/// Whole GPUs answer their product name; MIG devices `<product> MIG <profile>`, as NVML does.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    session(|driver, _| {
        let text = match driver.device(Handle::from_ptr(device))? {
            NvmlDevice::Gpu(gpu) => gpu.product_name.clone(),
            NvmlDevice::Mig { gpu, profile, .. } => {
                format!("{} MIG {}", gpu.product_name, profile.name)
            }
        };
        // SAFETY: `name` is null or valid for `length` bytes (nvml.h).
        unsafe { put_str(name, length, &text) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(
    device: nvmlDevice_t,
    index: *mut c_uint,
) -> nvmlReturn_t {
    session(|driver, _| {
        let gpu = driver.gpu(Handle::from_ptr(device))?;
        // SAFETY: `index` is null or valid for writes (nvml.h).
        unsafe { put(index, gpu.index) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: nvmlDevice_t,
    minor: *mut c_uint,
) -> nvmlReturn_t {
    session(|driver, _| {
        let gpu = driver.gpu(Handle::from_ptr(device))?;
        // SAFETY: `minor` is null or valid for writes (nvml.h).
        unsafe { put(minor, gpu.minor) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBrand(
    device: nvmlDevice_t,
    brand: *mut nvmlBrandType_t,
) -> nvmlReturn_t {
    session(|driver, _| {
        let gpu = driver.gpu(Handle::from_ptr(device))?;
        // SAFETY: `brand` is null or valid for writes (nvml.h).
        unsafe { put(brand, gpu.brand.nvml_code()) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetArchitecture(
    device: nvmlDevice_t,
    architecture: *mut nvmlDeviceArchitecture_t,
) -> nvmlReturn_t {
    session(|driver, _| {
        let gpu = driver.gpu(Handle::from_ptr(device))?;
        // SAFETY: `architecture` is null or valid for writes (nvml.h).
        unsafe { put(architecture, gpu.architecture.nvml_code()) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    session(|driver, _| {
        let cc = driver
            .gpu(Handle::from_ptr(device))?
            .cuda_compute_capability;
        if minor.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: `major` and `minor` are null or valid for writes (nvml.h); null is refused.
        unsafe {
            put(major, cc.major as c_int)?;
            put(minor, cc.minor as c_int)
        }
    })
}

/// Total and used memory of a GPU or MIG device in bytes: a whole GPU's use is scripted
/// ([`crate::samples`]), a MIG device's is 0.
fn memory_in_use(driver: &mut Driver, device: nvmlDevice_t) -> Result<(u64, u64), Status> {
    let (total, gpu) = match driver.device(Handle::from_ptr(device))? {
        NvmlDevice::Gpu(gpu) => (gpu.memory_bytes, Some(gpu.uuid.clone())),
        NvmlDevice::Mig {
            compute_instance, ..
        } => (compute_instance.memory_bytes, None),
    };
    let used = gpu.map_or(0, |uuid| driver.sample(&uuid).memory_used(total));
    Ok((total, used))
}

/// The scripted telemetry of a whole GPU; MIG device handles answer `NVML_ERROR_NOT_SUPPORTED`
/// (the fake scripts whole GPUs only).
fn gpu_sample(driver: &mut Driver, device: nvmlDevice_t) -> Result<Sample, Status> {
    let uuid = driver.gpu(Handle::from_ptr(device))?.uuid.clone();
    Ok(driver.sample(&uuid))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    session(|driver, _| {
        // Like NVML: a GPU in MIG mode reports no utilization (its MIG devices share it).
        if driver.gpu(Handle::from_ptr(device))?.mig_enabled() {
            return Err(NOT_SUPPORTED);
        }
        let sample = gpu_sample(driver, device)?;
        let rates = nvmlUtilization_t {
            gpu: sample.utilization,
            memory: sample.memory_utilization,
        };
        // SAFETY: `utilization` is null or valid for writes (nvml.h).
        unsafe { put(utilization, rates) }
    })
}

/// Milliwatts, as NVML reports.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: nvmlDevice_t,
    power: *mut c_uint,
) -> nvmlReturn_t {
    session(|driver, _| {
        let sample = gpu_sample(driver, device)?;
        // SAFETY: `power` is null or valid for writes (nvml.h).
        unsafe { put(power, sample.power_watts.saturating_mul(1000)) }
    })
}

/// Degrees Celsius of the one sensor NVML has, `NVML_TEMPERATURE_GPU`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: nvmlDevice_t,
    sensor: nvmlTemperatureSensors_t,
    temperature: *mut c_uint,
) -> nvmlReturn_t {
    session(|driver, _| {
        if sensor != nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU {
            return Err(INVALID_ARGUMENT);
        }
        let sample = gpu_sample(driver, device)?;
        // SAFETY: `temperature` is null or valid for writes (nvml.h).
        unsafe { put(temperature, sample.temperature) }
    })
}

/// Corrected or uncorrected ECC errors; the fake keeps one count per kind, which both the
/// volatile and the aggregate counter answer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: nvmlDevice_t,
    error_type: nvmlMemoryErrorType_t,
    counter_type: nvmlEccCounterType_t,
    count: *mut c_ulonglong,
) -> nvmlReturn_t {
    session(|driver, _| {
        if counter_type != nvmlEccCounterType_enum_NVML_VOLATILE_ECC
            && counter_type != nvmlEccCounterType_enum_NVML_AGGREGATE_ECC
        {
            return Err(INVALID_ARGUMENT);
        }
        let sample = gpu_sample(driver, device)?;
        let errors = if error_type == nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_CORRECTED {
            sample.ecc_corrected
        } else if error_type == nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_UNCORRECTED {
            sample.ecc_uncorrected
        } else {
            return Err(INVALID_ARGUMENT);
        };
        // SAFETY: `count` is null or valid for writes (nvml.h).
        unsafe { put(count, errors) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    session(|driver, _| {
        let (total, used) = memory_in_use(driver, device)?;
        let info = nvmlMemory_t {
            total,
            free: total - used,
            used,
        };
        // SAFETY: `memory` is null or valid for writes (nvml.h).
        unsafe { put(memory, info) }
    })
}

/// Versioned: the caller sets `version` to `nvmlMemory_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    session(|driver, _| {
        let (total, used) = memory_in_use(driver, device)?;
        // SAFETY: `memory` is null or a readable struct starting with its version (nvml.h).
        let version = unsafe { struct_version(memory) }?;
        if version != versioned::<nvmlMemory_v2_t>(2) {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        let info = nvmlMemory_v2_t {
            version,
            total,
            reserved: 0,
            free: total - used,
            used,
        };
        // SAFETY: `memory` is non-null (checked above) and valid for writes (nvml.h).
        unsafe { put(memory, info) }
    })
}

/// Engine counts of a MIG device. Like real NVML, whole GPUs answer `NVML_ERROR_NOT_SUPPORTED`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAttributes_v2(
    device: nvmlDevice_t,
    attributes: *mut nvmlDeviceAttributes_t,
) -> nvmlReturn_t {
    session(|driver, _| {
        let NvmlDevice::Mig {
            compute_instance,
            profile,
            ..
        } = driver.device(Handle::from_ptr(device))?
        else {
            return Err(NOT_SUPPORTED);
        };
        let info = nvmlDeviceAttributes_t {
            multiprocessorCount: compute_instance.multiprocessors,
            sharedCopyEngineCount: compute_instance.engines.copy_engines,
            sharedDecoderCount: compute_instance.engines.decoders,
            sharedEncoderCount: compute_instance.engines.encoders,
            sharedJpegCount: compute_instance.engines.jpeg_engines,
            sharedOfaCount: compute_instance.engines.ofa_engines,
            gpuInstanceSliceCount: profile.compute_slices,
            computeInstanceSliceCount: compute_instance.slices,
            memorySizeMB: compute_instance.memory_bytes / MIB,
        };
        // SAFETY: `attributes` is null or valid for writes (nvml.h).
        unsafe { put(attributes, info) }
    })
}

/// CUDA cores: multiprocessors × cores per multiprocessor of the compute capability.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNumGpuCores(
    device: nvmlDevice_t,
    cores: *mut c_uint,
) -> nvmlReturn_t {
    session(|driver, _| {
        let gpu = driver.gpu(Handle::from_ptr(device))?;
        let per_sm =
            cuda_cores_per_multiprocessor(gpu.cuda_compute_capability).ok_or(NOT_SUPPORTED)?;
        // SAFETY: `cores` is null or valid for writes (nvml.h).
        unsafe { put(cores, gpu.multiprocessors * per_sm) }
    })
}

/// The `nvmlPciInfo_t` of an extended BDF `dddd:bb:dd.f`, with NVML's upper-case eight-digit
/// domain `busId` (`00000000:3B:00.0`).
pub(super) fn pci_info(bus_id: &str) -> Result<nvmlPciInfo_t, Status> {
    let parse = || -> Option<(u32, u32, u32, u32)> {
        let (domain, rest) = bus_id.split_once(':')?;
        let (bus, rest) = rest.split_once(':')?;
        let (device, function) = rest.split_once('.')?;
        Some((
            u32::from_str_radix(domain, 16).ok()?,
            u32::from_str_radix(bus, 16).ok()?,
            u32::from_str_radix(device, 16).ok()?,
            u32::from_str_radix(function, 16).ok()?,
        ))
    };
    let (domain, bus, device, function) = parse().ok_or(INVALID_ARGUMENT)?;
    // SAFETY: all-zero is a valid value of this plain C struct.
    let mut info: nvmlPciInfo_t = unsafe { mem::zeroed() };
    info.domain = domain;
    info.bus = bus;
    info.device = device;
    info.pciDeviceId = NVIDIA_VENDOR_ID;
    fill(
        &mut info.busId,
        &format!("{domain:08X}:{bus:02X}:{device:02X}.{function:X}"),
    );
    fill(
        &mut info.busIdLegacy,
        &format!("{domain:04X}:{bus:02X}:{device:02X}.{function:X}"),
    );
    Ok(info)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    session(|driver, _| {
        let info = pci_info(&driver.gpu(Handle::from_ptr(device))?.pci_bus_id)?;
        // SAFETY: `pci` is null or valid for writes (nvml.h).
        unsafe { put(pci, info) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    session(|driver, _| {
        let gpu = driver.mig_gpu(Handle::from_ptr(device))?;
        let mode = c_uint::from(gpu.mig_enabled());
        if pending.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: `current` and `pending` are null or valid for writes (nvml.h); null is refused.
        unsafe {
            put(current, mode)?;
            put(pending, mode)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: nvmlDevice_t,
    is_mig_device: *mut c_uint,
) -> nvmlReturn_t {
    session(|driver, _| {
        let is_mig = matches!(
            driver.device(Handle::from_ptr(device))?,
            NvmlDevice::Mig { .. }
        );
        // SAFETY: `is_mig_device` is null or valid for writes (nvml.h).
        unsafe { put(is_mig_device, c_uint::from(is_mig)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig_device: nvmlDevice_t,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    session(|driver, _| {
        let NvmlDevice::Mig { gpu, .. } = driver.device(Handle::from_ptr(mig_device))? else {
            return Err(INVALID_ARGUMENT);
        };
        let handle = Handle::Gpu { gpu: gpu.index };
        // SAFETY: `device` is null or valid for writes (nvml.h).
        unsafe { put(device, handle.as_ptr()) }
    })
}

/// As many MIG devices as the GPU has compute slices.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    session(|driver, _| {
        let gpu = driver.mig_gpu(Handle::from_ptr(device))?;
        let slices = gpu.mig.as_ref().map_or(0, |m| m.compute_slice_count());
        // SAFETY: `count` is null or valid for writes (nvml.h).
        unsafe { put(count, slices) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    mig_device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    session(|driver, _| {
        let gpu = driver.mig_gpu(Handle::from_ptr(device))?;
        let max = gpu.mig.as_ref().map_or(0, |m| m.compute_slice_count());
        if index >= max {
            return Err(INVALID_ARGUMENT);
        }
        let (gpu_instance, compute_instance) = *driver
            .mig_devices(gpu.index)
            .get(index as usize)
            .ok_or(NOT_FOUND)?;
        let handle = Handle::MigDevice {
            gpu: gpu.index,
            gpu_instance,
            compute_instance,
        };
        // SAFETY: `mig_device` is null or valid for writes (nvml.h).
        unsafe { put(mig_device, handle.as_ptr()) }
    })
}

fn mig_device_ids(device: nvmlDevice_t) -> Result<(u32, u32), Status> {
    match Handle::from_ptr(device) {
        Some(Handle::MigDevice {
            gpu_instance,
            compute_instance,
            ..
        }) => Ok((gpu_instance, compute_instance)),
        Some(Handle::Gpu { .. }) => Err(NOT_SUPPORTED),
        _ => Err(INVALID_ARGUMENT),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    session(|driver, _| {
        driver.device(Handle::from_ptr(device))?;
        let (gpu_instance, _) = mig_device_ids(device)?;
        // SAFETY: `id` is null or valid for writes (nvml.h).
        unsafe { put(id, gpu_instance) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    session(|driver, _| {
        driver.device(Handle::from_ptr(device))?;
        let (_, compute_instance) = mig_device_ids(device)?;
        // SAFETY: `id` is null or valid for writes (nvml.h).
        unsafe { put(id, compute_instance) }
    })
}
