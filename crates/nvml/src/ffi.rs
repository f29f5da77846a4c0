//! Small helpers for calling nvml-wrapper-sys functions that nvml-wrapper does not wrap.
//!
//! Functions are looked up in the loaded library's table (`nvml.lib().<name>`), never through the
//! `NvmlLib` convenience methods, which panic when the symbol is missing.

use std::ffi::{CStr, c_char};

use nvml_wrapper_sys::bindings::nvmlReturn_t;

use super::error::{CallError, NvmlCode};

/// The function `$name` of the loaded NVML library (`nvml_wrapper::Nvml`), or
/// `CallError::MissingSymbol` when the library does not export it.
macro_rules! sys_fn {
    ($nvml:expr, $name:ident) => {
        $nvml
            .lib()
            .$name
            .as_ref()
            .map(|function| *function)
            .map_err(|_| $crate::error::CallError::MissingSymbol(stringify!($name)))
    };
}
pub(crate) use sys_fn;

/// `Ok` for `NVML_SUCCESS`, the status otherwise.
pub(crate) fn check(status: nvmlReturn_t) -> Result<(), CallError> {
    if status == NvmlCode::SUCCESS.0 {
        Ok(())
    } else {
        Err(CallError::Status(NvmlCode(status)))
    }
}

/// `NVML_STRUCT_VERSION(name, version)` of `nvml.h`: the struct size with the version in the
/// top byte, written into the `version` field of versioned structs.
pub(crate) const fn struct_version<T>(version: u32) -> u32 {
    (std::mem::size_of::<T>() as u32) | (version << 24)
}

/// A NUL-terminated string NVML wrote into a fixed buffer.
pub(crate) fn string_from_buffer(buffer: &[c_char]) -> Result<String, CallError> {
    // Reinterpret as bytes without reading past the buffer, even if NVML forgot the NUL.
    let bytes: Vec<u8> = buffer.iter().map(|&c| c as u8).collect();
    let text = CStr::from_bytes_until_nul(&bytes)
        .map_err(|_| CallError::Malformed("a string without terminating NUL".to_owned()))?;
    text.to_str()
        .map(str::to_owned)
        .map_err(|_| CallError::Malformed(format!("a string that is not UTF-8: {text:?}")))
}

/// NVML's 16-byte UUIDs (e.g. a fabric's cluster UUID) in the canonical 8-4-4-4-12 form.
pub(crate) fn format_uuid(bytes: &[u8; 16]) -> String {
    uuid::Uuid::from_bytes(*bytes).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_stop_at_the_first_nul_and_need_one() {
        let mut buffer = [0 as c_char; 8];
        for (slot, byte) in buffer.iter_mut().zip(b"MIG 1g\0x") {
            *slot = *byte as c_char;
        }
        assert_eq!(string_from_buffer(&buffer).unwrap(), "MIG 1g");
        let full = [b'a' as c_char; 4];
        assert!(matches!(
            string_from_buffer(&full),
            Err(CallError::Malformed(_))
        ));
    }

    #[test]
    fn uuids_are_formatted_canonically() {
        let bytes = [
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
            0xcd, 0xef,
        ];
        assert_eq!(format_uuid(&bytes), "12345678-9abc-def0-0123-456789abcdef");
    }

    #[test]
    fn struct_versions_carry_size_and_version() {
        assert_eq!(struct_version::<[u8; 40]>(2), 40 | (2 << 24));
    }

    #[test]
    fn status_codes_map_to_errors() {
        assert!(check(0).is_ok());
        assert!(matches!(
            check(23),
            Err(CallError::Status(NvmlCode::INSUFFICIENT_RESOURCES))
        ));
    }
}
