//! Calls that are not in `nvml.h`: what the real `nvidia-smi` reaches through the driver's
//! private interface, and the stand-in `nvidia-smi` (tessera-fake-driver) through these.

use std::ffi::c_uint;

use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlReturn_t};

use super::{put, session};
use crate::driver::NvmlDevice;
use crate::handles::Handle;
use crate::status::NOT_SUPPORTED;

/// The whole GPU a handle names (a MIG device handle is `NVML_ERROR_NOT_SUPPORTED`: time slices
/// are a whole-GPU setting).
fn whole_gpu(
    driver: &crate::driver::Driver,
    device: nvmlDevice_t,
) -> Result<u32, crate::status::Status> {
    match driver.device(Handle::from_ptr(device))? {
        NvmlDevice::Gpu(gpu) => Ok(gpu.index),
        NvmlDevice::Mig { .. } => Err(NOT_SUPPORTED),
    }
}

/// Sets the compute time slice of a GPU: 0 default, 1 short, 2 medium, 3 long
/// (`nvidia-smi compute-policy -i <gpu> --set-timeslice=<n>`).
#[unsafe(no_mangle)]
pub extern "C" fn tesseraFakeNvmlDeviceSetTimeslice(
    device: nvmlDevice_t,
    value: c_uint,
) -> nvmlReturn_t {
    session(|driver, _| {
        let gpu = whole_gpu(driver, device)?;
        driver.set_time_slice(gpu, value)
    })
}

/// The compute time slice of a GPU (`nvidia-smi compute-policy -l`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tesseraFakeNvmlDeviceGetTimeslice(
    device: nvmlDevice_t,
    value: *mut c_uint,
) -> nvmlReturn_t {
    session(|driver, _| {
        let gpu = whole_gpu(driver, device)?;
        let current = driver.time_slice(gpu)?;
        // SAFETY: `value` is null or valid for writes (the caller's contract, as in nvml.h).
        unsafe { put(value, current) }
    })
}
