//! The exported CUDA driver API functions. Names and signatures follow `cuda.h` (CUDA 12): a
//! `CUresult` (`int`) return, `CUdevice` = `int`, `CUuuid` = 16 bytes.
//!
//! Contract for callers (as in `cuda.h`): pointer arguments are null or valid for the writes the
//! CUDA documentation describes; string buffers are valid for `len` bytes. Null out-pointers are
//! refused with `CUDA_ERROR_INVALID_VALUE`. That contract is the `# Safety` section of every
//! `unsafe extern "C" fn` here, which is why `missing_safety_doc` is allowed.
//!
//! No panic crosses the ABI: each body runs under `catch_unwind`; a panic becomes
//! `CUDA_ERROR_UNKNOWN`.
#![allow(unsafe_code, non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{CStr, c_char, c_int, c_uint};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;

use tessera_gpu_inventory::GpuInventory;
use tessera_nvml::NvmlSource;

use crate::devices::{self, CudaDevice};
use crate::mps;

pub type CUresult = c_int;
pub type CUdevice = c_int;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_NO_DEVICE: CUresult = 100;
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;
pub const CUDA_ERROR_MPS_CONNECTION_FAILED: CUresult = 805;
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

/// `CUdevice_attribute` values answered.
pub const CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: c_int = 16;
pub const CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: c_int = 33;
pub const CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: c_int = 34;
pub const CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: c_int = 50;
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: c_int = 76;
pub const CU_DEVICE_ATTRIBUTE_MPS_ENABLED: c_int = 133;

/// What `libnvidia-ml.so.1` reported, read once per process.
struct Nvml {
    inventory: GpuInventory,
}

/// The state `cuInit` set up.
struct Initialized {
    devices: Vec<CudaDevice>,
    mps_enabled: bool,
}

static NVML: OnceLock<Result<Nvml, CUresult>> = OnceLock::new();
static INITIALIZED: OnceLock<Result<Initialized, CUresult>> = OnceLock::new();

fn nvml() -> Result<&'static Nvml, CUresult> {
    NVML.get_or_init(|| {
        let source = NvmlSource::open(None).map_err(|e| {
            eprintln!("fake libcuda: the driver does not answer: {e}");
            CUDA_ERROR_NO_DEVICE
        })?;
        let inventory = source.read_inventory().map_err(|e| {
            eprintln!("fake libcuda: reading the GPUs through libnvidia-ml.so.1 failed: {e}");
            CUDA_ERROR_NO_DEVICE
        })?;
        Ok(Nvml { inventory })
    })
    .as_ref()
    .map_err(|e| *e)
}

fn initialize() -> Result<Initialized, CUresult> {
    let nvml = nvml()?;
    let selection = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let devices = devices::visible(devices::physical(&nvml.inventory), selection.as_deref());
    if devices.is_empty() {
        return Err(CUDA_ERROR_NO_DEVICE);
    }
    // An MPS client: if a control daemon listens in the pipe directory, attach to it; a daemon
    // that is there but does not answer is an error, as with real MPS.
    let pipe = mps::pipe_directory_from_env();
    let mps_enabled = if mps::control_socket(&pipe).exists() {
        match mps::request(
            &pipe,
            &format!("{} {}", mps::CLIENT_ATTACH, std::process::id()),
        ) {
            Ok(answer) if answer.ok => true,
            Ok(answer) => {
                eprintln!(
                    "fake libcuda: the MPS control daemon refused this client: {}",
                    answer.text.trim()
                );
                return Err(CUDA_ERROR_MPS_CONNECTION_FAILED);
            }
            Err(e) => {
                eprintln!("fake libcuda: {e}");
                return Err(CUDA_ERROR_MPS_CONNECTION_FAILED);
            }
        }
    } else {
        false
    };
    Ok(Initialized {
        devices,
        mps_enabled,
    })
}

fn guarded(body: impl FnOnce() -> Result<(), CUresult>) -> CUresult {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => CUDA_SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => CUDA_ERROR_UNKNOWN,
    }
}

fn initialized() -> Result<&'static Initialized, CUresult> {
    match INITIALIZED.get() {
        Some(state) => state.as_ref().map_err(|e| *e),
        None => Err(CUDA_ERROR_NOT_INITIALIZED),
    }
}

fn device(ordinal: CUdevice) -> Result<&'static CudaDevice, CUresult> {
    let state = initialized()?;
    usize::try_from(ordinal)
        .ok()
        .and_then(|i| state.devices.get(i))
        .ok_or(CUDA_ERROR_INVALID_DEVICE)
}

