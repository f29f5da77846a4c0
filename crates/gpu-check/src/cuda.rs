//! The CUDA driver API, as a CUDA program reaches it: `dlopen("libcuda.so.1")` through the
//! dynamic loader's search (the container's `ld.so.cache`, `LD_LIBRARY_PATH`, the default
//! directories), then the driver API functions by name. Only queries: nothing is allocated and no
//! context is created.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_char, c_int, c_uint};

use serde::Serialize;

const CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: c_int = 16;
const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: c_int = 76;
const CU_DEVICE_ATTRIBUTE_MPS_ENABLED: c_int = 133;

/// What the CUDA driver says.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CudaReport {
    /// Whether `libcuda.so.1` could be loaded.
    pub loaded: bool,
    /// The file it was loaded from (as this container sees it), from `/proc/self/maps`.
    pub path: Option<String>,
    /// `cuDriverGetVersion`, e.g. 12040.
    pub driver_version: Option<i32>,
    /// `cuInit(0)`'s result name, e.g. `CUDA_SUCCESS`.
    pub init: Option<String>,
    /// The devices, in CUDA order.
    pub devices: Vec<CudaDeviceReport>,
    /// Why something above is missing.
    pub error: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CudaDeviceReport {
    pub index: i32,
    pub name: String,
    /// `GPU-<uuid>`, or `MIG-<uuid>` for a MIG device (as nvidia-smi names them).
    pub uuid: String,
    pub memory_bytes: u64,
    pub compute_capability: String,
    pub multiprocessors: i32,
    pub pci_bus_id: String,
    /// `CU_DEVICE_ATTRIBUTE_MPS_ENABLED`: contexts on this device go through MPS.
    pub mps_enabled: Option<bool>,
}

type CuResult = c_int;

/// The driver API functions the checker calls.
struct Api<'lib> {
    driver_get_version: libloading::Symbol<'lib, unsafe extern "C" fn(*mut c_int) -> CuResult>,
    init: libloading::Symbol<'lib, unsafe extern "C" fn(c_uint) -> CuResult>,
    device_get_count: libloading::Symbol<'lib, unsafe extern "C" fn(*mut c_int) -> CuResult>,
    device_get: libloading::Symbol<'lib, unsafe extern "C" fn(*mut c_int, c_int) -> CuResult>,
    device_get_name:
        libloading::Symbol<'lib, unsafe extern "C" fn(*mut c_char, c_int, c_int) -> CuResult>,
    device_get_uuid:
        libloading::Symbol<'lib, unsafe extern "C" fn(*mut [u8; 16], c_int) -> CuResult>,
    device_total_mem: libloading::Symbol<'lib, unsafe extern "C" fn(*mut usize, c_int) -> CuResult>,
    device_get_attribute:
        libloading::Symbol<'lib, unsafe extern "C" fn(*mut c_int, c_int, c_int) -> CuResult>,
    device_get_pci_bus_id:
        libloading::Symbol<'lib, unsafe extern "C" fn(*mut c_char, c_int, c_int) -> CuResult>,
    get_error_name:
        libloading::Symbol<'lib, unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult>,
}

impl<'lib> Api<'lib> {
    fn load(lib: &'lib libloading::Library) -> Result<Self, String> {
        // SAFETY: each symbol is looked up with the signature cuda.h gives it.
        unsafe {
            Ok(Api {
                driver_get_version: symbol(lib, b"cuDriverGetVersion\0")?,
                init: symbol(lib, b"cuInit\0")?,
                device_get_count: symbol(lib, b"cuDeviceGetCount\0")?,
                device_get: symbol(lib, b"cuDeviceGet\0")?,
                device_get_name: symbol(lib, b"cuDeviceGetName\0")?,
                device_get_uuid: symbol(lib, b"cuDeviceGetUuid\0")?,
                device_total_mem: symbol(lib, b"cuDeviceTotalMem_v2\0")?,
                device_get_attribute: symbol(lib, b"cuDeviceGetAttribute\0")?,
                device_get_pci_bus_id: symbol(lib, b"cuDeviceGetPCIBusId\0")?,
                get_error_name: symbol(lib, b"cuGetErrorName\0")?,
            })
        }
    }

    fn error_name(&self, code: CuResult) -> String {
        let mut name: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorName writes a pointer to a static string.
        let status = unsafe { (self.get_error_name)(code, &mut name) };
        if status == 0 && !name.is_null() {
            // SAFETY: a NUL-terminated static string from the driver.
            unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned()
        } else {
            format!("CUresult {code}")
        }
    }

    fn check(&self, what: &str, code: CuResult) -> Result<(), String> {
        if code == 0 {
            Ok(())
        } else {
            Err(format!("{what} failed: {}", self.error_name(code)))
        }
    }

