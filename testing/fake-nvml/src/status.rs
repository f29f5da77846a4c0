//! NVML status codes (`nvmlReturn_t`) the fake answers with.

use nvml_wrapper_sys::bindings as nvml;

pub type Status = nvml::nvmlReturn_t;

pub const SUCCESS: Status = nvml::nvmlReturn_enum_NVML_SUCCESS;
pub const UNINITIALIZED: Status = nvml::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
pub const INVALID_ARGUMENT: Status = nvml::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
pub const NO_PERMISSION: Status = nvml::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION;
pub const NOT_SUPPORTED: Status = nvml::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
pub const NOT_FOUND: Status = nvml::nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
pub const INSUFFICIENT_SIZE: Status = nvml::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
pub const DRIVER_NOT_LOADED: Status = nvml::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED;
pub const TIMEOUT: Status = nvml::nvmlReturn_enum_NVML_ERROR_TIMEOUT;
pub const GPU_IS_LOST: Status = nvml::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST;
pub const IN_USE: Status = nvml::nvmlReturn_enum_NVML_ERROR_IN_USE;
pub const INSUFFICIENT_RESOURCES: Status = nvml::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES;
pub const ARGUMENT_VERSION_MISMATCH: Status =
    nvml::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
pub const UNKNOWN: Status = nvml::nvmlReturn_enum_NVML_ERROR_UNKNOWN;
