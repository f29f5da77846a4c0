//! Health events: XID errors and ECC errors reported by NVML (`nvmlEventSetCreate`,
//! `nvmlDeviceRegisterEvents`, `nvmlEventSetWait_v2`).
//!
//! nvml-wrapper's `EventSet` borrows the `Nvml` value and its `EventData` drops the GPU- and
//! compute-instance ids NVML reports for MIG devices, so this module owns its event set: a
//! [`HealthEvents`] keeps the library loaded (it holds an `Arc<Nvml>`) and can be moved to the
//! blocking thread that waits on it.

use std::collections::HashMap;
use std::mem;
use std::ptr;
use std::sync::Arc;
use std::time::Duration;

use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlEventData_t, nvmlEventSet_t, nvmlEventTypeDoubleBitEccError,
    nvmlEventTypeSingleBitEccError, nvmlEventTypeXidCriticalError,
};

use super::error::{CallError, NvmlCode, NvmlError};
use super::ffi::{check, sys_fn};

/// The event types a health monitor registers for.
const HEALTH_EVENT_TYPES: u64 = (nvmlEventTypeXidCriticalError
    | nvmlEventTypeSingleBitEccError
    | nvmlEventTypeDoubleBitEccError) as u64;

/// NVML's "not attributable to a GPU/compute instance" marker in `nvmlEventData_t`.
const NO_INSTANCE: u32 = u32::MAX;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthEventKind {
    /// An XID error with its number (e.g. 79: the GPU fell off the bus).
    Xid(u64),
    /// A corrected (single-bit) ECC error.
    SingleBitEcc,
    /// An uncorrectable (double-bit) ECC error.
    DoubleBitEcc,
}

/// One health event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthEvent {
    /// UUID of the GPU the event was reported on (the parent GPU for MIG devices).
    pub gpu_uuid: String,
    pub kind: HealthEventKind,
    /// The GPU instance the event is attributed to, on MIG-enabled GPUs.
    pub gpu_instance_id: Option<u32>,
    /// The compute instance the event is attributed to, on MIG-enabled GPUs.
    pub compute_instance_id: Option<u32>,
}

/// A GPU that could not be registered for health events (the node plugin reports it instead of
/// silently not monitoring it).
#[derive(Debug)]
pub struct UnmonitoredGpu {
    pub gpu_uuid: String,
    pub reason: CallError,
}

/// An NVML event set registered for XID and ECC events on a set of GPUs.
///
/// Operations on one event set are not thread-safe in NVML, so this type is `Send` but not `Sync`
/// and [`HealthEvents::wait`] takes `&mut self`. Dropping it frees the event set.
pub struct HealthEvents {
    nvml: Arc<Nvml>,
    set: nvmlEventSet_t,
    gpus: HashMap<usize, String>,
    unmonitored: Vec<UnmonitoredGpu>,
}

impl std::fmt::Debug for HealthEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthEvents")
            .field("gpus", &self.gpus.values().collect::<Vec<_>>())
            .field("unmonitored", &self.unmonitored)
            .finish_non_exhaustive()
    }
}

// SAFETY: an NVML event set is a process-wide handle, valid on any thread until freed. NVML only
// forbids *concurrent* use of one set, which `&mut self` on `wait` and the absence of `Sync`
// prevent. The `Arc<Nvml>` keeps the library loaded for as long as the set lives.
unsafe impl Send for HealthEvents {}

impl HealthEvents {
    /// Creates an event set and registers every GPU of `gpus` (`(uuid, handle)`) for the health
    /// event types it supports. GPUs that support none, or whose registration fails with
    /// `NVML_ERROR_NOT_SUPPORTED`, are listed by [`HealthEvents::unmonitored`].
    pub(crate) fn register(
        nvml: Arc<Nvml>,
        gpus: Vec<(String, nvmlDevice_t)>,
    ) -> Result<Self, NvmlError> {
        let create = sys_fn!(nvml, nvmlEventSetCreate).map_err(|source| NvmlError::Events {
            operation: "nvmlEventSetCreate",
            source,
        })?;
        let mut set: nvmlEventSet_t = ptr::null_mut();
        // SAFETY: NVML writes one event-set handle into `set`.
        check(unsafe { create(&mut set) }).map_err(|source| NvmlError::Events {
            operation: "nvmlEventSetCreate",
            source,
        })?;
        // From here on `Drop` frees the set, also on the error paths below.
        let mut events = Self {
            nvml,
            set,
            gpus: HashMap::new(),
            unmonitored: Vec::new(),
        };
        for (uuid, handle) in gpus {
            match events.register_gpu(handle) {
                Ok(()) => {
                    events.gpus.insert(handle as usize, uuid);
                }
                Err(reason) if reason.is_not_supported() => {
                    events.unmonitored.push(UnmonitoredGpu {
                        gpu_uuid: uuid,
                        reason,
                    });
                }
                Err(source) => {
                    return Err(NvmlError::EventRegistration { gpu: uuid, source });
                }
            }
        }
        Ok(events)
    }