    fn text(
        &self,
        what: &str,
        call: &libloading::Symbol<
            'lib,
            unsafe extern "C" fn(*mut c_char, c_int, c_int) -> CuResult,
        >,
        device: c_int,
    ) -> Result<String, String> {
        let mut buffer = [0 as c_char; 256];
        // SAFETY: the buffer is valid for its length, which is passed.
        let code = unsafe { call(buffer.as_mut_ptr(), buffer.len() as c_int, device) };
        self.check(what, code)?;
        // SAFETY: the driver NUL-terminates within the buffer (len - 1 bytes at most).
        Ok(unsafe { CStr::from_ptr(buffer.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    fn attribute(&self, attribute: c_int, device: c_int) -> Result<c_int, String> {
        let mut value: c_int = 0;
        // SAFETY: a valid out-pointer.
        let code = unsafe { (self.device_get_attribute)(&mut value, attribute, device) };
        self.check(&format!("cuDeviceGetAttribute({attribute})"), code)?;
        Ok(value)
    }

    fn device(&self, index: c_int) -> Result<CudaDeviceReport, String> {
        let mut device: c_int = 0;
        // SAFETY: a valid out-pointer.
        self.check("cuDeviceGet", unsafe {
            (self.device_get)(&mut device, index)
        })?;
        let name = self.text("cuDeviceGetName", &self.device_get_name, device)?;
        let mut uuid = [0u8; 16];
        // SAFETY: 16 writable bytes (CUuuid).
        self.check("cuDeviceGetUuid", unsafe {
            (self.device_get_uuid)(&mut uuid, device)
        })?;
        let mut memory: usize = 0;
        // SAFETY: a valid out-pointer.
        self.check("cuDeviceTotalMem_v2", unsafe {
            (self.device_total_mem)(&mut memory, device)
        })?;
        let major = self.attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device)?;
        let minor = self.attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device)?;
        let prefix = if name.contains(" MIG ") { "MIG" } else { "GPU" };
        Ok(CudaDeviceReport {
            index,
            uuid: format_uuid(prefix, &uuid),
            name,
            memory_bytes: memory as u64,
            compute_capability: format!("{major}.{minor}"),
            multiprocessors: self.attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device)?,
            pci_bus_id: self.text("cuDeviceGetPCIBusId", &self.device_get_pci_bus_id, device)?,
            // Drivers before CUDA 12.4 do not know the attribute.
            mps_enabled: self
                .attribute(CU_DEVICE_ATTRIBUTE_MPS_ENABLED, device)
                .ok()
                .map(|v| v != 0),
        })
    }
}

/// # Safety
/// `T` is the function type the symbol `name` has.
unsafe fn symbol<'lib, T>(
    lib: &'lib libloading::Library,
    name: &[u8],
) -> Result<libloading::Symbol<'lib, T>, String> {
    // SAFETY: the caller guarantees the type.
    unsafe { lib.get(name) }.map_err(|e| {
        format!(
            "libcuda.so.1 has no {}: {e}",
            String::from_utf8_lossy(name.strip_suffix(b"\0").unwrap_or(name))
        )
    })
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn format_uuid(prefix: &str, bytes: &[u8; 16]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{prefix}-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The file a loaded library was mapped from, as this process sees it.
fn mapped_path(file_name_part: &str) -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| {
            std::path::Path::new(path)
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(file_name_part))
        })
        .map(str::to_owned)
}

/// Loads `libcuda.so.1` and asks it about its devices.
pub fn check() -> CudaReport {
    let mut report = CudaReport::default();
    // SAFETY: loading the CUDA driver runs its initialisers; that is what a CUDA program does.
    let lib = match unsafe { libloading::Library::new("libcuda.so.1") } {
        Ok(lib) => lib,
        Err(e) => {
            report.error = Some(format!("cannot load libcuda.so.1: {e}"));
            return report;
        }
    };
    report.loaded = true;
    report.path = mapped_path("libcuda.so");
    let api = match Api::load(&lib) {
        Ok(api) => api,
        Err(e) => {
            report.error = Some(e);
            return report;
        }
    };
    let mut version: c_int = 0;
    // SAFETY: a valid out-pointer.
    if unsafe { (api.driver_get_version)(&mut version) } == 0 {
        report.driver_version = Some(version);
    }
    // SAFETY: cuInit takes flags, which must be 0.
    let init = unsafe { (api.init)(0) };
    report.init = Some(api.error_name(init));
    if init != 0 {
        report.error = Some(format!("cuInit failed: {}", api.error_name(init)));
        return report;
    }
    let mut count: c_int = 0;
    // SAFETY: a valid out-pointer.
    if let Err(e) = api.check("cuDeviceGetCount", unsafe {
        (api.device_get_count)(&mut count)
    }) {
        report.error = Some(e);
        return report;
    }
    for index in 0..count {
        match api.device(index) {
            Ok(device) => report.devices.push(device),
            Err(e) => {
                report.error = Some(format!("device {index}: {e}"));
                break;
            }
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_format_like_nvidia_smi() {
        let bytes = [
            0x2c, 0xd0, 0x2e, 0xcc, 0x19, 0x15, 0x50, 0x73, 0xbc, 0x46, 0xa6, 0xf4, 0x74, 0xf3,
            0x64, 0x36,
        ];
        assert_eq!(
            format_uuid("GPU", &bytes),
            "GPU-2cd02ecc-1915-5073-bc46-a6f474f36436"
        );
    }
}