/// Writes `value` through `out`.
///
/// # Safety
/// `out` is null or valid for writes.
unsafe fn put<T>(out: *mut T, value: T) -> Result<(), CUresult> {
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and valid for writes by this function's contract.
    unsafe { out.write(value) };
    Ok(())
}

/// Copies `text` and a NUL into `buffer` (truncated to `len - 1` bytes, as CUDA does).
///
/// # Safety
/// `buffer` is null or valid for `len` bytes.
unsafe fn put_str(buffer: *mut c_char, len: c_int, text: &str) -> Result<(), CUresult> {
    let len = usize::try_from(len).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    if buffer.is_null() || len == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let bytes = text.as_bytes();
    let n = bytes.len().min(len - 1);
    // SAFETY: `buffer` is valid for `len` bytes and n + 1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buffer, n);
        buffer.add(n).write(0);
    }
    Ok(())
}

/// The 16 bytes of `GPU-<uuid>` / `MIG-<uuid>`.
fn uuid_bytes(uuid: &str) -> Result<[u8; 16], CUresult> {
    let hex: String = uuid
        .split_once('-')
        .map_or(uuid, |(_, rest)| rest)
        .chars()
        .filter(|c| *c != '-')
        .collect();
    if hex.len() != 32 {
        return Err(CUDA_ERROR_UNKNOWN);
    }
    let mut bytes = [0u8; 16];
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| CUDA_ERROR_UNKNOWN)?;
    }
    Ok(bytes)
}