    fn register_gpu(&self, device: nvmlDevice_t) -> Result<(), CallError> {
        let supported = sys_fn!(self.nvml, nvmlDeviceGetSupportedEventTypes)?;
        let register = sys_fn!(self.nvml, nvmlDeviceRegisterEvents)?;
        let mut types = 0u64;
        // SAFETY: `device` is a GPU handle from NVML; NVML writes one bit mask.
        check(unsafe { supported(device, &mut types) })?;
        let wanted = types & HEALTH_EVENT_TYPES;
        if wanted == 0 {
            return Err(CallError::Status(NvmlCode::NOT_SUPPORTED));
        }
        // SAFETY: `device` and `self.set` are live NVML handles.
        check(unsafe { register(device, wanted, self.set) })
    }

    /// GPUs that are not monitored, with the reason.
    pub fn unmonitored(&self) -> &[UnmonitoredGpu] {
        &self.unmonitored
    }

    /// UUIDs of the monitored GPUs.
    pub fn monitored(&self) -> impl Iterator<Item = &str> {
        self.gpus.values().map(String::as_str)
    }

    /// Waits up to `timeout` for the next event; `Ok(None)` when none arrived in time. Blocks the
    /// calling thread: run it where blocking is fine (e.g. `spawn_blocking`).
    pub fn wait(&mut self, timeout: Duration) -> Result<Option<HealthEvent>, NvmlError> {
        let wait = sys_fn!(self.nvml, nvmlEventSetWait_v2).map_err(|source| NvmlError::Events {
            operation: "nvmlEventSetWait_v2",
            source,
        })?;
        let timeout_ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
        // SAFETY: all-zero (null device, no event) is a valid value of this plain C struct.
        let mut data: nvmlEventData_t = unsafe { mem::zeroed() };
        // SAFETY: `self.set` is a live event set used by this thread only (`&mut self`); NVML
        // fills `data` and does not keep it.
        let status = unsafe { wait(self.set, &mut data, timeout_ms) };
        match check(status) {
            Ok(()) => {}
            Err(CallError::Status(NvmlCode::TIMEOUT)) => return Ok(None),
            Err(source) => {
                return Err(NvmlError::Events {
                    operation: "nvmlEventSetWait_v2",
                    source,
                });
            }
        }
        let gpu_uuid = self
            .gpus
            .get(&(data.device as usize))
            .cloned()
            .ok_or_else(|| NvmlError::Events {
                operation: "nvmlEventSetWait_v2",
                source: CallError::Malformed(format!(
                    "an event for device handle {:p}, which was not registered",
                    data.device
                )),
            })?;
        let kind = event_kind(data.eventType, data.eventData).ok_or_else(|| NvmlError::Events {
            operation: "nvmlEventSetWait_v2",
            source: CallError::Malformed(format!(
                "an event of type {:#x}, which was not registered",
                data.eventType
            )),
        })?;
        Ok(Some(HealthEvent {
            gpu_uuid,
            kind,
            gpu_instance_id: instance_id(data.gpuInstanceId),
            compute_instance_id: instance_id(data.computeInstanceId),
        }))
    }
}

impl Drop for HealthEvents {
    fn drop(&mut self) {
        if let Ok(free) = sys_fn!(self.nvml, nvmlEventSetFree) {
            // SAFETY: `self.set` is a live event set created by this value and freed only here.
            // A failure leaves nothing to clean up that we could act on.
            let _ = unsafe { free(self.set) };
        }
    }
}

fn event_kind(event_type: u64, event_data: u64) -> Option<HealthEventKind> {
    if event_type & u64::from(nvmlEventTypeXidCriticalError) != 0 {
        Some(HealthEventKind::Xid(event_data))
    } else if event_type & u64::from(nvmlEventTypeDoubleBitEccError) != 0 {
        Some(HealthEventKind::DoubleBitEcc)
    } else if event_type & u64::from(nvmlEventTypeSingleBitEccError) != 0 {
        Some(HealthEventKind::SingleBitEcc)
    } else {
        None
    }
}

fn instance_id(raw: u32) -> Option<u32> {
    (raw != NO_INSTANCE).then_some(raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_types_map_to_kinds() {
        assert_eq!(event_kind(8, 79), Some(HealthEventKind::Xid(79)));
        assert_eq!(event_kind(2, 0), Some(HealthEventKind::DoubleBitEcc));
        assert_eq!(event_kind(1, 0), Some(HealthEventKind::SingleBitEcc));
        assert_eq!(event_kind(4, 0), None);
    }

    #[test]
    fn the_no_instance_marker_means_none() {
        assert_eq!(instance_id(u32::MAX), None);
        assert_eq!(instance_id(3), Some(3));
    }
}
