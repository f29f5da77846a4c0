//! Session and system functions: init/shutdown, error strings, versions, device enumeration.

use std::ffi::{CStr, c_char, c_int, c_uint};
use std::path::PathBuf;

use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlReturn_t};
use tessera_gpu_inventory::{DeviceSource, MockSource, parse_topology, pci::normalize_bus_id};

use super::{Process, guarded, lock, put, put_str, session};
use crate::driver::Driver;
use crate::embedded;
use crate::events::EventSets;
use crate::handles::Handle;
use crate::status::{DRIVER_NOT_LOADED, INVALID_ARGUMENT, NOT_FOUND, Status, UNINITIALIZED};
use crate::{EVENTS_ENV, LOST_GPUS_ENV, SAMPLES_ENV, SAMPLES_FILE, STATE_DIR_ENV, TOPOLOGY_ENV};

/// Loads the driver state: from the topology named by `TESSERA_FAKE_NVML_TOPOLOGY` (a file path,
/// or a shipped topology name) when it is set, else from the driver data embedded in this copy
/// of the library (a fake driver root's, see [`crate::embedded`]). Problems are explained on
/// stderr, since NVML can only return a code: `NVML_ERROR_DRIVER_NOT_LOADED`.
fn load_driver() -> Result<Driver, Status> {
    let fail = |message: String| {
        eprintln!("fake-nvml: {message}");
        DRIVER_NOT_LOADED
    };
    let (origin, inventory, state_dir) = match std::env::var(TOPOLOGY_ENV) {
        Ok(topology) => {
            let inventory = MockSource::new(&topology)
                .and_then(|source| source.inventory())
                .map_err(|e| fail(format!("{TOPOLOGY_ENV}={topology}: {e}")))?;
            let state_dir = std::env::var_os(STATE_DIR_ENV).map(PathBuf::from);
            (format!("{TOPOLOGY_ENV}={topology}"), inventory, state_dir)
        }
        Err(_) => match embedded::read().map_err(&fail)? {
            Some(data) => {
                let origin = "the driver data embedded in this library".to_owned();
                let inventory = parse_topology(&origin, &data.topology)
                    .map_err(|e| fail(format!("{origin}: {e}")))?;
                let visible = embedded::visible_inventory(inventory, data.dev_root.as_deref());
                let state_dir = data.dev_root.as_deref().map(embedded::state_dir);
                (origin, visible, state_dir)
            }
            None => {
                return Err(fail(format!(
                    "{TOPOLOGY_ENV} is not set and this library carries no driver data; set it \
                     to a topology file (or shipped topology name) for the fake NVML to answer \
                     from, or use the copy in a fake driver root (tessera-fake-driver-root)"
                )));
            }
        },
    };
    let mut driver = Driver::new(inventory).map_err(|e| fail(format!("{origin}: {e}")))?;
    let samples = std::env::var_os(SAMPLES_ENV)
        .map(PathBuf::from)
        .or_else(|| state_dir.as_ref().map(|dir| dir.join(SAMPLES_FILE)));
    driver.set_samples_file(samples);
    driver.set_state_dir(state_dir);
    if let Ok(lost) = std::env::var(LOST_GPUS_ENV) {
        let uuids: Vec<&str> = lost
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .collect();
        driver
            .set_lost(&uuids)
            .map_err(|e| fail(format!("{LOST_GPUS_ENV}={lost}: {e}")))?;
    }
    Ok(driver)
}

fn init() -> Result<(), Status> {
    let mut process = lock();
    if process.driver.is_none() {
        let driver = load_driver()?;
        *process = Process {
            sessions: 0,
            driver: Some(driver),
            events: EventSets::new(std::env::var_os(EVENTS_ENV).map(PathBuf::from)),
        };
    }
    process.sessions += 1;
    Ok(())
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    guarded(init)
}

/// Flags (`NVML_INIT_FLAG_NO_GPUS`, `NO_ATTACH`) change nothing in the fake.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    guarded(init)
}