/// Domain, bus and device numbers of `dddd:bb:dd.f`.
fn pci_parts(bus_id: &str) -> Option<(c_int, c_int, c_int)> {
    let (domain, rest) = bus_id.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let device = rest.split('.').next()?;
    Some((
        c_int::from_str_radix(domain, 16).ok()?,
        c_int::from_str_radix(bus, 16).ok()?,
        c_int::from_str_radix(device, 16).ok()?,
    ))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(flags: c_uint) -> CUresult {
    guarded(|| {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        INITIALIZED
            .get_or_init(initialize)
            .as_ref()
            .map(drop)
            .map_err(|e| *e)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    guarded(|| {
        let cuda = nvml().map_err(|_| CUDA_ERROR_UNKNOWN)?;
        let value = cuda.inventory.cuda_driver_version.to_cuda_driver_version() as c_int;
        // SAFETY: `version` is null or valid for writes (cuda.h).
        unsafe { put(version, value) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    guarded(|| {
        let state = initialized()?;
        // SAFETY: `count` is null or valid for writes (cuda.h).
        unsafe { put(count, state.devices.len() as c_int) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(handle: *mut CUdevice, ordinal: c_int) -> CUresult {
    guarded(|| {
        device(ordinal)?;
        // SAFETY: `handle` is null or valid for writes (cuda.h).
        unsafe { put(handle, ordinal) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    guarded(|| {
        let device = device(dev)?;
        // SAFETY: `name` is null or valid for `len` bytes (cuda.h).
        unsafe { put_str(name, len, &device.name) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    guarded(|| {
        let bytes = uuid_bytes(&device(dev)?.uuid)?;
        // SAFETY: `uuid` is null or valid for 16 bytes (cuda.h: CUuuid).
        unsafe { put(uuid, bytes) }
    })
}

/// Like `cuDeviceGetUuid`; for MIG devices both answer the MIG device's UUID here.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    // SAFETY: same contract as cuDeviceGetUuid.
    unsafe { cuDeviceGetUuid(uuid, dev) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    guarded(|| {
        let total = device(dev)?.memory_bytes as usize;
        // SAFETY: `bytes` is null or valid for writes (cuda.h).
        unsafe { put(bytes, total) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceComputeCapability(
    major: *mut c_int,
    minor: *mut c_int,
    dev: CUdevice,
) -> CUresult {
    guarded(|| {
        let (ma, mi) = device(dev)?.compute_capability;
        // SAFETY: `major` and `minor` are null or valid for writes (cuda.h).
        unsafe {
            put(major, ma as c_int)?;
            put(minor, mi as c_int)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    value: *mut c_int,
    attribute: c_int,
    dev: CUdevice,
) -> CUresult {
    guarded(|| {
        let state = initialized()?;
        let device = device(dev)?;
        let pci = pci_parts(&device.pci_bus_id).unwrap_or((0, 0, 0));
        let answer = match attribute {
            CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT => device.multiprocessors as c_int,
            CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR => device.compute_capability.0 as c_int,
            CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR => device.compute_capability.1 as c_int,
            CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID => pci.0,
            CU_DEVICE_ATTRIBUTE_PCI_BUS_ID => pci.1,
            CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID => pci.2,
            CU_DEVICE_ATTRIBUTE_MPS_ENABLED => c_int::from(state.mps_enabled),
            _ => return Err(CUDA_ERROR_NOT_SUPPORTED),
        };
        // SAFETY: `value` is null or valid for writes (cuda.h).
        unsafe { put(value, answer) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(
    bus_id: *mut c_char,
    len: c_int,
    dev: CUdevice,
) -> CUresult {
    guarded(|| {
        let device = device(dev)?;
        // SAFETY: `bus_id` is null or valid for `len` bytes (cuda.h).
        unsafe { put_str(bus_id, len, &device.pci_bus_id) }
    })
}

fn error_texts(code: CUresult) -> Option<(&'static CStr, &'static CStr)> {
    Some(match code {
        CUDA_SUCCESS => (c"CUDA_SUCCESS", c"no error"),
        CUDA_ERROR_INVALID_VALUE => (c"CUDA_ERROR_INVALID_VALUE", c"invalid argument"),
        CUDA_ERROR_NOT_INITIALIZED => (c"CUDA_ERROR_NOT_INITIALIZED", c"initialization error"),
        CUDA_ERROR_NO_DEVICE => (
            c"CUDA_ERROR_NO_DEVICE",
            c"no CUDA-capable device is detected",
        ),
        CUDA_ERROR_INVALID_DEVICE => (c"CUDA_ERROR_INVALID_DEVICE", c"invalid device ordinal"),
        CUDA_ERROR_NOT_SUPPORTED => (c"CUDA_ERROR_NOT_SUPPORTED", c"operation not supported"),
        CUDA_ERROR_MPS_CONNECTION_FAILED => (
            c"CUDA_ERROR_MPS_CONNECTION_FAILED",
            c"MPS client failed to connect to the MPS control daemon or the MPS server",
        ),
        CUDA_ERROR_UNKNOWN => (c"CUDA_ERROR_UNKNOWN", c"unknown error"),
        _ => return None,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorName(code: CUresult, name: *mut *const c_char) -> CUresult {
    guarded(|| {
        let (text, _) = error_texts(code).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: `name` is null or valid for writes (cuda.h).
        unsafe { put(name, text.as_ptr()) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(code: CUresult, text: *mut *const c_char) -> CUresult {
    guarded(|| {
        let (_, description) = error_texts(code).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: `text` is null or valid for writes (cuda.h).
        unsafe { put(text, description.as_ptr()) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_and_pci_ids_parse() {
        let bytes = uuid_bytes("GPU-2cd02ecc-1915-5073-bc46-a6f474f36436").unwrap();
        assert_eq!(bytes[0], 0x2c);
        assert_eq!(bytes[15], 0x36);
        assert!(uuid_bytes("GPU-short").is_err());
        assert_eq!(pci_parts("0000:c4:00.0"), Some((0, 0xc4, 0)));
        assert_eq!(pci_parts("nonsense"), None);
    }

    #[test]
    fn calls_before_init_and_bad_pointers_are_refused() {
        // This test process never calls cuInit.
        let mut count = 0;
        // SAFETY: a valid pointer.
        let status = unsafe { cuDeviceGetCount(&mut count) };
        assert_eq!(status, CUDA_ERROR_NOT_INITIALIZED);
        assert_eq!(cuInit(1), CUDA_ERROR_INVALID_VALUE);
        let mut name: *const c_char = std::ptr::null();
        // SAFETY: a valid pointer.
        let status = unsafe { cuGetErrorName(CUDA_ERROR_NO_DEVICE, &mut name) };
        assert_eq!(status, CUDA_SUCCESS);
        // SAFETY: cuGetErrorName returned a static C string.
        assert_eq!(unsafe { CStr::from_ptr(name) }, c"CUDA_ERROR_NO_DEVICE");
        // SAFETY: null is refused, not written.
        let status = unsafe { cuGetErrorName(0, std::ptr::null_mut()) };
        assert_eq!(status, CUDA_ERROR_INVALID_VALUE);
    }
}
