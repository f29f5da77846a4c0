//! Event sets. Events come from the injection file (crate::events); waiting polls it without
//! holding the process lock, so other NVML calls proceed meanwhile.

use std::ffi::{c_uint, c_ulonglong};
use std::thread;
use std::time::{Duration, Instant};

use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlEventData_t, nvmlEventSet_t, nvmlReturn_t};

use super::{put, session};
use crate::events::{FakeEvent, SUPPORTED_EVENT_TYPES};
use crate::handles::Handle;
use crate::status::{INVALID_ARGUMENT, Status, TIMEOUT};

/// How often a waiting call looks at the injection file.
const POLL_INTERVAL: Duration = Duration::from_millis(10);

fn event_set(set: nvmlEventSet_t) -> Result<u32, Status> {
    match Handle::from_ptr(set) {
        Some(Handle::EventSet { set }) => Ok(set),
        _ => Err(INVALID_ARGUMENT),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    session(|_, events| {
        if set.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let handle = Handle::EventSet {
            set: events.create(),
        };
        // SAFETY: `set` is non-null and valid for writes (nvml.h).
        unsafe { put(set, handle.as_ptr()) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    session(|_, events| events.free(event_set(set)?))
}

/// XID and single/double-bit ECC errors on every GPU.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nvmlDevice_t,
    event_types: *mut c_ulonglong,
) -> nvmlReturn_t {
    session(|driver, _| {
        driver.gpu(Handle::from_ptr(device))?;
        // SAFETY: `event_types` is null or valid for writes (nvml.h).
        unsafe { put(event_types, SUPPORTED_EVENT_TYPES) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    event_types: c_ulonglong,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    session(|driver, events| {
        let gpu = driver.gpu(Handle::from_ptr(device))?.index;
        events.register(event_set(set)?, gpu, event_types)
    })
}

fn next_event(set: nvmlEventSet_t) -> Result<Option<FakeEvent>, Status> {
    let mut found = None;
    let status = session(|driver, events| {
        found = events.poll(event_set(set)?, driver)?;
        Ok(())
    });
    match status {
        0 => Ok(found),
        error => Err(error),
    }
}

/// Waits up to `timeout_ms` for an event; `NVML_ERROR_TIMEOUT` when none arrives.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    if data.is_null() {
        return INVALID_ARGUMENT;
    }
    let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
    loop {
        match next_event(set) {
            Err(status) => return status,
            Ok(Some(event)) => {
                let answer = nvmlEventData_t {
                    device: Handle::Gpu { gpu: event.gpu }.as_ptr(),
                    eventType: event.event_type,
                    eventData: event.data,
                    gpuInstanceId: event.gpu_instance,
                    computeInstanceId: event.compute_instance,
                };
                // SAFETY: `data` is non-null (checked above) and valid for writes (nvml.h).
                return match unsafe { put(data, answer) } {
                    Ok(()) => 0,
                    Err(status) => status,
                };
            }
            Ok(None) => {}
        }
        let now = Instant::now();
        if now >= deadline {
            return TIMEOUT;
        }
        thread::sleep(POLL_INTERVAL.min(deadline - now));
    }
}