/// Ends one session. The GPU state (including MIG instances) stays for the process, as the
/// hardware's would.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    guarded(|| {
        let mut process = lock();
        if process.sessions == 0 {
            return Err(UNINITIALIZED);
        }
        process.sessions -= 1;
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    let text: &'static CStr = match result {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        4 => c"Insufficient Permissions",
        5 => c"Already Initialized",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        8 => c"Insufficient External Power",
        9 => c"Driver Not Loaded",
        10 => c"Timeout",
        11 => c"Interrupt request issue",
        12 => c"NVML Shared Library Not Found",
        13 => c"Function Not Found",
        14 => c"Corrupted infoROM",
        15 => c"GPU is lost",
        16 => c"GPU requires reset",
        17 => c"GPU access blocked by the operating system",
        18 => c"Driver/library version mismatch",
        19 => c"In use by another client",
        20 => c"Insufficient Memory",
        21 => c"No data",
        23 => c"Insufficient resources",
        25 => c"Argument version mismatch",
        _ => c"Unknown Error",
    };
    text.as_ptr()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    session(|driver, _| {
        // SAFETY: `version` is null or valid for `length` bytes (nvml.h).
        unsafe { put_str(version, length, &driver.inventory().driver_version) }
    })
}

/// NVML's own version: the CUDA major version and the driver version, e.g. `12.550.54.15`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    session(|driver, _| {
        let inventory = driver.inventory();
        let text = format!(
            "{}.{}",
            inventory.cuda_driver_version.major, inventory.driver_version
        );
        // SAFETY: `version` is null or valid for `length` bytes (nvml.h).
        unsafe { put_str(version, length, &text) }
    })
}

fn cuda_driver_version(driver: &Driver) -> c_int {
    driver
        .inventory()
        .cuda_driver_version
        .to_cuda_driver_version() as c_int
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) -> nvmlReturn_t {
    session(|driver, _| {
        // SAFETY: `version` is null or valid for writes (nvml.h).
        unsafe { put(version, cuda_driver_version(driver)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> nvmlReturn_t {
    session(|driver, _| {
        // SAFETY: `version` is null or valid for writes (nvml.h).
        unsafe { put(version, cuda_driver_version(driver)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    session(|driver, _| {
        // SAFETY: `count` is null or valid for writes (nvml.h).
        unsafe { put(count, driver.gpu_count()) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    session(|driver, _| {
        let gpu = driver.gpu_by_index(index)?;
        let handle = Handle::Gpu { gpu: gpu.index };
        // SAFETY: `device` is null or valid for writes (nvml.h).
        unsafe { put(device, handle.as_ptr()) }
    })
}

/// A C string argument as UTF-8 (`NVML_ERROR_INVALID_ARGUMENT` for null or non-UTF-8).
///
/// # Safety
/// `text` is null or a NUL-terminated string.
unsafe fn c_text<'a>(text: *const c_char) -> Result<&'a str, Status> {
    if text.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null and NUL-terminated by this function's contract.
    unsafe { CStr::from_ptr(text) }
        .to_str()
        .map_err(|_| INVALID_ARGUMENT)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    session(|driver, _| {
        // SAFETY: `uuid` is null or a NUL-terminated string (nvml.h).
        let uuid = unsafe { c_text(uuid) }?;
        let handle = driver.handle_by_uuid(uuid)?;
        // SAFETY: `device` is null or valid for writes (nvml.h).
        unsafe { put(device, handle.as_ptr()) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    pci_bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    session(|driver, _| {
        // SAFETY: `pci_bus_id` is null or a NUL-terminated string (nvml.h).
        let wanted = normalize_bus_id(unsafe { c_text(pci_bus_id) }?).ok_or(INVALID_ARGUMENT)?;
        let gpu = driver
            .inventory()
            .gpu_by_pci_bus_id(&wanted)
            .ok_or(NOT_FOUND)?;
        let handle = Handle::Gpu { gpu: gpu.index };
        // SAFETY: `device` is null or valid for writes (nvml.h).
        unsafe { put(device, handle.as_ptr()) }
    })
}
