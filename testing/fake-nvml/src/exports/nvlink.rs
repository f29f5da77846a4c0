//! NVLink links and multi-node fabric membership. A GPU without links answers
//! `NVML_ERROR_NOT_SUPPORTED` for every link query and a link index past its last link
//! `NVML_ERROR_INVALID_ARGUMENT`, as real NVML does; a GPU without fabric answers the fabric query
//! with `NVML_ERROR_NOT_SUPPORTED`.

use std::ffi::c_uint;
use std::mem;

use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlEnableState_enum_NVML_FEATURE_DISABLED,
    nvmlEnableState_enum_NVML_FEATURE_ENABLED, nvmlEnableState_t, nvmlGpuFabricInfo_t,
    nvmlGpuFabricInfo_v2_t, nvmlGpuFabricInfoV_t, nvmlIntNvLinkDeviceType_t, nvmlPciInfo_t,
    nvmlReturn_t,
};
use tessera_gpu_inventory::model::{FabricInfo, Gpu, NvLink, NvLinkState};

use super::device::pci_info;
use super::{put, session, struct_version, versioned};
use crate::driver::Driver;
use crate::handles::Handle;
use crate::status::{ARGUMENT_VERSION_MISMATCH, INVALID_ARGUMENT, NOT_SUPPORTED, Status};

/// Link `link` of the GPU behind `device`.
fn link(driver: &Driver, device: nvmlDevice_t, link: c_uint) -> Result<&NvLink, Status> {
    let gpu = driver.gpu(Handle::from_ptr(device))?;
    if gpu.nvlinks.is_empty() {
        return Err(NOT_SUPPORTED);
    }
    gpu.nvlinks
        .iter()
        .find(|l| l.link == link)
        .ok_or(INVALID_ARGUMENT)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: nvmlDevice_t,
    link_index: c_uint,
    is_active: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    session(|driver, _| {
        let state = match link(driver, device, link_index)?.state {
            NvLinkState::Active => nvmlEnableState_enum_NVML_FEATURE_ENABLED,
            NvLinkState::Inactive => nvmlEnableState_enum_NVML_FEATURE_DISABLED,
        };
        // SAFETY: `is_active` is null or valid for writes (nvml.h).
        unsafe { put(is_active, state) }
    })
}

/// The `nvmlNvlinkVersion_t` of the link (`NVML_NVLINK_VERSION_4_0` is 6).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkVersion(
    device: nvmlDevice_t,
    link_index: c_uint,
    version: *mut c_uint,
) -> nvmlReturn_t {
    session(|driver, _| {
        let code = link(driver, device, link_index)?.version.nvml_code();
        // SAFETY: `version` is null or valid for writes (nvml.h).
        unsafe { put(version, code) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    device: nvmlDevice_t,
    link_index: c_uint,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    session(|driver, _| {
        let info = pci_info(&link(driver, device, link_index)?.remote_pci_bus_id)?;
        // SAFETY: `pci` is null or valid for writes (nvml.h).
        unsafe { put(pci, info) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemoteDeviceType(
    device: nvmlDevice_t,
    link_index: c_uint,
    device_type: *mut nvmlIntNvLinkDeviceType_t,
) -> nvmlReturn_t {
    session(|driver, _| {
        let code = link(driver, device, link_index)?.remote_type.nvml_code();
        // SAFETY: `device_type` is null or valid for writes (nvml.h).
        unsafe { put(device_type, code) }
    })
}

fn fabric(gpu: &Gpu) -> Result<&FabricInfo, Status> {
    gpu.fabric.as_ref().ok_or(NOT_SUPPORTED)
}

/// The 16 bytes of a canonical UUID string (validated by the topology parser).
fn uuid_bytes(uuid: &str) -> Result<[u8; 16], Status> {
    let hex: Vec<u8> = uuid.bytes().filter(|b| *b != b'-').collect();
    let mut bytes = [0u8; 16];
    if hex.len() != 32 {
        return Err(INVALID_ARGUMENT);
    }
    for (byte, pair) in bytes.iter_mut().zip(hex.chunks(2)) {
        let text = std::str::from_utf8(pair).map_err(|_| INVALID_ARGUMENT)?;
        *byte = u8::from_str_radix(text, 16).map_err(|_| INVALID_ARGUMENT)?;
    }
    Ok(bytes)
}

/// Versioned (`nvmlGpuFabricInfo_v2` or `_v3`); v2 is a prefix of v3, so a v2 caller's buffer is
/// only written up to v2's size.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfoV(
    device: nvmlDevice_t,
    info: *mut nvmlGpuFabricInfoV_t,
) -> nvmlReturn_t {
    session(|driver, _| {
        let fabric = fabric(driver.gpu(Handle::from_ptr(device))?)?;
        // SAFETY: `info` is null or a readable struct starting with its version (nvml.h).
        let version = unsafe { struct_version(info) }?;
        // SAFETY: all-zero is a valid value of this plain C struct.
        let mut answer: nvmlGpuFabricInfoV_t = unsafe { mem::zeroed() };
        answer.version = version;
        answer.clusterUuid = uuid_bytes(&fabric.cluster_uuid)?;
        answer.status = fabric.status;
        answer.cliqueId = fabric.clique_id;
        answer.state = fabric.state.nvml_code();
        answer.healthSummary = fabric.health.nvml_code();
        if version == versioned::<nvmlGpuFabricInfoV_t>(3) {
            // SAFETY: a v3 caller's buffer is valid for writes of the v3 struct (nvml.h).
            unsafe { put(info, answer) }
        } else if version == versioned::<nvmlGpuFabricInfo_v2_t>(2) {
            let v2 = nvmlGpuFabricInfo_v2_t {
                version,
                clusterUuid: answer.clusterUuid,
                status: answer.status,
                cliqueId: answer.cliqueId,
                state: answer.state,
                healthMask: 0,
            };
            // SAFETY: a v2 caller's buffer is valid for writes of the v2 struct, which is what
            // is written (nvml.h); the pointer is non-null (checked above).
            unsafe { put(info.cast::<nvmlGpuFabricInfo_v2_t>(), v2) }
        } else {
            Err(ARGUMENT_VERSION_MISMATCH)
        }
    })
}

/// The unversioned predecessor of `nvmlDeviceGetGpuFabricInfoV`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfo(
    device: nvmlDevice_t,
    info: *mut nvmlGpuFabricInfo_t,
) -> nvmlReturn_t {
    session(|driver, _| {
        let fabric = fabric(driver.gpu(Handle::from_ptr(device))?)?;
        let answer = nvmlGpuFabricInfo_t {
            clusterUuid: uuid_bytes(&fabric.cluster_uuid)?,
            status: fabric.status,
            cliqueId: fabric.clique_id,
            state: fabric.state.nvml_code(),
        };
        // SAFETY: `info` is null or valid for writes (nvml.h).
        unsafe { put(info, answer) }
    })
}

#[cfg(test)]
mod tests {
    use super::uuid_bytes;

    #[test]
    fn uuids_become_bytes() {
        let bytes = uuid_bytes("522c88f3-2731-5718-acd9-980cbf3d0f20").unwrap();
        assert_eq!(bytes[0], 0x52);
        assert_eq!(bytes[15], 0x20);
        assert!(uuid_bytes("522c88f3").is_err());
        assert!(uuid_bytes("zz2c88f3-2731-5718-acd9-980cbf3d0f20").is_err());
    }
}
