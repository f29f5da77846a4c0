//! The exported NVML C ABI. Every function has the name and signature `nvml.h` gives it (checked
//! against nvml-wrapper-sys's bindings, whose types are used), and answers from the process's
//! [`Driver`] with the status real NVML would return.
//!
//! Contract for callers (as in `nvml.h`): every pointer argument is null or valid for the reads
//! and writes the NVML documentation describes; string buffers are valid for `length` bytes.
//! Null out-pointers are refused with `NVML_ERROR_INVALID_ARGUMENT`. That contract is the `# Safety`
//! section of every `unsafe extern "C" fn` here, which is why `missing_safety_doc` is allowed.
//!
//! No panic crosses the ABI: each body runs under `catch_unwind` and a panic becomes
//! `NVML_ERROR_UNKNOWN`.
#![allow(unsafe_code, non_snake_case, clippy::missing_safety_doc)]

mod device;
mod events;
mod mig;
mod nvlink;
mod private;
mod system;

use std::ffi::{c_char, c_uint};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;
use std::sync::{LazyLock, Mutex, MutexGuard, PoisonError};

use crate::driver::Driver;
use crate::events::EventSets;
use crate::status::{INSUFFICIENT_SIZE, INVALID_ARGUMENT, SUCCESS, Status, UNINITIALIZED, UNKNOWN};

/// What the "driver" holds for the whole process: the GPUs (loaded at the first `nvmlInit`,
/// kept across `nvmlShutdown` like real hardware state) and the open sessions.
#[derive(Default)]
struct Process {
    sessions: u32,
    driver: Option<Driver>,
    events: EventSets,
}

static PROCESS: LazyLock<Mutex<Process>> = LazyLock::new(|| Mutex::new(Process::default()));

fn lock() -> MutexGuard<'static, Process> {
    // A panic while holding the lock was already turned into NVML_ERROR_UNKNOWN for that call;
    // the state itself stays usable.
    PROCESS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs `body`, turning a panic into `NVML_ERROR_UNKNOWN`.
fn guarded(body: impl FnOnce() -> Result<(), Status>) -> Status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(status)) => status,
        Err(_) => UNKNOWN,
    }
}

/// Runs `body` with the driver of an initialised session (`NVML_ERROR_UNINITIALIZED` otherwise).
fn session(body: impl FnOnce(&mut Driver, &mut EventSets) -> Result<(), Status>) -> Status {
    guarded(|| {
        let mut process = lock();
        if process.sessions == 0 {
            return Err(UNINITIALIZED);
        }
        let Process { driver, events, .. } = &mut *process;
        body(driver.as_mut().ok_or(UNINITIALIZED)?, events)
    })
}

/// Writes an out-parameter.
///
/// # Safety
/// `out` is null or valid for a write of `T`.
unsafe fn put<T>(out: *mut T, value: T) -> Result<(), Status> {
    if out.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and valid for writes by this function's contract.
    unsafe { out.write(value) };
    Ok(())
}

/// Copies `text` and a terminating NUL into a caller's buffer of `length` bytes;
/// `NVML_ERROR_INSUFFICIENT_SIZE` when it does not fit, as NVML answers.
///
/// # Safety
/// `buffer` is null or valid for writes of `length` bytes.
unsafe fn put_str(buffer: *mut c_char, length: c_uint, text: &str) -> Result<(), Status> {
    if buffer.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    let bytes = text.as_bytes();
    if bytes.len() >= length as usize {
        return Err(INSUFFICIENT_SIZE);
    }
    // SAFETY: `bytes.len() + 1 <= length` bytes are written into a buffer valid for `length`
    // bytes; the source is a distinct Rust string.
    unsafe {
        ptr::copy_nonoverlapping(bytes.as_ptr(), buffer.cast::<u8>(), bytes.len());
        buffer.add(bytes.len()).write(0);
    }
    Ok(())
}

/// Copies `text` into a fixed `c_char` array of an NVML struct, NUL-terminated and truncated to
/// fit.
fn fill(target: &mut [c_char], text: &str) {
    let room = target.len().saturating_sub(1);
    for (slot, byte) in target.iter_mut().zip(text.bytes().take(room)) {
        *slot = byte as c_char;
    }
    if let Some(end) = target.get_mut(text.len().min(room)) {
        *end = 0;
    }
}

/// The `version` field NVML's versioned structs start with.
///
/// # Safety
/// `info` is null or points to a readable struct whose first field is the `u32` version.
unsafe fn struct_version<T>(info: *const T) -> Result<u32, Status> {
    if info.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and the first four bytes are the `version` field by this function's
    // contract; no other field is read.
    Ok(unsafe { info.cast::<u32>().read_unaligned() })
}

/// `NVML_STRUCT_VERSION(T, version)`.
const fn versioned<T>(version: u32) -> u32 {
    (std::mem::size_of::<T>() as u32) | (version << 24)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_nul_terminated_and_refused_when_too_long() {
        let mut buffer = [1 as c_char; 6];
        // SAFETY: the buffer is valid for 6 bytes.
        assert_eq!(unsafe { put_str(buffer.as_mut_ptr(), 6, "hello") }, Ok(()));
        assert_eq!(buffer[5], 0);
        // SAFETY: as above.
        let too_long = unsafe { put_str(buffer.as_mut_ptr(), 6, "hello!") };
        assert_eq!(too_long, Err(INSUFFICIENT_SIZE));
        // SAFETY: null is allowed and refused.
        let null = unsafe { put_str(ptr::null_mut(), 6, "x") };
        assert_eq!(null, Err(INVALID_ARGUMENT));
    }

    #[test]
    fn fixed_arrays_are_truncated_with_a_nul() {
        let mut array = [7 as c_char; 4];
        fill(&mut array, "abcdef");
        assert_eq!(array, [b'a' as c_char, b'b' as c_char, b'c' as c_char, 0]);
        fill(&mut array, "z");
        assert_eq!(array[..2], [b'z' as c_char, 0]);
    }

    #[test]
    fn panics_become_unknown() {
        assert_eq!(guarded(|| panic!("boom")), UNKNOWN);
        assert_eq!(guarded(|| Ok(())), SUCCESS);
    }
}
