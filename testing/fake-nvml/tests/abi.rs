//! The fake's C ABI called directly (through nvml-wrapper-sys's loader), for the answers the
//! backend tests do not reach: status codes for bad handles, unsupported queries, small buffers,
//! wrong struct versions and calls outside a session.
#![allow(unsafe_code)]

mod support;

use std::ffi::{CStr, c_char};
use std::ptr;

use nvml_wrapper_sys::bindings::{
    NvmlLib, nvmlDevice_t, nvmlGpuFabricInfoV_t, nvmlMemory_v2_t,
    nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH as ARGUMENT_VERSION_MISMATCH,
    nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE as INSUFFICIENT_SIZE,
    nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT as INVALID_ARGUMENT,
    nvmlReturn_enum_NVML_ERROR_NOT_FOUND as NOT_FOUND,
    nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED as NOT_SUPPORTED,
    nvmlReturn_enum_NVML_ERROR_UNINITIALIZED as UNINITIALIZED,
    nvmlReturn_enum_NVML_SUCCESS as SUCCESS,
};
use tessera_fake_nvml::TOPOLOGY_ENV;

use support::{fake_library, is_child, run_in_child};

/// Handles: by index (one past the last refused), by UUID (a buffer too small refused, an
/// unknown UUID not found); a bogus or null handle refused. Returns the first GPU's handle.
fn handles_are_checked(lib: &NvmlLib) -> nvmlDevice_t {
    // SAFETY: for every call below the arguments follow nvml.h — out-pointers point to live
    // locals of the right type, buffers are as long as the lengths passed, handles come from the
    // fake (or are deliberately bogus, which the fake must refuse without dereferencing them).
    unsafe {
        let mut device: nvmlDevice_t = ptr::null_mut();
        assert_eq!(
            lib.nvmlDeviceGetHandleByIndex_v2(4, &mut device),
            INVALID_ARGUMENT
        );
        assert_eq!(lib.nvmlDeviceGetHandleByIndex_v2(0, &mut device), SUCCESS);

        let mut minor = 0u32;
        let bogus = ptr::without_provenance_mut(0xdead_beef);
        assert_eq!(
            lib.nvmlDeviceGetMinorNumber(bogus, &mut minor),
            INVALID_ARGUMENT
        );
        assert_eq!(
            lib.nvmlDeviceGetMinorNumber(ptr::null_mut(), &mut minor),
            INVALID_ARGUMENT
        );

        let mut uuid = [0 as c_char; 96];
        assert_eq!(
            lib.nvmlDeviceGetUUID(device, uuid.as_mut_ptr(), 8),
            INSUFFICIENT_SIZE
        );
        assert_eq!(
            lib.nvmlDeviceGetUUID(device, uuid.as_mut_ptr(), 96),
            SUCCESS
        );
        let uuid = CStr::from_ptr(uuid.as_ptr()).to_owned();
        let mut by_uuid: nvmlDevice_t = ptr::null_mut();
        assert_eq!(
            lib.nvmlDeviceGetHandleByUUID(uuid.as_ptr(), &mut by_uuid),
            SUCCESS
        );
        assert_eq!(by_uuid, device);
        assert_eq!(
            lib.nvmlDeviceGetHandleByUUID(c"GPU-nope".as_ptr(), &mut by_uuid),
            NOT_FOUND
        );
        device
    }
}

/// What pcie-l40s's first GPU does not support (NVLink, fabric, MIG mode, MIG attributes) is
/// refused as such; a struct of the wrong version is refused, the right one answered.
fn unsupported_queries_and_versions_are_refused(lib: &NvmlLib, device: nvmlDevice_t) {
    // SAFETY: for every call below the arguments follow nvml.h — out-pointers point to live
    // locals of the right type, buffers are as long as the lengths passed, handles come from the
    // fake (or are deliberately bogus, which the fake must refuse without dereferencing them).
    unsafe {
        let mut state = 0u32;
        assert_eq!(
            lib.nvmlDeviceGetNvLinkState(device, 0, &mut state),
            NOT_SUPPORTED
        );
        let mut fabric: nvmlGpuFabricInfoV_t = std::mem::zeroed();
        fabric.version = (size_of::<nvmlGpuFabricInfoV_t>() as u32) | (3 << 24);
        assert_eq!(
            lib.nvmlDeviceGetGpuFabricInfoV(device, &mut fabric),
            NOT_SUPPORTED
        );
        let (mut current, mut pending) = (0u32, 0u32);
        assert_eq!(
            lib.nvmlDeviceGetMigMode(device, &mut current, &mut pending),
            NOT_SUPPORTED
        );

        let mut memory: nvmlMemory_v2_t = std::mem::zeroed();
        memory.version = 1;
        assert_eq!(
            lib.nvmlDeviceGetMemoryInfo_v2(device, &mut memory),
            ARGUMENT_VERSION_MISMATCH
        );
        memory.version = (size_of::<nvmlMemory_v2_t>() as u32) | (2 << 24);
        assert_eq!(lib.nvmlDeviceGetMemoryInfo_v2(device, &mut memory), SUCCESS);
        assert!(memory.total > 0);

        // Whole GPUs have no MIG attributes, as on real NVML.
        let mut attributes = std::mem::zeroed();
        assert_eq!(
            lib.nvmlDeviceGetAttributes_v2(device, &mut attributes),
            NOT_SUPPORTED
        );
        assert_eq!(
            CStr::from_ptr(lib.nvmlErrorString(NOT_SUPPORTED)).to_str(),
            Ok("Not Supported")
        );
    }
}

#[test]
fn status_codes_follow_nvml() {
    const TEST: &str = "status_codes_follow_nvml";
    if !is_child(TEST) {
        // pcie-l40s: no NVLink, no fabric, no MIG.
        return run_in_child(TEST, &[(TOPOLOGY_ENV, "pcie-l40s".to_owned())]).unwrap();
    }
    // SAFETY: loading the fake runs no initialiser with preconditions; it is this crate's library.
    let lib = unsafe { NvmlLib::new(fake_library()) }.unwrap();
    let mut count = 0u32;
    // SAFETY: for every call below the arguments follow nvml.h — out-pointers point to live
    // locals of the right type, buffers are as long as the lengths passed, handles come from the
    // fake (or are deliberately bogus, which the fake must refuse without dereferencing them).
    unsafe {
        assert_eq!(lib.nvmlDeviceGetCount_v2(&mut count), UNINITIALIZED);
        assert_eq!(lib.nvmlShutdown(), UNINITIALIZED);
        assert_eq!(lib.nvmlInit_v2(), SUCCESS);
        assert_eq!(lib.nvmlDeviceGetCount_v2(&mut count), SUCCESS);
        assert_eq!(count, 4);
        assert_eq!(lib.nvmlDeviceGetCount_v2(ptr::null_mut()), INVALID_ARGUMENT);
    }
    let device = handles_are_checked(&lib);
    unsupported_queries_and_versions_are_refused(&lib, device);
    // SAFETY: the out-pointer points to a live local of the right type.
    unsafe {
        assert_eq!(lib.nvmlShutdown(), SUCCESS);
        assert_eq!(lib.nvmlDeviceGetCount_v2(&mut count), UNINITIALIZED);
    }
}
